//! MLX 0.32.1's ring algorithms (`ring.cpp`, `ring_impl.h`), as one state machine per wire.
//!
//! Each rank has `W` wires (cables) to each neighbour: connection `w` to the left neighbour,
//! `W + w` to the right. A wire carries two *directions*: direction 0 sends right and receives
//! from the left, direction 1 sends left and receives from the right. MLX runs each wire on
//! its own thread; here every wire is a [`Machine`] and the caller's thread drives them all,
//! which changes nothing on the wire: each wire only touches its own two queue pairs, and the
//! order of messages per queue pair is the wire's own.
//!
//! # all_sum, all_max, all_min
//!
//! With `count` elements of `T` and P ranks: if the array is at most 32 KiB or has fewer than
//! `2 P W` elements, one direction on wire 0; else both directions on all `W` wires. The array
//! is cut into P chunks of `ceil(count / P)` elements; each chunk into `dirs x wires` slices of
//! `spw = ceil(chunk / (dirs x wires))` elements, slice `(d, w)` starting at
//! `d*wires*spw + w*spw`. The message length is `spw * sizeof(T)`, which picks the class, and
//! every step sends `ceil(spw / N)` messages per direction, *even if the slice is clipped to
//! nothing at the end of the array*.
//!
//! Then two passes of P-1 steps. In the reduce-scatter pass, direction 0 sends chunk
//! `rank - t` and receives chunk `rank - 1 - t`, folding it into the array; direction 1 sends
//! `rank + t` and receives `rank + 1 + t`. The all-gather pass continues the rotation with
//! copies. A step ends when all its messages, both ways, completed.
//!
//! # sum_scatter
//!
//! Always both directions; one wire if there are fewer than `2 P W` elements in all or the
//! output is at most 64 KiB, else all wires. Direction 0 starts by sending this rank's input
//! chunk `rank - 1` and direction 1 chunk `rank + 1`; each received slice is added to this
//! rank's own input for that chunk into the output, which later steps forward; both
//! directions converge on chunk `rank`. A received slice is only written once the send of the
//! same slice has been staged, since it overwrites the partial being forwarded.
//!
//! # all_gather: where this differs from MLX
//!
//! MLX 0.32.1's ring all_gather sends the *same* slice `[w*npw, (w+1)*npw)` of every block in
//! both directions (`npw = ceil(n / 2W)`), and passes the block size rather than the whole
//! output as the array size, which limits every block but rank 0's to zero bytes: most of the
//! output is never filled (reference section 3.8.3, confirmed by reading `ring_impl.h`). This
//! crate does what the code evidently means: direction `d` of wire `w` carries slice
//! `[d*W*npw + w*npw, ...)` of every block, and the limits are the whole output's. The
//! messages are the same (same class from `npw`, same `ceil(npw / S)` messages per direction
//! per step on every wire, P-1 steps) so a mixed group does not hang, but **MLX ranks in
//! jaccl-ring mode compute a wrong all_gather, and this crate's all_gather does not
//! interoperate with them until MLX's is fixed and the fix verified on hardware.**
//!
//! # send and recv
//!
//! Neighbours only, split over all `W` wires in `ceil(n / W)`-byte stripes. A send to the left
//! neighbour goes in direction 1 (so with two ranks, where left and right are the same rank,
//! sends go left and receives come from the right, as MLX biases them).

use super::buffers::Mem;
use super::frames::{Class, PIPELINE, SizeClasses, WorkTag};
use super::machine::{Algorithm, Counted, Done, Post};
use crate::element::DType;
use crate::error::Result;
use crate::reduce::{ReduceOp, Semantics, reduce_with};
use crate::transport::rdma::fabric::BufId;
use std::ops::Range;

/// An all-reduce uses one direction on one wire up to this many bytes.
pub(crate) const ALL_REDUCE_ONE_WIRE_UP_TO: usize = 32 * 1024;

/// A sum_scatter uses one wire up to this many output bytes.
pub(crate) const SUM_SCATTER_ONE_WIRE_UP_TO: usize = 64 * 1024;

/// The connection of wire `wire` to the left neighbour.
fn left(wire: usize) -> usize {
    wire
}

/// The connection of wire `wire` to the right neighbour.
fn right(wires: usize, wire: usize) -> usize {
    wires + wire
}

/// Where direction `dir` of wire `wire` sends.
fn send_conn(wires: usize, wire: usize, dir: usize) -> usize {
    if dir == 0 {
        right(wires, wire)
    } else {
        left(wire)
    }
}

/// Where direction `dir` of wire `wire` receives.
fn recv_conn(wires: usize, wire: usize, dir: usize) -> usize {
    if dir == 0 {
        left(wire)
    } else {
        right(wires, wire)
    }
}

/// What a pass does with received slices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pass {
    /// Fold into the array.
    Reduce(ReduceOp, DType),
    /// Overwrite.
    Copy,
}

/// One direction of a ring wire: its slice of each chunk and its messages in the current step.
#[derive(Default)]
struct Direction {
    /// The slice's elements within a chunk (clipped to the chunk).
    slice: Range<usize>,
    /// Messages staged and posted this step.
    sent: usize,
    /// Received messages applied this step.
    received: usize,
    /// The slice's end within this step's send and receive windows: a message at or past it
    /// carries no elements, but is still sent.
    send_limit: usize,
    recv_limit: usize,
}

/// What every wire of an all-reduce, all_gather or sum_scatter keeps: where it sends and
/// receives, its directions, its message class, and how far the collective has come.
struct Lanes {
    size: usize,
    wire: usize,
    /// Wires per neighbour in the group (connection numbering), not only the active ones.
    wires: usize,
    /// Directions in use: 1, or 2 (both).
    dirs: usize,
    /// Each direction's slice and counts (the second unused with one direction).
    dir: [Direction; 2],
    class: Class,
    /// Elements per message.
    n: usize,
    /// Messages per direction per step.
    n_steps: usize,
    step: usize,
    done: bool,
}

impl Lanes {
    /// Wire `wire` of the `active` wires in use (of `wires` per neighbour) with `dirs`
    /// directions, moving elements of `es` bytes in messages of class `class`. Direction `d`
    /// carries the `per_wire` elements from `d * active * per_wire + wire * per_wire` of each
    /// `chunk`-element chunk, clipped to the chunk.
    fn new(
        size: usize,
        (wire, active, wires): (usize, usize, usize),
        (dirs, per_wire, chunk): (usize, usize, usize),
        (class, es): (Class, usize),
    ) -> Self {
        let mut dir: [Direction; 2] = Default::default();
        for (d, direction) in dir.iter_mut().enumerate().take(dirs) {
            let start = d * active * per_wire + wire * per_wire;
            let end = chunk.min(start + per_wire);
            direction.slice = start..end;
            direction.send_limit = end;
            direction.recv_limit = end;
        }
        let n = class.bytes() / es;
        Lanes {
            size,
            wire,
            wires,
            dirs,
            dir,
            class,
            n,
            n_steps: per_wire.div_ceil(n),
            step: 0,
            done: false,
        }
    }

    /// The message of direction `dir` the next send (`recv` false) or the next applied receive
    /// carries: its first element within the chunk and how many elements it holds.
    fn next(&self, dir: usize, recv: bool) -> (usize, usize) {
        let d = &self.dir[dir];
        let (index, limit) = if recv {
            (d.received, d.recv_limit)
        } else {
            (d.sent, d.send_limit)
        };
        let offset = d.slice.start + index * self.n;
        (offset, limit.saturating_sub(offset).min(self.n))
    }

    /// The connection and buffer of the request `tag` names.
    fn place(&self, mem: &Mem<'_>, tag: WorkTag) -> (usize, BufId) {
        let (dir, slot) = (tag.index, tag.slot);
        if tag.recv {
            let buf = mem.plan.ring_recv(self.class, slot, dir, self.wire);
            (recv_conn(self.wires, self.wire, dir), buf)
        } else {
            let buf = mem.plan.ring_send(self.class, slot, dir, self.wire);
            (send_conn(self.wires, self.wire, dir), buf)
        }
    }

    /// Posts the send `tag` names, staged already, and counts it.
    fn post_send(&mut self, cx: &mut Post<'_, '_>, mem: &Mem<'_>, tag: WorkTag) -> Result<()> {
        let (conn, buf) = self.place(mem, tag);
        self.dir[tag.index].sent += 1;
        cx.post_send(conn, buf, tag)
    }

    /// Counts the received message in `tag`'s slot as applied, and reposts the slot for the
    /// message `PIPELINE - 1` after the next, if the step has one.
    fn repost(&mut self, cx: &mut Post<'_, '_>, mem: &Mem<'_>, tag: WorkTag) -> Result<()> {
        let d = &mut self.dir[tag.index];
        d.received += 1;
        if d.received + PIPELINE - 1 < self.n_steps {
            let (conn, buf) = self.place(mem, tag);
            cx.post_recv(conn, buf, tag)?;
        }
        Ok(())
    }

    /// Starts the count of the next step; whether that ends a pass (P - 1 steps).
    fn next_step(&mut self) -> bool {
        for d in &mut self.dir {
            d.sent = 0;
            d.received = 0;
        }
        self.step += 1;
        self.step == self.size - 1
    }
}

/// Moves per-direction positions to the next step: direction 0 back by `stride`, direction 1
/// forward, around `total`.
fn rotate(at: &mut [usize; 2], stride: usize, total: usize) {
    if total > 0 {
        at[0] = (at[0] + total - stride) % total;
        at[1] = (at[1] + stride) % total;
    }
}

/// A wire of a ring collective: its [`Lanes`], how it stages a message and takes one in, and
/// how it moves its windows between steps. Posting a step's first messages, restaging a
/// freed send slot and settling between steps are the same for every such wire.
trait RingWire {
    fn lanes(&self) -> &Lanes;

    /// Stages the next message of the send `tag` names into its slot and posts it.
    fn send_next(&mut self, cx: &mut Post<'_, '_>, mem: &mut Mem<'_>, tag: WorkTag) -> Result<()>;

    /// Takes in the completion `tag` names, after a completed send's slot is restaged.
    fn take(&mut self, cx: &mut Post<'_, '_>, mem: &mut Mem<'_>, tag: WorkTag) -> Result<()>;

    /// Moves the windows to the next step, or marks the lanes done after the last one.
    fn advance(&mut self);

    /// Posts the first `PIPELINE` receives and sends of a step, in every direction.
    fn begin_step(&mut self, cx: &mut Post<'_, '_>, mem: &mut Mem<'_>) -> Result<()> {
        let (n_steps, dirs) = (self.lanes().n_steps, self.lanes().dirs);
        let mut slot = 0;
        while slot < n_steps && slot < PIPELINE {
            for d in 0..dirs {
                let tag = WorkTag::recv(slot, d);
                let (conn, buf) = self.lanes().place(mem, tag);
                cx.post_recv(conn, buf, tag)?;
            }
            for d in 0..dirs {
                self.send_next(cx, mem, WorkTag::send(slot, d))?;
            }
            slot += 1;
        }
        Ok(())
    }

    /// Moves past steps whose messages are all done, starting the next ones.
    fn settle(&mut self, cx: &mut Post<'_, '_>, mem: &mut Mem<'_>) -> Result<()> {
        while cx.idle() && !self.lanes().done {
            self.advance();
            if self.lanes().done {
                return Ok(());
            }
            self.begin_step(cx, mem)?;
        }
        Ok(())
    }
}

impl<W: RingWire> Algorithm for W {
    fn begin(&mut self, cx: &mut Post<'_, '_>, mem: &mut Mem<'_>) -> Result<()> {
        self.begin_step(cx, mem)?;
        self.settle(cx, mem)
    }

    fn completed(&mut self, cx: &mut Post<'_, '_>, mem: &mut Mem<'_>, done: Done) -> Result<()> {
        let tag = done.tag;
        let lanes = self.lanes();
        if !tag.recv && lanes.dir[tag.index].sent < lanes.n_steps {
            self.send_next(cx, mem, tag)?;
        }
        self.take(cx, mem, tag)?;
        self.settle(cx, mem)
    }

    fn done(&self) -> bool {
        self.lanes().done
    }

    fn owns(&self, conn: usize) -> bool {
        let lanes = self.lanes();
        conn == left(lanes.wire) || conn == right(lanes.wires, lanes.wire)
    }
}

/// One wire of MLX's `ring_pass`-based collectives (all-reduce, all_gather).
pub(crate) struct Wire {
    lanes: Lanes,
    es: usize,
    passes: [Option<Pass>; 2],
    pass: usize,
    /// The array's length in elements (the limit of every window).
    len: usize,
    /// Elements per chunk; the windows move by one chunk a step.
    stride: usize,
    /// Where each direction's send and receive windows start in the array this step.
    send_offset: [usize; 2],
    recv_offset: [usize; 2],
}

/// The wires of an all-reduce of `count` elements, as MLX's `RingGroup::all_reduce` splits
/// it, into `out` (cleared first; the group keeps it across calls so that a collective
/// allocates nothing).
#[allow(clippy::too_many_arguments)]
pub(crate) fn all_reduce(
    rank: usize,
    size: usize,
    wires: usize,
    classes: SizeClasses,
    (op, dtype): (ReduceOp, DType),
    count: usize,
    out: &mut Vec<Counted<Wire>>,
) {
    let es = dtype.size();
    let (dirs, active) = if count * es <= ALL_REDUCE_ONE_WIRE_UP_TO || count < size * 2 * wires {
        (1, 1)
    } else {
        (2, wires)
    };
    let chunk = count.div_ceil(size);
    let spw = chunk.div_ceil(dirs * active);
    let class = classes.class_for(spw * es);
    let passes = [Some(Pass::Reduce(op, dtype)), Some(Pass::Copy)];
    out.clear();
    out.extend((0..active).map(|w| {
        let lanes = Lanes::new(size, (w, active, wires), (dirs, spw, chunk), (class, es));
        Counted::new(Wire::new(lanes, (es, passes), (rank, chunk, count)))
    }));
}

/// The wires of an all_gather of `block` bytes per rank (this crate's corrected form of
/// MLX's; see the module docs), into `out` (cleared first). This rank's block must already
/// be in place.
pub(crate) fn all_gather(
    rank: usize,
    size: usize,
    wires: usize,
    classes: SizeClasses,
    block: usize,
    out: &mut Vec<Counted<Wire>>,
) {
    let npw = block.div_ceil(2 * wires);
    let class = classes.class_for(npw);
    out.clear();
    out.extend((0..wires).map(|w| {
        let lanes = Lanes::new(size, (w, wires, wires), (2, npw, block), (class, 1));
        let passes = [Some(Pass::Copy), None];
        Counted::new(Wire::new(lanes, (1, passes), (rank, block, size * block)))
    }));
}

impl Wire {
    /// A wire over `lanes` moving elements of `es` bytes in `passes`, whose windows start at
    /// rank `rank`'s chunk of `stride` elements in an array of `len` elements.
    fn new(
        lanes: Lanes,
        (es, passes): (usize, [Option<Pass>; 2]),
        (rank, stride, len): (usize, usize, usize),
    ) -> Self {
        let size = lanes.size;
        let mut wire = Wire {
            lanes,
            es,
            passes,
            pass: 0,
            len,
            stride,
            send_offset: [rank * stride; 2],
            recv_offset: [
                (rank + size - 1) % size * stride,
                (rank + 1) % size * stride,
            ],
        };
        wire.set_limits();
        wire
    }

    /// Clips each direction's slice to the array behind this step's windows.
    fn set_limits(&mut self) {
        for d in 0..self.lanes.dirs {
            let direction = &mut self.lanes.dir[d];
            let end = direction.slice.end;
            direction.send_limit = end.min(self.len.saturating_sub(self.send_offset[d]));
            direction.recv_limit = end.min(self.len.saturating_sub(self.recv_offset[d]));
        }
    }
}

impl RingWire for Wire {
    fn lanes(&self) -> &Lanes {
        &self.lanes
    }

    fn send_next(&mut self, cx: &mut Post<'_, '_>, mem: &mut Mem<'_>, tag: WorkTag) -> Result<()> {
        let (es, dir) = (self.es, tag.index);
        let (offset, elems) = self.lanes.next(dir, false);
        if elems > 0 {
            let (conn, buf) = self.lanes.place(mem, tag);
            let start = (self.send_offset[dir] + offset) * es;
            cx.fill(conn, buf, &mem.data[start..start + elems * es])?;
        }
        self.lanes.post_send(cx, mem, tag)
    }

    /// Folds or copies a received message into the array as soon as it arrives.
    fn take(&mut self, cx: &mut Post<'_, '_>, mem: &mut Mem<'_>, tag: WorkTag) -> Result<()> {
        if !tag.recv {
            return Ok(());
        }
        let (es, dir) = (self.es, tag.index);
        let (offset, elems) = self.lanes.next(dir, true);
        if elems > 0 {
            let (conn, buf) = self.lanes.place(mem, tag);
            let start = (self.recv_offset[dir] + offset) * es;
            let out = &mut mem.data[start..start + elems * es];
            let theirs = &cx.buffer(conn, buf)?[..elems * es];
            match self.passes[self.pass] {
                Some(Pass::Reduce(op, dtype)) => {
                    reduce_with(Semantics::Jaccl, op, dtype, out, theirs)
                }
                _ => out.copy_from_slice(theirs),
            }
        }
        self.lanes.repost(cx, mem, tag)
    }

    fn advance(&mut self) {
        let total = self.lanes.size * self.stride;
        rotate(&mut self.send_offset, self.stride, total);
        rotate(&mut self.recv_offset, self.stride, total);
        self.set_limits();
        if self.lanes.next_step() {
            self.lanes.step = 0;
            self.pass += 1;
            self.lanes.done = self.pass == 2 || self.passes[self.pass].is_none();
        }
    }
}

/// One wire of MLX's ring sum_scatter (`reduce_scatter_wire`).
pub(crate) struct ScatterWire {
    lanes: Lanes,
    dtype: DType,
    chunk: usize,
    /// Where each direction's outgoing partial and the input added to incoming ones start.
    in_send: [usize; 2],
    in_recv: [usize; 2],
    /// Received messages not yet applied, per direction.
    deferred: [usize; 2],
}

/// The wires of a sum_scatter with `chunk` output elements per rank (input in `mem.input`,
/// output in `mem.data`), into `out` (cleared first).
pub(crate) fn sum_scatter(
    rank: usize,
    size: usize,
    wires: usize,
    classes: SizeClasses,
    (dtype, chunk): (DType, usize),
    out: &mut Vec<Counted<ScatterWire>>,
) {
    let es = dtype.size();
    let total = size * chunk;
    let active = if total < size * 2 * wires || chunk * es <= SUM_SCATTER_ONE_WIRE_UP_TO {
        1
    } else {
        wires
    };
    let spw = chunk.div_ceil(2 * active);
    let class = classes.class_for(spw * es);
    out.clear();
    out.extend((0..active).map(|w| {
        Counted::new(ScatterWire {
            lanes: Lanes::new(size, (w, active, wires), (2, spw, chunk), (class, es)),
            dtype,
            chunk,
            in_send: [(rank + size - 1) % size * chunk, (rank + 1) % size * chunk],
            in_recv: [
                (rank + 2 * size - 2) % size * chunk,
                (rank + 2) % size * chunk,
            ],
            deferred: [0; 2],
        })
    }));
}

impl RingWire for ScatterWire {
    fn lanes(&self) -> &Lanes {
        &self.lanes
    }

    /// Stages the next partial (this rank's input at step 0, the output's partial later).
    fn send_next(&mut self, cx: &mut Post<'_, '_>, mem: &mut Mem<'_>, tag: WorkTag) -> Result<()> {
        let (es, dir) = (self.dtype.size(), tag.index);
        let (offset, elems) = self.lanes.next(dir, false);
        if elems > 0 {
            let (conn, buf) = self.lanes.place(mem, tag);
            let bytes = if self.lanes.step == 0 {
                mem.input((self.in_send[dir] + offset) * es, elems * es)
            } else {
                &mem.data[offset * es..(offset + elems) * es]
            };
            cx.fill(conn, buf, bytes)?;
        }
        self.lanes.post_send(cx, mem, tag)
    }

    /// Applies received slices of the completion's direction whose send counterpart has been
    /// staged: a received slice overwrites the partial being forwarded.
    fn take(&mut self, cx: &mut Post<'_, '_>, mem: &mut Mem<'_>, tag: WorkTag) -> Result<()> {
        let (es, dir) = (self.dtype.size(), tag.index);
        if tag.recv {
            self.deferred[dir] += 1;
        }
        while self.deferred[dir] > 0 && self.lanes.dir[dir].received < self.lanes.dir[dir].sent {
            let recv = WorkTag::recv(self.lanes.dir[dir].received % PIPELINE, dir);
            let (offset, elems) = self.lanes.next(dir, true);
            if elems > 0 {
                let (conn, buf) = self.lanes.place(mem, recv);
                let out = &mut mem.data[offset * es..(offset + elems) * es];
                let start = (self.in_recv[dir] + offset) * es;
                match mem.input {
                    Some(input) => out.copy_from_slice(&input[start..start + elems * es]),
                    None => unreachable!("a ring sum_scatter always has a separate input"),
                }
                let theirs = &cx.buffer(conn, buf)?[..elems * es];
                reduce_with(Semantics::Jaccl, ReduceOp::Sum, self.dtype, out, theirs);
            }
            self.deferred[dir] -= 1;
            self.lanes.repost(cx, mem, recv)?;
        }
        Ok(())
    }

    fn advance(&mut self) {
        let total = self.lanes.size * self.chunk;
        rotate(&mut self.in_send, self.chunk, total);
        rotate(&mut self.in_recv, self.chunk, total);
        self.deferred = [0; 2];
        self.lanes.done = self.lanes.next_step();
    }
}

/// One wire's stripe of a send to a neighbour, or of a receive from one.
pub(crate) struct Stripe {
    recv: bool,
    wire: usize,
    conn: usize,
    dir: usize,
    class: Class,
    s: usize,
    at: usize,
    limit: usize,
}

/// The stripes of a send of `len` bytes (`to_left`: to the left neighbour) or of a receive
/// (`from_right`: from the right neighbour), over all `wires` wires, into `out` (cleared
/// first).
pub(crate) fn stripes(
    (recv, towards_dir1): (bool, bool),
    wires: usize,
    classes: SizeClasses,
    len: usize,
    out: &mut Vec<Counted<Stripe>>,
) {
    let per_wire = len.div_ceil(wires);
    let class = classes.class_for(per_wire);
    let dir = usize::from(towards_dir1);
    out.clear();
    out.extend((0..wires).map(|w| {
        Counted::new(Stripe {
            recv,
            wire: w,
            conn: if recv {
                recv_conn(wires, w, dir)
            } else {
                send_conn(wires, w, dir)
            },
            dir,
            class,
            s: class.bytes(),
            at: (w * per_wire).min(len),
            limit: ((w + 1) * per_wire).min(len),
        })
    }));
}

impl Stripe {
    fn send_next(&mut self, cx: &mut Post<'_, '_>, mem: &Mem<'_>, slot: usize) -> Result<()> {
        let end = (self.at + self.s).min(self.limit);
        let buf = mem.plan.ring_send(self.class, slot, self.dir, self.wire);
        cx.fill(self.conn, buf, mem.input(self.at, end - self.at))?;
        cx.post_send(self.conn, buf, WorkTag::send(slot, self.dir))?;
        self.at += self.s;
        Ok(())
    }
}

impl Algorithm for Stripe {
    fn begin(&mut self, cx: &mut Post<'_, '_>, mem: &mut Mem<'_>) -> Result<()> {
        let mut slot = 0;
        if self.recv {
            while self.at + self.s * slot < self.limit && slot < PIPELINE {
                let buf = mem.plan.ring_recv(self.class, slot, self.dir, self.wire);
                cx.post_recv(self.conn, buf, WorkTag::recv(slot, self.dir))?;
                slot += 1;
            }
        } else {
            while self.at < self.limit && slot < PIPELINE {
                self.send_next(cx, mem, slot)?;
                slot += 1;
            }
        }
        Ok(())
    }

    fn completed(&mut self, cx: &mut Post<'_, '_>, mem: &mut Mem<'_>, done: Done) -> Result<()> {
        let tag = done.tag;
        if !self.recv {
            if self.at < self.limit {
                self.send_next(cx, mem, tag.slot)?;
            }
            return Ok(());
        }
        let len = self.limit.saturating_sub(self.at).min(self.s);
        let buf = mem
            .plan
            .ring_recv(self.class, tag.slot, self.dir, self.wire);
        mem.data[self.at..self.at + len].copy_from_slice(&cx.buffer(self.conn, buf)?[..len]);
        self.at += self.s;
        if self.at + (PIPELINE - 1) * self.s < self.limit {
            cx.post_recv(self.conn, buf, WorkTag::recv(tag.slot, self.dir))?;
        }
        Ok(())
    }

    fn owns(&self, conn: usize) -> bool {
        conn == self.conn
    }
}
