//! The scalar reductions, typed: a thin wrapper over `ffi::simd::portable`, where each rule
//! is written once.
//!
//! The rules live in `ffi` rather than here because `ffi` cannot depend on this crate, and
//! its SIMD levels compile the very same functions into their vectorised loops: so the
//! scalar fallback, the oracle of the kernel tests and the plain SIMD loops cannot drift
//! apart. `portable`'s module docs state the rules, including the two [`Semantics`] of float
//! `max`/`min` (MLX's ring keeps the accumulator when the comparison decides nothing, MLX's
//! JACCL the incoming value). What this module adds needs the `half` crate, which `ffi` does
//! not have: the `f16` sum's conversions, and `half`'s types for `f16`/`bf16`:
//!
//! - `f16` and `bf16` are widened to `f32`, added there and rounded once to nearest-even
//!   (exactly the correctly rounded half sum, since `f32` carries more than twice the bits).
//!   A NaN sum is encoded as MLX's software types encode it: `bf16` always `0x7FC0`; `f16`
//!   as the sum's sign with `0x7D00` on every target but aarch64, where MLX uses the CPU's
//!   native half arithmetic and we follow the hardware's quiet-NaN rules instead.

use ffi::simd::portable;
use half::{bf16, f16};

use crate::element::Complex64;

pub(crate) use ffi::simd::Semantics;
pub(crate) use ffi::simd::portable::{bool_and, bool_or, max, min};

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

/// `f16` sum through `f32`.
#[inline]
pub(crate) fn f16_sum(acc: f16, inc: f16) -> f16 {
    f16::from_bits(f16_round(acc.to_f32() + inc.to_f32()))
}

/// `bf16` sum through `f32`.
#[inline]
pub(crate) fn bf16_sum(acc: bf16, inc: bf16) -> bf16 {
    bf16::from_bits(portable::bf16_sum(acc.to_bits(), inc.to_bits()))
}

/// `bf16` max, compared as the values the bits encode.
#[inline]
pub(crate) fn bf16_max(semantics: Semantics, acc: bf16, inc: bf16) -> bf16 {
    let bits = portable::max_by(semantics, acc.to_bits(), inc.to_bits(), portable::bf16_less);
    bf16::from_bits(bits)
}

/// `bf16` min, compared as the values the bits encode.
#[inline]
pub(crate) fn bf16_min(semantics: Semantics, acc: bf16, inc: bf16) -> bf16 {
    let bits = portable::min_by(semantics, acc.to_bits(), inc.to_bits(), portable::bf16_less);
    bf16::from_bits(bits)
}

/// `complex64` sum, part by part.
#[inline]
pub(crate) fn complex_sum(acc: Complex64, inc: Complex64) -> Complex64 {
    Complex64::new(acc.re + inc.re, acc.im + inc.im)
}

/// MLX's lexicographic complex order, on `Complex64`.
#[inline]
fn complex_less(a: &Complex64, b: &Complex64) -> bool {
    portable::complex_less(&(a.re, a.im), &(b.re, b.im))
}

/// `complex64` max: lexicographic, real part first.
#[inline]
pub(crate) fn complex_max(semantics: Semantics, acc: Complex64, inc: Complex64) -> Complex64 {
    portable::max_by(semantics, acc, inc, complex_less)
}

/// `complex64` min: lexicographic, real part first.
#[inline]
pub(crate) fn complex_min(semantics: Semantics, acc: Complex64, inc: Complex64) -> Complex64 {
    portable::min_by(semantics, acc, inc, complex_less)
}

#[cfg(test)]
mod tests {
    use ffi::simd::portable::bf16_round;

    use super::*;

    const RING: Semantics = Semantics::Ring;
    const JACCL: Semantics = Semantics::Jaccl;

    #[test]
    fn ring_max_keeps_a_nan_already_accumulated_and_ignores_an_incoming_one() {
        assert!(max(RING, f32::NAN, 1.0).is_nan());
        assert_eq!(max(RING, 1.0, f32::NAN), 1.0);
        assert!(min(RING, f32::NAN, 1.0).is_nan());
        assert_eq!(min(RING, 1.0, f32::NAN), 1.0);
        let one = f16::from_f32(1.0);
        assert!(max(RING, f16::NAN, one).is_nan());
        assert_eq!(max(RING, one, f16::NAN), one);
    }

    #[test]
    fn jaccl_max_lets_an_incoming_value_replace_a_nan_and_a_nan_replace_a_value() {
        assert_eq!(max(JACCL, f32::NAN, 1.0), 1.0);
        assert!(max(JACCL, 1.0, f32::NAN).is_nan());
        assert_eq!(min(JACCL, f64::NAN, 1.0), 1.0);
        assert!(min(JACCL, 1.0, f64::NAN).is_nan());
        let (one, two) = (bf16::from_f32(1.0), bf16::from_f32(2.0));
        assert_eq!(bf16_max(JACCL, bf16::NAN, one), one);
        assert!(bf16_max(JACCL, one, bf16::NAN).is_nan());
        assert_eq!(bf16_min(JACCL, two, one), one);
        assert_eq!(bf16_max(JACCL, two, one), two);
        assert!(bf16_max(RING, bf16::NAN, one).is_nan());
    }

    #[test]
    fn equal_zeros_keep_the_accumulators_sign_on_the_ring_and_the_incoming_one_with_jaccl() {
        assert!(max(RING, -0.0f32, 0.0).is_sign_negative());
        assert!(min(RING, 0.0f32, -0.0).is_sign_positive());
        assert!(max(JACCL, 0.0f32, -0.0).is_sign_negative());
        assert!(min(JACCL, -0.0f32, 0.0).is_sign_positive());
        let (z, nz) = (bf16::from_f32(0.0), bf16::from_f32(-0.0));
        assert_eq!(bf16_max(RING, nz, z).to_bits(), 0x8000);
        assert_eq!(bf16_max(JACCL, nz, z).to_bits(), 0x0000);
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
        for s in [RING, JACCL] {
            assert_eq!(complex_max(s, a, b), b);
            assert_eq!(complex_max(s, a, c), c);
            assert_eq!(complex_min(s, b, a), a);
            assert_eq!(complex_min(s, c, a), a);
            assert_eq!(complex_max(s, a, a), a);
        }
    }

    #[test]
    fn complex_nans_and_ties_follow_the_semantics() {
        let a = Complex64::new(1.0, 5.0);
        let n = Complex64::new(f32::NAN, 0.0);
        assert!(complex_max(RING, n, a).re.is_nan());
        assert_eq!(complex_max(RING, a, n), a);
        assert_eq!(complex_max(JACCL, n, a), a);
        assert!(complex_max(JACCL, a, n).re.is_nan());
        assert_eq!(complex_min(JACCL, n, a), a);
        assert!(complex_min(JACCL, a, n).re.is_nan());
        // Equal as compared, different as bits: which one survives is the semantics'.
        let (p, m) = (Complex64::new(0.0, 1.0), Complex64::new(-0.0, 1.0));
        assert!(complex_max(RING, m, p).re.is_sign_negative());
        assert!(complex_max(JACCL, m, p).re.is_sign_positive());
    }
}
