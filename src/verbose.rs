//! Readable logs of forming and failing, on standard error, for people debugging a ring.
//!
//! Off unless `MLX_RING_VERBOSE` (MLX's own switch, which `mlx.launch --verbose` sets) or
//! `NUVEC_DISTRIBUTED_VERBOSE` is present in the environment, with any value. Lines start
//! with `[ring]` and the rank, as MLX's do. Nothing on a collective's fast path logs.

use std::sync::OnceLock;

use crate::config::env;

/// Whether logging is on ([`env::verbose`], read once).
pub(crate) fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| env::verbose(&env::process))
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
