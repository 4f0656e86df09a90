//! The event loop selection (`Options::io`): each driver, asked for by name, forms a ring
//! and computes, on both wires, with transfers large enough to come back short and block.
//! On io_uring, a receive waits in the kernel: a timeout, a close from another thread and a
//! peer that goes away must each end it. `tools/test.sh` also reruns the matrix, fault,
//! zero-allocation and interop tests with `NUVEC_DISTRIBUTED_IO=uring`.

use nuvec_distributed_engine::{Backend, Error, IO_VAR, Io, Options, init_with};
use nuvec_tools::testing;

/// Two ranks (threads) with `options`: a small and a 16 MiB all_sum, an all_gather and a
/// barrier, each checked.
fn two_ranks(options: &Options) {
    let nodes = testing::loopback_nodes(&testing::free_ports(2, 2));
    std::thread::scope(|s| {
        for rank in 0..2 {
            let (nodes, options) = (&nodes, options);
            s.spawn(move || {
                let group = init_with(nodes, rank, options)
                    .unwrap_or_else(|e| panic!("rank {rank}, {:?}: {e}", options.io));
                let mut small = [rank as u32 + 1];
                group.all_sum(&mut small).unwrap();
                assert_eq!(small, [3]);
                let n = 4 << 20;
                let mut big: Vec<u32> = (0..n).map(|i| i as u32 ^ rank as u32).collect();
                group.all_sum(&mut big).unwrap();
                for (i, &v) in big.iter().enumerate().step_by(4099) {
                    assert_eq!(v, (i as u32).wrapping_add(i as u32 ^ 1), "element {i}");
                }
                let mine = vec![rank as u8; 300_000];
                let mut all = vec![0u8; 600_000];
                group.all_gather(&mine, &mut all).unwrap();
                assert!(all[..300_000].iter().all(|&b| b == 0));
                assert!(all[300_000..].iter().all(|&b| b == 1));
                group.barrier().unwrap();
            });
        }
    });
}

#[test]
fn io_uring_asked_for_by_name_computes_on_the_mlx_wire() {
    two_ranks(&Options::default().io(Io::Uring));
}

#[test]
fn io_uring_asked_for_by_name_computes_on_the_native_wire() {
    // Without shared memory: two ranks on one host would otherwise not use the sockets.
    two_ranks(
        &Options::default()
            .io(Io::Uring)
            .backend(Backend::Native)
            .shared_memory(false),
    );
}

#[test]
fn epoll_asked_for_by_name_computes() {
    two_ranks(&Options::default().io(Io::Epoll));
}

/// Two ranks (threads) on which `io_uring_setup` fails with `EPERM`, as in a sandbox that
/// refuses io_uring: asked for by name, io_uring fails naming why; epoll still computes, and
/// so does Auto, which takes epoll.
#[cfg(target_os = "linux")]
#[test]
fn where_io_uring_is_refused_asking_for_it_fails_saying_why_and_epoll_computes() {
    let nodes = testing::loopback_nodes(&testing::free_ports(2, 1));
    // A rank that finished forming first fails at once and closes; the other may then wait
    // for it until the setup timeout: kept short.
    let refused = Options::default()
        .io(Io::Uring)
        .timeout(std::time::Duration::from_secs(3));
    let errors: Vec<String> = std::thread::scope(|s| {
        let ranks: Vec<_> = (0..2)
            .map(|rank| {
                let (nodes, refused) = (&nodes, &refused);
                s.spawn(move || {
                    ffi::uring::refuse_setup_on_this_thread()
                        .expect("seccomp filters (else the test cannot run)");
                    init_with(nodes, rank, refused)
                        .map(drop)
                        .expect_err("io_uring is refused on this thread")
                        .to_string()
                })
            })
            .collect();
        ranks.into_iter().map(|r| r.join().unwrap()).collect()
    });
    assert!(
        errors
            .iter()
            .any(|e| e.contains("io_uring") && e.contains("os error 1")),
        "a rank names io_uring and EPERM: {errors:?}"
    );
    let nodes = testing::loopback_nodes(&testing::free_ports(2, 1));
    std::thread::scope(|s| {
        for rank in 0..2 {
            let nodes = &nodes;
            s.spawn(move || {
                ffi::uring::refuse_setup_on_this_thread().expect("seccomp filters");
                let group = init_with(nodes, rank, &Options::default().io(Io::Epoll))
                    .unwrap_or_else(|e| panic!("rank {rank}: epoll needs no io_uring: {e}"));
                let mut x = [rank as u32 + 1];
                group.all_sum(&mut x).unwrap();
                assert_eq!(x, [3]);
            });
        }
    });
    // Auto takes epoll (io_uring was not measured faster) and computes without io_uring.
    // Unless the environment names io_uring, which Auto obeys: then forming fails as an
    // explicit Io::Uring does.
    let named = std::env::var(nuvec_distributed_engine::IO_VAR)
        .is_ok_and(|v| v.parse::<Io>() == Ok(Io::Uring));
    let nodes = testing::loopback_nodes(&testing::free_ports(2, 1));
    let auto = Options::default()
        .io(Io::Auto)
        .timeout(std::time::Duration::from_secs(3));
    std::thread::scope(|s| {
        for rank in 0..2 {
            let (nodes, auto) = (&nodes, &auto);
            s.spawn(move || {
                ffi::uring::refuse_setup_on_this_thread().expect("seccomp filters");
                match init_with(nodes, rank, auto) {
                    Ok(group) if !named => {
                        let mut x = [rank as u32 + 1];
                        group.all_sum(&mut x).unwrap();
                        assert_eq!(x, [3]);
                    }
                    Ok(_) => panic!("rank {rank}: the environment names io_uring, refused"),
                    // The other rank may fail first and close: only one names io_uring.
                    Err(_) if named => {}
                    Err(e) => panic!("rank {rank}: Auto needs no io_uring: {e}"),
                }
            });
        }
    });
}

/// Two ranks (threads) on io_uring over `wire` (its sockets: no shared memory) with
/// `timeout`: rank 0 runs `busy` with its group and a handle to it for another thread,
/// while rank 1 runs `idle` (it never joins rank 0's collective). Returns what `busy`
/// returned.
#[cfg(target_os = "linux")]
fn uring_busy_and_idle<T: Send>(
    wire: Backend,
    timeout: std::time::Duration,
    busy: impl FnOnce(nuvec_distributed_engine::Group) -> T + Send,
    idle: impl FnOnce(nuvec_distributed_engine::Group) + Send,
) -> T {
    let nodes = testing::loopback_nodes(&testing::free_ports(2, 1));
    let options = Options::default()
        .io(Io::Uring)
        .backend(wire)
        .shared_memory(false)
        .timeout(timeout);
    std::thread::scope(|s| {
        let (nodes, options) = (&nodes, &options);
        // Both ranks run a barrier first, so that what rank 0 then waits for is rank 1's
        // silence, not the ring's first steps.
        let peer = s.spawn(move || {
            let group = init_with(nodes, 1, options).expect("rank 1 forms");
            group.barrier().expect("rank 1's barrier");
            idle(group)
        });
        let group = init_with(nodes, 0, options).expect("rank 0 forms");
        group.barrier().expect("rank 0's barrier");
        let out = busy(group);
        peer.join().unwrap();
        out
    })
}

/// Two tests of each `check`: one on MLX's wire, one on the native wire (each with its
/// own doc).
macro_rules! on_both_wires {
    ($(
        $(#[$mlx_doc:meta])* $mlx:ident,
        $(#[$native_doc:meta])* $native:ident => $check:ident;
    )*) => {
        $(
            $(#[$mlx_doc])*
            #[cfg(target_os = "linux")]
            #[test]
            fn $mlx() {
                $check(Backend::Ring);
            }

            $(#[$native_doc])*
            #[cfg(target_os = "linux")]
            #[test]
            fn $native() {
                $check(Backend::Native);
            }
        )*
    };
}

on_both_wires! {
    /// A receive waits in the kernel for a peer that never sends: the collective fails at
    /// its timeout naming that peer (its receive cancelled and reaped first).
    io_uring_a_timeout_with_a_receive_in_flight_names_the_silent_peer,
    /// As above, on the native wire: its round's message out and receive step together.
    io_uring_a_timeout_with_a_receive_in_flight_names_the_silent_peer_native
        => a_timeout_with_a_receive_in_flight_names_the_silent_peer;
    /// A close from another thread ends a collective whose receive waits in the kernel, at
    /// once, as `Aborted` (or `GroupClosed` if it came between calls).
    io_uring_a_close_from_another_thread_ends_a_receive_in_flight,
    /// As above, on the native wire.
    io_uring_a_close_from_another_thread_ends_a_receive_in_flight_native
        => a_close_from_another_thread_ends_a_receive_in_flight;
    /// A peer that goes away (its sockets closed, as a process that dies has them closed)
    /// while a receive from it waits in the kernel: the collective fails at once naming it.
    io_uring_a_peer_that_goes_away_ends_a_receive_in_flight,
    /// As above, on the native wire.
    io_uring_a_peer_that_goes_away_ends_a_receive_in_flight_native
        => a_peer_that_goes_away_ends_a_receive_in_flight;
}

#[cfg(target_os = "linux")]
fn a_timeout_with_a_receive_in_flight_names_the_silent_peer(wire: Backend) {
    use std::time::Duration;
    let (error, took) = uring_busy_and_idle(
        wire,
        Duration::from_millis(400),
        |group| testing::timed(|| group.all_sum(&mut [1u32]).expect_err("rank 1 never joins")),
        |group| {
            std::thread::sleep(Duration::from_millis(1500));
            drop(group);
        },
    );
    assert_eq!(error.peer(), Some(1), "{error}");
    assert!(took >= Duration::from_millis(400), "{took:?}: {error}");
    assert!(took < Duration::from_millis(1400), "{took:?}: {error}");
}

#[cfg(target_os = "linux")]
fn a_close_from_another_thread_ends_a_receive_in_flight(wire: Backend) {
    use std::time::{Duration, Instant};
    let (error, took) = uring_busy_and_idle(
        wire,
        Duration::from_secs(20),
        |group| {
            let closer = {
                let group = group.clone();
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(200));
                    let at = Instant::now();
                    group.close().unwrap();
                    at
                })
            };
            // One element: one lane (MLX wire), or one round (native wire), whose steps
            // each wait in the kernel (larger arrays split into lanes both ways round the
            // ring, which take the other path).
            let mut x = [1u32];
            let error = group.all_sum(&mut x).expect_err("closed while waiting");
            let ended = Instant::now();
            let closed_at = closer.join().unwrap();
            (error, ended.saturating_duration_since(closed_at))
        },
        |group| {
            std::thread::sleep(Duration::from_millis(1000));
            drop(group);
        },
    );
    assert!(
        matches!(
            error,
            nuvec_distributed_engine::Error::Aborted { .. }
                | nuvec_distributed_engine::Error::GroupClosed
        ),
        "{error}"
    );
    assert!(
        took < Duration::from_millis(500),
        "{took:?} after close(): {error}"
    );
}

#[cfg(target_os = "linux")]
fn a_peer_that_goes_away_ends_a_receive_in_flight(wire: Backend) {
    use std::time::Duration;
    let (error, took) = uring_busy_and_idle(
        wire,
        Duration::from_secs(20),
        |group| testing::timed(|| group.all_sum(&mut [1.0f32]).expect_err("rank 1 leaves")),
        |group| {
            std::thread::sleep(Duration::from_millis(200));
            group.close().unwrap();
        },
    );
    assert_eq!(error.peer(), Some(1), "{error}");
    assert!(took < Duration::from_secs(5), "{took:?}: {error}");
}

/// On io_uring, ranks of the native wire whose calls differ fail within a second, and the
/// group is failed after: the stepped receive checks the peer's header as the other path
/// does, also where one rank's message is too large to step (it goes out in place) and
/// where the ranks take different algorithms. The ranks that compare calls with the last
/// one fail with [`Error::Mismatch`](nuvec_distributed_engine::Error::Mismatch) naming both
/// calls: at P = 2 the other rank, at P = 3 (recursive doubling, where rank 0 hands its
/// vector to rank 1) rank 1; rank 0 fails there naming a peer or both calls. Two and three
/// ranks, after 100 good all_sums.
#[cfg(target_os = "linux")]
#[test]
fn io_uring_native_ranks_whose_calls_differ_fail_with_a_mismatch() {
    use nuvec_distributed_engine::Error;
    use std::sync::Barrier;
    use std::time::{Duration, Instant};
    // Elements every rank but the last sums, elements the last one sums, both calls.
    let cases = [
        (10, 20, ("all_sum float32 x 10", "all_sum float32 x 20")),
        (
            4,
            200_000,
            ("all_sum float32 x 4", "all_sum float32 x 200000"),
        ),
        (
            4,
            1 << 20,
            ("all_sum float32 x 4", "all_sum float32 x 1048576"),
        ),
    ];
    let options = Options::default()
        .io(Io::Uring)
        .backend(Backend::Native)
        .shared_memory(false)
        .timeout(Duration::from_secs(20));
    for size in [2, 3] {
        for &(normal, odd, names) in &cases {
            // A mismatch fails the group: each case forms its own.
            let ports = testing::free_ports(size, 1);
            let nodes: Vec<Vec<String>> = ports
                .iter()
                .map(|r| r.iter().map(|p| format!("127.0.0.1:{p}")).collect())
                .collect();
            let start = Barrier::new(size);
            std::thread::scope(|s| {
                let handles: Vec<_> = (0..size)
                    .map(|rank| {
                        let (nodes, options, start) = (&nodes, &options, &start);
                        s.spawn(move || {
                            let group = init_with(nodes, rank, options)
                                .unwrap_or_else(|e| panic!("rank {rank} of {size}: {e}"));
                            for _ in 0..100 {
                                let mut x = [1.0f32];
                                group.all_sum(&mut x).expect("a good all_sum");
                                assert_eq!(x, [size as f32]);
                            }
                            start.wait();
                            let began = Instant::now();
                            let n = if rank == size - 1 { odd } else { normal };
                            let e = group
                                .all_sum(&mut vec![0.0f32; n])
                                .expect_err("a mismatched all_sum");
                            let took = began.elapsed();
                            let later = group.barrier().expect_err("a failed group");
                            (e, took, later)
                        })
                    })
                    .collect();
                for (rank, h) in handles.into_iter().enumerate() {
                    let (e, took, later) = h.join().unwrap();
                    let msg = e.to_string();
                    let names_both = msg.contains(names.0) && msg.contains(names.1);
                    if rank + 2 < size {
                        assert!(
                            e.peer().is_some() || names_both,
                            "rank {rank} of {size}: {msg}"
                        );
                    } else {
                        assert!(
                            matches!(e, Error::Mismatch { .. }),
                            "rank {rank} of {size}: {msg}"
                        );
                        assert!(names_both, "rank {rank} of {size}: {msg}");
                    }
                    assert!(
                        took < Duration::from_secs(1),
                        "rank {rank}: {took:?}: {msg}"
                    );
                    assert!(matches!(later, Error::Failed(_)), "rank {rank}: {later}");
                }
            });
        }
    }
}

/// An event loop variable that names none fails `init_with` (whose [`Io::Auto`] reads it) and
/// `init`, on both wires, naming the variable and its values, before any connection: the
/// peer never starts, so a check made only once the group had formed would instead wait out
/// the timeout and name the peer.
#[test]
fn an_event_loop_variable_naming_none_fails_before_any_connection() {
    let name = "an_event_loop_variable_naming_none_fails_before_any_connection";
    let Some(outputs) = testing::Launch::new(2, 1)
        .env(IO_VAR, "bogus")
        .skip(1)
        .timeout(5.0)
        .run_raw(name, || {
            let nodes = testing::hostfile_nodes();
            let check = |e: Error, what: &str| {
                let text = e.to_string();
                assert!(
                    matches!(e, Error::Environment { var, .. } if var == IO_VAR),
                    "{what}: {text}"
                );
                for value in ["bogus", "auto", "epoll", "uring"] {
                    assert!(text.contains(value), "{what}: {text}");
                }
            };
            for wire in [Backend::Ring, Backend::Native] {
                let options = Options::default().backend(wire);
                check(init_with(&nodes, 0, &options).unwrap_err(), wire.name());
            }
            check(nuvec_distributed_engine::init(true).unwrap_err(), "init");
        })
    else {
        return;
    };
    testing::assert_all_finished(&outputs);
}
