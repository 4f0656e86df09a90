//! The one crate of nuvec-distributed that may use `unsafe`.
//!
//! `nuvec-distributed` itself is `#![forbid(unsafe_code)]`: the compiler, not a reviewer,
//! keeps unsafe code out of it. What cannot be written safely lives here, behind safe
//! functions, and every unsafe site is listed in `SAFETY.md` at the repository root with the
//! invariant it relies on and the test that exercises it.
//!
//! The ring backend needs nothing from this crate yet: its sockets, page-aligned buffers
//! and socket options all come from safe APIs (mio, memmap2, socket2).
