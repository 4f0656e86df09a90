//! JACCL: MLX's RDMA backend over Thunderbolt 5 (feature `jaccl`).
//!
//! **Experimental, and unverified on Thunderbolt hardware.** Everything here is tested on an
//! emulated fabric that models Apple's transport, against MLX 0.32.1's message schedule
//! derived from its source; nobody has yet run `tests/jaccl_hardware.rs` (every collective,
//! launched by `mlx.launch --backend jaccl` on Macs with Thunderbolt 5) to confirm that it
//! works on the real thing, alone or beside MLX ranks. Until someone does, treat interop with
//! MLX's JACCL as a goal, not a fact.
//!
//! **On macOS the verbs binding itself is unverified.** `post_send`, `post_recv` and
//! `poll_cq` are inline functions in the verbs header, so the binding calls them through the
//! device context's function table, at offsets (and with work-request and completion
//! layouts) checked by `ffi/tests/verbs_layout.rs` only against Linux rdma-core's header. That
//! test compiles against the macOS SDK's header too, but has not yet run on a Mac (the macOS
//! CI workflow runs it); until it passes there, the binding's soundness on macOS rests on
//! Apple's header matching rdma-core's (see SAFETY.md), and [`unavailable_reason`] says so.
//!
//! # What it is
//!
//! JACCL ("Jack and Angelos' Collective Communication Library") moves data with two-sided
//! RDMA SENDs over Unreliable Connected queue pairs, one per peer (mesh) or per cable and
//! neighbour (ring), and uses a TCP connection to rank 0 only to exchange the queue pairs'
//! addresses. Small collectives take microseconds instead of the TCP ring's tens of
//! microseconds. It needs macOS 26.2 or later on Macs with Thunderbolt 5, RDMA enabled once
//! from recoveryOS (`rdma_ctl enable`), and an IPv4 address on each Thunderbolt interface.
//! On Linux the same code runs over `libibverbs`, which is how it is built and tested.
//!
//! # Starting a group
//!
//! As with MLX: `mlx.launch --backend jaccl` (a mesh) or `--backend jaccl-ring` sets
//! `MLX_RANK`, `MLX_IBV_DEVICES` (the device file), `MLX_JACCL_COORDINATOR` and for the ring
//! `MLX_JACCL_RING`; then [`init_backend`](crate::init_backend)`(strict, Backend::Jaccl)`, or
//! [`init`](crate::init) (which tries the TCP ring first, as MLX's `any` does), forms the
//! group. [`Config`] reads the same settings for code that wants to look at them first, and
//! [`init`] forms a group from a [`Config`].
//!
//! # What is the same as MLX 0.32.1
//!
//! The side channel's bytes (every byte MLX reads; see "Telling nuvec ranks from MLX ranks"
//! for the padding MLX leaves undefined); the queue-pair set-up (UC, MTU 1024, PSN 7,
//! IPv4-mapped GIDs, INIT with local write + remote read + remote write, regions registered
//! with the same three rights, receives posted only inside collectives, after RTS); the
//! buffers (4 KiB to 512 KiB messages, chosen by message length and macOS release: 4 KiB
//! only on 26.2); and, per collective, the algorithm, the size of every message, their
//! number, the queue pair each goes on and their order: the mesh's fully connected and
//! scatter-gather all-reduce (above 32 KiB with more than two ranks), sum_scatter,
//! all_gather and send/recv to any peer; the ring's all-reduce and sum_scatter with their
//! wire thresholds, and send/recv to neighbours. Reductions follow JACCL's rules, which
//! differ from the TCP ring's for max and min: a NaN on either side, or a tie, lets the
//! incoming value win.
//!
//! Beside MLX's own JACCL code (0.32.1, compiled on Linux over the project's test verbs
//! provider), meshes of 2 and 3 ranks mixing MLX and nuvec ranks gave bit-identical
//! results in every case (all_sum, all_max and all_min over 9 dtypes with NaN, ±0, inf and
//! subnormal values, sum_scatter, all_gather, send/recv, barrier; both size classes), and
//! rings in every case but all_gather (below).
//!
//! # Apple's rules
//!
//! Where MLX's calls and what is reported of Apple's driver disagree, this crate follows
//! the driver; each rule is enforced by the test verbs provider's Apple profile (the fabric
//! of `tests/jaccl_provider.rs`), whose docs cite the source of each. The driver is reported
//! (llama.cpp's Apple transport, PR #26421, citing Apple's TN3205; mlx PR #4209) to refuse
//! regions without the remote rights, receives posted before RTS, a SEND whose 4 KiB frame
//! count differs from its RECV's, and an 11th queue pair on a device (`EBUSY`); to count
//! queue depth in frames; to put the active port elsewhere than 1; and to want a queue pair
//! destroyed, never moved to ERR first, before its regions are deregistered.
//!
//! # Where the calls depart from MLX's, and why
//!
//! None of these changes a byte on the wire.
//!
//! - **The port**: the device's first active port (`ibv_query_device`'s port count, then
//!   `ibv_query_port`), where MLX uses 1: Apple's active port is not always 1. MLX never
//!   calls `ibv_query_device`; the binding resolves it with MLX's other 16 functions.
//! - **The queue depth**: 256 per queue with large messages (two 512 KiB messages of 128
//!   frames each) and a completion queue of both queues' worth, where MLX asks for 32, 32
//!   and 64. Counted in frames, MLX's 32 holds its two messages in flight only up to the
//!   64 KiB class (2 x 16 frames); from 128 KiB (32 frames each) its pipeline does not fit,
//!   and a 256 or 512 KiB message exceeds it alone. See
//!   [`SizeClasses::queue_depth`]. Small classes (macOS 26.2) keep MLX's 32.
//! - **Teardown**: queue pairs are destroyed before the regions they may use are
//!   deregistered, never moved to ERR first. MLX's groups declare their buffers after their
//!   connections, so C++ destroys the buffers (deregistering) first; its groups usually live
//!   until the process exits.
//! - **The GID index** of the route at RTR is the one the GID scan found, not MLX's fixed 1
//!   (see `transport/rdma/verbs.rs`); the two agree on every Thunderbolt setup reported so far.
//! - **Completion channels** on each CQ where the library has them (MLX creates none), and
//!   **every completion's status is checked** (MLX ignores it), every wait bounded by
//!   [`Options::timeout`](crate::Options::timeout), and the side channel watched for a rank
//!   that goes away (MLX spins forever). Errors name the peer. After one, the group is
//!   failed; nuvec ranks tell each other which rank was lost, MLX ranks are only closed on.
//! - **Buffers** are anonymous mappings (page-aligned, as MLX's `posix_memalign`'d ones).
//! - **The library** is opened with `RTLD_NOW | RTLD_LOCAL` (MLX: `RTLD_GLOBAL`), so its
//!   symbols do not leak into the process's namespace; the device list is fetched for each
//!   device opened (MLX fetches it once per group).
//! - **Work-request ids** given to the library are the binding's slot numbers, which it
//!   maps back to MLX's tags on completion, so a completion always finds its buffer.
//! - **Errors say which limit**: `EBUSY` from `ibv_create_qp` names the device, Apple's
//!   ten-per-device limit and the counts; a device with no active port is refused naming
//!   its ports. MLX reports the errno.
//! - **One thread.** MLX runs each ring wire on a thread of its own and busy-polls; here the
//!   calling thread drives every wire, spinning briefly, then yielding, then sleeping on the
//!   completion channels or, without them, napping up to 1 ms at a time on the side
//!   channel's poller.
//! - **Configuration** is stricter: see [`Config`].
//!
//! # jaccl-ring all_gather, and telling nuvec ranks from MLX ranks
//!
//! MLX 0.32.1's ring all_gather is defective: it sends the lower half of each rank's block in
//! both directions and limits every block but rank 0's to zero bytes, so most of the output
//! is never filled. This crate's sends the same messages and fills the output correctly
//! (MLX PR #4443 fixes MLX's the same way: read against its `ring_impl.h`, the slices, limits
//! and message sizes are this crate's). In a ring that mixes MLX 0.32.1 and nuvec ranks,
//! both kinds would return wrong gathers as `Ok`.
//!
//! Nuvec ranks recognise each other at set-up: each writes a mark in the padding of the
//! 32-byte records it publishes on the side channel, which MLX neither writes nor reads and
//! rank 0 (MLX's too) relays byte for byte. So a ring of nuvec ranks alone knows its
//! all_gather is right and runs it; in a ring with MLX ranks, nuvec ranks exchange the
//! all_gather's messages (the group stays in step and usable) and then return
//! [`Error::Unsupported`] naming the MLX ranks, MLX's defect
//! and the fix. Nothing MLX sends tells its release, so a user whose MLX ranks run a release
//! with the fix says so: [`MLX_ALL_GATHER_VAR`]` = fixed` ([`MlxAllGather`]). Meshes are
//! unaffected.
//!
//! # Limits
//!
//! MLX's: a mesh has at most 8 ranks, a ring at most 4 cables per neighbour. Apple's: ten
//! queue pairs per device ([`APPLE_QUEUE_PAIRS_PER_DEVICE`], measured on macOS 26.5.1 by
//! mlx PR #4209; a mesh uses one per peer, a ring one per cable and side, and a process that
//! forms several groups adds them up) and reportedly about 100 memory regions (a mesh
//! connection uses 64, a ring connection 32). Messages carry no headers, so ranks must call
//! the same collectives with the same sizes in the same order, and a message lost on the
//! wire can only be noticed as a timeout (a later message may take its place first). All
//! ranks must run the same class of macOS release (26.2, or 26.3 and later).

pub(crate) mod bootstrap;
mod buffers;
mod config;
mod frames;
mod group;
mod machine;
mod mesh;
mod ring;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Instant;

pub use crate::transport::rdma::verbs::{
    APPLE_QUEUE_PAIRS_PER_DEVICE, PortState, RdmaDevice, devices, unavailable_reason,
};
pub use config::{
    COORDINATOR_VARS, Config, DEVICES_VARS, DeviceMatrix, MLX_ALL_GATHER_VAR, MlxAllGather,
    RANK_VARS, RING_VARS, Topology,
};
pub use frames::{BUFFERS_VAR, SizeClasses};

use crate::error::{Error, Result};
use crate::group::Group;
use crate::options::Options;
use crate::transport::rdma::engine::DEDICATED;
use crate::transport::rdma::fabric::Queues;
use crate::transport::rdma::verbs::VerbsFabric;
use crate::verbose::verbose;
use bootstrap::SideChannel;
use frames::PSN;
use group::{Jaccl, Kind, Setup};

/// Forms this rank's JACCL group from `config`, waiting at most `options.timeout` for the
/// other ranks at every step. A configuration of one rank is the group of this process
/// alone.
///
/// The steps are MLX's: join the side channel (rank 0 listens at the coordinator address),
/// open the devices and create the queue pairs, register the buffers, exchange addresses,
/// connect, and pass the side channel's barrier.
///
/// # Errors
///
/// An invalid configuration ([`Error::Config`] naming the device file, rank and cell), a
/// missing verbs library ([`Error::Unavailable`]), or a failure to reach a peer or to set up
/// a queue pair towards it (the error names the peer).
pub fn init(config: &Config, options: &Options) -> Result<Group> {
    options.validate()?;
    if let Some(missing) = config.missing() {
        return Err(Error::invalid(missing));
    }
    let topology = config.topology()?;
    let (rank, size) = (config.rank, config.size());
    if size == 1 {
        return Ok(Group::single());
    }
    let coordinator = config.coordinator_addr()?;
    let verbs = ffi::verbs::Verbs::load().map_err(|e| Error::Unavailable {
        backend: "jaccl",
        reason: e.to_string(),
    })?;
    let (kind, devices) = match topology {
        Topology::Mesh { devices } => (Kind::Mesh, devices),
        Topology::Ring { left, right } => (
            Kind::Ring { wires: left.len() },
            left.into_iter().chain(right).map(Some).collect(),
        ),
    };
    let connections = match kind {
        Kind::Mesh => 1,
        Kind::Ring { wires } => wires,
    };
    verbose!(
        rank,
        "forming a JACCL {} of {size} ({connections} connection(s) per peer) through the \
         coordinator at {coordinator}",
        if kind == Kind::Mesh { "mesh" } else { "ring" },
    );
    ffi::probes::register();
    let started = Instant::now();
    let formed = (|| {
        let side = SideChannel::connect(rank, size, coordinator, options.timeout)?;
        let plan = kind.plan(rank, size, config.buffers);
        let peers = kind.peers(rank, size);
        let queues = Queues {
            depth: config.buffers.queue_depth(),
            psn: PSN,
        };
        let fabric = VerbsFabric::open(
            &verbs,
            &devices,
            &plan.buffers,
            queues,
            &peers,
            bootstrap::SETUP,
        )?;
        let setup = Setup {
            rank,
            size,
            kind,
            classes: config.buffers,
            timeout: options.timeout,
            spin: DEDICATED,
            mlx_all_gather: config.mlx_all_gather,
            records: bootstrap::Records::Nuvec,
        };
        Jaccl::form(setup, side, fabric, plan)
    })();
    let elapsed = started.elapsed();
    ffi::probes::connect_done(
        rank as u64,
        size as u64,
        connections as u64,
        elapsed.as_nanos() as u64,
        formed.is_ok(),
    );
    match &formed {
        Ok(_) => verbose!(info: rank, "JACCL group formed in {elapsed:?}"),
        Err(e) => verbose!(warn: rank, "forming the JACCL group failed after {elapsed:?}: {e}"),
    }
    Ok(Group::new(Arc::new(formed?)))
}
