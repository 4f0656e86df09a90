//! The one protocol vocabulary: what a collective's state machine says to the engine that
//! moves its bytes, written down once for every transport (TCP byte streams, shared-memory
//! steps, RDMA work requests) and every backend (MLX's ring lanes, the native wire's
//! exchanges, JACCL's mesh and ring).
//!
//! The shape is quinn-proto's: the machine does no I/O and never waits. The engine asks it
//! what to do next (`poll_*`), does that on its transport, and tells it what happened
//! (`handle_*`); whatever the machine learns from that (a fold, the next step, the next
//! round) happens inside `handle_*` or [`Machine::take_progress`], never in the engine.
//! So one engine per transport drives every algorithm, and every algorithm can run under a
//! simulator (`comm::ring::sim`) as well as over a transport.
//!
//! # The words
//!
//! - [`Machine::poll_transmit`]`(i)`: the bytes that may go out now on send queue `i`
//!   (a TCP stream's next bytes; an RDMA send's buffer; a shared-memory step's copy
//!   source), with the link they go on, or `None` when nothing may go yet. Asking twice
//!   without a `handle_sent` in between offers the same bytes.
//! - [`Machine::handle_sent`]`(i, n)`: the first `n` of those bytes went (a partial write;
//!   a completed work request; a finished copy).
//! - [`Machine::poll_receive`]`(i)`: where the next bytes arriving on receive queue `i` must
//!   land, or `None` when the machine may not receive there now. Never empty.
//! - [`Machine::handle_received`]`(i, n)`: `n` bytes landed there; the machine folds them
//!   in or checks them (a header that differs is an error, which ends the collective).
//! - [`Machine::poll_wait`]: what the machine is blocked on, per link (a receive before a
//!   send), for the engine to blame when nothing moves for the timeout, and for transports
//!   that wait on memory rather than on a poller to know which flag to wait for.
//! - [`Machine::is_finished`]: every byte went and arrived, and the result is in place.
//! - [`Machine::take_progress`]: completes the local work the moved bytes allow, and says
//!   whether anything moved or completed since it was last asked (the engine's progress
//!   clock: the timeout bounds silence, not a collective's length).
//!
//! Queue indices are the machine's own (a ring lane is one send queue and one receive
//! queue; a native round has one per message); links are the transport's (a connection's
//! index, a queue pair, a peer's slot). Constructors live with each algorithm
//! (`comm::ring::protocol::plan_*`, `native::protocol::Exchange::one_shot`...).

use crate::error::{PeerOp, Result};

/// Bytes a machine offers to send: on `link`, `head` then `body` (a header and the data
/// behind it, sent together where the transport can; `head` is empty for bare data).
#[derive(Debug)]
pub(crate) struct Transmit<'a> {
    /// The transport's link the bytes go on.
    pub(crate) link: usize,
    /// A header that goes first (empty if none).
    pub(crate) head: &'a [u8],
    /// The data.
    pub(crate) body: &'a [u8],
}

impl Transmit<'_> {
    /// How many bytes are offered.
    pub(crate) fn len(&self) -> usize {
        self.head.len() + self.body.len()
    }
}

/// Where a machine wants the next bytes from `link` to land.
#[derive(Debug)]
pub(crate) struct Receive<'a> {
    /// The transport's link the bytes come from.
    pub(crate) link: usize,
    /// Where they land (never empty).
    pub(crate) buf: &'a mut [u8],
}

/// One collective's state machine, as an engine drives it (see the module docs).
pub(crate) trait Machine {
    /// How many send queues the machine has now (`poll_transmit` takes `0..transmits()`).
    fn transmits(&self) -> usize;

    /// How many receive queues the machine has now.
    fn receives(&self) -> usize;

    /// The bytes that may go out on send queue `i` now, or `None`.
    fn poll_transmit(&mut self, i: usize) -> Option<Transmit<'_>>;

    /// The first `n` bytes [`Machine::poll_transmit`]`(i)` offered went.
    fn handle_sent(&mut self, i: usize, n: usize);

    /// Where the next bytes on receive queue `i` must land, or `None`.
    fn poll_receive(&mut self, i: usize) -> Option<Receive<'_>>;

    /// `n` bytes landed where [`Machine::poll_receive`]`(i)` said.
    ///
    /// # Errors
    ///
    /// What the bytes reveal (a header that differs from this rank's call); it ends the
    /// collective.
    fn handle_received(&mut self, i: usize, n: usize) -> Result<()>;

    /// Appends what the machine is blocked on: per link, a receive if one is outstanding
    /// on it, else a send.
    fn poll_wait(&self, into: &mut Vec<(usize, PeerOp)>);

    /// Whether every byte went and arrived and the result is in place.
    fn is_finished(&self) -> bool;

    /// Completes the local work the moved bytes allow (folds, the next round), and says
    /// whether anything moved or completed since the last call.
    fn take_progress(&mut self) -> bool;
}
