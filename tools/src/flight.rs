//! `nuvec flight`: reads the flight records of a run's ranks (written by
//! `FlightRecord::write`, `flight-rank<R>.json`, when a call fails a group, or on request)
//! and says what went wrong: where each rank stopped, the first call at which ranks
//! differ, which ranks are behind or ahead, and which calls did not finish.
//!
//! Calls are compared by number: the k-th call of every rank pairs with the k-th of every
//! other. A record keeps only a rank's last calls, so two ranks are compared over the calls
//! both still hold.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// One rank's record, as `FlightRecord::to_json` writes it.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Dump {
    /// The rank.
    pub rank: usize,
    /// The group's size.
    pub size: usize,
    /// The backend (the wire).
    pub backend: String,
    /// How many calls the recorder keeps.
    pub capacity: usize,
    /// When the group formed, in nanoseconds since the Unix epoch.
    pub formed_unix_ns: u64,
    /// When the record was taken, in nanoseconds since the group formed.
    pub taken_ns: u64,
    /// How many calls the group started.
    pub calls: u64,
    /// The last calls, oldest first.
    pub entries: Vec<Entry>,
}

/// One recorded call.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Entry {
    /// The call's number.
    pub seq: u64,
    /// `all_sum`, `all_gather`, `send`, ...
    pub op: String,
    /// The element type, when the call said it.
    pub dtype: Option<String>,
    /// Elements, when the element type is known.
    pub count: Option<u64>,
    /// The buffer's length in bytes.
    pub bytes: u64,
    /// The peer of a send or receive, the root of a broadcast.
    pub peer: Option<usize>,
    /// The algorithm the backend took (`one_shot`, `ring`, ...), when it said; absent
    /// from records written before the recorder named it.
    #[serde(default)]
    pub algorithm: Option<String>,
    /// What carried it.
    pub transport: String,
    /// Start, in nanoseconds since the group formed.
    pub start_ns: u64,
    /// End, in nanoseconds since the group formed; `None` while it ran.
    pub end_ns: Option<u64>,
    /// `ok`, `running` or `failed`.
    pub outcome: String,
    /// The error of a failed call.
    pub error: Option<CallError>,
}

/// The error a call failed with.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
pub struct CallError {
    /// The error's variant (`Timeout`, `Mismatch`, ...).
    pub kind: String,
    /// Whose fault it is (`PeerFailed`, `Misuse`, ...).
    pub fault: String,
    /// The peer it blames.
    pub peer: Option<usize>,
}

impl Entry {
    fn is_point_to_point(&self) -> bool {
        self.op == "send" || self.op == "recv"
    }

    /// The call as one line: `all_sum float32 x10`, `send 40 B to rank 2`.
    pub fn describe(&self) -> String {
        let mut text = self.op.clone();
        match (&self.dtype, self.count) {
            (Some(dtype), Some(count)) => {
                let _ = write!(text, " {dtype} x{count}");
            }
            _ if self.op != "barrier" => {
                let _ = write!(text, " {} B", self.bytes);
            }
            _ => {}
        }
        match (self.op.as_str(), self.peer) {
            ("send", Some(p)) => {
                let _ = write!(text, " to rank {p}");
            }
            ("recv", Some(p)) => {
                let _ = write!(text, " from rank {p}");
            }
            ("broadcast", Some(p)) => {
                let _ = write!(text, " from root {p}");
            }
            _ => {}
        }
        text
    }

    /// The call with its algorithm, when recorded: `all_sum float32 x10 by ring`.
    pub fn describe_taken(&self) -> String {
        match &self.algorithm {
            Some(algorithm) => format!("{} by {algorithm}", self.describe()),
            None => self.describe(),
        }
    }

    /// How the call ended, in words.
    pub fn ending(&self) -> String {
        match (self.outcome.as_str(), &self.error) {
            ("failed", Some(e)) => match e.peer {
                Some(p) => format!("failed ({}, blaming rank {p})", e.kind),
                None => format!("failed ({})", e.kind),
            },
            (outcome, _) => outcome.to_string(),
        }
    }

    /// What must agree between ranks making this call as their k-th: a collective's op,
    /// length and root, and the element type where both ranks' records know it.
    fn agrees_with(&self, other: &Entry) -> bool {
        let dtype = match (&self.dtype, &other.dtype) {
            (Some(a), Some(b)) => a == b,
            _ => true,
        };
        let root = self.op != "broadcast" || self.peer == other.peer;
        self.op == other.op && self.bytes == other.bytes && dtype && root
    }
}

impl Dump {
    /// The entry of call `seq`, if this record still holds it.
    fn entry(&self, seq: u64) -> Option<&Entry> {
        let first = self.entries.first()?.seq;
        let index = usize::try_from(seq.checked_sub(first)?).ok()?;
        self.entries.get(index).filter(|e| e.seq == seq)
    }
}

/// Where one rank stopped.
#[derive(Clone, Debug, Serialize)]
pub struct RankState {
    /// The rank.
    pub rank: usize,
    /// How many calls it started.
    pub calls: u64,
    /// Its last call: number, description and ending.
    pub last: Option<CallState>,
}

/// A call of one rank, described.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct CallState {
    /// The call's number.
    pub seq: u64,
    /// `all_sum float32 x10`, with `by <algorithm>` when the record names it.
    pub call: String,
    /// `ok`, `running` or `failed (...)`.
    pub ending: String,
}

/// The first call at which ranks differ.
#[derive(Clone, Debug, Serialize)]
pub struct Divergence {
    /// The call's number.
    pub seq: u64,
    /// The distinct calls made there, each with the ranks that made it, the largest group
    /// first.
    pub calls: Vec<CallGroup>,
    /// The ranks whose call differs from the most common one.
    pub odd: Vec<usize>,
    /// Whether point-to-point calls are involved (then ranks that do not take part in
    /// them number their calls differently, and the difference may be by design).
    pub point_to_point: bool,
}

/// A call the ranks made alike (the same op, length, element type and root) whose
/// algorithms differ between them: their backends disagree on how to run it (different
/// builds, or options that should agree), which can hang or corrupt the call.
#[derive(Clone, Debug, Serialize)]
pub struct AlgorithmSplit {
    /// The call's number.
    pub seq: u64,
    /// The call, described (`all_sum float32 x10`).
    pub call: String,
    /// Each algorithm with the ranks that took it, the largest group first.
    pub algorithms: Vec<CallGroup>,
}

/// Ranks that made the same call.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct CallGroup {
    /// The call, described (`all_sum float32 x10`).
    pub call: String,
    /// The ranks that made it.
    pub ranks: Vec<usize>,
}

/// A rank's call that did not finish well.
#[derive(Clone, Debug, Serialize)]
pub struct Unfinished {
    /// The rank.
    pub rank: usize,
    /// The call.
    #[serde(flatten)]
    pub call: CallState,
}

/// A rank that made fewer (or more) calls than most.
#[derive(Clone, Debug, Serialize)]
pub struct Lag {
    /// The rank.
    pub rank: usize,
    /// Its calls.
    pub calls: u64,
    /// The calls most ranks made.
    pub usual: u64,
    /// For a rank behind: the call the others made next, which it never started.
    pub missed: Option<String>,
}

/// The rank that most of the other ranks' failed calls blame for a peer's failure: they
/// timed out waiting for it, or lost their connection to it.
#[derive(Clone, Debug, Serialize)]
pub struct Blamed {
    /// The rank.
    pub rank: usize,
    /// The ranks whose call that did not finish blames it.
    pub by: Vec<usize>,
    /// Their call (the lowest of those ranks').
    pub call: CallState,
    /// Those of `by` that failed a later call than `call`, with that call's number: on a
    /// ring, a neighbour of the hung rank can finish the call the others wait in and fail
    /// the next.
    pub later: Vec<(usize, u64)>,
    /// Whether one of them timed out waiting for it (rather than all losing their
    /// connections to it): it hung, or was stopped.
    pub timed_out: bool,
    /// Its own call that did not finish, if its record holds one.
    pub own: Option<CallState>,
}

/// What `nuvec flight` concludes.
#[derive(Clone, Debug, Serialize)]
pub struct Verdict {
    /// The group's size, as the records give it.
    pub size: usize,
    /// Ranks of the group with no record.
    pub missing: Vec<usize>,
    /// Per rank, where it stopped.
    pub ranks: Vec<RankState>,
    /// The first call at which the ranks' records differ.
    pub divergence: Option<Divergence>,
    /// The first call that the ranks made alike but by different algorithms.
    pub algorithms: Option<AlgorithmSplit>,
    /// Ranks that made fewer calls than most.
    pub behind: Vec<Lag>,
    /// The rank the others' failed calls blame, when most of them blame one.
    pub blamed: Option<Blamed>,
    /// Ranks that made more calls than most.
    pub ahead: Vec<Lag>,
    /// Per rank, a call that did not finish well: still running when the record was
    /// taken, or failed.
    pub unfinished: Vec<Unfinished>,
    /// What went wrong, in a few sentences, the most telling first.
    pub summary: Vec<String>,
}

/// Reads the records named by `paths`: files, or directories whose `flight-rank*.json`
/// files (not the `.trace.json` traces) are read.
///
/// # Errors
///
/// A path that cannot be read or parsed (naming it), two records of one rank, or records
/// of groups of different sizes.
pub fn read(paths: &[PathBuf]) -> Result<Vec<Dump>, String> {
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            let listing = std::fs::read_dir(path)
                .map_err(|e| format!("reading the directory {}: {e}", path.display()))?;
            let mut found: Vec<PathBuf> = listing
                .filter_map(|entry| entry.ok().map(|e| e.path()))
                .filter(|p| is_record(p))
                .collect();
            if found.is_empty() {
                return Err(format!(
                    "{} holds no flight record (flight-rank<R>.json)",
                    path.display()
                ));
            }
            found.sort();
            files.extend(found);
        } else {
            files.push(path.clone());
        }
    }
    if files.is_empty() {
        return Err("no flight record given".into());
    }
    let mut dumps: Vec<Dump> = Vec::with_capacity(files.len());
    for file in &files {
        let text = std::fs::read_to_string(file)
            .map_err(|e| format!("reading {}: {e}", file.display()))?;
        let dump: Dump = serde_json::from_str(&text)
            .map_err(|e| format!("{} is not a flight record: {e}", file.display()))?;
        if let Some(other) = dumps.iter().find(|d| d.rank == dump.rank) {
            return Err(format!(
                "two records of rank {} ({} and another); give one run's records",
                other.rank,
                file.display()
            ));
        }
        if let Some(other) = dumps.iter().find(|d| d.size != dump.size) {
            return Err(format!(
                "{} is of a group of {} ranks, rank {}'s of {}; give one group's records",
                file.display(),
                dump.size,
                other.rank,
                other.size
            ));
        }
        dumps.push(dump);
    }
    dumps.sort_by_key(|d| d.rank);
    Ok(dumps)
}

/// Whether `path` is named as a rank's record (`flight-rank<R>.json`).
fn is_record(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("flight-rank"))
        .and_then(|n| n.strip_suffix(".json"))
        .is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit()))
}

/// Compares the records of one run (see the module docs).
pub fn analyse(dumps: &[Dump]) -> Verdict {
    let size = dumps.first().map_or(0, |d| d.size);
    let missing: Vec<usize> = (0..size)
        .filter(|r| !dumps.iter().any(|d| d.rank == *r))
        .collect();
    let state = |e: &Entry| CallState {
        seq: e.seq,
        call: e.describe_taken(),
        ending: e.ending(),
    };
    let ranks: Vec<RankState> = dumps
        .iter()
        .map(|d| RankState {
            rank: d.rank,
            calls: d.calls,
            last: d.entries.last().map(state),
        })
        .collect();
    let unfinished: Vec<Unfinished> = dumps
        .iter()
        .filter_map(|d| {
            d.entries
                .iter()
                .find(|e| e.outcome != "ok")
                .map(|e| Unfinished {
                    rank: d.rank,
                    call: state(e),
                })
        })
        .collect();
    let divergence = divergence(dumps);
    let blamed = blamed(dumps, &unfinished);
    let algorithms = algorithm_split(dumps, divergence.as_ref().map_or(u64::MAX, |d| d.seq));

    // The usual number of calls: the most common, the larger on a tie.
    let mut counts: BTreeMap<u64, usize> = BTreeMap::new();
    for d in dumps {
        *counts.entry(d.calls).or_default() += 1;
    }
    let usual = counts
        .iter()
        .max_by_key(|&(calls, ranks)| (*ranks, *calls))
        .map_or(0, |(calls, _)| *calls);
    let behind: Vec<Lag> = dumps
        .iter()
        .filter(|d| d.calls < usual)
        .map(|d| Lag {
            rank: d.rank,
            calls: d.calls,
            usual,
            missed: dumps
                .iter()
                .filter(|o| o.calls == usual)
                .find_map(|o| o.entry(d.calls))
                .map(Entry::describe),
        })
        .collect();
    let ahead: Vec<Lag> = dumps
        .iter()
        .filter(|d| d.calls > usual)
        .map(|d| Lag {
            rank: d.rank,
            calls: d.calls,
            usual,
            missed: None,
        })
        .collect();

    let mut summary = Vec::new();
    if let Some(div) = &divergence {
        let calls: Vec<String> = div
            .calls
            .iter()
            .map(|g| format!("{} {}", rank_list(&g.ranks), g.call))
            .collect();
        let mut line = format!(
            "the ranks' calls differ first at call {}: {}",
            div.seq,
            calls.join("; ")
        );
        if !div.odd.is_empty() {
            let _ = write!(line, ". The odd one out: {}", rank_list(&div.odd));
        }
        if div.point_to_point {
            line.push_str(
                " (point-to-point calls are involved: ranks that do not take part in a send \
                 or receive number their calls differently, so this may be by design)",
            );
        }
        summary.push(line);
    }
    if let Some(split) = &algorithms {
        let taken: Vec<String> = split
            .algorithms
            .iter()
            .map(|g| format!("{} by {}", rank_list(&g.ranks), g.call))
            .collect();
        summary.push(format!(
            "the ranks ran call {} ({}) by different algorithms: {}",
            split.seq,
            split.call,
            taken.join("; ")
        ));
    }
    // The rank the others wait for comes first, before the ranks behind: one of those may
    // only be stuck in an earlier call waiting for it (a ring's neighbour of the hung rank
    // finishes the call the others wait in, then fails the next). A rank behind, or
    // without a record, has a line of its own.
    if let Some(b) = blamed
        .as_ref()
        .filter(|b| !behind.iter().any(|lag| lag.rank == b.rank) && !missing.contains(&b.rank))
    {
        let (verb, how) = if b.timed_out {
            ("hung", "waiting for it")
        } else {
            ("failed", "losing their connection to it")
        };
        let mut line = format!(
            "rank {} {verb}: {} failed call {} ({}) {how}",
            b.rank,
            rank_list(&b.by),
            b.call.seq,
            b.call.call
        );
        for (rank, seq) in &b.later {
            let _ = write!(line, " (rank {rank} in call {seq})");
        }
        if let Some(own) = &b.own {
            let _ = write!(
                line,
                "; its own call {} ({}): {}",
                own.seq, own.call, own.ending
            );
        }
        summary.push(line);
    }
    for lag in &behind {
        let others: Vec<usize> = dumps
            .iter()
            .filter(|d| d.calls == usual)
            .map(|d| d.rank)
            .collect();
        let mut line = format!(
            "rank {} is behind: it started {} calls, {} started {}",
            lag.rank,
            lag.calls,
            rank_list(&others),
            lag.usual
        );
        if let Some(missed) = &lag.missed {
            let _ = write!(
                line,
                "; it never started call {} ({missed}), which they wait in or failed in",
                lag.calls
            );
        }
        if let Some(b) = blamed.as_ref().filter(|b| b.by.contains(&lag.rank)) {
            let _ = write!(line, "; its own last call failed on rank {}", b.rank);
        }
        summary.push(line);
    }
    for lag in &ahead {
        summary.push(format!(
            "rank {} is ahead: it started {} calls, most ranks {}",
            lag.rank, lag.calls, lag.usual
        ));
    }
    if !missing.is_empty() {
        let blamed: Vec<usize> = unfinished
            .iter()
            .filter_map(|u| {
                let d = dumps.iter().find(|d| d.rank == u.rank)?;
                d.entries.iter().find_map(|e| e.error.as_ref()?.peer)
            })
            .filter(|p| missing.contains(p))
            .collect();
        let mut line = format!(
            "no record from {} (it did not fail a call, or could not write)",
            rank_list(&missing)
        );
        if !blamed.is_empty() {
            let mut blamed = blamed;
            blamed.sort_unstable();
            blamed.dedup();
            let _ = write!(
                line,
                "; the others' errors blame {}: look at what it was doing",
                rank_list(&blamed)
            );
        }
        summary.push(line);
    }
    for Unfinished { rank, call } in &unfinished {
        summary.push(format!(
            "rank {rank} did not finish call {} ({}): {}",
            call.seq, call.call, call.ending
        ));
    }
    if summary.is_empty() {
        summary.push(
            "every rank made the same calls and each finished: the records show nothing wrong"
                .into(),
        );
    }
    Verdict {
        size,
        missing,
        ranks,
        divergence,
        algorithms,
        behind,
        blamed,
        ahead,
        unfinished,
        summary,
    }
}

/// The rank blamed, for a peer's failure (`PeerFailed`), by the calls in `unfinished` of
/// more ranks than any other rank, and by at least half of the other ranks with a record.
fn blamed(dumps: &[Dump], unfinished: &[Unfinished]) -> Option<Blamed> {
    let failure = |u: &Unfinished| {
        let d = dumps.iter().find(|d| d.rank == u.rank)?;
        let e = d.entry(u.call.seq)?;
        let error = e.error.as_ref().filter(|e| e.fault == "PeerFailed")?;
        Some((
            error.peer.filter(|&p| p != u.rank)?,
            error.kind == "Timeout",
        ))
    };
    let mut by: BTreeMap<usize, Vec<(&Unfinished, bool)>> = BTreeMap::new();
    for u in unfinished {
        if let Some((peer, timed_out)) = failure(u) {
            by.entry(peer).or_default().push((u, timed_out));
        }
    }
    let most = by.values().map(Vec::len).max()?;
    let mut leaders = by.iter().filter(|(_, v)| v.len() == most);
    let (&rank, blamers) = leaders.next()?;
    let others = dumps.iter().filter(|d| d.rank != rank).count();
    if leaders.next().is_some() || 2 * most < others {
        return None;
    }
    let first = blamers.iter().map(|(u, _)| &u.call).min_by_key(|c| c.seq)?;
    Some(Blamed {
        rank,
        by: blamers.iter().map(|(u, _)| u.rank).collect(),
        later: blamers
            .iter()
            .filter(|(u, _)| u.call.seq > first.seq)
            .map(|(u, _)| (u.rank, u.call.seq))
            .collect(),
        call: first.clone(),
        timed_out: blamers.iter().any(|&(_, t)| t),
        own: unfinished
            .iter()
            .find(|u| u.rank == rank)
            .map(|u| u.call.clone()),
    })
}

/// The first call before `before`, among those every record still holds, that the ranks
/// made alike but whose records name different algorithms (a rank whose record names
/// none is left out of the comparison).
fn algorithm_split(dumps: &[Dump], before: u64) -> Option<AlgorithmSplit> {
    let first = dumps
        .iter()
        .map(|d| d.entries.first().map_or(u64::MAX, |e| e.seq))
        .max()?;
    let end = dumps.iter().map(|d| d.calls).min()?.min(before);
    (first..end).find_map(|seq| {
        let entries: Vec<(usize, &Entry)> = dumps
            .iter()
            .filter_map(|d| d.entry(seq).map(|e| (d.rank, e)))
            .collect();
        let (_, head) = entries.first()?;
        if head.is_point_to_point() || !entries.iter().all(|(_, e)| head.agrees_with(e)) {
            return None;
        }
        let mut groups: Vec<CallGroup> = Vec::new();
        for (rank, e) in &entries {
            let Some(algorithm) = &e.algorithm else {
                continue;
            };
            match groups.iter_mut().find(|g| &g.call == algorithm) {
                Some(g) => g.ranks.push(*rank),
                None => groups.push(CallGroup {
                    call: algorithm.clone(),
                    ranks: vec![*rank],
                }),
            }
        }
        if groups.len() < 2 {
            return None;
        }
        groups.sort_by_key(|g| std::cmp::Reverse(g.ranks.len()));
        Some(AlgorithmSplit {
            seq,
            call: head.describe(),
            algorithms: groups,
        })
    })
}

/// The first call, among those every record still holds, at which the ranks' calls do not
/// agree.
fn divergence(dumps: &[Dump]) -> Option<Divergence> {
    let first = dumps
        .iter()
        .map(|d| d.entries.first().map_or(u64::MAX, |e| e.seq))
        .max()?;
    let end = dumps.iter().map(|d| d.calls).min()?;
    (first..end).find_map(|seq| {
        let entries: Vec<(usize, &Entry)> = dumps
            .iter()
            .filter_map(|d| d.entry(seq).map(|e| (d.rank, e)))
            .collect();
        if entries.len() < 2 || agree(&entries) {
            return None;
        }
        // Group the ranks by the call they made, the largest group first.
        let mut groups: Vec<(&Entry, Vec<usize>)> = Vec::new();
        for (rank, e) in &entries {
            match groups.iter_mut().find(|(g, _)| g.agrees_with(e)) {
                Some((_, ranks)) => ranks.push(*rank),
                None => groups.push((e, vec![*rank])),
            }
        }
        groups.sort_by_key(|(_, ranks)| std::cmp::Reverse(ranks.len()));
        let odd = if groups.len() > 1 && groups[0].1.len() > groups[1].1.len() {
            groups[1..]
                .iter()
                .flat_map(|(_, r)| r.iter().copied())
                .collect()
        } else {
            Vec::new()
        };
        Some(Divergence {
            seq,
            point_to_point: entries.iter().any(|(_, e)| e.is_point_to_point()),
            calls: groups
                .into_iter()
                .map(|(e, ranks)| CallGroup {
                    call: e.describe(),
                    ranks,
                })
                .collect(),
            odd,
        })
    })
}

/// Whether the calls `entries` (rank, call) make a consistent k-th call: one collective
/// agreed by all, or sends and receives that pair up (a send from a to b with b's receive
/// from a of the same length).
fn agree(entries: &[(usize, &Entry)]) -> bool {
    if entries.iter().all(|(_, e)| e.is_point_to_point()) {
        return entries.iter().all(|(rank, e)| {
            let Some(peer) = e.peer else { return false };
            let Some((_, other)) = entries.iter().find(|(r, _)| *r == peer) else {
                return true; // the peer's record does not hold this call: nothing to say
            };
            let wanted = if e.op == "send" { "recv" } else { "send" };
            other.op == wanted && other.peer == Some(*rank) && other.bytes == e.bytes
        });
    }
    let (_, head) = entries[0];
    entries.iter().all(|(_, e)| head.agrees_with(e))
}

/// `rank 2` or `ranks 0, 1`.
fn rank_list(ranks: &[usize]) -> String {
    let list: Vec<String> = ranks.iter().map(usize::to_string).collect();
    match ranks.len() {
        1 => format!("rank {}", list[0]),
        _ => format!("ranks {}", list.join(", ")),
    }
}

impl Verdict {
    /// The verdict as text: the summary, then per rank where it stopped.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for line in &self.summary {
            let _ = writeln!(out, "{line}.");
        }
        let _ = writeln!(out, "\nper rank (of {}):", self.size);
        for r in &self.ranks {
            match &r.last {
                Some(last) => {
                    let _ = writeln!(
                        out,
                        "  rank {}: {} calls; the last, call {}: {}, {}",
                        r.rank, r.calls, last.seq, last.call, last.ending
                    );
                }
                None => {
                    let _ = writeln!(out, "  rank {}: no call recorded", r.rank);
                }
            }
        }
        for rank in &self.missing {
            let _ = writeln!(out, "  rank {rank}: no record");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(seq: u64, op: &str, count: u64, outcome: &str) -> Entry {
        Entry {
            seq,
            op: op.into(),
            dtype: Some("float32".into()),
            count: Some(count),
            bytes: 4 * count,
            peer: None,
            algorithm: Some("one_shot".into()),
            transport: "tcp".into(),
            start_ns: seq * 1000,
            end_ns: (outcome != "running").then_some(seq * 1000 + 500),
            outcome: outcome.into(),
            error: None,
        }
    }

    fn dump(rank: usize, entries: Vec<Entry>) -> Dump {
        Dump {
            rank,
            size: 3,
            backend: "native".into(),
            capacity: 16,
            formed_unix_ns: 0,
            taken_ns: 1_000_000,
            calls: entries.last().map_or(0, |e| e.seq + 1),
            entries,
        }
    }

    #[test]
    fn names_the_rank_whose_call_differs() {
        let usual = |rank| {
            dump(
                rank,
                vec![
                    entry(0, "all_sum", 10, "ok"),
                    entry(1, "all_sum", 10, "failed"),
                ],
            )
        };
        let odd = dump(
            2,
            vec![
                entry(0, "all_sum", 10, "ok"),
                entry(1, "all_sum", 20, "failed"),
            ],
        );
        let v = analyse(&[usual(0), usual(1), odd]);
        let div = v.divergence.clone().expect("a divergence");
        assert_eq!((div.seq, div.odd.as_slice()), (1, &[2][..]));
        assert_eq!(
            div.calls[0],
            CallGroup {
                call: "all_sum float32 x10".into(),
                ranks: vec![0, 1]
            }
        );
        assert!(
            v.summary[0].contains("call 1") && v.summary[0].contains("rank 2"),
            "{v:?}"
        );
        assert!(v.behind.is_empty() && v.ahead.is_empty());
    }

    #[test]
    fn names_the_rank_behind_and_the_call_it_never_started() {
        let waiting = |rank| {
            dump(
                rank,
                vec![
                    entry(0, "barrier", 0, "ok"),
                    entry(1, "all_sum", 4, "running"),
                ],
            )
        };
        let v = analyse(&[
            waiting(0),
            dump(1, vec![entry(0, "barrier", 0, "ok")]),
            waiting(2),
        ]);
        assert!(v.divergence.is_none(), "{v:?}");
        assert_eq!(v.behind.len(), 1);
        assert_eq!(
            (v.behind[0].rank, v.behind[0].calls, v.behind[0].usual),
            (1, 1, 2)
        );
        assert_eq!(v.behind[0].missed.as_deref(), Some("all_sum float32 x4"));
        assert_eq!(
            v.unfinished.iter().map(|u| u.rank).collect::<Vec<_>>(),
            [0, 2]
        );
        assert!(
            v.summary[0].starts_with("rank 1 is behind"),
            "{:?}",
            v.summary
        );
    }

    /// The records of a CI run on MLX's ring at P = 3 with rank 1 stopped: its neighbour
    /// rank 2 finished call 1, which rank 0 still waits in, and failed call 2; rank 0 is
    /// behind by a call only because it waits for rank 1, which is named first.
    #[test]
    fn the_rank_others_wait_for_comes_before_a_rank_behind_it() {
        let failed = |seq, kind: &str, peer| {
            let mut e = entry(seq, "all_sum", 4, "failed");
            e.error = Some(CallError {
                kind: kind.into(),
                fault: "PeerFailed".into(),
                peer: Some(peer),
            });
            e
        };
        let ok = |seq| entry(seq, "all_sum", 4, "ok");
        let v = analyse(&[
            dump(0, vec![ok(0), failed(1, "Timeout", 1)]),
            dump(1, vec![ok(0), ok(1), failed(2, "Timeout", 2)]),
            dump(2, vec![ok(0), ok(1), failed(2, "Lost", 1)]),
        ]);
        let b = v.blamed.clone().expect("a rank to blame");
        assert_eq!(
            (b.rank, b.by.as_slice(), b.call.seq, b.later.as_slice()),
            (1, &[0, 2][..], 1, &[(2, 2)][..])
        );
        assert!(
            v.summary[0].starts_with("rank 1 hung: ranks 0, 2 failed call 1 ")
                && v.summary[0].contains("(rank 2 in call 2)"),
            "{:?}",
            v.summary
        );
        assert!(
            v.summary[1].starts_with("rank 0 is behind")
                && v.summary[1].ends_with("its own last call failed on rank 1"),
            "{:?}",
            v.summary
        );
    }

    #[test]
    fn a_rank_without_a_record_is_named_when_the_others_blame_it() {
        let timed_out = |rank| {
            let mut last = entry(1, "all_sum", 4, "failed");
            last.error = Some(CallError {
                kind: "Timeout".into(),
                fault: "PeerFailed".into(),
                peer: Some(2),
            });
            dump(rank, vec![entry(0, "all_sum", 4, "ok"), last])
        };
        let v = analyse(&[timed_out(0), timed_out(1)]);
        assert_eq!(v.missing, [2]);
        // The most telling line first: the others' errors point at the rank without one.
        let first = &v.summary[0];
        assert!(
            first.contains("no record from rank 2") && first.contains("blame rank 2"),
            "{first}"
        );
        assert!(v.text().contains("rank 2: no record"), "{}", v.text());
    }

    #[test]
    fn names_the_rank_the_others_timed_out_on_though_it_went_on() {
        // Rank 1 was stopped after it finished call 1: the others failed in call 1 on it,
        // and once let go it started call 2 and failed there.
        let failed = |rank, seq, kind: &str, peer| {
            let mut last = entry(seq, "all_sum", 4, "failed");
            last.error = Some(CallError {
                kind: kind.into(),
                fault: "PeerFailed".into(),
                peer: Some(peer),
            });
            let mut entries: Vec<Entry> = (0..seq).map(|s| entry(s, "all_sum", 4, "ok")).collect();
            entries.push(last);
            dump(rank, entries)
        };
        let v = analyse(&[
            failed(0, 1, "Timeout", 1),
            failed(1, 2, "Timeout", 2),
            failed(2, 1, "Lost", 1),
        ]);
        let b = v.blamed.clone().expect("a rank to blame");
        assert_eq!(
            (b.rank, b.by.as_slice(), b.timed_out),
            (1, &[0, 2][..], true)
        );
        assert_eq!(b.own.map(|c| c.seq), Some(2));
        assert_eq!(
            v.summary[0],
            "rank 1 hung: ranks 0, 2 failed call 1 (all_sum float32 x4 by one_shot) waiting \
             for it; its own call 2 (all_sum float32 x4 by one_shot): failed (Timeout, \
             blaming rank 2)"
        );
        // Blame split evenly names no one.
        let v = analyse(&[failed(0, 1, "Timeout", 1), failed(1, 1, "Timeout", 0)]);
        assert!(v.blamed.is_none(), "{v:?}");
        // A mismatch is not a peer's failure.
        let mut mismatch = failed(0, 1, "Mismatch", 1);
        mismatch.entries[1].error.as_mut().unwrap().fault = "Misuse".into();
        let v = analyse(&[mismatch, failed(1, 1, "Lost", 0)]);
        assert_eq!(v.blamed.map(|b| (b.rank, b.timed_out)), Some((0, false)));
    }

    #[test]
    fn pairs_of_sends_and_receives_agree() {
        let mut send = entry(0, "send", 2, "ok");
        send.peer = Some(1);
        let mut recv = entry(0, "recv", 2, "ok");
        recv.peer = Some(0);
        let mut d0 = dump(0, vec![send]);
        let mut d1 = dump(1, vec![recv]);
        d0.size = 2;
        d1.size = 2;
        let v = analyse(&[d0, d1]);
        assert!(v.divergence.is_none(), "{v:?}");
        assert!(v.summary[0].contains("nothing wrong"), "{:?}", v.summary);
    }

    #[test]
    fn compares_only_the_calls_every_record_holds() {
        // Rank 0 kept calls 5..8 only; rank 1 differs at call 2, which rank 0 no longer
        // holds, and agrees from 5 on.
        let d0 = dump(0, (5..8).map(|s| entry(s, "all_sum", 1, "ok")).collect());
        let mut e1: Vec<Entry> = (0..8).map(|s| entry(s, "all_sum", 1, "ok")).collect();
        e1[2].count = Some(9);
        e1[2].bytes = 36;
        let v = analyse(&[d0, dump(1, e1)]);
        assert!(v.divergence.is_none(), "{v:?}");
    }

    #[test]
    fn names_the_ranks_whose_algorithm_differs_for_a_call_made_alike() {
        let calls = |rank, second: &str| {
            let mut e = vec![entry(0, "all_sum", 4, "ok"), entry(1, "all_sum", 4, "ok")];
            e[1].algorithm = Some(second.into());
            dump(rank, e)
        };
        let v = analyse(&[calls(0, "ring"), calls(1, "one_shot"), calls(2, "ring")]);
        assert!(v.divergence.is_none(), "{v:?}");
        let split = v.algorithms.clone().expect("the algorithms differ");
        assert_eq!((split.seq, split.call.as_str()), (1, "all_sum float32 x4"));
        assert_eq!(
            split.algorithms,
            [
                CallGroup {
                    call: "ring".into(),
                    ranks: vec![0, 2]
                },
                CallGroup {
                    call: "one_shot".into(),
                    ranks: vec![1]
                }
            ]
        );
        assert_eq!(
            v.summary[0],
            "the ranks ran call 1 (all_sum float32 x4) by different algorithms: ranks 0, 2 \
             by ring; rank 1 by one_shot"
        );
        // A record that names no algorithm (a backend that does not say, or one written
        // before the recorder named them) differs from none.
        let mut quiet = calls(1, "one_shot");
        quiet.entries[1].algorithm = None;
        let v = analyse(&[calls(0, "ring"), quiet]);
        assert!(v.algorithms.is_none(), "{v:?}");
        assert!(
            v.text().contains("call 1: all_sum float32 x4 by ring, ok"),
            "{}",
            v.text()
        );
    }

    #[test]
    fn a_record_without_algorithms_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let mut json = serde_json::to_value(dump(0, vec![entry(0, "barrier", 0, "ok")])).unwrap();
        json["entries"][0]
            .as_object_mut()
            .unwrap()
            .remove("algorithm");
        let path = dir.path().join("flight-rank0.json");
        std::fs::write(&path, json.to_string()).unwrap();
        let dumps = read(&[path]).unwrap();
        assert_eq!(dumps[0].entries[0].algorithm, None);
    }

    #[test]
    fn record_files_are_told_from_traces() {
        assert!(is_record(Path::new("/x/flight-rank12.json")));
        assert!(!is_record(Path::new("/x/flight-rank12.trace.json")));
        assert!(!is_record(Path::new("/x/flight-rank.json")));
    }
}
