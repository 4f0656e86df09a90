//! What the tracing probes are told: a collective's op, dtype and size, and an error's
//! kind (codes in `ffi::probes`). Every backend fires the same probes.

use crate::element::DType;
use crate::error::{Error, Phase};
use crate::reduce::ReduceOp;

/// What the tracing probes are told about a collective (codes in `ffi::probes`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Traced {
    pub(crate) op: u8,
    pub(crate) dtype: u8,
    pub(crate) bytes: u64,
    pub(crate) context: Phase,
}

impl Traced {
    pub(crate) const ALL_GATHER: u8 = 3;
    pub(crate) const SUM_SCATTER: u8 = 4;
    pub(crate) const SEND: u8 = 5;
    pub(crate) const RECV: u8 = 6;
    pub(crate) const BARRIER: u8 = 7;
    pub(crate) const BROADCAST: u8 = 8;
    pub(crate) const ALL_TO_ALL: u8 = 9;
    /// The dtype code of byte-level collectives.
    const BYTES: u8 = 255;

    pub(crate) fn dtype(dtype: DType) -> u8 {
        DType::ALL
            .iter()
            .position(|&d| d == dtype)
            .map_or(Self::BYTES, |i| i as u8)
    }

    pub(crate) fn reduce(op: ReduceOp, dtype: DType, bytes: usize) -> Traced {
        let code = match op {
            ReduceOp::Sum => 0,
            ReduceOp::Max => 1,
            ReduceOp::Min => 2,
        };
        Traced {
            op: code,
            dtype: Self::dtype(dtype),
            bytes: bytes as u64,
            context: op.phase(),
        }
    }

    pub(crate) fn bytes(op: u8, context: Phase, bytes: usize) -> Traced {
        Traced {
            op,
            dtype: Self::BYTES,
            bytes: bytes as u64,
            context,
        }
    }
}

/// The `error` probe's kind code: 1 I/O, 2 closed, 3 lost (by notice), 4 timeout,
/// 5 authentication, 6 protocol violation, 7 incompatible peer, 8 local or a bug, 9 RDMA
/// (JACCL), 10 mismatched calls (the native wire), 0 anything else.
pub(crate) fn error_kind(error: &Error) -> u8 {
    match error {
        Error::Io { .. } => 1,
        Error::Closed { .. } => 2,
        Error::Lost { .. } => 3,
        Error::Timeout { .. } => 4,
        Error::Auth { .. } => 5,
        Error::PeerMisbehaved { .. } => 6,
        Error::PeerIncompatible { .. } => 7,
        Error::Local { .. } | Error::Bug { .. } => 8,
        Error::Rdma { .. } => 9,
        Error::Mismatch { .. } => 10,
        _ => 0,
    }
}
