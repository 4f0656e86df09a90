//! Tensor-parallel inference of a small Llama-shaped model built from nuvec-nn's layers,
//! checked token by token against the same model unsharded.
//!
//! ```text
//! cargo build --release --example llama -p nuvec-distributed
//! cargo build --release -p nuvec-tools
//! target/release/nuvec launch -n 2 -- target/release/examples/llama                 # MLX wire
//! target/release/nuvec launch -n 2 --wire native --env NUVEC_DISTRIBUTED_SHM=0 \
//!     -- target/release/examples/llama                                             # TCP
//! target/release/nuvec launch -n 2 --wire native -- target/release/examples/llama  # shared memory
//! ```
//!
//! The model: a token embedding; per decoder layer an RMS norm, grouped-query attention
//! with rotary position embeddings and a KV cache, a residual, an RMS norm, a SwiGLU MLP and
//! a residual; a final RMS norm and an LM head. Every rank draws the whole model from the
//! same seed (`nuvec::random::seed`), then keeps its share of each layer, Megatron-style:
//!
//! - attention is split by **heads**: the q, k and v projections are column-parallel
//!   ([`AllToShardedLinear`]: rank `r` keeps the output rows of its `heads / P` query heads
//!   and `kv_heads / P` key-value heads, which are the ones its query heads read), so each
//!   rank attends with its own heads over its own slice of the KV cache; the output
//!   projection is row-parallel ([`ShardedToAllLinear`]: the matching input columns), and
//!   its `all_sum` adds the ranks' partial outputs;
//! - the MLP is split by **columns then rows**: gate and up column-parallel, down
//!   row-parallel, one `all_sum`;
//! - embedding, norms and LM head are replicated (every rank computes the same logits).
//!
//! So a decode step runs two `all_sum`s of `hidden` floats per layer and nothing else.
//!
//! Each rank then runs the unsharded model (the same code over a group of one, which holds
//! every head and column) from the same seed, without a KV cache: every step recomputes
//! the whole sequence so far, so neither the cache nor RoPE's position offsets can be wrong
//! the same way in both. It checks that both generated the same tokens and that the logits
//! behind every token agree within a rounding tolerance (see [`tolerance`]); the ranks also
//! compare their token sequences with each other. Any mismatch exits non-zero on every
//! rank, naming the token, its position in the sequence and the ranks. (With random
//! weights, greedy generation soon settles into a short cycle of tokens; the logits are
//! compared in full at every step all the same.)
//!
//! Timing: every collective passes through a [`Timed`] transport that adds up the time
//! spent inside `all_reduce`, so each decode step reports its latency and how much of it
//! the `all_sum`s took. That time includes waiting for the slowest rank to arrive. With
//! `--barrier` (a diagnostic mode) each `all_sum` is preceded by a one-byte reduction that
//! every rank must reach first, timed apart: it takes the waiting (plus one small
//! message's latency) out of the `all_sum`, which then measures the collective itself.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use nuvec::distributed::{self, AllReduce, Communicator, Group};
use nuvec::fast::{self, AttentionOptions};
use nuvec::{Array, DType, Param, ops, random};
use nuvec_distributed::engine;
use nuvec_nn::sharded::{AllToShardedLinear, Shard, ShardedToAllLinear};
use nuvec_nn::{Embedding, Linear, Module, RmsNorm, Rope, swiglu};

/// A Llama-shaped model sharded across the launched ranks, generating greedily, checked
/// against the unsharded model.
#[derive(Parser, Debug)]
struct Args {
    /// Decoder layers.
    #[arg(long, default_value_t = 4)]
    layers: usize,
    /// Model width (the size of each all_sum, in f32 elements).
    #[arg(long, default_value_t = 256)]
    hidden: usize,
    /// Query heads (divisible by the number of ranks).
    #[arg(long, default_value_t = 8)]
    heads: usize,
    /// Key-value heads (divisible by the number of ranks; divides the query heads).
    #[arg(long, default_value_t = 4)]
    kv_heads: usize,
    /// Features per head.
    #[arg(long, default_value_t = 32)]
    head_dim: usize,
    /// MLP width (divisible by the number of ranks).
    #[arg(long, default_value_t = 768)]
    ffn: usize,
    /// Vocabulary size.
    #[arg(long, default_value_t = 1024)]
    vocab: usize,
    /// Prompt length (token ids drawn from the seed).
    #[arg(long, default_value_t = 8)]
    prompt: usize,
    /// Tokens to generate: the first from the prompt's pass, each further one a decode step.
    #[arg(long, default_value_t = 32)]
    tokens: usize,
    /// The seed of the weights and the prompt (the same on every rank).
    #[arg(long, default_value_t = 3)]
    seed: u64,
    /// Diagnostic: every rank reaches a barrier (a one-byte reduction) before each all_sum,
    /// timed apart, so the all_sum's time no longer includes waiting for the last rank.
    #[arg(long)]
    barrier: bool,
    /// Fault injection: rank RANK contributes zeros instead of its heads' share of the first
    /// layer's attention output, as a sharding bug would; the check must then fail.
    #[arg(long, value_name = "RANK")]
    drop_shard: Option<usize>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("llama: {e}");
            ExitCode::FAILURE
        }
    }
}

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

/// Time spent inside the group's reductions, added up across calls.
#[derive(Debug, Default)]
struct Clock {
    calls: AtomicU64,
    /// Nanoseconds inside `all_reduce` (with `--barrier`: after every rank has arrived).
    reduce: AtomicU64,
    /// Nanoseconds in the barrier before each `all_reduce` (`--barrier` only).
    wait: AtomicU64,
}

/// A reading of the [`Clock`].
#[derive(Debug, Clone, Copy, Default)]
struct Reading {
    calls: u64,
    reduce: Duration,
    wait: Duration,
}

impl Clock {
    fn read(&self) -> Reading {
        Reading {
            calls: self.calls.load(Ordering::Relaxed),
            reduce: Duration::from_nanos(self.reduce.load(Ordering::Relaxed)),
            wait: Duration::from_nanos(self.wait.load(Ordering::Relaxed)),
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// nuvec's transport of the group with a clock around every reduction. nuvec-core calls it
/// from its evaluation, one collective at a time per group, so the clock sees exactly the
/// time the lazy graph spends in the wire's `all_sum`s.
struct Timed {
    inner: Arc<dyn Communicator>,
    clock: Arc<Clock>,
    barrier: bool,
}

impl Communicator for Timed {
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    fn size(&self) -> usize {
        self.inner.size()
    }

    fn all_reduce(&self, op: AllReduce, dtype: DType, data: &mut [u8]) -> nuvec::Result<()> {
        if self.barrier {
            // No rank leaves a reduction before every rank has entered it: one byte is a
            // barrier whose own cost is one small message's latency.
            let start = Instant::now();
            self.inner
                .all_reduce(AllReduce::Max, DType::U8, &mut [0u8])?;
            self.clock
                .wait
                .fetch_add(nanos(start.elapsed()), Ordering::Relaxed);
        }
        let start = Instant::now();
        let result = self.inner.all_reduce(op, dtype, data);
        self.clock
            .reduce
            .fetch_add(nanos(start.elapsed()), Ordering::Relaxed);
        self.clock.calls.fetch_add(1, Ordering::Relaxed);
        result
    }

    fn all_gather(&self, input: &[u8], output: &mut [u8]) -> nuvec::Result<()> {
        self.inner.all_gather(input, output)
    }

    fn send(&self, dst: usize, data: &[u8]) -> nuvec::Result<()> {
        self.inner.send(dst, data)
    }

    fn recv(&self, src: usize, data: &mut [u8]) -> nuvec::Result<()> {
        self.inner.recv(src, data)
    }

    fn split(&self, color: i32, key: i32) -> nuvec::Result<Arc<dyn Communicator>> {
        Ok(Arc::new(Timed {
            inner: self.inner.split(color, key)?,
            clock: self.clock.clone(),
            barrier: self.barrier,
        }))
    }
}

/// The model's sizes, as i32 for nuvec's shapes.
#[derive(Debug, Clone, Copy)]
struct Dims {
    layers: i32,
    hidden: i32,
    heads: i32,
    kv_heads: i32,
    head_dim: i32,
    ffn: i32,
    vocab: i32,
}

impl Dims {
    fn from_args(a: &Args) -> AnyResult<Dims> {
        let int = |what: &str, v: usize| {
            i32::try_from(v)
                .ok()
                .filter(|&v| v > 0)
                .ok_or_else(|| format!("--{what} {v}: not a size from 1 to {}", i32::MAX))
        };
        let d = Dims {
            layers: int("layers", a.layers)?,
            hidden: int("hidden", a.hidden)?,
            heads: int("heads", a.heads)?,
            kv_heads: int("kv-heads", a.kv_heads)?,
            head_dim: int("head-dim", a.head_dim)?,
            ffn: int("ffn", a.ffn)?,
            vocab: int("vocab", a.vocab)?,
        };
        if d.heads % d.kv_heads != 0 {
            return Err(format!(
                "--heads {} is not a multiple of --kv-heads {}: each key-value head serves a \
                 whole group of query heads",
                d.heads, d.kv_heads
            )
            .into());
        }
        if d.head_dim % 2 != 0 {
            return Err(
                format!("--head-dim {}: RoPE rotates pairs of features", d.head_dim).into(),
            );
        }
        Ok(d)
    }
}

/// One decoder layer's full weights (no biases, as Llama).
#[derive(Clone, Module)]
struct LayerWeights {
    attn_norm: RmsNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    mlp_norm: RmsNorm,
    gate: Linear,
    up: Linear,
    down: Linear,
}

/// The whole model's weights, as every rank draws them.
#[derive(Clone, Module)]
struct Weights {
    embed: Embedding,
    layers: Vec<LayerWeights>,
    norm: RmsNorm,
    head: Linear,
}

/// An RMS norm with a scale drawn around 1, so that a norm applied to the wrong features
/// would show (a scale of ones hides it).
fn norm(dims: i32) -> RmsNorm {
    let mut n = RmsNorm::new(dims);
    n.weight = Param::new(random::uniform(0.5, 1.5, [dims], DType::F32, None));
    n
}

/// Draws the model from the thread's key sequence (nuvec-nn's initialisations, MLX's): the
/// same seed gives the same weights on every rank.
fn weights(d: Dims) -> Weights {
    let linear = |i: i32, o: i32| Linear::new(i, o).without_bias();
    let (q, kv) = (d.heads * d.head_dim, d.kv_heads * d.head_dim);
    let embed = Embedding::new(d.vocab, d.hidden);
    let layers = (0..d.layers)
        .map(|_| LayerWeights {
            attn_norm: norm(d.hidden),
            q: linear(d.hidden, q),
            k: linear(d.hidden, kv),
            v: linear(d.hidden, kv),
            o: linear(q, d.hidden),
            mlp_norm: norm(d.hidden),
            gate: linear(d.hidden, d.ffn),
            up: linear(d.hidden, d.ffn),
            down: linear(d.ffn, d.hidden),
        })
        .collect();
    Weights {
        embed,
        layers,
        norm: norm(d.hidden),
        head: linear(d.hidden, d.vocab),
    }
}

/// One layer's keys and values for this rank's key-value heads, `[1, kv_heads / P,
/// capacity, head_dim]`, allocated for the whole generation and written in place.
struct Cache {
    keys: Option<Array>,
    values: Option<Array>,
    len: i32,
    capacity: i32,
}

impl Cache {
    fn new(capacity: i32) -> Cache {
        Cache {
            keys: None,
            values: None,
            len: 0,
            capacity,
        }
    }

    /// Writes `keys` and `values` (`[1, heads, L, head_dim]`) after the cached positions and
    /// returns every cached position's (views of the buffers).
    fn update(&mut self, keys: &Array, values: &Array) -> AnyResult<(Array, Array)> {
        let l = keys.shape().get(2).copied().unwrap_or(0);
        let end = self.len + l;
        if end > self.capacity {
            return Err(format!(
                "KV cache: {end} positions do not fit its {} (prompt plus tokens)",
                self.capacity
            )
            .into());
        }
        let mut shape = keys.shape().to_vec();
        shape[2] = self.capacity;
        let buffer =
            |b: Option<Array>| b.unwrap_or_else(|| ops::zeros(shape.as_slice(), DType::F32));
        // `take` leaves each write the buffer's only owner, so it happens in place.
        let at = (.., .., self.len..end);
        let k = buffer(self.keys.take()).at(at.clone()).set(keys);
        let v = buffer(self.values.take()).at(at).set(values);
        self.keys = Some(k.clone());
        self.values = Some(v.clone());
        self.len = end;
        let filled = (.., .., ..end);
        Ok((k.i(filled), v.i(filled)))
    }
}

/// One decoder layer as this rank runs it.
#[derive(Clone, Module)]
struct Block {
    attn_norm: RmsNorm,
    q: AllToShardedLinear,
    k: AllToShardedLinear,
    v: AllToShardedLinear,
    o: ShardedToAllLinear,
    mlp_norm: RmsNorm,
    gate: AllToShardedLinear,
    up: AllToShardedLinear,
    down: ShardedToAllLinear,
    /// This rank's query and key-value heads.
    #[tree(skip)]
    heads: i32,
    #[tree(skip)]
    kv_heads: i32,
    #[tree(skip)]
    head_dim: i32,
    rope: Rope,
}

/// `[B, L, H, D]` as `[B, H, L, D]`, and back.
const HEADS_FIRST: [i32; 4] = [0, 2, 1, 3];

impl Block {
    fn shard(w: &LayerWeights, d: Dims, group: &Group) -> nuvec::Result<Block> {
        let p = group.size() as i32;
        Ok(Block {
            attn_norm: w.attn_norm.clone(),
            q: AllToShardedLinear::from_linear(&w.q, group)?,
            k: AllToShardedLinear::from_linear(&w.k, group)?,
            v: AllToShardedLinear::from_linear(&w.v, group)?,
            o: ShardedToAllLinear::from_linear(&w.o, group)?,
            mlp_norm: w.mlp_norm.clone(),
            gate: AllToShardedLinear::from_linear(&w.gate, group)?,
            up: AllToShardedLinear::from_linear(&w.up, group)?,
            down: ShardedToAllLinear::from_linear(&w.down, group)?,
            heads: d.heads / p,
            kv_heads: d.kv_heads / p,
            head_dim: d.head_dim,
            rope: Rope::new(d.head_dim),
        })
    }

    /// `x` (`[1, L, hidden]`, positions `cache.len..`) through the layer.
    fn forward(&self, x: &Array, cache: &mut Cache) -> AnyResult<Array> {
        let l = x.shape().get(1).copied().unwrap_or(0);
        let at = cache.len;
        let heads = |a: Array, n: i32| a.reshape([1, l, n, self.head_dim]).transpose(HEADS_FIRST);
        let h = self.attn_norm.forward(x);
        let q = self
            .rope
            .forward(&heads(self.q.forward(&h), self.heads), at);
        let k = self
            .rope
            .forward(&heads(self.k.forward(&h), self.kv_heads), at);
        let v = heads(self.v.forward(&h), self.kv_heads);
        let (k, v) = cache.update(&k, &v)?;
        // The prompt's queries see the keys up to their own position; one decode query sees
        // every cached key.
        let options = if l > 1 {
            AttentionOptions::causal()
        } else {
            AttentionOptions::default()
        };
        let scale = (self.head_dim as f32).powf(-0.5);
        let o = fast::scaled_dot_product_attention(&q, &k, &v, scale, &options);
        let o = o
            .transpose(HEADS_FIRST)
            .reshape([1, l, self.heads * self.head_dim]);
        let x = x.add(self.o.forward(&o)); // all_sum of the heads' partial outputs
        let h = self.mlp_norm.forward(&x);
        let mlp = swiglu(&self.gate.forward(&h), &self.up.forward(&h));
        Ok(x.add(self.down.forward(&mlp))) // all_sum of the columns' partial outputs
    }
}

/// The model as this rank runs it over `group`: over a group of one, the unsharded model.
#[derive(Clone, Module)]
struct Model {
    embed: Embedding,
    blocks: Vec<Block>,
    norm: RmsNorm,
    head: Linear,
}

impl Model {
    fn shard(w: &Weights, d: Dims, group: &Group) -> AnyResult<Model> {
        let p = group.size();
        for (what, n) in [
            ("--heads", d.heads),
            ("--kv-heads", d.kv_heads),
            ("--ffn", d.ffn),
        ] {
            if !(n as usize).is_multiple_of(p) {
                return Err(format!("{what} {n} does not split across {p} ranks").into());
            }
        }
        Ok(Model {
            embed: w.embed.clone(),
            blocks: w
                .layers
                .iter()
                .map(|l| Block::shard(l, d, group))
                .collect::<nuvec::Result<_>>()?,
            norm: w.norm.clone(),
            head: w.head.clone(),
        })
    }

    /// The logits after the last of `tokens` (`[1, L]`), `[vocab]`, with the caches
    /// advanced by L positions.
    fn forward(&self, tokens: &Array, caches: &mut [Cache]) -> AnyResult<Array> {
        let mut x = self.embed.forward(tokens);
        for (block, cache) in self.blocks.iter().zip(caches.iter_mut()) {
            x = block.forward(&x, cache)?;
        }
        let last = self.norm.forward(&x.i((0, -1)));
        Ok(self.head.forward(&last))
    }
}

/// What a generation produced, and how long its steps took.
struct Generation {
    tokens: Vec<u32>,
    /// The logits that chose each token.
    logits: Vec<Vec<f32>>,
    prefill: Duration,
    /// Per decode step: its wall time and the clock's advance during it.
    steps: Vec<(Duration, Reading)>,
}

/// How a generation treats the keys and values of earlier positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keys {
    /// Cached: each step computes one position (how inference runs).
    Cached,
    /// Recomputed: each step runs the whole sequence so far from empty caches, so the
    /// result does not depend on the cache's bookkeeping or RoPE's offsets.
    Recomputed,
}

/// Greedy generation of `n` tokens after `prompt`.
fn generate(
    model: &Model,
    prompt: &[u32],
    n: usize,
    keys: Keys,
    clock: &Clock,
) -> AnyResult<Generation> {
    let capacity = i32::try_from(prompt.len() + n)?;
    let fresh = || -> Vec<Cache> { model.blocks.iter().map(|_| Cache::new(capacity)).collect() };
    let mut caches = fresh();
    let mut sequence = prompt.to_vec();
    let mut g = Generation {
        tokens: Vec::with_capacity(n),
        logits: Vec::with_capacity(n),
        prefill: Duration::ZERO,
        steps: Vec::with_capacity(n.saturating_sub(1)),
    };
    let mut input = Array::from_slice(prompt, [1, i32::try_from(prompt.len())?]);
    for i in 0..n {
        let (start, before) = (Instant::now(), clock.read());
        let logits = model.forward(&input, &mut caches)?;
        let token = logits.argmax(-1).item::<u32>()?; // evaluates the whole step
        let (elapsed, after) = (start.elapsed(), clock.read());
        if i == 0 {
            g.prefill = elapsed;
        } else {
            let during = Reading {
                calls: after.calls - before.calls,
                reduce: after.reduce - before.reduce,
                wait: after.wait - before.wait,
            };
            g.steps.push((elapsed, during));
        }
        g.logits.push(logits.to_vec::<f32>()?);
        g.tokens.push(token);
        sequence.push(token);
        input = match keys {
            Keys::Cached => Array::from_slice(&[token], [1, 1]),
            Keys::Recomputed => {
                caches = fresh();
                Array::from_slice(&sequence, [1, i32::try_from(sequence.len())?])
            }
        };
    }
    Ok(g)
}

/// How far the sharded logits may be from the unsharded ones.
///
/// Both models compute the same products; they differ in how they add them. Unsharded, an
/// output of a row-parallel projection is one dot product over its `K` inputs (`K` is
/// `heads · head_dim` for attention and `ffn` for the MLP); sharded, it is P dot products over
/// `K / P` inputs each, added by the all_sum. Either order rounds each addition in f32
/// (unit roundoff `u = 2⁻²⁴`), and the classic bound for a sum of `K` terms in any order is
/// `K · u · Σ|terms|`, so the two differ by at most about `2 · K · u` relative to the
/// output's magnitude. Every layer adds its own difference to the residual stream, and the
/// norms rescale it by the stream's inverse RMS (about 1 here); the LM head then maps the
/// last hidden state to logits. So the tolerance is `2 · K · u · layers · (largest |logit|)`,
/// about 4·10⁻⁴ of the largest logit at the default sizes (`K` = 768, 4 layers). In practice rounding errors
/// cancel rather than add: the differences measured are about two orders of magnitude below
/// it (the check prints them). The reference's recomputation (a whole sequence per matrix
/// product instead of one position) changes only the order of additions too. A sharding bug (a head or a column block missing, a wrong
/// RoPE offset or cache position, a slice of the wrong heads) moves logits by a sizeable
/// fraction of their magnitude, far beyond it.
fn tolerance(d: Dims, largest_logit: f32) -> f32 {
    let k = (d.heads * d.head_dim).max(d.ffn) as f32;
    // f32::EPSILON is 2⁻²³ = 2u.
    k * f32::EPSILON * d.layers as f32 * largest_logit.max(1.0)
}

/// The `p`-quantile of `xs` (sorted in place).
fn quantile(xs: &mut [Duration], p: f64) -> Duration {
    xs.sort();
    if xs.is_empty() {
        return Duration::ZERO;
    }
    let i = ((xs.len() - 1) as f64 * p).round() as usize;
    xs[i]
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

/// The first token at which `a` and `b` differ, by index, and both tokens.
fn first_difference(a: &[u32], b: &[u32]) -> Option<(usize, u32, u32)> {
    a.iter()
        .zip(b)
        .enumerate()
        .find(|(_, (x, y))| x != y)
        .map(|(i, (x, y))| (i, *x, *y))
}

fn run(args: &Args) -> AnyResult<bool> {
    let d = Dims::from_args(args)?;
    if args.tokens == 0 || args.prompt == 0 {
        return Err("--tokens and --prompt must be at least 1".into());
    }

    // The group, with a clock around its transport.
    let engine_group = engine::init(false)?;
    let (rank, size) = (engine_group.rank(), engine_group.size());
    if let Some(r) = args.drop_shard
        && r >= size
    {
        return Err(format!("--drop-shard {r}: the group has ranks 0 to {}", size - 1).into());
    }
    let clock = Arc::new(Clock::default());
    let group = Group::new(Arc::new(Timed {
        inner: nuvec_distributed::communicator(engine_group.clone()),
        clock: clock.clone(),
        barrier: args.barrier,
    }));
    let wire = std::env::var(engine::WIRE_VAR).unwrap_or_else(|_| "mlx (default)".into());
    let links = (0..size)
        .filter(|&p| p != rank)
        .map(|p| Ok(format!("rank {p} over {}", engine_group.transport(p)?)))
        .collect::<AnyResult<Vec<_>>>()?;

    // The same weights and prompt on every rank.
    random::seed(args.seed);
    let full = weights(d);
    let prompt: Vec<u32> =
        random::randint(0, i64::from(d.vocab), [args.prompt], DType::U32, None).to_vec::<u32>()?;
    let mut sharded = Model::shard(&full, d, &group)?;
    if args.drop_shard == Some(rank)
        && let Shard::Linear(o) = &mut sharded.blocks[0].o.shard
    {
        o.weight = Param::new(ops::zeros(o.weight.shape(), DType::F32));
    }
    let unsharded = Model::shard(&full, d, &Group::single())?;
    // Draw and slice the weights now, so that the first step's time is the model's.
    nuvec::eval(&(&sharded, &unsharded))?;

    if rank == 0 {
        println!(
            "llama: {} layers, hidden {}, {} heads ({} key-value) of {}, ffn {}, vocab {}, \
             prompt {}, {} tokens; {size} ranks of {} query heads, {} key-value heads and {} \
             MLP columns each",
            d.layers,
            d.hidden,
            d.heads,
            d.kv_heads,
            d.head_dim,
            d.ffn,
            d.vocab,
            args.prompt,
            args.tokens,
            d.heads / size as i32,
            d.kv_heads / size as i32,
            d.ffn / size as i32
        );
    }
    println!(
        "rank {rank}: {}={wire}; {}",
        engine::WIRE_VAR,
        if links.is_empty() {
            "no peers".to_string()
        } else {
            links.join(", ")
        }
    );

    // The sharded model as inference runs it; the unsharded one the same way (for its
    // time), and recomputing every step (the reference the check compares with).
    let ours = generate(&sharded, &prompt, args.tokens, Keys::Cached, &clock)?;
    let alone = generate(&unsharded, &prompt, args.tokens, Keys::Cached, &clock)?;
    let reference = generate(&unsharded, &prompt, args.tokens, Keys::Recomputed, &clock)?;

    // Timing of the sharded decode steps.
    let steps = &ours.steps;
    let mut total: Vec<Duration> = steps.iter().map(|s| s.0).collect();
    let mut reduce: Vec<Duration> = steps.iter().map(|s| s.1.reduce).collect();
    let mut wait: Vec<Duration> = steps.iter().map(|s| s.1.wait).collect();
    let mut alone: Vec<Duration> = alone.steps.iter().map(|s| s.0).collect();
    let sum = |xs: &[Duration]| xs.iter().sum::<Duration>().as_secs_f64();
    let share = |part: &[Duration]| 100.0 * sum(part) / sum(&total).max(f64::MIN_POSITIVE);
    let (share_reduce, share_wait) = (share(&reduce), share(&wait));
    let calls = steps.first().map_or(0, |s| s.1.calls);
    println!(
        "rank {rank}: prefill of {} tokens {}; decode, per token: median {} (p10 {}, p90 {}) \
         over {} steps; {calls} all_sums of {} B per token: median {} per token, {share_reduce:.0}% \
         of decode time{}; unsharded on this rank: median {} per token",
        args.prompt,
        ms(ours.prefill),
        ms(quantile(&mut total, 0.5)),
        ms(quantile(&mut total, 0.1)),
        ms(quantile(&mut total, 0.9)),
        steps.len(),
        d.hidden * 4,
        ms(quantile(&mut reduce, 0.5)),
        if args.barrier {
            format!(
                " after every rank arrived; barriers before them (waiting for the last rank, \
                 plus one byte's latency each): median {} per token, {share_wait:.0}%",
                ms(quantile(&mut wait, 0.5))
            )
        } else {
            " (including the wait for the last rank)".to_string()
        },
        ms(quantile(&mut alone, 0.5)),
    );

    // The checks: this rank's sharded model against its unsharded one...
    let mut failures = Vec::new();
    if let Some((i, a, b)) = first_difference(&ours.tokens, &reference.tokens) {
        failures.push(format!(
            "rank {rank}: token {i} (sequence position {}): the sharded model generated {a}, \
             the unsharded (recomputing the sequence) {b}",
            args.prompt + i
        ));
    }
    // The logits behind each token, up to the first differing token (after it the two
    // models read different sequences). The worst step, relative to its tolerance, is
    // reported.
    let compared = first_difference(&ours.tokens, &reference.tokens)
        .map_or(ours.tokens.len(), |(i, ..)| i + 1);
    let mut worst = (0.0f32, 0.0f32, 0usize); // (difference, tolerance, token)
    for (i, (a, b)) in ours
        .logits
        .iter()
        .zip(&reference.logits)
        .take(compared)
        .enumerate()
    {
        let at = args.prompt + i;
        if let Some(x) = a.iter().chain(b).find(|x| !x.is_finite()) {
            failures.push(format!(
                "rank {rank}: token {i} (sequence position {at}): a logit is {x} (sharded or                  unsharded)"
            ));
            break;
        }
        let largest = b.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let tol = tolerance(d, largest);
        let diff = a
            .iter()
            .zip(b)
            .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
        if diff / tol >= worst.0 / worst.1.max(f32::MIN_POSITIVE) {
            worst = (diff, tol, i);
        }
        if diff > tol {
            failures.push(format!(
                "rank {rank}: token {i} (sequence position {at}): logits differ from the \
                 unsharded model's by up to {diff:.3e}, beyond the tolerance {tol:.3e}"
            ));
            break;
        }
    }

    // ...and the ranks' token sequences against each other (every rank must have generated
    // the same, as they summed the same partial outputs).
    let n = i32::try_from(ours.tokens.len())?;
    let everyone = distributed::all_gather(&Array::from_slice(&ours.tokens, [1, n]), Some(&group))
        .to_vec::<u32>()?;
    for (other, theirs) in everyone.chunks(ours.tokens.len()).enumerate() {
        if other != rank
            && let Some((i, a, b)) = first_difference(&ours.tokens, theirs)
        {
            failures.push(format!(
                "ranks {rank} and {other}: token {i} (sequence position {}): rank {rank} \
                 generated {a}, rank {other} {b}",
                args.prompt + i
            ));
        }
    }
    // Whether any rank failed, so every rank exits the same way.
    let failed_here = u32::from(!failures.is_empty());
    let failed_ranks =
        distributed::all_gather(&Array::from_slice(&[failed_here], [1]), Some(&group))
            .to_vec::<u32>()?;

    if failures.is_empty() {
        println!(
            "rank {rank}: ok: {} tokens equal to the unsharded model's ({:?}); logits \
             within {:.2e} of its (at token {}, where the tolerance is {:.2e})",
            ours.tokens.len(),
            ours.tokens,
            worst.0,
            worst.2,
            worst.1,
        );
    }
    for f in &failures {
        eprintln!("MISMATCH {f}");
    }
    let bad: Vec<usize> = (0..size).filter(|&r| failed_ranks[r] != 0).collect();
    if !bad.is_empty() {
        eprintln!("rank {rank}: the check failed on ranks {bad:?}");
        return Ok(false);
    }
    Ok(true)
}
