//! `nuvec bench` end to end on loopback, without the anchors (their parsing, the
//! comparison and the chart have unit tests on captured outputs): a short sweep over two
//! rank counts started through the launcher, its JSON report and its chart.

use std::process::{Command, Stdio};
use std::time::Duration;

use nuvec_tools::testing::{Finished, finish};
use serde_json::Value;

const NUVEC: &str = env!("CARGO_BIN_EXE_nuvec");

/// Runs `nuvec bench` with `args`, failing the test if it runs past five minutes.
fn bench(args: &[&str]) -> Finished {
    bench_with(args, &[])
}

/// [`bench`] with the variables `vars` set for it (and the ranks it starts).
fn bench_with(args: &[&str], vars: &[(&str, &str)]) -> Finished {
    let child = Command::new(NUVEC)
        .arg("bench")
        .args(args)
        .envs(vars.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting nuvec bench");
    finish(child, Duration::from_secs(300))
}

/// Runs `nuvec bench` with `args` and `--json` into a temporary file; panics unless it
/// succeeded; returns what it printed and the report it wrote.
fn bench_report(args: &[&str]) -> (Finished, Value) {
    bench_report_with(args, &[])
}

/// [`bench_report`] with the variables `vars` set.
fn bench_report_with(args: &[&str], vars: &[(&str, &str)]) -> (Finished, Value) {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    let out = bench_with(&[args, &["--json", json.to_str().unwrap()]].concat(), vars);
    out.assert_success("nuvec bench");
    let report = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    (out, report)
}

/// Asserts that `text` (`what`, as the failure message names it) contains every one of
/// `parts`.
fn assert_contains_all(text: &str, what: &str, parts: &[&str]) {
    for part in parts {
        assert!(text.contains(part), "no {part:?} in {what}");
    }
}

#[test]
fn a_short_sweep_over_two_rank_counts_writes_json_and_a_chart() {
    let dir = tempfile::tempdir().unwrap();
    let chart = dir.path().join("chart.svg");
    let (out, report) = bench_report(&[
        "-n",
        "2,3",
        "--ops",
        "all_sum,sendrecv",
        "--dtype",
        "float32,int8",
        "--op",
        "sum,min",
        "--sizes",
        "4,8K",
        "--iters",
        "30",
        "--chart",
        chart.to_str().unwrap(),
    ]);
    let stdout = &out.stdout;
    // The header, then nccl-tests' tables, unprefixed, for both rank counts.
    assert!(stdout.starts_with("# host "), "{stdout}");
    assert!(stdout.contains("# wire         mlx"), "{stdout}");
    assert!(
        stdout.contains("# nuvec, 2 ranks: all_sum, all_min")
            && stdout.contains("# nuvec, 3 ranks: sendrecv"),
        "{stdout}"
    );
    let row = stdout
        .lines()
        .find(|l| {
            l.split_whitespace()
                .take(4)
                .eq(["8192", "8192", "int8", "min"])
        })
        .unwrap_or_else(|| panic!("no int8 min row at 8 KiB:\n{stdout}"));
    assert!(row.ends_with(" 0"), "{row}");
    // The progress line is for terminals only.
    assert!(!out.stderr.contains("ranks ["), "{}", out.stderr);
    assert!(
        !stdout.contains("[0] "),
        "bench output is not prefixed:\n{stdout}"
    );

    let runs = report["nuvec"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for (run, ranks) in runs.iter().zip([2, 3]) {
        assert_eq!(run["ranks"], ranks);
        let ms = run["measurements"].as_array().unwrap();
        // all_sum: 2 dtypes × 2 reductions × 2 sizes; sendrecv: 2 dtypes × 2 sizes.
        assert_eq!(ms.len(), 12);
        for m in ms {
            assert_eq!(m["ranks"], ranks);
            assert_eq!(m["iters"], 30);
            assert_eq!(m["wrong"], 0);
            assert!(m["median_us"].as_f64().unwrap() > 0.0);
        }
        assert_eq!(
            (&ms[2]["redop"], &ms[2]["dtype"]),
            (&"min".into(), &"float32".into())
        );
        assert_eq!(
            (&ms[8]["op"], &ms[8]["redop"]),
            (&"sendrecv".into(), &Value::Null)
        );
    }
    assert_eq!(report["header"]["wire"], "mlx");
    assert_eq!(report["header"]["connections"], 1);
    // Without anchors, the comparison still has a row per float32 sum (or sendrecv), with
    // no anchor figures.
    let rows = report["comparison"].as_array().unwrap();
    assert_eq!(rows.len(), 8);
    assert!(rows.iter().all(|r| r["mlx_median_us"].is_null()));

    let svg = std::fs::read_to_string(&chart).unwrap();
    assert_contains_all(
        &svg,
        "the chart",
        &[
            "all_sum, all_min: median latency",
            "sendrecv: bus bandwidth",
            "nuvec n=2",
            "nuvec n=3",
        ],
    );
}

#[test]
fn a_missing_anchors_folder_is_named() {
    let out = bench(&["--limits", "--anchors", "/nonexistent/anchors"]);
    assert!(!out.status.success());
    let stderr = &out.stderr;
    assert!(
        stderr.contains("/nonexistent/anchors") && stderr.contains("--anchors"),
        "{stderr}"
    );
    // Nothing was measured before the check.
    assert!(!out.stdout.contains("nuvec, 2 ranks"));
}

#[test]
fn every_dtype_collective_and_reduction_comes_out_exact() {
    let dtypes: Vec<&str> = nuvec_distributed_engine::DType::ALL
        .iter()
        .map(|d| d.name())
        .collect();
    let (_, report) = bench_report(&[
        "-n",
        "3",
        "--collectives",
        "all_sum,all_gather,sum_scatter,sendrecv",
        "--op",
        "sum,max,min",
        "--dtype",
        &dtypes.join(","),
        "--sizes",
        "24",
        "--iters",
        "5",
    ]);
    let ms = report["nuvec"][0]["measurements"].as_array().unwrap();
    // all_sum: 14 dtypes × 3 reductions; all_gather, sum_scatter, sendrecv: 14 each.
    assert_eq!(ms.len(), 14 * 3 + 14 * 3);
    for m in ms {
        assert_eq!(m["wrong"], 0, "{m}");
        assert!(m["count"].as_u64().unwrap() >= 3, "{m}");
    }
}

#[test]
fn sizes_must_hold_whole_elements() {
    let out = bench(&["--sizes", "4,6", "--dtype", "bfloat16,float32"]);
    assert!(!out.status.success());
    assert!(
        out.stderr.contains("--sizes 6") && out.stderr.contains("float32"),
        "{}",
        out.stderr
    );
}

#[test]
fn charts_must_be_svg() {
    let out = bench(&["--chart", "/tmp/chart.png"]);
    assert!(!out.status.success());
    assert!(out.stderr.contains("SVG"), "{}", out.stderr);
}

#[test]
fn zero_iterations_are_refused_before_any_rank_starts() {
    // No timed collective would run, so the report would show zeros and claim no wrong
    // elements having checked nothing.
    let out = bench(&["--iters", "0", "--sizes", "4", "-q"]);
    assert!(!out.status.success(), "{}", out.stdout);
    assert!(out.stderr.contains("--iters"), "{}", out.stderr);
    assert!(!out.stdout.contains("(OK)"), "{}", out.stdout);
}

#[test]
fn a_skew_run_reports_each_delay_for_each_rank_count() {
    let (out, report) = bench_report(&[
        "-n", "2,3", "--wire", "native", "--skew", "0,500", "--iters", "20",
    ]);
    let stdout = &out.stdout;
    assert!(stdout.contains("# wire         native"), "{stdout}");
    for ranks in [2, 3] {
        assert!(
            stdout.contains(&format!("native wire, {ranks} ranks")),
            "{stdout}"
        );
    }
    let runs = report["skew"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{report}");
    for run in runs {
        let points = run["points"].as_array().unwrap();
        let delays: Vec<u64> = points
            .iter()
            .map(|p| p["delay_us"].as_u64().unwrap())
            .collect();
        assert_eq!(delays, [0, 500], "{run}");
        for p in points {
            assert_eq!(p["calls"], 20, "{p}");
            assert_eq!(p["wrong"], 0, "{p}");
            assert!(p["cpu_us"].as_f64().unwrap() > 0.0, "{p}");
        }
    }
}

#[test]
fn a_sealed_run_measures_each_size_unkeyed_and_keyed() {
    // Two sealing threads per rank, whatever the machine: the 64 KiB messages (two records
    // with their header) are sealed and opened in batches, and must come out exact.
    let (out, report) = bench_report_with(
        &[
            "-n",
            "2",
            "--wire",
            "native",
            "--sealed",
            "--ops",
            "all_sum,sendrecv",
            "--sizes",
            "4,64K",
            "--iters",
            "10",
            "-q",
        ],
        &[("NUVEC_DISTRIBUTED_SEAL_THREADS", "2")],
    );
    let stdout = &out.stdout;
    assert!(
        stdout.contains("# sealed       unkeyed, then keyed"),
        "{stdout}"
    );
    assert!(stdout.contains("NUVEC_DISTRIBUTED_SHM=0"), "{stdout}");
    assert_contains_all(
        stdout,
        &format!("its output:\n{stdout}"),
        &[
            "# nuvec, 2 ranks: all_sum",
            "# nuvec sealed, 2 ranks: all_sum",
            "# nuvec sealed, 2 ranks: sendrecv",
            "# sealed (AES-256-GCM, 2 sealing thread(s) per rank) beside unkeyed, native wire \
             over TCP, 2 ranks",
        ],
    );
    // One verdict per table: all_sum and sendrecv, unkeyed and keyed.
    assert_eq!(
        stdout.matches("# wrong elements    : 0 (OK)").count(),
        4,
        "{stdout}"
    );
    let unkeyed = report["nuvec"][0]["measurements"].as_array().unwrap();
    let sealed = &report["sealed"][0];
    assert_eq!(sealed["ranks"], 2);
    assert_eq!(sealed["seal_threads"], 2);
    // Both series ran over TCP: shared memory is off for both.
    for transport in [&report["nuvec"][0]["transport"], &sealed["transport"]] {
        let transport = transport.as_str().unwrap();
        assert!(transport.starts_with("tcp (every link"), "{transport}");
    }
    let keyed = sealed["measurements"].as_array().unwrap();
    let rows = sealed["comparison"].as_array().unwrap();
    assert_eq!(
        (unkeyed.len(), keyed.len(), rows.len()),
        (4, 4, 4),
        "{report}"
    );
    for m in unkeyed.iter().chain(keyed) {
        assert_eq!(m["wrong"], 0, "{m}");
        assert_eq!(m["iters"], 10, "{m}");
    }
    for (row, m) in rows.iter().zip(unkeyed) {
        assert_eq!(
            (&row["op"], &row["bytes"]),
            (&m["op"], &m["bytes"]),
            "{row}"
        );
        assert_eq!(row["unkeyed_us"], m["median_us"], "{row}");
        assert_eq!(row["wrong"], 0, "{row}");
        assert!(row["time_ratio"].as_f64().unwrap() > 0.0, "{row}");
        assert!(row["busbw_percent"].as_f64().unwrap() > 0.0, "{row}");
    }
}

#[test]
fn sealed_needs_the_native_wire() {
    let out = bench(&["--sealed", "--wire", "mlx", "--sizes", "4", "-q"]);
    assert!(!out.status.success(), "{}", out.stdout);
    assert!(
        out.stderr.contains("--sealed") && out.stderr.contains("--wire native"),
        "{}",
        out.stderr
    );
    // Refused before anything ran.
    assert!(!out.stdout.contains("# nuvec"), "{}", out.stdout);
}
