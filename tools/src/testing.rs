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

/// Tests that each call one function with their own name and arguments:
/// `test_cases!(check { name: a, b; ... })` makes `#[test] fn name() { check("name", a, b) }`
/// for each line (attributes and doc comments before a line go on its test). For the
/// tables of cases the multi-process tests run, one process group each.
#[macro_export]
macro_rules! test_cases {
    ($check:path { $($(#[$meta:meta])* $name:ident: $($arg:expr),*;)* }) => {
        $(
            $(#[$meta])*
            #[test]
            fn $name() {
                $check(stringify!($name), $($arg),*);
            }
        )*
    };
}

/// What a rank prints when its body returned.
pub const DONE: &str = "NUVEC-RANK-DONE";

/// The variable that makes a test binary a rank: it names the test whose body to run.
pub const CHILD_VAR: &str = "NUVEC_TEST_CHILD";

/// The directory where ranks started by [`Launch::start`] leave their marks.
const MARKERS_VAR: &str = "NUVEC_TEST_MARKERS";

// ---- Ports and hostfiles ---------------------------------------------------------------

/// Two network namespaces joined by a veth pair, each end up (with the namespace's
/// loopback) on its address of a /24; removed on drop (deleting a namespace deletes its
/// end of the pair, and with it the other end). Needs root and iproute2.
#[derive(Debug)]
pub struct VethPair {
    /// The namespaces.
    pub netns: [String; 2],
    /// The pair's ends, `veth[i]` in `netns[i]`.
    pub veth: [String; 2],
    /// Each end's address, 10.202.`subnet`.1 and .2.
    pub addrs: [String; 2],
}

impl VethPair {
    /// Makes namespaces `netns` joined by ends `veth` (MTU 1500) on 10.202.`subnet`.0/24.
    pub fn new(netns: [String; 2], veth: [String; 2], subnet: u32) -> Self {
        let pair = VethPair {
            netns,
            veth,
            addrs: [1, 2].map(|h| format!("10.202.{subnet}.{h}")),
        };
        for n in &pair.netns {
            ip(&["netns", "add", n]);
        }
        let [a, b] = &pair.veth;
        ip(&["link", "add", a, "type", "veth", "peer", "name", b]);
        for side in 0..2 {
            let (ns, dev) = (&pair.netns[side], &pair.veth[side]);
            ip(&["link", "set", dev, "netns", ns]);
            let addr = format!("{}/24", pair.addrs[side]);
            ip(&["-n", ns, "addr", "add", &addr, "dev", dev]);
            ip(&["-n", ns, "link", "set", dev, "mtu", "1500"]);
            ip(&["-n", ns, "link", "set", dev, "up"]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        pair
    }
}

impl Drop for VethPair {
    fn drop(&mut self) {
        for n in &self.netns {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

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
    write_executable(&dir.join("ssh"), FAKE_SSH);
    format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// Writes `text` to `path` and makes it executable (mode 755): a script for a test to run.
pub fn write_executable(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .unwrap_or_else(|e| panic!("making {} executable: {e}", path.display()));
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

/// Every variable JACCL reads at launch; the tests that start JACCL ranks remove them from
/// a child unless the test sets one.
pub const JACCL_LAUNCH_VARS: [&str; 10] = [
    "MLX_HOSTFILE",
    "MLX_RANK",
    "JACCL_RANK",
    "MLX_IBV_DEVICES",
    "JACCL_IBV_DEVICES",
    "MLX_JACCL_COORDINATOR",
    "JACCL_COORDINATOR",
    "MLX_JACCL_RING",
    "JACCL_RING",
    "NUVEC_JACCL_BUFFERS",
];

/// The result recursive doubling and halving-doubling compute over one input per rank
/// (`native::protocol`'s `Exchange::doubling`): with `pof2` the largest power of two not
/// above P and `extra = P - pof2`, leaf `v` is `fold(x(2v), x(2v + 1))` for `v < extra` and
/// `x(v + extra)` after, and every inner node is `fold(left, right)`, in rank order.
///
/// # Panics
///
/// If `inputs` is empty.
pub fn doubling_tree<T: Clone>(inputs: &[T], fold: impl Fn(&T, &T) -> T) -> T {
    let size = inputs.len();
    let pof2 = 1 << size.ilog2();
    let extra = size - pof2;
    let mut level: Vec<T> = (0..pof2)
        .map(|v| {
            if v < extra {
                fold(&inputs[2 * v], &inputs[2 * v + 1])
            } else {
                inputs[v + extra].clone()
            }
        })
        .collect();
    while level.len() > 1 {
        level = level.chunks(2).map(|p| fold(&p[0], &p[1])).collect();
    }
    level.pop().expect("at least one rank")
}

/// A full mesh's device file (MLX's `MLX_IBV_DEVICES` matrix, as JSON) of `size` ranks:
/// rank `i` reaches rank `j` through `device(i, j)`.
pub fn mesh_matrix(size: usize, device: impl Fn(usize, usize) -> String) -> String {
    let cell = |i: usize, j: usize| {
        if i == j {
            "null".to_string()
        } else {
            format!("\"{}\"", device(i, j))
        }
    };
    let row = |i: usize| (0..size).map(|j| cell(i, j)).collect::<Vec<_>>().join(", ");
    let rows: Vec<String> = (0..size).map(|i| format!("[{}]", row(i))).collect();
    format!("[{}]", rows.join(", "))
}

/// The device file (MLX's `MLX_IBV_DEVICES` matrix, as JSON) and the test verbs provider's
/// device list of `size` ranks: a full mesh when `wires` is 0, where rank `i` reaches rank
/// `j` through device `m{i}to{j}`; otherwise a ring of `wires` cables between neighbours,
/// devices `r{i}to{j}c{k}`.
pub fn verbs_layout(size: usize, wires: usize) -> (String, Vec<String>) {
    let mut devices = Vec::new();
    let rows: Vec<String> = (0..size)
        .map(|i| {
            let cells: Vec<String> = (0..size)
                .map(|j| {
                    let neighbour = j == (i + 1) % size || i == (j + 1) % size;
                    if i == j || (wires > 0 && !neighbour) {
                        return "null".to_string();
                    }
                    if wires == 0 {
                        devices.push(format!("m{i}to{j}"));
                        return format!("\"m{i}to{j}\"");
                    }
                    let names: Vec<String> = (0..wires)
                        .map(|k| {
                            devices.push(format!("r{i}to{j}c{k}"));
                            format!("\"r{i}to{j}c{k}\"")
                        })
                        .collect();
                    format!("[{}]", names.join(", "))
                })
                .collect();
            format!("[{}]", cells.join(", "))
        })
        .collect();
    (format!("[{}]", rows.join(", ")), devices)
}

/// Runs `f` once to warm up, then `rounds` more times, and returns how many heap
/// allocations the calling thread made in those rounds, as `ffi`'s counting allocator
/// counts them (the test binary must install it as its global allocator).
pub fn steady_allocations(rounds: usize, mut f: impl FnMut()) -> u64 {
    f();
    let before = ffi::alloc::CountingAllocator::thread_allocations();
    for _ in 0..rounds {
        f();
    }
    ffi::alloc::CountingAllocator::thread_allocations() - before
}

/// CPU time of this process, from /proc (user + system, in clock ticks of 10 ms or less).
#[cfg(target_os = "linux")]
pub fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = &stat[stat.rfind(')').expect("a command name") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// The binary of example `name` of `package`, in the profile the tests run in. A `cargo
/// test` of the package builds its examples before any test starts; a run filtered to one
/// test target does not, and then this builds the one example (`cargo build -p package
/// --example name`).
pub fn example_binary(package: &str, name: &str) -> PathBuf {
    let path = profile_dir()
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    if !path.exists() {
        cargo_build(&["-p", package, "--example", name], name);
    }
    assert!(path.exists(), "{} was not built", path.display());
    path
}

/// Runs example `name` of `package` with `args` as every rank of a group of `size` on
/// loopback (for test `test`, two minutes at most); checks that every rank exited
/// successfully and returns what each printed.
pub fn run_example(
    (package, name): (&str, &str),
    args: &[&str],
    size: usize,
    test: &str,
) -> Vec<RankOutput> {
    let program = example_binary(package, name);
    let rank_args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let outputs = Launch::new(size, 1)
        .deadline(Duration::from_secs(120))
        .command(move |_| {
            let mut c = Command::new(&program);
            c.args(&rank_args);
            c
        })
        .spawn(test)
        .finish();
    for o in &outputs {
        assert_eq!(
            o.status.map(|s| s.success()),
            Some(true),
            "{name} {}: {o}",
            args.join(" ")
        );
    }
    outputs
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

/// In a rank started by [`Launch::start`]: whether `rank` has called [`mark`] with `what`.
pub fn marked(rank: usize, what: &str) -> bool {
    let dir = std::env::var(MARKERS_VAR).expect("started by Launch::start");
    Path::new(&dir).join(format!("{rank}-{what}")).exists()
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

/// What `f` returned, and how long it took.
pub fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let start = Instant::now();
    let out = f();
    (out, start.elapsed())
}

/// An all_sum of `len` f32 per rank, on a buffer the calling thread keeps (made once: a
/// rank loops on one size), for loops that run until a fault strikes.
pub fn sum_of(g: &Group, len: usize) -> nuvec_distributed_engine::Result<()> {
    thread_local!(static DATA: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) });
    DATA.with(|d| {
        let mut d = d.borrow_mut();
        d.resize(len, 1.0);
        g.all_sum(&mut d)
    })
}

/// The launch of a recovery test: `size` ranks of `connections` addresses each on `wire`
/// (`NUVEC_DISTRIBUTED_WIRE`), whose groups wait 3 s for a silent peer (survivors for each
/// other, and for a restarted rank), two minutes for the whole test.
pub fn recovery_launch(size: usize, connections: usize, wire: &str) -> Launch {
    Launch::new(size, connections)
        .timeout(3.0)
        .deadline(Duration::from_secs(120))
        .env("NUVEC_DISTRIBUTED_WIRE", wire)
}

/// Set (to "1") in the rank that [`kill_and_rejoin`] started again.
const RESTARTED_VAR: &str = "NUVEC_TEST_RESTARTED";

/// A test that kills a rank and has the group take it back. In a rank: runs `body`, which
/// is told whether this is the killed rank started again, and returns `None`. In the
/// parent: starts test `name`'s ranks as `launch` says ([`Launch::start_raw`]); once every
/// rank loops, kills `victim` ([`Ranks::strike`]); once every other rank has marked
/// `recovered` (a minute at most, see [`Ranks::wait_others`]), starts the victim again;
/// then asserts that every rank finished, having printed `REJOINED` once, and returns their
/// outputs.
pub fn kill_and_rejoin(
    launch: &Launch,
    name: &str,
    victim: usize,
    recovered: &str,
    body: impl FnOnce(bool),
) -> Option<Vec<RankOutput>> {
    let mut running = launch.start_raw(name, || body(std::env::var_os(RESTARTED_VAR).is_some()))?;
    running.strike(victim, "KILL", random_settle());
    let mut running = running.wait_others(victim, recovered, Duration::from_secs(60));
    running.restart(victim, &[(RESTARTED_VAR, "1")]);
    let outputs = running.finish();
    for o in &outputs {
        assert!(o.finished(), "rank {} did not finish:\n{o}", o.rank);
        assert_eq!(o.lines("REJOINED").len(), 1, "rank {}:\n{o}", o.rank);
    }
    Some(outputs)
}

/// A pause of 100 to 500 ms that differs from run to run: where in a loop of collectives
/// a fault strikes (see [`Ranks::strike`]).
pub fn random_settle() -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    Duration::from_millis(100 + u64::from(nanos % 400))
}

/// In a rank started by [`Launch::start`]: marks "looping", then calls `collective` until
/// it fails; reports the failure with the time since the last success
/// ([`report_failure`]), marks "failed" and returns the error.
pub fn until_failure(
    mut collective: impl FnMut() -> nuvec_distributed_engine::Result<()>,
) -> nuvec_distributed_engine::Error {
    mark("looping");
    let mut last_success = Instant::now();
    let error = loop {
        match collective() {
            Ok(()) => last_success = Instant::now(),
            Err(e) => break e,
        }
    };
    report_failure(&error, last_success.elapsed());
    mark("failed");
    error
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

    /// Panics, with the rank's output, unless it finished (see [`RankOutput::finished`]).
    pub fn assert_finished(&self) {
        assert!(
            self.finished(),
            "rank {} did not finish:\n{self}",
            self.rank
        );
    }

    /// The failure (see [`RankOutput::failure`]) of a rank that must have finished after
    /// it: panics, with the rank's output, unless it did.
    pub fn finished_failure(&self) -> (u64, Option<usize>, String) {
        self.assert_finished();
        self.failure()
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

impl Finished {
    /// Panics, with what it printed, unless it exited successfully; `what` names it.
    pub fn assert_success(&self, what: &str) {
        assert!(
            self.status.success(),
            "{what}: {}\nstdout:\n{}\nstderr:\n{}",
            self.status,
            self.stdout,
            self.stderr
        );
    }

    /// Panics, with its stderr, unless it exited with `code` and said `says` on stderr.
    pub fn assert_failed(&self, code: i32, says: &str) {
        assert_eq!(self.status.code(), Some(code), "{}", self.stderr);
        assert!(
            self.stderr.contains(says),
            "no {says:?} in stderr:\n{}",
            self.stderr
        );
    }
}

/// Runs `program` with `args` under `nuvec launch -n size` on free ports, on `wire`
/// (`--wire`; None leaves the ranks' default, MLX's, with `NUVEC_DISTRIBUTED_WIRE`
/// removed from their environment); returns what the launch printed, once it exited (two
/// minutes at most).
pub fn launch_under_nuvec(
    size: usize,
    wire: Option<&str>,
    program: &Path,
    args: &[String],
) -> Finished {
    let port = free_port_block(size).expect("free ports").to_string();
    let mut launch = Command::new(nuvec_binary());
    launch.args(["launch", "-n", &size.to_string(), "-p", &port]);
    if let Some(wire) = wire {
        launch.args(["--wire", wire]);
    }
    launch
        .arg("--")
        .arg(program)
        .args(args)
        .env_remove("NUVEC_DISTRIBUTED_WIRE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    finish(
        launch.spawn().expect("starting nuvec launch"),
        Duration::from_secs(120),
    )
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

// ---- Interop with MLX's Python ranks ----------------------------------------------------

/// The variable naming the plan (a [`Plan`], as JSON) every rank of an interop ring runs.
pub const INTEROP_PLAN_VAR: &str = "NUVEC_INTEROP_PLAN";

/// The variable naming the directory where an interop rank writes its outputs.
pub const INTEROP_OUT_VAR: &str = "NUVEC_INTEROP_OUT";

/// What runs one rank of an interop ring: MLX's Python (the test's script under
/// [`mlx_python`]) or this test binary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RankKind {
    /// MLX, in Python.
    Mlx,
    /// This crate, in the test binary.
    Rust,
}

impl RankKind {
    /// The two alternating rings of `size` ranks: Rust ranks at the even positions, then at
    /// the odd ones.
    pub fn alternating(size: usize) -> [Vec<RankKind>; 2] {
        [RankKind::Rust, RankKind::Mlx].map(|even| {
            (0..size)
                .map(|r| if r % 2 == 0 { even } else { even.other() })
                .collect()
        })
    }

    fn other(self) -> Self {
        match self {
            RankKind::Mlx => RankKind::Rust,
            RankKind::Rust => RankKind::Mlx,
        }
    }
}

/// What every rank of an interop ring runs: the operations in order, with their inputs in
/// `dir` (`in-RANK-OP.bin`).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Plan<Op> {
    /// Where the inputs are.
    pub dir: PathBuf,
    /// The operations, in order.
    pub ops: Vec<Op>,
}

impl<Op: serde::Serialize + Clone> Plan<Op> {
    /// Writes the plan of `ops` on the inputs in `dir` to `dir/plan.json`; returns its path.
    pub fn write(dir: &Path, ops: &[Op]) -> PathBuf {
        let path = dir.join("plan.json");
        let plan = Plan {
            dir: dir.to_path_buf(),
            ops: ops.to_vec(),
        };
        std::fs::write(&path, serde_json::to_vec(&plan).expect("JSON")).expect("writing the plan");
        path
    }
}

impl<Op: serde::de::DeserializeOwned> Plan<Op> {
    /// Reads the plan at `path`.
    pub fn read(path: &Path) -> Self {
        serde_json::from_slice(&std::fs::read(path).expect("the plan")).expect("plan JSON")
    }
}

/// Like [`as_rank`], for a Rust rank of an interop ring: `body` gets the plan's path and
/// the output directory from the environment.
pub fn as_interop_rank(name: &str, body: impl FnOnce(&Path, &Path)) -> bool {
    as_rank(name, || {
        let plan = std::env::var_os(INTEROP_PLAN_VAR).expect(INTEROP_PLAN_VAR);
        let out = std::env::var_os(INTEROP_OUT_VAR).expect(INTEROP_OUT_VAR);
        body(Path::new(&plan), Path::new(&out));
    })
}

/// A work directory for an interop test's inputs, plan and outputs, named `prefix...`;
/// removed when dropped, unless `NUVEC_INTEROP_KEEP` is set, which keeps it for inspection
/// (and prints where it is).
pub fn interop_work_dir(prefix: &str) -> tempfile::TempDir {
    let keep = std::env::var_os("NUVEC_INTEROP_KEEP").is_some();
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .disable_cleanup(keep)
        .tempdir()
        .expect("a temporary directory");
    if keep {
        eprintln!("keeping {}", dir.path().display());
    }
    dir
}

/// Starts the ring `launch` describes with a rank of each of `kinds`: an MLX rank runs
/// `script` under [`mlx_python`], a Rust rank this test, `test`. Returns what every rank
/// printed, once each finished (panics, with their output, otherwise).
pub fn run_kinds(test: &str, kinds: &[RankKind], script: &Path, launch: Launch) -> Vec<RankOutput> {
    let python = mlx_python();
    let (test_name, rank_kinds, script) = (test.to_string(), kinds.to_vec(), script.to_path_buf());
    let outputs = launch
        .command(move |rank| match rank_kinds[rank] {
            RankKind::Mlx => {
                let mut c = Command::new(&python);
                c.arg(&script);
                c
            }
            RankKind::Rust => this_test(&test_name),
        })
        .spawn(test)
        .finish();
    if !outputs.iter().all(RankOutput::finished) {
        eprintln!("ring {kinds:?} did not finish");
    }
    assert_all_finished(&outputs);
    outputs
}

/// Runs one ring of `kinds` (with `connections` per neighbour) over the plan at
/// `plan_path`, each rank writing its outputs to `work/label`; returns that directory.
pub fn run_interop_ring(
    test: &str,
    kinds: &[RankKind],
    connections: usize,
    script: &Path,
    plan_path: &Path,
    work: &Path,
    label: &str,
) -> PathBuf {
    let out_dir = work.join(label);
    std::fs::create_dir_all(&out_dir).expect("the ring's output directory");
    let launch = Launch::new(kinds.len(), connections)
        .timeout(60.0)
        .deadline(Duration::from_secs(300))
        .env(INTEROP_PLAN_VAR, &plan_path.to_string_lossy())
        .env(INTEROP_OUT_VAR, &out_dir.to_string_lossy());
    run_kinds(test, kinds, script, launch);
    out_dir
}

// ---- Tracers (the probes' tests) -------------------------------------------------------

/// Runs `command` to its end and returns its stdout; panics, with its stderr, when it
/// cannot start (`what` says what it needs) or fails.
pub fn stdout_of(command: &mut Command, what: &str) -> String {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("running {what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether bpftrace can attach here, or why not: root, the tool, and tracefs (mounted at
/// /sys/kernel/tracing when it is not there and can be).
pub fn bpftrace_can_attach() -> Result<(), String> {
    let uid = Command::new("id")
        .arg("-u")
        .output()
        .map_err(|e| e.to_string())?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Err("not root".into());
    }
    if Command::new("bpftrace").arg("--version").output().is_err() {
        return Err("bpftrace is not installed (tools/test.sh installs it)".into());
    }
    if !Path::new("/sys/kernel/tracing/events").exists() {
        let mounted = Command::new("mount")
            .args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"])
            .status();
        if !mounted.is_ok_and(|s| s.success()) {
            return Err("tracefs is not mounted and cannot be".into());
        }
    }
    Ok(())
}

/// bpftrace running a script, attached to one process by its id (attached by binary
/// path, bpftrace 0.17 did not enable the probes' semaphores in processes started after
/// it, for test binaries).
#[derive(Debug)]
pub struct Bpftrace {
    child: Child,
    stdout: std::io::BufReader<std::process::ChildStdout>,
    /// Drains its stderr on the side: bpftrace warns there about each probe site it skips,
    /// many in a test binary, and a full pipe would stall it before it attaches.
    stderr: std::thread::JoinHandle<String>,
}

impl Bpftrace {
    /// Starts bpftrace with `script` on process `pid`; returns once it says its probes are
    /// in place ("Attaching N probes..."), and 200 ms more for them to take effect.
    pub fn attach(pid: u32, script: &str) -> Self {
        let mut child = Command::new("bpftrace")
            .args(["-p", &pid.to_string(), "-e", script])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting bpftrace");
        let mut stderr = child.stderr.take().expect("bpftrace's stderr");
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            text
        });
        let mut stdout = std::io::BufReader::new(child.stdout.take().expect("bpftrace's stdout"));
        let mut line = String::new();
        while std::io::BufRead::read_line(&mut stdout, &mut line).unwrap_or(0) > 0
            && !line.contains("Attaching")
        {
            line.clear();
        }
        std::thread::sleep(Duration::from_millis(200));
        Self {
            child,
            stdout,
            stderr,
        }
    }

    /// Stops it with SIGINT, on which bpftrace prints its maps and exits; returns how it
    /// exited and what it printed (its stdout, then its stderr).
    pub fn stop(mut self) -> (ExitStatus, String) {
        let killed = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status()
            .expect("running kill");
        assert!(killed.success(), "kill -INT bpftrace: {killed}");
        let mut text = String::new();
        self.stdout
            .read_to_string(&mut text)
            .expect("bpftrace's output");
        let status = self.child.wait().expect("waiting for bpftrace");
        let warnings = self.stderr.join().unwrap_or_default();
        (status, format!("{text}\nbpftrace's stderr:\n{warnings}"))
    }
}

/// The number a tracer printed on its line that starts with `label` (bpftrace prints a
/// count map `@name` as "@name: N"), or 0 when there is no such line.
pub fn traced_count(text: &str, label: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(label))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

// ---- Rings of processes ----------------------------------------------------------------

/// Makes the command one rank runs, before the harness adds the ring's environment.
type RankCommand = Arc<dyn Fn(usize) -> Command + Send + Sync>;

/// How to launch a ring of processes.
#[derive(Clone, derive_more::Debug)]
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
    #[debug("{:?}", command.as_ref().map(|_| "custom"))]
    command: Option<RankCommand>,
    nodes: Option<Vec<Vec<String>>>,
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
        let (command, name, timeout) = (self.command.clone(), name.to_string(), self.timeout_secs);
        let (env, marks) = (self.env.clone(), markers.clone());
        let start: Arc<StartRank> = Arc::new(move |rank, extra| {
            let mut command = match &command {
                Some(make) => make(rank),
                None => this_test(&name),
            };
            command
                .env("MLX_HOSTFILE", &hostfile)
                .env("MLX_RANK", rank.to_string())
                .env("NUVEC_DISTRIBUTED_TIMEOUT", timeout.to_string())
                .env(MARKERS_VAR, &marks)
                .envs(env.iter().map(|(k, v)| (k, v)))
                .envs(extra.iter().map(|(k, v)| (k, v)))
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("starting rank {rank} ({command:?}): {e}"))
        });
        let children = (0..self.size)
            .filter(|r| !self.skip.contains(r))
            .map(|rank| (rank, start(rank, &[])))
            .collect();
        Ranks {
            children,
            markers,
            ports,
            deadline: self.deadline,
            start,
            _dir: dir,
        }
    }
}

/// In a rank: the group every rank of a [`Launch::run`] or [`Launch::start`] body gets.
fn form_group() -> Group {
    nuvec_distributed_engine::init(true).expect("the ring forms")
}

/// Starts rank `.0` of a launch, with the extra environment `.1`.
type StartRank = dyn Fn(usize, &[(String, String)]) -> Child + Send + Sync;

/// Ranks started by [`Launch::start`] or [`Launch::spawn`], still running.
pub struct Ranks {
    children: Vec<(usize, Child)>,
    markers: PathBuf,
    /// Each rank's listening ports, as in the hostfile (empty with [`Launch::nodes`]).
    pub ports: Vec<Vec<u16>>,
    deadline: Duration,
    start: Arc<StartRank>,
    _dir: tempfile::TempDir,
}

impl Ranks {
    /// Starts `rank` again, as a fresh process with the launch's environment and `extra`,
    /// once its previous process has exited (killed, say); waits up to a minute for that
    /// one and drops its output.
    pub fn restart(&mut self, rank: usize, extra: &[(&str, &str)]) {
        let extra: Vec<(String, String)> = extra
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let (_, child) = self
            .children
            .iter_mut()
            .find(|(r, _)| *r == rank)
            .expect("a started rank");
        let until = Instant::now() + Duration::from_secs(60);
        while matches!(child.try_wait(), Ok(None)) {
            assert!(
                Instant::now() < until,
                "rank {rank} did not exit to be restarted"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        *child = (self.start)(rank, &extra);
    }

    /// Whether `rank` has called [`mark`] with `what`.
    pub fn has_marked(&self, rank: usize, what: &str) -> bool {
        self.markers.join(format!("{rank}-{what}")).exists()
    }

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

    /// Waits until every started rank but `except` has marked `what`; if one has not
    /// within `within`, waits for every rank (see [`Ranks::finish`]) and fails with their
    /// outputs.
    pub fn wait_others(self, except: usize, what: &str, within: Duration) -> Ranks {
        let until = Instant::now() + within;
        let others: Vec<usize> = self.children.iter().map(|(r, _)| *r).collect();
        while !others
            .iter()
            .all(|&r| r == except || self.has_marked(r, what))
        {
            if Instant::now() > until {
                let outputs: Vec<String> = self.finish().iter().map(|o| o.to_string()).collect();
                panic!(
                    "not every rank but {except} reached {what:?} within {within:?}:\n{}",
                    outputs.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self
    }

    /// Waits until every started rank has marked `what` (a minute at most each), then
    /// `settle` more.
    pub fn wait_all(&self, what: &str, settle: Duration) {
        for (rank, _) in &self.children {
            self.wait_for(*rank, what, Duration::from_secs(60));
        }
        std::thread::sleep(settle);
    }

    /// Sends `signal` ("KILL", "STOP", ...) to `victim` once every rank loops (see
    /// [`until_failure`]): after every rank's "looping" mark and `settle` more. A stopped
    /// victim never exits, so for "STOP" this waits until every other rank marked
    /// "failed" (half a minute at most) and lets the victim go on (SIGCONT).
    pub fn strike(&mut self, victim: usize, signal: &str, settle: Duration) {
        self.wait_all("looping", settle);
        self.signal(victim, signal);
        if signal == "STOP" {
            let others: Vec<usize> = self.children.iter().map(|(r, _)| *r).collect();
            for r in others.into_iter().filter(|&r| r != victim) {
                self.wait_for(r, "failed", Duration::from_secs(30));
            }
            self.signal(victim, "CONT");
        }
    }

    /// Waits for every rank (killing those still running at the deadline) and returns
    /// their outputs.
    pub fn finish(self) -> Vec<RankOutput> {
        collect(self.children, self.deadline)
    }
}
