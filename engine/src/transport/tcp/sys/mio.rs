//! Readiness by epoll (Linux) or kqueue (macOS), through `mio`: every connection is
//! registered once, edge-triggered, for reading, writing and (Linux) urgent data; a
//! [`Waker`] registered beside them ends a wait from another thread.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token, Waker};

use super::Event;

/// The poller token of the [`Waker`] (connections are numbered from 0).
const WAKE: Token = Token(usize::MAX);

/// What every connection is registered for. On Linux that includes urgent data, which is
/// how a failure notice announces itself.
fn interest() -> Interest {
    let interest = Interest::READABLE | Interest::WRITABLE;
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let interest = interest | Interest::PRIORITY;
    interest
}

/// The poller and its waker.
#[derive(Debug)]
pub(super) struct Poller {
    pub(super) poll: Poll,
    events: Events,
    pub(super) waker: Arc<Waker>,
}

impl Poller {
    pub(super) fn new(poll: Poll) -> io::Result<Poller> {
        let waker = Arc::new(Waker::new(poll.registry(), WAKE)?);
        Ok(Poller {
            poll,
            events: Events::with_capacity(64),
            waker,
        })
    }

    /// Registers connection `index`.
    pub(super) fn register(&self, stream: &mut TcpStream, index: usize) -> io::Result<()> {
        self.poll
            .registry()
            .register(stream, Token(index), interest())
    }

    pub(super) fn deregister(&self, stream: &mut TcpStream) -> io::Result<()> {
        self.poll.registry().deregister(stream)
    }

    /// Waits up to `timeout` and hands each connection's event to `each`; returns whether
    /// anything was reported (the waker included; an interrupted wait counts as one).
    pub(super) fn wait(
        &mut self,
        timeout: Option<Duration>,
        mut each: impl FnMut(usize, Event),
    ) -> io::Result<bool> {
        match self.poll.poll(&mut self.events, timeout) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(true),
            Err(e) => return Err(e),
        }
        let mut any = false;
        for event in self.events.iter() {
            any = true;
            if event.token() == WAKE {
                continue;
            }
            each(
                event.token().0,
                Event {
                    readable: event.is_readable() || event.is_read_closed() || event.is_error(),
                    writable: event.is_writable() || event.is_write_closed() || event.is_error(),
                    urgent: event.is_priority(),
                    ended: None,
                },
            );
        }
        Ok(any)
    }

    /// Empties the poller's ready list without waiting (the waker's event, once io_uring
    /// waits on the poller's descriptor: it must read as idle again before the wait is armed
    /// anew).
    pub(super) fn drain(&mut self) {
        let _ = self.poll.poll(&mut self.events, Some(Duration::ZERO));
    }
}
