//! [`Group::shrink`] and [`Group::rejoin`]: recovering a TCP group after a rank failed.
//!
//! A shrink is an agreement on the survivors ([`agree`]) followed by a formation among
//! them with the bootstrap that formed the group ([`form_ring`]). Both go through each
//! survivor's own first address in the first group's hostfile: a group closes its forming
//! listeners once it has formed, so those ports are free. The agreement is a short
//! rendezvous there: each survivor listens on its address and reports to the coordinator
//! of its view, which answers with the members (see [`agree`] for the rules). It says
//! to form only once every member has answered that its rendezvous listener is closed:
//! a formation's dial that landed in one would look connected on MLX's wire. The
//! formation then runs on the members' hostfile entries, renumbered in their original
//! order, with the first group's options. It carries a digest of the first group, the
//! shrink's generation and the members: in the native wire's hello (in the group
//! identity), and on both wires in a first all_gather of the digest over the new group,
//! so survivors that decided differently, or a rank of another shrink, fail to form
//! instead of forming apart; they agree again.
//!
//! A rejoin is a plain formation of the first group (its hostfile entries, this rank's
//! first rank, its options): exactly what a restarted rank's `init` does, so the two form
//! one group.
//!
//! The rendezvous polls its few non-blocking sockets every millisecond rather than
//! waiting on an event loop: it runs once per failure, for at most a few timeouts.

mod agree;

use std::collections::BTreeSet;
use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};

use crate::auth::Key;
use crate::backend::form_ring;
use crate::config::hostfile::{self, RingAddresses};
use crate::error::{Error, Phase, Result};
use crate::group::{Group, Lineage, Origin};
use crate::options::{Backend, Options};
use crate::transport::tcp::bootstrap;
use crate::transport::tcp::socket::{self as tcp, SocketTuning};
use crate::verbose::verbose;

use agree::{Agreement, Kind, Message, Next, Refused};

/// How often the rendezvous looks at its sockets.
const POLL: Duration = Duration::from_millis(1);
/// How long a refused dial waits before it is tried again.
const REDIAL: Duration = Duration::from_millis(10);
/// Formation attempts after the agreement, each followed by a new agreement if it fails.
const ATTEMPTS: usize = 3;

impl Group {
    /// Replaces this group, after a peer failed, with a group of the surviving ranks:
    /// every survivor calls it, and each gets the same new group, renumbered in the order
    /// of the ranks' first ranks, with the options the group was formed with.
    ///
    /// The survivors agree on who survives (the ranks each knows failed, merged; a rank
    /// that cannot be reached or does not answer is failed too, and a survivor that dies
    /// during the agreement is left out), then form the new group on their hostfile
    /// addresses. This group is closed first: a rank that was only stopped, and wakes after
    /// the others shrank, finds its connections closed, and its own `shrink` fails saying
    /// that it was left out; it cannot join the new group. Every wait is bounded by the
    /// group's timeout: the survivors wait up to it for each other, and the whole call takes
    /// at most a few timeouts. The survivors must be more than half of this group: two
    /// parts of a group can then never both form (a group of two cannot shrink, nor one
    /// that lost half its ranks at once).
    ///
    /// Works on both TCP wires, among ranks of this crate (MLX's own ranks have no shrink).
    /// A rank restarted in place of a failed one joins again through [`Group::rejoin`].
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] for a JACCL group or a group over another communicator.
    /// When no other rank answers within the timeout, an error saying that this rank was
    /// left out (the others formed without it, or all failed): [`Error::Excluded`], a
    /// [`Fault::Closed`] error, because no peer can be blamed. A formation that fails every attempt returns
    /// its last error.
    ///
    /// [`Fault::Closed`]: crate::Fault::Closed
    pub fn shrink(&self) -> Result<Group> {
        shrink(self)
    }

    /// Forms the full group again, after [`Group::shrink`], once the missing ranks are
    /// restarted: each at its address in the hostfile, forming as it did the first time
    /// (`init`, or `init_with` with the same addresses, rank and options). Every survivor
    /// calls it, on the shrunk group or on the failed first one, and waits up to the
    /// group's timeout for the restarted ranks. Every rank has its first rank again.
    ///
    /// This group is left as it is (closed if it had failed), so the survivors can go on
    /// with it if the restarted ranks do not come; close it once the full group is formed.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] as for [`Group::shrink`]; otherwise the formation's error,
    /// naming the rank that did not come.
    pub fn rejoin(&self) -> Result<Group> {
        rejoin(self)
    }
}

/// How `group` was formed, or why it cannot shrink or rejoin.
fn origin_of<'a>(group: &'a Group, what: &str) -> Result<&'a Origin> {
    group.origin().ok_or_else(|| {
        Error::Unsupported(match group.backend() {
            "jaccl" => format!(
                "{what}: a JACCL group cannot {what}: JACCL sets its queue pairs up once, \
                 through its coordinator, for the group it forms. Close it and form a new \
                 JACCL group with init on every rank"
            ),
            backend => format!(
                "{what}: this {backend} group was not formed by init or init_with, so it \
                 has no hostfile to re-form from"
            ),
        })
    })
}

/// The setup phase of the wire `options` form.
fn phase(options: &Options) -> Phase {
    match options.backend {
        Backend::Native => Phase::NativeSetup,
        _ => Phase::RingSetup,
    }
}

/// [`Group::shrink`].
fn shrink(parent: &Group) -> Result<Group> {
    if parent.size() == 1 {
        return Ok(parent.clone());
    }
    let origin = origin_of(parent, "shrink")?;
    let lineage = &origin.lineage;
    let (me, size) = (lineage.rank, lineage.nodes.len());
    // What this rank knows failed: the first ranks that are not members of this group, and
    // the peer whose failure failed it.
    let mut known: BTreeSet<usize> = (0..size).filter(|r| !lineage.members.contains(r)).collect();
    if let Err(e) = parent.health()
        && let Some(first) = blamed(&e).and_then(|p| lineage.members.get(p))
    {
        known.insert(*first);
    }
    // Closed before anything else: its connections and ports are released, and a rank
    // that wakes up later finds them closed.
    let _ = parent.close();

    let options = &lineage.options;
    let key = bootstrap::prepare(options)?;
    let first = hostfile::resolve(&lineage.nodes, me, &lineage.place)?;
    let generation = lineage.generation + 1;
    let identity = crate::native::hello::group_identity(&lineage.nodes, key.as_ref());
    let started = Instant::now();
    verbose!(
        info: me,
        "shrink: generation {generation} of {size} ranks, knowing {known:?} failed"
    );
    let mut last_error = None;
    for attempt in 0..ATTEMPTS {
        let rendezvous = Rendezvous {
            me,
            size,
            generation,
            identity,
            key: key.as_ref(),
            first: &first,
            options,
        };
        let members = rendezvous.agree(&known, started)?;
        verbose!(
            info: me,
            "shrink: agreed on first ranks {members:?} after {:?} (attempt {attempt})",
            started.elapsed()
        );
        if members.len() < 2 || !members.contains(&me) {
            return Err(excluded(
                me,
                started.elapsed(),
                "no other rank answered at its hostfile address or reported to it",
            ));
        }
        // Only a decision that keeps more than half of this group forms: two disjoint
        // parts of it can then never both form. Without this rule, survivors that blamed
        // a live rank for the failure (its close, made to shrink, read as its death) chose
        // different coordinators, and at P = 5 ranks {1, 4} and {2, 3} formed two groups
        // (`nuvec chaos --recover --wire mlx`, seed 1248191706). A minority agrees again
        // from what it saw itself: the ranks earlier shrinks dropped, and the ranks the
        // rendezvous finds unreachable, not the blame its failed collective carried.
        if members.len() * 2 <= lineage.members.len() {
            verbose!(
                warn: me,
                "shrink: first ranks {members:?} are not more than half of the {} ranks of \
                 this group: agreeing again",
                lineage.members.len()
            );
            if attempt + 1 == ATTEMPTS {
                return Err(excluded(
                    me,
                    started.elapsed(),
                    &format!(
                        "the survivors it agreed with, first ranks {members:?}, are not more \
                         than half of the {} ranks of the group, and a shrink keeps a majority \
                         so that two parts of a group never both form",
                        lineage.members.len()
                    ),
                ));
            }
            known = (0..size).filter(|r| !lineage.members.contains(r)).collect();
            continue;
        }
        match form(lineage, options, &members, generation, &identity) {
            Ok(group) => {
                verbose!(
                    info: me,
                    "shrink: formed as rank {} of {} after {:?}",
                    group.rank(),
                    group.size(),
                    started.elapsed()
                );
                return Ok(group);
            }
            Err(e) => {
                verbose!(warn: me, "shrink: forming first ranks {members:?} failed: {e}");
                // A peer the formation blames is failed for the next agreement, unless it
                // reports again there.
                if let Some(first) = blamed(&e).and_then(|p| members.get(p)) {
                    known.insert(*first);
                }
                last_error = Some(e);
            }
        }
    }
    Err(last_error
        .unwrap_or_else(|| excluded(me, started.elapsed(), "no formation attempt was made")))
}

/// The peer whose failure `e` reports, also when the group had failed earlier.
fn blamed(e: &Error) -> Option<usize> {
    match e {
        Error::Failed(first) => blamed(first),
        e => e.lost_peer(),
    }
}

/// The error of a rank that the survivors did not take in.
fn excluded(me: usize, after: Duration, why: &str) -> Error {
    Error::Excluded {
        rank: me,
        after,
        why: why.into(),
    }
}

/// Forms the group of `members` (first ranks, in order) as the shrink of `generation`.
fn form(
    lineage: &Lineage,
    options: &Options,
    members: &[usize],
    generation: u64,
    identity: &[u8; 32],
) -> Result<Group> {
    let me = lineage.rank;
    let new_rank = members
        .iter()
        .position(|&m| m == me)
        .ok_or_else(|| excluded(me, Duration::ZERO, "the decision does not list it"))?;
    let nodes: Vec<Vec<String>> = members
        .iter()
        .filter_map(|&m| lineage.nodes.get(m).cloned())
        .collect();
    let place = std::path::PathBuf::from(format!(
        "<shrink {generation} of {}: first ranks {members:?}>",
        lineage.place.display()
    ));
    let mut addrs = hostfile::resolve(&nodes, new_rank, &place)?;
    let digest = agree::digest(identity, generation, members);
    addrs.shrunk = Some(digest);
    // Its flight records go to a directory of their own: its ranks are numbered anew.
    let mut formed_with = options.clone();
    formed_with.flight_dir = formed_with
        .flight_dir
        .map(|dir| dir.join(format!("shrink-{generation}")));
    let group = form_ring(&addrs, &formed_with)?;
    // Every member checks that every other holds the same digest: on MLX's wire, which has
    // no hello, this is what refuses survivors that decided differently.
    let mut all = vec![0u8; digest.len() * group.size()];
    group.all_gather(&digest, &mut all)?;
    if let Some((r, _)) = all
        .chunks_exact(digest.len())
        .enumerate()
        .find(|(_, d)| *d != digest)
    {
        let _ = group.close();
        return Err(Error::PeerIncompatible {
            peer: r,
            addr: None,
            context: phase(options),
            reason: format!(
                "shrink: rank {r} of the new group agreed on other members than this rank \
                 (first ranks {members:?}, generation {generation})"
            ),
        });
    }
    Ok(group.with_origin(Origin {
        listen: addrs.listen.clone(),
        options: formed_with,
        lineage: Lineage {
            members: members.to_vec(),
            generation,
            ..lineage.clone()
        },
    }))
}

/// [`Group::rejoin`].
fn rejoin(group: &Group) -> Result<Group> {
    if group.size() == 1 && group.origin().is_none() {
        return Ok(group.clone());
    }
    let origin = origin_of(group, "rejoin")?;
    let lineage = &origin.lineage;
    if group.health().is_err() {
        let _ = group.close();
    }
    let addrs = hostfile::resolve(&lineage.nodes, lineage.rank, &lineage.place)?;
    verbose!(
        info: lineage.rank,
        "rejoin: forming the first group of {} again (this group has first ranks {:?})",
        lineage.nodes.len(),
        lineage.members
    );
    form_ring(&addrs, &lineage.options)
}

// ---- The rendezvous ------------------------------------------------------------------

/// One agreement's sockets and what they know.
struct Rendezvous<'a> {
    me: usize,
    size: usize,
    generation: u64,
    identity: [u8; 32],
    key: Option<&'a Key>,
    /// This rank's addresses in the first group (for every rank's first address).
    first: &'a RingAddresses,
    options: &'a Options,
}

/// A connection and its message in each direction.
struct Conn {
    stream: TcpStream,
    /// The peer's first rank, once its report arrived (incoming) or as dialled (outgoing).
    peer: Option<usize>,
    inbox: Vec<u8>,
    outbox: Vec<u8>,
    sent: usize,
    /// Whether the peer closed (or the connection failed).
    closed: bool,
}

impl Conn {
    fn new(stream: TcpStream, peer: Option<usize>) -> Conn {
        Conn {
            stream,
            peer,
            inbox: Vec::new(),
            outbox: Vec::new(),
            sent: 0,
            closed: false,
        }
    }

    /// Writes what it can of the outbox and reads up to `len` bytes into the inbox.
    fn pump(&mut self, len: usize) {
        while self.sent < self.outbox.len() && !self.closed {
            match tcp::write_some(&mut self.stream, &self.outbox[self.sent..]) {
                Ok(0) => break,
                Ok(n) => self.sent += n,
                Err(_) => self.closed = true,
            }
        }
        while self.inbox.len() < len && !self.closed {
            let mut buf = vec![0u8; len - self.inbox.len()];
            match tcp::read_some(&mut self.stream, &mut buf) {
                Ok(None) => break,
                Ok(Some(0)) | Err(_) => self.closed = true,
                Ok(Some(n)) => self.inbox.extend_from_slice(buf.get(..n).unwrap_or(&[])),
            }
        }
    }

    fn flushed(&self) -> bool {
        self.sent == self.outbox.len()
    }
}

/// The dial to the coordinator of this rank's view.
struct Dial {
    to: usize,
    addr: SocketAddr,
    /// When this rank started trying it.
    since: Instant,
    conn: Option<Conn>,
    connected: bool,
    retry_at: Instant,
    /// When the report went out, once it did.
    reported: Option<Instant>,
    last_error: Option<String>,
}

impl Rendezvous<'_> {
    fn tag(&self, bytes: &[u8]) -> [u8; 32] {
        self.key.map_or([0; 32], |k| k.tag(bytes))
    }

    fn encode(&self, kind: Kind, set: &BTreeSet<usize>) -> Vec<u8> {
        let message = Message {
            kind,
            generation: self.generation,
            from: self.me,
            set: set.clone(),
        };
        agree::encode(&message, self.size, &self.identity, |b| self.tag(b))
    }

    fn decode(&self, bytes: &[u8]) -> std::result::Result<Message, Refused> {
        agree::decode(bytes, self.size, &self.identity, self.generation, |b| {
            self.tag(b)
        })
    }

    /// Runs the agreement from `known` (first ranks known failed); returns the members.
    fn agree(&self, known: &BTreeSet<usize>, started: Instant) -> Result<Vec<usize>> {
        let timeout = self.options.timeout;
        let me = self.me;
        let tuning = SocketTuning::from_options(self.options);
        let own = self.first.first_address(me)?;
        let listener = self.listen(own, &tuning, started + timeout)?;
        let mut agreement = Agreement::new(me, self.size, known.iter().copied());
        let mut incoming: Vec<Conn> = Vec::new();
        let mut dial: Option<Dial> = None;
        let mut coordinating_since: Option<Instant> = None;
        let len = agree::message_len(self.size);
        // The whole agreement is bounded: a rank that reaches this is alone.
        let hard = started + timeout * 4;
        loop {
            let now = Instant::now();
            while let Ok(Some((stream, _))) = tcp::accept_next(&listener) {
                incoming.push(Conn::new(stream, None));
            }
            for conn in &mut incoming {
                conn.pump(len);
                if conn.peer.is_none() && conn.inbox.len() == len {
                    match self.decode(&conn.inbox) {
                        Ok(m) if m.kind == Kind::Report => {
                            verbose!(
                                me,
                                "shrink: rank {} reports, knowing {:?} failed",
                                m.from,
                                m.set
                            );
                            agreement.on_report(m.from, &m.set);
                            conn.peer = Some(m.from);
                        }
                        Ok(m) => {
                            verbose!(warn: me, "shrink: unexpected {:?} from rank {}", m.kind, m.from);
                            conn.closed = true;
                        }
                        Err(why) => {
                            verbose!(warn: me, "shrink: refused a connection: {why:?}");
                            conn.closed = true;
                        }
                    }
                }
            }
            // A reporter that left is not a member.
            for conn in incoming.iter().filter(|c| c.closed) {
                if let Some(peer) = conn.peer {
                    agreement.on_unreachable(peer);
                }
            }
            incoming.retain(|c| !c.closed);

            match agreement.next() {
                Next::Decided(members) => {
                    // No rendezvous listener may be open once anyone forms: a formation's
                    // dial would land in it (on MLX's wire, without a key, nothing tells).
                    drop(listener);
                    match dial.take().and_then(|d| d.conn) {
                        Some(conn) if !agreement.coordinates() => {
                            self.ready(conn, now + timeout * 2)
                        }
                        _ => self.announce(&members, &mut incoming, now + timeout),
                    }
                    return Ok(members);
                }
                Next::Collect(missing) => {
                    dial = None;
                    let since = *coordinating_since.get_or_insert(now);
                    let until = (started + timeout).max(since + timeout / 2);
                    if now >= until {
                        verbose!(
                            warn: me,
                            "shrink: ranks {missing:?} did not report within {:?}",
                            now - started
                        );
                        agreement.decide();
                        continue;
                    }
                }
                Next::ReportTo(coordinator) => {
                    if dial.as_ref().is_none_or(|d| d.to != coordinator) {
                        dial = Some(Dial {
                            to: coordinator,
                            addr: self.first.first_address(coordinator)?,
                            since: now,
                            conn: None,
                            connected: false,
                            retry_at: now,
                            reported: None,
                            last_error: None,
                        });
                    }
                    if let Some(d) = dial.as_mut() {
                        let report = self.encode(Kind::Report, agreement.failed());
                        match self.progress(d, &tuning, report, started, now) {
                            Progress::Waiting => {}
                            Progress::Decided(m) => agreement.on_decide(d.to, &m),
                            Progress::Failed(why) => {
                                verbose!(
                                    warn: me,
                                    "shrink: coordinator {} ({}) failed: {why}",
                                    d.to,
                                    d.addr
                                );
                                agreement.on_unreachable(d.to);
                            }
                        }
                    }
                }
            }
            if now >= hard {
                return Err(excluded(
                    me,
                    now - started,
                    "the agreement found no coordinator that decided in time",
                ));
            }
            std::thread::sleep(POLL);
        }
    }

    /// Listens on `own`, retrying while the port is still taken (a listener of the
    /// group closing) until `until`.
    fn listen(
        &self,
        own: SocketAddr,
        tuning: &SocketTuning,
        until: Instant,
    ) -> Result<TcpListener> {
        loop {
            match tcp::listen(own, tuning) {
                Ok(listener) => return Ok(listener),
                Err(e) if e.kind() == io::ErrorKind::AddrInUse && Instant::now() < until => {
                    std::thread::sleep(REDIAL);
                }
                Err(e) => {
                    return Err(Error::local(
                        format!(
                            "shrink: first rank {} cannot listen on its hostfile address {own}",
                            self.me
                        ),
                        e,
                    ));
                }
            }
        }
    }

    /// As coordinator: sends the decision to every member that reported here, waits until
    /// each has answered that it closed its rendezvous listener (or left, or `until`),
    /// then tells them all to form.
    fn announce(&self, members: &[usize], incoming: &mut [Conn], until: Instant) {
        let len = agree::message_len(self.size);
        let set: BTreeSet<usize> = members.iter().copied().collect();
        let decision = self.encode(Kind::Decide, &set);
        let mut waiting: Vec<&mut Conn> = incoming
            .iter_mut()
            .filter(|c| c.peer.is_some_and(|p| set.contains(&p)))
            .collect();
        for conn in waiting.iter_mut() {
            conn.outbox.clone_from(&decision);
            conn.sent = 0;
            conn.inbox.clear();
        }
        let ready = |conn: &Conn| {
            conn.inbox.len() == len
                && self
                    .decode(&conn.inbox)
                    .is_ok_and(|m| m.kind == Kind::Ready && Some(m.from) == conn.peer)
        };
        while Instant::now() < until && waiting.iter().any(|c| !c.closed && !ready(c)) {
            for conn in waiting.iter_mut() {
                conn.pump(len);
            }
            std::thread::sleep(POLL);
        }
        let go = self.encode(Kind::Go, &set);
        for conn in waiting.iter_mut().filter(|c| ready(c)) {
            conn.outbox.clone_from(&go);
            conn.sent = 0;
        }
        while Instant::now() < until && waiting.iter().any(|c| !c.closed && !c.flushed()) {
            for conn in waiting.iter_mut() {
                conn.pump(0);
            }
            std::thread::sleep(POLL);
        }
        if let Some(late) = waiting.iter().find(|c| !ready(c)) {
            verbose!(
                warn: self.me,
                "shrink: rank {:?} did not confirm the decision; forming regardless",
                late.peer
            );
        }
    }

    /// As a member, its rendezvous listener closed: tells the coordinator, and waits for
    /// its word to form (at most until `until`; a coordinator that fails now fails the
    /// formation, which agrees again).
    fn ready(&self, mut conn: Conn, until: Instant) {
        let len = agree::message_len(self.size);
        conn.outbox = self.encode(Kind::Ready, &BTreeSet::new());
        conn.sent = 0;
        conn.inbox.clear();
        while Instant::now() < until && !conn.closed && conn.inbox.len() < len {
            conn.pump(len);
            std::thread::sleep(POLL);
        }
        let go = conn.inbox.len() == len
            && self
                .decode(&conn.inbox)
                .is_ok_and(|m| m.kind == Kind::Go && Some(m.from) == conn.peer);
        if !go {
            verbose!(
                warn: self.me,
                "shrink: coordinator {:?} did not say to form; forming regardless",
                conn.peer
            );
        }
    }

    /// Moves the dial to the coordinator on.
    fn progress(
        &self,
        d: &mut Dial,
        tuning: &SocketTuning,
        report: Vec<u8>,
        started: Instant,
        now: Instant,
    ) -> Progress {
        let timeout = self.options.timeout;
        let len = agree::message_len(self.size);
        if !d.connected {
            // A coordinator that is not listening yet may still be in its collective, up to
            // a timeout behind this rank; one that refuses past that is failed.
            let until = (started + timeout).max(d.since + timeout / 4);
            if now >= until {
                return Progress::Failed(format!(
                    "it did not accept a connection within {:?}{}",
                    now - d.since,
                    d.last_error
                        .as_ref()
                        .map(|e| format!(" (last: {e})"))
                        .unwrap_or_default()
                ));
            }
            if d.conn.is_none() && now >= d.retry_at {
                match tcp::dial(d.addr, tuning) {
                    Ok(stream) => d.conn = Some(Conn::new(stream, Some(d.to))),
                    Err(e) => {
                        d.last_error = Some(e.to_string());
                        d.retry_at = now + REDIAL;
                    }
                }
            }
            if let Some(conn) = &d.conn {
                match tcp::dial_outcome(&conn.stream) {
                    Ok(true) => d.connected = true,
                    Ok(false) => {}
                    Err(e) => {
                        d.last_error = Some(e.to_string());
                        d.conn = None;
                        d.retry_at = now + REDIAL;
                    }
                }
            }
            if !d.connected {
                return Progress::Waiting;
            }
        }
        let Some(conn) = d.conn.as_mut() else {
            return Progress::Failed("its connection is gone".into());
        };
        if d.reported.is_none() {
            conn.outbox = report;
            d.reported = Some(now);
        }
        conn.pump(len);
        if conn.inbox.len() == len {
            return match self.decode(&conn.inbox) {
                Ok(m) if m.kind == Kind::Decide && m.from == d.to => {
                    Progress::Decided(m.set.into_iter().collect())
                }
                Ok(m) => Progress::Failed(format!("it sent {:?} as rank {}", m.kind, m.from)),
                Err(why) => Progress::Failed(format!("its answer was refused: {why:?}")),
            };
        }
        if conn.closed {
            return Progress::Failed("it closed the connection before deciding".into());
        }
        // The coordinator collects for at most a timeout after it became one, which was
        // at the latest when this report arrived.
        if d.reported.is_some_and(|at| now >= at + timeout * 2) {
            return Progress::Failed(format!(
                "it did not decide within {:?} of this rank's report",
                timeout * 2
            ));
        }
        Progress::Waiting
    }
}

/// Where the dial to the coordinator stands.
enum Progress {
    Waiting,
    Decided(Vec<usize>),
    Failed(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three loopback addresses, one per rank, that nobody listens on.
    fn nodes() -> Vec<Vec<String>> {
        crate::loopback_ports::free_addrs(3)
            .iter()
            .map(|a| vec![a.to_string()])
            .collect()
    }

    fn lineage(nodes: &[Vec<String>], rank: usize, options: &Options) -> Lineage {
        Lineage {
            nodes: nodes.to_vec(),
            place: hostfile::IN_CODE.into(),
            rank,
            members: (0..nodes.len()).collect(),
            generation: 0,
            options: options.clone(),
        }
    }

    /// Survivors that decided differently never form: on the native wire the hello refuses
    /// the other digest; on MLX's wire, which takes whatever connects, the first all_gather
    /// of the digests does. First rank 1 decides that rank 2 failed while ranks 0 and 2
    /// keep all three; then all decide the same members but rank 2 in another generation
    /// (a rank of another shrink), where the rings are alike and only the digest tells.
    #[test]
    fn survivors_that_decided_differently_do_not_form() {
        type Decision = (&'static [usize], u64);
        let cases: [[Decision; 3]; 2] = [
            [(&[0, 1, 2], 1), (&[0, 1], 1), (&[0, 1, 2], 1)],
            [(&[0, 1, 2], 1), (&[0, 1, 2], 1), (&[0, 1, 2], 2)],
        ];
        for backend in [Backend::Ring, Backend::Native] {
            for decisions in &cases {
                let nodes = nodes();
                let options = Options::default()
                    .timeout(Duration::from_secs(2))
                    .backend(backend);
                let identity = [1u8; 32];
                let results: Vec<Result<Group>> = std::thread::scope(|s| {
                    let ranks: Vec<_> = (0..3)
                        .map(|r| {
                            let (nodes, options) = (&nodes, &options);
                            s.spawn(move || {
                                let lineage = lineage(nodes, r, options);
                                let (members, generation) = decisions[r];
                                form(&lineage, options, members, generation, &identity)
                            })
                        })
                        .collect();
                    ranks.into_iter().map(|h| h.join().unwrap()).collect()
                });
                for (r, result) in results.iter().enumerate() {
                    assert!(
                        result.is_err(),
                        "{backend:?}: rank {r} formed, deciding {:?}",
                        decisions[r]
                    );
                }
            }
        }
    }
}
