//! The crate's first example, the one its documentation opens with: examples/seed.rs is
//! that code, line for line, and it runs as written on every rank of `nuvec launch`.

use std::path::Path;

use nuvec_tools::testing::{example_binary, launch_under_nuvec};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The code of the first fenced block of the crate root's `//!` documentation, as rustdoc
/// compiles it: hidden lines (`# ...`) shown, the `##` escape undone.
fn first_doc_example(lib_rs: &str) -> Vec<String> {
    let docs: Vec<&str> = lib_rs
        .lines()
        .take_while(|l| l.starts_with("//!"))
        .map(|l| {
            let l = &l[3..];
            l.strip_prefix(' ').unwrap_or(l)
        })
        .collect();
    let open = docs
        .iter()
        .position(|l| l.starts_with("```"))
        .expect("src/lib.rs's documentation has a fenced example");
    let info = docs[open].trim_start_matches('`');
    assert!(
        info.split(',')
            .all(|w| ["", "rust", "no_run"].contains(&w.trim())),
        "the first example's fence is ```{info}: not one rustdoc compiles as Rust"
    );
    let len = docs[open + 1..]
        .iter()
        .position(|l| l.trim_end() == "```")
        .expect("the first example's fence closes");
    docs[open + 1..open + 1 + len]
        .iter()
        .map(|l| {
            let t = l.trim_start();
            let shown = if t == "#" {
                ""
            } else if let Some(rest) = t.strip_prefix("# ") {
                rest
            } else if let Some(rest) = t.strip_prefix("##") {
                return format!("#{rest}");
            } else {
                l
            };
            shown.to_string()
        })
        .collect()
}

/// The code of examples/seed.rs: without its `//!` header and the `#[rustfmt::skip]` that
/// keeps `main` as the documentation writes it.
fn example_code(seed_rs: &str) -> Vec<String> {
    seed_rs
        .lines()
        .skip_while(|l| l.starts_with("//!") || l.trim().is_empty())
        .filter(|l| l.trim() != "#[rustfmt::skip]")
        .map(String::from)
        .collect()
}

#[test]
fn the_example_is_the_first_doc_example_line_for_line() {
    let read = |p: &str| std::fs::read_to_string(Path::new(ROOT).join(p)).unwrap();
    let doc = first_doc_example(&read("src/lib.rs"));
    let example = example_code(&read("examples/seed.rs"));
    // Indentation aside (the documentation's `main` is hidden, so its body is not indented):
    // the same lines, comments included.
    let norm = |lines: &[String]| -> Vec<String> {
        lines
            .iter()
            .map(|l| l.trim().to_string())
            .collect::<Vec<_>>()
    };
    let (d, e) = (norm(&doc), norm(&example));
    if let Some(i) = (0..d.len().max(e.len())).find(|&i| d.get(i) != e.get(i)) {
        panic!(
            "examples/seed.rs has drifted from src/lib.rs's first example at line {} of the \
             code:\n  documentation: {:?}\n  example:       {:?}\n\ndocumentation:\n{}\n\nexample:\n{}",
            i + 1,
            d.get(i),
            e.get(i),
            doc.join("\n"),
            example.join("\n")
        );
    }
    assert!(
        d.iter().any(|l| l.contains("println!")),
        "the extracted example prints nothing: {d:#?}"
    );
}

#[test]
fn the_extraction_shows_hidden_lines_and_stops_at_the_fence() {
    let lib = "//! Text.\n//!\n//! ```\n//! use a;\n//! # fn main() {\n//! ##[attr]\n//!     f();\n//! #\n//! # }\n//! ```\n//! ```\n//! other();\n//! ```\nmod x;\n";
    assert_eq!(
        first_doc_example(lib),
        ["use a;", "fn main() {", "#[attr]", "    f();", "", "}"]
    );
}

/// Under `nuvec launch -n 2` and `-n 4`, on MLX's wire (the default) and the native wire,
/// every rank prints `rank r of n: [n, 2n]` (the sum of `[1.0, 2.0]` over n ranks, as
/// `{:?}` prints a `Vec<f32>`), and nothing else.
#[test]
fn the_example_runs_as_written_on_every_rank_of_a_launch() {
    let example = example_binary("nuvec-distributed", "seed");
    for n in [2usize, 4] {
        for wire in [None, Some("native")] {
            let out = launch_under_nuvec(n, wire, &example, &[]);
            let what = format!("nuvec launch -n {n} (wire {})", wire.unwrap_or("mlx"));
            out.assert_success(&what);
            let mut got: Vec<&str> = out.stdout.lines().collect();
            got.sort_unstable();
            let expected: Vec<String> = (0..n)
                .map(|r| format!("[{r}] rank {r} of {n}: [{}.0, {}.0]", n, 2 * n))
                .collect();
            assert_eq!(got, expected, "{what}: stderr:\n{}", out.stderr);
        }
    }
}
