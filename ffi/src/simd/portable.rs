//! The scalar definition of every reduction, and the plain element loops built from it.
//!
//! This module is where each elementwise rule is written, once. The root crate's
//! `src/reduce/scalar.rs` is a typed wrapper over these functions (it adds only what needs the
//! `half` crate, which this crate does not depend on: the `f16` conversions), so the same code
//! is the root's scalar fallback, the oracle the SIMD kernels are tested against bit for bit,
//! and, through the module's `reduce`, the body of the loops the compiler vectorises. The intrinsic
//! kernels of `x86_64.rs` and `aarch64.rs` cannot call these functions lane by lane; each of them says which
//! rule it implements and is tested against it.
//!
//! Every rule combines the accumulator `acc` (this rank's value) with `inc` (the value a peer
//! sent) in that order, because the order decides which NaN or which signed zero wins:
//!
//! - integers wrap on overflow; `bool` sum and max are OR, min is AND, results are 0 or 1;
//! - `max` and `min` replace the operand they keep only on a strict comparison, so when the
//!   comparison decides nothing (a NaN on either side, or two equal values such as `-0.0` and
//!   `0.0`) the kept operand survives. Which operand is kept is the [`Semantics`]: MLX's ring
//!   (`std::max`/`std::min`) keeps the accumulator, MLX's JACCL
//!   (`(acc > in) ? acc : in`) keeps the incoming value. JACCL's rule is therefore the ring's
//!   with the operands swapped, and that is how it is written ([`Semantics::order`]). For
//!   integers and `bool` the two give the same bits (equal values are identical), so their
//!   kernels ignore the semantics;
//! - `bfloat16` is widened to `f32` exactly, added there and rounded once to nearest-even; a
//!   NaN sum is `0x7FC0`, as MLX's software `bfloat16` encodes it ([`bf16_round`]);
//! - `complex64` sums each part; max and min compare lexicographically, real part first
//!   ([`complex_less`]), with the same rule for the kept operand.

use super::{Elem, Op, Semantics};

impl Semantics {
    /// `(kept, other)`: the operand `max` and `min` keep unless the comparison says `other`
    /// is strictly greater (max) or smaller (min), and that other operand.
    #[inline(always)]
    pub fn order<T>(self, acc: T, inc: T) -> (T, T) {
        match self {
            Semantics::Ring => (acc, inc),
            Semantics::Jaccl => (inc, acc),
        }
    }
}

/// `max(acc, inc)` under the order `less`: `other` replaces `kept` only if `kept < other`.
#[inline(always)]
pub fn max_by<T>(semantics: Semantics, acc: T, inc: T, less: impl Fn(&T, &T) -> bool) -> T {
    let (kept, other) = semantics.order(acc, inc);
    if less(&kept, &other) { other } else { kept }
}

/// `min(acc, inc)` under the order `less`: `other` replaces `kept` only if `other < kept`.
#[inline(always)]
pub fn min_by<T>(semantics: Semantics, acc: T, inc: T, less: impl Fn(&T, &T) -> bool) -> T {
    let (kept, other) = semantics.order(acc, inc);
    if less(&other, &kept) { other } else { kept }
}

/// `max(acc, inc)` of a primitive: for [`Semantics::Ring`] `std::max(acc, inc)`, for
/// [`Semantics::Jaccl`] `(acc > inc) ? acc : inc`.
#[inline(always)]
pub fn max<T: PartialOrd>(semantics: Semantics, acc: T, inc: T) -> T {
    max_by(semantics, acc, inc, |a, b| a < b)
}

/// `min(acc, inc)` of a primitive: for [`Semantics::Ring`] `std::min(acc, inc)`, for
/// [`Semantics::Jaccl`] `(acc < inc) ? acc : inc`.
#[inline(always)]
pub fn min<T: PartialOrd>(semantics: Semantics, acc: T, inc: T) -> T {
    min_by(semantics, acc, inc, |a, b| a < b)
}

/// `acc + inc` (and `max`) for `bool` bytes: OR, normalised to 0/1.
#[inline(always)]
pub fn bool_or(acc: u8, inc: u8) -> u8 {
    u8::from((acc | inc) != 0)
}

/// `min(acc, inc)` for `bool` bytes: AND, normalised to 0/1.
#[inline(always)]
pub fn bool_and(acc: u8, inc: u8) -> u8 {
    u8::from(acc != 0) & u8::from(inc != 0)
}

/// A `bfloat16` widened to `f32`: exact, it is the top half of an `f32`.
#[inline(always)]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// MLX's software `bfloat16` rounding: NaN is `0x7FC0`, everything else rounds to nearest,
/// ties to even (the carry out of the mantissa is the overflow to infinity).
#[inline(always)]
pub fn bf16_round(sum: f32) -> u16 {
    let bits = sum.to_bits();
    let rounded = (bits.wrapping_add(0x7FFF + ((bits >> 16) & 1)) >> 16) as u16;
    if sum.is_nan() { 0x7FC0 } else { rounded }
}

/// `bfloat16` sum through `f32`, on bits.
#[inline(always)]
pub fn bf16_sum(acc: u16, inc: u16) -> u16 {
    bf16_round(bf16_to_f32(acc) + bf16_to_f32(inc))
}

/// `a < b` for `bfloat16` bits, compared as the values they encode.
#[inline(always)]
pub fn bf16_less(a: &u16, b: &u16) -> bool {
    bf16_to_f32(*a) < bf16_to_f32(*b)
}

/// MLX's complex `a < b` on `(re, im)`: real part first, then imaginary. False when a
/// compared part is NaN.
#[inline(always)]
pub fn complex_less(a: &(f32, f32), b: &(f32, f32)) -> bool {
    a.0 < b.0 || (a.0 == b.0 && a.1 < b.1)
}

/// `acc[i] = f(acc[i], inc[i])` over the whole `N`-byte elements both slices have.
#[inline(always)]
fn zip_with<const N: usize>(acc: &mut [u8], inc: &[u8], f: impl Fn([u8; N], [u8; N]) -> [u8; N]) {
    let (acc, _) = acc.as_chunks_mut::<N>();
    let (inc, _) = inc.as_chunks::<N>();
    for (a, b) in acc.iter_mut().zip(inc) {
        *a = f(*a, *b);
    }
}

/// `f(acc, inc)`, with `T` fixed so that a closure's parameter types are known.
#[inline(always)]
fn apply<T>(f: impl Fn(T, T) -> T, acc: T, inc: T) -> T {
    f(acc, inc)
}

/// One `op` over values of `$t`, read from and written back to native-endian bytes.
macro_rules! typed {
    ($t:ty, $acc:expr, $inc:expr, $f:expr) => {
        zip_with::<{ size_of::<$t>() }>($acc, $inc, |a, b| {
            apply::<$t>($f, <$t>::from_ne_bytes(a), <$t>::from_ne_bytes(b)).to_ne_bytes()
        })
    };
}

/// Sum (wrapping), max and min of an integer type. The semantics make no difference to the
/// bits of an integer max or min, so the ring's rule serves both.
macro_rules! integer {
    ($t:ty, $op:expr, $acc:expr, $inc:expr) => {
        match $op {
            Op::Sum => typed!($t, $acc, $inc, <$t>::wrapping_add),
            Op::Max => typed!($t, $acc, $inc, |a, b| max(Semantics::Ring, a, b)),
            Op::Min => typed!($t, $acc, $inc, |a, b| min(Semantics::Ring, a, b)),
        }
    };
}

/// Sum, max and min of a float type. The semantics are matched outside the loop, so that
/// each loop is compiled with its rule fixed.
macro_rules! float {
    ($t:ty, $semantics:expr, $op:expr, $acc:expr, $inc:expr) => {
        match ($op, $semantics) {
            (Op::Sum, _) => typed!($t, $acc, $inc, |a, b| a + b),
            (Op::Max, Semantics::Ring) => typed!($t, $acc, $inc, |a, b| max(Semantics::Ring, a, b)),
            (Op::Max, Semantics::Jaccl) => {
                typed!($t, $acc, $inc, |a, b| max(Semantics::Jaccl, a, b))
            }
            (Op::Min, Semantics::Ring) => typed!($t, $acc, $inc, |a, b| min(Semantics::Ring, a, b)),
            (Op::Min, Semantics::Jaccl) => {
                typed!($t, $acc, $inc, |a, b| min(Semantics::Jaccl, a, b))
            }
        }
    };
}

/// Runs the plain loop for `(op, elem)` with `semantics`; returns `false`, touching nothing,
/// for the pairs that have none: `f16` (whose conversions need intrinsics or `half`) and
/// complex max and min.
#[inline(always)]
pub(super) fn reduce(semantics: Semantics, op: Op, elem: Elem, acc: &mut [u8], inc: &[u8]) -> bool {
    use Semantics::{Jaccl, Ring};
    match elem {
        Elem::Bool => match op {
            Op::Sum | Op::Max => typed!(u8, acc, inc, bool_or),
            Op::Min => typed!(u8, acc, inc, bool_and),
        },
        Elem::U8 => integer!(u8, op, acc, inc),
        Elem::U16 => integer!(u16, op, acc, inc),
        Elem::U32 => integer!(u32, op, acc, inc),
        Elem::U64 => integer!(u64, op, acc, inc),
        Elem::I8 => integer!(i8, op, acc, inc),
        Elem::I16 => integer!(i16, op, acc, inc),
        Elem::I32 => integer!(i32, op, acc, inc),
        Elem::I64 => integer!(i64, op, acc, inc),
        Elem::F32 => float!(f32, semantics, op, acc, inc),
        Elem::F64 => float!(f64, semantics, op, acc, inc),
        Elem::BF16 => match (op, semantics) {
            (Op::Sum, _) => typed!(u16, acc, inc, bf16_sum),
            (Op::Max, Ring) => typed!(u16, acc, inc, |a, b| max_by(Ring, a, b, bf16_less)),
            (Op::Max, Jaccl) => typed!(u16, acc, inc, |a, b| max_by(Jaccl, a, b, bf16_less)),
            (Op::Min, Ring) => typed!(u16, acc, inc, |a, b| min_by(Ring, a, b, bf16_less)),
            (Op::Min, Jaccl) => typed!(u16, acc, inc, |a, b| min_by(Jaccl, a, b, bf16_less)),
        },
        Elem::Complex64 => match op {
            // Part by part: exactly the f32 sum over the floats of whole complex elements.
            Op::Sum => {
                let whole = acc.len().min(inc.len()) / 8 * 8;
                typed!(f32, &mut acc[..whole], &inc[..whole], |a, b| a + b);
            }
            Op::Max | Op::Min => return false,
        },
        Elem::F16 => return false,
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_accumulator_when_the_comparison_decides_nothing() {
        let r = Semantics::Ring;
        assert!(max(r, f32::NAN, 1.0).is_nan());
        assert_eq!(max(r, 1.0, f32::NAN), 1.0);
        assert!(min(r, f32::NAN, 1.0).is_nan());
        assert_eq!(min(r, 1.0, f32::NAN), 1.0);
        assert!(max(r, -0.0f32, 0.0).is_sign_negative());
        assert!(min(r, 0.0f32, -0.0).is_sign_positive());
        assert_eq!((max(r, 2.0, 3.0), min(r, 2.0, 3.0)), (3.0, 2.0));
    }

    #[test]
    fn jaccl_keeps_the_incoming_value_when_the_comparison_decides_nothing() {
        let j = Semantics::Jaccl;
        assert_eq!(max(j, f32::NAN, 1.0), 1.0);
        assert!(max(j, 1.0, f32::NAN).is_nan());
        assert_eq!(min(j, f64::NAN, 1.0), 1.0);
        assert!(min(j, 1.0, f64::NAN).is_nan());
        assert!(max(j, 0.0f32, -0.0).is_sign_negative());
        assert!(min(j, -0.0f32, 0.0).is_sign_positive());
        assert_eq!((max(j, 2.0, 3.0), min(j, 2.0, 3.0)), (3.0, 2.0));
        assert_eq!((max(j, 3.0, 2.0), min(j, 3.0, 2.0)), (3.0, 2.0));
    }

    #[test]
    fn complex_order_is_lexicographic_under_both_semantics() {
        let (a, b, c) = ((1.0, 5.0), (2.0, 0.0), (1.0, 6.0));
        for s in [Semantics::Ring, Semantics::Jaccl] {
            assert_eq!(max_by(s, a, b, complex_less), b);
            assert_eq!(max_by(s, a, c, complex_less), c);
            assert_eq!(min_by(s, b, a, complex_less), a);
            assert_eq!(min_by(s, c, a, complex_less), a);
        }
        let n = (f32::NAN, 0.0);
        assert!(max_by(Semantics::Ring, n, a, complex_less).0.is_nan());
        assert_eq!(max_by(Semantics::Jaccl, n, a, complex_less), a);
        assert_eq!(max_by(Semantics::Ring, a, n, complex_less), a);
        assert!(max_by(Semantics::Jaccl, a, n, complex_less).0.is_nan());
    }

    #[test]
    fn bools_or_and() {
        assert_eq!(bool_or(0, 5), 1);
        assert_eq!(bool_or(0, 0), 0);
        assert_eq!(bool_and(3, 1), 1);
        assert_eq!(bool_and(1, 0), 0);
        assert_eq!(bool_and(0x80, 0x02), 1);
    }
}
