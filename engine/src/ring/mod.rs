//! MLX's TCP ring backend, byte-compatible with `mx.distributed`'s ring.
//!
//! - [`bootstrap`]: forming the ring's connections (the TCP bootstrap skeleton with MLX's
//!   handshake: none, or the keyed one of [`crate::auth`]);
//! - MLX's schedule and the lanes that walk it are [`crate::comm::ring`]'s (the native
//!   wire runs them too); the connections, their driver and the engine that moves the
//!   lanes' bytes are TCP's ([`crate::transport::tcp`]).
//!
//! [`Ring`] ties them together behind [`Communicator`]. A group's state sits behind one
//! mutex: collectives are serialised (every rank must issue them in the same order
//! anyway), and the thread holding the lock drives the event loop for the duration of its
//! collective.

pub(crate) mod bootstrap;

use std::time::Duration;

use crate::comm::progress::WaitPolicy;
use crate::comm::ring::{protocol, schedule, staging};
use protocol::{Buffers, Lane, Lanes, Topology, Work};
use schedule::SMALL_PAD_BYTES;
use staging::Staging;

use crate::comm::Communicator;
use crate::comm::neighbours::Neighbours;
use crate::comm::state::Guarded;
use crate::comm::trace::Traced;
use crate::config::hostfile::RingAddresses;
use crate::element::DType;
use crate::error::{Error, Phase, Result};
use crate::options::Options;
use crate::reduce::ReduceOp;
use crate::transport::tcp::{self, Connections};
use zerocopy::IntoBytes;

/// Bytes per step of the ring's broadcast (a schedule of this crate): small enough that
/// the pipeline fills quickly, large enough that a step's fixed cost is small beside its
/// bytes. MLX's `min_send_size`, below which MLX does not split a collective either.
const RING_BROADCAST_CHUNK: usize = schedule::MIN_SEND_SIZE;

/// One rank's end of a formed ring.
#[derive(derive_more::Debug)]
pub(crate) struct Ring {
    rank: usize,
    size: usize,
    timeout: Duration,
    #[debug(skip)]
    state: Guarded<State>,
}

struct State {
    transport: Connections,
    /// How collectives on `transport` wait.
    spin: WaitPolicy,
    staging: Staging,
    /// The lanes of the collective in flight; kept so their storage is reused.
    lanes: Vec<Lane>,
}

impl Ring {
    /// Forms the ring described by `addrs` (at least two ranks), waiting at most
    /// `options.timeout` for the neighbours.
    pub(crate) fn connect(addrs: &RingAddresses, options: &Options) -> Result<Ring> {
        // The native wire is another communicator (`crate::native`); `backend` chooses.
        debug_assert_ne!(options.backend, crate::options::Backend::Native);
        let timeout = options.timeout;
        let mut transport = bootstrap::connect(addrs, options)?;
        let staging = Staging::new(transport.connections())?;
        // The lane planners number connections as the transport does.
        let topo = Topology {
            rank: addrs.rank,
            size: addrs.size,
            connections: transport.connections(),
        };
        debug_assert!(
            (0..topo.connections).all(|i| transport.left(i) == topo.left(i)
                && transport.right(i) == topo.right(i)
                && transport.conns()[topo.left(i)].peer == topo.neighbours().left()
                && transport.conns()[topo.right(i)].peer == topo.neighbours().right())
        );
        // A close from another thread wakes a collective blocked on the poller. Should the
        // wake-up fail, the collective still sees the flag at its next event or deadline.
        let waker = transport.waker();
        Ok(Ring {
            rank: addrs.rank,
            size: addrs.size,
            timeout,
            state: Guarded::new(State {
                transport,
                spin: WaitPolicy::for_local_ranks(options.spin, addrs.local_ranks),
                staging,
                lanes: Vec::new(),
            })
            .on_close(move || {
                let _ = waker.wake();
            }),
        })
    }

    fn neighbours(&self) -> Neighbours {
        Neighbours::new(self.rank, self.size)
    }

    /// The group's state, or the error that failed it.
    fn lock(&self) -> Result<std::sync::MutexGuard<'_, State>> {
        self.state.lock()
    }

    /// Runs the lanes in `state.lanes` over `bufs`; a transport error fails the group.
    /// `traced` describes the collective to the tracing probes.
    fn run(&self, state: &mut State, bufs: &mut Buffers<'_>, traced: Traced) -> Result<()> {
        self.traced(traced, || self.run_lanes(state, bufs, traced.context))
    }

    /// Runs the lanes in `state.lanes` over `bufs`, without a tracing probe of its own (the
    /// caller's collective has one); a transport error fails the group.
    fn run_lanes(&self, state: &mut State, bufs: &mut Buffers<'_>, context: Phase) -> Result<()> {
        let State {
            transport,
            spin,
            staging,
            lanes,
        } = state;
        let mut machine = Lanes {
            lanes,
            bufs,
            stages: &mut staging.lanes,
        };
        self.drive((transport, spin), &mut machine, context)
    }

    /// Runs `machine` over `transport` to its end; a fatal error fails the group.
    fn drive(
        &self,
        (transport, spin): (&mut Connections, &mut WaitPolicy),
        machine: &mut Lanes<'_, '_>,
        context: Phase,
    ) -> Result<()> {
        let bounds = (self.timeout, spin);
        match tcp::engine::run(transport, machine, bounds, context, self.state.close_flag()) {
            Err(error) if error.is_fatal() => Err(tcp::fail(transport, &self.state, error)),
            result => result,
        }
    }

    /// A send to (`Work::Send`, of `bufs.input`) or receive from (`Work::Recv`, into
    /// `bufs.data`) neighbour `peer`, striped over the connections from the first one MLX
    /// uses for it.
    fn point_to_point(
        &self,
        work: Work,
        peer: usize,
        bufs: &mut Buffers<'_>,
        traced: Traced,
    ) -> Result<()> {
        let mut state = self.lock()?;
        let state = &mut *state;
        let topo = self.topology(state);
        let sending = matches!(work, Work::Send);
        let (first, len) = if sending {
            (topo.send_first(peer), bufs.input.len())
        } else {
            (topo.recv_first(peer), bufs.data.len())
        };
        let Some(first) = first else {
            let what = if sending { "send to" } else { "receive from" };
            return Err(self.not_a_neighbour(what, peer));
        };
        protocol::plan_stripes(&mut state.lanes, &topo, work, first, len);
        self.run(state, bufs, traced)
    }

    /// The ring as the lane planners see it.
    fn topology(&self, state: &State) -> Topology {
        Topology {
            rank: self.rank,
            size: self.size,
            connections: state.transport.connections(),
        }
    }
}

impl Communicator for Ring {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn backend(&self) -> &'static str {
        "ring"
    }

    /// MLX's wire runs over TCP only.
    fn transport(&self, _peer: usize) -> crate::comm::Transport {
        crate::comm::Transport::Tcp
    }

    /// MLX's ring for every collective (fewer elements than ranks padded to one per rank,
    /// as MLX does; the barrier an all-reduce of one element), and this crate's schedules
    /// over the same ring for broadcast and all_to_all.
    fn algorithm(
        &self,
        op: crate::comm::FlightOp,
        _dtype: Option<DType>,
        _bytes: usize,
    ) -> Option<crate::comm::algorithm::Algorithm> {
        use crate::comm::FlightOp;
        match op {
            _ if self.size == 1 => None,
            FlightOp::Send | FlightOp::Recv => None,
            _ => Some(crate::comm::algorithm::Algorithm::Ring),
        }
    }

    fn all_reduce(&self, op: ReduceOp, dtype: DType, data: &mut [u8]) -> Result<()> {
        let code = Traced::reduce(op, dtype, 0).op;
        self.reduce(op, dtype, data, code)
    }

    fn all_gather(&self, input: &[u8], output: &mut [u8]) -> Result<()> {
        const CONTEXT: Phase = Phase::AllGather;
        let nbytes = input.len();
        debug_assert_eq!(output.len(), nbytes * self.size, "Group checks the lengths");
        let mut state = self.lock()?;
        let state = &mut *state;
        // Our own block is copied in locally; the ring fills the others.
        output[self.rank * nbytes..(self.rank + 1) * nbytes].copy_from_slice(input);
        let topo = self.topology(state);
        protocol::plan_all_gather(&mut state.lanes, &topo, nbytes);
        self.run(
            state,
            &mut Buffers {
                data: output,
                input: &[],
            },
            Traced::bytes(Traced::ALL_GATHER, CONTEXT, nbytes),
        )
    }

    fn sum_scatter(&self, dtype: DType, input: &[u8], output: &mut [u8]) -> Result<()> {
        const CONTEXT: Phase = Phase::SumScatter;
        let chunk = output.len();
        let esize = dtype.size();
        debug_assert!(
            input.len() == chunk * self.size && chunk.is_multiple_of(esize),
            "Group checks the lengths"
        );
        let mut state = self.lock()?;
        let state = &mut *state;
        let topo = self.topology(state);
        let piece = protocol::plan_sum_scatter(&mut state.lanes, &topo, dtype, chunk);
        // Before any byte moves: a mapping failure here is local and leaves the group usable.
        state.staging.reserve(piece)?;
        self.run(
            state,
            &mut Buffers {
                data: output,
                input,
            },
            Traced {
                op: Traced::SUM_SCATTER,
                dtype: Traced::dtype(dtype),
                bytes: input.len() as u64,
                context: CONTEXT,
            },
        )
    }

    fn send(&self, data: &[u8], dst: usize) -> Result<()> {
        let traced = Traced::bytes(Traced::SEND, Phase::Send, data.len());
        let bufs = &mut Buffers {
            data: &mut [],
            input: data,
        };
        self.point_to_point(Work::Send, dst, bufs, traced)
    }

    fn recv(&self, data: &mut [u8], src: usize) -> Result<()> {
        let traced = Traced::bytes(Traced::RECV, Phase::Recv, data.len());
        self.point_to_point(Work::Recv, src, &mut Buffers { data, input: &[] }, traced)
    }

    fn barrier(&self) -> Result<()> {
        // An all_sum of one f32 zero: what `mx.eval(mx.distributed.all_sum(mx.zeros(1)))`
        // sends, so a barrier also lines up with MLX ranks doing that.
        // The probes see it as a barrier (op 7), as the tracing docs say.
        self.reduce(ReduceOp::Sum, DType::F32, &mut [0u8; 4], Traced::BARRIER)
    }

    // broadcast and all_to_all, this crate's schedules over the ring (see
    // `Ring::shift`); MLX ranks cannot take part.

    fn broadcast(&self, data: &mut [u8], root: usize) -> Result<()> {
        let traced = Traced::bytes(Traced::BROADCAST, Phase::Broadcast, data.len());
        let mut state = self.lock()?;
        self.traced(traced, || self.ring_broadcast(&mut state, data, root))
    }

    fn all_to_all(&self, input: &[u8], output: &mut [u8]) -> Result<()> {
        let traced = Traced::bytes(Traced::ALL_TO_ALL, Phase::AllToAll, input.len());
        let mut state = self.lock()?;
        self.traced(traced, || self.ring_all_to_all(&mut state, input, output))
    }

    fn close(&self) -> Result<()> {
        self.state.close(|state| {
            state.transport.close();
            state.staging.lanes.clear();
            state.lanes = Vec::new();
        });
        Ok(())
    }

    fn is_closed(&self) -> bool {
        self.state.is_closed()
    }

    /// Probes the connections when no collective runs (see [`tcp::health`]).
    fn health(&self) -> Result<()> {
        tcp::health(&self.state, |state| &mut state.transport)
    }
}

impl Ring {
    /// An all-reduce, which the probes see as the collective `code` (a reduction or a
    /// barrier).
    fn reduce(&self, op: ReduceOp, dtype: DType, data: &mut [u8], code: u8) -> Result<()> {
        let context = op.phase();
        let esize = dtype.size();
        debug_assert!(
            data.len().is_multiple_of(esize),
            "Group checks whole elements"
        );
        let elems = data.len() / esize;
        if elems >= self.size {
            let mut state = self.lock()?;
            let topo = self.topology(&state);
            protocol::plan_all_reduce(&mut state.lanes, &topo, op, dtype, elems);
            let traced = Traced {
                op: code,
                ..Traced::reduce(op, dtype, data.len())
            };
            return self.run(&mut state, &mut Buffers { data, input: &[] }, traced);
        }

        // Fewer elements than ranks: MLX pads them with zeros to exactly one element per rank
        // and reduces that on connection pair 0 in direction -1.
        let padded = self.size * esize;
        if padded > SMALL_PAD_BYTES {
            return Err(Error::invalid(format!(
                "{context}: {elems} {dtype} elements cannot be reduced by a ring of {} ranks: \
                 MLX pads fewer elements than ranks to one per rank, at most {SMALL_PAD_BYTES} \
                 bytes",
                self.size
            )));
        }
        // u64s, so the pad is aligned for every element type.
        let mut words = [0u64; SMALL_PAD_BYTES / 8];
        let pad = &mut words.as_mut_bytes()[..padded];
        pad[..data.len()].copy_from_slice(data);
        let mut state = self.lock()?;
        let state = &mut *state;
        let topo = self.topology(state);
        protocol::plan_all_reduce(&mut state.lanes, &topo, op, dtype, elems);
        self.run(
            state,
            &mut Buffers {
                data: pad,
                input: &[],
            },
            Traced {
                op: code,
                ..Traced::reduce(op, dtype, data.len())
            },
        )?;
        data.copy_from_slice(&pad[..data.len()]);
        Ok(())
    }

    /// Runs `body` between the probes of one collective `traced` (the ring's broadcast and
    /// all_to_all take several steps, each a run of the engine, and show as one).
    fn traced(&self, traced: Traced, body: impl FnOnce() -> Result<()>) -> Result<()> {
        let ranks = self.size as u64;
        ffi::probes::collective(traced.op, traced.dtype, traced.bytes, ranks, body)
    }

    /// One step of this crate's ring schedules: sends `data[send]` to the right neighbour
    /// while receiving `data[recv]` from the left one (`send` ends at or before `recv`
    /// starts; either may be empty). A transport error fails the group.
    ///
    /// MLX ranks cannot take part: MLX has no broadcast or all_to_all, so an MLX rank in
    /// the ring would be in some other collective, read these bytes as that one's, and it
    /// or its neighbours would fail or wait out their timeout.
    fn shift(
        &self,
        state: &mut State,
        data: &mut [u8],
        send: std::ops::Range<usize>,
        recv: std::ops::Range<usize>,
        context: Phase,
    ) -> Result<()> {
        if recv.is_empty() {
            return self.shift_apart(state, &data[send], &mut [], context);
        }
        let (low, high) = data.split_at_mut(recv.start);
        let output = &mut high[..recv.len()];
        self.shift_apart(state, &low[send], output, context)
    }

    /// [`Ring::shift`] from and into separate buffers.
    fn shift_apart(
        &self,
        state: &mut State,
        input: &[u8],
        output: &mut [u8],
        context: Phase,
    ) -> Result<()> {
        if input.is_empty() && output.is_empty() {
            return Ok(());
        }
        let topo = self.topology(state);
        protocol::plan_shift(&mut state.lanes, &topo, input.len(), output.len());
        let mut bufs = Buffers {
            data: output,
            input,
        };
        self.run_lanes(state, &mut bufs, context)
    }

    /// A broadcast pipelined rightwards around the ring from `root`, in chunks of
    /// [`RING_BROADCAST_CHUNK`]: the rank `d` places after the root receives chunk `c` at
    /// step `c + d - 1` and forwards it at step `c + d`, while it receives chunk `c + 1`;
    /// the rank before the root only receives. Each rank moves the array in once and out
    /// once, and the last chunk arrives `P - 2` steps after the root sent it.
    fn ring_broadcast(&self, state: &mut State, data: &mut [u8], root: usize) -> Result<()> {
        let p = self.size;
        let d = (self.rank + p - root) % p;
        let len = data.len();
        let chunks = len.div_ceil(RING_BROADCAST_CHUNK);
        let chunk = |c: usize| {
            (c * RING_BROADCAST_CHUNK).min(len)..((c + 1) * RING_BROADCAST_CHUNK).min(len)
        };
        let none = 0..0;
        for step in 0..(chunks + p).saturating_sub(2) {
            // Chunk `step - d` goes out (not from the last rank), chunk `step - d + 1`
            // comes in (not to the root).
            let send = match step.checked_sub(d) {
                Some(c) if c < chunks && d + 1 < p => chunk(c),
                _ => none.clone(),
            };
            let recv = match (step + 1).checked_sub(d) {
                Some(c) if c < chunks && d > 0 => chunk(c),
                _ => none.clone(),
            };
            self.shift(state, data, send, recv, Phase::Broadcast)?;
        }
        Ok(())
    }

    /// An all_to_all in `P - 1` steps around the ring: at step `h` every rank sends its
    /// right neighbour the `P - h` blocks it holds for the ranks after it (its own at step
    /// 1, then what it received), and keeps the first block it receives, which rank
    /// `rank - h` sent to it. Each link carries `P (P - 1) / 2` blocks; two scratch buffers
    /// of `P - 1` blocks are allocated per call.
    fn ring_all_to_all(&self, state: &mut State, input: &[u8], output: &mut [u8]) -> Result<()> {
        let (p, me) = (self.size, self.rank);
        let block = input.len() / p;
        let at = |r: usize| r * block..(r + 1) * block;
        output[at(me)].copy_from_slice(&input[at(me)]);
        if block == 0 {
            return Ok(());
        }
        // The blocks for ranks `me + 1`, `me + 2`, ... in the order they leave.
        let mut outgoing: Vec<u8> = (1..p)
            .flat_map(|k| &input[at((me + k) % p)])
            .copied()
            .collect();
        let mut incoming = vec![0u8; outgoing.len()];
        for h in 1..p {
            let n = (p - h) * block;
            self.shift_apart(state, &outgoing[..n], &mut incoming[..n], Phase::AllToAll)?;
            output[at((me + p - h) % p)].copy_from_slice(&incoming[..block]);
            outgoing[..n - block].copy_from_slice(&incoming[block..n]);
        }
        Ok(())
    }

    fn not_a_neighbour(&self, what: &str, peer: usize) -> Error {
        self.neighbours()
            .refusal(what, peer, "the ring backend", ", as MLX's ring does")
    }
}
