//! The data plane against MLX 0.32.1's schedule: for given (P, op, count, dtype, topology),
//! the messages every rank posts on every queue pair, in order: their size (the buffer class)
//! and, for every byte the receiver will use, their content.
//!
//! The expectations are derived here from the reference (`mlx-distributed.md` section 3 and
//! MLX's `mesh_impl.h` / `ring_impl.h`), without calling the crate's schedule code: message
//! sizes from `buffer_size_from_message`, frame counts, which queue pair, and which slice of
//! which rank's data (or which partial sum) each frame carries. Receives are checked too:
//! every queue pair must post exactly the receives, of exactly the sizes, that its peer's
//! sends need, no more (a leftover receive would swallow the next collective's first
//! message) and no fewer.
//!
//! Inputs are small `i32` values so partial sums are exact and can be predicted.

use std::collections::HashMap;
use std::sync::{Barrier, Mutex};

use super::{Layout, run_ok};
use crate::jaccl::frames::SizeClasses;
use crate::jaccl::group::Kind;
use crate::transport::rdma::emulated::{Network, Posted};

/// MLX's `buffer_size_from_message`, restated.
fn message_size(m: usize, classes: SizeClasses) -> usize {
    if classes == SizeClasses::Small {
        return 4096;
    }
    (1..8)
        .rev()
        .map(|k| 4096usize << k)
        .find(|&s| m >= s)
        .unwrap_or(4096)
}

/// An expected message: its size and the bytes at its front that the receiver uses.
#[derive(Clone, Debug, PartialEq)]
struct Frame {
    size: usize,
    valid: Vec<u8>,
}

type Sends = HashMap<(usize, usize), Vec<Frame>>;

/// Rank `r`'s i32 input element `i` (case `case`).
fn value(case: u32, r: usize, i: usize) -> i32 {
    ((case as usize * 31 + r * 7 + i * 3) % 19) as i32 - 9
}

fn input(case: u32, r: usize, count: usize) -> Vec<i32> {
    (0..count).map(|i| value(case, r, i)).collect()
}

fn bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Element-wise sum over `ranks` of their inputs.
fn sum_over(case: u32, ranks: impl Iterator<Item = usize> + Clone, count: usize) -> Vec<i32> {
    (0..count)
        .map(|i| ranks.clone().map(|r| value(case, r, i)).sum())
        .collect()
}

/// Frames of `S` bytes covering `data` (the last one partly valid); none for empty data.
fn frames_of(data: &[u8], s: usize) -> Vec<Frame> {
    data.chunks(s)
        .map(|c| Frame {
            size: s,
            valid: c.to_vec(),
        })
        .collect()
}

/// Mesh, fully connected all-reduce of `count` i32 at element `base`: every rank sends its
/// own elements to every peer in frames of the class of the whole length.
fn mesh_all_reduce_direct(
    case: u32,
    size: usize,
    count: usize,
    base: usize,
    classes: SizeClasses,
    out: &mut Sends,
) {
    let s = message_size(count * 4, classes);
    for r in 0..size {
        let mine = bytes(&input(case, r, base + count)[base..]);
        for p in (0..size).filter(|&p| p != r) {
            out.entry((r, p)).or_default().extend(frames_of(&mine, s));
        }
    }
}

/// Mesh all-reduce as MLX 0.32.1 chooses it.
fn mesh_all_reduce(case: u32, size: usize, count: usize, classes: SizeClasses) -> Sends {
    let mut out = Sends::new();
    if size > 2 && count * 4 > 32 * 1024 {
        let chunk = count / size;
        if chunk > 0 {
            let s = message_size(chunk * 4, classes);
            let total = sum_over(case, 0..size, count);
            for r in 0..size {
                let mine = input(case, r, count);
                for p in (0..size).filter(|&p| p != r) {
                    // Scatter: peer p's chunk of our input.
                    let theirs = bytes(&mine[p * chunk..(p + 1) * chunk]);
                    out.entry((r, p)).or_default().extend(frames_of(&theirs, s));
                }
                // Gather: our fully reduced chunk, to everyone.
                let shard = bytes(&total[r * chunk..(r + 1) * chunk]);
                for p in (0..size).filter(|&p| p != r) {
                    out.entry((r, p)).or_default().extend(frames_of(&shard, s));
                }
            }
        }
        let base = chunk * size;
        if base < count {
            mesh_all_reduce_direct(case, size, count - base, base, classes, &mut out);
        }
    } else {
        mesh_all_reduce_direct(case, size, count, 0, classes, &mut out);
    }
    out
}

/// Mesh sum_scatter of `c` i32 per rank.
fn mesh_sum_scatter(case: u32, size: usize, c: usize, classes: SizeClasses) -> Sends {
    let s = message_size(c * 4, classes);
    let mut out = Sends::new();
    for r in 0..size {
        let mine = input(case, r, c * size);
        for p in (0..size).filter(|&p| p != r) {
            let theirs = bytes(&mine[p * c..(p + 1) * c]);
            out.entry((r, p)).or_default().extend(frames_of(&theirs, s));
        }
    }
    out
}

/// Mesh all_gather of `n` i32 per rank.
fn mesh_all_gather(case: u32, size: usize, n: usize, classes: SizeClasses) -> Sends {
    let s = message_size(n * 4, classes);
    let mut out = Sends::new();
    for r in 0..size {
        let mine = bytes(&input(case, r, n));
        for p in (0..size).filter(|&p| p != r) {
            out.entry((r, p)).or_default().extend(frames_of(&mine, s));
        }
    }
    out
}

/// Wire `w`'s connection in direction `d`: 0 to the right neighbour (connections
/// `wires..2 wires`), 1 to the left (`0..wires`).
fn ring_conn(wires: usize, w: usize, d: usize) -> usize {
    if d == 0 { wires + w } else { w }
}

/// The sends of a ring model: `each(r, w, d, frames)` pushes rank `r`'s frames on wire `w`
/// (of the `active` first of `wires`) in direction `d` (of `dirs`).
fn ring_sends(
    size: usize,
    wires: usize,
    active: usize,
    dirs: usize,
    mut each: impl FnMut(usize, usize, usize, &mut Vec<Frame>),
) -> Sends {
    let mut out = Sends::new();
    for r in 0..size {
        for w in 0..active {
            for d in 0..dirs {
                each(r, w, d, out.entry((r, ring_conn(wires, w, d))).or_default());
            }
        }
    }
    out
}

/// Pushes `steps` frames of `size` bytes onto `frames`, frame f carrying the elements
/// `data[base + from..base + to]`, `from = slice + f * per` and `to = limit.min(from + per)`
/// (nothing once `from` reaches `limit`), as `encode` writes them.
#[allow(
    clippy::too_many_arguments,
    reason = "one call per model, named by its caller"
)]
fn push_steps<T>(
    frames: &mut Vec<Frame>,
    data: &[T],
    base: usize,
    (slice, limit): (usize, usize),
    per: usize,
    steps: usize,
    size: usize,
    encode: impl Fn(&[T]) -> Vec<u8>,
) {
    for f in 0..steps {
        let from = slice + f * per;
        let to = limit.min(from + per);
        let valid = if to > from {
            encode(&data[base + from..base + to])
        } else {
            Vec::new()
        };
        frames.push(Frame { size, valid });
    }
}

/// Ring all-reduce of `count` i32: both passes, every frame, with the partial sums the
/// reduce-scatter pass forwards and the final values the all-gather pass forwards.
fn ring_all_reduce(
    case: u32,
    size: usize,
    wires: usize,
    count: usize,
    classes: SizeClasses,
) -> Sends {
    let (dirs, active) = if count * 4 <= 32768 || count < size * 2 * wires {
        (1, 1)
    } else {
        (2, wires)
    };
    let chunk = count.div_ceil(size);
    let spw = chunk.div_ceil(dirs * active);
    let s = message_size(spw * 4, classes);
    let n = s / 4;
    let steps = spw.div_ceil(n);
    let total = sum_over(case, 0..size, count);
    ring_sends(size, wires, active, dirs, |r, w, d, frames| {
        let slice = d * active * spw + w * spw;
        let slice_end = chunk.min((d + 1) * active * spw).min(slice + spw);
        for pass in 0..2 {
            for t in 0..size - 1 {
                // Direction 0 flows right: at reduce step t rank r forwards chunk r-t
                // holding ranks r-t..=r; direction 1 mirrors it. The gather pass
                // forwards final chunks, starting with the one r completed.
                let (c, partial): (usize, Vec<usize>) = match (pass, d) {
                    (0, 0) => (
                        (r + size - t) % size,
                        (0..=t).map(|k| (r + size - k) % size).collect(),
                    ),
                    (0, _) => ((r + t) % size, (0..=t).map(|k| (r + k) % size).collect()),
                    (_, 0) => ((r + 1 + size - t) % size, (0..size).collect()),
                    (_, _) => ((r + size - 1 + t) % size, (0..size).collect()),
                };
                let values: Vec<i32> = if partial.len() == size {
                    total.clone()
                } else {
                    sum_over(case, partial.into_iter(), count)
                };
                let limit = slice_end.min(count.saturating_sub(c * chunk));
                push_steps(
                    frames,
                    &values,
                    c * chunk,
                    (slice, limit),
                    n,
                    steps,
                    s,
                    bytes,
                );
            }
        }
    })
}

/// Ring sum_scatter of `c` i32 per rank.
fn ring_sum_scatter(case: u32, size: usize, wires: usize, c: usize, classes: SizeClasses) -> Sends {
    let active = if size * c < size * 2 * wires || c * 4 <= 65536 {
        1
    } else {
        wires
    };
    let spw = c.div_ceil(2 * active);
    let s = message_size(spw * 4, classes);
    let n = s / 4;
    let steps = spw.div_ceil(n);
    ring_sends(size, wires, active, 2, |r, w, d, frames| {
        let slice = d * active * spw + w * spw;
        let slice_end = c.min((d + 1) * active * spw).min(slice + spw);
        for t in 0..size - 1 {
            // Direction 0: chunk r-1-t, holding ranks r-t..=r; direction 1: chunk
            // r+1+t, holding ranks r..=r+t.
            let (chunk, ranks): (usize, Vec<usize>) = if d == 0 {
                (
                    (r + 2 * size - 1 - t) % size,
                    (0..=t).map(|k| (r + size - k) % size).collect(),
                )
            } else {
                (
                    (r + 1 + t) % size,
                    (0..=t).map(|k| (r + k) % size).collect(),
                )
            };
            let values = sum_over(case, ranks.into_iter(), c * size);
            let bounds = (slice, slice_end);
            push_steps(frames, &values, chunk * c, bounds, n, steps, s, bytes);
        }
    })
}

/// Ring all_gather of `n` i32 per rank, as this crate does it (MLX's message sequence; each
/// direction carrying its own half of every block).
fn ring_all_gather(case: u32, size: usize, wires: usize, n: usize, classes: SizeClasses) -> Sends {
    let block = n * 4;
    let npw = block.div_ceil(2 * wires);
    let s = message_size(npw, classes);
    let steps = npw.div_ceil(s);
    ring_sends(size, wires, wires, 2, |r, w, d, frames| {
        let slice = d * wires * npw + w * npw;
        let slice_end = block.min(slice + npw);
        for t in 0..size - 1 {
            let owner = if d == 0 {
                (r + size - t) % size
            } else {
                (r + t) % size
            };
            let data = bytes(&input(case, owner, n));
            let bounds = (slice, slice_end);
            push_steps(frames, &data, 0, bounds, s, steps, s, <[u8]>::to_vec);
        }
    })
}

/// The queue pair at the other end of rank `r`'s connection `conn`.
fn peer_end(kind: Kind, size: usize, r: usize, conn: usize) -> (usize, usize) {
    match kind {
        Kind::Mesh => (conn, r),
        Kind::Ring { wires } if conn < wires => ((r + size - 1) % size, wires + conn),
        Kind::Ring { wires } => ((r + 1) % size, conn - wires),
    }
}

fn conns(kind: Kind, size: usize) -> usize {
    match kind {
        Kind::Mesh => size,
        Kind::Ring { wires } => 2 * wires,
    }
}

/// Checks what was recorded against `want`, and that every queue pair's receives match its
/// peer's sends one for one.
fn check(
    recorded: &HashMap<(usize, usize), Vec<Posted>>,
    layout: Layout,
    what: &str,
    want: &Sends,
) {
    let posted_at = |r: usize, c: usize| recorded.get(&(r, c)).cloned().unwrap_or_default();
    let (size, kind) = (layout.size, layout.kind);
    for r in 0..size {
        for conn in 0..conns(kind, size) {
            let posted = posted_at(r, conn);
            let sends: Vec<&Posted> = posted.iter().filter(|p| !p.recv).collect();
            let expected = want.get(&(r, conn)).map_or(&[][..], Vec::as_slice);
            assert_eq!(
                sends.len(),
                expected.len(),
                "{what} on {layout:?}: rank {r} connection {conn} sent {} messages, MLX sends {}",
                sends.len(),
                expected.len()
            );
            for (i, (got, want)) in sends.iter().zip(expected).enumerate() {
                assert_eq!(
                    got.len, want.size,
                    "{what} on {layout:?}: rank {r} connection {conn} message {i}: size"
                );
                let bytes = got.bytes.as_ref().expect("recorded bytes");
                assert!(
                    bytes[..want.valid.len()] == want.valid[..],
                    "{what} on {layout:?}: rank {r} connection {conn} message {i}: the {} valid \
                     bytes differ",
                    want.valid.len()
                );
            }
            if kind == Kind::Mesh && conn == r {
                continue;
            }
            let recvs: Vec<usize> = posted.iter().filter(|p| p.recv).map(|p| p.len).collect();
            let (pr, pc) = peer_end(kind, size, r, conn);
            let theirs: Vec<usize> = posted_at(pr, pc)
                .iter()
                .filter(|p| !p.recv)
                .map(|p| p.len)
                .collect();
            assert_eq!(
                recvs, theirs,
                "{what} on {layout:?}: rank {r} connection {conn} posted receives that do not \
                 match rank {pr}'s sends"
            );
        }
    }
}

/// One collective to record.
#[derive(Clone, Copy, Debug)]
enum Case {
    AllSum(usize),
    SumScatter(usize),
    AllGather(usize),
    /// `n` bytes from one rank to another.
    SendRecv(usize, usize, usize),
}

/// Runs every case on one group of `layout`, recording each separately, and checks each.
fn record(layout: Layout, cases: &[Case]) {
    let net = Network::new();
    net.record(true);
    let barrier = Barrier::new(layout.size);
    let taken = Mutex::new(Vec::new());
    run_ok(layout, &net, |rank, g| {
        for (k, case) in cases.iter().enumerate() {
            let id = 1 + k as u32;
            match *case {
                Case::AllSum(count) => {
                    let mut v = input(id, rank, count);
                    g.all_sum(&mut v).unwrap();
                }
                Case::SumScatter(c) => {
                    let v = input(id, rank, c * g.size());
                    let mut o = vec![0i32; c];
                    g.sum_scatter(&v, &mut o).unwrap();
                }
                Case::AllGather(n) => {
                    let v = input(id, rank, n);
                    let mut o = vec![0i32; n * g.size()];
                    g.all_gather(&v, &mut o).unwrap();
                }
                Case::SendRecv(from, to, n) => {
                    if rank == from {
                        g.send(&bytes(&input(id, from, n.div_ceil(4)))[..n], to)
                            .unwrap();
                    } else if rank == to {
                        let mut o = vec![0u8; n];
                        g.recv(&mut o, from).unwrap();
                    }
                }
            }
            barrier.wait();
            if rank == 0 {
                let snapshot: HashMap<(usize, usize), Vec<Posted>> = (0..layout.size)
                    .flat_map(|r| (0..conns(layout.kind, layout.size)).map(move |c| (r, c)))
                    .map(|(r, c)| ((r, c), net.posted(r, c)))
                    .collect();
                taken.lock().unwrap().push(snapshot);
                net.clear_record();
            }
            barrier.wait();
        }
    });
    let snapshots = taken.into_inner().unwrap();
    for (k, (case, snapshot)) in cases.iter().zip(snapshots).enumerate() {
        let id = 1 + k as u32;
        let (size, classes) = (layout.size, layout.classes);
        let want = match (*case, layout.kind) {
            (Case::AllSum(n), Kind::Mesh) => mesh_all_reduce(id, size, n, classes),
            (Case::AllSum(n), Kind::Ring { wires }) => ring_all_reduce(id, size, wires, n, classes),
            (Case::SumScatter(c), Kind::Mesh) => mesh_sum_scatter(id, size, c, classes),
            (Case::SumScatter(c), Kind::Ring { wires }) => {
                ring_sum_scatter(id, size, wires, c, classes)
            }
            (Case::AllGather(n), Kind::Mesh) => mesh_all_gather(id, size, n, classes),
            (Case::AllGather(n), Kind::Ring { wires }) => {
                ring_all_gather(id, size, wires, n, classes)
            }
            (Case::SendRecv(from, to, n), kind) => {
                let data = bytes(&input(id, from, n.div_ceil(4)))[..n].to_vec();
                let mut out = Sends::new();
                match kind {
                    Kind::Mesh => {
                        out.insert((from, to), frames_of(&data, message_size(n, classes)));
                    }
                    Kind::Ring { wires } => {
                        // Towards the left neighbour in direction 1 (on the left wires),
                        // else direction 0 (on the right wires); ceil(n / W) bytes per wire.
                        let per = n.div_ceil(wires);
                        let s = message_size(per, classes);
                        let to_left = to == (from + size - 1) % size;
                        for w in 0..wires {
                            let (a, b) = ((w * per).min(n), ((w + 1) * per).min(n));
                            let conn = if to_left { w } else { wires + w };
                            out.insert((from, conn), frames_of(&data[a..b], s));
                        }
                    }
                }
                out
            }
        };
        check(&snapshot, layout, &format!("{case:?}"), &want);
    }
}

#[test]
fn mesh_frames_match_mlx() {
    for size in [2, 3, 4] {
        let cases = [
            Case::AllSum(1),
            Case::AllSum(1000),
            Case::AllSum(8192),    // 32 KiB: still fully connected
            Case::AllSum(8193),    // above: scatter-gather for P > 2, with a tail
            Case::AllSum(70_000),  // chunks in the 16 KiB+ classes
            Case::AllSum(300_001), // large classes, a tail
            Case::SumScatter(5),
            Case::SumScatter(40_000),
            Case::AllGather(3),
            Case::AllGather(50_000),
            Case::SendRecv(size - 1, 0, 1),
            Case::SendRecv(0, size - 1, 300_000),
        ];
        record(Layout::mesh(size), &cases);
    }
}

#[test]
fn mesh_frames_on_macos_26_2_are_all_4_kib() {
    let cases = [
        Case::AllSum(70_000),
        Case::AllGather(5000),
        Case::SendRecv(1, 2, 9000),
    ];
    record(Layout::mesh(3).classes(SizeClasses::Small), &cases);
}

#[test]
fn ring_frames_match_mlx() {
    for (size, wires) in [(2, 1), (2, 2), (3, 1), (3, 3), (4, 2), (5, 4)] {
        let cases = [
            Case::AllSum(1),
            Case::AllSum(size - 1),
            Case::AllSum(8192),                     // one direction, one wire
            Case::AllSum(8193),                     // both directions on every wire
            Case::AllSum(size * 2 * wires * 3 + 1), // small but enough elements
            Case::AllSum(500_003),                  // larger classes, clipped frames
            Case::SumScatter(16_384),               // 64 KiB: one wire
            Case::SumScatter(16_385),               // every wire
            Case::SumScatter(3),
            Case::AllGather(1),
            Case::AllGather(100_001),
            Case::SendRecv(0, 1, 10_000),
            Case::SendRecv(1, 0, 5),
            Case::SendRecv(0, size - 1, 70_001),
        ];
        record(Layout::ring(size, wires), &cases);
    }
}

#[test]
fn ring_frames_on_macos_26_2_are_all_4_kib() {
    let cases = [
        Case::AllSum(100_000),
        Case::SumScatter(30_000),
        Case::AllGather(9000),
    ];
    record(Layout::ring(3, 2).classes(SizeClasses::Small), &cases);
}
