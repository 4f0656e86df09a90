//! Interop with real MLX: rings that mix Python `mx.distributed` ranks (MLX's CPU build,
//! 0.32.*) and Rust ranks, checked bit for bit against an all-MLX ring of the same shape.
//!
//! For each ring shape (P ranks, C connections) the test writes one plan of collectives
//! with per-rank inputs (random bits for integers; floats with NaNs of either sign and
//! payload, infinities, signed zeros and subnormals mixed in; see [`Specials`]), runs it on P MLX ranks, and
//! then on two mixed rings: Rust at the even positions and MLX at the odd ones, and the
//! reverse. Every rank's output in a mixed ring must equal, byte for byte, the output of
//! the MLX rank at the same position in the all-MLX ring. Since every position has both
//! kinds of neighbour in some ring, this covers connection setup in both roles, rank
//! P-1's connect-first order, the split into parallel rings, the small-array padding, and
//! the reduction order and NaN rules of every op.
//!
//! The MLX venv comes from `tools/mlx-venv.sh` (through [`testing::mlx_python`]), which
//! installs it when it is missing; if that fails, the test fails and says why.

use std::path::Path;

use nuvec_distributed_engine::{Complex64, Element, Group, ReduceOp, bf16, f16};
use nuvec_tools::test_cases;
use nuvec_tools::testing::{self, RankKind};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

const MIN_SEND: usize = 262_144;

#[derive(Clone, Debug, Serialize, Deserialize)]
struct OpSpec {
    op: String,
    dtype: String,
    count: usize,
}

/// The plan every rank of a ring runs.
type Plan = testing::Plan<OpSpec>;

fn dtype_size(dtype: &str) -> usize {
    match dtype {
        "bool" | "uint8" | "int8" => 1,
        "uint16" | "int16" | "float16" | "bfloat16" => 2,
        "uint32" | "int32" | "float32" => 4,
        _ => 8,
    }
}

/// The collectives one ring runs.
fn plan_ops(size: usize, connections: usize) -> Vec<OpSpec> {
    let spec = |op: &str, dtype: &str, count: usize| OpSpec {
        op: op.into(),
        dtype: dtype.into(),
        count,
    };
    let mut ops = Vec::new();
    let dtypes = [
        "bool",
        "uint8",
        "int16",
        "uint32",
        "int64",
        "float16",
        "bfloat16",
        "float32",
        "float64",
        "complex64",
    ];
    for dtype in dtypes {
        for op in ["all_sum", "all_max", "all_min"] {
            for count in [0, 1, size - 1, size + 1, 4099] {
                ops.push(spec(op, dtype, count));
            }
        }
        ops.push(spec("all_gather", dtype, 1));
        ops.push(spec("all_gather", dtype, 999));
    }
    // Across the sizes where MLX splits into 2 and (with two connections) 4 parallel rings.
    for dtype in ["float32", "float16", "bfloat16", "uint8"] {
        let elem = dtype_size(dtype);
        ops.push(spec("all_sum", dtype, 2 * size * MIN_SEND / elem + 3));
        if connections > 1 {
            ops.push(spec("all_max", dtype, 4 * size * MIN_SEND / elem + 1));
        }
    }
    ops.push(spec("all_gather", "float32", 2 * MIN_SEND / 4 + 7));
    if connections > 1 {
        ops.push(spec("all_gather", "uint8", 4 * MIN_SEND + 5));
    }
    for count in [1, 1500, 300_001] {
        ops.push(spec("sendrecv", "uint8", count));
    }
    ops.push(spec("sendrecv", "float32", 70_000));
    ops
}

/// Which specials an input may hold at an element.
#[derive(Clone, Copy)]
struct Specials {
    /// NaN and infinity may appear here. A sum of two NaNs is a NaN, but which operand's
    /// sign and payload it carries is not fixed: MLX's own build gives the incoming one in
    /// its vectorised loop and the accumulated one in the loop's scalar tail. Opposite
    /// infinities make a NaN of their own. So sums get NaNs and infinities from at most one
    /// rank per element; max and min, which only compare, get them from every rank.
    nan_inf: bool,
}

/// The little-endian bytes of one float whose bits are a `$bits` (`$exp` its exponent mask,
/// `$mant` its mantissa bits): the special drawn (0 NaN, 1 infinity, 2 zero, 3 subnormal)
/// or else `$normal`, negated when `$negative`. A macro so that each width draws from
/// `$rng` with its own integer type.
macro_rules! float_bits {
    ($bits:ty, $exp:expr, $mant:expr, $special:expr, $negative:expr, $rng:expr, $normal:expr) => {{
        let bits: $bits = match $special {
            Some(0) => $exp | $rng.random_range(1..1 << $mant),
            Some(1) => $exp,
            Some(2) => 0,
            Some(_) => $rng.random_range(1..1 << $mant),
            None => $normal,
        };
        let sign: $bits = if $negative {
            1 << (<$bits>::BITS - 1)
        } else {
            0
        };
        (bits | sign).to_le_bytes()
    }};
}

/// Random bits for integers; floats mostly ordinary, with NaNs, infinities, signed zeros
/// and subnormals mixed in (one in ten).
fn input_bytes(
    dtype: &str,
    count: usize,
    rng: &mut StdRng,
    specials: impl Fn(usize) -> Specials,
) -> Vec<u8> {
    let n = if dtype == "complex64" {
        2 * count
    } else {
        count
    };
    let mut out = Vec::with_capacity(n * 8);
    for e in 0..n {
        let s = specials(if dtype == "complex64" { e / 2 } else { e });
        // Which special, if any: 0 NaN, 1 infinity, 2 zero, 3 subnormal.
        let special = (rng.random_range(0..100) < 10)
            .then(|| rng.random_range(if s.nan_inf { 0 } else { 2 }..4));
        let negative = rng.random::<bool>();
        match dtype {
            "bool" => out.push(rng.random_range(0..2u8)),
            "float16" | "bfloat16" => {
                let (exp, mant_bits) = if dtype == "float16" {
                    (0x7C00u16, 10)
                } else {
                    (0x7F80u16, 7)
                };
                out.extend(float_bits!(u16, exp, mant_bits, special, negative, rng, {
                    let x = rng.random_range(0.0..100.0);
                    if dtype == "float16" {
                        f16::from_f32(x).to_bits()
                    } else {
                        bf16::from_f32(x).to_bits()
                    }
                }));
            }
            "float32" | "complex64" => out.extend(float_bits!(
                u32,
                0x7F80_0000,
                23,
                special,
                negative,
                rng,
                rng.random_range(0.0f32..1000.0).to_bits()
            )),
            "float64" => out.extend(float_bits!(
                u64,
                0x7FF0_0000_0000_0000,
                52,
                special,
                negative,
                rng,
                rng.random_range(0.0f64..1e6).to_bits()
            )),
            other => out.extend((0..dtype_size(other)).map(|_| rng.random::<u8>())),
        }
    }
    out
}

// ---- The Rust rank -------------------------------------------------------------------

/// Element types the Rust rank decodes from input files.
trait Wire: Element + Default {
    fn decode(bytes: &[u8]) -> Vec<Self>;
    fn encode(data: &[Self]) -> Vec<u8>;
}

impl<T> Wire for T
where
    T: Element + Default + FromBytes + IntoBytes + Immutable + KnownLayout,
{
    fn decode(bytes: &[u8]) -> Vec<Self> {
        <[T]>::ref_from_bytes(bytes)
            .map(<[T]>::to_vec)
            .unwrap_or_else(|_| {
                bytes
                    .chunks_exact(size_of::<T>())
                    .map(|c| T::read_from_bytes(c).unwrap())
                    .collect()
            })
    }
    fn encode(data: &[Self]) -> Vec<u8> {
        data.as_bytes().to_vec()
    }
}

fn run_typed<T: Wire>(g: &Group, op: &str, input: &[u8]) -> Vec<u8> {
    let (rank, size) = (g.rank(), g.size());
    let x = T::decode(input);
    let out = match op {
        "all_sum" | "all_max" | "all_min" => {
            let reduce: ReduceOp = op[4..].parse().unwrap();
            let mut y = x;
            g.all_reduce(reduce, &mut y)
                .unwrap_or_else(|e| panic!("{op}: {e}"));
            y
        }
        "all_gather" => {
            let mut y = vec![T::default(); x.len() * size];
            g.all_gather(&x, &mut y)
                .unwrap_or_else(|e| panic!("{op}: {e}"));
            y
        }
        "sendrecv" => sendrecv(g, &x, rank, size),
        other => panic!("unknown op {other}"),
    };
    T::encode(&out)
}

fn sendrecv<T: Element + Default>(g: &Group, x: &[T], rank: usize, size: usize) -> Vec<T> {
    let (left, right) = ((rank + size - 1) % size, (rank + 1) % size);
    let mut y = vec![T::default(); x.len()];
    if rank.is_multiple_of(2) {
        g.send(x, right).unwrap();
        g.recv(&mut y, left).unwrap();
    } else {
        g.recv(&mut y, left).unwrap();
        g.send(x, right).unwrap();
    }
    y
}

/// `bool` cannot be viewed from arbitrary bytes, so it is decoded by hand (0 or 1).
fn run_bool(g: &Group, op: &str, input: &[u8]) -> Vec<u8> {
    let (rank, size) = (g.rank(), g.size());
    let x: Vec<bool> = input.iter().map(|&b| b != 0).collect();
    let out = match op {
        "all_sum" | "all_max" | "all_min" => {
            let mut y = x;
            g.all_reduce(op[4..].parse().unwrap(), &mut y).unwrap();
            y
        }
        "all_gather" => {
            let mut y = vec![false; x.len() * size];
            g.all_gather(&x, &mut y).unwrap();
            y
        }
        _ => sendrecv(g, &x, rank, size),
    };
    out.into_iter().map(u8::from).collect()
}

/// Runs `op` on `input` as elements of `dtype` (MLX's name for the type).
fn run_dtype(g: &Group, op: &str, dtype: &str, input: &[u8]) -> Vec<u8> {
    // The type whose `Element::DTYPE` has that name.
    macro_rules! typed {
        ($($t:ty),*) => {
            $(if dtype == <$t as Element>::DTYPE.name() {
                return run_typed::<$t>(g, op, input);
            })*
        };
    }
    if dtype == "bool" {
        return run_bool(g, op, input);
    }
    typed!(
        u8, u16, u32, u64, i8, i16, i32, i64, f16, bf16, f32, f64, Complex64
    );
    panic!("unknown dtype {dtype}")
}

fn rust_rank(plan_path: &Path, out_dir: &Path) {
    let plan = Plan::read(plan_path);
    let g = nuvec_distributed_engine::init_backend(true, nuvec_distributed_engine::Backend::Ring)
        .expect("the ring forms");
    let rank = g.rank();
    for (i, spec) in plan.ops.iter().enumerate() {
        let input = std::fs::read(plan.dir.join(format!("in-{rank}-{i}.bin"))).unwrap();
        let out = run_dtype(&g, &spec.op, &spec.dtype, &input);
        std::fs::write(out_dir.join(format!("out-{rank}-{i}.bin")), out).unwrap();
    }
}

// ---- The driver ----------------------------------------------------------------------

/// One ring shape: `size` ranks, `connections` per neighbour.
fn interop(test: &str, size: usize, connections: usize) {
    if testing::as_interop_rank(test, rust_rank) {
        return;
    }
    let work = testing::interop_work_dir("nuvec-interop-");
    let ops = plan_ops(size, connections);
    let mut rng = StdRng::seed_from_u64(size as u64 * 31 + connections as u64);
    for (i, spec) in ops.iter().enumerate() {
        for rank in 0..size {
            let sum = spec.op == "all_sum";
            let specials = |e: usize| Specials {
                nan_inf: !sum || e % size == rank,
            };
            let bytes = input_bytes(&spec.dtype, spec.count, &mut rng, specials);
            std::fs::write(work.path().join(format!("in-{rank}-{i}.bin")), bytes).unwrap();
        }
    }
    let plan_path = Plan::write(work.path(), &ops);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/mlx_rank.py");
    let ring = |kinds: &[RankKind], label: &str| {
        testing::run_interop_ring(
            test,
            kinds,
            connections,
            &script,
            &plan_path,
            work.path(),
            label,
        )
    };
    let reference = ring(&vec![RankKind::Mlx; size], "mlx");
    let layouts = RankKind::alternating(size);
    for (l, kinds) in layouts.iter().enumerate() {
        let mixed = ring(kinds, &format!("mixed{l}"));
        for (i, spec) in ops.iter().enumerate() {
            for (rank, kind) in kinds.iter().enumerate() {
                let name = format!("out-{rank}-{i}.bin");
                let want = std::fs::read(reference.join(&name)).unwrap();
                let got = std::fs::read(mixed.join(&name)).unwrap();
                if got != want {
                    let at = got.iter().zip(&want).position(|(a, b)| a != b);
                    panic!(
                        "ring {kinds:?} (P={size}, C={connections}): {kind:?} rank {rank} differs from \
                         the all-MLX ring in op {i} {spec:?}: {} bytes vs {}, first difference at byte {at:?}",
                        got.len(),
                        want.len()
                    );
                }
            }
        }
    }
}

test_cases!(interop {
    interop_p2_c1: 2, 1;
    interop_p2_c2: 2, 2;
    interop_p3_c1: 3, 1;
    interop_p3_c2: 3, 2;
    interop_p4_c1: 4, 1;
    interop_p4_c2: 4, 2;
});
