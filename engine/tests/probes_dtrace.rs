//! The tracing probes fire under DTrace on macOS (feature `probes`): the counterpart of
//! `tests/probes.rs`'s bpftrace test. Ranks run collectives while `dtrace`, attached to
//! rank 0, counts what its probes report. DTrace needs root (this test runs it through
//! `sudo -n` when it is not root), so the test is ignored by default; `tools/test.sh` runs it
//! with `--ignored` on macOS, where it fails rather than skips if dtrace cannot attach.
//!
//! Written without a Mac to run it on; the macOS CI workflow is its first run (README.md,
//! "CI").
#![cfg(all(feature = "probes", target_os = "macos"))]

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::Duration;

use nuvec_tools::testing::{self as common, Launch};

/// Counts rank 0's successful all_sums (op 0) of 1000 f32, and its send steps. On macOS the
/// usdt crate registers the provider at run time, as `nuvec<pid>`; `$target` is the process
/// of `-p`. BEGIN fires once the probes are enabled, which is what the parent waits for.
const SCRIPT: &str = r#"
dtrace:::BEGIN { printf("ready\n"); }
nuvec$target:::collective_done /arg0 == 0 && arg2 == 4000 && arg5 == 1/ { @done = count(); }
nuvec$target:::send_step { @steps = count(); }
dtrace:::END { printa("done %@d\n", @done); printa("steps %@d\n", @steps); }
"#;

/// What each rank runs: it marks that its group formed (which registers the probes with
/// DTrace), waits for the parent to attach dtrace, then runs 50 all_sums of 1000 f32.
fn fifty_sums(g: nuvec_distributed_engine::Group) {
    common::mark("formed");
    common::wait_for_parent();
    for _ in 0..50 {
        g.all_sum(&mut vec![1.0f32; 1000]).unwrap();
    }
}

/// `dtrace` attached to `pid`, through `sudo -n` unless this process is root.
fn dtrace(pid: u32) -> Command {
    let uid = Command::new("id")
        .arg("-u")
        .output()
        .expect("running id -u");
    let mut command = if String::from_utf8_lossy(&uid.stdout).trim() == "0" {
        Command::new("dtrace")
    } else {
        let mut c = Command::new("sudo");
        c.args(["-n", "dtrace"]);
        c
    };
    // A fast switch rate so that "ready" reaches the pipe promptly.
    command.args([
        "-q",
        "-x",
        "switchrate=10hz",
        "-p",
        &pid.to_string(),
        "-n",
        SCRIPT,
    ]);
    command
}

/// Two ranks run 50 all_sums while dtrace, attached to rank 0, counts its probes.
#[test]
#[ignore = "needs root (or sudo -n) and dtrace; tools/test.sh runs it with --ignored on macOS"]
fn the_probes_fire_under_dtrace() {
    let name = "the_probes_fire_under_dtrace";
    let Some(running) = Launch::new(2, 1).start(name, fifty_sums) else {
        return;
    };
    running.wait_for(0, "formed", Duration::from_secs(60));
    let mut tracer = dtrace(running.pid(0))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting dtrace");
    let mut stdout = BufReader::new(tracer.stdout.take().expect("dtrace's stdout"));
    let mut line = String::new();
    let ready = loop {
        line.clear();
        match stdout.read_line(&mut line) {
            Ok(0) | Err(_) => break false,
            Ok(_) if line.trim() == "ready" => break true,
            Ok(_) => {}
        }
    };
    // The ranks go on either way, so that none is left waiting.
    running.release();
    let outputs = running.finish();
    common::assert_all_finished(&outputs);
    // dtrace exits by itself once rank 0 has, printing the aggregations in END.
    let mut text = String::new();
    stdout.read_to_string(&mut text).unwrap_or_default();
    let mut errors = String::new();
    if let Some(mut e) = tracer.stderr.take() {
        e.read_to_string(&mut errors).unwrap_or_default();
    }
    let status = tracer.wait().expect("waiting for dtrace");
    assert!(
        ready,
        "dtrace could not attach to rank 0 ({status}); stderr:\n{errors}"
    );
    let count = |name: &str| common::traced_count(&text, &format!("{name} "));
    assert_eq!(
        count("done"),
        50,
        "collective_done for 50 all_sums on rank 0 ({status}):\n{text}\n{errors}"
    );
    assert!(
        count("steps") >= 100,
        "send_step for 2 steps x 50 all_sums on rank 0:\n{text}\n{errors}"
    );
}
