//! MLX 0.32.1's mesh algorithms (`mesh.cpp`, `mesh_impl.h`), as state machines.
//!
//! In a mesh every rank has one queue pair to every other rank (connection `p` leads to rank
//! `p`). Each algorithm below posts exactly the messages MLX's does, on the same queue pairs,
//! in the same order per queue pair, with the same size class; where MLX fills or consumes a
//! buffer is where these machines do. Only the polling differs: MLX spins on all completion
//! queues in its own loop; here the RDMA [`engine`](crate::transport::rdma::engine) hands
//! the completions in.
//!
//! Size classes come from a message length `M` per algorithm; `S` is the class's message
//! size and `N = S / sizeof(T)` the elements per message. Pipeline slots alternate, two deep.
//!
//! - **all-reduce, fully connected** (`M` = the array): every rank sends every chunk of `N`
//!   elements of its own input to every peer, and reduces chunk by chunk, in rank order
//!   0, 1, ..., P-1 (rank 0's copied, the others folded in), so every rank computes the same
//!   bits. A send slot is refilled once its send completed on every peer; a receive slot is
//!   reposted once its chunk is reduced.
//! - **sum_scatter** (`M` = one output chunk of `c` elements): frame `o` to peer `p` carries
//!   `input[p*c + o ..]`, through per-peer scatter buffers; received frames are folded into the
//!   output in completion order.
//! - **all-reduce, scatter-gather** (P > 2 and more than 32 KiB): sum_scatter of
//!   `floor(count/P)`-element chunks straight into the output, an all_gather of those chunks in
//!   place, then the fully connected all-reduce of the `count mod P` trailing elements.
//! - **all_gather** (`M` = one rank's block): each rank's block in frames to every peer.
//! - **send/recv** (`M` = the message): frames on the peer's queue pair, two in flight.

use super::buffers::{BufferPlan, Mem};
use super::frames::{Class, MESH_MAX_RANKS, PIPELINE, SizeClasses, WorkTag};
use super::machine::{Algorithm, Done, Post};
use crate::element::DType;
use crate::error::Result;
use crate::reduce::{ReduceOp, Semantics, reduce_with};

/// MLX uses the scatter-gather all-reduce above this many bytes when there are more than two
/// ranks.
pub(crate) const SCATTER_GATHER_ABOVE: usize = 32 * 1024;

/// Whether MLX's mesh reduces `bytes` with the scatter-gather path for `size` ranks.
pub(crate) fn uses_scatter_gather(size: usize, bytes: usize) -> bool {
    size > 2 && bytes > SCATTER_GATHER_ABOVE
}

/// Where a collective's frames go: every rank but this one (connection `p` leads to rank
/// `p`), in buffers of one size class.
#[derive(Clone, Copy, Debug)]
struct Fanout {
    rank: usize,
    size: usize,
    class: Class,
}

impl Fanout {
    /// The peers, in rank order.
    fn peers(self) -> impl Iterator<Item = usize> {
        (0..self.size).filter(move |&p| p != self.rank)
    }

    /// Whether connection `conn` leads to a peer.
    fn owns(self, conn: usize) -> bool {
        conn != self.rank && conn < self.size
    }

    /// Posts receives from every peer into slot `slot`'s receive buffers.
    fn post_recv_all(self, cx: &mut Post<'_, '_>, plan: &BufferPlan, slot: usize) -> Result<()> {
        for p in self.peers() {
            let buf = plan.mesh_recv(self.class, slot, p);
            cx.post_recv(p, buf, WorkTag::recv(slot, p))?;
        }
        Ok(())
    }

    /// Posts this rank's send buffer of slot `slot` to every peer.
    fn post_send_all(self, cx: &mut Post<'_, '_>, plan: &BufferPlan, slot: usize) -> Result<()> {
        let buf = plan.mesh_send(self.class, slot);
        for p in self.peers() {
            cx.post_send(p, buf, WorkTag::send(slot, p))?;
        }
        Ok(())
    }
}

/// The first peer's connection, for filling the shared send buffer (errors name it).
fn first_peer(rank: usize) -> usize {
    usize::from(rank == 0)
}

/// Send completions per pipeline slot: a slot's send buffer goes to every peer at once, so
/// it may be refilled only when all `peers` sends of it have completed.
struct SlotSends {
    peers: usize,
    done: [usize; PIPELINE],
}

impl SlotSends {
    fn new(size: usize) -> Self {
        SlotSends {
            peers: size - 1,
            done: [0; PIPELINE],
        }
    }

    /// Counts one completed send of `slot`; true when that was its last, and the slot is free.
    fn completed(&mut self, slot: usize) -> bool {
        self.done[slot] += 1;
        if self.done[slot] < self.peers {
            return false;
        }
        self.done[slot] = 0;
        true
    }
}

/// The fully connected all-reduce of `count` elements at byte `base` of the data.
pub(crate) struct AllReduce {
    fanout: Fanout,
    op: ReduceOp,
    dtype: DType,
    base: usize,
    /// Elements per message.
    n: usize,
    total: usize,
    chunks: usize,
    /// Elements staged for sending so far (MLX's `read_offset`).
    read: usize,
    sends: SlotSends,
    /// Per rank, how many of its chunks are available to reduce (a fixed array: a
    /// collective allocates nothing; the configuration caps a mesh at [`MESH_MAX_RANKS`]).
    recv_end: [usize; MESH_MAX_RANKS],
    reduce_chunk: usize,
    reduce_rank: usize,
}

impl AllReduce {
    pub(crate) fn new(
        rank: usize,
        size: usize,
        classes: SizeClasses,
        op: ReduceOp,
        dtype: DType,
        base: usize,
        count: usize,
    ) -> Self {
        let class = classes.class_for(count * dtype.size());
        let n = class.bytes() / dtype.size();
        AllReduce {
            fanout: Fanout { rank, size, class },
            op,
            dtype,
            base,
            n,
            total: count,
            chunks: count.div_ceil(n),
            read: 0,
            sends: SlotSends::new(size),
            recv_end: [0; MESH_MAX_RANKS],
            reduce_chunk: 0,
            reduce_rank: 0,
        }
    }

    /// Byte range of `elems` elements from element `at`.
    fn bytes(&self, at: usize, elems: usize) -> std::ops::Range<usize> {
        let es = self.dtype.size();
        self.base + at * es..self.base + (at + elems) * es
    }

    /// Copies the next chunk into send slot `slot` and posts it to every peer.
    fn send_next(&mut self, cx: &mut Post<'_, '_>, mem: &mut Mem<'_>, slot: usize) -> Result<()> {
        let elems = self.n.min(self.total - self.read);
        let range = self.bytes(self.read, elems);
        let buf = mem.plan.mesh_send(self.fanout.class, slot);
        cx.fill(first_peer(self.fanout.rank), buf, &mem.data[range])?;
        self.fanout.post_send_all(cx, mem.plan, slot)?;
        self.read += self.n;
        Ok(())
    }

    /// Copies chunk `chunk` of this rank's input into staging slot `slot`.
    fn stage_own(&self, mem: &mut Mem<'_>, chunk: usize, slot: usize) {
        let at = chunk * self.n;
        let elems = self.n.min(self.total - at);
        let range = self.bytes(at, elems);
        let stride = mem.staging.len() / PIPELINE;
        mem.staging[slot * stride..][..range.len()].copy_from_slice(&mem.data[range]);
    }

    /// Folds the reduce rank's chunk `theirs` into `out`: rank 0's is copied, the others
    /// reduced into it, so every rank combines them in the same order.
    fn fold(&self, out: &mut [u8], theirs: &[u8]) {
        if self.reduce_rank == 0 {
            out.copy_from_slice(theirs);
        } else {
            reduce_with(Semantics::Jaccl, self.op, self.dtype, out, theirs);
        }
    }

    /// Reduces every chunk that can be, in chunk order and rank order.
    fn advance(&mut self, cx: &mut Post<'_, '_>, mem: &mut Mem<'_>) -> Result<()> {
        let es = self.dtype.size();
        let rank = self.fanout.rank;
        while self.reduce_chunk < self.chunks {
            let w = self.reduce_chunk * self.n;
            // Our own chunk must be staged for sending before the output overwrites it.
            if w >= self.read || self.recv_end[self.reduce_rank] <= self.reduce_chunk {
                break;
            }
            let slot = self.reduce_chunk % PIPELINE;
            let elems = self.n.min(self.total - w);
            let out = self.bytes(w, elems);
            if self.reduce_rank == rank {
                let stride = mem.staging.len() / PIPELINE;
                let own = &mem.staging[slot * stride..][..elems * es];
                self.fold(&mut mem.data[out], own);
                let next = self.reduce_chunk + PIPELINE;
                if next < self.chunks {
                    self.stage_own(mem, next, slot);
                    self.recv_end[rank] += 1;
                }
            } else {
                let peer = self.reduce_rank;
                let buf = mem.plan.mesh_recv(self.fanout.class, slot, peer);
                let theirs = &cx.buffer(peer, buf)?[..elems * es];
                self.fold(&mut mem.data[out], theirs);
                if self.reduce_chunk + PIPELINE < self.chunks {
                    cx.post_recv(peer, buf, WorkTag::recv(slot, peer))?;
                }
            }
            self.reduce_rank += 1;
            if self.reduce_rank == self.fanout.size {
                self.reduce_rank = 0;
                self.reduce_chunk += 1;
            }
        }
        Ok(())
    }
}

impl Algorithm for AllReduce {
    fn begin(&mut self, cx: &mut Post<'_, '_>, mem: &mut Mem<'_>) -> Result<()> {
        for slot in 0..PIPELINE {
            if self.read >= self.total {
                break;
            }
            self.fanout.post_recv_all(cx, mem.plan, slot)?;
            self.stage_own(mem, slot, slot);
            self.recv_end[self.fanout.rank] += 1;
            self.send_next(cx, mem, slot)?;
        }
        self.advance(cx, mem)
    }

    fn completed(&mut self, cx: &mut Post<'_, '_>, mem: &mut Mem<'_>, done: Done) -> Result<()> {
        let tag = done.tag;
        if !tag.recv {
            if self.read < self.total && self.sends.completed(tag.slot) {
                self.send_next(cx, mem, tag.slot)?;
            }
        } else {
            self.recv_end[tag.index] += 1;
        }
        self.advance(cx, mem)
    }

    fn done(&self) -> bool {
        self.reduce_chunk == self.chunks
    }

    fn owns(&self, conn: usize) -> bool {
        self.fanout.owns(conn)
    }
}

/// The all_gather of `block` bytes per rank; this rank's block is already at
/// `rank * block` of the data.
pub(crate) struct AllGather {
    fanout: Fanout,
    block: usize,
    s: usize,
    read: usize,
    sends: SlotSends,
    /// Per peer, the bytes received so far; fixed, as `recv_end` above.
    written: [usize; MESH_MAX_RANKS],
}

impl AllGather {
    pub(crate) fn new(rank: usize, size: usize, classes: SizeClasses, block: usize) -> Self {
        let class = classes.class_for(block);
        AllGather {
            fanout: Fanout { rank, size, class },
            block,
            s: class.bytes(),
            read: 0,
            sends: SlotSends::new(size),
            written: [0; MESH_MAX_RANKS],
        }
    }

    fn send_next(&mut self, cx: &mut Post<'_, '_>, mem: &mut Mem<'_>, slot: usize) -> Result<()> {
        let Fanout { rank, class, .. } = self.fanout;
        let own = rank * self.block;
        let end = (self.read + self.s).min(self.block);
        let buf = mem.plan.mesh_send(class, slot);
        let bytes = &mem.data[own + self.read..own + end];
        cx.fill(first_peer(rank), buf, bytes)?;
        self.fanout.post_send_all(cx, mem.plan, slot)?;
        self.read += self.s;
        Ok(())
    }
}

impl Algorithm for AllGather {
    fn begin(&mut self, cx: &mut Post<'_, '_>, mem: &mut Mem<'_>) -> Result<()> {
        let mut slot = 0;
        while self.read < self.block && slot < PIPELINE {
            self.fanout.post_recv_all(cx, mem.plan, slot)?;
            self.send_next(cx, mem, slot)?;
            slot += 1;
        }
        Ok(())
    }

    fn completed(&mut self, cx: &mut Post<'_, '_>, mem: &mut Mem<'_>, done: Done) -> Result<()> {
        let Done { conn, tag } = done;
        if !tag.recv {
            if self.read < self.block && self.sends.completed(tag.slot) {
                self.send_next(cx, mem, tag.slot)?;
            }
            return Ok(());
        }
        let peer = tag.index;
        let at = self.written[peer];
        let len = self.s.min(self.block - at);
        let buf = mem.plan.mesh_recv(self.fanout.class, tag.slot, peer);
        let start = peer * self.block + at;
        mem.data[start..start + len].copy_from_slice(&cx.buffer(conn, buf)?[..len]);
        self.written[peer] += self.s;
        if self.written[peer] + self.s < self.block {
            cx.post_recv(peer, buf, WorkTag::recv(tag.slot, peer))?;
        }
        Ok(())
    }

    fn owns(&self, conn: usize) -> bool {
        self.fanout.owns(conn)
    }
}

/// The sum_scatter of `count`-element chunks: the input holds P chunks (from `mem.input`,
/// or from the data itself when that is `None`); this rank's reduced chunk goes to byte
/// `out` of the data. MLX's scatter-gather all-reduce runs it with max and min too.
pub(crate) struct SumScatter {
    fanout: Fanout,
    op: ReduceOp,
    dtype: DType,
    out: usize,
    n: usize,
    total: usize,
    read: usize,
    sends: SlotSends,
    /// Per peer, the elements received so far; fixed, as `recv_end` above.
    written: [usize; MESH_MAX_RANKS],
}

impl SumScatter {
    pub(crate) fn new(
        rank: usize,
        size: usize,
        classes: SizeClasses,
        (op, dtype): (ReduceOp, DType),
        out: usize,
        count: usize,
    ) -> Self {
        let class = classes.class_for(count * dtype.size());
        SumScatter {
            fanout: Fanout { rank, size, class },
            op,
            dtype,
            out,
            n: class.bytes() / dtype.size(),
            total: count,
            read: 0,
            sends: SlotSends::new(size),
            written: [0; MESH_MAX_RANKS],
        }
    }

    /// Copies the next slice of every peer's chunk into its scatter buffer of `slot` and
    /// posts them all.
    fn send_next(&mut self, cx: &mut Post<'_, '_>, mem: &mut Mem<'_>, slot: usize) -> Result<()> {
        let es = self.dtype.size();
        let elems = self.n.min(self.total - self.read);
        let class = self.fanout.class;
        for p in self.fanout.peers() {
            let buf = mem.plan.scatter_send(class, slot, p);
            let start = (p * self.total + self.read) * es;
            let bytes = mem.input(start, elems * es);
            cx.buffer(p, buf)?[..bytes.len()].copy_from_slice(bytes);
        }
        for p in self.fanout.peers() {
            let buf = mem.plan.scatter_send(class, slot, p);
            cx.post_send(p, buf, WorkTag::send(slot, p))?;
        }
        self.read += self.n;
        Ok(())
    }

    /// Seeds the output with this rank's own chunk (in place, it is already there).
    fn seed(&self, mem: &mut Mem<'_>) {
        let es = self.dtype.size();
        let (own, len) = (self.fanout.rank * self.total * es, self.total * es);
        match mem.input {
            Some(input) => {
                mem.data[self.out..self.out + len].copy_from_slice(&input[own..own + len])
            }
            None if own != self.out => mem.data.copy_within(own..own + len, self.out),
            None => {}
        }
    }

    /// Folds the frame received from `conn` into the output and reposts its buffer while
    /// frames remain.
    fn reduce_frame(
        &mut self,
        cx: &mut Post<'_, '_>,
        mem: &mut Mem<'_>,
        conn: usize,
        tag: WorkTag,
    ) -> Result<()> {
        let es = self.dtype.size();
        let peer = tag.index;
        let at = self.written[peer];
        let elems = self.n.min(self.total - at);
        let buf = mem.plan.scatter_recv(self.fanout.class, tag.slot, peer);
        let start = self.out + at * es;
        let theirs = &cx.buffer(conn, buf)?[..elems * es];
        let out = &mut mem.data[start..start + elems * es];
        reduce_with(Semantics::Jaccl, self.op, self.dtype, out, theirs);
        self.written[peer] += self.n;
        if self.written[peer] + self.n < self.total {
            cx.post_recv(peer, buf, WorkTag::recv(tag.slot, peer))?;
        }
        Ok(())
    }
}

impl Algorithm for SumScatter {
    fn begin(&mut self, cx: &mut Post<'_, '_>, mem: &mut Mem<'_>) -> Result<()> {
        self.seed(mem);
        let class = self.fanout.class;
        let mut slot = 0;
        while self.read < self.total && slot < PIPELINE {
            for p in self.fanout.peers() {
                let buf = mem.plan.scatter_recv(class, slot, p);
                cx.post_recv(p, buf, WorkTag::recv(slot, p))?;
            }
            self.send_next(cx, mem, slot)?;
            slot += 1;
        }
        Ok(())
    }

    fn completed(&mut self, cx: &mut Post<'_, '_>, mem: &mut Mem<'_>, done: Done) -> Result<()> {
        let Done { conn, tag } = done;
        if tag.recv {
            return self.reduce_frame(cx, mem, conn, tag);
        }
        if self.read < self.total && self.sends.completed(tag.slot) {
            self.send_next(cx, mem, tag.slot)?;
        }
        Ok(())
    }

    fn owns(&self, conn: usize) -> bool {
        self.fanout.owns(conn)
    }
}

/// A point-to-point transfer of `len` bytes with rank `peer`, in frames of one size class,
/// `at` bytes of it done.
struct Transfer {
    peer: usize,
    len: usize,
    class: Class,
    s: usize,
    at: usize,
}

impl Transfer {
    fn new(peer: usize, classes: SizeClasses, len: usize) -> Self {
        let class = classes.class_for(len);
        Transfer {
            peer,
            len,
            class,
            s: class.bytes(),
            at: 0,
        }
    }
}

/// A send of `len` bytes of `mem.input` to rank `dst`.
pub(crate) struct Send(Transfer);

impl Send {
    pub(crate) fn new(dst: usize, classes: SizeClasses, len: usize) -> Self {
        Send(Transfer::new(dst, classes, len))
    }

    fn send_next(&mut self, cx: &mut Post<'_, '_>, mem: &mut Mem<'_>, slot: usize) -> Result<()> {
        let t = &mut self.0;
        let end = (t.at + t.s).min(t.len);
        let buf = mem.plan.mesh_send(t.class, slot);
        let bytes = mem.input(t.at, end - t.at);
        cx.buffer(t.peer, buf)?[..bytes.len()].copy_from_slice(bytes);
        cx.post_send(t.peer, buf, WorkTag::send(slot, t.peer))?;
        t.at += t.s;
        Ok(())
    }
}

impl Algorithm for Send {
    fn begin(&mut self, cx: &mut Post<'_, '_>, mem: &mut Mem<'_>) -> Result<()> {
        for slot in 0..PIPELINE {
            if self.0.at >= self.0.len {
                break;
            }
            self.send_next(cx, mem, slot)?;
        }
        Ok(())
    }

    fn completed(&mut self, cx: &mut Post<'_, '_>, mem: &mut Mem<'_>, done: Done) -> Result<()> {
        if self.0.at < self.0.len {
            self.send_next(cx, mem, done.tag.slot)?;
        }
        Ok(())
    }

    fn owns(&self, conn: usize) -> bool {
        conn == self.0.peer
    }
}

/// A receive of `mem.data.len()` bytes from rank `src`.
pub(crate) struct Recv(Transfer);

impl Recv {
    pub(crate) fn new(src: usize, classes: SizeClasses, len: usize) -> Self {
        Recv(Transfer::new(src, classes, len))
    }
}

impl Algorithm for Recv {
    fn begin(&mut self, cx: &mut Post<'_, '_>, mem: &mut Mem<'_>) -> Result<()> {
        let t = &self.0;
        for slot in (0..PIPELINE).take_while(|&slot| t.s * slot < t.len) {
            let buf = mem.plan.mesh_recv(t.class, slot, t.peer);
            cx.post_recv(t.peer, buf, WorkTag::recv(slot, t.peer))?;
        }
        Ok(())
    }

    fn completed(&mut self, cx: &mut Post<'_, '_>, mem: &mut Mem<'_>, done: Done) -> Result<()> {
        let (Done { conn, tag }, t) = (done, &mut self.0);
        let len = t.s.min(t.len - t.at);
        let buf = mem.plan.mesh_recv(t.class, tag.slot, t.peer);
        mem.data[t.at..t.at + len].copy_from_slice(&cx.buffer(conn, buf)?[..len]);
        t.at += t.s;
        if t.at + t.s < t.len {
            cx.post_recv(t.peer, buf, WorkTag::recv(tag.slot, t.peer))?;
        }
        Ok(())
    }

    fn owns(&self, conn: usize) -> bool {
        conn == self.0.peer
    }
}
