//! Page-aligned buffers the ring receives into before reducing, allocated once per group.
//!
//! A reducing step cannot land a peer's bytes in the caller's array (they must be combined
//! with what is there), so each parallel lane owns a staging buffer: bytes are read into it
//! and folded into the array as soon as whole elements have arrived, while the rest of the
//! segment is still on the wire. Steps that overwrite receive straight into the caller's
//! memory and never touch these. The buffers are anonymous mappings (page-aligned, so every
//! element type is aligned in them) and are locked into memory where the memlock limit
//! allows; where it does not, they stay unlocked, which costs nothing but a possible page
//! fault.

use std::io;

use memmap2::MmapMut;

/// Bytes each lane reads at most per system call while reducing. Big enough that a 64 MiB
/// reduction needs few reads, small enough to stay in L2 while it is folded in.
pub(crate) const LANE_STAGE_BYTES: usize = 1 << 20;

/// One lane's buffers.
#[derive(Debug)]
pub(crate) struct LaneStage {
    /// Where a reducing step's bytes land before they are folded in.
    pub(crate) recv: MmapMut,
    /// Two partial sums for sum_scatter, alternated step by step; grown on first use.
    partials: Option<MmapMut>,
}

impl LaneStage {
    fn new() -> io::Result<Self> {
        Ok(Self {
            recv: map(LANE_STAGE_BYTES)?,
            partials: None,
        })
    }

    /// The receive buffer and two partial-sum buffers of `len` bytes each, for a
    /// sum_scatter step. The partials are mapped on first use and kept for the group's
    /// lifetime; every step of one collective asks for the same length.
    pub(crate) fn split(&mut self, len: usize) -> io::Result<(&mut [u8], &mut [u8], &mut [u8])> {
        let need = 2 * len;
        if self.partials.as_ref().is_none_or(|m| m.len() < need) {
            self.partials = Some(map(need.max(4096))?);
        }
        let partials = self
            .partials
            .as_mut()
            .map(|m| &mut m[..need])
            .unwrap_or_default();
        let (even, odd) = partials.split_at_mut(len);
        Ok((&mut self.recv, even, odd))
    }

    /// The two partial-sum buffers of [`LaneStage::split`].
    pub(crate) fn partials(&mut self, len: usize) -> io::Result<(&mut [u8], &mut [u8])> {
        self.split(len).map(|(_, even, odd)| (even, odd))
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
    pub(crate) fn new(connections: usize) -> io::Result<Self> {
        Ok(Self {
            lanes: (0..2 * connections)
                .map(|_| LaneStage::new())
                .collect::<io::Result<_>>()?,
        })
    }
}

/// An anonymous, page-aligned, pre-faulted mapping, locked if the memlock limit allows.
fn map(len: usize) -> io::Result<MmapMut> {
    let map = memmap2::MmapOptions::new().len(len).populate().map_anon()?;
    // Locking is an optimisation: without CAP_IPC_LOCK the limit is often 8 MiB, and a
    // group that could not lock its buffers works the same.
    let _ = map.lock();
    Ok(map)
}
