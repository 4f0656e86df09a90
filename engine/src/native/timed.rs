//! The native wire's exchanges under a simulated clock: every rank runs the real
//! [`Exchange`] of an algorithm, and the messages it writes travel over links priced by
//! [`LinkCost`]. This predicts group sizes no machine here has (P = 32 to 1024) from the
//! schedules themselves, where [`plan`](crate::plan)'s formula counts rounds, messages and
//! bytes of the busiest rank.
//!
//! The clock, per rank:
//! - Sending a message costs the sender [`LinkCost::cpu_us`] of its own time; its bytes then
//!   leave over the sender's link one message after another at
//!   [`LinkCost::bytes_per_us`], and arrive [`LinkCost::alpha_us`] after their last byte
//!   left. A rank's messages of one round therefore queue behind each other on its link,
//!   which the formula does not see.
//! - A rank takes bytes once they have arrived; a round that completes costs its fold's bytes
//!   at [`LinkCost::fold_bytes_per_us`].
//! - A rank that waits does so until the next message to it arrives: no spinning, no
//!   wake-up cost.
//!
//! A collective's simulated time is the last rank's finish. The ring all-reduce is MLX's
//! pipelined ring, not an [`Exchange`], so it is not simulated: its time is the formula's.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, VecDeque};

use super::header::{Call, Kind};
use super::protocol::{Caller, Exchange, Memory, Routes};
use crate::comm::algorithm::{
    self, AllGather, AllReduce, Barrier, Broadcast, Collective, Link, LinkCost, Shape,
};
use crate::element::DType;
use crate::error::{Error, Phase, Result};
use crate::reduce::ReduceOp;

/// The most ranks [`simulate`] runs.
pub const MAX_SIMULATED_RANKS: usize = 1024;

/// The most bytes of buffers (every rank's array, input and staging) one simulated
/// algorithm may take; a larger one is reported as not simulated.
const MEMORY_BUDGET: usize = 2 << 30;

/// The most messages one simulated algorithm may send in one round, all ranks together.
/// A rank looks at every message of its round each time bytes reach it, so a round of
/// P - 1 messages per rank costs about P³ steps: the direct algorithms are simulated up
/// to P = 128 (a few seconds), the log-round ones at every size.
const FAN_OUT_BUDGET: usize = 1 << 14;

/// One algorithm of a collective, priced both ways.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Simulated {
    /// The algorithm, named as [`plan`](crate::plan) names it.
    pub algorithm: &'static str,
    /// Whether [`plan`](crate::plan) chooses it.
    pub chosen: bool,
    /// The formula's time (µs), as [`plan`](crate::plan) prices it.
    pub predicted_us: f64,
    /// The simulated clock's time (µs), or why it was not simulated.
    pub simulated_us: std::result::Result<f64, &'static str>,
}

/// Every algorithm the native wire has for `collective` over `bytes` among `ranks` ranks on
/// `link`, each with the formula's time and the simulated clock's (see the module docs).
/// An all-reduce is of float32 elements (`bytes / 4` of them, at least one), an all_gather's
/// `bytes` are its whole output (every rank's block, at least one byte each), a broadcast's
/// root is rank 0.
///
/// # Errors
///
/// [`Error::InvalidArgument`] for 0 ranks or more than [`MAX_SIMULATED_RANKS`];
/// [`Error::Bug`] if a schedule stops with ranks still waiting.
///
/// # Examples
///
/// ```
/// use nuvec_distributed_engine::{Collective, Link, simulate};
///
/// let rows = simulate(Collective::AllReduce, Link::Loopback, 32, 4)?;
/// let doubling = rows.iter().find(|r| r.algorithm == "recursive_doubling").unwrap();
/// let one_shot = rows.iter().find(|r| r.algorithm == "one_shot").unwrap();
/// // Five rounds of one message beat one round of 31 messages queued on each rank's link.
/// assert!(doubling.simulated_us.unwrap() < one_shot.simulated_us.unwrap());
/// # Ok::<(), nuvec_distributed_engine::Error>(())
/// ```
pub fn simulate(
    collective: Collective,
    link: Link,
    ranks: usize,
    bytes: u64,
) -> Result<Vec<Simulated>> {
    if ranks == 0 || ranks > MAX_SIMULATED_RANKS {
        return Err(Error::InvalidArgument(format!(
            "simulate: {ranks} ranks (from 1 to {MAX_SIMULATED_RANKS})"
        )));
    }
    let bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
    let chosen = algorithm::plan(collective, link, ranks, bytes as u64).algorithm;
    let cost = link.cost();
    let mut rows = Vec::new();
    let mut row = |name: &'static str, shape: Shape, setup: Option<Setup>| -> Result<()> {
        let simulated_us = match setup {
            None => Err("not an exchange: MLX's pipelined ring"),
            Some(setup) => run(ranks, cost, setup)?,
        };
        rows.push(Simulated {
            algorithm: name,
            chosen: name == chosen,
            predicted_us: shape.predict_us(cost),
            simulated_us,
        });
        Ok(())
    };
    let nf = bytes as f64;
    match collective {
        Collective::AllReduce => {
            let elems = (bytes / 4).max(1);
            let reduce = (ReduceOp::Sum, DType::F32);
            let call = Call::group(1, Kind::AllReduce(reduce.0, reduce.1), elems as u64);
            let len = elems * 4;
            for a in [
                AllReduce::OneShot,
                AllReduce::ScatterGather,
                AllReduce::RecursiveDoubling,
                AllReduce::HalvingDoubling,
                AllReduce::Ring,
            ] {
                let shape = algorithm::all_reduce_shape(a, link, ranks, nf);
                // MLX's ring is not an exchange: `row` is given no setup for it.
                let start = |x: &mut Exchange, r: usize| {
                    x.all_reduce(Caller::new(&Direct, r, ranks, &call), a, reduce, len);
                };
                // The algorithms that give every rank a block need an element per rank.
                let blocks = matches!(a, AllReduce::ScatterGather | AllReduce::HalvingDoubling);
                if blocks && elems < ranks {
                    continue;
                }
                let setup = Setup {
                    data: len,
                    input: 0,
                    start: &start,
                };
                row(a.into(), shape, (a != AllReduce::Ring).then_some(setup))?;
            }
        }
        Collective::AllGather => {
            let block = (bytes / ranks).max(1);
            let call = Call::group(1, Kind::AllGather, block as u64);
            for a in [AllGather::Direct, AllGather::RecursiveDoubling] {
                let shape = algorithm::all_gather_shape(a, ranks, nf);
                let setup = |x: &mut Exchange, r: usize| match a {
                    AllGather::Direct => x.all_gather(Caller::new(&Direct, r, ranks, &call), block),
                    AllGather::RecursiveDoubling => {
                        x.all_gather_doubling(Caller::new(&Direct, r, ranks, &call), block);
                    }
                };
                let setup = Setup {
                    data: block * ranks,
                    input: block,
                    start: &setup,
                };
                row(a.into(), shape, Some(setup))?;
            }
        }
        Collective::Barrier => {
            let call = Call::group(1, Kind::Barrier, 0);
            for a in [Barrier::Direct, Barrier::RecursiveDoubling] {
                let shape = algorithm::barrier_shape(a, ranks);
                let setup = |x: &mut Exchange, r: usize| match a {
                    Barrier::Direct => x.headers(Caller::new(&Direct, r, ranks, &call)),
                    Barrier::RecursiveDoubling => {
                        x.barrier_doubling(Caller::new(&Direct, r, ranks, &call))
                    }
                };
                let setup = Setup {
                    data: 0,
                    input: 0,
                    start: &setup,
                };
                row(a.into(), shape, Some(setup))?;
            }
        }
        Collective::Broadcast => {
            let call = Call::group(1, Kind::Broadcast(0), bytes as u64);
            for a in [Broadcast::Direct, Broadcast::ScatterGather] {
                if a == Broadcast::ScatterGather && ranks < 3 {
                    continue;
                }
                let shape = algorithm::broadcast_shape(a, ranks, nf);
                let setup = |x: &mut Exchange, r: usize| match a {
                    Broadcast::Direct => {
                        x.broadcast_direct(Caller::new(&Direct, r, ranks, &call), 0, bytes)
                    }
                    Broadcast::ScatterGather => {
                        x.broadcast_scatter(Caller::new(&Direct, r, ranks, &call), 0, bytes);
                    }
                };
                let setup = Setup {
                    data: bytes,
                    input: 0,
                    start: &setup,
                };
                row(a.into(), shape, Some(setup))?;
            }
        }
    }
    Ok(rows)
}

/// Every pair of ranks has one connection each way, numbered by the peer.
pub(crate) struct Direct;

impl Routes for Direct {
    fn send_conn(&self, peer: usize) -> usize {
        peer
    }
    fn recv_conn(&self, peer: usize) -> usize {
        peer
    }
}

/// How to start one algorithm on a rank, and its buffers' sizes.
struct Setup<'a> {
    data: usize,
    input: usize,
    start: &'a dyn Fn(&mut Exchange, usize),
}

/// A time on the simulated clock (µs), ordered for the event queue.
#[derive(Clone, Copy, Debug, PartialEq)]
struct At(f64);

impl Eq for At {}

impl PartialOrd for At {
    fn partial_cmp(&self, other: &At) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for At {
    fn cmp(&self, other: &At) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// Bytes on their way from one rank to another, whole from `at` on.
struct Segment {
    at: f64,
    bytes: Vec<u8>,
    taken: usize,
}

/// What is on its way between every ordered pair of ranks.
struct Wires {
    ranks: usize,
    /// From rank `f` to rank `t` at `f * ranks + t`.
    queues: Vec<VecDeque<Segment>>,
}

impl Wires {
    fn queue(&mut self, from: usize, to: usize) -> &mut VecDeque<Segment> {
        &mut self.queues[from * self.ranks + to]
    }
}

/// One rank of the simulation.
struct Rank {
    exchange: Exchange,
    data: Vec<u8>,
    input: Vec<u8>,
    stage: Vec<u8>,
    /// Its own clock: when it can next act.
    now: f64,
    /// When its link has sent every byte given to it so far.
    link_free: f64,
    /// When it finished, once it has.
    finished: Option<f64>,
}

/// Runs `setup` on every one of `ranks` ranks over links costing `cost` and returns the
/// last rank's finish (µs), or why it was not run.
fn run(
    ranks: usize,
    cost: LinkCost,
    setup: Setup<'_>,
) -> Result<std::result::Result<f64, &'static str>> {
    let mut states = Vec::with_capacity(ranks);
    let mut memory = 0usize;
    let mut fanned = 0usize;
    for r in 0..ranks {
        let mut exchange = Exchange::default();
        (setup.start)(&mut exchange, r);
        let staging = exchange.staging();
        memory = memory.saturating_add(setup.data + setup.input + staging);
        fanned = fanned.saturating_add(exchange.fan_out());
        if memory > MEMORY_BUDGET {
            return Ok(Err("its buffers would take more than 2 GiB"));
        }
        if fanned > FAN_OUT_BUDGET {
            return Ok(Err("more than 16384 messages in one round"));
        }
        states.push(Rank {
            exchange,
            data: vec![0; setup.data],
            input: vec![0; setup.input],
            stage: vec![0; staging],
            now: 0.0,
            link_free: 0.0,
            finished: None,
        });
    }
    let mut wires = Wires {
        ranks,
        queues: (0..ranks * ranks).map(|_| VecDeque::new()).collect(),
    };
    let mut events: BinaryHeap<Reverse<(At, usize)>> =
        (0..ranks).map(|r| Reverse((At(0.0), r))).collect();
    while let Some(Reverse((At(at), r))) = events.pop() {
        let s = &mut states[r];
        if s.finished.is_some() {
            continue;
        }
        s.now = s.now.max(at);
        let woken = step(r, s, cost, &mut wires)?;
        for (peer, at) in woken {
            let when = states[peer].now.max(at);
            events.push(Reverse((At(when), peer)));
        }
        let s = &mut states[r];
        if s.exchange.is_finished() {
            s.finished = Some(s.now);
        } else if let Some(next) = next_arrival(r, s, &wires)
            && next > s.now
        {
            events.push(Reverse((At(next), r)));
        }
    }
    let mut last = 0.0f64;
    for (r, s) in states.iter().enumerate() {
        match s.finished {
            Some(t) => last = last.max(t),
            None => {
                return Err(Error::Bug {
                    context: Phase::AllSum,
                    what: format!(
                        "simulating {ranks} ranks: rank {r} waits for a message no rank sends"
                    ),
                });
            }
        }
    }
    Ok(Ok(last))
}

/// Runs rank `r` at its clock until it can do nothing more: writes what it can, takes
/// every byte that has arrived, folds the rounds that complete. Returns the ranks it sent
/// to, with when their message arrives.
fn step(r: usize, s: &mut Rank, cost: LinkCost, wires: &mut Wires) -> Result<Vec<(usize, f64)>> {
    let mut woken = Vec::new();
    loop {
        let mut moved = false;
        let mut mem = Memory {
            data: &mut s.data,
            input: &s.input,
            stage: &mut s.stage,
        };
        for i in 0..s.exchange.outs() {
            let peer = s.exchange.out_peer(i);
            if let Some((_, head, body)) = s.exchange.poll_transmit(i, &mem) {
                let bytes = [head, body].concat();
                s.now += cost.cpu_us;
                let start = s.now.max(s.link_free);
                s.link_free = start + bytes.len() as f64 / cost.bytes_per_us;
                let at = s.link_free + cost.alpha_us;
                let n = bytes.len();
                wires.queue(r, peer).push_back(Segment {
                    at,
                    bytes,
                    taken: 0,
                });
                s.exchange.handle_sent(i, n);
                woken.push((peer, at));
                moved = true;
            }
        }
        for i in 0..s.exchange.ins() {
            let peer = s.exchange.in_peer(i);
            let queue = wires.queue(peer, r);
            while let Some(seg) = queue.front_mut()
                && seg.at <= s.now
            {
                let Some((_, target)) = s.exchange.poll_receive(i, &mut mem) else {
                    break;
                };
                let n = target.len().min(seg.bytes.len() - seg.taken);
                target[..n].copy_from_slice(&seg.bytes[seg.taken..seg.taken + n]);
                seg.taken += n;
                if seg.taken == seg.bytes.len() {
                    queue.pop_front();
                }
                s.exchange.handle_received(i, n, &mem)?;
                moved = true;
            }
        }
        let before = s.exchange.round();
        if s.exchange.complete(&mut mem) {
            let folded: usize = (before..s.exchange.round())
                .map(|k| s.exchange.fold_bytes(k))
                .sum();
            s.now += folded as f64 / cost.fold_bytes_per_us;
            moved = true;
        }
        if !moved || s.exchange.is_finished() {
            return Ok(woken);
        }
    }
}

/// When the next bytes rank `r` waits for arrive, if any are on their way.
fn next_arrival(r: usize, s: &Rank, wires: &Wires) -> Option<f64> {
    (0..s.exchange.ins())
        .filter_map(|i| {
            let from = s.exchange.in_peer(i);
            wires.queues[from * wires.ranks + r].front().map(|g| g.at)
        })
        .min_by(f64::total_cmp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::native::header::HEADER_BYTES;

    fn simulated(rows: &[Simulated], name: &str) -> f64 {
        let row = rows.iter().find(|r| r.algorithm == name).unwrap();
        row.simulated_us.unwrap()
    }

    /// Where the schedule has no queueing, the clock and the formula agree: one message
    /// each way at P = 2 costs α + CPU + bytes + fold in both.
    #[test]
    fn at_two_ranks_the_one_shot_is_the_formula() {
        for link in Link::ALL {
            for bytes in [4u64, 8192, 1 << 20] {
                let rows = simulate(Collective::AllReduce, link, 2, bytes).unwrap();
                let row = rows.iter().find(|r| r.algorithm == "one_shot").unwrap();
                // The simulated message carries its header too.
                let header = HEADER_BYTES as f64 / link.cost().bytes_per_us;
                let got = row.simulated_us.unwrap();
                assert!(
                    (got - row.predicted_us - header).abs() < 1e-9,
                    "{link} {bytes}: {got} against {}",
                    row.predicted_us
                );
            }
        }
    }

    /// The one-shot's P - 1 messages queue on the sender's link and CPU: past a few ranks
    /// recursive doubling's log2 P rounds win a small all-reduce, in the clock as in the
    /// formula; and the barrier's rounds are log2 P hops, not P - 1.
    #[test]
    fn log_rounds_win_small_collectives_at_many_ranks() {
        for ranks in [16, 32, 100, 128] {
            let rows = simulate(Collective::AllReduce, Link::Loopback, ranks, 4).unwrap();
            assert!(
                simulated(&rows, "recursive_doubling") < simulated(&rows, "one_shot"),
                "{ranks}: {rows:?}"
            );
            let rows = simulate(Collective::Barrier, Link::Loopback, ranks, 0).unwrap();
            assert!(
                simulated(&rows, "recursive_doubling") < simulated(&rows, "direct"),
                "{ranks}: {rows:?}"
            );
        }
    }

    /// Every algorithm of every collective finishes on every rank (a schedule that left a
    /// rank waiting would be an error), at sizes that are and are not powers of two.
    #[test]
    fn every_schedule_finishes() {
        for ranks in [1, 2, 3, 5, 8, 13, 64] {
            for collective in Collective::ALL {
                for bytes in [0u64, 4, 100, 65536] {
                    let rows = simulate(collective, Link::Shm, ranks, bytes).unwrap();
                    for row in &rows {
                        if row.algorithm != "ring" {
                            let t = row.simulated_us.unwrap();
                            assert!(t.is_finite() && t >= 0.0, "{collective} {ranks}: {row:?}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn rank_counts_out_of_range_are_refused() {
        for ranks in [0, MAX_SIMULATED_RANKS + 1] {
            let e = simulate(Collective::Barrier, Link::Loopback, ranks, 0).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
        }
    }

    /// Past the budgets an algorithm is reported as not simulated, saying why, not run.
    #[test]
    fn the_direct_algorithms_past_the_message_budget_are_not_run() {
        let rows = simulate(Collective::AllReduce, Link::Loopback, 1024, 4).unwrap();
        assert!(simulated(&rows, "recursive_doubling") > 0.0);
        let one_shot = rows.iter().find(|r| r.algorithm == "one_shot").unwrap();
        assert_eq!(
            one_shot.simulated_us,
            Err("more than 16384 messages in one round")
        );
    }
}
