//! `nuvec`: start and measure nuvec-distributed (and MLX) rings.
//!
//! `nuvec launch -n 2 -- PROGRAM ARGS` starts two ranks on this machine as `mlx.launch`
//! would (the same ring address file, `MLX_HOSTFILE` and `MLX_RANK`), `nuvec bench -n 2` measures
//! collectives across local ranks started the same way, and `nuvec plan -n 16` prints the
//! algorithm the native wire takes for each collective and size, with the cost model's account.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use nuvec_distributed_engine::Backend as Wire;
use nuvec_distributed_engine::{Collective, Link, plan as engine_plan};
use nuvec_distributed_engine::{DType, KEY_VAR, SHM_VAR};
use nuvec_tools::anchors::{self, Anchors, Wanted};
use nuvec_tools::bench::{self, Case, Measurement, Op, RedOp, Sweep};
use nuvec_tools::chaos;
use nuvec_tools::chart;
use nuvec_tools::doctor::{self, DoctorArgs};
use nuvec_tools::launch::{self, Backend, HostList, LaunchSpec};
use nuvec_tools::report::{self, Header, NuvecRun, Report};
use nuvec_tools::runner::{self, RunOptions};
use nuvec_tools::skew;

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
    /// Check hosts before a launch: ssh, addresses, ports, links, MTU, Thunderbolt, RDMA.
    Doctor(DoctorArgs),
    /// Print the algorithm the native wire takes for each collective and size, with its
    /// rounds, messages per rank and the cost model's predicted time.
    Plan(PlanArgs),
    /// Read the flight records of a run's ranks and say what went wrong: where each rank
    /// stopped, the first call at which ranks differ, ranks behind or ahead, calls that did
    /// not finish.
    Flight(FlightArgs),
    /// Fault injection rounds (tools/chaos.sh): rings of 3 to 5 local ranks, one killed,
    /// stopped, cut off or late in each round; checks who the survivors blame.
    #[command(hide = true)]
    Chaos(ChaosArgs),
    /// Internal: one rank of a chaos round.
    #[command(hide = true)]
    ChaosRank(ChaosRankArgs),
}

/// `nuvec plan`.
#[derive(Args)]
#[command(
    after_help = "Each row: the collective, its bytes (an all_gather's: the whole output; a \
                  barrier has none), the algorithm the native wire takes, its rounds, the \
                  messages the busiest rank sends and the model's time. Up to the measured \
                  rank counts (P = 2 to 12 over TCP on loopback, 2 and 3 in shared memory) \
                  the algorithm is the measured table's; past them, and for --link network, \
                  the model's cheapest. The native wire prices every TCP group as loopback \
                  (a group cannot tell loopback from a network); --link network shows what \
                  the model would pick with the network's estimated constants."
)]
struct PlanArgs {
    /// Ranks in the group.
    #[arg(short = 'n', long, value_parser = clap::value_parser!(u32).range(1..))]
    ranks: u32,
    /// Bytes per collective, comma-separated; suffixes K and M (binary) allowed.
    #[arg(long, value_delimiter = ',', value_parser = parse_size,
          default_value = "4,64,1K,8K,64K,256K,1M,16M,64M")]
    sizes: Vec<usize>,
    /// The link the model prices: loopback, network (an estimate) or shm.
    #[arg(long, default_value = "loopback", value_parser = parse_link)]
    link: Link,
    /// Print a JSON list of objects (collective, bytes, ranks, link, algorithm, rounds,
    /// messages_per_rank, predicted_us) instead of the table.
    #[arg(long)]
    json: bool,
    /// Run every algorithm's real schedule on every rank under a simulated clock priced by
    /// the link's constants, and list each algorithm with the formula's time and the
    /// clock's (JSON: collective, bytes, ranks, link, algorithm, chosen, predicted_us,
    /// simulated_us, not_simulated). Takes seconds and up to 2 GiB of memory per algorithm
    /// at large sizes; an algorithm past that, or with more than 16384 messages in one
    /// round, is listed as not simulated.
    #[arg(long)]
    simulate: bool,
}

/// `nuvec flight`.
#[derive(Args)]
#[command(
    after_help = "A group writes its record as flight-rank<R>.json (and a Chrome/Perfetto \
                  trace, flight-rank<R>.trace.json) into NUVEC_DISTRIBUTED_FLIGHT_DIR when a \
                  call fails it; nuvec launch sets that directory for every rank when it is \
                  unset, and runs this command when a rank fails. Calls are compared by \
                  number: the k-th call of every rank pairs with the k-th of every other."
)]
struct FlightArgs {
    /// Directories holding `flight-rank<R>.json` files, or the files themselves.
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// Print the verdict as JSON.
    #[arg(long)]
    json: bool,
}

/// `--link`'s values: `loopback`, `network` or `shm`.
fn parse_link(s: &str) -> Result<Link, String> {
    s.trim().parse()
}

/// `nuvec chaos [N]`.
#[derive(Args)]
#[command(
    after_help = "With --recover, each round's fault is a kill (-9) or a stop (SIGSTOP) only: a \
                  cut link or a late rank leaves no failed process to restart. After the fault \
                  every survivor calls Group::shrink and verifies 5 collectives of random op \
                  and size on the shrunk group; a stopped victim is then woken (SIGCONT) and \
                  its own shrink must fail saying it was left out while the shrunk group keeps \
                  computing right; the victim is killed and started again at its hostfile \
                  address with a plain init, the survivors call Group::rejoin, and the full \
                  group verifies 5 more. A round is correct only if every step verified. The \
                  summary counts wrong results, hangs, panics, failed shrinks and failed \
                  rejoins apart, with the median and max time from a survivor's failed \
                  collective to its first verified one on the shrunk group; the exit status \
                  is non-zero if any round was not correct."
)]
struct ChaosArgs {
    /// Rounds to run.
    #[arg(default_value_t = 100)]
    rounds: usize,
    /// The first round's seed (each round prints its own; `1 --seed S` replays round S).
    #[arg(long)]
    seed: Option<u64>,
    /// The ranks' timeout in seconds (NUVEC_DISTRIBUTED_TIMEOUT).
    #[arg(long, default_value_t = 1.5)]
    timeout: f64,
    /// Collectives per round.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(3..))]
    steps: u32,
    /// The wire the ranks speak: mlx or native.
    #[arg(long, default_value = "mlx", value_parser = parse_wire)]
    wire: Wire,
    /// Print the ranks' output for rounds that are not correct.
    #[arg(long)]
    verbose: bool,
    /// Recover after each fault: shrink, verify, restart the victim, rejoin, verify (kill and
    /// stop faults only).
    #[arg(long)]
    recover: bool,
}

/// `nuvec chaos-rank`: what the chaos driver starts for each rank.
#[derive(Args)]
struct ChaosRankArgs {
    /// The round's seed.
    #[arg(long)]
    seed: u64,
    /// Collectives in the loop.
    #[arg(long)]
    steps: usize,
    /// Pause before this step (a late rank).
    #[arg(long, requires = "late_ms")]
    late_at: Option<usize>,
    /// How long to pause, in milliseconds.
    #[arg(long, requires = "late_at")]
    late_ms: Option<u64>,
    /// Recover after a failed collective (shrink, verify, rejoin on the driver's word).
    #[arg(long)]
    recover: bool,
    /// Restarted in place of a failed rank: a plain init, then the full group's collectives.
    #[arg(long)]
    restarted: bool,
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
                  status, naming it. If nuvec launch itself is killed (even with SIGKILL), \
                  its ranks are killed too and its temporary files removed, by a guardian \
                  process (and on Linux the parent-death signal); a remote rank's ssh is \
                  ended, which hangs up its terminal. Unless NUVEC_DISTRIBUTED_FLIGHT_DIR is \
                  set, every rank gets one directory of this run for its flight record; \
                  when a rank fails, nuvec launch prints what `nuvec flight` makes of the \
                  records written there, and keeps them."
)]
struct LaunchArgs {
    /// Repeat each host this many times (ranks per host).
    #[arg(short = 'n', long = "repeat-hosts", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..))]
    repeat_hosts: u32,
    /// Comma-separated hosts; an IP address is also where the ring listens.
    #[arg(long, default_value = launch::LOCAL_HOST)]
    hosts: String,
    /// A launch hostfile, as mlx.launch takes: a list of {"ssh", "ips", "rdma"} hosts, or
    /// {"backend", "envs", "hosts"}. Takes precedence over --hosts and -n. (Not the ring
    /// address file MLX_HOSTFILE names, which the launcher writes for each run.)
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
    /// The ring's wire for every rank (sets NUVEC_DISTRIBUTED_WIRE): mlx, MLX's own (the
    /// ranks' default), or native, between nuvec ranks only (faster small collectives,
    /// mismatched calls detected). Ring backend only.
    #[arg(long, value_parser = parse_wire)]
    wire: Option<Wire>,
    /// Log the setup and how each rank ends; sets MLX_RING_VERBOSE=1 for ring ranks.
    #[arg(long)]
    verbose: bool,
    /// The program to run and its arguments (after `--` if they start with `-`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

#[derive(Args, Clone)]
#[command(
    after_help = "The output is nccl-tests': per collective, size (bytes per rank), count \
                  (elements per rank), type, redop, time (the slowest rank's median, µs), \
                  algbw and busbw (GB/s) and #wrong (elements that differed from the \
                  expected result, on any rank). The sweep's methodology is that of the \
                  anchors' mlx_bench.py (see tools/src/bench.rs). With --mlx, --mpi or \
                  --limits the anchors run in the same invocation (float32 sums: their \
                  sweeps') and a comparison follows: latency ratios are anchor / nuvec \
                  (above 1: nuvec is faster; for raw TCP, the share of the floor reached), \
                  bandwidth is nuvec's bus bandwidth / raw TCP both ways at once."
)]
struct BenchArgs {
    /// Ranks to start on this machine; a comma-separated list sweeps each (e.g. 2,3,4).
    #[arg(short = 'n', long, value_delimiter = ',', default_value = "2")]
    ranks: Vec<usize>,
    /// Connections between neighbours (addresses per rank).
    #[arg(long, default_value_t = 1)]
    connections: usize,
    /// The wire the ranks speak: mlx (MLX's, the default) or native (nuvec ranks only).
    #[arg(long, default_value = "mlx", value_parser = parse_wire)]
    wire: Wire,
    /// The ring's first port (default: a free block of ports).
    #[arg(short = 'p', long)]
    starting_port: Option<u16>,
    /// Collectives to measure, comma-separated: all_sum (the all-reduce: see --op),
    /// all_gather, sum_scatter, sendrecv.
    #[arg(
        long,
        visible_alias = "ops",
        value_delimiter = ',',
        default_value = "all_sum"
    )]
    collectives: Vec<Op>,
    /// Reductions of the all-reduce, comma-separated: sum (all_sum), max (all_max), min
    /// (all_min). sum_scatter runs with sum only.
    #[arg(long, value_delimiter = ',', default_value = "sum")]
    op: Vec<RedOp>,
    /// Element types, comma-separated: bool, uint8, uint16, uint32, uint64, int8, int16,
    /// int32, int64, float16, bfloat16, float32, float64, complex64 (or f16, bf16, u8...).
    #[arg(long, value_delimiter = ',', default_value = "float32", value_parser = bench::parse_dtype)]
    dtype: Vec<DType>,
    /// Bytes per rank, comma-separated; suffixes K and M (binary) allowed. Each must be
    /// whole elements of every --dtype (the default sizes take at least one element).
    #[arg(long, value_delimiter = ',', value_parser = parse_size)]
    sizes: Option<Vec<usize>>,
    /// Timed milliseconds to aim for per size.
    #[arg(long, default_value_t = 1000)]
    target_ms: u64,
    /// Run exactly this many timed iterations per size (instead of aiming at --target-ms),
    /// at least 1: with none, the report would show zeros and no wrong elements having
    /// measured nothing.
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    iters: Option<usize>,
    /// Measure late arrivals instead of the sweep: per delay D (µs, comma-separated), the
    /// last rank arrives D late at an all_sum of the first --sizes (default 2 KiB) and rank
    /// 0 reports its excess wait (median, p90: its time minus D) and CPU per call. With
    /// --mpi or --mlx, the anchors' skew.py runs beside it. --iters caps the calls per
    /// delay (default 300).
    #[arg(long, value_delimiter = ',', value_name = "D,...")]
    skew: Vec<u64>,
    /// Measure the cost of sealing: for each rank count, the sweep on an unkeyed native
    /// group, then on one keyed with a fresh random key (NUVEC_DISTRIBUTED_KEY, passed to
    /// the keyed ranks only), each case side by side with keyed / unkeyed time and keyed
    /// bus bandwidth as % of unkeyed. Needs --wire native (MLX's wire is not sealed).
    /// Shared memory is never sealed, so both series run over TCP
    /// (NUVEC_DISTRIBUTED_SHM=0). The keyed ranks seal on NUVEC_DISTRIBUTED_SEAL_THREADS
    /// threads each (unset: this machine's CPUs per rank; the table's title says how
    /// many). Refused when NUVEC_DISTRIBUTED_KEY is already set: the unkeyed series could
    /// not run without it.
    #[arg(long)]
    sealed: bool,
    /// Write everything measured (nuvec, the anchors, the comparison) as JSON to this file.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Also run MLX's ring: mlx_bench.py under mlx.launch, for each rank count.
    #[arg(long)]
    mlx: bool,
    /// Also run Open MPI over TCP on loopback: mpi_bench.py under mpirun.
    #[arg(long)]
    mpi: bool,
    /// The transport of --mpi: `tcp` (loopback), or Open MPI's shared memory, `vader`
    /// (Open MPI 4) or `sm` (Open MPI 5), beside nuvec's shared memory (--wire native).
    #[arg(long, value_enum, default_value_t = anchors::MpiBtl::Tcp)]
    mpi_btl: anchors::MpiBtl,
    /// Also measure raw TCP: a busy-polling ping-pong per size up to 1 MiB, and a 64 MiB
    /// stream both ways at once.
    #[arg(long)]
    limits: bool,
    /// The anchors folder (default: tools/anchors in the repository nuvec was built from).
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
    /// No progress line on stderr (there is none either when stderr is not a terminal).
    #[arg(short = 'q', long)]
    quiet: bool,
    /// Internal: run as one rank of a ring started by `nuvec bench`.
    #[arg(long, hide = true)]
    worker: bool,
    /// Internal: where a worker's rank 0 notes each case it starts.
    #[arg(long, hide = true)]
    progress: Option<PathBuf>,
    /// Internal: where a worker's rank 0 writes its measurements as JSON.
    #[arg(long, hide = true)]
    results: Option<PathBuf>,
}

/// `--wire`'s values, as [`WIRE_VAR`](nuvec_distributed_engine::WIRE_VAR) takes them:
/// `mlx` (also `ring`: MLX's wire, the ring backend) or `native`.
fn parse_wire(s: &str) -> Result<Wire, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "mlx" | "ring" => Ok(Wire::Ring),
        "native" => Ok(Wire::Native),
        _ => Err(format!("{s:?} is not a wire: use \"mlx\" or \"native\"")),
    }
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
    let bytes = n
        .checked_mul(scale)
        .filter(|&b| b > 0)
        .ok_or_else(|| format!("{s:?}: sizes are a positive number of bytes"))?;
    Ok(bytes)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Launch(args) => launch(args),
        Command::Bench(args) if args.worker => bench_worker(&args),
        Command::Bench(args) => bench_launch(&args),
        Command::Doctor(args) => doctor::main(&args),
        Command::Plan(args) => plan(&args),
        Command::Flight(args) => flight(&args),
        Command::Chaos(args) => chaos(&args),
        Command::ChaosRank(args) => ExitCode::from(chaos::rank(&chaos::RankPlan {
            seed: args.seed,
            steps: args.steps,
            late: args.late_at.zip(args.late_ms.map(Duration::from_millis)),
            recover: args.recover,
            restarted: args.restarted,
        })),
    }
}

/// `nuvec flight`: the verdict on the records, or an error naming the record that cannot
/// be read (exit status 2).
fn flight(args: &FlightArgs) -> ExitCode {
    let dumps = match nuvec_tools::flight::read(&args.paths) {
        Ok(dumps) => dumps,
        Err(e) => {
            eprintln!("nuvec flight: {e}");
            return ExitCode::from(2);
        }
    };
    let verdict = nuvec_tools::flight::analyse(&dumps);
    if args.json {
        return print_json("flight", &verdict);
    }
    print!("{}", verdict.text());
    ExitCode::SUCCESS
}

/// One row of `nuvec plan --json`.
#[derive(serde::Serialize)]
struct PlanRow {
    collective: &'static str,
    bytes: u64,
    ranks: usize,
    link: &'static str,
    algorithm: &'static str,
    rounds: usize,
    messages_per_rank: usize,
    predicted_us: f64,
}

/// The sizes `nuvec plan` lists `collective` at: the barrier once, with no bytes.
fn plan_sizes(args: &PlanArgs, collective: Collective) -> Vec<u64> {
    if collective == Collective::Barrier {
        vec![0]
    } else {
        args.sizes.iter().map(|&b| b as u64).collect()
    }
}

/// The rows of `nuvec plan`: every collective at every size (the barrier once, with no
/// bytes).
fn plan_rows(args: &PlanArgs) -> Vec<PlanRow> {
    let ranks = args.ranks as usize;
    let mut rows = Vec::new();
    for collective in Collective::ALL {
        for bytes in plan_sizes(args, collective) {
            let p = engine_plan(collective, args.link, ranks, bytes);
            rows.push(PlanRow {
                collective: collective.into(),
                bytes,
                ranks,
                link: args.link.into(),
                algorithm: p.algorithm,
                rounds: p.rounds,
                messages_per_rank: p.messages_per_rank,
                predicted_us: p.predicted_us,
            });
        }
    }
    rows
}

/// Prints `value` as pretty JSON for `nuvec command`, or says why it cannot.
fn print_json(command: &str, value: &impl serde::Serialize) -> ExitCode {
    match serde_json::to_string_pretty(value) {
        Ok(text) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("nuvec {command}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// One row of `nuvec plan --simulate --json`: one algorithm of one collective.
#[derive(serde::Serialize)]
struct SimulatedRow {
    collective: &'static str,
    bytes: u64,
    ranks: usize,
    link: &'static str,
    algorithm: &'static str,
    chosen: bool,
    predicted_us: f64,
    simulated_us: Option<f64>,
    not_simulated: Option<&'static str>,
}

/// The rows of `nuvec plan --simulate`: every algorithm of every collective at every size.
fn simulated_rows(args: &PlanArgs) -> Result<Vec<SimulatedRow>, nuvec_distributed_engine::Error> {
    let ranks = args.ranks as usize;
    let mut rows = Vec::new();
    for collective in Collective::ALL {
        for bytes in plan_sizes(args, collective) {
            for s in nuvec_distributed_engine::simulate(collective, args.link, ranks, bytes)? {
                rows.push(SimulatedRow {
                    collective: collective.into(),
                    bytes,
                    ranks,
                    link: args.link.into(),
                    algorithm: s.algorithm,
                    chosen: s.chosen,
                    predicted_us: s.predicted_us,
                    simulated_us: s.simulated_us.ok(),
                    not_simulated: s.simulated_us.err(),
                });
            }
        }
    }
    Ok(rows)
}

/// `nuvec plan --simulate`.
fn plan_simulated(args: &PlanArgs) -> ExitCode {
    let rows = match simulated_rows(args) {
        Ok(rows) => rows,
        Err(e) => {
            eprintln!("nuvec plan --simulate: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.json {
        return print_json("plan", &rows);
    }
    println!(
        "# {} ranks, link {}: every algorithm's schedule under a simulated clock \
         (* the plan's choice, < the clock's fastest)",
        args.ranks, args.link
    );
    println!(
        "# {:<11} {:>12}  {:<19} {:>15} {:>15}",
        "collective", "bytes", "algorithm", "predicted (µs)", "simulated (µs)"
    );
    for r in &rows {
        let best = rows
            .iter()
            .filter(|o| o.collective == r.collective && o.bytes == r.bytes)
            .filter_map(|o| o.simulated_us)
            .min_by(f64::total_cmp);
        let simulated = match (r.simulated_us, r.not_simulated) {
            (Some(t), _) => format!("{t:.1}"),
            (None, why) => format!("- ({})", why.unwrap_or("not run")),
        };
        let marks = format!(
            "{}{}",
            if r.chosen { "*" } else { " " },
            if r.simulated_us.is_some() && r.simulated_us == best {
                "<"
            } else {
                " "
            }
        );
        println!(
            "{marks}{:<11} {:>12}  {:<19} {:>15.1} {:>15}",
            r.collective, r.bytes, r.algorithm, r.predicted_us, simulated
        );
    }
    ExitCode::SUCCESS
}

fn plan(args: &PlanArgs) -> ExitCode {
    if args.simulate {
        return plan_simulated(args);
    }
    let rows = plan_rows(args);
    if args.json {
        return print_json("plan", &rows);
    }
    let cost = args.link.cost();
    let source = if args.link == Link::Network {
        "an estimate (10 GbE between hosts), not a measurement"
    } else {
        "measured at P = 2 on a 2-core VM"
    };
    println!("# {} ranks, link {}: {source}", args.ranks, args.link);
    println!(
        "# α {:.2} µs per round, {:.2} µs CPU per message, {:.2} GB/s, folding {:.2} GB/s",
        cost.alpha_us,
        cost.cpu_us,
        cost.bytes_per_us / 1000.0,
        cost.fold_bytes_per_us / 1000.0
    );
    println!(
        "# {:<11} {:>12}  {:<19} {:>6} {:>14} {:>15}",
        "collective", "bytes", "algorithm", "rounds", "messages/rank", "predicted (µs)"
    );
    for r in &rows {
        println!(
            "  {:<11} {:>12}  {:<19} {:>6} {:>14} {:>15.1}",
            r.collective, r.bytes, r.algorithm, r.rounds, r.messages_per_rank, r.predicted_us
        );
    }
    ExitCode::SUCCESS
}

fn chaos(args: &ChaosArgs) -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(exe) => exe.to_string_lossy().into_owned(),
        Err(e) => {
            eprintln!("nuvec chaos: cannot find this program: {e}");
            return ExitCode::FAILURE;
        }
    };
    if !(args.timeout.is_finite() && args.timeout > 0.0) {
        eprintln!(
            "nuvec chaos: --timeout {}: seconds, more than 0",
            args.timeout
        );
        return ExitCode::FAILURE;
    }
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() ^ u64::from(d.subsec_nanos()))
            .unwrap_or(1)
    });
    let summary = chaos::run(&chaos::Options {
        rounds: args.rounds,
        seed,
        timeout: Duration::from_secs_f64(args.timeout),
        steps: args.steps as usize,
        rank_program: vec![exe, "chaos-rank".into()],
        verbose: args.verbose,
        wire: args.wire,
        recover: args.recover,
    });
    print!("{summary}");
    if summary.failures() > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
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
    let mut env = match launch::resolve_env_args(&args.env, &|name| std::env::var_os(name)) {
        Ok(env) => env,
        Err(e) => return fail(e.to_string()),
    };
    let flight_dir = flight_dir_for_launch(&mut env, &hosts.envs);
    let spec = LaunchSpec {
        backend: args.backend,
        env,
        starting_port: args.starting_port,
        connections_per_ip: args.connections_per_ip as usize,
        cwd: args.cwd,
        verbose: args.verbose,
        python: args.python,
        wire: args.wire,
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
            if let (Some(dir), false) = (flight_dir, matches!(outcome, runner::Outcome::Success)) {
                report_flight(dir);
            }
            ExitCode::from(outcome.exit_code())
        }
        Err(e) => {
            eprintln!("nuvec launch: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// A directory of this run for the ranks' flight records, set as
/// `NUVEC_DISTRIBUTED_FLIGHT_DIR` in `env` for every rank, unless the user set that
/// variable (with `--env`, in the hostfile's `envs`, or in the launcher's environment,
/// which local ranks inherit). `None` then, or when no temporary directory can be made
/// (said on stderr: the launch goes on without it).
fn flight_dir_for_launch(env: &mut Vec<String>, hostfile: &[String]) -> Option<tempfile::TempDir> {
    let var = nuvec_distributed_engine::FLIGHT_DIR_VAR;
    let sets = |entry: &String| entry.split_once('=').is_some_and(|(k, _)| k == var);
    if env.iter().chain(hostfile).any(sets) || std::env::var_os(var).is_some() {
        return None;
    }
    match tempfile::Builder::new().prefix("nuvec-flight-").tempdir() {
        Ok(dir) => {
            env.push(format!("{var}={}", dir.path().display()));
            Some(dir)
        }
        Err(e) => {
            eprintln!(
                "nuvec launch: no directory for the ranks' flight records ({e}); a failure \
                 will not be analysed"
            );
            None
        }
    }
}

/// After a failed launch: the verdict of `nuvec flight` on the records the ranks of this
/// host wrote into `dir`, which is kept for a closer look; nothing (and `dir` removed) if
/// no rank wrote one (no call failed a group: the program failed otherwise).
fn report_flight(dir: tempfile::TempDir) {
    let Ok(dumps) = nuvec_tools::flight::read(&[dir.path().to_path_buf()]) else {
        return;
    };
    let verdict = nuvec_tools::flight::analyse(&dumps);
    let path = dir.keep();
    eprintln!(
        "nuvec launch: flight records of the ranks in {} (`nuvec flight {0}`; ranks on \
         other hosts wrote theirs into the same path there):",
        path.display()
    );
    for line in verdict.text().lines() {
        match line {
            "" => eprintln!("nuvec launch:"),
            _ => eprintln!("nuvec launch:   {line}"),
        }
    }
}

/// The sweep the options describe.
fn sweep(args: &BenchArgs) -> Sweep {
    let sweep = Sweep {
        ops: args.collectives.clone(),
        redops: args.op.clone(),
        dtypes: args.dtype.clone(),
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

/// The anchors' installation, checked to hold what `wanted` needs; `None` when it wants
/// nothing.
fn locate_anchors(args: &BenchArgs, wanted: Wanted) -> Result<Option<Anchors>, String> {
    if !(wanted.mlx || wanted.mpi || wanted.limits) {
        return Ok(None);
    }
    let anchors = Anchors::locate(args.anchors.clone(), args.anchor_env.clone())?;
    anchors.ensure(wanted)?;
    Ok(Some(anchors))
}

/// This machine's header, with the load sampled now, printed before the tables.
fn print_header(args: &BenchArgs) -> Header {
    let mut header = Header::detect(args.connections, args.wire);
    header.set_load(&nuvec_tools::load::sample(nuvec_tools::load::WINDOW));
    print!("{}", header.text());
    header
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
    for &bytes in args.sizes.iter().flatten() {
        if let Some(d) = args.dtype.iter().find(|d| !bytes.is_multiple_of(d.size())) {
            return Err(format!(
                "--sizes {bytes}: not a whole number of {d} elements ({} bytes each)",
                d.size()
            ));
        }
    }
    if args.sealed {
        check_sealed(args, std::env::var_os(KEY_VAR).is_some())?;
    }
    if !args.skew.is_empty() {
        return bench_skew(args);
    }
    let sweep = sweep(args);
    if sweep.cases(2).is_empty() {
        return Err("nothing to measure: sum_scatter reduces with sum only (see --op)".into());
    }
    let anchor_ops = anchors::has_anchor_ops(&sweep);
    if (args.mlx || args.mpi)
        && !(args.dtype.contains(&DType::F32)
            && (args.op.contains(&RedOp::Sum) || !sweep.ops.contains(&Op::AllSum)))
    {
        return Err(
            "--mlx and --mpi run the anchors' sweeps, which are float32 sums: add float32 to \
             --dtype and sum to --op"
                .into(),
        );
    }
    let wanted = Wanted {
        mlx: args.mlx && anchor_ops,
        mpi: args.mpi && anchor_ops,
        limits: args.limits,
    };
    if (args.mlx || args.mpi) && !anchor_ops {
        eprintln!("nuvec bench: MLX's and MPI's sweeps have no sum_scatter; they are skipped");
    }
    let anchors = locate_anchors(args, wanted)?;
    let header = print_header(args);
    // A fresh key per invocation: the keyed series measures sealing, and a key that
    // outlives the run would be one more secret to keep.
    let key = args.sealed.then(fresh_key);
    if args.sealed {
        println!(
            "# {:<12} unkeyed, then keyed with a fresh random key, per rank count; shared \
             memory off (NUVEC_DISTRIBUTED_SHM=0) for both: it is never sealed",
            "sealed"
        );
    }
    let mut sealed: Vec<SealedRun> = Vec::new();
    let mut report = Report {
        header: Some(header),
        ..Report::default()
    };
    if let Some(anchors) = anchors.as_ref().filter(|_| wanted.limits) {
        println!("\n== raw TCP on loopback (tcp_pingpong spin, tcp_stream bidir) ==");
        let limits = anchors.run_limits(&sweep)?;
        for p in &limits.pingpong {
            println!(
                "ping-pong {:>8}: round trip median {:.2} µs, p10 {:.2} µs, p90 {:.2} µs \
                 ({} iterations)",
                bench::human(p.bytes),
                p.rtt_median_us,
                p.rtt_p10_us,
                p.rtt_p90_us,
                p.iters
            );
        }
        if let Some(s) = &limits.stream {
            println!(
                "stream {} both ways: {:.3} GB/s per direction (median of {}, best {:.3} GB/s)",
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
        let (measurements, transport) = run_nuvec(args, ranks, Keying::from(key.is_some()))?;
        let run = NuvecRun {
            ranks,
            transport,
            measurements,
        };
        print!("{}", report::nuvec_tables(&run));
        if let Some(key) = &key {
            if runner::interrupted() {
                return Err("interrupted".into());
            }
            let (measurements, transport) = run_nuvec(args, ranks, Keying::Keyed(key))?;
            let keyed = NuvecRun {
                ranks,
                transport,
                measurements,
            };
            print!("{}", report::named_tables(&keyed, "nuvec sealed"));
            let rows = bench::sealed_rows(&run.measurements, &keyed.measurements);
            let seal_threads = seal_threads(ranks);
            print!("{}", bench::sealed_table(ranks, seal_threads, &rows));
            sealed.push(SealedRun {
                ranks,
                seal_threads,
                transport: keyed.transport,
                measurements: keyed.measurements,
                comparison: rows,
            });
        }
        report.nuvec.push(run);
        if let Some(anchors) = &anchors {
            if wanted.mlx {
                println!("\n== MLX ring (mlx.launch), {ranks} ranks ==");
                let run = anchors.run_mlx(ranks, &sweep)?;
                print!("{}", report::anchor_tables(&run));
                report.mlx.push(run);
            }
            if wanted.mpi {
                println!(
                    "\n== Open MPI {} (mpirun), {ranks} ranks ==",
                    args.mpi_btl.describe()
                );
                let run = anchors.run_mpi(ranks, &sweep, args.mpi_btl)?;
                print!("{}", report::anchor_tables(&run));
                report.mpi.push(run);
            }
        }
    }
    if let Some(header) = report.header.as_mut() {
        header.set_transport(&report.nuvec);
    }
    report.compare();
    if report.has_anchors() {
        print!("{}", report::comparison_table(&report.comparison));
    }
    let wrong_of = |series: &'static str, runs: Vec<&[Measurement]>| {
        runs.into_iter()
            .flatten()
            .filter(|m| !m.correct())
            .map(move |m| {
                let redop = m.redop.map(|r| format!(" {r}")).unwrap_or_default();
                format!(
                    "{series}n={} {} {}{redop} {} B: {} elements",
                    m.ranks, m.op, m.dtype, m.bytes, m.wrong
                )
            })
            .collect::<Vec<String>>()
    };
    let mut nuvec_wrong = wrong_of(
        "",
        report.nuvec.iter().map(|r| &r.measurements[..]).collect(),
    );
    nuvec_wrong.extend(wrong_of(
        "sealed ",
        sealed.iter().map(|r| &r.measurements[..]).collect(),
    ));
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
        let mut value = serde_json::to_value(&report).map_err(|e| e.to_string())?;
        if args.sealed
            && let Some(object) = value.as_object_mut()
        {
            let runs = serde_json::to_value(&sealed).map_err(|e| e.to_string())?;
            object.insert("sealed".into(), runs);
        }
        let text = serde_json::to_string_pretty(&value).map_err(|e| e.to_string())?;
        std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
        println!("\nJSON: {}", path.display());
    }
    if let Some(path) = &args.chart {
        chart::write_chart(path, &report)?;
        println!("chart: {}", path.display());
    }
    if !nuvec_wrong.is_empty() {
        return Err(format!(
            "nuvec's results were wrong: {}",
            nuvec_wrong.join(", ")
        ));
    }
    if !wrong.is_empty() {
        return Err(format!("anchor results were wrong: {}", wrong.join(", ")));
    }
    Ok(())
}

/// The progress line of a run of `cases`, on stderr; hidden with --quiet or when stderr is
/// not a terminal (a log file gets the tables alone).
fn progress_bar(args: &BenchArgs, ranks: usize, cases: usize) -> ProgressBar {
    if args.quiet || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(cases as u64);
    if let Ok(style) = ProgressStyle::with_template(
        "{spinner} nuvec, {prefix} ranks [{bar:24}] {pos}/{len} {wide_msg} {elapsed}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(ranks.to_string());
    bar.set_message("starting the ranks");
    bar.enable_steady_tick(Duration::from_millis(100));
    bar
}

/// Follows rank 0's progress file until `stop`: each line is the index of the case it
/// started.
fn follow_progress(path: &Path, cases: &[Case], bar: &ProgressBar, stop: &AtomicBool) {
    let mut shown = None;
    while !stop.load(Ordering::Relaxed) {
        let last = std::fs::read_to_string(path).ok().and_then(|text| {
            text.lines()
                .filter_map(|l| l.trim().parse::<usize>().ok())
                .next_back()
        });
        if let Some(i) = last
            && shown != Some(i)
        {
            bar.set_position(i as u64);
            if let Some(case) = cases.get(i) {
                bar.set_message(case.to_string());
            }
            shown = Some(i);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The keyed series of `--sealed`, for one rank count: its measurements, and each case
/// beside the unkeyed one (in the JSON report under `sealed`).
#[derive(serde::Serialize)]
struct SealedRun {
    ranks: usize,
    /// The threads each keyed rank sealed and opened its records on.
    seal_threads: usize,
    transport: String,
    measurements: Vec<Measurement>,
    comparison: Vec<bench::SealedRow>,
}

/// The threads each of `ranks` keyed ranks on this host seals on: what the ranks read from
/// their environment (`NUVEC_DISTRIBUTED_SEAL_THREADS`, which they inherit and which fails
/// them when malformed), else the engine's default for that many ranks here.
fn seal_threads(ranks: usize) -> usize {
    let mut options = nuvec_distributed_engine::Options::default();
    options.seal_threads = std::env::var(nuvec_distributed_engine::SEAL_THREADS_VAR)
        .ok()
        .and_then(|v| v.trim().parse().ok());
    options.seal_threads_for(ranks)
}

/// How a run's ranks are keyed.
#[derive(Clone, Copy)]
enum Keying<'a> {
    /// As the launcher's environment says (no `--sealed`).
    Inherited,
    /// `--sealed`'s unkeyed series: shared memory off; [`check_sealed`] made sure no key
    /// is inherited.
    Unkeyed,
    /// `--sealed`'s keyed series: this key, shared memory off.
    Keyed(&'a str),
}

impl From<bool> for Keying<'_> {
    /// The first series of a run: unkeyed with `--sealed`, else as inherited.
    fn from(sealed: bool) -> Self {
        if sealed {
            Keying::Unkeyed
        } else {
            Keying::Inherited
        }
    }
}

/// What `--sealed` needs of the other options and of the environment (`key_set`: whether
/// NUVEC_DISTRIBUTED_KEY is set here).
fn check_sealed(args: &BenchArgs, key_set: bool) -> Result<(), String> {
    if args.wire != Wire::Native {
        return Err(
            "--sealed measures the native wire's sealing, and MLX's wire is not sealed: add \
             --wire native"
                .into(),
        );
    }
    if !args.skew.is_empty() {
        return Err("--sealed measures the sweep: it does not combine with --skew".into());
    }
    if key_set {
        return Err(format!(
            "--sealed makes its own random key for the keyed series, and the unkeyed series \
             cannot run with {KEY_VAR} set, which every rank inherits: unset it"
        ));
    }
    Ok(())
}

/// A fresh random key: 32 random bytes, hex-encoded (64 characters; the key needs 16).
fn fresh_key() -> String {
    rand::random::<[u8; 32]>()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Starts `ranks` workers (this program again) through the launcher and returns what rank
/// 0 measured, and what carried each link as the ranks reported it.
fn run_nuvec(
    args: &BenchArgs,
    ranks: usize,
    keying: Keying<'_>,
) -> Result<(Vec<Measurement>, String), String> {
    let (text, transport) = run_workers(args, ranks, keying)?;
    let measurements = serde_json::from_str(&text)
        .map_err(|e| format!("{ranks} ranks: reading the results: {e}"))?;
    Ok((measurements, transport))
}

/// Starts `ranks` workers through the launcher and returns the results rank 0 wrote (JSON)
/// and what carried each link.
fn run_workers(
    args: &BenchArgs,
    ranks: usize,
    keying: Keying<'_>,
) -> Result<(String, String), String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let port = match args.starting_port {
        Some(port) => port,
        None => launch::free_port_block(ranks * args.connections).map_err(|e| e.to_string())?,
    };
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let results = dir.path().join(format!("nuvec-n{ranks}.json"));
    let mut command = vec![exe.to_string_lossy().into_owned(), "bench".into()];
    command.extend(worker_args(args, &results, &dir.path().join("progress")));
    let mut plan = launch::local_ring(ranks, args.connections, port, Some(args.wire), command)
        .map_err(|e| e.to_string())?;
    match keying {
        Keying::Inherited => {}
        Keying::Unkeyed => plan.env.push((SHM_VAR.into(), "0".into())),
        Keying::Keyed(key) => {
            plan.env.push((SHM_VAR.into(), "0".into()));
            plan.env.push((KEY_VAR.into(), key.into()));
        }
    }
    let options = RunOptions {
        prefix_output: false,
        forward_stdin: false,
        name: "nuvec bench".into(),
        ..RunOptions::default()
    };
    let cases = if args.skew.is_empty() {
        sweep(args).cases(ranks)
    } else {
        Vec::new()
    };
    let progress = dir.path().join("progress");
    let bar = progress_bar(args, ranks, cases.len());
    let stop = AtomicBool::new(false);
    let outcome = std::thread::scope(|scope| {
        scope.spawn(|| follow_progress(&progress, &cases, &bar, &stop));
        let outcome = runner::run_plan(&plan, &options);
        stop.store(true, Ordering::Relaxed);
        outcome
    });
    bar.finish_and_clear();
    let outcome = outcome.map_err(|e| e.to_string())?;
    if let Some(message) = outcome.message() {
        return Err(format!("{ranks} ranks: {message}"));
    }
    let text = std::fs::read_to_string(&results)
        .map_err(|e| format!("{ranks} ranks: rank 0 wrote no results ({e})"))?;
    // Written before the measurements: a run that measured reported its links.
    let transport = std::fs::read_to_string(links_path(&results))
        .map_err(|e| format!("{ranks} ranks: rank 0 reported no links ({e})"))?;
    Ok((text, transport.trim().to_string()))
}

/// Where a worker's rank 0 writes what carried each link, beside its results.
fn links_path(results: &Path) -> PathBuf {
    let mut path = results.as_os_str().to_owned();
    path.push(".links");
    PathBuf::from(path)
}

/// The arguments a worker rank gets: the sweep, as given, and where to write results and
/// progress.
fn worker_args(args: &BenchArgs, results: &Path, progress: &Path) -> Vec<String> {
    let names = |names: Vec<&str>| names.join(",");
    let mut out = vec![
        "--worker".into(),
        "--collectives".into(),
        names(args.collectives.iter().map(|o| o.name()).collect()),
        "--op".into(),
        names(args.op.iter().map(|o| o.name()).collect()),
        "--dtype".into(),
        names(args.dtype.iter().map(|d| d.name()).collect()),
        "--progress".into(),
        progress.to_string_lossy().into_owned(),
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
    if !args.skew.is_empty() {
        out.push("--skew".into());
        out.push(
            args.skew
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(","),
        );
    }
    out
}

/// The all_sum size of a skew run: the first of --sizes, else skew.py's.
fn skew_bytes(args: &BenchArgs) -> usize {
    args.sizes
        .as_ref()
        .and_then(|s| s.first().copied())
        .unwrap_or(skew::DEFAULT_BYTES)
}

/// The most calls per delay of a skew run: --iters, else skew.py's.
fn skew_iters(args: &BenchArgs) -> usize {
    args.iters.unwrap_or(300)
}

/// `nuvec bench --skew`: for each rank count, nuvec's late-arrival costs, then the anchors'.
fn bench_skew(args: &BenchArgs) -> Result<(), String> {
    let bytes = skew_bytes(args);
    if !bytes.is_multiple_of(4) {
        return Err(format!(
            "--skew measures a float32 all_sum: --sizes {bytes} is not whole float32 elements"
        ));
    }
    let anchors = locate_anchors(
        args,
        Wanted {
            mlx: args.mlx,
            mpi: args.mpi,
            limits: false,
        },
    )?;
    let header = print_header(args);
    let what = format!(
        "all_sum float32 {}, the last rank {{}} late",
        bench::human(bytes)
    );
    let mut wrong = Vec::new();
    let mut runs = Vec::new();
    for &ranks in &args.ranks {
        if runner::interrupted() {
            return Err("interrupted".into());
        }
        let (text, transport) = run_workers(args, ranks, Keying::Inherited)?;
        let points: Vec<skew::SkewPoint> = serde_json::from_str(&text)
            .map_err(|e| format!("{ranks} ranks: reading the results: {e}"))?;
        let title = format!(
            "nuvec, {} wire, {ranks} ranks ({transport}): {}",
            nuvec_tools::wire_name(args.wire),
            what.replace("{}", "D µs")
        );
        print!("{}", skew::table(&title, &points));
        wrong.extend(
            points
                .iter()
                .filter(|p| p.wrong > 0)
                .map(|p| format!("n={ranks} D={} µs: {} elements", p.delay_us, p.wrong)),
        );
        runs.push(serde_json::json!({"system": "nuvec", "ranks": ranks, "points": points}));
        if let Some(anchors) = &anchors {
            let mut run_anchor = |system: &str, btl: Option<anchors::MpiBtl>| {
                let points = anchors.run_skew(ranks, btl, bytes, &args.skew, skew_iters(args))?;
                print!(
                    "{}",
                    skew::table(&format!("{system}, {ranks} ranks"), &points)
                );
                runs.push(serde_json::json!({"system": system, "ranks": ranks, "points": points}));
                Ok::<(), String>(())
            };
            if args.mpi {
                run_anchor(
                    &format!("Open MPI {}", args.mpi_btl.describe()),
                    Some(args.mpi_btl),
                )?;
            }
            if args.mlx {
                run_anchor("MLX ring", None)?;
            }
        }
    }
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&serde_json::json!({
            "header": header,
            "skew": runs,
        }))
        .map_err(|e| e.to_string())?;
        std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
        println!("\nJSON: {}", path.display());
    }
    if !wrong.is_empty() {
        return Err(format!("nuvec's results were wrong: {}", wrong.join(", ")));
    }
    Ok(())
}

/// One rank of a skew run; rank 0 writes the points.
fn skew_worker(args: &BenchArgs, group: &nuvec_distributed_engine::Group) -> ExitCode {
    let points = match skew::run(group, skew_bytes(args), &args.skew, skew_iters(args)) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("nuvec bench: rank {}: {e}", group.rank());
            return ExitCode::FAILURE;
        }
    };
    if group.rank() == 0 {
        let text = serde_json::to_string_pretty(&points).unwrap_or_default();
        match &args.results {
            Some(path) => {
                if let Err(e) = std::fs::write(path, text) {
                    eprintln!("nuvec bench: writing {}: {e}", path.display());
                    return ExitCode::FAILURE;
                }
            }
            None => print!("{}", skew::table("skew", &points)),
        }
    }
    ExitCode::SUCCESS
}

/// One rank of the sweep; rank 0 reports.
fn bench_worker(args: &BenchArgs) -> ExitCode {
    let group = match nuvec_distributed_engine::init(true) {
        Ok(g) => g,
        Err(e) => {
            eprintln!(
                "nuvec bench: rank {}: {e}",
                std::env::var("MLX_RANK").unwrap_or_default()
            );
            return ExitCode::FAILURE;
        }
    };
    let links = match report::gather_links(&group) {
        Ok(links) => links,
        Err(e) => {
            eprintln!(
                "nuvec bench: rank {}: gathering the links: {e}",
                group.rank()
            );
            return ExitCode::FAILURE;
        }
    };
    if group.rank() == 0
        && let Some(path) = &args.results
        && let Err(e) = std::fs::write(links_path(path), &links)
    {
        eprintln!("nuvec bench: writing {}: {e}", links_path(path).display());
        return ExitCode::FAILURE;
    }
    // Rank 0 notes each case it starts for the launcher's progress line; a note that
    // cannot be written costs only the display.
    let mut notes = args
        .progress
        .as_ref()
        .filter(|_| group.rank() == 0)
        .and_then(|p| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .ok()
        });
    if !args.skew.is_empty() {
        return skew_worker(args, &group);
    }
    let measurements = match bench::run_with(&group, &sweep(args), |i, _| {
        if let Some(file) = notes.as_mut() {
            use std::io::Write;
            let _ = writeln!(file, "{i}");
        }
    }) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("nuvec bench: rank {}: {e}", group.rank());
            return ExitCode::FAILURE;
        }
    };
    // Rank 0 hands its results to the launcher, which prints them (wrong results too:
    // the table shows them, and the launcher fails after it).
    if group.rank() == 0 {
        match &args.results {
            Some(path) => {
                let text = serde_json::to_string_pretty(&measurements).unwrap_or_default();
                if let Err(e) = std::fs::write(path, text) {
                    eprintln!("nuvec bench: writing {}: {e}", path.display());
                    return ExitCode::FAILURE;
                }
            }
            None => print!(
                "{}",
                report::nuvec_tables(&NuvecRun {
                    ranks: group.size(),
                    transport: links,
                    measurements
                })
            ),
        }
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bench_args(args: &[&str]) -> Result<BenchArgs, String> {
        let argv = ["nuvec", "bench"].iter().chain(args);
        match Cli::try_parse_from(argv)
            .map_err(|e| e.to_string())?
            .command
        {
            Command::Bench(args) => Ok(args),
            _ => Err("not bench".into()),
        }
    }

    #[test]
    fn dtype_and_op_parse_as_lists() {
        let args = bench_args(&["--dtype", "bfloat16,f16,complex64", "--op", "sum,max"]).unwrap();
        assert_eq!(args.dtype, [DType::BF16, DType::F16, DType::Complex64]);
        assert_eq!(args.op, [RedOp::Sum, RedOp::Max]);
        // Defaults: float32 sums of all_sum; --ops still names the collectives.
        let args = bench_args(&["--ops", "all_sum,sendrecv"]).unwrap();
        assert_eq!(args.dtype, [DType::F32]);
        assert_eq!(args.op, [RedOp::Sum]);
        assert_eq!(args.collectives, [Op::AllSum, Op::SendRecv]);
        // Every dtype by its MLX name.
        let all: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
        let args = bench_args(&["--dtype", &all.join(",")]).unwrap();
        assert_eq!(args.dtype, DType::ALL);
        let err = bench_args(&["--dtype", "float8"]).err().unwrap();
        assert!(err.contains("float8") && err.contains("bfloat16"), "{err}");
        let err = bench_args(&["--op", "prod"]).err().unwrap();
        assert!(
            err.contains("prod") && err.contains("sum, max or min"),
            "{err}"
        );
    }

    #[test]
    fn workers_get_the_same_sweep() {
        let args = bench_args(&[
            "--collectives",
            "all_sum,all_gather",
            "--dtype",
            "bf16,int8",
            "--op",
            "min",
            "--sizes",
            "4,8K",
            "--iters",
            "7",
        ])
        .unwrap();
        let argv = worker_args(&args, Path::new("/r.json"), Path::new("/p"));
        let mut full = vec!["bench"];
        full.extend(argv.iter().map(String::as_str));
        let worker = bench_args(&full[1..]).unwrap();
        assert!(worker.worker);
        assert_eq!(worker.progress.as_deref(), Some(Path::new("/p")));
        let (a, b) = (sweep(&args), sweep(&worker));
        assert_eq!(a.cases(2), b.cases(2));
        assert_eq!((b.min_iters, b.max_iters), (7, 7));
        assert_eq!(b.dtypes, [DType::BF16, DType::I8]);
    }

    #[test]
    fn sealed_wants_the_native_wire_no_skew_and_no_key_of_its_own() {
        let native = bench_args(&["--sealed", "--wire", "native"]).unwrap();
        assert_eq!(check_sealed(&native, false), Ok(()));
        let err = check_sealed(&native, true).unwrap_err();
        assert!(err.contains("--sealed") && err.contains(KEY_VAR), "{err}");
        let mlx = bench_args(&["--sealed"]).unwrap();
        let err = check_sealed(&mlx, false).unwrap_err();
        assert!(
            err.contains("--sealed") && err.contains("--wire native"),
            "{err}"
        );
        let skew = bench_args(&["--sealed", "--wire", "native", "--skew", "0"]).unwrap();
        assert!(check_sealed(&skew, false).unwrap_err().contains("--skew"));
    }

    #[test]
    fn fresh_keys_are_long_enough_and_differ() {
        let (a, b) = (fresh_key(), fresh_key());
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()), "{a}");
        assert_ne!(a, b);
    }
}
