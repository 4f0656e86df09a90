//! Who really shares memory with whom: the setup's check that every peer could open the
//! creator's segment, and the verdict every rank learns from the creator. Sans-IO: the
//! messages and their checks; `segment::establish` moves them over the mesh.
//!
//! The hellos' host identity (machine id and boot id) is the same for two containers on
//! one kernel, which need not share `/dev/shm` (each may mount its own). So after the
//! creator (rank 0) offered its segment, each peer tries to open it and answers with a
//! [`STATUS_BYTES`] status: 0 when it mapped the segment, else the error number of its
//! failure (`-1` when the error had none). The creator gathers the statuses and sends
//! every peer the same verdict: the ranks that could not, each with its error. An empty
//! verdict means shared memory for the group; otherwise every rank keeps TCP and says so
//! in a verbose line that names those ranks and why, identically on every rank.
//!
//! # Wire
//!
//! All little-endian. Status (peer to creator): `i32` code. Verdict (creator to every
//! peer): `u32` count, then `count` entries of `u32` rank and `i32` code.

use crate::error::{Error, Phase, Result};

/// The phase errors of the setup name.
pub(crate) const SETUP: Phase = Phase::NativeSetup;

/// Bytes of a peer's status.
pub(crate) const STATUS_BYTES: usize = 4;

/// Bytes of a verdict's count, which comes first.
pub(crate) const VERDICT_HEAD_BYTES: usize = 4;

/// Bytes of each entry of a verdict.
const ENTRY_BYTES: usize = 8;

/// A status code for an error without an error number.
const NO_ERRNO: i32 = -1;

/// A peer's status for the result of opening the segment.
pub(crate) fn status<T>(opened: &std::io::Result<T>) -> [u8; STATUS_BYTES] {
    let code = match opened {
        Ok(_) => 0,
        // An errno of 0 would read as success: never sent as one.
        Err(e) => e.raw_os_error().filter(|&c| c != 0).unwrap_or(NO_ERRNO),
    };
    code.to_le_bytes()
}

/// The creator's reading of `peer`'s status: `None` if it mapped the segment, else its code.
pub(crate) fn read_status(bytes: [u8; STATUS_BYTES]) -> Option<i32> {
    match i32::from_le_bytes(bytes) {
        0 => None,
        code => Some(code),
    }
}

/// A rank that could not open the creator's segment, and its status code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// The rank.
    pub(crate) rank: usize,
    /// Its error number, or -1.
    pub(crate) code: i32,
}

/// The verdict the creator sends every peer.
pub(crate) fn encode_verdict(refusals: &[Refusal]) -> Vec<u8> {
    let mut out = Vec::with_capacity(VERDICT_HEAD_BYTES + refusals.len() * ENTRY_BYTES);
    // At most the group size, which the hello bounds far below u32::MAX.
    out.extend_from_slice(&(refusals.len() as u32).to_le_bytes());
    for r in refusals {
        out.extend_from_slice(&(r.rank as u32).to_le_bytes());
        out.extend_from_slice(&r.code.to_le_bytes());
    }
    out
}

/// How many entry bytes follow a verdict's `head` in a group of `size`.
///
/// # Errors
///
/// More entries than the creator has peers: the creator misbehaved.
pub(crate) fn verdict_body_len(
    head: [u8; VERDICT_HEAD_BYTES],
    size: usize,
    creator: usize,
) -> Result<usize> {
    let count = u32::from_le_bytes(head) as usize;
    if count >= size {
        return Err(misbehaved(
            creator,
            format!(
                "a shared-memory verdict naming {count} ranks, in a group of {size} whose \
             creator has {} peers",
                size.saturating_sub(1)
            ),
        ));
    }
    Ok(count * ENTRY_BYTES)
}

/// The refusals of a verdict's entry bytes, checked: each a peer of the creator (not rank
/// 0, below `size`), named once and in increasing order, with a nonzero code.
///
/// # Errors
///
/// Any entry that breaks those rules: the creator misbehaved.
pub(crate) fn decode_verdict(body: &[u8], size: usize, creator: usize) -> Result<Vec<Refusal>> {
    if !body.len().is_multiple_of(ENTRY_BYTES) {
        return Err(misbehaved(
            creator,
            format!(
                "a shared-memory verdict of {} entry bytes, not a multiple of {ENTRY_BYTES}",
                body.len()
            ),
        ));
    }
    let mut out: Vec<Refusal> = Vec::with_capacity(body.len() / ENTRY_BYTES);
    for entry in body.as_chunks::<ENTRY_BYTES>().0 {
        let mut rank = [0u8; 4];
        let mut code = [0u8; 4];
        rank.copy_from_slice(&entry[..4]);
        code.copy_from_slice(&entry[4..]);
        let rank = u32::from_le_bytes(rank) as usize;
        let code = i32::from_le_bytes(code);
        let after_last = out.last().map_or(1, |r| r.rank + 1);
        if rank < after_last || rank >= size {
            return Err(misbehaved(
                creator,
                format!(
                    "a shared-memory verdict naming rank {rank} (expected increasing ranks from \
                 {after_last} to {})",
                    size - 1
                ),
            ));
        }
        if code == 0 {
            return Err(misbehaved(
                creator,
                format!("a shared-memory verdict naming rank {rank} without an error"),
            ));
        }
        out.push(Refusal { rank, code });
    }
    Ok(out)
}

/// The verbose line's account of `refusals`: each rank and why it could not open the
/// segment.
pub(crate) fn describe(refusals: &[Refusal]) -> String {
    refusals
        .iter()
        .map(|r| {
            let why = if r.code == NO_ERRNO {
                "an error without an error number".to_string()
            } else {
                std::io::Error::from_raw_os_error(r.code).to_string()
            };
            format!("rank {} ({why})", r.rank)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn misbehaved(creator: usize, reason: String) -> Error {
    Error::PeerMisbehaved {
        peer: creator,
        addr: None,
        context: SETUP,
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ENOENT on Linux and macOS.
    const ENOENT: i32 = 2;

    #[test]
    fn statuses_say_mapped_or_the_error_number() {
        assert_eq!(read_status(status(&Ok(()))), None);
        let enoent = std::io::Error::from_raw_os_error(ENOENT);
        assert_eq!(read_status(status::<()>(&Err(enoent))), Some(ENOENT));
        let other = std::io::Error::other("no errno");
        assert_eq!(read_status(status::<()>(&Err(other))), Some(NO_ERRNO));
        // An errno of 0 must not read as mapped.
        let zero = std::io::Error::from_raw_os_error(0);
        assert_eq!(read_status(status::<()>(&Err(zero))), Some(NO_ERRNO));
    }

    #[test]
    fn a_verdict_round_trips_and_is_checked() {
        let refusals = [
            Refusal {
                rank: 1,
                code: ENOENT,
            },
            Refusal { rank: 3, code: -1 },
        ];
        let bytes = encode_verdict(&refusals);
        let mut head = [0u8; VERDICT_HEAD_BYTES];
        head.copy_from_slice(&bytes[..VERDICT_HEAD_BYTES]);
        let body_len = verdict_body_len(head, 4, 0).unwrap();
        assert_eq!(body_len, bytes.len() - VERDICT_HEAD_BYTES);
        let body = &bytes[VERDICT_HEAD_BYTES..];
        assert_eq!(decode_verdict(body, 4, 0).unwrap(), refusals);
        // The empty verdict: shared memory.
        let empty = encode_verdict(&[]);
        assert_eq!(empty, [0, 0, 0, 0]);
        assert_eq!(verdict_body_len([0; 4], 1, 0).unwrap(), 0);

        // As many entries as ranks: more than the creator's peers.
        assert!(verdict_body_len(4u32.to_le_bytes(), 4, 0).is_err());
        // Rank 0 (the creator), a rank past the group, a repeat, a zero code, a torn entry.
        let bad = |rank: u32, code: i32| {
            let mut v = rank.to_le_bytes().to_vec();
            v.extend_from_slice(&code.to_le_bytes());
            v
        };
        for body in [
            bad(0, 2),
            bad(4, 2),
            [bad(2, 2), bad(2, 2)].concat(),
            bad(1, 0),
        ] {
            let e = decode_verdict(&body, 4, 0).expect_err("a bad verdict");
            assert!(matches!(e, Error::PeerMisbehaved { peer: 0, .. }), "{e}");
        }
        assert!(decode_verdict(&bad(1, 2)[..7], 4, 0).is_err());
    }

    #[test]
    fn the_description_names_each_rank_and_why() {
        let text = describe(&[
            Refusal {
                rank: 2,
                code: ENOENT,
            },
            Refusal { rank: 5, code: -1 },
        ]);
        assert!(text.starts_with("rank 2 ("), "{text}");
        assert!(text.contains("No such file"), "{text}");
        assert!(
            text.contains("rank 5 (an error without an error number)"),
            "{text}"
        );
    }
}
