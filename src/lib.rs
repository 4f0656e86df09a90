//! Distributed backends for nuvec: MLX's TCP ring, a native wire and shared memory between
//! nuvec ranks, and MLX's JACCL (RDMA over Thunderbolt 5; experimental, feature `jaccl`).
//!
//! [`init`] reads MLX's launch environment, connects a backend and makes it the default
//! group of `nuvec::distributed`'s collectives, as `mx.distributed.init()`. The ring reads
//! `MLX_HOSTFILE` (a JSON list with one entry per rank of `"host:port"` addresses) and
//! `MLX_RANK`; JACCL reads the variables `mlx.launch --backend jaccl` writes
//! (`jaccl::Config::from_env`). [`init_backend`] names the backend. Every rank runs the
//! same program; the processes may share one Mac (over loopback) or run on several (over
//! Ethernet or Thunderbolt IP for the ring, Thunderbolt 5 cables for JACCL).
//!
//! ```
//! use nuvec_core::{array, distributed};
//!
//! # fn main() -> nuvec_core::Result<()> {
//! let group = nuvec_distributed::init(false)?; // size 1 without a hostfile
//! let x = array![1.0, 2.0];
//! let total = distributed::all_sum(&x, None); // the sum over every rank
//! println!("rank {} of {}: {:?}", group.rank(), group.size(), total.to_vec::<f32>()?);
//! # Ok(())
//! # }
//! ```
//!
//! # What runs underneath
//!
//! Every group is an [`engine::Group`], the slice-level engine this crate wraps (the
//! [`engine`] crate, `nuvec-distributed-engine`, re-exported here), seen by nuvec-core
//! through its [`Communicator`](nuvec_core::distributed::Communicator) trait. One adapter
//! serves every backend, wire and transport the engine forms:
//!
//! - **MLX's ring** over TCP (the default): byte for byte MLX's wire, so Rust ranks and
//!   Python `mx.distributed` ranks share one ring and get bit-identical results.
//! - **The native wire** between nuvec ranks ([`Options::backend`] with [`Backend::Native`], or
//!   `NUVEC_DISTRIBUTED_WIRE=native`): a header on every message, so a rank whose call
//!   differs from the others' fails on every rank naming both calls; one- and two-hop
//!   algorithms; `send`/`recv` between any two ranks; **shared memory** between ranks on
//!   one host, and hierarchical groups across hosts.
//! - **JACCL** (feature `jaccl`): MLX's RDMA backend over Thunderbolt 5.
//!
//! nuvec's buffers are lent to the engine as they are: no copy and no allocation in this
//! crate. Every nuvec dtype reduces (`bool`, the unsigned and signed integers, `float16`,
//! `bfloat16`, `float32`, `float64`, `complex64`), with MLX's semantics: integers wrap,
//! half floats add in `f32`, every rank gets the same bits. `split` forms sub-groups on the
//! ring and the native wire (MLX's own ring refuses to split).
//!
//! nuvec-core frames its own `send` (a length, a header with the dtype and shape, a
//! length, the data: four engine messages per array), so a Python MLX rank cannot `recv` a
//! nuvec array and a nuvec rank cannot `recv` one MLX sent. That is nuvec-core's choice of
//! framing; the reductions and `all_gather` carry bare elements and mix with MLX ranks.
//! When one tries anyway (the repository's `tests/interop.rs` does): the MLX rank's `recv`
//! returns the frame's first bytes as its array, which nothing on MLX's wire can detect,
//! while the nuvec rank's `send` succeeds; a nuvec rank's `recv` of MLX's bare bytes fails,
//! at once when they cannot be nuvec-core's header (`recv: rank 1 sent no array header`,
//! `... sent another dtype or shape`), or after the timeout when they announce more bytes
//! than come (`distributed recv from rank 0: ... receive timed out`): only bytes that
//! carry nuvec-core's frame with the expected header come back as an array. Either way
//! the two ranks' streams are out of step: form a new group.
//!
//! # Errors
//!
//! A collective that fails is a failed array: evaluating it returns the error, never a
//! panic. The engine's errors arrive as [`nuvec_core::Error::Io`] (a peer failed, timed
//! out, misbehaved or is incompatible; this machine failed; the group failed earlier or
//! was closed) or [`nuvec_core::Error::InvalidArgument`] (misuse, a mismatched call on the
//! native wire, configuration, an unavailable backend), with the engine's text whole:
//! the peer's rank and address, what this rank was doing, in which collective or setup
//! phase. After a peer failure the group is failed and every later collective on it fails
//! at once, as in the engine.
//!
//! # Recovery
//!
//! After a peer failure every survivor calls [`shrink`]: the default group is replaced by
//! a group of the survivors (renumbered in their first order, with the same options), so
//! collectives passed `None` for their group go on among them. Once the failed ranks are
//! restarted at their hostfile addresses (with a plain [`init`]), the survivors call
//! [`rejoin`] and the full group, every rank at its first rank, is the default again. Both
//! act on the default group this crate installed ([`init`], [`init_backend`]); a group of
//! [`init_with`] recovers through the engine ([`engine::Group::shrink`] and
//! [`engine::Group::rejoin`], then [`from_engine`]).
//!
//! # Using the engine directly
//!
//! Programs without nuvec arrays use the [`engine`]'s slice-level API (`all_sum(&mut
//! [f32])`, `sum_scatter`, `broadcast`, `all_to_all`, nonblocking scopes, `health`,
//! `close`); it needs no nuvec-core and builds with an older Rust. [`from_engine`] turns
//! an engine group into nuvec's, so one program can use both on one group.
//!
//! **Stability:** no promise when this crate is depended on directly; depend on `nuvec`,
//! whose re-exports are semver-tracked.

#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![doc(test(attr(deny(warnings))))]

mod comm;
mod error;

use std::sync::{Arc, Mutex};

use nuvec_core::Result;
use nuvec_core::distributed::{Group, set_default_group};

pub use engine;
#[cfg(feature = "jaccl")]
pub use engine::jaccl;
pub use engine::{Backend, Io, Options, is_available, unavailable_reason};

use error::Call;

/// Initialises a backend from MLX's environment and makes it the default group, as
/// `mx.distributed.init()`: [`init_backend`] with [`Backend::Any`].
///
/// Outside a launch (no `MLX_HOSTFILE`, `MLX_RANK` or JACCL variable set) this is an
/// error if `strict`, else the group of this process alone; a launch environment that is
/// set but incomplete or unusable is an error either way.
///
/// # Errors
///
/// As [`init_backend`].
///
/// # Examples
///
/// ```
/// use nuvec_core::distributed;
///
/// # for var in ["MLX_HOSTFILE", "MLX_RANK", "MLX_IBV_DEVICES", "MLX_JACCL_COORDINATOR"] {
/// #     assert!(std::env::var_os(var).is_none(), "the example expects {var} unset");
/// # }
/// // Outside a launch, strict, it is an error that names what is missing:
/// let err = nuvec_distributed::init(true).unwrap_err();
/// assert!(err.to_string().contains("MLX_HOSTFILE"), "{err}");
///
/// // Not strict, it is this process alone, and the default group:
/// let group = nuvec_distributed::init(false)?;
/// assert_eq!((group.rank(), group.size()), (0, 1));
/// assert_eq!(distributed::default_group().size(), 1);
/// # Ok::<(), nuvec_core::Error>(())
/// ```
pub fn init(strict: bool) -> Result<Group> {
    init_backend(strict, Backend::Any)
}

/// Initialises `backend` from MLX's environment (as `mx.distributed.init(backend=...)`)
/// and makes it the default group of nuvec's collectives. The options come from the
/// environment (`NUVEC_DISTRIBUTED_TIMEOUT`, `NUVEC_DISTRIBUTED_KEY`,
/// `NUVEC_DISTRIBUTED_WIRE`, ...: the engine's [`engine::config::env`] lists them).
///
/// # Errors
///
/// [`nuvec_core::Error::InvalidArgument`] for an unusable environment, hostfile or
/// backend; [`nuvec_core::Error::Io`] when a peer cannot be reached or fails while the
/// group forms. The text is the engine's (see [`engine::init_backend`]).
///
/// # Examples
///
/// ```
/// use nuvec_distributed::{Backend, init_backend, is_available};
///
/// // The ring is always built in; outside a launch, not strict, it is this process alone.
/// assert!(is_available(Backend::Ring));
/// let group = init_backend(false, Backend::Ring)?;
/// assert_eq!(group.size(), 1);
/// # Ok::<(), nuvec_core::Error>(())
/// ```
pub fn init_backend(strict: bool, backend: Backend) -> Result<Group> {
    let group = engine::init_backend(strict, backend).map_err(|e| Call::Init.error(e))?;
    Ok(install(group))
}

/// The engine group behind the default group this crate installed last, for [`shrink`] and
/// [`rejoin`] (nuvec's group hides its communicator's type).
static INSTALLED: Mutex<Option<engine::Group>> = Mutex::new(None);

/// Makes `group` nuvec's default group and returns it.
fn install(group: engine::Group) -> Group {
    let nuvec_group = from_engine(group.clone());
    set_default_group(nuvec_group.clone());
    *INSTALLED.lock().unwrap_or_else(|e| e.into_inner()) = Some(group);
    nuvec_group
}

/// The engine group of the default group this crate installed, or the error `call` gives
/// without one.
fn installed(call: Call) -> Result<engine::Group> {
    let group = INSTALLED.lock().unwrap_or_else(|e| e.into_inner()).clone();
    group.ok_or_else(|| {
        error::unsupported(
            call,
            "no default group was formed by nuvec_distributed::init or init_backend; a \
             group of init_with recovers through engine::Group::shrink and rejoin"
                .into(),
        )
    })
}

/// Replaces the default group, after a peer failed, with a group of the surviving ranks:
/// every survivor calls it and gets the same group, renumbered in the order of the ranks'
/// first ranks, with the options of the first group; it is the default group from then on.
/// See [`engine::Group::shrink`] for the agreement, its bounds and what a rank that was
/// left out sees.
///
/// # Errors
///
/// An [`InvalidArgument`](nuvec_core::Error::InvalidArgument) error when this crate did
/// not install the default group, or the backend cannot shrink (JACCL); an
/// [`Io`](nuvec_core::Error::Io) error when this rank was left out or the survivors could
/// not form. The default group is then unchanged.
///
/// # Examples
///
/// ```no_run
/// use nuvec_core::{array, distributed};
///
/// nuvec_distributed::init(true)?;
/// let x = array![1.0f32, 2.0];
/// let total = match distributed::all_sum(&x, None).to_vec::<f32>() {
///     Ok(total) => total,
///     Err(e) => {
///         eprintln!("{e}; going on without the failed ranks");
///         let survivors = nuvec_distributed::shrink()?;
///         eprintln!("now rank {} of {}", survivors.rank(), survivors.size());
///         distributed::all_sum(&x, None).to_vec::<f32>()?
///     }
/// };
/// # drop(total);
/// # Ok::<(), nuvec_core::Error>(())
/// ```
pub fn shrink() -> Result<Group> {
    let group = installed(Call::Shrink)?;
    let survivors = group.shrink().map_err(|e| Call::Shrink.error(e))?;
    Ok(install(survivors))
}

/// Forms the full group again once the failed ranks are restarted at their hostfile
/// addresses (each calling [`init`] as the first time), and makes it the default group:
/// every survivor calls it, after [`shrink`] or on the failed group, and waits up to the
/// group's timeout for the restarted ranks. Every rank has its first rank again, so a
/// sharded model's layout is whole. The group it replaces is closed. See
/// [`engine::Group::rejoin`].
///
/// # Errors
///
/// As [`shrink`]; an [`Io`](nuvec_core::Error::Io) error naming the rank that did not
/// come. The default group is then unchanged, and the survivors can go on with it.
///
/// # Examples
///
/// ```no_run
/// // On a survivor, once the supervisor has restarted the failed rank:
/// let full = nuvec_distributed::rejoin()?;
/// println!("rank {} of {} again", full.rank(), full.size());
/// # Ok::<(), nuvec_core::Error>(())
/// ```
pub fn rejoin() -> Result<Group> {
    let group = installed(Call::Rejoin)?;
    let full = group.rejoin().map_err(|e| Call::Rejoin.error(e))?;
    // The shrunk group is superseded: its connections among the survivors go now rather
    // than when the last handle to it drops, and a collective still called on it fails
    // saying the group was closed.
    let _ = group.close();
    Ok(install(full))
}

/// Connects rank `rank` of the ring over `nodes` (per rank its addresses, one connection
/// per address, as MLX's hostfile) with `options`, and returns its group (not made the
/// default: pass it to the collectives, or to [`set_default_group`]). A single rank is the
/// group of this process alone.
///
/// # Errors
///
/// As [`init_backend`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use nuvec_core::{array, distributed};
/// use nuvec_distributed::{Backend, Options, init_with};
///
/// // Two ranks on loopback, a thread each (a real program runs one process per rank).
/// # let ports = nuvec_tools::testing::free_ports(2, 1);
/// # let nodes = nuvec_tools::testing::loopback_nodes(&ports);
/// let options = Options::default()
///     .timeout(Duration::from_secs(10))
///     .backend(Backend::Native);
/// std::thread::scope(|s| {
///     for rank in 0..2 {
///         let (nodes, options) = (&nodes, &options);
///         s.spawn(move || {
///             let group = init_with(nodes, rank, options).unwrap();
///             let x = array![rank as f32 + 1.0, 10.0];
///             let total = distributed::all_sum(&x, Some(&group));
///             assert_eq!(total.to_vec::<f32>().unwrap(), [3.0, 20.0]);
///         });
///     }
/// });
/// ```
pub fn init_with(nodes: &[Vec<String>], rank: usize, options: &Options) -> Result<Group> {
    let group = engine::init_with(nodes, rank, options).map_err(|e| Call::Init.error(e))?;
    Ok(from_engine(group))
}

/// nuvec's group over an engine group, for a program that forms its group with the
/// engine (to keep its slice-level API, `health`, `close` or nonblocking scopes at hand)
/// and runs nuvec's collectives on it too. Not made the default.
///
/// # Examples
///
/// ```
/// use nuvec_core::{array, distributed};
///
/// let engine_group = nuvec_distributed::engine::Group::single();
/// let group = nuvec_distributed::from_engine(engine_group.clone());
/// assert_eq!((group.rank(), group.size()), (engine_group.rank(), engine_group.size()));
/// let x = array![1.0, 2.0];
/// assert_eq!(distributed::all_max(&x, Some(&group)).to_vec::<f32>()?, [1.0, 2.0]);
/// # Ok::<(), nuvec_core::Error>(())
/// ```
pub fn from_engine(group: engine::Group) -> Group {
    Group::new(communicator(group))
}

/// nuvec-core's transport over an engine group: the adapter that [`from_engine`] (and so
/// every group this crate forms) wraps in nuvec's [`Group`], for code that calls the
/// [`Communicator`](nuvec_core::distributed::Communicator) methods itself, such as a
/// benchmark that tells this crate's cost apart from nuvec-core's, or a test of what
/// reaches the engine.
///
/// Its `all_reduce`, `all_gather`, `send` and `recv` hand the engine the caller's buffers
/// as they are: no copy and no allocation, only the translation of dtypes, reductions and
/// errors (see the crate docs' [Errors](crate#errors)).
///
/// A program may also wrap it (to time or log every collective, as `examples/llama.rs`
/// times its `all_sum`s) before handing it to [`Group::new`].
///
/// # Examples
///
/// ```
/// use nuvec_core::DType;
/// use nuvec_core::distributed::AllReduce;
///
/// let comm = nuvec_distributed::communicator(nuvec_distributed::engine::Group::single());
/// assert_eq!((comm.rank(), comm.size()), (0, 1));
/// let mut bytes = 2.5f32.to_ne_bytes();
/// comm.all_reduce(AllReduce::Sum, DType::F32, &mut bytes)?;
/// assert_eq!(f32::from_ne_bytes(bytes), 2.5); // a group of one keeps its input
///
/// // A buffer that is not a whole number of elements is refused, naming the call.
/// let err = comm.all_reduce(AllReduce::Max, DType::F32, &mut [0; 3]).unwrap_err();
/// assert!(err.to_string().contains("all_max"), "{err}");
/// # Ok::<(), nuvec_core::Error>(())
/// ```
pub fn communicator(group: engine::Group) -> Arc<dyn nuvec_core::distributed::Communicator> {
    Arc::new(comm::ArrayComm::new(group))
}
