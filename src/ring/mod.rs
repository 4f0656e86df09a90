//! MLX's TCP ring backend, byte-compatible with `mx.distributed`'s ring.
//!
//! - [`schedule`]: which bytes go where, step by step (the wire contract with MLX);
//! - [`connect`]: forming the ring's connections;
//! - [`transport`]: the sockets and the event loop that owns them;
//! - [`engine`]: lanes that stream a schedule through the loop and fold data in;
//! - [`staging`]: the page-aligned buffers reductions land in.
//!
//! [`Ring`] ties them together behind [`Communicator`]. A group's state sits behind one
//! mutex: collectives are serialised (every rank must issue them in the same order anyway),
//! and the thread holding the lock drives the event loop for the duration of its
//! collective.

mod connect;
mod engine;
pub(crate) mod schedule;
mod staging;
mod transport;

use std::fmt;
use std::time::Duration;

use engine::{Buffers, Lane, Spin, Work};
use schedule::{Direction, Layout, Pass, SMALL_PAD_BYTES};
use staging::Staging;
use transport::{Transfer, Transport};

use crate::comm::Communicator;
use crate::comm::neighbours::Neighbours;
use crate::comm::state::Guarded;
use crate::element::DType;
use crate::error::{Error, PeerOp, Result};
use crate::hostfile::RingAddresses;
use crate::options::Options;
use crate::reduce::ReduceOp;
use crate::verbose::verbose;
use zerocopy::IntoBytes;

/// One rank's end of a formed ring.
pub(crate) struct Ring {
    rank: usize,
    size: usize,
    timeout: Duration,
    spin: Spin,
    state: Guarded<State>,
}

struct State {
    transport: Transport,
    staging: Staging,
    /// The lanes of the collective in flight; kept so their storage is reused.
    lanes: Vec<Lane>,
}

impl fmt::Debug for Ring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ring")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Ring {
    /// Forms the ring described by `addrs` (at least two ranks), waiting at most
    /// `options.timeout` for the neighbours.
    pub(crate) fn connect(addrs: &RingAddresses, options: &Options) -> Result<Ring> {
        let timeout = options.timeout;
        let transport = connect::connect(addrs, options)?;
        let staging = Staging::new(transport.connections())
            .map_err(|e| Error::local("mapping the ring's staging buffers", e))?;
        Ok(Ring {
            rank: addrs.rank,
            size: addrs.size,
            timeout,
            spin: Spin::for_local_ranks(options.spin, addrs.local_ranks),
            state: Guarded::new(State {
                transport,
                staging,
                lanes: Vec::new(),
            }),
        })
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

    /// The group's state, or the error that failed it.
    fn lock(&self) -> Result<std::sync::MutexGuard<'_, State>> {
        self.state.lock()
    }

    /// Runs the lanes in `state.lanes` over `bufs`; a transport error fails the group.
    /// `traced` describes the collective to the tracing probes.
    fn run(&self, state: &mut State, bufs: &mut Buffers<'_>, traced: Traced) -> Result<()> {
        let State {
            transport,
            staging,
            lanes,
        } = state;
        let ranks = self.size as u64;
        // Timestamps only in builds with probes: without them this is free.
        let start = ffi::probes::ENABLED.then(std::time::Instant::now);
        ffi::probes::collective_start(traced.op, traced.dtype, traced.bytes, ranks);
        let result = match engine::run(
            transport,
            lanes,
            bufs,
            &mut staging.lanes,
            self.timeout,
            self.spin,
            traced.context,
        ) {
            Err(error) if error.is_fatal() => Err(fail(transport, &self.state, error)),
            result => result,
        };
        let elapsed = start.map_or(0, |s| s.elapsed().as_nanos() as u64);
        ffi::probes::collective_done(
            traced.op,
            traced.dtype,
            traced.bytes,
            ranks,
            elapsed,
            result.is_ok(),
        );
        result
    }

    /// Adds the lanes of one MLX all-reduce over `elems` elements from byte `base`.
    fn plan_all_reduce(&self, state: &mut State, op: ReduceOp, dtype: DType, elems: usize) {
        let splits = schedule::reduce_splits(
            elems * dtype.size(),
            self.size,
            state.transport.connections(),
        );
        state.lanes.clear();
        for i in 0..splits {
            let part = schedule::part(elems, splits, i);
            let (pair, direction) = schedule::route(i);
            let layout = Layout::split(
                part.start * dtype.size(),
                part.len(),
                dtype.size(),
                self.size,
            );
            let pass = Pass::all_reduce(self.rank, self.size, direction);
            let (tx, rx) = lane_conns(&state.transport, pair, direction);
            state
                .lanes
                .push(Lane::ring(Work::AllReduce(op, dtype), pass, layout, tx, rx));
        }
    }
}

/// What the tracing probes are told about a collective (codes in `ffi::probes`).
#[derive(Clone, Copy, Debug)]
struct Traced {
    op: u8,
    dtype: u8,
    bytes: u64,
    context: &'static str,
}

impl Traced {
    const ALL_GATHER: u8 = 3;
    const SUM_SCATTER: u8 = 4;
    const SEND: u8 = 5;
    const RECV: u8 = 6;
    /// The dtype code of byte-level collectives.
    const BYTES: u8 = 255;

    fn dtype(dtype: DType) -> u8 {
        DType::ALL
            .iter()
            .position(|&d| d == dtype)
            .map_or(Self::BYTES, |i| i as u8)
    }

    fn reduce(op: ReduceOp, dtype: DType, bytes: usize) -> Traced {
        let code = match op {
            ReduceOp::Sum => 0,
            ReduceOp::Max => 1,
            ReduceOp::Min => 2,
        };
        Traced {
            op: code,
            dtype: Self::dtype(dtype),
            bytes: bytes as u64,
            context: op.collective(),
        }
    }

    fn bytes(op: u8, context: &'static str, bytes: usize) -> Traced {
        Traced {
            op,
            dtype: Self::BYTES,
            bytes: bytes as u64,
            context,
        }
    }
}

/// Fails the group with `error` (or the lost rank a neighbour's notice names): records
/// it for later calls, and tells the neighbours, which also learn that this rank is gone.
fn fail(transport: &mut Transport, group: &Guarded<State>, error: Error) -> Error {
    let rank = transport.rank();
    verbose!(rank, "collective failed: {error}");
    ffi::probes::error(
        error.peer().map_or(u64::MAX, |p| p as u64),
        error_kind(&error),
    );
    let error = transport.diagnose(error);
    transport.abandon(error.peer());
    // A stall is judged on timing; a notice that arrived while this rank was closing
    // still names the rank better than the suspicion did (the notices this rank sent
    // cannot be taken back, but its own report can be right).
    let error = match error {
        Error::Timeout { context, .. } => transport.notice(context).unwrap_or(error),
        error => error,
    };
    verbose!(rank, "the group is failed: {error}");
    group.fail(error)
}

/// The `error` probe's kind code: 1 I/O, 2 closed, 3 lost (by notice), 4 timeout,
/// 5 authentication, 0 anything else.
fn error_kind(error: &Error) -> u8 {
    match error {
        Error::Io { .. } => 1,
        Error::Closed { .. } => 2,
        Error::Lost { .. } => 3,
        Error::Timeout { .. } => 4,
        Error::Auth { .. } => 5,
        _ => 0,
    }
}

/// The connections a lane on connection pair `pair` writes to and reads from.
fn lane_conns(transport: &Transport, pair: usize, direction: Direction) -> (usize, usize) {
    match direction {
        Direction::Left => (transport.left(pair), transport.right(pair)),
        Direction::Right => (transport.right(pair), transport.left(pair)),
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

    fn all_reduce(&self, op: ReduceOp, dtype: DType, data: &mut [u8]) -> Result<()> {
        let context = op.collective();
        let esize = dtype.size();
        debug_assert!(
            data.len().is_multiple_of(esize),
            "Group checks whole elements"
        );
        let elems = data.len() / esize;
        if elems >= self.size {
            let mut state = self.lock()?;
            self.plan_all_reduce(&mut state, op, dtype, elems);
            let traced = Traced::reduce(op, dtype, data.len());
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
        let (tx, rx) = lane_conns(&state.transport, 0, Direction::Right);
        let pass = Pass::all_reduce(self.rank, self.size, Direction::Right);
        let layout = Layout::split(0, self.size, esize, self.size);
        state.lanes.clear();
        state
            .lanes
            .push(Lane::ring(Work::AllReduce(op, dtype), pass, layout, tx, rx));
        self.run(
            state,
            &mut Buffers {
                data: pad,
                input: &[],
            },
            Traced::reduce(op, dtype, data.len()),
        )?;
        data.copy_from_slice(&pad[..data.len()]);
        Ok(())
    }

    fn all_gather(&self, input: &[u8], output: &mut [u8]) -> Result<()> {
        const CONTEXT: &str = "all_gather";
        let nbytes = input.len();
        debug_assert_eq!(output.len(), nbytes * self.size, "Group checks the lengths");
        let mut state = self.lock()?;
        let state = &mut *state;
        // Our own block is copied in locally; the ring fills the others.
        output[self.rank * nbytes..(self.rank + 1) * nbytes].copy_from_slice(input);
        let splits = schedule::gather_splits(nbytes, state.transport.connections());
        state.lanes.clear();
        for i in 0..splits {
            let part = schedule::part(nbytes, splits, i);
            let (pair, direction) = schedule::route(i);
            let layout = Layout::Strided {
                offset: part.start,
                len: part.len(),
                stride: nbytes,
            };
            let pass = Pass::all_gather(self.rank, self.size, direction);
            let (tx, rx) = lane_conns(&state.transport, pair, direction);
            state
                .lanes
                .push(Lane::ring(Work::AllGather, pass, layout, tx, rx));
        }
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
        const CONTEXT: &str = "sum_scatter";
        let chunk = output.len();
        let esize = dtype.size();
        debug_assert!(
            input.len() == chunk * self.size && chunk.is_multiple_of(esize),
            "Group checks the lengths"
        );
        let mut state = self.lock()?;
        let state = &mut *state;
        let elems = chunk / esize;
        let splits = schedule::reduce_splits(input.len(), self.size, state.transport.connections());
        state.lanes.clear();
        for i in 0..splits {
            let part = schedule::part(elems, splits, i);
            let (pair, direction) = schedule::route(i);
            let layout = Layout::Strided {
                offset: part.start * esize,
                len: part.len() * esize,
                stride: chunk,
            };
            let pass = Pass::reduce_scatter(self.rank, self.size, direction);
            let (tx, rx) = lane_conns(&state.transport, pair, direction);
            state.lanes.push(Lane::ring(
                Work::ReduceScatter(ReduceOp::Sum, dtype),
                pass,
                layout,
                tx,
                rx,
            ));
        }
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
        let mut state = self.lock()?;
        let state = &mut *state;
        // MLX checks the right neighbour first, so with two ranks a send goes out on the
        // connections this rank opened and arrives on the peer's accepted ones.
        let first = if dst == self.right() {
            state.transport.right(0)
        } else if dst == self.left() {
            state.transport.left(0)
        } else {
            return Err(self.not_a_neighbour("send to", dst));
        };
        self.plan_stripes(state, Work::Send, first, data.len());
        self.run(
            state,
            &mut Buffers {
                data: &mut [],
                input: data,
            },
            Traced::bytes(Traced::SEND, "send", data.len()),
        )
    }

    fn recv(&self, data: &mut [u8], src: usize) -> Result<()> {
        let mut state = self.lock()?;
        let state = &mut *state;
        // The mirror of `send`: the left neighbour first.
        let first = if src == self.left() {
            state.transport.left(0)
        } else if src == self.right() {
            state.transport.right(0)
        } else {
            return Err(self.not_a_neighbour("receive from", src));
        };
        self.plan_stripes(state, Work::Recv, first, data.len());
        let len = data.len();
        self.run(
            state,
            &mut Buffers { data, input: &[] },
            Traced::bytes(Traced::RECV, "recv", len),
        )
    }

    fn barrier(&self) -> Result<()> {
        // An all_sum of one f32 zero: what `mx.eval(mx.distributed.all_sum(mx.zeros(1)))`
        // sends, so a barrier also lines up with MLX ranks doing that.
        self.all_reduce(ReduceOp::Sum, DType::F32, &mut [0u8; 4])
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

    fn health(&self) -> Result<()> {
        let mut state = self.lock()?;
        let mut found = None;
        for conn in state.transport.conns() {
            found = match conn.probe() {
                Ok(Transfer::Closed) => Some(conn.closed(PeerOp::Receive, "health check")),
                Err(e) => Some(conn.failed(PeerOp::Receive, "health check", e)),
                Ok(_) => continue,
            };
            break;
        }
        match found {
            Some(error) => Err(fail(&mut state.transport, &self.state, error)),
            None => Ok(()),
        }
    }
}

impl Ring {
    /// MLX's striping of a send or receive over the C connections starting at `first`.
    fn plan_stripes(&self, state: &mut State, work: Work, first: usize, len: usize) {
        let connections = state.transport.connections();
        state.lanes.clear();
        for i in 0..connections {
            let range = schedule::stripe(len, connections, i);
            if range.is_empty() {
                break;
            }
            state
                .lanes
                .push(Lane::point(work, first + i, range.start, range.len()));
        }
    }

    fn not_a_neighbour(&self, what: &str, peer: usize) -> Error {
        self.neighbours()
            .refusal(what, peer, "the ring backend", ", as MLX's ring does")
    }
}
