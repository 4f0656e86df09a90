//! A group's state behind one mutex, with the error that failed the group and whether it
//! was closed.
//!
//! Collectives are serialised (every rank must issue them in the same order anyway), and
//! the thread holding the lock drives the transport for the duration of its collective.
//! After a transport error the group is failed: every later call gets [`Error::Failed`]
//! with the original error inside, at once, without touching the transport.
//!
//! # Closing from another thread
//!
//! [`Guarded::close`] must not wait for a collective that may be stuck for the whole
//! timeout. It raises the [`CloseFlag`] first, then runs the interrupt the backend
//! installed ([`Guarded::on_close`]: the ring wakes its poller), and only then takes the
//! lock to release the state. The collective in flight watches the flag in its progress
//! loop (one atomic load per round, see [`progress`](super::progress::progress)), returns
//! [`Error::Aborted`], and so hands the lock over within a poller wake-up.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, TryLockError};

use crate::error::{Error, Result};

/// Whether a group was closed: raised by [`Guarded::close`] before it takes the lock, so a
/// collective in flight can see it and give the lock up.
#[derive(Debug, Default)]
pub(crate) struct CloseFlag(AtomicBool);

impl CloseFlag {
    /// Whether the group was closed (or is being closed).
    pub(crate) fn is_set(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    /// Raises the flag; returns whether it was already raised.
    fn raise(&self) -> bool {
        self.0.swap(true, Ordering::AcqRel)
    }
}

/// What [`Guarded::close`] runs to interrupt a collective that waits (wakes a poller).
type Interrupt = Box<dyn Fn() + Send + Sync>;

/// A backend's state `S`, guarded against use after a failure or a close.
///
/// The failure and the close sit beside the mutex, not inside it, so that code holding the
/// lock (and so a `&mut S`) can fail the group, and so that asking whether a group is
/// closed, or closing it, never waits for a collective in flight.
pub(crate) struct Guarded<S> {
    state: Mutex<S>,
    /// The error that failed the group, returned (wrapped) by every later call.
    failed: OnceLock<Arc<Error>>,
    /// Whether the group was closed.
    closed: CloseFlag,
    /// Wakes a collective blocked in its backend's wait, once `closed` is raised.
    interrupt: OnceLock<Interrupt>,
}

impl<S> fmt::Debug for Guarded<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guarded")
            .field("failed", &self.failed.get())
            .field("closed", &self.is_closed())
            .finish_non_exhaustive()
    }
}

impl<S> Guarded<S> {
    /// A usable group over `state`.
    pub(crate) fn new(state: S) -> Guarded<S> {
        Guarded {
            state: Mutex::new(state),
            failed: OnceLock::new(),
            closed: CloseFlag::default(),
            interrupt: OnceLock::new(),
        }
    }

    /// Installs `interrupt`, which [`Guarded::close`] runs after raising the close flag so
    /// that a collective blocked in a wait sees the flag at once. A backend whose waits are
    /// short naps needs none. Only the first one installed counts.
    pub(crate) fn on_close(self, interrupt: impl Fn() + Send + Sync + 'static) -> Guarded<S> {
        let _ = self.interrupt.set(Box::new(interrupt));
        self
    }

    /// The close flag, for a collective's progress loop to watch.
    pub(crate) fn close_flag(&self) -> &CloseFlag {
        &self.closed
    }

    /// The mutex, whatever happened. A panic while holding the lock can only come from a
    /// bug in this crate; the state is still consistent enough to report errors from, so
    /// it is taken over.
    fn raw(&self) -> MutexGuard<'_, S> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// [`Error::GroupClosed`] or [`Error::Failed`] if the group is closed or failed.
    fn usable(&self) -> Result<()> {
        if self.is_closed() {
            return Err(Error::GroupClosed);
        }
        match self.failed.get() {
            Some(error) => Err(Error::Failed(error.clone())),
            None => Ok(()),
        }
    }

    /// The state, to run a collective on.
    ///
    /// # Errors
    ///
    /// [`Error::GroupClosed`] after [`Guarded::close`]; else [`Error::Failed`] with the
    /// error that failed the group.
    pub(crate) fn lock(&self) -> Result<MutexGuard<'_, S>> {
        let state = self.raw();
        self.usable()?;
        Ok(state)
    }

    /// The state if no collective holds it, without waiting: `Ok(None)` while one does (its
    /// own errors will tell of a failure; the flags say what is already known).
    ///
    /// # Errors
    ///
    /// As [`Guarded::lock`], whether or not the state is free.
    pub(crate) fn try_lock(&self) -> Result<Option<MutexGuard<'_, S>>> {
        let state = match self.state.try_lock() {
            Ok(state) => Some(state),
            Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        };
        self.usable()?;
        Ok(state)
    }

    /// Fails the group with `error`: every later [`Guarded::lock`] returns it, wrapped in
    /// [`Error::Failed`]. Called while holding the lock, so the first failure is the only
    /// one; returns `error`, for the call that failed.
    pub(crate) fn fail(&self, error: Error) -> Error {
        let _ = self.failed.set(Arc::new(error.clone()));
        error
    }

    /// Closes the group, from any thread: raises the close flag, interrupts a collective in
    /// flight (which then returns [`Error::Aborted`] and lets the lock go), takes the lock
    /// and runs `release` on the state (to let connections and buffers go). The first call
    /// returns true once released; later calls return false at once (the first may still be
    /// releasing, but the group already refuses every call). A failed group can be closed.
    pub(crate) fn close(&self, release: impl FnOnce(&mut S)) -> bool {
        if self.closed.raise() {
            return false;
        }
        if let Some(interrupt) = self.interrupt.get() {
            interrupt();
        }
        release(&mut self.raw());
        true
    }

    /// Whether [`Guarded::close`] was called.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.is_set()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::PeerOp;

    fn closed_by(peer: usize) -> Error {
        Error::Closed {
            peer,
            op: PeerOp::Receive,
            context: crate::error::Phase::AllSum,
        }
    }

    #[test]
    fn a_fresh_group_locks_and_keeps_its_state() {
        let g = Guarded::new(1u32);
        *g.lock().unwrap() += 1;
        assert_eq!(*g.lock().unwrap(), 2);
        assert!(!g.is_closed());
    }

    #[test]
    fn after_a_failure_every_lock_returns_the_original_error() {
        let g = Guarded::new(());
        // Only the first failure counts: later ones come from the same collective's wind-up.
        let locked = g.lock().unwrap();
        let returned = g.fail(closed_by(3));
        drop(locked);
        assert!(
            matches!(returned, Error::Closed { peer: 3, .. }),
            "{returned}"
        );
        for _ in 0..2 {
            match g.lock() {
                Err(Error::Failed(inner)) => {
                    assert!(matches!(*inner, Error::Closed { peer: 3, .. }), "{inner}");
                }
                Err(e) => panic!("expected Failed, got {e}"),
                Ok(_) => panic!("a failed group locked"),
            }
        }
        g.fail(closed_by(7));
        assert!(
            matches!(g.lock(), Err(Error::Failed(inner)) if matches!(*inner, Error::Closed { peer: 3, .. }))
        );
        assert!(!g.is_closed(), "failing is not closing");
    }

    #[test]
    fn close_runs_release_once_and_later_locks_say_closed() {
        let g = Guarded::new(Some(vec![1u8; 4]));
        assert!(g.close(|s| *s = None));
        assert!(g.is_closed());
        assert!(matches!(g.lock(), Err(Error::GroupClosed)));
        // The second close finds nothing to release.
        assert!(!g.close(|_| panic!("released twice")));
        assert!(matches!(g.lock(), Err(Error::GroupClosed)));
    }

    #[test]
    fn closed_wins_over_failed() {
        let g = Guarded::new(());
        g.fail(closed_by(1));
        assert!(g.close(|_| ()));
        assert!(matches!(g.lock(), Err(Error::GroupClosed)));
    }

    /// A collective in flight on another thread, modelled as the progress loop is: it holds
    /// the lock and blocks in a "poller" (a channel) that only the interrupt wakes, then
    /// checks the close flag.
    #[test]
    fn close_and_try_lock_do_not_wait_for_a_collective_in_flight() {
        use std::sync::mpsc;
        use std::time::{Duration, Instant};

        let (wake, poller) = mpsc::channel::<()>();
        let g = Guarded::new(vec![0u8; 16]).on_close(move || {
            let _ = wake.send(());
        });
        let (held_tx, held) = mpsc::channel();
        let g = &g;
        std::thread::scope(|s| {
            let collective = s.spawn(move || {
                let state = g.lock().expect("a fresh group locks");
                held_tx.send(()).unwrap();
                // Blocks far longer than the test allows, unless interrupted.
                let woke = poller.recv_timeout(Duration::from_secs(30)).is_ok();
                let saw_flag = g.close_flag().is_set();
                drop(state);
                (woke, saw_flag, Instant::now())
            });
            held.recv().unwrap();

            // While the collective holds the state, try_lock reports the flags at once.
            let start = Instant::now();
            assert!(matches!(g.try_lock(), Ok(None)), "busy, not failed");
            assert!(start.elapsed() < Duration::from_secs(1));

            let start = Instant::now();
            assert!(g.close(|s| s.clear()), "the first close releases");
            let closed_in = start.elapsed();
            let (woke, saw_flag, returned) = collective.join().unwrap();
            assert!(woke, "the interrupt woke the collective");
            assert!(saw_flag, "the flag was raised before the interrupt ran");
            assert!(returned <= Instant::now());
            // Generous: the point is not waiting the 30 s the collective would block.
            assert!(
                closed_in < Duration::from_secs(5),
                "close took {closed_in:?}"
            );
        });
        assert!(g.raw().is_empty(), "the state was released");
        assert!(matches!(g.try_lock(), Err(Error::GroupClosed)));
        assert!(matches!(g.lock(), Err(Error::GroupClosed)));
        assert!(!g.close(|_| panic!("released twice")));
    }

    #[test]
    fn try_lock_reports_a_failure_or_close_even_while_busy() {
        let g = Guarded::new(());
        let held = g.lock().unwrap();
        g.fail(closed_by(2));
        match g.try_lock() {
            Err(Error::Failed(inner)) => assert_eq!(inner.peer(), Some(2)),
            other => panic!("expected Failed, got {:?}", other.map(|s| s.is_some())),
        }
        drop(held);
        assert!(matches!(g.try_lock(), Err(Error::Failed(_))));
        let fresh = Guarded::new(());
        let held = fresh.lock().unwrap();
        assert!(matches!(fresh.try_lock(), Ok(None)));
        drop(held);
        assert!(matches!(fresh.try_lock(), Ok(Some(_))));
        fresh.close(|_| ());
        assert!(matches!(fresh.try_lock(), Err(Error::GroupClosed)));
    }

    #[test]
    fn a_panic_while_locked_does_not_poison_the_group() {
        let g = Guarded::new(5u8);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _guard = g.lock().unwrap();
            panic!("a bug while holding the lock");
        }));
        assert!(caught.is_err());
        assert_eq!(*g.lock().unwrap(), 5);
    }
}
