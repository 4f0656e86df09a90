//! A formed JACCL group: set-up over the side channel, then every collective as MLX 0.32.1
//! runs it, on any [`Fabric`], driven by the RDMA [`engine`].
//!
//! Set-up follows MLX's order: the side channel is joined first (by the caller), the fabric
//! opens its devices, creates a protection domain, completion queue and queue pair per
//! connection, registers its buffers and moves the queue pairs to INIT (also the caller);
//! then this module gathers every connection's [`Destination`], exchanges them, connects each
//! queue pair to its peer's (RTR, RTS) and passes the side channel's barrier. After that the
//! side channel is only watched.
//!
//! A group's state sits behind one mutex: collectives are serialised (every rank must issue
//! them in the same order anyway), and the thread holding the lock drives the fabric for the
//! duration of its collective. A transport error fails the group: the error is kept and
//! returned, wrapped, by every later call; the side channel carries a failure notice to the
//! other nuvec ranks and is closed.

use std::sync::MutexGuard;
use std::time::Duration;

use memmap2::MmapMut;

use super::bootstrap::{self, Records, SideChannel};
use super::buffers::{BufferPlan, Mem};
use super::config::{MLX_ALL_GATHER_VAR, MlxAllGather};
use super::frames::{CQ_ENTRIES, MESH_MAX_RANKS, PIPELINE, RING_MAX_CONNECTIONS, SizeClasses};
use super::machine::{Algorithm, Counted};
use super::{mesh, ring};
use crate::comm::Communicator;
use crate::comm::algorithm;
use crate::comm::neighbours::Neighbours;
use crate::comm::progress::{Activity, Spin, WaitPolicy};
use crate::comm::state::Guarded;
use crate::comm::trace::Traced;
use crate::element::DType;
use crate::error::{Error, PeerOp, Phase, Result};
use crate::reduce::ReduceOp;
use crate::transport::rdma::engine::{self, Cx, Liveness, Machine, Scratch};
use crate::transport::rdma::fabric::{Destination, Fabric};
use crate::verbose::verbose;

/// How a group's connections are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// One connection per peer; connection `p` leads to rank `p`.
    Mesh,
    /// `wires` connections to each neighbour.
    Ring {
        /// Wires per neighbour.
        wires: usize,
    },
}

impl Kind {
    /// The peer rank of each connection of rank `rank` in a group of `size`.
    pub(crate) fn peers(self, rank: usize, size: usize) -> Vec<usize> {
        match self {
            Kind::Mesh => (0..size).collect(),
            Kind::Ring { wires } => {
                let n = Neighbours::new(rank, size);
                let (left, right) = (n.left(), n.right());
                (0..2 * wires)
                    .map(|c| if c < wires { left } else { right })
                    .collect()
            }
        }
    }

    /// Whether connection `conn` exists for rank `rank`.
    pub(crate) fn present(self, rank: usize, size: usize) -> Vec<bool> {
        match self {
            Kind::Mesh => (0..size).map(|p| p != rank).collect(),
            Kind::Ring { wires } => vec![true; 2 * wires],
        }
    }

    /// The buffers of rank `rank`.
    pub(crate) fn plan(self, rank: usize, size: usize, classes: SizeClasses) -> BufferPlan {
        match self {
            Kind::Mesh => BufferPlan::mesh(rank, size, classes),
            Kind::Ring { wires } => BufferPlan::ring(wires, classes),
        }
    }
}

struct State<F> {
    /// The queue pairs and registered buffers; `None` once the group is closed, so that
    /// their (scarce: Apple allows about ten queue pairs per device) resources return.
    fabric: Option<F>,
    side: SideChannel,
    plan: BufferPlan,
    staging: MmapMut,
    activity: Activity,
    /// How collectives wait: the set-up's spin, fixed.
    spin: WaitPolicy,
    /// Storage reused by every collective, so that none allocates once warm (as the TCP
    /// ring keeps its lanes): the engine's, and the ring's machines.
    scratch: Scratch,
    wires: Vec<Counted<ring::Wire>>,
    scatter: Vec<Counted<ring::ScatterWire>>,
    stripes: Vec<Counted<ring::Stripe>>,
}

/// One rank's end of a JACCL group over fabric `F`.
#[derive(derive_more::Debug)]
pub(crate) struct Jaccl<F> {
    rank: usize,
    size: usize,
    kind: Kind,
    classes: SizeClasses,
    timeout: Duration,
    #[debug(skip)]
    peers: Vec<usize>,
    /// The ranks whose set-up records carry no nuvec mark: MLX's (see `bootstrap`).
    #[debug(skip)]
    mlx_ranks: Vec<usize>,
    #[debug(skip)]
    mlx_all_gather: MlxAllGather,
    #[debug(skip)]
    state: Guarded<State<F>>,
}

impl Liveness for SideChannel {
    fn check(&mut self, context: Phase, needed: &dyn Fn(usize) -> bool) -> Result<()> {
        self.check_needed(context, needed)
    }

    fn sleep(&mut self, wait: Duration) {
        SideChannel::sleep(self, wait)
    }
}

/// What the group set-up needs besides the fabric.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Setup {
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) kind: Kind,
    pub(crate) classes: SizeClasses,
    pub(crate) timeout: Duration,
    pub(crate) spin: Spin,
    /// Which all_gather the group's MLX ranks run, as the configuration declares.
    pub(crate) mlx_all_gather: MlxAllGather,
    /// How this rank encodes its set-up records: always nuvec's, except in tests that play
    /// an MLX rank.
    pub(crate) records: Records,
}

impl<F: Fabric> Jaccl<F> {
    /// Connects `fabric`'s queue pairs to the peers' through `side` and returns the group.
    ///
    /// # Errors
    ///
    /// A side-channel failure or timeout (naming the peer), a peer publishing no queue pair
    /// towards this rank, or a queue pair that cannot be connected (naming its peer).
    pub(crate) fn form(
        setup: Setup,
        mut side: SideChannel,
        mut fabric: F,
        plan: BufferPlan,
    ) -> Result<Jaccl<F>> {
        let Setup {
            rank, size, kind, ..
        } = setup;
        // The machines keep per-peer state in fixed arrays; the configuration already holds
        // these limits, this only keeps a group formed some other way from panicking later.
        let too_big = match kind {
            Kind::Mesh => size > MESH_MAX_RANKS,
            Kind::Ring { wires } => wires > RING_MAX_CONNECTIONS,
        };
        if too_big {
            return Err(Error::invalid(format!(
                "a JACCL {kind:?} of {size} ranks exceeds MLX's limits ({MESH_MAX_RANKS} ranks \
                 in a mesh, {RING_MAX_CONNECTIONS} wires per neighbour in a ring)"
            )));
        }
        let peers = kind.peers(rank, size);
        let present = kind.present(rank, size);
        let setup_error = |conn: usize, reason: String| Error::Rdma {
            peer: peers[conn],
            op: PeerOp::Connect,
            context: bootstrap::SETUP,
            reason,
        };
        let local = |fabric: &mut F, conn: usize| -> Result<Destination> {
            if present[conn] {
                fabric.local(conn).map_err(|r| setup_error(conn, r))
            } else {
                Ok(Destination::ABSENT)
            }
        };
        let how = setup.records;
        let nuvec = match kind {
            Kind::Mesh => {
                let mine = (0..size)
                    .map(|c| local(&mut fabric, c))
                    .collect::<Result<Vec<_>>>()?;
                let gathered = side.all_gather_records(&mine, how)?;
                let all = &gathered.records;
                for p in (0..size).filter(|&p| p != rank) {
                    let remote = all[p].get(rank).filter(|d| d.is_present()).ok_or_else(|| {
                        setup_error(
                            p,
                            format!(
                                "rank {p} published no queue pair towards rank {rank} (its \
                                 device file differs, or it formed a ring)"
                            ),
                        )
                    })?;
                    fabric.connect(p, remote).map_err(|r| setup_error(p, r))?;
                }
                gathered.nuvec
            }
            Kind::Ring { wires } => {
                let left_info = (0..wires)
                    .map(|w| local(&mut fabric, w))
                    .collect::<Result<Vec<_>>>()?;
                let right_info = (0..wires)
                    .map(|w| local(&mut fabric, wires + w))
                    .collect::<Result<Vec<_>>>()?;
                let left_gathered = side.all_gather_records(&left_info, how)?;
                let right_gathered = side.all_gather_records(&right_info, how)?;
                let (all_left, all_right) = (&left_gathered.records, &right_gathered.records);
                let n = Neighbours::new(rank, size);
                let (left, right) = (n.left(), n.right());
                let mismatch = |conn: usize, peer: usize, theirs: usize| {
                    setup_error(
                        conn,
                        format!(
                            "rank {peer} has {theirs} wire(s) towards its neighbours but rank \
                             {rank} has {wires}: the device files differ, or it formed a mesh"
                        ),
                    )
                };
                if all_right[left].len() != wires {
                    return Err(mismatch(0, left, all_right[left].len()));
                }
                if all_left[right].len() != wires {
                    return Err(mismatch(wires, right, all_left[right].len()));
                }
                for w in 0..wires {
                    // Our left wire w meets the left neighbour's right wire w, and vice versa.
                    fabric
                        .connect(w, &all_right[left][w])
                        .map_err(|r| setup_error(w, r))?;
                    fabric
                        .connect(wires + w, &all_left[right][w])
                        .map_err(|r| setup_error(wires + w, r))?;
                }
                (left_gathered.nuvec.iter())
                    .zip(&right_gathered.nuvec)
                    .map(|(l, r)| *l && *r)
                    .collect()
            }
        };
        // This rank is nuvec's whatever its records say (tests make it publish MLX's).
        let mlx_ranks: Vec<usize> = (0..size).filter(|&r| r != rank && !nuvec[r]).collect();
        if !mlx_ranks.is_empty() {
            verbose!(
                info: rank,
                "rank(s) {} published set-up records without the nuvec mark: MLX ranks",
                list(&mlx_ranks)
            );
        }
        side.barrier()?;
        side.start_watching()?;
        let largest = setup.classes.used().last().map_or(0, |c| c.bytes());
        let staging = memmap2::MmapOptions::new()
            .len((PIPELINE * largest).max(1))
            .map_anon()
            .map_err(|e| Error::local("mapping JACCL's staging memory", e))?;
        let conns = peers.len();
        Ok(Jaccl {
            rank,
            size,
            kind,
            classes: setup.classes,
            timeout: setup.timeout,
            peers,
            mlx_ranks,
            mlx_all_gather: setup.mlx_all_gather,
            state: Guarded::new(State {
                fabric: Some(fabric),
                side,
                plan,
                staging,
                activity: Activity::default(),
                spin: WaitPolicy::fixed(setup.spin),
                scratch: Scratch::new(conns, CQ_ENTRIES as usize),
                wires: Vec::new(),
                scatter: Vec::new(),
                stripes: Vec::new(),
            }),
        })
    }

    fn lock(&self) -> Result<MutexGuard<'_, State<F>>> {
        self.state.lock()
    }

    /// Runs `machines` over `data` (and `input`, where it is separate); a transport error
    /// fails the group.
    fn run<M: for<'m> Machine<Mem<'m>>>(
        &self,
        state: &mut State<F>,
        machines: &mut [M],
        (data, input): (&mut [u8], Option<&[u8]>),
        context: Phase,
    ) -> Result<()> {
        let State {
            fabric,
            side,
            plan,
            staging,
            activity,
            spin,
            scratch,
            ..
        } = state;
        let Some(fabric) = fabric.as_mut() else {
            return Err(Error::GroupClosed);
        };
        let mut cx = Cx::new(fabric, &self.peers, context, activity);
        let mut mem = Mem {
            data,
            input,
            plan,
            staging,
        };
        let result = engine::run(
            &mut cx,
            &mut mem,
            machines,
            side,
            self.timeout,
            spin,
            scratch,
            self.state.close_flag(),
        );
        match result {
            Err(error) if error.is_fatal() => {
                failed(self.rank, &error);
                side.abandon(error.lost_peer());
                Err(self.state.fail(error))
            }
            other => other,
        }
    }

    /// Runs one mesh algorithm, as [`Jaccl::run`] does.
    fn run_one<A: Algorithm>(
        &self,
        state: &mut State<F>,
        algorithm: A,
        mem: (&mut [u8], Option<&[u8]>),
        context: Phase,
    ) -> Result<()> {
        self.run(state, &mut [Counted::new(algorithm)], mem, context)
    }

    /// Runs the ring machines kept in the vector `pick` chooses, after `fill` set them up
    /// for this collective; the vector returns to the state whatever the outcome.
    fn run_kept<M: for<'m> Machine<Mem<'m>>>(
        &self,
        state: &mut State<F>,
        pick: fn(&mut State<F>) -> &mut Vec<M>,
        fill: impl FnOnce(&mut Vec<M>),
        mem: (&mut [u8], Option<&[u8]>),
        context: Phase,
    ) -> Result<()> {
        let mut machines = std::mem::take(pick(state));
        fill(&mut machines);
        let result = self.run(state, &mut machines, mem, context);
        *pick(state) = machines;
        result
    }

    /// Runs `collective` between the `collective_start` and `collective_done` probes, as
    /// the ring does (see `comm::trace::Traced`).
    fn traced(&self, traced: Traced, collective: impl FnOnce() -> Result<()>) -> Result<()> {
        let ranks = self.size as u64;
        ffi::probes::collective(traced.op, traced.dtype, traced.bytes, ranks, collective)
    }

    fn neighbours(&self) -> Neighbours {
        Neighbours::new(self.rank, self.size)
    }

    fn left(&self) -> usize {
        self.neighbours().left()
    }

    fn right(&self) -> usize {
        self.neighbours().right()
    }

    /// After a ring all_gather: an error if the ring has MLX ranks that, as configured, run
    /// MLX 0.32.1's defective all_gather. The messages were exchanged in full (every rank
    /// sent and received what the schedule has), so the group is still in step and usable;
    /// only this result is refused.
    fn check_mixed_ring_all_gather(&self) -> Result<()> {
        if self.mlx_ranks.is_empty() || self.mlx_all_gather == MlxAllGather::Fixed {
            return Ok(());
        }
        Err(Error::Unsupported(format!(
            "all_gather in a jaccl-ring group with MLX ranks (rank(s) {}): MLX 0.32.1's ring \
             all_gather is defective (it sends the lower half of each rank's block in both \
             directions and leaves most of the output unfilled), so their blocks in this \
             output, and their own outputs, are wrong. The messages were exchanged, so the \
             group stays usable. MLX PR #4443 fixes it, in releases after 0.32.2; if every MLX \
             rank runs one, set {MLX_ALL_GATHER_VAR}=fixed. A mesh (MLX_JACCL_RING unset) \
             has no such defect",
            list(&self.mlx_ranks)
        )))
    }

    /// `Ok` if `peer` is a neighbour in ring mode.
    fn check_neighbour(&self, what: &str, peer: usize) -> Result<()> {
        self.neighbours().check(
            what,
            peer,
            "a JACCL ring",
            ", as MLX's jaccl-ring does; use a mesh (a device file connecting every pair, \
             without MLX_JACCL_RING) to reach any rank",
        )
    }

    /// An all-reduce, untraced (its callers are).
    fn reduce(&self, op: ReduceOp, dtype: DType, data: &mut [u8]) -> Result<()> {
        let context = op.phase();
        debug_assert!(
            data.len().is_multiple_of(dtype.size()),
            "Group checks whole elements"
        );
        let count = data.len() / dtype.size();
        let mut state = self.lock()?;
        if count == 0 {
            return Ok(());
        }
        let (rank, size, classes) = (self.rank, self.size, self.classes);
        match self.kind {
            Kind::Mesh if mesh::uses_scatter_gather(size, data.len()) => {
                let es = dtype.size();
                let chunk = count / size;
                if chunk > 0 {
                    let shard = rank * chunk * es;
                    let scatter =
                        mesh::SumScatter::new(rank, size, classes, (op, dtype), shard, chunk);
                    self.run_one(&mut state, scatter, (&mut *data, None), context)?;
                    let gather = mesh::AllGather::new(rank, size, classes, chunk * es);
                    self.run_one(&mut state, gather, (&mut *data, None), context)?;
                }
                let base = chunk * size;
                if base < count {
                    let tail = mesh::AllReduce::new(
                        rank,
                        size,
                        classes,
                        op,
                        dtype,
                        base * es,
                        count - base,
                    );
                    self.run_one(&mut state, tail, (data, None), context)?;
                }
                Ok(())
            }
            Kind::Mesh => {
                let all = mesh::AllReduce::new(rank, size, classes, op, dtype, 0, count);
                self.run_one(&mut state, all, (data, None), context)
            }
            Kind::Ring { wires } => self.run_kept(
                &mut state,
                |s| &mut s.wires,
                |m| ring::all_reduce(rank, size, wires, classes, (op, dtype), count, m),
                (data, None),
                context,
            ),
        }
    }
}

impl<F: Fabric + 'static> Communicator for Jaccl<F> {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn backend(&self) -> &'static str {
        "jaccl"
    }

    /// Every peer's data moves over RDMA (TCP only sets the group up).
    fn transport(&self, _peer: usize) -> crate::comm::Transport {
        crate::comm::Transport::Rdma
    }

    /// MLX's schedules: a mesh's all-reduce one-shot or by scatter-gather (as `reduce`
    /// picks; a barrier is an all-reduce of one byte), its all_gather and sum_scatter
    /// direct; every collective of a ring by the ring.
    fn algorithm(
        &self,
        op: crate::comm::FlightOp,
        _dtype: Option<DType>,
        bytes: usize,
    ) -> Option<algorithm::Algorithm> {
        use crate::comm::FlightOp;
        use algorithm::Algorithm as A;
        if self.size == 1 {
            return None;
        }
        match (self.kind, op) {
            (_, FlightOp::Send | FlightOp::Recv | FlightOp::Broadcast | FlightOp::AllToAll) => None,
            (Kind::Ring { .. }, _) => Some(A::Ring),
            (Kind::Mesh, FlightOp::AllReduce(_) | FlightOp::Barrier) => {
                Some(if mesh::uses_scatter_gather(self.size, bytes.max(1)) {
                    A::ScatterGather
                } else {
                    A::OneShot
                })
            }
            (Kind::Mesh, FlightOp::AllGather | FlightOp::SumScatter) => Some(A::Direct),
        }
    }

    fn all_reduce(&self, op: ReduceOp, dtype: DType, data: &mut [u8]) -> Result<()> {
        let traced = Traced::reduce(op, dtype, data.len());
        self.traced(traced, || self.reduce(op, dtype, data))
    }

    fn all_gather(&self, input: &[u8], output: &mut [u8]) -> Result<()> {
        let traced = Traced::bytes(Traced::ALL_GATHER, Phase::AllGather, input.len());
        self.traced(traced, || {
            const CONTEXT: Phase = Phase::AllGather;
            let n = input.len();
            debug_assert_eq!(output.len(), n * self.size, "Group checks the lengths");
            let mut state = self.lock()?;
            output[self.rank * n..(self.rank + 1) * n].copy_from_slice(input);
            if n == 0 {
                return Ok(());
            }
            let mem = (output, None);
            match self.kind {
                Kind::Mesh => {
                    let m = mesh::AllGather::new(self.rank, self.size, self.classes, n);
                    self.run_one(&mut state, m, mem, CONTEXT)
                }
                Kind::Ring { wires } => {
                    self.run_kept(
                        &mut state,
                        |s| &mut s.wires,
                        |m| ring::all_gather(self.rank, self.size, wires, self.classes, n, m),
                        mem,
                        CONTEXT,
                    )?;
                    self.check_mixed_ring_all_gather()
                }
            }
        })
    }

    fn sum_scatter(&self, dtype: DType, input: &[u8], output: &mut [u8]) -> Result<()> {
        let traced = Traced {
            op: Traced::SUM_SCATTER,
            dtype: Traced::dtype(dtype),
            bytes: input.len() as u64,
            context: Phase::SumScatter,
        };
        self.traced(traced, || {
            const CONTEXT: Phase = Phase::SumScatter;
            debug_assert!(
                output.len().is_multiple_of(dtype.size())
                    && input.len() == output.len() * self.size,
                "Group checks the lengths"
            );
            let chunk = output.len() / dtype.size();
            let mut state = self.lock()?;
            if chunk == 0 {
                return Ok(());
            }
            let mem = (output, Some(input));
            match self.kind {
                Kind::Mesh => {
                    let m = mesh::SumScatter::new(
                        self.rank,
                        self.size,
                        self.classes,
                        (ReduceOp::Sum, dtype),
                        0,
                        chunk,
                    );
                    self.run_one(&mut state, m, mem, CONTEXT)
                }
                Kind::Ring { wires } => self.run_kept(
                    &mut state,
                    |s| &mut s.scatter,
                    |m| {
                        let shape = (dtype, chunk);
                        ring::sum_scatter(self.rank, self.size, wires, self.classes, shape, m)
                    },
                    mem,
                    CONTEXT,
                ),
            }
        })
    }

    fn send(&self, data: &[u8], dst: usize) -> Result<()> {
        let traced = Traced::bytes(Traced::SEND, Phase::Send, data.len());
        self.traced(traced, || {
            let mut state = self.lock()?;
            let mem = (&mut [][..], Some(data));
            match self.kind {
                Kind::Mesh => {
                    if data.is_empty() {
                        return Ok(());
                    }
                    let m = mesh::Send::new(dst, self.classes, data.len());
                    self.run_one(&mut state, m, mem, Phase::Send)
                }
                Kind::Ring { wires } => {
                    self.check_neighbour("send to", dst)?;
                    if data.is_empty() {
                        return Ok(());
                    }
                    // Towards the left neighbour in direction 1 (with two ranks, always).
                    let towards = (false, dst == self.left());
                    self.run_kept(
                        &mut state,
                        |s| &mut s.stripes,
                        |m| ring::stripes(towards, wires, self.classes, data.len(), m),
                        mem,
                        Phase::Send,
                    )
                }
            }
        })
    }

    fn recv(&self, data: &mut [u8], src: usize) -> Result<()> {
        let traced = Traced::bytes(Traced::RECV, Phase::Recv, data.len());
        self.traced(traced, || {
            let mut state = self.lock()?;
            let len = data.len();
            let mem = (data, None);
            match self.kind {
                Kind::Mesh => {
                    if len == 0 {
                        return Ok(());
                    }
                    let m = mesh::Recv::new(src, self.classes, len);
                    self.run_one(&mut state, m, mem, Phase::Recv)
                }
                Kind::Ring { wires } => {
                    self.check_neighbour("receive from", src)?;
                    if len == 0 {
                        return Ok(());
                    }
                    // From the right neighbour in direction 1 (with two ranks, always).
                    let towards = (true, src == self.right());
                    self.run_kept(
                        &mut state,
                        |s| &mut s.stripes,
                        |m| ring::stripes(towards, wires, self.classes, len, m),
                        mem,
                        Phase::Recv,
                    )
                }
            }
        })
    }

    fn barrier(&self) -> Result<()> {
        // MLX's JACCL barrier: an all_sum of one uint8, which the probes see as a barrier
        // (op 7), as the ring's.
        let traced = Traced {
            op: Traced::BARRIER,
            ..Traced::reduce(ReduceOp::Sum, DType::U8, 1)
        };
        self.traced(traced, || self.reduce(ReduceOp::Sum, DType::U8, &mut [0u8]))
    }

    fn close(&self) -> Result<()> {
        // No interrupt to install: a collective in flight naps at most a millisecond at a
        // time and checks the close flag after every nap (see `transport::rdma::engine::run`).
        self.state.close(|state| {
            // Queue pairs and registrations go first (the fabric's drop orders them), then
            // the side channel, which the other ranks see close.
            state.fabric = None;
            state.side.abandon(None);
        });
        Ok(())
    }

    fn is_closed(&self) -> bool {
        self.state.is_closed()
    }

    /// Checks the side channel when no collective runs. While one runs on another thread it
    /// does not wait for it: it reports what the group already knows (closed, failed) and
    /// otherwise `Ok`, since the collective itself watches the side channel.
    fn health(&self) -> Result<()> {
        let Some(mut state) = self.state.try_lock()? else {
            return Ok(());
        };
        match state.side.check(Phase::HealthCheck) {
            Ok(()) => Ok(()),
            Err(error) => {
                failed(self.rank, &error);
                state.side.abandon(error.lost_peer());
                Err(self.state.fail(error))
            }
        }
    }
}

/// "1, 3": ranks for messages.
fn list(ranks: &[usize]) -> String {
    ranks
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Tells the probes and the log that `error` fails rank `rank`'s group, as the ring does.
fn failed(rank: usize, error: &Error) {
    verbose!(warn: rank, "the group is failed: {error}");
    ffi::probes::error(
        error.peer().map_or(u64::MAX, |p| p as u64),
        crate::comm::trace::error_kind(error),
    );
}
