//! The two ends of the doctor's link test, each run on a host over ssh by the hidden
//! `nuvec doctor --serve ADDR` and `nuvec doctor --probe ADDR`: a short-lived TCP listener
//! on the address and port the ring would use (which also tells whether the port is free),
//! and a connection from the neighbour that times a few ping-pongs over it. Each end prints
//! one line the driver parses ([`parse_serve_line`], [`parse_probe_line`]).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// What the listener says first on a connection, so that the probe knows it reached the
/// doctor and not some other service on that port.
pub const GREETING: &[u8] = b"nuvec-doctor\n";

/// The prefix of every line the two ends print for the driver.
pub const MARK: &str = "nuvec-doctor ";

/// Bytes per ping (and per pong).
const PING: usize = 8;

/// Why the listener could not bind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BindFailure {
    /// Something else listens there.
    InUse,
    /// The address is not one of this host's.
    NotHere,
    /// A port below 1024 without the privilege.
    Denied,
    /// Anything else.
    Other,
}

impl BindFailure {
    fn of(e: &io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::AddrInUse => BindFailure::InUse,
            io::ErrorKind::AddrNotAvailable => BindFailure::NotHere,
            io::ErrorKind::PermissionDenied => BindFailure::Denied,
            _ => BindFailure::Other,
        }
    }

    fn name(self) -> &'static str {
        match self {
            BindFailure::InUse => "in-use",
            BindFailure::NotHere => "not-here",
            BindFailure::Denied => "denied",
            BindFailure::Other => "other",
        }
    }
}

/// What the listener reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServeLine {
    /// It listens.
    Listening,
    /// It could not bind: why, and the system's message.
    BindFailed(BindFailure, String),
}

/// Reads a line the listener printed; `None` for anything else (a shell's or ssh's
/// message).
pub fn parse_serve_line(line: &str) -> Option<ServeLine> {
    let rest = line.trim().strip_prefix(MARK)?;
    if rest.starts_with("listening") {
        return Some(ServeLine::Listening);
    }
    let rest = rest.strip_prefix("bind-failed ")?;
    let (kind, message) = rest.split_once(' ').unwrap_or((rest, ""));
    let kind = match kind {
        "in-use" => BindFailure::InUse,
        "not-here" => BindFailure::NotHere,
        "denied" => BindFailure::Denied,
        _ => BindFailure::Other,
    };
    Some(ServeLine::BindFailed(kind, message.to_string()))
}

/// `ip:port` as the ring hostfile writes it (an IPv6 address without brackets, as MLX
/// does) to a socket address.
pub fn socket_addr(addr: &str) -> Option<SocketAddr> {
    if let Ok(a) = addr.parse() {
        return Some(a);
    }
    let (ip, port) = addr.rsplit_once(':')?;
    Some(SocketAddr::new(ip.parse().ok()?, port.parse().ok()?))
}

/// The listener: binds `addr`, prints whether it could, then serves one connection (the
/// greeting, then an echo of every ping) and returns; or returns after `lifetime` with
/// none. Returns the process's exit status (0 when it listened).
pub fn serve(addr: &str, lifetime: Duration) -> u8 {
    let mut out = io::stdout();
    let Some(sock) = socket_addr(addr) else {
        let _ = writeln!(out, "{MARK}bind-failed other {addr:?} is not ip:port");
        return 2;
    };
    let listener = match TcpListener::bind(sock) {
        Ok(l) => l,
        Err(e) => {
            let _ = writeln!(out, "{MARK}bind-failed {} {e}", BindFailure::of(&e).name());
            let _ = out.flush();
            return 1;
        }
    };
    let _ = writeln!(out, "{MARK}listening {sock}");
    let _ = out.flush();
    let deadline = Instant::now() + lifetime;
    if listener.set_nonblocking(true).is_err() {
        return 1;
    }
    while Instant::now() < deadline {
        match listener.accept() {
            Ok((stream, _)) => {
                let _ = echo(stream, deadline);
                return 0;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    0
}

fn echo(mut stream: TcpStream, deadline: Instant) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_nodelay(true)?;
    let left = deadline.saturating_duration_since(Instant::now());
    stream.set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
    stream.write_all(GREETING)?;
    let mut buf = [0u8; PING];
    loop {
        match stream.read_exact(&mut buf) {
            Ok(()) => stream.write_all(&buf)?,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
    }
}

/// What the probe measured, or why it could not.
#[derive(Clone, Debug, PartialEq)]
pub enum ProbeLine {
    /// Round trips, in microseconds, in the order measured.
    Rtts(Vec<f64>),
    /// It could not connect, or the far end was not the doctor: the message.
    Failed(String),
}

/// Reads the line the probe printed; `None` for anything else.
pub fn parse_probe_line(line: &str) -> Option<ProbeLine> {
    let rest = line.trim().strip_prefix(MARK)?;
    if let Some(values) = rest.strip_prefix("rtt-us") {
        let rtts: Option<Vec<f64>> = values
            .split_whitespace()
            .map(|v| v.parse().ok().filter(|x: &f64| x.is_finite()))
            .collect();
        return rtts.filter(|r| !r.is_empty()).map(ProbeLine::Rtts);
    }
    rest.strip_prefix("probe-failed ")
        .map(|m| ProbeLine::Failed(m.to_string()))
}

/// The probe: connects to `addr` within `timeout`, checks the greeting and times `pings`
/// ping-pongs; prints the result line. Returns the exit status (0 when measured).
pub fn probe(addr: &str, pings: usize, timeout: Duration) -> u8 {
    let line = match measure(addr, pings.max(1), timeout) {
        Ok(rtts) => {
            let values: Vec<String> = rtts.iter().map(|r| format!("{r:.1}")).collect();
            format!("{MARK}rtt-us {}", values.join(" "))
        }
        Err(e) => format!("{MARK}probe-failed {e}"),
    };
    let mut out = io::stdout();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
    u8::from(!line.contains("rtt-us"))
}

fn measure(addr: &str, pings: usize, timeout: Duration) -> Result<Vec<f64>, String> {
    let sock = match socket_addr(addr) {
        Some(s) => s,
        None => addr
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| format!("{addr:?} is not ip:port"))?,
    };
    let mut stream = TcpStream::connect_timeout(&sock, timeout)
        .map_err(|e| format!("connecting to {sock}: {e}"))?;
    let setup = |s: &TcpStream| -> io::Result<()> {
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(timeout))
    };
    setup(&stream).map_err(|e| format!("{sock}: {e}"))?;
    let mut greeting = [0u8; GREETING.len()];
    stream
        .read_exact(&mut greeting)
        .map_err(|e| format!("{sock} accepted but sent no greeting ({e}): not nuvec doctor"))?;
    if greeting != GREETING {
        return Err(format!(
            "{sock} answered {:?}: another program listens there",
            String::from_utf8_lossy(&greeting)
        ));
    }
    let mut rtts = Vec::with_capacity(pings);
    let mut buf = [0u8; PING];
    for i in 0..pings {
        let ping = (i as u64).to_le_bytes();
        let start = Instant::now();
        stream
            .write_all(&ping)
            .and_then(|()| stream.read_exact(&mut buf))
            .map_err(|e| format!("{sock}: ping {i}: {e}"))?;
        rtts.push(start.elapsed().as_secs_f64() * 1e6);
        if buf != ping {
            return Err(format!("{sock}: ping {i} came back changed"));
        }
    }
    Ok(rtts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip_and_noise_is_ignored() {
        assert_eq!(
            parse_serve_line("nuvec-doctor listening 127.0.0.1:5"),
            Some(ServeLine::Listening)
        );
        assert_eq!(
            parse_serve_line(
                "nuvec-doctor bind-failed in-use Address already in use (os error 98)"
            ),
            Some(ServeLine::BindFailed(
                BindFailure::InUse,
                "Address already in use (os error 98)".into()
            ))
        );
        assert_eq!(parse_serve_line("sh: 1: nuvec: not found"), None);
        assert_eq!(
            parse_probe_line("nuvec-doctor rtt-us 12.5 10.0"),
            Some(ProbeLine::Rtts(vec![12.5, 10.0]))
        );
        assert_eq!(parse_probe_line("nuvec-doctor rtt-us"), None);
        assert_eq!(parse_probe_line("nuvec-doctor rtt-us 1 NaN"), None);
        assert_eq!(
            parse_probe_line("nuvec-doctor probe-failed connecting: refused"),
            Some(ProbeLine::Failed("connecting: refused".into()))
        );
        assert_eq!(
            socket_addr("::1:4000"),
            Some(SocketAddr::new("::1".parse().unwrap(), 4000))
        );
        assert_eq!(socket_addr("nonsense"), None);
    }

    #[test]
    fn a_probe_measures_a_listener_and_rejects_a_stranger() {
        let port = crate::launch::free_port_block(1).unwrap();
        let addr = format!("127.0.0.1:{port}");
        let server = {
            let addr = addr.clone();
            std::thread::spawn(move || serve(&addr, Duration::from_secs(10)))
        };
        // The listener binds before it accepts; retry the connection briefly.
        let mut result = Err(String::new());
        for _ in 0..100 {
            result = measure(&addr, 3, Duration::from_secs(2));
            if result.is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let rtts = result.unwrap();
        assert_eq!(rtts.len(), 3);
        assert!(rtts.iter().all(|r| *r > 0.0));
        assert_eq!(server.join().unwrap(), 0);

        // A listener that is not the doctor.
        let stranger = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = stranger.local_addr().unwrap().to_string();
        let t = std::thread::spawn(move || {
            let (mut s, _) = stranger.accept().unwrap();
            s.write_all(b"SSH-2.0-Open\n").unwrap();
        });
        let err = measure(&addr, 1, Duration::from_secs(2)).unwrap_err();
        assert!(err.contains("another program"), "{err}");
        t.join().unwrap();
    }
}
