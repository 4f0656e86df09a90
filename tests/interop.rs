//! Interop with real MLX on nuvec arrays: rings that mix Python `mx.distributed` ranks
//! (MLX's CPU build, 0.32.*) with Rust ranks whose collectives are nuvec-core's
//! (`nuvec_core::distributed::all_sum`, `all_max`, `all_min`, `all_gather` on nuvec
//! `Array`s, over the group `nuvec_distributed::init` returns), checked bit for bit.
//!
//! For P = 2 and 3 the test writes one plan of collectives with per-rank inputs, runs it on
//! P MLX ranks (the reference), then on an all-Rust ring and on two mixed rings: Rust at
//! the even positions and MLX at the odd ones, and the reverse, so that every position
//! holds each kind next to the other. Every rank's output bytes (and result shape) must
//! equal those of the MLX rank at the same position in the all-MLX ring.
//!
//! The inputs are built to exercise what can go wrong between two implementations (see
//! [`float_pattern`] and [`int_pattern`]): half-precision and `float32` sums that round
//! (ties included, and sums whose result depends on the order of the additions), signed
//! zeros, NaNs with payloads and infinities where MLX's results are defined (the engine
//! README's Semantics: in a sum, NaNs and infinities come from one rank per element, or
//! infinities of one sign from all; `max`/`min` get them from every rank), overflow to
//! infinity, and integer sums that wrap. The patterns repeat every 32 elements, so they
//! fall in every segment of MLX's ring (each reduced in its own order); random values fill
//! the rest. [`check_coverage`] asserts on the reference outputs that these cases really
//! occur, so the comparison cannot pass by testing less than it claims.
//!
//! The second half shows what happens when nuvec's `send`/`recv` meet MLX's: nuvec-core
//! frames each sent array (a length, a header naming the dtype and shape, a length, the
//! data), and MLX sends bare bytes, so neither side can receive the other's array. See
//! [`exchange`].
//!
//! The MLX venv comes from `tools/mlx-venv.sh` (through [`testing::mlx_python`]), which
//! installs it when it is missing; if that fails, the test fails and says why.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nuvec_core::distributed;
use nuvec_core::{Array, Element, bf16, f16};
use nuvec_tools::testing::{self, Launch, RankKind as Kind, RankOutput};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// MLX's ring splits a reduction into parallel rings above `size * MIN_SEND` bytes.
const MIN_SEND: usize = 262_144;

/// Every pattern repeats with this period, so each falls in every segment of the ring.
const PERIOD: usize = 32;

const EXCHANGE_VAR: &str = "NUVEC_INTEROP_EXCHANGE";

#[derive(Clone, Debug, Serialize, Deserialize)]
struct OpSpec {
    /// `all_sum`, `all_max`, `all_min` or `all_gather`.
    op: String,
    /// MLX's dtype name.
    dtype: String,
    /// The collective's input shape.
    shape: Vec<usize>,
    /// Whether the input is the transpose of the stored (2-D) array, so that nuvec-core
    /// and MLX both make a contiguous copy first.
    transpose: bool,
}

impl OpSpec {
    fn count(&self) -> usize {
        self.shape.iter().product()
    }

    /// The shape of the array the input file holds, row-major.
    fn stored_shape(&self) -> Vec<usize> {
        if self.transpose {
            self.shape.iter().rev().copied().collect()
        } else {
            self.shape.clone()
        }
    }
}

/// The plan every rank of a ring runs.
type Plan = testing::Plan<OpSpec>;

// ---- Element formats ---------------------------------------------------------------------

/// A float format, by its bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Float {
    F16,
    BF16,
    F32,
    F64,
}

impl Float {
    fn of(dtype: &str) -> Option<Float> {
        Some(match dtype {
            "float16" => Float::F16,
            "bfloat16" => Float::BF16,
            "float32" => Float::F32,
            "float64" => Float::F64,
            _ => return None,
        })
    }

    fn bytes(self) -> usize {
        match self {
            Float::F16 | Float::BF16 => 2,
            Float::F32 => 4,
            Float::F64 => 8,
        }
    }

    fn mantissa_bits(self) -> u32 {
        match self {
            Float::F16 => 10,
            Float::BF16 => 7,
            Float::F32 => 23,
            Float::F64 => 52,
        }
    }

    fn sign(self) -> u64 {
        1 << (8 * self.bytes() - 1)
    }

    fn exponent(self) -> u64 {
        (self.sign() - 1) & !((1 << self.mantissa_bits()) - 1)
    }

    /// `v` rounded to the nearest value of this format (its bits).
    fn round(self, v: f64) -> u64 {
        match self {
            Float::F16 => u64::from(f16::from_f64(v).to_bits()),
            Float::BF16 => u64::from(bf16::from_f64(v).to_bits()),
            Float::F32 => u64::from((v as f32).to_bits()),
            Float::F64 => v.to_bits(),
        }
    }

    fn to_f64(self, bits: u64) -> f64 {
        match self {
            Float::F16 => f16::from_bits(bits as u16).to_f64(),
            Float::BF16 => bf16::from_bits(bits as u16).to_f64(),
            Float::F32 => f64::from(f32::from_bits(bits as u32)),
            Float::F64 => f64::from_bits(bits),
        }
    }

    fn is_nan(self, bits: u64) -> bool {
        bits & !self.sign() > self.exponent()
    }

    fn is_inf(self, bits: u64) -> bool {
        bits & !self.sign() == self.exponent()
    }

    /// A quiet NaN carrying `payload` in its low mantissa bits.
    fn nan(self, payload: u64, negative: bool) -> u64 {
        let quiet = 1 << (self.mantissa_bits() - 1);
        self.exponent() | quiet | (payload % quiet) | self.negative(negative)
    }

    fn inf(self, negative: bool) -> u64 {
        self.exponent() | self.negative(negative)
    }

    fn zero(self, negative: bool) -> u64 {
        self.negative(negative)
    }

    fn max_finite(self, negative: bool) -> u64 {
        (self.exponent() - 1) | self.negative(negative)
    }

    fn negative(self, negative: bool) -> u64 {
        if negative { self.sign() } else { 0 }
    }

    /// Half the distance from 1 to the next value: 1 plus this is a tie.
    fn half_ulp_of_one(self) -> f64 {
        (-f64::from(self.mantissa_bits() + 1)).exp2()
    }

    fn read(self, bytes: &[u8]) -> u64 {
        let mut b = [0u8; 8];
        b[..bytes.len()].copy_from_slice(bytes);
        u64::from_le_bytes(b)
    }
}

/// An integer format.
#[derive(Clone, Copy, Debug)]
struct Int {
    bytes: usize,
    signed: bool,
}

impl Int {
    fn of(dtype: &str) -> Option<Int> {
        Some(match dtype {
            "uint8" => Int {
                bytes: 1,
                signed: false,
            },
            "int32" => Int {
                bytes: 4,
                signed: true,
            },
            "int64" => Int {
                bytes: 8,
                signed: true,
            },
            _ => return None,
        })
    }

    fn min(self) -> i128 {
        if self.signed {
            -(1 << (8 * self.bytes - 1))
        } else {
            0
        }
    }

    fn max(self) -> i128 {
        if self.signed {
            (1 << (8 * self.bytes - 1)) - 1
        } else {
            (1 << (8 * self.bytes)) - 1
        }
    }

    /// `v`'s low bytes, little-endian (two's complement, so out-of-range values wrap).
    fn bytes_of(self, v: i128) -> Vec<u8> {
        v.to_le_bytes()[..self.bytes].to_vec()
    }

    fn read(self, bytes: &[u8]) -> i128 {
        let mut b = [0u8; 16];
        b[..self.bytes].copy_from_slice(&bytes[..self.bytes]);
        let v = i128::from_le_bytes(b);
        if self.signed && v > self.max() {
            v - (1 << (8 * self.bytes))
        } else {
            v
        }
    }

    /// `v` wrapped into this format's range.
    fn wrap(self, v: i128) -> i128 {
        self.read(&self.bytes_of(v))
    }
}

fn dtype_size(dtype: &str) -> usize {
    match dtype {
        "bool" => 1,
        d => Float::of(d)
            .map(Float::bytes)
            .or(Int::of(d).map(|i| i.bytes))
            .unwrap_or_else(|| panic!("no dtype {d}")),
    }
}

// ---- The plan and its inputs -------------------------------------------------------------

/// The dtypes the issue names, then others that exercise the adapter's dtype mapping.
const DTYPES: [&str; 8] = [
    "float32", "float16", "bfloat16", "int32", "bool", "uint8", "int64", "float64",
];

fn plan_ops(size: usize) -> Vec<OpSpec> {
    let spec = |op: &str, dtype: &str, shape: &[usize]| OpSpec {
        op: op.into(),
        dtype: dtype.into(),
        shape: shape.to_vec(),
        transpose: false,
    };
    let mut ops = Vec::new();
    for dtype in DTYPES {
        for op in ["all_sum", "all_max", "all_min"] {
            for count in [1, size + 1, 64, 4099] {
                ops.push(spec(op, dtype, &[count]));
            }
            ops.push(spec(op, dtype, &[3, 33]));
        }
        for shape in [&[][..], &[1], &[3, 5], &[999]] {
            ops.push(spec("all_gather", dtype, shape));
        }
    }
    // Across MLX's split into two parallel rings.
    for dtype in ["float32", "float16", "bfloat16", "int32"] {
        ops.push(spec(
            "all_sum",
            dtype,
            &[2 * size * MIN_SEND / dtype_size(dtype) + 3],
        ));
    }
    ops.push(spec("all_gather", "float32", &[2 * MIN_SEND / 4 + 7]));
    // Inputs that are views (transposes): both sides reduce a contiguous copy.
    for (op, dtype, shape) in [
        ("all_sum", "float32", [37, 11]),
        ("all_max", "bfloat16", [13, 29]),
        ("all_gather", "float16", [5, 7]),
    ] {
        let mut s = spec(op, dtype, &shape);
        s.transpose = true;
        ops.push(s);
    }
    ops
}

/// Pattern `k`'s value on `rank` of `size` in format `f`, for a sum (`sum`) or for
/// `max`/`min`; `None` past the last pattern.
///
/// Sums get NaNs and infinities from one rank per element, or infinities of one sign from
/// every rank: MLX leaves the payload of a sum of two NaNs unspecified (its own build picks
/// differently in different loops), and opposite infinities make a NaN of their own.
fn float_pattern(f: Float, sum: bool, k: usize, rank: usize, size: usize) -> Option<u64> {
    let last = rank == size - 1;
    let num = |v: f64| f.round(v);
    let half = f.half_ulp_of_one();
    let big = f64::from(f.mantissa_bits() + 1).exp2();
    Some(if sum {
        match k {
            0 => f.zero(true),
            1 => f.zero(rank == 0),
            2 => f.zero(last),
            3 => match rank {
                0 => num(1.5),
                1 => num(-1.5),
                _ => f.zero(true),
            },
            4 if rank == 0 => f.nan(0x15, false),
            4 => num(1.0),
            5 if last => f.nan(0x2A, true),
            5 => num(2.0),
            6 if rank == 1 % size => f.inf(false),
            6 => num(-3.0),
            7 => f.inf(true),
            // Overflow: the largest finite value from every rank sums to infinity.
            8 => f.max_finite(false),
            9 => f.max_finite(true),
            // Ties: 1 + half an ulp rounds to even (1), but half ulps added first do not.
            10 => num(if rank == 0 { 1.0 } else { half }),
            11 => num(if last { 1.0 } else { half }),
            // 1 + ulp is odd: adding half an ulp ties up to 1 + 2 ulp.
            12 => match rank {
                0 => num(1.0 + 2.0 * half),
                1 => num(half),
                _ => f.zero(false),
            },
            // Cancellation: whether 1 survives depends on the order of the additions.
            13 => match rank {
                0 => num(big),
                1 => num(1.0),
                _ => num(-big),
            },
            // Subnormals: the smallest, a few times over.
            14 => (rank as u64 + 1) | f.negative(rank % 2 == 1),
            _ => return None,
        }
    } else {
        match k {
            0 => f.zero(true),
            1 => f.zero(rank == 0),
            2 => f.zero(rank != 0),
            3 => f.zero(last),
            4 if rank == 0 => f.nan(0x11, false),
            4 => num(1.0),
            5 if last => f.nan(0x22, true),
            5 => num(1.0),
            6 if rank == 1 % size => f.nan(0x33, false),
            6 => num(-1.0),
            7 => f.nan(0x40 + rank as u64, rank % 2 == 1),
            8 => f.inf(rank != 0),
            9 => f.inf(true),
            10 => num(rank as f64 - 1.0),
            11 => (rank as u64 + 1) | f.negative(rank % 2 == 1),
            _ => return None,
        }
    })
}

/// Pattern `k`'s value on `rank` of `size` for an integer sum (`sum`) or `max`/`min`.
fn int_pattern(i: Int, sum: bool, k: usize, rank: usize, size: usize) -> Option<i128> {
    Some(if sum {
        match k {
            0 => i.max(),
            1 => i.min(),
            2 => {
                if rank == 0 {
                    i.max()
                } else {
                    1
                }
            }
            3 => {
                if rank == 0 {
                    i.min()
                } else {
                    -1
                }
            }
            4 => -1,
            _ => return None,
        }
    } else {
        match k {
            0 => {
                if rank == 0 {
                    i.min()
                } else {
                    i.max()
                }
            }
            1 => {
                if rank == 0 {
                    i.max()
                } else {
                    i.min()
                }
            }
            2 => {
                if rank == size - 1 {
                    -1
                } else {
                    0
                }
            }
            _ => return None,
        }
    })
}

/// A random float for element `e` of `rank`: mostly ordinary values of mixed magnitudes
/// and signs, one in ten a NaN, an infinity, a zero or a subnormal (NaNs and infinities in
/// a sum only on rank `e % size`).
fn random_float(f: Float, sum: bool, e: usize, rank: usize, size: usize, rng: &mut StdRng) -> u64 {
    let nan_inf = !sum || e % size == rank;
    let negative = rng.random::<bool>();
    if rng.random_range(0..100) < 10 {
        let mantissa = 1u64 << f.mantissa_bits();
        return match rng.random_range(if nan_inf { 0 } else { 2 }..4) {
            0 => f.nan(rng.random_range(0..mantissa), negative),
            1 => f.inf(negative),
            2 => f.zero(negative),
            _ => rng.random_range(1..mantissa) | f.negative(negative),
        };
    }
    let scale = f64::from(rng.random_range(-6..=6)).exp2();
    f.round(rng.random_range(-1.0..1.0) * scale)
}

/// Rank `rank`'s input for `spec`, as the row-major bytes of its stored array.
fn input_bytes(spec: &OpSpec, rank: usize, size: usize, rng: &mut StdRng) -> Vec<u8> {
    let sum = spec.op == "all_sum";
    let dtype = spec.dtype.as_str();
    let mut out = Vec::with_capacity(spec.count() * dtype_size(dtype));
    for e in 0..spec.count() {
        let k = e % PERIOD;
        if let Some(f) = Float::of(dtype) {
            let bits = float_pattern(f, sum, k, rank, size)
                .unwrap_or_else(|| random_float(f, sum, e, rank, size, rng));
            out.extend_from_slice(&bits.to_le_bytes()[..f.bytes()]);
        } else if let Some(i) = Int::of(dtype) {
            let v = int_pattern(i, sum, k, rank, size)
                .unwrap_or_else(|| i.read(&rng.random::<u64>().to_le_bytes()));
            out.extend(i.bytes_of(v));
        } else {
            let v = match k {
                0 => false,
                1 => true,
                2 => rank == 0,
                _ => rng.random(),
            };
            out.push(u8::from(v));
        }
    }
    out
}

// ---- The Rust rank -----------------------------------------------------------------------

/// A nuvec array of `dtype` holding `bytes` (row-major, little-endian) in `shape`.
fn array_of(dtype: &str, bytes: &[u8], shape: &[usize]) -> Array {
    fn typed<T: Element, const N: usize>(
        bytes: &[u8],
        shape: &[usize],
        decode: impl Fn([u8; N]) -> T,
    ) -> Array {
        let (elements, rest) = bytes.as_chunks::<N>();
        assert!(
            rest.is_empty(),
            "{} bytes are not whole elements",
            bytes.len()
        );
        let values: Vec<T> = elements.iter().map(|&c| decode(c)).collect();
        Array::from_slice(&values, shape)
    }
    match dtype {
        "bool" => typed(bytes, shape, |[b]: [u8; 1]| b != 0),
        "uint8" => typed(bytes, shape, u8::from_le_bytes),
        "int32" => typed(bytes, shape, i32::from_le_bytes),
        "int64" => typed(bytes, shape, i64::from_le_bytes),
        "float16" => typed(bytes, shape, |b| f16::from_bits(u16::from_le_bytes(b))),
        "bfloat16" => typed(bytes, shape, |b| bf16::from_bits(u16::from_le_bytes(b))),
        "float32" => typed(bytes, shape, |b| f32::from_bits(u32::from_le_bytes(b))),
        "float64" => typed(bytes, shape, |b| f64::from_bits(u64::from_le_bytes(b))),
        other => panic!("no dtype {other}"),
    }
}

/// `y`'s elements as row-major little-endian bytes (evaluating it).
fn bytes_of(dtype: &str, y: &Array) -> nuvec_core::Result<Vec<u8>> {
    fn typed<T: Element, const N: usize>(
        y: &Array,
        encode: impl Fn(T) -> [u8; N],
    ) -> nuvec_core::Result<Vec<u8>> {
        Ok(y.to_vec::<T>()?.into_iter().flat_map(encode).collect())
    }
    match dtype {
        "bool" => typed(y, |b: bool| [u8::from(b)]),
        "uint8" => y.to_vec::<u8>(),
        "int32" => typed(y, i32::to_le_bytes),
        "int64" => typed(y, i64::to_le_bytes),
        "float16" => typed(y, |v: f16| v.to_bits().to_le_bytes()),
        "bfloat16" => typed(y, |v: bf16| v.to_bits().to_le_bytes()),
        "float32" => typed(y, |v: f32| v.to_bits().to_le_bytes()),
        "float64" => typed(y, |v: f64| v.to_bits().to_le_bytes()),
        other => panic!("no dtype {other}"),
    }
}

/// Runs the plan with nuvec arrays on the group `init` forms from the launch environment,
/// writing each output and, at the end, every result's shape.
fn rust_rank(plan_path: &Path, out_dir: &Path) {
    let plan = Plan::read(plan_path);
    let group = nuvec_distributed::init(true).expect("the ring forms");
    let rank = group.rank();
    let mut shapes = Vec::new();
    for (i, spec) in plan.ops.iter().enumerate() {
        let input = std::fs::read(plan.dir.join(format!("in-{rank}-{i}.bin"))).unwrap();
        let x = array_of(&spec.dtype, &input, &spec.stored_shape());
        let x = if spec.transpose { x.t() } else { x };
        // The default group (which `init` set) and the group passed by hand, in turn.
        let g = (i % 2 == 0).then_some(&group);
        let y = match spec.op.as_str() {
            "all_sum" => distributed::all_sum(&x, g),
            "all_max" => distributed::all_max(&x, g),
            "all_min" => distributed::all_min(&x, g),
            "all_gather" => distributed::all_gather(&x, g),
            other => panic!("no op {other}"),
        };
        let out = bytes_of(&spec.dtype, &y)
            .unwrap_or_else(|e| panic!("rank {rank}: op {i} {spec:?}: {e}"));
        std::fs::write(out_dir.join(format!("out-{rank}-{i}.bin")), out).unwrap();
        shapes.push(y.shape().to_vec());
    }
    let shapes = serde_json::to_vec(&shapes).unwrap();
    std::fs::write(out_dir.join(format!("shapes-{rank}.json")), shapes).unwrap();
}

// ---- The driver --------------------------------------------------------------------------

fn mlx_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/mlx_rank.py")
}

/// Runs one ring of `kinds` over `plan_path` and returns the directory holding its outputs.
fn run_ring(test: &str, kinds: &[Kind], plan_path: &Path, work: &Path, label: &str) -> PathBuf {
    testing::run_interop_ring(test, kinds, 1, &mlx_script(), plan_path, work, label)
}

fn read_shapes(dir: &Path, rank: usize) -> Vec<Vec<i64>> {
    serde_json::from_slice(&std::fs::read(dir.join(format!("shapes-{rank}.json"))).unwrap())
        .unwrap()
}

/// What the reference outputs (the all-MLX ring's, in `dir`) hold, per case: the cases the
/// module docs promise, counted over every op, so that each is known to be compared.
#[derive(Debug, Default)]
struct Coverage {
    /// Float sums whose result is not the exact sum of the inputs, by dtype.
    rounded_sums: BTreeMap<String, usize>,
    /// Negative zeros in float sums, by dtype.
    negative_zero_sums: BTreeMap<String, usize>,
    /// Infinities in float sums, by dtype.
    infinite_sums: BTreeMap<String, usize>,
    /// NaNs in float maxima and minima, by dtype.
    nan_extrema: BTreeMap<String, usize>,
    /// Negative zeros in float maxima and minima, by dtype.
    negative_zero_extrema: BTreeMap<String, usize>,
    /// Integer sums outside their dtype's range, by dtype.
    wrapped_sums: BTreeMap<String, usize>,
}

/// Counts [`Coverage`] over the reference outputs, and checks the integer results against
/// an oracle (wrapping sums, exact maxima and minima) on the way.
fn check_coverage(ops: &[OpSpec], inputs: &[Vec<Vec<u8>>], dir: &Path) -> Coverage {
    let mut c = Coverage::default();
    for (i, spec) in ops.iter().enumerate() {
        if spec.op == "all_gather" || spec.transpose {
            continue;
        }
        let out = std::fs::read(dir.join(format!("out-0-{i}.bin"))).unwrap();
        let dtype = spec.dtype.clone();
        let width = dtype_size(&dtype);
        let element = |bytes: &[u8], j: usize| bytes[j * width..(j + 1) * width].to_vec();
        for j in 0..spec.count() {
            let got = element(&out, j);
            let ins: Vec<Vec<u8>> = inputs[i].iter().map(|x| element(x, j)).collect();
            if let Some(f) = Float::of(&dtype) {
                let got = f.read(&got);
                let ins: Vec<u64> = ins.iter().map(|x| f.read(x)).collect();
                let count =
                    |m: &mut BTreeMap<String, usize>| *m.entry(dtype.clone()).or_default() += 1;
                if spec.op == "all_sum" {
                    let finite = ins.iter().all(|&x| !f.is_nan(x) && !f.is_inf(x));
                    let exact: f64 = ins.iter().map(|&x| f.to_f64(x)).sum();
                    if finite && !f.is_nan(got) && f.to_f64(got) != exact {
                        count(&mut c.rounded_sums);
                    }
                    if got == f.zero(true) {
                        count(&mut c.negative_zero_sums);
                    }
                    if f.is_inf(got) {
                        count(&mut c.infinite_sums);
                    }
                } else {
                    if f.is_nan(got) {
                        count(&mut c.nan_extrema);
                    }
                    if got == f.zero(true) {
                        count(&mut c.negative_zero_extrema);
                    }
                }
            } else if let Some(int) = Int::of(&dtype) {
                let got = int.read(&got);
                let ins: Vec<i128> = ins.iter().map(|x| int.read(x)).collect();
                let want = match spec.op.as_str() {
                    "all_sum" => {
                        let exact: i128 = ins.iter().sum();
                        if exact != int.wrap(exact) {
                            *c.wrapped_sums.entry(dtype.clone()).or_default() += 1;
                        }
                        int.wrap(exact)
                    }
                    "all_max" => *ins.iter().max().unwrap(),
                    _ => *ins.iter().min().unwrap(),
                };
                assert_eq!(
                    got, want,
                    "the all-MLX ring's op {i} {spec:?} element {j}: inputs {ins:?}"
                );
            }
        }
    }
    c
}

fn interop(size: usize, test: &str) {
    if testing::as_interop_rank(test, rust_rank) {
        return;
    }
    let work = testing::interop_work_dir("nuvec-array-interop-");
    let ops = plan_ops(size);
    let mut rng = StdRng::seed_from_u64(size as u64 * 7919 + 25);
    let inputs: Vec<Vec<Vec<u8>>> = ops
        .iter()
        .map(|spec| {
            (0..size)
                .map(|r| input_bytes(spec, r, size, &mut rng))
                .collect()
        })
        .collect();
    for (i, per_rank) in inputs.iter().enumerate() {
        for (rank, bytes) in per_rank.iter().enumerate() {
            std::fs::write(work.path().join(format!("in-{rank}-{i}.bin")), bytes).unwrap();
        }
    }
    let plan_path = Plan::write(work.path(), &ops);

    let reference = run_ring(test, &vec![Kind::Mlx; size], &plan_path, work.path(), "mlx");
    let coverage = check_coverage(&ops, &inputs, &reference);
    eprintln!("P={size}: the reference outputs hold {coverage:#?}");
    for dtype in ["float32", "float16", "bfloat16"] {
        for (what, counts) in [
            ("sums that round", &coverage.rounded_sums),
            ("negative zero sums", &coverage.negative_zero_sums),
            ("infinite sums", &coverage.infinite_sums),
            ("NaN maxima and minima", &coverage.nan_extrema),
            (
                "negative zero maxima and minima",
                &coverage.negative_zero_extrema,
            ),
        ] {
            assert!(
                counts.get(dtype).copied().unwrap_or(0) > 0,
                "P={size}: no {what} in {dtype}: the inputs do not exercise what they should"
            );
        }
    }
    assert!(
        coverage.wrapped_sums.get("int32").copied().unwrap_or(0) > 0,
        "P={size}: no int32 sum wraps"
    );

    let [even, odd] = Kind::alternating(size);
    let layouts = [vec![Kind::Rust; size], even, odd];
    for (l, kinds) in layouts.iter().enumerate() {
        let mixed = run_ring(test, kinds, &plan_path, work.path(), &format!("ring{l}"));
        for (rank, kind) in kinds.iter().enumerate() {
            let (want, got) = (read_shapes(&reference, rank), read_shapes(&mixed, rank));
            for (i, spec) in ops.iter().enumerate() {
                assert_eq!(
                    got[i], want[i],
                    "ring {kinds:?}: {kind:?} rank {rank}'s result shape differs from MLX's in op {i} {spec:?}"
                );
                let name = format!("out-{rank}-{i}.bin");
                let want = std::fs::read(reference.join(&name)).unwrap();
                let got = std::fs::read(mixed.join(&name)).unwrap();
                if got != want {
                    let width = dtype_size(&spec.dtype);
                    let at = got.iter().zip(&want).position(|(a, b)| a != b);
                    let show = |b: &[u8]| at.map(|a| b[a / width * width..][..width].to_vec());
                    panic!(
                        "ring {kinds:?} (P={size}): {kind:?} rank {rank} differs from the all-MLX \
                         ring in op {i} {spec:?}: {} bytes vs {}, first difference in element \
                         {:?}: {:02x?} vs MLX's {:02x?}",
                        got.len(),
                        want.len(),
                        at.map(|a| a / width),
                        show(&got),
                        show(&want),
                    );
                }
            }
        }
    }
}

#[test]
fn nuvec_arrays_and_mlx_agree_bit_for_bit_p2() {
    interop(2, "nuvec_arrays_and_mlx_agree_bit_for_bit_p2");
}

#[test]
fn nuvec_arrays_and_mlx_agree_bit_for_bit_p3() {
    interop(3, "nuvec_arrays_and_mlx_agree_bit_for_bit_p3");
}

// ---- send and recv between nuvec and MLX -------------------------------------------------

/// Elements of the array sent in [`exchange`].
const SENT: usize = 64;

/// How a nuvec rank and an MLX rank try to pass an array with `send` and `recv` in a ring
/// of two (the script's side is in tests/interop/mlx_rank.py).
#[derive(Clone, Copy, Debug)]
enum Exchange {
    /// The nuvec rank sends a float32 array of [`SENT`] elements; the MLX rank receives one
    /// of that shape and sends what it got back (as a ping-pong test would); the nuvec
    /// rank receives it.
    NuvecSends,
    /// The MLX rank sends 1.0, 2.0, ... (float32), which the nuvec rank receives.
    MlxSendsFloats,
    /// The MLX rank sends int32 zeros, which the nuvec rank receives.
    MlxSendsZeros,
}

impl Exchange {
    fn name(self) -> &'static str {
        match self {
            Exchange::NuvecSends => "nuvec_sends",
            Exchange::MlxSendsFloats => "mlx_sends_float32",
            Exchange::MlxSendsZeros => "mlx_sends_int32_zeros",
        }
    }

    fn dtype(self) -> &'static str {
        match self {
            Exchange::MlxSendsZeros => "int32",
            _ => "float32",
        }
    }
}

/// The seconds the nuvec rank of [`Exchange::NuvecSends`] waits for a silent peer.
const EXCHANGE_TIMEOUT: f64 = 3.0;

/// The nuvec rank of [`exchange`]: prints `SENT ok` or `SENT err <error>` for its send (if
/// it sends), then `RECEIVED ok <values>` or `RECEIVED err <ms> <error>` for its receive,
/// and marks `done` so that the MLX rank, which waits for it, exits after.
fn exchange_rank(how: Exchange) {
    // Waits until the MLX rank has imported MLX, so that connecting to it takes far less
    // than the short timeout this test sets.
    let markers = PathBuf::from(std::env::var_os("NUVEC_TEST_MARKERS").expect("markers"));
    let rank: usize = std::env::var("MLX_RANK").unwrap().parse().unwrap();
    let peer = 1 - rank;
    let ready = markers.join(format!("{peer}-ready"));
    let until = Instant::now() + Duration::from_secs(60);
    while !ready.exists() {
        assert!(Instant::now() < until, "the MLX rank never got ready");
        std::thread::sleep(Duration::from_millis(10));
    }
    let group = nuvec_distributed::init(true).expect("the ring forms");
    let like = match how.dtype() {
        "int32" => Array::from_slice(&[0i32; SENT], [SENT]),
        _ => Array::from_slice(&[0f32; SENT], [SENT]),
    };
    if let Exchange::NuvecSends = how {
        let values: Vec<f32> = (1..=SENT).map(|v| v as f32).collect();
        let x = Array::from_slice(&values, [SENT]);
        match distributed::send(&x, peer, Some(&group)).eval() {
            Ok(()) => println!("SENT ok"),
            Err(e) => println!("SENT err {e}"),
        }
    }
    let started = Instant::now();
    let received = distributed::recv_like(&like, peer, Some(&group));
    match bytes_of(how.dtype(), &received) {
        Ok(bytes) => println!("RECEIVED ok {bytes:02x?}"),
        Err(e) => println!("RECEIVED err {} {e}", started.elapsed().as_millis()),
    }
    testing::mark("done");
}

/// Runs `how` in a ring of two with the nuvec rank at `nuvec_rank`, and returns the nuvec
/// rank's output and the bytes the MLX rank received (when it received).
fn exchange(test: &str, how: Exchange, nuvec_rank: usize) -> (RankOutput, Option<Vec<u8>>) {
    let out = tempfile::tempdir().unwrap();
    let kinds: Vec<Kind> = (0..2)
        .map(|r| {
            if r == nuvec_rank {
                Kind::Rust
            } else {
                Kind::Mlx
            }
        })
        .collect();
    let launch = Launch::new(2, 1)
        .deadline(Duration::from_secs(120))
        .env(EXCHANGE_VAR, how.name())
        .env(testing::INTEROP_OUT_VAR, &out.path().to_string_lossy());
    // A receive that waits for bytes that never come ends at the timeout: short, so the
    // test is quick. Where the receive fails at once, the harness's longer default keeps a
    // loaded machine's slow MLX rank from turning the failure into a timeout.
    let launch = match how {
        Exchange::NuvecSends => launch.timeout(EXCHANGE_TIMEOUT),
        _ => launch,
    };
    let mut outputs = testing::run_kinds(test, &kinds, &mlx_script(), launch);
    let received = std::fs::read(out.path().join("mlx-received.bin")).ok();
    (outputs.swap_remove(nuvec_rank), received)
}

/// The error a `RECEIVED err <ms> <error>` line carries, with its milliseconds; panics
/// (with the rank's output) if the receive returned anything else.
fn receive_error(output: &RankOutput) -> (u64, String) {
    let line = output
        .lines("RECEIVED ")
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("the nuvec rank did not receive:\n{output}"));
    let Some(rest) = line.strip_prefix("err ") else {
        panic!("the nuvec rank's recv returned Ok with MLX's bytes: {line}\n{output}");
    };
    let (ms, error) = rest.split_once(' ').expect("<ms> <error>");
    (ms.parse().expect("milliseconds"), error.to_string())
}

/// nuvec-core's header before an array's data on the wire (see its `distributed::send`):
/// the tag, then the dtype's name and the shape, each with its length first.
fn nuvec_header(dtype: &str, shape: &[usize]) -> Vec<u8> {
    let mut h = b"nuvecsnd".to_vec();
    h.extend((dtype.len() as u64).to_le_bytes());
    h.extend(dtype.as_bytes());
    h.extend((shape.len() as u64).to_le_bytes());
    for &d in shape {
        h.extend((d as u64).to_le_bytes());
    }
    h
}

/// An MLX rank that receives from a nuvec rank gets nuvec-core's frame as its data (the
/// length and header first), and nothing on MLX's wire can tell it so. The nuvec side
/// returns no wrong data: its send succeeds (its result is its own input) and receiving
/// what the MLX rank sent back fails with the engine's timeout, naming the MLX rank.
fn an_mlx_rank_cannot_receive_a_nuvec_array(test: &str, nuvec_rank: usize) {
    let how = Exchange::NuvecSends;
    if testing::as_rank(test, || exchange_rank(how)) {
        return;
    }
    let (output, received) = exchange(test, how, nuvec_rank);
    assert!(
        output.lines("SENT ").first().map(String::as_str) == Some("ok"),
        "the nuvec rank's send failed:\n{output}"
    );
    let received = received.expect("the MLX rank wrote what it received");
    assert_eq!(received.len(), 4 * SENT);
    let header = nuvec_header("float32", &[SENT]);
    let mut frame = (header.len() as u64).to_le_bytes().to_vec();
    frame.extend(&header);
    frame.extend(((4 * SENT) as u64).to_le_bytes());
    assert_eq!(
        received[..frame.len()],
        frame[..],
        "the MLX rank received something else than nuvec-core's frame"
    );
    let (ms, error) = receive_error(&output);
    let peer = 1 - nuvec_rank;
    for part in [
        format!("distributed recv from rank {peer}"),
        format!("rank {peer}"),
        "timed out".into(),
    ] {
        assert!(error.contains(&part), "{error:?} lacks {part:?}");
    }
    eprintln!("the nuvec rank's recv failed after {ms} ms: {error}");
}

#[test]
fn an_mlx_rank_cannot_receive_a_nuvec_array_from_rank_0() {
    an_mlx_rank_cannot_receive_a_nuvec_array(
        "an_mlx_rank_cannot_receive_a_nuvec_array_from_rank_0",
        0,
    );
}

#[test]
fn an_mlx_rank_cannot_receive_a_nuvec_array_from_rank_1() {
    an_mlx_rank_cannot_receive_a_nuvec_array(
        "an_mlx_rank_cannot_receive_a_nuvec_array_from_rank_1",
        1,
    );
}

/// A nuvec rank that receives an MLX array finds no header where nuvec-core's frame has
/// one and fails at once, whatever the data: 1.0, 2.0 read as a header's length is too
/// long; zeros read as a length give an empty header, which is not the expected one.
#[test]
fn a_nuvec_rank_cannot_receive_an_mlx_array() {
    let test = "a_nuvec_rank_cannot_receive_an_mlx_array";
    let how = match std::env::var(EXCHANGE_VAR).as_deref() {
        Ok("mlx_sends_int32_zeros") => Exchange::MlxSendsZeros,
        _ => Exchange::MlxSendsFloats,
    };
    if testing::as_rank(test, || exchange_rank(how)) {
        return;
    }
    for (how, nuvec_rank, want) in [
        (
            Exchange::MlxSendsFloats,
            0,
            "recv: rank 1 sent no array header",
        ),
        (
            Exchange::MlxSendsZeros,
            1,
            "recv: rank 0 sent another dtype or shape than int32 [64]",
        ),
    ] {
        let (output, _) = exchange(test, how, nuvec_rank);
        let (ms, error) = receive_error(&output);
        assert!(error.contains(want), "{how:?}: {error:?} lacks {want:?}");
        eprintln!("{how:?}: the nuvec rank's recv failed after {ms} ms: {error}");
    }
}
