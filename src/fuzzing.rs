//! Entry points for the fuzz targets in `fuzz/` and for replaying their corpus in
//! `cargo test`: every parser of bytes that come from outside the process. Not part of the
//! API; hidden from the docs.

use crate::auth::{self, Challenge, Hello, Role, Secret};
use crate::hostfile;

/// Parses `data` as a hostfile and checks it for every rank it could describe. Must never
/// panic, whatever the bytes.
pub fn hostfile(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(nodes) = hostfile::parse(text) {
        for rank in 0..nodes.len().min(8) + 1 {
            let _ = hostfile::check(&nodes, rank);
        }
    }
}

/// Decodes `data` as each handshake message a peer can send, and verifies whatever decodes
/// as a proof against a fixed key. Must never panic, whatever the bytes.
pub fn handshake(data: &[u8]) {
    let Ok(key) = Secret::new(b"a fixed fuzzing key of 32 bytes!").key() else {
        return;
    };
    if let Ok(hello) = Hello::decode(data) {
        let mut proof = [0u8; 32];
        let tail = data.get(Hello::LEN..).unwrap_or_default();
        let n = tail.len().min(32);
        proof[..n].copy_from_slice(&tail[..n]);
        let _ = auth::verify(&key, Role::Connector, &hello, &[0; 32], &proof);
        let _ = Hello::decode(&hello.encode()).map(|again| assert_eq!(again, hello));
    }
    if let Ok(challenge) = Challenge::decode(data) {
        let hello = Hello {
            size: 2,
            from: 0,
            to: 1,
            index: 0,
            nonce: [0; 32],
        };
        let _ = auth::verify(
            &key,
            Role::Acceptor,
            &hello,
            &challenge.nonce,
            &challenge.proof,
        );
        let _ = Challenge::decode(&challenge.encode()).map(|again| assert_eq!(again, challenge));
    }
}
