//! Keyed groups on the native wire seal every byte on their TCP connections in records
//! (engine/src/transport/tcp/seal.rs): all_sum, all_gather and send/recv give exact results
//! at sizes that fit one record (4 B), cross a record boundary (64 KiB + 1) and span many
//! (1 MiB), with two and three ranks, with shared memory off (every byte on TCP) and on
//! (data on shared memory, the TCP connections carrying the rest). io_uring asked for by
//! name with a key fails `init`, saying why.
//!
//! Tampering on the wire is tested in engine/src/native/relay_tests.rs, which needs a rank
//! to dial a relay instead of its neighbour.
//!
//! Each group is ranks on threads of this process, on loopback.

use std::time::Duration;

use nuvec_distributed_engine::{Backend, Group, Io, Options, init_with};
use nuvec_tools::testing;

/// A key long enough for `Options::key`.
const KEY: &str = "correct horse battery staple 2026";

/// Bytes of the arrays: one record, one record and a byte (64 KiB + 1, so header and data
/// cross a record boundary), and many records.
const SIZES: [usize; 3] = [4, (64 << 10) + 1, 1 << 20];

fn options(shared_memory: bool) -> Options {
    Options::default()
        .backend(Backend::Native)
        .timeout(Duration::from_secs(30))
        .key(KEY)
        .io(Io::Epoll)
        .shared_memory(shared_memory)
}

/// Forms a keyed native group of `size` on loopback and runs `body` on every rank, a thread
/// each; panics naming the rank when forming or the body fails.
fn keyed(size: usize, shared_memory: bool, body: impl Fn(&Group) + Sync) {
    let nodes = testing::loopback_nodes(&testing::free_ports(size, 1));
    std::thread::scope(|s| {
        for rank in 0..size {
            let (nodes, body) = (&nodes, &body);
            s.spawn(move || {
                let group = init_with(nodes, rank, &options(shared_memory))
                    .unwrap_or_else(|e| panic!("rank {rank} of {size}: forming: {e}"));
                body(&group);
            });
        }
    });
}

/// Element `i` of rank `rank`'s data for an array of `n` elements.
fn value(rank: usize, i: usize, n: usize) -> i32 {
    ((rank * 7919 + i * 31 + n) % 100_003) as i32 - 50_000
}

/// Byte `i` of rank `rank`'s data.
fn byte(rank: usize, i: usize) -> u8 {
    (rank * 131 + i * 7 + i / 251) as u8
}

fn collectives(size: usize, shared_memory: bool) {
    keyed(size, shared_memory, |g| {
        let (rank, size) = (g.rank(), g.size());
        for bytes in SIZES {
            // all_sum over i32: exact.
            let n = bytes.div_ceil(4);
            let mut data: Vec<i32> = (0..n).map(|i| value(rank, i, n)).collect();
            g.all_sum(&mut data)
                .unwrap_or_else(|e| panic!("rank {rank}: all_sum of {n} i32: {e}"));
            for (i, got) in data.iter().enumerate() {
                let want: i32 = (0..size).map(|r| value(r, i, n)).sum();
                assert_eq!(*got, want, "rank {rank}: all_sum of {n} i32, element {i}");
            }
            // all_gather of bytes.
            let mine: Vec<u8> = (0..bytes).map(|i| byte(rank, i)).collect();
            let mut all = vec![0u8; bytes * size];
            g.all_gather(&mine, &mut all)
                .unwrap_or_else(|e| panic!("rank {rank}: all_gather of {bytes} B: {e}"));
            for r in 0..size {
                let want: Vec<u8> = (0..bytes).map(|i| byte(r, i)).collect();
                assert!(
                    all[r * bytes..(r + 1) * bytes] == want[..],
                    "rank {rank}: all_gather of {bytes} B, rank {r}'s part differs"
                );
            }
            // send/recv around the ring.
            let to = (rank + 1) % size;
            let from = (rank + size - 1) % size;
            let mut got = vec![0u8; bytes];
            if rank % 2 == 0 {
                g.send(&mine, to)
                    .unwrap_or_else(|e| panic!("rank {rank}: send of {bytes} B: {e}"));
                g.recv(&mut got, from)
                    .unwrap_or_else(|e| panic!("rank {rank}: recv of {bytes} B: {e}"));
            } else {
                g.recv(&mut got, from)
                    .unwrap_or_else(|e| panic!("rank {rank}: recv of {bytes} B: {e}"));
                g.send(&mine, to)
                    .unwrap_or_else(|e| panic!("rank {rank}: send of {bytes} B: {e}"));
            }
            let want: Vec<u8> = (0..bytes).map(|i| byte(from, i)).collect();
            assert!(
                got == want,
                "rank {rank}: recv of {bytes} B from {from} differs"
            );
        }
        g.barrier()
            .unwrap_or_else(|e| panic!("rank {rank}: the last barrier: {e}"));
    });
}

#[test]
fn keyed_native_collectives_are_exact_p2() {
    collectives(2, false);
}

#[test]
fn keyed_native_collectives_are_exact_p3() {
    collectives(3, false);
}

#[test]
fn keyed_native_collectives_are_exact_on_shared_memory_p2() {
    collectives(2, true);
}

#[test]
#[cfg(target_os = "linux")]
fn io_uring_by_name_with_a_key_fails_init_saying_why() {
    let nodes = testing::loopback_nodes(&testing::free_ports(2, 1));
    let options = options(false).io(Io::Uring).timeout(Duration::from_secs(5));
    let started = std::time::Instant::now();
    let err = init_with(&nodes, 0, &options).expect_err("io_uring with a key formed a group");
    let text = err.to_string();
    assert!(
        text.contains("sealed groups run on epoll") && text.contains("io_uring"),
        "{text}"
    );
    // It fails before forming, not at the timeout.
    assert!(started.elapsed() < Duration::from_secs(4), "{text}");
}
