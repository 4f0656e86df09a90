//! The driver seam, in the manner of mio's `sys`: one [`Driver`] type (the group's wait)
//! and one [`Source`] type (a connection's transfers) with the same methods whatever moves
//! the bytes, so that nothing above this module asks which driver runs.
//!
//! Two drivers exist. [`mio`] (epoll on Linux, kqueue on macOS) reports readiness, and a
//! transfer is a plain system call on the socket. [`uring`] (Linux, `Io::Uring`) runs each
//! read and write as one io_uring operation that completes within the call (the buffer
//! contract of `ffi::uring`), waits with io_uring polls, and can submit a step's send and
//! receive together and let the receive wait in the kernel, all within one call
//! ([`Driver::step`]). Its polls cannot report urgent bytes (see `uring::ARRIVALS`), so its
//! receives take them ([`Source::recv`] with a guard). The poller stays in both: with
//! io_uring it holds only the close waker, which io_uring waits on through the poller's
//! descriptor.
//!
//! What differs is said through the methods' results rather than asked of the driver:
//! whether a read left the socket known to be empty ([`Received::drained`]), what is known
//! of urgent data ([`Source::urgent`]), whether arrivals are reported without trying
//! ([`Source::reports_arrivals`]), whether a connection can step ([`Driver::steps`]).

mod mio;
pub(crate) mod uring;

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ::mio::net::TcpStream;
use ::mio::{Poll, Waker};

use crate::comm::progress::Spin;

/// What a wait reported for one connection.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Event {
    /// Data (or a close, or an error) may be read.
    pub(crate) readable: bool,
    /// There may be room to write (or the connection failed).
    pub(crate) writable: bool,
    /// Urgent data arrived (a notice, a query or an answer).
    pub(crate) urgent: bool,
    /// The standing wait of this kind ended and must be armed again (io_uring's).
    ended: Option<usize>,
}

/// What is known of urgent data on a connection, before a read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Urgency {
    /// The driver's guarded receives take an urgent byte before they can pass its
    /// position (io_uring's): read on.
    Taken,
    /// The driver cannot say without a wait: ask it before reading on.
    Unknown,
}

/// What one read moved.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Received {
    /// The bytes read (0: the peer closed).
    pub(crate) n: usize,
    /// The socket is known to be empty now and its next arrival will be reported: wait for
    /// that rather than spend a system call on a read that would find nothing.
    pub(crate) drained: bool,
}

/// A step's send and receive as they completed (see [`Driver::step`]).
#[derive(Debug)]
pub(crate) struct Exchanged {
    pub(crate) sent: Option<io::Result<usize>>,
    pub(crate) received: Option<io::Result<(usize, bool)>>,
    /// An urgent byte the receive took before it could pass the byte's position.
    pub(crate) urgent: Option<u8>,
}

/// The error of a step asked of a driver that does not step.
fn unsteppable() -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        "a step's transfers need io_uring",
    )
}

/// One connection's end of the driver.
#[derive(Debug)]
pub(crate) struct Source(Kind);

#[derive(Debug)]
enum Kind {
    Mio,
    Uring(uring::Port),
}

impl Source {
    /// A connection the poller drives.
    pub(crate) fn polled() -> Source {
        Source(Kind::Mio)
    }

    /// Reads what is available into `buf`. With `guard` (io_uring only: the poller reports
    /// urgent bytes, see [`Urgency`]), an urgent byte waiting on the socket is taken first
    /// and put in `urgent`, so that the read cannot start at its position and skip it.
    pub(crate) fn recv(
        &self,
        stream: &mut TcpStream,
        buf: &mut [u8],
        guard: bool,
        urgent: &mut Option<u8>,
    ) -> io::Result<Received> {
        match &self.0 {
            // A short read does not prove the socket drained: it stops before a close
            // that already arrived (and that epoll already reported), and at an urgent
            // byte. So the connection stays readable (see `Conn::read_stream`).
            Kind::Mio => io::Read::read(stream, buf).map(|n| Received { n, drained: false }),
            Kind::Uring(port) => {
                let taken = port.recv(stream.as_fd(), buf, guard)?;
                *urgent = taken.urgent;
                match taken.received {
                    // The byte taken stands where the receive began, which refuses to pass
                    // it (see `ffi::uring::Ring::recv_guarded`): a plain read does.
                    Err(e) if urgent.is_some() && e.kind() == io::ErrorKind::WouldBlock => {
                        self.recv_plain(stream, buf)
                    }
                    received => received,
                }
            }
        }
    }

    /// Reads what is available into `buf` with a plain system call, whichever driver runs:
    /// for a connection whose stream may stand at an urgent byte's position, where a
    /// receive that io_uring runs is refused (see `ffi::uring::Ring::exchange`).
    pub(crate) fn recv_plain(
        &self,
        stream: &mut TcpStream,
        buf: &mut [u8],
    ) -> io::Result<Received> {
        io::Read::read(stream, buf).map(|n| Received { n, drained: false })
    }

    /// Writes what fits of `buf`.
    pub(crate) fn send(&self, stream: &mut TcpStream, buf: &[u8]) -> io::Result<usize> {
        match &self.0 {
            Kind::Mio => io::Write::write(stream, buf),
            Kind::Uring(port) => port.ring.send(stream.as_fd(), buf),
        }
    }

    /// Writes what fits of `head`, then `body`, with one system call.
    pub(crate) fn send_pair(
        &self,
        stream: &mut TcpStream,
        head: &[u8],
        body: &[u8],
    ) -> io::Result<usize> {
        match &self.0 {
            Kind::Mio => {
                io::Write::write_vectored(stream, &[io::IoSlice::new(head), io::IoSlice::new(body)])
            }
            Kind::Uring(port) => port.ring.send_pair(stream.as_fd(), head, body),
        }
    }

    /// What is known of urgent data before a read (see [`Urgency`]).
    pub(crate) fn urgent(&self) -> Urgency {
        match &self.0 {
            Kind::Mio => Urgency::Unknown,
            Kind::Uring(_) => Urgency::Taken,
        }
    }

    /// Whether the poller reports urgent bytes with the arrivals it reports (epoll's
    /// `EPOLLPRI`; kqueue has no such event, and io_uring takes them in its receives).
    pub(crate) fn poller_reports_urgent(&self) -> bool {
        matches!(self.0, Kind::Mio) && cfg!(any(target_os = "linux", target_os = "android"))
    }

    /// Whether arrivals on this connection are reported without trying a read (io_uring's
    /// standing wait): then a connection not marked readable has nothing to read.
    pub(crate) fn reports_arrivals(&self) -> bool {
        match &self.0 {
            Kind::Mio => false,
            Kind::Uring(port) => port.reports_arrivals(),
        }
    }

    /// Takes in what `event` says about the driver's own waits.
    pub(crate) fn note(&mut self, event: &Event) {
        if let (Kind::Uring(port), Some(kind)) = (&mut self.0, event.ended) {
            port.ended(kind);
        }
    }
}

/// The group's end of the driver: what its connections wait with.
#[derive(Debug)]
pub(crate) struct Driver {
    poller: mio::Poller,
    uring: Option<uring::Driver>,
}

impl Driver {
    /// A driver on `poll`, epoll/kqueue until [`Driver::use_uring`].
    pub(crate) fn new(poll: Poll) -> io::Result<Driver> {
        Ok(Driver {
            poller: mio::Poller::new(poll)?,
            uring: None,
        })
    }

    /// Registers connection `index` for every event the connections need.
    pub(crate) fn register(&self, stream: &mut TcpStream, index: usize) -> io::Result<()> {
        self.poller.register(stream, index)
    }

    /// What ends a wait from another thread: waking it makes the wait return.
    pub(crate) fn waker(&self) -> Arc<Waker> {
        self.poller.waker.clone()
    }

    /// Hands every connection to io_uring: `streams` are the connections in order; the
    /// returned sources replace theirs. Fails if the kernel refuses io_uring.
    pub(crate) fn use_uring<'s>(
        &mut self,
        streams: impl ExactSizeIterator<Item = &'s mut TcpStream>,
    ) -> Result<Vec<Source>, uring::Refusal> {
        let (driver, ports) = uring::Driver::new(&self.poller, streams)?;
        self.uring = Some(driver);
        Ok(ports.into_iter().map(|p| Source(Kind::Uring(p))).collect())
    }

    /// Whether connections can [`Driver::step`].
    pub(crate) fn steps(&self) -> bool {
        self.uring.is_some()
    }

    /// Waits up to `timeout` for the connections' events and hands each to `each` (with
    /// the connection's index); returns whether anything was reported. `conns` are the
    /// connections (source, socket, whether it is known writable): io_uring arms the waits
    /// readiness needs on them first.
    pub(crate) fn wait<'c>(
        &mut self,
        conns: impl Iterator<Item = (&'c mut Source, BorrowedFd<'c>, bool)>,
        timeout: Option<Duration>,
        each: impl FnMut(usize, Event),
    ) -> io::Result<bool> {
        match &mut self.uring {
            None => self.poller.wait(timeout, each),
            Some(ring) => {
                ring.arm(
                    &self.poller,
                    conns.map(|(source, fd, writable)| match &mut source.0 {
                        Kind::Uring(port) => Some((port, fd, writable)),
                        Kind::Mio => None,
                    }),
                )?;
                ring.wait(&mut self.poller, timeout, each)
            }
        }
    }

    /// Hands what was reported so far to `each` without waiting: io_uring's completions
    /// (no system call); with the poller, one look if `ask` (a connection owes the poller
    /// a look for urgent data, see [`Urgency::Unknown`]).
    pub(crate) fn catch_up(&mut self, ask: bool, each: impl FnMut(usize, Event)) {
        match &mut self.uring {
            Some(ring) => ring.take_ready(&mut self.poller, each),
            None if ask => {
                let _ = self.poller.wait(Some(Duration::ZERO), each);
            }
            None => {}
        }
    }

    /// Before a [`Driver::step`]: hands what was reported so far to `each` (io_uring's
    /// completions, without a system call), so that closes are seen before the step
    /// waits, and arms the wait for the close waker. Returns
    /// whether the waker fired: then no step may wait (the close is to be seen first).
    ///
    /// # Errors
    ///
    /// The driver's own; a driver that does not [`Driver::steps`] refuses.
    pub(crate) fn before_step(&mut self, each: impl FnMut(usize, Event)) -> io::Result<bool> {
        match &mut self.uring {
            Some(ring) => ring.before_step(&mut self.poller, each),
            None => Err(unsteppable()),
        }
    }

    /// One step's transfers in one submission (see `ffi::uring::Ring::exchange`): sends
    /// `send` and receives into `recv`, waiting in the kernel until both moved bytes,
    /// `deadline` passes, any connection closes or fails, or a close from another thread
    /// fires the waker; neither is in flight when this returns. The receive takes
    /// an urgent byte first if `guard_urgent`. What was reported during the wait goes to
    /// `each`. Call [`Driver::before_step`] first.
    ///
    /// # Errors
    ///
    /// The driver's own (the transfers' errors are in [`Exchanged`]); a driver that does
    /// not [`Driver::steps`] refuses.
    pub(crate) fn step(
        &mut self,
        send: Option<(BorrowedFd<'_>, &[u8])>,
        recv: Option<(BorrowedFd<'_>, &mut [u8])>,
        (deadline, spin, guard_urgent): (Instant, Spin, bool),
        each: impl FnMut(usize, Event),
    ) -> io::Result<Exchanged> {
        match &mut self.uring {
            Some(ring) => ring.step(
                &mut self.poller,
                send,
                recv,
                (deadline, spin, guard_urgent),
                each,
            ),
            None => Err(unsteppable()),
        }
    }

    /// Releases io_uring (cancelling its waits) once the connections are closed.
    pub(crate) fn close(&mut self) {
        self.uring = None;
    }
}
