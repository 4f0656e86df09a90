//! JACCL: MLX's RDMA backend over Thunderbolt 5 (feature `jaccl`). **Experimental.**

pub mod config;
pub mod frames;
mod side_channel;

pub use config::{Config, DeviceMatrix, Topology};
pub use frames::SizeClasses;
