//! The slice-level engine of `nuvec-distributed`: collectives on Rust slices across
//! processes and machines, over MLX's distributed backends and a wire of its own.
//!
//! It runs `all_sum`, `all_max`, `all_min`, `all_gather`, `sum_scatter`, `send`/`recv`,
//! `barrier`, `broadcast` and `all_to_all` on `&mut [T]` for every MLX dtype. The
//! `nuvec-distributed` crate wraps it as nuvec's distributed backend (nuvec arrays through
//! `nuvec_core::distributed`); depend on this crate alone for programs without nuvec
//! arrays (it needs no nuvec-core, and Rust 1.89 rather than 1.99). What it forms:
//!
//! - **MLX's ring** over TCP (the default, [`Backend::Ring`]): started the way MLX starts it
//!   (`MLX_HOSTFILE`, `MLX_RANK`, the same hostfile) and byte-compatible on the wire, so
//!   Rust ranks and Python `mx.distributed` ranks can form one ring and get bit-identical
//!   results.
//! - **The native wire** between ranks of this crate ([`Backend::Native`],
//!   `NUVEC_DISTRIBUTED_WIRE=native`): a handshake on every connection, a header on every
//!   message (so a rank whose call differs from the others' fails on every rank, naming both
//!   calls), one- and two-hop algorithms over connections between any two ranks, and
//!   `send`/`recv` between any two ranks. Ranks on one host move their data through **shared
//!   memory** ([`Options::shared_memory`]); a group over several hosts runs hierarchically
//!   (shared memory inside each host, TCP between them). [`Group::transport`] says what each
//!   link uses.
//! - **jaccl** (feature `jaccl`, **experimental**): MLX's RDMA backend over Thunderbolt 5,
//!   following MLX 0.32.1's side channel and message schedule. It is tested on an emulated
//!   fabric only and **unverified on Thunderbolt hardware** until someone runs
//!   `tests/jaccl_hardware.rs` on Macs; its ring all_gather deliberately differs from MLX's
//!   defective one. See the `jaccl` module.
//!
//! ```no_run
//! # fn main() -> nuvec_distributed_engine::Result<()> {
//! // Under `mlx.launch` (or `nuvec launch`), MLX_HOSTFILE and MLX_RANK describe the ring;
//! // with no launch variable set at all this is the group of this process alone, and a
//! // launch environment that describes a group it cannot form is an error.
//! let group = nuvec_distributed_engine::init(false)?;
//! let mut x = [1.0f32, 2.0, 3.0];
//! group.all_sum(&mut x)?; // the element-wise sum over every rank, in place
//! println!("rank {} of {}: {x:?}", group.rank(), group.size());
//! # Ok(())
//! # }
//! ```
//!
//! Every rank must call the same collectives in the same order with the same lengths,
//! dtypes and ops, as with MLX. What happens when one does not depends on the wire:
//!
//! - **MLX's wire and JACCL carry element bytes only**, so nothing can detect a mismatch: a
//!   rank that calls something else gets `Ok` with wrong data, and so does every later call
//!   on that group (the ranks no longer agree where one call's bytes end). Close the group
//!   on every rank and form a new one.
//! - **The native wire detects it**: each message's header carries the collective's number,
//!   kind, op, dtype and length, checked before any data is used, so the call fails within
//!   milliseconds on every rank involved with [`Error::Mismatch`] ("collective #17: rank 0
//!   called all_sum float32 x 10, rank 1 called all_sum float32 x 20; the element count
//!   differs (rank 0: 10, rank 1: 20)"), and the group is
//!   failed. Calls that agree in all of these but mean different things (two threads issuing
//!   same-shaped calls in different orders, see [`Group`]) still pass unnoticed.
//!
//! # Nonblocking collectives
//!
//! [`Group::scope`] starts collectives that run on the group's own loop thread while the
//! caller computes, in the order they were started, and waits for all of them before it
//! returns, as [`std::thread::scope`] does for threads:
//!
//! ```
//! # let group = nuvec_distributed_engine::Group::single();
//! let mut grads = vec![1.0f32; 4096];
//! group.scope(|s| {
//!     let sum = s.start_all_sum(&mut grads)?;
//!     // ... compute that does not touch `grads` ...
//!     sum.wait()
//! })?;
//! # Ok::<(), nuvec_distributed_engine::Error>(())
//! ```
//!
//! A blocking call waits for the outstanding nonblocking ones first. See [`Scope`] for the
//! rules, and why the buffers are borrowed by a scope rather than by a handle.
//!
//! # Backends, against MLX's support matrix
//!
//! | | ring, MLX wire (here) | native wire (here) | MLX ring | jaccl mesh (here) | jaccl ring (here) | MLX jaccl |
//! |---|---|---|---|---|---|---|
//! | `all_sum`, `all_max`, `all_min` | yes, MLX's bytes | yes, one or two hops | yes | yes, MLX's frames | yes, MLX's frames | yes |
//! | `all_gather` | yes, MLX's bytes | yes | yes | yes | yes, but not MLX's (its ring all_gather looks defective) | yes |
//! | `send` / `recv` | neighbours only | any peer | neighbours only | any peer | neighbours only | mesh: any; ring: neighbours |
//! | `sum_scatter` | yes (between nuvec ranks) | yes | refused | yes | yes | yes |
//! | `barrier` | yes (an `all_sum` of one f32, MLX's idiom) | yes (a round of headers) | none in Python | yes (an `all_sum` of one u8, as MLX's C++) | yes | C++ only |
//! | `split` | yes ([`Group::split`], between nuvec ranks) | yes | no | no | no | no |
//! | mismatched calls detected | no | yes ([`Error::Mismatch`]) | no | no | no | no |
//! | shared memory between ranks on one host | no | yes | no | no | no | no |
//! | timeouts, errors naming the peer | yes | yes | no | yes | yes | no |
//! | pre-shared-key authentication | optional (nuvec ranks only) | optional | no | no | no | no |
//! | mixed with MLX ranks | tested, bit for bit (P = 2..4, C = 1, 2) | no (nuvec ranks only) | — | unverified on hardware | unverified on hardware | — |
//!
//! Every backend and wire takes every MLX dtype ([`DType`]): `bool`, `u8`..`u64`, `i8`..`i64`, `f16`,
//! `bf16`, `f32`, `f64`, `complex64`.
//!
//! # Failures
//!
//! - **Every wait is bounded** by [`Options::timeout`] (30 s by default;
//!   `NUVEC_DISTRIBUTED_TIMEOUT` in seconds for [`init`]), counted from the last byte that
//!   moved, so a large collective may take longer but a silent peer may not. Forming the
//!   ring is bounded by the same timeout.
//! - **Errors name the peer**: its rank, its address where there is one, and what this rank
//!   was doing ([`PeerOp`]). A rank that is not next to the rank that was lost learns it from
//!   a *failure notice*: a failing rank leaves one TCP urgent byte naming the lost rank on
//!   its other connections before it closes them ([`Error::Lost`]). Urgent data travels
//!   beside the byte stream, so a peer still expecting data can never take it for data, and
//!   MLX's ranks never see it. Delivery is best effort (a rank that reads past the byte's
//!   position before it is told about it loses it, and then names the neighbour that
//!   closed). When a rank *stalls* (stopped, swapped out) instead of dying, every rank
//!   times out at about the same moment and timing cannot tell who stalled; so before
//!   naming anyone a rank asks its neighbours with another urgent byte, and a live one
//!   answers. The ranks next to the stalled one find it silent and name it, the others
//!   learn it from their notices; only verified verdicts are announced. This adds up to
//!   twice min(timeout / 4, 500 ms) to a stall's error.
//! - **After a transport error the group is failed**: every later call returns
//!   [`Error::Failed`] at once, with the original error inside. [`Group::close`] releases
//!   it, and [`init_with`] forms a new group in the same processes. Argument errors
//!   ([`Error::InvalidArgument`]) leave the group usable.
//! - **Whose fault**: [`Error::fault`] sorts every error into a [`Fault`] class (a peer
//!   failed, misbehaved or is incompatible; a local failure or a bug; misuse;
//!   configuration; unavailable; failed earlier; closed), and its documentation has a
//!   table of what to do about each. Only a peer failure makes a rank tell the others that a
//!   peer was lost.
//! - **Liveness between collectives**: every connection has TCP keepalive and, on Linux,
//!   a `TCP_USER_TIMEOUT`, both derived from [`Options::timeout`] (the user timeout is half
//!   as long again, at least 5 s longer), so a host that sleeps or is unplugged is found a
//!   little after the timeout, and a peer merely late within it is never dropped by the
//!   kernel, at any size; [`Group::health`] checks every connection
//!   without running a collective and names the lost peer.
//!
//! # Authentication (and what it does not do)
//!
//! Without a key, the ring is MLX's: any host that reaches a forming ring's port first is
//! taken for the neighbour (a port scanner that connects and leaves is passed over). With
//! [`Options::key`] (`NUVEC_DISTRIBUTED_KEY` for [`init`]; at least 16 bytes, the same on
//! every rank), every connection first runs a mutual challenge-response: a key derived from
//! the secret with BLAKE3's `derive_key`, fresh random nonces from both sides, both ranks,
//! the ring's size and the connection index in the transcript, and proofs made with BLAKE3's
//! keyed hash and compared in constant time. A client that fails it is dropped while the
//! ring keeps accepting, so it can neither join nor keep a rank out; a wrong key fails
//! setup on both sides with an error saying the peer did not prove the key. MLX's ranks do
//! not speak this handshake, so a keyed ring is made of nuvec ranks only.
//!
//! On the native wire, a keyed group's TCP connections then carry every byte in sealed
//! records (AES-256-GCM under per-connection, per-direction keys derived from the key
//! and both handshake nonces): altered, injected, replayed, reordered or dropped bytes fail
//! the call naming the sender, and no unverified byte reaches the caller. Shared memory
//! between ranks of one host is not sealed, nor are the TCP urgent bytes that carry failure
//! notices. **On the MLX wire, the traffic after the handshake is not encrypted, and not
//! authenticated either**: anyone who can read or alter packets on the network can read or
//! alter the data; on a network you do not trust, use the native wire or a VPN.
//!
//! # Environment
//!
//! | variable | read by | meaning |
//! |---|---|---|
//! | `MLX_HOSTFILE` | [`init`] | the ring's hostfile (as `mlx.launch` writes it) |
//! | `MLX_RANK` | [`init`] | this process's rank |
//! | `NUVEC_DISTRIBUTED_TIMEOUT` | [`init`] | [`Options::timeout`], in seconds |
//! | `NUVEC_DISTRIBUTED_KEY` | [`init`] | [`Options::key`] |
//! | `NUVEC_DISTRIBUTED_SEAL_THREADS` | [`init`] | [`Options::seal_threads`]: threads that seal a keyed native group's records, 1 to 64 (unset: the CPUs per rank on this host) |
//! | `NUVEC_DISTRIBUTED_TCP_CONGESTION` | [`init`] | [`Options::tcp_congestion`] |
//! | `NUVEC_DISTRIBUTED_SOCKET_BUFFER` | [`init`] | [`Options::socket_buffer`], in bytes |
//! | `NUVEC_DISTRIBUTED_SPIN_US` | [`init`] | fixes [`Options::spin`], in microseconds (`0`: never spin; unset: learned) |
//! | `NUVEC_DISTRIBUTED_WIRE` | [`init`] | [`Options::backend`]: `mlx` (default, [`Backend::Ring`]) or `native` ([`Backend::Native`]) |
//! | `NUVEC_DISTRIBUTED_IO` | [`init`], [`init_with`] | when [`Options::io`] is [`Io::Auto`]: the event loop, `epoll` or `uring` (Linux; an error if the kernel refuses it) |
//! | `NUVEC_DISTRIBUTED_SIMD` | every reduction | lowers the SIMD level: `scalar`, `avx2`, `avx512`, `neon` |
//! | `MLX_RING_VERBOSE`, `NUVEC_DISTRIBUTED_VERBOSE` | every backend | if present, the diagnostics the program's [`log`] logger does not take (all of them, with no logger installed) go to stderr as MLX's: `[ring] rank R: ...` (`[jaccl]` for JACCL) |
//!
//! # Logging
//!
//! Forming and failing are logged through the [`log`] facade, with targets
//! `nuvec_distributed_engine::ring`, `nuvec_distributed_engine::jaccl` and
//! `nuvec_distributed_engine::native`: progress at `debug`; a formed group, and what a group
//! still forming waits for (after 2 s, then every 5 s: each peer not yet connected, with its
//! address and this rank's) at `info`; a failure at `warn`. Each message starts with the
//! rank. A program that installs a logger gets them through its filter (with
//! env_logger: `RUST_LOG=nuvec_distributed_engine=debug`). A line the logger does not take is
//! written to stderr instead when `MLX_RING_VERBOSE` or `NUVEC_DISTRIBUTED_VERBOSE` is set,
//! so `mlx.launch --verbose` works for programs without a logger; nothing is written twice,
//! and this crate never installs a logger itself. No collective logs on its fast path.
//!
//! [`config::env`](mod@config::env) names every variable, JACCL's included; [`config`] also writes the ring's
//! hostfile and JACCL's device file as `mlx.launch` does.
//!
//! # SIMD
//!
//! Reductions use the widest SIMD kernels the CPU supports (AVX-512, AVX2, NEON), chosen
//! at run time; every level gives the same bytes as MLX's ring. [`simd_level`] names the
//! level in use, and [`SIMD_VAR`] lowers it.

#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![doc(test(attr(deny(warnings))))]

mod auth;
mod backend;
mod comm;
pub mod config;
mod element;
mod error;
#[doc(hidden)]
pub mod fuzzing;
mod group;
#[cfg(feature = "jaccl")]
pub mod jaccl;
#[cfg(test)]
mod loopback_ports;
mod native;
mod nonblocking;
mod options;
mod recorder;
mod reduce;
mod ring;
mod shrink;
mod split;
mod transport;
mod verbose;

pub use auth::KEY_VAR;
pub use backend::{
    HOSTFILE_VAR, RANK_VAR, init_backend, init_with, is_available, unavailable_reason,
};
pub use comm::Communicator;
// The cost model behind the native wire's choice of algorithm, for `nuvec plan`, and the
// names of the algorithms the flight recorder records.
pub use comm::algorithm::{Algorithm, Collective, Link, LinkCost, Plan, plan};
pub use element::{Complex64, DType, Element};
pub use error::{Error, Fault, PeerOp, Phase, Result};
pub use group::{
    Group, all_gather, all_max, all_min, all_sum, barrier, default_group, recv, send,
    set_default_group, sum_scatter,
};
pub use native::timed::{MAX_SIMULATED_RANKS, Simulated, simulate};
// Which transport each link uses.
pub use comm::Transport;
// Broadcast, all_to_all and the allocating conveniences.
pub use group::{all_gather_vec, all_to_all, broadcast, recv_vec};
pub use half::{bf16, f16};
pub use nonblocking::{Pending, Plain, Scope};
pub use options::{
    Backend, DEFAULT_FLIGHT_RECORDS, Io, MAX_FLIGHT_RECORDS, MAX_SEAL_THREADS, Options,
};
pub use recorder::{FlightEntry, FlightOp, FlightOutcome, FlightRecord};
pub use reduce::{ReduceOp, simd_level};

pub use config::env::{
    FLIGHT_DIR_VAR, FLIGHT_RECORDS_VAR, FLIGHT_SIGNAL_VAR, IO_VAR, SEAL_THREADS_VAR, SHM_VAR,
    SIMD_VAR, SOCKET_BUFFER_VAR, SPIN_VAR, TCP_CONGESTION_VAR, TIMEOUT_VAR, WIRE_VAR,
};

/// A communicator that moves nothing, for tests and benchmarks: not part of the API.
#[doc(hidden)]
pub use comm::stub::Stub;

/// The scalar reduction, without SIMD: exported for `benches/kernels.rs`, not part of the
/// API.
#[doc(hidden)]
pub use reduce::reduce_scalar;

/// Initialises a backend from MLX's launch environment and makes it the default group, as
/// `mx.distributed.init()`: [`init_backend`] with [`Backend::Any`].
///
/// `strict` decides what happens outside a launch. With `strict`, a missing environment is
/// an error naming the variables. Without it, a process with no launch variable set at all
/// gets the group of itself alone (size 1), so one program runs both launched and on its
/// own; but a launch environment that is set and incomplete or unusable (`MLX_HOSTFILE`
/// without `MLX_RANK`, a JACCL launch in a build without `jaccl`) is an error either way,
/// never a silent group of one. A complete environment that fails to form a group is
/// always an error.
///
/// # Errors
///
/// As [`init_backend`].
///
/// # Examples
///
/// ```
/// use nuvec_distributed_engine::{Fault, init};
///
/// // Run outside a launch (no MLX_HOSTFILE, MLX_RANK or JACCL variable set)...
/// # for var in ["MLX_HOSTFILE", "MLX_RANK", "MLX_IBV_DEVICES", "MLX_JACCL_COORDINATOR"] {
/// #     assert!(std::env::var_os(var).is_none(), "the example expects {var} unset");
/// # }
/// // ...strict, it is an error that names what is missing:
/// let err = init(true).unwrap_err();
/// assert_eq!(err.fault(), Fault::Unavailable);
/// assert!(err.to_string().contains("MLX_HOSTFILE"), "{err}");
///
/// // ...not strict, it is this process alone, so one program runs launched or not:
/// let group = init(false)?;
/// assert_eq!((group.rank(), group.size()), (0, 1));
/// let mut x = [1.0f32, 2.0];
/// group.all_sum(&mut x)?;
/// assert_eq!(x, [1.0, 2.0]);
/// // It is also the default group the free functions use.
/// nuvec_distributed_engine::all_sum(&mut x, None)?;
/// # Ok::<(), nuvec_distributed_engine::Error>(())
/// ```
pub fn init(strict: bool) -> Result<Group> {
    init_backend(strict, Backend::Any)
}
