//! Replays the fuzz targets' inputs (the committed seeds and the corpus the fuzzer kept)
//! through the same entry points, so every `cargo test` re-checks them.

use std::path::Path;

fn replay(target: &str, run: fn(&[u8])) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
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
    replay("hostfile", nuvec_distributed::fuzzing::hostfile);
}

#[test]
fn handshake_inputs_never_panic() {
    replay("handshake", nuvec_distributed::fuzzing::handshake);
}
