//! The io_uring driver's handle, shared by a [`Transport`](super::transport::Transport) and
//! its connections: `ffi::uring::Ring` behind a lock (connections transfer through it, the
//! transport waits on it), or, off Linux, a type with no values, so that the transport's
//! code compiles everywhere and the epoll/kqueue path is all that runs there.

use crate::comm::progress::Spin;
use std::io;
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

/// `poll(2)` event bits, as io_uring's polls report them.
pub(crate) mod events {
    /// Data to read.
    pub(crate) const IN: u32 = 0x001;
    /// Urgent data (a failure notice, a query or an answer).
    pub(crate) const PRI: u32 = 0x002;
    /// Room to write.
    pub(crate) const OUT: u32 = 0x004;
    /// An error on the socket.
    pub(crate) const ERR: u32 = 0x008;
    /// Both directions closed.
    pub(crate) const HUP: u32 = 0x010;
    /// The peer closed its sending side.
    pub(crate) const RDHUP: u32 = 0x2000;
}

/// The token of connection `conn`'s wait of kind `kind` (0: readable, 1: writable,
/// 2: urgent data).
pub(crate) fn token(conn: usize, kind: u32) -> u32 {
    u32::try_from(conn)
        .unwrap_or(u32::MAX / 4)
        .saturating_mul(3)
        .saturating_add(kind)
}

/// The connection and the kind of the wait a [`token`] names (its inverse).
pub(crate) fn parse_token(token: u32) -> (usize, u32) {
    ((token / 3) as usize, token % 3)
}

/// Whether a report of `events` under a connection's `token` announces urgent data (a
/// notice, a query or an answer): any report of its urgent-data wait, or `POLLPRI`.
pub(crate) fn announces_urgent(token: u32, events: u32) -> bool {
    parse_token(token).1 == 2 || events & events::PRI != 0
}

/// The token of the wait on the poller that holds the close [`Waker`](mio::Waker).
pub(crate) const WAKE_TOKEN: u32 = u32::MAX;

/// What a wait reported for one token (see `ffi::uring::Readiness`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ready {
    pub(crate) token: u32,
    pub(crate) events: u32,
    pub(crate) ended: bool,
}

#[cfg(target_os = "linux")]
mod imp {
    use std::sync::{Arc, Mutex, MutexGuard};

    use super::*;

    /// The ring, shared by the transport and its connections (one thread drives a group at
    /// a time, so the lock is never contended; it makes the handle `Send`).
    #[derive(Clone, Debug)]
    pub(crate) struct Shared(Arc<Mutex<ffi::uring::Ring>>);

    impl Shared {
        /// A ring for `conns` connections, or why the kernel refuses one.
        pub(crate) fn new(conns: usize) -> io::Result<Shared> {
            let tokens = 3 * conns + 1;
            let entries = u32::try_from(tokens.next_power_of_two().max(16)).unwrap_or(4096);
            let ring = ffi::uring::Ring::new(entries, tokens)?;
            Ok(Shared(Arc::new(Mutex::new(ring))))
        }

        fn lock(&self) -> io::Result<MutexGuard<'_, ffi::uring::Ring>> {
            // Poisoned only by a panic while held, which the ring's code does not make.
            self.0
                .lock()
                .map_err(|_| io::Error::other("the io_uring driver's lock is poisoned"))
        }

        /// Receives without waiting; the flag says whether the socket may hold more.
        pub(crate) fn recv(&self, fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<(usize, bool)> {
            self.lock()?.recv(fd, buf)
        }

        pub(crate) fn send(&self, fd: BorrowedFd<'_>, buf: &[u8]) -> io::Result<usize> {
            self.lock()?.send(fd, buf)
        }

        /// A step's send and receive in one submission (the receive guarding urgent bytes
        /// if `guard_urgent`), waited for in the kernel until both moved bytes,
        /// `deadline`, a report under `stop`, or urgent data on any
        /// connection (see `ffi::uring::Ring::exchange`): a query from a neighbour that
        /// timed out is answered at once, and a notice read while the stream still holds
        /// it, whichever connection they come on.
        pub(crate) fn exchange(
            &self,
            send: Option<(BorrowedFd<'_>, &[u8])>,
            recv: Option<(BorrowedFd<'_>, &mut [u8])>,
            deadline: Instant,
            (stop, spin, guard_urgent): (u32, Spin, bool),
        ) -> io::Result<ffi::uring::Exchanged> {
            let mut ring = self.lock()?;
            ring.spin_first(ffi::uring::SpinFirst {
                eager: spin.eager,
                total: spin.total,
            });
            ring.guard_urgent(guard_urgent);
            ring.exchange(send, recv, Some(deadline), |r| {
                r.token == stop || (r.token != WAKE_TOKEN && announces_urgent(r.token, r.events))
            })
        }

        /// Hands what was reported so far to `each`, without a system call.
        pub(crate) fn take_ready(&self, mut each: impl FnMut(Ready)) {
            if let Ok(mut ring) = self.lock() {
                ring.take_ready(|r| {
                    each(Ready {
                        token: r.token,
                        events: r.events,
                        ended: r.ended,
                    })
                });
            }
        }

        pub(crate) fn send_pair(
            &self,
            fd: BorrowedFd<'_>,
            head: &[u8],
            body: &[u8],
        ) -> io::Result<usize> {
            self.lock()?.send_pair(fd, head, body)
        }

        /// Whether urgent data was reported under `token` (and forgets it).
        pub(crate) fn take_urgent(&self, token: u32) -> bool {
            self.lock().is_ok_and(|mut ring| {
                ring.take(token)
                    .is_some_and(|r| r.events & (events::PRI | events::ERR) != 0)
            })
        }

        pub(crate) fn poll(
            &self,
            fd: BorrowedFd<'_>,
            token: u32,
            events: u32,
            multishot: bool,
        ) -> io::Result<()> {
            self.lock()?.poll(fd, token, events, multishot)
        }

        /// Waits up to `timeout` and hands what was reported to `each`.
        pub(crate) fn wait(
            &self,
            timeout: Option<Duration>,
            mut each: impl FnMut(Ready),
        ) -> io::Result<()> {
            let mut ring = self.lock()?;
            ring.wait(timeout)?;
            ring.take_ready(|r| {
                each(Ready {
                    token: r.token,
                    events: r.events,
                    ended: r.ended,
                })
            });
            Ok(())
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    use super::*;

    /// What a step did (no values off Linux: there is no step).
    #[derive(Debug)]
    pub(crate) struct Exchanged {
        pub(crate) sent: Option<io::Result<usize>>,
        pub(crate) received: Option<io::Result<(usize, bool)>>,
        pub(crate) urgent: Option<u8>,
    }

    /// No io_uring off Linux: a type without values.
    #[derive(Clone, Debug)]
    pub(crate) enum Shared {}

    impl Shared {
        pub(crate) fn new(_conns: usize) -> io::Result<Shared> {
            Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "io_uring is Linux's; this system has none",
            ))
        }

        pub(crate) fn recv(
            &self,
            _fd: BorrowedFd<'_>,
            _buf: &mut [u8],
        ) -> io::Result<(usize, bool)> {
            match *self {}
        }

        pub(crate) fn send(&self, _fd: BorrowedFd<'_>, _buf: &[u8]) -> io::Result<usize> {
            match *self {}
        }

        pub(crate) fn take_ready(&self, _each: impl FnMut(Ready)) {
            match *self {}
        }

        pub(crate) fn exchange(
            &self,
            _send: Option<(BorrowedFd<'_>, &[u8])>,
            _recv: Option<(BorrowedFd<'_>, &mut [u8])>,
            _deadline: Instant,
            _stop: (u32, Spin, bool),
        ) -> io::Result<Exchanged> {
            match *self {}
        }

        pub(crate) fn send_pair(
            &self,
            _fd: BorrowedFd<'_>,
            _head: &[u8],
            _body: &[u8],
        ) -> io::Result<usize> {
            match *self {}
        }

        pub(crate) fn take_urgent(&self, _token: u32) -> bool {
            match *self {}
        }

        pub(crate) fn poll(
            &self,
            _fd: BorrowedFd<'_>,
            _token: u32,
            _events: u32,
            _multishot: bool,
        ) -> io::Result<()> {
            match *self {}
        }

        pub(crate) fn wait(
            &self,
            _timeout: Option<Duration>,
            _each: impl FnMut(Ready),
        ) -> io::Result<()> {
            match *self {}
        }
    }
}

pub(crate) use imp::Shared;
