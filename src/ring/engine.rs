//! The ring's I/O: drives the lanes of [`protocol`](super::protocol) over the sockets.
//!
//! The protocol decides which bytes go where; this module only moves them, and waits on the
//! poller when no lane can move. The deadline moves forward whenever bytes move, so
//! `timeout` bounds how long a peer may make no progress, not how long a 64 MiB collective
//! may take.

use std::time::{Duration, Instant};

use super::protocol::{Buffers, Lane};
use super::staging::LaneStage;
use super::transport::{Transfer, Transport};
use crate::error::{Error, PeerOp, Result};

/// Moves as many bytes of `lane` as the sockets take. Returns whether anything moved.
fn pump(
    lane: &mut Lane,
    transport: &mut Transport,
    bufs: &mut Buffers<'_>,
    stage: &mut LaneStage,
    context: &'static str,
) -> Result<bool> {
    let mut any = false;
    let mut refreshed = Instant::now();
    loop {
        // Send first: a step's send never waits on its own receive, and at the start of a
        // step the peer's bytes have rarely arrived yet, so reading first would mostly cost
        // a system call that finds nothing (measured: 5.70 -> 5.35 system calls per 4 B
        // all_sum with two ranks).
        let conn = transport.conn(lane.tx());
        while let Some(bytes) = lane.poll_transmit(bufs, stage) {
            match conn.write(bytes) {
                Ok(Transfer::Moved(n)) => lane.handle_sent(n),
                Ok(Transfer::Blocked) => break,
                Ok(Transfer::Closed) => return Err(conn.closed(PeerOp::Send, context)),
                Err(e) => return Err(conn.failed(PeerOp::Send, context, e)),
            }
        }
        let conn = transport.conn(lane.rx());
        while let Some(target) = lane.poll_receive(bufs, stage) {
            match conn.read(target) {
                Ok(Transfer::Moved(n)) => lane.handle_received(bufs, stage, n),
                Ok(Transfer::Blocked) => break,
                Ok(Transfer::Closed) => return Err(conn.closed(PeerOp::Receive, context)),
                Err(e) => return Err(conn.failed(PeerOp::Receive, context, e)),
            }
        }
        if !lane.take_progress() {
            return Ok(any);
        }
        any = true;
        // A lane whose sockets keep accepting bytes never returns to the poller; look at it
        // now and then anyway, so that a connection that failed meanwhile is seen while its
        // failure notice is still readable.
        if refreshed.elapsed() >= REFRESH {
            transport
                .refresh()
                .map_err(|e| Error::local("polling the ring's sockets", e))?;
            refreshed = Instant::now();
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
            progressed |= pump(lane, transport, bufs, stage, context)?;
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
