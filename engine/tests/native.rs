//! The native wire across real processes: mismatched calls fail every involved rank with
//! an error naming both calls, and a native rank facing a rank that does not speak the
//! native wire (a nuvec rank on MLX's wire, keyed or not, or a real MLX rank) fails `init`
//! fast, naming the peer. The collectives themselves are in `tests/ring.rs`
//! (`native_matrix_*`, `native_float_sums_agree_*`).

use std::process::Command;
use std::time::{Duration, Instant};

use nuvec_distributed_engine::{Backend, Error, Group, Options};
use nuvec_tools::test_cases;
use nuvec_tools::testing::{self, Launch, RankOutput, report_failure};

const WIRE: &str = "NUVEC_DISTRIBUTED_WIRE";

/// A key long enough for `Options::key`.
const KEY: &str = "correct horse battery staple 2026";

/// One rank's part of a mismatch: a collective, as the error message names it.
#[derive(Clone, Copy, Debug)]
enum Call {
    SumF32(usize),
    MaxF32(usize),
    SumI32(usize),
    GatherF32(usize),
    Barrier,
    /// Rank 0 sends this many bytes to rank 1.
    Send(usize),
    /// Rank 1 receives this many bytes from rank 0.
    Recv(usize),
}

impl Call {
    fn run(self, g: &Group) -> nuvec_distributed_engine::Result<()> {
        match self {
            Call::SumF32(n) => g.all_sum(&mut vec![1.0f32; n]),
            Call::MaxF32(n) => g.all_max(&mut vec![1.0f32; n]),
            Call::SumI32(n) => g.all_sum(&mut vec![1i32; n]),
            Call::GatherF32(n) => g.all_gather(&vec![1.0f32; n], &mut vec![0.0; n * g.size()]),
            Call::Barrier => g.barrier(),
            Call::Send(n) => g.send(&vec![7u8; n], 1),
            Call::Recv(n) => g.recv(&mut vec![0u8; n], 0),
        }
    }

    /// Words the error must hold to name this call.
    fn words(self) -> Vec<String> {
        let (what, count) = match self {
            Call::SumF32(n) => ("all_sum", Some(n)),
            Call::MaxF32(n) => ("all_max", Some(n)),
            Call::SumI32(n) => ("all_sum", Some(n)),
            Call::GatherF32(n) => ("all_gather", Some(n)),
            Call::Barrier => ("barrier", None),
            Call::Send(n) => ("send", Some(n)),
            Call::Recv(n) => ("recv", Some(n)),
        };
        let mut words = vec![what.to_string()];
        words.extend(count.map(|n| n.to_string()));
        words
    }
}

/// Runs `good` matching all_sums on every rank of a native group of `size`, then `usual`
/// on every rank but the last, which calls `odd`, and checks that every rank fails within a
/// second, and that its group is failed afterwards. The ranks that compare calls with the
/// last one name both calls: at P = 2 the other rank; from P = 3, where the small
/// all-reduces and the barrier (and so the ring's check of calls) go by recursive doubling,
/// the last rank's first partner, the rank before it. The others fail on what the failure
/// closed, naming a peer (or the mismatch, where their algorithm meets the last rank).
fn mismatch(name: &str, size: usize, good: usize, usual: Call, odd: Call) {
    let launch = Launch::new(size, 1).timeout(10.0).env(WIRE, "native");
    let Some(outputs) = launch.run(name, move |g| {
        assert_eq!(g.backend(), "native", "the backend a native group reports");
        for _ in 0..good {
            g.all_sum(&mut [1.0f32]).expect("a matching all_sum");
        }
        let call = if g.rank() + 1 == size { odd } else { usual };
        let (error, took) = testing::timed(|| call.run(&g).expect_err("a mismatched call fails"));
        report_and_again(&g, &error, took);
    }) else {
        return;
    };
    for o in &outputs {
        if o.rank + 2 < size {
            check_failed_fast(o, &[usual, odd]);
        } else {
            check_mismatch(o, &[usual, odd]);
        }
    }
}

/// Checks that rank `o` failed within a second naming a peer or both calls, and that its
/// group stayed failed.
fn check_failed_fast(o: &RankOutput, both: &[Call; 2]) {
    let (ms, peer, message) = o.finished_failure();
    assert!(ms < 1000, "rank {} needed {ms} ms: {message}", o.rank);
    let names_both = both
        .iter()
        .all(|call| call.words().iter().all(|w| message.contains(w)));
    assert!(
        peer.is_some() || names_both,
        "rank {}: names neither a peer nor both calls: {message}",
        o.rank
    );
    again_reported(o);
}

/// Reports `error` after `took` ([`report_failure`]), then checks that the group stays
/// failed and prints the next call's error ("AGAIN ...").
fn report_and_again(g: &Group, error: &Error, took: Duration) {
    report_failure(error, took);
    let again = g
        .all_sum(&mut [1.0f32])
        .expect_err("the group stays failed");
    println!("AGAIN {again}");
}

/// Checks that rank `o` went on to report the next call's error ([`report_and_again`]).
fn again_reported(o: &RankOutput) {
    assert!(
        !o.lines("AGAIN ").is_empty(),
        "rank {}: no later call reported",
        o.rank
    );
}

fn check_mismatch(o: &RankOutput, both: &[Call; 2]) {
    let (ms, _, message) = o.finished_failure();
    assert!(ms < 1000, "rank {} needed {ms} ms: {message}", o.rank);
    for call in both {
        for word in call.words() {
            assert!(
                message.contains(&word),
                "rank {}: the error does not name {call:?} ({word:?} missing): {message}",
                o.rank
            );
        }
    }
    again_reported(o);
}

test_cases!(mismatch {
    native_mismatched_length_p2_first_call: 2, 0, Call::SumF32(10), Call::SumF32(20);
    native_mismatched_length_p3_after_1000: 3, 1000, Call::SumF32(10), Call::SumF32(20);
    /// Large enough for the pipelined ring: the header exchange catches it before data.
    native_mismatched_large_length_p4: 4, 3, Call::SumF32(1 << 20), Call::SumF32((1 << 20) + 1);
    native_mismatched_dtype_p2: 2, 5, Call::SumF32(8), Call::SumI32(8);
    native_mismatched_op_p3: 3, 1, Call::SumF32(8), Call::MaxF32(8);
    native_mismatched_kind_p4_after_1000: 4, 1000, Call::SumF32(8), Call::GatherF32(8);
    native_barrier_against_all_sum_p2: 2, 0, Call::SumF32(1), Call::Barrier;
});

/// A send is not acknowledged (so that two ranks may both send before they receive, as on
/// MLX's wire): the receiver whose `recv` does not match fails at once and answers, and the
/// sender learns of it in its next call that hears from the receiver, with the same error.
#[test]
fn native_mismatched_send_recv_length_p3() {
    // Ranks 0 and 1 only; rank 2 then joins the all_sum that fails around it.
    let name = "native_mismatched_send_recv_length_p3";
    let launch = Launch::new(3, 1).timeout(10.0).env(WIRE, "native");
    let Some(outputs) = launch.run(name, |g| {
        for _ in 0..10 {
            g.all_sum(&mut [1.0f32]).unwrap();
        }
        let start = Instant::now();
        let call = match g.rank() {
            0 => Some(Call::Send(100)),
            1 => Some(Call::Recv(120)),
            _ => None,
        };
        let first = call.map_or(Ok(()), |c| c.run(&g));
        let error = match first {
            Err(error) => error,
            Ok(()) => g
                .all_sum(&mut [1.0f32])
                .expect_err("the call after a refused send fails"),
        };
        report_and_again(&g, &error, start.elapsed());
    }) else {
        return;
    };
    for o in outputs.iter().filter(|o| o.rank < 2) {
        check_mismatch(o, &[Call::Send(100), Call::Recv(120)]);
    }
    assert!(outputs[2].finished(), "{}", outputs[2]);
}

// ---- A native rank against ranks that do not speak it ---------------------------------

/// Forms a group with this rank's wire and key from the environment, expecting failure, and
/// reports it. A rank on the MLX wire without a key exchanges nothing while it forms (MLX's
/// ring does not), so it may form its ring and find the native peer in the first bytes of
/// its first collective instead: that call must fail, never return the peer's bytes as data.
fn expect_init_failure(timeout: Duration) {
    let rank: usize = std::env::var("MLX_RANK").unwrap().parse().unwrap();
    let wire = match std::env::var(WIRE).as_deref() {
        Ok("native") => Backend::Native,
        _ => Backend::Ring,
    };
    let mut options = Options::default().timeout(timeout).backend(wire);
    if let Ok(key) = std::env::var("TEST_KEY") {
        options = options.key(key);
    }
    let start = Instant::now();
    let nodes = testing::hostfile_nodes();
    match nuvec_distributed_engine::init_with(&nodes, rank, &options) {
        Ok(g) => {
            assert!(
                wire == Backend::Ring && std::env::var("TEST_KEY").is_err(),
                "rank {rank} formed a group across wires"
            );
            let mut x = [1.0f32];
            match g.all_sum(&mut x) {
                Ok(()) => panic!("rank {rank}: an all_sum across wires gave {x:?}"),
                Err(error) => report_failure(&error, start.elapsed()),
            }
        }
        Err(error) => report_failure(&error, start.elapsed()),
    }
}

/// Rank 0 on the native wire, rank 1 on MLX's (both nuvec): both fail fast, well before the
/// timeout, each naming the other and the wire it speaks.
fn across_wires(name: &'static str, key: Option<&str>) {
    const TIMEOUT: Duration = Duration::from_secs(8);
    let key = key.map(str::to_string);
    let launch = Launch::new(2, 1).command(move |rank| {
        let mut c = testing::this_test(name);
        if rank == 0 {
            c.env(WIRE, "native");
        }
        if let Some(key) = &key {
            c.env("TEST_KEY", key);
        }
        c
    });
    let Some(outputs) = launch.run_raw(name, || expect_init_failure(TIMEOUT)) else {
        return;
    };
    for o in &outputs {
        let (ms, peer, message) = o.finished_failure();
        assert_eq!(peer, Some(1 - o.rank), "rank {}: {message}", o.rank);
        assert!(
            ms < 2000,
            "rank {} took {ms} ms (timeout {TIMEOUT:?}): {message}",
            o.rank
        );
        let lower = message.to_lowercase();
        assert!(
            lower.contains("native") && lower.contains("mlx"),
            "rank {}: the error must say which wire each side speaks: {message}",
            o.rank
        );
    }
}

#[test]
fn native_against_mlx_wire_nuvec_fails_fast() {
    across_wires("native_against_mlx_wire_nuvec_fails_fast", None);
}

#[test]
fn native_against_keyed_mlx_wire_nuvec_fails_fast() {
    across_wires("native_against_keyed_mlx_wire_nuvec_fails_fast", Some(KEY));
}

/// Rank 0 on the native wire, rank 1 a real MLX rank (`mx.distributed`, ring backend) that
/// runs one all_sum: the native rank fails `init` naming rank 1 as not speaking the native
/// wire, and never returns a group.
#[test]
fn native_against_an_mlx_rank_fails_init() {
    let name = "native_against_an_mlx_rank_fails_init";
    const TIMEOUT: Duration = Duration::from_secs(20);
    if testing::as_rank(name, || expect_init_failure(TIMEOUT)) {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let plan = serde_json::json!({
        "dir": work.path(),
        "ops": [{"op": "all_sum", "dtype": "float32", "count": 4}],
    });
    std::fs::write(work.path().join("in-1-0.bin"), [0u8; 16]).unwrap();
    let plan_path = work.path().join("plan.json");
    std::fs::write(&plan_path, plan.to_string()).unwrap();
    let python = testing::mlx_python();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/mlx_rank.py");
    let outputs = Launch::new(2, 1)
        .deadline(Duration::from_secs(60))
        .env("NUVEC_INTEROP_PLAN", &plan_path.to_string_lossy())
        .env("NUVEC_INTEROP_OUT", &work.path().to_string_lossy())
        .command(move |rank| {
            if rank == 0 {
                let mut c = testing::this_test(name);
                c.env(WIRE, "native");
                c
            } else {
                let mut c = Command::new(&python);
                c.arg(&script);
                c
            }
        })
        .spawn(name)
        .finish();
    let native = &outputs[0];
    assert!(native.finished(), "{native}");
    let (ms, peer, message) = native.failure();
    assert_eq!(peer, Some(1), "{message}");
    assert!(
        message.to_lowercase().contains("native"),
        "the error must say the peer does not speak the native wire: {message}"
    );
    assert!(
        message.contains("native setup"),
        "the error must name the phase, the native wire's setup: {message}"
    );
    // MLX's rank starts its ring only after importing MLX (about a second); its first
    // bytes then give it away, long before the timeout.
    assert!(
        ms < TIMEOUT.as_millis() as u64 / 2,
        "took {ms} ms: {message}"
    );
}
