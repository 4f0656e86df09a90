//! RDMA: two-sided SENDs over Unreliable Connected queue pairs, as JACCL uses them.
//!
//! - [`fabric`]: what the algorithms need from RDMA (numbered connections, registered
//!   buffers posted whole, completions) and who owns a buffer while it is in flight;
//! - [`verbs`]: that fabric on real queue pairs through the verbs binding in `ffi`, and the
//!   device listing;
//! - [`engine`]: drives a backend's machines over a fabric on the calling thread, with
//!   [`comm::progress`](crate::comm::progress)'s wait policy;
//! - `emulated` (tests): the same fabric in memory, with the semantics observed on Apple's
//!   Thunderbolt transport, so that the algorithms run without hardware.
//!
//! The layout of the buffers (which buffer a message of a given size and pipeline slot
//! uses), the message sizes and the side channel that exchanges queue-pair addresses are the
//! backend's: [`jaccl`](crate::jaccl) chooses them as MLX does and hands them down as
//! [`fabric::BufferSpec`]s, a [`fabric::Queues`] and [`fabric::Destination`]s.

#[cfg(test)]
pub(crate) mod emulated;
pub(crate) mod engine;
pub(crate) mod fabric;
pub(crate) mod verbs;
