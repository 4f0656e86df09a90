//! The one algorithm table of the native wire: which algorithm a collective takes, by
//! collective, bytes, ranks and link kind, with the measurements each crossing rests on.
//!
//! MLX's wire and JACCL take MLX's own choices (`comm::ring::schedule`, `jaccl`): those are
//! part of their wire, which a rank of MLX must be able to follow, so they are not chosen
//! here.
//!
//! | collective | link | ranks | bytes | algorithm |
//! |---|---|---|---|---|
//! | all-reduce | TCP | up to 4 | fewer elements than ranks | [`AllReduce::OneShot`] |
//! | all-reduce | TCP | 2 | up to [`TCP_ONE_SHOT_MAX_P2`] | [`AllReduce::OneShot`] |
//! | all-reduce | TCP | 3, 4 | up to [`TCP_ONE_SHOT_MAX`] | [`AllReduce::OneShot`] |
//! | all-reduce | TCP | up to 4 | below [`TCP_RING_MIN`] | [`AllReduce::ScatterGather`] |
//! | all-reduce | TCP | 5 or more | fewer elements than ranks, or up to [`TCP_ONE_SHOT_MAX`] | [`AllReduce::RecursiveDoubling`] |
//! | all-reduce | TCP | 5 or more | below [`TCP_RING_MIN`] | [`AllReduce::HalvingDoubling`] |
//! | all-reduce | TCP | any | from [`TCP_RING_MIN`] | [`AllReduce::Ring`] |
//! | all-reduce | shared memory | 2 | any | [`AllReduce::OneShot`] |
//! | all-reduce | shared memory | 3 or more | up to [`SHM_ONE_SHOT_MAX`] | [`AllReduce::OneShot`] |
//! | all-reduce | shared memory | 3 or more | larger | [`AllReduce::ScatterGather`] |
//! | broadcast | TCP | 2 | any | [`Broadcast::Direct`] |
//! | broadcast | TCP | 3 or more | up to [`BROADCAST_DIRECT_MAX`] | [`Broadcast::Direct`] |
//! | broadcast | TCP | 3 or more | larger | [`Broadcast::ScatterGather`] |
//! | all_gather | TCP | up to 4 | any | [`AllGather::Direct`] |
//! | all_gather | TCP | 5 or more | output up to [`TCP_RING_MIN`] | [`AllGather::RecursiveDoubling`] |
//! | all_gather | TCP | 5 or more | larger | [`AllGather::Direct`] |
//! | barrier | TCP | up to 4 | - | [`Barrier::Direct`] |
//! | barrier | TCP | 5 or more | - | [`Barrier::RecursiveDoubling`] |
//!
//! A hierarchical group's leaders reduce across hosts over TCP by the TCP rows, with their
//! own count of ranks (the hosts); their exchange has no pipelined ring, so where the table
//! says [`AllReduce::Ring`] they take [`AllReduce::ScatterGather`], and they take the
//! direct algorithms where it says [`AllReduce::RecursiveDoubling`] or
//! [`AllReduce::HalvingDoubling`]. sum_scatter and all_to_all have one algorithm each
//! (every block straight to its rank over TCP, one step per chunk in shared memory), and
//! so does send/recv; shared memory and the hierarchical groups have their own
//! all_gather. The check of calls before a ring all-reduce is a barrier, by the barrier's
//! row.
//!
//! # Past four ranks over TCP
//!
//! The direct algorithms send P - 1 messages per rank per round (the one-shot its whole
//! vector each time), so their latency grows linearly with P; past four ranks Open MPI's
//! recursive doubling and halving-doubling, with log2 P rounds of one message each, beat
//! them. So from [`LOG_ROUNDS_MIN_RANKS`] ranks the small and middling all-reduces, the
//! barrier and the all_gathers up to [`TCP_RING_MIN`] of output take those
//! (`native::protocol` has them, with the order they fold in). Up to four ranks the rows
//! are the ones measured in the next section, unchanged. Recursive doubling's all_gather
//! sends the bytes of the direct one in fewer messages, but for P not a power of two the
//! ranks that took a block in send the whole output back: past a MiB of output (an
//! estimate, the all-reduce's ring crossing) the direct one's P - 1 concurrent messages
//! are kept. The barrier's crossing is the message count's (at P = 4 a rank sends 3
//! headers in one round, or 1 in each of 2), not a measurement.
//!
//! The all-reduce's crossings past four ranks, by `native::tests::measure_the_algorithms`
//! (as in the next section: P threads on loopback on a 2-core VM at load average 7 to 9,
//! one run each, so only the order is worth anything), in µs, one-shot / direct /
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
//! # Where the TCP crossings come from
//!
//! `native::tests::measure_the_algorithms`: the median of each rank's all_sum f32 times,
//! P threads on loopback in one process, on a 2-core VM whose load average was 8.5, so only
//! the crossings are worth anything, not the times:
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

use super::Transport;

/// How an all-reduce goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AllGather {
    /// One round: every rank sends its block to every other.
    Direct,
    /// Recursive doubling (TCP only): log2 P rounds, each rank sending the blocks it holds
    /// to one partner per round; ranks past the largest power of two hand their block in
    /// before and take the whole output after.
    RecursiveDoubling,
}

/// How a barrier goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Barrier {
    /// One round: every rank sends its header to every other.
    Direct,
    /// Recursive doubling of headers: log2 P rounds of one message (plus one before and
    /// one after for the ranks past the largest power of two).
    RecursiveDoubling,
}

/// How a broadcast goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

/// Largest all-reduce (bytes) that goes one-shot over TCP at P >= 3, where each rank sends
/// its vector P - 1 times: small vectors only, where the hops, not the bytes, are the cost
/// (ahead or even at 8 KiB, behind at 64 KiB).
pub(crate) const TCP_ONE_SHOT_MAX: usize = 16 << 10;

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

/// The fewest ranks at which the TCP rows take the log-round algorithms (see the module
/// docs).
pub(crate) const LOG_ROUNDS_MIN_RANKS: usize = 5;

/// Whether `ranks` ranks over `link` take the log-round algorithms.
fn log_rounds(link: Transport, ranks: usize) -> bool {
    link != Transport::SharedMemory && ranks >= LOG_ROUNDS_MIN_RANKS
}

/// The largest all-reduce (bytes) that goes one-shot over `link` among `ranks` ranks.
pub(crate) fn one_shot_max(link: Transport, ranks: usize) -> usize {
    match (link, ranks) {
        (Transport::SharedMemory, 2) => usize::MAX,
        (Transport::SharedMemory, _) => SHM_ONE_SHOT_MAX,
        (_, 2) => TCP_ONE_SHOT_MAX_P2,
        (_, _) => TCP_ONE_SHOT_MAX,
    }
}

/// How an all-reduce of `bytes` (`elems` elements) goes over `link` among `ranks` ranks.
///
/// A pure function of what every rank agreed when the group formed (the link, the ranks)
/// and of the call (its length), so every rank picks the same.
pub(crate) fn all_reduce(link: Transport, ranks: usize, bytes: usize, elems: usize) -> AllReduce {
    let small = bytes <= one_shot_max(link, ranks) || elems < ranks;
    if log_rounds(link, ranks) {
        if small {
            AllReduce::RecursiveDoubling
        } else if bytes < TCP_RING_MIN {
            AllReduce::HalvingDoubling
        } else {
            AllReduce::Ring
        }
    } else if small {
        AllReduce::OneShot
    } else if link == Transport::SharedMemory || bytes < TCP_RING_MIN {
        AllReduce::ScatterGather
    } else {
        AllReduce::Ring
    }
}

/// How an all_gather of `bytes` of output (every rank's block) goes over `link` among
/// `ranks` ranks (shared memory has its own).
pub(crate) fn all_gather(link: Transport, ranks: usize, bytes: usize) -> AllGather {
    if log_rounds(link, ranks) && bytes <= TCP_RING_MIN {
        AllGather::RecursiveDoubling
    } else {
        AllGather::Direct
    }
}

/// How a barrier goes over `link` among `ranks` ranks (shared memory has its own).
pub(crate) fn barrier(link: Transport, ranks: usize) -> Barrier {
    if log_rounds(link, ranks) {
        Barrier::RecursiveDoubling
    } else {
        Barrier::Direct
    }
}

/// How a broadcast of `bytes` goes among `ranks` ranks over TCP.
pub(crate) fn broadcast(ranks: usize, bytes: usize) -> Broadcast {
    if ranks <= 2 || bytes <= BROADCAST_DIRECT_MAX {
        Broadcast::Direct
    } else {
        Broadcast::ScatterGather
    }
}

/// What one link kind costs, for [`predict_us`]: a time per round of messages (the hop's
/// latency, α), a CPU time per message a rank sends and receives, and a bandwidth (β).
///
/// No constants are calibrated yet and no choice in this module reads the model: the
/// table above is what the native wire takes.
#[allow(dead_code)] // read by the tests only until the constants are measured
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct LinkCost {
    /// Latency per round (µs).
    pub alpha_us: f64,
    /// Send plus receive overhead per message (µs).
    pub cpu_us: f64,
    /// Bytes per µs one rank moves.
    pub bytes_per_us: f64,
}

/// Rounds, messages per rank and bytes per rank sent by an all-reduce of `bytes` among
/// `ranks` ranks (at least 1) by `algorithm`, from the schedules in `native::protocol`.
/// Ranks past the largest power of two (log2 P rounded down) cost the log-round algorithms
/// one round before and one after. The ring's header round counts as one round and one message.
#[allow(dead_code)] // read by the tests only until the constants are measured
pub(crate) fn all_reduce_shape(
    algorithm: AllReduce,
    ranks: usize,
    bytes: usize,
) -> (usize, usize, usize) {
    let p = ranks.max(1);
    let log2 = p.ilog2() as usize;
    let extra = if p.is_power_of_two() { 0 } else { 2 };
    let share = bytes.div_ceil(p);
    let halves = share.saturating_mul(2 * (p - 1));
    match algorithm {
        AllReduce::OneShot => (1, p - 1, (p - 1).saturating_mul(bytes)),
        AllReduce::ScatterGather => (2, 2 * (p - 1), halves),
        AllReduce::Ring => (2 * (p - 1) + 1, 2 * (p - 1) + 1, halves),
        AllReduce::RecursiveDoubling => (
            log2 + extra,
            log2 + extra,
            (log2 + extra).saturating_mul(bytes),
        ),
        AllReduce::HalvingDoubling => (
            2 * log2 + extra,
            2 * log2 + extra,
            halves.saturating_add(extra.saturating_mul(bytes)),
        ),
    }
}

/// Predicted time (µs) of `rounds` rounds, `messages` messages and `bytes` bytes per rank
/// over a link costing `cost`: rounds·α + messages·cpu + bytes/β.
#[allow(dead_code)] // read by the tests only until the constants are measured
pub(crate) fn predict_us(cost: LinkCost, rounds: usize, messages: usize, bytes: usize) -> f64 {
    rounds as f64 * cost.alpha_us + messages as f64 * cost.cpu_us + bytes as f64 / cost.bytes_per_us
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_s_rows() {
        use AllReduce::{HalvingDoubling, OneShot, RecursiveDoubling, Ring, ScatterGather};
        let rows = [
            // (link, ranks, bytes, elements, algorithm)
            (Transport::Tcp, 2, 4, 1, OneShot),
            (Transport::Tcp, 2, 32 << 10, 8 << 10, OneShot),
            (
                Transport::Tcp,
                2,
                (32 << 10) + 4,
                (8 << 10) + 1,
                ScatterGather,
            ),
            (Transport::Tcp, 3, 16 << 10, 4 << 10, OneShot),
            (
                Transport::Tcp,
                3,
                (16 << 10) + 4,
                (4 << 10) + 1,
                ScatterGather,
            ),
            (
                Transport::Tcp,
                4,
                (1 << 20) - 4,
                (1 << 18) - 1,
                ScatterGather,
            ),
            (Transport::Tcp, 4, 1 << 20, 1 << 18, Ring),
            (Transport::Tcp, 2, 64 << 20, 16 << 20, Ring),
            // Fewer elements than ranks: one-shot (recursive doubling past four ranks)
            // whatever the bytes (a ring needs an element per rank).
            (Transport::Tcp, 4, 8 << 20, 3, OneShot),
            (Transport::Tcp, 16, 8 << 20, 15, RecursiveDoubling),
            (Transport::Tcp, 4, 4, 1, OneShot),
            (Transport::Tcp, 4, 16 << 10, 4 << 10, OneShot),
            (
                Transport::Tcp,
                4,
                (16 << 10) + 4,
                (4 << 10) + 1,
                ScatterGather,
            ),
            // Past four ranks: log2 P rounds where the direct algorithms went.
            (Transport::Tcp, 5, 4, 1, RecursiveDoubling),
            (Transport::Tcp, 12, 16 << 10, 4 << 10, RecursiveDoubling),
            (
                Transport::Tcp,
                12,
                (16 << 10) + 4,
                (4 << 10) + 1,
                HalvingDoubling,
            ),
            (
                Transport::Tcp,
                16,
                (1 << 20) - 4,
                (1 << 18) - 1,
                HalvingDoubling,
            ),
            (Transport::Tcp, 16, 1 << 20, 1 << 18, Ring),
            (Transport::Rdma, 8, 4, 1, RecursiveDoubling),
            (Transport::SharedMemory, 8, 4, 1, OneShot),
            (Transport::SharedMemory, 2, 64 << 20, 16 << 20, OneShot),
            (Transport::SharedMemory, 3, 32 << 10, 8 << 10, OneShot),
            (
                Transport::SharedMemory,
                3,
                (32 << 10) + 4,
                (8 << 10) + 1,
                ScatterGather,
            ),
            (
                Transport::SharedMemory,
                8,
                64 << 20,
                16 << 20,
                ScatterGather,
            ),
        ];
        for (link, ranks, bytes, elems, want) in rows {
            assert_eq!(
                all_reduce(link, ranks, bytes, elems),
                want,
                "{link:?}, P = {ranks}, {bytes} bytes"
            );
        }
        for ranks in 2..=4 {
            assert_eq!(barrier(Transport::Tcp, ranks), Barrier::Direct);
        }
        for ranks in [5, 8, 12, 16, 1000] {
            assert_eq!(barrier(Transport::Tcp, ranks), Barrier::RecursiveDoubling);
        }
        assert_eq!(barrier(Transport::SharedMemory, 8), Barrier::Direct);
        for (link, ranks, bytes, want) in [
            (Transport::Tcp, 2, 4, AllGather::Direct),
            (Transport::Tcp, 4, 64 << 10, AllGather::Direct),
            (Transport::Tcp, 5, 0, AllGather::RecursiveDoubling),
            (Transport::Tcp, 16, 1 << 20, AllGather::RecursiveDoubling),
            (Transport::Tcp, 16, (1 << 20) + 16, AllGather::Direct),
            (Transport::SharedMemory, 16, 64, AllGather::Direct),
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
    fn the_model_s_shapes() {
        let cost = LinkCost {
            alpha_us: 10.0,
            cpu_us: 1.0,
            bytes_per_us: 1000.0,
        };
        for ranks in 1..=1024 {
            for algorithm in [
                AllReduce::OneShot,
                AllReduce::ScatterGather,
                AllReduce::Ring,
                AllReduce::RecursiveDoubling,
                AllReduce::HalvingDoubling,
            ] {
                let a = all_reduce_shape(algorithm, ranks, 4);
                assert_eq!(a, all_reduce_shape(algorithm, ranks, 4));
                assert!(predict_us(cost, a.0, a.1, a.2).is_finite());
            }
        }
        assert_eq!(
            all_reduce_shape(AllReduce::RecursiveDoubling, 16, 4),
            (4, 4, 16)
        );
        assert_eq!(
            all_reduce_shape(AllReduce::RecursiveDoubling, 12, 4),
            (5, 5, 20)
        );
        assert_eq!(all_reduce_shape(AllReduce::OneShot, 2, 8), (1, 1, 8));
    }
}
