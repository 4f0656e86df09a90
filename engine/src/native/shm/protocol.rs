//! The shared-memory transport's layout and schedule, without memory, clock or waiting:
//! where each rank's words and buffers sit in the segment, how a collective is cut into
//! steps, and which bytes each step moves. `super` (the driver) does the copies, the
//! folds and the waiting.
//!
//! # The segment
//!
//! | offset | what |
//! |---|---|
//! | 0 | u32: ranks other than the creator that mapped the segment (the creator unlinks it when all did) |
//! | `LINE + r * CTRL` | rank `r`'s step word (u32): the last step it published |
//! | `... + 8` | rank `r`'s refusal word (u32): 0, or 1 + the rank whose group collective its `recv` refused |
//! | `... + 16`, `... + 32` | rank `r`'s collective header for even / odd steps (16 bytes each) |
//! | `... + 48` | rank `r`'s refused `recv`'s header (16 bytes), valid once its refusal word is set |
//! | `... + LINE` | rank `r`'s sleepers (u32): peers sleeping on its step word |
//! | `data(r, h)` | rank `r`'s buffer `h` (0, 1) of [`CHUNK`] bytes, page-aligned |
//! | `pairs()` | the `send`/`recv` channels, one per ordered pair of ranks (see `super::p2p`) |
//!
//! Each rank writes only its own words, headers and buffers; the step word and the sleepers
//! sit on different cache lines, so a spinning reader does not disturb the writer's line.
//!
//! # Steps
//!
//! A collective is a sequence of *steps*, the same on every rank for the same call. At step
//! `s` (counted over the group's life, wrapping) a rank writes what it contributes into its
//! buffer `s % 2` (and at the collective's first step its header), publishes `s` on its step
//! word (release), waits until every peer published `s` (acquire), and reads the peers'
//! buffers `s % 2`. It is done reading them once it publishes `s + 1`. A rank writes buffer
//! `s % 2` again only at step `s + 2`, after it saw every peer publish `s + 1`: so no buffer
//! is written while a peer may still read it, with one wait per step and no
//! acknowledgement.
//!
//! - **barrier**: one step with no data (the header only).
//! - **all-reduce, one-shot** (small vectors, and every size at P = 2: see
//!   `comm::algorithm`): per chunk of [`CHUNK`] bytes, one step; every rank copies its chunk
//!   in and folds all P buffers into its own output (rank 0 straight onto its own data,
//!   the others onto a copy of rank 0's chunk).
//! - **all-reduce by shares** (larger, P >= 3): per chunk of [`CHUNK`] bytes, two steps. In the first, every rank
//!   copies its chunk in, and rank `j` folds share `j` of it (elements
//!   `part(chunk, P, j)`) from all P buffers straight into its own output, then copies the
//!   result into its *other* buffer (the one of the second step); in the second, every
//!   rank copies the other shares out of their owners' buffers.
//! - **all_gather**: per chunk, one step: copy in, then copy every peer's piece out.
//! - **sum_scatter**: per chunk of the output, one step: every rank copies in its pieces of
//!   all P blocks, and folds its own block's pieces from all P buffers.
//! - **broadcast**: per chunk, one step: the root copies its piece in, every other rank
//!   copies it out of the root's buffer.
//! - **all_to_all**: per piece of a block ([`CHUNK`] / P bytes), one step: every rank
//!   copies in its pieces of the P - 1 blocks bound for its peers (block `j` at `j` pieces
//!   into its buffer), then copies piece `me` of every peer's buffer into its output.
//!
//! # A `recv` against a group collective
//!
//! A `recv` is not a step (its message travels through its pair's slots), so a rank in a
//! `recv` from `src` while `src` runs a group collective would wait for a send that never comes
//! while `src` waits for a step that never comes. The `recv` therefore also watches
//! `src`'s step word: once `src` published a step this rank has not, `src` is in a group
//! collective this rank is not in (unless `src`'s message is in the slots already:
//! a send precedes the step it publishes after it). The `recv` fails with the mismatch,
//! naming `src`'s call from its header, and leaves its own header and `src + 1` in its
//! refusal slot and word, which every rank that waits for its step looks at: they fail
//! with the mismatch too, naming the `recv`, instead of waiting out their timeout.
//!
//! Folds combine in rank order, `x0 op x1 op ... op x(P-1)`, with the same kernel on every
//! rank, as the TCP native wire's direct algorithms do: every rank gets the same bits.

use std::ops::Range;

use crate::comm::Transport;
use crate::comm::algorithm;
use crate::comm::part;

/// A cache line and its neighbour (adjacent-line prefetch pairs them).
pub(crate) const LINE: usize = 128;

/// Bytes of each rank's control block: its step word and headers, then its sleepers.
const CTRL: usize = 2 * LINE;

/// Bytes of each of a rank's two buffers: large enough that the two waits a chunk costs
/// are small against its copies, small enough that P of them stay in the caches.
pub(crate) const CHUNK: usize = 1 << 20;

/// Whether an all-reduce of `bytes` over `size` ranks goes one-shot (every rank folds
/// every chunk whole) rather than by shares (see the module docs): the choice of
/// `comm::algorithm`'s table for shared memory.
pub(crate) fn one_shot(size: usize, bytes: usize) -> bool {
    bytes <= algorithm::one_shot_max(Transport::SharedMemory, size)
}

/// Where everything of a group of `size` ranks sits (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    size: usize,
    chunk: usize,
}

impl Layout {
    /// The layout for `size` ranks with buffers of `chunk` bytes (a multiple of 4096).
    pub(crate) fn new(size: usize, chunk: usize) -> Layout {
        Layout { size, chunk }
    }

    /// Bytes of each buffer.
    pub(crate) fn chunk(&self) -> usize {
        self.chunk
    }

    /// The count of ranks that mapped the segment (u32).
    pub(crate) fn mapped(&self) -> usize {
        0
    }

    /// Rank `r`'s step word (u32).
    pub(crate) fn step(&self, r: usize) -> usize {
        LINE + r * CTRL
    }

    /// Rank `r`'s refusal word (u32): 0, or 1 + the rank its `recv` found in a group
    /// collective.
    pub(crate) fn refused(&self, r: usize) -> usize {
        LINE + r * CTRL + 8
    }

    /// Rank `r`'s refused `recv`'s header (16 bytes).
    pub(crate) fn refusal(&self, r: usize) -> usize {
        LINE + r * CTRL + 48
    }

    /// Rank `r`'s header for steps of parity `half`.
    pub(crate) fn header(&self, r: usize, half: usize) -> usize {
        LINE + r * CTRL + 16 + 16 * half
    }

    /// Rank `r`'s count of peers sleeping on its step word (u32).
    pub(crate) fn sleepers(&self, r: usize) -> usize {
        LINE + r * CTRL + LINE
    }

    fn data_base(&self) -> usize {
        (LINE + self.size * CTRL).next_multiple_of(4096)
    }

    /// Rank `r`'s buffer for steps of parity `half`.
    pub(crate) fn data(&self, r: usize, half: usize) -> usize {
        self.data_base() + (2 * r + half) * self.chunk
    }

    /// Ranks in the group.
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// Where the `send`/`recv` channels start (page-aligned: the buffers before them are
    /// whole pages).
    pub(crate) fn pairs(&self) -> usize {
        self.data_base() + 2 * self.size * self.chunk
    }

    /// Bytes of the whole segment.
    pub(crate) fn bytes(&self) -> usize {
        self.pairs() + super::p2p::bytes(self.size)
    }
}

/// Whether a step word holding `word` has reached step `step` (wrapping: steps are
/// compared within half the u32 range of each other).
pub(crate) fn reached(word: u32, step: u32) -> bool {
    word.wrapping_sub(step) as i32 >= 0
}

/// `0..total` cut into pieces of at most `per` (at least one piece, empty for
/// `total == 0`, so every collective has at least one step and its header is compared).
pub(crate) fn pieces(total: usize, per: usize) -> impl Iterator<Item = Range<usize>> {
    let per = per.max(1);
    let count = total.div_ceil(per).max(1);
    (0..count).map(move |i| (i * per).min(total)..((i + 1) * per).min(total))
}

/// The elements of share `j` of the chunk `chunk` (element indices) among `size` ranks.
pub(crate) fn share(chunk: &Range<usize>, size: usize, j: usize) -> Range<usize> {
    let r = part(chunk.len(), size, j);
    chunk.start + r.start..chunk.start + r.end
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_keeps_ranks_apart_and_buffers_page_aligned() {
        for size in 1..=9 {
            let l = Layout::new(size, CHUNK);
            let mut words = vec![l.mapped()];
            for r in 0..size {
                words.extend([l.step(r), l.sleepers(r)]);
                assert!(l.header(r, 1) + 16 <= l.sleepers(r));
                assert!(l.header(r, 0) >= l.step(r) + 4);
                assert_eq!(l.refused(r), l.step(r) + 8);
                assert_eq!(l.refusal(r), l.header(r, 1) + 16);
                assert!(l.refusal(r) + 16 <= l.sleepers(r));
                for h in 0..2 {
                    assert_eq!(l.data(r, h) % 4096, 0);
                    assert!(l.data(r, h) >= l.sleepers(size - 1) + 4);
                    assert!(l.data(r, h) + CHUNK <= l.bytes());
                }
            }
            words.sort_unstable();
            for pair in words.windows(2) {
                assert!(pair[1] - pair[0] >= LINE, "{words:?} share a line");
            }
            assert_eq!(l.data(size - 1, 1) + CHUNK, l.pairs());
            assert_eq!(l.pairs() + super::super::p2p::bytes(size), l.bytes());
        }
    }

    #[test]
    fn steps_compare_across_the_wrap() {
        assert!(reached(5, 5));
        assert!(reached(6, 5));
        assert!(!reached(4, 5));
        assert!(reached(0, u32::MAX));
        assert!(!reached(u32::MAX, 0));
    }

    #[test]
    fn pieces_cover_everything_once_and_never_vanish() {
        assert_eq!(pieces(0, 8).collect::<Vec<_>>(), vec![0..0]);
        assert_eq!(pieces(8, 8).collect::<Vec<_>>(), vec![0..8]);
        assert_eq!(pieces(17, 8).collect::<Vec<_>>(), vec![0..8, 8..16, 16..17]);
        assert_eq!(pieces(3, 0).count(), 3);
        let c = 10..17;
        let all: Vec<usize> = (0..3).flat_map(|j| share(&c, 3, j)).collect();
        assert_eq!(all, (10..17).collect::<Vec<_>>());
    }
}
