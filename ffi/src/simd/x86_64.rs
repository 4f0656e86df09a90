//! The AVX2 and AVX-512 entry points, and the half-precision kernels written with intrinsics.
//!
//! `reduce_avx2` and `reduce_avx512` are compiled for their level's features and inline the
//! plain loops of [`portable`], which the compiler then vectorises with ymm or zmm registers.
//! `f16` has no plain loop (the compiler will not vectorise a software half conversion), so
//! it is converted with F16C (8 lanes) or AVX-512F (16 lanes) here; a `bfloat16` sum can use
//! AVX512-BF16's conversion. The kernels work on whole blocks of the byte slices
//! (`&[u8; N]`), which is what makes each load and store in bounds; the last partial block
//! goes through a zero-padded copy.
//!
//! `max` and `min` of floats follow [`portable::max_by`]/[`portable::min_by`]: the operand
//! kept is the accumulator (ring) or the incoming value (JACCL), and the other operand
//! replaces it only on a strict comparison. The kernels are generic over `INC_KEPT`, so each
//! semantics gets its own loop with the operand order fixed at compile time.

use std::arch::x86_64::*;

use super::{Elem, Op, Reduction, Semantics, blocks, features, order, portable, select};

/// The AVX2 level: the plain loops, and `f16` through F16C where the CPU has it.
#[target_feature(enable = "avx2")]
pub(super) fn reduce_avx2(what: Reduction, acc: &mut [u8], inc: &[u8]) -> bool {
    let (semantics, op, elem) = (what.semantics, what.op, what.elem);
    if matches!((elem, op), (Elem::F32 | Elem::F64, Op::Max | Op::Min)) {
        match semantics {
            Semantics::Ring => avx2::float_select::<false>(op, elem, acc, inc),
            Semantics::Jaccl => avx2::float_select::<true>(op, elem, acc, inc),
        }
        return true;
    }
    if matches!((elem, op), (Elem::Complex64, Op::Max | Op::Min)) {
        match semantics {
            Semantics::Ring => avx2::complex_select::<false>(op, acc, inc),
            Semantics::Jaccl => avx2::complex_select::<true>(op, acc, inc),
        }
        return true;
    }
    if elem != Elem::F16 {
        return portable::reduce(semantics, op, elem, acc, inc);
    }
    if !features().f16c {
        return false;
    }
    // SAFETY: runtime detection found F16C (checked just above) and AVX2 (this function
    // runs only where it did), the features `avx2::f16` is compiled for.
    unsafe { avx2::f16(semantics, op, acc, inc) };
    true
}

/// The AVX-512 level: the plain loops, `f16` through AVX-512F's conversions, and `bfloat16`
/// sums through AVX512-BF16 when `use_avx512bf16` and the CPU has it.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(super) fn reduce_avx512(
    use_avx512bf16: bool,
    what: Reduction,
    acc: &mut [u8],
    inc: &[u8],
) -> bool {
    let (semantics, op, elem) = (what.semantics, what.op, what.elem);
    match (elem, op, semantics) {
        (Elem::F32 | Elem::F64, Op::Max | Op::Min, Semantics::Ring) => {
            avx512::float_select::<false>(op, elem, acc, inc)
        }
        (Elem::F32 | Elem::F64, Op::Max | Op::Min, Semantics::Jaccl) => {
            avx512::float_select::<true>(op, elem, acc, inc)
        }
        (Elem::Complex64, Op::Max | Op::Min, Semantics::Ring) => {
            avx512::complex_select::<false>(op, acc, inc)
        }
        (Elem::Complex64, Op::Max | Op::Min, Semantics::Jaccl) => {
            avx512::complex_select::<true>(op, acc, inc)
        }
        (Elem::F16, _, _) => avx512::f16(semantics, op, acc, inc),
        (Elem::BF16, Op::Sum, _) if use_avx512bf16 && features().avx512bf16 => {
            // SAFETY: runtime detection found AVX512-BF16 (checked in the guard) and
            // AVX-512 F, BW and VL (this function runs only where it did), the features
            // `bf16_sum_avx512bf16` is compiled for.
            unsafe { bf16_sum_avx512bf16(acc, inc) }
        }
        _ => return portable::reduce(semantics, op, elem, acc, inc),
    }
    true
}

/// The vector types [`load`] and [`store`] move: plain bits, of which every pattern is a
/// valid value.
trait Vector: Copy {}

impl Vector for __m128i {}
impl Vector for __m256i {}
impl Vector for __m512i {}

/// A block as the vector of its size: 16, 32 or 64 bytes as `__m128i`, `__m256i` or `__m512i`
/// (`V` is inferred from the use; another size does not compile). The compiler emits the
/// unaligned vector load of the calling kernel's features, as `_mm*_loadu_*` do.
#[inline(always)]
fn load<const N: usize, V: Vector>(bytes: &[u8; N]) -> V {
    const { assert!(size_of::<V>() == N) };
    // SAFETY: `bytes` is a reference to `N` readable bytes, exactly the size of `V` (asserted
    // at compile time just above), `V` is plain vector bits that any pattern makes valid
    // (`Vector`), and `read_unaligned` has no alignment requirement.
    unsafe { bytes.as_ptr().cast::<V>().read_unaligned() }
}

/// A vector into the block of its size, as [`load`] reads it.
#[inline(always)]
fn store<const N: usize, V: Vector>(bytes: &mut [u8; N], v: V) {
    const { assert!(size_of::<V>() == N) };
    // SAFETY: `bytes` is an exclusive reference to `N` writable bytes, exactly the size of
    // `V` (asserted at compile time just above), and `write_unaligned` has no alignment
    // requirement.
    unsafe { bytes.as_mut_ptr().cast::<V>().write_unaligned(v) }
}

// `f32` and `f64` max and min use x86's own instructions. `max(other, kept)` is
// `other > kept ? other : kept` and returns its second operand, `kept`, when either is NaN or
// the two are equal: that is `portable::max` exactly. With the ring's order (kept = acc) it is
// `std::max(acc, inc)` (a NaN in acc stays, an incoming one is ignored, of two zeros acc's sign
// stays); with JACCL's (kept = inc) it is `(acc > inc) ? acc : inc`. Likewise
// `min(other, kept)` is `portable::min`. The plain loop would be vectorised too, but the compiler turns its
// `acc = acc < inc ? inc : acc` into a masked store of `inc`, and AVX2's `vmaskmovps` is
// several times slower than the scalar loop on AMD's Zen.
//
// `complex64` max and min compare lexicographically, real part first
// ([`portable::complex_less`]), and keep one operand's whole element: `other` replaces `kept`
// only where the comparison is strict. Real parts are the even `f32` lanes, imaginary parts
// the odd ones, so each element's decision is made from its two lanes' comparisons and then
// applied to both lanes.
//
// `f16` max and min are [`portable::max_by`] and [`portable::min_by`] as blends, the comparison
// done in `f32`; sums widen exactly, add in `f32` and round once.

/// `f32`/`f64` max or min over whole `$n`-byte blocks of `$size`-byte lanes: each block read as
/// floats with `$to`, and x86's max or min `$pick(other, kept)` written back with `$from`; the
/// incoming value is the kept operand if `INC_KEPT`, else the accumulator.
macro_rules! float_pass {
    ($acc:ident, $inc:ident, $n:literal, $size:literal, $to:ident, $pick:ident, $from:ident) => {
        blocks::<$n>($acc, $inc, $size, |a, b| {
            let (kept, other) = order::<INC_KEPT, _>($to(load(a)), $to(load(b)));
            store(a, $from($pick(other, kept)));
        })
    };
}

/// Defines module `$width` with the kernels AVX2 and AVX-512 write alike but for the vector
/// width: `float_select` (`f32`/`f64` max and min) and `complex_select` (`complex64` max and
/// min), compiled for `$features` on `$n`-byte blocks, and `f16` (sum, max and min), compiled
/// for `$f16_features` on `$h`-byte blocks, whose halves widen to one `$n`-byte vector of `f32`.
/// The max and min kernels keep the incoming value if `INC_KEPT`, else the accumulator. Each
/// width names its intrinsics and helpers: for `f32` and `f64` the casts from and to integer
/// vectors and the max and min; the `complex64` and `f16` orders (`less`) and blends
/// (`|kept, other, take|` is `kept` with `other` in the lanes `take` marks); the `f16` sum.
macro_rules! width_kernels {
    ($(
        $width:ident: $features:literal, $n:literal bytes, $f16_features:literal, $h:literal bytes;
        f32: $to_ps:ident, $max_ps:ident, $min_ps:ident, $from_ps:ident;
        f64: $to_pd:ident, $max_pd:ident, $min_pd:ident, $from_pd:ident;
        complex64: $complex_less:ident, $complex_blend:expr;
        f16: $f16_sum:ident, $f16_less:ident, $f16_blend:expr;
    )*) => {$(
        mod $width {
            use super::*;

            #[target_feature(enable = $features)]
            pub(super) fn float_select<const INC_KEPT: bool>(
                op: Op,
                elem: Elem,
                acc: &mut [u8],
                inc: &[u8],
            ) {
                match (elem, op) {
                    (Elem::F32, Op::Max) => float_pass!(acc, inc, $n, 4, $to_ps, $max_ps, $from_ps),
                    (Elem::F32, Op::Min) => float_pass!(acc, inc, $n, 4, $to_ps, $min_ps, $from_ps),
                    (Elem::F64, Op::Max) => float_pass!(acc, inc, $n, 8, $to_pd, $max_pd, $from_pd),
                    (Elem::F64, Op::Min) => float_pass!(acc, inc, $n, 8, $to_pd, $min_pd, $from_pd),
                    _ => unreachable!("float_select is called for f32 and f64 max and min only"),
                }
            }

            #[target_feature(enable = $features)]
            pub(super) fn complex_select<const INC_KEPT: bool>(op: Op, acc: &mut [u8], inc: &[u8]) {
                let blend = |a: &mut [u8; $n], kept, other, take| {
                    store(a, $from_ps(($complex_blend)(kept, other, take)))
                };
                let less = |x, y| $complex_less(x, y);
                select::<INC_KEPT, $n, _, _>(op, 8, acc, inc, |a| $to_ps(load(a)), less, blend);
            }

            #[target_feature(enable = $f16_features)]
            pub(super) fn f16(semantics: Semantics, op: Op, acc: &mut [u8], inc: &[u8]) {
                let halves = |a: &[u8; $h]| load(a);
                let less = |x, y| $f16_less(x, y);
                let blend = |a: &mut [u8; $h], kept, other, take| {
                    store(a, ($f16_blend)(kept, other, take))
                };
                let sum = |a: &mut [u8; $h], b: &[u8; $h]| store(a, $f16_sum(load(a), load(b)));
                match (op, semantics) {
                    (Op::Sum, _) => blocks::<$h>(acc, inc, 2, sum),
                    (_, Semantics::Ring) => {
                        select::<false, $h, _, _>(op, 2, acc, inc, halves, less, blend)
                    }
                    (_, Semantics::Jaccl) => {
                        select::<true, $h, _, _>(op, 2, acc, inc, halves, less, blend)
                    }
                }
            }
        }
    )*};
}

width_kernels! {
    avx2: "avx2", 32 bytes, "avx2,f16c", 16 bytes;
    f32: _mm256_castsi256_ps, _mm256_max_ps, _mm256_min_ps, _mm256_castps_si256;
    f64: _mm256_castsi256_pd, _mm256_max_pd, _mm256_min_pd, _mm256_castpd_si256;
    complex64: complex_less4, |kept, other, take| _mm256_blendv_ps(kept, other, take);
    f16: f16_sum8, f16_less8, |kept, other, take| _mm_blendv_epi8(kept, other, take);

    avx512: "avx512f", 64 bytes, "avx512f,avx512bw,avx512vl", 32 bytes;
    f32: _mm512_castsi512_ps, _mm512_max_ps, _mm512_min_ps, _mm512_castps_si512;
    f64: _mm512_castsi512_pd, _mm512_max_pd, _mm512_min_pd, _mm512_castpd_si512;
    complex64: complex_less8, |kept, other, take| _mm512_mask_blend_ps(take, kept, other);
    f16: f16_sum16, f16_less16, |kept, other, take| _mm256_mask_blend_epi16(take, kept, other);
}

/// All ones over the whole elements (both lanes) where `x < y` in MLX's complex order.
#[target_feature(enable = "avx")]
#[inline]
fn complex_less4(x: __m256, y: __m256) -> __m256 {
    let less = _mm256_cmp_ps::<_CMP_LT_OQ>(x, y);
    let equal = _mm256_cmp_ps::<_CMP_EQ_OQ>(x, y);
    // MOVSLDUP copies each even (real) lane over the odd one after it, MOVSHDUP each odd
    // (imaginary) lane over the even one before it.
    let real_less = _mm256_moveldup_ps(less);
    let real_equal = _mm256_moveldup_ps(equal);
    let imag_less = _mm256_movehdup_ps(less);
    _mm256_or_ps(real_less, _mm256_and_ps(real_equal, imag_less))
}

/// The lanes of the whole elements where `x < y` in MLX's complex order, as a mask.
#[target_feature(enable = "avx512f")]
#[inline]
fn complex_less8(x: __m512, y: __m512) -> __mmask16 {
    let less = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, y);
    let equal = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(x, y);
    // Bit 2k is element k's real lane, bit 2k + 1 its imaginary one: decide on the even
    // bits, then copy each decision to the odd bit above it.
    let take = (less | (equal & (less >> 1))) & 0x5555;
    take | (take << 1)
}

/// 32-bit lanes that are all ones or all zeros, as 16-bit lanes in the same order.
#[target_feature(enable = "avx2")]
#[inline]
fn narrow_mask8(mask: __m256i) -> __m128i {
    // Signed saturation keeps -1 and 0 as they are.
    _mm_packs_epi32(
        _mm256_castsi256_si128(mask),
        _mm256_extracti128_si256::<1>(mask),
    )
}

/// All ones in the 16-bit lanes where `x < y` as `f32` (false when either is NaN, and for
/// +0 against -0), as [`portable::max`]/[`portable::min`] compare.
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn f16_less8(x: __m128i, y: __m128i) -> __m128i {
    let less = _mm256_cmp_ps::<_CMP_LT_OQ>(_mm256_cvtph_ps(x), _mm256_cvtph_ps(y));
    narrow_mask8(_mm256_castps_si256(less))
}

/// Eight `f16` sums: widened exactly, added in `f32`, rounded once to nearest-even.
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn f16_sum8(a: __m128i, b: __m128i) -> __m128i {
    let sum = _mm256_add_ps(_mm256_cvtph_ps(a), _mm256_cvtph_ps(b));
    let rounded = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(sum);
    // vcvtps2ph keeps a NaN's sign and payload; MLX's software half makes every NaN the
    // sum's sign over 0x7D00, which is the converted NaN's sign over 0x7D00. NaNs are rare,
    // so the fix-up is skipped for blocks without one.
    let unordered = _mm256_cmp_ps::<_CMP_UNORD_Q>(sum, sum);
    if _mm256_movemask_ps(unordered) == 0 {
        return rounded;
    }
    let mlx_nan = _mm_or_si128(
        _mm_and_si128(rounded, _mm_set1_epi16(i16::MIN)),
        _mm_set1_epi16(0x7D00),
    );
    _mm_blendv_epi8(
        rounded,
        mlx_nan,
        narrow_mask8(_mm256_castps_si256(unordered)),
    )
}

/// The lanes where `x < y` as `f32`, as [`f16_less8`].
#[target_feature(enable = "avx512f")]
#[inline]
fn f16_less16(x: __m256i, y: __m256i) -> __mmask16 {
    _mm512_cmp_ps_mask::<_CMP_LT_OQ>(_mm512_cvtph_ps(x), _mm512_cvtph_ps(y))
}

/// Sixteen `f16` sums, as [`f16_sum8`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
fn f16_sum16(a: __m256i, b: __m256i) -> __m256i {
    let sum = _mm512_add_ps(_mm512_cvtph_ps(a), _mm512_cvtph_ps(b));
    let rounded = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(sum);
    let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(sum, sum);
    if nan == 0 {
        return rounded;
    }
    // The converted NaN keeps the sum's sign, as MLX's software half takes it.
    let mlx_nan = _mm256_or_si256(
        _mm256_and_si256(rounded, _mm256_set1_epi16(i16::MIN)),
        _mm256_set1_epi16(0x7D00),
    );
    _mm256_mask_blend_epi16(nan, rounded, mlx_nan)
}

/// `bfloat16` sums with AVX512-BF16's conversion, sixteen lanes at a time.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
fn bf16_sum_avx512bf16(acc: &mut [u8], inc: &[u8]) {
    blocks::<32>(acc, inc, 2, |a, b| store(a, bf16_sum16(load(a), load(b))));
}

/// Sixteen `bfloat16` as `f32`: exact, each is the top half of an `f32`.
#[target_feature(enable = "avx512f")]
#[inline]
fn bf16_widen16(x: __m256i) -> __m512 {
    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(x)))
}

/// The bits of sixteen `bfloat16`.
#[inline(always)]
fn bf16_bits(v: __m256bh) -> __m256i {
    // SAFETY: both types are 256 bits of plain vector data with no invalid bit patterns,
    // so reinterpreting one as the other is a no-op on the bits.
    unsafe { std::mem::transmute::<__m256bh, __m256i>(v) }
}

/// Sixteen `bfloat16` sums, rounded as MLX's software `bfloat16` rounds.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
#[inline]
fn bf16_sum16(a: __m256i, b: __m256i) -> __m256i {
    let sum = _mm512_add_ps(bf16_widen16(a), bf16_widen16(b));
    let converted = bf16_bits(_mm512_cvtneps_pbh(sum));
    // vcvtneps2bf16 rounds to nearest-even as MLX does, but flushes subnormal sums to zero
    // and keeps a NaN's sign and payload. Subnormals (exponent field zero) are rounded with
    // the integer rule instead, and NaN becomes MLX's 0x7FC0. Both are rare (zero sums
    // included), so the fix-ups are skipped for blocks without them: that common case is
    // what the instruction saves over the integer rule.
    let bits = _mm512_castps_si512(sum);
    let subnormal = _mm512_testn_epi32_mask(bits, _mm512_set1_epi32(0x7F80_0000));
    let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(sum, sum);
    if subnormal | nan == 0 {
        return converted;
    }
    let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(bits), _mm512_set1_epi32(1));
    let bias = _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF));
    let by_integers = _mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(_mm512_add_epi32(bits, bias)));
    let rounded = _mm256_mask_blend_epi16(subnormal, converted, by_integers);
    _mm256_mask_blend_epi16(nan, rounded, _mm256_set1_epi16(0x7FC0))
}
