//! Driving a collective: one loop for every transport (TCP's engine, RDMA's, shared
//! memory's), so one wait policy (spin, yield, block, deadline, close), with one rule for
//! whom to blame when it stalls and one for reading a failure notice.
//!
//! # The loop
//!
//! [`progress`] repeats: ask the driver to move what it can ([`Drive::advance`]); if
//! nothing moved, retry for [`Spin::total`] (without giving the CPU away for the first
//! [`Spin::eager`], with a spin-loop hint between retries, yielding it on every retry after
//! that), then block in [`Drive::wait`].
//! The deadline is `timeout` after the last time anything moved, and moves forward whenever
//! something does: the timeout bounds silence, not the collective's duration. When it
//! passes, [`Drive::stalled`] makes the error.
//!
//! # How a driver plugs in
//!
//! A backend wraps what one collective works on (its transport, its per-collective state
//! machines or lanes, the caller's buffers) in a short-lived struct and implements
//! [`Drive`] on it:
//!
//! - `advance`: pump every lane or state machine once, as far as it goes without
//!   blocking, and say whether any byte or completion moved (an error fails the
//!   collective);
//! - `finished`: whether every lane is done;
//! - `assume_ready`: called before each spinning retry; a transport that only tries sockets
//!   the poller reported ready marks them all ready, so that the retry is the read itself
//!   (one system call instead of two);
//! - `wait(until)`: block on the poller until something may have changed, or `until`;
//!   `Ok(false)` means `until` passed with nothing. A driver may also return early
//!   (`Ok(true)`) after a shorter nap of its own;
//! - `stalled(timeout)`: the error for the silence, naming the peer. Feed [`blame`] what
//!   each connection waits on ([`Wait`]: a receive or a send, and when the connection last
//!   heard from its peer), or keep an [`Activity`] tracker up to date and ask it;
//! - `aborted()`: whether the group was closed from another thread (the group's
//!   [`CloseFlag`](super::state::CloseFlag)); a `wait` that can block for long must be
//!   woken by that close too.
//!
//! Failure notices (a failing rank naming the rank it lost, to peers not next to it) are
//! read by each transport; [`notice_names`] is the rule for which ranks a notice may name.

use std::time::{Duration, Instant};

use crate::error::{Error, PeerOp, Result};

/// How a collective that cannot move waits before it blocks.
///
/// Waking a thread that sleeps on another CPU costs ~100 µs on the 2-vCPU VMs this was
/// measured on, against a ~10 µs round trip, so a collective first retries its transfers
/// for a while. Ranks that share CPUs must not spin, or they starve the peer they wait for:
/// there, every retry yields the CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Spin {
    /// How long to retry before blocking.
    pub(crate) total: Duration,
    /// How long to retry without yielding first.
    pub(crate) eager: Duration,
}

impl Spin {
    /// The policy for a rank that shares this machine with `local_ranks` ranks (itself
    /// included): eager only if every rank can have a CPU of its own.
    pub(crate) fn for_local_ranks(total: Duration, local_ranks: usize) -> Spin {
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        let eager = if local_ranks <= cpus {
            Duration::from_micros(10)
        } else {
            Duration::ZERO
        };
        Spin {
            total,
            eager: eager.min(total),
        }
    }
}

/// One collective in flight, as [`progress`] drives it (see the module docs).
pub(crate) trait Drive {
    /// Moves what can move without blocking; returns whether anything did.
    ///
    /// # Errors
    ///
    /// A transport error, naming the peer; it ends the collective.
    fn advance(&mut self) -> Result<bool>;

    /// Whether the collective is complete.
    fn finished(&self) -> bool;

    /// Called before each retry while spinning: the next `advance` should try every
    /// transfer, not only those the poller reported ready.
    fn assume_ready(&mut self) {}

    /// Blocks until something may have changed, or until `until`. Returns `Ok(false)` if
    /// `until` passed with nothing to report.
    ///
    /// # Errors
    ///
    /// The poller failed, or the driver learnt that a peer it needs is gone.
    fn wait(&mut self, until: Instant) -> Result<bool>;

    /// The error for a collective in which nothing moved for `timeout`.
    fn stalled(&mut self, timeout: Duration) -> Error;

    /// [`Error::Aborted`] if the group was closed from another thread (its
    /// [`CloseFlag`](super::state::CloseFlag) is raised), else `None`. Asked once per round
    /// of the loop, so it must be cheap: one atomic load. A driver whose `wait` can block
    /// for long must also be woken by the close (the ring's poller has a waker for it).
    fn aborted(&self) -> Option<Error>;
}

/// Drives `driver` until it finishes.
///
/// # Errors
///
/// What the driver's `advance` or `wait` return, its `stalled` error once nothing moved
/// for `timeout`, or its `aborted` error as soon as the group is closed from another thread
/// (checked on every round: after each pass, spin retry and wake-up). A collective whose
/// bytes all moved returns `Ok` even if the close came meanwhile.
pub(crate) fn progress<D: Drive>(driver: &mut D, timeout: Duration, spin: Spin) -> Result<()> {
    let mut idle_since: Option<Instant> = None;
    loop {
        if driver.finished() {
            return Ok(());
        }
        if let Some(aborted) = driver.aborted() {
            return Err(aborted);
        }
        if driver.advance()? {
            // Only a pass that moved nothing may block: a lane advanced earlier in this
            // pass may have become ready since.
            idle_since = None;
            continue;
        }
        let now = Instant::now();
        let since = *idle_since.get_or_insert(now);
        let idle = now - since;
        // Spinning is part of the silence the timeout bounds: it ends at the deadline
        // however long `spin.total` is.
        if idle < spin.total && idle < timeout {
            // Poll by retrying the transfers themselves; past the first microseconds (in
            // which a peer on its own CPU answers), give the CPU away on every retry, for
            // ranks that share one. Before that, a spin-loop hint between retries: a retry
            // that is one load of a shared-memory word would otherwise keep requesting the
            // cache line its writer needs, and leave the loop through a pipeline flush
            // when the word changes (shared memory's 4 B all_sum at P = 2: median 0.385 ->
            // 0.375 µs, eight interleaved rounds; a socket's retry is a system call, which
            // the hint's few dozen cycles do not change).
            if idle >= spin.eager {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
            driver.assume_ready();
            continue;
        }
        let deadline = crate::options::deadline(since, timeout);
        if now >= deadline || !driver.wait(deadline)? {
            // A close that woke the wait at the deadline is still a close, not a stall.
            return Err(driver.aborted().unwrap_or_else(|| driver.stalled(timeout)));
        }
    }
}

/// What one connection waits on, for [`blame`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Wait {
    /// The connection (an index the driver understands).
    pub(crate) conn: usize,
    /// A receive, if any is outstanding on it; else a send.
    pub(crate) op: PeerOp,
    /// When the connection last heard from its peer (or the collective started).
    pub(crate) last: Instant,
}

/// The rule for whom a stalled collective blames: of the connections with work
/// outstanding, one waiting to receive before one waiting to send, and among those the one
/// silent longest.
///
/// When one rank stalls (stopped, swapped out, stuck elsewhere), every rank waiting on it,
/// directly or through others, times out at about the same moment, so "the peer I was
/// waiting for" is right only for the stalled rank's neighbours. The stalled rank went
/// silent first (the others forwarded what they had before blocking), and a send can wait
/// only because a peer stopped reading, which a receive waiting on that same peer shows
/// better. Returns `None` if nothing is outstanding.
pub(crate) fn blame(waits: impl IntoIterator<Item = Wait>) -> Option<Wait> {
    waits
        .into_iter()
        .min_by_key(|w| (w.op != PeerOp::Receive, w.last))
}

/// Per-connection bookkeeping for [`blame`], for a driver that posts requests and sees them
/// complete (JACCL): how many of each are outstanding and when each connection last
/// completed something.
#[cfg_attr(
    not(feature = "jaccl"),
    allow(dead_code, reason = "only JACCL posts requests and sees them complete")
)]
#[derive(Debug, Default)]
pub(crate) struct Activity {
    conns: Vec<Outstanding>,
}

#[cfg_attr(
    not(feature = "jaccl"),
    allow(dead_code, reason = "only JACCL posts requests and sees them complete")
)]
#[derive(Clone, Copy, Debug)]
struct Outstanding {
    sends: usize,
    recvs: usize,
    last: Instant,
}

#[cfg_attr(
    not(feature = "jaccl"),
    allow(dead_code, reason = "only JACCL posts requests and sees them complete")
)]
impl Activity {
    /// Starts a collective on `conns` connections, nothing outstanding, all heard from now.
    pub(crate) fn start(&mut self, conns: usize) {
        let now = Instant::now();
        self.conns.clear();
        self.conns.resize(
            conns,
            Outstanding {
                sends: 0,
                recvs: 0,
                last: now,
            },
        );
    }

    /// A request of kind `op` (a send or a receive) was posted on `conn`.
    pub(crate) fn posted(&mut self, conn: usize, op: PeerOp) {
        let c = &mut self.conns[conn];
        match op {
            PeerOp::Receive => c.recvs += 1,
            _ => c.sends += 1,
        }
    }

    /// A request of kind `op` completed on `conn`: the connection is alive now.
    pub(crate) fn completed(&mut self, conn: usize, op: PeerOp) {
        let c = &mut self.conns[conn];
        match op {
            PeerOp::Receive => c.recvs = c.recvs.saturating_sub(1),
            _ => c.sends = c.sends.saturating_sub(1),
        }
        c.last = Instant::now();
    }

    /// Whether anything is outstanding on `conn`.
    pub(crate) fn busy(&self, conn: usize) -> bool {
        self.conns.get(conn).is_some_and(|c| c.sends + c.recvs > 0)
    }

    /// What each busy connection waits on.
    pub(crate) fn waits(&self) -> impl Iterator<Item = Wait> + '_ {
        self.conns
            .iter()
            .enumerate()
            .filter(|(_, c)| c.sends + c.recvs > 0)
            .map(|(conn, c)| Wait {
                conn,
                op: if c.recvs > 0 {
                    PeerOp::Receive
                } else {
                    PeerOp::Send
                },
                last: c.last,
            })
    }

    /// [`blame`] over [`Activity::waits`].
    pub(crate) fn blame(&self) -> Option<Wait> {
        blame(self.waits())
    }
}

/// The rank a failure notice from `sender` may name: `lost`, if it is a rank of the group
/// of `size` other than the sender and `me`. A notice naming anything else is ignored (the
/// sender itself is then the better suspect). The rule of every transport's notices: TCP's
/// urgent bytes (`transport::tcp::notice`) and JACCL's side channel.
pub(crate) fn notice_names(lost: usize, sender: usize, me: usize, size: usize) -> Option<usize> {
    (lost < size && lost != sender && lost != me).then_some(lost)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake collective: `moves` says, per `advance` call, whether something moved (then
    /// nothing), and when it has moved `needed` times it is finished.
    struct Fake {
        moves: Vec<bool>,
        calls: usize,
        moved: usize,
        needed: usize,
        waits: usize,
        /// Each `wait` naps this long at most (as JACCL's do) instead of up to `until`.
        nap: Option<Duration>,
        activity: Activity,
        peers: Vec<usize>,
        /// Set by another thread to close the group.
        closed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    }

    impl Fake {
        fn new(moves: Vec<bool>, needed: usize) -> Fake {
            let mut activity = Activity::default();
            activity.start(3);
            Fake {
                moves,
                calls: 0,
                moved: 0,
                needed,
                waits: 0,
                nap: None,
                activity,
                peers: vec![4, 5, 6],
                closed: Default::default(),
            }
        }
    }

    impl Drive for Fake {
        fn advance(&mut self) -> Result<bool> {
            let moved = self.moves.get(self.calls).copied().unwrap_or(false);
            self.calls += 1;
            if moved {
                self.moved += 1;
            }
            Ok(moved)
        }
        fn finished(&self) -> bool {
            self.moved >= self.needed
        }
        fn wait(&mut self, until: Instant) -> Result<bool> {
            self.waits += 1;
            let now = Instant::now();
            match self.nap {
                Some(nap) => {
                    std::thread::sleep(nap.min(until.saturating_duration_since(now)));
                    Ok(true)
                }
                None => {
                    std::thread::sleep(until.saturating_duration_since(now));
                    Ok(false)
                }
            }
        }
        fn stalled(&mut self, timeout: Duration) -> Error {
            let w = self.activity.blame().expect("work is outstanding");
            Error::Timeout {
                peer: self.peers[w.conn],
                addr: None,
                op: w.op,
                context: crate::error::Phase::AllSum,
                after: timeout,
            }
        }
        fn aborted(&self) -> Option<Error> {
            self.closed
                .load(std::sync::atomic::Ordering::Acquire)
                .then_some(Error::Aborted {
                    context: crate::error::Phase::AllSum,
                })
        }
    }

    /// Closes `f`'s group from another thread after `after`.
    fn close_later(f: &Fake, after: Duration) -> std::thread::JoinHandle<()> {
        let closed = f.closed.clone();
        std::thread::spawn(move || {
            std::thread::sleep(after);
            closed.store(true, std::sync::atomic::Ordering::Release);
        })
    }

    const NO_SPIN: Spin = Spin {
        total: Duration::ZERO,
        eager: Duration::ZERO,
    };

    #[test]
    fn a_collective_that_keeps_moving_finishes_without_waiting() {
        let mut f = Fake::new(vec![true; 5], 5);
        progress(&mut f, Duration::from_secs(5), NO_SPIN).unwrap();
        assert_eq!((f.calls, f.waits), (5, 0));
    }

    #[test]
    fn a_finished_collective_does_not_advance() {
        let mut f = Fake::new(vec![], 0);
        progress(&mut f, Duration::from_secs(5), NO_SPIN).unwrap();
        assert_eq!(f.calls, 0);
    }

    #[test]
    fn spinning_retries_before_waiting() {
        // Moves once, then after a few empty retries moves again and finishes.
        let mut f = Fake::new(vec![true, false, false, false, true], 2);
        let spin = Spin {
            total: Duration::from_secs(5),
            eager: Duration::from_secs(5),
        };
        progress(&mut f, Duration::from_secs(5), spin).unwrap();
        assert_eq!((f.calls, f.waits), (5, 0), "it spun instead of waiting");
    }

    #[test]
    fn a_silent_collective_times_out_naming_the_peer_silent_longest() {
        let mut f = Fake::new(vec![], 1);
        // conn 0 (rank 4) sends only; conn 1 (rank 5) receives, heard from later than
        // conn 2 (rank 6), which also receives: rank 6 is the suspect.
        f.activity.posted(0, PeerOp::Send);
        f.activity.posted(2, PeerOp::Receive);
        std::thread::sleep(Duration::from_millis(5));
        f.activity.posted(1, PeerOp::Receive);
        f.activity.posted(1, PeerOp::Receive);
        f.activity.completed(1, PeerOp::Receive);
        let timeout = Duration::from_millis(50);
        let start = Instant::now();
        let e = progress(&mut f, timeout, NO_SPIN).unwrap_err();
        let took = start.elapsed();
        assert!(
            matches!(
                e,
                Error::Timeout {
                    peer: 6,
                    op: PeerOp::Receive,
                    after,
                    ..
                } if after == timeout
            ),
            "{e}"
        );
        assert!(took >= timeout, "gave up after {took:?}");
        assert!(took < timeout * 20, "took {took:?}");
    }

    #[test]
    fn the_deadline_moves_forward_with_progress() {
        // Naps of 10 ms; something moves on every 4th advance, 12 times: about 360 ms in
        // all, far more than the 100 ms timeout, yet never 100 ms of silence.
        let pattern: Vec<bool> = (0..48).map(|i| i % 4 == 3).collect();
        let mut f = Fake::new(pattern, 12);
        f.nap = Some(Duration::from_millis(10));
        f.activity.posted(0, PeerOp::Receive);
        let timeout = Duration::from_millis(100);
        let start = Instant::now();
        progress(&mut f, timeout, NO_SPIN).unwrap();
        assert!(start.elapsed() > timeout, "too fast to show anything");
        assert_eq!(f.moved, 12);
    }

    #[test]
    fn naps_end_at_the_deadline() {
        // A driver that naps briefly and never reports silence still times out.
        let mut f = Fake::new(vec![], 1);
        f.nap = Some(Duration::from_millis(5));
        f.activity.posted(1, PeerOp::Send);
        let timeout = Duration::from_millis(40);
        let start = Instant::now();
        let e = progress(&mut f, timeout, NO_SPIN).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Timeout {
                    peer: 5,
                    op: PeerOp::Send,
                    ..
                }
            ),
            "{e}"
        );
        assert!(start.elapsed() >= timeout);
        assert!(f.waits >= 2, "{} waits", f.waits);
    }

    #[test]
    fn spinning_ends_at_the_deadline() {
        // The spin is part of the silence: with a spin longer than the timeout (even
        // forever), the collective fails at the deadline, without waiting in between.
        // The spin's 60 s is far beyond the 20 ms timeout, so a starved test thread (a
        // loaded machine) cannot pass for a spin that stopped early.
        for total in [Duration::from_secs(60), Duration::MAX] {
            let mut f = Fake::new(vec![], 1);
            f.activity.posted(0, PeerOp::Receive);
            let spin = Spin {
                total,
                eager: total,
            };
            let timeout = Duration::from_millis(20);
            let start = Instant::now();
            let e = progress(&mut f, timeout, spin).unwrap_err();
            let took = start.elapsed();
            assert!(matches!(e, Error::Timeout { peer: 4, .. }), "{e}");
            assert_eq!(f.waits, 0);
            assert!(took >= timeout, "gave up after {took:?}");
            assert!(took < Duration::from_secs(30), "spun for {took:?}");
        }
    }

    #[test]
    fn a_timeout_beyond_the_clock_does_not_overflow() {
        // Something moves at once, then the collective finishes after a wait: the
        // deadline is computed (and waited on) with a timeout no Instant can hold.
        let mut f = Fake::new(vec![true, false, true], 2);
        f.nap = Some(Duration::from_millis(1));
        f.activity.posted(0, PeerOp::Receive);
        progress(&mut f, Duration::MAX, NO_SPIN).unwrap();
        assert_eq!(f.waits, 1);
    }

    #[test]
    fn a_close_ends_a_spinning_collective() {
        // Spins for up to 10 s without ever waiting: only the per-round check can end it.
        let mut f = Fake::new(vec![], 1);
        f.activity.posted(0, PeerOp::Receive);
        let spin = Spin {
            total: Duration::from_secs(10),
            eager: Duration::ZERO,
        };
        let closer = close_later(&f, Duration::from_millis(50));
        let start = Instant::now();
        let e = progress(&mut f, Duration::from_secs(20), spin).unwrap_err();
        closer.join().unwrap();
        assert!(matches!(e, Error::Aborted { .. }), "{e}");
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
        assert_eq!(f.waits, 0);
    }

    #[test]
    fn a_close_ends_a_waiting_collective_without_a_stall() {
        let mut f = Fake::new(vec![], 1);
        f.nap = Some(Duration::from_millis(5));
        f.activity.posted(0, PeerOp::Receive);
        let closer = close_later(&f, Duration::from_millis(50));
        let start = Instant::now();
        let e = progress(&mut f, Duration::from_secs(20), NO_SPIN).unwrap_err();
        closer.join().unwrap();
        assert!(matches!(e, Error::Aborted { .. }), "{e}");
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
        assert!(
            f.waits >= 2,
            "it waited before the close ({} waits)",
            f.waits
        );
    }

    #[test]
    fn a_close_at_the_deadline_is_reported_as_a_close() {
        // The wait sleeps to the deadline and reports nothing; the group was closed
        // meanwhile.
        let mut f = Fake::new(vec![], 1);
        f.activity.posted(0, PeerOp::Receive);
        let closer = close_later(&f, Duration::from_millis(10));
        let e = progress(&mut f, Duration::from_millis(300), NO_SPIN).unwrap_err();
        closer.join().unwrap();
        assert!(matches!(e, Error::Aborted { .. }), "{e}");
    }

    #[test]
    fn a_closed_group_moves_nothing_but_a_finished_collective_stands() {
        let mut f = Fake::new(vec![true], 1);
        f.closed.store(true, std::sync::atomic::Ordering::Release);
        let e = progress(&mut f, Duration::from_secs(1), NO_SPIN).unwrap_err();
        assert!(matches!(e, Error::Aborted { .. }), "{e}");
        assert_eq!(f.calls, 0, "nothing is moved after the close");

        // Once every byte moved, the result stands, closed or not.
        let mut f = Fake::new(vec![true], 1);
        progress(&mut f, Duration::from_secs(1), NO_SPIN).unwrap();
        f.closed.store(true, std::sync::atomic::Ordering::Release);
        progress(&mut f, Duration::from_secs(1), NO_SPIN).unwrap();
    }

    #[test]
    fn blame_prefers_a_receive_then_the_longest_silence() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_millis(1);
        let w = |conn, op, last| Wait { conn, op, last };
        assert_eq!(blame([]), None);
        let sends = [w(0, PeerOp::Send, t1), w(1, PeerOp::Send, t0)];
        assert_eq!(blame(sends).map(|w| w.conn), Some(1));
        let mixed = [
            w(0, PeerOp::Send, t0),
            w(1, PeerOp::Receive, t1),
            w(2, PeerOp::Receive, t1 + Duration::from_millis(1)),
        ];
        assert_eq!(blame(mixed).map(|w| w.conn), Some(1));
    }

    #[test]
    fn activity_tracks_outstanding_work() {
        let mut a = Activity::default();
        a.start(2);
        assert_eq!(a.blame(), None);
        a.posted(1, PeerOp::Send);
        a.posted(1, PeerOp::Receive);
        assert!(a.busy(1) && !a.busy(0) && !a.busy(9));
        assert_eq!(
            a.blame().map(|w| (w.conn, w.op)),
            Some((1, PeerOp::Receive))
        );
        a.completed(1, PeerOp::Receive);
        assert_eq!(a.blame().map(|w| (w.conn, w.op)), Some((1, PeerOp::Send)));
        a.completed(1, PeerOp::Send);
        // A stray completion does not underflow.
        a.completed(1, PeerOp::Send);
        assert_eq!(a.blame(), None);
        a.start(1);
        assert!(!a.busy(1), "a new collective starts clean");
    }

    #[test]
    fn a_notice_names_a_third_rank_only() {
        // Rank 1 hears from rank 2 in a group of 4.
        assert_eq!(notice_names(3, 2, 1, 4), Some(3));
        assert_eq!(notice_names(0, 2, 1, 4), Some(0));
        assert_eq!(notice_names(2, 2, 1, 4), None, "the sender itself");
        assert_eq!(notice_names(1, 2, 1, 4), None, "this rank");
        assert_eq!(notice_names(4, 2, 1, 4), None, "out of range");
        assert_eq!(notice_names(usize::MAX, 2, 1, 4), None);
    }
}
