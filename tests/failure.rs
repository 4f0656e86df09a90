//! Failures across real processes: a rank that exits mid-collective, a rank that never
//! starts, and what the survivors see afterwards. Every test is bounded in time: the ranks'
//! groups have a short timeout and the harness kills ranks that outlive its deadline.

mod common;

use std::time::{Duration, Instant};

use common::{Launch, report_failure};
use nuvec_distributed::{Error, Group};

/// Seconds every rank's group waits for a silent peer in these tests.
const TIMEOUT: f64 = 10.0;

/// Runs `collective` on every rank but `victim`, which exits `delay` into it; checks that
/// every survivor fails within the timeout naming the victim, and that the next call
/// reports the earlier failure at once.
fn a_rank_that_exits(
    name: &str,
    size: usize,
    victim: usize,
    delay: Duration,
    collective: fn(&Group) -> nuvec_distributed::Result<()>,
) {
    let outputs = Launch::new(size, 1).timeout(TIMEOUT).run(name, |g| {
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
    for o in outputs.iter().filter(|o| o.rank != victim) {
        assert!(
            o.finished(),
            "rank {} did not finish:\n{}\n{}",
            o.rank,
            o.stdout,
            o.stderr
        );
        let (ms, peer, message) = o.failure();
        assert!(
            ms < (TIMEOUT * 1000.0) as u64,
            "rank {} took {ms} ms: {message}",
            o.rank
        );
        assert_eq!(
            peer,
            Some(victim),
            "rank {} named the wrong rank: {message}",
            o.rank
        );
        assert!(message.contains(&format!("rank {victim}")), "{message}");
        let again = o.lines("AGAIN ").join("");
        assert!(
            again.contains("failed earlier") && again.contains(&format!("rank {victim}")),
            "{again}"
        );
    }
}

fn small_sum(g: &Group) -> nuvec_distributed::Result<()> {
    g.all_sum(&mut [1.0f32])
}

fn large_sum(g: &Group) -> nuvec_distributed::Result<()> {
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
        large_sum,
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
        let error =
            nuvec_distributed::init(true).expect_err("a ring with a missing rank cannot form");
        report_failure(&error, start.elapsed());
    });
    let Some(outputs) = outputs else { return };
    for o in &outputs {
        assert!(o.finished(), "rank {}:\n{}\n{}", o.rank, o.stdout, o.stderr);
        let (ms, peer, message) = o.failure();
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
        large_sum,
    );
}

/// Socket tuning is applied to every connection: an algorithm the kernel does not know is
/// an error that names it, at setup, not a silently ignored option.
#[cfg(target_os = "linux")]
#[test]
fn an_unknown_congestion_control_fails_setup_naming_it() {
    let name = "an_unknown_congestion_control_fails_setup_naming_it";
    let launch = Launch::new(2, 1).env("NUVEC_DISTRIBUTED_TCP_CONGESTION", "no-such-cc");
    let Some(outputs) = launch.run_raw(name, || {
        let error = nuvec_distributed::init(true).expect_err("the option is applied");
        report_failure(&error, Duration::ZERO);
    }) else {
        return;
    };
    for o in &outputs {
        let (_, _, message) = o.failure();
        assert!(
            message.contains("no-such-cc") && message.contains("congestion"),
            "{message}"
        );
    }
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
