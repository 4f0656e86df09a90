//! Driving RDMA algorithms: one thread, the caller's, polls every completion queue a
//! collective uses and hands each completion to the machine that posted the request.
//!
//! MLX runs each ring wire on its own thread and busy-polls forever. Here the algorithms are
//! state machines ([`Machine`]) and [`comm::progress`](crate::comm::progress) drives all of
//! them, so the wires progress side by side on the calling thread, and the wait between
//! completions follows a policy: spin for a few microseconds (a peer on its own CPU answers
//! in about that time over Thunderbolt), then yield the CPU, then sleep in short, growing
//! naps (at most [`NAP_MAX`]): on the fabric's completion channels when it has them
//! ([`Fabric::wait`], which wakes at the next completion), else on the backend's
//! [`Liveness`] (JACCL's side channel), which wakes at once if a peer goes away. Every wait
//! is bounded: a collective that sees no completion for the group's timeout fails, naming
//! the peer [`Activity::blame`] picks from the work outstanding on each connection.
//!
//! Every completion's status is checked (MLX does not): a failed work request fails the
//! collective with the device's message and the peer's rank.
//!
//! # The machines' vocabulary
//!
//! A [`Machine`] speaks the protocol vocabulary of every transport's machines (`poll_*` to
//! ask what to do, `handle_*` to report what happened, `is_finished`), as far as RDMA's
//! model allows. A TCP machine hands out bytes and is told how many moved; an RDMA machine
//! posts whole registered buffers itself, through [`Cx`], and is told when each work request
//! completes. So:
//!
//! - `poll_transmit` / `poll_receive` (what to write, where to read): the machine posts
//!   through [`Cx::post_send`] / [`Cx::post_recv`] itself, in [`Machine::start`] and in
//!   [`Machine::handle_completion`];
//! - `handle_sent` / `handle_received`: [`Machine::handle_completion`], for a send's or a
//!   receive's completion alike (the tag the machine posted it with says which);
//! - `is_finished`: [`Machine::is_finished`];
//! - `take_progress`: none; the engine counts a polled completion as progress;
//! - `poll_wait` (a deadline of the machine's own): none; only the group's timeout bounds a
//!   wait;
//! - a lane's connections (`tx`, `rx`): [`Machine::owns`], which says whose completions a
//!   connection's are.

use std::time::{Duration, Instant};

use super::fabric::{BufId, Completion, Fabric, FabricResult};
use crate::comm::progress::{self, Activity, Drive, Spin, WaitPolicy};
use crate::comm::state::CloseFlag;
use crate::error::{Error, PeerOp, Phase, Result};

/// One algorithm's state: it posts work when started and as its completions come in.
///
/// `W` is what the machine works on besides the fabric, the same for every machine of a
/// collective: the caller's memory, and whatever the backend keeps beside it (JACCL: the
/// buffer layout and its staging memory).
pub(crate) trait Machine<W: ?Sized> {
    /// Posts the first requests.
    fn start(&mut self, cx: &mut Cx<'_>, work: &mut W) -> Result<()>;

    /// Handles the successful completion of a request this machine posted on `conn` with
    /// tag `tag` (a failed one fails the collective before it gets here).
    fn handle_completion(
        &mut self,
        cx: &mut Cx<'_>,
        work: &mut W,
        conn: usize,
        tag: u64,
    ) -> Result<()>;

    /// Whether every request is posted and completed.
    fn is_finished(&self) -> bool;

    /// Whether completions on `conn` belong to this machine (each connection's belong to
    /// one machine of a collective at most).
    fn owns(&self, conn: usize) -> bool;
}

/// What a machine posts through: the fabric, and the bookkeeping that lets errors name
/// peers.
pub(crate) struct Cx<'a> {
    fabric: &'a mut dyn Fabric,
    /// The peer rank of each connection.
    peers: &'a [usize],
    context: Phase,
    /// What is outstanding on each connection, for blame.
    activity: &'a mut Activity,
}

impl<'a> Cx<'a> {
    /// A collective's context: `peers[c]` is the rank connection `c` leads to; errors name
    /// `context`.
    pub(crate) fn new(
        fabric: &'a mut dyn Fabric,
        peers: &'a [usize],
        context: Phase,
        activity: &'a mut Activity,
    ) -> Self {
        activity.start(peers.len());
        Cx {
            fabric,
            peers,
            context,
            activity,
        }
    }

    fn rdma_error(&self, conn: usize, op: PeerOp, reason: String) -> Error {
        Error::Rdma {
            peer: self.peers[conn],
            op,
            context: self.context,
            reason,
        }
    }

    /// Posts a SEND of buffer `buf` on `conn`, tagged `tag` (32 bits, handed back with its
    /// completion).
    pub(crate) fn post_send(&mut self, conn: usize, buf: BufId, tag: u64) -> Result<()> {
        let posted = self.fabric.post_send(conn, buf, tag);
        self.posted(conn, PeerOp::Send, posted)
    }

    /// Posts a receive into buffer `buf` on `conn`, tagged `tag`.
    pub(crate) fn post_recv(&mut self, conn: usize, buf: BufId, tag: u64) -> Result<()> {
        let posted = self.fabric.post_recv(conn, buf, tag);
        self.posted(conn, PeerOp::Receive, posted)
    }

    /// Counts a work request the fabric took on `conn`, or names the peer it failed for.
    fn posted(&mut self, conn: usize, op: PeerOp, posted: FabricResult<()>) -> Result<()> {
        posted.map_err(|r| self.rdma_error(conn, op, r))?;
        self.activity.posted(conn, op);
        Ok(())
    }

    /// The bytes of buffer `buf`, used with `conn`. A buffer that is not available is a bug
    /// in an algorithm, never the peer's fault: it names no peer.
    pub(crate) fn buffer(&mut self, conn: usize, buf: BufId) -> Result<&mut [u8]> {
        let context = self.context;
        let peer = self.peers[conn];
        self.fabric.buffer(buf).map_err(|reason| Error::Bug {
            context,
            what: format!("a JACCL buffer for rank {peer} is not available: {reason}"),
        })
    }

    /// Fills the front of buffer `buf` with `bytes` (the tail keeps stale bytes, as MLX's).
    pub(crate) fn fill(&mut self, conn: usize, buf: BufId, bytes: &[u8]) -> Result<()> {
        self.buffer(conn, buf)?[..bytes.len()].copy_from_slice(bytes);
        Ok(())
    }

    /// Whether work is outstanding with rank `peer`.
    fn waiting_on(&self, peer: usize) -> bool {
        self.peers
            .iter()
            .enumerate()
            .any(|(conn, &r)| r == peer && self.activity.busy(conn))
    }

    fn completed(&mut self, c: &Completion) {
        let op = if c.recv {
            PeerOp::Receive
        } else {
            PeerOp::Send
        };
        self.activity.completed(c.conn, op);
    }

    /// The timeout error, naming the peer [`Activity::blame`] picks (a lost peer completes
    /// nothing at all).
    fn timeout(&self, after: Duration) -> Error {
        let (peer, op) = match self.activity.blame() {
            Some(w) => (self.peers[w.conn], w.op),
            None => (self.peers.first().copied().unwrap_or(0), PeerOp::Receive),
        };
        Error::Timeout {
            peer,
            addr: None,
            op,
            context: self.context,
            after,
        }
    }
}

/// What [`run`] needs between calls, kept by the group so that a collective allocates
/// nothing.
#[derive(Debug)]
pub(crate) struct Scratch {
    /// What one poll of the completion queues found.
    completions: Vec<Completion>,
    /// The machine each connection's completions go to.
    owner: Vec<Option<usize>>,
}

impl Scratch {
    /// Room for `conns` connections whose completion queues hold `cq_entries` each: one
    /// round of polls finds at most that many, so however completions bunch up (which
    /// depends on timing, not on the collective) the vectors never grow.
    pub(crate) fn new(conns: usize, cq_entries: usize) -> Self {
        Scratch {
            completions: Vec::with_capacity(conns * cq_entries),
            owner: Vec::with_capacity(conns),
        }
    }
}

/// For ranks on machines of their own, as JACCL's are.
pub(crate) const DEDICATED: Spin = Spin {
    eager: Duration::from_micros(50),
    total: Duration::from_micros(500),
};

/// For ranks that share CPUs (tests): yield from the start.
#[cfg(test)]
pub(crate) const SHARED: Spin = Spin {
    eager: Duration::ZERO,
    total: Duration::from_micros(200),
};

/// The first and longest nap once spinning is over.
const NAP_MIN: Duration = Duration::from_micros(50);
const NAP_MAX: Duration = Duration::from_millis(1);

/// How long a timed-out collective waits for a failure notice that names the lost rank.
const DIAGNOSE: Duration = Duration::from_millis(250);

/// Something that can tell whether the peers are still there, and sleep until one of them
/// might not be: JACCL's side channel.
pub(crate) trait Liveness {
    /// Fails if a rank for which `needed` is true is known to be gone. (A rank that finished
    /// its part of a collective and exited is not a failure for ranks that no longer need it.)
    fn check(&mut self, context: Phase, needed: &dyn Fn(usize) -> bool) -> Result<()>;

    /// Sleeps up to `wait`, waking early when a peer's status may have changed.
    fn sleep(&mut self, wait: Duration);
}

/// Runs `machines` to completion over `work`.
///
/// # Errors
///
/// A post or completion failed ([`Error::Rdma`], naming the peer), no completion came for
/// `timeout` ([`Error::Timeout`], naming the peer [`Activity::blame`] picks), or the side
/// channel reports a lost rank while nothing moves; [`Error::Aborted`] once `closed` is
/// raised. Naps are at most [`NAP_MAX`] and the progress loop checks the flag after each, so
/// a close from another thread needs no wake-up of its own.
#[allow(
    clippy::too_many_arguments,
    reason = "one call site, each argument distinct"
)]
pub(crate) fn run<W: ?Sized, M: Machine<W>>(
    cx: &mut Cx<'_>,
    work: &mut W,
    machines: &mut [M],
    live: &mut dyn Liveness,
    timeout: Duration,
    spin: &mut WaitPolicy,
    scratch: &mut Scratch,
    closed: &CloseFlag,
) -> Result<()> {
    for m in machines.iter_mut() {
        m.start(cx, work)?;
    }
    let Scratch { completions, owner } = scratch;
    owner.clear();
    owner.extend((0..cx.peers.len()).map(|c| machines.iter().position(|m| m.owns(c))));
    let mut engine = Engine {
        cx,
        work,
        machines,
        owner,
        live,
        completions,
        nap: NAP_MIN,
        loss: None,
        closed,
    };
    progress::progress(&mut engine, timeout, spin)
}

/// One collective's machines, as [`progress::progress`] drives them.
struct Engine<'d, 'a, W: ?Sized, M> {
    cx: &'d mut Cx<'a>,
    work: &'d mut W,
    machines: &'d mut [M],
    /// The machine each connection's completions go to.
    owner: &'d [Option<usize>],
    live: &'d mut dyn Liveness,
    completions: &'d mut Vec<Completion>,
    /// The next nap, growing from [`NAP_MIN`] to [`NAP_MAX`] while nothing moves.
    nap: Duration,
    /// A lost peer the side channel reported, returned if one more poll finds nothing.
    loss: Option<Error>,
    /// Raised when the group is closed from another thread.
    closed: &'d CloseFlag,
}

impl<W: ?Sized, M: Machine<W>> Drive for Engine<'_, '_, W, M> {
    fn advance(&mut self) -> Result<bool> {
        let Engine {
            cx,
            work,
            machines,
            owner,
            completions,
            ..
        } = self;
        for (conn, owner) in owner.iter().enumerate() {
            if owner.is_some_and(|m| !machines[m].is_finished()) {
                cx.fabric
                    .poll(conn, completions)
                    .map_err(|r| cx.rdma_error(conn, PeerOp::Receive, r))?;
            }
        }
        let progressed = !completions.is_empty();
        for c in completions.drain(..) {
            cx.completed(&c);
            if let Err(reason) = c.status {
                let op = if c.recv {
                    PeerOp::Receive
                } else {
                    PeerOp::Send
                };
                return Err(cx.rdma_error(c.conn, op, reason));
            }
            if let Some(m) = owner[c.conn] {
                machines[m].handle_completion(cx, work, c.conn, c.tag)?;
            }
        }
        if progressed {
            self.nap = NAP_MIN;
            self.loss = None;
            return Ok(true);
        }
        match self.loss.take() {
            // A peer's side channel closed and, polled once more since, nothing moved.
            Some(e) => Err(e),
            None => Ok(false),
        }
    }

    fn finished(&self) -> bool {
        self.machines.iter().all(M::is_finished)
    }

    fn wait(&mut self, until: Instant) -> Result<bool> {
        let cx = &*self.cx;
        if let Err(e) = self.live.check(cx.context, &|rank| cx.waiting_on(rank)) {
            // Look at the completion queues once more before failing: a peer that finished
            // and exited may have done so just after its last message arrived.
            self.loss = Some(e);
            return Ok(true);
        }
        let nap = self
            .nap
            .min(until.saturating_duration_since(Instant::now()));
        if !self.cx.fabric.wait(nap) {
            self.live.sleep(nap);
        }
        self.nap = (self.nap * 2).min(NAP_MAX);
        // A nap is shorter than the deadline; the progress loop looks at the clock.
        Ok(true)
    }

    fn stalled(&mut self, timeout: Duration) -> Error {
        // Before blaming the silent peer, look for a better explanation: a rank whose side
        // channel closed (even one this rank does not wait on directly: in a ring, everyone
        // waits on everyone in the end), or a failure notice from a rank that timed out on
        // the rank that was really lost, which may take a moment to arrive.
        let until = Instant::now() + (timeout / 4).min(DIAGNOSE);
        loop {
            if let Err(e) = self.live.check(self.cx.context, &|_| true) {
                return e;
            }
            // A close from another thread must not wait for the diagnosis: the stall still
            // stands (the deadline passed first), named by the timing rule alone.
            if Instant::now() >= until || self.closed.is_set() {
                break;
            }
            self.live.sleep(NAP_MAX);
        }
        self.cx.timeout(timeout)
    }

    fn aborted(&self) -> Option<Error> {
        self.closed.is_set().then_some(Error::Aborted {
            context: self.cx.context,
        })
    }
}
