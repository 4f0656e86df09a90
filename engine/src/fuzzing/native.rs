//! The native wire's hello and collective header, as the fuzz targets `native_hello` and
//! `native_header` drive them, and their seeds.

use super::{converse, cycle};
use std::sync::OnceLock;

use crate::auth::{self, Fault, Handshake, Key, MAGIC, Outcome, Secret};
use crate::comm::algorithm::AllReduce;
use crate::element::DType;
use crate::error::Error;
use crate::native::header::{Call, HEADER_BYTES, Header, Kind as CallKind};
use crate::native::hello::{self, ANY, CAP_SHARED_MEMORY, Expect, Identity, Kind as HelloKind};
use crate::native::protocol::{Caller, Exchange, Memory, Routes};
use crate::reduce::ReduceOp;

/// The group every fuzzed hello is about: 4 ranks on loopback.
const HELLO_SIZE: u32 = 4;

/// The fixed key of the keyed hello machines (the same as the handshake target's), and the
/// group identity without and with it: derived once, since every input needs them.
fn fixtures() -> &'static (Option<Key>, [u8; 32], [u8; 32]) {
    static FIXTURES: OnceLock<(Option<Key>, [u8; 32], [u8; 32])> = OnceLock::new();
    FIXTURES.get_or_init(|| {
        let key = Secret::new(b"a fixed fuzzing key of 32 bytes!").key().ok();
        let all: Vec<Vec<String>> = (0..HELLO_SIZE)
            .map(|r| vec![format!("127.0.0.1:{}", 5000 + r)])
            .collect();
        let unkeyed = hello::group_identity(&all, None);
        (key, unkeyed, hello::group_identity(&all, key.as_ref()))
    })
}

fn hello_key() -> Option<Key> {
    fixtures().0
}

/// What rank `me` of the fuzzed group expects of a peer, with or without the key.
fn hello_expect(me: u32, keyed: bool) -> Expect {
    let (_, unkeyed, with_key) = fixtures();
    Expect {
        me,
        identity: Identity {
            capabilities: CAP_SHARED_MEMORY,
            size: HELLO_SIZE,
            group: if keyed { *with_key } else { *unkeyed },
            host: [7; 16],
        },
        keyed,
    }
}

/// The sides the hello target plays against the fuzzed peer, each with the hellos it must
/// accept, restated from the rules in `native::hello` (the connector checks it reached
/// the rank and address it dialled; an acceptor takes ring connection `slot` from its left
/// neighbour and, on address 0, the mesh connection of a lower rank that is not a
/// neighbour).
#[derive(Clone, Copy, Debug)]
enum HelloSide {
    /// Rank 3 opening ring connection 1 to rank 0.
    RingConnector,
    /// Rank 0 accepting on its address 1.
    RingAcceptor,
    /// Rank 2 accepting on its address 0 (ring connection 0 from rank 1, the mesh
    /// connection from rank 0).
    MeshAcceptor,
}

impl HelloSide {
    const ALL: [HelloSide; 3] = [
        HelloSide::RingConnector,
        HelloSide::RingAcceptor,
        HelloSide::MeshAcceptor,
    ];

    fn machine(self, key: Option<Key>) -> Box<dyn Handshake> {
        match self {
            HelloSide::RingConnector => Box::new(hello::Connector::new(
                hello_expect(3, key.is_some()),
                key,
                0,
                HelloKind::Ring(1),
            )),
            HelloSide::RingAcceptor => {
                Box::new(hello::Acceptor::new(hello_expect(0, key.is_some()), key, 1))
            }
            HelloSide::MeshAcceptor => {
                Box::new(hello::Acceptor::new(hello_expect(2, key.is_some()), key, 0))
            }
        }
    }

    /// Whether this side, unkeyed, takes `h` from its peer.
    fn accepts(self, h: &hello::Hello) -> bool {
        let ours = hello_expect(0, false).identity;
        let group = h.identity.size == ours.size && h.identity.group == ours.group;
        group
            && match self {
                HelloSide::RingConnector => {
                    (h.from, h.to, h.kind) == (0, ANY, HelloKind::Accepted(1))
                }
                HelloSide::RingAcceptor => (h.from, h.to, h.kind) == (3, 0, HelloKind::Ring(1)),
                HelloSide::MeshAcceptor => {
                    h.to == 2
                        && matches!(
                            (h.from, h.kind),
                            (0, HelloKind::Mesh) | (1, HelloKind::Ring(0))
                        )
                }
            }
    }
}

/// Feeds `bytes` to `hs` as its peer, `step` bytes at a time, sending whatever `hs`
/// writes; returns how many bytes it took.
fn feed(hs: &mut dyn Handshake, bytes: &[u8], step: usize) -> usize {
    hs.handle_sent(hs.transmit().len());
    let mut taken = 0;
    while taken < bytes.len() {
        let end = bytes.len().min(taken.saturating_add(step));
        let wants = hs.wants();
        let took = hs.handle_recv(&bytes[taken..end]);
        assert!(took <= wants && took <= end - taken);
        if took == 0 {
            break;
        }
        taken += took;
        hs.handle_sent(hs.transmit().len());
    }
    taken
}

/// Drives the native wire's hello from `data`, which must never panic, whatever the bytes:
///
/// - `data` decoded as a hello: what decodes encodes back to its 88 bytes, bytes after
///   them do not matter, and only fewer than 88 bytes are short;
/// - `data` made into a well-formed hello (magic, version, reserved bytes and connection
///   kind set, every other field as the bytes say): it decodes, to the hello that
///   re-encodes to the same bytes;
/// - `data` as the peer's bytes to a ring connector, a ring acceptor and a mesh acceptor,
///   delivered at once and one byte at a time: both deliveries end alike (each verdict is
///   decided on the byte that shows it). Without a key a side is established exactly
///   when the first 88 bytes are a hello it accepts, and then has read those and no
///   more; a peer that closes before its hello is to blame. With the key no side is ever
///   established (garbage cannot prove it);
/// - an honest connector against an honest acceptor, keyed and not, their bytes
///   delivered in chunks of the sizes `data` gives: both are established.
///
/// Returns how many of the three sides took `data` without a key (for tests that check
/// what the seeds reach).
pub fn native_hello(data: &[u8]) -> usize {
    let decoded = hello::Hello::decode(data);
    match &decoded {
        Ok(h) => {
            assert_eq!(h.encode()[..], data[..hello::Hello::LEN]);
            assert_eq!(
                hello::Hello::decode(&data[..hello::Hello::LEN]),
                decoded.clone()
            );
        }
        Err(hello::Malformed::Short) => assert!(data.len() < hello::Hello::LEN),
        Err(_) => {}
    }
    well_formed_round_trips(data);
    let key = hello_key();
    let mut took = 0;
    for side in HelloSide::ALL {
        let mut whole = side.machine(None);
        let taken = feed(whole.as_mut(), data, usize::MAX);
        // One byte at a time: a verdict comes on the byte that shows it, so fewer bytes
        // may be taken, but the verdict is the same.
        let mut bytewise = side.machine(None);
        assert!(feed(bytewise.as_mut(), data, 1) <= taken, "{side:?}");
        assert_eq!(whole.outcome(), bytewise.outcome(), "{side:?}");
        assert!(taken <= hello::Hello::LEN, "{side:?} read past the hello");
        let accepted = decoded.as_ref().is_ok_and(|h| side.accepts(h));
        let established = whole.outcome() == &Outcome::Established;
        assert_eq!(established, accepted, "{side:?}: {:?}", whole.outcome());
        if established {
            assert_eq!(taken, hello::Hello::LEN);
            took += 1;
        }
        if whole.outcome() == &Outcome::Pending {
            assert!(
                data.len() < hello::Hello::LEN,
                "{side:?} waits on a whole hello"
            );
            whole.handle_closed();
            match whole.outcome() {
                Outcome::Rejected(r) => assert_eq!(r.fault, Fault::Peer, "{side:?}"),
                other => panic!("{side:?}: {other:?} after the peer closed"),
            }
        }
        if key.is_some() {
            let mut keyed = side.machine(key);
            feed(keyed.as_mut(), data, usize::MAX);
            assert_ne!(
                keyed.outcome(),
                &Outcome::Established,
                "{side:?}: garbage got in"
            );
        }
    }
    for key in [None, key] {
        honest_hellos(key, data);
    }
    took
}

/// `data` made into a well-formed hello decodes, and re-encodes to the same bytes.
fn well_formed_round_trips(data: &[u8]) {
    let mut bytes = [0u8; hello::Hello::LEN];
    let n = data.len().min(bytes.len());
    bytes[..n].copy_from_slice(&data[..n]);
    bytes[..8].copy_from_slice(&MAGIC);
    bytes[8] = hello::VERSION;
    bytes[9..12].fill(0);
    let kind = 1 + u32::from(bytes[32]) % 3;
    bytes[32..36].copy_from_slice(&kind.to_le_bytes());
    if kind == 2 {
        bytes[36..40].fill(0); // the mesh connection has index 0
    }
    let Ok(h) = hello::Hello::decode(&bytes) else {
        panic!("a well-formed hello does not decode: {bytes:02x?}");
    };
    assert_eq!(h.encode(), bytes);
}

/// An honest ring connector and acceptor, delivering in chunks of the sizes `sizes` gives.
fn honest_hellos(key: Option<Key>, sizes: &[u8]) {
    let mut c = HelloSide::RingConnector.machine(key);
    let mut a = HelloSide::RingAcceptor.machine(key);
    converse(c.as_mut(), a.as_mut(), &mut cycle(sizes));
    assert_eq!(
        c.outcome(),
        &Outcome::Established,
        "keyed: {}",
        key.is_some()
    );
    assert_eq!(
        a.outcome(),
        &Outcome::Established,
        "keyed: {}",
        key.is_some()
    );
}

// ---- The native wire's collective header -----------------------------------------------

/// Bytes of data in the fuzzed collectives.
const LEN: usize = 8;

/// The sequence number of every fuzzed collective.
const SEQ: u32 = 5;

/// Rank 0 of 2: every message to and from rank 1 goes on connection 0.
struct OnePeer;

impl Routes for OnePeer {
    fn send_conn(&self, _: usize) -> usize {
        0
    }
    fn recv_conn(&self, _: usize) -> usize {
        0
    }
}

/// One collective rank 0 of 2 runs against the fuzzed rank 1.
struct Plan {
    call: Call,
    exchange: Exchange,
    /// Bytes of the caller's array and input.
    data: usize,
    input: usize,
    /// Bytes rank 1 sends in all, its header included.
    need: usize,
    /// Where rank 1's data lands in the caller's array, if it lands there straight.
    lands: Option<std::ops::Range<usize>>,
    /// Whether rank 0 sends rank 1 a header (all but a recv).
    sends: bool,
}

/// The collective `selector` picks (every plan of the native wire's data path).
fn plan(selector: u8) -> Plan {
    let r = &OnePeer;
    let mut x = Exchange::default();
    let sum_f32 = (ReduceOp::Sum, DType::F32);
    let group = |kind, count: usize| Call::group(SEQ, kind, count as u64);
    let (call, data, input, need, lands) = match selector % 8 {
        0 => {
            let call = group(CallKind::Barrier, 0);
            x.headers(Caller::new(r, 0, 2, &call));
            (call, 0, 0, HEADER_BYTES, None)
        }
        1 => {
            let call = Call {
                header: Header {
                    seq: SEQ,
                    kind: CallKind::Send,
                    count: LEN as u64,
                },
                recv_from: Some(1),
                send_to: None,
            };
            x.recv(Caller::new(r, 0, 2, &call), 1, LEN);
            (call, LEN, 0, HEADER_BYTES + LEN, Some(0..LEN))
        }
        2 => {
            let call = group(CallKind::AllReduce(ReduceOp::Sum, DType::F32), LEN / 4);
            x.all_reduce(
                Caller::new(r, 0, 2, &call),
                AllReduce::OneShot,
                sum_f32,
                LEN,
            );
            (call, LEN, 0, HEADER_BYTES + LEN, None)
        }
        3 => {
            let call = group(CallKind::AllGather, LEN);
            x.all_gather(Caller::new(r, 0, 2, &call), LEN);
            (call, 2 * LEN, LEN, HEADER_BYTES + LEN, Some(LEN..2 * LEN))
        }
        4 => {
            // Two rounds: rank 1's half to fold (with the header), then its folded half.
            let call = group(CallKind::AllReduce(ReduceOp::Sum, DType::F32), 2 * LEN / 4);
            x.all_reduce(
                Caller::new(r, 0, 2, &call),
                AllReduce::ScatterGather,
                sum_f32,
                2 * LEN,
            );
            (call, 2 * LEN, 0, HEADER_BYTES + 2 * LEN, None)
        }
        5 => {
            let call = group(CallKind::Broadcast(1), LEN);
            x.broadcast_direct(Caller::new(r, 0, 2, &call), 1, LEN);
            (call, LEN, 0, HEADER_BYTES + LEN, Some(0..LEN))
        }
        6 => {
            let call = group(CallKind::AllToAll, 2 * LEN);
            x.all_to_all(Caller::new(r, 0, 2, &call), LEN);
            (
                call,
                2 * LEN,
                2 * LEN,
                HEADER_BYTES + LEN,
                Some(LEN..2 * LEN),
            )
        }
        _ => {
            let call = group(CallKind::SumScatter(DType::F32), 2 * LEN / 4);
            x.sum_scatter(Caller::new(r, 0, 2, &call), DType::F32, LEN);
            (call, LEN, 2 * LEN, HEADER_BYTES + LEN, None)
        }
    };
    Plan {
        call,
        exchange: x,
        data,
        input,
        need,
        lands,
        sends: selector % 8 != 1,
    }
}

/// Checks the native wire's collective header from `data`, which must never panic,
/// whatever the bytes:
///
/// - every 16 bytes of `data` that decode as a header re-encode to the same bytes;
/// - `data[1..17]` against a rank's calls of every kind: it matches exactly when it is
///   the call's own encoding; otherwise a header that decodes is a mismatch naming both
///   calls, and one that does not, the peer's misbehaviour;
/// - `data[1..]` as the bytes rank 1 of 2 sends rank 0 in the collective `data[0]` picks
///   (every algorithm of the data path), delivered in chunks of the size `data[0]` also
///   picks: the collective fails exactly when the first 16 bytes are not rank 0's own
///   header (a refused `send` header is kept to tell the sender), before any byte lands
///   in the caller's array; otherwise it completes exactly when all of rank 1's bytes
///   have come, reads none past them, and puts them where they belong.
///
/// Returns how that collective ended (for tests that check what the seeds reach).
pub fn native_header(data: &[u8]) -> Ended {
    for window in data.windows(HEADER_BYTES) {
        let mut bytes = [0u8; HEADER_BYTES];
        bytes.copy_from_slice(window);
        if let Ok(h) = Header::decode(&bytes) {
            assert_eq!(h.encode(), bytes);
        }
    }
    let Some((&selector, stream)) = data.split_first() else {
        return Ended::Waiting;
    };
    if let Some(first) = stream.get(..HEADER_BYTES) {
        let mut bytes = [0u8; HEADER_BYTES];
        bytes.copy_from_slice(first);
        checks_against_every_call(&bytes);
    }
    run_collective(selector, stream)
}

/// How a fuzzed collective ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// It completed.
    Finished,
    /// The peer's header did not match: a mismatch, or bytes that are not a header.
    Refused,
    /// It still waits for the peer's bytes.
    Waiting,
}

/// `bytes` from rank 1 against rank 0's calls of every kind.
fn checks_against_every_call(bytes: &[u8; HEADER_BYTES]) {
    let mut kinds = vec![
        CallKind::AllGather,
        CallKind::Barrier,
        CallKind::Send,
        CallKind::Rejected,
        CallKind::AllToAll,
        CallKind::Broadcast(u16::from_le_bytes([bytes[5], bytes[6]])),
    ];
    for dtype in [DType::F32, DType::BF16, DType::U8] {
        kinds.push(CallKind::SumScatter(dtype));
        kinds.extend(ReduceOp::ALL.map(|op| CallKind::AllReduce(op, dtype)));
    }
    let decoded = Header::decode(bytes);
    for kind in kinds {
        let count = u64::from_le_bytes(bytes[8..].try_into().unwrap_or_default());
        let seq = u32::from_le_bytes(bytes[..4].try_into().unwrap_or_default());
        let mut calls = vec![Call::group(seq, kind, count), Call::group(SEQ, kind, 3)];
        if kind == CallKind::Send {
            // A recv from rank 1, which expects its `send` header.
            calls.push(Call {
                recv_from: Some(1),
                ..calls[0]
            });
        }
        for call in calls {
            match call.check(0, 1, bytes) {
                Ok(()) => assert_eq!(&call.header.encode(), bytes),
                Err(e) => {
                    assert_ne!(&call.header.encode(), bytes, "{e}");
                    match (&decoded, &e) {
                        (
                            Ok(_),
                            Error::Mismatch {
                                peer: 1, rank: 0, ..
                            },
                        ) => {}
                        (Err(_), Error::PeerMisbehaved { peer: 1, .. }) => {}
                        _ => panic!("{decoded:?} against {call}: {e:?}"),
                    }
                    assert!(!e.to_string().is_empty());
                }
            }
        }
    }
}

/// Runs the collective `selector` picks as rank 0, with `stream` as everything rank 1
/// sends, in chunks of a size `selector` also picks.
fn run_collective(selector: u8, stream: &[u8]) -> Ended {
    let chunk = usize::from(selector / 8) % 24 + 1;
    let Plan {
        call,
        exchange: mut x,
        data,
        input,
        need,
        lands,
        sends,
    } = plan(selector);
    const UNTOUCHED: u8 = 0xEE;
    let mut data = vec![UNTOUCHED; data];
    let input: Vec<u8> = (0..input).map(|i| i as u8).collect();
    let mut stage = vec![0u8; x.staging()];
    let mut mem = Memory {
        data: &mut data,
        input: &input,
        stage: &mut stage,
    };
    let mut taken = 0;
    let mut failed = None;
    let mut sent = Vec::new();
    'run: while !x.is_finished() {
        let mut moved = false;
        for i in 0..x.outs() {
            while let Some((conn, head, body)) = x.poll_transmit(i, &mem) {
                assert_eq!(conn, 0);
                sent.extend_from_slice(head);
                let n = head.len() + body.len();
                x.handle_sent(i, n);
                moved = true;
            }
        }
        for i in 0..x.ins() {
            let Some((conn, into)) = x.poll_receive(i, &mut mem) else {
                continue;
            };
            assert_eq!(conn, 0);
            assert!(!into.is_empty());
            let n = into.len().min(chunk).min(stream.len() - taken);
            if n == 0 {
                continue;
            }
            into[..n].copy_from_slice(&stream[taken..taken + n]);
            taken += n;
            moved = true;
            if let Err(e) = x.handle_received(i, n, &mem) {
                failed = Some(e);
                break 'run;
            }
        }
        moved |= x.complete(&mut mem);
        if !moved {
            break;
        }
    }
    // Rank 0's own header went out first.
    if sends {
        assert_eq!(sent.get(..HEADER_BYTES), Some(&call.header.encode()[..]));
    }
    let theirs = stream.get(..HEADER_BYTES);
    let matches = theirs == Some(&call.header.encode()[..]);
    assert!(taken <= need, "read {taken} bytes of a {need}-byte message");
    match failed {
        Some(e) => {
            assert!(!matches, "a matching header failed: {e}");
            let mut head = [0u8; HEADER_BYTES];
            head.copy_from_slice(theirs.unwrap_or(&[0; HEADER_BYTES]));
            let decoded = Header::decode(&head);
            match (&decoded, &e) {
                (Ok(_), Error::Mismatch { .. }) | (Err(_), Error::PeerMisbehaved { .. }) => {}
                _ => panic!("{decoded:?} against {call}: {e:?}"),
            }
            let refused = decoded.ok().filter(|h| h.kind == CallKind::Send);
            assert_eq!(x.refused(), refused);
            if let Some(r) = lands {
                assert!(
                    data[r].iter().all(|&b| b == UNTOUCHED),
                    "a refused message reached the caller's array"
                );
            }
            Ended::Refused
        }
        None => {
            let whole = stream.len() >= need;
            assert!(!whole || matches, "a mismatched header passed");
            assert_eq!(x.is_finished(), whole && matches, "taken {taken} of {need}");
            assert_eq!(taken, need.min(stream.len()));
            if x.is_finished()
                && let Some(r) = lands
            {
                let len = r.len();
                assert_eq!(data[r], stream[HEADER_BYTES..HEADER_BYTES + len]);
            }
            if x.is_finished() {
                Ended::Finished
            } else {
                Ended::Waiting
            }
        }
    }
}

// ---- Seeds -----------------------------------------------------------------------------

/// The seeds of the native targets (`native_hello`, `native_header`, `native_record`), by
/// file name, as this build encodes them: every kind of hello and header the wire has, a
/// stream of sealed records and each way one can be wrong, and the edge cases around
/// them. `fuzz/seeds/<target>/` holds them, and `tests/fuzz_corpus.rs`
/// checks that it still does, so that they pin the wire's bytes too.
pub fn seeds(target: &str) -> Vec<(&'static str, Vec<u8>)> {
    match target {
        "native_hello" => hello_seeds(),
        "native_header" => header_seeds(),
        "native_record" => super::record::seeds(),
        _ => Vec::new(),
    }
}

fn hello_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let key = hello_key();
    let hello = |me: u32, to: u32, kind: HelloKind, key: Option<&Key>| hello::Hello {
        identity: hello_expect(me, key.is_some()).identity,
        from: me,
        to,
        kind,
    };
    let accepted = hello(0, ANY, HelloKind::Accepted(1), None).encode();
    let ring = hello(3, 0, HelloKind::Ring(1), None).encode();
    let edit = |at: usize, bytes: &[u8]| {
        let mut h = ring.to_vec();
        h[at..at + bytes.len()].copy_from_slice(bytes);
        h
    };
    let mut keyed = hello(3, 0, HelloKind::Ring(1), key.as_ref())
        .encode()
        .to_vec();
    // What follows a keyed hello: the authentication's first message, here garbage.
    keyed.extend((0..60u8).map(|i| i.wrapping_mul(37)));
    let mut trailing = ring.to_vec();
    trailing.extend_from_slice(&2.0f32.to_le_bytes());
    let mut mlx_keyed = MAGIC.to_vec();
    mlx_keyed.push(auth::VERSION);
    mlx_keyed.resize(auth::GREETING_LEN, 0);
    vec![
        ("accepted-on-address-1", accepted.to_vec()),
        ("ring-1-from-rank-3", ring.to_vec()),
        (
            "ring-0-from-rank-1",
            hello(1, 2, HelloKind::Ring(0), None).encode().to_vec(),
        ),
        (
            "mesh-from-rank-0",
            hello(0, 2, HelloKind::Mesh, None).encode().to_vec(),
        ),
        ("keyed-ring-1-then-garbage", keyed),
        ("ring-then-data", trailing),
        ("another-group", edit(40, &[0x55; 16])),
        ("a-key-the-rank-lacks", edit(56, &[0x55; 16])),
        ("five-ranks", edit(20, &5u32.to_le_bytes())),
        ("to-any", edit(28, &ANY.to_le_bytes())),
        ("reserved-set", edit(9, &[1])),
        ("kind-4", edit(32, &4u32.to_le_bytes())),
        ("mesh-index-1", edit(32, &[2, 0, 0, 0, 1, 0, 0, 0])),
        ("version-3", edit(8, &[3])),
        ("truncated", ring[..40].to_vec()),
        ("half-magic", MAGIC[..5].to_vec()),
        ("mlx-no-key", auth::NO_KEY.to_vec()),
        ("mlx-keyed", mlx_keyed),
        ("collective-data", 2.0f32.to_le_bytes().to_vec()),
        ("empty", Vec::new()),
    ]
}

fn header_seeds() -> Vec<(&'static str, Vec<u8>)> {
    // `[selector, rank 1's bytes...]`: selector % 8 picks the collective, selector / 8 the
    // chunk size less one.
    let seed = |selector: u8, header: Header, payload: usize| {
        let mut s = vec![selector];
        s.extend_from_slice(&header.encode());
        s.extend((0..payload).map(|i| 0x10 + i as u8));
        s
    };
    let own = |selector: u8| plan(selector).call.header;
    let with = |selector: u8, edit: &dyn Fn(&mut Header)| {
        let mut h = own(selector);
        edit(&mut h);
        h
    };
    let mut bad_tag = seed(0, own(0), 0);
    bad_tag[1 + 7] = 0;
    let mut bad_dtype = seed(2, own(2), LEN);
    bad_dtype[1 + 6] = 0xFE;
    vec![
        ("barrier", seed(0, own(0), 0)),
        ("recv", seed(1 + 8 * 15, own(1), LEN)),
        ("recv-byte-by-byte", seed(1, own(1), LEN)),
        ("one-shot-all-sum", seed(2 + 8 * 4, own(2), LEN)),
        ("all-gather", seed(3, own(3), LEN)),
        ("scatter-gather-all-sum", seed(4 + 8 * 6, own(4), 2 * LEN)),
        ("broadcast-from-rank-1", seed(5, own(5), LEN)),
        ("all-to-all", seed(6, own(6), LEN)),
        ("sum-scatter", seed(7 + 8 * 2, own(7), LEN)),
        (
            "recv-of-a-longer-send",
            seed(1, with(1, &|h| h.count = LEN as u64 + 4), LEN + 4),
        ),
        (
            "send-against-a-barrier",
            seed(0, with(0, &|h| h.kind = CallKind::Send), 4),
        ),
        (
            "rejected-send-against-a-barrier",
            seed(0, with(0, &|h| h.kind = CallKind::Rejected), 0),
        ),
        (
            "all-max-against-all-sum",
            seed(
                2,
                with(2, &|h| {
                    h.kind = CallKind::AllReduce(ReduceOp::Max, DType::F32)
                }),
                LEN,
            ),
        ),
        (
            "broadcast-from-rank-0",
            seed(5, with(5, &|h| h.kind = CallKind::Broadcast(0)), LEN),
        ),
        (
            "next-sequence-number",
            seed(3, with(3, &|h| h.seq += 1), LEN),
        ),
        ("bad-tag", bad_tag),
        ("bad-dtype", bad_dtype),
        ("short-header", seed(3, own(3), 0)[..10].to_vec()),
        ("empty", Vec::new()),
    ]
}
