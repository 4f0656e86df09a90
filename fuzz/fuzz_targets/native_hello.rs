//! Any bytes as the hello a native wire peer sends, at once and a byte at a time, against
//! a ring connector and two acceptors, keyed and unkeyed: never a panic, a hello that
//! decodes re-encodes to its bytes, and a side is established exactly when the bytes are a
//! hello it accepts (never with a key).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    nuvec_distributed_engine::fuzzing::native_hello(data);
});
