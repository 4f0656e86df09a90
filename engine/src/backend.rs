//! Choosing and initialising a backend from MLX's launch environment, as
//! `mx.distributed.init(strict, backend)` does, with MLX's per-backend cache.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::config::env;
use crate::config::hostfile;
use crate::config::hostfile::RingAddresses;
use crate::error::{Error, Result};
use crate::group::{Group, Origin, set_default_group};
use crate::native::Native;
use crate::options::{Backend, Options};
use crate::ring::Ring;

pub use crate::config::env::{HOSTFILE_VAR, RANK_VAR};

/// Whether `backend` can be used in this build on this machine: the ring always; JACCL when
/// built with the `jaccl` feature, the verbs library loads and it lists an RDMA device.
/// [`unavailable_reason`] says why not.
pub fn is_available(backend: Backend) -> bool {
    unavailable_reason(backend).is_none()
}

/// Why `backend` cannot be used in this build on this machine, or `None` if it can (see
/// [`is_available`]). For [`Backend::Any`], `None` if any backend can be used.
pub fn unavailable_reason(backend: Backend) -> Option<String> {
    match backend {
        Backend::Any => unavailable_reason(Backend::Ring)
            .and_then(|ring| unavailable_reason(Backend::Jaccl).map(|j| format!("{ring}; {j}"))),
        Backend::Ring | Backend::Native => None,
        Backend::Jaccl => jaccl_unavailable_reason(),
    }
}

#[cfg(feature = "jaccl")]
fn jaccl_unavailable_reason() -> Option<String> {
    crate::jaccl::unavailable_reason()
}

#[cfg(not(feature = "jaccl"))]
fn jaccl_unavailable_reason() -> Option<String> {
    Some("this build of nuvec-distributed has no `jaccl` feature".to_string())
}

/// Groups already formed, by backend; `Any` holds the first one formed. MLX keeps the same
/// cache, so a second `init` returns the same group instead of forming another.
static FORMED: Mutex<Option<HashMap<Backend, Group>>> = Mutex::new(None);

/// Initialises `backend` from MLX's launch environment and makes its group the default.
///
/// A backend initialised before returns the same group. Without the environment a backend
/// needs (for the ring: [`HOSTFILE_VAR`] and [`RANK_VAR`]; for JACCL a device file and a
/// coordinator, see `jaccl::Config::from_env` (feature `jaccl`)) the result is an error
/// naming the missing variables with `strict`. Without `strict` it is the group of this
/// process alone only when no launch variable of any backend is set at all (not running
/// under a launcher); when some are set but no backend can form the group they describe
/// (`MLX_HOSTFILE` without `MLX_RANK`, a JACCL launch in a build without the `jaccl`
/// feature), it is an error naming the variables, because falling back would turn N
/// ranks into N independent processes that each succeed alone. Once a backend's
/// environment is complete, any failure to form the group is an error, strict or not.
/// [`Backend::Any`] tries the ring, then JACCL, as MLX's `any` does (MLX tries MPI
/// between them, which this crate does not have).
///
/// # Errors
///
/// Bad environment values (including [`SIMD_VAR`](crate::SIMD_VAR)), an unusable hostfile
/// (the error names the file and what is wrong), or a neighbour that cannot be reached within
/// the timeout (the error names it).
pub fn init_backend(strict: bool, backend: Backend) -> Result<Group> {
    env::simd_request(&env::process)?;
    let mut formed = FORMED.lock().unwrap_or_else(|e| e.into_inner());
    let formed = formed.get_or_insert_with(HashMap::new);
    // A closed group is not handed out again: the next `init` forms a new one.
    formed.retain(|_, group| !group.is_closed());
    if let Some(group) = formed.get(&backend) {
        set_default_group(group.clone());
        return Ok(group.clone());
    }
    let mut reasons = Vec::new();
    let options = env::options(&env::process)?;
    // The hostfile's backend: the ring, unless the environment turned it native.
    let hostfile = match (backend, options.backend) {
        (Backend::Native, _) | (_, Backend::Native) => Backend::Native,
        _ => Backend::Ring,
    };
    if backend == Backend::Native && env::wire_is_mlx(&env::process)? {
        return Err(Error::Environment {
            var: env::WIRE_VAR,
            reason: "is \"mlx\", but init_backend was asked for the native backend".to_string(),
        });
    }
    let candidates: &[Backend] = match backend {
        Backend::Any => &[hostfile, Backend::Jaccl],
        Backend::Ring | Backend::Native => &[hostfile],
        Backend::Jaccl => &[Backend::Jaccl],
    };
    for &candidate in candidates {
        let attempt = match candidate {
            Backend::Jaccl => jaccl_from_env(&options)?,
            _ => hostfile_from_env(candidate, &options)?,
        };
        match attempt {
            Ok(group) => {
                formed.insert(backend, group.clone());
                formed.insert(candidate, group.clone());
                formed.entry(Backend::Any).or_insert_with(|| group.clone());
                set_default_group(group.clone());
                return Ok(group);
            }
            Err(reason) => reasons.push(format!("{candidate}: {reason}")),
        }
    }
    let launched = env::launch_vars_set(&env::process);
    if strict || !launched.is_empty() {
        let mut reason = reasons.join("; ");
        if !strict {
            reason = format!(
                "{} set, so this process was launched as a rank of a group, but no backend \
                 can form it ({reason}); unset them to run as a single process",
                launched.join(", ")
            );
        }
        return Err(Error::Unavailable {
            backend: backend.name(),
            reason,
        });
    }
    let group = Group::single();
    set_default_group(group.clone());
    Ok(group)
}

/// `backend` (the ring or the native wire) from [`HOSTFILE_VAR`] and [`RANK_VAR`]. The
/// inner `Err` is why the environment does not describe a ring (not an error unless
/// `strict`); the outer one is a failure to form the ring it describes.
fn hostfile_from_env(
    backend: Backend,
    options: &Options,
) -> Result<std::result::Result<Group, String>> {
    let launch = match env::ring_launch(&env::process)? {
        Ok(launch) => launch,
        Err(reason) => return Ok(Err(reason)),
    };
    let rank = launch.rank;
    let options = options.clone().backend(backend);
    options.validate()?;
    let path = launch.hostfile.as_path();
    let nodes = hostfile::read(path)?;
    let addrs = hostfile::resolve(&nodes, rank, path)?;
    if addrs.size == 1 {
        return Ok(Ok(Group::single()));
    }
    Ok(Ok(form_ring(&addrs, &options)?))
}

/// JACCL from MLX's launch environment ([`crate::jaccl::Config::from_env`]). As for the
/// ring, the inner `Err` says the environment does not describe a JACCL group; the outer one
/// is a failure to form the group it describes (including a missing verbs library).
#[cfg(feature = "jaccl")]
fn jaccl_from_env(options: &Options) -> Result<std::result::Result<Group, String>> {
    let config = crate::jaccl::Config::from_env()?;
    if let Some(missing) = config.missing() {
        return Ok(Err(missing));
    }
    crate::jaccl::init(&config, options).map(|group| Ok(group.recording(options)))
}

#[cfg(not(feature = "jaccl"))]
fn jaccl_from_env(_: &Options) -> Result<std::result::Result<Group, String>> {
    Ok(Err(jaccl_unavailable_reason().unwrap_or_default()))
}

/// Forms rank `rank` of the ring over `nodes` (per rank, the addresses it listens on, one
/// connection per address, as MLX's hostfile lists them) and returns its group. The group
/// is not made the default. A ring of one rank is the group of this process alone.
///
/// # Errors
///
/// Malformed or unresolvable addresses, a rank out of range, or a neighbour that does not
/// connect or accept within `options.timeout` (the error names it).
///
/// # Examples
///
/// Two ranks of a ring on loopback, as two threads of one process (two processes, or two
/// hosts, run the same code with their own `rank`):
///
/// ```
/// use std::time::Duration;
/// use nuvec_distributed_engine::{Options, init_with};
///
/// // Each rank listens on the addresses of its entry: here one port each, on loopback.
/// # // Two free ports below the ephemeral range (as a launcher would pick them), so that no
/// # // dial of another example running in parallel can take one.
/// # let ports = nuvec_tools::testing::free_ports(2, 1);
/// # let (p0, p1) = (ports[0][0], ports[1][0]);
/// let nodes = vec![vec![format!("127.0.0.1:{p0}")], vec![format!("127.0.0.1:{p1}")]];
/// let options = Options::default().timeout(Duration::from_secs(10));
/// let sums = std::thread::scope(|s| {
///     let ranks: Vec<_> = (0..2)
///         .map(|rank| {
///             let (nodes, options) = (&nodes, &options);
///             s.spawn(move || -> nuvec_distributed_engine::Result<[f32; 1]> {
///                 let group = init_with(nodes, rank, options)?;
///                 assert_eq!((group.rank(), group.size()), (rank, 2));
///                 let mut x = [rank as f32 + 1.0];
///                 group.all_sum(&mut x)?;
///                 Ok(x)
///             })
///         })
///         .collect();
///     ranks.into_iter().map(|r| r.join().unwrap()).collect::<Vec<_>>()
/// });
/// for sum in sums {
///     assert_eq!(sum?, [3.0]);
/// }
///
/// // One entry is the group of this process alone; a rank out of range is refused.
/// assert_eq!(init_with(&[vec!["127.0.0.1:0".into()]], 0, &Options::default())?.size(), 1);
/// assert!(init_with(&nodes, 2, &options).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn init_with(nodes: &[Vec<String>], rank: usize, options: &Options) -> Result<Group> {
    options.validate()?;
    if options.backend == Backend::Jaccl {
        return Err(Error::invalid(
            "init_with forms a TCP group (Backend::Ring or Backend::Native) over the \
             addresses it is given; JACCL forms from its device file: use jaccl::init",
        ));
    }
    // The directory for flight records a launcher set, unless the options name one; read
    // here so that an empty value fails as it does for `init`.
    let with_dir;
    let options = match (
        &options.flight_dir,
        env::value(&env::process, env::FLIGHT_DIR_VAR)?,
    ) {
        (None, Some(dir)) => {
            with_dir = options.clone().flight_dir(dir);
            &with_dir
        }
        _ => options,
    };
    let addrs = hostfile::resolve(nodes, rank, &hostfile::in_code())?;
    if addrs.size == 1 {
        return Ok(Group::single());
    }
    form_ring(&addrs, options)
}

/// Forms the ring of two or more ranks described by `addrs` with the TCP backend `options`
/// asks for ([`Backend::Native`], else the ring).
pub(crate) fn form_ring(addrs: &RingAddresses, options: &Options) -> Result<Group> {
    let group = match options.backend {
        Backend::Native => {
            let formed = crate::native::bootstrap::connect(addrs, options)?;
            Group::with_options(Arc::new(Native::new(formed, options)?), options)
        }
        _ => Group::with_options(Arc::new(Ring::connect(addrs, options)?), options),
    };
    // Kept so that the group can be split on the same links with the same options.
    Ok(group.with_origin(Origin::new(addrs, options)))
}
