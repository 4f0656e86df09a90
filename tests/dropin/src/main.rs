//! A nuvec user's program: nuvec's distributed collectives across processes, each result
//! checked against the value it must have, with this repository's nuvec-distributed
//! patched in for the registry's (see Cargo.toml). Every rank of a launch runs it:
//!
//! ```text
//! nuvec launch -n 4 [--wire native] -- target/dropin/release/nuvec-dropin 4
//! ```
//!
//! The argument is the number of ranks launched. Each rank prints one line per check
//! (`nuvec launch` puts the rank before it), then `rank r of n (wire): N checks passed`.
//! On the first wrong value or unexpected error it prints the check, the rank, what it
//! expected and what it got, and exits with status 1; `nuvec launch` then ends the other
//! ranks and exits with that status. The inputs are small integers (and halves) in every
//! dtype, so every exact result is known: sums of them round in no dtype, whatever order
//! the ranks add in.
//!
//! The last check makes the highest rank leave; every other rank's next collective on the
//! group must then fail with an error naming it.

#![forbid(unsafe_code)]

use std::fmt::Debug;
use std::process::ExitCode;

use nuvec::distributed::{self, Group};
use nuvec::{Array, Complex64, DType, Element, Param, bf16, f16};
use nuvec_nn::sharded::{AllToShardedLinear, ShardedToAllLinear};
use nuvec_nn::{Linear, relu};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("{failure}");
            ExitCode::FAILURE
        }
    }
}

/// The ring's wire, as `nuvec launch --wire` passes it to the ranks.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wire {
    Mlx,
    Native,
}

impl std::fmt::Display for Wire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Wire::Mlx => "MLX",
            Wire::Native => "native",
        })
    }
}

/// A check that failed: which, on which rank, what it expected and what it got.
#[derive(Debug)]
struct Failure {
    check: String,
    rank: String,
    expected: String,
    got: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "FAILED {} on {}: expected {}, got {}",
            self.check, self.rank, self.expected, self.got
        )
    }
}

type Check<T = ()> = Result<T, Failure>;

/// This rank's group and how far the checks got.
struct Ranks {
    group: Group,
    rank: usize,
    size: usize,
    wire: Wire,
    passed: usize,
}

impl Ranks {
    fn who(&self) -> String {
        format!("rank {} of {} ({} wire)", self.rank, self.size, self.wire)
    }

    fn fail(&self, check: &str, expected: impl Into<String>, got: impl Into<String>) -> Failure {
        Failure {
            check: check.into(),
            rank: self.who(),
            expected: expected.into(),
            got: got.into(),
        }
    }

    fn pass(&mut self, check: &str) {
        self.passed += 1;
        println!("ok {check}");
    }

    /// `result`'s value, or a failure naming `check` when it is an error.
    fn ok<T>(&self, check: &str, result: nuvec::Result<T>) -> Check<T> {
        result.map_err(|e| self.fail(check, "a result", format!("the error \"{e}\"")))
    }

    /// That `got` is `expected`, element for element.
    fn same<T: PartialEq + Debug>(
        &self,
        check: &str,
        expected: &[T],
        got: nuvec::Result<Vec<T>>,
    ) -> Check {
        let got = self.ok(check, got)?;
        if got.len() != expected.len() {
            return Err(self.fail(
                check,
                format!("{} elements", expected.len()),
                format!("{} elements", got.len()),
            ));
        }
        match expected.iter().zip(&got).position(|(e, g)| e != g) {
            None => Ok(()),
            Some(_) if expected.len() <= 8 => {
                Err(self.fail(check, format!("{expected:?}"), format!("{got:?}")))
            }
            Some(i) => Err(self.fail(
                check,
                format!("{:?} at element {i} of {}", expected[i], expected.len()),
                format!("{:?}", got[i]),
            )),
        }
    }

    /// That `array` has `shape`.
    fn shape(&self, check: &str, array: &Array, shape: &[i32]) -> Check {
        if array.shape() == shape {
            Ok(())
        } else {
            Err(self.fail(
                check,
                format!("shape {shape:?}"),
                format!("shape {:?}", array.shape()),
            ))
        }
    }

    /// That evaluating `array` (of `T`) fails, from `eval` and from `to_vec` alike, with an
    /// error whose text contains each of `words`: a failed collective is a failed array,
    /// never a panic. Returns the error's text.
    fn fails<T: Element>(&self, check: &str, array: &Array, words: &[&str]) -> Check<String> {
        let (Err(e), Err(read)) = (array.eval(), array.to_vec::<T>()) else {
            return Err(self.fail(
                check,
                "an error from eval and from to_vec",
                "a value from at least one of them",
            ));
        };
        let text = e.to_string();
        if read.to_string() != text {
            return Err(self.fail(
                check,
                format!("to_vec's error to be eval's, \"{text}\""),
                format!("\"{read}\""),
            ));
        }
        match words.iter().find(|w| !text.contains(*w)) {
            None => Ok(text),
            Some(w) => Err(self.fail(
                check,
                format!("an error mentioning \"{w}\""),
                format!("\"{text}\""),
            )),
        }
    }

    /// A collective every rank takes part in, so that a rank that finished a check alone
    /// does not run ahead into the next one's transfers.
    fn barrier(&self, check: &str) -> Check {
        let n = self.size as f32;
        self.same(
            check,
            &[n],
            distributed::all_sum(&Array::from_slice(&[1.0f32], [1]), None).to_vec(),
        )
    }
}

fn run() -> Check {
    let mut args = std::env::args().skip(1);
    // At least two: the checks send between ranks 0 and 1, and one rank leaves at the end.
    let launched: Option<usize> = args.next().and_then(|a| a.parse().ok()).filter(|&n| n >= 2);
    let setup = |expected: &str, got: String| Failure {
        check: "setup".into(),
        rank: std::env::var("MLX_RANK").map_or_else(
            |_| "a process outside a launch (MLX_RANK unset)".into(),
            |r| format!("rank {r}"),
        ),
        expected: expected.into(),
        got,
    };
    let Some(launched) = launched else {
        return Err(setup(
            "one argument, the number of ranks launched (2 or more)",
            format!("{:?}", std::env::args().skip(1).collect::<Vec<_>>()),
        ));
    };
    let wire = match std::env::var("NUVEC_DISTRIBUTED_WIRE").as_deref() {
        Err(_) | Ok("mlx") => Wire::Mlx,
        Ok("native") => Wire::Native,
        Ok(other) => {
            return Err(setup(
                "NUVEC_DISTRIBUTED_WIRE unset, mlx or native",
                other.to_string(),
            ));
        }
    };

    // What a nuvec user writes: nuvec's re-export of nuvec-distributed's init.
    let group = distributed::init(true)
        .map_err(|e| setup("a group from nuvec::distributed::init", e.to_string()))?;
    let mut r = Ranks {
        rank: group.rank(),
        size: group.size(),
        group,
        wire,
        passed: 0,
    };
    init(&mut r, launched)?;

    reductions::<f32>(&mut r)?;
    reductions::<f16>(&mut r)?;
    reductions::<bf16>(&mut r)?;
    reductions::<i32>(&mut r)?;
    // The other ten dtypes nuvec has: every one reduces (none is refused).
    reductions::<bool>(&mut r)?;
    reductions::<u8>(&mut r)?;
    reductions::<u16>(&mut r)?;
    reductions::<u32>(&mut r)?;
    reductions::<u64>(&mut r)?;
    reductions::<i8>(&mut r)?;
    reductions::<i16>(&mut r)?;
    reductions::<i64>(&mut r)?;
    reductions::<f64>(&mut r)?;
    reductions::<Complex64>(&mut r)?;

    gathers(&mut r)?;
    sends(&mut r)?;
    splits(&mut r)?;
    gradients(&mut r)?;
    tensor_parallel(&mut r)?;

    failed_recv(&mut r)?;
    failed_send(&mut r)?;
    failed_mismatch(&mut r)?;
    // Last: one rank leaves.
    failed_peer(&mut r)
}

fn init(r: &mut Ranks, launched: usize) -> Check {
    let check = "init: rank and size from the launch, and the default group";
    let env_rank = std::env::var("MLX_RANK").ok().and_then(|v| v.parse().ok());
    if (Some(r.rank), r.size) != (env_rank, launched) {
        return Err(r.fail(
            check,
            format!("rank {env_rank:?} (MLX_RANK) of {launched}"),
            format!("rank {} of {}", r.rank, r.size),
        ));
    }
    let default = distributed::default_group();
    if (default.rank(), default.size()) != (r.rank, r.size) {
        return Err(r.fail(
            check,
            format!("the default group to be init's, {:?}", r.group),
            format!("{default:?}"),
        ));
    }
    r.pass(check);
    Ok(())
}

// ---- all_sum, all_max, all_min -------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum Op {
    Sum,
    Max,
    Min,
}

impl Op {
    const ALL: [Op; 3] = [Op::Sum, Op::Max, Op::Min];

    fn name(self) -> &'static str {
        match self {
            Op::Sum => "all_sum",
            Op::Max => "all_max",
            Op::Min => "all_min",
        }
    }

    fn apply(self, x: &Array, group: Option<&Group>) -> Array {
        match self {
            Op::Sum => distributed::all_sum(x, group),
            Op::Max => distributed::all_max(x, group),
            Op::Min => distributed::all_min(x, group),
        }
    }
}

/// A small integer from -8 to 8 for rank `rank`'s element `i`, different across ranks.
fn small(rank: usize, i: usize) -> i64 {
    ((7 * i + 3 * rank) % 17) as i64 - 8
}

/// An element type, the inputs each rank reduces and the reduction's meaning (MLX's).
trait Elem: Element + PartialEq + Debug {
    const NAME: &'static str;
    /// Rank `rank`'s element `i`.
    fn value(rank: usize, i: usize) -> Self;
    /// Two ranks' elements reduced, as every rank must get them.
    fn combine(op: Op, a: Self, b: Self) -> Self;
}

// Integers wrap on overflow (MLX's semantics): element 0 is past half the type's range on
// every rank, so its sum wraps; the others are small, taken modulo 2^bits (`as`) for the
// unsigned types.
macro_rules! integer {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            const NAME: &'static str = stringify!($t);
            fn value(rank: usize, i: usize) -> Self {
                if i == 0 {
                    <$t>::MAX / 2 + 1 + rank as $t
                } else {
                    small(rank, i) as $t
                }
            }
            fn combine(op: Op, a: Self, b: Self) -> Self {
                match op {
                    Op::Sum => a.wrapping_add(b),
                    Op::Max => a.max(b),
                    Op::Min => a.min(b),
                }
            }
        }
    )*};
}
integer!(u8, u16, u32, u64, i8, i16, i32, i64);

/// A float input: a small integer, plus a half on every third element; rank 0's element 1
/// is +inf. Sums of these are exact in every float dtype.
fn float(rank: usize, i: usize) -> f64 {
    if i == 1 && rank == 0 {
        f64::INFINITY
    } else {
        small(rank, i) as f64 + if i.is_multiple_of(3) { 0.5 } else { 0.0 }
    }
}

/// Float reductions, in `f64` (exact for these inputs); no input is NaN.
fn combine_float(op: Op, a: f64, b: f64) -> f64 {
    match op {
        Op::Sum => a + b,
        Op::Max => a.max(b),
        Op::Min => a.min(b),
    }
}

macro_rules! float {
    ($($t:ty: $from:expr, $to:expr;)*) => {$(
        impl Elem for $t {
            const NAME: &'static str = stringify!($t);
            fn value(rank: usize, i: usize) -> Self {
                $from(float(rank, i))
            }
            fn combine(op: Op, a: Self, b: Self) -> Self {
                $from(combine_float(op, $to(a), $to(b)))
            }
        }
    )*};
}
float! {
    f32: |v: f64| v as f32, f64::from;
    f64: |v: f64| v, |v: f64| v;
    f16: f16::from_f64, f16::to_f64;
    bf16: bf16::from_f64, bf16::to_f64;
}

impl Elem for bool {
    const NAME: &'static str = "bool";
    fn value(rank: usize, i: usize) -> Self {
        (i + rank).is_multiple_of(3)
    }
    /// Sum and max are "or", min is "and".
    fn combine(op: Op, a: Self, b: Self) -> Self {
        match op {
            Op::Sum | Op::Max => a || b,
            Op::Min => a && b,
        }
    }
}

impl Elem for Complex64 {
    const NAME: &'static str = "complex64";
    fn value(rank: usize, i: usize) -> Self {
        Complex64::new(small(rank, i) as f32, small(rank, i + 5) as f32)
    }
    /// Sums part by part; max and min in MLX's order (the real parts, then the imaginary).
    fn combine(op: Op, a: Self, b: Self) -> Self {
        let greater = (a.re, a.im) > (b.re, b.im);
        match op {
            Op::Sum => Complex64::new(a.re + b.re, a.im + b.im),
            Op::Max if greater => a,
            Op::Min if !greater => a,
            Op::Max | Op::Min => b,
        }
    }
}

/// all_sum, all_max and all_min of `T` over the default group, at 5 elements (fewer than
/// some rings have chunks) and at 3001 (uneven chunks).
fn reductions<T: Elem>(r: &mut Ranks) -> Check {
    for op in Op::ALL {
        for len in [5, 3001] {
            let check = format!("{} {} [{len}]", op.name(), T::NAME);
            let mine: Vec<T> = (0..len).map(|i| T::value(r.rank, i)).collect();
            let expected: Vec<T> = (0..len)
                .map(|i| {
                    (1..r.size).fold(T::value(0, i), |acc, rank| {
                        T::combine(op, acc, T::value(rank, i))
                    })
                })
                .collect();
            let x = Array::from_slice(&mine, [len]);
            r.same(&check, &expected, op.apply(&x, None).to_vec::<T>())?;
        }
    }
    r.pass(&format!(
        "all_sum, all_max, all_min {}: 5 and 3001 elements",
        T::NAME
    ));
    Ok(())
}

// ---- all_gather ----------------------------------------------------------------------

fn gathers(r: &mut Ranks) -> Check {
    let n = r.size;

    let check = "all_gather f32 [2, 3] -> [2n, 3]";
    let rows = |rank: usize| (0..6).map(move |k| (100 * rank + k) as f32);
    let mine: Vec<f32> = rows(r.rank).collect();
    let expected: Vec<f32> = (0..n).flat_map(rows).collect();
    let g = distributed::all_gather(&Array::from_slice(&mine, [2, 3]), None);
    r.same(check, &expected, g.to_vec())?;
    r.shape(check, &g, &[2 * n as i32, 3])?;
    r.pass(check);

    let check = "all_gather i32 scalar -> [n]";
    let expected: Vec<i32> = (0..n).map(|rank| 7 * rank as i32 - 3).collect();
    let g = distributed::all_gather(&Array::from(7 * r.rank as i32 - 3), Some(&r.group));
    r.same(check, &expected, g.to_vec())?;
    r.shape(check, &g, &[n as i32])?;
    r.pass(check);

    let check = "all_gather f16 [3] and bf16 [3] -> [3n]";
    let halves = |rank: usize| (0..3).map(move |k| rank as f64 * 4.0 + k as f64 - 0.5);
    let mine: Vec<f64> = halves(r.rank).collect();
    let expected: Vec<f64> = (0..n).flat_map(halves).collect();
    let h: Vec<f16> = mine.iter().map(|&v| f16::from_f64(v)).collect();
    let b: Vec<bf16> = mine.iter().map(|&v| bf16::from_f64(v)).collect();
    let gh = distributed::all_gather(&Array::from_slice(&h, [3]), None);
    let gb = distributed::all_gather(&Array::from_slice(&b, [3]), None);
    let eh: Vec<f16> = expected.iter().map(|&v| f16::from_f64(v)).collect();
    let eb: Vec<bf16> = expected.iter().map(|&v| bf16::from_f64(v)).collect();
    r.same(check, &eh, gh.to_vec())?;
    r.same(check, &eb, gb.to_vec())?;
    r.pass(check);
    Ok(())
}

// ---- send and recv -------------------------------------------------------------------

/// What rank `src` sends rank `dst`: an f32 vector and a bf16 matrix, both naming the pair.
fn payload(src: usize, dst: usize) -> (Vec<f32>, Vec<bf16>) {
    let f = (0..5).map(|k| (1000 * src + 10 * dst + k) as f32).collect();
    let b = (0..6)
        .map(|k| bf16::from_f64((16 * src + 4 * dst + k) as f64))
        .collect();
    (f, b)
}

/// Transfers in one order that every rank follows, each rank doing its part of each (so
/// that, whatever a send waits for, the earliest unfinished transfer always has both of its
/// ranks at it). MLX's wire reaches the ring's neighbours only: each rank to the next,
/// then each to the previous. The native wire connects every pair: all ordered pairs.
fn transfers(r: &Ranks) -> Vec<(usize, usize)> {
    let n = r.size;
    match r.wire {
        Wire::Mlx => {
            let right = (0..n).map(|s| (s, (s + 1) % n));
            let left = (0..n).map(|s| ((s + 1) % n, s));
            right.chain(left).collect()
        }
        Wire::Native => (0..n)
            .flat_map(|s| (0..n).filter(move |&d| d != s).map(move |d| (s, d)))
            .collect(),
    }
}

fn sends(r: &mut Ranks) -> Check {
    let pairs = transfers(r);
    for &(src, dst) in &pairs {
        let check = format!("send {src} -> {dst}, recv f32 [5] and bf16 [2, 3]");
        let (f, b) = payload(src, dst);
        if r.rank == src {
            // One at a time: arrays evaluated together may run in either order.
            let sent = distributed::send(&Array::from_slice(&f, [5]), dst, None);
            r.ok(&check, sent.eval())?;
            let sent = distributed::send(&Array::from_slice(&b, [2, 3]), dst, None);
            r.ok(&check, sent.eval())?;
        } else if r.rank == dst {
            let gf = distributed::recv([5], DType::F32, src, None);
            r.same(&check, &f, gf.to_vec())?;
            let gb = distributed::recv([2, 3], DType::BF16, src, Some(&r.group));
            r.same(&check, &b, gb.to_vec())?;
            r.shape(&check, &gb, &[2, 3])?;
        }
    }
    r.barrier("send and recv: every rank done")?;
    let which = match r.wire {
        Wire::Mlx => "each rank to both ring neighbours",
        Wire::Native => "every ordered pair of ranks",
    };
    r.pass(&format!("send/recv, {which} ({} transfers)", pairs.len()));
    Ok(())
}

// ---- split ---------------------------------------------------------------------------

fn splits(r: &mut Ranks) -> Check {
    let n = r.size;

    let check = "split(0, reversed keys): every rank, renumbered backwards";
    let sub = r.ok(check, r.group.split(0, (n - 1 - r.rank) as i32))?;
    if (sub.rank(), sub.size()) != (n - 1 - r.rank, n) {
        return Err(r.fail(
            check,
            format!("rank {} of {n}", n - 1 - r.rank),
            format!("{sub:?}"),
        ));
    }
    let expected: Vec<i32> = (0..n as i32).rev().collect();
    let g = distributed::all_gather(&Array::from_slice(&[r.rank as i32], [1]), Some(&sub));
    r.same(check, &expected, g.to_vec())?;
    let s = distributed::all_sum(&Array::from_slice(&[r.rank as f32 + 1.0], [1]), Some(&sub));
    r.same(check, &[(n * (n + 1) / 2) as f32], s.to_vec())?;
    r.pass(check);

    let check = "split(rank % 2, rank): even and odd ranks apart";
    let sub = r.ok(check, r.group.split((r.rank % 2) as i32, r.rank as i32))?;
    let members: Vec<i32> = (0..n)
        .filter(|m| m % 2 == r.rank % 2)
        .map(|m| m as i32)
        .collect();
    if (sub.rank(), sub.size()) != (r.rank / 2, members.len()) {
        return Err(r.fail(
            check,
            format!("rank {} of {}", r.rank / 2, members.len()),
            format!("{sub:?}"),
        ));
    }
    let g = distributed::all_gather(&Array::from_slice(&[r.rank as i32], [1]), Some(&sub));
    r.same(check, &members, g.to_vec())?;
    let s = distributed::all_max(&Array::from_slice(&[r.rank as i32], [1]), Some(&sub));
    r.same(check, &[*members.last().unwrap_or(&-1)], s.to_vec())?;
    r.pass(check);

    // The parent group is untouched by its sub-groups.
    r.barrier("split: the parent group still reduces")?;
    Ok(())
}

// ---- grad ----------------------------------------------------------------------------

fn gradients(r: &mut Ranks) -> Check {
    let n = r.size;
    let rank = r.rank as f32;

    // sum_gradients is the identity forward; backward it sums the cotangents over the
    // group, so each rank's gradient is the sum of every rank's weights.
    let check = "grad through sum_gradients: every rank's weights summed";
    let x = Array::from_slice(&[1.0f32, 2.0, 3.0], [3]);
    let w = Array::from_slice(&[rank + 1.0, 2.0 * rank, -1.0], [3]);
    let f = |x: &Array| distributed::sum_gradients(x, None).multiply(&w).sum(..);
    let (value, grad) = r.ok(check, nuvec::value_and_grad(f)(&x))?;
    r.same(
        check,
        &[(rank + 1.0) + 4.0 * rank - 3.0],
        value.to_vec::<f32>(),
    )?;
    let n_f = n as f32;
    let expected = [n_f * (n_f + 1.0) / 2.0, n_f * (n_f - 1.0), -n_f];
    r.same(check, &expected, grad.to_vec())?;
    r.pass(check);

    // all_gather's gradient is this rank's rows of the gathered cotangent.
    let check = "grad through all_gather: this rank's slice of the cotangent";
    let x = Array::from_slice(&[rank + 1.0, -rank], [2]);
    let c: Vec<f32> = (1..=2 * n).map(|k| k as f32).collect();
    let ca = Array::from_slice(&c, [2 * n]);
    let f = |x: &Array| distributed::all_gather(x, None).multiply(&ca).sum(..);
    let (value, grad) = r.ok(check, nuvec::value_and_grad(f)(&x))?;
    let total: f32 = (0..n)
        .map(|s| (s as f32 + 1.0) * c[2 * s] - s as f32 * c[2 * s + 1])
        .sum();
    r.same(check, &[total], value.to_vec())?;
    r.same(check, &c[2 * r.rank..2 * r.rank + 2], grad.to_vec())?;
    r.pass(check);
    Ok(())
}

/// A linear layer with small integer weights and bias: `w[o][i] = (a*o + b*i) % m - m/2`.
fn integer_linear(input: usize, output: usize, (a, b, m): (usize, usize, usize)) -> Linear {
    let w: Vec<f32> = (0..output * input)
        .map(|k| ((a * (k / input) + b * (k % input)) % m) as f32 - (m / 2) as f32)
        .collect();
    let bias: Vec<f32> = (0..output).map(|o| (o % 3) as f32 - 1.0).collect();
    Linear {
        weight: Param::new(Array::from_slice(&w, [output, input])),
        bias: Some(Param::new(Array::from_slice(&bias, [output]))),
    }
}

/// nuvec-nn's tensor-parallel pair (the hidden features split across the ranks) against
/// the same block unsharded on this rank: the outputs and the input's gradient (through
/// `sum_gradients` in `AllToShardedLinear`) are equal, exactly with integer weights.
fn tensor_parallel(r: &mut Ranks) -> Check {
    let check =
        "nuvec-nn AllToShardedLinear + ShardedToAllLinear = the unsharded block, and its grad";
    let up = integer_linear(4, 8, (3, 5, 7));
    let down = integer_linear(8, 4, (2, 3, 5));
    let up_r = r.ok(check, AllToShardedLinear::from_linear(&up, &r.group))?;
    let down_r = r.ok(check, ShardedToAllLinear::from_linear(&down, &r.group))?;
    let x = Array::from_slice(&[1.0f32, -2.0, 3.0, 0.0, 2.0, 0.0, -1.0, 1.0], [2, 4]);

    let full = |x: &Array| down.forward(&relu(&up.forward(x))).sum(..);
    let sharded = |x: &Array| down_r.forward(&relu(&up_r.forward(x))).sum(..);
    let y = down.forward(&relu(&up.forward(&x)));
    let y_r = down_r.forward(&relu(&up_r.forward(&x)));
    let expected = r.ok(check, y.to_vec::<f32>())?;
    r.same(check, &expected, y_r.to_vec())?;

    let (_, g) = r.ok(check, nuvec::value_and_grad(full)(&x))?;
    let (_, g_r) = r.ok(check, nuvec::value_and_grad(sharded)(&x))?;
    let expected = r.ok(check, g.to_vec::<f32>())?;
    r.same(check, &expected, g_r.to_vec())?;
    r.pass(check);
    Ok(())
}

// ---- Failures are failed arrays ------------------------------------------------------

/// Passes `check` on a rank that saw the error `text`, or on a rank that only waited.
fn pass_with(r: &mut Ranks, check: &str, text: Option<String>) {
    match text {
        Some(text) => r.pass(&format!("{check}: \"{text}\"")),
        None => r.pass(&format!("{check} (waited)")),
    }
}

/// nuvec-core checks each `recv` against the sender's header: a rank expecting another
/// dtype gets an error, and the connection stays usable.
fn failed_recv(r: &mut Ranks) -> Check {
    let check = "recv of another dtype than sent: an error, then the pair still works";
    let x = Array::from_slice(&[1.0f32, 2.0, 3.0], [3]);
    let mut text = None;
    if r.rank == 0 {
        r.ok(check, distributed::send(&x, 1, None).eval())?;
        r.ok(check, distributed::send(&x, 1, None).eval())?;
    } else if r.rank == 1 {
        let wrong = distributed::recv([3], DType::I32, 0, None);
        text = Some(r.fails::<i32>(check, &wrong, &["another dtype or shape"])?);
        let right = distributed::recv([3], DType::F32, 0, None);
        r.same(check, &[1.0f32, 2.0, 3.0], right.to_vec())?;
    }
    r.barrier(check)?;
    pass_with(r, check, text);
    Ok(())
}

/// On MLX's wire a rank sends to its ring neighbours only: a send to another rank is the
/// engine's argument error, as a failed array, and leaves the group usable.
fn failed_send(r: &mut Ranks) -> Check {
    if r.wire == Wire::Native || r.size < 3 {
        println!(
            "not applicable: a send to a rank that is not a neighbour (every rank is reachable on \
             the {} wire of {} ranks)",
            r.wire, r.size
        );
        return Ok(());
    }
    let check = "send from rank 0 to rank 2, not a ring neighbour: an argument error";
    let mut text = None;
    if r.rank == 0 {
        let sent = distributed::send(&Array::from_slice(&[1.0f32], [1]), 2, None);
        text = Some(r.fails::<f32>(check, &sent, &["invalid argument", "send to rank 2"])?);
    }
    r.barrier(check)?;
    pass_with(r, check, text);
    Ok(())
}

/// On the native wire every message carries its call: ranks that disagree (one all_sum,
/// the others all_max) all fail, and those that compare calls with rank 0 name both: its
/// partner in recursive doubling, rank 1 (at P = 4 the others fail on what the failure
/// closed). On a sub-group of every rank, which fails alone: its parent stays usable.
fn failed_mismatch(r: &mut Ranks) -> Check {
    if r.wire == Wire::Mlx {
        println!(
            "not applicable: mismatched calls (MLX's wire carries no call header, so like MLX it \
             cannot see them)"
        );
        return Ok(());
    }
    let check = "all_sum on rank 0, all_max elsewhere (native wire): an error on every rank";
    let sub = r.ok(check, r.group.split(0, r.rank as i32))?;
    let x = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], [4]);
    let op = if r.rank == 0 { Op::Sum } else { Op::Max };
    let got = op.apply(&x, Some(&sub));
    let words: &[&str] = if r.rank <= 1 {
        &["invalid argument", "all_sum", "all_max"]
    } else {
        &[]
    };
    let text = r.fails::<f32>(check, &got, words)?;
    r.barrier(check)?;
    pass_with(r, check, Some(text));
    Ok(())
}

/// The highest rank leaves; every other rank's next collective fails, naming it, and so
/// does the one after (the group is failed).
fn failed_peer(r: &mut Ranks) -> Check {
    let check = "a collective after the last rank left: an I/O error naming it";
    r.barrier(check)?;
    let leaver = r.size - 1;
    if r.rank == leaver {
        println!("leaving, so that the other ranks' next collective fails");
        println!("{}: {} checks passed", r.who(), r.passed);
        return Ok(());
    }
    let x = Array::from_slice(&[1.0f32], [1]);
    let first = distributed::all_sum(&x, None);
    let rank = format!("rank {leaver}");
    let text = r.fails::<f32>(check, &first, &["I/O error", "all_sum", &rank])?;
    let second = distributed::all_gather(&x, None);
    r.fails::<f32>(check, &second, &["all_gather"])?;
    pass_with(r, check, Some(text));
    println!("{}: {} checks passed", r.who(), r.passed);
    Ok(())
}
