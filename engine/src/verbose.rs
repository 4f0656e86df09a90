//! Diagnostics of forming and failing, through the [`log`] facade, with MLX's stderr lines as
//! the fallback.
//!
//! Every line goes to [`log`] with the target `nuvec_distributed_engine::<module>` of its call site
//! (`nuvec_distributed_engine::ring`, `nuvec_distributed_engine::jaccl`, `nuvec_distributed_engine::native`), and a
//! message starting with the rank (`rank 0: ring formed in 3ms`). A program that installs a
//! logger (env_logger, tracing-log's `LogTracer`, ...) gets the lines its filter accepts:
//! progress at `debug`, a formed group and a forming group's reports of whom it still
//! waits for at `info`, failures at `warn`.
//!
//! A line the installed logger does not take (or every line, when the program installs
//! none) is written to standard error instead, as MLX's ring writes it (`[ring] rank 0:
//! ...`), if `MLX_RING_VERBOSE` (which `mlx.launch --verbose` sets) or
//! `NUVEC_DISTRIBUTED_VERBOSE` is present with any value. So the variables keep working
//! for programs that know nothing of `log`, and never print a line twice.
//!
//! `log` cannot tell "no logger" from "a logger that filters this out", and nothing here
//! installs a logger of its own, since that would make the program's own `set_logger` (or
//! `env_logger::init`, which panics then) fail: asking the logger whether it takes the line
//! answers both cases the same way, which is what the fallback needs.
//!
//! Off, a call site costs an atomic load (`log::max_level`) and a read of a `OnceLock`:
//! neither the arguments nor the message are built unless a line is written. Nothing on a
//! collective's fast path logs anyway; the call sites are setup and failure paths.

use std::fmt;
use std::sync::OnceLock;

use log::{Level, Metadata, Record};

use crate::config::env;

/// Whether a verbose variable is present ([`env::verbose`], read once).
pub(crate) fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| env::verbose(&env::process))
}

/// The target for a call site in `module_path`: the crate and its first module
/// (`nuvec_distributed_engine::ring::bootstrap` gives `nuvec_distributed_engine::ring`), so that a
/// filter names a backend rather than a file; under `transport`, the transport too
/// (`nuvec_distributed_engine::transport::tcp`).
pub(crate) const fn target(module_path: &'static str) -> &'static str {
    let bytes = module_path.as_bytes();
    let mut seps = 0;
    let mut keep = 2;
    let mut i = 0;
    while i + 1 < bytes.len() {
        if bytes[i] == b':' && bytes[i + 1] == b':' {
            seps += 1;
            if seps == 1 && starts_with(bytes, i + 2, b"transport::") {
                keep = 3;
            }
            if seps == keep {
                return module_path.split_at(i).0;
            }
            i += 2;
        } else {
            i += 1;
        }
    }
    module_path
}

/// Whether `bytes` holds `prefix` at `at`.
const fn starts_with(bytes: &[u8], at: usize, prefix: &[u8]) -> bool {
    if bytes.len() < at + prefix.len() {
        return false;
    }
    let mut i = 0;
    while i < prefix.len() {
        if bytes[at + i] != prefix[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// The stderr prefix for `target`: its last part (`ring`, `jaccl`, `native`).
fn component(target: &str) -> &str {
    target.rsplit("::").next().unwrap_or(target)
}

/// Whether a line at `level` for `target` goes anywhere: to the installed logger, or to
/// stderr under a verbose variable. Cheap, so that call sites test it before they build
/// anything.
#[inline]
pub(crate) fn wanted(level: Level, target: &str) -> bool {
    to_logger(level, target) || enabled()
}

/// Whether the installed logger takes a line at `level` for `target` (never, with none).
#[inline]
fn to_logger(level: Level, target: &str) -> bool {
    level <= log::STATIC_MAX_LEVEL
        && level <= log::max_level()
        && log::logger().enabled(&Metadata::builder().level(level).target(target).build())
}

/// Where a line was logged from.
pub(crate) struct Site {
    /// The line's level.
    pub(crate) level: Level,
    /// Its target (see [`target`]).
    pub(crate) target: &'static str,
    /// `module_path!()` at the call site.
    pub(crate) module: &'static str,
    /// `file!()` at the call site.
    pub(crate) file: &'static str,
    /// `line!()` at the call site.
    pub(crate) line: u32,
}

/// Writes one line for `rank`: to the logger if it takes it, else to stderr if a verbose
/// variable is present. Out of line and cold: it only runs when a line is wanted.
#[cold]
#[inline(never)]
pub(crate) fn emit(site: &Site, rank: &dyn fmt::Display, message: fmt::Arguments<'_>) {
    if to_logger(site.level, site.target) {
        log::logger().log(
            &Record::builder()
                .level(site.level)
                .target(site.target)
                .module_path_static(Some(site.module))
                .file_static(Some(site.file))
                .line(Some(site.line))
                .args(format_args!("rank {rank}: {message}"))
                .build(),
        );
    } else if enabled() {
        eprintln!("{}", Line(site.target, rank, message));
    }
}

/// A stderr line as MLX's ring writes it: `[ring] rank 0: message`.
struct Line<'a>(&'a str, &'a dyn fmt::Display, fmt::Arguments<'a>);

impl fmt::Display for Line<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] rank {}: {}", component(self.0), self.1, self.2)
    }
}

/// Logs a line for `rank` (see the module's documentation for where it goes). The rank and
/// message are only evaluated and formatted when the line goes somewhere.
///
/// `verbose!(rank, "...", args)` logs at `debug` (progress); `verbose!(info: rank, ...)`
/// and `verbose!(warn: rank, ...)` at those levels (a formed group, a failure).
macro_rules! verbose {
    (info: $rank:expr, $($arg:tt)*) => {
        $crate::verbose::verbose!(@ ::log::Level::Info, $rank, $($arg)*)
    };
    (warn: $rank:expr, $($arg:tt)*) => {
        $crate::verbose::verbose!(@ ::log::Level::Warn, $rank, $($arg)*)
    };
    (@ $level:expr, $rank:expr, $($arg:tt)*) => {{
        const TARGET: &str = $crate::verbose::target(module_path!());
        if $crate::verbose::wanted($level, TARGET) {
            $crate::verbose::emit(
                &$crate::verbose::Site {
                    level: $level,
                    target: TARGET,
                    module: module_path!(),
                    file: file!(),
                    line: line!(),
                },
                &$rank,
                format_args!($($arg)*),
            );
        }
    }};
    ($rank:expr, $($arg:tt)*) => {
        $crate::verbose::verbose!(@ ::log::Level::Debug, $rank, $($arg)*)
    };
}
pub(crate) use verbose;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_target_is_the_crate_and_its_first_module() {
        assert_eq!(
            target("nuvec_distributed_engine::ring::bootstrap"),
            "nuvec_distributed_engine::ring"
        );
        assert_eq!(
            target("nuvec_distributed_engine::jaccl"),
            "nuvec_distributed_engine::jaccl"
        );
        assert_eq!(
            target("nuvec_distributed_engine"),
            "nuvec_distributed_engine"
        );
        assert_eq!(target(""), "");
        assert_eq!(
            target("nuvec_distributed_engine::transport::tcp::conn"),
            "nuvec_distributed_engine::transport::tcp"
        );
        assert_eq!(
            target("nuvec_distributed_engine::transport"),
            "nuvec_distributed_engine::transport"
        );
        assert_eq!(
            target("nuvec_distributed_engine::transports::x"),
            "nuvec_distributed_engine::transports"
        );
        // Expanded here, the macro's own constant names this module.
        const HERE: &str = target(module_path!());
        assert_eq!(HERE, "nuvec_distributed_engine::verbose");
    }

    #[test]
    fn stderr_lines_are_mlx_s() {
        let line = |target, rank: usize, n: u32| {
            Line(target, &rank, format_args!("formed in {n}ms")).to_string()
        };
        assert_eq!(
            line("nuvec_distributed_engine::ring", 3, 7),
            "[ring] rank 3: formed in 7ms"
        );
        assert_eq!(
            line("nuvec_distributed_engine::jaccl", 0, 1),
            "[jaccl] rank 0: formed in 1ms"
        );
    }

    #[test]
    fn without_a_logger_no_line_goes_to_log() {
        // The unit tests install no logger: `log` must not take anything, so the stderr
        // fallback decides alone.
        assert!(!to_logger(Level::Error, "nuvec_distributed_engine::ring"));
        assert_eq!(
            wanted(Level::Warn, "nuvec_distributed_engine::ring"),
            enabled()
        );
    }
}
