//! The native wire's data path over real loopback sockets (one thread per rank, meshes
//! formed without the handshake) and over a byte-queue simulator.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::net::{SocketAddr, TcpListener};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use half::{bf16, f16};
use mio::Poll;
use mio::net::TcpStream;
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

use super::header::{Call, Header, Kind};
use super::protocol::{Caller, Exchange, Memory};
// Every rank's end of every pair is connection `peer` (one queue each way).
use super::timed::Direct;
use super::{Formed, Native, Peer};
use crate::comm::Communicator;
use crate::comm::Transport;
use crate::comm::algorithm::{self, AllReduce, TCP_RING_MIN};
use crate::config::env;
use crate::element::DType;
use crate::error::Error;
use crate::options::Options;
use crate::reduce::{ReduceOp, reduce_scalar};
use crate::transport::tcp::Connections;

type Conn = (TcpStream, usize, SocketAddr);

/// A connected pair of loopback sockets: (the dialling end, the accepted end), each with
/// the address of its other end.
fn socket_pair() -> ((TcpStream, SocketAddr), (TcpStream, SocketAddr)) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding a loopback listener");
    let addr = listener.local_addr().expect("listener address");
    let dialled = std::net::TcpStream::connect(addr).expect("dialling loopback");
    let (accepted, from) = listener.accept().expect("accepting on loopback");
    for s in [&dialled, &accepted] {
        s.set_nonblocking(true).expect("non-blocking socket");
    }
    (
        (TcpStream::from_std(dialled), addr),
        (TcpStream::from_std(accepted), from),
    )
}

/// The [`Formed`] meshes of `size` ranks with `connections` connections per neighbour, as
/// the bootstrap hands them over, without the handshake: rank `r` dials its right
/// neighbour's `C` connections and accepts its left neighbour's, and every other pair has
/// one connection.
pub(crate) fn loopback_mesh(size: usize, connections: usize, timeout: Duration) -> Vec<Formed> {
    let mut left: Vec<Vec<Conn>> = (0..size).map(|_| Vec::new()).collect();
    let mut right: Vec<Vec<Conn>> = (0..size).map(|_| Vec::new()).collect();
    let mut others: Vec<Vec<Conn>> = (0..size).map(|_| Vec::new()).collect();
    if size > 1 {
        for (r, right) in right.iter_mut().enumerate() {
            let next = (r + 1) % size;
            for _ in 0..connections {
                let ((d, daddr), (a, aaddr)) = socket_pair();
                right.push((d, next, daddr));
                left[next].push((a, r, aaddr));
            }
        }
    }
    for a in 0..size {
        for b in a + 1..size {
            let neighbours = b == a + 1 || (a == 0 && b == size - 1);
            if neighbours {
                continue;
            }
            let ((d, daddr), (s, saddr)) = socket_pair();
            others[a].push((d, b, daddr));
            others[b].push((s, a, saddr));
        }
    }
    let liveness = crate::transport::tcp::socket::Liveness::for_timeout(timeout);
    let mut formed = Vec::new();
    for (rank, ((l, r), o)) in left.into_iter().zip(right).zip(others).enumerate() {
        let poll = Poll::new().expect("a poller");
        let transport =
            Connections::mesh(poll, rank, size, l, r, o, &liveness).expect("a mesh transport");
        formed.push(Formed {
            transport,
            rank,
            size,
            peers: vec![
                Peer {
                    host: [0; 16],
                    capabilities: 0,
                };
                size
            ],
            local_ranks: size,
            group: [0; 32],
        });
    }
    formed
}

/// Native communicators for `size` ranks over loopback, on the driver
/// `NUVEC_DISTRIBUTED_IO` names (epoll if unset), as a bootstrap picks it: these tests run
/// on io_uring too.
pub(super) fn group(size: usize, connections: usize, timeout: Duration) -> Vec<Native> {
    let options = Options::default().timeout(timeout);
    loopback_mesh(size, connections, timeout)
        .into_iter()
        .map(|mut f| {
            f.transport
                .select_io(env::io(&env::process, options.io).expect("a valid event loop"))
                .expect("the driver the environment names");
            Native::new(f, &options).expect("a native communicator")
        })
        .collect()
}

/// Runs `f` on every rank, each on its own thread, and returns what each returned.
pub(super) fn on_ranks<T: Send>(ranks: &[Native], f: impl Fn(&Native) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let handles: Vec<_> = ranks.iter().map(|c| s.spawn(|| f(c))).collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a rank's thread"))
            .collect()
    })
}

/// Rank `rank`'s input for case `case`: random bits (NaNs, infinities and signed zeros
/// included for floats), except for bools, which are 0 or 1.
fn input(case: u64, rank: usize, dtype: DType, bytes: usize) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(case.wrapping_mul(1000).wrapping_add(rank as u64));
    let mut v = vec![0u8; bytes];
    rng.fill_bytes(&mut v);
    if dtype == DType::Bool {
        for b in &mut v {
            *b &= 1;
        }
    }
    v
}

/// The result every rank must hold: the inputs folded in rank order by the scalar kernel.
fn reference(op: ReduceOp, dtype: DType, inputs: &[Vec<u8>]) -> Vec<u8> {
    let mut acc = inputs[0].clone();
    for x in &inputs[1..] {
        reduce_scalar(op, dtype, &mut acc, x);
    }
    acc
}

/// The result recursive doubling and halving-doubling must give (see
/// `Exchange::doubling`): the balanced binary tree, in rank order, over the largest power
/// of two `pof2` not above P leaves, leaf `v` being `x(2v) op x(2v + 1)` for the first
/// `P - pof2` and `x(v + P - pof2)` after; every node folds its right subtree into its left
/// by the scalar kernel.
fn tree_reference(op: ReduceOp, dtype: DType, inputs: &[Vec<u8>]) -> Vec<u8> {
    nuvec_tools::testing::doubling_tree(inputs, |a, b| {
        let mut acc = a.clone();
        reduce_scalar(op, dtype, &mut acc, b);
        acc
    })
}

#[test]
fn the_tree_reference_is_the_documented_tree_at_six_ranks() {
    // ((x0 + x1) + (x2 + x3)) + (x4 + x5), in f32 where the order shows: 1e8 absorbs 1.
    let xs = [1e8f32, 1.0, -1e8, 1.0, 1.0, 1.0];
    let inputs: Vec<Vec<u8>> = xs.iter().map(|x| x.to_le_bytes().to_vec()).collect();
    let want = ((xs[0] + xs[1]) + (xs[2] + xs[3])) + (xs[4] + xs[5]);
    let got = tree_reference(ReduceOp::Sum, DType::F32, &inputs);
    assert_eq!(got, want.to_le_bytes());
    // The rank-order fold differs here, so the check can tell them apart.
    assert_ne!(reference(ReduceOp::Sum, DType::F32, &inputs), got);
}

/// The result the table's algorithm for these inputs must give over TCP: the rank-order
/// fold of the direct ones, or the tree of the log-round ones (not for the ring's sizes).
fn expected(op: ReduceOp, dtype: DType, inputs: &[Vec<u8>]) -> Vec<u8> {
    let bytes = inputs[0].len();
    match algorithm::all_reduce(Transport::Tcp, inputs.len(), bytes, bytes / dtype.size()) {
        AllReduce::RecursiveDoubling | AllReduce::HalvingDoubling => {
            tree_reference(op, dtype, inputs)
        }
        AllReduce::OneShot | AllReduce::ScatterGather | AllReduce::Ring => {
            reference(op, dtype, inputs)
        }
    }
}

/// Element counts around every switch between algorithms at `size` ranks.
fn counts(size: usize, dtype: DType) -> Vec<usize> {
    let e = dtype.size();
    let one_shot = algorithm::tcp_small_max(size);
    let mut counts = vec![1, size.saturating_sub(1).max(1), size + 1, 33];
    counts.extend([one_shot / e, one_shot / e + 1]);
    counts.extend([one_shot / e + size * 3 + 1]);
    counts
}

#[test]
fn every_op_and_dtype_reduces_in_rank_order_on_every_rank() {
    for (size, c) in [(1, 1), (2, 1), (3, 2), (4, 1), (5, 1), (8, 1)] {
        let ranks = group(size, c, Duration::from_secs(20));
        let mut case = 0u64;
        let mut plan = Vec::new();
        for dtype in DType::ALL {
            // At 8 ranks, fewer dtypes: the matrix's time is spent on sockets, not kernels.
            if size == 8 && !matches!(dtype, DType::F32 | DType::BF16 | DType::Bool) {
                continue;
            }
            for op in ReduceOp::ALL {
                for count in counts(size, dtype) {
                    case += 1;
                    plan.push((case, op, dtype, count));
                }
            }
        }
        let results = on_ranks(&ranks, |comm| {
            let mut hashes = Vec::with_capacity(plan.len());
            for &(case, op, dtype, count) in &plan {
                let bytes = count * dtype.size();
                let inputs: Vec<_> = (0..size).map(|r| input(case, r, dtype, bytes)).collect();
                let mut data = inputs[comm.rank()].clone();
                comm.all_reduce(op, dtype, &mut data).unwrap_or_else(|e| {
                    panic!("rank {}: {op:?} {dtype} x {count}: {e}", comm.rank())
                });
                let want = expected(op, dtype, &inputs);
                let e = dtype.size();
                let at = first_difference(op, dtype, &data, &want);
                assert!(
                    at.is_none(),
                    "rank {} of {size}: {op:?} {dtype} x {count} differs from the algorithm's \
                     fold at element {at:?}: {:02x?} vs {:02x?}",
                    comm.rank(),
                    at.map(|i| &data[i * e..(i + 1) * e]),
                    at.map(|i| &want[i * e..(i + 1) * e]),
                );
                // Whatever NaN a sum of NaNs gives, every rank must hold the same bits.
                let mut h = DefaultHasher::new();
                data.hash(&mut h);
                hashes.push(h.finish());
            }
            hashes
        });
        assert!(
            results
                .iter()
                .all(|h| h.len() == plan.len() && !h.is_empty())
        );
        assert!(
            results.iter().all(|h| *h == results[0]),
            "the ranks of {size} hold different bits"
        );
    }
}

/// The first element where `got` differs from the rank-order fold `want`, a sum's NaN
/// payload aside (see [`both_nan`]).
fn first_difference(op: ReduceOp, dtype: DType, got: &[u8], want: &[u8]) -> Option<usize> {
    let e = dtype.size();
    if got.len() != want.len() {
        return Some(got.len().min(want.len()) / e);
    }
    (0..got.len() / e).find(|&i| {
        let (g, w) = (&got[i * e..(i + 1) * e], &want[i * e..(i + 1) * e]);
        g != w && !(op == ReduceOp::Sum && both_nan(dtype, g, w))
    })
}

/// Whether `a` and `b` (one element of `dtype`) are both NaN in every component that
/// differs: a sum of two NaNs may carry either's payload (see the README's Semantics), and
/// the scalar reference and a SIMD kernel may pick differently (aarch64 does).
fn both_nan(dtype: DType, a: &[u8], b: &[u8]) -> bool {
    let nan = |x: &[u8]| -> bool {
        match x.len() {
            2 if dtype == DType::F16 => f16::from_bits(u16::from_le_bytes([x[0], x[1]])).is_nan(),
            2 => bf16::from_bits(u16::from_le_bytes([x[0], x[1]])).is_nan(),
            4 => f32::from_le_bytes(x.try_into().unwrap()).is_nan(),
            8 => f64::from_le_bytes(x.try_into().unwrap()).is_nan(),
            _ => false,
        }
    };
    let width = match dtype {
        DType::F16 | DType::BF16 => 2,
        DType::F32 | DType::Complex64 => 4,
        DType::F64 => 8,
        _ => return false,
    };
    a.chunks(width)
        .zip(b.chunks(width))
        .all(|(x, y)| x == y || (nan(x) && nan(y)))
}

/// Every all-reduce algorithm the native path has.
const ALGORITHMS: [AllReduce; 5] = [
    AllReduce::OneShot,
    AllReduce::ScatterGather,
    AllReduce::Ring,
    AllReduce::RecursiveDoubling,
    AllReduce::HalvingDoubling,
];

/// Asserts that every rank's results (one entry per rank) are rank 0's, bit for bit.
fn assert_every_rank_agrees(results: &[Vec<Vec<u8>>]) {
    for (r, result) in results.iter().enumerate().skip(1) {
        assert!(
            *result == results[0],
            "rank {r} differs from rank 0 at P = {}",
            results.len()
        );
    }
}

#[test]
fn large_all_reduces_take_the_ring_and_agree_bit_for_bit() {
    for size in [2, 3] {
        let ranks = group(size, 2, Duration::from_secs(20));
        let results = on_ranks(&ranks, |comm| {
            let mut out = Vec::new();
            // Either side of the switch to the ring, and well past it.
            for (case, dtype, elems) in [
                (1, DType::I32, TCP_RING_MIN / 4 - 1),
                (2, DType::I32, TCP_RING_MIN / 4),
                (3, DType::I32, 3 * TCP_RING_MIN / 4 + 5),
                (4, DType::F32, 3 * TCP_RING_MIN / 4 + 5),
            ] {
                let inputs: Vec<_> = (0..size)
                    .map(|r| input(case, r, dtype, elems * 4))
                    .collect();
                let mut data = inputs[comm.rank()].clone();
                comm.all_reduce(ReduceOp::Sum, dtype, &mut data)
                    .unwrap_or_else(|e| panic!("rank {}: {e}", comm.rank()));
                if dtype == DType::I32 {
                    // Integer sums do not depend on the order: the ring's must equal the fold.
                    assert!(data == reference(ReduceOp::Sum, dtype, &inputs));
                }
                out.push(data);
            }
            out
        });
        assert_every_rank_agrees(&results);
    }
}

#[test]
fn gather_scatter_barrier_and_messages_between_any_two_ranks() {
    // 5 and 6: all_gather and barrier by recursive doubling, with hand-ins.
    for size in [1, 2, 3, 5, 6] {
        let ranks = group(size, 1, Duration::from_secs(20));
        on_ranks(&ranks, |comm| {
            let me = comm.rank();
            for (case, nbytes) in [(1u64, 0usize), (2, 5), (3, 40_000)] {
                let mut out = vec![0u8; nbytes * size];
                comm.all_gather(&input(case, me, DType::U8, nbytes), &mut out)
                    .unwrap_or_else(|e| panic!("rank {me}: all_gather: {e}"));
                let want: Vec<u8> = (0..size)
                    .flat_map(|r| input(case, r, DType::U8, nbytes))
                    .collect();
                assert!(out == want, "rank {me}: all_gather of {nbytes}");
            }
            for (case, chunk) in [(4u64, 1usize), (5, 3000)] {
                let dtype = DType::F32;
                let bytes = chunk * 4;
                let inputs: Vec<_> = (0..size)
                    .map(|r| input(case, r, dtype, bytes * size))
                    .collect();
                let mut out = vec![0u8; bytes];
                comm.sum_scatter(dtype, &inputs[me], &mut out)
                    .unwrap_or_else(|e| panic!("rank {me}: sum_scatter: {e}"));
                let mine: Vec<_> = inputs
                    .iter()
                    .map(|x| x[me * bytes..(me + 1) * bytes].to_vec())
                    .collect();
                let want = reference(ReduceOp::Sum, dtype, &mine);
                let at = first_difference(ReduceOp::Sum, dtype, &out, &want);
                assert!(
                    at.is_none(),
                    "rank {me}: sum_scatter differs at element {at:?}"
                );
            }
            comm.barrier()
                .unwrap_or_else(|e| panic!("rank {me}: barrier: {e}"));
            // Every ordered pair, in a fixed order every rank follows: lower sender first.
            for src in 0..size {
                for dst in 0..size {
                    if src == dst {
                        continue;
                    }
                    let msg = input(src as u64 * 10 + dst as u64, src, DType::U8, 1000 + dst);
                    if me == src {
                        comm.send(&msg, dst)
                            .unwrap_or_else(|e| panic!("{src} -> {dst}: {e}"));
                    } else if me == dst {
                        let mut got = vec![0u8; msg.len()];
                        comm.recv(&mut got, src)
                            .unwrap_or_else(|e| panic!("{src} -> {dst}: {e}"));
                        assert!(got == msg, "{src} -> {dst}: wrong bytes");
                    }
                }
            }
            comm.barrier()
                .unwrap_or_else(|e| panic!("rank {me}: barrier: {e}"));
        });
    }
}

/// The flight record names the algorithm of each call as the table's rows at P = 4 over
/// TCP take it (see `comm::algorithm`), and none for a send or receive.
#[test]
fn the_flight_record_names_the_algorithm_each_call_took() {
    let groups: Vec<crate::Group> = group(4, 1, Duration::from_secs(20))
        .into_iter()
        .map(|n| crate::Group::with_options(std::sync::Arc::new(n), &Options::default()))
        .collect();
    let records = std::thread::scope(|s| {
        let handles: Vec<_> = groups
            .iter()
            .map(|g| {
                s.spawn(move || {
                    let me = g.rank();
                    let fail = |what: &str, e: Error| panic!("rank {me}: {what}: {e}");
                    // 4 B, 64 KiB and 1 MiB: recursive doubling, halving-doubling, the ring.
                    for elems in [1, 16 << 10, TCP_RING_MIN / 4] {
                        g.all_sum(&mut vec![1.0f32; elems])
                            .unwrap_or_else(|e| fail("all_sum", e));
                    }
                    g.barrier().unwrap_or_else(|e| fail("barrier", e));
                    g.all_gather(&[me as u8], &mut [0u8; 4])
                        .unwrap_or_else(|e| fail("all_gather", e));
                    g.broadcast(&mut [0u32; 4], 1)
                        .unwrap_or_else(|e| fail("broadcast", e));
                    g.sum_scatter(&[1i64; 8], &mut [0i64; 2])
                        .unwrap_or_else(|e| fail("sum_scatter", e));
                    match me {
                        0 => g.send(&[1u8; 3], 1).unwrap_or_else(|e| fail("send", e)),
                        1 => g.recv(&mut [0u8; 3], 0).unwrap_or_else(|e| fail("recv", e)),
                        _ => {}
                    }
                    g.flight_record()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a rank's thread"))
            .collect::<Vec<_>>()
    });
    let collectives = [
        "recursive_doubling",
        "halving_doubling",
        "ring",
        "recursive_doubling",
        "direct",
        "direct",
        "direct",
    ];
    for record in &records {
        let names: Vec<Option<&str>> = record
            .entries
            .iter()
            .map(|e| e.algorithm.map(crate::Algorithm::name))
            .collect();
        let mut want: Vec<Option<&str>> = collectives.iter().copied().map(Some).collect();
        if record.rank < 2 {
            want.push(None);
        }
        assert_eq!(names, want, "rank {}", record.rank);
    }
}

#[test]
fn every_algorithm_at_any_size_gives_identical_bits_on_every_rank() {
    // 6: two ranks past the largest power of two hand in and take out.
    for size in [2, 3, 4, 6] {
        let ranks = group(size, 2, Duration::from_secs(20));
        let mut plan = Vec::new();
        let mut case = 500;
        for algorithm in ALGORITHMS {
            for count in [1, size, 3 * size + 1, 5000] {
                for (op, dtype) in [
                    (ReduceOp::Max, DType::F32),
                    (ReduceOp::Min, DType::BF16),
                    (ReduceOp::Sum, DType::I64),
                    (ReduceOp::Sum, DType::F16),
                ] {
                    case += 1;
                    plan.push((case, algorithm, op, dtype, count));
                }
            }
        }
        let results = on_ranks(&ranks, |comm| {
            let mut out = Vec::new();
            for &(case, algorithm, op, dtype, count) in &plan {
                let bytes = count * dtype.size();
                let inputs: Vec<_> = (0..size).map(|r| input(case, r, dtype, bytes)).collect();
                let mut data = inputs[comm.rank()].clone();
                comm.all_reduce_by(algorithm, op, dtype, &mut data)
                    .unwrap_or_else(|e| panic!("rank {}: {algorithm:?}: {e}", comm.rank()));
                // The ring folds in its own (fixed) order: only the direct ones must equal
                // the rank-order fold bit for bit (the log-round ones their tree), and every
                // one must equal it for integers.
                let want = match algorithm {
                    AllReduce::RecursiveDoubling | AllReduce::HalvingDoubling => {
                        Some(tree_reference(op, dtype, &inputs))
                    }
                    AllReduce::Ring if dtype != DType::I64 => None,
                    _ => Some(reference(op, dtype, &inputs)),
                };
                if let Some(want) = want {
                    let at = first_difference(op, dtype, &data, &want);
                    assert!(
                        at.is_none(),
                        "rank {}: {algorithm:?} {op:?} {dtype} x {count} differs at element {at:?}",
                        comm.rank()
                    );
                }
                out.push(data);
            }
            out
        });
        assert_every_rank_agrees(&results);
    }
}

/// Times each algorithm at sizes around the thresholds, on loopback, in this process (P
/// threads share the machine's CPUs, so the figures are relative, not a benchmark).
/// `NUVEC_MEASURE_RANKS` (say `5,8`) picks the group sizes; 2, 3, 4, 6 and 8 otherwise.
#[test]
#[ignore = "a measurement that prints timings, run by hand to set the thresholds"]
fn measure_the_algorithms() {
    // The header's own cost: encode on one side, decode and compare on the other.
    let call = Call::group(0, Kind::AllReduce(ReduceOp::Sum, DType::F32), 1);
    let rounds = 1_000_000u32;
    let t = Instant::now();
    for seq in 0..rounds {
        let mine = Call::group(seq, call.header.kind, 1);
        let bytes = std::hint::black_box(mine.header.encode());
        mine.check(0, 1, &bytes).expect("equal headers");
    }
    println!("header encode + check: {:?} each", t.elapsed() / rounds);
    println!(
        "busy-poll TCP round trip, 4 B: {:?}",
        tcp_round_trip(4, 2000)
    );
    let sizes: Vec<usize> = std::env::var("NUVEC_MEASURE_RANKS")
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![2, 3, 4, 6, 8]);
    for size in sizes {
        let ranks = group(size, 1, Duration::from_secs(20));
        for bytes in [
            4usize,
            8 << 10,
            64 << 10,
            256 << 10,
            1 << 20,
            4 << 20,
            16 << 20,
        ] {
            let iterations = (4usize << 20).div_ceil(bytes).clamp(5, 200);
            for algorithm in ALGORITHMS {
                let medians = on_ranks(&ranks, |comm| {
                    let mut data = vec![0u8; bytes];
                    let mut times = Vec::with_capacity(iterations);
                    // The first calls of a shape reserve staging and warm the caches.
                    for _ in 0..3 {
                        comm.all_reduce_by(algorithm, ReduceOp::Sum, DType::F32, &mut data)
                            .expect("a warm-up all_sum");
                    }
                    for _ in 0..iterations {
                        let t = Instant::now();
                        comm.all_reduce_by(algorithm, ReduceOp::Sum, DType::F32, &mut data)
                            .expect("a measured all_sum");
                        times.push(t.elapsed());
                    }
                    times.sort();
                    times[times.len() / 2]
                });
                println!("P={size} {bytes:>9} B {algorithm:?}: {:?}", medians[0]);
            }
        }
    }
}

/// The median round trip of `bytes` between two threads over loopback, both busy-polling
/// non-blocking sockets: the floor a P = 2 all_sum is compared with.
fn tcp_round_trip(bytes: usize, rounds: usize) -> Duration {
    use std::io::{ErrorKind, Read, Write};
    let ((a, _), (b, _)) = socket_pair();
    let mut a = std::net::TcpStream::from(std::os::fd::OwnedFd::from(a));
    let mut b = std::net::TcpStream::from(std::os::fd::OwnedFd::from(b));
    for s in [&a, &b] {
        s.set_nodelay(true).expect("nodelay");
    }
    fn exact(s: &mut std::net::TcpStream, buf: &mut [u8], write: bool) {
        let mut done = 0;
        while done < buf.len() {
            let r = if write {
                s.write(&buf[done..])
            } else {
                s.read(&mut buf[done..])
            };
            match r {
                Ok(n) => done += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => std::hint::spin_loop(),
                Err(e) => panic!("loopback: {e}"),
            }
        }
    }
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut buf = vec![0u8; bytes];
            for _ in 0..rounds {
                exact(&mut b, &mut buf, false);
                exact(&mut b, &mut buf, true);
            }
        });
        let mut buf = vec![0u8; bytes];
        let mut times = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let t = Instant::now();
            exact(&mut a, &mut buf, true);
            exact(&mut a, &mut buf, false);
            times.push(t.elapsed());
        }
        times.sort();
        times[rounds / 2]
    })
}

/// What one rank calls in a mismatch test.
#[derive(Clone, Copy, Debug)]
enum Op {
    Reduce(ReduceOp, DType, usize),
    Gather(usize),
    Barrier,
}

fn call(comm: &Native, op: Op) -> Result<(), Error> {
    match op {
        Op::Reduce(op, dtype, count) => {
            comm.all_reduce(op, dtype, &mut vec![0u8; count * dtype.size()])
        }
        Op::Gather(n) => comm.all_gather(&vec![0u8; n], &mut vec![0u8; n * comm.size()]),
        Op::Barrier => comm.barrier(),
    }
}

/// Runs `good` good all_sums on `size` ranks, then `normal` on every rank but `odd_rank`,
/// which calls `odd`. The odd rank and its first partner (the rank before it; rank 1 for
/// rank 0) must fail with a mismatch naming both calls and the call's number, every other
/// rank on what their failure closed, naming a peer; every rank within a second, and the
/// group failed after.
fn mismatch(
    size: usize,
    odd_rank: usize,
    good: usize,
    (normal, odd, names): (Op, Op, (&str, &str)),
) {
    let partner = if odd_rank == 0 { 1 } else { odd_rank - 1 };
    let ranks = group(size, 1, Duration::from_secs(20));
    let start = Barrier::new(size);
    let outcomes = on_ranks(&ranks, |comm| {
        for _ in 0..good {
            comm.all_reduce(ReduceOp::Sum, DType::F32, &mut [0u8; 4])
                .expect("a good call");
        }
        start.wait();
        let began = Instant::now();
        let mine = if comm.rank() == odd_rank { odd } else { normal };
        let e = call(comm, mine).expect_err("a mismatched call must fail");
        let took = began.elapsed();
        let later = comm
            .barrier()
            .expect_err("a failed group refuses later calls");
        (e, took, later)
    });
    for (rank, (e, took, later)) in outcomes.into_iter().enumerate() {
        let msg = e.to_string();
        if rank == odd_rank || rank == partner {
            assert!(
                matches!(e, Error::Mismatch { .. }),
                "rank {rank} of {size}: {msg}"
            );
            assert!(
                msg.contains(names.0) && msg.contains(names.1) && msg.contains(&format!("#{good}")),
                "rank {rank} of {size}: {msg}"
            );
        } else {
            assert!(e.peer().is_some(), "rank {rank} of {size}: {msg}");
        }
        assert!(took < Duration::from_secs(1), "rank {rank} took {took:?}");
        assert!(matches!(later, Error::Failed(_)), "rank {rank}: {later}");
    }
}

#[test]
fn every_kind_of_mismatch_fails_every_rank_at_once() {
    use ReduceOp::{Max, Sum};
    let f32s = |n| Op::Reduce(Sum, DType::F32, n);
    let cases = [
        (
            f32s(10),
            f32s(20),
            ("all_sum float32 x 10", "all_sum float32 x 20"),
        ),
        (
            f32s(10),
            Op::Reduce(Sum, DType::I32, 10),
            ("float32 x 10", "all_sum int32 x 10"),
        ),
        (
            f32s(10),
            Op::Reduce(Max, DType::F32, 10),
            ("all_sum float32", "all_max float32"),
        ),
        (
            f32s(10),
            Op::Gather(40),
            ("all_sum float32 x 10", "all_gather of 40 bytes"),
        ),
        (Op::Barrier, f32s(1), ("barrier", "all_sum float32 x 1")),
        // Different lengths pick different algorithms; the header is still read first.
        (f32s(4), f32s(200_000), ("x 4", "x 200000")),
        // One side takes the ring, which starts with a round of headers.
        (
            f32s(4),
            f32s(TCP_RING_MIN / 4 + 1),
            ("x 4", "all_sum float32 x 262145"),
        ),
        // Both take the ring: its round of headers finds the difference before data moves.
        (
            f32s(TCP_RING_MIN / 4 + 1),
            Op::Reduce(Sum, DType::I32, TCP_RING_MIN / 4 + 1),
            ("all_sum float32 x 262145", "all_sum int32 x 262145"),
        ),
    ];
    // From three ranks the small all-reduces and the barrier go by recursive doubling,
    // where only the ranks that meet the odd one compare calls with it (the next test).
    for case in cases {
        for good in [0, 1000] {
            mismatch(2, 1, good, case);
        }
    }
}

/// From three ranks the log-round algorithms compare calls with each partner only: the
/// odd rank and its first partner fail with a mismatch naming both calls (the last rank
/// and the one before it; rank 0, which hands its vector in or meets rank 1 first, and
/// rank 1, which answers with its header), and every other rank fails within a second on
/// what their failure closed, naming a peer; every group is failed after.
#[test]
fn a_mismatch_in_log_rounds_fails_every_rank_at_once() {
    use ReduceOp::Sum;
    let f32s = |n| Op::Reduce(Sum, DType::F32, n);
    let cases = [
        // Recursive doubling on both sides.
        (f32s(10), f32s(20), ("x 10", "x 20")),
        // Recursive doubling against halving-doubling (the direct reduce-scatter +
        // all-gather at P = 3).
        (f32s(4), f32s(200_000), ("x 4", "x 200000")),
        // A barrier against an all-reduce.
        (Op::Barrier, f32s(1), ("barrier", "all_sum float32 x 1")),
        // Both take the ring: its barrier finds the difference before data moves.
        (
            f32s(TCP_RING_MIN / 4 + 1),
            Op::Reduce(Sum, DType::I32, TCP_RING_MIN / 4 + 1),
            ("all_sum float32 x 262145", "all_sum int32 x 262145"),
        ),
    ];
    for (size, odd_rank) in [
        (3, 2),
        (4, 3),
        (5, 4),
        (6, 5),
        (3, 0),
        (4, 0),
        (5, 0),
        (6, 0),
    ] {
        for case in cases {
            mismatch(size, odd_rank, 1, case);
        }
    }
}

/// Rank 0 sends 8 bytes twice to rank 1, which takes the first and refuses the second
/// with a recv of 12; the other ranks call `barrier`. Checks that rank 0 and rank 1 fail
/// naming the mismatch (rank 1 also what differs), and returns every rank's error and how
/// long its calls took. Rank 0's barrier meets rank 1 by every barrier algorithm (in
/// recursive doubling, its first partner), so it hears the refusal.
pub(super) fn recv_of_another_length(ranks: &[Native]) -> Vec<(Error, Duration)> {
    let size = ranks.len();
    let dst = 1;
    let expected = format!(
        "send/recv #1: rank 0 called send of 8 bytes to rank {dst}, rank {dst} called recv \
         of 12 bytes from rank 0"
    );
    let outcomes = on_ranks(ranks, |comm| {
        let began = Instant::now();
        let e = match comm.rank() {
            0 => {
                comm.send(&[1; 8], dst).expect("first send");
                // Not acknowledged, so it returns; the next call learns of the refusal.
                comm.send(&[1; 8], dst).expect("second send");
                comm.barrier().expect_err("after a refused send")
            }
            r if r == dst => {
                comm.recv(&mut [0; 8], 0).expect("first recv");
                comm.recv(&mut [0; 12], 0)
                    .expect_err("a recv of another length")
            }
            _ => comm
                .barrier()
                .expect_err("a barrier without the failed rank"),
        };
        (e, began.elapsed())
    });
    // The receiver compares the headers and says what differs; the sender learns of the
    // refusal from the receiver's answer, which carries the calls only.
    let differs = format!("; the byte count differs (rank 0: 8, rank {dst}: 12)");
    assert_eq!(outcomes[0].0.to_string(), expected, "rank 0 of {size}");
    assert_eq!(
        outcomes[dst].0.to_string(),
        format!("{expected}{differs}"),
        "rank {dst} of {size}"
    );
    outcomes
}

/// A `send` returns before the receiver looks at it (it is not acknowledged); the
/// receiver that refuses it fails at once, and answers, so the sender's next call fails
/// with the same mismatch.
#[test]
fn a_recv_of_another_length_fails_the_receiver_and_then_the_sender() {
    for size in [2, 3, 4] {
        let ranks = group(size, 1, Duration::from_secs(20));
        for (rank, (e, took)) in recv_of_another_length(&ranks).iter().enumerate() {
            assert!(
                *took < Duration::from_secs(2),
                "rank {rank}: {e} after {took:?}"
            );
        }
    }
}

#[test]
fn a_rank_that_dies_mid_call_is_named() {
    let mut ranks = group(3, 1, Duration::from_secs(10));
    let dead = ranks.pop().expect("three ranks");
    let outcomes = std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .iter()
            .map(|c| s.spawn(|| c.all_reduce(ReduceOp::Sum, DType::F32, &mut vec![0u8; 400])))
            .collect();
        std::thread::sleep(Duration::from_millis(50));
        drop(dead);
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect::<Vec<_>>()
    });
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        let e = outcome.expect_err("the call cannot complete");
        assert_eq!(e.peer(), Some(2), "rank {rank}: {e}");
    }
}

#[test]
fn a_rank_that_never_calls_is_named_after_the_timeout() {
    // Rank 2 of 4 is alive (its sockets are open) but never calls: its kernel takes the
    // bytes, its process never answers, and the others' inquiry finds it silent.
    let timeout = Duration::from_millis(800);
    let ranks = group(4, 1, timeout);
    let began = Instant::now();
    let outcomes = on_ranks(&ranks, |comm| {
        if comm.rank() == 2 {
            std::thread::sleep(3 * timeout);
            return None;
        }
        Some(comm.all_reduce(ReduceOp::Sum, DType::F32, &mut [0u8; 64]))
    });
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        let Some(outcome) = outcome else { continue };
        let e = outcome.expect_err("nobody can finish without rank 2");
        assert_eq!(e.peer(), Some(2), "rank {rank}: {e}");
    }
    assert!(began.elapsed() < 4 * timeout);
}

#[test]
fn health_names_a_peer_that_went_away_and_fails_the_group() {
    let mut ranks = group(3, 1, Duration::from_secs(10));
    on_ranks(&ranks, |comm| {
        comm.health().expect("every connection is up")
    });
    drop(ranks.pop());
    let e = ranks[0]
        .health()
        .expect_err("rank 2 closed its connections");
    assert_eq!(e.peer(), Some(2), "{e}");
    assert!(matches!(ranks[0].barrier(), Err(Error::Failed(_))));
}

#[test]
fn collectives_of_a_shape_seen_before_allocate_no_staging_or_plan_storage() {
    // 3: the direct algorithms; 6: the log-round ones, with hand-ins.
    for size in [3, 6] {
        shapes_seen_before_allocate_nothing(size);
    }
}

fn shapes_seen_before_allocate_nothing(size: usize) {
    let ranks = group(size, 1, Duration::from_secs(10));
    let footprint = |comm: &Native| {
        let state = comm.state.lock().expect("a usable group");
        (
            state.stage.as_ptr() as usize,
            state.stage.capacity(),
            state.exchange.capacity(),
        )
    };
    let shapes = |comm: &Native| {
        let p = comm.size();
        for bytes in [4, 64 << 10, 8 << 10] {
            let mut data = vec![0u8; bytes];
            comm.all_reduce(ReduceOp::Sum, DType::F32, &mut data)
                .expect("all_sum");
            comm.all_gather(&data[..bytes / 4], &mut vec![0u8; bytes / 4 * p])
                .expect("all_gather");
            comm.sum_scatter(DType::F32, &vec![0u8; bytes * p], &mut data)
                .expect("sum_scatter");
        }
        comm.barrier().expect("barrier");
    };
    let results = on_ranks(&ranks, |comm| {
        shapes(comm);
        let warm = footprint(comm);
        for _ in 0..3 {
            shapes(comm);
        }
        (warm, footprint(comm))
    });
    for (rank, (warm, after)) in results.into_iter().enumerate() {
        assert!(
            warm.1 > 0,
            "rank {rank}: the direct algorithms staged something"
        );
        assert_eq!(warm, after, "rank {rank}: storage was reallocated");
    }
}

#[test]
fn close_from_another_thread_aborts_a_call_in_flight() {
    let ranks = group(2, 1, Duration::from_secs(30));
    let began = Instant::now();
    let e = std::thread::scope(|s| {
        let waiting = s.spawn(|| ranks[0].all_reduce(ReduceOp::Sum, DType::F32, &mut [0u8; 4]));
        std::thread::sleep(Duration::from_millis(100));
        ranks[0].close().expect("close");
        waiting.join().expect("rank thread")
    });
    assert!(matches!(e, Err(Error::Aborted { .. })), "{e:?}");
    assert!(began.elapsed() < Duration::from_secs(5));
    assert!(matches!(ranks[0].barrier(), Err(Error::GroupClosed)));
}

// ---- The simulator: the protocol over byte queues, cut at random. ----

/// How the simulator cuts a run: transfers of at most `max` bytes, ranks visited in an
/// order drawn from `seed` (which a test may also draw its inputs from).
#[derive(Clone, Copy, Debug)]
struct Cuts {
    seed: u64,
    max: usize,
}

/// Any seed, with transfers of at most `maxes` bytes.
fn cuts(maxes: std::ops::Range<usize>) -> impl Strategy<Value = Cuts> {
    (any::<u64>(), maxes).prop_map(|(seed, max)| Cuts { seed, max })
}

/// Runs one exchange per rank over queues that move bytes as `cuts` says, visiting ranks
/// in a random order. Returns each rank's outcome.
fn simulate(
    exchanges: &mut [Exchange],
    data: &mut [Vec<u8>],
    inputs: &[Vec<u8>],
    cuts: Cuts,
) -> Vec<Result<(), Error>> {
    let live = vec![true; exchanges.len()];
    simulate_live(exchanges, data, inputs, cuts, &live, 1_000_000)
        .into_iter()
        .map(|o| o.expect("the simulation ends: no rank waits for ever"))
        .collect()
}

/// [`simulate`] for at most `visits` visits, running only the ranks `live` names (the
/// others never call): each rank's outcome, `None` for a rank that had not finished.
fn simulate_live(
    exchanges: &mut [Exchange],
    data: &mut [Vec<u8>],
    inputs: &[Vec<u8>],
    Cuts { seed, max }: Cuts,
    live: &[bool],
    visits: usize,
) -> Vec<Option<Result<(), Error>>> {
    let size = exchanges.len();
    let mut rng = StdRng::seed_from_u64(seed);
    // queues[from][to]
    let mut queues: Vec<Vec<std::collections::VecDeque<u8>>> = (0..size)
        .map(|_| (0..size).map(|_| Default::default()).collect())
        .collect();
    let mut stages: Vec<Vec<u8>> = exchanges.iter().map(|x| vec![0u8; x.staging()]).collect();
    let mut outcome: Vec<Option<Result<(), Error>>> = (0..size).map(|_| None).collect();
    for _visit in 0..visits {
        if outcome.iter().zip(live).all(|(o, &l)| o.is_some() || !l) {
            break;
        }
        let r = (rng.next_u64() % size as u64) as usize;
        if outcome[r].is_some() || !live[r] {
            continue;
        }
        let x = &mut exchanges[r];
        let mut mem = Memory {
            data: &mut data[r],
            input: &inputs[r],
            stage: &mut stages[r],
        };
        for i in 0..x.outs() {
            let peer = x.out_peer(i);
            if let Some((_, head, body)) = x.poll_transmit(i, &mem) {
                // A header goes out whole with the first write, as the engine's vectored
                // write into an idle socket does; the data is cut anywhere.
                let n = (1 + (rng.next_u64() as usize) % max)
                    .max(head.len())
                    .min(head.len() + body.len());
                let q = &mut queues[r][peer];
                let h = n.min(head.len());
                q.extend(&head[..h]);
                q.extend(&body[..n - h]);
                x.handle_sent(i, n);
            }
        }
        let mut failed = None;
        for i in 0..x.ins() {
            let peer = x.in_peer(i);
            if let Some((_, target)) = x.poll_receive(i, &mut mem) {
                let q = &mut queues[peer][r];
                let n = (1 + (rng.next_u64() as usize) % max)
                    .min(target.len())
                    .min(q.len());
                for (t, b) in target[..n].iter_mut().zip(q.drain(..n)) {
                    *t = b;
                }
                if n > 0
                    && let Err(e) = x.handle_received(i, n, &mem)
                {
                    failed = Some(e);
                    break;
                }
            }
        }
        x.complete(&mut mem);
        if let Some(e) = failed {
            outcome[r] = Some(Err(e));
        } else if x.is_finished() {
            outcome[r] = Some(Ok(()));
        }
    }
    outcome
}

/// One all-reduce for `all_reduce_gives`: `count` elements of `reduce` on each of `size`
/// ranks, simulated as `cuts` says.
#[derive(Clone, Copy, Debug)]
struct AllReduceCase {
    size: usize,
    count: usize,
    reduce: (ReduceOp, DType),
    cuts: Cuts,
}

/// All-reduce cases of `sizes` ranks and `counts` elements, pieces of at most `maxes`
/// bytes, for every op and a few dtypes.
fn all_reduce_cases(
    sizes: std::ops::Range<usize>,
    counts: std::ops::Range<usize>,
    maxes: std::ops::Range<usize>,
) -> impl Strategy<Value = AllReduceCase> {
    let dtypes = vec![
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I8,
        DType::F64,
        DType::Complex64,
    ];
    (
        sizes,
        counts,
        prop::sample::select(ReduceOp::ALL.to_vec()),
        prop::sample::select(dtypes),
        cuts(maxes),
    )
        .prop_map(|(size, count, op, dtype, cuts)| AllReduceCase {
            size,
            count,
            reduce: (op, dtype),
            cuts,
        })
}

/// Runs all-reduce `algorithm` of `case` on every rank's exchange under the simulator, and
/// checks that every rank holds rank 0's bits and that they equal `reference`'s, NaN sums
/// matching NaN sums (see `first_difference`).
fn all_reduce_gives(
    algorithm: AllReduce,
    case: AllReduceCase,
    reference: fn(ReduceOp, DType, &[Vec<u8>]) -> Vec<u8>,
) -> Result<(), TestCaseError> {
    let AllReduceCase {
        size,
        count,
        reduce: (op, dtype),
        cuts,
    } = case;
    let bytes = count * dtype.size();
    let inputs: Vec<_> = (0..size)
        .map(|r| input(cuts.seed, r, dtype, bytes))
        .collect();
    let mut data = inputs.clone();
    let call = Call::group(7, Kind::AllReduce(op, dtype), count as u64);
    let mut xs: Vec<Exchange> = (0..size).map(|_| Exchange::default()).collect();
    for (r, x) in xs.iter_mut().enumerate() {
        x.all_reduce(
            Caller::new(&Direct, r, size, &call),
            algorithm,
            case.reduce,
            bytes,
        );
    }
    let none: Vec<Vec<u8>> = vec![Vec::new(); size];
    let outcome = simulate(&mut xs, &mut data, &none, cuts);
    prop_assert!(outcome.iter().all(Result::is_ok), "{outcome:?}");
    let want = reference(op, dtype, &inputs);
    for (r, d) in data.iter().enumerate() {
        prop_assert!(
            *d == data[0],
            "rank {} of {}: other bits than rank 0's",
            r,
            size
        );
        let at = first_difference(op, dtype, d, &want);
        prop_assert!(at.is_none(), "rank {} of {}: element {:?}", r, size, at);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Both direct all-reduces, cut into arbitrary pieces, give the rank-order fold on
    /// every rank, for every op (max/min with NaNs included) and a few dtypes.
    #[test]
    fn direct_all_reduces_give_the_rank_order_fold(
        algorithm in prop::sample::select(vec![AllReduce::OneShot, AllReduce::ScatterGather]),
        case in all_reduce_cases(2..6, 1..300, 1..64),
    ) {
        // A NaN sum's payload is the compiler's choice: at opt-level 1 the scalar reference
        // kept another rank's than the kernel (complex64), so NaNs match NaNs in
        // `all_reduce_gives`; every rank holding the same bits is checked there.
        all_reduce_gives(algorithm, case, reference)?;
    }

    /// Recursive doubling and halving-doubling, cut into arbitrary pieces, give the tree
    /// of `Exchange::doubling` on every rank, bit for bit, at every P from 2 to 16 (the
    /// ranks past the largest power of two handing in and taking out), for every op (NaNs
    /// included) and a few dtypes, with counts below and above P (empty blocks).
    #[test]
    fn log_round_all_reduces_give_the_tree(
        algorithm in prop::sample::select(vec![
            AllReduce::RecursiveDoubling,
            AllReduce::HalvingDoubling,
        ]),
        case in all_reduce_cases(2..17, 1..200, 1..96),
    ) {
        all_reduce_gives(algorithm, case, tree_reference)?;
    }

    /// The recursive-doubling barrier: with every rank present every rank finishes; with
    /// one rank absent, no rank does (each waits, through its partners, on every other).
    #[test]
    fn the_doubling_barrier_waits_for_every_rank(
        size in 2usize..17,
        absent in 0usize..16,
        cuts in cuts(1..32),
    ) {
        let call = Call::group(4, Kind::Barrier, 0);
        let plan = |xs: &mut Vec<Exchange>| {
            for (r, x) in xs.iter_mut().enumerate() {
                x.barrier_doubling(Caller::new(&Direct, r, size, &call));
            }
        };
        let mut xs: Vec<Exchange> = (0..size).map(|_| Exchange::default()).collect();
        plan(&mut xs);
        let mut data: Vec<Vec<u8>> = vec![Vec::new(); size];
        let none: Vec<Vec<u8>> = vec![Vec::new(); size];
        let outcome = simulate(&mut xs, &mut data, &none, cuts);
        prop_assert!(outcome.iter().all(Result::is_ok), "{outcome:?}");
        let absent = absent % size;
        let live: Vec<bool> = (0..size).map(|r| r != absent).collect();
        let mut xs: Vec<Exchange> = (0..size).map(|_| Exchange::default()).collect();
        plan(&mut xs);
        let outcome = simulate_live(&mut xs, &mut data, &none, cuts, &live, 20_000);
        for (r, o) in outcome.iter().enumerate() {
            prop_assert!(o.is_none(), "rank {} of {} finished without rank {}", r, size, absent);
        }
    }

    /// all_gather by recursive doubling, cut into arbitrary pieces, puts every rank's
    /// block in place on every rank, at every P from 2 to 16, empty blocks included.
    #[test]
    fn all_gather_by_doubling_gives_every_block(
        size in 2usize..17,
        nbytes in 0usize..100,
        cuts in cuts(1..64),
    ) {
        let call = Call::group(2, Kind::AllGather, nbytes as u64);
        let inputs: Vec<_> = (0..size).map(|r| input(cuts.seed, r, DType::U8, nbytes)).collect();
        let mut xs: Vec<Exchange> = (0..size).map(|_| Exchange::default()).collect();
        let mut data = Vec::new();
        for (r, x) in xs.iter_mut().enumerate() {
            x.all_gather_doubling(Caller::new(&Direct, r, size, &call), nbytes);
            // The caller's copy of its own block.
            let mut out = vec![0xAB; nbytes * size];
            out[r * nbytes..(r + 1) * nbytes].copy_from_slice(&inputs[r]);
            data.push(out);
        }
        let outcome = simulate(&mut xs, &mut data, &inputs, cuts);
        prop_assert!(outcome.iter().all(Result::is_ok), "{outcome:?}");
        let want: Vec<u8> = inputs.concat();
        for (r, d) in data.iter().enumerate() {
            prop_assert!(*d == want, "rank {} of {}", r, size);
        }
    }

    /// A rank whose all_gather differs in length meets its first partner, both find the
    /// mismatch, no rank finishes (each needs the odd rank's block), and the odd rank's
    /// block reaches nobody: the others' buffers are untouched there, and the odd rank's
    /// everywhere but its own block.
    #[test]
    fn a_doubling_all_gather_mismatch_takes_no_data_from_the_odd_rank(
        size in 2usize..10,
        odd in 0usize..10,
        count in 1usize..50,
        extra in 1usize..50,
        cuts in cuts(1..32),
    ) {
        let odd = odd % size;
        let mut xs: Vec<Exchange> = (0..size).map(|_| Exchange::default()).collect();
        let mut data: Vec<Vec<u8>> = Vec::new();
        let mut inputs: Vec<Vec<u8>> = Vec::new();
        for (r, x) in xs.iter_mut().enumerate() {
            let n = if r == odd { count + extra } else { count };
            x.all_gather_doubling(Caller::new(&Direct, r, size, &Call::group(0, Kind::AllGather, n as u64)), n);
            let mut out = vec![0xAB; n * size];
            out[r * n..(r + 1) * n].fill(0xCD);
            data.push(out);
            inputs.push(vec![0xCD; n]);
        }
        let before = data.clone();
        let live = vec![true; size];
        let outcome = simulate_live(&mut xs, &mut data, &inputs, cuts, &live, 50_000);
        prop_assert!(
            matches!(outcome[odd], Some(Err(Error::Mismatch { .. }))),
            "odd rank {}: {:?}", odd, outcome[odd]
        );
        for (r, o) in outcome.iter().enumerate() {
            prop_assert!(!matches!(o, Some(Ok(()))), "rank {} finished", r);
        }
        prop_assert!(data[odd] == before[odd]);
        for r in (0..size).filter(|&r| r != odd) {
            let at = odd * count..(odd + 1) * count;
            prop_assert!(data[r][at.clone()] == before[r][at], "rank {}", r);
        }
    }

    /// A rank whose call differs is found by every rank, before it takes any data: the
    /// receivers' buffers are untouched.
    #[test]
    fn a_mismatch_is_found_before_any_data_is_taken(
        size in 2usize..5,
        count in 1usize..100,
        extra in 1usize..100,
        cuts in cuts(1..32),
    ) {
        let odd = size - 1;
        let calls: Vec<Call> = (0..size)
            .map(|r| {
                let n = if r == odd { count + extra } else { count };
                Call::group(0, Kind::AllGather, n as u64)
            })
            .collect();
        let mut xs: Vec<Exchange> = (0..size).map(|_| Exchange::default()).collect();
        let mut data: Vec<Vec<u8>> = Vec::new();
        let mut inputs: Vec<Vec<u8>> = Vec::new();
        for (r, x) in xs.iter_mut().enumerate() {
            let n = calls[r].header.count as usize;
            x.all_gather(Caller::new(&Direct, r, size, &calls[r]), n);
            data.push(vec![0xAB; n * size]);
            inputs.push(vec![0xCD; n]);
        }
        let before = data.clone();
        let outcome = simulate(&mut xs, &mut data, &inputs, cuts);
        for (r, o) in outcome.iter().enumerate() {
            prop_assert!(matches!(o, Err(Error::Mismatch { .. })), "rank {}: {:?}", r, o);
        }
        // The odd rank took nothing from anyone, the others nothing from the odd rank.
        prop_assert!(data[odd] == before[odd]);
        for r in 0..odd {
            let n = count;
            prop_assert!(data[r][odd * n..] == before[r][odd * n..], "rank {}", r);
        }
    }

    /// Reductions stage what arrives (header and data in one read) and fold only once
    /// every header matched: a mismatch leaves every rank's array as it was.
    #[test]
    fn a_mismatched_reduction_folds_nothing(
        size in 2usize..5,
        count in 1usize..100,
        odd_dtype in any::<bool>(),
        scatter in any::<bool>(),
        cuts in cuts(1..48),
    ) {
        let odd = size - 1;
        let mut xs: Vec<Exchange> = (0..size).map(|_| Exchange::default()).collect();
        let mut data: Vec<Vec<u8>> = Vec::new();
        for (r, x) in xs.iter_mut().enumerate() {
            let (dtype, n) = match r == odd {
                true if odd_dtype => (DType::I16, count),
                true => (DType::U16, count + 1),
                false => (DType::U16, count),
            };
            let call = Call::group(3, Kind::AllReduce(ReduceOp::Sum, dtype), n as u64);
            let algorithm = if scatter {
                AllReduce::ScatterGather
            } else {
                AllReduce::OneShot
            };
            let reduce = (ReduceOp::Sum, dtype);
            x.all_reduce(Caller::new(&Direct, r, size, &call), algorithm, reduce, n * 2);
            data.push(input(cuts.seed, r, dtype, n * 2));
        }
        let before = data.clone();
        let none: Vec<Vec<u8>> = vec![Vec::new(); size];
        let outcome = simulate(&mut xs, &mut data, &none, cuts);
        for (r, o) in outcome.iter().enumerate() {
            prop_assert!(matches!(o, Err(Error::Mismatch { .. })), "rank {}: {:?}", r, o);
        }
        prop_assert_eq!(data, before);
    }
}

#[test]
fn a_header_is_a_fixed_sixteen_bytes_and_the_sequence_is_in_it() {
    let h = Header {
        seq: 5,
        kind: Kind::Barrier,
        count: 0,
    };
    assert_eq!(h.encode().len(), 16);
    let mut x = Exchange::default();
    x.headers(Caller::new(
        &Direct,
        0,
        2,
        &Call::group(5, Kind::Barrier, 0),
    ));
    let mut data = [];
    let mut stage = [];
    let mem = Memory {
        data: &mut data,
        input: &[],
        stage: &mut stage,
    };
    let (conn, head, body) = x.poll_transmit(0, &mem).expect("a header to send");
    assert_eq!((conn, head, body), (1, &h.encode()[..], &[][..]));
}
