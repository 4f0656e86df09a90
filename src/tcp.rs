//! The TCP sockets' room: listening, dialling without blocking, every socket option the
//! crate sets, and the few non-blocking I/O helpers that setup needs. Protocol code (the
//! handshake, the ring's setup loop) never sets an option itself, so every value is here.
//!
//! Options are set in two stages. [`SocketTuning`] (buffer sizes, congestion control) is
//! applied before connecting or listening, because the buffer sizes shape the window the
//! connection negotiates and accepted sockets inherit the listener's. [`tune_established`]
//! (no delay, keepalive, user timeout) is applied once a connection joins the ring.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use mio::net::{TcpListener, TcpStream};
use socket2::{Domain, SockRef, Socket, Type};

use crate::options::Options;

/// TCP keepalive: probe a connection idle for this long ...
const KEEPALIVE_IDLE: Duration = Duration::from_secs(5);
/// ... every this often ...
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(3);
/// ... this many times before giving up.
const KEEPALIVE_PROBES: u32 = 3;
/// How long sent data (or a keepalive probe) may go unacknowledged before the kernel drops
/// the connection, where the system has `TCP_USER_TIMEOUT`: the keepalive horizon
/// (5 + 3 × 3 s), rounded up. Linux also counts a zero receive window against it, so a peer
/// that stops reading while this rank has data queued for it is dropped after as long.
#[cfg(any(target_os = "linux", target_os = "android"))]
const USER_TIMEOUT: Duration = Duration::from_secs(15);

/// The backlog of a listening socket.
const BACKLOG: i32 = 128;

/// The options set on a socket before it connects or listens, taken once from [`Options`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct SocketTuning {
    /// `SO_SNDBUF` and `SO_RCVBUF`, in bytes ([`Options::socket_buffer`]); the system's
    /// default when `None`.
    pub(crate) buffer: Option<usize>,
    /// `TCP_CONGESTION` ([`Options::tcp_congestion`]); the system's default when `None`.
    pub(crate) congestion: Option<String>,
}

impl SocketTuning {
    /// The tuning `options` ask for.
    pub(crate) fn from_options(options: &Options) -> SocketTuning {
        SocketTuning {
            buffer: options.socket_buffer,
            congestion: options.tcp_congestion.clone(),
        }
    }

    /// Applies the tuning to a socket not yet connected or listening.
    fn apply(&self, socket: &Socket) -> io::Result<()> {
        if let Some(bytes) = self.buffer {
            socket.set_send_buffer_size(bytes)?;
            socket.set_recv_buffer_size(bytes)?;
        }
        if let Some(algorithm) = &self.congestion {
            set_congestion(socket, algorithm)?;
        }
        Ok(())
    }
}

/// A listening socket on `addr`, with `SO_REUSEADDR` so a ring can re-form on the same ports
/// right after the last one closed. Accepted connections inherit its tuning.
pub(crate) fn listen(addr: SocketAddr, tuning: &SocketTuning) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    tuning.apply(&socket)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    Ok(TcpListener::from_std(socket.into()))
}

/// Starts a non-blocking connection to `addr`, tuned before the handshake so that the
/// buffer sizes shape the window it negotiates. [`dial_outcome`] tells when it is done.
pub(crate) fn dial(addr: SocketAddr, tuning: &SocketTuning) -> io::Result<TcpStream> {
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    socket.set_nonblocking(true)?;
    tuning.apply(&socket)?;
    match socket.connect(&addr.into()) {
        Ok(()) => {}
        Err(e) if ffi::net::is_in_progress(&e) || e.kind() == io::ErrorKind::WouldBlock => {}
        Err(e) => return Err(e),
    }
    Ok(TcpStream::from_std(socket.into()))
}

/// Whether a non-blocking connect finished: `Ok(true)` when connected, `Ok(false)` when still
/// in flight (a spurious wake-up), `Err` with the reason when it failed.
pub(crate) fn dial_outcome(stream: &TcpStream) -> io::Result<bool> {
    if let Some(e) = stream.take_error()? {
        return Err(e);
    }
    match stream.peer_addr() {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(false),
        Err(e) => Err(e),
    }
}

/// Tunes a connection that joins the ring: no delay (a collective's last small piece must
/// not wait for an acknowledgement), and keepalive with, on Linux, the user timeout, so that
/// a peer whose host vanished (asleep, unplugged) is found within about 15 s even between
/// collectives: the kernel marks the connection failed, and the next collective or health
/// check sees it.
pub(crate) fn tune_established(stream: &TcpStream) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let socket = SockRef::from(stream);
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    socket.set_tcp_keepalive(&keepalive)?;
    #[cfg(any(target_os = "linux", target_os = "android"))]
    socket.set_tcp_user_timeout(Some(USER_TIMEOUT))?;
    Ok(())
}

/// Whether the kernel lets this process use congestion control `algorithm`, tried on a
/// socket of its own, so that a refusal can be reported as the option's fault before any
/// listening or connecting starts.
pub(crate) fn check_congestion(algorithm: &str) -> io::Result<()> {
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    set_congestion(&socket, algorithm)
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

/// Writes what fits without blocking; `Ok(0)` if nothing fits now.
pub(crate) fn write_some(stream: &mut TcpStream, buf: &[u8]) -> io::Result<usize> {
    loop {
        return match stream.write(buf) {
            Ok(n) => Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => Err(e),
        };
    }
}

/// Reads what is there without blocking: `Ok(None)` if nothing is, `Ok(Some(0))` if the
/// peer closed.
pub(crate) fn read_some(stream: &mut TcpStream, buf: &mut [u8]) -> io::Result<Option<usize>> {
    loop {
        return match stream.read(buf) {
            Ok(n) => Ok(Some(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => Err(e),
        };
    }
}

/// Whether the peer of an accepted connection has already closed it (or it failed), looking
/// without taking any byte: those belong to the ring.
pub(crate) fn closed_by_peer(stream: &TcpStream) -> bool {
    let mut byte = [0u8; 1];
    match stream.peek(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != io::ErrorKind::WouldBlock,
    }
}

/// Errors of `accept` that concern only the one connection being accepted.
pub(crate) fn is_transient_accept_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn loopback() -> SocketAddr {
        "127.0.0.1:0".parse().unwrap()
    }

    /// Waits (briefly, spinning) for a non-blocking dial to finish.
    fn dialled(stream: &TcpStream) -> io::Result<bool> {
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            match dial_outcome(stream) {
                Ok(false) if Instant::now() < until => std::thread::sleep(Duration::from_millis(1)),
                other => return other,
            }
        }
    }

    #[test]
    fn tuning_comes_from_options() {
        let options = Options::default()
            .socket_buffer(1 << 20)
            .tcp_congestion("reno");
        assert_eq!(
            SocketTuning::from_options(&options),
            SocketTuning {
                buffer: Some(1 << 20),
                congestion: Some("reno".into()),
            }
        );
        assert_eq!(
            SocketTuning::from_options(&Options::default()),
            SocketTuning::default()
        );
    }

    #[test]
    fn dial_listen_and_tune_on_loopback() {
        let tuning = SocketTuning {
            buffer: Some(256 << 10),
            congestion: None,
        };
        let listener = listen(loopback(), &tuning).unwrap();
        let addr = listener.local_addr().unwrap();
        let mut client = dial(addr, &tuning).unwrap();
        assert!(dialled(&client).unwrap());
        let (mut server, _) = loop {
            match listener.accept() {
                Ok(accepted) => break accepted,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Err(e) => panic!("accept: {e}"),
            }
        };
        // Linux doubles the requested size for bookkeeping; either way it is at least that.
        let sock = SockRef::from(&client);
        assert!(sock.send_buffer_size().unwrap() >= 256 << 10);
        tune_established(&client).unwrap();
        assert!(client.nodelay().unwrap());
        assert!(sock.keepalive().unwrap());
        assert_eq!(sock.tcp_keepalive_time().unwrap(), KEEPALIVE_IDLE);
        #[cfg(any(target_os = "linux", target_os = "android"))]
        assert_eq!(sock.tcp_user_timeout().unwrap(), Some(USER_TIMEOUT));

        assert!(!closed_by_peer(&server));
        assert_eq!(write_some(&mut client, b"ring").unwrap(), 4);
        let mut buf = [0u8; 8];
        let until = Instant::now() + Duration::from_secs(5);
        let n = loop {
            match read_some(&mut server, &mut buf).unwrap() {
                Some(n) => break n,
                None if Instant::now() < until => std::thread::sleep(Duration::from_millis(1)),
                None => panic!("nothing arrived"),
            }
        };
        assert_eq!(&buf[..n], &b"ring"[..n]);
        drop(client);
        let until = Instant::now() + Duration::from_secs(5);
        while !closed_by_peer(&server) {
            assert!(Instant::now() < until, "the close never arrived");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_refused_dial_reports_why() {
        // Bind a port, then close it, so nothing listens there.
        let addr = listen(loopback(), &SocketTuning::default())
            .unwrap()
            .local_addr()
            .unwrap();
        match dial(addr, &SocketTuning::default()) {
            Err(e) => assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused),
            Ok(stream) => {
                let e = dialled(&stream).unwrap_err();
                assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);
            }
        }
    }

    #[cfg(any(target_os = "linux", target_os = "freebsd"))]
    #[test]
    fn an_unknown_congestion_control_is_named() {
        let tuning = SocketTuning {
            buffer: None,
            congestion: Some("no-such-algorithm".into()),
        };
        let e = listen(loopback(), &tuning).unwrap_err().to_string();
        assert!(e.contains("\"no-such-algorithm\""), "{e}");
    }
}
