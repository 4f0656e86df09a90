//! What `nuvec bench` reports: a header saying where and how it measured, nccl-tests'
//! table for each system measured (nuvec and the anchors), and, when anchors ran too, per
//! op and rank count nuvec's median latency and bus bandwidth beside MLX's ring, Open MPI
//! over TCP and the raw TCP limits, with ratios; and one JSON document with everything.
//!
//! Ratios: for latency, anchor / nuvec (above 1, nuvec is faster) — for the TCP limit that
//! is the share of the floor reached (1 is at the floor); for bandwidth, nuvec's bus
//! bandwidth / the bidirectional stream's per-direction bandwidth (1 is at the limit).
//! The latency limit is the raw ping-pong: one way (half the round trip) beside sendrecv,
//! which is measured the same way, and the round trip beside the collectives, whose
//! smallest case (a 2-rank all_sum) needs at least one exchange. It bounds small messages
//! only: a ping-pong sends a whole large message each way in turn, which a collective
//! does not have to do.

use std::collections::BTreeSet;

use nuvec_distributed_engine::DType;
use serde::{Deserialize, Serialize};

use crate::anchors::{AnchorRun, Limits};
use crate::bench::{Measurement, Op, RedOp, human, micros};

/// Where and how a run measured: printed above the tables, kept in the JSON.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Header {
    /// The host's name.
    pub host: String,
    /// The CPU model and how many CPUs this process may use.
    pub cpu: String,
    /// The kernel: its name and release.
    pub kernel: String,
    /// The SIMD level reductions use (`nuvec_distributed_engine::simd_level`).
    pub simd: String,
    /// The bytes on the wire: `mlx`, MLX's ring format, or `native`, nuvec's own.
    pub wire: String,
    /// What carried them, link by link, as the ranks of each run reported it after their
    /// group formed ([`nuvec_distributed_engine::Group::transport`], see [`describe_links`]):
    /// empty until a run reported, then each run's description (prefixed by its rank count
    /// when several ran).
    pub transport: String,
    /// Connections between neighbouring ranks.
    pub connections: usize,
    /// The TCP congestion control of those connections, and where it comes from.
    pub congestion: String,
    /// What else used the machine just before the run ([`crate::load::Load::text`]);
    /// empty until [`Header::set_load`].
    #[serde(default)]
    pub load: String,
    /// The warning when other work kept the machine busy ([`crate::load::Load::warning`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_warning: Option<String>,
}

impl Header {
    /// This machine's header for a ring of `connections` connections per neighbour on
    /// `wire`, with the congestion control the ranks will use (they inherit this
    /// environment).
    pub fn detect(connections: usize, wire: nuvec_distributed_engine::Backend) -> Self {
        let uname = nix::sys::utsname::uname().ok();
        let text = |f: fn(&nix::sys::utsname::UtsName) -> &std::ffi::OsStr| {
            uname
                .as_ref()
                .map(|u| f(u).to_string_lossy().into_owned())
                .unwrap_or_else(|| "unknown".into())
        };
        let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
        let congestion_var = nuvec_distributed_engine::TCP_CONGESTION_VAR;
        let congestion = match std::env::var(congestion_var) {
            Ok(name) if !name.trim().is_empty() => format!("{} ({congestion_var})", name.trim()),
            _ => match std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control") {
                Ok(name) if !name.trim().is_empty() => {
                    format!("{} (system default)", name.trim())
                }
                _ => "system default".into(),
            },
        };
        Self {
            host: text(|u| u.nodename()),
            cpu: format!("{} ({cpus} CPUs)", cpu_model()),
            kernel: format!("{} {}", text(|u| u.sysname()), text(|u| u.release())),
            simd: nuvec_distributed_engine::simd_level().into(),
            wire: crate::wire_name(wire).into(),
            transport: String::new(),
            connections,
            congestion,
            load: String::new(),
            load_warning: None,
        }
    }

    /// Records what else used the machine, and the warning if it was loaded.
    pub fn set_load(&mut self, load: &crate::load::Load) {
        self.load = load.text();
        self.load_warning = load.warning();
    }

    /// The header as comment lines, as nccl-tests starts its output.
    pub fn text(&self) -> String {
        let fields = [
            ("host", self.host.clone()),
            ("cpu", self.cpu.clone()),
            ("kernel", self.kernel.clone()),
            ("simd", self.simd.clone()),
            ("wire", self.wire.clone()),
            ("transport", self.transport.clone()),
            ("connections", format!("{} per neighbour", self.connections)),
            ("congestion", self.congestion.clone()),
            ("load", self.load.clone()),
            ("WARNING", self.load_warning.clone().unwrap_or_default()),
        ];
        // The transport is known only once the ranks formed their group: each run's
        // tables start with it, and the JSON header holds every run's.
        fields
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| format!("# {k:<12} {v}\n"))
            .collect()
    }

    /// Records what each run's ranks reported about their links.
    pub fn set_transport(&mut self, runs: &[NuvecRun]) {
        let reported: Vec<&NuvecRun> = runs.iter().filter(|r| !r.transport.is_empty()).collect();
        self.transport = match reported.as_slice() {
            [one] => one.transport.clone(),
            many => many
                .iter()
                .map(|r| format!("n={}: {}", r.ranks, r.transport))
                .collect::<Vec<_>>()
                .join("; "),
        };
    }
}

/// A transport as one byte, for the ranks to gather (`transport_of` reads it back).
pub fn transport_code(t: nuvec_distributed_engine::Transport) -> u8 {
    use nuvec_distributed_engine::Transport as T;
    match t {
        T::Local => 0,
        T::Tcp => 1,
        T::SharedMemory => 2,
        T::Rdma => 3,
        _ => 255,
    }
}

/// The transport `transport_code` made `code` of.
pub fn transport_of(code: u8) -> nuvec_distributed_engine::Transport {
    use nuvec_distributed_engine::Transport as T;
    match code {
        0 => T::Local,
        1 => T::Tcp,
        2 => T::SharedMemory,
        3 => T::Rdma,
        _ => T::Unknown,
    }
}

/// Names what carried each link of a group, from every rank's report of its own links
/// (`links[r][p]`: what rank `r` says carries its link to rank `p`), all on `hosts`
/// hosts: `shared memory (every link, ranks 0-3, one host)` when every link agrees, and
/// otherwise each transport with the ranks it joins (shared-memory links grouped into the
/// sets of ranks they connect). Two ranks that disagree about their link are named.
pub fn describe_links(links: &[Vec<nuvec_distributed_engine::Transport>], hosts: &str) -> String {
    use nuvec_distributed_engine::Transport as T;
    let size = links.len();
    if size < 2 {
        return format!("none (one rank, {hosts})");
    }
    let mut kinds: Vec<T> = Vec::new();
    let mut disagree = Vec::new();
    for a in 0..size {
        for b in a + 1..size {
            let (x, y) = (link(links, a, b), link(links, b, a));
            if x != y {
                disagree.push(format!("ranks {a} and {b} disagree ({x} / {y})"));
            }
            if !kinds.contains(&x) {
                kinds.push(x);
            }
        }
    }
    let ranks = format!("ranks 0-{}", size - 1);
    let mut out = match kinds.as_slice() {
        [one] => format!("{one} (every link, {ranks}, {hosts})"),
        _ => {
            let mut parts = Vec::new();
            for kind in &kinds {
                if *kind == T::SharedMemory {
                    // Sets of ranks joined by shared memory: one host each.
                    let mut set: Vec<usize> = (0..size).collect();
                    fn root(set: &mut [usize], i: usize) -> usize {
                        let mut i = i;
                        while set[i] != i {
                            i = set[i];
                        }
                        i
                    }
                    for a in 0..size {
                        for b in a + 1..size {
                            if link(links, a, b) == T::SharedMemory {
                                let (ra, rb) = (root(&mut set, a), root(&mut set, b));
                                set[ra.max(rb)] = ra.min(rb);
                            }
                        }
                    }
                    let mut groups: Vec<Vec<usize>> = Vec::new();
                    for r in 0..size {
                        let g = root(&mut set, r);
                        match groups.iter_mut().find(|x| root(&mut set, x[0]) == g) {
                            Some(x) => x.push(r),
                            None => groups.push(vec![r]),
                        }
                    }
                    let within: Vec<String> = groups
                        .iter()
                        .filter(|g| g.len() > 1)
                        .map(|g| format!("{g:?}"))
                        .collect();
                    parts.push(format!(
                        "shared memory within ranks {}",
                        within.join(" and ")
                    ));
                } else {
                    let mut pairs = Vec::new();
                    for a in 0..size {
                        for b in a + 1..size {
                            if link(links, a, b) == *kind {
                                pairs.push(format!("{a}-{b}"));
                            }
                        }
                    }
                    parts.push(format!("{kind} between ranks {}", pairs.join(", ")));
                }
            }
            format!("{} ({ranks}, {hosts})", parts.join("; "))
        }
    };
    if !disagree.is_empty() {
        out.push_str(&format!("; {}", disagree.join(", ")));
    }
    out
}

/// What carries each of the group's links, as every rank reports its own after the group
/// formed (gathered, so every rank sees every link from both ends), described for the
/// header ([`describe_links`]): every rank of a bench runs on this host. A collective:
/// every rank calls it.
///
/// # Errors
///
/// The gathering failed.
pub fn gather_links(
    group: &nuvec_distributed_engine::Group,
) -> nuvec_distributed_engine::Result<String> {
    let size = group.size();
    let mine = (0..size)
        .map(|p| group.transport(p).map(transport_code))
        .collect::<nuvec_distributed_engine::Result<Vec<u8>>>()?;
    let mut all = vec![0u8; size * size];
    group.all_gather(&mine, &mut all)?;
    let links: Vec<Vec<nuvec_distributed_engine::Transport>> = all
        .chunks(size)
        .map(|row| row.iter().map(|&c| transport_of(c)).collect())
        .collect();
    Ok(describe_links(&links, "one host"))
}

/// What rank `a` reported about its link to rank `b` (unknown if it did not).
fn link(
    links: &[Vec<nuvec_distributed_engine::Transport>],
    a: usize,
    b: usize,
) -> nuvec_distributed_engine::Transport {
    links
        .get(a)
        .and_then(|row| row.get(b))
        .copied()
        .unwrap_or(nuvec_distributed_engine::Transport::Unknown)
}

/// The CPU's model name, or `unknown`.
fn cpu_model() -> String {
    let linux = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .filter_map(|l| l.split_once(':'))
                .find(|(k, _)| matches!(k.trim(), "model name" | "Model" | "cpu model"))
                .map(|(_, v)| v.trim().to_string())
        });
    let macos = || {
        std::process::Command::new("sysctl")
            .args(["-n", "machdep.cpu.brand_string"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    linux
        .or_else(macos)
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// One row of nccl-tests' table.
#[derive(Clone, Debug, PartialEq)]
pub struct Line {
    /// Bytes per rank.
    pub bytes: usize,
    /// Elements per rank.
    pub count: usize,
    /// The dtype's name.
    pub dtype: String,
    /// The reduction, or `none`.
    pub redop: String,
    /// The median, µs.
    pub time_us: f64,
    /// Algorithm bandwidth, GB/s.
    pub algbw_gbs: f64,
    /// Bus bandwidth, GB/s.
    pub busbw_gbs: f64,
    /// Wrong elements; `None` when a system said its results were wrong without counting.
    pub wrong: Option<u64>,
}

impl From<&Measurement> for Line {
    fn from(m: &Measurement) -> Self {
        Self {
            bytes: m.bytes,
            count: m.count,
            dtype: m.dtype.name().into(),
            redop: m.redop.map_or("none", RedOp::name).into(),
            time_us: m.median_us,
            algbw_gbs: m.algbw_gbs,
            busbw_gbs: m.busbw_gbs,
            wrong: Some(m.wrong),
        }
    }
}

/// The columns: size (B), count (elements), type, redop, time (µs), algbw and busbw
/// (GB/s), #wrong — as nccl-tests prints them.
fn columns(cells: [&str; 8]) -> String {
    let [size, count, dtype, redop, time, algbw, busbw, wrong] = cells;
    format!(
        "{size:>12} {count:>12} {dtype:>10} {redop:>6} {time:>10} {algbw:>8} {busbw:>8} {wrong:>7}"
    )
}

/// One table: the title, the column heads, a row per line and the totals.
pub fn table(title: &str, lines: &[Line]) -> String {
    let head = |cells: [&str; 8]| {
        // The first column is right-aligned, so its first character is always free.
        let mut line = columns(cells);
        line.replace_range(..1, "#");
        line.trim_end().to_string()
    };
    let mut out = format!("# {title}\n");
    out.push_str(&head([
        "size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong",
    ]));
    out.push('\n');
    out.push_str(&head([
        "(B)",
        "(elements)",
        "",
        "",
        "(µs)",
        "(GB/s)",
        "(GB/s)",
        "",
    ]));
    out.push('\n');
    for l in lines {
        let wrong = l.wrong.map_or(">0".into(), |w| w.to_string());
        out.push_str(&columns([
            &l.bytes.to_string(),
            &l.count.to_string(),
            &l.dtype,
            &l.redop,
            &micros(l.time_us),
            &format!("{:.2}", l.algbw_gbs),
            &format!("{:.2}", l.busbw_gbs),
            &wrong,
        ]));
        out.push('\n');
    }
    if !lines.is_empty() {
        let avg = lines.iter().map(|l| l.busbw_gbs).sum::<f64>() / lines.len() as f64;
        let wrong: Option<u64> = lines.iter().map(|l| l.wrong).sum();
        let verdict = match wrong {
            Some(0) => "0 (OK)".to_string(),
            Some(n) => format!("{n} (FAILED)"),
            None => "some (FAILED)".to_string(),
        };
        out.push_str(&format!("# wrong elements    : {verdict}\n"));
        out.push_str(&format!("# avg bus bandwidth : {avg:.3} GB/s\n"));
    }
    out
}

/// The library calls a table of `op` covers, e.g. `all_sum, all_max`, in the order given.
fn calls(op: Op, redops: &[&'static str]) -> String {
    if op != Op::AllSum {
        return op.name().into();
    }
    let names: Vec<String> = redops.iter().map(|r| format!("all_{r}")).collect();
    if names.is_empty() {
        op.name().into()
    } else {
        names.join(", ")
    }
}

/// nuvec's tables for one rank count, one per collective.
pub fn nuvec_tables(run: &NuvecRun) -> String {
    named_tables(run, "nuvec")
}

/// [`nuvec_tables`] under another series name in each title (`nuvec sealed` for the keyed
/// series of `nuvec bench --sealed`).
pub fn named_tables(run: &NuvecRun, name: &str) -> String {
    let mut out = String::new();
    if !run.transport.is_empty() {
        out.push_str(&format!("\n# {:<12} {}\n", "transport", run.transport));
    }
    for op in Op::ALL {
        let ms: Vec<&Measurement> = run.measurements.iter().filter(|m| m.op == op).collect();
        if ms.is_empty() {
            continue;
        }
        let mut redops: Vec<&str> = Vec::new();
        for name in ms.iter().filter_map(|m| m.redop.map(RedOp::name)) {
            if !redops.contains(&name) {
                redops.push(name);
            }
        }
        let lines: Vec<Line> = ms.into_iter().map(Line::from).collect();
        out.push('\n');
        out.push_str(&table(
            &format!("{name}, {} ranks: {}", run.ranks, calls(op, &redops)),
            &lines,
        ));
    }
    out
}

/// An anchor's tables, one per collective: its sweeps are float32, and sum for all_sum.
pub fn anchor_tables(run: &AnchorRun) -> String {
    let mut out = String::new();
    let version = run
        .version
        .as_deref()
        .map(|v| format!(" {v}"))
        .unwrap_or_default();
    for op in Op::ALL {
        let lines: Vec<Line> = run
            .points
            .iter()
            .filter(|p| p.op == op)
            .map(|p| Line {
                bytes: p.bytes,
                count: p.bytes / DType::F32.size(),
                dtype: DType::F32.name().into(),
                redop: if op.reduces() { "sum" } else { "none" }.into(),
                time_us: p.median_us,
                algbw_gbs: p.algbw_gbs,
                busbw_gbs: p.busbw_gbs,
                // The anchors check every element and say only whether all were exact.
                wrong: p.correct.then_some(0),
            })
            .collect();
        if lines.is_empty() {
            continue;
        }
        out.push('\n');
        out.push_str(&table(
            &format!(
                "{}{version}, {} ranks: {}",
                run.system,
                run.ranks,
                op.name()
            ),
            &lines,
        ));
    }
    out
}

/// nuvec's sweep for one number of ranks.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NuvecRun {
    /// Ranks.
    pub ranks: usize,
    /// What carried each link, as the ranks reported it ([`describe_links`]); empty if
    /// they did not.
    #[serde(default)]
    pub transport: String,
    /// What rank 0 reported.
    pub measurements: Vec<Measurement>,
}

/// One (op, ranks, size) compared.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// The collective.
    pub op: Op,
    /// Ranks.
    pub ranks: usize,
    /// Bytes per rank.
    pub bytes: usize,
    /// nuvec's median, µs.
    pub nuvec_median_us: f64,
    /// nuvec's bus bandwidth, GB/s.
    pub nuvec_busbw_gbs: f64,
    /// MLX ring's median, µs.
    pub mlx_median_us: Option<f64>,
    /// MLX / nuvec latency.
    pub mlx_over_nuvec: Option<f64>,
    /// MLX ring's bus bandwidth, GB/s.
    pub mlx_busbw_gbs: Option<f64>,
    /// Open MPI's median, µs.
    pub mpi_median_us: Option<f64>,
    /// MPI / nuvec latency.
    pub mpi_over_nuvec: Option<f64>,
    /// Open MPI's bus bandwidth, GB/s.
    pub mpi_busbw_gbs: Option<f64>,
    /// The raw TCP latency for this row (one way for sendrecv, else the round trip), µs.
    pub tcp_latency_us: Option<f64>,
    /// TCP limit / nuvec latency.
    pub tcp_over_nuvec: Option<f64>,
    /// The bidirectional stream, GB/s per direction.
    pub stream_limit_gbs: Option<f64>,
    /// nuvec's bus bandwidth / the stream limit.
    pub nuvec_over_limit: Option<f64>,
}

/// Everything one `nuvec bench` run measured.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Report {
    /// Where and how it was measured.
    pub header: Option<Header>,
    /// nuvec, per rank count.
    pub nuvec: Vec<NuvecRun>,
    /// MLX's ring, per rank count.
    pub mlx: Vec<AnchorRun>,
    /// Open MPI over TCP, per rank count.
    pub mpi: Vec<AnchorRun>,
    /// The raw TCP limits.
    pub limits: Option<Limits>,
    /// The comparison, row by row.
    pub comparison: Vec<Row>,
}

impl Report {
    /// Fills [`Report::comparison`] from the measurements.
    pub fn compare(&mut self) {
        self.comparison = compare(&self.nuvec, &self.mlx, &self.mpi, self.limits.as_ref());
    }

    /// Whether anything besides nuvec was measured.
    pub fn has_anchors(&self) -> bool {
        !self.mlx.is_empty() || !self.mpi.is_empty() || self.limits.is_some()
    }
}

/// One row per nuvec measurement the anchors can be set beside (float32, and sum for the
/// all-reduce: what their sweeps measure), with what they measured at the same op, ranks
/// and size.
pub fn compare(
    nuvec: &[NuvecRun],
    mlx: &[AnchorRun],
    mpi: &[AnchorRun],
    limits: Option<&Limits>,
) -> Vec<Row> {
    let ratio = |a: Option<f64>, b: f64| a.filter(|_| b > 0.0).map(|a| a / b);
    let mut rows = Vec::new();
    for run in nuvec {
        let find = |runs: &[AnchorRun], m: &Measurement| {
            runs.iter()
                .find(|r| r.ranks == run.ranks)
                .and_then(|r| r.point(m.op, m.bytes))
                .cloned()
        };
        let comparable =
            |m: &&Measurement| m.dtype == DType::F32 && matches!(m.redop, None | Some(RedOp::Sum));
        for m in run.measurements.iter().filter(comparable) {
            let mlx = find(mlx, m);
            let mpi = find(mpi, m);
            let tcp = limits.and_then(|l| l.pingpong(m.bytes)).map(|p| {
                if m.op == Op::SendRecv {
                    p.rtt_median_us / 2.0
                } else {
                    p.rtt_median_us
                }
            });
            let stream = limits
                .and_then(|l| l.stream.as_ref())
                .map(|s| s.gbps_per_direction);
            rows.push(Row {
                op: m.op,
                ranks: run.ranks,
                bytes: m.bytes,
                nuvec_median_us: m.median_us,
                nuvec_busbw_gbs: m.busbw_gbs,
                mlx_median_us: mlx.as_ref().map(|p| p.median_us),
                mlx_over_nuvec: ratio(mlx.as_ref().map(|p| p.median_us), m.median_us),
                mlx_busbw_gbs: mlx.as_ref().map(|p| p.busbw_gbs),
                mpi_median_us: mpi.as_ref().map(|p| p.median_us),
                mpi_over_nuvec: ratio(mpi.as_ref().map(|p| p.median_us), m.median_us),
                mpi_busbw_gbs: mpi.as_ref().map(|p| p.busbw_gbs),
                tcp_latency_us: tcp,
                tcp_over_nuvec: ratio(tcp, m.median_us),
                stream_limit_gbs: stream,
                nuvec_over_limit: stream.filter(|&s| s > 0.0).map(|s| m.busbw_gbs / s),
            });
        }
    }
    rows
}

/// The comparison as text tables, one per (op, ranks); only the columns of anchors that
/// ran.
pub fn comparison_table(rows: &[Row]) -> String {
    let has = |f: fn(&Row) -> bool| rows.iter().any(f);
    let (mlx, mpi) = (
        has(|r| r.mlx_median_us.is_some()),
        has(|r| r.mpi_median_us.is_some()),
    );
    let (tcp, stream) = (
        has(|r| r.tcp_latency_us.is_some()),
        has(|r| r.stream_limit_gbs.is_some()),
    );
    let mut out = String::new();
    let groups: BTreeSet<(usize, usize)> = rows.iter().map(|r| (op_order(r.op), r.ranks)).collect();
    for (order, ranks) in groups {
        let group: Vec<&Row> = rows
            .iter()
            .filter(|r| op_order(r.op) == order && r.ranks == ranks)
            .collect();
        let op = group[0].op;
        out.push_str(&format!(
            "\n{op}, {ranks} ranks, float32: median latency (µs) and bus bandwidth (GB/s) against \
             the anchors\n"
        ));
        let mut head = format!("{:>8} {:>10}", "size", "nuvec");
        if mlx {
            head.push_str(&format!(" {:>10} {:>6}", "mlx", "x"));
        }
        if mpi {
            head.push_str(&format!(" {:>10} {:>6}", "mpi", "x"));
        }
        if tcp {
            let name = if op == Op::SendRecv {
                "tcp 1-way"
            } else {
                "tcp rtt"
            };
            head.push_str(&format!(" {name:>10} {:>6}", "x"));
        }
        head.push_str(&format!(" | {:>8}", "nuvec"));
        if mlx {
            head.push_str(&format!(" {:>8}", "mlx"));
        }
        if mpi {
            head.push_str(&format!(" {:>8}", "mpi"));
        }
        if stream {
            head.push_str(&format!(" {:>8}", "of limit"));
        }
        out.push_str(&head);
        out.push('\n');
        for r in group {
            let lat = |v: Option<f64>| v.map(micros).unwrap_or_else(|| "-".into());
            let x = |v: Option<f64>| v.map(|v| format!("{v:.2}")).unwrap_or_else(|| "-".into());
            let bw = |v: Option<f64>| v.map(|v| format!("{v:.3}")).unwrap_or_else(|| "-".into());
            let mut line = format!("{:>8} {:>10}", human(r.bytes), micros(r.nuvec_median_us));
            if mlx {
                line.push_str(&format!(
                    " {:>10} {:>6}",
                    lat(r.mlx_median_us),
                    x(r.mlx_over_nuvec)
                ));
            }
            if mpi {
                line.push_str(&format!(
                    " {:>10} {:>6}",
                    lat(r.mpi_median_us),
                    x(r.mpi_over_nuvec)
                ));
            }
            if tcp {
                line.push_str(&format!(
                    " {:>10} {:>6}",
                    lat(r.tcp_latency_us),
                    x(r.tcp_over_nuvec)
                ));
            }
            line.push_str(&format!(" | {:>8}", bw(Some(r.nuvec_busbw_gbs))));
            if mlx {
                line.push_str(&format!(" {:>8}", bw(r.mlx_busbw_gbs)));
            }
            if mpi {
                line.push_str(&format!(" {:>8}", bw(r.mpi_busbw_gbs)));
            }
            if stream {
                line.push_str(&format!(" {:>8}", x(r.nuvec_over_limit)));
            }
            out.push_str(&line);
            out.push('\n');
        }
    }
    let mut notes = Vec::new();
    if mlx || mpi {
        notes.push("x after an anchor: its latency / nuvec's (above 1: nuvec is faster)");
    }
    if tcp {
        notes.push(
            "x after tcp: raw TCP ping-pong latency at the same size / nuvec's (1: at that \
             floor; a floor for small messages only, since a ping-pong sends the whole \
             message each way in turn)",
        );
    }
    if stream {
        notes.push("of limit: nuvec's bus bandwidth / raw TCP both ways at once, per direction");
    }
    if let Some(s) = rows.iter().find_map(|r| r.stream_limit_gbs) {
        out.push_str(&format!("\nTCP stream limit: {s:.3} GB/s per direction\n"));
    }
    for note in notes {
        out.push_str(note);
        out.push('\n');
    }
    out
}

fn op_order(op: Op) -> usize {
    [Op::AllSum, Op::AllGather, Op::SumScatter, Op::SendRecv]
        .iter()
        .position(|&o| o == op)
        .unwrap_or(usize::MAX)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::anchors::{AnchorPoint, PingPong, Stream};

    /// Raw TCP limits for the tests: a 4 B round trip of 8 µs (7 to 9, at best 6), and a
    /// 64 MiB bidirectional stream of `time_ms_median` at `gbps_per_direction` (1.4 at
    /// best).
    pub(crate) fn limits(time_ms_median: f64, gbps_per_direction: f64) -> Limits {
        Limits {
            pingpong: vec![PingPong {
                bytes: 4,
                iters: 1000,
                rtt_median_us: 8.0,
                rtt_p10_us: 7.0,
                rtt_p90_us: 9.0,
                rtt_min_us: 6.0,
            }],
            stream: Some(Stream {
                bytes: 64 << 20,
                reps: 20,
                bidir: true,
                time_ms_median,
                gbps_per_direction,
                gbps_best: 1.4,
            }),
        }
    }

    pub(crate) fn measurement(
        op: Op,
        ranks: usize,
        bytes: usize,
        median_us: f64,
        busbw_gbs: f64,
    ) -> Measurement {
        Measurement {
            op,
            redop: op.reduces().then_some(RedOp::Sum),
            dtype: DType::F32,
            ranks,
            bytes,
            count: bytes / 4,
            iters: 100,
            min_us: median_us,
            median_us,
            p99_us: median_us,
            max_us: median_us,
            algbw_gbs: busbw_gbs,
            busbw_gbs,
            wrong: 0,
        }
    }

    fn point(op: Op, bytes: usize, median_us: f64, busbw_gbs: f64) -> AnchorPoint {
        AnchorPoint {
            op,
            bytes,
            iters: 100,
            median_us,
            algbw_gbs: busbw_gbs,
            busbw_gbs,
            correct: true,
        }
    }

    fn sample() -> Report {
        let mut report = Report {
            header: None,
            nuvec: vec![NuvecRun {
                ranks: 2,
                transport: "tcp (every link, ranks 0-1, one host)".into(),
                measurements: vec![
                    measurement(Op::AllSum, 2, 4, 10.0, 0.0004),
                    measurement(Op::AllSum, 2, 64 << 20, 80_000.0, 0.8),
                    measurement(Op::SendRecv, 2, 4, 5.0, 0.0008),
                ],
            }],
            mlx: vec![AnchorRun {
                system: "mlx-ring".into(),
                ranks: 2,
                version: Some("0.32.4".into()),
                eval_overhead_us: Some(20.0),
                points: vec![point(Op::AllSum, 4, 60.0, 0.00007)],
            }],
            mpi: vec![],
            limits: Some(limits(64.0, 1.0)),
            comparison: vec![],
        };
        report.compare();
        report
    }

    #[test]
    fn rows_pair_each_measurement_with_the_anchors() {
        let report = sample();
        let rows = &report.comparison;
        assert_eq!(rows.len(), 3);
        let small = &rows[0];
        assert_eq!((small.op, small.ranks, small.bytes), (Op::AllSum, 2, 4));
        assert_eq!(small.mlx_median_us, Some(60.0));
        assert_eq!(small.mlx_over_nuvec, Some(6.0));
        assert_eq!(small.mpi_median_us, None);
        // Beside a collective, the TCP floor is the round trip.
        assert_eq!(small.tcp_latency_us, Some(8.0));
        assert_eq!(small.tcp_over_nuvec, Some(0.8));
        let big = &rows[1];
        assert_eq!((big.mlx_median_us, big.tcp_latency_us), (None, None));
        assert_eq!(big.stream_limit_gbs, Some(1.0));
        assert!((big.nuvec_over_limit.unwrap() - 0.8).abs() < 1e-12);
        // Beside sendrecv, one way.
        assert_eq!(rows[2].tcp_latency_us, Some(4.0));
        assert_eq!(rows[2].tcp_over_nuvec, Some(0.8));
    }

    #[test]
    fn the_table_shows_the_anchors_that_ran() {
        let text = comparison_table(&sample().comparison);
        assert!(text.contains("all_sum, 2 ranks"), "{text}");
        assert!(text.contains("sendrecv, 2 ranks"), "{text}");
        assert!(text.contains("mlx") && text.contains("tcp rtt") && text.contains("tcp 1-way"));
        assert!(
            !text.contains(" mpi "),
            "no MPI column without MPI runs:\n{text}"
        );
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with("4 B"))
            .unwrap();
        assert!(line.contains("6.00") && line.contains("0.80"), "{line}");
        assert!(text.contains("TCP stream limit: 1.000 GB/s"));
    }

    #[test]
    fn the_report_round_trips_through_json() {
        let report = sample();
        let text = serde_json::to_string(&report).unwrap();
        let back: Report = serde_json::from_str(&text).unwrap();
        assert_eq!(back.comparison, report.comparison);
        assert_eq!(back.mlx, report.mlx);
        assert!(text.contains("\"op\":\"sendrecv\""), "{text}");
    }

    #[test]
    fn only_float32_sums_are_compared() {
        let mut report = sample();
        let mut bf16 = measurement(Op::AllSum, 2, 4, 9.0, 0.0004);
        bf16.dtype = DType::BF16;
        let mut max = measurement(Op::AllSum, 2, 4, 9.0, 0.0004);
        max.redop = Some(RedOp::Max);
        report.nuvec[0].measurements.extend([bf16, max]);
        report.compare();
        assert_eq!(report.comparison.len(), 3);
    }

    #[test]
    fn tables_have_nccl_tests_columns_in_one_unit_each() {
        let mut run = sample().nuvec.remove(0);
        // The links the ranks reported head the run's tables.
        let with = nuvec_tables(&run);
        assert!(
            with.starts_with("\n# transport    tcp (every link, ranks 0-1, one host)\n"),
            "{with}"
        );
        run.transport.clear();
        run.measurements[1].median_us = 81_234.4;
        run.measurements[1].algbw_gbs = 0.826;
        run.measurements[1].busbw_gbs = 0.826;
        let text = nuvec_tables(&run);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[1], "# nuvec, 2 ranks: all_sum", "{text}");
        let heads = [
            "size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong",
        ];
        let words: Vec<&str> = lines[2]
            .trim_start_matches('#')
            .split_whitespace()
            .collect();
        assert_eq!(words, heads);
        let units: Vec<&str> = lines[3]
            .trim_start_matches('#')
            .split_whitespace()
            .collect();
        assert_eq!(units, ["(B)", "(elements)", "(µs)", "(GB/s)", "(GB/s)"]);
        // Every row lines up with the heads: the last character of each column matches.
        let ends = |l: &str| -> Vec<usize> {
            let c: Vec<char> = l.chars().collect();
            (2..=c.len())
                .filter(|&i| c[i - 1] != ' ' && c.get(i).is_none_or(|&x| x == ' '))
                .collect()
        };
        assert_eq!(ends(lines[4]), ends(lines[2]), "{text}");
        assert_eq!(ends(lines[5]), ends(lines[2]), "{text}");
        let row: Vec<&str> = lines[4].split_whitespace().collect();
        assert_eq!(
            row,
            ["4", "1", "float32", "sum", "10.00", "0.00", "0.00", "0"]
        );
        // Milliseconds stay in µs; bandwidth in GB/s with two decimals.
        let row: Vec<&str> = lines[5].split_whitespace().collect();
        assert_eq!(row[3..], ["sum", "81234", "0.83", "0.83", "0"]);
        assert!(!text.contains(" ms") && !text.contains("G "), "{text}");
        assert!(text.contains("# wrong elements    : 0 (OK)"), "{text}");
        // sendrecv has its own table, with no reduction.
        let send = text.lines().find(|l| l.contains("sendrecv")).unwrap();
        assert_eq!(send, "# nuvec, 2 ranks: sendrecv");
        assert!(
            text.lines()
                .any(|l| l.split_whitespace().nth(3) == Some("none"))
        );
    }

    #[test]
    fn wrong_elements_show_in_the_table() {
        let mut run = sample().nuvec.remove(0);
        run.measurements[0].wrong = 7;
        run.measurements[0].redop = Some(RedOp::Max);
        let text = nuvec_tables(&run);
        // The calls in the order measured.
        assert!(
            text.contains("# nuvec, 2 ranks: all_max, all_sum"),
            "{text}"
        );
        assert!(text.lines().all(|l| l == l.trim_end()), "{text}");
        let row = text.lines().find(|l| l.contains(" max ")).unwrap();
        assert!(row.ends_with(" 7"), "{row}");
        assert!(text.contains("# wrong elements    : 7 (FAILED)"), "{text}");
        // An anchor that only says "wrong" shows as such.
        let mut mlx = sample().mlx.remove(0);
        mlx.points[0].correct = false;
        let text = anchor_tables(&mlx);
        assert!(
            text.contains("# mlx-ring 0.32.4, 2 ranks: all_sum"),
            "{text}"
        );
        let row = text
            .lines()
            .find(|l| !l.is_empty() && !l.starts_with('#'))
            .unwrap();
        assert_eq!(
            row.split_whitespace().collect::<Vec<_>>(),
            ["4", "1", "float32", "sum", "60.00", "0.00", "0.00", ">0"]
        );
        assert!(text.contains("some (FAILED)"), "{text}");
    }

    #[test]
    fn the_header_names_every_field() {
        let header = Header::detect(2, nuvec_distributed_engine::Backend::Ring);
        // Not known before the ranks report it.
        assert_eq!(
            (header.wire.as_str(), header.transport.as_str()),
            ("mlx", "")
        );
        assert!(!header.text().contains("transport"), "{}", header.text());
        assert_eq!(header.simd, nuvec_distributed_engine::simd_level());
        assert!(!header.host.is_empty() && !header.kernel.is_empty());
        let mut header = header;
        let run = |ranks, transport: &str| NuvecRun {
            ranks,
            transport: transport.into(),
            measurements: Vec::new(),
        };
        header.set_transport(&[run(2, "tcp (every link, ranks 0-1, one host)")]);
        assert_eq!(header.transport, "tcp (every link, ranks 0-1, one host)");
        let text = header.text();
        for key in [
            "host",
            "cpu",
            "kernel",
            "simd",
            "wire",
            "transport",
            "connections",
            "congestion",
        ] {
            assert!(
                text.lines().any(|l| l.starts_with(&format!("# {key} "))),
                "{key}:\n{text}"
            );
        }
        assert!(text.contains("# connections  2 per neighbour"), "{text}");
        assert!(
            !text.contains("# load") && !text.contains("WARNING"),
            "{text}"
        );
        let mut loaded = header.clone();
        loaded.set_load(&crate::load::Load {
            cpus: 2,
            others: 1.0,
            load_average: 3.0,
            busiest: Vec::new(),
            window: crate::load::WINDOW,
        });
        let text = loaded.text();
        assert!(
            text.contains("# load         1.00 of 2 CPUs busy with other work")
                && text.contains("# WARNING      the machine is loaded"),
            "{text}"
        );
        let json = serde_json::to_value(&header).unwrap();
        assert_eq!(json["connections"], 2);
        assert_eq!(json["wire"], "mlx");
        header.set_transport(&[run(2, "a"), run(3, ""), run(4, "b")]);
        assert_eq!(header.transport, "n=2: a; n=4: b");
    }

    #[test]
    fn links_are_described_as_the_ranks_reported_them() {
        use nuvec_distributed_engine::Transport::{Local, SharedMemory as Shm, Tcp};
        let every = |size: usize, t| -> Vec<Vec<_>> {
            (0..size)
                .map(|r| (0..size).map(|p| if p == r { Local } else { t }).collect())
                .collect()
        };
        assert_eq!(
            describe_links(&every(4, Shm), "one host"),
            "shared memory (every link, ranks 0-3, one host)"
        );
        assert_eq!(
            describe_links(&every(2, Tcp), "one host"),
            "tcp (every link, ranks 0-1, one host)"
        );
        // Two hosts of two ranks: shared memory inside each, TCP between them.
        let mut two = every(4, Tcp);
        for (a, b) in [(0, 1), (2, 3)] {
            two[a][b] = Shm;
            two[b][a] = Shm;
        }
        assert_eq!(
            describe_links(&two, "2 hosts"),
            "shared memory within ranks [0, 1] and [2, 3]; tcp between ranks 0-2, 0-3, 1-2, \
             1-3 (ranks 0-3, 2 hosts)"
        );
        // A link its two ends report differently is named.
        let mut odd = every(2, Shm);
        odd[1][0] = Tcp;
        assert_eq!(
            describe_links(&odd, "one host"),
            "shared memory (every link, ranks 0-1, one host); ranks 0 and 1 disagree \
             (shared memory / tcp)"
        );
        assert_eq!(
            describe_links(&every(1, Tcp), "one host"),
            "none (one rank, one host)"
        );
        for t in [Local, Tcp, Shm, nuvec_distributed_engine::Transport::Rdma] {
            assert_eq!(transport_of(transport_code(t)), t);
        }
    }
}
