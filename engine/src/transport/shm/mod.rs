//! Shared memory between the ranks of one host: one segment per host's ranks, through
//! which every group collective and every `send`/`recv` goes ([`Link`]).
//!
//! - `segment`: the mapping and its layout, and its setup over the TCP mesh;
//! - `domain`: the setup's check that every rank really shares the segment (sans-IO);
//! - `protocol`: the schedule, a state machine with no memory, clock or waiting;
//! - `engine`: drives that machine on the segment with `comm::progress`'s wait policy;
//! - `p2p`: the per-pair slots of `send`/`recv`.
//!
//! The TCP mesh stays: it carries the setup (the segment's nonce), the answer to a refused
//! message, and it is how a rank learns that a co-located peer died (its connections
//! close) while it waits. What the wire above says in a call's header, and how two headers
//! compare, is that wire's: it hands each call in as a [`CallHeader`].
//!
//! # Copies
//!
//! Each rank copies its input once into its buffer (the peers cannot read the caller's
//! memory); folds read the peers' buffers in place with the SIMD kernels, into the
//! caller's memory. What remains besides that one copy in:
//!
//! - a one-shot all-reduce (small ones, and every size at P = 2): rank 0 folds the peers'
//!   buffers straight onto its own data, no further copy; every other rank first copies
//!   rank 0's chunk out onto its data and folds the rest (itself included, from its own
//!   buffer) onto that, because every rank must fold in rank order from x0 to get the
//!   same bits (the kernel computes `acc op incoming`; `x1 op x0` may differ from
//!   `x0 op x1`, in NaN payloads for one);
//! - an all-reduce by shares (large, P >= 3): each rank folds its share as above, copies
//!   the result back into shared memory and copies the other ranks' shares out, because
//!   the result must reach each caller's own memory, which no peer can write;
//! - all_gather, broadcast and all_to_all copy each piece out of its owner's buffer once
//!   (the root's own data, and a rank's own block, are not copied at all in the first
//!   place where they need not be); sum_scatter copies rank 0's piece of its block out
//!   onto the output and folds the others' pieces onto it, as the one-shot does.

mod domain;
mod engine;
mod p2p;
mod protocol;
mod segment;

use std::time::Duration;

pub(crate) use domain::SETUP;
pub(crate) use engine::Watch;
use engine::{Memory, run};
#[cfg(test)]
pub(crate) use p2p::{SLOT, SLOTS};
use protocol::{Collective, Steps, one_shot};
pub(crate) use segment::{CHUNK, CallHeader, HEADER_BYTES, read_exact, write_all};
use segment::{Layout, Segment};
#[cfg(test)]
pub(crate) use segment::{OFFER_BYTES, segment_path};

use crate::comm::progress::WaitPolicy;
use crate::comm::state::CloseFlag;
use crate::element::DType;
use crate::error::Result;
use crate::reduce::ReduceOp;
use crate::transport::tcp::Connections as Transport;

/// What [`Link::gather`] gathers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Gather {
    /// An all_gather: `input` is this rank's one block, `output` every rank's.
    All,
    /// An all_to_all: `input` and `output` are P blocks each; block `j` of `input` goes to
    /// rank `j`, and `output`'s block `i` comes from rank `i`.
    ToAll,
}

/// One rank's end of a segment (see the module docs).
#[derive(Debug)]
pub(crate) struct Link {
    seg: Segment,
    steps: Steps,
    /// The segment's own wait policy (a hierarchical group's TCP links have another).
    spin: WaitPolicy,
    timeout: Duration,
}

impl Link {
    /// Sets up the segment of the ranks `ranks` (the group's, in increasing order; this
    /// rank at position `me`) over the formed mesh (see `segment`): `Ok(None)` if their
    /// first rank could not create one or a peer could not open it (every one of them then
    /// keeps TCP, and all of them know it: see `domain`).
    ///
    /// # Errors
    ///
    /// A peer that closes, stalls past `timeout`, or sends a status or verdict the setup
    /// does not allow.
    pub(crate) fn establish(
        transport: &mut Transport,
        (ranks, me): (&[usize], usize),
        group: &[u8; 32],
        timeout: Duration,
        spin: WaitPolicy,
    ) -> Result<Option<Link>> {
        let size = ranks.len();
        let layout = Layout::new(size, CHUNK, p2p::bytes(size));
        let Some(seg) = segment::establish(layout, transport, (ranks, me), group, timeout)? else {
            return Ok(None);
        };
        let mut link = Link {
            seg,
            steps: Steps::new(layout, ranks, me),
            spin,
            timeout,
        };
        if me == 0 {
            // The peers' counts, seen through this rank's map: the segment is one.
            let closed = CloseFlag::default();
            let mut watch = Watch {
                transport,
                closed: &closed,
                context: SETUP,
                call: None,
            };
            link.run(Collective::Mapped, None, Memory::empty(), &mut watch)?;
            link.seg.remove()?;
        }
        Ok(Some(link))
    }

    /// Runs `collective` to its end (see `engine`).
    fn run(
        &mut self,
        collective: Collective,
        call: Option<&dyn CallHeader>,
        mem: Memory<'_>,
        watch: &mut Watch<'_>,
    ) -> Result<()> {
        run(
            &self.seg,
            &mut self.steps,
            (collective, call),
            mem,
            watch,
            (self.timeout, &mut self.spin),
        )
    }

    /// After a step whose headers did not all match: a peer header of that step that
    /// differs from `mine`, and whether more peers agree on it than with this rank (a
    /// hierarchical group's leader passes one of the two calls on to the other hosts).
    pub(crate) fn differing(
        &self,
        mine: &[u8; HEADER_BYTES],
    ) -> Option<([u8; HEADER_BYTES], bool)> {
        let (me, size) = (self.steps.me(), self.steps.size());
        let half = (self.steps.step() % 2) as usize;
        let layout = self.seg.layout();
        let mut seen = Vec::with_capacity(size);
        for p in (0..size).filter(|&p| p != me) {
            seen.push(self.seg.header(layout.header(p, half), SETUP).ok()?);
        }
        let other = *seen.iter().find(|h| *h != mine)?;
        let with_me = 1 + seen.iter().filter(|h| *h == mine).count();
        let with_other = seen.iter().filter(|h| **h == other).count();
        Some((other, with_other > with_me))
    }

    /// Whether the segment's pages are locked in memory.
    pub(crate) fn locked(&self) -> bool {
        self.seg.locked()
    }

    /// A broadcast of `data` from local rank `root`.
    ///
    /// # Errors
    ///
    /// A mismatch, a peer that died or stayed silent past the timeout, a close.
    pub(crate) fn broadcast(
        &mut self,
        call: &dyn CallHeader,
        data: &mut [u8],
        root: usize,
        watch: &mut Watch<'_>,
    ) -> Result<()> {
        let collective = Collective::Broadcast {
            root,
            len: data.len(),
        };
        self.run(collective, Some(call), Memory::data(data), watch)
    }

    /// A barrier: one step of headers.
    ///
    /// # Errors
    ///
    /// As [`Link::broadcast`].
    pub(crate) fn barrier(&mut self, call: &dyn CallHeader, watch: &mut Watch<'_>) -> Result<()> {
        self.run(Collective::Barrier, Some(call), Memory::empty(), watch)
    }

    /// An all-reduce of `data` in place, by the schedule [`one_shot`] picks.
    ///
    /// # Errors
    ///
    /// As [`Link::broadcast`].
    pub(crate) fn all_reduce(
        &mut self,
        call: &dyn CallHeader,
        (op, dtype): (ReduceOp, DType),
        data: &mut [u8],
        watch: &mut Watch<'_>,
    ) -> Result<()> {
        let one_shot = one_shot(self.steps.size(), data.len());
        self.all_reduce_by(one_shot, call, (op, dtype), data, watch)
    }

    /// An all-reduce of `data` in place, one-shot or by shares (see `protocol`; tests and
    /// measurements force one).
    ///
    /// # Errors
    ///
    /// As [`Link::broadcast`].
    pub(crate) fn all_reduce_by(
        &mut self,
        one_shot: bool,
        call: &dyn CallHeader,
        (op, dtype): (ReduceOp, DType),
        data: &mut [u8],
        watch: &mut Watch<'_>,
    ) -> Result<()> {
        self.reduce((one_shot, true), call, (op, dtype), data, watch)
    }

    /// A reduction of `data` whose result only the segment's first rank needs (a
    /// hierarchical group's leader, which passes it on): the schedule and the folds of an
    /// all-reduce, but the other ranks fold nothing one-shot and copy no shares out. Their
    /// `data` is left partly folded.
    ///
    /// # Errors
    ///
    /// As [`Link::broadcast`].
    pub(crate) fn reduce_to_first(
        &mut self,
        call: &dyn CallHeader,
        (op, dtype): (ReduceOp, DType),
        data: &mut [u8],
        watch: &mut Watch<'_>,
    ) -> Result<()> {
        let one_shot = one_shot(self.steps.size(), data.len());
        self.reduce((one_shot, false), call, (op, dtype), data, watch)
    }

    fn reduce(
        &mut self,
        (one_shot, keep): (bool, bool),
        call: &dyn CallHeader,
        (op, dtype): (ReduceOp, DType),
        data: &mut [u8],
        watch: &mut Watch<'_>,
    ) -> Result<()> {
        let collective = Collective::AllReduce {
            op,
            dtype,
            len: data.len(),
            one_shot,
            keep,
        };
        self.run(collective, Some(call), Memory::data(data), watch)
    }

    /// A gather of blocks (see [`Gather`]): `output` holds this rank's own block already
    /// (for an all_gather, its group rank's: a domain of a hierarchical group fills its
    /// own ranks' blocks).
    ///
    /// # Errors
    ///
    /// As [`Link::broadcast`].
    pub(crate) fn gather(
        &mut self,
        call: &dyn CallHeader,
        kind: Gather,
        (input, output): (&[u8], &mut [u8]),
        watch: &mut Watch<'_>,
    ) -> Result<()> {
        let collective = match kind {
            Gather::All => Collective::AllGather { len: input.len() },
            Gather::ToAll => Collective::AllToAll {
                block: input.len() / self.steps.size(),
            },
        };
        self.run(collective, Some(call), Memory::io(input, output), watch)
    }

    /// A sum_scatter: `input` is P blocks of `output.len()` bytes; this rank's block of
    /// the sum lands in `output`.
    ///
    /// # Errors
    ///
    /// As [`Link::broadcast`].
    pub(crate) fn sum_scatter(
        &mut self,
        call: &dyn CallHeader,
        dtype: DType,
        input: &[u8],
        output: &mut [u8],
        watch: &mut Watch<'_>,
    ) -> Result<()> {
        let collective = Collective::SumScatter {
            dtype,
            block: output.len(),
        };
        let mem = Memory::io(input, output);
        self.run(collective, Some(call), mem, watch)
    }

    /// Sends `data` to local rank `dst` (`call` is the send's; see `p2p`): returns once
    /// every piece is in the slots, which `dst` takes in its `recv`.
    ///
    /// # Errors
    ///
    /// `dst` in a group collective while the slots are full (a mismatch), `dst` dead or
    /// silent past the timeout, a close, or a refusal of an earlier message read meanwhile.
    pub(crate) fn send(
        &mut self,
        call: &dyn CallHeader,
        data: &[u8],
        dst: usize,
        watch: &mut Watch<'_>,
    ) -> Result<()> {
        let sent = self.counter(dst, true, watch)?;
        let collective = Collective::Send {
            dst,
            len: data.len(),
            sent,
        };
        let mem = Memory {
            data: &mut [],
            input: data,
        };
        self.run(collective, Some(call), mem, watch)
    }

    /// Receives `data.len()` bytes from local rank `src` (`call` is the recv's; see `p2p`).
    ///
    /// # Errors
    ///
    /// A message of another length or order (the mismatch, also answered to `src`), `src`
    /// in a group collective (the mismatch, left where `src` sees it), `src` dead or silent
    /// past the timeout, or a close.
    pub(crate) fn recv(
        &mut self,
        call: &dyn CallHeader,
        data: &mut [u8],
        src: usize,
        watch: &mut Watch<'_>,
    ) -> Result<()> {
        let taken = self.counter(src, false, watch)?;
        let collective = Collective::Recv {
            src,
            len: data.len(),
            taken,
        };
        self.run(collective, Some(call), Memory::data(data), watch)
    }

    /// The counter this rank writes on its channel with `peer`: the pieces it published
    /// to `peer` (`sending`), or took from it. Only this rank writes it.
    fn counter(&self, peer: usize, sending: bool, watch: &Watch<'_>) -> Result<u32> {
        let channels = self.steps.channels();
        let ch = if sending {
            channels.to(peer, watch.context)?
        } else {
            channels.from(peer, watch.context)?
        };
        let off = if sending { ch.written() } else { ch.read() };
        Ok(self
            .seg
            .word(off, watch.context)?
            .load(std::sync::atomic::Ordering::Relaxed))
    }
}

#[cfg(test)]
impl Link {
    /// The last step this rank published (tests: a collective went through the segment).
    pub(crate) fn step(&self) -> u32 {
        self.steps.step()
    }

    /// Pieces this rank published on its channel to local rank `dst` (tests: a message
    /// went through shared memory).
    pub(crate) fn pieces_sent(&self, dst: usize) -> u32 {
        p2p::pieces_sent(&self.seg, self.steps.me(), dst)
    }
}
