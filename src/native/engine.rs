//! The native wire's I/O: drives an [`Exchange`] over the mesh's sockets with
//! [`progress`], as `ring::engine` drives the ring's lanes.
//!
//! A message's header and the first of its data go out in one vectored write; a received
//! header is read on its own, so that it is checked before any data behind it is read.

use std::time::{Duration, Instant};

use super::protocol::{Exchange, Memory};
use crate::comm::progress::{Drive, Spin, Wait, blame, progress};
use crate::comm::state::CloseFlag;
use crate::error::{Error, PeerOp, Phase, Result};
use crate::ring::transport::{Transfer, Transport};

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
}

impl Collective<'_, '_> {
    /// One pass over every message of the current round; returns whether anything moved.
    fn pass(&mut self) -> Result<bool> {
        let context = self.context;
        for i in 0..self.exchange.outs() {
            while let Some((index, head, body)) = self.exchange.transmit(i, self.mem) {
                let conn = self.transport.conn(index);
                match conn.write_pair(head, body) {
                    Ok(Transfer::Moved(n)) => self.exchange.sent(i, n),
                    Ok(Transfer::Blocked) => break,
                    Ok(Transfer::Closed) => return Err(conn.closed(PeerOp::Send, context)),
                    Err(e) => return Err(conn.failed(PeerOp::Send, context, e)),
                }
            }
        }
        for i in 0..self.exchange.ins() {
            while let Some((index, target)) = self.exchange.receive(i, self.mem) {
                let conn = self.transport.conn(index);
                match conn.read(target) {
                    Ok(Transfer::Moved(n)) => self.exchange.received(i, n, self.mem)?,
                    Ok(Transfer::Blocked) => break,
                    Ok(Transfer::Closed) => return Err(conn.closed(PeerOp::Receive, context)),
                    Err(e) => return Err(conn.failed(PeerOp::Receive, context, e)),
                }
            }
        }
        self.exchange.complete(self.mem);
        Ok(self.exchange.take_progress())
    }
}

impl Drive for Collective<'_, '_> {
    fn advance(&mut self) -> Result<bool> {
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
