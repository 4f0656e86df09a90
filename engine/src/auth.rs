//! Pre-shared-key authentication of ring connections: a mutual challenge-response, run on
//! every connection before any data when a key is set.
//!
//! The connector (the rank that opened the connection, the acceptor's left neighbour) and
//! the acceptor each send a fresh random nonce; each proves it holds the key by sending a
//! BLAKE3 keyed hash, under a key derived from the secret, of a transcript that binds both
//! nonces, both ranks, the ring's size and the connection's index. A recorded handshake is
//! useless later (the other side's nonce is new), and a proof made for one connection does
//! not fit another. Proofs are compared in constant time (`blake3::Hash`'s `==`).
//!
//! Messages, all fixed-size and little-endian, in order:
//!
//! | message | from | bytes | fields |
//! |---|---|---|---|
//! | [`Hello`] | connector | 60 | magic (8), version (1), reserved (3), ring size, connector rank, acceptor rank, connection index (u32 each), connector nonce (32) |
//! | [`Challenge`] | acceptor | 76 | magic (8), version (1), reserved (3), acceptor nonce (32), acceptor proof (32) |
//! | proof | connector | 32 | connector proof |
//! | verdict | acceptor | 1 | 1 if the connector's proof was right |
//!
//! Both sides speak first. The connector sends its [`Hello`] as soon as the connection is
//! up, and the acceptor sends the first [`GREETING_LEN`] bytes of its [`Challenge`] (magic,
//! version, nonce: nothing that depends on the hello) as soon as it accepts, and the proof
//! that completes the challenge once the hello checked out. So whichever way a connection
//! between a keyed and an unkeyed rank runs, the first bytes the unkeyed rank receives on it
//! are [`MAGIC`]: [`greeting`] lets it recognise them and fail, naming the keyed peer,
//! instead of taking them for data. The bytes on the wire are those of the first version,
//! only sent earlier, so [`VERSION`] stays 1: a rank of an older build still completes the
//! handshake with this one.
//!
//! A rank without a key that finds a greeting answers with [`NO_KEY`] (magic, then version
//! byte 0, which no handshake version uses) before it leaves, and a keyed rank that reads it,
//! or reads anything else that is not a greeting (a rank without a key sends its data
//! straight away), rejects the peer as having no key at once, on the first byte that differs,
//! rather than waiting for a whole message or the timeout.
//!
//! The native wire (`crate::native`) opens every connection with a hello that also starts
//! with [`MAGIC`], followed by [`NATIVE_VERSION`]: a keyed rank here names such a peer as a
//! native-wire rank on that byte ([`Fault::Incompatible`]), and the native wire runs these
//! same machines after its hellos, with both hellos bound into the proofs
//! ([`Connector::bind`]); without a binding the proofs are the first version's, byte for
//! byte.
//!
//! Only the handshake is protected. The collectives' traffic that follows is neither
//! encrypted nor authenticated: someone who can see or alter packets on the network can see
//! or alter the data. On an untrusted network, run the ring over a VPN or an encrypted
//! link.
//!
//! Without a key nothing at all is exchanged: MLX's ring sends no handshake, and an unkeyed
//! connection's first bytes are already the collectives' traffic.
//!
//! The handshake itself lives in two state machines, [`Connector`] and [`Acceptor`], that own
//! no socket and read no clock: the caller writes what [`Handshake::transmit`] holds, reads
//! at most [`Handshake::wants`] bytes (never more, so no byte of the traffic that follows is
//! taken) and feeds them to [`Handshake::handle_recv`], reports the peer closing with
//! [`Handshake::handle_closed`], and stops once [`Handshake::outcome`] is no longer
//! [`Outcome::Pending`]. Timeouts are the caller's.

use std::fmt;

use crate::error::{Error, Result};

/// The variable [`init`](crate::init) reads the key from.
pub const KEY_VAR: &str = "NUVEC_DISTRIBUTED_KEY";

/// The shortest secret accepted, in bytes.
pub const MIN_SECRET_BYTES: usize = 16;

/// BLAKE3 `derive_key` context: globally unique, fixed for this protocol version.
const KEY_CONTEXT: &str = "nuvec-distributed 2026-12-02 ring connection authentication v1";

/// First bytes of [`Hello`] and [`Challenge`].
pub(crate) const MAGIC: [u8; 8] = *b"nuvecRNG";

/// The protocol version this build speaks.
pub(crate) const VERSION: u8 = 1;

/// The version byte of the native wire's hello (see `crate::native`), which also starts
/// with [`MAGIC`]: a rank on the MLX wire that reads it names the peer as a native-wire rank
/// instead of taking it for a keyed one or for another handshake version.
pub(crate) const NATIVE_VERSION: u8 = 2;

/// How many bytes of its [`Challenge`] the acceptor sends before it has read the hello: the
/// magic, version, reserved bytes and its nonce.
pub(crate) const GREETING_LEN: usize = 44;

/// What a rank without a key answers to a keyed peer's greeting before it drops the
/// connection: the magic and version 0, which no handshake version uses.
pub(crate) const NO_KEY: [u8; 9] = *b"nuvecRNG\0";

/// What the first bytes a rank without a key received on a connection say about the peer
/// (see [`greeting`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Greeting {
    /// They are [`MAGIC`]: the peer has a key and started the handshake.
    Keyed,
    /// They are not: data, as from any peer without a key (MLX's or ours).
    Data,
    /// Fewer than 8 bytes, all matching the start of [`MAGIC`]: more are needed to tell.
    Undecided,
}

/// Classifies the first bytes received on a connection by a rank without a key. Exactly
/// [`MAGIC`] is taken for a keyed peer's greeting: an MLX peer whose first data on a
/// connection happens to start with these 8 bytes is misjudged (a chance of 2^-64 for
/// random data), and the group fails naming it, rather than computing on its data.
pub(crate) fn greeting(first: &[u8]) -> Greeting {
    let n = first.len().min(MAGIC.len());
    if first[..n] != MAGIC[..n] {
        Greeting::Data
    } else if n == MAGIC.len() {
        Greeting::Keyed
    } else {
        Greeting::Undecided
    }
}

/// A secret shared by every rank of a group. Its bytes never appear in `Debug` output.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Secret(Vec<u8>);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl Secret {
    /// A secret from its bytes (checked by [`Secret::key`]).
    pub(crate) fn new(bytes: &[u8]) -> Secret {
        Secret(bytes.to_vec())
    }

    /// The authentication key derived from the secret.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if the secret is shorter than [`MIN_SECRET_BYTES`].
    pub(crate) fn key(&self) -> Result<Key> {
        if self.0.len() < MIN_SECRET_BYTES {
            return Err(Error::invalid(format!(
                "the authentication key (Options::key) is {} bytes; it must be at least \
                 {MIN_SECRET_BYTES} (an empty key is not \"no key\": leave the key unset for that)",
                self.0.len()
            )));
        }
        Ok(Key(blake3::derive_key(KEY_CONTEXT, &self.0)))
    }
}

/// A key derived from a [`Secret`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Key([u8; 32]);

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Key(<redacted>)")
    }
}

impl Key {
    /// A keyed BLAKE3 hash of `data` under this key: a value only holders of the key can
    /// compute (the native wire's group identity uses it to tell keys apart).
    pub(crate) fn tag(&self, data: &[u8]) -> [u8; 32] {
        *blake3::keyed_hash(&self.0, data).as_bytes()
    }

    /// A key for another purpose, derived from this key and `parts` with BLAKE3's key
    /// derivation under `context` (globally unique, one per purpose and format version; the
    /// native wire's record keys use it). Each part goes in after its length, so two lists
    /// of parts never give the same input.
    pub(crate) fn derive(&self, context: &str, parts: &[&[u8]]) -> [u8; 32] {
        let mut h = blake3::Hasher::new_derive_key(context);
        h.update(&self.0);
        for part in parts {
            h.update(&(part.len() as u64).to_le_bytes());
            h.update(part);
        }
        *h.finalize().as_bytes()
    }
}

/// The connector's opening message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Hello {
    /// Ranks in the ring.
    pub(crate) size: u32,
    /// The connector's rank.
    pub(crate) from: u32,
    /// The rank the connector believes it reached.
    pub(crate) to: u32,
    /// Which of the acceptor's addresses (connection index) this is.
    pub(crate) index: u32,
    /// The connector's nonce.
    pub(crate) nonce: [u8; 32],
}

/// The acceptor's answer: its nonce and its proof.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Challenge {
    /// The acceptor's nonce.
    pub(crate) nonce: [u8; 32],
    /// The acceptor's proof over the transcript.
    pub(crate) proof: [u8; 32],
}

/// Why bytes from a peer are not a handshake message this build accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Malformed {
    /// Fewer bytes than the message needs.
    Short,
    /// The first bytes are not [`MAGIC`]: not a nuvec peer with a key (perhaps no key).
    Magic,
    /// The peer said it has no key ([`NO_KEY`]).
    NoKey,
    /// A protocol version this build does not speak.
    Version(u8),
    /// The native wire's hello ([`NATIVE_VERSION`]): the peer is on the other wire.
    Native,
}

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Malformed::Short => f.write_str("a truncated handshake message"),
            Malformed::Magic => write!(
                f,
                "data that is not a nuvec handshake: it has no key ({KEY_VAR}) or is not a \
                 nuvec rank, and this rank has one"
            ),
            Malformed::NoKey => write!(
                f,
                "a message saying that it has no key ({KEY_VAR}), and this rank has one"
            ),
            Malformed::Version(v) => {
                write!(f, "handshake version {v}, this build speaks {VERSION}")
            }
            Malformed::Native => write!(
                f,
                "a native-wire hello: it runs the native wire (NUVEC_DISTRIBUTED_WIRE=native) \
                 and this rank the MLX wire; choose the same wire on every rank"
            ),
        }
    }
}

impl Hello {
    /// Encoded size.
    pub(crate) const LEN: usize = 60;

    /// A hello with a fresh random nonce.
    pub(crate) fn new(size: usize, from: usize, to: usize, index: usize) -> Result<Hello> {
        let word = |v: usize| {
            u32::try_from(v)
                .map_err(|_| Error::invalid(format!("{v} does not fit a handshake field")))
        };
        Ok(Hello {
            size: word(size)?,
            from: word(from)?,
            to: word(to)?,
            index: word(index)?,
            nonce: nonce()?,
        })
    }

    /// The wire bytes.
    pub(crate) fn encode(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        out[..8].copy_from_slice(&MAGIC);
        out[8] = VERSION;
        for (i, v) in [self.size, self.from, self.to, self.index]
            .into_iter()
            .enumerate()
        {
            out[12 + 4 * i..16 + 4 * i].copy_from_slice(&v.to_le_bytes());
        }
        out[28..].copy_from_slice(&self.nonce);
        out
    }

    /// Parses wire bytes (exactly [`Hello::LEN`] are read; more are ignored).
    pub(crate) fn decode(bytes: &[u8]) -> std::result::Result<Hello, Malformed> {
        let bytes = header(bytes, Self::LEN)?;
        let word = |i: usize| {
            u32::from_le_bytes([
                bytes[12 + 4 * i],
                bytes[13 + 4 * i],
                bytes[14 + 4 * i],
                bytes[15 + 4 * i],
            ])
        };
        let mut nonce = [0u8; 32];
        nonce.copy_from_slice(&bytes[28..60]);
        Ok(Hello {
            size: word(0),
            from: word(1),
            to: word(2),
            index: word(3),
            nonce,
        })
    }
}

impl Challenge {
    /// Encoded size.
    pub(crate) const LEN: usize = 76;

    /// The wire bytes.
    pub(crate) fn encode(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        out[..8].copy_from_slice(&MAGIC);
        out[8] = VERSION;
        out[12..44].copy_from_slice(&self.nonce);
        out[44..].copy_from_slice(&self.proof);
        out
    }

    /// Parses wire bytes (exactly [`Challenge::LEN`] are read).
    pub(crate) fn decode(bytes: &[u8]) -> std::result::Result<Challenge, Malformed> {
        let bytes = header(bytes, Self::LEN)?;
        let (mut nonce, mut proof) = ([0u8; 32], [0u8; 32]);
        nonce.copy_from_slice(&bytes[12..44]);
        proof.copy_from_slice(&bytes[44..76]);
        Ok(Challenge { nonce, proof })
    }
}

/// Checks the length, magic and version shared by both messages.
fn header(bytes: &[u8], len: usize) -> std::result::Result<&[u8], Malformed> {
    let bytes = bytes.get(..len).ok_or(Malformed::Short)?;
    early(bytes)?;
    if bytes[8] != VERSION {
        return Err(Malformed::Version(bytes[8]));
    }
    Ok(bytes)
}

/// Checks the start of a message as far as it has arrived, so that a peer without a key is
/// turned away on the first byte that is not a greeting's (its data may be shorter than a
/// message, and it may then wait for ours).
fn early(received: &[u8]) -> std::result::Result<(), Malformed> {
    if greeting(received) == Greeting::Data {
        return Err(Malformed::Magic);
    }
    if received.get(8) == Some(&NO_KEY[8]) {
        return Err(Malformed::NoKey);
    }
    if received.get(8) == Some(&NATIVE_VERSION) {
        return Err(Malformed::Native);
    }
    Ok(())
}

/// Takes up to `wants` of `bytes` into `inbuf` after the `got` bytes already there, and
/// with `check` runs [`early`] over all that has arrived: how many bytes were taken and
/// what `early` found, or `None` when nothing was taken (no progress, nothing to check).
fn take_in(
    (inbuf, got): (&mut [u8], &mut usize),
    wants: usize,
    bytes: &[u8],
    check: bool,
) -> Option<(usize, std::result::Result<(), Malformed>)> {
    let n = wants.min(bytes.len());
    if n == 0 {
        return None;
    }
    inbuf[*got..*got + n].copy_from_slice(&bytes[..n]);
    *got += n;
    let found = if check { early(&inbuf[..*got]) } else { Ok(()) };
    Some((n, found))
}

/// The fault a malformed message is blamed on.
fn malformed_fault(m: Malformed) -> Fault {
    match m {
        Malformed::Magic | Malformed::NoKey => Fault::NoKey,
        Malformed::Short | Malformed::Version(_) => Fault::Peer,
        Malformed::Native => Fault::Incompatible,
    }
}

/// A fresh random nonce from the operating system.
fn nonce() -> Result<[u8; 32]> {
    random_bytes("drawing a random nonce")
}

/// `N` fresh random bytes from the operating system; `what` names the draw in the error.
pub(crate) fn random_bytes<const N: usize>(what: &str) -> Result<[u8; N]> {
    let mut n = [0u8; N];
    getrandom::fill(&mut n)
        .map_err(|e| Error::local(what, std::io::Error::other(e.to_string())))?;
    Ok(n)
}

/// Which side a proof is made by: each side's proof is different, so one side's proof can
/// never be reflected back as the other's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// The rank that opened the connection.
    Connector,
    /// The rank that accepted it.
    Acceptor,
}

/// The proof `role` sends for the handshake of `hello` and the acceptor's `acceptor_nonce`,
/// and of `bound` when the caller binds more into the transcript (the native wire's hellos;
/// without it the proof is the MLX wire's, byte for byte).
fn proof(
    key: &Key,
    role: Role,
    hello: &Hello,
    acceptor_nonce: &[u8; 32],
    bound: Option<&[u8; 32]>,
) -> [u8; 32] {
    let mut h = blake3::Hasher::new_keyed(&key.0);
    h.update(match role {
        Role::Connector => b"connector proof",
        Role::Acceptor => b"acceptor proof\0",
    });
    h.update(&hello.encode());
    h.update(acceptor_nonce);
    if let Some(bound) = bound {
        h.update(b"bound");
        h.update(bound);
    }
    *h.finalize().as_bytes()
}

/// Whether `received` is `role`'s proof for this handshake, compared in constant time.
fn verify(
    key: &Key,
    role: Role,
    hello: &Hello,
    acceptor_nonce: &[u8; 32],
    bound: Option<&[u8; 32]>,
    received: &[u8; 32],
) -> bool {
    blake3::Hash::from(proof(key, role, hello, acceptor_nonce, bound))
        == blake3::Hash::from(*received)
}

/// The ranks and connection a handshake is about: what a connector claims, and what an
/// acceptor expects on the address it accepted on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Link {
    /// Ranks in the ring.
    pub(crate) size: usize,
    /// The rank that opens the connection.
    pub(crate) connector: usize,
    /// The rank that accepts it.
    pub(crate) acceptor: usize,
    /// Which of the acceptor's addresses (connection index) it is opened to.
    pub(crate) index: usize,
}

/// Where a handshake stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// It needs to send or receive more.
    Pending,
    /// The connection may carry the ring's traffic: the peer proved the key, or there is no
    /// key to prove.
    Established,
    /// The connection must be dropped.
    Rejected(Rejection),
}

/// Why a handshake failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Rejection {
    /// Who is at fault.
    pub(crate) fault: Fault,
    /// The rank the peer claimed to be, if it got that far (acceptor side only: a connector
    /// knows whom it dialled).
    pub(crate) claimed: Option<usize>,
    /// What went wrong, as a sentence about the peer.
    pub(crate) reason: String,
    /// The peer said, with [`NO_KEY`], that it has no key: a rank of this program, not a
    /// stranger's garbage, so an acceptor need not wait for another client.
    pub(crate) said_no_key: bool,
}

/// Who a failed handshake is blamed on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    /// The peer: it sent something that is not this handshake (garbage, or traffic from a
    /// rank without a key), spoke another version, claimed to be another rank or connection,
    /// or left mid-way.
    Peer,
    /// Neither side alone: both ran the handshake, but a proof did not verify, so the keys
    /// differ. A rank cannot tell whose key is the odd one out.
    Keys,
    /// The peer has no key (it said so, or sent data where a greeting belongs) and this
    /// rank has one: the ranks were configured differently.
    NoKey,
    /// The peer runs the other wire (native against MLX), another version of it, or belongs
    /// to another group: the ranks were configured differently.
    Incompatible,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Fault::Peer => "the peer broke the handshake",
            Fault::Keys => "the keys differ",
            Fault::NoKey => "the peer has no key",
            Fault::Incompatible => "the peer is incompatible",
        })
    }
}

impl Rejection {
    fn peer(claimed: Option<usize>, reason: impl Into<String>) -> Outcome {
        Outcome::Rejected(Rejection {
            fault: Fault::Peer,
            claimed,
            reason: reason.into(),
            said_no_key: false,
        })
    }

    fn malformed(claimed: Option<usize>, m: Malformed, reason: String) -> Outcome {
        Outcome::Rejected(Rejection {
            fault: malformed_fault(m),
            claimed,
            reason,
            said_no_key: m == Malformed::NoKey,
        })
    }

    fn keys(claimed: Option<usize>, reason: impl Into<String>) -> Outcome {
        Outcome::Rejected(Rejection {
            fault: Fault::Keys,
            claimed,
            reason: reason.into(),
            said_no_key: false,
        })
    }
}

/// The interface both sides of the handshake share, in the order a caller drives it.
pub(crate) trait Handshake {
    /// Bytes to write now (empty if none). After [`Outcome::Rejected`] these are parting
    /// bytes that let the peer learn why; write them once if they fit, and drop the
    /// connection either way.
    fn transmit(&self) -> &[u8];
    /// `n` bytes of [`Handshake::transmit`] were written.
    fn handle_sent(&mut self, n: usize);
    /// How many bytes to read now, at most (0: none). Reading more would take bytes that
    /// belong to the traffic after the handshake.
    fn wants(&self) -> usize;
    /// Bytes read from the peer; returns how many were taken (at most
    /// [`Handshake::wants`]).
    fn handle_recv(&mut self, bytes: &[u8]) -> usize;
    /// The peer closed the connection (or reading from it failed).
    fn handle_closed(&mut self);
    /// Where the handshake stands.
    fn outcome(&self) -> &Outcome;
}

/// Where a keyed connector is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ConnectorPhase {
    /// Sending the hello, then reading the challenge.
    Challenge,
    /// Sending the proof, then reading the verdict.
    Verdict,
}

/// The side that opened the connection: sends [`Hello`], checks the acceptor's
/// [`Challenge`], sends its proof, reads the verdict.
#[derive(Debug)]
pub(crate) struct Connector {
    key: Option<Key>,
    hello: Hello,
    /// What the proofs bind besides the MLX wire's transcript (see [`Connector::bind`]).
    bound: Option<[u8; 32]>,
    phase: ConnectorPhase,
    out: Vec<u8>,
    sent: usize,
    inbuf: [u8; Challenge::LEN],
    got: usize,
    /// The acceptor's nonce, once its challenge proved the key.
    acceptor_nonce: Option<[u8; 32]>,
    outcome: Outcome,
}

impl Connector {
    /// A connector for `link` with a fresh nonce; without a key, one that is already
    /// established and sends nothing.
    pub(crate) fn new(key: Option<Key>, link: Link) -> Result<Connector> {
        let nonce = if key.is_some() { nonce()? } else { [0; 32] };
        Connector::with_nonce(key, link, nonce)
    }

    /// A connector with a given nonce (tests and fuzzing, which need to be repeatable).
    pub(crate) fn with_nonce(key: Option<Key>, link: Link, nonce: [u8; 32]) -> Result<Connector> {
        let mut hello = Hello::new(link.size, link.connector, link.acceptor, link.index)?;
        hello.nonce = nonce;
        let (out, outcome) = match key {
            Some(_) => (hello.encode().to_vec(), Outcome::Pending),
            None => (Vec::new(), Outcome::Established),
        };
        Ok(Connector {
            key,
            hello,
            bound: None,
            phase: ConnectorPhase::Challenge,
            out,
            sent: 0,
            inbuf: [0; Challenge::LEN],
            got: 0,
            acceptor_nonce: None,
            outcome,
        })
    }

    /// The connection's nonces, the connector's then the acceptor's, once the keyed
    /// handshake is established: what the native wire derives its record keys from
    /// (`transport::tcp::seal`). `None` without a key or before then.
    pub(crate) fn nonces(&self) -> Option<([u8; 32], [u8; 32])> {
        match (&self.outcome, self.key, self.acceptor_nonce) {
            (Outcome::Established, Some(_), Some(theirs)) => Some((self.hello.nonce, theirs)),
            _ => None,
        }
    }

    /// Binds `bound` into both proofs (the native wire binds its hellos, so that no one can
    /// alter them undetected); both sides must bind the same value.
    pub(crate) fn bind(mut self, bound: [u8; 32]) -> Connector {
        self.bound = Some(bound);
        self
    }

    fn challenge_read(&mut self, key: &Key) {
        let challenge = match Challenge::decode(&self.inbuf) {
            Ok(c) => c,
            Err(m) => {
                self.outcome = Rejection::malformed(None, m, format!("it sent {m}"));
                return;
            }
        };
        // Our proof goes out even if theirs is wrong, so that the acceptor can tell its
        // operator that we did not prove the key either.
        let bound = self.bound.as_ref();
        self.out = proof(key, Role::Connector, &self.hello, &challenge.nonce, bound).to_vec();
        self.sent = 0;
        if !verify(
            key,
            Role::Acceptor,
            &self.hello,
            &challenge.nonce,
            bound,
            &challenge.proof,
        ) {
            self.outcome =
                Rejection::keys(None, "it did not prove the key (the ranks' keys differ)");
            return;
        }
        self.acceptor_nonce = Some(challenge.nonce);
        self.phase = ConnectorPhase::Verdict;
        self.got = 0;
    }
}

impl Handshake for Connector {
    fn transmit(&self) -> &[u8] {
        &self.out[self.sent..]
    }

    fn handle_sent(&mut self, n: usize) {
        self.sent = (self.sent + n).min(self.out.len());
    }

    fn wants(&self) -> usize {
        if self.outcome != Outcome::Pending || self.sent < self.out.len() {
            return 0;
        }
        match self.phase {
            ConnectorPhase::Challenge => Challenge::LEN - self.got,
            ConnectorPhase::Verdict => 1 - self.got,
        }
    }

    fn handle_recv(&mut self, bytes: &[u8]) -> usize {
        let Some(key) = self.key else { return 0 };
        let check = self.phase == ConnectorPhase::Challenge;
        let wants = self.wants();
        let into = (&mut self.inbuf[..], &mut self.got);
        let Some((n, found)) = take_in(into, wants, bytes, check) else {
            return 0;
        };
        if let Err(m) = found {
            self.outcome = Rejection::malformed(None, m, format!("it sent {m}"));
            return n;
        }
        match self.phase {
            ConnectorPhase::Challenge if self.got == Challenge::LEN => self.challenge_read(&key),
            ConnectorPhase::Verdict if self.got == 1 => {
                self.outcome = match self.inbuf[0] {
                    1 => Outcome::Established,
                    0 => Rejection::keys(None, "it refused this rank's proof"),
                    _ => Rejection::peer(None, "it refused this rank's proof"),
                };
            }
            _ => {}
        }
        n
    }

    fn handle_closed(&mut self) {
        if self.outcome != Outcome::Pending {
            return;
        }
        self.outcome = Rejection::peer(
            None,
            match self.phase {
                ConnectorPhase::Challenge => {
                    "closed the connection during the handshake (is the key set on every rank?)"
                }
                ConnectorPhase::Verdict => {
                    "it closed the connection instead of accepting this rank's proof"
                }
            },
        );
    }

    fn outcome(&self) -> &Outcome {
        &self.outcome
    }
}

/// Where a keyed acceptor is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AcceptorPhase {
    /// Reading the connector's hello.
    Hello,
    /// Sending the challenge.
    Challenge(Hello),
    /// Reading the connector's proof.
    Proof(Hello),
    /// Sending the verdict: whether the proof was right.
    Verdict(Hello, bool),
}

/// The side that accepted the connection: reads [`Hello`] and checks that it comes from the
/// rank and connection expected, sends its [`Challenge`], checks the connector's proof and
/// sends the verdict.
#[derive(Debug)]
pub(crate) struct Acceptor {
    key: Option<Key>,
    expect: Link,
    /// What the proofs bind besides the MLX wire's transcript (see [`Acceptor::bind`]).
    bound: Option<[u8; 32]>,
    nonce: [u8; 32],
    phase: AcceptorPhase,
    inbuf: [u8; Hello::LEN],
    got: usize,
    out: [u8; Challenge::LEN],
    out_len: usize,
    sent: usize,
    outcome: Outcome,
}

impl Acceptor {
    /// An acceptor expecting `expect`, with a fresh nonce; without a key, one that is
    /// already established and reads nothing.
    pub(crate) fn new(key: Option<Key>, expect: Link) -> Result<Acceptor> {
        let nonce = if key.is_some() { nonce()? } else { [0; 32] };
        Ok(Acceptor::with_nonce(key, expect, nonce))
    }

    /// An acceptor with a given nonce (tests and fuzzing, which need to be repeatable).
    /// With a key, its greeting (the start of its challenge) is ready to send at once.
    pub(crate) fn with_nonce(key: Option<Key>, expect: Link, nonce: [u8; 32]) -> Acceptor {
        // The proof is filled in once the hello is read.
        let out = Challenge {
            nonce,
            proof: [0; 32],
        }
        .encode();
        Acceptor {
            key,
            expect,
            bound: None,
            nonce,
            phase: AcceptorPhase::Hello,
            inbuf: [0; Hello::LEN],
            got: 0,
            out,
            out_len: if key.is_some() { GREETING_LEN } else { 0 },
            sent: 0,
            outcome: match key {
                Some(_) => Outcome::Pending,
                None => Outcome::Established,
            },
        }
    }

    /// Binds `bound` into both proofs, as [`Connector::bind`].
    pub(crate) fn bind(mut self, bound: [u8; 32]) -> Acceptor {
        self.bound = Some(bound);
        self
    }

    /// The connection's nonces, the connector's then the acceptor's, once the keyed
    /// handshake is established (as [`Connector::nonces`]).
    pub(crate) fn nonces(&self) -> Option<([u8; 32], [u8; 32])> {
        match (&self.outcome, self.key, self.phase) {
            (Outcome::Established, Some(_), AcceptorPhase::Verdict(hello, true)) => {
                Some((hello.nonce, self.nonce))
            }
            _ => None,
        }
    }

    fn hello_read(&mut self, key: &Key) {
        let hello = match Hello::decode(&self.inbuf) {
            Ok(h) => h,
            Err(m) => {
                self.outcome = Rejection::malformed(None, m, self.sent_by_client(m));
                return;
            }
        };
        let expect = &self.expect;
        let fits = hello.size as usize == expect.size
            && hello.from as usize == expect.connector
            && hello.to as usize == expect.acceptor
            && hello.index as usize == expect.index;
        if !fits {
            self.outcome = Rejection::peer(
                Some(hello.from as usize),
                format!(
                    "a client introduced itself as rank {} of {} opening connection {} to rank {}, \
                     but this address expects rank {} of {} opening connection {} to rank {}",
                    hello.from,
                    hello.size,
                    hello.index,
                    hello.to,
                    expect.connector,
                    expect.size,
                    expect.index,
                    expect.acceptor
                ),
            );
            return;
        }
        // The greeting went out (or is going out) already; the proof completes it.
        let proof = proof(
            key,
            Role::Acceptor,
            &hello,
            &self.nonce,
            self.bound.as_ref(),
        );
        self.out[GREETING_LEN..].copy_from_slice(&proof);
        self.out_len = Challenge::LEN;
        self.phase = AcceptorPhase::Challenge(hello);
    }

    /// The reason for turning away a client that sent `m`. Any client may connect, but the
    /// one expected here is the left neighbour, so a client without a key is named as that
    /// rank, tentatively.
    fn sent_by_client(&self, m: Malformed) -> String {
        match m {
            Malformed::Magic | Malformed::NoKey | Malformed::Native => format!(
                "a client (rank {}, if it is the neighbour expected there) sent {m}",
                self.expect.connector
            ),
            Malformed::Short | Malformed::Version(_) => format!("a client sent {m}"),
        }
    }
}

/// The rejection of a client that left after saying who it is, without proving the key.
fn gone(hello: &Hello) -> Outcome {
    Rejection::peer(
        Some(hello.from as usize),
        format!(
            "a client claiming to be rank {} closed the connection during the handshake (it did \
             not prove the key)",
            hello.from
        ),
    )
}

impl Handshake for Acceptor {
    fn transmit(&self) -> &[u8] {
        match self.phase {
            AcceptorPhase::Hello | AcceptorPhase::Challenge(_) | AcceptorPhase::Verdict(..)
                if self.outcome == Outcome::Pending =>
            {
                self.out.get(self.sent..self.out_len).unwrap_or(&[])
            }
            _ => &[],
        }
    }

    fn handle_sent(&mut self, n: usize) {
        if self.transmit().is_empty() {
            return;
        }
        self.sent = (self.sent + n).min(self.out_len);
        if self.sent < self.out_len {
            return;
        }
        match self.phase {
            AcceptorPhase::Challenge(hello) => {
                self.phase = AcceptorPhase::Proof(hello);
                self.got = 0;
            }
            // The greeting is out; the rest of the challenge waits for the hello.
            AcceptorPhase::Hello => {}
            AcceptorPhase::Verdict(_, true) => self.outcome = Outcome::Established,
            AcceptorPhase::Verdict(hello, false) => {
                self.outcome = Rejection::keys(
                    Some(hello.from as usize),
                    format!(
                        "rank {} did not prove the key (the ranks' keys differ)",
                        hello.from
                    ),
                );
            }
            AcceptorPhase::Proof(_) => {}
        }
    }

    fn wants(&self) -> usize {
        if self.outcome != Outcome::Pending {
            return 0;
        }
        match self.phase {
            AcceptorPhase::Hello => Hello::LEN - self.got,
            AcceptorPhase::Proof(_) => 32 - self.got,
            AcceptorPhase::Challenge(_) | AcceptorPhase::Verdict(..) => 0,
        }
    }

    fn handle_recv(&mut self, bytes: &[u8]) -> usize {
        let Some(key) = self.key else { return 0 };
        let check = self.phase == AcceptorPhase::Hello;
        let wants = self.wants();
        let into = (&mut self.inbuf[..], &mut self.got);
        let Some((n, found)) = take_in(into, wants, bytes, check) else {
            return 0;
        };
        if let Err(m) = found {
            self.outcome = Rejection::malformed(None, m, self.sent_by_client(m));
            return n;
        }
        match self.phase {
            AcceptorPhase::Hello if self.got == Hello::LEN => self.hello_read(&key),
            AcceptorPhase::Proof(hello) if self.got == 32 => {
                let mut received = [0u8; 32];
                received.copy_from_slice(&self.inbuf[..32]);
                let bound = self.bound.as_ref();
                let ok = verify(&key, Role::Connector, &hello, &self.nonce, bound, &received);
                self.out[0] = u8::from(ok);
                self.out_len = 1;
                self.sent = 0;
                self.phase = AcceptorPhase::Verdict(hello, ok);
            }
            _ => {}
        }
        n
    }

    fn handle_closed(&mut self) {
        if self.outcome != Outcome::Pending {
            return;
        }
        self.outcome = match &self.phase {
            AcceptorPhase::Hello => Rejection::peer(
                None,
                "a client closed the connection before saying who it is",
            ),
            AcceptorPhase::Challenge(hello)
            | AcceptorPhase::Proof(hello)
            | AcceptorPhase::Verdict(hello, _) => gone(hello),
        };
    }

    fn outcome(&self) -> &Outcome {
        &self.outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fuzzing::{Wire, converse};

    fn key(s: &str) -> Key {
        Secret::new(s.as_bytes()).key().unwrap()
    }

    #[test]
    fn short_secrets_are_refused() {
        let e = Secret::new(b"fifteen bytes!!")
            .key()
            .unwrap_err()
            .to_string();
        assert!(e.contains("15 bytes") && e.contains("at least 16"), "{e}");
        assert!(Secret::new(b"sixteen bytes!!!").key().is_ok());
    }

    #[test]
    fn messages_round_trip_and_reject_garbage() {
        let hello = Hello::new(4, 3, 0, 1).unwrap();
        assert_eq!(Hello::decode(&hello.encode()), Ok(hello));
        let challenge = Challenge {
            nonce: [7; 32],
            proof: [9; 32],
        };
        assert_eq!(Challenge::decode(&challenge.encode()), Ok(challenge));
        assert_eq!(Hello::decode(&hello.encode()[..59]), Err(Malformed::Short));
        assert_eq!(Hello::decode(&[0u8; 60]), Err(Malformed::Magic));
        let mut v3 = hello.encode();
        v3[8] = 3;
        assert_eq!(Hello::decode(&v3), Err(Malformed::Version(3)));
        // Version 2 is the native wire's hello, named as such.
        v3[8] = NATIVE_VERSION;
        assert_eq!(Hello::decode(&v3), Err(Malformed::Native));
    }

    #[test]
    fn nonces_are_fresh() {
        let (a, b) = (
            Hello::new(2, 0, 1, 0).unwrap(),
            Hello::new(2, 0, 1, 0).unwrap(),
        );
        assert_ne!(a.nonce, b.nonce);
    }

    #[test]
    fn proofs_bind_the_key_the_role_and_the_transcript() {
        let k = key("a shared secret of enough length");
        let hello = Hello::new(3, 2, 0, 1).unwrap();
        let n = [5u8; 32];
        let p = proof(&k, Role::Acceptor, &hello, &n, None);
        assert!(verify(&k, Role::Acceptor, &hello, &n, None, &p));
        // What the caller binds is covered too, and binding nothing is not binding zeros.
        let b = proof(&k, Role::Acceptor, &hello, &n, Some(&[0; 32]));
        assert_ne!(b, p);
        assert!(verify(&k, Role::Acceptor, &hello, &n, Some(&[0; 32]), &b));
        assert!(!verify(&k, Role::Acceptor, &hello, &n, Some(&[1; 32]), &b));
        // Another key, the other role, another nonce, another connection: all fail.
        assert!(!verify(
            &key("another secret of enough length"),
            Role::Acceptor,
            &hello,
            &n,
            None,
            &p
        ));
        assert!(!verify(&k, Role::Connector, &hello, &n, None, &p));
        assert!(!verify(&k, Role::Acceptor, &hello, &[6u8; 32], None, &p));
        let other = Hello { index: 0, ..hello };
        assert!(!verify(&k, Role::Acceptor, &other, &n, None, &p));
        let replayed = Hello {
            nonce: [1; 32],
            ..hello
        };
        assert!(!verify(&k, Role::Acceptor, &replayed, &n, None, &p));
    }

    /// A ring of 4 where rank 3 opens connection 1 to rank 0.
    const LINK: Link = Link {
        size: 4,
        connector: 3,
        acceptor: 0,
        index: 1,
    };
    const SECRET: &str = "a shared secret of enough length";

    /// A pair with the same key, the connector's hello read by the acceptor.
    fn greeted() -> (Connector, Acceptor) {
        let k = key(SECRET);
        let (mut c, mut a) = pair(Some(k), Some(k), LINK);
        let hello = c.transmit().to_vec();
        c.handle_sent(hello.len());
        a.handle_recv(&hello);
        (c, a)
    }

    /// The connector of a [`greeted`] pair once it has read the challenge and sent its proof.
    fn proved() -> Connector {
        let (mut c, a) = greeted();
        c.handle_recv(a.transmit());
        c.handle_sent(32);
        c
    }

    fn pair(ck: Option<Key>, ak: Option<Key>, expect: Link) -> (Connector, Acceptor) {
        (
            Connector::with_nonce(ck, LINK, [1; 32]).unwrap(),
            Acceptor::with_nonce(ak, expect, [2; 32]),
        )
    }

    /// Panics, with the reason, unless `r`'s reason says `says`.
    fn assert_says(r: &Rejection, says: &str) {
        assert!(r.reason.contains(says), "{}", r.reason);
    }

    fn rejection(o: &Outcome) -> &Rejection {
        match o {
            Outcome::Rejected(r) => r,
            other => panic!("expected a rejection, got {other:?}"),
        }
    }

    fn whole(c: &mut Connector, a: &mut Acceptor) -> Wire {
        converse(c, a, &mut || usize::MAX)
    }

    #[test]
    fn keyed_handshake_sends_exactly_todays_bytes() {
        let k = key(SECRET);
        for size in [1, 2, 3, 7, usize::MAX] {
            let (mut c, mut a) = pair(Some(k), Some(k), LINK);
            let wire = converse(&mut c, &mut a, &mut || size);
            assert_eq!(c.outcome(), &Outcome::Established, "chunks of {size}");
            assert_eq!(a.outcome(), &Outcome::Established, "chunks of {size}");
            let hello = Hello {
                size: 4,
                from: 3,
                to: 0,
                index: 1,
                nonce: [1; 32],
            };
            let mut expect_c = hello.encode().to_vec();
            expect_c.extend(proof(&k, Role::Connector, &hello, &[2; 32], None));
            let mut expect_a = Challenge {
                nonce: [2; 32],
                proof: proof(&k, Role::Acceptor, &hello, &[2; 32], None),
            }
            .encode()
            .to_vec();
            expect_a.push(1);
            assert_eq!(wire.from_connector, expect_c);
            assert_eq!(wire.from_acceptor, expect_a);
            assert_eq!((c.transmit(), c.wants()), (&[][..], 0));
            assert_eq!((a.transmit(), a.wants()), (&[][..], 0));
        }
    }

    #[test]
    fn unkeyed_sides_send_and_read_nothing() {
        let (mut c, mut a) = pair(None, None, LINK);
        for hs in [&mut c as &mut dyn Handshake, &mut a] {
            assert_eq!(hs.outcome(), &Outcome::Established);
            assert!(hs.transmit().is_empty());
            assert_eq!(hs.wants(), 0);
            // Whatever arrives is the ring's traffic, not the handshake's.
            assert_eq!(hs.handle_recv(b"collective data"), 0);
            hs.handle_closed();
            assert_eq!(hs.outcome(), &Outcome::Established);
        }
    }

    #[test]
    fn reads_never_reach_past_the_handshake() {
        let k = key(SECRET);
        let (mut c, mut a) = pair(Some(k), Some(k), LINK);
        let mut hello = c.transmit().to_vec();
        c.handle_sent(hello.len());
        hello.extend_from_slice(&[0xAB; 100]);
        assert_eq!(a.handle_recv(&hello), Hello::LEN);
        let mut challenge = a.transmit().to_vec();
        a.handle_sent(challenge.len());
        challenge.extend_from_slice(&[0xCD; 100]);
        assert_eq!(c.handle_recv(&challenge), Challenge::LEN);
        let mut proof = c.transmit().to_vec();
        c.handle_sent(proof.len());
        proof.extend_from_slice(&[0xEF; 100]);
        assert_eq!(a.handle_recv(&proof), 32);
        let verdict = a.transmit().to_vec();
        a.handle_sent(1);
        assert_eq!(c.handle_recv(&[verdict[0], 9, 9]), 1);
        assert_eq!(c.outcome(), &Outcome::Established);
        assert_eq!(a.outcome(), &Outcome::Established);
    }

    #[test]
    fn a_connector_reads_nothing_before_its_hello_is_out() {
        let k = key(SECRET);
        let (mut c, _) = pair(Some(k), None, LINK);
        assert_eq!(c.wants(), 0);
        c.handle_sent(59);
        assert_eq!(c.wants(), 0);
        c.handle_sent(1);
        assert_eq!(c.wants(), Challenge::LEN);
    }

    #[test]
    fn different_keys_fail_on_both_sides() {
        let (mut c, mut a) = pair(
            Some(key(SECRET)),
            Some(key("another secret of enough length")),
            LINK,
        );
        whole(&mut c, &mut a);
        let (rc, ra) = (rejection(c.outcome()), rejection(a.outcome()));
        assert_eq!(rc.fault, Fault::Keys);
        assert_says(rc, "did not prove the key");
        // The connector's parting proof still reached the acceptor, which names the rank.
        assert_eq!((ra.fault, ra.claimed), (Fault::Keys, Some(3)));
        assert_says(ra, "rank 3 did not prove the key");
    }

    #[test]
    fn a_wrong_proof_alone_is_refused_and_the_connector_told() {
        let (_, mut a) = greeted();
        a.handle_sent(Challenge::LEN);
        a.handle_recv(&[0; 32]);
        assert_eq!(a.transmit(), &[0]);
        assert_eq!(
            a.outcome(),
            &Outcome::Pending,
            "rejected before the verdict is out"
        );
        a.handle_sent(1);
        assert_eq!(rejection(a.outcome()).fault, Fault::Keys);
        // The connector, on reading a zero verdict:
        let mut c = proved();
        c.handle_recv(&[0]);
        let r = rejection(c.outcome());
        assert_eq!(r.fault, Fault::Keys);
        assert_says(r, "refused this rank's proof");
    }

    #[test]
    fn a_verdict_that_is_not_a_verdict_is_the_peers_fault() {
        let mut c = proved();
        c.handle_recv(&[7]);
        assert_eq!(rejection(c.outcome()).fault, Fault::Peer);
    }

    #[test]
    fn wrong_rank_index_or_size_is_refused_naming_the_claim() {
        let k = key(SECRET);
        for expect in [
            Link {
                connector: 2,
                ..LINK
            },
            Link {
                acceptor: 1,
                ..LINK
            },
            Link { index: 0, ..LINK },
            Link { size: 5, ..LINK },
        ] {
            let (mut c, mut a) = pair(Some(k), Some(k), expect);
            let wire = whole(&mut c, &mut a);
            let r = rejection(a.outcome());
            assert_eq!((r.fault, r.claimed), (Fault::Peer, Some(3)), "{expect:?}");
            assert_says(
                r,
                "introduced itself as rank 3 of 4 opening connection 1 to rank 0",
            );
            assert_eq!(
                wire.from_acceptor,
                Challenge {
                    nonce: [2; 32],
                    proof: [0; 32]
                }
                .encode()[..GREETING_LEN],
                "the greeting only: no proof for a wrong claim"
            );
            // The connector sees the connection closed, waiting for the challenge.
            let rc = rejection(c.outcome());
            assert!(
                rc.reason
                    .contains("closed the connection during the handshake")
            );
        }
    }

    #[test]
    fn garbage_is_refused_on_either_side() {
        let k = key(SECRET);
        for (bytes, says) in [
            // What a rank without a key sends: the ring's traffic, here zeros.
            (
                vec![0u8; 80],
                "not a nuvec handshake: it has no key (NUVEC_DISTRIBUTED_KEY) or is not a \
                 nuvec rank, and this rank has one",
            ),
            (
                b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".repeat(4),
                "not a nuvec handshake",
            ),
        ] {
            let (mut c, mut a) = pair(Some(k), Some(k), LINK);
            assert_eq!(a.handle_recv(&bytes), Hello::LEN);
            let r = rejection(a.outcome());
            assert_eq!((r.fault, r.claimed), (Fault::NoKey, None));
            assert!(!r.said_no_key, "garbage is not a rank saying it has no key");
            assert_says(r, says);
            assert_says(r, "rank 3, if it is the neighbour");
            c.handle_sent(Hello::LEN);
            assert_eq!(c.handle_recv(&bytes), Challenge::LEN);
            let r = rejection(c.outcome());
            assert_eq!(r.fault, Fault::NoKey);
            assert_says(r, says);
            assert!(c.transmit().is_empty(), "no proof for garbage");
        }
        let mut v3 = Hello::new(4, 3, 0, 1).unwrap().encode();
        v3[8] = 3;
        let (_, mut a) = pair(Some(k), Some(k), LINK);
        a.handle_recv(&v3);
        assert!(
            rejection(a.outcome())
                .reason
                .contains("handshake version 3")
        );
    }

    #[test]
    fn truncated_messages_are_refused_when_the_peer_leaves() {
        let k = key(SECRET);
        // A hello cut short.
        let (mut c, mut a) = pair(Some(k), Some(k), LINK);
        a.handle_recv(&c.transmit()[..30]);
        assert_eq!((a.outcome(), a.wants()), (&Outcome::Pending, 30));
        a.handle_closed();
        let r = rejection(a.outcome());
        assert_eq!((r.fault, r.claimed), (Fault::Peer, None));
        assert_says(r, "before saying who it is");
        // A whole hello, then a proof cut short.
        let (mut c2, mut a) = pair(Some(k), Some(k), LINK);
        a.handle_recv(c2.transmit());
        c2.handle_sent(Hello::LEN);
        a.handle_sent(Challenge::LEN);
        a.handle_recv(&[0; 31]);
        a.handle_closed();
        let r = rejection(a.outcome());
        assert_eq!(r.claimed, Some(3));
        assert_says(r, "claiming to be rank 3");
        // A challenge cut short, and a missing verdict.
        c.handle_sent(Hello::LEN);
        let cut = Challenge {
            nonce: [2; 32],
            proof: [0; 32],
        }
        .encode();
        c.handle_recv(&cut[..40]);
        assert_eq!(c.outcome(), &Outcome::Pending);
        c.handle_closed();
        assert!(
            rejection(c.outcome())
                .reason
                .contains("during the handshake")
        );
        let (mut c, mut a) = pair(Some(k), Some(k), LINK);
        a.handle_recv(c.transmit());
        c.handle_sent(Hello::LEN);
        c.handle_recv(a.transmit());
        c.handle_sent(32);
        c.handle_closed();
        let r = rejection(c.outcome());
        assert_says(r, "instead of accepting");
    }

    #[test]
    fn a_silent_stranger_or_an_unkeyed_peer_never_gets_in() {
        let k = key(SECRET);
        // Keyed acceptor, a client that connects and says nothing (or has no key: it sends
        // no hello): the acceptor waits for the hello and the caller's deadline decides.
        let (mut c, mut a) = pair(None, Some(k), LINK);
        whole(&mut c, &mut a);
        assert_eq!((a.outcome(), a.wants()), (&Outcome::Pending, Hello::LEN));
        a.handle_closed();
        assert_eq!(rejection(a.outcome()).fault, Fault::Peer);
        // Keyed connector, an acceptor without a key: no challenge comes.
        let (mut c, mut a) = pair(Some(k), None, LINK);
        whole(&mut c, &mut a);
        assert_eq!(c.outcome(), &Outcome::Pending);
        assert_eq!(c.wants(), Challenge::LEN);
    }

    #[test]
    fn the_acceptor_greets_before_the_hello_arrives() {
        let k = key(SECRET);
        let (mut c, mut a) = pair(Some(k), Some(k), LINK);
        // Both sides have bytes to send before either has read anything.
        assert_eq!(c.transmit().len(), Hello::LEN);
        let greets = a.transmit().to_vec();
        assert_eq!(greets.len(), GREETING_LEN);
        assert_eq!(greeting(&greets), Greeting::Keyed);
        assert_eq!(greets[..8], MAGIC);
        // The greeting is out before the hello arrives; the proof follows the hello.
        a.handle_sent(GREETING_LEN);
        assert!(a.transmit().is_empty());
        let hello = c.transmit().to_vec();
        c.handle_sent(Hello::LEN);
        assert_eq!(a.handle_recv(&hello), Hello::LEN);
        assert_eq!(a.transmit().len(), Challenge::LEN - GREETING_LEN);
        let mut challenge = greets;
        challenge.extend_from_slice(a.transmit());
        a.handle_sent(Challenge::LEN - GREETING_LEN);
        assert_eq!(c.handle_recv(&challenge), Challenge::LEN);
        let proof = c.transmit().to_vec();
        c.handle_sent(32);
        a.handle_recv(&proof);
        c.handle_recv(a.transmit());
        a.handle_sent(1);
        assert_eq!(c.outcome(), &Outcome::Established);
        assert_eq!(a.outcome(), &Outcome::Established);
        // Without a key, nothing is sent at all (MLX's wire).
        let (c, a) = pair(None, None, LINK);
        assert!(c.transmit().is_empty() && a.transmit().is_empty());
    }

    #[test]
    fn first_bytes_tell_a_keyed_peer_from_data() {
        assert_eq!(greeting(b"nuvecRNG"), Greeting::Keyed);
        assert_eq!(
            greeting(&Hello::new(2, 0, 1, 0).unwrap().encode()),
            Greeting::Keyed
        );
        assert_eq!(greeting(&NO_KEY), Greeting::Keyed);
        for prefix in 1..8 {
            assert_eq!(greeting(&MAGIC[..prefix]), Greeting::Undecided, "{prefix}");
        }
        assert_eq!(greeting(b"nuvecRNh"), Greeting::Data);
        assert_eq!(greeting(b"m"), Greeting::Data);
        assert_eq!(greeting(&[0u8; 4]), Greeting::Data);
        assert_eq!(greeting(&1.5f32.to_le_bytes()), Greeting::Data);
    }

    #[test]
    fn a_peer_saying_it_has_no_key_is_rejected_at_once_on_either_side() {
        let k = key(SECRET);
        // As the acceptor's answer to a keyed connector's hello.
        let (mut c, mut a) = pair(Some(k), Some(k), LINK);
        c.handle_sent(Hello::LEN);
        assert_eq!(c.handle_recv(&NO_KEY), NO_KEY.len());
        let r = rejection(c.outcome());
        assert_eq!(r.fault, Fault::NoKey);
        assert_says(
            r,
            "it has no key (NUVEC_DISTRIBUTED_KEY), and this rank has one",
        );
        assert!(r.said_no_key);
        // As a connector's answer to a keyed acceptor's greeting.
        assert_eq!(a.handle_recv(&NO_KEY), NO_KEY.len());
        let r = rejection(a.outcome());
        assert_eq!((r.fault, r.said_no_key), (Fault::NoKey, true));
        assert_says(r, "rank 3");
        assert_says(r, "has no key");
    }

    #[test]
    fn a_native_hello_is_named_as_the_native_wire_on_either_side() {
        let k = key(SECRET);
        let mut native = MAGIC.to_vec();
        native.extend_from_slice(&[NATIVE_VERSION, 0, 0, 0]);
        let (mut c, mut a) = pair(Some(k), Some(k), LINK);
        // Decided on the version byte, without waiting for a whole message.
        assert_eq!(a.handle_recv(&native[..9]), 9);
        let r = rejection(a.outcome());
        assert_eq!((r.fault, r.said_no_key), (Fault::Incompatible, false));
        assert!(
            r.reason
                .contains("rank 3, if it is the neighbour expected there")
                && r.reason.contains("runs the native wire"),
            "{}",
            r.reason
        );
        c.handle_sent(Hello::LEN);
        assert_eq!(c.handle_recv(&native), native.len());
        let r = rejection(c.outcome());
        assert_eq!(r.fault, Fault::Incompatible);
        assert_says(r, "a native-wire hello");
    }

    #[test]
    fn data_shorter_than_a_message_is_rejected_on_its_first_wrong_byte() {
        let k = key(SECRET);
        // A rank without a key may send 4 bytes (one f32) and then wait for ours.
        let data = 2.0f32.to_le_bytes();
        let (mut c, mut a) = pair(Some(k), Some(k), LINK);
        assert_eq!(a.handle_recv(&data), 4);
        assert_eq!(rejection(a.outcome()).fault, Fault::NoKey);
        c.handle_sent(Hello::LEN);
        assert_eq!(c.handle_recv(&data), 4);
        assert_eq!(rejection(c.outcome()).fault, Fault::NoKey);
        // The magic's first bytes alone decide nothing yet.
        let (mut c, mut a) = pair(Some(k), Some(k), LINK);
        a.handle_recv(&MAGIC[..5]);
        c.handle_sent(Hello::LEN);
        c.handle_recv(&MAGIC[..5]);
        assert_eq!(
            (a.outcome(), c.outcome()),
            (&Outcome::Pending, &Outcome::Pending)
        );
    }

    proptest::proptest! {
        #[test]
        fn any_chunking_gives_the_same_conversation(
            sizes in proptest::collection::vec(1usize..100, 1..64),
            same_key: bool,
        ) {
            let k = key(SECRET);
            let other = if same_key { k } else { key("another secret of enough length") };
            let (mut c0, mut a0) = pair(Some(k), Some(other), LINK);
            let reference = whole(&mut c0, &mut a0);
            let (mut c, mut a) = pair(Some(k), Some(other), LINK);
            let mut i = 0;
            let wire = converse(&mut c, &mut a, &mut || {
                i += 1;
                sizes[i % sizes.len()]
            });
            proptest::prop_assert_eq!(&wire.from_connector, &reference.from_connector);
            proptest::prop_assert_eq!(&wire.from_acceptor, &reference.from_acceptor);
            proptest::prop_assert_eq!(c.outcome(), c0.outcome());
            proptest::prop_assert_eq!(a.outcome(), a0.outcome());
            proptest::prop_assert_eq!(c.outcome() == &Outcome::Established, same_key);
        }
    }
}
