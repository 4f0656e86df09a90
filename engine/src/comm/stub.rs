//! [`Stub`], the communicator that tests and benchmarks put under a [`Group`](crate::Group)
//! when they need one that no backend formed.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::algorithm::Algorithm;
use super::{Communicator, FlightOp};
use crate::element::DType;
use crate::error::{Error, PeerOp, Phase, Result};
use crate::reduce::ReduceOp;

/// Rank `rank` of `size` ranks, over a transport that moves nothing and never waits: for
/// tests and benchmarks, not part of the API.
///
/// Every call returns at once and succeeds, leaving the data as it is, except a receive,
/// which times out blaming its source. After [`Communicator::close`] every call fails with
/// [`Error::GroupClosed`], as the trait asks. An all-reduce names the algorithm the native
/// wire takes for it at P = 2 over TCP (one-shot up to 32 KiB, ring above); other calls
/// name none. Broadcast and all_to_all keep the trait's defaults, which refuse.
#[derive(Debug)]
pub struct Stub {
    rank: usize,
    size: usize,
    backend: &'static str,
    closed: AtomicBool,
}

impl Stub {
    /// Rank 0 of `size` ranks, naming itself `backend`.
    pub fn new(size: usize, backend: &'static str) -> Stub {
        Stub {
            rank: 0,
            size,
            backend,
            closed: AtomicBool::new(false),
        }
    }

    /// The same communicator as rank `rank`.
    pub fn at_rank(self, rank: usize) -> Stub {
        Stub { rank, ..self }
    }

    /// What a call answers unless it fails for its own reason: whether the stub is closed.
    fn open(&self) -> Result<()> {
        if self.closed.load(Ordering::Relaxed) {
            Err(Error::GroupClosed)
        } else {
            Ok(())
        }
    }
}

impl Communicator for Stub {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn backend(&self) -> &'static str {
        self.backend
    }
    fn all_reduce(&self, _: ReduceOp, _: DType, data: &mut [u8]) -> Result<()> {
        // Opaque to the optimiser, so that a benchmark calling this directly times a call.
        black_box(data);
        self.open()
    }
    fn all_gather(&self, _: &[u8], _: &mut [u8]) -> Result<()> {
        self.open()
    }
    fn sum_scatter(&self, _: DType, _: &[u8], _: &mut [u8]) -> Result<()> {
        self.open()
    }
    fn send(&self, _: &[u8], _: usize) -> Result<()> {
        self.open()
    }
    fn recv(&self, _: &mut [u8], src: usize) -> Result<()> {
        self.open()?;
        Err(Error::Timeout {
            peer: src,
            addr: None,
            op: PeerOp::Receive,
            context: Phase::Recv,
            after: Duration::from_secs(1),
        })
    }
    fn barrier(&self) -> Result<()> {
        self.open()
    }
    fn health(&self) -> Result<()> {
        self.open()
    }
    fn close(&self) -> Result<()> {
        self.closed.store(true, Ordering::Relaxed);
        Ok(())
    }
    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }
    fn algorithm(&self, op: FlightOp, _: Option<DType>, bytes: usize) -> Option<Algorithm> {
        // The size opaque too, so that a benchmark times the comparison a table lookup makes.
        match op {
            FlightOp::AllReduce(_) if black_box(bytes) <= 32 << 10 => Some(Algorithm::OneShot),
            FlightOp::AllReduce(_) => Some(Algorithm::Ring),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_succeed_but_a_receive_until_closed() {
        let stub = Stub::new(3, "stub").at_rank(2);
        assert_eq!((stub.rank(), stub.size(), stub.backend()), (2, 3, "stub"));
        stub.all_reduce(ReduceOp::Sum, DType::F32, &mut [0; 8])
            .unwrap();
        stub.barrier().unwrap();
        let e = stub.recv(&mut [0; 4], 1).unwrap_err();
        assert!(matches!(e, Error::Timeout { peer: 1, .. }), "{e}");
        assert!(!stub.is_closed());
        stub.close().unwrap();
        stub.close().unwrap();
        assert!(stub.is_closed());
        assert!(matches!(stub.health(), Err(Error::GroupClosed)));
        assert!(matches!(stub.barrier(), Err(Error::GroupClosed)));
    }
}
