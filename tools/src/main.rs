//! `nuvec`: start and measure nuvec-distributed (and MLX) rings.
//!
//! `nuvec launch -n 2 -- PROGRAM ARGS` starts two ranks on this machine as `mlx.launch`
//! would (the same hostfile, `MLX_HOSTFILE` and `MLX_RANK`), `nuvec bench -n 2` measures
//! collectives across local ranks started the same way.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use nuvec_tools::anchors::{self, Anchors, Wanted};
use nuvec_tools::bench::{self, Measurement, Op, Sweep};
use nuvec_tools::chart;
use nuvec_tools::launch::{self, Backend, HostList, LaunchSpec};
use nuvec_tools::report::{self, NuvecRun, Report};
use nuvec_tools::runner::{self, RunOptions};

/// Start and measure nuvec-distributed rings.
#[derive(Parser)]
#[command(name = "nuvec", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start a distributed program on one or more hosts, as mlx.launch does.
    Launch(LaunchArgs),
    /// Measure collectives across local ranks on loopback.
    Bench(BenchArgs),
}

/// The flags of `mlx.launch` for the ring and JACCL backends.
#[derive(Args)]
#[command(
    after_help = "Each rank gets MLX_RANK and, for the ring, MLX_HOSTFILE (for JACCL, \
                  MLX_IBV_DEVICES, MLX_JACCL_COORDINATOR and MLX_JACCL_RING), written as \
                  mlx.launch writes them. Ranks on 127.0.0.1 run here; others through \
                  `ssh -tt HOST`. Output lines are prefixed with the rank. SIGINT, SIGTERM \
                  and SIGHUP are forwarded to every rank (a third one kills them). When a \
                  rank fails, the others are ended and nuvec launch exits with that rank's \
                  status, naming it."
)]
struct LaunchArgs {
    /// Repeat each host this many times (ranks per host).
    #[arg(short = 'n', long = "repeat-hosts", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..))]
    repeat_hosts: u32,
    /// Comma-separated hosts; an IP address is also where the ring listens.
    #[arg(long, default_value = launch::LOCAL_HOST)]
    hosts: String,
    /// A JSON hostfile: a list of {"ssh", "ips", "rdma"} hosts, or {"backend", "envs",
    /// "hosts"}. Takes precedence over --hosts and -n.
    #[arg(long)]
    hostfile: Option<PathBuf>,
    /// The backend to prepare (default: the hostfile's, else ring).
    #[arg(long, value_enum)]
    backend: Option<Backend>,
    /// An environment variable for every rank (repeatable): K=V, or K alone to pass on the
    /// launcher's own value of K (an error when K is unset here), as docker and ssh do.
    #[arg(long = "env", value_name = "K=V|K")]
    env: Vec<String>,
    /// The ring's first port, counting up by one per address; JACCL's coordinator port.
    #[arg(short = 'p', long, default_value_t = launch::DEFAULT_STARTING_PORT)]
    starting_port: u16,
    /// Ring connections per IP.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    connections_per_ip: u32,
    /// Working directory of the ranks (default: this one).
    #[arg(long)]
    cwd: Option<String>,
    /// An interpreter to put before the command.
    #[arg(long)]
    python: Option<String>,
    /// Log the setup and how each rank ends; sets MLX_RING_VERBOSE=1 for ring ranks.
    #[arg(long)]
    verbose: bool,
    /// The program to run and its arguments (after `--` if they start with `-`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

#[derive(Args, Clone)]
#[command(
    after_help = "The sweep's methodology is that of the anchors' mlx_bench.py (see \
                  tools/src/bench.rs). With --mlx, --mpi or --limits the anchors run in the \
                  same invocation and a comparison follows: latency ratios are anchor / \
                  nuvec (above 1: nuvec is faster; for raw TCP, the share of the floor \
                  reached), bandwidth is nuvec's bus bandwidth / raw TCP both ways at once."
)]
struct BenchArgs {
    /// Ranks to start on this machine; a comma-separated list sweeps each (e.g. 2,3,4).
    #[arg(short = 'n', long, value_delimiter = ',', default_value = "2")]
    ranks: Vec<usize>,
    /// Connections between neighbours (addresses per rank).
    #[arg(long, default_value_t = 1)]
    connections: usize,
    /// The ring's first port (default: a free block of ports).
    #[arg(short = 'p', long)]
    starting_port: Option<u16>,
    /// Collectives to measure, comma-separated: all_sum, all_gather, sum_scatter, sendrecv.
    #[arg(long, value_delimiter = ',', default_value = "all_sum")]
    ops: Vec<Op>,
    /// Bytes per rank, comma-separated; suffixes K and M (binary) allowed.
    #[arg(long, value_delimiter = ',', value_parser = parse_size)]
    sizes: Option<Vec<usize>>,
    /// Timed milliseconds to aim for per size.
    #[arg(long, default_value_t = 1000)]
    target_ms: u64,
    /// Run exactly this many timed iterations per size (instead of aiming at --target-ms).
    #[arg(long)]
    iters: Option<usize>,
    /// Write everything measured (nuvec, the anchors, the comparison) as JSON to this file.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Also run MLX's ring: mlx_bench.py under mlx.launch, for each rank count.
    #[arg(long)]
    mlx: bool,
    /// Also run Open MPI over TCP on loopback: mpi_bench.py under mpirun.
    #[arg(long)]
    mpi: bool,
    /// Also measure raw TCP: a busy-polling ping-pong per size up to 1 MiB, and a 64 MiB
    /// stream both ways at once.
    #[arg(long)]
    limits: bool,
    /// The anchors folder (default: shared/anchors next to the repository).
    #[arg(long, value_name = "DIR")]
    anchors: Option<PathBuf>,
    /// The anchors' environment, setup.sh's output (default: target/anchors in the
    /// repository; made with setup.sh when something is missing).
    #[arg(long, value_name = "DIR")]
    anchor_env: Option<PathBuf>,
    /// Draw median latency and bus bandwidth against size, for nuvec and the anchors, into
    /// this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    chart: Option<PathBuf>,
    /// Internal: run as one rank of a ring started by `nuvec bench`.
    #[arg(long, hide = true)]
    worker: bool,
    /// Internal: where a worker's rank 0 writes its measurements as JSON.
    #[arg(long, hide = true)]
    results: Option<PathBuf>,
}

fn parse_size(s: &str) -> Result<usize, String> {
    let (digits, scale) = match s.trim().to_ascii_uppercase() {
        t if t.ends_with('M') => (t[..t.len() - 1].to_string(), 1 << 20),
        t if t.ends_with('K') => (t[..t.len() - 1].to_string(), 1 << 10),
        t => (t, 1),
    };
    let n: usize = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a size (e.g. 4, 8K, 64M)"))?;
    let bytes = n * scale;
    if bytes == 0 || !bytes.is_multiple_of(4) {
        return Err(format!(
            "{s:?}: sizes are whole f32 elements, a positive multiple of 4 bytes"
        ));
    }
    Ok(bytes)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Launch(args) => launch(args),
        Command::Bench(args) if args.worker => bench_worker(&args),
        Command::Bench(args) => bench_launch(&args),
    }
}

fn launch(args: LaunchArgs) -> ExitCode {
    let fail = |message: String| {
        eprintln!("nuvec launch: {message}");
        ExitCode::FAILURE
    };
    let hosts = match &args.hostfile {
        Some(path) => match std::fs::read_to_string(path) {
            Ok(text) => HostList::parse_hostfile(&text)
                .map_err(|e| format!("hostfile {}: {e}", path.display())),
            Err(e) => Err(format!("hostfile {}: {e}", path.display())),
        },
        None => {
            HostList::from_hosts(&args.hosts, args.repeat_hosts as usize).map_err(|e| e.to_string())
        }
    };
    let hosts = match hosts {
        Ok(hosts) => hosts,
        Err(message) => return fail(message),
    };
    let env = match launch::resolve_env_args(&args.env, &|name| std::env::var_os(name)) {
        Ok(env) => env,
        Err(e) => return fail(e.to_string()),
    };
    let spec = LaunchSpec {
        backend: args.backend,
        env,
        starting_port: args.starting_port,
        connections_per_ip: args.connections_per_ip as usize,
        cwd: args.cwd,
        verbose: args.verbose,
        python: args.python,
        command: args.command,
    };
    let plan = match launch::plan(&spec, &hosts, runner::terminal_dimensions()) {
        Ok(plan) => plan,
        Err(e) => return fail(e.to_string()),
    };
    let options = RunOptions {
        verbose: args.verbose,
        ..RunOptions::default()
    };
    match runner::run_plan(&plan, &options) {
        Ok(outcome) => {
            if let Some(message) = outcome.message() {
                eprintln!("nuvec launch: {message}");
            }
            ExitCode::from(outcome.exit_code())
        }
        Err(e) => {
            eprintln!("nuvec launch: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// The sweep the options describe.
fn sweep(args: &BenchArgs) -> Sweep {
    let sweep = Sweep {
        ops: args.ops.clone(),
        sizes: args
            .sizes
            .clone()
            .unwrap_or_else(|| bench::DEFAULT_SIZES.to_vec()),
        target: Duration::from_millis(args.target_ms),
        ..Sweep::default()
    };
    match args.iters {
        Some(n) => Sweep {
            min_iters: n,
            max_iters: n,
            ..sweep
        },
        None => sweep,
    }
}

/// Runs the sweep for each rank count, and the anchors asked for, then reports.
fn bench_launch(args: &BenchArgs) -> ExitCode {
    match bench_all(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("nuvec bench: {message}");
            ExitCode::FAILURE
        }
    }
}

fn bench_all(args: &BenchArgs) -> Result<(), String> {
    if args.ranks.iter().any(|&n| n < 2) || args.connections == 0 {
        return Err(
            "-n must be at least 2 (mlx.launch gives a single rank no ring) and \
                    --connections at least 1"
                .into(),
        );
    }
    if let Some(chart) = &args.chart
        && chart.extension().and_then(|e| e.to_str()) != Some("svg")
    {
        return Err(format!("--chart {}: charts are SVG files", chart.display()));
    }
    let sweep = sweep(args);
    let wanted = Wanted {
        mlx: args.mlx && anchors::has_anchor_ops(&sweep),
        mpi: args.mpi && anchors::has_anchor_ops(&sweep),
        limits: args.limits,
    };
    if (args.mlx || args.mpi) && !anchors::has_anchor_ops(&sweep) {
        eprintln!("nuvec bench: MLX's and MPI's sweeps have no sum_scatter; they are skipped");
    }
    let anchors = if wanted.mlx || wanted.mpi || wanted.limits {
        let anchors = Anchors::locate(args.anchors.clone(), args.anchor_env.clone())?;
        anchors.ensure(wanted)?;
        Some(anchors)
    } else {
        None
    };
    let mut report = Report::default();
    if let Some(anchors) = anchors.as_ref().filter(|_| wanted.limits) {
        println!("\n== raw TCP on loopback (tcp_pingpong spin, tcp_stream bidir) ==");
        let limits = anchors.run_limits(&sweep)?;
        for p in &limits.pingpong {
            println!(
                "ping-pong {:>8}: round trip median {}, p10 {}, p90 {} ({} iterations)",
                bench::human(p.bytes),
                bench::micros(p.rtt_median_us),
                bench::micros(p.rtt_p10_us),
                bench::micros(p.rtt_p90_us),
                p.iters
            );
        }
        if let Some(s) = &limits.stream {
            println!(
                "stream {} both ways: {:.3} GB/s per direction (median of {}, best {:.3})",
                bench::human(s.bytes),
                s.gbps_per_direction,
                s.reps,
                s.gbps_best
            );
        }
        report.limits = Some(limits);
    }
    for &ranks in &args.ranks {
        if runner::interrupted() {
            return Err("interrupted".into());
        }
        println!("\n== nuvec, {ranks} ranks ==");
        report.nuvec.push(NuvecRun {
            ranks,
            measurements: run_nuvec(args, ranks)?,
        });
        if let Some(anchors) = &anchors {
            if wanted.mlx {
                println!("\n== MLX ring (mlx.launch), {ranks} ranks ==");
                report.mlx.push(anchors.run_mlx(ranks, &sweep)?);
            }
            if wanted.mpi {
                println!("\n== Open MPI over TCP (mpirun), {ranks} ranks ==");
                report.mpi.push(anchors.run_mpi(ranks, &sweep)?);
            }
        }
    }
    report.compare();
    if report.has_anchors() {
        print!("{}", report::comparison_table(&report.comparison));
    }
    let wrong: Vec<String> = report
        .mlx
        .iter()
        .chain(&report.mpi)
        .flat_map(|r| {
            r.points
                .iter()
                .filter(|p| !p.correct)
                .map(move |p| format!("{} n={} {} {}", r.system, r.ranks, p.op, p.bytes))
        })
        .collect();
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
        println!("\nJSON: {}", path.display());
    }
    if let Some(path) = &args.chart {
        chart::write_chart(path, &report)?;
        println!("chart: {}", path.display());
    }
    if !wrong.is_empty() {
        return Err(format!("anchor results were wrong: {}", wrong.join(", ")));
    }
    Ok(())
}

/// Starts `ranks` workers (this program again) through the launcher and returns what rank
/// 0 measured.
fn run_nuvec(args: &BenchArgs, ranks: usize) -> Result<Vec<Measurement>, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let port = match args.starting_port {
        Some(port) => port,
        None => launch::free_port_block(ranks * args.connections).map_err(|e| e.to_string())?,
    };
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let results = dir.path().join(format!("nuvec-n{ranks}.json"));
    let mut command = vec![exe.to_string_lossy().into_owned(), "bench".into()];
    command.extend(worker_args(args, &results));
    let plan =
        launch::local_ring(ranks, args.connections, port, command).map_err(|e| e.to_string())?;
    let options = RunOptions {
        prefix_output: false,
        forward_stdin: false,
        name: "nuvec bench".into(),
        ..RunOptions::default()
    };
    let outcome = runner::run_plan(&plan, &options).map_err(|e| e.to_string())?;
    if let Some(message) = outcome.message() {
        return Err(format!("{ranks} ranks: {message}"));
    }
    let text = std::fs::read_to_string(&results)
        .map_err(|e| format!("{ranks} ranks: rank 0 wrote no results ({e})"))?;
    serde_json::from_str(&text).map_err(|e| format!("{ranks} ranks: reading the results: {e}"))
}

/// The arguments a worker rank gets: the sweep, as given, and where to write results.
fn worker_args(args: &BenchArgs, results: &std::path::Path) -> Vec<String> {
    let mut out = vec![
        "--worker".into(),
        "--ops".into(),
        args.ops
            .iter()
            .map(|o| o.name())
            .collect::<Vec<_>>()
            .join(","),
        "--target-ms".into(),
        args.target_ms.to_string(),
        "--results".into(),
        results.to_string_lossy().into_owned(),
    ];
    if let Some(sizes) = &args.sizes {
        out.push("--sizes".into());
        out.push(
            sizes
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(","),
        );
    }
    if let Some(iters) = args.iters {
        out.push("--iters".into());
        out.push(iters.to_string());
    }
    out
}

/// One rank of the sweep; rank 0 reports.
fn bench_worker(args: &BenchArgs) -> ExitCode {
    let group = match nuvec_distributed::init(true) {
        Ok(g) => g,
        Err(e) => {
            eprintln!(
                "nuvec bench: rank {}: {e}",
                std::env::var("MLX_RANK").unwrap_or_default()
            );
            return ExitCode::FAILURE;
        }
    };
    let measurements = match bench::run(&group, &sweep(args)) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("nuvec bench: rank {}: {e}", group.rank());
            return ExitCode::FAILURE;
        }
    };
    if group.rank() == 0 {
        bench::print_table(&measurements);
        if let Some(path) = &args.results {
            let text = serde_json::to_string_pretty(&measurements).unwrap_or_default();
            if let Err(e) = std::fs::write(path, text) {
                eprintln!("nuvec bench: writing {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
        }
        if measurements.iter().any(|m| !m.correct) {
            eprintln!("nuvec bench: some results were wrong (see the ok column)");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
