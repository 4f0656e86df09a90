//! `nuvec plan`: its JSON keys and the cost model's limits on small all-reduces past the
//! measured rows (at most log2 P rounds and messages per rank, plus the hand-in and
//! hand-out of P not a power of two).

use std::process::Command;

use serde_json::Value;

const NUVEC: &str = env!("CARGO_BIN_EXE_nuvec");

/// Runs `nuvec plan ARGS --json` and returns its rows.
fn plan(args: &[&str]) -> Vec<Value> {
    let out = Command::new(NUVEC)
        .arg("plan")
        .args(args)
        .arg("--json")
        .output()
        .expect("running nuvec plan");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}:\n{stdout}"));
    rows.as_array().expect("a list").clone()
}

/// The keys of every plan row, plain or simulated.
const ROW_KEYS: [&str; 6] = [
    "algorithm",
    "bytes",
    "collective",
    "link",
    "predicted_us",
    "ranks",
];

/// Asserts that `row` is an object with exactly the keys [`ROW_KEYS`] and `extra`.
fn assert_keys(row: &Value, extra: &[&str]) {
    let mut keys: Vec<&str> = row
        .as_object()
        .expect("an object")
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    let mut want = [&ROW_KEYS[..], extra].concat();
    want.sort_unstable();
    assert_eq!(keys, want, "{row}");
}

/// The all-reduce row of `bytes` among `rows`.
fn all_reduce(rows: &[Value], bytes: u64) -> &Value {
    rows.iter()
        .find(|r| r["collective"] == "all_reduce" && r["bytes"] == bytes)
        .unwrap_or_else(|| panic!("no all_reduce row of {bytes} bytes in {rows:?}"))
}

#[test]
fn json_rows_have_exactly_the_documented_keys() {
    let rows = plan(&["-n", "16", "--sizes", "4,64K", "--link", "loopback"]);
    // all_reduce, all_gather and broadcast at two sizes, the barrier once.
    assert_eq!(rows.len(), 7, "{rows:?}");
    for row in &rows {
        assert_keys(row, &["messages_per_rank", "rounds"]);
        assert_eq!(row["ranks"], 16);
        assert_eq!(row["link"], "loopback");
        assert!(
            row["predicted_us"].as_f64().is_some_and(|t| t > 0.0),
            "{row}"
        );
    }
    let barriers: Vec<_> = rows
        .iter()
        .filter(|r| r["collective"] == "barrier")
        .collect();
    assert_eq!(barriers.len(), 1);
    assert_eq!(barriers[0]["bytes"], 0);
}

#[test]
fn small_all_reduces_take_few_rounds_and_messages_at_p16_and_p12() {
    let p16 = plan(&["-n", "16", "--sizes", "4,64K", "--link", "loopback"]);
    let tiny = all_reduce(&p16, 4);
    assert!(tiny["rounds"].as_u64().is_some_and(|n| n <= 4), "{tiny}");
    assert!(
        tiny["messages_per_rank"].as_u64().is_some_and(|n| n <= 4),
        "{tiny}"
    );
    let mid = all_reduce(&p16, 64 << 10);
    assert!(
        mid["messages_per_rank"].as_u64().is_some_and(|n| n <= 8),
        "{mid}"
    );
    let p12 = plan(&["-n", "12", "--sizes", "4"]);
    let tiny = all_reduce(&p12, 4);
    assert_eq!(tiny["link"], "loopback", "the default link");
    assert!(tiny["rounds"].as_u64().is_some_and(|n| n <= 5), "{tiny}");
}

#[test]
fn a_link_that_does_not_exist_is_refused_by_name() {
    let out = Command::new(NUVEC)
        .args(["plan", "-n", "4", "--link", "infiniband"])
        .output()
        .expect("running nuvec plan");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("loopback"), "{stderr}");
}

/// `--simulate` lists every algorithm of every collective with the formula's time and the
/// simulated clock's: exactly one chosen per collective and size, the chosen one the same
/// as the plain plan's, and the ring (not an exchange) said to be not simulated.
#[test]
fn simulate_lists_every_algorithm_with_both_times() {
    let args = ["-n", "32", "--sizes", "4,64K", "--link", "loopback"];
    let plain = plan(&args);
    let rows = plan(&[&args[..], &["--simulate"]].concat());
    for row in &rows {
        assert_keys(row, &["chosen", "not_simulated", "simulated_us"]);
        let simulated = row["simulated_us"].as_f64();
        let why = row["not_simulated"].as_str();
        assert!(simulated.is_some() != why.is_some(), "{row}");
        if row["algorithm"] == "ring" {
            assert!(why.unwrap().contains("ring"), "{row}");
        } else {
            assert!(simulated.unwrap() > 0.0, "{row}");
        }
    }
    for p in &plain {
        let chosen: Vec<&Value> = rows
            .iter()
            .filter(|r| r["collective"] == p["collective"] && r["bytes"] == p["bytes"])
            .filter(|r| r["chosen"] == true)
            .collect();
        assert_eq!(chosen.len(), 1, "{p}: {chosen:?}");
        assert_eq!(chosen[0]["algorithm"], p["algorithm"], "{p}");
        assert_eq!(chosen[0]["predicted_us"], p["predicted_us"], "{p}");
    }
    // At P = 32 a 4 B all-reduce by recursive doubling takes 5 rounds of one message on
    // the clock, far below the one-shot's 31 messages queued on each rank.
    let time = |name: &str| {
        rows.iter()
            .find(|r| r["collective"] == "all_reduce" && r["bytes"] == 4 && r["algorithm"] == name)
            .and_then(|r| r["simulated_us"].as_f64())
            .unwrap()
    };
    assert!(time("recursive_doubling") * 2.0 < time("one_shot"));
}
