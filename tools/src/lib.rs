//! Tools for people who run nuvec-distributed: `nuvec launch`, a launcher that starts ranks
//! the way `mlx.launch` does; `nuvec doctor`, which checks the hosts before a launch; the
//! collective benchmark sweep behind `nuvec bench` and `cargo bench --bench collectives`,
//! with the anchors it compares against (MLX's ring, Open MPI over TCP, raw TCP), the
//! comparison and its charts; `nuvec flight`, which reads the ranks' flight records after a
//! failure; and [`testing`], the harness every multi-process test (this
//! crate's and nuvec-distributed's) runs its ranks with.

pub mod anchors;
pub mod bench;
pub mod chaos;
pub mod chart;
pub mod doctor;
pub mod flight;
pub mod guardian;
pub mod launch;
pub mod load;
pub mod report;
pub mod runner;
pub mod skew;
pub mod testing;

/// The wire a TCP backend speaks, as `NUVEC_DISTRIBUTED_WIRE`, `--wire` and the reports
/// name it: `native` for [`Backend::Native`](nuvec_distributed_engine::Backend::Native),
/// `mlx` (MLX's ring wire) otherwise.
pub fn wire_name(backend: nuvec_distributed_engine::Backend) -> &'static str {
    match backend {
        nuvec_distributed_engine::Backend::Native => "native",
        _ => "mlx",
    }
}
