//! `nuvec doctor`: checks a set of hosts before a launch and says, per host and per ring
//! link, what is wrong and how to fix it.
//!
//! The hosts come from the launch hostfile `nuvec launch` and `mlx.launch` take (either
//! format, JACCL's `rdma` rows included) or from `--hosts`, and ring ports are numbered as
//! the launcher numbers them (`--starting-port`, one per address in rank order). Or they
//! come from a ring address file (what `MLX_HOSTFILE` names: per rank its `"host:port"`
//! addresses), with the ports it gives ([`from_address_file`]).
//!
//! The doctor runs one shell script per host over ssh ([`PROBE_SCRIPT`]: `uname`, the
//! interfaces, the default route and, on macOS, the hardware ports and Thunderbolt bus;
//! `ibv_devinfo` where it exists), parses its output with the pure functions of [`parse`]
//! into [`HostFacts`], and compares: each listed address must be on one of the host's
//! interfaces. Then, per address, it starts `nuvec doctor --serve` on its host (which binds
//! the ring's port: in use is a failure) and `nuvec doctor --probe` on the left neighbour,
//! which connects and times a few ping-pongs ([`link`]). A host whose ssh name is exactly
//! `127.0.0.1` runs the script here, as `nuvec launch` runs such ranks.

pub mod link;
pub mod parse;

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::thread::ScopedJoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;

use crate::launch::{self, Host, HostList, LOCAL_HOST};
use link::{BindFailure, ProbeLine, ServeLine};
use parse::{HardwarePort, Interface, RdmaDevice};

/// How a check came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Nothing to do.
    Ok,
    /// Works, but likely not as intended.
    Warn,
    /// Will not work: `nuvec doctor` exits non-zero.
    Fail,
    /// Not checked here; the detail says why.
    Skipped,
}

impl Verdict {
    fn label(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Warn => "WARN",
            Verdict::Fail => "FAIL",
            Verdict::Skipped => "skipped",
        }
    }
}

/// One row of the doctor's table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// The host (`rank 0 (name)`) or link (`0 -> 1`) checked.
    pub subject: String,
    /// What was checked: ssh, address, port, mtu, link, thunderbolt, bridge, rdma.
    pub check: &'static str,
    /// How it came out.
    pub verdict: Verdict,
    /// What was found.
    pub detail: String,
    /// For a warning or failure: one line saying what to do.
    pub fix: Option<String>,
}

/// Which interfaces' addresses the ring should use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Over {
    /// The addresses given; for a host without any, its default route's interface.
    Ethernet,
    /// macOS: the IPv4 addresses of the host's Thunderbolt ports.
    Thunderbolt,
}

/// `nuvec doctor`'s arguments.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Checks, per host: ssh (BatchMode, 5 s timeout) and its OS; that \
    each listed address is on one of its interfaces, with the interface's MTU; that the \
    ring's port is free (a short-lived `nuvec doctor --serve` binds it); on macOS the \
    Thunderbolt ports, their addresses and link speed (TB4/TB5) and whether they sit in \
    bridge0; the RDMA devices, their port states and the port JACCL uses, the first \
    active one (ibv_devinfo). Per ring link (each host to \
    the next): a TCP connection and a few ping-pongs (round trip), and matching MTUs. \
    Remote hosts need nuvec in their PATH (or --remote-nuvec). Exits non-zero when a \
    check failed."
)]
pub struct DoctorArgs {
    /// A launch hostfile, as `nuvec launch` and `mlx.launch` take (ring or JACCL:
    /// `[{"ssh": ..., "ips": [...]}]`), or a ring address file, as MLX_HOSTFILE names
    /// (`[["host:port", ...], ...]`: each rank's host is its first address's, its ports
    /// the file's, and -p does not apply).
    #[arg(long, conflicts_with = "hosts")]
    pub hostfile: Option<PathBuf>,
    /// Comma-separated ssh names or addresses; an IP address is also the ring's address.
    #[arg(long)]
    pub hosts: Option<String>,
    /// The ring's first port, counting up by one per address (as `nuvec launch -p`).
    #[arg(short = 'p', long, default_value_t = launch::DEFAULT_STARTING_PORT)]
    pub starting_port: u16,
    /// Which interfaces' addresses to check and write: ethernet (the given ones, else the
    /// default route's) or thunderbolt (macOS).
    #[arg(long, value_enum)]
    pub over: Option<Over>,
    /// Write a launch hostfile for the ring ({"ssh", "ips"} per host) from the verified
    /// addresses.
    #[arg(long, value_name = "PATH")]
    pub write_hostfile: Option<PathBuf>,
    /// Write a JACCL hostfile (with each host's `rdma` row) from the RDMA devices found.
    #[arg(long, value_name = "PATH")]
    pub write_jaccl: Option<PathBuf>,
    /// Print the findings as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// The nuvec program on the remote hosts (for the port and link checks; default
    /// `nuvec` from their PATH). Hosts that run here (`127.0.0.1`) use this program.
    #[arg(long, value_name = "PATH")]
    pub remote_nuvec: Option<String>,
    /// Ping-pongs per link.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub pings: u32,
    /// Internal: listen on ADDR for one link check.
    #[arg(long, hide = true, value_name = "ADDR")]
    pub serve: Option<String>,
    /// Internal: connect to ADDR and time ping-pongs.
    #[arg(long, hide = true, value_name = "ADDR")]
    pub probe: Option<String>,
}

/// The script every host runs: sections marked `@@NAME`, read back by [`HostFacts::parse`].
pub const PROBE_SCRIPT: &str = "echo @@uname; uname -sm; \
case \"$(uname -s)\" in \
Darwin) echo @@ifconfig; ifconfig -a 2>/dev/null; \
echo @@route; route -n get default 2>/dev/null; \
echo @@hwports; networksetup -listallhardwareports 2>/dev/null; \
echo @@thunderbolt; system_profiler SPThunderboltDataType 2>/dev/null;; \
*) echo @@ipaddr; ip -j addr 2>/dev/null || { echo @@ifconfig; ifconfig -a 2>/dev/null; }; \
echo @@route; ip -j route show default 2>/dev/null;; \
esac; \
if command -v ibv_devinfo >/dev/null 2>&1; then echo @@ibv; ibv_devinfo 2>&1; fi";

/// What one host told about itself.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct HostFacts {
    /// `uname -s` (Linux, Darwin).
    pub os: String,
    /// `uname -m`.
    pub arch: String,
    /// Its interfaces.
    pub interfaces: Vec<Interface>,
    /// Why the interfaces could not be read, if they could not.
    pub interfaces_error: Option<String>,
    /// The default route's interface.
    pub default_interface: Option<String>,
    /// macOS: the hardware ports (`networksetup`).
    pub hardware_ports: Vec<HardwarePort>,
    /// macOS: speeds (Gb/s) of Thunderbolt ports with a device connected.
    pub thunderbolt_speeds: Vec<u32>,
    /// The RDMA devices; `None` when `ibv_devinfo` is not installed.
    pub rdma: Option<Vec<RdmaDevice>>,
}

impl HostFacts {
    /// Reads the output of [`PROBE_SCRIPT`].
    pub fn parse(output: &str) -> HostFacts {
        let s = parse::sections(output);
        let section = |name: &str| s.get(name).map(String::as_str).unwrap_or("");
        let mut uname = section("uname").split_whitespace();
        let os = uname.next().unwrap_or("").to_string();
        let arch = uname.next().unwrap_or("").to_string();
        let (interfaces, interfaces_error) = match parse::ip_addr_json(section("ipaddr")) {
            Ok(list) => (list, None),
            Err(e) => {
                let list = parse::ifconfig(section("ifconfig"));
                if list.is_empty() {
                    (
                        list,
                        Some(format!(
                            "neither `ip -j addr` ({e}) nor `ifconfig -a` gave interfaces"
                        )),
                    )
                } else {
                    (list, None)
                }
            }
        };
        HostFacts {
            os,
            arch,
            interfaces,
            interfaces_error,
            default_interface: parse::default_route_interface(section("route")),
            hardware_ports: parse::hardware_ports(section("hwports")),
            thunderbolt_speeds: parse::thunderbolt_speeds(section("thunderbolt")),
            rdma: s.get("ibv").map(|t| parse::ibv_devinfo(t)),
        }
    }

    fn interface_of(&self, ip: IpAddr) -> Option<&Interface> {
        self.interfaces.iter().find(|i| i.holds(ip))
    }

    fn thunderbolt(&self) -> Vec<(&HardwarePort, Option<&Interface>)> {
        self.hardware_ports
            .iter()
            .filter(|p| p.is_thunderbolt())
            .map(|p| (p, self.interfaces.iter().find(|i| i.name == p.device)))
            .collect()
    }

    fn ipv4_of(&self, name: &str) -> Vec<(IpAddr, u8)> {
        self.interfaces
            .iter()
            .filter(|i| i.name == name)
            .flat_map(|i| i.addrs.iter().copied())
            .filter(|(a, _)| a.is_ipv4())
            .collect()
    }

    fn is_macos(&self) -> bool {
        self.os == "Darwin"
    }
}

/// How a host's commands are run.
#[derive(Clone, Debug)]
pub struct Runner {
    /// How long a remote command may take before it is ended.
    pub timeout: Duration,
}

impl Default for Runner {
    fn default() -> Self {
        Runner {
            timeout: Duration::from_secs(20),
        }
    }
}

/// What a command run on a host gave.
#[derive(Clone, Debug)]
pub struct Ran {
    /// Its exit status (`None`: killed, or ended at the timeout).
    pub status: Option<i32>,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
}

/// The command that runs `script` on `host`: a local shell for `127.0.0.1`, else ssh
/// without a terminal or prompts ([`launch::ssh_batch_command`]).
pub fn host_command(host: &str, script: &str) -> Command {
    let argv = if host == LOCAL_HOST {
        vec!["sh".to_string(), "-c".to_string(), script.to_string()]
    } else {
        launch::ssh_batch_command(host, script, false)
    };
    let mut c = Command::new(&argv[0]);
    c.args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

impl Runner {
    /// Runs `script` on `host` to its end, or until the timeout (then the command, which
    /// this process started, is killed).
    ///
    /// # Errors
    ///
    /// The command (ssh or sh) cannot be started.
    pub fn run(&self, host: &str, script: &str) -> Result<Ran, String> {
        let mut child = host_command(host, script)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", what_runs(host)))?;
        let stdout = reader(child.stdout.take());
        let stderr = reader(child.stderr.take());
        let status = wait_until(&mut child, Instant::now() + self.timeout);
        Ok(Ran {
            status,
            stdout: stdout.join().unwrap_or_default(),
            stderr: stderr.join().unwrap_or_default(),
        })
    }
}

fn what_runs(host: &str) -> &'static str {
    if host == LOCAL_HOST { "sh" } else { "ssh" }
}

fn reader<R: Read + Send + 'static>(pipe: Option<R>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut p) = pipe {
            let mut bytes = Vec::new();
            let _ = p.read_to_end(&mut bytes);
            text = String::from_utf8_lossy(&bytes).into_owned();
        }
        text
    })
}

/// Waits for `child` until `deadline`, then kills it. Its exit code, if it exited.
fn wait_until(child: &mut Child, deadline: Instant) -> Option<i32> {
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return status.code(),
            Ok(None) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

/// The last non-empty line of `text`, for a one-line detail.
fn last_line(text: &str) -> &str {
    text.lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .unwrap_or("")
}

/// One host as checked.
#[derive(Clone, Debug, Serialize)]
pub struct HostReport {
    /// Its entry in the hostfile.
    pub host: Host,
    /// What it told, when ssh worked.
    pub facts: Option<HostFacts>,
    /// The addresses checked (the given ones, or those `--over` picked), with their ring
    /// ports.
    pub addresses: Vec<(IpAddr, u16)>,
    /// Per address: it is the host's and its port could be bound.
    pub usable: Vec<bool>,
    /// Per address: the left neighbour connected to it and timed its ping-pongs.
    pub reached: Vec<bool>,
}

/// Everything a doctor run found.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The rows of the table, in order.
    pub findings: Vec<Finding>,
    /// Per host, what was learnt.
    pub hosts: Vec<HostReport>,
    /// Whether the hostfile asked for JACCL (it has `rdma` rows or a jaccl backend).
    pub jaccl: bool,
}

impl Report {
    /// Whether any check failed.
    pub fn failed(&self) -> bool {
        self.findings.iter().any(|f| f.verdict == Verdict::Fail)
    }

    /// The findings as a table: subject, check, verdict, detail, fix.
    pub fn table(&self) -> String {
        let header = ["HOST/LINK", "CHECK", "VERDICT", "DETAIL", "FIX"];
        let rows: Vec<[String; 5]> = self
            .findings
            .iter()
            .map(|f| {
                [
                    f.subject.clone(),
                    f.check.to_string(),
                    f.verdict.label().to_string(),
                    f.detail.clone(),
                    f.fix.clone().unwrap_or_else(|| "-".into()),
                ]
            })
            .collect();
        let mut widths = header.map(|h| h.chars().count());
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let mut out = String::new();
        let mut line = |cells: [&str; 5]| {
            let mut l = String::new();
            for (i, cell) in cells.iter().enumerate() {
                if i == 4 {
                    l.push_str(cell);
                } else {
                    let _ = write!(l, "{cell:<w$}  ", w = widths[i]);
                }
            }
            out.push_str(l.trim_end());
            out.push('\n');
        };
        line(header);
        for row in &rows {
            line([&row[0], &row[1], &row[2], &row[3], &row[4]]);
        }
        let count = |v| self.findings.iter().filter(|f| f.verdict == v).count();
        let _ = writeln!(
            out,
            "\n{} ok, {} warnings, {} failed, {} skipped",
            count(Verdict::Ok),
            count(Verdict::Warn),
            count(Verdict::Fail),
            count(Verdict::Skipped)
        );
        out
    }
}

/// What to check and how.
#[derive(Clone, Debug)]
pub struct Options {
    /// The hosts, in rank order.
    pub hosts: HostList,
    /// The ring's first port.
    pub starting_port: u16,
    /// Per rank, the port of each of its addresses, when a ring address file gave them
    /// (then `starting_port` is not used).
    pub ports: Option<Ports>,
    /// `--over`.
    pub over: Option<Over>,
    /// The nuvec program on the hosts (`None`: `nuvec` from their PATH, and this program
    /// for hosts that run here).
    pub remote_nuvec: Option<String>,
    /// Ping-pongs per link.
    pub pings: u32,
    /// How commands run.
    pub runner: Runner,
}

impl Options {
    /// The nuvec program to run on `host`.
    fn nuvec_on(&self, host: &str) -> String {
        match &self.remote_nuvec {
            Some(path) => path.clone(),
            None if host == LOCAL_HOST => std::env::current_exe()
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_else(|_| "nuvec".into()),
            None => "nuvec".into(),
        }
    }
}

fn subject(rank: usize, host: &Host) -> String {
    format!("{rank} ({})", host.ssh)
}

/// The findings as they are made, each with where its row goes: hosts in rank order, then
/// links in ring order.
struct Findings(Vec<((bool, usize), Finding)>);

/// Where a subject's rows go: `N (name)` is host N, `A -> B` the link from A.
fn order(subject: &str) -> (bool, usize) {
    let link = subject.contains("->");
    let rank = subject
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(usize::MAX);
    (link, rank)
}

impl Findings {
    fn push(&mut self, subject: &str, check: &'static str, verdict: Verdict, detail: String) {
        self.add(Finding {
            subject: subject.to_string(),
            check,
            verdict,
            detail,
            fix: None,
        });
    }

    fn problem(
        &mut self,
        subject: &str,
        check: &'static str,
        verdict: Verdict,
        detail: String,
        fix: String,
    ) {
        self.add(Finding {
            subject: subject.to_string(),
            check,
            verdict,
            detail,
            fix: Some(fix),
        });
    }

    fn add(&mut self, finding: Finding) {
        self.0.push((order(&finding.subject), finding));
    }

    /// The rows in table order (stable: each subject's checks in the order made).
    fn into_sorted(mut self) -> Vec<Finding> {
        self.0.sort_by_key(|(key, _)| *key);
        self.0.into_iter().map(|(_, f)| f).collect()
    }
}

/// Runs every check and returns what it found.
pub fn run(opts: &Options) -> Report {
    let hosts = &opts.hosts.hosts;
    let jaccl = hosts.iter().any(|h| !h.rdma.is_empty())
        || opts
            .hosts
            .backend
            .as_deref()
            .is_some_and(|b| b.starts_with("jaccl"));
    let mut f = Findings(Vec::new());

    // 1. Facts, from every host at once.
    let gathered: Vec<Result<HostFacts, (String, String)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = hosts
            .iter()
            .map(|h| scope.spawn(|| gather(&opts.runner, &h.ssh)))
            .collect();
        handles
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err(("the check panicked".into(), String::new())))
            })
            .collect()
    });
    let mut reports = Vec::with_capacity(hosts.len());
    let mut port = u32::from(opts.starting_port);
    for (rank, (host, facts)) in hosts.iter().zip(gathered).enumerate() {
        let who = subject(rank, host);
        let facts = match facts {
            Ok(facts) => {
                let how = if host.ssh == LOCAL_HOST {
                    "runs here (127.0.0.1, as nuvec launch runs it)".to_string()
                } else {
                    format!("ssh {} works", host.ssh)
                };
                f.push(
                    &who,
                    "ssh",
                    Verdict::Ok,
                    format!("{how}; {} {}", facts.os, facts.arch),
                );
                Some(facts)
            }
            Err((detail, fix)) => {
                f.problem(&who, "ssh", Verdict::Fail, detail, fix);
                None
            }
        };
        let addresses = match &facts {
            Some(facts) => choose_addresses(&mut f, &who, host, facts, opts.over),
            None => {
                for check in ["address", "port"] {
                    f.push(&who, check, Verdict::Skipped, "ssh failed".into());
                }
                Vec::new()
            }
        };
        // Ports are numbered as nuvec launch numbers them: one per listed address (valid
        // or not), so that a bad entry does not shift the others'.
        let slots = if host.ips.is_empty() || opts.over == Some(Over::Thunderbolt) {
            addresses.len()
        } else {
            host.ips.len()
        };
        let fixed = opts.ports.as_ref().and_then(|p| p.get(rank));
        let mut numbered = Vec::new();
        for (i, ip) in addresses.iter().enumerate() {
            if let Some(ip) = ip {
                let given = fixed.and_then(|f| f.get(i)).copied();
                numbered.push((*ip, given.unwrap_or(u16::try_from(port).unwrap_or(0))));
            }
            port += 1;
        }
        port += u32::try_from(slots.saturating_sub(addresses.len())).unwrap_or(0);
        if numbered.iter().any(|&(_, p)| p == 0) {
            f.problem(
                &who,
                "port",
                Verdict::Fail,
                format!("ports from {} run past 65535", opts.starting_port),
                "give a lower --starting-port".into(),
            );
            numbered.retain(|&(_, p)| p != 0);
        }
        let usable = numbered
            .iter()
            .map(|&(ip, _)| facts.as_ref().is_some_and(|x| x.interface_of(ip).is_some()))
            .collect();
        reports.push(HostReport {
            host: host.clone(),
            facts,
            reached: vec![false; numbered.len()],
            addresses: numbered,
            usable,
        });
    }

    // 2. Listeners on every usable address (which tests the port), then the neighbours'
    //    probes.
    links(&mut f, opts, &mut reports);

    // 3. What only the host's own facts tell: Thunderbolt, the bridge, RDMA.
    for (rank, r) in reports.iter().enumerate() {
        let who = subject(rank, &r.host);
        match &r.facts {
            Some(facts) => {
                thunderbolt_checks(&mut f, &who, facts, jaccl);
                rdma_check(&mut f, &who, &r.host, facts, jaccl);
            }
            None => {
                for check in ["thunderbolt", "bridge", "rdma"] {
                    f.push(&who, check, Verdict::Skipped, "ssh failed".into());
                }
            }
        }
    }
    Report {
        findings: f.into_sorted(),
        hosts: reports,
        jaccl,
    }
}

/// Runs [`PROBE_SCRIPT`] on `host`: its facts, or (detail, fix) of why not.
fn gather(runner: &Runner, host: &str) -> Result<HostFacts, (String, String)> {
    let ssh_fix = format!(
        "make `ssh -o BatchMode=yes {host} true` work without a prompt: the name resolves, \
         sshd runs, your key is installed (ssh-copy-id {host}) and the host key is known"
    );
    let ran = runner.run(host, PROBE_SCRIPT).map_err(|e| {
        (
            format!("{host}: {e}"),
            "install OpenSSH's client (ssh) here".into(),
        )
    })?;
    match ran.status {
        None => Err((
            format!(
                "{} {host}: no answer within {} s",
                what_runs(host),
                runner.timeout.as_secs()
            ),
            ssh_fix,
        )),
        Some(255) if host != LOCAL_HOST => Err((
            format!(
                "ssh {host} failed (exit 255): {}",
                match last_line(&ran.stderr) {
                    "" => "no message",
                    l => l,
                }
            ),
            ssh_fix,
        )),
        Some(code) => {
            let facts = HostFacts::parse(&ran.stdout);
            if facts.os.is_empty() {
                Err((
                    format!(
                        "{host}: the check script gave no `uname` (exit {code}): {}",
                        last_line(&ran.stderr)
                    ),
                    format!(
                        "check that {host}'s login shell is a POSIX shell that runs commands from ssh"
                    ),
                ))
            } else {
                Ok(facts)
            }
        }
    }
}

/// The addresses to check on a host, with their findings.
fn choose_addresses(
    f: &mut Findings,
    who: &str,
    host: &Host,
    facts: &HostFacts,
    over: Option<Over>,
) -> Vec<Option<IpAddr>> {
    if let Some(e) = &facts.interfaces_error {
        f.problem(
            who,
            "address",
            Verdict::Fail,
            format!("{}: {e}", host.ssh),
            "install iproute2 (ip) on Linux; ifconfig is part of macOS".into(),
        );
        return Vec::new();
    }
    let mut chosen = Vec::new();
    if over == Some(Over::Thunderbolt) {
        if !facts.is_macos() {
            f.problem(
                who,
                "address",
                Verdict::Fail,
                format!(
                    "--over thunderbolt: {} is {}, not macOS",
                    host.ssh, facts.os
                ),
                "use --over ethernet (or list the addresses) for hosts other than Macs".into(),
            );
            return Vec::new();
        }
        for (port, _) in facts.thunderbolt() {
            chosen.extend(
                facts
                    .ipv4_of(&port.device)
                    .into_iter()
                    .map(|(a, _)| Some(a)),
            );
        }
        if chosen.is_empty() {
            f.problem(
                who,
                "address",
                Verdict::Fail,
                "no Thunderbolt port has an IPv4 address".into(),
                "give each Thunderbolt cable a point-to-point subnet (sudo ifconfig enX inet \
                 192.168.A.B netmask 255.255.255.252), or run mlx.distributed_config"
                    .into(),
            );
        }
    } else if host.ips.is_empty() {
        let default = facts.default_interface.as_deref().unwrap_or("");
        match facts.ipv4_of(default).first() {
            Some(&(ip, _)) => {
                f.push(
                    who,
                    "address",
                    Verdict::Ok,
                    format!("none given; {ip} on {default}, the default route's interface"),
                );
                chosen.push(Some(ip));
            }
            None => f.problem(
                who,
                "address",
                Verdict::Fail,
                "none given, and no default route with an IPv4 address".into(),
                "list the host's address in the hostfile's \"ips\"".into(),
            ),
        }
        return chosen;
    } else {
        for ip in &host.ips {
            match ip.parse::<IpAddr>() {
                Ok(a) => chosen.push(Some(a)),
                Err(_) => {
                    chosen.push(None);
                    f.problem(
                        who,
                        "address",
                        Verdict::Fail,
                        format!("{ip:?} is not an IP address"),
                        "\"ips\" holds IP addresses, not names".into(),
                    );
                }
            }
        }
    }
    for &ip in chosen.iter().flatten() {
        match facts.interface_of(ip) {
            Some(i) => {
                f.push(
                    who,
                    "address",
                    Verdict::Ok,
                    format!("{ip} is on {}", i.name),
                );
                let mtu = i.mtu.map_or("unknown".to_string(), |m| m.to_string());
                f.push(who, "mtu", Verdict::Ok, format!("{mtu} on {}", i.name));
            }
            None => {
                let own: Vec<String> = facts
                    .interfaces
                    .iter()
                    .flat_map(|i| {
                        i.addrs
                            .iter()
                            .filter(|(a, _)| a.is_ipv4())
                            .map(move |(a, _)| format!("{a} ({})", i.name))
                    })
                    .collect();
                f.problem(
                    who,
                    "address",
                    Verdict::Fail,
                    format!(
                        "{ip} is not an address of {}; it has {}",
                        host.ssh,
                        if own.is_empty() {
                            "no IPv4 address".into()
                        } else {
                            own.join(", ")
                        }
                    ),
                    format!(
                        "list one of {}'s own addresses (on the link to its neighbours)",
                        host.ssh
                    ),
                );
            }
        }
    }
    chosen
}

/// A listener started on a host, and the first line it printed.
struct Listener {
    child: Option<Child>,
    line: Option<String>,
    stderr: String,
    status: Option<i32>,
}

fn start_listener(opts: &Options, host: &str, addr: &str) -> Listener {
    let script = format!(
        "exec {} doctor --serve {}",
        launch::shell_quote(&opts.nuvec_on(host)),
        launch::shell_quote(addr)
    );
    let mut child = match host_command(host, &script).spawn() {
        Ok(c) => c,
        Err(e) => {
            return Listener {
                child: None,
                line: None,
                stderr: format!("cannot start {}: {e}", what_runs(host)),
                status: None,
            };
        }
    };
    let (tx, rx) = mpsc::channel();
    if let Some(out) = child.stdout.take() {
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if link::parse_serve_line(&line).is_some() {
                    let _ = tx.send(line);
                    return;
                }
            }
        });
    }
    let stderr = reader(child.stderr.take());
    let line = rx.recv_timeout(opts.runner.timeout).ok();
    let mut status = None;
    if line.is_none() {
        status = wait_until(&mut child, Instant::now() + Duration::from_secs(1));
    }
    let stderr = if line.is_none() {
        stderr.join().unwrap_or_default()
    } else {
        String::new()
    };
    Listener {
        child: Some(child),
        line,
        stderr,
        status,
    }
}

/// The outcomes of threads started in rows (per host, or per link), row by row: `None` for a
/// thread that gave none or panicked.
fn join_rows<T>(rows: Vec<Vec<ScopedJoinHandle<'_, Option<T>>>>) -> Vec<Vec<Option<T>>> {
    rows.into_iter()
        .map(|row| row.into_iter().map(|t| t.join().ok().flatten()).collect())
        .collect()
}

/// The port checks and the link checks (each host to the next one's addresses).
fn links(f: &mut Findings, opts: &Options, reports: &mut [HostReport]) {
    let n = reports.len();
    // Listeners: one per usable address, all started at once.
    let mut listeners: Vec<Vec<Option<Listener>>> = std::thread::scope(|scope| {
        let handles: Vec<Vec<_>> = reports
            .iter()
            .map(|r| {
                r.addresses
                    .iter()
                    .zip(&r.usable)
                    .map(|(&(ip, port), &usable)| {
                        let host = r.host.ssh.clone();
                        scope.spawn(move || {
                            usable.then(|| start_listener(opts, &host, &ring_addr(ip, port)))
                        })
                    })
                    .collect()
            })
            .collect();
        join_rows(handles)
    });
    for (rank, r) in reports.iter_mut().enumerate() {
        let who = subject(rank, &r.host);
        for (i, &(ip, port)) in r.addresses.iter().enumerate() {
            let Some(listener) = &listeners[rank][i] else {
                f.push(
                    &who,
                    "port",
                    Verdict::Skipped,
                    format!("{ip} is not this host's"),
                );
                continue;
            };
            let serve = listener.line.as_deref().and_then(link::parse_serve_line);
            match serve {
                Some(ServeLine::Listening) => {
                    f.push(&who, "port", Verdict::Ok, format!("{port} is free on {ip}"));
                }
                Some(ServeLine::BindFailed(BindFailure::InUse, m)) => {
                    r.usable[i] = false;
                    f.problem(
                        &who,
                        "port",
                        Verdict::Fail,
                        format!("{port} on {ip} is in use on {} ({m})", r.host.ssh),
                        format!(
                            "stop what listens there (find it with `ss -ltnp 'sport = :{port}'` \
                             or `lsof -iTCP:{port} -sTCP:LISTEN`) or pick another --starting-port"
                        ),
                    );
                }
                Some(ServeLine::BindFailed(kind, m)) => {
                    r.usable[i] = false;
                    let fix = match kind {
                        BindFailure::Denied => "use a port above 1023 (--starting-port)",
                        BindFailure::NotHere => "list one of the host's own addresses",
                        _ => "see the message; the ring's listener would fail the same way",
                    };
                    f.problem(
                        &who,
                        "port",
                        Verdict::Fail,
                        format!("cannot listen on {ip}:{port} on {}: {m}", r.host.ssh),
                        fix.into(),
                    );
                }
                None => {
                    r.usable[i] = false;
                    let why = match (listener.status, last_line(&listener.stderr)) {
                        (Some(code), "") => format!("exit {code}"),
                        (Some(code), l) => format!("exit {code}: {l}"),
                        (None, "") => "no answer".to_string(),
                        (None, l) => l.to_string(),
                    };
                    f.problem(
                        &who,
                        "port",
                        Verdict::Warn,
                        format!(
                            "not checked: `{} doctor --serve` did not start on {} ({why})",
                            opts.nuvec_on(&r.host.ssh),
                            r.host.ssh
                        ),
                        format!(
                            "install nuvec on {} (cargo install --path tools) or give \
                             --remote-nuvec PATH",
                            r.host.ssh
                        ),
                    );
                }
            }
        }
    }

    // Probes: host k connects to each address of host k+1 (the ring's direction).
    if n < 2
        && let Some(r) = reports.first()
    {
        f.push(
            &subject(0, &r.host),
            "link",
            Verdict::Skipped,
            "a single host has no neighbours".into(),
        );
    }
    let pairs: Vec<(usize, usize)> = if n < 2 {
        Vec::new()
    } else {
        (0..n).map(|k| (k, (k + 1) % n)).collect()
    };
    let probes: Vec<Vec<Option<Result<Ran, String>>>> = std::thread::scope(|scope| {
        let reports = &*reports;
        let handles: Vec<Vec<_>> = pairs
            .iter()
            .map(|&(from, to)| {
                let src = &reports[from];
                let dst = &reports[to];
                dst.addresses
                    .iter()
                    .zip(&dst.usable)
                    .map(|(&(ip, port), &usable)| {
                        let go = usable && src.facts.is_some();
                        scope.spawn(move || {
                            go.then(|| {
                                let script = format!(
                                    "exec {} doctor --probe {} --pings {}",
                                    launch::shell_quote(&opts.nuvec_on(&src.host.ssh)),
                                    launch::shell_quote(&ring_addr(ip, port)),
                                    opts.pings
                                );
                                opts.runner.run(&src.host.ssh, &script)
                            })
                        })
                    })
                    .collect()
            })
            .collect();
        join_rows(handles)
    });
    // A listener that was probed ends by itself once served; one that no probe came to
    // (a single host, a neighbour ssh could not reach) is ended now.
    let probed: BTreeSet<(usize, usize)> = pairs
        .iter()
        .zip(&probes)
        .flat_map(|(&(_, to), p)| {
            p.iter()
                .enumerate()
                .filter(|(_, r)| r.is_some())
                .map(move |(i, _)| (to, i))
        })
        .collect();
    for (rank, per_host) in listeners.iter_mut().enumerate() {
        for (i, l) in per_host.iter_mut().enumerate() {
            if let Some(child) = l.as_mut().and_then(|l| l.child.as_mut()) {
                let grace = if probed.contains(&(rank, i)) { 2 } else { 0 };
                wait_until(child, Instant::now() + Duration::from_secs(grace));
            }
        }
    }
    let mut mtu_links = BTreeSet::new();
    let mut reached = Vec::new();
    for (&(from, to), probes) in pairs.iter().zip(probes) {
        let who = format!("{from} -> {to}");
        let (src, dst) = (&reports[from], &reports[to]);
        if dst.addresses.is_empty() {
            f.push(
                &who,
                "link",
                Verdict::Skipped,
                format!("{} has no address to reach (see its checks)", dst.host.ssh),
            );
        }
        for (i, ran) in probes.into_iter().enumerate() {
            let (ip, port) = dst.addresses[i];
            let target = ring_addr(ip, port);
            let Some(ran) = ran else {
                let why = if src.facts.is_none() {
                    format!("ssh to {} failed", src.host.ssh)
                } else {
                    format!("{target} has no listener (see {to}'s address and port checks)")
                };
                f.push(&who, "link", Verdict::Skipped, why);
                continue;
            };
            let line = ran
                .as_ref()
                .ok()
                .and_then(|r| r.stdout.lines().find_map(link::parse_probe_line));
            match (line, &ran) {
                (Some(ProbeLine::Rtts(rtts)), _) => {
                    reached.push((to, i));
                    let median = median(&rtts);
                    let min = rtts.iter().copied().fold(f64::INFINITY, f64::min);
                    let detail = format!(
                        "{} reaches {target}: round trip {} median, {} min ({} ping-pongs)",
                        src.host.ssh,
                        micros(median),
                        micros(min),
                        rtts.len()
                    );
                    if median > 5_000.0 {
                        f.problem(
                            &who,
                            "link",
                            Verdict::Warn,
                            detail,
                            "a round trip above 5 ms is not a direct cluster link: check the \
                             route (ip route get / route get) and use the direct link's addresses"
                                .into(),
                        );
                    } else {
                        f.push(&who, "link", Verdict::Ok, detail);
                    }
                }
                (Some(ProbeLine::Failed(m)), _) => f.problem(
                    &who,
                    "link",
                    Verdict::Fail,
                    format!("{} cannot reach {target}: {m}", src.host.ssh),
                    format!(
                        "check that {ip} is routed from {} over the intended link and that \
                         no firewall blocks port {port} on {}",
                        src.host.ssh, dst.host.ssh
                    ),
                ),
                (None, Ok(r)) => f.problem(
                    &who,
                    "link",
                    Verdict::Warn,
                    format!(
                        "not checked: `{} doctor --probe` did not run on {} ({})",
                        opts.nuvec_on(&src.host.ssh),
                        src.host.ssh,
                        match (r.status, last_line(&r.stderr)) {
                            (Some(c), l) => format!("exit {c} {l}").trim_end().to_string(),
                            (None, _) => "no answer".to_string(),
                        }
                    ),
                    format!(
                        "install nuvec on {} (cargo install --path tools) or give \
                         --remote-nuvec PATH",
                        src.host.ssh
                    ),
                ),
                (None, Err(e)) => f.problem(
                    &who,
                    "link",
                    Verdict::Fail,
                    format!("{}: {e}", src.host.ssh),
                    "see the message".into(),
                ),
            }
        }
        // MTU once per link (with two hosts, 0 -> 1 and 1 -> 0 are one link).
        let key = (from.min(to), from.max(to));
        if mtu_links.insert(key) {
            mtu_check(f, &who, src, dst);
        }
    }
    for (to, i) in reached {
        reports[to].reached[i] = true;
    }
}

/// MTUs of the interfaces holding the two ends' first usable addresses.
fn mtu_check(f: &mut Findings, who: &str, a: &HostReport, b: &HostReport) {
    let end = |r: &HostReport| {
        let facts = r.facts.as_ref()?;
        let (ip, _) = r.addresses.first()?;
        let i = facts.interface_of(*ip)?;
        Some((i.name.clone(), i.mtu?))
    };
    match (end(a), end(b)) {
        (Some((ia, ma)), Some((ib, mb))) if ma == mb => {
            f.push(
                who,
                "mtu",
                Verdict::Ok,
                format!("{ma} on both ends ({ia}, {ib})"),
            );
        }
        (Some((ia, ma)), Some((ib, mb))) => f.problem(
            who,
            "mtu",
            Verdict::Warn,
            format!(
                "mismatched MTU: {ma} on {}'s {ia}, {mb} on {}'s {ib}",
                a.host.ssh, b.host.ssh
            ),
            format!(
                "set the same MTU on both ends (Linux: ip link set dev {ib} mtu {ma}; macOS: \
                 sudo ifconfig {ib} mtu {ma})"
            ),
        ),
        _ => f.push(
            who,
            "mtu",
            Verdict::Skipped,
            "an end's address or MTU is unknown".into(),
        ),
    }
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn micros(us: f64) -> String {
    if us >= 1000.0 {
        format!("{:.2} ms", us / 1000.0)
    } else {
        format!("{us:.0} µs")
    }
}

fn ring_addr(ip: IpAddr, port: u16) -> String {
    // The ring hostfile writes IPv6 without brackets too (MLX's format).
    format!("{ip}:{port}")
}

/// The Thunderbolt ports and the bridge (macOS only).
fn thunderbolt_checks(f: &mut Findings, who: &str, facts: &HostFacts, jaccl: bool) {
    if !facts.is_macos() {
        for check in ["thunderbolt", "bridge"] {
            f.push(
                who,
                check,
                Verdict::Skipped,
                format!("not macOS ({})", facts.os),
            );
        }
        return;
    }
    let ports = facts.thunderbolt();
    if ports.is_empty() {
        f.push(
            who,
            "thunderbolt",
            Verdict::Ok,
            "no Thunderbolt network ports".into(),
        );
    } else {
        let listed: Vec<String> = ports
            .iter()
            .map(|(p, i)| {
                let addrs: Vec<String> = facts
                    .ipv4_of(&p.device)
                    .iter()
                    .map(|(a, len)| format!("{a}/{len}"))
                    .collect();
                let mtu = i
                    .and_then(|i| i.mtu)
                    .map(|m| format!(" mtu {m}"))
                    .unwrap_or_default();
                format!(
                    "{} ({}): {}{mtu}",
                    p.device,
                    p.port,
                    if addrs.is_empty() {
                        "no IPv4".into()
                    } else {
                        addrs.join(" ")
                    }
                )
            })
            .collect();
        let speed = facts.thunderbolt_speeds.iter().copied().max();
        let generation = match speed {
            Some(s) if s >= 80 => format!("Thunderbolt 5 ({s} Gb/s)"),
            Some(s) => format!("Thunderbolt 4 or older ({s} Gb/s)"),
            None => "no Thunderbolt device connected".into(),
        };
        let detail = format!("{}; {generation}", listed.join(", "));
        let rdma_wanted = jaccl || facts.rdma.as_ref().is_some_and(|d| !d.is_empty());
        match speed {
            Some(s) if s < 80 && rdma_wanted => f.problem(
                who,
                "thunderbolt",
                Verdict::Warn,
                detail,
                "RDMA over Thunderbolt needs Thunderbolt 5 ports and cables on both ends; \
                 on TB4 use the ring backend"
                    .into(),
            ),
            _ => f.push(who, "thunderbolt", Verdict::Ok, detail),
        }
    }
    let tb: Vec<&str> = ports.iter().map(|(p, _)| p.device.as_str()).collect();
    let bridged: Vec<(String, String)> = facts
        .interfaces
        .iter()
        .flat_map(|b| {
            b.members
                .iter()
                .filter(|m| tb.contains(&m.as_str()))
                .map(move |m| (b.name.clone(), m.clone()))
        })
        .collect();
    if bridged.is_empty() {
        f.push(
            who,
            "bridge",
            Verdict::Ok,
            "no Thunderbolt port is in a bridge".into(),
        );
    } else {
        let names: Vec<String> = bridged.iter().map(|(b, m)| format!("{m} in {b}")).collect();
        let fixes: Vec<String> = bridged
            .iter()
            .map(|(b, m)| format!("sudo ifconfig {b} deletem {m}"))
            .collect();
        f.problem(
            who,
            "bridge",
            Verdict::Warn,
            format!("Thunderbolt ports inside a bridge: {}", names.join(", ")),
            format!(
                "{} (or sudo ifconfig bridge0 down; remove them from Thunderbolt Bridge in \
                 System Settings > Network to keep it so)",
                fixes.join("; ")
            ),
        );
    }
}

/// The RDMA devices and port states, and the devices the hostfile names.
fn rdma_check(f: &mut Findings, who: &str, host: &Host, facts: &HostFacts, jaccl: bool) {
    let enable = if facts.is_macos() {
        "enable RDMA once per Mac: boot into Recovery, run `rdma_ctl enable` in Terminal, reboot \
         (macOS 26.2+, Thunderbolt 5)"
    } else {
        "install rdma-core (ibv_devinfo) and the NIC's RDMA driver"
    };
    let Some(devices) = &facts.rdma else {
        if jaccl {
            f.problem(
                who,
                "rdma",
                Verdict::Fail,
                format!(
                    "the hostfile asks for JACCL, but {} has no ibv_devinfo",
                    host.ssh
                ),
                enable.into(),
            );
        } else {
            f.push(
                who,
                "rdma",
                Verdict::Skipped,
                "ibv_devinfo not installed".into(),
            );
        }
        return;
    };
    // Each device with its ports, and the one JACCL uses: the first active port, which on a
    // Thunderbolt device is not always 1.
    let states: Vec<String> = devices
        .iter()
        .map(|d| {
            let ports: Vec<String> = d.ports.iter().map(|(n, s)| format!("{n} {s}")).collect();
            let uses = d
                .jaccl_port()
                .map_or(String::new(), |p| format!("; JACCL uses port {p}"));
            format!("{} (port {}{uses})", d.name, ports.join(", port "))
        })
        .collect();
    let detail = if states.is_empty() {
        "no RDMA devices".to_string()
    } else {
        states.join("; ")
    };
    // Devices the hostfile's rdma row names must exist with an active port.
    let named: BTreeSet<&str> = host
        .rdma
        .iter()
        .flatten()
        .flat_map(|c| match c {
            launch::RdmaCell::Device(d) => vec![d.as_str()],
            launch::RdmaCell::Devices(ds) => ds.iter().map(String::as_str).collect(),
        })
        .collect();
    let bad: Vec<String> = named
        .iter()
        .filter_map(|&name| match devices.iter().find(|d| d.name == name) {
            None => Some(format!("{name} does not exist")),
            Some(d) if !d.active() => Some(format!("{name} has no active port")),
            Some(_) => None,
        })
        .collect();
    if !bad.is_empty() {
        f.problem(
            who,
            "rdma",
            Verdict::Fail,
            format!("{}; found: {detail}", bad.join(", ")),
            "name the devices ibv_devices lists (rdma_enX for Thunderbolt port enX); a port \
             becomes PORT_ACTIVE when both ends have RDMA enabled and the cable is in"
                .into(),
        );
    } else if devices.is_empty() && jaccl {
        f.problem(who, "rdma", Verdict::Fail, detail, enable.into());
    } else if !devices.is_empty() && !devices.iter().any(RdmaDevice::active) {
        f.problem(
            who,
            "rdma",
            Verdict::Warn,
            detail,
            "no port is PORT_ACTIVE: check the cables and that RDMA is enabled on both ends".into(),
        );
    } else {
        f.push(who, "rdma", Verdict::Ok, detail);
    }
}

/// A host of a written ring hostfile, its fields in MLX's order.
#[derive(Serialize)]
struct RingHost {
    ssh: String,
    ips: Vec<String>,
}

/// A host of a written JACCL hostfile.
#[derive(Serialize)]
struct JacclHost {
    ssh: String,
    ips: Vec<String>,
    rdma: Vec<Option<String>>,
}

/// The ring hostfile (`[{"ssh", "ips"}]`, pretty JSON) from the addresses that passed every
/// check (on its host, port free, reached from the neighbour).
///
/// # Errors
///
/// A host without a verified address: the message names it.
pub fn ring_hostfile(report: &Report) -> Result<String, String> {
    let mut hosts = Vec::new();
    for (rank, r) in report.hosts.iter().enumerate() {
        let ips: Vec<String> = r
            .addresses
            .iter()
            .zip(&r.usable)
            .zip(&r.reached)
            .filter(|&((_, &usable), &reached)| usable && (reached || report.hosts.len() < 2))
            .map(|(((ip, _), _), _)| ip.to_string())
            .collect();
        if ips.is_empty() {
            return Err(format!(
                "rank {rank} ({}) has no verified address (see its checks above)",
                r.host.ssh
            ));
        }
        hosts.push(RingHost {
            ssh: r.host.ssh.clone(),
            ips,
        });
    }
    serde_json::to_string_pretty(&hosts).map_err(|e| e.to_string())
}

/// The JACCL hostfile: `{"backend", "hosts": [{"ssh", "ips", "rdma"}]}` with, for each
/// pair of hosts, the RDMA device of the first Thunderbolt port whose subnet holds an
/// address of the other host's RDMA-capable port (one point-to-point subnet per cable, as
/// `mlx.distributed_config` sets them up). A full mesh gives `jaccl`, a ring `jaccl-ring`.
///
/// # Errors
///
/// A host without RDMA devices or facts, or two ring neighbours with no RDMA link.
pub fn jaccl_hostfile(report: &Report) -> Result<String, String> {
    let n = report.hosts.len();
    let mut devices = Vec::new();
    for (rank, r) in report.hosts.iter().enumerate() {
        let facts = r
            .facts
            .as_ref()
            .ok_or_else(|| format!("rank {rank} ({}): ssh failed", r.host.ssh))?;
        let active: Vec<&RdmaDevice> = facts.rdma.iter().flatten().filter(|d| d.active()).collect();
        if active.is_empty() {
            return Err(format!(
                "rank {rank} ({}) has no RDMA device with an active port (ibv_devinfo); see its \
                 rdma check",
                r.host.ssh
            ));
        }
        devices.push((facts, active));
    }
    // cell[i][j]: i's device whose interface shares a subnet with one of j's RDMA ports.
    let mut cells = vec![vec![None::<String>; n]; n];
    for i in 0..n {
        for j in (0..n).filter(|&j| j != i) {
            let (fi, di) = &devices[i];
            let (fj, dj) = &devices[j];
            let theirs: Vec<IpAddr> = dj
                .iter()
                .filter_map(|d| d.name.strip_prefix("rdma_"))
                .flat_map(|ifname| fj.ipv4_of(ifname))
                .map(|(a, _)| a)
                .collect();
            cells[i][j] = di.iter().find_map(|d| {
                let ifname = d.name.strip_prefix("rdma_")?;
                let iface = fi.interfaces.iter().find(|x| x.name == ifname)?;
                theirs
                    .iter()
                    .any(|&a| iface.on_subnet(a))
                    .then(|| d.name.clone())
            });
        }
    }
    let full = (0..n).all(|i| (0..n).all(|j| i == j || cells[i][j].is_some()));
    let backend = if full { "jaccl" } else { "jaccl-ring" };
    if !full {
        for (i, row) in cells.iter().enumerate() {
            let j = (i + 1) % n;
            if n > 1 && (row[j].is_none() || cells[j][i].is_none()) {
                return Err(format!(
                    "no RDMA link between rank {i} ({}) and rank {j} ({}): no pair of their \
                     rdma_enX ports shares a subnet (give each cable a point-to-point subnet, \
                     or run mlx.distributed_config)",
                    report.hosts[i].host.ssh, report.hosts[j].host.ssh
                ));
            }
        }
        // A ring: only the neighbours' cells.
        for (i, row) in cells.iter_mut().enumerate() {
            for (j, cell) in row.iter_mut().enumerate() {
                if j != (i + 1) % n && i != (j + 1) % n {
                    *cell = None;
                }
            }
        }
    }
    let hosts: Vec<JacclHost> = report
        .hosts
        .iter()
        .zip(cells)
        .map(|(r, rdma)| JacclHost {
            ssh: r.host.ssh.clone(),
            ips: r.addresses.iter().map(|(ip, _)| ip.to_string()).collect(),
            rdma,
        })
        .collect();
    serde_json::to_string_pretty(&json!({"backend": backend, "hosts": hosts}))
        .map_err(|e| e.to_string())
}

/// The hosts and ports of a ring address file (`[["host:port", ...], ...]`, what
/// `MLX_HOSTFILE` names), checked as `init` checks it: rank `r`'s host is the host part of
/// its first address (reached by ssh under that name, or run here when it is exactly
/// `127.0.0.1`, as `nuvec launch` does), its addresses are its `ips` (a name resolved here
/// to its first IPv4 address, as a rank resolves it), and each port is the file's.
///
/// # Errors
///
/// Text that is not a ring address file `init` would accept, a name that does not
/// resolve, or a port 0 placeholder (the doctor checks every rank).
///
/// # Examples
///
/// ```
/// use nuvec_tools::doctor::from_address_file;
///
/// let (hosts, ports) = from_address_file(r#"[["127.0.0.1:5000"], ["127.0.0.1:5001"]]"#)?;
/// assert_eq!(hosts.hosts[1].ssh, "127.0.0.1");
/// assert_eq!(hosts.hosts[1].ips, ["127.0.0.1"]);
/// assert_eq!(ports, [[5000], [5001]]);
/// # Ok::<(), String>(())
/// ```
pub fn from_address_file(text: &str) -> Result<(HostList, Ports), String> {
    use nuvec_distributed_engine::config::hostfile;
    use std::net::ToSocketAddrs;
    let nodes = hostfile::parse(text)?;
    hostfile::check(&nodes, 0)?;
    let mut hosts = Vec::with_capacity(nodes.len());
    let mut ports = Vec::with_capacity(nodes.len());
    for (rank, addresses) in nodes.iter().enumerate() {
        let mut ips = Vec::new();
        let mut own = Vec::new();
        for (i, address) in addresses.iter().enumerate() {
            // `check` has made sure of "host:port" with a port number.
            let (host, port) = address
                .split_once(':')
                .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
                .ok_or_else(|| format!("rank {rank}, address {i}: {address:?}"))?;
            if port == 0 {
                return Err(format!(
                    "rank {rank}, address {i}: {address:?} is a placeholder (port 0); the \
                     doctor checks every rank's addresses"
                ));
            }
            let ip = match host.parse::<IpAddr>() {
                Ok(ip) => ip,
                Err(_) => (host, port)
                    .to_socket_addrs()
                    .map_err(|e| format!("rank {rank}, address {i}: cannot resolve {host:?}: {e}"))?
                    .map(|a| a.ip())
                    .find(IpAddr::is_ipv4)
                    .ok_or_else(|| {
                        format!("rank {rank}, address {i}: {host:?} has no IPv4 address")
                    })?,
            };
            ips.push(ip.to_string());
            own.push(port);
        }
        let ssh = addresses[0]
            .split_once(':')
            .map_or(addresses[0].as_str(), |(h, _)| h)
            .to_string();
        hosts.push(Host {
            ssh,
            ips,
            rdma: Vec::new(),
        });
        ports.push(own);
    }
    Ok((
        HostList {
            hosts,
            ..HostList::default()
        },
        ports,
    ))
}

/// Per rank, the port of each of its addresses (from a ring address file).
pub type Ports = Vec<Vec<u16>>;

/// The hosts of `--hostfile PATH`, a launch hostfile or a ring address file (with its
/// ports), each error naming the file.
fn read_hostfile(path: &Path) -> Result<(HostList, Option<Ports>), String> {
    let named = |e: String| format!("hostfile {}: {e}", path.display());
    let text = std::fs::read_to_string(path).map_err(|e| named(e.to_string()))?;
    let address_file = serde_json::from_str(&text).is_ok_and(|v| launch::is_address_file(&v));
    if address_file {
        let (hosts, ports) =
            from_address_file(&text).map_err(|e| named(format!("a ring address file: {e}")))?;
        Ok((hosts, Some(ports)))
    } else {
        let hosts = HostList::parse_hostfile(&text).map_err(|e| named(e.to_string()))?;
        Ok((hosts, None))
    }
}

/// `nuvec doctor`: the whole command, from its arguments to its exit status.
pub fn main(args: &DoctorArgs) -> ExitCode {
    if let Some(addr) = &args.serve {
        return ExitCode::from(link::serve(addr, Duration::from_secs(30)));
    }
    if let Some(addr) = &args.probe {
        return ExitCode::from(link::probe(
            addr,
            args.pings as usize,
            Duration::from_secs(3),
        ));
    }
    let fail = |message: String| {
        eprintln!("nuvec doctor: {message}");
        ExitCode::FAILURE
    };
    let hosts = match (&args.hostfile, &args.hosts) {
        (Some(path), _) => read_hostfile(path),
        (None, Some(list)) => HostList::from_hosts(list, 1)
            .map(|h| (h, None))
            .map_err(|e| e.to_string()),
        (None, None) => Err("give --hostfile PATH or --hosts a,b,...".into()),
    };
    let (hosts, ports) = match hosts {
        Ok((h, _)) if h.hosts.is_empty() => return fail("there are no hosts to check".into()),
        Ok(found) => found,
        Err(e) => return fail(e),
    };
    let report = run(&Options {
        hosts,
        ports,
        starting_port: args.starting_port,
        over: args.over,
        remote_nuvec: args.remote_nuvec.clone(),
        pings: args.pings,
        runner: Runner::default(),
    });
    if args.json {
        match serde_json::to_string_pretty(&json!({
            "ok": !report.failed(),
            "findings": report.findings,
        })) {
            Ok(text) => println!("{text}"),
            Err(e) => return fail(e.to_string()),
        }
    } else {
        print!("{}", report.table());
    }
    let mut status = if report.failed() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    };
    type Writer = fn(&Report) -> Result<String, String>;
    let writes: [(&Option<PathBuf>, Writer); 2] = [
        (&args.write_hostfile, ring_hostfile),
        (&args.write_jaccl, jaccl_hostfile),
    ];
    for (path, make) in writes {
        let Some(path) = path else { continue };
        match make(&report).and_then(|text| write(path, &text)) {
            Ok(()) => eprintln!("nuvec doctor: wrote {}", path.display()),
            Err(e) => {
                eprintln!("nuvec doctor: not writing {}: {e}", path.display());
                status = ExitCode::FAILURE;
            }
        }
    }
    status
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, format!("{text}\n")).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> String {
        let path = format!("{}/tests/data/doctor/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// What PROBE_SCRIPT prints on a Mac (the fixtures' layouts), with `en2` at `tb_ip`.
    fn mac_output(tb_ip: &str, thunderbolt: &str) -> String {
        format!(
            "@@uname\nDarwin arm64\n@@ifconfig\n{}@@route\n  interface: en0\n@@hwports\n{}\
             @@thunderbolt\n{}@@ibv\n{}",
            fixture("ifconfig-macos.txt").replace("inet 192.168.0.1 ", &format!("inet {tb_ip} ")),
            fixture("networksetup.txt"),
            fixture(thunderbolt),
            fixture("ibv_devinfo.txt"),
        )
    }

    fn host(ssh: &str, ips: &[&str]) -> Host {
        Host {
            ssh: ssh.into(),
            ips: ips.iter().map(|s| s.to_string()).collect(),
            rdma: Vec::new(),
        }
    }

    fn rows<'a>(f: &'a Findings, check: &str) -> Vec<&'a Finding> {
        f.0.iter()
            .map(|(_, x)| x)
            .filter(|x| x.check == check)
            .collect()
    }

    #[test]
    fn a_mac_with_thunderbolt_in_the_bridge() {
        let facts = HostFacts::parse(&mac_output("192.168.0.1", "system-profiler-tb5.txt"));
        assert_eq!(
            (facts.os.as_str(), facts.arch.as_str()),
            ("Darwin", "arm64")
        );
        assert_eq!(facts.default_interface.as_deref(), Some("en0"));
        assert_eq!(facts.rdma.as_ref().map(Vec::len), Some(2));
        let mut f = Findings(Vec::new());
        thunderbolt_checks(&mut f, "0 (a)", &facts, false);
        let tb = rows(&f, "thunderbolt");
        assert_eq!(tb[0].verdict, Verdict::Ok);
        assert!(
            tb[0]
                .detail
                .contains("en2 (Thunderbolt 1): 192.168.0.1/30 mtu 1500")
                && tb[0].detail.contains("en3 (Thunderbolt 2): no IPv4")
                && tb[0].detail.contains("Thunderbolt 5 (80 Gb/s)"),
            "{}",
            tb[0].detail
        );
        let bridge = rows(&f, "bridge");
        assert_eq!(bridge[0].verdict, Verdict::Warn);
        assert!(bridge[0].detail.contains("en2 in bridge0, en3 in bridge0"));
        assert!(
            bridge[0]
                .fix
                .as_deref()
                .unwrap()
                .contains("sudo ifconfig bridge0 deletem en2; sudo ifconfig bridge0 deletem en3")
        );

        // TB4 with RDMA devices: RDMA will not work there.
        let tb4 = HostFacts::parse(&mac_output("192.168.0.1", "system-profiler-tb4.txt"));
        let mut f = Findings(Vec::new());
        thunderbolt_checks(&mut f, "0 (a)", &tb4, true);
        let tb = rows(&f, "thunderbolt");
        assert_eq!(tb[0].verdict, Verdict::Warn);
        assert!(tb[0].detail.contains("Thunderbolt 4 or older (40 Gb/s)"));
        assert!(tb[0].fix.as_deref().unwrap().contains("Thunderbolt 5"));

        // --over thunderbolt picks the Thunderbolt ports' IPv4 addresses.
        let mut f = Findings(Vec::new());
        let chosen = choose_addresses(
            &mut f,
            "0 (a)",
            &host("a", &[]),
            &facts,
            Some(Over::Thunderbolt),
        );
        assert_eq!(chosen, [Some("192.168.0.1".parse().unwrap())]);
        // Without addresses or --over: the default route's interface.
        let chosen = choose_addresses(&mut f, "0 (a)", &host("a", &[]), &facts, None);
        assert_eq!(chosen, [Some("192.168.1.23".parse().unwrap())]);
        // A Linux host cannot go over Thunderbolt.
        let linux = HostFacts::parse(&format!(
            "@@uname\nLinux x86_64\n@@ipaddr\n{}",
            fixture("ip-addr.json")
        ));
        let mut f = Findings(Vec::new());
        assert!(
            choose_addresses(
                &mut f,
                "1 (b)",
                &host("b", &[]),
                &linux,
                Some(Over::Thunderbolt)
            )
            .is_empty()
        );
        assert_eq!(rows(&f, "address")[0].verdict, Verdict::Fail);
        let mut f = Findings(Vec::new());
        thunderbolt_checks(&mut f, "1 (b)", &linux, false);
        assert!(
            f.0.iter()
                .all(|(_, x)| x.verdict == Verdict::Skipped && x.detail == "not macOS (Linux)")
        );
    }

    #[test]
    fn rdma_devices_named_by_the_hostfile_must_be_active() {
        let facts = HostFacts::parse(&mac_output("192.168.0.1", "system-profiler-tb5.txt"));
        let check = |rdma: Vec<Option<launch::RdmaCell>>| {
            let h = Host {
                rdma,
                ..host("a", &["192.168.1.23"])
            };
            let mut f = Findings(Vec::new());
            rdma_check(&mut f, "0 (a)", &h, &facts, true);
            f.0.remove(0).1
        };
        let ok = check(vec![
            None,
            Some(launch::RdmaCell::Device("rdma_en2".into())),
        ]);
        assert_eq!(ok.verdict, Verdict::Ok, "{ok:?}");
        assert_eq!(
            ok.detail,
            "rdma_en2 (port 1 PORT_ACTIVE; JACCL uses port 1); rdma_en3 (port 1 PORT_DOWN)"
        );
        let down = check(vec![
            None,
            Some(launch::RdmaCell::Devices(vec![
                "rdma_en3".into(),
                "rdma_en9".into(),
            ])),
        ]);
        assert_eq!(down.verdict, Verdict::Fail);
        assert!(
            down.detail
                .starts_with("rdma_en3 has no active port, rdma_en9 does not exist"),
            "{}",
            down.detail
        );
        // No ibv_devinfo at all: a failure when the hostfile wants JACCL, else skipped.
        let mut bare = facts.clone();
        bare.rdma = None;
        let mut f = Findings(Vec::new());
        rdma_check(&mut f, "0 (a)", &host("a", &[]), &bare, true);
        assert_eq!(f.0[0].1.verdict, Verdict::Fail);
        assert!(f.0[0].1.fix.as_deref().unwrap().contains("rdma_ctl enable"));
        let mut f = Findings(Vec::new());
        rdma_check(&mut f, "0 (a)", &host("a", &[]), &bare, false);
        assert_eq!(f.0[0].1.verdict, Verdict::Skipped);
    }

    fn report_of(facts: Vec<Option<HostFacts>>) -> Report {
        let hosts = facts
            .into_iter()
            .enumerate()
            .map(|(i, facts)| HostReport {
                host: host(&format!("mac{i}"), &[]),
                facts,
                addresses: vec![(
                    format!("10.0.0.{}", i + 1).parse().unwrap(),
                    40000 + i as u16,
                )],
                usable: vec![true],
                reached: vec![true],
            })
            .collect();
        Report {
            findings: Vec::new(),
            hosts,
            jaccl: true,
        }
    }

    #[test]
    fn the_jaccl_hostfile_follows_the_cables_subnets() {
        let a = HostFacts::parse(&mac_output("192.168.0.1", "system-profiler-tb5.txt"));
        let b = HostFacts::parse(&mac_output("192.168.0.2", "system-profiler-tb5.txt"));
        let text = jaccl_hostfile(&report_of(vec![Some(a.clone()), Some(b)])).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["backend"], "jaccl");
        assert_eq!(v["hosts"][0]["rdma"], json!([null, "rdma_en2"]));
        assert_eq!(v["hosts"][1]["rdma"], json!(["rdma_en2", null]));
        assert_eq!(v["hosts"][0]["ips"], json!(["10.0.0.1"]));
        // The file reads back as a launchable JACCL hostfile.
        let list = HostList::parse_hostfile(&text).unwrap();
        let spec = launch::LaunchSpec::new(vec!["prog".into()]);
        assert!(launch::plan(&spec, &list, (0, 0)).is_ok());

        // Not on a shared subnet: no link, and the error names both hosts.
        let far = HostFacts::parse(&mac_output("192.168.7.2", "system-profiler-tb5.txt"));
        let err = jaccl_hostfile(&report_of(vec![Some(a.clone()), Some(far)])).unwrap_err();
        assert!(err.contains("rank 0 (mac0) and rank 1 (mac1)"), "{err}");
        // A host without RDMA devices.
        let mut none = a.clone();
        none.rdma = Some(Vec::new());
        let err = jaccl_hostfile(&report_of(vec![Some(a), Some(none)])).unwrap_err();
        assert!(err.contains("rank 1 (mac1) has no RDMA device"), "{err}");
    }

    #[test]
    fn the_ring_hostfile_takes_verified_addresses_only() {
        let mut r = report_of(vec![None, None]);
        let text = ring_hostfile(&r).unwrap();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&text).unwrap(),
            json!([{"ssh": "mac0", "ips": ["10.0.0.1"]}, {"ssh": "mac1", "ips": ["10.0.0.2"]}])
        );
        assert!(
            text.find("\"ssh\"") < text.find("\"ips\""),
            "MLX's field order"
        );
        r.hosts[1].reached[0] = false;
        let err = ring_hostfile(&r).unwrap_err();
        assert!(
            err.contains("rank 1 (mac1) has no verified address"),
            "{err}"
        );
    }

    #[test]
    fn the_table_has_a_row_per_finding_and_a_fix_per_problem() {
        let mut f = Findings(Vec::new());
        f.push("1 -> 0", "link", Verdict::Ok, "fine".into());
        f.problem(
            "1 (b)",
            "port",
            Verdict::Fail,
            "in use".into(),
            "free it".into(),
        );
        f.push("0 (a)", "ssh", Verdict::Ok, "works".into());
        let report = Report {
            findings: f.into_sorted(),
            hosts: Vec::new(),
            jaccl: false,
        };
        let table = report.table();
        let lines: Vec<&str> = table.lines().collect();
        assert!(
            lines[0].starts_with("HOST/LINK  CHECK  VERDICT  DETAIL"),
            "{table}"
        );
        assert!(
            lines[1].starts_with("0 (a)")
                && lines[2].starts_with("1 (b)")
                && lines[3].starts_with("1 -> 0"),
            "{table}"
        );
        assert!(
            lines[2].contains("FAIL") && lines[2].ends_with("free it"),
            "{table}"
        );
        assert!(
            table.ends_with("2 ok, 0 warnings, 1 failed, 0 skipped\n"),
            "{table}"
        );
        assert!(report.failed());
    }
}
