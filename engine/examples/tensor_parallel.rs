//! Tensor-parallel inference: a stack of transformer MLP blocks sharded across ranks, with
//! one `all_sum` per layer, checked against the same blocks computed on one rank.
//!
//! ```text
//! cargo build --release --example tensor_parallel
//! cargo run --release --bin nuvec -- launch -n 2 -- target/release/examples/tensor_parallel
//! ```
//!
//! This is the pattern for sharding a model's MLP (and, the same way, attention) across
//! machines, as Megatron-style tensor parallelism does:
//!
//! - the up projection `W1` (hidden → ffn) is split by **columns**: rank `r` holds columns
//!   `[r·ffn/P, (r+1)·ffn/P)` and computes its slice of the activations `h = act(x·W1)`
//!   with no communication (the activation is element-wise, so it commutes with the split);
//! - the down projection `W2` (ffn → hidden) is split by **rows**, the matching slice, so
//!   each rank's `h_r·W2_r` is a partial sum of the layer's output;
//! - one `all_sum` of those partials (in f16 or bf16, as inference runs) gives every rank
//!   the full output, which feeds the next layer.
//!
//! Each rank also computes the unsharded stack (all of `W1` and `W2`) and checks that the
//! sharded result matches within half-precision tolerance. Rank 0 prints, for every rank,
//! the per-layer time of the collective and the per-token time of a decode step.
//!
//! An `all_sum` cannot finish before the last rank has reached it, so timed alone it
//! includes the wait for the slowest rank (a slower matrix product, or a rank descheduled).
//! The example reports the two apart without adding anything to a layer: each rank reads
//! its clock as it reaches each layer's `all_sum` (its arrival) and as the `all_sum`
//! returns, into vectors allocated before the run, and after the run one `all_gather`
//! brings every rank's readings to rank 0. Per layer and rank, the **wait** is the latest
//! arrival among the ranks minus this rank's own (skew), and the **collective** is the rest
//! of its `all_sum`: the time from the last arrival to this rank's return (communication,
//! and with it a waiting rank's wake-up and, where ranks outnumber free cores, time
//! descheduled). The ranks' clocks are compared on a common origin each reads right after a
//! barrier (`Origins`): ranks leave a barrier within one barrier's latency of one another,
//! and the example prints the bound it measured, which is the most any wait is off. On a
//! loaded 2-core machine the bound came out at 0.3 µs (no rank descheduled) to 22 µs over
//! shared memory and 7-50 µs over TCP, for 2 and 4 ranks; checked there against the wall
//! clock (`SystemTime`, one clock for every process on a host), the origins' true
//! disagreement was 0-3 µs over shared memory and 0-21 µs over TCP, always within the bound.
//!
//! `--late-rank R --late-us D` makes rank `R` spin `D` µs before each layer's `all_sum`, a
//! rank whose matrix product is slower: the others' waits grow by about `D`, their
//! collective does not. Two runs seconds apart on a loaded 2-core machine (`uptime` load 7.8 and
//! 8.8: other builds running), 2 ranks, native wire over shared memory, `--hidden 256
//! --ffn 1024 --tokens 128`, median / p99 in µs; first in lockstep, then with rank 1 spinning
//! 5 ms:
//!
//! ```text
//! the ranks' clocks share an origin to within 0.3 µs (...)
//! rank            all_sum               wait         collective  |      step   all_sums    waiting
//!    0      1.0 /  6420.7      0.0 /  4359.8      1.0 /  3882.8  |    2643.5     1200.5      376.4
//!    1     25.2 /  4789.9     16.6 /  3928.0      1.4 /  4383.6  |    3127.1     2534.2      213.8
//!
//! rank 1 spins 5000 µs before each layer's all_sum: it arrives late
//! the ranks' clocks share an origin to within 21.8 µs (...)
//! rank            all_sum               wait         collective  |      step   all_sums    waiting
//!    0   4976.3 /  9005.0   4913.2 /  8522.3     61.0 /  3301.1  |   41483.8    39793.6    39277.8
//!    1     19.4 /  1275.5      0.0 /     0.0     19.4 /   626.1  |   41487.8      156.7        0.0
//! ```
//!
//! The p99s of milliseconds are ranks descheduled (two ranks among other work on two cores).
//! Two more lockstep runs just before gave collective medians of 1.8-4.6 µs and wait medians
//! of 0-27 µs. With a lateness near the scheduler's own delays (1 ms at that load) the early
//! rank, asleep in its wait, woke up to a millisecond after the last arrival: that shows as
//! its collective, and it then reached the next layer late itself, which shortens its wait.

use std::time::{Duration, Instant};

use clap::Parser;
use half::{bf16, f16};
use nuvec_distributed_engine::{Element, Group, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod mlp;
use mlp::{Layer, partial, weights};

/// A sharded MLP stack, checked against the unsharded one.
#[derive(Parser, Debug)]
struct Args {
    /// Element type of the activations the ranks sum: f16 or bf16.
    #[arg(long, default_value = "f16")]
    dtype: String,
    /// Transformer layers (one all_sum each).
    #[arg(long, default_value_t = 8)]
    layers: usize,
    /// Model width.
    #[arg(long, default_value_t = 1024)]
    hidden: usize,
    /// MLP width (divisible by the number of ranks).
    #[arg(long, default_value_t = 4096)]
    ffn: usize,
    /// Decode steps (one token each) to time.
    #[arg(long, default_value_t = 64)]
    tokens: usize,
    /// A rank that arrives late: it spins `--late-us` before each layer's all_sum.
    #[arg(long, requires = "late_us")]
    late_rank: Option<usize>,
    /// How long the late rank spins before each layer's all_sum, in µs.
    #[arg(long, requires = "late_rank", default_value_t = 0)]
    late_us: u64,
}

/// A half-precision element the ranks sum.
trait Half: Element + Default {
    fn from_f32(v: f32) -> Self;
    fn to_f32(self) -> f32;
}

impl Half for f16 {
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
}

impl Half for bf16 {
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
}

/// This rank's clock at each layer of the run: when it reached the layer's `all_sum` (its
/// partial sum ready) and when the `all_sum` returned. The vectors are allocated for the
/// whole run up front, so a layer records two clock reads and allocates nothing.
struct Stamps {
    arrived: Vec<Instant>,
    done: Vec<Instant>,
}

/// Busy-waits `d`: a rank whose matrix product is slower than its peers'.
fn spin(d: Duration) {
    let start = Instant::now();
    while start.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// Runs the sharded stack for one token: `x` in, the output out, each layer's arrival and
/// completion pushed to `stamps`.
fn sharded<T: Half>(
    g: &Group,
    args: &Args,
    layers: &[Layer],
    x: &[f32],
    stamps: &mut Stamps,
) -> Result<Vec<f32>> {
    let share = args.ffn / g.size();
    let cols = g.rank() * share..(g.rank() + 1) * share;
    let late = (args.late_rank == Some(g.rank())).then(|| Duration::from_micros(args.late_us));
    let mut x = x.to_vec();
    let mut wire = vec![T::default(); args.hidden];
    for layer in layers {
        let y = partial(layer, &x, cols.clone());
        for (w, v) in wire.iter_mut().zip(&y) {
            *w = T::from_f32(*v);
        }
        if let Some(d) = late {
            spin(d);
        }
        stamps.arrived.push(Instant::now());
        g.all_sum(&mut wire)?;
        stamps.done.push(Instant::now());
        // Residual connection.
        for (xi, w) in x.iter_mut().zip(&wire) {
            *xi += w.to_f32();
        }
    }
    Ok(x)
}

/// The same stack on this rank alone, the sum rounded to half precision once per layer.
fn unsharded<T: Half>(args: &Args, layers: &[Layer], x: &[f32]) -> Vec<f32> {
    let mut x = x.to_vec();
    for layer in layers {
        let y = partial(layer, &x, 0..args.ffn);
        for (xi, v) in x.iter_mut().zip(&y) {
            *xi += T::from_f32(*v).to_f32();
        }
    }
    x
}

/// Tries at a common time origin.
const ORIGIN_TRIES: usize = 16;

/// Candidate time origins, one per try, each read by every rank right after a barrier.
///
/// No rank leaves a barrier before the last one has entered it, at some time E; a rank
/// whose barrier took `d` (from its clock read before the call to the one after) entered
/// by E and so read its origin by E + `d`. Every rank's origin therefore lies in
/// [E, E + the longest `d` among the ranks]: that longest barrier bounds how far any two
/// ranks' origins, and so any wait computed from them, are off. A barrier just before each
/// try lines the ranks up, so the try's barrier is short (one barrier's latency when no
/// rank is descheduled). After the run the ranks take the try whose longest barrier was
/// shortest. This holds on one host, where the ranks read one clock; on several hosts the
/// clocks' drift over the run (parts per million of its length) adds to it.
struct Origins {
    at: Vec<Instant>,
    barrier: Vec<Duration>,
}

fn origins(g: &Group) -> Result<Origins> {
    let mut o = Origins {
        at: Vec::with_capacity(ORIGIN_TRIES),
        barrier: Vec::with_capacity(ORIGIN_TRIES),
    };
    g.barrier()?;
    for _ in 0..ORIGIN_TRIES {
        let entered = Instant::now();
        g.barrier()?;
        let left = Instant::now();
        o.at.push(left);
        o.barrier.push(left - entered);
    }
    Ok(o)
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The element at quantile `q` of `v` (sorted here).
fn quantile(v: &mut [u64], q: f64) -> u64 {
    v.sort_unstable();
    let i = ((v.len().saturating_sub(1)) as f64 * q) as usize;
    v.get(i).copied().unwrap_or(0)
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1e3
}

/// One rank's record, as the ranks gather it: all in nanoseconds, in a layout every rank
/// shares (`tries` and the run's layers and tokens are the same on every rank).
struct Record<'a> {
    /// Each try's barrier.
    barrier: &'a [u64],
    /// Each try's origin after the first try's.
    origin: &'a [u64],
    /// Each layer's arrival after the first try's origin.
    arrived: &'a [u64],
    /// Each layer's all_sum, from arrival to return.
    sum: &'a [u64],
    /// Each token's whole step.
    step: &'a [u64],
}

impl<'a> Record<'a> {
    fn encode(o: &Origins, stamps: &Stamps, steps: &[Duration]) -> Vec<u64> {
        let zero = o.at[0];
        let mut v = Vec::with_capacity(2 * o.at.len() + 2 * stamps.arrived.len() + steps.len());
        v.extend(o.barrier.iter().map(|&d| nanos(d)));
        v.extend(o.at.iter().map(|&t| nanos(t - zero)));
        v.extend(stamps.arrived.iter().map(|&t| nanos(t - zero)));
        let sums = stamps.arrived.iter().zip(&stamps.done);
        v.extend(sums.map(|(&a, &d)| nanos(d - a)));
        v.extend(steps.iter().map(|&d| nanos(d)));
        v
    }

    fn decode(v: &'a [u64], tries: usize, layers: usize) -> Self {
        let (barrier, v) = v.split_at(tries);
        let (origin, v) = v.split_at(tries);
        let (arrived, v) = v.split_at(layers);
        let (sum, step) = v.split_at(layers);
        Record {
            barrier,
            origin,
            arrived,
            sum,
            step,
        }
    }
}

fn run<T: Half>(g: &Group, args: &Args) -> Result<bool> {
    let layers = weights(args.layers, args.hidden, args.ffn);
    let mut rng = StdRng::seed_from_u64(7);
    let calls = args.layers * args.tokens;
    let mut stamps = Stamps {
        arrived: Vec::with_capacity(calls),
        done: Vec::with_capacity(calls),
    };
    let mut steps = Vec::with_capacity(args.tokens);
    let mut worst = 0.0f32;
    let origins = origins(g)?;
    for t in 0..args.tokens {
        let x: Vec<f32> = (0..args.hidden)
            .map(|_| rng.random_range(-1.0..1.0))
            .collect();
        let start = Instant::now();
        let got = sharded::<T>(g, args, &layers, &x, &mut stamps)?;
        steps.push(start.elapsed());
        // Check a few tokens against the unsharded stack (it costs P times the work).
        if t < 4 {
            let want = unsharded::<T>(args, &layers, &x);
            let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
            for (a, b) in got.iter().zip(&want) {
                worst = worst.max((a - b).abs() / scale);
            }
        }
    }
    // Half precision keeps 11 (f16) or 8 (bf16) significant bits; partial sums rounded on
    // each rank and summed in half precision may differ from one rounding by a few units.
    let tolerance = if T::DTYPE == nuvec_distributed_engine::DType::F16 {
        4e-3
    } else {
        3e-2
    };
    let ok = worst <= tolerance;
    // One collective after the run carries every rank's clock readings to every rank.
    let mine = Record::encode(&origins, &stamps, &steps);
    let all = g.all_gather_vec(&mine)?;
    if g.rank() == 0 {
        let records: Vec<Record> = all
            .chunks(mine.len())
            .map(|v| Record::decode(v, ORIGIN_TRIES, calls))
            .collect();
        report::<T>(g, args, &records);
        println!(
            "largest difference from the unsharded stack: {worst:.2e} of the output's scale (tolerance {tolerance:.0e}): {}",
            if ok { "ok" } else { "TOO LARGE" }
        );
    }
    Ok(ok)
}

/// Prints each rank's all_sums split into the wait for the last rank and the collective
/// proper.
fn report<T: Half>(g: &Group, args: &Args, records: &[Record]) {
    let calls = args.layers * args.tokens;
    // The try whose longest barrier was shortest, the same on every rank.
    let bound = |k: usize| records.iter().map(|r| r.barrier[k]).max().unwrap_or(0);
    let best = (0..ORIGIN_TRIES).min_by_key(|&k| bound(k)).unwrap_or(0);
    // Arrivals on the common origin (signed, as their differences across ranks are).
    let arrival = |r: &Record, i: usize| r.arrived[i] as i64 - r.origin[best] as i64;
    let last: Vec<i64> = (0..calls)
        .map(|i| records.iter().map(|r| arrival(r, i)).max().unwrap_or(0))
        .collect();
    println!(
        "{} ranks, {} layers, hidden {}, ffn {} ({} per rank), {}: one all_sum of {} bytes per layer",
        g.size(),
        args.layers,
        args.hidden,
        args.ffn,
        args.ffn / g.size(),
        T::DTYPE,
        args.hidden * T::DTYPE.size()
    );
    if let Some(r) = args.late_rank {
        println!(
            "rank {r} spins {} µs before each layer's all_sum: it arrives late",
            args.late_us
        );
    }
    println!(
        "the ranks' clocks share an origin to within {:.1} µs (the longest barrier before it, best of {ORIGIN_TRIES} tries), which bounds the error of each wait",
        us(bound(best))
    );
    println!(
        "per layer, median / p99 over {calls} layers: a rank's all_sum = its wait for the last rank to arrive (skew) + the collective proper (communication); per token, medians over {} tokens; all in µs",
        args.tokens
    );
    println!(
        "rank  {:>17}  {:>17}  {:>17}  | {:>9}  {:>9}  {:>9}",
        "all_sum", "wait", "collective", "step", "all_sums", "waiting"
    );
    for (rank, r) in records.iter().enumerate() {
        let mut sum = r.sum.to_vec();
        // The latest arrival is at least this rank's own, so a wait is never negative; the
        // origin's error can make a collective (the all_sum less the wait) come out below
        // zero, and it is clamped at 0.
        let mut wait: Vec<u64> = (0..calls)
            .map(|i| u64::try_from(last[i] - arrival(r, i)).unwrap_or(0))
            .collect();
        let mut collective: Vec<u64> = sum
            .iter()
            .zip(&wait)
            .map(|(s, w)| s.saturating_sub(*w))
            .collect();
        let per_token =
            |v: &[u64]| -> Vec<u64> { v.chunks(args.layers).map(|c| c.iter().sum()).collect() };
        let mut token_sums = per_token(&sum);
        let mut token_waits = per_token(&wait);
        let mut step = r.step.to_vec();
        println!(
            "{rank:>4}  {:>7.1} / {:>7.1}  {:>7.1} / {:>7.1}  {:>7.1} / {:>7.1}  | {:>9.1}  {:>9.1}  {:>9.1}",
            us(quantile(&mut sum, 0.5)),
            us(quantile(&mut sum, 0.99)),
            us(quantile(&mut wait, 0.5)),
            us(quantile(&mut wait, 0.99)),
            us(quantile(&mut collective, 0.5)),
            us(quantile(&mut collective, 0.99)),
            us(quantile(&mut step, 0.5)),
            us(quantile(&mut token_sums, 0.5)),
            us(quantile(&mut token_waits, 0.5)),
        );
    }
}

fn main() {
    let args = Args::parse();
    let g = match nuvec_distributed_engine::init(false) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("the group did not form: {e}");
            std::process::exit(1);
        }
    };
    if args.ffn % g.size() != 0 || args.layers == 0 || args.tokens == 0 {
        eprintln!(
            "--ffn must divide by the {} ranks, and --layers and --tokens be positive",
            g.size()
        );
        std::process::exit(2);
    }
    if let Some(r) = args.late_rank.filter(|&r| r >= g.size()) {
        eprintln!("--late-rank {r}: the group has ranks 0 to {}", g.size() - 1);
        std::process::exit(2);
    }
    let ran = match args.dtype.as_str() {
        "f16" => run::<f16>(&g, &args),
        "bf16" => run::<bf16>(&g, &args),
        other => {
            eprintln!("--dtype {other:?}: expected f16 or bf16");
            std::process::exit(2);
        }
    };
    match ran.and_then(|ok| g.barrier().map(|()| ok)) {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("rank {}: {e}", g.rank());
            std::process::exit(1);
        }
    }
}
