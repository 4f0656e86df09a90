//! The drop-in check: tests/dropin is a nuvec user's project (nuvec and nuvec-nn from
//! crates.io, this crate patched in with one `[patch.crates-io]` line). This builds it as
//! its user would while developing, in the dev profile (what it checks, that the patch
//! applies and that every collective's result is exact, does not depend on the optimiser,
//! and a release build took twice as long, about 110 s against 55 on 2 cores), in its own
//! target directory (target/dropin), after checking
//! that the patch applies (the registry's nuvec-distributed is nowhere in its tree), and
//! runs it under `nuvec launch` at 2 and 4 ranks on MLX's wire (the default) and on the
//! native wire. The program checks every collective against its exact result and exits
//! non-zero on any difference (see tests/dropin/src/main.rs); here every rank must also
//! have run to its last line.

use std::path::{Path, PathBuf};
use std::process::Command;

use nuvec_tools::testing::launch_under_nuvec;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn cargo(project: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(project).args(args);
    c
}

/// That every nuvec-distributed in the project's dependency tree is this crate, from this
/// directory: were the patch not to apply (a version nuvec does not accept, say), cargo
/// would quietly take the registry's crate of that name instead.
fn check_the_patch_applies(project: &Path) {
    let out = cargo(
        project,
        &[
            "tree", "--locked", "--edges", "normal", "--prefix", "none", "--format", "{p}",
        ],
    )
    .output()
    .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "cargo tree in {}: {stderr}",
        project.display()
    );
    let ours = format!("nuvec-distributed v{} ({ROOT})", env!("CARGO_PKG_VERSION"));
    let found: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("nuvec-distributed "))
        .collect();
    assert!(
        !found.is_empty() && found.iter().all(|l| l.trim_end_matches(" (*)") == ours),
        "tests/dropin's nuvec-distributed is not only this crate ({ours}): {found:?}\n\
         cargo tree:\n{stdout}\n{stderr}"
    );
    println!("cargo tree: {}", found[0]);
}

/// Builds the project in the dev profile into `target`; returns its binary.
fn build(project: &Path, target: &Path) -> PathBuf {
    let status = cargo(project, &["build", "--locked", "--target-dir"])
        .arg(target)
        .status()
        .unwrap();
    assert!(
        status.success(),
        "cargo build of tests/dropin failed ({status}). If cargo said the lock file needs \
         to be updated (this workspace's dependencies changed), run `cargo build \
         --manifest-path tests/dropin/Cargo.toml` once without --locked and commit \
         tests/dropin/Cargo.lock"
    );
    target
        .join("debug")
        .join(format!("nuvec-dropin{}", std::env::consts::EXE_SUFFIX))
}

#[test]
#[ignore = "builds a nuvec user's project (nuvec and nuvec-nn from crates.io) in target/dropin, \
            a minute or more; tools/test.sh runs it with --ignored"]
fn a_nuvec_user_gets_this_crate_from_one_patch_line() {
    let project = Path::new(ROOT).join("tests").join("dropin");
    // target/tmp's parent: the target directory of this build, wherever it is.
    let target = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .join("dropin");
    check_the_patch_applies(&project);
    let program = build(&project, &target);

    for wire in [None, Some("native")] {
        for n in [2usize, 4] {
            // Unset, the ranks' default wire applies: MLX's.
            let out = launch_under_nuvec(n, wire, &program, &[n.to_string()]);
            let what = format!("nuvec launch -n {n} (wire {})", wire.unwrap_or("mlx"));
            println!(
                "\n== {what}: {:.2} s\n{}{}",
                out.took.as_secs_f64(),
                out.stdout,
                out.stderr
            );
            assert!(out.status.success(), "{what}: {}", out.status);
            let wire_name = if wire.is_some() { "native" } else { "MLX" };
            for r in 0..n {
                let prefix = format!("[{r}] ");
                let lines: Vec<&str> = out
                    .stdout
                    .lines()
                    .filter_map(|l| l.strip_prefix(&prefix))
                    .collect();
                let last = format!("rank {r} of {n} ({wire_name} wire): ");
                let passed: usize = lines
                    .iter()
                    .find_map(|l| {
                        l.strip_prefix(&last)?
                            .strip_suffix(" checks passed")?
                            .parse()
                            .ok()
                    })
                    .unwrap_or_else(|| {
                        panic!("{what}: rank {r} did not print \"{last}N checks passed\"")
                    });
                let ok = lines.iter().filter(|l| l.starts_with("ok ")).count();
                assert_eq!(
                    ok, passed,
                    "{what}: rank {r} printed {ok} ok lines, counted {passed}"
                );
            }
        }
    }
}
