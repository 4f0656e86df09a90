//! Nonblocking collectives (`Group::scope`) across real processes on loopback, on both
//! wires: many operations outstanding and waited in another order than started, handles
//! dropped or forgotten, a panic inside a scope, blocking calls mixed in, close and a killed
//! peer with operations outstanding, and no allocation per operation once warm.
//!
//! The allocation count is process-wide (`CountingAllocator::process_allocations`), because
//! the operations run on the group's loop thread, not on the thread that starts them.

use std::time::{Duration, Instant};

use ffi::alloc::CountingAllocator;
use nuvec_distributed_engine::{Error, Group, Pending, Result, f16};
use nuvec_tools::testing::{self, Launch, mark, report_failure};

/// Two tests that run `body` on every rank of a group of 3: `mlx` on MLX's wire (the
/// default), `native` on the native wire.
macro_rules! on_both_wires {
    ($mlx:ident, $native:ident => $body:ident) => {
        #[test]
        fn $mlx() {
            Launch::new(3, 1).all_ok(stringify!($mlx), $body);
        }

        #[test]
        fn $native() {
            Launch::new(3, 1)
                .env("NUVEC_DISTRIBUTED_WIRE", "native")
                .all_ok(stringify!($native), $body);
        }
    };
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// Buffers for one round of every kind of operation, with the results every rank expects.
struct Round {
    sums: Vec<f32>,
    maxes: Vec<i32>,
    mins: Vec<f16>,
    gather_in: Vec<u32>,
    gathered: Vec<u32>,
    scatter_in: Vec<f64>,
    scattered: Vec<f64>,
    message: Vec<u64>,
    received: Vec<u64>,
}

impl Round {
    fn new(g: &Group, round: usize, elems: usize) -> Round {
        let (rank, size) = (g.rank(), g.size());
        Round {
            sums: vec![(rank + round) as f32; elems],
            maxes: vec![(rank * 10 + round) as i32; elems],
            mins: vec![f16::from_f32((rank + round) as f32); elems],
            gather_in: vec![(rank * 1000 + round) as u32; elems],
            gathered: vec![0; elems * size],
            scatter_in: (0..elems * size).map(|i| (i + round) as f64).collect(),
            scattered: vec![0.0; elems],
            message: vec![(rank * 1_000_000 + round) as u64; elems],
            received: vec![0; elems],
        }
    }

    /// Starts every operation of the round on `s`: seven operations (send and recv ordered
    /// so that a ring of any size cannot wait on itself).
    fn start<'scope>(
        &'scope mut self,
        g: &Group,
        s: &nuvec_distributed_engine::Scope<'scope, '_>,
    ) -> Result<Vec<Pending<'scope>>> {
        let (rank, size) = (g.rank(), g.size());
        let (left, right) = ((rank + size - 1) % size, (rank + 1) % size);
        let mut started = vec![
            s.start_all_sum(&mut self.sums)?,
            s.start_all_max(&mut self.maxes)?,
            s.start_all_min(&mut self.mins)?,
            s.start_all_gather(&self.gather_in, &mut self.gathered)?,
            s.start_sum_scatter(&self.scatter_in, &mut self.scattered)?,
        ];
        if rank.is_multiple_of(2) {
            started.push(s.start_send(&self.message, right)?);
            started.push(s.start_recv(&mut self.received, left)?);
        } else {
            started.push(s.start_recv(&mut self.received, left)?);
            started.push(s.start_send(&self.message, right)?);
        }
        started.push(s.start_barrier()?);
        Ok(started)
    }

    /// Checks every result of round `round`.
    fn check(&self, g: &Group, round: usize) {
        let (rank, size) = (g.rank(), g.size());
        let left = (rank + size - 1) % size;
        let sum: usize = (0..size).map(|r| r + round).sum();
        assert!(
            self.sums.iter().all(|&v| v == sum as f32),
            "round {round}: all_sum"
        );
        let max = ((size - 1) * 10 + round) as i32;
        assert!(
            self.maxes.iter().all(|&v| v == max),
            "round {round}: all_max"
        );
        assert!(
            self.mins.iter().all(|&v| v == f16::from_f32(round as f32)),
            "round {round}: all_min"
        );
        let elems = self.sums.len();
        for (r, block) in self.gathered.chunks(elems).enumerate() {
            assert!(
                block.iter().all(|&v| v == (r * 1000 + round) as u32),
                "round {round}: all_gather block {r}"
            );
        }
        for (i, &v) in self.scattered.iter().enumerate() {
            let expect = ((rank * elems + i + round) * size) as f64;
            assert_eq!(v, expect, "round {round}: sum_scatter element {i}");
        }
        assert!(
            self.received
                .iter()
                .all(|&v| v == (left * 1_000_000 + round) as u64),
            "round {round}: recv from {left}"
        );
    }
}

/// Twelve rounds of every operation outstanding at once (96 operations), waited in reverse
/// order, then every result checked.
fn many_outstanding(g: Group) {
    let rounds = 12;
    for elems in [3, 70_000] {
        let mut all: Vec<Round> = (0..rounds).map(|r| Round::new(&g, r, elems)).collect();
        g.scope(|s| {
            let mut pending = Vec::new();
            for round in all.iter_mut() {
                pending.extend(round.start(&g, s)?);
            }
            assert!(pending.len() >= 8 * rounds);
            while let Some(p) = pending.pop() {
                p.wait()?;
            }
            Ok::<_, Error>(())
        })
        .unwrap();
        for (r, round) in all.iter().enumerate() {
            round.check(&g, r);
        }
    }
}

on_both_wires! {
    many_outstanding_operations_waited_in_reverse_order,
    many_outstanding_operations_on_the_native_wire => many_outstanding
}

/// Broadcasts from every root and all_to_all, outstanding together and waited in reverse.
fn broadcast_and_all_to_all(g: Group) {
    let (rank, size) = (g.rank(), g.size());
    for elems in [5, 40_000] {
        let mut casts: Vec<Vec<i64>> = (0..size).map(|_| vec![rank as i64; elems]).collect();
        let input: Vec<u16> = (0..elems * size)
            .map(|i| (rank * 7 + i / elems) as u16)
            .collect();
        let mut output = vec![0u16; elems * size];
        g.scope(|s| {
            let mut pending = Vec::new();
            for (root, buf) in casts.iter_mut().enumerate() {
                pending.push(s.start_broadcast(buf, root)?);
            }
            pending.push(s.start_all_to_all(&input, &mut output)?);
            while let Some(p) = pending.pop() {
                p.wait()?;
            }
            Ok::<_, Error>(())
        })
        .unwrap();
        for (root, buf) in casts.iter().enumerate() {
            assert!(
                buf.iter().all(|&v| v == root as i64),
                "broadcast from {root}"
            );
        }
        for (from, block) in output.chunks(elems).enumerate() {
            assert!(
                block.iter().all(|&v| v == (from * 7 + rank) as u16),
                "all_to_all block from {from}"
            );
        }
    }
}

on_both_wires! {
    broadcast_and_all_to_all_outstanding_together,
    broadcast_and_all_to_all_outstanding_together_native => broadcast_and_all_to_all
}

/// Handles dropped and forgotten unwaited, and a scope whose closure panics: the scope
/// still returns only after every operation finished, so the buffers hold the results.
#[test]
fn the_scope_waits_for_dropped_forgotten_and_panicked_operations() {
    Launch::new(2, 1).all_ok(
        "the_scope_waits_for_dropped_forgotten_and_panicked_operations",
        |g| {
            let elems = 1 << 20;
            let mut bufs: Vec<Vec<f32>> = (0..6).map(|_| vec![1.0; elems]).collect();
            g.scope(|s| {
                for (i, buf) in bufs.iter_mut().enumerate() {
                    let p = s.start_all_sum(buf).unwrap();
                    if i % 2 == 0 {
                        std::mem::forget(p);
                    } else {
                        drop(p);
                    }
                }
            });
            for buf in &bufs {
                assert!(buf.iter().all(|&v| v == 2.0), "an unwaited all_sum");
            }

            let mut buf = vec![1.0f32; elems];
            let mut last = [0u8; 1];
            let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                g.scope(|s| {
                    let _sum = s.start_all_sum(&mut buf).unwrap();
                    let _barrier = s.start_barrier().unwrap();
                    let _last = s.start_all_max(&mut last).unwrap();
                    panic!("a panic with operations outstanding");
                })
            }));
            assert!(caught.is_err());
            assert!(
                buf.iter().all(|&v| v == 2.0),
                "the all_sum before the panic"
            );
            // The group is in step: the next call pairs with the other rank's.
            let mut x = [g.rank() as u32 + 1];
            g.all_sum(&mut x).unwrap();
            assert_eq!(x, [3]);
        },
    );
}

/// A blocking call waits for the outstanding nonblocking operations first, then runs; the
/// results show the order on the wire was the issue order.
fn mixing(g: Group) {
    let elems = 2 << 20;
    let mut big = vec![1.0f32; elems];
    let mut after = [g.rank() as u32; 4];
    g.scope(|s| {
        let first = s.start_all_sum(&mut big)?;
        // Blocking, issued while `first` is outstanding: it must go on the wire after it.
        let mut x = [g.rank() as i64 + 1];
        g.all_sum(&mut x)?;
        assert!(
            first.is_done(),
            "a blocking call ran before the nonblocking one"
        );
        assert!(first.test());
        assert_eq!(x[0], (1..=g.size() as i64).sum::<i64>());
        let second = s.start_all_max(&mut after[..])?;
        g.barrier()?;
        assert!(second.is_done());
        second.wait()?;
        first.wait()
    })
    .unwrap();
    assert!(big.iter().all(|&v| v == g.size() as f32));
    assert_eq!(after, [g.size() as u32 - 1; 4]);
    // Nonblocking again after blocking calls, then blocking after the scope.
    let mut y = vec![g.rank() as u16; 5];
    g.scope(|s| s.start_all_max(&mut y)?.wait()).unwrap();
    assert_eq!(y, vec![g.size() as u16 - 1; 5]);
    let mut z = [1u8];
    g.all_sum(&mut z).unwrap();
    assert_eq!(z[0] as usize, g.size());
}

on_both_wires! {
    blocking_calls_wait_for_outstanding_nonblocking_ones,
    blocking_calls_wait_for_outstanding_nonblocking_ones_native => mixing
}

/// Rank 0 starts ten operations that cannot finish (rank 1 has not started its own) and
/// closes the group: the one in flight is aborted, the queued ones fail as closed. Rank 1,
/// once it sees rank 0 gone, starts its ten: each fails, naming rank 0.
#[test]
fn close_with_operations_outstanding_fails_each_cleanly() {
    let launch = Launch::new(2, 1).timeout(5.0);
    launch.all_ok(
        "close_with_operations_outstanding_fails_each_cleanly",
        |g| {
            g.barrier().unwrap();
            let mut bufs: Vec<Vec<f32>> = (0..10).map(|_| vec![1.0; 1 << 16]).collect();
            if g.rank() == 1 {
                // Start only once rank 0 has closed, however late the machine lets it run.
                let until = Instant::now() + Duration::from_secs(20);
                while g.health().is_ok() {
                    assert!(Instant::now() < until, "rank 0 never closed");
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            let results: Vec<Result<()>> = g.scope(|s| {
                let pending: Vec<_> = bufs
                    .iter_mut()
                    .map(|b| s.start_all_sum(b).unwrap())
                    .collect();
                if g.rank() == 0 {
                    std::thread::sleep(Duration::from_millis(50));
                    g.close().unwrap();
                }
                pending.into_iter().map(Pending::wait).collect()
            });
            for (i, r) in results.iter().enumerate() {
                let e = r.as_ref().expect_err("nothing can complete");
                if g.rank() == 0 {
                    if i == 0 {
                        assert!(
                            matches!(e, Error::Aborted { .. } | Error::GroupClosed),
                            "op {i}: {e}"
                        );
                    } else {
                        assert!(matches!(e, Error::GroupClosed), "op {i}: {e}");
                    }
                } else {
                    assert_eq!(e.peer(), Some(0), "op {i} does not name rank 0: {e}");
                }
            }
            // The queue is usable after the failure: a later scope fails at once too.
            let mut x = [1.0f32];
            let late = g.scope(|s| s.start_all_sum(&mut x)?.wait());
            assert!(late.is_err());
        },
    );
}

/// A peer killed while operations are outstanding: every one of them fails on each
/// survivor, naming the killed rank, well within the timeout.
fn killed_peer(name: &str, wire: &str) {
    let victim = 2;
    let launch = Launch::new(3, 1)
        .timeout(10.0)
        .env("NUVEC_DISTRIBUTED_WIRE", wire);
    let Some(mut running) = launch.start(name, move |g| {
        g.barrier().unwrap();
        if g.rank() == victim {
            mark("queued");
            std::thread::sleep(Duration::from_secs(60));
            return;
        }
        let mut bufs: Vec<Vec<f32>> = (0..8).map(|_| vec![1.0; 1 << 16]).collect();
        let start = Instant::now();
        let results: Vec<Result<()>> = g.scope(|s| {
            let pending: Vec<_> = bufs
                .iter_mut()
                .map(|b| s.start_all_sum(b).unwrap())
                .collect();
            mark("queued");
            pending.into_iter().map(Pending::wait).collect()
        });
        let took = start.elapsed();
        for (i, r) in results.iter().enumerate() {
            let e = r.as_ref().expect_err("the victim took part in none");
            assert_eq!(
                e.peer(),
                Some(victim),
                "op {i} does not name the victim: {e}"
            );
            println!("OP {i} {e}");
        }
        report_failure(results[0].as_ref().unwrap_err(), took);
    }) else {
        return;
    };
    running.wait_all("queued", Duration::from_millis(100));
    running.signal(victim, "KILL");
    let outputs = running.finish();
    for o in outputs.iter().filter(|o| o.rank != victim) {
        let (ms, peer, message) = o.finished_failure();
        assert_eq!(peer, Some(victim), "rank {}: {message}", o.rank);
        assert!(ms < 9_000, "rank {} took {ms} ms: {message}", o.rank);
        assert_eq!(o.lines("OP ").len(), 8, "rank {}:\n{o}", o.rank);
    }
}

#[test]
fn a_killed_peer_fails_every_outstanding_operation_naming_it() {
    killed_peer(
        "a_killed_peer_fails_every_outstanding_operation_naming_it",
        "mlx",
    );
}

#[test]
fn a_killed_peer_fails_every_outstanding_operation_naming_it_native() {
    killed_peer(
        "a_killed_peer_fails_every_outstanding_operation_naming_it_native",
        "native",
    );
}

/// Once warm, a scope with every kind of operation allocates nothing, on any thread.
fn no_allocation(g: Group) {
    for elems in [3, 100_000] {
        let mut round = Round::new(&g, 0, elems);
        // Every operation with its handle in a fixed array: `Round::start`'s vector would
        // be the only allocation.
        let fixed = |round: &mut Round| {
            let (rank, size) = (g.rank(), g.size());
            let (left, right) = ((rank + size - 1) % size, (rank + 1) % size);
            g.scope(|s| {
                let a = s.start_all_sum(&mut round.sums).unwrap();
                let b = s.start_all_max(&mut round.maxes).unwrap();
                let c = s.start_all_min(&mut round.mins).unwrap();
                let d = s
                    .start_all_gather(&round.gather_in, &mut round.gathered)
                    .unwrap();
                let e = s
                    .start_sum_scatter(&round.scatter_in, &mut round.scattered)
                    .unwrap();
                let (f, h) = if rank.is_multiple_of(2) {
                    let f = s.start_send(&round.message, right).unwrap();
                    (f, s.start_recv(&mut round.received, left).unwrap())
                } else {
                    let h = s.start_recv(&mut round.received, left).unwrap();
                    (s.start_send(&round.message, right).unwrap(), h)
                };
                let i = s.start_barrier().unwrap();
                for p in [i, h, f, e, d, c, b, a] {
                    p.wait().unwrap();
                }
            });
        };
        fixed(&mut round);
        let before = CountingAllocator::process_allocations();
        for _ in 0..20 {
            fixed(&mut round);
        }
        let count = CountingAllocator::process_allocations() - before;
        assert_eq!(
            count,
            0,
            "rank {}: 20 scopes of 8 operations x{elems} allocated {count} times",
            g.rank()
        );
    }
}

on_both_wires! {
    nonblocking_operations_do_not_allocate_once_warm,
    nonblocking_operations_do_not_allocate_once_warm_native => no_allocation
}

/// Once its operations are done, the loop thread sleeps: the process uses no CPU.
#[cfg(target_os = "linux")]
#[test]
fn an_idle_loop_thread_uses_no_cpu() {
    Launch::new(2, 1).all_ok("an_idle_loop_thread_uses_no_cpu", |g| {
        let mut x = [1.0f32; 16];
        g.scope(|s| s.start_all_sum(&mut x)?.wait()).unwrap();
        assert_eq!(x, [2.0; 16]);
        let before = testing::cpu_ticks();
        std::thread::sleep(Duration::from_secs(1));
        let used = testing::cpu_ticks() - before;
        // A spinning thread would use ~100 ticks in that second; allow one of noise.
        assert!(used <= 1, "rank {}: {used} ticks while idle", g.rank());
        // The thread is still there and still serves.
        g.scope(|s| s.start_all_sum(&mut x)?.wait()).unwrap();
        assert_eq!(x, [4.0; 16]);
    });
}

/// The group of one: operations finish when started, arguments are checked, and no loop
/// thread is needed.
#[test]
fn a_group_of_one_finishes_at_once() {
    let g = Group::single();
    let mut x = [1.5f32, 2.0];
    let input = [7u16, 8];
    let mut out = [0u16; 2];
    let mut short = [0u16; 3];
    g.scope(|s| {
        let a = s.start_all_sum(&mut x)?;
        assert!(a.is_done());
        s.start_all_gather(&input, &mut out)?.wait()?;
        let e = s.start_all_gather(&input, &mut short).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        let e = s.start_send(&input, 1).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        s.start_barrier()?.wait()?;
        a.wait()
    })
    .unwrap();
    assert_eq!(x, [1.5, 2.0]);
    assert_eq!(out, [7, 8]);
}

/// `examples/overlap.rs` on two ranks, small: both orders give the right sums and product,
/// and rank 0 reports the time saved. (Cargo builds the examples before the tests of a full
/// `cargo test`.)
#[test]
fn the_overlap_example_runs_and_checks_its_results() {
    let outputs = testing::run_example(
        ("nuvec-distributed-engine", "overlap"),
        &[
            "--mib",
            "2",
            "--n",
            "96",
            "--rounds",
            "2",
            "--latency-calls",
            "20",
        ],
        2,
        "the_overlap_example_runs_and_checks_its_results",
    );
    let report = &outputs[0].stdout;
    assert!(
        report.contains("saved")
            && report.contains("one-element all_sum")
            && report.contains("results: ok"),
        "{report}"
    );
}

/// The same rounds on JACCL, two ranks of a mesh on the project's test verbs provider (its
/// real binding, ranks in separate processes): the loop thread drives any backend.
#[cfg(feature = "jaccl")]
#[test]
fn many_outstanding_operations_and_mixing_on_jaccl() {
    let name = "many_outstanding_operations_and_mixing_on_jaccl";
    let body = || {
        let g =
            nuvec_distributed_engine::init_backend(true, nuvec_distributed_engine::Backend::Jaccl)
                .expect("the JACCL mesh forms");
        assert_eq!(g.backend(), "jaccl");
        many_outstanding(g.clone());
        mixing(g);
    };
    if nuvec_tools::testing::is_rank(name) {
        nuvec_tools::testing::as_rank(name, body);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("devices.json");
    std::fs::write(&file, r#"[[null, "m0to1"], ["m1to0", null]]"#).unwrap();
    let port = nuvec_tools::testing::free_port_block(1).unwrap();
    let provider = nuvec_tools::testing::verbs_provider();
    let launch = Launch::new(2, 1)
        .env(ffi::verbs::LIBRARY_VAR, &provider.to_string_lossy())
        .env("NUVEC_VERBS_PROVIDER_DIR", &dir.path().to_string_lossy())
        .env("NUVEC_VERBS_PROVIDER_DEVICES", "m0to1,m1to0")
        .env("MLX_IBV_DEVICES", &file.to_string_lossy())
        .env("MLX_JACCL_COORDINATOR", &format!("127.0.0.1:{port}"));
    let outputs = launch.spawn(name).finish();
    nuvec_tools::testing::assert_all_finished(&outputs);
}
