//! Which way a native group's collectives go, fixed when it forms ([`Path`]: one
//! shared-memory segment, hierarchical, or TCP), and the hierarchical groups: shared memory
//! inside each host (`transport::shm`), TCP between hosts.
//!
//! # Domains
//!
//! Every rank computes the same partition of the group from the hellos' host identities
//! ([`candidates`]): ranks with one known identity form a candidate domain, a rank whose
//! identity is unknown is a domain of its own. The identity covers the `/dev/shm` file
//! system (see `hello::host_identity`), so two containers on one kernel with their own
//! `/dev/shm` are two hosts. Each candidate of two or more ranks sets up its segment as a
//! whole group does (`Link::establish`, run by the domain's *leader*, its lowest rank):
//! members report whether they could open it, and the leader's verdict reaches every
//! member. If one member could not, the whole candidate falls back: each of its ranks
//! becomes a domain of one (a rank that shares `/dev/shm`'s device but not its files is
//! unusual enough that the simple rule wins; the verbose line names the rank and why).
//! Then each leader of a candidate of two or more tells every rank outside it, in one
//! byte over the mesh, whether its domain stands ([`settle`]), so every rank ends with
//! the same partition.
//!
//! A partition of one domain is today's single-host group (`Link` over the whole group,
//! nothing else changes); one of single ranks only is plain TCP; anything else is a
//! [`Hier`].
//!
//! # Collectives
//!
//! Each runs in three phases. Inside each domain over its segment; then among the leaders
//! (leader `i` is the leader of domain `i`, domains ordered by their leaders) with the
//! native wire's [`Exchange`] over the mesh connections between them; then each leader
//! hands the result to its domain over the segment (a broadcast from local rank 0). An
//! all-reduce reduces to the leader inside the domain (the segment's schedule, with the
//! members folding only their shares when it goes by shares, nothing when one-shot); it
//! folds within a domain in rank order, then across leaders in leader order:
//! `(x_d0 op x_d1 ...) op (x_e0 op ...) op ...`, with the same kernel on every rank, so every
//! rank gets the same bits (a float sum's bits may differ from a single-host group's,
//! whose order is plain rank order). all_gather gathers each domain's blocks, then the
//! leaders exchange them packed (each domain's blocks in rank order, padded to the
//! largest domain), then every member receives the whole output. sum_scatter is an
//! all-reduce of the whole input, of which each rank keeps its block. barrier is three
//! rounds of headers. broadcast and all_to_all go over plain TCP on a hierarchical group,
//! after such a barrier with their own call (so a mismatch with any other collective is
//! found through the hierarchy, as below).
//!
//! # Mismatch and failure
//!
//! Headers are compared inside each domain (on the segment) and between leaders (over
//! TCP): calls that differ anywhere differ within some domain or between two leaders. A
//! leader that finds a mismatch among its members writes to every other leader the one of
//! the two calls (its own, a member's) that differs from the header that leader sent it
//! for the exchange (by the domain's majority if none comes within [`PASS_ON`]), where it is read as the header of the leaders' exchange; a leader that
//! finds one between leaders publishes the differing header at the third phase's step,
//! which its members compare with their own call. So every rank fails with
//! [`Error::Mismatch`] (naming its own call and a differing one, though not always the
//! rank that made it). Ranks of a domain waiting on its segment give the awaited step a
//! last look when a connection closes (another host's rank that failed on the mismatch),
//! so that they read the leader's header rather than report the close. A rank that dies closes its connection to every rank; each rank
//! waiting on a segment looks at all its connections, and each leader in the exchange
//! gets the failure notices of the others, so the rank is named everywhere.
//!
//! Limits: a rank waiting for its leader while the leaders exchange counts the exchange
//! against its timeout; TCP connections are not watched for a stray `send`'s header
//! during a hierarchical collective (the next call's headers of a faster rank may be on
//! them already), so a `send` or `recv` against a group collective ends at the timeout,
//! named, not as a mismatch.

use std::time::{Duration, Instant};

use crate::comm::algorithm::{self, AllReduce};
use crate::comm::progress::WaitPolicy;
use crate::element::DType;
use crate::error::{Error, Result};
use crate::native::header::{Call, HEADER_BYTES, Header};
use crate::native::protocol::{Caller, Exchange, Memory, Routes};
use crate::native::run_exchange;
use crate::reduce::ReduceOp;
use crate::transport::shm::{Gather, Link, SETUP, Watch, read_exact, write_all};
use crate::transport::tcp::Connections as Transport;

/// How long a leader that found a mismatch among its members tries to hand the differing
/// header to the other leaders: best effort, the group fails either way.
const PASS_ON: Duration = Duration::from_millis(500);

/// The candidate domains from every rank's host identity (all zeros: unknown): ranks
/// with one known identity together, in rank order, domains ordered by their lowest rank.
pub(crate) fn candidates(hosts: &[[u8; 16]]) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    for (r, host) in hosts.iter().enumerate() {
        let known = *host != [0; 16];
        match out
            .iter_mut()
            .find(|d| known && d.first().is_some_and(|&l| hosts[l] == *host))
        {
            Some(d) => d.push(r),
            None => out.push(vec![r]),
        }
    }
    out
}

/// The partition once every candidate's verdict is known (`shared[i]`: candidate `i`'s
/// segment stands): a candidate whose segment fell through splits into single ranks.
/// Domains stay ordered by their lowest rank.
pub(crate) fn settle(candidates: &[Vec<usize>], shared: &[bool]) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    for (c, &ok) in candidates.iter().zip(shared) {
        if ok || c.len() < 2 {
            out.push(c.clone());
        } else {
            out.extend(c.iter().map(|&r| vec![r]));
        }
    }
    out.sort_by_key(|d| d.first().copied());
    out
}

/// Which way a group's collectives go, as setup found (see the module docs); fixed for the
/// group's life.
#[derive(Debug)]
pub(crate) enum Path {
    /// Every rank on one segment.
    Flat(Box<Link>),
    /// Several domains, at least one of them of two ranks or more.
    Hier(Box<Hier>),
    /// TCP for every link.
    Tcp,
}

#[cfg(test)]
impl Path {
    /// The segment of a group on one.
    pub(crate) fn flat(&self) -> Option<&Link> {
        match self {
            Path::Flat(link) => Some(&**link),
            Path::Hier(_) | Path::Tcp => None,
        }
    }
}

/// Sets up the group's shared memory (see the module docs): `hosts` is every rank's host
/// identity from its hello, `offered` whether every rank offered shared memory.
///
/// # Errors
///
/// A peer that closes, stalls past `timeout`, or breaks the setup's rules.
pub(crate) fn setup(
    transport: &mut Transport,
    (rank, hosts): (usize, &[[u8; 16]]),
    offered: bool,
    group: &[u8; 32],
    timeout: Duration,
    spin: WaitPolicy,
) -> Result<Path> {
    let size = hosts.len();
    if size < 2 || !offered {
        return Ok(Path::Tcp);
    }
    let cands = candidates(hosts);
    let Some(d) = cands.iter().position(|c| c.contains(&rank)) else {
        return Err(Error::Bug {
            context: SETUP,
            what: format!("rank {rank} is in no candidate domain of {cands:?}"),
        });
    };
    let mine = &cands[d];
    let local = mine.iter().position(|&r| r == rank).unwrap_or(0);
    let link = if mine.len() >= 2 {
        Link::establish(transport, (mine, local), group, timeout, spin.clone())?
    } else {
        None
    };
    if cands.len() == 1 {
        return Ok(link.map_or(Path::Tcp, |link| Path::Flat(Box::new(link))));
    }
    if cands.iter().all(|c| c.len() < 2) {
        return Ok(Path::Tcp);
    }
    let deadline = crate::options::deadline(Instant::now(), timeout);
    let mut shared: Vec<bool> = cands.iter().map(|c| c.len() >= 2).collect();
    shared[d] = link.is_some();
    if mine.len() >= 2 && local == 0 {
        let verdict = [u8::from(link.is_some())];
        for r in (0..size).filter(|r| !mine.contains(r)) {
            let conn = transport.send_conn(r);
            write_all(transport, conn, &verdict, deadline, timeout)?;
        }
    }
    for (i, c) in cands.iter().enumerate() {
        if i == d || c.len() < 2 {
            continue;
        }
        let mut verdict = [0u8; 1];
        let conn = transport.recv_conn(c[0]);
        read_exact(transport, conn, &mut verdict, deadline, timeout)?;
        shared[i] = match verdict[0] {
            0 => false,
            1 => true,
            other => {
                return Err(Error::PeerMisbehaved {
                    peer: c[0],
                    addr: None,
                    context: SETUP,
                    reason: format!("a domain verdict of {other}, not 0 or 1"),
                });
            }
        };
    }
    let domains = settle(&cands, &shared);
    if domains.iter().all(|c| c.len() < 2) {
        crate::verbose::verbose!(
            rank,
            "shared memory: no host holds two ranks that share a segment; every link stays TCP"
        );
        return Ok(Path::Tcp);
    }
    let leaders: Vec<usize> = domains.iter().filter_map(|c| c.first().copied()).collect();
    crate::verbose::verbose!(
        rank,
        "shared memory: host domains {domains:?}, shared memory inside each, TCP between \
         their leaders {leaders:?}"
    );
    Ok(Path::Hier(Box::new(Hier::new(
        rank,
        domains,
        link,
        (timeout, spin),
    ))))
}

/// The first header waiting on the connection from `peer`, left there, if one arrives by
/// `deadline` (looked at every millisecond: a peek consumes nothing, so no new readiness
/// event need come).
fn peek_header(
    transport: &mut Transport,
    peer: usize,
    deadline: Instant,
) -> Option<[u8; HEADER_BYTES]> {
    let conn = transport.recv_conn(peer);
    loop {
        let mut head = [0u8; HEADER_BYTES];
        match transport.conn(conn).peek(&mut head) {
            Ok(n) if n == HEADER_BYTES => return Some(head),
            Ok(0) => return None,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return None,
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        transport
            .wait(deadline.min(now + Duration::from_millis(1)), None)
            .ok()?;
    }
}

/// The mesh connections between leaders: leader `i` is global rank `leaders[i]`.
struct Leaders<'a> {
    transport: &'a Transport,
    leaders: &'a [usize],
}

impl Routes for Leaders<'_> {
    fn send_conn(&self, peer: usize) -> usize {
        self.transport.send_conn(self.leaders[peer])
    }

    fn recv_conn(&self, peer: usize) -> usize {
        self.transport.recv_conn(self.leaders[peer])
    }
}

/// One rank's end of a hierarchical group (see the module docs).
#[derive(Debug)]
pub(crate) struct Hier {
    rank: usize,
    /// The domains, each in rank order, ordered by their leaders.
    domains: Vec<Vec<usize>>,
    /// Each domain's leader (its lowest rank).
    leaders: Vec<usize>,
    /// This rank's domain.
    mine: usize,
    /// The domain's segment; `None` for a domain of one rank.
    link: Option<Link>,
    exchange: Exchange,
    /// The leaders' exchange's staging; grows to the largest collective and stays.
    stage: Vec<u8>,
    /// all_gather's packed blocks (this domain's, every domain's) and sum_scatter's copy
    /// of its input; grow and stay.
    pack: Vec<u8>,
    packed: Vec<u8>,

    timeout: Duration,
    /// The leaders' TCP links' wait policy.
    spin: WaitPolicy,
}

impl Hier {
    fn new(
        rank: usize,
        domains: Vec<Vec<usize>>,
        link: Option<Link>,
        (timeout, spin): (Duration, WaitPolicy),
    ) -> Hier {
        let leaders: Vec<usize> = domains.iter().filter_map(|c| c.first().copied()).collect();
        let mine = domains.iter().position(|c| c.contains(&rank)).unwrap_or(0);
        Hier {
            rank,
            domains,
            leaders,
            mine,
            link,
            exchange: Exchange::default(),
            stage: Vec::new(),
            pack: Vec::new(),
            packed: Vec::new(),
            timeout,
            spin,
        }
    }

    /// The domains, each in rank order, ordered by their leaders.
    #[cfg(test)]
    pub(crate) fn domains(&self) -> &[Vec<usize>] {
        &self.domains
    }

    /// The ranks that share this rank's segment, itself included; none without a segment
    /// (a domain of one).
    pub(crate) fn sharing(&self) -> &[usize] {
        match (&self.link, self.domains.get(self.mine)) {
            (Some(_), Some(domain)) => domain,
            _ => &[],
        }
    }

    /// Whether the segment's pages are locked in memory (false without a segment).
    pub(crate) fn locked(&self) -> bool {
        self.link.as_ref().is_some_and(Link::locked)
    }

    fn leader(&self) -> bool {
        self.leaders[self.mine] == self.rank
    }

    /// The first phase: `f` over the domain's segment. A leader that finds a mismatch
    /// hands the differing header to the other leaders.
    fn inside(
        &mut self,
        call: &Call,
        watch: &mut Watch<'_>,
        f: impl FnOnce(&mut Link, &mut Watch<'_>) -> Result<()>,
    ) -> Result<()> {
        let Some(link) = self.link.as_mut() else {
            return Ok(());
        };
        let result = f(link, watch);
        if let Err(Error::Mismatch { .. }) = &result
            && self.leaders[self.mine] == self.rank
            && let Some((theirs, outvoted)) = link.differing(&call.header.encode())
        {
            let mine = call.header.encode();
            let deadline = Instant::now() + PASS_ON;
            for &l in self.leaders.iter().filter(|&&l| l != self.rank) {
                // Whichever of the two calls differs from that leader's, as its header
                // for the exchange (sent before it waits for this rank's) shows; by the
                // domain's majority if it does not come in time.
                let pass = match peek_header(watch.transport, l, deadline) {
                    Some(head) if head == mine => theirs,
                    Some(_) => mine,
                    None if outvoted => mine,
                    None => theirs,
                };
                let conn = watch.transport.send_conn(l);
                // Best effort: this rank fails the group either way.
                let _ = write_all(watch.transport, conn, &pass, deadline, PASS_ON);
            }
        }
        result
    }

    /// The second phase, on leaders only: the exchange `plan` sets up among the leaders,
    /// over `data` and `input`. A mismatch found there is passed on to the domain (see the
    /// module docs).
    fn across(
        &mut self,
        call: &Call,
        watch: &mut Watch<'_>,
        (data, input): (&mut [u8], &[u8]),
        plan: impl FnOnce(&mut Exchange, &Leaders<'_>, usize, usize),
    ) -> Result<()> {
        if !self.leader() {
            return Ok(());
        }
        let count = self.leaders.len();
        let routes = Leaders {
            transport: watch.transport,
            leaders: &self.leaders,
        };
        plan(&mut self.exchange, &routes, self.mine, count);
        if self.stage.len() < self.exchange.staging() {
            self.stage.resize(self.exchange.staging(), 0);
        }
        let mut mem = Memory {
            data,
            input,
            stage: &mut self.stage,
        };
        let result = run_exchange(
            watch.transport,
            &mut self.exchange,
            &mut mem,
            (self.timeout, &mut self.spin),
            watch.context,
            watch.closed,
        );
        let Err(error) = result else {
            return Ok(());
        };
        let error = self.global(error);
        if let Error::Mismatch { .. } = error
            && let Some(theirs) = self.exchange.differing(call)
            && let Some(link) = self.link.as_mut()
            && let Ok(header) = Header::decode(&theirs)
        {
            // The members wait for this rank's next step: it carries the differing call.
            let passed = Call::group(header.seq, header.kind, header.count);
            let _ = link.barrier(&passed, watch);
        }
        Err(error)
    }

    /// An error of the leaders' exchange with leader indices turned into global ranks
    /// (connections name global ranks already).
    fn global(&self, mut error: Error) -> Error {
        let at = |i: usize| self.leaders.get(i).copied().unwrap_or(i);
        match error {
            Error::Mismatch {
                ref mut rank,
                ref mut peer,
                ..
            } => {
                *rank = self.rank;
                *peer = at(*peer);
                error
            }
            Error::PeerMisbehaved {
                peer,
                addr: None,
                context,
                reason,
            } => Error::PeerMisbehaved {
                peer: at(peer),
                addr: None,
                context,
                reason,
            },
            error => error,
        }
    }

    /// The third phase: the leader's `data` to every member.
    fn spread(&mut self, call: &Call, data: &mut [u8], watch: &mut Watch<'_>) -> Result<()> {
        match self.link.as_mut() {
            Some(link) => link.broadcast(call, data, 0, watch),
            None => Ok(()),
        }
    }

    /// An all-reduce of `data` in place (see the module docs for the fold order).
    pub(crate) fn all_reduce(
        &mut self,
        call: &Call,
        (op, dtype): (ReduceOp, DType),
        data: &mut [u8],
        watch: &mut Watch<'_>,
    ) -> Result<()> {
        self.inside(call, watch, |link, w| {
            link.reduce_to_first(call, (op, dtype), data, w)
        })?;
        let len = data.len();
        let elems = len / dtype.size();
        self.across(call, watch, (data, &[]), |ex, routes, me, count| {
            // The TCP rows of the table among the leaders, with the direct algorithms
            // where the table takes the log-round ones or the ring.
            let direct = match algorithm::leaders_all_reduce(count, len, elems) {
                AllReduce::OneShot => AllReduce::OneShot,
                AllReduce::ScatterGather
                | AllReduce::RecursiveDoubling
                | AllReduce::HalvingDoubling
                | AllReduce::Ring => AllReduce::ScatterGather,
            };
            ex.all_reduce(
                Caller::new(routes, me, count, call),
                direct,
                (op, dtype),
                len,
            );
        })?;
        self.spread(call, data, watch)
    }

    /// An all_gather: `output` holds this rank's `input` at its block already.
    pub(crate) fn all_gather(
        &mut self,
        call: &Call,
        input: &[u8],
        output: &mut [u8],
        watch: &mut Watch<'_>,
    ) -> Result<()> {
        self.inside(call, watch, |link, w| {
            link.gather(call, Gather::All, (input, output), w)
        })?;
        let n = input.len();
        let widest = self.domains.iter().map(Vec::len).max().unwrap_or(1);
        let slot = widest * n;
        if self.leader() {
            // This domain's blocks, packed in rank order.
            let mut pack = std::mem::take(&mut self.pack);
            let mut packed = std::mem::take(&mut self.packed);
            pack.resize(slot, 0);
            packed.resize(self.leaders.len() * slot, 0);
            for (k, &r) in self.domains[self.mine].iter().enumerate() {
                pack[k * n..(k + 1) * n].copy_from_slice(&output[r * n..(r + 1) * n]);
            }
            let result = self.across(call, watch, (&mut packed, &pack), |ex, routes, me, c| {
                ex.all_gather(Caller::new(routes, me, c, call), slot);
            });
            if result.is_ok() {
                for (i, domain) in self.domains.iter().enumerate() {
                    if i == self.mine {
                        continue;
                    }
                    for (k, &r) in domain.iter().enumerate() {
                        let from = i * slot + k * n;
                        output[r * n..(r + 1) * n].copy_from_slice(&packed[from..from + n]);
                    }
                }
            }
            self.pack = pack;
            self.packed = packed;
            result?;
        }
        self.spread(call, output, watch)
    }

    /// A sum_scatter: `input` is P blocks of `output.len()` bytes; this rank's block of
    /// the sum lands in `output`. An all-reduce of a copy of the whole input.
    pub(crate) fn sum_scatter(
        &mut self,
        call: &Call,
        dtype: DType,
        input: &[u8],
        output: &mut [u8],
        watch: &mut Watch<'_>,
    ) -> Result<()> {
        let mut whole = std::mem::take(&mut self.packed);
        whole.clear();
        whole.extend_from_slice(input);
        let result = self.all_reduce(call, (ReduceOp::Sum, dtype), &mut whole, watch);
        if result.is_ok() {
            let block = output.len();
            let at = self.rank * block;
            output.copy_from_slice(&whole[at..at + block]);
        }
        self.packed = whole;
        result
    }

    /// A barrier: headers inside each domain, between leaders, and inside again.
    pub(crate) fn barrier(&mut self, call: &Call, watch: &mut Watch<'_>) -> Result<()> {
        self.inside(call, watch, |link, w| link.barrier(call, w))?;
        self.across(call, watch, (&mut [], &[]), |ex, routes, me, count| {
            ex.headers(Caller::new(routes, me, count, call));
        })?;
        match self.link.as_mut() {
            Some(link) => link.barrier(call, watch),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests;
