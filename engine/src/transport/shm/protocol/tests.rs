//! The machine without a segment: P machines over one byte vector, run in random
//! interleavings by a scheduler that does what each one asks, and checked against the
//! rank-order fold, the step counts the schedule promises, and the rule that no buffer is
//! written while a peer may still read it.

use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

use super::*;
use crate::reduce::reduce_into;
use crate::transport::shm::p2p;
use crate::transport::shm::segment::{HEADER_BYTES, reached};

/// Small buffers, so that a few KiB take many pieces.
const SMALL: usize = 4096;

/// One rank of the simulation: its machine, its memory and the calls it still has to make.
struct Rank {
    steps: Steps,
    data: Vec<u8>,
    input: Vec<u8>,
    header: [u8; HEADER_BYTES],
    calls: Vec<Call>,
}

/// A call of the simulation: what to run, on what memory.
#[derive(Clone)]
struct Call {
    collective: Collective,
    data: Vec<u8>,
    input: Vec<u8>,
    header: [u8; HEADER_BYTES],
}

/// The segment as bytes, and for each rank's two buffers the step whose contribution
/// they hold (the step the writer was preparing when it last copied into them).
struct Sim {
    layout: Layout,
    seg: Vec<u8>,
    holds: Vec<[Option<u32>; 2]>,
    ranks: Vec<Rank>,
    /// What each rank's finished calls left in its data, in order.
    results: Vec<Vec<Vec<u8>>>,
}

impl Sim {
    fn new(group: &[usize], chunk: usize) -> Sim {
        let size = group.len();
        let layout = Layout::new(size, chunk, p2p::bytes(size));
        Sim {
            layout,
            seg: vec![0; layout.bytes()],
            holds: vec![[None; 2]; size],
            ranks: (0..size)
                .map(|me| Rank {
                    steps: Steps::new(layout, group, me),
                    data: Vec::new(),
                    input: Vec::new(),
                    header: [0; HEADER_BYTES],
                    calls: Vec::new(),
                })
                .collect(),
            results: vec![Vec::new(); size],
        }
    }

    fn word(&self, off: usize) -> u32 {
        let mut b = [0u8; 4];
        b.copy_from_slice(&self.seg[off..off + 4]);
        u32::from_le_bytes(b)
    }

    /// The buffer (rank, half) that `off..off + len` lies in, if it is one.
    fn buffer(&self, off: usize, len: usize) -> Option<(usize, usize)> {
        let l = self.layout;
        for r in 0..l.size() {
            for h in 0..2 {
                let b = l.data(r, h);
                if off >= b && off < b + l.chunk() {
                    assert!(off + len <= b + l.chunk(), "a copy across buffers");
                    return Some((r, h));
                }
            }
        }
        None
    }

    /// Starts rank `r`'s next call if it has none in flight; false when it has none left.
    fn next_call(&mut self, r: usize) -> bool {
        if !self.ranks[r].steps.is_finished() {
            return true;
        }
        if self.ranks[r].calls.is_empty() {
            return false;
        }
        let call = self.ranks[r].calls.remove(0);
        let l = self.layout;
        // The counters a send or recv starts from, as `Link` reads them.
        let collective = match call.collective {
            Collective::Send { dst, len, .. } => {
                let ch = p2p::Channel::new(&l, r, dst, Phase::Send).unwrap();
                let sent = self.word(ch.written());
                Collective::Send { dst, len, sent }
            }
            Collective::Recv { src, len, .. } => {
                let ch = p2p::Channel::new(&l, src, r, Phase::Recv).unwrap();
                let taken = self.word(ch.read());
                Collective::Recv { src, len, taken }
            }
            c => c,
        };
        let rank = &mut self.ranks[r];
        rank.data = call.data;
        rank.input = call.input;
        rank.header = call.header;
        rank.steps.start(collective, Phase::AllSum).unwrap();
        true
    }

    /// Does rank `r`'s next operation; false if it waits for a word.
    fn op(&mut self, r: usize) -> bool {
        if let Some(t) = self.ranks[r].steps.poll_transmit() {
            let preparing = self.ranks[r].steps.step().wrapping_add(1);
            match t {
                Transmit::CopyIn { from, to } => {
                    let rank = &self.ranks[r];
                    let src = match from {
                        Source::Data(range) => &rank.data[range],
                        Source::Input(range) => &rank.input[range],
                    };
                    if let Some((owner, h)) = self.buffer(to, src.len()) {
                        assert_eq!(owner, r, "rank {r} wrote into rank {owner}'s buffer");
                        self.holds[r][h] = Some(preparing);
                    }
                    self.seg[to..to + src.len()].copy_from_slice(src);
                }
                Transmit::Header { to } => {
                    let head = self.ranks[r].header;
                    self.seg[to..to + HEADER_BYTES].copy_from_slice(&head);
                }
                Transmit::Stamp { to, step } => {
                    self.seg[to..to + 4].copy_from_slice(&step.to_le_bytes());
                }
                Transmit::Publish {
                    header,
                    word,
                    value,
                    ..
                } => {
                    if let Some(to) = header {
                        let head = self.ranks[r].header;
                        self.seg[to..to + HEADER_BYTES].copy_from_slice(&head);
                    }
                    self.seg[word..word + 4].copy_from_slice(&value.to_le_bytes());
                }
            }
            self.ranks[r].steps.handle_sent();
            return true;
        }
        let Some(rx) = self.ranks[r].steps.poll_receive() else {
            return false;
        };
        let step = self.ranks[r].steps.step();
        match rx {
            Receive::Reached(a) => {
                assert_eq!(self.ranks[r].steps.poll_wait(), Some(a));
                if !reached(self.word(a.word), a.value) {
                    return false;
                }
            }
            Receive::Headers { half } => {
                for peer in (0..self.ranks.len()).filter(|&p| p != r) {
                    let from = self.layout.header(peer, half);
                    let got = &self.seg[from..from + HEADER_BYTES];
                    assert_eq!(got, self.ranks[r].header, "rank {r}: rank {peer}'s header");
                }
            }
            Receive::Message { peer, from } => {
                let got = &self.seg[from..from + HEADER_BYTES];
                assert_eq!(got, self.ranks[r].header, "rank {r}: rank {peer}'s message");
            }
            Receive::CopyOut { from, to } => {
                self.check_read(r, from, to.len(), step);
                let rank = &mut self.ranks[r];
                rank.data[to.clone()].copy_from_slice(&self.seg[from..from + to.len()]);
            }
            Receive::Combine(c) => {
                let len = c.into.len();
                for (from, fold) in c.reads(self.layout) {
                    self.check_read(r, from, len, step);
                    let src = &self.seg[from..from + len];
                    let acc = &mut self.ranks[r].data[c.into.clone()];
                    if fold {
                        reduce_into(c.op, c.dtype, acc, src);
                    } else {
                        acc.copy_from_slice(src);
                    }
                }
            }
        }
        self.ranks[r].steps.handle_received();
        true
    }

    /// A read of rank `r` at its step `step`: a buffer it reads holds that step's
    /// contribution (its owner has not written it again since). An empty read reads
    /// nothing (the empty share of a short chunk).
    fn check_read(&self, r: usize, from: usize, len: usize, step: u32) {
        if len == 0 {
            return;
        }
        if let Some((owner, h)) = self.buffer(from, len) {
            assert_eq!(
                self.holds[owner][h],
                Some(step),
                "rank {r} at step {step} read rank {owner}'s buffer {h}"
            );
        }
    }

    /// Runs every rank's calls to the end in an interleaving drawn from `seed`.
    fn run(&mut self, seed: u64) {
        let mut rng = StdRng::seed_from_u64(seed);
        let size = self.ranks.len();
        loop {
            let mut live: Vec<usize> = (0..size).filter(|&r| self.next_call(r)).collect();
            if live.is_empty() {
                return;
            }
            let mut moved = false;
            while !live.is_empty() {
                let r = live.swap_remove(rng.random_range(0..live.len()));
                for _ in 0..rng.random_range(1..8) {
                    if self.ranks[r].steps.is_finished() || !self.op(r) {
                        break;
                    }
                    moved = true;
                }
                self.ranks[r].steps.take_progress();
                if self.ranks[r].steps.is_finished() {
                    let data = std::mem::take(&mut self.ranks[r].data);
                    self.results[r].push(data);
                    moved |= self.next_call(r);
                    break;
                }
            }
            assert!(moved, "every rank waits: a deadlock");
        }
    }
}

fn random(seed: u64, bytes: usize) -> Vec<u8> {
    let mut v = vec![0u8; bytes];
    StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

fn fold(op: ReduceOp, dtype: DType, inputs: &[Vec<u8>]) -> Vec<u8> {
    let mut acc = inputs[0].clone();
    for x in &inputs[1..] {
        reduce_into(op, dtype, &mut acc, x);
    }
    acc
}

fn header(i: usize) -> [u8; HEADER_BYTES] {
    [i as u8; HEADER_BYTES]
}

/// One call on every rank: `make(rank)` gives its collective, data and input.
fn on_every_rank(
    sim: &mut Sim,
    index: usize,
    make: impl Fn(usize) -> (Collective, Vec<u8>, Vec<u8>),
) {
    for r in 0..sim.ranks.len() {
        let (collective, data, input) = make(r);
        sim.ranks[r].calls.push(Call {
            collective,
            data,
            input,
            header: header(index),
        });
    }
}

#[test]
fn every_collective_folds_in_rank_order_and_no_buffer_is_overwritten_while_read() {
    let ds = 4;
    let dtype = DType::F32;
    for size in 2..=5 {
        for seed in 0..4u64 {
            let group: Vec<usize> = (0..size).collect();
            let mut sim = Sim::new(&group, SMALL);
            // Empty, small, past a buffer with a ragged end.
            let counts = [0, 1, size + 1, SMALL / ds + 7, 3 * SMALL / ds + 5];
            let mut want: Vec<Vec<Vec<u8>>> = vec![Vec::new(); size];
            let mut index = 0;
            for (i, &n) in counts.iter().enumerate() {
                for one_shot in [true, false] {
                    let inputs: Vec<Vec<u8>> = (0..size)
                        .map(|r| random(seed * 1000 + (i * 10 + r) as u64, n * ds))
                        .collect();
                    let sum = fold(ReduceOp::Sum, dtype, &inputs);
                    on_every_rank(&mut sim, index, |r| {
                        let c = Collective::AllReduce {
                            op: ReduceOp::Sum,
                            dtype,
                            len: n * ds,
                            one_shot,
                            keep: true,
                        };
                        (c, inputs[r].clone(), Vec::new())
                    });
                    index += 1;
                    for w in &mut want {
                        w.push(sum.clone());
                    }
                }
                // all_gather, broadcast from the last rank, all_to_all, sum_scatter.
                let inputs: Vec<Vec<u8>> = (0..size)
                    .map(|r| random(seed * 2000 + (i * 10 + r) as u64, n))
                    .collect();
                on_every_rank(&mut sim, index, |r| {
                    let mut out = vec![0xEE; n * size];
                    out[r * n..(r + 1) * n].copy_from_slice(&inputs[r]);
                    (Collective::AllGather { len: n }, out, inputs[r].clone())
                });
                index += 1;
                for w in &mut want {
                    w.push(inputs.concat());
                }
                let root = size - 1;
                on_every_rank(&mut sim, index, |r| {
                    let data = if r == root {
                        inputs[r].clone()
                    } else {
                        vec![0xEE; n]
                    };
                    (Collective::Broadcast { root, len: n }, data, Vec::new())
                });
                index += 1;
                for w in &mut want {
                    w.push(inputs[root].clone());
                }
                let blocks: Vec<Vec<u8>> = (0..size)
                    .map(|r| random(seed * 3000 + (i * 10 + r) as u64, n * size))
                    .collect();
                on_every_rank(&mut sim, index, |r| {
                    let mut out = vec![0xEE; n * size];
                    out[r * n..(r + 1) * n].copy_from_slice(&blocks[r][r * n..(r + 1) * n]);
                    (Collective::AllToAll { block: n }, out, blocks[r].clone())
                });
                index += 1;
                for (r, w) in want.iter_mut().enumerate() {
                    w.push(
                        blocks
                            .iter()
                            .flat_map(|b| b[r * n..(r + 1) * n].to_vec())
                            .collect(),
                    );
                }
                let scattered: Vec<Vec<u8>> = (0..size)
                    .map(|r| random(seed * 4000 + (i * 10 + r) as u64, n * ds * size))
                    .collect();
                on_every_rank(&mut sim, index, |r| {
                    let c = Collective::SumScatter {
                        dtype,
                        block: n * ds,
                    };
                    (c, vec![0xEE; n * ds], scattered[r].clone())
                });
                index += 1;
                for (r, w) in want.iter_mut().enumerate() {
                    let mine: Vec<Vec<u8>> = scattered
                        .iter()
                        .map(|x| x[r * n * ds..(r + 1) * n * ds].to_vec())
                        .collect();
                    w.push(fold(ReduceOp::Sum, dtype, &mine));
                }
            }
            on_every_rank(&mut sim, index, |_| {
                (Collective::Barrier, Vec::new(), Vec::new())
            });
            for w in &mut want {
                w.push(Vec::new());
            }
            sim.run(seed);
            for r in 0..size {
                assert_eq!(sim.results[r].len(), want[r].len());
                for (k, (got, want)) in sim.results[r].iter().zip(&want[r]).enumerate() {
                    assert!(got == want, "P {size} seed {seed}: rank {r}, call {k}");
                }
            }
        }
    }
}

/// The steps each schedule takes: one per piece, two per chunk for an all-reduce by
/// shares, one for a barrier and for every empty collective.
#[test]
fn the_schedules_take_the_steps_they_promise() {
    let size = 3;
    let group: Vec<usize> = (0..size).collect();
    let elems = |chunks: usize| chunks * SMALL / 4 - 3;
    let cases: Vec<(Collective, usize, usize)> = vec![
        (Collective::Barrier, 0, 1),
        (Collective::Broadcast { root: 0, len: 0 }, 0, 1),
        (
            Collective::Broadcast {
                root: 1,
                len: 2 * SMALL + 1,
            },
            2 * SMALL + 1,
            3,
        ),
        (
            Collective::AllReduce {
                op: ReduceOp::Sum,
                dtype: DType::F32,
                len: elems(3) * 4,
                one_shot: true,
                keep: true,
            },
            elems(3) * 4,
            3,
        ),
        (
            Collective::AllReduce {
                op: ReduceOp::Sum,
                dtype: DType::F32,
                len: elems(3) * 4,
                one_shot: false,
                keep: true,
            },
            elems(3) * 4,
            6,
        ),
        (Collective::AllGather { len: SMALL + 1 }, SMALL + 1, 2),
        // Pieces of a block are SMALL / P bytes.
        (
            Collective::AllToAll {
                block: SMALL / size + 1,
            },
            SMALL / size + 1,
            2,
        ),
    ];
    for (k, (collective, len, steps)) in cases.into_iter().enumerate() {
        let mut sim = Sim::new(&group, SMALL);
        on_every_rank(&mut sim, k, |r| {
            let data = vec![
                0;
                len * if matches!(
                    collective,
                    Collective::AllGather { .. } | Collective::AllToAll { .. }
                ) {
                    size
                } else {
                    1
                }
            ];
            let input = match collective {
                Collective::AllGather { len } => vec![r as u8; len],
                Collective::AllToAll { block } => vec![r as u8; block * size],
                _ => Vec::new(),
            };
            (collective, data, input)
        });
        sim.run(k as u64);
        for rank in &sim.ranks {
            assert_eq!(rank.steps.step() as usize, steps, "{collective:?}");
        }
    }
}

/// A reduction to the first rank: its result is the rank-order fold, by either schedule.
#[test]
fn a_reduction_to_the_first_rank_reaches_it() {
    for (size, one_shot) in [(2, true), (3, true), (3, false), (4, false)] {
        let group: Vec<usize> = (0..size).collect();
        let mut sim = Sim::new(&group, SMALL);
        let n = 2 * SMALL / 4 + 9;
        let inputs: Vec<Vec<u8>> = (0..size).map(|r| random(r as u64, n * 4)).collect();
        on_every_rank(&mut sim, 0, |r| {
            let c = Collective::AllReduce {
                op: ReduceOp::Max,
                dtype: DType::F32,
                len: n * 4,
                one_shot,
                keep: false,
            };
            (c, inputs[r].clone(), Vec::new())
        });
        sim.run(size as u64);
        let want = fold(ReduceOp::Max, DType::F32, &inputs);
        assert!(sim.results[0][0] == want, "P {size} one-shot {one_shot}");
    }
}

/// A domain of a larger group fills its ranks' blocks of the group's all_gather output, at
/// their group ranks.
#[test]
fn a_domain_gathers_at_group_ranks() {
    let group = [1, 4, 6];
    let mut sim = Sim::new(&group, SMALL);
    let n = SMALL + 3;
    on_every_rank(&mut sim, 0, |r| {
        let mut out = vec![0; 7 * n];
        out[group[r] * n..(group[r] + 1) * n].fill(group[r] as u8);
        (
            Collective::AllGather { len: n },
            out,
            vec![group[r] as u8; n],
        )
    });
    sim.run(7);
    for r in 0..3 {
        for (b, block) in sim.results[r][0].chunks(n).enumerate() {
            let want = if group.contains(&b) { b as u8 } else { 0 };
            assert!(block.iter().all(|&x| x == want), "rank {r}, block {b}");
        }
    }
}

/// A ring shift of messages larger than the slots (each rank sends to the next and
/// receives from the previous; rank 0 sends first): every message arrives whole, each
/// sender running ahead of its receiver by at most the slots, then a collective.
#[test]
fn messages_pipeline_through_the_slots() {
    for size in [2, 3, 4] {
        for seed in 0..4u64 {
            let group: Vec<usize> = (0..size).collect();
            let mut sim = Sim::new(&group, SMALL);
            let slot = p2p::slot_bytes(size);
            let lens = [0, 1, slot, (SLOTS as usize + 2) * slot + 5];
            for (i, &n) in lens.iter().enumerate() {
                let msgs: Vec<Vec<u8>> =
                    (0..size).map(|r| random((i * 10 + r) as u64, n)).collect();
                for (r, msg) in msgs.iter().enumerate() {
                    let (to, from) = ((r + 1) % size, (r + size - 1) % size);
                    let send = Call {
                        collective: Collective::Send {
                            dst: to,
                            len: n,
                            sent: 0,
                        },
                        data: Vec::new(),
                        input: msg.clone(),
                        header: header(100 + i),
                    };
                    let recv = Call {
                        collective: Collective::Recv {
                            src: from,
                            len: n,
                            taken: 0,
                        },
                        data: vec![0xEE; n],
                        input: Vec::new(),
                        header: header(100 + i),
                    };
                    let calls = &mut sim.ranks[r].calls;
                    if r == 0 {
                        calls.extend([send, recv]);
                    } else {
                        calls.extend([recv, send]);
                    }
                }
                on_every_rank(&mut sim, i, |_| {
                    (Collective::Barrier, Vec::new(), Vec::new())
                });
                sim.run(seed * 10 + i as u64);
                for r in 0..size {
                    let got = &sim.results[r];
                    let recv = if r == 0 {
                        &got[got.len() - 2]
                    } else {
                        &got[got.len() - 3]
                    };
                    assert!(
                        *recv == msgs[(r + size - 1) % size],
                        "P {size} seed {seed}: {n} B into rank {r}"
                    );
                }
            }
        }
    }
}

#[test]
fn pieces_cover_everything_once_and_never_vanish() {
    let all = |total, per| -> Vec<Range<usize>> {
        (0..piece_count(total, per))
            .map(|i| nth_piece(total, per, i))
            .collect()
    };
    assert_eq!(all(0, 8), vec![0..0]);
    assert_eq!(all(8, 8), vec![0..8]);
    assert_eq!(all(17, 8), vec![0..8, 8..16, 16..17]);
    assert_eq!(all(3, 0).len(), 3);
    let c = 10..17;
    let shares: Vec<usize> = (0..3).flat_map(|j| share(&c, 3, j)).collect();
    assert_eq!(shares, (10..17).collect::<Vec<_>>());
    // ceil(len / size) each: the last shares shrink or vanish.
    assert_eq!(share(&(0..5), 4, 2), 4..5);
    assert_eq!(share(&(0..5), 4, 3), 5..5);
}

/// The machine plans one piece at a time into a buffer it keeps: once it has seen a
/// collective, the next ones of the same shape allocate nothing.
#[test]
fn the_operations_buffer_is_reused() {
    let group = [0, 1, 2];
    let mut sim = Sim::new(&group, SMALL);
    // Every rank sums three chunks of its own rank number, by shares.
    let sum = |r: usize| {
        let c = Collective::AllReduce {
            op: ReduceOp::Sum,
            dtype: DType::U8,
            len: 3 * SMALL,
            one_shot: false,
            keep: true,
        };
        (c, vec![r as u8; 3 * SMALL], Vec::new())
    };
    for i in 0..2 {
        on_every_rank(&mut sim, i, sum);
    }
    sim.run(1);
    let capacity = |sim: &Sim| {
        let steps = &sim.ranks[0].steps;
        [steps.ops.capacity(), steps.spare.capacity()]
    };
    let before = capacity(&sim);
    on_every_rank(&mut sim, 2, sum);
    sim.run(2);
    assert_eq!(capacity(&sim), before);
    assert!(sim.results[1][2].iter().all(|&x| x == 3));
}

/// A group collective of one piece reuses the plan of the last one of its shape at a step
/// of the same parity: what it does is what a machine that plans it afresh at its step
/// does, whichever collectives came between.
#[test]
fn a_reused_plan_is_the_plan() {
    let reduce = |len, one_shot, keep| Collective::AllReduce {
        op: ReduceOp::Sum,
        dtype: DType::F32,
        len,
        one_shot,
        keep,
    };
    let shapes = [
        Collective::Barrier,
        Collective::Broadcast { root: 1, len: 12 },
        Collective::AllToAll { block: 8 },
        reduce(4, true, true),
        reduce(4, true, false),
        reduce(12, false, true),
        reduce(12, false, false),
        reduce(8, true, true),
        reduce(3 * SMALL, true, true),
        Collective::AllGather { len: 4 },
        Collective::SumScatter {
            dtype: DType::F32,
            block: 8,
        },
        Collective::Send {
            dst: 0,
            len: 4,
            sent: 0,
        },
        Collective::Recv {
            src: 2,
            len: 4,
            taken: 0,
        },
    ];
    let mut rng = StdRng::seed_from_u64(7);
    let mut reused = 0;
    for group in [vec![0, 1], vec![0, 1, 2], vec![1, 4, 6, 9]] {
        let layout = Layout::new(group.len(), SMALL, p2p::bytes(group.len()));
        for me in 0..group.len() {
            let mut reusing = Steps::new(layout, &group, me);
            for _ in 0..200 {
                let collective = shapes[rng.random_range(0..shapes.len())];
                let valid = |peer: usize| peer < group.len() && peer != me;
                let collective = match collective {
                    Collective::Send { dst, .. } | Collective::Recv { src: dst, .. }
                        if !valid(dst) =>
                    {
                        Collective::Barrier
                    }
                    Collective::Broadcast { len, .. } => Collective::Broadcast {
                        root: rng.random_range(0..group.len()),
                        len,
                    },
                    c => c,
                };
                // Steps the ranks published meanwhile (their values are whatever the
                // schedule said; only where the machine starts from matters here).
                reusing.step = reusing.step.wrapping_add(rng.random_range(0..3));
                let mut fresh = Steps::new(layout, &group, me);
                fresh.step = reusing.step;
                reusing.start(collective, Phase::AllSum).unwrap();
                fresh.start(collective, Phase::AllSum).unwrap();
                reused += usize::from(reusing.shift != 0);
                assert_eq!(
                    (planned(&reusing), reusing.pieces, reusing.next),
                    (planned(&fresh), fresh.pieces, fresh.next),
                    "{collective:?} at step {} of rank {me} of {group:?}",
                    fresh.step
                );
                // Every operation done, as the engine does them.
                while !reusing.is_finished() {
                    if reusing.poll_transmit().is_some() {
                        reusing.handle_sent();
                    } else {
                        reusing.handle_received();
                    }
                }
            }
        }
    }
    assert!(reused > 100, "{reused} plans reused");
}

/// The current piece's operations as the polls hand them out (their step values moved).
fn planned(steps: &Steps) -> Vec<Op> {
    steps.ops.iter().map(|op| steps.shifted(op)).collect()
}
