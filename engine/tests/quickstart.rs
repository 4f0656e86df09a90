//! The README's quick start with the slice API (`examples/quickstart_slices.rs`): the
//! README shows the example as it is, the example sums across two ranks, and an error
//! returned from its `main` prints the message, not the error's fields.

use std::process::Command;
use std::time::Duration;

use nuvec_tools::testing::{Launch, example_binary};

/// The example's code after its header comment: what the README must show.
fn body(source: &str) -> String {
    source
        .lines()
        .skip_while(|l| l.starts_with("//!"))
        .skip_while(|l| l.is_empty())
        .map(|l| format!("{l}\n"))
        .collect()
}

#[test]
fn the_readme_shows_the_example_as_it_is() {
    let root = env!("CARGO_MANIFEST_DIR");
    let readme = std::fs::read_to_string(format!("{root}/../README.md")).unwrap();
    let source = std::fs::read_to_string(format!("{root}/examples/quickstart_slices.rs")).unwrap();
    let code = body(&source);
    assert!(code.contains("group.all_sum(&mut x)?"), "{code}");
    assert!(
        readme.contains(&format!("```rust,no_run\n{code}```")),
        "README.md's slice quick start differs from engine/examples/quickstart_slices.rs:\n{code}"
    );
}

#[test]
fn the_example_sums_across_two_ranks() {
    let program = example_binary("nuvec-distributed-engine", "quickstart_slices");
    let outputs = Launch::new(2, 1)
        .deadline(Duration::from_secs(120))
        .command(move |_| Command::new(&program))
        .spawn("the_example_sums_across_two_ranks")
        .finish();
    for o in &outputs {
        assert_eq!(o.status.map(|s| s.success()), Some(true), "{o}");
        let expected = format!("rank {} of 2: [3.0, 3.0, 3.0, 3.0]", o.rank);
        assert!(o.stdout.lines().any(|l| l == expected), "{o}");
    }
}

/// Rust prints an error returned from `main` with `{:?}`, which for this crate's `Error`
/// is the message.
#[test]
fn an_error_from_main_prints_the_message() {
    let dir = tempfile::tempdir().unwrap();
    let hostfile = dir.path().join("ring.json");
    std::fs::write(&hostfile, r#"[["127.0.0.1:5000"], ["127.0.0.1:5001"]]"#).unwrap();
    let out = Command::new(example_binary(
        "nuvec-distributed-engine",
        "quickstart_slices",
    ))
    .env("MLX_HOSTFILE", &hostfile)
    .env("MLX_RANK", "two")
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr,
        "Error: environment variable MLX_RANK: \"two\" is not a rank (a whole number from 0)\n"
    );
}
