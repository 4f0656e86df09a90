//! A group's state behind one mutex, with the error that failed the group and whether it
//! was closed.
//!
//! Collectives are serialised (every rank must issue them in the same order anyway), and
//! the thread holding the lock drives the transport for the duration of its collective.
//! After a transport error the group is failed: every later call gets [`Error::Failed`]
//! with the original error inside, at once, without touching the transport.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::error::{Error, Result};

/// A backend's state `S`, guarded against use after a failure or a close.
///
/// The failure and the close sit beside the mutex, not inside it, so that code holding the
/// lock (and so a `&mut S`) can fail the group, and so that asking whether a group is
/// closed never waits for a collective in flight.
pub(crate) struct Guarded<S> {
    state: Mutex<S>,
    /// The error that failed the group, returned (wrapped) by every later call.
    failed: OnceLock<Arc<Error>>,
    /// Whether the group was closed.
    closed: AtomicBool,
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
            closed: AtomicBool::new(false),
        }
    }

    /// The mutex, whatever happened. A panic while holding the lock can only come from a
    /// bug in this crate; the state is still consistent enough to report errors from, so
    /// it is taken over.
    fn raw(&self) -> MutexGuard<'_, S> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The state, to run a collective on.
    ///
    /// # Errors
    ///
    /// [`Error::GroupClosed`] after [`Guarded::close`]; else [`Error::Failed`] with the
    /// error that failed the group.
    pub(crate) fn lock(&self) -> Result<MutexGuard<'_, S>> {
        let state = self.raw();
        if self.is_closed() {
            return Err(Error::GroupClosed);
        }
        match self.failed.get() {
            Some(error) => Err(Error::Failed(error.clone())),
            None => Ok(state),
        }
    }

    /// Fails the group with `error`: every later [`Guarded::lock`] returns it, wrapped in
    /// [`Error::Failed`]. Called while holding the lock, so the first failure is the only
    /// one; returns `error`, for the call that failed.
    pub(crate) fn fail(&self, error: Error) -> Error {
        let _ = self.failed.set(Arc::new(error.clone()));
        error
    }

    /// Closes the group: the first call runs `release` on the state (to let connections and
    /// buffers go) and returns true; later calls do nothing and return false. A failed
    /// group can be closed.
    pub(crate) fn close(&self, release: impl FnOnce(&mut S)) -> bool {
        let mut state = self.raw();
        if self.closed.swap(true, Ordering::AcqRel) {
            return false;
        }
        release(&mut state);
        true
    }

    /// Whether [`Guarded::close`] was called.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
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
