//! Recovery through nuvec's front end across real processes on loopback: ranks form with
//! `nuvec_distributed::init` and sum nuvec arrays on the default group; one rank is killed
//! (SIGKILL) at a random point; the survivors call `nuvec_distributed::shrink`, which makes
//! the survivors' group the default, and sum on it; the killed rank is started again with a
//! plain `init`, the survivors call `nuvec_distributed::rejoin`, and the full group is the
//! default again. Every sum is checked exactly (small integers in float32).

use std::time::Instant;

use nuvec_core::{Array, distributed};
use nuvec_tools::test_cases;
use nuvec_tools::testing::{self, mark};

/// Verified sums after the shrink, and again after the rejoin.
const ROUNDS: usize = 50;

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
    let launch = testing::recovery_launch(size, 1, wire);
    let all: Vec<usize> = (0..size).collect();
    let survivors: Vec<usize> = all.iter().copied().filter(|&r| r != victim).collect();
    let Some(outputs) = testing::kill_and_rejoin(&launch, name, victim, "shrunk", |restarted| {
        let group = nuvec_distributed::init(true).expect("the group forms");
        if restarted {
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
    for o in &outputs {
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
