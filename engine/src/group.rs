//! [`Group`]: the typed collectives every backend offers, over the byte-level
//! [`Communicator`] each backend implements, and the process's default group that the free
//! functions use, as `mx.distributed` does.

use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use crate::comm::{Blocks, Communicator, Transport, check_blocks};
use crate::config::hostfile::RingAddresses;
use crate::element::{DType, Element};
use crate::error::{Error, Result};
use crate::nonblocking::{self, Nonblocking, Scope};
use crate::options::Options;
use crate::recorder::{Call, FlightOp, FlightRecord, Recorded};
use crate::reduce::ReduceOp;

/// A group of ranks that run collectives together. Cheap to clone; every clone is the same
/// group.
///
/// # Order, and threads
///
/// Collectives on one group must be issued in the same order on every rank, with the same
/// lengths, dtypes and ops: the k-th call on one rank pairs with the k-th call on every
/// other. What a mismatch (another collective, length, dtype or op) does depends on the
/// backend ([`Backend`](crate::Backend)):
///
/// - On **MLX's wire** (the default) and on **JACCL**, messages carry element bytes only,
///   so a mismatch is not detected: it returns `Ok` with wrong data, and every later call on
///   the group is wrong too, because the ranks no longer agree where one call's bytes end.
///   Such a group cannot be put back in step: [`close`](Group::close) it on every rank and
///   form a new one.
/// - On the **native wire** every message has a header (the call's number, kind, op, dtype
///   and length), checked before its data is used: the call fails on every rank involved
///   with [`Error::Mismatch`] naming both calls, and the group is failed.
///
/// A group may be used from several threads, but its collectives then run one at a time in
/// whatever order the threads reach it, which differs from rank to rank: thread 0's call on
/// one rank pairs with thread 1's on another. With equal lengths nothing on any wire can
/// tell, and the results are silently mixed up (measured on MLX's wire: 1221 of 2000 calls
/// paired across threads); with different lengths they are silently wrong on MLX's wire
/// (1993 of 2000) and the stream is out of step for every later call, while the native wire
/// fails them as a mismatch. So:
///
/// - issue all collectives of a group from one thread (other threads hand it their work), or
/// - give each thread its own group: form one per thread with
///   [`init_with`](crate::init_with) on its own ports, or [`split`](Group::split) a group
///   (with the same color everywhere) once per thread.
///
/// Two threads may still share a group for [`Group::close`] and [`Group::health`], which
/// never wait for a collective in flight (see each).
#[derive(Clone)]
pub struct Group {
    /// The backend's communicator behind the group's flight recorder.
    comm: Arc<Recorded>,
    rank: usize,
    size: usize,
    /// The loop thread and queue of nonblocking collectives, shared by every clone.
    nb: Arc<Nonblocking>,
    /// How the group was formed, for [`Group::split`]; `None` for groups over other
    /// communicators.
    origin: Option<Arc<Origin>>,
}

impl fmt::Debug for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Group")
            .field("backend", &self.comm.backend())
            .field("rank", &self.rank)
            .field("size", &self.size)
            .finish()
    }
}

impl Group {
    /// The group of this process alone: collectives return their input; `send` and `recv`
    /// are errors.
    ///
    /// # Examples
    ///
    /// ```
    /// use nuvec_distributed_engine::Group;
    ///
    /// let group = Group::single();
    /// assert_eq!((group.rank(), group.size(), group.backend()), (0, 1, "single"));
    /// let mut x = [1.5f32, -2.0];
    /// group.all_sum(&mut x)?; // the sum over one rank is the input
    /// assert_eq!(x, [1.5, -2.0]);
    /// assert!(group.send(&x, 1).is_err()); // there is no one to send to
    /// # Ok::<(), nuvec_distributed_engine::Error>(())
    /// ```
    pub fn single() -> Group {
        Group::new(Arc::new(Single))
    }

    /// A group over a backend's communicator. Its flight recorder keeps the last
    /// [`DEFAULT_FLIGHT_RECORDS`](crate::DEFAULT_FLIGHT_RECORDS) calls and, when a call
    /// fails the group, writes them into [`FLIGHT_DIR_VAR`](crate::FLIGHT_DIR_VAR) if that
    /// is set; [`Group::with_options`] chooses both.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use nuvec_distributed_engine::{Communicator, DType, Error, Group, ReduceOp, Result};
    ///
    /// /// A backend of one rank that keeps every buffer as it is.
    /// #[derive(Debug)]
    /// struct Alone;
    ///
    /// impl Communicator for Alone {
    ///     fn rank(&self) -> usize { 0 }
    ///     fn size(&self) -> usize { 1 }
    ///     fn backend(&self) -> &'static str { "alone" }
    ///     fn all_reduce(&self, _: ReduceOp, _: DType, _: &mut [u8]) -> Result<()> { Ok(()) }
    ///     fn all_gather(&self, input: &[u8], output: &mut [u8]) -> Result<()> {
    ///         output.copy_from_slice(input);
    ///         Ok(())
    ///     }
    ///     fn sum_scatter(&self, _: DType, input: &[u8], output: &mut [u8]) -> Result<()> {
    ///         output.copy_from_slice(input);
    ///         Ok(())
    ///     }
    ///     fn send(&self, _: &[u8], _: usize) -> Result<()> { Err(Error::Unsupported("no peers".into())) }
    ///     fn recv(&self, _: &mut [u8], _: usize) -> Result<()> { Err(Error::Unsupported("no peers".into())) }
    ///     fn barrier(&self) -> Result<()> { Ok(()) }
    ///     fn health(&self) -> Result<()> { Ok(()) }
    ///     fn close(&self) -> Result<()> { Ok(()) }
    /// }
    ///
    /// let group = Group::new(Arc::new(Alone));
    /// assert_eq!((group.rank(), group.size(), group.backend()), (0, 1, "alone"));
    /// let mut out = [0u16; 2];
    /// group.all_gather(&[7u16, 8], &mut out)?;
    /// assert_eq!(out, [7, 8]);
    /// # Ok::<(), nuvec_distributed_engine::Error>(())
    /// ```
    pub fn new(comm: Arc<dyn Communicator>) -> Group {
        Group::with_options(comm, &Options::default())
    }

    /// [`Group::new`] with the options a group reads after it formed: its flight recorder's
    /// ([`Options::flight_records`], [`Options::flight_dir`]). The others say how a TCP
    /// group forms, which `comm` already did, and are not read.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use nuvec_distributed_engine::{Communicator, DType, Group, Options, ReduceOp, Result};
    ///
    /// // A backend of two ranks whose collectives return at once (see `Group::new`).
    /// #[derive(Debug)]
    /// struct Idle;
    ///
    /// impl Communicator for Idle {
    ///     fn rank(&self) -> usize { 0 }
    ///     fn size(&self) -> usize { 2 }
    ///     fn backend(&self) -> &'static str { "idle" }
    ///     fn all_reduce(&self, _: ReduceOp, _: DType, _: &mut [u8]) -> Result<()> { Ok(()) }
    ///     fn all_gather(&self, _: &[u8], _: &mut [u8]) -> Result<()> { Ok(()) }
    ///     fn sum_scatter(&self, _: DType, _: &[u8], _: &mut [u8]) -> Result<()> { Ok(()) }
    ///     fn send(&self, _: &[u8], _: usize) -> Result<()> { Ok(()) }
    ///     fn recv(&self, _: &mut [u8], _: usize) -> Result<()> { Ok(()) }
    ///     fn barrier(&self) -> Result<()> { Ok(()) }
    ///     fn health(&self) -> Result<()> { Ok(()) }
    ///     fn close(&self) -> Result<()> { Ok(()) }
    /// }
    ///
    /// let kept = Group::with_options(Arc::new(Idle), &Options::default().flight_records(2));
    /// let off = Group::with_options(Arc::new(Idle), &Options::default().flight_records(0));
    /// for _ in 0..3 {
    ///     kept.barrier()?;
    ///     off.barrier()?;
    /// }
    /// let record = kept.flight_record();
    /// assert_eq!((record.calls, record.entries.len()), (3, 2)); // the last two of three
    /// assert!(off.flight_record().entries.is_empty()); // the recorder is off
    /// # Ok::<(), nuvec_distributed_engine::Error>(())
    /// ```
    pub fn with_options(comm: Arc<dyn Communicator>, options: &Options) -> Group {
        let (rank, size) = (comm.rank(), comm.size());
        let comm = Arc::new(Recorded::new(comm, options));
        Group {
            comm,
            rank,
            size,
            nb: Arc::new(Nonblocking::new()),
            origin: None,
        }
    }

    /// This process's rank, from 0.
    ///
    /// # Examples
    ///
    /// ```
    /// # nuvec_tools::testing::two_ranks(|group| {
    /// // On each rank of a group of two (formed as in `init_with`'s example):
    /// assert!(group.rank() < group.size());
    /// // Ranks are numbered in hostfile order: the other rank is the one this rank is not.
    /// let other = 1 - group.rank();
    /// assert_ne!(other, group.rank());
    /// # Ok(()) });
    /// ```
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    ///
    /// # Examples
    ///
    /// ```
    /// # nuvec_tools::testing::two_ranks(|group| {
    /// // On each rank of a group of two (formed as in `init_with`'s example):
    /// assert_eq!(group.size(), 2);
    /// # Ok(()) });
    /// ```
    pub fn size(&self) -> usize {
        self.size
    }

    /// The backend's name: `"ring"` (MLX's wire over TCP), `"native"` (the native wire, over
    /// TCP, shared memory or both: [`Group::transport`] says which per peer), `"jaccl"`, or
    /// `"single"` for the group of one.
    ///
    /// # Examples
    ///
    /// ```
    /// # nuvec_tools::testing::two_ranks(|group| {
    /// // On each rank of a group of two (formed as in `init_with`'s example):
    /// assert_eq!(group.backend(), "ring");
    /// assert_eq!(nuvec_distributed_engine::Group::single().backend(), "single");
    /// # Ok(()) });
    /// ```
    pub fn backend(&self) -> &'static str {
        self.comm.backend()
    }

    /// Sums `data` element-wise across ranks, in place; every rank gets the same bits.
    ///
    /// # Errors
    ///
    /// A transport error names the peer; afterwards the group is failed.
    ///
    /// # Examples
    ///
    /// ```
    /// # nuvec_tools::testing::two_ranks(|group| {
    /// // On each rank of a group of two (formed as in `init_with`'s example):
    /// // Rank 0 holds [1, 2, 3] and rank 1 holds [10, 20, 30]; both end with the sum.
    /// let scale = if group.rank() == 0 { 1.0 } else { 10.0 };
    /// let mut x = [1.0f32, 2.0, 3.0].map(|v| v * scale);
    /// group.all_sum(&mut x)?;
    /// assert_eq!(x, [11.0, 22.0, 33.0]);
    /// # Ok(()) });
    /// ```
    pub fn all_sum<T: Element>(&self, data: &mut [T]) -> Result<()> {
        self.all_reduce(ReduceOp::Sum, data)
    }

    /// Element-wise maximum across ranks, in place.
    ///
    /// # Errors
    ///
    /// As [`Group::all_sum`].
    ///
    /// # Examples
    ///
    /// ```
    /// # nuvec_tools::testing::two_ranks(|group| {
    /// // On each rank of a group of two (formed as in `init_with`'s example):
    /// let mut x = if group.rank() == 0 { [1i32, 50] } else { [9, -4] };
    /// group.all_max(&mut x)?;
    /// assert_eq!(x, [9, 50]);
    /// # Ok(()) });
    /// ```
    pub fn all_max<T: Element>(&self, data: &mut [T]) -> Result<()> {
        self.all_reduce(ReduceOp::Max, data)
    }

    /// Element-wise minimum across ranks, in place.
    ///
    /// # Errors
    ///
    /// As [`Group::all_sum`].
    ///
    /// # Examples
    ///
    /// ```
    /// # nuvec_tools::testing::two_ranks(|group| {
    /// // On each rank of a group of two (formed as in `init_with`'s example):
    /// use nuvec_distributed_engine::f16;
    ///
    /// let mine = if group.rank() == 0 { 0.5 } else { -3.0 };
    /// let mut x = [f16::from_f32(mine); 4];
    /// group.all_min(&mut x)?;
    /// assert_eq!(x, [f16::from_f32(-3.0); 4]);
    /// # Ok(()) });
    /// ```
    pub fn all_min<T: Element>(&self, data: &mut [T]) -> Result<()> {
        self.all_reduce(ReduceOp::Min, data)
    }

    /// Reduces `data` in place with `op` across ranks.
    ///
    /// # Errors
    ///
    /// As [`Group::all_sum`].
    ///
    /// # Examples
    ///
    /// ```
    /// # nuvec_tools::testing::two_ranks(|group| {
    /// // On each rank of a group of two (formed as in `init_with`'s example):
    /// use nuvec_distributed_engine::ReduceOp;
    ///
    /// // The op chosen at run time; every rank must pass the same one.
    /// let mut x = [group.rank() as u64 + 1; 3];
    /// group.all_reduce(ReduceOp::Max, &mut x)?;
    /// assert_eq!(x, [2; 3]);
    /// # Ok(()) });
    /// ```
    pub fn all_reduce<T: Element>(&self, op: ReduceOp, data: &mut [T]) -> Result<()> {
        self.nb.settle(); // nonblocking operations go first: see `scope`
        if self.size == 1 {
            return Ok(());
        }
        T::with_wire_mut(data, |bytes| self.comm.all_reduce(op, T::DTYPE, bytes))
    }

    /// [`Group::all_reduce`] over untyped memory: `data` holds elements of `dtype`, in
    /// native byte order, reduced in place without a copy. For callers whose buffers carry
    /// their element type at run time (nuvec's arrays, through `nuvec-distributed`). A
    /// `bool` element is a byte; the result holds 0 or 1 wherever every rank's input did.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if `data.len()` is not a multiple of `dtype.size()` (the
    /// group stays usable); otherwise as [`Group::all_sum`].
    ///
    /// # Examples
    ///
    /// ```
    /// use nuvec_distributed_engine::{DType, Group, ReduceOp};
    ///
    /// let group = Group::single();
    /// let mut bytes = 1.5f32.to_ne_bytes();
    /// group.all_reduce_bytes(ReduceOp::Sum, DType::F32, &mut bytes)?;
    /// assert_eq!(f32::from_ne_bytes(bytes), 1.5); // a group of one keeps its input
    /// assert!(group.all_reduce_bytes(ReduceOp::Sum, DType::F32, &mut [0; 3]).is_err());
    /// # Ok::<(), nuvec_distributed_engine::Error>(())
    /// ```
    pub fn all_reduce_bytes(&self, op: ReduceOp, dtype: DType, data: &mut [u8]) -> Result<()> {
        self.nb.settle(); // nonblocking operations go first: see `scope`
        if !data.len().is_multiple_of(dtype.size()) {
            return Err(Error::invalid(format!(
                "all_reduce: {} bytes are not a whole number of {} elements ({} bytes each)",
                data.len(),
                dtype.name(),
                dtype.size()
            )));
        }
        if self.size == 1 {
            return Ok(());
        }
        self.comm.all_reduce(op, dtype, data)
    }

    /// Gathers every rank's `input` into `output` in rank order; `output` holds
    /// `size() * input.len()` elements.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if `output` has the wrong length (the group stays usable);
    /// otherwise as [`Group::all_sum`].
    ///
    /// # Examples
    ///
    /// ```
    /// # nuvec_tools::testing::two_ranks(|group| {
    /// // On each rank of a group of two (formed as in `init_with`'s example):
    /// let mine = [group.rank() as u8; 2];
    /// let mut all = vec![0u8; 2 * group.size()];
    /// group.all_gather(&mine, &mut all)?;
    /// assert_eq!(all, [0, 0, 1, 1]); // rank 0's block, then rank 1's
    ///
    /// // An output of the wrong length is refused, and the group stays usable.
    /// let err = group.all_gather(&mine, &mut [0u8; 3]).unwrap_err();
    /// assert_eq!(err.fault(), nuvec_distributed_engine::Fault::Misuse);
    /// # Ok(()) });
    /// ```
    pub fn all_gather<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<()> {
        self.nb.settle(); // nonblocking operations go first: see `scope`
        check_blocks(
            "all_gather",
            Blocks::Gather,
            input.len(),
            output.len(),
            self.size,
        )?;
        self.input_to_output(FlightOp::AllGather, input, output, |c, input, out| {
            c.all_gather(input, out)
        })
    }

    /// Runs `collective` from `input` into `output` as wire bytes, recorded as `op`; in a
    /// group of one the output is the input.
    fn input_to_output<T: Element>(
        &self,
        op: FlightOp,
        input: &[T],
        output: &mut [T],
        collective: impl FnOnce(&dyn Communicator, &[u8], &mut [u8]) -> Result<()>,
    ) -> Result<()> {
        if self.size == 1 {
            output.copy_from_slice(input);
            return Ok(());
        }
        let call = Call::new(op, Some(T::DTYPE), size_of_val(input));
        T::with_wire_mut(output, |out| {
            self.comm
                .call(call, |c| collective(c, T::as_wire(input), out))
        })
    }

    /// Sums `input` across ranks and keeps this rank's block: `output` gets elements
    /// `[rank * k, (rank + 1) * k)` of the sum, where `k = output.len()` and
    /// `input.len() == size() * k`.
    ///
    /// MLX's own ring refuses `sum_scatter`; on the ring this works between nuvec ranks only.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if the lengths do not match; otherwise as
    /// [`Group::all_sum`].
    ///
    /// # Examples
    ///
    /// ```
    /// # nuvec_tools::testing::two_ranks(|group| {
    /// // On each rank of a group of two (formed as in `init_with`'s example):
    /// // Both ranks contribute [1, 2, 3, 4]; the sum is [2, 4, 6, 8], rank 0 keeps the first
    /// // half and rank 1 the second.
    /// let input = [1.0f64, 2.0, 3.0, 4.0];
    /// let mut mine = [0.0; 2];
    /// group.sum_scatter(&input, &mut mine)?;
    /// assert_eq!(mine, if group.rank() == 0 { [2.0, 4.0] } else { [6.0, 8.0] });
    /// # Ok(()) });
    /// ```
    pub fn sum_scatter<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<()> {
        self.nb.settle(); // nonblocking operations go first: see `scope`
        check_blocks(
            "sum_scatter",
            Blocks::Scatter,
            input.len(),
            output.len(),
            self.size,
        )?;
        if self.size == 1 {
            output.copy_from_slice(input);
            return Ok(());
        }
        T::with_wire_mut(output, |out| {
            self.comm.sum_scatter(T::DTYPE, T::as_wire(input), out)
        })
    }

    /// Sends `data` to rank `dst`, which must `recv` the same number of elements.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a rank out of range or this rank itself, and on the
    /// ring for a rank that is not a neighbour; otherwise as [`Group::all_sum`].
    ///
    /// # Examples
    ///
    /// ```
    /// # nuvec_tools::testing::two_ranks(|group| {
    /// // On each rank of a group of two (formed as in `init_with`'s example):
    /// // Rank 0 sends, rank 1 receives the same number of elements.
    /// if group.rank() == 0 {
    ///     group.send(&[3i16, 1, 4], 1)?;
    /// } else {
    ///     let mut got = [0i16; 3];
    ///     group.recv(&mut got, 0)?;
    ///     assert_eq!(got, [3, 1, 4]);
    /// }
    /// # Ok(()) });
    /// ```
    pub fn send<T: Element>(&self, data: &[T], dst: usize) -> Result<()> {
        self.nb.settle(); // nonblocking operations go first: see `scope`
        self.check_peer("send to", dst)?;
        let call = Call::new(FlightOp::Send, Some(T::DTYPE), size_of_val(data)).with_peer(dst);
        self.comm.call(call, |c| c.send(T::as_wire(data), dst))
    }

    /// Receives `data.len()` elements from rank `src`.
    ///
    /// # Errors
    ///
    /// As [`Group::send`].
    ///
    /// # Examples
    ///
    /// ```
    /// # nuvec_tools::testing::two_ranks(|group| {
    /// // On each rank of a group of two (formed as in `init_with`'s example):
    /// // Each rank sends its rank to the other: one sends first, the other receives first.
    /// let other = 1 - group.rank();
    /// let mut got = [0u32];
    /// if group.rank() == 0 {
    ///     group.send(&[0u32], other)?;
    ///     group.recv(&mut got, other)?;
    /// } else {
    ///     group.recv(&mut got, other)?;
    ///     group.send(&[1u32], other)?;
    /// }
    /// assert_eq!(got, [other as u32]);
    /// # Ok(()) });
    /// ```
    pub fn recv<T: Element>(&self, data: &mut [T], src: usize) -> Result<()> {
        self.nb.settle(); // nonblocking operations go first: see `scope`
        self.check_peer("receive from", src)?;
        let call = Call::new(FlightOp::Recv, Some(T::DTYPE), size_of_val(data)).with_peer(src);
        T::with_wire_mut(data, |bytes| self.comm.call(call, |c| c.recv(bytes, src)))
    }

    /// Returns once every rank has entered the barrier.
    ///
    /// # Errors
    ///
    /// As [`Group::all_sum`].
    ///
    /// # Examples
    ///
    /// ```
    /// # nuvec_tools::testing::two_ranks(|group| {
    /// // On each rank of a group of two (formed as in `init_with`'s example):
    /// use std::time::{Duration, Instant};
    ///
    /// // Rank 1 arrives late; rank 0 waits for it in the barrier.
    /// let start = Instant::now();
    /// if group.rank() == 1 {
    ///     std::thread::sleep(Duration::from_millis(50));
    /// }
    /// group.barrier()?;
    /// assert!(start.elapsed() >= Duration::from_millis(50));
    /// # Ok(()) });
    /// ```
    pub fn barrier(&self) -> Result<()> {
        self.nb.settle(); // nonblocking operations go first: see `scope`
        if self.size == 1 {
            return Ok(());
        }
        self.comm.barrier()
    }

    /// Checks every connection of the group without running a collective, and names a peer
    /// that is gone.
    ///
    /// Never waits for a collective running on another thread: while one runs, it does not
    /// probe the connections (the collective is watching them) and reports only what is
    /// already known: an error if the group is closed or failed, else `Ok`.
    ///
    /// # Errors
    ///
    /// The transport error of the first lost peer; afterwards the group is failed.
    /// [`Error::GroupClosed`] or [`Error::Failed`] for a group closed or failed earlier.
    ///
    /// # Examples
    ///
    /// ```
    /// # nuvec_tools::testing::two_ranks(|group| {
    /// // On each rank of a group of two (formed as in `init_with`'s example):
    /// // Between collectives, check that the other rank is still there.
    /// group.health()?;
    /// group.barrier()?; // neither rank closes before both have checked
    /// group.all_sum(&mut [1u8])?;
    /// # Ok(()) });
    /// ```
    pub fn health(&self) -> Result<()> {
        self.comm.health()
    }

    /// Closes the group: releases its connections and buffers, so that a new group can be
    /// formed in the same processes (for example after a peer was lost). Every later call on
    /// this group or its clones fails with [`Error::GroupClosed`]. Neighbours see the
    /// connections close, and name this rank as the one that left. If
    /// [`init`](crate::init) formed this group, a later `init` forms a new one.
    ///
    /// May be called from any thread, to cancel: a collective in flight on another thread
    /// returns [`Error::Aborted`] at once (well under 100 ms: the ring wakes its poller, JACCL
    /// naps at most 1 ms), and `close` returns once it has let go and everything is released.
    /// A collective whose data had all moved before the close returns `Ok`. The abort blames
    /// no peer and sends no failure notice.
    ///
    /// # Errors
    ///
    /// None at present; the `Result` leaves room for backends whose teardown can fail.
    ///
    /// # Examples
    ///
    /// ```
    /// # nuvec_tools::testing::two_ranks(|group| {
    /// // On each rank of a group of two (formed as in `init_with`'s example):
    /// use nuvec_distributed_engine::{Error, Fault};
    ///
    /// group.barrier()?;
    /// group.close()?;
    /// // Every later call fails, on this handle and on every clone.
    /// let err = group.clone().all_sum(&mut [1.0f32]).unwrap_err();
    /// assert!(matches!(err, Error::GroupClosed));
    /// assert_eq!(err.fault(), Fault::Closed);
    /// group.close()?; // closing twice is not an error
    /// # Ok(()) });
    /// ```
    pub fn close(&self) -> Result<()> {
        self.comm.close()
    }

    // ---- Nonblocking collectives: see `crate::nonblocking` ----

    /// Runs `f` with a [`Scope`] that starts nonblocking collectives on buffers borrowed for
    /// the whole scope, and returns once every operation started in it has finished (also
    /// if `f` panics, or drops or forgets handles unwaited), like [`std::thread::scope`].
    ///
    /// The operations run in the order they were started on the group's own loop thread
    /// while `f` goes on. A blocking collective on this group first waits for every
    /// outstanding one. The [`Pending`](crate::Pending) handles say when an operation is
    /// done and return its error. See [`Scope`] for the
    /// rules, and why the buffers are borrowed by a scope rather than by the handle.
    ///
    /// # Examples
    ///
    /// ```
    /// # nuvec_tools::testing::two_ranks(|group| {
    /// // On each rank of a group of two (formed as in `init_with`'s example):
    /// let mut weights = vec![group.rank() as f32; 1 << 16];
    /// let mut gathered = [0u32; 2];
    /// let mine = [group.rank() as u32];
    /// let busy = group.scope(|s| {
    ///     let sum = s.start_all_sum(&mut weights)?;
    ///     let gather = s.start_all_gather(&mine, &mut gathered)?;
    ///     // Compute while both run on the loop thread.
    ///     let busy: u64 = (0..100_000u64).map(|i| i % 7).sum();
    ///     gather.wait()?; // any order
    ///     sum.wait()?;
    ///     Ok::<_, nuvec_distributed_engine::Error>(busy)
    /// })?;
    /// assert!(busy > 0);
    /// assert_eq!(weights[0], 1.0);
    /// assert_eq!(gathered, [0, 1]);
    /// # Ok(()) });
    /// ```
    pub fn scope<'env, R>(&'env self, f: impl for<'scope> FnOnce(&Scope<'scope, 'env>) -> R) -> R {
        nonblocking::scope(&self.comm, &self.nb, f)
    }

    /// A copy of the group's flight recorder: its last calls (up to
    /// [`Options::flight_records`], default
    /// [`DEFAULT_FLIGHT_RECORDS`](crate::DEFAULT_FLIGHT_RECORDS)), oldest first, each with
    /// its number, op, element type, length, peer or root, algorithm, transport, start and
    /// end times and outcome. Every call that moves data is recorded when it reaches the backend,
    /// blocking or not; calls refused for their arguments, and the calls of a group of one,
    /// are not. A call still running on another thread shows as
    /// [`FlightOutcome::Running`](crate::FlightOutcome::Running).
    ///
    /// When a call fails the group, the record is also written to
    /// [`Options::flight_dir`] (or [`FLIGHT_DIR_VAR`](crate::FLIGHT_DIR_VAR)) if set, once
    /// per group, and on SIGUSR1 if [`Options::flight_signal`] says so; `nuvec flight`
    /// compares the records of every rank.
    ///
    /// Recording allocates nothing per call; it takes two clock reads and two uncontended
    /// lock round trips: 60 to 140 ns of CPU per call on the 2-vCPU VM this was measured
    /// on, shared with other work (`cargo bench --bench recorder`, repeated; the clock
    /// reads are about half). Between two
    /// ranks, a 4-byte native all_sum in shared memory took 0.47 µs recorded against 0.41
    /// µs not (the median of 5 interleaved `nuvec bench` runs each); over TCP (25 µs) the
    /// difference was within the runs' spread. A capacity of 0 turns it off.
    ///
    /// # Examples
    ///
    /// ```
    /// # nuvec_tools::testing::two_ranks(|group| {
    /// // On each rank of a group of two (formed as in `init_with`'s example):
    /// use nuvec_distributed_engine::{DType, FlightOp, FlightOutcome, ReduceOp};
    ///
    /// let before = group.flight_record().calls;
    /// group.all_sum(&mut [1.0f32; 8])?;
    /// group.barrier()?;
    /// let record = group.flight_record();
    /// assert_eq!(record.calls, before + 2);
    /// let [.., sum, barrier] = &record.entries[..] else { panic!("two calls were made") };
    /// assert_eq!((sum.seq, sum.op), (before, FlightOp::AllReduce(ReduceOp::Sum)));
    /// assert_eq!(sum.dtype, Some(DType::F32));
    /// assert_eq!((sum.count(), sum.outcome), (Some(8), FlightOutcome::Ok));
    /// assert_eq!(barrier.op, FlightOp::Barrier);
    /// // Save it as JSON for `nuvec flight`, or as a trace for Perfetto:
    /// let (json, trace) = (record.to_json(), record.to_chrome_trace());
    /// # assert!(!json.is_empty() && !trace.is_empty());
    /// # Ok(()) });
    /// ```
    pub fn flight_record(&self) -> FlightRecord {
        self.comm.recorder().snapshot()
    }

    /// Whether the group was closed; the backend cache drops closed groups.
    pub(crate) fn is_closed(&self) -> bool {
        self.comm.is_closed()
    }

    pub(crate) fn check_peer(&self, what: &str, peer: usize) -> Result<()> {
        crate::comm::check_peer(&*self.comm, what, peer)
    }
}

// ---- How a group was formed, for `Group::split` (see `crate::split`) ----

/// How a group was formed, kept with it so that it can be split.
#[derive(Clone, Debug)]
pub(crate) struct Origin {
    /// This rank's listening addresses in the group, one per connection: a sub-group listens
    /// on the same IP addresses, so it reaches its peers over the same links.
    pub(crate) listen: Vec<SocketAddr>,
    /// The options the group was formed with; its sub-groups are formed with them too.
    pub(crate) options: Options,
    /// The group it descends from by [`Group::shrink`](crate::Group::shrink), for
    /// shrinking it again and for [`Group::rejoin`](crate::Group::rejoin).
    pub(crate) lineage: Lineage,
}

/// The group a group was first formed as (by `init` or `init_with`), and how this one
/// descends from it by shrinking.
#[derive(Clone, Debug)]
pub(crate) struct Lineage {
    /// Every rank's addresses in the first group, as written.
    pub(crate) nodes: Vec<Vec<String>>,
    /// Where they come from (a hostfile, or [`hostfile::IN_CODE`](crate::config::hostfile::IN_CODE)), for errors.
    pub(crate) place: std::path::PathBuf,
    /// This rank in the first group.
    pub(crate) rank: usize,
    /// For each rank of this group, its rank in the first group (the identity for the
    /// first group itself).
    pub(crate) members: Vec<usize>,
    /// How many shrinks this group is from the first group: 0 for the first group and for
    /// a rejoined one.
    pub(crate) generation: u64,
    /// The options the first group was formed with.
    pub(crate) options: Options,
}

impl Origin {
    /// The origin of a group formed from `addrs` with `options`: a first group.
    pub(crate) fn new(addrs: &RingAddresses, options: &Options) -> Origin {
        Origin {
            listen: addrs.listen.clone(),
            options: options.clone(),
            lineage: Lineage {
                nodes: addrs.all.clone(),
                place: addrs.origin.clone(),
                rank: addrs.rank,
                members: (0..addrs.size).collect(),
                generation: 0,
                options: options.clone(),
            },
        }
    }
}

impl Group {
    /// This group with its flight recorder set up by `options`, for a backend that formed
    /// it with [`Group::new`]; no call may have been made on it yet.
    #[cfg(feature = "jaccl")]
    pub(crate) fn recording(self, options: &Options) -> Group {
        let group = Group::with_options(self.comm.inner().clone(), options);
        Group {
            origin: self.origin,
            ..group
        }
    }

    /// This group, kept with how it was formed so that it can be split.
    pub(crate) fn with_origin(mut self, origin: Origin) -> Group {
        self.origin = Some(Arc::new(origin));
        self
    }

    /// How this group was formed, if by this crate's TCP formation.
    pub(crate) fn origin(&self) -> Option<&Origin> {
        self.origin.as_deref()
    }
}

// Broadcast, all_to_all and the allocating conveniences.
impl Group {
    /// Copies rank `root`'s `data` into `data` on every other rank; every rank passes the
    /// same length and the same `root`.
    ///
    /// On the native wire a small broadcast goes from the root straight to every rank
    /// (one hop), a large one as a scatter from the root followed by an all-gather among
    /// the other ranks, and a rank that disagrees about the root or the length fails with
    /// [`Error::Mismatch`]. On the MLX wire it is pipelined around the ring from the root:
    /// a schedule of this crate, which MLX ranks cannot take part in (MLX has no
    /// broadcast; an MLX rank in the ring would see bytes it did not expect, and it or its
    /// neighbours fail or wait out their timeout). JACCL refuses it with
    /// [`Error::Unsupported`].
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if `root` is not a rank of the group (the group stays
    /// usable); otherwise as [`Group::all_sum`].
    ///
    /// # Examples
    ///
    /// ```
    /// use nuvec_distributed_engine::Group;
    ///
    /// let group = Group::single();
    /// let mut weights = [0.5f32, 1.5];
    /// group.broadcast(&mut weights, 0)?; // rank 0's weights, on every rank
    /// assert_eq!(weights, [0.5, 1.5]);
    /// assert!(group.broadcast(&mut weights, 1).is_err()); // no rank 1 in a group of one
    /// # Ok::<(), nuvec_distributed_engine::Error>(())
    /// ```
    pub fn broadcast<T: Element>(&self, data: &mut [T], root: usize) -> Result<()> {
        self.nb.settle(); // nonblocking operations go first: see `scope`
        if root >= self.size {
            return Err(Error::invalid(format!(
                "broadcast: root {root} is not a rank of this group, which has ranks 0 to {}",
                self.size - 1
            )));
        }
        if self.size == 1 {
            return Ok(());
        }
        let call =
            Call::new(FlightOp::Broadcast, Some(T::DTYPE), size_of_val(data)).with_peer(root);
        T::with_wire_mut(data, |bytes| {
            self.comm.call(call, |c| c.broadcast(bytes, root))
        })
    }

    /// Exchanges equal blocks between every pair of ranks: `input` and `output` hold
    /// `size()` blocks of `input.len() / size()` elements; block `j` of `input` goes to
    /// rank `j`, and block `i` of `output` is what rank `i` sent to this rank (block
    /// `rank()` is this rank's own, copied).
    ///
    /// On the native wire every rank sends each block straight to its rank (one hop); a
    /// rank that makes another call fails with [`Error::Mismatch`]. On the MLX wire the
    /// blocks travel around the ring in `size() - 1` steps: a schedule of this crate, which
    /// MLX ranks cannot take part in (MLX declined all_to_all; an MLX rank in the ring
    /// would see bytes it did not expect, and it or its neighbours fail or wait out their
    /// timeout). JACCL refuses it with [`Error::Unsupported`].
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if the lengths differ or are not a multiple of `size()`
    /// (the group stays usable); otherwise as [`Group::all_sum`].
    ///
    /// # Examples
    ///
    /// ```
    /// use nuvec_distributed_engine::Group;
    ///
    /// let group = Group::single();
    /// let mut out = [0u32; 2];
    /// group.all_to_all(&[7u32, 8], &mut out)?; // one rank: its one block is its own
    /// assert_eq!(out, [7, 8]);
    /// assert!(group.all_to_all(&[7u32, 8], &mut [0u32; 3]).is_err());
    /// # Ok::<(), nuvec_distributed_engine::Error>(())
    /// ```
    pub fn all_to_all<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<()> {
        self.nb.settle(); // nonblocking operations go first: see `scope`
        if input.len() != output.len() {
            return Err(Error::invalid(format!(
                "all_to_all: the input holds {} elements and the output {}; they must be equal",
                input.len(),
                output.len()
            )));
        }
        if !input.len().is_multiple_of(self.size) {
            return Err(Error::invalid(format!(
                "all_to_all: {} elements do not split into {} equal blocks, one per rank",
                input.len(),
                self.size
            )));
        }
        self.input_to_output(FlightOp::AllToAll, input, output, |c, input, out| {
            c.all_to_all(input, out)
        })
    }

    /// [`Group::all_gather`] into a new vector of `size() * input.len()` elements.
    ///
    /// # Errors
    ///
    /// As [`Group::all_gather`].
    ///
    /// # Examples
    ///
    /// ```
    /// use nuvec_distributed_engine::Group;
    ///
    /// let all = Group::single().all_gather_vec(&[1i8, 2])?;
    /// assert_eq!(all, [1, 2]);
    /// # Ok::<(), nuvec_distributed_engine::Error>(())
    /// ```
    pub fn all_gather_vec<T: Element>(&self, input: &[T]) -> Result<Vec<T>> {
        // Filled with copies of the input: this rank's block is then already in place,
        // and no zero value of `T` is needed.
        let mut output = input.repeat(self.size);
        self.all_gather(input, &mut output)?;
        Ok(output)
    }

    /// [`Group::recv`] of `len` elements from rank `src` into a new vector.
    ///
    /// # Errors
    ///
    /// As [`Group::recv`].
    ///
    /// # Examples
    ///
    /// ```
    /// use nuvec_distributed_engine::Group;
    ///
    /// // A group of one has no one to receive from.
    /// let err = Group::single().recv_vec::<f32>(4, 1).unwrap_err();
    /// assert_eq!(err.fault(), nuvec_distributed_engine::Fault::Misuse);
    /// ```
    pub fn recv_vec<T: Element + Default>(&self, len: usize, src: usize) -> Result<Vec<T>> {
        // Checked before allocating: a wrong rank costs no memory.
        self.check_peer("receive from", src)?;
        let mut data = vec![T::default(); len];
        self.recv(&mut data, src)?;
        Ok(data)
    }
}

/// The communicator of a group of one. [`Group`] short-circuits every collective for size
/// 1, so these are reached only through [`Communicator`] directly.
#[derive(Debug)]
struct Single;

impl Communicator for Single {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn backend(&self) -> &'static str {
        "single"
    }
    fn all_reduce(&self, _: ReduceOp, _: DType, _: &mut [u8]) -> Result<()> {
        Ok(())
    }
    fn all_gather(&self, input: &[u8], output: &mut [u8]) -> Result<()> {
        copy_same_length(input, output)
    }
    fn sum_scatter(&self, _: DType, input: &[u8], output: &mut [u8]) -> Result<()> {
        copy_same_length(input, output)
    }
    fn send(&self, _: &[u8], dst: usize) -> Result<()> {
        Err(Error::invalid(format!(
            "cannot send to rank {dst}: this is a group of one"
        )))
    }
    fn recv(&self, _: &mut [u8], src: usize) -> Result<()> {
        Err(Error::invalid(format!(
            "cannot receive from rank {src}: this is a group of one"
        )))
    }
    fn barrier(&self) -> Result<()> {
        Ok(())
    }
    fn health(&self) -> Result<()> {
        Ok(())
    }
    fn close(&self) -> Result<()> {
        Ok(())
    }
}

fn copy_same_length(input: &[u8], output: &mut [u8]) -> Result<()> {
    if input.len() != output.len() {
        return Err(Error::invalid(format!(
            "output holds {} bytes, input {}",
            output.len(),
            input.len()
        )));
    }
    output.copy_from_slice(input);
    Ok(())
}

static DEFAULT_GROUP: RwLock<Option<Group>> = RwLock::new(None);

/// Makes `group` the default: what the free functions use when passed `None`.
/// [`init`](crate::init) sets it.
pub fn set_default_group(group: Group) {
    let mut slot = DEFAULT_GROUP.write().unwrap_or_else(|e| e.into_inner());
    *slot = Some(group);
}

/// The default group, or the group of this process alone if none was set.
pub fn default_group() -> Group {
    let slot = DEFAULT_GROUP.read().unwrap_or_else(|e| e.into_inner());
    slot.clone().unwrap_or_else(Group::single)
}

fn pick(group: Option<&Group>) -> Group {
    group.cloned().unwrap_or_else(default_group)
}

/// [`Group::all_sum`] on `group`, or on the default group for `None`
/// (`mx.distributed.all_sum(x, group=None)`).
///
/// # Errors
///
/// As [`Group::all_sum`].
pub fn all_sum<T: Element>(data: &mut [T], group: Option<&Group>) -> Result<()> {
    pick(group).all_sum(data)
}

/// [`Group::all_max`] on `group` or the default group.
///
/// # Errors
///
/// As [`Group::all_sum`].
pub fn all_max<T: Element>(data: &mut [T], group: Option<&Group>) -> Result<()> {
    pick(group).all_max(data)
}

/// [`Group::all_min`] on `group` or the default group.
///
/// # Errors
///
/// As [`Group::all_sum`].
pub fn all_min<T: Element>(data: &mut [T], group: Option<&Group>) -> Result<()> {
    pick(group).all_min(data)
}

/// [`Group::all_gather`] on `group` or the default group.
///
/// # Errors
///
/// As [`Group::all_gather`].
pub fn all_gather<T: Element>(input: &[T], output: &mut [T], group: Option<&Group>) -> Result<()> {
    pick(group).all_gather(input, output)
}

/// [`Group::sum_scatter`] on `group` or the default group.
///
/// # Errors
///
/// As [`Group::sum_scatter`].
pub fn sum_scatter<T: Element>(input: &[T], output: &mut [T], group: Option<&Group>) -> Result<()> {
    pick(group).sum_scatter(input, output)
}

/// [`Group::send`] on `group` or the default group.
///
/// # Errors
///
/// As [`Group::send`].
pub fn send<T: Element>(data: &[T], dst: usize, group: Option<&Group>) -> Result<()> {
    pick(group).send(data, dst)
}

/// [`Group::recv`] on `group` or the default group.
///
/// # Errors
///
/// As [`Group::recv`].
pub fn recv<T: Element>(data: &mut [T], src: usize, group: Option<&Group>) -> Result<()> {
    pick(group).recv(data, src)
}

/// [`Group::barrier`] on `group` or the default group.
///
/// # Errors
///
/// As [`Group::barrier`].
pub fn barrier(group: Option<&Group>) -> Result<()> {
    pick(group).barrier()
}

/// [`Group::broadcast`] on `group` or the default group.
///
/// # Errors
///
/// As [`Group::broadcast`].
pub fn broadcast<T: Element>(data: &mut [T], root: usize, group: Option<&Group>) -> Result<()> {
    pick(group).broadcast(data, root)
}

/// [`Group::all_to_all`] on `group` or the default group.
///
/// # Errors
///
/// As [`Group::all_to_all`].
pub fn all_to_all<T: Element>(input: &[T], output: &mut [T], group: Option<&Group>) -> Result<()> {
    pick(group).all_to_all(input, output)
}

/// [`Group::all_gather_vec`] on `group` or the default group.
///
/// # Errors
///
/// As [`Group::all_gather`].
pub fn all_gather_vec<T: Element>(input: &[T], group: Option<&Group>) -> Result<Vec<T>> {
    pick(group).all_gather_vec(input)
}

/// [`Group::recv_vec`] on `group` or the default group.
///
/// # Errors
///
/// As [`Group::recv`].
pub fn recv_vec<T: Element + Default>(
    len: usize,
    src: usize,
    group: Option<&Group>,
) -> Result<Vec<T>> {
    pick(group).recv_vec(len, src)
}

impl Group {
    /// What carries this rank's messages to and from `peer`, as the group negotiated it
    /// when it formed (not a guess from the environment): [`Transport::Local`] for this
    /// rank itself.
    ///
    /// # Errors
    ///
    /// `peer` is not a rank of the group.
    ///
    /// # Examples
    ///
    /// ```
    /// use nuvec_distributed_engine::{Group, Transport};
    ///
    /// let g = Group::single();
    /// assert_eq!(g.transport(0)?, Transport::Local);
    /// assert!(g.transport(1).is_err());
    /// # Ok::<(), nuvec_distributed_engine::Error>(())
    /// ```
    pub fn transport(&self, peer: usize) -> Result<Transport> {
        if peer >= self.size {
            return Err(Error::invalid(format!(
                "transport to rank {peer}: the group has ranks 0 to {}",
                self.size - 1
            )));
        }
        if peer == self.rank {
            return Ok(Transport::Local);
        }
        Ok(self.comm.transport(peer))
    }
}

// Broadcast, all_to_all and the conveniences across ranks, on both wires.
#[cfg(test)]
#[path = "group_collectives_tests.rs"]
mod collectives_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrong_block_lengths_are_named_with_the_call() {
        let mut out = [0u16; 3];
        let e = Group::single()
            .all_gather(&[1u16, 2], &mut out)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            Error::invalid(
                "all_gather: the output holds 3 elements but 1 ranks x 2 input elements need 2"
            )
            .to_string()
        );
        let e = check_blocks("sum_scatter", Blocks::Scatter, 5, 2, 3).unwrap_err();
        assert!(
            e.to_string().contains(
                "sum_scatter: the input holds 5 elements but 3 ranks x 2 output elements need 6"
            ),
            "{e}"
        );
        assert!(check_blocks("all_gather", Blocks::Gather, 2, 6, 3).is_ok());
        assert!(check_blocks("sum_scatter", Blocks::Scatter, 6, 2, 3).is_ok());
    }

    #[test]
    fn a_single_group_returns_its_input() {
        let g = Group::single();
        let mut x = [1.0f32, 2.0];
        g.all_sum(&mut x).unwrap();
        assert_eq!(x, [1.0, 2.0]);
        let mut out = [0u16; 2];
        g.all_gather(&[3u16, 4], &mut out).unwrap();
        assert_eq!(out, [3, 4]);
        g.sum_scatter(&[5u16, 6], &mut out).unwrap();
        assert_eq!(out, [5, 6]);
        g.barrier().unwrap();
        let e = g.send(&x, 0).unwrap_err();
        assert!(e.to_string().contains("group of one"), "{e}");
    }

    #[test]
    fn length_mismatches_are_argument_errors() {
        let g = Group::single();
        let mut out = [0u8; 3];
        let e = g.all_gather(&[1u8, 2], &mut out).unwrap_err();
        assert!(
            matches!(e, Error::InvalidArgument(_)) && !e.is_fatal(),
            "{e}"
        );
        let e = g.sum_scatter(&[1u8, 2], &mut out).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    }
}
