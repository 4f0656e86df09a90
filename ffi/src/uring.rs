//! io_uring (Linux): the ring's sends and receives, and its readiness waits, as io_uring
//! operations.
//!
//! The contract that makes this safe to offer as a safe API: **no operation that references
//! a caller's memory outlives the call that submitted it.** [`Ring::recv`], [`Ring::send`]
//! and [`Ring::send_pair`] push one entry with `MSG_DONTWAIT` (so the kernel completes it at
//! once, with `EAGAIN` if the socket has nothing or no room, instead of parking it), enter
//! the kernel, and return only once that entry's completion has been reaped. Success, error,
//! a timeout elsewhere or a close from another thread: none of these can end the borrow
//! while the kernel still holds the pointer, because the borrow lasts the whole call and
//! the call does not return before the completion. A failure of `io_uring_enter` that
//! leaves the entry's fate unknown cannot be survived soundly and aborts the process (it
//! does not happen with a valid ring: see SAFETY.md).
//!
//! Readiness waits ([`Ring::poll`]) reference no memory, only a descriptor; they may stay
//! armed between calls and are cancelled when the ring is dropped (closing the ring's
//! descriptor cancels them).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::Duration;

use io_uring::{IoUring, opcode, types};

/// `user_data` of the one transfer in flight (there is never more than one).
const TRANSFER: u64 = 1 << 63;

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

/// One io_uring instance and the readiness it reported and the caller has not yet taken.
pub struct Ring {
    ring: IoUring,
    ready: Vec<Readiness>,
    /// Whether receives report a socket left non-empty (`IORING_CQE_F_SOCK_NONEMPTY`,
    /// filled in for TCP since Linux 6.0, which is also when `IORING_OP_SEND_ZC` came:
    /// that opcode's presence is the test).
    reports_rest: bool,
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
        let ring = IoUring::new(entries)?;
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
        let entry = entry.user_data(TRANSFER);
        // SAFETY: the entry references memory the caller borrows for this whole call (a
        // buffer, or `iov`/`msg` on `send_pair`'s frame), and this function does not return
        // before the entry's completion has been reaped: the loop below either reaps it or
        // aborts the process.
        let pushed = unsafe { self.ring.submission().push(&entry) };
        if pushed.is_err() {
            // The queue is full of readiness waits (no memory): submit them, then retry.
            self.enter(0)?;
            // SAFETY: as above.
            let again = unsafe { self.ring.submission().push(&entry) };
            if again.is_err() {
                return Err(io::Error::other("the io_uring submission queue stays full"));
            }
        }
        loop {
            match self.ring.submitter().submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if transient(&e) => {}
                Err(e) => {
                    // The entry may or may not be in the kernel's hands, with a pointer into
                    // memory the caller gets back when this returns: no sound way on.
                    eprintln!(
                        "nuvec-distributed: io_uring_enter failed with a transfer in flight \
                         ({e}); aborting, as the kernel may still write the caller's buffer"
                    );
                    std::process::abort();
                }
            }
            if let Some((result, flags)) = self.reap() {
                return if result >= 0 {
                    Ok((result as usize, flags))
                } else {
                    Err(io::Error::from_raw_os_error(-result))
                };
            }
        }
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
    /// and the transfer's result, if it is there, returned.
    fn reap(&mut self) -> Option<(i32, u32)> {
        let mut transfer = None;
        for cqe in self.ring.completion() {
            let data = cqe.user_data();
            if data == TRANSFER {
                transfer = Some((cqe.result(), cqe.flags()));
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
            match self.ready.iter_mut().find(|r| r.token == token) {
                Some(r) => {
                    r.events |= events;
                    r.ended |= ended;
                }
                None => self.ready.push(Readiness {
                    token,
                    events,
                    ended,
                }),
            }
        }
        transfer
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
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsFd;

    use super::*;

    fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (b, _) = listener.accept().unwrap();
        (a, b)
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
    fn an_urgent_byte_is_reported_as_priority() {
        let (a, b) = pair();
        let mut ring = ring();
        ring.poll(b.as_fd(), 3, libc::POLLPRI as u32, true).unwrap();
        socket2::SockRef::from(&a).send_out_of_band(&[9]).unwrap();
        ring.wait(Some(Duration::from_secs(5))).unwrap();
        let r = ring.take(3).expect("priority reported");
        assert!(r.events & libc::POLLPRI as u32 != 0);
        assert!(!r.ended, "a multishot wait stays armed");
        assert_eq!(crate::net::recv_urgent_byte(b.as_fd()).unwrap(), Some(9));
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
