//! Readable logs of forming and failing, on standard error, for people debugging a ring.
//!
//! Off unless `MLX_RING_VERBOSE` (MLX's own switch, which `mlx.launch --verbose` sets) or
//! `NUVEC_DISTRIBUTED_VERBOSE` is present in the environment, with any value. Lines start
//! with `[ring]` and the rank, as MLX's do. Nothing on a collective's fast path logs.

use std::sync::OnceLock;

/// MLX's variable.
pub const MLX_VAR: &str = "MLX_RING_VERBOSE";
/// Ours.
pub const NUVEC_VAR: &str = "NUVEC_DISTRIBUTED_VERBOSE";

/// Whether logging is on (read once).
pub(crate) fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os(MLX_VAR).is_some() || std::env::var_os(NUVEC_VAR).is_some())
}

/// Logs a line for `rank` if logging is on. The message is only built when it is.
macro_rules! verbose {
    ($rank:expr, $($arg:tt)*) => {
        if $crate::verbose::enabled() {
            eprintln!("[ring] rank {}: {}", $rank, format_args!($($arg)*));
        }
    };
}
pub(crate) use verbose;
