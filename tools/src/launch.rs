//! What `nuvec launch` starts, decided the way `mlx.launch` decides it, as pure functions:
//! the hosts (from `--hosts`/`-n` or either of MLX's hostfile formats), the ports of the ring
//! hostfile, the JACCL device file and coordinator, each rank's environment, and the shell
//! script a remote rank runs under ssh. [`crate::runner`] starts the processes.
//!
//! The facts follow MLX 0.32's `python/mlx/_distributed_utils/{launch,common}.py`:
//!
//! - a host whose ssh name is exactly `127.0.0.1` runs locally, any other through
//!   `ssh -tt`;
//! - ring ports come from one counter that starts at `--starting-port` and walks the hosts
//!   in rank order, each host's ips in order, `--connections-per-ip` entries per ip;
//! - the ring hostfile is Python's `json.dumps` of those lists (`", "` between items,
//!   non-ASCII escaped), or an empty string when there is a single host; the file holds it
//!   followed by a newline (MLX writes it with `echo`);
//! - JACCL gets `MLX_IBV_DEVICES` (a file with `json.dumps` of every host's `rdma` row),
//!   `MLX_JACCL_COORDINATOR=<ips[0] of rank 0>:<starting port>` and, for `jaccl-ring`,
//!   `MLX_JACCL_RING=1`;
//! - the environment is the hostfile's `envs`, then `--env`, then `COLUMNS`/`LINES` from the
//!   terminal (unless `COLUMNS=` was given), then the backend's variables; entries whose name
//!   is not letters, digits and `_` are skipped with a warning; `MLX_RANK` comes last.

use std::io;
use std::net::{IpAddr, TcpListener};
use std::str::FromStr;
use std::sync::Mutex;

use nuvec_distributed_engine::Backend as Wire;
use nuvec_distributed_engine::config::devices::{self, DeviceCell};
use nuvec_distributed_engine::config::env::{
    COORDINATOR_VAR, DEVICES_VAR, HOSTFILE_VAR, JACCL_RING_VAR, RANK_VAR, RING_VERBOSE_VAR,
    WIRE_VAR,
};
use nuvec_distributed_engine::config::hostfile;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `mlx.launch`'s default first port.
pub const DEFAULT_STARTING_PORT: u16 = 32323;

/// The ssh name that means "run on this machine", exactly as `mlx.launch` tests it.
pub const LOCAL_HOST: &str = "127.0.0.1";

/// Why a launch cannot be planned: the message says what to change.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct PlanError(pub String);

fn fail<T>(message: impl Into<String>) -> Result<T, PlanError> {
    Err(PlanError(message.into()))
}

/// The distributed backends `nuvec launch` prepares.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    clap::ValueEnum,
    Serialize,
    strum::Display,
    strum::IntoStaticStr,
)]
#[strum(serialize_all = "kebab-case")]
pub enum Backend {
    /// MLX's TCP ring: a hostfile of `ip:port` lists.
    Ring,
    /// JACCL over RDMA, fully connected: a device file and a coordinator.
    Jaccl,
    /// JACCL preferring its ring topology (`MLX_JACCL_RING=1`).
    #[value(name = "jaccl-ring")]
    #[serde(rename = "jaccl-ring")]
    JacclRing,
}

impl Backend {
    /// Every backend `nuvec launch` starts.
    pub const ALL: [Backend; 3] = [Backend::Ring, Backend::Jaccl, Backend::JacclRing];

    /// The name as on the command line and in hostfiles.
    pub fn name(self) -> &'static str {
        self.into()
    }
}

impl FromStr for Backend {
    type Err = PlanError;

    fn from_str(s: &str) -> Result<Self, PlanError> {
        if let Some(backend) = Backend::ALL.into_iter().find(|b| b.name() == s) {
            return Ok(backend);
        }
        match s {
            "mpi" | "nccl" => fail(format!(
                "the {s} backend is started by mpirun or NCCL's own setup; nuvec launch \
                 starts ring, jaccl and jaccl-ring (use mlx.launch for {s})"
            )),
            other => fail(format!(
                "unknown backend {other:?}: expected ring, jaccl or jaccl-ring"
            )),
        }
    }
}

/// One cell of a host's `rdma` row: how it reaches another rank.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RdmaCell {
    /// One device, e.g. `"rdma_en5"`.
    Device(String),
    /// Several devices (several cables).
    Devices(Vec<String>),
}

impl RdmaCell {
    /// The cell as the device file writes it: in the form the hostfile gave it.
    fn written(cell: &Option<RdmaCell>) -> DeviceCell<'_> {
        match cell {
            None => DeviceCell::None,
            Some(RdmaCell::Device(name)) => DeviceCell::Device(name),
            Some(RdmaCell::Devices(names)) => DeviceCell::Devices(names),
        }
    }
}

/// One host of a hostfile, in rank order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Host {
    /// How to reach it with ssh; exactly `127.0.0.1` means this machine.
    pub ssh: String,
    /// Addresses the ring listens on (required by the ring backend).
    #[serde(default)]
    pub ips: Vec<String>,
    /// Per rank, the RDMA device(s) to reach it; `null` on the diagonal (JACCL only).
    #[serde(default)]
    pub rdma: Vec<Option<RdmaCell>>,
}

/// Whether `value` is a ring address file (`[["host:port", ...], ...]`: what `MLX_HOSTFILE`
/// names and the ranks read) rather than a launch hostfile (`[{"ssh": ..., "ips": [...]}]`
/// or `{"hosts": [...]}`: the hosts to start ranks on). Both are JSON lists, and serde
/// would read `["127.0.0.1:5000"]` as a host whose ssh name is `127.0.0.1:5000`.
///
/// ```
/// use nuvec_tools::launch::is_address_file;
///
/// let file = |text: &str| is_address_file(&serde_json::from_str(text).unwrap());
/// assert!(file(r#"[["127.0.0.1:5000"], ["127.0.0.1:5001"]]"#));
/// assert!(!file(r#"[{"ssh": "node-a", "ips": ["10.0.0.1"]}]"#));
/// ```
pub fn is_address_file(value: &Value) -> bool {
    matches!(value, Value::Array(ranks) if !ranks.is_empty() && ranks.iter().all(Value::is_array))
}

/// The hosts to launch on, with what a hostfile may add.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostList {
    /// One per rank, in rank order.
    pub hosts: Vec<Host>,
    /// The hostfile's `backend`, if it names one.
    pub backend: Option<String>,
    /// The hostfile's `envs` (`K=V` entries), applied before `--env`.
    pub envs: Vec<String>,
}

impl HostList {
    /// Parses either of `mlx.launch`'s hostfile formats: a list of
    /// `{"ssh", "ips", "rdma"}` hosts, or `{"backend", "envs", "hosts": [...]}`.
    ///
    /// # Errors
    ///
    /// Text that is not JSON in one of these shapes.
    pub fn parse_hostfile(text: &str) -> Result<Self, PlanError> {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| PlanError(format!("the hostfile is not valid JSON: {e}")))?;
        if is_address_file(&value) {
            return fail(
                "this is a ring address file (per rank a list of \"host:port\" addresses, \
                 the file MLX_HOSTFILE names and the ranks read), not a launch hostfile: a \
                 launch hostfile lists the hosts to start ranks on, [{\"ssh\": \"node-a\", \
                 \"ips\": [\"10.0.0.1\"]}, ...] (or give --hosts a,b); the launcher writes \
                 the address file for each run",
            );
        }
        let (hosts, backend, envs) = match value {
            Value::Array(hosts) => (hosts, None, Vec::new()),
            Value::Object(mut object) => {
                let backend = match object.remove("backend") {
                    None => None,
                    Some(Value::String(s)) if s.is_empty() => None,
                    Some(Value::String(s)) => Some(s),
                    Some(other) => return fail(format!("\"backend\" is {other}, not a string")),
                };
                let envs = match object.remove("envs") {
                    None => Vec::new(),
                    Some(v) => serde_json::from_value(v).map_err(|e| {
                        PlanError(format!("\"envs\" must be a list of \"K=V\" strings: {e}"))
                    })?,
                };
                let hosts = match object.remove("hosts") {
                    Some(Value::Array(hosts)) => hosts,
                    Some(other) => return fail(format!("\"hosts\" is {other}, not a list")),
                    None => return fail("the hostfile object has no \"hosts\" list"),
                };
                (hosts, backend, envs)
            }
            other => {
                return fail(format!(
                    "the hostfile is {other}: expected a list of hosts or an object with \
                     \"hosts\""
                ));
            }
        };
        let hosts = hosts
            .into_iter()
            .enumerate()
            .map(|(i, h)| {
                serde_json::from_value::<Host>(h).map_err(|e| {
                    PlanError(format!(
                        "host {i}: {e} (a host is {{\"ssh\": NAME, \"ips\": [...], \
                         \"rdma\": [...]}})"
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            hosts,
            backend,
            envs,
        })
    }

    /// The hosts of `--hosts a,b` (each repeated `repeats` times in a row, as
    /// `-n`/`--repeat-hosts`): an item that is an IP address is also the host's ip.
    ///
    /// # Errors
    ///
    /// An empty item.
    pub fn from_hosts(list: &str, repeats: usize) -> Result<Self, PlanError> {
        let mut hosts = Vec::new();
        for item in list.split(',') {
            if item.is_empty() {
                return fail(format!("--hosts {list:?}: a host name cannot be empty"));
            }
            let ips = if item.parse::<IpAddr>().is_ok() {
                vec![item.to_string()]
            } else {
                Vec::new()
            };
            for _ in 0..repeats {
                hosts.push(Host {
                    ssh: item.to_string(),
                    ips: ips.clone(),
                    rdma: Vec::new(),
                });
            }
        }
        Ok(Self {
            hosts,
            ..Self::default()
        })
    }
}

/// What was asked on the command line, apart from the hosts.
#[derive(Clone, Debug)]
pub struct LaunchSpec {
    /// `--backend`; `None` takes the hostfile's, else the ring.
    pub backend: Option<Backend>,
    /// `--env K=V` entries, in order ([`resolve_env_args`] has given bare names their
    /// values).
    pub env: Vec<String>,
    /// `--starting-port`.
    pub starting_port: u16,
    /// `--connections-per-ip` (at least 1).
    pub connections_per_ip: usize,
    /// `--cwd`: where the ranks run (default: the launcher's directory).
    pub cwd: Option<String>,
    /// `--verbose`: readable setup logs, and `MLX_RING_VERBOSE=1` for ring ranks.
    pub verbose: bool,
    /// `--python`: an interpreter put before the command.
    pub python: Option<String>,
    /// `--wire`: the ring's wire, passed to the ranks as `NUVEC_DISTRIBUTED_WIRE` (`None`
    /// sets nothing, so the ranks' default, MLX's wire, applies).
    pub wire: Option<Wire>,
    /// The program and its arguments.
    pub command: Vec<String>,
}

impl LaunchSpec {
    /// A spec with `mlx.launch`'s defaults for `command`.
    pub fn new(command: Vec<String>) -> Self {
        Self {
            backend: None,
            env: Vec::new(),
            starting_port: DEFAULT_STARTING_PORT,
            connections_per_ip: 1,
            cwd: None,
            verbose: false,
            python: None,
            wire: None,
            command,
        }
    }
}

/// Everything needed to start the ranks: the same for every rank except `MLX_RANK`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The backend prepared for.
    pub backend: Backend,
    /// Per rank, the ssh name of its host.
    pub hosts: Vec<String>,
    /// Environment for every rank, in the order it is applied (a later entry wins).
    pub env: Vec<(String, String)>,
    /// `--env`/`envs` entries skipped because their name is not a variable name.
    pub skipped_env: Vec<String>,
    /// Files every rank gets: (environment variable that holds the path, content). The file
    /// holds the content followed by a newline ([`Plan::file_text`]).
    pub files: Vec<(String, String)>,
    /// `--cwd`.
    pub cwd: Option<String>,
    /// The program and its arguments (with `--python` first, if given).
    pub command: Vec<String>,
}

/// The ring hostfile's address lists: per rank, for each of its host's ips in order,
/// `connections_per_ip` entries `ip:port`, ports counting up by one from `starting_port`
/// across all ranks.
///
/// # Errors
///
/// A host without ips (the ring needs addresses, not ssh names), or ports past 65535.
pub fn ring_addresses(
    hosts: &[Host],
    starting_port: u16,
    connections_per_ip: usize,
) -> Result<Vec<Vec<String>>, PlanError> {
    let mut port = u32::from(starting_port);
    let mut out = Vec::with_capacity(hosts.len());
    for (rank, host) in hosts.iter().enumerate() {
        if host.ips.is_empty() {
            return fail(format!(
                "rank {rank} ({}) has no ips: the ring backend needs IP addresses (give \
                 --hosts as IPs, or \"ips\" in the hostfile)",
                host.ssh
            ));
        }
        let mut node = Vec::new();
        for ip in &host.ips {
            for _ in 0..connections_per_ip {
                if port > u32::from(u16::MAX) {
                    return fail(format!(
                        "ports from --starting-port {starting_port} run past 65535"
                    ));
                }
                node.push(format!("{ip}:{port}"));
                port += 1;
            }
        }
        out.push(node);
    }
    Ok(out)
}

/// Parses a `K=V` environment entry as `mlx.launch` does: split at the first `=` (no `=`
/// means an empty value); the name must be ASCII letters, digits and `_`.
///
/// # Errors
///
/// An empty or invalid name.
pub fn parse_env_entry(entry: &str) -> Result<(String, String), PlanError> {
    let (key, value) = entry.split_once('=').unwrap_or((entry, ""));
    if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return fail(format!(
            "{entry:?} is not a valid environment variable, so it is ignored"
        ));
    }
    Ok((key.to_string(), value.to_string()))
}

/// Turns `--env` arguments into `K=V` entries: a `K=V` argument is kept as it is, and a bare
/// name `K` takes the launcher's value of `K` from `lookup`, as `docker run -e K` and ssh's
/// `SendEnv` do. That lets a secret such as `NUVEC_DISTRIBUTED_KEY` reach the ranks without
/// appearing on the command line, where other users can read it. (`mlx.launch` gives a bare
/// name an empty value, which for most variables is a silent mistake; the hostfile's
/// `envs` keep MLX's reading, since that file is shared with `mlx.launch`.)
///
/// # Errors
///
/// A bare name that is unset in the launcher's environment (or not valid Unicode).
pub fn resolve_env_args(
    args: &[String],
    lookup: &dyn Fn(&str) -> Option<std::ffi::OsString>,
) -> Result<Vec<String>, PlanError> {
    args.iter()
        .map(|arg| {
            if arg.contains('=') {
                return Ok(arg.clone());
            }
            match lookup(arg).map(|v| v.into_string()) {
                Some(Ok(value)) => Ok(format!("{arg}={value}")),
                Some(Err(_)) => fail(format!(
                    "--env {arg}: the launcher's value of {arg} is not valid Unicode"
                )),
                None => fail(format!(
                    "--env {arg}: {arg} is not set in the launcher's environment (give \
                     --env {arg}=VALUE, or set it here to pass it on)"
                )),
            }
        })
        .collect()
}

/// Plans a launch: the backend, every rank's environment and files.
///
/// `terminal` is the launcher's terminal size (columns, lines; 0 when unknown), which
/// `mlx.launch` passes on as `COLUMNS` and `LINES`.
///
/// # Errors
///
/// No hosts or no command, an unknown backend in the hostfile, or what the backend needs
/// missing from the hosts (ips for the ring; rdma rows and rank 0's ip for JACCL).
pub fn plan(spec: &LaunchSpec, hosts: &HostList, terminal: (u16, u16)) -> Result<Plan, PlanError> {
    if hosts.hosts.is_empty() {
        return fail("there are no hosts to launch on");
    }
    if spec.command.is_empty() {
        return fail("no command to launch was given");
    }
    if spec.connections_per_ip == 0 {
        return fail("--connections-per-ip must be at least 1");
    }
    let backend = match (spec.backend, &hosts.backend) {
        (Some(b), _) => b,
        (None, Some(name)) => name.parse()?,
        (None, None) => Backend::Ring,
    };
    let mut entries: Vec<String> = hosts.envs.iter().chain(&spec.env).cloned().collect();
    let (columns, lines) = terminal;
    if columns > 0 && !entries.iter().any(|e| e.starts_with("COLUMNS=")) {
        entries.push(format!("COLUMNS={columns}"));
        entries.push(format!("LINES={lines}"));
    }
    let files = match backend {
        Backend::Ring => {
            let addresses =
                ring_addresses(&hosts.hosts, spec.starting_port, spec.connections_per_ip)?;
            if spec.verbose {
                entries.push(format!("{RING_VERBOSE_VAR}=1"));
            }
            if let Some(wire) = spec.wire {
                entries.push(format!("{WIRE_VAR}={}", crate::wire_name(wire)));
            }
            // mlx.launch writes nothing into the hostfile for a single host.
            let text = if addresses.len() > 1 {
                hostfile::to_json(&addresses)
            } else {
                String::new()
            };
            vec![(HOSTFILE_VAR.to_string(), text)]
        }
        Backend::Jaccl | Backend::JacclRing => {
            if let Some(wire) = spec.wire {
                return fail(format!(
                    "--wire {} is the TCP ring's; the {backend} backend has one wire, MLX's",
                    crate::wire_name(wire)
                ));
            }
            let Some(coordinator) = hosts.hosts[0].ips.first() else {
                return fail(format!(
                    "rank 0 ({}) has no ips: JACCL's coordinator listens on rank 0's first ip",
                    hosts.hosts[0].ssh
                ));
            };
            let n = hosts.hosts.len();
            for (rank, host) in hosts.hosts.iter().enumerate() {
                if host.rdma.len() != n {
                    return fail(format!(
                        "rank {rank} ({}) has {} rdma entries; JACCL needs one per rank ({n})",
                        host.ssh,
                        host.rdma.len()
                    ));
                }
                if host.rdma[rank].is_some() {
                    return fail(format!(
                        "rank {rank} ({}): its own rdma entry (index {rank}) must be null",
                        host.ssh
                    ));
                }
            }
            entries.push(format!(
                "{COORDINATOR_VAR}={coordinator}:{}",
                spec.starting_port
            ));
            if backend == Backend::JacclRing {
                entries.push(format!("{JACCL_RING_VAR}=1"));
            }
            let rows: Vec<Vec<DeviceCell<'_>>> = hosts
                .hosts
                .iter()
                .map(|h| h.rdma.iter().map(RdmaCell::written).collect())
                .collect();
            vec![(DEVICES_VAR.to_string(), devices::to_json(&rows))]
        }
    };
    let mut env = Vec::new();
    let mut skipped_env = Vec::new();
    for entry in entries {
        match parse_env_entry(&entry) {
            Ok(pair) => env.push(pair),
            Err(_) => skipped_env.push(entry),
        }
    }
    Ok(Plan {
        backend,
        hosts: hosts.hosts.iter().map(|h| h.ssh.clone()).collect(),
        env,
        skipped_env,
        files,
        cwd: spec.cwd.clone(),
        command: spec.python.iter().chain(&spec.command).cloned().collect(),
    })
}

/// The plan `nuvec launch -n ranks --connections-per-ip connections -p starting_port
/// [--wire wire] -- command` makes: a ring of local ranks.
///
/// # Errors
///
/// As [`plan`]: ports past 65535 or an empty command.
pub fn local_ring(
    ranks: usize,
    connections: usize,
    starting_port: u16,
    wire: Option<Wire>,
    command: Vec<String>,
) -> Result<Plan, PlanError> {
    let hosts = HostList::from_hosts(LOCAL_HOST, ranks)?;
    let spec = LaunchSpec {
        backend: Some(Backend::Ring),
        starting_port,
        connections_per_ip: connections,
        wire,
        ..LaunchSpec::new(command)
    };
    plan(&spec, &hosts, (0, 0))
}

impl Plan {
    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.hosts.len()
    }

    /// Whether `rank` runs on this machine (its host is exactly `127.0.0.1`).
    pub fn is_local(&self, rank: usize) -> bool {
        self.hosts[rank] == LOCAL_HOST
    }

    /// What a generated file holds: the content and a newline, as `echo` writes it.
    pub fn file_text(content: &str) -> String {
        format!("{content}\n")
    }

    /// The shell script a remote rank runs (the last argument of [`ssh_command`]). It
    /// prints `nuvec-pidfile PATH` first (the file holds its PID, for [`remote_kill_script`]),
    /// moves to `--cwd` (failing if it is missing) or else to `launcher_cwd` if that exists
    /// there, exports the environment, writes each generated file to a temporary file and
    /// exports its path, exports `MLX_RANK`, and replaces itself with the command.
    pub fn remote_script(&self, rank: usize, launcher_cwd: &str) -> String {
        let mut s = String::new();
        // ssh -tt gives the rank a terminal so that its end is tied to the connection; what
        // the launcher forwards on stdin must not come back as echo.
        s.push_str("stty -echo 2>/dev/null; ");
        s.push_str(&format!(
            "pidfile=$(mktemp) && echo $$ > \"$pidfile\" && printf '{PIDFILE_MARKER}%s\\n' \
             \"$pidfile\"; "
        ));
        match &self.cwd {
            Some(dir) => s.push_str(&format!("cd -- {} || exit 2; ", shell_quote(dir))),
            None => s.push_str(&format!(
                "cd -- {} 2>/dev/null; ",
                shell_quote(launcher_cwd)
            )),
        }
        for (key, value) in &self.env {
            s.push_str(&format!("export {key}={}; ", shell_quote(value)));
        }
        for (var, content) in &self.files {
            s.push_str(&format!(
                "f=$(mktemp) && printf '%s\\n' {} > \"$f\" && export {var}=\"$f\" || exit 2; ",
                shell_quote(content)
            ));
        }
        s.push_str(&format!("export {RANK_VAR}={rank}; "));
        let command: Vec<String> = self.command.iter().map(|a| shell_quote(a)).collect();
        s.push_str(&format!("exec {}", command.join(" ")));
        s
    }
}

/// What a remote rank's script prints before the path of its PID file.
pub const PIDFILE_MARKER: &str = "nuvec-pidfile ";

/// The command that runs `script` on `host`: `ssh -tt -o LogLevel=ERROR -- HOST SCRIPT`.
/// `-tt` allocates a terminal on the remote side, so that the rank is hung up on when the
/// connection ends. `LogLevel=ERROR` keeps ssh's own failures (a refused connection, a
/// host key it cannot verify, a refused login) on the rank's stderr, where the launcher
/// shows them under the rank's prefix, and drops what ssh says at `INFO`, such as the
/// "Connection to HOST closed." that `-tt` adds after every session.
pub fn ssh_command(host: &str, script: &str) -> Vec<String> {
    ["ssh", "-tt", "-o", "LogLevel=ERROR", "--", host, script]
        .map(String::from)
        .to_vec()
}

/// The script that ends a remote rank from the PID file its launch script wrote.
pub fn remote_kill_script(pidfile: &str) -> String {
    let f = shell_quote(pidfile);
    format!("if [ -f {f} ]; then kill -TERM \"$(cat {f})\" 2>/dev/null; rm -f {f}; fi")
}

/// The command that runs [`remote_kill_script`] on `host`. It never prompts and gives up
/// on a host it cannot reach within 5 s, so ending a launch cannot hang on it.
pub fn remote_kill_command(host: &str, pidfile: &str) -> Vec<String> {
    ssh_batch_command(host, &remote_kill_script(pidfile), true)
}

/// The command that runs `script` on `host` without a terminal, never prompting and giving
/// up on a host it cannot reach within 5 s: `ssh -o LogLevel=QUIET|ERROR -o BatchMode=yes
/// -o ConnectTimeout=5 -- HOST SCRIPT`. `quiet` silences ssh's own messages; without it
/// they stay on stderr, for a caller that reports why ssh failed (`nuvec doctor`).
pub fn ssh_batch_command(host: &str, script: &str, quiet: bool) -> Vec<String> {
    let log_level = if quiet {
        "LogLevel=QUIET"
    } else {
        "LogLevel=ERROR"
    };
    [
        "ssh",
        "-o",
        log_level,
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=5",
        "--",
        host,
        script,
    ]
    .map(String::from)
    .to_vec()
}

/// Quotes `s` for a POSIX shell as Python's `shlex.quote` does: unchanged when it is only
/// `[A-Za-z0-9_@%+=:,./-]`, `''` when empty, else in single quotes with each `'` written
/// as `'"'"'`.
pub fn shell_quote(s: &str) -> String {
    if s.is_empty() {
        return "''".into();
    }
    let safe = |b: u8| b.is_ascii_alphanumeric() || b"_@%+=:,./-".contains(&b);
    if s.bytes().all(safe) {
        return s.into();
    }
    format!("'{}'", s.replace('\'', "'\"'\"'"))
}

/// Finds `count` consecutive free ports on 127.0.0.1, below Linux's ephemeral range so that
/// no outgoing connection is handed one of them before the ranks listen, and returns the
/// first. The ports are checked by binding them all at once and then released.
///
/// Within a process, successive calls hand out blocks that follow each other, so parallel
/// launches from one process (tests) never share ports; the first block starts at a point
/// spread by time and process. Across processes, every port handed out is also reserved
/// until this process exits by an exclusive lock on a file named after it in
/// `$TMPDIR/nuvec-distributed-ports/`, which other callers skip: test binaries, doctests
/// and launchers running at once never get the same port, even in the moment between this
/// check releasing a port and the ranks listening on it.
///
/// # Errors
///
/// No free block after many tries, or the lock directory cannot be created.
///
/// # Examples
///
/// ```
/// let first = nuvec_tools::launch::free_port_block(2)?;
/// let a = std::net::TcpListener::bind(("127.0.0.1", first))?;
/// let b = std::net::TcpListener::bind(("127.0.0.1", first + 1))?;
/// # drop((a, b));
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn free_port_block(count: usize) -> io::Result<u16> {
    // 20000..32000 is below the default ephemeral range (32768..60999).
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static CURSOR: Mutex<Option<u32>> = Mutex::new(None);
    let count = u32::try_from(count.max(1)).map_err(io::Error::other)?;
    if count > SPAN / 2 {
        return Err(io::Error::other(format!("{count} ports is too many")));
    }
    let mut cursor = CURSOR.lock().unwrap_or_else(|e| e.into_inner());
    let mut offset = cursor.unwrap_or_else(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        (nanos ^ std::process::id().wrapping_mul(2_654_435_761)) % SPAN
    });
    let dir = std::env::temp_dir().join("nuvec-distributed-ports");
    for _ in 0..200 {
        if offset + count > SPAN {
            offset = 0;
        }
        let first = LOW + offset;
        offset += count;
        let Some(locks) = reserve_ports(&dir, first..first + count)? else {
            continue;
        };
        let held: io::Result<Vec<TcpListener>> = (first..first + count)
            .map(|p| TcpListener::bind(("127.0.0.1", p as u16)))
            .collect();
        if held.is_ok() {
            *cursor = Some(offset);
            RESERVED
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend(locks);
            return Ok(first as u16);
        }
    }
    Err(io::Error::other(format!(
        "found no {count} consecutive free ports on 127.0.0.1"
    )))
}

/// The lock files of the ports [`free_port_block`] handed out, held until this process exits.
static RESERVED: Mutex<Vec<std::fs::File>> = Mutex::new(Vec::new());

/// Takes an exclusive lock on the file of every port in `ports` under `dir`: all of them
/// (the locks, released when dropped) or `None` when another process holds any.
fn reserve_ports(
    dir: &std::path::Path,
    ports: std::ops::Range<u32>,
) -> io::Result<Option<Vec<std::fs::File>>> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
    if !dir.is_dir() {
        let made = std::fs::DirBuilder::new().mode(0o1777).create(dir);
        match made {
            // The mode is masked by the umask; every user's launches share the directory.
            Ok(()) => std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777))
                .map_err(|e| annotate(e, dir))?,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(annotate(e, dir)),
        }
    }
    let mut locks = Vec::new();
    for port in ports {
        let path = dir.join(port.to_string());
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o666)
            .open(&path)
            .or_else(|e| match e.kind() {
                // Another user's file: a read-only descriptor takes the lock as well.
                io::ErrorKind::PermissionDenied => std::fs::File::open(&path),
                _ => Err(e),
            })
            .map_err(|e| annotate(e, &path))?;
        match file.try_lock() {
            Ok(()) => locks.push(file),
            Err(std::fs::TryLockError::WouldBlock) => return Ok(None),
            Err(std::fs::TryLockError::Error(e)) => return Err(annotate(e, &path)),
        }
    }
    Ok(Some(locks))
}

fn annotate(e: io::Error, path: &std::path::Path) -> io::Error {
    io::Error::new(
        e.kind(),
        format!("reserving free ports: {}: {e}", path.display()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_env_name_takes_the_launchers_value_or_fails() {
        let lookup = |name: &str| match name {
            "SET" => Some(std::ffi::OsString::from("from launcher")),
            "EMPTY" => Some(std::ffi::OsString::new()),
            _ => None,
        };
        let args: Vec<String> = ["A=1", "SET", "B=", "EMPTY", "C=x=y"]
            .map(String::from)
            .to_vec();
        assert_eq!(
            resolve_env_args(&args, &lookup).unwrap(),
            ["A=1", "SET=from launcher", "B=", "EMPTY=", "C=x=y"]
        );
        let e = resolve_env_args(&["UNSET".to_string()], &lookup).unwrap_err();
        assert!(
            e.to_string()
                .contains("--env UNSET: UNSET is not set in the launcher's environment"),
            "{e}"
        );
    }

    fn spec(command: &[&str]) -> LaunchSpec {
        LaunchSpec::new(command.iter().map(|s| s.to_string()).collect())
    }

    fn file<'a>(plan: &'a Plan, var: &str) -> &'a str {
        &plan.files.iter().find(|(v, _)| v == var).unwrap().1
    }

    fn env<'a>(plan: &'a Plan, key: &str) -> Option<&'a str> {
        // The last entry wins, as with `export` and `Command::env`.
        plan.env
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn wire_reaches_ring_ranks_and_is_refused_for_jaccl() {
        let hosts = HostList::from_hosts("127.0.0.1", 2).unwrap();
        let default = plan(&spec(&["prog"]), &hosts, (0, 0)).unwrap();
        assert_eq!(env(&default, "NUVEC_DISTRIBUTED_WIRE"), None);
        for wire in [Wire::Ring, Wire::Native] {
            let asked = LaunchSpec {
                wire: Some(wire),
                ..spec(&["prog"])
            };
            let p = plan(&asked, &hosts, (0, 0)).unwrap();
            assert_eq!(
                env(&p, "NUVEC_DISTRIBUTED_WIRE"),
                Some(crate::wire_name(wire))
            );
            let jaccl = LaunchSpec {
                backend: Some(Backend::Jaccl),
                ..asked
            };
            let e = plan(&jaccl, &hosts, (0, 0)).unwrap_err();
            assert!(
                e.to_string().contains("--wire") && e.to_string().contains("jaccl"),
                "{e}"
            );
        }
    }

    #[test]
    fn n4_on_localhost_is_mlx_launchs_hostfile() {
        let hosts = HostList::from_hosts("127.0.0.1", 4).unwrap();
        let p = plan(&spec(&["prog"]), &hosts, (0, 0)).unwrap();
        assert_eq!(p.backend, Backend::Ring);
        assert_eq!(p.hosts, vec!["127.0.0.1"; 4]);
        assert!((0..4).all(|r| p.is_local(r)));
        // Python's json.dumps separators, as mlx.launch writes the file.
        assert_eq!(
            file(&p, "MLX_HOSTFILE"),
            r#"[["127.0.0.1:32323"], ["127.0.0.1:32324"], ["127.0.0.1:32325"], ["127.0.0.1:32326"]]"#
        );
        assert_eq!(Plan::file_text("x"), "x\n");
        assert!(p.env.is_empty());
        assert_eq!(p.command, vec!["prog"]);
    }

    #[test]
    fn ports_walk_ranks_then_ips_then_connections() {
        // What mlx.launch 0.32 writes for `-n 3 --connections-per-ip 2 -p 40000`
        // (captured from a run).
        let hosts = HostList::from_hosts("127.0.0.1", 3).unwrap();
        let s = LaunchSpec {
            starting_port: 40000,
            connections_per_ip: 2,
            ..spec(&["prog"])
        };
        assert_eq!(
            file(&plan(&s, &hosts, (0, 0)).unwrap(), "MLX_HOSTFILE"),
            r#"[["127.0.0.1:40000", "127.0.0.1:40001"], ["127.0.0.1:40002", "127.0.0.1:40003"], ["127.0.0.1:40004", "127.0.0.1:40005"]]"#
        );
        // Several ips per host: each ip gets its connections before the next ip.
        let two_ips = [
            Host {
                ssh: "a".into(),
                ips: vec!["10.0.0.1".into(), "10.0.1.1".into()],
                rdma: vec![],
            },
            Host {
                ssh: "b".into(),
                ips: vec!["10.0.0.2".into(), "10.0.1.2".into()],
                rdma: vec![],
            },
        ];
        assert_eq!(
            ring_addresses(&two_ips, 5000, 2).unwrap(),
            vec![
                vec![
                    "10.0.0.1:5000",
                    "10.0.0.1:5001",
                    "10.0.1.1:5002",
                    "10.0.1.1:5003"
                ],
                vec![
                    "10.0.0.2:5004",
                    "10.0.0.2:5005",
                    "10.0.1.2:5006",
                    "10.0.1.2:5007"
                ],
            ]
        );
        assert!(
            ring_addresses(&two_ips, 65533, 2)
                .unwrap_err()
                .0
                .contains("65535")
        );
        assert_eq!(
            ring_addresses(&two_ips, 65528, 2).unwrap()[1][3],
            "10.0.1.2:65535"
        );
    }

    #[test]
    fn a_single_host_gets_an_empty_hostfile() {
        let p = plan(
            &spec(&["prog"]),
            &HostList::from_hosts("127.0.0.1", 1).unwrap(),
            (0, 0),
        )
        .unwrap();
        assert_eq!(file(&p, "MLX_HOSTFILE"), "");
    }

    #[test]
    fn hosts_list_repeats_each_host_in_a_row() {
        let h = HostList::from_hosts("10.0.0.1,node-b", 2).unwrap();
        let names: Vec<&str> = h.hosts.iter().map(|h| h.ssh.as_str()).collect();
        assert_eq!(names, ["10.0.0.1", "10.0.0.1", "node-b", "node-b"]);
        assert_eq!(h.hosts[0].ips, ["10.0.0.1"]);
        assert!(h.hosts[2].ips.is_empty(), "a name is not an ip");
        assert!(HostList::from_hosts("a,,b", 1).is_err());
        // The ring needs ips: a host given by name cannot be in it.
        let err = plan(&spec(&["p"]), &h, (0, 0)).unwrap_err();
        assert!(err.0.contains("rank 2 (node-b) has no ips"), "{err}");
        // Remote hosts are not local, even when they are this machine under another name.
        let p = plan(
            &spec(&["p"]),
            &HostList::from_hosts("127.0.0.1,127.0.0.2", 1).unwrap(),
            (0, 0),
        )
        .unwrap();
        assert!(p.is_local(0) && !p.is_local(1));
    }

    #[test]
    fn parses_both_hostfile_formats() {
        let list = r#"[{"ssh": "m1", "ips": ["10.0.0.1"]}, {"ssh": "m2", "ips": ["10.0.0.2"], "extra": 1}]"#;
        let h = HostList::parse_hostfile(list).unwrap();
        assert_eq!(h.hosts.len(), 2);
        assert_eq!(h.hosts[1].ips, ["10.0.0.2"]);
        assert_eq!((h.backend.as_deref(), h.envs.len()), (None, 0));

        let object = r#"{"backend": "jaccl", "envs": ["A=1", "B=2"], "hosts": [
            {"ssh": "m1", "ips": ["10.0.0.1"], "rdma": [null, "rdma_en2"]},
            {"ssh": "m2", "rdma": [["rdma_en2", "rdma_en3"], null]}]}"#;
        let h = HostList::parse_hostfile(object).unwrap();
        assert_eq!(h.backend.as_deref(), Some("jaccl"));
        assert_eq!(h.envs, ["A=1", "B=2"]);
        assert!(h.hosts[1].ips.is_empty());
        assert_eq!(
            h.hosts[1].rdma[0],
            Some(RdmaCell::Devices(vec![
                "rdma_en2".into(),
                "rdma_en3".into()
            ]))
        );
        // An object without backend or envs is fine; an empty backend means none.
        let h = HostList::parse_hostfile(r#"{"backend": "", "hosts": [{"ssh": "a"}]}"#).unwrap();
        assert_eq!((h.backend, h.hosts.len()), (None, 1));

        for (bad, why) in [
            ("[{\"ips\": []}]", "ssh"),
            ("{\"envs\": []}", "no \"hosts\""),
            ("42", "expected a list"),
            ("[{\"ssh\": \"a\", \"rdma\": [1]}]", "host 0"),
            ("{\"hosts\": [], \"envs\": [1]}", "envs"),
            ("not json", "not valid JSON"),
            // The file MLX_HOSTFILE names is not a list of hosts: never ssh to "host:port".
            (
                r#"[["127.0.0.1:5000"], ["127.0.0.1:5001"]]"#,
                "this is a ring address file",
            ),
        ] {
            let err = HostList::parse_hostfile(bad).unwrap_err();
            assert!(err.0.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn environment_order_and_validity() {
        let mut h = HostList::from_hosts("127.0.0.1", 2).unwrap();
        h.envs = vec!["FROM_FILE=1".into(), "SHARED=file".into()];
        let s = LaunchSpec {
            env: vec![
                "SHARED=cli".into(),
                "SPACED=a b".into(),
                "NOEQ".into(),
                "bad-name=1".into(),
                "=x".into(),
            ],
            verbose: true,
            ..spec(&["p"])
        };
        let p = plan(&s, &h, (120, 40)).unwrap();
        assert_eq!(
            env(&p, "SHARED"),
            Some("cli"),
            "--env comes after the hostfile's"
        );
        assert_eq!(env(&p, "FROM_FILE"), Some("1"));
        assert_eq!(env(&p, "SPACED"), Some("a b"));
        assert_eq!(env(&p, "NOEQ"), Some(""));
        assert_eq!(env(&p, "COLUMNS"), Some("120"));
        assert_eq!(env(&p, "LINES"), Some("40"));
        assert_eq!(env(&p, "MLX_RING_VERBOSE"), Some("1"));
        assert_eq!(p.skipped_env, ["bad-name=1", "=x"]);
        // A given COLUMNS keeps the terminal's out.
        let s = LaunchSpec {
            env: vec!["COLUMNS=7".into()],
            ..spec(&["p"])
        };
        let p = plan(&s, &h, (120, 40)).unwrap();
        assert_eq!((env(&p, "COLUMNS"), env(&p, "LINES")), (Some("7"), None));
        assert_eq!(env(&p, "MLX_RING_VERBOSE"), None);
    }

    #[test]
    fn jaccl_device_file_and_coordinator() {
        // The hostfile and what mlx.launch 0.32 put in MLX_IBV_DEVICES and the environment
        // for it (captured from a run with `-p 41000`).
        let text = r#"{"backend": "jaccl-ring", "envs": ["FROM_FILE=1"], "hosts": [
            {"ssh": "127.0.0.1", "ips": ["127.0.0.1"], "rdma": [null, "rdma_en5", ["rdma_en3","rdma_en4"]]},
            {"ssh": "127.0.0.1", "ips": [], "rdma": ["rdma_en5", null, "rdma_é"]},
            {"ssh": "127.0.0.1", "rdma": [["rdma_en3","rdma_en4"], "x", null]}]}"#;
        let h = HostList::parse_hostfile(text).unwrap();
        let s = LaunchSpec {
            starting_port: 41000,
            ..spec(&["p"])
        };
        let p = plan(&s, &h, (0, 0)).unwrap();
        assert_eq!(p.backend, Backend::JacclRing);
        assert_eq!(
            file(&p, "MLX_IBV_DEVICES"),
            r#"[[null, "rdma_en5", ["rdma_en3", "rdma_en4"]], ["rdma_en5", null, "rdma_\u00e9"], [["rdma_en3", "rdma_en4"], "x", null]]"#
        );
        assert_eq!(env(&p, "MLX_JACCL_COORDINATOR"), Some("127.0.0.1:41000"));
        assert_eq!(env(&p, "MLX_JACCL_RING"), Some("1"));
        assert_eq!(env(&p, "FROM_FILE"), Some("1"));
        assert!(p.files.iter().all(|(v, _)| v != "MLX_HOSTFILE"));

        // --backend overrides the hostfile's; plain jaccl does not prefer the ring.
        let s = LaunchSpec {
            backend: Some(Backend::Jaccl),
            ..s
        };
        let p = plan(&s, &h, (0, 0)).unwrap();
        assert_eq!(
            (p.backend, env(&p, "MLX_JACCL_RING")),
            (Backend::Jaccl, None)
        );

        // Malformed: a short row, a device on the diagonal, no ip for rank 0.
        let mut short = h.clone();
        short.hosts[1].rdma.pop();
        assert!(plan(&s, &short, (0, 0)).unwrap_err().0.contains("rank 1"));
        let mut diagonal = h.clone();
        diagonal.hosts[2].rdma[2] = Some(RdmaCell::Device("x".into()));
        assert!(
            plan(&s, &diagonal, (0, 0))
                .unwrap_err()
                .0
                .contains("must be null")
        );
        let mut no_ip = h;
        no_ip.hosts[0].ips.clear();
        assert!(plan(&s, &no_ip, (0, 0)).unwrap_err().0.contains("rank 0"));
    }

    #[test]
    fn backends_by_name() {
        assert_eq!("jaccl-ring".parse::<Backend>(), Ok(Backend::JacclRing));
        assert!(
            "mpi"
                .parse::<Backend>()
                .unwrap_err()
                .0
                .contains("mlx.launch")
        );
        let mut h = HostList::from_hosts("127.0.0.1", 2).unwrap();
        h.backend = Some("nccl".into());
        assert!(plan(&spec(&["p"]), &h, (0, 0)).is_err());
        assert!(
            plan(
                &spec(&[]),
                &HostList::from_hosts("127.0.0.1", 2).unwrap(),
                (0, 0)
            )
            .is_err()
        );
    }

    #[test]
    fn shell_quote_is_shlex_quote() {
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("abc-1.2/x_y@%+=:,"), "abc-1.2/x_y@%+=:,");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r#"'it'"'"'s'"#);
        assert_eq!(shell_quote("$HOME"), "'$HOME'");
        assert_eq!(shell_quote("é"), "'é'");
    }

    #[test]
    fn remote_script_and_ssh_command() {
        let h = HostList::from_hosts("10.0.0.1,10.0.0.2", 1).unwrap();
        let s = LaunchSpec {
            env: vec!["A=x y".into()],
            python: Some("/opt/py/bin/python".into()),
            ..spec(&["train.py", "--name", "it's"])
        };
        let p = plan(&s, &h, (0, 0)).unwrap();
        assert!(!p.is_local(0) && !p.is_local(1));
        let script = p.remote_script(1, "/home/me/run dir");
        assert_eq!(
            script,
            "stty -echo 2>/dev/null; \
             pidfile=$(mktemp) && echo $$ > \"$pidfile\" && printf 'nuvec-pidfile %s\\n' \"$pidfile\"; \
             cd -- '/home/me/run dir' 2>/dev/null; \
             export A='x y'; \
             f=$(mktemp) && printf '%s\\n' '[[\"10.0.0.1:32323\"], [\"10.0.0.2:32324\"]]' > \"$f\" \
             && export MLX_HOSTFILE=\"$f\" || exit 2; \
             export MLX_RANK=1; \
             exec /opt/py/bin/python train.py --name 'it'\"'\"'s'"
        );
        // A requested --cwd that is missing on the host ends the rank instead of running it
        // elsewhere.
        let with_cwd = Plan {
            cwd: Some("/data/run".into()),
            ..p.clone()
        };
        assert!(
            with_cwd
                .remote_script(0, "/x")
                .contains("cd -- /data/run || exit 2; ")
        );
        assert_eq!(
            ssh_command("10.0.0.2", &script),
            [
                "ssh",
                "-tt",
                "-o",
                "LogLevel=ERROR",
                "--",
                "10.0.0.2",
                script.as_str()
            ]
        );
        assert_eq!(
            remote_kill_command("node-b", "/tmp/tmp.X1"),
            [
                "ssh",
                "-o",
                "LogLevel=QUIET",
                "-o",
                "BatchMode=yes",
                "-o",
                "ConnectTimeout=5",
                "--",
                "node-b",
                "if [ -f /tmp/tmp.X1 ]; then kill -TERM \"$(cat /tmp/tmp.X1)\" 2>/dev/null; \
                 rm -f /tmp/tmp.X1; fi"
            ]
        );
    }

    #[test]
    fn the_remote_script_runs_in_a_shell() {
        // Run the generated script with a local shell (no ssh) and check what the command
        // sees: the exported variables, the written hostfile and the rank.
        let dir = tempfile::tempdir().unwrap();
        let s = LaunchSpec {
            env: vec!["GREETING=it's a b".into()],
            ..spec(&[
                "sh",
                "-c",
                "pwd; echo \"$GREETING|$MLX_RANK\"; cat \"$MLX_HOSTFILE\"; rm \"$MLX_HOSTFILE\"",
            ])
        };
        let p = plan(
            &s,
            &HostList::from_hosts("10.0.0.1,10.0.0.2", 1).unwrap(),
            (0, 0),
        )
        .unwrap();
        let script = p.remote_script(1, dir.path().to_str().unwrap());
        let out = std::process::Command::new("sh")
            .args(["-c", &script])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let pidfile = lines[0].strip_prefix(PIDFILE_MARKER).unwrap();
        assert!(std::path::Path::new(pidfile).is_file());
        std::fs::remove_file(pidfile).unwrap();
        assert_eq!(
            std::fs::canonicalize(lines[1]).unwrap(),
            std::fs::canonicalize(dir.path()).unwrap()
        );
        assert_eq!(lines[2], "it's a b|1");
        assert_eq!(lines[3], r#"[["10.0.0.1:32323"], ["10.0.0.2:32324"]]"#);
        assert_eq!(lines.len(), 4);
    }

    #[test]
    fn free_port_blocks_are_free_and_distinct() {
        let first = free_port_block(4).unwrap();
        let held: Vec<TcpListener> = (first..first + 4)
            .map(|p| TcpListener::bind(("127.0.0.1", p)).unwrap())
            .collect();
        assert_eq!(held.len(), 4);
        assert!((20_000..32_000).contains(&first));
        // While those are held, the next block is elsewhere; and blocks never overlap.
        let second = free_port_block(4).unwrap();
        assert!(
            second >= first + 4 || second + 4 <= first,
            "{first} {second}"
        );
        let third = free_port_block(3).unwrap();
        assert!(
            third >= second + 4 || third + 3 <= second,
            "{second} {third}"
        );
    }

    /// A port this process was handed is skipped by another process while this one lives,
    /// though nothing listens on it.
    #[test]
    fn another_process_skips_the_ports_this_one_reserved() {
        let first = free_port_block(2).unwrap() as u32;
        let dir = std::env::temp_dir().join("nuvec-distributed-ports");
        let out = std::process::Command::new("flock")
            .args(["--nonblock", "--exclusive"])
            .arg(dir.join(first.to_string()))
            .arg("true")
            .status()
            .expect("flock(1) from util-linux");
        assert!(
            !out.success(),
            "port {first}'s lock was free to another process"
        );
        // A free neighbouring port is not reserved by this process.
        let free =
            (first + 2..first + 200).find(|p| reserve_ports(&dir, *p..*p + 1).unwrap().is_some());
        assert!(free.is_some(), "no unreserved port after {first}");
    }
}
