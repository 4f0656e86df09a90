//! The anchors `nuvec bench` compares against, from `tools/anchors/` in this repository:
//! MLX's own ring (`mlx_bench.py` under `mlx.launch`), Open MPI over TCP (`mpi_bench.py`
//! under `mpirun`), and the raw TCP limits of this machine (`tcp_pingpong`, `tcp_stream`).
//! Running them, and parsing what they print or write, as pure functions.
//!
//! The Python sweeps follow the same methodology as [`crate::bench`] (warm-up, an iteration
//! count chosen by rank 0 from it, each iteration timed alone, the slowest rank's median),
//! and are given the same sizes, target time and iteration bounds.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::bench::{Op, Sweep};
use crate::launch;
use crate::runner::{self, Job, Outcome, RunOptions};

/// One (op, size) of an anchor's sweep, in nuvec's units.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AnchorPoint {
    /// The collective (MPI's all_reduce is [`Op::AllSum`]).
    pub op: Op,
    /// Bytes per rank.
    pub bytes: usize,
    /// Timed iterations.
    pub iters: usize,
    /// The slowest rank's median, µs (one way for sendrecv).
    pub median_us: f64,
    /// Algorithm bandwidth at the median, GB/s (1e9 bytes/s).
    pub algbw_gbs: f64,
    /// Bus bandwidth at the median, GB/s.
    pub busbw_gbs: f64,
    /// Whether the results were exact.
    pub correct: bool,
}

/// One anchor sweep for one number of ranks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AnchorRun {
    /// What ran: `mlx-ring` or `openmpi-mpi4py`.
    pub system: String,
    /// Ranks.
    pub ranks: usize,
    /// The version of MLX or of the MPI library.
    pub version: Option<String>,
    /// MLX only: the cost of a local `mx.eval(x + 1)`, µs, which every MLX call pays.
    pub eval_overhead_us: Option<f64>,
    /// The measurements.
    pub points: Vec<AnchorPoint>,
}

impl AnchorRun {
    /// The measurement of `op` at `bytes`, if the sweep has it.
    pub fn point(&self, op: Op, bytes: usize) -> Option<&AnchorPoint> {
        self.points.iter().find(|p| p.op == op && p.bytes == bytes)
    }
}

/// The op names the Python sweeps use.
fn anchor_op(name: &str) -> Option<Op> {
    match name {
        "all_sum" | "all_reduce" => Some(Op::AllSum),
        "all_gather" => Some(Op::AllGather),
        "sendrecv" => Some(Op::SendRecv),
        _ => None,
    }
}

/// Parses the JSON that `mlx_bench.py --out` or `mpi_bench.py --out` writes.
///
/// # Errors
///
/// Text that is not such JSON.
pub fn parse_sweep_json(text: &str) -> Result<AnchorRun, String> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| format!("not the JSON of a sweep: {e}"))?;
    let field = |name: &str| {
        value
            .get(name)
            .ok_or(format!("no {name:?} in the sweep's JSON"))
    };
    let system = field("system")?
        .as_str()
        .ok_or("\"system\" is not a string")?
        .to_string();
    let ranks = field("world_size")?
        .as_u64()
        .ok_or("\"world_size\" is not a number")? as usize;
    let version = value
        .get("mlx_version")
        .or_else(|| value.get("mpi_library"))
        .and_then(Value::as_str)
        .map(|v| v.trim_end_matches('\0').trim().to_string());
    let eval_overhead_us = value.get("eval_overhead_us").and_then(Value::as_f64);
    #[derive(Deserialize)]
    struct Raw {
        op: String,
        bytes: usize,
        iters: usize,
        lat_us: f64,
        #[serde(rename = "algbw_Bps")]
        algbw: f64,
        #[serde(rename = "busbw_Bps")]
        busbw: f64,
        correct: bool,
    }
    let raw: Vec<Raw> = serde_json::from_value(field("results")?.clone())
        .map_err(|e| format!("the sweep's \"results\" are not as expected: {e}"))?;
    let points = raw
        .into_iter()
        .map(|r| {
            Ok(AnchorPoint {
                op: anchor_op(&r.op).ok_or(format!("unknown op {:?} in the sweep", r.op))?,
                bytes: r.bytes,
                iters: r.iters,
                median_us: r.lat_us,
                algbw_gbs: r.algbw / 1e9,
                busbw_gbs: r.busbw / 1e9,
                correct: r.correct,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(AnchorRun {
        system,
        ranks,
        version,
        eval_overhead_us,
        points,
    })
}

/// A raw TCP ping-pong (`tcp_pingpong SIZE ITERS spin`): round trips over loopback between
/// two busy-polling processes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PingPong {
    /// Message size, bytes.
    pub bytes: usize,
    /// Timed round trips.
    pub iters: usize,
    /// Median round trip, µs.
    pub rtt_median_us: f64,
    /// 10th percentile, µs.
    pub rtt_p10_us: f64,
    /// 90th percentile, µs.
    pub rtt_p90_us: f64,
    /// Fastest, µs.
    pub rtt_min_us: f64,
}

/// A raw TCP stream (`tcp_stream SIZE REPS bidir`): both directions at once, the traffic of
/// a 2-rank ring.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stream {
    /// Bytes per message.
    pub bytes: usize,
    /// Timed repetitions.
    pub reps: usize,
    /// Both directions at once.
    pub bidir: bool,
    /// Median time per message, ms.
    pub time_ms_median: f64,
    /// GB/s per direction at the median.
    pub gbps_per_direction: f64,
    /// GB/s per direction of the fastest repetition.
    pub gbps_best: f64,
}

/// The machine's limits measured in a run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    /// One ping-pong per size.
    pub pingpong: Vec<PingPong>,
    /// The bidirectional stream, if measured.
    pub stream: Option<Stream>,
}

impl Limits {
    /// The ping-pong at `bytes`, if measured.
    pub fn pingpong(&self, bytes: usize) -> Option<&PingPong> {
        self.pingpong.iter().find(|p| p.bytes == bytes)
    }
}

/// The `key=value` fields of a probe's output line.
fn fields(line: &str) -> Vec<(&str, &str)> {
    line.split_whitespace()
        .filter_map(|w| w.split_once('='))
        .collect()
}

fn number<T: std::str::FromStr>(
    fields: &[(&str, &str)],
    key: &str,
    line: &str,
) -> Result<T, String> {
    fields
        .iter()
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.parse().ok())
        .ok_or_else(|| format!("no number {key}= in {line:?}"))
}

/// Parses `tcp_pingpong`'s output line (`pingpong size=4 iters=20000 mode=spin pin=none
/// rtt_us median=8.24 p10=7.88 p90=9.34 min=7.66`).
///
/// # Errors
///
/// No such line in `text`.
pub fn parse_pingpong(text: &str) -> Result<PingPong, String> {
    let line = text
        .lines()
        .find(|l| l.starts_with("pingpong ") && l.contains("rtt_us"))
        .ok_or_else(|| format!("no ping-pong result in {text:?}"))?;
    let f = fields(line);
    Ok(PingPong {
        bytes: number(&f, "size", line)?,
        iters: number(&f, "iters", line)?,
        rtt_median_us: number(&f, "median", line)?,
        rtt_p10_us: number(&f, "p10", line)?,
        rtt_p90_us: number(&f, "p90", line)?,
        rtt_min_us: number(&f, "min", line)?,
    })
}

/// Parses `tcp_stream`'s output line (`stream size=67108864 reps=20 mode=bidir ... time_ms
/// median=63.958 min=... max=... GBps_per_direction median=1.049 best=1.406`).
///
/// # Errors
///
/// No such line in `text`.
pub fn parse_stream(text: &str) -> Result<Stream, String> {
    let line = text
        .lines()
        .find(|l| l.starts_with("stream ") && l.contains("GBps_per_direction"))
        .ok_or_else(|| format!("no stream result in {text:?}"))?;
    // Two groups share the names median/min/max: split at the bandwidth's label.
    let (times, rates) = line
        .split_once("GBps_per_direction")
        .ok_or_else(|| format!("no GBps_per_direction in {line:?}"))?;
    let (t, r) = (fields(times), fields(rates));
    Ok(Stream {
        bytes: number(&t, "size", line)?,
        reps: number(&t, "reps", line)?,
        bidir: t.iter().any(|&(k, v)| k == "mode" && v == "bidir"),
        time_ms_median: number(&t, "median", line)?,
        gbps_per_direction: number(&r, "median", line)?,
        gbps_best: number(&r, "best", line)?,
    })
}

/// The largest message the ping-pong probe is run for.
pub const PINGPONG_MAX_BYTES: usize = 1 << 20;

/// The stream probe's message: the sweep's largest size.
pub const STREAM_BYTES: usize = 64 << 20;

/// Where the anchors' scripts are and where their environment (`setup.sh`'s output) lives.
#[derive(Clone, Debug)]
pub struct Anchors {
    /// The anchors folder (`tools/anchors`: `setup.sh`, `mlx_bench.py`, `mpi_bench.py`,
    /// and `sweep.py`, which the two scripts import).
    pub dir: PathBuf,
    /// What `setup.sh` made: `venv/` and `bin/`.
    pub env: PathBuf,
}

/// The transport (BTL) Open MPI's anchor runs over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum MpiBtl {
    /// TCP on loopback (`--mca btl tcp,self`), beside nuvec's TCP links.
    #[default]
    Tcp,
    /// Shared memory, as Open MPI 4 names it (`--mca btl vader,self`), beside nuvec's
    /// shared memory.
    Vader,
    /// Shared memory, as Open MPI 5 names it (`--mca btl sm,self`).
    Sm,
}

impl MpiBtl {
    /// The `--mca btl` value.
    pub fn mca(self) -> &'static str {
        match self {
            MpiBtl::Tcp => "tcp,self",
            MpiBtl::Vader => "vader,self",
            MpiBtl::Sm => "sm,self",
        }
    }

    /// How the bench names it.
    pub fn describe(self) -> &'static str {
        match self {
            MpiBtl::Tcp => "over TCP",
            MpiBtl::Vader => "over shared memory (btl vader)",
            MpiBtl::Sm => "over shared memory (btl sm)",
        }
    }
}

/// Which anchors a run wants.
#[derive(Clone, Copy, Debug, Default)]
pub struct Wanted {
    /// MLX's ring.
    pub mlx: bool,
    /// Open MPI over TCP.
    pub mpi: bool,
    /// The raw TCP probes.
    pub limits: bool,
}

impl Anchors {
    /// The repository this tool was built from (for the default paths).
    pub fn repo_root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default()
    }

    /// The anchors folder this tool was built with: `tools/anchors` in its repository.
    pub fn default_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("anchors")
    }

    /// The anchors in `dir` (default: [`Anchors::default_dir`], `tools/anchors` in the
    /// repository) with their environment in `env` (default: the repository's
    /// `target/anchors`).
    ///
    /// # Errors
    ///
    /// The folder is missing or lacks the sweep scripts.
    ///
    /// # Examples
    ///
    /// ```
    /// use nuvec_tools::anchors::Anchors;
    ///
    /// // The scripts ship with the repository.
    /// let anchors = Anchors::locate(None, None)?;
    /// assert!(anchors.dir.ends_with("tools/anchors"));
    /// assert!(anchors.dir.join("mlx_bench.py").is_file());
    /// # Ok::<(), String>(())
    /// ```
    pub fn locate(dir: Option<PathBuf>, env: Option<PathBuf>) -> Result<Self, String> {
        let root = Self::repo_root();
        let dir = dir.unwrap_or_else(Self::default_dir);
        let dir = std::fs::canonicalize(&dir).map_err(|e| {
            format!(
                "the anchors folder {} is not there ({e}); give it with --anchors DIR",
                dir.display()
            )
        })?;
        for script in ["setup.sh", "mlx_bench.py", "mpi_bench.py", "sweep.py"] {
            if !dir.join(script).is_file() {
                return Err(format!(
                    "{} has no {script}: is it the anchors folder?",
                    dir.display()
                ));
            }
        }
        let env = env.unwrap_or_else(|| root.join("target/anchors"));
        Ok(Self { dir, env })
    }

    fn python(&self) -> PathBuf {
        self.env.join("venv/bin/python")
    }

    fn tool(&self, name: &str) -> PathBuf {
        self.env.join("bin").join(name)
    }

    /// What of `wanted` the environment lacks, in words.
    fn missing(&self, wanted: Wanted) -> Vec<String> {
        let mut missing = Vec::new();
        let mut need = |path: PathBuf| {
            if !path.exists() {
                missing.push(path.display().to_string());
            }
        };
        if wanted.mlx || wanted.mpi {
            need(self.python());
            need(self.env.join("venv/bin/mlx.launch"));
        }
        if wanted.limits {
            need(self.tool("tcp_pingpong"));
            need(self.tool("tcp_stream"));
        }
        if wanted.mpi {
            let mpi4py = Command::new(self.python())
                .args(["-c", "import mpi4py"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !mpi4py {
                missing.push("mpi4py in the venv".into());
            }
            if !on_path("mpirun") {
                missing.push("mpirun".into());
            }
        }
        missing
    }

    /// Makes sure the environment has what `wanted` needs, running `setup.sh ENV` (with
    /// `--mpi` for MPI) when something is missing.
    ///
    /// # Errors
    ///
    /// `setup.sh` failed, or something is still missing after it ran.
    pub fn ensure(&self, wanted: Wanted) -> Result<(), String> {
        let missing = self.missing(wanted);
        if missing.is_empty() {
            return Ok(());
        }
        eprintln!(
            "nuvec bench: the anchor environment {} lacks {}; running {}/setup.sh",
            self.env.display(),
            missing.join(", "),
            self.dir.display()
        );
        let mut setup = Command::new(self.dir.join("setup.sh"));
        setup.arg(&self.env);
        if wanted.mpi {
            setup.arg("--mpi");
        }
        let status = setup
            .stdin(Stdio::null())
            .status()
            .map_err(|e| format!("cannot run setup.sh: {e}"))?;
        if !status.success() {
            return Err(format!("setup.sh failed ({status})"));
        }
        let missing = self.missing(wanted);
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "after setup.sh, still missing: {}",
                missing.join(", ")
            ))
        }
    }

    /// The command that runs MLX's ring sweep on `ranks` local ranks through `mlx.launch`.
    pub fn mlx_command(&self, ranks: usize, port: u16, sweep: &Sweep, out: &Path) -> Command {
        let mut c = Command::new(self.env.join("venv/bin/mlx.launch"));
        c.args(["--backend", "ring", "-n", &ranks.to_string()])
            .args(["-p", &port.to_string(), "--"])
            .arg(self.python())
            .arg(self.dir.join("mlx_bench.py"))
            .args(sweep_args(sweep, &["all_sum", "all_gather", "sendrecv"]))
            .arg("--out")
            .arg(out);
        c
    }

    /// The command that runs Open MPI's sweep with `ranks` ranks over `btl`: TCP on
    /// loopback, or its shared-memory transport.
    pub fn mpi_command(&self, ranks: usize, sweep: &Sweep, out: &Path, btl: MpiBtl) -> Command {
        let mut c = self.mpirun(ranks, btl);
        c.arg(self.dir.join("mpi_bench.py"))
            .args(sweep_args(sweep, &["all_reduce", "all_gather", "sendrecv"]))
            .arg("--out")
            .arg(out);
        c
    }

    /// `mpirun` with `ranks` ranks over `btl`, up to the anchor's Python: the script and its
    /// arguments follow.
    fn mpirun(&self, ranks: usize, btl: MpiBtl) -> Command {
        let mut c = Command::new("mpirun");
        c.args([
            "--allow-run-as-root",
            "--oversubscribe",
            "-n",
            &ranks.to_string(),
        ])
        .args(["--mca", "pml", "ob1", "--mca", "btl", btl.mca()]);
        if btl == MpiBtl::Tcp {
            c.args(["--mca", "btl_tcp_if_include", "lo"]);
        }
        c.arg(self.python());
        c
    }

    /// Runs skew.py, the late-arrival measurement of `nuvec bench --skew`, under Open MPI
    /// (`btl`) or, with `btl` `None`, MLX's ring, and returns rank 0's points.
    ///
    /// # Errors
    ///
    /// The launch failed, or printed no point for a delay.
    pub fn run_skew(
        &self,
        ranks: usize,
        btl: Option<MpiBtl>,
        bytes: usize,
        delays_us: &[u64],
        iters: usize,
    ) -> Result<Vec<crate::skew::SkewPoint>, String> {
        let what = if btl.is_some() {
            "mpirun"
        } else {
            "mlx.launch"
        };
        let mut c = match btl {
            Some(btl) => self.mpirun(ranks, btl),
            None => {
                let port = launch::free_port_block(ranks).map_err(|e| e.to_string())?;
                let mut c = Command::new(self.env.join("venv/bin/mlx.launch"));
                c.args(["--backend", "ring", "-n", &ranks.to_string()])
                    .args(["-p", &port.to_string(), "--"])
                    .arg(self.python());
                c
            }
        };
        let delays: Vec<String> = delays_us.iter().map(u64::to_string).collect();
        c.arg(self.dir.join("skew.py"))
            .arg(if btl.is_some() { "mpi" } else { "mlx" })
            .env("BYTES", bytes.to_string())
            .env("ITERS", iters.to_string())
            .env("DELAYS", delays.join(","))
            .stdin(Stdio::null());
        let output = c.output().map_err(|e| format!("{what}: {e}"))?;
        let text = String::from_utf8_lossy(&output.stdout);
        let points: Vec<_> = text
            .lines()
            .filter_map(|l| crate::skew::parse_anchor_line(l, iters))
            .collect();
        if !output.status.success() || points.len() != delays_us.len() {
            return Err(format!(
                "{what} skew.py: {} ({} of {} delays reported); its output:\n{text}{}",
                output.status,
                points.len(),
                delays_us.len(),
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        Ok(points)
    }

    /// Runs MLX's ring sweep for `ranks` and returns its results.
    ///
    /// # Errors
    ///
    /// The launch failed or wrote no results.
    pub fn run_mlx(&self, ranks: usize, sweep: &Sweep) -> Result<AnchorRun, String> {
        let port = launch::free_port_block(ranks).map_err(|e| e.to_string())?;
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let out = dir.path().join(format!("mlx-n{ranks}.json"));
        run_anchor(
            "mlx.launch",
            self.mlx_command(ranks, port, sweep, &out),
            &out,
        )
    }

    /// Runs Open MPI's sweep for `ranks` and returns its results.
    ///
    /// # Errors
    ///
    /// mpirun failed or wrote no results.
    pub fn run_mpi(&self, ranks: usize, sweep: &Sweep, btl: MpiBtl) -> Result<AnchorRun, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let out = dir.path().join(format!("mpi-n{ranks}.json"));
        run_anchor("mpirun", self.mpi_command(ranks, sweep, &out, btl), &out)
    }

    /// Measures the raw TCP limits: a busy-polling ping-pong for each size of the sweep up
    /// to [`PINGPONG_MAX_BYTES`] (iterations chosen from a short first run to last about
    /// the sweep's target), and a bidirectional stream of [`STREAM_BYTES`] messages.
    ///
    /// # Errors
    ///
    /// A probe failed or printed something else.
    pub fn run_limits(&self, sweep: &Sweep) -> Result<Limits, String> {
        let mut limits = Limits::default();
        for &bytes in sweep.sizes.iter().filter(|&&b| b <= PINGPONG_MAX_BYTES) {
            let probe = |iters: usize| {
                probe(
                    &self.tool("tcp_pingpong"),
                    &[bytes.to_string(), iters.to_string(), "spin".into()],
                )
                .and_then(|text| parse_pingpong(&text))
            };
            let first = probe(20)?;
            let iters = iterations(sweep, Duration::from_secs_f64(first.rtt_median_us / 1e6));
            limits.pingpong.push(probe(iters)?);
        }
        // One 64 MiB message each way takes 50-100 ms here: about 20 of them per second.
        let reps = (sweep.target.as_millis() / 50).clamp(3, 20).to_string();
        let text = probe(
            &self.tool("tcp_stream"),
            &[STREAM_BYTES.to_string(), reps, "bidir".into()],
        )?;
        limits.stream = Some(parse_stream(&text)?);
        Ok(limits)
    }
}

/// How many iterations of `per_iter` fill the sweep's target, within its bounds.
fn iterations(sweep: &Sweep, per_iter: Duration) -> usize {
    let per = per_iter.max(Duration::from_nanos(100)).as_secs_f64();
    ((sweep.target.as_secs_f64() / per) as usize).clamp(sweep.min_iters, sweep.max_iters)
}

/// The Python sweeps' arguments for nuvec's sweep, limited to the ops they have
/// (`names` lists the script's names for all_sum, all_gather and sendrecv).
fn sweep_args(sweep: &Sweep, names: &[&str; 3]) -> Vec<String> {
    let ops: Vec<&str> = sweep
        .ops
        .iter()
        .filter_map(|op| match op {
            Op::AllSum => Some(names[0]),
            Op::AllGather => Some(names[1]),
            Op::SendRecv => Some(names[2]),
            Op::SumScatter => None,
        })
        .collect();
    let sizes: Vec<String> = sweep.sizes.iter().map(usize::to_string).collect();
    vec![
        "--ops".into(),
        ops.join(","),
        "--sizes".into(),
        sizes.join(","),
        "--target-time".into(),
        format!("{}", sweep.target.as_secs_f64()),
        "--warmup".into(),
        sweep.warmup.to_string(),
        "--min-iters".into(),
        sweep.min_iters.to_string(),
        "--max-iters".into(),
        sweep.max_iters.to_string(),
    ]
}

/// Whether `sweep` has an op the Python sweeps measure (they have no sum_scatter).
pub fn has_anchor_ops(sweep: &Sweep) -> bool {
    sweep.ops.iter().any(|&op| op != Op::SumScatter)
}

/// Runs one anchor command supervised like the ranks of a launch (its output passes
/// through; signals are forwarded) and parses the JSON it wrote to `out`.
fn run_anchor(what: &str, command: Command, out: &Path) -> Result<AnchorRun, String> {
    let job = Job {
        rank: 0,
        host: launch::LOCAL_HOST.into(),
        command,
        remote: false,
    };
    let options = RunOptions {
        prefix_output: false,
        forward_stdin: false,
        name: "nuvec bench".into(),
        ..RunOptions::default()
    };
    match runner::run_jobs(vec![job], &options) {
        Ok(Outcome::Success) => {}
        Ok(Outcome::RankFailed { status, .. }) => return Err(format!("{what} failed: {status}")),
        Ok(Outcome::Interrupted { signal }) => {
            return Err(format!("{what}: interrupted by {signal}"));
        }
        Err(e) => return Err(format!("{what}: {e}")),
    }
    // mlx.launch exits 0 even when a rank fails: the results file is the proof.
    let text = std::fs::read_to_string(out).map_err(|e| {
        format!(
            "{what} wrote no results to {} ({e}); see its output above",
            out.display()
        )
    })?;
    parse_sweep_json(&text)
}

/// Runs a probe and returns its standard output.
fn probe(program: &Path, args: &[String]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", program.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} {} failed ({}): {}",
            program.display(),
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MLX: &str = include_str!("../tests/data/mlx_bench-n2.json");
    const MPI: &str = include_str!("../tests/data/mpi_bench-n2.json");
    const PINGPONG: &str = include_str!("../tests/data/tcp_pingpong.txt");
    const STREAM: &str = include_str!("../tests/data/tcp_stream.txt");

    #[test]
    fn parses_mlx_bench_output() {
        let run = parse_sweep_json(MLX).unwrap();
        assert_eq!(run.system, "mlx-ring");
        assert_eq!(run.ranks, 2);
        assert_eq!(run.version.as_deref(), Some("0.32.4"));
        assert!((run.eval_overhead_us.unwrap() - 17.822).abs() < 1e-3);
        assert_eq!(run.points.len(), 6);
        let p = run.point(Op::AllSum, 65536).unwrap();
        assert_eq!(p.iters, 460);
        assert!((p.median_us - 3670.672).abs() < 1e-3);
        assert!((p.busbw_gbs - 0.017_854).abs() < 1e-6);
        assert!(p.correct);
        let ag = run.point(Op::AllGather, 65536).unwrap();
        assert!((ag.algbw_gbs - 2.0 * ag.busbw_gbs).abs() < 1e-9);
        assert!(run.point(Op::SendRecv, 4).is_some());
        assert!(run.point(Op::SumScatter, 4).is_none());
    }

    #[test]
    fn parses_mpi_bench_output() {
        let run = parse_sweep_json(MPI).unwrap();
        assert_eq!(run.system, "openmpi-mpi4py");
        assert_eq!(run.ranks, 2);
        // The library version without the NUL that mpi4py leaves at its end.
        assert!(
            run.version
                .as_deref()
                .unwrap()
                .starts_with("Open MPI v4.1.4")
        );
        assert!(!run.version.as_deref().unwrap().contains('\0'));
        assert_eq!(run.eval_overhead_us, None);
        // MPI's all_reduce is all_sum.
        let p = run.point(Op::AllSum, 4).unwrap();
        assert!((p.median_us - 11.196).abs() < 1e-3);
        assert_eq!(
            run.points.iter().filter(|p| p.op == Op::SendRecv).count(),
            2
        );
    }

    #[test]
    fn rejects_what_is_not_a_sweep() {
        assert!(parse_sweep_json("{}").unwrap_err().contains("system"));
        assert!(parse_sweep_json("[1]").is_err());
        let unknown = MLX.replace("\"all_gather\"", "\"alltoall\"");
        assert!(parse_sweep_json(&unknown).unwrap_err().contains("alltoall"));
    }

    #[test]
    fn parses_the_tcp_probes() {
        let lines: Vec<&str> = PINGPONG.lines().collect();
        let small = parse_pingpong(lines[0]).unwrap();
        assert_eq!(
            small,
            PingPong {
                bytes: 4,
                iters: 2000,
                rtt_median_us: 8.24,
                rtt_p10_us: 7.88,
                rtt_p90_us: 9.34,
                rtt_min_us: 7.66,
            }
        );
        assert_eq!(parse_pingpong(lines[1]).unwrap().bytes, 65536);
        let stream = parse_stream(STREAM).unwrap();
        assert_eq!(
            stream,
            Stream {
                bytes: 67_108_864,
                reps: 5,
                bidir: true,
                time_ms_median: 63.958,
                gbps_per_direction: 1.049,
                gbps_best: 1.406,
            }
        );
        assert!(parse_pingpong("socket: Permission denied").is_err());
        assert!(parse_stream(PINGPONG).is_err());
    }

    #[test]
    fn python_sweeps_get_nuvecs_sweep() {
        let sweep = Sweep {
            ops: vec![Op::SumScatter, Op::AllSum, Op::SendRecv],
            sizes: vec![4, 1024],
            target: Duration::from_millis(250),
            ..Sweep::default()
        };
        assert_eq!(
            sweep_args(&sweep, &["all_reduce", "all_gather", "sendrecv"]),
            [
                "--ops",
                "all_reduce,sendrecv",
                "--sizes",
                "4,1024",
                "--target-time",
                "0.25",
                "--warmup",
                "20",
                "--min-iters",
                "5",
                "--max-iters",
                "20000"
            ]
        );
        assert!(has_anchor_ops(&sweep));
        assert!(!has_anchor_ops(&Sweep {
            ops: vec![Op::SumScatter],
            ..Sweep::default()
        }));
        assert_eq!(iterations(&sweep, Duration::from_micros(10)), 20000);
        assert_eq!(iterations(&sweep, Duration::from_millis(100)), 5);
        assert_eq!(iterations(&sweep, Duration::from_millis(1)), 250);
    }
}
