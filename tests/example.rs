//! The tensor-parallel example runs on two ranks and matches its unsharded computation.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{collect, free_ports, write_hostfile};

#[test]
fn the_tensor_parallel_example_matches_the_unsharded_stack() {
    // Cargo builds the examples next to the test binaries' directory before running tests.
    let deps = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let example = deps
        .parent()
        .unwrap()
        .join("examples")
        .join("tensor_parallel");
    assert!(example.exists(), "{} was not built", example.display());
    for dtype in ["f16", "bf16"] {
        let dir = tempfile::tempdir().unwrap();
        let hostfile = write_hostfile(dir.path(), &free_ports(2, 1));
        let children = (0..2)
            .map(|rank| {
                let child = Command::new(&example)
                    .args([
                        "--dtype", dtype, "--layers", "4", "--hidden", "256", "--ffn", "1024",
                        "--tokens", "8",
                    ])
                    .env("MLX_HOSTFILE", &hostfile)
                    .env("MLX_RANK", rank.to_string())
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("starting the example");
                (rank, child)
            })
            .collect();
        let outputs = collect(children, Duration::from_secs(120));
        for o in &outputs {
            assert_eq!(
                o.status.map(|s| s.success()),
                Some(true),
                "rank {} ({dtype}):\n{}\n{}",
                o.rank,
                o.stdout,
                o.stderr
            );
        }
        let report = &outputs[0].stdout;
        assert!(
            report.contains("largest difference") && report.contains(": ok"),
            "{dtype}: {report}"
        );
    }
}
