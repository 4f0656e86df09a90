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
