//! Drives any protocol machine ([`Machine`]: MLX's ring lanes, the native wire's
//! exchanges) over a group's connections, with [`progress`] waiting when nothing moves.
//!
//! The machine decides which bytes go where; this module only moves them. A pass offers
//! every send queue's bytes to its connection (a header and the data behind it in one
//! vectored write), then reads every receive queue's, and repeats while anything moves.
//! Sends go first: a step's send never waits on its own receive, and at the start of a step
//! the peer's bytes have rarely arrived yet, so reading first would mostly cost a system
//! call that finds nothing (measured: 5.70 -> 5.35 system calls per 4 B all_sum with two
//! ranks).
//!
//! Where the driver steps (io_uring, see [`Connections::step`]) and the machine has at most
//! one send and one receive pending, they go in one submission that waits in the kernel
//! for both, so a small step costs one system call instead of a send, a receive that finds
//! nothing, a wait and the receive again.
//!
//! The deadline moves forward whenever bytes move, so `timeout` bounds how long a peer may
//! make no progress, not how long a 64 MiB collective may take.

use std::time::{Duration, Instant};

use super::notice::Inquiry;
use super::{Connections, STEP_SEND_BYTES};
use crate::comm::machine::Machine;
use crate::comm::progress::{Drive, Spin, Wait, WaitPolicy, blame, progress};
use crate::comm::state::CloseFlag;
use crate::error::{Error, PeerOp, Phase, Result};

/// How often a collective that keeps moving bytes still looks at the driver: a connection
/// that failed meanwhile must be seen while its failure notice is still readable.
const REFRESH: Duration = Duration::from_millis(1);

/// When bytes last moved, as the collective's deadline counts from it.
///
/// A step's send (staged, small) goes at once, so its progress dates from the submission,
/// not from the end of a wait that may have run to the deadline for the receive; the
/// receive of the same step dates from its completion, which is later. Whatever order the
/// two are noted in, the date never moves back.
#[derive(Clone, Copy, Debug)]
struct Silence {
    since: Instant,
}

impl Silence {
    /// Something moved at `at`.
    fn moved(&mut self, at: Instant) {
        self.since = self.since.max(at);
    }

    /// When a collective silent since then times out.
    fn deadline(&self, timeout: Duration) -> Instant {
        crate::options::deadline(self.since, timeout)
    }
}

/// One collective in flight, as [`progress`] drives it.
struct Collective<'a, M> {
    conns: &'a mut Connections,
    machine: &'a mut M,
    context: Phase,
    closed: &'a CloseFlag,
    /// What the machine waits on, when it stalls (kept for its storage).
    waits: Vec<(usize, PeerOp)>,
    /// The peer's silence a step allows, and when bytes last moved.
    timeout: Duration,
    silence: Silence,
    /// How a step waits before it sleeps in the kernel.
    spin: Spin,
    /// How long a wait lasts before it looks for urgent bytes, where the driver cannot
    /// report them ([`Inquiry::answer_within`]).
    look: Duration,
    /// The longest step so far that waited for its receive (see [`Drive::waited`]).
    waited: Duration,
}

/// What one step moves: the send (its queue, its link, how many bytes were staged) and
/// the receive (its queue, its link).
struct Plan {
    send: Option<(usize, usize, usize)>,
    recv: Option<(usize, usize)>,
}

impl<M: Machine> Collective<'_, M> {
    /// One pass over every queue of the machine; returns whether anything moved.
    fn pass(&mut self) -> Result<bool> {
        let context = self.context;
        for i in 0..self.machine.transmits() {
            while let Some(t) = self.machine.poll_transmit(i) {
                let conn = self.conns.conn(t.link);
                let sent = conn.write_pair(t.head, t.body);
                match conn.moved(sent, PeerOp::Send, context)? {
                    Some(n) => self.machine.handle_sent(i, n),
                    None => break,
                }
            }
        }
        for i in 0..self.machine.receives() {
            while let Some(r) = self.machine.poll_receive(i) {
                let conn = self.conns.conn(r.link);
                let received = conn.read(r.buf);
                match conn.moved(received, PeerOp::Receive, context)? {
                    Some(n) => self.machine.handle_received(i, n)?,
                    None => break,
                }
            }
        }
        Ok(self.machine.take_progress())
    }

    /// Passes until nothing moves, looking at the driver and the close flag now and then
    /// (a collective whose sockets keep taking bytes never returns to the progress loop).
    fn drain(&mut self) -> Result<bool> {
        let mut any = false;
        let mut refreshed = Instant::now();
        while !self.machine.is_finished() && self.pass()? {
            any = true;
            if refreshed.elapsed() >= REFRESH {
                self.conns
                    .refresh()
                    .map_err(|e| Error::local("polling a group's connections", e))?;
                refreshed = Instant::now();
                if self.closed.is_set() {
                    return Err(Error::Aborted {
                        context: self.context,
                    });
                }
            }
        }
        Ok(any)
    }

    /// The next step's transfers, or `None` when the machine cannot step now: the driver
    /// does not step, more than one queue is pending in either direction (those go
    /// through [`Collective::pass`], and the last pending pair steps), a send is larger
    /// than [`STEP_SEND_BYTES`] (sent in place by the pass), or the connection cannot step
    /// now (see [`Connections::steps`]). The send's bytes are staged when it returns.
    fn plan(&mut self) -> Option<Plan> {
        if !self.conns.can_step() {
            return None;
        }
        let mut out = None;
        for i in 0..self.machine.transmits() {
            if let Some(t) = self.machine.poll_transmit(i) {
                if out.is_some() || t.len() > STEP_SEND_BYTES {
                    return None;
                }
                out = Some((i, t.link));
            }
        }
        let mut inc = None;
        for i in 0..self.machine.receives() {
            if let Some(r) = self.machine.poll_receive(i) {
                if inc.is_some() {
                    return None;
                }
                inc = Some((i, r.link));
            }
        }
        // A send-only step receives nothing, but the connection's own condition still
        // applies: the connections decide where their steps are safe.
        let link = inc.or(out).map(|(_, link)| link)?;
        if !self.conns.steps(link) {
            return None;
        }
        let send = match out {
            Some((i, link)) => {
                let t = self.machine.poll_transmit(i)?;
                Some((i, link, self.conns.stage_send_pair(t.head, t.body)))
            }
            None => None,
        };
        Some(Plan { send, recv: inc })
    }

    /// Moves what can move: steps while the machine can ([`Collective::plan`]), passes
    /// otherwise. A step's receive takes what [`Machine::poll_receive`] offers (a native
    /// header first, with the data behind it only where that lands in staging, so a
    /// header is still checked before data behind it is used). Returns whether anything
    /// moved; fails the collective when the peer made no progress until the deadline.
    fn step(&mut self) -> Result<bool> {
        let context = self.context;
        let mut any = false;
        loop {
            // A close from another thread ends the wait it interrupts (which takes the
            // wake-up with it): look at the flag before every wait.
            if self.closed.is_set() {
                return Err(Error::Aborted { context });
            }
            if self.machine.take_progress() {
                any = true;
                self.silence.moved(Instant::now());
            }
            if self.machine.is_finished() {
                return Ok(any);
            }
            let Some(plan) = self.plan() else {
                let moved = self.drain()?;
                if moved {
                    self.silence.moved(Instant::now());
                }
                return Ok(any | moved);
            };
            let send = plan.send.filter(|&(_, _, n)| n > 0);
            if send.is_none() && plan.recv.is_none() {
                return Ok(any);
            }
            let deadline = self.silence.deadline(self.timeout);
            let submitted = Instant::now();
            let recv = match plan.recv {
                Some((i, _)) => self.machine.poll_receive(i).map(|r| (r.link, r.buf)),
                None => None,
            };
            let stepped = self
                .conns
                .step(
                    send.map(|(_, link, n)| (link, n)),
                    recv,
                    (deadline, Some(self.look)),
                    self.spin,
                )
                .map_err(|e| Error::local("a step's transfers on io_uring", e))?;
            // How long the step waited for its peer, which the wait policy learns from: a
            // step that sends and receives waits in the kernel inside `advance`, where
            // `progress` cannot see it.
            if plan.recv.is_some() {
                self.waited = self.waited.max(submitted.elapsed());
            }
            // The receive first: a header that differs explains a failed send better than
            // the failure does, and it is not there to read again.
            if let Some((i, link)) = plan.recv {
                let conn = self.conns.conn(link);
                if let Some(n) = conn.moved(stepped.received, PeerOp::Receive, context)? {
                    self.machine.handle_received(i, n)?;
                    self.silence.moved(Instant::now());
                }
            }
            if let Some((i, link, _)) = send {
                let conn = self.conns.conn(link);
                if let Some(n) = conn.moved(stepped.sent, PeerOp::Send, context)? {
                    self.machine.handle_sent(i, n);
                    self.silence.moved(submitted);
                }
            }
            any |= self.machine.take_progress();
            // Otherwise the step was cut short by a close from another thread (seen at the
            // top of the loop), or by the deadline: a peer silent for the whole timeout.
            if Instant::now() >= self.silence.deadline(self.timeout) {
                return Err(self.stalled(self.timeout));
            }
        }
    }
}

impl<M: Machine> Drive for Collective<'_, M> {
    fn advance(&mut self) -> Result<bool> {
        self.step()
    }

    fn finished(&self) -> bool {
        self.machine.is_finished()
    }

    fn waited(&self) -> Duration {
        self.waited
    }

    fn assume_ready(&mut self) {
        // Poll by retrying the transfers themselves: a read that finds the peer's bytes
        // costs one system call, where asking the poller first costs two.
        self.conns.assume_ready();
    }

    fn wait(&mut self, until: Instant) -> Result<bool> {
        self.conns
            .wait(until, Some(self.look))
            .map_err(|e| Error::local("waiting for a group's connections", e))
    }

    fn aborted(&self) -> Option<Error> {
        // The close that raised the flag also woke the driver (see the backends' `connect`).
        self.closed.is_set().then_some(Error::Aborted {
            context: self.context,
        })
    }

    /// Timing suggests a suspect ([`blame`] over what the machine waits on and when each
    /// connection last received), but only the neighbours can say which rank stalled: the
    /// connections ask them ([`Connections::inquire`]) and the verdict names the rank. A
    /// rank next to the stalled one finds it silent and names it; a rank whose neighbours
    /// both answer waits for the notice of one that found the stalled rank, passed on from
    /// rank to rank (see [`super::fail`]).
    fn stalled(&mut self, timeout: Duration) -> Error {
        self.waits.clear();
        self.machine.poll_wait(&mut self.waits);
        let conns = &mut *self.conns;
        let suspect = blame(self.waits.iter().map(|&(conn, op)| Wait {
            conn,
            op,
            last: conns.conn(conn).last_receive(),
        }));
        let suspect = suspect.map_or((0, PeerOp::Receive), |w| (w.conn, w.op));
        conns.inquire(&self.waits, suspect, timeout, self.context)
    }
}

/// Drives `machine` over `conns` until it is finished.
///
/// A peer that lets `timeout` pass without moving a byte fails it with an error naming the
/// peer; a raised `closed` ends it with [`Error::Aborted`]; an error the machine finds in
/// what arrives (a native header that differs) ends it with that error.
pub(crate) fn run<M: Machine>(
    conns: &mut Connections,
    machine: &mut M,
    (timeout, policy): (Duration, &mut WaitPolicy),
    context: Phase,
    closed: &CloseFlag,
) -> Result<()> {
    let mut collective = Collective {
        conns,
        machine,
        context,
        closed,
        waits: Vec::new(),
        timeout,
        silence: Silence {
            since: Instant::now(),
        },
        spin: policy.spin(),
        look: Inquiry::answer_within(timeout),
        waited: Duration::ZERO,
    };
    progress(&mut collective, timeout, policy)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_send_dated_at_its_submission_does_not_undo_a_later_receive() {
        // A step's receive completes at t1 and is noted first (the native order); its
        // send, submitted at t0 < t1, is noted after: the date stays t1. Dating the send
        // by assignment would move the deadline back by the whole wait.
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_millis(700);
        let mut s = Silence { since: t0 };
        s.moved(t1);
        s.moved(t0);
        assert_eq!(s.since, t1);
        assert_eq!(
            s.deadline(Duration::from_secs(1)),
            t1 + Duration::from_secs(1)
        );
        // In the other order (the ring's) both rules agree.
        let mut s = Silence { since: t0 };
        s.moved(t0);
        s.moved(t1);
        assert_eq!(s.since, t1);
    }
}
