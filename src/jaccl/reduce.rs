//! JACCL's reductions: `out = op(out, in)` with MLX's JACCL semantics, which differ from the
//! ring's for `max` and `min` of floating-point values.
//!
//! JACCL (`jaccl/reduction_ops.h`) computes `out = (out > in) ? out : in` for max and
//! `out = (out < in) ? out : in` for min. The comparison is false when either side is NaN, and
//! when the two are equal, so the *incoming* value wins in both cases: a NaN arriving from a
//! peer replaces the accumulator, a NaN already accumulated is replaced, and of `-0.0` and
//! `+0.0` the incoming one is kept. The ring (`std::max`) does the opposite. Complex numbers
//! compare lexicographically (real part first) in both.
//!
//! Sums, integers and `bool` behave the same in both backends, so those cases use the
//! crate's kernels ([`reduce_into`]): integers wrap, `bool` sum and max are OR and min is AND,
//! `f16` and `bf16` are added in `f32` and rounded once. (On Macs with native `bf16`
//! arithmetic MLX's JACCL keeps a NaN's payload where the software path, and this crate,
//! produce `0x7FC0`; NaN payloads aside the sums are identical.)

use half::{bf16, f16};

use crate::element::{Complex64, DType};
use crate::reduce::{ReduceOp, apply, reduce_into};

/// Folds `incoming` into `acc` element by element with JACCL's semantics.
pub(crate) fn combine(op: ReduceOp, dtype: DType, acc: &mut [u8], incoming: &[u8]) {
    use ReduceOp::{Max, Min, Sum};
    match (dtype, op) {
        (_, Sum)
        | (
            DType::Bool
            | DType::U8
            | DType::U16
            | DType::U32
            | DType::U64
            | DType::I8
            | DType::I16
            | DType::I32
            | DType::I64,
            _,
        ) => reduce_into(op, dtype, acc, incoming),
        (DType::F16, Max) => apply::<f16>(acc, incoming, max),
        (DType::F16, Min) => apply::<f16>(acc, incoming, min),
        (DType::BF16, Max) => apply::<bf16>(acc, incoming, max),
        (DType::BF16, Min) => apply::<bf16>(acc, incoming, min),
        (DType::F32, Max) => apply::<f32>(acc, incoming, max),
        (DType::F32, Min) => apply::<f32>(acc, incoming, min),
        (DType::F64, Max) => apply::<f64>(acc, incoming, max),
        (DType::F64, Min) => apply::<f64>(acc, incoming, min),
        (DType::Complex64, Max) => apply::<Complex64>(acc, incoming, complex_max),
        (DType::Complex64, Min) => apply::<Complex64>(acc, incoming, complex_min),
    }
}

/// `(out > in) ? out : in`.
#[inline]
pub(crate) fn max<T: PartialOrd>(out: T, inc: T) -> T {
    if out > inc { out } else { inc }
}

/// `(out < in) ? out : in`.
#[inline]
pub(crate) fn min<T: PartialOrd>(out: T, inc: T) -> T {
    if out < inc { out } else { inc }
}

/// JACCL's complex `a > b`: real part first, then imaginary.
#[inline]
fn complex_gt(a: Complex64, b: Complex64) -> bool {
    a.re > b.re || (a.re == b.re && a.im > b.im)
}

/// JACCL's complex `a < b`.
#[inline]
fn complex_lt(a: Complex64, b: Complex64) -> bool {
    a.re < b.re || (a.re == b.re && a.im < b.im)
}

#[inline]
pub(crate) fn complex_max(out: Complex64, inc: Complex64) -> Complex64 {
    if complex_gt(out, inc) { out } else { inc }
}

#[inline]
pub(crate) fn complex_min(out: Complex64, inc: Complex64) -> Complex64 {
    if complex_lt(out, inc) { out } else { inc }
}

#[cfg(test)]
mod tests {
    use zerocopy::IntoBytes;

    use super::*;

    fn f32s(op: ReduceOp, acc: f32, inc: f32) -> f32 {
        let mut a = [acc];
        combine(op, DType::F32, a.as_mut_bytes(), [inc].as_bytes());
        a[0]
    }

    #[test]
    fn a_nan_on_either_side_lets_the_incoming_value_win() {
        use ReduceOp::{Max, Min};
        assert_eq!(f32s(Max, f32::NAN, 1.0), 1.0);
        assert!(f32s(Max, 1.0, f32::NAN).is_nan());
        assert_eq!(f32s(Min, f32::NAN, 1.0), 1.0);
        assert!(f32s(Min, 1.0, f32::NAN).is_nan());
        // The ring keeps the accumulator in both cases.
        let mut ring = [1.0f32];
        reduce_into(Max, DType::F32, ring.as_mut_bytes(), [f32::NAN].as_bytes());
        assert_eq!(ring[0], 1.0);
    }

    #[test]
    fn equal_values_keep_the_incoming_one() {
        assert!(f32s(ReduceOp::Max, 0.0, -0.0).is_sign_negative());
        assert!(f32s(ReduceOp::Min, -0.0, 0.0).is_sign_positive());
        assert_eq!(f32s(ReduceOp::Max, 2.0, 3.0), 3.0);
        assert_eq!(f32s(ReduceOp::Min, 2.0, 3.0), 2.0);
    }

    #[test]
    fn halves_doubles_and_complexes_follow_the_same_rule() {
        let mut h = [f16::NAN, f16::from_f32(1.0)];
        let inc = [f16::from_f32(2.0), f16::NAN];
        combine(ReduceOp::Max, DType::F16, h.as_mut_bytes(), inc.as_bytes());
        assert_eq!(h[0], f16::from_f32(2.0));
        assert!(h[1].is_nan());
        let mut b = [bf16::from_f32(5.0)];
        combine(
            ReduceOp::Min,
            DType::BF16,
            b.as_mut_bytes(),
            [bf16::from_f32(4.0)].as_bytes(),
        );
        assert_eq!(b[0].to_f32(), 4.0);
        let mut d = [f64::NAN];
        combine(
            ReduceOp::Min,
            DType::F64,
            d.as_mut_bytes(),
            [3.0f64].as_bytes(),
        );
        assert_eq!(d[0], 3.0);
        let a = Complex64::new(1.0, 5.0);
        let c = Complex64::new(1.0, 6.0);
        assert_eq!(complex_max(a, c), c);
        assert_eq!(complex_min(a, c), a);
        assert_eq!(complex_max(a, a), a);
        let n = Complex64::new(f32::NAN, 0.0);
        assert_eq!(complex_max(n, a), a);
        assert!(complex_max(a, n).re.is_nan());
    }

    #[test]
    fn sums_integers_and_bools_are_the_rings() {
        let mut x = [250u8, 1];
        combine(ReduceOp::Sum, DType::U8, &mut x, &[10, 0]);
        assert_eq!(x, [4, 1]);
        let mut b = [0u8, 1, 1];
        combine(ReduceOp::Min, DType::Bool, &mut b, &[1, 1, 0]);
        assert_eq!(b, [0, 1, 0]);
        let mut i = [-3i32];
        combine(
            ReduceOp::Max,
            DType::I32,
            i.as_mut_bytes(),
            [7i32].as_bytes(),
        );
        assert_eq!(i, [7]);
    }
}
