//! Any bytes as an MLX hostfile: parsing and checking never panic.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| nuvec_distributed_engine::fuzzing::hostfile(data));
