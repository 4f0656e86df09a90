//! Any bytes as what a JACCL rank reads on its side channel during set-up (a joining rank's
//! hello, gathered counts and queue-pair records) and after it (a failure notice): never a
//! panic, every decoded record encodes back to the bytes MLX reads, and every refusal names
//! the rank at fault.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    nuvec_distributed_engine::fuzzing::jaccl_side_channel(data)
});
