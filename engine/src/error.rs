//! The crate's one error type, sorted by whose fault a failure is.
//!
//! See [`Fault`] for the classes, with a table of what to do about each.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The crate's `Result`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What this rank was doing with a peer when something went wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, strum::Display)]
#[strum(serialize_all = "lowercase")]
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

/// The phase of a group's life an error happened in: forming it, one of its collectives, or a
/// health check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, strum::Display, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
#[non_exhaustive]
pub enum Phase {
    /// Forming a group on MLX's wire: listening, dialling, the handshake.
    #[strum(serialize = "ring setup")]
    RingSetup,
    /// Forming a group on the native wire: listening, dialling, the hello, and the
    /// shared-memory segment where the ranks map one.
    #[strum(serialize = "native setup")]
    NativeSetup,
    /// Forming a JACCL group: the side channel and the queue pairs.
    #[strum(serialize = "jaccl setup")]
    JacclSetup,
    /// An `all_sum` (and `barrier`, which is one).
    AllSum,
    /// An `all_max`.
    AllMax,
    /// An `all_min`.
    AllMin,
    /// An `all_gather`.
    AllGather,
    /// A `sum_scatter`.
    SumScatter,
    /// A `send`.
    Send,
    /// A `recv`.
    Recv,
    /// A `broadcast`.
    Broadcast,
    /// An `all_to_all`.
    AllToAll,
    /// [`Group::health`](crate::Group::health).
    #[strum(serialize = "health check")]
    HealthCheck,
}

impl Phase {
    /// The phase's name in messages: the collective's name as in MLX, or the setup step.
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// Everything that can go wrong in this crate.
///
/// # Printing
///
/// `{}` and `{:?}` both print the message ("rank 1 (10.0.0.2:5000): connect failed during
/// ring setup: Connection refused (os error 111)"), as `anyhow`'s errors do, so an error
/// returned from `main` (which Rust prints with `{:?}`), `unwrap`'s panic and a log line
/// read as a sentence rather than a struct. `{:#?}` (`dbg!`, pretty debug output) prints
/// the variant and its fields; in code, match the variants or ask [`Error::fault`] and
/// [`Error::peer`]. The variant's name alone is `<&str>::from(&e)`, as the flight
/// recorder's [`FlightOutcome::Failed`](crate::FlightOutcome::Failed) records it.
///
/// ```
/// use nuvec_distributed_engine::Error;
///
/// let e = Error::Environment { var: "MLX_RANK", reason: "\"x\" is not a rank".into() };
/// assert_eq!(<&str>::from(&e), "Environment");
/// assert_eq!(format!("{e:?}"), format!("{e}"));
/// assert_eq!(format!("{e:?}"), r#"environment variable MLX_RANK: "x" is not a rank"#);
/// assert!(format!("{e:#?}").starts_with("Environment {\n    var: \"MLX_RANK\","));
/// ```
///
/// # Examples
///
/// Sorting an error by its class ([`Error::fault`]) rather than by variant, which may grow:
///
/// ```
/// use nuvec_distributed_engine::{Error, Fault, Group};
///
/// fn what_to_do(e: &Error) -> &'static str {
///     match e.fault() {
///         Fault::Misuse => "fix the call; the group is still usable",
///         Fault::PeerFailed | Fault::FailedEarlier | Fault::PeerMisbehaved => "close and re-form",
///         Fault::Closed => "form a new group",
///         _ => "fix the configuration or the machine",
///     }
/// }
///
/// let group = Group::single();
/// let err = group.all_gather(&[1u8, 2], &mut [0u8; 3]).unwrap_err();
/// assert!(matches!(err, Error::InvalidArgument(_)));
/// assert_eq!(what_to_do(&err), "fix the call; the group is still usable");
/// assert_eq!(err.peer(), None); // no peer to blame
/// assert!(err.to_string().starts_with("invalid argument: all_gather"), "{err}");
/// ```
#[derive(Clone, thiserror::Error, strum::IntoStaticStr)]
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
    #[error(
        "rank {peer}{}: {op} failed during {context}: {source}{}",
        fmt_addr(*addr),
        fd_limit_hint(source)
    )]
    Io {
        /// The peer's rank.
        peer: usize,
        /// The address involved, when there is one.
        addr: Option<SocketAddr>,
        /// What this rank was doing.
        op: PeerOp,
        /// The collective or setup phase.
        context: Phase,
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
        context: Phase,
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
        context: Phase,
    },

    /// Authenticating a connection with the pre-shared key failed: the peer did not prove
    /// it holds the key, refused this rank's proof, or is not the rank it should be; or,
    /// on a keyed native connection, a sealed record from it did not authenticate (bytes
    /// altered, injected, replayed, reordered or dropped on the way).
    #[error("rank {peer}{}: authentication failed during {context}: {reason}", fmt_addr(*addr))]
    Auth {
        /// The peer's rank (as expected, or as it claimed).
        peer: usize,
        /// The address involved.
        addr: Option<SocketAddr>,
        /// The collective or setup phase.
        context: Phase,
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
        context: Phase,
        /// What the device or library reported.
        reason: String,
    },

    /// A peer made no progress for the whole timeout. With [`PeerOp::Accept`] it never
    /// connected to this rank while the group formed.
    #[error("{}", fmt_timeout(*peer, *addr, *op, *context, *after))]
    Timeout {
        /// The peer's rank.
        peer: usize,
        /// The peer's address, when there is one: the one this rank dialled, or for
        /// [`PeerOp::Accept`] the peer's own as the hostfile gives it.
        addr: Option<SocketAddr>,
        /// What this rank was waiting for.
        op: PeerOp,
        /// The collective or setup phase.
        context: Phase,
        /// How long it waited.
        after: Duration,
    },

    /// A peer sent bytes its protocol does not allow (a side-channel record out of range, a
    /// rank claimed twice): it runs another program, another version, or has a bug.
    #[error("rank {peer}{}: protocol violation during {context}: {reason}", fmt_addr(*addr))]
    PeerMisbehaved {
        /// The peer's rank (as it claimed, when it claimed one).
        peer: usize,
        /// The address involved, when there is one.
        addr: Option<SocketAddr>,
        /// The collective or setup phase.
        context: Phase,
        /// What it sent.
        reason: String,
    },

    /// A peer cannot work with this rank: another protocol version, group size or wire. (A
    /// different key is [`Error::Auth`].)
    #[error("rank {peer}{}: incompatible during {context}: {reason}", fmt_addr(*addr))]
    PeerIncompatible {
        /// The peer's rank.
        peer: usize,
        /// The address involved, when there is one.
        addr: Option<SocketAddr>,
        /// The collective or setup phase.
        context: Phase,
        /// What differs.
        reason: String,
    },

    /// Two ranks made different calls where the native wire needs the same one (another
    /// collective, op, dtype or length; a `recv` of another length than the `send`): a bug
    /// in the program. Only the native wire can tell, from the header each message carries;
    /// MLX's wire has none. The group fails: the calls after it are out of step on the
    /// wire too.
    #[error("{}", fmt_mismatch(*seq, *point_to_point, (*rank, call), (*peer, peer_call), differs))]
    Mismatch {
        /// The number of the collective (per group), or of the message from the sender to
        /// the receiver, for send/recv.
        seq: u64,
        /// Whether it is a send/recv pair rather than a group collective.
        point_to_point: bool,
        /// This rank.
        rank: usize,
        /// This rank's call, as in "all_sum float32 x 10".
        call: String,
        /// The peer whose header differed.
        peer: usize,
        /// The peer's call.
        peer_call: String,
        /// What differs between the two calls, in words (the collective, op, dtype,
        /// length or root), or, when the calls are the same but their numbers are not,
        /// that a message was lost, duplicated or replayed; empty when not known.
        differs: String,
        /// The collective this rank was in.
        context: Phase,
    },

    /// A bug in this crate: an internal invariant did not hold. It names no peer, because
    /// none is at fault; please report it.
    #[error("internal error (a bug in nuvec-distributed) during {context}: {what}")]
    Bug {
        /// The collective or setup phase.
        context: Phase,
        /// The invariant that failed.
        what: String,
    },

    /// A local system resource failed: binding a listening address, creating the poller,
    /// mapping staging memory.
    #[error("{what}: {source}{}", fd_limit_hint(source))]
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

    /// [`Group::shrink`](crate::Group::shrink) did not take this rank in: no survivor
    /// answered it, because the survivors formed a group without it (it was stopped or cut
    /// off while they agreed) or every other rank failed; or the ranks it agreed with are
    /// not more than half of the group (a shrink keeps a majority, so that two parts of a
    /// group never both form). Its group is closed; started
    /// again with a plain `init`, it joins the survivors' [`Group::rejoin`](crate::Group::rejoin).
    #[error(
        "shrink: first rank {rank} is left out of the shrunk group after {after:.1?}: {why}; \
         the survivors formed a group without this rank, or too few ranks survived"
    )]
    Excluded {
        /// This rank's rank in the first group.
        rank: usize,
        /// How long it tried.
        after: std::time::Duration,
        /// What it saw last.
        why: String,
    },

    /// The collective was interrupted: the group was closed by another thread during
    /// `context` ([`Group::close`](crate::Group::close) from any thread aborts a collective
    /// in flight). No peer failed and none is blamed; the peers see this rank close its
    /// connections. Form a new group to communicate again.
    #[error("{context}: aborted: the group was closed by another thread during the call")]
    Aborted {
        /// The collective that was interrupted.
        context: Phase,
    },

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

/// The `match` of `{:#?}`: each variant written as a derived `Debug` writes it, its name
/// and then its fields (a tuple variant's one field, a struct variant's by name). Variants
/// come in three lists, tuple; unit; struct, and the match stays exhaustive.
macro_rules! alternate_debug {
    ($error:expr, $f:expr, {
        $($tuple:ident($inner:ident)),*;
        $($unit:ident),*;
        $($variant:ident { $($field:ident),* }),* $(,)?
    }) => {
        match $error {
            $(Error::$tuple($inner) => $f.debug_tuple(stringify!($tuple)).field($inner).finish(),)*
            $(Error::$unit => $f.write_str(stringify!($unit)),)*
            $(Error::$variant { $($field),* } => $f
                .debug_struct(stringify!($variant))
                $(.field(stringify!($field), $field))*
                .finish(),)*
        }
    };
}

/// `{:?}` is the message (`Display`), so that `main` returning an error prints a sentence;
/// `{:#?}` is the variant with its fields, as a derived `Debug` would print it.
impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !f.alternate() {
            return fmt::Display::fmt(self, f);
        }
        alternate_debug!(self, f, {
            InvalidArgument(what), Failed(inner), Unsupported(what);
            GroupClosed;
            Environment { var, reason },
            Config { path, reason },
            Io { peer, addr, op, context, source },
            Closed { peer, op, context },
            Lost { peer, via, context },
            Auth { peer, addr, context, reason },
            Rdma { peer, op, context, reason },
            Timeout { peer, addr, op, context, after },
            PeerMisbehaved { peer, addr, context, reason },
            PeerIncompatible { peer, addr, context, reason },
            Mismatch { seq, point_to_point, rank, call, peer, peer_call, differs, context },
            Bug { context, what },
            Local { what, source },
            Excluded { rank, after, why },
            Aborted { context },
            Unavailable { backend, reason },
        })
    }
}

/// "collective #17: rank 0 called ..., rank 1 called ...", the lower rank first.
fn fmt_mismatch(
    seq: u64,
    point_to_point: bool,
    mine: (usize, &String),
    theirs: (usize, &String),
    differs: &str,
) -> String {
    let (first, second) = if mine.0 <= theirs.0 {
        (mine, theirs)
    } else {
        (theirs, mine)
    };
    let what = if point_to_point {
        "send/recv"
    } else {
        "collective"
    };
    let mut text = format!(
        "{what} #{seq}: rank {} called {}, rank {} called {}",
        first.0, first.1, second.0, second.1
    );
    if !differs.is_empty() {
        text.push_str("; ");
        text.push_str(differs);
    }
    text
}

/// "rank 1 (10.0.0.2:5000): connect timed out after 30s during ring setup", or for a peer
/// that never connected, "rank 0 (10.0.0.1:5000): did not connect to this rank within 30s
/// during ring setup".
fn fmt_timeout(
    peer: usize,
    addr: Option<SocketAddr>,
    op: PeerOp,
    context: Phase,
    after: Duration,
) -> String {
    let addr = fmt_addr(addr);
    match op {
        PeerOp::Accept => format!(
            "rank {peer}{addr}: did not connect to this rank within {after:?} during {context}"
        ),
        _ => format!("rank {peer}{addr}: {op} timed out after {after:?} during {context}"),
    }
}

fn fmt_addr(addr: Option<SocketAddr>) -> String {
    addr.map(|a| format!(" ({a})")).unwrap_or_default()
}

/// Whose fault an [`Error`] is ([`Error::fault`]): who failed, and so what to do about it.
///
/// | class | variants | what happened | what to do |
/// |---|---|---|---|
/// | [`Fault::PeerFailed`] | [`Io`](Error::Io), [`Closed`](Error::Closed), [`Lost`](Error::Lost), [`Timeout`](Error::Timeout), [`Rdma`](Error::Rdma) | a peer died, closed, went silent past the timeout, or its link failed | close the group, find out what happened to the named rank, form a new group (retry) |
/// | [`Fault::PeerMisbehaved`] | [`PeerMisbehaved`](Error::PeerMisbehaved) | a peer sent bytes the protocol does not allow | close and re-form; if it persists, the peer runs another program or version |
/// | [`Fault::PeerIncompatible`] | [`Auth`](Error::Auth), [`PeerIncompatible`](Error::PeerIncompatible) | a peer cannot work with this rank: another key, version, or group size | fix the configuration of one side (key, version, hostfile), then re-form |
/// | [`Fault::Local`] | [`Local`](Error::Local), [`Bug`](Error::Bug) | this machine failed (a port, memory, the poller), or this crate has a bug | fix the resource, or report the bug; a bug fails the group, a resource refused before any byte moved does not |
/// | [`Fault::Misuse`] | [`InvalidArgument`](Error::InvalidArgument), [`Unsupported`](Error::Unsupported), [`Mismatch`](Error::Mismatch) | the call was wrong: lengths, ranks, an operation the backend lacks; or ranks made different calls (native wire) | fix the code; the group stays usable, except after a mismatch, which fails it |
/// | [`Fault::Config`] | [`Environment`](Error::Environment), [`Config`](Error::Config) | an environment variable, hostfile or device file is unusable | fix the configuration named in the message |
/// | [`Fault::Unavailable`] | [`Unavailable`](Error::Unavailable) | the backend cannot run in this build or on this machine | build with its feature, or pick another backend |
/// | [`Fault::FailedEarlier`] | [`Failed`](Error::Failed) | the group failed before this call; the first error is inside | close the group and form a new one |
/// | [`Fault::Closed`] | [`GroupClosed`](Error::GroupClosed), [`Aborted`](Error::Aborted), [`Excluded`](Error::Excluded) | the group was closed (by another thread during the call, for `Aborted`; by the survivors' shrink without this rank, for `Excluded`) | form a new one (a rank left out: start again, to join the survivors' rejoin) |
///
/// Errors that involve a peer name it ([`Error::peer`]): its rank, its address where there
/// is one, and what this rank was doing. Only a peer failure ([`Error::lost_peer`]) makes a
/// rank tell the others that the peer was lost: a local failure or a bug never blames a peer.
/// After a peer's failure, misbehaviour or incompatibility, a mismatch, or a bug, the group is failed
/// ([`Error::is_fatal`]), and every later call returns [`Error::Failed`] at once.
///
/// # Examples
///
/// A peer that leaves: rank 1 closes its group, and rank 0's next collective fails naming it.
///
/// ```
/// use std::time::Duration;
/// use nuvec_distributed_engine::{Error, Fault, Options, init_with};
///
/// # // Two free ports below the ephemeral range (as a launcher would pick them), so that no
/// # // dial of another example running in parallel can take one.
/// # let ports = nuvec_tools::testing::free_ports(2, 1);
/// # let (p0, p1) = (ports[0][0], ports[1][0]);
/// let nodes = vec![vec![format!("127.0.0.1:{p0}")], vec![format!("127.0.0.1:{p1}")]];
/// let options = Options::default().timeout(Duration::from_secs(10));
/// let (group, err) = std::thread::scope(|s| {
///     let leaver = s.spawn(|| {
///         let group = init_with(&nodes, 1, &options).unwrap();
///         group.barrier().unwrap(); // both ranks have formed the group
///         group.close().unwrap();
///     });
///     let group = init_with(&nodes, 0, &options).unwrap();
///     group.barrier().unwrap();
///     leaver.join().unwrap();
///     let err = group.all_sum(&mut [1.0f32; 16]).unwrap_err();
///     (group, err)
/// });
/// assert_eq!(err.fault(), Fault::PeerFailed);
/// assert_eq!((err.peer(), err.lost_peer()), (Some(1), Some(1)));
/// assert!(err.is_fatal());
/// // The group is failed: every later call returns the first error inside `Failed`.
/// let again = group.barrier().unwrap_err();
/// assert!(matches!(again, Error::Failed(_)));
/// assert_eq!((again.fault(), again.peer()), (Fault::FailedEarlier, Some(1)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Fault {
    /// A peer failed: lost, closed, timed out, or its link failed. Re-form the group.
    PeerFailed,
    /// A peer broke the protocol. Re-form; check what runs on that rank.
    PeerMisbehaved,
    /// A peer is incompatible: another key, version or group size. Fix the configuration.
    PeerIncompatible,
    /// This machine failed, or this crate has a bug. Fix the resource or report the bug.
    Local,
    /// The API was misused. Fix the call; the group stays usable (not after a
    /// [`Mismatch`](Error::Mismatch), which fails it).
    Misuse,
    /// The configuration (environment, hostfile, device file) is unusable. Fix it.
    Config,
    /// The backend cannot be used here. Pick another or build with its feature.
    Unavailable,
    /// The group failed earlier. Close it and form a new one.
    FailedEarlier,
    /// The group was closed. Form a new one.
    Closed,
}

impl Error {
    /// Whose fault this error is (see the module docs' table).
    ///
    /// ```
    /// use nuvec_distributed_engine::{Error, Fault};
    /// let e = Error::InvalidArgument("all_gather: the output holds 3 elements".into());
    /// assert_eq!(e.fault(), Fault::Misuse);
    /// assert!(!e.is_fatal());
    /// ```
    pub fn fault(&self) -> Fault {
        match self {
            Error::Io { .. }
            | Error::Closed { .. }
            | Error::Lost { .. }
            | Error::Timeout { .. }
            | Error::Rdma { .. } => Fault::PeerFailed,
            Error::PeerMisbehaved { .. } => Fault::PeerMisbehaved,
            Error::Auth { .. } | Error::PeerIncompatible { .. } => Fault::PeerIncompatible,
            Error::Local { .. } | Error::Bug { .. } => Fault::Local,
            Error::InvalidArgument(_) | Error::Unsupported(_) | Error::Mismatch { .. } => {
                Fault::Misuse
            }
            Error::Environment { .. } | Error::Config { .. } => Fault::Config,
            Error::Unavailable { .. } => Fault::Unavailable,
            Error::Failed(_) => Fault::FailedEarlier,
            Error::GroupClosed | Error::Aborted { .. } | Error::Excluded { .. } => Fault::Closed,
        }
    }

    /// The rank this error says was lost, if it is a peer failure: the only kind of error
    /// after which a rank tells the others that a peer is gone. A peer that misbehaved or is
    /// incompatible is named by [`Error::peer`] but not reported lost; a local failure names
    /// no peer at all.
    pub fn lost_peer(&self) -> Option<usize> {
        match self.fault() {
            Fault::PeerFailed => self.peer(),
            _ => None,
        }
    }

    /// The peer rank this error names, if it is a transport error (or a group failure caused
    /// by one).
    pub fn peer(&self) -> Option<usize> {
        match self {
            Error::Io { peer, .. }
            | Error::Closed { peer, .. }
            | Error::Lost { peer, .. }
            | Error::Auth { peer, .. }
            | Error::PeerMisbehaved { peer, .. }
            | Error::PeerIncompatible { peer, .. }
            | Error::Rdma { peer, .. }
            | Error::Timeout { peer, .. }
            | Error::Mismatch { peer, .. } => Some(*peer),
            Error::Failed(inner) => inner.peer(),
            _ => None,
        }
    }

    /// Whether this error leaves the group unusable: a peer failed, misbehaved or is
    /// incompatible, ranks made mismatched calls, this crate hit a bug, or the group had
    /// failed already. A misused call,
    /// a configuration error, a closed group, and a local resource that could not be had
    /// before any byte moved (staging memory for a large `sum_scatter`) leave it usable.
    pub fn is_fatal(&self) -> bool {
        matches!(
            self.fault(),
            Fault::PeerFailed
                | Fault::PeerMisbehaved
                | Fault::PeerIncompatible
                | Fault::FailedEarlier
        ) || matches!(self, Error::Bug { .. } | Error::Mismatch { .. })
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

/// What to do about a system error that says "too many open files" (empty for any other):
/// EMFILE is this process's own limit, which the shell that starts it raises; ENFILE is the
/// whole system's. The limit is named where it can be read without unsafe code.
fn fd_limit_hint(source: &io::Error) -> String {
    match source.raw_os_error() {
        Some(libc::EMFILE) => {
            let limit = open_files_soft_limit()
                .map(|soft| format!(" of {soft} "))
                .unwrap_or_else(|| " on ".into());
            format!(
                " (this process reached its limit{limit}open files: raise it with `ulimit -n` \
                 in the shell that starts the ranks, e.g. `ulimit -n 65536`, up to the hard \
                 limit `ulimit -Hn`)"
            )
        }
        Some(libc::ENFILE) => " (the system's table of open files is full: close files \
                                elsewhere or raise the system's limit, sysctl fs.file-max on \
                                Linux, kern.maxfiles on macOS)"
            .into(),
        _ => String::new(),
    }
}

/// A system error as text, with [`fd_limit_hint`]'s advice: for errors kept as text (a
/// dial's last failure) rather than as the error's source.
pub(crate) fn describe_io(e: &io::Error) -> String {
    format!("{e}{}", fd_limit_hint(e))
}

/// This process's soft limit on open files as `/proc/self/limits` shows it (a number or
/// `unlimited`), where there is such a file (Linux).
fn open_files_soft_limit() -> Option<String> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    limits
        .lines()
        .find_map(|line| line.strip_prefix("Max open files"))?
        .split_whitespace()
        .next()
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io() -> Arc<io::Error> {
        Arc::new(io::Error::from(io::ErrorKind::ConnectionReset))
    }

    #[test]
    fn only_a_peer_failure_reports_the_peer_lost() {
        let failed = [
            Error::Io {
                peer: 1,
                addr: None,
                op: PeerOp::Receive,
                context: Phase::AllSum,
                source: io(),
            },
            Error::Closed {
                peer: 1,
                op: PeerOp::Send,
                context: Phase::AllSum,
            },
            Error::Timeout {
                peer: 1,
                addr: None,
                op: PeerOp::Receive,
                context: Phase::AllSum,
                after: Duration::from_secs(1),
            },
        ];
        for e in &failed {
            assert_eq!(e.fault(), Fault::PeerFailed, "{e}");
            assert_eq!(e.lost_peer(), Some(1), "{e}");
            assert!(e.is_fatal(), "{e}");
        }
        let misbehaved = Error::PeerMisbehaved {
            peer: 2,
            addr: None,
            context: Phase::JacclSetup,
            reason: "nonsense".into(),
        };
        assert_eq!(misbehaved.fault(), Fault::PeerMisbehaved);
        assert_eq!(misbehaved.peer(), Some(2), "named");
        assert_eq!(misbehaved.lost_peer(), None, "but not reported lost");
        assert!(misbehaved.is_fatal());

        let local = Error::local("mapping staging memory", io::Error::other("no memory"));
        assert_eq!(local.fault(), Fault::Local);
        assert_eq!((local.peer(), local.lost_peer()), (None, None));
        let bug = Error::Bug {
            context: Phase::AllSum,
            what: "a buffer is missing".into(),
        };
        assert_eq!(
            (bug.fault(), bug.peer(), bug.lost_peer()),
            (Fault::Local, None, None)
        );
        assert!(bug.is_fatal(), "a bug leaves the group in an unknown state");

        let earlier = Error::Failed(Arc::new(failed[0].clone()));
        assert_eq!(earlier.fault(), Fault::FailedEarlier);
        assert_eq!(earlier.peer(), Some(1));
        assert_eq!(
            earlier.lost_peer(),
            None,
            "reported when it happened, not again"
        );
        assert_eq!(Error::GroupClosed.fault(), Fault::Closed);
        assert!(!Error::GroupClosed.is_fatal());
        let aborted = Error::Aborted {
            context: Phase::AllGather,
        };
        assert_eq!(
            (aborted.fault(), aborted.is_fatal(), aborted.lost_peer()),
            (Fault::Closed, false, None),
            "an abort blames nobody"
        );
        assert!(
            aborted.to_string().contains("all_gather") && aborted.to_string().contains("closed"),
            "{aborted}"
        );
        let misuse = Error::invalid("lengths");
        assert_eq!((misuse.fault(), misuse.is_fatal()), (Fault::Misuse, false));
    }

    #[test]
    fn debug_is_the_message_and_alternate_debug_the_fields() {
        let inner = Error::Io {
            peer: 1,
            addr: Some(SocketAddr::from(([10, 0, 0, 2], 5000))),
            op: PeerOp::Connect,
            context: Phase::RingSetup,
            source: Arc::new(io::Error::from(io::ErrorKind::ConnectionRefused)),
        };
        let failed = Error::Failed(Arc::new(inner.clone()));
        for e in [&inner, &failed] {
            assert_eq!(format!("{e:?}"), e.to_string());
            // What `main` prints for an error it returns: "Error: " and the message.
            assert!(
                format!("Error: {e:?}").starts_with("Error: ")
                    && !format!("{e:?}").contains("peer:"),
                "{e:?}"
            );
        }
        assert!(
            inner
                .to_string()
                .starts_with("rank 1 (10.0.0.2:5000): connect failed during ring setup: "),
            "{inner}"
        );
        let pretty = format!("{failed:#?}");
        assert!(
            pretty.starts_with("Failed(\n    Io {\n        peer: 1,\n"),
            "{pretty}"
        );
        assert!(pretty.contains("op: Connect") && pretty.contains("context: RingSetup"));
        assert_eq!(format!("{:#?}", Error::GroupClosed), "GroupClosed");
    }

    #[test]
    fn a_mismatch_is_the_programs_bug_fails_the_group_and_blames_no_one_lost() {
        let mismatch = Error::Mismatch {
            seq: 17,
            point_to_point: false,
            rank: 1,
            call: "all_sum float32 x 20".into(),
            peer: 0,
            peer_call: "all_sum float32 x 10".into(),
            differs: String::new(),
            context: Phase::AllSum,
        };
        assert_eq!(
            (
                mismatch.fault(),
                mismatch.is_fatal(),
                mismatch.lost_peer(),
                mismatch.peer()
            ),
            (Fault::Misuse, true, None, Some(0))
        );
        assert_eq!(
            mismatch.to_string(),
            "collective #17: rank 0 called all_sum float32 x 10, rank 1 called all_sum float32 \
             x 20"
        );
    }

    #[test]
    fn too_many_open_files_says_how_to_raise_the_limit() {
        // EMFILE and ENFILE, on Linux and macOS alike.
        let (emfile, enfile) = (24, 23);
        let accept = Error::local(
            "accepting on 127.0.0.1:5000",
            io::Error::from_raw_os_error(emfile),
        );
        let dial = Error::Io {
            peer: 1,
            addr: None,
            op: PeerOp::Connect,
            context: Phase::RingSetup,
            source: Arc::new(io::Error::from_raw_os_error(emfile)),
        };
        for e in [&accept, &dial] {
            let text = e.to_string();
            assert!(text.contains("ulimit -n"), "{text}");
            // Where the soft limit can be read, the message names it.
            if let Ok(limits) = std::fs::read_to_string("/proc/self/limits") {
                let soft = limits
                    .lines()
                    .find_map(|l| l.strip_prefix("Max open files"))
                    .and_then(|rest| rest.split_whitespace().next())
                    .expect("an open files line");
                assert!(text.contains(&format!("limit of {soft} ")), "{text}");
            }
        }
        // A dial's failure kept as text until the timeout reports it.
        let kept = describe_io(&io::Error::from_raw_os_error(emfile));
        assert!(kept.contains("ulimit -n"), "{kept}");
        let table = Error::local("mapping 4096 bytes", io::Error::from_raw_os_error(enfile));
        assert!(table.to_string().contains("fs.file-max"), "{table}");
        // Other errors carry no such advice.
        let refused = Error::local("binding", io::Error::from(io::ErrorKind::AddrInUse));
        assert!(!refused.to_string().contains("ulimit"), "{refused}");
    }
}
