//! nuvec-core's [`Communicator`] over the engine's [`engine::Group`]: one adapter for every
//! backend, wire and transport, since each of them is an engine group.
//!
//! nuvec-core hands over row-contiguous buffers it owns (64-byte aligned on the host) and
//! serialises the calls on one group (its per-group order lock), so the adapter lends the
//! bytes to the engine as they are: nothing is copied or allocated here. What it adds is
//! the translation of nuvec's dtypes and reductions and of the engine's errors.

use std::sync::Arc;

use nuvec_core::distributed::{AllReduce, Communicator};
use nuvec_core::{DType, Result};

use crate::error::{Call, unsupported};

/// An engine group as nuvec's transport.
#[derive(Debug)]
pub(crate) struct ArrayComm {
    group: engine::Group,
}

impl ArrayComm {
    pub(crate) fn new(group: engine::Group) -> Self {
        ArrayComm { group }
    }
}

/// The engine's dtype for nuvec's, or `None` for a dtype the engine has no reduction for
/// (nuvec-core's enum is open: a later release may add one).
pub(crate) fn engine_dtype(dtype: DType) -> Option<engine::DType> {
    use engine::DType as E;
    Some(match dtype {
        DType::Bool => E::Bool,
        DType::U8 => E::U8,
        DType::U16 => E::U16,
        DType::U32 => E::U32,
        DType::U64 => E::U64,
        DType::I8 => E::I8,
        DType::I16 => E::I16,
        DType::I32 => E::I32,
        DType::I64 => E::I64,
        DType::F16 => E::F16,
        DType::BF16 => E::BF16,
        DType::F32 => E::F32,
        DType::F64 => E::F64,
        DType::Complex64 => E::Complex64,
        _ => return None,
    })
}

/// The engine's reduction for nuvec's (an open enum as well).
fn engine_op(op: AllReduce) -> Option<engine::ReduceOp> {
    Some(match op {
        AllReduce::Sum => engine::ReduceOp::Sum,
        AllReduce::Max => engine::ReduceOp::Max,
        AllReduce::Min => engine::ReduceOp::Min,
        _ => return None,
    })
}

impl Communicator for ArrayComm {
    fn rank(&self) -> usize {
        self.group.rank()
    }

    fn size(&self) -> usize {
        self.group.size()
    }

    fn all_reduce(&self, op: AllReduce, dtype: DType, data: &mut [u8]) -> Result<()> {
        let call = Call::Reduce(op);
        let Some(reduce) = engine_op(op) else {
            return Err(unsupported(
                call,
                format!("the reduction {op:?} is not one the engine implements (sum, max, min)"),
            ));
        };
        let Some(element) = engine_dtype(dtype) else {
            return Err(unsupported(
                call,
                format!("{dtype:?} arrays have no reduction in nuvec-distributed"),
            ));
        };
        self.group
            .all_reduce_bytes(reduce, element, data)
            .map_err(|e| call.error(e))?;
        if element == engine::DType::Bool {
            // nuvec stores a bool as one byte that must be 0 or 1; a peer's byte is taken
            // as a C++ bool read of it would be, so the array stays valid whatever it sent.
            for b in data.iter_mut() {
                *b = u8::from(*b != 0);
            }
        }
        Ok(())
    }

    fn all_gather(&self, input: &[u8], output: &mut [u8]) -> Result<()> {
        self.group
            .all_gather(input, output)
            .map_err(|e| Call::Gather.error(e))
    }

    fn send(&self, dst: usize, data: &[u8]) -> Result<()> {
        self.group
            .send(data, dst)
            .map_err(|e| Call::Send(dst).error(e))
    }

    fn recv(&self, src: usize, data: &mut [u8]) -> Result<()> {
        self.group
            .recv(data, src)
            .map_err(|e| Call::Recv(src).error(e))
    }

    fn split(&self, color: i32, key: i32) -> Result<Arc<dyn Communicator>> {
        let group = self
            .group
            .split(color, key)
            .map_err(|e| Call::Split.error(e))?;
        Ok(Arc::new(ArrayComm::new(group)))
    }
}
