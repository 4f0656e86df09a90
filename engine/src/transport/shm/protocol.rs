//! Shared memory's schedule as a state machine with no memory, clock or waiting
//! ([`Steps`]): how a collective, a `send` or a `recv` is cut into steps, and which bytes
//! each step moves. The machine names offsets in the segment and ranges of the caller's
//! memory; `super::engine` performs what it names and waits where it says.
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
//! - **all-reduce by shares** (larger, P >= 3): per chunk of [`CHUNK`] bytes, two steps.
//!   In the first, every rank copies its chunk in, and rank `j` folds share `j` of it
//!   ([`share`]) from all P buffers straight into its own output, then copies the result
//!   into its *other* buffer (the one of the second step); in the second, every rank
//!   copies the other shares out of their owners' buffers.
//! - **all_gather**: per chunk, one step: copy in, then copy every peer's piece out.
//! - **sum_scatter**: per chunk of the output, one step: every rank copies in its pieces of
//!   all P blocks, and folds its own block's pieces from all P buffers.
//! - **broadcast**: per chunk, one step: the root copies its piece in, every other rank
//!   copies it out of the root's buffer.
//! - **all_to_all**: per piece of a block ([`CHUNK`] / P bytes), one step: every rank
//!   copies in its pieces of the P - 1 blocks bound for its peers (block `j` at `j` pieces
//!   into its buffer), then copies piece `me` of every peer's buffer into its output.
//! - **send**/**recv**: per piece of a slot, the channel's counters (see `super::p2p`).
//!
//! Folds combine in rank order, `x0 op x1 op ... op x(P-1)`, with the same kernel on every
//! rank, as the TCP native wire's direct algorithms do: every rank gets the same bits.
//!
//! # The machine
//!
//! [`Steps::start`] takes a [`Collective`]; then, until [`Steps::is_finished`], the driver
//! asks in the crate's protocol vocabulary (the one ring lanes and native exchanges
//! speak):
//!
//! 1. [`Steps::poll_transmit`]: what this rank writes into its own part of the segment
//!    next ([`Transmit`]: a copy in, its header, a step published); once written,
//!    [`Steps::handle_sent`];
//! 2. [`Steps::poll_receive`]: what it reads from the peers' parts next ([`Receive`]: a
//!    word that must have reached a value, a header to compare, a copy out, a fold); once
//!    done, [`Steps::handle_received`]. A [`Receive::Reached`] whose word has not reached
//!    its value is not done: the machine waits there, and [`Steps::poll_wait`] says on
//!    which peer's word, for which value, and where that word's sleepers are counted;
//! 3. [`Steps::take_progress`]: whether anything was done since it was last asked.
//!
//! The operations come one at a time in the order the schedule needs them (at any moment
//! one of the two polls offers something, until the machine finishes); [`Steps::poll`]
//! gives whichever of the two comes next, with one look at the plan. Nothing is
//! allocated per collective once the machine saw its first: it plans one piece at a time
//! into a buffer it keeps, one for each parity of the piece's step. A group collective of
//! one piece is planned once per shape: the next collective equal to it, at a step of the
//! same parity, reuses that plan with its step values moved to its own steps (a small
//! collective's operations differ from the last but one's in nothing else).
//!
//! A small collective is all overhead: a 4 B all-reduce at P = 3 is six operations
//! (copy in, publish with the header, two peers' steps, the headers, the fold), so an
//! operation is as coarse as one memory action allows (the headers of every peer, the
//! rank-order fold of every buffer), and the polls, the segment's accessors and the
//! mapping's (`ffi::shm::Segment`, across the crate boundary) are `#[inline]`. CPU time
//! per 4 B all-reduce at P = 2 against a peer that is always ahead
//! (`engine::tests::measure_the_engine_per_collective`, on the loaded 2-core VM): ~62 ns
//! for the machine and its engine, ~80 ns with the mapping's accessors called out of line
//! (a small collective's latency at P = 2 on shared memory is ~0.35 µs, the rest of it
//! the cache lines' round trip between the CPUs).
//!
//! # A `recv` against a group collective
//!
//! A `recv` is not a step (its message travels through its pair's slots), so a rank in a
//! `recv` from `src` while `src` runs a group collective would wait for a send that never
//! comes while `src` waits for a step that never comes. The `recv` therefore also watches
//! `src`'s step word: once `src` published a step this rank has not, `src` is in a group
//! collective this rank is not in (unless `src`'s message is in the slots already: a send
//! precedes the step it publishes after it). The `recv` fails with the mismatch, naming
//! `src`'s call from its header, and leaves its own header and `src + 1` in its refusal
//! slot and word, which every rank that waits for its step looks at: they fail with the
//! mismatch too, naming the `recv`, instead of waiting out their timeout. The engine
//! does those checks ([`Awaited`] says which apply to a wait).

use std::ops::Range;

use super::p2p::{Channel, Channels, SLOTS};
#[cfg(doc)]
use super::segment::CHUNK;
use super::segment::Layout;
use crate::comm::algorithm;
use crate::comm::part;
use crate::element::DType;
use crate::error::{Phase, Result};
use crate::reduce::ReduceOp;

/// Whether an all-reduce of `bytes` over `size` ranks goes one-shot (every rank folds
/// every chunk whole) rather than by shares (see the module docs): the choice of
/// `comm::algorithm`'s table for shared memory.
pub(crate) fn one_shot(size: usize, bytes: usize) -> bool {
    algorithm::shm_one_shot(size, bytes)
}

/// How many pieces `0..total` is cut into, at most `per` each: at least one (empty for
/// `total == 0`), so every collective has a step and its header is compared.
pub(crate) fn piece_count(total: usize, per: usize) -> usize {
    if total <= per {
        // Most collectives: no division.
        1
    } else {
        total.div_ceil(per.max(1))
    }
}

/// Piece `i` of `0..total` cut into pieces of at most `per` (see [`piece_count`]).
pub(crate) fn nth_piece(total: usize, per: usize, i: usize) -> Range<usize> {
    let per = per.max(1);
    (i * per).min(total)..((i + 1) * per).min(total)
}

/// The elements of share `j` of the chunk `chunk` (element indices) among `size` ranks:
/// `ceil(len / size)` each, the last ones shorter or empty (as MLX's ring cuts its parts).
pub(crate) fn share(chunk: &Range<usize>, size: usize, j: usize) -> Range<usize> {
    let r = part(chunk.len(), size, j);
    chunk.start + r.start..chunk.start + r.end
}

/// What a collective works on, as the machine runs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Collective {
    /// One step of headers.
    Barrier,
    /// `len` bytes of the caller's data, from local rank `root`.
    Broadcast { root: usize, len: usize },
    /// The caller's input and output: P blocks of `block` bytes each.
    AllToAll { block: usize },
    /// The caller's `len` bytes of data in place, one-shot or by shares; `keep`: every
    /// rank wants the result (else only local rank 0, whose peers fold only their
    /// shares, or nothing one-shot, and whose data is left partly folded).
    AllReduce {
        op: ReduceOp,
        dtype: DType,
        len: usize,
        one_shot: bool,
        keep: bool,
    },
    /// The caller's `len` bytes of input into its output, at each rank's group rank.
    AllGather { len: usize },
    /// The caller's input of P blocks of `block` bytes; this rank's block of the sum into
    /// its output.
    SumScatter { dtype: DType, block: usize },
    /// The caller's `len` bytes of input to local rank `dst`, whose channel had `sent`
    /// pieces published before.
    Send { dst: usize, len: usize, sent: u32 },
    /// `len` bytes from local rank `src` into the caller's data; `taken` pieces of the
    /// channel were taken before.
    Recv { src: usize, len: usize, taken: u32 },
    /// Setup: local rank 0 waits until every peer counted itself in on the segment.
    Mapped,
}

/// Where a copy into the segment takes its bytes: the caller's data (read and written by
/// the collective) or its read-only input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    Data(Range<usize>),
    Input(Range<usize>),
}

/// What this rank writes into its own part of the segment next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Transmit {
    /// Copy the caller's bytes `from` into the segment at `to`.
    CopyIn { from: Source, to: usize },
    /// Write the call's header at `to`.
    Header { to: usize },
    /// Write `step` (u32, little-endian) at `to`: the step a `send`'s piece went at.
    Stamp { to: usize, step: u32 },
    /// Write the call's header at `header` if there is one (a collective's first step),
    /// store `value` in the word at `word` (sequentially consistent), then wake whoever
    /// sleeps on it if the count at `sleepers` is not zero.
    Publish {
        header: Option<usize>,
        word: usize,
        value: u32,
        sleepers: usize,
    },
}

/// What a wait is for, which says what else may end it (see `super::engine`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Awaited {
    /// A peer's step word: the peer's step. A peer that failed after publishing it still
    /// counts.
    Step,
    /// The channel's `read` counter: room for this rank's next piece.
    Room,
    /// The channel's `written` counter: the next piece from the peer.
    Piece,
    /// The count of peers that mapped the segment (setup).
    Mapped,
}

/// A word that must reach a value before the machine goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Await {
    /// The local rank whose word it is (or, for [`Awaited::Mapped`], the first one that
    /// may be missing): the one a silence is blamed on.
    pub(crate) peer: usize,
    /// Where the word sits.
    pub(crate) word: usize,
    /// The value it must reach (compared wrapping: see `segment::reached`).
    pub(crate) value: u32,
    /// Where a rank sleeping on the word counts itself, if anywhere (the word's writer
    /// wakes the sleepers it counts).
    pub(crate) sleepers: Option<usize>,
    pub(crate) kind: Awaited,
}

/// What this rank reads from the segment next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Receive {
    /// A word must have reached a value: done only once it has.
    Reached(Await),
    /// Compare every peer's header for steps of parity `half` with the call (in rank
    /// order), then look for messages sent before the collective and not taken either
    /// way, which make a mismatch (see `super::p2p`): the first step of every group
    /// collective, once every peer published it.
    Headers { half: usize },
    /// Compare the header of `peer`'s message at `from` (its first piece) with the call,
    /// a `recv`; the sender learns of a refusal on its connection.
    Message { peer: usize, from: usize },
    /// Copy the segment's bytes at `from` into the caller's data `to`.
    CopyOut { from: usize, to: Range<usize> },
    /// Combine every rank's buffer into the caller's data (see [`Combine`]).
    Combine(Combine),
}

/// Combine every rank's buffer `half` at `at` into the caller's data `into`, in rank order:
/// `into = x0 op x1 op ... op x(P-1)`, each fold `into op x_p` with the crate's kernel, so
/// that every rank gets the same bits. `holds_first`: `into` holds `x0` already (rank 0's
/// own data); else `x0` is first copied out of rank 0's buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Combine {
    pub(crate) half: usize,
    pub(crate) at: usize,
    pub(crate) into: Range<usize>,
    pub(crate) holds_first: bool,
    pub(crate) op: ReduceOp,
    pub(crate) dtype: DType,
}

impl Combine {
    /// The reads, in order: the offset of each rank's buffer in `layout`, and whether it
    /// is folded into `into` (else copied there: rank 0's, unless `into` holds it).
    #[inline]
    pub(crate) fn reads(&self, layout: Layout) -> impl Iterator<Item = (usize, bool)> {
        let (half, at) = (self.half, self.at);
        let first = usize::from(self.holds_first);
        (first..layout.size()).map(move |p| (layout.data(p, half) + at, p > 0))
    }
}

/// One operation of the plan: a write or a read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Transmit(Transmit),
    Receive(Receive),
}

/// One rank's schedule on a segment: the step it last published, and the collective in
/// flight (see the module docs).
#[derive(Debug)]
pub(crate) struct Steps {
    layout: Layout,
    /// The group rank of each local rank, in increasing order.
    ranks: Vec<usize>,
    me: usize,
    channels: Channels,
    /// The last step this rank published.
    step: u32,
    collective: Collective,
    /// The channel of a `send` or `recv`.
    channel: Option<Channel>,
    /// Pieces of the collective, and the next one to plan.
    pieces: usize,
    next: usize,
    /// The operations of the current piece, and the next one to do; `odd`: whether the
    /// piece's step is odd.
    ops: Vec<Op>,
    at: usize,
    odd: bool,
    /// The operations of the last piece at a step of the other parity.
    spare: Vec<Op>,
    /// For the operations of even and of odd steps, when they are a whole group
    /// collective of one piece: that collective and the step it was planned at. Such a
    /// plan depends on nothing else but the parity of that step (which of the two
    /// buffers each rank uses), and its step values (every value it publishes or awaits)
    /// are the only ones that follow the step: the next equal collective at a step of the
    /// same parity reuses it, those values moved by `shift` as the polls hand them out.
    shapes: [Option<(Collective, u32)>; 2],
    /// What the values the current plan publishes and awaits are moved by: the steps
    /// since it was planned (0 for a plan made for this collective).
    shift: u32,
    progress: bool,
}

impl Steps {
    /// The schedule of local rank `me` of a segment laid out as `layout`, whose ranks are
    /// the group's `ranks` (in increasing order), before its first step.
    pub(crate) fn new(layout: Layout, ranks: &[usize], me: usize) -> Steps {
        Steps {
            layout,
            ranks: ranks.to_vec(),
            me,
            channels: Channels::new(&layout, me),
            step: 0,
            collective: Collective::Barrier,
            channel: None,
            pieces: 0,
            next: 0,
            ops: Vec::new(),
            at: 0,
            odd: false,
            spare: Vec::new(),
            shapes: [None; 2],
            shift: 0,
            progress: false,
        }
    }

    /// The last step this rank published.
    #[inline]
    pub(crate) fn step(&self) -> u32 {
        self.step
    }

    /// This rank's local rank.
    #[inline]
    pub(crate) fn me(&self) -> usize {
        self.me
    }

    /// Ranks on the segment.
    #[inline]
    pub(crate) fn size(&self) -> usize {
        self.ranks.len()
    }

    /// The group rank of each local rank.
    #[inline]
    pub(crate) fn ranks(&self) -> &[usize] {
        &self.ranks
    }

    /// The layout.
    #[inline]
    pub(crate) fn layout(&self) -> Layout {
        self.layout
    }

    /// This rank's `send`/`recv` channels.
    #[inline]
    pub(crate) fn channels(&self) -> &Channels {
        &self.channels
    }

    /// Starts `collective` (the previous one finished or failed).
    ///
    /// Inline for a collective whose plan is kept (see `shapes`), which only moves a few
    /// fields; planning one afresh is [`Steps::start_planned`], out of line, so that the
    /// common case does not pay for its frame.
    ///
    /// # Errors
    ///
    /// A bug: a `send` or `recv` whose peer is this rank or not on the segment.
    #[inline]
    pub(crate) fn start(&mut self, collective: Collective, context: Phase) -> Result<()> {
        let s = self.step.wrapping_add(1);
        // The plan of the last collective of this shape at a step of this parity: its
        // one piece, as planning it again would make it but for the step values.
        if let Some((shape, planned)) = self.shapes[usize::from(s % 2 == 1)]
            && shape == collective
        {
            self.parity(s);
            self.at = 0;
            self.collective = collective;
            self.channel = None;
            self.pieces = 1;
            self.next = 1;
            self.shift = s.wrapping_sub(planned);
            return Ok(());
        }
        self.start_planned(collective, context)
    }

    /// [`Steps::start`] for a collective planned afresh.
    #[inline(never)]
    fn start_planned(&mut self, collective: Collective, context: Phase) -> Result<()> {
        let s = self.step.wrapping_add(1);
        let (size, l) = (self.size(), self.layout);
        self.channel = match collective {
            Collective::Send { dst, .. } => Some(self.channels.to(dst, context)?),
            Collective::Recv { src, .. } => Some(self.channels.from(src, context)?),
            _ => None,
        };
        let (total, per) = match collective {
            Collective::Barrier | Collective::Mapped => (0, 1),
            // An all-reduce's chunks are whole elements: the buffers are whole pages.
            Collective::Broadcast { len, .. }
            | Collective::AllGather { len }
            | Collective::AllReduce { len, .. } => (len, l.chunk()),
            Collective::AllToAll { block } => (block, l.chunk() / size),
            Collective::SumScatter { dtype, block } => {
                (block / dtype.size(), l.chunk() / (size * dtype.size()))
            }
            Collective::Send { len, .. } | Collective::Recv { len, .. } => {
                (len, self.channel.map_or(1, Channel::slot_bytes))
            }
        };
        self.collective = collective;
        self.pieces = piece_count(total, per);
        self.next = 0;
        self.shift = 0;
        // Planned afresh: `plan` starts once the current buffer has nothing left.
        self.parity(s);
        self.at = 0;
        self.ops.clear();
        self.plan();
        Ok(())
    }

    /// Makes the plan of steps of `s`'s parity the current one.
    #[inline]
    fn parity(&mut self, s: u32) {
        let odd = s % 2 == 1;
        if odd != self.odd {
            std::mem::swap(&mut self.ops, &mut self.spare);
            self.odd = odd;
        }
    }

    /// What this rank does next: the write [`Steps::poll_transmit`] or the read
    /// [`Steps::poll_receive`] would give, whichever one gives something.
    #[inline]
    pub(crate) fn poll(&self) -> Option<Op> {
        self.ops.get(self.at).map(|op| self.shifted(op))
    }

    /// `op` of the current plan as the polls hand it out: its step values moved by the
    /// plan's shift (a reused plan keeps the values of the collective it was made for).
    #[inline]
    pub(super) fn shifted(&self, op: &Op) -> Op {
        match op {
            Op::Transmit(Transmit::Publish {
                header,
                word,
                value,
                sleepers,
            }) => Op::Transmit(Transmit::Publish {
                header: *header,
                word: *word,
                value: value.wrapping_add(self.shift),
                sleepers: *sleepers,
            }),
            Op::Receive(Receive::Reached(a)) => Op::Receive(Receive::Reached(self.moved(a))),
            op => op.clone(),
        }
    }

    /// What this rank writes next, if a write comes next.
    #[cfg(test)]
    #[inline]
    pub(crate) fn poll_transmit(&self) -> Option<Transmit> {
        match self.poll()? {
            Op::Transmit(t) => Some(t),
            Op::Receive(_) => None,
        }
    }

    /// The write [`Steps::poll_transmit`] gave is done.
    #[inline]
    pub(crate) fn handle_sent(&mut self) {
        if let Some(Op::Transmit(Transmit::Publish { word, value, .. })) = self.ops.get(self.at)
            && *word == self.layout.step(self.me)
        {
            self.step = value.wrapping_add(self.shift);
        }
        self.done();
    }

    /// What this rank reads next, if a read comes next.
    #[cfg(test)]
    #[inline]
    pub(crate) fn poll_receive(&self) -> Option<Receive> {
        match self.ops.get(self.at) {
            Some(Op::Receive(Receive::Reached(a))) => Some(Receive::Reached(self.moved(a))),
            Some(Op::Receive(r)) => Some(r.clone()),
            _ => None,
        }
    }

    /// The read [`Steps::poll_receive`] gave is done (for [`Receive::Reached`]: the word
    /// reached its value).
    #[inline]
    pub(crate) fn handle_received(&mut self) {
        self.done();
    }

    /// The word the machine waits on, if its next read is one.
    #[inline]
    pub(crate) fn poll_wait(&self) -> Option<Await> {
        match self.ops.get(self.at) {
            Some(Op::Receive(Receive::Reached(a))) => Some(self.moved(a)),
            _ => None,
        }
    }

    /// `a` with its value moved to the current collective's steps.
    #[inline]
    fn moved(&self, a: &Await) -> Await {
        Await {
            value: a.value.wrapping_add(self.shift),
            ..*a
        }
    }

    /// Whether the collective is complete.
    #[inline]
    pub(crate) fn is_finished(&self) -> bool {
        self.at >= self.ops.len() && self.next >= self.pieces
    }

    /// Whether anything was done since the last call.
    #[inline]
    pub(crate) fn take_progress(&mut self) -> bool {
        std::mem::take(&mut self.progress)
    }

    #[inline]
    fn done(&mut self) {
        self.at += 1;
        self.progress = true;
        // The last piece's end (most collectives have one) stays out of `plan`.
        if self.at >= self.ops.len() && self.next < self.pieces {
            self.plan();
        }
    }

    /// Plans the next piece (if any is left) into the buffer of its step's parity,
    /// replacing what that buffer held. A group collective of one piece keeps its plan
    /// there for the next of its shape (see `shapes`).
    fn plan(&mut self) {
        while self.at >= self.ops.len() && self.next < self.pieces {
            let s = self.step.wrapping_add(1);
            self.parity(s);
            let reusable = self.pieces == 1
                && !matches!(
                    self.collective,
                    Collective::Send { .. } | Collective::Recv { .. } | Collective::Mapped
                );
            self.ops.clear();
            self.shapes[usize::from(self.odd)] = None;
            self.at = 0;
            self.shift = 0;
            let k = self.next;
            self.next += 1;
            self.plan_piece(k);
            if reusable {
                self.shapes[usize::from(self.odd)] = Some((self.collective, s));
            }
            // The other parity's buffer grows with this one, so that a piece first planned
            // at the other parity (after warm-up) allocates nothing either.
            if self.spare.capacity() < self.ops.capacity() {
                self.spare
                    .reserve_exact(self.ops.capacity() - self.spare.len());
            }
        }
    }

    #[inline]
    fn tx(&mut self, t: Transmit) {
        self.ops.push(Op::Transmit(t));
    }

    #[inline]
    fn rx(&mut self, r: Receive) {
        self.ops.push(Op::Receive(r));
    }

    /// One step (see the module docs): this call's header at a collective's first step,
    /// `step` published, every peer's awaited, and at the first step their headers
    /// compared and the messages sent before it looked at.
    fn plan_step(&mut self, first: bool, step: u32) {
        let (me, size, l) = (self.me, self.size(), self.layout);
        let half = (step % 2) as usize;
        self.tx(Transmit::Publish {
            header: first.then(|| l.header(me, half)),
            word: l.step(me),
            value: step,
            sleepers: l.sleepers(me),
        });
        for peer in (0..size).filter(|&p| p != me) {
            self.rx(Receive::Reached(Await {
                peer,
                word: l.step(peer),
                value: step,
                sleepers: Some(l.sleepers(peer)),
                kind: Awaited::Step,
            }));
        }
        if first {
            self.rx(Receive::Headers { half });
        }
    }

    /// The operations of piece `k` of the collective.
    fn plan_piece(&mut self, k: usize) {
        let (me, size, l) = (self.me, self.size(), self.layout);
        let first = k == 0;
        let s = self.step.wrapping_add(1);
        let h = (s % 2) as usize;
        let others = move || (0..size).filter(move |&p| p != me);
        match self.collective {
            Collective::Barrier => self.plan_step(first, s),
            Collective::Broadcast { root, len } => {
                let piece = nth_piece(len, l.chunk(), k);
                if me == root {
                    let from = Source::Data(piece.clone());
                    self.tx(Transmit::CopyIn {
                        from,
                        to: l.data(me, h),
                    });
                }
                self.plan_step(first, s);
                if me != root {
                    let from = l.data(root, h);
                    self.rx(Receive::CopyOut { from, to: piece });
                }
            }
            Collective::AllToAll { block } => {
                let per = (l.chunk() / size).max(1);
                let piece = nth_piece(block, per, k);
                let at = |j: usize| j * block + piece.start..j * block + piece.end;
                for j in others() {
                    let to = l.data(me, h) + j * per;
                    let from = Source::Input(at(j));
                    self.tx(Transmit::CopyIn { from, to });
                }
                self.plan_step(first, s);
                for p in others() {
                    let from = l.data(p, h) + me * per;
                    self.rx(Receive::CopyOut { from, to: at(p) });
                }
            }
            Collective::AllReduce {
                op,
                dtype,
                len,
                one_shot,
                keep,
            } => {
                let bytes = nth_piece(len, l.chunk(), k);
                let wants = keep || me == 0;
                let from = Source::Data(bytes.clone());
                self.tx(Transmit::CopyIn {
                    from,
                    to: l.data(me, h),
                });
                self.plan_step(first, s);
                if one_shot {
                    if wants {
                        // Rank 0's own data is x0 already.
                        self.rx(Receive::Combine(Combine {
                            half: h,
                            at: 0,
                            into: bytes,
                            holds_first: me == 0,
                            op,
                            dtype,
                        }));
                    }
                    return;
                }
                let ds = dtype.size();
                let chunk = bytes.start / ds..bytes.end / ds;
                let mine = share(&chunk, size, me);
                let at = (mine.start - chunk.start) * ds;
                let target = mine.start * ds..mine.end * ds;
                if !target.is_empty() {
                    self.rx(Receive::Combine(Combine {
                        half: h,
                        at,
                        into: target.clone(),
                        holds_first: me == 0,
                        op,
                        dtype,
                    }));
                    // Into the buffer of the next step, which no peer reads before it.
                    self.tx(Transmit::CopyIn {
                        from: Source::Data(target),
                        to: l.data(me, 1 - h) + at,
                    });
                }
                self.plan_step(false, s.wrapping_add(1));
                for p in others().filter(|_| wants) {
                    let theirs = share(&chunk, size, p);
                    let at = (theirs.start - chunk.start) * ds;
                    let to = theirs.start * ds..theirs.end * ds;
                    let from = l.data(p, 1 - h) + at;
                    self.rx(Receive::CopyOut { from, to });
                }
            }
            Collective::AllGather { len } => {
                let piece = nth_piece(len, l.chunk(), k);
                let from = Source::Input(piece.clone());
                self.tx(Transmit::CopyIn {
                    from,
                    to: l.data(me, h),
                });
                self.plan_step(first, s);
                for p in others() {
                    // At the peer's group rank: a domain of a hierarchical group fills
                    // its own ranks' blocks of the whole output.
                    let at = self.ranks[p] * len;
                    let to = at + piece.start..at + piece.end;
                    self.rx(Receive::CopyOut {
                        from: l.data(p, h),
                        to,
                    });
                }
            }
            Collective::SumScatter { dtype, block } => {
                let ds = dtype.size();
                let per = (l.chunk() / (size * ds)).max(1);
                let piece = nth_piece(block / ds, per, k);
                let bytes = piece.start * ds..piece.end * ds;
                for j in 0..size {
                    let from = Source::Input(j * block + bytes.start..j * block + bytes.end);
                    let to = l.data(me, h) + j * per * ds;
                    self.tx(Transmit::CopyIn { from, to });
                }
                self.plan_step(first, s);
                self.rx(Receive::Combine(Combine {
                    half: h,
                    at: me * per * ds,
                    into: bytes,
                    holds_first: false,
                    op: ReduceOp::Sum,
                    dtype,
                }));
            }
            Collective::Send { dst, len, sent } => {
                let Some(ch) = self.channel else { return };
                let n = sent.wrapping_add(k as u32);
                // Room once `dst` took piece `n - SLOTS`.
                self.rx(Receive::Reached(Await {
                    peer: dst,
                    word: ch.read(),
                    value: n.wrapping_sub(SLOTS - 1),
                    sleepers: Some(ch.sender_sleeps()),
                    kind: Awaited::Room,
                }));
                self.tx(Transmit::Header { to: ch.slot(n) });
                self.tx(Transmit::Stamp {
                    to: ch.stamp(n),
                    step: self.step,
                });
                let from = Source::Input(nth_piece(len, ch.slot_bytes(), k));
                self.tx(Transmit::CopyIn {
                    from,
                    to: ch.data(n),
                });
                self.tx(Transmit::Publish {
                    header: None,
                    word: ch.written(),
                    value: n.wrapping_add(1),
                    sleepers: ch.receiver_sleeps(),
                });
            }
            Collective::Recv { src, len, taken } => {
                let Some(ch) = self.channel else { return };
                let n = taken.wrapping_add(k as u32);
                self.rx(Receive::Reached(Await {
                    peer: src,
                    word: ch.written(),
                    value: n.wrapping_add(1),
                    sleepers: Some(ch.receiver_sleeps()),
                    kind: Awaited::Piece,
                }));
                if first {
                    let from = ch.slot(n);
                    self.rx(Receive::Message { peer: src, from });
                }
                let to = nth_piece(len, ch.slot_bytes(), k);
                self.rx(Receive::CopyOut {
                    from: ch.data(n),
                    to,
                });
                self.tx(Transmit::Publish {
                    header: None,
                    word: ch.read(),
                    value: n.wrapping_add(1),
                    sleepers: ch.sender_sleeps(),
                });
            }
            Collective::Mapped => self.rx(Receive::Reached(Await {
                peer: 1.min(size - 1),
                word: l.mapped(),
                value: (size - 1) as u32,
                sleepers: None,
                kind: Awaited::Mapped,
            })),
        }
    }
}

#[cfg(test)]
mod tests;
