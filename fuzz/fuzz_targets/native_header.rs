//! Any bytes as the native wire's collective header, alone against every kind of call and
//! as what a peer sends in each collective of the data path: never a panic, a header that
//! decodes re-encodes to its bytes, and a collective fails exactly when the peer's header
//! is not its own, before any of the peer's data reaches the caller's array.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    nuvec_distributed_engine::fuzzing::native_header(data);
});
