//! The native wire: ranks of this crate only, with a handshake on every connection, a
//! header on every collective and latency-optimal algorithms over connections between any
//! two ranks (see [`Wire::Native`](crate::Wire::Native)).
//!
//! - `hello`: the handshake each connection opens with (magic, version, capabilities,
//!   group size, both ranks, group and host identity), sans-IO;
//! - `bootstrap`: forming the mesh: the ring's neighbour connections plus one to every
//!   other rank, each through the hello (and, with a key, the authentication of
//!   [`crate::auth`]), into a [`Formed`];
//! - the data path: the collective header, the algorithms as state machines without I/O,
//!   and the engine that drives them over the [`Formed`] transport: `header` (the
//!   header every message starts with, and the mismatch it can reveal), `protocol` (the
//!   algorithms, sans-IO, with the order in which they combine contributions), `engine`
//!   (their I/O), and [`Native`] (the [`Communicator`]);
//! - shared memory (`transport::shm`) for groups whose ranks all run on one host (every
//!   group collective and every send/recv goes through one segment; liveness and failure
//!   notices stay on the connections). A group spread over several hosts runs
//!   hierarchically: shared memory inside each host, TCP between the hosts' leaders
//!   (`hier`).
//!
//! # Which algorithm
//!
//! An all-reduce of `n` bytes over P ranks goes one-shot up to [`ONE_SHOT_MAX_P2`]
//! (P = 2) or [`ONE_SHOT_MAX`] (P >= 3), by direct reduce-scatter + all-gather below
//! [`RING_MIN`], and over MLX's pipelined ring from there on (after a round of headers,
//! so that a mismatch is found before data moves). all_gather and sum_scatter send every
//! block straight to its rank; barrier is a round of headers; send/recv go on the mesh
//! connection to any peer. A broadcast goes straight from the root up to
//! [`BROADCAST_DIRECT_MAX`], by scatter + all-gather above it; all_to_all sends every
//! block straight to its rank. See `protocol` for the order of combination, which makes every
//! result identical on every rank and from run to run.
//!
//! # A mismatch
//!
//! Every rank sends its header to every peer in a group collective, and reads each
//! peer's header before that peer's data, so every rank whose call differs from another
//! rank's finds it, fails the collective with [`Error::Mismatch`] naming both calls, and
//! fails the group (closing its connections, so the others do not wait out their
//! timeout). A `send` is not acknowledged (as on MLX's wire, so that two ranks may both
//! send before they receive): a mismatched `recv` fails at once and answers the sender,
//! whose next call that reads from the receiver (any group collective, a `recv`) fails
//! with the same mismatch (see `header`).

pub(crate) mod bootstrap;
pub(crate) mod hello;

use crate::ring::transport::Transport;

/// A formed native mesh, handed from the bootstrap to the data path.
///
/// `transport` holds the neighbours' connections as the MLX wire's ring does (connection
/// `i` to the left neighbour at index `i`, to the right one at `C + i`) and then one
/// connection to each rank that is not a neighbour, in increasing rank order (see
/// [`Transport::mesh`], [`Transport::send_conn`], [`Transport::recv_conn`]).
#[derive(Debug)]
pub(crate) struct Formed {
    /// Every connection, each of which completed the hello.
    pub(crate) transport: Transport,
    /// This rank.
    pub(crate) rank: usize,
    /// Ranks in the group.
    pub(crate) size: usize,
    /// What every rank said about itself, indexed by rank (this rank's own entry included).
    pub(crate) peers: Vec<Peer>,
    /// Ranks the hostfile puts on this host, this one included (for the spin policy).
    pub(crate) local_ranks: usize,
    /// The group identity every hello carried (names the shared-memory segment).
    pub(crate) group: [u8; 32],
}

/// What a rank's hello said about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Peer {
    /// Identifies the host the rank runs on: equal for ranks on one host (shared memory).
    pub(crate) host: [u8; 16],
    /// The capability bits it offered.
    pub(crate) capabilities: u64,
}

mod engine;
pub(crate) mod header;
mod hier;
pub(crate) mod protocol;
#[cfg(test)]
mod shm_tests;
#[cfg(test)]
mod tests;
// Issue 16: broadcast and all_to_all.
#[cfg(test)]
mod bcast_tests;

use std::fmt;
use std::time::Duration;

use header::{Call, Header, Kind};
use protocol::{Exchange, Memory, Routes};

use crate::comm::Communicator;
use crate::comm::progress::Spin;
use crate::comm::state::Guarded;
use crate::element::DType;
use crate::error::{Error, PeerOp, Phase, Result};
use crate::options::Options;
use crate::reduce::ReduceOp;
use crate::ring::protocol::{Buffers, Lane, Topology};
use crate::ring::staging::Staging;
use crate::ring::transport::Transfer;
use crate::transport::shm;

// The thresholds come from `tests::measure_the_algorithms` (median of each rank's
// all_sum f32 times, P threads on loopback in one process, on a 2-core VM whose load
// average was 8.5, so only the crossings are worth anything, not the times):
//
// | bytes | P = 2: one-shot / direct / ring | P = 3 | P = 4 |
// |---|---|---|---|
// | 8 KiB | 52 / 62 / 95 µs | 88 / 90 / 160 µs | 152 / 205 / 289 µs |
// | 64 KiB | 96 / 72 / 103 µs | 193 / 139 / 193 µs | 375 / 305 / 397 µs |
// | 256 KiB | 201 / 152 / 247 µs | 531 / 329 / 351 µs | 3250 / 545 / 733 µs |
// | 1 MiB | 3.3 / 4.1 / 0.6 ms | 4.6 / 1.5 / 1.1 ms | 12.5 / 2.7 / 1.5 ms |
// | 16 MiB | 45 / 41 / 36 ms | 171 / 55 / 49 ms | 323 / 116 / 136 ms |
//
// Re-measure on an idle machine (and across hosts) before trusting them further.

/// Largest all-reduce (bytes) that goes one-shot at P = 2: one hop, each rank folds the
/// whole vector. Both ways of reducing send the same bytes per rank at P = 2; the
/// one-shot wins while the second hop costs more than folding the whole vector instead
/// of half of it (measured: ahead at 8 KiB, behind at 64 KiB).
const ONE_SHOT_MAX_P2: usize = 32 << 10;

/// Largest all-reduce (bytes) that goes one-shot at P >= 3, where each rank sends its
/// vector P - 1 times: small vectors only, where the hops, not the bytes, are the cost
/// (measured: ahead or even at 8 KiB, behind at 64 KiB).
const ONE_SHOT_MAX: usize = 16 << 10;

/// Smallest all-reduce (bytes) that takes MLX's pipelined ring: the direct
/// reduce-scatter/all-gather finishes each round before the next starts and stages a
/// copy of every peer's block, while the ring overlaps its steps in bounded staging
/// (measured: the ring ahead from 1 MiB at every P).
const RING_MIN: usize = 1 << 20;

impl Routes for Transport {
    fn send_conn(&self, peer: usize) -> usize {
        Transport::send_conn(self, peer)
    }

    fn recv_conn(&self, peer: usize) -> usize {
        Transport::recv_conn(self, peer)
    }
}

/// Largest broadcast (bytes) that goes from the root straight to every rank; larger ones
/// scatter from the root and all-gather among the others. An estimate, not a measurement:
/// the crossing of the all-reduce's one-shot and direct algorithms (between 8 and 64 KiB,
/// above), which weigh one hop against the root's P - 1 copies the same way.
const BROADCAST_DIRECT_MAX: usize = 32 << 10;

/// One rank's end of a formed native mesh (see the module docs).
pub(crate) struct Native {
    rank: usize,
    size: usize,
    timeout: Duration,
    spin: Spin,
    /// For each rank, whether the group's collectives reach it through shared memory
    /// (what `transport` reports): every rank on a single-host segment, this host's ranks
    /// in a hierarchical group.
    shared: Vec<bool>,
    state: Guarded<State>,
}

struct State {
    transport: Transport,
    exchange: Exchange,
    /// Staging for the direct algorithms; grows to the largest collective and stays.
    stage: Vec<u8>,
    /// The ring's lanes and staging for large all-reduces, made at the first one.
    lanes: Vec<Lane>,
    ring_stage: Option<Staging>,
    /// The group collectives started so far (the next one's sequence number).
    seq: u32,
    /// Sends to each rank so far, and receives from each rank so far.
    sent: Vec<u32>,
    /// The length of the last send to each rank, to name it if the receiver refuses it.
    sent_len: Vec<u64>,
    received: Vec<u32>,
    /// Scratch for the connections a stalled collective waits on.
    waits: Vec<(usize, PeerOp)>,
    /// The group's shared memory, when every rank is on this host: group collectives and
    /// send/recv go through it, liveness stays on the connections.
    shm: Option<shm::Link>,
    /// The group's shared memory when its ranks sit on several hosts, some with two ranks
    /// or more (see `hier`); broadcast, all_to_all, send/recv stay on TCP.
    hier: Option<Box<hier::Hier>>,
}

impl fmt::Debug for Native {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Native")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// What the tracing probes are told about a collective (codes as the ring's).
#[derive(Clone, Copy, Debug)]
struct Traced {
    op: u8,
    dtype: u8,
    bytes: u64,
}

impl Traced {
    fn of(call: &Call) -> Traced {
        let code = |d: DType| {
            DType::ALL
                .iter()
                .position(|&x| x == d)
                .map_or(255, |i| i as u8)
        };
        let count = call.header.count;
        let (op, dtype, bytes) = match call.header.kind {
            Kind::AllReduce(op, dtype) => {
                let op = match op {
                    ReduceOp::Sum => 0,
                    ReduceOp::Max => 1,
                    ReduceOp::Min => 2,
                };
                (op, code(dtype), count * dtype.size() as u64)
            }
            // Op 7, as the MLX wire's barrier (see `ffi::probes`).
            Kind::Barrier => (7, 255, 0),
            Kind::AllGather => (3, 255, count),
            Kind::SumScatter(dtype) => (4, code(dtype), count * dtype.size() as u64),
            Kind::Send if call.recv_from.is_some() => (6, 255, count),
            Kind::Send | Kind::Rejected => (5, 255, count),
            // Op codes 8 and 9 (see `ffi::probes`).
            Kind::Broadcast(_) => (8, 255, count),
            Kind::AllToAll => (9, 255, count),
        };
        Traced { op, dtype, bytes }
    }
}

/// How an all-reduce of `bytes` goes over `size` ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Algorithm {
    OneShot,
    ScatterGather,
    Ring,
}

impl Algorithm {
    fn choose(size: usize, bytes: usize, elems: usize) -> Algorithm {
        let one_shot = if size == 2 {
            ONE_SHOT_MAX_P2
        } else {
            ONE_SHOT_MAX
        };
        if bytes <= one_shot || elems < size {
            Algorithm::OneShot
        } else if bytes < RING_MIN {
            Algorithm::ScatterGather
        } else {
            Algorithm::Ring
        }
    }
}

impl Native {
    /// Takes over a formed mesh.
    ///
    /// # Errors
    ///
    /// Setting up shared memory failed: a co-located peer closed or stalled, or its
    /// segment could not be mapped.
    pub(crate) fn new(formed: Formed, options: &Options) -> Result<Native> {
        let Formed {
            mut transport,
            rank,
            size,
            local_ranks,
            peers,
            group,
        } = formed;
        // The hellos' host identities: which ranks share this host. All zeros is an
        // unknown host.
        let known = |r: &usize| peers[*r].host != [0; 16];
        let here: Vec<usize> = (0..size)
            .filter(|r| known(r) && peers[*r].host == peers[rank].host)
            .collect();
        let offered = peers
            .iter()
            .all(|p| p.capabilities & hello::CAP_SHARED_MEMORY != 0);
        let spin = Spin::for_local_ranks(options.spin, local_ranks);
        // Every rank sees every hello, so all decide alike (see `hier`).
        let hosts: Vec<[u8; 16]> = peers.iter().map(|p| p.host).collect();
        let setup = hier::setup(
            &mut transport,
            (rank, &hosts),
            offered,
            &group,
            options.timeout,
            spin,
        )?;
        let (shm, hier) = match setup {
            hier::Setup::Flat(link) => (Some(*link), None),
            hier::Setup::Hier(hier) => (None, Some(hier)),
            hier::Setup::Tcp => (None, None),
        };
        let links = match (&shm, &hier) {
            (Some(link), _) if link.locked() => "shared memory (locked)",
            (Some(_), _) => "shared memory",
            (None, Some(h)) if h.locked() => {
                "shared memory (locked) inside this host, tcp between hosts"
            }
            (None, Some(_)) => "shared memory inside this host, tcp between hosts",
            (None, None) => "tcp",
        };
        crate::verbose::verbose!(
            rank,
            "native wire: {size} ranks, ranks {here:?} on this host by their hellos, \
             shared memory {} by every rank, links: {links}",
            if offered { "offered" } else { "not offered" }
        );
        // A close from another thread wakes a collective blocked on the poller; should the
        // wake-up fail, the collective still sees the flag at its next event or deadline.
        let waker = transport.waker();
        let shared = match (&shm, &hier) {
            (Some(_), _) => vec![true; size],
            (None, Some(h)) => (0..size).map(|r| h.sharing().contains(&r)).collect(),
            (None, None) => vec![false; size],
        };
        Ok(Native {
            rank,
            size,
            timeout: options.timeout,
            spin,
            shared,
            state: Guarded::new(State {
                transport,
                exchange: Exchange::default(),
                stage: Vec::new(),
                lanes: Vec::new(),
                ring_stage: None,
                seq: 0,
                sent: vec![0; size],
                sent_len: vec![0; size],
                received: vec![0; size],
                waits: Vec::new(),
                shm,
                hier,
            })
            .on_close(move || {
                let _ = waker.wake();
            }),
        })
    }

    /// The next group collective's call.
    fn group_call(state: &mut State, kind: Kind, count: usize) -> Call {
        let call = Call::group(state.seq, kind, count as u64);
        state.seq = state.seq.wrapping_add(1);
        call
    }

    /// Runs the planned exchange over `data`/`input`; a fatal error fails the group.
    fn run(&self, state: &mut State, call: &Call, data: &mut [u8], input: &[u8]) -> Result<()> {
        let State {
            transport,
            exchange,
            stage,
            waits,
            sent,
            sent_len,
            ..
        } = state;
        if stage.len() < exchange.staging() {
            // Grows to the largest collective so far, then stays: no allocation per call.
            stage.resize(exchange.staging(), 0);
        }
        self.traced(call, || {
            let mut mem = Memory { data, input, stage };
            let result = engine::run(
                transport,
                exchange,
                &mut mem,
                waits,
                self.timeout,
                self.spin,
                call.phase(),
                self.state.close_flag(),
            );
            let result = match result {
                Err(Error::Mismatch {
                    seq,
                    point_to_point,
                    rank,
                    call: mine,
                    peer,
                    peer_call,
                    context,
                }) => {
                    let mine = if mine.is_empty() {
                        refused_send(sent, sent_len, seq, peer)
                    } else {
                        if let Some(src) = call.recv_from
                            && exchange.refused().is_some()
                        {
                            // Tell the sender, which is not waiting for an answer (see
                            // `header`): best effort, before the group fails and closes.
                            transport.assume_ready();
                            let rejection = call.rejection().encode();
                            let _ = transport.conn(transport.send_conn(src)).write(&rejection);
                        }
                        mine
                    };
                    Err(Error::Mismatch {
                        seq,
                        point_to_point,
                        rank,
                        call: mine,
                        peer,
                        peer_call,
                        context,
                    })
                }
                result => result,
            };
            self.settle(transport, result)
        })
    }

    /// Runs a group collective through shared memory (`f`, with the link and what it
    /// watches while it waits); a fatal error fails the group.
    fn run_shm(
        &self,
        state: &mut State,
        call: &Call,
        f: impl FnOnce(&mut shm::Link, &mut shm::Watch<'_>) -> Result<()>,
    ) -> Result<()> {
        let State {
            transport,
            shm,
            sent,
            sent_len,
            ..
        } = state;
        let Some(link) = shm.as_mut() else {
            return Err(Error::Bug {
                context: call.phase(),
                what: "shared memory vanished".into(),
            });
        };
        self.traced(call, || {
            let mut watch = shm::Watch {
                transport,
                closed: self.state.close_flag(),
                context: call.phase(),
                call: Some((self.rank, call)),
            };
            let result = f(link, &mut watch).map_err(|e| name_refused_send(sent, sent_len, e));
            self.settle(transport, result)
        })
    }

    /// Runs a group collective on a hierarchical group (`f`, with its end and what it
    /// watches while it waits); a fatal error fails the group.
    fn run_hier(
        &self,
        state: &mut State,
        call: &Call,
        f: impl FnOnce(&mut hier::Hier, &mut shm::Watch<'_>) -> Result<()>,
    ) -> Result<()> {
        let State {
            transport, hier, ..
        } = state;
        let Some(hier) = hier.as_mut() else {
            return Err(Error::Bug {
                context: call.phase(),
                what: "the hierarchical group vanished".into(),
            });
        };
        self.traced(call, || {
            // No header check on the connections meanwhile: a faster rank's next call may
            // be on them already (see `hier`).
            let mut watch = shm::Watch {
                transport,
                closed: self.state.close_flag(),
                context: call.phase(),
                call: None,
            };
            let result = f(hier, &mut watch);
            self.settle(transport, result)
        })
    }

    /// Runs `collective` between the tracing probes of `call`.
    fn traced(&self, call: &Call, collective: impl FnOnce() -> Result<()>) -> Result<()> {
        let traced = Traced::of(call);
        let ranks = self.size as u64;
        ffi::probes::collective(traced.op, traced.dtype, traced.bytes, ranks, collective)
    }

    /// Fails the group on a fatal error (telling the peers, as the ring does).
    fn settle(&self, transport: &mut Transport, result: Result<()>) -> Result<()> {
        match result {
            Err(error) if error.is_fatal() => Err(crate::ring::fail(transport, &self.state, error)),
            result => result,
        }
    }

    /// An all-reduce by `algorithm` (tests and measurements force one).
    fn all_reduce_by(
        &self,
        algorithm: Algorithm,
        op: ReduceOp,
        dtype: DType,
        data: &mut [u8],
    ) -> Result<()> {
        let mut state = self.state.lock()?;
        let state = &mut *state;
        let elems = data.len() / dtype.size();
        // The ring needs an element per rank (MLX pads fewer; the direct ones need not).
        let algorithm = match algorithm {
            Algorithm::Ring if elems < self.size => Algorithm::OneShot,
            algorithm => algorithm,
        };
        if algorithm == Algorithm::Ring
            && state.ring_stage.is_none()
            && state.shm.is_none()
            && state.hier.is_none()
            && self.size > 1
        {
            // Before the call is numbered: a mapping failure is local, leaves the group
            // usable, and must not put this rank's sequence ahead of its peers'.
            state.ring_stage = Some(Staging::new(state.transport.connections())?);
        }
        let call = Self::group_call(state, Kind::AllReduce(op, dtype), elems);
        if self.size == 1 {
            return Ok(());
        }
        if state.shm.is_some() {
            return self.run_shm(state, &call, |link, watch| {
                link.all_reduce(&call, (op, dtype), data, watch)
            });
        }
        if state.hier.is_some() {
            return self.run_hier(state, &call, |hier, watch| {
                hier.all_reduce(&call, (op, dtype), data, watch)
            });
        }
        let (me, p) = (self.rank, self.size);
        match algorithm {
            Algorithm::OneShot => {
                let len = data.len();
                state
                    .exchange
                    .one_shot(&state.transport, me, p, &call, (op, dtype), len);
            }
            Algorithm::ScatterGather => {
                state
                    .exchange
                    .scatter_gather(&state.transport, me, p, &call, (op, dtype), elems);
            }
            Algorithm::Ring => return self.ring_all_reduce(state, &call, (op, dtype), data),
        }
        self.run(state, &call, data, &[])
    }

    /// A broadcast, straight from the root if `direct`, else by scatter and all-gather
    /// (tests force one).
    fn broadcast_by(&self, direct: bool, data: &mut [u8], root: usize) -> Result<()> {
        // Before the call is numbered: refused, the group stays usable and in step.
        let Ok(wire_root) = u16::try_from(root) else {
            return Err(Error::invalid(format!(
                "broadcast: root {root} is past 65535, the last root the native wire's \
                 header can name"
            )));
        };
        let mut state = self.state.lock()?;
        let state = &mut *state;
        let call = Self::group_call(state, Kind::Broadcast(wire_root), data.len());
        if self.size == 1 {
            return Ok(());
        }
        if state.shm.is_some() {
            return self.run_shm(state, &call, |link, watch| {
                link.broadcast(&call, data, root, watch)
            });
        }
        if state.hier.is_some() {
            // A hierarchical group compares calls through the hierarchy first, so that a
            // mismatch with a collective that runs through it fails every rank as one.
            self.run_hier(state, &call, |hier, watch| hier.barrier(&call, watch))?;
        }
        let (me, p, len) = (self.rank, self.size, data.len());
        if direct {
            state
                .exchange
                .broadcast_direct(&state.transport, me, p, &call, root, len);
        } else {
            state
                .exchange
                .broadcast_scatter(&state.transport, me, p, &call, root, len);
        }
        self.run(state, &call, data, &[])
    }

    /// A large all-reduce: headers with every peer, then MLX's pipelined ring over the
    /// neighbour connections.
    fn ring_all_reduce(
        &self,
        state: &mut State,
        call: &Call,
        (op, dtype): (ReduceOp, DType),
        data: &mut [u8],
    ) -> Result<()> {
        state
            .exchange
            .headers(&state.transport, self.rank, self.size, call);
        self.run(state, call, &mut [], &[])?;
        let topo = Topology {
            rank: self.rank,
            size: self.size,
            connections: state.transport.connections(),
        };
        let elems = data.len() / dtype.size();
        crate::ring::protocol::plan_all_reduce(&mut state.lanes, &topo, op, dtype, elems);
        let State {
            transport,
            lanes,
            ring_stage,
            ..
        } = state;
        let Some(ring_stage) = ring_stage.as_mut() else {
            return Err(Error::Bug {
                context: call.phase(),
                what: "the ring's staging vanished".into(),
            });
        };
        let result = crate::ring::engine::run(
            transport,
            lanes,
            &mut Buffers { data, input: &[] },
            &mut ring_stage.lanes,
            self.timeout,
            self.spin,
            call.phase(),
            self.state.close_flag(),
        );
        self.settle(transport, result)
    }
}

/// How this rank names its send that `peer` refused, with sequence number `seq`.
fn refused_send(sent: &[u32], sent_len: &[u64], seq: u64, peer: usize) -> String {
    // A refused send of this rank's, answered after it had returned.
    let last = u64::from(sent[peer].wrapping_sub(1));
    if seq == last {
        format!("send of {} bytes to rank {peer}", sent_len[peer])
    } else {
        format!("send to rank {peer}")
    }
}

/// `error`, with this rank's call named if it is a mismatch about a refused send (whose
/// check leaves the call empty; see `header`).
fn name_refused_send(sent: &[u32], sent_len: &[u64], error: Error) -> Error {
    match error {
        Error::Mismatch {
            seq,
            point_to_point,
            rank,
            call,
            peer,
            peer_call,
            context,
        } => Error::Mismatch {
            call: if call.is_empty() {
                refused_send(sent, sent_len, seq, peer)
            } else {
                call
            },
            seq,
            point_to_point,
            rank,
            peer,
            peer_call,
            context,
        },
        error => error,
    }
}

impl Communicator for Native {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn backend(&self) -> &'static str {
        "ring"
    }

    /// Shared memory for the ranks whose collectives go through a segment (every rank
    /// when the group formed on one, this host's in a hierarchical group), TCP otherwise.
    fn transport(&self, peer: usize) -> crate::comm::Transport {
        if self.shared.get(peer).copied().unwrap_or(false) {
            crate::comm::Transport::SharedMemory
        } else {
            crate::comm::Transport::Tcp
        }
    }

    fn all_reduce(&self, op: ReduceOp, dtype: DType, data: &mut [u8]) -> Result<()> {
        let algorithm = Algorithm::choose(self.size, data.len(), data.len() / dtype.size());
        self.all_reduce_by(algorithm, op, dtype, data)
    }

    fn all_gather(&self, input: &[u8], output: &mut [u8]) -> Result<()> {
        let mut state = self.state.lock()?;
        let state = &mut *state;
        let nbytes = input.len();
        let call = Self::group_call(state, Kind::AllGather, nbytes);
        output[self.rank * nbytes..(self.rank + 1) * nbytes].copy_from_slice(input);
        if self.size == 1 {
            return Ok(());
        }
        if state.shm.is_some() {
            return self.run_shm(state, &call, |link, watch| {
                link.all_gather(&call, input, output, watch)
            });
        }
        if state.hier.is_some() {
            return self.run_hier(state, &call, |hier, watch| {
                hier.all_gather(&call, input, output, watch)
            });
        }
        state
            .exchange
            .all_gather(&state.transport, self.rank, self.size, &call, nbytes);
        self.run(state, &call, output, input)
    }

    fn sum_scatter(&self, dtype: DType, input: &[u8], output: &mut [u8]) -> Result<()> {
        let mut state = self.state.lock()?;
        let state = &mut *state;
        let chunk = output.len();
        let call = Self::group_call(state, Kind::SumScatter(dtype), input.len() / dtype.size());
        if self.size == 1 {
            output.copy_from_slice(input);
            return Ok(());
        }
        if state.shm.is_some() {
            return self.run_shm(state, &call, |link, watch| {
                link.sum_scatter(&call, dtype, input, output, watch)
            });
        }
        if state.hier.is_some() {
            return self.run_hier(state, &call, |hier, watch| {
                hier.sum_scatter(&call, dtype, input, output, watch)
            });
        }
        state
            .exchange
            .sum_scatter(&state.transport, self.rank, self.size, &call, dtype, chunk);
        self.run(state, &call, output, input)
    }

    fn send(&self, data: &[u8], dst: usize) -> Result<()> {
        let mut state = self.state.lock()?;
        let state = &mut *state;
        let seq = state.sent[dst];
        state.sent[dst] = seq.wrapping_add(1);
        state.sent_len[dst] = data.len() as u64;
        let call = Call {
            header: Header {
                seq,
                kind: Kind::Send,
                count: data.len() as u64,
            },
            recv_from: None,
            send_to: Some(dst),
        };
        if state.shm.is_some() {
            return self.run_shm(state, &call, |link, watch| {
                link.send(&call, data, dst, watch)
            });
        }
        state.exchange.send(
            &state.transport,
            self.rank,
            self.size,
            &call,
            dst,
            data.len(),
        );
        self.run(state, &call, &mut [], data)
    }

    fn recv(&self, data: &mut [u8], src: usize) -> Result<()> {
        let mut state = self.state.lock()?;
        let state = &mut *state;
        let seq = state.received[src];
        state.received[src] = seq.wrapping_add(1);
        let call = Call {
            header: Header {
                seq,
                kind: Kind::Send,
                count: data.len() as u64,
            },
            recv_from: Some(src),
            send_to: None,
        };
        if state.shm.is_some() {
            return self.run_shm(state, &call, |link, watch| {
                link.recv(&call, data, src, watch)
            });
        }
        let len = data.len();
        state
            .exchange
            .recv(&state.transport, self.rank, self.size, &call, src, len);
        self.run(state, &call, data, &[])
    }

    fn barrier(&self) -> Result<()> {
        let mut state = self.state.lock()?;
        let state = &mut *state;
        let call = Self::group_call(state, Kind::Barrier, 0);
        if self.size == 1 {
            return Ok(());
        }
        if state.shm.is_some() {
            return self.run_shm(state, &call, |link, watch| link.barrier(&call, watch));
        }
        if state.hier.is_some() {
            return self.run_hier(state, &call, |hier, watch| hier.barrier(&call, watch));
        }
        state
            .exchange
            .headers(&state.transport, self.rank, self.size, &call);
        self.run(state, &call, &mut [], &[])
    }

    // Issue 16: broadcast and all_to_all.

    fn broadcast(&self, data: &mut [u8], root: usize) -> Result<()> {
        let direct = data.len() <= BROADCAST_DIRECT_MAX || self.size <= 2;
        self.broadcast_by(direct, data, root)
    }

    fn all_to_all(&self, input: &[u8], output: &mut [u8]) -> Result<()> {
        let mut state = self.state.lock()?;
        let state = &mut *state;
        let block = input.len() / self.size;
        debug_assert_eq!(input.len(), output.len(), "Group checks the lengths");
        let call = Self::group_call(state, Kind::AllToAll, input.len());
        let mine = self.rank * block..(self.rank + 1) * block;
        output[mine.clone()].copy_from_slice(&input[mine]);
        if self.size == 1 {
            return Ok(());
        }
        if state.shm.is_some() {
            return self.run_shm(state, &call, |link, watch| {
                link.all_to_all(&call, input, output, watch)
            });
        }
        if state.hier.is_some() {
            // As broadcast's: calls compared through the hierarchy first.
            self.run_hier(state, &call, |hier, watch| hier.barrier(&call, watch))?;
        }
        state
            .exchange
            .all_to_all(&state.transport, self.rank, self.size, &call, block);
        self.run(state, &call, output, input)
    }

    fn close(&self) -> Result<()> {
        self.state.close(|state| {
            state.transport.close();
            state.stage = Vec::new();
            state.lanes = Vec::new();
            state.ring_stage = None;
            state.shm = None;
            state.hier = None;
        });
        Ok(())
    }

    fn is_closed(&self) -> bool {
        self.state.is_closed()
    }

    /// As the ring's: probes every connection when no collective runs, and otherwise
    /// reports only what the group already knows.
    fn health(&self) -> Result<()> {
        let Some(mut state) = self.state.try_lock()? else {
            return Ok(());
        };
        let mut found = None;
        for conn in state.transport.conns() {
            found = match conn.probe() {
                Ok(Transfer::Closed) => Some(conn.closed(PeerOp::Receive, Phase::HealthCheck)),
                Err(e) => Some(conn.failed(PeerOp::Receive, Phase::HealthCheck, e)),
                Ok(_) => continue,
            };
            break;
        }
        match found {
            Some(error) => Err(crate::ring::fail(&mut state.transport, &self.state, error)),
            None => Ok(()),
        }
    }
}
