//! The event loop selection (`Options::io`): each driver, asked for by name, forms a ring
//! and computes, on both wires, with transfers large enough to come back short and block.
//! `tools/test.sh` also reruns the matrix, fault, zero-allocation and interop tests with
//! `NUVEC_DISTRIBUTED_IO=uring`.

use nuvec_distributed::{Io, Options, Wire, init_with};
use nuvec_tools::testing;

/// Two ranks (threads) with `options`: a small and a 16 MiB all_sum, an all_gather and a
/// barrier, each checked.
fn two_ranks(options: &Options) {
    let ports = testing::free_ports(2, 2);
    let nodes: Vec<Vec<String>> = ports
        .iter()
        .map(|r| r.iter().map(|p| format!("127.0.0.1:{p}")).collect())
        .collect();
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
    two_ranks(&Options::default().io(Io::Uring).wire(Wire::Native));
}

#[test]
fn epoll_asked_for_by_name_computes() {
    two_ranks(&Options::default().io(Io::Epoll));
}

/// Two ranks (threads) on which `io_uring_setup` fails with `EPERM`, as in a sandbox that
/// refuses io_uring: asked for by name, io_uring fails naming why; epoll still computes.
#[cfg(target_os = "linux")]
#[test]
fn where_io_uring_is_refused_asking_for_it_fails_saying_why_and_epoll_computes() {
    let ports = testing::free_ports(2, 1);
    let nodes: Vec<Vec<String>> = ports
        .iter()
        .map(|r| r.iter().map(|p| format!("127.0.0.1:{p}")).collect())
        .collect();
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
    let ports = testing::free_ports(2, 1);
    let nodes: Vec<Vec<String>> = ports
        .iter()
        .map(|r| r.iter().map(|p| format!("127.0.0.1:{p}")).collect())
        .collect();
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
}
