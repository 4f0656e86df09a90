//! SIMD reduction kernels with runtime dispatch: `acc[i] = op(acc[i], inc[i])` on wire bytes.
//!
//! The semantics are MLX's, defined element by element by [`portable`] (the scalar rules,
//! written once: the root crate's scalar path wraps them), which is the oracle: a kernel here
//! must give the same bytes for every input, except which NaN survives when both operands of
//! a float sum are NaN (MLX itself does not fix that). `max` and `min` of floats take a
//! [`Semantics`], MLX's ring or MLX's JACCL, which differ only in the operand kept when the
//! comparison decides nothing; every other reduction is the same under both.
//!
//! [`reduce`] runs the kernel of one [`Level`] and returns `false`, touching nothing, where
//! that level has none, so the caller keeps its scalar path. [`active`] is the level to use:
//! the best one [`available`] here, lowered by [`SIMD_VAR`].
//!
//! Most kernels are the plain element loop of `portable.rs`, inlined into a function compiled
//! for the level's instruction set so that the compiler vectorises it with that level's
//! registers. Half precision needs conversions the compiler does not vectorise by itself
//! (x86's F16C and AVX-512 `vcvtph2ps`/`vcvtps2ph`, aarch64's FCVTL/FCVTN), `bfloat16` can
//! use AVX512-BF16's conversion, and `complex64` max and min (whose element order spans two
//! lanes) and float max and min (which the compiler turns into slow masked stores on x86) are
//! selects: those are written with intrinsics in `x86_64.rs` and `aarch64.rs`. On aarch64
//! the one level is NEON: its `f16` conversions are base ARMv8.0 instructions, so there is
//! no optional feature to detect (see `aarch64.rs`).

use std::sync::OnceLock;

pub mod portable;

#[cfg(target_arch = "aarch64")]
mod aarch64;
#[cfg(target_arch = "x86_64")]
mod x86_64;

/// The environment variable that lowers the SIMD level: `scalar`, `avx2`, `avx512` or `neon`.
///
/// A level above the detected one, or of another architecture, leaves the detected level.
pub const SIMD_VAR: &str = "NUVEC_DISTRIBUTED_SIMD";

/// An instruction set the kernels are compiled for, named by [`Level::name`]; `FromStr`
/// takes a name in any ASCII case.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, strum::Display, strum::EnumString, strum::IntoStaticStr,
)]
#[strum(serialize_all = "lowercase", ascii_case_insensitive)]
#[strum(parse_err_ty = String, parse_err_fn = not_a_level)]
pub enum Level {
    /// No SIMD kernels: [`reduce`] always returns `false` and the caller's scalar code runs.
    Scalar,
    /// x86_64 AVX2 (with F16C for `f16`, where present).
    Avx2,
    /// x86_64 AVX-512 F, BW and VL (with AVX512-BF16 for `bfloat16` sums, where present).
    Avx512,
    /// aarch64 NEON (baseline on aarch64, `f16` conversions included).
    Neon,
}

impl Level {
    /// Every level, whether or not this machine has it.
    pub const ALL: [Level; 4] = [Level::Scalar, Level::Avx2, Level::Avx512, Level::Neon];

    /// The name [`SIMD_VAR`] uses: `"scalar"`, `"avx2"`, `"avx512"` or `"neon"`.
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// [`Level`]'s `FromStr` error.
fn not_a_level(s: &str) -> String {
    format!("{s:?} is not a SIMD level: expected scalar, avx2, avx512 or neon")
}

/// Whose rule `max` and `min` of floating-point values follow: which operand survives when
/// the comparison decides nothing (a NaN on either side, or equal values such as `-0.0` and
/// `0.0`). Integer, `bool` and sum reductions are the same under both.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Semantics {
    /// MLX's ring (`std::max`/`std::min`): the accumulator stays, so a NaN already
    /// accumulated stays and an incoming one is ignored.
    Ring,
    /// MLX's JACCL (`(acc > in) ? acc : in`, `(acc < in) ? acc : in`): the incoming value
    /// wins, so an incoming NaN replaces the accumulator and an accumulated one is replaced.
    Jaccl,
}

impl Semantics {
    /// Both semantics.
    pub const ALL: [Semantics; 2] = [Semantics::Ring, Semantics::Jaccl];
}

/// A reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// `acc + inc`.
    Sum,
    /// `max(acc, inc)`.
    Max,
    /// `min(acc, inc)`.
    Min,
}

impl Op {
    /// Every operation.
    pub const ALL: [Op; 3] = [Op::Sum, Op::Max, Op::Min];
}

/// An element type: MLX's 14 dtypes, as they lie in wire bytes (native endian).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Elem {
    /// One byte; any non-zero byte is true, results are 0 or 1.
    Bool,
    /// `u8`.
    U8,
    /// `u16`.
    U16,
    /// `u32`.
    U32,
    /// `u64`.
    U64,
    /// `i8`.
    I8,
    /// `i16`.
    I16,
    /// `i32`.
    I32,
    /// `i64`.
    I64,
    /// IEEE half precision, as its 16 bits.
    F16,
    /// bfloat16, as its 16 bits.
    BF16,
    /// `f32`.
    F32,
    /// `f64`.
    F64,
    /// Two `f32`, real part first.
    Complex64,
}

impl Elem {
    /// Every element type.
    pub const ALL: [Elem; 14] = [
        Elem::Bool,
        Elem::U8,
        Elem::U16,
        Elem::U32,
        Elem::U64,
        Elem::I8,
        Elem::I16,
        Elem::I32,
        Elem::I64,
        Elem::F16,
        Elem::BF16,
        Elem::F32,
        Elem::F64,
        Elem::Complex64,
    ];

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            Elem::Bool | Elem::U8 | Elem::I8 => 1,
            Elem::U16 | Elem::I16 | Elem::F16 | Elem::BF16 => 2,
            Elem::U32 | Elem::I32 | Elem::F32 => 4,
            Elem::U64 | Elem::I64 | Elem::F64 | Elem::Complex64 => 8,
        }
    }
}

/// What the CPU offers, detected once.
#[derive(Clone, Copy, Debug)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
struct Features {
    /// The best level usable here.
    best: Level,
    /// F16C, for `f16` at [`Level::Avx2`].
    f16c: bool,
    /// AVX512-BF16, for `bfloat16` sums at [`Level::Avx512`].
    avx512bf16: bool,
}

fn features() -> Features {
    static FEATURES: OnceLock<Features> = OnceLock::new();
    *FEATURES.get_or_init(detect)
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Features {
    let avx2 = std::arch::is_x86_feature_detected!("avx2");
    let f16c = avx2 && std::arch::is_x86_feature_detected!("f16c");
    // `#[target_feature(enable = "avx512f")]` also enables avx2, fma and f16c, so the
    // AVX-512 functions may contain any of those: require them all.
    let avx512 = f16c
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vl");
    let avx512bf16 = avx512 && std::arch::is_x86_feature_detected!("avx512bf16");
    let best = if avx512 {
        Level::Avx512
    } else if avx2 {
        Level::Avx2
    } else {
        Level::Scalar
    };
    Features {
        best,
        f16c,
        avx512bf16,
    }
}

#[cfg(target_arch = "aarch64")]
fn detect() -> Features {
    // NEON is part of every aarch64 Rust target's baseline.
    Features {
        best: if cfg!(target_feature = "neon") {
            Level::Neon
        } else {
            Level::Scalar
        },
        f16c: false,
        avx512bf16: false,
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn detect() -> Features {
    Features {
        best: Level::Scalar,
        f16c: false,
        avx512bf16: false,
    }
}

/// The best level this machine supports.
pub fn detected() -> Level {
    features().best
}

/// Every level usable on this machine, [`Level::Scalar`] first, then in increasing width.
pub fn available() -> Vec<Level> {
    let order: &[Level] = match detected() {
        Level::Scalar => &[Level::Scalar],
        Level::Avx2 => &[Level::Scalar, Level::Avx2],
        Level::Avx512 => &[Level::Scalar, Level::Avx2, Level::Avx512],
        Level::Neon => &[Level::Scalar, Level::Neon],
    };
    order.to_vec()
}

/// Whether `level` is usable on this machine.
pub fn is_available(level: Level) -> bool {
    matches!(
        (level, detected()),
        (Level::Scalar, _)
            | (Level::Avx2, Level::Avx2 | Level::Avx512)
            | (Level::Avx512, Level::Avx512)
            | (Level::Neon, Level::Neon)
    )
}

/// The level a request leaves on a machine whose best level is `detected`: the requested
/// one if it is usable here, else `detected` (a request can only lower the level).
///
/// `detected` is taken as an argument so that the rule can be checked for any machine.
pub fn clamp(detected: Level, requested: Option<Level>) -> Level {
    let usable = |level: Level| match detected {
        Level::Scalar => level == Level::Scalar,
        Level::Avx2 => matches!(level, Level::Scalar | Level::Avx2),
        Level::Avx512 => matches!(level, Level::Scalar | Level::Avx2 | Level::Avx512),
        Level::Neon => matches!(level, Level::Scalar | Level::Neon),
    };
    match requested {
        Some(level) if usable(level) => level,
        _ => detected,
    }
}

/// Parses a value of [`SIMD_VAR`]: the level it names, or why it names none (without the
/// variable's name). An empty value is an error, as for every variable the crates read:
/// the variable is unset to ask for nothing.
///
/// # Errors
///
/// A value that is empty or not a level's name.
pub fn parse_request(value: &str) -> Result<Option<Level>, String> {
    if value.trim().is_empty() {
        return Err(format!(
            "{value:?} is empty: name a level (scalar, avx2, avx512, neon) or unset it"
        ));
    }
    value.trim().parse().map(Some)
}

/// The level [`SIMD_VAR`] asks for, read from the environment now; `None` when unset.
///
/// # Errors
///
/// A value that names no level; the message names the variable.
pub fn env_level() -> Result<Option<Level>, String> {
    match std::env::var_os(SIMD_VAR) {
        None => Ok(None),
        Some(value) => {
            parse_request(&value.to_string_lossy()).map_err(|why| format!("{SIMD_VAR}: {why}"))
        }
    }
}

/// The level reductions use: [`detected`] lowered by [`SIMD_VAR`], decided at the first call
/// and kept for the life of the process.
///
/// A value of the variable that is empty or names no level is ignored here (the root crate's `init`
/// reports it as an error, through [`env_level`]).
pub fn active() -> Level {
    static ACTIVE: OnceLock<Level> = OnceLock::new();
    *ACTIVE.get_or_init(|| clamp(detected(), env_level().unwrap_or(None)))
}

/// Folds `inc` into `acc` with `level`'s kernel: `acc[i] = op(acc[i], inc[i])` under
/// `semantics`, over the `min(acc.len(), inc.len())` bytes rounded down to whole elements of
/// `elem`. Slices may have any alignment.
///
/// Returns `false`, touching nothing, when `level` has no kernel for `(op, elem)` on this
/// machine (always for [`Level::Scalar`], and for any level that is not
/// [available](is_available)): the caller then reduces with its scalar code.
pub fn reduce(
    level: Level,
    semantics: Semantics,
    op: Op,
    elem: Elem,
    acc: &mut [u8],
    inc: &[u8],
) -> bool {
    dispatch(
        level,
        true,
        Reduction {
            semantics,
            op,
            elem,
        },
        acc,
        inc,
    )
}

/// Whether `level` has a kernel for `(op, elem)` under `semantics` on this machine, that is,
/// whether [`reduce`] would do the work rather than return `false`.
pub fn covers(level: Level, semantics: Semantics, op: Op, elem: Elem) -> bool {
    // An empty reduction is free and answers exactly as a real one would.
    reduce(level, semantics, op, elem, &mut [], &[])
}

/// What a level's entry point computes: the operation, the element type, and the rule float
/// `max` and `min` follow.
#[derive(Clone, Copy, Debug)]
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
struct Reduction {
    semantics: Semantics,
    op: Op,
    elem: Elem,
}

// Shared by the intrinsic kernels of both instruction sets.

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
/// `(kept, other)` from `(acc, inc)`: [`Semantics::order`] with the semantics fixed at
/// compile time (`INC_KEPT` is [`Semantics::Jaccl`]).
#[inline(always)]
fn order<const INC_KEPT: bool, T>(acc: T, inc: T) -> (T, T) {
    if INC_KEPT { (inc, acc) } else { (acc, inc) }
}

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
/// Runs `block` over each whole `N`-byte block of the whole `size`-byte elements both slices
/// have, then once over the elements left, zero-padded to a block, and writes back only
/// those. (Padding lanes compute `0 op 0`, which raises nothing and is thrown away.)
#[inline(always)]
fn blocks<const N: usize>(
    acc: &mut [u8],
    inc: &[u8],
    size: usize,
    mut block: impl FnMut(&mut [u8; N], &[u8; N]),
) {
    let len = acc.len().min(inc.len()) / size * size;
    let (acc_blocks, acc_rest) = acc[..len].as_chunks_mut::<N>();
    let (inc_blocks, inc_rest) = inc[..len].as_chunks::<N>();
    for (a, b) in acc_blocks.iter_mut().zip(inc_blocks) {
        block(a, b);
    }
    if !acc_rest.is_empty() {
        let (mut a, mut b) = ([0u8; N], [0u8; N]);
        a[..acc_rest.len()].copy_from_slice(acc_rest);
        b[..inc_rest.len()].copy_from_slice(inc_rest);
        block(&mut a, &b);
        acc_rest.copy_from_slice(&a[..acc_rest.len()]);
    }
}

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
/// `max` or `min` of `size`-byte elements over whole `N`-byte blocks, as [`blocks`] cuts them,
/// as [`portable::max_by`]/[`portable::min_by`] decide: the other operand replaces the kept one
/// (the incoming value if `INC_KEPT`, else the accumulator) only in the elements where the
/// comparison is strict. `load` reads a block as a vector, `less(x, y)` marks the lanes of the
/// elements where `x < y`, and `store(block, kept, other, take)` writes `kept` with `other` in
/// the lanes `take` marks.
#[inline(always)]
fn select<const INC_KEPT: bool, const N: usize, V: Copy, M>(
    op: Op,
    size: usize,
    acc: &mut [u8],
    inc: &[u8],
    load: impl Fn(&[u8; N]) -> V,
    less: impl Fn(V, V) -> M,
    store: impl Fn(&mut [u8; N], V, V, M),
) {
    match op {
        Op::Max => blocks::<N>(acc, inc, size, |a, b| {
            let (kept, other) = order::<INC_KEPT, _>(load(a), load(b));
            store(a, kept, other, less(kept, other));
        }),
        Op::Min => blocks::<N>(acc, inc, size, |a, b| {
            let (kept, other) = order::<INC_KEPT, _>(load(a), load(b));
            store(a, kept, other, less(other, kept));
        }),
        Op::Sum => unreachable!("select is called for max and min only"),
    }
}

/// [`reduce`], with the choice of declining AVX512-BF16 (so that tests can check the kernel
/// used without it on a machine that has it; aarch64 has no optional path to decline, and
/// other architectures no kernels).
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(unused_variables)
)]
fn dispatch(
    level: Level,
    use_avx512bf16: bool,
    what: Reduction,
    acc: &mut [u8],
    inc: &[u8],
) -> bool {
    #[cfg(target_arch = "aarch64")]
    let _ = use_avx512bf16;
    if !is_available(level) {
        return false;
    }
    match level {
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 => {
            // SAFETY: `is_available(Avx2)` just held, which runtime detection makes true only
            // when the CPU has AVX2, the one feature `reduce_avx2` is compiled for.
            unsafe { x86_64::reduce_avx2(what, acc, inc) }
        }
        #[cfg(target_arch = "x86_64")]
        Level::Avx512 => {
            // SAFETY: `is_available(Avx512)` just held, which runtime detection makes true
            // only when the CPU has AVX-512 F, BW and VL and the AVX2, FMA and F16C they
            // imply: every feature `reduce_avx512` is compiled for.
            unsafe { x86_64::reduce_avx512(use_avx512bf16, what, acc, inc) }
        }
        #[cfg(target_arch = "aarch64")]
        Level::Neon => {
            // SAFETY: `reduce_neon` is compiled for `neon`, which is part of the baseline of
            // every aarch64 target Rust has (`detect` offers `Neon` only where
            // `cfg!(target_feature = "neon")` holds, and `is_available` just held).
            unsafe { aarch64::reduce_neon(what, acc, inc) }
        }
        // The scalar level, and the levels of other architectures (never available here).
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_by_name_in_any_case_and_requests_ignore_blanks() {
        for level in Level::ALL {
            assert_eq!(level.name().parse::<Level>(), Ok(level));
            assert_eq!(level.name().to_uppercase().parse::<Level>(), Ok(level));
            let padded = format!(" {} ", level.name().to_uppercase());
            assert_eq!(parse_request(&padded), Ok(Some(level)));
        }
        let err = "sse2".parse::<Level>().unwrap_err();
        assert!(err.contains("\"sse2\"") && err.contains("avx512"), "{err}");
    }

    #[test]
    fn an_empty_request_is_an_error() {
        assert!(parse_request("").unwrap_err().contains("empty"));
        assert!(parse_request("  ").unwrap_err().contains("empty"));
        assert_eq!(parse_request("avx2"), Ok(Some(Level::Avx2)));
        assert!(parse_request("avx-512").is_err());
    }

    #[test]
    fn a_request_only_lowers_the_level() {
        use Level::*;
        assert_eq!(clamp(Avx512, None), Avx512);
        assert_eq!(clamp(Avx512, Some(Avx2)), Avx2);
        assert_eq!(clamp(Avx512, Some(Scalar)), Scalar);
        assert_eq!(clamp(Avx512, Some(Neon)), Avx512);
        assert_eq!(clamp(Avx2, Some(Avx512)), Avx2);
        assert_eq!(clamp(Avx2, Some(Neon)), Avx2);
        assert_eq!(clamp(Scalar, Some(Avx2)), Scalar);
        assert_eq!(clamp(Neon, Some(Avx2)), Neon);
        assert_eq!(clamp(Neon, Some(Avx512)), Neon);
        assert_eq!(clamp(Neon, Some(Scalar)), Scalar);
    }

    #[test]
    fn available_levels_start_at_scalar_and_end_at_the_detected_one() {
        let levels = available();
        assert_eq!(levels.first(), Some(&Level::Scalar));
        assert_eq!(levels.last(), Some(&detected()));
        for level in Level::ALL {
            assert_eq!(is_available(level), levels.contains(&level), "{level}");
            assert_eq!(
                clamp(detected(), Some(level)) == level,
                levels.contains(&level)
            );
        }
        assert!(is_available(active()));
    }

    #[test]
    fn scalar_and_unavailable_levels_touch_nothing() {
        let mut acc = [1u8, 2, 3, 4];
        for level in Level::ALL {
            if level == Level::Scalar || !is_available(level) {
                for elem in Elem::ALL {
                    for op in Op::ALL {
                        for semantics in Semantics::ALL {
                            assert!(!reduce(level, semantics, op, elem, &mut acc, &[9; 4]));
                            assert!(!covers(level, semantics, op, elem));
                        }
                    }
                }
            }
        }
        assert_eq!(acc, [1, 2, 3, 4]);
    }

    /// A xorshift generator: enough to spread bits, with no dependency.
    fn bits(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    /// `bfloat16` patterns whose sums hit every rounding case: subnormals (whose sum
    /// AVX512-BF16's conversion would flush), ties, overflow, infinities and NaNs.
    const BF16_SPECIALS: [u16; 16] = [
        0x0000, 0x8000, 0x0001, 0x8001, 0x007F, 0x807F, 0x0080, 0x0040, 0x7F7F, 0xFF7F, 0x7F80,
        0xFF80, 0x7FC0, 0xFFC1, 0x7F81, 0x3F81,
    ];

    /// On every level here, the `bfloat16` sum with AVX512-BF16's conversion (where the level
    /// and CPU have it) and without it (the plain loop) give MLX's rounding.
    #[test]
    fn bf16_sums_with_and_without_avx512bf16_round_as_mlx() {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        for level in available() {
            for round in 0..200 {
                let n = (bits(&mut state) % 90) as usize;
                let (mut acc, mut inc) = (vec![0xAA], vec![0x55]);
                for _ in 0..n {
                    let r = bits(&mut state);
                    let pick = |r: u64| match r % 4 {
                        0 => BF16_SPECIALS[(r >> 8) as usize % BF16_SPECIALS.len()],
                        1 => (r >> 16) as u16 & 0x80FF, // subnormal or zero
                        _ => (r >> 16) as u16,
                    };
                    let a = pick(r);
                    let b = if r & 0x100 != 0 {
                        a ^ 0x8001
                    } else {
                        pick(r >> 20)
                    };
                    acc.extend_from_slice(&a.to_ne_bytes());
                    inc.extend_from_slice(&b.to_ne_bytes());
                }
                // The byte in front misaligns both slices, and must stay as it is.
                let mut with = acc.clone();
                let mut without = acc.clone();
                // Sums are the same under both semantics: alternate them.
                let sum = Reduction {
                    semantics: Semantics::ALL[round % 2],
                    op: Op::Sum,
                    elem: Elem::BF16,
                };
                let ran = dispatch(level, true, sum, &mut with[1..], &inc[1..]);
                let ran_without = dispatch(level, false, sum, &mut without[1..], &inc[1..]);
                assert_eq!(ran, level != Level::Scalar, "{level}");
                assert_eq!(ran_without, ran, "{level}");
                if !ran {
                    assert_eq!((&with, &without), (&acc, &acc));
                    continue;
                }
                let widen =
                    |x: &[u8]| f32::from_bits(u32::from(u16::from_ne_bytes([x[0], x[1]])) << 16);
                let want: Vec<u8> = acc[..1]
                    .iter()
                    .copied()
                    .chain(
                        acc[1..]
                            .as_chunks::<2>()
                            .0
                            .iter()
                            .zip(inc[1..].as_chunks::<2>().0)
                            .flat_map(|(a, b)| {
                                portable::bf16_round(widen(a) + widen(b)).to_ne_bytes()
                            }),
                    )
                    .collect();
                assert_eq!(with, want, "{level} with AVX512-BF16, round {round}");
                assert_eq!(without, want, "{level} without AVX512-BF16, round {round}");
            }
        }
    }

    #[test]
    fn subnormal_bf16_sums_are_not_flushed() {
        for level in available() {
            let mut acc: Vec<u8> = [0x0040u16, 0x8001, 0x007F]
                .iter()
                .flat_map(|x| x.to_ne_bytes())
                .collect();
            let inc: Vec<u8> = [0x0001u16, 0x8001, 0x0001]
                .iter()
                .flat_map(|x| x.to_ne_bytes())
                .collect();
            if reduce(level, Semantics::Ring, Op::Sum, Elem::BF16, &mut acc, &inc) {
                let got: Vec<u16> = acc
                    .as_chunks::<2>()
                    .0
                    .iter()
                    .map(|c| u16::from_ne_bytes([c[0], c[1]]))
                    .collect();
                assert_eq!(got, [0x0041, 0x8002, 0x0080], "{level}");
            }
        }
    }

    /// `f16` cases with known MLX results, as bits: `(op, acc, inc, ring, jaccl)`, the result
    /// under each [`Semantics`]. Sums are the same under both; max and min differ where the
    /// comparison decides nothing (NaN, equal zeros), the ring keeping the accumulator and
    /// JACCL the incoming value. Sums with a NaN are [`F16_NAN_SUMS`], which differ between
    /// targets.
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    const F16_CASES: [(Op, u16, u16, u16, u16); 22] = [
        (Op::Sum, 0x3C00, 0x4000, 0x4200, 0x4200), // 1 + 2 = 3
        (Op::Sum, 0x6800, 0x3C00, 0x6800, 0x6800), // 2048 + 1: a tie, to even
        (Op::Sum, 0x6801, 0x3C00, 0x6802, 0x6802), // 2050 + 1: a tie, to even (up)
        (Op::Sum, 0x7BFF, 0x7BFF, 0x7C00, 0x7C00), // max + max overflows to infinity
        (Op::Sum, 0x0001, 0x0001, 0x0002, 0x0002), // subnormals stay exact
        (Op::Sum, 0x03FF, 0x0001, 0x0400, 0x0400), // into the normals
        (Op::Sum, 0x8000, 0x8000, 0x8000, 0x8000), // -0 + -0 = -0
        (Op::Sum, 0x8000, 0x0000, 0x0000, 0x0000), // -0 + 0 = 0
        (Op::Max, 0x3C00, 0x4000, 0x4000, 0x4000),
        (Op::Max, 0x4000, 0x3C00, 0x4000, 0x4000),
        (Op::Max, 0x7E00, 0x3C00, 0x7E00, 0x3C00), // a NaN in acc: stays, or is replaced
        (Op::Max, 0x3C00, 0x7E01, 0x3C00, 0x7E01), // an incoming NaN: ignored, or wins
        (Op::Max, 0x8000, 0x0000, 0x8000, 0x0000), // equal zeros: acc's sign, or inc's
        (Op::Max, 0x0000, 0x8000, 0x0000, 0x8000),
        (Op::Max, 0xFC00, 0x0001, 0x0001, 0x0001),
        (Op::Min, 0x3C00, 0x4000, 0x3C00, 0x3C00),
        (Op::Min, 0x4000, 0x3C00, 0x3C00, 0x3C00),
        (Op::Min, 0xFE00, 0x3C00, 0xFE00, 0x3C00),
        (Op::Min, 0x3C00, 0xFE00, 0x3C00, 0xFE00),
        (Op::Min, 0x0000, 0x8000, 0x0000, 0x8000),
        (Op::Min, 0x8000, 0x0000, 0x8000, 0x0000),
        (Op::Min, 0x0001, 0xFC00, 0xFC00, 0xFC00),
    ];

    /// `f16` sums with a NaN on x86, as bits `(acc, inc, sum)`: MLX's software half makes any
    /// NaN the sign over 0x7D00.
    #[cfg(target_arch = "x86_64")]
    const F16_NAN_SUMS: [(u16, u16, u16); 4] = [
        (0x7E00, 0x3C00, 0x7D00),
        (0x3C00, 0xFE01, 0xFD00),
        (0xFC01, 0x3C00, 0xFD00), // a signalling NaN too
        (0x7C00, 0xFC00, 0xFD00), // inf - inf: x86's default NaN is negative
    ];

    /// `f16` sums with a NaN on aarch64, as bits `(acc, inc, sum)`, where MLX adds in native
    /// `float16_t`: the NaN operand, quieted, with its payload; the default NaN (positive)
    /// for inf - inf.
    #[cfg(target_arch = "aarch64")]
    const F16_NAN_SUMS: [(u16, u16, u16); 4] = [
        (0x7E00, 0x3C00, 0x7E00),
        (0x3C00, 0xFE01, 0xFE01),
        (0xFC01, 0x3C00, 0xFE01), // a signalling NaN is quieted
        (0x7C00, 0xFC00, 0x7E00),
    ];

    /// Every level with an `f16` kernel gives the known results, at every length around the
    /// vector widths (so through the padded last block) and misaligned.
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    #[test]
    fn f16_kernels_give_mlx_results_at_every_length() {
        let mut checked = 0;
        for level in available() {
            let pairs = Semantics::ALL.map(|s| Op::ALL.map(|op| (s, op)));
            for (semantics, op) in pairs.into_iter().flatten() {
                if !covers(level, semantics, op, Elem::F16) {
                    continue;
                }
                let cases: Vec<(u16, u16, u16)> = F16_CASES
                    .iter()
                    .filter(|c| c.0 == op)
                    .map(|&(_, a, b, ring, jaccl)| match semantics {
                        Semantics::Ring => (a, b, ring),
                        Semantics::Jaccl => (a, b, jaccl),
                    })
                    .chain(F16_NAN_SUMS.into_iter().filter(|_| op == Op::Sum))
                    .collect();
                for n in 0..40 {
                    let case = |i: usize| cases[i % cases.len()];
                    let mut acc = vec![0xAAu8];
                    let mut inc = vec![0x55u8];
                    for i in 0..n {
                        acc.extend_from_slice(&case(i).0.to_ne_bytes());
                        inc.extend_from_slice(&case(i).1.to_ne_bytes());
                    }
                    acc.push(0xAA);
                    let end = acc.len() - 1;
                    assert!(reduce(
                        level,
                        semantics,
                        op,
                        Elem::F16,
                        &mut acc[1..end],
                        &inc[1..]
                    ));
                    let what = format!("{level} {semantics:?} {op:?}");
                    assert_eq!((acc[0], acc[end]), (0xAA, 0xAA), "{what} n={n}");
                    for i in 0..n {
                        let got = u16::from_ne_bytes([acc[1 + 2 * i], acc[2 + 2 * i]]);
                        let (a, b, want) = case(i);
                        assert_eq!(got, want, "{what}({a:#06x}, {b:#06x}), element {i} of {n}");
                    }
                    checked += 1;
                }
            }
        }
        // On x86_64 every AVX2 CPU has F16C in practice; without either, the root crate's
        // scalar path is the only one and is tested there. NEON always has a kernel.
        if (is_available(Level::Avx2) && features().f16c) || is_available(Level::Neon) {
            assert!(checked >= 2 * 3 * 40, "{checked}");
        }
    }

    /// `complex64` values whose order is decided by each rule of MLX's comparison: real
    /// parts, then imaginary parts on equal real parts, NaN in either part, signed zeros.
    const COMPLEX_VALUES: [(f32, f32); 10] = [
        (1.0, 5.0),
        (2.0, 0.0),
        (1.0, 6.0),
        (1.0, f32::NAN),
        (f32::NAN, 0.0),
        (0.0, 1.0),
        (-0.0, 1.0),
        (0.0, -0.0),
        (f32::NEG_INFINITY, 3.0),
        (-1.0, f32::INFINITY),
    ];

    /// Every level's `complex64` max and min give [`portable`]'s element, bit for bit, for
    /// every pair of [`COMPLEX_VALUES`], at lengths through the padded last block and
    /// misaligned, touching no byte outside the elements.
    #[test]
    fn complex_max_min_keep_whole_elements_in_mlx_order() {
        let n = COMPLEX_VALUES.len();
        let pairs: Vec<_> = (0..n * n)
            .map(|i| (COMPLEX_VALUES[i / n], COMPLEX_VALUES[i % n]))
            .collect();
        let bytes = |c: (f32, f32)| [c.0.to_ne_bytes(), c.1.to_ne_bytes()].concat();
        let parts = |b: &[u8]| {
            let f = |i: usize| f32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
            (f(0), f(4))
        };
        for level in available() {
            for semantics in Semantics::ALL {
                for op in [Op::Max, Op::Min] {
                    for start in [0, 3, 17, 60] {
                        let chunk = &pairs[start..];
                        let len = chunk.len().min(start + 5);
                        let mut acc = vec![0xAAu8];
                        let mut inc = vec![0x55u8];
                        for &(a, b) in &chunk[..len] {
                            acc.extend(bytes(a));
                            inc.extend(bytes(b));
                        }
                        acc.push(0xAA);
                        let end = acc.len() - 1;
                        let before = acc.clone();
                        let ran = reduce(
                            level,
                            semantics,
                            op,
                            Elem::Complex64,
                            &mut acc[1..end],
                            &inc[1..],
                        );
                        let what = format!("{level} {semantics:?} {op:?}");
                        assert_eq!(ran, level != Level::Scalar, "{what}");
                        if !ran {
                            assert_eq!(acc, before, "{what}");
                            continue;
                        }
                        assert_eq!((acc[0], acc[end]), (0xAA, 0xAA), "{what} len {len}");
                        for i in 0..len {
                            let at = 1 + 8 * i;
                            let (a, b) = (&before[at..at + 8], &inc[at..at + 8]);
                            let pick = match op {
                                Op::Max => portable::max_by(
                                    semantics,
                                    (a, parts(a)),
                                    (b, parts(b)),
                                    |x, y| portable::complex_less(&x.1, &y.1),
                                ),
                                _ => portable::min_by(
                                    semantics,
                                    (a, parts(a)),
                                    (b, parts(b)),
                                    |x, y| portable::complex_less(&x.1, &y.1),
                                ),
                            };
                            assert_eq!(
                                &acc[at..at + 8],
                                pick.0,
                                "{what}: {:?} vs {:?}, element {i} of {len}",
                                parts(a),
                                parts(b)
                            );
                        }
                    }
                }
            }
        }
    }
}
