//! broadcast and all_to_all on the native wire, in one process over loopback: both
//! broadcast algorithms at every root and at sizes around their switch, all_to_all at
//! every P, and the mismatches the headers find.

use std::sync::Barrier;
use std::time::{Duration, Instant};

use super::Native;
use super::tests::{self, on_ranks};
use crate::comm::algorithm::{self, BROADCAST_DIRECT_MAX};
use crate::comm::{Communicator, Transport};
use crate::error::{Error, Phase};

fn group(size: usize, connections: usize) -> Vec<Native> {
    tests::group(size, connections, Duration::from_secs(20))
}

/// Distinct bytes for (`who`, `len`): a wrong block or offset shows.
fn pattern(who: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(31) ^ who.wrapping_mul(97) ^ (i >> 8)) as u8)
        .collect()
}

#[test]
fn both_broadcasts_deliver_the_roots_bytes_from_every_root() {
    let m = BROADCAST_DIRECT_MAX;
    for size in 2..=6 {
        let ranks = group(size, 1 + usize::from(size == 3));
        for root in 0..size {
            for len in [0, 1, size - 1, size + 1, 4099, m, m + 1, 3 * m + 7] {
                for direct in [true, false] {
                    let results = on_ranks(&ranks, |c| {
                        let mut data = pattern(c.rank() + 100, len);
                        if c.rank() == root {
                            data = pattern(root, len);
                        }
                        c.broadcast_by(direct, &mut data, root).map(|()| data)
                    });
                    for (rank, got) in results.into_iter().enumerate() {
                        let got = got.unwrap_or_else(|e| {
                            panic!("P={size} root {root} {len} B direct {direct} rank {rank}: {e}")
                        });
                        assert!(
                            got == pattern(root, len),
                            "P={size} root {root} {len} B direct {direct}: rank {rank} holds \
                             other bytes"
                        );
                    }
                }
            }
        }
        // The automatic choice, both sides of the switch, in the same stream.
        for len in [m, m + 1] {
            let results = on_ranks(&ranks, |c| {
                let mut data = pattern(c.rank(), len);
                c.broadcast(&mut data, size - 1).map(|()| data)
            });
            for got in results {
                assert!(got.expect("a broadcast") == pattern(size - 1, len));
            }
        }
    }
}

#[test]
fn all_to_all_swaps_every_pair_of_blocks() {
    for size in 2..=6 {
        let ranks = group(size, 1);
        for block in [0, 1, 7, 4096 + 3, 70_001] {
            let results = on_ranks(&ranks, |c| {
                let me = c.rank();
                let input: Vec<u8> = (0..size)
                    .flat_map(|j| pattern(me * 10 + j, block))
                    .collect();
                let mut output = vec![0xEE; input.len()];
                c.all_to_all(&input, &mut output).map(|()| output)
            });
            for (me, got) in results.into_iter().enumerate() {
                let want: Vec<u8> = (0..size)
                    .flat_map(|i| pattern(i * 10 + me, block))
                    .collect();
                let got = got.unwrap_or_else(|e| panic!("P={size} block {block} rank {me}: {e}"));
                assert!(
                    got == want,
                    "P={size} block {block}: rank {me} holds wrong blocks"
                );
            }
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Broadcast(usize, usize),
    AllToAll(usize),
    Gather(usize),
    Barrier,
}

fn call(c: &Native, op: Op) -> Result<(), Error> {
    match op {
        Op::Broadcast(len, root) => c.broadcast(&mut vec![0u8; len], root),
        Op::AllToAll(len) => c.all_to_all(&vec![0u8; len], &mut vec![0u8; len]),
        Op::Gather(n) => c.all_gather(&vec![0u8; n], &mut vec![0u8; n * c.size()]),
        Op::Barrier => c.barrier(),
    }
}

/// Every rank but the last calls `normal`, the last `odd`: every rank must fail within a
/// second with a mismatch naming both calls, and the group must be failed after.
fn mismatch(size: usize, normal: Op, odd: Op, names: (&str, &str)) {
    let ranks = group(size, 1);
    let start = Barrier::new(size);
    let outcomes = on_ranks(&ranks, |c| {
        c.barrier().expect("a good call");
        start.wait();
        let began = Instant::now();
        let mine = if c.rank() == size - 1 { odd } else { normal };
        let e = call(c, mine).expect_err("a mismatched call must fail");
        let took = began.elapsed();
        let later = c.barrier().expect_err("a failed group refuses later calls");
        (e, took, later)
    });
    for (rank, (e, took, later)) in outcomes.into_iter().enumerate() {
        let msg = e.to_string();
        assert!(
            matches!(e, Error::Mismatch { .. }),
            "P={size} rank {rank}: {msg}"
        );
        assert!(
            msg.contains(names.0) && msg.contains(names.1) && msg.contains("#1"),
            "P={size} rank {rank}: {msg}"
        );
        assert!(
            took < Duration::from_secs(1),
            "P={size} rank {rank} took {took:?}"
        );
        assert!(
            matches!(later, Error::Failed(_)),
            "P={size} rank {rank}: {later}"
        );
    }
}

#[test]
fn broadcasts_and_all_to_alls_that_disagree_fail_every_rank_with_a_mismatch() {
    let big = 4 * BROADCAST_DIRECT_MAX;
    let cases = [
        // Two roots: with direct sends only, neither would receive anything to check.
        (
            Op::Broadcast(64, 0),
            Op::Broadcast(64, 1),
            (
                "broadcast of 64 bytes from rank 0",
                "broadcast of 64 bytes from rank 1",
            ),
        ),
        (
            Op::Broadcast(big, 0),
            Op::Broadcast(big, 1),
            ("from rank 0", "from rank 1"),
        ),
        // Lengths on both sides of the switch between algorithms.
        (
            Op::Broadcast(64, 0),
            Op::Broadcast(big, 0),
            (
                "broadcast of 64 bytes",
                &format!("broadcast of {big} bytes"),
            ),
        ),
        (
            Op::AllToAll(120),
            Op::Gather(40),
            ("all_to_all of 120 bytes", "all_gather of 40 bytes"),
        ),
        (
            Op::AllToAll(120),
            Op::AllToAll(240),
            ("all_to_all of 120 bytes", "all_to_all of 240 bytes"),
        ),
        (
            Op::Broadcast(8, 0),
            Op::Barrier,
            ("broadcast of 8", "barrier"),
        ),
    ];
    for size in [2, 3, 4] {
        for (normal, odd, (a, b)) in &cases {
            // From three ranks the barrier goes by recursive doubling, where only the ranks
            // that meet the odd one compare calls with it (`native::tests::
            // a_mismatch_in_log_rounds_fails_every_rank_at_once` has a barrier against
            // another call there).
            if matches!(odd, Op::Barrier)
                && algorithm::barrier(Transport::Tcp, size) != algorithm::Barrier::Direct
            {
                continue;
            }
            mismatch(size, *normal, *odd, (a, b));
        }
    }
}

#[test]
fn a_mismatch_names_the_broadcast_phase() {
    let ranks = group(2, 1);
    let errors = on_ranks(&ranks, |c| {
        let root = c.rank(); // each rank thinks it is the root
        c.broadcast(&mut [1u8; 16], root).expect_err("two roots")
    });
    for e in errors {
        assert!(
            matches!(
                e,
                Error::Mismatch {
                    context: Phase::Broadcast,
                    ..
                }
            ),
            "{e}"
        );
    }
}
