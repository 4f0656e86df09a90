//! One TCP connection of a group: non-blocking reads and writes (vectored for a header
//! and its data), the urgent bytes beside the stream ([`super::notice`]), and the check
//! of a peer's first bytes for a handshake this rank does not run.
//!
//! Readiness is edge-triggered, so each connection remembers whether its last read or
//! write hit `WouldBlock` and is only retried after the driver says it changed.
//!
//! A read that stops short may have stopped at an urgent byte's position, and the next
//! read would skip the byte (the kernel then drops it). Rather than asking for the byte
//! after every short read (a system call each), the connection relies on the driver
//! ([`Urgency`]): epoll reports urgent data with its arrivals, so the connection is not
//! read again until the poller has been asked; io_uring's polls cannot report it, so its
//! receives take an urgent byte first, in the same submission (guarded, where an urgent
//! byte matters).

use std::io::{self, Write};
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Instant;

use mio::net::TcpStream;
use socket2::SockRef;

use super::notice::{Notices, Sent, Urgent};
use super::seal::{Channel, RecordError};
use super::sys::{Event, Source, Urgency};
use crate::auth;
use crate::error::{Error, PeerOp, Phase};

/// At most this many bytes per `read`/`write` call: macOS rejects lengths above `INT_MAX`.
pub(super) const MAX_IO_BYTES: usize = 1 << 30;

/// One TCP connection to a neighbour.
#[derive(Debug)]
pub(crate) struct Conn {
    pub(super) stream: TcpStream,
    /// The neighbour's rank.
    pub(crate) peer: usize,
    /// The neighbour's address, for errors.
    pub(crate) addr: SocketAddr,
    pub(super) readable: bool,
    pub(super) writable: bool,
    /// What the neighbour said beside the stream, and what this side owes it.
    pub(super) notices: Notices,
    /// Whether the neighbour closed its side (seen while diagnosing).
    pub(super) eof: bool,
    /// When bytes last arrived on this connection (or when it was set up).
    pub(super) last_rx: Instant,
    /// Whether the peer reset the connection: a process that dies with unread data does
    /// that, while a rank that gives up closes cleanly (see [`Connections::abandon`](super::Connections::abandon)).
    pub(super) reset: bool,
    /// Whether the first bytes received still need a look (see [`FirstBytes`]).
    pub(super) first: FirstBytes,
    /// Whether a short read may have stopped at an urgent byte that the poller has not yet
    /// been asked about: the connection is not read until it has.
    pub(super) unpolled: bool,
    /// Whether the next read may start where an urgent byte lands without the poller having
    /// looked (the last read filled its buffer, or a collective marked the connection
    /// readable): it peeks first (see [`Conn::look_before_reading`]).
    pub(super) unasked: bool,
    /// This connection's end of the driver.
    pub(super) source: Source,
    /// The records of a keyed native connection ([`super::seal`]): every byte read or written
    /// goes through them. `None` for the others, whose bytes move as they are.
    pub(super) seal: Option<Box<Channel>>,
}

/// The check a rank without a key makes of the first bytes each connection delivers, once
/// per connection: a keyed peer greets first (see [`crate::auth`]), so [`auth::MAGIC`]
/// there means the peer has a key and this rank has none, or, followed by
/// [`auth::NATIVE_VERSION`], that the peer runs the native wire; those bytes must never be
/// taken for data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum FirstBytes {
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
        match self.notices.notice() {
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
            // The neighbour gave up with a failure notice: what it sent before the notice
            // cannot finish this collective, and the close behind the notice may never be
            // reported (the arrival that carried it was taken with the urgent byte), so
            // the notice fails the receive now, naming the rank it names.
            Ok(Transfer::Blocked) if op == PeerOp::Receive && self.notices.notice().is_some() => {
                Err(self.closed(op, context))
            }
            Ok(Transfer::Blocked) => Ok(None),
            Ok(Transfer::Closed) => Err(self.closed(op, context)),
            Err(e) => Err(self.failed(op, context, e)),
        }
    }

    /// The error for a failed system call on this connection.
    pub(crate) fn failed(&self, op: PeerOp, context: Phase, e: io::Error) -> Error {
        // Records that did not open, or could not be sealed: that is what failed.
        if let Some(error) = self.seal.as_ref().and_then(|c| c.error()) {
            return error.clone().into_error(context, Some(self.addr));
        }
        // A peer whose first bytes showed it cannot speak with this rank: that, not the
        // system call, is what to report.
        let incompatible = match self.first {
            FirstBytes::NativePeer => Some(format!(
                "rank {} runs the native wire and this rank the MLX wire: the peer's first \
                 bytes on this connection are its native hello; set the same {} (or \
                 Options::backend) on every rank",
                self.peer,
                crate::config::env::WIRE_VAR
            )),
            FirstBytes::KeyedPeer => Some(format!(
                "rank {} has a key ({}) and this rank has none: the peer's first bytes on \
                 this connection are its handshake; set the same key on every rank, or none",
                self.peer,
                auth::KEY_VAR
            )),
            FirstBytes::Checked | FirstBytes::Unchecked => None,
        };
        if let Some(reason) = incompatible {
            return Error::PeerIncompatible {
                peer: self.peer,
                addr: Some(self.addr),
                context,
                reason,
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
    /// position, so it is read as soon as the poller reports it. Returns whether one was
    /// read.
    pub(super) fn take_notice(&mut self) -> bool {
        // Asking is what a short read left owed (see `unpolled`). A read after a full one
        // still peeks first (`unasked`): an urgent byte may land after this look.
        self.unpolled = false;
        if !self.notices.listening() {
            // The neighbour gave up; nothing it sends after that matters.
            return false;
        }
        match ffi::net::recv_urgent_byte(self.stream.as_fd()) {
            Ok(Some(byte)) => {
                self.took_urgent(byte);
                true
            }
            _ => false,
        }
    }

    /// Whether this connection's urgent bytes must be looked for while it waits: its
    /// driver does not report them with arrivals (io_uring, kqueue; see
    /// [`Source::poller_reports_urgent`]) and the neighbour has not given up.
    pub(super) fn needs_urgent_look(&self) -> bool {
        !self.source.poller_reports_urgent() && self.notices.listening()
    }

    /// Acts on the urgent byte `byte` read from this connection: keeps a notice, answers a
    /// query.
    pub(super) fn took_urgent(&mut self, byte: u8) {
        self.notices.received(byte);
        self.answer();
    }

    /// Sends the answer a query is owed, if any is and there is room for it (else it is
    /// tried again when the socket becomes writable). Queries and notices go out only from
    /// the loops that decide them ([`super::Connections::inquire`],
    /// [`super::Connections::abandon`]).
    pub(super) fn answer(&mut self) {
        if self.notices.poll_transmit() == Some(Urgent::Alive) {
            self.flush_urgent();
        }
    }

    /// Sends the urgent byte this side owes the neighbour (an answer, its query, its
    /// notice), if there is room for it (else it is tried again at the next chance: when
    /// the socket becomes writable, or the next round of the loop that sends it).
    pub(super) fn flush_urgent(&mut self) {
        let Some(what) = self.notices.poll_transmit() else {
            return;
        };
        let sent = match what
            .encode()
            .map(|byte| SockRef::from(&self.stream).send_out_of_band(&[byte]))
        {
            Some(Err(e)) if e.kind() == io::ErrorKind::WouldBlock => Sent::NoRoom,
            _ => Sent::Done,
        };
        self.notices.handle_sent(what, sent);
    }

    /// Takes in what the driver reported for this connection.
    pub(super) fn ready(&mut self, event: Event) {
        self.source.note(&event);
        if event.readable {
            self.readable = true;
        }
        if event.writable {
            self.writable = true;
        }
        if event.urgent {
            self.take_notice();
        }
    }

    /// Whether an urgent byte on this connection still matters to a read: a notice could
    /// name a third rank (with two, it could only name the peer, whom the failure names
    /// anyway) and the neighbour has not given up.
    fn urgent_matters(&self) -> bool {
        self.notices.names_third_ranks() && self.notices.listening()
    }

    /// Whether a read that may start at an urgent byte looks for one first: where the
    /// driver's reads do not take urgent bytes themselves, and one matters.
    fn guards_urgent(&self) -> bool {
        self.source.urgent() != Urgency::Taken && self.urgent_matters()
    }

    /// Marks the connection readable without the poller's word (a collective starts by
    /// trying its transfers). Its next read may then start at an urgent byte that arrived
    /// since the poller last looked, so it looks for one first.
    pub(super) fn assume_readable(&mut self) {
        self.readable = true;
        self.unasked |= self.guards_urgent();
    }

    /// Readies the connection for a loop that drains it after a failure (reading and
    /// discarding until the read would block) while it looks for urgent bytes. With epoll,
    /// whose reports carry urgent bytes, it stays as the poller left it: unreadable only
    /// after a read found it empty, and every later arrival is reported, an urgent byte
    /// with its report. A read without that report could start at an urgent byte that
    /// arrived a moment before and skip it (the kernel then drops it): an answer or a
    /// notice lost, and a live neighbour named. Other drivers are read regardless.
    pub(super) fn drain_readable(&mut self) {
        if !self.source.poller_reports_urgent() {
            self.readable = true;
        }
    }

    /// Reads what is available into `buf`, which is not empty: on a sealed connection,
    /// plaintext of records that authenticated (see [`Conn::read_sealed`]).
    pub(crate) fn read(&mut self, buf: &mut [u8]) -> io::Result<Transfer> {
        if self.seal.is_some() {
            return self.read_sealed(buf, Channel::take);
        }
        self.read_stream(buf)
    }

    /// Moves plaintext of the connection's records into `buf` with `copy` (taking it, or
    /// leaving it for the next call): what the channel holds first, else the ciphertext
    /// the socket has, until a record is whole and opens. A record that does not
    /// authenticate fails the read (and every later one) with the channel's error, which
    /// [`Conn::failed`] reports; a close inside a record is a close, with nothing of the
    /// record passed on.
    fn read_sealed(
        &mut self,
        buf: &mut [u8],
        copy: fn(&mut Channel, &mut [u8]) -> Result<usize, RecordError>,
    ) -> io::Result<Transfer> {
        let Some(mut channel) = self.seal.take() else {
            return self.read_stream(buf);
        };
        let result = loop {
            match copy(&mut channel, buf) {
                Ok(0) => {}
                Ok(n) => break Ok(Transfer::Moved(n)),
                Err(e) => break Err(record_failure(&e)),
            }
            let room = channel.room(buf.len());
            if room.is_empty() {
                // `room` guarantees space for a whole record; reading into nothing would
                // look like the peer closing.
                let what = "no room to read the rest of a record".to_string();
                break Err(record_failure(&channel.misuse(what)));
            }
            match self.read_stream(room) {
                Ok(Transfer::Moved(n)) => channel.filled(n),
                other => break other,
            }
        };
        self.seal = Some(channel);
        result
    }

    /// Reads what the socket has into `buf`, which is not empty.
    fn read_stream(&mut self, buf: &mut [u8]) -> io::Result<Transfer> {
        if !self.readable || self.unpolled {
            return Ok(Transfer::Blocked);
        }
        if self.first != FirstBytes::Checked
            && let Some(early) = self.check_first_bytes(buf.len())?
        {
            return Ok(early);
        }
        let len = buf.len().min(MAX_IO_BYTES);
        if self.unasked
            && let Some(early) = self.look_before_reading()
        {
            return Ok(early);
        }
        loop {
            // Once the neighbour sent an urgent byte, a read may start at its position, and
            // TCP refuses a read there while a signal is pending (`EAGAIN`), which io_uring's
            // own task work always is; a plain receive has none pending.
            let mut urgent = None;
            let read = if self.notices.spoke() {
                // A plain read skips an urgent byte at its start: where the driver's polls
                // do not report one (io_uring), look first. A neighbour that spoke has begun
                // to fail, and its next byte may be its notice, right before its close.
                if self.source.urgent() == Urgency::Taken && self.urgent_matters() {
                    self.take_notice();
                }
                self.source.recv_plain(&mut self.stream, &mut buf[..len])
            } else {
                let guard = self.urgent_matters();
                self.source
                    .recv(&mut self.stream, &mut buf[..len], guard, &mut urgent)
            };
            if let Some(byte) = urgent {
                self.took_urgent(byte);
            }
            let read = read.map(|r| {
                // The socket is known empty and its next arrival will be reported:
                // wait for that rather than spend a system call on a read that would
                // find nothing.
                if r.drained {
                    self.readable = false;
                }
                r.n
            });
            if matches!(read, Ok(n) if n > 0) {
                self.last_rx = Instant::now();
            }
            return match read {
                Ok(0) => Ok(Transfer::Closed),
                Ok(n) if n < len => {
                    // A read stops short at a pending urgent byte; the next one would skip
                    // it and the kernel would drop it (see the module's documentation):
                    // io_uring's next receive takes it first, epoll's report is fetched
                    // before this connection is read again.
                    match self.source.urgent() {
                        Urgency::Taken => {}
                        Urgency::Unknown => self.unpolled = true,
                    }
                    Ok(Transfer::Moved(n))
                }
                Ok(n) => {
                    // A full read may end exactly where an urgent byte arrives, before or
                    // after it returns, and the next read would start at the byte and skip
                    // it. That is where notices land: a failing rank sends its notice after
                    // its last whole message, and reads end at message boundaries. So the
                    // next read looks first ([`Conn::look_before_reading`]), unless the
                    // driver reports urgent bytes as they arrive or a notice could only
                    // name the peer.
                    self.unasked = self.guards_urgent();
                    Ok(Transfer::Moved(n))
                }
                Err(e) => match self.refused(e, |c| c.readable = false) {
                    Some(transfer) => transfer,
                    None => continue,
                },
            };
        }
    }

    /// The look a read owes when it may start where an urgent byte lands (`unasked`): one
    /// byte peeked, one system call as the read's own look would be. A byte of data there
    /// cannot be a notice, since a failing rank sends nothing after its notice, and a read
    /// that starts at data stops short of any urgent byte behind it, so the read goes ahead
    /// and cannot skip one, however late it arrives. Nothing there: a peek leaves an urgent
    /// byte where it is (only a read that passes it makes the kernel drop it), so it is
    /// taken, and the connection waits for the poller, which reports whatever arrives after
    /// this look, an urgent byte with its report. `Some` is what the read returns instead.
    fn look_before_reading(&mut self) -> Option<Transfer> {
        self.unasked = false;
        let mut byte = [0u8; 1];
        loop {
            return match self.stream.peek(&mut byte) {
                Ok(0) => {
                    // The peer closed; its notice, if it left one, is still there.
                    self.take_notice();
                    Some(Transfer::Closed)
                }
                Ok(_) => None,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.take_notice();
                    self.readable = false;
                    Some(Transfer::Blocked)
                }
                // The read that follows reports the failure.
                Err(_) => None,
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

    /// Writes what fits from `buf`, which is not empty (sealed: see [`Conn::write_sealed`]).
    pub(crate) fn write(&mut self, buf: &[u8]) -> io::Result<Transfer> {
        if !self.writable {
            return Ok(Transfer::Blocked);
        }
        if self.seal.is_some() {
            return self.write_sealed(&[], buf);
        }
        let len = buf.len().min(MAX_IO_BYTES);
        self.sent(|c| c.source.send(&mut c.stream, &buf[..len]))
    }

    /// Runs `send` (again when interrupted) and sorts what it returned: bytes moved, the
    /// peer gone, or no room (the connection waits to be writable); see [`Conn::refused`].
    fn sent(
        &mut self,
        mut send: impl FnMut(&mut Self) -> io::Result<usize>,
    ) -> io::Result<Transfer> {
        loop {
            return match send(self) {
                Ok(0) => Ok(Transfer::Closed),
                Ok(n) => Ok(Transfer::Moved(n)),
                Err(e) => match self.refused(e, |c| c.writable = false) {
                    Some(transfer) => transfer,
                    None => continue,
                },
            };
        }
    }

    /// What a read or send that failed with `e` comes to: `None` to try again
    /// (interrupted); nothing to read or no room yet (`blocked` clears that readiness); the
    /// peer gone (a peer that dies with unread data in its buffers resets the connection,
    /// which is remembered; a send after its close breaks the pipe); else the error.
    fn refused(&mut self, e: io::Error, blocked: fn(&mut Self)) -> Option<io::Result<Transfer>> {
        Some(match e.kind() {
            io::ErrorKind::Interrupted => return None,
            io::ErrorKind::WouldBlock => {
                blocked(self);
                Ok(Transfer::Blocked)
            }
            io::ErrorKind::ConnectionReset => {
                self.reset = true;
                Ok(Transfer::Closed)
            }
            io::ErrorKind::BrokenPipe => Ok(Transfer::Closed),
            _ => Err(e),
        })
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
        if self.seal.is_some() {
            return self.write_sealed(head, body);
        }
        let body = &body[..body.len().min(MAX_IO_BYTES)];
        self.sent(|c| c.source.send_pair(&mut c.stream, head, body))
    }

    /// Writes `head` then `body` sealed: seals what fits of them in one record (unless a
    /// record is still being written: the caller offers the same bytes again until that
    /// one is out, as nothing of them was reported sent) and writes it. Reports the record's
    /// plaintext bytes as moved only once the whole record is on the socket, so that a
    /// collective never finishes with part of its last record still here; until then the
    /// write is blocked, waiting for room.
    fn write_sealed(&mut self, head: &[u8], body: &[u8]) -> io::Result<Transfer> {
        let Some(mut channel) = self.seal.take() else {
            return Err(io::Error::other(
                "a sealed write on an unsealed connection (a bug)",
            ));
        };
        let result = self.send_record(&mut channel, head, body);
        self.seal = Some(channel);
        result
    }

    /// [`Conn::write_sealed`]'s work, with the channel taken out of the connection.
    fn send_record(
        &mut self,
        channel: &mut Channel,
        head: &[u8],
        body: &[u8],
    ) -> io::Result<Transfer> {
        match channel.sending() {
            None => {
                if let Err(e) = channel.seal_pair(head, body) {
                    return Err(record_failure(&e));
                }
            }
            Some(plain) if plain > head.len() + body.len() => {
                let what = format!(
                    "a record of {plain} bytes is being written, but only {} were offered again",
                    head.len() + body.len()
                );
                return Err(record_failure(&channel.misuse(what)));
            }
            Some(_) => {}
        }
        loop {
            let unsent = channel.unsent();
            match self.source.send(&mut self.stream, unsent) {
                Ok(0) => return Ok(Transfer::Closed),
                Ok(n) => {
                    if let Some(plain) = channel.handle_sent(n) {
                        return Ok(Transfer::Moved(plain));
                    }
                }
                Err(e) => {
                    if let Some(transfer) = self.refused(e, |c| c.writable = false) {
                        return transfer;
                    }
                }
            }
        }
    }

    /// Copies what the peer sent into `buf` without consuming it (non-blocking): the
    /// shared-memory path looks at a header that arrives while it waits elsewhere.
    /// Sealed, it is the plaintext of the next record that authenticated (read from the
    /// socket into the connection's buffer as needed, within one record): `WouldBlock`
    /// until a whole record is there.
    pub(crate) fn peek(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.seal.is_none() {
            return self.stream.peek(buf);
        }
        match self.read_sealed(buf, Channel::peek)? {
            Transfer::Moved(n) => Ok(n),
            Transfer::Closed => Ok(0),
            Transfer::Blocked => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    /// Whether the peer is still there: a non-blocking peek that does not consume data.
    pub(crate) fn probe(&mut self) -> io::Result<Transfer> {
        // Bytes already read from the socket are there too.
        if self.seal.as_ref().is_some_and(|c| c.buffered()) {
            return Ok(Transfer::Moved(1));
        }
        let mut byte = [0u8; 1];
        match self.stream.peek(&mut byte) {
            Ok(0) => Ok(Transfer::Closed),
            Ok(n) => Ok(Transfer::Moved(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(Transfer::Blocked),
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => Ok(Transfer::Closed),
            Err(e) => Err(e),
        }
    }

    /// What a [`Connections::step`](super::Connections::step)'s receive did, as [`Conn::read`] reports it (`None`:
    /// it was not made, or was cancelled before it moved a byte).
    pub(super) fn settle_receive(
        &mut self,
        done: Option<io::Result<(usize, bool)>>,
    ) -> io::Result<Transfer> {
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

    /// What a [`Connections::step`](super::Connections::step)'s send did, as [`Conn::write`] reports it.
    pub(super) fn settle_send(&mut self, done: Option<io::Result<usize>>) -> io::Result<Transfer> {
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

/// The I/O error a record failure becomes on its way out of a read or write; the channel
/// keeps the failure itself, which [`Conn::failed`] reports.
fn record_failure(error: &RecordError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, error.to_string())
}
