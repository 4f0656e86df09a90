//! The README's two quick starts: the nuvec way (`examples/quickstart.rs`) and the slice
//! API (`engine/examples/quickstart_slices.rs`). For each, the README shows the example as
//! it is, the example sums across two ranks, and an error returned from its `main` prints
//! the message.

use std::process::Command;

use nuvec_tools::testing::{example_binary, run_example};

/// One quick start of the README and what its example prints.
struct QuickStart {
    /// The example's package and name.
    package: &'static str,
    example: &'static str,
    /// Its source, from the repository's root.
    source: &'static str,
    /// A line its code must contain (so that the README's block is this example's).
    marker: &'static str,
    /// The line rank R of 2 prints, after `rank R of 2: `.
    sum: &'static str,
    /// Checks what `main` wrote to stderr when `MLX_RANK` is not a rank.
    bad_rank: fn(&str),
}

const QUICK_STARTS: [QuickStart; 2] = [
    QuickStart {
        package: "nuvec-distributed",
        example: "quickstart",
        source: "examples/quickstart.rs",
        marker: "nuvec_distributed::init(false)?",
        sum: "[2.0, 4.0]",
        // `main` returns nuvec-core's `Error`, whose `Debug` nuvec-core derives: Rust
        // prints `Error: InvalidArgument("...")`, with this crate's message whole inside it
        // (not split into fields), naming the variable and what is wrong with it.
        bad_rank: |stderr| {
            assert!(
                stderr.starts_with(
                    "Error: InvalidArgument(\"distributed init: environment variable MLX_RANK: "
                ) && stderr.contains("is not a rank"),
                "{stderr}"
            );
        },
    },
    QuickStart {
        package: "nuvec-distributed-engine",
        example: "quickstart_slices",
        source: "engine/examples/quickstart_slices.rs",
        marker: "group.all_sum(&mut x)?",
        sum: "[3.0, 3.0, 3.0, 3.0]",
        // Rust prints an error returned from `main` with `{:?}`, which for the engine's
        // `Error` is the message.
        bad_rank: |stderr| {
            assert_eq!(
                stderr,
                "Error: environment variable MLX_RANK: \"two\" is not a rank (a whole number from 0)\n"
            );
        },
    },
];

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
fn the_readme_shows_each_example_as_it_is() {
    let root = env!("CARGO_MANIFEST_DIR");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap();
    for q in &QUICK_STARTS {
        let source = std::fs::read_to_string(format!("{root}/{}", q.source)).unwrap();
        let code = body(&source);
        assert!(code.contains(q.marker), "{}:\n{code}", q.source);
        assert!(
            readme.contains(&format!("```rust,no_run\n{code}```")),
            "README.md's quick start differs from {}:\n{code}",
            q.source
        );
    }
}

#[test]
fn each_example_sums_across_two_ranks() {
    for q in &QUICK_STARTS {
        let example = (q.package, q.example);
        for o in &run_example(example, &[], 2, "each_example_sums_across_two_ranks") {
            let expected = format!("rank {} of 2: {}", o.rank, q.sum);
            let found = o.stdout.lines().any(|l| l == expected);
            assert!(found, "{}: {o}", q.example);
        }
    }
}

#[test]
fn an_error_from_main_prints_the_message() {
    let dir = tempfile::tempdir().unwrap();
    let hostfile = dir.path().join("ring.json");
    std::fs::write(&hostfile, r#"[["127.0.0.1:5000"], ["127.0.0.1:5001"]]"#).unwrap();
    for q in &QUICK_STARTS {
        let out = Command::new(example_binary(q.package, q.example))
            .env("MLX_HOSTFILE", &hostfile)
            .env("MLX_RANK", "two")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{}: {stderr}", q.example);
        (q.bad_rank)(&stderr);
    }
}
