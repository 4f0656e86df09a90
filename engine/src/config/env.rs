//! Every environment variable the library reads, named and documented here once, and the
//! typed reading of each. Errors name the variable and what is wrong with its value.
//!
//! The readers (crate-internal) take a lookup function rather than reading the process
//! environment themselves, so that tests, and the round trip with the launcher's writer, can
//! hand them a map; `init` passes the process environment.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use crate::auth::{MIN_SECRET_BYTES, Secret};
use crate::error::{Error, Result};
use crate::options::{Backend, Io, Options};
use crate::options::{MAX_FLIGHT_RECORDS, MAX_SEAL_THREADS};

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

/// The variable that fixes [`Options::spin`] for [`init`](crate::init), in whole
/// microseconds: `0` never spins; unset, the spin is learned from the group's waits.
pub const SPIN_VAR: &str = "NUVEC_DISTRIBUTED_SPIN_US";

/// The variable that turns the hostfile's backend native for [`init`](crate::init): `mlx`
/// (the default: [`Backend::Ring`], MLX's wire) or `native` ([`Backend::Native`]), read
/// into [`Options::backend`]. MLX's launchers say only `ring`; this is how a launch asks for
/// the native wire over the same hostfile.
pub const WIRE_VAR: &str = "NUVEC_DISTRIBUTED_WIRE";

/// The variable that chooses the event loop (see [`Io`]) when [`Options::io`] is
/// [`Io::Auto`]: `auto`, `epoll` or `uring`. [`init`](crate::init) reads it with the other
/// variables; [`init_with`](crate::init_with) when a group starts forming, before any
/// socket is opened. Either way a value that names no loop fails before any connection.
pub const IO_VAR: &str = "NUVEC_DISTRIBUTED_IO";

/// The variable [`init`](crate::init) reads [`Options::shared_memory`] from: `1` (the
/// default) or `0`.
pub const SHM_VAR: &str = "NUVEC_DISTRIBUTED_SHM";

/// The variable [`init`](crate::init) reads [`Options::seal_threads`] from: how many
/// threads seal and open a keyed native group's records, from 1 to
/// [`MAX_SEAL_THREADS`]; unset, the CPUs per rank on this host.
pub const SEAL_THREADS_VAR: &str = "NUVEC_DISTRIBUTED_SEAL_THREADS";

/// The variable [`init`](crate::init) reads [`Options::flight_records`] from: how many
/// calls each group's flight recorder keeps, `0` to turn it off.
pub const FLIGHT_RECORDS_VAR: &str = "NUVEC_DISTRIBUTED_FLIGHT_RECORDS";

/// The directory a group writes its flight record into when a call fails it
/// ([`Options::flight_dir`]). [`init`](crate::init) reads it with the other variables,
/// [`init_with`](crate::init_with) when its options name no `flight_dir` (either fails on
/// an empty value), and [`Group::new`](crate::Group::new) for a backend's own
/// communicator. `nuvec launch` sets it for every rank when it is unset.
pub const FLIGHT_DIR_VAR: &str = "NUVEC_DISTRIBUTED_FLIGHT_DIR";

/// The variable that makes SIGUSR1 write the flight record of every group alive in the
/// process ([`Options::flight_signal`]): `1`, or `0` (the default). [`init`](crate::init)
/// reads it with the other variables (a value that is neither fails it); every group,
/// however formed, reads it when it forms (where such a value is logged and taken as `0`).
pub const FLIGHT_SIGNAL_VAR: &str = "NUVEC_DISTRIBUTED_FLIGHT_SIGNAL";

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
/// The variable that says which all_gather the MLX ranks of a jaccl-ring group run:
/// `defective` (the default: MLX 0.32.1's, so nuvec ranks refuse all_gather there) or
/// `fixed` (a release with MLX PR #4443, whose messages equal this crate's).
pub const JACCL_MLX_ALL_GATHER_VAR: &str = "NUVEC_JACCL_MLX_ALL_GATHER";

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

/// A variable's value as text, `None` when unset. Every variable that holds a value (all
/// but the presence switches [`RING_VERBOSE_VAR`], [`VERBOSE_VAR`] and
/// [`JACCL_RING_VARS`]) is read through this: an empty value (or only spaces) is an error
/// naming the variable, never the same as unset, because a variable set to nothing is
/// usually a script's mistake (`FOO=$UNDEFINED`), and the default it would silently give
/// is not what was asked for (an empty key would mean no authentication).
pub(crate) fn value(vars: Lookup<'_>, var: &'static str) -> Result<Option<String>> {
    match text(vars, var) {
        Some(v) if v.trim().is_empty() => Err(empty(var)),
        other => Ok(other),
    }
}

/// The error for `var` set to an empty value.
fn empty(var: &'static str) -> Error {
    Error::Environment {
        var,
        reason: "is set but empty: give it a value, or unset it for the default".into(),
    }
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
    value(vars, HOSTFILE_VAR)?;
    value(vars, RANK_VAR)?;
    let hostfile = vars(HOSTFILE_VAR);
    let rank = vars(RANK_VAR);
    if let (Some(path), None) = (&hostfile, &rank) {
        // Only the ring reads the hostfile, so it is a ring launch missing its rank (a rank
        // alone may belong to a JACCL launch, which the caller tries next).
        return Err(Error::Environment {
            var: RANK_VAR,
            reason: format!(
                "is unset, but {HOSTFILE_VAR} is set ({:?}): a ring rank needs both, as \
                 mlx.launch sets them",
                path.to_string_lossy()
            ),
        });
    }
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
/// [`SPIN_VAR`], [`WIRE_VAR`], [`SHM_VAR`], [`IO_VAR`], [`FLIGHT_RECORDS_VAR`],
/// [`FLIGHT_DIR_VAR`], [`FLIGHT_SIGNAL_VAR`] and [`KEY_VAR`]; unset variables keep the
/// defaults.
///
/// An empty value of any of them is an error naming it (see [`value`]); an empty key in
/// particular never means "no authentication": unset the variable for that.
pub(crate) fn options(vars: Lookup<'_>) -> Result<Options> {
    let mut options = Options::default();
    if let Some(secret) = vars(KEY_VAR) {
        if secret.is_empty() {
            return Err(Error::Environment {
                var: KEY_VAR,
                reason: format!(
                    "is set but empty: set the same secret of at least \
                     {MIN_SECRET_BYTES} bytes on every rank, or unset it to run without \
                     authentication"
                ),
            });
        }
        let bytes = secret.as_encoded_bytes();
        let secret = Secret::new(bytes);
        if secret.key().is_err() {
            return Err(Error::Environment {
                var: KEY_VAR,
                reason: format!(
                    "is {} bytes; the key must be at least {MIN_SECRET_BYTES}",
                    bytes.len()
                ),
            });
        }
        options.key = Some(secret);
    }
    if let Some(text) = value(vars, TIMEOUT_VAR)? {
        options.timeout = parse_timeout(&text)?;
    }
    if let Some(text) = value(vars, TCP_CONGESTION_VAR)? {
        options.tcp_congestion = Some(text.trim().to_string());
    }
    if let Some(text) = value(vars, SPIN_VAR)? {
        let micros = text.trim().parse::<u64>().map_err(|_| Error::Environment {
            var: SPIN_VAR,
            reason: format!(
                "{text:?} is not a whole number of microseconds (0 never spins; unset it to \
                 learn the spin from the group's waits)"
            ),
        })?;
        options.spin = Some(Duration::from_micros(micros));
    }
    if let Some(text) = value(vars, WIRE_VAR)? {
        options.backend = wire(&text)?;
    }
    options.io = io(vars, options.io)?;
    if let Some(text) = value(vars, SHM_VAR)? {
        options.shared_memory = match text.trim() {
            "1" => true,
            "0" => false,
            _ => {
                return Err(Error::Environment {
                    var: SHM_VAR,
                    reason: format!("{text:?} is neither 1 (use shared memory) nor 0 (TCP only)"),
                });
            }
        };
    }
    if let Some(text) = value(vars, FLIGHT_RECORDS_VAR)? {
        options.flight_records = text
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|&n| n <= MAX_FLIGHT_RECORDS)
            .ok_or_else(|| Error::Environment {
                var: FLIGHT_RECORDS_VAR,
                reason: format!(
                    "{text:?} is not a number of calls from 0 (recorder off) to \
                     {MAX_FLIGHT_RECORDS}"
                ),
            })?;
    }
    if let Some(text) = value(vars, SEAL_THREADS_VAR)? {
        let threads = text
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_SEAL_THREADS).contains(n))
            .ok_or_else(|| Error::Environment {
                var: SEAL_THREADS_VAR,
                reason: format!(
                    "{text:?} is not a number of threads from 1 (seal on the rank's own \
                     thread) to {MAX_SEAL_THREADS}; unset it for the CPUs per rank on this \
                     host"
                ),
            })?;
        options.seal_threads = Some(threads);
    }
    if let Some(text) = value(vars, FLIGHT_DIR_VAR)? {
        options.flight_dir = Some(PathBuf::from(text));
    }
    if let Some(text) = value(vars, FLIGHT_SIGNAL_VAR)? {
        options.flight_signal = switch(FLIGHT_SIGNAL_VAR, &text)?;
    }
    if let Some(text) = value(vars, SOCKET_BUFFER_VAR)? {
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

/// [`FLIGHT_DIR_VAR`] for a group over a backend's own communicator
/// ([`Group::new`](crate::Group::new)): `None` when unset, and when empty (logged, as
/// `Group::new` cannot fail; `init` and `init_with` fail naming the variable).
pub(crate) fn flight_dir(vars: Lookup<'_>) -> Option<PathBuf> {
    match value(vars, FLIGHT_DIR_VAR) {
        Ok(dir) => dir.map(PathBuf::from),
        Err(e) => {
            log::warn!("{e}; the group's flight record will not be written on failure");
            None
        }
    }
}

/// [`FLIGHT_SIGNAL_VAR`] for a group however formed: `false` when unset, and when its value
/// is neither `1` nor `0` (logged, as `Group::new` cannot fail; `init` fails naming the
/// variable).
pub(crate) fn flight_signal(vars: Lookup<'_>) -> bool {
    match value(vars, FLIGHT_SIGNAL_VAR).and_then(|text| match text {
        Some(text) => switch(FLIGHT_SIGNAL_VAR, &text),
        None => Ok(false),
    }) {
        Ok(on) => on,
        Err(e) => {
            log::warn!("{e}; SIGUSR1 will not write the group's flight record");
            false
        }
    }
}

/// A switch variable's value: `1` on, `0` off (surrounding blanks ignored).
fn switch(var: &'static str, text: &str) -> Result<bool> {
    match text.trim() {
        "1" => Ok(true),
        "0" => Ok(false),
        _ => Err(Error::Environment {
            var,
            reason: format!("{text:?} is neither 1 (on) nor 0 (off)"),
        }),
    }
}

/// The backend [`WIRE_VAR`]'s value `text` names, ignoring case and surrounding blanks.
fn wire(text: &str) -> Result<Backend> {
    match text.trim().to_ascii_lowercase().as_str() {
        "mlx" | "ring" => Ok(Backend::Ring),
        "native" => Ok(Backend::Native),
        _ => Err(Error::Environment {
            var: WIRE_VAR,
            reason: format!("{text:?} is not a wire: use \"mlx\" (or \"ring\") or \"native\""),
        }),
    }
}

/// Whether [`WIRE_VAR`] is set and asks for MLX's wire.
pub(crate) fn wire_is_mlx(vars: Lookup<'_>) -> Result<bool> {
    match value(vars, WIRE_VAR)? {
        Some(text) => Ok(wire(&text)? == Backend::Ring),
        None => Ok(false),
    }
}

/// The event loop `asked` comes to: [`IO_VAR`]'s when [`Io::Auto`] is asked and the
/// variable is set, else `asked`.
///
/// # Errors
///
/// An [`IO_VAR`] that is empty or names no event loop, naming the variable and its values.
pub(crate) fn io(vars: Lookup<'_>, asked: Io) -> Result<Io> {
    if asked != Io::Auto {
        return Ok(asked);
    }
    match value(vars, IO_VAR)? {
        None => Ok(Io::Auto),
        Some(text) => text.trim().parse().map_err(|reason| Error::Environment {
            var: IO_VAR,
            reason,
        }),
    }
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
/// Unset asks for nothing; empty is an error.
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
/// setting the `JACCL_*` name first, then the `MLX_*` one. Settings that are absent stay
/// `None` (the rank: 0).
///
/// # Errors
///
/// A rank that is not a whole number, naming the variable it came from (MLX's `atoi` reads
/// it as 0), and an empty value of any of them but the ring switches (MLX takes an empty
/// one as set; here it is a mistake to report, as for every variable).
#[cfg_attr(not(feature = "jaccl"), allow(dead_code))] // read by the jaccl backend and tests
pub(crate) fn jaccl_launch(vars: Lookup<'_>) -> Result<JacclLaunch> {
    for var in JACCL_RANK_VARS
        .iter()
        .chain(&JACCL_DEVICES_VARS)
        .chain(&JACCL_COORDINATOR_VARS)
    {
        value(vars, var)?;
    }
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

/// Every variable a backend reads to find its group ([`ring_launch`], [`jaccl_launch`]):
/// when none is set, no distributed launch is present and non-strict `init` may fall back
/// to a group of one.
pub(crate) const LAUNCH_VARS: [&str; 9] = [
    HOSTFILE_VAR,
    RANK_VAR,
    JACCL_RANK_VARS[0],
    JACCL_DEVICES_VARS[0],
    JACCL_DEVICES_VARS[1],
    JACCL_COORDINATOR_VARS[0],
    JACCL_COORDINATOR_VARS[1],
    JACCL_RING_VARS[0],
    JACCL_RING_VARS[1],
];

/// The [`LAUNCH_VARS`] that are set.
pub(crate) fn launch_vars_set(vars: Lookup<'_>) -> Vec<&'static str> {
    LAUNCH_VARS
        .into_iter()
        .filter(|&var| vars(var).is_some())
        .collect()
}
