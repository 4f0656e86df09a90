//! The one algorithm table of the native wire: which algorithm a collective takes, by
//! collective, bytes, ranks and link kind, with the measurements each crossing rests on.
//!
//! MLX's wire and JACCL take MLX's own choices (`comm::ring::schedule`, `jaccl`): those are
//! part of their wire, which a rank of MLX must be able to follow, so they are not chosen
//! here.
//!
//! | collective | link | ranks | bytes | algorithm |
//! |---|---|---|---|---|
//! | all-reduce | TCP | 2 | fewer elements than ranks, or up to [`TCP_ONE_SHOT_MAX_P2`] | [`AllReduce::OneShot`] |
//! | all-reduce | TCP | 3 | fewer elements than ranks, or up to [`TCP_DOUBLING_MAX_P3`] | [`AllReduce::RecursiveDoubling`] |
//! | all-reduce | TCP | 2, 3 | below [`TCP_RING_MIN`] | [`AllReduce::ScatterGather`] |
//! | all-reduce | TCP | 4 to 12 | fewer elements than ranks, or up to [`TCP_ONE_SHOT_MAX`] | [`AllReduce::RecursiveDoubling`] |
//! | all-reduce | TCP | 4 to 12 | below [`TCP_RING_MIN`] | [`AllReduce::HalvingDoubling`] |
//! | all-reduce | TCP | up to 12 | from [`TCP_RING_MIN`] | [`AllReduce::Ring`] |
//! | all-reduce | shared memory | 2 | any | [`AllReduce::OneShot`] |
//! | all-reduce | shared memory | 3 | up to [`SHM_ONE_SHOT_MAX`] | [`AllReduce::OneShot`] |
//! | all-reduce | shared memory | 3 | larger | [`AllReduce::ScatterGather`] |
//! | broadcast | TCP | 2 | any | [`Broadcast::Direct`] |
//! | broadcast | TCP | 3 to 12 | up to [`BROADCAST_DIRECT_MAX`] | [`Broadcast::Direct`] |
//! | broadcast | TCP | 3 to 12 | larger | [`Broadcast::ScatterGather`] |
//! | all_gather | TCP | up to 4 | any | [`AllGather::Direct`] |
//! | all_gather | TCP | 5 to 12 | output up to [`TCP_RING_MIN`] | [`AllGather::RecursiveDoubling`] |
//! | all_gather | TCP | 5 to 12 | larger | [`AllGather::Direct`] |
//! | barrier | TCP | 2 | - | [`Barrier::Direct`] |
//! | barrier | TCP | 3 to 12 | - | [`Barrier::RecursiveDoubling`] |
//! | any | TCP | 13 or more | any | the cost model's cheapest, priced as [`Link::Loopback`] |
//! | all-reduce | shared memory | 4 or more | any | the cost model's cheapest, priced as [`Link::Shm`] |
//!
//! The rows up to 12 ranks over TCP ([`TCP_MEASURED_MAX_RANKS`]) and 3 in shared memory
//! ([`SHM_MEASURED_MAX_RANKS`]) are the measured ones (the sections below); past them the
//! cost model ([`plan`], the last sections) decides. The model's argmin would change
//! measured rows (see "Where the model and the measurements part"), so they stay as they
//! are.
//!
//! A hierarchical group's leaders reduce across hosts over TCP by the TCP rows, with their
//! own count of ranks (the hosts); their exchange has no pipelined ring and no log-round
//! schedules, so they take the direct algorithms instead ([`leaders_all_reduce`]).
//! sum_scatter and all_to_all have one algorithm each
//! (every block straight to its rank over TCP, one step per chunk in shared memory), and
//! so does send/recv; shared memory and the hierarchical groups have their own
//! all_gather. The check of calls before a ring all-reduce is a barrier, by the barrier's
//! row.
//!
//! # Log rounds over TCP
//!
//! The direct algorithms send P - 1 messages per rank per round (the one-shot its whole
//! vector each time), so their latency grows linearly with P; Open MPI's recursive doubling
//! and halving-doubling send one message in each of log2 P rounds. On this VM, idle, the
//! fewer messages already win at three ranks (the next table): the small all-reduces take
//! recursive doubling from P = 3, the middling ones halving-doubling from
//! [`LOG_ROUNDS_MIN_RANKS`] (at P = 3 halving-doubling hands the whole vector in and out,
//! and the direct reduce-scatter + all-gather stays ahead: 256 KiB, 116 against 160 µs),
//! and the barrier recursive doubling from [`BARRIER_DOUBLING_MIN_RANKS`], as the 4 B
//! all-reduce does, whose messages are the barrier's headers with 4 bytes behind them
//! (`native::protocol` has them, with the order they fold in). The all_gather was measured
//! only past four ranks, and takes recursive doubling from [`ALL_GATHER_DOUBLING_MIN_RANKS`]
//! up to [`TCP_RING_MIN`] of output. Recursive doubling's all_gather sends the bytes of the
//! direct one in fewer messages, but for P not a power of two the ranks that took a block
//! in send the whole output back: past a MiB of output (an estimate, the all-reduce's ring
//! crossing) the direct one's P - 1 concurrent messages are kept.
//!
//! The all-reduce at P = 3 and 4, by `native::tests::measure_the_algorithms` on the 2-core
//! VM idle (the run the model's constants below come from: `NUVEC_MEASURE_RANKS=2,3,4
//! cargo test --release -p nuvec-distributed-engine --lib measure_the_algorithms --
//! --ignored --nocapture`, one run, the median of each rank's times; the ranks outnumber
//! the cores at P = 3 and 4), in µs, one-shot / direct / recursive doubling /
//! halving-doubling / ring (bold: what the table takes):
//!
//! | bytes | P = 3 | P = 4 |
//! |---|---|---|
//! | 4 B | 15.4 / 15.3 / **10.9** / 12.8 / 15.7 | 27.5 / 27.2 / **15.4** / 23.5 / 27.5 |
//! | 8 KiB | 23.9 / 34.5 / **16.5** / 19.5 / 54.8 | 35.9 / 42.5 / **21.5** / 36.9 / 71.3 |
//! | 64 KiB | 79.1 / 54.8 / **37.2** / 41.2 / 60.9 | 87.3 / 82.4 / 80.6 / **58.9** / 107 |
//! | 256 KiB | 387 / **116** / 159 / 160 / 128 | 483 / 212 / 168 / **137** / 157 |
//! | 1 MiB | 1050 / 695 / 1244 / 770 / **998** | 2069 / 939 / 759 / 1122 / **937** |
//! | 4 MiB | 7073 / 4281 / 4763 / 4588 / **4303** | 12382 / 4932 / 7475 / 4647 / **4585** |
//! | 16 MiB | 36783 / 19617 / 21026 / 20789 / **15484** | 63880 / 29001 / 39318 / 22943 / **21537** |
//!
//! Where the table departs from this run: at 1 MiB, P = 3, the direct algorithm was ahead
//! of the ring (695 against 998 µs) and level at 4 MiB, where the loaded run of the last
//! section put the ring ahead from 1 MiB at every P; [`TCP_RING_MIN`] stays one crossing
//! until an idle re-measurement says otherwise. At 1 MiB, P = 4, recursive doubling's
//! 759 µs is out of line with its 256 KiB and 4 MiB figures (behind halving-doubling and
//! the ring at both), so the ring is kept. The crossing from recursive doubling to
//! halving-doubling at P = 4 lies between 8 and 64 KiB, and the table puts it where it
//! does for more ranks, at [`TCP_ONE_SHOT_MAX`] (16 KiB); at P = 3, recursive doubling's
//! last lead lies between 64 and 256 KiB ([`TCP_DOUBLING_MAX_P3`]: 64 KiB).
//!
//! The all-reduce's crossings past four ranks, by `native::tests::measure_the_algorithms`
//! (P threads on loopback on the 2-core VM at load average 7 to 9, one run each, so only
//! the order is worth anything), in µs, one-shot / direct /
//! recursive doubling / halving-doubling / ring:
//!
//! | bytes | P = 5 | P = 6 | P = 8 | P = 12 |
//! |---|---|---|---|---|
//! | 8 KiB | 63 / 85 / **46** / 51 / 116 | 91 / 139 / **48** / 63 / 189 | 133 / 198 / **69** / 111 / 320 | 501 / 593 / **125** / 178 / 642 |
//! | 64 KiB | 263 / 109 / 89 / **88** / 151 | 467 / 185 / 131 / **115** / 233 | 878 / 320 / 327 / **184** / 378 | 2571 / 630 / 466 / **351** / 773 |
//! | 256 KiB | 1276 / 387 / 422 / **274** / 263 | 2017 / 555 / 575 / **413** / 233 | 3632 / 740 / 1986 / **624** / 642 | 14078 / 2229 / 1579 / **1091** / 1401 |
//! | 1 MiB | 11209 / 1661 / 2882 / 2254 / **1168** | 21776 / 2571 / 2917 / 2095 / **2124** | 28426 / 3786 / 9148 / 3199 / **2455** | 84594 / 7776 / 6629 / 16400 / **3666** |
//!
//! (bold: what the table takes). At 4 B, P = 8: 106 / 98 / 47 / 53 µs; P = 12: 228 / 266 /
//! 99 / 120 µs. At 256 KiB the ring was level with halving-doubling at P = 5 and ahead at
//! P = 6 (and P = 12's 1 MiB halving-doubling figure is out of line with its others):
//! re-measure on idle machines before moving [`TCP_RING_MIN`] past four ranks.
//!
//! # Where the P = 2 rows and the ring's crossing come from
//!
//! `native::tests::measure_the_algorithms`: the median of each rank's all_sum f32 times,
//! P threads on loopback in one process, on a 2-core VM whose load average was 8.5, so only
//! the crossings are worth anything, not the times (the rows of P = 3 and 4 below the
//! ring's sizes rest on the idle run above instead):
//!
//! | bytes | P = 2: one-shot / direct / ring | P = 3 | P = 4 |
//! |---|---|---|---|
//! | 8 KiB | 52 / 62 / 95 µs | 88 / 90 / 160 µs | 152 / 205 / 289 µs |
//! | 64 KiB | 96 / 72 / 103 µs | 193 / 139 / 193 µs | 375 / 305 / 397 µs |
//! | 256 KiB | 201 / 152 / 247 µs | 531 / 329 / 351 µs | 3250 / 545 / 733 µs |
//! | 1 MiB | 3.3 / 4.1 / 0.6 ms | 4.6 / 1.5 / 1.1 ms | 12.5 / 2.7 / 1.5 ms |
//! | 16 MiB | 45 / 41 / 36 ms | 171 / 55 / 49 ms | 323 / 116 / 136 ms |
//!
//! Re-measure on an idle machine (and across hosts) before trusting them further.
//!
//! The link is a [`Transport`]: the native wire's are [`Transport::Tcp`] and
//! [`Transport::SharedMemory`]; any other takes the TCP rows, message passing being what
//! they measure.
//!
//! # Where the shared-memory crossings come from
//!
//! At P = 2 both schedules move the same bytes between ranks, and the one-shot saves the
//! copy of the folded share back into shared memory and the second step of every chunk. At
//! P >= 3 the one-shot folds P - 1 whole chunks per rank instead of P - 1 shares, and
//! loses. Measured by `native::shm_tests::measure_large_all_sum` (64 MiB f32, in-process
//! threads, both schedules alternating in one run, on a 2-core VM at load average 7 to 10,
//! so only the order is worth anything): P = 2, three runs: one-shot 23.8 / 27.6 / 34.3 ms
//! (2.81 / 2.43 / 1.96 GB/s bus), by shares 30.6 / 31.6 / 45.8 ms (2.20 / 2.12 / 1.47
//! GB/s); P = 3: one-shot 66.6 ms (1.34 GB/s), by shares 52.0 ms (1.72 GB/s).
//!
//! # The cost model
//!
//! Past the measured rows, an algorithm costs the busiest rank
//! `rounds · α + messages · CPU + bytes / β + folded / γ` ([`LinkCost`]): the rounds of
//! messages one after another (a round's messages travel at once), the messages it sends
//! (a header alone counts), the bytes on its path and the bytes it folds. Per algorithm,
//! with `L = log2 pof2` (`pof2` the largest power of two not above P), `x = 2` for P not a
//! power of two (the hand-in and hand-out rounds) and 0 otherwise, `n` the bytes:
//!
//! | algorithm | rounds | messages per rank | bytes | folded |
//! |---|---|---|---|---|
//! | one-shot | 1 | P - 1 | (P - 1) n | (P - 1) n |
//! | scatter-gather | 2 | 2 (P - 1) | 2 (P - 1) n / P (shared memory: + n / P, the folded share copied back) | (P - 1) n / P |
//! | ring | barrier's + 2 (P - 1) | barrier's + 2 (P - 1) | 2 (P - 1) n / P | none: a chunk folds while the next is on the wire |
//! | recursive doubling | L + x | L + x | (L + x) n | L n (+ n) |
//! | halving-doubling | 2 L + x | 2 L + x | 2 (pof2 - 1) n / pof2 + x n | (pof2 - 1) n / pof2 (+ n) |
//! | barrier, direct | 1 | P - 1 | - | - |
//! | barrier, recursive doubling | L + x | L + x | - | - |
//! | all_gather, direct | 1 | P - 1 | (P - 1) n / P | - |
//! | all_gather, recursive doubling | L + x | L + x | (pof2 - 1) n / pof2 (+ n / P + n) | - |
//! | broadcast, direct | 1 | P - 1 | (P - 1) n | - |
//! | broadcast, scatter-gather | 2 | 2 P - 3 | n + (P - 2) n / (P - 1) | - |
//!
//! (all_gather's `n`: its whole output; "(+ ...)": for P not a power of two.) With fewer
//! elements than ranks only the one-shot and recursive doubling are candidates (the others
//! need an element per rank); in shared memory, the one-shot and scatter-gather. The
//! cheapest wins, the first in the order above of equals; the choice depends only on the
//! link kind, the ranks and the bytes, which every rank of a group agrees on, so every
//! rank takes the same algorithm.
//!
//! # The model's constants
//!
//! | link | α (µs per round) | CPU (µs per message) | β (GB/s) | γ, folding (GB/s) |
//! |---|---|---|---|---|
//! | [`Link::Loopback`] ([`LOOPBACK_COST`]) | 1.0 | 2.0 | 2.5 | 4.4 |
//! | [`Link::Shm`] ([`SHM_COST`]) | 0.2 | 0.15 | 10 | 10 |
//! | [`Link::Network`] ([`NETWORK_COST`]) | 40 | 2.0 | 1.1 | 4.4 |
//!
//! Loopback and shared memory: P = 2 on the 2-core VM of the tables above, idle (load
//! below 0.05 CPUs), from
//! `NUVEC_MEASURE_RANKS=2,3,4 cargo test --release -p nuvec-distributed-engine --lib
//! measure_the_algorithms -- --ignored --nocapture` and `nuvec bench -n 2,3 --wire native
//! --sizes 4,8K,1M,64M` (over TCP with `NUVEC_DISTRIBUTED_SHM=0`, five runs each). Over
//! TCP, α + CPU = 3 µs is the 4 B one-shot (2.95 µs; 2.92 to 3.18 in the bench); β is the
//! 4 MiB ring's (1674 µs), γ the 4 MiB one-shot's excess over it (2618 µs: 944 µs for
//! 4 MiB folded). At P = 2 every algorithm has as many rounds as messages, so the split of
//! the 3 µs between α and CPU is not measured there; it leans to the CPU because at P = 3
//! and 4 the message count, not the rounds, drives the times (P = 4, 4 B: recursive
//! doubling, 2 rounds of 1 message, 15.4 µs; one-shot, 1 round of 3, 27.5 µs). In shared
//! memory, α + CPU = 0.35 µs is the 4 B one-shot (0.36 to 0.39 µs), and β = γ from the
//! 64 MiB one-shot (13.0 to 14.0 ms for 64 MiB written and 64 MiB folded; the split
//! between them is not measured either). The network's are an estimate, not a
//! measurement: 10 GbE between Macs, α 30 to 50 µs, 1.1 GB/s, with loopback's CPU and
//! folding (the same kind of host).
//!
//! The model against the P = 2 measurements it was fitted to, loopback (µs, predicted /
//! measured): 4 B one-shot 3.0 / 2.95; 8 KiB one-shot 8.1 / 5.6 to 7.7; 1 MiB ring 428 /
//! 193 to 352; 4 MiB ring 1687 / 1674; 64 MiB ring 26 852 / 30 047 to 31 485. Shared
//! memory: 4 B 0.35 / 0.36 to 0.39; 8 KiB 2.0 / 2.3; 1 MiB 210 / 151 to 188; 64 MiB
//! 13 422 / 12 998 to 13 989. At P = 3 and 4 on this VM the ranks outnumber the cores and
//! the measured times are 2 to 5 times the model's (4 B one-shot at P = 3: 15.4 µs, the
//! model 5.0): the model prices ranks that each have a core.
//!
//! # Where the model and the measurements part
//!
//! The model's argmin would change measured rows, so they stay as they are (`nuvec plan
//! --link network`, which has no measured rows, shows the model alone). Over loopback:
//! at P = 2 it takes the ring from 32 KiB, where the one-shot and scatter-gather measured
//! ahead up to 1 MiB (idle, 64 KiB: 19.4 and 18.7 µs, the ring 22.1); at P = 3 the one-shot
//! up to 8 KiB, where recursive doubling measured ahead (idle, 8 KiB: 16.5 against
//! 23.9 µs), and the ring from 64 KiB (idle, 64 KiB: 61 µs, recursive doubling 37); at
//! P = 4 it takes recursive doubling up to 8 KiB and halving-doubling up to 64 KiB, as the
//! rows do (theirs cross at 16 KiB), but the ring from 128 KiB, where halving-doubling
//! measured ahead (idle, 256 KiB: 137 against 157 µs); at
//! P = 5 and 6 the one-shot and scatter-gather where the loaded run put
//! recursive doubling and halving-doubling ahead; at P = 12, 32 to 128 KiB,
//! scatter-gather (halving-doubling's hand-in and hand-out move the whole vector twice).
//! Its ring crossing is lower than measured at every P: β is the 4 MiB ring's, which
//! overstates what middling vectors cost while they stay in cache (P = 2, 256 KiB
//! one-shot: 60 µs measured, 168 predicted). And the loaded runs had more rank threads
//! than cores, which the model does not price. From 13 ranks over TCP and 4 in shared
//! memory nothing was measured, and the model decides. In shared memory the model agrees
//! with the rows at P = 2 (the one-shot at every size) and moves P = 3's crossing from
//! 32 KiB down to between 2 and 4 KiB.

use super::Transport;

/// The algorithm a collective took, as the flight recorder names it
/// ([`FlightEntry::algorithm`](crate::FlightEntry::algorithm)): the names of this table's
/// algorithms (those [`Plan::algorithm`] gives), and the schedules of the paths and wires
/// the table does not choose for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, strum::Display, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
#[non_exhaustive]
pub enum Algorithm {
    /// Every rank hands its whole vector to every other in one hop.
    OneShot,
    /// Reduce-scatter, then all-gather (a broadcast: the root scatters, the ranks
    /// all-gather).
    ScatterGather,
    /// A ring: MLX's pipelined ring (the native wire's large all-reduces, every collective
    /// of MLX's wire and of JACCL's ring), or this crate's schedules over MLX's ring
    /// connections (broadcast and all_to_all on that wire).
    Ring,
    /// Recursive doubling: log2 P rounds of one message each.
    RecursiveDoubling,
    /// Recursive halving, then recursive doubling (Rabenseifner's all-reduce).
    HalvingDoubling,
    /// One round in which every rank sends to every rank that needs its data (its block,
    /// its header, the root's vector), and the collectives that have no other algorithm
    /// (sum_scatter, all_to_all).
    Direct,
    /// A hierarchical native group's three phases: shared memory inside each host, TCP
    /// between the hosts' leaders, shared memory again.
    Hierarchical,
}

impl Algorithm {
    /// The name: `"one_shot"`, `"scatter_gather"`, `"ring"`, `"recursive_doubling"`,
    /// `"halving_doubling"`, `"direct"` or `"hierarchical"`.
    pub fn name(self) -> &'static str {
        self.into()
    }
}

impl From<AllReduce> for Algorithm {
    fn from(a: AllReduce) -> Algorithm {
        match a {
            AllReduce::OneShot => Algorithm::OneShot,
            AllReduce::ScatterGather => Algorithm::ScatterGather,
            AllReduce::Ring => Algorithm::Ring,
            AllReduce::RecursiveDoubling => Algorithm::RecursiveDoubling,
            AllReduce::HalvingDoubling => Algorithm::HalvingDoubling,
        }
    }
}

impl From<AllGather> for Algorithm {
    fn from(a: AllGather) -> Algorithm {
        match a {
            AllGather::Direct => Algorithm::Direct,
            AllGather::RecursiveDoubling => Algorithm::RecursiveDoubling,
        }
    }
}

impl From<Barrier> for Algorithm {
    fn from(a: Barrier) -> Algorithm {
        match a {
            Barrier::Direct => Algorithm::Direct,
            Barrier::RecursiveDoubling => Algorithm::RecursiveDoubling,
        }
    }
}

impl From<Broadcast> for Algorithm {
    fn from(a: Broadcast) -> Algorithm {
        match a {
            Broadcast::Direct => Algorithm::Direct,
            Broadcast::ScatterGather => Algorithm::ScatterGather,
        }
    }
}

/// How an all-reduce goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, strum::IntoStaticStr)]
#[cfg_attr(test, derive(strum::EnumIter))]
#[strum(serialize_all = "snake_case")]
pub(crate) enum AllReduce {
    /// One hop: every rank hands its whole vector to every other and folds all of them.
    OneShot,
    /// Reduce-scatter, then all-gather: rank `j` folds share `j` from every rank, then
    /// every rank collects the folded shares (direct messages over TCP; two steps per chunk
    /// in shared memory).
    ScatterGather,
    /// MLX's pipelined ring, after a round of headers (TCP only).
    Ring,
    /// Recursive doubling (TCP only): log2 P rounds, each rank sending its whole partial
    /// result to one partner per round; ranks past the largest power of two hand their
    /// vector in before and take the result after.
    RecursiveDoubling,
    /// Rabenseifner's (TCP only): reduce-scatter by recursive halving, all-gather by
    /// recursive doubling, 2 log2 P rounds; each rank sends about 2 (P - 1) / P of the
    /// vector, as [`AllReduce::ScatterGather`] does, in log2 P messages instead of P - 1.
    HalvingDoubling,
}

/// How an all_gather goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, strum::IntoStaticStr)]
#[cfg_attr(test, derive(strum::EnumIter))]
#[strum(serialize_all = "snake_case")]
pub(crate) enum AllGather {
    /// One round: every rank sends its block to every other.
    Direct,
    /// Recursive doubling (TCP only): log2 P rounds, each rank sending the blocks it holds
    /// to one partner per round; ranks past the largest power of two hand their block in
    /// before and take the whole output after.
    RecursiveDoubling,
}

/// How a barrier goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, strum::IntoStaticStr)]
#[cfg_attr(test, derive(strum::EnumIter))]
#[strum(serialize_all = "snake_case")]
pub(crate) enum Barrier {
    /// One round: every rank sends its header to every other.
    Direct,
    /// Recursive doubling of headers: log2 P rounds of one message (plus one before and
    /// one after for the ranks past the largest power of two).
    RecursiveDoubling,
}

/// How a broadcast goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, strum::IntoStaticStr)]
#[cfg_attr(test, derive(strum::EnumIter))]
#[strum(serialize_all = "snake_case")]
pub(crate) enum Broadcast {
    /// The root sends the whole vector to every rank.
    Direct,
    /// The root scatters the vector's blocks, then the other ranks all-gather them.
    ScatterGather,
}

/// Largest all-reduce (bytes) that goes one-shot over TCP at P = 2. Both ways of reducing
/// send the same bytes per rank at P = 2; the one-shot wins while the second hop costs more
/// than folding the whole vector instead of half of it (ahead at 8 KiB, behind at 64 KiB).
pub(crate) const TCP_ONE_SHOT_MAX_P2: usize = 32 << 10;

/// Largest all-reduce (bytes) that goes one-shot over TCP at P >= 3 where the direct
/// algorithms are the only ones (a hierarchical group's leaders, see
/// [`leaders_all_reduce`]), and by recursive doubling from [`LOG_ROUNDS_MIN_RANKS`] ranks:
/// small vectors only, where the hops, not the bytes, are the cost (ahead or even at 8 KiB,
/// behind at 64 KiB).
pub(crate) const TCP_ONE_SHOT_MAX: usize = 16 << 10;

/// Largest all-reduce (bytes) that goes by recursive doubling over TCP at P = 3: the rank
/// past the largest power of two hands its vector in and takes the result back, and the
/// other two exchange once, which measured ahead of every other algorithm up to 64 KiB and
/// behind the direct reduce-scatter + all-gather at 256 KiB (see the module docs).
pub(crate) const TCP_DOUBLING_MAX_P3: usize = 64 << 10;

/// Smallest all-reduce (bytes) that takes MLX's pipelined ring over TCP: the direct
/// reduce-scatter/all-gather finishes each round before the next starts and stages a copy
/// of every peer's block, while the ring overlaps its steps in bounded staging (the ring
/// ahead from 1 MiB at every P).
pub(crate) const TCP_RING_MIN: usize = 1 << 20;

/// Largest all-reduce (bytes) that every rank folds whole in one step in shared memory at
/// P >= 3 (at P = 2 every size does); larger ones take two steps per chunk.
pub(crate) const SHM_ONE_SHOT_MAX: usize = 32 << 10;

/// Largest broadcast (bytes) that goes from the root straight to every rank at P >= 3. An
/// estimate, not a measurement: the crossing of the all-reduce's one-shot and direct
/// algorithms (between 8 and 64 KiB, above), which weigh one hop against the root's P - 1
/// copies the same way.
pub(crate) const BROADCAST_DIRECT_MAX: usize = 32 << 10;

/// The fewest ranks at which the TCP all-reduce rows take the log-round algorithms at every
/// size below the ring's (recursive doubling, then halving-doubling; see the module docs).
/// At P = 3 only the small all-reduces take recursive doubling ([`TCP_DOUBLING_MAX_P3`]).
pub(crate) const LOG_ROUNDS_MIN_RANKS: usize = 4;

/// The fewest ranks at which the TCP barrier goes by recursive doubling: from 3, where the
/// 4 B all-reduce, whose messages are the barrier's headers with 4 bytes behind them,
/// measured recursive doubling ahead (see the module docs).
pub(crate) const BARRIER_DOUBLING_MIN_RANKS: usize = 3;

/// The fewest ranks at which the TCP all_gather goes by recursive doubling (up to
/// [`TCP_RING_MIN`] of output); the all_gather was not measured below it.
pub(crate) const ALL_GATHER_DOUBLING_MIN_RANKS: usize = 5;

/// The most ranks whose rows were measured over TCP on loopback (P = 2 to 12, the tables in
/// the module docs): up to here the rows above choose, past here the cost model.
pub(crate) const TCP_MEASURED_MAX_RANKS: usize = 12;

/// The most ranks whose rows were measured in shared memory (P = 2 and 3): up to here the
/// rows above choose, past here the cost model.
pub(crate) const SHM_MEASURED_MAX_RANKS: usize = 3;

/// The largest all-reduce (bytes) that goes one-shot over `link` among `ranks` ranks, by
/// the measured rows of the direct algorithms (over TCP the rows of P = 2, and those of a
/// hierarchical group's leaders, see [`leaders_all_reduce`]).
#[inline]
pub(crate) fn one_shot_max(link: Transport, ranks: usize) -> usize {
    match (link, ranks) {
        (Transport::SharedMemory, 2) => usize::MAX,
        (Transport::SharedMemory, _) => SHM_ONE_SHOT_MAX,
        (_, 2) => TCP_ONE_SHOT_MAX_P2,
        (_, _) => TCP_ONE_SHOT_MAX,
    }
}

/// The largest all-reduce (bytes) the measured TCP rows take in one hop (P = 2) or by
/// recursive doubling (P >= 3) among `ranks` ranks.
pub(crate) fn tcp_small_max(ranks: usize) -> usize {
    match ranks {
        ..=2 => TCP_ONE_SHOT_MAX_P2,
        3 => TCP_DOUBLING_MAX_P3,
        _ => TCP_ONE_SHOT_MAX,
    }
}

/// The link kind the model prices a [`Transport`] as: shared memory as [`Link::Shm`], and
/// every other (TCP, which a group cannot tell apart between loopback and a network, and
/// the transports that take the TCP rows) as [`Link::Loopback`], the kind the TCP rows
/// and constants were measured on.
fn link_of(transport: Transport) -> Link {
    if transport == Transport::SharedMemory {
        Link::Shm
    } else {
        Link::Loopback
    }
}

/// Whether the measured rows choose for `ranks` ranks over `link` (the model otherwise).
#[inline]
fn measured(link: Link, ranks: usize) -> bool {
    match link {
        Link::Loopback => ranks <= TCP_MEASURED_MAX_RANKS,
        Link::Shm => ranks <= SHM_MEASURED_MAX_RANKS,
        Link::Network => false,
    }
}

/// How an all-reduce of `bytes` (`elems` elements) goes over `link` among `ranks` ranks.
///
/// A pure function of what every rank agreed when the group formed (the link, the ranks)
/// and of the call (its length), so every rank picks the same.
pub(crate) fn all_reduce(link: Transport, ranks: usize, bytes: usize, elems: usize) -> AllReduce {
    all_reduce_on(link_of(link), ranks, bytes, elems)
}

fn all_reduce_on(link: Link, ranks: usize, bytes: usize, elems: usize) -> AllReduce {
    if !measured(link, ranks) {
        return cheapest(link, all_reduce_candidates(link, ranks, elems), |a| {
            all_reduce_shape(a, link, ranks, bytes as f64)
        });
    }
    if link == Link::Shm {
        return if bytes <= one_shot_max(Transport::SharedMemory, ranks) || elems < ranks {
            AllReduce::OneShot
        } else {
            AllReduce::ScatterGather
        };
    }
    let small = bytes <= tcp_small_max(ranks) || elems < ranks;
    if small && ranks <= 2 {
        AllReduce::OneShot
    } else if small {
        AllReduce::RecursiveDoubling
    } else if bytes >= TCP_RING_MIN {
        AllReduce::Ring
    } else if ranks >= LOG_ROUNDS_MIN_RANKS {
        AllReduce::HalvingDoubling
    } else {
        AllReduce::ScatterGather
    }
}

/// How a hierarchical group's leaders reduce among `ranks` hosts over TCP: by the TCP rows,
/// but their exchange has only the one-shot and the direct reduce-scatter + all-gather. So
/// recursive doubling's sizes go one-shot up to the one-shot's own limit
/// ([`one_shot_max`]; at P = 3 recursive doubling goes further, where the one-shot
/// measured behind: 64 KiB, 79 against the direct algorithm's 55 µs), and every larger
/// size goes by reduce-scatter + all-gather.
pub(crate) fn leaders_all_reduce(ranks: usize, bytes: usize, elems: usize) -> AllReduce {
    match all_reduce(Transport::Tcp, ranks, bytes, elems) {
        AllReduce::OneShot => AllReduce::OneShot,
        AllReduce::RecursiveDoubling
            if bytes <= one_shot_max(Transport::Tcp, ranks) || elems < ranks =>
        {
            AllReduce::OneShot
        }
        AllReduce::RecursiveDoubling
        | AllReduce::ScatterGather
        | AllReduce::HalvingDoubling
        | AllReduce::Ring => AllReduce::ScatterGather,
    }
}

/// Whether an all-reduce of `bytes` among `ranks` ranks in shared memory goes one-shot
/// (every rank folds every chunk whole) rather than by shares.
///
/// Asked twice per shared-memory all-reduce (by the recorder and by the segment), so the
/// measured rows' threshold is read inline here, as [`all_reduce`] reads it for shared
/// memory; past them, the cost model.
#[inline]
pub(crate) fn shm_one_shot(ranks: usize, bytes: usize) -> bool {
    if measured(Link::Shm, ranks) {
        return bytes <= one_shot_max(Transport::SharedMemory, ranks) || bytes < ranks;
    }
    all_reduce(Transport::SharedMemory, ranks, bytes, bytes) == AllReduce::OneShot
}

/// How an all_gather of `bytes` of output (every rank's block) goes over `link` among
/// `ranks` ranks (shared memory has its own).
pub(crate) fn all_gather(link: Transport, ranks: usize, bytes: usize) -> AllGather {
    all_gather_on(link_of(link), ranks, bytes)
}

fn all_gather_on(link: Link, ranks: usize, bytes: usize) -> AllGather {
    if link == Link::Shm {
        AllGather::Direct
    } else if !measured(link, ranks) {
        let candidates = [AllGather::Direct, AllGather::RecursiveDoubling];
        cheapest(link, candidates, |a| {
            all_gather_shape(a, ranks, bytes as f64)
        })
    } else if ranks >= ALL_GATHER_DOUBLING_MIN_RANKS && bytes <= TCP_RING_MIN {
        AllGather::RecursiveDoubling
    } else {
        AllGather::Direct
    }
}

/// How a barrier goes over `link` among `ranks` ranks (shared memory has its own).
pub(crate) fn barrier(link: Transport, ranks: usize) -> Barrier {
    barrier_on(link_of(link), ranks)
}

fn barrier_on(link: Link, ranks: usize) -> Barrier {
    if link == Link::Shm {
        Barrier::Direct
    } else if !measured(link, ranks) {
        let candidates = [Barrier::Direct, Barrier::RecursiveDoubling];
        cheapest(link, candidates, |a| barrier_shape(a, ranks))
    } else if ranks >= BARRIER_DOUBLING_MIN_RANKS {
        Barrier::RecursiveDoubling
    } else {
        Barrier::Direct
    }
}

/// How a broadcast of `bytes` goes among `ranks` ranks over TCP.
pub(crate) fn broadcast(ranks: usize, bytes: usize) -> Broadcast {
    broadcast_on(Link::Loopback, ranks, bytes)
}

fn broadcast_on(link: Link, ranks: usize, bytes: usize) -> Broadcast {
    if !measured(link, ranks) {
        let candidates = [Broadcast::Direct, Broadcast::ScatterGather];
        cheapest(link, candidates, |a| {
            broadcast_shape(a, ranks, bytes as f64)
        })
    } else if ranks <= 2 || bytes <= BROADCAST_DIRECT_MAX {
        Broadcast::Direct
    } else {
        Broadcast::ScatterGather
    }
}

// The cost model.

/// A kind of link, as the cost model prices it (see [`Link::cost`] and [`plan`]).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, strum::Display, strum::EnumString, strum::IntoStaticStr,
)]
#[strum(serialize_all = "lowercase", ascii_case_insensitive)]
#[strum(parse_err_ty = String, parse_err_fn = not_a_link)]
#[non_exhaustive]
pub enum Link {
    /// TCP between ranks on one host. The native wire prices every TCP group as this: a
    /// group cannot tell loopback from a network, and these constants are the measured
    /// ones.
    Loopback,
    /// TCP between hosts. An estimate, not a measurement (10 GbE between Macs).
    Network,
    /// A shared-memory segment between ranks on one host.
    Shm,
}

/// [`Link`]'s `FromStr` error.
fn not_a_link(text: &str) -> String {
    format!("{text:?} is not a link: use \"loopback\", \"network\" or \"shm\"")
}

impl Link {
    /// Every link kind, in the order `nuvec plan` lists them.
    pub const ALL: [Link; 3] = [Link::Loopback, Link::Network, Link::Shm];

    /// The model's constants for this kind of link (see the module docs of
    /// `comm::algorithm` for where each comes from).
    pub fn cost(self) -> LinkCost {
        match self {
            Link::Loopback => LOOPBACK_COST,
            Link::Network => NETWORK_COST,
            Link::Shm => SHM_COST,
        }
    }
}

/// What a link costs in the model: a rank's time for a collective is
/// `rounds * alpha_us + messages * cpu_us + bytes / bytes_per_us + folded / fold_bytes_per_us`,
/// with the rounds, messages sent, bytes on its path and bytes it folds of the busiest
/// rank.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkCost {
    /// Latency per round (α, µs): a round's messages travel at once, so a rank waits one
    /// hop per round.
    pub alpha_us: f64,
    /// CPU per message a rank sends (µs): the system calls and header checks at both ends.
    pub cpu_us: f64,
    /// Bandwidth (β, bytes per µs: MB/s) of the bytes on the busiest rank's path.
    pub bytes_per_us: f64,
    /// Bytes per µs a rank folds (the reduction kernel, with its copies out of staging).
    pub fold_bytes_per_us: f64,
}

/// Loopback TCP, calibrated at P = 2 on this repository's 2-core VM, idle (see the module
/// docs): α + CPU = 3 µs from the 4 B one-shot (2.95 µs), bandwidth from the 4 MiB ring
/// (1674 µs: 2.5 GB/s), folding from the 4 MiB one-shot's excess over the ring (944 µs for
/// 4 MiB folded: 4.4 GB/s).
pub(crate) const LOOPBACK_COST: LinkCost = LinkCost {
    alpha_us: 1.0,
    cpu_us: 2.0,
    bytes_per_us: 2500.0,
    fold_bytes_per_us: 4400.0,
};

/// 10 GbE between hosts: an estimate, not a measurement. α = 40 µs (30 to 50 µs between
/// Macs), 1.1 GB/s; the CPU per message and the folding are loopback's (the same kind of
/// host).
pub(crate) const NETWORK_COST: LinkCost = LinkCost {
    alpha_us: 40.0,
    cpu_us: 2.0,
    bytes_per_us: 1100.0,
    fold_bytes_per_us: 4400.0,
};

/// Shared memory, calibrated at P = 2 on the same VM, idle (see the module docs): α + CPU =
/// 0.35 µs from the 4 B one-shot (0.36 to 0.39 µs), and copying and folding at 10 GB/s
/// each from the 64 MiB one-shot (13.0 to 14.0 ms for 64 MiB written and 64 MiB folded).
pub(crate) const SHM_COST: LinkCost = LinkCost {
    alpha_us: 0.2,
    cpu_us: 0.15,
    bytes_per_us: 10_000.0,
    fold_bytes_per_us: 10_000.0,
};

/// A collective the model plans.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, strum::Display, strum::EnumString, strum::IntoStaticStr,
)]
#[strum(serialize_all = "snake_case")]
#[non_exhaustive]
pub enum Collective {
    /// all_sum, all_max, all_min.
    AllReduce,
    /// all_gather (its bytes: the whole output, every rank's block).
    AllGather,
    /// barrier (no bytes).
    Barrier,
    /// broadcast.
    Broadcast,
}

impl Collective {
    /// Every collective the model plans, in the order `nuvec plan` lists them.
    pub const ALL: [Collective; 4] = [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::Barrier,
        Collective::Broadcast,
    ];
}

/// What the native wire does for one collective: the algorithm it takes and the model's
/// account of it for the busiest rank.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct Plan {
    /// The algorithm: `one_shot`, `scatter_gather`, `ring`, `recursive_doubling`,
    /// `halving_doubling` or `direct`.
    pub algorithm: &'static str,
    /// Rounds of messages, one after another.
    pub rounds: usize,
    /// Messages the busiest rank sends (a header alone counts).
    pub messages_per_rank: usize,
    /// The model's time (µs).
    pub predicted_us: f64,
}

/// The algorithm the native wire takes for `collective` over `bytes` among `ranks` ranks
/// on `link`, with its rounds, messages per rank and predicted time.
///
/// Up to the measured rank counts (P = 2 to 12 over TCP on loopback, 2 and 3 in shared
/// memory) that is the measured rows' choice; past them, and for [`Link::Network`], the
/// model's cheapest algorithm (ties go to the simpler one). It depends only on its
/// arguments, so every rank of a group picks the same. An all-reduce is planned for
/// float32 elements (`bytes / 4` of them); a rank count of 0 is taken as 1, which sends
/// nothing.
///
/// ```
/// use nuvec_distributed_engine::{Collective, Link, plan};
///
/// let p = plan(Collective::AllReduce, Link::Loopback, 16, 4);
/// assert_eq!(p.algorithm, "recursive_doubling");
/// assert_eq!((p.rounds, p.messages_per_rank), (4, 4));
/// assert!(p.predicted_us > 0.0);
/// ```
pub fn plan(collective: Collective, link: Link, ranks: usize, bytes: u64) -> Plan {
    let ranks = ranks.max(1);
    let n = usize::try_from(bytes).unwrap_or(usize::MAX);
    let nf = bytes as f64;
    let (algorithm, shape): (&'static str, Shape) = match collective {
        Collective::AllReduce => {
            let a = all_reduce_on(link, ranks, n, n / 4);
            (a.into(), all_reduce_shape(a, link, ranks, nf))
        }
        Collective::AllGather => {
            let a = all_gather_on(link, ranks, n);
            (a.into(), all_gather_shape(a, ranks, nf))
        }
        Collective::Barrier => {
            let a = barrier_on(link, ranks);
            (a.into(), barrier_shape(a, ranks))
        }
        Collective::Broadcast => {
            let a = broadcast_on(link, ranks, n);
            (a.into(), broadcast_shape(a, ranks, nf))
        }
    };
    Plan {
        algorithm,
        rounds: shape.rounds,
        messages_per_rank: shape.messages,
        predicted_us: shape.predict_us(link.cost()),
    }
}

/// The busiest rank's part of a collective: rounds, messages it sends, bytes on its path
/// (sent, or received where a partner's sends come before its own) and bytes it folds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Shape {
    pub rounds: usize,
    pub messages: usize,
    pub bytes: f64,
    pub folded: f64,
}

impl Shape {
    /// Nothing: a group of one rank.
    const NONE: Shape = Shape {
        rounds: 0,
        messages: 0,
        bytes: 0.0,
        folded: 0.0,
    };

    /// One round in which a rank sends `each` bytes to each of the other `ranks - 1` (`ranks`
    /// at least 2), nothing folded: a direct all_gather's block, a direct broadcast's buffer.
    fn direct(ranks: usize, each: f64) -> Shape {
        Shape {
            rounds: 1,
            messages: ranks - 1,
            bytes: (ranks as f64 - 1.0) * each,
            folded: 0.0,
        }
    }

    /// This, then `next`.
    fn then(self, next: Shape) -> Shape {
        Shape {
            rounds: self.rounds.saturating_add(next.rounds),
            messages: self.messages.saturating_add(next.messages),
            bytes: self.bytes + next.bytes,
            folded: self.folded + next.folded,
        }
    }

    /// The model's time (µs) over a link costing `cost`.
    pub(crate) fn predict_us(self, cost: LinkCost) -> f64 {
        self.rounds as f64 * cost.alpha_us
            + self.messages as f64 * cost.cpu_us
            + self.bytes / cost.bytes_per_us
            + self.folded / cost.fold_bytes_per_us
    }
}

/// Recursive doubling's dimensions at `ranks` (at least 2): log2 of the largest power of
/// two `pof2` not above it, `pof2`, and the rounds the ranks past it add (a hand-in before,
/// a hand-out after; see `native::protocol`'s `Doubling`).
fn doubling(ranks: usize) -> (usize, f64, usize) {
    let log2 = ranks.ilog2() as usize;
    let extra = if ranks.is_power_of_two() { 0 } else { 2 };
    (log2, (1u64 << log2) as f64, extra)
}

/// The algorithms an all-reduce over `link` may take among `ranks` ranks: with fewer
/// elements than ranks, those that need no element per rank.
fn all_reduce_candidates(link: Link, ranks: usize, elems: usize) -> &'static [AllReduce] {
    use AllReduce::{HalvingDoubling, OneShot, RecursiveDoubling, Ring, ScatterGather};
    match (link, elems < ranks) {
        (Link::Shm, true) => &[OneShot],
        (Link::Shm, false) => &[OneShot, ScatterGather],
        (_, true) => &[OneShot, RecursiveDoubling],
        (_, false) => &[
            OneShot,
            ScatterGather,
            RecursiveDoubling,
            HalvingDoubling,
            Ring,
        ],
    }
}

/// Of `candidates`, the one whose `shape` the model prices lowest over `link`; the first
/// of equals.
fn cheapest<A: Copy>(link: Link, candidates: impl AsRef<[A]>, shape: impl Fn(A) -> Shape) -> A {
    let cost = link.cost();
    let mut best: Option<(A, f64)> = None;
    for &a in candidates.as_ref() {
        let t = shape(a).predict_us(cost);
        if best.is_none_or(|(_, b)| t < b) {
            best = Some((a, t));
        }
    }
    best.map_or(candidates.as_ref()[0], |(a, _)| a)
}

/// An all-reduce of `bytes` among `ranks` ranks by `algorithm` (`native::protocol`'s
/// schedules; the ring's is MLX's, after a barrier by `link`'s choice). The ring folds a
/// chunk while the next is on the wire, so its folding costs no time here.
pub(crate) fn all_reduce_shape(
    algorithm: AllReduce,
    link: Link,
    ranks: usize,
    bytes: f64,
) -> Shape {
    if ranks <= 1 {
        return Shape::NONE;
    }
    let p = ranks as f64;
    let others = ranks - 1;
    let share = bytes / p;
    let (log2, pof2, extra) = doubling(ranks);
    let handed = if extra > 0 { bytes } else { 0.0 };
    match algorithm {
        AllReduce::OneShot => Shape {
            rounds: 1,
            messages: others,
            bytes: (p - 1.0) * bytes,
            folded: (p - 1.0) * bytes,
        },
        AllReduce::ScatterGather => Shape {
            rounds: 2,
            messages: others.saturating_mul(2),
            // In shared memory, the folded share is also copied back into the segment.
            bytes: 2.0 * (p - 1.0) * share + if link == Link::Shm { share } else { 0.0 },
            folded: (p - 1.0) * share,
        },
        AllReduce::Ring => {
            let barrier = barrier_shape(barrier_on(link, ranks), ranks);
            barrier.then(Shape {
                rounds: others.saturating_mul(2),
                messages: others.saturating_mul(2),
                bytes: 2.0 * (p - 1.0) * share,
                folded: 0.0,
            })
        }
        AllReduce::RecursiveDoubling => Shape {
            rounds: log2 + extra,
            messages: log2 + extra,
            bytes: (log2 + extra) as f64 * bytes,
            folded: log2 as f64 * bytes + handed,
        },
        AllReduce::HalvingDoubling => Shape {
            rounds: 2 * log2 + extra,
            messages: 2 * log2 + extra,
            bytes: 2.0 * (pof2 - 1.0) / pof2 * bytes + extra as f64 * bytes,
            folded: (pof2 - 1.0) / pof2 * bytes + handed,
        },
    }
}

/// An all_gather of `bytes` of output among `ranks` ranks by `algorithm`.
pub(crate) fn all_gather_shape(algorithm: AllGather, ranks: usize, bytes: f64) -> Shape {
    if ranks <= 1 {
        return Shape::NONE;
    }
    let p = ranks as f64;
    let block = bytes / p;
    let (log2, pof2, extra) = doubling(ranks);
    match algorithm {
        AllGather::Direct => Shape::direct(ranks, block),
        AllGather::RecursiveDoubling => Shape {
            rounds: log2 + extra,
            messages: log2 + extra,
            // A hand-in's block and the whole output handed back, for P not a power of two.
            bytes: (pof2 - 1.0) / pof2 * bytes + if extra > 0 { block + bytes } else { 0.0 },
            folded: 0.0,
        },
    }
}

/// A barrier among `ranks` ranks by `algorithm`: headers only.
pub(crate) fn barrier_shape(algorithm: Barrier, ranks: usize) -> Shape {
    if ranks <= 1 {
        return Shape::NONE;
    }
    let (log2, _, extra) = doubling(ranks);
    let (rounds, messages) = match algorithm {
        Barrier::Direct => (1, ranks - 1),
        Barrier::RecursiveDoubling => (log2 + extra, log2 + extra),
    };
    Shape {
        rounds,
        messages,
        ..Shape::NONE
    }
}

/// A broadcast of `bytes` among `ranks` ranks by `algorithm`: the bytes of the root's sends,
/// and for the scatter, of a rank's all-gather of the other blocks after them.
pub(crate) fn broadcast_shape(algorithm: Broadcast, ranks: usize, bytes: f64) -> Shape {
    if ranks <= 1 {
        return Shape::NONE;
    }
    let p = ranks as f64;
    match algorithm {
        Broadcast::Direct => Shape::direct(ranks, bytes),
        Broadcast::ScatterGather => Shape {
            rounds: 2,
            // A rank other than the root: a header to every peer, then its block to every
            // rank but the root.
            messages: (ranks - 1).saturating_add(ranks - 2),
            bytes: bytes + (p - 2.0) * bytes / (p - 1.0),
            folded: 0.0,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recorders_names_are_the_tables() {
        use strum::IntoEnumIterator as _;
        let mut names: Vec<(&str, Algorithm)> = Vec::new();
        names.extend(AllReduce::iter().map(|a| (a.into(), a.into())));
        names.extend(AllGather::iter().map(|a| (a.into(), a.into())));
        names.extend(Barrier::iter().map(|a| (a.into(), a.into())));
        names.extend(Broadcast::iter().map(|a| (a.into(), a.into())));
        for (table, recorded) in names {
            assert_eq!(table, recorded.name());
            assert_eq!(table, recorded.to_string());
        }
        assert_eq!(Algorithm::Hierarchical.name(), "hierarchical");
    }

    #[test]
    fn the_table_s_rows() {
        use AllReduce::{HalvingDoubling, OneShot, RecursiveDoubling, Ring, ScatterGather};
        use Transport::{Rdma, SharedMemory, Tcp};
        let rows = [
            // (link, ranks, bytes, elements, algorithm)
            (Tcp, 2, 4, 1, OneShot),
            (Tcp, 2, 32 << 10, 8 << 10, OneShot),
            (Tcp, 2, (32 << 10) + 4, (8 << 10) + 1, ScatterGather),
            // P = 3: recursive doubling up to 64 KiB, then the direct reduce-scatter +
            // all-gather (halving-doubling hands the whole vector in and out).
            (Tcp, 3, 4, 1, RecursiveDoubling),
            (Tcp, 3, 64 << 10, 16 << 10, RecursiveDoubling),
            (Tcp, 3, (64 << 10) + 4, (16 << 10) + 1, ScatterGather),
            (Tcp, 3, (1 << 20) - 4, (1 << 18) - 1, ScatterGather),
            (Tcp, 3, 1 << 20, 1 << 18, Ring),
            // From P = 4: log2 P rounds below the ring's sizes.
            (Tcp, 4, 4, 1, RecursiveDoubling),
            (Tcp, 4, 16 << 10, 4 << 10, RecursiveDoubling),
            (Tcp, 4, (16 << 10) + 4, (4 << 10) + 1, HalvingDoubling),
            (Tcp, 4, (1 << 20) - 4, (1 << 18) - 1, HalvingDoubling),
            (Tcp, 4, 1 << 20, 1 << 18, Ring),
            (Tcp, 2, 64 << 20, 16 << 20, Ring),
            // Fewer elements than ranks: one-shot at P = 2, recursive doubling from P = 3,
            // whatever the bytes (a ring needs an element per rank).
            (Tcp, 2, 8 << 20, 1, OneShot),
            (Tcp, 3, 8 << 20, 2, RecursiveDoubling),
            (Tcp, 4, 8 << 20, 3, RecursiveDoubling),
            (Tcp, 16, 8 << 20, 15, RecursiveDoubling),
            (Tcp, 5, 4, 1, RecursiveDoubling),
            (Tcp, 12, 16 << 10, 4 << 10, RecursiveDoubling),
            (Tcp, 12, (16 << 10) + 4, (4 << 10) + 1, HalvingDoubling),
            // Past the measured rows, the model: halving-doubling's folding at P = 16
            // outweighs the ring's 26 more rounds from about 366 KiB.
            (Tcp, 16, 256 << 10, 64 << 10, HalvingDoubling),
            (Tcp, 16, 1 << 20, 1 << 18, Ring),
            (Rdma, 8, 4, 1, RecursiveDoubling),
            (SharedMemory, 8, 4, 1, OneShot),
            (SharedMemory, 2, 64 << 20, 16 << 20, OneShot),
            (SharedMemory, 3, 32 << 10, 8 << 10, OneShot),
            (
                SharedMemory,
                3,
                (32 << 10) + 4,
                (8 << 10) + 1,
                ScatterGather,
            ),
            (SharedMemory, 8, 64 << 20, 16 << 20, ScatterGather),
        ];
        for (link, ranks, bytes, elems, want) in rows {
            assert_eq!(
                all_reduce(link, ranks, bytes, elems),
                want,
                "{link:?}, P = {ranks}, {bytes} bytes"
            );
        }
        assert_eq!(barrier(Tcp, 2), Barrier::Direct);
        for ranks in [3, 4, 5, 8, 12, 16, 1000] {
            assert_eq!(barrier(Tcp, ranks), Barrier::RecursiveDoubling);
        }
        assert_eq!(barrier(SharedMemory, 8), Barrier::Direct);
        for (link, ranks, bytes, want) in [
            (Tcp, 2, 4, AllGather::Direct),
            (Tcp, 4, 64 << 10, AllGather::Direct),
            (Tcp, 3, 4, AllGather::Direct),
            (Tcp, 5, 0, AllGather::RecursiveDoubling),
            (Tcp, 16, 1 << 20, AllGather::RecursiveDoubling),
            (Tcp, 12, (1 << 20) + 12, AllGather::Direct),
            // P = 20: the hand-out of the whole output outweighs 14 fewer messages.
            (Tcp, 20, 1 << 20, AllGather::Direct),
            (SharedMemory, 16, 64, AllGather::Direct),
        ] {
            assert_eq!(
                all_gather(link, ranks, bytes),
                want,
                "{link:?}, P = {ranks}, {bytes} bytes"
            );
        }
        assert_eq!(broadcast(2, 1 << 30), Broadcast::Direct);
        assert_eq!(broadcast(3, 32 << 10), Broadcast::Direct);
        assert_eq!(broadcast(3, (32 << 10) + 1), Broadcast::ScatterGather);
    }

    #[test]
    fn the_leaders_take_the_direct_algorithms() {
        use AllReduce::{OneShot, ScatterGather};
        for (ranks, bytes, elems, want) in [
            (2, 32 << 10, 8 << 10, OneShot),
            (2, (32 << 10) + 4, (8 << 10) + 1, ScatterGather),
            // P = 3: the table's recursive doubling past the one-shot's limit.
            (3, 16 << 10, 4 << 10, OneShot),
            (3, (16 << 10) + 4, (4 << 10) + 1, ScatterGather),
            (3, 8 << 20, 2, OneShot),
            (4, 4, 1, OneShot),
            (4, 64 << 10, 16 << 10, ScatterGather),
            (4, 8 << 20, 2 << 20, ScatterGather),
            (8, 8 << 20, 7, OneShot),
            (16, 4, 1, OneShot),
            (16, 1 << 20, 1 << 18, ScatterGather),
        ] {
            assert_eq!(
                leaders_all_reduce(ranks, bytes, elems),
                want,
                "P = {ranks}, {bytes} bytes"
            );
        }
    }

    const ALL_REDUCES: [AllReduce; 5] = [
        AllReduce::OneShot,
        AllReduce::ScatterGather,
        AllReduce::Ring,
        AllReduce::RecursiveDoubling,
        AllReduce::HalvingDoubling,
    ];

    #[test]
    fn the_model_s_shapes() {
        let rd = |p| all_reduce_shape(AllReduce::RecursiveDoubling, Link::Loopback, p, 4.0);
        assert_eq!((rd(16).rounds, rd(16).messages), (4, 4));
        assert_eq!((rd(12).rounds, rd(12).messages), (5, 5));
        let hd = all_reduce_shape(AllReduce::HalvingDoubling, Link::Loopback, 16, 64.0);
        assert_eq!((hd.rounds, hd.messages, hd.bytes), (8, 8, 120.0));
        let one = all_reduce_shape(AllReduce::OneShot, Link::Loopback, 2, 8.0);
        assert_eq!((one.rounds, one.messages, one.bytes), (1, 1, 8.0));
        // The ring at P = 2: a direct barrier's round, then 2 steps.
        let ring = all_reduce_shape(AllReduce::Ring, Link::Loopback, 2, 8.0);
        assert_eq!((ring.rounds, ring.messages, ring.folded), (3, 3, 0.0));
        for a in ALL_REDUCES {
            assert_eq!(all_reduce_shape(a, Link::Loopback, 1, 1e12), Shape::NONE);
        }
    }

    #[test]
    fn small_all_sums_past_the_measured_rows_take_few_rounds_and_messages() {
        let p16 = plan(Collective::AllReduce, Link::Loopback, 16, 4);
        assert!(p16.rounds <= 4 && p16.messages_per_rank <= 4, "{p16:?}");
        let p12 = plan(Collective::AllReduce, Link::Loopback, 12, 4);
        assert!(p12.rounds <= 5, "{p12:?}");
        let mid = plan(Collective::AllReduce, Link::Loopback, 16, 64 << 10);
        assert!(mid.messages_per_rank <= 8, "{mid:?}");
        // The same answer every time it is asked.
        for _ in 0..3 {
            assert_eq!(plan(Collective::AllReduce, Link::Loopback, 16, 4), p16);
            assert_eq!(
                plan(Collective::AllReduce, Link::Loopback, 16, 64 << 10),
                mid
            );
        }
    }

    #[test]
    fn past_the_measured_rows_the_choice_is_the_model_s_cheapest() {
        for link in Link::ALL {
            let cost = link.cost();
            let first = match link {
                Link::Loopback => TCP_MEASURED_MAX_RANKS + 1,
                Link::Shm => SHM_MEASURED_MAX_RANKS + 1,
                Link::Network => 2,
            };
            for ranks in (first..=40).chain([64, 100, 128, 1000, 1024]) {
                for bytes in [4usize, 64, 4 << 10, 64 << 10, 1 << 20, 64 << 20] {
                    let elems = bytes / 4;
                    let chosen = all_reduce_on(link, ranks, bytes, elems);
                    let t = |a| all_reduce_shape(a, link, ranks, bytes as f64).predict_us(cost);
                    for &a in all_reduce_candidates(link, ranks, elems) {
                        assert!(
                            t(chosen) <= t(a),
                            "{link}, P = {ranks}, {bytes} B: {chosen:?} ({} µs) over {a:?} ({} µs)",
                            t(chosen),
                            t(a)
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn every_plan_is_finite_for_any_ranks_and_bytes() {
        let sizes = [0u64, 1, 4, 1 << 10, 64 << 10, 1 << 20, 1 << 30, 1 << 40];
        for link in Link::ALL {
            for collective in Collective::ALL {
                for ranks in 0..=1024 {
                    for bytes in sizes {
                        let p = plan(collective, link, ranks, bytes);
                        assert!(
                            p.predicted_us.is_finite() && p.predicted_us >= 0.0,
                            "{collective} {link} P = {ranks} {bytes} B: {p:?}"
                        );
                        assert!(p.rounds <= 2 * ranks.max(1) + 20, "{p:?}");
                        if ranks <= 1 {
                            assert_eq!((p.rounds, p.messages_per_rank), (0, 0));
                        }
                    }
                }
            }
        }
        let huge = plan(Collective::AllReduce, Link::Network, usize::MAX, u64::MAX);
        assert!(huge.predicted_us.is_finite(), "{huge:?}");
    }

    #[test]
    fn link_names_parse() {
        for link in Link::ALL {
            assert_eq!(link.to_string().parse::<Link>(), Ok(link));
        }
        assert_eq!("SHM".parse::<Link>(), Ok(Link::Shm));
        let err = "tcp".parse::<Link>().unwrap_err();
        assert!(err.contains("loopback"), "{err}");
    }
}
