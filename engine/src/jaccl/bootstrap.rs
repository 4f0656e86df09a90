//! How JACCL's ranks find each other: the side channel, the TCP star through rank 0 that
//! the ranks use to exchange their queue-pair addresses, byte for byte as MLX 0.32.1's
//! `TCPAllGather` and `SideChannel`, and that is watched for lost ranks afterwards.
//!
//! # Bytes on the wire
//!
//! - **Joining.** Rank 0 listens at the coordinator address and accepts P-1 connections in
//!   whatever order they come. Every other rank connects and sends its rank as a 4-byte
//!   little-endian `int`; rank 0 sorts the connections by it.
//! - **All-gather of n bytes.** Each rank k >= 1 sends its n bytes to rank 0; rank 0 reads
//!   them from rank 1, 2, ..., P-1 in that order, then sends the P x n concatenation (its own
//!   bytes first) to rank 1, 2, ..., P-1 in that order. No lengths, no headers.
//! - **All-gather of a list of records.** First an all-gather of each rank's count (4-byte
//!   `int`); then, with L the largest count, an all-gather of L records per rank (its own
//!   first, zero-filled after).
//! - **Destination record**, 32 bytes: the port LID as a 4-byte `int`, the queue-pair number,
//!   the packet sequence number (always 7), 4 bytes of padding, the 16-byte GID. A
//!   connection that does not exist (a rank's entry for itself in a mesh) has LID -1. MLX
//!   leaves the padding and the other fields of such entries uninitialised; this crate sends
//!   zeros in those fields, and [`NUVEC_MARK`] in the padding of every record.
//!
//! # Telling nuvec ranks from MLX ranks
//!
//! MLX never reads a record's padding (it reads the LID, queue-pair number, PSN and GID), and
//! rank 0 relays every rank's records byte for byte, MLX's rank 0 included. So the padding
//! carries, without changing a byte MLX reads, the one thing nuvec ranks need to know about
//! each other: that the sender is a nuvec rank, whose jaccl-ring all_gather is the corrected
//! one. A rank whose every record carries the mark is a nuvec rank; MLX's padding holds
//! whatever its memory held (in practice zeros), which matches the mark by chance with
//! probability 2^-32 per record. Nothing else MLX sends can serve: every other byte of the
//! set-up is read, and the side channel carries nothing after the barrier that MLX would
//! answer.
//! - **Barrier**: two all-gathers of the `int` 0.
//!
//! The sequence at set-up is, for a mesh: counts, P records per rank (entry j is the rank's
//! queue pair towards rank j), barrier; for a ring: counts, the left wires' records, counts,
//! the right wires' records, barrier (see `group.rs`).
//!
//! # After set-up: liveness
//!
//! MLX keeps the connections open for the group's lifetime and never uses them again. This
//! crate watches them: end of stream from a peer means that rank is gone, which a collective
//! waiting on the lost rank reports at once instead of at its timeout. A nuvec rank that
//! fails writes a *failure notice* before closing, 4 bytes naming the rank it lost, so that
//! rank 0 can tell every other rank which rank was lost (MLX ranks never read them; the bytes
//! sit unread in their socket buffers).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::{Events, Interest, Poll, Token};
use socket2::{Domain, Protocol, Socket, Type};

use super::frames::{MESH_MAX_RANKS, RING_MAX_CONNECTIONS};
use crate::comm::progress::notice_names;
use crate::comm::reports::Reports;
use crate::error::{Error, PeerOp, Phase, Result};
use crate::transport::rdma::fabric::Destination;
use crate::verbose::verbose;

/// The context errors during set-up name.
pub(crate) const SETUP: Phase = Phase::JacclSetup;

/// The size of a [`Destination`] record on the wire.
pub(crate) const DESTINATION_BYTES: usize = 32;

/// What a nuvec rank writes in the padding of every record it publishes (bytes 12 to 15),
/// which MLX neither writes nor reads: "this rank is nuvec's, with the corrected ring
/// all_gather" (see the module docs).
pub(crate) const NUVEC_MARK: [u8; 4] = *b"nvc1";

/// A [`Destination`] as the side channel carries it: MLX's 32-byte record.
impl Destination {
    /// The entry of a connection that does not exist.
    pub(crate) const ABSENT: Destination = Destination {
        lid: -1,
        qpn: 0,
        psn: 0,
        gid: [0; 16],
    };

    /// The record's 32 bytes, with [`NUVEC_MARK`] in the padding.
    pub(crate) fn encode(&self) -> [u8; DESTINATION_BYTES] {
        let mut b = self.encode_as_mlx();
        b[12..16].copy_from_slice(&NUVEC_MARK);
        b
    }

    /// The record's 32 bytes as an MLX rank sends them, with zeros in the padding (what MLX
    /// leaves there is undefined, and in practice zero): for tests that play an MLX rank.
    pub(crate) fn encode_as_mlx(&self) -> [u8; DESTINATION_BYTES] {
        let mut b = [0u8; DESTINATION_BYTES];
        b[0..4].copy_from_slice(&self.lid.to_le_bytes());
        b[4..8].copy_from_slice(&self.qpn.to_le_bytes());
        b[8..12].copy_from_slice(&self.psn.to_le_bytes());
        b[16..32].copy_from_slice(&self.gid);
        b
    }

    /// Whether a record's 32 bytes carry [`NUVEC_MARK`].
    pub(crate) fn is_marked(b: &[u8; DESTINATION_BYTES]) -> bool {
        b[12..16] == NUVEC_MARK
    }

    /// A record from its 32 bytes (the padding is ignored).
    pub(crate) fn decode(b: &[u8; DESTINATION_BYTES]) -> Destination {
        let word = |i: usize| [b[i], b[i + 1], b[i + 2], b[i + 3]];
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[16..32]);
        Destination {
            lid: i32::from_le_bytes(word(0)),
            qpn: u32::from_le_bytes(word(4)),
            psn: u32::from_le_bytes(word(8)),
            gid,
        }
    }

    /// Whether the connection exists.
    pub(crate) fn is_present(&self) -> bool {
        self.lid >= 0
    }
}

/// The most queue-pair records a rank may announce: MLX's mesh publishes one per rank (at
/// most [`MESH_MAX_RANKS`]), its ring one per wire (at most [`RING_MAX_CONNECTIONS`]). A
/// larger count is a peer's mistake, refused before the records are read: honouring it
/// would make every rank allocate 32 bytes per announced record for each rank.
pub(crate) const MAX_RECORDS: usize = if MESH_MAX_RANKS > RING_MAX_CONNECTIONS {
    MESH_MAX_RANKS
} else {
    RING_MAX_CONNECTIONS
};

/// The rank a joining client introduced itself as (its first 4 bytes, a little-endian
/// `int`), which must be one of ranks 1 to `size - 1`; `from` is its address, for the
/// error.
///
/// # Errors
///
/// [`Error::Environment`] naming the rank variable: the rank is out of range.
pub(crate) fn joining_rank(hello: [u8; 4], size: usize, from: SocketAddr) -> Result<usize> {
    let rank = i32::from_le_bytes(hello);
    usize::try_from(rank)
        .ok()
        .filter(|&r| (1..size).contains(&r))
        .ok_or_else(|| Error::Environment {
            var: crate::config::env::RANK_VAR,
            reason: format!(
                "a client at {from} joined the JACCL side channel as rank {rank}, but the group \
                 has ranks 1 to {} besides rank 0: check {} on every host",
                size.saturating_sub(1),
                crate::config::env::RANK_VAR
            ),
        })
}

/// The `int`s of an all-gather of one `int` per rank, in rank order (a trailing partial
/// `int` is ignored; the side channel never delivers one).
pub(crate) fn decode_ints(gathered: &[u8]) -> Vec<i32> {
    gathered
        .as_chunks::<4>()
        .0
        .iter()
        .map(|c| i32::from_le_bytes(*c))
        .collect()
}

/// The record counts every rank announced, checked: each from 0 to [`MAX_RECORDS`].
///
/// # Errors
///
/// [`Error::PeerMisbehaved`] naming the first rank whose count is negative or above the
/// limit.
pub(crate) fn record_counts(counts: &[i32]) -> Result<Vec<usize>> {
    counts
        .iter()
        .enumerate()
        .map(|(rank, &c)| {
            usize::try_from(c)
                .ok()
                .filter(|&n| n <= MAX_RECORDS)
                .ok_or_else(|| Error::PeerMisbehaved {
                    peer: rank,
                    addr: None,
                    context: SETUP,
                    reason: format!(
                        "it announced {c} queue-pair records on the side channel (from 0 to \
                         {MAX_RECORDS})"
                    ),
                })
        })
        .collect()
}

/// How a rank encodes its records: nuvec's way, or (tests playing an MLX rank) MLX's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Records {
    /// With [`NUVEC_MARK`] in the padding.
    Nuvec,
    /// With zeros in the padding, as an MLX rank's.
    #[cfg_attr(not(test), allow(dead_code))] // only tests play MLX ranks
    Mlx,
}

/// The bytes one rank sends in the second all-gather of a record list: its records, then
/// zeros up to `max` records.
pub(crate) fn pack_records(records: &[Destination], max: usize, how: Records) -> Vec<u8> {
    let mut bytes = vec![0u8; max * DESTINATION_BYTES];
    for (slot, record) in bytes
        .as_chunks_mut::<DESTINATION_BYTES>()
        .0
        .iter_mut()
        .zip(records)
    {
        slot.copy_from_slice(&match how {
            Records::Nuvec => record.encode(),
            Records::Mlx => record.encode_as_mlx(),
        });
    }
    bytes
}

/// Every rank's records, and whether each rank marked all of them as a nuvec rank's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Gathered {
    /// Rank `r`'s records, in its order.
    pub(crate) records: Vec<Vec<Destination>>,
    /// Whether rank `r` published at least one record and [`NUVEC_MARK`] in every one.
    pub(crate) nuvec: Vec<bool>,
}

/// Every rank's records from the gathered bytes of [`pack_records`] and the gathered counts.
///
/// `gathered` must hold `counts.len() * max` records and no count may exceed `max`, as the
/// all-gather of [`SideChannel::all_gather_records`] guarantees.
pub(crate) fn unpack_records(gathered: &[u8], counts: &[usize], max: usize) -> Gathered {
    let blocks: Vec<&[[u8; DESTINATION_BYTES]]> = counts
        .iter()
        .enumerate()
        .map(|(rank, &count)| {
            let block = &gathered[rank * max * DESTINATION_BYTES..][..count * DESTINATION_BYTES];
            block.as_chunks::<DESTINATION_BYTES>().0
        })
        .collect();
    Gathered {
        records: blocks
            .iter()
            .map(|b| b.iter().map(Destination::decode).collect())
            .collect(),
        nuvec: blocks
            .iter()
            .map(|b| !b.is_empty() && b.iter().all(Destination::is_marked))
            .collect(),
    }
}

/// A failure notice: the rank a failing rank lost, as 4 little-endian bytes.
pub(crate) fn encode_notice(lost: usize) -> [u8; 4] {
    (lost as u32).to_le_bytes()
}

/// The rank a failure notice names.
pub(crate) fn decode_notice(bytes: [u8; 4]) -> usize {
    u32::from_le_bytes(bytes) as usize
}

/// The error for peer `sender`'s side channel closing after it sent `notice` (what it wrote
/// before closing, possibly nothing): [`Error::Lost`] naming the rank its notice names, if
/// that is a third rank of this group of `ranks` (this rank is `me`); else
/// [`Error::Closed`] naming the sender.
pub(crate) fn closed_after(
    notice: &[u8],
    sender: usize,
    me: usize,
    ranks: usize,
    context: Phase,
) -> Error {
    if let Some(&bytes) = notice.first_chunk::<4>() {
        let lost = decode_notice(bytes);
        if let Some(lost) = notice_names(lost, sender, me, ranks) {
            return Error::Lost {
                peer: lost,
                via: sender,
                context,
            };
        }
    }
    Error::Closed {
        peer: sender,
        op: PeerOp::Receive,
        context,
    }
}

/// One side-channel connection.
#[derive(Debug)]
struct Peer {
    rank: usize,
    addr: SocketAddr,
    stream: TcpStream,
    /// Set up for liveness watching (after set-up).
    watched: Option<mio::net::TcpStream>,
    /// Bytes of a failure notice read so far.
    notice: Vec<u8>,
}

/// This rank's end of the side channel.
#[derive(Debug)]
pub(crate) struct SideChannel {
    rank: usize,
    size: usize,
    timeout: Duration,
    /// Rank 0: ranks 1..P in order. Others: rank 0.
    peers: Vec<Peer>,
    poll: Option<Poll>,
    events: Events,
}

impl SideChannel {
    /// Joins the side channel of a group of `size` ranks whose rank 0 listens at
    /// `coordinator`, waiting at most `timeout` for the others.
    ///
    /// # Errors
    ///
    /// Rank 0: the address cannot be bound, or a rank does not connect in time, or sends a
    /// rank that is out of range or taken. Others: rank 0 cannot be reached in time.
    pub(crate) fn connect(
        rank: usize,
        size: usize,
        coordinator: SocketAddr,
        timeout: Duration,
    ) -> Result<SideChannel> {
        let peers = if rank == 0 {
            accept_all(size, coordinator, timeout)?
        } else {
            vec![connect_to_root(rank, coordinator, timeout)?]
        };
        Ok(SideChannel {
            rank,
            size,
            timeout,
            peers,
            poll: None,
            events: Events::with_capacity(16),
        })
    }

    /// Concatenates every rank's `mine` (all the same length) in rank order.
    ///
    /// # Errors
    ///
    /// A peer closes or stalls for the timeout; the error names it.
    pub(crate) fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<u8>> {
        let n = mine.len();
        let mut out = vec![0u8; n * self.size];
        let deadline = crate::options::deadline(Instant::now(), self.timeout);
        let timeout = self.timeout;
        if self.rank == 0 {
            out[..n].copy_from_slice(mine);
            for (i, peer) in self.peers.iter_mut().enumerate() {
                let k = i + 1;
                transfer(peer, deadline, timeout, PeerOp::Receive, |s| {
                    s.read_exact(&mut out[k * n..(k + 1) * n])
                })?;
            }
            for peer in &mut self.peers {
                transfer(peer, deadline, timeout, PeerOp::Send, |s| s.write_all(&out))?;
            }
        } else {
            let root = &mut self.peers[0];
            transfer(root, deadline, timeout, PeerOp::Send, |s| s.write_all(mine))?;
            transfer(root, deadline, timeout, PeerOp::Receive, |s| {
                s.read_exact(&mut out)
            })?;
        }
        Ok(out)
    }

    /// Every rank's `int`, in rank order.
    ///
    /// # Errors
    ///
    /// As [`SideChannel::all_gather`].
    pub(crate) fn all_gather_int(&mut self, value: i32) -> Result<Vec<i32>> {
        let bytes = self.all_gather(&value.to_le_bytes())?;
        Ok(decode_ints(&bytes))
    }

    /// Every rank's records, as MLX's `SideChannel::all_gather` of a vector: counts first,
    /// then the records padded to the longest list. This rank's are encoded `how`.
    ///
    /// # Errors
    ///
    /// As [`SideChannel::all_gather`]; a peer announcing a negative count, or more than
    /// [`MAX_RECORDS`], is an error naming it.
    pub(crate) fn all_gather_records(
        &mut self,
        records: &[Destination],
        how: Records,
    ) -> Result<Gathered> {
        let counts = record_counts(&self.all_gather_int(records.len() as i32)?)?;
        let max = counts.iter().copied().max().unwrap_or(0);
        let gathered = self.all_gather(&pack_records(records, max, how))?;
        Ok(unpack_records(&gathered, &counts, max))
    }

    /// MLX's side-channel barrier: two all-gathers of the `int` 0.
    ///
    /// # Errors
    ///
    /// As [`SideChannel::all_gather`].
    pub(crate) fn barrier(&mut self) -> Result<()> {
        self.all_gather_int(0)?;
        self.all_gather_int(0)?;
        Ok(())
    }

    /// Ends set-up: from now on the connections only carry failure notices, and are watched
    /// for a peer that goes away.
    ///
    /// # Errors
    ///
    /// The sockets cannot be made non-blocking or registered with the poller.
    pub(crate) fn start_watching(&mut self) -> Result<()> {
        let poll =
            Poll::new().map_err(|e| Error::local("creating the side channel's poller", e))?;
        for (i, peer) in self.peers.iter_mut().enumerate() {
            let stream = peer
                .stream
                .try_clone()
                .and_then(|s| {
                    s.set_nonblocking(true)?;
                    Ok(s)
                })
                .map_err(|e| Error::local("watching the side channel", e))?;
            let mut stream = mio::net::TcpStream::from_std(stream);
            poll.registry()
                .register(&mut stream, Token(i), Interest::READABLE)
                .map_err(|e| Error::local("watching the side channel", e))?;
            peer.watched = Some(stream);
        }
        self.poll = Some(poll);
        Ok(())
    }

    /// Waits up to `wait` for something to happen on the side channel (a peer closing, or a
    /// failure notice); this is how a collective with nothing to do sleeps.
    pub(crate) fn sleep(&mut self, wait: Duration) {
        match &mut self.poll {
            Some(poll) => {
                let _ = poll.poll(&mut self.events, Some(wait));
            }
            None => std::thread::sleep(wait),
        }
    }

    /// Checks every peer for end of stream or a failure notice, without blocking.
    ///
    /// # Errors
    ///
    /// [`Error::Lost`] when a peer's notice names another lost rank, [`Error::Closed`] when a
    /// peer is gone (or gave up on this rank), during `context`.
    pub(crate) fn check(&mut self, context: Phase) -> Result<()> {
        self.check_needed(context, &|_| true)
    }

    /// [`SideChannel::check`], reporting a peer that closed without a failure notice only if
    /// `needed` is true for it: a rank that finished and exited is no failure for a rank that
    /// no longer waits on it. Failure notices are always reported.
    ///
    /// # Errors
    ///
    /// As [`SideChannel::check`].
    pub(crate) fn check_needed(
        &mut self,
        context: Phase,
        needed: &dyn Fn(usize) -> bool,
    ) -> Result<()> {
        let me = self.rank;
        let ranks = self.size;
        for peer in &mut self.peers {
            let Some(stream) = &mut peer.watched else {
                continue;
            };
            let mut buf = [0u8; 64];
            let gone = loop {
                match stream.read(&mut buf) {
                    Ok(0) => break Some(peer_gone(peer, me, ranks, context)),
                    Ok(n) => {
                        peer.notice.extend_from_slice(&buf[..n]);
                        if peer.notice.len() >= 4 {
                            break Some(peer_gone(peer, me, ranks, context));
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break None,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                        break Some(peer_gone(peer, me, ranks, context));
                    }
                    Err(e) => {
                        break Some(Error::Io {
                            peer: peer.rank,
                            addr: Some(peer.addr),
                            op: PeerOp::Receive,
                            context,
                            source: Arc::new(e),
                        });
                    }
                }
            };
            // A failure notice always matters: a rank gave up, and the collective cannot
            // finish. A bare end of stream may be a rank that finished and exited.
            if let Some(error) = gone
                && (peer.notice.len() >= 4 || error.peer().is_none_or(needed))
            {
                return Err(error);
            }
        }
        Ok(())
    }

    /// Tells every peer that this rank gives up because it lost rank `lost` (if known), and
    /// closes the side channel's sending side. Best effort: peers that are gone are skipped.
    pub(crate) fn abandon(&mut self, lost: Option<usize>) {
        for peer in &mut self.peers {
            if let Some(lost) = lost.filter(|&l| l != peer.rank) {
                let _ = peer.stream.set_nonblocking(true);
                let _ = peer.stream.write(&encode_notice(lost));
            }
            let _ = peer.stream.shutdown(std::net::Shutdown::Write);
        }
    }
}

/// The error for a peer that closed its side channel ([`closed_after`] its notice).
fn peer_gone(peer: &Peer, me: usize, ranks: usize, context: Phase) -> Error {
    closed_after(&peer.notice, peer.rank, me, ranks, context)
}

/// Runs a blocking transfer on `peer` with the socket's timeout set to what is left until
/// `deadline`, turning failures into errors naming the peer.
fn transfer(
    peer: &mut Peer,
    deadline: Instant,
    timeout: Duration,
    op: PeerOp,
    f: impl FnOnce(&mut TcpStream) -> io::Result<()>,
) -> Result<()> {
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    let set = match op {
        PeerOp::Send => peer.stream.set_write_timeout(Some(left)),
        _ => peer.stream.set_read_timeout(Some(left)),
    };
    set.map_err(|e| io_error(peer, op, e))?;
    f(&mut peer.stream).map_err(|e| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Error::Timeout {
            peer: peer.rank,
            addr: Some(peer.addr),
            op,
            context: SETUP,
            after: timeout,
        },
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::ConnectionAborted => Error::Closed {
            peer: peer.rank,
            op,
            context: SETUP,
        },
        _ => io_error(peer, op, e),
    })
}

fn io_error(peer: &Peer, op: PeerOp, e: io::Error) -> Error {
    Error::Io {
        peer: peer.rank,
        addr: Some(peer.addr),
        op,
        context: SETUP,
        source: Arc::new(e),
    }
}

/// Rank 0: listens at `addr` and takes P-1 connections, each introduced by its rank.
fn accept_all(size: usize, addr: SocketAddr, timeout: Duration) -> Result<Vec<Peer>> {
    let listener = listen(addr)?;
    let started = Instant::now();
    let deadline = crate::options::deadline(started, timeout);
    let mut reports = Reports::new(started);
    let mut slots: Vec<Option<Peer>> = (1..size).map(|_| None).collect();
    let mut joined = 0;
    while joined < size - 1 {
        let (stream, from) = match listener.accept() {
            Ok(accepted) => accepted,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let now = Instant::now();
                if let Some(elapsed) = reports.take(now) {
                    let missing: Vec<usize> =
                        (1..size).filter(|r| slots[r - 1].is_none()).collect();
                    verbose!(
                        info: 0,
                        "still forming the JACCL side channel after {elapsed:.1?} (the timeout is {timeout:?}); waiting for rank(s) {missing:?} to connect to {addr}"
                    );
                }
                if now >= deadline {
                    let missing = slots.iter().position(Option::is_none).map_or(1, |i| i + 1);
                    return Err(Error::Timeout {
                        peer: missing,
                        addr: None,
                        op: PeerOp::Accept,
                        context: SETUP,
                        after: timeout,
                    });
                }
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::local(format!("accepting on {addr}"), e)),
        };
        let setup = |e: io::Error| Error::local(format!("setting up a connection from {from}"), e);
        stream.set_nonblocking(false).map_err(setup)?;
        stream.set_nodelay(true).map_err(setup)?;
        let mut peer = Peer {
            rank: usize::MAX,
            addr: from,
            stream,
            watched: None,
            notice: Vec::new(),
        };
        let mut rank = [0u8; 4];
        let read = transfer(&mut peer, deadline, timeout, PeerOp::Receive, |s| {
            s.read_exact(&mut rank)
        });
        if read.is_err() {
            // A client that connects and says nothing (or hangs up) is not one of ours: it is
            // dropped, and rank 0 keeps waiting for the ranks it needs.
            continue;
        }
        let slot = joining_rank(rank, size, from)?;
        if slots[slot - 1].is_some() {
            return Err(Error::Environment {
                var: crate::config::env::RANK_VAR,
                reason: format!(
                    "two clients joined the JACCL side channel as rank {slot} (the second from \
                     {from}): check {} on every host",
                    crate::config::env::RANK_VAR
                ),
            });
        }
        peer.rank = slot;
        slots[slot - 1] = Some(peer);
        joined += 1;
    }
    Ok(slots.into_iter().flatten().collect())
}

fn listen(addr: SocketAddr) -> Result<TcpListener> {
    let local = |e: io::Error| {
        Error::local(
            format!(
                "listening for the JACCL side channel at {addr} (rank 0 must own the \
                 coordinator address)"
            ),
            e,
        )
    };
    let socket =
        Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP)).map_err(local)?;
    socket.set_reuse_address(true).map_err(local)?;
    #[cfg(unix)]
    socket.set_reuse_port(true).map_err(local)?;
    socket.bind(&addr.into()).map_err(local)?;
    socket.listen(128).map_err(local)?;
    let listener: TcpListener = socket.into();
    listener.set_nonblocking(true).map_err(local)?;
    Ok(listener)
}

/// Ranks 1..P: connects to rank 0, retrying until `timeout`, and introduces itself.
fn connect_to_root(rank: usize, addr: SocketAddr, timeout: Duration) -> Result<Peer> {
    let started = Instant::now();
    let deadline = crate::options::deadline(started, timeout);
    let mut reports = Reports::new(started);
    let mut wait = Duration::from_millis(10);
    let stream = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match TcpStream::connect_timeout(&addr, left.max(Duration::from_millis(1))) {
            Ok(stream) => break stream,
            Err(e) if Instant::now() + wait < deadline => {
                if let Some(elapsed) = reports.take(Instant::now()) {
                    verbose!(
                        info: rank,
                        "still forming the JACCL side channel after {elapsed:.1?} (the timeout is {timeout:?}); waiting for rank 0 to accept at {addr} (its last try failed: {e})"
                    );
                }
                std::thread::sleep(wait);
                wait = (wait * 2).min(Duration::from_millis(500));
            }
            Err(e) => {
                return Err(match e.kind() {
                    io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => Error::Timeout {
                        peer: 0,
                        addr: Some(addr),
                        op: PeerOp::Connect,
                        context: SETUP,
                        after: timeout,
                    },
                    _ => Error::Io {
                        peer: 0,
                        addr: Some(addr),
                        op: PeerOp::Connect,
                        context: SETUP,
                        source: Arc::new(e),
                    },
                });
            }
        }
    };
    let mut peer = Peer {
        rank: 0,
        addr,
        stream,
        watched: None,
        notice: Vec::new(),
    };
    peer.stream
        .set_nodelay(true)
        .map_err(|e| io_error(&peer, PeerOp::Connect, e))?;
    let hello = (rank as i32).to_le_bytes();
    transfer(&mut peer, deadline, timeout, PeerOp::Send, |s| {
        s.write_all(&hello)
    })?;
    Ok(peer)
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;
    use std::process::{Command, Stdio};
    use std::thread;

    use super::*;
    use crate::loopback_ports::free_addr;

    const T: Duration = Duration::from_secs(10);

    fn record(rank: usize, peer: usize) -> Destination {
        if rank == peer {
            return Destination::ABSENT;
        }
        let mut gid = [0u8; 16];
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&Ipv4Addr::new(169, 254, rank as u8, peer as u8).octets());
        Destination {
            lid: (rank * 16 + peer) as i32,
            qpn: 0x100 + (rank * 16 + peer) as u32,
            psn: 7,
            gid,
        }
    }

    fn mesh_records(rank: usize, size: usize) -> Vec<Destination> {
        (0..size).map(|p| record(rank, p)).collect()
    }

    #[test]
    fn destination_records_are_32_bytes_in_mlx_layout() {
        let d = Destination {
            lid: 0x0102_0304,
            qpn: 0x1122_3344,
            psn: 7,
            gid: core::array::from_fn(|i| 0xA0 + i as u8),
        };
        let b = d.encode();
        assert_eq!(&b[0..4], &[4, 3, 2, 1]);
        assert_eq!(&b[4..8], &[0x44, 0x33, 0x22, 0x11]);
        assert_eq!(&b[8..12], &[7, 0, 0, 0]);
        assert_eq!(&b[12..16], b"nvc1", "the padding carries the mark");
        assert_eq!(b[16], 0xA0);
        assert_eq!(b[31], 0xAF);
        assert_eq!(Destination::decode(&b), d);
        assert!(Destination::is_marked(&b));
        // MLX's bytes differ only in the padding, which decoding ignores.
        let mlx = d.encode_as_mlx();
        assert_eq!(&mlx[12..16], &[0; 4]);
        assert_eq!((&mlx[..12], &mlx[16..]), (&b[..12], &b[16..]));
        assert!(!Destination::is_marked(&mlx));
        assert_eq!(Destination::decode(&mlx), d);
        let mut dirty = b;
        dirty[12..16].copy_from_slice(&[9, 9, 9, 9]);
        assert_eq!(Destination::decode(&dirty), d);
        assert!(!Destination::is_marked(&dirty));
        let absent = Destination::ABSENT.encode();
        assert_eq!(&absent[0..4], &[0xff; 4]);
        assert!(!Destination::decode(&absent).is_present());
    }

    #[test]
    fn record_lists_are_padded_to_the_longest() {
        let a = [record(0, 1)];
        let b = [record(1, 0), record(1, 2), record(1, 3)];
        let packed_a = pack_records(&a, 3, Records::Nuvec);
        assert_eq!(packed_a.len(), 96);
        assert_eq!(&packed_a[..32], &a[0].encode());
        assert!(packed_a[32..].iter().all(|&x| x == 0));
        let mut gathered = packed_a;
        gathered.extend(pack_records(&b, 3, Records::Mlx));
        gathered.extend(pack_records(&[], 3, Records::Nuvec));
        let lists = unpack_records(&gathered, &[1, 3, 0], 3);
        assert_eq!(lists.records, vec![a.to_vec(), b.to_vec(), vec![]]);
        // A rank is nuvec's only if it published records and marked every one.
        assert_eq!(lists.nuvec, [true, false, false]);
        let mut half = pack_records(&b, 3, Records::Nuvec);
        half[32 + 12] = 0;
        assert_eq!(unpack_records(&half, &[3], 3).nuvec, [false]);
        assert_eq!(encode_notice(5), [5, 0, 0, 0]);
        assert_eq!(decode_notice([5, 0, 0, 0]), 5);
    }

    #[test]
    fn counts_are_refused_below_0_and_above_mlx_limits() {
        assert_eq!(record_counts(&[8, 0, 4]).unwrap(), [8, 0, 4]);
        for (counts, peer) in [
            (&[2, -1, 2][..], 1),
            (&[2, 2, 9][..], 2),
            (&[i32::MIN][..], 0),
        ] {
            let e = record_counts(counts).unwrap_err();
            assert_eq!(e.peer(), Some(peer), "{e}");
            assert!(e.to_string().contains("queue-pair records"), "{e}");
        }
        assert_eq!(
            decode_ints(&[1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 9]),
            [1, -1]
        );
    }

    #[test]
    fn a_joining_rank_must_be_one_of_the_others() {
        let from: SocketAddr = "127.0.0.1:9".parse().unwrap();
        assert_eq!(joining_rank(2i32.to_le_bytes(), 3, from).unwrap(), 2);
        for rank in [0, 3, -1, i32::MAX] {
            let e = joining_rank(rank.to_le_bytes(), 3, from).unwrap_err();
            assert!(e.to_string().contains(&format!("as rank {rank}")), "{e}");
        }
    }

    #[test]
    fn a_notice_names_a_third_rank_or_the_sender_is_blamed() {
        let c = Phase::AllGather;
        let lost = |e: Error| match e {
            Error::Lost { peer, via, .. } => Some((peer, via)),
            Error::Closed { .. } => None,
            other => panic!("{other}"),
        };
        assert_eq!(
            lost(closed_after(&encode_notice(3), 1, 0, 4, c)),
            Some((3, 1))
        );
        // Trailing bytes after the notice are ignored.
        assert_eq!(
            lost(closed_after(&[2, 0, 0, 0, 7], 1, 0, 4, c)),
            Some((2, 1))
        );
        // Naming the sender, this rank or no rank of the group, or too short: the sender.
        for notice in [
            &encode_notice(1)[..],
            &encode_notice(0),
            &encode_notice(4),
            &[3, 0, 0],
        ] {
            let e = closed_after(notice, 1, 0, 4, c);
            assert_eq!((lost(e.clone()), e.peer()), (None, Some(1)), "{notice:?}");
        }
    }

    fn read_n(s: &mut TcpStream, n: usize) -> Vec<u8> {
        let mut b = vec![0u8; n];
        s.read_exact(&mut b).unwrap();
        b
    }

    /// What an MLX rank k >= 1 does at mesh set-up, in raw bytes: connect, send its rank,
    /// then counts, records and the barrier, checking every byte rank 0 sends back.
    fn mlx_mesh_client(addr: SocketAddr, rank: usize, size: usize) {
        let mut s = loop {
            match TcpStream::connect(addr) {
                Ok(s) => break s,
                Err(_) => thread::sleep(Duration::from_millis(5)),
            }
        };
        s.write_all(&(rank as i32).to_le_bytes()).unwrap();
        // Counts: each rank sends P as an int; rank 0 answers with P ints.
        s.write_all(&(size as i32).to_le_bytes()).unwrap();
        let counts = read_n(&mut s, 4 * size);
        for c in counts.chunks(4) {
            assert_eq!(c, (size as i32).to_le_bytes());
        }
        // Records: P x 32 bytes per rank; rank 0 answers with every rank's, in rank order.
        s.write_all(&pack_records(&mesh_records(rank, size), size, Records::Mlx))
            .unwrap();
        let all = read_n(&mut s, size * size * 32);
        let mut expected = Vec::new();
        for r in 0..size {
            // Rank 0 (nuvec's) marks its records; every MLX rank's bytes are relayed as sent.
            let how = if r == 0 { Records::Nuvec } else { Records::Mlx };
            expected.extend(pack_records(&mesh_records(r, size), size, how));
        }
        assert_eq!(all, expected);
        // Barrier: two all-gathers of the int 0.
        for _ in 0..2 {
            s.write_all(&0i32.to_le_bytes()).unwrap();
            assert_eq!(read_n(&mut s, 4 * size), vec![0u8; 4 * size]);
        }
    }

    #[test]
    fn rank_0_speaks_mlx_bytes_to_mlx_ranks_joining_in_any_order() {
        let addr = free_addr();
        let size = 4;
        // Ranks 3, 1, 2 join in that order.
        let clients: Vec<_> = [3, 1, 2]
            .into_iter()
            .map(|rank| {
                thread::spawn(move || {
                    thread::sleep(Duration::from_millis(20 * rank as u64));
                    mlx_mesh_client(addr, rank, size)
                })
            })
            .collect();
        let mut sc = SideChannel::connect(0, size, addr, T).unwrap();
        let infos = sc
            .all_gather_records(&mesh_records(0, size), Records::Nuvec)
            .unwrap();
        for (r, list) in infos.records.iter().enumerate() {
            assert_eq!(list, &mesh_records(r, size));
        }
        assert_eq!(infos.nuvec, [true, false, false, false]);
        sc.barrier().unwrap();
        for c in clients {
            c.join().unwrap();
        }
    }

    #[test]
    fn a_rank_speaks_mlx_bytes_to_an_mlx_rank_0() {
        let addr = free_addr();
        let listener = TcpListener::bind(addr).unwrap();
        let size = 2;
        let root = thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            assert_eq!(read_n(&mut s, 4), 1i32.to_le_bytes());
            // Ring set-up as MLX rank 0 runs it: count, left records, count, right records,
            // barrier. Rank 0 has one wire each side.
            let mine_left = [record(0, 10)];
            let mine_right = [record(0, 11)];
            for mine in [&mine_left, &mine_right] {
                let count = read_n(&mut s, 4);
                assert_eq!(count, 1i32.to_le_bytes());
                let mut counts = 1i32.to_le_bytes().to_vec();
                counts.extend(count);
                s.write_all(&counts).unwrap();
                let theirs = read_n(&mut s, 32);
                // What MLX reads of the nuvec rank's record is MLX's own layout; only the
                // padding, which MLX never reads, carries the mark.
                let wire: [u8; 32] = theirs.clone().try_into().unwrap();
                let mlx = Destination::decode(&wire).encode_as_mlx();
                assert_eq!(wire[..12], mlx[..12]);
                assert_eq!(wire[16..], mlx[16..]);
                assert!(Destination::is_marked(&wire));
                let mut all = mine[0].encode_as_mlx().to_vec();
                all.extend(&theirs);
                s.write_all(&all).unwrap();
            }
            for _ in 0..2 {
                assert_eq!(read_n(&mut s, 4), [0; 4]);
                s.write_all(&[0; 8]).unwrap();
            }
            // Keep the connection open until the client is done.
            let mut rest = Vec::new();
            let _ = s.read_to_end(&mut rest);
        });
        let mut sc = SideChannel::connect(1, size, addr, T).unwrap();
        let left = sc
            .all_gather_records(&[record(1, 10)], Records::Nuvec)
            .unwrap();
        assert_eq!(left.records, vec![vec![record(0, 10)], vec![record(1, 10)]]);
        assert_eq!(left.nuvec, [false, true], "MLX's rank 0, this nuvec rank");
        let right = sc
            .all_gather_records(&[record(1, 11)], Records::Nuvec)
            .unwrap();
        assert_eq!(
            right.records,
            vec![vec![record(0, 11)], vec![record(1, 11)]]
        );
        sc.barrier().unwrap();
        drop(sc);
        root.join().unwrap();
    }

    #[test]
    fn a_rank_that_never_joins_is_named() {
        let addr = free_addr();
        let client = thread::spawn(move || {
            SideChannel::connect(1, 3, addr, Duration::from_secs(5)).map(|_| ())
        });
        let e = SideChannel::connect(0, 3, addr, Duration::from_millis(400)).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Timeout {
                    peer: 2,
                    op: PeerOp::Accept,
                    ..
                }
            ),
            "{e}"
        );
        let _ = client.join();
    }

    #[test]
    fn an_unreachable_coordinator_is_named() {
        let addr = free_addr();
        let e = SideChannel::connect(2, 3, addr, Duration::from_millis(300)).unwrap_err();
        assert_eq!(e.peer(), Some(0), "{e}");
        assert!(e.to_string().contains(&addr.to_string()), "{e}");
    }

    #[test]
    fn ranks_out_of_range_or_twice_are_refused() {
        for ranks in [[5i32, 1], [1, 1]] {
            let addr = free_addr();
            let clients: Vec<_> = ranks
                .into_iter()
                .enumerate()
                .map(|(i, rank)| {
                    thread::spawn(move || {
                        thread::sleep(Duration::from_millis(30 * i as u64));
                        let mut s = loop {
                            match TcpStream::connect(addr) {
                                Ok(s) => break s,
                                Err(_) => thread::sleep(Duration::from_millis(5)),
                            }
                        };
                        s.write_all(&rank.to_le_bytes()).unwrap();
                        let _ = s.read(&mut [0u8; 1]);
                    })
                })
                .collect();
            let e = SideChannel::connect(0, 3, addr, T).unwrap_err().to_string();
            assert!(e.contains("as rank"), "{e}");
            drop(clients);
        }
    }

    #[test]
    fn a_silent_client_is_dropped_and_rank_0_keeps_waiting() {
        let addr = free_addr();
        let stray = thread::spawn(move || {
            let s = loop {
                match TcpStream::connect(addr) {
                    Ok(s) => break s,
                    Err(_) => thread::sleep(Duration::from_millis(5)),
                }
            };
            drop(s); // hangs up without a rank
        });
        let real = thread::spawn(move || {
            thread::sleep(Duration::from_millis(100));
            let mut sc = SideChannel::connect(1, 2, addr, T).unwrap();
            sc.barrier().unwrap();
        });
        let mut sc = SideChannel::connect(0, 2, addr, T).unwrap();
        sc.barrier().unwrap();
        stray.join().unwrap();
        real.join().unwrap();
    }

    /// The variable that makes a test process act as one rank of
    /// `side_channel_across_real_processes`.
    const CHILD: &str = "NUVEC_JACCL_SIDE_CHANNEL_CHILD";

    /// Each rank process reads its configuration from the environment as `mlx.launch` sets it,
    /// exchanges records and passes the barrier; then rank 3 exits and the others must learn,
    /// from the side channel alone, that rank 3 is gone: rank 0 sees it close, and ranks 1 and
    /// 2 hear it from rank 0's failure notice.
    #[test]
    fn side_channel_across_real_processes() {
        let size = 4;
        if let Ok(rank) = std::env::var(CHILD) {
            let rank: usize = rank.parse().unwrap();
            child(rank, size);
            return;
        }
        let dir = std::env::temp_dir().join(format!("nuvec-jaccl-sc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let devices = dir.join("devices.json");
        let cell = |i: usize, j: usize| {
            if i == j {
                "null".to_string()
            } else {
                format!("\"rdma_en{}\"", 2 + j)
            }
        };
        let rows: Vec<String> = (0..size)
            .map(|i| {
                let cells: Vec<String> = (0..size).map(|j| cell(i, j)).collect();
                format!("[{}]", cells.join(","))
            })
            .collect();
        std::fs::write(&devices, format!("[{}]", rows.join(","))).unwrap();
        let addr = free_addr();
        let exe = std::env::current_exe().unwrap();
        let children: Vec<_> = (0..size)
            .map(|rank| {
                let mut cmd = Command::new(&exe);
                cmd.args([
                    "jaccl::bootstrap::tests::side_channel_across_real_processes",
                    "--exact",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD, rank.to_string())
                .env("MLX_RANK", "99") // JACCL_RANK wins over MLX_RANK
                .env("JACCL_RANK", rank.to_string())
                .env("MLX_IBV_DEVICES", &devices)
                .env("MLX_JACCL_COORDINATOR", addr.to_string())
                .env_remove("JACCL_IBV_DEVICES")
                .env_remove("JACCL_COORDINATOR")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
                if rank == 2 {
                    cmd.env("MLX_JACCL_RING", "1");
                }
                cmd.spawn().unwrap()
            })
            .collect();
        let outputs: Vec<_> = children
            .into_iter()
            .map(|c| c.wait_with_output().unwrap())
            .collect();
        let _ = std::fs::remove_dir_all(&dir);
        for (rank, o) in outputs.iter().enumerate() {
            let stdout = String::from_utf8_lossy(&o.stdout);
            assert!(
                o.status.success() && stdout.contains("SIDE-CHANNEL-OK"),
                "rank {rank} failed:\n{stdout}\n{}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
    }

    fn child(rank: usize, size: usize) {
        let config = crate::jaccl::config::Config::from_env().unwrap();
        assert_eq!(config.rank, rank);
        assert_eq!(config.size(), size);
        assert_eq!(config.prefer_ring, rank == 2);
        let addr = config.coordinator_addr().unwrap();
        let mut sc = SideChannel::connect(rank, size, addr, T).unwrap();
        let all = sc
            .all_gather_records(&mesh_records(rank, size), Records::Nuvec)
            .unwrap();
        assert_eq!(all.nuvec, [true; 4]);
        for (r, list) in all.records.iter().enumerate() {
            assert_eq!(list, &mesh_records(r, size));
        }
        sc.barrier().unwrap();
        sc.start_watching().unwrap();
        if rank == 3 {
            sc.check(Phase::HealthCheck).unwrap();
            println!("SIDE-CHANNEL-OK");
            std::process::exit(0);
        }
        // The others may already see rank 3 gone at their first check: the loop below
        // expects exactly that.
        let deadline = Instant::now() + T;
        let error = loop {
            if let Err(e) = sc.check(Phase::HealthCheck) {
                break e;
            }
            assert!(
                Instant::now() < deadline,
                "rank {rank} never noticed rank 3"
            );
            sc.sleep(Duration::from_millis(50));
        };
        if rank == 0 {
            assert!(
                matches!(error, Error::Closed { peer: 3, .. }),
                "rank 0: {error}"
            );
            sc.abandon(error.lost_peer());
        } else {
            assert!(
                matches!(
                    error,
                    Error::Lost {
                        peer: 3,
                        via: 0,
                        ..
                    }
                ),
                "rank {rank}: {error}"
            );
        }
        println!("SIDE-CHANNEL-OK");
    }
}
