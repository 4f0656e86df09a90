//! Shared memory between native-wire ranks on one host: the segment's setup and the driver
//! that runs every group collective through it (`protocol` has the layout and the schedule),
//! and groups over several hosts (`hier`: a segment per host, TCP between the hosts).
//!
//! `send`/`recv` go through per-pair slots in the segment too (`p2p`). The TCP mesh stays:
//! it carries the setup (the segment's nonce), the answer to a refused message (as on TCP,
//! see `super::header`), and it is how a rank learns that a co-located peer died (its
//! connections close) while it waits.
//!
//! # Setup
//!
//! A segment holds the ranks of one host (a *domain*): the whole group when every rank is
//! on one host, else each host's ranks (see `hier`). Below, "rank 0" is the domain's
//! lowest rank and ranks are positions in the domain ([`Link`] maps them to the group's
//! ranks wherever a connection or an error names one).
//!
//! Rank 0 creates the segment under a name derived from the group identity (which covers
//! the key, if any) and 16 random bytes of its own, with `O_EXCL` and mode 0600, and sends
//! the random bytes to every peer over its mesh connection. Each peer maps the segment,
//! counts itself in, and tells rank 0 over the connection whether it could (`domain`: a
//! rank that shares the host identity but not `/dev/shm` cannot, and the group keeps TCP,
//! which rank 0's verdict tells every rank); rank 0 removes the file as soon as all did,
//! before the first collective. A file from a crashed run is never reused (the name is new each time); a rank
//! that dies leaves none behind once the group formed, and a failed setup removes it (the
//! creator's [`Segment`] does when it drops).
//!
//! # Waiting
//!
//! A rank waits for a peer's step by spinning ([`Spin`]: eagerly only when every local rank
//! has a CPU, yielding otherwise), then by sleeping on the peer's step word in slices of
//! [`SLICE`]: the peer wakes sleepers when it publishes (a syscall only when someone
//! sleeps). Between slices the rank looks at the group's close flag, answers and reads the
//! TCP connections' urgent bytes (failure notices, liveness queries), and probes the
//! connections, so a peer that died is named at once and one that stopped is named after
//! the timeout, as on TCP. An idle group runs nothing.
//!
//! # Copies
//!
//! Each rank copies its input once into its buffer (the peers cannot read the caller's
//! memory); folds read the peers' buffers in place with the SIMD kernels, into the
//! caller's memory. What remains besides that one copy in:
//!
//! - a one-shot all-reduce (small ones, and every size at P = 2): rank 0 folds the peers'
//!   buffers straight onto its own data, no further copy; every other rank first copies
//!   rank 0's chunk out onto its data and folds the rest (itself included, from its own
//!   buffer) onto that, because every rank must fold in rank order from x0 to get the
//!   same bits (the kernel computes `acc op incoming`; `x1 op x0` may differ from
//!   `x0 op x1`, in NaN payloads for one);
//! - an all-reduce by shares (large, P >= 3): each rank folds its share as above, copies
//!   the result back into shared memory and copies the other ranks' shares out, because
//!   the result must reach each caller's own memory, which no peer can write;
//! - all_gather, broadcast and all_to_all copy each piece out of its owner's buffer once
//!   (the root's own data, and a rank's own block, are not copied at all in the first
//!   place where they need not be); sum_scatter copies rank 0's piece of its block out
//!   onto the output and folds the others' pieces onto it, as the one-shot does.
//!
//! A hierarchical group (`hier`) adds, per collective: the leaders' TCP exchange (its
//! staging, as on TCP), and a broadcast of the result through the segment (one more copy
//! in by the leader, one out by each member). Its all_gather also packs the domain's
//! blocks for the leaders and unpacks the others' (the output's blocks need not be
//! contiguous per host), and its sum_scatter copies the whole input once to reduce it.

mod domain;
mod hier;
mod p2p;
mod protocol;
#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use ffi::shm::Segment;

pub(crate) use hier::{Hier, Path, setup};
pub(crate) use protocol::Layout;
use protocol::{CHUNK, pieces, reached, share};

use super::header::Call;
use crate::comm::progress::Spin;
use crate::comm::state::CloseFlag;
use crate::element::DType;
use crate::error::{Error, PeerOp, Phase, Result};
use crate::reduce::{ReduceOp, reduce_into};
use crate::transport::tcp::{Conn, Connections as Transport, Transfer};

/// How long a sleeping wait lasts before the rank looks at its connections, the close flag
/// and the clock again.
const SLICE: Duration = Duration::from_millis(5);

/// How long a rank of a domain of a larger group still waits for the step it awaits once
/// a connection closed (see `Link::wait_for`): time for its leader to pass on a mismatch
/// that another host's rank failed on, under load. A dead rank is named that much later.
const LAST_LOOK: Duration = Duration::from_millis(250);

/// The setup message rank 0 sends every peer: a flag (1: shared memory, 0: every link
/// stays TCP), then the segment's 16 random bytes.
const OFFER_BYTES: usize = 17;

/// The `derive_key` context of segment names.
const NAME_CONTEXT: &str = "nuvec-distributed 2026-12-03 shared-memory segment name v1";

/// The setup's phase, in errors.
const SETUP: Phase = Phase::NativeSetup;

/// The segment's file name for a group identity and rank 0's random bytes: unguessable
/// without both, and new for every group formed.
pub(crate) fn segment_path(group: &[u8; 32], nonce: &[u8; 16]) -> PathBuf {
    let mut hasher = blake3::Hasher::new_derive_key(NAME_CONTEXT);
    hasher.update(group);
    hasher.update(nonce);
    let hash = hasher.finalize();
    let hex: String = hash.as_bytes()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    ffi::shm::directory().join(format!("nuvec-{hex}"))
}

/// What a wait watches besides the segment: the group's close flag and its connections.
pub(crate) struct Watch<'a> {
    pub(crate) transport: &'a mut Transport,
    pub(crate) closed: &'a CloseFlag,
    pub(crate) context: Phase,
    /// This rank and its call, to check a header that arrives on a connection meanwhile.
    pub(crate) call: Option<(usize, &'a Call)>,
}

impl Watch<'_> {
    /// Looks at everything that can end a wait for `peer` other than the peer's step: a
    /// close, a connection that ended, the deadline (then asks the peers who is alive, as
    /// the TCP engine does, and names the one that is not).
    fn check(&mut self, peer: usize, deadline: Instant, timeout: Duration) -> Result<()> {
        if self.closed.is_set() {
            return Err(Error::Aborted {
                context: self.context,
            });
        }
        // Answers liveness queries and takes in failure notices.
        self.transport
            .refresh()
            .map_err(|e| Error::local("polling the native wire's sockets", e))?;
        // The awaited peer's connection first: when it died, it is the one to name.
        let first = self.transport.recv_conn(peer);
        let count = self.transport.conns().len();
        for i in std::iter::once(first).chain((0..count).filter(|&i| i != first)) {
            let conn = self.transport.conn(i);
            match conn.probe() {
                Ok(Transfer::Closed) => return Err(conn.closed(PeerOp::Receive, self.context)),
                Err(e) => return Err(conn.failed(PeerOp::Receive, self.context, e)),
                Ok(Transfer::Moved(_)) => {
                    // Only a send (or the answer to a refused one) travels on a connection
                    // once the group is on shared memory: during a group collective that
                    // is a mismatch, as on TCP, where it would be read in place of the
                    // peer's header (a header not complete yet is looked at next time).
                    let mut head = [0u8; super::header::HEADER_BYTES];
                    if let Some((me, call)) = self.call
                        && matches!(conn.peek(&mut head), Ok(n) if n == head.len())
                    {
                        call.check(me, conn.peer, &head)?;
                    }
                }
                Ok(_) => {}
            }
        }
        if Instant::now() >= deadline {
            let conn = self.transport.recv_conn(peer);
            let waits = [(conn, PeerOp::Receive)];
            return Err(self
                .transport
                .inquire(&waits, waits[0], timeout, self.context));
        }
        Ok(())
    }
}

/// One rank's end of the group's segment (see the module docs).
#[derive(Debug)]
pub(crate) struct Link {
    seg: Segment,
    layout: Layout,
    /// The global rank of each rank of the segment, in increasing order: `me`, `size` and
    /// the layout's indices are positions in it (the identity when the segment holds the
    /// whole group); errors and connections name the global ranks.
    ranks: Vec<usize>,
    me: usize,
    size: usize,
    /// The last step this rank published.
    step: u32,
    spin: Spin,
    timeout: Duration,
}

/// A bug: the layout put a word or a range outside the segment.
fn layout_bug(context: Phase, e: &std::io::Error) -> Error {
    Error::Bug {
        context,
        what: format!("the shared-memory layout: {e}"),
    }
}

impl Link {
    /// Sets up the group's segment over the formed mesh (see the module docs): `Ok(None)`
    /// if rank 0 could not create one or a peer could not open it (every rank then keeps
    /// TCP for everything, and all of them know it: see `domain`).
    ///
    /// # Errors
    ///
    /// A peer that closes, stalls past `timeout`, or sends a status or verdict the setup
    /// does not allow.
    pub(crate) fn establish(
        transport: &mut Transport,
        (ranks, me): (&[usize], usize),
        group: &[u8; 32],
        timeout: Duration,
        spin: Spin,
    ) -> Result<Option<Link>> {
        let size = ranks.len();
        let leader = ranks[0];
        let whole = size == transport.ranks();
        let layout = Layout::new(size, CHUNK);
        let deadline = crate::options::deadline(Instant::now(), timeout);
        if me == 0 {
            let mut nonce = [0u8; 16];
            getrandom::fill(&mut nonce).map_err(|e| {
                Error::local(
                    "drawing a shared-memory segment's name",
                    std::io::Error::other(e.to_string()),
                )
            })?;
            let path = segment_path(group, &nonce);
            let created = Segment::create(&path, layout.bytes());
            let mut offer = [0u8; OFFER_BYTES];
            if created.is_ok() {
                offer[0] = 1;
                offer[1..].copy_from_slice(&nonce);
            }
            if let Err(e) = &created {
                crate::verbose::verbose!(
                    warn: leader,
                    "shared memory: cannot create {} ({e}); every link {}stays TCP",
                    path.display(),
                    if whole { "" } else { "of this host " }
                );
            }
            for &peer in &ranks[1..] {
                let conn = transport.send_conn(peer);
                write_all(transport, conn, &offer, deadline, timeout)?;
            }
            let Ok(seg) = created else {
                return Ok(None);
            };
            // Dropped on an error or a refusal, the creator's segment removes its file.
            let mut link = Link::new(seg, layout, (ranks, me), spin, timeout);
            // Every peer says whether it could open the segment (see `domain`), and every
            // rank learns the same verdict.
            let mut refusals = Vec::new();
            for (peer, &global) in ranks.iter().enumerate().skip(1) {
                let mut status = [0u8; domain::STATUS_BYTES];
                let conn = transport.recv_conn(global);
                read_exact(transport, conn, &mut status, deadline, timeout)?;
                if let Some(code) = domain::read_status(status) {
                    refusals.push(domain::Refusal { rank: peer, code });
                }
            }
            let verdict = domain::encode_verdict(&refusals);
            for &peer in &ranks[1..] {
                let conn = transport.send_conn(peer);
                write_all(transport, conn, &verdict, deadline, timeout)?;
            }
            if !refusals.is_empty() {
                not_shared((ranks, me), &refusals, whole);
                return Ok(None);
            }
            // The peers' counts, seen through this rank's map: the segment is one.
            link.await_mapped(transport, deadline, timeout)?;
            link.seg
                .unlink()
                .map_err(|e| Error::local(format!("removing {}", path.display()), e))?;
            Ok(Some(link))
        } else {
            let mut offer = [0u8; OFFER_BYTES];
            let conn = transport.recv_conn(leader);
            read_exact(transport, conn, &mut offer, deadline, timeout)?;
            match offer[0] {
                0 => return Ok(None),
                1 => {}
                flag => {
                    return Err(Error::PeerMisbehaved {
                        peer: leader,
                        addr: None,
                        context: SETUP,
                        reason: format!("a shared-memory offer with flag {flag}, not 0 or 1"),
                    });
                }
            }
            let mut nonce = [0u8; 16];
            nonce.copy_from_slice(&offer[1..]);
            let path = segment_path(group, &nonce);
            // A rank that shares the host identity but not the creator's /dev/shm (another
            // container on the same kernel) cannot open it: it says so instead of failing.
            let opened = Segment::open(&path, layout.bytes());
            if let Ok(seg) = &opened {
                let mapped = seg
                    .u32_at(layout.mapped())
                    .ok_or_else(|| layout_bug(SETUP, &std::io::ErrorKind::InvalidInput.into()))?;
                mapped.fetch_add(1, Ordering::SeqCst);
                ffi::shm::wake_all(mapped);
            }
            let status = domain::status(&opened);
            let conn = transport.send_conn(leader);
            write_all(transport, conn, &status, deadline, timeout)?;
            let mut head = [0u8; domain::VERDICT_HEAD_BYTES];
            let conn = transport.recv_conn(leader);
            read_exact(transport, conn, &mut head, deadline, timeout)?;
            let mut body = vec![0u8; domain::verdict_body_len(head, size, leader)?];
            read_exact(transport, conn, &mut body, deadline, timeout)?;
            let refusals = domain::decode_verdict(&body, size, leader)?;
            if !refusals.is_empty() {
                not_shared((ranks, me), &refusals, whole);
                return Ok(None);
            }
            let Ok(seg) = opened else {
                // The creator left out this rank's refusal.
                return Err(Error::PeerMisbehaved {
                    peer: leader,
                    addr: None,
                    context: SETUP,
                    reason: format!(
                        "a shared-memory verdict that leaves out rank {}, which could not \
                         open {}",
                        ranks[me],
                        path.display()
                    ),
                });
            };
            Ok(Some(Link::new(seg, layout, (ranks, me), spin, timeout)))
        }
    }

    fn new(
        seg: Segment,
        layout: Layout,
        (ranks, me): (&[usize], usize),
        spin: Spin,
        timeout: Duration,
    ) -> Link {
        Link {
            seg,
            layout,
            ranks: ranks.to_vec(),
            me,
            size: ranks.len(),
            step: 0,
            spin,
            timeout,
        }
    }

    /// After a step whose headers did not all match: a peer header of that step that
    /// differs from `call`'s, and whether more peers agree on it than with this rank (a
    /// leader passes one of the two calls on to the other hosts).
    pub(crate) fn differing(
        &self,
        call: &Call,
    ) -> Option<([u8; super::header::HEADER_BYTES], bool)> {
        let half = (self.step % 2) as usize;
        let mine = call.header.encode();
        let mut seen = Vec::with_capacity(self.size);
        for p in (0..self.size).filter(|&p| p != self.me) {
            let mut got = [0u8; super::header::HEADER_BYTES];
            self.copy_out(self.layout.header(p, half), &mut got, SETUP)
                .ok()?;
            seen.push(got);
        }
        let other = *seen.iter().find(|h| **h != mine)?;
        let with_me = 1 + seen.iter().filter(|h| **h == mine).count();
        let with_other = seen.iter().filter(|h| **h == other).count();
        Some((other, with_other > with_me))
    }

    /// Whether the segment's pages are locked in memory.
    pub(crate) fn locked(&self) -> bool {
        self.seg.locked()
    }

    /// Rank 0 waits until every peer mapped the segment.
    fn await_mapped(
        &self,
        transport: &mut Transport,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<()> {
        let mapped = self.word(self.layout.mapped(), SETUP)?;
        let closed = CloseFlag::default();
        let mut watch = Watch {
            transport,
            closed: &closed,
            context: SETUP,
            call: None,
        };
        loop {
            let n = mapped.load(Ordering::SeqCst);
            if n as usize >= self.size - 1 {
                return Ok(());
            }
            // Blame the first rank that might still be missing (the count does not say
            // which): its connection closing names it precisely.
            watch.check(self.ranks[1], deadline, timeout)?;
            ffi::shm::wait(mapped, n, SLICE);
        }
    }

    /// The global rank of the segment's rank `local`.
    fn global(&self, local: usize) -> usize {
        self.ranks[local]
    }

    fn word(&self, off: usize, context: Phase) -> Result<&AtomicU32> {
        self.seg.u32_at(off).ok_or_else(|| Error::Bug {
            context,
            what: format!("the shared-memory layout: no aligned u32 at {off}"),
        })
    }

    /// The buffer parity of the next step.
    fn next_half(&self) -> usize {
        (self.step.wrapping_add(1) % 2) as usize
    }

    fn copy_in(&self, off: usize, src: &[u8], context: Phase) -> Result<()> {
        self.seg
            .copy_in(off, src)
            .map_err(|e| layout_bug(context, &e))
    }

    fn copy_out(&self, off: usize, dst: &mut [u8], context: Phase) -> Result<()> {
        self.seg
            .copy_out(off, dst)
            .map_err(|e| layout_bug(context, &e))
    }

    /// Folds the `acc.len()` bytes at `off` into `acc`.
    fn fold(
        &self,
        (op, dtype): (ReduceOp, DType),
        acc: &mut [u8],
        off: usize,
        context: Phase,
    ) -> Result<()> {
        self.seg
            .read_with(off, acc.len(), |src| reduce_into(op, dtype, acc, src))
            .map_err(|e| layout_bug(context, &e))
    }

    /// One step (see `protocol`): publishes it (with `call`'s header, at a collective's
    /// first step), waits for every peer to publish it, and compares their headers.
    fn step(&mut self, call: Option<&Call>, watch: &mut Watch<'_>) -> Result<()> {
        let context = watch.context;
        let half = self.next_half();
        if let Some(call) = call {
            let off = self.layout.header(self.me, half);
            self.copy_in(off, &call.header.encode(), context)?;
        }
        self.step = self.step.wrapping_add(1);
        let word = self.word(self.layout.step(self.me), context)?;
        word.store(self.step, Ordering::SeqCst);
        if self
            .word(self.layout.sleepers(self.me), context)?
            .load(Ordering::SeqCst)
            > 0
        {
            ffi::shm::wake_all(word);
        }
        for peer in (0..self.size).filter(|&p| p != self.me) {
            self.wait_for(peer, watch)?;
        }
        if let Some(call) = call {
            for peer in (0..self.size).filter(|&p| p != self.me) {
                let mut got = [0u8; super::header::HEADER_BYTES];
                self.copy_out(self.layout.header(peer, half), &mut got, context)?;
                call.check(self.global(self.me), self.global(peer), &got)?;
            }
            // Every peer is in this collective now: a message sent before it and not taken
            // is a mismatch (see `p2p`).
            self.unmatched_sends(call, context)?;
        }
        Ok(())
    }

    /// Waits until `peer` published this rank's current step.
    fn wait_for(&self, peer: usize, watch: &mut Watch<'_>) -> Result<()> {
        let context = watch.context;
        let word = self.word(self.layout.step(peer), context)?;
        if reached(word.load(Ordering::Acquire), self.step) {
            return Ok(());
        }
        let sleepers = self.word(self.layout.sleepers(peer), context)?;
        self.wait_on(
            peer,
            (word, sleepers, Awaited::Step),
            watch,
            |watch, slow| {
                if reached(word.load(Ordering::Acquire), self.step) {
                    return Ok(true);
                }
                if slow && let Some((_, call)) = watch.call {
                    // A message `peer` sent before this collective, still untaken: a mismatch
                    // (see `p2p`), which `peer` may be blocked in.
                    self.unread_from(peer, call, context)?;
                }
                Ok(false)
            },
        )
    }

    /// Waits until `poll` says so: spins, then sleeps on `word` in slices of [`SLICE`],
    /// counted in `sleepers` (whoever changes `word` wakes the sleepers it counts).
    /// Between slices it looks at `peer`'s refusal, the close flag and the connections
    /// (`Watch::check`), so that a peer that died is named at once and one that stopped
    /// after the timeout. `poll(watch, slow)` looks at the condition and may fail the
    /// wait (a mismatch); `slow` is set once the wait sleeps, for checks that cost more
    /// than a load. Every wait of the driver (steps, `p2p`'s slots) goes through here.
    fn wait_on(
        &self,
        peer: usize,
        (word, sleepers, awaited): (&AtomicU32, &AtomicU32, Awaited),
        watch: &mut Watch<'_>,
        mut poll: impl FnMut(&mut Watch<'_>, bool) -> Result<bool>,
    ) -> Result<()> {
        let step = awaited == Awaited::Step;
        let context = watch.context;
        let start = Instant::now();
        let deadline = crate::options::deadline(start, self.timeout);
        let mut checked = start;
        loop {
            if poll(watch, false)? {
                return Ok(());
            }
            let idle = start.elapsed();
            if idle < self.spin.total && idle < self.timeout {
                if idle < self.spin.eager {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
                continue;
            }
            // The connections cost a few system calls to look at: once per slice of
            // sleep, not before every sleep (a step that sleeps once is the common case
            // when ranks share CPUs). The close flag and the refusal are one load each.
            if watch.closed.is_set() {
                return Err(Error::Aborted { context });
            }
            self.refused_by(peer, watch)?;
            if poll(watch, true)? {
                return Ok(());
            }
            if checked.elapsed() >= SLICE || Instant::now() >= deadline {
                // The peer sets its refusal before it fails the group and closes: a close
                // seen here may be that refusal's.
                // A peer that published the step and then failed (a leader passing on a
                // mismatch found between hosts) is judged by its header, not its close.
                // In a domain of a larger group, a rank of another host that failed
                // on a mismatch closes while this domain's leader still passes the
                // mismatch on: the step gets a last look before the close is reported.
                match watch.check(self.global(peer), deadline, self.timeout) {
                    Err(Error::Closed { .. } | Error::Io { .. } | Error::Lost { .. })
                        if step && self.size < watch.transport.ranks() && self.last_look(word) =>
                    {
                        return Ok(());
                    }
                    Err(_) if step && reached(word.load(Ordering::Acquire), self.step) => {
                        return Ok(());
                    }
                    Err(e) => return Err(self.refused_by(peer, watch).err().unwrap_or(e)),
                    Ok(()) => {}
                }
                checked = Instant::now();
            }
            // Counted before the last look, so the peer either sees the count when it
            // changes the word (and wakes this rank) or changed it before the look.
            sleepers.fetch_add(1, Ordering::SeqCst);
            let seen = word.load(Ordering::SeqCst);
            let ready = poll(watch, false);
            if matches!(ready, Ok(false)) {
                let left = deadline.saturating_duration_since(Instant::now());
                ffi::shm::wait(word, seen, SLICE.min(left.max(Duration::from_micros(1))));
            }
            sleepers.fetch_sub(1, Ordering::SeqCst);
            if ready? {
                return Ok(());
            }
        }
    }

    /// Whether `word` reaches this rank's step within [`LAST_LOOK`].
    fn last_look(&self, word: &AtomicU32) -> bool {
        let until = Instant::now() + LAST_LOOK;
        loop {
            if reached(word.load(Ordering::Acquire), self.step) {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Fails with the mismatch if `peer`'s `recv` refused a group collective (see
    /// `protocol`): the peer will not publish the step this rank waits for.
    fn refused_by(&self, peer: usize, watch: &Watch<'_>) -> Result<()> {
        let context = watch.context;
        let flag = self.word(self.layout.refused(peer), context)?;
        let from = flag.load(Ordering::Acquire);
        if from == 0 {
            return Ok(());
        }
        let mut got = [0u8; super::header::HEADER_BYTES];
        self.copy_out(self.layout.refusal(peer), &mut got, context)?;
        let recv =
            super::header::Header::decode(&got).map_err(|garbled| Error::PeerMisbehaved {
                peer: self.global(peer),
                addr: None,
                context,
                reason: format!("its refused recv's header in shared memory: {garbled}"),
            })?;
        let mine = watch
            .call
            .map_or_else(|| "a group collective".to_string(), |(_, c)| c.to_string());
        Err(Error::Mismatch {
            seq: u64::from(recv.seq),
            point_to_point: true,
            rank: self.global(self.me),
            call: mine,
            peer: self.global(peer),
            peer_call: format!(
                "recv of {} bytes from rank {}",
                recv.count,
                from.wrapping_sub(1)
            ),
            context,
        })
    }

    /// The mismatch of this rank's `recv` (`call`) from `src` with the group collective
    /// `src` runs; leaves the refusal where the ranks waiting for this rank's step see it.
    fn refuse(&self, call: &Call, (src, local): (usize, usize), context: Phase) -> Error {
        let half = self.next_half();
        let mut got = [0u8; super::header::HEADER_BYTES];
        if let Err(e) = self.copy_out(self.layout.header(local, half), &mut got, context) {
            return e;
        }
        let error = match call.check(self.global(self.me), src, &got) {
            Err(e) => e,
            Ok(()) => Error::Bug {
                context,
                what: format!("rank {src}'s group collective carries a send's header"),
            },
        };
        let published = self
            .copy_in(self.layout.refusal(self.me), &call.header.encode(), context)
            .and_then(|()| self.word(self.layout.refused(self.me), context))
            .and_then(|flag| {
                flag.store(src as u32 + 1, Ordering::SeqCst);
                self.word(self.layout.step(self.me), context)
            });
        if let Ok(step) = published {
            // The waiters sleep on this rank's step word.
            ffi::shm::wake_all(step);
        }
        error
    }

    /// A broadcast of `data` from `root` (see `protocol`).
    pub(crate) fn broadcast(
        &mut self,
        call: &Call,
        data: &mut [u8],
        root: usize,
        watch: &mut Watch<'_>,
    ) -> Result<()> {
        let context = watch.context;
        let (me, l) = (self.me, self.layout);
        let mut first = true;
        for piece in pieces(data.len(), l.chunk()) {
            let h = self.next_half();
            if me == root {
                self.copy_in(l.data(me, h), &data[piece.clone()], context)?;
            }
            self.step(first.then_some(call), watch)?;
            first = false;
            if me != root {
                self.copy_out(l.data(root, h), &mut data[piece], context)?;
            }
        }
        Ok(())
    }

    /// An all_to_all: `input` and `output` are P blocks each; `output` holds this rank's
    /// own block already (see `protocol`).
    pub(crate) fn all_to_all(
        &mut self,
        call: &Call,
        input: &[u8],
        output: &mut [u8],
        watch: &mut Watch<'_>,
    ) -> Result<()> {
        let context = watch.context;
        let (me, size, l) = (self.me, self.size, self.layout);
        let block = input.len() / size;
        let per = (l.chunk() / size).max(1);
        let mut first = true;
        for piece in pieces(block, per) {
            let h = self.next_half();
            for j in (0..size).filter(|&j| j != me) {
                let src = &input[j * block + piece.start..j * block + piece.end];
                self.copy_in(l.data(me, h) + j * per, src, context)?;
            }
            self.step(first.then_some(call), watch)?;
            first = false;
            for p in (0..size).filter(|&p| p != me) {
                let out = &mut output[p * block + piece.start..p * block + piece.end];
                self.copy_out(l.data(p, h) + me * per, out, context)?;
            }
        }
        Ok(())
    }

    /// A barrier: one step of headers.
    pub(crate) fn barrier(&mut self, call: &Call, watch: &mut Watch<'_>) -> Result<()> {
        self.step(Some(call), watch)
    }

    /// An all-reduce of `data` in place, by the schedule `protocol::one_shot` picks.
    pub(crate) fn all_reduce(
        &mut self,
        call: &Call,
        (op, dtype): (ReduceOp, DType),
        data: &mut [u8],
        watch: &mut Watch<'_>,
    ) -> Result<()> {
        let one_shot = protocol::one_shot(self.size, data.len());
        self.all_reduce_by(one_shot, call, (op, dtype), data, watch)
    }

    /// An all-reduce of `data` in place, one-shot or by shares (see `protocol`; tests and
    /// measurements force one).
    pub(crate) fn all_reduce_by(
        &mut self,
        one_shot: bool,
        call: &Call,
        (op, dtype): (ReduceOp, DType),
        data: &mut [u8],
        watch: &mut Watch<'_>,
    ) -> Result<()> {
        self.reduce((one_shot, true), call, (op, dtype), data, watch)
    }

    /// A reduction of `data` whose result only the segment's first rank needs (a
    /// hierarchical group's leader, which passes it on): the schedule and the folds of an
    /// all-reduce, but the other ranks fold nothing one-shot and copy no shares out. Their
    /// `data` is left partly folded.
    pub(crate) fn reduce_to_first(
        &mut self,
        call: &Call,
        (op, dtype): (ReduceOp, DType),
        data: &mut [u8],
        watch: &mut Watch<'_>,
    ) -> Result<()> {
        let one_shot = protocol::one_shot(self.size, data.len());
        self.reduce((one_shot, false), call, (op, dtype), data, watch)
    }

    /// An all-reduce (`keep`: every rank wants the result) or a reduction to the first
    /// rank, one-shot or by shares.
    fn reduce(
        &mut self,
        (one_shot, keep): (bool, bool),
        call: &Call,
        (op, dtype): (ReduceOp, DType),
        data: &mut [u8],
        watch: &mut Watch<'_>,
    ) -> Result<()> {
        let context = watch.context;
        let wants = keep || self.me == 0;
        let (me, size, l) = (self.me, self.size, self.layout);
        let ds = dtype.size();
        let elems = data.len() / ds;
        if one_shot {
            let mut first = true;
            for chunk in pieces(elems, l.chunk() / ds) {
                let h = self.next_half();
                let piece = &mut data[chunk.start * ds..chunk.end * ds];
                self.copy_in(l.data(me, h), piece, context)?;
                self.step(first.then_some(call), watch)?;
                first = false;
                if !wants {
                    continue;
                }
                // Rank order from x0; rank 0's own data is x0 already.
                if me != 0 {
                    self.copy_out(l.data(0, h), piece, context)?;
                }
                for p in 1..size {
                    self.fold((op, dtype), piece, l.data(p, h), context)?;
                }
            }
            return Ok(());
        }
        let mut first = true;
        for chunk in pieces(elems, l.chunk() / ds) {
            let h = self.next_half();
            let bytes = chunk.start * ds..chunk.end * ds;
            self.copy_in(l.data(me, h), &data[bytes], context)?;
            self.step(first.then_some(call), watch)?;
            first = false;
            let mine = share(&chunk, size, me);
            let at = (mine.start - chunk.start) * ds;
            let target = &mut data[mine.start * ds..mine.end * ds];
            if !target.is_empty() {
                if me != 0 {
                    self.copy_out(l.data(0, h) + at, target, context)?;
                }
                for p in 1..size {
                    self.fold((op, dtype), target, l.data(p, h) + at, context)?;
                }
                // Into the buffer of the next step, which no peer reads before it.
                self.copy_in(l.data(me, 1 - h) + at, target, context)?;
            }
            self.step(None, watch)?;
            for p in (0..size).filter(|&p| wants && p != me) {
                let theirs = share(&chunk, size, p);
                let at = (theirs.start - chunk.start) * ds;
                let out = &mut data[theirs.start * ds..theirs.end * ds];
                self.copy_out(l.data(p, 1 - h) + at, out, context)?;
            }
        }
        Ok(())
    }

    /// An all_gather: `output` holds this rank's `input` at its block already.
    pub(crate) fn all_gather(
        &mut self,
        call: &Call,
        input: &[u8],
        output: &mut [u8],
        watch: &mut Watch<'_>,
    ) -> Result<()> {
        let context = watch.context;
        let (me, size, l) = (self.me, self.size, self.layout);
        let n = input.len();
        let mut first = true;
        for piece in pieces(n, l.chunk()) {
            let h = self.next_half();
            self.copy_in(l.data(me, h), &input[piece.clone()], context)?;
            self.step(first.then_some(call), watch)?;
            first = false;
            for p in (0..size).filter(|&p| p != me) {
                // At the peer's global rank: a domain of a hierarchical group fills
                // its own ranks' blocks of the whole output.
                let at = self.global(p) * n;
                let out = &mut output[at + piece.start..at + piece.end];
                self.copy_out(l.data(p, h), out, context)?;
            }
        }
        Ok(())
    }

    /// A sum_scatter: `input` is P blocks of `output.len()` bytes; this rank's block of
    /// the sum lands in `output`.
    pub(crate) fn sum_scatter(
        &mut self,
        call: &Call,
        dtype: DType,
        input: &[u8],
        output: &mut [u8],
        watch: &mut Watch<'_>,
    ) -> Result<()> {
        let context = watch.context;
        let (me, size, l) = (self.me, self.size, self.layout);
        let ds = dtype.size();
        let block = output.len();
        let per = (l.chunk() / (size * ds)).max(1);
        let mut first = true;
        for piece in pieces(block / ds, per) {
            let h = self.next_half();
            let bytes = piece.start * ds..piece.end * ds;
            for j in 0..size {
                let src = &input[j * block + bytes.start..j * block + bytes.end];
                self.copy_in(l.data(me, h) + j * per * ds, src, context)?;
            }
            self.step(first.then_some(call), watch)?;
            first = false;
            let target = &mut output[bytes];
            let at = me * per * ds;
            self.copy_out(l.data(0, h) + at, target, context)?;
            for p in 1..size {
                self.fold((ReduceOp::Sum, dtype), target, l.data(p, h) + at, context)?;
            }
        }
        Ok(())
    }
}

/// The verbose line of rank `me` of a segment's `ranks` (`refusals` index them too), some of
/// which share a host identity but not the segment; `whole` if they are the whole group.
fn not_shared((ranks, me): (&[usize], usize), refusals: &[domain::Refusal], whole: bool) {
    let named: Vec<domain::Refusal> = refusals
        .iter()
        .map(|r| domain::Refusal {
            rank: ranks.get(r.rank).copied().unwrap_or(r.rank),
            code: r.code,
        })
        .collect();
    let leader = ranks.first().copied().unwrap_or(0);
    let rank = ranks.get(me).copied().unwrap_or(me);
    crate::verbose::verbose!(
        rank,
        "shared memory: {} could not open rank {leader}'s segment although the hellos put them \
         on this host (another mount namespace or container, with its own /dev/shm?); they \
         count as another host, so every link {}stays TCP",
        domain::describe(&named),
        if whole {
            String::new()
        } else {
            format!("between ranks {ranks:?} ")
        }
    );
}

/// Writes all of `bytes` on connection `conn` by `deadline`.
fn write_all(
    transport: &mut Transport,
    conn: usize,
    bytes: &[u8],
    deadline: Instant,
    timeout: Duration,
) -> Result<()> {
    let moves = (conn, PeerOp::Send, bytes.len());
    move_all(transport, moves, deadline, timeout, |c, done| {
        c.write(&bytes[done..])
    })
}

/// Reads exactly `buf.len()` bytes from connection `conn` by `deadline`.
fn read_exact(
    transport: &mut Transport,
    conn: usize,
    buf: &mut [u8],
    deadline: Instant,
    timeout: Duration,
) -> Result<()> {
    let moves = (conn, PeerOp::Receive, buf.len());
    move_all(transport, moves, deadline, timeout, |c, done| {
        c.read(&mut buf[done..])
    })
}

/// Moves `len` bytes as `op` on connection `conn` by `deadline`, `step` moving what it
/// can from offset `done` on.
fn move_all(
    transport: &mut Transport,
    (conn, op, len): (usize, PeerOp, usize),
    deadline: Instant,
    timeout: Duration,
    mut step: impl FnMut(&mut Conn, usize) -> std::io::Result<Transfer>,
) -> Result<()> {
    let mut done = 0;
    while done < len {
        transport.assume_ready();
        let c = transport.conn(conn);
        match step(c, done) {
            Ok(Transfer::Moved(n)) => done += n,
            Ok(Transfer::Closed) => return Err(c.closed(op, SETUP)),
            Err(e) => return Err(c.failed(op, SETUP, e)),
            Ok(Transfer::Blocked) => {
                let waited = transport
                    .wait(deadline)
                    .map_err(|e| Error::local("waiting to set up shared memory", e))?;
                if !waited {
                    let waits = [(conn, op)];
                    return Err(transport.inquire(&waits, waits[0], timeout, SETUP));
                }
            }
        }
    }
    Ok(())
}

/// What a wait ([`Link::wait_on`]) waits for: a peer's step word to reach this rank's step
/// (a peer that failed after publishing it still counts), or a `p2p` slot counter (where
/// only the counter's value does).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Awaited {
    Step,
    Slot,
}
