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

use super::{Elem, Op, Semantics, blocks, features, order, portable};

/// The AVX2 level: the plain loops, and `f16` through F16C where the CPU has it.
#[target_feature(enable = "avx2")]
pub(super) fn reduce_avx2(
    semantics: Semantics,
    op: Op,
    elem: Elem,
    acc: &mut [u8],
    inc: &[u8],
) -> bool {
    if matches!((elem, op), (Elem::F32 | Elem::F64, Op::Max | Op::Min)) {
        match semantics {
            Semantics::Ring => float_select_avx2::<false>(op, elem, acc, inc),
            Semantics::Jaccl => float_select_avx2::<true>(op, elem, acc, inc),
        }
        return true;
    }
    if matches!((elem, op), (Elem::Complex64, Op::Max | Op::Min)) {
        match semantics {
            Semantics::Ring => complex_select_avx2::<false>(op, acc, inc),
            Semantics::Jaccl => complex_select_avx2::<true>(op, acc, inc),
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
    // runs only where it did), the features `f16_avx2` is compiled for.
    unsafe { f16_avx2(semantics, op, acc, inc) };
    true
}

/// The AVX-512 level: the plain loops, `f16` through AVX-512F's conversions, and `bfloat16`
/// sums through AVX512-BF16 when `use_avx512bf16` and the CPU has it.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(super) fn reduce_avx512(
    use_avx512bf16: bool,
    semantics: Semantics,
    op: Op,
    elem: Elem,
    acc: &mut [u8],
    inc: &[u8],
) -> bool {
    match (elem, op, semantics) {
        (Elem::F32 | Elem::F64, Op::Max | Op::Min, Semantics::Ring) => {
            float_select_avx512::<false>(op, elem, acc, inc)
        }
        (Elem::F32 | Elem::F64, Op::Max | Op::Min, Semantics::Jaccl) => {
            float_select_avx512::<true>(op, elem, acc, inc)
        }
        (Elem::Complex64, Op::Max | Op::Min, Semantics::Ring) => {
            complex_select_avx512::<false>(op, acc, inc)
        }
        (Elem::Complex64, Op::Max | Op::Min, Semantics::Jaccl) => {
            complex_select_avx512::<true>(op, acc, inc)
        }
        (Elem::F16, _, _) => f16_avx512(semantics, op, acc, inc),
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

/// A 64-byte block as one vector.
#[target_feature(enable = "avx512f")]
#[inline]
fn load512(bytes: &[u8; 64]) -> __m512i {
    // SAFETY: `bytes` is a reference to 64 readable bytes, exactly the 512 bits read, and
    // `loadu` has no alignment requirement; AVX-512F is enabled on this function.
    unsafe { _mm512_loadu_si512(bytes.as_ptr().cast()) }
}

/// One vector into a 64-byte block.
#[target_feature(enable = "avx512f")]
#[inline]
fn store512(bytes: &mut [u8; 64], v: __m512i) {
    // SAFETY: `bytes` is an exclusive reference to 64 writable bytes, exactly the 512 bits
    // written, and `storeu` has no alignment requirement; AVX-512F is enabled on this
    // function.
    unsafe { _mm512_storeu_si512(bytes.as_mut_ptr().cast(), v) }
}

/// Eight halves from a 16-byte block.
#[inline(always)]
fn load128(bytes: &[u8; 16]) -> __m128i {
    // SAFETY: `bytes` is a reference to 16 readable bytes, exactly the 128 bits read, and
    // `loadu` has no alignment requirement; SSE2 is part of every x86_64 target.
    unsafe { _mm_loadu_si128(bytes.as_ptr().cast()) }
}

/// Eight halves into a 16-byte block.
#[inline(always)]
fn store128(bytes: &mut [u8; 16], v: __m128i) {
    // SAFETY: `bytes` is an exclusive reference to 16 writable bytes, exactly the 128 bits
    // written, and `storeu` has no alignment requirement; SSE2 is part of every x86_64 target.
    unsafe { _mm_storeu_si128(bytes.as_mut_ptr().cast(), v) }
}

/// Sixteen halves from a 32-byte block.
#[target_feature(enable = "avx")]
#[inline]
fn load256(bytes: &[u8; 32]) -> __m256i {
    // SAFETY: `bytes` is a reference to 32 readable bytes, exactly the 256 bits read, and
    // `loadu` has no alignment requirement; AVX is enabled on this function.
    unsafe { _mm256_loadu_si256(bytes.as_ptr().cast()) }
}

/// Sixteen halves into a 32-byte block.
#[target_feature(enable = "avx")]
#[inline]
fn store256(bytes: &mut [u8; 32], v: __m256i) {
    // SAFETY: `bytes` is an exclusive reference to 32 writable bytes, exactly the 256 bits
    // written, and `storeu` has no alignment requirement; AVX is enabled on this function.
    unsafe { _mm256_storeu_si256(bytes.as_mut_ptr().cast(), v) }
}

// `f32` and `f64` max and min use x86's own instructions. `max(other, kept)` is
// `other > kept ? other : kept` and returns its second operand, `kept`, when either is NaN or
// the two are equal: that is `portable::max` exactly. With the ring's order (kept = acc) it is
// `std::max(acc, inc)` (a NaN in acc stays, an incoming one is ignored, of two zeros acc's sign
// stays); with JACCL's (kept = inc) it is `(acc > inc) ? acc : inc`. Likewise
// `min(other, kept)` is `portable::min`. The plain loop would be vectorised too, but the compiler turns its
// `acc = acc < inc ? inc : acc` into a masked store of `inc`, and AVX2's `vmaskmovps` is
// several times slower than the scalar loop on AMD's Zen.

/// `f32`/`f64` max or min with AVX, eight or four lanes at a time; the incoming value is the
/// kept operand if `INC_KEPT`, else the accumulator.
#[target_feature(enable = "avx2")]
fn float_select_avx2<const INC_KEPT: bool>(op: Op, elem: Elem, acc: &mut [u8], inc: &[u8]) {
    match (elem, op) {
        (Elem::F32, Op::Max) => blocks::<32>(acc, inc, 4, |a, b| {
            let (kept, other) = order::<INC_KEPT, _>(
                _mm256_castsi256_ps(load256(a)),
                _mm256_castsi256_ps(load256(b)),
            );
            store256(a, _mm256_castps_si256(_mm256_max_ps(other, kept)));
        }),
        (Elem::F32, Op::Min) => blocks::<32>(acc, inc, 4, |a, b| {
            let (kept, other) = order::<INC_KEPT, _>(
                _mm256_castsi256_ps(load256(a)),
                _mm256_castsi256_ps(load256(b)),
            );
            store256(a, _mm256_castps_si256(_mm256_min_ps(other, kept)));
        }),
        (Elem::F64, Op::Max) => blocks::<32>(acc, inc, 8, |a, b| {
            let (kept, other) = order::<INC_KEPT, _>(
                _mm256_castsi256_pd(load256(a)),
                _mm256_castsi256_pd(load256(b)),
            );
            store256(a, _mm256_castpd_si256(_mm256_max_pd(other, kept)));
        }),
        (Elem::F64, Op::Min) => blocks::<32>(acc, inc, 8, |a, b| {
            let (kept, other) = order::<INC_KEPT, _>(
                _mm256_castsi256_pd(load256(a)),
                _mm256_castsi256_pd(load256(b)),
            );
            store256(a, _mm256_castpd_si256(_mm256_min_pd(other, kept)));
        }),
        _ => unreachable!("float_select_avx2 is called for f32 and f64 max and min only"),
    }
}

/// `f32`/`f64` max or min with AVX-512F, sixteen or eight lanes at a time, as
/// [`float_select_avx2`].
#[target_feature(enable = "avx512f")]
fn float_select_avx512<const INC_KEPT: bool>(op: Op, elem: Elem, acc: &mut [u8], inc: &[u8]) {
    match (elem, op) {
        (Elem::F32, Op::Max) => blocks::<64>(acc, inc, 4, |a, b| {
            let (kept, other) = order::<INC_KEPT, _>(
                _mm512_castsi512_ps(load512(a)),
                _mm512_castsi512_ps(load512(b)),
            );
            store512(a, _mm512_castps_si512(_mm512_max_ps(other, kept)));
        }),
        (Elem::F32, Op::Min) => blocks::<64>(acc, inc, 4, |a, b| {
            let (kept, other) = order::<INC_KEPT, _>(
                _mm512_castsi512_ps(load512(a)),
                _mm512_castsi512_ps(load512(b)),
            );
            store512(a, _mm512_castps_si512(_mm512_min_ps(other, kept)));
        }),
        (Elem::F64, Op::Max) => blocks::<64>(acc, inc, 8, |a, b| {
            let (kept, other) = order::<INC_KEPT, _>(
                _mm512_castsi512_pd(load512(a)),
                _mm512_castsi512_pd(load512(b)),
            );
            store512(a, _mm512_castpd_si512(_mm512_max_pd(other, kept)));
        }),
        (Elem::F64, Op::Min) => blocks::<64>(acc, inc, 8, |a, b| {
            let (kept, other) = order::<INC_KEPT, _>(
                _mm512_castsi512_pd(load512(a)),
                _mm512_castsi512_pd(load512(b)),
            );
            store512(a, _mm512_castpd_si512(_mm512_min_pd(other, kept)));
        }),
        _ => unreachable!("float_select_avx512 is called for f32 and f64 max and min only"),
    }
}

// `complex64` max and min compare lexicographically, real part first
// ([`portable::complex_less`]), and keep one operand's whole element: `other` replaces `kept`
// only where the comparison is strict. Real parts are the even `f32` lanes, imaginary parts
// the odd ones, so each element's decision is made from its two lanes' comparisons and then
// applied to both lanes.

/// `complex64` max or min with AVX, four elements at a time; the incoming value is the kept
/// operand if `INC_KEPT`, else the accumulator.
#[target_feature(enable = "avx2")]
fn complex_select_avx2<const INC_KEPT: bool>(op: Op, acc: &mut [u8], inc: &[u8]) {
    blocks::<32>(acc, inc, 8, |a, b| {
        let (kept, other) = order::<INC_KEPT, _>(
            _mm256_castsi256_ps(load256(a)),
            _mm256_castsi256_ps(load256(b)),
        );
        // Called for max and min only: anything but max is min.
        let take = if op == Op::Max {
            complex_less4(kept, other)
        } else {
            complex_less4(other, kept)
        };
        store256(a, _mm256_castps_si256(_mm256_blendv_ps(kept, other, take)));
    });
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

/// `complex64` max or min with AVX-512F, eight elements at a time, as
/// [`complex_select_avx2`].
#[target_feature(enable = "avx512f")]
fn complex_select_avx512<const INC_KEPT: bool>(op: Op, acc: &mut [u8], inc: &[u8]) {
    blocks::<64>(acc, inc, 8, |a, b| {
        let (kept, other) = order::<INC_KEPT, _>(
            _mm512_castsi512_ps(load512(a)),
            _mm512_castsi512_ps(load512(b)),
        );
        // Called for max and min only: anything but max is min.
        let take = if op == Op::Max {
            complex_less8(kept, other)
        } else {
            complex_less8(other, kept)
        };
        store512(
            a,
            _mm512_castps_si512(_mm512_mask_blend_ps(take, kept, other)),
        );
    });
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

/// `f16` sum, max or min with F16C, eight lanes at a time.
#[target_feature(enable = "avx2,f16c")]
fn f16_avx2(semantics: Semantics, op: Op, acc: &mut [u8], inc: &[u8]) {
    match (op, semantics) {
        (Op::Sum, _) => blocks::<16>(acc, inc, 2, |a, b| {
            store128(a, f16_sum8(load128(a), load128(b)));
        }),
        (_, Semantics::Ring) => f16_select_avx2::<false>(op, acc, inc),
        (_, Semantics::Jaccl) => f16_select_avx2::<true>(op, acc, inc),
    }
}

/// `f16` max or min with F16C, eight lanes at a time: [`portable::max_by`] and
/// [`portable::min_by`] as blends, the comparison done in `f32`.
#[target_feature(enable = "avx2,f16c")]
fn f16_select_avx2<const INC_KEPT: bool>(op: Op, acc: &mut [u8], inc: &[u8]) {
    match op {
        Op::Max => blocks::<16>(acc, inc, 2, |a, b| {
            let (kept, other) = order::<INC_KEPT, _>(load128(a), load128(b));
            store128(a, _mm_blendv_epi8(kept, other, f16_less8(kept, other)));
        }),
        Op::Min => blocks::<16>(acc, inc, 2, |a, b| {
            let (kept, other) = order::<INC_KEPT, _>(load128(a), load128(b));
            store128(a, _mm_blendv_epi8(kept, other, f16_less8(other, kept)));
        }),
        Op::Sum => unreachable!("f16_select_avx2 is called for max and min only"),
    }
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
    // vcvtps2ph keeps a NaN's payload; MLX's software half makes every NaN the sum's sign
    // over 0x7D00. NaNs are rare, so the fix-up is skipped for blocks without one.
    let unordered = _mm256_cmp_ps::<_CMP_UNORD_Q>(sum, sum);
    if _mm256_movemask_ps(unordered) == 0 {
        return rounded;
    }
    let nan = narrow_mask8(_mm256_castps_si256(unordered));
    let negative = narrow_mask8(_mm256_srai_epi32::<31>(_mm256_castps_si256(sum)));
    let mlx_nan = _mm_or_si128(
        _mm_and_si128(negative, _mm_set1_epi16(i16::MIN)),
        _mm_set1_epi16(0x7D00),
    );
    _mm_blendv_epi8(rounded, mlx_nan, nan)
}

/// `f16` sum, max or min with AVX-512F's conversions, sixteen lanes at a time.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn f16_avx512(semantics: Semantics, op: Op, acc: &mut [u8], inc: &[u8]) {
    match (op, semantics) {
        (Op::Sum, _) => blocks::<32>(acc, inc, 2, |a, b| {
            store256(a, f16_sum16(load256(a), load256(b)));
        }),
        (_, Semantics::Ring) => f16_select_avx512::<false>(op, acc, inc),
        (_, Semantics::Jaccl) => f16_select_avx512::<true>(op, acc, inc),
    }
}

/// `f16` max or min with AVX-512F's conversions, sixteen lanes at a time, as
/// [`f16_select_avx2`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn f16_select_avx512<const INC_KEPT: bool>(op: Op, acc: &mut [u8], inc: &[u8]) {
    match op {
        Op::Max => blocks::<32>(acc, inc, 2, |a, b| {
            let (kept, other) = order::<INC_KEPT, _>(load256(a), load256(b));
            store256(
                a,
                _mm256_mask_blend_epi16(f16_less16(kept, other), kept, other),
            );
        }),
        Op::Min => blocks::<32>(acc, inc, 2, |a, b| {
            let (kept, other) = order::<INC_KEPT, _>(load256(a), load256(b));
            store256(
                a,
                _mm256_mask_blend_epi16(f16_less16(other, kept), kept, other),
            );
        }),
        Op::Sum => unreachable!("f16_select_avx512 is called for max and min only"),
    }
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
    // The top 16 bits of each sum hold its sign, as MLX's software half takes it.
    let high = _mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(_mm512_castps_si512(sum)));
    let mlx_nan = _mm256_or_si256(
        _mm256_and_si256(high, _mm256_set1_epi16(i16::MIN)),
        _mm256_set1_epi16(0x7D00),
    );
    _mm256_mask_blend_epi16(nan, rounded, mlx_nan)
}

/// `bfloat16` sums with AVX512-BF16's conversion, sixteen lanes at a time.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
fn bf16_sum_avx512bf16(acc: &mut [u8], inc: &[u8]) {
    blocks::<32>(acc, inc, 2, |a, b| {
        store256(a, bf16_sum16(load256(a), load256(b)));
    });
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
