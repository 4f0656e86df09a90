//! Any bytes as a peer's side of a handshake, in any chunks, against both sides, keyed and
//! unkeyed: never a panic, and garbage never gets in.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| nuvec_distributed_engine::fuzzing::handshake(data));
