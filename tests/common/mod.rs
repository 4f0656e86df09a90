//! The multi-process harness: a test starts its own binary once per rank, with a generated
//! hostfile on 127.0.0.1 and `MLX_HOSTFILE`/`MLX_RANK` set, as `mlx.launch` would.
//!
//! A test calls [`Launch::run`] with its own name and a body. In the parent the call spawns
//! the ranks (the same binary, filtered to this one test), waits for them and returns what
//! each printed. In a child (`NUVEC_TEST_CHILD` names the test) it initialises the ring
//! from the environment, runs the body, and prints [`DONE`] so the parent knows the body
//! finished rather than exited early.

#![allow(dead_code)]

use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nuvec_distributed::Group;

/// What a child prints when its body returned.
pub const DONE: &str = "NUVEC-RANK-DONE";

const CHILD_VAR: &str = "NUVEC_TEST_CHILD";

/// One rank's outcome.
#[derive(Debug)]
pub struct RankOutput {
    pub rank: usize,
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
}

impl RankOutput {
    /// Whether the rank exited successfully after its body returned.
    pub fn finished(&self) -> bool {
        self.status.is_some_and(|s| s.success()) && self.stdout.contains(DONE)
    }

    /// What follows `marker` on each line of stdout that holds it. (The test harness may
    /// have printed the test's name before it on the same line.)
    pub fn lines(&self, marker: &str) -> Vec<String> {
        self.stdout
            .lines()
            .filter_map(|l| {
                l.find(marker)
                    .map(|i| l[i + marker.len()..].trim().to_string())
            })
            .collect()
    }

    /// The first `FAIL <ms> <peer> <message>` line (see [`report_failure`]), parsed: the
    /// milliseconds, the peer the error named (`None` for `-`) and the message. Panics, with
    /// the rank's output, when the rank printed none.
    pub fn failure(&self) -> (u64, Option<usize>, String) {
        let line = self.lines("FAIL ").into_iter().next().unwrap_or_else(|| {
            panic!(
                "rank {} printed no failure:
{}
{}",
                self.rank, self.stdout, self.stderr
            )
        });
        let mut parts = line.splitn(3, ' ');
        let ms = parts.next().unwrap().parse().unwrap();
        let peer = parts.next().unwrap().parse().ok();
        (ms, peer, parts.next().unwrap_or_default().to_string())
    }
}

/// In a rank: prints `FAIL <ms> <peer> <message>` for `error`, reached `elapsed` after the
/// rank started waiting, for the parent to read with [`RankOutput::failure`].
pub fn report_failure(error: &nuvec_distributed::Error, elapsed: Duration) {
    let peer = error.peer().map_or("-".to_string(), |p| p.to_string());
    println!("FAIL {} {peer} {error}", elapsed.as_millis());
}

/// In a child: the group every rank of a [`Launch::run`] or [`Launch::start`] body gets.
fn form_group() -> Group {
    nuvec_distributed::init(true).expect("the ring forms")
}

/// How to launch a ring of test processes.
#[derive(Clone, Debug)]
pub struct Launch {
    pub size: usize,
    pub connections: usize,
    /// Environment for every rank.
    pub env: Vec<(String, String)>,
    /// Ranks that are not started at all.
    pub skip: Vec<usize>,
    /// How long the parent waits for all ranks before killing them.
    pub deadline: Duration,
    /// Seconds each rank's group waits for a silent peer.
    pub timeout_secs: f64,
}

impl Launch {
    pub fn new(size: usize, connections: usize) -> Self {
        Self {
            size,
            connections,
            env: Vec::new(),
            skip: Vec::new(),
            deadline: Duration::from_secs(180),
            timeout_secs: 20.0,
        }
    }

    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    pub fn skip(mut self, rank: usize) -> Self {
        self.skip.push(rank);
        self
    }

    pub fn timeout(mut self, seconds: f64) -> Self {
        self.timeout_secs = seconds;
        self
    }

    /// In a child: initialises the group from the environment, runs `body` and prints
    /// [`DONE`]; returns `None`. In the parent: runs every rank of test `name` and returns
    /// their outputs.
    pub fn run(&self, name: &str, body: impl FnOnce(Group)) -> Option<Vec<RankOutput>> {
        self.run_raw(name, || body(form_group()))
    }

    /// Like [`Launch::run`], but the body gets the environment only and forms (or fails to
    /// form) the group itself.
    pub fn run_raw(&self, name: &str, body: impl FnOnce()) -> Option<Vec<RankOutput>> {
        if std::env::var(CHILD_VAR).as_deref() == Ok(name) {
            body();
            println!("{DONE}");
            return None;
        }
        let dir = tempfile::tempdir().expect("a temporary directory");
        let hostfile = write_hostfile(dir.path(), &free_ports(self.size, self.connections));
        Some(self.spawn_and_wait(name, &hostfile))
    }

    /// [`Launch::run`], asserting that every rank finished; returns their outputs.
    pub fn all_ok(&self, name: &str, body: impl FnOnce(Group)) -> Vec<RankOutput> {
        match self.run(name, body) {
            None => Vec::new(),
            Some(outputs) => {
                assert_all_finished(&outputs);
                outputs
            }
        }
    }

    /// Like [`Launch::run`], but returns the running ranks, so the test can signal them
    /// (see [`Running`]); in a child, runs `body` and returns `None`.
    pub fn start(&self, name: &str, body: impl FnOnce(Group)) -> Option<Running> {
        self.start_raw(name, || body(form_group()))
    }

    /// Like [`Launch::start`], but the body gets the environment only and forms (or fails
    /// to form) the group itself.
    pub fn start_raw(&self, name: &str, body: impl FnOnce()) -> Option<Running> {
        if std::env::var(CHILD_VAR).as_deref() == Ok(name) {
            body();
            println!("{DONE}");
            return None;
        }
        let dir = tempfile::tempdir().expect("a temporary directory");
        let ports = free_ports(self.size, self.connections);
        let hostfile = write_hostfile(dir.path(), &ports);
        let markers = dir.path().join("markers");
        std::fs::create_dir(&markers).expect("the markers directory");
        let launch = self.clone().env(MARKERS_VAR, &markers.to_string_lossy());
        let children = launch.spawn(name, &hostfile);
        Some(Running {
            children,
            markers,
            ports,
            deadline: self.deadline,
            _dir: dir,
        })
    }

    fn spawn_and_wait(&self, name: &str, hostfile: &Path) -> Vec<RankOutput> {
        collect(self.spawn(name, hostfile), self.deadline)
    }

    fn spawn(&self, name: &str, hostfile: &Path) -> Vec<(usize, Child)> {
        let exe = std::env::current_exe().expect("the test binary's path");
        let mut children: Vec<(usize, Child)> = Vec::new();
        for rank in (0..self.size).filter(|r| !self.skip.contains(r)) {
            let child = Command::new(&exe)
                .args([
                    name,
                    "--exact",
                    "--nocapture",
                    "--test-threads=1",
                    "--include-ignored",
                ])
                .env(CHILD_VAR, name)
                .env("MLX_HOSTFILE", hostfile)
                .env("MLX_RANK", rank.to_string())
                .env("NUVEC_DISTRIBUTED_TIMEOUT", self.timeout_secs.to_string())
                .envs(self.env.iter().map(|(k, v)| (k, v)))
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawning a rank");
            children.push((rank, child));
        }
        children
    }
}

const MARKERS_VAR: &str = "NUVEC_TEST_MARKERS";

/// In a child started by [`Launch::start`]: tells the parent this rank reached `what`.
pub fn mark(what: &str) {
    let dir = std::env::var(MARKERS_VAR).expect("started by Launch::start");
    let rank = std::env::var("MLX_RANK").unwrap_or_default();
    std::fs::write(Path::new(&dir).join(format!("{rank}-{what}")), b"").expect("writing a marker");
}

/// In a child started by [`Launch::start`]: waits until the parent calls
/// [`Running::release`].
pub fn wait_for_parent() {
    let dir = std::env::var(MARKERS_VAR).expect("started by Launch::start");
    let go = Path::new(&dir).join("go");
    let until = Instant::now() + Duration::from_secs(60);
    while !go.exists() {
        assert!(
            Instant::now() < until,
            "the parent never released this rank"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Ranks started by [`Launch::start`], still running.
pub struct Running {
    children: Vec<(usize, Child)>,
    markers: PathBuf,
    /// Each rank's listening ports, as in the hostfile.
    pub ports: Vec<Vec<u16>>,
    deadline: Duration,
    _dir: tempfile::TempDir,
}

impl Running {
    /// Waits until `rank` has called [`mark`] with `what`; panics after `within`.
    pub fn wait_for(&self, rank: usize, what: &str, within: Duration) {
        let path = self.markers.join(format!("{rank}-{what}"));
        let until = Instant::now() + within;
        while !path.exists() {
            assert!(
                Instant::now() < until,
                "rank {rank} did not reach {what:?} within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The process id of `rank` (still running: its handle is held here).
    pub fn pid(&self, rank: usize) -> u32 {
        self.children
            .iter()
            .find(|(r, _)| *r == rank)
            .expect("a started rank")
            .1
            .id()
    }

    /// Lets every rank waiting in [`wait_for_parent`] go on.
    pub fn release(&self) {
        std::fs::write(self.markers.join("go"), b"").expect("writing the go marker");
    }

    /// Sends `signal` (`"KILL"`, `"STOP"`, `"CONT"`) to `rank`'s process: one this test
    /// started and has not yet reaped, so its PID cannot have been reused.
    pub fn signal(&mut self, rank: usize, signal: &str) {
        let (_, child) = self
            .children
            .iter_mut()
            .find(|(r, _)| *r == rank)
            .expect("a started rank");
        assert!(
            matches!(child.try_wait(), Ok(None)),
            "rank {rank} already exited"
        );
        if signal == "KILL" {
            child.kill().expect("SIGKILL");
            return;
        }
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(child.id().to_string())
            .status()
            .expect("running kill");
        assert!(status.success(), "kill -{signal} {} failed", child.id());
    }

    /// Waits for every rank (killing those still running at the deadline) and returns
    /// their outputs.
    pub fn finish(self) -> Vec<RankOutput> {
        collect(self.children, self.deadline)
    }
}

/// Waits for every child (killing those still running at the deadline) and reads their
/// output.
pub fn collect(children: Vec<(usize, Child)>, deadline: Duration) -> Vec<RankOutput> {
    let until = Instant::now() + deadline;
    let mut readers = Vec::new();
    let mut waiting = Vec::new();
    for (rank, mut child) in children {
        let mut out = child.stdout.take().expect("piped stdout");
        let mut err = child.stderr.take().expect("piped stderr");
        let o = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = out.read_to_string(&mut s);
            s
        });
        let e = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        readers.push((o, e));
        waiting.push((rank, child));
    }
    let mut statuses: Vec<Option<ExitStatus>> = vec![None; waiting.len()];
    loop {
        let mut all = true;
        for (i, (_, child)) in waiting.iter_mut().enumerate() {
            if statuses[i].is_none() {
                statuses[i] = child.try_wait().expect("waiting for a rank");
                all &= statuses[i].is_some();
            }
        }
        if all {
            break;
        }
        if Instant::now() >= until {
            // Only our own children, by their handles.
            for (i, (_, child)) in waiting.iter_mut().enumerate() {
                if statuses[i].is_none() {
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    waiting
        .into_iter()
        .zip(readers)
        .zip(statuses)
        .map(|(((rank, _), (o, e)), status)| RankOutput {
            rank,
            status,
            stdout: o.join().unwrap_or_default(),
            stderr: e.join().unwrap_or_default(),
        })
        .collect()
}

/// Panics with every rank's output unless all ranks finished.
pub fn assert_all_finished(outputs: &[RankOutput]) {
    if outputs.iter().all(RankOutput::finished) {
        return;
    }
    let mut report = String::from("not every rank finished:\n");
    for o in outputs {
        report += &format!(
            "--- rank {} (status {:?})\nstdout:\n{}\nstderr:\n{}\n",
            o.rank, o.status, o.stdout, o.stderr
        );
    }
    panic!("{report}");
}

/// `size * connections` distinct free ports on 127.0.0.1, chosen by the kernel.
pub fn free_ports(size: usize, connections: usize) -> Vec<Vec<u16>> {
    // Hold every listener until all ports are chosen, so none is handed out twice.
    let listeners: Vec<TcpListener> = (0..size * connections)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("a free port"))
        .collect();
    let ports: Vec<u16> = listeners
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect();
    ports.chunks(connections).map(<[u16]>::to_vec).collect()
}

/// Writes an MLX hostfile for `ports` on 127.0.0.1 and returns its path.
pub fn write_hostfile(dir: &Path, ports: &[Vec<u16>]) -> PathBuf {
    let nodes: Vec<Vec<String>> = ports
        .iter()
        .map(|r| r.iter().map(|p| format!("127.0.0.1:{p}")).collect())
        .collect();
    let path = dir.join("hostfile.json");
    std::fs::write(&path, serde_json::to_string(&nodes).expect("JSON"))
        .expect("writing the hostfile");
    path
}

/// In a child: the hostfile's address lists (from `MLX_HOSTFILE`).
pub fn hostfile_nodes() -> Vec<Vec<String>> {
    let path = std::env::var("MLX_HOSTFILE").expect("MLX_HOSTFILE");
    serde_json::from_slice(&std::fs::read(path).expect("the hostfile")).expect("hostfile JSON")
}
