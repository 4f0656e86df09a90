//! `cargo bench --bench kernels`: the reduction kernels of every SIMD level, against memcpy.
//!
//! For each buffer size (4 KiB, 1 MiB and 64 MiB per operand) the table has:
//!
//! - `memcpy`: `copy_from_slice` of one buffer into another, counted as 2 x bytes of memory
//!   traffic (read one, write one): the speed limit of the memory system here;
//! - per dtype (`f32`, `f16`, `bf16`, `i32`, `f64`), the `sum` of `acc += inc`, counted as
//!   3 x bytes (read `acc`, read `inc`, write `acc`), by:
//!   - `naive`: the plain typed loop compiled for the default target (SSE2 on x86_64), with
//!     `half`'s per-element `to_f32`/`from_f32` for `f16` and `bf16`;
//!   - `root-scalar`: the crate's scalar kernel, `reduce_scalar` (the SIMD kernels' oracle);
//!   - `simd-<level>`: `ffi::simd::reduce` at each level this machine has;
//! - `max` of `f32`, by the same kernels (a select that the compiler can turn into AVX2's
//!   slow masked stores, which this row would show);
//! - `jmax` of `f32`, `f16` and `bf16`: `max` with MLX's JACCL rule (the incoming value wins
//!   on NaN and on equality), by `naive` (`(a > b) ? a : b`) and the SIMD levels (the root
//!   crate's scalar path for this rule is not public).
//!
//! `GB/s` is traffic over the median time of one pass (10^9 bytes per second), and
//! `x memcpy` divides it by memcpy's rate for the same size in the same run: near 1.0 the
//! kernel runs at memory speed, and for buffers that fit in cache (4 KiB, 1 MiB) it can pass
//! 1.0. The machine may be shared: run it twice and trust only differences that repeat.
//!
//! Environment: `NUVEC_BENCH_TARGET_MS` (time spent per row, default 200) and
//! `NUVEC_BENCH_SIZES_KIB` (comma-separated sizes in KiB, default `4,1024,65536`).
//! `cargo test --benches` runs this binary without `--bench`; it then does nothing.

use std::hint::black_box;
use std::time::{Duration, Instant};

use ffi::simd::{self, Elem, Level, Op, Semantics};
use nuvec_distributed_engine::{DType, ReduceOp, bf16, f16, reduce_scalar};
use zerocopy::{FromBytes, IntoBytes};

/// Who computes the reduction.
#[derive(Clone, Copy, PartialEq)]
enum Kernel {
    Naive,
    RootScalar,
    Simd(Level),
}

impl Kernel {
    fn name(self) -> String {
        match self {
            Kernel::Naive => "naive".into(),
            Kernel::RootScalar => "root-scalar".into(),
            Kernel::Simd(level) => format!("simd-{level}"),
        }
    }
}

/// The dtypes measured, with `ffi`'s name for each.
const DTYPES: [(DType, Elem); 5] = [
    (DType::F32, Elem::F32),
    (DType::F16, Elem::F16),
    (DType::BF16, Elem::BF16),
    (DType::I32, Elem::I32),
    (DType::F64, Elem::F64),
];

/// Fills `acc` and `inc` with ordinary values of `dtype` (no subnormals, which some CPUs
/// handle slowly, and sums that stay finite for a long time).
fn fill(dtype: DType, acc: &mut [u8], inc: &mut [u8]) {
    fn set<T: IntoBytes + FromBytes + zerocopy::Immutable + zerocopy::KnownLayout + Copy>(
        bytes: &mut [u8],
        f: impl Fn(usize) -> T,
    ) {
        let typed = <[T]>::mut_from_bytes(bytes).expect("buffers are u64-aligned");
        for (i, x) in typed.iter_mut().enumerate() {
            *x = f(i);
        }
    }
    let small = |i: usize| (i % 7) as f32 + 1.0;
    match dtype {
        DType::F32 => {
            set(acc, small);
            set(inc, |i| small(i + 3) * 0.5);
        }
        DType::F64 => {
            set(acc, |i| f64::from(small(i)));
            set(inc, |i| f64::from(small(i + 3)) * 0.5);
        }
        DType::F16 => {
            set(acc, |i| f16::from_f32(small(i)));
            set(inc, |i| f16::from_f32(small(i + 3) * 0.5));
        }
        DType::BF16 => {
            set(acc, |i| bf16::from_f32(small(i)));
            set(inc, |i| bf16::from_f32(small(i + 3) * 0.5));
        }
        DType::I32 => {
            set(acc, |i| i as i32);
            set(inc, |i| (i % 13) as i32 - 6);
        }
        _ => unreachable!("not benchmarked: {dtype}"),
    }
}

/// `a[i] = op(a[i], b[i])` over typed views, compiled for the default target.
fn naive<T>(acc: &mut [u8], inc: &[u8], f: impl Fn(T, T) -> T)
where
    T: FromBytes + IntoBytes + zerocopy::Immutable + zerocopy::KnownLayout + Copy,
{
    let a = <[T]>::mut_from_bytes(acc).expect("aligned");
    let b = <[T]>::ref_from_bytes(inc).expect("aligned");
    for (a, b) in a.iter_mut().zip(b) {
        *a = f(*a, *b);
    }
}

fn naive_sum(dtype: DType, acc: &mut [u8], inc: &[u8]) {
    match dtype {
        DType::F32 => naive::<f32>(acc, inc, |a, b| a + b),
        DType::F64 => naive::<f64>(acc, inc, |a, b| a + b),
        DType::I32 => naive::<i32>(acc, inc, i32::wrapping_add),
        DType::F16 => naive::<f16>(acc, inc, |a, b| f16::from_f32(a.to_f32() + b.to_f32())),
        DType::BF16 => naive::<bf16>(acc, inc, |a, b| bf16::from_f32(a.to_f32() + b.to_f32())),
        _ => unreachable!("not benchmarked: {dtype}"),
    }
}

/// The ring's `max` (`std::max`), the plain typed loop.
fn naive_max_ring(dtype: DType, acc: &mut [u8], inc: &[u8]) {
    match dtype {
        DType::F32 => naive::<f32>(acc, inc, |a, b| if a < b { b } else { a }),
        _ => unreachable!("not benchmarked: ring max of {dtype}"),
    }
}

/// JACCL's `max` (`(a > b) ? a : b`), the plain typed loop.
fn naive_max_jaccl(dtype: DType, acc: &mut [u8], inc: &[u8]) {
    match dtype {
        DType::F32 => naive::<f32>(acc, inc, |a, b| if a > b { a } else { b }),
        DType::F16 => naive::<f16>(acc, inc, |a, b| if a > b { a } else { b }),
        DType::BF16 => naive::<bf16>(acc, inc, |a, b| if a > b { a } else { b }),
        _ => unreachable!("not benchmarked: JACCL max of {dtype}"),
    }
}

/// Runs `pass` repeatedly for about `target` and returns the median seconds of one pass.
fn median_seconds(target: Duration, mut pass: impl FnMut()) -> f64 {
    pass(); // warm caches and page tables
    let start = Instant::now();
    pass();
    let once = start.elapsed().max(Duration::from_nanos(20));
    // Several passes per sample for small buffers, so that a sample is ~1 ms or more.
    let per_sample = (Duration::from_millis(1).as_nanos() / once.as_nanos()).max(1) as u32;
    let samples =
        (target.as_nanos() / (once.as_nanos() * u128::from(per_sample))).clamp(5, 101) as usize;
    let mut times: Vec<f64> = (0..samples)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..per_sample {
                pass();
            }
            start.elapsed().as_secs_f64() / f64::from(per_sample)
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn env_or(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_string())
}

fn size_name(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b % 1024 == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

fn row(size: usize, dtype: &str, op: &str, kernel: &str, gbps: f64, memcpy: f64) {
    println!(
        "{:>8}  {:<9} {:<4} {:<14} {:>8.2} {:>9.2}",
        size_name(size),
        dtype,
        op,
        kernel,
        gbps,
        gbps / memcpy
    );
}

fn main() {
    // `cargo test --benches` runs bench binaries without `--bench`: do nothing then.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let target = Duration::from_millis(
        env_or("NUVEC_BENCH_TARGET_MS", "200")
            .parse()
            .expect("NUVEC_BENCH_TARGET_MS: a number of milliseconds"),
    );
    let sizes: Vec<usize> = env_or("NUVEC_BENCH_SIZES_KIB", "4,1024,65536")
        .split(',')
        .map(|s| {
            s.trim()
                .parse::<usize>()
                .expect("NUVEC_BENCH_SIZES_KIB: sizes in KiB")
                * 1024
        })
        .collect();

    let levels = simd::available();
    let mut kernels = vec![Kernel::Naive, Kernel::RootScalar];
    kernels.extend(
        levels
            .iter()
            .filter(|&&l| l != Level::Scalar)
            .map(|&l| Kernel::Simd(l)),
    );
    let names: Vec<_> = levels.iter().map(|l| l.name()).collect();
    println!(
        "SIMD levels here: {} (detected {}, active {}); NUVEC_DISTRIBUTED_SIMD lowers only the active one",
        names.join(", "),
        simd::detected(),
        simd::active(),
    );
    #[cfg(target_arch = "x86_64")]
    println!(
        "F16C: {}; AVX512-BF16: {} (used for bf16 sums at avx512)",
        std::arch::is_x86_feature_detected!("f16c"),
        std::arch::is_x86_feature_detected!("avx512bf16"),
    );
    println!(
        "GB/s: memory traffic per second (sum and max: 3 x bytes; memcpy: 2 x bytes), median of a pass"
    );
    println!();
    println!(
        "{:>8}  {:<9} {:<4} {:<14} {:>8} {:>9}",
        "size", "dtype", "op", "kernel", "GB/s", "x memcpy"
    );

    for &size in &sizes {
        // u64 storage: aligned for every dtype's typed view in `naive`.
        let mut acc = vec![0u64; size / 8];
        let mut inc = vec![0u64; size / 8];
        let mut dst = vec![0u64; size / 8];

        let src = inc.as_bytes();
        let secs = median_seconds(target, || {
            dst.as_mut_bytes().copy_from_slice(black_box(src));
            black_box(&mut dst);
        });
        let memcpy = 2.0 * size as f64 / secs / 1e9;
        row(size, "-", "copy", "memcpy", memcpy, memcpy);

        let mut measure =
            |dtype: DType, elem: Elem, op: ReduceOp, semantics: Semantics, kernel: Kernel| {
                let op_name = match (op, semantics) {
                    (ReduceOp::Max, Semantics::Jaccl) => "jmax".to_string(),
                    _ => op.to_string(),
                };
                if semantics == Semantics::Jaccl && kernel == Kernel::RootScalar {
                    return;
                }
                fill(dtype, acc.as_mut_bytes(), inc.as_mut_bytes());
                let (a, b) = (acc.as_mut_bytes(), inc.as_bytes());
                let simd_op = match op {
                    ReduceOp::Sum => Op::Sum,
                    ReduceOp::Max => Op::Max,
                    ReduceOp::Min => Op::Min,
                };
                if let Kernel::Simd(level) = kernel
                    && !simd::covers(level, semantics, simd_op, elem)
                {
                    println!(
                        "{:>8}  {:<9} {:<4} {:<14} {:>8} {:>9}",
                        size_name(size),
                        dtype.name(),
                        op_name,
                        kernel.name(),
                        "-",
                        "no kernel"
                    );
                    return;
                }
                let secs = median_seconds(target, || {
                    match kernel {
                        Kernel::Naive => match (op, semantics) {
                            (ReduceOp::Sum, _) => naive_sum(dtype, a, b),
                            (_, Semantics::Ring) => naive_max_ring(dtype, a, b),
                            (_, Semantics::Jaccl) => naive_max_jaccl(dtype, a, b),
                        },
                        Kernel::RootScalar => reduce_scalar(op, dtype, a, b),
                        Kernel::Simd(level) => {
                            assert!(simd::reduce(level, semantics, simd_op, elem, a, b));
                        }
                    }
                    black_box(&mut *a);
                });
                let gbps = 3.0 * size as f64 / secs / 1e9;
                row(size, dtype.name(), &op_name, &kernel.name(), gbps, memcpy);
            };

        for (dtype, elem) in DTYPES {
            for &kernel in &kernels {
                measure(dtype, elem, ReduceOp::Sum, Semantics::Ring, kernel);
            }
        }
        for &kernel in &kernels {
            measure(
                DType::F32,
                Elem::F32,
                ReduceOp::Max,
                Semantics::Ring,
                kernel,
            );
        }
        for (dtype, elem) in [
            (DType::F32, Elem::F32),
            (DType::F16, Elem::F16),
            (DType::BF16, Elem::BF16),
        ] {
            for &kernel in &kernels {
                measure(dtype, elem, ReduceOp::Max, Semantics::Jaccl, kernel);
            }
        }
        println!();
    }
}
