//! `nuvec`: start and measure nuvec-distributed (and MLX) rings.
//!
//! `nuvec launch -n 2 -- PROGRAM ARGS` starts two ranks on this machine as `mlx.launch`
//! would (the same hostfile, `MLX_HOSTFILE` and `MLX_RANK`), `nuvec bench -n 2` measures
//! collectives across local ranks started the same way.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use nuvec_tools::bench::{self, Op, Sweep};
use nuvec_tools::launch::{self, Backend, HostList, LaunchSpec};
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
    /// An environment variable for every rank (repeatable).
    #[arg(long = "env", value_name = "K=V")]
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
struct BenchArgs {
    /// Ranks to start on this machine.
    #[arg(short = 'n', long, default_value_t = 2)]
    ranks: usize,
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
    /// Write the measurements as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Internal: run as one rank of a ring started by `nuvec bench`.
    #[arg(long, hide = true)]
    worker: bool,
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
    let spec = LaunchSpec {
        backend: args.backend,
        env: args.env,
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

/// Starts the ranks through the launcher: this program again, as workers.
fn bench_launch(args: &BenchArgs) -> ExitCode {
    let fail = |message: String| {
        eprintln!("nuvec bench: {message}");
        ExitCode::FAILURE
    };
    if args.ranks < 2 || args.connections == 0 {
        return fail(
            "-n must be at least 2 (mlx.launch gives a single rank no ring) and \
             --connections at least 1"
                .into(),
        );
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => return fail(format!("cannot find this program's path: {e}")),
    };
    let port = match args.starting_port {
        Some(port) => port,
        None => match launch::free_port_block(args.ranks * args.connections) {
            Ok(port) => port,
            Err(e) => return fail(e.to_string()),
        },
    };
    let mut command = vec![exe.to_string_lossy().into_owned(), "bench".into()];
    command.extend(worker_args(args));
    let plan = match launch::local_ring(args.ranks, args.connections, port, command) {
        Ok(plan) => plan,
        Err(e) => return fail(e.to_string()),
    };
    let options = RunOptions {
        prefix_output: false,
        forward_stdin: false,
        name: "nuvec bench".into(),
        ..RunOptions::default()
    };
    match runner::run_plan(&plan, &options) {
        Ok(outcome) => {
            if let Some(message) = outcome.message() {
                eprintln!("nuvec bench: {message}");
            }
            ExitCode::from(outcome.exit_code())
        }
        Err(e) => fail(e.to_string()),
    }
}

/// The arguments a worker rank gets: the sweep, as given.
fn worker_args(args: &BenchArgs) -> Vec<String> {
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
    if let Some(json) = &args.json {
        out.push("--json".into());
        out.push(json.to_string_lossy().into_owned());
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
    let sweep = Sweep {
        ops: args.ops.clone(),
        sizes: args
            .sizes
            .clone()
            .unwrap_or_else(|| bench::DEFAULT_SIZES.to_vec()),
        target: Duration::from_millis(args.target_ms),
        ..Sweep::default()
    };
    let sweep = match args.iters {
        Some(n) => Sweep {
            min_iters: n,
            max_iters: n,
            ..sweep
        },
        None => sweep,
    };
    let measurements = match bench::run(&group, &sweep) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("nuvec bench: rank {}: {e}", group.rank());
            return ExitCode::FAILURE;
        }
    };
    if group.rank() == 0 {
        bench::print_table(&measurements);
        if let Some(path) = &args.json {
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
