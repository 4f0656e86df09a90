//! Forming the native wire's mesh: the ring's connections plus one between every pair of
//! ranks that are not neighbours, each through the hello of [`super::hello`] (and, with a
//! key, the authentication of [`crate::auth`] bound to it).
//!
//! Connections are those of the ring (rank `r` dials its right neighbour's address `i` for
//! every `i`, and accepts the left neighbour's on its own address `i`), plus, for every pair
//! of ranks `a < b` that are not neighbours (only from 4 ranks on), one that `a` dials to
//! `b`'s first address. So a rank's first address receives ring and mesh connections alike:
//! the acceptor tells them apart by the connector's hello, never by arrival order. As the
//! ring's setup does (both run the skeleton of [`crate::transport::tcp::bootstrap`]), a rank
//! listens on all its addresses at once, dials concurrently and retries refused
//! connections quickly until the deadline.
//!
//! Every rank speaks first on every connection, so a rank this one dialled that is not
//! native is named as soon as its first bytes arrive (see [`super::hello`]) and setup fails
//! at once; one that sends nothing is named at the deadline, with that as the likely cause.
//!
//! An accepted client, though, may be anyone who can reach the port. One whose first bytes
//! are not a hello (data, zeros, a scanner's close, a truncated or broken hello), that sends
//! no whole hello within [`HELLO_DEADLINE`], or that sends a hello of this group and then
//! fails the key's proof (a replay) is a stranger: it is dropped, logged, counted for the
//! error at the deadline, and the address keeps waiting for the real peer. At most
//! [`MAX_PENDING`] accepted clients wait for their hello at once; beyond that the oldest
//! is dropped, so a flood costs bounded memory and descriptors, and a real peer that
//! arrives after it is kept. No allocation depends on what a client sends: a hello is 88
//! bytes into a fixed buffer, and the key's messages are fixed-size too. A client that
//! sends a hello of another version or wire, or a well-formed hello of another group, size,
//! key or rank, is taken for a misconfigured rank and fails setup at once, naming what
//! differs; whoever can reach a forming group's ports can abort it that way, but cannot
//! join it with a key.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Poll};

use super::hello::{self, Expect, Identity, Kind};
use super::{Formed, Peer};
use crate::auth::{Fault, Handshake, Key, Outcome};
use crate::config::hostfile::RingAddresses;
use crate::error::{Error, PeerOp, Phase, Result, describe_io};
use crate::options::{Io, Options};
use crate::transport::tcp::Connections;
use crate::transport::tcp::bootstrap::{self, FIRST_RETRY, Formation, next_backoff, pump};
use crate::transport::tcp::seal::{Channel, Workers};
use crate::transport::tcp::socket::{self as tcp, SocketTuning};
use crate::verbose::verbose;

const CONTEXT: Phase = Phase::NativeSetup;

/// How long an accepted client may take to complete its hello (and, with a key, the
/// proof) before it is dropped as a stranger. A rank sends its hello as soon as it is
/// connected, and the key's exchange is two round trips more, so a real peer needs
/// milliseconds even on a loaded host; the margin keeps a peer stalled by its scheduler.
pub(crate) const HELLO_DEADLINE: Duration = Duration::from_secs(10);

/// The most accepted clients waiting for their hello at once; beyond it the oldest is
/// dropped. A group expects at most `size - 1 + connections` on a rank, far fewer.
pub(crate) const MAX_PENDING: usize = 64;

/// How many dropped strangers the error at the deadline names by address.
const STRANGERS_NAMED: usize = 3;

/// The strangers dropped while forming, for the error at the deadline.
#[derive(Debug, Default)]
struct Strangers {
    /// How many were dropped.
    count: usize,
    /// The first few: where each came from and why it was dropped.
    first: Vec<(SocketAddr, String)>,
}

impl Strangers {
    fn record(&mut self, from: SocketAddr, why: String) {
        self.count += 1;
        if self.first.len() < STRANGERS_NAMED {
            self.first.push((from, why));
        }
    }

    /// "dropped 5 connections that were not this group's ranks: from A (why), from B
    /// (why), from C (why) and 2 more", or `None` if none was dropped.
    fn summary(&self) -> Option<String> {
        if self.count == 0 {
            return None;
        }
        let named: Vec<String> = self
            .first
            .iter()
            .map(|(from, why)| format!("from {from} ({why})"))
            .collect();
        let more = self.count - self.first.len();
        Some(format!(
            "dropped {} connection(s) that were not this group's ranks: {}{}",
            self.count,
            named.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        ))
    }
}

/// What a peer that sends nothing is most likely, for the timeout's error.
fn silent_peer(timeout: Duration) -> String {
    format!(
        "it sent no hello within {timeout:?}: it likely does not speak the native wire (an MLX \
         rank, or a nuvec rank without {}=native), or it hangs",
        crate::config::env::WIRE_VAR
    )
}

/// Forms this rank's part of the native mesh within `options.timeout`.
pub(crate) fn connect(addrs: &RingAddresses, options: &Options) -> Result<Formed> {
    let key = bootstrap::prepare(options)?;
    // A keyed group's connections are sealed, and sealed connections run on epoll for now:
    // io_uring asked for by name fails before any socket exists, not after forming.
    if key.is_some()
        && addrs.size > 1
        && crate::config::env::io(&crate::config::env::process, options.io)? == Io::Uring
    {
        return Err(crate::transport::tcp::sealed_on_uring());
    }
    let rank = addrs.rank;
    let workers = match options.seal_threads_for(addrs.local_ranks) {
        threads if key.is_some() && addrs.size > 1 && threads > 1 => Some(
            Workers::new(threads)
                .map_err(|e| Error::local("starting the threads that seal records", e))?,
        ),
        _ => None,
    };
    verbose!(
        rank,
        "forming a native mesh of {} ({} connection(s) per neighbour{}): listening on {:?}",
        addrs.size,
        addrs.listen.len(),
        if key.is_some() { ", authenticated" } else { "" },
        addrs.listen,
    );
    let started = Instant::now();
    let shape = (rank, addrs.size, addrs.listen.len());
    let result = bootstrap::finish(options, shape, started, |tuning| {
        Setup::new(addrs, tuning, key, options.shared_memory, workers.clone())
    });
    match &result {
        Ok(_) => verbose!(info: rank, "native mesh formed in {:?}", started.elapsed()),
        Err(e) => verbose!(
            warn: rank,
            "forming the native mesh failed after {:?}: {e}",
            started.elapsed()
        ),
    }
    result
}

/// The error for a handshake with `peer` that failed with `fault`.
fn refusal(fault: Fault, peer: usize, addr: Option<SocketAddr>, reason: String) -> Error {
    match fault {
        Fault::NoKey | Fault::Incompatible => Error::PeerIncompatible {
            peer,
            addr,
            context: CONTEXT,
            reason,
        },
        Fault::Keys => Error::Auth {
            peer,
            addr,
            context: CONTEXT,
            reason,
        },
        Fault::Peer => Error::PeerMisbehaved {
            peer,
            addr,
            context: CONTEXT,
            reason,
        },
    }
}

/// The error at the deadline with what came instead of the peers: `strangers` appended to
/// its reason. A plain timeout becomes a timed-out I/O error of the same peer and step, so
/// that it can carry the sentence; its fault is the same (the peer failed to come).
fn with_strangers(mut error: Error, strangers: &str) -> Error {
    match &mut error {
        Error::PeerIncompatible { reason, .. } | Error::Auth { reason, .. } => {
            reason.push_str("; ");
            reason.push_str(strangers);
        }
        Error::Io { source, .. } => {
            *source = std::sync::Arc::new(io::Error::new(
                source.kind(),
                format!("{source}; {strangers}"),
            ));
        }
        _ => {}
    }
    let Error::Timeout {
        peer,
        addr,
        op,
        context,
        after,
    } = error
    else {
        return error;
    };
    Error::Io {
        peer,
        addr,
        op,
        context,
        source: std::sync::Arc::new(io::Error::new(
            io::ErrorKind::TimedOut,
            match op {
                PeerOp::Accept => format!(
                    "no connection from rank {peer} completed its hello within {after:?}; \
                     {strangers}"
                ),
                _ => format!("{op} timed out after {after:?}; {strangers}"),
            },
        )),
    }
}

/// Where an outgoing connection goes.
#[derive(Clone, Copy, Debug)]
struct Target {
    peer: usize,
    addr: SocketAddr,
    kind: Kind,
}

/// One outgoing connection.
enum Dial {
    /// Waiting to (re)try at the instant.
    Idle(Instant),
    /// A non-blocking connect in flight.
    Connecting(TcpStream),
    /// Connected; running the hello (and authentication).
    Handshake(TcpStream, Box<hello::Connector>),
    /// Ready, with what the peer said about itself (and, with a key, the connection's
    /// sealed records).
    Up(TcpStream, Peer, Sealing),
}

/// A keyed connection's sealed records (see [`crate::transport::tcp::seal`]), from its
/// handshake; `None` without a key.
type Sealing = Option<Box<Channel>>;

/// An accepted connection not yet placed.
struct Candidate {
    stream: TcpStream,
    /// The listening address (index) it arrived on.
    slot: usize,
    from: SocketAddr,
    /// When it was accepted: it is dropped at [`HELLO_DEADLINE`] after.
    arrived: Instant,
    acceptor: Box<hello::Acceptor>,
}

/// Where an accepted connection that completed its hello belongs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    /// Ring connection `i` from the left neighbour.
    Ring(usize),
    /// The mesh connection from this lower rank.
    Mesh(usize),
}

struct Setup<'a> {
    addrs: &'a RingAddresses,
    tuning: SocketTuning,
    key: Option<Key>,
    expect: Expect,
    poll: Poll,
    events: Events,
    /// Every address stays open until the mesh forms: address 0 takes ring and mesh
    /// connections, and a connection that fails its hello leaves room for the next.
    listeners: Vec<TcpListener>,
    targets: Vec<Target>,
    dials: Vec<Dial>,
    backoff: Vec<Duration>,
    /// Why each outgoing connection last failed, for the error at the deadline.
    dial_failures: Vec<Option<String>>,
    candidates: Vec<Option<Candidate>>,
    /// The left neighbour's ring connections, by index.
    ring_in: Vec<Option<(TcpStream, Peer, Sealing)>>,
    /// The lower non-neighbours' mesh connections, by rank.
    mesh_in: Vec<Option<(TcpStream, Peer, Sealing)>>,
    /// Ranks that must dial this one's first address for the mesh.
    mesh_from: Vec<usize>,
    /// Accepted clients dropped as strangers, for the error at the deadline.
    strangers: Strangers,
    /// A failure that ends setup at once.
    failure: Option<Error>,
    /// The threads the sealed connections seal and open batches of records on, if more
    /// than the rank's own.
    workers: Option<Workers>,
}

impl<'a> Setup<'a> {
    fn new(
        addrs: &'a RingAddresses,
        tuning: SocketTuning,
        key: Option<Key>,
        shared_memory: bool,
        workers: Option<Workers>,
    ) -> Result<Self> {
        let (me, size) = (addrs.rank, addrs.size);
        let word = |v: usize| {
            u32::try_from(v).map_err(|_| Error::invalid(format!("{v} ranks do not fit a hello")))
        };
        let expect = Expect {
            me: word(me)?,
            identity: Identity {
                capabilities: if shared_memory {
                    hello::CAP_SHARED_MEMORY
                } else {
                    0
                },
                size: word(size)?,
                group: hello::shrunk_identity(
                    hello::group_identity(&addrs.all, key.as_ref()),
                    addrs.shrunk.as_ref(),
                ),
                host: hello::host_identity(),
            },
            keyed: key.is_some(),
        };
        let mut targets = Vec::new();
        let mut mesh_from = Vec::new();
        if size > 1 {
            for (i, &addr) in addrs.right.iter().enumerate() {
                targets.push(Target {
                    peer: addrs.right_rank(),
                    addr,
                    kind: Kind::Ring(word(i)?),
                });
            }
            for other in 0..size {
                if hello::neighbours(word(size)?, word(me)?, word(other)?) {
                    continue;
                }
                if other > me {
                    targets.push(Target {
                        peer: other,
                        addr: addrs.first_address(other)?,
                        kind: Kind::Mesh,
                    });
                } else {
                    mesh_from.push(other);
                }
            }
        }
        let (poll, listeners) = bootstrap::listen(addrs, &tuning, "the mesh's")?;
        let now = Instant::now();
        let (c, dials) = (addrs.listen.len(), targets.len());
        Ok(Setup {
            addrs,
            tuning,
            key,
            expect,
            poll,
            events: Events::with_capacity(64),
            listeners,
            targets,
            dials: (0..dials).map(|_| Dial::Idle(now)).collect(),
            backoff: vec![FIRST_RETRY; dials],
            dial_failures: vec![None; dials],
            candidates: Vec::new(),
            ring_in: (0..c).map(|_| None).collect(),
            mesh_in: (0..size).map(|_| None).collect(),
            mesh_from,
            strangers: Strangers::default(),
            failure: None,
            workers,
        })
    }

    /// What the mesh still waits for, for a report: each connection this rank dials that
    /// is not up, and each connection it expects that has not arrived, with the peer's rank
    /// and address.
    fn waiting_for(&self) -> String {
        let mut missing = Vec::new();
        for (dial, (target, failure)) in self
            .dials
            .iter()
            .zip(self.targets.iter().zip(&self.dial_failures))
        {
            let why = match dial {
                Dial::Up(..) => continue,
                Dial::Idle(_) | Dial::Connecting(_) => match failure {
                    Some(e) => format!("its last try failed: {e}"),
                    None => "connecting".to_string(),
                },
                Dial::Handshake(..) => "connected, in the hello".to_string(),
            };
            missing.push(format!(
                "rank {} to accept {} at {} ({why})",
                target.peer, target.kind, target.addr
            ));
        }
        let left = self.addrs.left_rank();
        let arrived = |slot: usize| self.candidates.iter().flatten().any(|c| c.slot == slot);
        for (i, slot) in self.ring_in.iter().enumerate() {
            if slot.is_none() {
                missing.push(format!(
                    "rank {left} ({}) to connect to this rank's {}{}",
                    self.addrs.written(left, i).unwrap_or("its address"),
                    self.addrs.listen[i],
                    if arrived(i) {
                        " (a connection arrived there and has not said who it is yet)"
                    } else {
                        ""
                    }
                ));
            }
        }
        for &r in &self.mesh_from {
            if self.mesh_in[r].is_none() {
                missing.push(format!(
                    "rank {r} ({}) to open the mesh connection to this rank's {}",
                    self.addrs.written(r, 0).unwrap_or("its address"),
                    self.addrs.listen[0]
                ));
            }
        }
        missing.join("; ")
    }

    fn formed(&self) -> bool {
        self.dials.iter().all(|d| matches!(d, Dial::Up(..)))
            && self.ring_in.iter().all(Option::is_some)
            && self.mesh_from.iter().all(|&r| self.mesh_in[r].is_some())
    }

    fn next_retry(&self) -> Option<Instant> {
        self.dials
            .iter()
            .filter_map(|d| match d {
                Dial::Idle(at) => Some(*at),
                _ => None,
            })
            .min()
    }

    fn start_due_dials(&mut self) -> Result<()> {
        let now = Instant::now();
        for i in 0..self.dials.len() {
            if !matches!(self.dials[i], Dial::Idle(at) if at <= now) {
                continue;
            }
            let addr = self.targets[i].addr;
            match bootstrap::dial(&self.poll, &self.tuning, i, addr)? {
                Ok(stream) => self.dials[i] = Dial::Connecting(stream),
                Err(e) => self.retry(i, describe_io(&e)),
            }
        }
        Ok(())
    }

    /// Drops outgoing connection `i` and schedules another attempt.
    fn retry(&mut self, i: usize, why: String) {
        let old = std::mem::replace(
            &mut self.dials[i],
            Dial::Idle(Instant::now() + self.backoff[i]),
        );
        if let Dial::Connecting(mut s) | Dial::Handshake(mut s, _) | Dial::Up(mut s, ..) = old {
            let _ = self.poll.registry().deregister(&mut s);
        }
        self.backoff[i] = next_backoff(self.backoff[i]);
        let target = self.targets[i];
        verbose!(
            self.addrs.rank,
            "{} to rank {} at {} failed ({why}); retrying",
            target.kind,
            target.peer,
            target.addr
        );
        self.dial_failures[i] = Some(why);
    }

    fn progress_dial(&mut self, i: usize) {
        let Some(target) = self.targets.get(i).copied() else {
            return;
        };
        if let Dial::Connecting(stream) = &self.dials[i] {
            match tcp::dial_outcome(stream) {
                Ok(false) => return,
                Ok(true) => {
                    let hs = hello::Connector::new(
                        self.expect.clone(),
                        self.key,
                        target.peer as u32,
                        target.kind,
                    );
                    if let Dial::Connecting(s) =
                        std::mem::replace(&mut self.dials[i], Dial::Idle(Instant::now()))
                    {
                        self.dials[i] = Dial::Handshake(s, Box::new(hs));
                    }
                }
                Err(e) => return self.retry(i, describe_io(&e)),
            }
        }
        let Dial::Handshake(stream, hs) = &mut self.dials[i] else {
            return;
        };
        if let Err(e) = pump(stream, &mut **hs) {
            return self.retry(i, describe_io(&e));
        }
        let peer = hs.peer_hello().map(|h| Peer {
            host: h.identity.host,
            capabilities: h.identity.capabilities,
        });
        match hs.outcome().clone() {
            Outcome::Pending => {}
            Outcome::Established => {
                let sealing = hs.channel();
                if let Err(e) = self.sealed(&sealing, target.peer) {
                    return self.fail(e);
                }
                if let (Dial::Handshake(mut s, _), Some(peer)) = (
                    std::mem::replace(&mut self.dials[i], Dial::Idle(Instant::now())),
                    peer,
                ) {
                    let _ = self.poll.registry().deregister(&mut s);
                    self.dials[i] = Dial::Up(s, peer, sealing);
                }
            }
            // The peer left before sending a byte: it may be restarting; try again.
            Outcome::Rejected(r) if r.fault == Fault::Peer && !hs.heard() => {
                self.retry(i, r.reason);
            }
            Outcome::Rejected(r) => {
                verbose!(
                    self.addrs.rank,
                    "{} to rank {} at {}: {}",
                    target.kind,
                    target.peer,
                    target.addr,
                    r.reason
                );
                let reason = format!("rank {} {}", target.peer, r.reason);
                self.fail(refusal(r.fault, target.peer, Some(target.addr), reason));
            }
        }
    }

    fn fail(&mut self, error: Error) {
        if self.failure.is_none() {
            self.failure = Some(error);
        }
    }

    /// Checks that a connection to `peer` established with a key has its sealed records:
    /// no keyed connection may carry a byte outside them.
    fn sealed(&self, sealing: &Sealing, peer: usize) -> Result<()> {
        if self.key.is_some() && sealing.is_none() {
            return Err(Error::Bug {
                context: CONTEXT,
                what: format!(
                    "the keyed handshake with rank {peer} was established without the nonces \
                     its records are sealed under"
                ),
            });
        }
        Ok(())
    }

    fn accept(&mut self, slot: usize) -> Result<()> {
        loop {
            let Some(listener) = self.listeners.get_mut(slot) else {
                return Ok(());
            };
            let at = (slot, self.addrs.listen[slot]);
            let Some((mut stream, from)) = bootstrap::accept(listener, self.addrs.rank, at)? else {
                return Ok(());
            };
            self.make_room();
            // A freed id is reused, so that the list stays as long as the most clients
            // ever pending at once, not as long as all that ever came.
            let id = match self.candidates.iter().position(Option::is_none) {
                Some(free) => free,
                None => {
                    self.candidates.push(None);
                    self.candidates.len() - 1
                }
            };
            bootstrap::register_candidate(&self.poll, &mut stream, id)?;
            let acceptor = hello::Acceptor::new(self.expect.clone(), self.key, slot as u32);
            self.candidates[id] = Some(Candidate {
                stream,
                slot,
                from,
                arrived: Instant::now(),
                acceptor: Box::new(acceptor),
            });
            self.progress_candidate(id);
        }
    }

    /// Drops the oldest pending clients while [`MAX_PENDING`] or more wait, so that one
    /// more fits.
    fn make_room(&mut self) {
        while self.candidates.iter().flatten().count() >= MAX_PENDING {
            let oldest = self
                .candidates
                .iter()
                .enumerate()
                .filter_map(|(id, c)| c.as_ref().map(|c| (c.arrived, id)))
                .min();
            let Some((_, id)) = oldest else {
                return;
            };
            self.drop_stranger(
                id,
                format!("it was the oldest of {MAX_PENDING} clients waiting for their hello"),
            );
        }
    }

    /// Drops the pending clients that have not completed their hello within
    /// [`HELLO_DEADLINE`].
    fn expire_silent(&mut self) {
        let now = Instant::now();
        for id in 0..self.candidates.len() {
            let overdue = self.candidates[id]
                .as_ref()
                .is_some_and(|c| now.saturating_duration_since(c.arrived) >= HELLO_DEADLINE);
            if overdue {
                self.drop_stranger(
                    id,
                    format!("it did not complete a hello within {HELLO_DEADLINE:?}"),
                );
            }
        }
    }

    /// When the next pending client's hello deadline passes, if any waits.
    fn next_expiry(&self) -> Option<Instant> {
        self.candidates
            .iter()
            .flatten()
            .map(|c| c.arrived + HELLO_DEADLINE)
            .min()
    }

    /// Closes pending client `id` as a stranger: logs it and counts it for the error at
    /// the deadline. Its address keeps waiting for the real peer.
    fn drop_stranger(&mut self, id: usize, why: String) {
        let Some(mut c) = self.candidates.get_mut(id).and_then(Option::take) else {
            return;
        };
        let _ = self.poll.registry().deregister(&mut c.stream);
        verbose!(
            self.addrs.rank,
            "dropped a client from {} on {}, which is not a rank of this group ({why}); still \
             waiting for the real peer",
            c.from,
            self.addrs.listen[c.slot]
        );
        self.strangers.record(c.from, why);
    }

    /// Who a client on address `slot` most likely is, before its hello says: the left
    /// neighbour, whose ring connection arrives there.
    fn tentative(&self, slot: usize, from: SocketAddr) -> String {
        let at = self.addrs.listen[slot];
        if slot == 0 && !self.mesh_from.is_empty() {
            format!(
                "a client from {from} (rank {} or one of ranks {:?}, if it is a connection \
                 expected at {at})",
                self.addrs.left_rank(),
                self.mesh_from
            )
        } else {
            format!(
                "a client from {from} (rank {}, if it is the connection expected at {at})",
                self.addrs.left_rank()
            )
        }
    }

    fn progress_candidate(&mut self, id: usize) {
        let Some(Some(candidate)) = self.candidates.get_mut(id) else {
            return;
        };
        if pump(&mut candidate.stream, &mut *candidate.acceptor).is_err() {
            candidate.acceptor.handle_closed();
        }
        let outcome = candidate.acceptor.outcome().clone();
        let said = candidate.acceptor.peer_hello().copied();
        if outcome == Outcome::Pending {
            return;
        }
        if let Outcome::Rejected(r) = &outcome
            && candidate.acceptor.is_stranger()
        {
            return self.drop_stranger(id, r.reason.clone());
        }
        let Some(mut c) = self.candidates[id].take() else {
            return;
        };
        let _ = self.poll.registry().deregister(&mut c.stream);
        match outcome {
            Outcome::Pending => {}
            Outcome::Established => {
                let Some(hello) = said else {
                    return;
                };
                let sealing = c.acceptor.channel();
                if let Err(e) = self.sealed(&sealing, hello.from as usize) {
                    return self.fail(e);
                }
                let peer = Peer {
                    host: hello.identity.host,
                    capabilities: hello.identity.capabilities,
                };
                let place = match hello.kind {
                    Kind::Ring(i) => Place::Ring(i as usize),
                    Kind::Mesh | Kind::Accepted(_) => Place::Mesh(hello.from as usize),
                };
                // A later connection for a place replaces an earlier one: the connector
                // only dials again after giving up on the first.
                match place {
                    Place::Ring(i) => {
                        if let Some(s) = self.ring_in.get_mut(i) {
                            *s = Some((c.stream, peer, sealing));
                        }
                    }
                    Place::Mesh(r) => {
                        if let Some(s) = self.mesh_in.get_mut(r) {
                            *s = Some((c.stream, peer, sealing));
                        }
                    }
                }
            }
            // A rank of another version, wire or group (strangers were dropped above).
            Outcome::Rejected(r) => {
                let who = match r.claimed {
                    Some(rank) => format!("rank {rank} (connecting from {})", c.from),
                    None => self.tentative(c.slot, c.from),
                };
                verbose!(
                    self.addrs.rank,
                    "turned away {who} on {}: {}",
                    self.addrs.listen[c.slot],
                    r.reason
                );
                let peer = r.claimed.unwrap_or(self.addrs.left_rank());
                let reason = format!("{who} {}", r.reason);
                self.fail(refusal(r.fault, peer, Some(c.from), reason));
            }
        }
    }

    /// Hands the formed connections to a transport.
    fn hand_over(mut self) -> Result<Formed> {
        let (me, size) = (self.addrs.rank, self.addrs.size);
        let (left, right) = (self.addrs.left_rank(), self.addrs.right_rank());
        let mut peers: Vec<Option<Peer>> = vec![None; size];
        if let Some(own) = peers.get_mut(me) {
            *own = Some(Peer {
                host: self.expect.identity.host,
                capabilities: self.expect.identity.capabilities,
            });
        }
        // Errors show a connection's address beside the peer's rank: for one that arrived
        // here, the peer's own (as the hostfile gives it), not this rank's.
        let left_addr = self.addrs.first_address(left)?;
        // Each connection's sealed records, in the transport's order of connections: the
        // left ones, the right ones, then the others by rank.
        let mut left_conns = Vec::with_capacity(self.ring_in.len());
        let mut sealings = Vec::new();
        for (stream, peer, sealing) in self.ring_in.drain(..).flatten() {
            peers[left] = Some(peer);
            left_conns.push((stream, left, left_addr));
            sealings.push(sealing);
        }
        let mut right_conns = Vec::new();
        let mut others = Vec::new();
        for (dial, target) in self.dials.drain(..).zip(&self.targets) {
            if let Dial::Up(stream, peer, sealing) = dial {
                peers[target.peer] = Some(peer);
                match target.kind {
                    Kind::Ring(_) => {
                        right_conns.push((stream, right, target.addr));
                        sealings.push(sealing);
                    }
                    Kind::Mesh | Kind::Accepted(_) => {
                        others.push(((stream, target.peer, target.addr), sealing))
                    }
                }
            }
        }
        for (rank, slot) in self.mesh_in.drain(..).enumerate() {
            if let Some((stream, peer, sealing)) = slot {
                peers[rank] = Some(peer);
                // As for the left connections: the peer's own address.
                others.push(((stream, rank, self.addrs.first_address(rank)?), sealing));
            }
        }
        others.sort_by_key(|&((_, rank, _), _)| rank);
        let others = others
            .into_iter()
            .map(|(conn, sealing)| {
                sealings.push(sealing);
                conn
            })
            .collect();
        let peers = peers
            .into_iter()
            .enumerate()
            .map(|(rank, p)| {
                p.ok_or_else(|| Error::Bug {
                    context: CONTEXT,
                    what: format!("the mesh formed without a hello from rank {rank}"),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let mut transport = Connections::mesh(
            self.poll,
            me,
            size,
            left_conns,
            right_conns,
            others,
            &self.tuning.liveness,
        )
        .map_err(|e| Error::local("setting up the mesh's connections", e))?;
        for (index, sealing) in sealings.into_iter().enumerate() {
            if let Some(channel) = sealing {
                let channel = match &self.workers {
                    Some(w) => channel.with_workers(w.clone()),
                    None => channel,
                };
                transport.seal(index, channel);
            }
        }
        Ok(Formed {
            transport,
            rank: me,
            size,
            peers,
            local_ranks: self.addrs.local_ranks,
            group: self.expect.identity.group,
        })
    }

    /// The error for a mesh that did not form by the deadline: the first connection this
    /// rank could not open or finish, else the first that never arrived.
    fn timed_out(mut self, timeout: Duration) -> Error {
        for (i, dial) in self.dials.iter().enumerate() {
            let target = self.targets[i];
            let (peer, addr) = (target.peer, Some(target.addr));
            return match dial {
                Dial::Up(..) => continue,
                Dial::Handshake(_, hs) if hs.peer_hello().is_none() => Error::PeerIncompatible {
                    peer,
                    addr,
                    context: CONTEXT,
                    reason: format!(
                        "rank {peer} accepted {} but {}",
                        target.kind,
                        silent_peer(timeout)
                    ),
                },
                Dial::Handshake(..) => Error::Auth {
                    peer,
                    addr,
                    context: CONTEXT,
                    reason: format!("rank {peer} did not finish authenticating within {timeout:?}"),
                },
                Dial::Idle(_) | Dial::Connecting(_) => match self.dial_failures[i].take() {
                    Some(why) => Error::Io {
                        peer,
                        addr,
                        op: PeerOp::Connect,
                        context: CONTEXT,
                        source: std::sync::Arc::new(io::Error::other(why)),
                    },
                    None => Error::Timeout {
                        peer,
                        addr,
                        op: PeerOp::Connect,
                        context: CONTEXT,
                        after: timeout,
                    },
                },
            };
        }
        // A connection that arrived and said nothing: an MLX rank's, most likely.
        if let Some(c) = self
            .candidates
            .iter()
            .flatten()
            .find(|c| c.acceptor.peer_hello().is_none())
        {
            let who = self.tentative(c.slot, c.from);
            return Error::PeerIncompatible {
                peer: self.addrs.left_rank(),
                addr: Some(c.from),
                context: CONTEXT,
                reason: format!("{who} {}", silent_peer(timeout)),
            };
        }
        let missing_ring = self.ring_in.iter().position(Option::is_none);
        let missing_mesh = self
            .mesh_from
            .iter()
            .copied()
            .find(|&r| self.mesh_in[r].is_none());
        // The peer's own address for the error: its address `i` for ring connection `i`,
        // its first for the mesh.
        let (peer, peer_addr) = match (missing_ring, missing_mesh) {
            (Some(i), _) => (self.addrs.left_rank(), i),
            (None, Some(r)) => (r, 0),
            (None, None) => (self.addrs.left_rank(), 0),
        };
        Error::Timeout {
            peer,
            addr: self.addrs.resolved(peer, peer_addr),
            op: PeerOp::Accept,
            context: CONTEXT,
            after: timeout,
        }
    }
}

impl Formation for Setup<'_> {
    type Formed = Formed;

    const WAITING: &'static str = "waiting to form the native mesh";

    fn poller(&mut self) -> (&mut Poll, &mut Events) {
        (&mut self.poll, &mut self.events)
    }

    fn start_due_dials(&mut self) -> Result<()> {
        // Called on every turn of the loop: the place to drop clients past their deadline.
        self.expire_silent();
        Setup::start_due_dials(self)
    }

    fn settled(&mut self) -> Option<Result<()>> {
        if let Some(error) = self.failure.take() {
            return Some(Err(error));
        }
        self.formed().then_some(Ok(()))
    }

    fn finish(self) -> Result<Formed> {
        self.hand_over()
    }

    fn report(&self, elapsed: Duration, timeout: Duration) {
        verbose!(
            info: self.addrs.rank,
            "still forming the native mesh after {elapsed:.1?} (the timeout is {timeout:?}); waiting for {}{}",
            self.waiting_for(),
            self.strangers.summary().map_or_else(String::new, |s| format!("; {s}"))
        );
    }

    fn give_up(self, timeout: Duration) -> Error {
        let strangers = self.strangers.summary();
        let error = self.timed_out(timeout);
        match strangers {
            Some(s) => with_strangers(error, &s),
            None => error,
        }
    }

    fn next_retry(&self) -> Option<Instant> {
        match (Setup::next_retry(self), self.next_expiry()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn accept(&mut self, i: usize) -> Result<()> {
        Setup::accept(self, i)
    }

    fn progress_dial(&mut self, i: usize) -> Result<()> {
        Setup::progress_dial(self, i);
        Ok(())
    }

    fn progress_candidate(&mut self, id: usize) -> Result<()> {
        Setup::progress_candidate(self, id);
        Ok(())
    }

    fn connections(formed: &mut Formed) -> &mut Connections {
        &mut formed.transport
    }
}

#[cfg(test)]
#[path = "relay_tests.rs"]
mod relay_tests;

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::mpsc;
    use std::thread;

    use super::*;
    use crate::auth;
    use crate::transport::tcp::Transfer;

    /// A hostfile's entries for `p` ranks of `c` addresses each.
    fn hostfile(p: usize, c: usize) -> Vec<Vec<String>> {
        let ports = crate::loopback_ports::free_addrs(p * c);
        (0..p)
            .map(|r| (0..c).map(|i| ports[r * c + i].to_string()).collect())
            .collect()
    }

    fn addrs(nodes: &[Vec<String>], rank: usize) -> RingAddresses {
        crate::config::hostfile::resolve(nodes, rank, Path::new("hosts.json")).unwrap()
    }

    const SECRET: &str = "a shared secret of enough length";

    /// With a key, on epoll by name: keyed native groups refuse io_uring, and these tests
    /// also run with `NUVEC_DISTRIBUTED_IO=uring`.
    fn options(timeout: Duration, key: Option<&str>) -> Options {
        let options = Options::default().timeout(timeout);
        match key {
            Some(k) => options.key(k).io(crate::options::Io::Epoll),
            None => options,
        }
    }

    /// Runs `connect` for every rank in `ranks` on its own thread.
    fn start(
        ranks: Vec<(RingAddresses, Options)>,
    ) -> Vec<thread::JoinHandle<(Result<Formed>, Duration)>> {
        ranks
            .into_iter()
            .map(|(a, o)| {
                thread::spawn(move || {
                    let started = Instant::now();
                    let r = connect(&a, &o);
                    (r, started.elapsed())
                })
            })
            .collect()
    }

    /// Writes one byte on `from`'s connection to `to` and reads it on `to`'s from `from`.
    fn exchange(formed: &mut [Formed], from: usize, to: usize, byte: u8) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let s = formed[from].transport.send_conn(to);
        assert_eq!(
            formed[from].transport.conn(s).peer,
            to,
            "{from} sends to {to}"
        );
        loop {
            match formed[from].transport.conn(s).write(&[byte]).unwrap() {
                Transfer::Moved(1) => break,
                Transfer::Blocked => {
                    formed[from].transport.wait(deadline, None).unwrap();
                }
                other => panic!("{from} -> {to}: {other:?}"),
            }
        }
        let r = formed[to].transport.recv_conn(from);
        assert_eq!(
            formed[to].transport.conn(r).peer,
            from,
            "{to} receives from {from}"
        );
        let mut got = [0u8; 2];
        loop {
            match formed[to].transport.conn(r).read(&mut got).unwrap() {
                Transfer::Moved(n) => {
                    assert_eq!(&got[..n], &[byte], "{from} -> {to}");
                    return;
                }
                Transfer::Blocked => {
                    assert!(Instant::now() < deadline, "{from} -> {to}: nothing arrived");
                    formed[to].transport.wait(deadline, None).unwrap();
                }
                Transfer::Closed => panic!("{from} -> {to}: closed"),
            }
        }
    }

    fn form_all(p: usize, c: usize, key: Option<&str>) -> Vec<Formed> {
        let nodes = hostfile(p, c);
        let ranks = (0..p)
            .map(|r| (addrs(&nodes, r), options(Duration::from_secs(20), key)))
            .collect();
        start(ranks)
            .into_iter()
            .enumerate()
            .map(|(r, h)| {
                let (result, _) = h.join().unwrap();
                result.unwrap_or_else(|e| panic!("P = {p}, C = {c}, rank {r}: {e}"))
            })
            .collect()
    }

    fn check_mesh(p: usize, c: usize, key: Option<&str>) {
        let mut formed = form_all(p, c, key);
        let host = hello::host_identity();
        for (r, f) in formed.iter_mut().enumerate() {
            assert_eq!((f.rank, f.size, f.local_ranks), (r, p, p));
            assert_eq!(f.peers.len(), p);
            for peer in &f.peers {
                // Every rank offers shared memory (the default of `Options`).
                assert_eq!(
                    *peer,
                    Peer {
                        host,
                        capabilities: hello::CAP_SHARED_MEMORY
                    }
                );
            }
            // Left neighbour's C, right neighbour's C, then the others in rank order.
            let (left, right) = ((r + p - 1) % p, (r + 1) % p);
            let mut expected = vec![left; c];
            expected.extend(vec![right; c]);
            expected.extend((0..p).filter(|&o| !hello::neighbours(p as u32, r as u32, o as u32)));
            let got: Vec<usize> = f.transport.conns().iter().map(|conn| conn.peer).collect();
            assert_eq!(got, expected, "P = {p}, C = {c}, rank {r}");
        }
        for from in 0..p {
            for to in 0..p {
                if from != to {
                    exchange(&mut formed, from, to, (from * 16 + to) as u8);
                }
            }
        }
    }

    #[test]
    fn the_mesh_forms_for_2_to_6_ranks_and_1_or_2_connections() {
        for p in 2..=6 {
            for c in 1..=2 {
                check_mesh(p, c, None);
            }
        }
    }

    #[test]
    fn the_mesh_forms_with_a_key() {
        for p in 2..=6 {
            for c in 1..=2 {
                check_mesh(p, c, Some(SECRET));
            }
        }
    }

    #[test]
    fn one_rank_forms_alone() {
        let nodes = vec![vec!["127.0.0.1:1".to_string()]];
        let f = connect(&addrs(&nodes, 0), &Options::default()).unwrap();
        assert_eq!((f.rank, f.size, f.peers.len()), (0, 1, 1));
    }

    /// Runs both ranks of a pair and returns each one's error.
    fn pair_fails(a: (RingAddresses, Options), b: (RingAddresses, Options)) -> [Error; 2] {
        let mut errors = start(vec![a, b]).into_iter().map(|h| {
            let (result, took) = h.join().unwrap();
            let e = result.expect_err("the pair formed");
            assert!(took < Duration::from_secs(5), "failed after {took:?}: {e}");
            e
        });
        [errors.next().unwrap(), errors.next().unwrap()]
    }

    #[test]
    fn another_hostfile_is_rejected_on_both_sides_naming_the_file() {
        let nodes = hostfile(2, 1);
        let mut other = addrs(&nodes, 1);
        // The same ports, written another way: another hostfile.
        other.all[0][0] = other.all[0][0].replace("127.0.0.1", "127.0.0.01");
        let t = Duration::from_secs(20);
        for e in pair_fails(
            (addrs(&nodes, 0), options(t, None)),
            (other, options(t, None)),
        ) {
            let text = e.to_string();
            assert!(
                matches!(e, Error::PeerIncompatible { .. })
                    && text.contains("belongs to another group")
                    && text.contains("same hostfile (MLX_HOSTFILE)"),
                "{text}"
            );
        }
    }

    #[test]
    fn another_key_or_none_is_rejected_on_both_sides() {
        let t = Duration::from_secs(20);
        let nodes = hostfile(2, 1);
        for e in pair_fails(
            (addrs(&nodes, 0), options(t, Some(SECRET))),
            (
                addrs(&nodes, 1),
                options(t, Some("another secret of enough length")),
            ),
        ) {
            assert!(
                matches!(&e, Error::Auth { reason, .. } if reason.contains("holds another key")),
                "{e}"
            );
        }
        let nodes = hostfile(2, 1);
        let [keyed, unkeyed] = pair_fails(
            (addrs(&nodes, 0), options(t, Some(SECRET))),
            (addrs(&nodes, 1), options(t, None)),
        );
        assert!(
            matches!(&keyed, Error::PeerIncompatible { peer: 1, reason, .. }
                if reason.contains("has no key (NUVEC_DISTRIBUTED_KEY), and this rank has one")),
            "{keyed}"
        );
        assert!(
            matches!(&unkeyed, Error::PeerIncompatible { peer: 0, reason, .. }
                if reason.contains("has a key (NUVEC_DISTRIBUTED_KEY), and this rank has none")),
            "{unkeyed}"
        );
    }

    /// Rank 0 of a pair against a stand-in for rank 1 that, on both connections (the one it
    /// accepts and the one it dials), writes `bytes` and then holds the connection open.
    fn against(bytes: Vec<u8>, timeout: Duration, key: Option<&str>) -> (Error, Duration) {
        let nodes = hostfile(2, 1);
        let a0 = addrs(&nodes, 0);
        let (p0, p1) = (a0.listen[0], a0.right[0]);
        let listener = std::net::TcpListener::bind(p1).unwrap();
        let rank0 = start(vec![(a0, options(timeout, key))]).pop().unwrap();
        let (stop, stopped) = mpsc::channel::<()>();
        let fake = thread::spawn(move || {
            let mut held = Vec::new();
            let until = Instant::now() + Duration::from_secs(10);
            let mut dialled = loop {
                match std::net::TcpStream::connect(p0) {
                    Ok(s) => break s,
                    Err(_) if Instant::now() < until => thread::sleep(Duration::from_millis(2)),
                    Err(e) => panic!("rank 0 never listened: {e}"),
                }
            };
            let _ = std::io::Write::write_all(&mut dialled, &bytes);
            held.push(dialled);
            let (mut accepted, _) = listener.accept().unwrap();
            let _ = std::io::Write::write_all(&mut accepted, &bytes);
            held.push(accepted);
            let _ = stopped.recv_timeout(Duration::from_secs(30));
        });
        let (result, took) = rank0.join().unwrap();
        let _ = stop.send(());
        fake.join().unwrap();
        (result.expect_err("formed with a stand-in"), took)
    }

    const NOT_NATIVE: &str = "rank 1 does not speak the native wire: it sent collective data \
                              instead of a hello (an MLX rank, or a nuvec rank without \
                              NUVEC_DISTRIBUTED_WIRE=native)";

    #[test]
    fn a_rank_sending_data_is_named_at_once() {
        let long = Duration::from_secs(20);
        for key in [None, Some(SECRET)] {
            let (e, took) = against(2.0f32.to_le_bytes().to_vec(), long, key);
            // Rank 0 may see the data first on either connection: the one it dialled names
            // rank 1 for sure, the one it accepted tentatively.
            assert!(took < Duration::from_secs(3), "took {took:?}: {e}");
            let text = e.to_string();
            assert!(
                text.contains(NOT_NATIVE)
                    || text.contains("(rank 1, if it is the connection expected at")
                        && text.contains("does not speak the native wire: it sent collective data"),
                "{text}"
            );
        }
    }

    #[test]
    fn other_versions_and_wires_are_named_at_once() {
        let long = Duration::from_secs(20);
        let mut v3 = hello::Hello::plain(2, 1, 0, Kind::Ring(0)).encode();
        v3[8] = 3;
        let mlx_keyed = auth::Hello::new(2, 1, 0, 0).unwrap().encode().to_vec();
        for (bytes, says) in [
            (
                v3.to_vec(),
                "sent native hello version 3, and this build speaks version 2",
            ),
            (
                auth::NO_KEY.to_vec(),
                "is on the MLX wire: it answered this rank's hello as a nuvec rank on the MLX \
                 wire without a key does",
            ),
            (
                mlx_keyed,
                "is on the MLX wire: it opened the MLX wire's keyed handshake (version 1)",
            ),
        ] {
            let (e, took) = against(bytes, long, None);
            assert!(took < Duration::from_secs(3), "took {took:?}: {e}");
            assert!(matches!(e, Error::PeerIncompatible { .. }), "{e:?}");
            assert!(e.to_string().contains(says), "{e}");
        }
    }

    #[test]
    fn a_broken_hello_is_misbehaviour_named_at_once() {
        let mut broken = hello::Hello::plain(2, 1, 0, Kind::Accepted(0)).encode();
        broken[9] = 1;
        let (e, took) = against(broken.to_vec(), Duration::from_secs(20), None);
        assert!(took < Duration::from_secs(3), "took {took:?}: {e}");
        assert!(
            matches!(&e, Error::PeerMisbehaved { peer: 1, reason, .. }
                if reason.contains("rank 1 sent a hello with reserved bytes set")),
            "{e}"
        );
    }

    #[test]
    fn silence_is_named_at_the_deadline_with_the_likely_cause() {
        let short = Duration::from_millis(400);
        let (e, took) = against(Vec::new(), short, None);
        assert!(
            took >= short && took < Duration::from_secs(3),
            "took {took:?}: {e}"
        );
        assert!(
            matches!(&e, Error::PeerIncompatible { peer: 1, reason, .. }
                if reason.contains("sent no hello within 400ms: it likely does not speak the \
                                    native wire (an MLX rank, or a nuvec rank without \
                                    NUVEC_DISTRIBUTED_WIRE=native)")),
            "{e}"
        );
    }

    #[test]
    fn a_port_scanner_does_not_break_setup() {
        for key in [None, Some(SECRET)] {
            let nodes = hostfile(4, 2);
            let t = Duration::from_secs(20);
            let first = addrs(&nodes, 0);
            let scanned: Vec<SocketAddr> = first.listen.clone();
            let rank0 = start(vec![(first, options(t, key))]).pop().unwrap();
            // Connects to each of rank 0's addresses and closes, a few times, before the
            // other ranks start.
            let until = Instant::now() + Duration::from_secs(10);
            let mut scans = 0;
            while scans < 6 {
                for &a in &scanned {
                    match std::net::TcpStream::connect(a) {
                        Ok(s) => {
                            drop(s);
                            scans += 1;
                        }
                        Err(_) => {
                            assert!(Instant::now() < until, "rank 0 never listened");
                            thread::sleep(Duration::from_millis(2));
                        }
                    }
                }
            }
            let others = start(
                (1..4)
                    .map(|r| (addrs(&nodes, r), options(t, key)))
                    .collect(),
            );
            let (r0, _) = rank0.join().unwrap();
            r0.unwrap();
            for h in others {
                h.join().unwrap().0.unwrap();
            }
        }
    }

    /// Reads from an MLX-wire ring's connection until it fails; the error it reports.
    /// Waits for a native rank formed against an MLX-wire rank 1: it fails within 5 s,
    /// blaming rank 1 as incompatible with an error that says `says`.
    fn native_refuses_the_mlx_wire(
        native: thread::JoinHandle<(Result<Formed>, Duration)>,
        says: &str,
    ) {
        let (result, took) = native.join().unwrap();
        let e = result.expect_err("formed against the MLX wire");
        assert!(took < Duration::from_secs(5), "took {took:?}");
        assert!(
            matches!(&e, Error::PeerIncompatible { peer: 1, .. }) && e.to_string().contains(says),
            "{e}"
        );
    }

    fn first_failure(mut t: Connections) -> Error {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut buf = [0u8; 64];
        loop {
            match t.conn(0).read(&mut buf) {
                Err(e) => return t.conn(0).failed(PeerOp::Receive, Phase::AllSum, e),
                Ok(Transfer::Blocked) => {
                    assert!(Instant::now() < deadline, "nothing arrived");
                    t.wait(deadline, None).unwrap();
                }
                Ok(other) => panic!("the native hello was taken for data: {other:?}"),
            }
        }
    }

    #[test]
    fn an_mlx_wire_rank_and_a_native_one_name_each_other() {
        let t = Duration::from_secs(20);
        // Without a key: the MLX-wire rank forms (no bytes are exchanged on its wire) and
        // finds the native hello on its first receive; its NO_KEY reply names it.
        let nodes = hostfile(2, 1);
        let native = start(vec![(addrs(&nodes, 0), options(t, None))])
            .pop()
            .unwrap();
        let ring_addrs = addrs(&nodes, 1);
        let ring = crate::ring::bootstrap::connect(&ring_addrs, &options(t, None)).unwrap();
        let e = first_failure(ring);
        assert!(
            matches!(&e, Error::PeerIncompatible { peer: 0, reason, .. }
                if reason.contains("rank 0 runs the native wire and this rank the MLX wire")),
            "{e}"
        );
        native_refuses_the_mlx_wire(native, "is on the MLX wire");
        // With a key on the MLX-wire rank: its handshake names the native hello, and the
        // native rank its keyed greeting.
        let nodes = hostfile(2, 1);
        let native = start(vec![(addrs(&nodes, 0), options(t, None))])
            .pop()
            .unwrap();
        let started = Instant::now();
        let e = crate::ring::bootstrap::connect(&addrs(&nodes, 1), &options(t, Some(SECRET)))
            .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(5), "{e}");
        assert!(
            matches!(&e, Error::PeerIncompatible { peer: 0, reason, .. }
                if reason.contains("runs the native wire (NUVEC_DISTRIBUTED_WIRE=native)")),
            "{e}"
        );
        native_refuses_the_mlx_wire(native, "MLX wire's keyed handshake");
    }
}
