//! The native wire's algorithms as a state machine with no sockets, no poller and no clock,
//! in the vocabulary of [`crate::comm::machine`] (quinn-proto's): the engine asks what to
//! write and where reads land, reports what moved, and the [`Exchange`] decides the rest.
//!
//! # Algorithms and their combination order
//!
//! Every collective is one or more *rounds* of direct messages between pairs of ranks
//! (each on the peer's [`send_conn`](crate::transport::tcp::Connections::send_conn) /
//! [`recv_conn`](crate::transport::tcp::Connections::recv_conn)), with a fold between
//! rounds or at the end. The first message a rank sends to each peer in a collective
//! starts with the [`header`](super::header); the receiver checks it before it uses a
//! byte of the data behind it. Into the caller's memory (all_gather, recv) it reads the
//! header alone first, so a refused message leaves no byte there; into staging it reads
//! header and data together (one system call instead of two) and folds nothing until
//! every header of the round has matched.
//!
//! - **one-shot** all-reduce ([`Exchange::one_shot`]): every rank sends its whole vector to
//!   every peer and folds the P vectors itself. At P = 2 that is the simultaneous exchange:
//!   one hop.
//! - **direct reduce-scatter + all-gather** ([`Exchange::scatter_gather`]): rank `r` owns
//!   block `r` of P; every rank sends block `j` to rank `j`, which folds the P copies of
//!   its block, then sends the result to every peer. Two hops; each rank sends about
//!   2 (P - 1) / P of the vector instead of P - 1 times it.
//! - **all_gather**, **sum_scatter** (the first round of the above, without the second),
//!   **barrier** (headers only), **send**/**recv** (one message) have one round.
//! - **broadcast**, small ([`Exchange::broadcast_direct`]): the root sends the whole
//!   array to every rank, one hop; every other rank sends its header alone to every
//!   peer, so that each pair of ranks compares calls (a root or length disagreement is
//!   found by every rank it concerns, not by the next collective).
//! - **broadcast**, large ([`Exchange::broadcast_scatter`], van de Geijn): the root sends
//!   block `k` of P - 1 to the k-th rank after it, then those ranks all-gather their
//!   blocks among themselves. The root sends the array once instead of P - 1 times.
//! - **all_to_all** ([`Exchange::all_to_all`]): block `j` straight to rank `j`, one round.
//! - The pipelined ring for large vectors is MLX's ring itself (see `native::Native`),
//!   after a barrier ([`Exchange::headers`] or [`Exchange::barrier_doubling`]).
//! - **recursive doubling** all-reduce ([`Exchange::doubling`]) and barrier
//!   ([`Exchange::barrier_doubling`], headers only), past four ranks: the ranks past the
//!   largest power of two `pof2` hand their vector to a partner first and take the result
//!   from it last (see [`Doubling`]); the other `pof2` exchange their whole partial result
//!   with one partner per round, at distance 1, 2, 4...: log2 P rounds of one message
//!   instead of one round of P - 1.
//! - **all_gather by recursive doubling** ([`Exchange::all_gather_doubling`]), past four
//!   ranks: the same pairs, each round's message carrying every block the rank holds.
//! - **Rabenseifner's** all-reduce ([`Exchange::halving_doubling`]), past four ranks, for
//!   middling vectors: reduce-scatter by recursive halving, all-gather by recursive
//!   doubling, with the same hand-in and hand-out; each rank sends about the bytes of the
//!   direct reduce-scatter + all-gather in 2 log2 P messages instead of 2 (P - 1).
//!
//! In the log-round algorithms every message to a partner a rank has not met yet in the
//! collective carries the header, both ways (the hand-in's partner answers with its
//! header alone, so the rank that hands in compares calls too); a round folds only once
//! its partner's header matched. A mismatch is found by the ranks that meet the odd one;
//! the others fail when it fails the group (every rank waits, through its partners, on
//! every other, so none finishes); their arrays may hold partial results by then.
//!
//! The direct algorithms fold in rank order: the result is `x0 op x1 op ... op x(P-1)`,
//! left to right. The log-round ones compute a balanced binary tree in rank order (see
//! [`Exchange::doubling`]): each fold of two partial results puts the lower ranks' on the
//! left, so both partners compute the same expression. Every fold uses the same kernel
//! (`reduce_into`, accumulator first) on every rank, from the same bytes. So every rank
//! computes the same bits, NaNs and signed zeros included, and so does every run; floats
//! may differ from the MLX wire's order (and from the ring's per-block chain order that
//! large vectors use, which is fixed too), and from one algorithm to another.

use std::ops::Range;

use super::header::{Call, HEADER_BYTES, Header, Kind};
use crate::comm::algorithm::AllReduce;
use crate::comm::machine::{Machine, Receive, Transmit};
use crate::comm::part;
use crate::element::DType;
use crate::error::{PeerOp, Result};
use crate::reduce::{ReduceOp, reduce_into};

/// Where a message's data comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Src {
    /// No data: a header-only message.
    None,
    /// The caller's in-out array (or output).
    Data(Range<usize>),
    /// The caller's read-only input.
    Input(Range<usize>),
}

/// Where a message's data lands.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Dst {
    /// No data.
    None,
    /// The caller's output.
    Data(Range<usize>),
    /// The staging buffer.
    Stage(Range<usize>),
}

/// One message this rank sends.
#[derive(Clone, Debug)]
struct Out {
    conn: usize,
    peer: usize,
    /// The header, if the message has one, and how many of its bytes are gone.
    header: Option<[u8; HEADER_BYTES]>,
    head_off: usize,
    src: Src,
    off: usize,
}

/// One message this rank receives.
#[derive(Clone, Debug)]
struct In {
    conn: usize,
    peer: usize,
    /// The call the header must match, if the message has a header.
    expect: Option<Call>,
    head: [u8; HEADER_BYTES],
    head_got: usize,
    dst: Dst,
    off: usize,
}

impl Out {
    fn len(&self) -> usize {
        match &self.src {
            Src::None => 0,
            Src::Data(r) | Src::Input(r) => r.len(),
        }
    }

    fn head_left(&self) -> usize {
        self.header.map_or(0, |_| HEADER_BYTES - self.head_off)
    }

    fn done(&self) -> bool {
        self.head_left() == 0 && self.off == self.len()
    }
}

impl In {
    fn len(&self) -> usize {
        match &self.dst {
            Dst::None => 0,
            Dst::Data(r) | Dst::Stage(r) => r.len(),
        }
    }

    fn head_left(&self) -> usize {
        self.expect.map_or(0, |_| HEADER_BYTES - self.head_got)
    }

    fn done(&self) -> bool {
        self.head_left() == 0 && self.off == self.len()
    }
}

/// The memory a collective works on.
pub(crate) struct Memory<'a> {
    /// The in-out array (all-reduce), the output (all_gather, sum_scatter, recv).
    pub(crate) data: &'a mut [u8],
    /// The read-only input (sum_scatter, send); empty otherwise.
    pub(crate) input: &'a [u8],
    /// Staging: at least [`Exchange::staging`] bytes.
    pub(crate) stage: &'a mut [u8],
}

/// A fold (see the module docs for the orders).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Fold {
    /// Every rank's contribution, in rank order: `x0 op x1 op ... op x(P-1)`.
    Ranks {
        op: ReduceOp,
        dtype: DType,
        /// Where this rank's own contribution is (in `data` or `input`).
        own: Src,
        /// Where the result goes, in `data`.
        target: Range<usize>,
        /// Rank `p`'s contribution is staged at `p * slot + HEADER_BYTES`, `target.len()`
        /// bytes (see [`stage_at`]).
        slot: usize,
    },
    /// Two partial results: this rank's at `target` in `data`, its partner's at `staged`
    /// in staging. The lower rank's operand goes on the left (`mine_first` when that is
    /// this rank), so both partners compute the same expression; the result goes to
    /// `target`.
    Pair {
        op: ReduceOp,
        dtype: DType,
        target: Range<usize>,
        staged: Range<usize>,
        mine_first: bool,
    },
}

impl Fold {
    fn run(&self, me: usize, size: usize, mem: &mut Memory<'_>) {
        match self {
            Fold::Ranks {
                op,
                dtype,
                own,
                target,
                slot,
            } => {
                let len = target.len();
                let at = |p: usize| stage_at(*slot, p, len);
                let own: &[u8] = match own {
                    Src::Data(r) => &mem.data[r.clone()],
                    Src::Input(r) => &mem.input[r.clone()],
                    Src::None => &[],
                };
                // Copied first: for an all-reduce the target is the own contribution.
                mem.stage[at(me)].copy_from_slice(own);
                mem.data[target.clone()].copy_from_slice(&mem.stage[at(0)]);
                for p in 1..size {
                    reduce_into(
                        *op,
                        *dtype,
                        &mut mem.data[target.clone()],
                        &mem.stage[at(p)],
                    );
                }
            }
            Fold::Pair {
                op,
                dtype,
                target,
                staged,
                mine_first,
            } => {
                let mine = &mut mem.data[target.clone()];
                let theirs = &mut mem.stage[staged.clone()];
                if *mine_first {
                    reduce_into(*op, *dtype, mine, theirs);
                } else {
                    // The kernel folds into its left operand: the partner's, in staging.
                    reduce_into(*op, *dtype, theirs, mine);
                    mine.copy_from_slice(theirs);
                }
            }
        }
    }
}

/// Recursive doubling's numbering of `size` ranks (MPICH's and Open MPI's): with `pof2`
/// the largest power of two not above `size` and `extra = size - pof2`, the first
/// `2 * extra` ranks pair up, the even rank of each pair handing its contribution to the
/// odd one before the rounds and taking the result from it after; the odd one and the
/// ranks from `2 * extra` on take part as `pof2` *virtual* ranks, numbered in rank order,
/// which pair at distance 1, 2, 4... (virtual rank `v` with `v ^ mask`).
#[derive(Clone, Copy, Debug)]
struct Doubling {
    pof2: usize,
    extra: usize,
}

impl Doubling {
    fn new(size: usize) -> Doubling {
        let pof2 = 1 << size.max(1).ilog2();
        Doubling {
            pof2,
            extra: size.max(1) - pof2,
        }
    }

    /// The virtual rank of `rank`, or `None` for a rank that hands its part in.
    fn virtual_rank(self, rank: usize) -> Option<usize> {
        if rank >= 2 * self.extra {
            Some(rank - self.extra)
        } else if rank % 2 == 1 {
            Some(rank / 2)
        } else {
            None
        }
    }

    /// The rank of virtual rank `v`.
    fn rank(self, v: usize) -> usize {
        if v < self.extra {
            2 * v + 1
        } else {
            v + self.extra
        }
    }

    /// The distances of the rounds among the virtual ranks: 1, 2, 4... below `pof2`.
    fn masks(self) -> impl DoubleEndedIterator<Item = usize> + ExactSizeIterator {
        (0..self.pof2.trailing_zeros()).map(|k| 1 << k)
    }
}

/// The bytes a staging slot takes for `len` bytes of data: the header's room before them,
/// rounded up so every slot's data starts 16-byte aligned (relative to the buffer).
fn slot_bytes(len: usize) -> usize {
    HEADER_BYTES + len.div_ceil(16) * 16
}

/// Where rank `p`'s `len` bytes sit in staging slots of `slot` bytes: after the room for
/// its header.
fn stage_at(slot: usize, p: usize, len: usize) -> Range<usize> {
    let start = p * slot + HEADER_BYTES;
    start..start + len
}

/// One round: messages out and in, then an optional fold.
#[derive(Clone, Debug, Default)]
struct Round {
    outs: Vec<Out>,
    ins: Vec<In>,
    fold: Option<Fold>,
}

impl Round {
    fn clear(&mut self) {
        self.outs.clear();
        self.ins.clear();
        self.fold = None;
    }
}

/// Which connection carries messages to and from each peer (the transport's numbering).
pub(crate) trait Routes {
    /// The connection messages to `peer` go out on.
    fn send_conn(&self, peer: usize) -> usize;
    /// The connection messages from `peer` arrive on.
    fn recv_conn(&self, peer: usize) -> usize;
}

/// The rank that plans a collective: rank `me` of `size`, the connections to its peers,
/// and the call the collective's headers carry.
pub(crate) struct Caller<'a, R> {
    pub(crate) routes: &'a R,
    pub(crate) me: usize,
    pub(crate) size: usize,
    pub(crate) call: &'a Call,
}

impl<'a, R> Caller<'a, R> {
    pub(crate) fn new(routes: &'a R, me: usize, size: usize, call: &'a Call) -> Self {
        Caller {
            routes,
            me,
            size,
            call,
        }
    }
}

// By hand: a derive would ask the routes themselves to be `Copy`.
impl<R> Clone for Caller<'_, R> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<R> Copy for Caller<'_, R> {}

/// One collective of the native wire in flight (see the module docs). Its storage is kept
/// from collective to collective, so planning one does not allocate once the group has
/// run one of each shape.
#[derive(Debug, Default)]
pub(crate) struct Exchange {
    me: usize,
    size: usize,
    /// The rounds (only the first `count` belong to this collective; the rest are storage
    /// kept from earlier ones).
    rounds: Vec<Round>,
    /// How many rounds this collective has, and the one in progress.
    count: usize,
    current: usize,
    /// Staging bytes the collective needs.
    staging: usize,
    /// Whether bytes moved since [`Exchange::take_progress`] last asked.
    progress: bool,
    /// A `send` header this rank refused (the sender is told; see `header`).
    refused: Option<Header>,
}

impl Exchange {
    fn start<R>(&mut self, c: Caller<'_, R>, rounds: usize) {
        self.me = c.me;
        self.size = c.size;
        self.count = 0;
        self.current = 0;
        self.staging = 0;
        self.progress = false;
        self.refused = None;
        for round in &mut self.rounds {
            round.clear();
        }
        for _ in 0..rounds {
            self.add_round();
        }
    }

    /// Starts planning a log-round collective: no rounds yet, and the ranks' numbering
    /// for recursive doubling.
    fn start_doubling<R>(&mut self, c: Caller<'_, R>) -> Doubling {
        self.start(c, 0);
        Doubling::new(c.size)
    }

    /// Appends a round to the collective being planned and returns its index.
    fn add_round(&mut self) -> usize {
        if self.rounds.len() == self.count {
            self.rounds.push(Round::default());
        }
        self.count += 1;
        self.count - 1
    }

    fn peers(&self) -> impl Iterator<Item = usize> + use<> {
        let (me, size) = (self.me, self.size);
        // Starting after this rank spreads the ranks' first messages over different peers.
        (1..size).map(move |d| (me + d) % size)
    }

    fn out(
        &mut self,
        round: usize,
        routes: &impl Routes,
        peer: usize,
        call: Option<&Call>,
        src: Src,
    ) {
        self.rounds[round].outs.push(Out {
            conn: routes.send_conn(peer),
            peer,
            header: call.map(|c| c.header.encode()),
            head_off: 0,
            src,
            off: 0,
        });
    }

    fn inc(
        &mut self,
        round: usize,
        routes: &impl Routes,
        peer: usize,
        call: Option<&Call>,
        dst: Dst,
    ) {
        self.rounds[round].ins.push(In {
            conn: routes.recv_conn(peer),
            peer,
            expect: call.copied(),
            head: [0; HEADER_BYTES],
            head_got: 0,
            dst,
            off: 0,
        });
    }

    /// Fills round `round` with a message out to every peer, from `src(peer)`, and a
    /// message in from it, into `dst(peer)`; each carries `call`'s header if there is one.
    fn each_peer(
        &mut self,
        round: usize,
        routes: &impl Routes,
        call: Option<&Call>,
        src: impl Fn(usize) -> Src,
        dst: impl Fn(usize) -> Dst,
    ) {
        for peer in self.peers() {
            self.out(round, routes, peer, call, src(peer));
            self.inc(round, routes, peer, call, dst(peer));
        }
    }

    /// Makes round 0 fold every rank's contribution in rank order into `target`: this
    /// rank's own at `own`, the others' staged in slots of `slot` bytes.
    fn fold_ranks(
        &mut self,
        (op, dtype): (ReduceOp, DType),
        own: Src,
        target: Range<usize>,
        slot: usize,
    ) {
        self.rounds[0].fold = Some(Fold::Ranks {
            op,
            dtype,
            own,
            target,
            slot,
        });
        self.staging = self.size * slot;
    }

    /// Makes round `round` fold the partner's partial result, staged at `staged`, with
    /// this rank's at `target` (this rank's on the left if `mine_first`).
    fn fold_pair(
        &mut self,
        round: usize,
        (op, dtype): (ReduceOp, DType),
        (target, staged): (Range<usize>, Range<usize>),
        mine_first: bool,
    ) {
        self.rounds[round].fold = Some(Fold::Pair {
            op,
            dtype,
            target,
            staged,
            mine_first,
        });
    }

    /// A round of headers only, with every peer: a barrier, or the check before a ring
    /// all-reduce moves any data.
    pub(crate) fn headers(&mut self, c: Caller<'_, impl Routes>) {
        self.start(c, 1);
        self.each_peer(0, c.routes, Some(c.call), |_| Src::None, |_| Dst::None);
    }

    /// All-reduce `algorithm` of `len` bytes of `reduce` (see the module docs); the
    /// algorithms that cut the vector into blocks take its whole elements. MLX's ring is
    /// not an exchange: it plans nothing.
    pub(crate) fn all_reduce(
        &mut self,
        c: Caller<'_, impl Routes>,
        algorithm: AllReduce,
        reduce: (ReduceOp, DType),
        len: usize,
    ) {
        let elems = len / reduce.1.size();
        match algorithm {
            AllReduce::OneShot => self.one_shot(c, reduce, len),
            AllReduce::ScatterGather => self.scatter_gather(c, reduce, elems),
            AllReduce::RecursiveDoubling => self.doubling(c, Some(reduce), len),
            AllReduce::HalvingDoubling => self.halving_doubling(c, reduce, elems),
            AllReduce::Ring => {}
        }
    }

    /// The one-shot all-reduce of `len` bytes (see the module docs).
    fn one_shot(&mut self, c: Caller<'_, impl Routes>, reduce: (ReduceOp, DType), len: usize) {
        self.start(c, 1);
        let slot = slot_bytes(len);
        let staged = |peer| Dst::Stage(stage_at(slot, peer, len));
        self.each_peer(0, c.routes, Some(c.call), |_| Src::Data(0..len), staged);
        self.fold_ranks(reduce, Src::Data(0..len), 0..len, slot);
    }

    /// The direct reduce-scatter + all-gather all-reduce of `elems` elements (see the
    /// module docs): block `j` is elements `part(elems, P, j)`.
    fn scatter_gather(
        &mut self,
        c: Caller<'_, impl Routes>,
        reduce: (ReduceOp, DType),
        elems: usize,
    ) {
        self.start(c, 2);
        let esize = reduce.1.size();
        let block = |j: usize| {
            let r = part(elems, c.size, j);
            r.start * esize..r.end * esize
        };
        let mine = block(c.me);
        let slot = slot_bytes(elems.div_ceil(c.size) * esize);
        let staged = |peer| Dst::Stage(stage_at(slot, peer, mine.len()));
        self.each_peer(0, c.routes, Some(c.call), |p| Src::Data(block(p)), staged);
        // The second round needs no header: the first one checked this pair.
        let gathered = |p| Dst::Data(block(p));
        self.each_peer(1, c.routes, None, |_| Src::Data(mine.clone()), gathered);
        self.fold_ranks(reduce, Src::Data(mine.clone()), mine, slot);
    }

    /// The pre-round of recursive doubling (see [`Doubling`]), if this rank is one of the
    /// first `2 * extra`: the even rank of a pair sends `src` to the odd one and takes its
    /// header (so that it finds a mismatch with its partner itself); the odd one stages
    /// the even one's `len` bytes, folds them on the left of its own `data[..len]` if
    /// `fold` says so, and sends its header. Returns the partner.
    fn hand_in(
        &mut self,
        c: Caller<'_, impl Routes>,
        d: Doubling,
        (src, len): (Src, usize),
        fold: Option<(ReduceOp, DType)>,
    ) -> Option<usize> {
        let (me, routes, call) = (c.me, c.routes, Some(c.call));
        if me >= 2 * d.extra {
            return None;
        }
        let round = self.add_round();
        if me.is_multiple_of(2) {
            self.out(round, routes, me + 1, call, src);
            self.inc(round, routes, me + 1, call, Dst::None);
            Some(me + 1)
        } else {
            let staged = stage_at(slot_bytes(len), 0, len);
            let dst = if len > 0 || fold.is_some() {
                Dst::Stage(staged.clone())
            } else {
                Dst::None
            };
            self.out(round, routes, me - 1, call, Src::None);
            self.inc(round, routes, me - 1, call, dst);
            if let Some(reduce) = fold {
                self.fold_pair(round, reduce, (0..len, staged), false);
                self.staging = self.staging.max(slot_bytes(len));
            }
            Some(me - 1)
        }
    }

    /// The post-round of recursive doubling: the odd rank of a pair sends the result
    /// (`data[..len]`) to the even one, with a header when there is no data (a barrier's
    /// only message to it). Nothing for the other ranks.
    fn hand_out(&mut self, c: Caller<'_, impl Routes>, partner: Option<usize>, len: usize) {
        let Some(partner) = partner else { return };
        let header = (len == 0).then_some(c.call);
        let round = self.add_round();
        if self.me.is_multiple_of(2) {
            let dst = if len > 0 {
                Dst::Data(0..len)
            } else {
                Dst::None
            };
            self.inc(round, c.routes, partner, header, dst);
        } else {
            self.out(round, c.routes, partner, header, Src::Data(0..len));
        }
    }

    /// The recursive-doubling all-reduce of `len` bytes (see the module docs), or with
    /// `fold` `None` and `len` 0, the recursive-doubling barrier: headers only.
    ///
    /// The result is the balanced binary tree, in rank order, over `pof2` leaves (see
    /// [`Doubling`]): leaf `v` is `x(2v) op x(2v + 1)` for `v < extra` and `x(v + extra)`
    /// after; each inner node is `left op right` with the lower ranks' subtree on the left.
    /// At P = 6: `((x0 op x1) op (x2 op x3)) op (x4 op x5)`.
    fn doubling(
        &mut self,
        c: Caller<'_, impl Routes>,
        fold: Option<(ReduceOp, DType)>,
        len: usize,
    ) {
        let d = self.start_doubling(c);
        let src = if len > 0 || fold.is_some() {
            Src::Data(0..len)
        } else {
            Src::None
        };
        let partner = self.hand_in(c, d, (src.clone(), len), fold);
        if let Some(v) = d.virtual_rank(c.me) {
            let staged = stage_at(slot_bytes(len), 0, len);
            for mask in d.masks() {
                let peer = d.rank(v ^ mask);
                let round = self.add_round();
                self.out(round, c.routes, peer, Some(c.call), src.clone());
                let Some(reduce) = fold else {
                    self.inc(round, c.routes, peer, Some(c.call), Dst::None);
                    continue;
                };
                let dst = Dst::Stage(staged.clone());
                self.inc(round, c.routes, peer, Some(c.call), dst);
                self.fold_pair(round, reduce, (0..len, staged.clone()), c.me < peer);
            }
            if fold.is_some() {
                self.staging = self.staging.max(slot_bytes(len));
            }
        }
        self.hand_out(c, partner, len);
    }

    /// The recursive-doubling barrier: headers only, log2 P rounds (plus the pre- and
    /// post-rounds of the ranks past the largest power of two).
    pub(crate) fn barrier_doubling(&mut self, c: Caller<'_, impl Routes>) {
        self.doubling(c, None, 0);
    }

    /// Rabenseifner's all-reduce of `elems` elements: recursive halving (a reduce-scatter
    /// over the virtual ranks of [`Doubling`], the vector halved at each distance 1, 2,
    /// 4..., this rank keeping the half its bit of the virtual rank names, the lower half
    /// for 0), then recursive doubling (an all-gather, the same partners in reverse, each
    /// sending everything it holds). The vector is cut into `pof2` blocks
    /// (`part(elems, pof2, j)`), and halves are whole blocks.
    ///
    /// Every element's result is the same tree as [`Exchange::doubling`]'s: each halving
    /// round folds two partners' partials of the kept half, the lower virtual rank's on
    /// the left, and partners at distance `2^k` hold partials over adjacent aligned groups
    /// of `2^k` virtual ranks.
    fn halving_doubling(
        &mut self,
        c: Caller<'_, impl Routes>,
        reduce: (ReduceOp, DType),
        elems: usize,
    ) {
        let d = self.start_doubling(c);
        let esize = reduce.1.size();
        let len = elems * esize;
        // Blocks `lo..hi` of `pof2`, in bytes.
        let blocks = |lo: usize, hi: usize| {
            part(elems, d.pof2, lo).start * esize..part(elems, d.pof2, hi - 1).end * esize
        };
        let partner = self.hand_in(c, d, (Src::Data(0..len), len), Some(reduce));
        if let Some(v) = d.virtual_rank(c.me) {
            // Round `k` (distance `2^k`) halves what the rounds before it kept: the blocks
            // (kept, given away) there.
            let halves = |k: usize| {
                let (mut lo, mut hi) = (0, d.pof2);
                for j in 0..=k {
                    let mid = lo + (hi - lo) / 2;
                    let (keep, give) = if v >> j & 1 == 0 {
                        ((lo, mid), (mid, hi))
                    } else {
                        ((mid, hi), (lo, mid))
                    };
                    if j == k {
                        return (blocks(keep.0, keep.1), blocks(give.0, give.1));
                    }
                    (lo, hi) = keep;
                }
                (0..0, 0..0)
            };
            for (k, mask) in d.masks().enumerate() {
                let peer = d.rank(v ^ mask);
                let (keep, give) = halves(k);
                let staged = stage_at(slot_bytes(keep.len()), 0, keep.len());
                let round = self.add_round();
                self.out(round, c.routes, peer, Some(c.call), Src::Data(give));
                let dst = Dst::Stage(staged.clone());
                self.inc(round, c.routes, peer, Some(c.call), dst);
                self.staging = self.staging.max(slot_bytes(keep.len()));
                self.fold_pair(round, reduce, (keep, staged), c.me < peer);
            }
            // The all-gather: the halving's rounds in reverse, with the partners they
            // already checked (no headers), each rank sending the blocks it kept there
            // (complete now) and taking the ones it gave away.
            for (k, mask) in d.masks().enumerate().rev() {
                let peer = d.rank(v ^ mask);
                let (keep, give) = halves(k);
                let round = self.add_round();
                self.out(round, c.routes, peer, None, Src::Data(keep));
                self.inc(round, c.routes, peer, None, Dst::Data(give));
            }
        }
        self.hand_out(c, partner, len);
    }

    /// all_gather of `nbytes` per rank into `data` (this rank's own block is the caller's
    /// to copy).
    pub(crate) fn all_gather(&mut self, c: Caller<'_, impl Routes>, nbytes: usize) {
        self.start(c, 1);
        let at = |peer| Dst::Data(peer * nbytes..(peer + 1) * nbytes);
        self.each_peer(0, c.routes, Some(c.call), |_| Src::Input(0..nbytes), at);
    }

    /// all_gather of `nbytes` per rank into `data` by recursive doubling (this rank's own
    /// block is the caller's to copy): the ranks past the largest power of two hand their
    /// block in before the rounds (see [`Doubling`]); then at distance 1, 2, 4... each
    /// virtual rank sends its partner the blocks it holds (an aligned group of virtual
    /// ranks, whose blocks are contiguous in `data`) and takes the partner's; last, the
    /// ranks that took a block in hand the whole output back. log2 P rounds of one message
    /// instead of one round of P - 1; each rank sends the same bytes as the direct one
    /// (the hand-out aside).
    pub(crate) fn all_gather_doubling(&mut self, c: Caller<'_, impl Routes>, nbytes: usize) {
        let d = self.start_doubling(c);
        let (me, routes, call) = (c.me, c.routes, Some(c.call));
        // The bytes of the blocks of virtual ranks `lo..hi`.
        let blocks = |lo: usize, hi: usize| {
            let first = if lo < d.extra { 2 * lo } else { lo + d.extra };
            let last = d.rank(hi - 1);
            first * nbytes..(last + 1) * nbytes
        };
        let partner = if me < 2 * d.extra {
            let round = self.add_round();
            if me.is_multiple_of(2) {
                let mine = me * nbytes..(me + 1) * nbytes;
                self.out(round, routes, me + 1, call, Src::Data(mine));
                self.inc(round, routes, me + 1, call, Dst::None);
                Some(me + 1)
            } else {
                let theirs = (me - 1) * nbytes..me * nbytes;
                self.out(round, routes, me - 1, call, Src::None);
                self.inc(round, routes, me - 1, call, Dst::Data(theirs));
                Some(me - 1)
            }
        } else {
            None
        };
        if let Some(v) = d.virtual_rank(me) {
            for mask in d.masks() {
                let p = v ^ mask;
                let (mine, theirs) = (v - v % mask, p - p % mask);
                let peer = d.rank(p);
                let round = self.add_round();
                let src = Src::Data(blocks(mine, mine + mask));
                self.out(round, routes, peer, call, src);
                let dst = Dst::Data(blocks(theirs, theirs + mask));
                self.inc(round, routes, peer, call, dst);
            }
        }
        self.hand_out(c, partner, c.size * nbytes);
    }

    /// sum_scatter of `chunk` bytes per rank of `dtype` from `input` into `data`.
    pub(crate) fn sum_scatter(&mut self, c: Caller<'_, impl Routes>, dtype: DType, chunk: usize) {
        self.start(c, 1);
        let slot = slot_bytes(chunk);
        let theirs = |peer| Src::Input(peer * chunk..(peer + 1) * chunk);
        let staged = |peer| Dst::Stage(stage_at(slot, peer, chunk));
        self.each_peer(0, c.routes, Some(c.call), theirs, staged);
        let own = Src::Input(c.me * chunk..(c.me + 1) * chunk);
        self.fold_ranks((ReduceOp::Sum, dtype), own, 0..chunk, slot);
    }

    /// A send of all of `input` to `peer`.
    pub(crate) fn send(&mut self, c: Caller<'_, impl Routes>, peer: usize, len: usize) {
        self.start(c, 1);
        self.out(0, c.routes, peer, Some(c.call), Src::Input(0..len));
    }

    /// A recv of all of `data` from `peer`.
    pub(crate) fn recv(&mut self, c: Caller<'_, impl Routes>, peer: usize, len: usize) {
        self.start(c, 1);
        self.inc(0, c.routes, peer, Some(c.call), Dst::Data(0..len));
    }

    /// A broadcast of `len` bytes of `data` from `root`, straight to every rank (see the
    /// module docs).
    pub(crate) fn broadcast_direct(&mut self, c: Caller<'_, impl Routes>, root: usize, len: usize) {
        self.start(c, 1);
        self.broadcast_headers(c, root, |_| 0..len);
    }

    /// Round 0 of a broadcast from `root`: every pair exchanges headers, and the root's
    /// messages carry `block(peer)` of `data` to each peer.
    fn broadcast_headers(
        &mut self,
        c: Caller<'_, impl Routes>,
        root: usize,
        block: impl Fn(usize) -> Range<usize>,
    ) {
        let src = |peer| {
            if c.me == root {
                Src::Data(block(peer))
            } else {
                Src::None
            }
        };
        let dst = |peer| {
            if peer == root {
                Dst::Data(block(c.me))
            } else {
                Dst::None
            }
        };
        self.each_peer(0, c.routes, Some(c.call), src, dst);
    }

    /// A broadcast of `len` bytes of `data` from `root` as a scatter to the other ranks
    /// and an all-gather among them (see the module docs).
    pub(crate) fn broadcast_scatter(
        &mut self,
        c: Caller<'_, impl Routes>,
        root: usize,
        len: usize,
    ) {
        self.start(c, 2);
        // Rank `root + 1 + k` (mod P) holds block k of P - 1 after the scatter.
        let size = c.size;
        let block = |r: usize| part(len, size - 1, (r + size - root - 1) % size);
        self.broadcast_headers(c, root, block);
        // Round 1: the all-gather among the ranks other than the root, headers done.
        if c.me != root {
            for peer in self.peers().filter(|&peer| peer != root) {
                self.out(1, c.routes, peer, None, Src::Data(block(c.me)));
                self.inc(1, c.routes, peer, None, Dst::Data(block(peer)));
            }
        }
    }

    /// An all_to_all of `block` bytes per rank from `input` into `data` (this rank's own
    /// block is the caller's to copy).
    pub(crate) fn all_to_all(&mut self, c: Caller<'_, impl Routes>, block: usize) {
        self.start(c, 1);
        let at = |peer| peer * block..(peer + 1) * block;
        let dst = |peer| Dst::Data(at(peer));
        self.each_peer(0, c.routes, Some(c.call), |peer| Src::Input(at(peer)), dst);
    }

    /// Staging bytes the planned collective needs.
    pub(crate) fn staging(&self) -> usize {
        self.staging
    }

    /// Whether every round is complete.
    pub(crate) fn is_finished(&self) -> bool {
        self.current == self.count
    }

    /// Messages out in the current round.
    pub(crate) fn outs(&self) -> usize {
        if self.is_finished() {
            0
        } else {
            self.rounds[self.current].outs.len()
        }
    }

    /// Messages in in the current round.
    pub(crate) fn ins(&self) -> usize {
        if self.is_finished() {
            0
        } else {
            self.rounds[self.current].ins.len()
        }
    }

    /// For message `i` out: its connection, and the bytes to write next (what is left of
    /// the header, then of the data; best written with one vectored write), or `None` if
    /// it is all gone.
    pub(crate) fn poll_transmit<'s>(
        &'s self,
        i: usize,
        mem: &'s Memory<'_>,
    ) -> Option<(usize, &'s [u8], &'s [u8])> {
        let out = &self.rounds[self.current].outs[i];
        if out.done() {
            return None;
        }
        let head: &[u8] = match &out.header {
            Some(h) => &h[out.head_off..],
            None => &[],
        };
        let body: &[u8] = match &out.src {
            Src::None => &[],
            Src::Data(r) => &mem.data[r.clone()],
            Src::Input(r) => &mem.input[r.clone()],
        };
        Some((out.conn, head, &body[out.off..]))
    }

    /// Records that `n` bytes of what [`Exchange::poll_transmit`] gave for message `i` were
    /// written.
    pub(crate) fn handle_sent(&mut self, i: usize, n: usize) {
        let out = &mut self.rounds[self.current].outs[i];
        let head = n.min(out.head_left());
        out.head_off += head;
        out.off += n - head;
        self.progress = true;
    }

    /// For message `i` in: its connection, and where the next bytes read from it must land
    /// (the rest of the header, and once that is checked, the rest of the data), or
    /// `None` when it is complete. Never empty.
    pub(crate) fn poll_receive<'s>(
        &'s mut self,
        i: usize,
        mem: &'s mut Memory<'_>,
    ) -> Option<(usize, &'s mut [u8])> {
        let inc = &mut self.rounds[self.current].ins[i];
        if inc.done() {
            return None;
        }
        if inc.head_left() > 0 {
            // Into staging, the header lands right before the data, so that one read can
            // take both; nothing staged is used before the header is checked.
            if let Dst::Stage(r) = &inc.dst {
                let from = r.start - HEADER_BYTES + inc.head_got;
                return Some((inc.conn, &mut mem.stage[from..r.end]));
            }
            return Some((inc.conn, &mut inc.head[inc.head_got..]));
        }
        let target: &mut [u8] = match &inc.dst {
            Dst::None => return None,
            Dst::Data(r) => &mut mem.data[r.clone()],
            Dst::Stage(r) => &mut mem.stage[r.clone()],
        };
        Some((inc.conn, &mut target[inc.off..]))
    }

    /// Records that `n` bytes were read into what [`Exchange::poll_receive`] gave for message
    /// `i`. A header that became complete is checked against this rank's call.
    ///
    /// # Errors
    ///
    /// [`Error::Mismatch`](crate::Error::Mismatch) naming both calls, or [`Error::PeerMisbehaved`](crate::Error::PeerMisbehaved) for a header
    /// that does not decode.
    pub(crate) fn handle_received(&mut self, i: usize, n: usize, mem: &Memory<'_>) -> Result<()> {
        let me = self.me;
        let inc = &mut self.rounds[self.current].ins[i];
        self.progress = true;
        let head = n.min(inc.head_left());
        if head > 0 {
            if let Dst::Stage(r) = &inc.dst {
                let from = r.start - HEADER_BYTES + inc.head_got;
                inc.head[inc.head_got..inc.head_got + head]
                    .copy_from_slice(&mem.stage[from..from + head]);
            }
            inc.head_got += head;
            if inc.head_left() == 0
                && let Some(call) = &inc.expect
                && let Err(mismatch) = call.check(me, inc.peer, &inc.head)
            {
                self.refused = Header::decode(&inc.head)
                    .ok()
                    .filter(|h| h.kind == Kind::Send);
                return Err(mismatch);
            }
        }
        inc.off += n - head;
        Ok(())
    }

    /// The round in progress (the round count once finished).
    pub(crate) fn round(&self) -> usize {
        self.current
    }

    /// The bytes round `round`'s fold combines: its target once per contribution folded
    /// into it (0 for a round without a fold).
    pub(crate) fn fold_bytes(&self, round: usize) -> usize {
        match self.rounds.get(round).and_then(|r| r.fold.as_ref()) {
            Some(Fold::Ranks { target, .. }) => target.len() * self.size.saturating_sub(1),
            Some(Fold::Pair { target, .. }) => target.len(),
            None => 0,
        }
    }

    /// The most messages this rank sends in one round of the collective.
    pub(crate) fn fan_out(&self) -> usize {
        let rounds = &self.rounds[..self.count];
        rounds.iter().map(|r| r.outs.len()).max().unwrap_or(0)
    }

    /// Completes the rounds whose messages all moved: runs each one's fold and moves on.
    /// Returns whether it completed any.
    pub(crate) fn complete(&mut self, mem: &mut Memory<'_>) -> bool {
        let mut any = false;
        while !self.is_finished() {
            let round = &self.rounds[self.current];
            if !round.outs.iter().all(Out::done) || !round.ins.iter().all(In::done) {
                break;
            }
            if let Some(fold) = &round.fold {
                fold.run(self.me, self.size, mem);
            }
            self.current += 1;
            self.progress = true;
            any = true;
        }
        any
    }

    /// After a mismatch: the first complete header of the current round that differs
    /// from `call`'s (a hierarchical group's leader passes it on to its host's ranks).
    pub(crate) fn differing(&self, call: &Call) -> Option<[u8; HEADER_BYTES]> {
        let mine = call.header.encode();
        let round = self.rounds.get(self.current)?;
        round
            .ins
            .iter()
            .find(|m| m.expect.is_some() && m.head_left() == 0 && m.head != mine)
            .map(|m| m.head)
    }

    /// The `send` header whose mismatch ended this collective, if one did.
    pub(crate) fn refused(&self) -> Option<Header> {
        self.refused
    }

    /// The plan storage reserved so far (messages per round), for tests that check it is
    /// reused.
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> Vec<[usize; 2]> {
        self.rounds
            .iter()
            .map(|r| [r.outs.capacity(), r.ins.capacity()])
            .collect()
    }

    /// Whether bytes moved or rounds completed since the last call.
    pub(crate) fn take_progress(&mut self) -> bool {
        std::mem::take(&mut self.progress)
    }

    /// Appends the connections still waited on, and for what (receives first), for blame.
    pub(crate) fn poll_wait(&self, into: &mut Vec<(usize, PeerOp)>) {
        if self.is_finished() {
            return;
        }
        let round = &self.rounds[self.current];
        into.extend(
            round
                .ins
                .iter()
                .filter(|m| !m.done())
                .map(|m| (m.conn, PeerOp::Receive)),
        );
        into.extend(
            round
                .outs
                .iter()
                .filter(|m| !m.done())
                .map(|m| (m.conn, PeerOp::Send)),
        );
    }

    /// Whether message `i` in still waits for (part of) its header.
    pub(crate) fn header_pending(&self, i: usize) -> bool {
        !self.is_finished() && self.rounds[self.current].ins[i].head_left() > 0
    }

    /// The peer of message `i` in.
    pub(crate) fn in_peer(&self, i: usize) -> usize {
        self.rounds[self.current].ins[i].peer
    }

    /// The peer of message `i` out.
    pub(crate) fn out_peer(&self, i: usize) -> usize {
        self.rounds[self.current].outs[i].peer
    }
}

/// An [`Exchange`] with the memory it works on: the [`Machine`] an engine drives. Each
/// message of the current round is a queue (message `i` out is send queue `i`); a round's
/// fold runs, and the next round starts, in [`Machine::take_progress`].
pub(crate) struct Exchanging<'a, 'm> {
    pub(crate) exchange: &'a mut Exchange,
    pub(crate) mem: &'a mut Memory<'m>,
}

impl Machine for Exchanging<'_, '_> {
    fn transmits(&self) -> usize {
        self.exchange.outs()
    }

    fn receives(&self) -> usize {
        self.exchange.ins()
    }

    fn poll_transmit(&mut self, i: usize) -> Option<Transmit<'_>> {
        let (link, head, body) = self.exchange.poll_transmit(i, self.mem)?;
        Some(Transmit { link, head, body })
    }

    fn handle_sent(&mut self, i: usize, n: usize) {
        self.exchange.handle_sent(i, n);
    }

    fn poll_receive(&mut self, i: usize) -> Option<Receive<'_>> {
        let (link, buf) = self.exchange.poll_receive(i, self.mem)?;
        Some(Receive { link, buf })
    }

    fn handle_received(&mut self, i: usize, n: usize) -> Result<()> {
        self.exchange.handle_received(i, n, self.mem)
    }

    fn poll_wait(&self, into: &mut Vec<(usize, PeerOp)>) {
        self.exchange.poll_wait(into);
    }

    fn is_finished(&self) -> bool {
        self.exchange.is_finished()
    }

    fn take_progress(&mut self) -> bool {
        self.exchange.complete(self.mem);
        self.exchange.take_progress()
    }
}
