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
//! Only the handshake is protected. The collectives' traffic that follows is neither
//! encrypted nor authenticated: someone who can see or alter packets on the network can see
//! or alter the data. On an untrusted network, run the ring over a VPN or an encrypted
//! link.

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
                "the authentication key is {} bytes; it must be at least {MIN_SECRET_BYTES}",
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
    /// A protocol version this build does not speak.
    Version(u8),
}

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Malformed::Short => f.write_str("a truncated handshake message"),
            Malformed::Magic => {
                f.write_str("not a nuvec handshake (is the key set on every rank?)")
            }
            Malformed::Version(v) => {
                write!(f, "handshake version {v}, this build speaks {VERSION}")
            }
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
    if bytes[..8] != MAGIC {
        return Err(Malformed::Magic);
    }
    if bytes[8] != VERSION {
        return Err(Malformed::Version(bytes[8]));
    }
    Ok(bytes)
}

/// A fresh random nonce from the operating system.
fn nonce() -> Result<[u8; 32]> {
    let mut n = [0u8; 32];
    getrandom::fill(&mut n).map_err(|e| {
        Error::local(
            "drawing a random nonce",
            std::io::Error::other(e.to_string()),
        )
    })?;
    Ok(n)
}

/// A fresh nonce for an acceptor's [`Challenge`].
pub(crate) fn acceptor_nonce() -> Result<[u8; 32]> {
    nonce()
}

/// Which side a proof is made by: each side's proof is different, so one side's proof can
/// never be reflected back as the other's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// The rank that opened the connection.
    Connector,
    /// The rank that accepted it.
    Acceptor,
}

/// The proof `role` sends for the handshake of `hello` and the acceptor's `acceptor_nonce`.
pub(crate) fn proof(key: &Key, role: Role, hello: &Hello, acceptor_nonce: &[u8; 32]) -> [u8; 32] {
    let mut h = blake3::Hasher::new_keyed(&key.0);
    h.update(match role {
        Role::Connector => b"connector proof",
        Role::Acceptor => b"acceptor proof\0",
    });
    h.update(&hello.encode());
    h.update(acceptor_nonce);
    *h.finalize().as_bytes()
}

/// Whether `received` is `role`'s proof for this handshake, compared in constant time.
pub(crate) fn verify(
    key: &Key,
    role: Role,
    hello: &Hello,
    acceptor_nonce: &[u8; 32],
    received: &[u8; 32],
) -> bool {
    blake3::Hash::from(proof(key, role, hello, acceptor_nonce)) == blake3::Hash::from(*received)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let mut v2 = hello.encode();
        v2[8] = 2;
        assert_eq!(Hello::decode(&v2), Err(Malformed::Version(2)));
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
        let p = proof(&k, Role::Acceptor, &hello, &n);
        assert!(verify(&k, Role::Acceptor, &hello, &n, &p));
        // Another key, the other role, another nonce, another connection: all fail.
        assert!(!verify(
            &key("another secret of enough length"),
            Role::Acceptor,
            &hello,
            &n,
            &p
        ));
        assert!(!verify(&k, Role::Connector, &hello, &n, &p));
        assert!(!verify(&k, Role::Acceptor, &hello, &[6u8; 32], &p));
        let other = Hello { index: 0, ..hello };
        assert!(!verify(&k, Role::Acceptor, &other, &n, &p));
        let replayed = Hello {
            nonce: [1; 32],
            ..hello
        };
        assert!(!verify(&k, Role::Acceptor, &replayed, &n, &p));
    }
}
