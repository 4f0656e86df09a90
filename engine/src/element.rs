//! The element types a collective can carry: MLX's 14 dtypes.
//!
//! Collectives work on bytes underneath (the [`Communicator`](crate::Communicator) trait);
//! [`Element`] is how a typed slice becomes those bytes without a copy. The views come from
//! `zerocopy`, so no transmute is written here. `bool` is the one type that cannot be viewed
//! mutably as bytes (a peer could send a 2, which is not a valid `bool`), so received `bool`s
//! go through a byte buffer that is normalised to 0/1.

use std::cell::RefCell;

use half::{bf16, f16};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::error::Result;

/// MLX's element types, with the byte width each has on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, strum::Display, strum::IntoStaticStr)]
#[strum(serialize_all = "lowercase")]
#[non_exhaustive]
pub enum DType {
    /// `bool`: one byte, 0 or 1.
    Bool,
    /// `u8`.
    #[strum(serialize = "uint8")]
    U8,
    /// `u16`.
    #[strum(serialize = "uint16")]
    U16,
    /// `u32`.
    #[strum(serialize = "uint32")]
    U32,
    /// `u64`.
    #[strum(serialize = "uint64")]
    U64,
    /// `i8`.
    #[strum(serialize = "int8")]
    I8,
    /// `i16`.
    #[strum(serialize = "int16")]
    I16,
    /// `i32`.
    #[strum(serialize = "int32")]
    I32,
    /// `i64`.
    #[strum(serialize = "int64")]
    I64,
    /// IEEE half precision.
    #[strum(serialize = "float16")]
    F16,
    /// bfloat16.
    #[strum(serialize = "bfloat16")]
    BF16,
    /// `f32`.
    #[strum(serialize = "float32")]
    F32,
    /// `f64`.
    #[strum(serialize = "float64")]
    F64,
    /// Two `f32`, real part first.
    Complex64,
}

impl DType {
    /// Every dtype, in MLX's order.
    pub const ALL: [DType; 14] = [
        DType::Bool,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::Complex64,
    ];

    /// Bytes per element: the wire width the reduction kernels use for the same type.
    pub const fn size(self) -> usize {
        self.simd_elem().size()
    }

    /// `ffi::simd`'s name for the dtype.
    pub(crate) const fn simd_elem(self) -> ffi::simd::Elem {
        use ffi::simd::Elem;
        match self {
            DType::Bool => Elem::Bool,
            DType::U8 => Elem::U8,
            DType::U16 => Elem::U16,
            DType::U32 => Elem::U32,
            DType::U64 => Elem::U64,
            DType::I8 => Elem::I8,
            DType::I16 => Elem::I16,
            DType::I32 => Elem::I32,
            DType::I64 => Elem::I64,
            DType::F16 => Elem::F16,
            DType::BF16 => Elem::BF16,
            DType::F32 => Elem::F32,
            DType::F64 => Elem::F64,
            DType::Complex64 => Elem::Complex64,
        }
    }

    /// MLX's name for the dtype (`mx.float32` is `"float32"`).
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// MLX's `complex64`: two `f32`, real part first, as on the wire.
///
/// Sums add each part; `max` and `min` order lexicographically (real part first), as MLX does.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct Complex64 {
    /// The real part.
    pub re: f32,
    /// The imaginary part.
    pub im: f32,
}

impl Complex64 {
    /// A complex number from its parts.
    pub const fn new(re: f32, im: f32) -> Self {
        Self { re, im }
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A type a collective can carry: one of MLX's 14 dtypes.
///
/// Implemented for `bool`, `u8`..`u64`, `i8`..`i64`, [`struct@f16`], [`struct@bf16`], `f32`, `f64` and
/// [`Complex64`]; sealed, because the wire format is fixed by MLX.
pub trait Element: sealed::Sealed + Copy + Send + Sync + 'static {
    /// The dtype of this type.
    const DTYPE: DType;

    /// The slice's bytes, as they go on the wire.
    #[doc(hidden)]
    fn as_wire(data: &[Self]) -> &[u8];

    /// Runs `f` on the slice's bytes, writable, and makes what `f` wrote visible in `data`.
    #[doc(hidden)]
    fn with_wire_mut<R>(data: &mut [Self], f: impl FnOnce(&mut [u8]) -> Result<R>) -> Result<R>;
}

macro_rules! plain_element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            #[inline]
            fn as_wire(data: &[Self]) -> &[u8] {
                data.as_bytes()
            }
            #[inline]
            fn with_wire_mut<R>(
                data: &mut [Self],
                f: impl FnOnce(&mut [u8]) -> Result<R>,
            ) -> Result<R> {
                f(data.as_mut_bytes())
            }
        }
    )*};
}

plain_element! {
    u8 => U8, u16 => U16, u32 => U32, u64 => U64,
    i8 => I8, i16 => I16, i32 => I32, i64 => I64,
    f16 => F16, bf16 => BF16, f32 => F32, f64 => F64,
    Complex64 => Complex64,
}

thread_local! {
    /// Scratch for `bool` data: reused, so a steady stream of `bool` collectives does not
    /// allocate.
    static BOOL_SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl sealed::Sealed for bool {}
impl Element for bool {
    const DTYPE: DType = DType::Bool;

    #[inline]
    fn as_wire(data: &[Self]) -> &[u8] {
        data.as_bytes()
    }

    fn with_wire_mut<R>(data: &mut [Self], f: impl FnOnce(&mut [u8]) -> Result<R>) -> Result<R> {
        // A `&mut [bool]` cannot be handed out as `&mut [u8]`: a peer may send any byte.
        // Copy through scratch and map every non-zero byte to `true`, as a C++ `bool` read
        // of that byte would be taken.
        let mut scratch = BOOL_SCRATCH.with(|s| s.take());
        scratch.clear();
        scratch.extend(data.iter().map(|&b| u8::from(b)));
        let result = f(&mut scratch);
        for (d, &s) in data.iter_mut().zip(scratch.iter()) {
            *d = s != 0;
        }
        BOOL_SCRATCH.with(|s| s.replace(scratch));
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_rust_types() {
        assert_eq!(DType::Bool.size(), size_of::<bool>());
        assert_eq!(DType::F16.size(), size_of::<f16>());
        assert_eq!(DType::BF16.size(), size_of::<bf16>());
        assert_eq!(DType::Complex64.size(), size_of::<Complex64>());
        assert_eq!(DType::I64.size(), size_of::<i64>());
    }

    #[test]
    fn bools_written_as_bytes_are_normalised() {
        let mut v = [false, true, false];
        bool::with_wire_mut(&mut v, |b| {
            assert_eq!(b, &[0, 1, 0]);
            b.copy_from_slice(&[7, 0, 1]);
            Ok(())
        })
        .unwrap();
        assert_eq!(v, [true, false, true]);
    }
}
