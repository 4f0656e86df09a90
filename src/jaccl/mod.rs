//! JACCL: MLX's RDMA backend over Thunderbolt 5 (feature `jaccl`). **Experimental.**

mod buffers;
pub mod config;
mod driver;
#[cfg(test)]
mod emulated;
mod fabric;
pub mod frames;
mod group;
mod mesh;
mod reduce;
mod ring;
mod side_channel;

pub use config::{Config, DeviceMatrix, Topology};
pub use frames::SizeClasses;
#[cfg(test)]
mod tests;
