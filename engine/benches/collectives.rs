//! `cargo bench --bench collectives`: the collective sweep across local ranks.
//!
//! The bench binary starts itself as the ranks of a ring on loopback (with `MLX_HOSTFILE`
//! and `MLX_RANK`, as `mlx.launch` would) and rank 0 prints the table `nuvec bench` prints
//! (nccl-tests' columns, under the same header), for 2, 3 and 4 ranks. `nuvec bench` runs
//! the same sweep with more options; see `tools/src/bench.rs` for the methodology.
//!
//! Environment: `NUVEC_BENCH_RANKS` (default `2,3,4`), `NUVEC_BENCH_COLLECTIVES` (default
//! `all_sum,all_gather,sum_scatter,sendrecv`; `NUVEC_BENCH_OPS` is its old name),
//! `NUVEC_BENCH_OP` (reductions, default `sum`), `NUVEC_BENCH_DTYPE` (default `float32`),
//! `NUVEC_BENCH_TARGET_MS` (default 500), `NUVEC_BENCH_JSON` (a directory to write
//! `collectives-n<N>.json` into). The ranks inherit `NUVEC_DISTRIBUTED_WIRE`: set it to
//! `native` to measure the native wire.

use std::time::Duration;

use nuvec_tools::bench::{self, Op, RedOp, Sweep};
use nuvec_tools::launch;
use nuvec_tools::report::{self, Header, NuvecRun};
use nuvec_tools::runner::{self, Outcome, RunOptions};

const WORKER: &str = "NUVEC_BENCH_WORKER";

fn env_list<T: std::str::FromStr>(var: &str, default: &str) -> Vec<T>
where
    T::Err: std::fmt::Display,
{
    std::env::var(var)
        .unwrap_or_else(|_| default.to_string())
        .split(',')
        .map(|s| {
            s.trim()
                .parse::<T>()
                .unwrap_or_else(|e| panic!("{var}: {s:?}: {e}"))
        })
        .collect()
}

fn main() {
    // `cargo test --benches` runs bench binaries without `--bench`: do nothing then.
    if !std::env::args().any(|a| a == "--bench") && std::env::var_os(WORKER).is_none() {
        return;
    }
    let collectives = if std::env::var_os("NUVEC_BENCH_COLLECTIVES").is_some() {
        "NUVEC_BENCH_COLLECTIVES"
    } else {
        "NUVEC_BENCH_OPS"
    };
    let ops: Vec<Op> = env_list(collectives, "all_sum,all_gather,sum_scatter,sendrecv");
    let redops: Vec<RedOp> = env_list("NUVEC_BENCH_OP", "sum");
    let dtypes = std::env::var("NUVEC_BENCH_DTYPE")
        .unwrap_or_else(|_| "float32".into())
        .split(',')
        .map(|s| bench::parse_dtype(s).unwrap_or_else(|e| panic!("NUVEC_BENCH_DTYPE: {e}")))
        .collect();
    let target_ms: u64 = env_list("NUVEC_BENCH_TARGET_MS", "500")[0];
    if std::env::var_os(WORKER).is_some() {
        let group = nuvec_distributed_engine::init(true).expect("the ring forms");
        let sweep = Sweep {
            ops,
            redops,
            dtypes,
            target: Duration::from_millis(target_ms),
            ..Sweep::default()
        };
        let transport = report::gather_links(&group).expect("the links' transports");
        let measurements = bench::run(&group, &sweep).expect("the sweep runs");
        if group.rank() == 0 {
            let run = NuvecRun {
                ranks: group.size(),
                transport,
                measurements,
            };
            print!("{}", report::nuvec_tables(&run));
            let measurements = run.measurements;
            if let Some(dir) = std::env::var_os("NUVEC_BENCH_JSON") {
                let path =
                    std::path::Path::new(&dir).join(format!("collectives-n{}.json", group.size()));
                std::fs::write(&path, serde_json::to_string_pretty(&measurements).unwrap())
                    .unwrap();
            }
            assert!(
                measurements.iter().all(|m| m.correct()),
                "some results were wrong (see the #wrong column)"
            );
        }
        return;
    }
    let exe = std::env::current_exe().expect("the bench binary's path");
    let command = vec![exe.to_string_lossy().into_owned(), "--bench".into()];
    let options = RunOptions {
        prefix_output: false,
        forward_stdin: false,
        name: "cargo bench".into(),
        ..RunOptions::default()
    };
    // The ranks inherit NUVEC_DISTRIBUTED_WIRE, as any other variable of this process.
    let wire = std::env::var(nuvec_distributed_engine::WIRE_VAR)
        .ok()
        .map(|w| match w.trim() {
            "native" => nuvec_distributed_engine::Backend::Native,
            "mlx" | "ring" => nuvec_distributed_engine::Backend::Ring,
            other => panic!("NUVEC_DISTRIBUTED_WIRE={other:?} is neither mlx nor native"),
        })
        .unwrap_or(nuvec_distributed_engine::Backend::Ring);
    let mut header = Header::detect(1, wire);
    header.set_load(&nuvec_tools::load::sample(nuvec_tools::load::WINDOW));
    print!("{}", header.text());
    for ranks in env_list::<usize>("NUVEC_BENCH_RANKS", "2,3,4") {
        let port = launch::free_port_block(ranks).expect("free ports on 127.0.0.1");
        let mut plan = launch::local_ring(ranks, 1, port, None, command.clone()).expect("a plan");
        plan.env.push((WORKER.into(), "1".into()));
        match runner::run_plan(&plan, &options) {
            Ok(Outcome::Success) => {}
            Ok(failed) => panic!("{ranks} ranks: {}", failed.message().unwrap_or_default()),
            Err(e) => panic!("{ranks} ranks: {e}"),
        }
    }
}
