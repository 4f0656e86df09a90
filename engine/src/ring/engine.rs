//! The ring's I/O: drives the lanes of [`protocol`](super::protocol) over the sockets.
//!
//! The protocol decides which bytes go where; this module only moves them, and waits on the
//! poller when no lane can move. The deadline moves forward whenever bytes move, so
//! `timeout` bounds how long a peer may make no progress, not how long a 64 MiB collective
//! may take.

use std::time::{Duration, Instant};

use super::protocol::{Buffers, Lane};
use super::staging::LaneStage;
use super::transport::{STEP_SEND_BYTES, Transport};
use crate::comm::progress::{Drive, Spin, Wait, blame, progress};
use crate::comm::state::CloseFlag;
use crate::error::{Error, PeerOp, Phase, Result};

/// Moves as many bytes of `lane` as the sockets take. Returns whether anything moved.
fn pump(
    lane: &mut Lane,
    transport: &mut Transport,
    bufs: &mut Buffers<'_>,
    stage: &mut LaneStage,
    context: Phase,
    closed: &CloseFlag,
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
            let sent = conn.write(bytes);
            match conn.moved(sent, PeerOp::Send, context)? {
                Some(n) => lane.handle_sent(n),
                None => break,
            }
        }
        let conn = transport.conn(lane.rx());
        while let Some(target) = lane.poll_receive(bufs, stage) {
            let received = conn.read(target);
            match conn.moved(received, PeerOp::Receive, context)? {
                Some(n) => lane.handle_received(bufs, stage, n),
                None => break,
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
            // Such a lane never reaches the progress loop's check of the close flag either.
            if closed.is_set() {
                return Err(Error::Aborted { context });
            }
        }
    }
}

/// [`pump`] on io_uring for a collective of one lane: each round submits the step's send
/// and receive together and waits in the kernel for both ([`Transport::step`]), so a small
/// step costs one system call instead of a send, a receive that finds nothing, a wait and
/// the receive again. Sends above [`STEP_SEND_BYTES`] go through [`pump`] (they are sent in
/// place there), as does a connection whose first bytes still need a look. Returns whether
/// anything moved; fails the collective when the peer made no progress until `deadline`.
fn step(c: &mut Collective<'_, '_, '_, '_>) -> Result<bool> {
    let (Some(lane), Some(stage)) = (c.lanes.first_mut(), c.stages.first_mut()) else {
        return Ok(false);
    };
    let (tx, rx) = (lane.tx(), lane.rx());
    let mut any = false;
    loop {
        // A close from another thread ends the wait it interrupts (which takes the wake-up
        // with it): look at the flag before every wait, not only after one that moved
        // nothing.
        if c.closed.is_set() {
            return Err(Error::Aborted { context: c.context });
        }
        let send = match lane.poll_transmit(c.bufs, stage) {
            Some(bytes) if bytes.len() > STEP_SEND_BYTES => None,
            Some(bytes) => Some(c.transport.stage_send(bytes)),
            None => Some(0),
        };
        let Some(send) = send.filter(|_| c.transport.steps(rx)) else {
            let moved = pump(lane, c.transport, c.bufs, stage, c.context, c.closed)?;
            if moved {
                c.last_moved = Instant::now();
            }
            return Ok(any | moved);
        };
        let target = lane.poll_receive(c.bufs, stage);
        if send == 0 && target.is_none() {
            return Ok(any);
        }
        let deadline = crate::options::deadline(c.last_moved, c.timeout);
        let submitted = Instant::now();
        let stepped = c
            .transport
            .step(
                (send > 0).then_some((tx, send)),
                target.map(|t| (rx, t)),
                deadline,
                c.spin,
            )
            .map_err(|e| Error::local("a step's transfers on io_uring", e))?;
        let mut moved = false;
        if let Some(n) = c
            .transport
            .conn(tx)
            .moved(stepped.sent, PeerOp::Send, c.context)?
        {
            lane.handle_sent(n);
            // A step's send (staged, small) goes at once: its progress dates from the
            // submission, not from the end of a wait that may have run to the deadline
            // for the receive.
            c.last_moved = submitted;
            moved = true;
        }
        let received = stepped.received;
        if let Some(n) = c
            .transport
            .conn(rx)
            .moved(received, PeerOp::Receive, c.context)?
        {
            lane.handle_received(c.bufs, stage, n);
            c.last_moved = Instant::now();
            moved = true;
        }
        any |= moved;
        // Otherwise the step was cut short by a close from another thread (seen at the top
        // of the loop), or by the deadline: a peer silent for the whole timeout.
        if Instant::now() >= crate::options::deadline(c.last_moved, c.timeout) {
            return Err(c.stalled(c.timeout));
        }
    }
}

/// How often a collective that keeps moving bytes still looks at the poller.
const REFRESH: Duration = Duration::from_millis(1);

/// One collective in flight: the lanes, the memory they work on and the sockets, as
/// [`progress`] drives them.
struct Collective<'t, 'l, 'b, 'd> {
    transport: &'t mut Transport,
    lanes: &'l mut [Lane],
    bufs: &'b mut Buffers<'d>,
    stages: &'l mut [LaneStage],
    context: Phase,
    closed: &'l CloseFlag,
    /// The peer's silence [`step`] allows, and when bytes last moved.
    timeout: Duration,
    last_moved: Instant,
    /// How [`step`] waits before it sleeps in the kernel.
    spin: Spin,
}

impl Drive for Collective<'_, '_, '_, '_> {
    fn advance(&mut self) -> Result<bool> {
        if self.lanes.len() == 1 && self.transport.uring() {
            return step(self);
        }
        let mut progressed = false;
        for (lane, stage) in self.lanes.iter_mut().zip(self.stages.iter_mut()) {
            progressed |= pump(
                lane,
                self.transport,
                self.bufs,
                stage,
                self.context,
                self.closed,
            )?;
        }
        Ok(progressed)
    }

    fn finished(&self) -> bool {
        self.lanes.iter().all(Lane::finished)
    }

    fn assume_ready(&mut self) {
        // Poll by retrying the transfers themselves: a read that finds the peer's bytes
        // costs one system call, where asking the poller first costs two.
        self.transport.assume_ready();
    }

    fn wait(&mut self, until: Instant) -> Result<bool> {
        self.transport
            .wait(until)
            .map_err(|e| Error::local("waiting for the ring's sockets", e))
    }

    fn aborted(&self) -> Option<Error> {
        // The close that raised the flag also woke the poller (see `Ring::connect`).
        self.closed.is_set().then_some(Error::Aborted {
            context: self.context,
        })
    }

    /// Timing suggests a suspect ([`blame`] over what each lane waits on and when its
    /// connection last received), but only the neighbours can say which rank stalled: the
    /// transport asks them ([`Transport::inquire`]) and the verdict names the rank. A rank
    /// next to the stalled one finds it silent and names it; a rank whose neighbours both
    /// answer waits for the notice of one that found the stalled rank, passed on from rank
    /// to rank (see `ring::fail`).
    fn stalled(&mut self, timeout: Duration) -> Error {
        let transport = &mut *self.transport;
        let waits: Vec<(usize, PeerOp)> = self.lanes.iter().filter_map(Lane::waiting_on).collect();
        let suspect = blame(waits.iter().map(|&(conn, op)| Wait {
            conn,
            op,
            last: transport.conn(conn).last_receive(),
        }));
        let suspect = suspect.map_or((0, PeerOp::Receive), |w| (w.conn, w.op));
        transport.inquire(&waits, suspect, timeout, self.context)
    }
}

/// Drives `lanes` until all are finished, waiting on the poller when none can move.
///
/// `stages` holds at least one staging buffer per lane. A peer that lets `timeout` pass
/// without moving a byte fails the collective with an error naming it; a raised `closed`
/// ends it with [`Error::Aborted`].
#[allow(
    clippy::too_many_arguments,
    reason = "one call site, each argument distinct"
)]
pub(crate) fn run(
    transport: &mut Transport,
    lanes: &mut [Lane],
    bufs: &mut Buffers<'_>,
    stages: &mut [LaneStage],
    timeout: Duration,
    spin: Spin,
    context: Phase,
    closed: &CloseFlag,
) -> Result<()> {
    let mut collective = Collective {
        transport,
        lanes,
        bufs,
        stages,
        context,
        closed,
        timeout,
        last_moved: Instant::now(),
        spin,
    };
    progress(&mut collective, timeout, spin)
}
