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
use crate::element::DType;
use crate::error::Result;
use crate::reduce::{ReduceOp, Semantics, reduce_with};
use crate::transport::rdma::engine::{Cx, Machine};

/// MLX uses the scatter-gather all-reduce above this many bytes when there are more than two
/// ranks.
pub(crate) const SCATTER_GATHER_ABOVE: usize = 32 * 1024;

/// Whether MLX's mesh reduces `bytes` with the scatter-gather path for `size` ranks.
pub(crate) fn uses_scatter_gather(size: usize, bytes: usize) -> bool {
    size > 2 && bytes > SCATTER_GATHER_ABOVE
}

/// Posts receives from every peer into slot `slot`'s receive buffers.
fn post_recv_all(
    cx: &mut Cx<'_>,
    plan: &BufferPlan,
    rank: usize,
    size: usize,
    class: Class,
    slot: usize,
) -> Result<()> {
    for p in (0..size).filter(|&p| p != rank) {
        let buf = plan.mesh_recv(class, slot, p);
        cx.post_recv(p, buf, WorkTag::recv(slot, p).encode())?;
    }
    Ok(())
}

/// Posts this rank's send buffer of slot `slot` to every peer.
fn post_send_all(
    cx: &mut Cx<'_>,
    plan: &BufferPlan,
    rank: usize,
    size: usize,
    class: Class,
    slot: usize,
) -> Result<()> {
    let buf = plan.mesh_send(class, slot);
    for p in (0..size).filter(|&p| p != rank) {
        cx.post_send(p, buf, WorkTag::send(slot, p).encode())?;
    }
    Ok(())
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
    rank: usize,
    size: usize,
    op: ReduceOp,
    dtype: DType,
    base: usize,
    class: Class,
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
    in_flight: usize,
    started: bool,
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
            rank,
            size,
            op,
            dtype,
            base,
            class,
            n,
            total: count,
            chunks: count.div_ceil(n),
            read: 0,
            sends: SlotSends::new(size),
            recv_end: [0; MESH_MAX_RANKS],
            reduce_chunk: 0,
            reduce_rank: 0,
            in_flight: 0,
            started: false,
        }
    }

    /// Byte range of `elems` elements from element `at`.
    fn bytes(&self, at: usize, elems: usize) -> std::ops::Range<usize> {
        let es = self.dtype.size();
        self.base + at * es..self.base + (at + elems) * es
    }

    /// Copies the next chunk into send slot `slot` and posts it to every peer.
    fn send_next(&mut self, cx: &mut Cx<'_>, mem: &mut Mem<'_>, slot: usize) -> Result<()> {
        let elems = self.n.min(self.total - self.read);
        let range = self.bytes(self.read, elems);
        let buf = mem.plan.mesh_send(self.class, slot);
        cx.fill(first_peer(self.rank), buf, &mem.data[range])?;
        post_send_all(cx, mem.plan, self.rank, self.size, self.class, slot)?;
        self.in_flight += self.size - 1;
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

    /// Reduces every chunk that can be, in chunk order and rank order.
    fn advance(&mut self, cx: &mut Cx<'_>, mem: &mut Mem<'_>) -> Result<()> {
        let es = self.dtype.size();
        while self.reduce_chunk < self.chunks {
            let w = self.reduce_chunk * self.n;
            // Our own chunk must be staged for sending before the output overwrites it.
            if w >= self.read || self.recv_end[self.reduce_rank] <= self.reduce_chunk {
                break;
            }
            let slot = self.reduce_chunk % PIPELINE;
            let elems = self.n.min(self.total - w);
            let out = self.bytes(w, elems);
            let first = self.reduce_rank == 0;
            if self.reduce_rank == self.rank {
                let stride = mem.staging.len() / PIPELINE;
                let own = &mem.staging[slot * stride..][..elems * es];
                if first {
                    mem.data[out].copy_from_slice(own);
                } else {
                    reduce_with(
                        Semantics::Jaccl,
                        self.op,
                        self.dtype,
                        &mut mem.data[out],
                        own,
                    );
                }
                let next = self.reduce_chunk + PIPELINE;
                if next < self.chunks {
                    self.stage_own(mem, next, slot);
                    self.recv_end[self.rank] += 1;
                }
            } else {
                let peer = self.reduce_rank;
                let buf = mem.plan.mesh_recv(self.class, slot, peer);
                let theirs = &cx.buffer(peer, buf)?[..elems * es];
                if first {
                    mem.data[out].copy_from_slice(theirs);
                } else {
                    reduce_with(
                        Semantics::Jaccl,
                        self.op,
                        self.dtype,
                        &mut mem.data[out],
                        theirs,
                    );
                }
                if self.reduce_chunk + PIPELINE < self.chunks {
                    cx.post_recv(peer, buf, WorkTag::recv(slot, peer).encode())?;
                    self.in_flight += 1;
                }
            }
            self.reduce_rank += 1;
            if self.reduce_rank == self.size {
                self.reduce_rank = 0;
                self.reduce_chunk += 1;
            }
        }
        Ok(())
    }
}

impl Machine<Mem<'_>> for AllReduce {
    fn start(&mut self, cx: &mut Cx<'_>, mem: &mut Mem<'_>) -> Result<()> {
        self.started = true;
        let mut slot = 0;
        while self.read < self.total && slot < PIPELINE {
            post_recv_all(cx, mem.plan, self.rank, self.size, self.class, slot)?;
            self.stage_own(mem, slot, slot);
            self.recv_end[self.rank] += 1;
            self.in_flight += self.size - 1;
            self.send_next(cx, mem, slot)?;
            slot += 1;
        }
        self.advance(cx, mem)
    }

    fn handle_completion(
        &mut self,
        cx: &mut Cx<'_>,
        mem: &mut Mem<'_>,
        _: usize,
        tag: u64,
    ) -> Result<()> {
        let tag = WorkTag::decode(tag);
        self.in_flight -= 1;
        if !tag.recv {
            if self.read < self.total && self.sends.completed(tag.slot) {
                self.send_next(cx, mem, tag.slot)?;
            }
        } else {
            self.recv_end[tag.index] += 1;
        }
        self.advance(cx, mem)
    }

    fn is_finished(&self) -> bool {
        self.started && self.reduce_chunk == self.chunks && self.in_flight == 0
    }

    fn owns(&self, conn: usize) -> bool {
        conn != self.rank && conn < self.size
    }
}

/// The all_gather of `block` bytes per rank; this rank's block is already at
/// `rank * block` of the data.
pub(crate) struct AllGather {
    rank: usize,
    size: usize,
    block: usize,
    class: Class,
    s: usize,
    read: usize,
    sends: SlotSends,
    /// Per peer, the bytes (or elements) received so far; fixed, as `recv_end` above.
    written: [usize; MESH_MAX_RANKS],
    in_flight: usize,
    started: bool,
}

impl AllGather {
    pub(crate) fn new(rank: usize, size: usize, classes: SizeClasses, block: usize) -> Self {
        let class = classes.class_for(block);
        AllGather {
            rank,
            size,
            block,
            class,
            s: class.bytes(),
            read: 0,
            sends: SlotSends::new(size),
            written: [0; MESH_MAX_RANKS],
            in_flight: 0,
            started: false,
        }
    }

    fn send_next(&mut self, cx: &mut Cx<'_>, mem: &mut Mem<'_>, slot: usize) -> Result<()> {
        let own = self.rank * self.block;
        let end = (self.read + self.s).min(self.block);
        let buf = mem.plan.mesh_send(self.class, slot);
        cx.fill(
            first_peer(self.rank),
            buf,
            &mem.data[own + self.read..own + end],
        )?;
        post_send_all(cx, mem.plan, self.rank, self.size, self.class, slot)?;
        self.in_flight += self.size - 1;
        self.read += self.s;
        Ok(())
    }
}

impl Machine<Mem<'_>> for AllGather {
    fn start(&mut self, cx: &mut Cx<'_>, mem: &mut Mem<'_>) -> Result<()> {
        self.started = true;
        let mut slot = 0;
        while self.read < self.block && slot < PIPELINE {
            post_recv_all(cx, mem.plan, self.rank, self.size, self.class, slot)?;
            self.in_flight += self.size - 1;
            self.send_next(cx, mem, slot)?;
            slot += 1;
        }
        Ok(())
    }

    fn handle_completion(
        &mut self,
        cx: &mut Cx<'_>,
        mem: &mut Mem<'_>,
        conn: usize,
        tag: u64,
    ) -> Result<()> {
        let tag = WorkTag::decode(tag);
        self.in_flight -= 1;
        if !tag.recv {
            if self.read < self.block && self.sends.completed(tag.slot) {
                self.send_next(cx, mem, tag.slot)?;
            }
            return Ok(());
        }
        let peer = tag.index;
        let at = self.written[peer];
        let len = self.s.min(self.block - at);
        let buf = mem.plan.mesh_recv(self.class, tag.slot, peer);
        let start = peer * self.block + at;
        mem.data[start..start + len].copy_from_slice(&cx.buffer(conn, buf)?[..len]);
        self.written[peer] += self.s;
        if self.written[peer] + self.s < self.block {
            cx.post_recv(peer, buf, WorkTag::recv(tag.slot, peer).encode())?;
            self.in_flight += 1;
        }
        Ok(())
    }

    fn is_finished(&self) -> bool {
        self.started && self.in_flight == 0
    }

    fn owns(&self, conn: usize) -> bool {
        conn != self.rank && conn < self.size
    }
}

/// The sum_scatter of `count`-element chunks: the input holds P chunks (from `mem.input`,
/// or from the data itself when that is `None`); this rank's reduced chunk goes to byte
/// `out` of the data. MLX's scatter-gather all-reduce runs it with max and min too.
pub(crate) struct SumScatter {
    rank: usize,
    size: usize,
    op: ReduceOp,
    dtype: DType,
    out: usize,
    class: Class,
    n: usize,
    total: usize,
    read: usize,
    sends: SlotSends,
    /// Per peer, the bytes (or elements) received so far; fixed, as `recv_end` above.
    written: [usize; MESH_MAX_RANKS],
    in_flight: usize,
    started: bool,
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
            rank,
            size,
            op,
            dtype,
            out,
            class,
            n: class.bytes() / dtype.size(),
            total: count,
            read: 0,
            sends: SlotSends::new(size),
            written: [0; MESH_MAX_RANKS],
            in_flight: 0,
            started: false,
        }
    }

    /// Copies the next slice of every peer's chunk into its scatter buffer of `slot` and
    /// posts them all.
    fn send_next(&mut self, cx: &mut Cx<'_>, mem: &mut Mem<'_>, slot: usize) -> Result<()> {
        let es = self.dtype.size();
        let elems = self.n.min(self.total - self.read);
        for p in (0..self.size).filter(|&p| p != self.rank) {
            let buf = mem.plan.scatter_send(self.class, slot, p);
            let start = (p * self.total + self.read) * es;
            let bytes = mem.input(start, elems * es);
            cx.buffer(p, buf)?[..bytes.len()].copy_from_slice(bytes);
        }
        for p in (0..self.size).filter(|&p| p != self.rank) {
            let buf = mem.plan.scatter_send(self.class, slot, p);
            cx.post_send(p, buf, WorkTag::send(slot, p).encode())?;
        }
        self.in_flight += self.size - 1;
        self.read += self.n;
        Ok(())
    }
}

impl Machine<Mem<'_>> for SumScatter {
    fn start(&mut self, cx: &mut Cx<'_>, mem: &mut Mem<'_>) -> Result<()> {
        self.started = true;
        let es = self.dtype.size();
        // Seed the output with our own chunk (in place, it is already there).
        let (own, len) = (self.rank * self.total * es, self.total * es);
        match mem.input {
            Some(input) => {
                mem.data[self.out..self.out + len].copy_from_slice(&input[own..own + len])
            }
            None if own != self.out => mem.data.copy_within(own..own + len, self.out),
            None => {}
        }
        let mut slot = 0;
        while self.read < self.total && slot < PIPELINE {
            for p in (0..self.size).filter(|&p| p != self.rank) {
                let buf = mem.plan.scatter_recv(self.class, slot, p);
                cx.post_recv(p, buf, WorkTag::recv(slot, p).encode())?;
            }
            self.in_flight += self.size - 1;
            self.send_next(cx, mem, slot)?;
            slot += 1;
        }
        Ok(())
    }

    fn handle_completion(
        &mut self,
        cx: &mut Cx<'_>,
        mem: &mut Mem<'_>,
        conn: usize,
        tag: u64,
    ) -> Result<()> {
        let tag = WorkTag::decode(tag);
        self.in_flight -= 1;
        if !tag.recv {
            if self.read < self.total && self.sends.completed(tag.slot) {
                self.send_next(cx, mem, tag.slot)?;
            }
            return Ok(());
        }
        let es = self.dtype.size();
        let peer = tag.index;
        let at = self.written[peer];
        let elems = self.n.min(self.total - at);
        let buf = mem.plan.scatter_recv(self.class, tag.slot, peer);
        let start = self.out + at * es;
        let theirs = &cx.buffer(conn, buf)?[..elems * es];
        reduce_with(
            Semantics::Jaccl,
            self.op,
            self.dtype,
            &mut mem.data[start..start + elems * es],
            theirs,
        );
        self.written[peer] += self.n;
        if self.written[peer] + self.n < self.total {
            cx.post_recv(peer, buf, WorkTag::recv(tag.slot, peer).encode())?;
            self.in_flight += 1;
        }
        Ok(())
    }

    fn is_finished(&self) -> bool {
        self.started && self.in_flight == 0
    }

    fn owns(&self, conn: usize) -> bool {
        conn != self.rank && conn < self.size
    }
}

/// A send of `len` bytes of `mem.input` to rank `dst`.
pub(crate) struct Send {
    dst: usize,
    len: usize,
    class: Class,
    s: usize,
    read: usize,
    in_flight: usize,
    started: bool,
}

impl Send {
    pub(crate) fn new(dst: usize, classes: SizeClasses, len: usize) -> Self {
        let class = classes.class_for(len);
        Send {
            dst,
            len,
            class,
            s: class.bytes(),
            read: 0,
            in_flight: 0,
            started: false,
        }
    }

    fn send_next(&mut self, cx: &mut Cx<'_>, mem: &mut Mem<'_>, slot: usize) -> Result<()> {
        let end = (self.read + self.s).min(self.len);
        let buf = mem.plan.mesh_send(self.class, slot);
        let bytes = mem.input(self.read, end - self.read);
        cx.buffer(self.dst, buf)?[..bytes.len()].copy_from_slice(bytes);
        cx.post_send(self.dst, buf, WorkTag::send(slot, self.dst).encode())?;
        self.read += self.s;
        self.in_flight += 1;
        Ok(())
    }
}

impl Machine<Mem<'_>> for Send {
    fn start(&mut self, cx: &mut Cx<'_>, mem: &mut Mem<'_>) -> Result<()> {
        self.started = true;
        let mut slot = 0;
        while self.read < self.len && slot < PIPELINE {
            self.send_next(cx, mem, slot)?;
            slot += 1;
        }
        Ok(())
    }

    fn handle_completion(
        &mut self,
        cx: &mut Cx<'_>,
        mem: &mut Mem<'_>,
        _: usize,
        tag: u64,
    ) -> Result<()> {
        let tag = WorkTag::decode(tag);
        self.in_flight -= 1;
        if self.read < self.len {
            self.send_next(cx, mem, tag.slot)?;
        }
        Ok(())
    }

    fn is_finished(&self) -> bool {
        self.started && self.in_flight == 0
    }

    fn owns(&self, conn: usize) -> bool {
        conn == self.dst
    }
}

/// A receive of `mem.data.len()` bytes from rank `src`.
pub(crate) struct Recv {
    src: usize,
    len: usize,
    class: Class,
    s: usize,
    written: usize,
    in_flight: usize,
    started: bool,
}

impl Recv {
    pub(crate) fn new(src: usize, classes: SizeClasses, len: usize) -> Self {
        let class = classes.class_for(len);
        Recv {
            src,
            len,
            class,
            s: class.bytes(),
            written: 0,
            in_flight: 0,
            started: false,
        }
    }
}

impl Machine<Mem<'_>> for Recv {
    fn start(&mut self, cx: &mut Cx<'_>, mem: &mut Mem<'_>) -> Result<()> {
        self.started = true;
        let mut slot = 0;
        while self.s * slot < self.len && slot < PIPELINE {
            let buf = mem.plan.mesh_recv(self.class, slot, self.src);
            cx.post_recv(self.src, buf, WorkTag::recv(slot, self.src).encode())?;
            self.in_flight += 1;
            slot += 1;
        }
        Ok(())
    }

    fn handle_completion(
        &mut self,
        cx: &mut Cx<'_>,
        mem: &mut Mem<'_>,
        conn: usize,
        tag: u64,
    ) -> Result<()> {
        let tag = WorkTag::decode(tag);
        self.in_flight -= 1;
        let len = self.s.min(self.len - self.written);
        let buf = mem.plan.mesh_recv(self.class, tag.slot, self.src);
        mem.data[self.written..self.written + len].copy_from_slice(&cx.buffer(conn, buf)?[..len]);
        self.written += self.s;
        if self.written + self.s < self.len {
            cx.post_recv(self.src, buf, WorkTag::recv(tag.slot, self.src).encode())?;
            self.in_flight += 1;
        }
        Ok(())
    }

    fn is_finished(&self) -> bool {
        self.started && self.in_flight == 0
    }

    fn owns(&self, conn: usize) -> bool {
        conn == self.src
    }
}
