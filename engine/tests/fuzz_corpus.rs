//! Replays the fuzz targets' inputs (the committed seeds and the corpus the fuzzer kept)
//! through the same entry points, so every `cargo test` re-checks them.

use std::path::Path;

/// Runs `run` on every input kept for `target`, ignoring what it returns (how far the input
/// got): only a panic fails.
fn replay<R>(target: &str, run: impl Fn(&[u8]) -> R) {
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
            let input = std::fs::read(&path).unwrap();
            // One test replays every target: a panic names the target and the input.
            let replayed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&input)));
            assert!(
                replayed.is_ok(),
                "{target}: {} panicked (above)",
                path.display()
            );
            count += 1;
        }
    }
    assert!(
        count > 0,
        "no inputs for fuzz target {target} under {}",
        root.display()
    );
}

/// Every target's inputs, each through its entry point: none panics.
#[test]
fn inputs_never_panic() {
    use nuvec_distributed_engine::fuzzing;
    replay("hostfile", fuzzing::hostfile);
    replay("handshake", fuzzing::handshake);
    #[cfg(feature = "jaccl")]
    replay("jaccl_side_channel", fuzzing::jaccl_side_channel);
    replay("native_hello", fuzzing::native_hello);
    replay("native_header", fuzzing::native_header);
    replay("native_record", fuzzing::native_record);
}

/// Each record seed opens the records it should and no more: an honest stream all of its
/// records, a wrong one only those before what is wrong.
#[test]
fn the_record_seeds_open_what_they_should() {
    use nuvec_distributed_engine::fuzzing;
    let seeds = fuzzing::seeds("native_record");
    assert!(seeds.len() > 8, "{} seeds", seeds.len());
    for (name, bytes) in seeds {
        let expected = match name {
            "honest" => 4,
            n if n.ends_with("-after-two") => 2,
            n if n.ends_with("-after-one") => 1,
            _ => 0,
        };
        assert_eq!(fuzzing::native_record(&bytes), expected, "{name}");
    }
}

/// Each native seed reaches what it is for: the valid hellos are taken by the one side
/// they are for, every other hello by none; the matching headers complete their
/// collective, the others are refused or wait for more.
#[test]
fn the_native_seeds_reach_what_they_are_for() {
    use nuvec_distributed_engine::fuzzing::{self, Ended};
    for (name, bytes) in fuzzing::seeds("native_hello") {
        let valid = [
            "accepted-on-address-1",
            "ring-1-from-rank-3",
            "ring-0-from-rank-1",
        ];
        let expected = usize::from(
            valid.contains(&name) || name == "mesh-from-rank-0" || name == "ring-then-data",
        );
        assert_eq!(fuzzing::native_hello(&bytes), expected, "{name}");
    }
    for (name, bytes) in fuzzing::seeds("native_header") {
        let expected = match name {
            "short-header" | "empty" => Ended::Waiting,
            n if n.contains("against")
                || n.starts_with("bad-")
                || n.contains("longer")
                || n == "broadcast-from-rank-0"
                || n == "next-sequence-number" =>
            {
                Ended::Refused
            }
            _ => Ended::Finished,
        };
        assert_eq!(fuzzing::native_header(&bytes), expected, "{name}");
    }
}

/// The native targets' seeds are this build's encodings (every hello and header kind, and
/// the edge cases around them): a change to the wire's bytes shows here. With
/// `NUVEC_WRITE_SEEDS=1` the test writes them instead, for a change that means to.
#[test]
fn the_native_seeds_are_what_this_build_encodes() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds");
    let write = std::env::var_os("NUVEC_WRITE_SEEDS").is_some();
    for target in ["native_hello", "native_header", "native_record"] {
        let seeds = nuvec_distributed_engine::fuzzing::seeds(target);
        assert!(seeds.len() > 10, "{target}: {} seeds", seeds.len());
        for (name, bytes) in seeds {
            let path = root.join(target).join(name);
            if write {
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(&path, &bytes).unwrap();
                continue;
            }
            let stored = std::fs::read(&path).unwrap_or_else(|e| {
                panic!(
                    "{}: {e} (NUVEC_WRITE_SEEDS=1 writes the seeds)",
                    path.display()
                )
            });
            assert!(
                stored == bytes,
                "{} holds {stored:02x?}, and this build encodes {bytes:02x?}: the wire changed \
                 (NUVEC_WRITE_SEEDS=1 rewrites the seeds if it means to)",
                path.display()
            );
        }
    }
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

/// The stored side-channel inputs reach every stage of the play: a refused hello or count
/// is among them, and so is a whole set-up followed by a failure notice.
#[cfg(feature = "jaccl")]
#[test]
fn side_channel_seeds_reach_every_stage() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/jaccl_side_channel");
    let mut reached = [0usize; 5];
    for entry in std::fs::read_dir(&dir).unwrap() {
        let data = std::fs::read(entry.unwrap().path()).unwrap();
        reached[nuvec_distributed_engine::fuzzing::jaccl_side_channel_reach(&data)] += 1;
    }
    // Stage 2 stops at a refused count; 4 has read both record lists and a notice.
    assert!(reached[2] > 0 && reached[4] >= 3, "{reached:?}");
}

/// Random set-ups on every `cargo test`, beyond the stored inputs: counts mostly in range
/// and records of the length they announce (now and then cut short), then a notice; a
/// fixed seed, as above.
#[cfg(feature = "jaccl")]
#[test]
fn random_side_channel_set_ups_never_panic() {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    let mut rng = StdRng::seed_from_u64(0x6a61_6363_6c53_4348);
    let mut whole = 0;
    for _ in 0..3000 {
        let group: u8 = rng.random();
        let ranks = 2 + usize::from(group % 7);
        let mut data = vec![group];
        data.extend(rng.random_range(-1i32..9).to_le_bytes());
        for _ in 0..2 {
            let counts: Vec<i32> = (0..ranks).map(|_| rng.random_range(-1..10)).collect();
            data.extend(counts.iter().flat_map(|c| c.to_le_bytes()));
            let max = counts.iter().copied().max().unwrap_or(0).max(0) as usize;
            let mut len = ranks * max * 32;
            if rng.random_ratio(1, 10) {
                len = rng.random_range(0..=len);
            }
            // Records that mostly look like the real thing: marked, zero or random padding.
            data.extend((0..len).map(|i| match (i % 32, rng.random_range(0..3)) {
                (12..16, 0) => b"nvc1"[i % 4],
                (12..16, 1) => 0,
                _ => rng.random(),
            }));
        }
        let notice = rng.random_range(0..6);
        data.extend((0..notice).map(|_| rng.random_range(0..10u8)));
        if nuvec_distributed_engine::fuzzing::jaccl_side_channel_reach(&data) == 4 {
            whole += 1;
        }
    }
    assert!(whole > 100, "only {whole} random set-ups got through");
}

/// The same for the native hello, header and records: random bytes, and random edits of each seed
/// (a byte changed, the input cut short), from a fixed seed.
#[test]
fn random_native_inputs_never_panic() {
    use nuvec_distributed_engine::fuzzing;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    let mut rng = StdRng::seed_from_u64(0x6e61_7469_7665_2121);
    for (target, run) in [
        (
            "native_hello",
            (|d| _ = fuzzing::native_hello(d)) as fn(&[u8]),
        ),
        ("native_header", |d| _ = fuzzing::native_header(d)),
        ("native_record", |d| _ = fuzzing::native_record(d)),
    ] {
        let seeds = fuzzing::seeds(target);
        for _ in 0..1000 {
            let len = rng.random_range(0..200);
            let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            run(&data);
            let (_, seed) = &seeds[rng.random_range(0..seeds.len())];
            let mut edited = seed.clone();
            if !edited.is_empty() {
                let at = rng.random_range(0..edited.len());
                edited[at] = rng.random();
                run(&edited);
                edited.truncate(rng.random_range(0..edited.len()));
            }
            run(&edited);
        }
    }
}
