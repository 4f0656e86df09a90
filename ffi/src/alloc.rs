//! A counting global allocator, for tests that prove a code path allocates nothing.
//!
//! Install it in a test binary with `#[global_allocator]`; it forwards to the system
//! allocator and counts, per thread, every allocation and reallocation. Per thread,
//! because a collective runs on the thread that calls it, and the test harness's own
//! threads would otherwise add noise.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

/// Every thread's allocations: work handed to another thread (a group's loop thread runs
/// the nonblocking collectives) is counted here and not in the caller's count.
static PROCESS_ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

/// The system allocator, counting the calling thread's allocations.
#[derive(Debug, Default, Clone, Copy)]
pub struct CountingAllocator;

impl CountingAllocator {
    /// Allocations (including reallocations) the calling thread has made so far.
    pub fn thread_allocations() -> u64 {
        ALLOCATIONS.try_with(Cell::get).unwrap_or(0)
    }

    /// Allocations (including reallocations) every thread of the process has made so far.
    pub fn process_allocations() -> u64 {
        PROCESS_ALLOCATIONS.load(Ordering::Relaxed)
    }

    fn count() {
        PROCESS_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // `try_with`: during thread teardown the counter may be gone; not counting then is
        // fine, failing would abort the process.
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
    }
}

// SAFETY: every method forwards its arguments unchanged to `System`, which implements
// `GlobalAlloc` correctly, so this one upholds the trait's contract exactly as `System`
// does; the counters are a const-initialised thread-local `Cell` and a static atomic, which
// never allocate.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        Self::count();
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract for `layout`, which is
        // passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was returned by `System` through this allocator for `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        Self::count();
        // SAFETY: `ptr` was returned by `System` through this allocator for `layout`, and
        // the caller upholds `realloc`'s contract for `new_size`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
