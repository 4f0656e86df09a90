//! Shared memory between native-wire ranks on one host, across real processes: the segment
//! is private (mode 0600) and gone from the file system once the group formed, also after
//! kill -9; a rank killed or stopped mid-collective is named within the timeout, for small
//! and large all_sums; a mismatched call still fails every rank naming both calls (a recv
//! against a group collective too); broadcast and all_to_all run on the segment; and
//! `NUVEC_DISTRIBUTED_SHM=0` keeps every link on TCP. (The results of every collective on
//! shared memory are checked by the native matrix of `tests/ring.rs`, which runs on it by
//! default.) Linux only: the tests find the segment through `/proc/self/maps`.
#![cfg(target_os = "linux")]

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use nuvec_distributed_engine::{Error, Group, Transport};
use nuvec_tools::test_cases;
use nuvec_tools::testing::{self, Launch, until_failure};

/// The shared-memory segment this process maps: its path as the kernel names it (with
/// " (deleted)" once unlinked) and the file's mode, read through `/proc/self/map_files`.
fn mapped_segment() -> Option<(String, u32)> {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
    let line = maps.lines().find(|l| l.contains("/dev/shm/nuvec-"))?;
    let range = line.split_whitespace().next().expect("an address range");
    let path = line[line.find("/dev/shm/").expect("the path")..].to_string();
    let meta = std::fs::metadata(Path::new("/proc/self/map_files").join(range))
        .unwrap_or_else(|e| panic!("the mapped file of {range}: {e}"));
    Some((path, meta.mode() & 0o7777))
}

/// In a rank, after a collective (rank 0 unlinks the segment before its `init` returns,
/// the others may return before that): prints the segment it maps (`SEGMENT <path>`),
/// after checking that it is private and already unlinked.
fn report_segment() {
    let (path, mode) = mapped_segment().expect("a native group on one host maps a segment");
    assert_eq!(mode, 0o600, "{path}");
    assert!(
        path.ends_with(" (deleted)"),
        "not unlinked after setup: {path}"
    );
    println!("SEGMENT {}", path.trim_end_matches(" (deleted)"));
}

fn native(size: usize) -> Launch {
    Launch::new(size, 1).env("NUVEC_DISTRIBUTED_WIRE", "native")
}

#[test]
fn the_segment_is_private_unlinked_and_used_for_every_collective() {
    let outputs = native(3).all_ok(
        "the_segment_is_private_unlinked_and_used_for_every_collective",
        |g| {
            g.barrier().unwrap();
            report_segment();
            let size = g.size();
            let mut x = vec![g.rank() as u32 + 1; 3 << 20];
            g.all_sum(&mut x).unwrap();
            assert!(x.iter().all(|&v| v == 6));
            let mut out = vec![0u16; size * 5000];
            g.all_gather(&vec![g.rank() as u16; 5000], &mut out)
                .unwrap();
            for (r, c) in out.chunks(5000).enumerate() {
                assert!(c.iter().all(|&v| v == r as u16));
            }
            let mut part = vec![0i64; 100_001];
            g.sum_scatter(&vec![2i64; size * 100_001], &mut part)
                .unwrap();
            assert!(part.iter().all(|&v| v == 2 * size as i64));
            // Past a chunk of the segment (1 MiB), from the last rank.
            let mut b = vec![0u8; (1 << 20) + 3];
            if g.rank() == size - 1 {
                b.iter_mut().enumerate().for_each(|(i, v)| *v = i as u8);
            }
            g.broadcast(&mut b, size - 1).unwrap();
            assert!(b.iter().enumerate().all(|(i, &v)| v == i as u8));
            let block = 300_001;
            let input: Vec<u32> = (0..size * block)
                .map(|i| (g.rank() * size * block + i) as u32)
                .collect();
            let mut out = vec![0u32; size * block];
            g.all_to_all(&input, &mut out).unwrap();
            for (p, c) in out.chunks(block).enumerate() {
                let first = (p * size * block + g.rank() * block) as u32;
                assert!(c.iter().enumerate().all(|(i, &v)| v == first + i as u32));
            }
            g.barrier().unwrap();
        },
    );
    for o in &outputs {
        for path in o.lines("SEGMENT ") {
            assert!(!Path::new(&path).exists(), "{path} left behind");
        }
    }
}

#[test]
fn shm_0_keeps_every_link_on_tcp() {
    native(2)
        .env("NUVEC_DISTRIBUTED_SHM", "0")
        .all_ok("shm_0_keeps_every_link_on_tcp", |g| {
            assert!(mapped_segment().is_none(), "a segment with SHM=0");
            assert_eq!(g.transport(1 - g.rank()).unwrap(), Transport::Tcp);
            let mut x = [g.rank() as u8 + 1; 100];
            g.all_sum(&mut x).unwrap();
            assert_eq!(x, [3; 100]);
        });
}

/// A mismatch on shared memory: rank 1 sums another length; every rank fails naming both
/// calls, and its group stays failed.
#[test]
fn a_mismatch_on_shared_memory_names_both_calls() {
    let outputs = native(3).all_ok("a_mismatch_on_shared_memory_names_both_calls", |g| {
        let mut x = vec![1.0f32; 10];
        g.all_sum(&mut x).unwrap();
        report_segment();
        let n = if g.rank() == 1 { 20 } else { 10 };
        let e = g.all_sum(&mut vec![1.0f32; n]).expect_err("a mismatch");
        assert!(matches!(e, Error::Mismatch { .. }), "{e}");
        println!("ERR {e}");
        assert!(g.barrier().is_err(), "the group is failed");
    });
    for o in &outputs {
        let e = o.lines("ERR ").join("");
        assert!(
            e.contains("float32 x 10") && e.contains("float32 x 20") && e.contains("#1"),
            "rank {}: {e}",
            o.rank
        );
    }
}

/// A recv against a group collective on shared memory: rank 1 receives from rank 0 while
/// ranks 0 and 2 sum. Every rank fails at once (not after the timeout) with the mismatch,
/// naming the recv and the all_sum.
#[test]
fn a_recv_against_an_all_sum_on_shared_memory_fails_every_rank_at_once() {
    let name = "a_recv_against_an_all_sum_on_shared_memory_fails_every_rank_at_once";
    let says = ["recv of 16 bytes from rank 0", "all_sum"];
    mismatch(name, 3, says, |g| {
        report_segment();
        if g.rank() == 1 {
            g.recv(&mut [0.0f32; 4], 0).expect_err("a mismatch")
        } else {
            g.all_sum(&mut [1.0f32; 4]).expect_err("a mismatch")
        }
    });
}

/// Runs `call` on every rank of a native group of `size` on one host, after a barrier: it
/// must end in a mismatch within 10 s, whose message on every rank says each of `says`.
fn mismatch(name: &str, size: usize, says: [&str; 2], call: impl FnOnce(&Group) -> Error) {
    let outputs = native(size).all_ok(name, |g| {
        g.barrier().unwrap();
        let (e, took) = testing::timed(|| call(&g));
        assert!(took < Duration::from_secs(10), "{took:?}: {e}");
        assert!(matches!(e, Error::Mismatch { .. }), "{e}");
        println!("ERR {e}");
    });
    for o in &outputs {
        let e = o.lines("ERR ").join("");
        assert!(says.iter().all(|s| e.contains(s)), "rank {}: {e}", o.rank);
    }
}

fn small_sum(g: &Group) -> nuvec_distributed_engine::Result<()> {
    g.all_sum(&mut [1.0f32])
}

fn large_sum(g: &Group) -> nuvec_distributed_engine::Result<()> {
    // 64 MiB per rank.
    thread_local!(static DATA: std::cell::RefCell<Vec<f32>> = std::cell::RefCell::new(vec![1.0; 16 << 20]));
    DATA.with(|d| g.all_sum(&mut d.borrow_mut()))
}

/// Sends `signal` to rank 1 while the three ranks loop on `collective`: every survivor
/// fails within the timeout of it naming rank 1, and no segment is left behind.
fn fault(name: &str, signal: &str, collective: fn(&Group) -> nuvec_distributed_engine::Result<()>) {
    fault_on(name, signal, (3, 1), collective);
}

/// Sends `signal` to `victim` while the `size` ranks loop on `call`: every survivor fails
/// within the timeout of it naming the victim, and no segment is left behind.
fn fault_on(
    name: &str,
    signal: &str,
    (size, victim): (usize, usize),
    collective: fn(&Group) -> nuvec_distributed_engine::Result<()>,
) {
    const TIMEOUT_S: f64 = 3.0;
    let launch = native(size).timeout(TIMEOUT_S);
    let Some(mut running) = launch.start(name, |g| {
        g.barrier().unwrap();
        report_segment();
        until_failure(|| collective(&g));
    }) else {
        return;
    };
    running.strike(victim, signal, Duration::from_millis(300));
    let outputs = running.finish();
    // A stall is named after the timeout, plus the liveness inquiry and the lingering of a
    // failing rank (as on TCP); a death at once.
    let bound_ms = if signal == "STOP" {
        (TIMEOUT_S * 1000.0) as u64 + 1500
    } else {
        (TIMEOUT_S * 1000.0) as u64
    };
    let mut segments = Vec::new();
    for o in &outputs {
        segments.extend(o.lines("SEGMENT "));
        if o.rank == victim {
            continue;
        }
        let (ms, peer, message) = o.finished_failure();
        assert_eq!(peer, Some(victim), "rank {} blamed: {message}", o.rank);
        assert!(ms <= bound_ms, "rank {} needed {ms} ms: {message}", o.rank);
    }
    assert!(!segments.is_empty(), "no rank reported its segment");
    for path in segments {
        assert!(!Path::new(&path).exists(), "{path} left behind");
    }
}

test_cases!(fault {
    shm_kill_9_during_a_small_all_sum_p3: "KILL", small_sum;
    shm_kill_9_during_a_64_mib_all_sum_p3: "KILL", large_sum;
    shm_stop_during_a_small_all_sum_p3: "STOP", small_sum;
    shm_stop_during_a_64_mib_all_sum_p3: "STOP", large_sum;
});

// Send/recv through the segment's per-pair slots.

/// The slots' size in the library (`transport::shm::p2p::SLOT`): the sizes below straddle it.
const SLOT: usize = 64 << 10;

/// Byte `i` of rank `r`'s message of `n` bytes.
fn pattern(r: usize, n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 31 + r * 7 + n) as u8).collect()
}

/// Every size around the slots' edges and up to 64 MiB goes from rank 0 to rank 1 and
/// back, bit for bit, and messages both ways at once pass while they fit in the slots.
#[test]
fn send_recv_on_shared_memory_move_every_size_bit_for_bit() {
    let name = "send_recv_on_shared_memory_move_every_size_bit_for_bit";
    native(2).all_ok(name, |g| {
        g.barrier().unwrap();
        report_segment();
        let peer = 1 - g.rank();
        assert_eq!(g.transport(peer).unwrap(), Transport::SharedMemory);
        assert_eq!(g.transport(g.rank()).unwrap(), Transport::Local);
        for n in [0, 1, 4, SLOT, SLOT + 1, 1 << 20, 64 << 20] {
            let mut got = vec![0u8; n];
            if g.rank() == 0 {
                g.send(&pattern(0, n), peer).unwrap();
                g.recv(&mut got, peer).unwrap();
                assert!(got == pattern(1, n), "{n} B back");
            } else {
                g.recv(&mut got, peer).unwrap();
                assert!(got == pattern(0, n), "{n} B there");
                g.send(&pattern(1, n), peer).unwrap();
            }
        }
        // Both ways at once: each send fits in the slots, so neither waits for the other.
        for n in [4, 3 * SLOT] {
            g.send(&pattern(g.rank(), n), peer).unwrap();
            let mut got = vec![0u8; n];
            g.recv(&mut got, peer).unwrap();
            assert!(got == pattern(peer, n), "{n} B both ways");
        }
    });
}

/// A ring shift at P = 3 and 4 (rank 0 sends first, the others receive first) moves
/// messages larger than all of a pair's slots, bit for bit.
#[test]
fn a_ring_shift_on_shared_memory_p3() {
    ring_shift("a_ring_shift_on_shared_memory_p3", 3);
}

#[test]
fn a_ring_shift_on_shared_memory_p4() {
    ring_shift("a_ring_shift_on_shared_memory_p4", 4);
}

fn ring_shift(name: &str, size: usize) {
    native(size).all_ok(name, |g| {
        let (me, p) = (g.rank(), g.size());
        let (to, from) = ((me + 1) % p, (me + p - 1) % p);
        for n in [4, (3 << 20) + 5] {
            let mut got = vec![0u8; n];
            if me == 0 {
                g.send(&pattern(me, n), to).unwrap();
                g.recv(&mut got, from).unwrap();
            } else {
                g.recv(&mut got, from).unwrap();
                g.send(&pattern(me, n), to).unwrap();
            }
            assert!(got == pattern(from, n), "P {p}: {n} B from rank {from}");
        }
        let mut x = [1.0f32; 3];
        g.all_sum(&mut x).unwrap();
        assert_eq!(x, [p as f32; 3]);
    });
}

/// A send against an all_sum: rank 0 sends to rank 1, then sums; rank 1 sums at once.
/// Both fail at once with the mismatch naming the send and the all_sum.
#[test]
fn a_send_against_an_all_sum_on_shared_memory_fails_both_ranks() {
    let name = "a_send_against_an_all_sum_on_shared_memory_fails_both_ranks";
    mismatch(name, 2, ["send of 12 bytes to rank 1", "all_sum"], |g| {
        if g.rank() == 0 {
            g.send(&[0u8; 12], 1).unwrap();
        }
        g.all_sum(&mut [1.0f32; 4]).expect_err("a mismatch")
    });
}

fn large_send_or_recv(g: &Group) -> nuvec_distributed_engine::Result<()> {
    // 64 MiB, rank 0 to rank 1.
    thread_local!(static DATA: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![1; 64 << 20]));
    DATA.with(|d| {
        if g.rank() == 0 {
            g.send(&d.borrow(), 1)
        } else {
            g.recv(&mut d.borrow_mut(), 0)
        }
    })
}

#[test]
fn shm_kill_9_of_the_sender_during_a_64_mib_recv() {
    fault_on(
        "shm_kill_9_of_the_sender_during_a_64_mib_recv",
        "KILL",
        (2, 0),
        large_send_or_recv,
    );
}

#[test]
fn shm_kill_9_of_the_receiver_during_a_64_mib_send() {
    fault_on(
        "shm_kill_9_of_the_receiver_during_a_64_mib_send",
        "KILL",
        (2, 1),
        large_send_or_recv,
    );
}
