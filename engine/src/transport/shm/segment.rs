//! The segment: where everything sits in it ([`Layout`]), the mapping with checked access
//! ([`Segment`]), what the wire above tells it about a call's header ([`CallHeader`]), and
//! how the ranks of one host set one up over their TCP connections ([`establish`]).
//!
//! # Layout
//!
//! | offset | what |
//! |---|---|
//! | 0 | u32: ranks other than the creator that mapped the segment (the creator unlinks it when all did) |
//! | `LINE + r * CTRL` | rank `r`'s step word (u32): the last step it published |
//! | `... + 8` | rank `r`'s refusal word (u32): 0, or 1 + the rank whose group collective its `recv` refused |
//! | `... + 16`, `... + 32` | rank `r`'s collective header for even / odd steps (16 bytes each) |
//! | `... + 48` | rank `r`'s refused `recv`'s header (16 bytes), valid once its refusal word is set |
//! | `... + LINE` | rank `r`'s sleepers (u32): peers sleeping on its step word |
//! | `data(r, h)` | rank `r`'s buffer `h` (0, 1) of [`CHUNK`] bytes, page-aligned |
//! | `pairs()` | the `send`/`recv` channels, one per ordered pair of ranks (see `super::p2p`) |
//!
//! Each rank writes only its own words, headers and buffers; the step word and the sleepers
//! sit on different cache lines, so a spinning reader does not disturb the writer's line.
//!
//! # Setup
//!
//! A segment holds the ranks of one host (a *domain*): the whole group when every rank is
//! on one host, else each host's ranks (see `native::hier`). Below, "rank 0" is the
//! domain's lowest rank and ranks are positions in the domain (`ranks` maps them to the
//! group's ranks wherever a connection or an error names one).
//!
//! Rank 0 creates the segment under a name derived from the group identity (which covers
//! the key, if any) and 16 random bytes of its own, with `O_EXCL` and mode 0600, and sends
//! the random bytes to every peer over its mesh connection. Each peer maps the segment,
//! counts itself in, and tells rank 0 over the connection whether it could (`domain`: a
//! rank that shares the host identity but not `/dev/shm` cannot, and the group keeps TCP,
//! which rank 0's verdict tells every rank); rank 0 removes the file as soon as all did
//! (`super::Link::establish` waits for the count), before the first collective. A file
//! from a crashed run is never reused (the name is new each time); a rank that dies
//! leaves none behind once the group formed, and a failed setup removes it (the creator's
//! mapping does when it drops).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::domain::{self, SETUP};
use crate::auth;
use crate::element::DType;
use crate::error::{Error, PeerOp, Phase, Result};
use crate::reduce::{ReduceOp, reduce_into};
use crate::transport::tcp::notice::Inquiry;
use crate::transport::tcp::{Conn, Connections as Transport, Transfer};

/// A cache line and its neighbour (adjacent-line prefetch pairs them).
pub(crate) const LINE: usize = 128;

/// Bytes of each rank's control block: its step word and headers, then its sleepers.
const CTRL: usize = 2 * LINE;

/// Bytes of each of a rank's two buffers: large enough that the two waits a chunk costs
/// are small against its copies, small enough that P of them stay in the caches.
pub(crate) const CHUNK: usize = 1 << 20;

/// Bytes of a call's header in the segment (the wire above defines what they say).
pub(crate) const HEADER_BYTES: usize = 16;

/// The setup message rank 0 sends every peer: a flag (1: shared memory, 0: every link
/// stays TCP), then the segment's 16 random bytes.
pub(crate) const OFFER_BYTES: usize = 17;

/// The `derive_key` context of segment names.
const NAME_CONTEXT: &str = "nuvec-distributed 2026-12-03 shared-memory segment name v1";

/// What shared memory needs to know about a call of the wire above it: the header the
/// call publishes (opaque bytes to the segment) and that wire's rules for comparing it
/// with a peer's, which make the errors that name both calls. The segment never decodes
/// a header itself; the native wire's `Call` implements this.
pub(crate) trait CallHeader {
    /// The header this call publishes.
    fn encode(&self) -> [u8; HEADER_BYTES];

    /// Compares `theirs`, which rank `peer` published for the same step or message, with
    /// this call of rank `me`: an error names both calls when they differ. `theirs` equal
    /// to this call's own [`CallHeader::encode`] must be accepted: the engine does not ask
    /// about those.
    ///
    /// # Errors
    ///
    /// The calls differ, or `theirs` is no header.
    fn check(&self, me: usize, peer: usize, theirs: &[u8; HEADER_BYTES]) -> Result<()>;

    /// What this call (a `recv`) answers on the sender's connection when it refuses the
    /// sender's message, so that the sender learns of it.
    fn rejection(&self) -> [u8; HEADER_BYTES];

    /// The error for this group collective of rank `me` against the `recv` of `peer`
    /// (header `theirs`, waiting for a message from rank `from`) that refused it; `ranks`
    /// is `(me, peer, from)`.
    fn refused_by(
        &self,
        ranks: (usize, usize, usize),
        theirs: &[u8; HEADER_BYTES],
        context: Phase,
    ) -> Error;

    /// Compares this group collective, which `peer` entered, with the send of rank `me` to
    /// `peer` (header `sent`) that `peer` has not taken; `ranks` is `(me, peer)`.
    ///
    /// # Errors
    ///
    /// The mismatch naming the send and this call, or a bug if `sent` is no header.
    fn unmatched_send(
        &self,
        ranks: (usize, usize),
        sent: &[u8; HEADER_BYTES],
        context: Phase,
    ) -> Result<()>;
}

/// Where everything of a group of `size` ranks sits (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    size: usize,
    chunk: usize,
    /// Bytes of the `send`/`recv` channels (see `super::p2p::bytes`).
    pairs: usize,
}

impl Layout {
    /// The layout for `size` ranks with buffers of `chunk` bytes (a multiple of 4096) and
    /// `pairs` bytes of `send`/`recv` channels after them.
    #[inline]
    pub(crate) fn new(size: usize, chunk: usize, pairs: usize) -> Layout {
        Layout { size, chunk, pairs }
    }

    /// Bytes of each buffer.
    #[inline]
    pub(crate) fn chunk(&self) -> usize {
        self.chunk
    }

    /// The count of ranks that mapped the segment (u32).
    #[inline]
    pub(crate) fn mapped(&self) -> usize {
        0
    }

    /// Rank `r`'s step word (u32).
    #[inline]
    pub(crate) fn step(&self, r: usize) -> usize {
        LINE + r * CTRL
    }

    /// Rank `r`'s refusal word (u32): 0, or 1 + the rank its `recv` found in a group
    /// collective.
    #[inline]
    pub(crate) fn refused(&self, r: usize) -> usize {
        LINE + r * CTRL + 8
    }

    /// Rank `r`'s refused `recv`'s header (16 bytes).
    #[inline]
    pub(crate) fn refusal(&self, r: usize) -> usize {
        LINE + r * CTRL + 48
    }

    /// Rank `r`'s header for steps of parity `half`.
    #[inline]
    pub(crate) fn header(&self, r: usize, half: usize) -> usize {
        LINE + r * CTRL + 16 + 16 * half
    }

    /// Rank `r`'s count of peers sleeping on its step word (u32).
    #[inline]
    pub(crate) fn sleepers(&self, r: usize) -> usize {
        LINE + r * CTRL + LINE
    }

    #[inline]
    fn data_base(&self) -> usize {
        (LINE + self.size * CTRL).next_multiple_of(4096)
    }

    /// Rank `r`'s buffer for steps of parity `half`.
    #[inline]
    pub(crate) fn data(&self, r: usize, half: usize) -> usize {
        self.data_base() + (2 * r + half) * self.chunk
    }

    /// Ranks in the group.
    #[inline]
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// Where the `send`/`recv` channels start (page-aligned: the buffers before them are
    /// whole pages).
    #[inline]
    pub(crate) fn pairs(&self) -> usize {
        self.data_base() + 2 * self.size * self.chunk
    }

    /// Bytes of the whole segment.
    #[inline]
    pub(crate) fn bytes(&self) -> usize {
        self.pairs() + self.pairs
    }
}

/// Whether a word holding `word` (a step word, a channel's counter) has reached `value`
/// (wrapping: values are compared within half the u32 range of each other).
#[inline]
pub(crate) fn reached(word: u32, value: u32) -> bool {
    word.wrapping_sub(value) as i32 >= 0
}

/// One rank's mapping of a segment, with its layout; every access is checked against the
/// mapping, and an access outside it is a bug in the layout, named in the error.
#[derive(Debug)]
pub(crate) struct Segment {
    map: ffi::shm::Segment,
    layout: Layout,
    path: PathBuf,
}

impl Segment {
    /// A segment of `layout` that this process alone maps, at `path` (measurements that
    /// stand in for the peers themselves).
    #[cfg(test)]
    pub(crate) fn create(path: PathBuf, layout: Layout) -> std::io::Result<Segment> {
        let map = ffi::shm::Segment::create(&path, layout.bytes())?;
        Ok(Segment { map, layout, path })
    }

    /// The layout.
    pub(crate) fn layout(&self) -> Layout {
        self.layout
    }

    /// Whether the pages are locked in memory.
    pub(crate) fn locked(&self) -> bool {
        self.map.locked()
    }

    /// The u32 at `off`.
    #[inline]
    pub(crate) fn word(&self, off: usize, context: Phase) -> Result<&AtomicU32> {
        self.map.u32_at(off).ok_or_else(|| Error::Bug {
            context,
            what: format!("the shared-memory layout: no aligned u32 at {off}"),
        })
    }

    /// Copies `src` to `off`.
    #[inline]
    pub(crate) fn copy_in(&self, off: usize, src: &[u8], context: Phase) -> Result<()> {
        self.map
            .copy_in(off, src)
            .map_err(|e| layout_bug(context, &e))
    }

    /// Copies the `dst.len()` bytes at `off` into `dst`.
    #[inline]
    pub(crate) fn copy_out(&self, off: usize, dst: &mut [u8], context: Phase) -> Result<()> {
        self.map
            .copy_out(off, dst)
            .map_err(|e| layout_bug(context, &e))
    }

    /// The header at `off`.
    #[inline]
    pub(crate) fn header(&self, off: usize, context: Phase) -> Result<[u8; HEADER_BYTES]> {
        let mut got = [0u8; HEADER_BYTES];
        self.copy_out(off, &mut got, context)?;
        Ok(got)
    }

    /// Folds the `acc.len()` bytes at `off` into `acc` (`acc op segment`).
    #[inline]
    pub(crate) fn fold(
        &self,
        (op, dtype): (ReduceOp, DType),
        acc: &mut [u8],
        off: usize,
        context: Phase,
    ) -> Result<()> {
        self.map
            .read_with(off, acc.len(), |src| reduce_into(op, dtype, acc, src))
            .map_err(|e| layout_bug(context, &e))
    }

    /// Removes the segment's file (the creator, once every peer mapped it).
    ///
    /// # Errors
    ///
    /// The file could not be removed.
    pub(crate) fn remove(&mut self) -> Result<()> {
        let path = &self.path;
        self.map
            .unlink()
            .map_err(|e| Error::local(format!("removing {}", path.display()), e))
    }
}

/// A bug: the layout put a word or a range outside the segment.
fn layout_bug(context: Phase, e: &std::io::Error) -> Error {
    Error::Bug {
        context,
        what: format!("the shared-memory layout: {e}"),
    }
}

/// The segment's file name for a group identity and rank 0's random bytes: unguessable
/// without both, and new for every group formed.
pub(crate) fn segment_path(group: &[u8; 32], nonce: &[u8; 16]) -> PathBuf {
    let mut hasher = blake3::Hasher::new_derive_key(NAME_CONTEXT);
    hasher.update(group);
    hasher.update(nonce);
    let hash = hasher.finalize();
    let hex: String = hash.as_bytes()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    ffi::shm::directory().join(format!("nuvec-{hex}"))
}

/// Sets up a segment of `layout` for the domain `ranks` (this rank at position `me`) over
/// the formed mesh (see the module docs): `Ok(None)` if rank 0 could not create one or a
/// peer could not open it (every rank of the domain then keeps TCP, and all of them know
/// it: see `domain`). Rank 0's segment still has its file: the caller removes it once
/// every peer counted itself in.
///
/// # Errors
///
/// A peer that closes, stalls past `timeout`, or sends a status or verdict the setup
/// does not allow.
pub(crate) fn establish(
    layout: Layout,
    transport: &mut Transport,
    (ranks, me): (&[usize], usize),
    group: &[u8; 32],
    timeout: Duration,
) -> Result<Option<Segment>> {
    let size = ranks.len();
    let leader = ranks[0];
    let whole = size == transport.ranks();
    let deadline = crate::options::deadline(Instant::now(), timeout);
    if me == 0 {
        let nonce: [u8; 16] = auth::random_bytes("drawing a shared-memory segment's name")?;
        let path = segment_path(group, &nonce);
        let created = ffi::shm::Segment::create(&path, layout.bytes());
        let mut offer = [0u8; OFFER_BYTES];
        if created.is_ok() {
            offer[0] = 1;
            offer[1..].copy_from_slice(&nonce);
        }
        if let Err(e) = &created {
            crate::verbose::verbose!(
                warn: leader,
                "shared memory: cannot create {} ({e}); every link {}stays TCP",
                path.display(),
                if whole { "" } else { "of this host " }
            );
        }
        for &peer in &ranks[1..] {
            let conn = transport.send_conn(peer);
            write_all(transport, conn, &offer, deadline, timeout)?;
        }
        let Ok(map) = created else {
            return Ok(None);
        };
        // Dropped on an error or a refusal, the creator's mapping removes its file.
        let seg = Segment { map, layout, path };
        // Every peer says whether it could open the segment (see `domain`), and every
        // rank learns the same verdict.
        let mut refusals = Vec::new();
        for (peer, &global) in ranks.iter().enumerate().skip(1) {
            let mut status = [0u8; domain::STATUS_BYTES];
            let conn = transport.recv_conn(global);
            read_exact(transport, conn, &mut status, deadline, timeout)?;
            if let Some(code) = domain::read_status(status) {
                refusals.push(domain::Refusal { rank: peer, code });
            }
        }
        let verdict = domain::encode_verdict(&refusals);
        for &peer in &ranks[1..] {
            let conn = transport.send_conn(peer);
            write_all(transport, conn, &verdict, deadline, timeout)?;
        }
        if !refusals.is_empty() {
            not_shared((ranks, me), &refusals, whole);
            return Ok(None);
        }
        return Ok(Some(seg));
    }
    let mut offer = [0u8; OFFER_BYTES];
    let conn = transport.recv_conn(leader);
    read_exact(transport, conn, &mut offer, deadline, timeout)?;
    match offer[0] {
        0 => return Ok(None),
        1 => {}
        flag => {
            return Err(Error::PeerMisbehaved {
                peer: leader,
                addr: None,
                context: SETUP,
                reason: format!("a shared-memory offer with flag {flag}, not 0 or 1"),
            });
        }
    }
    let mut nonce = [0u8; 16];
    nonce.copy_from_slice(&offer[1..]);
    let path = segment_path(group, &nonce);
    // A rank that shares the host identity but not the creator's /dev/shm (another
    // container on the same kernel) cannot open it: it says so instead of failing.
    let opened = ffi::shm::Segment::open(&path, layout.bytes());
    if let Ok(map) = &opened {
        let mapped = map
            .u32_at(layout.mapped())
            .ok_or_else(|| layout_bug(SETUP, &std::io::ErrorKind::InvalidInput.into()))?;
        mapped.fetch_add(1, Ordering::SeqCst);
        ffi::shm::wake_all(mapped);
    }
    let status = domain::status(&opened);
    let conn = transport.send_conn(leader);
    write_all(transport, conn, &status, deadline, timeout)?;
    let mut head = [0u8; domain::VERDICT_HEAD_BYTES];
    let conn = transport.recv_conn(leader);
    read_exact(transport, conn, &mut head, deadline, timeout)?;
    let mut body = vec![0u8; domain::verdict_body_len(head, size, leader)?];
    read_exact(transport, conn, &mut body, deadline, timeout)?;
    let refusals = domain::decode_verdict(&body, size, leader)?;
    if !refusals.is_empty() {
        not_shared((ranks, me), &refusals, whole);
        return Ok(None);
    }
    let Ok(map) = opened else {
        // The creator left out this rank's refusal.
        return Err(Error::PeerMisbehaved {
            peer: leader,
            addr: None,
            context: SETUP,
            reason: format!(
                "a shared-memory verdict that leaves out rank {}, which could not open {}",
                ranks[me],
                path.display()
            ),
        });
    };
    Ok(Some(Segment { map, layout, path }))
}

/// The verbose line of rank `me` of a segment's `ranks` (`refusals` index them too), some of
/// which share a host identity but not the segment; `whole` if they are the whole group.
fn not_shared((ranks, me): (&[usize], usize), refusals: &[domain::Refusal], whole: bool) {
    let named: Vec<domain::Refusal> = refusals
        .iter()
        .map(|r| domain::Refusal {
            rank: ranks.get(r.rank).copied().unwrap_or(r.rank),
            code: r.code,
        })
        .collect();
    let leader = ranks.first().copied().unwrap_or(0);
    let rank = ranks.get(me).copied().unwrap_or(me);
    crate::verbose::verbose!(
        rank,
        "shared memory: {} could not open rank {leader}'s segment although the hellos put them \
         on this host (another mount namespace or container, with its own /dev/shm?); they \
         count as another host, so every link {}stays TCP",
        domain::describe(&named),
        if whole {
            String::new()
        } else {
            format!("between ranks {ranks:?} ")
        }
    );
}

/// Writes all of `bytes` on connection `conn` by `deadline` (setup messages).
///
/// # Errors
///
/// The connection closed or failed, or the peer stayed silent past `deadline` (then the
/// peers are asked who is alive, and the error names the one that is not).
pub(crate) fn write_all(
    transport: &mut Transport,
    conn: usize,
    bytes: &[u8],
    deadline: Instant,
    timeout: Duration,
) -> Result<()> {
    let moves = (conn, PeerOp::Send, bytes.len());
    move_all(transport, moves, deadline, timeout, |c, done| {
        c.write(&bytes[done..])
    })
}

/// Reads exactly `buf.len()` bytes from connection `conn` by `deadline` (setup messages).
///
/// # Errors
///
/// As [`write_all`].
pub(crate) fn read_exact(
    transport: &mut Transport,
    conn: usize,
    buf: &mut [u8],
    deadline: Instant,
    timeout: Duration,
) -> Result<()> {
    let moves = (conn, PeerOp::Receive, buf.len());
    move_all(transport, moves, deadline, timeout, |c, done| {
        c.read(&mut buf[done..])
    })
}

/// Moves `len` bytes as `op` on connection `conn` by `deadline`, `step` moving what it
/// can from offset `done` on.
fn move_all(
    transport: &mut Transport,
    (conn, op, len): (usize, PeerOp, usize),
    deadline: Instant,
    timeout: Duration,
    mut step: impl FnMut(&mut Conn, usize) -> std::io::Result<Transfer>,
) -> Result<()> {
    let mut done = 0;
    while done < len {
        transport.assume_ready();
        let c = transport.conn(conn);
        match step(c, done) {
            Ok(Transfer::Moved(n)) => done += n,
            Ok(Transfer::Closed) => return Err(c.closed(op, SETUP)),
            Err(e) => return Err(c.failed(op, SETUP, e)),
            Ok(Transfer::Blocked) => {
                // A neighbour whose own wait timed out asks this rank, which answers.
                let look = Some(Inquiry::answer_within(timeout));
                let waited = transport
                    .wait(deadline, look)
                    .map_err(|e| Error::local("waiting to set up shared memory", e))?;
                if !waited {
                    let waits = [(conn, op)];
                    return Err(transport.inquire(&waits, waits[0], timeout, SETUP));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_keeps_ranks_apart_and_buffers_page_aligned() {
        for size in 1..=9 {
            let pairs = 3 * 4096;
            let l = Layout::new(size, CHUNK, pairs);
            let mut words = vec![l.mapped()];
            for r in 0..size {
                words.extend([l.step(r), l.sleepers(r)]);
                assert!(l.header(r, 1) + HEADER_BYTES <= l.sleepers(r));
                assert!(l.header(r, 0) >= l.step(r) + 4);
                assert_eq!(l.refused(r), l.step(r) + 8);
                assert_eq!(l.refusal(r), l.header(r, 1) + HEADER_BYTES);
                assert!(l.refusal(r) + HEADER_BYTES <= l.sleepers(r));
                for h in 0..2 {
                    assert_eq!(l.data(r, h) % 4096, 0);
                    assert!(l.data(r, h) >= l.sleepers(size - 1) + 4);
                    assert!(l.data(r, h) + CHUNK <= l.bytes());
                }
            }
            words.sort_unstable();
            for pair in words.windows(2) {
                assert!(pair[1] - pair[0] >= LINE, "{words:?} share a line");
            }
            assert_eq!(l.data(size - 1, 1) + CHUNK, l.pairs());
            assert_eq!(l.pairs() + pairs, l.bytes());
        }
    }

    #[test]
    fn words_compare_across_the_wrap() {
        assert!(reached(5, 5));
        assert!(reached(6, 5));
        assert!(!reached(4, 5));
        assert!(reached(0, u32::MAX));
        assert!(!reached(u32::MAX, 0));
    }
}
