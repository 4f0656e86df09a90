//! The ring's data path as a state machine with no sockets, no poller and no clock.
//!
//! A collective is a handful of *lanes* (MLX's parallel sub-reduces, sub-gathers, or the
//! stripes of a send), each bound to one connection it writes to and one it reads from.
//! A lane walks the steps of its [`Pass`]: it hands out whatever bytes may go next, takes
//! in whatever bytes arrive, folds them into the array as soon as whole elements are in,
//! and never waits for a whole step. The one dependency it honours is MLX's: the segment
//! sent at step `t + 1` is the one received at step `t`, so a send may only run as far as
//! that receive has been completed (reduced or overwritten). Everything else is free to
//! overlap, which is what TCP's byte stream allows: MLX's peers cut the same bytes into
//! packets differently, and the wire cannot tell.
//!
//! # Driving a lane
//!
//! Whoever owns the connections (the engine over real sockets, `sim` over byte queues)
//! repeats, for every lane, until [`Lane::finished`]:
//!
//! 1. [`Lane::poll_transmit`] gives the bytes that may be written to [`Lane::tx`] now (or
//!    `None`); after writing `n` of them, call [`Lane::handle_sent`]`(n)` and poll again;
//! 2. [`Lane::poll_receive`] gives the memory the next bytes read from [`Lane::rx`] must
//!    land in (or `None`); after reading `n` bytes into it, call
//!    [`Lane::handle_received`]`(n)` and poll again;
//! 3. [`Lane::take_progress`] says whether anything moved since it was last asked (bytes,
//!    or steps that completed); if nothing did, the driver may wait for its connections,
//!    and [`Lane::waiting_on`] says which one the lane needs.
//!
//! Sending before receiving is the driver's choice (see `engine`); the protocol is correct
//! in any order. The `plan_*` functions build the lanes of each collective from the ring's
//! [`Topology`], so the real ring and the simulator run identical lanes.

use super::schedule::{self, Direction, Layout, Pass};
use super::staging::LaneStage;
use crate::comm::machine::{Machine, Receive, Transmit};
use crate::comm::neighbours::Neighbours;
use crate::element::DType;
use crate::error::PeerOp;
use crate::reduce::{ReduceOp, reduce_into};

/// What a lane computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Work {
    /// Reduce, then overwrite with the owner's result (all_sum, all_max, all_min).
    AllReduce(ReduceOp, DType),
    /// Overwrite only: every step forwards a block (all_gather).
    AllGather,
    /// Reduce only, into partial sums, ending with this rank's block (sum_scatter).
    ReduceScatter(ReduceOp, DType),
    /// One stripe of a `send`.
    Send,
    /// One stripe of a `recv`.
    Recv,
}

/// The memory a collective works on.
pub(crate) struct Buffers<'a> {
    /// Written by receives: the array (all-reduce), the output (all_gather, sum_scatter,
    /// recv). Also the source of sends for all-reduce and all_gather.
    pub(crate) data: &'a mut [u8],
    /// Read-only input: sum_scatter's input, send's data. Empty otherwise.
    pub(crate) input: &'a [u8],
}

/// Which connection index leads to which neighbour, as `Transport` numbers them:
/// connection `i` to the left neighbour is index `i`, connection `i` to the right one is
/// index `C + i`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Topology {
    /// This rank.
    pub(crate) rank: usize,
    /// Ranks in the ring (at least two).
    pub(crate) size: usize,
    /// Connections per neighbour (C).
    pub(crate) connections: usize,
}

impl Topology {
    /// The neighbours' ranks.
    pub(crate) fn neighbours(&self) -> Neighbours {
        Neighbours::new(self.rank, self.size)
    }

    /// Index of connection `i` to the left neighbour.
    pub(crate) fn left(&self, i: usize) -> usize {
        i
    }

    /// Index of connection `i` to the right neighbour.
    pub(crate) fn right(&self, i: usize) -> usize {
        self.connections + i
    }

    /// The rank at the other end of connection `index`.
    pub(crate) fn peer(&self, index: usize) -> usize {
        if index < self.connections {
            self.neighbours().left()
        } else {
            self.neighbours().right()
        }
    }

    /// The connections a lane on connection pair `pair` writes to and reads from.
    fn lane_conns(&self, pair: usize, direction: Direction) -> (usize, usize) {
        match direction {
            Direction::Left => (self.left(pair), self.right(pair)),
            Direction::Right => (self.right(pair), self.left(pair)),
        }
    }

    /// The first connection of a `send` to `dst`, if it is a neighbour. MLX checks the
    /// right neighbour first, so with two ranks a send goes out on the connections this
    /// rank opened and arrives on the peer's accepted ones.
    pub(crate) fn send_first(&self, dst: usize) -> Option<usize> {
        if dst == self.neighbours().right() {
            Some(self.right(0))
        } else if dst == self.neighbours().left() {
            Some(self.left(0))
        } else {
            None
        }
    }

    /// The first connection of a `recv` from `src`: the mirror of [`Topology::send_first`].
    pub(crate) fn recv_first(&self, src: usize) -> Option<usize> {
        if src == self.neighbours().left() {
            Some(self.left(0))
        } else if src == self.neighbours().right() {
            Some(self.right(0))
        } else {
            None
        }
    }

    fn ring_lane(&self, work: Work, pass: Pass, layout: Layout, i: usize) -> Lane {
        let (pair, direction) = schedule::route(i);
        let (tx, rx) = self.lane_conns(pair, direction);
        Lane::new(work, pass, layout, (tx, self.peer(tx)), (rx, self.peer(rx)))
    }
}

/// Replaces `lanes` with those of an MLX all-reduce of `elems` elements of `dtype`.
///
/// Fewer elements than ranks are MLX's small-array case: the caller pads them with zeros
/// to exactly one element per rank (`size` elements), and one lane reduces those on
/// connection pair 0 in direction `Right`.
pub(crate) fn plan_all_reduce(
    lanes: &mut Vec<Lane>,
    topo: &Topology,
    op: ReduceOp,
    dtype: DType,
    elems: usize,
) {
    let esize = dtype.size();
    let work = Work::AllReduce(op, dtype);
    lanes.clear();
    if elems < topo.size {
        let pass = Pass::all_reduce(topo.rank, topo.size, Direction::Right);
        let layout = Layout::split(0, topo.size, esize, topo.size);
        // Sub-operation 1 is pair 0, direction Right.
        lanes.push(topo.ring_lane(work, pass, layout, 1));
        return;
    }
    let splits = schedule::reduce_splits(elems * esize, topo.size, topo.connections);
    for i in 0..splits {
        let part = schedule::part(elems, splits, i);
        let direction = schedule::route(i).1;
        let layout = Layout::split(part.start * esize, part.len(), esize, topo.size);
        let pass = Pass::all_reduce(topo.rank, topo.size, direction);
        lanes.push(topo.ring_lane(work, pass, layout, i));
    }
}

/// Replaces `lanes` with those of an all-gather of `nbytes` bytes per rank.
pub(crate) fn plan_all_gather(lanes: &mut Vec<Lane>, topo: &Topology, nbytes: usize) {
    let splits = schedule::gather_splits(nbytes, topo.connections);
    lanes.clear();
    for i in 0..splits {
        let part = schedule::part(nbytes, splits, i);
        let layout = Layout::Strided {
            offset: part.start,
            len: part.len(),
            stride: nbytes,
        };
        let pass = Pass::all_gather(topo.rank, topo.size, schedule::route(i).1);
        lanes.push(topo.ring_lane(Work::AllGather, pass, layout, i));
    }
}

/// Replaces `lanes` with those of a sum_scatter of `chunk` bytes per rank (whole elements
/// of `dtype`), and returns the largest piece a lane's partial sums must hold.
pub(crate) fn plan_sum_scatter(
    lanes: &mut Vec<Lane>,
    topo: &Topology,
    dtype: DType,
    chunk: usize,
) -> usize {
    let esize = dtype.size();
    let elems = chunk / esize;
    let splits = schedule::reduce_splits(chunk * topo.size, topo.size, topo.connections);
    lanes.clear();
    let mut largest = 0;
    for i in 0..splits {
        let part = schedule::part(elems, splits, i);
        let layout = Layout::Strided {
            offset: part.start * esize,
            len: part.len() * esize,
            stride: chunk,
        };
        largest = largest.max(part.len() * esize);
        let pass = Pass::reduce_scatter(topo.rank, topo.size, schedule::route(i).1);
        let work = Work::ReduceScatter(ReduceOp::Sum, dtype);
        lanes.push(topo.ring_lane(work, pass, layout, i));
    }
    largest
}

/// Replaces `lanes` with MLX's striping of a `send` or `recv` of `len` bytes over the C
/// connections starting at `first`.
pub(crate) fn plan_stripes(
    lanes: &mut Vec<Lane>,
    topo: &Topology,
    work: Work,
    first: usize,
    len: usize,
) {
    lanes.clear();
    push_stripes(lanes, topo, work, first, len);
}

/// Appends `work` on `len` bytes striped over the connections starting at `first`.
fn push_stripes(lanes: &mut Vec<Lane>, topo: &Topology, work: Work, first: usize, len: usize) {
    for i in 0..topo.connections {
        let range = schedule::stripe(len, topo.connections, i);
        if range.is_empty() {
            break;
        }
        let conn = first + i;
        lanes.push(Lane::point(
            work,
            (conn, topo.peer(conn)),
            range.start,
            range.len(),
        ));
    }
}

/// Replaces `lanes` with a send of `send` bytes to the right neighbour and, at the same
/// time, a receive of `recv` bytes from the left one, each striped over the C connections
/// as MLX's `send`/`recv` are: one step of this crate's ring broadcast and all_to_all
/// (nuvec ranks only). Both sides run at once, so a ring of ranks that all send and all
/// receive cannot wait on each other's socket buffers.
pub(crate) fn plan_shift(lanes: &mut Vec<Lane>, topo: &Topology, send: usize, recv: usize) {
    lanes.clear();
    push_stripes(lanes, topo, Work::Send, topo.right(0), send);
    push_stripes(lanes, topo, Work::Recv, topo.left(0), recv);
}

/// One lane's progress through its pass.
#[derive(Clone, Debug)]
pub(crate) struct Lane {
    work: Work,
    pass: Pass,
    layout: Layout,
    /// The connection this lane writes to, and the rank at its other end.
    tx: usize,
    tx_peer: usize,
    /// The connection this lane reads from, and the rank at its other end.
    rx: usize,
    rx_peer: usize,
    /// The step being sent and how many of its bytes are gone.
    tx_step: usize,
    tx_off: usize,
    /// The step being received, how many of its bytes arrived, and how many are final
    /// (folded in, or written in place) and so may be forwarded.
    rx_step: usize,
    rx_off: usize,
    rx_done: usize,
    /// Received bytes of a partial element waiting at the start of the staging buffer.
    fill: usize,
    /// Whether a sum_scatter step's partial sum holds this rank's input yet.
    primed: bool,
    /// Whether bytes moved or steps completed since [`Lane::take_progress`] last asked.
    progress: bool,
}

impl Lane {
    /// A ring lane: sends on connection `tx`, receives on `rx` (each with its peer rank).
    fn new(
        work: Work,
        pass: Pass,
        layout: Layout,
        (tx, tx_peer): (usize, usize),
        (rx, rx_peer): (usize, usize),
    ) -> Lane {
        Lane {
            work,
            pass,
            layout,
            tx,
            tx_peer,
            rx,
            rx_peer,
            tx_step: 0,
            tx_off: 0,
            rx_step: 0,
            rx_off: 0,
            rx_done: 0,
            fill: 0,
            primed: false,
            progress: false,
        }
    }

    /// A point-to-point lane moving `len` bytes at `offset` over connection `conn`.
    fn point(work: Work, conn: (usize, usize), offset: usize, len: usize) -> Lane {
        let pass = Pass {
            rank: 0,
            size: 1,
            direction: Direction::Left,
            shift: 0,
            steps: 1,
            reduce_steps: 0,
        };
        let layout = Layout::Strided {
            offset,
            len,
            stride: 0,
        };
        let mut lane = Lane::new(work, pass, layout, conn, conn);
        match work {
            Work::Send => lane.rx_step = 1,
            _ => lane.tx_step = 1,
        }
        lane
    }

    /// The connection this lane writes to.
    pub(crate) fn tx(&self) -> usize {
        self.tx
    }

    /// The connection this lane reads from.
    pub(crate) fn rx(&self) -> usize {
        self.rx
    }

    /// Whether every step was sent and received.
    pub(crate) fn finished(&self) -> bool {
        self.tx_step == self.pass.steps && self.rx_step == self.pass.steps
    }

    /// The connection and operation this lane is waiting on, if it is not finished.
    pub(crate) fn waiting_on(&self) -> Option<(usize, PeerOp)> {
        if self.rx_step < self.pass.steps {
            Some((self.rx, PeerOp::Receive))
        } else if self.tx_step < self.pass.steps {
            Some((self.tx, PeerOp::Send))
        } else {
            None
        }
    }

    /// Whether bytes moved or steps completed since the last call.
    pub(crate) fn take_progress(&mut self) -> bool {
        std::mem::take(&mut self.progress)
    }

    /// The bytes that may be written to [`Lane::tx`] now, or `None` if none may go yet
    /// (or the lane has sent everything). Completes the steps whose bytes are all gone.
    pub(crate) fn poll_transmit<'b>(
        &mut self,
        bufs: &'b Buffers<'_>,
        stage: &'b LaneStage,
    ) -> Option<&'b [u8]> {
        while self.tx_step < self.pass.steps {
            let t = self.tx_step;
            let seg = self.layout.segment(self.pass.send_segment(t));
            let len = seg.len();
            if self.tx_off == len {
                ffi::probes::send_step(self.tx_peer as u64, t as u64, len as u64);
                self.tx_step += 1;
                self.tx_off = 0;
                self.progress = true;
                continue;
            }
            // Step t forwards what step t - 1 received: only its final bytes may go.
            let ready = if t == 0 || self.rx_step >= t {
                len
            } else if self.rx_step + 1 == t {
                self.rx_done
            } else {
                0
            };
            if ready <= self.tx_off {
                return None;
            }
            let source: &[u8] = match self.work {
                Work::ReduceScatter(..) if t > 0 => {
                    let (even, odd) = stage.partials(len);
                    if (t - 1).is_multiple_of(2) { even } else { odd }
                }
                Work::ReduceScatter(..) | Work::Send => &bufs.input[seg],
                Work::AllReduce(..) | Work::AllGather | Work::Recv => &bufs.data[seg],
            };
            return Some(&source[self.tx_off..ready]);
        }
        None
    }

    /// Records that the first `n` bytes [`Lane::poll_transmit`] gave were written.
    pub(crate) fn handle_sent(&mut self, n: usize) {
        self.tx_off += n;
        self.progress = true;
    }

    /// Where the next bytes read from [`Lane::rx`] must land, or `None` if the lane may not
    /// receive now (or has received everything). Completes the steps whose bytes are all
    /// final. Never empty.
    pub(crate) fn poll_receive<'b>(
        &mut self,
        bufs: &'b mut Buffers<'_>,
        stage: &'b mut LaneStage,
    ) -> Option<&'b mut [u8]> {
        while self.rx_step < self.pass.steps {
            let t = self.rx_step;
            let seg = self.layout.segment(self.pass.recv_segment(t));
            let len = seg.len();
            if self.rx_done == len {
                ffi::probes::recv_step(self.rx_peer as u64, t as u64, len as u64);
                self.rx_step += 1;
                self.rx_off = 0;
                self.rx_done = 0;
                self.primed = false;
                self.progress = true;
                continue;
            }
            return match self.work {
                Work::AllReduce(..) if self.pass.reduces(t) => {
                    let want = (len - self.rx_off).min(stage.recv.len() - self.fill);
                    Some(&mut stage.recv[self.fill..self.fill + want])
                }
                Work::ReduceScatter(..) => {
                    let last = t + 1 == self.pass.steps;
                    // Step t's partial sum reuses the buffer step t - 2 filled; step t - 1
                    // forwarded it, and must have finished doing so.
                    if !last && t >= 2 && self.tx_step < t {
                        return None;
                    }
                    let piece = self.layout.piece();
                    let (recv, target) = scatter_target(stage, &mut bufs.data[piece], t, last);
                    if !self.primed {
                        target.copy_from_slice(&bufs.input[seg]);
                        self.primed = true;
                    }
                    let want = (len - self.rx_off).min(recv.len() - self.fill);
                    Some(&mut recv[self.fill..self.fill + want])
                }
                Work::AllReduce(..) | Work::AllGather | Work::Recv | Work::Send => {
                    Some(&mut bufs.data[seg][self.rx_off..])
                }
            };
        }
        None
    }

    /// Records that `n` bytes were read into what [`Lane::poll_receive`] gave, folding
    /// every whole element that is now in and keeping a trailing partial element.
    pub(crate) fn handle_received(
        &mut self,
        bufs: &mut Buffers<'_>,
        stage: &mut LaneStage,
        n: usize,
    ) {
        self.rx_off += n;
        self.progress = true;
        let t = self.rx_step;
        let (op, dtype, recv, target) = match self.work {
            Work::AllReduce(op, dtype) if self.pass.reduces(t) => {
                let seg = self.layout.segment(self.pass.recv_segment(t));
                (op, dtype, &mut stage.recv[..], &mut bufs.data[seg])
            }
            Work::ReduceScatter(op, dtype) => {
                let last = t + 1 == self.pass.steps;
                let piece = self.layout.piece();
                let (recv, target) = scatter_target(stage, &mut bufs.data[piece], t, last);
                (op, dtype, recv, target)
            }
            Work::AllReduce(..) | Work::AllGather | Work::Recv | Work::Send => {
                self.rx_done = self.rx_off;
                return;
            }
        };
        self.fill += n;
        let whole = self.fill / dtype.size() * dtype.size();
        reduce_into(
            op,
            dtype,
            &mut target[self.rx_done..self.rx_done + whole],
            &recv[..whole],
        );
        self.rx_done += whole;
        recv.copy_within(whole..self.fill, 0);
        self.fill -= whole;
    }
}

/// The lanes of one collective with the memory they work on: the
/// [`Machine`](crate::comm::machine::Machine) an engine drives. Lane `i` is send queue `i`
/// and receive queue `i`; `stages[i]` is its staging.
pub(crate) struct Lanes<'a, 'b> {
    pub(crate) lanes: &'a mut [Lane],
    pub(crate) bufs: &'a mut Buffers<'b>,
    pub(crate) stages: &'a mut [LaneStage],
}

impl Machine for Lanes<'_, '_> {
    fn transmits(&self) -> usize {
        self.lanes.len()
    }

    fn receives(&self) -> usize {
        self.lanes.len()
    }

    fn poll_transmit(&mut self, i: usize) -> Option<Transmit<'_>> {
        let lane = &mut self.lanes[i];
        let link = lane.tx();
        let body = lane.poll_transmit(self.bufs, &self.stages[i])?;
        Some(Transmit {
            link,
            head: &[],
            body,
        })
    }

    fn handle_sent(&mut self, i: usize, n: usize) {
        self.lanes[i].handle_sent(n);
    }

    fn poll_receive(&mut self, i: usize) -> Option<Receive<'_>> {
        let lane = &mut self.lanes[i];
        let link = lane.rx();
        let buf = lane.poll_receive(self.bufs, &mut self.stages[i])?;
        Some(Receive { link, buf })
    }

    fn handle_received(&mut self, i: usize, n: usize) -> crate::error::Result<()> {
        self.lanes[i].handle_received(self.bufs, &mut self.stages[i], n);
        Ok(())
    }

    fn poll_wait(&self, into: &mut Vec<(usize, PeerOp)>) {
        into.extend(self.lanes.iter().filter_map(Lane::waiting_on));
    }

    fn is_finished(&self) -> bool {
        self.lanes.iter().all(Lane::finished)
    }

    fn take_progress(&mut self) -> bool {
        // Every lane's flag is taken, not only the first one set.
        self.lanes
            .iter_mut()
            .fold(false, |any, lane| lane.take_progress() | any)
    }
}

/// The staging receive buffer and the partial sum step `t` of a sum_scatter folds into:
/// the caller's output for the last step, else the even or odd partial buffer.
fn scatter_target<'b>(
    stage: &'b mut LaneStage,
    output: &'b mut [u8],
    t: usize,
    last: bool,
) -> (&'b mut [u8], &'b mut [u8]) {
    let len = output.len();
    let (recv, even, odd) = stage.split(len);
    let target = if last {
        output
    } else if t.is_multiple_of(2) {
        even
    } else {
        odd
    };
    (recv, target)
}

#[cfg(test)]
mod tests {
    use super::super::staging::Staging;
    use super::*;

    fn topo(rank: usize, size: usize) -> Topology {
        Topology {
            rank,
            size,
            connections: 1,
        }
    }

    fn u32s(v: &[u32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn a_two_rank_all_sum_sends_reduces_forwards_and_overwrites() {
        // Rank 0 of 2, 4 elements: segments of 8 bytes; direction Left sends segment 0 on
        // connection 0 (left), receives segment 1 on connection 1 (right), then forwards the
        // reduced segment 1 and overwrites segment 0 with the peer's result.
        let mut lanes = Vec::new();
        plan_all_reduce(&mut lanes, &topo(0, 2), ReduceOp::Sum, DType::U32, 4);
        let [lane] = &mut lanes[..] else {
            panic!("one lane below the split threshold")
        };
        assert_eq!((lane.tx(), lane.rx()), (0, 1));
        let mut stages = Staging::for_tests(1, 64);
        let stage = &mut stages.lanes[0];
        let mut data = u32s(&[1, 2, 3, 4]);
        let mut bufs = Buffers {
            data: &mut data,
            input: &[],
        };
        assert_eq!(lane.poll_transmit(&bufs, stage), Some(&u32s(&[1, 2])[..]));
        lane.handle_sent(8);
        // Step 1 forwards what step 0 receives: nothing of it is in yet.
        assert_eq!(lane.poll_transmit(&bufs, stage), None);
        assert_eq!(lane.waiting_on(), Some((1, PeerOp::Receive)));
        let target = lane.poll_receive(&mut bufs, stage).unwrap();
        assert_eq!(target.len(), 8);
        target.copy_from_slice(&u32s(&[30, 40]));
        lane.handle_received(&mut bufs, stage, 8);
        assert!(lane.take_progress());
        assert_eq!(lane.poll_transmit(&bufs, stage), Some(&u32s(&[33, 44])[..]));
        lane.handle_sent(8);
        // The overwriting step lands in the caller's array.
        let target = lane.poll_receive(&mut bufs, stage).unwrap();
        assert_eq!(target.len(), 8);
        target.copy_from_slice(&u32s(&[11, 22]));
        lane.handle_received(&mut bufs, stage, 8);
        assert_eq!(lane.poll_transmit(&bufs, stage), None);
        assert!(lane.poll_receive(&mut bufs, stage).is_none());
        assert!(lane.finished());
        assert_eq!(lane.waiting_on(), None);
        assert_eq!(data, u32s(&[11, 22, 33, 44]));
    }

    #[test]
    fn a_partial_element_waits_in_staging_and_only_folded_bytes_are_forwarded() {
        let mut lanes = Vec::new();
        plan_all_reduce(&mut lanes, &topo(0, 2), ReduceOp::Sum, DType::U32, 4);
        let lane = &mut lanes[0];
        // A receive buffer of 5 bytes: reads are cut short of a segment and of elements.
        let mut stages = Staging::for_tests(1, 5);
        let stage = &mut stages.lanes[0];
        let mut data = u32s(&[1, 2, 3, 4]);
        let mut bufs = Buffers {
            data: &mut data,
            input: &[],
        };
        let first = lane.poll_transmit(&bufs, stage).unwrap().len();
        lane.handle_sent(first);
        let incoming = u32s(&[0x0101_0101, 0x0202_0202]);
        let target = lane.poll_receive(&mut bufs, stage).unwrap();
        assert_eq!(target.len(), 5);
        target[..3].copy_from_slice(&incoming[..3]);
        lane.handle_received(&mut bufs, stage, 3);
        // Three bytes are no element: nothing is final, so nothing may be forwarded.
        assert_eq!(lane.poll_transmit(&bufs, stage), None);
        let target = lane.poll_receive(&mut bufs, stage).unwrap();
        assert_eq!(
            target.len(),
            2,
            "the carried bytes keep their place in staging"
        );
        target.copy_from_slice(&incoming[3..5]);
        lane.handle_received(&mut bufs, stage, 2);
        // One whole element is folded and may go; the fifth byte waits at staging's start.
        assert_eq!(
            lane.poll_transmit(&bufs, stage),
            Some(&u32s(&[0x0101_0104])[..])
        );
        lane.handle_sent(4);
        assert_eq!(lane.poll_transmit(&bufs, stage), None);
        let target = lane.poll_receive(&mut bufs, stage).unwrap();
        assert_eq!(target.len(), 3);
        target.copy_from_slice(&incoming[5..]);
        lane.handle_received(&mut bufs, stage, 3);
        assert_eq!(
            lane.poll_transmit(&bufs, stage),
            Some(&u32s(&[0x0202_0206])[..])
        );
    }

    #[test]
    fn a_gather_forwards_exactly_the_bytes_that_arrived() {
        // Rank 0 of 3, 4 bytes per rank: step 1 forwards the block step 0 receives.
        let mut lanes = Vec::new();
        plan_all_gather(&mut lanes, &topo(0, 3), 4);
        let lane = &mut lanes[0];
        let mut stages = Staging::for_tests(1, 8);
        let stage = &mut stages.lanes[0];
        let mut data = vec![7, 7, 7, 7, 0, 0, 0, 0, 0, 0, 0, 0];
        let mut bufs = Buffers {
            data: &mut data,
            input: &[],
        };
        assert_eq!(lane.poll_transmit(&bufs, stage), Some(&[7u8, 7, 7, 7][..]));
        lane.handle_sent(4);
        assert_eq!(lane.poll_transmit(&bufs, stage), None);
        // Direction Left: rank 0 receives block 1 from its right neighbour.
        let target = lane.poll_receive(&mut bufs, stage).unwrap();
        assert_eq!(target.len(), 4);
        target[..3].copy_from_slice(&[1, 2, 3]);
        lane.handle_received(&mut bufs, stage, 3);
        assert_eq!(lane.poll_transmit(&bufs, stage), Some(&[1u8, 2, 3][..]));
        lane.handle_sent(2);
        assert_eq!(lane.poll_transmit(&bufs, stage), Some(&[3u8][..]));
    }

    #[test]
    fn stripes_follow_the_neighbour_and_skip_empty_pieces() {
        let two = Topology {
            rank: 1,
            size: 3,
            connections: 2,
        };
        assert_eq!((two.send_first(2), two.send_first(0)), (Some(2), Some(0)));
        assert_eq!((two.recv_first(0), two.recv_first(2)), (Some(0), Some(2)));
        assert_eq!(two.send_first(1), None);
        let mut lanes = Vec::new();
        plan_stripes(&mut lanes, &two, Work::Send, 2, 5000);
        let conns: Vec<_> = lanes.iter().map(|l| (l.tx(), l.tx_peer)).collect();
        assert_eq!(conns, [(2, 2), (3, 2)]);
        plan_stripes(&mut lanes, &two, Work::Recv, 0, 1000);
        assert_eq!(lanes.len(), 1, "one piece of at least 1024 bytes");
        assert_eq!((lanes[0].rx(), lanes[0].rx_peer), (0, 0));
    }
}
