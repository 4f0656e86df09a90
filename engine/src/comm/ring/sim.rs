//! A simulated network that drives the ring protocol of P ranks in one thread.
//!
//! Every connection is a pair of byte queues with a random capacity; every read and write
//! moves a random number of bytes (at least one, at most a per-run bound), so lanes see
//! their steps cut up arbitrarily, the way TCP may cut them. A connection can be cut: it
//! closes once a given number of bytes went one way, and both ends then see it closed once
//! the bytes before the cut are read. Ranks and lanes are visited in a random order. All
//! randomness comes from one seed, so a failing run is replayed exactly.
//!
//! Connection indices follow `Transport`: rank `r`'s connection `i` to its left neighbour
//! (index `i`) is the other end of the left neighbour's connection `i` to its right (index
//! `C + i`).

use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

use super::protocol::{Buffers, Lane, Topology};
use super::staging::Staging;
use crate::error::{Error, PeerOp, Phase};

/// The simulation's randomness: one seeded generator, so a run replays exactly.
#[derive(Clone, Debug)]
pub(crate) struct Rng(StdRng);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(StdRng::seed_from_u64(seed))
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// A number in `1..=max` (`max` at least 1).
    pub(crate) fn upto(&mut self, max: usize) -> usize {
        1 + (self.next() % max.max(1) as u64) as usize
    }
}

/// What one transfer attempt did.
#[derive(Debug, PartialEq, Eq)]
enum Moved {
    Bytes(usize),
    Blocked,
    Closed,
}

/// The bytes one end of a connection wrote and the other has not read yet.
#[derive(Debug)]
struct Pipe {
    bytes: Vec<u8>,
    head: usize,
    capacity: usize,
    /// Bytes that went this way so far, and after how many the connection closes.
    carried: usize,
    cut_at: Option<usize>,
}

impl Pipe {
    fn queued(&self) -> usize {
        self.bytes.len() - self.head
    }
}

/// The simulated connections of a ring of `size` ranks with `connections` per neighbour.
#[derive(Debug)]
pub(crate) struct Net {
    size: usize,
    connections: usize,
    /// `pipes[r][i]`: what rank `r` wrote on its connection `i`.
    pipes: Vec<Vec<Pipe>>,
    /// Whether the connection with end `(r, i)` is closed (both ends say the same).
    closed: Vec<Vec<bool>>,
    rng: Rng,
    /// The most bytes one read or write moves.
    max_chunk: usize,
}

impl Net {
    /// A ring whose transfers move `1..=max_chunk` bytes; queues hold up to `4 max_chunk`.
    pub(crate) fn new(size: usize, connections: usize, max_chunk: usize, seed: u64) -> Net {
        let mut rng = Rng::new(seed);
        let pipes = (0..size)
            .map(|_| {
                (0..2 * connections)
                    .map(|_| Pipe {
                        bytes: Vec::new(),
                        head: 0,
                        capacity: rng.upto(4 * max_chunk),
                        carried: 0,
                        cut_at: None,
                    })
                    .collect()
            })
            .collect();
        Net {
            size,
            connections,
            pipes,
            closed: vec![vec![false; 2 * connections]; size],
            rng,
            max_chunk,
        }
    }

    /// Closes the connection with end `(rank, index)` once `after` bytes went from that end.
    pub(crate) fn cut(&mut self, rank: usize, index: usize, after: usize) {
        self.pipes[rank][index].cut_at = Some(after);
    }

    /// The bytes that went from end `(rank, index)`.
    pub(crate) fn carried(&self, rank: usize, index: usize) -> usize {
        self.pipes[rank][index].carried
    }

    /// The other end of connection `index` of `rank`.
    pub(crate) fn other_end(&self, rank: usize, index: usize) -> (usize, usize) {
        let c = self.connections;
        if index < c {
            ((rank + self.size - 1) % self.size, c + index)
        } else {
            ((rank + 1) % self.size, index - c)
        }
    }

    fn close(&mut self, rank: usize, index: usize) {
        let (peer, other) = self.other_end(rank, index);
        self.closed[rank][index] = true;
        self.closed[peer][other] = true;
    }

    fn write(&mut self, rank: usize, index: usize, buf: &[u8]) -> Moved {
        if self.closed[rank][index] {
            return Moved::Closed;
        }
        let chunk = self.rng.upto(self.max_chunk);
        let pipe = &mut self.pipes[rank][index];
        let room = pipe.capacity - pipe.queued();
        let mut n = buf.len().min(chunk).min(room);
        if let Some(cut) = pipe.cut_at {
            n = n.min(cut - pipe.carried);
        }
        if n == 0 {
            return if pipe.cut_at == Some(pipe.carried) {
                self.close(rank, index);
                Moved::Closed
            } else {
                Moved::Blocked
            };
        }
        if pipe.head > 0 && pipe.head == pipe.bytes.len() {
            pipe.bytes.clear();
            pipe.head = 0;
        }
        pipe.bytes.extend_from_slice(&buf[..n]);
        pipe.carried += n;
        if pipe.cut_at == Some(pipe.carried) {
            self.close(rank, index);
        }
        Moved::Bytes(n)
    }

    fn read(&mut self, rank: usize, index: usize, buf: &mut [u8]) -> Moved {
        let chunk = self.rng.upto(self.max_chunk);
        let (peer, other) = self.other_end(rank, index);
        let pipe = &mut self.pipes[peer][other];
        let n = buf.len().min(chunk).min(pipe.queued());
        if n == 0 {
            return if self.closed[rank][index] {
                Moved::Closed
            } else {
                Moved::Blocked
            };
        }
        buf[..n].copy_from_slice(&pipe.bytes[pipe.head..pipe.head + n]);
        pipe.head += n;
        Moved::Bytes(n)
    }
}

/// One simulated rank: its lanes, buffers, and how it ended.
#[derive(Debug)]
pub(crate) struct SimRank {
    pub(crate) topo: Topology,
    pub(crate) lanes: Vec<Lane>,
    pub(crate) staging: Staging,
    /// The array or output the collective writes.
    pub(crate) data: Vec<u8>,
    /// The collective's read-only input (sum_scatter, send).
    pub(crate) input: Vec<u8>,
    /// The error this rank failed with.
    pub(crate) error: Option<Error>,
}

impl SimRank {
    fn done(&self) -> bool {
        self.error.is_some() || self.lanes.iter().all(Lane::finished)
    }
}

/// Drives every rank until all are finished or failed, or none can move (a stall).
/// Returns whether every rank finished without error.
pub(crate) fn drive(net: &mut Net, ranks: &mut [SimRank], context: Phase) -> bool {
    let mut order: Vec<(usize, usize)> = Vec::new();
    loop {
        order.clear();
        for (r, rank) in ranks.iter().enumerate() {
            if !rank.done() {
                order.extend((0..rank.lanes.len()).map(|l| (r, l)));
            }
        }
        if order.is_empty() {
            return ranks.iter().all(|r| r.error.is_none());
        }
        // Fisher-Yates with the net's generator: a random visiting order every round.
        for i in (1..order.len()).rev() {
            let j = (net.rng.next() % (i as u64 + 1)) as usize;
            order.swap(i, j);
        }
        let mut progressed = false;
        for &(r, l) in &order {
            progressed |= step(net, r, &mut ranks[r], l, context);
        }
        if !progressed {
            return false;
        }
    }
}

/// Tries one write and one read for lane `l` of rank `r`. Returns whether anything moved.
fn step(net: &mut Net, r: usize, rank: &mut SimRank, l: usize, context: Phase) -> bool {
    if rank.error.is_some() {
        return false;
    }
    let SimRank {
        topo,
        lanes,
        staging,
        data,
        input,
        error,
    } = rank;
    let lane = &mut lanes[l];
    let stage = &mut staging.lanes[l];
    let mut bufs = Buffers { data, input };
    // Which of the two goes first is random too: the protocol must not care.
    let send_first = net.rng.next() & 1 == 0;
    for phase in 0..2 {
        let failed = if (phase == 0) == send_first {
            let tx = lane.tx();
            match lane
                .poll_transmit(&bufs, stage)
                .map(|b| net.write(r, tx, b))
            {
                Some(Moved::Bytes(n)) => {
                    lane.handle_sent(n);
                    None
                }
                Some(Moved::Closed) => Some((tx, PeerOp::Send)),
                Some(Moved::Blocked) | None => None,
            }
        } else {
            let rx = lane.rx();
            match lane
                .poll_receive(&mut bufs, stage)
                .map(|b| net.read(r, rx, b))
            {
                Some(Moved::Bytes(n)) => {
                    lane.handle_received(&mut bufs, stage, n);
                    None
                }
                Some(Moved::Closed) => Some((rx, PeerOp::Receive)),
                Some(Moved::Blocked) | None => None,
            }
        };
        if let Some((index, op)) = failed {
            *error = Some(Error::Closed {
                peer: topo.peer(index),
                op,
                context,
            });
            return true;
        }
    }
    lane.take_progress()
}

#[cfg(test)]
mod tests {
    use super::super::protocol::{self, Work};
    use super::super::schedule::{MIN_SEND_SIZE, SMALL_PAD_BYTES};
    use super::Rng;
    use super::*;
    use crate::element::DType;
    use crate::reduce::{ReduceOp, reduce_scalar};
    use proptest::prelude::*;

    /// A rank's buffers for one collective: staging whose receive buffer holds
    /// `stage_bytes` (small ones make the partial element carry cross its end often).
    fn rank(topo: Topology, stage_bytes: usize, data: Vec<u8>, input: Vec<u8>) -> SimRank {
        SimRank {
            topo,
            lanes: Vec::new(),
            staging: Staging::for_tests(topo.connections, stage_bytes),
            data,
            input,
            error: None,
        }
    }

    /// `elems` elements of `dtype` whose reduction by any op in any order is exact: random
    /// bits for integers, 0/1 for bool, small integers for floats.
    fn values(rng: &mut Rng, dtype: DType, elems: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(elems * dtype.size());
        for _ in 0..elems {
            let small = (rng.next() % 17) as i32 - 8;
            match dtype {
                DType::Bool => out.push((rng.next() & 1) as u8),
                DType::F16 => {
                    let v = half::f16::from_f32(small as f32);
                    out.extend_from_slice(&v.to_bits().to_le_bytes());
                }
                DType::BF16 => {
                    let v = half::bf16::from_f32(small as f32);
                    out.extend_from_slice(&v.to_bits().to_le_bytes());
                }
                DType::F32 => out.extend_from_slice(&(small as f32).to_le_bytes()),
                DType::F64 => out.extend_from_slice(&f64::from(small).to_le_bytes()),
                DType::Complex64 => {
                    let im = (rng.next() % 17) as i32 - 8;
                    out.extend_from_slice(&(small as f32).to_le_bytes());
                    out.extend_from_slice(&(im as f32).to_le_bytes());
                }
                _ => out.extend_from_slice(&rng.next().to_le_bytes()[..dtype.size()]),
            }
        }
        out
    }

    /// The scalar reduction of every rank's input, folded in rank order.
    fn oracle(op: ReduceOp, dtype: DType, inputs: &[Vec<u8>]) -> Vec<u8> {
        let mut acc = inputs[0].clone();
        for input in &inputs[1..] {
            reduce_scalar(op, dtype, &mut acc, input);
        }
        acc
    }

    /// A transfer bound that keeps big collectives to a few thousand transfers.
    fn max_chunk(rng: &mut Rng, bytes: usize) -> usize {
        rng.upto(64).max(bytes / 2048)
    }

    /// Drives `ranks` through `context` over a network of `size` ranks with `c` connections
    /// each, whose transfers are bounded by [`max_chunk`] of `bytes`; panics if they stall
    /// or fail.
    fn run(
        rng: &mut Rng,
        (size, c): (usize, usize),
        bytes: usize,
        ranks: &mut [SimRank],
        context: Phase,
    ) {
        let mut net = Net::new(size, c, max_chunk(rng, bytes), rng.next());
        assert!(drive(&mut net, ranks, context), "stalled or failed");
    }

    fn topologies(size: usize, connections: usize) -> impl Iterator<Item = Topology> {
        (0..size).map(move |rank| Topology {
            rank,
            size,
            connections,
        })
    }

    /// Runs an all-reduce on the simulator and checks every rank against the oracle.
    fn all_reduce(size: usize, c: usize, op: ReduceOp, dtype: DType, elems: usize, seed: u64) {
        let mut rng = Rng::new(seed);
        let esize = dtype.size();
        let inputs: Vec<Vec<u8>> = (0..size).map(|_| values(&mut rng, dtype, elems)).collect();
        let want = oracle(op, dtype, &inputs);
        // Fewer elements than ranks: padded with zeros to one per rank, as `Ring` does.
        let len = elems.max(size) * esize;
        let stage = esize + rng.upto(4 * esize);
        let mut ranks: Vec<SimRank> = topologies(size, c)
            .zip(&inputs)
            .map(|(topo, input)| {
                let mut data = input.clone();
                data.resize(len, 0);
                let mut rank = rank(topo, stage, data, Vec::new());
                protocol::plan_all_reduce(&mut rank.lanes, &topo, op, dtype, elems);
                rank
            })
            .collect();
        run(&mut rng, (size, c), len, &mut ranks, op.phase());
        for (r, rank) in ranks.iter().enumerate() {
            assert!(
                rank.data[..elems * esize] == want[..],
                "rank {r}: {op} of {elems} {dtype} differs from the scalar fold"
            );
        }
    }

    fn all_gather(size: usize, c: usize, nbytes: usize, seed: u64) {
        let mut rng = Rng::new(seed);
        let inputs: Vec<Vec<u8>> = (0..size)
            .map(|_| values(&mut rng, DType::U8, nbytes))
            .collect();
        let want = inputs.concat();
        let mut ranks: Vec<SimRank> = topologies(size, c)
            .map(|topo| {
                let mut data = vec![0u8; nbytes * size];
                data[topo.rank * nbytes..][..nbytes].copy_from_slice(&inputs[topo.rank]);
                let mut rank = rank(topo, 8, data, Vec::new());
                protocol::plan_all_gather(&mut rank.lanes, &topo, nbytes);
                rank
            })
            .collect();
        run(&mut rng, (size, c), nbytes, &mut ranks, Phase::AllGather);
        for rank in &ranks {
            assert!(
                rank.data == want,
                "rank {}: all_gather differs",
                rank.topo.rank
            );
        }
    }

    fn sum_scatter(size: usize, c: usize, dtype: DType, elems: usize, seed: u64) {
        let mut rng = Rng::new(seed);
        let chunk = elems * dtype.size();
        let inputs: Vec<Vec<u8>> = (0..size)
            .map(|_| values(&mut rng, dtype, elems * size))
            .collect();
        let want = oracle(ReduceOp::Sum, dtype, &inputs);
        let stage = dtype.size() + rng.upto(4 * dtype.size());
        let mut ranks: Vec<SimRank> = topologies(size, c)
            .zip(&inputs)
            .map(|(topo, input)| {
                let mut rank = rank(topo, stage, vec![0u8; chunk], input.clone());
                let piece = protocol::plan_sum_scatter(&mut rank.lanes, &topo, dtype, chunk);
                rank.staging.reserve(piece).unwrap();
                rank
            })
            .collect();
        run(
            &mut rng,
            (size, c),
            chunk * size,
            &mut ranks,
            Phase::SumScatter,
        );
        for (r, rank) in ranks.iter().enumerate() {
            assert!(
                rank.data[..] == want[r * chunk..(r + 1) * chunk],
                "rank {r}: sum_scatter of {elems} {dtype} per rank differs"
            );
        }
    }

    /// `src` sends `len` bytes to its neighbour `dst`; the other ranks do nothing.
    fn send_recv(size: usize, c: usize, src: usize, dst: usize, len: usize, seed: u64) {
        let mut rng = Rng::new(seed);
        let message = values(&mut rng, DType::U8, len);
        let mut ranks: Vec<SimRank> = topologies(size, c)
            .map(|topo| {
                let mut rank = rank(topo, 8, vec![0u8; len], message.clone());
                if topo.rank == src {
                    let first = topo.send_first(dst).unwrap();
                    protocol::plan_stripes(&mut rank.lanes, &topo, Work::Send, first, len);
                } else if topo.rank == dst {
                    let first = topo.recv_first(src).unwrap();
                    protocol::plan_stripes(&mut rank.lanes, &topo, Work::Recv, first, len);
                }
                rank
            })
            .collect();
        run(&mut rng, (size, c), len, &mut ranks, Phase::Send);
        assert!(
            ranks[dst].data == message,
            "rank {dst} received other bytes"
        );
    }

    /// Element counts worth testing for `size` ranks: around zero, the ranks, segment
    /// boundaries, and every sub-reduce split threshold of `reduce_splits` (for `large`).
    fn counts(size: usize, c: usize, esize: usize, large: bool) -> Vec<usize> {
        if large {
            let per_split = size * MIN_SEND_SIZE / esize;
            (1..=2 * c + 1)
                .flat_map(|s| [s * per_split - 1, s * per_split, s * per_split + 1])
                .collect()
        } else {
            let mut v = vec![0, 1, size - 1, size, size + 1, 2 * size - 1, 3 * size + 2];
            v.extend([7 * size + 3, 64 * size - 1, 1000]);
            v.retain(|&n| n >= size || size * esize <= SMALL_PAD_BYTES);
            v
        }
    }

    /// `NUVEC_SIM_CASES` overrides the number of cases (CI lowers it under qemu, where a
    /// case costs many times what it does natively; the native runs keep the default).
    fn config() -> ProptestConfig {
        let cases = std::env::var("NUVEC_SIM_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            // Debug builds run these too: fewer, still covering every parameter over time.
            .unwrap_or(if cfg!(debug_assertions) { 24 } else { 96 });
        ProptestConfig {
            cases,
            failure_persistence: None,
            ..ProptestConfig::default()
        }
    }

    /// One in this many cases is a large one (sub-reduce split thresholds).
    const LARGE_ONE_IN: u32 = 12;

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn all_reduce_matches_the_scalar_fold(
            size in 2usize..=8, c in 1usize..=2, d in 0..DType::ALL.len(),
            o in 0..ReduceOp::ALL.len(), pick in any::<prop::sample::Index>(),
            large in (0..LARGE_ONE_IN).prop_map(|x| x == 0), seed in any::<u64>(),
        ) {
            let (dtype, op) = (DType::ALL[d], ReduceOp::ALL[o]);
            let counts = counts(size, c, dtype.size(), large);
            all_reduce(size, c, op, dtype, counts[pick.index(counts.len())], seed);
        }

        #[test]
        fn all_gather_matches_the_concatenation(
            size in 2usize..=8, c in 1usize..=2, pick in any::<prop::sample::Index>(),
            large in (0..LARGE_ONE_IN).prop_map(|x| x == 0), seed in any::<u64>(),
        ) {
            let counts: Vec<usize> = if large {
                (1..=2 * c + 1)
                    .flat_map(|s| [s * MIN_SEND_SIZE - 1, s * MIN_SEND_SIZE + 1])
                    .collect()
            } else {
                vec![0, 1, 2, size, 1000, 4097]
            };
            all_gather(size, c, counts[pick.index(counts.len())], seed);
        }

        #[test]
        fn sum_scatter_matches_the_scalar_fold(
            size in 2usize..=8, c in 1usize..=2, d in 0..DType::ALL.len(),
            pick in any::<prop::sample::Index>(),
            large in (0..LARGE_ONE_IN).prop_map(|x| x == 0), seed in any::<u64>(),
        ) {
            let dtype = DType::ALL[d];
            // Per-rank element counts; the split thresholds are on the whole input.
            let counts: Vec<usize> = if large {
                let per_split = MIN_SEND_SIZE / dtype.size();
                (1..=2 * c + 1).flat_map(|s| [s * per_split - 1, s * per_split]).collect()
            } else {
                vec![0, 1, 2, 3, size + 1, 257]
            };
            sum_scatter(size, c, dtype, counts[pick.index(counts.len())], seed);
        }

        #[test]
        fn send_arrives_whole(
            size in 2usize..=8, c in 1usize..=2, src in 0usize..8, right: bool,
            len in prop_oneof![0usize..3000, Just(1024), Just(2049), 100_000usize..140_000],
            seed in any::<u64>(),
        ) {
            let src = src % size;
            let dst = if right { (src + 1) % size } else { (src + size - 1) % size };
            send_recv(size, c, src, dst, len, seed);
        }
    }

    /// Cuts each used connection of an all-reduce somewhere inside its bytes and checks
    /// that every rank that fails names the rank at the other end of the cut.
    #[test]
    fn a_cut_connection_is_blamed_on_the_rank_across_it() {
        let (op, dtype) = (ReduceOp::Sum, DType::F32);
        for (size, c, elems) in [(2, 1, 40), (3, 2, 1000), (5, 1, 3), (4, 2, 70_000)] {
            let plan = |topo: &Topology| {
                let mut lanes = Vec::new();
                protocol::plan_all_reduce(&mut lanes, topo, op, dtype, elems);
                lanes
            };
            let len = elems.max(size) * 4;
            let fresh = || -> Vec<SimRank> {
                topologies(size, c)
                    .map(|topo| {
                        let mut r = rank(topo, 64, vec![0u8; len], Vec::new());
                        r.lanes = plan(&topo);
                        r
                    })
                    .collect()
            };
            let mut clean = Net::new(size, c, 512, 7);
            assert!(drive(&mut clean, &mut fresh(), Phase::AllSum));
            let mut seed = 11;
            for r in 0..size {
                for i in 0..2 * c {
                    let carried = clean.carried(r, i);
                    if carried == 0 {
                        continue;
                    }
                    seed += 1;
                    let mut ranks = fresh();
                    let mut net = Net::new(size, c, 512, seed);
                    let at = (Rng::new(seed).next() % carried as u64) as usize;
                    net.cut(r, i, at);
                    let (peer, _) = net.other_end(r, i);
                    assert!(
                        !drive(&mut net, &mut ranks, Phase::AllSum),
                        "cut at {at} went unseen"
                    );
                    let mut failed = 0;
                    for rank in &ranks {
                        let Some(error) = &rank.error else { continue };
                        failed += 1;
                        let me = rank.topo.rank;
                        let across = if me == r { peer } else { r };
                        assert!(
                            me == r || me == peer,
                            "rank {me} failed though it is not at the cut: {error}"
                        );
                        assert_eq!(error.peer(), Some(across), "rank {me}: {error}");
                        assert!(error.to_string().contains("all_sum"), "{error}");
                    }
                    assert!(
                        failed > 0,
                        "P={size} C={c}: nobody saw the cut of ({r}, {i})"
                    );
                }
            }
        }
    }

    #[test]
    fn the_simulator_is_deterministic() {
        // The generator's state at the end depends on every choice the run made.
        let run = |seed| {
            let mut net = Net::new(3, 2, 100, seed);
            let mut ranks: Vec<SimRank> = topologies(3, 2)
                .map(|topo| {
                    let mut r = rank(topo, 16, vec![topo.rank as u8; 4000], Vec::new());
                    protocol::plan_all_reduce(&mut r.lanes, &topo, ReduceOp::Max, DType::U8, 4000);
                    r
                })
                .collect();
            assert!(drive(&mut net, &mut ranks, Phase::AllMax));
            assert!(ranks.iter().all(|r| r.data.iter().all(|&b| b == 2)));
            net.rng.next()
        };
        assert_eq!(run(5), run(5));
        assert_ne!(run(5), run(6));
    }
}
