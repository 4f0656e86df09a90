//! The collective benchmark sweep, run inside every rank of a group.
//!
//! Methodology (the same as `../shared/anchors/mlx_bench.py`, so figures compare):
//!
//! - per size: a barrier, warm-up iterations, then rank 0 picks an iteration count from the
//!   warm-up time (about `target` seconds of timed iterations, within `min_iters..=max_iters`)
//!   and every rank learns it through an all_sum, so all ranks run the same count;
//! - each iteration is timed on its own; each rank computes its min, median, p99 and max;
//!   the reported median is the largest rank's median (the slowest rank sets the pace);
//! - sizes are bytes per rank. all_sum: algorithm bandwidth = size / t, bus bandwidth =
//!   algbw · 2(n−1)/n (as nccl-tests). all_gather: algbw = n·size / t, busbw =
//!   algbw · (n−1)/n. sum_scatter: size is the input, algbw = size / t, busbw =
//!   algbw · (n−1)/n. sendrecv: a ping-pong between ranks 0 and 1, latency is half the
//!   round trip, algbw = busbw = size / latency;
//! - every result is checked exactly (integer-valued f32) before and after the timed
//!   iterations. Timed all_sums run on zeros, so the in-place result stays exact however
//!   many iterations run.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

use nuvec_distributed::{Group, Result};
use serde::{Deserialize, Serialize};

/// A collective the sweep measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// `all_sum` of f32.
    AllSum,
    /// `all_gather` of f32.
    AllGather,
    /// `sum_scatter` of f32.
    SumScatter,
    /// Ping-pong `send`/`recv` between ranks 0 and 1.
    #[serde(rename = "sendrecv")]
    SendRecv,
}

impl Op {
    /// The op's name, as on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Op::AllSum => "all_sum",
            Op::AllGather => "all_gather",
            Op::SumScatter => "sum_scatter",
            Op::SendRecv => "sendrecv",
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Op {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        [Op::AllSum, Op::AllGather, Op::SumScatter, Op::SendRecv]
            .into_iter()
            .find(|op| op.name() == s)
            .ok_or_else(|| {
                format!("unknown op {s:?}: expected all_sum, all_gather, sum_scatter or sendrecv")
            })
    }
}

/// What to measure.
#[derive(Clone, Debug)]
pub struct Sweep {
    /// Collectives, in order.
    pub ops: Vec<Op>,
    /// Bytes per rank, in order; multiples of 4.
    pub sizes: Vec<usize>,
    /// Timed seconds to aim for per size.
    pub target: Duration,
    /// Warm-up iterations per size (fewer for sizes of 16 MiB and more).
    pub warmup: usize,
    /// Bounds on the timed iterations per size.
    pub min_iters: usize,
    /// See `min_iters`.
    pub max_iters: usize,
}

/// The sizes of the anchors' sweep: 4 B to 64 MiB.
pub const DEFAULT_SIZES: [usize; 8] = [
    4,
    64,
    1 << 10,
    8 << 10,
    64 << 10,
    1 << 20,
    16 << 20,
    64 << 20,
];

impl Default for Sweep {
    fn default() -> Self {
        Self {
            ops: vec![Op::AllSum],
            sizes: DEFAULT_SIZES.to_vec(),
            target: Duration::from_millis(1000),
            warmup: 20,
            min_iters: 5,
            max_iters: 20_000,
        }
    }
}

/// One measured (op, size): what rank 0 reports.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Measurement {
    /// The collective.
    pub op: Op,
    /// Ranks in the group.
    pub ranks: usize,
    /// Bytes per rank.
    pub bytes: usize,
    /// Timed iterations.
    pub iters: usize,
    /// Fastest iteration on any rank, µs.
    pub min_us: f64,
    /// The largest per-rank median, µs.
    pub median_us: f64,
    /// The largest per-rank 99th percentile, µs.
    pub p99_us: f64,
    /// Slowest iteration on any rank, µs.
    pub max_us: f64,
    /// Algorithm bandwidth at the median, GB/s (1e9 bytes/s).
    pub algbw_gbs: f64,
    /// Bus bandwidth at the median, GB/s.
    pub busbw_gbs: f64,
    /// Whether every checked result was exact.
    pub correct: bool,
}

/// Runs the sweep on `group`. Every rank must call it with the same sweep; the result is
/// complete on rank 0 (other ranks get their own view).
///
/// # Errors
///
/// Any collective's error.
pub fn run(group: &Group, sweep: &Sweep) -> Result<Vec<Measurement>> {
    let mut out = Vec::new();
    for &op in &sweep.ops {
        if op == Op::SendRecv && group.size() < 2 {
            continue;
        }
        for &bytes in &sweep.sizes {
            out.push(measure(group, sweep, op, bytes)?);
        }
    }
    Ok(out)
}

fn measure(group: &Group, sweep: &Sweep, op: Op, bytes: usize) -> Result<Measurement> {
    let (rank, n) = (group.rank(), group.size());
    let elems = (bytes / 4).max(1);
    let mut work = Work::new(op, elems, rank, n);

    group.barrier()?;
    let correct_before = work.verify(group)?;
    let warmup = if bytes >= 16 << 20 {
        (sweep.warmup / 5).max(2)
    } else {
        sweep.warmup
    };
    let mut warm = Vec::with_capacity(warmup);
    for _ in 0..warmup {
        let t = Instant::now();
        work.step(group)?;
        warm.push(t.elapsed());
    }
    warm.sort();
    let per_iter = warm
        .get(warm.len() / 2)
        .copied()
        .unwrap_or_default()
        .max(Duration::from_nanos(100));
    let wanted = (sweep.target.as_secs_f64() / per_iter.as_secs_f64()) as u64;
    let mut iters = [if rank == 0 {
        wanted.clamp(sweep.min_iters as u64, sweep.max_iters as u64)
    } else {
        0
    }];
    group.all_sum(&mut iters)?;
    let iters = iters[0] as usize;

    group.barrier()?;
    let mut times = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        work.step(group)?;
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let correct_after = work.verify(group)?;

    if op == Op::SendRecv {
        // A ping-pong iteration is a round trip: report one way.
        times.iter_mut().for_each(|t| *t /= 2.0);
    }
    times.sort_by(f64::total_cmp);
    let pick = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    let mine = [
        times[0],
        pick(0.5),
        pick(0.99),
        times[times.len() - 1],
        f64::from(u8::from(correct_before && correct_after)),
    ];
    let mut all = vec![0.0f64; mine.len() * n];
    group.all_gather(&mine, &mut all)?;
    let ranks: Vec<&[f64]> = all.chunks(mine.len()).collect();
    let idle = |r: usize| op == Op::SendRecv && r > 1; // ranks that only wait at barriers
    let active = || {
        ranks
            .iter()
            .enumerate()
            .filter(|(r, _)| !idle(*r))
            .map(|(_, s)| *s)
    };
    let median_us = active().map(|s| s[1]).fold(0.0, f64::max);
    let seconds = median_us / 1e6;
    let nf = n as f64;
    let (algbw, busbw) = match op {
        Op::AllSum => (
            bytes as f64 / seconds,
            bytes as f64 / seconds * 2.0 * (nf - 1.0) / nf,
        ),
        Op::AllGather => (
            nf * bytes as f64 / seconds,
            bytes as f64 / seconds * (nf - 1.0),
        ),
        Op::SumScatter => (
            bytes as f64 / seconds,
            bytes as f64 / seconds * (nf - 1.0) / nf,
        ),
        Op::SendRecv => (bytes as f64 / seconds, bytes as f64 / seconds),
    };
    Ok(Measurement {
        op,
        ranks: n,
        bytes,
        iters,
        min_us: active().map(|s| s[0]).fold(f64::INFINITY, f64::min),
        median_us,
        p99_us: active().map(|s| s[2]).fold(0.0, f64::max),
        max_us: active().map(|s| s[3]).fold(0.0, f64::max),
        algbw_gbs: algbw / 1e9,
        busbw_gbs: busbw / 1e9,
        correct: ranks.iter().all(|s| s[4] == 1.0),
    })
}

/// The buffers of one (op, size) and how to run and check one iteration.
struct Work {
    op: Op,
    rank: usize,
    n: usize,
    /// all_sum: the in-place array; sendrecv: the message.
    data: Vec<f32>,
    /// all_gather / sum_scatter input.
    input: Vec<f32>,
    /// all_gather / sum_scatter output.
    output: Vec<f32>,
}

/// The verification value of element `i` on rank `r`: exact in f32 for any sum of a few
/// ranks.
fn value(i: usize, r: usize) -> f32 {
    (i % 251) as f32 + 1000.0 * r as f32
}

impl Work {
    fn new(op: Op, elems: usize, rank: usize, n: usize) -> Self {
        let (data, input, output) = match op {
            Op::AllSum | Op::SendRecv => (vec![0.0; elems], Vec::new(), Vec::new()),
            Op::AllGather => (Vec::new(), vec![0.0; elems], vec![0.0; elems * n]),
            // Size is the input per rank; it must split into n blocks.
            Op::SumScatter => {
                let per = elems.div_ceil(n);
                (Vec::new(), vec![0.0; per * n], vec![0.0; per])
            }
        };
        Self {
            op,
            rank,
            n,
            data,
            input,
            output,
        }
    }

    fn step(&mut self, g: &Group) -> Result<()> {
        match self.op {
            Op::AllSum => g.all_sum(&mut self.data),
            Op::AllGather => g.all_gather(&self.input, &mut self.output),
            Op::SumScatter => g.sum_scatter(&self.input, &mut self.output),
            Op::SendRecv => match self.rank {
                0 => {
                    g.send(&self.data, 1)?;
                    g.recv(&mut self.data, 1)
                }
                1 => {
                    g.recv(&mut self.data, 0)?;
                    g.send(&self.data, 0)
                }
                _ => Ok(()),
            },
        }
    }

    /// Runs one iteration on known values and checks the result exactly; leaves the
    /// buffers zeroed for the timed iterations.
    fn verify(&mut self, g: &Group) -> Result<bool> {
        let (r, n) = (self.rank, self.n);
        let ok = match self.op {
            Op::AllSum => {
                self.data
                    .iter_mut()
                    .enumerate()
                    .for_each(|(i, x)| *x = value(i, r));
                g.all_sum(&mut self.data)?;
                let ranks: f32 = (0..n).map(|q| 1000.0 * q as f32).sum();
                self.data
                    .iter()
                    .enumerate()
                    .all(|(i, &x)| x == (i % 251) as f32 * n as f32 + ranks)
            }
            Op::AllGather => {
                self.input
                    .iter_mut()
                    .enumerate()
                    .for_each(|(i, x)| *x = value(i, r));
                g.all_gather(&self.input, &mut self.output)?;
                let k = self.input.len();
                self.output
                    .iter()
                    .enumerate()
                    .all(|(j, &x)| x == value(j % k, j / k))
            }
            Op::SumScatter => {
                self.input
                    .iter_mut()
                    .enumerate()
                    .for_each(|(i, x)| *x = value(i, r));
                g.sum_scatter(&self.input, &mut self.output)?;
                let k = self.output.len();
                let ranks: f32 = (0..n).map(|q| 1000.0 * q as f32).sum();
                self.output
                    .iter()
                    .enumerate()
                    .all(|(j, &x)| x == ((r * k + j) % 251) as f32 * n as f32 + ranks)
            }
            Op::SendRecv => {
                self.data
                    .iter_mut()
                    .enumerate()
                    .for_each(|(i, x)| *x = value(i, 0));
                self.step(g)?;
                r > 1 || self.data.iter().enumerate().all(|(i, &x)| x == value(i, 0))
            }
        };
        self.data.fill(0.0);
        self.input.fill(0.0);
        Ok(ok)
    }
}

/// A human-readable size: `4 B`, `8 KiB`, `64 MiB`.
pub fn human(bytes: usize) -> String {
    for (unit, div) in [("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if bytes >= div && bytes.is_multiple_of(div) {
            return format!("{} {unit}", bytes / div);
        }
    }
    format!("{bytes} B")
}

/// A latency in µs, or ms above 1000 µs.
pub fn micros(us: f64) -> String {
    if us >= 1000.0 {
        format!("{:.2} ms", us / 1000.0)
    } else {
        format!("{us:.1} µs")
    }
}

/// Prints the measurements as a table, one per op.
pub fn print_table(measurements: &[Measurement]) {
    let mut last = None;
    for m in measurements {
        if last != Some(m.op) {
            println!(
                "\n{} (n={}), latency per rank: median of each rank, the slowest rank's",
                m.op, m.ranks
            );
            println!(
                "{:>8} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9} {:>6} {:>3}",
                "size", "min", "median", "p99", "max", "algbw", "busbw", "iters", "ok"
            );
            last = Some(m.op);
        }
        println!(
            "{:>8} {:>10} {:>10} {:>10} {:>10} {:>8.3}G {:>8.3}G {:>6} {:>3}",
            human(m.bytes),
            micros(m.min_us),
            micros(m.median_us),
            micros(m.p99_us),
            micros(m.max_us),
            m.algbw_gbs,
            m.busbw_gbs,
            m.iters,
            if m.correct { "yes" } else { "NO" }
        );
    }
}
