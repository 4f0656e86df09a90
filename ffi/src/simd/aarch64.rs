//! The NEON level: the plain loops, and intrinsic kernels for `f16`, `bfloat16` and
//! `complex64` max and min.
//!
//! NEON is part of every aarch64 Rust target's baseline, so the plain loops of [`portable`]
//! are vectorised with it without runtime dispatch. The functions that call intrinsics
//! still carry `#[target_feature(enable = "neon")]`, because Rust makes an intrinsic safe to
//! call only from a function that names its feature. What is written by hand here:
//!
//! - `f16`: widened with FCVTL/FCVTL2 and, for sums, narrowed once with FCVTN/FCVTN2, which
//!   round to nearest-even (the FPCR default, which Rust code assumes throughout). These are
//!   base ARMv8.0 Advanced SIMD instructions: they need no FEAT_FP16, so there is no extra
//!   level to detect. Rust's `vcvt_f32_f16`/`vcvt_f16_f32` are stable only from Rust 1.94,
//!   past our MSRV (1.89), so the two conversions are `asm!` (one block each). The sums use
//!   `f32` arithmetic, never FEAT_FP16's half arithmetic, which would round each sum from
//!   half operands differently from MLX's `f32` path. A NaN sum is what the hardware makes
//!   (quiet, payload kept), as MLX's native `float16_t` arithmetic on aarch64 makes it, and
//!   as the root crate's scalar `f16` rule on aarch64 states.
//! - `bfloat16`: widened by a shift, added in `f32`, narrowed with the integer rounding of
//!   [`portable::bf16_round`] (NaN becomes `0x7FC0`). BFCVTN (FEAT_BF16) would save two
//!   instructions per vector but keeps NaN payloads, so it would need the same NaN fix-up,
//!   and Rust has no stable intrinsic for it: not worth an `asm!` and a detected level.
//! - `max`/`min` of `f16`, `bfloat16` and `complex64`: compare (in `f32` for the halves),
//!   then select whole elements' bits, so the result is always one operand's exact bits, as
//!   [`portable::max_by`]/[`portable::min_by`] return.

use std::arch::aarch64::*;
use std::arch::asm;

use super::{Elem, Op, Reduction, Semantics, blocks, portable};

/// The NEON level: the plain loops, and the kernels of this module where they exist.
#[target_feature(enable = "neon")]
pub(super) fn reduce_neon(what: Reduction, acc: &mut [u8], inc: &[u8]) -> bool {
    let (semantics, op, elem) = (what.semantics, what.op, what.elem);
    match (elem, op, semantics) {
        (Elem::F16, Op::Sum, _) => half_sum(acc, inc, f16_widen, f16_narrow),
        (Elem::F16, _, Semantics::Ring) => {
            select::<false>(op, 2, acc, inc, |x, y| half_less(x, y, f16_widen))
        }
        (Elem::F16, _, Semantics::Jaccl) => {
            select::<true>(op, 2, acc, inc, |x, y| half_less(x, y, f16_widen))
        }
        (Elem::BF16, Op::Sum, _) => half_sum(
            acc,
            inc,
            |h| bf16_widen(h),
            |low, high| bf16_narrow(low, high),
        ),
        (Elem::BF16, _, Semantics::Ring) => {
            select::<false>(op, 2, acc, inc, |x, y| half_less(x, y, |h| bf16_widen(h)))
        }
        (Elem::BF16, _, Semantics::Jaccl) => {
            select::<true>(op, 2, acc, inc, |x, y| half_less(x, y, |h| bf16_widen(h)))
        }
        (Elem::Complex64, Op::Max | Op::Min, Semantics::Ring) => {
            select::<false>(op, 8, acc, inc, |x, y| complex_less(x, y))
        }
        (Elem::Complex64, Op::Max | Op::Min, Semantics::Jaccl) => {
            select::<true>(op, 8, acc, inc, |x, y| complex_less(x, y))
        }
        _ => return portable::reduce(semantics, op, elem, acc, inc),
    }
    true
}

/// `max` or `min` of `size`-byte elements, sixteen bytes at a time, with `less` the
/// element order (all ones over each element where `x < y`): [`super::select`] on NEON
/// vectors, so the other operand replaces the kept one (the incoming value if `INC_KEPT`,
/// else the accumulator) only where the comparison is strict, as
/// [`portable::max_by`]/[`portable::min_by`].
#[target_feature(enable = "neon")]
#[inline]
fn select<const INC_KEPT: bool>(
    op: Op,
    size: usize,
    acc: &mut [u8],
    inc: &[u8],
    less: impl Fn(uint8x16_t, uint8x16_t) -> uint8x16_t,
) {
    super::select::<INC_KEPT, 16, _, _>(
        op,
        size,
        acc,
        inc,
        |a| load(a),
        less,
        |a, kept, other, take| store(a, vbslq_u8(take, other, kept)),
    );
}

/// Sums of 16-bit floats, sixteen bytes at a time: each half widened to `f32` by `widen`
/// (exactly), the pairs added in `f32`, and the sums narrowed back by `narrow` (rounded once).
#[target_feature(enable = "neon")]
#[inline]
fn half_sum(
    acc: &mut [u8],
    inc: &[u8],
    widen: impl Fn(uint8x16_t) -> (float32x4_t, float32x4_t),
    narrow: impl Fn(float32x4_t, float32x4_t) -> uint8x16_t,
) {
    blocks::<16>(acc, inc, 2, |a, b| {
        let (a0, a1) = widen(load(a));
        let (b0, b1) = widen(load(b));
        store(a, narrow(vaddq_f32(a0, b0), vaddq_f32(a1, b1)));
    });
}

/// A 16-byte block as one vector.
#[target_feature(enable = "neon")]
#[inline]
fn load(bytes: &[u8; 16]) -> uint8x16_t {
    // SAFETY: `bytes` is a reference to 16 readable bytes, exactly what LD1 of sixteen `u8`
    // lanes reads, and byte lanes need no alignment; NEON is baseline on aarch64.
    unsafe { vld1q_u8(bytes.as_ptr()) }
}

/// One vector into a 16-byte block.
#[target_feature(enable = "neon")]
#[inline]
fn store(bytes: &mut [u8; 16], v: uint8x16_t) {
    // SAFETY: `bytes` is an exclusive reference to 16 writable bytes, exactly what ST1 of
    // sixteen `u8` lanes writes, and byte lanes need no alignment; NEON is baseline.
    unsafe { vst1q_u8(bytes.as_mut_ptr(), v) }
}

/// Eight `f16` as two vectors of `f32` (FCVTL, FCVTL2): exact.
#[inline(always)]
fn f16_widen(halves: uint8x16_t) -> (float32x4_t, float32x4_t) {
    let (low, high): (float32x4_t, float32x4_t);
    // SAFETY: the two instructions read and write only the registers named here (`low` is
    // written before `halves` is read again, hence `out`, never the same register) and no
    // memory or stack; FCVTL is base ARMv8.0 Advanced SIMD, which every aarch64 target has.
    // Besides the outputs they may only set FPSR's sticky exception bits (for a signalling
    // NaN), which Rust's own float arithmetic sets as well, so `preserves_flags` is not
    // claimed.
    unsafe {
        asm!(
            "fcvtl {low:v}.4s, {halves:v}.4h",
            "fcvtl2 {high:v}.4s, {halves:v}.8h",
            halves = in(vreg) halves,
            low = out(vreg) low,
            high = lateout(vreg) high,
            options(nomem, nostack),
        );
    }
    (low, high)
}

/// Two vectors of `f32` as eight `f16` (FCVTN, FCVTN2), each rounded once to nearest-even;
/// a NaN stays a quiet NaN with the top of its payload.
#[inline(always)]
fn f16_narrow(low: float32x4_t, high: float32x4_t) -> uint8x16_t {
    let halves: uint8x16_t;
    // SAFETY: as in `f16_widen`: only the named registers (`halves` is written before `high`
    // is read, hence `out`), no memory, FPSR's sticky bits at most; FCVTN is base ARMv8.0
    // Advanced SIMD, and the rounding mode is FPCR's, which Rust code keeps at its default,
    // round to nearest-even.
    unsafe {
        asm!(
            "fcvtn {halves:v}.4h, {low:v}.4s",
            "fcvtn2 {halves:v}.8h, {high:v}.4s",
            low = in(vreg) low,
            high = in(vreg) high,
            halves = out(vreg) halves,
            options(nomem, nostack),
        );
    }
    halves
}

/// Two masks of 32-bit lanes, all ones or all zeros, as one of 16-bit lanes in order.
#[target_feature(enable = "neon")]
#[inline]
fn narrow_mask(low: uint32x4_t, high: uint32x4_t) -> uint8x16_t {
    vreinterpretq_u8_u16(vmovn_high_u32(vmovn_u32(low), high))
}

/// All ones in the 16-bit lanes where `x < y` as 16-bit floats (`f16` or `bfloat16`, as
/// `widen` makes them `f32`), false when either is NaN and for +0 against -0, as
/// [`portable::max`]/[`portable::min`] compare.
#[target_feature(enable = "neon")]
#[inline]
fn half_less(
    x: uint8x16_t,
    y: uint8x16_t,
    widen: impl Fn(uint8x16_t) -> (float32x4_t, float32x4_t),
) -> uint8x16_t {
    let ((x0, x1), (y0, y1)) = (widen(x), widen(y));
    narrow_mask(vcltq_f32(x0, y0), vcltq_f32(x1, y1))
}

/// Eight `bfloat16` as two vectors of `f32`: exact, each is the top half of an `f32`.
#[target_feature(enable = "neon")]
#[inline]
fn bf16_widen(halves: uint8x16_t) -> (float32x4_t, float32x4_t) {
    let halves = vreinterpretq_u16_u8(halves);
    (
        vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(halves))),
        vreinterpretq_f32_u32(vshll_high_n_u16::<16>(halves)),
    )
}

/// Two vectors of `f32` as eight `bfloat16`, as [`portable::bf16_round`] rounds: to
/// nearest-even by adding `0x7FFF` plus the kept part's lowest bit and keeping the top half
/// (the carry out of the mantissa is the overflow to infinity); NaN is `0x7FC0`.
#[target_feature(enable = "neon")]
#[inline]
fn bf16_narrow(low: float32x4_t, high: float32x4_t) -> uint8x16_t {
    let bias = |x: float32x4_t| {
        let bits = vreinterpretq_u32_f32(x);
        let lsb = vandq_u32(vshrq_n_u32::<16>(bits), vdupq_n_u32(1));
        vaddq_u32(lsb, vdupq_n_u32(0x7FFF))
    };
    // ADDHN keeps the top half of each 32-bit sum: the rounding and the narrowing at once.
    let rounded = vaddhn_high_u32(
        vaddhn_u32(vreinterpretq_u32_f32(low), bias(low)),
        vreinterpretq_u32_f32(high),
        bias(high),
    );
    let ordered = narrow_mask(vceqq_f32(low, low), vceqq_f32(high, high));
    let nan = vreinterpretq_u8_u16(vdupq_n_u16(0x7FC0));
    vbslq_u8(ordered, vreinterpretq_u8_u16(rounded), nan)
}

/// All ones over the whole `complex64` elements (two per vector) where `x < y` in MLX's
/// order, [`portable::complex_less`]: real parts less, or equal and imaginary parts less.
#[target_feature(enable = "neon")]
#[inline]
fn complex_less(x: uint8x16_t, y: uint8x16_t) -> uint8x16_t {
    let (x, y) = (vreinterpretq_f32_u8(x), vreinterpretq_f32_u8(y));
    let (less, equal) = (vcltq_f32(x, y), vceqq_f32(x, y));
    // Real parts are the even lanes, imaginary the odd ones: TRN1 copies each element's real
    // comparison over both its lanes, TRN2 its imaginary one.
    let real_less = vtrn1q_u32(less, less);
    let real_equal = vtrn1q_u32(equal, equal);
    let imag_less = vtrn2q_u32(less, less);
    vreinterpretq_u8_u32(vorrq_u32(real_less, vandq_u32(real_equal, imag_less)))
}
