//! Entry points for the fuzz targets in `fuzz/` and for replaying their corpus in
//! `cargo test`: every parser of bytes that come from outside the process (the hostfile,
//! the MLX wire's keyed handshake, the native wire's hello and collective header, in
//! `native`, and its sealed records, in `record`). Not part of the API; hidden from the
//! docs.

use crate::auth::{
    Acceptor, Challenge, Connector, Greeting, Handshake, Hello, Key, Link, MAGIC, Outcome, Secret,
    greeting,
};
use crate::config::hostfile;

mod native;
mod record;

pub use native::{Ended, native_header, native_hello, seeds};
pub use record::native_record;

/// Parses `data` as a hostfile and checks it for every rank it could describe. Must never
/// panic, whatever the bytes.
pub fn hostfile(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(nodes) = hostfile::parse(text) {
        for rank in 0..nodes.len().min(8) + 1 {
            let _ = hostfile::check(&nodes, rank);
        }
    }
}

/// The link every fuzzed handshake is about: rank 1 of 3 opening connection 0 to rank 2.
const LINK: Link = Link {
    size: 3,
    connector: 1,
    acceptor: 2,
    index: 0,
};

/// Drives whole handshakes from `data`, which must never panic, whatever the bytes:
///
/// - `data` as a peer's side of the conversation, cut into chunks (each a length byte, then
///   that many bytes; a zero length closes the connection), against a keyed acceptor and a
///   keyed connector with fresh nonces: it must never be established, since garbage cannot
///   prove the key;
/// - the same bytes against both sides without a key: established at once, nothing sent,
///   nothing read;
/// - an honest connector against an honest acceptor, their bytes delivered in chunks of
///   the sizes `data` gives: both must be established;
/// - `data` decoded as each message, which must encode back to the same message;
/// - `data` as the first bytes an unkeyed rank receives: a keyed greeting exactly when
///   they start with the magic.
pub fn handshake(data: &[u8]) {
    let Ok(key) = Secret::new(b"a fixed fuzzing key of 32 bytes!").key() else {
        return;
    };
    let chunks = chunks(data);
    if let Ok(mut acceptor) = Acceptor::new(Some(key), LINK) {
        play_peer(&mut acceptor, &chunks);
        assert_ne!(acceptor.outcome(), &Outcome::Established, "garbage got in");
    }
    if let Ok(mut connector) = Connector::new(Some(key), LINK) {
        play_peer(&mut connector, &chunks);
        assert_ne!(connector.outcome(), &Outcome::Established, "garbage got in");
    }
    if let (Ok(mut c), Ok(mut a)) = (Connector::new(None, LINK), Acceptor::new(None, LINK)) {
        for hs in [&mut c as &mut dyn Handshake, &mut a] {
            play_peer(hs, &chunks);
            assert_eq!(hs.outcome(), &Outcome::Established);
            assert!(hs.transmit().is_empty());
        }
    }
    honest(key, data);
    decode_round_trips(data);
    first_bytes(data);
}

/// [`greeting`] classifies every prefix of `data` consistently with the magic.
fn first_bytes(data: &[u8]) {
    for n in 0..=data.len().min(MAGIC.len() + 1) {
        let first = &data[..n];
        let expected = if first.len() >= MAGIC.len() {
            if first[..MAGIC.len()] == MAGIC {
                Greeting::Keyed
            } else {
                Greeting::Data
            }
        } else if MAGIC.starts_with(first) {
            Greeting::Undecided
        } else {
            Greeting::Data
        };
        assert_eq!(greeting(first), expected, "{first:?}");
    }
}

/// Cuts `data` into a peer's deliveries: `Some(bytes)`, or `None` for the peer closing.
fn chunks(mut data: &[u8]) -> Vec<Option<&[u8]>> {
    let mut out = Vec::new();
    while let Some((&len, rest)) = data.split_first() {
        if len == 0 {
            out.push(None);
            data = rest;
            continue;
        }
        let (chunk, rest) = rest.split_at(usize::from(len).min(rest.len()));
        out.push(Some(chunk));
        data = rest;
    }
    out
}

/// Feeds `chunks` to `hs` as its peer would, taking everything it writes as it goes.
fn play_peer(hs: &mut dyn Handshake, chunks: &[Option<&[u8]>]) {
    for chunk in chunks {
        hs.handle_sent(hs.transmit().len());
        match chunk {
            None => hs.handle_closed(),
            Some(bytes) => {
                let mut bytes = *bytes;
                while !bytes.is_empty() {
                    let wants = hs.wants();
                    let took = hs.handle_recv(bytes);
                    assert!(took <= wants && took <= bytes.len());
                    if took == 0 {
                        break;
                    }
                    bytes = &bytes[took..];
                    hs.handle_sent(hs.transmit().len());
                }
            }
        }
    }
}

/// Runs an honest conversation with each delivery cut to the next size `sizes` gives.
fn honest(key: Key, sizes: &[u8]) {
    let (Ok(mut c), Ok(mut a)) = (
        Connector::new(Some(key), LINK),
        Acceptor::new(Some(key), LINK),
    ) else {
        return;
    };
    converse(&mut c, &mut a, &mut cycle(sizes));
    assert_eq!(c.outcome(), &Outcome::Established);
    assert_eq!(a.outcome(), &Outcome::Established);
}

/// The delivery sizes `sizes` gives, in turn (1 when it is empty or the size 0).
pub(crate) fn cycle(sizes: &[u8]) -> impl FnMut() -> usize + '_ {
    let mut next = 0;
    move || {
        let s = sizes.get(next % sizes.len().max(1)).copied().unwrap_or(1);
        next += 1;
        usize::from(s.max(1))
    }
}

/// What each side of a [`converse`] wrote.
#[derive(Debug, Default)]
pub(crate) struct Wire {
    pub(crate) from_connector: Vec<u8>,
    pub(crate) from_acceptor: Vec<u8>,
}

/// Runs connector `c` against acceptor `a` through in-memory pipes, each delivery cut to
/// the size `chunk` draws (at least one byte), until neither moves; a side that rejected
/// then drops the connection, so the other sees it closed, as over a socket. Returns what
/// each side wrote. Panics if a side takes more than it was given or than it wanted.
pub(crate) fn converse(
    c: &mut dyn Handshake,
    a: &mut dyn Handshake,
    chunk: &mut dyn FnMut() -> usize,
) -> Wire {
    let mut wire = Wire::default();
    let (mut to_a, mut to_c) = (Vec::new(), Vec::new());
    // Each round moves at least one byte until both are done; the longest conversation (the
    // keyed MLX handshake, 2 x 169 bytes) ends well within the bound.
    for _ in 0..1000 {
        let moved = step(c, (&mut to_a, &mut wire.from_connector), &mut to_c, chunk)
            | step(a, (&mut to_c, &mut wire.from_acceptor), &mut to_a, chunk);
        if !moved {
            break;
        }
    }
    let rejected = |o: &Outcome| matches!(o, Outcome::Rejected(_));
    if rejected(c.outcome()) {
        a.handle_closed();
    }
    if rejected(a.outcome()) {
        c.handle_closed();
    }
    wire
}

/// Moves at most one chunk each way for `hs`: what it transmits into its peer's pipe `out`
/// (and `log`), what waits in its own pipe `inq` into it; whether anything moved.
fn step(
    hs: &mut dyn Handshake,
    (out, log): (&mut Vec<u8>, &mut Vec<u8>),
    inq: &mut Vec<u8>,
    chunk: &mut dyn FnMut() -> usize,
) -> bool {
    let mut moved = false;
    let t = hs.transmit();
    // Parting bytes after a rejection go out too, as over a socket.
    if !t.is_empty() {
        let n = chunk().clamp(1, t.len());
        out.extend_from_slice(&t[..n]);
        log.extend_from_slice(&t[..n]);
        hs.handle_sent(n);
        moved = true;
    }
    let wanted = hs.wants();
    if wanted > 0 && !inq.is_empty() {
        let n = chunk().clamp(1, inq.len());
        let took = hs.handle_recv(&inq[..n]);
        assert!(
            took <= n.min(wanted),
            "took {took} of {n} bytes, wanting {wanted}"
        );
        inq.drain(..took);
        moved |= took > 0;
    }
    moved
}

/// Whatever decodes as a message encodes back to the same message.
fn decode_round_trips(data: &[u8]) {
    if let Ok(hello) = Hello::decode(data) {
        assert_eq!(Hello::decode(&hello.encode()), Ok(hello));
    }
    if let Ok(challenge) = Challenge::decode(data) {
        assert_eq!(Challenge::decode(&challenge.encode()), Ok(challenge));
    }
}

/// Plays `data` as the bytes a JACCL rank reads on its side channel, in the order set-up
/// reads them, through the decoders set-up uses; must never panic, whatever the bytes:
///
/// - the first byte picks the group: `2 + b % 7` ranks (2 to 8, MLX's mesh limit), this
///   rank `(b >> 4) % ranks`;
/// - 4 bytes: a joining client's hello, as rank 0 reads it: accepted exactly when it is a
///   rank from 1 to `ranks - 1`;
/// - twice (a mesh gathers one record list, a ring two): the gathered counts, one `int` per
///   rank, accepted exactly when each is from 0 to MLX's limit, else refused naming the
///   first rank at fault; then every rank's records, padded to the largest count, each of
///   which decodes to a queue-pair address that encodes back to the bytes MLX reads, and
///   marks its rank as a nuvec rank exactly when every one of its records carries the mark;
/// - the rest: what a peer wrote before its side channel closed, read as a failure notice
///   from each peer in turn: the error names a third rank of the group only if the notice's
///   first 4 bytes do, else the peer that closed.
///
/// Input ends at any point; set-up would then wait for more bytes, so the play stops.
#[cfg(feature = "jaccl")]
pub fn jaccl_side_channel(data: &[u8]) {
    side_channel::play(data);
}

/// How far [`jaccl_side_channel`] got with `data`: 0 (no group byte), 1 (no whole hello),
/// 2 and 3 (each record list decoded), 4 (the notices read). The replay test checks that
/// the stored inputs reach every stage.
#[cfg(feature = "jaccl")]
pub fn jaccl_side_channel_reach(data: &[u8]) -> usize {
    side_channel::play(data)
}

#[cfg(feature = "jaccl")]
mod side_channel {
    use std::net::SocketAddr;

    use crate::error::{Error, Phase};
    use crate::jaccl::bootstrap::{
        DESTINATION_BYTES, MAX_RECORDS, NUVEC_MARK, closed_after, decode_ints, joining_rank,
        record_counts, unpack_records,
    };
    use crate::transport::rdma::fabric::Destination;

    /// Hands out `data` front to back, as a socket would.
    struct Wire<'a>(&'a [u8]);

    impl<'a> Wire<'a> {
        fn take(&mut self, n: usize) -> Option<&'a [u8]> {
            let (front, rest) = self.0.split_at_checked(n)?;
            self.0 = rest;
            Some(front)
        }
    }

    /// Plays `data`; returns the stage reached (see `jaccl_side_channel_reach`).
    pub(super) fn play(data: &[u8]) -> usize {
        let Some((&group, data)) = data.split_first() else {
            return 0;
        };
        let ranks = 2 + usize::from(group % 7);
        let me = usize::from(group >> 4) % ranks;
        let mut wire = Wire(data);
        let Some(&hello) = wire.take(4).and_then(|b| b.first_chunk::<4>()) else {
            return 1;
        };
        hello_is_judged(hello, ranks);
        for stage in 2..4 {
            if records_are_decoded(&mut wire, ranks).is_none() {
                return stage;
            }
        }
        notices_name_a_third_rank_or_the_sender(wire.0, me, ranks);
        4
    }

    fn hello_is_judged(hello: [u8; 4], ranks: usize) {
        let from: SocketAddr = ([127, 0, 0, 1], 1).into();
        let claimed = i32::from_le_bytes(hello);
        match joining_rank(hello, ranks, from) {
            Ok(rank) => {
                assert!((1..ranks).contains(&rank));
                assert_eq!(i32::try_from(rank), Ok(claimed));
            }
            Err(e) => {
                assert!(!(1..ranks as i32).contains(&claimed), "{e}");
                assert!(matches!(e, Error::Environment { .. }), "{e}");
            }
        }
    }

    /// One gathered record list; `None` when the input ends or set-up would stop.
    fn records_are_decoded(wire: &mut Wire<'_>, ranks: usize) -> Option<()> {
        let ints = decode_ints(wire.take(4 * ranks)?);
        assert_eq!(ints.len(), ranks);
        let in_range = |c: &i32| usize::try_from(*c).is_ok_and(|c| c <= MAX_RECORDS);
        let counts = match record_counts(&ints) {
            Ok(counts) => counts,
            Err(e) => {
                let first = ints.iter().position(|c| !in_range(c));
                assert_eq!(e.peer(), first, "{e}");
                return None;
            }
        };
        assert!(ints.iter().all(in_range));
        let max = counts.iter().copied().max().unwrap_or(0);
        let bytes = wire.take(ranks * max * DESTINATION_BYTES)?;
        let gathered = unpack_records(bytes, &counts, max);
        assert_eq!(gathered.records.len(), ranks);
        let (all, _) = bytes.as_chunks::<DESTINATION_BYTES>();
        for (rank, &count) in counts.iter().enumerate() {
            let records = &gathered.records[rank];
            assert_eq!(records.len(), count);
            let raws = &all[rank * max..][..count];
            for (record, raw) in records.iter().zip(raws) {
                round_trips(record, raw);
            }
            let marked = count > 0 && raws.iter().all(|r| r[12..16] == NUVEC_MARK);
            assert_eq!(gathered.nuvec[rank], marked, "rank {rank}");
        }
        Some(())
    }

    /// A decoded record encodes back to every byte MLX reads (all but the padding), and to
    /// all 32 when its padding is the mark or zeros.
    fn round_trips(record: &Destination, raw: &[u8; DESTINATION_BYTES]) {
        assert_eq!(Destination::decode(raw), *record);
        let mlx = record.encode_as_mlx();
        assert_eq!((&mlx[..12], &mlx[16..]), (&raw[..12], &raw[16..]));
        assert_eq!(Destination::decode(&record.encode()), *record);
        if raw[12..16] == NUVEC_MARK {
            assert_eq!(record.encode(), *raw);
        } else if raw[12..16] == [0; 4] {
            assert_eq!(mlx, *raw);
        }
        assert_eq!(record.is_present(), record.lid >= 0);
    }

    fn notices_name_a_third_rank_or_the_sender(notice: &[u8], me: usize, ranks: usize) {
        let named = notice
            .first_chunk::<4>()
            .map(|b| u32::from_le_bytes(*b) as usize);
        for sender in (0..ranks).filter(|&r| r != me) {
            match closed_after(notice, sender, me, ranks, Phase::AllGather) {
                Error::Lost { peer, via, .. } => {
                    assert_eq!((Some(peer), via), (named, sender));
                    assert!(peer < ranks && peer != me && peer != sender);
                }
                Error::Closed { peer, .. } => {
                    assert_eq!(peer, sender);
                    let third = named.is_some_and(|n| n < ranks && n != me && n != sender);
                    assert!(!third, "a notice naming rank {named:?} was ignored");
                }
                other => panic!("a closed side channel reported as {other}"),
            }
        }
    }
}
