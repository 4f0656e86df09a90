//! Any bytes as a handshake message from a peer: decoding and verifying never panic.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| nuvec_distributed::fuzzing::handshake(data));
