//! The ring's sockets and the one event loop that owns them.
//!
//! Every connection of a group is a non-blocking socket registered once with a single
//! `mio::Poll` (epoll on Linux, kqueue on macOS). Nothing runs between collectives: the
//! thread that calls a collective drives the loop until it is done, so there is no thread
//! per socket, no hand-off on the hot path, and the caller's buffers can be read and written
//! in place. Readiness is edge-triggered, so each connection remembers whether its last
//! read or write hit `WouldBlock` and is only retried after the poller says it changed.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};

use crate::error::{Error, PeerOp};

/// At most this many bytes per `read`/`write` call: macOS rejects lengths above `INT_MAX`.
const MAX_IO_BYTES: usize = 1 << 30;

/// How long a waiting collective polls without sleeping before it blocks in the kernel.
/// Waking a thread that sleeps on another CPU costs ~100 µs on the VMs this was measured
/// on, against a ~10 µs round trip, so a short poll pays for small collectives. Each
/// unsuccessful poll yields the CPU, so oversubscribed ranks still get to run.
const SPIN: Duration = Duration::from_micros(50);

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
    /// The error for this peer closing the connection.
    pub(crate) fn closed(&self, op: PeerOp, context: &'static str) -> Error {
        Error::Closed {
            peer: self.peer,
            op,
            context,
        }
    }

    /// The error for a failed system call on this connection.
    pub(crate) fn failed(&self, op: PeerOp, context: &'static str, e: io::Error) -> Error {
        Error::Io {
            peer: self.peer,
            addr: Some(self.addr),
            op,
            context,
            source: Arc::new(e),
        }
    }

    /// Reads what is available into `buf`, which is not empty.
    pub(crate) fn read(&mut self, buf: &mut [u8]) -> io::Result<Transfer> {
        if !self.readable {
            return Ok(Transfer::Blocked);
        }
        let len = buf.len().min(MAX_IO_BYTES);
        loop {
            return match self.stream.read(&mut buf[..len]) {
                Ok(0) => Ok(Transfer::Closed),
                Ok(n) => Ok(Transfer::Moved(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.readable = false;
                    Ok(Transfer::Blocked)
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // A peer that dies with unread data in its buffers resets the connection.
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => Ok(Transfer::Closed),
                Err(e) => Err(e),
            };
        }
    }

    /// Writes what fits from `buf`, which is not empty.
    pub(crate) fn write(&mut self, buf: &[u8]) -> io::Result<Transfer> {
        if !self.writable {
            return Ok(Transfer::Blocked);
        }
        let len = buf.len().min(MAX_IO_BYTES);
        loop {
            return match self.stream.write(&buf[..len]) {
                Ok(0) => Ok(Transfer::Closed),
                Ok(n) => Ok(Transfer::Moved(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.writable = false;
                    Ok(Transfer::Blocked)
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
                    ) =>
                {
                    Ok(Transfer::Closed)
                }
                Err(e) => Err(e),
            };
        }
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
}

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
}

impl Transport {
    /// Takes over the connections of a formed ring: `left[i]` was accepted on our address
    /// `i`, `right[i]` was opened to the right neighbour's address `i`.
    pub(crate) fn new(
        poll: Poll,
        left: Vec<(TcpStream, usize, SocketAddr)>,
        right: Vec<(TcpStream, usize, SocketAddr)>,
    ) -> io::Result<Self> {
        let connections = left.len();
        let mut conns = Vec::with_capacity(2 * connections);
        for (i, (mut stream, peer, addr)) in left.into_iter().chain(right).enumerate() {
            stream.set_nodelay(true)?;
            poll.registry().register(
                &mut stream,
                Token(i),
                Interest::READABLE | Interest::WRITABLE,
            )?;
            conns.push(Conn {
                stream,
                peer,
                addr,
                readable: true,
                writable: true,
            });
        }
        Ok(Self {
            poll,
            events: Events::with_capacity(64),
            conns,
            connections,
        })
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

    /// The connection at `index`.
    pub(crate) fn conn(&mut self, index: usize) -> &mut Conn {
        &mut self.conns[index]
    }

    /// Every connection.
    pub(crate) fn conns(&mut self) -> &mut [Conn] {
        &mut self.conns
    }

    /// Waits until some connection may have become ready, or until `deadline`. Returns
    /// `false` if the deadline passed with nothing ready.
    pub(crate) fn wait(&mut self, deadline: Instant) -> io::Result<bool> {
        let spin_until = Instant::now() + SPIN;
        loop {
            if self.poll_once(Some(Duration::ZERO))? {
                return Ok(true);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            if now >= spin_until {
                return self.poll_once(Some(deadline - now));
            }
            std::thread::yield_now();
        }
    }

    fn poll_once(&mut self, timeout: Option<Duration>) -> io::Result<bool> {
        match self.poll.poll(&mut self.events, timeout) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(true),
            Err(e) => return Err(e),
        }
        let mut any = false;
        for event in self.events.iter() {
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
        }
        Ok(any)
    }

    /// Shuts every connection down, so that neighbours blocked on this rank fail at once
    /// instead of waiting for their timeout.
    pub(crate) fn shutdown(&mut self) {
        for conn in &mut self.conns {
            let _ = conn.stream.shutdown(Shutdown::Both);
        }
    }
}
