//! Collectives over MLX's distributed backends, from Rust.
//!
//! `nuvec-distributed` runs `all_sum`, `all_max`, `all_min`, `all_gather`, `sum_scatter`,
//! `send`/`recv` and `barrier` between processes on one machine or many, over the
//! backends of MLX's `mx.distributed`:
//!
//! - **ring**: MLX's TCP ring, started the way MLX starts it (`MLX_HOSTFILE`, `MLX_RANK`,
//!   the same hostfile) and byte-compatible on the wire, so Rust ranks and Python
//!   `mx.distributed` ranks can form one ring and get bit-identical results.
//! - **jaccl** (feature `jaccl`, **experimental**): MLX's RDMA backend over Thunderbolt 5,
//!   following MLX 0.32.1's side channel and message schedule. It is tested on an emulated
//!   fabric only and **unverified on Thunderbolt hardware** until someone runs
//!   `tests/jaccl_hardware.rs` on Macs; its ring all_gather deliberately differs from MLX's
//!   defective one. See the `jaccl` module.
//!
//! ```no_run
//! # fn main() -> nuvec_distributed::Result<()> {
//! // Under `mlx.launch` (or `nuvec launch`), MLX_HOSTFILE and MLX_RANK describe the ring;
//! // without them this is the group of this process alone.
//! let group = nuvec_distributed::init(false)?;
//! let mut x = [1.0f32, 2.0, 3.0];
//! group.all_sum(&mut x)?; // the element-wise sum over every rank, in place
//! println!("rank {} of {}: {x:?}", group.rank(), group.size());
//! # Ok(())
//! # }
//! ```
//!
//! Every rank must call the same collectives in the same order with the same lengths, as
//! with MLX: neither backend's wire carries anything but element bytes.
//!
//! # Failures
//!
//! Every wait is bounded by [`Options::timeout`] (30 s by default; `NUVEC_DISTRIBUTED_TIMEOUT`
//! in seconds for [`init`]). An error from the transport names the peer rank and what
//! failed; after one, the group is failed and every later call returns
//! [`Error::Failed`] at once. Argument errors leave the group usable.

#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![doc(test(attr(deny(warnings))))]

mod backend;
mod element;
mod error;
mod group;
mod hostfile;
#[cfg(feature = "jaccl")]
pub mod jaccl;
mod options;
mod reduce;
mod ring;

pub use backend::{
    Backend, HOSTFILE_VAR, RANK_VAR, init_backend, init_with, is_available, unavailable_reason,
};
pub use element::{Complex64, DType, Element};
pub use error::{Error, PeerOp, Result};
pub use group::{
    Communicator, Group, all_gather, all_max, all_min, all_sum, barrier, default_group, recv, send,
    set_default_group, sum_scatter,
};
pub use half::{bf16, f16};
pub use options::{Options, TIMEOUT_VAR};
pub use reduce::ReduceOp;

/// Initialises a backend from MLX's launch environment and makes it the default group, as
/// `mx.distributed.init()`: [`init_backend`] with [`Backend::Any`].
///
/// # Errors
///
/// As [`init_backend`].
pub fn init(strict: bool) -> Result<Group> {
    init_backend(strict, Backend::Any)
}
