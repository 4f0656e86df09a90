//! Driving JACCL's algorithms: one thread, the caller's, polls every completion queue the
//! collective uses and hands each completion to the state machine that posted the request.
//!
//! MLX runs each ring wire on its own thread and busy-polls forever. Here the algorithms are
//! state machines ([`Machine`]) and one loop drives all of them, so the ring's wires progress
//! side by side on the calling thread, and the wait between completions follows a policy:
//! spin for a few microseconds (a peer on its own CPU answers in about that time over
//! Thunderbolt), then yield the CPU, then sleep in short, growing naps on the side channel's
//! poller, which wakes at once if a peer's side channel closes. Every wait is bounded: a
//! collective that sees no completion for the group's timeout fails, naming the peer whose
//! connection has been silent longest while work is outstanding on it.
//!
//! Every completion's status is checked (MLX does not): a failed work request fails the
//! collective with the device's message and the peer's rank.

use std::time::{Duration, Instant};

use super::buffers::{BufId, BufferPlan};
use super::fabric::{Completion, Fabric};
use super::frames::WorkTag;
use crate::error::{Error, PeerOp, Result};

/// The memory a collective works on.
pub(crate) struct Mem<'a> {
    /// What receives write: the array of an all-reduce, the output of the others. Also what
    /// sends read when there is no separate input.
    pub(crate) data: &'a mut [u8],
    /// A separate, read-only input (sum_scatter's, send's); `None` when the input is `data`.
    pub(crate) input: Option<&'a [u8]>,
}

impl Mem<'_> {
    /// Input bytes `[start, start + len)`.
    pub(crate) fn input(&self, start: usize, len: usize) -> &[u8] {
        match self.input {
            Some(input) => &input[start..start + len],
            None => &self.data[start..start + len],
        }
    }
}

/// One algorithm's state: it posts work when started and as its completions come in.
pub(crate) trait Machine {
    /// Posts the first requests.
    fn start(&mut self, cx: &mut Cx<'_>, mem: &mut Mem<'_>) -> Result<()>;

    /// Handles a successful completion of a request this machine posted on `conn`.
    fn complete(
        &mut self,
        cx: &mut Cx<'_>,
        mem: &mut Mem<'_>,
        conn: usize,
        tag: WorkTag,
    ) -> Result<()>;

    /// Whether every request is posted and completed.
    fn finished(&self) -> bool;

    /// Whether completions on `conn` belong to this machine.
    fn owns(&self, conn: usize) -> bool;
}

/// Outstanding work on one connection.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pending {
    sends: usize,
    recvs: usize,
    /// When the connection last completed something (or the collective started).
    last: Instant,
}

/// What a machine works with: the fabric, the buffer plan, the group's staging memory, and
/// the bookkeeping that lets errors name peers.
pub(crate) struct Cx<'a> {
    pub(crate) fabric: &'a mut dyn Fabric,
    pub(crate) plan: &'a BufferPlan,
    /// Page-sized staging for the mesh all-reduce's own chunks (two largest buffers).
    pub(crate) staging: &'a mut [u8],
    /// The peer rank of each connection.
    pub(crate) peers: &'a [usize],
    pub(crate) context: &'static str,
    pending: &'a mut Vec<Pending>,
}

impl<'a> Cx<'a> {
    pub(crate) fn new(
        fabric: &'a mut dyn Fabric,
        plan: &'a BufferPlan,
        staging: &'a mut [u8],
        peers: &'a [usize],
        context: &'static str,
        pending: &'a mut Vec<Pending>,
    ) -> Self {
        let now = Instant::now();
        pending.clear();
        pending.resize(
            peers.len(),
            Pending {
                sends: 0,
                recvs: 0,
                last: now,
            },
        );
        Cx {
            fabric,
            plan,
            staging,
            peers,
            context,
            pending,
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

    /// Posts a SEND of buffer `buf` on `conn`.
    pub(crate) fn post_send(&mut self, conn: usize, buf: BufId, tag: WorkTag) -> Result<()> {
        self.fabric
            .post_send(conn, buf, tag.encode())
            .map_err(|r| self.rdma_error(conn, PeerOp::Send, r))?;
        self.pending[conn].sends += 1;
        Ok(())
    }

    /// Posts a receive into buffer `buf` on `conn`.
    pub(crate) fn post_recv(&mut self, conn: usize, buf: BufId, tag: WorkTag) -> Result<()> {
        self.fabric
            .post_recv(conn, buf, tag.encode())
            .map_err(|r| self.rdma_error(conn, PeerOp::Receive, r))?;
        self.pending[conn].recvs += 1;
        Ok(())
    }

    /// The bytes of buffer `buf`, used with `conn` (named if the buffer is not available,
    /// which would be a bug in an algorithm).
    pub(crate) fn buffer(&mut self, conn: usize, buf: BufId) -> Result<&mut [u8]> {
        let peer = self.peers[conn];
        let context = self.context;
        self.fabric.buffer(buf).map_err(|reason| Error::Rdma {
            peer,
            op: PeerOp::Send,
            context,
            reason: format!("internal: {reason}"),
        })
    }

    /// Fills the front of buffer `buf` with `bytes` (the tail keeps stale bytes, as MLX's).
    pub(crate) fn fill(&mut self, conn: usize, buf: BufId, bytes: &[u8]) -> Result<()> {
        self.buffer(conn, buf)?[..bytes.len()].copy_from_slice(bytes);
        Ok(())
    }

    /// Whether work is outstanding with rank `peer`.
    fn waiting_on(&self, peer: usize) -> bool {
        self.pending
            .iter()
            .zip(self.peers)
            .any(|(p, &r)| r == peer && p.sends + p.recvs > 0)
    }

    fn completed(&mut self, c: &Completion, recv: bool) {
        let p = &mut self.pending[c.conn];
        if recv {
            p.recvs = p.recvs.saturating_sub(1);
        } else {
            p.sends = p.sends.saturating_sub(1);
        }
        p.last = Instant::now();
    }

    /// The timeout error: the peer whose connection, with work outstanding, has been silent
    /// longest (a lost peer completes nothing at all); a receive outstanding there is named
    /// before a send.
    fn timeout(&self, after: Duration) -> Error {
        let blamed = self
            .pending
            .iter()
            .enumerate()
            .filter(|(_, p)| p.sends + p.recvs > 0)
            .min_by_key(|(_, p)| p.last);
        let (peer, op) = match blamed {
            Some((conn, p)) => (
                self.peers[conn],
                if p.recvs > 0 {
                    PeerOp::Receive
                } else {
                    PeerOp::Send
                },
            ),
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

/// How the loop waits for completions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Spin {
    /// How long to poll without giving the CPU away.
    pub(crate) eager: Duration,
    /// How long to keep polling (yielding between polls) before sleeping.
    pub(crate) total: Duration,
}

impl Spin {
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
}

/// The first and longest nap once spinning is over.
const NAP_MIN: Duration = Duration::from_micros(50);
const NAP_MAX: Duration = Duration::from_millis(1);

/// How long a timed-out collective waits for a failure notice that names the lost rank.
const DIAGNOSE: Duration = Duration::from_millis(250);

/// Something that can tell whether the peers are still there, and sleep until one of them
/// might not be.
pub(crate) trait Liveness {
    /// Fails if a rank for which `needed` is true is known to be gone. (A rank that finished
    /// its part of a collective and exited is not a failure for ranks that no longer need it.)
    fn check(&mut self, context: &'static str, needed: &dyn Fn(usize) -> bool) -> Result<()>;

    /// Sleeps up to `wait`, waking early when a peer's status may have changed.
    fn sleep(&mut self, wait: Duration);
}

/// Runs `machines` to completion.
///
/// # Errors
///
/// A post or completion failed ([`Error::Rdma`], naming the peer), no completion came for
/// `timeout` ([`Error::Timeout`], naming the peer waited on longest), or the side channel
/// reports a lost rank while nothing moves.
pub(crate) fn run<M: Machine>(
    cx: &mut Cx<'_>,
    mem: &mut Mem<'_>,
    machines: &mut [M],
    live: &mut dyn Liveness,
    timeout: Duration,
    spin: Spin,
    completions: &mut Vec<Completion>,
) -> Result<()> {
    for m in machines.iter_mut() {
        m.start(cx, mem)?;
    }
    let conns = cx.peers.len();
    let owner: Vec<Option<usize>> = (0..conns)
        .map(|c| machines.iter().position(|m| m.owns(c)))
        .collect();
    let mut idle_since: Option<Instant> = None;
    let mut nap = NAP_MIN;
    let mut loss: Option<Error> = None;
    loop {
        if machines.iter().all(Machine::finished) {
            return Ok(());
        }
        for (conn, owner) in owner.iter().enumerate() {
            if owner.is_some_and(|m| !machines[m].finished()) {
                cx.fabric
                    .poll(conn, completions)
                    .map_err(|r| cx.rdma_error(conn, PeerOp::Receive, r))?;
            }
        }
        let progressed = !completions.is_empty();
        for c in completions.drain(..) {
            let tag = WorkTag::decode(c.wr_id);
            cx.completed(&c, tag.recv);
            if let Err(reason) = c.status {
                let op = if tag.recv {
                    PeerOp::Receive
                } else {
                    PeerOp::Send
                };
                return Err(cx.rdma_error(c.conn, op, reason));
            }
            if let Some(m) = owner[c.conn] {
                machines[m].complete(cx, mem, c.conn, tag)?;
            }
        }
        if progressed {
            idle_since = None;
            nap = NAP_MIN;
            loss = None;
            continue;
        }
        if let Some(e) = loss.take() {
            // A peer's side channel closed and, polled once more since, nothing moved.
            return Err(e);
        }
        let now = Instant::now();
        let idle = now - *idle_since.get_or_insert(now);
        if idle < spin.eager {
            continue;
        }
        if idle < spin.total {
            std::thread::yield_now();
            continue;
        }
        if idle >= timeout {
            // Before blaming the silent peer, look for a better explanation: a rank whose
            // side channel closed (even one this rank does not wait on directly: in a ring,
            // everyone waits on everyone in the end), or a failure notice from a rank that
            // timed out on the rank that was really lost, which may take a moment to arrive.
            let until = Instant::now() + (timeout / 4).min(DIAGNOSE);
            loop {
                live.check(cx.context, &|_| true)?;
                if Instant::now() >= until {
                    break;
                }
                live.sleep(NAP_MAX);
            }
            return Err(cx.timeout(timeout));
        }
        if let Err(e) = live.check(cx.context, &|rank| cx.waiting_on(rank)) {
            // Look at the completion queues once more before failing: a peer that finished
            // and exited may have done so just after its last message arrived.
            loss = Some(e);
            continue;
        }
        let nap_now = nap.min(timeout - idle);
        if !cx.fabric.wait(nap_now) {
            live.sleep(nap_now);
        }
        nap = (nap * 2).min(NAP_MAX);
    }
}
