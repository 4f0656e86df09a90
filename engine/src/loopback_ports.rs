//! Loopback addresses for the library's own tests to listen on.
//!
//! A port the kernel hands out for `127.0.0.1:0` and the test then releases is back in the
//! ephemeral range: any connection dialled in between (a rank's, a relay's, another test's
//! running in parallel) may be given it, and the rank that later listens there fails with
//! `EADDRINUSE`. The ports here come from below Linux's default ephemeral range
//! (32768-60999; macOS's starts at 49152), which the kernel never picks for a dial or a
//! bind to port 0, and every port is handed out once per process.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::sync::{Mutex, PoisonError};

/// The first port handed out, and how many follow it.
const LOW: u16 = 20_000;
const SPAN: u16 = 12_000;

/// `n` addresses on 127.0.0.1 that nothing listened on when they were picked and that
/// this process was never given before; panics when the whole span is used up or taken.
pub(crate) fn free_addrs(n: usize) -> Vec<SocketAddr> {
    // Where the next search starts: a point that differs between processes (the process
    // id), so that two test binaries started together rarely probe the same ports.
    static NEXT: Mutex<Option<u16>> = Mutex::new(None);
    let mut next = NEXT.lock().unwrap_or_else(PoisonError::into_inner);
    let mut offset = next.unwrap_or_else(|| (std::process::id() % u32::from(SPAN)) as u16);
    let mut addrs = Vec::with_capacity(n);
    let mut tried = 0;
    while addrs.len() < n {
        assert!(
            tried < SPAN,
            "no {n} free loopback ports left in {LOW}..{}",
            LOW + SPAN
        );
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, LOW + offset));
        offset = (offset + 1) % SPAN;
        tried += 1;
        if TcpListener::bind(addr).is_ok() {
            addrs.push(addr);
        }
    }
    *next = Some(offset);
    addrs
}

/// One address as [`free_addrs`] picks them (JACCL's side channel has one).
#[cfg(feature = "jaccl")]
pub(crate) fn free_addr() -> SocketAddr {
    free_addrs(1)[0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_free_distinct_and_below_the_ephemeral_range() {
        let first = free_addrs(3);
        let second = free_addrs(2);
        let all: Vec<_> = first.iter().chain(&second).collect();
        for (i, a) in all.iter().enumerate() {
            assert!(a.ip().is_loopback(), "{a}");
            assert!((LOW..LOW + SPAN).contains(&a.port()), "{a}");
            assert!(!all[..i].contains(a), "{a} handed out twice");
            TcpListener::bind(a).unwrap_or_else(|e| panic!("{a} is not free: {e}"));
        }
    }
}
