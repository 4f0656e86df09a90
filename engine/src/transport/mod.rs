//! The transports: how bytes move between ranks, for any backend.
//!
//! - [`tcp`]: a group's TCP connections, their driver (epoll/kqueue or io_uring), failure
//!   notices and inquiries, the bootstrap skeleton, and the engine that drives any
//!   [`Machine`](crate::comm::machine::Machine) over them.

pub(crate) mod tcp;
