//! Tools for people who run nuvec-distributed: a local launcher in the manner of
//! `mlx.launch`, and the collective benchmark sweep behind `nuvec bench` and
//! `cargo bench --bench collectives`.

pub mod bench;
pub mod launch;
