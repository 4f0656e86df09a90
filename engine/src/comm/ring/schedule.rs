//! MLX's ring schedule as pure arithmetic: how a collective is split over connections and
//! directions, and which segment each step sends and receives. No sockets, no clocks.
//!
//! The bytes on every connection are fixed by (op, element size, element count, ranks,
//! connections per neighbour); an MLX peer derives the same lengths, so none are sent.
//! This module is the contract with MLX 0.32's `ring.cpp`:
//!
//! - **Sub-operations.** An all-reduce of `nbytes` runs as
//!   `max(1, min(2C, nbytes / (P * 262144)))` independent rings over consecutive element
//!   ranges of `ceil(n / k)` elements; an all-gather as `max(1, min(2C, nbytes / 262144))`
//!   rings over byte ranges of each rank's block. Sub-operation `i` uses connection pair
//!   `i / 2` and direction [`Direction::Left`] for even `i`, [`Direction::Right`] for odd.
//! - **Segments.** A pass over `m` elements cuts them into `P` segments of `ceil(m / P)`
//!   elements; trailing segments may be short or empty.
//! - **Steps.** At step `t`, rank `r` sends segment `(r + t·d) mod P` and receives segment
//!   `(r + (t+1)·d) mod P`, where `d` is +1 for `Left` and -1 for `Right`. An all-reduce
//!   runs `2(P-1)` steps: the first `P-1` fold the received segment into the local one, the
//!   rest overwrite it with the owner's final value. An all-gather runs `P-1` overwriting
//!   steps.
//! - **Small arrays.** An all-reduce of fewer than `P` elements pads them with zeros to
//!   exactly `P` elements (at most 1024 bytes) and runs one pass on connection 0,
//!   direction `Right`, so even an empty array moves `2(P-1)` padded elements.
//!
//! `sum_scatter` is ours (MLX's ring refuses it): the reduce half of the all-reduce, shifted
//! by one segment so that rank `r` ends up owning block `r`.

use std::ops::Range;

/// MLX's `min_send_size`: below this many bytes per rank, a collective is not split.
pub(crate) const MIN_SEND_SIZE: usize = 262_144;

/// MLX's bound on the padded small all-reduce: `P` elements must fit in 1024 bytes.
pub(crate) const SMALL_PAD_BYTES: usize = 1024;

/// Which way data flows around the ring in one pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Direction {
    /// MLX's direction +1: send to the left neighbour (on the accepted connection), receive
    /// from the right (on the connection we opened).
    Left,
    /// MLX's direction -1: send to the right, receive from the left.
    Right,
}

/// The parallel sub-operation `i` of a collective: its connection pair and direction.
pub(crate) fn route(i: usize) -> (usize, Direction) {
    (
        i / 2,
        if i.is_multiple_of(2) {
            Direction::Left
        } else {
            Direction::Right
        },
    )
}

/// How many parallel rings an all-reduce (or sum_scatter) of `nbytes` uses.
pub(crate) fn reduce_splits(nbytes: usize, ranks: usize, connections: usize) -> usize {
    (nbytes / (ranks * MIN_SEND_SIZE)).clamp(1, 2 * connections)
}

/// How many parallel rings an all-gather of `nbytes` per rank uses.
pub(crate) fn gather_splits(nbytes: usize, connections: usize) -> usize {
    (nbytes / MIN_SEND_SIZE).clamp(1, 2 * connections)
}

pub(crate) use crate::comm::part;

/// The byte range of `len` bytes starting at stripe `i` of `send`/`recv`: MLX stripes a
/// message over the C connections in pieces of `max(1024, ceil(len / C))` bytes and skips
/// connections whose piece would start at or past the end.
pub(crate) fn stripe(len: usize, connections: usize, i: usize) -> Range<usize> {
    let piece = len.div_ceil(connections).max(1024);
    (i * piece).min(len)..((i + 1) * piece).min(len)
}

/// One ring pass as seen by one rank: which segment index each step touches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pass {
    /// This rank.
    pub(crate) rank: usize,
    /// Ranks in the ring.
    pub(crate) size: usize,
    /// Which way the data flows.
    pub(crate) direction: Direction,
    /// Segments by which every index is shifted: 0 for MLX's passes, 1 for sum_scatter so
    /// that rank `r` finishes owning segment `r`.
    pub(crate) shift: usize,
    /// Steps in the pass.
    pub(crate) steps: usize,
    /// Steps, from the first, whose received segment is folded into the local one; later
    /// steps overwrite.
    pub(crate) reduce_steps: usize,
}

impl Pass {
    /// MLX's all-reduce pass: `P-1` reducing steps, then `P-1` overwriting ones.
    pub(crate) fn all_reduce(rank: usize, size: usize, direction: Direction) -> Pass {
        let half = size - 1;
        Pass {
            rank,
            size,
            direction,
            shift: 0,
            steps: 2 * half,
            reduce_steps: half,
        }
    }

    /// MLX's all-gather pass: `P-1` overwriting steps.
    pub(crate) fn all_gather(rank: usize, size: usize, direction: Direction) -> Pass {
        Pass {
            rank,
            size,
            direction,
            shift: 0,
            steps: size - 1,
            reduce_steps: 0,
        }
    }

    /// The reduce-scatter pass: `P-1` reducing steps ending with segment `rank` complete.
    pub(crate) fn reduce_scatter(rank: usize, size: usize, direction: Direction) -> Pass {
        Pass {
            rank,
            size,
            direction,
            shift: 1,
            steps: size - 1,
            reduce_steps: size - 1,
        }
    }

    /// The segment sent at step `t`: `(r + (t + shift)·d) mod P`.
    pub(crate) fn send_segment(&self, t: usize) -> usize {
        let k = (t + self.shift) % self.size;
        match self.direction {
            Direction::Left => (self.rank + k) % self.size,
            Direction::Right => (self.rank + self.size - k) % self.size,
        }
    }

    /// The segment received at step `t`: the one sent at step `t + 1`.
    pub(crate) fn recv_segment(&self, t: usize) -> usize {
        self.send_segment(t + 1)
    }

    /// Whether step `t` folds what it receives into the local segment.
    pub(crate) fn reduces(&self, t: usize) -> bool {
        t < self.reduce_steps
    }
}

/// Where segment `s` of a pass lies in the buffer it works on, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Layout {
    /// `len` bytes from `base`, cut into segments of `seg` bytes (an all-reduce's elements).
    Split {
        /// Where the sub-operation starts.
        base: usize,
        /// Its length in bytes.
        len: usize,
        /// Bytes per segment: `ceil(m / P)` elements.
        seg: usize,
    },
    /// One piece of `len` bytes at `offset` within each of `P` blocks of `stride` bytes
    /// (an all-gather's output blocks, a sum_scatter's input chunks).
    Strided {
        /// Where the piece starts within its block.
        offset: usize,
        /// Its length in bytes.
        len: usize,
        /// Bytes per block.
        stride: usize,
    },
}

impl Layout {
    /// An all-reduce sub-operation over `elems` elements of `elem` bytes from byte `base`.
    pub(crate) fn split(base: usize, elems: usize, elem: usize, ranks: usize) -> Layout {
        Layout::Split {
            base,
            len: elems * elem,
            seg: elems.div_ceil(ranks) * elem,
        }
    }

    /// The piece this layout describes within one block: where a sum_scatter lane's share
    /// of this rank's output lies.
    pub(crate) fn piece(&self) -> Range<usize> {
        match *self {
            Layout::Split { base, len, .. } => base..base + len,
            Layout::Strided { offset, len, .. } => offset..offset + len,
        }
    }

    /// The byte range of segment `s`.
    pub(crate) fn segment(&self, s: usize) -> Range<usize> {
        match *self {
            Layout::Split { base, len, seg } => {
                base + (s * seg).min(len)..base + ((s + 1) * seg).min(len)
            }
            Layout::Strided {
                offset,
                len,
                stride,
            } => {
                let start = s * stride + offset;
                start..start + len
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_follow_mlx() {
        // 2 ranks, 1 connection: 1 MiB of f32 makes 2 sub-reduces (2 x 2 x 262144 bytes).
        assert_eq!(reduce_splits(1 << 20, 2, 1), 2);
        assert_eq!(reduce_splits((1 << 20) - 1, 2, 1), 1);
        assert_eq!(reduce_splits(64 << 20, 2, 1), 2);
        assert_eq!(reduce_splits(64 << 20, 2, 2), 4);
        assert_eq!(reduce_splits(3 * 3 * MIN_SEND_SIZE, 3, 2), 3);
        assert_eq!(reduce_splits(0, 4, 2), 1);
        assert_eq!(gather_splits(MIN_SEND_SIZE - 1, 1), 1);
        assert_eq!(gather_splits(2 * MIN_SEND_SIZE, 1), 2);
        assert_eq!(gather_splits(9 * MIN_SEND_SIZE, 2), 4);
        assert_eq!(route(0), (0, Direction::Left));
        assert_eq!(route(3), (1, Direction::Right));
    }

    #[test]
    fn stripes_follow_mlx() {
        assert_eq!(stripe(10, 2, 0), 0..10);
        assert_eq!(stripe(10, 2, 1), 10..10);
        assert_eq!(stripe(5000, 2, 0), 0..2500);
        assert_eq!(stripe(5000, 2, 1), 2500..5000);
        assert_eq!(stripe(0, 1, 0), 0..0);
    }

    #[test]
    fn segments_cover_the_range_once() {
        for m in [0, 1, 2, 5, 7, 1000] {
            for p in 1..6 {
                let l = Layout::split(40, m, 4, p);
                let mut next = 40;
                for s in 0..p {
                    let r = l.segment(s);
                    assert_eq!(r.start, next);
                    next = r.end;
                }
                assert_eq!(next, 40 + 4 * m);
            }
        }
    }

    /// Runs a pass on P simulated ranks with whole-step exchanges and returns each rank's
    /// data: the semantics the byte-streaming engine must reproduce.
    fn simulate(p: usize, d: Direction, inputs: &[Vec<u64>], scatter: bool) -> Vec<Vec<u64>> {
        let m = inputs[0].len();
        let layout = Layout::split(0, m, 1, p);
        let mut data = inputs.to_vec();
        let pass = |r| {
            if scatter {
                Pass::reduce_scatter(r, p, d)
            } else {
                Pass::all_reduce(r, p, d)
            }
        };
        for t in 0..pass(0).steps {
            // Every rank sends, then every rank receives from its upstream neighbour.
            let sent: Vec<Vec<u64>> = (0..p)
                .map(|r| data[r][layout.segment(pass(r).send_segment(t))].to_vec())
                .collect();
            for (r, local) in data.iter_mut().enumerate() {
                let from = match d {
                    Direction::Left => (r + 1) % p,
                    Direction::Right => (r + p - 1) % p,
                };
                let seg = layout.segment(pass(r).recv_segment(t));
                assert_eq!(seg.len(), sent[from].len(), "rank {r} step {t}");
                for (x, y) in local[seg].iter_mut().zip(&sent[from]) {
                    *x = if pass(r).reduces(t) { *x + *y } else { *y };
                }
            }
        }
        data
    }

    #[test]
    fn passes_reduce_every_segment_in_both_directions() {
        for p in 2..8 {
            for m in [p, p + 1, 3 * p - 1, 50] {
                let inputs: Vec<Vec<u64>> = (0..p)
                    .map(|r| (0..m).map(|i| (r * 1000 + i) as u64 * 7 + 1).collect())
                    .collect();
                let want: Vec<u64> = (0..m).map(|i| inputs.iter().map(|v| v[i]).sum()).collect();
                for d in [Direction::Left, Direction::Right] {
                    for got in simulate(p, d, &inputs, false) {
                        assert_eq!(got, want, "p={p} m={m} {d:?}");
                    }
                    let scattered = simulate(p, d, &inputs, true);
                    let layout = Layout::split(0, m, 1, p);
                    for (r, got) in scattered.iter().enumerate() {
                        let own = layout.segment(r);
                        assert_eq!(&got[own.clone()], &want[own], "scatter p={p} m={m} {d:?}");
                    }
                }
            }
        }
    }
}
