//! TCP as a transport: the set of connections of a group, and everything that runs on them.
//!
//! - [`socket`]: listening, dialling, every socket option;
//! - [`conn`]: one connection (reads, writes, urgent bytes, the first-bytes check);
//! - [`notice`]: failure notices and inquiries, the rules without I/O;
//! - [`seal`]: sealed records for keyed connections (encrypted, authenticated, numbered),
//!   the rules without I/O;
//! - [`sys`]: the driver seam (epoll/kqueue or io_uring) behind one type;
//! - [`bootstrap`]: forming the connections (listen, dial with backoff, accept, the loop),
//!   parameterised by a handshake;
//! - [`engine`]: drives any protocol machine ([`crate::comm::machine`]) over them.
//!
//! Every connection of a group is a non-blocking socket registered once with a single
//! driver. Nothing runs between collectives: the thread that calls a collective drives the
//! loop until it is done, so there is no thread per socket, no hand-off on the hot path,
//! and the caller's buffers can be read and written in place.
//!
//! When a collective fails, [`fail`] settles whom to name and leaves the failure notices
//! (see [`notice`]): [`Connections::diagnose`] reads what the connections still hold,
//! [`Connections::inquire`] asks the neighbours after a timeout, [`Connections::abandon`]
//! leaves the notices and closes.
//!
//! With io_uring, [`Connections::step`] submits a step's send and receive together and
//! lets the receive wait in the kernel, all within one call; with more than two ranks that
//! receive takes an urgent byte first, in the kernel, so it cannot pass one (with two, a
//! notice could only name the peer, and the plain receive is cheaper).
//! [`Connections::select_io`] picks the driver.

pub(crate) mod bootstrap;
pub(crate) mod conn;
pub(crate) mod engine;
pub(crate) mod notice;
pub(crate) mod seal;
pub(crate) mod socket;
mod sys;

use std::io;
use std::net::{Shutdown, SocketAddr};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::net::TcpStream;

pub(crate) use conn::{Conn, Transfer};
use conn::{FirstBytes, MAX_IO_BYTES};
use notice::{Inquiry, Notices, Verdict};
use sys::uring::Refusal;
use sys::{Driver, Event, Source};

use crate::comm::progress::Spin;
use crate::comm::state::Guarded;
use crate::comm::trace::error_kind;
use crate::config::env::IO_VAR;
use crate::error::{Error, PeerOp, Phase};
use crate::options::Io;
use crate::verbose::verbose;

/// How long a failing rank looks for evidence of which rank was lost (see
/// [`Connections::diagnose`]).
const DIAGNOSE_WAIT: Duration = Duration::from_millis(20);

/// The timeout whose grace ([`Inquiry::grace`]) a rank gives its neighbours when one closed
/// without a notice after it had spoken (see [`Connections::diagnose`]): the connections do
/// not know the group's timeout, and this path is rare.
const RECONSIDER_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a failing rank spends leaving its failure notices and waiting for its
/// neighbours to close (see [`Connections::abandon`]).
const NOTICE_WAIT: Duration = Duration::from_millis(250);

/// What a [`Connections::step`] did: its send's and its receive's outcome, each as
/// [`Conn::write`] and [`Conn::read`] report theirs ([`Transfer::Blocked`] when it was not
/// made or was cancelled before moving a byte).
#[derive(Debug)]
pub(crate) struct Stepped {
    pub(crate) sent: io::Result<Transfer>,
    pub(crate) received: io::Result<Transfer>,
}

/// The most bytes a [`Connections::step`] sends at once: they are copied to the
/// connections' own buffer first (the protocol lends the send and the receive one at a
/// time), which costs nothing next to the system calls it saves at small sizes; larger
/// sends go out in place through [`Conn::write`].
pub(crate) const STEP_SEND_BYTES: usize = 64 << 10;

/// All connections of a group, and the driver they wait with.
///
/// Connection `i` to the left neighbour is `conns[i]`, connection `i` to the right one is
/// `conns[C + i]`; on a mesh, the connections to the other ranks follow.
#[derive(Debug)]
pub(crate) struct Connections {
    driver: Driver,
    conns: Vec<Conn>,
    connections: usize,
    /// This rank and the group's size.
    me: usize,
    ranks: usize,
    /// Whether this rank's stall verdict was only a guess ([`Verdict::Guess`]): it is
    /// reported, never announced, and a notice that arrives later replaces it.
    guessed: bool,
    /// Where a [`Connections::step`]'s send is copied ([`STEP_SEND_BYTES`] once the driver
    /// steps, allocated when it is chosen; empty otherwise).
    step_send: Vec<u8>,
    /// The driver's reports of one wait, before they are applied (kept for its storage).
    reports: Vec<(usize, Event)>,
}

impl Connections {
    /// Takes over the connections of rank `me` in a formed ring of `ranks`: `left[i]` was
    /// accepted on our address `i`, `right[i]` was opened to the right neighbour's address
    /// `i`. The native wire's mesh adds one connection to each rank that is not a neighbour:
    /// `others` holds them in increasing order of peer rank (empty for a plain ring), and
    /// they follow the neighbours' connections, from index `2C` on. Each is tuned with
    /// `liveness` (see [`socket::tune_established`]).
    pub(crate) fn mesh(
        poll: mio::Poll,
        me: usize,
        ranks: usize,
        left: Vec<(TcpStream, usize, SocketAddr)>,
        right: Vec<(TcpStream, usize, SocketAddr)>,
        others: Vec<(TcpStream, usize, SocketAddr)>,
        liveness: &socket::Liveness,
    ) -> io::Result<Self> {
        let connections = left.len();
        debug_assert!(others.windows(2).all(|w| w[0].1 < w[1].1));
        let driver = Driver::new(poll)?;
        let n = 2 * connections + others.len();
        let mut conns = Vec::with_capacity(n);
        let all = left.into_iter().chain(right).chain(others);
        for (i, (mut stream, peer, addr)) in all.enumerate() {
            socket::tune_established(&stream, liveness)?;
            driver.register(&mut stream, i)?;
            conns.push(Conn {
                stream,
                peer,
                addr,
                readable: true,
                writable: true,
                notices: Notices::new(me, ranks, peer),
                eof: false,
                reset: false,
                last_rx: Instant::now(),
                first: FirstBytes::Checked,
                unpolled: false,
                unasked: false,
                source: Source::polled(),
                seal: None,
            });
        }
        Ok(Self {
            driver,
            conns,
            connections,
            me,
            ranks,
            guessed: false,
            step_send: Vec::new(),
            // Room for every report one wait can bring (three waits per connection and
            // the waker's, or a poller's 64 events), so collectives never allocate.
            reports: Vec::with_capacity(64.max(3 * n + 1)),
        })
    }

    /// Seals connection `index` with `channel` (a keyed native connection, see [`seal`]):
    /// from now on every byte read or written on it travels in the channel's records.
    /// Before any byte moved on it after the handshake.
    pub(crate) fn seal(&mut self, index: usize, channel: Box<seal::Channel>) {
        if let Some(conn) = self.conns.get_mut(index) {
            conn.seal = Some(channel);
        }
    }

    /// Whether any connection is sealed.
    fn sealed(&self) -> bool {
        self.conns.iter().any(|c| c.seal.is_some())
    }

    /// Picks the driver `io` asks for (see [`Io`]) for this rank's connections, before any
    /// collective runs. `io` has been resolved against [`IO_VAR`] before forming began
    /// (`config::env::io`), so [`Io::Auto`] here is epoll: io_uring was not measured faster
    /// (see [`Io::Auto`]). An explicit [`Io::Uring`] (or `NUVEC_DISTRIBUTED_IO=uring`) where the kernel refuses io_uring (`ENOSYS`, `EPERM`
    /// from a sandbox's seccomp filter or `kernel.io_uring_disabled`, a kernel without timed
    /// waits) is an error saying why: no silent fallback from a driver asked for by name.
    #[cfg_attr(
        not(target_os = "linux"),
        allow(
            unreachable_code,
            reason = "io_uring is Linux's: elsewhere its handle has no values"
        )
    )]
    pub(crate) fn select_io(&mut self, io: Io) -> Result<(), Error> {
        let rank = self.rank();
        if io == Io::Uring && self.sealed() {
            return Err(sealed_on_uring());
        }
        match io {
            Io::Uring => {}
            Io::Auto => {
                verbose!(
                    rank,
                    "event loop: epoll/kqueue ({IO_VAR}=auto: io_uring was not measured faster)"
                );
                return Ok(());
            }
            Io::Epoll => {
                verbose!(rank, "event loop: epoll/kqueue ({IO_VAR}={io})");
                return Ok(());
            }
        }
        // The ring reports readiness from now on; the poller keeps only the waker.
        let sources = self
            .driver
            .use_uring(self.conns.iter_mut().map(|c| &mut c.stream))
            .map_err(|refusal| match refusal {
                Refusal::Refused(e) => Error::invalid(format!(
                    "io_uring was asked for (Options::io or {IO_VAR}) but this system refuses \
                     it: {e} (ENOSYS: no io_uring in this kernel; EPERM: a sandbox or \
                     kernel.io_uring_disabled refuses it); use Io::Epoll or Io::Auto"
                )),
                Refusal::Failed(what, e) => Error::local(what, e),
            })?;
        for (conn, source) in self.conns.iter_mut().zip(sources) {
            conn.source = source;
            conn.readable = true;
            conn.writable = true;
        }
        self.step_send = vec![0; STEP_SEND_BYTES];
        verbose!(rank, "event loop: io_uring");
        Ok(())
    }

    /// What ends a [`Connections::wait`] from another thread: waking it makes the wait
    /// return `true` (something may have changed), so the caller looks at its flags.
    pub(crate) fn waker(&self) -> Arc<mio::Waker> {
        self.driver.waker()
    }

    /// Makes every connection check the first bytes it receives for a keyed peer's greeting
    /// (see [`FirstBytes`]), for a ring formed without a key.
    pub(crate) fn check_first_bytes(&mut self) {
        for conn in &mut self.conns {
            conn.first = FirstBytes::Unchecked;
        }
    }

    /// This rank.
    pub(crate) fn rank(&self) -> usize {
        self.me
    }

    /// Connections per neighbour.
    pub(crate) fn connections(&self) -> usize {
        self.connections
    }

    /// Index of connection `i` to the left neighbour.
    pub(crate) fn left(&self, i: usize) -> usize {
        i
    }

    /// Index of connection `i` to the right neighbour.
    pub(crate) fn right(&self, i: usize) -> usize {
        self.connections + i
    }

    /// The index of the connection this rank sends to `peer` on, when each message to a
    /// peer goes out whole on one connection (the native wire). Messages both ways between
    /// two ranks share one connection ([`Connections::recv_conn`] is the same), so each data
    /// segment carries the acknowledgement of the last one received, instead of each
    /// direction's bytes and acknowledgements travelling as separate packets: the first
    /// connection to the right neighbour, else the first to the left one, else the mesh
    /// connection. With two ranks the peer is both neighbours: both use the connection
    /// rank 0 opened.
    pub(crate) fn send_conn(&self, peer: usize) -> usize {
        let size = self.ranks();
        let me = self.rank();
        if size == 2 {
            if me == 0 { self.right(0) } else { self.left(0) }
        } else if peer == (me + 1) % size {
            self.right(0)
        } else if peer == (me + size - 1) % size {
            self.left(0)
        } else {
            self.other(peer)
        }
    }

    /// The index of the connection messages from `peer` arrive on: the same as
    /// [`Connections::send_conn`]'s.
    pub(crate) fn recv_conn(&self, peer: usize) -> usize {
        self.send_conn(peer)
    }

    /// The index of the mesh connection to `peer`, a rank that is not a neighbour.
    fn other(&self, peer: usize) -> usize {
        let size = self.ranks();
        let me = self.rank();
        debug_assert!(peer != me && peer != (me + 1) % size && peer != (me + size - 1) % size);
        // The non-neighbours in increasing rank order, skipping this rank and its two
        // neighbours.
        let skipped = [me, (me + 1) % size, (me + size - 1) % size]
            .iter()
            .filter(|&&r| r < peer)
            .count();
        2 * self.connections + peer - skipped
    }

    /// The number of ranks.
    pub(crate) fn ranks(&self) -> usize {
        self.ranks
    }

    /// The connection at `index`.
    pub(crate) fn conn(&mut self, index: usize) -> &mut Conn {
        &mut self.conns[index]
    }

    /// Every connection.
    pub(crate) fn conns(&mut self) -> &mut [Conn] {
        &mut self.conns
    }

    /// Whether [`Connections::step`] can move a step on connection `rx` now: the driver
    /// steps ([`Driver::steps`]), the peer's first bytes need no look (see [`FirstBytes`]),
    /// and the neighbour has sent no urgent byte.
    ///
    /// A step's receive takes an urgent byte before it can pass the byte's position
    /// (`ffi::uring::Ring::exchange`), but once one was taken, the receive that runs linked
    /// behind it is refused at that position for as long as it is retried; the
    /// transfer-at-a-time path reads past it. A neighbour that sent one has given up on
    /// the collective anyway (see the module's documentation).
    pub(crate) fn steps(&self, rx: usize) -> bool {
        // A sealed connection moves whole records through its own buffers, which a step's
        // staged send and in-place receive bypass: it takes the transfer-at-a-time path.
        self.driver.steps()
            && self.conns.get(rx).is_some_and(|c| {
                c.first == FirstBytes::Checked && !c.notices.spoke() && c.seal.is_none()
            })
    }

    /// Whether the driver steps at all (see [`Connections::steps`] for a connection).
    pub(crate) fn can_step(&self) -> bool {
        self.driver.steps()
    }

    /// Copies what of `bytes` a [`Connections::step`] sends at once; returns how much that is.
    pub(crate) fn stage_send(&mut self, bytes: &[u8]) -> usize {
        let n = bytes.len().min(self.step_send.len());
        self.step_send[..n].copy_from_slice(&bytes[..n]);
        n
    }

    /// [`Connections::stage_send`] for a native-wire message: what fits of `head`, then of
    /// `body` behind it, so that one step sends both; returns how much that is.
    pub(crate) fn stage_send_pair(&mut self, head: &[u8], body: &[u8]) -> usize {
        let n = self.stage_send(head);
        let Some(room) = self.step_send.get_mut(n..) else {
            return n;
        };
        let m = body.len().min(room.len());
        room[..m].copy_from_slice(&body[..m]);
        n + m
    }

    /// One step's transfers in one io_uring submission (see `ffi::uring::Ring::exchange`):
    /// sends the first `send.1` bytes staged by [`Connections::stage_send`] on connection
    /// `send.0`, and receives into `recv.1` from connection `recv.0`, waiting in the kernel
    /// until both moved bytes, `deadline` passes, a connection closes or fails, or a close
    /// from another thread fires the [`Waker`]; neither is in flight when this returns. The
    /// receive takes an urgent byte on its own connection; with `look`, a wait that lasts
    /// that long ends early and the other connections are looked at for urgent bytes (a
    /// notice, a query to answer; see [`Connections::wait`]).
    ///
    /// # Errors
    ///
    /// The ring's own (the transfers' errors are in [`Stepped`]).
    pub(crate) fn step(
        &mut self,
        send: Option<(usize, usize)>,
        recv: Option<(usize, &mut [u8])>,
        (deadline, look): (Instant, Option<Duration>),
        spin: Spin,
    ) -> io::Result<Stepped> {
        let mut stepped = Stepped {
            sent: Ok(Transfer::Blocked),
            received: Ok(Transfer::Blocked),
        };
        // What was reported before the step (urgent bytes to take, queries to answer)
        // goes in before it can wait.
        let mut reports = std::mem::take(&mut self.reports);
        let woke = self.driver.before_step(|i, event| reports.push((i, event)));
        self.apply(&mut reports);
        if woke? {
            self.reports = reports;
            return Ok(stepped);
        }
        let tx = send.and_then(|(conn, n)| {
            let c = self.conns.get(conn)?;
            Some((c.stream.as_fd(), self.step_send.get(..n)?))
        });
        let rx_conn = recv.as_ref().map(|(conn, _)| *conn);
        let rx = recv.and_then(|(conn, buf)| {
            let len = buf.len().min(MAX_IO_BYTES);
            Some((self.conns.get(conn)?.stream.as_fd(), &mut buf[..len]))
        });
        // With two ranks an urgent byte can only be about the peer, whom the receive's
        // failure names anyway: the plain receive is cheaper (see `guard_urgent`).
        let guard = self.ranks > 2;
        // The step's own receive takes an urgent byte on its connection; the others are
        // looked at when a wait has lasted `look` (see `Connections::wait`).
        let look = self.urgent_look(look);
        let wait_until = look.map_or(deadline, |look| deadline.min(Instant::now() + look));
        let done = self
            .driver
            .step(tx, rx, (wait_until, spin, guard), |i, event| {
                reports.push((i, event));
            });
        let result = done.map(|done| {
            if let Some((conn, _)) = send {
                stepped.sent = self.conns[conn].settle_send(done.sent);
            }
            if let Some(conn) = rx_conn {
                if let Some(byte) = done.urgent {
                    // Before the receive's outcome: a close that follows a notice is
                    // blamed on the rank the notice names.
                    self.conns[conn].took_urgent(byte);
                }
                stepped.received = self.conns[conn].settle_receive(done.received);
            }
            stepped
        });
        // Then what was reported during the wait (after the receive's own urgent byte).
        self.apply(&mut reports);
        self.reports = reports;
        let idle = result.as_ref().is_ok_and(|s| {
            matches!(s.sent, Ok(Transfer::Blocked)) && matches!(s.received, Ok(Transfer::Blocked))
        });
        if look.is_some() && idle && Instant::now() < deadline {
            self.look_for_urgent();
        }
        result
    }

    /// Applies (and empties) the driver's `reports`, and sends the answers owed (a query
    /// reported, or an answer that found no room before).
    fn apply(&mut self, reports: &mut Vec<(usize, Event)>) {
        for (i, event) in reports.drain(..) {
            if let Some(conn) = self.conns.get_mut(i) {
                conn.ready(event);
            }
        }
        for conn in &mut self.conns {
            conn.answer();
        }
    }

    /// Blocks until some connection may have become ready, a close from another thread
    /// fires the [`Waker`], or `deadline`. Returns `false` if the deadline passed with
    /// nothing ready.
    ///
    /// With `look`, a wait on a driver that cannot report urgent bytes as they arrive
    /// (io_uring, kqueue) sleeps at most that long at a time and then looks for them
    /// ([`Connections::look_for_urgent`]): a neighbour whose collective timed out asks this
    /// rank with one, and must have its answer within its grace (see [`Inquiry`]). An
    /// urgent byte taken ends the wait as an event does.
    pub(crate) fn wait(&mut self, deadline: Instant, look: Option<Duration>) -> io::Result<bool> {
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            if self.conns.iter().any(|c| c.unpolled) {
                // A connection held back for the poller's word may hold data already, which
                // no event announces again: look without sleeping, then let the caller read.
                self.poll_once(Some(Duration::ZERO))?;
                return Ok(true);
            }
            let until = match self.urgent_look(look) {
                Some(look) => deadline.min(now + look),
                None => deadline,
            };
            if self.poll_once(Some(until - now))? {
                return Ok(true);
            }
            if until >= deadline {
                return Ok(false);
            }
            if self.look_for_urgent() {
                return Ok(true);
            }
        }
    }

    /// `look`, if some connection's urgent bytes must be looked for while it waits (see
    /// [`Connections::wait`]).
    fn urgent_look(&self, look: Option<Duration>) -> Option<Duration> {
        look.filter(|_| self.conns.iter().any(Conn::needs_urgent_look))
    }

    /// Takes the urgent byte waiting on any connection whose driver does not report them
    /// (one `recv(2)` with `MSG_OOB` each), answering a query; returns whether one was
    /// taken.
    pub(crate) fn look_for_urgent(&mut self) -> bool {
        let mut took = false;
        for conn in &mut self.conns {
            if conn.needs_urgent_look() {
                took |= conn.take_notice();
            }
        }
        took
    }

    /// Marks every connection ready, so the next transfers are tried rather than waited
    /// for; those that would block say so and are marked again.
    pub(crate) fn assume_ready(&mut self) {
        // What the driver reported already (io_uring's completions, without a system
        // call), or one look at the poller for urgent bytes before reading past a short
        // read.
        let ask = self.conns.iter().any(|c| c.unpolled);
        let mut reports = std::mem::take(&mut self.reports);
        self.driver
            .catch_up(ask, |i, event| reports.push((i, event)));
        self.apply(&mut reports);
        self.reports = reports;
        for conn in &mut self.conns {
            if ask {
                conn.unpolled = false;
            }
            conn.writable = true;
            // A driver that reports every arrival said which connections received since
            // their last empty read: retry only those; otherwise only trying tells.
            if !conn.source.reports_arrivals() {
                conn.assume_readable();
            }
        }
    }

    /// Takes in readiness changes without waiting. A collective that keeps moving bytes
    /// calls this now and then, so that a connection that closed while it was busy with
    /// others (and any failure notice on it) is seen promptly.
    pub(crate) fn refresh(&mut self) -> io::Result<()> {
        self.poll_once(Some(Duration::ZERO)).map(drop)
    }

    /// The error to report for `error`, which fails the group.
    ///
    /// A neighbour that closed may have been lost itself, or may have given up because of
    /// another rank and left a failure notice naming it. So before blaming anyone, read
    /// what every connection still holds (the group is failed, the data is of no use) for
    /// a short while, looking for notices, and for connections that were reset, as a
    /// process that dies mid-transfer resets them. A notice wins; then a reset; then
    /// `error` itself, unless it blames a neighbour that had spoken (see `reconsider`). A
    /// clean close without a notice is ambiguous, so it waits longer for a notice.
    pub(crate) fn diagnose(&mut self, error: Error) -> Error {
        let context = match &error {
            Error::Closed { context, .. } | Error::Io { context, .. } => *context,
            _ => return error,
        };
        let start = Instant::now();
        let mut until = start + DIAGNOSE_WAIT;
        let mut sink = [0u8; 16 << 10];
        loop {
            let _ = self.poll_once(Some(Duration::ZERO));
            for conn in &mut self.conns {
                conn.drain_readable();
                // Check for a notice before every read: a read may pass its mark.
                conn.take_notice();
                while conn.notices.listening()
                    && matches!(conn.read(&mut sink), Ok(Transfer::Moved(_)))
                {
                    conn.take_notice();
                }
                if let Some(lost) = conn.notices.notice() {
                    return Error::Lost {
                        peer: lost,
                        via: conn.peer,
                        context,
                    };
                }
            }
            if let Some(conn) = self.conns.iter().find(|c| c.reset) {
                return Error::Closed {
                    peer: conn.peer,
                    op: PeerOp::Receive,
                    context,
                };
            }
            let now = Instant::now();
            if now >= until {
                // A neighbour that closed cleanly without a notice may have died, or may
                // have given up on another rank with a notice this rank read past (a read
                // that starts exactly at an urgent byte skips it). This rank's other
                // neighbours pass that notice on if they got it: wait for them as long as
                // a failing rank lingers.
                let extended = start + NOTICE_WAIT;
                if matches!(error, Error::Closed { .. }) && until < extended {
                    until = extended;
                    continue;
                }
                return self.reconsider(error);
            }
            let _ = self.poll_once(Some(until - now));
        }
    }

    /// `error` again, unless it blames a neighbour that closed after it had spoken (sent a
    /// query, proving it alive after the failure began) but left no notice: that one gave
    /// up because of some other rank and its notice did not get through (its send buffer
    /// stayed full). Then ask the neighbours, as after a timeout ([`Connections::inquire`]),
    /// with the grace of a [`RECONSIDER_TIMEOUT`].
    fn reconsider(&mut self, error: Error) -> Error {
        let Error::Closed { peer, op, context } = error else {
            return error;
        };
        let Some(closed) = self
            .conns
            .iter()
            .position(|c| c.peer == peer && c.notices.spoke() && c.notices.listening() && !c.reset)
        else {
            return error;
        };
        let waits: Vec<(usize, PeerOp)> = (0..self.conns.len()).map(|i| (i, op)).collect();
        let suspect = self
            .conns
            .iter()
            .position(|c| c.peer != peer)
            .unwrap_or(closed);
        self.inquire(&waits, (suspect, op), RECONSIDER_TIMEOUT, context)
    }

    /// Waits up to `timeout` for the driver's events and applies them; returns whether
    /// anything was reported.
    fn poll_once(&mut self, timeout: Option<Duration>) -> io::Result<bool> {
        let mut reports = std::mem::take(&mut self.reports);
        let sources = self.conns.iter_mut().map(|c| {
            let Conn {
                source,
                stream,
                writable,
                ..
            } = c;
            let stream: &TcpStream = stream;
            (source, stream.as_fd(), *writable)
        });
        let any = self
            .driver
            .wait(sources, timeout, |i, event| reports.push((i, event)));
        self.apply(&mut reports);
        self.reports = reports;
        for conn in &mut self.conns {
            // Any urgent byte announced before now was taken above.
            conn.unpolled = false;
        }
        any
    }

    /// The error a failure notice already received makes, if one did and this rank's own
    /// stall verdict was only a guess (a verified verdict stands: the notices this rank
    /// gets later can only repeat it or be wrong).
    pub(crate) fn notice(&self, context: Phase) -> Option<Error> {
        if !self.guessed {
            return None;
        }
        self.conns.iter().find_map(|c| {
            c.notices.notice().map(|lost| Error::Lost {
                peer: lost,
                via: c.peer,
                context,
            })
        })
    }

    /// Closes every connection (the neighbours see them end) and releases the sockets.
    pub(crate) fn close(&mut self) {
        for conn in &mut self.conns {
            let _ = conn.stream.shutdown(Shutdown::Both);
        }
        self.conns.clear();
        self.driver.close();
    }

    /// Finds whom to blame for a collective in which nothing moved for `timeout`, and
    /// returns the error naming it: asks every neighbour whether it is alive (an urgent
    /// [`Urgent::Query`]), reads what they send back while discarding the stream (this
    /// rank's collective has failed; the data is of no use, and reading it lets a neighbour
    /// blocked on a full send buffer get its answer out), and gives what it sees to an
    /// [`Inquiry`] until that has a verdict.
    ///
    /// `waits` are the connections the collective waited on, `suspect` the one timing
    /// points at (and what was outstanding on it). A guess ([`Verdict::Guess`]) is
    /// remembered, so that [`Connections::abandon`] does not announce it.
    pub(crate) fn inquire(
        &mut self,
        waits: &[(usize, PeerOp)],
        suspect: (usize, PeerOp),
        timeout: Duration,
        context: Phase,
    ) -> Error {
        let (me, ranks) = (self.me, self.ranks);
        let suspect_peer = self.conns.get(suspect.0).map_or(me, |c| c.peer);
        let neighbours: Vec<usize> = waits
            .iter()
            .filter_map(|&(i, _)| self.conns.get(i).map(|c| c.peer))
            .collect();
        let mut inquiry =
            Inquiry::new(me, ranks, neighbours, suspect_peer, Instant::now(), timeout);
        for conn in &mut self.conns {
            // Every neighbour learns this rank is alive, including one that waits on it
            // without having asked yet; this rank's own query is its answer from now on.
            conn.notices.start_inquiry();
        }
        let mut sink = [0u8; 16 << 10];
        loop {
            let _ = self.poll_once(Some(Duration::ZERO));
            let seen = Instant::now();
            for conn in &mut self.conns {
                conn.flush_urgent();
                conn.drain_readable();
                while !conn.eof {
                    // An urgent byte must be read before the stream is read past it.
                    conn.take_notice();
                    match conn.read(&mut sink) {
                        Ok(Transfer::Moved(_)) => {}
                        Ok(Transfer::Blocked) => break,
                        Ok(Transfer::Closed) | Err(_) => {
                            conn.take_notice();
                            conn.eof = true;
                        }
                    }
                }
                inquiry.hear(&conn.notices, conn.eof, seen);
            }
            let now = Instant::now();
            if let Some(verdict) = inquiry.verdict(now) {
                return self.verdict_error(verdict, waits, suspect, timeout, context);
            }
            // Wake up now and then even without events: a query may still wait for room.
            let nap = (inquiry.next_deadline(now) - now).min(Duration::from_millis(5));
            let _ = self.poll_once(Some(nap));
        }
    }

    /// The error that states `verdict`.
    fn verdict_error(
        &mut self,
        verdict: Verdict,
        waits: &[(usize, PeerOp)],
        suspect: (usize, PeerOp),
        timeout: Duration,
        context: Phase,
    ) -> Error {
        let conn_of = |conns: &[Conn], peer: usize| {
            let index = conns
                .get(suspect.0)
                .filter(|c| c.peer == peer)
                .map(|_| suspect)
                .or_else(|| {
                    waits
                        .iter()
                        .copied()
                        .find(|&(i, _)| conns.get(i).is_some_and(|c| c.peer == peer))
                });
            index.and_then(|(i, op)| conns.get(i).map(|c| (c.addr, op)))
        };
        let timed_out = |conns: &[Conn], peer: usize| {
            let (addr, op) =
                conn_of(conns, peer).map_or((None, PeerOp::Receive), |(a, op)| (Some(a), op));
            Error::Timeout {
                peer,
                addr,
                op,
                context,
                after: timeout,
            }
        };
        match verdict {
            Verdict::Stalled(peer) => timed_out(&self.conns, peer),
            Verdict::Guess(peer) => {
                self.guessed = true;
                timed_out(&self.conns, peer)
            }
            Verdict::Closed(peer) => Error::Closed {
                peer,
                op: conn_of(&self.conns, peer).map_or(PeerOp::Receive, |(_, op)| op),
                context,
            },
            Verdict::Lost { lost, via } => Error::Lost {
                peer: lost,
                via,
                context,
            },
        }
    }

    /// Gives up on the ring after losing rank `lost`: tells every other neighbour which
    /// rank was lost, closes this rank's side of every connection, and lingers (briefly)
    /// until the neighbours have closed theirs.
    ///
    /// Closing at once means neighbours blocked on this rank fail at once instead of
    /// waiting for their timeout; the notice means they can name the rank that was really
    /// lost rather than this one. It is one TCP urgent byte holding the lost rank (so only
    /// ranks up to [`Urgent::NOTICE_MAX`] are named this way), which travels beside the
    /// stream, not in it: a peer still expecting data can never mistake it for data. A
    /// guessed stall verdict is not announced (see [`Connections::inquire`]): a wrong notice
    /// would make every rank it reaches name a healthy rank.
    ///
    /// The byte needs room in the send buffer, which the neighbour makes as it reads; so
    /// this rank reads (and discards) what arrives meanwhile, which also keeps the kernel
    /// from answering late data with a reset that would destroy the notice before the
    /// neighbour read it. A connection is closed once its notice is out, or when the wait
    /// ends. Delivery stays best effort: a receiver that reads past the byte's position
    /// before its poller reports it loses the notice, and then names this rank instead.
    pub(crate) fn abandon(&mut self, lost: Option<usize>) {
        let until = Instant::now() + NOTICE_WAIT;
        let notice = lost.filter(|_| !self.guessed);
        for conn in &mut self.conns {
            conn.drain_readable();
            if !conn.notices.abandon(notice) {
                let _ = conn.stream.shutdown(Shutdown::Write);
            }
        }
        let mut sink = [0u8; 16 << 10];
        loop {
            let mut open = 0;
            let mut pending = false;
            for conn in &mut self.conns {
                if conn.notices.notice_pending() {
                    conn.flush_urgent();
                    if conn.notices.notice_pending() {
                        pending = true;
                    } else {
                        let _ = conn.stream.shutdown(Shutdown::Write);
                    }
                }
                loop {
                    // A notice must be read before the stream is read past it, and a read
                    // that starts right at it would skip it without stopping.
                    conn.take_notice();
                    match conn.read(&mut sink) {
                        Ok(Transfer::Moved(_)) => continue,
                        Ok(Transfer::Blocked) => open += 1,
                        Ok(Transfer::Closed) | Err(_) => {}
                    }
                    break;
                }
            }
            let waiting = open > 0 || pending;
            let now = Instant::now();
            if !waiting || now >= until {
                break;
            }
            let _ = self.poll_once(Some((until - now).min(Duration::from_millis(5))));
        }
        for conn in &mut self.conns {
            let _ = conn.stream.shutdown(Shutdown::Both);
        }
    }
}

/// The error for asking for io_uring (by name: [`Io::Uring`] or [`IO_VAR`]) for a keyed
/// native group, whose connections are sealed: sealed records are read and written a
/// transfer at a time, which the io_uring driver's steps are not, so sealed groups run on
/// epoll (kqueue) for now; [`Io::Auto`] takes that.
pub(crate) fn sealed_on_uring() -> Error {
    Error::invalid(format!(
        "io_uring was asked for (Options::io or {IO_VAR}=uring), but a keyed group on the \
         native wire seals its connections, and sealed groups run on epoll for now; use \
         Io::Epoll or Io::Auto (or no key)"
    ))
}

/// Fails the group with `error` (or the lost rank a neighbour's notice names): records
/// it for later calls, and tells the neighbours, which also learn that this rank is gone.
pub(crate) fn fail<S>(conns: &mut Connections, group: &Guarded<S>, error: Error) -> Error {
    let rank = conns.rank();
    verbose!(warn: rank, "collective failed: {error}");
    ffi::probes::error(
        error.peer().map_or(u64::MAX, |p| p as u64),
        error_kind(&error),
    );
    let error = conns.diagnose(error);
    conns.abandon(error.lost_peer());
    // A stall is judged on timing; a notice that arrived while this rank was closing
    // still names the rank better than the suspicion did (the notices this rank sent
    // cannot be taken back, but its own report can be right).
    let error = match error {
        Error::Timeout { context, .. } => conns.notice(context).unwrap_or(error),
        error => error,
    };
    verbose!(warn: rank, "the group is failed: {error}");
    group.fail(error)
}

/// A group's health check over TCP: probes the connections of `state` (reached through
/// `conns`) when no collective runs, and fails the group on the first that closed or
/// failed. While a collective runs on another thread it does not wait for it: it reports
/// what the group already knows (closed, failed) and otherwise `Ok`, since the collective
/// itself is watching the connections.
pub(crate) fn health<S>(
    group: &Guarded<S>,
    conns: impl FnOnce(&mut S) -> &mut Connections,
) -> crate::error::Result<()> {
    let Some(mut state) = group.try_lock()? else {
        return Ok(());
    };
    let conns = conns(&mut state);
    let mut found = None;
    for conn in conns.conns() {
        found = match conn.probe() {
            Ok(Transfer::Closed) => Some(conn.closed(PeerOp::Receive, Phase::HealthCheck)),
            Err(e) => Some(conn.failed(PeerOp::Receive, Phase::HealthCheck, e)),
            Ok(_) => continue,
        };
        break;
    }
    match found {
        Some(error) => Err(fail(conns, group, error)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests;
