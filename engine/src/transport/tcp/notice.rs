//! Failure notices and inquiries: what the TCP urgent bytes beside a group's streams say,
//! and the rules for acting on them, without I/O.
//!
//! When a rank gives up on a group it leaves a *failure notice* on its other connections:
//! one TCP urgent byte naming the rank that was lost (see [`Urgent::Notice`]). A rank that
//! is not next to the lost one can then name it, instead of the neighbour that closed.
//!
//! A rank whose collective times out does not guess whom to name: it asks its neighbours
//! whether they are alive with another urgent byte, a query, and a neighbour still inside
//! its collective answers at once (the rule for the verdict is [`Inquiry`]). Only verified
//! verdicts go out as notices. Urgent bytes never enter the stream, so MLX peers, which
//! never read them, see the same bytes as before; they never answer either, so next to an
//! MLX rank a timeout names that rank.
//!
//! TCP keeps one urgent byte per direction: a second one sent before the receiver read
//! past the first one's position turns the first into a stream byte. Queries, answers and
//! notices are only sent once a collective has failed on the sending side (the answer to a
//! query included: the querier is failing), and the receiver reads them as soon as its
//! poller reports them, so a stray byte could only reach a stream whose sender has already
//! given up on it. A receiver that reads the stream past an urgent byte's position before
//! taking the byte loses it (the kernel drops it); delivery is best effort, and every rule
//! here holds when a byte is lost, only later or less precisely.
//!
//! - [`Notices`]: one connection's state (what its peer said, what this side owes it);
//! - [`Inquiry`]: one failing rank's verdict over all its neighbours;
//! - the socket work (reading the byte, sending it, the windows it waits) is the
//!   connections' ([`super::Connections::inquire`], [`super::Connections::abandon`]).

use std::time::{Duration, Instant};

use crate::comm::progress::notice_names;
use crate::options::deadline;

/// What one urgent byte on a connection says (see the module docs for how they travel).
///
/// The byte values: `0..=NOTICE_MAX` is a failure notice naming that rank; [`QUERY`] asks
/// "are you alive, and still in the collective?"; [`ALIVE`] is the answer. A rank above
/// `NOTICE_MAX` cannot be named in a notice: its neighbours still name it, the ranks
/// further away then name the neighbour that closed (as before notices existed).
///
/// [`QUERY`]: Urgent::QUERY
/// [`ALIVE`]: Urgent::ALIVE
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Urgent {
    /// The sender gave up on the ring after verifying that this rank was lost.
    Notice(usize),
    /// The sender's collective timed out; it asks whether this side is alive.
    Query,
    /// The sender is alive (an answer to a query).
    Alive,
}

impl Urgent {
    /// The byte of a query.
    pub(crate) const QUERY: u8 = 0xFF;
    /// The byte of an answer.
    pub(crate) const ALIVE: u8 = 0xFE;
    /// The highest rank a notice can name.
    pub(crate) const NOTICE_MAX: usize = 0xFD;

    /// The byte that says this.
    pub(crate) fn encode(self) -> Option<u8> {
        match self {
            Urgent::Notice(rank) if rank <= Self::NOTICE_MAX => u8::try_from(rank).ok(),
            Urgent::Notice(_) => None,
            Urgent::Query => Some(Self::QUERY),
            Urgent::Alive => Some(Self::ALIVE),
        }
    }

    /// What `byte` says.
    pub(crate) fn decode(byte: u8) -> Urgent {
        match byte {
            Self::QUERY => Urgent::Query,
            Self::ALIVE => Urgent::Alive,
            rank => Urgent::Notice(usize::from(rank)),
        }
    }
}

/// One connection's urgent-byte state: what the peer said beside the stream, and what this
/// side still has to send it. Sans-IO: the connection reads the bytes into
/// [`Notices::received`] and sends what [`Notices::poll_transmit`] offers, reporting each
/// attempt to [`Notices::handle_sent`].
#[derive(Clone, Debug)]
pub(crate) struct Notices {
    /// This rank and the group's size, to check that a notice names a third rank.
    me: usize,
    ranks: usize,
    /// The peer's rank.
    peer: usize,
    /// The rank named by the peer's failure notice, once one arrived.
    notice: Option<usize>,
    /// Whether the peer sent any urgent byte: its process ran after a collective failed
    /// somewhere, so it is not the stalled one.
    spoke: bool,
    /// Whether the peer answered a query: it was still inside its collective, which has
    /// not timed out yet.
    answered: bool,
    /// Whether the peer asked and is owed an answer.
    owe_answer: bool,
    /// Whether this side still answers queries: not once it sends urgent bytes of its own.
    answering: bool,
    /// Whether this side's query is still to be sent (it waits for room).
    query_pending: bool,
    /// The notice this side still has to send, once it gave up on the group.
    notice_pending: Option<usize>,
}

/// What became of one attempt to send an urgent byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sent {
    /// It went out, or failed for good (the connection is gone): it is not sent again.
    Done,
    /// The send buffer had no room: it is offered again.
    NoRoom,
}

impl Notices {
    /// The state of rank `me`'s connection (of a group of `ranks`) to `peer`, which has
    /// said nothing yet.
    pub(crate) fn new(me: usize, ranks: usize, peer: usize) -> Notices {
        Notices {
            me,
            ranks,
            peer,
            notice: None,
            spoke: false,
            answered: false,
            owe_answer: false,
            answering: true,
            query_pending: false,
            notice_pending: None,
        }
    }

    /// The peer's rank.
    pub(crate) fn peer(&self) -> usize {
        self.peer
    }

    /// The rank the peer's failure notice named, if one arrived.
    pub(crate) fn notice(&self) -> Option<usize> {
        self.notice
    }

    /// Whether the peer sent any urgent byte (it ran after a failure began).
    pub(crate) fn spoke(&self) -> bool {
        self.spoke
    }

    /// Whether the peer answered a query (an [`Urgent::Alive`]): it was inside a
    /// collective that had not timed out.
    pub(crate) fn answered(&self) -> bool {
        self.answered
    }

    /// Whether a notice from the peer can name a third rank: with two ranks it could only
    /// name this one or the peer, whom a failure names anyway.
    pub(crate) fn names_third_ranks(&self) -> bool {
        self.ranks > 2
    }

    /// Whether another urgent byte from the peer still matters: not once it gave up with a
    /// notice (nothing it sends after that does).
    pub(crate) fn listening(&self) -> bool {
        self.notice.is_none()
    }

    /// The peer sent the urgent byte `byte`: keeps a notice, owes an answer to a query.
    pub(crate) fn received(&mut self, byte: u8) {
        self.spoke = true;
        if self.notice.is_some() {
            return;
        }
        match Urgent::decode(byte) {
            Urgent::Notice(lost) => {
                self.notice = notice_names(lost, self.peer, self.me, self.ranks);
            }
            Urgent::Query => self.owe_answer = true,
            Urgent::Alive => self.answered = true,
        }
    }

    /// The urgent byte to send now, if any: this side's notice, then its query, then the
    /// answer a query is owed (while this side still answers).
    pub(crate) fn poll_transmit(&self) -> Option<Urgent> {
        if let Some(lost) = self.notice_pending {
            return Some(Urgent::Notice(lost));
        }
        if self.query_pending {
            return Some(Urgent::Query);
        }
        (self.owe_answer && self.answering).then_some(Urgent::Alive)
    }

    /// Records what became of sending `what` (which [`Notices::poll_transmit`] offered).
    pub(crate) fn handle_sent(&mut self, what: Urgent, sent: Sent) {
        if sent == Sent::NoRoom {
            return;
        }
        match what {
            Urgent::Notice(_) => self.notice_pending = None,
            Urgent::Query => self.query_pending = false,
            Urgent::Alive => self.owe_answer = false,
        }
    }

    /// This side's collective timed out: it asks the peer (and answers no more: its own
    /// query tells the peer that it is alive, including a peer that waits on it without
    /// having asked yet).
    pub(crate) fn start_inquiry(&mut self) {
        self.answering = false;
        self.owe_answer = false;
        self.query_pending = true;
    }

    /// This side gives up on the group after losing rank `lost`: it sends the peer a
    /// notice naming `lost` if there is one, the peer is not the lost rank, and a notice
    /// can name it; it neither asks nor answers any more. Returns whether a notice is to
    /// go out.
    pub(crate) fn abandon(&mut self, lost: Option<usize>) -> bool {
        self.answering = false;
        self.owe_answer = false;
        self.query_pending = false;
        self.notice_pending = lost
            .filter(|&l| l != self.peer)
            .filter(|&l| Urgent::Notice(l).encode().is_some());
        self.notice_pending.is_some()
    }

    /// Whether this side's notice is still to go out.
    pub(crate) fn notice_pending(&self) -> bool {
        self.notice_pending.is_some()
    }
}

/// What a rank whose collective timed out concludes (see [`Inquiry`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The neighbour `0` stayed silent through the grace period while the others answered
    /// or there were none: it is stalled. Verified; worth a notice.
    Stalled(usize),
    /// The neighbour `0` closed its connection without ever answering or leaving a notice:
    /// it died. Verified.
    Closed(usize),
    /// Neighbour `via` verified that rank `lost` was lost and said so.
    Lost {
        /// The lost rank.
        lost: usize,
        /// The neighbour that said so.
        via: usize,
    },
    /// Every neighbour answered and no notice came before patience ran out: the stalled
    /// rank is further away and nobody next to it told. `0` is this rank's suspect, a
    /// guess that must not be announced.
    Guess(usize),
}

/// What a neighbour has shown since the inquiry began (or before: any urgent byte proves
/// that its process ran after the failure began, as none is sent otherwise).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Heard {
    rank: usize,
    alive: bool,
    closed: bool,
    /// Whether it answered a query: it was then inside a collective that had not timed
    /// out (patience was extended at the first answer).
    answered: bool,
}

/// Whom a rank whose collective timed out names: a sans-IO state machine, fed what the
/// sockets show, asked for a [`Verdict`].
///
/// # Why
///
/// When one rank stalls (SIGSTOP, swapped out, stuck in other code) every rank waiting on
/// it, directly or through others, times out at about the same moment. Timing alone cannot
/// tell a stalled neighbour from one that waits on a stalled rank further on, and the
/// stalled rank's kernel keeps acknowledging, so TCP shows nothing either. So a suspicion
/// is never announced. Instead the rank asks its neighbours (a [`Urgent::Query`] byte
/// beside the stream); a live neighbour answers at once from its own collective loop, or
/// asks back when its own collective times out, which says as much. Then:
///
/// - a notice from a neighbour (which it sends only for a verified verdict) names the
///   lost rank, unless it names a neighbour this rank heard alive;
/// - a neighbour that closed without a word (no answer, no notice) died;
/// - past the grace period, a neighbour that stayed silent is stalled: its own kernel
///   holds our query, its process cannot answer;
/// - if every neighbour answered, the stalled rank is further away: wait (up to
///   `patience`) for the notice of a rank next to it, which the neighbours pass on;
/// - past patience, name the suspect timing chose, but as a guess only.
///
/// Patience is twice the grace when the neighbours asked back (their collectives timed out
/// with this one's). A neighbour that *answered* was still inside a collective that had
/// not timed out: it entered later, or moved later. It times out at most a timeout after
/// its answer and then needs its own grace, so patience lasts until then, plus a grace
/// for scheduling. Without that, a neighbour that entered the collective a grace later
/// than this rank (a busy host, a slow thread start) made this rank guess before the
/// neighbour's verified notice could come.
///
/// Only the first three are verified and announced; so a notice, once sent, is right,
/// and the ranks next to the stalled one always name it. The grace must be longer than the
/// spread of the ranks' timeouts (they all stop moving within milliseconds of the stall),
/// and shorter than what the caller allows beyond the timeout.
#[derive(Debug)]
pub(crate) struct Inquiry {
    me: usize,
    size: usize,
    suspect: usize,
    heard: Vec<Heard>,
    notice: Option<(usize, usize)>,
    timeout: Duration,
    grace_until: Instant,
    patience_until: Instant,
}

impl Inquiry {
    /// How long a neighbour may stay silent before it is found stalled: a quarter of the
    /// timeout, at most 500 ms.
    pub(crate) fn grace(timeout: Duration) -> Duration {
        (timeout / 4).min(Duration::from_millis(500))
    }

    /// How long a rank whose driver cannot report urgent bytes as they arrive (io_uring,
    /// kqueue) waits before it looks for them, so that it answers a query well within the
    /// grace its sender gives (see `Connections::look_for_urgent`): a quarter of the grace,
    /// from 1 ms to 10 ms. A look is one `recv(2)` per connection, made only by a rank that
    /// has waited this long, so it costs nothing a collective that moves would notice.
    pub(crate) fn answer_within(timeout: Duration) -> Duration {
        (Self::grace(timeout) / 4).clamp(Duration::from_millis(1), Duration::from_millis(10))
    }

    /// Starts an inquiry at `now` by rank `me` of `size`, which waited on `neighbours`
    /// (ranks; duplicates are ignored) and suspects `suspect` (one of them) by timing.
    pub(crate) fn new(
        me: usize,
        size: usize,
        neighbours: impl IntoIterator<Item = usize>,
        suspect: usize,
        now: Instant,
        timeout: Duration,
    ) -> Inquiry {
        let mut heard: Vec<Heard> = Vec::new();
        for rank in neighbours.into_iter().chain([suspect]) {
            if rank != me && !heard.iter().any(|h| h.rank == rank) {
                heard.push(Heard {
                    rank,
                    alive: false,
                    closed: false,
                    answered: false,
                });
            }
        }
        let grace = Self::grace(timeout);
        Inquiry {
            me,
            size,
            suspect,
            heard,
            notice: None,
            timeout,
            grace_until: now + grace,
            patience_until: now + 2 * grace,
        }
    }

    fn entry(&mut self, rank: usize) -> Option<&mut Heard> {
        self.heard.iter_mut().find(|h| h.rank == rank)
    }

    /// Neighbour `from` sent the urgent byte `what`, seen at `now`.
    pub(crate) fn urgent(&mut self, from: usize, what: Urgent, now: Instant) {
        let (timeout, grace) = (self.timeout, Self::grace(self.timeout));
        if let Some(h) = self.entry(from) {
            h.alive = true;
            if what == Urgent::Alive && !h.answered {
                h.answered = true;
                // Its collective times out by `now + timeout`; its verdict takes a grace
                // more; one more grace covers scheduling.
                let until = deadline(now, timeout.saturating_add(2 * grace));
                self.patience_until = self.patience_until.max(until);
            }
        }
        if let Urgent::Notice(lost) = what
            && self.notice.is_none()
            && let Some(lost) = notice_names(lost, from, self.me, self.size)
        {
            self.notice = Some((lost, from));
        }
    }

    /// Feeds what one connection shows at `now`: its peer's urgent bytes (as [`Notices`]
    /// keeps them) and whether it closed.
    pub(crate) fn hear(&mut self, notices: &Notices, closed: bool, now: Instant) {
        if notices.answered() {
            self.urgent(notices.peer(), Urgent::Alive, now);
        } else if notices.spoke() {
            self.urgent(notices.peer(), Urgent::Query, now);
        }
        if let Some(lost) = notices.notice() {
            self.urgent(notices.peer(), Urgent::Notice(lost), now);
        }
        if closed {
            self.closed(notices.peer());
        }
    }

    /// Neighbour `from` closed (or reset) its connection.
    pub(crate) fn closed(&mut self, from: usize) {
        if let Some(h) = self.entry(from) {
            h.closed = true;
        }
    }

    /// The verdict at `now`, or `None` while it is too early to give one.
    pub(crate) fn verdict(&self, now: Instant) -> Option<Verdict> {
        if let Some((lost, via)) = self.notice {
            // A notice naming a rank this rank heard alive is proven wrong; ignore it.
            let contradicted = self.heard.iter().any(|h| h.rank == lost && h.alive);
            if !contradicted {
                return Some(Verdict::Lost { lost, via });
            }
        }
        // A neighbour that spoke and then closed gave up (its notice may not have got
        // through); one that closed without a word died.
        if let Some(h) = self.heard.iter().find(|h| h.closed && !h.alive) {
            return Some(Verdict::Closed(h.rank));
        }
        if now >= self.grace_until {
            let silent = |h: &&Heard| !h.alive && !h.closed;
            let stalled = self
                .heard
                .iter()
                .filter(silent)
                .find(|h| h.rank == self.suspect)
                .or_else(|| self.heard.iter().find(silent));
            if let Some(h) = stalled {
                return Some(Verdict::Stalled(h.rank));
            }
        }
        (now >= self.patience_until).then_some(Verdict::Guess(self.suspect))
    }

    /// When [`Inquiry::verdict`] may next change without anything being heard.
    pub(crate) fn next_deadline(&self, now: Instant) -> Instant {
        if now < self.grace_until {
            self.grace_until
        } else {
            self.patience_until
        }
    }
}

#[cfg(test)]
mod tests;
