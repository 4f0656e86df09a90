//! The tensor-parallel example runs on two ranks and matches its unsharded computation.

use std::process::Command;
use std::time::Duration;

use nuvec_tools::testing::{Launch, example_binary};

#[test]
fn the_tensor_parallel_example_matches_the_unsharded_stack() {
    let example = example_binary("nuvec-distributed-engine", "tensor_parallel");
    for dtype in ["f16", "bf16"] {
        let program = example.clone();
        let outputs = Launch::new(2, 1)
            .deadline(Duration::from_secs(120))
            .command(move |_| {
                let mut c = Command::new(&program);
                c.args([
                    "--dtype", dtype, "--layers", "4", "--hidden", "256", "--ffn", "1024",
                    "--tokens", "8",
                ]);
                c
            })
            .spawn("the_tensor_parallel_example_matches_the_unsharded_stack")
            .finish();
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
