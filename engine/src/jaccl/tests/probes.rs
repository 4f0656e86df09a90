//! JACCL fires the ring's tracing probes, with the same codes: checked under bpftrace,
//! attached to this test process while emulated groups run collectives. Needs root,
//! bpftrace and tracefs, so it is ignored by default (as `tests/probes.rs` is); asked for
//! with `--ignored`, it fails rather than skips where bpftrace cannot attach.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::{Layout, run_ok};
use crate::transport::rdma::emulated::Network;

/// Whether bpftrace can attach here, or why not.
fn bpftrace_can_attach() -> Result<(), String> {
    let uid = Command::new("id")
        .arg("-u")
        .output()
        .map_err(|e| e.to_string())?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Err("not root".into());
    }
    if Command::new("bpftrace").arg("--version").output().is_err() {
        return Err("bpftrace is not installed".into());
    }
    if !std::path::Path::new("/sys/kernel/tracing/events").exists() {
        return Err("tracefs is not mounted at /sys/kernel/tracing".into());
    }
    Ok(())
}

#[test]
#[ignore = "needs root, bpftrace and tracefs; run with --ignored where they are"]
fn jaccl_fires_the_ring_s_probes_under_bpftrace() {
    if let Err(why) = bpftrace_can_attach() {
        panic!("bpftrace cannot attach here: {why}");
    }
    // Op codes as tools/trace/ documents them: 0 all_sum, 3 all_gather, 7 barrier.
    let script = "usdt::nuvec:collective_start /arg0 == 0 && arg2 == 256/ { @sum_starts = count(); } \
                  usdt::nuvec:collective_done /arg0 == 0 && arg1 == 11 && arg2 == 256 && arg3 == 2 && arg5 == 1/ { @sums = count(); } \
                  usdt::nuvec:collective_done /arg0 == 3 && arg1 == 255 && arg5 == 1/ { @gathers = count(); } \
                  usdt::nuvec:collective_start /arg0 == 7/ { @barrier_starts = count(); } \
                  usdt::nuvec:collective_done /arg0 == 7 && arg5 == 1/ { @barriers = count(); } \
                  usdt::nuvec:collective_done /arg0 == 0 && arg2 != 256/ { @other_sums = count(); }";
    let mut tracer = Command::new("bpftrace")
        .args(["-p", &std::process::id().to_string(), "-e", script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting bpftrace");
    // Its stderr is drained on the side: bpftrace warns there about each of the many probe
    // sites in this test binary, and a full pipe would stall it before it attaches.
    let mut stderr = tracer.stderr.take().expect("bpftrace's stderr");
    let warnings = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let mut stdout = BufReader::new(tracer.stdout.take().expect("bpftrace's stdout"));
    let mut line = String::new();
    while stdout.read_line(&mut line).unwrap_or(0) > 0 && !line.contains("Attaching") {
        line.clear();
    }
    std::thread::sleep(Duration::from_millis(200));

    // Two ranks (threads of this process) per layout: 5 all_sums of 64 f32, an all_gather
    // and 2 barriers each.
    for layout in [Layout::mesh(2), Layout::ring(2, 1)] {
        run_ok(layout, &Network::new(), |rank, g| {
            for _ in 0..5 {
                let mut x = [rank as f32; 64];
                g.all_sum(&mut x).unwrap();
                assert_eq!(x, [1.0; 64]);
            }
            let mut all = [0u8; 2];
            g.all_gather(&[rank as u8], &mut all).unwrap();
            assert_eq!(all, [0, 1]);
            g.barrier().unwrap();
            g.barrier().unwrap();
        });
    }

    // SIGINT makes bpftrace print its maps and exit; it is this test's own child.
    let killed = Command::new("kill")
        .args(["-INT", &tracer.id().to_string()])
        .status()
        .expect("running kill");
    assert!(killed.success(), "kill -INT bpftrace: {killed}");
    let mut text = String::new();
    stdout.read_to_string(&mut text).expect("bpftrace's output");
    let status = tracer.wait().expect("waiting for bpftrace");
    let warnings = warnings.join().unwrap_or_default();
    let text = format!("{text}\nbpftrace's stderr:\n{warnings}");
    let count = |map: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("@{map}: ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    // 2 layouts x 2 ranks.
    assert_eq!(
        (count("sum_starts"), count("sums")),
        (20, 20),
        "all_sum of 64 float32 (dtype 11) over 2 ranks ({status}):\n{text}"
    );
    assert_eq!(count("gathers"), 4, "all_gather as bytes:\n{text}");
    assert_eq!(
        (count("barrier_starts"), count("barriers")),
        (8, 8),
        "barriers as op 7:\n{text}"
    );
    assert_eq!(
        count("other_sums"),
        0,
        "barriers traced as all_sums:\n{text}"
    );
}
