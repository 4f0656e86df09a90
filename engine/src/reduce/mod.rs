//! Element-wise reductions on wire bytes: `acc = op(acc, incoming)` for every dtype.
//!
//! The ring lands a peer's bytes in a staging buffer and calls [`reduce_into`] to fold them
//! into the caller's array; JACCL calls [`reduce_with`] with [`Semantics::Jaccl`], the same
//! dispatcher with MLX's JACCL rule for float `max`/`min` (the incoming value wins when the
//! comparison decides nothing, where the ring keeps the accumulator). The rules are written
//! once, in `ffi::simd::portable`, which [`scalar`] wraps with this crate's types; the SIMD
//! kernels of `ffi::simd` compute the same bytes faster where the CPU has them, and
//! [`reduce_scalar_with`] is the portable path used wherever they do not.
//!
//! JACCL's sums are the ring's: on Macs with native `bf16` arithmetic MLX's JACCL keeps a NaN
//! sum's payload where its software path, and this crate, produce `0x7FC0`; NaN payloads
//! aside the sums are identical.

use half::{bf16, f16};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::element::{Complex64, DType};
use crate::error::Error;

#[cfg(test)]
mod kernel_tests;
pub(crate) mod scalar;

pub(crate) use scalar::Semantics;

/// A reduction: what `all_sum`, `all_max` and `all_min` compute, named `"sum"`, `"max"` and
/// `"min"` (its [`Display`](std::fmt::Display) and [`FromStr`](std::str::FromStr)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, strum::Display, strum::EnumString)]
#[strum(serialize_all = "lowercase", parse_err_ty = Error, parse_err_fn = unknown_reduction)]
pub enum ReduceOp {
    /// Element-wise sum.
    Sum,
    /// Element-wise maximum.
    Max,
    /// Element-wise minimum.
    Min,
}

impl ReduceOp {
    /// Every operation.
    pub const ALL: [ReduceOp; 3] = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min];

    /// The collective's name: `"all_sum"`, `"all_max"`, `"all_min"`.
    pub fn collective(self) -> &'static str {
        self.phase().name()
    }

    /// The collective as a [`Phase`](crate::Phase), for errors.
    pub(crate) const fn phase(self) -> crate::error::Phase {
        match self {
            ReduceOp::Sum => crate::error::Phase::AllSum,
            ReduceOp::Max => crate::error::Phase::AllMax,
            ReduceOp::Min => crate::error::Phase::AllMin,
        }
    }
}

fn unknown_reduction(name: &str) -> Error {
    Error::invalid(format!(
        "unknown reduction {name:?}: expected \"sum\", \"max\" or \"min\""
    ))
}

/// Folds `incoming` into `acc` element by element with MLX's ring semantics:
/// [`reduce_with`] with [`Semantics::Ring`].
pub(crate) fn reduce_into(op: ReduceOp, dtype: DType, acc: &mut [u8], incoming: &[u8]) {
    reduce_with(Semantics::Ring, op, dtype, acc, incoming);
}

/// Folds `incoming` into `acc` element by element: `acc[i] = op(acc[i], incoming[i])`, with
/// `semantics` deciding float `max`/`min` when the comparison decides nothing.
///
/// Both slices hold whole elements of `dtype`; a trailing partial element (which callers
/// never pass) is left alone rather than read out of bounds. Runs the SIMD kernel of the
/// [active level](simd_level) where it has one, else [`reduce_scalar_with`].
pub(crate) fn reduce_with(
    semantics: Semantics,
    op: ReduceOp,
    dtype: DType,
    acc: &mut [u8],
    incoming: &[u8],
) {
    let level = ffi::simd::active();
    if !ffi::simd::reduce(
        level,
        semantics,
        simd_op(op),
        dtype.simd_elem(),
        acc,
        incoming,
    ) {
        reduce_scalar_with(semantics, op, dtype, acc, incoming);
    }
}

/// The name of the SIMD level reductions use: `"avx512"`, `"avx2"`, `"neon"` or `"scalar"`.
///
/// It is the best level the CPU supports, lowered by `NUVEC_DISTRIBUTED_SIMD` (read once,
/// at the first reduction or call of this function). Every level gives the same bytes;
/// this is for diagnostics and benchmarks.
pub fn simd_level() -> &'static str {
    ffi::simd::active().name()
}

/// `ffi::simd`'s name for a reduction.
pub(crate) const fn simd_op(op: ReduceOp) -> ffi::simd::Op {
    match op {
        ReduceOp::Sum => ffi::simd::Op::Sum,
        ReduceOp::Max => ffi::simd::Op::Max,
        ReduceOp::Min => ffi::simd::Op::Min,
    }
}

/// `acc[i] = op(acc[i], incoming[i])` without SIMD, with MLX's ring semantics: the scalar
/// definition, element by element, and the oracle of the SIMD kernels.
pub fn reduce_scalar(op: ReduceOp, dtype: DType, acc: &mut [u8], incoming: &[u8]) {
    reduce_scalar_with(Semantics::Ring, op, dtype, acc, incoming);
}

/// [`reduce_scalar`] with either [`Semantics`]: the fallback of [`reduce_with`] and the oracle
/// its kernels are tested against. Integer, `bool` and sum reductions ignore `semantics`.
pub(crate) fn reduce_scalar_with(
    semantics: Semantics,
    op: ReduceOp,
    dtype: DType,
    acc: &mut [u8],
    incoming: &[u8],
) {
    use ReduceOp::{Max, Min, Sum};
    let s = semantics;
    match (dtype, op) {
        (DType::Bool, Sum | Max) => apply::<u8>(acc, incoming, scalar::bool_or),
        (DType::Bool, Min) => apply::<u8>(acc, incoming, scalar::bool_and),
        (DType::U8, _) => integer::<u8>(op, acc, incoming),
        (DType::U16, _) => integer::<u16>(op, acc, incoming),
        (DType::U32, _) => integer::<u32>(op, acc, incoming),
        (DType::U64, _) => integer::<u64>(op, acc, incoming),
        (DType::I8, _) => integer::<i8>(op, acc, incoming),
        (DType::I16, _) => integer::<i16>(op, acc, incoming),
        (DType::I32, _) => integer::<i32>(op, acc, incoming),
        (DType::I64, _) => integer::<i64>(op, acc, incoming),
        (DType::F16, Sum) => apply::<f16>(acc, incoming, scalar::f16_sum),
        (DType::F16, Max) => apply::<f16>(acc, incoming, |a, b| scalar::max(s, a, b)),
        (DType::F16, Min) => apply::<f16>(acc, incoming, |a, b| scalar::min(s, a, b)),
        (DType::BF16, Sum) => apply::<bf16>(acc, incoming, scalar::bf16_sum),
        (DType::BF16, Max) => apply::<bf16>(acc, incoming, |a, b| scalar::bf16_max(s, a, b)),
        (DType::BF16, Min) => apply::<bf16>(acc, incoming, |a, b| scalar::bf16_min(s, a, b)),
        (DType::F32, Sum) => apply::<f32>(acc, incoming, |a, b| a + b),
        (DType::F32, Max) => apply::<f32>(acc, incoming, |a, b| scalar::max(s, a, b)),
        (DType::F32, Min) => apply::<f32>(acc, incoming, |a, b| scalar::min(s, a, b)),
        (DType::F64, Sum) => apply::<f64>(acc, incoming, |a, b| a + b),
        (DType::F64, Max) => apply::<f64>(acc, incoming, |a, b| scalar::max(s, a, b)),
        (DType::F64, Min) => apply::<f64>(acc, incoming, |a, b| scalar::min(s, a, b)),
        (DType::Complex64, Sum) => apply::<Complex64>(acc, incoming, scalar::complex_sum),
        (DType::Complex64, Max) => {
            apply::<Complex64>(acc, incoming, |a, b| scalar::complex_max(s, a, b))
        }
        (DType::Complex64, Min) => {
            apply::<Complex64>(acc, incoming, |a, b| scalar::complex_min(s, a, b))
        }
    }
}

/// Integer types: wrapping sum, ordinary max and min (the same bits under either
/// [`Semantics`], so the ring's serves).
trait WrappingInt: Copy + PartialOrd + FromBytes + IntoBytes + KnownLayout + Immutable {
    fn wrapping_sum(self, other: Self) -> Self;
}

macro_rules! wrapping_int {
    ($($t:ty),*) => {$(
        impl WrappingInt for $t {
            #[inline]
            fn wrapping_sum(self, other: Self) -> Self {
                self.wrapping_add(other)
            }
        }
    )*};
}
wrapping_int!(u8, u16, u32, u64, i8, i16, i32, i64);

fn integer<T: WrappingInt>(op: ReduceOp, acc: &mut [u8], incoming: &[u8]) {
    match op {
        ReduceOp::Sum => apply::<T>(acc, incoming, T::wrapping_sum),
        ReduceOp::Max => apply::<T>(acc, incoming, |a, b| scalar::max(Semantics::Ring, a, b)),
        ReduceOp::Min => apply::<T>(acc, incoming, |a, b| scalar::min(Semantics::Ring, a, b)),
    }
}

/// Applies `f` element by element over typed views of the two byte slices.
///
/// Staging buffers are page-aligned and the caller's arrays are aligned for their type, so
/// the typed view succeeds in practice; a misaligned slice (possible only through the
/// byte-level [`Communicator`](crate::Communicator) API) takes an unaligned copy per
/// element instead of failing.
#[inline]
fn apply<T>(acc: &mut [u8], incoming: &[u8], f: impl Fn(T, T) -> T)
where
    T: Copy + FromBytes + IntoBytes + KnownLayout + Immutable,
{
    let size = size_of::<T>();
    let whole = acc.len().min(incoming.len()) / size * size;
    let (acc, incoming) = (&mut acc[..whole], &incoming[..whole]);
    match (<[T]>::mut_from_bytes(acc), <[T]>::ref_from_bytes(incoming)) {
        (Ok(acc), Ok(incoming)) => {
            for (a, &b) in acc.iter_mut().zip(incoming) {
                *a = f(*a, b);
            }
        }
        _ => {
            for (a, b) in acc.chunks_exact_mut(size).zip(incoming.chunks_exact(size)) {
                if let (Ok(x), Ok(y)) = (T::read_from_bytes(a), T::read_from_bytes(b)) {
                    // Both chunks are exactly `size` bytes, so neither read nor write fails.
                    let _ = f(x, y).write_to(a);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_sums_wrap() {
        let mut acc = 250u8.to_ne_bytes().to_vec();
        reduce_into(ReduceOp::Sum, DType::U8, &mut acc, &10u8.to_ne_bytes());
        assert_eq!(acc, [4]);
        let mut acc = i16::MAX.to_ne_bytes().to_vec();
        reduce_into(ReduceOp::Sum, DType::I16, &mut acc, &1i16.to_ne_bytes());
        assert_eq!(i16::from_ne_bytes([acc[0], acc[1]]), i16::MIN);
    }

    #[test]
    fn misaligned_bytes_reduce_like_aligned_ones() {
        let a: Vec<f32> = (0..9).map(|i| i as f32 * 1.5).collect();
        let b: Vec<f32> = (0..9).map(|i| 10.0 - i as f32).collect();
        let mut buf = [0u8; 1 + 36];
        buf[1..].copy_from_slice(a.as_bytes());
        let mut inc = [0u8; 1 + 36];
        inc[1..].copy_from_slice(b.as_bytes());
        reduce_into(ReduceOp::Max, DType::F32, &mut buf[1..], &inc[1..]);
        let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x.max(*y)).collect();
        assert_eq!(&buf[1..], want.as_bytes());
    }

    /// JACCL's rule through the dispatcher, at the active level (`NUVEC_DISTRIBUTED_SIMD`
    /// picks it); the kernel tests compare every level with the scalar oracle.
    fn jaccl_f32(op: ReduceOp, acc: f32, inc: f32) -> f32 {
        let mut a = [acc; 37];
        reduce_with(
            Semantics::Jaccl,
            op,
            DType::F32,
            a.as_mut_bytes(),
            [inc; 37].as_bytes(),
        );
        assert!(a.iter().all(|x| x.to_bits() == a[0].to_bits()), "{a:?}");
        a[0]
    }

    #[test]
    fn with_jaccl_a_nan_on_either_side_lets_the_incoming_value_win() {
        use ReduceOp::{Max, Min};
        for op in [Max, Min] {
            assert_eq!(jaccl_f32(op, f32::NAN, 1.0), 1.0, "{op}");
            assert!(jaccl_f32(op, 1.0, f32::NAN).is_nan(), "{op}");
        }
        // The ring keeps the accumulator in both cases.
        let mut ring = [1.0f32];
        reduce_into(Max, DType::F32, ring.as_mut_bytes(), [f32::NAN].as_bytes());
        assert_eq!(ring[0], 1.0);
    }

    #[test]
    fn with_jaccl_equal_values_keep_the_incoming_one() {
        assert!(jaccl_f32(ReduceOp::Max, 0.0, -0.0).is_sign_negative());
        assert!(jaccl_f32(ReduceOp::Min, -0.0, 0.0).is_sign_positive());
        assert_eq!(jaccl_f32(ReduceOp::Max, 2.0, 3.0), 3.0);
        assert_eq!(jaccl_f32(ReduceOp::Min, 2.0, 3.0), 2.0);
    }

    #[test]
    fn with_jaccl_halves_doubles_and_complexes_follow_the_same_rule() {
        let with = |op, dtype, acc: &mut [u8], inc: &[u8]| {
            reduce_with(Semantics::Jaccl, op, dtype, acc, inc);
        };
        let mut h = [f16::NAN, f16::from_f32(1.0)];
        let inc = [f16::from_f32(2.0), f16::NAN];
        with(ReduceOp::Max, DType::F16, h.as_mut_bytes(), inc.as_bytes());
        assert_eq!(h[0], f16::from_f32(2.0));
        assert!(h[1].is_nan());
        let mut b = [bf16::from_f32(5.0), bf16::NAN];
        let inc = [bf16::from_f32(4.0), bf16::from_f32(4.0)];
        with(ReduceOp::Min, DType::BF16, b.as_mut_bytes(), inc.as_bytes());
        assert_eq!((b[0].to_f32(), b[1].to_f32()), (4.0, 4.0));
        let mut d = [f64::NAN];
        with(
            ReduceOp::Min,
            DType::F64,
            d.as_mut_bytes(),
            [3.0f64].as_bytes(),
        );
        assert_eq!(d[0], 3.0);
        let a = Complex64::new(1.0, 5.0);
        let n = Complex64::new(f32::NAN, 0.0);
        let mut c = [n, a];
        with(
            ReduceOp::Max,
            DType::Complex64,
            c.as_mut_bytes(),
            [a, n].as_bytes(),
        );
        assert_eq!(c[0], a);
        assert!(c[1].re.is_nan());
    }

    #[test]
    fn with_jaccl_sums_integers_and_bools_are_the_rings() {
        let mut x = [250u8, 1];
        reduce_with(Semantics::Jaccl, ReduceOp::Sum, DType::U8, &mut x, &[10, 0]);
        assert_eq!(x, [4, 1]);
        let mut b = [0u8, 1, 1];
        reduce_with(
            Semantics::Jaccl,
            ReduceOp::Min,
            DType::Bool,
            &mut b,
            &[1, 1, 0],
        );
        assert_eq!(b, [0, 1, 0]);
        let mut i = [-3i32];
        let inc = [7i32];
        reduce_with(
            Semantics::Jaccl,
            ReduceOp::Max,
            DType::I32,
            i.as_mut_bytes(),
            inc.as_bytes(),
        );
        assert_eq!(i, [7]);
    }

    #[test]
    fn a_trailing_partial_element_is_left_alone() {
        let mut acc = vec![1u8, 0, 0, 0, 9];
        reduce_into(ReduceOp::Sum, DType::U32, &mut acc, &[2, 0, 0, 0, 9]);
        assert_eq!(acc, [3, 0, 0, 0, 9]);
    }

    #[test]
    fn the_simd_level_in_use_is_one_this_machine_has() {
        let level: ffi::simd::Level = simd_level().parse().unwrap();
        assert_eq!(level, ffi::simd::active());
        assert!(ffi::simd::is_available(level));
    }

    #[test]
    fn every_dtype_and_op_maps_to_the_kernel_of_the_same_width() {
        // MLX's widths, written apart from the kernels' table that DType::size reads.
        let widths = [1, 1, 2, 4, 8, 1, 2, 4, 8, 2, 2, 4, 8, 8];
        assert_eq!(widths.len(), DType::ALL.len());
        for (dtype, width) in DType::ALL.into_iter().zip(widths) {
            assert_eq!(dtype.size(), width, "{dtype}");
            let names: Vec<_> = ReduceOp::ALL.iter().map(|&op| simd_op(op)).collect();
            assert_eq!(names, ffi::simd::Op::ALL);
        }
    }
}
