//! The NEON level.
//!
//! NEON is part of every aarch64 Rust target's baseline, so the plain loops of [`portable`]
//! are vectorised with it without any `#[target_feature]` or runtime dispatch: this level
//! needs no `unsafe`. Both [`Semantics`] of float max and min are plain loops here. `f16` is
//! left to the caller's scalar path (which on aarch64 follows the hardware's NaN rules): its
//! NEON conversions need the optional `fp16` feature and have not been built or tested here.

use super::{Elem, Op, Semantics, portable};

/// The NEON level: the plain loops.
pub(super) fn reduce_neon(
    semantics: Semantics,
    op: Op,
    elem: Elem,
    acc: &mut [u8],
    inc: &[u8],
) -> bool {
    portable::reduce(semantics, op, elem, acc, inc)
}
