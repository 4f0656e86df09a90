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

/// One wire of MLX's `ring_pass`-based collectives (all-reduce, all_gather).
pub(crate) struct Wire {
    size: usize,
    wire: usize,
    /// Wires per neighbour in the group (connection numbering), not only the active ones.
    wires: usize,
    dirs: usize,
    es: usize,
    passes: [Option<Pass>; 2],
    pass: usize,
    /// The array's length in elements (the limit of every window).
    len: usize,
    stride: usize,
    total: usize,
    class: Class,
    n: usize,
    n_steps: usize,
    wire_offset: [usize; 2],
    wire_end: [usize; 2],
    send_offset: [usize; 2],
    recv_offset: [usize; 2],
    send_limit: [usize; 2],
    recv_limit: [usize; 2],
    send_count: [usize; 2],
    recv_count: [usize; 2],
    step: usize,
    done: bool,
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
    let n = class.bytes() / es;
    out.clear();
    out.extend((0..active).map(|w| {
        let mut wire_offset = [0; 2];
        let mut wire_end = [0; 2];
        for d in 0..dirs {
            wire_offset[d] = d * active * spw + w * spw;
            let region_end = chunk.min((d + 1) * active * spw);
            wire_end[d] = region_end.min(wire_offset[d] + spw);
        }
        Counted::new(Wire {
            size,
            wire: w,
            wires,
            dirs,
            es,
            passes: [Some(Pass::Reduce(op, dtype)), Some(Pass::Copy)],
            pass: 0,
            len: count,
            stride: chunk,
            total: size * chunk,
            class,
            n,
            n_steps: spw.div_ceil(n),
            wire_offset,
            wire_end,
            send_offset: [rank * chunk; 2],
            recv_offset: [(rank + size - 1) % size * chunk, (rank + 1) % size * chunk],
            send_limit: [0; 2],
            recv_limit: [0; 2],
            send_count: [0; 2],
            recv_count: [0; 2],
            step: 0,
            done: false,
        })
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
    let n = class.bytes();
    out.clear();
    out.extend((0..wires).map(|w| {
        let mut wire_offset = [0; 2];
        let mut wire_end = [0; 2];
        for d in 0..2 {
            wire_offset[d] = d * wires * npw + w * npw;
            wire_end[d] = block.min(wire_offset[d] + npw);
        }
        Counted::new(Wire {
            size,
            wire: w,
            wires,
            dirs: 2,
            es: 1,
            passes: [Some(Pass::Copy), None],
            pass: 0,
            len: size * block,
            stride: block,
            total: size * block,
            class,
            n,
            n_steps: npw.div_ceil(n),
            wire_offset,
            wire_end,
            send_offset: [rank * block; 2],
            recv_offset: [(rank + size - 1) % size * block, (rank + 1) % size * block],
            send_limit: [0; 2],
            recv_limit: [0; 2],
            send_count: [0; 2],
            recv_count: [0; 2],
            step: 0,
            done: false,
        })
    }));
}

impl Wire {
    fn set_limits(&mut self) {
        for d in 0..self.dirs {
            self.send_limit[d] = self.wire_end[d].min(self.len.saturating_sub(self.send_offset[d]));
            self.recv_limit[d] = self.wire_end[d].min(self.len.saturating_sub(self.recv_offset[d]));
        }
    }

    /// Stages the next message of direction `dir` into slot `slot` and posts it.
    fn send_next(
        &mut self,
        cx: &mut Post<'_, '_>,
        mem: &Mem<'_>,
        dir: usize,
        slot: usize,
    ) -> Result<()> {
        let es = self.es;
        let offset = self.wire_offset[dir] + self.send_count[dir] * self.n;
        let elems = self.send_limit[dir].saturating_sub(offset).min(self.n);
        let conn = send_conn(self.wires, self.wire, dir);
        let buf = mem.plan.ring_send(self.class, slot, dir, self.wire);
        if elems > 0 {
            let start = (self.send_offset[dir] + offset) * es;
            cx.fill(conn, buf, &mem.data[start..start + elems * es])?;
        }
        self.send_count[dir] += 1;
        cx.post_send(conn, buf, WorkTag::send(slot, dir))
    }

    fn begin_step(&mut self, cx: &mut Post<'_, '_>, mem: &Mem<'_>) -> Result<()> {
        let mut slot = 0;
        while slot < self.n_steps && slot < PIPELINE {
            for d in 0..self.dirs {
                let buf = mem.plan.ring_recv(self.class, slot, d, self.wire);
                cx.post_recv(
                    recv_conn(self.wires, self.wire, d),
                    buf,
                    WorkTag::recv(slot, d),
                )?;
            }
            for d in 0..self.dirs {
                self.send_next(cx, mem, d, slot)?;
            }
            slot += 1;
        }
        Ok(())
    }

    /// Moves past steps whose messages are all done, starting the next ones.
    fn settle(&mut self, cx: &mut Post<'_, '_>, mem: &Mem<'_>) -> Result<()> {
        while cx.idle() && !self.done {
            // Rotate the windows: direction 0 backwards, direction 1 forwards.
            let (total, stride) = (self.total, self.stride);
            if total > 0 {
                self.send_offset[0] = (self.send_offset[0] + total - stride) % total;
                self.recv_offset[0] = (self.recv_offset[0] + total - stride) % total;
                if self.dirs == 2 {
                    self.send_offset[1] = (self.send_offset[1] + stride) % total;
                    self.recv_offset[1] = (self.recv_offset[1] + stride) % total;
                }
            }
            self.set_limits();
            self.send_count = [0; 2];
            self.recv_count = [0; 2];
            self.step += 1;
            if self.step == self.size - 1 {
                self.step = 0;
                self.pass += 1;
                if self.pass == 2 || self.passes[self.pass].is_none() {
                    self.done = true;
                    return Ok(());
                }
            }
            self.begin_step(cx, mem)?;
        }
        Ok(())
    }
}

impl Algorithm for Wire {
    fn begin(&mut self, cx: &mut Post<'_, '_>, mem: &mut Mem<'_>) -> Result<()> {
        self.set_limits();
        self.begin_step(cx, mem)?;
        self.settle(cx, mem)
    }

    fn completed(&mut self, cx: &mut Post<'_, '_>, mem: &mut Mem<'_>, done: Done) -> Result<()> {
        let Done { conn, tag } = done;
        let d = tag.index;
        if !tag.recv {
            if self.send_count[d] < self.n_steps {
                self.send_next(cx, mem, d, tag.slot)?;
            }
        } else {
            let es = self.es;
            let offset = self.wire_offset[d] + self.recv_count[d] * self.n;
            let elems = self.recv_limit[d].saturating_sub(offset).min(self.n);
            let buf = mem.plan.ring_recv(self.class, tag.slot, d, self.wire);
            if elems > 0 {
                let start = (self.recv_offset[d] + offset) * es;
                let out = &mut mem.data[start..start + elems * es];
                let theirs = &cx.buffer(conn, buf)?[..elems * es];
                match self.passes[self.pass] {
                    Some(Pass::Reduce(op, dtype)) => {
                        reduce_with(Semantics::Jaccl, op, dtype, out, theirs)
                    }
                    _ => out.copy_from_slice(theirs),
                }
            }
            self.recv_count[d] += 1;
            // Repost the slot for the message PIPELINE - 1 after the next, if there is one.
            if self.recv_count[d] + PIPELINE - 1 < self.n_steps {
                cx.post_recv(conn, buf, WorkTag::recv(tag.slot, d))?;
            }
        }
        self.settle(cx, mem)
    }

    fn done(&self) -> bool {
        self.done
    }

    fn owns(&self, conn: usize) -> bool {
        conn == left(self.wire) || conn == right(self.wires, self.wire)
    }
}

/// One wire of MLX's ring sum_scatter (`reduce_scatter_wire`).
pub(crate) struct ScatterWire {
    size: usize,
    wire: usize,
    wires: usize,
    dtype: DType,
    chunk: usize,
    total: usize,
    class: Class,
    n: usize,
    n_steps: usize,
    wire_offset: [usize; 2],
    wire_end: [usize; 2],
    in_send: [usize; 2],
    in_recv: [usize; 2],
    send_count: [usize; 2],
    recv_count: [usize; 2],
    deferred: [usize; 2],
    step: usize,
    done: bool,
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
    let n = class.bytes() / es;
    out.clear();
    out.extend((0..active).map(|w| {
        let mut wire_offset = [0; 2];
        let mut wire_end = [0; 2];
        for d in 0..2 {
            wire_offset[d] = d * active * spw + w * spw;
            let region_end = chunk.min((d + 1) * active * spw);
            wire_end[d] = region_end.min(wire_offset[d] + spw);
        }
        Counted::new(ScatterWire {
            size,
            wire: w,
            wires,
            dtype,
            chunk,
            total,
            class,
            n,
            n_steps: spw.div_ceil(n),
            wire_offset,
            wire_end,
            in_send: [(rank + size - 1) % size * chunk, (rank + 1) % size * chunk],
            in_recv: [
                (rank + 2 * size - 2) % size * chunk,
                (rank + 2) % size * chunk,
            ],
            send_count: [0; 2],
            recv_count: [0; 2],
            deferred: [0; 2],
            step: 0,
            done: false,
        })
    }));
}

impl ScatterWire {
    fn slice(&self, dir: usize, index: usize) -> (usize, usize) {
        let offset = self.wire_offset[dir] + index * self.n;
        (
            offset,
            self.wire_end[dir].saturating_sub(offset).min(self.n),
        )
    }

    /// Stages the next partial of direction `dir` (this rank's input at step 0, the output's
    /// partial later) into slot `slot` and posts it.
    fn send_next(
        &mut self,
        cx: &mut Post<'_, '_>,
        mem: &Mem<'_>,
        dir: usize,
        slot: usize,
    ) -> Result<()> {
        let es = self.dtype.size();
        let (offset, elems) = self.slice(dir, self.send_count[dir]);
        let conn = send_conn(self.wires, self.wire, dir);
        let buf = mem.plan.ring_send(self.class, slot, dir, self.wire);
        if elems > 0 {
            let bytes = if self.step == 0 {
                mem.input((self.in_send[dir] + offset) * es, elems * es)
            } else {
                &mem.data[offset * es..(offset + elems) * es]
            };
            cx.fill(conn, buf, bytes)?;
        }
        self.send_count[dir] += 1;
        cx.post_send(conn, buf, WorkTag::send(slot, dir))
    }

    /// Applies received slices whose send counterpart has been staged.
    fn drain(&mut self, cx: &mut Post<'_, '_>, mem: &mut Mem<'_>, dir: usize) -> Result<()> {
        let es = self.dtype.size();
        while self.deferred[dir] > 0 && self.recv_count[dir] < self.send_count[dir] {
            let slice = self.recv_count[dir];
            let slot = slice % PIPELINE;
            let (offset, elems) = self.slice(dir, slice);
            let conn = recv_conn(self.wires, self.wire, dir);
            let buf = mem.plan.ring_recv(self.class, slot, dir, self.wire);
            if elems > 0 {
                let input = mem.input;
                let out = &mut mem.data[offset * es..(offset + elems) * es];
                let start = (self.in_recv[dir] + offset) * es;
                match input {
                    Some(input) => out.copy_from_slice(&input[start..start + elems * es]),
                    None => unreachable!("a ring sum_scatter always has a separate input"),
                }
                reduce_with(
                    Semantics::Jaccl,
                    ReduceOp::Sum,
                    self.dtype,
                    out,
                    &cx.buffer(conn, buf)?[..elems * es],
                );
            }
            self.recv_count[dir] += 1;
            self.deferred[dir] -= 1;
            if self.recv_count[dir] + PIPELINE - 1 < self.n_steps {
                cx.post_recv(conn, buf, WorkTag::recv(slot, dir))?;
            }
        }
        Ok(())
    }

    fn begin_step(&mut self, cx: &mut Post<'_, '_>, mem: &Mem<'_>) -> Result<()> {
        let mut slot = 0;
        while slot < self.n_steps && slot < PIPELINE {
            for d in 0..2 {
                let buf = mem.plan.ring_recv(self.class, slot, d, self.wire);
                cx.post_recv(
                    recv_conn(self.wires, self.wire, d),
                    buf,
                    WorkTag::recv(slot, d),
                )?;
            }
            for d in 0..2 {
                self.send_next(cx, mem, d, slot)?;
            }
            slot += 1;
        }
        Ok(())
    }

    fn settle(&mut self, cx: &mut Post<'_, '_>, mem: &Mem<'_>) -> Result<()> {
        while cx.idle() && !self.done {
            let (total, c) = (self.total, self.chunk);
            if total > 0 {
                self.in_send[0] = (self.in_send[0] + total - c) % total;
                self.in_recv[0] = (self.in_recv[0] + total - c) % total;
                self.in_send[1] = (self.in_send[1] + c) % total;
                self.in_recv[1] = (self.in_recv[1] + c) % total;
            }
            self.send_count = [0; 2];
            self.recv_count = [0; 2];
            self.deferred = [0; 2];
            self.step += 1;
            if self.step == self.size - 1 {
                self.done = true;
                return Ok(());
            }
            self.begin_step(cx, mem)?;
        }
        Ok(())
    }
}

impl Algorithm for ScatterWire {
    fn begin(&mut self, cx: &mut Post<'_, '_>, mem: &mut Mem<'_>) -> Result<()> {
        self.begin_step(cx, mem)?;
        self.settle(cx, mem)
    }

    fn completed(&mut self, cx: &mut Post<'_, '_>, mem: &mut Mem<'_>, done: Done) -> Result<()> {
        let tag = done.tag;
        let d = tag.index;
        if !tag.recv {
            if self.send_count[d] < self.n_steps {
                self.send_next(cx, mem, d, tag.slot)?;
            }
        } else {
            self.deferred[d] += 1;
        }
        self.drain(cx, mem, d)?;
        self.settle(cx, mem)
    }

    fn done(&self) -> bool {
        self.done
    }

    fn owns(&self, conn: usize) -> bool {
        conn == left(self.wire) || conn == right(self.wires, self.wire)
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
