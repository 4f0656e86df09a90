//! io_uring (Linux): the ring's sends and receives, and its readiness waits, as io_uring
//! operations.
//!
//! The contract that makes this safe to offer as a safe API: **no operation that references
//! a caller's memory outlives the call that submitted it.** Two kinds of call submit such
//! operations:
//!
//! - [`Ring::recv`], [`Ring::send`] and [`Ring::send_pair`] push one entry with
//!   `MSG_DONTWAIT` (the kernel completes it at once, with `EAGAIN` if the socket has nothing
//!   or no room), enter the kernel, and return once its completion has been reaped.
//! - [`Ring::exchange`] pushes a step's send and receive without `MSG_DONTWAIT` and waits in
//!   the kernel for both, in one `io_uring_enter` when they complete together: the receive
//!   stays in flight across the wait, where the other calls would poll. A deadline, or a
//!   readiness report the caller says ends the wait (a close from another thread wakes one),
//!   cancels what is still in flight.
//!
//! Either way the operations in flight are held by an `InFlight` guard that, however the
//! call ends (completion, error, deadline, stop, even an unwinding panic), cancels what has
//! not completed and reaps every completion before the borrow of the caller's memory can
//! end. A failure of `io_uring_enter` that leaves an entry's fate unknown cannot be survived
//! soundly and aborts the process (it does not happen with a valid ring: see SAFETY.md).
//!
//! Readiness waits ([`Ring::poll`]) reference no memory, only a descriptor; they may stay
//! armed between calls and are cancelled when the ring is dropped (closing the ring's
//! descriptor cancels them).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::{Duration, Instant};

use io_uring::{IoUring, opcode, types};

/// `user_data` bit of a transfer (an operation on memory); its low bits are its [`Slot`].
const TRANSFER: u64 = 1 << 63;
/// `user_data` of a cancellation request (its own completion carries nothing to keep).
const CANCEL: u64 = 1 << 62;

/// Where a transfer's completion is kept until its call takes it: [`Ring::transfer`]'s one
/// operation, or [`Ring::exchange`]'s send and its receive's chain (see
/// [`Ring::exchange`]): the wait for the socket, the urgent byte's receive and the receive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    One = 0,
    Send = 1,
    Recv = 2,
    Look = 3,
    Urgent = 4,
}

/// How many [`Slot`]s there are.
const SLOTS: usize = 5;

/// The completions (result and flags) of the transfers in flight, by [`Slot`].
type Done = [Option<(i32, u32)>; SLOTS];

/// What [`Ring::exchange`] did.
#[derive(Debug)]
pub struct Exchanged {
    /// The send's result; `None` if there was no send or it was cancelled before it moved
    /// a byte.
    pub sent: Option<io::Result<usize>>,
    /// The receive's result and whether the socket may still hold data (as
    /// [`Ring::recv`]'s); `None` if there was no receive or it moved nothing (see
    /// [`Ring::exchange`]).
    pub received: Option<io::Result<(usize, bool)>>,
    /// The TCP urgent byte the receive's socket held when its bytes came, taken before the
    /// receive could pass its position (see [`Ring::exchange`]).
    pub urgent: Option<u8>,
    /// How many times the exchange entered the kernel (`io_uring_enter`): one when the
    /// step's send and receive were submitted and waited for together.
    pub entered: u32,
}

/// What a completed readiness wait reports: the caller's token and the `poll(2)` events
/// seen (`POLLERR` if the wait itself failed). `ended` says the wait is no longer armed
/// (always for a one-shot wait) and must be armed again to hear more.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Readiness {
    /// The token given to [`Ring::poll`].
    pub token: u32,
    /// The `poll(2)` events, merged over every completion since they were last taken.
    pub events: u32,
    /// Whether the wait has ended and must be armed again.
    pub ended: bool,
}

/// What [`Ring::recv_guarded`] did.
#[derive(Debug)]
pub struct Guarded {
    /// The receive's outcome, as [`Ring::recv`] reports it.
    pub received: io::Result<(usize, bool)>,
    /// The urgent byte taken before it, if one waited.
    pub urgent: Option<u8>,
}

/// One io_uring instance and the readiness it reported and the caller has not yet taken.
pub struct Ring {
    ring: IoUring,
    ready: Vec<Readiness>,
    /// Whether receives report a socket left non-empty (`IORING_CQE_F_SOCK_NONEMPTY`,
    /// filled in for TCP since Linux 6.0, which is also when `IORING_OP_SEND_ZC` came:
    /// that opcode's presence is the test).
    reports_rest: bool,
    /// How [`Ring::exchange`] waits before it sleeps in the kernel ([`Ring::spin_first`]).
    spin: SpinFirst,
    /// Whether [`Ring::exchange`]'s receive takes urgent bytes first
    /// ([`Ring::guard_urgent`]).
    guard_urgent: bool,
}

/// How [`Ring::exchange`] waits for its completions before it sleeps in the kernel: it
/// submits without waiting and watches the completion queue (memory the kernel shares with
/// this process, so no system call) for `total`, yielding the CPU on every look after
/// `eager`. A peer that answers within it never pays the wake-up of a thread asleep in the
/// kernel, which on an idle machine (and more so an idle virtual CPU) costs tens of
/// microseconds. A receive's completion needs this thread's task work, which the ring
/// (set up for cooperative task running) flags instead of interrupting the thread: a look
/// that sees the flag enters the kernel to run it. Zero `total` (the default) sleeps at
/// once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpinFirst {
    /// How long to watch without yielding the CPU.
    pub eager: Duration,
    /// How long to watch in all before sleeping.
    pub total: Duration,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("ready", &self.ready)
            .finish_non_exhaustive()
    }
}

/// Whether an `io_uring_enter` error leaves the ring usable and the call may be retried.
fn transient(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
    )
}

impl Ring {
    /// Sets up a ring of `entries` submission entries, for waits on up to `tokens` distinct
    /// tokens (their readiness is kept without allocating).
    ///
    /// # Errors
    ///
    /// What `io_uring_setup` returns (`ENOSYS` on kernels without io_uring, `EPERM` where a
    /// sandbox or `kernel.io_uring_disabled` refuses it), or `Unsupported` if the kernel
    /// lacks timed waits (`IORING_FEAT_EXT_ARG`, Linux 5.11).
    pub fn new(entries: u32, tokens: usize) -> io::Result<Ring> {
        // Cooperative task running (Linux 5.19): the kernel does not interrupt this
        // thread to post a completion that needs its task work (a receive armed before its
        // bytes came), it flags the submission queue and waits for the next entry into the
        // kernel, which `InFlight::spin` makes when it sees the flag. Interrupting costs an
        // inter-processor interrupt per completion, which on a virtual machine more than
        // doubled a 4 B all_sum (49 µs against 18 here). Older kernels refuse the flags
        // (EINVAL): then the ring is set up without them.
        let ring = match IoUring::builder()
            .setup_coop_taskrun()
            .setup_taskrun_flag()
            .build(entries)
        {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => IoUring::new(entries)?,
            built => built?,
        };
        if !ring.params().is_feature_ext_arg() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "the kernel's io_uring has no timed waits (IORING_FEAT_EXT_ARG, Linux 5.11)",
            ));
        }
        let mut probe = io_uring::Probe::new();
        let reports_rest = ring.submitter().register_probe(&mut probe).is_ok()
            && probe.is_supported(opcode::SendZc::CODE);
        Ok(Ring {
            ring,
            ready: Vec::with_capacity(tokens),
            reports_rest,
            spin: SpinFirst::default(),
            guard_urgent: true,
        })
    }

    /// Receives what the socket holds into `buf`, without waiting: `Ok((0, _))` is the
    /// peer's close, `WouldBlock` an empty socket. The flag says whether the socket may
    /// still hold data after this receive: `false` only when the kernel reported it empty
    /// (Linux 6.0 and later; older kernels always answer `true`), so that the caller can
    /// wait for the next arrival instead of trying a receive that would find nothing.
    ///
    /// # Errors
    ///
    /// The receive's error, or the ring's.
    pub fn recv(&mut self, fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<(usize, bool)> {
        let len = u32::try_from(buf.len()).unwrap_or(u32::MAX);
        let entry = opcode::Recv::new(types::Fd(fd.as_raw_fd()), buf.as_mut_ptr(), len)
            .flags(libc::MSG_DONTWAIT)
            .build();
        let (n, flags) = self.transfer_flags(entry)?;
        let rest = !self.reports_rest || io_uring::cqueue::sock_nonempty(flags);
        Ok((n, rest))
    }

    /// [`Ring::recv`] behind a receive of the socket's TCP urgent byte, in one submission:
    /// the urgent byte, if one waits, is taken first ([`Guarded::urgent`]), so that the
    /// receive cannot start at its position and skip it (a receive that starts there passes
    /// over the byte, and the kernel then forgets it, measured on Linux 6.18 whether the
    /// receive runs inline or linked behind another operation). The links are hard: the
    /// receive runs whether or not an urgent byte was there.
    ///
    /// Once a byte was taken the receive may be refused at its position (`WouldBlock`)
    /// although data follows it: receive that socket with a plain `recv(2)` until the
    /// stream has passed the position (see [`Ring::exchange`]).
    ///
    /// # Errors
    ///
    /// The ring's (the receive's own error is in [`Guarded::received`]).
    pub fn recv_guarded(&mut self, fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Guarded> {
        let fd = types::Fd(fd.as_raw_fd());
        let reports_rest = self.reports_rest;
        // Declared before `flight`, so it outlives the guard (locals drop in reverse).
        let mut urgent = 0u8;
        let mut flight = InFlight::new(&mut self.ring, &mut self.ready);
        let [take_urgent, entry] = urgent_then_receive(fd, &raw mut urgent, buf);
        // A chain cut by a full queue would be submitted in two parts, unlinked.
        flight.make_room(2)?;
        // SAFETY: `urgent` lives on this frame longer than `flight`, which reaps every
        // completion before it ends.
        unsafe { flight.push(take_urgent, Slot::Urgent)? };
        // SAFETY: `buf` is borrowed for this whole call, and `flight` (on this frame) does
        // not let it end before the entry's completion is reaped.
        unsafe { flight.push(entry, Slot::One)? };
        flight.wait(None, |_| false)?;
        flight.drain();
        let took = matches!(flight.take(Slot::Urgent), Some((1, _)));
        let received = match flight.take(Slot::One) {
            Some((n, flags)) if n >= 0 => Ok((
                n as usize,
                !reports_rest || io_uring::cqueue::sock_nonempty(flags),
            )),
            Some((e, _)) => Err(io::Error::from_raw_os_error(-e)),
            None => Err(io::Error::other("io_uring lost a transfer's completion")),
        };
        drop(flight);
        Ok(Guarded {
            received,
            urgent: took.then_some(urgent),
        })
    }

    /// Sends what the socket takes of `buf`, without waiting (`WouldBlock`: no room).
    ///
    /// # Errors
    ///
    /// The send's error, or the ring's.
    pub fn send(&mut self, fd: BorrowedFd<'_>, buf: &[u8]) -> io::Result<usize> {
        let len = u32::try_from(buf.len()).unwrap_or(u32::MAX);
        let entry = opcode::Send::new(types::Fd(fd.as_raw_fd()), buf.as_ptr(), len)
            .flags(libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
            .build();
        self.transfer(entry)
    }

    /// Sends what the socket takes of `head` then `body` in one operation (`sendmsg(2)`
    /// with two pieces), without waiting.
    ///
    /// # Errors
    ///
    /// The send's error, or the ring's.
    pub fn send_pair(&mut self, fd: BorrowedFd<'_>, head: &[u8], body: &[u8]) -> io::Result<usize> {
        let iov = [
            libc::iovec {
                iov_base: head.as_ptr().cast_mut().cast(),
                iov_len: head.len(),
            },
            libc::iovec {
                iov_base: body.as_ptr().cast_mut().cast(),
                iov_len: body.len(),
            },
        ];
        // A zeroed header with only the pieces set: no address, no control data.
        let mut msg = libc::msghdr {
            msg_name: std::ptr::null_mut(),
            msg_namelen: 0,
            msg_iov: std::ptr::null_mut(),
            msg_iovlen: 0,
            msg_control: std::ptr::null_mut(),
            msg_controllen: 0,
            msg_flags: 0,
        };
        msg.msg_iov = iov.as_ptr().cast_mut();
        msg.msg_iovlen = iov.len() as _;
        let entry = opcode::SendMsg::new(types::Fd(fd.as_raw_fd()), &raw const msg)
            .flags((libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) as u32)
            .build();
        // `iov` and `msg` live on this frame until `transfer` has reaped the completion.
        self.transfer(entry)
    }

    /// Pushes `entry`, which may reference memory borrowed by the caller, and returns its
    /// result once its completion has been reaped (see the module's contract).
    fn transfer(&mut self, entry: io_uring::squeue::Entry) -> io::Result<usize> {
        self.transfer_flags(entry).map(|(n, _)| n)
    }

    /// [`Ring::transfer`], also returning the completion's flags.
    fn transfer_flags(&mut self, entry: io_uring::squeue::Entry) -> io::Result<(usize, u32)> {
        let mut flight = InFlight::new(&mut self.ring, &mut self.ready);
        // SAFETY: the entry references memory the caller borrows for this whole call (a
        // buffer, or `iov`/`msg` on `send_pair`'s frame), and `flight`, which lives on this
        // frame, does not let the call end (returning, or unwinding) before the entry's
        // completion has been reaped: it cancels and drains it, or aborts the process.
        unsafe { flight.push(entry, Slot::One)? };
        flight.wait(None, |_| false)?;
        flight.drain();
        match flight.take(Slot::One) {
            Some((result, flags)) if result >= 0 => Ok((result as usize, flags)),
            Some((result, _)) => Err(io::Error::from_raw_os_error(-result)),
            None => Err(io::Error::other("io_uring lost a transfer's completion")),
        }
    }

    /// Sets how [`Ring::exchange`] waits before it sleeps in the kernel (see [`SpinFirst`]).
    pub fn spin_first(&mut self, spin: SpinFirst) {
        self.spin = spin;
    }

    /// Sets whether [`Ring::exchange`]'s receive guards TCP urgent bytes (the default), or
    /// is one plain receive that waits in the kernel: cheaper (measured: 19.7 µs against
    /// 22.3 µs per 4 B all_sum of two ranks, three linked operations and their task work
    /// against one), but it skips an urgent byte that comes while it waits, and the
    /// kernel then forgets the byte. For a caller to whom such a byte tells nothing it
    /// does not know anyway (the ring's two ranks: a notice could only name the peer).
    pub fn guard_urgent(&mut self, on: bool) {
        self.guard_urgent = on;
    }

    /// A ring step's transfers in one submission: sends what the socket `send.0` takes of
    /// `send.1` and receives what `recv.0` brings into `recv.1`, waiting in the kernel until
    /// both have moved some bytes, or `deadline` passes, or a readiness report (see
    /// [`Ring::poll`]) makes `stop` say so: then what is still in flight is cancelled.
    /// Either may be absent. On return neither is in flight any more (the module's
    /// contract). Readiness reported meanwhile is kept for [`Ring::take_ready`] (`stop`
    /// looks at it without taking it).
    ///
    /// The receive is a chain of three linked operations, so that a TCP urgent byte is
    /// never lost to it (unless [`Ring::guard_urgent`] turned that off: then it is one
    /// receive that waits in the kernel). A receive that starts exactly at the urgent byte's position skips
    /// the byte, and the kernel then forgets it (it keeps an urgent byte only until a read
    /// passes its position), which a receive waiting in the kernel would do whenever the
    /// byte is the next one to come. So the chain is: a one-shot wait for the socket
    /// (`POLLIN | POLLPRI`, which waits in the kernel), then a receive of the urgent byte
    /// (`MSG_OOB`, reported in [`Exchanged::urgent`]), then the receive proper, both without
    /// waiting (`MSG_DONTWAIT`): the kernel runs them in that order as soon as the socket
    /// has something. The links are hard (a failed or cancelled link does not cancel the
    /// next), so the receives also run, at once, after a cancelled wait.
    ///
    /// A transfer that moved bytes reports them, whether it completed before or despite a
    /// cancellation; a short one reports how many (re-submit the rest); one that moved
    /// nothing (cancelled, or its wait ended on an urgent byte alone) reports `None`.
    ///
    /// Once an urgent byte was taken, receive on that socket with [`Ring::recv`], not here,
    /// until the stream has passed the byte's position: a receive that runs linked, from
    /// the kernel's task work, sees a signal pending (the task work's own notification),
    /// and TCP refuses such a receive at the urgent byte's position (`EAGAIN`) however
    /// often it is tried.
    ///
    /// # Errors
    ///
    /// The ring's (`io_uring_enter`, or a full submission queue); the transfers' own
    /// errors are in [`Exchanged`].
    pub fn exchange(
        &mut self,
        send: Option<(BorrowedFd<'_>, &[u8])>,
        recv: Option<(BorrowedFd<'_>, &mut [u8])>,
        deadline: Option<Instant>,
        mut stop: impl FnMut(&Readiness) -> bool,
    ) -> io::Result<Exchanged> {
        let (reports_rest, spin, guard) = (self.reports_rest, self.spin, self.guard_urgent);
        // Declared before `flight`, so it outlives the guard (locals drop in reverse).
        let mut urgent = 0u8;
        let mut flight = InFlight::new(&mut self.ring, &mut self.ready);
        if let Some((fd, buf)) = send {
            let len = u32::try_from(buf.len()).unwrap_or(u32::MAX);
            let entry = opcode::Send::new(types::Fd(fd.as_raw_fd()), buf.as_ptr(), len)
                .flags(libc::MSG_NOSIGNAL)
                .build();
            // SAFETY: `buf` is borrowed for this whole call, and `flight` (on this frame)
            // does not let it end before the entry's completion is reaped.
            unsafe { flight.push(entry, Slot::Send)? };
        }
        let (plain, recv) = if guard { (None, recv) } else { (recv, None) };
        if let Some((fd, buf)) = plain {
            let len = u32::try_from(buf.len()).unwrap_or(u32::MAX);
            let entry = opcode::Recv::new(types::Fd(fd.as_raw_fd()), buf.as_mut_ptr(), len).build();
            // SAFETY: as for the send.
            unsafe { flight.push(entry, Slot::Recv)? };
        }
        if let Some((fd, buf)) = recv {
            let fd = types::Fd(fd.as_raw_fd());
            let linked = io_uring::squeue::Flags::IO_HARDLINK;
            let look = opcode::PollAdd::new(fd, (libc::POLLIN | libc::POLLPRI) as u32)
                .build()
                .flags(linked);
            let [take_urgent, entry] = urgent_then_receive(fd, &raw mut urgent, buf);
            // A chain cut by a full queue would be submitted in two parts, unlinked.
            flight.make_room(3)?;
            // SAFETY: the wait references no memory, only the descriptor.
            unsafe { flight.push(look, Slot::Look)? };
            // SAFETY: `urgent` lives on this frame longer than `flight`, which reaps every
            // completion before it ends.
            unsafe { flight.push(take_urgent, Slot::Urgent)? };
            // SAFETY: as for the send: `buf` is borrowed for this whole call.
            unsafe { flight.push(entry, Slot::Recv)? };
        }
        let waited = flight
            .spin(deadline, spin, &mut stop)
            .and_then(|()| flight.wait(deadline, stop));
        flight.drain();
        waited?;
        let outcome = |done: Option<(i32, u32)>| match done {
            None => None,
            // Cancelled, or (the receive) run after a wait that was cancelled or saw only
            // an urgent byte: nothing moved.
            Some((r, _)) if r == -libc::ECANCELED || r == -libc::EAGAIN => None,
            Some((r, flags)) if r >= 0 => Some(Ok((r as usize, flags))),
            Some((r, _)) => Some(Err(io::Error::from_raw_os_error(-r))),
        };
        let took_urgent = matches!(flight.take(Slot::Urgent), Some((1, _)));
        flight.take(Slot::Look);
        let sent = outcome(flight.take(Slot::Send)).map(|r| r.map(|(n, _)| n));
        let received = outcome(flight.take(Slot::Recv)).map(|r| {
            r.map(|(n, flags)| (n, !reports_rest || io_uring::cqueue::sock_nonempty(flags)))
        });
        let entered = flight.entered;
        drop(flight);
        Ok(Exchanged {
            sent,
            received,
            urgent: took_urgent.then_some(urgent),
            entered,
        })
    }

    /// Submits what is queued and waits for `want` completions (or none), retrying
    /// interruptions.
    fn enter(&mut self, want: usize) -> io::Result<()> {
        loop {
            match self.ring.submitter().submit_and_wait(want) {
                Ok(_) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) if transient(&e) => {
                    self.reap();
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Takes every completion off the queue: readiness is kept for [`Ring::take_ready`],
    /// and the transfers' results returned.
    fn reap(&mut self) -> Done {
        let mut done = [None; SLOTS];
        reap(&mut self.ring, &mut self.ready, &mut done);
        done
    }

    /// Arms a readiness wait on `fd` for the `poll(2)` `events`, reported under `token`
    /// (one-shot, or `multishot`: armed until it reports `ended`). It is submitted with the
    /// next transfer or wait. The caller keeps `fd` open while the wait is armed or drops
    /// the ring first; a closed descriptor only ends the wait, it never touches memory.
    ///
    /// # Errors
    ///
    /// The ring's, if its queue is full and cannot be submitted.
    pub fn poll(
        &mut self,
        fd: BorrowedFd<'_>,
        token: u32,
        events: u32,
        multishot: bool,
    ) -> io::Result<()> {
        let entry = opcode::PollAdd::new(types::Fd(fd.as_raw_fd()), events)
            .multi(multishot)
            .build()
            .user_data(u64::from(token));
        // SAFETY: a poll entry references no memory, only the descriptor number.
        if unsafe { self.ring.submission().push(&entry) }.is_err() {
            self.enter(0)?;
            // SAFETY: as above.
            if unsafe { self.ring.submission().push(&entry) }.is_err() {
                return Err(io::Error::other("the io_uring submission queue stays full"));
            }
        }
        Ok(())
    }

    /// Submits the waits armed since the last call and waits until some readiness is
    /// reported or `timeout` passes (`None`: no limit; zero: only look).
    ///
    /// # Errors
    ///
    /// The ring's (`io_uring_enter`), other than an interruption or the timeout.
    pub fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.reap();
        let want = usize::from(self.ready.is_empty());
        let entered = match timeout {
            _ if want == 0 => self.ring.submitter().submit(),
            Some(t) if t.is_zero() => self.ring.submitter().submit(),
            Some(t) => {
                let ts = types::Timespec::from(t);
                let args = types::SubmitArgs::new().timespec(&ts);
                self.ring.submitter().submit_with_args(want, &args)
            }
            None => self.ring.submitter().submit_and_wait(want),
        };
        match entered {
            Ok(_) => {}
            Err(e) if transient(&e) || e.raw_os_error() == Some(libc::ETIME) => {}
            Err(e) => return Err(e),
        }
        self.reap();
        Ok(())
    }

    /// Takes the readiness reported under `token`, if any.
    pub fn take(&mut self, token: u32) -> Option<Readiness> {
        let at = self.ready.iter().position(|r| r.token == token)?;
        Some(self.ready.swap_remove(at))
    }

    /// Hands every readiness reported so far to `each`, and forgets it.
    pub fn take_ready(&mut self, mut each: impl FnMut(Readiness)) {
        self.reap();
        for r in self.ready.drain(..) {
            each(r);
        }
    }
}

/// A receive of the socket's urgent byte into `urgent`, hard-linked before a receive into
/// `buf`, both without waiting (see [`Ring::recv_guarded`]). Building them touches neither
/// memory; pushing them is the caller's contract.
fn urgent_then_receive(
    fd: types::Fd,
    urgent: *mut u8,
    buf: &mut [u8],
) -> [io_uring::squeue::Entry; 2] {
    let len = u32::try_from(buf.len()).unwrap_or(u32::MAX);
    [
        opcode::Recv::new(fd, urgent, 1)
            .flags(libc::MSG_OOB | libc::MSG_DONTWAIT)
            .build()
            .flags(io_uring::squeue::Flags::IO_HARDLINK),
        opcode::Recv::new(fd, buf.as_mut_ptr(), len)
            .flags(libc::MSG_DONTWAIT)
            .build(),
    ]
}

/// Takes every completion off `ring`'s queue: a transfer's goes to `done` by its slot, a
/// cancellation request's is dropped, and readiness is merged into `ready` by token.
fn reap(ring: &mut IoUring, ready: &mut Vec<Readiness>, done: &mut Done) {
    for cqe in ring.completion() {
        let data = cqe.user_data();
        if data & TRANSFER != 0 {
            if let Some(slot) = done.get_mut((data & !TRANSFER) as usize) {
                *slot = Some((cqe.result(), cqe.flags()));
            }
            continue;
        }
        if data & CANCEL != 0 {
            continue;
        }
        let token = (data & u64::from(u32::MAX)) as u32;
        let result = cqe.result();
        let events = if result >= 0 {
            result as u32
        } else {
            libc::POLLERR as u32
        };
        let ended = !io_uring::cqueue::more(cqe.flags());
        match ready.iter_mut().find(|r| r.token == token) {
            Some(r) => {
                r.events |= events;
                r.ended |= ended;
            }
            None => ready.push(Readiness {
                token,
                events,
                ended,
            }),
        }
    }
}

/// The guard of the buffer contract: the transfers pushed through it are in flight until
/// their completions have been reaped, and it does not end (drop) before that. Dropping it
/// cancels what has not completed and waits for every completion, so a call that keeps it
/// on its frame cannot return, nor unwind, while the kernel may still use the memory the
/// entries point to. An `io_uring_enter` failure while draining leaves that unknown: the
/// process aborts.
struct InFlight<'r> {
    ring: &'r mut IoUring,
    ready: &'r mut Vec<Readiness>,
    /// Which slots have an entry in the kernel's hands whose completion is not reaped.
    pending: [bool; SLOTS],
    done: Done,
    /// How many times it entered the kernel.
    entered: u32,
}

impl<'r> InFlight<'r> {
    fn new(ring: &'r mut IoUring, ready: &'r mut Vec<Readiness>) -> Self {
        InFlight {
            ring,
            ready,
            pending: [false; SLOTS],
            done: [None; SLOTS],
            entered: 0,
        }
    }

    /// Pushes `entry` as `slot`'s transfer (queued for the next `io_uring_enter`).
    ///
    /// # Safety
    ///
    /// The memory `entry` points to stays valid until this guard is dropped.
    unsafe fn push(&mut self, entry: io_uring::squeue::Entry, slot: Slot) -> io::Result<()> {
        let entry = entry.user_data(TRANSFER | slot as u64);
        self.make_room(1)?;
        // SAFETY: the caller keeps the entry's memory valid until this guard is dropped,
        // which reaps its completion first (`drain`).
        if unsafe { self.ring.submission().push(&entry) }.is_err() {
            return Err(io::Error::other("the io_uring submission queue stays full"));
        }
        self.pending[slot as usize] = true;
        self.done[slot as usize] = None;
        Ok(())
    }

    /// Submits what is queued if the submission queue has room for fewer than `n` more
    /// entries (it may be full of waits armed earlier, which reference no memory).
    fn make_room(&mut self, n: usize) -> io::Result<()> {
        let free = {
            let sq = self.ring.submission();
            sq.capacity() - sq.len()
        };
        if free < n {
            if let Some(e) = self.enter(0, None) {
                return Err(e);
            }
            let sq = self.ring.submission();
            if sq.capacity() - sq.len() < n {
                return Err(io::Error::other("the io_uring submission queue stays full"));
            }
        }
        Ok(())
    }

    fn in_flight(&self) -> usize {
        self.pending.iter().filter(|&&p| p).count()
    }

    /// Submits what is queued and waits for `want` completions or `timeout`, then reaps.
    /// Returns the error of `io_uring_enter` if it is not transient (an interruption, a
    /// full completion queue, the timeout), which leaves the ring's state as it was.
    fn enter(&mut self, want: usize, timeout: Option<Duration>) -> Option<io::Error> {
        self.entered += 1;
        let entered = match timeout {
            Some(t) => {
                let ts = types::Timespec::from(t);
                let args = types::SubmitArgs::new().timespec(&ts);
                self.ring.submitter().submit_with_args(want, &args)
            }
            None => self.ring.submitter().submit_and_wait(want),
        };
        let failed = match entered {
            Ok(_) => None,
            Err(e) if transient(&e) || e.raw_os_error() == Some(libc::ETIME) => None,
            Err(e) => Some(e),
        };
        self.reap();
        failed
    }

    /// Submits what is queued without waiting, then watches the completion queue as
    /// `spin` says until every transfer in flight completed, a readiness report makes
    /// `stop` true, `deadline` passed or the spin is over (then [`InFlight::wait`] sleeps).
    fn spin(
        &mut self,
        deadline: Option<Instant>,
        spin: SpinFirst,
        stop: &mut impl FnMut(&Readiness) -> bool,
    ) -> io::Result<()> {
        if spin.total.is_zero() || self.in_flight() == 0 {
            return Ok(());
        }
        if let Some(e) = self.enter(0, None) {
            return Err(e);
        }
        let start = Instant::now();
        loop {
            if !self.ring.completion().is_empty() {
                self.reap();
            }
            if self.in_flight() == 0 || self.ready.iter().any(&mut *stop) {
                return Ok(());
            }
            let now = Instant::now();
            let idle = now - start;
            if idle >= spin.total || deadline.is_some_and(|d| now >= d) {
                return Ok(());
            }
            if self.ring.submission().taskrun() {
                // A completion waits for this thread's task work: enter to run it.
                if let Some(e) = self.enter(0, None) {
                    return Err(e);
                }
            } else if idle < spin.eager {
                std::hint::spin_loop();
            } else {
                // Ranks that share CPUs give theirs away on every look. Sleeping in the
                // kernel instead, in one io_uring_enter that submits the step and waits
                // for all its completions, makes fewer system calls but costs more time: a
                // 4 B all_sum at P = 4 on 2 vCPUs made 2.0 calls per rank against 2.5-3.0
                // (`strace -c -f`) and took 46 µs against 34 (median of five interleaved
                // runs, load average 5): a sleeping rank must be woken, a yielding one is
                // still runnable when its peer's bytes come.
                std::thread::yield_now();
            }
        }
    }

    /// Takes the completions the kernel posted and notes which transfers they end.
    fn reap(&mut self) {
        reap(self.ring, self.ready, &mut self.done);
        for (slot, pending) in self.pending.iter_mut().enumerate() {
            *pending &= self.done[slot].is_none();
        }
    }

    /// Waits until every transfer in flight completed, `deadline` passed, or a readiness
    /// report makes `stop` true (what the transfers did stays to be taken).
    fn wait(
        &mut self,
        deadline: Option<Instant>,
        mut stop: impl FnMut(&Readiness) -> bool,
    ) -> io::Result<()> {
        loop {
            if self.in_flight() == 0 || self.ready.iter().any(&mut stop) {
                return Ok(());
            }
            let timeout = match deadline {
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(());
                    }
                    Some(left)
                }
                None => None,
            };
            // Two completions while a send and a receive are both in flight, so that a
            // step costs one system call: a small send completes as it is submitted, and
            // a wait for one completion would return at once for it and enter again for
            // the receive (measured: 2.9 io_uring_enter per 4 B all_sum at P = 4 with
            // spinning off, 2.0 with this). Otherwise one: any readiness report may be the
            // one that stops the wait (it counts as a completion, so with the send's it
            // ends a two-completion wait too), and a receive's chain completes in one run
            // of the task work.
            let both = self.pending[Slot::Send as usize] && self.pending[Slot::Recv as usize];
            if let Some(e) = self.enter(if both { 2 } else { 1 }, timeout) {
                return Err(e);
            }
        }
    }

    /// Cancels every transfer still in flight and reaps every completion (this guard's
    /// drop does it too): afterwards nothing refers to the transfers' memory.
    fn drain(&mut self) {
        if self.in_flight() == 0 {
            return;
        }
        for slot in 0..self.pending.len() {
            if !self.pending[slot] {
                continue;
            }
            let cancel = opcode::AsyncCancel::new(TRANSFER | slot as u64)
                .build()
                .user_data(CANCEL);
            // SAFETY: a cancellation request references no memory, only the `user_data`
            // of the entry it cancels.
            while unsafe { self.ring.submission().push(&cancel) }.is_err() {
                if let Some(e) = self.enter(0, None) {
                    abort_in_flight(&e);
                }
            }
        }
        // A cancelled transfer still completes (with `ECANCELED`, or with what it did if
        // it finished first): wait for each one's completion, without a deadline.
        while self.in_flight() > 0 {
            if let Some(e) = self.enter(1, None) {
                abort_in_flight(&e);
            }
        }
    }

    /// The completion of `slot`'s transfer, if it came.
    fn take(&mut self, slot: Slot) -> Option<(i32, u32)> {
        self.done[slot as usize].take()
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.drain();
    }
}

/// The ring failed while the kernel may hold pointers into memory its caller gets back
/// when the call returns: there is no sound way on.
fn abort_in_flight(e: &io::Error) -> ! {
    eprintln!(
        "nuvec-distributed: io_uring_enter failed with a transfer in flight ({e}); aborting, \
         as the kernel may still write the caller's buffer"
    );
    std::process::abort();
}

/// Makes `io_uring_setup` fail with `EPERM` on the calling thread from now on, as a sandbox
/// (a container runtime's seccomp profile) or `kernel.io_uring_disabled` does: for tests of
/// the refusal and the fallback to epoll. It installs a seccomp filter on this thread only
/// (without `SECCOMP_FILTER_FLAG_TSYNC`); every other system call is allowed. The thread
/// also gets `no_new_privs`, which seccomp requires of an unprivileged caller. Neither can
/// be undone: run it on a thread made for the purpose.
///
/// # Errors
///
/// What `prctl` returns (`EINVAL` on a kernel built without seccomp filters).
pub fn refuse_setup_on_this_thread() -> io::Result<()> {
    // The filter looks at the system call number (offset 0 of `struct seccomp_data`) of
    // this thread's native calls, which are all a Rust test makes.
    let nr = u32::try_from(libc::SYS_io_uring_setup).unwrap_or(u32::MAX);
    // BPF's instruction codes are 16 bits; libc spells them as `u32`s, all below 0x100.
    let op = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    let filter = [
        op(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, 0),
        op(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, 0, 1, nr),
        op(
            libc::BPF_RET | libc::BPF_K,
            0,
            0,
            libc::SECCOMP_RET_ERRNO | (libc::EPERM as u32 & libc::SECCOMP_RET_DATA),
        ),
        op(libc::BPF_RET | libc::BPF_K, 0, 0, libc::SECCOMP_RET_ALLOW),
    ];
    let program = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr().cast_mut(),
    };
    // The variadic arguments are passed as the `unsigned long`s `prctl(2)` reads.
    let one = 1 as libc::c_ulong;
    let zero = 0 as libc::c_ulong;
    // SAFETY: PR_SET_NO_NEW_PRIVS takes integers only and changes no memory of ours.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, one, zero, zero, zero) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: PR_SET_SECCOMP reads `program` and the `filter` array it points to during the
    // call (the kernel copies the program), and both live on this frame until it returns;
    // the filter denies one system call, which no code relies on succeeding (io_uring's
    // absence is an error every caller handles).
    let status = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::c_ulong::from(libc::SECCOMP_MODE_FILTER),
            &raw const program,
        )
    };
    if status == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::fd::AsFd;

    use super::*;
    use crate::net::tests::pair;

    /// Receives from `fd` into `buf` by an exchange that sends nothing, until `deadline` or
    /// until `stop` takes a readiness report.
    fn receive(
        ring: &mut Ring,
        fd: BorrowedFd<'_>,
        buf: &mut [u8],
        deadline: Instant,
        stop: impl FnMut(&Readiness) -> bool,
    ) -> Exchanged {
        ring.exchange(None, Some((fd, buf)), Some(deadline), stop)
            .unwrap()
    }

    fn ring() -> Ring {
        Ring::new(16, 8).expect("io_uring: this kernel allows it (else the test cannot run)")
    }

    #[test]
    fn moves_bytes_and_reports_an_empty_socket_without_waiting() {
        let (a, b) = pair();
        let mut ring = ring();
        let mut buf = [0u8; 8];
        let e = ring.recv(b.as_fd(), &mut buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        assert_eq!(ring.send(a.as_fd(), b"abc").unwrap(), 3);
        assert_eq!(ring.send_pair(a.as_fd(), b"de", b"fgh").unwrap(), 5);
        ring.poll(b.as_fd(), 7, libc::POLLIN as u32, false).unwrap();
        ring.wait(Some(Duration::from_secs(5))).unwrap();
        let r = ring.take(7).expect("readable");
        assert!(r.ended && r.events & libc::POLLIN as u32 != 0);
        let mut got = Vec::new();
        while got.len() < 8 {
            let (n, _) = ring.recv(b.as_fd(), &mut buf).unwrap();
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, b"abcdefgh");
        drop(a);
        assert_eq!(ring.recv(b.as_fd(), &mut buf).unwrap().0, 0);
    }

    #[test]
    fn a_receive_says_whether_it_left_data_behind() {
        let (mut a, b) = pair();
        let mut ring = ring();
        a.write_all(b"12345678").unwrap();
        ring.poll(b.as_fd(), 1, libc::POLLIN as u32, false).unwrap();
        ring.wait(Some(Duration::from_secs(5))).unwrap();
        assert!(ring.take(1).is_some(), "the bytes arrived");
        // Loopback delivers a write whole: half of it leaves the other half queued.
        let mut half = [0u8; 4];
        assert_eq!(ring.recv(b.as_fd(), &mut half).unwrap(), (4, true));
        let mut rest = [0u8; 16];
        let (n, more) = ring.recv(b.as_fd(), &mut rest).unwrap();
        assert_eq!(&rest[..n], b"5678");
        // Kernels before 6.0 do not say, and the answer is then always "maybe more".
        assert_eq!(more, !ring.reports_rest, "the socket is empty now");
    }

    #[test]
    fn a_full_socket_refuses_a_send_at_once_and_the_buffer_is_free_after() {
        let (a, mut b) = pair();
        let mut ring = ring();
        let mut sent = 0usize;
        loop {
            // A fresh buffer per call, dropped right after it: with the contract broken,
            // the kernel would write freed memory (which AddressSanitizer reports).
            let chunk = vec![0x5a_u8; 1 << 16];
            match ring.send(a.as_fd(), &chunk) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("send: {e}"),
            }
        }
        assert!(sent > 0);
        let mut total = 0;
        let mut buf = vec![0u8; 1 << 16];
        b.set_nonblocking(true).unwrap();
        while total < sent {
            match b.read(&mut buf) {
                Ok(n) => {
                    assert!(buf[..n].iter().all(|&x| x == 0x5a));
                    total += n;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => panic!("read: {e}"),
            }
        }
        assert_eq!(total, sent);
    }

    #[test]
    fn a_peer_killed_while_waiting_ends_the_wait_and_fails_the_transfers() {
        let (a, b) = pair();
        let mut ring = ring();
        ring.poll(b.as_fd(), 1, (libc::POLLIN | libc::POLLRDHUP) as u32, false)
            .unwrap();
        // Nothing yet: the timed wait ends empty.
        ring.wait(Some(Duration::from_millis(20))).unwrap();
        assert_eq!(ring.take(1), None);
        let killer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            // Unread data at close makes a reset, as a process that dies does.
            let mut b2 = b;
            b2.write_all(b"x").ok();
            drop(b2);
        });
        let mut a2 = a;
        std::thread::sleep(Duration::from_millis(1));
        a2.write_all(b"unread").unwrap();
        killer.join().unwrap();
        ring.wait(Some(Duration::from_secs(5))).unwrap();
        let r = ring.take(1).expect("the close is reported");
        assert!(r.events != 0);
        let mut buf = [0u8; 4];
        let mut outcome = ring.recv(a2.as_fd(), &mut buf).map(|(n, _)| n);
        while matches!(outcome, Ok(n) if n > 0) {
            outcome = ring.recv(a2.as_fd(), &mut buf).map(|(n, _)| n);
        }
        assert!(outcome.is_err() || outcome.as_ref().is_ok_and(|&n| n == 0));
    }

    #[test]
    fn a_guarded_receive_takes_the_urgent_byte_before_the_data() {
        // Alone, as the next byte of the stream: a plain receive would start at it.
        let (a, b) = pair();
        let mut ring = ring();
        socket2::SockRef::from(&a).send_out_of_band(&[9]).unwrap();
        std::thread::sleep(Duration::from_millis(10));
        let mut buf = [0u8; 8];
        let Guarded { received, urgent } = ring.recv_guarded(b.as_fd(), &mut buf).unwrap();
        assert_eq!(urgent, Some(9));
        let e = received.expect_err("nothing but the urgent byte came");
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        // Data before it is received, the byte taken apart from it.
        (&a).write_all(b"ab").unwrap();
        socket2::SockRef::from(&a).send_out_of_band(&[7]).unwrap();
        std::thread::sleep(Duration::from_millis(10));
        // A plain receive passes the position of the byte taken before.
        let mut plain = [0u8; 8];
        let n = (&b).read(&mut plain).unwrap();
        assert_eq!(&plain[..n], b"ab");
        let Guarded { received, urgent } = ring.recv_guarded(b.as_fd(), &mut buf).unwrap();
        assert_eq!(urgent, Some(7));
        let e = received.expect_err("only the urgent byte was left");
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        // Without an urgent byte it is a plain receive.
        let (c, d) = pair();
        (&c).write_all(b"xyz").unwrap();
        std::thread::sleep(Duration::from_millis(10));
        let Guarded { received, urgent } = ring.recv_guarded(d.as_fd(), &mut buf).unwrap();
        assert_eq!(urgent, None);
        let (n, _) = received.unwrap();
        assert_eq!(&buf[..n], b"xyz");
    }

    #[test]
    fn a_thread_that_refuses_setup_gets_eperm_and_others_do_not() {
        std::thread::spawn(|| {
            refuse_setup_on_this_thread().expect("seccomp filters (else the test cannot run)");
            let e = Ring::new(16, 8).expect_err("the filter refuses io_uring_setup");
            assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}");
            // Only io_uring_setup is refused: other calls still work.
            let (mut a, mut b) = pair();
            a.write_all(b"ok").unwrap();
            let mut got = [0u8; 2];
            b.read_exact(&mut got).unwrap();
            assert_eq!(&got, b"ok");
        })
        .join()
        .unwrap();
        // The filter is the thread's, not the process's.
        drop(ring());
    }

    #[test]
    fn an_exchange_sends_and_waits_in_the_kernel_for_the_peers_bytes() {
        for guard in [true, false] {
            exchange_waits_in_the_kernel(guard);
        }
    }

    fn exchange_waits_in_the_kernel(guard: bool) {
        let (a, mut b) = pair();
        let mut ring = ring();
        ring.guard_urgent(guard);
        let peer = std::thread::spawn(move || {
            let mut got = [0u8; 4];
            b.read_exact(&mut got).unwrap();
            // Later than the exchange's submission: its receive waits in the kernel.
            std::thread::sleep(Duration::from_millis(20));
            b.write_all(b"pong").unwrap();
            (got, b)
        });
        let mut buf = vec![0u8; 16];
        let deadline = Instant::now() + Duration::from_secs(10);
        let out = ring
            .exchange(
                Some((a.as_fd(), b"ping")),
                Some((a.as_fd(), &mut buf)),
                Some(deadline),
                |_| false,
            )
            .unwrap();
        assert_eq!(out.sent.unwrap().unwrap(), 4);
        let (n, _) = out.received.expect("received").unwrap();
        assert_eq!(&buf[..n], b"pong");
        // Spinning is off: one io_uring_enter submitted both and waited for both, the
        // send's completion (at once) and the receive's (20 ms later).
        assert_eq!(out.entered, 1, "system calls of the exchange");
        let (got, _b) = peer.join().unwrap();
        assert_eq!(&got, b"ping");
    }

    #[test]
    fn an_urgent_byte_that_comes_while_an_exchange_waits_is_taken_not_skipped() {
        // The byte comes alone, as the next byte of the stream, while the receive waits in
        // the kernel: a plain receive would start at its position, skip it, and the kernel
        // would forget it. Then the peer closes, as a rank that passed a notice on does.
        for then_data in [false, true] {
            let (a, b) = pair();
            let mut ring = ring();
            let peer = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                socket2::SockRef::from(&b).send_out_of_band(&[7]).unwrap();
                if then_data {
                    std::thread::sleep(Duration::from_millis(5));
                    (&b).write_all(b"after").unwrap();
                }
                std::thread::sleep(Duration::from_millis(20));
                drop(b);
            });
            let mut buf = vec![0u8; 16];
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut urgent = None;
            let mut got = Vec::new();
            loop {
                let received = if urgent.is_none() {
                    let out = receive(&mut ring, a.as_fd(), &mut buf, deadline, |_| false);
                    urgent = out.urgent;
                    out.received
                } else {
                    // Past the urgent byte as the exchange's documentation says.
                    std::thread::sleep(Duration::from_millis(1));
                    Some(ring.recv(a.as_fd(), &mut buf))
                };
                match received {
                    Some(Ok((0, _))) => break,
                    Some(Ok((n, _))) => got.extend_from_slice(&buf[..n]),
                    Some(Err(e)) if e.kind() == io::ErrorKind::WouldBlock => {}
                    None => {}
                    Some(Err(e)) => panic!("unexpected receive: {e}"),
                }
                assert!(Instant::now() < deadline, "the peer's close never came");
            }
            peer.join().unwrap();
            assert_eq!(urgent, Some(7), "then_data {then_data}");
            let expected: &[u8] = if then_data { b"after" } else { b"" };
            assert_eq!(got, expected, "the urgent byte stays out of the stream");
        }
    }

    #[test]
    fn an_exchange_past_its_deadline_cancels_the_receive_and_frees_the_buffer() {
        let (a, _b) = pair();
        let mut ring = ring();
        for _ in 0..8 {
            // A fresh buffer per call, dropped right after it: a receive left in flight
            // would write freed memory when the bytes below arrive (AddressSanitizer).
            let mut buf = vec![0u8; 64];
            let start = Instant::now();
            let deadline = start + Duration::from_millis(10);
            let out = receive(&mut ring, a.as_fd(), &mut buf, deadline, |_| false);
            assert!(out.received.is_none(), "nothing came: {:?}", out.received);
            assert!(out.sent.is_none());
            assert!(start.elapsed() >= Duration::from_millis(10));
            drop(buf);
        }
        // Bytes that arrive now go to the next receive, not to a cancelled one.
        let mut b = _b;
        b.write_all(b"late").unwrap();
        let mut buf = [0u8; 8];
        let out = receive(
            &mut ring,
            a.as_fd(),
            &mut buf,
            Instant::now() + Duration::from_secs(10),
            |_| false,
        );
        let (n, _) = out.received.unwrap().unwrap();
        assert_eq!(&buf[..n], b"late");
    }

    #[test]
    fn a_readiness_report_can_stop_an_exchange_in_flight() {
        let (a, _b) = pair();
        let (c, mut d) = pair();
        let mut ring = ring();
        ring.poll(c.as_fd(), 9, libc::POLLIN as u32, false).unwrap();
        let waker = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            d.write_all(b"!").unwrap();
            d
        });
        let mut buf = vec![0u8; 64];
        let start = Instant::now();
        let deadline = start + Duration::from_secs(10);
        let out = receive(&mut ring, a.as_fd(), &mut buf, deadline, |r| r.token == 9);
        drop(buf);
        assert!(out.received.is_none(), "{:?}", out.received);
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the report ended it"
        );
        assert!(ring.take(9).is_some(), "the report is kept for the caller");
        let _d = waker.join().unwrap();
    }

    #[test]
    fn a_peer_that_dies_ends_a_receive_in_flight() {
        let (a, mut b) = pair();
        let mut ring = ring();
        let killer = std::thread::spawn(move || {
            // Unread data at close makes a reset, as a process that dies does.
            let mut got = [0u8; 1];
            b.read_exact(&mut got).unwrap();
            std::thread::sleep(Duration::from_millis(20));
            drop(b);
        });
        let mut buf = vec![0u8; 64];
        let out = ring
            .exchange(
                Some((a.as_fd(), b"x")),
                Some((a.as_fd(), &mut buf)),
                Some(Instant::now() + Duration::from_secs(10)),
                |_| false,
            )
            .unwrap();
        killer.join().unwrap();
        assert_eq!(out.sent.unwrap().unwrap(), 1);
        match out.received.expect("the close completes the receive") {
            Ok((n, _)) => assert_eq!(n, 0, "a close, not data"),
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::ECONNRESET), "{e}"),
        }
    }

    #[test]
    fn dropping_the_ring_with_waits_armed_cancels_them() {
        let (_a, b) = pair();
        for _ in 0..64 {
            let mut ring = ring();
            ring.poll(b.as_fd(), 1, libc::POLLIN as u32, false).unwrap();
            ring.wait(Some(Duration::ZERO)).unwrap();
            drop(ring);
        }
    }
}
