//! The agreement of [`Group::shrink`](crate::Group::shrink) on who survives, sans-IO: a
//! state machine fed with what the rendezvous sockets observe, and the messages it sends.
//!
//! Every survivor starts from the ranks it knows failed (`failed`, original ranks). The
//! coordinator in a survivor's view is the lowest original rank it does not know failed.
//! A survivor that is not the coordinator reports to it (its rank and its failed set) and
//! waits for its decision; if the coordinator cannot be reached, or closes before deciding,
//! it is failed too and the next one is tried. The coordinator merges every report's failed
//! set into its own and decides once every rank it does not know failed has reported (or
//! at its deadline): the members are itself and the ranks that reported, a report being
//! the proof that a rank is alive. Receiving a report makes a rank the coordinator: the
//! sender's failed set holds every rank below it, and it is merged.
//!
//! Two survivors can still end with different decisions (a coordinator that dies after
//! deciding for some of its reporters); the formation that follows carries a digest of
//! the members and the generation ([`digest`]), so such survivors fail to form instead of
//! forming two groups, and agree again.

use std::collections::BTreeSet;

/// What a survivor does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// Report to this original rank, the coordinator in this survivor's view, and wait
    /// for its decision.
    ReportTo(usize),
    /// This survivor coordinates: it waits for reports from these original ranks.
    Collect(Vec<usize>),
    /// Decided: the members, original ranks in order.
    Decided(Vec<usize>),
}

/// One survivor's agreement.
#[derive(Clone, Debug)]
pub(crate) struct Agreement {
    me: usize,
    size: usize,
    /// Original ranks known failed (never `me`).
    failed: BTreeSet<usize>,
    /// Original ranks that reported to this survivor as coordinator.
    reporters: BTreeSet<usize>,
    decided: Option<Vec<usize>>,
}

impl Agreement {
    /// The agreement of original rank `me` of `size`, knowing `failed` failed.
    pub(crate) fn new(me: usize, size: usize, failed: impl IntoIterator<Item = usize>) -> Self {
        let failed = failed
            .into_iter()
            .filter(|&r| r != me && r < size)
            .collect();
        Agreement {
            me,
            size,
            failed,
            reporters: BTreeSet::new(),
            decided: None,
        }
    }

    /// The ranks known failed.
    pub(crate) fn failed(&self) -> &BTreeSet<usize> {
        &self.failed
    }

    /// The coordinator in this survivor's view: the lowest rank not known failed.
    pub(crate) fn coordinator(&self) -> usize {
        (0..self.size)
            .find(|r| !self.failed.contains(r))
            .unwrap_or(self.me)
    }

    /// What to do now.
    pub(crate) fn next(&mut self) -> Next {
        if let Some(members) = &self.decided {
            return Next::Decided(members.clone());
        }
        let coordinator = self.coordinator();
        if coordinator != self.me {
            return Next::ReportTo(coordinator);
        }
        let missing: Vec<usize> = (0..self.size)
            .filter(|r| *r != self.me && !self.failed.contains(r) && !self.reporters.contains(r))
            .collect();
        if missing.is_empty() {
            return Next::Decided(self.decide());
        }
        Next::Collect(missing)
    }

    /// Rank `from` reported, knowing `failed` failed. Ignored once decided: a late
    /// reporter is not a member, and finds the coordinator gone.
    pub(crate) fn on_report(&mut self, from: usize, failed: &BTreeSet<usize>) {
        if self.decided.is_some() || from == self.me || from >= self.size {
            return;
        }
        self.failed.extend(
            failed
                .iter()
                .copied()
                .filter(|&r| r != self.me && r < self.size),
        );
        // The report proves `from` alive.
        self.failed.remove(&from);
        self.reporters.insert(from);
    }

    /// Rank `peer` could not be reached, or closed, or did not answer in time.
    pub(crate) fn on_unreachable(&mut self, peer: usize) {
        if self.decided.is_none() && peer != self.me && peer < self.size {
            self.failed.insert(peer);
            self.reporters.remove(&peer);
        }
    }

    /// The coordinator `from` decided `members`. Ignored unless `from` is the coordinator
    /// in this survivor's view (a decision of another is stale) and nothing is decided yet.
    pub(crate) fn on_decide(&mut self, from: usize, members: &[usize]) {
        if self.decided.is_none() && from == self.coordinator() && from != self.me {
            self.decided = Some(members.to_vec());
        }
    }

    /// As coordinator at its deadline: decides with the reports it has.
    pub(crate) fn decide(&mut self) -> Vec<usize> {
        if let Some(members) = &self.decided {
            return members.clone();
        }
        let mut members: Vec<usize> = self.reporters.iter().copied().collect();
        members.push(self.me);
        members.sort_unstable();
        self.decided = Some(members.clone());
        members
    }

    /// Whether this survivor coordinates (in its view now).
    pub(crate) fn coordinates(&self) -> bool {
        self.coordinator() == self.me
    }
}

/// The digest a shrunk group's formation carries: the original group's identity, the
/// generation and the members (original ranks, in order). Survivors that decided
/// differently get different digests.
pub(crate) fn digest(identity: &[u8; 32], generation: u64, members: &[usize]) -> [u8; 32] {
    let mut h = blake3::Hasher::new_derive_key(DIGEST_CONTEXT);
    h.update(identity);
    h.update(&generation.to_le_bytes());
    h.update(&(members.len() as u64).to_le_bytes());
    for &m in members {
        h.update(&(m as u64).to_le_bytes());
    }
    *h.finalize().as_bytes()
}

const DIGEST_CONTEXT: &str = "nuvec-distributed 2026-12-06 shrunk group digest v1";

// ---- Messages ----------------------------------------------------------------------------

/// The first bytes of every rendezvous message.
pub(crate) const MAGIC: &[u8; 8] = b"NVSHRNK1";

/// What a message says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// "I survive; these failed" (the set is the sender's failed set).
    Report = 1,
    /// "The members are" (the set is the members).
    Decide = 2,
    /// "My rendezvous listener is closed" (a member to the coordinator; the set is empty).
    Ready = 3,
    /// "Form now": every member's listener is closed (the set is the members).
    Go = 4,
}

/// A rendezvous message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Message {
    pub(crate) kind: Kind,
    pub(crate) generation: u64,
    /// The sender's original rank.
    pub(crate) from: usize,
    /// Failed ranks for a report, members for a decision.
    pub(crate) set: BTreeSet<usize>,
}

/// Bytes before the set: magic, kind, generation, sender, size, identity.
const HEAD: usize = 8 + 1 + 8 + 4 + 4 + 32;
/// Bytes of the tag after the set.
const TAG: usize = 32;

/// The length of a message in a group of `size` original ranks.
pub(crate) fn message_len(size: usize) -> usize {
    HEAD + size.div_ceil(8) + TAG
}

/// Why a received message is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Not a rendezvous message (a stranger, or a formation's bytes).
    NotShrink,
    /// From another group: other addresses, size or key.
    OtherGroup,
    /// The tag does not verify under this group's key (or one side has none).
    Tag,
    /// Another generation: a rank of an older or newer shrink.
    Generation(u64),
    /// The sender or a rank in the set is out of range, or the kind is unknown.
    Malformed(String),
}

/// Encodes `message` for the group of `size` ranks whose identity is `identity`; `tag`
/// computes the keyed tag over the bytes before it (zeros without a key).
pub(crate) fn encode(
    message: &Message,
    size: usize,
    identity: &[u8; 32],
    tag: impl Fn(&[u8]) -> [u8; 32],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(message_len(size));
    out.extend_from_slice(MAGIC);
    out.push(message.kind as u8);
    out.extend_from_slice(&message.generation.to_le_bytes());
    out.extend_from_slice(&(message.from as u32).to_le_bytes());
    out.extend_from_slice(&(size as u32).to_le_bytes());
    out.extend_from_slice(identity);
    let mut bits = vec![0u8; size.div_ceil(8)];
    for &r in message.set.iter().filter(|&&r| r < size) {
        bits[r / 8] |= 1 << (r % 8);
    }
    out.extend_from_slice(&bits);
    let t = tag(&out);
    out.extend_from_slice(&t);
    out
}

/// Decodes a message of exactly [`message_len`]`(size)` bytes, checking it against this
/// group (`size`, `identity`, `generation`) and its tag (`tag` as for [`encode`]).
pub(crate) fn decode(
    bytes: &[u8],
    size: usize,
    identity: &[u8; 32],
    generation: u64,
    tag: impl Fn(&[u8]) -> [u8; 32],
) -> Result<Message, Refused> {
    if bytes.len() != message_len(size) || &bytes[..8] != MAGIC {
        return Err(Refused::NotShrink);
    }
    let u32_at = |at: usize| {
        let mut b = [0u8; 4];
        b.copy_from_slice(&bytes[at..at + 4]);
        u32::from_le_bytes(b) as usize
    };
    let mut g = [0u8; 8];
    g.copy_from_slice(&bytes[9..17]);
    let their_generation = u64::from_le_bytes(g);
    let (from, their_size) = (u32_at(17), u32_at(21));
    if their_size != size || bytes[25..57] != identity[..] {
        return Err(Refused::OtherGroup);
    }
    let body = bytes.len() - TAG;
    if tag(&bytes[..body])[..] != bytes[body..] {
        return Err(Refused::Tag);
    }
    if their_generation != generation {
        return Err(Refused::Generation(their_generation));
    }
    let kind = match bytes[8] {
        1 => Kind::Report,
        2 => Kind::Decide,
        3 => Kind::Ready,
        4 => Kind::Go,
        k => return Err(Refused::Malformed(format!("unknown message kind {k}"))),
    };
    if from >= size {
        return Err(Refused::Malformed(format!(
            "sender rank {from} in a group of {size}"
        )));
    }
    let set = (0..size)
        .filter(|&r| bytes[HEAD + r / 8] & (1 << (r % 8)) != 0)
        .collect();
    Ok(Message {
        kind,
        generation: their_generation,
        from,
        set,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ranks: &[usize]) -> BTreeSet<usize> {
        ranks.iter().copied().collect()
    }

    /// Runs the agreement of every rank in `alive` of `size`, each knowing `known[r]`
    /// failed, with reports delivered to whoever each rank reports to, and unreachable
    /// ranks (not alive) failing at once; returns each alive rank's decision.
    fn run(size: usize, alive: &[usize], known: &[&[usize]]) -> Vec<(usize, Vec<usize>)> {
        let mut agreements: Vec<Agreement> = alive
            .iter()
            .map(|&r| Agreement::new(r, size, known[r].iter().copied()))
            .collect();
        let index = |r: usize| alive.iter().position(|&a| a == r);
        for _ in 0..4 * size {
            for i in 0..agreements.len() {
                match agreements[i].next() {
                    Next::ReportTo(c) => match index(c) {
                        None => agreements[i].on_unreachable(c),
                        Some(j) => {
                            let failed = agreements[i].failed().clone();
                            agreements[j].on_report(alive[i], &failed);
                        }
                    },
                    Next::Collect(_) => {}
                    Next::Decided(members) => {
                        for &m in &members {
                            if let Some(j) = index(m) {
                                agreements[j].on_decide(alive[i], &members);
                            }
                        }
                    }
                }
            }
        }
        agreements
            .iter_mut()
            .zip(alive)
            .map(|(a, &r)| match a.next() {
                Next::Decided(m) => (r, m),
                other => panic!("rank {r} did not decide: {other:?}"),
            })
            .collect()
    }

    #[test]
    fn survivors_that_all_know_the_failed_rank_agree_at_once() {
        let decided = run(4, &[0, 1, 3], &[&[2], &[2], &[], &[2]]);
        for (_, members) in decided {
            assert_eq!(members, [0, 1, 3]);
        }
    }

    #[test]
    fn a_failed_coordinator_is_passed_over() {
        // Rank 0 died; only rank 2 knows. Rank 1 cannot reach 0, fails it, and
        // coordinates; 3 reports to 0, fails it too, then reports to 1.
        let decided = run(4, &[1, 2, 3], &[&[], &[], &[0], &[]]);
        for (_, members) in decided {
            assert_eq!(members, [1, 2, 3]);
        }
    }

    #[test]
    fn a_rank_wrongly_known_failed_is_a_member_once_it_reports() {
        // Rank 3 blamed rank 1, which is alive and reports to 0.
        let decided = run(4, &[0, 1, 3], &[&[2], &[2], &[], &[1, 2]]);
        for (_, members) in decided {
            assert_eq!(members, [0, 1, 3]);
        }
    }

    #[test]
    fn the_coordinator_waits_for_every_rank_it_does_not_know_failed() {
        let mut a = Agreement::new(0, 4, [3]);
        assert_eq!(a.next(), Next::Collect(vec![1, 2]));
        a.on_report(1, &set(&[3]));
        assert_eq!(a.next(), Next::Collect(vec![2]));
        // Rank 1 knew 2 failed too: nothing is missing now.
        a.on_report(1, &set(&[2, 3]));
        assert_eq!(a.next(), Next::Decided(vec![0, 1]));
        // Decided: a late report changes nothing.
        a.on_report(2, &set(&[]));
        assert_eq!(a.next(), Next::Decided(vec![0, 1]));
    }

    #[test]
    fn at_the_deadline_the_coordinator_decides_with_the_reports_it_has() {
        let mut a = Agreement::new(0, 3, []);
        a.on_report(2, &set(&[]));
        assert_eq!(a.next(), Next::Collect(vec![1]));
        assert_eq!(a.decide(), [0, 2]);
    }

    #[test]
    fn a_report_makes_its_receiver_the_coordinator() {
        let mut a = Agreement::new(2, 4, []);
        assert_eq!(a.next(), Next::ReportTo(0));
        a.on_report(3, &set(&[0, 1]));
        assert!(a.coordinates());
        assert_eq!(a.next(), Next::Decided(vec![2, 3]));
    }

    #[test]
    fn only_the_coordinator_in_view_decides_for_a_survivor() {
        let mut a = Agreement::new(2, 4, [0]);
        a.on_decide(0, &[0, 1, 2]); // 0 is known failed: stale
        assert_eq!(a.next(), Next::ReportTo(1));
        a.on_decide(1, &[1, 2, 3]);
        assert_eq!(a.next(), Next::Decided(vec![1, 2, 3]));
    }

    #[test]
    fn a_lone_survivor_decides_itself_alone() {
        let mut a = Agreement::new(1, 3, []);
        a.on_unreachable(0);
        assert_eq!(a.next(), Next::Collect(vec![2]));
        a.on_unreachable(2);
        assert_eq!(a.next(), Next::Decided(vec![1]));
    }

    #[test]
    fn digests_differ_with_members_and_generation() {
        let id = [7u8; 32];
        let d = digest(&id, 1, &[0, 1, 3]);
        assert_eq!(d, digest(&id, 1, &[0, 1, 3]));
        assert_ne!(d, digest(&id, 2, &[0, 1, 3]));
        assert_ne!(d, digest(&id, 1, &[0, 1, 2]));
        assert_ne!(d, digest(&[8u8; 32], 1, &[0, 1, 3]));
    }

    fn no_tag(_: &[u8]) -> [u8; 32] {
        [0; 32]
    }

    #[test]
    fn messages_round_trip_and_are_checked() {
        let id = [5u8; 32];
        let m = Message {
            kind: Kind::Report,
            generation: 3,
            from: 9,
            set: set(&[0, 8, 10]),
        };
        let bytes = encode(&m, 11, &id, no_tag);
        assert_eq!(bytes.len(), message_len(11));
        assert_eq!(decode(&bytes, 11, &id, 3, no_tag), Ok(m.clone()));
        assert_eq!(
            decode(&bytes, 11, &id, 4, no_tag),
            Err(Refused::Generation(3))
        );
        assert_eq!(
            decode(&bytes, 11, &[6u8; 32], 3, no_tag),
            Err(Refused::OtherGroup)
        );
        // Another size: another length, or the same length and another group.
        assert_eq!(decode(&bytes, 17, &id, 3, no_tag), Err(Refused::NotShrink));
        assert_eq!(decode(&bytes, 12, &id, 3, no_tag), Err(Refused::OtherGroup));
        let keyed = |b: &[u8]| *blake3::keyed_hash(&[1; 32], b).as_bytes();
        let signed = encode(&m, 11, &id, keyed);
        assert_eq!(decode(&signed, 11, &id, 3, keyed), Ok(m));
        assert_eq!(decode(&signed, 11, &id, 3, no_tag), Err(Refused::Tag));
        assert_eq!(decode(&bytes, 11, &id, 3, keyed), Err(Refused::Tag));
        let mut garbage = bytes.clone();
        garbage[0] = b'X';
        assert_eq!(
            decode(&garbage, 11, &id, 3, no_tag),
            Err(Refused::NotShrink)
        );
        let mut bad = bytes;
        bad[8] = 9;
        assert!(matches!(
            decode(&bad, 11, &id, 3, no_tag),
            Err(Refused::Malformed(_))
        ));
    }
}
