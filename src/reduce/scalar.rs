//! Portable reduction kernels with MLX's ring semantics, element by element.
//!
//! These are the definition of what a reduction means in this crate, and the oracle the
//! SIMD kernels are tested against. Each function combines the accumulator `acc` (this
//! rank's value) with `inc` (the value a peer sent) in that order, because MLX's ring
//! computes `acc = op(acc, inc)` and the order decides which NaN or which signed zero wins:
//!
//! - integers wrap on overflow;
//! - `bool` sum and max are OR, min is AND (MLX's `bool +=` saturates to `true`);
//! - `max` is `acc < inc ? inc : acc` and `min` is `inc < acc ? inc : acc` (`std::max` and
//!   `std::min`), so a NaN already in `acc` stays, a NaN arriving in `inc` is ignored, and of
//!   two equal zeros the accumulator's sign stays;
//! - `f16` and `bf16` are widened to `f32`, added there and rounded once to nearest-even
//!   (exactly the correctly rounded half sum, since `f32` carries more than twice the bits).
//!   A NaN sum is encoded as MLX's software types encode it: `bf16` always `0x7FC0`; `f16`
//!   as the sum's sign with `0x7D00` on every target but aarch64, where MLX uses the CPU's
//!   native half arithmetic and we follow the hardware's quiet-NaN rules instead;
//! - `complex64` sums each part; max and min compare lexicographically, real part first.

use half::{bf16, f16};

use crate::element::Complex64;

/// `acc + inc` for `bool` bytes, normalised to 0/1.
#[inline]
pub(crate) fn bool_or(acc: u8, inc: u8) -> u8 {
    u8::from(acc != 0 || inc != 0)
}

/// `min(acc, inc)` for `bool` bytes: AND, normalised to 0/1.
#[inline]
pub(crate) fn bool_and(acc: u8, inc: u8) -> u8 {
    u8::from(acc != 0 && inc != 0)
}

/// `std::max(acc, inc)`: `inc` replaces `acc` only if `acc < inc`.
#[inline]
pub(crate) fn max<T: PartialOrd>(acc: T, inc: T) -> T {
    if acc < inc { inc } else { acc }
}

/// `std::min(acc, inc)`: `inc` replaces `acc` only if `inc < acc`.
#[inline]
pub(crate) fn min<T: PartialOrd>(acc: T, inc: T) -> T {
    if inc < acc { inc } else { acc }
}

/// Rounds an `f32` sum to `f16` bits the way MLX's CPU build does on this target.
#[inline]
pub(crate) fn f16_round(sum: f32) -> u16 {
    if cfg!(target_arch = "aarch64") || !sum.is_nan() {
        f16::from_f32(sum).to_bits()
    } else {
        // MLX's software half: any NaN becomes the sign over 0x7D00.
        ((sum.to_bits() >> 16) as u16 & 0x8000) | 0x7D00
    }
}

/// Rounds an `f32` sum to `bf16` bits as MLX's software bfloat16 does: NaN is `0x7FC0`,
/// everything else rounds to nearest, ties to even.
#[inline]
pub(crate) fn bf16_round(sum: f32) -> u16 {
    if sum.is_nan() {
        0x7FC0
    } else {
        let bits = sum.to_bits();
        (bits.wrapping_add(0x7FFF + ((bits >> 16) & 1)) >> 16) as u16
    }
}

/// `f16` sum through `f32`.
#[inline]
pub(crate) fn f16_sum(acc: f16, inc: f16) -> f16 {
    f16::from_bits(f16_round(acc.to_f32() + inc.to_f32()))
}

/// `bf16` sum through `f32`.
#[inline]
pub(crate) fn bf16_sum(acc: bf16, inc: bf16) -> bf16 {
    bf16::from_bits(bf16_round(acc.to_f32() + inc.to_f32()))
}

/// `complex64` sum, part by part.
#[inline]
pub(crate) fn complex_sum(acc: Complex64, inc: Complex64) -> Complex64 {
    Complex64::new(acc.re + inc.re, acc.im + inc.im)
}

/// MLX's complex `a > b`: real part first, then imaginary.
#[inline]
fn complex_gt(a: Complex64, b: Complex64) -> bool {
    a.re > b.re || (a.re == b.re && a.im > b.im)
}

/// `std::max` on complex64: `acc < inc`, which MLX defines as `inc > acc`.
#[inline]
pub(crate) fn complex_max(acc: Complex64, inc: Complex64) -> Complex64 {
    if complex_gt(inc, acc) { inc } else { acc }
}

/// `std::min` on complex64: `inc < acc`, which MLX defines as `acc > inc`.
#[inline]
pub(crate) fn complex_min(acc: Complex64, inc: Complex64) -> Complex64 {
    if complex_gt(acc, inc) { inc } else { acc }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_keeps_a_nan_already_accumulated_and_ignores_an_incoming_one() {
        assert!(max(f32::NAN, 1.0).is_nan());
        assert_eq!(max(1.0, f32::NAN), 1.0);
        assert!(min(f32::NAN, 1.0).is_nan());
        assert_eq!(min(1.0, f32::NAN), 1.0);
    }

    #[test]
    fn equal_zeros_keep_the_accumulators_sign() {
        assert!(max(-0.0f32, 0.0).is_sign_negative());
        assert!(min(0.0f32, -0.0).is_sign_positive());
    }

    #[test]
    fn half_sums_round_once_to_nearest_even() {
        // 2048 + 1 is a tie in f16 (spacing 2): rounds to the even 2048.
        let s = f16_sum(f16::from_f32(2048.0), f16::from_f32(1.0));
        assert_eq!(s.to_f32(), 2048.0);
        let s = f16_sum(f16::from_f32(2050.0), f16::from_f32(1.0));
        assert_eq!(s.to_f32(), 2052.0);
        // bf16: 256 + 1 is a tie (spacing 2), 258 + 1 rounds up to 260.
        assert_eq!(
            bf16_sum(bf16::from_f32(256.0), bf16::from_f32(1.0)).to_f32(),
            256.0
        );
        assert_eq!(
            bf16_sum(bf16::from_f32(258.0), bf16::from_f32(1.0)).to_f32(),
            260.0
        );
        // Overflow goes to infinity, as the rounding carries into the exponent.
        assert_eq!(bf16_round(f32::MAX), 0x7F80);
        assert_eq!(f16_sum(f16::MAX, f16::MAX), f16::INFINITY);
    }

    #[test]
    fn nan_sums_use_mlx_encodings() {
        assert_eq!(bf16_round(f32::NAN), 0x7FC0);
        assert_eq!(bf16_round(-f32::NAN), 0x7FC0);
        if !cfg!(target_arch = "aarch64") {
            assert_eq!(f16_round(f32::NAN), 0x7D00);
            assert_eq!(f16_round(-f32::NAN), 0xFD00);
        }
    }

    #[test]
    fn bf16_rounding_matches_half_for_every_non_nan_pattern_sampled() {
        // half rounds to nearest-even too; the two must agree wherever NaN is not involved.
        for hi in (0u32..=0xFFFF).step_by(7) {
            for lo in [0u32, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF] {
                let x = f32::from_bits(hi << 16 | lo);
                if !x.is_nan() {
                    assert_eq!(bf16_round(x), bf16::from_f32(x).to_bits(), "{x:e}");
                }
            }
        }
    }

    #[test]
    fn complex_order_is_lexicographic() {
        let a = Complex64::new(1.0, 5.0);
        let b = Complex64::new(2.0, 0.0);
        let c = Complex64::new(1.0, 6.0);
        assert_eq!(complex_max(a, b), b);
        assert_eq!(complex_max(a, c), c);
        assert_eq!(complex_min(b, a), a);
        assert_eq!(complex_min(c, a), a);
    }

    #[test]
    fn bools_or_and() {
        assert_eq!(bool_or(0, 5), 1);
        assert_eq!(bool_or(0, 0), 0);
        assert_eq!(bool_and(3, 1), 1);
        assert_eq!(bool_and(1, 0), 0);
    }
}
