//! The ring's data path: lanes that stream MLX's schedule through the event loop.
//!
//! A collective is a handful of *lanes* (MLX's parallel sub-reduces, sub-gathers, or the
//! stripes of a send), each bound to one connection it writes to and one it reads from.
//! A lane is a state machine over the steps of its [`Pass`]: it moves whatever bytes the
//! sockets accept, folds received bytes into the array as soon as whole elements are in,
//! and never waits for a whole step. The one dependency it honours is MLX's: the segment
//! sent at step `t + 1` is the one received at step `t`, so a send may only run as far as
//! that receive has been completed (reduced or overwritten). Everything else is free to
//! overlap, which is what TCP's byte stream allows: MLX's peers cut the same bytes into
//! packets differently, and the wire cannot tell.
//!
//! When no lane can move, [`run`] waits on the poller; the deadline moves forward whenever
//! bytes move, so `timeout` bounds how long a peer may make no progress, not how long a
//! 64 MiB collective may take.

use std::time::{Duration, Instant};

use super::schedule::{Layout, Pass};
use super::staging::LaneStage;
use super::transport::{Conn, Transfer, Transport};
use crate::element::DType;
use crate::error::{Error, PeerOp, Result};
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

/// One lane's progress through its pass.
#[derive(Clone, Debug)]
pub(crate) struct Lane {
    work: Work,
    pass: Pass,
    layout: Layout,
    /// The connection this lane writes to.
    tx: usize,
    /// The connection this lane reads from.
    rx: usize,
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
}

impl Lane {
    /// A ring lane: sends on connection `tx`, receives on `rx`.
    pub(crate) fn ring(work: Work, pass: Pass, layout: Layout, tx: usize, rx: usize) -> Lane {
        Lane {
            work,
            pass,
            layout,
            tx,
            rx,
            tx_step: 0,
            tx_off: 0,
            rx_step: 0,
            rx_off: 0,
            rx_done: 0,
            fill: 0,
            primed: false,
        }
    }

    /// A point-to-point lane moving `len` bytes at `offset` over connection `conn`.
    pub(crate) fn point(work: Work, conn: usize, offset: usize, len: usize) -> Lane {
        let pass = Pass {
            rank: 0,
            size: 1,
            direction: super::schedule::Direction::Left,
            shift: 0,
            steps: 1,
            reduce_steps: 0,
        };
        let layout = Layout::Strided {
            offset,
            len,
            stride: 0,
        };
        let mut lane = Lane::ring(work, pass, layout, conn, conn);
        match work {
            Work::Send => lane.rx_step = 1,
            _ => lane.tx_step = 1,
        }
        lane
    }

    fn finished(&self) -> bool {
        self.tx_step == self.pass.steps && self.rx_step == self.pass.steps
    }

    /// The connection and operation this lane is waiting on, if it is not finished.
    fn waiting_on(&self) -> Option<(usize, PeerOp)> {
        if self.rx_step < self.pass.steps {
            Some((self.rx, PeerOp::Receive))
        } else if self.tx_step < self.pass.steps {
            Some((self.tx, PeerOp::Send))
        } else {
            None
        }
    }

    /// Moves as many bytes as the sockets take. Returns whether anything moved.
    fn pump(
        &mut self,
        transport: &mut Transport,
        bufs: &mut Buffers<'_>,
        stage: &mut LaneStage,
        context: &'static str,
    ) -> Result<bool> {
        let mut any = false;
        let mut refreshed = Instant::now();
        loop {
            // Send first: a step's send never waits on its own receive, and at the start
            // of a step the peer's bytes have rarely arrived yet, so reading first would
            // mostly cost a system call that finds nothing (measured: 5.70 -> 5.35 system
            // calls per 4 B all_sum with two ranks).
            let sent = self.pump_send(transport.conn(self.tx), bufs, stage, context)?;
            let received = self.pump_recv(transport.conn(self.rx), bufs, stage, context)?;
            if !(received || sent) {
                return Ok(any);
            }
            any = true;
            // A lane whose sockets keep accepting bytes never returns to the poller; look
            // at it now and then anyway, so that a connection that failed meanwhile is
            // seen while its failure notice is still readable.
            if refreshed.elapsed() >= REFRESH {
                transport
                    .refresh()
                    .map_err(|e| Error::local("polling the ring's sockets", e))?;
                refreshed = Instant::now();
            }
        }
    }

    fn pump_send(
        &mut self,
        conn: &mut Conn,
        bufs: &Buffers<'_>,
        stage: &mut LaneStage,
        context: &'static str,
    ) -> Result<bool> {
        let mut progressed = false;
        while self.tx_step < self.pass.steps {
            let t = self.tx_step;
            let seg = self.layout.segment(self.pass.send_segment(t));
            let len = seg.len();
            if self.tx_off == len {
                ffi::probes::send_step(conn.peer as u64, t as u64, len as u64);
                self.tx_step += 1;
                self.tx_off = 0;
                progressed = true;
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
                break;
            }
            let source: &[u8] = match self.work {
                Work::ReduceScatter(..) if t > 0 => {
                    let (even, odd) = stage
                        .partials(len)
                        .map_err(|e| conn.failed(PeerOp::Send, context, e))?;
                    if (t - 1).is_multiple_of(2) { even } else { odd }
                }
                Work::ReduceScatter(..) | Work::Send => &bufs.input[seg],
                Work::AllReduce(..) | Work::AllGather | Work::Recv => &bufs.data[seg],
            };
            match conn.write(&source[self.tx_off..ready]) {
                Ok(Transfer::Moved(n)) => {
                    self.tx_off += n;
                    progressed = true;
                }
                Ok(Transfer::Blocked) => break,
                Ok(Transfer::Closed) => return Err(conn.closed(PeerOp::Send, context)),
                Err(e) => return Err(conn.failed(PeerOp::Send, context, e)),
            }
        }
        Ok(progressed)
    }

    fn pump_recv(
        &mut self,
        conn: &mut Conn,
        bufs: &mut Buffers<'_>,
        stage: &mut LaneStage,
        context: &'static str,
    ) -> Result<bool> {
        let mut progressed = false;
        while self.rx_step < self.pass.steps {
            let t = self.rx_step;
            let seg = self.layout.segment(self.pass.recv_segment(t));
            let len = seg.len();
            if self.rx_done == len {
                ffi::probes::recv_step(conn.peer as u64, t as u64, len as u64);
                self.rx_step += 1;
                self.rx_off = 0;
                self.rx_done = 0;
                self.primed = false;
                progressed = true;
                continue;
            }
            let moved = match self.work {
                Work::AllReduce(op, dtype) if self.pass.reduces(t) => {
                    let LaneStage { recv, .. } = stage;
                    self.fold(conn, &mut bufs.data[seg], recv, op, dtype, context)?
                }
                Work::ReduceScatter(op, dtype) => {
                    let last = t + 1 == self.pass.steps;
                    // Step t's partial sum reuses the buffer step t - 2 filled; step t - 1
                    // forwarded it, and must have finished doing so.
                    if !last && t >= 2 && self.tx_step < t {
                        break;
                    }
                    let (recv, even, odd) = stage
                        .split(len)
                        .map_err(|e| conn.failed(PeerOp::Receive, context, e))?;
                    let target = if last {
                        &mut bufs.data[self.layout.piece()]
                    } else if t.is_multiple_of(2) {
                        even
                    } else {
                        odd
                    };
                    if !self.primed {
                        target.copy_from_slice(&bufs.input[seg]);
                        self.primed = true;
                    }
                    self.fold(conn, target, recv, op, dtype, context)?
                }
                Work::AllReduce(..) | Work::AllGather | Work::Recv | Work::Send => {
                    match conn.read(&mut bufs.data[seg][self.rx_off..]) {
                        Ok(Transfer::Moved(n)) => {
                            self.rx_off += n;
                            self.rx_done = self.rx_off;
                            true
                        }
                        Ok(Transfer::Blocked) => false,
                        Ok(Transfer::Closed) => return Err(conn.closed(PeerOp::Receive, context)),
                        Err(e) => return Err(conn.failed(PeerOp::Receive, context, e)),
                    }
                }
            };
            if !moved {
                break;
            }
            progressed = true;
        }
        Ok(progressed)
    }

    /// Reads into `stage` and folds every whole element into `target` at once, keeping a
    /// trailing partial element for the next read. Returns whether bytes arrived.
    fn fold(
        &mut self,
        conn: &mut Conn,
        target: &mut [u8],
        stage: &mut [u8],
        op: ReduceOp,
        dtype: DType,
        context: &'static str,
    ) -> Result<bool> {
        let want = (target.len() - self.rx_off).min(stage.len() - self.fill);
        match conn.read(&mut stage[self.fill..self.fill + want]) {
            Ok(Transfer::Moved(n)) => {
                self.rx_off += n;
                self.fill += n;
                let whole = self.fill / dtype.size() * dtype.size();
                reduce_into(
                    op,
                    dtype,
                    &mut target[self.rx_done..self.rx_done + whole],
                    &stage[..whole],
                );
                self.rx_done += whole;
                stage.copy_within(whole..self.fill, 0);
                self.fill -= whole;
                Ok(true)
            }
            Ok(Transfer::Blocked) => Ok(false),
            Ok(Transfer::Closed) => Err(conn.closed(PeerOp::Receive, context)),
            Err(e) => Err(conn.failed(PeerOp::Receive, context, e)),
        }
    }
}

/// How a collective that cannot move waits before it blocks in the poller.
///
/// Waking a thread that sleeps on another CPU costs ~100 µs on the 2-vCPU VMs this was
/// measured on, against a ~10 µs round trip, so a collective first retries its transfers
/// for a while. Ranks that share CPUs must not spin, or they starve the peer they wait for:
/// there, every retry yields the CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Spin {
    /// How long to retry before blocking.
    pub(crate) total: Duration,
    /// How long to retry without yielding first.
    pub(crate) eager: Duration,
}

impl Spin {
    /// The policy for a rank that shares this machine with `local_ranks` ranks (itself
    /// included): eager only if every rank can have a CPU of its own.
    pub(crate) fn for_local_ranks(total: Duration, local_ranks: usize) -> Spin {
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        let eager = if local_ranks <= cpus {
            Duration::from_micros(10)
        } else {
            Duration::ZERO
        };
        Spin {
            total,
            eager: eager.min(total),
        }
    }
}

/// The error for a collective in which nothing moved for `timeout`.
///
/// When one rank stalls (stopped, swapped out, stuck elsewhere), every rank waiting on it,
/// directly or through others, times out at about the same moment, so "the peer I was
/// waiting for" is right only for the stalled rank's neighbours. The suspect is the
/// connection this rank waits to receive on that has been silent longest (the stalled rank
/// went silent first; the others forwarded what they had before blocking). Failing then
/// leaves a notice naming the suspect on the other connections, and a rank that receives
/// its neighbour's notice while closing reports the rank it names instead (see
/// `ring::fail`): a rank next to the stalled one names it directly, and its other
/// neighbour learns it from that notice. Two or more hops away, a rank may name the
/// neighbour it waited for.
fn stall_verdict(
    transport: &mut Transport,
    lanes: &[Lane],
    timeout: Duration,
    context: &'static str,
) -> Error {
    let waiting: Vec<(usize, PeerOp)> = lanes.iter().filter_map(Lane::waiting_on).collect();
    let (index, op) = waiting
        .iter()
        .filter(|(_, op)| *op == PeerOp::Receive)
        .min_by_key(|(i, _)| transport.conn(*i).last_receive())
        .or_else(|| waiting.first())
        .copied()
        .unwrap_or((0, PeerOp::Receive));
    let conn = transport.conn(index);
    Error::Timeout {
        peer: conn.peer,
        addr: Some(conn.addr),
        op,
        context,
        after: timeout,
    }
}

/// How often a collective that keeps moving bytes still looks at the poller.
const REFRESH: Duration = Duration::from_millis(1);

/// Drives `lanes` until all are finished, waiting on the poller when none can move.
///
/// `stages` holds at least one staging buffer per lane. A peer that lets `timeout` pass
/// without moving a byte fails the collective with an error naming it.
pub(crate) fn run(
    transport: &mut Transport,
    lanes: &mut [Lane],
    bufs: &mut Buffers<'_>,
    stages: &mut [LaneStage],
    timeout: Duration,
    spin: Spin,
    context: &'static str,
) -> Result<()> {
    let mut deadline: Option<Instant> = None;
    let mut idle_since: Option<Instant> = None;
    loop {
        let mut progressed = false;
        let mut finished = true;
        for (lane, stage) in lanes.iter_mut().zip(stages.iter_mut()) {
            progressed |= lane.pump(transport, bufs, stage, context)?;
            finished &= lane.finished();
        }
        if finished {
            return Ok(());
        }
        if progressed {
            // Only a pass that moved nothing may block: a lane pumped earlier in this pass
            // may have become ready since (a refresh inside a later lane's pump can have
            // taken the poller's event for it).
            deadline = None;
            idle_since = None;
            continue;
        }
        let now = Instant::now();
        let idle = now - *idle_since.get_or_insert(now);
        if idle < spin.total {
            // Poll by retrying the transfers themselves: a read that finds the peer's bytes
            // costs one system call, where asking the poller first costs two. Past the
            // first microseconds (in which a peer on its own CPU answers), give the CPU
            // away on every retry, for ranks that share one.
            if idle >= spin.eager {
                std::thread::yield_now();
            }
            transport.assume_ready();
            continue;
        }
        let due = *deadline.get_or_insert_with(|| now + timeout);
        let woke = transport
            .wait(due)
            .map_err(|e| Error::local("waiting for the ring's sockets", e))?;
        if !woke {
            return Err(stall_verdict(transport, lanes, timeout, context));
        }
    }
}
