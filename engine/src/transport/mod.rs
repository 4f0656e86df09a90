//! The transports: what moves a backend's bytes between ranks, below the backends and above
//! [`comm`](crate::comm). Each transport has its own directory with the same file names
//! where they apply: `mod.rs` (the transport's surface), `protocol.rs` (its sans-IO
//! machine, where the transport schedules collectives itself), `engine.rs` (drives a
//! machine over it with [`comm::progress`](crate::comm::progress)), and the files that
//! hold its kind of connection.
//!
//! - [`tcp`]: a group's TCP connections, their driver (epoll/kqueue or io_uring), failure
//!   notices and inquiries, the bootstrap skeleton, and the engine that drives any
//!   [`Machine`](crate::comm::machine::Machine) over them.
//! - [`rdma`] (feature `jaccl`): queue pairs and completions over verbs, and an in-memory
//!   fabric with Apple's semantics for tests.
//! - [`shm`]: shared memory between the ranks of one host: the segment and its layout, the
//!   step machine that schedules every collective through it, the engine that drives that
//!   machine, per-pair slots for `send`/`recv`, and the check that ranks share a segment.
//!
//! A transport knows no backend: the backends choose its parameters (message sizes, packet
//! sequence numbers, buffer layouts, call headers) and hand them down.

#[cfg(feature = "jaccl")]
pub(crate) mod rdma;
pub(crate) mod shm;
pub(crate) mod tcp;
