//! Forming the ring: listen on our addresses, connect to the right neighbour's, accept the
//! left neighbour's connections, all at once on one poller.
//!
//! MLX forms the ring as a chain: ranks below `P-1` accept first and then connect; rank
//! `P-1` connects first. Its acceptor binds one address at a time and accepts exactly one
//! connection on each before binding the next, and its connector retries a refused
//! connection after 1, 2, 4, 8 and 16 s. A rank that listens on all its addresses at once
//! and connects concurrently, retrying refusals quickly until the deadline, fits into that
//! chain in any position, next to MLX ranks or ours, so that is what this does. No bytes
//! are exchanged: connection `i` pairs our `i`-th connection to the right neighbour with
//! its `i`-th listening address, and whoever connects to our address `i` first is taken as
//! the left neighbour's connection `i`, exactly as in MLX.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use socket2::{Domain, Socket, Type};

use super::transport::Transport;
use crate::error::{Error, PeerOp, Result};
use crate::hostfile::RingAddresses;
use crate::options::Options;

const CONTEXT: &str = "ring setup";

/// The first retry of a refused connection; doubled after each refusal up to the cap.
const FIRST_RETRY: Duration = Duration::from_millis(10);
const MAX_RETRY: Duration = Duration::from_millis(250);

/// Tokens: listeners from 0, connectors from `CONNECTOR_BASE`.
const CONNECTOR_BASE: usize = 1 << 16;

/// One outgoing connection to the right neighbour, retried until it is up.
enum Dial {
    /// Waiting to (re)try at the instant.
    Idle(Instant),
    /// A non-blocking connect in flight.
    Pending(TcpStream),
    /// Connected.
    Up(TcpStream),
}

/// Forms this rank's part of the ring within `options.timeout`.
pub(crate) fn connect(addrs: &RingAddresses, options: &Options) -> Result<Transport> {
    let timeout = options.timeout;
    let deadline = Instant::now() + timeout;
    let mut poll = Poll::new().map_err(|e| Error::local("creating the ring's poller", e))?;
    let (left, right) = (addrs.left_rank(), addrs.right_rank());

    let mut listeners: Vec<Option<TcpListener>> = Vec::with_capacity(addrs.listen.len());
    for (i, &addr) in addrs.listen.iter().enumerate() {
        let mut listener = listen(addr, options).map_err(|e| {
            Error::local(
                format!(
                    "rank {} cannot listen on {addr} (its address {i})",
                    addrs.rank
                ),
                e,
            )
        })?;
        poll.registry()
            .register(&mut listener, Token(i), Interest::READABLE)
            .map_err(|e| Error::local("registering a listener", e))?;
        listeners.push(Some(listener));
    }
    let mut accepted: Vec<Option<TcpStream>> = addrs.listen.iter().map(|_| None).collect();
    let now = Instant::now();
    let mut dials: Vec<Dial> = addrs.right.iter().map(|_| Dial::Idle(now)).collect();
    let mut last_error: Vec<Option<io::Error>> = addrs.right.iter().map(|_| None).collect();
    let mut backoff: Vec<Duration> = addrs.right.iter().map(|_| FIRST_RETRY).collect();
    let mut events = Events::with_capacity(16);

    loop {
        // Start the connects that are due.
        let now = Instant::now();
        for (i, dial) in dials.iter_mut().enumerate() {
            if let Dial::Idle(at) = *dial
                && at <= now
            {
                match open_connection(addrs.right[i], options) {
                    Ok(mut stream) => {
                        poll.registry()
                            .register(&mut stream, Token(CONNECTOR_BASE + i), Interest::WRITABLE)
                            .map_err(|e| Error::local("registering a connection", e))?;
                        *dial = Dial::Pending(stream);
                    }
                    Err(e) => {
                        *dial = Dial::Idle(now + backoff[i]);
                        backoff[i] = (backoff[i] * 2).min(MAX_RETRY);
                        last_error[i] = Some(e);
                    }
                }
            }
        }

        if accepted.iter().all(Option::is_some) && dials.iter().all(|d| matches!(d, Dial::Up(_))) {
            break;
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(give_up(
                addrs, &accepted, &dials, last_error, timeout, left, right,
            ));
        }
        let next_retry = dials
            .iter()
            .filter_map(|d| match d {
                Dial::Idle(at) => Some(*at),
                _ => None,
            })
            .min()
            .unwrap_or(deadline)
            .min(deadline);
        let wait = next_retry.saturating_duration_since(now);
        match poll.poll(&mut events, Some(wait)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::local("waiting to form the ring", e)),
        }

        for event in events.iter() {
            let token = event.token().0;
            if token < CONNECTOR_BASE {
                let i = token;
                let Some(listener) = listeners[i].as_mut() else {
                    continue;
                };
                // Take the first connection, as MLX's one-shot accept does, and stop
                // listening on this address. Readiness is edge-triggered, so drain until a
                // connection is taken or the backlog is empty.
                loop {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            accepted[i] = Some(stream);
                            if let Some(mut l) = listeners[i].take() {
                                let _ = poll.registry().deregister(&mut l);
                            }
                            break;
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if is_transient_accept_error(&e) => continue,
                        Err(e) => {
                            return Err(Error::Io {
                                peer: left,
                                addr: Some(addrs.listen[i]),
                                op: PeerOp::Accept,
                                context: CONTEXT,
                                source: e.into(),
                            });
                        }
                    }
                }
            } else {
                let i = token - CONNECTOR_BASE;
                let Some(dial) = dials.get_mut(i) else {
                    continue;
                };
                let Dial::Pending(stream) = dial else {
                    continue;
                };
                match connect_outcome(stream) {
                    Ok(true) => {
                        if let Dial::Pending(s) =
                            std::mem::replace(dial, Dial::Idle(Instant::now()))
                        {
                            *dial = Dial::Up(s);
                        }
                    }
                    Ok(false) => {}
                    Err(e) => {
                        if let Dial::Pending(mut s) =
                            std::mem::replace(dial, Dial::Idle(Instant::now() + backoff[i]))
                        {
                            let _ = poll.registry().deregister(&mut s);
                        }
                        backoff[i] = (backoff[i] * 2).min(MAX_RETRY);
                        last_error[i] = Some(e);
                    }
                }
            }
        }
    }

    let left_conns = accepted
        .into_iter()
        .zip(&addrs.listen)
        .filter_map(|(stream, &addr)| stream.map(|s| (s, left, addr)))
        .collect::<Vec<_>>();
    let mut right_conns = Vec::with_capacity(dials.len());
    for (dial, &addr) in dials.into_iter().zip(&addrs.right) {
        if let Dial::Up(mut stream) = dial {
            poll.registry()
                .deregister(&mut stream)
                .map_err(|e| Error::local("re-registering a connection", e))?;
            right_conns.push((stream, right, addr));
        }
    }
    Transport::new(poll, addrs.rank, addrs.size, left_conns, right_conns)
        .map_err(|e| Error::local("setting up the ring's connections", e))
}

/// A listening socket on `addr`, with `SO_REUSEADDR` so a ring can re-form on the same ports
/// right after the last one closed. Accepted connections inherit its tuning.
fn listen(addr: SocketAddr, options: &Options) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    tune(&socket, options)?;
    socket.bind(&addr.into())?;
    socket.listen(128)?;
    Ok(TcpListener::from_std(socket.into()))
}

/// Starts a non-blocking connection to `addr`, tuned before the handshake so that the
/// buffer sizes shape the window it negotiates.
fn open_connection(addr: SocketAddr, options: &Options) -> io::Result<TcpStream> {
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    socket.set_nonblocking(true)?;
    tune(&socket, options)?;
    match socket.connect(&addr.into()) {
        Ok(()) => {}
        Err(e) if ffi::net::is_in_progress(&e) || e.kind() == io::ErrorKind::WouldBlock => {}
        Err(e) => return Err(e),
    }
    Ok(TcpStream::from_std(socket.into()))
}

/// Applies [`Options::socket_buffer`] and [`Options::tcp_congestion`] to a socket.
fn tune(socket: &Socket, options: &Options) -> io::Result<()> {
    if let Some(bytes) = options.socket_buffer {
        socket.set_send_buffer_size(bytes)?;
        socket.set_recv_buffer_size(bytes)?;
    }
    if let Some(algorithm) = &options.tcp_congestion {
        set_congestion(socket, algorithm)?;
    }
    Ok(())
}

#[cfg(any(target_os = "linux", target_os = "freebsd"))]
fn set_congestion(socket: &Socket, algorithm: &str) -> io::Result<()> {
    socket
        .set_tcp_congestion(algorithm.as_bytes())
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "cannot use TCP congestion control {algorithm:?} ({e}; see \
                 /proc/sys/net/ipv4/tcp_allowed_congestion_control)"
                ),
            )
        })
}

#[cfg(not(any(target_os = "linux", target_os = "freebsd")))]
fn set_congestion(_: &Socket, algorithm: &str) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        format!(
            "choosing the TCP congestion control ({algorithm:?}) is not supported on this system"
        ),
    ))
}

/// Whether a non-blocking connect finished: `Ok(true)` when connected, `Ok(false)` when still
/// in flight (a spurious wake-up), `Err` with the reason when it failed.
fn connect_outcome(stream: &TcpStream) -> io::Result<bool> {
    if let Some(e) = stream.take_error()? {
        return Err(e);
    }
    match stream.peer_addr() {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(false),
        Err(e) => Err(e),
    }
}

/// Errors of `accept` that concern only the one connection being accepted.
fn is_transient_accept_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
    )
}

/// The error for a ring that did not form by the deadline: the connection we could not open
/// (naming the right neighbour and why), else the one that never arrived (naming the left).
fn give_up(
    addrs: &RingAddresses,
    accepted: &[Option<TcpStream>],
    dials: &[Dial],
    mut last_error: Vec<Option<io::Error>>,
    timeout: Duration,
    left: usize,
    right: usize,
) -> Error {
    if let Some(i) = dials.iter().position(|d| !matches!(d, Dial::Up(_))) {
        let addr = Some(addrs.right[i]);
        return match last_error[i].take() {
            Some(e) => Error::Io {
                peer: right,
                addr,
                op: PeerOp::Connect,
                context: "ring setup (retried until the timeout)",
                source: e.into(),
            },
            None => Error::Timeout {
                peer: right,
                addr,
                op: PeerOp::Connect,
                context: CONTEXT,
                after: timeout,
            },
        };
    }
    let i = accepted.iter().position(Option::is_none).unwrap_or(0);
    Error::Timeout {
        peer: left,
        addr: Some(addrs.listen[i]),
        op: PeerOp::Accept,
        context: CONTEXT,
        after: timeout,
    }
}
