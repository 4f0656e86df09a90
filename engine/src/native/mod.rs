//! The native wire: ranks of this crate only, with a handshake on every connection, a
//! header on every collective and latency-optimal algorithms over connections between any
//! two ranks (see [`Backend::Native`](crate::Backend::Native)).
//!
//! - `hello`: the handshake each connection opens with (magic, version, capabilities,
//!   group size, both ranks, group and host identity), sans-IO;
//! - `bootstrap`: forming the mesh: the ring's neighbour connections plus one to every
//!   other rank, each through the hello (and, with a key, the authentication of
//!   [`crate::auth`]), into a [`Formed`];
//! - the data path: the collective header and the algorithms as state machines without
//!   I/O, driven over the [`Formed`] connections by TCP's engine
//!   ([`crate::transport::tcp::engine`]): `header` (the header every message starts with,
//!   and the mismatch it can reveal), `protocol` (the algorithms, sans-IO, with the order
//!   in which they combine contributions, as a [`Machine`](crate::comm::machine::Machine)),
//!   and [`Native`] (the [`Communicator`]);
//! - shared memory (`transport::shm`) for groups whose ranks all run on one host (every
//!   group collective and every send/recv goes through one segment; liveness and failure
//!   notices stay on the connections). `hier` fixes a group's path when it forms (one
//!   segment, hierarchical, or TCP) and runs the hierarchical groups: shared memory
//!   inside each host, TCP between the hosts' leaders.
//!
//! # Which algorithm
//!
//! `comm::algorithm` is the table. An all-reduce goes one-shot for small vectors, by
//! direct reduce-scatter + all-gather for middling ones, and over MLX's pipelined ring for
//! large ones (after a barrier, so that a mismatch is found before data moves); past four
//! ranks the small ones go by recursive doubling and the middling ones by
//! halving-doubling, in log2 P rounds. all_gather sends every block straight to its rank,
//! by recursive doubling past four ranks up to a MiB of output; sum_scatter sends every
//! block straight to its rank; barrier is a round of headers, by recursive doubling past
//! four ranks; send/recv go on the mesh connection to any peer. A broadcast goes straight
//! from the root when small, by scatter + all-gather when large; all_to_all sends every
//! block straight to its rank. See `protocol` for the order of combination, which makes
//! every result identical on every rank and from run to run.
//!
//! # A mismatch
//!
//! Up to four ranks, every rank sends its header to every peer in a group collective, and
//! reads each peer's header before that peer's data, so every rank whose call differs
//! from another rank's finds it, fails the collective with [`Error::Mismatch`] naming both
//! calls, and fails the group (closing its connections, so the others do not wait out
//! their timeout). Past four ranks the log-round algorithms compare calls with each
//! partner only: the ranks that meet the odd one find the mismatch, and the others fail
//! on the closed connections of those, naming a peer as lost (see `protocol`). A `send`
//! is not acknowledged (as on MLX's wire, so that two ranks may both send before they
//! receive): a mismatched `recv` fails at once and answers the sender, whose next call
//! that reads from the receiver (any group collective, a `recv`) fails with the same
//! mismatch (see `header`).

pub(crate) mod bootstrap;
pub(crate) mod hello;

use crate::transport::tcp::{self, Connections};

/// A formed native mesh, handed from the bootstrap to the data path.
///
/// `transport` holds the neighbours' connections as the MLX wire's ring does (connection
/// `i` to the left neighbour at index `i`, to the right one at `C + i`) and then one
/// connection to each rank that is not a neighbour, in increasing rank order (see
/// [`Connections::mesh`], [`Connections::send_conn`], [`Connections::recv_conn`]).
#[derive(Debug)]
pub(crate) struct Formed {
    /// Every connection, each of which completed the hello.
    pub(crate) transport: Connections,
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

pub(crate) mod header;
mod hier;
pub(crate) mod protocol;
#[cfg(test)]
mod shm_tests;
#[cfg(test)]
pub(crate) mod tests;
pub(crate) mod timed;
// The tests of broadcast and all_to_all.
#[cfg(test)]
mod bcast_tests;

use std::time::Duration;

use header::{Call, Header, Kind};
use hier::Path;
use protocol::{Caller, Exchange, Exchanging, Memory, Routes};

use crate::comm::Transport;
use crate::comm::algorithm::{self, Algorithm, AllGather, AllReduce, Barrier, Broadcast};
use crate::comm::progress::WaitPolicy;
use crate::comm::ring::protocol::{self as lanes, Buffers, Lane, Lanes, Topology};
use crate::comm::ring::staging::Staging;
use crate::comm::state::Guarded;
use crate::comm::trace;
use crate::comm::{Communicator, FlightOp};
use crate::element::DType;
use crate::error::{Error, Phase, Result};
use crate::options::Options;
use crate::reduce::ReduceOp;
use crate::transport::shm;
use crate::transport::tcp::Transfer;

impl Routes for Connections {
    fn send_conn(&self, peer: usize) -> usize {
        Connections::send_conn(self, peer)
    }

    fn recv_conn(&self, peer: usize) -> usize {
        Connections::recv_conn(self, peer)
    }
}

/// One rank's end of a formed native mesh (see the module docs).
#[derive(derive_more::Debug)]
pub(crate) struct Native {
    rank: usize,
    size: usize,
    timeout: Duration,
    /// For each rank, whether the group's collectives reach it through shared memory
    /// (what `transport` reports): every rank on a single-host segment, this host's ranks
    /// in a hierarchical group.
    #[debug(skip)]
    shared: Vec<bool>,
    /// Which way the group collectives go (the kind of `State::path`, which is fixed when
    /// the group forms), for [`Communicator::algorithm`], which must not take the lock.
    #[debug(skip)]
    route: Route,
    #[debug(skip)]
    state: Guarded<State>,
}

/// The kind of a group's [`Path`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    /// One shared-memory segment.
    Segment,
    /// Shared memory inside each host, TCP between hosts.
    Hierarchical,
    /// TCP between every pair.
    Tcp,
}

struct State {
    transport: Connections,
    /// How collectives on `transport` wait (the shared-memory link keeps its own).
    spin: WaitPolicy,
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
    /// Which way the group collectives go, fixed when the group forms: one shared-memory
    /// segment when every rank is on this host (send/recv too; liveness stays on the
    /// connections), shared memory inside each host and TCP between them when the ranks
    /// sit on several hosts, some with two ranks or more (broadcast, all_to_all and
    /// send/recv stay on TCP there), or TCP alone.
    path: Path,
}

/// What the tracing probes are told about `call` (the codes of [`trace::Traced`]).
fn traced(call: &Call) -> trace::Traced {
    let count = call.header.count;
    let phase = call.phase();
    match call.header.kind {
        Kind::AllReduce(op, dtype) => {
            trace::Traced::reduce(op, dtype, count as usize * dtype.size())
        }
        Kind::Barrier => trace::Traced::bytes(trace::Traced::BARRIER, phase, 0),
        Kind::AllGather => trace::Traced::bytes(trace::Traced::ALL_GATHER, phase, count as usize),
        Kind::SumScatter(dtype) => trace::Traced {
            dtype: trace::Traced::dtype(dtype),
            ..trace::Traced::bytes(
                trace::Traced::SUM_SCATTER,
                phase,
                count as usize * dtype.size(),
            )
        },
        Kind::Send if call.recv_from.is_some() => {
            trace::Traced::bytes(trace::Traced::RECV, phase, count as usize)
        }
        Kind::Send | Kind::Rejected => {
            trace::Traced::bytes(trace::Traced::SEND, phase, count as usize)
        }
        Kind::Broadcast(_) => trace::Traced::bytes(trace::Traced::BROADCAST, phase, count as usize),
        Kind::AllToAll => trace::Traced::bytes(trace::Traced::ALL_TO_ALL, phase, count as usize),
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
        let spin = WaitPolicy::for_local_ranks(options.spin, local_ranks);
        // Every rank sees every hello, so all decide alike (see `hier`).
        let hosts: Vec<[u8; 16]> = peers.iter().map(|p| p.host).collect();
        let path = hier::setup(
            &mut transport,
            (rank, &hosts),
            offered,
            &group,
            options.timeout,
            spin.clone(),
        )?;
        let links = match &path {
            Path::Flat(link) if link.locked() => "shared memory (locked)",
            Path::Flat(_) => "shared memory",
            Path::Hier(h) if h.locked() => {
                "shared memory (locked) inside this host, tcp between hosts"
            }
            Path::Hier(_) => "shared memory inside this host, tcp between hosts",
            Path::Tcp => "tcp",
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
        let (shared, route) = match &path {
            Path::Flat(_) => (vec![true; size], Route::Segment),
            Path::Hier(h) => (
                (0..size).map(|r| h.sharing().contains(&r)).collect(),
                Route::Hierarchical,
            ),
            Path::Tcp => (vec![false; size], Route::Tcp),
        };
        Ok(Native {
            rank,
            size,
            timeout: options.timeout,
            shared,
            route,
            state: Guarded::new(State {
                transport,
                spin,
                exchange: Exchange::default(),
                stage: Vec::new(),
                lanes: Vec::new(),
                ring_stage: None,
                seq: 0,
                sent: vec![0; size],
                sent_len: vec![0; size],
                received: vec![0; size],
                path,
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
            spin,
            exchange,
            stage,
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
            let result = run_exchange(
                transport,
                exchange,
                &mut mem,
                (self.timeout, spin),
                call.phase(),
                self.state.close_flag(),
            );
            if let Err(Error::Mismatch { call: mine, .. }) = &result
                && !mine.is_empty()
                && let Some(src) = call.recv_from
                && exchange.refused().is_some()
            {
                // Tell the sender, which is not waiting for an answer (see `header`): best
                // effort, before the group fails and closes.
                transport.assume_ready();
                let rejection = call.rejection().encode();
                let _ = transport.conn(transport.send_conn(src)).write(&rejection);
            }
            let result = result.map_err(|e| name_refused_send(sent, sent_len, e));
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
            path,
            sent,
            sent_len,
            ..
        } = state;
        let Path::Flat(link) = path else {
            return Err(Error::Bug {
                context: call.phase(),
                what: "a shared-memory run on a group whose path is not one segment".into(),
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
            transport, path, ..
        } = state;
        let Path::Hier(hier) = path else {
            return Err(Error::Bug {
                context: call.phase(),
                what: "a hierarchical run on a group whose path is not hierarchical".into(),
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
        let traced = traced(call);
        let ranks = self.size as u64;
        ffi::probes::collective(traced.op, traced.dtype, traced.bytes, ranks, collective)
    }

    /// Fails the group on a fatal error (telling the peers, as the ring does).
    fn settle(&self, transport: &mut Connections, result: Result<()>) -> Result<()> {
        // `Ok` is made afresh, a word, where passing `result` on copies all of it (the
        // size of `Error`): 13 instructions per small collective.
        let Err(error) = result else {
            return Ok(());
        };
        if error.is_fatal() {
            Err(tcp::fail(transport, &self.state, error))
        } else {
            Err(error)
        }
    }

    /// An all-reduce by `algorithm` (tests and measurements force one).
    fn all_reduce_by(
        &self,
        algorithm: AllReduce,
        op: ReduceOp,
        dtype: DType,
        data: &mut [u8],
    ) -> Result<()> {
        let mut state = self.state.lock()?;
        let state = &mut *state;
        let elems = data.len() / dtype.size();
        // The ring needs an element per rank (MLX pads fewer; the direct ones need not).
        let algorithm = match algorithm {
            AllReduce::Ring if elems < self.size => AllReduce::OneShot,
            algorithm => algorithm,
        };
        if algorithm == AllReduce::Ring
            && state.ring_stage.is_none()
            && matches!(state.path, Path::Tcp)
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
        match state.path {
            Path::Flat(_) => {
                return self.run_shm(state, &call, |link, watch| {
                    link.all_reduce(&call, (op, dtype), data, watch)
                });
            }
            Path::Hier(_) => {
                return self.run_hier(state, &call, |hier, watch| {
                    hier.all_reduce(&call, (op, dtype), data, watch)
                });
            }
            Path::Tcp => {}
        }
        if algorithm == AllReduce::Ring {
            return self.ring_all_reduce(state, &call, (op, dtype), data);
        }
        let caller = Caller::new(&state.transport, self.rank, self.size, &call);
        let len = data.len();
        state
            .exchange
            .all_reduce(caller, algorithm, (op, dtype), len);
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
        match state.path {
            Path::Flat(_) => {
                return self.run_shm(state, &call, |link, watch| {
                    link.broadcast(&call, data, root, watch)
                });
            }
            Path::Hier(_) => {
                // A hierarchical group compares calls through the hierarchy first, so that a
                // mismatch with a collective that runs through it fails every rank as one.
                self.run_hier(state, &call, |hier, watch| hier.barrier(&call, watch))?;
            }
            Path::Tcp => {}
        }
        let caller = Caller::new(&state.transport, self.rank, self.size, &call);
        let len = data.len();
        if direct {
            state.exchange.broadcast_direct(caller, root, len);
        } else {
            state.exchange.broadcast_scatter(caller, root, len);
        }
        self.run(state, &call, data, &[])
    }

    /// Plans a barrier over TCP by the table's row: the calls of every pair compared
    /// directly, or by recursive doubling (where a rank finishes only once every rank's
    /// header has reached it through its partners).
    fn plan_barrier(&self, state: &mut State, call: &Call) {
        let caller = Caller::new(&state.transport, self.rank, self.size, call);
        match algorithm::barrier(Transport::Tcp, self.size) {
            Barrier::Direct => state.exchange.headers(caller),
            Barrier::RecursiveDoubling => state.exchange.barrier_doubling(caller),
        }
    }

    /// A large all-reduce: a barrier (every rank's call checked, see
    /// [`Native::plan_barrier`]), then MLX's pipelined ring over the neighbour connections.
    fn ring_all_reduce(
        &self,
        state: &mut State,
        call: &Call,
        (op, dtype): (ReduceOp, DType),
        data: &mut [u8],
    ) -> Result<()> {
        self.plan_barrier(state, call);
        self.run(state, call, &mut [], &[])?;
        let topo = Topology {
            rank: self.rank,
            size: self.size,
            connections: state.transport.connections(),
        };
        let elems = data.len() / dtype.size();
        lanes::plan_all_reduce(&mut state.lanes, &topo, op, dtype, elems);
        let State {
            transport,
            spin,
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
        let result = tcp::engine::run(
            transport,
            &mut Lanes {
                lanes,
                bufs: &mut Buffers { data, input: &[] },
                stages: &mut ring_stage.lanes,
            },
            (self.timeout, spin),
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
fn name_refused_send(sent: &[u32], sent_len: &[u64], mut error: Error) -> Error {
    if let Error::Mismatch {
        seq,
        peer,
        ref mut call,
        ..
    } = error
        && call.is_empty()
    {
        *call = refused_send(sent, sent_len, seq, peer);
    }
    error
}

impl Communicator for Native {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn backend(&self) -> &'static str {
        "native"
    }

    /// Shared memory for the ranks whose collectives go through a segment (every rank
    /// when the group formed on one, this host's in a hierarchical group), TCP otherwise.
    fn transport(&self, peer: usize) -> Transport {
        if self.shared.get(peer).copied().unwrap_or(false) {
            Transport::SharedMemory
        } else {
            Transport::Tcp
        }
    }

    /// What the table (`comm::algorithm`) takes on this group's path: the choices
    /// `all_reduce`, `all_gather`, `barrier` and `broadcast` make below, by the same
    /// functions of the same arguments.
    fn algorithm(&self, op: FlightOp, dtype: Option<DType>, bytes: usize) -> Option<Algorithm> {
        let p = self.size;
        if p == 1 {
            return None;
        }
        Some(match (self.route, op) {
            (_, FlightOp::Send | FlightOp::Recv) => return None,
            (Route::Segment, FlightOp::AllReduce(_)) if algorithm::shm_one_shot(p, bytes) => {
                Algorithm::OneShot
            }
            (Route::Segment, FlightOp::AllReduce(_)) => Algorithm::ScatterGather,
            (Route::Segment, _) => Algorithm::Direct,
            // broadcast and all_to_all go over TCP after a barrier through the hierarchy.
            (
                Route::Hierarchical,
                FlightOp::AllReduce(_)
                | FlightOp::AllGather
                | FlightOp::SumScatter
                | FlightOp::Barrier,
            ) => Algorithm::Hierarchical,
            (_, FlightOp::Broadcast) => algorithm::broadcast(p, bytes).into(),
            (_, FlightOp::AllToAll | FlightOp::SumScatter) => Algorithm::Direct,
            (Route::Tcp, FlightOp::AllReduce(_)) => {
                let elems = bytes / dtype.map_or(1, DType::size);
                algorithm::all_reduce(Transport::Tcp, p, bytes, elems).into()
            }
            (Route::Tcp, FlightOp::AllGather) => {
                algorithm::all_gather(Transport::Tcp, p, bytes.saturating_mul(p)).into()
            }
            (Route::Tcp, FlightOp::Barrier) => algorithm::barrier(Transport::Tcp, p).into(),
        })
    }

    fn all_reduce(&self, op: ReduceOp, dtype: DType, data: &mut [u8]) -> Result<()> {
        // Only the TCP path reads the table's TCP row: shared memory and a hierarchical
        // group choose their own schedule, and ignore this one.
        let algorithm = match self.route {
            Route::Tcp => algorithm::all_reduce(
                Transport::Tcp,
                self.size,
                data.len(),
                data.len() / dtype.size(),
            ),
            Route::Segment | Route::Hierarchical => AllReduce::OneShot,
        };
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
        match state.path {
            Path::Flat(_) => {
                return self.run_shm(state, &call, |link, watch| {
                    link.gather(&call, shm::Gather::All, (input, output), watch)
                });
            }
            Path::Hier(_) => {
                return self.run_hier(state, &call, |hier, watch| {
                    hier.all_gather(&call, input, output, watch)
                });
            }
            Path::Tcp => {}
        }
        let caller = Caller::new(&state.transport, self.rank, self.size, &call);
        match algorithm::all_gather(Transport::Tcp, self.size, output.len()) {
            AllGather::Direct => state.exchange.all_gather(caller, nbytes),
            AllGather::RecursiveDoubling => state.exchange.all_gather_doubling(caller, nbytes),
        }
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
        match state.path {
            Path::Flat(_) => {
                return self.run_shm(state, &call, |link, watch| {
                    link.sum_scatter(&call, dtype, input, output, watch)
                });
            }
            Path::Hier(_) => {
                return self.run_hier(state, &call, |hier, watch| {
                    hier.sum_scatter(&call, dtype, input, output, watch)
                });
            }
            Path::Tcp => {}
        }
        state.exchange.sum_scatter(
            Caller::new(&state.transport, self.rank, self.size, &call),
            dtype,
            chunk,
        );
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
        match state.path {
            Path::Flat(_) => {
                return self.run_shm(state, &call, |link, watch| {
                    link.send(&call, data, dst, watch)
                });
            }
            // send/recv stay on TCP in a hierarchical group.
            Path::Hier(_) | Path::Tcp => {}
        }
        state.exchange.send(
            Caller::new(&state.transport, self.rank, self.size, &call),
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
        match state.path {
            Path::Flat(_) => {
                return self.run_shm(state, &call, |link, watch| {
                    link.recv(&call, data, src, watch)
                });
            }
            // send/recv stay on TCP in a hierarchical group.
            Path::Hier(_) | Path::Tcp => {}
        }
        let len = data.len();
        state.exchange.recv(
            Caller::new(&state.transport, self.rank, self.size, &call),
            src,
            len,
        );
        self.run(state, &call, data, &[])
    }

    fn barrier(&self) -> Result<()> {
        let mut state = self.state.lock()?;
        let state = &mut *state;
        let call = Self::group_call(state, Kind::Barrier, 0);
        if self.size == 1 {
            return Ok(());
        }
        match state.path {
            Path::Flat(_) => {
                return self.run_shm(state, &call, |link, watch| link.barrier(&call, watch));
            }
            Path::Hier(_) => {
                return self.run_hier(state, &call, |hier, watch| hier.barrier(&call, watch));
            }
            Path::Tcp => {}
        }
        self.plan_barrier(state, &call);
        self.run(state, &call, &mut [], &[])
    }

    // broadcast and all_to_all.

    fn broadcast(&self, data: &mut [u8], root: usize) -> Result<()> {
        let direct = algorithm::broadcast(self.size, data.len()) == Broadcast::Direct;
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
        match state.path {
            Path::Flat(_) => {
                return self.run_shm(state, &call, |link, watch| {
                    link.gather(&call, shm::Gather::ToAll, (input, output), watch)
                });
            }
            Path::Hier(_) => {
                // As broadcast's: calls compared through the hierarchy first.
                self.run_hier(state, &call, |hier, watch| hier.barrier(&call, watch))?;
            }
            Path::Tcp => {}
        }
        state.exchange.all_to_all(
            Caller::new(&state.transport, self.rank, self.size, &call),
            block,
        );
        self.run(state, &call, output, input)
    }

    fn close(&self) -> Result<()> {
        self.state.close(|state| {
            state.transport.close();
            state.stage = Vec::new();
            state.lanes = Vec::new();
            state.ring_stage = None;
            state.path = Path::Tcp;
        });
        Ok(())
    }

    fn is_closed(&self) -> bool {
        self.state.is_closed()
    }

    /// As the ring's: probes every connection when no collective runs, and otherwise
    /// reports only what the group already knows.
    fn health(&self) -> Result<()> {
        tcp::health(&self.state, |state| &mut state.transport)
    }
}

/// Drives `exchange` over `transport` until it is finished (see [`tcp::engine::run`]).
///
/// A header that differs from this rank's call ends it with [`Error::Mismatch`], also when
/// the connection failed first but the peer's header is still there to read: a peer that
/// found a mismatch closes at once, and the header it sent before explains the failure
/// better than the close does.
pub(crate) fn run_exchange(
    transport: &mut Connections,
    exchange: &mut Exchange,
    mem: &mut Memory<'_>,
    (timeout, spin): (std::time::Duration, &mut WaitPolicy),
    context: Phase,
    closed: &crate::comm::state::CloseFlag,
) -> Result<()> {
    let result = tcp::engine::run(
        transport,
        &mut Exchanging {
            exchange: &mut *exchange,
            mem: &mut *mem,
        },
        (timeout, spin),
        context,
        closed,
    );
    match result {
        Err(error @ (Error::Closed { .. } | Error::Io { .. } | Error::Lost { .. })) => {
            Err(last_look(transport, exchange, mem).unwrap_or(error))
        }
        result => result,
    }
}

/// How long a collective that failed on a closed or broken connection still looks for
/// headers it has not read: a peer that found a mismatch closes at once, and the header
/// it sent before explains the failure better than the close does.
const LAST_LOOK: std::time::Duration = std::time::Duration::from_millis(50);

/// Reads, for a short while, the headers of this round that have not arrived, and returns
/// the first one that does not match this rank's call (see [`LAST_LOOK`]).
fn last_look(
    transport: &mut Connections,
    exchange: &mut Exchange,
    mem: &mut Memory<'_>,
) -> Option<Error> {
    let until = std::time::Instant::now() + LAST_LOOK;
    loop {
        let mut waiting = false;
        transport.assume_ready();
        for i in 0..exchange.ins() {
            while exchange.header_pending(i) {
                let Some((index, target)) = exchange.poll_receive(i, mem) else {
                    break;
                };
                match transport.conn(index).read(target) {
                    Ok(Transfer::Moved(n)) => {
                        if let Err(error) = exchange.handle_received(i, n, mem) {
                            return Some(error);
                        }
                    }
                    Ok(Transfer::Blocked) => {
                        waiting = true;
                        break;
                    }
                    Ok(Transfer::Closed) | Err(_) => break,
                }
            }
        }
        if !waiting || std::time::Instant::now() >= until || transport.wait(until, None).is_err() {
            return None;
        }
    }
}
