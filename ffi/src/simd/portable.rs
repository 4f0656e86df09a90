//! The plain element loops, written once and inlined into each level's entry point.
//!
//! Everything here is `#[inline(always)]` so that it is compiled inside a function carrying
//! that level's `#[target_feature]`s, where the compiler vectorises each loop with the
//! level's registers. Each closure is the scalar definition of the root crate's
//! `src/reduce/scalar.rs`, spelled on native-endian bytes.

use super::{Elem, Op};

/// `acc[i] = f(acc[i], inc[i])` over the whole `N`-byte elements both slices have.
#[inline(always)]
fn zip_with<const N: usize>(acc: &mut [u8], inc: &[u8], f: impl Fn([u8; N], [u8; N]) -> [u8; N]) {
    let (acc, _) = acc.as_chunks_mut::<N>();
    let (inc, _) = inc.as_chunks::<N>();
    for (a, b) in acc.iter_mut().zip(inc) {
        *a = f(*a, *b);
    }
}

/// `std::max`: `inc` replaces `acc` only if `acc < inc`.
#[inline(always)]
fn max<T: PartialOrd>(acc: T, inc: T) -> T {
    if acc < inc { inc } else { acc }
}

/// `std::min`: `inc` replaces `acc` only if `inc < acc`.
#[inline(always)]
fn min<T: PartialOrd>(acc: T, inc: T) -> T {
    if inc < acc { inc } else { acc }
}

/// A `bfloat16` widened to `f32`: exact, it is the top half of an `f32`.
#[inline(always)]
fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// MLX's software `bfloat16` rounding: NaN is `0x7FC0`, everything else rounds to nearest,
/// ties to even (the carry out of the mantissa is the overflow to infinity).
#[inline(always)]
pub(super) fn bf16_round(sum: f32) -> u16 {
    let bits = sum.to_bits();
    let rounded = (bits.wrapping_add(0x7FFF + ((bits >> 16) & 1)) >> 16) as u16;
    if sum.is_nan() { 0x7FC0 } else { rounded }
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

/// Sum (wrapping), max and min of an integer type.
macro_rules! integer {
    ($t:ty, $op:expr, $acc:expr, $inc:expr) => {
        match $op {
            Op::Sum => typed!($t, $acc, $inc, <$t>::wrapping_add),
            Op::Max => typed!($t, $acc, $inc, max::<$t>),
            Op::Min => typed!($t, $acc, $inc, min::<$t>),
        }
    };
}

/// Sum, max and min of a float type.
macro_rules! float {
    ($t:ty, $op:expr, $acc:expr, $inc:expr) => {
        match $op {
            Op::Sum => typed!($t, $acc, $inc, |a, b| a + b),
            Op::Max => typed!($t, $acc, $inc, max::<$t>),
            Op::Min => typed!($t, $acc, $inc, min::<$t>),
        }
    };
}

/// Runs the plain loop for `(op, elem)`; returns `false`, touching nothing, for the pairs
/// that have none: `f16` (whose conversions need intrinsics) and complex max and min.
#[inline(always)]
pub(super) fn reduce(op: Op, elem: Elem, acc: &mut [u8], inc: &[u8]) -> bool {
    match elem {
        Elem::Bool => match op {
            Op::Sum | Op::Max => typed!(u8, acc, inc, |a, b| u8::from((a | b) != 0)),
            Op::Min => typed!(u8, acc, inc, |a, b| u8::from(a != 0) & u8::from(b != 0)),
        },
        Elem::U8 => integer!(u8, op, acc, inc),
        Elem::U16 => integer!(u16, op, acc, inc),
        Elem::U32 => integer!(u32, op, acc, inc),
        Elem::U64 => integer!(u64, op, acc, inc),
        Elem::I8 => integer!(i8, op, acc, inc),
        Elem::I16 => integer!(i16, op, acc, inc),
        Elem::I32 => integer!(i32, op, acc, inc),
        Elem::I64 => integer!(i64, op, acc, inc),
        Elem::F32 => float!(f32, op, acc, inc),
        Elem::F64 => float!(f64, op, acc, inc),
        Elem::BF16 => match op {
            Op::Sum => typed!(u16, acc, inc, |a, b| bf16_round(
                bf16_to_f32(a) + bf16_to_f32(b)
            )),
            Op::Max => typed!(u16, acc, inc, |a, b| if bf16_to_f32(a) < bf16_to_f32(b) {
                b
            } else {
                a
            }),
            Op::Min => typed!(u16, acc, inc, |a, b| if bf16_to_f32(b) < bf16_to_f32(a) {
                b
            } else {
                a
            }),
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
