//! Tools for people who run nuvec-distributed: `nuvec launch`, a launcher that starts ranks
//! the way `mlx.launch` does, and the collective benchmark sweep behind `nuvec bench` and
//! `cargo bench --bench collectives`.

pub mod bench;
pub mod launch;
pub mod runner;
