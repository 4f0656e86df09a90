//! The ring's sockets and the one event loop that owns them.
//!
//! Every connection of a group is a non-blocking socket registered once with a single
//! `mio::Poll` (epoll on Linux, kqueue on macOS). Nothing runs between collectives: the
//! thread that calls a collective drives the loop until it is done, so there is no thread
//! per socket, no hand-off on the hot path, and the caller's buffers can be read and written
//! in place. Readiness is edge-triggered, so each connection remembers whether its last
//! read or write hit `WouldBlock` and is only retried after the poller says it changed.
//!
//! When a rank gives up on the ring it leaves a *failure notice* on its other connections:
//! one TCP urgent byte naming the rank that was lost (see [`Transport::abandon`]). A rank
//! that is not next to the lost one can then name it, instead of the neighbour that closed.
//!
//! A rank whose collective times out does not guess whom to name: it asks its neighbours
//! whether they are alive with another urgent byte, a query, and a neighbour still inside
//! its collective answers at once (see [`Transport::inquire`]; the rule for the verdict is
//! [`Inquiry`]). Only verified verdicts go out as notices. The byte values are
//! [`Urgent`]'s. Urgent bytes never enter the stream, so MLX peers, which never read them,
//! see the same bytes as before; they never answer either, so next to an MLX rank a
//! timeout names that rank, as it did before queries existed.
//!
//! On Linux the same interface also runs on io_uring ([`Io::Uring`], see [`super::uring`]):
//! each read and write is one io_uring operation that completes within the call (the buffer
//! contract of `ffi::uring`), and waits are io_uring polls, including a standing `POLLPRI`
//! poll per connection for urgent bytes. [`Transport::step`] also submits a ring step's
//! send and receive together and lets the receive wait in the kernel, all within one call;
//! with more than two ranks that receive takes an urgent byte first, in the kernel, so it
//! cannot pass one (with two, a notice could only name the peer, and the plain receive is
//! cheaper).
//! [`Transport::select_io`] picks the driver.
//!
//! A read that stops short may have stopped at an urgent byte's position, and the next read
//! would skip the byte (the kernel then drops it). Rather than asking for the byte after every
//! short read (a system call each), the transport asks the poller, which reports urgent data
//! itself (epoll's `EPOLLPRI`, io_uring's `POLLPRI` poll): with epoll the connection is not
//! read again until the poller has been asked; with io_uring the standing poll's completion
//! is already there when the read returns, and is looked at without a system call.
//!
//! TCP keeps one urgent byte per direction: a second one sent before the receiver read
//! past the first one's position turns the first into a stream byte. Queries, answers
//! and notices are only sent once a collective has failed on the sending side (the answer
//! to a query included: the querier is failing), and the receiver reads them as soon as
//! its poller reports them, so a stray byte could only reach a stream whose sender has
//! already given up on it.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token, Waker};
use socket2::SockRef;

use super::uring::{self, Shared, events};
use crate::auth;
use crate::comm::progress::Spin;
use crate::comm::progress::{Inquiry, Urgent, Verdict, notice_names};
use crate::error::{Error, PeerOp, Phase};
use crate::options::{IO_VAR, Io};
use crate::verbose::verbose;

/// At most this many bytes per `read`/`write` call: macOS rejects lengths above `INT_MAX`.
const MAX_IO_BYTES: usize = 1 << 30;

/// How long a failing rank looks for evidence of which rank was lost (see
/// [`Transport::diagnose`]).
const DIAGNOSE_WAIT: Duration = Duration::from_millis(20);

/// The timeout whose grace ([`Inquiry::grace`]) a rank gives its neighbours when one closed
/// without a notice after it had spoken (see [`Transport::diagnose`]): the transport does
/// not know the group's timeout, and this path is rare.
const RECONSIDER_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a failing rank spends leaving its failure notices and waiting for its
/// neighbours to close (see [`Transport::abandon`]).
const NOTICE_WAIT: Duration = Duration::from_millis(250);

/// The poller token of the [`Waker`] that [`Group::close`](crate::Group::close) from another
/// thread uses to end a wait (connections are numbered from 0).
const WAKE: Token = Token(usize::MAX);

/// What every connection is registered for. On Linux that includes urgent data, which is
/// how a failure notice announces itself.
fn interest() -> Interest {
    let interest = Interest::READABLE | Interest::WRITABLE;
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let interest = interest | Interest::PRIORITY;
    interest
}

/// One TCP connection to a neighbour.
#[derive(Debug)]
pub(crate) struct Conn {
    stream: TcpStream,
    /// The neighbour's rank.
    pub(crate) peer: usize,
    /// The neighbour's address, for errors.
    pub(crate) addr: SocketAddr,
    readable: bool,
    writable: bool,
    /// This rank and the ring's size, to check that a notice names a third rank.
    me: usize,
    ranks: usize,
    /// The rank named by the neighbour's failure notice, once one arrived.
    notice: Option<usize>,
    /// Whether the neighbour sent any urgent byte: its process ran after a collective
    /// failed somewhere, so it is not the stalled one.
    spoke: bool,
    /// Whether the neighbour asked and is owed an answer.
    owe_answer: bool,
    /// Whether this side still answers queries: not once it sends urgent bytes of its own.
    answering: bool,
    /// Whether this side's query is still to be sent (it waits for room).
    query_pending: bool,
    /// Whether the neighbour closed its side (seen while diagnosing).
    eof: bool,
    /// When bytes last arrived on this connection (or when it was set up).
    last_rx: Instant,
    /// Whether the peer reset the connection: a process that dies with unread data does
    /// that, while a rank that gives up closes cleanly (see [`Transport::abandon`]).
    reset: bool,
    /// Whether the first bytes received still need a look (see [`FirstBytes`]).
    first: FirstBytes,
    /// Whether a short read may have stopped at an urgent byte that the poller has not yet
    /// been asked about: the connection is not read until it has.
    unpolled: bool,
    /// The io_uring driver, if it drives this connection.
    uring: Option<Shared>,
    /// This connection's index in the transport (its io_uring wait tokens derive from it).
    slot: usize,
    /// Which of its io_uring waits are armed: readable, writable, urgent data.
    armed: [bool; 3],
}

/// The check a rank without a key makes of the first bytes each connection delivers, once
/// per connection: a keyed peer greets first (see [`crate::auth`]), so [`auth::MAGIC`]
/// there means the peer has a key and this rank has none, or, followed by
/// [`auth::NATIVE_VERSION`], that the peer runs the native wire; those bytes must never be
/// taken for data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FirstBytes {
    /// Nothing to check: the handshake ran, or the check passed.
    Checked,
    /// Not looked at yet.
    Unchecked,
    /// They were a keyed peer's greeting: every read fails.
    KeyedPeer,
    /// They were a native-wire rank's hello (the magic, then [`auth::NATIVE_VERSION`]):
    /// every read fails.
    NativePeer,
}

/// The result of one non-blocking transfer attempt.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Transfer {
    /// This many bytes moved (never zero).
    Moved(usize),
    /// The socket has nothing to give or no room; wait for readiness.
    Blocked,
    /// The peer closed the connection.
    Closed,
}

impl Conn {
    /// The error for this peer closing the connection: the rank its failure notice names,
    /// if it left one, else the peer itself.
    pub(crate) fn closed(&mut self, op: PeerOp, context: Phase) -> Error {
        self.take_notice();
        match self.notice {
            Some(lost) => Error::Lost {
                peer: lost,
                via: self.peer,
                context,
            },
            None => Error::Closed {
                peer: self.peer,
                op,
                context,
            },
        }
    }

    /// What a transfer `op` on this connection did, as a collective takes it: the bytes
    /// it moved, `None` if it would block, or the error naming the peer (a close, see
    /// [`Conn::closed`]; a failure, see [`Conn::failed`]).
    pub(crate) fn moved(
        &mut self,
        transfer: io::Result<Transfer>,
        op: PeerOp,
        context: Phase,
    ) -> crate::error::Result<Option<usize>> {
        match transfer {
            Ok(Transfer::Moved(n)) => Ok(Some(n)),
            Ok(Transfer::Blocked) => Ok(None),
            Ok(Transfer::Closed) => Err(self.closed(op, context)),
            Err(e) => Err(self.failed(op, context, e)),
        }
    }

    /// The error for a failed system call on this connection.
    pub(crate) fn failed(&self, op: PeerOp, context: Phase, e: io::Error) -> Error {
        if self.first == FirstBytes::NativePeer {
            return Error::PeerIncompatible {
                peer: self.peer,
                addr: Some(self.addr),
                context,
                reason: format!(
                    "rank {} runs the native wire and this rank the MLX wire: the peer's first \
                     bytes on this connection are its native hello; set the same {} (or \
                     Options::wire) on every rank",
                    self.peer,
                    crate::config::env::WIRE_VAR
                ),
            };
        }
        if self.first == FirstBytes::KeyedPeer {
            return Error::PeerIncompatible {
                peer: self.peer,
                addr: Some(self.addr),
                context,
                reason: format!(
                    "rank {} has a key ({}) and this rank has none: the peer's first bytes on \
                     this connection are its handshake; set the same key on every rank, or none",
                    self.peer,
                    auth::KEY_VAR
                ),
            };
        }
        Error::Io {
            peer: self.peer,
            addr: Some(self.addr),
            op,
            context,
            source: Arc::new(e),
        }
    }

    /// When bytes last arrived on this connection.
    pub(crate) fn last_receive(&self) -> Instant {
        self.last_rx
    }

    /// Reads a pending urgent byte (a notice, a query or an answer; see [`Urgent`]) and
    /// answers a query. Urgent data never enters the byte stream, so MLX peers, which never
    /// ask for it, are unaffected; but the kernel drops it once the stream is read past its
    /// position, so it is read as soon as the poller reports it.
    fn take_notice(&mut self) {
        // Asking is what a short read left owed (see `unpolled`).
        self.unpolled = false;
        if self.notice.is_some() {
            // The neighbour gave up; nothing it sends after that matters.
            return;
        }
        if let Ok(Some(byte)) = ffi::net::recv_urgent_byte(self.stream.as_fd()) {
            self.took_urgent(byte);
        }
    }

    /// Acts on the urgent byte `byte` read from this connection: keeps a notice, answers a
    /// query.
    fn took_urgent(&mut self, byte: u8) {
        self.spoke = true;
        if self.notice.is_some() {
            return;
        }
        match Urgent::decode(byte) {
            Urgent::Notice(lost) => {
                self.notice = notice_names(lost, self.peer, self.me, self.ranks);
            }
            Urgent::Query => {
                self.owe_answer = true;
                self.answer();
            }
            Urgent::Alive => {}
        }
    }

    /// Sends the answer a query is owed, if there is room for it (else it is tried again
    /// when the socket becomes writable).
    fn answer(&mut self) {
        if !(self.owe_answer && self.answering) {
            return;
        }
        if self.send_urgent(Urgent::Alive) != Some(io::ErrorKind::WouldBlock) {
            self.owe_answer = false;
        }
    }

    /// Sends `what` as this connection's urgent byte; returns the error's kind if that
    /// failed (`WouldBlock`: no room in the send buffer yet).
    fn send_urgent(&self, what: Urgent) -> Option<io::ErrorKind> {
        let byte = what.encode()?;
        SockRef::from(&self.stream)
            .send_out_of_band(&[byte])
            .err()
            .map(|e| e.kind())
    }

    /// Reads what is available into `buf`, which is not empty.
    pub(crate) fn read(&mut self, buf: &mut [u8]) -> io::Result<Transfer> {
        if !self.readable || self.unpolled {
            return Ok(Transfer::Blocked);
        }
        if self.first != FirstBytes::Checked
            && let Some(early) = self.check_first_bytes(buf.len())?
        {
            return Ok(early);
        }
        let len = buf.len().min(MAX_IO_BYTES);
        if self
            .uring
            .as_ref()
            .is_some_and(|ring| ring.take_urgent(uring::token(self.slot, 2)))
        {
            // Reported before this read: take it before the read can pass its position.
            self.take_notice();
        }
        loop {
            let read = match &self.uring {
                Some(ring) => ring
                    .recv(self.stream.as_fd(), &mut buf[..len])
                    .map(|(n, rest)| {
                        // The kernel said the socket is empty now, and the standing
                        // arrival wait reports the next bytes: wait for that rather than
                        // spend a system call on a receive that would find nothing.
                        if n > 0 && !rest && self.armed[0] {
                            self.readable = false;
                        }
                        n
                    }),
                None => self.stream.read(&mut buf[..len]),
            };
            if matches!(read, Ok(n) if n > 0) {
                self.last_rx = Instant::now();
            }
            return match read {
                Ok(0) => Ok(Transfer::Closed),
                Ok(n) if n < len => {
                    // A read stops short at a pending urgent byte; the next one would skip
                    // it and the kernel would drop it. The poller reports the byte (see the
                    // module's documentation): io_uring's report is already in, epoll's is
                    // fetched before this connection is read again.
                    match &self.uring {
                        Some(ring) => {
                            if ring.take_urgent(uring::token(self.slot, 2)) {
                                self.take_notice();
                            }
                        }
                        None => self.unpolled = true,
                    }
                    Ok(Transfer::Moved(n))
                }
                Ok(n) => Ok(Transfer::Moved(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.readable = false;
                    Ok(Transfer::Blocked)
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // A peer that dies with unread data in its buffers resets the connection.
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                    self.reset = true;
                    Ok(Transfer::Closed)
                }
                Err(e) => Err(e),
            };
        }
    }

    /// Looks at the first bytes the peer sent, without taking them (see [`FirstBytes`]).
    /// `Some` is what the read returns instead of reading; `Err` a keyed peer, which
    /// [`Conn::failed`] names. `wanted` is how many bytes the read asks for: while fewer than
    /// 8 bytes have arrived and they match the magic so far, the check waits for more only if
    /// the read needs more anyway, so it never holds back data the caller could finish with.
    #[cold]
    fn check_first_bytes(&mut self, wanted: usize) -> io::Result<Option<Transfer>> {
        if matches!(self.first, FirstBytes::KeyedPeer | FirstBytes::NativePeer) {
            return Err(io::Error::other(
                "the peer's first bytes are a handshake this rank does not run",
            ));
        }
        // The magic and the version byte after it, which tells a native hello from a keyed
        // greeting.
        let mut first = [0u8; auth::MAGIC.len() + 1];
        let n = loop {
            match self.stream.peek(&mut first) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.readable = false;
                    return Ok(Some(Transfer::Blocked));
                }
                // The read that follows reports the failure or the close.
                Err(_) => return Ok(None),
            }
        };
        if n == 0 {
            return Ok(None);
        }
        let greeting = auth::greeting(&first[..n]);
        if greeting == auth::Greeting::Keyed && n == auth::MAGIC.len() && wanted > n {
            // The version byte is still to come; a native hello and a keyed greeting are each
            // sent in one write, so it follows at once.
            self.readable = false;
            return Ok(Some(Transfer::Blocked));
        }
        match greeting {
            auth::Greeting::Keyed => {
                self.first = if first[..n].get(auth::MAGIC.len()) == Some(&auth::NATIVE_VERSION) {
                    FirstBytes::NativePeer
                } else {
                    FirstBytes::KeyedPeer
                };
                // Tells the peer, still in its handshake, why this rank leaves, so it fails at
                // once naming this rank rather than at its timeout (a native rank reads it as
                // a rank on the MLX wire without a key). Best effort.
                let _ = self.stream.write(&auth::NO_KEY);
                Err(io::Error::other(
                    "the peer's first bytes are a handshake this rank does not run",
                ))
            }
            auth::Greeting::Undecided if wanted > n => {
                self.readable = false;
                Ok(Some(Transfer::Blocked))
            }
            auth::Greeting::Data | auth::Greeting::Undecided => {
                self.first = FirstBytes::Checked;
                Ok(None)
            }
        }
    }

    /// Writes what fits from `buf`, which is not empty.
    pub(crate) fn write(&mut self, buf: &[u8]) -> io::Result<Transfer> {
        if !self.writable {
            return Ok(Transfer::Blocked);
        }
        let len = buf.len().min(MAX_IO_BYTES);
        loop {
            let written = match &self.uring {
                Some(ring) => ring.send(self.stream.as_fd(), &buf[..len]),
                None => self.stream.write(&buf[..len]),
            };
            return match written {
                Ok(0) => Ok(Transfer::Closed),
                Ok(n) => Ok(Transfer::Moved(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.writable = false;
                    Ok(Transfer::Blocked)
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                    self.reset = true;
                    Ok(Transfer::Closed)
                }
                Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(Transfer::Closed),
                Err(e) => Err(e),
            };
        }
    }

    /// Writes what it can of `head` then `body` with one system call (the native wire's
    /// header and the data behind it), as [`Conn::write`] does for one buffer.
    pub(crate) fn write_pair(&mut self, head: &[u8], body: &[u8]) -> io::Result<Transfer> {
        if head.is_empty() {
            return self.write(body);
        }
        if !self.writable {
            return Ok(Transfer::Blocked);
        }
        let body = &body[..body.len().min(MAX_IO_BYTES)];
        let bufs = [io::IoSlice::new(head), io::IoSlice::new(body)];
        loop {
            let written = match &self.uring {
                Some(ring) => ring.send_pair(self.stream.as_fd(), head, body),
                None => self.stream.write_vectored(&bufs),
            };
            return match written {
                Ok(0) => Ok(Transfer::Closed),
                Ok(n) => Ok(Transfer::Moved(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.writable = false;
                    Ok(Transfer::Blocked)
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                    self.reset = true;
                    Ok(Transfer::Closed)
                }
                Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(Transfer::Closed),
                Err(e) => Err(e),
            };
        }
    }

    /// Copies what the peer sent into `buf` without consuming it (non-blocking): the
    /// shared-memory path looks at a header that arrives while it waits elsewhere.
    pub(crate) fn peek(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.stream.peek(buf)
    }

    /// Whether the peer is still there: a non-blocking peek that does not consume data.
    pub(crate) fn probe(&mut self) -> io::Result<Transfer> {
        let mut byte = [0u8; 1];
        match self.stream.peek(&mut byte) {
            Ok(0) => Ok(Transfer::Closed),
            Ok(n) => Ok(Transfer::Moved(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(Transfer::Blocked),
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => Ok(Transfer::Closed),
            Err(e) => Err(e),
        }
    }

    /// What a [`Transport::step`]'s receive did, as [`Conn::read`] reports it (`None`:
    /// it was not made, or was cancelled before it moved a byte).
    fn settle_receive(&mut self, done: Option<io::Result<(usize, bool)>>) -> io::Result<Transfer> {
        match done {
            None => Ok(Transfer::Blocked),
            Some(Ok((0, _))) => Ok(Transfer::Closed),
            Some(Ok((n, _))) => {
                self.last_rx = Instant::now();
                Ok(Transfer::Moved(n))
            }
            Some(Err(e)) => match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(Transfer::Blocked),
                io::ErrorKind::ConnectionReset => {
                    self.reset = true;
                    Ok(Transfer::Closed)
                }
                _ => Err(e),
            },
        }
    }

    /// What a [`Transport::step`]'s send did, as [`Conn::write`] reports it.
    fn settle_send(&mut self, done: Option<io::Result<usize>>) -> io::Result<Transfer> {
        match done {
            None => Ok(Transfer::Blocked),
            Some(Ok(0)) => Ok(Transfer::Closed),
            Some(Ok(n)) => Ok(Transfer::Moved(n)),
            Some(Err(e)) => match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(Transfer::Blocked),
                io::ErrorKind::ConnectionReset => {
                    self.reset = true;
                    Ok(Transfer::Closed)
                }
                io::ErrorKind::BrokenPipe => Ok(Transfer::Closed),
                _ => Err(e),
            },
        }
    }
}

/// What a [`Transport::step`] did: its send's and its receive's outcome, each as
/// [`Conn::write`] and [`Conn::read`] report theirs ([`Transfer::Blocked`] when it was not
/// made or was cancelled before moving a byte).
#[derive(Debug)]
pub(crate) struct Stepped {
    pub(crate) sent: io::Result<Transfer>,
    pub(crate) received: io::Result<Transfer>,
}

/// The most bytes a [`Transport::step`] sends at once: they are copied to the transport's
/// own buffer first (the protocol lends the send and the receive one at a time), which costs
/// nothing next to the system calls it saves at small sizes; larger sends go out in place
/// through [`Conn::write`].
pub(crate) const STEP_SEND_BYTES: usize = 64 << 10;

/// Applies what an io_uring wait reported to the connections; returns whether it was the
/// close waker's.
fn apply(conns: &mut [Conn], ready: uring::Ready) -> bool {
    if ready.token == uring::WAKE_TOKEN {
        return true;
    }
    let (index, kind) = uring::parse_token(ready.token);
    let Some(conn) = conns.get_mut(index) else {
        return false;
    };
    if ready.ended {
        conn.armed[kind as usize] = false;
    }
    let failed = ready.events & (events::ERR | events::HUP) != 0;
    if kind == 0 || failed {
        conn.readable = true;
    }
    if kind == 1 || failed {
        conn.writable = true;
    }
    if uring::announces_urgent(ready.token, ready.events) {
        conn.take_notice();
    }
    false
}

/// The `poll(2)` events of each io_uring wait of a connection: arrivals (data or a close),
/// room to write, urgent data.
const ARRIVALS: [u32; 3] = [events::IN | events::RDHUP, events::OUT, events::PRI];

/// All connections of a ring, and the poller they are registered with.
///
/// Connection `i` to the left neighbour is `conns[i]`, connection `i` to the right one is
/// `conns[C + i]`.
#[derive(Debug)]
pub(crate) struct Transport {
    poll: Poll,
    events: Events,
    conns: Vec<Conn>,
    connections: usize,
    /// Wakes a thread blocked in [`Transport::wait`]; registered once, fired by a close.
    waker: Arc<Waker>,
    /// Whether this rank's stall verdict was only a guess ([`Verdict::Guess`]): it is
    /// reported, never announced, and a notice that arrives later replaces it.
    guessed: bool,
    /// The io_uring driver, if it drives the connections (else `poll` does).
    uring: Option<Shared>,
    /// Whether the io_uring wait on `poll` (which then holds only the [`Waker`]) is armed.
    wake_armed: bool,
    /// Where a [`Transport::step`]'s send is copied ([`STEP_SEND_BYTES`] with io_uring,
    /// allocated once when it is chosen; empty otherwise).
    step_send: Vec<u8>,
}

impl Transport {
    /// Takes over the connections of rank `me` in a formed ring of `ranks`: `left[i]` was
    /// accepted on our address `i`, `right[i]` was opened to the right neighbour's address
    /// `i`. Each is tuned with `liveness` (see [`crate::tcp::tune_established`]).
    pub(crate) fn new(
        poll: Poll,
        me: usize,
        ranks: usize,
        left: Vec<(TcpStream, usize, SocketAddr)>,
        right: Vec<(TcpStream, usize, SocketAddr)>,
        liveness: &crate::tcp::Liveness,
    ) -> io::Result<Self> {
        Self::mesh(poll, me, ranks, left, right, Vec::new(), liveness)
    }

    /// As [`Transport::new`], plus one connection to each rank that is not a neighbour
    /// (the native wire's mesh): `others` holds them in increasing order of peer rank, and
    /// they follow the neighbours' connections, from index `2C` on.
    pub(crate) fn mesh(
        poll: Poll,
        me: usize,
        ranks: usize,
        left: Vec<(TcpStream, usize, SocketAddr)>,
        right: Vec<(TcpStream, usize, SocketAddr)>,
        others: Vec<(TcpStream, usize, SocketAddr)>,
        liveness: &crate::tcp::Liveness,
    ) -> io::Result<Self> {
        let connections = left.len();
        debug_assert!(others.windows(2).all(|w| w[0].1 < w[1].1));
        let waker = Arc::new(Waker::new(poll.registry(), WAKE)?);
        let mut conns = Vec::with_capacity(2 * connections + others.len());
        let all = left.into_iter().chain(right).chain(others);
        for (i, (mut stream, peer, addr)) in all.enumerate() {
            crate::tcp::tune_established(&stream, liveness)?;
            poll.registry()
                .register(&mut stream, Token(i), interest())?;
            conns.push(Conn {
                stream,
                peer,
                addr,
                readable: true,
                writable: true,
                me,
                ranks,
                notice: None,
                spoke: false,
                owe_answer: false,
                answering: true,
                query_pending: false,
                eof: false,
                reset: false,
                last_rx: Instant::now(),
                first: FirstBytes::Checked,
                unpolled: false,
                uring: None,
                slot: i,
                armed: [false; 3],
            });
        }
        Ok(Self {
            poll,
            events: Events::with_capacity(64),
            conns,
            connections,
            waker,
            guessed: false,
            uring: None,
            wake_armed: false,
            step_send: Vec::new(),
        })
    }

    /// Picks the driver `io` asks for (see [`Io`]) for this rank's connections, before any
    /// collective runs. [`Io::Auto`] takes [`IO_VAR`] if set, else epoll: io_uring was not
    /// measured faster (see [`Io::Auto`]). An explicit [`Io::Uring`] (or
    /// `NUVEC_DISTRIBUTED_IO=uring`) where the kernel refuses io_uring (`ENOSYS`, `EPERM`
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
        let io = match io {
            Io::Auto => match std::env::var(IO_VAR) {
                Ok(text) => text.parse().map_err(|reason| Error::Environment {
                    var: IO_VAR,
                    reason,
                })?,
                Err(std::env::VarError::NotPresent) => Io::Auto,
                Err(std::env::VarError::NotUnicode(text)) => {
                    return Err(Error::Environment {
                        var: IO_VAR,
                        reason: format!("{text:?} is not text"),
                    });
                }
            },
            io => io,
        };
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
        let ring = Shared::new(self.conns.len()).map_err(|e| {
            Error::invalid(format!(
                "io_uring was asked for (Options::io or {IO_VAR}) but this system refuses \
                 it: {e} (ENOSYS: no io_uring in this kernel; EPERM: a sandbox or \
                 kernel.io_uring_disabled refuses it); use Io::Epoll or Io::Auto"
            ))
        })?;
        for (i, conn) in self.conns.iter_mut().enumerate() {
            // The ring reports readiness now; the poller keeps only the waker.
            self.poll
                .registry()
                .deregister(&mut conn.stream)
                .map_err(|e| Error::local("handing a connection to io_uring", e))?;
            // As epoll's registration did: arrivals (data, a close, urgent data) are
            // reported from the start, whether or not a read is outstanding on the
            // connection. They go in with the first transfer.
            for kind in [0, 2] {
                ring.poll(
                    conn.stream.as_fd(),
                    uring::token(i, kind),
                    ARRIVALS[kind as usize],
                    true,
                )
                .map_err(|e| Error::local("arming io_uring's waits", e))?;
                conn.armed[kind as usize] = true;
            }
            conn.uring = Some(ring.clone());
            conn.readable = true;
            conn.writable = true;
        }
        self.uring = Some(ring);
        self.step_send = vec![0; STEP_SEND_BYTES];
        verbose!(rank, "event loop: io_uring");
        Ok(())
    }

    /// What ends a [`Transport::wait`] from another thread: waking it makes the wait
    /// return `true` (something may have changed), so the caller looks at its flags.
    pub(crate) fn waker(&self) -> Arc<Waker> {
        self.waker.clone()
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
        self.conns.first().map_or(0, |c| c.me)
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
    /// two ranks share one connection ([`Transport::recv_conn`] is the same), so each data
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
    /// [`Transport::send_conn`]'s.
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
        self.conns.first().map_or(1, |c| c.ranks)
    }

    /// The connection at `index`.
    pub(crate) fn conn(&mut self, index: usize) -> &mut Conn {
        &mut self.conns[index]
    }

    /// Every connection.
    pub(crate) fn conns(&mut self) -> &mut [Conn] {
        &mut self.conns
    }

    /// Whether io_uring drives the connections.
    pub(crate) fn uring(&self) -> bool {
        self.uring.is_some()
    }

    /// Whether [`Transport::step`] can receive on connection `rx` now: io_uring drives the
    /// connections, the peer's first bytes need no look (see [`FirstBytes`]), and the
    /// neighbour has sent no urgent byte.
    ///
    /// A step's receive takes an urgent byte before it can pass the byte's position
    /// (`ffi::uring::Ring::exchange`), but once one was taken, the receive that runs linked
    /// behind it is refused at that position for as long as it is retried; the
    /// transfer-at-a-time path reads past it. A neighbour that sent one has given up on
    /// the collective anyway (see the module's documentation).
    pub(crate) fn steps(&self, rx: usize) -> bool {
        self.uring.is_some()
            && self
                .conns
                .get(rx)
                .is_some_and(|c| c.first == FirstBytes::Checked && !c.spoke)
    }

    /// Copies what of `bytes` a [`Transport::step`] sends at once; returns how much that is.
    pub(crate) fn stage_send(&mut self, bytes: &[u8]) -> usize {
        let n = bytes.len().min(self.step_send.len());
        self.step_send[..n].copy_from_slice(&bytes[..n]);
        n
    }

    /// [`Transport::stage_send`] for a native-wire message: what fits of `head`, then of
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
    /// sends the first `send.1` bytes staged by [`Transport::stage_send`] on connection
    /// `send.0`, and receives into `recv.1` from connection `recv.0`, waiting in the kernel
    /// until both moved bytes, `deadline` passes, or a close from another thread fires the
    /// [`Waker`]; neither is in flight when this returns. Urgent bytes reported before and
    /// during the wait are taken (a notice, a query to answer).
    ///
    /// # Errors
    ///
    /// The ring's own (the transfers' errors are in [`Stepped`]).
    pub(crate) fn step(
        &mut self,
        send: Option<(usize, usize)>,
        recv: Option<(usize, &mut [u8])>,
        deadline: Instant,
        spin: Spin,
    ) -> io::Result<Stepped> {
        let Some(ring) = self.uring.clone() else {
            return Err(io::Error::other("a step without io_uring"));
        };
        let mut woke = self.take_uring_reports(&ring);
        if !self.wake_armed {
            ring.poll(
                self.poll.registry().as_fd(),
                uring::WAKE_TOKEN,
                events::IN,
                false,
            )?;
            self.wake_armed = true;
        }
        let mut stepped = Stepped {
            sent: Ok(Transfer::Blocked),
            received: Ok(Transfer::Blocked),
        };
        if !woke {
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
            let guard = self.ranks() > 2;
            let done = ring.exchange(tx, rx, deadline, (uring::WAKE_TOKEN, spin, guard))?;
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
            woke = self.take_uring_reports(&ring);
        }
        if woke {
            // As in `poll_uring`: the waker's event is taken, its wait armed anew later.
            self.wake_armed = false;
            let _ = self.poll.poll(&mut self.events, Some(Duration::ZERO));
        }
        Ok(stepped)
    }

    /// Applies what io_uring reported so far, without a system call, and answers the
    /// queries that asks; returns whether the close waker fired.
    fn take_uring_reports(&mut self, ring: &Shared) -> bool {
        let mut woke = false;
        let conns = &mut self.conns;
        ring.take_ready(|ready| woke |= apply(conns, ready));
        for conn in &mut self.conns {
            if conn.owe_answer {
                conn.answer();
            }
        }
        woke
    }

    /// Blocks until some connection may have become ready, a close from another thread
    /// fires the [`Waker`], or `deadline`. Returns `false` if the deadline passed with
    /// nothing ready.
    pub(crate) fn wait(&mut self, deadline: Instant) -> io::Result<bool> {
        let now = Instant::now();
        if now >= deadline {
            return Ok(false);
        }
        if self.conns.iter().any(|c| c.unpolled) {
            // A connection held back for the poller's word may hold data already, which no
            // event announces again: look without sleeping, then let the caller read.
            self.poll_once(Some(Duration::ZERO))?;
            return Ok(true);
        }
        self.poll_once(Some(deadline - now))
    }

    /// Marks every connection ready, so the next transfers are tried rather than waited
    /// for; those that would block say so and are marked again.
    pub(crate) fn assume_ready(&mut self) {
        if let Some(ring) = self.uring.clone() {
            // The arrival waits stand (multishot), so the completion queue already says
            // which connections received since their last empty read: retry only those,
            // and without a system call to find out.
            let mut woke = false;
            let conns = &mut self.conns;
            ring.take_ready(|ready| woke |= apply(conns, ready));
            for conn in &mut self.conns {
                conn.writable = true;
                if !conn.armed[0] {
                    // No standing wait (it ended): only trying tells.
                    conn.readable = true;
                }
                if conn.owe_answer {
                    conn.answer();
                }
            }
            if woke {
                self.wake_armed = false;
                let _ = self.poll.poll(&mut self.events, Some(Duration::ZERO));
            }
            return;
        }
        if self.conns.iter().any(|c| c.unpolled) {
            // One look at the poller for urgent bytes before reading past a short read.
            let _ = self.poll_once(Some(Duration::ZERO));
        }
        for conn in &mut self.conns {
            conn.readable = true;
            conn.writable = true;
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
                conn.readable = true;
                // Check for a notice before every read: a read may pass its mark.
                conn.take_notice();
                while conn.notice.is_none()
                    && matches!(conn.read(&mut sink), Ok(Transfer::Moved(_)))
                {
                    conn.take_notice();
                }
                if let Some(lost) = conn.notice {
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
    /// stayed full). Then ask the neighbours, as after a timeout ([`Transport::inquire`]),
    /// with the grace of a [`RECONSIDER_TIMEOUT`].
    fn reconsider(&mut self, error: Error) -> Error {
        let Error::Closed { peer, op, context } = error else {
            return error;
        };
        let Some(closed) = self
            .conns
            .iter()
            .position(|c| c.peer == peer && c.spoke && c.notice.is_none() && !c.reset)
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

    fn poll_once(&mut self, timeout: Option<Duration>) -> io::Result<bool> {
        if let Some(ring) = self.uring.clone() {
            return self.poll_uring(&ring, timeout);
        }
        let any = self.poll_epoll(timeout)?;
        for conn in &mut self.conns {
            // Any urgent byte announced before now was taken above.
            conn.unpolled = false;
        }
        Ok(any)
    }

    /// [`Transport::poll_once`] with io_uring: arms the waits that readiness needs (a
    /// connection already marked ready needs none; the urgent-data wait stands), waits, and
    /// applies what they report.
    fn poll_uring(&mut self, ring: &Shared, timeout: Option<Duration>) -> io::Result<bool> {
        for (i, conn) in self.conns.iter_mut().enumerate() {
            // Arrivals and urgent data are watched all the time (multishot: one report per
            // arrival, as edge-triggered epoll gives); room to write only when a write found
            // none (one-shot: room stays, and would be reported at every wait).
            let wanted = [true, !conn.writable, true];
            for kind in 0..3 {
                if wanted[kind] && !conn.armed[kind] {
                    ring.poll(
                        conn.stream.as_fd(),
                        uring::token(i, kind as u32),
                        ARRIVALS[kind],
                        kind != 1,
                    )?;
                    conn.armed[kind] = true;
                }
            }
        }
        if !self.wake_armed {
            ring.poll(
                self.poll.registry().as_fd(),
                uring::WAKE_TOKEN,
                events::IN,
                false,
            )?;
            self.wake_armed = true;
        }
        let mut any = false;
        let mut woke = false;
        let conns = &mut self.conns;
        ring.wait(timeout, |ready| {
            any = true;
            woke |= apply(conns, ready);
        })?;
        for conn in &mut self.conns {
            conn.unpolled = false;
            if conn.owe_answer {
                conn.answer();
            }
        }
        if woke {
            // Empties the poller's ready list (the waker's event), so that its descriptor
            // reads as idle again when the wait is armed anew.
            self.wake_armed = false;
            let _ = self.poll.poll(&mut self.events, Some(Duration::ZERO));
        }
        Ok(any)
    }

    /// [`Transport::poll_once`] with epoll (kqueue on macOS).
    fn poll_epoll(&mut self, timeout: Option<Duration>) -> io::Result<bool> {
        match self.poll.poll(&mut self.events, timeout) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(true),
            Err(e) => return Err(e),
        }
        let mut any = false;
        for event in self.events.iter() {
            if event.token() == WAKE {
                any = true;
                continue;
            }
            let Some(conn) = self.conns.get_mut(event.token().0) else {
                continue;
            };
            any = true;
            if event.is_readable() || event.is_read_closed() || event.is_error() {
                conn.readable = true;
            }
            if event.is_writable() || event.is_write_closed() || event.is_error() {
                conn.writable = true;
            }
            if event.is_priority() {
                conn.take_notice();
            }
            if conn.owe_answer {
                conn.answer();
            }
        }
        Ok(any)
    }

    /// The error a failure notice already received makes, if one did and this rank's own
    /// stall verdict was only a guess (a verified verdict stands: the notices this rank
    /// gets later can only repeat it or be wrong).
    pub(crate) fn notice(&self, context: Phase) -> Option<Error> {
        if !self.guessed {
            return None;
        }
        self.conns.iter().find_map(|c| {
            c.notice.map(|lost| Error::Lost {
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
        // The ring goes with the last handle, cancelling its armed waits.
        self.uring = None;
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
    /// remembered, so that [`Transport::abandon`] does not announce it.
    pub(crate) fn inquire(
        &mut self,
        waits: &[(usize, PeerOp)],
        suspect: (usize, PeerOp),
        timeout: Duration,
        context: Phase,
    ) -> Error {
        let (me, ranks) = self.conns.first().map_or((0, 1), |c| (c.me, c.ranks));
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
            conn.answering = false;
            conn.owe_answer = false;
            conn.query_pending = true;
        }
        let mut sink = [0u8; 16 << 10];
        loop {
            let _ = self.poll_once(Some(Duration::ZERO));
            for conn in &mut self.conns {
                if conn.query_pending
                    && conn.send_urgent(Urgent::Query) != Some(io::ErrorKind::WouldBlock)
                {
                    conn.query_pending = false;
                }
                conn.readable = true;
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
                if conn.spoke {
                    inquiry.urgent(conn.peer, Urgent::Alive);
                }
                if let Some(lost) = conn.notice {
                    inquiry.urgent(conn.peer, Urgent::Notice(lost));
                }
                if conn.eof {
                    inquiry.closed(conn.peer);
                }
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
    /// guessed stall verdict is not announced (see [`Transport::inquire`]): a wrong notice
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
        let notice = lost
            .filter(|_| !self.guessed)
            .filter(|&l| Urgent::Notice(l).encode().is_some());
        let mut pending: Vec<bool> = self
            .conns
            .iter()
            .map(|c| notice.is_some_and(|l| c.peer != l))
            .collect();
        for (conn, &pending) in self.conns.iter_mut().zip(&pending) {
            conn.answering = false;
            conn.query_pending = false;
            conn.readable = true;
            if !pending {
                let _ = conn.stream.shutdown(Shutdown::Write);
            }
        }
        let mut sink = [0u8; 16 << 10];
        loop {
            let mut open = 0;
            for (conn, pending) in self.conns.iter_mut().zip(pending.iter_mut()) {
                if let (true, Some(lost)) = (*pending, notice)
                    && conn.send_urgent(Urgent::Notice(lost)) != Some(io::ErrorKind::WouldBlock)
                {
                    *pending = false;
                    let _ = conn.stream.shutdown(Shutdown::Write);
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
            let waiting = open > 0 || pending.iter().any(|&p| p);
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
