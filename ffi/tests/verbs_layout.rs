//! The verbs binding's hand-written structs against the platform's own `infiniband/verbs.h`.
//!
//! A C probe (`verbs_layout_probe.c`) is compiled against the header and prints the size of
//! every struct the binding allocates, the offset of every field it reads or writes, and the
//! value of every constant it passes; each must equal the Rust side's. On Linux the header
//! comes from `libibverbs-dev` (`tools/test.sh` installs it); on macOS from the SDK, found
//! with `xcrun`. A missing header or compiler fails the test: a layout that was not checked
//! must not look like one that was.

#![cfg(all(feature = "verbs", any(target_os = "linux", target_os = "macos")))]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

const PROBE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/verbs_layout_probe.c");

#[cfg(target_os = "linux")]
fn compile(probe: &Path, out: &Path) -> Command {
    let header = Path::new("/usr/include/infiniband/verbs.h");
    assert!(
        header.exists(),
        "{} is missing: the layout test needs rdma-core's header. Install it with \
         `apt-get install libibverbs-dev` (tools/test.sh does this before running the tests).",
        header.display()
    );
    let mut cc = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()));
    cc.arg(probe).arg("-o").arg(out);
    cc
}

#[cfg(target_os = "macos")]
fn compile(probe: &Path, out: &Path) -> Command {
    let sdk = Command::new("xcrun")
        .args(["--sdk", "macosx", "--show-sdk-path"])
        .output()
        .expect("xcrun (the Xcode command line tools) is needed to find the macOS SDK");
    assert!(sdk.status.success(), "xcrun could not find the macOS SDK");
    let sdk = PathBuf::from(String::from_utf8_lossy(&sdk.stdout).trim());
    let header = sdk.join("usr/include/infiniband/verbs.h");
    assert!(
        header.exists(),
        "{} is missing: Apple's verbs header ships with the macOS 26.2 SDK and later",
        header.display()
    );
    let mut cc = Command::new("xcrun");
    cc.args(["clang", "-isysroot"])
        .arg(&sdk)
        .arg(probe)
        .arg("-o")
        .arg(out);
    cc
}

/// The C side: what the probe prints, by name.
fn c_layout() -> BTreeMap<String, usize> {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let exe = dir.join(format!("verbs_layout_probe_{}", std::process::id()));
    let compiled = compile(Path::new(PROBE), &exe)
        .output()
        .expect("a C compiler (cc) is needed to build the layout probe");
    assert!(
        compiled.status.success(),
        "the layout probe did not compile against the platform's verbs.h:\n{}",
        String::from_utf8_lossy(&compiled.stderr)
    );
    let run = Command::new(&exe)
        .output()
        .expect("running the layout probe");
    let _ = std::fs::remove_file(&exe);
    assert!(run.status.success(), "the layout probe failed");
    String::from_utf8_lossy(&run.stdout)
        .lines()
        .map(|line| {
            let (name, value) = line.rsplit_once(' ').expect("`<name> <value>` lines");
            (name.to_string(), value.parse().expect("a number"))
        })
        .collect()
}

#[test]
fn every_size_offset_and_constant_matches_the_platform_header() {
    let c = c_layout();
    let rust: BTreeMap<String, usize> = nuvec_distributed_ffi::verbs::layout()
        .into_iter()
        .map(|(name, value)| (name.replace(' ', ""), value))
        .collect();
    let mut report = Vec::new();
    for (name, &value) in &rust {
        match c.get(name) {
            Some(&expected) if expected == value => {}
            Some(&expected) => report.push(format!("{name}: Rust {value}, C {expected}")),
            None => report.push(format!("{name}: not printed by the C probe")),
        }
    }
    for name in c.keys().filter(|name| !rust.contains_key(*name)) {
        report.push(format!(
            "{name}: printed by the C probe but not checked on the Rust side"
        ));
    }
    assert!(
        report.is_empty(),
        "the verbs binding disagrees with the platform's verbs.h:\n  {}",
        report.join("\n  ")
    );
    // Print what was compared, so a test log shows the numbers that were checked.
    for (name, value) in &c {
        println!("{name} = {value}");
    }
    println!("{} entries match", c.len());
}
