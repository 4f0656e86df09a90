//! Drives the step machine (`protocol::Steps`) on the segment with [`progress`], the one
//! wait policy of every transport: the machine says what to copy, publish, compare and
//! wait for; this does it.
//!
//! # Waiting
//!
//! A rank waits for a peer's word by retrying ([`progress`]'s spin: eagerly only when
//! every local rank has a CPU, yielding otherwise), then by sleeping on the word in slices
//! of [`SLICE`] ([`Drive::wait`]): whoever changes the word wakes the sleepers it counts
//! (a system call only when someone sleeps). Between slices the rank looks at the
//! refusal word of the peer it waits for, answers and reads the TCP connections' urgent
//! bytes (failure notices, liveness queries), and probes the connections, so a peer that
//! died is named at once and one that stopped is named after the timeout, as on TCP;
//! [`progress`] looks at the group's close flag on every round. An idle group runs
//! nothing.
//!
//! Besides the word itself, a wait ends in a mismatch when the peer's calls went another
//! way ([`Awaited`]): a `send` blocked on full slots, or a `recv` on empty ones, whose
//! peer published a step this rank has not (it is in a group collective); a step whose
//! peer refused it from a `recv` (its refusal word); and, once the wait sleeps, a step
//! whose peer sent a message before the collective that this rank has not taken.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::p2p;
use super::protocol::{Await, Awaited, Collective, Op, Receive, Source, Steps, Transmit};
use super::segment::{CallHeader, HEADER_BYTES, Segment, reached};
use crate::comm::progress::{Drive, WaitPolicy, progress};
use crate::comm::state::CloseFlag;
use crate::error::{Error, PeerOp, Phase, Result};
use crate::transport::tcp::{Connections as Transport, Transfer};

/// How long a sleeping wait lasts before the rank looks at its connections and the clock
/// again.
pub(crate) const SLICE: Duration = Duration::from_millis(5);

/// How long a rank of a domain of a larger group still waits for the step it awaits once
/// a connection closed (see [`Driver::look`]): time for its leader to pass on a mismatch
/// that another host's rank failed on, under load. A dead rank is named that much later.
const LAST_LOOK: Duration = Duration::from_millis(250);

/// What a wait watches besides the segment: the group's close flag and its connections.
pub(crate) struct Watch<'a> {
    pub(crate) transport: &'a mut Transport,
    pub(crate) closed: &'a CloseFlag,
    pub(crate) context: Phase,
    /// This rank (its group rank) and its call, to check a header that arrives on a
    /// connection meanwhile and to look for messages a peer sent before a collective;
    /// `None` where a faster rank's next call may be on the connections already (a
    /// hierarchical group's).
    pub(crate) call: Option<(usize, &'a dyn CallHeader)>,
}

impl Watch<'_> {
    /// Looks at everything that can end a wait for `peer` (a group rank) other than the
    /// peer's word: a close, a connection that ended, a header that differs; past
    /// `deadline`, asks the peers who is alive (as the TCP engine does) and names the one
    /// that is not.
    fn check(&mut self, peer: usize, deadline: Instant, timeout: Duration) -> Result<()> {
        self.probe(peer)?;
        if Instant::now() >= deadline {
            return Err(self.inquire(peer, timeout));
        }
        Ok(())
    }

    /// [`Watch::check`] without the deadline.
    fn probe(&mut self, peer: usize) -> Result<()> {
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
                    let mut head = [0u8; HEADER_BYTES];
                    if let Some((me, call)) = self.call
                        && matches!(conn.peek(&mut head), Ok(n) if n == head.len())
                    {
                        call.check(me, conn.peer, &head)?;
                    }
                }
                Ok(_) => {}
            }
        }
        Ok(())
    }

    /// The error for a silence of `timeout` while waiting for `peer`: the peers are asked
    /// who is alive, and the error names the one that is not.
    fn inquire(&mut self, peer: usize, timeout: Duration) -> Error {
        let conn = self.transport.recv_conn(peer);
        let waits = [(conn, PeerOp::Receive)];
        self.transport
            .inquire(&waits, waits[0], timeout, self.context)
    }
}

/// The caller's memory a collective works on.
pub(crate) struct Memory<'a> {
    /// Read and written: the array of an all-reduce or broadcast, the output of the
    /// others, a `recv`'s buffer.
    pub(crate) data: &'a mut [u8],
    /// Read only: the input of all_gather, sum_scatter and all_to_all, a `send`'s data.
    pub(crate) input: &'a [u8],
}

impl Memory<'_> {
    /// No memory (a barrier, the setup).
    pub(crate) fn empty() -> Memory<'static> {
        Memory {
            data: &mut [],
            input: &[],
        }
    }

    /// `data` only.
    pub(crate) fn data(data: &mut [u8]) -> Memory<'_> {
        Memory { data, input: &[] }
    }

    /// `input` read and `output` written (all_gather, sum_scatter, all_to_all).
    pub(crate) fn io<'m>(input: &'m [u8], output: &'m mut [u8]) -> Memory<'m> {
        Memory {
            data: output,
            input,
        }
    }
}

/// Runs `collective` on `seg` with the machine `steps` to the end: `call` is the call whose
/// header it publishes and compares (`None` only for [`Collective::Mapped`]).
///
/// # Errors
///
/// A mismatch, a peer that died or stayed silent past `timeout`, a close, or a bug in the
/// layout.
pub(crate) fn run(
    seg: &Segment,
    steps: &mut Steps,
    (collective, call): (Collective, Option<&dyn CallHeader>),
    mem: Memory<'_>,
    watch: &mut Watch<'_>,
    (timeout, policy): (Duration, &mut WaitPolicy),
) -> Result<()> {
    steps.start(collective, watch.context)?;
    let mut driver = Driver {
        seg,
        steps,
        call,
        header: call.map(CallHeader::encode),
        mem,
        watch,
        timeout,
        waiting: None,
        checked: None,
    };
    progress(&mut driver, timeout, policy)
}

/// One collective on the segment, as [`progress`] drives it.
struct Driver<'a, 'w, 'm> {
    seg: &'a Segment,
    steps: &'a mut Steps,
    call: Option<&'a dyn CallHeader>,
    /// The call's header, encoded once per collective: it is published, and the peers'
    /// equal to it need no closer look ([`CallHeader::check`] accepts them).
    header: Option<[u8; HEADER_BYTES]>,
    mem: Memory<'m>,
    watch: &'a mut Watch<'w>,
    timeout: Duration,
    /// The step word (or mapping count) the machine waits on and its value, resolved
    /// once per wait: the idle rounds of [`progress`] only load it.
    waiting: Option<(&'a AtomicU32, u32)>,
    /// When the connections were last looked at in this wait (or the wait began to
    /// sleep): they are looked at once per [`SLICE`]. Cleared whenever something moves.
    checked: Option<Instant>,
}

impl<'a> Driver<'a, '_, '_> {
    fn context(&self) -> Phase {
        self.watch.context
    }

    /// The group rank of local rank `local`.
    fn global(&self, local: usize) -> usize {
        self.steps.ranks().get(local).copied().unwrap_or(local)
    }

    fn call(&self) -> Result<&'a dyn CallHeader> {
        self.call.ok_or_else(|| Error::Bug {
            context: self.watch.context,
            what: "a shared-memory step that compares headers without a call".into(),
        })
    }

    /// The call's encoded header ([`Driver::call`]'s).
    fn header(&self) -> Result<[u8; HEADER_BYTES]> {
        self.header.ok_or_else(|| Error::Bug {
            context: self.watch.context,
            what: "a shared-memory step that writes a header without a call".into(),
        })
    }

    fn bug(&self, what: String) -> Error {
        Error::Bug {
            context: self.watch.context,
            what,
        }
    }

    fn word(&self, off: usize) -> Result<&AtomicU32> {
        self.seg.word(off, self.watch.context)
    }

    /// Does the write `t`.
    fn transmit(&mut self, t: Transmit) -> Result<()> {
        let context = self.context();
        match t {
            Transmit::CopyIn { from, to } => {
                let src = match &from {
                    Source::Data(r) => self.mem.data.get(r.clone()),
                    Source::Input(r) => self.mem.input.get(r.clone()),
                };
                let src = src.ok_or_else(|| self.bug(format!("a copy from {from:?}")))?;
                self.seg.copy_in(to, src, context)
            }
            Transmit::Header { to } => self.seg.copy_in(to, &self.header()?, context),
            Transmit::Stamp { to, step } => self.seg.copy_in(to, &step.to_le_bytes(), context),
            Transmit::Publish {
                header,
                word,
                value,
                sleepers,
            } => {
                if let Some(to) = header {
                    self.seg.copy_in(to, &self.header()?, context)?;
                }
                let word = self.word(word)?;
                word.store(value, Ordering::SeqCst);
                if self.word(sleepers)?.load(Ordering::SeqCst) > 0 {
                    ffi::shm::wake_all(word);
                }
                Ok(())
            }
        }
    }

    /// Does the read `r`; `false` if it is a word that has not reached its value yet.
    fn receive(&mut self, r: Receive) -> Result<bool> {
        let context = self.context();
        let me = self.steps.me();
        match r {
            Receive::Reached(a) => {
                let reached = self.poll(&a)?;
                if !reached && matches!(a.kind, Awaited::Step | Awaited::Mapped) {
                    self.waiting = Some((self.seg.word(a.word, context)?, a.value));
                }
                Ok(reached)
            }
            Receive::Headers { half } => {
                let call = self.call()?;
                let mine = self.header()?;
                let l = self.steps.layout();
                let ranks = self.steps.ranks();
                for peer in (0..ranks.len()).filter(|&p| p != me) {
                    let got = self.seg.header(l.header(peer, half), context)?;
                    // A peer in step published this call's own bytes (`check` accepts
                    // them): one comparison of 16 bytes, not a call that encodes the
                    // header again before it compares (64 instructions per peer under
                    // callgrind, shared memory's 4 B all_sum at P = 2).
                    if got != mine {
                        call.check(ranks[me], ranks[peer], &got)?;
                    }
                }
                // Every peer is in this collective now: a message sent before it and not
                // taken is a mismatch (see `p2p`).
                let at = (self.seg, self.steps.channels());
                p2p::unmatched_sends(at, (ranks, me), self.steps.step(), call, context)?;
                Ok(true)
            }
            Receive::Message { peer, from } => {
                let got = self.seg.header(from, context)?;
                let call = self.call()?;
                let (me, src) = (self.global(me), self.global(peer));
                if let Err(e) = call.check(me, src, &got) {
                    if matches!(e, Error::Mismatch { .. }) {
                        // Tell the sender, which is not waiting for an answer (see
                        // `CallHeader::rejection`): best effort, before the group fails
                        // and closes.
                        let transport = &mut *self.watch.transport;
                        transport.assume_ready();
                        let conn = transport.send_conn(src);
                        let _ = transport.conn(conn).write(&call.rejection());
                    }
                    return Err(e);
                }
                Ok(true)
            }
            Receive::CopyOut { from, to } => {
                let Some(dst) = self.mem.data.get_mut(to.clone()) else {
                    return Err(self.bug(format!("a copy into {to:?}")));
                };
                self.seg.copy_out(from, dst, context)?;
                Ok(true)
            }
            Receive::Combine(c) => {
                let l = self.steps.layout();
                let Some(acc) = self.mem.data.get_mut(c.into.clone()) else {
                    return Err(self.bug(format!("a fold into {:?}", c.into)));
                };
                for (from, fold) in c.reads(l) {
                    if fold {
                        self.seg.fold((c.op, c.dtype), acc, from, context)?;
                    } else {
                        self.seg.copy_out(from, acc, context)?;
                    }
                }
                Ok(true)
            }
        }
    }

    /// Whether the awaited word reached its value; a mismatch if the peer of a `send`
    /// or `recv` went into a group collective instead.
    fn poll(&mut self, a: &Await) -> Result<bool> {
        let word = self.word(a.word)?;
        match a.kind {
            Awaited::Step | Awaited::Mapped => Ok(reached(word.load(Ordering::Acquire), a.value)),
            Awaited::Room | Awaited::Piece => {
                // The step first: the peer takes (or sends) what it takes before it
                // publishes the step of a later collective.
                let theirs = self.word(self.steps.layout().step(a.peer))?;
                let ahead = reached(
                    theirs.load(Ordering::Acquire),
                    self.steps.step().wrapping_add(1),
                );
                if reached(word.load(Ordering::Acquire), a.value) {
                    return Ok(true);
                }
                if !ahead {
                    return Ok(false);
                }
                let call = self.call()?;
                Err(if a.kind == Awaited::Room {
                    self.collective_of(call, a.peer)
                } else {
                    self.refuse(call, a.peer)
                })
            }
        }
    }

    /// [`Driver::poll`] once the wait sleeps, with the checks that cost more than a load:
    /// a step whose peer sent a message before this collective that this rank has not
    /// taken is a mismatch (see `p2p`), which the peer may be blocked in.
    fn poll_slow(&mut self, a: &Await) -> Result<bool> {
        if self.poll(a)? {
            return Ok(true);
        }
        if a.kind == Awaited::Step
            && let Some((_, call)) = self.watch.call
        {
            let ranks = self.steps.ranks();
            let (me, step) = (self.steps.me(), self.steps.step());
            let at = (self.seg, self.steps.channels());
            p2p::unread_from(at, (ranks, me, a.peer), step, call, self.context())?;
        }
        Ok(false)
    }

    /// The mismatch of this rank's `send` (`call`) with the group collective local rank
    /// `peer` has started (its header for the step this rank has not published).
    fn collective_of(&self, call: &dyn CallHeader, peer: usize) -> Error {
        let context = self.context();
        let l = self.steps.layout();
        let half = (self.steps.step().wrapping_add(1) % 2) as usize;
        let got = match self.seg.header(l.header(peer, half), context) {
            Ok(got) => got,
            Err(e) => return e,
        };
        let (me, peer) = (self.global(self.steps.me()), self.global(peer));
        call.check(me, peer, &got).err().unwrap_or_else(|| {
            self.bug(format!(
                "rank {peer}'s group collective carries a send's header"
            ))
        })
    }

    /// The mismatch of this rank's `recv` (`call`) from local rank `src` with the group
    /// collective `src` runs; leaves the refusal where the ranks waiting for this rank's
    /// step see it.
    fn refuse(&self, call: &dyn CallHeader, src: usize) -> Error {
        let context = self.context();
        let l = self.steps.layout();
        let me = self.steps.me();
        let half = (self.steps.step().wrapping_add(1) % 2) as usize;
        let got = match self.seg.header(l.header(src, half), context) {
            Ok(got) => got,
            Err(e) => return e,
        };
        let (global_me, global_src) = (self.global(me), self.global(src));
        let error = match call.check(global_me, global_src, &got) {
            Err(e) => e,
            Ok(()) => self.bug(format!(
                "rank {global_src}'s group collective carries a send's header"
            )),
        };
        let published = self
            .seg
            .copy_in(l.refusal(me), &call.encode(), context)
            .and_then(|()| self.word(l.refused(me)))
            .and_then(|flag| {
                flag.store(global_src as u32 + 1, Ordering::SeqCst);
                self.word(l.step(me))
            });
        if let Ok(step) = published {
            // The waiters sleep on this rank's step word.
            ffi::shm::wake_all(step);
        }
        error
    }

    /// Fails with the mismatch if local rank `peer`'s `recv` refused this group
    /// collective (see `protocol`): the peer will not publish the step this rank waits for.
    fn refused_by(&self, peer: usize) -> Result<()> {
        let context = self.context();
        let l = self.steps.layout();
        let from = self.word(l.refused(peer))?.load(Ordering::Acquire);
        if from == 0 {
            return Ok(());
        }
        let got = self.seg.header(l.refusal(peer), context)?;
        let me = self.global(self.steps.me());
        let ranks = (me, self.global(peer), from.wrapping_sub(1) as usize);
        Err(self.call()?.refused_by(ranks, &got, context))
    }

    /// Looks at the connections ([`Watch::check`], which past `deadline` asks the peers who
    /// is alive): `Ok(true)` if the wait is over after all, `Ok(false)` if nothing ended
    /// it.
    fn look(&mut self, a: &Await, deadline: Instant) -> Result<bool> {
        let step = a.kind == Awaited::Step;
        let word = self.seg.word(a.word, self.context())?;
        let shares_group = self.steps.size() < self.watch.transport.ranks();
        match self
            .watch
            .check(self.global(a.peer), deadline, self.timeout)
        {
            Ok(()) => Ok(false),
            // The peer sets its refusal before it fails the group and closes: a close
            // seen here may be that refusal's.
            // A peer that published the step and then failed (a leader passing on a
            // mismatch found between hosts) is judged by its header, not its close.
            // In a domain of a larger group, a rank of another host that failed on a
            // mismatch closes while this domain's leader still passes the mismatch on:
            // the step gets a last look before the close is reported.
            Err(Error::Closed { .. } | Error::Io { .. } | Error::Lost { .. })
                if step && shares_group && last_look(word, a.value) =>
            {
                Ok(true)
            }
            Err(_) if step && reached(word.load(Ordering::Acquire), a.value) => Ok(true),
            Err(e) if a.kind == Awaited::Mapped => Err(e),
            Err(e) => Err(self.refused_by(a.peer).err().unwrap_or(e)),
        }
    }
}

/// Whether `word` reaches `value` within [`LAST_LOOK`].
fn last_look(word: &AtomicU32, value: u32) -> bool {
    let until = Instant::now() + LAST_LOOK;
    loop {
        if reached(word.load(Ordering::Acquire), value) {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

impl Drive for Driver<'_, '_, '_> {
    fn advance(&mut self) -> Result<bool> {
        if let Some((word, value)) = self.waiting {
            if !reached(word.load(Ordering::Acquire), value) {
                return Ok(false);
            }
            self.waiting = None;
        }
        loop {
            match self.steps.poll() {
                Some(Op::Transmit(t)) => {
                    self.transmit(t)?;
                    self.steps.handle_sent();
                }
                Some(Op::Receive(r)) => {
                    if !self.receive(r)? {
                        break;
                    }
                    self.steps.handle_received();
                }
                None => break,
            }
        }
        let moved = self.steps.take_progress();
        if moved {
            self.checked = None;
        }
        Ok(moved)
    }

    fn finished(&self) -> bool {
        self.steps.is_finished()
    }

    /// One slice of sleep on the awaited word (see the module docs), after the checks a
    /// sleeping wait makes; at the deadline, the look that names whom to blame.
    fn wait(&mut self, until: Instant) -> Result<bool> {
        let Some(a) = self.steps.poll_wait() else {
            return Ok(true);
        };
        if a.kind != Awaited::Mapped {
            self.refused_by(a.peer)?;
        }
        if self.poll_slow(&a)? {
            return Ok(true);
        }
        // The connections cost a few system calls to look at: once per slice of sleep,
        // not before every sleep (a step that sleeps once is the common case when ranks
        // share CPUs). The close flag and the refusal are one load each.
        let checked = *self.checked.get_or_insert_with(Instant::now);
        if checked.elapsed() >= SLICE {
            if self.look(&a, until)? {
                return Ok(true);
            }
            self.checked = Some(Instant::now());
        }
        let seg = self.seg;
        let context = self.context();
        let word = seg.word(a.word, context)?;
        let sleepers = match a.sleepers {
            Some(off) => Some(seg.word(off, context)?),
            None => None,
        };
        // Counted before the last look at the word, so the peer either sees the count
        // when it changes the word (and wakes this rank) or changed it before the look.
        if let Some(s) = sleepers {
            s.fetch_add(1, Ordering::SeqCst);
        }
        let seen = word.load(Ordering::SeqCst);
        let ready = self.poll(&a);
        if matches!(ready, Ok(false)) {
            let left = until.saturating_duration_since(Instant::now());
            ffi::shm::wait(word, seen, SLICE.min(left.max(Duration::from_micros(1))));
        }
        if let Some(s) = sleepers {
            s.fetch_sub(1, Ordering::SeqCst);
        }
        if ready? || Instant::now() < until {
            return Ok(true);
        }
        // The deadline: the peers are asked who is alive, unless the word arrived after
        // all meanwhile.
        self.look(&a, until)
    }

    fn stalled(&mut self, timeout: Duration) -> Error {
        let Some(a) = self.steps.poll_wait() else {
            return self.bug("a stalled shared-memory collective that waits for nothing".into());
        };
        let peer = self.global(a.peer);
        let error = match self.watch.probe(peer) {
            Err(e) => e,
            Ok(()) => self.watch.inquire(peer, timeout),
        };
        if a.kind == Awaited::Mapped {
            return error;
        }
        self.refused_by(a.peer).err().unwrap_or(error)
    }

    fn aborted(&self) -> Option<Error> {
        // Asked on every round of the loop: no error is made (and dropped) unless closed.
        if self.watch.closed.is_set() {
            Some(Error::Aborted {
                context: self.watch.context,
            })
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::super::p2p;
    use super::super::segment::{CHUNK, Layout};
    use super::*;
    use crate::comm::progress::Spin;
    use crate::element::DType;
    use crate::reduce::ReduceOp;

    /// A call whose header is fixed bytes, equal on every rank.
    struct Same([u8; HEADER_BYTES]);

    impl CallHeader for Same {
        fn encode(&self) -> [u8; HEADER_BYTES] {
            self.0
        }

        fn check(&self, _: usize, peer: usize, theirs: &[u8; HEADER_BYTES]) -> Result<()> {
            if *theirs == self.0 {
                return Ok(());
            }
            Err(Error::Bug {
                context: Phase::AllSum,
                what: format!("rank {peer}'s header differs"),
            })
        }

        fn rejection(&self) -> [u8; HEADER_BYTES] {
            [0; HEADER_BYTES]
        }

        fn refused_by(
            &self,
            _: (usize, usize, usize),
            _: &[u8; HEADER_BYTES],
            context: Phase,
        ) -> Error {
            Error::Bug {
                context,
                what: "a refusal in a measurement".into(),
            }
        }

        fn unmatched_send(
            &self,
            _: (usize, usize),
            _: &[u8; HEADER_BYTES],
            _: Phase,
        ) -> Result<()> {
            Ok(())
        }
    }

    /// CPU time of the machine and this engine per 4 B all-reduce at P = 2, against a peer
    /// that is always ahead (its step and header written by this thread before each
    /// collective): the per-collective cost a small collective's latency adds to the
    /// cache-line round trip, without the noise of a second CPU; with the old fixed spin
    /// and with the learned one, whose bookkeeping this includes.
    #[test]
    #[ignore = "a measurement: cargo test --release --lib measure_the_engine_per_collective -- --ignored --nocapture"]
    fn measure_the_engine_per_collective() {
        let size = 2;
        let layout = Layout::new(size, CHUNK, p2p::bytes(size));
        let path = ffi::shm::directory().join(format!(
            "nuvec-measure-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let mut seg = Segment::create(path, layout).expect("a segment");
        seg.remove().expect("unlinked");
        let mut steps = Steps::new(layout, &[0, 1], 0);
        let poll = mio::Poll::new().expect("a poller");
        let liveness = crate::transport::tcp::socket::Liveness::default();
        let mut transport =
            Transport::mesh(poll, 0, size, Vec::new(), Vec::new(), Vec::new(), &liveness)
                .expect("no conns");
        let closed = CloseFlag::default();
        let call = Same([7; HEADER_BYTES]);
        let fixed = WaitPolicy::fixed(Spin {
            total: Duration::from_micros(50),
            eager: Duration::from_micros(10),
        });
        let mut data = [0u8; 4];
        let rounds = 2_000_000;
        let mut times = [Vec::new(), Vec::new()];
        for round in 0..10 {
            let (name, mut spin) = if round % 2 == 0 {
                (0, fixed.clone())
            } else {
                (1, WaitPolicy::for_local_ranks(None, 1))
            };
            let start = Instant::now();
            for _ in 0..rounds {
                // The peer publishes the next step with the same header first.
                let next = steps.step().wrapping_add(1);
                let half = (next % 2) as usize;
                seg.copy_in(layout.header(1, half), &call.0, Phase::AllSum)
                    .expect("the peer's header");
                seg.word(layout.step(1), Phase::AllSum)
                    .expect("the peer's step")
                    .store(next, Ordering::Release);
                let mut watch = Watch {
                    transport: &mut transport,
                    closed: &closed,
                    context: Phase::AllSum,
                    call: Some((0, &call)),
                };
                let collective = Collective::AllReduce {
                    op: ReduceOp::Sum,
                    dtype: DType::F32,
                    len: 4,
                    one_shot: true,
                    keep: true,
                };
                run(
                    &seg,
                    &mut steps,
                    (collective, Some(&call)),
                    Memory::data(&mut data),
                    &mut watch,
                    (Duration::from_secs(5), &mut spin),
                )
                .expect("an all-reduce");
            }
            times[name].push(start.elapsed().as_secs_f64() * 1e9 / f64::from(rounds));
        }
        for (name, mut times) in ["fixed 50 µs", "learned"].into_iter().zip(times) {
            times.sort_by(f64::total_cmp);
            println!("P = 2, 4 B all-reduce, peer ahead, {name}: {times:.1?} ns per collective");
        }
    }
}
