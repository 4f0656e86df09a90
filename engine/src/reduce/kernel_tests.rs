//! The SIMD kernels of every level this machine has, against the scalar oracle, bit for bit,
//! under both [`Semantics`] (MLX's ring and MLX's JACCL rule for float max and min).
//!
//! Values are drawn to hit what kernels get wrong: NaNs of both signs, quiet and signalling,
//! with various payloads; infinities; signed zeros; subnormals; the extremes of every
//! integer type; rounding ties; and pairs that are equal or differ in a few low bits or the
//! sign. Slices start at any offset (misaligned), end with a partial element or an element
//! the other slice lacks, and run from empty to well past four vectors, so every loop's
//! head, body and tail is covered. The only tolerated difference is which NaN a float sum of
//! two NaNs returns, which MLX does not fix either.

use ffi::simd::{self, Level, Semantics};
use proptest::prelude::*;

use super::*;

/// How one component of an element is encoded; `complex64` is two `F32` components.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fmt {
    Bool,
    Int(usize),
    F16,
    BF16,
    F32,
    F64,
}

fn format(dtype: DType) -> (Fmt, usize) {
    match dtype {
        DType::Bool => (Fmt::Bool, 1),
        DType::U8 | DType::I8 => (Fmt::Int(1), 1),
        DType::U16 | DType::I16 => (Fmt::Int(2), 1),
        DType::U32 | DType::I32 => (Fmt::Int(4), 1),
        DType::U64 | DType::I64 => (Fmt::Int(8), 1),
        DType::F16 => (Fmt::F16, 1),
        DType::BF16 => (Fmt::BF16, 1),
        DType::F32 => (Fmt::F32, 1),
        DType::F64 => (Fmt::F64, 1),
        DType::Complex64 => (Fmt::F32, 2),
    }
}

impl Fmt {
    fn width(self) -> usize {
        match self {
            Fmt::Bool => 1,
            Fmt::Int(w) => w,
            Fmt::F16 | Fmt::BF16 => 2,
            Fmt::F32 => 4,
            Fmt::F64 => 8,
        }
    }

    /// Bit patterns that must come up often.
    fn specials(self) -> &'static [u64] {
        match self {
            Fmt::Bool => &[0, 1, 2, 0x80, 0xFF],
            Fmt::Int(1) => &[0, 1, 0x7F, 0x80, 0x81, 0xFF],
            Fmt::Int(2) => &[0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF],
            Fmt::Int(4) => &[0, 1, 0x7FFF_FFFF, 0x8000_0000, 0x8000_0001, 0xFFFF_FFFF],
            Fmt::Int(_) => &[0, 1, i64::MAX as u64, i64::MIN as u64, u64::MAX, 1 << 32],
            Fmt::F16 => &[
                0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00,
                0x7E00, 0xFE00, 0x7C01, 0xFC01, 0x7D00, 0x7FFF, 0x3C00, 0xBC00, 0x6800, 0x6801,
            ],
            Fmt::BF16 => &[
                0x0000, 0x8000, 0x0001, 0x8001, 0x007F, 0x807F, 0x0080, 0x7F7F, 0xFF7F, 0x7F80,
                0xFF80, 0x7FC0, 0xFFC0, 0x7F81, 0xFF81, 0x7FFF, 0x3F80, 0xBF80, 0x4380, 0x4381,
            ],
            Fmt::F32 => &[
                0x0000_0000,
                0x8000_0000,
                0x0000_0001,
                0x8000_0001,
                0x007F_FFFF,
                0x0080_0000,
                0x7F7F_FFFF,
                0xFF7F_FFFF,
                0x7F80_0000,
                0xFF80_0000,
                0x7FC0_0000,
                0xFFC0_0000,
                0x7F80_0001,
                0xFF80_0001,
                0x7FC1_2345,
                0x7FBF_FFFF,
                0x3F80_0000,
                0xBF80_0000,
                0x4B80_0000,
                0x3380_0000,
            ],
            Fmt::F64 => &[
                0x0000_0000_0000_0000,
                0x8000_0000_0000_0000,
                0x0000_0000_0000_0001,
                0x8000_0000_0000_0001,
                0x000F_FFFF_FFFF_FFFF,
                0x0010_0000_0000_0000,
                0x7FEF_FFFF_FFFF_FFFF,
                0xFFEF_FFFF_FFFF_FFFF,
                0x7FF0_0000_0000_0000,
                0xFFF0_0000_0000_0000,
                0x7FF8_0000_0000_0000,
                0xFFF8_0000_0000_0000,
                0x7FF0_0000_0000_0001,
                0xFFF0_0000_0000_0001,
                0x7FF8_0123_4567_89AB,
                0x7FF7_FFFF_FFFF_FFFF,
                0x3FF0_0000_0000_0000,
                0xBFF0_0000_0000_0000,
            ],
        }
    }

    /// A value near 1 in magnitude, so that sums of two of them cancel and round.
    fn ordinary(self, r: u64) -> u64 {
        let sign = r >> 63;
        match self {
            Fmt::Bool | Fmt::Int(_) => (r % 7).wrapping_sub(3),
            Fmt::F16 => sign << 15 | (15 + r % 5 - 2) << 10 | (r >> 8) & 0x3FF,
            Fmt::BF16 => sign << 15 | (127 + r % 9 - 4) << 7 | (r >> 8) & 0x7F,
            Fmt::F32 => sign << 31 | (127 + r % 9 - 4) << 23 | (r >> 8) & 0x7F_FFFF,
            Fmt::F64 => sign << 63 | (1023 + r % 9 - 4) << 52 | (r >> 8) & 0xF_FFFF_FFFF_FFFF,
        }
    }

    fn mask(self) -> u64 {
        match self.width() {
            8 => u64::MAX,
            w => (1 << (8 * w)) - 1,
        }
    }

    /// One component's bits from a draw: a special pattern, a value near 1, or any bits.
    fn draw(self, kind: u8, r: u64) -> u64 {
        let bits = match kind % 8 {
            0..=2 => self.specials()[(r % self.specials().len() as u64) as usize],
            3..=4 => self.ordinary(r),
            _ => r,
        };
        bits & self.mask()
    }

    /// The incoming component paired with `acc`: sometimes a near relative of it (equal,
    /// low bits changed, sign flipped), so that ties, cancellation, equal values and zeros
    /// of both signs meet.
    fn pair(self, acc: u64, kind: u8, r: u64) -> u64 {
        let sign = 1u64 << (8 * self.width() - 1);
        let bits = match kind / 32 {
            0 => acc,
            1 => acc ^ (r & 0x7),
            2 => acc ^ sign,
            3 => acc ^ sign ^ (r & 0x3),
            _ => return self.draw(kind, r),
        };
        bits & self.mask()
    }

    fn is_nan(self, bits: u64) -> bool {
        match self {
            Fmt::F16 => bits & 0x7FFF > 0x7C00,
            Fmt::BF16 => bits & 0x7FFF > 0x7F80,
            Fmt::F32 => bits & 0x7FFF_FFFF > 0x7F80_0000,
            Fmt::F64 => bits & 0x7FFF_FFFF_FFFF_FFFF > 0x7FF0_0000_0000_0000,
            Fmt::Bool | Fmt::Int(_) => false,
        }
    }
}

/// One draw per component: `(kind, acc bits, inc bits)`.
type Draw = (u8, u64, u64);

/// Writes `n` elements of `dtype` from `draws` as (acc, inc) byte vectors.
fn elements(dtype: DType, draws: &[Draw], n: usize) -> (Vec<u8>, Vec<u8>) {
    let (fmt, parts) = format(dtype);
    let (mut acc, mut inc) = (Vec::new(), Vec::new());
    for &(kind, ra, rb) in draws.iter().cycle().take(n * parts) {
        let a = fmt.draw(kind, ra);
        let b = fmt.pair(a, kind.rotate_left(3), rb);
        acc.extend_from_slice(&a.to_le_bytes()[..fmt.width()]);
        inc.extend_from_slice(&b.to_le_bytes()[..fmt.width()]);
    }
    // Native-endian wire bytes from little-endian draws: the same on every platform we
    // build for, but stated rather than assumed.
    if cfg!(target_endian = "big") {
        for chunk in acc
            .chunks_mut(fmt.width())
            .chain(inc.chunks_mut(fmt.width()))
        {
            chunk.reverse();
        }
    }
    (acc, inc)
}

fn read(bytes: &[u8]) -> u64 {
    let mut le = [0u8; 8];
    le[..bytes.len()].copy_from_slice(bytes);
    if cfg!(target_endian = "big") {
        le[..bytes.len()].reverse();
    }
    u64::from_le_bytes(le)
}

/// Whether `got` is an acceptable sum of two NaN components `a` and `b` that the oracle
/// summed to something else: any NaN for `f32`/`f64`, MLX's encoding with either operand's
/// sign for `f16` (x86 and the like; aarch64 follows the hardware, so any NaN).
fn two_nan_sum_ok(fmt: Fmt, a: u64, b: u64, got: u64) -> bool {
    if !(fmt.is_nan(a) && fmt.is_nan(b) && fmt.is_nan(got)) {
        return false;
    }
    match fmt {
        Fmt::F32 | Fmt::F64 => true,
        Fmt::F16 if cfg!(target_arch = "aarch64") => true,
        Fmt::F16 => got == (a & 0x8000) | 0x7D00 || got == (b & 0x8000) | 0x7D00,
        Fmt::Bool | Fmt::Int(_) | Fmt::BF16 => false,
    }
}

/// Filler around the slices, which no kernel may touch.
const FILL: u8 = 0xA5;

/// Runs `level`'s kernel (or the scalar path where it has none) and the oracle on the same
/// misaligned slices, and compares the whole buffers.
#[allow(clippy::too_many_arguments)]
fn check(
    level: Level,
    semantics: Semantics,
    op: ReduceOp,
    dtype: DType,
    draws: &[Draw],
    n: usize,
    acc_off: usize,
    inc_off: usize,
    acc_extra: usize,
    inc_extra: usize,
) -> std::result::Result<(), String> {
    let size = dtype.size();
    // Extra bytes past `n` elements: a partial element, or whole ones only one slice has.
    let (a, b) = elements(dtype, draws, n + acc_extra.max(inc_extra).div_ceil(size));
    let acc_len = n * size + acc_extra;
    let inc_len = n * size + inc_extra;
    let mut acc = vec![FILL; acc_off + acc_len + 8];
    acc[acc_off..acc_off + acc_len].copy_from_slice(&a[..acc_len]);
    let mut inc = vec![FILL; inc_off + inc_len];
    inc[inc_off..].copy_from_slice(&b[..inc_len]);
    let inc = &inc[inc_off..];

    let mut want = acc.clone();
    reduce_scalar_with(
        semantics,
        op,
        dtype,
        &mut want[acc_off..acc_off + acc_len],
        inc,
    );
    let mut got = acc.clone();
    let target = &mut got[acc_off..acc_off + acc_len];
    if !simd::reduce(
        level,
        semantics,
        simd_op(op),
        dtype.simd_elem(),
        target,
        inc,
    ) {
        reduce_scalar_with(semantics, op, dtype, target, inc);
    }
    if got == want {
        return Ok(());
    }

    let (fmt, _) = format(dtype);
    let w = fmt.width();
    let whole = acc_len.min(inc_len) / size * size;
    for (i, (g, e)) in got.iter().zip(&want).enumerate() {
        if g == e {
            continue;
        }
        let inside = (acc_off..acc_off + whole).contains(&i);
        if !inside {
            return Err(format!(
                "{level} {semantics:?} {op} {dtype}: byte {i} outside the {whole} bytes at offset {acc_off} \
                 changed: {g:#04x}, want {e:#04x}"
            ));
        }
        let c = (i - acc_off) / w * w;
        let (ga, wa) = (&got[acc_off + c..][..w], &want[acc_off + c..][..w]);
        let (x, y) = (read(&acc[acc_off + c..][..w]), read(&inc[c..][..w]));
        if op == ReduceOp::Sum && two_nan_sum_ok(fmt, x, y, read(ga)) {
            continue;
        }
        return Err(format!(
            "{level} {semantics:?} {op} {dtype} (n={n}, offsets {acc_off}/{inc_off}, extra \
             {acc_extra}/{inc_extra}): component at byte {c} of acc: op({x:#x}, {y:#x}) gave \
             {:#x}, the oracle {:#x}",
            read(ga),
            read(wa),
        ));
    }
    Ok(())
}

/// Element counts: mostly short (every tail), sometimes long (past four unrolled vectors of
/// one-byte elements).
fn lengths() -> impl Strategy<Value = usize> {
    prop_oneof![8 => 0..300usize, 1 => 300..1100usize]
}

// 256 cases by default; `PROPTEST_CASES` runs more.
proptest! {
    #[test]
    fn every_level_matches_the_scalar_oracle(
        n in lengths(),
        acc_off in 0..8usize,
        inc_off in 0..8usize,
        acc_extra in 0..16usize,
        inc_extra in 0..16usize,
        draws in prop::collection::vec(any::<Draw>(), 1..64),
    ) {
        for level in simd::available() {
            for dtype in DType::ALL {
                // Up to one element more than `n` on either side, plus a partial one.
                let (acc_extra, inc_extra) = (acc_extra % (2 * dtype.size()), inc_extra % (2 * dtype.size()));
                for op in ReduceOp::ALL {
                    for semantics in Semantics::ALL {
                        let outcome = check(level, semantics, op, dtype, &draws, n, acc_off, inc_off, acc_extra, inc_extra);
                        prop_assert!(outcome.is_ok(), "{}", outcome.unwrap_err());
                    }
                }
            }
        }
    }
}

/// What each level must cover, so that a kernel that quietly returns `false` (leaving the
/// work to the scalar path, which would pass every comparison) is caught. Both semantics
/// have the same kernels.
#[test]
fn every_level_covers_what_it_should() {
    for level in simd::available() {
        for dtype in DType::ALL {
            for (op, semantics) in ReduceOp::ALL
                .into_iter()
                .flat_map(|op| Semantics::ALL.map(|s| (op, s)))
            {
                let expected = match (level, dtype, op) {
                    (Level::Scalar, _, _) => false,
                    #[cfg(target_arch = "x86_64")]
                    (Level::Avx2, DType::F16, _) => std::arch::is_x86_feature_detected!("f16c"),
                    _ => true,
                };
                assert_eq!(
                    simd::covers(level, semantics, simd_op(op), dtype.simd_elem()),
                    expected,
                    "{level} {semantics:?} {op} {dtype}"
                );
            }
        }
    }
}

/// On x86_64 the levels offered are exactly those the CPU's features allow.
#[cfg(target_arch = "x86_64")]
#[test]
fn x86_levels_follow_the_cpu() {
    use std::arch::is_x86_feature_detected as has;
    let levels = simd::available();
    assert_eq!(levels.contains(&Level::Avx2), has!("avx2"));
    let avx512 = has!("avx512f")
        && has!("avx512bw")
        && has!("avx512vl")
        && has!("avx2")
        && has!("fma")
        && has!("f16c");
    assert_eq!(levels.contains(&Level::Avx512), avx512);
    assert!(!levels.contains(&Level::Neon));
    assert_eq!(simd::detected(), *levels.last().unwrap());
}

/// The wired paths, `reduce_into` (the ring's) and `reduce_with` (JACCL's), on a few cases
/// per dtype whose results are fixed by MLX's semantics, whatever the level.
#[test]
fn reduce_into_gives_the_scalar_results_at_the_active_level() {
    let draws: Vec<Draw> = (0..97u64)
        .map(|i| {
            let r = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            (r as u8, r, r.rotate_left(17))
        })
        .collect();
    for dtype in DType::ALL {
        for (op, semantics) in ReduceOp::ALL
            .into_iter()
            .flat_map(|op| Semantics::ALL.map(|s| (op, s)))
        {
            let (acc, inc) = elements(dtype, &draws, 97);
            let mut want = acc.clone();
            reduce_scalar_with(semantics, op, dtype, &mut want, &inc);
            let mut got = acc.clone();
            match semantics {
                Semantics::Ring => reduce_into(op, dtype, &mut got, &inc),
                Semantics::Jaccl => reduce_with(semantics, op, dtype, &mut got, &inc),
            }
            let (fmt, _) = format(dtype);
            let w = fmt.width();
            for (c, ((g, e), (x, y))) in got
                .chunks(w)
                .zip(want.chunks(w))
                .zip(acc.chunks(w).zip(inc.chunks(w)))
                .enumerate()
            {
                let (g, x, y) = (read(g), read(x), read(y));
                assert!(
                    g == read(e) || (op == ReduceOp::Sum && two_nan_sum_ok(fmt, x, y, g)),
                    "{} {semantics:?} {op} {dtype}: component {c}: op({x:#x}, {y:#x}) = {g:#x}",
                    simd_level()
                );
            }
        }
    }
}
