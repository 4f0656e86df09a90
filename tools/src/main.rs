//! `nuvec`: run and measure nuvec-distributed rings.
//!
//! `nuvec bench -n 2` starts two local ranks on loopback (as `mlx.launch -n 2` would) and
//! prints an all_sum latency and bandwidth table from 4 B to 64 MiB.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use nuvec_tools::bench::{self, Op, Sweep};
use nuvec_tools::launch::{LocalRing, Outcome};

/// Run and measure nuvec-distributed rings.
#[derive(Parser)]
#[command(name = "nuvec", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Measure collectives across local ranks on loopback.
    Bench(BenchArgs),
}

#[derive(Args, Clone)]
struct BenchArgs {
    /// Ranks to start on this machine.
    #[arg(short = 'n', long, default_value_t = 2)]
    ranks: usize,
    /// Connections between neighbours (addresses per rank).
    #[arg(long, default_value_t = 1)]
    connections: usize,
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
        Command::Bench(args) if args.worker => bench_worker(&args),
        Command::Bench(args) => bench_launch(&args),
    }
}

/// Starts the ranks: this program again, as workers.
fn bench_launch(args: &BenchArgs) -> ExitCode {
    if args.ranks == 0 || args.connections == 0 {
        eprintln!("nuvec bench: -n and --connections must be at least 1");
        return ExitCode::FAILURE;
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("nuvec bench: cannot find this program's path: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut forwarded: Vec<OsString> = std::env::args_os().skip(1).collect();
    forwarded.push("--worker".into());
    let mut ring = LocalRing::new(args.ranks);
    ring.connections = args.connections;
    ring.prefix_output = false;
    match ring.run(&exe, &forwarded) {
        Ok(Outcome::Success) => ExitCode::SUCCESS,
        Ok(Outcome::RankFailed { rank, status }) => {
            eprintln!("nuvec bench: rank {rank} failed ({status}); the other ranks were ended");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("nuvec bench: {e}");
            ExitCode::FAILURE
        }
    }
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
