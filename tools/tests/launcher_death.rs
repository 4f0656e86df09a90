//! A SIGKILLed `nuvec launch` takes its ranks with it and leaves no temporary folder: the
//! ranks run in process groups of their own, so only the launcher's guardian process (and on
//! Linux the parent-death signal) can end them once the launcher cannot.
//!
//! Each rank prints its PID, the PID of a child it starts in its process group, and the folder
//! its hostfile is in; the test then SIGKILLs the launcher and watches those PIDs and folders.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const NUVEC: &str = env!("CARGO_BIN_EXE_nuvec");

/// A rank: a background `sleep` in its process group (the guardian ends groups, not just the
/// rank), then a line with both PIDs and the hostfile's folder, then `sleep` in its place.
const RANK: &str = "sleep 60 & echo \"up $$ $! $(dirname \"$MLX_HOSTFILE\")\"; exec sleep 60";

/// Whether `pid` is a live process. A dead rank is reparented, and its new parent may not
/// have reaped it yet: a zombie is dead.
fn alive(pid: i32) -> bool {
    if kill(Pid::from_raw(pid), None).is_err() {
        return false;
    }
    let state = if Path::new("/proc/self/stat").exists() {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| rest.to_string()))
            .unwrap_or_default()
    } else {
        Command::new("ps")
            .args(["-o", "stat=", "-p", &pid.to_string()])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    !state.is_empty() && !state.starts_with('Z')
}

/// The launch's temporary folders (the launcher's TMPDIR is `tmp`).
fn launch_folders(tmp: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(tmp)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("nuvec-launch-"))
        })
        .collect()
}

/// Reads the ranks' `up` lines: (PIDs of ranks and their children, hostfile folders).
fn read_ranks(launcher: &mut Child, ranks: usize) -> (Vec<i32>, Vec<PathBuf>) {
    let mut out = BufReader::new(launcher.stdout.take().unwrap());
    let (mut pids, mut folders) = (Vec::new(), Vec::new());
    let mut seen = String::new();
    while folders.len() < ranks {
        let mut line = String::new();
        let n = out.read_line(&mut line).unwrap();
        assert!(n > 0, "the launch ended before its ranks were up: {seen}");
        seen.push_str(&line);
        let Some((_, rest)) = line.trim_end().split_once("] up ") else {
            continue;
        };
        let fields: Vec<&str> = rest.splitn(3, ' ').collect();
        pids.push(fields[0].parse().unwrap());
        pids.push(fields[1].parse().unwrap());
        folders.push(PathBuf::from(fields[2]));
    }
    // The pipe stays open (dropping it would not end the ranks, but keep the test honest).
    std::mem::forget(out);
    (pids, folders)
}

/// Launches `ranks` sleeping ranks with `args`, SIGKILLs the launcher once they are up, and
/// checks that within 3 s no rank (nor its child) is alive and the launcher's temporary
/// folder is gone. Returns the ranks' hostfile folders.
fn launch_and_kill(args: &[&str], env: &[(&str, &Path)], ranks: usize) -> Vec<PathBuf> {
    let tmp = tempfile::tempdir().unwrap();
    let mut command = Command::new(NUVEC);
    command
        .arg("launch")
        .args(args)
        .args(["--", "sh", "-c", RANK])
        .env("TMPDIR", tmp.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    for (k, v) in env {
        command.env(k, v);
    }
    let mut launcher = command.spawn().unwrap();
    let (pids, folders) = read_ranks(&mut launcher, ranks);
    assert_eq!(launch_folders(tmp.path()).len(), 1, "one launch folder");
    assert!(pids.iter().all(|&p| alive(p)));

    kill(Pid::from_raw(launcher.id() as i32), Signal::SIGKILL).unwrap();
    launcher.wait().unwrap();
    let start = Instant::now();
    let deadline = start + Duration::from_secs(3);
    while (pids.iter().any(|&p| alive(p)) || !launch_folders(tmp.path()).is_empty())
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let survivors: Vec<i32> = pids.iter().copied().filter(|&p| alive(p)).collect();
    let folders_left = launch_folders(tmp.path());
    // Clean up what this test started before failing.
    for &p in &survivors {
        let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
    }
    assert!(
        survivors.is_empty(),
        "still running {:?} after the launcher was killed",
        survivors
    );
    assert!(
        folders_left.is_empty(),
        "the launcher's temporary folder is left: {folders_left:?}"
    );
    eprintln!("ranks gone {:?} after SIGKILL", start.elapsed());
    folders
}

#[test]
fn local_ranks_die_with_a_sigkilled_launcher_and_its_folder_is_removed() {
    let folders = launch_and_kill(&["-n", "3"], &[], 3);
    // Local ranks' hostfile is in the launcher's folder, which is gone.
    for folder in &folders {
        let name = folder.file_name().unwrap().to_string_lossy();
        assert!(name.starts_with("nuvec-launch-"), "{folder:?}");
        assert!(!folder.exists(), "{folder:?}");
    }
}

#[test]
fn remote_ranks_ssh_clients_die_with_a_sigkilled_launcher() {
    // With the stand-in, the "remote" rank runs in its ssh client's process group, so this
    // checks that the launcher's ssh clients are ended; with real ssh, ending the client hangs
    // up the rank's terminal on the remote host (`ssh -tt`), which sends it SIGHUP.
    let dir = tempfile::tempdir().unwrap();
    let path = PathBuf::from(nuvec_tools::testing::install_fake_ssh(dir.path()));
    launch_and_kill(
        &["--hosts", "127.0.0.2,127.0.0.3,127.0.0.4"],
        &[("PATH", &path)],
        3,
    );
}
