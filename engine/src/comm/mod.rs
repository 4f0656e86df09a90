//! What every transport and backend shares, knowing none of them: the [`Communicator`]
//! trait the backends implement (with [`FlightOp`], the calls it names to the flight
//! recorder when it says which algorithm each takes), the group state that a transport error fails
//! ([`state`]), ring neighbours ([`neighbours`]), the protocol vocabulary every collective's
//! state machine speaks ([`machine`]), which algorithm the native wire's collectives take
//! ([`algorithm`]), and the loop that drives a collective until it
//! finishes or a peer falls silent ([`progress`]), with its one rule for whom to blame; and
//! [`stub`], a communicator that moves nothing, for tests and benchmarks.

pub(crate) mod algorithm;
mod link;
pub(crate) mod machine;
pub(crate) mod neighbours;
pub(crate) mod progress;
pub(crate) mod reports;
pub(crate) mod ring;
pub(crate) mod state;
pub(crate) mod stub;
pub(crate) mod trace;

pub use link::Transport;

use std::fmt;
use std::ops::Range;

use crate::element::DType;
use crate::error::{Error, Result};
use crate::reduce::ReduceOp;
use algorithm::Algorithm;

/// What a call was, as the flight recorder ([`FlightEntry::op`](crate::FlightEntry::op))
/// and [`Communicator::algorithm`] name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FlightOp {
    /// An all-reduce with its operation: [`Group::all_sum`](crate::Group::all_sum) and
    /// its siblings.
    AllReduce(ReduceOp),
    /// [`Group::all_gather`](crate::Group::all_gather).
    AllGather,
    /// [`Group::sum_scatter`](crate::Group::sum_scatter).
    SumScatter,
    /// [`Group::send`](crate::Group::send); the destination is
    /// [`FlightEntry::peer`](crate::FlightEntry::peer).
    Send,
    /// [`Group::recv`](crate::Group::recv); the source is
    /// [`FlightEntry::peer`](crate::FlightEntry::peer).
    Recv,
    /// [`Group::barrier`](crate::Group::barrier).
    Barrier,
    /// [`Group::broadcast`](crate::Group::broadcast); the root is
    /// [`FlightEntry::peer`](crate::FlightEntry::peer).
    Broadcast,
    /// [`Group::all_to_all`](crate::Group::all_to_all).
    AllToAll,
}

impl FlightOp {
    /// The call's name as the API spells it: `"all_sum"`, `"all_max"`, `"all_min"`,
    /// `"all_gather"`, `"sum_scatter"`, `"send"`, `"recv"`, `"barrier"`, `"broadcast"`,
    /// `"all_to_all"`.
    pub fn name(self) -> &'static str {
        match self {
            FlightOp::AllReduce(op) => op.collective(),
            FlightOp::AllGather => "all_gather",
            FlightOp::SumScatter => "sum_scatter",
            FlightOp::Send => "send",
            FlightOp::Recv => "recv",
            FlightOp::Barrier => "barrier",
            FlightOp::Broadcast => "broadcast",
            FlightOp::AllToAll => "all_to_all",
        }
    }
}

impl fmt::Display for FlightOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Element range `[start, end)` of part `i` when `n` elements are cut into `parts` parts of
/// `ceil(n / parts)` elements (MLX's cut of a ring collective, which the native and
/// shared-memory schedules share). Parts past the end are empty.
pub(crate) fn part(n: usize, parts: usize, i: usize) -> Range<usize> {
    let step = n.div_ceil(parts);
    (i * step).min(n)..((i + 1) * step).min(n)
}

/// Which buffer of a gather or scatter holds one block per rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Blocks {
    /// `all_gather`: the output holds every rank's input.
    Gather,
    /// `sum_scatter`: the input holds a block for every rank's output.
    Scatter,
}

/// Checks the lengths (in elements) of a gather or scatter `call` in a group of `size`:
/// the buffer `blocks` names must hold `size` blocks as long as the other. The error names
/// the call and the lengths.
pub(crate) fn check_blocks(
    call: &str,
    blocks: Blocks,
    input: usize,
    output: usize,
    size: usize,
) -> Result<()> {
    let ((whole_name, whole), (block_name, block)) = match blocks {
        Blocks::Gather => (("output", output), ("input", input)),
        Blocks::Scatter => (("input", input), ("output", output)),
    };
    if whole != block * size {
        return Err(Error::invalid(format!(
            "{call}: the {whole_name} holds {whole} elements but {size} ranks x {block} \
             {block_name} elements need {}",
            block * size
        )));
    }
    Ok(())
}

/// Checks that `peer` is a rank `comm` can send to or receive from (`what`: "send to" or
/// "receive from"): in range and not this rank, with an error that says which.
pub(crate) fn check_peer(comm: &dyn Communicator, what: &str, peer: usize) -> Result<()> {
    let (rank, size) = (comm.rank(), comm.size());
    if size == 1 {
        return Err(Error::invalid(format!(
            "cannot {what} rank {peer}: this is a group of one process"
        )));
    }
    if peer >= size {
        return Err(Error::invalid(format!(
            "cannot {what} rank {peer}: the group has ranks 0 to {}",
            size - 1
        )));
    }
    if peer == rank {
        return Err(Error::invalid(format!(
            "cannot {what} rank {peer}: that is this rank itself"
        )));
    }
    Ok(())
}

/// What a backend implements: collectives on raw element bytes.
///
/// Every rank must call the same collectives in the same order with the same lengths, as in
/// MLX; the wire carries no lengths or types. [`Group`](crate::Group) checks the arguments before calling
/// these methods, so an implementation may assume:
///
/// - `all_reduce`: `data` holds whole elements of `dtype`;
/// - `all_gather`: `output.len() == input.len() * size()`;
/// - `sum_scatter`: `input.len() == output.len() * size()`, both whole elements of `dtype`;
/// - `send`/`recv`: `dst`/`src` is in range and is not this rank;
/// - `broadcast`: `root` is in range and the group has at least two ranks;
/// - `all_to_all`: `input.len() == output.len()`, a multiple of `size()`, and the group
///   has at least two ranks.
///
/// A transport failure must leave the communicator failed: later calls return
/// [`Error::Failed`].
pub trait Communicator: Send + Sync + fmt::Debug {
    /// This process's rank.
    fn rank(&self) -> usize;

    /// The number of ranks.
    fn size(&self) -> usize;

    /// The backend's name, for messages (`"ring"`, `"native"`, `"jaccl"`).
    fn backend(&self) -> &'static str;

    /// Reduces `data` in place across every rank.
    fn all_reduce(&self, op: ReduceOp, dtype: DType, data: &mut [u8]) -> Result<()>;

    /// Concatenates every rank's `input` into `output`, in rank order.
    fn all_gather(&self, input: &[u8], output: &mut [u8]) -> Result<()>;

    /// Sums `input` across ranks and keeps this rank's share, block `rank` of `size`.
    fn sum_scatter(&self, dtype: DType, input: &[u8], output: &mut [u8]) -> Result<()>;

    /// Sends `data` to rank `dst`, which receives it with `recv` of the same length.
    fn send(&self, data: &[u8], dst: usize) -> Result<()>;

    /// Receives exactly `data.len()` bytes from rank `src`.
    fn recv(&self, data: &mut [u8], src: usize) -> Result<()>;

    /// Returns once every rank has called it.
    fn barrier(&self) -> Result<()>;

    /// Checks that every connection is still up, without running a collective. Must not
    /// wait for a collective running on another thread.
    fn health(&self) -> Result<()>;

    /// Releases the transport (connections, buffers). Later calls fail with
    /// [`Error::GroupClosed`]. Closing twice is not an error. Callable from any thread: a
    /// collective in flight must return [`Error::Aborted`] promptly rather than hold the
    /// close up.
    fn close(&self) -> Result<()>;

    /// Whether [`Communicator::close`] was called. `init`'s cache of formed groups asks
    /// this, so that a closed group is formed anew; a communicator that is never cached
    /// may keep the default.
    fn is_closed(&self) -> bool {
        false
    }

    // broadcast and all_to_all. Defaults refuse, so that a backend without them
    // (JACCL today, a user's own) says so by name instead of failing to build.

    /// What carries this rank's messages to and from `peer` (in range, not this rank), as
    /// the group negotiated it when it formed. The default, for a backend that does not
    /// say, is [`Transport::Unknown`].
    fn transport(&self, peer: usize) -> Transport {
        let _ = peer;
        Transport::Unknown
    }

    /// The algorithm this rank's part of a call of `op` takes, for the flight recorder
    /// ([`FlightEntry::algorithm`](crate::FlightEntry::algorithm)): over `bytes` bytes (an
    /// all-reduce's, send's or receive's data; the input of an all_gather, sum_scatter or
    /// all_to_all; a broadcast's vector; 0 for a barrier) of `dtype` elements when the
    /// caller said which. The answer must depend on these arguments only, for the
    /// communicator's life: the group asks for each call in its record when a copy of the
    /// record is taken, not when the call is made. It must be cheap and never wait on the
    /// group. The default, for a backend that does not say, is
    /// `None`, as for a call that has no algorithm (send, recv, a group of one).
    fn algorithm(&self, op: FlightOp, dtype: Option<DType>, bytes: usize) -> Option<Algorithm> {
        let _ = (op, dtype, bytes);
        None
    }

    /// Copies rank `root`'s `data` into every other rank's `data` (same length on every
    /// rank). The default refuses with [`Error::Unsupported`] naming the backend.
    fn broadcast(&self, data: &mut [u8], root: usize) -> Result<()> {
        let _ = data;
        Err(crate::error::Error::Unsupported(format!(
            "broadcast from rank {root}: the {} backend does not offer it",
            self.backend()
        )))
    }

    /// Sends block `j` of `input` (`input.len() / size()` bytes) to rank `j`, and puts the
    /// block rank `i` sent to this rank at block `i` of `output`. The default refuses with
    /// [`Error::Unsupported`] naming the backend.
    fn all_to_all(&self, input: &[u8], output: &mut [u8]) -> Result<()> {
        let _ = (input, output);
        Err(crate::error::Error::Unsupported(format!(
            "all_to_all: the {} backend does not offer it",
            self.backend()
        )))
    }
}
