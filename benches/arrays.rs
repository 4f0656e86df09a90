//! `cargo bench --bench arrays`: what a float32 all_sum of a nuvec array costs beside the
//! engine's all_sum of a slice, split into this crate's share and nuvec-core's.
//!
//! Three paths, on the same group, the same bytes and the same sizes (4 B, 8 KiB, 1 MiB):
//!
//! 1. **slice**: the engine's `Group::all_sum(&mut [f32])`;
//! 2. **adapter**: nuvec-core's `Communicator::all_reduce` called on this crate's adapter
//!    ([`nuvec_distributed::communicator`]) with the bytes of the same `f32` buffer;
//! 3. **array**: `nuvec_core::distributed::all_sum(&x, Some(&g))` evaluated, `g` being
//!    nuvec's group over that same adapter.
//!
//! This crate's share is (2) - (1): the dynamic call, the dtype and reduction mapping, and
//! the error mapping's branch; it must stay under 1 µs and copy nothing (tests/no_copy.rs
//! proves the copying part). nuvec-core's share is (3) - (2): building the lazy graph node,
//! evaluating it, and the contiguous copy of the input into a new output buffer that its
//! reductions make (they reduce in place into that buffer).
//!
//! The bench binary starts itself as two ranks on loopback (through
//! `nuvec_tools::testing::Launch`, three addresses per rank), and each rank forms three
//! groups: MLX's wire (TCP), the native wire over shared memory (what it picks for two
//! ranks on one host), and the native wire over TCP (shared memory off, as
//! `NUVEC_DISTRIBUTED_SHM=0` would). A fourth, in-process "group" has a transport that
//! moves nothing, so that its rows show the software alone, without the network's noise.
//!
//! Method, as `nuvec bench`'s: every rank runs the same collectives in the same order and
//! count. A fixed number of probe calls warms every path up; rank 0 alone times them and
//! decides each case's warm-up and iteration counts, which every rank learns through an
//! all_sum. Then rounds go over every wire and size; in a round, each iteration calls the
//! three paths once each, in a shuffled order (the same on every rank), every call timed
//! on its own. A round's figure per path is the median of its calls, and per
//! share the median of the per-iteration differences, so that the paths compared share
//! the machine's conditions call by call; the table gives the median over rounds, the
//! slower rank's (each rank's in brackets for the shares). Timed calls run on zeros (a sum of zeros stays zeros, however many calls);
//! every path is checked exactly before and after, on small integers whose sum is known.
//!
//! Environment: `NUVEC_ARRAYS_BENCH_ROUNDS` (default 9), `NUVEC_ARRAYS_BENCH_ROUND_MS`
//! (timed milliseconds per size and wire in a round, the three paths together; default
//! 100).

use std::sync::Arc;
use std::time::{Duration, Instant};

use nuvec_core::distributed::{self, AllReduce};
use nuvec_core::{Array, DType};
use nuvec_distributed::engine::{self, Group, Transport};
use nuvec_distributed::{Backend, Options};
use nuvec_tools::report::Header;
use nuvec_tools::testing::{self, Launch};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use zerocopy::IntoBytes;

const WORKER: &str = "NUVEC_ARRAYS_BENCH_WORKER";
const RANKS: usize = 2;
const SIZES: [usize; 3] = [4, 8 << 10, 1 << 20];
/// Calls of each path, per case, before anything is timed for real.
const PROBE: usize = 20;

fn env_number(var: &str, default: u64) -> u64 {
    match std::env::var(var) {
        Ok(text) => text
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{var}={text:?}: {e}")),
        Err(_) => default,
    }
}

/// One group and the three ways to reach it.
struct Wired {
    name: &'static str,
    /// Whether data moves between the ranks (not for the in-process rows).
    moves: bool,
    engine: Group,
    comm: Arc<dyn nuvec_core::distributed::Communicator>,
    nuvec: distributed::Group,
}

impl Wired {
    fn new(name: &'static str, moves: bool, engine: Group) -> Self {
        let comm = nuvec_distributed::communicator(engine.clone());
        let nuvec = distributed::Group::new(comm.clone());
        Wired {
            name,
            moves,
            engine,
            comm,
            nuvec,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    Slice,
    Adapter,
    Array,
}

const PATHS: [Path; 3] = [Path::Slice, Path::Adapter, Path::Array];

/// One wire at one size, with its buffers.
struct Case<'w> {
    wire: &'w Wired,
    bytes: usize,
    /// The buffer of paths 1 and 2.
    data: Vec<f32>,
    /// The input of path 3.
    array: Array,
    warmup: usize,
    iters: usize,
    /// Per path, each round's median per-call time, µs.
    rounds: [Vec<f64>; 3],
    /// Each round's median of the per-iteration differences (2) - (1) and (3) - (2), µs.
    shares: [Vec<f64>; 2],
    /// Elements that differed from the expected sum, over every check.
    wrong: u64,
}

impl<'w> Case<'w> {
    fn new(wire: &'w Wired, bytes: usize) -> Self {
        let n = bytes / 4;
        Case {
            wire,
            bytes,
            data: vec![0.0; n],
            array: Array::from_slice(&vec![0f32; n], [n]),
            warmup: 0,
            iters: 0,
            rounds: Default::default(),
            shares: Default::default(),
            wrong: 0,
        }
    }

    /// One timed call of `path` on zeros.
    fn call(&mut self, path: Path) {
        let w = self.wire;
        match path {
            Path::Slice => w.engine.all_sum(&mut self.data).expect("the slice all_sum"),
            Path::Adapter => w
                .comm
                .all_reduce(AllReduce::Sum, DType::F32, self.data.as_mut_bytes())
                .expect("the adapter's all_reduce"),
            Path::Array => distributed::all_sum(&self.array, Some(&w.nuvec))
                .eval()
                .expect("the array all_sum"),
        }
    }

    /// Runs `path` once on small integers and counts the elements whose sum is not exact;
    /// the buffers hold zeros again after.
    fn check(&mut self, path: Path) -> u64 {
        let w = self.wire;
        let (rank, n) = (w.engine.rank(), self.data.len());
        let value = |i: usize, r: usize| nuvec_tools::bench::input(i, r, RANKS) as f32;
        let expected = |i: usize| {
            if w.moves {
                (0..RANKS).map(|r| value(i, r)).sum()
            } else {
                value(i, rank)
            }
        };
        let mine: Vec<f32> = (0..n).map(|i| value(i, rank)).collect();
        let got = match path {
            Path::Slice | Path::Adapter => {
                self.data.copy_from_slice(&mine);
                if path == Path::Slice {
                    w.engine.all_sum(&mut self.data).expect("the slice all_sum");
                } else {
                    w.comm
                        .all_reduce(AllReduce::Sum, DType::F32, self.data.as_mut_bytes())
                        .expect("the adapter's all_reduce");
                }
                let got = self.data.clone();
                self.data.fill(0.0);
                got
            }
            Path::Array => {
                let x = Array::from_slice(&mine, [n]);
                distributed::all_sum(&x, Some(&w.nuvec))
                    .to_vec::<f32>()
                    .expect("the array all_sum")
            }
        };
        let wrong = (0..n).filter(|&i| got.get(i) != Some(&expected(i))).count() as u64;
        wrong + n.abs_diff(got.len()) as u64
    }

    /// One round: `iters` iterations, each a timed call of every path, in an order shuffled
    /// anew for each iteration by `order` (seeded alike on every rank, so all run the same
    /// calls in the same order), so that the paths share the machine's conditions call by
    /// call and none follows another more often (a 1 MiB array call leaves the caches
    /// and the allocator to whatever comes next). Records the paths' medians and the
    /// medians of the per-iteration differences.
    fn round(&mut self, order: &mut StdRng) {
        let mut times: [Vec<f64>; 3] = Default::default();
        for _ in 0..self.iters {
            let mut paths = PATHS;
            paths.shuffle(order);
            for path in paths {
                let t = Instant::now();
                self.call(path);
                times[path as usize].push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
        let [slice, adapter, array] = &times;
        let mut ours: Vec<f64> = adapter.iter().zip(slice).map(|(a, s)| a - s).collect();
        let mut nuvec: Vec<f64> = array.iter().zip(adapter).map(|(x, a)| x - a).collect();
        self.shares[0].push(median(&mut ours));
        self.shares[1].push(median(&mut nuvec));
        for (path, mut t) in times.into_iter().enumerate() {
            self.rounds[path].push(median(&mut t));
        }
    }

    /// Times `count` calls of `path` and returns their median, µs.
    fn timed(&mut self, path: Path, count: usize) -> f64 {
        let mut times = Vec::with_capacity(count);
        for _ in 0..count {
            let t = Instant::now();
            self.call(path);
            times.push(t.elapsed().as_secs_f64() * 1e6);
        }
        median(&mut times)
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// Half the interquartile range of `values`: how far the rounds' figures stray.
fn spread(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let at = |q: f64| values[((values.len() - 1) as f64 * q).round() as usize];
    if values.is_empty() {
        f64::NAN
    } else {
        (at(0.75) - at(0.25)) / 2.0
    }
}

fn human(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// One rank: forms the groups, measures, and on rank 0 prints the table.
fn rank_main() {
    let rank: usize = std::env::var("MLX_RANK")
        .expect("MLX_RANK")
        .parse()
        .expect("MLX_RANK is a number");
    let hostfile = testing::hostfile_nodes();
    let timeout = Duration::from_secs(60);
    // Group k over each rank's k-th address; every rank forms them in the same order.
    let form = |k: usize, options: Options| {
        let nodes: Vec<Vec<String>> = hostfile.iter().map(|a| vec![a[k].clone()]).collect();
        engine::init_with(&nodes, rank, &options.timeout(timeout)).expect("the group forms")
    };
    let mlx = form(0, Options::default().backend(Backend::Ring));
    let shm = form(1, Options::default().backend(Backend::Native));
    let tcp = form(
        2,
        Options::default()
            .backend(Backend::Native)
            .shared_memory(false),
    );
    let peer = 1 - rank;
    for (g, want) in [
        (&mlx, Transport::Tcp),
        (&shm, Transport::SharedMemory),
        (&tcp, Transport::Tcp),
    ] {
        let got = g.transport(peer).expect("the link's transport");
        assert_eq!(
            got, want,
            "a group formed over another transport than planned"
        );
    }
    let wires = [
        Wired::new("mlx wire, tcp", true, mlx.clone()),
        Wired::new("native, shared memory", true, shm),
        Wired::new("native, tcp", true, tcp),
        Wired::new(
            "none (in-process)",
            false,
            // Rank 0 of two whose transport moves nothing (a sum leaves this rank's data as
            // it is): the in-process rows, which time the software without a network.
            Group::new(Arc::new(engine::Stub::new(RANKS, "none"))),
        ),
    ];
    let mut cases: Vec<Case> = wires
        .iter()
        .flat_map(|w| SIZES.iter().map(move |&b| (w, b)))
        .map(|(w, b)| Case::new(w, b))
        .collect();
    let rounds = env_number("NUVEC_ARRAYS_BENCH_ROUNDS", 9) as usize;
    let round_time = Duration::from_millis(env_number("NUVEC_ARRAYS_BENCH_ROUND_MS", 100));

    // Checks before, and the probe: the same calls on every rank; rank 0's times decide.
    let mut wanted = vec![0u64; 2 * cases.len()];
    for (c, case) in cases.iter_mut().enumerate() {
        for path in PATHS {
            case.wrong += case.check(path);
        }
        let per_iteration: f64 = PATHS.iter().map(|&path| case.timed(path, PROBE)).sum();
        if rank == 0 {
            let iters = (round_time.as_secs_f64() * 1e6 / per_iteration.max(0.05)) as u64;
            let iters = iters.clamp(10, 100_000);
            wanted[2 * c] = iters;
            wanted[2 * c + 1] = (iters / 2).clamp(10, 10_000);
        }
    }
    mlx.all_sum(&mut wanted).expect("rank 0's counts");
    for (c, case) in cases.iter_mut().enumerate() {
        case.iters = wanted[2 * c] as usize;
        case.warmup = wanted[2 * c + 1] as usize;
        for path in PATHS {
            for _ in 0..case.warmup {
                case.call(path);
            }
        }
    }

    let mut order = StdRng::seed_from_u64(25);
    for _ in 0..rounds {
        for case in &mut cases {
            case.wire.engine.barrier().expect("a barrier");
            case.round(&mut order);
        }
    }
    for case in &mut cases {
        // The timed calls summed zeros into the slice paths' buffer: zeros they must stay.
        case.wrong += case.data.iter().filter(|&&v| v != 0.0).count() as u64;
        for path in PATHS {
            case.wrong += case.check(path);
        }
    }

    // Per case: the three paths' medians, each share's median and spread, the wrong count.
    const FIELDS: usize = 8;
    let mut mine = Vec::with_capacity(FIELDS * cases.len());
    for case in &cases {
        let [slice, adapter, array] = &case.rounds;
        let [ours, nuvec] = &case.shares;
        mine.extend([
            median(&mut slice.clone()),
            median(&mut adapter.clone()),
            median(&mut array.clone()),
            median(&mut ours.clone()),
            spread(&mut ours.clone()),
            median(&mut nuvec.clone()),
            spread(&mut nuvec.clone()),
            case.wrong as f64,
        ]);
    }
    let mut all = vec![0.0f64; RANKS * mine.len()];
    mlx.all_gather(&mine, &mut all)
        .expect("every rank's figures");
    if rank != 0 {
        return;
    }
    println!(
        "# float32 all_sum, {RANKS} ranks: µs per call, medians of {rounds} rounds (the slower \
         rank's); ± is half the interquartile range of the rounds' figures"
    );
    println!(
        "{:<22} {:>7} {:>9} {:>9} {:>9} {:>17} {:>17} {:>7} {:>5}",
        "wire",
        "size",
        "(1) slice",
        "(2) adapt",
        "(3) array",
        "ours (2)-(1)",
        "nuvec (3)-(2)",
        "iters",
        "wrong"
    );
    let mut over = Vec::new();
    let mut alone = 0.0f64;
    let mut wrong = 0.0;
    for (c, case) in cases.iter().enumerate() {
        // The largest of the ranks' figures: the slower rank for times, and the less
        // favourable one for shares and spreads.
        let worst = |f: usize| {
            (0..RANKS)
                .map(|r| all[r * mine.len() + c * FIELDS + f])
                .fold(f64::MIN, f64::max)
        };
        let errors: f64 = (0..RANKS)
            .map(|r| all[r * mine.len() + c * FIELDS + 7])
            .sum();
        let (ours, noise) = (worst(3), worst(4));
        if ours - noise > 1.0 {
            over.push(format!("{} {}", case.wire.name, human(case.bytes)));
        }
        if !case.wire.moves {
            alone = alone.max(ours);
        }
        wrong += errors;
        println!(
            "{:<22} {:>7} {:>9.2} {:>9.2} {:>9.2} {:>17} {:>17} {:>7} {:>5}",
            case.wire.name,
            human(case.bytes),
            worst(0),
            worst(1),
            worst(2),
            format!("{ours:.2} ±{noise:.2}"),
            format!("{:.2} ±{:.2}", worst(5), worst(6)),
            case.iters,
            errors,
        );
    }
    println!("# this crate's share, the software alone (in-process rows): at most {alone:.3} µs");
    if over.is_empty() {
        println!("# this crate's share is within 1 µs in every row (to within ±)");
    } else {
        println!(
            "# this crate's share is above 1 µs, beyond ±, in: {} (noise, or a regression: rerun \
             on a quiet machine)",
            over.join(", ")
        );
    }
    assert!(
        wrong == 0.0,
        "{wrong} elements were not the exact sum (see the wrong column)"
    );
}

fn main() {
    // `cargo test --benches` runs bench binaries without `--bench`: do nothing then.
    if !std::env::args().any(|a| a == "--bench") && std::env::var_os(WORKER).is_none() {
        return;
    }
    if std::env::var_os(WORKER).is_some() {
        rank_main();
        return;
    }
    let mut header = Header::detect(1, Backend::Ring);
    header.wire = "mlx and native, one group each in the same two processes".into();
    print!("{}", header.text());
    if let Ok(load) = std::fs::read_to_string("/proc/loadavg") {
        println!(
            "# load         {} (figures are noisy when this exceeds the CPUs)",
            load.trim()
        );
    }
    let exe = std::env::current_exe().expect("the bench binary's path");
    let outputs = Launch::new(RANKS, 3)
        .timeout(60.0)
        .deadline(Duration::from_secs(1800))
        .env(WORKER, "1")
        .command(move |_| {
            let mut c = std::process::Command::new(&exe);
            c.arg("--bench");
            c
        })
        .spawn("arrays bench")
        .finish();
    for o in &outputs {
        if o.rank == 0 || !o.stdout.is_empty() {
            print!("{}", o.stdout);
        }
        if o.status.is_none_or(|s| !s.success()) {
            eprintln!("{o}");
        }
    }
    assert!(
        outputs
            .iter()
            .all(|o| o.status.is_some_and(|s| s.success())),
        "a rank failed (its output is above)"
    );
}
