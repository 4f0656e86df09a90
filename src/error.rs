//! The crate's one error type, sorted by whose fault a failure is.
//!
//! Transport failures ([`Error::Io`], [`Error::Closed`], [`Error::Rdma`], [`Error::Timeout`])
//! always name the peer rank and what this rank was doing with it, because "connection
//! reset" alone tells a user with eight Macs nothing. After one of them the group is failed: every later call
//! returns [`Error::Failed`] at once, carrying the original error. Argument errors
//! ([`Error::InvalidArgument`]) leave the group usable.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The crate's `Result`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What this rank was doing with a peer when something went wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PeerOp {
    /// Opening a connection to the peer's listening address.
    Connect,
    /// Waiting for the peer to connect to one of our addresses.
    Accept,
    /// Writing to the peer.
    Send,
    /// Reading from the peer.
    Receive,
}

impl fmt::Display for PeerOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PeerOp::Connect => "connect",
            PeerOp::Accept => "accept",
            PeerOp::Send => "send",
            PeerOp::Receive => "receive",
        })
    }
}

/// Everything that can go wrong in this crate.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The caller passed something unusable: buffer lengths that do not match, a rank out of
    /// range, an option out of bounds. The group stays usable.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// An environment variable is set to something unusable.
    #[error("environment variable {var}: {reason}")]
    Environment {
        /// The variable's name.
        var: &'static str,
        /// What is wrong with its value.
        reason: String,
    },

    /// A hostfile or device file could not be used. `path` is the file (or `<init_with>`
    /// for addresses passed in code).
    #[error("{}: {reason}", path.display())]
    Config {
        /// The file that was read.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },

    /// A system call failed while talking to a peer.
    #[error("rank {peer}{}: {op} failed during {context}: {source}", fmt_addr(*addr))]
    Io {
        /// The peer's rank.
        peer: usize,
        /// The address involved, when there is one.
        addr: Option<SocketAddr>,
        /// What this rank was doing.
        op: PeerOp,
        /// The collective or setup phase.
        context: &'static str,
        /// The operating system's error.
        #[source]
        source: Arc<io::Error>,
    },

    /// The peer closed its connection while this rank still expected bytes from it (or
    /// wanted to write to it): the peer exited, crashed or failed on its own.
    #[error("rank {peer}: connection closed by the peer during {context} ({op})")]
    Closed {
        /// The peer's rank.
        peer: usize,
        /// What this rank was doing.
        op: PeerOp,
        /// The collective or setup phase.
        context: &'static str,
    },

    /// A rank that is not this rank's neighbour was lost. The neighbour that noticed first
    /// said so (with a TCP urgent byte) before closing its connection to this rank.
    #[error(
        "rank {peer} was lost during {context} (reported by rank {via}, which then closed its connection)"
    )]
    Lost {
        /// The lost rank.
        peer: usize,
        /// The neighbour that reported it.
        via: usize,
        /// The collective or setup phase.
        context: &'static str,
    },

    /// Authenticating a connection with the pre-shared key failed: the peer did not prove
    /// it holds the key, refused this rank's proof, or is not the rank it should be.
    #[error("rank {peer}{}: authentication failed during {context}: {reason}", fmt_addr(*addr))]
    Auth {
        /// The peer's rank (as expected, or as it claimed).
        peer: usize,
        /// The address involved.
        addr: Option<SocketAddr>,
        /// The collective or setup phase.
        context: &'static str,
        /// What went wrong.
        reason: String,
    },

    /// The RDMA layer failed with a peer: a work request completed with an error status, a
    /// request could not be posted, or a queue pair towards the peer could not be set up.
    #[error("rank {peer}: RDMA {op} failed during {context}: {reason}")]
    Rdma {
        /// The peer's rank.
        peer: usize,
        /// What this rank was doing (`Connect` for queue-pair set-up).
        op: PeerOp,
        /// The collective or setup phase.
        context: &'static str,
        /// What the device or library reported.
        reason: String,
    },

    /// A peer made no progress for the whole timeout.
    #[error("rank {peer}{}: {op} timed out after {after:?} during {context}", fmt_addr(*addr))]
    Timeout {
        /// The peer's rank.
        peer: usize,
        /// The address involved, when there is one.
        addr: Option<SocketAddr>,
        /// What this rank was waiting for.
        op: PeerOp,
        /// The collective or setup phase.
        context: &'static str,
        /// How long it waited.
        after: Duration,
    },

    /// A local system resource failed: binding a listening address, creating the poller,
    /// mapping staging memory.
    #[error("{what}: {source}")]
    Local {
        /// What was being done, with the address or size involved.
        what: String,
        /// The operating system's error.
        #[source]
        source: Arc<io::Error>,
    },

    /// The group was closed with [`Group::close`](crate::Group::close).
    #[error("the group was closed; form a new one (init_with) to communicate again")]
    GroupClosed,

    /// The group failed earlier; the original error is inside. Close it and form a new one.
    #[error("the group failed earlier and cannot be used: {0}")]
    Failed(Arc<Error>),

    /// The backend does not offer this operation.
    #[error("not supported: {0}")]
    Unsupported(String),

    /// The backend cannot be used on this machine or build.
    #[error("backend {backend} is not available: {reason}")]
    Unavailable {
        /// The backend's name.
        backend: &'static str,
        /// Why not.
        reason: String,
    },
}

fn fmt_addr(addr: Option<SocketAddr>) -> String {
    addr.map(|a| format!(" ({a})")).unwrap_or_default()
}

impl Error {
    /// The peer rank this error names, if it is a transport error (or a group failure caused
    /// by one).
    pub fn peer(&self) -> Option<usize> {
        match self {
            Error::Io { peer, .. }
            | Error::Closed { peer, .. }
            | Error::Lost { peer, .. }
            | Error::Auth { peer, .. }
            | Error::Rdma { peer, .. }
            | Error::Timeout { peer, .. } => Some(*peer),
            Error::Failed(inner) => inner.peer(),
            _ => None,
        }
    }

    /// Whether this error leaves the group unusable (a transport failure), as opposed to a
    /// mistake in the arguments of one call.
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            Error::Io { .. }
                | Error::Closed { .. }
                | Error::Lost { .. }
                | Error::Rdma { .. }
                | Error::Timeout { .. }
                | Error::Failed(_)
        )
    }

    pub(crate) fn invalid(msg: impl Into<String>) -> Self {
        Error::InvalidArgument(msg.into())
    }

    pub(crate) fn local(what: impl Into<String>, source: io::Error) -> Self {
        Error::Local {
            what: what.into(),
            source: Arc::new(source),
        }
    }
}
