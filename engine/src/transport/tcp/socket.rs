//! The TCP sockets' room: listening, dialling without blocking, every socket option the
//! crate sets, and the few non-blocking I/O helpers that setup needs. Protocol code (the
//! handshake, the ring's setup loop) never sets an option itself, so every value is here.
//!
//! Options are set in two stages. [`SocketTuning`] (buffer sizes, congestion control) is
//! applied before connecting or listening, because the buffer sizes shape the window the
//! connection negotiates and accepted sockets inherit the listener's. [`tune_established`]
//! (no delay, keepalive, user timeout) is applied once a connection joins the ring; its
//! timeouts follow the group's ([`Liveness`]), so that the kernel never drops a connection
//! to a peer the group would still wait for.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use mio::net::{TcpListener, TcpStream};
use socket2::{Domain, SockRef, Socket, Type};

use crate::options::Options;

/// The margin the kernel's timeouts leave beyond the group's, at least: the group's own
/// timeout must fire first, so that the error names the late peer rather than saying
/// "Connection timed out" (see [`Liveness::for_timeout`]).
#[cfg(any(target_os = "linux", target_os = "android"))]
const MIN_MARGIN: Duration = Duration::from_secs(5);
/// Linux takes `TCP_KEEPIDLE` and `TCP_KEEPINTVL` in whole seconds, 1 to 32767
/// (`MAX_TCP_KEEPIDLE`, `MAX_TCP_KEEPINTVL`), and `TCP_KEEPCNT` up to 127; outside those it
/// refuses the option.
const KEEPALIVE_MAX_SECS: u64 = 32767;
const KEEPALIVE_MAX_PROBES: u32 = 127;
/// At least this many keepalive probes, so that one lost probe does not drop a connection.
const KEEPALIVE_MIN_PROBES: u32 = 3;
/// `TCP_USER_TIMEOUT` is an `int` of milliseconds: Linux refuses a negative one.
#[cfg(any(target_os = "linux", target_os = "android"))]
const USER_TIMEOUT_MAX: Duration = Duration::from_millis(i32::MAX as u64);

/// The kernel's own liveness checks on an established connection, derived from the
/// group's timeout ([`Options::timeout`]) so that they never fail a peer the group would
/// still wait for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Liveness {
    /// Keepalive: probe a connection silent for this long ...
    pub(crate) keepalive_idle: Duration,
    /// ... every this often ...
    pub(crate) keepalive_interval: Duration,
    /// ... this many times before giving up.
    pub(crate) keepalive_probes: u32,
    /// `TCP_USER_TIMEOUT`: how long sent data (or a keepalive probe) may go unacknowledged,
    /// and (recent Linux) how long the peer may keep a zero receive window, before
    /// the kernel drops the connection. `None` leaves it off.
    pub(crate) user_timeout: Option<Duration>,
}

impl Liveness {
    /// The checks for a group whose timeout is `timeout`.
    ///
    /// A healthy peer that is late to a collective stops reading, so this rank's data
    /// waits in the kernel behind a zero window; Linux counts that against the user
    /// timeout, and a user timeout shorter than the group's drops a connection the group
    /// would still wait on (a fixed 15 s did that to every collective larger than the
    /// socket buffers). So the user timeout is the group's plus a margin: half the group's,
    /// at least [`MIN_MARGIN`]. The margin covers the group's clock restarting whenever any
    /// connection moves, while the kernel's counts per connection. Beyond what the option
    /// can hold (about 24 days), it is left off: the kernel then drops a connection only
    /// when its peer's host stops acknowledging for its own retry limit (`tcp_retries2`,
    /// about 15 minutes), never for a zero window that the peer keeps answering probes for.
    ///
    /// Systems without `TCP_USER_TIMEOUT` (macOS, the BSDs) never drop a connection for a
    /// zero window whose probes are answered, so a late peer is safe there too; a host that
    /// vanished is found by keepalive between collectives and by the group's timeout during
    /// one.
    ///
    /// Keepalive probes a connection silent for half the timeout, every quarter of it,
    /// three times (more when the per-option limits bind): its horizon, idle plus the
    /// probes, exceeds the group's timeout up to about 48 days, the most those limits
    /// allow. A peer's kernel answers keepalive whatever its process does, so keepalive
    /// only finds hosts that vanished; on Linux the user timeout, when set, decides when.
    pub(crate) fn for_timeout(timeout: Duration) -> Liveness {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        let user_timeout = {
            let user = timeout.saturating_add((timeout / 2).max(MIN_MARGIN));
            (user <= USER_TIMEOUT_MAX).then_some(user)
        };
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        let user_timeout = None;
        let idle = keepalive_secs(timeout / 2);
        let interval = keepalive_secs(timeout / 4);
        // Enough probes after `idle` to pass `timeout`; `interval` is at least a second.
        let needed = timeout.as_secs().saturating_sub(idle) / interval + 1;
        let probes = u32::try_from(needed)
            .unwrap_or(u32::MAX)
            .clamp(KEEPALIVE_MIN_PROBES, KEEPALIVE_MAX_PROBES);
        Liveness {
            keepalive_idle: Duration::from_secs(idle),
            keepalive_interval: Duration::from_secs(interval),
            keepalive_probes: probes,
            user_timeout,
        }
    }
}

impl Default for Liveness {
    fn default() -> Self {
        Liveness::for_timeout(Options::default().timeout)
    }
}

/// `d` in whole seconds, rounded up (so that a horizon computed from it is never short),
/// within the range keepalive options accept.
fn keepalive_secs(d: Duration) -> u64 {
    let secs = d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0));
    secs.clamp(1, KEEPALIVE_MAX_SECS)
}

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
    /// The checks [`tune_established`] sets once the connection joins the ring.
    pub(crate) liveness: Liveness,
}

impl SocketTuning {
    /// The tuning `options` ask for.
    pub(crate) fn from_options(options: &Options) -> SocketTuning {
        SocketTuning {
            buffer: options.socket_buffer,
            congestion: options.tcp_congestion.clone(),
            liveness: Liveness::for_timeout(options.timeout),
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
    if let Some(listener) = take_reserved(addr) {
        return Ok(listener);
    }
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    tuning.apply(&socket)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    Ok(TcpListener::from_std(socket.into()))
}

// ---- Listeners bound ahead of formation (Group::split) ---------------------------------

/// Listeners that `Group::split` bound on port 0 before the sub-group forms, by the address
/// the kernel gave them. Formation calls [`listen`] with that address, and must get this
/// very socket: closing it and binding the port again would leave a window in which
/// another process's outgoing connection could be handed the (ephemeral) port.
static RESERVED: std::sync::Mutex<Vec<(SocketAddr, TcpListener)>> =
    std::sync::Mutex::new(Vec::new());

/// Binds a listener on a fresh port of `ip` and keeps it for the next [`listen`] on the
/// address it returns.
pub(crate) fn reserve(ip: std::net::IpAddr, tuning: &SocketTuning) -> io::Result<SocketAddr> {
    let listener = listen(SocketAddr::new(ip, 0), tuning)?;
    let addr = listener.local_addr()?;
    RESERVED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((addr, listener));
    Ok(addr)
}

/// Closes the listener kept for `addr`, if formation did not take it.
pub(crate) fn release(addr: SocketAddr) {
    drop(take_reserved(addr));
}

fn take_reserved(addr: SocketAddr) -> Option<TcpListener> {
    if addr.port() == 0 {
        return None;
    }
    let mut reserved = RESERVED.lock().unwrap_or_else(|e| e.into_inner());
    let at = reserved.iter().position(|(a, _)| *a == addr)?;
    Some(reserved.swap_remove(at).1)
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
/// a peer whose host vanished (asleep, unplugged) is found even between collectives, a
/// little after the group's timeout: the kernel marks the connection failed, and the next
/// collective or health check sees it. See [`Liveness::for_timeout`] for the values.
pub(crate) fn tune_established(stream: &TcpStream, liveness: &Liveness) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let socket = SockRef::from(stream);
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(liveness.keepalive_idle)
        .with_interval(liveness.keepalive_interval)
        .with_retries(liveness.keepalive_probes);
    socket.set_tcp_keepalive(&keepalive)?;
    #[cfg(any(target_os = "linux", target_os = "android"))]
    socket.set_tcp_user_timeout(liveness.user_timeout)?;
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

/// The next connection waiting on `listener`, or `None` when none is: an `accept` that
/// failed for that one connection only (aborted, reset, interrupted) is passed over.
pub(crate) fn accept_next(
    listener: &mio::net::TcpListener,
) -> io::Result<Option<(mio::net::TcpStream, SocketAddr)>> {
    loop {
        match listener.accept() {
            Ok(accepted) => return Ok(Some(accepted)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) if is_transient_accept_error(&e) => continue,
            Err(e) => return Err(e),
        }
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
            .tcp_congestion("reno")
            .timeout(Duration::from_secs(7));
        assert_eq!(
            SocketTuning::from_options(&options),
            SocketTuning {
                buffer: Some(1 << 20),
                congestion: Some("reno".into()),
                liveness: Liveness::for_timeout(Duration::from_secs(7)),
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
            ..SocketTuning::default()
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
        tune_established(&client, &tuning.liveness).unwrap();
        assert!(client.nodelay().unwrap());
        assert!(sock.keepalive().unwrap());
        assert_eq!(
            sock.tcp_keepalive_time().unwrap(),
            tuning.liveness.keepalive_idle
        );

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
            congestion: Some("no-such-algorithm".into()),
            ..SocketTuning::default()
        };
        let e = listen(loopback(), &tuning).unwrap_err().to_string();
        assert!(e.contains("\"no-such-algorithm\""), "{e}");
    }

    /// A connection on loopback (accepted by the kernel; nobody needs to take it), for
    /// reading options back.
    fn connected() -> (TcpListener, TcpStream) {
        let listener = listen(loopback(), &SocketTuning::default()).unwrap();
        let client = dial(listener.local_addr().unwrap(), &SocketTuning::default()).unwrap();
        assert!(dialled(&client).unwrap());
        (listener, client)
    }

    /// What the kernel holds after [`tune_established`] for a group timeout: keepalive
    /// idle, interval, probes, and the user timeout (zero when off).
    fn read_back(stream: &TcpStream, timeout: Duration) -> (Duration, Duration, u32, Duration) {
        tune_established(stream, &Liveness::for_timeout(timeout))
            .unwrap_or_else(|e| panic!("the kernel refused the values for {timeout:?}: {e}"));
        let sock = SockRef::from(stream);
        #[cfg(any(target_os = "linux", target_os = "android"))]
        let user = sock.tcp_user_timeout().unwrap().unwrap_or_default();
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        let user = Duration::ZERO;
        (
            sock.tcp_keepalive_time().unwrap(),
            sock.tcp_keepalive_interval().unwrap(),
            sock.tcp_keepalive_retries().unwrap(),
            user,
        )
    }

    /// The fixed value this replaced: it dropped the connection to a healthy peer that was
    /// 16 s late to a collective larger than the socket buffers, under a 20 s group timeout.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    const OLD_USER_TIMEOUT: Duration = Duration::from_secs(15);

    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[test]
    fn the_user_timeout_follows_the_group_timeout() {
        let (_listener, client) = connected();
        let cases = [
            (Duration::from_millis(1), Duration::from_millis(5001)),
            (Duration::from_secs(4), Duration::from_secs(9)),
            (Duration::from_secs(20), Duration::from_secs(30)),
            (Duration::from_secs(30), Duration::from_secs(45)),
            (Duration::from_secs(120), Duration::from_secs(180)),
        ];
        for (group, user) in cases {
            let (_, _, _, got) = read_back(&client, group);
            assert_eq!(got, user, "group timeout {group:?}");
        }
        let (_, _, _, got) = read_back(&client, Duration::from_secs(20));
        assert!(got > OLD_USER_TIMEOUT + Duration::from_secs(1) && got > Duration::from_secs(20));
        // Past what the option holds (about 24.8 days): off, never refused, never wrapped.
        for group in [
            Duration::from_secs(20 * 24 * 3600),
            Duration::from_secs(30 * 24 * 3600),
            Duration::from_secs(u64::MAX),
            Duration::MAX,
        ] {
            let (_, _, _, got) = read_back(&client, group);
            let expected = Liveness::for_timeout(group)
                .user_timeout
                .unwrap_or_default();
            assert_eq!(got, expected, "group timeout {group:?}");
            assert!(got.is_zero() || got > group, "{got:?} for {group:?}");
        }
    }

    #[test]
    fn keepalive_outlasts_the_group_timeout_within_the_kernel_limits() {
        let (_listener, client) = connected();
        let cases = [
            (Duration::from_millis(1), (1, 1, 3)),
            (Duration::from_millis(5900), (3, 2, 3)),
            (Duration::from_secs(30), (15, 8, 3)),
            (Duration::from_secs(100_000), (32767, 25000, 3)),
            (Duration::from_secs(1_000_000), (32767, 32767, 30)),
            (Duration::MAX, (32767, 32767, 127)),
        ];
        for (group, (idle, interval, probes)) in cases {
            let got = read_back(&client, group);
            assert_eq!(
                (got.0.as_secs(), got.1.as_secs(), got.2),
                (idle, interval, probes),
                "group timeout {group:?}"
            );
            let horizon = got.0 + got.1 * got.2;
            assert!(
                horizon > group || group > Duration::from_secs(32767 * 128),
                "{horizon:?} for {group:?}"
            );
        }
    }

    proptest::proptest! {
        /// Whatever the group timeout, the derived values are within what the kernel
        /// accepts, the user timeout (when set) outlasts the group's, and keepalive's
        /// horizon does as far as its limits allow.
        #[test]
        fn liveness_is_sound_for_any_timeout(secs in proptest::prelude::any::<u64>(), nanos in 0u32..1_000_000_000, small in proptest::prelude::any::<bool>()) {
            let timeout = if small {
                Duration::new(secs % 100_000, nanos)
            } else {
                Duration::new(secs, nanos)
            };
            let l = Liveness::for_timeout(timeout);
            for d in [l.keepalive_idle, l.keepalive_interval] {
                proptest::prop_assert!((1..=KEEPALIVE_MAX_SECS).contains(&d.as_secs()) && d.subsec_nanos() == 0);
            }
            proptest::prop_assert!((KEEPALIVE_MIN_PROBES..=KEEPALIVE_MAX_PROBES).contains(&l.keepalive_probes));
            let horizon = l.keepalive_idle + l.keepalive_interval * l.keepalive_probes;
            proptest::prop_assert!(horizon > timeout || horizon.as_secs() == KEEPALIVE_MAX_SECS * 128);
            #[cfg(any(target_os = "linux", target_os = "android"))]
            {
                match l.user_timeout {
                    Some(user) => proptest::prop_assert!(user >= timeout + MIN_MARGIN && user <= USER_TIMEOUT_MAX),
                    None => proptest::prop_assert!(timeout.saturating_add(MIN_MARGIN) > USER_TIMEOUT_MAX / 2),
                }
            }
        }
    }
}
