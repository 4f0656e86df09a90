//! Every collective over real RDMA, on Macs with Thunderbolt 5, launched by MLX's launcher:
//! the test that would turn JACCL from "tested on an emulated fabric" into "verified".
//! Nobody has run it yet.
//!
//! Set up the Macs as for MLX (macOS 26.2 or later, `rdma_ctl enable` from recoveryOS, an
//! IPv4 address on each Thunderbolt interface; `mlx.distributed_config --backend jaccl
//! --hosts ...` writes the hostfile and the network set-up), build the test binary on each
//! Mac at the same path, and launch it on every rank:
//!
//! ```text
//! cargo test --release --features jaccl --test jaccl_hardware --no-run   # note the binary
//! mlx.launch --backend jaccl --hostfile hosts.json -- \
//!     target/release/deps/jaccl_hardware-<hash> --ignored --nocapture --test-threads=1
//! ```
//!
//! `--backend jaccl-ring` runs the same checks on the ring (send/recv then between neighbours
//! only). Each rank prints `JACCL-HARDWARE-OK` with its timings when every check passed.
//!
//! Interop with MLX is the next step: replace some ranks' command with a Python script that
//! runs the same collectives with `mx.distributed` in the same order (the values are a
//! simple function of rank and index, below). In jaccl-ring mode with MLX ranks, all_gather
//! returns `Error::Unsupported` on the nuvec ranks (MLX 0.32.1's ring all_gather is
//! defective; see the `jaccl` module docs) unless `NUVEC_JACCL_MLX_ALL_GATHER=fixed` says the
//! MLX ranks run a release with MLX PR #4443, which is the case to check on hardware. The
//! rules reported for Apple's driver, which this crate follows where MLX's calls differ (the
//! first active port, queues counted in frames, teardown order), are checked on hardware by
//! this test only.

#![cfg(feature = "jaccl")]

use std::time::Instant;

use nuvec_distributed_engine::{Backend, Group, init_backend};

fn value(rank: usize, i: usize) -> f32 {
    ((rank * 7 + i * 3) % 23) as f32 - 11.0
}

fn expect_sum(size: usize, i: usize) -> f32 {
    (0..size).map(|r| value(r, i)).sum()
}

fn check_all_sum(g: &Group, n: usize) {
    let (rank, size) = (g.rank(), g.size());
    let mut v: Vec<f32> = (0..n).map(|i| value(rank, i)).collect();
    let start = Instant::now();
    g.all_sum(&mut v).expect("all_sum");
    let took = start.elapsed();
    for (i, x) in v.iter().enumerate() {
        assert_eq!(*x, expect_sum(size, i), "all_sum of {n}: element {i}");
    }
    println!("rank {rank}: all_sum of {n} f32 in {took:?}");
}

#[test]
#[ignore = "requires Thunderbolt 5 RDMA"]
fn every_collective_over_thunderbolt() {
    let g = init_backend(true, Backend::Jaccl).expect("a JACCL group (launch with mlx.launch)");
    let (rank, size) = (g.rank(), g.size());
    assert_eq!(g.backend(), "jaccl");
    g.barrier().expect("barrier");
    // Sizes across every buffer class and the thresholds between algorithms.
    for n in [1, 3, 1000, 8192, 8193, 50_000, 300_000, 1 << 20, 4 << 20] {
        check_all_sum(&g, n);
    }
    for n in [5usize, 100_000] {
        let mut max: Vec<i32> = (0..n).map(|i| (rank * 31 + i) as i32 % 97).collect();
        g.all_max(&mut max).expect("all_max");
        let mut min = max.clone();
        g.all_min(&mut min).expect("all_min");
        for (i, got) in max.iter().enumerate() {
            let want = (0..size).map(|r| (r * 31 + i) as i32 % 97).max();
            assert_eq!(Some(*got), want, "all_max element {i}");
        }
        assert!(
            min.iter().zip(&max).all(|(a, b)| a == b),
            "min of the maxima"
        );
    }
    for n in [1usize, 4096, 70_001] {
        let mine: Vec<u8> = (0..n).map(|i| (rank * 13 + i) as u8).collect();
        let mut out = vec![0u8; n * size];
        g.all_gather(&mine, &mut out).expect("all_gather");
        for r in 0..size {
            for i in 0..n {
                assert_eq!(
                    out[r * n + i],
                    (r * 13 + i) as u8,
                    "all_gather block {r} byte {i}"
                );
            }
        }
    }
    for c in [1usize, 10_000, 200_000] {
        let input: Vec<f32> = (0..c * size).map(|i| value(rank, i)).collect();
        let mut out = vec![0.0f32; c];
        g.sum_scatter(&input, &mut out).expect("sum_scatter");
        for (i, x) in out.iter().enumerate() {
            assert_eq!(
                *x,
                expect_sum(size, rank * c + i),
                "sum_scatter element {i}"
            );
        }
    }
    // Send/recv around the ring (neighbours, so this works on both topologies).
    let right = (rank + 1) % size;
    let left = (rank + size - 1) % size;
    for n in [1usize, 5000, 1 << 20] {
        let data: Vec<u8> = (0..n).map(|i| (rank + i) as u8).collect();
        let mut got = vec![0u8; n];
        if rank % 2 == 0 {
            g.send(&data, right).expect("send");
            g.recv(&mut got, left).expect("recv");
        } else {
            g.recv(&mut got, left).expect("recv");
            g.send(&data, right).expect("send");
        }
        assert!(
            got.iter().enumerate().all(|(i, &b)| b == (left + i) as u8),
            "recv of {n} bytes from rank {left}"
        );
    }
    g.barrier().expect("barrier");
    g.health().expect("health");
    println!("rank {rank}: JACCL-HARDWARE-OK");
}
