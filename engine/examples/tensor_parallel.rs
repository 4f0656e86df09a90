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
//! sharded result matches within half-precision tolerance. Rank 0 prints the per-layer
//! latency of the collective and the per-token latency a decode step pays for them.
//!
//! An `all_sum` cannot finish before the last rank has reached it, so timed alone it
//! includes the wait for the slowest rank's matrix product (milliseconds on a loaded
//! machine, against about a hundred microseconds for the collective itself). To report the
//! two apart, each layer runs a timed `barrier` just before its `all_sum`: the barrier's
//! time is the wait for the last arrival (plus one barrier, itself a small collective), and
//! the `all_sum` after it starts with the ranks aligned. A decode step without the barriers
//! pays the wait inside its `all_sum` instead.

use std::time::{Duration, Instant};

use clap::Parser;
use half::{bf16, f16};
use nuvec_distributed_engine::{Element, Group};
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

/// Per layer: the wait for the last rank to arrive (a timed barrier), then the all_sum.
#[derive(Default)]
struct Times {
    waits: Vec<Duration>,
    sums: Vec<Duration>,
}

/// Runs the sharded stack for one token: `x` in, the output out, each layer's arrival wait
/// and all_sum time pushed to `times`.
fn sharded<T: Half>(
    g: &Group,
    args: &Args,
    layers: &[Layer],
    x: &[f32],
    times: &mut Times,
) -> Vec<f32> {
    let share = args.ffn / g.size();
    let cols = g.rank() * share..(g.rank() + 1) * share;
    let mut x = x.to_vec();
    let mut wire = vec![T::default(); args.hidden];
    for layer in layers {
        let y = partial(layer, &x, cols.clone());
        for (w, v) in wire.iter_mut().zip(&y) {
            *w = T::from_f32(*v);
        }
        let arrived = Instant::now();
        g.barrier().expect("the barrier before the layer's all_sum");
        let start = Instant::now();
        g.all_sum(&mut wire).expect("the layer's all_sum");
        times.sums.push(start.elapsed());
        times.waits.push(start - arrived);
        // Residual connection.
        for (xi, w) in x.iter_mut().zip(&wire) {
            *xi += w.to_f32();
        }
    }
    x
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

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn p99(v: &mut [Duration]) -> Duration {
    v.sort();
    v[(v.len() - 1) * 99 / 100]
}

fn run<T: Half>(g: &Group, args: &Args) -> bool {
    let layers = weights(args.layers, args.hidden, args.ffn);
    let mut rng = StdRng::seed_from_u64(7);
    let mut times = Times::default();
    let mut worst = 0.0f32;
    // Per token: the whole step, its all_sums, its waits for the last rank.
    let mut token_times = Vec::new();
    for t in 0..args.tokens {
        let x: Vec<f32> = (0..args.hidden)
            .map(|_| rng.random_range(-1.0..1.0))
            .collect();
        let before = times.sums.len();
        let start = Instant::now();
        let got = sharded::<T>(g, args, &layers, &x, &mut times);
        let wall = start.elapsed();
        token_times.push((
            wall,
            times.sums[before..].iter().sum::<Duration>(),
            times.waits[before..].iter().sum::<Duration>(),
        ));
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
    if g.rank() == 0 {
        let mut collective: Vec<Duration> = token_times.iter().map(|t| t.1).collect();
        let mut waiting: Vec<Duration> = token_times.iter().map(|t| t.2).collect();
        let mut wall: Vec<Duration> = token_times.iter().map(|t| t.0).collect();
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
        println!(
            "all_sum per layer, the ranks aligned by a barrier just before: median {:?}, p99 {:?} ({} calls)",
            median(&mut times.sums),
            p99(&mut times.sums),
            times.sums.len()
        );
        println!(
            "wait for the last rank per layer (that barrier's time: the wait plus one barrier): median {:?}, p99 {:?}",
            median(&mut times.waits),
            p99(&mut times.waits)
        );
        println!(
            "per token (medians over {} tokens): all_sums {:?}, waits {:?}, whole step {:?} (the barriers included; without them a step pays the wait inside its all_sums)",
            args.tokens,
            median(&mut collective),
            median(&mut waiting),
            median(&mut wall)
        );
        println!(
            "largest difference from the unsharded stack: {worst:.2e} of the output's scale (tolerance {tolerance:.0e}): {}",
            if ok { "ok" } else { "TOO LARGE" }
        );
    }
    ok
}

fn main() {
    let args = Args::parse();
    let g = nuvec_distributed_engine::init(false).expect("the group forms");
    if args.ffn % g.size() != 0 || args.layers == 0 || args.tokens == 0 {
        eprintln!(
            "--ffn must divide by the {} ranks, and --layers and --tokens be positive",
            g.size()
        );
        std::process::exit(2);
    }
    let ok = match args.dtype.as_str() {
        "f16" => run::<f16>(&g, &args),
        "bf16" => run::<bf16>(&g, &args),
        other => {
            eprintln!("--dtype {other:?}: expected f16 or bf16");
            std::process::exit(2);
        }
    };
    g.barrier().expect("the final barrier");
    if !ok {
        std::process::exit(1);
    }
}
