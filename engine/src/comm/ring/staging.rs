//! Page-aligned buffers the ring receives into before reducing, mapped when the group forms.
//!
//! A reducing step cannot land a peer's bytes in the caller's array (they must be combined
//! with what is there), so each parallel lane owns a staging buffer: bytes are read into it
//! and folded into the array as soon as whole elements have arrived, while the rest of the
//! segment is still on the wire. Steps that overwrite receive straight into the caller's
//! memory and never touch these. The buffers are anonymous mappings (page-aligned, so every
//! element type is aligned in them) and are locked into memory where the memlock limit
//! allows; where it does not, they stay unlocked, which costs nothing but a possible page
//! fault.
//!
//! Every buffer is mapped before any byte moves: at formation, and for a sum_scatter whose
//! partial sums outgrow what formation mapped, when it is planned. The data path itself
//! never maps, so it cannot fail locally, and a mapping failure is a [`Error::Local`]
//! naming no peer.

use std::io;

use memmap2::MmapMut;

use crate::error::{Error, Result};

/// Bytes each lane reads at most per system call while reducing. Big enough that a 64 MiB
/// reduction needs few reads, small enough to stay in L2 while it is folded in.
pub(crate) const LANE_STAGE_BYTES: usize = 1 << 20;

/// Bytes of sum_scatter partial sums (both halves) each lane gets when the group forms:
/// enough for pieces of 128 KiB without growing.
pub(crate) const LANE_PARTIAL_BYTES: usize = 256 << 10;

/// One lane's buffers.
#[derive(Debug)]
pub(crate) struct LaneStage {
    /// Where a reducing step's bytes land before they are folded in.
    pub(crate) recv: MmapMut,
    /// Two partial sums for sum_scatter, alternated step by step.
    partials: MmapMut,
}

impl LaneStage {
    fn new() -> io::Result<Self> {
        Ok(Self {
            recv: map(LANE_STAGE_BYTES)?,
            partials: map(LANE_PARTIAL_BYTES)?,
        })
    }

    /// The receive buffer and two partial-sum buffers of `len` bytes each, for a
    /// sum_scatter step. [`Staging::reserve`] made room for them.
    pub(crate) fn split(&mut self, len: usize) -> (&mut [u8], &mut [u8], &mut [u8]) {
        let (even, odd) = self.partials[..2 * len].split_at_mut(len);
        (&mut self.recv, even, odd)
    }

    /// The two partial-sum buffers of [`LaneStage::split`].
    pub(crate) fn partials(&self, len: usize) -> (&[u8], &[u8]) {
        self.partials[..2 * len].split_at(len)
    }
}

/// Every buffer one ring needs.
#[derive(Debug)]
pub(crate) struct Staging {
    /// One per possible lane: 2 per connection pair.
    pub(crate) lanes: Vec<LaneStage>,
}

impl Staging {
    /// Buffers for a ring with `connections` connections per neighbour.
    pub(crate) fn new(connections: usize) -> Result<Self> {
        let lanes = (0..2 * connections)
            .map(|_| LaneStage::new())
            .collect::<io::Result<_>>()
            .map_err(|e| Error::local("mapping the ring's staging buffers", e))?;
        Ok(Self { lanes })
    }

    /// Buffers for the simulator: receive buffers of `recv_bytes` (small ones make the
    /// partial element carry cross their end often) and tiny partial sums.
    #[cfg(test)]
    pub(crate) fn for_tests(connections: usize, recv_bytes: usize) -> Self {
        let lanes = (0..2 * connections)
            .map(|_| LaneStage {
                recv: map(recv_bytes).expect("mapping test staging"),
                partials: map(64).expect("mapping test staging"),
            })
            .collect();
        Self { lanes }
    }

    /// Makes every lane's partial sums hold two pieces of `len` bytes, mapping larger
    /// buffers (kept for the group's lifetime) if they do not yet.
    pub(crate) fn reserve(&mut self, len: usize) -> Result<()> {
        let need = 2 * len;
        for lane in &mut self.lanes {
            if lane.partials.len() < need {
                lane.partials = map(need).map_err(|e| {
                    Error::local(
                        format!("mapping {need} bytes of sum_scatter partial sums"),
                        e,
                    )
                })?;
            }
        }
        Ok(())
    }
}

/// An anonymous, page-aligned, pre-faulted mapping, locked if the memlock limit allows.
fn map(len: usize) -> io::Result<MmapMut> {
    #[cfg(test)]
    if fault::MAP_FAILS.get() {
        return Err(io::Error::from(io::ErrorKind::OutOfMemory));
    }
    let map = memmap2::MmapOptions::new().len(len).populate().map_anon()?;
    // Locking is an optimisation: without CAP_IPC_LOCK the limit is often 8 MiB, and a
    // group that could not lock its buffers works the same.
    let _ = map.lock();
    Ok(map)
}

/// Fault injection for tests: makes this thread's mappings fail.
#[cfg(test)]
pub(crate) mod fault {
    use std::cell::Cell;

    thread_local! {
        pub(crate) static MAP_FAILS: Cell<bool> = const { Cell::new(false) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failing<T>(f: impl FnOnce() -> T) -> T {
        fault::MAP_FAILS.set(true);
        let out = f();
        fault::MAP_FAILS.set(false);
        out
    }

    #[test]
    fn a_mapping_failure_at_formation_is_local_and_names_no_peer() {
        let error = failing(|| Staging::new(2)).unwrap_err();
        assert!(matches!(error, Error::Local { .. }), "{error:?}");
        assert_eq!(error.peer(), None);
        assert!(!error.is_fatal(), "{error:?}");
        assert!(error.to_string().contains("staging"), "{error}");
    }

    #[test]
    fn a_mapping_failure_when_partials_grow_is_local_and_names_no_peer() {
        let mut staging = Staging::new(1).unwrap();
        // Within what formation mapped: nothing to map, so nothing can fail.
        failing(|| staging.reserve(LANE_PARTIAL_BYTES / 2)).unwrap();
        let error = failing(|| staging.reserve(LANE_PARTIAL_BYTES)).unwrap_err();
        assert!(matches!(error, Error::Local { .. }), "{error:?}");
        assert_eq!(error.peer(), None);
        assert!(!error.is_fatal(), "{error:?}");
        // The group's buffers are intact and grow once mapping works again.
        staging.reserve(LANE_PARTIAL_BYTES).unwrap();
        let (recv, even, odd) = staging.lanes[1].split(LANE_PARTIAL_BYTES);
        assert_eq!(
            (recv.len(), even.len(), odd.len()),
            (LANE_STAGE_BYTES, LANE_PARTIAL_BYTES, LANE_PARTIAL_BYTES)
        );
    }
}
