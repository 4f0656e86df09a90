//! The README's quick start, the nuvec way (`examples/quickstart.rs`): the README shows the
//! example as it is, the example sums nuvec arrays across two ranks, and an error returned
//! from its `main` prints the message.

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
    let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap();
    let source = std::fs::read_to_string(format!("{root}/examples/quickstart.rs")).unwrap();
    let code = body(&source);
    assert!(code.contains("nuvec_distributed::init(false)?"), "{code}");
    assert!(
        readme.contains(&format!("```rust,no_run\n{code}```")),
        "README.md's quick start differs from examples/quickstart.rs:\n{code}"
    );
}

#[test]
fn the_example_sums_nuvec_arrays_across_two_ranks() {
    let program = example_binary("nuvec-distributed", "quickstart");
    let outputs = Launch::new(2, 1)
        .deadline(Duration::from_secs(120))
        .command(move |_| Command::new(&program))
        .spawn("the_example_sums_nuvec_arrays_across_two_ranks")
        .finish();
    for o in &outputs {
        assert_eq!(o.status.map(|s| s.success()), Some(true), "{o}");
        let expected = format!("rank {} of 2: [2.0, 4.0]", o.rank);
        assert!(o.stdout.lines().any(|l| l == expected), "{o}");
    }
}

/// `main` returns nuvec-core's `Error`, whose `Debug` nuvec-core derives: Rust prints
/// `Error: InvalidArgument("...")`, with this crate's message whole inside it (not split
/// into fields), naming the variable and what is wrong with it.
#[test]
fn an_error_from_main_prints_the_message() {
    let dir = tempfile::tempdir().unwrap();
    let hostfile = dir.path().join("ring.json");
    std::fs::write(&hostfile, r#"[["127.0.0.1:5000"], ["127.0.0.1:5001"]]"#).unwrap();
    let out = Command::new(example_binary("nuvec-distributed", "quickstart"))
        .env("MLX_HOSTFILE", &hostfile)
        .env("MLX_RANK", "two")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with(
            "Error: InvalidArgument(\"distributed init: environment variable MLX_RANK: "
        ) && stderr.contains("is not a rank"),
        "{stderr}"
    );
}
