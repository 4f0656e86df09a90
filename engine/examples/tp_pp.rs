//! Tensor parallelism inside pipeline stages, laid out with `Group::split`: P = 4 ranks as
//! 2 pipeline stages x 2 tensor-parallel ranks, checked against the unsharded model.
//!
//! ```text
//! cargo build --release --example tp_pp
//! cargo run --release --bin nuvec -- launch -n 4 -- target/release/examples/tp_pp
//! ```
//!
//! Rank `r` is tensor-parallel rank `r % tp` of pipeline stage `r / tp` (`tp = P / stages`).
//! Two splits of the launched group give each rank the two groups it talks in:
//!
//! - its **stage** (`split(color = stage, key = tp rank)`): the ranks that share the stage's
//!   layers, each holding a slice of every MLP (columns of the up projection, rows of the
//!   down projection, as in `examples/tensor_parallel.rs`), with one `all_sum` per layer;
//! - its **pipe** (`split(color = tp rank, key = stage)`): the ranks at the same tensor
//!   position in every stage; stage `s` sends its output activations to stage `s + 1` over
//!   it (pipe ranks are stages, and consecutive stages are ring neighbours).
//!
//! Tokens stream through the stages one after another, so stage 1 computes token `t` while
//! stage 0 already computes token `t + 1`. The last stage checks every token's output
//! against the whole model computed on one rank; an `all_max` over the launched group
//! tells every rank whether any check failed, and rank 0 prints the verdict. The exit
//! status is 0 only if every output matched.

use std::time::Instant;

use clap::Parser;
use nuvec_distributed_engine::Group;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod mlp;
use mlp::{Layer, partial, weights};

/// A pipelined, tensor-parallel MLP stack, checked against the unsharded one.
#[derive(Parser, Debug)]
struct Args {
    /// Pipeline stages (the number of ranks must divide by it).
    #[arg(long, default_value_t = 2)]
    stages: usize,
    /// Layers in all (divisible by the number of stages).
    #[arg(long, default_value_t = 4)]
    layers: usize,
    /// Model width.
    #[arg(long, default_value_t = 256)]
    hidden: usize,
    /// MLP width (divisible by the tensor-parallel ranks per stage).
    #[arg(long, default_value_t = 1024)]
    ffn: usize,
    /// Tokens to stream through the pipeline.
    #[arg(long, default_value_t = 8)]
    tokens: usize,
}

/// The tokens' input activations, the same on every rank.
fn inputs(args: &Args) -> Vec<Vec<f32>> {
    let mut rng = StdRng::seed_from_u64(7);
    (0..args.tokens)
        .map(|_| {
            (0..args.hidden)
                .map(|_| rng.random_range(-1.0..1.0))
                .collect()
        })
        .collect()
}

/// The stage's layers on `x`, each MLP sharded across `stage` and summed with one
/// `all_sum`, plus the residual connection.
fn stage_forward(stage: &Group, args: &Args, layers: &[Layer], x: &mut [f32]) {
    let share = args.ffn / stage.size();
    let cols = stage.rank() * share..(stage.rank() + 1) * share;
    for layer in layers {
        let mut y = partial(layer, x, cols.clone());
        stage.all_sum(&mut y).expect("the stage's all_sum");
        for (xi, yi) in x.iter_mut().zip(&y) {
            *xi += yi;
        }
    }
}

/// The whole model on this rank alone.
fn unsharded(args: &Args, layers: &[Layer], x: &[f32]) -> Vec<f32> {
    let mut x = x.to_vec();
    for layer in layers {
        let y = partial(layer, &x, 0..args.ffn);
        for (xi, yi) in x.iter_mut().zip(&y) {
            *xi += yi;
        }
    }
    x
}

fn main() {
    let args = Args::parse();
    let world = nuvec_distributed_engine::init(false).expect("the group forms");
    let p = world.size();
    let fits = args.stages > 0
        && p.is_multiple_of(args.stages)
        && args.layers.is_multiple_of(args.stages)
        && args.ffn.is_multiple_of(p / args.stages)
        && args.tokens > 0;
    if !fits {
        eprintln!(
            "{p} ranks, --stages {}, --layers {}, --ffn {}: the ranks and the layers must \
             divide by the stages, --ffn by the ranks per stage, and --tokens be positive",
            args.stages, args.layers, args.ffn
        );
        std::process::exit(2);
    }
    let tp = p / args.stages;
    let (stage_no, tp_rank) = (world.rank() / tp, world.rank() % tp);
    let stage = world
        .split(stage_no as i32, tp_rank as i32)
        .expect("splitting into stages");
    let pipe = world
        .split(tp_rank as i32, stage_no as i32)
        .expect("splitting into pipes");
    assert_eq!((stage.rank(), stage.size()), (tp_rank, tp));
    assert_eq!((pipe.rank(), pipe.size()), (stage_no, args.stages));

    let model = weights(args.layers, args.hidden, args.ffn);
    let per_stage = args.layers / args.stages;
    let mine = &model[stage_no * per_stage..(stage_no + 1) * per_stage];
    let tokens = inputs(&args);
    let last = stage_no + 1 == args.stages;
    let mut worst = 0.0f32;
    let start = Instant::now();
    for token in &tokens {
        let mut x = token.clone();
        if stage_no > 0 {
            pipe.recv(&mut x, stage_no - 1)
                .expect("the previous stage's activations");
        }
        stage_forward(&stage, &args, mine, &mut x);
        if !last {
            pipe.send(&x, stage_no + 1)
                .expect("sending activations to the next stage");
        } else {
            let want = unsharded(&args, &model, token);
            let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
            for (a, b) in x.iter().zip(&want) {
                worst = worst.max((a - b).abs() / scale);
            }
        }
    }
    let took = start.elapsed();
    // f32 partial sums added in another order than one rank's loop: a few units in the
    // last place per layer.
    const TOLERANCE: f32 = 1e-4;
    let mut verdict = [worst];
    world.all_max(&mut verdict).expect("gathering the verdict");
    let ok = verdict[0] <= TOLERANCE;
    if world.rank() == 0 {
        println!(
            "{p} ranks as {} stages x {tp} tensor-parallel ranks, {} layers ({per_stage} per \
             stage), hidden {}, ffn {}: {} tokens in {took:?}",
            args.stages, args.layers, args.hidden, args.ffn, args.tokens
        );
        println!(
            "largest difference from the unsharded model: {:.2e} of the output's scale \
             (tolerance {TOLERANCE:.0e}): {}",
            verdict[0],
            if ok { "ok" } else { "TOO LARGE" }
        );
    }
    for group in [&stage, &pipe] {
        group.close().expect("closing a sub-group");
    }
    world.barrier().expect("the final barrier");
    if !ok {
        std::process::exit(1);
    }
}
