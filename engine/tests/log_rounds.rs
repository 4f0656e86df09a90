//! The native wire over TCP past four ranks, across real processes on loopback: groups of
//! 12 and 16 ranks, where the table takes recursive doubling (4 B), halving-doubling
//! (64 KiB) and the ring (1 MiB) for all_sum, recursive doubling for the barrier and for
//! all_gathers up to a MiB of output, with ranks past the largest power of two handing in
//! and taking out.
//!
//! Each rank computes every rank's input itself, so it checks its own result: exactly, for
//! values every order of summation gives alike (small integers in f32), and bit for bit
//! against the balanced tree the log-round algorithms document, for floats with real
//! rounding. Every rank's result hash is then gathered, so the ranks check that they all
//! hold the same bits (the ring's included, whose chain order is its own).

use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nuvec_distributed_engine::{Group, Transport};
use nuvec_tools::testing::{self, Launch};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Rank `rank`'s `n` inputs for `case`: small integers (exact in any order) or floats with
/// real rounding (finite, both signs, exponents across a few decades).
fn input(case: u64, rank: usize, n: usize, exact: bool) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(case.wrapping_mul(1_000_003) ^ rank as u64);
    (0..n)
        .map(|_| {
            if exact {
                f32::from(rng.random_range(-64i16..64))
            } else {
                let m: f32 = rng.random_range(-1.0..1.0);
                m * 10f32.powi(rng.random_range(-3..4))
            }
        })
        .collect()
}

/// The tree recursive doubling and halving-doubling compute, of sums
/// ([`testing::doubling_tree`]).
fn tree(inputs: &[Vec<f32>]) -> Vec<f32> {
    testing::doubling_tree(inputs, |a, b| a.iter().zip(b).map(|(x, y)| x + y).collect())
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Checks that every rank holds `result`'s bits: gathers a hash of each rank's.
fn same_on_every_rank(g: &Group, what: &str, result: &[f32]) {
    let mut h = DefaultHasher::new();
    bits(result).hash(&mut h);
    let hashes = g
        .all_gather_vec(&[h.finish()])
        .unwrap_or_else(|e| panic!("rank {}: gathering the hashes: {e}", g.rank()));
    assert!(
        hashes.iter().all(|&x| x == hashes[0]),
        "rank {}: {what}: the ranks hold different bits: {hashes:x?}",
        g.rank()
    );
}

fn check(g: &Group) {
    let (rank, size) = (g.rank(), g.size());
    for (case, bytes) in [(1u64, 4usize), (2, 64 << 10), (3, 1 << 20)] {
        let n = bytes / 4;
        for exact in [true, false] {
            let case = case * 2 + u64::from(exact);
            let inputs: Vec<Vec<f32>> = (0..size).map(|r| input(case, r, n, exact)).collect();
            let mut data = inputs[rank].clone();
            g.all_sum(&mut data)
                .unwrap_or_else(|e| panic!("rank {rank}: all_sum of {bytes} bytes: {e}"));
            let what = format!("all_sum of {bytes} bytes (exact {exact}) at P = {size}");
            if exact {
                let want: Vec<f32> = (0..n).map(|i| inputs.iter().map(|x| x[i]).sum()).collect();
                assert!(
                    bits(&data) == bits(&want),
                    "rank {rank}: {what}: wrong sums"
                );
            } else if bytes < 1 << 20 {
                // The log-round algorithms' sizes: their documented tree, bit for bit.
                let want = tree(&inputs);
                let at = (0..n).find(|&i| data[i].to_bits() != want[i].to_bits());
                assert!(
                    at.is_none(),
                    "rank {rank}: {what}: element {at:?} is not the tree's: {:?} vs {:?}",
                    at.map(|i| data[i]),
                    at.map(|i| want[i])
                );
            }
            same_on_every_rank(g, &what, &data);
        }
    }
    // all_gather: by recursive doubling up to a MiB of output, directly past it.
    for (case, bytes) in [(10u64, 4usize), (11, 64 << 10), (12, 100 << 10)] {
        let block = |r: usize| -> Vec<u8> {
            let mut rng = StdRng::seed_from_u64(case.wrapping_mul(7919) ^ r as u64);
            (0..bytes).map(|_| rng.random()).collect()
        };
        let got = g
            .all_gather_vec(&block(rank))
            .unwrap_or_else(|e| panic!("rank {rank}: all_gather of {bytes} bytes: {e}"));
        let want: Vec<u8> = (0..size).flat_map(block).collect();
        assert!(
            got == want,
            "rank {rank}: all_gather of {bytes} bytes at P = {size}: wrong blocks"
        );
    }
    // The barrier: rank 0 enters late, and no rank may leave before it entered (one
    // machine, one wall clock).
    let now = || {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("a clock after 1970")
            .as_micros() as u64
    };
    for _ in 0..3 {
        g.barrier()
            .unwrap_or_else(|e| panic!("rank {rank}: barrier: {e}"));
        if rank == 0 {
            std::thread::sleep(Duration::from_millis(100));
        }
        let entered = now();
        g.barrier()
            .unwrap_or_else(|e| panic!("rank {rank}: barrier: {e}"));
        let left = now();
        let times = g
            .all_gather_vec(&[entered, left])
            .unwrap_or_else(|e| panic!("rank {rank}: gathering the times: {e}"));
        let last_entry = times.chunks(2).map(|t| t[0]).max().unwrap_or(0);
        for (r, t) in times.chunks(2).enumerate() {
            assert!(
                t[1] >= last_entry,
                "rank {r} left the barrier at {} µs, before the last rank entered it at {last_entry} µs",
                t[1]
            );
        }
    }
}

fn log_rounds(size: usize, name: &str) {
    Launch::new(size, 1)
        .env("NUVEC_DISTRIBUTED_WIRE", "native")
        // Every link on TCP: the ranks share this host, whose shared memory would carry
        // the collectives otherwise.
        .env("NUVEC_DISTRIBUTED_SHM", "0")
        .all_ok(name, |g| {
            assert_eq!(g.size(), size);
            assert_eq!(g.backend(), "native");
            let next = (g.rank() + 1) % size;
            assert_eq!(g.transport(next).expect("a peer's link"), Transport::Tcp);
            check(&g);
        });
}

#[test]
fn native_tcp_log_rounds_p12() {
    log_rounds(12, "native_tcp_log_rounds_p12");
}

#[test]
fn native_tcp_log_rounds_p16() {
    log_rounds(16, "native_tcp_log_rounds_p16");
}
