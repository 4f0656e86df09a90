//! The notice rules, in isolation ([`Notices`], [`Inquiry`], the byte values) and over a
//! simulated group in the manner of quinn-proto's `Pair`: ranks on a ring joined by
//! simulated connections with a controllable clock, whose urgent bytes can be delivered
//! late, lost (read past) or replaced by a later one, and whose closes arrive after a
//! latency of their own.

use super::*;

#[test]
fn urgent_bytes_round_trip_and_stay_distinct() {
    for what in [
        Urgent::Query,
        Urgent::Alive,
        Urgent::Notice(0),
        Urgent::Notice(253),
    ] {
        let byte = what.encode().unwrap();
        assert_eq!(Urgent::decode(byte), what);
    }
    assert_eq!(
        Urgent::Notice(254).encode(),
        None,
        "would read as an answer"
    );
    assert_eq!(Urgent::Notice(usize::MAX).encode(), None);
    assert_ne!(Urgent::QUERY, Urgent::ALIVE);
}

const T: Duration = Duration::from_secs(1);

fn at(start: Instant, ms: u64) -> Instant {
    start + Duration::from_millis(ms)
}

/// An [`Inquiry`] of the test timeout `T`, started now, with its start.
struct Probe {
    inquiry: Inquiry,
    t0: Instant,
}

impl Probe {
    /// [`Inquiry::new`] of rank `me` of `size`, waiting on `neighbours`, `suspect` first.
    fn new<const N: usize>(me: usize, size: usize, neighbours: [usize; N], suspect: usize) -> Self {
        let t0 = Instant::now();
        let inquiry = Inquiry::new(me, size, neighbours, suspect, t0, T);
        Probe { inquiry, t0 }
    }

    /// The inquiry's verdict `ms` after its start.
    fn verdict_at(&self, ms: u64) -> Option<Verdict> {
        self.inquiry.verdict(at(self.t0, ms))
    }

    fn next_deadline(&self, now: Instant) -> Instant {
        self.inquiry.next_deadline(now)
    }

    /// Asserts no verdict 1 ms after the start, and `stalled` named stalled `ms` after it.
    fn assert_stalls(&self, stalled: usize, ms: u64) {
        assert_eq!(self.verdict_at(1), None);
        assert_eq!(self.verdict_at(ms), Some(Verdict::Stalled(stalled)));
    }
}

#[test]
fn the_grace_is_a_quarter_of_the_timeout_at_most_half_a_second() {
    assert_eq!(Inquiry::grace(T), Duration::from_millis(250));
    assert_eq!(Inquiry::grace(T * 10), Duration::from_millis(500));
    assert_eq!(Inquiry::grace(Duration::MAX), Duration::from_millis(500));
}

#[test]
fn a_silent_neighbour_is_stalled_once_the_grace_ends() {
    // Rank 1 of 4 waits on 0 and 2; 0 answers, 2 (the stopped one) never does.
    let mut q = Probe::new(1, 4, [0, 2], 0);
    q.inquiry.urgent(0, Urgent::Alive, q.t0);
    assert_eq!(q.verdict_at(100), None, "too early");
    assert_eq!(q.next_deadline(at(q.t0, 100)), at(q.t0, 250));
    assert_eq!(q.verdict_at(250), Some(Verdict::Stalled(2)));
}

#[test]
fn the_suspect_is_preferred_among_silent_neighbours() {
    let q = Probe::new(1, 4, [0, 2], 2);
    assert_eq!(q.verdict_at(300), Some(Verdict::Stalled(2)));
    let q = Probe::new(1, 4, [0, 2], 0);
    assert_eq!(q.verdict_at(300), Some(Verdict::Stalled(0)));
}

#[test]
fn when_every_neighbour_answers_a_notice_is_awaited_then_only_guessed() {
    // Rank 0 of 4 with rank 2 stopped: both neighbours are alive.
    // They timed out with it and asked back.
    let mut q = Probe::new(0, 4, [1, 3], 3);
    q.inquiry.urgent(1, Urgent::Query, q.t0);
    q.inquiry.urgent(3, Urgent::Query, q.t0);
    assert_eq!(q.verdict_at(300), None, "waits for a notice");
    assert_eq!(q.next_deadline(at(q.t0, 300)), at(q.t0, 500));
    assert_eq!(q.verdict_at(500), Some(Verdict::Guess(3)));
    // The notice of rank 3, next to the stopped rank, settles it.
    q.inquiry.urgent(3, Urgent::Notice(2), q.t0);
    assert_eq!(q.verdict_at(300), Some(Verdict::Lost { lost: 2, via: 3 }));
}

#[test]
fn a_neighbour_that_answered_is_given_its_own_timeout_and_grace_before_a_guess() {
    // Rank 3 answered 100 ms in: it was inside a collective that had not timed out, so
    // its verdict may come up to a timeout and a grace later; patience waits for that
    // and a grace more.
    let mut q = Probe::new(0, 4, [1, 3], 3);
    q.inquiry.urgent(1, Urgent::Query, q.t0);
    q.inquiry.urgent(3, Urgent::Alive, at(q.t0, 100));
    let grace = Inquiry::grace(T).as_millis() as u64;
    let patience = 100 + T.as_millis() as u64 + 2 * grace;
    assert_eq!(q.verdict_at(2 * grace), None);
    assert_eq!(q.next_deadline(at(q.t0, 300)), at(q.t0, patience));
    assert_eq!(q.verdict_at(patience - 1), None);
    assert_eq!(q.verdict_at(patience), Some(Verdict::Guess(3)));
    // A second answer does not move it again.
    q.inquiry.urgent(3, Urgent::Alive, at(q.t0, 900));
    assert_eq!(q.verdict_at(patience), Some(Verdict::Guess(3)));
    // Its notice ends the wait.
    q.inquiry.urgent(3, Urgent::Notice(2), at(q.t0, 1200));
    assert_eq!(q.verdict_at(1200), Some(Verdict::Lost { lost: 2, via: 3 }));
}

#[test]
fn patience_past_the_clock_s_range_waits_without_panicking() {
    let t0 = Instant::now();
    let mut inquiry = Inquiry::new(0, 4, [1, 3], 3, t0, Duration::MAX);
    inquiry.urgent(1, Urgent::Alive, t0);
    inquiry.urgent(3, Urgent::Alive, t0);
    assert_eq!(inquiry.verdict(at(t0, 60_000)), None);
}

#[test]
fn a_notice_naming_a_neighbour_heard_alive_is_ignored() {
    let mut q = Probe::new(1, 4, [0, 2], 2);
    q.inquiry.urgent(2, Urgent::Query, q.t0);
    q.inquiry.urgent(0, Urgent::Notice(2), q.t0);
    assert_eq!(q.verdict_at(10), None);
    // Nor may a notice name this rank or its sender.
    q.inquiry.urgent(0, Urgent::Notice(1), q.t0);
    q.inquiry.urgent(0, Urgent::Notice(0), q.t0);
    assert_eq!(q.verdict_at(10), None);
    assert_eq!(q.verdict_at(600), Some(Verdict::Guess(2)));
}

#[test]
fn a_notice_wins_over_a_silent_neighbour() {
    // Rank 1 hears from 0 that 2 was lost before its own grace ends.
    let mut q = Probe::new(1, 5, [0, 2], 2);
    q.inquiry.urgent(0, Urgent::Notice(2), q.t0);
    assert_eq!(q.verdict_at(1), Some(Verdict::Lost { lost: 2, via: 0 }));
}

#[test]
fn a_neighbour_that_closes_without_a_word_died_but_one_that_spoke_gave_up() {
    let mut q = Probe::new(1, 4, [0, 2], 0);
    q.inquiry.closed(2);
    assert_eq!(q.verdict_at(1), Some(Verdict::Closed(2)));
    let mut q = Probe::new(1, 4, [0, 2], 0);
    q.inquiry.urgent(0, Urgent::Query, q.t0);
    q.inquiry.closed(0);
    q.assert_stalls(2, 300);
}

#[test]
fn two_ranks_and_strangers() {
    // At P = 2 both sides are the same neighbour; bytes from a rank not asked about
    // change nothing, and this rank is never its own neighbour.
    let mut q = Probe::new(0, 2, [1, 1, 0], 1);
    assert_eq!(q.inquiry.heard.len(), 1);
    q.inquiry.urgent(7, Urgent::Alive, q.t0);
    q.inquiry.closed(7);
    q.assert_stalls(1, 250);
}
#[test]
fn a_query_is_answered_while_answering_and_only_once() {
    let mut n = Notices::new(1, 4, 2);
    assert_eq!(n.poll_transmit(), None);
    n.received(Urgent::QUERY);
    assert!(n.spoke());
    assert_eq!(n.poll_transmit(), Some(Urgent::Alive));
    n.handle_sent(Urgent::Alive, Sent::NoRoom);
    assert_eq!(n.poll_transmit(), Some(Urgent::Alive), "offered again");
    n.handle_sent(Urgent::Alive, Sent::Done);
    assert_eq!(n.poll_transmit(), None);
}

#[test]
fn an_inquiring_side_asks_and_no_longer_answers() {
    let mut n = Notices::new(1, 4, 2);
    n.received(Urgent::QUERY);
    n.start_inquiry();
    assert_eq!(n.poll_transmit(), Some(Urgent::Query));
    n.handle_sent(Urgent::Query, Sent::Done);
    n.received(Urgent::QUERY);
    assert_eq!(n.poll_transmit(), None, "its own query was the answer");
}

#[test]
fn an_abandoning_side_sends_only_its_notice_and_never_to_the_lost_rank() {
    let mut n = Notices::new(1, 4, 2);
    n.start_inquiry();
    assert!(n.abandon(Some(3)));
    assert_eq!(n.poll_transmit(), Some(Urgent::Notice(3)));
    n.handle_sent(Urgent::Notice(3), Sent::Done);
    assert!(!n.notice_pending());
    assert_eq!(n.poll_transmit(), None, "the query is dropped too");
    let mut to_lost = Notices::new(1, 4, 2);
    assert!(!to_lost.abandon(Some(2)), "the lost rank is not told");
    assert!(!to_lost.abandon(None), "a guess is not announced");
    let mut far = Notices::new(1, 400, 2);
    assert!(!far.abandon(Some(300)), "no byte can name rank 300");
}

#[test]
fn the_first_notice_stands_and_names_a_third_rank_only() {
    let mut n = Notices::new(1, 4, 2);
    n.received(1); // names this rank
    assert_eq!(n.notice(), None);
    assert!(n.listening());
    n.received(3);
    assert_eq!(n.notice(), Some(3));
    assert!(!n.listening());
    n.received(0);
    n.received(Urgent::QUERY);
    assert_eq!(n.notice(), Some(3));
    assert_eq!(
        n.poll_transmit(),
        None,
        "a peer that gave up is not answered"
    );
}

/// Milliseconds of simulated time.
fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// One direction of a simulated connection: its urgent byte in flight (the byte and when
/// it becomes readable) and when the sender's close arrives.
#[derive(Clone, Debug, Default)]
struct Direction {
    urgent: Option<(u8, Instant)>,
    fin: Option<Instant>,
    /// The receiver reads past the next urgent byte matching this before taking it.
    lose: Option<fn(Urgent) -> bool>,
    /// Bytes that were turned into stream bytes or read past (for the tests to see).
    lost: Vec<u8>,
}

/// What a simulated rank is doing.
#[derive(Debug)]
enum Doing {
    /// Inside its collective, which times out at the instant given: takes urgent bytes as
    /// its poller reports them and answers queries.
    Collective(Instant),
    /// Stopped (SIGSTOP): its kernel holds what arrives, its process does nothing.
    Stopped,
    /// Its collective timed out: asks the neighbours and waits for a verdict.
    Inquiring(Inquiry),
    /// Gave up with this verdict (`None`: on a close it saw in its collective), leaving its
    /// notices until the instant given, then closing.
    Abandoning(Option<Verdict>, Instant),
    /// Closed its connections.
    Gone(Option<Verdict>),
}

/// A rank of the simulated group: its state per neighbour connection and what it does.
#[derive(Debug)]
struct Rank {
    /// Per neighbour: the [`Notices`] of this rank's end, and the link index.
    conns: Vec<(Notices, usize)>,
    doing: Doing,
    /// When the verdict came.
    decided: Option<Instant>,
    /// The rank a close without an inquiry made this rank give up on.
    closed_on: Option<Verdict>,
}

/// P ranks on a ring, each pair of neighbours joined by one simulated connection, and a
/// clock. `latency` delays every urgent byte and every close.
struct Net {
    now: Instant,
    start: Instant,
    timeout: Duration,
    latency: Duration,
    ranks: Vec<Rank>,
    /// Link `l` joins `ends[l].0` and `ends[l].1`; `dirs[l][0]` runs from the first to
    /// the second.
    ends: Vec<(usize, usize)>,
    dirs: Vec<[Direction; 2]>,
}

impl Net {
    /// A ring of `p` ranks, each in a collective that times out at `timeout` plus its
    /// entry of `skew`.
    fn ring(p: usize, timeout: Duration, skew: &[Duration], latency: Duration) -> Net {
        let start = Instant::now();
        let mut ends = Vec::new();
        for r in 0..p {
            let next = (r + 1) % p;
            if !ends.contains(&(next, r)) && !ends.contains(&(r, next)) {
                ends.push((r, next));
            }
        }
        let ranks = (0..p)
            .map(|r| Rank {
                conns: ends
                    .iter()
                    .enumerate()
                    .filter_map(|(l, &(a, b))| {
                        let peer = if a == r {
                            b
                        } else if b == r {
                            a
                        } else {
                            return None;
                        };
                        Some((Notices::new(r, p, peer), l))
                    })
                    .collect(),
                doing: Doing::Collective(
                    start + timeout + skew.get(r).copied().unwrap_or_default(),
                ),
                decided: None,
                closed_on: None,
            })
            .collect();
        Net {
            now: start,
            start,
            timeout,
            latency,
            ranks,
            dirs: vec![Default::default(); ends.len()],
            ends,
        }
    }

    /// The direction of link `l` that rank `r` sends on, and the one it receives on.
    fn dirs_of(&self, l: usize, r: usize) -> (usize, usize) {
        if self.ends[l].0 == r { (0, 1) } else { (1, 0) }
    }

    fn stop(&mut self, r: usize) {
        self.ranks[r].doing = Doing::Stopped;
    }

    /// Rank `r` dies now: its connections close without a word.
    fn kill(&mut self, r: usize) {
        self.close_all(r);
        self.ranks[r].doing = Doing::Gone(None);
    }

    fn close_all(&mut self, r: usize) {
        for i in 0..self.ranks[r].conns.len() {
            let l = self.ranks[r].conns[i].1;
            let (tx, _) = self.dirs_of(l, r);
            self.dirs[l][tx].fin.get_or_insert(self.now + self.latency);
        }
    }

    /// Sends what rank `r`'s end of its `i`th connection offers, with TCP's rule: a byte
    /// sent while the previous one was not yet taken turns that one into a stream byte.
    fn flush(&mut self, r: usize, i: usize) {
        let (notices, l) = &mut self.ranks[r].conns[i];
        let Some(what) = notices.poll_transmit() else {
            return;
        };
        let (tx, _) = if self.ends[*l].0 == r { (0, 1) } else { (1, 0) };
        let dir = &mut self.dirs[*l][tx];
        if let Some((old, _)) = dir
            .urgent
            .replace((what.encode().unwrap(), self.now + self.latency))
        {
            dir.lost.push(old);
        }
        notices.handle_sent(what, Sent::Done);
    }

    /// Rank `r` takes the urgent bytes that reached it; returns which of its connections
    /// saw the peer's close.
    fn take(&mut self, r: usize) -> Vec<bool> {
        let mut closed = Vec::new();
        for i in 0..self.ranks[r].conns.len() {
            let l = self.ranks[r].conns[i].1;
            let (_, rx) = self.dirs_of(l, r);
            let now = self.now;
            let dir = &mut self.dirs[l][rx];
            if let Some((byte, at)) = dir.urgent
                && at <= now
            {
                dir.urgent = None;
                match dir.lose {
                    Some(lose) if lose(Urgent::decode(byte)) => {
                        dir.lose = None;
                        dir.lost.push(byte);
                    }
                    _ => self.ranks[r].conns[i].0.received(byte),
                }
            }
            closed.push(dir.fin.is_some_and(|at| at <= now));
        }
        closed
    }

    /// One tick of every rank at the current time.
    fn tick(&mut self) {
        for r in 0..self.ranks.len() {
            if matches!(self.ranks[r].doing, Doing::Stopped | Doing::Gone(_)) {
                continue;
            }
            let closed = self.take(r);
            let now = self.now;
            let doing = std::mem::replace(&mut self.ranks[r].doing, Doing::Stopped);
            self.ranks[r].doing = match doing {
                Doing::Collective(until) => {
                    if let Some(i) = closed.iter().position(|&c| c) {
                        // A close in the collective fails it; the notice on that connection
                        // names the lost rank, else the peer that closed is blamed (the
                        // connections' diagnosis, in short).
                        let (n, _) = &self.ranks[r].conns[i];
                        let verdict = match n.notice() {
                            Some(lost) => Verdict::Lost {
                                lost,
                                via: n.peer(),
                            },
                            None => Verdict::Closed(n.peer()),
                        };
                        self.ranks[r].closed_on = Some(verdict);
                        self.abandon(r, Some(verdict))
                    } else if now >= until {
                        let neighbours: Vec<usize> =
                            self.ranks[r].conns.iter().map(|(n, _)| n.peer()).collect();
                        let suspect = neighbours[0];
                        for (n, _) in &mut self.ranks[r].conns {
                            n.start_inquiry();
                        }
                        Doing::Inquiring(Inquiry::new(
                            r,
                            self.ranks.len(),
                            neighbours,
                            suspect,
                            now,
                            self.timeout,
                        ))
                    } else {
                        Doing::Collective(until)
                    }
                }
                Doing::Inquiring(mut inquiry) => {
                    for (i, (n, _)) in self.ranks[r].conns.iter().enumerate() {
                        inquiry.hear(n, closed[i], now);
                    }
                    match inquiry.verdict(now) {
                        Some(v) => self.abandon(r, Some(v)),
                        None => Doing::Inquiring(inquiry),
                    }
                }
                Doing::Abandoning(v, until) => {
                    let pending = self.ranks[r].conns.iter().any(|(n, _)| n.notice_pending());
                    if now >= until || !pending {
                        self.close_all(r);
                        Doing::Gone(v)
                    } else {
                        Doing::Abandoning(v, until)
                    }
                }
                other => other,
            };
            for i in 0..self.ranks[r].conns.len() {
                self.flush(r, i);
            }
        }
    }

    /// Rank `r` gives up with `verdict`: announces the lost rank unless it only guessed.
    fn abandon(&mut self, r: usize, verdict: Option<Verdict>) -> Doing {
        let lost = match verdict {
            Some(Verdict::Stalled(p) | Verdict::Closed(p) | Verdict::Lost { lost: p, .. }) => {
                Some(p)
            }
            Some(Verdict::Guess(_)) | None => None,
        };
        for (n, _) in &mut self.ranks[r].conns {
            n.abandon(lost);
        }
        self.ranks[r].decided = Some(self.now);
        Doing::Abandoning(verdict, self.now + ms(250))
    }

    /// A ring of 4 ranks timing out at `T` plus their entry of `skew`, 1 ms of latency,
    /// with rank `stopped` stopped, run for up to 5 s.
    fn stopped(skew: &[Duration], stopped: usize) -> Net {
        let mut net = Net::ring(4, T, skew, ms(1));
        net.stop(stopped);
        net.run(ms(5000));
        net
    }

    /// Runs in steps of 1 ms until every rank that is not stopped is gone, or `limit`.
    fn run(&mut self, limit: Duration) {
        while self.now < self.start + limit {
            self.tick();
            if self
                .ranks
                .iter()
                .all(|r| matches!(r.doing, Doing::Gone(_) | Doing::Stopped))
            {
                return;
            }
            self.now += ms(1);
        }
    }

    /// Asserts that rank `r` named rank `lost` through a notice from one of its two ring
    /// neighbours.
    fn assert_lost_via_neighbour(&self, r: usize, lost: usize) {
        let p = self.ranks.len();
        let verdict = self.verdict(r);
        assert!(
            matches!(verdict, Some(Verdict::Lost { lost: l, via })
                if l == lost && (via == (r + 1) % p || via == (r + p - 1) % p)),
            "rank {r}: {verdict:?}"
        );
    }

    fn verdict(&self, r: usize) -> Option<Verdict> {
        match self.ranks[r].doing {
            Doing::Gone(v) | Doing::Abandoning(v, _) => v,
            _ => None,
        }
    }

    /// When rank `r` reached its verdict, from the start.
    fn decided(&self, r: usize) -> Duration {
        self.ranks[r].decided.expect("decided") - self.start
    }
}

#[test]
fn a_stopped_rank_is_named_by_its_neighbours_and_by_notice_beyond() {
    // Rank 2 of 4 stops; the others time out within a few ms of each other.
    let net = Net::stopped(&[ms(7), ms(0), ms(0), ms(0)], 2);
    assert_eq!(net.verdict(1), Some(Verdict::Stalled(2)));
    assert_eq!(net.verdict(3), Some(Verdict::Stalled(2)));
    net.assert_lost_via_neighbour(0, 2);
    // Rank 2's neighbours decide once the grace after their own timeout ends...
    let grace = Inquiry::grace(T);
    assert_eq!(net.decided(1), T + grace);
    assert_eq!(net.decided(3), T + grace);
    // ...and rank 0, whose neighbours both answered, as soon as a notice arrives: after
    // they decided, long before its own patience would have made it guess.
    assert!(net.decided(0) > net.decided(1));
    assert!(
        net.decided(0) < T + ms(7) + 2 * grace,
        "{:?}",
        net.decided(0)
    );
}

#[test]
fn a_notice_passed_on_can_beat_a_rank_s_own_grace() {
    // As above, but rank 3 times out 3 ms after rank 1: rank 1's notice reaches rank 0,
    // whose own notice reaches rank 3 before rank 3's grace ends. Rank 3 names the right
    // rank, through rank 0.
    let net = Net::stopped(&[ms(7), ms(0), ms(0), ms(3)], 2);
    assert_eq!(net.verdict(1), Some(Verdict::Stalled(2)));
    assert_eq!(net.verdict(3), Some(Verdict::Lost { lost: 2, via: 0 }));
    assert!(net.decided(3) < T + ms(3) + Inquiry::grace(T));
}

#[test]
fn a_neighbour_that_entered_late_is_waited_for_not_guessed() {
    // Rank 2 of 4 stops. Ranks 1 and 3 entered the collective 300 ms after rank 0 (a
    // busy host), so they answer rank 0's query from inside it and decide 300 ms after
    // rank 0's timeout plus their grace: later than twice rank 0's grace. Rank 0 waits for
    // their verified notice instead of guessing.
    let net = Net::stopped(&[ms(0), ms(300), ms(0), ms(300)], 2);
    let grace = Inquiry::grace(T);
    assert_eq!(net.verdict(1), Some(Verdict::Stalled(2)));
    assert_eq!(net.verdict(3), Some(Verdict::Stalled(2)));
    assert!(net.decided(1) > T + 2 * grace, "{:?}", net.decided(1));
    net.assert_lost_via_neighbour(0, 2);
}

#[test]
fn a_rank_whose_notice_was_read_past_guesses_and_does_not_announce_it() {
    // Rank 2 of 5 stops. Rank 0's only route to news of it is rank 1's notice (rank 4
    // waits on rank 3's, which it passes on after rank 0 decided): rank 0 reads past it.
    let mut net = Net::ring(5, T, &[], ms(1));
    net.stop(2);
    let l = net.ends.iter().position(|&e| e == (0, 1)).unwrap();
    net.dirs[l][1].lose = Some(|u| matches!(u, Urgent::Notice(_)));
    let l = net.ends.iter().position(|&e| e == (4, 0)).unwrap();
    net.dirs[l][0].lose = Some(|u| matches!(u, Urgent::Notice(_)));
    net.run(ms(5000));
    assert_eq!(net.verdict(1), Some(Verdict::Stalled(2)));
    assert_eq!(net.verdict(3), Some(Verdict::Stalled(2)));
    assert_eq!(net.verdict(4), Some(Verdict::Lost { lost: 2, via: 3 }));
    // Rank 0 heard both neighbours alive, got no notice, and named its suspect as a guess
    // when its patience (twice the grace) ran out...
    assert_eq!(net.verdict(0), Some(Verdict::Guess(1)));
    assert_eq!(net.decided(0), T + 2 * Inquiry::grace(T));
    // ...which it did not announce: no notice went out from rank 0.
    for (l, &(a, b)) in net.ends.iter().enumerate() {
        let from_zero = if a == 0 {
            0
        } else if b == 0 {
            1
        } else {
            continue;
        };
        let dir = &net.dirs[l][from_zero];
        let sent = dir
            .urgent
            .iter()
            .map(|u| u.0)
            .chain(dir.lost.iter().copied());
        assert!(
            sent.map(Urgent::decode)
                .all(|u| !matches!(u, Urgent::Notice(_))),
            "rank 0 announced its guess: {dir:?}"
        );
    }
}

#[test]
fn a_rank_that_died_without_a_word_is_named_by_every_rank() {
    let mut net = Net::ring(4, T, &[], ms(1));
    net.now += ms(10);
    net.kill(2);
    net.run(ms(5000));
    // Its neighbours see it close without a notice; rank 0 learns of it from their notices
    // before its own timeout.
    assert_eq!(net.verdict(1), Some(Verdict::Closed(2)));
    assert_eq!(net.verdict(3), Some(Verdict::Closed(2)));
    net.assert_lost_via_neighbour(0, 2);
    assert!(net.decided(0) < T, "{:?}", net.decided(0));
}

#[test]
fn answers_later_than_the_grace_make_a_live_neighbour_look_stalled() {
    // The window the grace leaves: a neighbour whose answer takes longer than the grace to
    // arrive is found stalled. Just inside the window the verdict is right.
    let grace = Inquiry::grace(T);
    // Rank 1 times out late enough that its own query does not replace its answer in
    // flight (TCP's one urgent byte per direction).
    let mut inside = Net::ring(3, T, &[ms(0), ms(400), ms(400)], grace / 2 - ms(1));
    inside.stop(2);
    inside.run(ms(5000));
    assert_eq!(inside.verdict(0), Some(Verdict::Stalled(2)));
    let mut late = Net::ring(3, T, &[ms(0), ms(400), ms(400)], grace / 2 + ms(2));
    late.stop(2);
    late.run(ms(5000));
    assert_eq!(
        late.verdict(0),
        Some(Verdict::Stalled(1)),
        "rank 1's answer came after rank 0's grace: rank 0 names it (the suspect)"
    );
}

#[test]
fn a_second_urgent_byte_replaces_an_untaken_first() {
    // Ranks 0 and 2 of 4 stop. Rank 3 queries both, finds both silent, names its suspect
    // (rank 2) and leaves rank 0 a notice, which replaces the query rank 0 never took: the
    // query becomes a stream byte.
    let mut net = Net::ring(4, T, &[], ms(1));
    net.stop(0);
    net.stop(2);
    net.run(ms(5000));
    assert_eq!(net.verdict(3), Some(Verdict::Stalled(2)));
    let l = net.ends.iter().position(|&e| e == (3, 0)).unwrap();
    let to_zero = &net.dirs[l][0];
    assert_eq!(to_zero.lost, vec![Urgent::QUERY]);
    assert_eq!(
        to_zero.urgent.map(|(b, _)| Urgent::decode(b)),
        Some(Urgent::Notice(2))
    );
    // Rank 1 named rank 0 (its suspect) and so told rank 2, not rank 0.
    assert_eq!(net.verdict(1), Some(Verdict::Stalled(0)));
    let l = net.ends.iter().position(|&e| e == (0, 1)).unwrap();
    assert_eq!(
        net.dirs[l][1].urgent.map(|(b, _)| Urgent::decode(b)),
        Some(Urgent::Query)
    );
}
