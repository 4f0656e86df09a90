//! The one crate of nuvec-distributed that may use `unsafe`.
//!
//! `nuvec-distributed` itself is `#![forbid(unsafe_code)]`: the compiler, not a reviewer,
//! keeps unsafe code out of it. What cannot be written safely lives here, behind safe
//! functions, and every unsafe site is listed in `SAFETY.md` at the repository root with the
//! invariant it relies on and the test that exercises it.
//!
//! - [`net`]: the socket calls that safe crates do not offer in a form that can be read
//!   without `unsafe`.
//! - [`lend`]: lending a borrowed buffer to a thread that outlives the borrow, for the
//!   nonblocking collectives; the lender waits for every loan before it returns.
//! - [`alloc`]: a counting global allocator, for tests that prove a path allocates nothing.
//! - [`shm`]: shared-memory segments between the ranks of one host, and the address wait
//!   (futex, `__ulock_wait`) a rank sleeps on until a peer publishes.
//! - [`simd`]: the SIMD reduction kernels, dispatched at run time on the CPU's features.
//! - `uring` (Linux): io_uring transfers and readiness waits, under the contract that no
//!   operation on a caller's buffer outlives the call that submitted it.
//! - [`process`]: the parent-death signal (Linux), so that a launcher's ranks die with it.
//! - [`probes`]: USDT tracing probes (feature `probes`), whose macros expand to inline
//!   assembly.
//! - `verbs` (feature `verbs`): the RDMA verbs API, loaded at run time, behind wrappers that
//!   own their resources and hand registered memory to the hardware by ownership.

pub mod alloc;
pub mod lend;
pub mod net;
pub mod probes;
pub mod process;
pub mod shm;
pub mod simd;
#[cfg(target_os = "linux")]
pub mod uring;
#[cfg(feature = "verbs")]
pub mod verbs;
