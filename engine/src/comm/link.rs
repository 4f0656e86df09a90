//! What carries a group's messages to each peer: the answer every backend gives to
//! [`Communicator::transport`](super::Communicator::transport).

/// What carries a group's messages between this rank and a peer, as the group negotiated
/// it when it formed ([`Group::transport`](crate::Group::transport)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, strum::Display, strum::IntoStaticStr)]
#[strum(serialize_all = "lowercase")]
#[non_exhaustive]
pub enum Transport {
    /// No link: the peer is this rank itself.
    Local,
    /// TCP: MLX's wire always; the native wire between hosts, with `NUVEC_DISTRIBUTED_SHM=0`,
    /// or when a co-located rank could not open the shared segment.
    Tcp,
    /// A shared-memory segment: the native wire, with every rank of the group on this host
    /// (collectives and send/recv; the TCP connections stay for setup and liveness). In a
    /// group over several hosts, the peers on this host: the group collectives' data
    /// between them go through the host's segment, while send/recv, broadcast and
    /// all_to_all stay on TCP.
    #[strum(serialize = "shared memory")]
    SharedMemory,
    /// RDMA (the JACCL backend).
    Rdma,
    /// A communicator that does not say (one of the caller's own, see [`Group::new`](crate::Group::new)).
    Unknown,
}

impl Transport {
    /// A short name: `local`, `tcp`, `shared memory`, `rdma`, `unknown`.
    pub fn name(self) -> &'static str {
        self.into()
    }
}
