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
//! join the ring nor keep the real neighbour out.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use socket2::{Domain, Socket, Type};

use super::transport::Transport;
use crate::auth::{self, Challenge, Hello, Key, Role};
use crate::error::{Error, PeerOp, Result};
use crate::hostfile::RingAddresses;
use crate::options::Options;
use crate::verbose::verbose;

const CONTEXT: &str = "ring setup";

/// The first retry of a refused connection; doubled after each refusal up to the cap.
const FIRST_RETRY: Duration = Duration::from_millis(10);
const MAX_RETRY: Duration = Duration::from_millis(250);

/// How long an accepted connection must have been up before it may be taken, without a key.
const SETTLE: Duration = Duration::from_millis(20);

/// Tokens: listeners from 0, outgoing connections from `DIAL_BASE`, accepted candidates
/// from `CANDIDATE_BASE`.
const DIAL_BASE: usize = 1 << 16;
const CANDIDATE_BASE: usize = 1 << 24;

/// Forms this rank's part of the ring within `options.timeout`.
pub(crate) fn connect(addrs: &RingAddresses, options: &Options) -> Result<Transport> {
    let key = options.key.as_ref().map(auth::Secret::key).transpose()?;
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
    ffi::probes::register();
    let started = Instant::now();
    let result = form(addrs, options, key, started + options.timeout);
    let (ranks, connections) = (addrs.size as u64, addrs.listen.len() as u64);
    let elapsed = started.elapsed().as_nanos() as u64;
    ffi::probes::connect_done(rank as u64, ranks, connections, elapsed, result.is_ok());
    match &result {
        Ok(_) => verbose!(rank, "ring formed in {:?}", started.elapsed()),
        Err(e) => verbose!(
            rank,
            "forming the ring failed after {:?}: {e}",
            started.elapsed()
        ),
    }
    result
}

/// The setup loop: retries, accepts and handshakes until the ring is formed, a neighbour
/// refused us, or `deadline` passes.
fn form(
    addrs: &RingAddresses,
    options: &Options,
    key: Option<Key>,
    deadline: Instant,
) -> Result<Transport> {
    let mut setup = Setup::new(addrs, options, key)?;
    loop {
        setup.start_due_dials()?;
        if setup.formed() {
            return setup.finish();
        }
        if let Some(error) = setup.refused() {
            return Err(error);
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(setup.give_up(options.timeout));
        }
        let wake = setup.next_retry().unwrap_or(deadline).min(deadline);
        match setup
            .poll
            .poll(&mut setup.events, Some(wake.saturating_duration_since(now)))
        {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::local("waiting to form the ring", e)),
        }
        let tokens: Vec<usize> = setup.events.iter().map(|e| e.token().0).collect();
        for token in tokens {
            if token < DIAL_BASE {
                setup.accept(token)?;
            } else if token < CANDIDATE_BASE {
                setup.progress_dial(token - DIAL_BASE)?;
            } else {
                setup.progress_candidate(token - CANDIDATE_BASE)?;
            }
        }
    }
}

/// One outgoing connection to the right neighbour.
enum Dial {
    /// Waiting to (re)try at the instant.
    Idle(Instant),
    /// A non-blocking connect in flight.
    Connecting(TcpStream),
    /// Connected; running the connector's side of the handshake.
    Handshake(TcpStream, Connector),
    /// Ready for the ring.
    Up(TcpStream),
    /// The neighbour answered but authentication failed; retrying cannot help.
    Refused(String),
}

/// Why an outgoing connection last failed, for the error at the deadline.
enum DialFailure {
    Io(io::Error),
    Auth(String),
}

/// The connector's side of the handshake.
struct Connector {
    hello: Hello,
    /// Bytes still to send (the hello, then the proof).
    out: Vec<u8>,
    sent: usize,
    /// The challenge, then the verdict, being read.
    inbuf: [u8; Challenge::LEN],
    got: usize,
    awaiting_verdict: bool,
}

/// An accepted connection not yet taken into the ring.
struct Candidate {
    stream: TcpStream,
    /// When it was accepted.
    arrived: Instant,
    /// The listening address (connection index) it arrived on.
    slot: usize,
    from: SocketAddr,
    acceptor: Acceptor,
}

/// The acceptor's side of the handshake.
enum Acceptor {
    /// No key: nothing to exchange; the connection waits to be chosen.
    Unkeyed,
    ReadHello {
        buf: [u8; Hello::LEN],
        got: usize,
    },
    SendChallenge {
        hello: Hello,
        nonce: [u8; 32],
        out: [u8; Challenge::LEN],
        sent: usize,
    },
    ReadProof {
        hello: Hello,
        nonce: [u8; 32],
        buf: [u8; 32],
        got: usize,
    },
    SendVerdict {
        hello: Hello,
        ok: bool,
    },
}

struct Setup<'a> {
    addrs: &'a RingAddresses,
    options: &'a Options,
    key: Option<Key>,
    poll: Poll,
    events: Events,
    listeners: Vec<Option<TcpListener>>,
    dials: Vec<Dial>,
    backoff: Vec<Duration>,
    dial_failures: Vec<Option<DialFailure>>,
    /// Accepted connections under handshake, by id (token - CANDIDATE_BASE).
    candidates: Vec<Option<Candidate>>,
    /// The left neighbour's connections, by index, once taken.
    slots: Vec<Option<TcpStream>>,
    /// Why clients on each of our addresses were turned away, for the error at the deadline.
    rejected: Vec<Option<(usize, SocketAddr, String)>>,
}

impl<'a> Setup<'a> {
    fn new(addrs: &'a RingAddresses, options: &'a Options, key: Option<Key>) -> Result<Self> {
        let poll = Poll::new().map_err(|e| Error::local("creating the ring's poller", e))?;
        let mut listeners = Vec::with_capacity(addrs.listen.len());
        for (i, &addr) in addrs.listen.iter().enumerate() {
            let mut listener = listen(addr, options).map_err(|e| {
                Error::local(
                    format!(
                        "rank {} cannot listen on {addr} (its address {i})",
                        addrs.rank
                    ),
                    e,
                )
            })?;
            poll.registry()
                .register(&mut listener, Token(i), Interest::READABLE)
                .map_err(|e| Error::local("registering a listener", e))?;
            listeners.push(Some(listener));
        }
        let now = Instant::now();
        let c = addrs.listen.len();
        Ok(Setup {
            addrs,
            options,
            key,
            poll,
            events: Events::with_capacity(64),
            listeners,
            dials: (0..c).map(|_| Dial::Idle(now)).collect(),
            backoff: vec![FIRST_RETRY; c],
            dial_failures: (0..c).map(|_| None).collect(),
            candidates: Vec::new(),
            slots: (0..c).map(|_| None).collect(),
            rejected: (0..c).map(|_| None).collect(),
        })
    }

    fn formed(&mut self) -> bool {
        if !self.dials.iter().all(|d| matches!(d, Dial::Up(_))) {
            return false;
        }
        if self.key.is_none() {
            self.choose_unkeyed();
        }
        self.slots.iter().all(Option::is_some)
    }

    /// Without a key, takes for each address the first connection that is still open (the
    /// order of arrival is MLX's rule) and closes the address. A connection is only judged
    /// once it has been up for [`SETTLE`], so that a scanner's close has time to arrive.
    fn choose_unkeyed(&mut self) {
        for id in 0..self.candidates.len() {
            let Some(c) = &self.candidates[id] else {
                continue;
            };
            if self.slots[c.slot].is_some() {
                continue;
            }
            if c.arrived.elapsed() < SETTLE {
                // Later candidates for this address arrived later still: wait for this one.
                continue;
            }
            let mut byte = [0u8; 1];
            let closed = match c.stream.peek(&mut byte) {
                Ok(0) => true,
                Ok(_) => false,
                Err(e) => e.kind() != io::ErrorKind::WouldBlock,
            };
            if let Some(mut c) = self.candidates[id].take() {
                let _ = self.poll.registry().deregister(&mut c.stream);
                if !closed {
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
        let i = self
            .dials
            .iter()
            .position(|d| matches!(d, Dial::Refused(_)))?;
        let settled =
            (0..self.slots.len()).all(|s| self.slots[s].is_some() || self.rejected[s].is_some());
        let Dial::Refused(reason) = &self.dials[i] else {
            return None;
        };
        settled.then(|| Error::Auth {
            peer: self.addrs.right_rank(),
            addr: Some(self.addrs.right[i]),
            context: CONTEXT,
            reason: reason.clone(),
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
            match open_connection(self.addrs.right[i], self.options) {
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
                Err(e) => self.retry(i, DialFailure::Io(e)),
            }
        }
        Ok(())
    }

    /// Drops outgoing connection `i` and schedules another attempt.
    fn retry(&mut self, i: usize, why: DialFailure) {
        let old = std::mem::replace(
            &mut self.dials[i],
            Dial::Idle(Instant::now() + self.backoff[i]),
        );
        if let Dial::Connecting(mut s) | Dial::Handshake(mut s, _) = old {
            let _ = self.poll.registry().deregister(&mut s);
        }
        self.backoff[i] = (self.backoff[i] * 2).min(MAX_RETRY);
        if let DialFailure::Io(e) = &why {
            verbose!(
                self.addrs.rank,
                "connection {i} to {} failed ({e}); retrying",
                self.addrs.right[i]
            );
        }
        self.dial_failures[i] = Some(why);
    }

    fn progress_dial(&mut self, i: usize) -> Result<()> {
        loop {
            let step = match &mut self.dials[i] {
                Dial::Connecting(stream) => match connect_outcome(stream) {
                    Ok(false) => return Ok(()),
                    Ok(true) => match &self.key {
                        None => DialStep::Up,
                        Some(_) => {
                            let hello = Hello::new(
                                self.addrs.size,
                                self.addrs.rank,
                                self.addrs.right_rank(),
                                i,
                            )?;
                            DialStep::StartHandshake(hello)
                        }
                    },
                    Err(e) => DialStep::Failed(DialFailure::Io(e)),
                },
                Dial::Handshake(stream, hs) => {
                    match self.key.as_ref().map(|k| hs.advance(stream, k)) {
                        Some(Ok(true)) => DialStep::Up,
                        Some(Ok(false)) => return Ok(()),
                        Some(Err(why)) => DialStep::Failed(why),
                        None => return Ok(()),
                    }
                }
                Dial::Idle(_) | Dial::Up(_) | Dial::Refused(_) => return Ok(()),
            };
            match step {
                DialStep::Up => {
                    if let Dial::Connecting(s) | Dial::Handshake(s, _) =
                        std::mem::replace(&mut self.dials[i], Dial::Idle(Instant::now()))
                    {
                        self.dials[i] = Dial::Up(s);
                    }
                    return Ok(());
                }
                DialStep::StartHandshake(hello) => {
                    if let Dial::Connecting(s) =
                        std::mem::replace(&mut self.dials[i], Dial::Idle(Instant::now()))
                    {
                        let hs = Connector {
                            hello,
                            out: hello.encode().to_vec(),
                            sent: 0,
                            inbuf: [0; Challenge::LEN],
                            got: 0,
                            awaiting_verdict: false,
                        };
                        self.dials[i] = Dial::Handshake(s, hs);
                    }
                    // Go round again: the socket is writable now.
                }
                DialStep::Failed(why) => {
                    // An authentication failure is final: the peer answered, and retrying
                    // cannot change its key. A connection failure is retried.
                    match why {
                        DialFailure::Auth(reason) => {
                            if let Dial::Connecting(mut s) | Dial::Handshake(mut s, _) =
                                std::mem::replace(&mut self.dials[i], Dial::Refused(reason))
                            {
                                let _ = self.poll.registry().deregister(&mut s);
                            }
                        }
                        why @ DialFailure::Io(_) => self.retry(i, why),
                    }
                    return Ok(());
                }
            }
        }
    }

    /// Takes what the listener for address `slot` has to offer.
    fn accept(&mut self, slot: usize) -> Result<()> {
        loop {
            let Some(listener) = self.listeners[slot].as_mut() else {
                return Ok(());
            };
            let (mut stream, from) = match listener.accept() {
                Ok(accepted) => accepted,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if is_transient_accept_error(&e) => continue,
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
            let acceptor = match self.key {
                None => Acceptor::Unkeyed,
                Some(_) => Acceptor::ReadHello {
                    buf: [0; Hello::LEN],
                    got: 0,
                },
            };
            self.candidates.push(Some(Candidate {
                stream,
                arrived: Instant::now(),
                slot,
                from,
                acceptor,
            }));
            self.progress_candidate(id)?;
        }
    }

    fn close_listener(&mut self, slot: usize) {
        if let Some(mut l) = self.listeners[slot].take() {
            let _ = self.poll.registry().deregister(&mut l);
        }
    }

    fn progress_candidate(&mut self, id: usize) -> Result<()> {
        let (Some(key), Some(Some(candidate))) = (self.key, self.candidates.get_mut(id)) else {
            return Ok(());
        };
        let expect = Expected {
            size: self.addrs.size,
            from: self.addrs.left_rank(),
            to: self.addrs.rank,
            index: candidate.slot,
        };
        if matches!(candidate.acceptor, Acceptor::Unkeyed) {
            return Ok(());
        }
        match candidate
            .acceptor
            .advance(&mut candidate.stream, &key, &expect)
        {
            Ok(false) => Ok(()),
            Ok(true) => {
                if let Some(mut c) = self.candidates[id].take() {
                    let _ = self.poll.registry().deregister(&mut c.stream);
                    if self.slots[c.slot].is_none() {
                        self.slots[c.slot] = Some(c.stream);
                        self.close_listener(c.slot);
                    }
                }
                Ok(())
            }
            Err(rejection) => {
                if let Some(mut c) = self.candidates[id].take() {
                    let _ = self.poll.registry().deregister(&mut c.stream);
                    self.rejected[c.slot] = Some((
                        rejection.claimed.unwrap_or(expect.from),
                        c.from,
                        rejection.reason,
                    ));
                }
                Ok(())
            }
        }
    }

    /// Hands the formed connections to a transport.
    fn finish(mut self) -> Result<Transport> {
        let (left, right) = (self.addrs.left_rank(), self.addrs.right_rank());
        for mut c in self.candidates.drain(..).flatten() {
            let _ = self.poll.registry().deregister(&mut c.stream);
        }
        let left_conns: Vec<_> = self
            .slots
            .drain(..)
            .zip(&self.addrs.listen)
            .filter_map(|(stream, &addr)| stream.map(|s| (s, left, addr)))
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
        Transport::new(
            self.poll,
            self.addrs.rank,
            self.addrs.size,
            left_conns,
            right_conns,
        )
        .map_err(|e| Error::local("setting up the ring's connections", e))
    }

    /// The error for a ring that did not form by the deadline: the connection we could not
    /// open (naming the right neighbour and why), else the one that never arrived (naming
    /// the left neighbour, or the rank a rejected client claimed to be, and why).
    fn give_up(mut self, timeout: Duration) -> Error {
        let (left, right) = (self.addrs.left_rank(), self.addrs.right_rank());
        if let Some(i) = self.dials.iter().position(|d| !matches!(d, Dial::Up(_))) {
            let addr = Some(self.addrs.right[i]);
            let handshaking = matches!(self.dials[i], Dial::Handshake(..));
            if let Dial::Refused(reason) = &self.dials[i] {
                return Error::Auth {
                    peer: right,
                    addr,
                    context: CONTEXT,
                    reason: reason.clone(),
                };
            }
            return match self.dial_failures[i].take() {
                _ if handshaking => Error::Auth {
                    peer: right,
                    addr,
                    context: CONTEXT,
                    reason: format!(
                        "it did not answer the handshake within {timeout:?} (is the key set on \
                         every rank?)"
                    ),
                },
                Some(DialFailure::Io(e)) => Error::Io {
                    peer: right,
                    addr,
                    op: PeerOp::Connect,
                    context: "ring setup (retried until the timeout)",
                    source: e.into(),
                },
                Some(DialFailure::Auth(reason)) => Error::Auth {
                    peer: right,
                    addr,
                    context: CONTEXT,
                    reason,
                },
                None => Error::Timeout {
                    peer: right,
                    addr,
                    op: PeerOp::Connect,
                    context: CONTEXT,
                    after: timeout,
                },
            };
        }
        let i = self.slots.iter().position(Option::is_none).unwrap_or(0);
        match self.rejected[i].take() {
            Some((claimed, from, reason)) => Error::Auth {
                peer: claimed,
                addr: Some(from),
                context: CONTEXT,
                reason: format!(
                    "{reason}; no authenticated connection reached {} within {timeout:?}",
                    self.addrs.listen[i]
                ),
            },
            None => Error::Timeout {
                peer: left,
                addr: Some(self.addrs.listen[i]),
                op: PeerOp::Accept,
                context: CONTEXT,
                after: timeout,
            },
        }
    }
}

enum DialStep {
    Up,
    StartHandshake(Hello),
    Failed(DialFailure),
}

impl Connector {
    /// Moves the connector's handshake on. `Ok(true)` once the acceptor's verdict accepted
    /// us; `Err` with the reason when it failed.
    fn advance(
        &mut self,
        stream: &mut TcpStream,
        key: &Key,
    ) -> std::result::Result<bool, DialFailure> {
        loop {
            if self.sent < self.out.len() {
                match write_some(stream, &self.out[self.sent..]) {
                    Ok(0) => return Ok(false),
                    Ok(n) => {
                        self.sent += n;
                        continue;
                    }
                    Err(e) => return Err(DialFailure::Io(e)),
                }
            }
            if !self.awaiting_verdict {
                match read_exact_some(stream, &mut self.inbuf, &mut self.got) {
                    Ok(false) => return Ok(false),
                    Ok(true) => {}
                    Err(e) => {
                        return Err(closed_or(
                            e,
                            "closed the connection during the handshake (is the key set on every rank?)",
                        ));
                    }
                }
                let challenge = Challenge::decode(&self.inbuf)
                    .map_err(|m| DialFailure::Auth(format!("it sent {m}")))?;
                // Send our proof even if theirs is wrong, so that the acceptor can tell
                // its operator that we did not prove the key either.
                let proof = auth::proof(key, Role::Connector, &self.hello, &challenge.nonce);
                self.out = proof.to_vec();
                self.sent = 0;
                if !auth::verify(
                    key,
                    Role::Acceptor,
                    &self.hello,
                    &challenge.nonce,
                    &challenge.proof,
                ) {
                    let _ = write_some(stream, &self.out);
                    return Err(DialFailure::Auth(
                        "it did not prove the key (the ranks' keys differ)".to_string(),
                    ));
                }
                self.awaiting_verdict = true;
                self.got = 0;
                continue;
            }
            let mut verdict = [0u8; 1];
            let mut got = 0;
            match read_exact_some(stream, &mut verdict, &mut got) {
                Ok(false) => return Ok(false),
                Ok(true) if verdict[0] == 1 => return Ok(true),
                Ok(true) => {
                    return Err(DialFailure::Auth(
                        "it refused this rank's proof".to_string(),
                    ));
                }
                Err(e) => {
                    return Err(closed_or(
                        e,
                        "it closed the connection instead of accepting this rank's proof",
                    ));
                }
            }
        }
    }
}

/// What an acceptor expects a connector to say.
struct Expected {
    size: usize,
    from: usize,
    to: usize,
    index: usize,
}

/// Why an accepted client was turned away.
struct Rejection {
    /// The rank it claimed to be, if it got that far.
    claimed: Option<usize>,
    reason: String,
}

impl Acceptor {
    /// Moves the acceptor's handshake on. `Ok(true)` once the client proved the key and was
    /// told so.
    fn advance(
        &mut self,
        stream: &mut TcpStream,
        key: &Key,
        expect: &Expected,
    ) -> std::result::Result<bool, Rejection> {
        loop {
            match self {
                Acceptor::Unkeyed => return Ok(false),
                Acceptor::ReadHello { buf, got } => {
                    match read_exact_some(stream, buf, got) {
                        Ok(false) => return Ok(false),
                        Ok(true) => {}
                        Err(_) => {
                            return Err(Rejection {
                                claimed: None,
                                reason: "a client closed the connection before saying who it is"
                                    .into(),
                            });
                        }
                    }
                    let hello = Hello::decode(buf).map_err(|m| Rejection {
                        claimed: None,
                        reason: format!("a client sent {m}"),
                    })?;
                    let claimed = Some(hello.from as usize);
                    let fits = hello.size as usize == expect.size
                        && hello.from as usize == expect.from
                        && hello.to as usize == expect.to
                        && hello.index as usize == expect.index;
                    if !fits {
                        return Err(Rejection {
                            claimed,
                            reason: format!(
                                "a client introduced itself as rank {} of {} opening connection {} to \
                                 rank {}, but this address expects rank {} of {} opening connection {} \
                                 to rank {}",
                                hello.from,
                                hello.size,
                                hello.index,
                                hello.to,
                                expect.from,
                                expect.size,
                                expect.index,
                                expect.to
                            ),
                        });
                    }
                    let nonce = auth::acceptor_nonce().map_err(|e| Rejection {
                        claimed,
                        reason: e.to_string(),
                    })?;
                    let proof = auth::proof(key, Role::Acceptor, &hello, &nonce);
                    let out = Challenge { nonce, proof }.encode();
                    *self = Acceptor::SendChallenge {
                        hello,
                        nonce,
                        out,
                        sent: 0,
                    };
                }
                Acceptor::SendChallenge {
                    hello,
                    nonce,
                    out,
                    sent,
                } => {
                    match write_some(stream, &out[*sent..]) {
                        Ok(0) => return Ok(false),
                        Ok(n) => *sent += n,
                        Err(_) => return Err(gone(hello)),
                    }
                    if *sent == out.len() {
                        *self = Acceptor::ReadProof {
                            hello: *hello,
                            nonce: *nonce,
                            buf: [0; 32],
                            got: 0,
                        };
                    }
                }
                Acceptor::ReadProof {
                    hello,
                    nonce,
                    buf,
                    got,
                } => {
                    match read_exact_some(stream, buf, got) {
                        Ok(false) => return Ok(false),
                        Ok(true) => {}
                        Err(_) => return Err(gone(hello)),
                    }
                    let ok = auth::verify(key, Role::Connector, hello, nonce, buf);
                    *self = Acceptor::SendVerdict { hello: *hello, ok };
                }
                Acceptor::SendVerdict { hello, ok } => {
                    match write_some(stream, &[u8::from(*ok)]) {
                        Ok(0) => return Ok(false),
                        Ok(_) => {}
                        Err(_) => return Err(gone(hello)),
                    }
                    if !*ok {
                        return Err(Rejection {
                            claimed: Some(hello.from as usize),
                            reason: format!(
                                "rank {} did not prove the key (the ranks' keys differ)",
                                hello.from
                            ),
                        });
                    }
                    return Ok(true);
                }
            }
        }
    }
}

fn gone(hello: &Hello) -> Rejection {
    Rejection {
        claimed: Some(hello.from as usize),
        reason: format!(
            "a client claiming to be rank {} closed the connection during the handshake (it did \
             not prove the key)",
            hello.from
        ),
    }
}

fn closed_or(e: io::Error, closed: &str) -> DialFailure {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        DialFailure::Auth(closed.to_string())
    } else {
        DialFailure::Io(e)
    }
}

/// Writes what fits without blocking; `Ok(0)` if nothing fits now.
fn write_some(stream: &mut TcpStream, buf: &[u8]) -> io::Result<usize> {
    loop {
        return match stream.write(buf) {
            Ok(n) => Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => Err(e),
        };
    }
}

/// Reads towards filling `buf` (of which `got` bytes are in) without blocking. `Ok(true)`
/// once full; an `UnexpectedEof` error if the peer closed first.
fn read_exact_some(stream: &mut TcpStream, buf: &mut [u8], got: &mut usize) -> io::Result<bool> {
    while *got < buf.len() {
        match stream.read(&mut buf[*got..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => *got += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// A listening socket on `addr`, with `SO_REUSEADDR` so a ring can re-form on the same ports
/// right after the last one closed. Accepted connections inherit its tuning.
fn listen(addr: SocketAddr, options: &Options) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    tune(&socket, options)?;
    socket.bind(&addr.into())?;
    socket.listen(128)?;
    Ok(TcpListener::from_std(socket.into()))
}

/// Starts a non-blocking connection to `addr`, tuned before the handshake so that the
/// buffer sizes shape the window it negotiates.
fn open_connection(addr: SocketAddr, options: &Options) -> io::Result<TcpStream> {
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    socket.set_nonblocking(true)?;
    tune(&socket, options)?;
    match socket.connect(&addr.into()) {
        Ok(()) => {}
        Err(e) if ffi::net::is_in_progress(&e) || e.kind() == io::ErrorKind::WouldBlock => {}
        Err(e) => return Err(e),
    }
    Ok(TcpStream::from_std(socket.into()))
}

/// Applies [`Options::socket_buffer`] and [`Options::tcp_congestion`] to a socket.
fn tune(socket: &Socket, options: &Options) -> io::Result<()> {
    if let Some(bytes) = options.socket_buffer {
        socket.set_send_buffer_size(bytes)?;
        socket.set_recv_buffer_size(bytes)?;
    }
    if let Some(algorithm) = &options.tcp_congestion {
        set_congestion(socket, algorithm)?;
    }
    Ok(())
}

#[cfg(any(target_os = "linux", target_os = "freebsd"))]
fn set_congestion(socket: &Socket, algorithm: &str) -> io::Result<()> {
    socket
        .set_tcp_congestion(algorithm.as_bytes())
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "cannot use TCP congestion control {algorithm:?} ({e}; see \
                 /proc/sys/net/ipv4/tcp_allowed_congestion_control)"
                ),
            )
        })
}

#[cfg(not(any(target_os = "linux", target_os = "freebsd")))]
fn set_congestion(_: &Socket, algorithm: &str) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        format!(
            "choosing the TCP congestion control ({algorithm:?}) is not supported on this system"
        ),
    ))
}

/// Whether a non-blocking connect finished: `Ok(true)` when connected, `Ok(false)` when still
/// in flight (a spurious wake-up), `Err` with the reason when it failed.
fn connect_outcome(stream: &TcpStream) -> io::Result<bool> {
    if let Some(e) = stream.take_error()? {
        return Err(e);
    }
    match stream.peer_addr() {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(false),
        Err(e) => Err(e),
    }
}

/// Errors of `accept` that concern only the one connection being accepted.
fn is_transient_accept_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
    )
}
