//! `send`/`recv` through the segment: one channel per ordered pair of ranks (sender,
//! receiver), each a ring of [`SLOTS`] slots of [`SLOT`] bytes (fewer in large groups:
//! [`slot_bytes`]), so that a sender runs
//! ahead of its receiver by up to [`SLOTS`] slots without a system call, and a large
//! message goes through the slots in pieces, the receiver copying one piece out while the
//! sender copies the next in. Nothing is allocated per call.
//!
//! # A channel
//!
//! | offset | what | written by |
//! |---|---|---|
//! | 0 | `written` (u32): pieces published so far | the sender |
//! | `LINE` | the sender's sleepers (u32): 1 while it sleeps on `read` | the sender |
//! | `2 * LINE` | `read` (u32): pieces taken so far | the receiver |
//! | `3 * LINE` | the receiver's sleepers (u32): 1 while it sleeps on `written` | the receiver |
//! | `4 * LINE + k * (LINE + slot)` | slot `k`: the message's 16-byte header, the sender's step (u32) when it sent, then at `LINE` up to `slot` bytes of the message | the sender |
//!
//! Piece `n` of the channel's life goes in slot `n % SLOTS`. The sender writes it once
//! `written - read < SLOTS`, then publishes `written = n + 1` (release) and wakes the
//! receiver if it counts itself asleep; the receiver takes it once `written > n`
//! (acquire), copies it out, publishes `read = n + 1` and wakes the sender likewise. The
//! counters wrap, and are compared by their difference. A message of `n` bytes is
//! `max(1, ceil(n / slot))` pieces, each with the message's header; the receiver compares
//! the first piece's header with its own call before it takes any data, so a length or
//! order that differs is [`Error::Mismatch`] naming both calls, as
//! on TCP, and the receiver answers the sender on its connection with the refusal TCP
//! sends ([`CallHeader::rejection`]), which the sender's next wait reads.
//!
//! # Memory
//!
//! `P * (P - 1)` channels of `4 * LINE + SLOTS * (LINE + slot)` bytes: 257 KiB each up to
//! P = 16, so 0.5 MiB at P = 2, 3 MiB at P = 4, 14 MiB at P = 8, 60 MiB at P = 16, beside
//! the collectives' `2 * P` MiB. Larger groups get smaller slots ([`slot_bytes`]), which
//! keeps the channels near [`PAIRS_BUDGET`] (down to 4 KiB slots: 67 MiB at P = 64).
//!
//! # Against a group collective
//!
//! As on TCP, where a connection carries one stream, a message belongs between the calls
//! around it: a rank that enters a group collective with a message of a peer's untaken,
//! sent before the peer entered it, or with one of its own that the peer has not taken
//! although the peer entered it, has its calls in another order than the peer; both ranks
//! fail with the mismatch. Each piece carries the step its sender had published when it
//! sent (`t`): in a collective whose first step is `s`, a piece with `t < s` was sent
//! before the collective. A `recv` whose source published a step this rank has not (it is
//! in a group collective) and whose slots are empty, or a `send` blocked on full slots
//! whose receiver did so, is a mismatch too (the peer will not take or send anything
//! before its collective ends, which needs this rank).
//!
//! A `recv` on A from B while B receives from A is not a mismatch: it is a deadlock the
//! caller wrote, which ends by the timeout naming the peer, as on TCP; two sends at once
//! complete while they fit in the slots, and time out otherwise.

use std::sync::atomic::Ordering;

use super::segment::{CallHeader, HEADER_BYTES, LINE, Layout, Segment, reached};
use crate::error::{Error, Phase, Result};

/// Slots per channel: how many pieces a sender may run ahead of its receiver.
pub(crate) const SLOTS: u32 = 4;

/// Bytes of a message in one slot, in groups of up to 16 ranks: large enough that the two
/// counters a piece costs are small against its copies, small enough that a channel stays
/// in the caches.
pub(crate) const SLOT: usize = 64 << 10;

/// Bytes the slots of all channels may take before larger groups get smaller slots (the
/// channels grow with the square of the group).
pub(crate) const PAIRS_BUDGET: usize = 64 << 20;

/// Bytes of a message in one slot in a group of `size` ranks: [`SLOT`], or the largest
/// power of two down to 4 KiB that keeps every channel's slots within [`PAIRS_BUDGET`].
pub(crate) fn slot_bytes(size: usize) -> usize {
    let pairs = (size * size.saturating_sub(1)).max(1);
    let fits = PAIRS_BUDGET / (pairs * SLOTS as usize);
    let mut slot = SLOT;
    while slot > 4096 && slot > fits {
        slot /= 2;
    }
    slot
}

/// Bytes of one channel in a group of `size` ranks.
fn channel_bytes(size: usize) -> usize {
    4 * LINE + SLOTS as usize * (LINE + slot_bytes(size))
}

/// Bytes of the channels of a group of `size` ranks.
pub(crate) fn bytes(size: usize) -> usize {
    size * size.saturating_sub(1) * channel_bytes(size)
}

/// Where the channel from `src` to `dst` sits (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Channel {
    base: usize,
    /// Bytes of a message in one slot.
    slot: usize,
}

impl Channel {
    /// The channel from `src` to `dst`, or a bug if they are one rank or out of range
    /// (`Group` refuses those before a call gets here).
    pub(crate) fn new(layout: &Layout, src: usize, dst: usize, context: Phase) -> Result<Channel> {
        let size = layout.size();
        if src == dst || src >= size || dst >= size {
            return Err(Error::Bug {
                context,
                what: format!("a shared-memory channel from rank {src} to rank {dst} of {size}"),
            });
        }
        // Off the diagonal: `src`'s `size - 1` receivers in rank order.
        let index = src * (size - 1) + if dst < src { dst } else { dst - 1 };
        Ok(Channel {
            base: layout.pairs() + index * channel_bytes(size),
            slot: slot_bytes(size),
        })
    }

    /// Bytes of a message in one slot.
    pub(crate) fn slot_bytes(self) -> usize {
        self.slot
    }

    /// The count of pieces published (u32).
    pub(crate) fn written(self) -> usize {
        self.base
    }

    /// The sender's sleepers (u32).
    pub(crate) fn sender_sleeps(self) -> usize {
        self.base + LINE
    }

    /// The count of pieces taken (u32).
    pub(crate) fn read(self) -> usize {
        self.base + 2 * LINE
    }

    /// The receiver's sleepers (u32).
    pub(crate) fn receiver_sleeps(self) -> usize {
        self.base + 3 * LINE
    }

    /// Slot of piece `n`: its header (16 bytes, then the sender's step).
    pub(crate) fn slot(self, n: u32) -> usize {
        self.base + 4 * LINE + (n % SLOTS) as usize * (LINE + self.slot)
    }

    /// Where the sender's step sits in the slot of piece `n`.
    pub(crate) fn stamp(self, n: u32) -> usize {
        self.slot(n) + HEADER_BYTES
    }

    /// Slot of piece `n`: its data.
    pub(crate) fn data(self, n: u32) -> usize {
        self.slot(n) + LINE
    }

    /// The oldest piece published and not taken: its header and the step its sender had
    /// published when it sent it; `None` if every piece was taken. `written` is loaded
    /// with `Acquire` unless the caller is the sender, and `read` unless it is the
    /// receiver (whoever writes a counter knows it already).
    ///
    /// Inline, with the piece's read out of line: every group collective's first step
    /// asks this of every channel it has, nearly always empty, and the orderings are
    /// constants where `sender` is.
    #[inline(always)]
    fn untaken(
        self,
        seg: &Segment,
        sender: bool,
        context: Phase,
    ) -> Result<Option<([u8; HEADER_BYTES], u32)>> {
        let (w, r) = if sender {
            (Ordering::Relaxed, Ordering::Acquire)
        } else {
            (Ordering::Acquire, Ordering::Relaxed)
        };
        let n = seg.word(self.read(), context)?.load(r);
        if seg.word(self.written(), context)?.load(w) == n {
            return Ok(None);
        }
        self.piece(seg, n, context).map(Some)
    }

    /// Piece `n`'s header and the step its sender had published when it sent it.
    #[inline(never)]
    fn piece(self, seg: &Segment, n: u32, context: Phase) -> Result<([u8; HEADER_BYTES], u32)> {
        let mut head = [0u8; HEADER_BYTES + 4];
        seg.copy_out(self.slot(n), &mut head, context)?;
        let mut got = [0u8; HEADER_BYTES];
        got.copy_from_slice(&head[..HEADER_BYTES]);
        let mut step = [0u8; 4];
        step.copy_from_slice(&head[HEADER_BYTES..]);
        Ok((got, u32::from_le_bytes(step)))
    }
}

/// One rank's channels to and from each peer, placed once (a channel's place costs a few
/// divisions, and a group collective's first step looks at all of them).
#[derive(Clone, Debug)]
pub(crate) struct Channels {
    me: usize,
    to: Vec<Option<Channel>>,
    from: Vec<Option<Channel>>,
}

impl Channels {
    /// The channels of local rank `me` of `layout`.
    pub(crate) fn new(layout: &Layout, me: usize) -> Channels {
        let size = layout.size();
        let place = |src, dst| Channel::new(layout, src, dst, Phase::Send).ok();
        Channels {
            me,
            to: (0..size).map(|p| place(me, p)).collect(),
            from: (0..size).map(|p| place(p, me)).collect(),
        }
    }

    /// The channel from this rank to `peer`.
    ///
    /// # Errors
    ///
    /// A bug: `peer` is this rank or not on the segment.
    pub(crate) fn to(&self, peer: usize, context: Phase) -> Result<Channel> {
        self.to
            .get(peer)
            .copied()
            .flatten()
            .ok_or_else(|| self.bug(self.me, peer, context))
    }

    /// The channel from `peer` to this rank.
    ///
    /// # Errors
    ///
    /// As [`Channels::to`].
    pub(crate) fn from(&self, peer: usize, context: Phase) -> Result<Channel> {
        self.from
            .get(peer)
            .copied()
            .flatten()
            .ok_or_else(|| self.bug(peer, self.me, context))
    }

    fn bug(&self, src: usize, dst: usize, context: Phase) -> Error {
        Error::Bug {
            context,
            what: format!(
                "a shared-memory channel from rank {src} to rank {dst} of {}",
                self.to.len()
            ),
        }
    }
}

/// In the group collective `call` (at its first step, or waiting in it) of local rank
/// `me` (whose channels are `channels`) at step `step`: fails with the mismatch if `peer`
/// sent a message before it that this rank has not taken. `ranks` maps local ranks to
/// the group's.
///
/// # Errors
///
/// The mismatch, or a bug in the layout.
#[inline(always)]
pub(crate) fn unread_from(
    (seg, channels): (&Segment, &Channels),
    (ranks, me, peer): (&[usize], usize, usize),
    step: u32,
    call: &dyn CallHeader,
    context: Phase,
) -> Result<()> {
    let ch = channels.from(peer, context)?;
    let Some((got, sent_at)) = ch.untaken(seg, false, context)? else {
        return Ok(());
    };
    if reached(sent_at, step) {
        // Sent after `peer` left this collective: taken by a later recv.
        return Ok(());
    }
    call.check(ranks[me], ranks[peer], &got)
}

/// At the first step of the group collective `call` of local rank `me` (step `step`, its
/// channels `channels`), once
/// every peer published it: fails with the mismatch if a message sent before it is still
/// untaken, either way (see the module docs).
///
/// # Errors
///
/// The mismatch, or a bug in the layout.
pub(crate) fn unmatched_sends(
    (seg, channels): (&Segment, &Channels),
    (ranks, me): (&[usize], usize),
    step: u32,
    call: &dyn CallHeader,
    context: Phase,
) -> Result<()> {
    for peer in (0..ranks.len()).filter(|&p| p != me) {
        unread_from((seg, channels), (ranks, me, peer), step, call, context)?;
        // `peer` published this step after it took what it took before it.
        let ch = channels.to(peer, context)?;
        let Some((sent, sent_at)) = ch.untaken(seg, true, context)? else {
            continue;
        };
        if reached(sent_at, step) {
            continue;
        }
        // Named as the send it is, against `peer`'s collective (this rank's own).
        return call.unmatched_send((ranks[me], ranks[peer]), &sent, context);
    }
    Ok(())
}

/// Pieces local rank `me` published on its channel to `dst` (tests: a message went
/// through shared memory).
#[cfg(test)]
pub(crate) fn pieces_sent(seg: &Segment, me: usize, dst: usize) -> u32 {
    Channel::new(&seg.layout(), me, dst, Phase::Send)
        .ok()
        .and_then(|ch| seg.word(ch.written(), Phase::Send).ok())
        .map_or(0, |w| w.load(Ordering::Acquire))
}

#[cfg(test)]
mod tests {
    use super::super::segment::CHUNK;
    use super::*;

    #[test]
    fn channels_tile_the_pairs_region_and_keep_their_counters_apart() {
        for size in (2..=9).chain([17, 33]) {
            let l = Layout::new(size, CHUNK, bytes(size));
            let mut bases = Vec::new();
            for src in 0..size {
                assert!(Channel::new(&l, src, src, Phase::Send).is_err());
                assert!(Channel::new(&l, src, size, Phase::Send).is_err());
                for dst in (0..size).filter(|&d| d != src) {
                    let ch = Channel::new(&l, src, dst, Phase::Send).expect("a pair");
                    let words = [
                        ch.written(),
                        ch.sender_sleeps(),
                        ch.read(),
                        ch.receiver_sleeps(),
                    ];
                    for pair in words.windows(2) {
                        assert!(pair[1] - pair[0] >= LINE, "P {size}: {words:?}");
                    }
                    assert!(ch.slot(0) >= ch.receiver_sleeps() + LINE);
                    // Slot n % SLOTS; the last one ends where the channel does.
                    assert_eq!(ch.slot(SLOTS), ch.slot(0));
                    assert_eq!(ch.data(SLOTS - 1) + ch.slot, ch.base + channel_bytes(size));
                    bases.push(ch.base);
                }
            }
            bases.sort_unstable();
            assert_eq!(bases[0], l.pairs());
            for pair in bases.windows(2) {
                assert_eq!(pair[1] - pair[0], channel_bytes(size), "P {size}");
            }
            assert_eq!(bases[bases.len() - 1] + channel_bytes(size), l.bytes());
            assert_eq!(l.pairs() % 4096, 0);
        }
        // The memory the docs state: 257 KiB a pair up to P = 16, then smaller slots.
        for size in [2, 4, 8, 16] {
            assert_eq!(channel_bytes(size), 257 << 10, "P {size}");
        }
        assert_eq!(bytes(4), 12 * (257 << 10));
        assert_eq!(slot_bytes(17), 32 << 10);
        assert_eq!(slot_bytes(64), 4096);
        assert_eq!(slot_bytes(1000), 4096);
        for size in 2..=64 {
            let slots = size * (size - 1) * SLOTS as usize * slot_bytes(size);
            assert!(
                slots <= PAIRS_BUDGET || slot_bytes(size) == 4096,
                "P {size}"
            );
        }
        assert!(bytes(64) < 70 << 20);
    }
}
