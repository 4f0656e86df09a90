//! Tools for people who run nuvec-distributed: `nuvec launch`, a launcher that starts ranks
//! the way `mlx.launch` does, and the collective benchmark sweep behind `nuvec bench` and
//! `cargo bench --bench collectives`, with the anchors it compares against (MLX's ring,
//! Open MPI over TCP, raw TCP), the comparison and its charts.

pub mod anchors;
pub mod bench;
pub mod chart;
pub mod launch;
pub mod report;
pub mod runner;
