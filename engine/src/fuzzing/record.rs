//! The native wire's sealed records (`transport::tcp::seal`), as the fuzz target
//! `native_record` drives them, and its seeds.

use crate::auth::{Key, Secret};
use crate::error::Phase;
use crate::transport::tcp::seal::{
    self, LEN_BYTES, MAX_PLAINTEXT, MAX_RECORD, OVERHEAD, Opened, RecordError, Side,
};

/// The fuzzed connection: rank 1 dialled rank 2, with these handshake nonces.
const CONNECTOR: usize = 1;
const ACCEPTOR: usize = 2;
const CONNECTOR_NONCE: [u8; 32] = [0x11; 32];
const ACCEPTOR_NONCE: [u8; 32] = [0x22; 32];

/// The fixed key (the same secret as the other keyed targets').
fn key() -> Option<Key> {
    Secret::new(b"a fixed fuzzing key of 32 bytes!").key().ok()
}

/// `side`'s sealer and opener on the fuzzed connection.
fn end(key: &Key, side: Side) -> (seal::Sealer, seal::Opener) {
    let peer = match side {
        Side::Connector => ACCEPTOR,
        Side::Acceptor => CONNECTOR,
    };
    seal::pair(key, side, &CONNECTOR_NONCE, &ACCEPTOR_NONCE, peer)
}

/// Drives the record layer with `data`, which must never panic, whatever the bytes:
///
/// - `data` as the stream the acceptor receives from the connector: records open in order
///   while they authenticate; the first that does not (or a length above the cap) is an
///   error naming the connector, as is the call's error made from it; it leaves its bytes
///   as they were but for a forged record's body, which it zeroes, and every open after it
///   fails too; a stream that ends inside a record is an error, one that ends between
///   records is not;
/// - `data` as plaintext, sealed by the connector in records of the size `data[0]` picks:
///   the acceptor opens exactly `data` again, and the connector's own opener (a record
///   reflected back) opens none of them.
///
/// Returns how many records of `data` opened (for tests that check what the seeds reach).
pub fn native_record(data: &[u8]) -> usize {
    let Some(key) = key() else {
        return 0;
    };
    let opened = open_stream(&key, data);
    round_trip(&key, data);
    opened
}

/// `data` as the connector's stream to the acceptor; returns the records that opened.
fn open_stream(key: &Key, data: &[u8]) -> usize {
    let (_, mut opener) = end(key, Side::Acceptor);
    let mut bytes = data.to_vec();
    let (mut at, mut count) = (0, 0);
    loop {
        match opener.open(&mut bytes[at..]) {
            Ok(Opened::Record { consumed, .. }) => {
                assert!((OVERHEAD..=MAX_RECORD).contains(&consumed), "{consumed}");
                at += consumed;
                count += 1;
            }
            Ok(Opened::Needs(n)) => {
                assert!(n > bytes.len() - at && n <= MAX_RECORD, "needs {n}");
                let ended = opener.closed(&bytes[at..]);
                assert_eq!(ended.is_err(), at < bytes.len(), "{ended:?}");
                return count;
            }
            Err(e) => {
                assert_eq!(e.peer(), CONNECTOR, "{e}");
                let error = e.clone().into_error(Phase::Recv, None);
                assert_eq!(error.peer(), Some(CONNECTOR), "{error}");
                // A record whose tag failed has its body zeroed (the cipher decrypts as it
                // authenticates and wipes what it decrypted); every other byte is as it came.
                let mut left = data[at..].to_vec();
                if let (RecordError::Forged { .. }, Some(field)) = (&e, left.first_chunk()) {
                    let len = u32::from_le_bytes(*field) as usize;
                    left[LEN_BYTES..LEN_BYTES + len].fill(0);
                }
                assert_eq!(bytes[at..], left, "a failed record changed other bytes");
                assert!(opener.open(&mut bytes[at..]).is_err(), "opened after {e}");
                assert!(opener.closed(&[]).is_err(), "closed cleanly after {e}");
                return count;
            }
        }
    }
}

/// `data` sealed in records and opened again, by the acceptor and by the connector itself.
fn round_trip(key: &Key, data: &[u8]) {
    let (mut sealer, mut reflected) = end(key, Side::Connector);
    let (_, mut opener) = end(key, Side::Acceptor);
    let size = (usize::from(data.first().copied().unwrap_or(0)) * 257).clamp(1, MAX_PLAINTEXT);
    let mut stream = Vec::new();
    for chunk in data.chunks(size) {
        let at = stream.len();
        stream.resize(at + chunk.len() + OVERHEAD, 0);
        let sealed = sealer.seal(chunk, &mut stream[at..]);
        assert_eq!(sealed, Ok(chunk.len() + OVERHEAD));
    }
    let mut copy = stream.clone();
    let mut at = 0;
    let mut plain = Vec::new();
    while at < copy.len() {
        match opener.open(&mut copy[at..]) {
            Ok(Opened::Record {
                plaintext,
                consumed,
            }) => {
                plain.extend_from_slice(plaintext);
                at += consumed;
            }
            other => panic!("an honest record did not open: {other:?}"),
        }
    }
    assert_eq!(plain, data);
    if !stream.is_empty() {
        let echoed = reflected.open(&mut stream);
        assert!(echoed.is_err(), "a reflected record opened: {echoed:?}");
    }
}

/// The target's seeds: honest streams, and each way a stream can be wrong.
pub(super) fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let Some(key) = key() else {
        return Vec::new();
    };
    let records = |side: Side, plaintexts: &[&[u8]]| -> Vec<Vec<u8>> {
        let (mut sealer, _) = end(&key, side);
        plaintexts
            .iter()
            .map(|p| {
                let mut out = vec![0; p.len() + OVERHEAD];
                let _ = sealer.seal(p, &mut out);
                out
            })
            .collect()
    };
    let large: Vec<u8> = (0..4096u32).map(|i| (i * 31) as u8).collect();
    let honest = records(Side::Connector, &[b"header", b"", &large, b"tail"]);
    let mut flipped_tag = honest[0].clone();
    if let Some(last) = flipped_tag.last_mut() {
        *last ^= 1;
    }
    let mut flipped_body = honest[2].clone();
    flipped_body[100] ^= 0x40;
    let mut truncated = honest[..2].concat();
    truncated.pop();
    let too_long = u32::try_from(MAX_PLAINTEXT + 1)
        .unwrap_or(u32::MAX)
        .to_le_bytes()
        .to_vec();
    vec![
        ("honest", honest.concat()),
        ("empty", Vec::new()),
        ("flipped-tag", flipped_tag),
        ("flipped-body-after-two", {
            let mut s = honest[..2].concat();
            s.extend(flipped_body);
            s
        }),
        ("replayed-after-one", [&honest[0][..], &honest[0]].concat()),
        ("reordered", [&honest[1][..], &honest[0]].concat()),
        ("dropped-after-one", [&honest[0][..], &honest[2]].concat()),
        ("truncated-after-one", truncated),
        ("too-long", too_long),
        ("length-only", 10u32.to_le_bytes().to_vec()),
        ("reflected", records(Side::Acceptor, &[b"header"]).concat()),
    ]
}
