//! The native wire's handshake: the hello both ends of every connection send as soon as it
//! is up, and, with a key, [`crate::auth`]'s challenge-response after it, bound to both
//! hellos.
//!
//! Both sides speak first, so that whatever the peer is, its first bytes say so at once: a
//! native rank sends a [`Hello`]; an MLX rank, or a rank of this crate on the MLX wire
//! without a key, sends collective data (or nothing until its first collective, and then
//! [`auth::NO_KEY`] once it has read our hello); a rank on the MLX wire with a key sends
//! [`auth::MAGIC`] and version 1. Each is named as soon as the bytes that tell it arrive,
//! never after a whole message or the timeout.
//!
//! The hello, fixed-size and little-endian:
//!
//! | bytes | field |
//! |---|---|
//! | 0..8 | [`auth::MAGIC`] |
//! | 8 | version: [`VERSION`] (1 is the MLX wire's keyed handshake, 0 its [`auth::NO_KEY`]) |
//! | 9..12 | reserved, zero |
//! | 12..20 | capabilities (u64 bits, see [`CAP_SHARED_MEMORY`]) |
//! | 20..24 | group size (u32) |
//! | 24..28 | sender's rank (u32) |
//! | 28..32 | receiver's rank (u32), or [`ANY`] in an acceptor's hello |
//! | 32..36 | connection kind (u32, [`Kind`]) |
//! | 36..40 | connection index (u32) |
//! | 40..72 | group identity ([`group_identity`]) |
//! | 72..88 | host identity ([`host_identity`]) |
//!
//! The connector (the rank that dialled) says which connection it opens: ring connection
//! `i` to its right neighbour, or the mesh connection to a rank that is not a neighbour.
//! The acceptor cannot know that before it has read the connector's hello (ring and mesh
//! connections both arrive at its first address), so its own hello says only which of its
//! addresses accepted the connection, with the receiver [`ANY`]; the connector checks that
//! it reached the rank and address it dialled, the acceptor that the connector is a rank and
//! connection it expects on that address.
//!
//! Capabilities are offers: a bit counts only when both sides set it, and bits this build
//! does not know are ignored, so a later build can offer more without a new version.
//!
//! As in [`crate::auth`], the machines ([`Connector`], [`Acceptor`]) own no socket and read
//! no clock: the caller drives them through [`Handshake`].

use std::fmt;

use crate::auth::{self, Fault, Handshake, Key, Link, Outcome, Rejection};
use crate::transport::tcp::seal::{self, Channel, Side};

/// The hello's version byte.
pub(crate) const VERSION: u8 = auth::NATIVE_VERSION;

/// Capability bit 0: shared memory between ranks on one host ([`Options::shared_memory`](crate::Options::shared_memory)).
pub(crate) const CAP_SHARED_MEMORY: u64 = 1;

/// The receiver in an acceptor's hello: the acceptor does not know yet who dialled.
pub(crate) const ANY: u32 = u32::MAX;

/// The `derive_key` context of the group identity's hostfile half.
const GROUP_CONTEXT: &str = "nuvec-distributed 2026-12-03 native wire group identity v2";

/// The `derive_key` context of the transcript the authentication binds.
const BIND_CONTEXT: &str = "nuvec-distributed 2026-12-03 native wire hellos bound v2";

/// The `derive_key` context of the host identity.
const HOST_CONTEXT: &str = "nuvec-distributed 2026-12-03 native wire host identity v3";

/// Which connection a hello is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Ring connection `i`, opened by the sender to its right neighbour's address `i`.
    Ring(u32),
    /// The mesh connection, opened by the sender to a rank that is not a neighbour.
    Mesh,
    /// A connection the sender accepted on its address `i`.
    Accepted(u32),
}

impl Kind {
    fn encode(self) -> (u32, u32) {
        match self {
            Kind::Ring(i) => (1, i),
            Kind::Mesh => (2, 0),
            Kind::Accepted(i) => (3, i),
        }
    }

    fn decode(kind: u32, index: u32) -> Option<Kind> {
        match (kind, index) {
            (1, i) => Some(Kind::Ring(i)),
            (2, 0) => Some(Kind::Mesh),
            (3, i) => Some(Kind::Accepted(i)),
            _ => None,
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Kind::Ring(i) => write!(f, "ring connection {i}"),
            Kind::Mesh => f.write_str("the mesh connection"),
            Kind::Accepted(i) => write!(f, "a connection it accepted on its address {i}"),
        }
    }
}

/// What a rank says about itself and its group in every hello.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Identity {
    /// Capability bits offered.
    pub(crate) capabilities: u64,
    /// Ranks in the group.
    pub(crate) size: u32,
    /// The group: the hostfile's half, then the key's (zero without a key); see
    /// [`group_identity`].
    pub(crate) group: [u8; 32],
    /// The host (see [`host_identity`]).
    pub(crate) host: [u8; 16],
}

/// One hello.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Hello {
    /// What the sender says about itself and its group.
    pub(crate) identity: Identity,
    /// The sender's rank.
    pub(crate) from: u32,
    /// The receiver's rank, or [`ANY`].
    pub(crate) to: u32,
    /// Which connection this is.
    pub(crate) kind: Kind,
}

/// Why bytes are not a hello this build accepts. Each is decided on the first byte that
/// shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Malformed {
    /// Fewer bytes than a hello.
    Short,
    /// The first bytes are not the magic: collective data.
    Data,
    /// The magic and version 0: the MLX wire's [`auth::NO_KEY`].
    MlxUnkeyed,
    /// The magic and version 1: the MLX wire's keyed handshake.
    MlxKeyed,
    /// Another version of the native hello.
    Version(u8),
    /// Reserved bytes that are not zero.
    Reserved,
    /// A connection kind or index that does not exist.
    Kind(u32, u32),
}

impl Malformed {
    /// Who is blamed: a peer on the other wire or version is incompatible, a peer that
    /// sends a broken hello of this version misbehaves.
    fn fault(self) -> Fault {
        match self {
            Malformed::Data
            | Malformed::MlxUnkeyed
            | Malformed::MlxKeyed
            | Malformed::Version(_) => Fault::Incompatible,
            Malformed::Short | Malformed::Reserved | Malformed::Kind(..) => Fault::Peer,
        }
    }
}

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let wire = crate::config::env::WIRE_VAR;
        match self {
            Malformed::Short => f.write_str("sent a truncated hello"),
            Malformed::Data => write!(
                f,
                "does not speak the native wire: it sent collective data instead of a hello \
                 (an MLX rank, or a nuvec rank without {wire}=native)"
            ),
            Malformed::MlxUnkeyed => write!(
                f,
                "is on the MLX wire: it answered this rank's hello as a nuvec rank on the MLX \
                 wire without a key does; set {wire}=native (Options::backend) on every rank"
            ),
            Malformed::MlxKeyed => write!(
                f,
                "is on the MLX wire: it opened the MLX wire's keyed handshake (version 1) \
                 instead of a native hello; set {wire}=native (Options::backend) on every rank"
            ),
            Malformed::Version(v) => write!(
                f,
                "sent native hello version {v}, and this build speaks version {VERSION}: run \
                 the same nuvec-distributed release on every rank"
            ),
            Malformed::Reserved => f.write_str("sent a hello with reserved bytes set"),
            Malformed::Kind(k, i) => {
                write!(
                    f,
                    "sent a hello with connection kind {k}, index {i}, which do not exist"
                )
            }
        }
    }
}

impl Hello {
    /// Encoded size.
    pub(crate) const LEN: usize = 88;

    /// The wire bytes.
    pub(crate) fn encode(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        out[..8].copy_from_slice(&auth::MAGIC);
        out[8] = VERSION;
        out[12..20].copy_from_slice(&self.identity.capabilities.to_le_bytes());
        let (kind, index) = self.kind.encode();
        for (i, v) in [self.identity.size, self.from, self.to, kind, index]
            .into_iter()
            .enumerate()
        {
            out[20 + 4 * i..24 + 4 * i].copy_from_slice(&v.to_le_bytes());
        }
        out[40..72].copy_from_slice(&self.identity.group);
        out[72..88].copy_from_slice(&self.identity.host);
        out
    }

    /// Parses wire bytes (exactly [`Hello::LEN`] are read; more are ignored).
    pub(crate) fn decode(bytes: &[u8]) -> Result<Hello, Malformed> {
        early(bytes)?;
        let Some(bytes) = bytes.get(..Self::LEN) else {
            return Err(Malformed::Short);
        };
        if bytes[9..12] != [0; 3] {
            return Err(Malformed::Reserved);
        }
        let word = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let mut capabilities = [0u8; 8];
        capabilities.copy_from_slice(&bytes[12..20]);
        let (kind, index) = (word(32), word(36));
        let kind = Kind::decode(kind, index).ok_or(Malformed::Kind(kind, index))?;
        let mut group = [0u8; 32];
        group.copy_from_slice(&bytes[40..72]);
        let mut host = [0u8; 16];
        host.copy_from_slice(&bytes[72..88]);
        Ok(Hello {
            identity: Identity {
                capabilities: u64::from_le_bytes(capabilities),
                size: word(20),
                group,
                host,
            },
            from: word(24),
            to: word(28),
            kind,
        })
    }
}

/// Checks a hello's start as far as it has arrived, so that a peer that is not native is
/// named on the first byte that shows it (its data may be shorter than a hello, and it may
/// then wait for ours).
fn early(received: &[u8]) -> Result<(), Malformed> {
    if auth::greeting(received) == auth::Greeting::Data {
        return Err(Malformed::Data);
    }
    match received.get(8) {
        None => Ok(()),
        Some(&VERSION) => Ok(()),
        Some(0) => Err(Malformed::MlxUnkeyed),
        Some(&auth::VERSION) => Err(Malformed::MlxKeyed),
        Some(&v) => Err(Malformed::Version(v)),
    }
}

/// The group identity: the first 16 bytes a BLAKE3 `derive_key` over every rank's
/// addresses as the hostfile writes them (`all`, in rank order), the last 16 a keyed hash
/// of those under the key, or zeros without one. Two ranks agree on it exactly when their
/// hostfiles list the same addresses in the same order and they hold the same key (or
/// none), and each half can be compared alone, so a mismatch names the file or the key.
/// The key's half reveals no more about the key than the authentication's proofs do.
pub(crate) fn group_identity(all: &[Vec<String>], key: Option<&Key>) -> [u8; 32] {
    // Lengths before contents, so that no two lists encode alike.
    let mut h = blake3::Hasher::new_derive_key(GROUP_CONTEXT);
    h.update(&(all.len() as u64).to_le_bytes());
    for rank in all {
        h.update(&(rank.len() as u64).to_le_bytes());
        for address in rank {
            h.update(&(address.len() as u64).to_le_bytes());
            h.update(address.as_bytes());
        }
    }
    let hostfile = *h.finalize().as_bytes();
    let mut group = [0u8; 32];
    group[..16].copy_from_slice(&hostfile[..16]);
    if let Some(key) = key {
        group[16..].copy_from_slice(&key.tag(&hostfile)[..16]);
    }
    group
}

/// The group identity of a group formed by `Group::shrink`: the hostfile half of
/// `identity` (the survivors' addresses) hashed with `shrunk` (the digest of the original
/// group, the generation and the members), so that survivors that decided different members
/// or belong to another shrink refuse each other's hellos as another group's. Without
/// `shrunk`, `identity` as it is.
pub(crate) fn shrunk_identity(mut identity: [u8; 32], shrunk: Option<&[u8; 32]>) -> [u8; 32] {
    if let Some(digest) = shrunk {
        let mut h = blake3::Hasher::new_derive_key(SHRUNK_CONTEXT);
        h.update(&identity[..16]);
        h.update(digest);
        identity[..16].copy_from_slice(&h.finalize().as_bytes()[..16]);
    }
    identity
}

/// The `derive_key` context of [`shrunk_identity`].
const SHRUNK_CONTEXT: &str = "nuvec-distributed 2026-12-06 native wire shrunk group identity v1";

/// Identifies this host: equal for the processes of one host and boot, zeros when unknown
/// (which no rank may take for "the same host").
///
/// On Linux it is derived from `/etc/machine-id` (one per installation) and
/// `/proc/sys/kernel/random/boot_id` (one per boot): both are plain files, read in
/// microseconds. Containers on one host share the kernel's boot id but may lack or fake the
/// machine id, and cloned images share the machine id but not the boot id; ranks in
/// different containers of one host can therefore look alike without sharing `/dev/shm`,
/// so shared memory must still check that a segment is really shared before using it.
///
/// Elsewhere (macOS) it is derived from the creation times of `/` (the system volume,
/// made when the system was installed) and `/dev` (devfs, mounted at every boot), with the
/// nanoseconds the file system keeps: no system call outside `std`, no `unsafe`, and no
/// child process. Two hosts installed and booted at the same nanosecond would look alike;
/// the same check covers that.
///
/// On both, the device of the shared-memory directory (`/dev/shm` on Linux) is folded in:
/// it is what shared memory needs in common. Two containers (or mount namespaces) of one
/// kernel, each with its own tmpfs there, are then two hosts, and a group spread over them
/// runs hierarchically (`native::hier`); with one `/dev/shm` bind-mounted into both, they are
/// one. A directory that cannot be looked at leaves the identity unknown.
pub(crate) fn host_identity() -> [u8; 16] {
    static HOST: std::sync::OnceLock<[u8; 16]> = std::sync::OnceLock::new();
    *HOST.get_or_init(|| match host_facts().zip(shm_device()) {
        Some((mut facts, device)) => {
            facts.push(0);
            facts.extend_from_slice(&device.to_le_bytes());
            let mut id = [0u8; 16];
            id.copy_from_slice(&blake3::derive_key(HOST_CONTEXT, &facts)[..16]);
            id
        }
        None => [0; 16],
    })
}

/// The device number of the file system that holds shared-memory segments.
fn shm_device() -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(ffi::shm::directory())
        .ok()
        .map(|m| m.dev())
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn host_facts() -> Option<Vec<u8>> {
    let machine = std::fs::read("/etc/machine-id").ok()?;
    let boot = std::fs::read("/proc/sys/kernel/random/boot_id").ok()?;
    let mut facts = machine;
    facts.push(0);
    facts.extend_from_slice(&boot);
    Some(facts)
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn host_facts() -> Option<Vec<u8>> {
    let mut facts = Vec::new();
    for path in ["/", "/dev"] {
        let created = std::fs::metadata(path).and_then(|m| m.created()).ok()?;
        let since = created.duration_since(std::time::UNIX_EPOCH).ok()?;
        facts.extend_from_slice(&since.as_nanos().to_le_bytes());
    }
    Some(facts)
}

/// What one side of a connection expects of the other's hello.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Expect {
    /// This rank.
    pub(crate) me: u32,
    /// This rank's own identity (the peer's group and size must match it).
    pub(crate) identity: Identity,
    /// Whether this rank has a key.
    pub(crate) keyed: bool,
}

/// A reason about the peer and whose fault it is.
fn reject(fault: Fault, claimed: Option<u32>, reason: String) -> Outcome {
    Outcome::Rejected(Rejection {
        fault,
        claimed: claimed.map(|r| r as usize),
        reason,
        said_no_key: false,
    })
}

/// Checks the group half by half: the hostfile's, then the key's.
fn check_group(expect: &Expect, hello: &Hello) -> Result<(), (Fault, String)> {
    let (mine, theirs) = (&expect.identity.group, &hello.identity.group);
    if mine[..16] != theirs[..16] {
        return Err((
            Fault::Incompatible,
            format!(
                "belongs to another group: its hostfile lists other addresses, or lists them in \
                 another order, than this rank's (a rank of another job on the same ports, or \
                 a rank started with another hostfile, or a survivor of Group::shrink that \
                 agreed on other members); give every rank the same hostfile ({})",
                crate::config::env::HOSTFILE_VAR
            ),
        ));
    }
    let key = crate::auth::KEY_VAR;
    let peer_keyed = theirs[16..] != [0; 16];
    match (expect.keyed, peer_keyed) {
        (true, false) => Err((
            Fault::NoKey,
            format!("has no key ({key}), and this rank has one; set the same key on every rank"),
        )),
        (false, true) => Err((
            Fault::NoKey,
            format!("has a key ({key}), and this rank has none; set the same key on every rank"),
        )),
        _ if mine[16..] != theirs[16..] => Err((
            Fault::Keys,
            format!("holds another key ({key}) than this rank; set the same key on every rank"),
        )),
        _ => Ok(()),
    }
}

/// The hello exchange both machines run before any authentication.
#[derive(Debug)]
struct Exchange {
    out: [u8; Hello::LEN],
    sent: usize,
    inbuf: [u8; Hello::LEN],
    got: usize,
    /// The peer's hello, once read and accepted.
    peer: Option<Hello>,
    /// Why the peer's bytes were not a hello, once they showed it.
    malformed: Option<Malformed>,
    outcome: Outcome,
}

impl Exchange {
    /// The peer's accepted hello and the key, once our hello is out and theirs accepted and
    /// the authentication (`started` says whether it has) should start; without a key the
    /// hellos were all there is, and the connection is established instead.
    fn authentication(&mut self, started: bool, key: Option<Key>) -> Option<(Hello, Key)> {
        if self.outcome != Outcome::Pending || started || self.sent < Hello::LEN {
            return None;
        }
        let peer = self.peer?;
        let Some(key) = key else {
            self.outcome = Outcome::Established;
            return None;
        };
        Some((peer, key))
    }

    fn new(mine: &Hello) -> Exchange {
        Exchange {
            out: mine.encode(),
            sent: 0,
            inbuf: [0; Hello::LEN],
            got: 0,
            peer: None,
            malformed: None,
            outcome: Outcome::Pending,
        }
    }

    fn transmit(&self) -> &[u8] {
        // After a rejection the rest of our hello still goes out once, so that the peer
        // learns who we are and names us too.
        self.out.get(self.sent..).unwrap_or(&[])
    }

    fn handle_sent(&mut self, n: usize) {
        self.sent = (self.sent + n).min(Hello::LEN);
    }

    fn wants(&self) -> usize {
        if self.outcome != Outcome::Pending || self.peer.is_some() {
            return 0;
        }
        Hello::LEN - self.got
    }

    /// Takes bytes of the peer's hello; `Some` once it is whole (or the first byte shows it
    /// is not one, in which case the outcome is set).
    fn receive(&mut self, bytes: &[u8], claimed: Option<u32>) -> (usize, Option<Hello>) {
        let n = self.wants().min(bytes.len());
        if n == 0 {
            return (0, None);
        }
        self.inbuf[self.got..self.got + n].copy_from_slice(&bytes[..n]);
        self.got += n;
        let result = if self.got == Hello::LEN {
            Hello::decode(&self.inbuf).map(Some)
        } else {
            early(&self.inbuf[..self.got]).map(|()| None)
        };
        match result {
            Ok(hello) => (n, hello),
            Err(m) => {
                self.malformed = Some(m);
                self.outcome = reject(m.fault(), claimed, m.to_string());
                (n, None)
            }
        }
    }

    fn closed(&mut self, claimed: Option<u32>) {
        if self.outcome == Outcome::Pending && self.peer.is_none() {
            self.outcome = reject(
                Fault::Peer,
                claimed,
                "closed the connection before sending its hello".to_string(),
            );
        }
    }
}

/// The transcript the authentication binds: both hellos, the connector's first.
fn bound(connector: &[u8; Hello::LEN], acceptor: &[u8; Hello::LEN]) -> [u8; 32] {
    let mut h = blake3::Hasher::new_derive_key(BIND_CONTEXT);
    h.update(connector);
    h.update(acceptor);
    *h.finalize().as_bytes()
}

/// The [`Handshake`] of a side of the hello: its hello exchange until the peer's hello is
/// checked, then, with a key, the key handshake (`auth`). `$blamed` gives the rank a
/// rejection names from the peer's hello (the dialled rank is known, an accepted one is
/// only claimed).
macro_rules! hello_handshake {
    ($side:ty, $blamed:expr) => {
        impl Handshake for $side {
            fn transmit(&self) -> &[u8] {
                match &self.auth {
                    Some(a) => a.transmit(),
                    None => self.exchange.transmit(),
                }
            }

            fn handle_sent(&mut self, n: usize) {
                match &mut self.auth {
                    Some(a) => a.handle_sent(n),
                    None => {
                        self.exchange.handle_sent(n);
                        self.advance();
                    }
                }
            }

            fn wants(&self) -> usize {
                match &self.auth {
                    Some(a) => a.wants(),
                    None => self.exchange.wants(),
                }
            }

            fn handle_recv(&mut self, bytes: &[u8]) -> usize {
                if let Some(a) = &mut self.auth {
                    return a.handle_recv(bytes);
                }
                let (n, hello) = self.exchange.receive(bytes, None);
                if let Some(hello) = hello {
                    match self.check(&hello) {
                        Ok(()) => self.exchange.peer = Some(hello),
                        Err((fault, reason)) => {
                            let blamed: Option<u32> = ($blamed)(&hello);
                            self.exchange.outcome = reject(fault, blamed, reason);
                        }
                    }
                    self.advance();
                }
                n
            }

            fn handle_closed(&mut self) {
                match &mut self.auth {
                    Some(a) => a.handle_closed(),
                    None => self.exchange.closed(None),
                }
            }

            fn outcome(&self) -> &Outcome {
                match &self.auth {
                    Some(a) => a.outcome(),
                    None => &self.exchange.outcome,
                }
            }
        }
    };
}

/// The side that dialled: sends its hello, checks that the acceptor's comes from the rank
/// and address dialled, then (with a key) runs [`auth::Connector`] bound to both hellos.
#[derive(Debug)]
pub(crate) struct Connector {
    expect: Expect,
    key: Option<Key>,
    /// The rank dialled.
    peer: u32,
    /// The acceptor's address index dialled (0 for the mesh).
    index: u32,
    exchange: Exchange,
    auth: Option<Box<auth::Connector>>,
}

impl Connector {
    /// A connector from `expect.me` opening `kind` (a ring or mesh connection) to `peer`.
    pub(crate) fn new(expect: Expect, key: Option<Key>, peer: u32, kind: Kind) -> Connector {
        let mine = Hello {
            identity: expect.identity,
            from: expect.me,
            to: peer,
            kind,
        };
        let index = match kind {
            Kind::Ring(i) | Kind::Accepted(i) => i,
            Kind::Mesh => 0,
        };
        Connector {
            exchange: Exchange::new(&mine),
            expect,
            key,
            peer,
            index,
            auth: None,
        }
    }

    /// The acceptor's hello, once read and accepted.
    pub(crate) fn peer_hello(&self) -> Option<&Hello> {
        self.exchange.peer.as_ref()
    }

    /// The sealed records of the connection (see [`crate::transport::tcp::seal`]), keyed by
    /// the group's key and both nonces of its handshake, once that is established with a
    /// key; `None` without a key.
    pub(crate) fn channel(&self) -> Option<Box<Channel>> {
        sealed(
            self.key,
            self.auth.as_ref()?.nonces(),
            Side::Connector,
            self.peer as usize,
        )
    }

    /// Whether any byte arrived from the acceptor.
    pub(crate) fn heard(&self) -> bool {
        self.exchange.got > 0
    }

    fn check(&self, hello: &Hello) -> Result<(), (Fault, String)> {
        check_group(&self.expect, hello)?;
        let fits = hello.identity.size == self.expect.identity.size
            && hello.from == self.peer
            && hello.to == ANY
            && hello.kind == Kind::Accepted(self.index);
        if !fits {
            return Err((
                Fault::Incompatible,
                format!(
                    "answered as rank {} of {} ({}), but this rank dialled rank {} of {} at its \
                     address {}: the ranks' hostfiles or rank numbers disagree",
                    hello.from,
                    hello.identity.size,
                    hello.kind,
                    self.peer,
                    self.expect.identity.size,
                    self.index
                ),
            ));
        }
        Ok(())
    }

    /// Starts the authentication once our hello is out and theirs accepted.
    fn advance(&mut self) {
        let Some((peer, key)) = self.exchange.authentication(self.auth.is_some(), self.key) else {
            return;
        };
        let link = Link {
            size: self.expect.identity.size as usize,
            connector: self.expect.me as usize,
            acceptor: self.peer as usize,
            index: self.index as usize,
        };
        let bound = bound(&self.exchange.out, &peer.encode());
        match auth::Connector::new(Some(key), link) {
            Ok(c) => self.auth = Some(Box::new(c.bind(bound))),
            Err(e) => {
                self.exchange.outcome =
                    reject(Fault::Peer, None, format!("cannot authenticate: {e}"));
            }
        }
    }
}

hello_handshake!(Connector, |_: &Hello| None);

/// The sealed records of a connection to `peer`, on this rank's `side`, keyed by the group's
/// key and both nonces of the handshake (the connector's, then the acceptor's); `None`
/// without a key or before the keyed handshake is established.
fn sealed(
    key: Option<Key>,
    nonces: Option<([u8; 32], [u8; 32])>,
    side: Side,
    peer: usize,
) -> Option<Box<Channel>> {
    let (key, (connector, acceptor)) = (key?, nonces?);
    let ends = seal::pair(&key, side, &connector, &acceptor, peer);
    Some(Box::new(Channel::new(ends)))
}

/// The connections an acceptor takes on one of its addresses: ring connection `slot` from
/// the left neighbour, and on address 0 the mesh connections of the lower ranks that are
/// not neighbours.
fn expected_here(size: u32, me: u32, slot: u32, from: u32, kind: Kind) -> bool {
    match kind {
        Kind::Ring(i) => {
            size > 0 && i == slot && (u64::from(from) + 1) % u64::from(size) == u64::from(me)
        }
        Kind::Mesh => slot == 0 && from < me && !neighbours(size, from, me),
        Kind::Accepted(_) => false,
    }
}

/// Whether ranks `a` and `b` of a group of `size` are ring neighbours (or the same rank).
pub(crate) fn neighbours(size: u32, a: u32, b: u32) -> bool {
    let (size, a, b) = (u64::from(size), u64::from(a), u64::from(b));
    size == 0 || a == b || (a + 1) % size == b || (b + 1) % size == a
}

/// The side that accepted, on its address `slot`: sends its hello at once, checks that the
/// connector's names a rank and connection expected on that address, then (with a key) runs
/// [`auth::Acceptor`] bound to both hellos.
#[derive(Debug)]
pub(crate) struct Acceptor {
    expect: Expect,
    key: Option<Key>,
    slot: u32,
    exchange: Exchange,
    auth: Option<auth::Acceptor>,
}

impl Acceptor {
    /// An acceptor for a connection that arrived on this rank's address `slot`.
    pub(crate) fn new(expect: Expect, key: Option<Key>, slot: u32) -> Acceptor {
        let mine = Hello {
            identity: expect.identity,
            from: expect.me,
            to: ANY,
            kind: Kind::Accepted(slot),
        };
        Acceptor {
            exchange: Exchange::new(&mine),
            expect,
            key,
            slot,
            auth: None,
        }
    }

    /// The connector's hello, once read and accepted: who it is and which connection.
    pub(crate) fn peer_hello(&self) -> Option<&Hello> {
        self.exchange.peer.as_ref()
    }

    /// The sealed records of the connection, as [`Connector::channel`].
    pub(crate) fn channel(&self) -> Option<Box<Channel>> {
        let peer = self.exchange.peer?.from as usize;
        sealed(self.key, self.auth.as_ref()?.nonces(), Side::Acceptor, peer)
    }

    /// Whether a rejected client is a stranger rather than a rank: its first bytes were not
    /// the magic of a hello (data, zeros, a scanner's close, a truncated hello), or began a
    /// hello of this version that is broken (reserved bytes, connection kind), or it sent a
    /// hello of this group and then failed to prove the key (a replay: the proof is bound
    /// to both hellos and this rank's fresh challenge). A rank of another version or wire
    /// (the magic, then another version byte) and a well-formed hello of another group,
    /// size, key or rank are not strangers: those are misconfigured ranks, named at once.
    ///
    /// A rank holding another key differs in the group identity, which is checked before
    /// any proof, so a proof that fails after that check is never a misconfigured rank.
    pub(crate) fn is_stranger(&self) -> bool {
        let Outcome::Rejected(r) = self.outcome() else {
            return false;
        };
        if self.auth.is_some() {
            return true;
        }
        r.claimed.is_none()
            && !matches!(
                self.exchange.malformed,
                Some(Malformed::Version(_) | Malformed::MlxUnkeyed | Malformed::MlxKeyed)
            )
    }

    fn check(&self, hello: &Hello) -> Result<(), (Fault, String)> {
        check_group(&self.expect, hello)?;
        let size = self.expect.identity.size;
        let fits = hello.identity.size == size
            && hello.to == self.expect.me
            && hello.from < size
            && expected_here(size, self.expect.me, self.slot, hello.from, hello.kind);
        if !fits {
            return Err((
                Fault::Incompatible,
                format!(
                    "introduced itself as rank {} of {} opening {} to rank {}, which this rank \
                     (rank {} of {}) does not expect on its address {}: the ranks' hostfiles or \
                     rank numbers disagree",
                    hello.from,
                    hello.identity.size,
                    hello.kind,
                    hello.to,
                    self.expect.me,
                    size,
                    self.slot
                ),
            ));
        }
        Ok(())
    }

    /// The connection the key handshake binds, as the connector `peer` names it.
    fn link(&self, peer: &Hello) -> Link {
        Link {
            size: self.expect.identity.size as usize,
            connector: peer.from as usize,
            acceptor: self.expect.me as usize,
            index: match peer.kind {
                Kind::Ring(i) | Kind::Accepted(i) => i as usize,
                Kind::Mesh => 0,
            },
        }
    }

    /// Starts the authentication once our hello is out and theirs accepted.
    fn advance(&mut self) {
        let Some((peer, key)) = self.exchange.authentication(self.auth.is_some(), self.key) else {
            return;
        };
        let bound = bound(&peer.encode(), &self.exchange.out);
        match auth::Acceptor::new(Some(key), self.link(&peer)) {
            Ok(a) => self.auth = Some(a.bind(bound)),
            Err(e) => {
                self.exchange.outcome = reject(
                    Fault::Peer,
                    Some(peer.from),
                    format!("cannot authenticate: {e}"),
                );
            }
        }
    }
}

hello_handshake!(Acceptor, |hello: &Hello| Some(hello.from));

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::auth::Secret;
    use crate::fuzzing::converse;

    fn key(s: &str) -> Key {
        Secret::new(s.as_bytes()).key().unwrap()
    }

    const SECRET: &str = "a shared secret of enough length";

    fn all(p: usize) -> Vec<Vec<String>> {
        (0..p)
            .map(|r| vec![format!("127.0.0.1:{}", 5000 + r)])
            .collect()
    }

    fn expect(me: u32, size: u32, key: Option<&Key>) -> Expect {
        Expect {
            me,
            identity: Identity {
                capabilities: 0,
                size,
                group: group_identity(&all(size as usize), key),
                host: [7; 16],
            },
            keyed: key.is_some(),
        }
    }

    impl Hello {
        /// A hello from `from` to `to` in a group of `size` that offers no capabilities and
        /// names an all-zero group and host: the fields a test varies, the rest neutral.
        pub(crate) fn plain(size: u32, from: u32, to: u32, kind: Kind) -> Self {
            Hello {
                identity: Identity {
                    capabilities: 0,
                    size,
                    group: [0; 32],
                    host: [0; 16],
                },
                from,
                to,
                kind,
            }
        }
    }

    /// A hello whose every field is distinct and not zero, so that a misplaced field shows.
    fn sample() -> Hello {
        let mut hello = Hello::plain(6, 5, 2, Kind::Ring(1));
        hello.identity.capabilities = 0x0102_0304_0506_0708;
        hello.identity.group = [3; 32];
        hello.identity.host = [4; 16];
        hello
    }

    fn rejection(o: &Outcome) -> &Rejection {
        match o {
            Outcome::Rejected(r) => r,
            other => panic!("expected a rejection, got {other:?}"),
        }
    }

    /// Rank 3 of 4 opening ring connection 1 to rank 0, which accepts on its address 1.
    fn ring_pair(ck: Option<&Key>, ak: Option<&Key>) -> (Connector, Acceptor) {
        (
            Connector::new(expect(3, 4, ck), ck.copied(), 0, Kind::Ring(1)),
            Acceptor::new(expect(0, 4, ak), ak.copied(), 1),
        )
    }

    #[test]
    fn the_hello_round_trips_and_its_layout_is_fixed() {
        let h = sample();
        let bytes = h.encode();
        assert_eq!(bytes.len(), 88);
        assert_eq!(&bytes[..9], b"nuvecRNG\x02");
        assert_eq!(bytes[9..12], [0; 3]);
        assert_eq!(bytes[12..20], 0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(bytes[20..24], 6u32.to_le_bytes());
        assert_eq!(bytes[24..28], 5u32.to_le_bytes());
        assert_eq!(bytes[28..32], 2u32.to_le_bytes());
        assert_eq!(bytes[32..40], [1, 0, 0, 0, 1, 0, 0, 0]);
        assert_eq!(bytes[40..72], [3; 32]);
        assert_eq!(bytes[72..88], [4; 16]);
        assert_eq!(Hello::decode(&bytes), Ok(h));
        // Bytes after the hello are not its business.
        let mut longer = bytes.to_vec();
        longer.extend_from_slice(b"data");
        assert_eq!(Hello::decode(&longer), Ok(h));
        for kind in [
            Kind::Ring(0),
            Kind::Ring(u32::MAX),
            Kind::Mesh,
            Kind::Accepted(3),
        ] {
            let h = Hello { kind, ..h };
            assert_eq!(Hello::decode(&h.encode()), Ok(h));
        }
    }

    #[test]
    fn every_malformed_field_is_rejected() {
        let good = sample().encode();
        assert_eq!(Hello::decode(&good[..87]), Err(Malformed::Short));
        for i in 0..8 {
            let mut b = good;
            b[i] ^= 0x20;
            assert_eq!(Hello::decode(&b), Err(Malformed::Data), "magic byte {i}");
            // Decided on that byte, whatever follows.
            assert_eq!(early(&b[..=i]), Err(Malformed::Data), "magic byte {i}");
        }
        for (v, m) in [
            (0, Malformed::MlxUnkeyed),
            (1, Malformed::MlxKeyed),
            (3, Malformed::Version(3)),
            (255, Malformed::Version(255)),
        ] {
            let mut b = good;
            b[8] = v;
            assert_eq!(Hello::decode(&b), Err(m));
            assert_eq!(early(&b[..9]), Err(m));
        }
        for i in 9..12 {
            let mut b = good;
            b[i] = 1;
            assert_eq!(Hello::decode(&b), Err(Malformed::Reserved), "byte {i}");
        }
        for (kind, index) in [(0, 0), (4, 0), (u32::MAX, 0), (2, 1)] {
            let mut b = good;
            b[32..36].copy_from_slice(&u32::to_le_bytes(kind));
            b[36..40].copy_from_slice(&u32::to_le_bytes(index));
            assert_eq!(Hello::decode(&b), Err(Malformed::Kind(kind, index)));
        }
        assert_eq!(early(&good[..8]), Ok(()));
        assert_eq!(early(b"nuvec"), Ok(()));
        assert_eq!(early(&[]), Ok(()));
    }

    #[test]
    fn keyed_ends_get_matching_channels_and_unkeyed_ends_none() {
        let (c, a) = ring_pair(None, None);
        assert!(c.channel().is_none() && a.channel().is_none());
        let k = key(SECRET);
        let (mut c, mut a) = ring_pair(Some(&k), Some(&k));
        // Before the handshake: no nonces yet, no channel.
        assert!(c.channel().is_none() && a.channel().is_none());
        converse(&mut c, &mut a, &mut || usize::MAX);
        let (mut cc, mut ac) = (c.channel().unwrap(), a.channel().unwrap());
        // What one end seals the other opens, both ways; a second handshake of the same
        // ranks has fresh nonces, so its records open on neither.
        let (mut c2, mut a2) = ring_pair(Some(&k), Some(&k));
        converse(&mut c2, &mut a2, &mut || usize::MAX);
        let mut other = a2.channel().unwrap();
        let record = carry(&mut cc, &mut ac);
        carry(&mut ac, &mut cc);
        let mut got = [0u8; 8];
        let room = other.room(8);
        room[..record.len()].copy_from_slice(&record);
        other.filled(record.len());
        assert!(other.take(&mut got).is_err());
    }

    /// Seals "headbody" on `from`, opens it on `to`, and returns the record.
    fn carry(from: &mut Channel, to: &mut Channel) -> Vec<u8> {
        from.seal_pair(b"head", b"body").unwrap();
        let record = from.unsent().to_vec();
        assert_eq!(from.handle_sent(record.len()), Some(8));
        let room = to.room(8);
        room[..record.len()].copy_from_slice(&record);
        to.filled(record.len());
        let mut got = [0u8; 8];
        assert_eq!(to.take(&mut got).unwrap(), 8);
        assert_eq!(&got, b"headbody");
        record
    }

    #[test]
    fn ring_and_mesh_pairs_establish_and_learn_each_other() {
        let k = key(SECRET);
        for keyed in [None, Some(&k)] {
            let (mut c, mut a) = ring_pair(keyed, keyed);
            let wire = converse(&mut c, &mut a, &mut || usize::MAX);
            assert_eq!(c.outcome(), &Outcome::Established);
            assert_eq!(a.outcome(), &Outcome::Established);
            assert_eq!(
                Hello::decode(&wire.from_connector).unwrap().kind,
                Kind::Ring(1)
            );
            let theirs = a.peer_hello().unwrap();
            assert_eq!((theirs.from, theirs.to, theirs.kind), (3, 0, Kind::Ring(1)));
            let theirs = c.peer_hello().unwrap();
            assert_eq!(
                (theirs.from, theirs.to, theirs.kind),
                (0, ANY, Kind::Accepted(1))
            );
            assert_eq!(theirs.identity.host, [7; 16]);
            // Without a key the hellos are all; with one the authentication follows.
            let extra = Hello::LEN + if keyed.is_some() { 60 + 32 } else { 0 };
            assert_eq!(wire.from_connector.len(), extra);
            assert_eq!(
                wire.from_acceptor.len(),
                Hello::LEN + if keyed.is_some() { 76 + 1 } else { 0 }
            );
            // Rank 0 opening the mesh connection to rank 2 of 4? Those are not
            // neighbours only from 4 ranks up: rank 0 and 2 of 4 are not.
            let mut c = Connector::new(expect(0, 4, keyed), keyed.copied(), 2, Kind::Mesh);
            let mut a = Acceptor::new(expect(2, 4, keyed), keyed.copied(), 0);
            converse(&mut c, &mut a, &mut || 7);
            assert_eq!(c.outcome(), &Outcome::Established);
            assert_eq!(a.outcome(), &Outcome::Established);
            assert_eq!(a.peer_hello().unwrap().kind, Kind::Mesh);
        }
    }

    #[test]
    fn connections_not_expected_on_an_address_are_refused() {
        // (connector, its kind, acceptor, the acceptor's address) that must not pass.
        for (from, kind, to, slot, size) in [
            (2, Kind::Ring(1), 0, 1, 4), // not the left neighbour
            (3, Kind::Ring(0), 0, 1, 4), // another index than the address
            (0, Kind::Mesh, 2, 1, 4),    // mesh on an address other than the first
            (1, Kind::Mesh, 2, 0, 4),    // mesh from a neighbour
            (2, Kind::Mesh, 0, 0, 4),    // mesh from a higher rank
            (0, Kind::Mesh, 2, 0, 3),    // no mesh at 3 ranks
        ] {
            let mut c = Connector::new(expect(from, size, None), None, to, kind);
            let mut a = Acceptor::new(expect(to, size, None), None, slot);
            converse(&mut c, &mut a, &mut || usize::MAX);
            let r = rejection(a.outcome());
            assert_eq!(
                (r.fault, r.claimed),
                (Fault::Incompatible, Some(from as usize))
            );
            assert!(
                r.reason
                    .contains(&format!("introduced itself as rank {from} of {size}")),
                "{}",
                r.reason
            );
            // The connector, for its part, reached the rank and address it dialled or not.
            assert_ne!(c.outcome(), &Outcome::Pending);
        }
        // A connector that reached another rank than the one it dialled.
        let mut c = Connector::new(expect(3, 4, None), None, 0, Kind::Ring(1));
        let mut a = Acceptor::new(expect(1, 4, None), None, 1);
        converse(&mut c, &mut a, &mut || usize::MAX);
        let r = rejection(c.outcome());
        assert!(
            r.reason
                .contains("answered as rank 1 of 4 (a connection it accepted on its address 1), but this rank dialled rank 0 of 4"),
            "{}",
            r.reason
        );
    }

    #[test]
    fn a_shrunk_group_identity_differs_by_digest_in_the_hostfile_half() {
        let k = key(SECRET);
        let base = group_identity(&all(3), Some(&k));
        assert_eq!(shrunk_identity(base, None), base);
        let one = shrunk_identity(base, Some(&[1; 32]));
        assert_ne!(one[..16], base[..16]);
        assert_eq!(
            one[16..],
            base[16..],
            "the key half stays, so a key mismatch still says so"
        );
        assert_ne!(shrunk_identity(base, Some(&[2; 32]))[..16], one[..16]);
        assert_eq!(shrunk_identity(base, Some(&[1; 32])), one);
        // Survivors with different digests refuse each other as another group.
        let mut a_exp = expect(0, 4, None);
        a_exp.identity.group = shrunk_identity(a_exp.identity.group, Some(&[1; 32]));
        let mut c_exp = expect(3, 4, None);
        c_exp.identity.group = shrunk_identity(c_exp.identity.group, Some(&[2; 32]));
        let mut c = Connector::new(c_exp, None, 0, Kind::Ring(1));
        let mut a = Acceptor::new(a_exp, None, 1);
        converse(&mut c, &mut a, &mut || usize::MAX);
        for o in [c.outcome(), a.outcome()] {
            let r = rejection(o);
            assert_eq!(r.fault, Fault::Incompatible);
            assert!(r.reason.contains("Group::shrink"), "{}", r.reason);
        }
    }

    #[test]
    fn the_group_identity_names_what_differs() {
        let k = key(SECRET);
        let other = key("another secret of enough length");
        let base = group_identity(&all(4), None);
        assert_eq!(base[16..], [0; 16], "no key, no key half");
        assert_eq!(base, group_identity(&all(4), None));
        let mut swapped = all(4);
        swapped.swap(1, 2);
        assert_ne!(group_identity(&swapped, None)[..16], base[..16]);
        let mut joined = all(4);
        joined[0][0].push('1');
        joined[1][0].remove(0);
        assert_ne!(group_identity(&joined, None)[..16], base[..16]);
        let keyed = group_identity(&all(4), Some(&k));
        assert_eq!(keyed[..16], base[..16]);
        assert_ne!(keyed[16..], [0; 16]);
        assert_ne!(group_identity(&all(4), Some(&other))[16..], keyed[16..]);
        // Machines: another hostfile, another key, a key against none.
        let mut a_exp = expect(0, 4, None);
        a_exp.identity.group = group_identity(&swapped, None);
        let mut c = Connector::new(expect(3, 4, None), None, 0, Kind::Ring(1));
        let mut a = Acceptor::new(a_exp, None, 1);
        converse(&mut c, &mut a, &mut || usize::MAX);
        for o in [c.outcome(), a.outcome()] {
            let r = rejection(o);
            assert_eq!(r.fault, Fault::Incompatible);
            assert!(
                r.reason.contains("belongs to another group"),
                "{}",
                r.reason
            );
        }
        let (mut c, mut a) = (
            Connector::new(expect(3, 4, Some(&k)), Some(k), 0, Kind::Ring(1)),
            Acceptor::new(expect(0, 4, Some(&other)), Some(other), 1),
        );
        converse(&mut c, &mut a, &mut || usize::MAX);
        for o in [c.outcome(), a.outcome()] {
            assert_eq!(rejection(o).fault, Fault::Keys);
        }
        let (mut c, mut a) = ring_pair(Some(&k), None);
        converse(&mut c, &mut a, &mut || usize::MAX);
        assert!(rejection(c.outcome()).reason.contains("has no key"));
        assert!(rejection(a.outcome()).reason.contains("has a key"));
        assert_eq!(rejection(a.outcome()).fault, Fault::NoKey);
    }

    #[test]
    fn a_man_in_the_middle_cannot_alter_a_hello_undetected() {
        // The host identity and capabilities are not checked against anything, so only the
        // authentication can tell that they were altered on the way.
        let k = key(SECRET);
        for tamper_from_acceptor in [false, true] {
            let (mut c, mut a) = ring_pair(Some(&k), Some(&k));
            let mut hello_c = c.transmit().to_vec();
            let mut hello_a = a.transmit().to_vec();
            let target = if tamper_from_acceptor {
                &mut hello_a
            } else {
                &mut hello_c
            };
            target[75] ^= 1; // a host identity byte
            c.handle_sent(Hello::LEN);
            a.handle_sent(Hello::LEN);
            assert_eq!(c.handle_recv(&hello_a), Hello::LEN);
            assert_eq!(a.handle_recv(&hello_c), Hello::LEN);
            converse(&mut c, &mut a, &mut || usize::MAX);
            assert_eq!(rejection(c.outcome()).fault, Fault::Keys);
            assert_eq!(rejection(a.outcome()).fault, Fault::Keys);
        }
    }

    #[test]
    fn peers_that_are_not_native_are_named_on_their_first_bytes() {
        let cases: [(&[u8], &str); 4] = [
            (
                &2.0f32.to_le_bytes(),
                "does not speak the native wire: it sent collective data",
            ),
            (
                &auth::NO_KEY,
                "is on the MLX wire: it answered this rank's hello",
            ),
            (
                b"nuvecRNG\x01\0\0\0",
                "is on the MLX wire: it opened the MLX wire's keyed",
            ),
            (
                b"nuvecRNG\x03",
                "sent native hello version 3, and this build speaks version 2",
            ),
        ];
        for (bytes, says) in cases {
            let (mut c, mut a) = ring_pair(None, None);
            for hs in [&mut c as &mut dyn Handshake, &mut a] {
                assert_eq!(hs.handle_recv(bytes), bytes.len());
                let r = rejection(hs.outcome());
                assert_eq!(r.fault, Fault::Incompatible);
                assert!(r.reason.contains(says), "{}", r.reason);
                // Our hello still goes out, so that the peer learns who we are.
                assert_eq!(hs.transmit().len(), Hello::LEN);
                assert_eq!(hs.wants(), 0);
            }
        }
        // Data that starts like the magic waits for the byte that differs.
        let (mut c, _) = ring_pair(None, None);
        c.handle_recv(b"nuvec");
        assert_eq!(c.outcome(), &Outcome::Pending);
        c.handle_recv(b"X");
        assert_eq!(rejection(c.outcome()).fault, Fault::Incompatible);
    }

    #[test]
    fn an_acceptor_tells_strangers_from_misconfigured_ranks() {
        let k = key(SECRET);
        // Not a hello: data, zeros, a broken hello of this version, a close.
        let mut broken = sample().encode();
        broken[9] = 1;
        for bytes in [&2.0f32.to_le_bytes()[..], &[0; 64], &broken] {
            let (_, mut a) = ring_pair(None, None);
            a.handle_recv(bytes);
            assert!(a.is_stranger(), "{bytes:?}: {:?}", a.outcome());
        }
        let (_, mut a) = ring_pair(None, None);
        a.handle_recv(b"nu");
        assert!(!a.is_stranger(), "pending");
        a.handle_closed();
        assert!(a.is_stranger());
        // Another version or wire: a misconfigured rank.
        for bytes in [&b"nuvecRNG\x03"[..], &auth::NO_KEY, b"nuvecRNG\x01"] {
            let (_, mut a) = ring_pair(None, None);
            a.handle_recv(bytes);
            assert!(!a.is_stranger(), "{bytes:?}: {:?}", a.outcome());
        }
        // A well-formed hello of another group: a misconfigured rank.
        let mut other = expect(0, 4, None);
        other.identity.group[0] ^= 1;
        let mut c = Connector::new(expect(3, 4, None), None, 0, Kind::Ring(1));
        let mut a = Acceptor::new(other, None, 1);
        converse(&mut c, &mut a, &mut || usize::MAX);
        assert!(!a.is_stranger(), "{:?}", a.outcome());
        // This group's hello replayed, then bytes that are no answer to this challenge.
        let (c, mut a) = ring_pair(Some(&k), Some(&k));
        let n = a.transmit().len();
        a.handle_sent(n);
        assert_eq!(a.handle_recv(c.transmit()), Hello::LEN);
        let n = a.transmit().len();
        a.handle_sent(n);
        for _ in 0..1000 {
            if a.wants() == 0 {
                break;
            }
            a.handle_recv(&[0xAB]);
        }
        assert!(a.is_stranger(), "{:?}", a.outcome());
    }

    #[test]
    fn a_peer_leaving_before_its_hello_is_its_fault_and_unclaimed() {
        let (mut c, mut a) = ring_pair(None, None);
        c.handle_recv(&sample().encode()[..40]);
        for hs in [&mut c as &mut dyn Handshake, &mut a] {
            hs.handle_closed();
            let r = rejection(hs.outcome());
            assert_eq!((r.fault, r.claimed), (Fault::Peer, None));
            assert!(
                r.reason.contains("before sending its hello"),
                "{}",
                r.reason
            );
        }
    }

    #[test]
    fn reads_never_reach_past_the_hello() {
        let (mut c, a) = ring_pair(None, None);
        let mut from_a = a.transmit().to_vec();
        from_a.extend_from_slice(&[0xAB; 50]);
        assert_eq!(c.handle_recv(&from_a), Hello::LEN);
        assert_eq!(c.wants(), 0);
        assert_eq!(
            c.outcome(),
            &Outcome::Pending,
            "its own hello is not out yet"
        );
        c.handle_sent(Hello::LEN);
        assert_eq!(c.outcome(), &Outcome::Established);
        assert_eq!(c.handle_recv(&[1, 2, 3]), 0);
    }

    #[test]
    fn the_host_identity_is_stable_and_known_here() {
        let id = host_identity();
        assert_eq!(id, host_identity());
        #[cfg(target_os = "linux")]
        if std::path::Path::new("/etc/machine-id").exists() {
            assert_ne!(id, [0; 16]);
            assert_eq!(host_facts().map(|f| f.is_empty()), Some(false));
        }
    }

    fn arb_kind() -> impl Strategy<Value = Kind> {
        prop_oneof![
            any::<u32>().prop_map(Kind::Ring),
            Just(Kind::Mesh),
            any::<u32>().prop_map(Kind::Accepted),
        ]
    }

    proptest! {
        #[test]
        fn any_hello_round_trips(
            capabilities: u64, size: u32, from: u32, to: u32, kind in arb_kind(),
            group: [u8; 32], host: [u8; 16],
        ) {
            let h = Hello { identity: Identity { capabilities, size, group, host }, from, to, kind };
            prop_assert_eq!(Hello::decode(&h.encode()), Ok(h));
        }

        #[test]
        fn any_bytes_decode_without_panicking_and_re_encode(bytes in proptest::collection::vec(any::<u8>(), 0..120)) {
            if let Ok(h) = Hello::decode(&bytes) {
                prop_assert_eq!(&h.encode()[..], &bytes[..Hello::LEN]);
            }
        }

        #[test]
        fn any_chunking_gives_the_same_outcome(
            sizes in proptest::collection::vec(1usize..100, 1..32),
            keyed: bool,
        ) {
            let k = key(SECRET);
            let keyed = keyed.then_some(&k);
            let (mut c, mut a) = ring_pair(keyed, keyed);
            let mut i = 0;
            converse(&mut c, &mut a, &mut || { i += 1; sizes[i % sizes.len()] });
            prop_assert_eq!(c.outcome(), &Outcome::Established);
            prop_assert_eq!(a.outcome(), &Outcome::Established);
        }
    }
}
