//! Lending a borrowed buffer to a thread that outlives the borrow.
//!
//! A group's nonblocking collectives run on the group's own thread, which lives as long as
//! the group, while the buffers they read and write are borrowed by the caller for a much
//! shorter time. Safe Rust cannot hand a `&'a mut [u8]` to a thread that was not started
//! inside `'a`: nothing would stop the borrow from ending while that thread still writes.
//! A handle whose `Drop` waits does not stop it either, because `std::mem::forget` is safe
//! (the hole that removed `thread::scoped` before Rust 1.0).
//!
//! [`lend`] closes it the way `std::thread::scope` does: the buffers are lent inside a
//! closure, and `lend` does not return (nor unwind) before every [`Loan`] taken out of its
//! [`Ledger`] has been dropped. A loan can be leaked (forgotten) without harm: then `lend`
//! waits forever, which is a hang, never a write into memory that was given back. So the
//! lifetime erased in a [`Loan`] is always still live while the loan exists, and a loan's
//! bytes are safe to reach from any thread that holds it.

use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::{Arc, Condvar, Mutex, PoisonError};

/// Counts the loans out of every [`lend`] scope that uses it, so that a scope can wait for
/// them to come back. One ledger may serve many scopes, in turn or at once: a scope then
/// waits for every loan of the ledger, which is longer than it needs, never shorter.
#[derive(Default)]
pub struct Ledger {
    out: Mutex<usize>,
    back: Condvar,
}

impl fmt::Debug for Ledger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ledger")
            .field("outstanding", &self.outstanding())
            .finish()
    }
}

impl Ledger {
    /// A ledger with no loans out.
    pub fn new() -> Arc<Ledger> {
        Arc::new(Ledger::default())
    }

    /// How many loans are out now.
    pub fn outstanding(&self) -> usize {
        *self.out.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn take_out(&self) {
        *self.out.lock().unwrap_or_else(PoisonError::into_inner) += 1;
    }

    fn give_back(&self) {
        let mut out = self.out.lock().unwrap_or_else(PoisonError::into_inner);
        *out = out.saturating_sub(1);
        if *out == 0 {
            self.back.notify_all();
        }
    }

    fn wait_all_back(&self) {
        let mut out = self.out.lock().unwrap_or_else(PoisonError::into_inner);
        while *out > 0 {
            out = self.back.wait(out).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// Lends buffers borrowed for `'scope` (see [`lend`]).
///
/// Invariant in `'scope` and `'env`, as `std::thread::Scope`: the closure cannot shorten
/// `'scope` to a borrow that ends inside it.
pub struct Lender<'scope, 'env: 'scope> {
    ledger: Arc<Ledger>,
    scope: PhantomData<&'scope mut &'scope ()>,
    env: PhantomData<&'env mut &'env ()>,
}

impl fmt::Debug for Lender<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lender")
            .field("ledger", &self.ledger)
            .finish()
    }
}

impl<'scope> Lender<'scope, '_> {
    /// Lends `bytes` for writing until the returned loan is dropped.
    pub fn lend_mut(&'scope self, bytes: &'scope mut [u8]) -> LoanMut {
        self.ledger.take_out();
        let len = bytes.len();
        // `bytes` is not used after the pointer is taken from it: the loan is its only user.
        LoanMut {
            ptr: NonNull::from(bytes).cast(),
            len,
            ledger: Arc::clone(&self.ledger),
        }
    }

    /// Lends `bytes` for reading until the returned loan is dropped.
    pub fn lend(&'scope self, bytes: &'scope [u8]) -> Loan {
        self.ledger.take_out();
        Loan {
            ptr: NonNull::from(bytes).cast(),
            len: bytes.len(),
            ledger: Arc::clone(&self.ledger),
        }
    }
}

/// Runs `f` with a [`Lender`] whose loans are counted in `ledger`, then waits until every
/// loan of `ledger` is back (dropped), also when `f` panics; returns what `f` returned.
pub fn lend<'env, R>(
    ledger: &Arc<Ledger>,
    f: impl for<'scope> FnOnce(&'scope Lender<'scope, 'env>) -> R,
) -> R {
    /// Waits in `drop`, so that an unwinding `f` waits too.
    struct WaitForLoans<'a>(&'a Ledger);
    impl Drop for WaitForLoans<'_> {
        fn drop(&mut self) {
            self.0.wait_all_back();
        }
    }
    let lender = Lender {
        ledger: Arc::clone(ledger),
        scope: PhantomData,
        env: PhantomData,
    };
    let _wait = WaitForLoans(ledger);
    f(&lender)
}

/// What both loans have alike: their length, giving the bytes back when dropped, and a
/// `Debug` that shows the length only (not the borrowed bytes).
macro_rules! loan_common {
    ($loan:ident) => {
        impl $loan {
            /// How many bytes are lent.
            pub fn len(&self) -> usize {
                self.len
            }

            /// Whether the loan holds no bytes.
            pub fn is_empty(&self) -> bool {
                self.len == 0
            }
        }

        impl Drop for $loan {
            fn drop(&mut self) {
                self.ledger.give_back();
            }
        }

        impl fmt::Debug for $loan {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($loan))
                    .field("len", &self.len)
                    .finish()
            }
        }
    };
}

/// Bytes lent for writing by [`Lender::lend_mut`]; gives them back when dropped.
pub struct LoanMut {
    ptr: NonNull<u8>,
    len: usize,
    ledger: Arc<Ledger>,
}

// SAFETY: a `LoanMut` stands for a `&mut [u8]`, which is `Send`; the borrow it erased is
// live for as long as the loan exists (`lend` waits for it), and nothing else reaches the
// bytes meanwhile, because `lend_mut` took that borrow exclusively for `'scope`.
unsafe impl Send for LoanMut {}

impl LoanMut {
    /// The lent bytes, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` and `len` come from a `&'scope mut [u8]` that `lend_mut` took for
        // `'scope`, and `lend` does not let `'scope` end while this loan exists, so the
        // memory is live and no one else reaches it; `&mut self` makes this reference the
        // only one made from the loan at a time.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

loan_common!(LoanMut);

/// Bytes lent for reading by [`Lender::lend`]; gives them back when dropped.
pub struct Loan {
    ptr: NonNull<u8>,
    len: usize,
    ledger: Arc<Ledger>,
}

// SAFETY: a `Loan` stands for a `&[u8]`, which is `Send`; the borrow it erased is live for
// as long as the loan exists (`lend` waits for it), and no one may write the bytes
// meanwhile, because `lend` took a shared borrow of them for `'scope`.
unsafe impl Send for Loan {}

impl Loan {
    /// The lent bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` and `len` come from a `&'scope [u8]`, and `lend` does not let
        // `'scope` end while this loan exists, so the memory is live and unwritten.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

loan_common!(Loan);

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    #[test]
    fn a_lent_buffer_is_written_by_another_thread_and_lend_waits_for_it() {
        let ledger = Ledger::new();
        let (tx, rx) = mpsc::channel::<LoanMut>();
        let worker = std::thread::spawn(move || {
            for mut loan in rx {
                std::thread::sleep(Duration::from_millis(50));
                loan.bytes_mut().fill(7);
            }
        });
        let mut buf = [0u8; 64];
        let start = Instant::now();
        lend(&ledger, |lender| {
            tx.send(lender.lend_mut(&mut buf)).unwrap();
        });
        // `lend` returned only after the worker wrote and dropped the loan.
        assert!(start.elapsed() >= Duration::from_millis(50));
        assert_eq!(buf, [7; 64]);
        assert_eq!(ledger.outstanding(), 0);
        drop(tx);
        worker.join().unwrap();
    }

    #[test]
    fn lend_waits_for_loans_when_the_closure_panics() {
        let ledger = Ledger::new();
        let (tx, rx) = mpsc::channel::<Loan>();
        let worker = std::thread::spawn(move || {
            for loan in rx {
                std::thread::sleep(Duration::from_millis(50));
                assert_eq!(loan.bytes(), &[1, 2, 3]);
            }
        });
        let buf = [1u8, 2, 3];
        let start = Instant::now();
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            lend(&ledger, |lender| {
                tx.send(lender.lend(&buf)).unwrap();
                panic!("the scope's closure panics with a loan out");
            })
        }));
        assert!(caught.is_err());
        assert!(start.elapsed() >= Duration::from_millis(50));
        assert_eq!(ledger.outstanding(), 0);
        drop(tx);
        worker.join().unwrap();
    }
}
