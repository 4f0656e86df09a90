//! Every environment variable the library reads, named and documented here once, and the
//! typed reading of each. Errors name the variable and what is wrong with its value.
//!
//! The readers (crate-internal) take a lookup function rather than reading the process
//! environment themselves, so that tests, and the round trip with the launcher's writer, can
//! hand them a map; `init` passes the process environment.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use crate::auth::Secret;
use crate::error::{Error, Result};
use crate::options::Options;

/// The variable naming the ring's hostfile, as `mlx.launch` sets it.
pub const HOSTFILE_VAR: &str = "MLX_HOSTFILE";
/// The variable holding this process's rank, as `mlx.launch` sets it.
pub const RANK_VAR: &str = "MLX_RANK";

// The key's variable is defined next to the handshake it feeds; it is listed here so that
// every variable can be found in one place.
pub use crate::auth::KEY_VAR;

/// The variable [`init`](crate::init) reads the timeout from, in seconds.
pub const TIMEOUT_VAR: &str = "NUVEC_DISTRIBUTED_TIMEOUT";

/// The variable [`init`](crate::init) reads [`Options::tcp_congestion`] from.
pub const TCP_CONGESTION_VAR: &str = "NUVEC_DISTRIBUTED_TCP_CONGESTION";

/// The variable [`init`](crate::init) reads [`Options::socket_buffer`] from, in bytes.
pub const SOCKET_BUFFER_VAR: &str = "NUVEC_DISTRIBUTED_SOCKET_BUFFER";

/// The variable [`init`](crate::init) reads [`Options::spin`] from, in microseconds.
pub const SPIN_VAR: &str = "NUVEC_DISTRIBUTED_SPIN_US";

/// The environment variable that lowers the SIMD level of reductions: `scalar`, `avx2`,
/// `avx512` or `neon` (a level the CPU lacks leaves the detected one). [`init`](crate::init)
/// rejects a value that names no level. See [`simd_level`](crate::simd_level).
///
/// The kernels live in the `ffi` crate, which reads this variable itself when it picks the
/// level (it cannot depend on this crate); this crate only checks the value.
pub const SIMD_VAR: &str = ffi::simd::SIMD_VAR;

/// MLX's switch for the ring's setup logs (`mlx.launch --verbose` sets it): present with any
/// value turns them on.
pub const RING_VERBOSE_VAR: &str = "MLX_RING_VERBOSE";
/// This crate's switch for the same logs.
pub const VERBOSE_VAR: &str = "NUVEC_DISTRIBUTED_VERBOSE";

/// The variable naming JACCL's device file, as `mlx.launch --backend jaccl` sets it.
pub const DEVICES_VAR: &str = "MLX_IBV_DEVICES";
/// The variable holding JACCL's coordinator (`ip:port` where rank 0 listens for the side
/// channel), as `mlx.launch --backend jaccl` sets it.
pub const COORDINATOR_VAR: &str = "MLX_JACCL_COORDINATOR";
/// The variable that, present with any value, makes JACCL prefer its ring, as
/// `mlx.launch --backend jaccl-ring` sets it.
pub const JACCL_RING_VAR: &str = "MLX_JACCL_RING";

/// JACCL's variables holding this process's rank, in lookup order (`JACCL_*` first, as MLX).
pub const JACCL_RANK_VARS: [&str; 2] = ["JACCL_RANK", RANK_VAR];
/// JACCL's variables naming the device file, in lookup order.
pub const JACCL_DEVICES_VARS: [&str; 2] = ["JACCL_IBV_DEVICES", DEVICES_VAR];
/// JACCL's variables holding the coordinator's `ip:port`, in lookup order.
pub const JACCL_COORDINATOR_VARS: [&str; 2] = ["JACCL_COORDINATOR", COORDINATOR_VAR];
/// JACCL's variables that, when present with any value, prefer the ring, in lookup order.
pub const JACCL_RING_VARS: [&str; 2] = ["JACCL_RING", JACCL_RING_VAR];

/// The variable that overrides JACCL's size classes: `small` (macOS 26.2) or `large` (26.3+).
pub const JACCL_BUFFERS_VAR: &str = "NUVEC_JACCL_BUFFERS";

/// Where a reader finds a variable's value.
pub(crate) type Lookup<'a> = &'a dyn Fn(&str) -> Option<OsString>;

/// The process environment.
pub(crate) fn process(name: &str) -> Option<OsString> {
    std::env::var_os(name)
}

/// A variable's value as text (lossy for values that are not UTF-8, as everywhere here).
fn text(vars: Lookup<'_>, name: &str) -> Option<String> {
    vars(name).map(|v| v.to_string_lossy().into_owned())
}

/// What `mlx.launch` tells a ring rank: its hostfile and rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RingLaunch {
    /// [`HOSTFILE_VAR`].
    pub(crate) hostfile: PathBuf,
    /// [`RANK_VAR`].
    pub(crate) rank: usize,
}

/// The ring's launch variables. The inner `Err` says why the environment does not describe
/// a ring (one of the two is unset: not an error unless `strict`); the outer one is a rank
/// that is not a number.
pub(crate) fn ring_launch(vars: Lookup<'_>) -> Result<std::result::Result<RingLaunch, String>> {
    let hostfile = vars(HOSTFILE_VAR);
    let rank = vars(RANK_VAR);
    let (Some(hostfile), Some(rank)) = (&hostfile, &rank) else {
        let show = |v: &Option<OsString>| {
            v.as_ref()
                .map(|s| format!("{:?}", s.to_string_lossy()))
                .unwrap_or_else(|| "unset".into())
        };
        return Ok(Err(format!(
            "both {RANK_VAR} and {HOSTFILE_VAR} must be set (as mlx.launch sets them), but \
             {RANK_VAR} is {} and {HOSTFILE_VAR} is {}",
            show(&rank),
            show(&hostfile)
        )));
    };
    let rank_text = rank.to_string_lossy();
    let rank: usize = rank_text.trim().parse().map_err(|_| Error::Environment {
        var: RANK_VAR,
        reason: format!("{rank_text:?} is not a rank (a whole number from 0)"),
    })?;
    Ok(Ok(RingLaunch {
        hostfile: PathBuf::from(hostfile),
        rank,
    }))
}

/// [`Options`] from [`TIMEOUT_VAR`], [`TCP_CONGESTION_VAR`], [`SOCKET_BUFFER_VAR`],
/// [`SPIN_VAR`] and [`KEY_VAR`]; unset variables keep the defaults.
///
/// Empty values: an empty key, spin, socket buffer or congestion is as if unset, but an
/// empty timeout is an error (it is not a number).
pub(crate) fn options(vars: Lookup<'_>) -> Result<Options> {
    let mut options = Options::default();
    if let Some(secret) = vars(KEY_VAR).filter(|s| !s.is_empty()) {
        let secret = Secret::new(secret.as_encoded_bytes());
        if let Err(e) = secret.key() {
            return Err(Error::Environment {
                var: KEY_VAR,
                reason: e.to_string(),
            });
        }
        options.key = Some(secret);
    }
    if let Some(text) = text(vars, TIMEOUT_VAR) {
        options.timeout = parse_timeout(&text)?;
    }
    if let Some(text) = text(vars, TCP_CONGESTION_VAR) {
        let name = text.trim().to_string();
        if !name.is_empty() {
            options.tcp_congestion = Some(name);
        }
    }
    if let Some(text) = text(vars, SPIN_VAR).filter(|t| !t.is_empty()) {
        let micros = text.trim().parse::<u64>().map_err(|_| Error::Environment {
            var: SPIN_VAR,
            reason: format!("{text:?} is not a whole number of microseconds"),
        })?;
        options.spin = Duration::from_micros(micros);
    }
    if let Some(text) = text(vars, SOCKET_BUFFER_VAR).filter(|t| !t.is_empty()) {
        let bytes = text
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|&b| b > 0)
            .ok_or_else(|| Error::Environment {
                var: SOCKET_BUFFER_VAR,
                reason: format!("{text:?} is not a positive number of bytes"),
            })?;
        options.socket_buffer = Some(bytes);
    }
    Ok(options)
}

/// A value of [`TIMEOUT_VAR`]: seconds, fractional allowed, at least a nanosecond and at
/// most [`Duration::MAX`]. Any such value is safe: deadlines past what the clock holds
/// saturate (see `options::deadline`).
pub(crate) fn parse_timeout(text: &str) -> Result<Duration> {
    let bad = |why: &str| Error::Environment {
        var: TIMEOUT_VAR,
        reason: format!("{text:?} {why}"),
    };
    let seconds: f64 = text
        .trim()
        .parse()
        .map_err(|_| bad("is not a number of seconds"))?;
    if seconds.is_nan() || seconds <= 0.0 {
        return Err(bad("must be more than zero seconds"));
    }
    match Duration::try_from_secs_f64(seconds) {
        Ok(d) if d.is_zero() => Err(bad("is less than a nanosecond")),
        Ok(d) => Ok(d),
        Err(_) => Err(bad("is too large (more than 2^64 seconds)")),
    }
}

/// Whether the ring's setup logs are on: [`RING_VERBOSE_VAR`] or [`VERBOSE_VAR`] present,
/// with any value (even empty).
pub(crate) fn verbose(vars: Lookup<'_>) -> bool {
    vars(RING_VERBOSE_VAR).is_some() || vars(VERBOSE_VAR).is_some()
}

/// Checks [`SIMD_VAR`], so that a typo is an error rather than a silently ignored setting.
/// Unset or empty (after trimming) asks for nothing.
pub(crate) fn simd_request(vars: Lookup<'_>) -> Result<()> {
    match text(vars, SIMD_VAR) {
        None => Ok(()),
        Some(value) => check_simd_request(&value),
    }
}

/// A value of [`SIMD_VAR`] as [`simd_request`] judges it.
fn check_simd_request(value: &str) -> Result<()> {
    ffi::simd::parse_request(value)
        .map(|_| ())
        .map_err(|reason| Error::Environment {
            var: SIMD_VAR,
            reason,
        })
}

/// What `mlx.launch --backend jaccl` (or `jaccl-ring`) tells a rank.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(not(feature = "jaccl"), allow(dead_code))] // read by the jaccl backend and tests
pub(crate) struct JacclLaunch {
    /// [`JACCL_RANK_VARS`]; 0 when neither is set.
    pub(crate) rank: usize,
    /// [`JACCL_DEVICES_VARS`].
    pub(crate) devices: Option<PathBuf>,
    /// [`JACCL_COORDINATOR_VARS`], as given (resolved when the group forms).
    pub(crate) coordinator: Option<String>,
    /// [`JACCL_RING_VARS`] present, with any value.
    pub(crate) prefer_ring: bool,
}

/// JACCL's launch variables, as MLX's `jaccl::Config::from_env` reads them: for each
/// setting the `JACCL_*` name first, then the `MLX_*` one; a set variable wins even when
/// empty. Settings that are absent stay `None` (the rank: 0).
///
/// # Errors
///
/// A rank that is not a whole number, naming the variable it came from (MLX's `atoi` reads
/// it as 0).
#[cfg_attr(not(feature = "jaccl"), allow(dead_code))] // read by the jaccl backend and tests
pub(crate) fn jaccl_launch(vars: Lookup<'_>) -> Result<JacclLaunch> {
    let first = |names: &[&'static str; 2]| {
        names
            .iter()
            .find_map(|&name| text(vars, name).map(|v| (name, v)))
    };
    let rank = match first(&JACCL_RANK_VARS) {
        None => 0,
        Some((var, text)) => text.trim().parse().map_err(|_| Error::Environment {
            var,
            reason: format!("{text:?} is not a rank (a whole number from 0)"),
        })?,
    };
    Ok(JacclLaunch {
        rank,
        devices: first(&JACCL_DEVICES_VARS).map(|(_, path)| PathBuf::from(path)),
        coordinator: first(&JACCL_COORDINATOR_VARS).map(|(_, v)| v),
        prefer_ring: first(&JACCL_RING_VARS).is_some(),
    })
}

/// [`JACCL_BUFFERS_VAR`], or `None` when unset (the caller then detects the classes).
///
/// # Errors
///
/// A value other than `small` or `large` (after trimming).
#[cfg(feature = "jaccl")]
pub(crate) fn jaccl_buffers(vars: Lookup<'_>) -> Result<Option<crate::jaccl::SizeClasses>> {
    text(vars, JACCL_BUFFERS_VAR).map(|v| v.parse()).transpose()
}
