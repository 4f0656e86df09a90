//! The fabric: what the algorithms need from RDMA, and nothing else.
//!
//! A fabric has numbered connections (queue pairs; the backend numbers them) and buffers
//! ([`BufId`]), each allocated and registered with the connections its [`BufferSpec`] names.
//! The algorithms fill a buffer, post it as one whole-buffer SEND on a connection, post
//! buffers to receive into, and poll each connection's completions. Two fabrics implement
//! it: [`VerbsFabric`](super::verbs::VerbsFabric), on real queue pairs, and
//! `EmulatedFabric` (tests), which models Apple's transport in memory. The algorithms cannot
//! tell them apart.
//!
//! Buffers change hands as they do with the hardware: a posted buffer belongs to the fabric
//! until its completion is polled, and asking for its bytes meanwhile is an error rather than
//! a data race. The [`Pool`] here keeps that bookkeeping for both fabrics.

use std::sync::Arc;

/// One buffer of a fabric: its index in the [`BufferSpec`]s the fabric was opened with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct BufId(pub(crate) u32);

/// What a fabric allocates for one buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BufferSpec {
    /// Its length in bytes: every message it carries is the whole buffer.
    pub(crate) bytes: usize,
    /// The connections it is registered with; empty means it is never used and need not be
    /// allocated (its [`BufId`] still exists, so that numbering does not depend on which
    /// buffers are used).
    pub(crate) conns: Vec<usize>,
}

/// How a fabric sets up its queue pairs: the backend's choices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Queues {
    /// The depth of each send and receive queue; the completion queue, shared by both,
    /// holds twice as many.
    pub(crate) depth: u32,
    /// The packet sequence number every queue pair starts at and advertises.
    pub(crate) psn: u32,
}

/// How to reach one queue pair: what each rank publishes for each of its connections, and
/// what a connection is connected to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Destination {
    /// The port's LID (a C `int`, as the side channel carries it); negative for a
    /// connection that does not exist.
    pub(crate) lid: i32,
    /// The queue-pair number.
    pub(crate) qpn: u32,
    /// The starting packet sequence number.
    pub(crate) psn: u32,
    /// The GID (an IPv4-mapped address on Thunderbolt).
    pub(crate) gid: [u8; 16],
}

/// A fabric's own error text; the group turns it into an [`Error`](crate::Error) naming the
/// peer.
pub(crate) type FabricResult<T> = std::result::Result<T, String>;

/// A finished work request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Completion {
    /// The connection it was posted on.
    pub(crate) conn: usize,
    /// Whether it was a receive (else a send).
    pub(crate) recv: bool,
    /// The tag the algorithm posted it with (its low 32 bits, see [`pack_wr`]).
    pub(crate) tag: u64,
    /// Success, or what the device reported.
    pub(crate) status: Result<(), String>,
}

/// RDMA as the algorithms see it.
pub(crate) trait Fabric: Send {
    /// What the peer needs to reach connection `conn` (queue pair number, LID, GID, PSN).
    fn local(&mut self, conn: usize) -> FabricResult<Destination>;

    /// Connects `conn` to the peer's queue pair `remote` (RTR, then RTS).
    fn connect(&mut self, conn: usize, remote: &Destination) -> FabricResult<()>;

    /// The bytes of buffer `id`, to fill before a send or read after a receive.
    ///
    /// Fails if the buffer is in flight or was never allocated.
    fn buffer(&mut self, id: BufId) -> FabricResult<&mut [u8]>;

    /// Posts a SEND of the whole of buffer `id` on `conn`, tagged `tag` (32 bits).
    fn post_send(&mut self, conn: usize, id: BufId, tag: u64) -> FabricResult<()>;

    /// Posts a receive into the whole of buffer `id` on `conn`, tagged `tag` (32 bits).
    fn post_recv(&mut self, conn: usize, id: BufId, tag: u64) -> FabricResult<()>;

    /// Appends what completed on `conn` to `out`.
    fn poll(&mut self, conn: usize, out: &mut Vec<Completion>) -> FabricResult<()>;

    /// Blocks up to `wait` until something may have completed, if the fabric can tell;
    /// returns `false` at once if it cannot. Queue pairs without a completion channel (MLX
    /// creates none; the verbs fabric does when the library has them) cannot, and the
    /// engine sleeps on the backend's [`Liveness`](super::engine::Liveness) instead.
    /// Returning `true` without blocking is allowed (the verbs fabric does so once to arm
    /// its queues): the caller polls again.
    fn wait(&mut self, wait: std::time::Duration) -> bool {
        let _ = wait;
        false
    }
}

/// Memory a [`Pool`] hands out.
pub(crate) trait FrameMemory: Send + Sync {
    /// The bytes, for the sole owner.
    fn bytes_mut(&mut self) -> &mut [u8];
}

impl FrameMemory for Vec<u8> {
    fn bytes_mut(&mut self) -> &mut [u8] {
        self
    }
}

/// A group's buffers, each either home (`Some`, possibly shared with sends in flight) or
/// lent to a receive (`None`).
pub(crate) struct Pool<B> {
    slots: Vec<Option<Arc<B>>>,
}

impl<B: FrameMemory> Pool<B> {
    /// A pool over `buffers`, indexed by [`BufId`]; `None` for buffers never allocated.
    pub(crate) fn new(buffers: Vec<Option<B>>) -> Self {
        Pool {
            slots: buffers.into_iter().map(|b| b.map(Arc::new)).collect(),
        }
    }

    fn slot(&mut self, id: BufId) -> FabricResult<&mut Option<Arc<B>>> {
        self.slots
            .get_mut(id.0 as usize)
            .ok_or_else(|| format!("buffer {} does not exist", id.0))
    }

    /// The bytes of a buffer that is home and not shared with a send in flight.
    pub(crate) fn bytes(&mut self, id: BufId) -> FabricResult<&mut [u8]> {
        match self.slot(id)? {
            Some(buf) => Arc::get_mut(buf)
                .map(FrameMemory::bytes_mut)
                .ok_or_else(|| format!("buffer {} is still being sent", id.0)),
            None => Err(format!(
                "buffer {} is receiving (or was never allocated)",
                id.0
            )),
        }
    }

    /// A reference for a send: the buffer stays home, shared until the send completes.
    pub(crate) fn lend_for_send(&mut self, id: BufId) -> FabricResult<Arc<B>> {
        match self.slot(id)? {
            Some(buf) => Ok(buf.clone()),
            None => Err(format!(
                "buffer {} is receiving (or was never allocated)",
                id.0
            )),
        }
    }

    /// The buffer itself, for a receive: it leaves home until the receive completes, and must
    /// not be shared with a send.
    pub(crate) fn lend_for_recv(&mut self, id: BufId) -> FabricResult<Arc<B>> {
        let slot = self.slot(id)?;
        match slot.take() {
            Some(mut buf) => {
                if Arc::get_mut(&mut buf).is_some() {
                    Ok(buf)
                } else {
                    *slot = Some(buf);
                    Err(format!("buffer {} is still being sent", id.0))
                }
            }
            None => Err(format!(
                "buffer {} is already receiving (or was never allocated)",
                id.0
            )),
        }
    }

    /// Takes back a buffer a completion returned: a receive's comes home, a send's reference
    /// is dropped.
    pub(crate) fn give_back(&mut self, id: BufId, buf: Arc<B>) {
        if let Some(slot) = self.slots.get_mut(id.0 as usize)
            && slot.is_none()
        {
            *slot = Some(buf);
        }
    }
}

/// A fabric-level work-request id: the buffer in the high half, the algorithm's tag in the
/// low half, so a completion finds its buffer without a table. The id never leaves the
/// process: the verbs binding gives the library slot numbers of its own.
pub(crate) fn pack_wr(id: BufId, tag: u64) -> u64 {
    u64::from(id.0) << 32 | (tag & 0xffff_ffff)
}

/// The buffer and tag of a [`pack_wr`] id.
pub(crate) fn unpack_wr(wr: u64) -> (BufId, u64) {
    (BufId((wr >> 32) as u32), wr & 0xffff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooled_buffers_are_lent_as_the_hardware_would_hold_them() {
        let mut pool = Pool::new(vec![Some(vec![0u8; 8]), None, Some(vec![0u8; 8])]);
        let a = BufId(0);
        pool.bytes(a).unwrap()[0] = 5;
        // A send shares the buffer: no writing until it is back.
        let sent = pool.lend_for_send(a).unwrap();
        let again = pool.lend_for_send(a).unwrap();
        assert!(pool.bytes(a).unwrap_err().contains("being sent"));
        assert!(pool.lend_for_recv(a).unwrap_err().contains("being sent"));
        pool.give_back(a, sent);
        assert!(pool.bytes(a).is_err());
        pool.give_back(a, again);
        assert_eq!(pool.bytes(a).unwrap()[0], 5);
        // A receive takes it away entirely.
        let c = BufId(2);
        let mut recv = pool.lend_for_recv(c).unwrap();
        assert!(pool.bytes(c).unwrap_err().contains("receiving"));
        assert!(pool.lend_for_send(c).is_err());
        Arc::get_mut(&mut recv).unwrap()[1] = 9;
        pool.give_back(c, recv);
        assert_eq!(pool.bytes(c).unwrap()[1], 9);
        // Never allocated, or out of range.
        assert!(pool.bytes(BufId(1)).is_err());
        assert!(pool.bytes(BufId(7)).unwrap_err().contains("does not exist"));
    }

    #[test]
    fn work_request_ids_carry_the_buffer_and_the_tag() {
        let wr = pack_wr(BufId(77), 0x2_01_03);
        assert_eq!(unpack_wr(wr), (BufId(77), 0x2_01_03));
    }
}
