//! Any bytes as the sealed records a keyed native-wire connection receives: never a panic;
//! records open in order only while they authenticate, the first that does not fails
//! naming the peer and leaves its bytes unopened, and a stream cut inside a record is an
//! error; any bytes sealed as records open back to themselves, and not when reflected.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    nuvec_distributed_engine::fuzzing::native_record(data);
});
