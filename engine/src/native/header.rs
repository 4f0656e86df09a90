//! The header every message of the native wire starts with, and the comparison that turns a
//! disagreement between two ranks' calls into [`Error::Mismatch`], sans-IO.
//!
//! # Layout (16 bytes, little-endian)
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | sequence number (wrapping) |
//! | 4 | kind: 1 all-reduce, 2 all_gather, 3 sum_scatter, 4 barrier, 5 send, 6 rejected send, 7 broadcast, 8 all_to_all |
//! | 5 | op: 0 sum, 1 max, 2 min (0 unless an all-reduce); a broadcast's root, low byte |
//! | 6 | dtype: its index in [`DType::ALL`], [`NO_DTYPE`] for byte collectives; a broadcast's root, high byte |
//! | 7 | [`TAG`], a fixed byte: anything else means the stream is out of step |
//! | 8..16 | count: elements (all-reduce, sum_scatter's input), bytes (all_gather's input, send, broadcast, all_to_all's input), 0 (barrier) |
//!
//! A broadcast carries its root (so that ranks that disagree about it find out) where
//! other kinds carry op and dtype, which it has no use for: 16 bits, so the native wire
//! broadcasts from roots up to 65535.
//!
//! # Sequence numbers
//!
//! Group collectives (all-reduce, all_gather, sum_scatter, barrier) carry the group's own
//! count of them, which every rank advances on every group collective it starts. A
//! `send`/`recv` carries the count of earlier sends from that sender to that receiver,
//! which the sender keeps per destination and the receiver per source. Point-to-point
//! calls between two ranks therefore never disturb the numbers of other pairs, nor of
//! group collectives, and two ranks that only exchange messages never see a false
//! mismatch: each message's number is where both sides are in their own pairwise order.
//! A `recv` expects a header of kind `send`; any other kind is a mismatch.
//!
//! # A rejected send
//!
//! A `send` is not acknowledged (as on MLX's wire: two ranks may both send before they
//! receive), so the sender of a message the receiver refused cannot learn it from the
//! send itself. The receiver answers such a message with a header of kind 6 carrying the
//! message's sequence number and the length it expected, before it fails the group;
//! whatever the sender next reads from it (a group collective's header, a `recv`) is that
//! header, which fails the sender's call with the same mismatch.

use std::fmt;

use crate::element::DType;
use crate::error::{Error, Phase};
use crate::reduce::ReduceOp;
use crate::transport::shm::{self, CallHeader};

/// Bytes in a header.
pub(crate) const HEADER_BYTES: usize = 16;

/// The byte at offset 7 of every header.
pub(crate) const TAG: u8 = 0xA7;

/// The dtype byte of collectives that move bytes, not elements.
pub(crate) const NO_DTYPE: u8 = 0xFF;

/// What kind of call a message belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// all_sum, all_max, all_min.
    AllReduce(ReduceOp, DType),
    /// all_gather of `count` bytes per rank.
    AllGather,
    /// sum_scatter of `count` input elements.
    SumScatter(DType),
    /// barrier.
    Barrier,
    /// send (and the recv that takes it) of `count` bytes.
    Send,
    /// The receiver's answer to a send it refused: it expected `count` bytes.
    Rejected,
    /// broadcast of `count` bytes from the root it holds.
    Broadcast(u16),
    /// all_to_all of `count` input bytes.
    AllToAll,
}

/// One header: the call it describes, as the wire carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) seq: u32,
    pub(crate) kind: Kind,
    pub(crate) count: u64,
}

/// A header that does not decode: the peer is not in step with this rank's stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Garbled([u8; HEADER_BYTES]);

impl fmt::Display for Garbled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a collective header that does not decode: {:02x?}",
            self.0
        )
    }
}

fn op_code(op: ReduceOp) -> u8 {
    match op {
        ReduceOp::Sum => 0,
        ReduceOp::Max => 1,
        ReduceOp::Min => 2,
    }
}

fn dtype_code(dtype: DType) -> u8 {
    DType::ALL
        .iter()
        .position(|&d| d == dtype)
        .map_or(NO_DTYPE, |i| i as u8)
}

impl Header {
    /// The bytes on the wire.
    pub(crate) fn encode(&self) -> [u8; HEADER_BYTES] {
        let (kind, op, dtype) = match self.kind {
            Kind::AllReduce(op, dtype) => (1, op_code(op), dtype_code(dtype)),
            Kind::AllGather => (2, 0, NO_DTYPE),
            Kind::SumScatter(dtype) => (3, 0, dtype_code(dtype)),
            Kind::Barrier => (4, 0, NO_DTYPE),
            Kind::Send => (5, 0, NO_DTYPE),
            Kind::Rejected => (6, 0, NO_DTYPE),
            Kind::Broadcast(root) => {
                let [lo, hi] = root.to_le_bytes();
                (7, lo, hi)
            }
            Kind::AllToAll => (8, 0, NO_DTYPE),
        };
        let mut out = [0u8; HEADER_BYTES];
        out[0..4].copy_from_slice(&self.seq.to_le_bytes());
        out[4] = kind;
        out[5] = op;
        out[6] = dtype;
        out[7] = TAG;
        out[8..16].copy_from_slice(&self.count.to_le_bytes());
        out
    }

    /// The header `bytes` hold, or why they are not one. Every field is checked, so a
    /// header decodes to exactly one byte string (`decode(h.encode()) == h`, and nothing
    /// else decodes).
    pub(crate) fn decode(bytes: &[u8; HEADER_BYTES]) -> Result<Header, Garbled> {
        let garbled = Garbled(*bytes);
        let [s0, s1, s2, s3, kind, op, dtype, tag, ..] = *bytes;
        if tag != TAG {
            return Err(garbled);
        }
        let mut count = [0u8; 8];
        count.copy_from_slice(&bytes[8..16]);
        let count = u64::from_le_bytes(count);
        let seq = u32::from_le_bytes([s0, s1, s2, s3]);
        if kind == 7 {
            // The op and dtype bytes hold the root (see the module docs).
            let root = u16::from_le_bytes([op, dtype]);
            let kind = Kind::Broadcast(root);
            return Ok(Header { seq, kind, count });
        }
        let dtype_of = |code: u8| DType::ALL.get(usize::from(code)).copied();
        let op = match op {
            0 => ReduceOp::Sum,
            1 => ReduceOp::Max,
            2 => ReduceOp::Min,
            _ => return Err(garbled),
        };
        let plain = op == ReduceOp::Sum;
        let kind = match (kind, dtype) {
            (1, d) => Kind::AllReduce(op, dtype_of(d).ok_or(garbled)?),
            (2, NO_DTYPE) if plain => Kind::AllGather,
            (3, d) if plain => Kind::SumScatter(dtype_of(d).ok_or(garbled)?),
            (4, NO_DTYPE) if plain => Kind::Barrier,
            (5, NO_DTYPE) if plain => Kind::Send,
            (6, NO_DTYPE) if plain => Kind::Rejected,
            (8, NO_DTYPE) if plain => Kind::AllToAll,
            _ => return Err(garbled),
        };
        Ok(Header { seq, kind, count })
    }
}

/// One rank's side of a message: the header it sends, or the one it expects, and how to
/// name the call in an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Call {
    /// The header on the wire (a `recv` expects its sender's `send` header).
    pub(crate) header: Header,
    /// For a `recv`: the rank it receives from (it is named "recv", not "send").
    pub(crate) recv_from: Option<usize>,
    /// For a `send`: the rank it sends to.
    pub(crate) send_to: Option<usize>,
}

impl Call {
    /// A group collective's call.
    pub(crate) fn group(seq: u32, kind: Kind, count: u64) -> Call {
        Call {
            header: Header { seq, kind, count },
            recv_from: None,
            send_to: None,
        }
    }

    /// The phase errors of this call name.
    pub(crate) fn phase(&self) -> Phase {
        match self.header.kind {
            Kind::AllReduce(op, _) => op.phase(),
            Kind::AllGather => Phase::AllGather,
            Kind::SumScatter(_) => Phase::SumScatter,
            // A barrier is an all_sum in the MLX wire's errors too.
            Kind::Barrier => Phase::AllSum,
            Kind::Send if self.recv_from.is_some() => Phase::Recv,
            Kind::Send | Kind::Rejected => Phase::Send,
            Kind::Broadcast(_) => Phase::Broadcast,
            Kind::AllToAll => Phase::AllToAll,
        }
    }

    /// The header that answers a send this `recv` refused (see the module docs).
    pub(crate) fn rejection(&self) -> Header {
        Header {
            kind: Kind::Rejected,
            ..self.header
        }
    }

    /// Compares the header `peer` sent with this rank's own call, before any of the
    /// message's data is taken: any difference is [`Error::Mismatch`] naming both calls.
    pub(crate) fn check(
        &self,
        me: usize,
        peer: usize,
        got: &[u8; HEADER_BYTES],
    ) -> Result<(), Error> {
        // A peer in step sent this call's own encoding: decoding accepts exactly the
        // encodings, so equal bytes are an equal header, without the decode.
        if *got == self.header.encode() {
            return Ok(());
        }
        let context = self.phase();
        let theirs = match Header::decode(got) {
            Ok(h) => h,
            Err(garbled) => {
                return Err(Error::PeerMisbehaved {
                    peer,
                    addr: None,
                    context,
                    reason: garbled.to_string(),
                });
            }
        };
        if theirs == self.header {
            return Ok(());
        }
        if theirs.kind == Kind::Rejected {
            // About an earlier send of this rank, which the caller names (`call` empty).
            return Err(Error::Mismatch {
                seq: u64::from(theirs.seq),
                point_to_point: true,
                rank: me,
                call: String::new(),
                peer,
                peer_call: format!("recv of {} bytes from rank {me}", theirs.count),
                differs: String::new(),
                context,
            });
        }
        // The peer's call as it would name it: a send header comes from a send to us.
        let peer_call = Call {
            header: theirs,
            recv_from: None,
            send_to: (theirs.kind == Kind::Send).then_some(me),
        };
        let point = self.recv_from.is_some() || theirs.kind == Kind::Send;
        Err(Error::Mismatch {
            seq: u64::from(if point {
                theirs.seq.min(self.header.seq)
            } else {
                self.header.seq
            }),
            point_to_point: point,
            rank: me,
            call: self.to_string(),
            peer,
            peer_call: peer_call.to_string(),
            differs: differences(&self.header, &theirs, me, peer),
            context,
        })
    }
}

/// What differs between this rank's (`me`) header `mine` and the one `peer` sent, in
/// words, each value named by its rank, lower rank first.
fn differences(mine: &Header, theirs: &Header, me: usize, peer: usize) -> String {
    let both = |what: &str, here: String, there: String| {
        let ((r0, v0), (r1, v1)) = if me <= peer {
            ((me, here), (peer, there))
        } else {
            ((peer, there), (me, here))
        };
        format!("the {what} differs (rank {r0}: {v0}, rank {r1}: {v1})")
    };
    let mut out: Vec<String> = Vec::new();
    let counts = |what: &str| both(what, mine.count.to_string(), theirs.count.to_string());
    match (mine.kind, theirs.kind) {
        (Kind::AllReduce(a, x), Kind::AllReduce(b, y)) => {
            if a != b {
                out.push(both("op", a.collective().into(), b.collective().into()));
            }
            if x != y {
                out.push(both("dtype", x.to_string(), y.to_string()));
            }
            if mine.count != theirs.count {
                out.push(counts("element count"));
            }
        }
        (Kind::SumScatter(x), Kind::SumScatter(y)) => {
            if x != y {
                out.push(both("dtype", x.to_string(), y.to_string()));
            }
            if mine.count != theirs.count {
                out.push(counts("element count"));
            }
        }
        (Kind::Broadcast(a), Kind::Broadcast(b)) => {
            if a != b {
                out.push(both("root", a.to_string(), b.to_string()));
            }
            if mine.count != theirs.count {
                out.push(counts("byte count"));
            }
        }
        (a, b) if a == b => {
            if mine.count != theirs.count {
                out.push(counts("byte count"));
            }
        }
        _ => out.push("the collectives differ".to_string()),
    }
    if mine.seq != theirs.seq {
        let numbers = both(
            "number",
            format!("#{}", mine.seq),
            format!("#{}", theirs.seq),
        );
        if out.is_empty() {
            return format!(
                "the same call, but {numbers}: a message was lost, duplicated or replayed"
            );
        }
        out.push(numbers);
    }
    out.join("; ")
}

// Shared memory carries the native header in slots of its own size.
const _: () = assert!(HEADER_BYTES == shm::HEADER_BYTES);

/// A native call as shared memory publishes and compares it.
impl CallHeader for Call {
    fn encode(&self) -> [u8; HEADER_BYTES] {
        self.header.encode()
    }

    fn check(&self, me: usize, peer: usize, theirs: &[u8; HEADER_BYTES]) -> Result<(), Error> {
        Call::check(self, me, peer, theirs)
    }

    fn rejection(&self) -> [u8; HEADER_BYTES] {
        Call::rejection(self).encode()
    }

    fn refused_by(
        &self,
        (me, peer, from): (usize, usize, usize),
        theirs: &[u8; HEADER_BYTES],
        context: Phase,
    ) -> Error {
        match Header::decode(theirs) {
            Err(garbled) => Error::PeerMisbehaved {
                peer,
                addr: None,
                context,
                reason: format!("its refused recv's header in shared memory: {garbled}"),
            },
            Ok(recv) => Error::Mismatch {
                seq: u64::from(recv.seq),
                point_to_point: true,
                rank: me,
                call: self.to_string(),
                peer,
                peer_call: format!("recv of {} bytes from rank {from}", recv.count),
                differs: String::new(),
                context,
            },
        }
    }

    fn unmatched_send(
        &self,
        (me, peer): (usize, usize),
        sent: &[u8; HEADER_BYTES],
        context: Phase,
    ) -> Result<(), Error> {
        let header = Header::decode(sent).map_err(|garbled| Error::Bug {
            context,
            what: format!("this rank's own send in shared memory: {garbled}"),
        })?;
        let send = Call {
            header,
            recv_from: None,
            send_to: Some(peer),
        };
        Call::check(&send, me, peer, &self.header.encode())
    }
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let count = self.header.count;
        match self.header.kind {
            Kind::AllReduce(op, dtype) => write!(f, "{} {dtype} x {count}", op.collective()),
            Kind::AllGather => write!(f, "all_gather of {count} bytes"),
            Kind::SumScatter(dtype) => write!(f, "sum_scatter {dtype} x {count}"),
            Kind::Barrier => f.write_str("barrier"),
            Kind::Rejected => write!(f, "recv of {count} bytes"),
            Kind::Broadcast(root) => write!(f, "broadcast of {count} bytes from rank {root}"),
            Kind::AllToAll => write!(f, "all_to_all of {count} bytes"),
            Kind::Send => match (self.recv_from, self.send_to) {
                (Some(src), _) => write!(f, "recv of {count} bytes from rank {src}"),
                (None, Some(dst)) => write!(f, "send of {count} bytes to rank {dst}"),
                (None, None) => write!(f, "send of {count} bytes"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn kinds() -> Vec<Kind> {
        let mut kinds = vec![Kind::AllGather, Kind::Barrier, Kind::Send, Kind::Rejected];
        kinds.extend([Kind::AllToAll, Kind::Broadcast(0), Kind::Broadcast(0x1234)]);
        for dtype in DType::ALL {
            kinds.push(Kind::SumScatter(dtype));
            for op in ReduceOp::ALL {
                kinds.push(Kind::AllReduce(op, dtype));
            }
        }
        kinds
    }

    #[test]
    fn every_kind_round_trips_and_the_layout_is_fixed() {
        for kind in kinds() {
            let h = Header {
                seq: 0xDEAD_BEEF,
                kind,
                count: 0x0102_0304_0506_0708,
            };
            let bytes = h.encode();
            assert_eq!(Header::decode(&bytes), Ok(h));
            assert_eq!(bytes[..4], [0xEF, 0xBE, 0xAD, 0xDE]);
            assert_eq!(bytes[7], TAG);
            assert_eq!(bytes[8..], [8, 7, 6, 5, 4, 3, 2, 1]);
        }
        let sum = Header {
            seq: 1,
            kind: Kind::AllReduce(ReduceOp::Max, DType::F32),
            count: 10,
        };
        assert_eq!(sum.encode()[4..8], [1, 1, 11, TAG]);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        /// Decoding accepts exactly the encodings: no two byte strings mean one header.
        #[test]
        fn any_bytes_decode_only_to_their_own_encoding(bytes in any::<[u8; HEADER_BYTES]>()) {
            if let Ok(h) = Header::decode(&bytes) {
                prop_assert_eq!(h.encode(), bytes);
            }
        }
    }

    #[test]
    fn a_mismatch_names_both_calls_in_rank_order() {
        let mine = Call::group(17, Kind::AllReduce(ReduceOp::Sum, DType::F32), 20);
        let theirs = Header {
            seq: 17,
            kind: Kind::AllReduce(ReduceOp::Sum, DType::F32),
            count: 10,
        };
        let e = mine.check(1, 0, &theirs.encode()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "collective #17: rank 0 called all_sum float32 x 10, rank 1 called all_sum float32 \
             x 20; the element count differs (rank 0: 10, rank 1: 20)"
        );
        // Only the number differs: a message was lost, duplicated or replayed.
        let replayed = Call::group(16, mine.header.kind, mine.header.count);
        let e = mine.check(1, 0, &replayed.header.encode()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "collective #17: rank 0 called all_sum float32 x 20, rank 1 called all_sum float32 \
             x 20; the same call, but the number differs (rank 0: #16, rank 1: #17): a \
             message was lost, duplicated or replayed"
        );
        assert!(mine.check(1, 0, &mine.header.encode()).is_ok());
        let mut garbage = mine.header.encode();
        garbage[7] = 0;
        let e = mine.check(1, 0, &garbage).unwrap_err();
        assert!(matches!(e, Error::PeerMisbehaved { peer: 0, .. }), "{e}");
    }

    #[test]
    fn the_new_kinds_keep_the_old_encodings_and_carry_the_root() {
        // The encodings of the kinds before broadcast and all_to_all are unchanged.
        let old = Header {
            seq: 2,
            kind: Kind::Rejected,
            count: 9,
        };
        assert_eq!(old.encode()[4..8], [6, 0, NO_DTYPE, TAG]);
        let b = Header {
            seq: 2,
            kind: Kind::Broadcast(0x0102),
            count: 9,
        };
        assert_eq!(b.encode()[4..8], [7, 0x02, 0x01, TAG]);
        let a = Header {
            seq: 2,
            kind: Kind::AllToAll,
            count: 9,
        };
        assert_eq!(a.encode()[4..8], [8, 0, NO_DTYPE, TAG]);
        // Two roots are a mismatch naming both.
        let mine = Call::group(5, Kind::Broadcast(1), 64);
        let theirs = Header {
            seq: 5,
            kind: Kind::Broadcast(0),
            count: 64,
        };
        let e = mine.check(2, 3, &theirs.encode()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "collective #5: rank 2 called broadcast of 64 bytes from rank 1, rank 3 called \
             broadcast of 64 bytes from rank 0; the root differs (rank 2: 1, rank 3: 0)"
        );
        assert!(
            matches!(
                e,
                Error::Mismatch {
                    context: Phase::Broadcast,
                    peer: 3,
                    ..
                }
            ),
            "{e}"
        );
        let gather = Header {
            seq: 5,
            kind: Kind::AllGather,
            count: 16,
        };
        let e = Call::group(5, Kind::AllToAll, 64)
            .check(0, 1, &gather.encode())
            .unwrap_err();
        assert!(matches!(e, Error::Mismatch { peer: 1, .. }), "{e}");
        assert!(e.to_string().contains("all_to_all of 64 bytes"), "{e}");
    }

    #[test]
    fn a_recv_names_the_send_it_got() {
        let recv = Call {
            header: Header {
                seq: 3,
                kind: Kind::Send,
                count: 8,
            },
            recv_from: Some(0),
            send_to: None,
        };
        let sent = Header {
            seq: 3,
            kind: Kind::Send,
            count: 4,
        };
        let e = recv.check(1, 0, &sent.encode()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "send/recv #3: rank 0 called send of 4 bytes to rank 1, rank 1 called recv of 8 \
             bytes from rank 0; the byte count differs (rank 0: 4, rank 1: 8)"
        );
    }
}
