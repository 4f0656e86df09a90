//! The one harness for tests that run ranks as separate processes, on 127.0.0.1 (or in
//! network namespaces): the ring tests, the failure tests, interop with MLX's Python ranks,
//! the example, and `nuvec launch`'s own tests.
//!
//! A test calls [`Launch::run`] with its own name and a body. In the parent the call picks
//! free ports ([`free_ports`]), writes a hostfile, starts every rank with `MLX_HOSTFILE`
//! and `MLX_RANK` set as `mlx.launch` would, waits for them up to a deadline and returns
//! what each printed. A rank is, by default, the test binary itself run filtered to that
//! one test with [`CHILD_VAR`] naming it ([`this_test`]); there (see [`as_rank`]) the call
//! runs the body and prints [`DONE`], so the parent knows the body returned rather than the
//! process exited early. [`Launch::command`] starts another program instead (an MLX Python
//! rank, the example binary, the test binary under `ip netns exec`).
//!
//! Ranks report failures on one line each ([`report_failure`], read back with
//! [`RankOutput::failure`]); [`Launch::start`] leaves them running so that the test can
//! signal them by PID ([`Ranks::signal`]) and wait for the points they mark ([`mark`],
//! [`Ranks::wait_for`]).
//!
//! Everything here panics on failure: it is for tests.

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use nuvec_distributed_engine::Group;

/// The one free-port picker, shared with `nuvec launch` and the benchmark: see
/// [`free_ports`] for why its blocks suit tests.
pub use crate::launch::free_port_block;

/// What a rank prints when its body returned.
pub const DONE: &str = "NUVEC-RANK-DONE";

/// The variable that makes a test binary a rank: it names the test whose body to run.
pub const CHILD_VAR: &str = "NUVEC_TEST_CHILD";

/// The directory where ranks started by [`Launch::start`] leave their marks.
const MARKERS_VAR: &str = "NUVEC_TEST_MARKERS";

// ---- Ports and hostfiles ---------------------------------------------------------------

/// Runs `ip` (iproute2) with `args`, for tests that build network namespaces; panics with
/// what it said when it fails.
pub fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .expect("running ip (iproute2)");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether this process maps a shared-memory segment of the native wire (Linux).
pub fn maps_a_segment() -> bool {
    std::fs::read_to_string("/proc/self/maps")
        .expect("/proc/self/maps")
        .contains("/nuvec-")
}

/// `size * connections` free ports on 127.0.0.1, `connections` per rank, from one block of
/// [`free_port_block`]: below the ephemeral range, so that no outgoing connection of
/// another ring is handed one of them before the ranks listen, and distinct from every
/// other block this process has been given, so that tests running in parallel never share
/// a port.
pub fn free_ports(size: usize, connections: usize) -> Vec<Vec<u16>> {
    let count = size * connections;
    let first = free_port_block(count).expect("a block of free ports on 127.0.0.1");
    (0..size)
        .map(|r| {
            (0..connections)
                .map(|c| {
                    let offset = u16::try_from(r * connections + c).expect("a port offset");
                    first + offset
                })
                .collect()
        })
        .collect()
}

/// `ports` as hostfile addresses on 127.0.0.1.
pub fn loopback_nodes(ports: &[Vec<u16>]) -> Vec<Vec<String>> {
    ports
        .iter()
        .map(|r| r.iter().map(|p| format!("127.0.0.1:{p}")).collect())
        .collect()
}

/// Runs `body` on each rank of a group of two on loopback (free ports as [`free_ports`]
/// picks them, default options), a thread each, once both ranks have formed the group; the
/// engine's doc examples of [`Group`]'s methods run their visible lines in it. Panics
/// naming the rank when forming the group or the body fails.
#[doc(hidden)]
pub fn two_ranks(body: impl Fn(Group) -> nuvec_distributed_engine::Result<()> + Sync) {
    let nodes = loopback_nodes(&free_ports(2, 1));
    std::thread::scope(|s| {
        for rank in 0..2 {
            let (nodes, body) = (&nodes, &body);
            s.spawn(move || {
                let options = nuvec_distributed_engine::Options::default();
                let group = nuvec_distributed_engine::init_with(nodes, rank, &options)
                    .unwrap_or_else(|e| panic!("rank {rank} of 2: forming the group: {e}"));
                // Both ranks have formed the ring before either may drop it.
                group
                    .barrier()
                    .unwrap_or_else(|e| panic!("rank {rank} of 2: the first barrier: {e}"));
                body(group).unwrap_or_else(|e| panic!("rank {rank} of 2: the example: {e}"));
            });
        }
    });
}

/// A stand-in for `ssh`, for the launcher's tests: it runs the remote command in a local
/// shell (as sshd would hand it to the login shell), after appending the host it was asked
/// for to `$FAKE_SSH_LOG` when that is set. It contacts nothing.
const FAKE_SSH: &str = r#"#!/bin/sh
while [ $# -gt 0 ]; do
  case "$1" in
    --) shift; break ;;
    -o) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
if [ -n "$FAKE_SSH_LOG" ]; then echo "$1" >> "$FAKE_SSH_LOG"; fi
shift
exec sh -c "$*"
"#;

/// Writes the stand-in `ssh` (see `FAKE_SSH`) into `dir` as an executable named `ssh`, and
/// returns a `PATH` that finds it first.
pub fn install_fake_ssh(dir: &Path) -> String {
    use std::os::unix::fs::PermissionsExt;
    let ssh = dir.join("ssh");
    std::fs::write(&ssh, FAKE_SSH).expect("writing the stand-in ssh");
    std::fs::set_permissions(&ssh, std::fs::Permissions::from_mode(0o755))
        .expect("making the stand-in ssh executable");
    format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// Writes an MLX ring hostfile (one list of `host:port` addresses per rank) into `dir` and
/// returns its path.
pub fn write_hostfile(dir: &Path, nodes: &[Vec<String>]) -> PathBuf {
    let path = dir.join("hostfile.json");
    std::fs::write(&path, serde_json::to_string(nodes).expect("JSON"))
        .expect("writing the hostfile");
    path
}

/// In a rank: the hostfile's address lists (from `MLX_HOSTFILE`).
pub fn hostfile_nodes() -> Vec<Vec<String>> {
    let path = std::env::var("MLX_HOSTFILE").expect("MLX_HOSTFILE");
    serde_json::from_slice(&std::fs::read(path).expect("the hostfile")).expect("hostfile JSON")
}

// ---- Ranks that are this test binary ---------------------------------------------------

/// Whether this process is a rank of test `name` (started by [`this_test`]).
pub fn is_rank(name: &str) -> bool {
    std::env::var(CHILD_VAR).as_deref() == Ok(name)
}

/// If this process is a rank of test `name`: runs `body`, prints [`DONE`] and returns
/// `true`. Otherwise returns `false` without running it.
pub fn as_rank(name: &str, body: impl FnOnce()) -> bool {
    if !is_rank(name) {
        return false;
    }
    body();
    println!("{DONE}");
    true
}

/// The test harness's arguments that run only test `name` (even when it is ignored) and
/// show what it prints.
pub fn rank_args(name: &str) -> [&str; 5] {
    [
        name,
        "--exact",
        "--nocapture",
        "--test-threads=1",
        "--include-ignored",
    ]
}

/// The variable naming the program (and its arguments, split at whitespace) that runs this
/// test binary's ranks, when the binary cannot be executed directly: a cross-compiled test
/// run by cargo's target runner, such as `qemu-aarch64 -L /usr/aarch64-linux-gnu -cpu max`.
/// Cargo starts the test binary itself through its runner, but the ranks that binary starts
/// are its own children, and without a binfmt handler the kernel refuses to execute a
/// foreign binary; so they need the same runner, named here (cargo does not tell the
/// binary which runner it used). Unset or empty: the ranks are executed directly.
pub const RUNNER_VAR: &str = "NUVEC_TEST_RUNNER";

/// The variable that stretches [`Launch::new`]'s deadline and group timeout by a factor (a
/// number, such as `6`): for runs far slower than native ones, such as under qemu-user's
/// emulation, where a ring that works would otherwise miss them. A test's own
/// [`Launch::timeout`] and [`Launch::deadline`] are not stretched. Unset: 1.
pub const TIME_SCALE_VAR: &str = "NUVEC_TEST_TIME_SCALE";

/// The factor of [`TIME_SCALE_VAR`]; panics on a value that is not a positive number.
fn time_scale() -> f64 {
    match std::env::var(TIME_SCALE_VAR) {
        Err(_) => 1.0,
        Ok(v) => match v.trim().parse::<f64>() {
            Ok(x) if x.is_finite() && x > 0.0 => x,
            _ => panic!("{TIME_SCALE_VAR}={v:?}: expected a positive number"),
        },
    }
}

/// A command that runs this test binary as a rank of test `name`.
pub fn this_test(name: &str) -> Command {
    this_test_in(&[], name)
}

/// Like [`this_test`], run through `wrapper` (a program and its arguments, such as
/// `ip netns exec <namespace>`) when it is not empty. The runner of [`RUNNER_VAR`], if
/// any, goes between the wrapper and the binary.
pub fn this_test_in(wrapper: &[&str], name: &str) -> Command {
    let exe = std::env::current_exe().expect("the test binary's path");
    let runner = std::env::var(RUNNER_VAR).unwrap_or_default();
    let mut program = wrapper
        .iter()
        .copied()
        .chain(runner.split_whitespace())
        .map(std::ffi::OsStr::new);
    let mut command = match program.next() {
        Some(first) => {
            let mut c = Command::new(first);
            c.args(program).arg(exe);
            c
        }
        None => Command::new(exe),
    };
    command.args(rank_args(name)).env(CHILD_VAR, name);
    command
}

/// The directory of the profile the tests run in (`target/<profile>`), where cargo puts the
/// workspace's binaries and libraries.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    // target/<profile>/deps/<this test> -> target/<profile>
    exe.parent()
        .and_then(Path::parent)
        .expect("the test binary sits in target/<profile>/deps")
        .to_path_buf()
}

/// Runs `cargo build` with `args` in the workspace, in the profile the tests run in;
/// panics naming `what` when it fails.
fn cargo_build(args: &[&str], what: &str) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = Command::new(cargo);
    build
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .arg("build")
        .args(args);
    if !cfg!(debug_assertions) {
        build.arg("--release");
    }
    let status = build
        .status()
        .unwrap_or_else(|e| panic!("running cargo build for {what}: {e}"));
    assert!(status.success(), "cargo build {} failed", args.join(" "));
}

/// The test verbs provider's shared library (`ffi/verbs-provider`), built once per test
/// binary with `cargo build -p nuvec-verbs-provider` in the profile the tests run in, so
/// that JACCL's real binding can load it through `NUVEC_DISTRIBUTED_VERBS_LIBRARY`.
pub fn verbs_provider() -> &'static Path {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT.get_or_init(|| {
        cargo_build(&["-p", "nuvec-verbs-provider"], "the provider");
        let name = if cfg!(target_os = "macos") {
            "libnuvec_verbs_provider.dylib"
        } else {
            "libnuvec_verbs_provider.so"
        };
        let path = profile_dir().join(name);
        assert!(path.exists(), "{} was not built", path.display());
        path
    })
}

/// The `nuvec` binary (`nuvec launch`) of the profile the tests run in, for tests that run
/// a program under it. A `cargo test` of the workspace or of its default members builds
/// it, with the features of that run, before any test starts; a test run of one other
/// package does not, and then this builds it once with `cargo build -p nuvec-tools --bin
/// nuvec` (rather than always, which with other features than the run's would rebuild the
/// engine under the other tests' feet).
pub fn nuvec_binary() -> &'static Path {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT.get_or_init(|| {
        let path = profile_dir().join(format!("nuvec{}", std::env::consts::EXE_SUFFIX));
        if !path.exists() {
            cargo_build(&["-p", "nuvec-tools", "--bin", "nuvec"], "nuvec launch");
        }
        assert!(path.exists(), "{} was not built", path.display());
        path
    })
}

/// The Python of the venv with MLX's CPU build that `tools/mlx-venv.sh` makes (installing it
/// when it is missing; `NUVEC_MLX_VENV` says where). Panics, saying why, when that fails:
/// a test that needs MLX's ranks does not pass without them.
pub fn mlx_python() -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("mlx-venv.sh");
    let out = Command::new(&script)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "{} failed ({}): this test needs a venv with mlx[cpu]==0.32.* and numpy",
        script.display(),
        out.status
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

// ---- The FAIL line and marks -----------------------------------------------------------

/// In a rank: prints `FAIL <ms> <peer> <message>` for `error`, reached `elapsed` after the
/// rank started waiting, for the parent to read with [`RankOutput::failure`].
pub fn report_failure(error: &nuvec_distributed_engine::Error, elapsed: Duration) {
    let peer = error.peer().map_or("-".to_string(), |p| p.to_string());
    println!("FAIL {} {peer} {error}", elapsed.as_millis());
}

/// In a rank started by [`Launch::start`]: tells the parent this rank reached `what`.
pub fn mark(what: &str) {
    let dir = std::env::var(MARKERS_VAR).expect("started by Launch::start");
    let rank = std::env::var("MLX_RANK").unwrap_or_default();
    std::fs::write(Path::new(&dir).join(format!("{rank}-{what}")), b"").expect("writing a marker");
}

/// In a rank started by [`Launch::start`]: waits until the parent calls
/// [`Ranks::release`].
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

// ---- Outputs ---------------------------------------------------------------------------

/// One rank's outcome.
#[derive(Debug)]
pub struct RankOutput {
    /// The rank.
    pub rank: usize,
    /// How it exited; `None` when it was killed at the deadline.
    pub status: Option<ExitStatus>,
    /// Everything it printed on stdout.
    pub stdout: String,
    /// Everything it printed on stderr.
    pub stderr: String,
}

impl RankOutput {
    /// Whether the rank exited successfully after its body returned.
    pub fn finished(&self) -> bool {
        self.status.is_some_and(|s| s.success()) && self.stdout.contains(DONE)
    }

    /// Asserts that the rank's verbose log shows a hierarchical group: the host domains
    /// `domains` (as the log prints them, e.g. `[[0, 1], [2, 3]]`), and shared memory
    /// inside its host with TCP between hosts.
    pub fn assert_hierarchical(&self, domains: &str) {
        assert!(
            self.stderr.contains(&format!("host domains {domains}")),
            "rank {}:\n{}",
            self.rank,
            self.stderr
        );
        assert!(
            self.stderr
                .contains("links: shared memory inside this host, tcp between hosts")
                || self
                    .stderr
                    .contains("links: shared memory (locked) inside this host"),
            "rank {}:\n{}",
            self.rank,
            self.stderr
        );
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
    /// the rank's output, when the rank printed none or a malformed one.
    pub fn failure(&self) -> (u64, Option<usize>, String) {
        let line = self
            .lines("FAIL ")
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("rank {} printed no failure:\n{self}", self.rank));
        let mut parts = line.splitn(3, ' ');
        let ms = parts
            .next()
            .and_then(|ms| ms.parse().ok())
            .unwrap_or_else(|| panic!("rank {}: a malformed FAIL line {line:?}", self.rank));
        let peer = parts.next().and_then(|p| p.parse().ok());
        (ms, peer, parts.next().unwrap_or_default().to_string())
    }
}

impl fmt::Display for RankOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "--- rank {} (status {:?})\nstdout:\n{}\nstderr:\n{}",
            self.rank, self.status, self.stdout, self.stderr
        )
    }
}

/// Panics with every rank's output unless all ranks finished.
pub fn assert_all_finished(outputs: &[RankOutput]) {
    if outputs.iter().all(RankOutput::finished) {
        return;
    }
    let mut report = String::from("not every rank finished:\n");
    for o in outputs {
        report += &format!("{o}\n");
    }
    panic!("{report}");
}

/// Waits for every child (killing, by its handle, each one still running at the deadline)
/// and reads their output. The children's stdout and stderr must be piped.
pub fn collect(children: Vec<(usize, Child)>, deadline: Duration) -> Vec<RankOutput> {
    let until = Instant::now() + deadline;
    let mut readers = Vec::new();
    let mut waiting = Vec::new();
    for (rank, mut child) in children {
        readers.push((reader(child.stdout.take()), reader(child.stderr.take())));
        waiting.push((rank, child));
    }
    let mut statuses: Vec<Option<ExitStatus>> = vec![None; waiting.len()];
    loop {
        let mut all = true;
        for (status, (_, child)) in statuses.iter_mut().zip(&mut waiting) {
            if status.is_none() {
                *status = child.try_wait().expect("waiting for a rank");
                all &= status.is_some();
            }
        }
        if all {
            break;
        }
        if Instant::now() >= until {
            for (status, (_, child)) in statuses.iter().zip(&mut waiting) {
                if status.is_none() {
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

/// Reads a child's stream to the end on a thread, so that no pipe fills up and blocks it.
fn reader(stream: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut s) = stream {
            let _ = s.read_to_string(&mut text);
        }
        text
    })
}

/// What a single process (not a ring) printed, and how long it ran.
#[derive(Debug)]
pub struct Finished {
    /// How it exited.
    pub status: ExitStatus,
    /// Everything it printed on stdout.
    pub stdout: String,
    /// Everything it printed on stderr.
    pub stderr: String,
    /// From the call to [`finish`] to its exit.
    pub took: Duration,
}

/// Waits for one `child` (its stdout and stderr piped); kills it and panics, with what it
/// printed, if it runs past `deadline`.
pub fn finish(child: Child, deadline: Duration) -> Finished {
    let start = Instant::now();
    let pid = child.id();
    let output = collect(vec![(0, child)], deadline)
        .pop()
        .expect("one output per child");
    let Some(status) = output.status else {
        panic!(
            "process {pid} ran past {deadline:?}; stdout:\n{}\nstderr:\n{}",
            output.stdout, output.stderr
        );
    };
    Finished {
        status,
        stdout: output.stdout,
        stderr: output.stderr,
        took: start.elapsed(),
    }
}

// ---- Rings of processes ----------------------------------------------------------------

/// Makes the command one rank runs, before the harness adds the ring's environment.
type RankCommand = Arc<dyn Fn(usize) -> Command + Send + Sync>;

/// How to launch a ring of processes.
#[derive(Clone)]
pub struct Launch {
    /// Number of ranks.
    pub size: usize,
    /// Connections (hostfile addresses) per rank.
    pub connections: usize,
    /// Environment for every rank.
    pub env: Vec<(String, String)>,
    /// Ranks that are not started at all.
    pub skip: Vec<usize>,
    /// How long the parent waits for all ranks before killing them.
    pub deadline: Duration,
    /// Seconds each rank's group waits for a silent peer (`NUVEC_DISTRIBUTED_TIMEOUT`).
    pub timeout_secs: f64,
    command: Option<RankCommand>,
    nodes: Option<Vec<Vec<String>>>,
}

impl fmt::Debug for Launch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Launch")
            .field("size", &self.size)
            .field("connections", &self.connections)
            .field("env", &self.env)
            .field("skip", &self.skip)
            .field("deadline", &self.deadline)
            .field("timeout_secs", &self.timeout_secs)
            .field("command", &self.command.as_ref().map(|_| "custom"))
            .field("nodes", &self.nodes)
            .finish()
    }
}

impl Launch {
    /// `size` ranks of this test binary, `connections` loopback ports each; a deadline of
    /// three minutes and a group timeout of 20 seconds, each times [`TIME_SCALE_VAR`].
    pub fn new(size: usize, connections: usize) -> Self {
        let scale = time_scale();
        Self {
            size,
            connections,
            env: Vec::new(),
            skip: Vec::new(),
            deadline: Duration::from_secs_f64(180.0 * scale),
            timeout_secs: 20.0 * scale,
            command: None,
            nodes: None,
        }
    }

    /// Sets `key` to `value` in every rank.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Does not start `rank`.
    pub fn skip(mut self, rank: usize) -> Self {
        self.skip.push(rank);
        self
    }

    /// Sets how long each rank's group waits for a silent peer.
    pub fn timeout(mut self, seconds: f64) -> Self {
        self.timeout_secs = seconds;
        self
    }

    /// Sets how long the parent waits for every rank before killing those still running.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// Starts `command(rank)` as each rank instead of this test binary; the harness adds
    /// the ring's environment and pipes its output.
    pub fn command(mut self, command: impl Fn(usize) -> Command + Send + Sync + 'static) -> Self {
        self.command = Some(Arc::new(command));
        self
    }

    /// Writes `nodes` as the hostfile instead of free loopback ports (a ring across
    /// network namespaces, for one).
    pub fn nodes(mut self, nodes: Vec<Vec<String>>) -> Self {
        self.nodes = Some(nodes);
        self
    }

    /// In a rank: initialises the group from the environment, runs `body` and prints
    /// [`DONE`]; returns `None`. In the parent: runs every rank of test `name` and returns
    /// their outputs.
    pub fn run(&self, name: &str, body: impl FnOnce(Group)) -> Option<Vec<RankOutput>> {
        self.run_raw(name, || body(form_group()))
    }

    /// Like [`Launch::run`], but the body gets the environment only and forms (or fails to
    /// form) the group itself.
    pub fn run_raw(&self, name: &str, body: impl FnOnce()) -> Option<Vec<RankOutput>> {
        if as_rank(name, body) {
            return None;
        }
        Some(self.spawn(name).finish())
    }

    /// [`Launch::run`], asserting that every rank finished; returns their outputs (none
    /// in a rank).
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
    /// and wait for their marks (see [`Ranks`]); in a rank, runs `body` and returns `None`.
    pub fn start(&self, name: &str, body: impl FnOnce(Group)) -> Option<Ranks> {
        self.start_raw(name, || body(form_group()))
    }

    /// Like [`Launch::start`], but the body gets the environment only and forms (or fails
    /// to form) the group itself.
    pub fn start_raw(&self, name: &str, body: impl FnOnce()) -> Option<Ranks> {
        if as_rank(name, body) {
            return None;
        }
        Some(self.spawn(name))
    }

    /// In the parent: writes the hostfile and starts every rank (of test `name` when the
    /// ranks are this test binary), whatever this process is.
    pub fn spawn(&self, name: &str) -> Ranks {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (ports, nodes) = match &self.nodes {
            Some(nodes) => (Vec::new(), nodes.clone()),
            None => {
                let ports = free_ports(self.size, self.connections);
                let nodes = loopback_nodes(&ports);
                (ports, nodes)
            }
        };
        let hostfile = write_hostfile(dir.path(), &nodes);
        let markers = dir.path().join("markers");
        std::fs::create_dir(&markers).expect("the markers directory");
        let mut children = Vec::new();
        for rank in (0..self.size).filter(|r| !self.skip.contains(r)) {
            let mut command = match &self.command {
                Some(make) => make(rank),
                None => this_test(name),
            };
            let child = command
                .env("MLX_HOSTFILE", &hostfile)
                .env("MLX_RANK", rank.to_string())
                .env("NUVEC_DISTRIBUTED_TIMEOUT", self.timeout_secs.to_string())
                .env(MARKERS_VAR, &markers)
                .envs(self.env.iter().map(|(k, v)| (k, v)))
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("starting rank {rank} ({command:?}): {e}"));
            children.push((rank, child));
        }
        Ranks {
            children,
            markers,
            ports,
            deadline: self.deadline,
            _dir: dir,
        }
    }
}

/// In a rank: the group every rank of a [`Launch::run`] or [`Launch::start`] body gets.
fn form_group() -> Group {
    nuvec_distributed_engine::init(true).expect("the ring forms")
}

/// Ranks started by [`Launch::start`] or [`Launch::spawn`], still running.
pub struct Ranks {
    children: Vec<(usize, Child)>,
    markers: PathBuf,
    /// Each rank's listening ports, as in the hostfile (empty with [`Launch::nodes`]).
    pub ports: Vec<Vec<u16>>,
    deadline: Duration,
    _dir: tempfile::TempDir,
}

impl Ranks {
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

    /// Sends `signal` (`"KILL"`, `"STOP"`, `"CONT"`, ...) to `rank`'s process: one this
    /// harness started and has not yet reaped, so its PID cannot have been reused.
    pub fn signal(&mut self, rank: usize, signal: &str) {
        let signal = Signal::from_str(&format!("SIG{signal}"))
            .unwrap_or_else(|e| panic!("no signal {signal}: {e}"));
        let (_, child) = self
            .children
            .iter_mut()
            .find(|(r, _)| *r == rank)
            .expect("a started rank");
        assert!(
            matches!(child.try_wait(), Ok(None)),
            "rank {rank} already exited"
        );
        let pid = i32::try_from(child.id()).expect("a process id");
        kill(Pid::from_raw(pid), signal)
            .unwrap_or_else(|e| panic!("kill -{signal} {pid} (rank {rank}): {e}"));
    }

    /// Waits for every rank (killing those still running at the deadline) and returns
    /// their outputs.
    pub fn finish(self) -> Vec<RankOutput> {
        collect(self.children, self.deadline)
    }
}
