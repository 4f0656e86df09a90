//! The shared-memory path in one process (a thread per rank over loopback meshes that
//! claim one host): every collective against a rank-order fold, and a setup that fails
//! leaves no segment.

use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

use super::hello::CAP_SHARED_MEMORY;
use super::hier::Path;
use super::tests::{loopback_mesh, on_ranks, recv_of_another_length};
use super::{Formed, Native};
use crate::comm::Communicator;
use crate::comm::algorithm::SHM_ONE_SHOT_MAX;
use crate::comm::progress::WaitPolicy;
use crate::element::DType;
use crate::options::Options;
use crate::reduce::{ReduceOp, reduce_into};
use crate::transport::shm::{CHUNK, Link, OFFER_BYTES, SLOT, SLOTS, read_exact, segment_path};

/// Meshes whose hellos all said "this host, shared memory offered".
fn on_one_host(size: usize, timeout: Duration) -> (Vec<Formed>, [u8; 32]) {
    let mut group = [0u8; 32];
    rand::rng().fill_bytes(&mut group);
    let mut formed = loopback_mesh(size, 1, timeout);
    for f in &mut formed {
        for p in &mut f.peers {
            p.host = [7; 16];
            p.capabilities = CAP_SHARED_MEMORY;
        }
        f.group = group;
    }
    (formed, group)
}

fn group(size: usize) -> Vec<Native> {
    group_timeout(size, Duration::from_secs(20))
}

/// Starts a communicator per formed connection set, each on its own thread (they set up
/// the segment together).
pub(super) fn start(formed: Vec<Formed>, options: &Options) -> Vec<Native> {
    std::thread::scope(|s| {
        let handles: Vec<_> = formed
            .into_iter()
            .map(|f| s.spawn(|| Native::new(f, options).expect("a native communicator")))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a rank's thread"))
            .collect()
    })
}

pub(super) fn random(seed: u64, bytes: usize) -> Vec<u8> {
    let mut v = vec![0u8; bytes];
    StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

/// Runs `all_reduce(op, dtype)` on `ranks`, rank r's data `inputs[r]`, and checks that
/// every rank got `want`; `case` names the case in a failure.
pub(super) fn check_all_reduce(
    ranks: &[Native],
    op: ReduceOp,
    dtype: DType,
    inputs: &[Vec<u8>],
    want: &[u8],
    case: &str,
) {
    let got = on_ranks(ranks, |c| {
        let mut data = inputs[c.rank()].clone();
        c.all_reduce(op, dtype, &mut data).map(|()| data)
    });
    for (r, got) in got.into_iter().enumerate() {
        let got = got.unwrap_or_else(|e| panic!("{case}: {e}"));
        assert!(got == want, "{case} all_{op:?}: rank {r}");
    }
}

/// Runs `all_gather` of `n` random bytes per rank on `ranks` and checks that every rank
/// got them all in rank order; `case` names the case in a failure.
pub(super) fn check_all_gather(ranks: &[Native], n: usize, case: &str) {
    let size = ranks.len();
    let inputs: Vec<Vec<u8>> = (0..size).map(|r| random(r as u64, n)).collect();
    let got = on_ranks(ranks, |c| {
        let mut out = vec![0u8; n * size];
        c.all_gather(&inputs[c.rank()], &mut out).map(|()| out)
    });
    for got in got {
        assert!(
            got.expect("all_gather") == inputs.concat(),
            "{case} all_gather x{n}"
        );
    }
}

/// Runs `sum_scatter` of `n` random f32 per rank and block on `ranks` and checks that
/// rank r got block r of `sum(inputs)` (the element-wise sum every rank must compute);
/// `case` names the case in a failure.
pub(super) fn check_sum_scatter(
    ranks: &[Native],
    n: usize,
    sum: impl Fn(&[Vec<u8>]) -> Vec<u8>,
    case: &str,
) {
    let size = ranks.len();
    let inputs: Vec<Vec<u8>> = (0..size)
        .map(|r| random(77 + r as u64, n * size * 4))
        .collect();
    let want = sum(&inputs);
    let got = on_ranks(ranks, |c| {
        let mut out = vec![0u8; n * 4];
        c.sum_scatter(DType::F32, &inputs[c.rank()], &mut out)
            .map(|()| out)
    });
    for (r, got) in got.into_iter().enumerate() {
        assert!(
            got.expect("sum_scatter")[..] == want[r * n * 4..(r + 1) * n * 4],
            "{case} sum_scatter x{n}: rank {r}"
        );
    }
}

/// The fold every rank must compute: rank order from rank 0, with the crate's kernel.
fn fold(op: ReduceOp, dtype: DType, inputs: &[Vec<u8>]) -> Vec<u8> {
    let mut acc = inputs[0].clone();
    for x in &inputs[1..] {
        reduce_into(op, dtype, &mut acc, x);
    }
    acc
}

#[test]
fn every_collective_on_shared_memory_folds_in_rank_order() {
    for size in [2, 3, 5] {
        let ranks = group(size);
        assert!(
            ranks
                .iter()
                .all(|r| matches!(r.state.lock().expect("open").path, Path::Flat(_))),
            "P = {size}: not on shared memory"
        );
        for dtype in [DType::F32, DType::BF16, DType::Bool] {
            let ds = dtype.size();
            // Around P, the one-shot limit, and past a chunk with a ragged end (sum only:
            // the ops share the schedule, and the unit tests run unoptimised too).
            let counts = [
                0,
                1,
                size - 1,
                4099,
                SHM_ONE_SHOT_MAX / ds + 1,
                CHUNK / ds + CHUNK / (2 * ds) + 7,
            ];
            for (i, &n) in counts.iter().enumerate() {
                let ops = if n * ds > CHUNK {
                    &[ReduceOp::Sum][..]
                } else {
                    &ReduceOp::ALL[..]
                };
                for &op in ops {
                    let case = (size * 1000 + i * 10) as u64;
                    let mut inputs: Vec<Vec<u8>> =
                        (0..size).map(|r| random(case + r as u64, n * ds)).collect();
                    if dtype == DType::Bool {
                        inputs.iter_mut().flatten().for_each(|b| *b &= 1);
                    }
                    let want = fold(op, dtype, &inputs);
                    let case = format!("P {size} {dtype} x{n}");
                    check_all_reduce(&ranks, op, dtype, &inputs, &want, &case);
                }
            }
        }
        for n in [0, 3, CHUNK + 5] {
            check_all_gather(&ranks, n, &format!("P {size}"));
        }
        for n in [0, 5, CHUNK / 4 + 3] {
            check_sum_scatter(
                &ranks,
                n,
                |inputs| fold(ReduceOp::Sum, DType::F32, inputs),
                &format!("P {size}"),
            );
        }
        for result in on_ranks(&ranks, |c| c.barrier()) {
            result.expect("barrier");
        }
        // send/recv stay on the connections, in step with the collectives around them.
        let got = on_ranks(&ranks, |c| {
            let (me, p) = (c.rank(), size);
            let mut got = [0u8; 3];
            if me == 0 {
                c.send(&[1, 2, 3], 1)?;
            } else if me == 1 {
                c.recv(&mut got, 0)?;
            }
            let mut x = [me as u8; 1];
            c.all_reduce(ReduceOp::Sum, DType::U8, &mut x)?;
            assert_eq!(x[0] as usize, p * (p - 1) / 2);
            Ok::<_, crate::Error>(got)
        });
        assert_eq!(got[1].as_ref().expect("recv"), &[1, 2, 3]);
    }
}

/// Rank 0 created the segment, rank 1 read its name and left without mapping it: rank 0's
/// setup fails naming rank 1, and the file is gone.
#[test]
fn a_failed_setup_leaves_no_segment() {
    let timeout = Duration::from_secs(10);
    let (formed, group) = on_one_host(2, timeout);
    let mut formed = formed.into_iter();
    let (mut zero, mut one) = (
        formed.next().expect("rank 0"),
        formed.next().expect("rank 1"),
    );
    let spin = WaitPolicy::for_local_ranks(None, 2);
    std::thread::scope(|s| {
        let creator = s.spawn(move || {
            Link::establish(&mut zero.transport, (&[0, 1], 0), &group, timeout, spin).map(|_| ())
        });
        let mut offer = [0u8; OFFER_BYTES];
        let deadline = Instant::now() + timeout;
        let conn = one.transport.recv_conn(0);
        read_exact(&mut one.transport, conn, &mut offer, deadline, timeout).expect("the offer");
        assert_eq!(offer[0], 1, "rank 0 offers shared memory");
        let nonce: [u8; 16] = offer[1..].try_into().expect("16 bytes");
        let path = segment_path(&group, &nonce);
        let meta = std::fs::metadata(&path).expect("the segment exists while setup runs");
        assert_eq!(meta.mode() & 0o7777, 0o600);
        drop(one);
        let error = creator.join().expect("rank 0's thread").unwrap_err();
        assert_eq!(error.peer(), Some(1), "{error}");
        assert!(!path.exists(), "{} left behind", path.display());
    });
}

/// A wait on shared memory ends when another thread closes the group (the close flag is
/// looked at between sleeps), long before the timeout, and an idle peer is not blamed.
#[test]
fn a_close_from_another_thread_ends_a_wait_on_shared_memory() {
    let ranks = group(2);
    let start = Instant::now();
    std::thread::scope(|s| {
        let waiter = s.spawn(|| ranks[0].barrier());
        std::thread::sleep(Duration::from_millis(100));
        ranks[0].close().expect("close");
        let e = waiter.join().expect("the waiting thread").unwrap_err();
        assert!(matches!(e, crate::Error::Aborted { .. }), "{e}");
    });
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}

/// `read` of this rank's shared-memory link (the group must be on one segment).
fn on_link<T>(c: &Native, read: impl FnOnce(&Link) -> T) -> T {
    read(
        c.state
            .lock()
            .expect("open")
            .path
            .flat()
            .expect("on shared memory"),
    )
}

/// The step this rank's link has published: a collective that went through shared memory
/// advanced it.
fn steps(c: &Native) -> u32 {
    c.state
        .lock()
        .expect("open")
        .path
        .flat()
        .expect("on shared memory")
        .step()
}

#[test]
fn broadcast_and_all_to_all_go_through_shared_memory() {
    for size in [2, 3, 5] {
        let ranks = group(size);
        for root in [0, size - 1] {
            // Empty, small, and past a chunk with a ragged end.
            for n in [0, 7, CHUNK + 13] {
                let want = random((size * 100 + root) as u64 + n as u64, n);
                let before = steps(&ranks[0]);
                let got = on_ranks(&ranks, |c| {
                    let mut data = if c.rank() == root {
                        want.clone()
                    } else {
                        vec![0xEE; n]
                    };
                    c.broadcast(&mut data, root).map(|()| data)
                });
                for (r, got) in got.into_iter().enumerate() {
                    let got = got.unwrap_or_else(|e| panic!("P {size} broadcast x{n}: {e}"));
                    assert!(got == want, "P {size} broadcast x{n} from {root}: rank {r}");
                }
                let moved = steps(&ranks[0]).wrapping_sub(before) as usize;
                assert_eq!(moved, n.div_ceil(CHUNK).max(1), "P {size} broadcast x{n}");
            }
        }
        // Blocks of nothing, a few bytes, and more than one piece (CHUNK / P bytes each).
        for block in [0, 3, CHUNK / size + 5] {
            let inputs: Vec<Vec<u8>> = (0..size)
                .map(|r| random(500 + r as u64, block * size))
                .collect();
            let before = steps(&ranks[0]);
            let got = on_ranks(&ranks, |c| {
                let mut out = vec![0xEE; block * size];
                c.all_to_all(&inputs[c.rank()], &mut out).map(|()| out)
            });
            for (r, got) in got.into_iter().enumerate() {
                let got = got.unwrap_or_else(|e| panic!("P {size} all_to_all x{block}: {e}"));
                let want: Vec<u8> = inputs
                    .iter()
                    .flat_map(|x| x[r * block..(r + 1) * block].iter().copied())
                    .collect();
                assert!(got == want, "P {size} all_to_all x{block}: rank {r}");
            }
            assert!(steps(&ranks[0]) != before, "P {size} all_to_all x{block}");
        }
    }
}

/// The calls of the cross-kind mismatch matrix, each with the word that names it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    AllSum,
    AllGather,
    SumScatter,
    Barrier,
    Broadcast,
    AllToAll,
    Recv,
    Send,
}

impl Op {
    const ALL: [Op; 8] = [
        Op::AllSum,
        Op::AllGather,
        Op::SumScatter,
        Op::Barrier,
        Op::Broadcast,
        Op::AllToAll,
        Op::Recv,
        Op::Send,
    ];

    fn word(self) -> &'static str {
        match self {
            Op::AllSum => "all_sum",
            Op::AllGather => "all_gather",
            Op::SumScatter => "sum_scatter",
            Op::Barrier => "barrier",
            Op::Broadcast => "broadcast",
            Op::AllToAll => "all_to_all",
            Op::Recv => "recv",
            Op::Send => "send",
        }
    }

    /// Runs the call on `c` against the other rank of a pair (`peer`).
    fn run(self, c: &Native, peer: usize) -> crate::Result<()> {
        let mut eight = [0u8; 8];
        match self {
            Op::AllSum => c.all_reduce(ReduceOp::Sum, DType::F32, &mut eight),
            Op::AllGather => c.all_gather(&[1; 4], &mut eight),
            Op::SumScatter => c.sum_scatter(DType::F32, &[0; 8], &mut [0; 4]),
            Op::Barrier => c.barrier(),
            Op::Broadcast => c.broadcast(&mut eight, 0),
            Op::AllToAll => c.all_to_all(&[0; 8], &mut eight),
            Op::Recv => c.recv(&mut eight, peer),
            // A length no recv here expects, so that a recv against it mismatches too.
            Op::Send => c.send(&[0; 3], peer),
        }
    }
}

/// Every two different calls on the two ranks of a group on shared memory fail at once
/// with `Mismatch`, each rank naming its own call and the peer's. A send is not
/// acknowledged, so the sender itself returns (its next call finds the group failed);
/// two recvs wait for each other (a deadlock, not a mismatch) and two sends both pass,
/// so those pairs are not here.
#[test]
fn every_two_different_calls_mismatch_at_once_on_shared_memory() {
    for (i, &a) in Op::ALL.iter().enumerate() {
        for &b in &Op::ALL[i + 1..] {
            let ranks = group(2);
            let ops = [a, b];
            let start = Instant::now();
            let got = on_ranks(&ranks, |c| ops[c.rank()].run(c, 1 - c.rank()));
            let took = start.elapsed();
            assert!(
                took < Duration::from_secs(5),
                "{a:?} against {b:?}: {took:?}"
            );
            for (r, got) in got.into_iter().enumerate() {
                let (mine, theirs) = (ops[r], ops[1 - r]);
                if mine == Op::Send {
                    got.unwrap_or_else(|e| panic!("{a:?}/{b:?}: the send failed: {e}"));
                    continue;
                }
                match got {
                    Err(crate::Error::Mismatch {
                        call, peer_call, ..
                    }) => {
                        assert!(call.contains(mine.word()), "{a:?}/{b:?} rank {r}: {call}");
                        assert!(
                            peer_call.contains(theirs.word()),
                            "{a:?}/{b:?} rank {r}: {peer_call}"
                        );
                    }
                    other => panic!("{a:?} against {b:?}: rank {r}: {other:?}"),
                }
            }
        }
    }
}

/// An all_sum of `data` on shared memory by the schedule `one_shot` says.
fn all_sum_by(c: &Native, one_shot: bool, dtype: DType, data: &mut [u8]) -> crate::Result<()> {
    let mut state = c.state.lock()?;
    let state = &mut *state;
    let kind = super::header::Kind::AllReduce(ReduceOp::Sum, dtype);
    let call = Native::group_call(state, kind, data.len() / dtype.size());
    c.run_shm(state, &call, |link, watch| {
        link.all_reduce_by(one_shot, &call, (ReduceOp::Sum, dtype), data, watch)
    })
}

/// Both schedules of a large all-reduce, whichever `protocol::one_shot` picks: the same
/// bits as the rank-order fold on every rank, across chunks with a ragged end.
#[test]
fn both_large_all_reduce_schedules_fold_in_rank_order() {
    for size in [2, 3] {
        let ranks = group(size);
        for dtype in [DType::F32, DType::BF16] {
            let n = (2 * CHUNK + CHUNK / 3) / dtype.size() + 1;
            let inputs: Vec<Vec<u8>> = (0..size)
                .map(|r| random(900 + r as u64, n * dtype.size()))
                .collect();
            let want = fold(ReduceOp::Sum, dtype, &inputs);
            for one_shot in [true, false] {
                let got = on_ranks(&ranks, |c| {
                    let mut data = inputs[c.rank()].clone();
                    all_sum_by(c, one_shot, dtype, &mut data).map(|()| data)
                });
                for (r, got) in got.into_iter().enumerate() {
                    let got = got.unwrap_or_else(|e| panic!("P {size} {dtype}: {e}"));
                    assert!(
                        got == want,
                        "P {size} {dtype} one-shot {one_shot}: rank {r}"
                    );
                }
            }
        }
    }
}

/// Times 64 MiB f32 all_sums at P = 2 and 3 by both schedules, alternating in one run
/// (the median of rank 0's times): what the shared-memory rows of `comm::algorithm` rest
/// on.
#[test]
#[ignore = "a measurement: cargo test --release --lib measure_large_all_sum -- --ignored --nocapture"]
fn measure_large_all_sum() {
    let bytes = 64 << 20;
    for size in [2, 3] {
        let ranks = group(size);
        let mut times = [Vec::new(), Vec::new()];
        let bufs: Vec<std::sync::Mutex<Vec<u8>>> = (0..size)
            .map(|r| std::sync::Mutex::new(random(r as u64, bytes)))
            .collect();
        for round in 0..8 {
            for (i, one_shot) in [true, false].into_iter().enumerate() {
                let took = on_ranks(&ranks, |c| {
                    let mut data = bufs[c.rank()].lock().expect("a buffer");
                    let start = Instant::now();
                    all_sum_by(c, one_shot, DType::F32, &mut data).expect("all_sum");
                    start.elapsed()
                });
                if round > 0 {
                    times[i].push(took[0]);
                }
            }
        }
        for (i, name) in ["one-shot", "shares"].iter().enumerate() {
            times[i].sort_unstable();
            let median = times[i][times[i].len() / 2];
            // Bus bandwidth of an all-reduce: 2 (P - 1) / P of the bytes per rank.
            let bus = bytes as f64 * 2.0 * (size - 1) as f64 / size as f64;
            let bus = bus / median.as_secs_f64() / 1e9;
            println!("P = {size}, 64 MiB all_sum, {name}: median {median:?}, bus {bus:.2} GB/s");
        }
    }
}

// Send/recv through the segment's per-pair slots (`transport::shm::p2p`).

/// A group on shared memory whose waits end after `timeout`.
fn group_timeout(size: usize, timeout: Duration) -> Vec<Native> {
    let (formed, _) = on_one_host(size, timeout);
    start(formed, &Options::default().timeout(timeout))
}

fn pieces_sent(c: &Native, dst: usize) -> u32 {
    on_link(c, |link| link.pieces_sent(dst))
}

/// Messages of every size around the slots' edges, in a ring shift (rank r sends to
/// r + 1 and receives from r - 1; rank 0 sends first, every other rank receives first, so
/// that messages larger than the slots pipeline through them), arrive bit for bit, each
/// through the segment in `max(1, ceil(n / SLOT))` pieces.
#[test]
fn the_transport_is_what_the_group_negotiated() {
    use crate::comm::Transport;
    for c in &group(3) {
        for peer in (0..3).filter(|&p| p != c.rank()) {
            assert_eq!(c.transport(peer), Transport::SharedMemory);
        }
    }
    // Hellos that do not share a host keep TCP.
    for c in &super::tests::group(2, 1, Duration::from_secs(5)) {
        assert_eq!(c.transport(1 - c.rank()), Transport::Tcp);
    }
}

#[test]
fn a_ring_shift_moves_every_size_through_the_slots_bit_for_bit() {
    let total = SLOTS as usize * SLOT;
    let sizes = [
        0,
        1,
        4,
        SLOT - 1,
        SLOT,
        SLOT + 1,
        total,
        total + 3,
        1 << 20,
        (3 << 20) + 5,
    ];
    for size in [2, 3, 4] {
        let ranks = group(size);
        for (i, &n) in sizes.iter().enumerate() {
            let inputs: Vec<Vec<u8>> = (0..size)
                .map(|r| random((size * 100 + i * 10 + r) as u64, n))
                .collect();
            let before: Vec<u32> = ranks
                .iter()
                .map(|c| pieces_sent(c, (c.rank() + 1) % size))
                .collect();
            let got = on_ranks(&ranks, |c| {
                let (me, p) = (c.rank(), c.size());
                let (to, from) = ((me + 1) % p, (me + p - 1) % p);
                let mut out = vec![0xEE; n];
                if me == 0 {
                    c.send(&inputs[me], to)?;
                    c.recv(&mut out, from)?;
                } else {
                    c.recv(&mut out, from)?;
                    c.send(&inputs[me], to)?;
                }
                Ok::<_, crate::Error>(out)
            });
            for (r, got) in got.into_iter().enumerate() {
                let got = got.unwrap_or_else(|e| panic!("P {size} shift of {n} B: rank {r}: {e}"));
                assert!(
                    got == inputs[(r + size - 1) % size],
                    "P {size} shift of {n} B: rank {r}"
                );
                let moved = pieces_sent(&ranks[r], (r + 1) % size).wrapping_sub(before[r]);
                assert_eq!(
                    moved as usize,
                    n.div_ceil(SLOT).max(1),
                    "P {size} {n} B: rank {r}"
                );
            }
        }
        // The group is still in step for collectives afterwards.
        let sums = on_ranks(&ranks, |c| {
            let mut x = 1.0f32.to_le_bytes();
            c.all_reduce(ReduceOp::Sum, DType::F32, &mut x).map(|()| x)
        });
        for s in sums {
            assert_eq!(f32::from_le_bytes(s.expect("an all_sum")), size as f32);
        }
    }
}

/// Two ranks sending to each other at once: both complete while the messages fit in the
/// slots (the sender runs ahead), and the messages alternate with collectives in order.
#[test]
fn sends_both_ways_at_once_complete_while_they_fit_in_the_slots() {
    let ranks = group(2);
    let fits = SLOTS as usize * SLOT;
    for n in [0, 8, SLOT + 1, fits] {
        for round in 0..3 {
            let inputs: Vec<Vec<u8>> = (0..2)
                .map(|r| random((n * 10 + round * 2 + r) as u64, n))
                .collect();
            let got = on_ranks(&ranks, |c| {
                let peer = 1 - c.rank();
                c.send(&inputs[c.rank()], peer)?;
                let mut out = vec![0u8; n];
                c.recv(&mut out, peer)?;
                c.barrier()?;
                Ok::<_, crate::Error>(out)
            });
            for (r, got) in got.into_iter().enumerate() {
                let got = got.unwrap_or_else(|e| panic!("{n} B both ways: rank {r}: {e}"));
                assert!(got == inputs[1 - r], "{n} B both ways: rank {r}");
            }
        }
    }
}

/// Waits the caller wrote into a deadlock end by the timeout naming the peer, as on TCP:
/// two recvs from each other, and two sends too large for the slots.
#[test]
fn a_recv_recv_or_oversized_send_send_deadlock_times_out_naming_the_peer() {
    let timeout = Duration::from_millis(800);
    let big = vec![7u8; 2 * SLOTS as usize * SLOT];
    for sends in [false, true] {
        let ranks = group_timeout(2, timeout);
        let start = Instant::now();
        let got = on_ranks(&ranks, |c| {
            let peer = 1 - c.rank();
            if sends {
                c.send(&big, peer)
            } else {
                c.recv(&mut [0u8; 4], peer)
            }
        });
        let took = start.elapsed();
        for (r, e) in got.into_iter().enumerate() {
            let e = e.expect_err("a deadlock cannot complete");
            assert!(
                matches!(e, crate::Error::Timeout { .. }) && e.peer() == Some(1 - r),
                "sends {sends}: rank {r}: {e}"
            );
        }
        assert!(
            took >= timeout && took < timeout * 10,
            "sends {sends}: {took:?}"
        );
    }
}

/// A send whose receiver runs a group collective fails both ranks with the mismatch, each
/// naming the send and the all_sum: when the send fits in the slots (its sender then
/// enters the all_sum too), and when it does not (its sender waits for room).
#[test]
fn a_send_against_an_all_sum_fails_both_ranks_naming_the_send() {
    for n in [8, 2 * SLOTS as usize * SLOT] {
        let ranks = group(2);
        let start = Instant::now();
        let got = on_ranks(&ranks, |c| {
            let mut x = [0u8; 16];
            if c.rank() == 0 {
                c.send(&vec![1u8; n], 1)?;
            }
            c.all_reduce(ReduceOp::Sum, DType::F32, &mut x)
        });
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{n} B: {:?}",
            start.elapsed()
        );
        for (r, got) in got.into_iter().enumerate() {
            let e = got.expect_err("a mismatch");
            let text = e.to_string();
            assert!(
                matches!(e, crate::Error::Mismatch { .. }),
                "{n} B: rank {r}: {text}"
            );
            assert!(
                text.contains(&format!("send of {n} bytes to rank 1")) && text.contains("all_sum"),
                "{n} B: rank {r}: {text}"
            );
        }
    }
}

/// A recv of another length than the send fails the receiver with the mismatch naming
/// both, before it takes any data, and answers the sender, whose next call fails with the
/// same mismatch: what the native wire does on TCP.
#[test]
fn a_recv_of_another_length_fails_the_receiver_and_then_the_sender_on_shared_memory() {
    for size in [2, 3] {
        recv_of_another_length(&group(size));
    }
}
