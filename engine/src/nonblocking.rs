//! Nonblocking collectives on a group's own loop thread: [`Group::scope`](crate::Group::scope), [`Scope`],
//! [`Pending`]. The rules are in [`Scope`]'s documentation.

use std::collections::VecDeque;
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::JoinHandle;

use ffi::lend::{Ledger, Lender, Loan, LoanMut};
use zerocopy::IntoBytes;

use crate::comm::{Blocks, Communicator, check_blocks};
use crate::element::{Complex64, DType, Element};
use crate::error::{Error, Phase, Result};
use crate::recorder::{Call, FlightOp, Recorded};
use crate::reduce::ReduceOp;

/// Operations queued at once before the queue first grows (and allocates).
const PREALLOCATED: usize = 64;

mod sealed {
    pub trait Sealed {}
}

/// An [`Element`] whose every bit pattern is a valid value: every dtype but `bool`. Only
/// these can be lent to the loop thread, which writes the bytes peers send into the
/// caller's buffer as they arrive.
pub trait Plain: Element + sealed::Sealed {
    /// The slice's bytes, writable.
    #[doc(hidden)]
    fn wire_mut(data: &mut [Self]) -> &mut [u8];
}

macro_rules! plain {
    ($($t:ty),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Plain for $t {
            #[inline]
            fn wire_mut(data: &mut [Self]) -> &mut [u8] {
                data.as_mut_bytes()
            }
        }
    )*};
}

plain!(
    u8,
    u16,
    u32,
    u64,
    i8,
    i16,
    i32,
    i64,
    half::f16,
    half::bf16,
    f32,
    f64,
    Complex64
);

/// One queued operation, holding the loans of its buffers.
enum Op {
    Reduce {
        op: ReduceOp,
        dtype: DType,
        data: LoanMut,
    },
    Gather {
        dtype: DType,
        input: Loan,
        output: LoanMut,
    },
    SumScatter {
        dtype: DType,
        input: Loan,
        output: LoanMut,
    },
    Send {
        dtype: DType,
        data: Loan,
        peer: usize,
    },
    Recv {
        dtype: DType,
        data: LoanMut,
        peer: usize,
    },
    Barrier,
    Broadcast {
        dtype: DType,
        data: LoanMut,
        root: usize,
    },
    AllToAll {
        dtype: DType,
        input: Loan,
        output: LoanMut,
    },
}

impl Op {
    /// Runs the operation on the group's backend, through its flight recorder with the
    /// element type the scope was given.
    fn run(&mut self, comm: &Recorded) -> Result<()> {
        match self {
            Op::Reduce { op, dtype, data } => comm.all_reduce(*op, *dtype, data.bytes_mut()),
            Op::Gather {
                dtype,
                input,
                output,
            } => {
                let call = Call::new(FlightOp::AllGather, Some(*dtype), input.bytes().len());
                comm.call(call, |c| c.all_gather(input.bytes(), output.bytes_mut()))
            }
            Op::SumScatter {
                dtype,
                input,
                output,
            } => comm.sum_scatter(*dtype, input.bytes(), output.bytes_mut()),
            Op::Send { dtype, data, peer } => {
                let call = Call::new(FlightOp::Send, Some(*dtype), data.bytes().len());
                comm.call(call.with_peer(*peer), |c| c.send(data.bytes(), *peer))
            }
            Op::Recv { dtype, data, peer } => {
                let call = Call::new(FlightOp::Recv, Some(*dtype), data.bytes_mut().len());
                comm.call(call.with_peer(*peer), |c| c.recv(data.bytes_mut(), *peer))
            }
            Op::Barrier => comm.barrier(),
            Op::Broadcast { dtype, data, root } => {
                let call = Call::new(FlightOp::Broadcast, Some(*dtype), data.bytes_mut().len());
                comm.call(call.with_peer(*root), |c| {
                    c.broadcast(data.bytes_mut(), *root)
                })
            }
            Op::AllToAll {
                dtype,
                input,
                output,
            } => {
                let call = Call::new(FlightOp::AllToAll, Some(*dtype), input.bytes().len());
                comm.call(call, |c| c.all_to_all(input.bytes(), output.bytes_mut()))
            }
        }
    }

    fn phase(&self) -> Phase {
        match self {
            Op::Reduce {
                op: ReduceOp::Max, ..
            } => Phase::AllMax,
            Op::Reduce {
                op: ReduceOp::Min, ..
            } => Phase::AllMin,
            Op::Reduce { .. } | Op::Barrier => Phase::AllSum,
            Op::Gather { .. } => Phase::AllGather,
            Op::SumScatter { .. } => Phase::SumScatter,
            Op::Send { .. } => Phase::Send,
            Op::Recv { .. } => Phase::Recv,
            Op::Broadcast { .. } => Phase::Broadcast,
            Op::AllToAll { .. } => Phase::AllToAll,
        }
    }
}

/// Where a started operation's outcome waits for its handle.
enum Slot {
    Free,
    /// Queued or running; `detached` once its handle was dropped unwaited.
    Busy {
        detached: bool,
    },
    Done(Result<()>),
}

struct State {
    slots: Vec<Slot>,
    free: Vec<usize>,
    queue: VecDeque<(usize, Op)>,
    /// Operations started so far, and finished so far (they finish in order).
    issued: u64,
    completed: u64,
    /// The group is gone: the loop thread ends once the queue is empty.
    shutdown: bool,
    /// The loop thread is gone (it panicked, a bug): nothing more can run.
    dead: bool,
}

impl State {
    /// Records the outcome of slot `index`, or frees it if no handle waits for it.
    fn finish(&mut self, index: usize, result: Result<()>) {
        self.completed += 1;
        let Some(slot) = self.slots.get_mut(index) else {
            return;
        };
        if matches!(slot, Slot::Busy { detached: true }) {
            *slot = Slot::Free;
            self.free.push(index);
        } else {
            *slot = Slot::Done(result);
        }
    }
}

struct Shared {
    state: Mutex<State>,
    /// The loop thread waits here for work.
    work: Condvar,
    /// Handles and blocking calls wait here for operations to finish.
    done: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wait_done<'a>(&self, state: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.done
            .wait(state)
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until every operation started before this call has finished.
    fn settle(&self) {
        let mut state = self.lock();
        let target = state.issued;
        while state.completed < target && !state.dead {
            state = self.wait_done(state);
        }
    }
}

/// The loop thread's body: runs queued operations in order, sleeps while there are none.
fn run_loop(shared: &Shared, comm: &Recorded) {
    /// If an operation panics (a bug), fails everything queued instead of leaving its
    /// waiters asleep forever; the queued loans are dropped, so scopes can end.
    struct OnPanic<'a>(&'a Shared);
    impl Drop for OnPanic<'_> {
        fn drop(&mut self) {
            if !std::thread::panicking() {
                return;
            }
            let mut state = self.0.lock();
            state.dead = true;
            while let Some((index, op)) = state.queue.pop_front() {
                let context = op.phase();
                drop(op);
                state.finish(index, Err(loop_died(context)));
            }
            for slot in state.slots.iter_mut() {
                if matches!(slot, Slot::Busy { .. }) {
                    *slot = Slot::Done(Err(loop_died(Phase::AllSum)));
                }
            }
            state.completed = state.issued;
            self.0.done.notify_all();
        }
    }
    let _on_panic = OnPanic(shared);
    let mut state = shared.lock();
    loop {
        if let Some((index, mut op)) = state.queue.pop_front() {
            drop(state);
            let result = op.run(comm);
            // The loans go back before the handle can see the outcome.
            drop(op);
            state = shared.lock();
            state.finish(index, result);
            shared.done.notify_all();
        } else if state.shutdown {
            return;
        } else {
            state = shared
                .work
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

fn loop_died(context: Phase) -> Error {
    Error::Bug {
        context,
        what: "the group's loop thread panicked".into(),
    }
}

/// A group's loop thread and its queue.
struct Engine {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// The nonblocking side of a group, shared by its clones: the ledger of its loans and the
/// loop thread, started at the first nonblocking operation.
pub(crate) struct Nonblocking {
    ledger: Arc<Ledger>,
    engine: OnceLock<Engine>,
    starting: Mutex<()>,
}

impl fmt::Debug for Nonblocking {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Nonblocking")
            .field("started", &self.engine.get().is_some())
            .finish()
    }
}

impl Nonblocking {
    pub(crate) fn new() -> Self {
        Nonblocking {
            ledger: Ledger::new(),
            engine: OnceLock::new(),
            starting: Mutex::new(()),
        }
    }

    /// Waits until every nonblocking operation started so far has finished; what a
    /// blocking collective does first, so that the wire carries calls in issue order.
    pub(crate) fn settle(&self) {
        if let Some(engine) = self.engine.get() {
            engine.shared.settle();
        }
    }

    fn engine(&self, comm: &Arc<Recorded>) -> Result<&Engine> {
        if let Some(engine) = self.engine.get() {
            return Ok(engine);
        }
        let _starting = self.starting.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(engine) = self.engine.get() {
            return Ok(engine);
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                slots: Vec::with_capacity(PREALLOCATED),
                free: Vec::with_capacity(PREALLOCATED),
                queue: VecDeque::with_capacity(PREALLOCATED),
                issued: 0,
                completed: 0,
                shutdown: false,
                dead: false,
            }),
            work: Condvar::new(),
            done: Condvar::new(),
        });
        let (for_loop, comm) = (Arc::clone(&shared), Arc::clone(comm));
        let thread = std::thread::Builder::new()
            .name(format!("nuvec-loop-r{}", comm.rank()))
            .spawn(move || run_loop(&for_loop, &comm))
            .map_err(|e| Error::local("starting the group's loop thread", e))?;
        Ok(self.engine.get_or_init(|| Engine {
            shared,
            thread: Mutex::new(Some(thread)),
        }))
    }
}

impl Drop for Nonblocking {
    fn drop(&mut self) {
        let Some(engine) = self.engine.get() else {
            return;
        };
        engine.shared.lock().shutdown = true;
        engine.shared.work.notify_all();
        let thread = engine
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(thread) = thread {
            // The queue is empty (no scope can outlive the group), so this is quick. A
            // panic of the thread was already turned into errors; nothing to add here.
            let _ = thread.join();
        }
    }
}

/// Runs `f` with a [`Scope`] over `comm` and its loop `nb`, then waits for every operation started in it.
pub(crate) fn scope<'env, R>(
    comm: &'env Arc<Recorded>,
    nb: &'env Nonblocking,
    f: impl for<'scope> FnOnce(&Scope<'scope, 'env>) -> R,
) -> R {
    /// Waits for operations that hold no loan (a barrier) too, also when `f` panics; the
    /// ledger's own wait in `lend` comes after it.
    struct Settle<'a>(&'a Nonblocking);
    impl Drop for Settle<'_> {
        fn drop(&mut self) {
            self.0.settle();
        }
    }
    ffi::lend::lend(&nb.ledger, |lender| {
        let _settle = Settle(nb);
        f(&Scope {
            comm,
            nb,
            lender,
            _env: PhantomData,
        })
    })
}

/// Starts nonblocking collectives on a group, on buffers borrowed until the scope ends
/// ([`Group::scope`](crate::Group::scope)).
///
/// ```
/// # use nuvec_distributed_engine::Group;
/// # let group = Group::single();
/// let mut grads = vec![1.0f32; 1024];
/// let mut stats = [0u64; 4];
/// group.scope(|s| {
///     let sum = s.start_all_sum(&mut grads)?; // runs on the group's loop thread
///     let max = s.start_all_max(&mut stats)?; // queued behind it
///     // ... compute that does not touch `grads` or `stats` ...
///     max.wait()?; // waits in any order
///     sum.wait()
/// })?;
/// // The scope has waited for everything it started: the buffers are the caller's again.
/// assert_eq!(grads[0], group.size() as f32);
/// # Ok::<(), nuvec_distributed_engine::Error>(())
/// ```
///
/// # Why a scope
///
/// The operation runs on another thread while the caller goes on, so that thread writes the
/// caller's buffer after the call that started it has returned. The shape
/// `let p = group.start_all_sum(&mut buf)?; ...; p.wait()?`, with a handle whose `Drop`
/// waits, cannot be made sound: `std::mem::forget(p)` is safe, ends the borrow of `buf`
/// without waiting, and the caller could then read or free `buf` while the loop thread
/// still writes it (the reason `std::thread::scoped` was withdrawn before Rust 1.0). So it is
/// not offered.
///
/// [`Group::scope`](crate::Group::scope) is built like [`std::thread::scope`]: the buffers are borrowed for the
/// whole scope, and the scope does not return (nor unwind from a panic) before every
/// operation started in it has finished, whatever happened to the handles: waited, dropped
/// or forgotten. The buffers are read back after the scope. Nothing is copied: the loop
/// thread works on the caller's memory, reached through a *loan* from `ffi`'s `lend`, whose
/// guarantee is recorded in `SAFETY.md`.
///
/// An owned form (`start_all_sum_owned(Vec<T>) -> Pending<Vec<T>>`) would need no unsafe
/// code, but it moves the buffer through a per-operation allocation (or a typed queue per
/// buffer type) and keeps every operation from borrowing a part of a larger tensor; it is
/// not offered for now.
///
/// # Progress
///
/// Each group has one loop thread, started at its first nonblocking operation. It runs the
/// queued operations one after the other, in the order they were started, and sleeps (no
/// CPU) while the queue is empty; during an operation it sleeps in the transport's poller
/// like a blocking call. The thread ends when the last clone of the group is dropped.
///
/// # Rules
///
/// - **Order.** Operations of one group, blocking or not, go on the wire in the order they
///   were issued on this rank, and every rank must issue the same sequence, as for blocking
///   calls (see [`Group`](crate::Group)). Issue them from one thread.
/// - **Mixing.** A blocking collective (or `send`, `recv`, `barrier`) first waits until every
///   outstanding nonblocking operation of the group has finished, then runs on the calling
///   thread with the latency it has without nonblocking operations. It does not report
///   their errors; a transport error has failed the group, so it fails with
///   [`Error::Failed`](crate::Error::Failed) naming the peer.
/// - **Errors.** Argument errors (lengths, a peer out of range) are returned by the
///   `start_*` call and queue nothing. Transport errors are returned by
///   [`Pending::wait`]: the operation that met the failure names the peer, and every later
///   one fails with [`Error::Failed`](crate::Error::Failed) around that error. An error of a
///   handle that was dropped unwaited is not reported anywhere else.
/// - **Close.** [`Group::close`](crate::Group::close) with operations outstanding aborts the one in flight
///   ([`Error::Aborted`](crate::Error::Aborted)) and fails each queued one with
///   [`Error::GroupClosed`](crate::Error::GroupClosed).
/// - **Element types.** Every [`Element`] but `bool` ([`Plain`]): a `bool` buffer may not
///   hold the arbitrary bytes a peer sends while the operation runs, and the blocking calls
///   convert it through scratch memory. Send `bool`s as `u8`.
/// - **Cost.** Once warm (the queue has grown to the most operations outstanding at once),
///   starting and waiting for an operation allocates nothing.
pub struct Scope<'scope, 'env: 'scope> {
    comm: &'env Arc<Recorded>,
    nb: &'env Nonblocking,
    lender: &'scope Lender<'scope, 'env>,
    _env: PhantomData<&'env mut &'env ()>,
}

impl fmt::Debug for Scope<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scope")
            .field("backend", &self.comm.backend())
            .field("rank", &self.comm.rank())
            .field("size", &self.comm.size())
            .finish()
    }
}

impl<'scope, 'env> Scope<'scope, 'env> {
    /// Starts [`Group::all_sum`](crate::Group::all_sum) on `data`.
    ///
    /// # Errors
    ///
    /// Only if the loop thread cannot be started; the collective's own errors come from
    /// [`Pending::wait`].
    pub fn start_all_sum<T: Plain>(&self, data: &'scope mut [T]) -> Result<Pending<'scope>> {
        self.start_all_reduce(ReduceOp::Sum, data)
    }

    /// Starts [`Group::all_max`](crate::Group::all_max) on `data`.
    ///
    /// # Errors
    ///
    /// As [`Scope::start_all_sum`].
    pub fn start_all_max<T: Plain>(&self, data: &'scope mut [T]) -> Result<Pending<'scope>> {
        self.start_all_reduce(ReduceOp::Max, data)
    }

    /// Starts [`Group::all_min`](crate::Group::all_min) on `data`.
    ///
    /// # Errors
    ///
    /// As [`Scope::start_all_sum`].
    pub fn start_all_min<T: Plain>(&self, data: &'scope mut [T]) -> Result<Pending<'scope>> {
        self.start_all_reduce(ReduceOp::Min, data)
    }

    /// Starts [`Group::all_reduce`](crate::Group::all_reduce) with `op` on `data`.
    ///
    /// # Errors
    ///
    /// As [`Scope::start_all_sum`].
    pub fn start_all_reduce<T: Plain>(
        &self,
        op: ReduceOp,
        data: &'scope mut [T],
    ) -> Result<Pending<'scope>> {
        self.start_in_place(data, |dtype, data| Op::Reduce { op, dtype, data })
    }

    /// Starts [`Group::all_gather`](crate::Group::all_gather) of `input` into `output`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if `output` does not hold `size() * input.len()`
    /// elements (nothing is started); otherwise as [`Scope::start_all_sum`].
    pub fn start_all_gather<T: Plain>(
        &self,
        input: &'scope [T],
        output: &'scope mut [T],
    ) -> Result<Pending<'scope>> {
        self.start_blocks("start_all_gather", Blocks::Gather, input, output)
    }

    /// Starts [`Group::sum_scatter`](crate::Group::sum_scatter) of `input` into `output`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if `input` does not hold `size() * output.len()` elements
    /// (nothing is started); otherwise as [`Scope::start_all_sum`].
    pub fn start_sum_scatter<T: Plain>(
        &self,
        input: &'scope [T],
        output: &'scope mut [T],
    ) -> Result<Pending<'scope>> {
        self.start_blocks("start_sum_scatter", Blocks::Scatter, input, output)
    }

    /// Starts the gather or scatter `call` (`blocks` says which) of `input` into `output`,
    /// once their lengths are checked; in a group of one, copies `input` and starts nothing.
    fn start_blocks<T: Plain>(
        &self,
        call: &str,
        blocks: Blocks,
        input: &'scope [T],
        output: &'scope mut [T],
    ) -> Result<Pending<'scope>> {
        check_blocks(call, blocks, input.len(), output.len(), self.comm.size())?;
        self.start_copying(input, output, |dtype, input, output| match blocks {
            Blocks::Gather => Op::Gather {
                dtype,
                input,
                output,
            },
            Blocks::Scatter => Op::SumScatter {
                dtype,
                input,
                output,
            },
        })
    }

    /// Starts [`Group::send`](crate::Group::send) of `data` to rank `dst`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a rank out of range or this rank itself (nothing is
    /// started); the ring's refusal of a rank that is not a neighbour comes from
    /// [`Pending::wait`]. Otherwise as [`Scope::start_all_sum`].
    pub fn start_send<T: Plain>(&self, data: &'scope [T], dst: usize) -> Result<Pending<'scope>> {
        crate::comm::check_peer(&**self.comm, "send to", dst)?;
        let data = self.lender.lend(T::as_wire(data));
        self.submit(Op::Send {
            dtype: T::DTYPE,
            data,
            peer: dst,
        })
    }

    /// Starts [`Group::recv`](crate::Group::recv) of `data.len()` elements from rank `src`.
    ///
    /// # Errors
    ///
    /// As [`Scope::start_send`].
    pub fn start_recv<T: Plain>(
        &self,
        data: &'scope mut [T],
        src: usize,
    ) -> Result<Pending<'scope>> {
        // A group of one has no rank to receive from: past the check there are two or more.
        crate::comm::check_peer(&**self.comm, "receive from", src)?;
        self.start_in_place(data, |dtype, data| Op::Recv {
            dtype,
            data,
            peer: src,
        })
    }

    /// Starts [`Group::barrier`](crate::Group::barrier).
    ///
    /// # Errors
    ///
    /// As [`Scope::start_all_sum`].
    pub fn start_barrier(&self) -> Result<Pending<'scope>> {
        if self.comm.size() == 1 {
            return Ok(Pending::ready(Ok(())));
        }
        self.submit(Op::Barrier)
    }

    /// Starts [`Group::broadcast`](crate::Group::broadcast) of rank `root`'s `data`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if `root` is not a rank of the group (nothing is
    /// started); otherwise as [`Scope::start_all_sum`].
    pub fn start_broadcast<T: Plain>(
        &self,
        data: &'scope mut [T],
        root: usize,
    ) -> Result<Pending<'scope>> {
        let size = self.comm.size();
        if root >= size {
            return Err(Error::invalid(format!(
                "start_broadcast: root {root} is not a rank of this group, which has ranks 0 \
                 to {}",
                size - 1
            )));
        }
        self.start_in_place(data, |dtype, data| Op::Broadcast { dtype, data, root })
    }

    /// Starts [`Group::all_to_all`](crate::Group::all_to_all) of `input` into `output`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if the lengths differ or do not split into `size()`
    /// equal blocks (nothing is started); otherwise as [`Scope::start_all_sum`].
    pub fn start_all_to_all<T: Plain>(
        &self,
        input: &'scope [T],
        output: &'scope mut [T],
    ) -> Result<Pending<'scope>> {
        let size = self.comm.size();
        if input.len() != output.len() || !input.len().is_multiple_of(size) {
            return Err(Error::invalid(format!(
                "start_all_to_all: input {} and output {} elements must be equal and split \
                 into {size} equal blocks",
                input.len(),
                output.len()
            )));
        }
        self.start_copying(input, output, |dtype, input, output| Op::AllToAll {
            dtype,
            input,
            output,
        })
    }

    /// Starts the operation `op` makes of `data` (lent, with its dtype), which it reads and
    /// writes in place; in a group of one, where `data` is already the result, starts
    /// nothing.
    fn start_in_place<T: Plain>(
        &self,
        data: &'scope mut [T],
        op: impl FnOnce(DType, LoanMut) -> Op,
    ) -> Result<Pending<'scope>> {
        if self.comm.size() == 1 {
            return Ok(Pending::ready(Ok(())));
        }
        let data = self.lender.lend_mut(T::wire_mut(data));
        self.submit(op(T::DTYPE, data))
    }

    /// Starts the operation `op` makes of `input` and `output` (lent, with their dtype),
    /// whose lengths the caller checked; in a group of one, copies `input` to `output` and
    /// starts nothing.
    fn start_copying<T: Plain>(
        &self,
        input: &'scope [T],
        output: &'scope mut [T],
        op: impl FnOnce(DType, Loan, LoanMut) -> Op,
    ) -> Result<Pending<'scope>> {
        if self.comm.size() == 1 {
            output.copy_from_slice(input);
            return Ok(Pending::ready(Ok(())));
        }
        let input = self.lender.lend(T::as_wire(input));
        let output = self.lender.lend_mut(T::wire_mut(output));
        self.submit(op(T::DTYPE, input, output))
    }

    fn submit(&self, op: Op) -> Result<Pending<'scope>> {
        let engine = self.nb.engine(self.comm)?;
        let shared: &'env Shared = &engine.shared;
        let mut state = shared.lock();
        if state.dead {
            return Err(loop_died(op.phase()));
        }
        let index = match state.free.pop() {
            Some(index) => index,
            None => {
                state.slots.push(Slot::Free);
                state.slots.len() - 1
            }
        };
        if let Some(slot) = state.slots.get_mut(index) {
            *slot = Slot::Busy { detached: false };
        }
        state.queue.push_back((index, op));
        state.issued += 1;
        drop(state);
        shared.work.notify_one();
        Ok(Pending {
            inner: Inner::Queued { shared, index },
        })
    }
}

enum Inner<'scope> {
    /// Finished when it was started (a group of one); `None` once taken.
    Ready(Option<Result<()>>),
    /// In the loop's queue, or finished there; `index` is its slot.
    Queued {
        shared: &'scope Shared,
        index: usize,
    },
    /// Waited for already.
    Taken,
}

/// A started nonblocking operation (see [`Scope`]). Dropping it unwaited is allowed: the
/// operation still runs, and the scope still waits for it. Forgetting it
/// (`std::mem::forget`) is safe too, and the scope still waits, but its place in the
/// group's queue is never reused.
#[must_use = "an unwaited operation's error is lost; call wait()"]
pub struct Pending<'scope> {
    inner: Inner<'scope>,
}

impl fmt::Debug for Pending<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pending")
            .field("done", &self.is_done())
            .finish()
    }
}

impl Pending<'_> {
    fn ready(result: Result<()>) -> Self {
        Pending {
            inner: Inner::Ready(Some(result)),
        }
    }

    /// Whether the operation has finished (successfully or not); never blocks.
    pub fn is_done(&self) -> bool {
        match &self.inner {
            Inner::Ready(_) | Inner::Taken => true,
            Inner::Queued { shared, index } => {
                let state = shared.lock();
                matches!(state.slots.get(*index), Some(Slot::Done(_)) | None)
            }
        }
    }

    /// [`Pending::is_done`], by MPI's name (`MPI_Test`).
    pub fn test(&self) -> bool {
        self.is_done()
    }

    /// Waits for the operation to finish and returns its outcome.
    ///
    /// # Errors
    ///
    /// The collective's error, as its blocking form returns it (the peer, the call and
    /// what went wrong); [`Error::Aborted`] or [`Error::GroupClosed`] if the group was
    /// closed while the operation was in flight or queued.
    pub fn wait(mut self) -> Result<()> {
        match std::mem::replace(&mut self.inner, Inner::Taken) {
            Inner::Ready(result) => result.unwrap_or(Ok(())),
            Inner::Taken => Ok(()),
            Inner::Queued { shared, index } => {
                let mut state = shared.lock();
                loop {
                    let dead = state.dead;
                    match state.slots.get_mut(index) {
                        Some(slot) if matches!(slot, Slot::Done(_)) => {
                            let done = std::mem::replace(slot, Slot::Free);
                            state.free.push(index);
                            return match done {
                                Slot::Done(result) => result,
                                _ => Err(loop_died(Phase::AllSum)),
                            };
                        }
                        Some(_) if !dead => state = shared.wait_done(state),
                        _ => return Err(loop_died(Phase::AllSum)),
                    }
                }
            }
        }
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        let Inner::Queued { shared, index } = self.inner else {
            return;
        };
        let mut state = shared.lock();
        match state.slots.get_mut(index) {
            Some(slot @ Slot::Done(_)) => {
                *slot = Slot::Free;
                state.free.push(index);
            }
            Some(Slot::Busy { detached }) => *detached = true,
            _ => {}
        }
    }
}
