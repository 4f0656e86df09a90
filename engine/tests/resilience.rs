//! Failure behaviour across real processes on loopback: ranks killed, stopped or exiting
//! mid-collective, a rank that never starts, strangers connecting to a forming ring, wrong
//! keys, socket options the kernel refuses, and closing and re-forming a group. Every test
//! is bounded: the groups have short timeouts and the harness kills ranks that outlive its
//! deadline.

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use nuvec_distributed_engine::{Error, Group, Options};
use nuvec_tools::test_cases;
use nuvec_tools::testing::{self, Launch, RankOutput, mark, report_failure, sum_of};

/// A key long enough for `Options::key`.
const KEY: &str = "correct horse battery staple 2026";

/// A collective the ranks loop on.
type Collective = fn(&Group) -> nuvec_distributed_engine::Result<()>;

/// Runs `collective` in a loop on every rank until it fails; reports the failure and the
/// error of the call after it.
fn until_failure(g: &Group, collective: Collective) {
    g.barrier().unwrap();
    testing::until_failure(|| collective(g));
    let again = g.all_sum(&mut [1u8]).expect_err("the group stays failed");
    println!("AGAIN {again}");
}

fn small_sum(g: &Group) -> nuvec_distributed_engine::Result<()> {
    g.all_sum(&mut [1.0f32])
}

fn large_sum(g: &Group) -> nuvec_distributed_engine::Result<()> {
    sum_of(g, 16 << 20) // 64 MiB per rank
}

/// The large collective of the blame tests, smaller than [`large_sum`] to keep them quick.
fn blame_large(g: &Group) -> nuvec_distributed_engine::Result<()> {
    sum_of(g, 1 << 20) // 4 MiB per rank
}

/// Kills `victim` with SIGKILL while every rank loops on `collective`; every survivor must
/// fail within the timeout naming it, and say so again on the next call.
fn kill_during(name: &str, size: usize, victim: usize, collective: Collective) {
    kill_during_on(name, "mlx", size, victim, collective);
}

/// [`kill_during`] on `wire` (`NUVEC_DISTRIBUTED_WIRE`).
fn kill_during_on(name: &str, wire: &str, size: usize, victim: usize, collective: Collective) {
    const TIMEOUT_S: f64 = 10.0;
    let launch = Launch::new(size, 1)
        .timeout(TIMEOUT_S)
        .env("NUVEC_DISTRIBUTED_WIRE", wire);
    let Some(outputs) = strike_during(&launch, name, victim, "KILL", collective) else {
        return;
    };
    let again = ["failed earlier".to_string(), format!("rank {victim}")];
    assert_blamed(&outputs, victim, (TIMEOUT_S * 1000.0) as u64, &again);
}

/// Starts `launch` (test `name`) with every rank looping on `collective` until it fails,
/// sends `signal` to `victim` once they all loop, and returns every rank's output once they
/// exited; `None` in the ranks themselves.
fn strike_during(
    launch: &Launch,
    name: &str,
    victim: usize,
    signal: &str,
    collective: Collective,
) -> Option<Vec<RankOutput>> {
    let mut running = launch.start(name, |g| until_failure(&g, collective))?;
    running.strike(victim, signal, Duration::from_millis(300));
    Some(running.finish())
}

/// Checks that every rank of `outputs` but `victim` finished, having failed naming
/// `victim` in under `within_ms`, and that its next call's error ("AGAIN ...") says each of
/// `again`.
fn assert_blamed(outputs: &[RankOutput], victim: usize, within_ms: u64, again: &[String]) {
    let survivors: Vec<&RankOutput> = outputs.iter().filter(|o| o.rank != victim).collect();
    let all: Vec<String> = survivors
        .iter()
        .map(|o| format!("rank {}: {:?}", o.rank, o.lines("FAIL ")))
        .collect();
    assert_eq!(survivors.len(), outputs.len() - 1, "{all:?}");
    for o in survivors {
        let (ms, peer, message) = o.finished_failure();
        assert_eq!(
            peer,
            Some(victim),
            "rank {} named the wrong rank: {message}; all: {all:?}",
            o.rank
        );
        assert!(
            ms < within_ms,
            "rank {} needed {ms} ms: {message}; all: {all:?}",
            o.rank
        );
        let said = o.lines("AGAIN ").join("");
        assert!(again.iter().all(|a| said.contains(a)), "{said}");
    }
}

test_cases!(kill_during {
    kill_9_during_a_small_all_sum_p3: 3, 1, small_sum;
    kill_9_during_a_small_all_sum_p4: 4, 3, small_sum;
    kill_9_during_a_64_mib_all_sum_p3: 3, 2, large_sum;
    kill_9_during_a_64_mib_all_sum_p4: 4, 1, large_sum;
});

test_cases!(kill_during_on {
    /// On the native wire a small all_sum at P = 4 goes by recursive doubling: the killed
    /// rank's partners find it themselves, and the other survivor hears it named by them.
    native_kill_9_during_a_small_all_sum_p4: "native", 4, 2, small_sum;
    /// A 64 MiB all_sum takes the pipelined ring on the native wire too.
    native_kill_9_during_a_64_mib_all_sum_p3: "native", 3, 1, large_sum;
});

/// Stops `victim` (SIGSTOP) while every rank loops on small all_sums: the others fail within
/// the timeout plus a small margin naming it; after SIGCONT it fails cleanly too.
fn stop_during(name: &str, size: usize, victim: usize) {
    const TIMEOUT_S: f64 = 3.0;
    // The stall verdict waits up to a quarter of the timeout for a neighbour's notice, and
    // a failing rank lingers up to 250 ms for its neighbours to close.
    const MARGIN_MS: u64 = 750 + 250 + 500;
    let launch = Launch::new(size, 1).timeout(TIMEOUT_S);
    let Some(mut running) = launch.start(name, |g| until_failure(&g, small_sum)) else {
        return;
    };
    running.strike(victim, "STOP", Duration::from_millis(200));
    let outputs = running.finish();
    let within_ms = (TIMEOUT_S * 1000.0) as u64 + MARGIN_MS + 1;
    assert_blamed(&outputs, victim, within_ms, &[]);
    // After SIGCONT the victim fails cleanly too.
    let stopped = outputs
        .iter()
        .find(|o| o.rank == victim)
        .expect("the victim's output");
    assert!(
        stopped.finished(),
        "the stopped rank did not finish cleanly:\n{stopped}"
    );
    stopped.failure();
}

#[test]
fn a_stopped_rank_is_named_within_the_timeout_p3() {
    stop_during("a_stopped_rank_is_named_within_the_timeout_p3", 3, 2);
}

/// Three ranks with two connections each authenticate with a key, and compute correctly.
#[test]
fn a_keyed_ring_forms_and_computes() {
    let launch = Launch::new(3, 2).env("NUVEC_DISTRIBUTED_KEY", KEY);
    launch.all_ok("a_keyed_ring_forms_and_computes", |g| {
        let mut x = vec![g.rank() as u64 + 1; 700_000];
        g.all_sum(&mut x).unwrap();
        assert!(x.iter().all(|&v| v == 6));
        let mut out = vec![0u32; 3 * 1000];
        g.all_gather(&vec![g.rank() as u32; 1000], &mut out)
            .unwrap();
        assert!(
            out.chunks(1000)
                .enumerate()
                .all(|(r, c)| c.iter().all(|&v| v == r as u32))
        );
    });
}

/// One rank with another key: every rank's setup fails with an authentication error, on
/// both sides of that rank's connections.
#[test]
fn a_wrong_key_fails_setup_on_both_sides() {
    let name = "a_wrong_key_fails_setup_on_both_sides";
    let launch = Launch::new(3, 1).timeout(3.0);
    let Some(outputs) = launch.run_raw(name, || {
        let rank: usize = std::env::var("MLX_RANK").unwrap().parse().unwrap();
        let key = if rank == 1 {
            "a different key, long enough too"
        } else {
            KEY
        };
        let start = Instant::now();
        let nodes = testing::hostfile_nodes();
        let options = Options::default().timeout(Duration::from_secs(3)).key(key);
        let error =
            nuvec_distributed_engine::init_with(&nodes, rank, &options).expect_err("keys differ");
        report_failure(&error, start.elapsed());
    }) else {
        return;
    };
    for (o, _, peer, message) in failures_saying(&outputs, &["authentication failed"]) {
        assert!(
            message.contains("prove the key") || message.contains("keys differ"),
            "rank {}: {message}",
            o.rank
        );
        let expected: &[usize] = if o.rank == 1 { &[0, 2] } else { &[1] };
        assert!(
            peer.is_some_and(|p| expected.contains(&p)),
            "rank {} named {peer:?}: {message}",
            o.rank
        );
    }
}

#[test]
fn a_short_key_is_refused() {
    let e = nuvec_distributed_engine::init_with(
        &[vec!["127.0.0.1:1".into()], vec!["127.0.0.1:2".into()]],
        0,
        &Options::default().key("too short"),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("9 bytes") && e.contains("at least 16"), "{e}");
}

/// What a stranger does to a forming ring's port.
#[derive(Clone, Copy, Debug)]
enum Stranger {
    /// Connects and closes at once (a port scanner).
    Scan,
    /// Connects and sends garbage, then stays.
    Garbage,
    /// Connects and says nothing, then stays.
    Silent,
    /// Connects, sends a well-formed hello claiming to be the expected rank, then garbage
    /// where the proof should be.
    Impostor,
}

/// Strangers connect to the ports of a forming ring, to rank 1's before its real neighbour
/// does (rank 0 starts late); the ring still forms and computes correctly.
fn strangers(name: &str, key: Option<&str>, kinds: &'static [Stranger]) {
    let mut launch = Launch::new(3, 2).timeout(20.0);
    if let Some(key) = key {
        launch = launch.env("NUVEC_DISTRIBUTED_KEY", key);
    }
    let Some(running) = launch.start_raw(name, || {
        // Rank 0 starts late, so the strangers reach rank 1's addresses (which only rank
        // 0 connects to) before the real neighbour does.
        if std::env::var("MLX_RANK").as_deref() == Ok("0") {
            std::thread::sleep(Duration::from_millis(1500));
        }
        let g = nuvec_distributed_engine::init(true).expect("the ring forms despite the strangers");
        let mut x = vec![g.rank() as u32 + 1; 300_000];
        g.all_sum(&mut x).unwrap();
        assert!(x.iter().all(|&v| v == 6), "rank {}: wrong sum", g.rank());
        let mut y = [g.rank() as f64];
        g.all_max(&mut y).unwrap();
        assert_eq!(y, [2.0]);
    }) else {
        return;
    };
    let ports: Vec<u16> = running.ports.iter().flatten().copied().collect();
    let mut held = Vec::new();
    // Ports some stranger reached; when none did, the test would prove nothing.
    let mut reached = Vec::new();
    let until = Instant::now() + Duration::from_millis(1200);
    'ports: for &port in &ports {
        for &kind in kinds {
            // The ranks are not listening yet: retry until they are, or give up on this
            // port (the test then proves less, not more).
            let stream = loop {
                match TcpStream::connect(("127.0.0.1", port)) {
                    Ok(s) => break s,
                    Err(_) if Instant::now() < until => {
                        std::thread::sleep(Duration::from_millis(5))
                    }
                    Err(_) => continue 'ports,
                }
            };
            if reached.last() != Some(&port) {
                reached.push(port);
            }
            let mut stream = stream;
            match kind {
                Stranger::Scan => drop(stream),
                Stranger::Garbage => {
                    let _ = stream.write_all(&[0x5a; 100]);
                    held.push(stream);
                }
                Stranger::Silent => held.push(stream),
                Stranger::Impostor => {
                    // "nuvecRNG", version 1, then plausible fields and a zero nonce; the
                    // proof that follows the challenge is garbage.
                    let mut hello = b"nuvecRNG\x01\0\0\0".to_vec();
                    for v in [3u32, 0, 1, 0] {
                        hello.extend(v.to_le_bytes());
                    }
                    hello.extend([0u8; 32]);
                    let _ = stream.write_all(&hello);
                    let _ = stream.write_all(&[0xee; 32]);
                    held.push(stream);
                }
            }
        }
    }
    let outputs = running.finish();
    drop(held);
    testing::assert_all_finished(&outputs);
    assert!(
        !reached.is_empty(),
        "no stranger reached any of the ports {ports:?} within 1.2 s of the launch"
    );
}

#[test]
fn strangers_cannot_join_or_block_a_keyed_ring() {
    strangers(
        "strangers_cannot_join_or_block_a_keyed_ring",
        Some(KEY),
        &[
            Stranger::Scan,
            Stranger::Garbage,
            Stranger::Silent,
            Stranger::Impostor,
        ],
    );
}

/// Without a key, a stranger that stays connected would be taken for the neighbour (as in
/// MLX); one that probes a port and leaves must not break the ring.
#[test]
fn a_port_scan_does_not_break_an_unkeyed_ring() {
    strangers(
        "a_port_scan_does_not_break_an_unkeyed_ring",
        None,
        &[Stranger::Scan, Stranger::Scan],
    );
}

/// After a rank is lost, the survivors close the failed group, form a new one on fresh
/// ports in the same processes, and compute on it; the old group says it is closed.
#[test]
fn survivors_close_and_form_a_new_group() {
    survivors_reform("survivors_close_and_form_a_new_group", "mlx");
}

/// The same on the native wire, the new group native too.
#[test]
fn native_survivors_close_and_form_a_new_group() {
    survivors_reform("native_survivors_close_and_form_a_new_group", "native");
}

fn survivors_reform(name: &str, wire: &str) {
    let fresh = testing::free_ports(2, 1);
    let fresh = format!("{},{}", fresh[0][0], fresh[1][0]);
    let launch = Launch::new(3, 1)
        .timeout(10.0)
        .env("NUVEC_DISTRIBUTED_WIRE", wire)
        .env("NUVEC_TEST_FRESH_PORTS", &fresh);
    let outputs = launch.run(name, |g| {
        g.barrier().unwrap();
        if g.rank() == 2 {
            std::process::exit(0);
        }
        let error = g.all_sum(&mut [1u16; 8]).expect_err("rank 2 is gone");
        assert_eq!(error.peer(), Some(2), "{error}");
        g.close().unwrap();
        let closed = g.barrier().expect_err("the old group is closed");
        assert!(matches!(closed, Error::GroupClosed), "{closed}");
        let ports = std::env::var("NUVEC_TEST_FRESH_PORTS").unwrap();
        let nodes: Vec<Vec<String>> = ports
            .split(',')
            .map(|p| vec![format!("127.0.0.1:{p}")])
            .collect();
        let wire = std::env::var("NUVEC_DISTRIBUTED_WIRE").unwrap();
        let backend = match wire.as_str() {
            "native" => nuvec_distributed_engine::Backend::Native,
            _ => nuvec_distributed_engine::Backend::Ring,
        };
        let options = Options::default().backend(backend);
        let g2 = nuvec_distributed_engine::init_with(&nodes, g.rank(), &options)
            .expect("a new group forms");
        let mut x = vec![g2.rank() as i32 + 10; 100_000];
        g2.all_sum(&mut x).unwrap();
        assert!(x.iter().all(|&v| v == 21));
        // Healthy while both ranks still hold the group (neither leaves before the barrier).
        g2.health().unwrap();
        g2.barrier().unwrap();
    });
    survivors_finished(outputs, 2);
}

/// Asserts that every rank but `victim` (which exits on purpose) finished.
fn survivors_finished(outputs: Option<Vec<RankOutput>>, victim: usize) {
    for o in outputs.iter().flatten().filter(|o| o.rank != victim) {
        o.assert_finished();
    }
}

/// `health` names a peer that is gone, without running a collective.
#[test]
fn health_names_a_lost_peer_between_collectives() {
    let name = "health_names_a_lost_peer_between_collectives";
    let outputs = Launch::new(3, 1).timeout(10.0).run(name, |g| {
        g.health().unwrap();
        g.barrier().unwrap();
        if g.rank() == 1 {
            std::process::exit(0);
        }
        let start = Instant::now();
        let error = loop {
            match g.health() {
                Ok(()) if start.elapsed() < Duration::from_secs(5) => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Ok(()) => panic!("rank {}: health did not notice rank 1 leave", g.rank()),
                Err(e) => break e,
            }
        };
        assert_eq!(error.peer(), Some(1), "{error}");
        assert!(matches!(g.barrier().unwrap_err(), Error::Failed(_)));
    });
    survivors_finished(outputs, 1);
}

// ---- Ranks that exit or never start; socket options ---------------------------------

/// Seconds every rank's group waits for a silent peer in these tests.
const EXIT_TIMEOUT: f64 = 10.0;

/// Runs `collective` on every rank but `victim`, which exits `delay` into it; checks that
/// every survivor fails within the timeout naming the victim, and that the next call
/// reports the earlier failure at once.
fn a_rank_that_exits(
    name: &str,
    size: usize,
    victim: usize,
    delay: Duration,
    collective: Collective,
) {
    let outputs = Launch::new(size, 1).timeout(EXIT_TIMEOUT).run(name, |g| {
        // Everyone starts together, so the victim dies mid-collective.
        g.barrier().unwrap();
        if g.rank() == victim {
            // With a delay, the victim joins the collective and dies inside it; without,
            // it dies before sending anything, so the others cannot complete.
            if !delay.is_zero() {
                let worker = g.clone();
                std::thread::spawn(move || {
                    let _ = collective(&worker);
                });
                std::thread::sleep(delay);
            }
            std::process::exit(0);
        }
        let start = Instant::now();
        let error = collective(&g).expect_err("a collective with a dead rank fails");
        report_failure(&error, start.elapsed());
        let again = g.all_sum(&mut [1u8]).expect_err("the group stays failed");
        assert!(matches!(again, Error::Failed(_)), "{again}");
        println!("AGAIN {again}");
    });
    let Some(outputs) = outputs else { return };
    let again = ["failed earlier".to_string(), format!("rank {victim}")];
    assert_blamed(&outputs, victim, (EXIT_TIMEOUT * 1000.0) as u64, &again);
    for o in outputs.iter().filter(|o| o.rank != victim) {
        let (_, _, message) = o.failure();
        assert!(message.contains(&format!("rank {victim}")), "{message}");
    }
}

fn several_large_sums(g: &Group) -> nuvec_distributed_engine::Result<()> {
    // Several 64 MiB all_sums, so the victim's exit lands inside one of them.
    let mut data = vec![1.0f32; 16 << 20];
    for _ in 0..8 {
        g.all_sum(&mut data)?;
    }
    Ok(())
}

#[test]
fn a_rank_that_exits_before_a_small_all_sum_fails_the_others_p3() {
    a_rank_that_exits(
        "a_rank_that_exits_before_a_small_all_sum_fails_the_others_p3",
        3,
        2,
        Duration::ZERO,
        small_sum,
    );
}

#[test]
fn a_rank_that_exits_during_a_large_all_sum_fails_the_others_p3() {
    a_rank_that_exits(
        "a_rank_that_exits_during_a_large_all_sum_fails_the_others_p3",
        3,
        1,
        Duration::from_millis(150),
        several_large_sums,
    );
}

/// With four ranks, rank 1 is not next to rank 3: it learns which rank was lost from the
/// failure notice its neighbours leave before closing.
#[test]
fn a_rank_that_exits_is_named_by_ranks_that_are_not_its_neighbours_p4() {
    a_rank_that_exits(
        "a_rank_that_exits_is_named_by_ranks_that_are_not_its_neighbours_p4",
        4,
        3,
        Duration::ZERO,
        small_sum,
    );
}

#[test]
fn a_rank_that_never_starts_fails_init_naming_it() {
    let name = "a_rank_that_never_starts_fails_init_naming_it";
    let outputs = Launch::new(3, 1).skip(2).timeout(2.0).run_raw(name, || {
        let start = Instant::now();
        let error = nuvec_distributed_engine::init(true)
            .expect_err("a ring with a missing rank cannot form");
        report_failure(&error, start.elapsed());
    });
    let Some(outputs) = outputs else { return };
    for o in &outputs {
        let (ms, peer, message) = o.finished_failure();
        assert_eq!(peer, Some(2), "rank {}: {message}", o.rank);
        assert!(
            message.contains("rank 2") && message.contains("ring setup"),
            "{message}"
        );
        assert!(
            (1_500..10_000).contains(&ms),
            "rank {} gave up after {ms} ms: {message}",
            o.rank
        );
    }
}

#[test]
fn a_rank_that_exits_during_a_large_all_sum_is_named_by_every_survivor_p4() {
    a_rank_that_exits(
        "a_rank_that_exits_during_a_large_all_sum_is_named_by_every_survivor_p4",
        4,
        2,
        Duration::from_millis(150),
        several_large_sums,
    );
}

/// Socket tuning is applied to every connection: an algorithm the kernel does not know is
/// an error that names it, at setup, not a silently ignored option.
#[cfg(target_os = "linux")]
#[test]
fn an_unknown_congestion_control_fails_setup_naming_it() {
    let name = "an_unknown_congestion_control_fails_setup_naming_it";
    let launch = Launch::new(2, 1).env("NUVEC_DISTRIBUTED_TCP_CONGESTION", "no-such-cc");
    init_fails_saying(launch, name, true, || (), ["no-such-cc", "congestion"]);
}

/// A congestion control the kernel allows forms a working ring.
#[cfg(target_os = "linux")]
#[test]
fn a_chosen_congestion_control_forms_a_ring() {
    let launch = Launch::new(2, 1).env("NUVEC_DISTRIBUTED_TCP_CONGESTION", "reno");
    launch.all_ok("a_chosen_congestion_control_forms_a_ring", |g| {
        let mut x = vec![1u32; 300_000];
        g.all_sum(&mut x).unwrap();
        assert!(x.iter().all(|&v| v == 2));
    });
}

// Abort from another thread ---------------------------------------------------------

/// Rank 0 runs an all_sum of `elems` f32 that its peers join only after it gave up. About
/// 200 ms in, another thread of rank 0 checks `health` (which must not wait for the
/// collective) and closes the group: the all_sum must return `Aborted` within 100 ms of
/// the close (asserted under 1 s, for a loaded machine; the figure is printed), every later
/// call `GroupClosed`, and the process must exit cleanly. The late peers then find rank 0
/// gone and name it: nobody failed, so no notice may name anyone else.
fn abort_from_another_thread(name: &str, size: usize, elems: usize) {
    let launch = Launch::new(size, 1).timeout(10.0);
    let Some(running) = launch.start(name, |g| {
        g.barrier().unwrap();
        if g.rank() != 0 {
            testing::wait_for_parent();
            let start = Instant::now();
            let error = g
                .all_sum(&mut vec![1.0f32; elems])
                .expect_err("rank 0 closed the group");
            println!("PEER {error} after {:?}", start.elapsed());
            assert_eq!(error.peer(), Some(0), "{error}");
            assert!(start.elapsed() < Duration::from_secs(5), "{error}");
            return;
        }
        let closer = {
            let g = g.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(200));
                let (health, health_took) = testing::timed(|| g.health());
                let closed_at = Instant::now();
                g.close().unwrap();
                (health, health_took, closed_at, closed_at.elapsed())
            })
        };
        let mut data = vec![1.0f32; elems];
        let result = g.all_sum(&mut data);
        let returned = Instant::now();
        let (health, health_took, closed_at, close_took) = closer.join().unwrap();
        let error = result.expect_err("the all_sum was aborted");
        let abort_took = returned.saturating_duration_since(closed_at);
        println!(
            "ABORT returned {abort_took:?} after close(); close() took {close_took:?}, \
             health() {health_took:?}: {error}"
        );
        assert!(
            matches!(
                error,
                Error::Aborted {
                    context: nuvec_distributed_engine::Phase::AllSum
                }
            ),
            "{error}"
        );
        assert_eq!(error.fault(), nuvec_distributed_engine::Fault::Closed);
        assert!(returned >= closed_at, "returned before the close: {error}");
        assert!(abort_took < Duration::from_secs(1), "{abort_took:?}");
        assert!(close_took < Duration::from_secs(1), "{close_took:?}");
        assert!(health_took < Duration::from_secs(1), "{health_took:?}");
        health.expect("nobody failed: health reports the group fine while a call runs");
        assert!(matches!(g.barrier(), Err(Error::GroupClosed)));
        assert!(matches!(g.health(), Err(Error::GroupClosed)));
        g.close().expect("closing twice is no error");
        mark("closed");
    }) else {
        return;
    };
    running.wait_for(0, "closed", Duration::from_secs(60));
    running.release();
    let outputs = running.finish();
    testing::assert_all_finished(&outputs);
    for o in &outputs {
        println!("rank {}: {}", o.rank, o.stdout.trim());
    }
}

#[test]
fn close_from_another_thread_aborts_a_small_all_sum_p3() {
    abort_from_another_thread("close_from_another_thread_aborts_a_small_all_sum_p3", 3, 1);
}

#[test]
fn close_from_another_thread_aborts_an_8_mib_all_sum_p3() {
    abort_from_another_thread(
        "close_from_another_thread_aborts_an_8_mib_all_sum_p3",
        3,
        2 << 20,
    );
}

/// Every rank loops on 64 MiB all_sums that keep moving; rank 0 closes its group from
/// another thread mid-stream. Its loop must end within 1 s of the close (`Aborted`, or
/// `GroupClosed` if the close fell between two calls), and the peers name rank 0.
#[test]
fn close_from_another_thread_aborts_a_moving_64_mib_all_sum_p2() {
    let name = "close_from_another_thread_aborts_a_moving_64_mib_all_sum_p2";
    let outputs = Launch::new(2, 1).timeout(10.0).run(name, |g| {
        g.barrier().unwrap();
        let closer = (g.rank() == 0).then(|| {
            let g = g.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                let closed_at = Instant::now();
                g.close().unwrap();
                closed_at
            })
        });
        let mut data = vec![1.0f32; 16 << 20];
        let mut calls = 0;
        let error = loop {
            match g.all_sum(&mut data) {
                Ok(()) => calls += 1,
                Err(e) => break e,
            }
        };
        let ended = Instant::now();
        let Some(closer) = closer else {
            println!("PEER {error} after {calls} calls");
            assert_eq!(error.peer(), Some(0), "{error}");
            return;
        };
        let closed_at = closer.join().unwrap();
        let took = ended.saturating_duration_since(closed_at);
        println!("ABORT {error} {took:?} after close(), after {calls} calls");
        assert!(
            matches!(error, Error::Aborted { .. } | Error::GroupClosed),
            "{error}"
        );
        assert!(ended >= closed_at, "ended before the close: {error}");
        assert!(took < Duration::from_secs(1), "{took:?}");
    });
    for o in outputs.iter().flatten() {
        o.assert_finished();
        println!(
            "rank {}: {}",
            o.rank,
            o.lines("ABORT ").join("") + &o.lines("PEER ").join("")
        );
    }
}

// Keys and environments

/// In a rank: forms the ring of the hostfile with `timeout`, with [`KEY`] when `keyed`,
/// and sums 1000 f32; forming or the sum must fail, and the failure is reported
/// ([`report_failure`]) with the time it took.
fn form_and_fail(keyed: bool, timeout: Duration) {
    let mut options = Options::default().timeout(timeout);
    if keyed {
        options = options.key(KEY);
    }
    let (error, took) = testing::timed(|| {
        match nuvec_distributed_engine::init_with(&testing::hostfile_nodes(), my_rank(), &options) {
            Err(e) => e,
            Ok(g) => {
                let mut x = vec![1.0f32; 1000];
                match g.all_sum(&mut x) {
                    Err(e) => e,
                    Ok(()) => panic!("all_sum returned Ok with {:?}", &x[..4]),
                }
            }
        }
    });
    report_failure(&error, took);
}

/// Runs `before`, then `init(strict)`, on every rank of `launch` (test `name`); `init`
/// must fail saying each of `says`.
fn init_fails_saying(
    launch: Launch,
    name: &str,
    strict: bool,
    before: impl FnOnce(),
    says: [&str; 2],
) {
    let Some(outputs) = launch.run_raw(name, || {
        before();
        let error = nuvec_distributed_engine::init(strict).expect_err("init fails");
        report_failure(&error, Duration::ZERO);
    }) else {
        return;
    };
    failures_saying(&outputs, &says);
}

/// Every rank's failure, with its output ([`RankOutput::finished_failure`]: each rank must
/// have finished after it), checked to say each of `says`.
fn failures_saying<'a>(
    outputs: &'a [RankOutput],
    says: &[&str],
) -> Vec<(&'a RankOutput, u64, Option<usize>, String)> {
    outputs
        .iter()
        .map(|o| {
            let (ms, peer, message) = o.finished_failure();
            assert!(
                says.iter().all(|s| message.contains(s)),
                "rank {}: {message}",
                o.rank
            );
            (o, ms, peer, message)
        })
        .collect()
}

/// A rank with a key next to one without, in both orientations at P = 2: both fail at
/// once (well under the timeout), each naming the other and saying which side has no key;
/// the rank without a key never returns the keyed peer's handshake as data.
#[test]
fn a_keyed_rank_next_to_an_unkeyed_one_fails_fast_on_both_sides_p2() {
    const TIMEOUT_S: u64 = 8;
    for keyed in [0usize, 1] {
        let name = "a_keyed_rank_next_to_an_unkeyed_one_fails_fast_on_both_sides_p2";
        let launch = Launch::new(2, 1)
            .timeout(TIMEOUT_S as f64)
            .env("TEST_KEYED_RANK", &keyed.to_string());
        let Some(outputs) = launch.run_raw(name, || {
            let keyed: usize = std::env::var("TEST_KEYED_RANK").unwrap().parse().unwrap();
            form_and_fail(my_rank() == keyed, Duration::from_secs(TIMEOUT_S));
        }) else {
            return;
        };
        for o in &outputs {
            assert!(o.finished(), "keyed {keyed}: rank {}:\n{o}", o.rank);
            let (ms, peer, message) = o.failure();
            assert_eq!(
                peer,
                Some(1 - o.rank),
                "keyed {keyed}, rank {}: {message}",
                o.rank
            );
            assert!(
                ms < 3000,
                "keyed {keyed}, rank {} took {ms} ms: {message}",
                o.rank
            );
            assert!(
                message.contains("incompatible"),
                "rank {}: {message}",
                o.rank
            );
            let says = if o.rank == keyed {
                "has no key (NUVEC_DISTRIBUTED_KEY)"
            } else {
                "has a key (NUVEC_DISTRIBUTED_KEY) and this rank has none"
            };
            assert!(
                message.contains(says),
                "keyed {keyed}, rank {}: {message}",
                o.rank
            );
        }
    }
}

/// An empty key is an error naming the variable, not a ring without authentication.
#[test]
fn an_empty_key_variable_is_an_error() {
    let name = "an_empty_key_variable_is_an_error";
    let launch = Launch::new(2, 1).env("NUVEC_DISTRIBUTED_KEY", "");
    init_fails_saying(
        launch,
        name,
        false,
        || (),
        ["NUVEC_DISTRIBUTED_KEY", "empty"],
    );
}

/// `MLX_HOSTFILE` without `MLX_RANK` describes a ring this process cannot join: even
/// non-strict `init` is an error naming the variables, not a group of one.
#[test]
fn a_hostfile_without_a_rank_is_an_error_even_when_not_strict() {
    let name = "a_hostfile_without_a_rank_is_an_error_even_when_not_strict";
    let launch =
        Launch::new(2, 1).command(move |_| testing::this_test_in(&["env", "-u", "MLX_RANK"], name));
    let unset = || assert!(std::env::var_os("MLX_RANK").is_none());
    init_fails_saying(launch, name, false, unset, ["MLX_RANK", "MLX_HOSTFILE"]);
}

/// One rank without the key in a keyed ring of 3: every rank fails and names a rank of the
/// other kind, saying who has no key; no rank returns data. The unkeyed rank fails on the
/// first bytes it receives from a keyed neighbour, and answers them with NO_KEY, on which
/// that neighbour fails at once. The other keyed neighbour fails at once when NO_KEY
/// reached it too; when only the unkeyed rank's data did, it cannot tell that from a
/// stranger's garbage (which must not abort a forming ring), so it keeps its address open
/// for the real neighbour until the timeout, then names the unkeyed rank.
#[test]
fn one_unkeyed_rank_in_a_keyed_ring_of_3_is_named_by_every_rank() {
    const TIMEOUT_S: u64 = 3;
    const UNKEYED: usize = 1;
    let name = "one_unkeyed_rank_in_a_keyed_ring_of_3_is_named_by_every_rank";
    let launch = Launch::new(3, 1).timeout(TIMEOUT_S as f64);
    let Some(outputs) = launch.run_raw(name, || {
        form_and_fail(my_rank() != UNKEYED, Duration::from_secs(TIMEOUT_S));
    }) else {
        return;
    };
    for (o, ms, peer, message) in failures_saying(&outputs, &["incompatible"]) {
        if o.rank == UNKEYED {
            assert!(matches!(peer, Some(0 | 2)), "{message}");
            assert!(message.contains("and this rank has none"), "{message}");
        } else {
            assert_eq!(peer, Some(UNKEYED), "rank {}: {message}", o.rank);
            assert!(message.contains("has no key"), "rank {}: {message}", o.rank);
        }
        // A rank told NO_KEY fails at once; one that saw only data waits for the timeout.
        let fast = o.rank != UNKEYED + 1 || message.contains("a message saying that it has no key");
        let limit = if fast { 2000 } else { TIMEOUT_S * 1000 + 2000 };
        assert!(ms < limit, "rank {} took {ms} ms: {message}", o.rank);
    }
}

// Late peers and timeouts

/// This rank, from the environment the harness gives it.
fn my_rank() -> usize {
    std::env::var("MLX_RANK").unwrap().parse().unwrap()
}

/// 8 MiB of `f32` per rank: far more than the 64 KiB socket buffers the late-peer tests
/// set, so the punctual rank's sends block until the late one reads.
const LATE_SUM_LEN: usize = 2 << 20;
const SMALL_BUFFERS: &str = "65536";

/// Rank 1 arrives 2.5 s late to an 8 MiB all_sum under a 4 s timeout: rank 0 waits for it
/// (its sends blocked the whole time, which the kernel's own timeouts must also allow) and
/// both get the right sum.
#[test]
fn a_peer_late_within_the_timeout_to_an_8_mib_all_sum_is_waited_for() {
    let launch = Launch::new(2, 1)
        .timeout(4.0)
        .env("NUVEC_DISTRIBUTED_SOCKET_BUFFER", SMALL_BUFFERS)
        .deadline(Duration::from_secs(60));
    let outputs = launch.all_ok(
        "a_peer_late_within_the_timeout_to_an_8_mib_all_sum_is_waited_for",
        |g| {
            g.barrier().unwrap();
            if g.rank() == 1 {
                std::thread::sleep(Duration::from_millis(2500));
            }
            let mut x = vec![g.rank() as f32 + 1.0; LATE_SUM_LEN];
            let start = Instant::now();
            g.all_sum(&mut x).unwrap();
            println!("WAITED {}", start.elapsed().as_millis());
            assert!(x.iter().all(|&v| v == 3.0));
        },
    );
    if let Some(rank0) = outputs.first() {
        let waited: u64 = rank0.lines("WAITED ")[0].parse().unwrap();
        assert!(
            waited >= 2000,
            "rank 0 did not wait for rank 1: {waited} ms"
        );
    }
}

/// Rank 1 arrives 4 s late under a 1.5 s timeout: rank 0 fails within the timeout (plus
/// the stall verdict's and the notice's margins) naming rank 1, and rank 1, when it comes,
/// fails too, naming rank 0, which gave up.
#[test]
fn a_peer_late_beyond_the_timeout_is_named() {
    const TIMEOUT_MS: u64 = 1500;
    let launch = Launch::new(2, 1)
        .timeout(TIMEOUT_MS as f64 / 1000.0)
        .env("NUVEC_DISTRIBUTED_SOCKET_BUFFER", SMALL_BUFFERS)
        .deadline(Duration::from_secs(60));
    let Some(outputs) = launch.run("a_peer_late_beyond_the_timeout_is_named", |g| {
        g.barrier().unwrap();
        if g.rank() == 1 {
            std::thread::sleep(Duration::from_secs(4));
        }
        let mut x = vec![1.0f32; LATE_SUM_LEN];
        let start = Instant::now();
        let error = g.all_sum(&mut x).expect_err("the timeout passed");
        report_failure(&error, start.elapsed());
    }) else {
        return;
    };
    for o in &outputs {
        let (ms, peer, message) = o.finished_failure();
        assert_eq!(peer, Some(1 - o.rank), "rank {}: {message}", o.rank);
        if o.rank == 0 {
            assert!(
                (TIMEOUT_MS..TIMEOUT_MS + 1500).contains(&ms),
                "rank 0 gave up after {ms} ms: {message}"
            );
            assert!(message.contains("rank 1"), "{message}");
        }
    }
}

/// `Options::spin(Duration::MAX)` with a 1 s timeout, against a peer that never calls the
/// collective: spinning ends at the deadline, and the error names the silent peer.
#[test]
fn spinning_forever_still_ends_at_the_timeout() {
    const TIMEOUT: Duration = Duration::from_secs(1);
    let name = "spinning_forever_still_ends_at_the_timeout";
    let launch = Launch::new(2, 1).deadline(Duration::from_secs(60));
    let Some(outputs) = launch.run_raw(name, || {
        let options = Options::default().timeout(TIMEOUT).spin(Duration::MAX);
        let g =
            nuvec_distributed_engine::init_with(&testing::hostfile_nodes(), my_rank(), &options)
                .expect("the ring forms");
        if g.rank() == 1 {
            // Holds its connections open and never answers, until rank 0 has given up.
            std::thread::sleep(TIMEOUT * 4);
            return;
        }
        let start = Instant::now();
        let error = g
            .all_sum(&mut [1.0f32; 16])
            .expect_err("rank 1 never answers");
        report_failure(&error, start.elapsed());
    }) else {
        return;
    };
    testing::assert_all_finished(&outputs);
    let (ms, peer, message) = outputs[0].failure();
    assert_eq!(peer, Some(1), "{message}");
    assert!(
        (1000..2000).contains(&ms),
        "rank 0 gave up after {ms} ms: {message}"
    );
}

/// The largest timeout and spin there are: the ring forms and computes (this panicked with
/// "overflow when adding duration to instant" in the ring's setup).
#[test]
fn a_ring_with_the_largest_timeout_and_spin_computes() {
    let name = "a_ring_with_the_largest_timeout_and_spin_computes";
    let launch = Launch::new(2, 1).deadline(Duration::from_secs(60));
    let Some(outputs) = launch.run_raw(name, || {
        let options = Options::default()
            .timeout(Duration::MAX)
            .spin(Duration::MAX);
        let g =
            nuvec_distributed_engine::init_with(&testing::hostfile_nodes(), my_rank(), &options)
                .expect("the ring forms");
        let mut x = vec![g.rank() as u32 + 1; 100_000];
        g.all_sum(&mut x).unwrap();
        assert!(x.iter().all(|&v| v == 3));
        g.barrier().unwrap();
    }) else {
        return;
    };
    testing::assert_all_finished(&outputs);
}

/// `NUVEC_DISTRIBUTED_TIMEOUT=1e19` (about 317 billion years): the ring forms and computes.
#[test]
fn an_absurd_timeout_from_the_environment_forms_a_ring() {
    let launch = Launch::new(2, 1)
        .timeout(1e19)
        .deadline(Duration::from_secs(60));
    launch.all_ok("an_absurd_timeout_from_the_environment_forms_a_ring", |g| {
        let mut x = [g.rank() as f64 + 1.0; 1000];
        g.all_sum(&mut x).unwrap();
        assert!(x.iter().all(|&v| v == 3.0));
    });
}

// Blame ----------------------------------------------------------------------------
//
// One rank is stopped (SIGSTOP) or killed (SIGKILL) while every rank loops on a collective;
// every survivor must name it, and none may name a healthy rank. With a stall, only the
// stalled rank's neighbours can see it (its kernel keeps acknowledging); the others must
// learn it from them. Large collectives run with small socket buffers, so that ranks
// block on sends as well as receives.

/// The timeout of the blame tests: short, to keep them quick.
const BLAME_TIMEOUT_S: f64 = 1.5;

/// Socket buffers for the large collectives: far smaller than the data.
const BLAME_SOCKET_BUFFER: &str = "65536";

/// Sends `signal` ("STOP" or "KILL") to `victim` while every rank loops on `collective`;
/// checks that every survivor fails naming the victim, within the timeout plus the
/// inquiry's grace and patience and the linger of the ranks that close, and that it says
/// so again on the next call.
fn blame(name: &str, size: usize, victim: usize, signal: &str, collective: Collective) {
    // Grace min(timeout / 4, 500 ms), patience twice that, 250 ms linger, and slack for a
    // machine loaded with builds.
    const MARGIN_MS: u64 = 2 * 375 + 250 + 1000;
    let launch = Launch::new(size, 1)
        .timeout(BLAME_TIMEOUT_S)
        .env("NUVEC_DISTRIBUTED_SOCKET_BUFFER", BLAME_SOCKET_BUFFER);
    let Some(outputs) = strike_during(&launch, name, victim, signal, collective) else {
        return;
    };
    assert_eq!(outputs.len(), size);
    // At most the timeout and the margin.
    let within_ms = (BLAME_TIMEOUT_S * 1000.0) as u64 + MARGIN_MS + 1;
    assert_blamed(&outputs, victim, within_ms, &[format!("rank {victim}")]);
}

test_cases!(blame {
    blame_a_stopped_rank_small_p3: 3, 1, "STOP", small_sum;
    blame_a_stopped_rank_small_p4: 4, 2, "STOP", small_sum;
    blame_a_stopped_rank_small_p5: 5, 2, "STOP", small_sum;
    blame_a_stopped_rank_small_p6: 6, 3, "STOP", small_sum;
    blame_a_stopped_rank_large_p3: 3, 0, "STOP", blame_large;
    blame_a_stopped_rank_large_p4: 4, 2, "STOP", blame_large;
    blame_a_stopped_rank_large_p5: 5, 1, "STOP", blame_large;
    blame_a_stopped_rank_large_p6: 6, 4, "STOP", blame_large;
    blame_a_killed_rank_small_p5: 5, 3, "KILL", small_sum;
    blame_a_killed_rank_small_p6: 6, 0, "KILL", small_sum;
    blame_a_killed_rank_large_p4: 4, 2, "KILL", blame_large;
    blame_a_killed_rank_large_p5: 5, 2, "KILL", blame_large;
});
