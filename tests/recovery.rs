//! Recovery through nuvec's front end across real processes on loopback: ranks form with
//! `nuvec_distributed::init` and sum nuvec arrays on the default group; one rank is killed
//! (SIGKILL) at a random point; the survivors call `nuvec_distributed::shrink`, which makes
//! the survivors' group the default, and sum on it; the killed rank is started again with a
//! plain `init`, the survivors call `nuvec_distributed::rejoin`, and the full group is the
//! default again. Every sum is checked exactly (small integers in float32).

use std::time::{Duration, Instant};

use nuvec_core::{Array, distributed};
use nuvec_tools::test_cases;
use nuvec_tools::testing::{Launch, mark, random_settle};

/// The groups' timeout.
const TIMEOUT_S: f64 = 3.0;
/// Verified sums after the shrink, and again after the rejoin.
const ROUNDS: usize = 50;
/// Set in the restarted rank.
const RESTARTED_VAR: &str = "NUVEC_FRONT_RECOVERY_RESTARTED";

/// What first rank `first` adds at round `round`, element `j`.
fn value(first: usize, round: usize, j: usize) -> f32 {
    ((first + 1) * (1 + (round + j) % 5)) as f32
}

/// Runs `rounds` sums of nuvec arrays on the default group, whose ranks are the first ranks
/// `firsts` in order, checking every element.
fn verified_sums(firsts: &[usize], rounds: usize) {
    let group = distributed::default_group();
    assert_eq!(group.size(), firsts.len(), "the default group's size");
    let me = firsts[group.rank()];
    for round in 0..rounds {
        let mine: Vec<f32> = (0..8).map(|j| value(me, round, j)).collect();
        let x = Array::from_slice(&mine, [8]);
        let total = distributed::all_sum(&x, None)
            .to_vec::<f32>()
            .unwrap_or_else(|e| panic!("verified sum {round}: {e}"));
        for (j, v) in total.iter().enumerate() {
            let want: f32 = firsts.iter().map(|&f| value(f, round, j)).sum();
            assert_eq!(*v, want, "round {round}, element {j}");
        }
    }
}

fn kill_shrink_rejoin(name: &str, wire: &str, size: usize, victim: usize) {
    let launch = Launch::new(size, 1)
        .timeout(TIMEOUT_S)
        .deadline(Duration::from_secs(120))
        .env("NUVEC_DISTRIBUTED_WIRE", wire);
    let all: Vec<usize> = (0..size).collect();
    let survivors: Vec<usize> = all.iter().copied().filter(|&r| r != victim).collect();
    let Some(mut running) = launch.start_raw(name, || {
        let group = nuvec_distributed::init(true).expect("the group forms");
        if std::env::var_os(RESTARTED_VAR).is_some() {
            assert_eq!((group.rank(), group.size()), (victim, size));
            verified_sums(&all, ROUNDS);
            println!("REJOINED");
            return;
        }
        let x = Array::from_slice(&[1.0f32; 8], [8]);
        mark("looping");
        let error = loop {
            if let Err(e) = distributed::all_sum(&x, None).to_vec::<f32>() {
                break e;
            }
        };
        // A peer failure reaches nuvec as an I/O error naming the lost rank.
        assert!(
            matches!(error, nuvec_core::Error::Io(_)) && error.to_string().contains("all_sum"),
            "{error}"
        );
        let failed_at = Instant::now();
        let shrunk = nuvec_distributed::shrink().unwrap_or_else(|e| panic!("shrink: {e}"));
        assert_eq!(shrunk.size(), size - 1);
        verified_sums(&survivors, ROUNDS);
        println!("SHRINK_MS {}", failed_at.elapsed().as_millis());
        mark("shrunk");
        let full = nuvec_distributed::rejoin().unwrap_or_else(|e| panic!("rejoin: {e}"));
        assert_eq!(full.size(), size);
        verified_sums(&all, ROUNDS);
        println!("REJOINED");
    }) else {
        return;
    };
    running.strike(victim, "KILL", random_settle());
    for &r in &survivors {
        running.wait_for(r, "shrunk", Duration::from_secs(60));
    }
    running.restart(victim, &[(RESTARTED_VAR, "1")]);
    let outputs = running.finish();
    for o in &outputs {
        assert!(o.finished(), "rank {} did not finish:\n{o}", o.rank);
        assert_eq!(o.lines("REJOINED").len(), 1, "rank {}:\n{o}", o.rank);
        for line in o.lines("SHRINK_MS ") {
            println!(
                "{wire} P={size} rank {}: shrink to verified sums {line} ms",
                o.rank
            );
        }
    }
}

test_cases!(kill_shrink_rejoin {
    native_p3: "native", 3, 1;
    mlx_p4: "mlx", 4, 2;
});

/// Without a default group of this crate's, shrink and rejoin say so and name the call.
#[test]
fn shrink_without_a_default_group_of_this_crate_is_refused() {
    let e = nuvec_distributed::shrink().unwrap_err();
    assert!(
        matches!(e, nuvec_core::Error::InvalidArgument(_))
            && e.to_string().contains("distributed shrink")
            && e.to_string().contains("init_with"),
        "{e}"
    );
    let e = nuvec_distributed::rejoin().unwrap_err();
    assert!(e.to_string().contains("distributed rejoin"), "{e}");
}
