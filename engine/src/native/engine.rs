//! The native wire's I/O: drives an [`Exchange`] over the mesh's sockets with
//! [`progress`], as `ring::engine` drives the ring's lanes.
//!
//! A message's header and the first of its data go out in one vectored write; a received
//! header is read on its own, so that it is checked before any data behind it is read.
//!
//! On io_uring a round with at most one message pending each way steps as the ring's
//! engine does (see [`Collective::step`]): the message out and the receive go in one
//! submission that waits in the kernel, instead of a system call per transfer plus waits.

use std::time::{Duration, Instant};

use super::protocol::{Exchange, Memory};
use crate::comm::progress::{Drive, Spin, Wait, blame, progress};
use crate::comm::state::CloseFlag;
use crate::error::{Error, PeerOp, Phase, Result};
use crate::ring::transport::{STEP_SEND_BYTES, Transfer, Transport};

/// How often a collective that keeps moving bytes still looks at the poller (as the
/// ring's engine does: a failure notice must be read while it is still there).
const REFRESH: Duration = Duration::from_millis(1);

/// How long a collective that failed on a closed or broken connection still looks for
/// headers it has not read: a peer that found a mismatch closes at once, and the header
/// it sent before explains the failure better than the close does.
const LAST_LOOK: Duration = Duration::from_millis(50);

/// One collective in flight, as [`progress`] drives it.
struct Collective<'a, 'm> {
    transport: &'a mut Transport,
    exchange: &'a mut Exchange,
    mem: &'a mut Memory<'m>,
    context: Phase,
    closed: &'a CloseFlag,
    waits: &'a mut Vec<(usize, PeerOp)>,
    /// The peer's silence [`Collective::step`] allows, and when bytes last moved.
    timeout: Duration,
    last_moved: Instant,
    /// How [`Collective::step`] waits before it sleeps in the kernel.
    spin: Spin,
}

/// What one [`Collective::step`] moves: the message out (its index in the round, its
/// connection and how many bytes were staged) and the message in (index, connection).
struct Plan {
    send: Option<(usize, usize, usize)>,
    recv: Option<(usize, usize)>,
}

impl Collective<'_, '_> {
    /// One pass over every message of the current round; returns whether anything moved.
    fn pass(&mut self) -> Result<bool> {
        let context = self.context;
        for i in 0..self.exchange.outs() {
            while let Some((index, head, body)) = self.exchange.transmit(i, self.mem) {
                let conn = self.transport.conn(index);
                let sent = conn.write_pair(head, body);
                match conn.moved(sent, PeerOp::Send, context)? {
                    Some(n) => self.exchange.sent(i, n),
                    None => break,
                }
            }
        }
        for i in 0..self.exchange.ins() {
            while let Some((index, target)) = self.exchange.receive(i, self.mem) {
                let conn = self.transport.conn(index);
                let received = conn.read(target);
                match conn.moved(received, PeerOp::Receive, context)? {
                    Some(n) => self.exchange.received(i, n, self.mem)?,
                    None => break,
                }
            }
        }
        self.exchange.complete(self.mem);
        Ok(self.exchange.take_progress())
    }

    /// Passes until nothing moves, looking at the poller and the close flag now and then.
    fn drain(&mut self) -> Result<bool> {
        let mut any = false;
        let mut refreshed = Instant::now();
        while !self.exchange.finished() && self.pass()? {
            any = true;
            if refreshed.elapsed() >= REFRESH {
                self.transport
                    .refresh()
                    .map_err(|e| Error::local("polling the native wire's sockets", e))?;
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

    /// The next step's transfers, or `None` when the round cannot step now: more than one
    /// message pending in either direction (those go through [`Collective::pass`], and the
    /// last pending pair steps), a message out larger than [`STEP_SEND_BYTES`] (sent in
    /// place by the pass), or a connection the transport cannot step on (see
    /// [`Transport::steps`]). The message out's bytes are staged when it returns.
    fn plan(&mut self) -> Option<Plan> {
        let mut out = None;
        for i in 0..self.exchange.outs() {
            if let Some((conn, head, body)) = self.exchange.transmit(i, self.mem) {
                if out.is_some() || head.len() + body.len() > STEP_SEND_BYTES {
                    return None;
                }
                out = Some((i, conn));
            }
        }
        let mut inc = None;
        for i in 0..self.exchange.ins() {
            if let Some((conn, _)) = self.exchange.receive(i, self.mem) {
                if inc.is_some() {
                    return None;
                }
                inc = Some((i, conn));
            }
        }
        // A send-only step receives nothing, but the connection's own condition still
        // applies: the transport decides where its steps are safe.
        let conn = inc.or(out).map(|(_, conn)| conn)?;
        if !self.transport.steps(conn) {
            return None;
        }
        let send = match out {
            Some((i, conn)) => {
                let (_, head, body) = self.exchange.transmit(i, self.mem)?;
                Some((i, conn, self.transport.stage_send_pair(head, body)))
            }
            None => None,
        };
        Some(Plan { send, recv: inc })
    }

    /// [`Collective::drain`] on io_uring: each round's message out (header and data, staged)
    /// and its receive go in one [`Transport::step`], which waits in the kernel for both,
    /// so a small round costs one system call. The receive takes what
    /// [`Exchange::receive`] offers, the header first (with the data behind it only where
    /// that lands in staging), so a header is still checked before data behind it is
    /// used. Returns whether anything moved; fails the collective when the peer made no
    /// progress until the deadline.
    fn step(&mut self) -> Result<bool> {
        let context = self.context;
        let mut any = false;
        loop {
            // A close from another thread ends the wait it interrupts (which takes the
            // wake-up with it): look at the flag before every wait.
            if self.closed.is_set() {
                return Err(Error::Aborted { context });
            }
            self.exchange.complete(self.mem);
            if self.exchange.take_progress() {
                any = true;
                self.last_moved = Instant::now();
            }
            if self.exchange.finished() {
                return Ok(any);
            }
            let Some(plan) = self.plan() else {
                let moved = self.drain()?;
                if moved {
                    self.last_moved = Instant::now();
                }
                return Ok(any | moved);
            };
            let send = plan.send.filter(|&(_, _, n)| n > 0);
            if send.is_none() && plan.recv.is_none() {
                return Ok(any);
            }
            let deadline = crate::options::deadline(self.last_moved, self.timeout);
            let submitted = Instant::now();
            let recv = match plan.recv {
                Some((i, _)) => self.exchange.receive(i, self.mem),
                None => None,
            };
            let stepped = self
                .transport
                .step(
                    send.map(|(_, conn, n)| (conn, n)),
                    recv,
                    deadline,
                    self.spin,
                )
                .map_err(|e| Error::local("a native round's transfers on io_uring", e))?;
            // The receive first: a header that differs explains a failed send better than
            // the failure does, and it is not there to read again.
            if let Some((i, conn)) = plan.recv {
                let received = stepped.received;
                let conn = self.transport.conn(conn);
                if let Some(n) = conn.moved(received, PeerOp::Receive, context)? {
                    self.exchange.received(i, n, self.mem)?;
                    self.last_moved = Instant::now();
                }
            }
            if let Some((i, conn, _)) = send {
                let conn = self.transport.conn(conn);
                if let Some(n) = conn.moved(stepped.sent, PeerOp::Send, context)? {
                    self.exchange.sent(i, n);
                    // A step's send (staged, small) goes at once: its progress dates from
                    // the submission, not from the end of a wait that may have run to the
                    // deadline for the receive.
                    self.last_moved = self.last_moved.max(submitted);
                }
            }
            any |= self.exchange.take_progress();
            // Otherwise the step was cut short by a close from another thread (seen at the
            // top of the loop), or by the deadline: a peer silent for the whole timeout.
            if Instant::now() >= crate::options::deadline(self.last_moved, self.timeout) {
                return Err(self.stalled(self.timeout));
            }
        }
    }
}

impl Drive for Collective<'_, '_> {
    fn advance(&mut self) -> Result<bool> {
        if self.transport.uring() {
            return self.step();
        }
        self.drain()
    }

    fn finished(&self) -> bool {
        self.exchange.finished()
    }

    fn assume_ready(&mut self) {
        self.transport.assume_ready();
    }

    fn wait(&mut self, until: Instant) -> Result<bool> {
        self.transport
            .wait(until)
            .map_err(|e| Error::local("waiting for the native wire's sockets", e))
    }

    fn aborted(&self) -> Option<Error> {
        self.closed.is_set().then_some(Error::Aborted {
            context: self.context,
        })
    }

    /// As the ring does: timing picks a suspect among the peers still waited on, and the
    /// transport asks them ([`Transport::inquire`]) before naming one.
    fn stalled(&mut self, timeout: Duration) -> Error {
        self.exchange.waits(self.waits);
        let transport = &mut *self.transport;
        let suspect = blame(self.waits.iter().map(|&(conn, op)| Wait {
            conn,
            op,
            last: transport.conn(conn).last_receive(),
        }));
        let suspect = suspect.map_or((0, PeerOp::Receive), |w| (w.conn, w.op));
        transport.inquire(self.waits, suspect, timeout, self.context)
    }
}

/// Drives `exchange` over `transport` until it is finished.
///
/// A peer that lets `timeout` pass without moving a byte fails it with an error naming the
/// peer; a raised `closed` ends it with [`Error::Aborted`]; a header that differs from this
/// rank's call ends it with [`Error::Mismatch`], also when the connection failed first but
/// the peer's header is still there to read.
#[allow(
    clippy::too_many_arguments,
    reason = "one call site, each argument distinct"
)]
pub(crate) fn run(
    transport: &mut Transport,
    exchange: &mut Exchange,
    mem: &mut Memory<'_>,
    waits: &mut Vec<(usize, PeerOp)>,
    timeout: Duration,
    spin: Spin,
    context: Phase,
    closed: &CloseFlag,
) -> Result<()> {
    let mut collective = Collective {
        transport: &mut *transport,
        exchange: &mut *exchange,
        mem: &mut *mem,
        context,
        closed,
        waits,
        timeout,
        last_moved: Instant::now(),
        spin,
    };
    match progress(&mut collective, timeout, spin) {
        Err(error @ (Error::Closed { .. } | Error::Io { .. } | Error::Lost { .. })) => {
            Err(last_look(transport, exchange, mem).unwrap_or(error))
        }
        result => result,
    }
}

/// Reads, for a short while, the headers of this round that have not arrived, and returns
/// the first one that does not match this rank's call (see [`LAST_LOOK`]).
fn last_look(
    transport: &mut Transport,
    exchange: &mut Exchange,
    mem: &mut Memory<'_>,
) -> Option<Error> {
    let until = Instant::now() + LAST_LOOK;
    loop {
        let mut waiting = false;
        transport.assume_ready();
        for i in 0..exchange.ins() {
            while exchange.header_pending(i) {
                let Some((index, target)) = exchange.receive(i, mem) else {
                    break;
                };
                match transport.conn(index).read(target) {
                    Ok(Transfer::Moved(n)) => {
                        if let Err(error) = exchange.received(i, n, mem) {
                            return Some(error);
                        }
                    }
                    Ok(Transfer::Blocked) => {
                        waiting = true;
                        break;
                    }
                    Ok(Transfer::Closed) | Err(_) => break,
                }
            }
        }
        if !waiting || Instant::now() >= until || transport.wait(until).is_err() {
            return None;
        }
    }
}
