//! Recovery across real processes on loopback: a rank is killed (SIGKILL) or stopped
//! (SIGSTOP) at a random point of a loop of collectives; the survivors shrink
//! ([`Group::shrink`]) and run verified collectives; the killed rank is started again at its
//! hostfile address with a plain `init`, the survivors rejoin ([`Group::rejoin`]) and the full
//! group runs verified collectives. A stopped rank that wakes after the others shrank gets
//! errors and leaves the shrunk group working.
//!
//! Every sum is checked exactly: each rank contributes small integers, so the float sums
//! have one right answer. Each survivor prints `SHRINK_MS <ms>`: the time from its
//! collective's failure being returned to the end of the first verified all_sum of the
//! shrunk group (the test asserts nothing about it).

use std::time::{Duration, Instant};

use nuvec_distributed_engine::{Fault, Group};
use nuvec_tools::test_cases;
use nuvec_tools::testing::{self, Launch, RankOutput, mark, random_settle, sum_of};

/// Verified collectives after the shrink, and again after the rejoin.
const ROUNDS: usize = 100;
/// Elements of each verified all_sum.
const LEN: usize = 1000;

/// What first rank `first` adds at round `round`, element `j`: a small integer.
fn value(first: usize, round: usize, j: usize) -> f32 {
    ((first + 1) * (1 + (round + j) % 7)) as f32
}

/// Runs `rounds` all_sums on `group`, whose ranks are the first ranks `firsts` in order,
/// checking every element; `after_first` runs after the first one is verified.
fn verified_sums(group: &Group, firsts: &[usize], rounds: usize, mut after_first: impl FnMut()) {
    assert_eq!(group.size(), firsts.len(), "the group's size");
    let me = firsts[group.rank()];
    let mut x = vec![0f32; LEN];
    for round in 0..rounds {
        for (j, v) in x.iter_mut().enumerate() {
            *v = value(me, round, j);
        }
        group
            .all_sum(&mut x)
            .unwrap_or_else(|e| panic!("verified all_sum {round}: {e}"));
        for (j, v) in x.iter().enumerate() {
            let want: f32 = firsts.iter().map(|&f| value(f, round, j)).sum();
            assert_eq!(*v, want, "round {round}, element {j}");
        }
        if round == 0 {
            after_first();
        }
    }
}

fn this_rank() -> usize {
    std::env::var("MLX_RANK").unwrap().parse().unwrap()
}

/// Shrinks after a failure, timing it to the first verified collective; returns the shrunk
/// group.
fn shrink_and_verify(g: &Group, survivors: &[usize]) -> Group {
    let failed_at = Instant::now();
    let shrunk = g.shrink().unwrap_or_else(|e| panic!("shrink: {e}"));
    verified_sums(&shrunk, survivors, ROUNDS, || {
        println!("SHRINK_MS {}", failed_at.elapsed().as_millis());
    });
    shrunk
}

/// P ranks loop on all_sums of `len` f32 on `wire`; `victim` is killed; the survivors
/// shrink, verify, and rejoin the restarted victim; the full group verifies.
fn kill_shrink_rejoin(name: &str, wire: &str, size: usize, victim: usize, len: usize) {
    let launch = testing::recovery_launch(size, 1, wire);
    kill_shrink_rejoin_in(&launch, name, victim, len);
}

/// [`kill_shrink_rejoin`] with a key (the rendezvous and both formations are keyed) and
/// two connections per rank (the rendezvous uses the first address, the groups both).
fn keyed_kill_shrink_rejoin(name: &str, wire: &str, size: usize, victim: usize) {
    let launch = testing::recovery_launch(size, 2, wire)
        .env("NUVEC_DISTRIBUTED_KEY", "correct horse battery staple 2026");
    kill_shrink_rejoin_in(&launch, name, victim, 16);
}

fn kill_shrink_rejoin_in(launch: &Launch, name: &str, victim: usize, len: usize) {
    let (size, wire) = (launch.size, wire_of(launch));
    let all: Vec<usize> = (0..size).collect();
    let survivors: Vec<usize> = all.iter().copied().filter(|&r| r != victim).collect();
    let Some(outputs) = testing::kill_and_rejoin(launch, name, victim, "shrunk", |restarted| {
        let g = nuvec_distributed_engine::init(true).expect("the group forms");
        if restarted {
            // A plain init at the same address joins the survivors' rejoin.
            assert_eq!((g.rank(), g.size()), (victim, size));
            verified_sums(&g, &all, ROUNDS, || {});
            println!("REJOINED");
            return;
        }
        g.barrier().unwrap();
        let error = testing::until_failure(|| sum_of(&g, len));
        assert_eq!(error.fault(), Fault::PeerFailed, "{error}");
        let shrunk = shrink_and_verify(&g, &survivors);
        mark("shrunk");
        let full = shrunk.rejoin().unwrap_or_else(|e| panic!("rejoin: {e}"));
        assert_eq!((full.rank(), full.size()), (this_rank(), size));
        verified_sums(&full, &all, ROUNDS, || {});
        shrunk.close().unwrap();
        full.close().unwrap();
        println!("REJOINED");
    }) else {
        return;
    };
    report(&outputs, &wire, size);
}

/// The wire a launch sets, with "+key" when it sets a key, for the printed times.
fn wire_of(launch: &Launch) -> String {
    let get = |k: &str| {
        launch
            .env
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
    };
    let wire = get("NUVEC_DISTRIBUTED_WIRE").unwrap_or_else(|| "mlx".into());
    match get("NUVEC_DISTRIBUTED_KEY") {
        Some(_) => format!("{wire}+key"),
        None => wire,
    }
}

/// Prints every survivor's shrink time, for the record.
fn report(outputs: &[RankOutput], wire: &str, size: usize) {
    for o in outputs {
        for line in o.lines("SHRINK_MS ") {
            println!(
                "{wire} P={size} rank {}: shrink to first verified all_sum {line} ms",
                o.rank
            );
        }
    }
}

test_cases!(kill_shrink_rejoin {
    mlx_p3_small: "mlx", 3, 1, 16;
    mlx_p4_small: "mlx", 4, 0, 16;
    mlx_p5_small: "mlx", 5, 3, 16;
    mlx_p6_small: "mlx", 6, 5, 16;
    mlx_p7_small: "mlx", 7, 2, 16;
    mlx_p8_small: "mlx", 8, 6, 16;
    mlx_p4_64_mib: "mlx", 4, 2, 16 << 20;
    native_p3_small: "native", 3, 0, 16;
    native_p4_small: "native", 4, 2, 16;
    native_p5_small: "native", 5, 4, 16;
    native_p6_small: "native", 6, 1, 16;
    native_p7_small: "native", 7, 3, 16;
    native_p8_small: "native", 8, 0, 16;
    native_p3_64_mib: "native", 3, 1, 16 << 20;
});

/// P ranks loop on small all_sums; `victim` is stopped (SIGSTOP). The survivors fail within
/// the timeout, shrink without it and verify; then the victim goes on (SIGCONT): its
/// collective fails, and so does its own shrink, saying it was left out; meanwhile and
/// after, the shrunk group keeps computing right.
fn stop_shrink(name: &str, wire: &str, size: usize, victim: usize) {
    let launch = testing::recovery_launch(size, 1, wire);
    let survivors: Vec<usize> = (0..size).filter(|&r| r != victim).collect();
    let Some(mut running) = launch.start_raw(name, || {
        let g = nuvec_distributed_engine::init(true).expect("the group forms");
        g.barrier().unwrap();
        let error = testing::until_failure(|| sum_of(&g, 16));
        if this_rank() == victim {
            // Woken after the others shrank: its group failed, and it is left out.
            println!("VICTIM_ERROR {error}");
            let again = g
                .all_sum(&mut [1.0f32])
                .expect_err("the group stays failed");
            println!("VICTIM_AGAIN {again}");
            let left_out = g.shrink().expect_err("the survivors shrank without it");
            println!("VICTIM_SHRINK {left_out}");
            assert!(
                matches!(left_out, nuvec_distributed_engine::Error::Excluded { rank, .. } if rank == victim)
                    && left_out.fault() == Fault::Closed,
                "{left_out:?}"
            );
            mark("left-out");
            return;
        }
        let shrunk = shrink_and_verify(&g, &survivors);
        mark("shrunk");
        // The shrunk group keeps working while the woken rank tries to shrink.
        loop {
            // Every survivor stops at the same round: the first one any of them saw the mark.
            let mut seen = [f32::from(u8::from(testing::marked(victim, "left-out")))];
            shrunk.all_sum(&mut seen).unwrap();
            if seen[0] > 0.0 {
                break;
            }
            verified_sums(&shrunk, &survivors, 1, || {});
        }
        verified_sums(&shrunk, &survivors, ROUNDS, || {});
        shrunk.close().unwrap();
        println!("SURVIVED");
    }) else {
        return;
    };
    running.wait_all("looping", random_settle());
    running.signal(victim, "STOP");
    let mut running = running.wait_others(victim, "shrunk", Duration::from_secs(60));
    running.signal(victim, "CONT");
    let outputs = running.finish();
    report(&outputs, wire, size);
    for o in &outputs {
        assert!(o.finished(), "rank {} did not finish:\n{o}", o.rank);
        if o.rank == victim {
            for what in ["VICTIM_ERROR", "VICTIM_AGAIN", "VICTIM_SHRINK"] {
                println!("stopped rank {victim}: {what}: {}", o.lines(what).join(""));
            }
            let said = o.lines("VICTIM_SHRINK").join("\n");
            assert!(said.contains("left out"), "{o}");
        } else {
            assert_eq!(o.lines("SURVIVED").len(), 1, "rank {}:\n{o}", o.rank);
        }
    }
}

/// Without shrinking: the survivors call `rejoin` on the failed group itself, and the
/// restarted victim's plain init completes the full group.
fn kill_rejoin(name: &str, wire: &str, size: usize, victim: usize) {
    let launch = testing::recovery_launch(size, 1, wire);
    let all: Vec<usize> = (0..size).collect();
    testing::kill_and_rejoin(&launch, name, victim, "failed", |restarted| {
        let g = nuvec_distributed_engine::init(true).expect("the group forms");
        if !restarted {
            g.barrier().unwrap();
            testing::until_failure(|| sum_of(&g, 16));
            let full = g.rejoin().unwrap_or_else(|e| panic!("rejoin: {e}"));
            assert_eq!((full.rank(), full.size()), (this_rank(), size));
            verified_sums(&full, &all, ROUNDS, || {});
        } else {
            verified_sums(&g, &all, ROUNDS, || {});
        }
        println!("REJOINED");
    });
}

test_cases!(kill_rejoin {
    mlx_rejoin_without_shrinking_p3: "mlx", 3, 0;
    native_rejoin_without_shrinking_p4: "native", 4, 2;
});

test_cases!(keyed_kill_shrink_rejoin {
    keyed_mlx_p4: "mlx", 4, 1;
    keyed_native_p4: "native", 4, 3;
});

test_cases!(stop_shrink {
    mlx_stopped_rank_is_left_out_p3: "mlx", 3, 2;
    native_stopped_rank_is_left_out_p4: "native", 4, 1;
    /// The stopped rank is the one every survivor would have asked to coordinate.
    mlx_stopped_rank_0_is_left_out_p4: "mlx", 4, 0;
});

/// A group of one shrinks and rejoins to itself; a group not formed from addresses cannot.
#[test]
fn groups_without_addresses() {
    let single = Group::single();
    assert_eq!(single.shrink().unwrap().size(), 1);
    assert_eq!(single.rejoin().unwrap().size(), 1);
}
