//! Forming the native wire's mesh: the ring's connections plus one between every pair of
//! ranks that are not neighbours, each through the hello of [`super::hello`] (and, with a
//! key, the authentication of [`crate::auth`] bound to it).
//!
//! Connections are those of the ring (rank `r` dials its right neighbour's address `i` for
//! every `i`, and accepts the left neighbour's on its own address `i`), plus, for every pair
//! of ranks `a < b` that are not neighbours (only from 4 ranks on), one that `a` dials to
//! `b`'s first address. So a rank's first address receives ring and mesh connections alike:
//! the acceptor tells them apart by the connector's hello, never by arrival order. As the
//! ring's setup does ([`crate::ring::bootstrap`]), a rank listens on all its addresses at
//! once, dials concurrently and retries refused connections quickly until the deadline.
//!
//! Every rank speaks first on every connection, so a peer that is not native is named as
//! soon as its first bytes arrive (see [`super::hello`]) and setup fails at once; a peer
//! that sends nothing is named at the deadline, with that as the likely cause. A client
//! that connects and closes before its hello (a port scanner) is passed over. One that
//! sends data instead of a hello fails setup at once, as an MLX rank does: whoever can
//! reach a forming group's ports can abort it that way, but cannot join it.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};

use super::hello::{self, Expect, Identity, Kind};
use super::{Formed, Peer};
use crate::auth::{self, Fault, Handshake, Key, Outcome};
use crate::error::{Error, PeerOp, Phase, Result};
use crate::hostfile::RingAddresses;
use crate::options::Options;
use crate::ring::bootstrap::{FIRST_RETRY, next_backoff, pump};
use crate::tcp::{self, SocketTuning};
use crate::verbose::verbose;

const CONTEXT: Phase = Phase::RingSetup;

/// Tokens: listeners from 0, outgoing connections from `DIAL_BASE`, accepted candidates
/// from `CANDIDATE_BASE`.
const DIAL_BASE: usize = 1 << 16;
const CANDIDATE_BASE: usize = 1 << 24;

/// What a peer that sends nothing is most likely, for the timeout's error.
fn silent_peer(timeout: Duration) -> String {
    format!(
        "it sent no hello within {timeout:?}: it likely does not speak the native wire (an MLX \
         rank, or a nuvec rank without {}=native), or it hangs",
        crate::config::env::WIRE_VAR
    )
}

/// Forms this rank's part of the native mesh within `options.timeout`.
#[allow(dead_code, reason = "wired into init with the native data path")]
pub(crate) fn connect(addrs: &RingAddresses, options: &Options) -> Result<Formed> {
    let key = options.key.as_ref().map(auth::Secret::key).transpose()?;
    if let Some(algorithm) = &options.tcp_congestion {
        tcp::check_congestion(algorithm).map_err(|e| {
            Error::invalid(format!(
                "Options::tcp_congestion ({} for init): {e}",
                crate::config::env::TCP_CONGESTION_VAR
            ))
        })?;
    }
    let rank = addrs.rank;
    verbose!(
        rank,
        "forming a native mesh of {} ({} connection(s) per neighbour{}): listening on {:?}",
        addrs.size,
        addrs.listen.len(),
        if key.is_some() { ", authenticated" } else { "" },
        addrs.listen,
    );
    ffi::probes::register();
    let started = Instant::now();
    let tuning = SocketTuning::from_options(options);
    let result = form(
        addrs,
        tuning,
        key,
        crate::options::deadline(started, options.timeout),
        options.timeout,
    );
    let (ranks, connections) = (addrs.size as u64, addrs.listen.len() as u64);
    let elapsed = started.elapsed().as_nanos() as u64;
    ffi::probes::connect_done(rank as u64, ranks, connections, elapsed, result.is_ok());
    match &result {
        Ok(_) => verbose!(rank, "native mesh formed in {:?}", started.elapsed()),
        Err(e) => verbose!(
            rank,
            "forming the native mesh failed after {:?}: {e}",
            started.elapsed()
        ),
    }
    result
}

fn form(
    addrs: &RingAddresses,
    tuning: SocketTuning,
    key: Option<Key>,
    deadline: Instant,
    timeout: Duration,
) -> Result<Formed> {
    let mut setup = Setup::new(addrs, tuning, key)?;
    loop {
        setup.start_due_dials()?;
        if let Some(error) = setup.failure.take() {
            return Err(error);
        }
        if setup.formed() {
            return setup.finish();
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(setup.give_up(timeout));
        }
        let wake = setup.next_retry().unwrap_or(deadline).min(deadline);
        match setup
            .poll
            .poll(&mut setup.events, Some(wake.saturating_duration_since(now)))
        {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::local("waiting to form the native mesh", e)),
        }
        let tokens: Vec<usize> = setup.events.iter().map(|e| e.token().0).collect();
        for token in tokens {
            if token < DIAL_BASE {
                setup.accept(token)?;
            } else if token < CANDIDATE_BASE {
                setup.progress_dial(token - DIAL_BASE);
            } else {
                setup.progress_candidate(token - CANDIDATE_BASE);
            }
        }
    }
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
    /// Ready, with what the peer said about itself.
    Up(TcpStream, Peer),
}

/// An accepted connection not yet placed.
struct Candidate {
    stream: TcpStream,
    /// The listening address (index) it arrived on.
    slot: usize,
    from: SocketAddr,
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
    /// Kept open until the mesh forms, so that a scanner never takes a slot.
    #[allow(dead_code, reason = "held only to keep the addresses open")]
    listeners: Vec<TcpListener>,
    targets: Vec<Target>,
    dials: Vec<Dial>,
    backoff: Vec<Duration>,
    /// Why each outgoing connection last failed, for the error at the deadline.
    dial_failures: Vec<Option<String>>,
    candidates: Vec<Option<Candidate>>,
    /// The left neighbour's ring connections, by index.
    ring_in: Vec<Option<(TcpStream, Peer)>>,
    /// The lower non-neighbours' mesh connections, by rank.
    mesh_in: Vec<Option<(TcpStream, Peer)>>,
    /// Ranks that must dial this one's first address for the mesh.
    mesh_from: Vec<usize>,
    /// The last client passed over on each address, for the error at the deadline.
    passed_over: Vec<Option<(SocketAddr, String)>>,
    /// A failure that ends setup at once.
    failure: Option<Error>,
}

impl<'a> Setup<'a> {
    fn new(addrs: &'a RingAddresses, tuning: SocketTuning, key: Option<Key>) -> Result<Self> {
        let (me, size) = (addrs.rank, addrs.size);
        let word = |v: usize| {
            u32::try_from(v).map_err(|_| Error::invalid(format!("{v} ranks do not fit a hello")))
        };
        let expect = Expect {
            me: word(me)?,
            identity: Identity {
                capabilities: 0,
                size: word(size)?,
                group: hello::group_identity(&addrs.all, key.as_ref()),
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
        let poll = Poll::new().map_err(|e| Error::local("creating the mesh's poller", e))?;
        let mut listeners = Vec::with_capacity(addrs.listen.len());
        for (i, &addr) in addrs.listen.iter().enumerate() {
            let mut listener = tcp::listen(addr, &tuning).map_err(|e| {
                Error::local(
                    format!("rank {me} cannot listen on {addr} (its address {i})"),
                    e,
                )
            })?;
            poll.registry()
                .register(&mut listener, Token(i), Interest::READABLE)
                .map_err(|e| Error::local("registering a listener", e))?;
            listeners.push(listener);
        }
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
            passed_over: vec![None; c],
            failure: None,
        })
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
            match tcp::dial(self.targets[i].addr, &self.tuning) {
                Ok(mut stream) => {
                    self.poll
                        .registry()
                        .register(
                            &mut stream,
                            Token(DIAL_BASE + i),
                            Interest::READABLE | Interest::WRITABLE,
                        )
                        .map_err(|e| Error::local("registering a connection", e))?;
                    self.dials[i] = Dial::Connecting(stream);
                }
                Err(e) => self.retry(i, e.to_string()),
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
        if let Dial::Connecting(mut s) | Dial::Handshake(mut s, _) | Dial::Up(mut s, _) = old {
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
                Err(e) => return self.retry(i, e.to_string()),
            }
        }
        let Dial::Handshake(stream, hs) = &mut self.dials[i] else {
            return;
        };
        if let Err(e) = pump(stream, &mut **hs) {
            return self.retry(i, e.to_string());
        }
        let peer = hs.peer_hello().map(|h| Peer {
            host: h.identity.host,
            capabilities: h.identity.capabilities,
        });
        match hs.outcome().clone() {
            Outcome::Pending => {}
            Outcome::Established => {
                if let (Dial::Handshake(mut s, _), Some(peer)) = (
                    std::mem::replace(&mut self.dials[i], Dial::Idle(Instant::now())),
                    peer,
                ) {
                    let _ = self.poll.registry().deregister(&mut s);
                    self.dials[i] = Dial::Up(s, peer);
                }
            }
            // The peer left before its hello: it may be restarting; try again.
            Outcome::Rejected(r) if r.fault == Fault::Peer && hs.peer_hello().is_none() => {
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

    fn accept(&mut self, slot: usize) -> Result<()> {
        loop {
            let Some(listener) = self.listeners.get_mut(slot) else {
                return Ok(());
            };
            let (mut stream, from) = match listener.accept() {
                Ok(accepted) => accepted,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if tcp::is_transient_accept_error(&e) => continue,
                Err(e) => {
                    return Err(Error::Io {
                        peer: self.addrs.left_rank(),
                        addr: Some(self.addrs.listen[slot]),
                        op: PeerOp::Accept,
                        context: CONTEXT,
                        source: e.into(),
                    });
                }
            };
            let id = self.candidates.len();
            self.poll
                .registry()
                .register(
                    &mut stream,
                    Token(CANDIDATE_BASE + id),
                    Interest::READABLE | Interest::WRITABLE,
                )
                .map_err(|e| Error::local("registering an accepted connection", e))?;
            let acceptor = hello::Acceptor::new(self.expect.clone(), self.key, slot as u32);
            self.candidates.push(Some(Candidate {
                stream,
                slot,
                from,
                acceptor: Box::new(acceptor),
            }));
            self.progress_candidate(id);
        }
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
                            *s = Some((c.stream, peer));
                        }
                    }
                    Place::Mesh(r) => {
                        if let Some(s) = self.mesh_in.get_mut(r) {
                            *s = Some((c.stream, peer));
                        }
                    }
                }
            }
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
                if r.fault == Fault::Peer && r.claimed.is_none() {
                    // A scanner, or a client that broke off before saying who it is: pass
                    // over it, and mention it if the mesh does not form.
                    self.passed_over[c.slot] = Some((c.from, format!("{who} {}", r.reason)));
                } else {
                    let peer = r.claimed.unwrap_or(self.addrs.left_rank());
                    let reason = format!("{who} {}", r.reason);
                    self.fail(refusal(r.fault, peer, Some(c.from), reason));
                }
            }
        }
    }

    /// Hands the formed connections to a transport.
    fn finish(mut self) -> Result<Formed> {
        let (me, size) = (self.addrs.rank, self.addrs.size);
        let (left, right) = (self.addrs.left_rank(), self.addrs.right_rank());
        let mut peers: Vec<Option<Peer>> = vec![None; size];
        if let Some(own) = peers.get_mut(me) {
            *own = Some(Peer {
                host: self.expect.identity.host,
                capabilities: self.expect.identity.capabilities,
            });
        }
        let mut left_conns = Vec::with_capacity(self.ring_in.len());
        for (slot, &addr) in self.ring_in.drain(..).zip(&self.addrs.listen) {
            if let Some((stream, peer)) = slot {
                peers[left] = Some(peer);
                left_conns.push((stream, left, addr));
            }
        }
        let mut right_conns = Vec::new();
        let mut others = Vec::new();
        for (dial, target) in self.dials.drain(..).zip(&self.targets) {
            if let Dial::Up(stream, peer) = dial {
                peers[target.peer] = Some(peer);
                match target.kind {
                    Kind::Ring(_) => right_conns.push((stream, right, target.addr)),
                    Kind::Mesh | Kind::Accepted(_) => others.push((stream, target.peer, target.addr)),
                }
            }
        }
        for (rank, slot) in self.mesh_in.drain(..).enumerate() {
            if let Some((stream, peer)) = slot {
                peers[rank] = Some(peer);
                let addr = stream
                    .peer_addr()
                    .unwrap_or_else(|_| self.addrs.listen[0]);
                others.push((stream, rank, addr));
            }
        }
        others.sort_by_key(|&(_, rank, _)| rank);
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
        let transport = crate::ring::transport::Transport::mesh(
            self.poll,
            me,
            size,
            left_conns,
            right_conns,
            others,
            &self.tuning.liveness,
        )
        .map_err(|e| Error::local("setting up the mesh's connections", e))?;
        Ok(Formed {
            transport,
            rank: me,
            size,
            peers,
            local_ranks: self.addrs.local_ranks,
        })
    }

    /// The error for a mesh that did not form by the deadline: the first connection this
    /// rank could not open or finish, else the first that never arrived.
    fn give_up(mut self, timeout: Duration) -> Error {
        for (i, dial) in self.dials.iter().enumerate() {
            let target = self.targets[i];
            let (peer, addr) = (target.peer, Some(target.addr));
            return match dial {
                Dial::Up(..) => continue,
                Dial::Handshake(_, hs) if hs.peer_hello().is_none() => Error::PeerIncompatible {
                    peer,
                    addr,
                    context: CONTEXT,
                    reason: format!("rank {peer} accepted {} but {}", target.kind, silent_peer(timeout)),
                },
                Dial::Handshake(..) => Error::Auth {
                    peer,
                    addr,
                    context: CONTEXT,
                    reason: format!(
                        "rank {peer} did not finish authenticating within {timeout:?}"
                    ),
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
        // A connection that arrived and said nothing.
        if let Some(c) = self.candidates.iter().flatten().find(|c| c.acceptor.peer_hello().is_none()) {
            let who = self.tentative(c.slot, c.from);
            return Error::PeerIncompatible {
                peer: self.addrs.left_rank(),
                addr: Some(c.from),
                context: CONTEXT,
                reason: format!("{who} {}", silent_peer(timeout)),
            };
        }
        let missing_ring = self.ring_in.iter().position(Option::is_none);
        let missing_mesh = self.mesh_from.iter().copied().find(|&r| self.mesh_in[r].is_none());
        let (peer, slot) = match (missing_ring, missing_mesh) {
            (Some(i), _) => (self.addrs.left_rank(), i),
            (None, Some(r)) => (r, 0),
            (None, None) => (self.addrs.left_rank(), 0),
        };
        let listen = self.addrs.listen.get(slot).copied();
        match self.passed_over.get_mut(slot).and_then(Option::take) {
            Some((from, why)) => Error::PeerMisbehaved {
                peer,
                addr: Some(from),
                context: CONTEXT,
                reason: format!(
                    "{why}; no connection from rank {peer} completed its hello at {} within \
                     {timeout:?}",
                    listen.map_or_else(String::new, |a| a.to_string())
                ),
            },
            None => Error::Timeout {
                peer,
                addr: listen,
                op: PeerOp::Accept,
                context: CONTEXT,
                after: timeout,
            },
        }
    }
}
