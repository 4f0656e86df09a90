//! The native wire: ranks of this crate only, with a handshake on every connection, a
//! header on every collective and latency-optimal algorithms over connections between any
//! two ranks (see [`Wire::Native`](crate::Wire::Native)).
//!
//! - `hello`: the handshake each connection opens with (magic, version, capabilities,
//!   group size, both ranks, group and host identity), sans-IO;
//! - `bootstrap`: forming the mesh: the ring's neighbour connections plus one to every
//!   other rank, each through the hello (and, with a key, the authentication of
//!   [`crate::auth`]), into a [`Formed`];
//! - the data path: the collective header, the algorithms as state machines without I/O,
//!   and the engine that drives them over the [`Formed`] transport.

mod bootstrap;
mod hello;

use crate::ring::transport::Transport;

/// A formed native mesh, handed from the bootstrap to the data path.
///
/// `transport` holds the neighbours' connections as the MLX wire's ring does (connection
/// `i` to the left neighbour at index `i`, to the right one at `C + i`) and then one
/// connection to each rank that is not a neighbour, in increasing rank order (see
/// [`Transport::mesh`], [`Transport::send_conn`], [`Transport::recv_conn`]).
#[allow(dead_code, reason = "the native wire's, in progress")]
#[derive(Debug)]
pub(crate) struct Formed {
    /// Every connection, each of which completed the hello.
    pub(crate) transport: Transport,
    /// This rank.
    pub(crate) rank: usize,
    /// Ranks in the group.
    pub(crate) size: usize,
    /// What every rank said about itself, indexed by rank (this rank's own entry included).
    pub(crate) peers: Vec<Peer>,
    /// Ranks the hostfile puts on this host, this one included (for the spin policy).
    pub(crate) local_ranks: usize,
}

/// What a rank's hello said about it.
#[allow(dead_code, reason = "the native wire's, in progress")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Peer {
    /// Identifies the host the rank runs on: equal for ranks on one host (shared memory).
    pub(crate) host: [u8; 16],
    /// The capability bits it offered.
    pub(crate) capabilities: u64,
}
