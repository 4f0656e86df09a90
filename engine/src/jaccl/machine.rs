//! What every JACCL algorithm shares as an RDMA [`Machine`]: each of its requests carries a
//! [`WorkTag`] and is counted until its completion comes in, and the machine is finished once
//! it has started, nothing it posted is outstanding and its own work is done.
//!
//! [`Counted`] keeps that account around an [`Algorithm`] (the mesh's and the ring's
//! machines), which posts through [`Post`] and sees each completion with its tag decoded, so
//! the algorithms hold only their own state.

use super::buffers::Mem;
use super::frames::WorkTag;
use crate::error::Result;
use crate::transport::rdma::engine::{Cx, Machine};
use crate::transport::rdma::fabric::BufId;

/// A completed request: the connection it was posted on and the tag it was posted with.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Done {
    pub(crate) conn: usize,
    pub(crate) tag: WorkTag,
}

/// One JACCL algorithm's own state machine; [`Counted`] makes it an engine [`Machine`].
pub(crate) trait Algorithm {
    /// Posts the first requests.
    fn begin(&mut self, cx: &mut Post<'_, '_>, mem: &mut Mem<'_>) -> Result<()>;

    /// Handles the completion of a request this algorithm posted (no longer counted).
    fn completed(&mut self, cx: &mut Post<'_, '_>, mem: &mut Mem<'_>, done: Done) -> Result<()>;

    /// Whether the algorithm's own work is done once nothing is outstanding (the mesh
    /// all-reduce also has chunks left to reduce).
    fn done(&self) -> bool {
        true
    }

    /// Whether completions on `conn` are this algorithm's.
    fn owns(&self, conn: usize) -> bool;
}

/// What an [`Algorithm`] posts through: the engine's context, counting every request until
/// its completion comes in.
pub(crate) struct Post<'p, 'a> {
    cx: &'p mut Cx<'a>,
    in_flight: &'p mut usize,
}

impl Post<'_, '_> {
    /// Posts a SEND of buffer `buf` on `conn`, tagged `tag`.
    pub(crate) fn post_send(&mut self, conn: usize, buf: BufId, tag: WorkTag) -> Result<()> {
        self.cx.post_send(conn, buf, tag.encode())?;
        *self.in_flight += 1;
        Ok(())
    }

    /// Posts a receive into buffer `buf` on `conn`, tagged `tag`.
    pub(crate) fn post_recv(&mut self, conn: usize, buf: BufId, tag: WorkTag) -> Result<()> {
        self.cx.post_recv(conn, buf, tag.encode())?;
        *self.in_flight += 1;
        Ok(())
    }

    /// The bytes of buffer `buf`, used with `conn` (see [`Cx::buffer`]).
    pub(crate) fn buffer(&mut self, conn: usize, buf: BufId) -> Result<&mut [u8]> {
        self.cx.buffer(conn, buf)
    }

    /// Fills the front of buffer `buf` with `bytes` (see [`Cx::fill`]).
    pub(crate) fn fill(&mut self, conn: usize, buf: BufId, bytes: &[u8]) -> Result<()> {
        self.cx.fill(conn, buf, bytes)
    }

    /// Whether every request posted so far has completed.
    pub(crate) fn idle(&self) -> bool {
        *self.in_flight == 0
    }
}

/// An [`Algorithm`] with its account of requests: the engine's [`Machine`].
pub(crate) struct Counted<A> {
    algorithm: A,
    started: bool,
    in_flight: usize,
}

impl<A> Counted<A> {
    pub(crate) fn new(algorithm: A) -> Self {
        Counted {
            algorithm,
            started: false,
            in_flight: 0,
        }
    }
}

impl<A: Algorithm> Machine<Mem<'_>> for Counted<A> {
    fn start(&mut self, cx: &mut Cx<'_>, mem: &mut Mem<'_>) -> Result<()> {
        self.started = true;
        let in_flight = &mut self.in_flight;
        self.algorithm.begin(&mut Post { cx, in_flight }, mem)
    }

    fn handle_completion(
        &mut self,
        cx: &mut Cx<'_>,
        mem: &mut Mem<'_>,
        conn: usize,
        tag: u64,
    ) -> Result<()> {
        self.in_flight -= 1;
        let done = Done {
            conn,
            tag: WorkTag::decode(tag),
        };
        let in_flight = &mut self.in_flight;
        self.algorithm
            .completed(&mut Post { cx, in_flight }, mem, done)
    }

    fn is_finished(&self) -> bool {
        self.started && self.in_flight == 0 && self.algorithm.done()
    }

    fn owns(&self, conn: usize) -> bool {
        self.algorithm.owns(conn)
    }
}
