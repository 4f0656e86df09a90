//! Driving a collective: one loop for every transport (TCP's engine, RDMA's, shared
//! memory's), so one wait policy (spin, yield, block, deadline, close), with one rule for
//! whom to blame when it stalls and one for reading a failure notice.
//!
//! # The loop
//!
//! [`progress`] repeats: ask the driver to move what it can ([`Drive::advance`]); if
//! nothing moved, retry for [`Spin::total`] (without giving the CPU away for the first
//! [`Spin::eager`], with a spin-loop hint between retries, yielding it on every retry after
//! that), then block in [`Drive::wait`]. The group's [`WaitPolicy`] sets the spin for each
//! collective, fixed or learned from how long its recent collectives waited
//! ([`LearnedSpin`]), and is told how long this one did.
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

/// How one wait of a collective that cannot move spins before it blocks: what a
/// [`WaitPolicy`] decides for the next collective.
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

/// How long a rank that has a CPU of its own retries without yielding.
const EAGER: Duration = Duration::from_micros(10);

/// A group's wait policy: how long its collectives spin before they block, fixed
/// ([`Options::spin`](crate::Options::spin) set, `NUVEC_DISTRIBUTED_SPIN_US`) or learned
/// from the group's own recent waits ([`LearnedSpin`], the default).
///
/// One per transport a group waits on (a hierarchical group has one for its shared memory
/// and one for its TCP links), kept with the group's state: [`progress`] asks it for the
/// [`Spin`] of each collective and tells it how long that collective waited.
#[derive(Clone, Debug)]
pub(crate) struct WaitPolicy {
    /// How long to retry without yielding (at most the budget).
    eager: Duration,
    budget: Budget,
}

#[derive(Clone, Debug)]
enum Budget {
    Fixed(Duration),
    Learned(LearnedSpin),
}

impl WaitPolicy {
    /// The policy for a rank that shares this machine with `local_ranks` ranks (itself
    /// included): eager only if every rank can have a CPU of its own; `fixed` the spin
    /// budget, or `None` to learn it.
    pub(crate) fn for_local_ranks(fixed: Option<Duration>, local_ranks: usize) -> WaitPolicy {
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        let eager = if local_ranks <= cpus {
            EAGER
        } else {
            Duration::ZERO
        };
        WaitPolicy {
            eager,
            budget: match fixed {
                Some(total) => Budget::Fixed(total),
                None => Budget::Learned(LearnedSpin::new()),
            },
        }
    }

    /// A policy that always spins as `spin` says.
    #[cfg_attr(
        not(any(test, feature = "jaccl")),
        allow(dead_code, reason = "only JACCL and tests fix a spin this way")
    )]
    pub(crate) const fn fixed(spin: Spin) -> WaitPolicy {
        WaitPolicy {
            eager: spin.eager,
            budget: Budget::Fixed(spin.total),
        }
    }

    /// How the next collective spins.
    pub(crate) fn spin(&self) -> Spin {
        let total = match &self.budget {
            Budget::Fixed(total) => *total,
            Budget::Learned(learned) => learned.budget(),
        };
        Spin {
            total,
            eager: self.eager.min(total),
        }
    }

    /// A collective completed after waiting `waited` for its peers at most (its longest
    /// stretch in which nothing moved).
    #[inline]
    pub(crate) fn record(&mut self, waited: Duration) {
        if let Budget::Learned(learned) = &mut self.budget {
            learned.record(waited);
        }
    }
}

/// A spin budget learned from a group's last [`LearnedSpin::WINDOW`] waits.
///
/// A spin pays off when the peer's data arrives before the spin ends (the ~100 µs wake-up
/// is saved) and costs its whole length in CPU when it does not. So the budget covers the
/// waits a spin can reach: of the recorded waits up to [`LearnedSpin::CAP`], the 90th
/// percentile plus a quarter (waits near it vary by a few percent), at least
/// [`LearnedSpin::FLOOR`] and at most the cap, as long as such waits are at least half of
/// the window; otherwise (a group idle between calls, or whose peers are late by more than
/// the cap) the floor. A rank whose peer finishes a layer ~1 ms later than it stays hot
/// (it spins ~1.25 ms and sees the data at once), and a server whose calls come 100 ms
/// apart spins only the floor: 10 µs per call.
///
/// Samples are kept as nanoseconds in a fixed ring (no allocation per call) and the budget
/// is recomputed after every [`LearnedSpin::RELEARN`] waits (each of the first ones, so a
/// new group adapts at once): one pass over 32 numbers that keeps the largest few, out of
/// the path of most calls.
#[derive(Clone, Debug)]
pub(crate) struct LearnedSpin {
    /// The last waits, ns (saturating at `u32::MAX`, 4.3 s: far beyond the cap).
    samples: [u32; LearnedSpin::WINDOW],
    /// How many of `samples` hold waits (up to the window).
    filled: usize,
    /// Where the next wait goes.
    next: usize,
    /// Waits recorded since the budget was last computed.
    fresh: usize,
    /// Whether the window changed since the budget was last computed (it grew, or a wait
    /// replaced a different one): else the budget, a function of the window, stays.
    changed: bool,
    budget: Duration,
}

impl LearnedSpin {
    /// How many waits the budget is learned from.
    pub(crate) const WINDOW: usize = 32;
    /// The least budget: a peer that answers within a round trip is always caught hot.
    pub(crate) const FLOOR: Duration = Duration::from_micros(10);
    /// The most budget: longer waits block in the kernel, where a wake-up costs ~100 µs,
    /// 5% of this or less.
    pub(crate) const CAP: Duration = Duration::from_millis(2);
    /// The budget before any wait is recorded: the fixed default this policy replaced.
    pub(crate) const INITIAL: Duration = Duration::from_micros(50);
    /// The budget is recomputed after this many waits.
    pub(crate) const RELEARN: usize = 8;

    pub(crate) fn new() -> LearnedSpin {
        LearnedSpin {
            samples: [0; LearnedSpin::WINDOW],
            filled: 0,
            next: 0,
            fresh: 0,
            changed: false,
            budget: LearnedSpin::INITIAL,
        }
    }

    /// The budget of the next wait.
    pub(crate) fn budget(&self) -> Duration {
        self.budget
    }

    /// A wait of `waited` completed.
    ///
    /// Inline for the common case of a rank whose peers are ahead: a wait of zero that
    /// replaces a zero in a full window, before the next relearn, moves only the position
    /// and the count (what the general path does with it too); every other wait takes
    /// [`LearnedSpin::record_any`]. Shared memory's 4 B all_sum at P = 2 under callgrind:
    /// ~14 instructions per call here, against 56 for the general path out of line.
    #[inline]
    pub(crate) fn record(&mut self, waited: Duration) {
        if waited.is_zero()
            && self.filled == LearnedSpin::WINDOW
            && self.fresh + 1 < LearnedSpin::RELEARN
            && self.samples[self.next] == 0
        {
            self.next = (self.next + 1) % LearnedSpin::WINDOW;
            self.fresh += 1;
            return;
        }
        self.record_any(waited);
    }

    /// [`LearnedSpin::record`] for any wait.
    #[inline(never)]
    fn record_any(&mut self, waited: Duration) {
        let ns = u32::try_from(waited.as_nanos()).unwrap_or(u32::MAX);
        let old = std::mem::replace(&mut self.samples[self.next], ns);
        self.changed |= old != ns || self.filled < LearnedSpin::WINDOW;
        self.next = (self.next + 1) % LearnedSpin::WINDOW;
        self.filled = (self.filled + 1).min(LearnedSpin::WINDOW);
        self.fresh += 1;
        if self.filled <= LearnedSpin::RELEARN || self.fresh >= LearnedSpin::RELEARN {
            // A window of equal waits (a rank whose peers are always ahead waits 0 every
            // time) keeps its budget without the pass over it.
            if self.changed {
                self.budget = Self::learn(&self.samples[..self.filled]);
            }
            self.fresh = 0;
            self.changed = false;
        }
    }

    /// The budget for these waits, ns (see the type's docs).
    ///
    /// The 90th percentile of `n` samples is the `n - ceil(0.9 n) + 1`-th largest, so one
    /// pass keeps the [`TOP`] largest samples within the cap, largest first, and reads it
    /// there: no copy of the window and no selection over it (this runs after every
    /// [`LearnedSpin::RELEARN`] collectives, small ones among them).
    fn learn(samples: &[u32]) -> Duration {
        let cap = u32::try_from(LearnedSpin::CAP.as_nanos()).unwrap_or(u32::MAX);
        // Zeros stand for samples not seen: every sample is at least 0, and the rank read
        // below is never past the samples counted.
        let mut top = [0u32; TOP];
        let mut n = 0;
        for &s in samples.iter().filter(|&&s| s <= cap) {
            n += 1;
            let mut i = TOP;
            while i > 0 && top[i - 1] < s {
                if i < TOP {
                    top[i] = top[i - 1];
                }
                i -= 1;
            }
            if i < TOP {
                top[i] = s;
            }
        }
        if n == 0 || n * 2 < samples.len() {
            return LearnedSpin::FLOOR;
        }
        // The 90th percentile: the sample with ceil(0.9 n) samples at or below it, the
        // (n - ceil(0.9 n) + 1)-th largest.
        let at = (n * 9).div_ceil(10) - 1;
        let p90 = top.get(n - 1 - at).copied().unwrap_or(0);
        let budget = Duration::from_nanos(u64::from(p90) + u64::from(p90 / 4));
        budget.clamp(LearnedSpin::FLOOR, LearnedSpin::CAP)
    }
}

/// How many of the largest samples [`LearnedSpin::learn`] keeps: the most that lie at or
/// above the 90th percentile of a window of at most [`LearnedSpin::WINDOW`] samples.
const TOP: usize = LearnedSpin::WINDOW + 1 - (LearnedSpin::WINDOW * 9).div_ceil(10);

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

    /// The longest wait for peers made inside [`Drive::advance`] so far, for a driver
    /// whose `advance` may itself wait (io_uring's steps wait in the kernel for their
    /// receive): the policy learns from it as from the stretches in which `advance` moved
    /// nothing. Zero for drivers that never wait in `advance`.
    fn waited(&self) -> Duration {
        Duration::ZERO
    }

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
pub(crate) fn progress<D: Drive>(
    driver: &mut D,
    timeout: Duration,
    policy: &mut WaitPolicy,
) -> Result<()> {
    let spin = policy.spin();
    // The current stretch in which nothing moved: when it began, and when it was last
    // seen still idle (its end, to within one retry or wake-up). The clock is read only
    // once a pass moved nothing: a collective whose peers are ahead reads it never.
    let mut stretch: Option<(Instant, Instant)> = None;
    // The longest stretch so far: how long this collective waited for its peers, what
    // the policy learns from.
    let mut longest = Duration::ZERO;
    loop {
        if driver.finished() {
            if let Some((since, seen)) = stretch {
                longest = longest.max(seen.saturating_duration_since(since));
            }
            policy.record(longest.max(driver.waited()));
            return Ok(());
        }
        if let Some(aborted) = driver.aborted() {
            return Err(aborted);
        }
        if driver.advance()? {
            // Only a pass that moved nothing may block: a lane advanced earlier in this
            // pass may have become ready since.
            if let Some((since, seen)) = stretch.take() {
                longest = longest.max(seen.saturating_duration_since(since));
            }
            continue;
        }
        let now = Instant::now();
        let since = match &mut stretch {
            Some((since, seen)) => {
                *seen = now;
                *since
            }
            None => stretch.insert((now, now)).0,
        };
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
        // Woken: the stretch lasted at least until now (one clock read per wake-up, which
        // costs far more).
        if let Some((_, seen)) = &mut stretch {
            *seen = Instant::now();
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

    /// A policy that never spins.
    /// Runs `f`, waiting on a receive, with a 20 s timeout under `policy` while the group
    /// is closed 50 ms in: the collective ends aborted, long before the timeout.
    fn ended_by_a_close(f: &mut Fake, policy: &mut WaitPolicy) {
        f.activity.posted(0, PeerOp::Receive);
        let closer = close_later(f, Duration::from_millis(50));
        let start = Instant::now();
        let e = progress(f, Duration::from_secs(20), policy).unwrap_err();
        closer.join().unwrap();
        assert!(matches!(e, Error::Aborted { .. }), "{e}");
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
    }

    fn no_spin() -> WaitPolicy {
        WaitPolicy::fixed(Spin {
            total: Duration::ZERO,
            eager: Duration::ZERO,
        })
    }

    #[test]
    fn a_collective_that_keeps_moving_finishes_without_waiting() {
        let mut f = Fake::new(vec![true; 5], 5);
        progress(&mut f, Duration::from_secs(5), &mut no_spin()).unwrap();
        assert_eq!((f.calls, f.waits), (5, 0));
    }

    #[test]
    fn a_finished_collective_does_not_advance() {
        let mut f = Fake::new(vec![], 0);
        progress(&mut f, Duration::from_secs(5), &mut no_spin()).unwrap();
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
        progress(&mut f, Duration::from_secs(5), &mut WaitPolicy::fixed(spin)).unwrap();
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
        let e = progress(&mut f, timeout, &mut no_spin()).unwrap_err();
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
        progress(&mut f, timeout, &mut no_spin()).unwrap();
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
        let e = progress(&mut f, timeout, &mut no_spin()).unwrap_err();
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
            let e = progress(&mut f, timeout, &mut WaitPolicy::fixed(spin)).unwrap_err();
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
        progress(&mut f, Duration::MAX, &mut no_spin()).unwrap();
        assert_eq!(f.waits, 1);
    }

    #[test]
    fn a_close_ends_a_spinning_collective() {
        // Spins for up to 10 s without ever waiting: only the per-round check can end it.
        let mut f = Fake::new(vec![], 1);
        let spin = Spin {
            total: Duration::from_secs(10),
            eager: Duration::ZERO,
        };
        ended_by_a_close(&mut f, &mut WaitPolicy::fixed(spin));
        assert_eq!(f.waits, 0);
    }

    #[test]
    fn a_close_ends_a_waiting_collective_without_a_stall() {
        let mut f = Fake::new(vec![], 1);
        f.nap = Some(Duration::from_millis(5));
        ended_by_a_close(&mut f, &mut no_spin());
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
        let e = progress(&mut f, Duration::from_millis(300), &mut no_spin()).unwrap_err();
        closer.join().unwrap();
        assert!(matches!(e, Error::Aborted { .. }), "{e}");
    }

    #[test]
    fn a_closed_group_moves_nothing_but_a_finished_collective_stands() {
        let mut f = Fake::new(vec![true], 1);
        f.closed.store(true, std::sync::atomic::Ordering::Release);
        let e = progress(&mut f, Duration::from_secs(1), &mut no_spin()).unwrap_err();
        assert!(matches!(e, Error::Aborted { .. }), "{e}");
        assert_eq!(f.calls, 0, "nothing is moved after the close");

        // Once every byte moved, the result stands, closed or not.
        let mut f = Fake::new(vec![true], 1);
        progress(&mut f, Duration::from_secs(1), &mut no_spin()).unwrap();
        f.closed.store(true, std::sync::atomic::Ordering::Release);
        progress(&mut f, Duration::from_secs(1), &mut no_spin()).unwrap();
    }

    const MS: Duration = Duration::from_millis(1);
    const US: Duration = Duration::from_micros(1);

    /// A learned budget after `waits`, recorded in order.
    fn learned(waits: impl IntoIterator<Item = Duration>) -> Duration {
        let mut l = LearnedSpin::new();
        for w in waits {
            l.record(w);
        }
        l.budget()
    }

    /// The budget for `samples` by its definition: sort the samples within the cap, take
    /// the one at ceil(0.9 n) - 1, add a quarter, clamp.
    fn by_sorting(samples: &[u32]) -> Duration {
        let cap = u32::try_from(LearnedSpin::CAP.as_nanos()).unwrap();
        let mut reach: Vec<u32> = samples.iter().copied().filter(|&s| s <= cap).collect();
        if reach.is_empty() || reach.len() * 2 < samples.len() {
            return LearnedSpin::FLOOR;
        }
        reach.sort_unstable();
        let p90 = reach[(reach.len() * 9).div_ceil(10) - 1];
        let budget = Duration::from_nanos(u64::from(p90) + u64::from(p90 / 4));
        budget.clamp(LearnedSpin::FLOOR, LearnedSpin::CAP)
    }

    #[test]
    fn the_budget_is_the_90th_percentile_of_every_window() {
        // Every window length, from waits on a few values (ties) and spread ones, some
        // past the cap.
        let mut x = 0x2545_f491_u32;
        for round in 0..2000 {
            let len = 1 + round % LearnedSpin::WINDOW;
            let samples: Vec<u32> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    match round % 3 {
                        0 => (x % 4) * 20_000,
                        1 => x % 3_000_000,
                        _ => x % 40_000,
                    }
                })
                .collect();
            assert_eq!(
                LearnedSpin::learn(&samples),
                by_sorting(&samples),
                "{samples:?}"
            );
        }
    }

    #[test]
    fn the_budget_is_relearned_from_the_window_whenever_it_is_due() {
        // Waits on few values, runs of equal ones among them: whether or not the window
        // changed, the budget after each relearn is the window's.
        let mut x = 0x9e37_79b9_u32;
        let mut l = LearnedSpin::new();
        for i in 0..3000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let wait = if (i / 100) % 2 == 0 {
                0
            } else {
                (x % 3) * 300_000
            };
            l.record(Duration::from_nanos(u64::from(wait)));
            if l.fresh == 0 {
                assert_eq!(
                    l.budget(),
                    LearnedSpin::learn(&l.samples[..l.filled]),
                    "{i}"
                );
            }
        }
    }

    #[test]
    fn the_inline_path_keeps_the_state_the_general_one_makes() {
        // Long runs of zero waits (the inline path's case) broken by others, recorded by
        // `record` and by `record_any` alone: the same window, counts and budget.
        let mut x = 0x85eb_ca6b_u32;
        let (mut fast, mut general) = (LearnedSpin::new(), LearnedSpin::new());
        for i in 0..5000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let wait = if (i / 70) % 3 == 0 || !x.is_multiple_of(5) {
                0
            } else {
                x % 50_000
            };
            let wait = Duration::from_nanos(u64::from(wait));
            fast.record(wait);
            general.record_any(wait);
            assert_eq!(format!("{fast:?}"), format!("{general:?}"), "{i}");
        }
    }

    #[test]
    fn a_new_group_starts_from_the_former_default() {
        assert_eq!(LearnedSpin::new().budget(), LearnedSpin::INITIAL);
        assert_eq!(LearnedSpin::INITIAL, 50 * US);
    }

    #[test]
    fn peers_a_millisecond_late_keep_the_rank_spinning() {
        let budget = learned(std::iter::repeat_n(MS, 32));
        assert!(budget >= MS, "{budget:?}");
        assert!(budget <= LearnedSpin::CAP, "{budget:?}");
        // As between sharded layers: a lockstep barrier (a few µs) before each late call.
        let layers = (0..32).map(|i| if i % 2 == 0 { 4 * US } else { MS + 30 * US });
        assert!(learned(layers) >= MS + 30 * US);
    }

    #[test]
    fn an_idle_server_spins_only_the_floor_from_its_first_wait() {
        let mut l = LearnedSpin::new();
        l.record(100 * MS);
        assert_eq!(l.budget(), LearnedSpin::FLOOR);
        for _ in 0..100 {
            l.record(100 * MS);
            assert_eq!(l.budget(), LearnedSpin::FLOOR);
        }
        // A barrier between the idle calls, answered at once, changes nothing.
        let alternating = (0..64).map(|i| if i % 2 == 0 { 100 * MS } else { 3 * US });
        assert_eq!(learned(alternating), LearnedSpin::FLOOR);
    }

    #[test]
    fn lockstep_waits_spin_the_floor() {
        assert_eq!(learned([Duration::ZERO; 40]), LearnedSpin::FLOOR);
        assert_eq!(learned([2 * US; 40]), LearnedSpin::FLOOR);
        // 30 µs waits (a TCP round trip): spun through, with a quarter to spare.
        assert_eq!(learned([30 * US; 40]), 30 * US + 30 * US / 4);
    }

    #[test]
    fn mixed_waits_follow_those_a_spin_can_reach() {
        // Mostly 1 ms with a few idle gaps: the 1 ms waits stay hot.
        let mostly_late = (0..32).map(|i| if i % 8 == 0 { 100 * MS } else { MS });
        assert!(learned(mostly_late) >= MS);
        // Half and half: still worth it (a gap wastes at most the cap, 2% of 100 ms).
        let half = (0..32).map(|i| if i % 2 == 0 { 100 * MS } else { MS });
        assert!(learned(half) >= MS);
        // Mostly gaps: the floor.
        let mostly_idle = (0..32).map(|i| if i % 4 == 0 { MS } else { 100 * MS });
        assert_eq!(learned(mostly_idle), LearnedSpin::FLOOR);
        // The 90th percentile, not the largest: one 1.5 ms outlier in 32 waits of 100 µs.
        let outlier = (0..32).map(|i| if i == 7 { 1500 * US } else { 100 * US });
        assert_eq!(learned(outlier), 125 * US);
    }

    #[test]
    fn the_budget_stops_at_the_cap() {
        assert_eq!(learned([1900 * US; 32]), LearnedSpin::CAP);
        assert_eq!(learned([LearnedSpin::CAP; 32]), LearnedSpin::CAP);
        // Beyond the cap no spin catches the data: the floor, not the cap.
        assert_eq!(learned([3 * MS; 32]), LearnedSpin::FLOOR);
        assert_eq!(learned([Duration::MAX; 40]), LearnedSpin::FLOOR);
    }

    #[test]
    fn the_window_forgets_old_waits() {
        let idle_then_busy = std::iter::repeat_n(100 * MS, 32).chain(std::iter::repeat_n(MS, 32));
        assert!(learned(idle_then_busy) >= MS);
        let busy_then_idle = std::iter::repeat_n(MS, 32).chain(std::iter::repeat_n(100 * MS, 32));
        assert_eq!(learned(busy_then_idle), LearnedSpin::FLOOR);
    }

    #[test]
    fn a_fixed_policy_ignores_waits_and_zero_never_spins() {
        for fixed in [Duration::ZERO, 7 * US, 3 * MS, Duration::MAX] {
            let mut p = WaitPolicy::for_local_ranks(Some(fixed), 1);
            for _ in 0..40 {
                p.record(MS);
            }
            let spin = p.spin();
            assert_eq!(spin.total, fixed);
            assert!(spin.eager <= fixed && spin.eager <= EAGER, "{spin:?}");
        }
        let never = WaitPolicy::for_local_ranks(Some(Duration::ZERO), 1).spin();
        assert_eq!((never.total, never.eager), (Duration::ZERO, Duration::ZERO));
        // More ranks than CPUs: never eager, learned or fixed.
        let crowded = WaitPolicy::for_local_ranks(None, usize::MAX).spin();
        assert_eq!(crowded.eager, Duration::ZERO);
        assert_eq!(crowded.total, LearnedSpin::INITIAL);
    }

    /// A collective that moves once `wait` was called `wakes` times, each nap `nap` long.
    struct Late {
        waits: usize,
        wakes: usize,
        nap: Duration,
        done: bool,
    }

    impl Drive for Late {
        fn advance(&mut self) -> Result<bool> {
            self.done = self.waits >= self.wakes;
            Ok(self.done)
        }
        fn finished(&self) -> bool {
            self.done
        }
        fn wait(&mut self, _until: Instant) -> Result<bool> {
            std::thread::sleep(self.nap);
            self.waits += 1;
            Ok(true)
        }
        fn stalled(&mut self, _timeout: Duration) -> Error {
            Error::invalid("never stalls")
        }
        fn aborted(&self) -> Option<Error> {
            None
        }
    }

    /// A driver whose `advance` itself waits (as io_uring's steps wait in the kernel for
    /// their receive) and always moves: `progress` sees no idle stretch at all.
    struct WaitsInside {
        inside: Duration,
        done: bool,
    }

    impl Drive for WaitsInside {
        fn advance(&mut self) -> Result<bool> {
            self.done = true;
            Ok(true)
        }
        fn finished(&self) -> bool {
            self.done
        }
        fn wait(&mut self, _until: Instant) -> Result<bool> {
            Ok(true)
        }
        fn stalled(&mut self, _timeout: Duration) -> Error {
            Error::invalid("never stalls")
        }
        fn aborted(&self) -> Option<Error> {
            None
        }
        fn waited(&self) -> Duration {
            self.inside
        }
    }

    #[test]
    fn a_wait_inside_advance_teaches_the_policy_too() {
        let mut p = WaitPolicy::for_local_ranks(None, 1);
        let mut late = WaitsInside {
            inside: Duration::from_micros(700),
            done: false,
        };
        progress(&mut late, Duration::from_secs(5), &mut p).unwrap();
        assert_eq!(samples(&p), vec![700_000], "the wait in nanoseconds");
    }

    /// The waits a learned policy holds, oldest first.
    fn samples(p: &WaitPolicy) -> Vec<u32> {
        match &p.budget {
            Budget::Learned(l) => l.samples[..l.filled].to_vec(),
            Budget::Fixed(_) => Vec::new(),
        }
    }

    #[test]
    fn progress_teaches_the_policy_each_collectives_wait() {
        let mut p = WaitPolicy::for_local_ranks(None, 1);
        // A collective that never waits teaches a zero wait.
        let mut now = Late {
            waits: 0,
            wakes: 0,
            nap: Duration::ZERO,
            done: false,
        };
        progress(&mut now, Duration::from_secs(5), &mut p).unwrap();
        // One that moves only after two naps of 3 ms each waited at least 6 ms: beyond the
        // cap, so the next collective spins the floor.
        let mut late = Late {
            waits: 0,
            wakes: 2,
            nap: 3 * MS,
            done: false,
        };
        progress(&mut late, Duration::from_secs(5), &mut p).unwrap();
        let seen = samples(&p);
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert_eq!(seen[0], 0);
        assert!(u128::from(seen[1]) >= (6 * MS).as_nanos(), "{seen:?}");
        // Half the waits beyond the cap is still half within reach: the zero wait's floor.
        assert_eq!(p.spin().total, LearnedSpin::FLOOR);
        // A failed collective teaches nothing.
        let mut silent = Fake::new(vec![], 1);
        silent.activity.posted(0, PeerOp::Receive);
        progress(&mut silent, 20 * MS, &mut p).unwrap_err();
        assert_eq!(samples(&p).len(), 2);
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
