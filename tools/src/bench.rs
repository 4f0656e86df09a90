//! The collective benchmark sweep, run inside every rank of a group.
//!
//! Methodology (the same as `tools/anchors/mlx_bench.py`, so figures compare):
//!
//! - per case (collective, dtype, reduction, size): a barrier, warm-up iterations, then
//!   rank 0 picks an iteration count from the warm-up time (about `target` seconds of timed
//!   iterations, within `min_iters..=max_iters`) and every rank learns it through an
//!   all_sum, so all ranks run the same count;
//! - each iteration is timed on its own; each rank computes its min, median, p99 and max;
//!   the reported median is the largest rank's median (the slowest rank sets the pace);
//! - sizes are bytes per rank, a whole number of elements. all_sum (and all_max, all_min):
//!   algorithm bandwidth = size / t, bus bandwidth = algbw · 2(n−1)/n (as nccl-tests).
//!   all_gather: algbw = n·size / t, busbw = algbw · (n−1)/n. sum_scatter: size is the
//!   input, algbw = size / t, busbw = algbw · (n−1)/n. sendrecv: a ping-pong between ranks
//!   0 and 1, latency is half the round trip, algbw = busbw = size / latency;
//! - every result is checked exactly, element by element, before and after the timed
//!   iterations, on every rank: the inputs are small integers, exact in every dtype and in
//!   any sum of the ranks, so the expected value of each element is known. `wrong` counts
//!   the elements that differ, over both checks and all ranks (nccl-tests' `#wrong`).
//!   Timed iterations run on zeros, so an in-place result stays the same however many
//!   iterations run.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

use nuvec_distributed_engine::{
    Complex64, DType, Element, Error, Group, ReduceOp, Result, bf16, f16,
};
use serde::{Deserialize, Serialize};

/// A collective the sweep measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// The all-reduce: `all_sum`, or `all_max` / `all_min` with another [`RedOp`].
    AllSum,
    /// `all_gather`.
    AllGather,
    /// `sum_scatter` (sum only).
    SumScatter,
    /// Ping-pong `send`/`recv` between ranks 0 and 1.
    #[serde(rename = "sendrecv")]
    SendRecv,
}

impl Op {
    /// Every collective, in the order tables list them.
    pub const ALL: [Op; 4] = [Op::AllSum, Op::AllGather, Op::SumScatter, Op::SendRecv];

    /// The op's name, as on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Op::AllSum => "all_sum",
            Op::AllGather => "all_gather",
            Op::SumScatter => "sum_scatter",
            Op::SendRecv => "sendrecv",
        }
    }

    /// Whether the collective reduces (and so has a [`RedOp`]).
    pub fn reduces(self) -> bool {
        matches!(self, Op::AllSum | Op::SumScatter)
    }
}

/// `Display` as the type's `name()`, and `FromStr` back from it (among `ALL`, surrounding
/// white space ignored), for the sweep's enums; an unknown name is an error naming `what`
/// and the `expected` names.
macro_rules! by_name {
    ($type:ty, $what:literal, $expected:literal) => {
        impl fmt::Display for $type {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }

        impl FromStr for $type {
            type Err = String;

            fn from_str(s: &str) -> std::result::Result<Self, String> {
                <$type>::ALL
                    .into_iter()
                    .find(|v| v.name() == s.trim())
                    .ok_or_else(|| format!("unknown {} {s:?}: expected {}", $what, $expected))
            }
        }
    };
}

by_name!(Op, "op", "all_sum, all_gather, sum_scatter or sendrecv");

/// The reduction of an all-reduce (nccl-tests' `redop`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RedOp {
    /// `all_sum`.
    Sum,
    /// `all_max`.
    Max,
    /// `all_min`.
    Min,
}

impl RedOp {
    /// Every reduction.
    pub const ALL: [RedOp; 3] = [RedOp::Sum, RedOp::Max, RedOp::Min];

    /// Its name, as on the command line, in JSON and in the `redop` column.
    pub fn name(self) -> &'static str {
        match self {
            RedOp::Sum => "sum",
            RedOp::Max => "max",
            RedOp::Min => "min",
        }
    }

    fn reduce_op(self) -> ReduceOp {
        match self {
            RedOp::Sum => ReduceOp::Sum,
            RedOp::Max => ReduceOp::Max,
            RedOp::Min => ReduceOp::Min,
        }
    }

    /// The expected result of reducing `values` (small integers) this way.
    fn expect(self, values: impl Iterator<Item = i64>) -> i64 {
        match self {
            RedOp::Sum => values.sum(),
            RedOp::Max => values.max().unwrap_or(0),
            RedOp::Min => values.min().unwrap_or(0),
        }
    }
}

by_name!(RedOp, "reduction", "sum, max or min");

/// Parses a dtype: MLX's name (`float32`, `bfloat16`, `complex64`, ...) or Rust's
/// (`f32`, `bf16`, `u8`, ...).
///
/// # Errors
///
/// A name of neither kind, with the names there are.
pub fn parse_dtype(s: &str) -> std::result::Result<DType, String> {
    let s = s.trim();
    let rust = |d: DType| match d {
        DType::Bool => "bool",
        DType::U8 => "u8",
        DType::U16 => "u16",
        DType::U32 => "u32",
        DType::U64 => "u64",
        DType::I8 => "i8",
        DType::I16 => "i16",
        DType::I32 => "i32",
        DType::I64 => "i64",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::F32 => "f32",
        DType::F64 => "f64",
        DType::Complex64 => "c64",
        _ => d.name(),
    };
    DType::ALL
        .into_iter()
        .find(|&d| d.name() == s || rust(d) == s)
        .ok_or_else(|| {
            let names: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
            format!("unknown dtype {s:?}: expected one of {}", names.join(", "))
        })
}

/// Serde for a [`DType`], by MLX's name.
mod dtype_name {
    use nuvec_distributed_engine::DType;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &DType, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(d.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DType, D::Error> {
        let name = String::deserialize(d)?;
        super::parse_dtype(&name).map_err(serde::de::Error::custom)
    }
}

/// What to measure.
#[derive(Clone, Debug)]
pub struct Sweep {
    /// Collectives, in order.
    pub ops: Vec<Op>,
    /// Reductions of the all-reduce; sum_scatter runs when `Sum` is among them.
    pub redops: Vec<RedOp>,
    /// Element types, in order.
    pub dtypes: Vec<DType>,
    /// Bytes per rank, in order; each is rounded down to whole elements, at least one.
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
            redops: vec![RedOp::Sum],
            dtypes: vec![DType::F32],
            sizes: DEFAULT_SIZES.to_vec(),
            target: Duration::from_millis(1000),
            warmup: 20,
            min_iters: 5,
            max_iters: 20_000,
        }
    }
}

/// One thing the sweep measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Case {
    /// The collective.
    pub op: Op,
    /// Its reduction, for those that reduce.
    pub redop: Option<RedOp>,
    /// The element type.
    #[serde(with = "dtype_name")]
    pub dtype: DType,
    /// Bytes per rank, as asked for.
    pub bytes: usize,
}

impl Case {
    /// Elements per rank: `bytes` in whole elements, at least one.
    pub fn count(&self) -> usize {
        (self.bytes / self.dtype.size()).max(1)
    }
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.op, self.dtype)?;
        if let Some(redop) = self.redop {
            write!(f, " {redop}")?;
        }
        write!(f, " {}", human(self.bytes))
    }
}

impl Sweep {
    /// Every case, in the order they run and are reported: per collective, per dtype, per
    /// reduction, every size. sendrecv is left out on a group of one (`ranks` < 2).
    pub fn cases(&self, ranks: usize) -> Vec<Case> {
        let mut out = Vec::new();
        for &op in &self.ops {
            if op == Op::SendRecv && ranks < 2 {
                continue;
            }
            let redops: Vec<Option<RedOp>> = match op {
                Op::AllSum => self.redops.iter().copied().map(Some).collect(),
                // The library scatters sums only.
                Op::SumScatter if self.redops.contains(&RedOp::Sum) => vec![Some(RedOp::Sum)],
                Op::SumScatter => Vec::new(),
                Op::AllGather | Op::SendRecv => vec![None],
            };
            for &dtype in &self.dtypes {
                for &redop in &redops {
                    for &bytes in &self.sizes {
                        out.push(Case {
                            op,
                            redop,
                            dtype,
                            bytes,
                        });
                    }
                }
            }
        }
        out
    }
}

/// One measured case: what rank 0 reports.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    /// The collective.
    pub op: Op,
    /// Its reduction (`None` for all_gather and sendrecv).
    pub redop: Option<RedOp>,
    /// The element type.
    #[serde(with = "dtype_name")]
    pub dtype: DType,
    /// Ranks in the group.
    pub ranks: usize,
    /// Bytes per rank (sum_scatter: its input, whole blocks of `ranks`).
    pub bytes: usize,
    /// Elements per rank, of `bytes`.
    pub count: usize,
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
    /// Elements that differed from the expected value, over both checks and every rank.
    pub wrong: u64,
}

impl Measurement {
    /// Whether every checked element was exact.
    pub fn correct(&self) -> bool {
        self.wrong == 0
    }
}

/// Runs the sweep on `group`. Every rank must call it with the same sweep; the result is
/// complete on rank 0 (other ranks get their own view).
///
/// # Errors
///
/// Any collective's error.
pub fn run(group: &Group, sweep: &Sweep) -> Result<Vec<Measurement>> {
    run_with(group, sweep, |_, _| {})
}

/// [`run`], calling `starting(index, case)` before each case (for a progress display).
///
/// # Errors
///
/// Any collective's error.
pub fn run_with(
    group: &Group,
    sweep: &Sweep,
    mut starting: impl FnMut(usize, &Case),
) -> Result<Vec<Measurement>> {
    let mut out = Vec::new();
    for (i, case) in sweep.cases(group.size()).iter().enumerate() {
        starting(i, case);
        out.push(measure_case(group, sweep, case)?);
    }
    Ok(out)
}

fn measure_case(group: &Group, sweep: &Sweep, case: &Case) -> Result<Measurement> {
    match case.dtype {
        DType::Bool => measure::<bool>(group, sweep, case),
        DType::U8 => measure::<u8>(group, sweep, case),
        DType::U16 => measure::<u16>(group, sweep, case),
        DType::U32 => measure::<u32>(group, sweep, case),
        DType::U64 => measure::<u64>(group, sweep, case),
        DType::I8 => measure::<i8>(group, sweep, case),
        DType::I16 => measure::<i16>(group, sweep, case),
        DType::I32 => measure::<i32>(group, sweep, case),
        DType::I64 => measure::<i64>(group, sweep, case),
        DType::F16 => measure::<f16>(group, sweep, case),
        DType::BF16 => measure::<bf16>(group, sweep, case),
        DType::F32 => measure::<f32>(group, sweep, case),
        DType::F64 => measure::<f64>(group, sweep, case),
        DType::Complex64 => measure::<Complex64>(group, sweep, case),
        // DType is non-exhaustive: a dtype the library adds later needs a Sample here.
        other => Err(Error::Unsupported(format!(
            "nuvec bench cannot measure {other} yet: it has no sample values for it"
        ))),
    }
}

/// An element type the sweep can fill with small integers and check exactly.
pub trait Sample: Element + PartialEq {
    /// `v` (a small integer, 0..=127) in this type. `bool` is `v != 0`, so its sum (or) and
    /// max (or) and min (and) come out of the integer ones; complex64 is `v - vi`, whose
    /// lexicographic max and min are those of `v`.
    fn small(v: i64) -> Self;
}

macro_rules! int_sample {
    ($($t:ty),*) => {$(
        impl Sample for $t {
            fn small(v: i64) -> Self {
                v as $t
            }
        }
    )*};
}
int_sample!(u8, u16, u32, u64, i8, i16, i32, i64);

impl Sample for bool {
    fn small(v: i64) -> Self {
        v != 0
    }
}
impl Sample for f16 {
    fn small(v: i64) -> Self {
        f16::from_f32(v as f32)
    }
}
impl Sample for bf16 {
    fn small(v: i64) -> Self {
        bf16::from_f32(v as f32)
    }
}
impl Sample for f32 {
    fn small(v: i64) -> Self {
        v as f32
    }
}
impl Sample for f64 {
    fn small(v: i64) -> Self {
        v as f64
    }
}
impl Sample for Complex64 {
    fn small(v: i64) -> Self {
        Complex64::new(v as f32, -(v as f32))
    }
}

/// The input value of element `i` on rank `r` of `n`: an integer in `0..=m`, with `m` small
/// enough that a sum over `n` ranks stays within `i8` (and so is exact in every dtype,
/// bfloat16's 8-bit significand included). Neighbouring ranks always differ, so a
/// misplaced block or an unreduced value shows.
pub fn input(i: usize, r: usize, n: usize) -> i64 {
    let m = (127 / n.max(1)).clamp(1, 10);
    ((i * 7 + r) % (m + 1)) as i64
}

/// How many of `got` differ from `expected(j)`.
pub fn count_wrong<T: Sample>(got: &[T], expected: impl Fn(usize) -> i64) -> u64 {
    got.iter()
        .enumerate()
        .filter(|&(j, x)| *x != T::small(expected(j)))
        .count() as u64
}

fn measure<T: Sample>(group: &Group, sweep: &Sweep, case: &Case) -> Result<Measurement> {
    let (rank, n) = (group.rank(), group.size());
    let op = case.op;
    let mut work = Work::<T>::new(case, rank, n);

    group.barrier()?;
    let wrong_before = work.verify(group)?;
    let warmup = if case.bytes >= 16 << 20 {
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
    // Rank 0 alone decides, and every rank learns its count: no rank's own timer may set
    // a loop count, or the ranks would run different numbers of collectives.
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
    let wrong_after = work.verify(group)?;

    if op == Op::SendRecv {
        // A ping-pong iteration is a round trip: report one way.
        times.iter_mut().for_each(|t| *t /= 2.0);
    }
    times.sort_by(f64::total_cmp);
    let (first, last) = match (times.first(), times.last()) {
        (Some(&a), Some(&b)) => (a, b),
        _ => (0.0, 0.0),
    };
    let pick = |q: f64| {
        times
            .get(((times.len().max(1) - 1) as f64 * q).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    let mine = [
        first,
        pick(0.5),
        pick(0.99),
        last,
        (wrong_before + wrong_after) as f64,
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
    let bytes = work.bytes();
    let (algbw, busbw) = bandwidths(op, n, bytes, median_us);
    Ok(Measurement {
        op,
        redop: case.redop,
        dtype: case.dtype,
        ranks: n,
        bytes,
        count: bytes / case.dtype.size(),
        iters,
        min_us: active().map(|s| s[0]).fold(f64::INFINITY, f64::min),
        median_us,
        p99_us: active().map(|s| s[2]).fold(0.0, f64::max),
        max_us: active().map(|s| s[3]).fold(0.0, f64::max),
        algbw_gbs: algbw,
        busbw_gbs: busbw,
        wrong: ranks.iter().map(|s| s[4] as u64).sum(),
    })
}

/// Algorithm and bus bandwidth, GB/s, of `op` moving `bytes` per rank across `n` ranks in
/// `median_us` (see the module's docs); zero when no time was measured.
pub fn bandwidths(op: Op, n: usize, bytes: usize, median_us: f64) -> (f64, f64) {
    if median_us <= 0.0 || !median_us.is_finite() {
        return (0.0, 0.0);
    }
    let rate = bytes as f64 / (median_us / 1e6) / 1e9;
    let nf = n as f64;
    match op {
        Op::AllSum => (rate, rate * 2.0 * (nf - 1.0) / nf),
        Op::AllGather => (nf * rate, rate * (nf - 1.0)),
        Op::SumScatter => (rate, rate * (nf - 1.0) / nf),
        Op::SendRecv => (rate, rate),
    }
}

/// The buffers of one case and how to run and check one iteration.
struct Work<T> {
    op: Op,
    redop: RedOp,
    rank: usize,
    n: usize,
    /// all_sum: the in-place array; sendrecv: the message.
    data: Vec<T>,
    /// all_gather / sum_scatter input.
    input: Vec<T>,
    /// all_gather / sum_scatter output.
    output: Vec<T>,
}

impl<T: Sample> Work<T> {
    fn new(case: &Case, rank: usize, n: usize) -> Self {
        let elems = case.count();
        let zero = T::small(0);
        let (data, input, output) = match case.op {
            Op::AllSum | Op::SendRecv => (vec![zero; elems], Vec::new(), Vec::new()),
            Op::AllGather => (Vec::new(), vec![zero; elems], vec![zero; elems * n]),
            // Size is the input per rank; it must split into n blocks.
            Op::SumScatter => {
                let per = elems.div_ceil(n);
                (Vec::new(), vec![zero; per * n], vec![zero; per])
            }
        };
        Self {
            op: case.op,
            redop: case.redop.unwrap_or(RedOp::Sum),
            rank,
            n,
            data,
            input,
            output,
        }
    }

    /// Bytes per rank actually moved: the data, or the input.
    fn bytes(&self) -> usize {
        (self.data.len() + self.input.len()) * size_of::<T>()
    }

    fn step(&mut self, g: &Group) -> Result<()> {
        match self.op {
            Op::AllSum => g.all_reduce(self.redop.reduce_op(), &mut self.data),
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

    /// Runs one iteration on known values and counts the elements of the result that are
    /// wrong; leaves the buffers zeroed for the timed iterations.
    fn verify(&mut self, g: &Group) -> Result<u64> {
        let (r, n, redop) = (self.rank, self.n, self.redop);
        let fill = |buf: &mut [T]| {
            buf.iter_mut()
                .enumerate()
                .for_each(|(i, x)| *x = T::small(input(i, r, n)));
        };
        let wrong = match self.op {
            Op::AllSum => {
                fill(&mut self.data);
                self.step(g)?;
                count_wrong(&self.data, |i| redop.expect((0..n).map(|q| input(i, q, n))))
            }
            Op::AllGather => {
                fill(&mut self.input);
                self.step(g)?;
                let k = self.input.len();
                count_wrong(&self.output, |j| input(j % k, j / k, n))
            }
            Op::SumScatter => {
                fill(&mut self.input);
                self.step(g)?;
                let k = self.output.len();
                count_wrong(&self.output, |j| {
                    RedOp::Sum.expect((0..n).map(|q| input(r * k + j, q, n)))
                })
            }
            Op::SendRecv => {
                // Each rank starts from its own values: rank 1 must end with rank 0's, and
                // rank 0 must get them back.
                fill(&mut self.data);
                self.step(g)?;
                if r > 1 {
                    0
                } else {
                    count_wrong(&self.data, |i| input(i, 0, n))
                }
            }
        };
        let zero = T::small(0);
        self.data.fill(zero);
        self.input.fill(zero);
        Ok(wrong)
    }
}

/// One case measured on an unkeyed native group and on a keyed (sealed) one, as
/// `nuvec bench --sealed` reports it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SealedRow {
    /// The case (its fields appear in the row's JSON as the row's own).
    #[serde(flatten)]
    pub case: Case,
    /// Ranks in the group.
    pub ranks: usize,
    /// The unkeyed median, µs.
    pub unkeyed_us: f64,
    /// The keyed median, µs.
    pub keyed_us: f64,
    /// `keyed_us / unkeyed_us`: above 1, sealing costs that much time.
    pub time_ratio: f64,
    /// The unkeyed bus bandwidth, GB/s.
    pub unkeyed_busbw_gbs: f64,
    /// The keyed bus bandwidth, GB/s.
    pub keyed_busbw_gbs: f64,
    /// The keyed bus bandwidth as a percentage of the unkeyed one.
    pub busbw_percent: f64,
    /// Wrong elements of the two runs together.
    pub wrong: u64,
}

/// Pairs the unkeyed and keyed measurements of the same case (collective, reduction,
/// dtype, size), in the unkeyed order. Both runs ran the same sweep, so every case is in
/// both; one missing from either side is left out.
pub fn sealed_rows(unkeyed: &[Measurement], keyed: &[Measurement]) -> Vec<SealedRow> {
    let ratio = |a: f64, b: f64| {
        if b > 0.0 && a.is_finite() {
            a / b
        } else {
            f64::NAN
        }
    };
    unkeyed
        .iter()
        .filter_map(|u| {
            let k = keyed.iter().find(|k| {
                (k.op, k.redop, k.dtype, k.bytes, k.ranks)
                    == (u.op, u.redop, u.dtype, u.bytes, u.ranks)
            })?;
            Some(SealedRow {
                case: Case {
                    op: u.op,
                    redop: u.redop,
                    dtype: u.dtype,
                    bytes: u.bytes,
                },
                ranks: u.ranks,
                unkeyed_us: u.median_us,
                keyed_us: k.median_us,
                time_ratio: ratio(k.median_us, u.median_us),
                unkeyed_busbw_gbs: u.busbw_gbs,
                keyed_busbw_gbs: k.busbw_gbs,
                busbw_percent: 100.0 * ratio(k.busbw_gbs, u.busbw_gbs),
                wrong: u.wrong + k.wrong,
            })
        })
        .collect()
}

/// The side-by-side table of [`sealed_rows`] for one rank count, whose keyed ranks sealed
/// on `threads` threads each: per case, both medians, keyed / unkeyed time, both bus
/// bandwidths and keyed as % of unkeyed.
pub fn sealed_table(ranks: usize, threads: usize, rows: &[SealedRow]) -> String {
    let mut out = format!(
        "\n# sealed (AES-256-GCM, {threads} sealing thread(s) per rank) beside unkeyed, native \
         wire over TCP, {ranks} ranks\n"
    );
    out.push_str(&format!(
        "#{:>11} {:>12} {:>10} {:>6} {:>10} {:>10} {:>7} {:>9} {:>9} {:>7}\n",
        "size", "op", "type", "redop", "unkeyed", "keyed", "keyed/", "unkeyed", "keyed", "keyed"
    ));
    out.push_str(&format!(
        "#{:>11} {:>12} {:>10} {:>6} {:>10} {:>10} {:>7} {:>9} {:>9} {:>7}\n",
        "(B)", "", "", "", "(µs)", "(µs)", "unkeyed", "busbw", "busbw", "busbw"
    ));
    out.push_str(&format!(
        "#{:>11} {:>12} {:>10} {:>6} {:>10} {:>10} {:>7} {:>9} {:>9} {:>7}\n",
        "", "", "", "", "", "", "", "(GB/s)", "(GB/s)", "(%)"
    ));
    for r in rows {
        let percent = if r.busbw_percent.is_finite() {
            format!("{:.0}%", r.busbw_percent)
        } else {
            "-".into()
        };
        let times = if r.time_ratio.is_finite() {
            format!("{:.2}", r.time_ratio)
        } else {
            "-".into()
        };
        out.push_str(&format!(
            "{:>12} {:>12} {:>10} {:>6} {:>10} {:>10} {:>7} {:>9.3} {:>9.3} {:>7}\n",
            r.case.bytes,
            r.case.op.name(),
            r.case.dtype.name(),
            r.case.redop.map_or("none", RedOp::name),
            micros(r.unkeyed_us),
            micros(r.keyed_us),
            times,
            r.unkeyed_busbw_gbs,
            r.keyed_busbw_gbs,
            percent,
        ));
    }
    out
}

/// A human-readable size: `4 B`, `8 KiB`, `64 MiB`.
pub fn human(bytes: usize) -> String {
    for (unit, div) in [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if bytes >= div && bytes.is_multiple_of(div) {
            return format!("{} {unit}", bytes / div);
        }
    }
    format!("{bytes} B")
}

/// A latency in µs, always µs (a table column never mixes units): two decimals below
/// 100 µs, one below 10 ms, none above, as nccl-tests prints its time column.
pub fn micros(us: f64) -> String {
    if us >= 10_000.0 {
        format!("{us:.0}")
    } else if us >= 100.0 {
        format!("{us:.1}")
    } else {
        format!("{us:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::measurement;

    #[test]
    fn dtypes_parse_by_mlx_and_rust_names() {
        assert_eq!(parse_dtype("bfloat16"), Ok(DType::BF16));
        assert_eq!(parse_dtype("bf16"), Ok(DType::BF16));
        assert_eq!(parse_dtype("complex64"), Ok(DType::Complex64));
        assert_eq!(parse_dtype("c64"), Ok(DType::Complex64));
        assert_eq!(parse_dtype(" uint8"), Ok(DType::U8));
        for d in DType::ALL {
            assert_eq!(parse_dtype(d.name()), Ok(d), "{d}");
        }
        let err = parse_dtype("float8").unwrap_err();
        assert!(err.contains("float8") && err.contains("bfloat16"), "{err}");
    }

    #[test]
    fn ops_and_reductions_parse() {
        assert_eq!("max".parse::<RedOp>(), Ok(RedOp::Max));
        assert!("prod".parse::<RedOp>().unwrap_err().contains("prod"));
        assert_eq!("sum_scatter".parse::<Op>(), Ok(Op::SumScatter));
        assert!("alltoall".parse::<Op>().is_err());
    }

    #[test]
    fn cases_cover_each_op_dtype_and_reduction() {
        let sweep = Sweep {
            ops: vec![Op::AllSum, Op::AllGather, Op::SumScatter, Op::SendRecv],
            redops: vec![RedOp::Max, RedOp::Sum],
            dtypes: vec![DType::BF16, DType::F64],
            sizes: vec![4, 1024],
            ..Sweep::default()
        };
        let cases = sweep.cases(2);
        // all_sum: 2 dtypes × 2 reductions × 2 sizes; the others 2 × 2 each.
        assert_eq!(cases.len(), 8 + 4 + 4 + 4);
        assert_eq!(
            cases[0],
            Case {
                op: Op::AllSum,
                redop: Some(RedOp::Max),
                dtype: DType::BF16,
                bytes: 4
            }
        );
        assert_eq!(cases[2].redop, Some(RedOp::Sum));
        assert!(
            cases
                .iter()
                .filter(|c| c.op == Op::SumScatter)
                .all(|c| c.redop == Some(RedOp::Sum))
        );
        assert!(
            cases
                .iter()
                .filter(|c| !c.op.reduces())
                .all(|c| c.redop.is_none())
        );
        // A 4-byte size holds one float64 all the same.
        assert_eq!(cases[4].dtype, DType::F64);
        assert_eq!(cases[4].count(), 1);
        // No sum among the reductions: no sum_scatter; one rank: no sendrecv.
        let max_only = Sweep {
            redops: vec![RedOp::Min],
            ..sweep
        };
        let cases = max_only.cases(1);
        assert!(!cases.iter().any(|c| c.op == Op::SumScatter));
        assert!(!cases.iter().any(|c| c.op == Op::SendRecv));
    }

    #[test]
    fn inputs_stay_exact_and_differ_between_neighbours() {
        for n in [1, 2, 3, 8, 13, 64, 200] {
            for i in 0..50 {
                let total: i64 = (0..n).map(|r| input(i, r, n)).sum();
                assert!(total <= 127, "n={n} i={i}: {total}");
                if n > 1 {
                    assert_ne!(input(i, 0, n), input(i, 1, n));
                }
            }
        }
        // Sums of that size are exact in the narrowest float.
        assert_eq!(bf16::small(127).to_f32(), 127.0);
    }

    #[test]
    fn wrong_elements_are_counted() {
        let expected = |j: usize| RedOp::Sum.expect((0..3).map(|q| input(j, q, 3)));
        let mut got: Vec<bf16> = (0..100).map(|j| bf16::small(expected(j))).collect();
        assert_eq!(count_wrong(&got, expected), 0);
        got[3] = bf16::small(expected(3) + 1);
        got[97] = bf16::small(-1);
        assert_eq!(count_wrong(&got, expected), 2);
        // An unreduced result (rank 0's own input) is wrong wherever the others add to it.
        let own: Vec<f32> = (0..100).map(|j| input(j, 0, 3) as f32).collect();
        let missed = (0..100).filter(|&j| expected(j) != input(j, 0, 3)).count() as u64;
        assert!(missed > 50);
        assert_eq!(count_wrong(&own, expected), missed);
        // bool: a sum is an or, min an and.
        let max = |j: usize| RedOp::Min.expect([0, 1].into_iter().map(|q| (j + q) as i64 % 2));
        assert_eq!(count_wrong(&[false, false], max), 0);
        assert_eq!(count_wrong(&[true, false], max), 1);
        // complex64: a sign slip in the imaginary part is wrong.
        let c = [Complex64::new(3.0, 3.0)];
        assert_eq!(count_wrong(&c, |_| 3), 1);
    }

    #[test]
    fn bandwidths_follow_nccl_tests() {
        let (alg, bus) = bandwidths(Op::AllSum, 4, 1_000_000, 1000.0);
        assert!((alg - 1.0).abs() < 1e-12 && (bus - 1.5).abs() < 1e-12);
        let (alg, bus) = bandwidths(Op::AllGather, 4, 1_000_000, 1000.0);
        assert!((alg - 4.0).abs() < 1e-12 && (bus - 3.0).abs() < 1e-12);
        assert_eq!(bandwidths(Op::SendRecv, 2, 10, 0.0), (0.0, 0.0));
    }

    #[test]
    fn sealed_rows_pair_each_case_with_its_ratios() {
        let unkeyed = [
            measurement(Op::AllSum, 2, 4, 20.0, 0.0),
            measurement(Op::AllSum, 2, 1 << 20, 500.0, 2.0),
            measurement(Op::SendRecv, 2, 4, 10.0, 0.5),
        ];
        // The keyed run in another order, and without the sendrecv case.
        let mut keyed = [
            measurement(Op::AllSum, 2, 1 << 20, 1250.0, 0.8),
            measurement(Op::AllSum, 2, 4, 21.0, 0.0),
        ];
        keyed[1].wrong = 3;
        let rows = sealed_rows(&unkeyed, &keyed);
        assert_eq!(rows.len(), 2, "{rows:?}");
        assert_eq!((rows[0].case.bytes, rows[0].keyed_us), (4, 21.0));
        // In JSON the case's fields are the row's own, as they were before `case` held them.
        let json = serde_json::to_value(&rows[0]).expect("a row serializes");
        assert_eq!(
            (&json["bytes"], &json["dtype"]),
            (&4.into(), &"float32".into())
        );
        assert_eq!(
            (&json["op"], &json["ranks"]),
            (&"all_sum".into(), &2.into())
        );
        assert!(json.get("case").is_none(), "{json}");
        assert!((rows[0].time_ratio - 1.05).abs() < 1e-9);
        // No unkeyed bandwidth: no percentage, printed as a dash.
        assert!(rows[0].busbw_percent.is_nan());
        assert_eq!(rows[0].wrong, 3);
        assert!((rows[1].time_ratio - 2.5).abs() < 1e-9);
        assert!((rows[1].busbw_percent - 40.0).abs() < 1e-9);
        let text = sealed_table(2, 3, &rows);
        let lines: Vec<&str> = text.lines().collect();
        // A blank line, the title, three heading lines, a row per case.
        assert_eq!(lines.len(), 7, "{text}");
        assert!(lines[1].ends_with(", 2 ranks"), "{text}");
        assert!(lines[1].contains("3 sealing thread(s) per rank"), "{text}");
        let cells: Vec<&str> = lines[5].split_whitespace().collect();
        assert_eq!(
            cells,
            [
                "4", "all_sum", "float32", "sum", "20.00", "21.00", "1.05", "0.000", "0.000", "-"
            ]
        );
        let cells: Vec<&str> = lines[6].split_whitespace().collect();
        assert_eq!(
            &cells[4..],
            ["500.0", "1250.0", "2.50", "2.000", "0.800", "40%"]
        );
    }

    #[test]
    fn sizes_and_times_keep_one_unit() {
        assert_eq!(human(4), "4 B");
        assert_eq!(human(8 << 10), "8 KiB");
        assert_eq!(human(3 << 20), "3 MiB");
        assert_eq!(human(1536), "1536 B");
        // µs whatever the size: never "ms".
        assert_eq!(micros(12.345), "12.35");
        assert_eq!(micros(1234.56), "1234.6");
        assert_eq!(micros(81234.4), "81234");
    }
}
