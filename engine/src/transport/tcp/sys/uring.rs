//! The io_uring driver (Linux): `ffi::uring::Ring` behind a lock, shared by the group's
//! [`Driver`] (which waits on it and steps) and each connection's [`Port`] (which transfers
//! through it); off Linux the ring is a type with no values, so that this compiles
//! everywhere and the poller is all that runs there.

use crate::comm::progress::Spin;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

use mio::net::TcpStream;

use super::mio::Poller;
use super::{Event, Exchanged, Received};

/// `poll(2)` event bits, as io_uring's polls report them.
mod events {
    /// Data to read.
    pub(crate) const IN: u32 = 0x001;
    /// Room to write.
    pub(crate) const OUT: u32 = 0x004;
    /// An error on the socket.
    pub(crate) const ERR: u32 = 0x008;
    /// Both directions closed.
    pub(crate) const HUP: u32 = 0x010;
    /// The peer closed its sending side.
    pub(crate) const RDHUP: u32 = 0x2000;
}

/// The token of connection `conn`'s wait of kind `kind` (0: readable, 1: writable).
fn token(conn: usize, kind: u32) -> u32 {
    u32::try_from(conn)
        .unwrap_or(u32::MAX / 4)
        .saturating_mul(2)
        .saturating_add(kind)
}

/// The connection and the kind of the wait a [`token`] names (its inverse).
fn parse_token(token: u32) -> (usize, u32) {
    ((token / 2) as usize, token % 2)
}

/// The token of the wait on the poller that holds the close [`Waker`](mio::Waker).
const WAKE_TOKEN: u32 = u32::MAX;

/// What a wait reported for one token (see `ffi::uring::Readiness`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Ready {
    pub(crate) token: u32,
    pub(crate) events: u32,
    pub(crate) ended: bool,
}

#[cfg(target_os = "linux")]
mod imp {
    use std::sync::{Arc, Mutex, MutexGuard};

    use super::*;

    /// Whether `events` say that a connection closed or failed.
    fn ends(events: u32) -> bool {
        events & (events::RDHUP | events::HUP | events::ERR) != 0
    }

    /// The ring, shared by the transport and its connections (one thread drives a group at
    /// a time, so the lock is never contended; it makes the handle `Send`).
    #[derive(Clone, Debug)]
    pub(crate) struct Shared(Arc<Mutex<ffi::uring::Ring>>);

    impl Shared {
        /// A ring for `conns` connections, or why the kernel refuses one.
        pub(crate) fn new(conns: usize) -> io::Result<Shared> {
            let tokens = 2 * conns + 1;
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

        /// [`Shared::recv`] behind a receive of the urgent byte (see
        /// `ffi::uring::Ring::recv_guarded`).
        pub(crate) fn recv_guarded(
            &self,
            fd: BorrowedFd<'_>,
            buf: &mut [u8],
        ) -> io::Result<ffi::uring::Guarded> {
            self.lock()?.recv_guarded(fd, buf)
        }

        pub(crate) fn send(&self, fd: BorrowedFd<'_>, buf: &[u8]) -> io::Result<usize> {
            self.lock()?.send(fd, buf)
        }

        /// A step's send and receive in one submission (the receive guarding urgent bytes
        /// if `guard_urgent`), waited for in the kernel until both moved bytes,
        /// `deadline`, a report under `stop`, or a connection that closes or fails (see
        /// `ffi::uring::Ring::exchange`).
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
                r.token == stop || (r.token != WAKE_TOKEN && ends(r.events))
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

    /// Methods of `Shared`, whose type has no values: none of them can be called.
    macro_rules! uninhabited {
        ($(fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?;)*) => {$(
            pub(crate) fn $name(&self, $(_: $ty),*) $(-> $ret)? {
                match *self {}
            }
        )*};
    }

    /// What a step did (no values off Linux: there is no step).
    #[derive(Debug)]
    pub(crate) struct Stepped {
        pub(crate) sent: Option<io::Result<usize>>,
        pub(crate) received: Option<io::Result<(usize, bool)>>,
        pub(crate) urgent: Option<u8>,
    }

    /// What a guarded receive did (no values off Linux: there is none).
    #[derive(Debug)]
    pub(crate) struct Guarded {
        pub(crate) received: io::Result<(usize, bool)>,
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

        uninhabited! {
            fn recv(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<(usize, bool)>;
            fn recv_guarded(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Guarded>;
            fn send(fd: BorrowedFd<'_>, buf: &[u8]) -> io::Result<usize>;
            fn take_ready(each: impl FnMut(Ready));
            fn exchange(
                send: Option<(BorrowedFd<'_>, &[u8])>, recv: Option<(BorrowedFd<'_>, &mut [u8])>,
                deadline: Instant, stop: (u32, Spin, bool)
            ) -> io::Result<Stepped>;
            fn send_pair(fd: BorrowedFd<'_>, head: &[u8], body: &[u8]) -> io::Result<usize>;
            fn poll(fd: BorrowedFd<'_>, token: u32, events: u32, multishot: bool) -> io::Result<()>;
            fn wait(timeout: Option<Duration>, each: impl FnMut(Ready)) -> io::Result<()>;
        }
    }
}

use imp::Shared;

/// The `poll(2)` events of each io_uring wait of a connection: arrivals (data, urgent data
/// or a close), room to write.
///
/// No wait asks for urgent data alone: measured on Linux 6.18, a multishot `POLLPRI` wait
/// armed before an urgent byte arrives does not report it (the wake-up of its arrival is
/// filtered out), and a wait that also asks for `POLLIN` reports `POLLPRI` with ordinary
/// data as well, so its reports cannot tell an urgent byte from data. Urgent bytes are
/// taken by the receives instead (`ffi::uring::Ring::recv_guarded` and the guarded step),
/// and looked for while a collective waits (see `Connections::look_for_urgent`).
const ARRIVALS: [u32; 2] = [events::IN | events::RDHUP, events::OUT];

/// What went wrong handing the connections to io_uring.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// The kernel refuses io_uring (`ENOSYS`, `EPERM`...).
    Refused(io::Error),
    /// Another step failed: what it was, and why.
    Failed(&'static str, io::Error),
}

/// What a connection's receive moved, and the urgent byte a guarded one took first.
#[derive(Debug)]
pub(crate) struct Taken {
    pub(crate) received: io::Result<Received>,
    pub(crate) urgent: Option<u8>,
}

/// One connection's end: its wait tokens derive from its index, and it knows which of its
/// waits are armed (readable, writable).
#[derive(Debug)]
pub(crate) struct Port {
    /// The group's ring, which a connection's sends go straight to.
    pub(super) ring: Shared,
    slot: usize,
    armed: [bool; 2],
}

impl Port {
    /// Receives what the socket holds; with `guard`, takes an urgent byte first
    /// ([`Taken::urgent`]), so that the receive cannot skip it.
    pub(super) fn recv(
        &self,
        fd: BorrowedFd<'_>,
        buf: &mut [u8],
        guard: bool,
    ) -> io::Result<Taken> {
        let (received, urgent) = if guard {
            let guarded = self.ring.recv_guarded(fd, buf)?;
            (guarded.received, guarded.urgent)
        } else {
            (self.ring.recv(fd, buf), None)
        };
        // The kernel said the socket is empty now, and the standing arrival wait reports
        // the next bytes.
        let received = received.map(|(n, rest)| Received {
            n,
            drained: n > 0 && !rest && self.armed[0],
        });
        Ok(Taken { received, urgent })
    }

    /// Whether the standing arrival wait is armed (it reports every arrival).
    pub(super) fn reports_arrivals(&self) -> bool {
        self.armed[0]
    }

    /// The wait of kind `kind` ended (it is armed again before the next wait).
    pub(super) fn ended(&mut self, kind: usize) {
        if let Some(armed) = self.armed.get_mut(kind) {
            *armed = false;
        }
    }
}

/// The group's end: the ring, and whether its wait on the poller (which then holds only
/// the close waker) is armed.
#[derive(Debug)]
pub(crate) struct Driver {
    ring: Shared,
    wake_armed: bool,
}

impl Driver {
    /// Takes `streams` off the poller and onto a new ring. As the poller's registration
    /// did, arrivals (data, urgent data, a close) are reported from the start, whether or
    /// not a read is outstanding on the connection.
    #[cfg_attr(
        not(target_os = "linux"),
        allow(
            unreachable_code,
            reason = "io_uring is Linux's: elsewhere its ring has no values"
        )
    )]
    pub(super) fn new<'s>(
        poller: &Poller,
        streams: impl ExactSizeIterator<Item = &'s mut TcpStream>,
    ) -> Result<(Driver, Vec<Port>), Refusal> {
        let ring = Shared::new(streams.len()).map_err(Refusal::Refused)?;
        let mut ports = Vec::with_capacity(streams.len());
        for (i, stream) in streams.enumerate() {
            poller
                .deregister(stream)
                .map_err(|e| Refusal::Failed("handing a connection to io_uring", e))?;
            ring.poll(stream.as_fd(), token(i, 0), ARRIVALS[0], true)
                .map_err(|e| Refusal::Failed("arming io_uring's waits", e))?;
            ports.push(Port {
                ring: ring.clone(),
                slot: i,
                armed: [true, false],
            });
        }
        Ok((
            Driver {
                ring,
                wake_armed: false,
            },
            ports,
        ))
    }

    /// Arms the waits that readiness needs (a connection already marked ready needs none;
    /// the arrival wait stands), and the wait for the close waker.
    pub(super) fn arm<'c>(
        &mut self,
        poller: &Poller,
        conns: impl Iterator<Item = Option<(&'c mut Port, BorrowedFd<'c>, bool)>>,
    ) -> io::Result<()> {
        for (port, fd, writable) in conns.flatten() {
            // Arrivals are watched all the time (multishot: one report per arrival, as
            // edge-triggered epoll gives); room to write only when a write found none
            // (one-shot: room stays, and would be reported at every wait).
            let wanted = [true, !writable];
            for kind in 0..2 {
                if wanted[kind] && !port.armed[kind] {
                    self.ring
                        .poll(fd, token(port.slot, kind as u32), ARRIVALS[kind], kind != 1)?;
                    port.armed[kind] = true;
                }
            }
        }
        self.arm_waker(poller)
    }

    fn arm_waker(&mut self, poller: &Poller) -> io::Result<()> {
        if !self.wake_armed {
            self.ring.poll(
                poller.poll.registry().as_fd(),
                WAKE_TOKEN,
                events::IN,
                false,
            )?;
            self.wake_armed = true;
        }
        Ok(())
    }

    /// After the close waker fired: empties the poller's ready list, so that its
    /// descriptor reads as idle again when the wait is armed anew.
    fn woke(&mut self, poller: &mut Poller) {
        self.wake_armed = false;
        poller.drain();
    }

    /// Waits up to `timeout` and hands what was reported to `each`; returns whether
    /// anything was.
    pub(super) fn wait(
        &mut self,
        poller: &mut Poller,
        timeout: Option<Duration>,
        mut each: impl FnMut(usize, Event),
    ) -> io::Result<bool> {
        let mut any = false;
        let mut woke = false;
        self.ring.wait(timeout, |ready| {
            any = true;
            woke |= apply(ready, &mut each);
        })?;
        if woke {
            self.woke(poller);
        }
        Ok(any)
    }

    /// Hands what was reported so far to `each`, without a system call.
    pub(super) fn take_ready(&mut self, poller: &mut Poller, mut each: impl FnMut(usize, Event)) {
        if self.take(&mut each) {
            self.woke(poller);
        }
    }

    /// [`Driver::take_ready`] without the waker's handling; returns whether it fired.
    fn take(&mut self, each: &mut impl FnMut(usize, Event)) -> bool {
        let mut woke = false;
        self.ring
            .take_ready(|ready| woke |= apply(ready, &mut *each));
        woke
    }

    /// See [`super::Driver::before_step`].
    pub(super) fn before_step(
        &mut self,
        poller: &mut Poller,
        mut each: impl FnMut(usize, Event),
    ) -> io::Result<bool> {
        let woke = self.take(&mut each);
        self.arm_waker(poller)?;
        if woke {
            self.woke(poller);
        }
        Ok(woke)
    }

    /// See [`super::Driver::step`].
    pub(super) fn step(
        &mut self,
        poller: &mut Poller,
        send: Option<(BorrowedFd<'_>, &[u8])>,
        recv: Option<(BorrowedFd<'_>, &mut [u8])>,
        (deadline, spin, guard_urgent): (Instant, Spin, bool),
        mut each: impl FnMut(usize, Event),
    ) -> io::Result<Exchanged> {
        let exchanged =
            self.ring
                .exchange(send, recv, deadline, (WAKE_TOKEN, spin, guard_urgent))?;
        if self.take(&mut each) {
            self.woke(poller);
        }
        Ok(Exchanged {
            sent: exchanged.sent,
            received: exchanged.received,
            urgent: exchanged.urgent,
        })
    }
}

/// Hands one io_uring report to `each` as the connection's [`Event`]; returns whether it
/// was the close waker's.
fn apply(ready: Ready, each: &mut impl FnMut(usize, Event)) -> bool {
    if ready.token == WAKE_TOKEN {
        return true;
    }
    let (index, kind) = parse_token(ready.token);
    let failed = ready.events & (events::ERR | events::HUP) != 0;
    each(
        index,
        Event {
            readable: kind == 0 || failed,
            writable: kind == 1 || failed,
            urgent: false,
            ended: ready.ended.then_some(kind as usize),
        },
    );
    false
}
