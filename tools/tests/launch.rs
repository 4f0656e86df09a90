//! `nuvec launch` end to end, on 127.0.0.1 only: Rust ranks forming a ring, output
//! prefixes, `--env`, `--cwd`, hostfiles, a failing rank, forwarded signals, and MLX's own
//! Python ranks (from the venv `tools/mlx-venv.sh` makes, installing it when missing).
//!
//! The Rust rank is this test binary, run through the shared harness's rank protocol
//! ([`testing::as_rank`]): the launch passes `NUVEC_TEST_CHILD=<test>` with `--env`, and runs
//! the binary filtered to that one test.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use nuvec_tools::testing::{self, CHILD_VAR, DONE, Finished, finish, free_port_block};

const NUVEC: &str = env!("CARGO_BIN_EXE_nuvec");

fn nuvec_launch(args: &[&str]) -> Command {
    let mut c = Command::new(NUVEC);
    c.arg("launch")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

fn run(args: &[&str]) -> Finished {
    finish(
        nuvec_launch(args).spawn().unwrap(),
        Duration::from_secs(120),
    )
}

/// Lines of `text` that rank `rank` printed, without the prefix.
fn rank_lines(text: &str, rank: usize) -> Vec<&str> {
    let prefix = format!("[{rank}] ");
    text.lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .collect()
}

/// Whether rank `rank` printed a line ending in `expected`. (A Rust rank is a test, and the
/// test harness writes the test's name before what the test prints on the same line.)
fn printed(text: &str, rank: usize, expected: &str) -> bool {
    rank_lines(text, rank).iter().any(|l| l.ends_with(expected))
}

/// Asserts that rank `rank` printed a line ending in `expected` (see [`printed`]).
fn assert_printed(text: &str, rank: usize, expected: &str) {
    assert!(
        printed(text, rank, expected),
        "no {expected:?} from rank {rank} in\n{text}"
    );
}

/// The body of a Rust rank: forms the ring from MLX_HOSTFILE/MLX_RANK, all_sums
/// rank + 1, and prints the result on stdout and a line on stderr.
fn rust_rank() {
    let group = nuvec_distributed_engine::init(true).expect("the ring forms");
    let mut x = [(group.rank() + 1) as f32];
    group.all_sum(&mut x).expect("all_sum");
    println!("RANK {} OF {} SUM {}", group.rank(), group.size(), x[0]);
    eprintln!("stderr of rank {}", group.rank());
}

/// `nuvec launch` arguments that start `ranks` copies of this test binary as Rust ranks,
/// running only `test`.
fn rust_ranks(ranks: usize, port: u16, test: &str) -> Vec<String> {
    let exe = std::env::current_exe().unwrap();
    let mut args: Vec<String> = [
        "-n",
        &ranks.to_string(),
        "-p",
        &port.to_string(),
        "--env",
        &format!("{CHILD_VAR}={test}"),
        "--env",
        "NUVEC_DISTRIBUTED_TIMEOUT=30",
        "--",
        exe.to_str().unwrap(),
    ]
    .map(String::from)
    .to_vec();
    args.extend(testing::rank_args(test).map(String::from));
    args
}

#[test]
fn rust_ranks_form_a_ring_and_their_output_is_prefixed() {
    const NAME: &str = "rust_ranks_form_a_ring_and_their_output_is_prefixed";
    if testing::as_rank(NAME, rust_rank) {
        return;
    }
    for n in [2usize, 3] {
        let port = free_port_block(n).unwrap();
        let args = rust_ranks(n, port, NAME);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let f = run(&args);
        assert!(f.status.success(), "n={n}: {}\n{}", f.status, f.stderr);
        let sum = (n * (n + 1) / 2) as f32;
        for rank in 0..n {
            let expected = format!("RANK {rank} OF {n} SUM {sum}");
            assert!(
                printed(&f.stdout, rank, &expected),
                "n={n}: no {expected:?} from rank {rank} in\n{}",
                f.stdout
            );
            assert!(
                printed(&f.stdout, rank, DONE),
                "n={n}: rank {rank}'s body did not return:\n{}",
                f.stdout
            );
            assert!(
                printed(&f.stderr, rank, &format!("stderr of rank {rank}")),
                "n={n}: rank {rank}'s stderr is not prefixed:\n{}",
                f.stderr
            );
        }
        // Every line any rank printed carries a prefix.
        for line in f.stdout.lines() {
            assert!(
                (0..n).any(|r| line.starts_with(&format!("[{r}] "))),
                "unprefixed line {line:?}"
            );
        }
    }
}

#[test]
fn the_hostfile_is_mlx_launchs_and_env_and_cwd_reach_the_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = std::fs::canonicalize(dir.path()).unwrap();
    let port = free_port_block(3).unwrap();
    // A bare --env name passes on the launcher's value.
    let mut launch = nuvec_launch(&[
        "-n",
        "3",
        "-p",
        &port.to_string(),
        "--env",
        "GREETING=hello there",
        "--env",
        "EMPTY=",
        "--env",
        "PASSED",
        "--env",
        "not-a-name=1",
        "--cwd",
        cwd.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        "echo \"$GREETING|${EMPTY-unset}|$PASSED|$MLX_RANK|$(pwd)\"; cat \"$MLX_HOSTFILE\"",
    ]);
    launch.env("PASSED", "from the launcher");
    let f = finish(launch.spawn().unwrap(), Duration::from_secs(120));
    f.assert_success("nuvec launch");
    let hostfile = format!(
        "[[\"127.0.0.1:{}\"], [\"127.0.0.1:{}\"], [\"127.0.0.1:{}\"]]",
        port,
        port + 1,
        port + 2
    );
    for rank in 0..3 {
        assert_eq!(
            rank_lines(&f.stdout, rank),
            [
                format!("hello there||from the launcher|{rank}|{}", cwd.display()),
                hostfile.clone()
            ],
            "{}",
            f.stdout
        );
    }
    assert!(
        f.stderr
            .contains("\"not-a-name=1\" is not a valid environment variable"),
        "{}",
        f.stderr
    );
    // A bare --env name unset in the launcher stops the launch, naming it.
    let mut launch = nuvec_launch(&["-n", "2", "--env", "NOT_IN_LAUNCHER", "--", "true"]);
    launch.env_remove("NOT_IN_LAUNCHER");
    let f = finish(launch.spawn().unwrap(), Duration::from_secs(120));
    assert!(!f.status.success());
    assert!(
        f.stderr
            .contains("--env NOT_IN_LAUNCHER: NOT_IN_LAUNCHER is not set in the launcher's"),
        "{}",
        f.stderr
    );
    // A --cwd that does not exist stops the launch before anything runs.
    let missing = cwd.join("missing");
    let f = run(&["-n", "2", "--cwd", missing.to_str().unwrap(), "--", "true"]);
    assert!(!f.status.success());
    assert!(f.stderr.contains("not a directory"), "{}", f.stderr);
}

#[test]
fn a_hostfile_for_jaccl_gives_the_device_file_and_coordinator() {
    let dir = tempfile::tempdir().unwrap();
    let hostfile = dir.path().join("hosts.json");
    std::fs::write(
        &hostfile,
        r#"{"backend": "jaccl-ring", "envs": ["FROM_HOSTFILE=yes"], "hosts": [
            {"ssh": "127.0.0.1", "ips": ["127.0.0.1"], "rdma": [null, "rdma_en5"]},
            {"ssh": "127.0.0.1", "ips": ["127.0.0.1"], "rdma": ["rdma_en5", null]}]}"#,
    )
    .unwrap();
    let f = run(&[
        "--hostfile",
        hostfile.to_str().unwrap(),
        "-p",
        "40404",
        "--",
        "sh",
        "-c",
        "echo \"$FROM_HOSTFILE $MLX_JACCL_COORDINATOR $MLX_JACCL_RING ${MLX_HOSTFILE-none}\"; \
         cat \"$MLX_IBV_DEVICES\"",
    ]);
    f.assert_success("nuvec launch");
    for rank in 0..2 {
        assert_eq!(
            rank_lines(&f.stdout, rank),
            [
                "yes 127.0.0.1:40404 1 none",
                r#"[[null, "rdma_en5"], ["rdma_en5", null]]"#
            ]
        );
    }
}

#[test]
fn a_failing_rank_ends_the_others_and_is_named() {
    // Rank 1 fails at once; the others would sleep for a minute.
    let f = run(&[
        "-n",
        "3",
        "--",
        "sh",
        "-c",
        "if [ \"$MLX_RANK\" = 1 ]; then echo failing >&2; exit 3; fi; exec sleep 60",
    ]);
    f.assert_failed(
        3,
        "rank 1 (127.0.0.1) failed: exit status: 3; ended ranks 0, 2",
    );
    assert!(rank_lines(&f.stderr, 1).contains(&"failing"));
    assert!(f.took < Duration::from_secs(30), "took {:?}", f.took);

    // A rank that ignores SIGTERM is killed.
    let f = run(&[
        "-n",
        "2",
        "--",
        "sh",
        "-c",
        "trap '' TERM; if [ \"$MLX_RANK\" = 0 ]; then exit 5; fi; sleep 60",
    ]);
    f.assert_failed(5, "rank 0 (127.0.0.1) failed");
    assert!(f.took < Duration::from_secs(30), "took {:?}", f.took);

    // A program that cannot be started is named with its rank; nothing is left running.
    let f = run(&["-n", "2", "--", "/nonexistent/program"]);
    f.assert_failed(127, "starting rank 0 (/nonexistent/program)");
}

#[test]
fn sigint_and_sigterm_are_forwarded_to_every_rank() {
    for (signal, code) in [(Signal::SIGINT, 130), (Signal::SIGTERM, 143)] {
        let mut child = nuvec_launch(&[
            "-n",
            "2",
            "--",
            "sh",
            "-c",
            "trap 'echo got INT; exit 0' INT; trap 'echo got TERM; exit 0' TERM; \
             echo ready; while :; do sleep 0.05; done",
        ])
        .spawn()
        .unwrap();
        // Signal once both ranks are running: their "ready" lines are the first output.
        let mut stdout = child.stdout.take().unwrap();
        let mut seen = String::new();
        let mut buf = [0u8; 256];
        while seen.matches("ready").count() < 2 {
            let n = stdout.read(&mut buf).unwrap();
            assert!(n > 0, "the ranks ended before they were ready: {seen}");
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        child.stdout = Some(stdout);
        kill(Pid::from_raw(child.id() as i32), signal).unwrap();
        let f = finish(child, Duration::from_secs(60));
        let name = if signal == Signal::SIGINT {
            "INT"
        } else {
            "TERM"
        };
        for rank in 0..2 {
            assert!(
                rank_lines(&f.stdout, rank).contains(&format!("got {name}").as_str()),
                "rank {rank} did not get {signal}:\n{}",
                f.stdout
            );
        }
        assert_eq!(f.status.code(), Some(code), "{}", f.stderr);
        assert!(f.stderr.contains(&format!("interrupted by {signal}")));
    }
}

const MLX_SCRIPT: &str = r#"
import mlx.core as mx
group = mx.distributed.init(backend="ring", strict=True)
x = mx.distributed.all_sum(mx.array([float(group.rank() + 1)]))
mx.eval(x)
print(f"RANK {group.rank()} OF {group.size()} SUM {x.item()}", flush=True)
"#;

#[test]
fn python_mlx_ranks_and_mixed_rings_run_under_nuvec_launch() {
    const NAME: &str = "python_mlx_ranks_and_mixed_rings_run_under_nuvec_launch";
    if testing::as_rank(NAME, rust_rank) {
        return;
    }
    let python = testing::mlx_python();
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("mlx_all_sum.py");
    std::fs::write(&script, MLX_SCRIPT).unwrap();

    // Three MLX ranks.
    let port = free_port_block(3).unwrap();
    let f = run(&[
        "-n",
        "3",
        "-p",
        &port.to_string(),
        "--",
        python.to_str().unwrap(),
        script.to_str().unwrap(),
    ]);
    f.assert_success("nuvec launch");
    for rank in 0..3 {
        let expected = format!("RANK {rank} OF 3 SUM 6.0");
        assert!(
            rank_lines(&f.stdout, rank).contains(&expected.as_str()),
            "no {expected:?} in\n{}\n{}",
            f.stdout,
            f.stderr
        );
    }

    // One ring of an MLX rank (rank 0) and two Rust ranks, started by one launch.
    let port = free_port_block(3).unwrap();
    let exe = std::env::current_exe().unwrap();
    let body = format!(
        "if [ \"$MLX_RANK\" = 0 ]; then exec '{}' '{}'; else exec '{}' {}; fi",
        python.display(),
        script.display(),
        exe.display(),
        testing::rank_args(NAME).join(" ")
    );
    let f = run(&[
        "-n",
        "3",
        "-p",
        &port.to_string(),
        "--env",
        &format!("{CHILD_VAR}={NAME}"),
        "--",
        "sh",
        "-c",
        &body,
    ]);
    f.assert_success("nuvec launch");
    assert_printed(&f.stdout, 0, "RANK 0 OF 3 SUM 6.0");
    for rank in 1..3 {
        assert_printed(&f.stdout, rank, &format!("RANK {rank} OF 3 SUM 6"));
    }
}

#[test]
fn remote_ranks_run_their_script_through_ssh() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let path = testing::install_fake_ssh(&bin);
    let log = dir.path().join("ssh.log");
    // The remote scripts' temporary files (PID files, hostfiles) land here.
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let launch = |args: &[&str]| {
        let mut c = nuvec_launch(args);
        c.env("PATH", &path)
            .env("FAKE_SSH_LOG", &log)
            .env("TMPDIR", &tmp);
        finish(c.spawn().unwrap(), Duration::from_secs(60))
    };

    // Hosts other than exactly 127.0.0.1 are remote, even on this machine.
    let f = launch(&[
        "--hosts",
        "127.0.0.2,127.0.0.3",
        "-p",
        "41000",
        "--env",
        "GREETING=it's here",
        "--",
        "sh",
        "-c",
        "echo \"$GREETING|$MLX_RANK\"; cat \"$MLX_HOSTFILE\"",
    ]);
    f.assert_success("nuvec launch");
    let hostfile = r#"[["127.0.0.2:41000"], ["127.0.0.3:41001"]]"#;
    for rank in 0..2 {
        // The PID-file line the script prints first is not shown.
        assert_eq!(
            rank_lines(&f.stdout, rank),
            [format!("it's here|{rank}").as_str(), hostfile],
            "{}",
            f.stdout
        );
    }
    let mut hosts: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    hosts.sort();
    assert_eq!(hosts, ["127.0.0.2", "127.0.0.3"]);

    // A failing remote rank: the other is ended through its PID file (the kill script
    // removes it), the failed one's is left as mlx.launch leaves it.
    for entry in std::fs::read_dir(&tmp).unwrap() {
        std::fs::remove_file(entry.unwrap().path()).unwrap();
    }
    let f = launch(&[
        "--hosts",
        "127.0.0.2,127.0.0.3",
        "--",
        "sh",
        "-c",
        "if [ \"$MLX_RANK\" = 1 ]; then exit 4; fi; exec sleep 60",
    ]);
    f.assert_failed(4, "rank 1 (127.0.0.3) failed: exit status: 4; ended rank 0");
    assert!(f.took < Duration::from_secs(30));
    let pidfiles = std::fs::read_dir(&tmp)
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .filter(|text| {
            let t = text.trim();
            !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit())
        })
        .count();
    assert_eq!(pidfiles, 1, "only the failed rank's PID file is left");
}

#[test]
fn standard_input_reaches_every_rank() {
    use std::io::Write;
    let mut c = nuvec_launch(&["-n", "3", "--", "sh", "-c", "read line; echo \"got $line\""]);
    let mut child = c.stdin(Stdio::piped()).spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"hello ranks\n").unwrap();
    drop(stdin);
    let f = finish(child, Duration::from_secs(60));
    f.assert_success("nuvec launch");
    for rank in 0..3 {
        assert_eq!(
            rank_lines(&f.stdout, rank),
            ["got hello ranks"],
            "{}",
            f.stdout
        );
    }
}

/// A host ssh cannot reach (192.0.2.7, TEST-NET-1; the stand-in ssh contacts nothing):
/// the launcher shows ssh's own message (under the rank's prefix)
/// and says that exit status 255 is likely ssh's, instead of a bare "exit status: 255".
#[test]
fn ssh_s_own_failure_is_shown() {
    let dir = tempfile::tempdir().unwrap();
    // As real ssh does: its message unless LogLevel=QUIET silences it, then status 255.
    testing::write_executable(
        &dir.path().join("ssh"),
        "#!/bin/sh\nquiet=no\nfor a; do [ \"$a\" = LogLevel=QUIET ] && quiet=yes; done\n\
         [ $quiet = no ] && echo 'ssh: connect to host 192.0.2.7 port 22: Connection refused' >&2\n\
         exit 255\n",
    );
    let path = format!(
        "{}:{}",
        dir.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut c = nuvec_launch(&["--hosts", "192.0.2.7", "--", "true"]);
    c.env("PATH", &path);
    let f = finish(c.spawn().unwrap(), Duration::from_secs(60));
    f.assert_failed(
        255,
        "ssh: connect to host 192.0.2.7 port 22: Connection refused",
    );
    f.assert_failed(
        255,
        "rank 0 (192.0.2.7) failed: exit status: 255 (ssh's own failure",
    );
}
