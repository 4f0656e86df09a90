//! The flight recorder end to end, three ranks on loopback: a call that differs on one rank
//! and a rank that never makes a call leave records (written by the group when the call
//! fails it, into `NUVEC_DISTRIBUTED_FLIGHT_DIR`) from which `nuvec flight` names that rank
//! and that call.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use nuvec_distributed_engine::{
    Backend, FLIGHT_DIR_VAR, FLIGHT_SIGNAL_VAR, Group, Options, init_with,
};
use nuvec_tools::flight::{self, Verdict};
use nuvec_tools::testing::{self, Launch, RankOutput};

const NUVEC: &str = env!("CARGO_BIN_EXE_nuvec");

/// A launch of three ranks whose groups dump into `dir`, with a short timeout.
fn three_ranks(dir: &Path, wire: &str) -> Launch {
    Launch::new(3, 1)
        .timeout(1.0)
        .env("NUVEC_DISTRIBUTED_WIRE", wire)
        .env(FLIGHT_DIR_VAR, &dir.to_string_lossy())
}

/// Prints the number of calls the group has made ("CALLS n"), for the parent.
fn print_calls(g: &Group) {
    println!("CALLS {}", g.flight_record().calls);
}

/// The number rank `o` printed with [`print_calls`].
fn calls(o: &RankOutput) -> u64 {
    o.lines("CALLS ")
        .first()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("rank {} printed no CALLS line:\n{o}", o.rank))
}

/// The verdict of `nuvec flight --json` on `dir`, checked against the library's.
fn verdict(dir: &Path, outputs: &[RankOutput]) -> Verdict {
    let dumps = flight::read(&[dir.to_path_buf()]).unwrap_or_else(|e| {
        let outputs: Vec<String> = outputs.iter().map(|o| o.to_string()).collect();
        panic!("{e}\n{}", outputs.join("\n"))
    });
    let verdict = flight::analyse(&dumps);
    let command = Command::new(NUVEC)
        .arg("flight")
        .arg(dir)
        .output()
        .expect("nuvec flight runs");
    let text = String::from_utf8_lossy(&command.stdout);
    println!("nuvec flight {}:\n{text}", dir.display());
    assert!(command.status.success(), "nuvec flight: {command:?}");
    assert!(
        text.contains(&verdict.summary[0]),
        "nuvec flight printed:\n{text}\nnot {:?}",
        verdict.summary[0]
    );
    let json = Command::new(NUVEC)
        .args(["flight", "--json"])
        .arg(dir)
        .output()
        .expect("nuvec flight --json runs");
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON");
    assert_eq!(json["summary"], serde_json::json!(verdict.summary));
    // A path that holds no record is an error naming it.
    let empty = tempfile::tempdir().unwrap();
    let refused = Command::new(NUVEC)
        .arg("flight")
        .arg(empty.path())
        .output()
        .expect("nuvec flight runs");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{said}");
    assert!(said.contains(&empty.path().display().to_string()), "{said}");
    verdict
}

/// Rank 1 sums 20 elements where ranks 0 and 2 sum 10: the native wire fails the call on
/// every rank, each writes its record, and the verdict names rank 1 and that call.
#[test]
fn a_mismatched_call_is_named_with_its_rank() {
    let dir = tempfile::tempdir().unwrap();
    let Some(outputs) =
        three_ranks(dir.path(), "native").run("a_mismatched_call_is_named_with_its_rank", |g| {
            for _ in 0..5 {
                g.all_sum(&mut [1.0f32; 10]).expect("a matching all_sum");
            }
            print_calls(&g);
            let len = if g.rank() == 1 { 20 } else { 10 };
            g.all_sum(&mut vec![1.0f32; len])
                .expect_err("the mismatched all_sum fails");
        })
    else {
        return;
    };
    testing::assert_all_finished(&outputs);
    let seq = calls(&outputs[0]);
    for o in &outputs {
        let [json, trace] = ["json", "trace.json"]
            .map(|end| dir.path().join(format!("flight-rank{}.{end}", o.rank)));
        assert!(
            json.exists() && trace.exists(),
            "rank {} wrote no record:\n{o}",
            o.rank
        );
    }
    let v = verdict(dir.path(), &outputs);
    let div = v.divergence.as_ref().expect("the calls differ");
    assert_eq!((div.seq, div.odd.as_slice()), (seq, &[1][..]), "{v:#?}");
    assert_eq!(div.calls[0].ranks, [0, 2], "{v:#?}");
    assert!(div.calls[1].call.contains("x20"), "{v:#?}");
    assert_eq!(v.unfinished.len(), 3, "every rank failed the call: {v:#?}");
    for u in &v.unfinished {
        assert!(u.call.ending.contains("Mismatch"), "{v:#?}");
    }
}

/// A group formed with `init_with` (options naming no directory) takes the directory from
/// the environment too: ranks 0 and 2 fail a mismatched barrier and write their records.
#[test]
fn init_with_takes_the_directory_from_the_environment() {
    const NAME: &str = "init_with_takes_the_directory_from_the_environment";
    let dir = tempfile::tempdir().unwrap();
    let Some(outputs) = three_ranks(dir.path(), "native").run_raw(NAME, || {
        let rank: usize = std::env::var("MLX_RANK").unwrap().parse().unwrap();
        let options = Options::default().backend(Backend::Native);
        let g = init_with(&testing::hostfile_nodes(), rank, &options).expect("the group forms");
        let mine = if rank == 1 { 1 } else { 0 };
        g.all_gather_vec(&[mine; 1])
            .and_then(|_| {
                if rank == 1 {
                    g.all_sum(&mut [1u8])
                } else {
                    g.barrier()
                }
            })
            .expect_err("the mismatched call fails");
    }) else {
        return;
    };
    testing::assert_all_finished(&outputs);
    for rank in [0, 2] {
        let path = dir.path().join(format!("flight-rank{rank}.json"));
        assert!(path.exists(), "no {}:\n{}", path.display(), outputs[rank]);
    }
}

/// Rank 2 stops calling before the others' last all_sum: they time out and write their
/// records, rank 2 writes its own (as a program would on request while it is stuck), and
/// the verdict names rank 2 as behind, and the call it never started.
fn a_rank_that_never_calls_is_behind(name: &str, wire: &str) {
    let dir = tempfile::tempdir().unwrap();
    let Some(outputs) = three_ranks(dir.path(), wire).run(name, |g| {
        for _ in 0..5 {
            g.all_sum(&mut [1.0f32; 4]).expect("a matching all_sum");
        }
        print_calls(&g);
        if g.rank() == 2 {
            // Well past the others' timeout (1 s), so that they fail first.
            std::thread::sleep(Duration::from_secs(4));
            let dir = std::env::var_os(FLIGHT_DIR_VAR).expect("the launch sets the directory");
            g.flight_record()
                .write(Path::new(&dir))
                .expect("the record is written");
        } else {
            g.all_gather_vec(&[7u16; 3])
                .expect_err("the all_gather rank 2 never joins fails");
        }
    }) else {
        return;
    };
    testing::assert_all_finished(&outputs);
    let seq = calls(&outputs[2]);
    let v = verdict(dir.path(), &outputs);
    assert!(v.divergence.is_none(), "{v:#?}");
    assert_eq!(v.behind.len(), 1, "{v:#?}");
    let lag = &v.behind[0];
    assert_eq!(
        (lag.rank, lag.calls, lag.usual),
        (2, seq, seq + 1),
        "{v:#?}"
    );
    assert_eq!(
        lag.missed.as_deref(),
        Some("all_gather uint16 x3"),
        "{v:#?}"
    );
    assert!(v.summary[0].starts_with("rank 2 is behind"), "{v:#?}");
    let stuck: Vec<usize> = v.unfinished.iter().map(|u| u.rank).collect();
    assert_eq!(stuck, [0, 1], "{v:#?}");
    // Every call is a collective, so every entry names its algorithm: the ring on MLX's
    // wire, the table's choice on the native one (which depends on shared memory).
    for d in flight::read(&[dir.path().to_path_buf()]).unwrap() {
        for e in &d.entries {
            match wire {
                "mlx" => assert_eq!(e.algorithm.as_deref(), Some("ring"), "{e:?}"),
                _ => assert!(e.algorithm.is_some(), "{e:?}"),
            }
        }
    }
}

#[test]
fn a_rank_that_never_calls_is_behind_native() {
    a_rank_that_never_calls_is_behind("a_rank_that_never_calls_is_behind_native", "native");
}

#[test]
fn a_rank_that_never_calls_is_behind_mlx() {
    a_rank_that_never_calls_is_behind("a_rank_that_never_calls_is_behind_mlx", "mlx");
}

/// `nuvec launch` gives the ranks a directory for their records when the user set none, and
/// after a rank fails prints the verdict on them: here rank 1 sums 20 elements where the
/// others sum 10 on the native wire, and every rank exits with status 3 after its error.
#[test]
fn nuvec_launch_analyses_the_records_after_a_failure() {
    const NAME: &str = "nuvec_launch_analyses_the_records_after_a_failure";
    if testing::as_rank(NAME, || {
        let g = nuvec_distributed_engine::init(true).expect("the group forms");
        g.all_sum(&mut [1.0f32; 10]).expect("a matching all_sum");
        let len = if g.rank() == 1 { 20 } else { 10 };
        let error = g
            .all_sum(&mut vec![1.0f32; len])
            .expect_err("the mismatched all_sum fails");
        eprintln!("FAILED {error}");
        // The others' records are written when their call fails, as this one's was: give
        // them that moment before the launcher ends them.
        std::thread::sleep(Duration::from_millis(500));
        std::process::exit(3);
    }) {
        return;
    }
    let port = testing::free_port_block(3).unwrap().to_string();
    let exe = std::env::current_exe().unwrap();
    let child = format!("{}={NAME}", testing::CHILD_VAR);
    let mut args = vec![
        "launch", "-n", "3", "-p", &port, "--wire", "native", "--env", &child, "--",
    ];
    args.push(exe.to_str().unwrap());
    args.extend(testing::rank_args(NAME));
    let launch = Command::new(NUVEC)
        .args(&args)
        .env_remove(FLIGHT_DIR_VAR)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let f = testing::finish(launch, Duration::from_secs(120));
    println!("nuvec launch said:\n{}", f.stderr);
    assert_eq!(f.status.code(), Some(3), "{}", f.stderr);
    let said: Vec<&str> = f
        .stderr
        .lines()
        .filter_map(|l| l.strip_prefix("nuvec launch: "))
        .collect();
    let header = said
        .iter()
        .find(|l| l.starts_with("flight records of the ranks in "))
        .unwrap_or_else(|| panic!("no flight records reported:\n{}", f.stderr));
    // The first call is 0, the mismatched one 1; whichever ranks' records there are, one
    // of them failed in it.
    assert!(
        said.iter()
            .any(|l| l.contains("did not finish call 1 (all_sum float32 x")),
        "{}",
        f.stderr
    );
    let dir = header["flight records of the ranks in ".len()..]
        .split(" (")
        .next()
        .unwrap();
    assert!(
        Path::new(dir).join("flight-rank1.json").exists(),
        "{}",
        f.stderr
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// The record `path` holds, once it is whole: `None` until then.
fn record_at(path: &Path) -> Option<flight::Dump> {
    let text = std::fs::read_to_string(path).ok()?;
    serde_json::from_str(&text).ok()
}

/// Sends SIGUSR1 to `rank` until its record in `dir` holds `calls` calls (the call it is
/// about to start may not have begun when the first signal arrives), and returns it.
fn signal_for_record(
    ranks: &mut testing::Ranks,
    dir: &Path,
    rank: usize,
    calls: u64,
) -> flight::Dump {
    let path = dir.join(format!("flight-rank{rank}.json"));
    let until = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        ranks.signal(rank, "USR1");
        let sent = std::time::Instant::now();
        while sent.elapsed() < Duration::from_secs(1) {
            if let Some(record) = record_at(&path).filter(|r| r.calls >= calls) {
                return record;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            std::time::Instant::now() < until,
            "rank {rank} wrote no record of {calls} calls on SIGUSR1: {:?}",
            record_at(&path).map(|r| r.calls)
        );
    }
}

/// With `NUVEC_DISTRIBUTED_FLIGHT_SIGNAL=1`, SIGUSR1 writes the record of a live group:
/// rank 0 waits in an all_gather rank 1 has not called yet, rank 1 waits for the test
/// between calls; each is sent SIGUSR1 and writes its record, rank 0's with the
/// all_gather running, and both then finish the all_gather.
fn sigusr1_writes_the_record_of_a_live_group(name: &str, wire: &str, backend: &str) {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut ranks) = Launch::new(2, 1)
        .timeout(60.0)
        .env("NUVEC_DISTRIBUTED_WIRE", wire)
        .env(FLIGHT_DIR_VAR, &dir.path().to_string_lossy())
        .env(FLIGHT_SIGNAL_VAR, "1")
        .start(name, |g| {
            g.barrier().expect("a barrier");
            for _ in 0..3 {
                g.all_sum(&mut [1.0f32; 4]).expect("a matching all_sum");
            }
            testing::mark("called");
            if g.rank() == 1 {
                testing::wait_for_parent();
            }
            g.all_gather_vec(&[7u16; 3]).expect("the all_gather");
        })
    else {
        return;
    };
    ranks.wait_for(1, "called", Duration::from_secs(60));
    ranks.wait_for(0, "called", Duration::from_secs(60));
    let hung = signal_for_record(&mut ranks, dir.path(), 0, 5);
    let idle = signal_for_record(&mut ranks, dir.path(), 1, 4);
    ranks.release();
    let outputs = ranks.finish();
    testing::assert_all_finished(&outputs);

    let ops = |d: &flight::Dump| -> Vec<(u64, String, String)> {
        d.entries
            .iter()
            .map(|e| (e.seq, e.op.clone(), e.outcome.clone()))
            .collect()
    };
    let ok = |seq, op: &str| (seq, op.to_string(), "ok".to_string());
    let before = [
        ok(0, "barrier"),
        ok(1, "all_sum"),
        ok(2, "all_sum"),
        ok(3, "all_sum"),
    ];
    assert_eq!(ops(&idle), before, "{idle:#?}");
    let mut want = before.to_vec();
    want.push((4, "all_gather".into(), "running".into()));
    assert_eq!(ops(&hung), want, "{hung:#?}");
    let gather = &hung.entries[4];
    assert_eq!(
        (gather.dtype.as_deref(), gather.count, gather.end_ns),
        (Some("uint16"), Some(3), None)
    );
    assert!(
        hung.entries.iter().all(|e| e.algorithm.is_some()),
        "{hung:#?}"
    );
    // The records are a run's like any other: nuvec flight names rank 1 as behind, in
    // the call rank 0 waits in.
    let v = flight::analyse(&[hung, idle]);
    assert!(v.summary[0].starts_with("rank 1 is behind"), "{v:#?}");
    // Each rank said where its record went.
    for o in &outputs {
        let json = dir.path().join(format!("flight-rank{}.json", o.rank));
        let said = format!(
            "nuvec: SIGUSR1: rank {} of 2 ({backend}, {} calls): flight record in {}",
            o.rank,
            4 + u64::from(o.rank == 0),
            json.display()
        );
        assert!(o.stderr.contains(&said), "no {said:?}:\n{o}");
    }
}

#[test]
fn sigusr1_writes_the_record_of_a_live_group_native() {
    sigusr1_writes_the_record_of_a_live_group(
        "sigusr1_writes_the_record_of_a_live_group_native",
        "native",
        "native",
    );
}

#[test]
fn sigusr1_writes_the_record_of_a_live_group_mlx() {
    sigusr1_writes_the_record_of_a_live_group(
        "sigusr1_writes_the_record_of_a_live_group_mlx",
        "mlx",
        "ring",
    );
}

/// A rank stopped (SIGSTOP) while the ranks loop over all_sums hangs the others: they time
/// out and write their records; once it is let go (SIGCONT) its own call fails and it
/// writes its own. The verdict names the stopped rank as the one that hung, in the call
/// the others waited in.
fn a_stopped_rank_is_named_as_the_one_that_hung(name: &str, wire: &str) {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut ranks) = three_ranks(dir.path(), wire).start(name, |g| {
        testing::until_failure(|| g.all_sum(&mut [1.0f32; 4]));
        print_calls(&g);
    }) else {
        return;
    };
    ranks.strike(1, "STOP", Duration::from_millis(200));
    let outputs = ranks.finish();
    testing::assert_all_finished(&outputs);
    let v = verdict(dir.path(), &outputs);
    let blamed = v.blamed.as_ref().expect("a rank the others failed on");
    assert_eq!((blamed.rank, blamed.timed_out), (1, true), "{v:#?}");
    assert!(blamed.by.contains(&0) && blamed.by.contains(&2), "{v:#?}");
    // The call the others waited in: the earlier of their last calls (on MLX's ring rank
    // 1's neighbour can finish the call rank 0 waits in and fail the next).
    let waited = calls(&outputs[0]).min(calls(&outputs[2])) - 1;
    assert_eq!(
        (
            blamed.call.seq,
            blamed.call.call.starts_with("all_sum float32 x4 by ")
        ),
        (waited, true),
        "{v:#?}"
    );
    assert!(
        v.summary[0].starts_with(&format!("rank 1 hung: ranks 0, 2 failed call {waited}")),
        "{v:#?}"
    );
}

#[test]
fn a_stopped_rank_is_named_as_the_one_that_hung_native() {
    a_stopped_rank_is_named_as_the_one_that_hung(
        "a_stopped_rank_is_named_as_the_one_that_hung_native",
        "native",
    );
}

#[test]
fn a_stopped_rank_is_named_as_the_one_that_hung_mlx() {
    a_stopped_rank_is_named_as_the_one_that_hung(
        "a_stopped_rank_is_named_as_the_one_that_hung_mlx",
        "mlx",
    );
}
