//! Tests of JACCL's algorithms on the emulated fabric: whole groups of P ranks (threads) that
//! join a real side channel on loopback, exchange their emulated queue pairs' addresses, and
//! run collectives, exactly as over verbs.
//!
//! - `collectives`: every op, dtype and size class against a reference computed here;
//! - `frames`: the messages each algorithm posts, against MLX 0.32.1's schedule derived
//!   independently from the reference;
//! - `faults`: failed and lost messages, lost ranks and timeouts end in errors naming the peer;
//! - `mixed`: groups with ranks that publish MLX's set-up records: what nuvec ranks do with
//!   the knowledge (a mixed ring refuses all_gather);
//! - `probes` (feature `probes`, Linux, as root): the tracing probes, under bpftrace.

mod abort;
mod collectives;
mod faults;
mod frames;
mod mixed;
#[cfg(all(feature = "probes", target_os = "linux"))]
mod probes;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use super::bootstrap::{Records, SideChannel};
use super::config::MlxAllGather;
use super::frames::{PSN, SizeClasses};
use super::group::{Jaccl, Kind, Setup};
use crate::error::Result;
use crate::group::Group;
use crate::loopback_ports::free_addr;
use crate::transport::rdma::emulated::{EmulatedFabric, Network};
use crate::transport::rdma::engine;

/// A group layout to test.
#[derive(Clone, Copy, Debug)]
pub(super) struct Layout {
    pub(super) size: usize,
    pub(super) kind: Kind,
    pub(super) classes: SizeClasses,
    pub(super) timeout: Duration,
    /// Bit `r` set: rank `r` publishes its set-up records as an MLX rank does (no mark).
    pub(super) mlx: u32,
    pub(super) mlx_all_gather: MlxAllGather,
}

impl Layout {
    pub(super) fn mesh(size: usize) -> Self {
        Layout {
            size,
            kind: Kind::Mesh,
            classes: SizeClasses::Large,
            timeout: Duration::from_secs(20),
            mlx: 0,
            mlx_all_gather: MlxAllGather::Defective,
        }
    }

    pub(super) fn ring(size: usize, wires: usize) -> Self {
        Layout {
            size,
            kind: Kind::Ring { wires },
            classes: SizeClasses::Large,
            timeout: Duration::from_secs(20),
            mlx: 0,
            mlx_all_gather: MlxAllGather::Defective,
        }
    }

    /// Rank `rank` publishes MLX's set-up records (it still runs this crate's algorithms).
    pub(super) fn mlx_rank(mut self, rank: usize) -> Self {
        self.mlx |= 1 << rank;
        self
    }

    pub(super) fn mlx_all_gather(mut self, mlx: MlxAllGather) -> Self {
        self.mlx_all_gather = mlx;
        self
    }

    pub(super) fn classes(mut self, classes: SizeClasses) -> Self {
        self.classes = classes;
        self
    }

    pub(super) fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}

/// Forms rank `rank`'s group of `layout` on `net`, with the side channel at `addr`.
pub(super) fn form(
    layout: Layout,
    net: &Network,
    addr: SocketAddr,
    rank: usize,
) -> Result<(Group, Arc<Jaccl<EmulatedFabric>>)> {
    let side = SideChannel::connect(rank, layout.size, addr, layout.timeout)?;
    let plan = layout.kind.plan(rank, layout.size, layout.classes);
    let present = layout.kind.present(rank, layout.size);
    let fabric = EmulatedFabric::open(net, rank, &present, &plan.buffers, PSN);
    let setup = Setup {
        rank,
        size: layout.size,
        kind: layout.kind,
        classes: layout.classes,
        timeout: layout.timeout,
        spin: engine::SHARED,
        mlx_all_gather: layout.mlx_all_gather,
        records: if layout.mlx & (1 << rank) != 0 {
            Records::Mlx
        } else {
            Records::Nuvec
        },
    };
    let jaccl = Arc::new(Jaccl::form(setup, side, fabric, plan)?);
    Ok((Group::new(jaccl.clone()), jaccl))
}

/// Runs `body` on every rank of a group of `layout` (one thread per rank) and returns each
/// rank's result; a rank whose group cannot form returns the error.
pub(super) fn run<T: Send>(
    layout: Layout,
    net: &Network,
    body: impl Fn(usize, Group) -> T + Sync,
) -> Vec<Result<T>> {
    let addr = free_addr();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..layout.size)
            .map(|rank| {
                let body = &body;
                std::thread::Builder::new()
                    .name(format!("rank {rank}"))
                    .spawn_scoped(s, move || {
                        let (group, _) = form(layout, net, addr, rank)?;
                        Ok(body(rank, group))
                    })
                    .expect("spawning a rank")
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h.join() {
                Ok(r) => r,
                Err(panic) => std::panic::resume_unwind(panic),
            })
            .collect()
    })
}

/// [`run`], requiring every rank to form its group.
pub(super) fn run_ok<T: Send>(
    layout: Layout,
    net: &Network,
    body: impl Fn(usize, Group) -> T + Sync,
) -> Vec<T> {
    run(layout, net, body)
        .into_iter()
        .enumerate()
        .map(|(rank, r)| r.unwrap_or_else(|e| panic!("rank {rank} of {layout:?}: {e}")))
        .collect()
}
