//! The tensor-parallel example runs on two ranks, matches its unsharded computation, and
//! reports a late rank as the others' wait rather than as collective time.

use nuvec_tools::testing::run_example;

/// Rank 0's table, one row per rank: the all_sum, the wait and the collective (median and
/// p99 each), then per token the step, its all_sums and its waiting, in µs.
fn rows(report: &str) -> Vec<Vec<f64>> {
    report
        .lines()
        .filter(|l| l.contains('|'))
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            words.next()?.parse::<usize>().ok()?;
            Some(
                words
                    .filter(|w| *w != "/" && *w != "|")
                    .map(|w| w.parse::<f64>().unwrap_or(f64::NAN))
                    .collect(),
            )
        })
        .collect()
}

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
        assert!(
            report.contains("share an origin to within"),
            "{dtype}: {report}"
        );
        let rows = rows(report);
        assert_eq!(rows.len(), 2, "{dtype}: a row per rank in {report}");
        for row in &rows {
            assert_eq!(row.len(), 9, "{dtype}: {report}");
            assert!(
                row.iter().all(|v| v.is_finite() && *v >= 0.0),
                "{dtype}: {report}"
            );
        }
    }
}

/// Rank 1 spins 20 ms before each layer's all_sum: rank 0 waits for it most of that time in
/// every layer, and rank 1, the last to arrive, waits less than rank 0. (Half the spin is
/// the threshold: rank 0 would have to be descheduled for 10 ms in most layers to miss it.)
#[test]
fn a_late_rank_shows_as_the_others_wait() {
    let outputs = run_example(
        ("nuvec-distributed-engine", "tensor_parallel"),
        &[
            "--layers",
            "2",
            "--hidden",
            "64",
            "--ffn",
            "256",
            "--tokens",
            "8",
            "--late-rank",
            "1",
            "--late-us",
            "20000",
        ],
        2,
        "a_late_rank_shows_as_the_others_wait",
    );
    let report = &outputs[0].stdout;
    assert!(report.contains("rank 1 spins 20000 µs"), "{report}");
    let rows = rows(report);
    assert_eq!(rows.len(), 2, "a row per rank in {report}");
    let (wait0, wait1) = (rows[0][2], rows[1][2]);
    assert!(
        wait0 >= 10_000.0,
        "rank 0's median wait {wait0} µs: {report}"
    );
    assert!(wait1 < wait0, "rank 1's median wait {wait1} µs: {report}");
    // Rank 0's all_sum is its wait plus its collective.
    assert!(rows[0][4] <= rows[0][0], "{report}");
}
