//! The tensor-parallel example runs on two ranks and matches its unsharded computation.

use nuvec_tools::testing::run_example;

#[test]
fn the_tensor_parallel_example_matches_the_unsharded_stack() {
    for dtype in ["f16", "bf16"] {
        let outputs = run_example(
            ("nuvec-distributed-engine", "tensor_parallel"),
            &[
                "--dtype", dtype, "--layers", "4", "--hidden", "256", "--ffn", "1024", "--tokens",
                "8",
            ],
            2,
            "the_tensor_parallel_example_matches_the_unsharded_stack",
        );
        let report = &outputs[0].stdout;
        assert!(
            report.contains("largest difference") && report.contains(": ok"),
            "{dtype}: {report}"
        );
    }
}
