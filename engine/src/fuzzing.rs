//! Entry points for the fuzz targets in `fuzz/` and for replaying their corpus in
//! `cargo test`: every parser of bytes that come from outside the process (the hostfile,
//! the MLX wire's keyed handshake, and the native wire's hello and collective header, in
//! `native`). Not part of the API; hidden from the docs.

use crate::auth::{
    Acceptor, Challenge, Connector, Greeting, Handshake, Hello, Key, Link, MAGIC, Outcome, Secret,
    greeting,
};
use crate::hostfile;

mod native;

pub use native::{Ended, native_header, native_hello, seeds};

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
    converse(&mut c, &mut a, sizes);
    assert_eq!(c.outcome(), &Outcome::Established);
    assert_eq!(a.outcome(), &Outcome::Established);
}

/// Runs `c` against `a` until neither moves, each delivery cut to the next size `sizes`
/// gives (in turn, and 1 when it is empty or the size 0).
fn converse(c: &mut dyn Handshake, a: &mut dyn Handshake, sizes: &[u8]) {
    let mut next = 0;
    let mut size = || {
        let s = sizes.get(next % sizes.len().max(1)).copied().unwrap_or(1);
        next += 1;
        usize::from(s.max(1))
    };
    let (mut to_a, mut to_c) = (Vec::new(), Vec::new());
    // Each round moves at least one byte until both are done; the longest conversation
    // (the keyed MLX handshake, 2 × 169 bytes) ends well within the bound.
    for _ in 0..1000 {
        let moved =
            step(c, &mut to_a, &mut to_c, &mut size) | step(a, &mut to_c, &mut to_a, &mut size);
        if !moved {
            break;
        }
    }
}

/// Moves one delivery each way for `hs`; whether anything moved.
fn step(
    hs: &mut dyn Handshake,
    out: &mut Vec<u8>,
    inq: &mut Vec<u8>,
    size: &mut dyn FnMut() -> usize,
) -> bool {
    let mut moved = false;
    let t = hs.transmit();
    if !t.is_empty() {
        let n = size().min(t.len());
        out.extend_from_slice(&t[..n]);
        hs.handle_sent(n);
        moved = true;
    }
    if !inq.is_empty() {
        let n = size().min(inq.len());
        let took = hs.handle_recv(&inq[..n]);
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
