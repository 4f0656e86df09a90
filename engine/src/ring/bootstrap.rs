//! Forming the ring: listen on our addresses, connect to the right neighbour's, accept the
//! left neighbour's connections, all at once on one poller.
//!
//! MLX forms the ring as a chain: ranks below `P-1` accept first and then connect; rank
//! `P-1` connects first. Its acceptor binds one address at a time and accepts exactly one
//! connection on each before binding the next, and its connector retries a refused
//! connection after 1, 2, 4, 8 and 16 s. A rank that listens on all its addresses at once
//! and connects concurrently, retrying refusals quickly until the deadline, fits into that
//! chain in any position, next to MLX ranks or ours, so that is what this does.
//!
//! Without a key no bytes are exchanged: connection `i` pairs our `i`-th connection to the
//! right neighbour with its `i`-th listening address, and whoever connects to our address
//! `i` first is taken as the left neighbour's connection `i`, as in MLX. One difference: the
//! address stays open until the ring has formed, and a connection that has already been
//! closed by then (a port scanner) is passed over for the next one, so probing a forming
//! ring's ports does not break it. A stranger that connects first and stays connected is
//! still taken for the neighbour; only a key keeps strangers out.
//!
//! With a key (see [`crate::auth`]) every connection first runs the challenge-response.
//! The listener then stays open until an authenticated connection for its address
//! arrives: a client that fails the handshake (wrong key, no key, garbage, a scanner that
//! connects and closes) is dropped and remembered for the error message, so it can neither
//! join the ring nor keep the real neighbour out. One exception: a client that answers our
//! greeting with [`auth::NO_KEY`] is a rank of this program without the key, and setup
//! fails at once naming it, instead of at the timeout. Someone who can reach a forming
//! ring's port can therefore abort it by sending those 9 bytes (they cannot join it).
//!
//! This module decides only when to dial, accept, retry, choose and give up. The
//! handshake's bytes and checks are [`crate::auth`]'s machines, which [`pump`] feeds from
//! the sockets; the sockets and their options are [`crate::transport::tcp::socket`]'s.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Poll};

use crate::auth::{self, Handshake, Key, Link, Outcome};
use crate::config::hostfile::RingAddresses;
use crate::error::{Error, PeerOp, Phase, Result};
use crate::options::Options;
use crate::transport::tcp::Connections;
use crate::transport::tcp::bootstrap::{self, FIRST_RETRY, Formation, next_backoff, pump};
use crate::transport::tcp::socket::{self as tcp, SocketTuning};
use crate::verbose::verbose;

const CONTEXT: Phase = Phase::RingSetup;

/// How long an accepted connection must have been up before it may be taken, without a key.
const SETTLE: Duration = Duration::from_millis(20);

/// Forms this rank's part of the ring within `options.timeout`.
pub(crate) fn connect(addrs: &RingAddresses, options: &Options) -> Result<Connections> {
    let key = bootstrap::prepare(options)?;
    let rank = addrs.rank;
    verbose!(
        rank,
        "forming a ring of {} ({} connection(s) per neighbour{}): listening on {:?}, connecting to rank {} at {:?}",
        addrs.size,
        addrs.listen.len(),
        if key.is_some() { ", authenticated" } else { "" },
        addrs.listen,
        addrs.right_rank(),
        addrs.right
    );
    let started = Instant::now();
    let shape = (rank, addrs.size, addrs.listen.len());
    let result = bootstrap::finish(options, shape, started, |tuning| {
        Setup::new(addrs, tuning, key)
    });
    match &result {
        Ok(_) => verbose!(info: rank, "ring formed in {:?}", started.elapsed()),
        Err(e) => verbose!(
            warn: rank,
            "forming the ring failed after {:?}: {e}",
            started.elapsed()
        ),
    }
    result
}

/// One outgoing connection to the right neighbour.
enum Dial {
    /// Waiting to (re)try at the instant.
    Idle(Instant),
    /// A non-blocking connect in flight.
    Connecting(TcpStream),
    /// Connected; running the connector's side of the handshake.
    Handshake(TcpStream, Box<auth::Connector>),
    /// Ready for the ring.
    Up(TcpStream),
    /// The neighbour answered but authentication failed; retrying cannot help.
    Refused(auth::Fault, String),
}

/// An accepted connection not yet taken into the ring.
struct Candidate {
    stream: TcpStream,
    /// When it was accepted.
    arrived: Instant,
    /// The listening address (connection index) it arrived on.
    slot: usize,
    from: SocketAddr,
    acceptor: auth::Acceptor,
}

/// What to do with an accepted connection, without a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Choice {
    /// Leave it: too fresh to judge, behind an earlier one, or its address is taken.
    Wait,
    /// It is the left neighbour's connection for its address.
    Take,
    /// Its client already left (a port scanner): pass over it.
    Drop,
}

/// MLX's rule without a key, made robust to port scanners: for each address, the first
/// connection to arrive that is still open. `candidates` are in order of arrival, each with
/// its address and age (`None` if already handled); `taken` says which addresses have their
/// connection, and is updated. A connection is judged only once it has been up for
/// [`SETTLE`], so that a scanner's close has time to arrive; until the first one of an
/// address is judged, later ones on it wait. `closed` looks at candidate `id`'s socket and
/// is asked only for the connections judged.
fn choose_unkeyed(
    candidates: &[Option<(usize, Duration)>],
    taken: &mut [bool],
    mut closed: impl FnMut(usize) -> bool,
) -> Vec<Choice> {
    let mut waiting = vec![false; taken.len()];
    let mut choices = vec![Choice::Wait; candidates.len()];
    for (id, candidate) in candidates.iter().enumerate() {
        let Some(&(slot, age)) = candidate.as_ref() else {
            continue;
        };
        let (Some(is_taken), Some(is_waiting)) = (taken.get(slot), waiting.get_mut(slot)) else {
            continue;
        };
        if *is_taken || *is_waiting {
            continue;
        }
        if age < SETTLE {
            *is_waiting = true;
            continue;
        }
        if closed(id) {
            choices[id] = Choice::Drop;
        } else {
            choices[id] = Choice::Take;
            taken[slot] = true;
        }
    }
    choices
}

/// How an outgoing connection stands at the deadline.
#[derive(Debug)]
enum DialView<'a> {
    Up,
    /// Connected, handshake unfinished.
    Handshaking,
    Refused(auth::Fault, &'a str),
    /// Not connected; why the last try failed, if one did.
    Down(Option<io::Error>),
}

/// Why a ring did not form by the deadline: the connection we could not open (naming the
/// right neighbour and why), else the one that never arrived (naming the left neighbour, or
/// the rank a rejected client claimed to be, and why). `filled[i]` says whether our address
/// `i` has its connection; `rejected[i]` is the last client turned away there.
fn timed_out(
    addrs: &RingAddresses,
    dials: Vec<DialView<'_>>,
    filled: &[bool],
    mut rejected: Vec<Option<Turned>>,
    timeout: Duration,
) -> Error {
    let (left, right) = (addrs.left_rank(), addrs.right_rank());
    for (i, dial) in dials.into_iter().enumerate() {
        let addr = addrs.right.get(i).copied();
        let auth = |reason: String| Error::Auth {
            peer: right,
            addr,
            context: CONTEXT,
            reason,
        };
        return match dial {
            DialView::Up => continue,
            DialView::Refused(fault, reason) => refusal(fault, right, addr, reason.to_string()),
            DialView::Handshaking => auth(format!(
                "it did not answer the handshake within {timeout:?} (is the key set on every \
                 rank?)"
            )),
            DialView::Down(Some(e)) => Error::Io {
                peer: right,
                addr,
                op: PeerOp::Connect,
                context: CONTEXT,
                source: e.into(),
            },
            DialView::Down(None) => Error::Timeout {
                peer: right,
                addr,
                op: PeerOp::Connect,
                context: CONTEXT,
                after: timeout,
            },
        };
    }
    let i = filled.iter().position(|f| !f).unwrap_or(0);
    let listen = addrs.listen.get(i).copied();
    match rejected.get_mut(i).and_then(Option::take) {
        Some((claimed, from, fault, reason)) => refusal(
            fault,
            claimed,
            Some(from),
            match listen {
                Some(at) => {
                    format!("{reason}; no authenticated connection reached {at} within {timeout:?}")
                }
                None => reason,
            },
        ),
        // Beside the peer's rank its own address, as in every error; not the address of
        // this rank's that it did not reach.
        None => Error::Timeout {
            peer: left,
            addr: addrs.resolved(left, i),
            op: PeerOp::Accept,
            context: CONTEXT,
            after: timeout,
        },
    }
}

/// The error for a handshake with `peer` that failed with `fault`: a peer without a key
/// next to this keyed rank is a configuration that does not match
/// ([`Error::PeerIncompatible`]), anything else a failed authentication.
fn refusal(fault: auth::Fault, peer: usize, addr: Option<SocketAddr>, reason: String) -> Error {
    match fault {
        auth::Fault::NoKey | auth::Fault::Incompatible => Error::PeerIncompatible {
            peer,
            addr,
            context: CONTEXT,
            reason,
        },
        auth::Fault::Peer | auth::Fault::Keys => Error::Auth {
            peer,
            addr,
            context: CONTEXT,
            reason,
        },
    }
}

/// The last client turned away on an address: the rank it claimed (or the one expected),
/// where it came from, whose fault, and why.
type Turned = (usize, SocketAddr, auth::Fault, String);

struct Setup<'a> {
    addrs: &'a RingAddresses,
    tuning: SocketTuning,
    key: Option<Key>,
    poll: Poll,
    events: Events,
    listeners: Vec<Option<TcpListener>>,
    dials: Vec<Dial>,
    backoff: Vec<Duration>,
    /// Why each outgoing connection last failed, for the error at the deadline.
    dial_failures: Vec<Option<io::Error>>,
    /// Accepted connections under handshake, by id (token - CANDIDATE_BASE).
    candidates: Vec<Option<Candidate>>,
    /// The left neighbour's connections, by index, once taken.
    slots: Vec<Option<TcpStream>>,
    /// Why clients on each of our addresses were turned away, for the error at the deadline.
    rejected: Vec<Option<Turned>>,
    /// A client that said it has no key ([`auth::NO_KEY`]): setup fails at once.
    said_no_key: Option<Turned>,
}

impl<'a> Setup<'a> {
    fn new(addrs: &'a RingAddresses, tuning: SocketTuning, key: Option<Key>) -> Result<Self> {
        let (poll, listeners) = bootstrap::listen(addrs, &tuning, "the ring's")?;
        let now = Instant::now();
        let c = addrs.listen.len();
        Ok(Setup {
            addrs,
            tuning,
            key,
            poll,
            events: Events::with_capacity(64),
            listeners: listeners.into_iter().map(Some).collect(),
            dials: (0..c).map(|_| Dial::Idle(now)).collect(),
            backoff: vec![FIRST_RETRY; c],
            dial_failures: (0..c).map(|_| None).collect(),
            candidates: Vec::new(),
            slots: (0..c).map(|_| None).collect(),
            rejected: (0..c).map(|_| None).collect(),
            said_no_key: None,
        })
    }

    /// What the ring still waits for, for a report: each connection to the right
    /// neighbour that is not up, and each of our addresses the left neighbour has not
    /// connected to yet, with the peer's rank and address.
    fn waiting_for(&self) -> String {
        let (left, right) = (self.addrs.left_rank(), self.addrs.right_rank());
        let mut missing = Vec::new();
        for (i, dial) in self.dials.iter().enumerate() {
            let at = self.addrs.right[i];
            let why = match dial {
                Dial::Up(_) => continue,
                Dial::Idle(_) | Dial::Connecting(_) => match &self.dial_failures[i] {
                    Some(e) => format!("its last try failed: {e}"),
                    None => "connecting".to_string(),
                },
                Dial::Handshake(..) => "connected, in the handshake".to_string(),
                Dial::Refused(_, reason) => format!("refused: {reason}"),
            };
            missing.push(format!(
                "rank {right} to accept connection {i} at {at} ({why})"
            ));
        }
        for (i, slot) in self.slots.iter().enumerate() {
            let arrived = self.candidates.iter().flatten().any(|c| c.slot == i);
            // Without a key an arrived connection is only taken once this rank's own are up
            // (see `formed`): it is not missing.
            if slot.is_some() || (arrived && self.key.is_none()) {
                continue;
            }
            if arrived {
                missing.push(format!(
                    "rank {left}'s connection to this rank's {} to finish the handshake",
                    self.addrs.listen[i]
                ));
                continue;
            }
            let mut line = format!(
                "rank {left} ({}) to connect to this rank's {}",
                self.addrs.written(left, i).unwrap_or("its address"),
                self.addrs.listen[i]
            );
            if let Some((claimed, from, _, why)) = &self.rejected[i] {
                line += &format!(" (turned away rank {claimed}'s client from {from}: {why})");
            }
            missing.push(line);
        }
        missing.join("; ")
    }

    fn formed(&mut self) -> bool {
        if !self.dials.iter().all(|d| matches!(d, Dial::Up(_))) {
            return false;
        }
        if self.key.is_none() {
            self.take_unkeyed();
        }
        self.slots.iter().all(Option::is_some)
    }

    /// Without a key, takes for each address the connection [`choose_unkeyed`] picks and
    /// closes the address; drops the ones whose clients already left.
    fn take_unkeyed(&mut self) {
        let now = Instant::now();
        let seen: Vec<_> = self
            .candidates
            .iter()
            .map(|c| {
                c.as_ref()
                    .map(|c| (c.slot, now.saturating_duration_since(c.arrived)))
            })
            .collect();
        let mut taken: Vec<bool> = self.slots.iter().map(Option::is_some).collect();
        let candidates = &self.candidates;
        let choices = choose_unkeyed(&seen, &mut taken, |id| {
            candidates[id]
                .as_ref()
                .is_some_and(|c| tcp::closed_by_peer(&c.stream))
        });
        for (id, choice) in choices.into_iter().enumerate() {
            if choice == Choice::Wait {
                continue;
            }
            if let Some(mut c) = self.candidates[id].take() {
                let _ = self.poll.registry().deregister(&mut c.stream);
                if choice == Choice::Take {
                    self.slots[c.slot] = Some(c.stream);
                    self.close_listener(c.slot);
                }
            }
        }
    }

    /// The authentication error to fail with, once a neighbour refused us and every one of
    /// our addresses has either a connection or a rejected client. Waiting that long (not
    /// failing at once) lets the left neighbour's handshake with us run, so that it, too,
    /// learns that the keys differ instead of finding our port closed.
    fn refused(&self) -> Option<Error> {
        if let Some((claimed, from, fault, why)) = &self.said_no_key {
            return Some(refusal(*fault, *claimed, Some(*from), why.clone()));
        }
        let i = self
            .dials
            .iter()
            .position(|d| matches!(d, Dial::Refused(..)))?;
        let settled =
            (0..self.slots.len()).all(|s| self.slots[s].is_some() || self.rejected[s].is_some());
        let Dial::Refused(fault, reason) = &self.dials[i] else {
            return None;
        };
        // A peer on the native wire answered: no other connection can tell more, and it
        // may already have left, so its own address would never settle.
        if !settled && *fault != auth::Fault::Incompatible {
            return None;
        }
        // A peer without a key that finds our greeting leaves, and this rank may see that
        // on one connection as a bare close; the connection where it said, or showed, that
        // it has no key is the better diagnosis.
        let no_key = self
            .rejected
            .iter()
            .flatten()
            .find(|(_, _, fault, _)| *fault == auth::Fault::NoKey);
        Some(match no_key {
            Some((claimed, from, _, why)) if *fault != auth::Fault::NoKey => {
                refusal(auth::Fault::NoKey, *claimed, Some(*from), why.clone())
            }
            _ => refusal(
                *fault,
                self.addrs.right_rank(),
                Some(self.addrs.right[i]),
                reason.clone(),
            ),
        })
    }

    /// When the setup loop must look again without an event: a connection to retry, or an
    /// unkeyed candidate whose settling time ends.
    fn next_retry(&self) -> Option<Instant> {
        let retries = self.dials.iter().filter_map(|d| match d {
            Dial::Idle(at) => Some(*at),
            _ => None,
        });
        let settling = self.candidates.iter().flatten().map(|c| c.arrived + SETTLE);
        retries.chain(settling.filter(|_| self.key.is_none())).min()
    }

    /// Starts the outgoing connections whose retry time has come.
    fn start_due_dials(&mut self) -> Result<()> {
        let now = Instant::now();
        for i in 0..self.dials.len() {
            if !matches!(self.dials[i], Dial::Idle(at) if at <= now) {
                continue;
            }
            match bootstrap::dial(&self.poll, &self.tuning, i, self.addrs.right[i])? {
                Ok(stream) => self.dials[i] = Dial::Connecting(stream),
                Err(e) => self.retry(i, e),
            }
        }
        Ok(())
    }

    /// Drops outgoing connection `i` and schedules another attempt.
    fn retry(&mut self, i: usize, why: io::Error) {
        let old = std::mem::replace(
            &mut self.dials[i],
            Dial::Idle(Instant::now() + self.backoff[i]),
        );
        if let Dial::Connecting(mut s) | Dial::Handshake(mut s, _) = old {
            let _ = self.poll.registry().deregister(&mut s);
        }
        self.backoff[i] = next_backoff(self.backoff[i]);
        verbose!(
            self.addrs.rank,
            "connection {i} to {} failed ({why}); retrying",
            self.addrs.right[i]
        );
        self.dial_failures[i] = Some(why);
    }

    /// Moves outgoing connection `i` on: from connecting to the handshake (at once, as the
    /// socket is writable then), and through the handshake to up or refused.
    fn progress_dial(&mut self, i: usize) -> Result<()> {
        if let Dial::Connecting(stream) = &self.dials[i] {
            match tcp::dial_outcome(stream) {
                Ok(false) => return Ok(()),
                Ok(true) => {
                    let link = Link {
                        size: self.addrs.size,
                        connector: self.addrs.rank,
                        acceptor: self.addrs.right_rank(),
                        index: i,
                    };
                    let hs = auth::Connector::new(self.key, link)?;
                    if let Dial::Connecting(s) =
                        std::mem::replace(&mut self.dials[i], Dial::Idle(Instant::now()))
                    {
                        self.dials[i] = Dial::Handshake(s, Box::new(hs));
                    }
                }
                Err(e) => {
                    self.retry(i, e);
                    return Ok(());
                }
            }
        }
        let Dial::Handshake(stream, hs) = &mut self.dials[i] else {
            return Ok(());
        };
        if let Err(e) = pump(stream, &mut **hs) {
            self.retry(i, e);
            return Ok(());
        }
        let next = match hs.outcome() {
            Outcome::Pending => return Ok(()),
            Outcome::Established => None,
            Outcome::Rejected(r) => {
                verbose!(
                    self.addrs.rank,
                    "connection {i} to {}: handshake failed ({}): {}",
                    self.addrs.right[i],
                    r.fault,
                    r.reason
                );
                Some((r.fault, r.reason.clone()))
            }
        };
        match (
            std::mem::replace(&mut self.dials[i], Dial::Idle(Instant::now())),
            next,
        ) {
            (Dial::Handshake(s, _), None) => self.dials[i] = Dial::Up(s),
            // An authentication failure is final: the peer answered, and retrying cannot
            // change its key.
            (Dial::Handshake(mut s, _), Some((fault, reason))) => {
                let _ = self.poll.registry().deregister(&mut s);
                self.dials[i] = Dial::Refused(fault, reason);
            }
            (other, _) => self.dials[i] = other,
        }
        Ok(())
    }

    /// Takes what the listener for address `slot` has to offer.
    fn accept(&mut self, slot: usize) -> Result<()> {
        loop {
            let Some(listener) = self.listeners[slot].as_mut() else {
                return Ok(());
            };
            let at = (slot, self.addrs.listen[slot]);
            let Some((mut stream, from)) = bootstrap::accept(listener, self.addrs.rank, at)? else {
                return Ok(());
            };
            let id = self.candidates.len();
            bootstrap::register_candidate(&self.poll, &mut stream, id)?;
            let expect = Link {
                size: self.addrs.size,
                connector: self.addrs.left_rank(),
                acceptor: self.addrs.rank,
                index: slot,
            };
            self.candidates.push(Some(Candidate {
                stream,
                arrived: Instant::now(),
                slot,
                from,
                acceptor: auth::Acceptor::new(self.key, expect)?,
            }));
            self.progress_candidate(id)?;
        }
    }

    fn close_listener(&mut self, slot: usize) {
        if let Some(mut l) = self.listeners[slot].take() {
            let _ = self.poll.registry().deregister(&mut l);
        }
    }

    /// Moves an accepted connection's handshake on; takes it for its address once the
    /// client proved the key, or turns it away. Without a key nothing is exchanged, and
    /// [`Setup::take_unkeyed`] chooses.
    fn progress_candidate(&mut self, id: usize) -> Result<()> {
        if self.key.is_none() {
            return Ok(());
        }
        let Some(Some(candidate)) = self.candidates.get_mut(id) else {
            return Ok(());
        };
        if pump(&mut candidate.stream, &mut candidate.acceptor).is_err() {
            // Any failure to read or write is the client leaving.
            candidate.acceptor.handle_closed();
        }
        match candidate.acceptor.outcome() {
            Outcome::Pending => Ok(()),
            Outcome::Established => {
                if let Some(mut c) = self.candidates[id].take() {
                    let _ = self.poll.registry().deregister(&mut c.stream);
                    if self.slots[c.slot].is_none() {
                        self.slots[c.slot] = Some(c.stream);
                        self.close_listener(c.slot);
                    }
                }
                Ok(())
            }
            Outcome::Rejected(rejection) => {
                let rejection = rejection.clone();
                if let Some(mut c) = self.candidates[id].take() {
                    let _ = self.poll.registry().deregister(&mut c.stream);
                    verbose!(
                        self.addrs.rank,
                        "turned away a client from {} on {} ({}): {}",
                        c.from,
                        self.addrs.listen[c.slot],
                        rejection.fault,
                        rejection.reason
                    );
                    let turned = (
                        rejection.claimed.unwrap_or(self.addrs.left_rank()),
                        c.from,
                        rejection.fault,
                        rejection.reason,
                    );
                    // A native-wire rank's hello is as sure a sign as a rank saying it has no
                    // key: no other client will come for this address.
                    if rejection.said_no_key || rejection.fault == auth::Fault::Incompatible {
                        self.said_no_key = Some(turned.clone());
                    }
                    self.rejected[c.slot] = Some(turned);
                }
                Ok(())
            }
        }
    }

    /// Hands the formed connections to a transport.
    fn hand_over(mut self) -> Result<Connections> {
        let (left, right) = (self.addrs.left_rank(), self.addrs.right_rank());
        for mut c in self.candidates.drain(..).flatten() {
            let _ = self.poll.registry().deregister(&mut c.stream);
        }
        // Errors show a connection's address beside the peer's rank: for one that arrived
        // here, the left neighbour's own (as the hostfile gives it), not this rank's.
        let left_addr = self.addrs.first_address(left)?;
        let left_conns: Vec<_> = self
            .slots
            .drain(..)
            .filter_map(|stream| stream.map(|s| (s, left, left_addr)))
            .collect();
        let mut right_conns = Vec::with_capacity(self.dials.len());
        for (dial, &addr) in self.dials.drain(..).zip(&self.addrs.right) {
            if let Dial::Up(mut stream) = dial {
                self.poll
                    .registry()
                    .deregister(&mut stream)
                    .map_err(|e| Error::local("re-registering a connection", e))?;
                right_conns.push((stream, right, addr));
            }
        }
        let mut transport = Connections::mesh(
            self.poll,
            self.addrs.rank,
            self.addrs.size,
            left_conns,
            right_conns,
            Vec::new(),
            &self.tuning.liveness,
        )
        .map_err(|e| Error::local("setting up the ring's connections", e))?;
        // A keyed peer's greeting may arrive after this point, so the check is made on the
        // first receive of each connection, not here.
        if self.key.is_none() {
            transport.check_first_bytes();
        }
        Ok(transport)
    }

    /// The error for a ring that did not form by the deadline (see [`timed_out`]).
    fn timed_out(mut self, timeout: Duration) -> Error {
        let dials = self
            .dials
            .iter()
            .zip(&mut self.dial_failures)
            .map(|(dial, failure)| match dial {
                Dial::Up(_) => DialView::Up,
                Dial::Handshake(..) => DialView::Handshaking,
                Dial::Refused(fault, reason) => DialView::Refused(*fault, reason),
                Dial::Idle(_) | Dial::Connecting(_) => DialView::Down(failure.take()),
            })
            .collect();
        let filled: Vec<bool> = self.slots.iter().map(Option::is_some).collect();
        timed_out(self.addrs, dials, &filled, self.rejected, timeout)
    }
}

impl Formation for Setup<'_> {
    type Formed = Connections;

    const WAITING: &'static str = "waiting to form the ring";

    fn poller(&mut self) -> (&mut Poll, &mut Events) {
        (&mut self.poll, &mut self.events)
    }

    fn start_due_dials(&mut self) -> Result<()> {
        Setup::start_due_dials(self)
    }

    fn settled(&mut self) -> Option<Result<()>> {
        if self.formed() {
            return Some(Ok(()));
        }
        self.refused().map(Err)
    }

    fn finish(self) -> Result<Connections> {
        self.hand_over()
    }

    fn report(&self, elapsed: Duration, timeout: Duration) {
        verbose!(
            info: self.addrs.rank,
            "still forming the ring after {elapsed:.1?} (the timeout is {timeout:?}); waiting for {}",
            self.waiting_for()
        );
    }

    fn give_up(self, timeout: Duration) -> Error {
        self.timed_out(timeout)
    }

    fn next_retry(&self) -> Option<Instant> {
        Setup::next_retry(self)
    }

    fn accept(&mut self, i: usize) -> Result<()> {
        Setup::accept(self, i)
    }

    fn progress_dial(&mut self, i: usize) -> Result<()> {
        Setup::progress_dial(self, i)
    }

    fn progress_candidate(&mut self, id: usize) -> Result<()> {
        Setup::progress_candidate(self, id)
    }

    fn connections(formed: &mut Connections) -> &mut Connections {
        formed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// `choose_unkeyed` over candidates given as (address, age, closed).
    fn choose(candidates: &[Option<(usize, Duration, bool)>], taken: &mut [bool]) -> Vec<Choice> {
        let seen: Vec<_> = candidates
            .iter()
            .map(|c| c.map(|(s, a, _)| (s, a)))
            .collect();
        choose_unkeyed(&seen, taken, |id| {
            let (_, age, closed) = candidates[id].expect("asked about a missing candidate");
            assert!(
                age >= SETTLE,
                "asked about candidate {id} before it settled"
            );
            closed
        })
    }

    #[test]
    fn unkeyed_takes_the_first_connection_still_open() {
        use Choice::*;
        let settled = 30 * MS;
        // A scanner that connected and left, then the neighbour.
        let mut taken = [false];
        let c = [Some((0, settled, true)), Some((0, settled, false))];
        assert_eq!(choose(&c, &mut taken), [Drop, Take]);
        assert_eq!(taken, [true]);
        // The first to arrive wins, even if a later one is open too.
        let mut taken = [false];
        let c = [Some((0, settled, false)), Some((0, settled, false))];
        assert_eq!(choose(&c, &mut taken), [Take, Wait]);
    }

    #[test]
    fn unkeyed_waits_for_the_first_arrival_to_settle() {
        use Choice::*;
        let mut taken = [false, false];
        let c = [
            Some((0, 5 * MS, false)),
            Some((0, 30 * MS, false)),
            Some((1, 30 * MS, false)),
        ];
        // Address 0 waits for its first client; address 1 does not wait for address 0.
        assert_eq!(choose(&c, &mut taken), [Wait, Wait, Take]);
        assert_eq!(taken, [false, true]);
    }

    #[test]
    fn unkeyed_leaves_taken_and_unknown_addresses_alone() {
        use Choice::*;
        let mut taken = [true];
        let c = [None, Some((0, 30 * MS, false)), Some((5, 30 * MS, false))];
        assert_eq!(choose(&c, &mut taken), [Wait, Wait, Wait]);
        assert_eq!(taken, [true]);
    }

    fn addrs() -> RingAddresses {
        let a = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
        RingAddresses {
            rank: 1,
            size: 3,
            listen: vec![a(5001), a(5002)],
            right: vec![a(6001), a(6002)],
            local_ranks: 3,
            all: [4001, 5001, 6001]
                .map(|p| vec![format!("127.0.0.1:{p}"), format!("127.0.0.1:{}", p + 1)])
                .to_vec(),
            ..RingAddresses::default()
        }
    }

    const TIMEOUT: Duration = Duration::from_secs(3);

    fn verdict(dials: Vec<DialView<'_>>, filled: &[bool], rejected: Option<&str>) -> Error {
        let from = SocketAddr::from(([127, 0, 0, 9], 40000));
        let rejected = vec![
            None,
            rejected.map(|r| (7, from, auth::Fault::Peer, r.to_string())),
        ];
        timed_out(&addrs(), dials, filled, rejected, TIMEOUT)
    }

    #[test]
    fn giving_up_names_the_right_neighbour_first() {
        let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
        let e = verdict(
            vec![DialView::Up, DialView::Down(Some(refused))],
            &[false, false],
            Some("ignored"),
        );
        assert!(
            matches!(&e, Error::Io { peer: 2, addr: Some(a), op: PeerOp::Connect, .. } if a.port() == 6002),
            "{e:?}"
        );
        let e = verdict(
            vec![DialView::Handshaking, DialView::Up],
            &[true, true],
            None,
        );
        assert!(
            matches!(&e, Error::Auth { peer: 2, reason, .. } if reason.contains("did not answer the handshake within 3s")),
            "{e:?}"
        );
        let e = verdict(
            vec![DialView::Refused(auth::Fault::Keys, "no"), DialView::Up],
            &[true, true],
            None,
        );
        assert!(
            matches!(&e, Error::Auth { peer: 2, reason, .. } if reason == "no"),
            "{e:?}"
        );
        let e = verdict(
            vec![DialView::Down(None), DialView::Up],
            &[true, true],
            None,
        );
        assert!(
            matches!(&e, Error::Timeout { peer: 2, op: PeerOp::Connect, after, .. } if *after == TIMEOUT),
            "{e:?}"
        );
    }

    #[test]
    fn giving_up_then_names_the_missing_left_connection() {
        let e = verdict(
            vec![DialView::Up, DialView::Up],
            &[true, false],
            Some("a client sent garbage"),
        );
        assert!(
            matches!(&e, Error::Auth { peer: 7, addr: Some(a), reason, .. }
                if a.port() == 40000
                    && reason.contains("a client sent garbage; no authenticated connection reached 127.0.0.1:5002")),
            "{e:?}"
        );
        // The left neighbour never connected to this rank's 5002: the error names it with
        // its own address (4002), never with this rank's.
        let e = verdict(vec![DialView::Up, DialView::Up], &[true, false], None);
        assert!(
            matches!(&e, Error::Timeout { peer: 0, addr: Some(a), op: PeerOp::Accept, .. } if a.port() == 4002),
            "{e:#?}"
        );
        assert_eq!(
            e.to_string(),
            "rank 0 (127.0.0.1:4002): did not connect to this rank within 3s during ring setup"
        );
    }

    /// Two loopback addresses nobody listens on.
    fn free_pair() -> [SocketAddr; 2] {
        let addrs = crate::loopback_ports::free_addrs(2);
        [addrs[0], addrs[1]]
    }

    fn ring_addrs(rank: usize, ports: [SocketAddr; 2]) -> RingAddresses {
        RingAddresses {
            rank,
            size: 2,
            listen: vec![ports[rank]],
            right: vec![ports[1 - rank]],
            local_ranks: 2,
            all: ports.iter().map(|p| vec![p.to_string()]).collect(),
            ..RingAddresses::default()
        }
    }

    fn start(
        rank: usize,
        ports: [SocketAddr; 2],
        secret: &'static str,
    ) -> std::thread::JoinHandle<Result<usize>> {
        std::thread::spawn(move || {
            let options = Options::default()
                .timeout(Duration::from_secs(10))
                .key(secret);
            connect(&ring_addrs(rank, ports), &options).map(|t| t.connections())
        })
    }

    #[test]
    fn a_keyed_pair_forms_over_loopback_past_a_garbage_client() {
        let ports = free_pair();
        let rank0 = start(0, ports, "a shared secret of enough length");
        // A client that gets to rank 0's address first and sends garbage, staying connected.
        let until = Instant::now() + Duration::from_secs(10);
        let mut stranger = loop {
            match std::net::TcpStream::connect(ports[0]) {
                Ok(s) => break s,
                Err(_) if Instant::now() < until => std::thread::sleep(MS),
                Err(e) => panic!("rank 0 never listened: {e}"),
            }
        };
        std::io::Write::write_all(&mut stranger, &[0x5A; 100]).unwrap();
        let rank1 = start(1, ports, "a shared secret of enough length");
        assert_eq!(rank0.join().unwrap().unwrap(), 1);
        assert_eq!(rank1.join().unwrap().unwrap(), 1);
        drop(stranger);
    }

    #[cfg(any(target_os = "linux", target_os = "freebsd"))]
    #[test]
    fn an_unknown_congestion_control_is_named_as_the_option_before_listening() {
        let ports = free_pair();
        let options = Options::default()
            .timeout(Duration::from_secs(1))
            .tcp_congestion("no-such-cc");
        let e = connect(&ring_addrs(0, ports), &options)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("Options::tcp_congestion (NUVEC_DISTRIBUTED_TCP_CONGESTION for init)")
                && e.contains("\"no-such-cc\"")
                && !e.contains("cannot listen"),
            "{e}"
        );
    }

    #[test]
    fn a_pair_with_different_keys_fails_on_both_sides_naming_the_peer() {
        let ports = free_pair();
        let rank0 = start(0, ports, "a shared secret of enough length");
        let rank1 = start(1, ports, "another secret of enough length!");
        for (rank, handle) in [(0, rank0), (1, rank1)] {
            let e = handle.join().unwrap().unwrap_err();
            assert!(
                matches!(&e, Error::Auth { peer, reason, .. }
                    if *peer == 1 - rank && reason.contains("keys differ")),
                "rank {rank}: {e}"
            );
        }
    }

    /// A timeout no `Instant` can hold (`Options::timeout(Duration::MAX)`, or
    /// `NUVEC_DISTRIBUTED_TIMEOUT=1e19`) must not overflow computing the setup's deadline.
    #[test]
    fn a_pair_forms_with_a_timeout_beyond_the_clock() {
        let ports = free_pair();
        let huge = [
            Duration::MAX,
            Duration::from_secs(10_000_000_000_000_000_000),
        ];
        // Each rank holds its connections until both have formed: an unkeyed rank passes
        // over a connection already closed, and with these timeouts it would wait forever.
        let formed = std::sync::Arc::new(std::sync::Barrier::new(2));
        let (done, results) = std::sync::mpsc::channel();
        for (rank, timeout) in huge.into_iter().enumerate() {
            let (formed, done) = (formed.clone(), done.clone());
            std::thread::spawn(move || {
                let options = Options::default().timeout(timeout);
                let transport = connect(&ring_addrs(rank, ports), &options);
                formed.wait();
                let _ = done.send((rank, transport.map(|t| t.connections())));
            });
        }
        for _ in 0..2 {
            let (rank, result) = results
                .recv_timeout(Duration::from_secs(60))
                .expect("the pair did not form within a minute");
            assert_eq!(result.unwrap(), 1, "rank {rank}");
        }
    }
}
