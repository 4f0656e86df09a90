//! Replays the fuzz targets' inputs (the committed seeds and the corpus the fuzzer kept)
//! through the same entry points, so every `cargo test` re-checks them.

use std::path::Path;

fn replay(target: &str, run: fn(&[u8])) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut count = 0;
    for dir in [
        root.join("seeds").join(target),
        root.join("corpus").join(target),
    ] {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            run(&std::fs::read(&path).unwrap());
            count += 1;
        }
    }
    assert!(
        count > 0,
        "no inputs for fuzz target {target} under {}",
        root.display()
    );
}

#[test]
fn hostfile_inputs_never_panic() {
    replay("hostfile", nuvec_distributed_engine::fuzzing::hostfile);
}

#[test]
fn handshake_inputs_never_panic() {
    replay("handshake", nuvec_distributed_engine::fuzzing::handshake);
}

/// A few thousand random conversations on every `cargo test`, beyond the stored inputs:
/// cheap, and the same every run (a fixed seed), so a failure can be replayed.
#[test]
fn random_handshake_conversations_never_panic() {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    let mut rng = StdRng::seed_from_u64(0x6e75_7665_6352_4e47);
    for _ in 0..3000 {
        let len = rng.random_range(0..400);
        let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        nuvec_distributed_engine::fuzzing::handshake(&data);
    }
}
