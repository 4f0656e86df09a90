//! The chaos run behind `tools/chaos.sh`: rounds of a ring of 3 to 5 local ranks running a
//! loop of random collectives (4 B to 8 MiB, deterministic inputs, every result checked),
//! with one fault injected at a random moment of the loop:
//!
//! - `kill`: the victim is sent SIGKILL;
//! - `stop`: the victim is sent SIGSTOP (it never answers again, and never closes a socket);
//! - `cut`: every rank runs in a network namespace of its own, joined by a bridge, and the
//!   victim's link is set down (needs root and `ip netns`; skipped, and said so, otherwise);
//! - `late`: the victim starts late, or pauses before one collective, for less than the
//!   timeout: every rank must succeed.
//!
//! A round is correct when every survivor (every rank but the victim; every rank for `late`)
//! ends as it should: for a fault, with an error naming the victim within timeout + 2 s of the
//! fault; for lateness, with success. Anything else is counted as what it is: wrong blame (or a
//! success despite the fault), a wrong result, a verdict later than that, a hang (no verdict
//! at all within 10 s more; the rank is then killed), or a panic.
//!
//! Each round has its own seed, printed with it; `--seed S` starts at round seed S, so
//! `tools/chaos.sh 1 --seed S` replays that round (the fault's moment within a collective
//! varies with scheduling, the rest is the same).
//!
//! The ranks are this program again (`nuvec chaos-rank`), using only the public API.

use std::collections::HashMap;
use std::fmt;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use nuvec_distributed_engine::Group;
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

// ---- Deterministic randomness ----------------------------------------------------------

/// The round's randomness: one seeded generator, so a seed replays a round (with the same
/// build: `StdRng`'s stream may change between rand releases).
#[derive(Clone, Debug)]
pub struct Rng(StdRng);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(StdRng::seed_from_u64(seed))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// A number in `lo..hi` (`lo` when the range is empty).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.next_u64() % (hi - lo)
    }

    /// A number in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

// ---- The collectives of a round ---------------------------------------------------------

/// A collective of the loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `all_sum`.
    Sum,
    /// `all_max`.
    Max,
    /// `all_min`.
    Min,
    /// `all_gather`.
    Gather,
    /// `sum_scatter`.
    Scatter,
    /// `barrier`.
    Barrier,
}

/// One collective of the loop: the op and the elements (f32) of each rank's largest buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    /// The collective.
    pub op: Op,
    /// f32 elements of the larger of the rank's buffers (1 to 2^21: 4 B to 8 MiB).
    pub elements: usize,
}

/// The steps every rank of a round runs, from the round's seed: sizes spread evenly over
/// orders of magnitude (log-uniform), so that small, medium and large collectives all occur.
pub fn steps(seed: u64, count: usize) -> Vec<Step> {
    let mut rng = Rng::new(seed ^ 0x5EED_57E9);
    const OPS: [Op; 6] = [
        Op::Sum,
        Op::Max,
        Op::Min,
        Op::Gather,
        Op::Scatter,
        Op::Barrier,
    ];
    (0..count)
        .map(|_| {
            let op = OPS[rng.range(0, OPS.len() as u64) as usize];
            let elements = (2f64.powf(rng.unit() * 21.0) as usize).clamp(1, 1 << 21);
            Step { op, elements }
        })
        .collect()
}

/// Rank `rank`'s input element `k` at step `step`: small integers, so that sums of up to 5
/// ranks are exact in f32 and every result can be checked exactly.
fn value(step: usize, rank: usize, k: usize) -> f32 {
    ((step * 31 + rank * 17 + k * 7) % 61 + 1) as f32
}

/// Why a step did not succeed.
#[derive(Debug)]
pub enum StepError {
    /// The library returned an error.
    Failed(nuvec_distributed_engine::Error),
    /// The collective returned, with a wrong result.
    Wrong(String),
}

/// Runs step `index` on `group` and checks its result.
///
/// # Errors
///
/// The library's error, or a description of the first wrong element.
pub fn run_step(group: &Group, index: usize, step: Step) -> Result<(), StepError> {
    let (rank, size) = (group.rank(), group.size());
    let input = |r: usize, n: usize| -> Vec<f32> { (0..n).map(|k| value(index, r, k)).collect() };
    let check = |got: &[f32], want: &dyn Fn(usize) -> f32| -> Result<(), StepError> {
        match got.iter().enumerate().find(|&(k, &g)| g != want(k)) {
            None => Ok(()),
            Some((k, &g)) => Err(StepError::Wrong(format!(
                "step {index} {:?} of {} elements: element {k} is {g}, expected {}",
                step.op,
                got.len(),
                want(k)
            ))),
        }
    };
    let n = step.elements;
    match step.op {
        Op::Barrier => group.barrier().map_err(StepError::Failed),
        Op::Sum | Op::Max | Op::Min => {
            let mut data = input(rank, n);
            let values = |k: usize| (0..size).map(move |r| value(index, r, k));
            let result = match step.op {
                Op::Sum => group.all_sum(&mut data),
                Op::Max => group.all_max(&mut data),
                _ => group.all_min(&mut data),
            };
            result.map_err(StepError::Failed)?;
            match step.op {
                Op::Sum => check(&data, &|k| values(k).sum()),
                Op::Max => check(&data, &|k| values(k).fold(f32::MIN, f32::max)),
                _ => check(&data, &|k| values(k).fold(f32::MAX, f32::min)),
            }
        }
        Op::Gather => {
            let per = (n / size).max(1);
            let mut out = vec![0f32; per * size];
            group
                .all_gather(&input(rank, per), &mut out)
                .map_err(StepError::Failed)?;
            check(&out, &|k| value(index, k / per, k % per))
        }
        Op::Scatter => {
            let per = (n / size).max(1);
            let mut out = vec![0f32; per];
            group
                .sum_scatter(&input(rank, per * size), &mut out)
                .map_err(StepError::Failed)?;
            check(&out, &|k| {
                (0..size).map(|r| value(index, r, rank * per + k)).sum()
            })
        }
    }
}

// ---- The rank -------------------------------------------------------------------------

/// What a chaos rank runs.
#[derive(Clone, Debug)]
pub struct RankPlan {
    /// The round's seed (the same for every rank).
    pub seed: u64,
    /// Collectives in the loop.
    pub steps: usize,
    /// Pause this long before this step (a late rank).
    pub late: Option<(usize, Duration)>,
}

/// A chaos rank: forms the ring from MLX's environment and runs the round's steps, printing
/// `READY`, `AT <step>` before each step, and at the end one of `DONE`, `FAIL <peer|-> <error>`
/// (the library failed) or `BAD <what>` (a wrong result). Returns the exit code: 0, 1 or 2.
pub fn rank(plan: &RankPlan) -> u8 {
    let mut out = std::io::stdout();
    let mut say = |line: String| {
        let _ = writeln!(out, "{line}").and_then(|()| out.flush());
    };
    let fail = |e: &nuvec_distributed_engine::Error| {
        let peer = e.peer().map_or("-".to_string(), |p| p.to_string());
        format!("FAIL {peer} {e}")
    };
    let group = match nuvec_distributed_engine::init(true) {
        Ok(group) => group,
        Err(e) => {
            say(fail(&e));
            return 1;
        }
    };
    say("READY".into());
    for (index, step) in steps(plan.seed, plan.steps).into_iter().enumerate() {
        say(format!("AT {index}"));
        if let Some((at, pause)) = plan.late
            && at == index
        {
            thread::sleep(pause);
        }
        match run_step(&group, index, step) {
            Ok(()) => {}
            Err(StepError::Failed(e)) => {
                say(fail(&e));
                return 1;
            }
            Err(StepError::Wrong(what)) => {
                say(format!("BAD {what}"));
                return 2;
            }
        }
    }
    say("DONE".into());
    0
}

// ---- The driver ------------------------------------------------------------------------

/// A fault to inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fault {
    /// SIGKILL.
    Kill,
    /// SIGSTOP.
    Stop,
    /// The victim's link set down (network namespaces).
    Cut,
    /// The victim is late, within the timeout.
    Late,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Fault::Kill => "kill -9",
            Fault::Stop => "SIGSTOP",
            Fault::Cut => "cut link",
            Fault::Late => "late rank",
        })
    }
}

/// How the chaos run is set up.
#[derive(Clone, Debug)]
pub struct Options {
    /// Rounds to run.
    pub rounds: usize,
    /// The first round's seed (the next rounds count up from it).
    pub seed: u64,
    /// The ranks' timeout (`NUVEC_DISTRIBUTED_TIMEOUT`).
    pub timeout: Duration,
    /// Collectives per round.
    pub steps: usize,
    /// The rank program: argv that runs `nuvec chaos-rank` (the flags are appended).
    pub rank_program: Vec<String>,
    /// Print every rank's output for rounds that are not correct.
    pub verbose: bool,
    /// The wire the ranks speak (`NUVEC_DISTRIBUTED_WIRE`).
    pub wire: nuvec_distributed_engine::Backend,
}

/// How a round (or one survivor of it) ended, best first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verdict {
    /// As it should.
    Correct,
    /// The fault came after the victim had finished the loop (a link cut takes an `ip`
    /// command, which may be slower than the last collectives): nothing to judge.
    Missed,
    /// The right rank named, but later than timeout + 2 s after the fault.
    Late,
    /// Another rank (or none) named, or success despite a fault, or an error for lateness.
    WrongBlame,
    /// A collective returned a wrong result.
    WrongResult,
    /// No verdict within timeout + 12 s.
    Hang,
    /// The rank panicked.
    Panic,
}

/// What the run counted.
#[derive(Debug, Default)]
pub struct Summary {
    /// Rounds per verdict.
    pub verdicts: HashMap<Verdict, usize>,
    /// Per fault: (rounds, correct rounds).
    pub by_fault: HashMap<Fault, (usize, usize)>,
    /// Whether cut-link rounds were skipped (not root, or no `ip netns`).
    pub cut_skipped: bool,
}

impl Summary {
    /// Rounds that were not correct (a missed fault is not a failure).
    pub fn failures(&self) -> usize {
        self.verdicts
            .iter()
            .filter(|(v, _)| !matches!(v, Verdict::Correct | Verdict::Missed))
            .map(|(_, n)| n)
            .sum()
    }

    fn count(&self, verdict: Verdict) -> usize {
        self.verdicts.get(&verdict).copied().unwrap_or(0)
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rounds: usize = self.verdicts.values().sum();
        writeln!(
            f,
            "chaos: {rounds} rounds, {} correct verdicts, {} wrong blame, {} wrong results, \
             {} late verdicts, {} hangs, {} panics, {} faults that missed the loop",
            self.count(Verdict::Correct),
            self.count(Verdict::WrongBlame),
            self.count(Verdict::WrongResult),
            self.count(Verdict::Late),
            self.count(Verdict::Hang),
            self.count(Verdict::Panic),
            self.count(Verdict::Missed),
        )?;
        for fault in [Fault::Kill, Fault::Stop, Fault::Cut, Fault::Late] {
            if let Some((n, ok)) = self.by_fault.get(&fault) {
                writeln!(f, "  {fault}: {ok} of {n} rounds correct")?;
            }
        }
        if self.cut_skipped {
            writeln!(
                f,
                "  cut link: SKIPPED (needs root and a working `ip netns`; this run has not both)"
            )?;
        }
        Ok(())
    }
}

/// Whether network namespaces can be made here (root and a working `ip netns`).
pub fn can_cut_links() -> bool {
    // Adding a namespace is the test: it fails without root (or where namespaces are
    // refused), and `ip` may be missing altogether.
    let name = format!("nvcprobe{}", std::process::id());
    let made = Command::new("ip")
        .args(["netns", "add", &name])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if made {
        let _ = Command::new("ip").args(["netns", "del", &name]).status();
    }
    made
}

/// The namespaces of a cut-link round: one per rank, each joined by a veth pair to a bridge in
/// a hub namespace. Removed on drop (deleting a namespace deletes its end of each pair).
struct Netns {
    hub: String,
    ranks: Vec<String>,
    id: u32,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("running ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Netns {
    fn new(size: usize) -> Result<Netns, String> {
        let id = std::process::id() % 100_000;
        let net = Netns {
            hub: format!("nvc{id}hub"),
            ranks: (0..size).map(|i| format!("nvc{id}r{i}")).collect(),
            id,
        };
        ip(&["netns", "add", &net.hub])?;
        ip(&["-n", &net.hub, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &net.hub, "link", "set", "br0", "up"])?;
        for (i, ns) in net.ranks.iter().enumerate() {
            let (inside, outside) = (format!("nvc{id}a{i}"), net.hub_side(i));
            ip(&["netns", "add", ns])?;
            ip(&[
                "link", "add", &inside, "type", "veth", "peer", "name", &outside,
            ])?;
            ip(&["link", "set", &inside, "netns", ns])?;
            ip(&["link", "set", &outside, "netns", &net.hub])?;
            ip(&["-n", &net.hub, "link", "set", &outside, "master", "br0"])?;
            ip(&["-n", &net.hub, "link", "set", &outside, "up"])?;
            let addr = format!("{}/24", Netns::address(i));
            ip(&["-n", ns, "addr", "add", &addr, "dev", &inside])?;
            ip(&["-n", ns, "link", "set", &inside, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(net)
    }

    fn address(rank: usize) -> String {
        format!("10.203.0.{}", rank + 1)
    }

    fn hub_side(&self, rank: usize) -> String {
        format!("nvc{}h{rank}", self.id)
    }

    fn cut(&self, rank: usize) -> Result<(), String> {
        ip(&["-n", &self.hub, "link", "set", &self.hub_side(rank), "down"])
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for ns in self.ranks.iter().chain([&self.hub]) {
            let _ = Command::new("ip")
                .args(["netns", "del", ns])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// One round's random choices, all from its seed.
#[derive(Clone, Debug)]
pub struct Round {
    /// The round's seed.
    pub seed: u64,
    /// Ranks (3 to 5).
    pub size: usize,
    /// The fault.
    pub fault: Fault,
    /// The rank it hits.
    pub victim: usize,
    /// The step at which it is injected (for lateness: the step paused before).
    pub at: usize,
    /// For lateness: whether the victim starts late (else it pauses before step `at`).
    pub late_start: bool,
    /// For lateness: how late.
    pub pause: Duration,
}

impl Round {
    /// The round `seed` describes, among `faults`.
    pub fn new(seed: u64, faults: &[Fault], steps: usize, timeout: Duration) -> Round {
        let mut rng = Rng::new(seed);
        let size = rng.range(3, 6) as usize;
        let fault = faults[rng.range(0, faults.len() as u64) as usize];
        let victim = rng.range(0, size as u64) as usize;
        // In the first half of the loop: the rest follows the fault, so no survivor can finish
        // without the victim (unless the fault is slower than all of it: see Missed).
        let at = rng.range(0, (steps / 2) as u64) as usize;
        let late_start = rng.range(0, 3) == 0;
        // 10 % to 50 % of the timeout: late, but clearly within it.
        let pause = timeout.mul_f64(0.1 + 0.4 * rng.unit());
        Round {
            seed,
            size,
            fault,
            victim,
            at,
            late_start,
            pause,
        }
    }
}

impl fmt::Display for Round {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "seed {} P={} {} rank {}",
            self.seed, self.size, self.fault, self.victim
        )?;
        match (self.fault, self.late_start) {
            (Fault::Late, true) => write!(f, " starts {:?} late", self.pause),
            (Fault::Late, false) => write!(f, " pauses {:?} before step {}", self.pause, self.at),
            _ => write!(f, " at step {}", self.at),
        }
    }
}

/// A line a rank printed, and when it arrived.
struct Line {
    rank: usize,
    text: String,
    at: Instant,
}

/// A started rank.
struct RankProcess {
    child: Child,
    stderr: Arc<Mutex<String>>,
    /// Set once the child has been waited for (its PID may then be reused: never signal it).
    exited: bool,
}

impl RankProcess {
    fn signal(&mut self, signal: Signal) {
        if !self.exited {
            let _ = kill(Pid::from_raw(self.child.id() as i32), signal);
        }
    }

    fn reap(&mut self) -> bool {
        if !self.exited && matches!(self.child.try_wait(), Ok(Some(_))) {
            self.exited = true;
        }
        self.exited
    }
}

/// Runs the chaos rounds and returns the counts.
pub fn run(options: &Options) -> Summary {
    let mut summary = Summary::default();
    let mut faults = vec![Fault::Kill, Fault::Stop, Fault::Late];
    if can_cut_links() {
        faults.insert(2, Fault::Cut);
    } else {
        summary.cut_skipped = true;
        println!("chaos: cut-link faults SKIPPED: they need root and a working `ip netns`");
    }
    println!(
        "chaos: {} rounds from seed {}, timeout {:?}, {} collectives per round, {} wire",
        options.rounds, options.seed, options.timeout, options.steps, options.wire
    );
    for i in 0..options.rounds {
        if crate::runner::interrupted() {
            println!("chaos: interrupted");
            break;
        }
        let seed = options.seed.wrapping_add(i as u64);
        let round = Round::new(seed, &faults, options.steps, options.timeout);
        let (verdict, notes) = match run_round(&round, options) {
            Ok(result) => result,
            Err(e) => (Verdict::WrongBlame, vec![format!("could not run: {e}")]),
        };
        println!("round {i}: {round}: {verdict:?}");
        for note in &notes {
            println!("    {note}");
        }
        *summary.verdicts.entry(verdict).or_default() += 1;
        if verdict != Verdict::Missed {
            let entry = summary.by_fault.entry(round.fault).or_default();
            entry.0 += 1;
            entry.1 += usize::from(verdict == Verdict::Correct);
        }
    }
    summary
}

/// Runs one round: returns its verdict (the worst of its survivors') and what went wrong.
fn run_round(round: &Round, options: &Options) -> Result<(Verdict, Vec<String>), String> {
    let netns = match round.fault {
        Fault::Cut => Some(Netns::new(round.size)?),
        _ => None,
    };
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let nodes: Vec<Vec<String>> = match &netns {
        Some(_) => (0..round.size)
            .map(|r| vec![format!("{}:{}", Netns::address(r), 40_000 + r)])
            .collect(),
        None => {
            let first = crate::launch::free_port_block(round.size).map_err(|e| e.to_string())?;
            (0..round.size)
                .map(|r| vec![format!("127.0.0.1:{}", first as usize + r)])
                .collect()
        }
    };
    let hostfile = dir.path().join("hostfile.json");
    std::fs::write(
        &hostfile,
        nuvec_distributed_engine::config::hostfile::to_json(&nodes),
    )
    .map_err(|e| e.to_string())?;

    let (tx, rx) = mpsc::channel::<Line>();
    let mut ranks: Vec<Option<RankProcess>> = (0..round.size).map(|_| None).collect();
    let start = Instant::now();
    let late_start = round.fault == Fault::Late && round.late_start;
    let spawn_order: Vec<usize> = (0..round.size)
        .filter(|&r| !(late_start && r == round.victim))
        .chain(late_start.then_some(round.victim))
        .collect();
    for rank in spawn_order {
        if late_start && rank == round.victim {
            thread::sleep(round.pause);
        }
        let late = (round.fault == Fault::Late && !round.late_start && rank == round.victim)
            .then_some((round.at, round.pause));
        let process = spawn_rank(
            rank,
            round,
            options,
            &hostfile,
            late,
            netns.as_ref(),
            tx.clone(),
        );
        match process {
            Ok(p) => ranks[rank] = Some(p),
            Err(e) => {
                for p in ranks.iter_mut().flatten() {
                    p.signal(Signal::SIGKILL);
                    let _ = p.child.wait();
                }
                return Err(format!("starting rank {rank}: {e}"));
            }
        }
    }
    drop(tx);
    let mut ranks: Vec<RankProcess> = ranks.into_iter().flatten().collect();

    // Inject the fault once the victim announces the step.
    let mut lines: Vec<Line> = Vec::new();
    let mut notes = Vec::new();
    let fault_at = if round.fault == Fault::Late {
        start
    } else {
        let want = format!("AT {}", round.at);
        let until = Instant::now() + Duration::from_secs(60);
        let mut reached = false;
        while !reached && Instant::now() < until {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(line) => {
                    reached = line.rank == round.victim && line.text == want;
                    lines.push(line);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if ranks[round.victim].reap() {
                        break;
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        if !reached {
            notes.push(format!(
                "rank {} never reached step {}: no fault injected",
                round.victim, round.at
            ));
        }
        // A random moment within the step, scheduling permitting.
        thread::sleep(Duration::from_micros(
            Rng::new(round.seed ^ 0xFA17).range(0, 3000),
        ));
        match (round.fault, &netns) {
            (Fault::Kill, _) => ranks[round.victim].signal(Signal::SIGKILL),
            (Fault::Stop, _) => ranks[round.victim].signal(Signal::SIGSTOP),
            (Fault::Cut, Some(net)) => net.cut(round.victim)?,
            _ => {}
        }
        Instant::now()
    };

    // Survivors get timeout + 2 s for a verdict, and 10 s more before they count as hung.
    let survivors: Vec<usize> = (0..round.size)
        .filter(|&r| round.fault == Fault::Late || r != round.victim)
        .collect();
    let in_time = options.timeout + Duration::from_secs(2);
    // A round without a fault takes a second or two (the loop, the pause); 20 s is a hang.
    let hang_after = if round.fault == Fault::Late {
        Duration::from_secs(20)
    } else {
        in_time + Duration::from_secs(10)
    };
    let until = fault_at + hang_after;
    while Instant::now() < until && !survivors.iter().all(|&r| ranks[r].reap()) {
        match rx.recv_timeout(Duration::from_millis(10)) {
            Ok(line) => lines.push(line),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => thread::sleep(Duration::from_millis(10)),
        }
    }
    // A survivor that printed its verdict but did not exit (stuck tearing down) hangs too.
    let hung: Vec<usize> = survivors
        .iter()
        .copied()
        .filter(|&r| !ranks[r].reap())
        .collect();
    // Whatever is still running (the victim, hung survivors) is ended; then the output is
    // complete.
    for p in &mut ranks {
        p.signal(Signal::SIGKILL);
        p.signal(Signal::SIGCONT);
        let _ = p.child.wait();
        p.exited = true;
    }
    let drain_until = Instant::now() + Duration::from_secs(2);
    while let Ok(line) = rx.recv_timeout(drain_until.saturating_duration_since(Instant::now())) {
        lines.push(line);
    }
    drop(netns);

    if round.fault != Fault::Late
        && lines
            .iter()
            .any(|l| l.rank == round.victim && l.text == "DONE" && l.at <= fault_at)
    {
        notes.push(format!(
            "rank {} finished the loop before the fault took effect",
            round.victim
        ));
        return Ok((Verdict::Missed, notes));
    }
    let mut worst = Verdict::Correct;
    for &rank in &survivors {
        let stderr = ranks[rank]
            .stderr
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default();
        let mine: Vec<&Line> = lines.iter().filter(|l| l.rank == rank).collect();
        let end = mine.iter().rev().find(|l| {
            l.text == "DONE" || l.text.starts_with("FAIL ") || l.text.starts_with("BAD ")
        });
        let (mut verdict, mut note) = judge(round, fault_at, in_time, &stderr, end.copied());
        if hung.contains(&rank) && verdict < Verdict::Hang {
            note = format!(
                "did not exit; its verdict line: {}",
                end.map_or("none", |l| l.text.as_str())
            );
            verdict = Verdict::Hang;
        }
        if verdict != Verdict::Correct {
            notes.push(format!("rank {rank}: {verdict:?}: {note}"));
            if options.verbose {
                let out: Vec<&str> = mine.iter().map(|l| l.text.as_str()).collect();
                notes.push(format!(
                    "rank {rank} stdout: {}\n    stderr: {}",
                    out.join(" | "),
                    stderr.trim()
                ));
            }
        }
        worst = worst.max(verdict);
    }
    if options.verbose && worst != Verdict::Correct && !survivors.contains(&round.victim) {
        let out: Vec<String> = lines
            .iter()
            .filter(|l| l.rank == round.victim)
            .map(|l| format!("{} ({:+.3}s)", l.text, signed(l.at, fault_at)))
            .collect();
        notes.push(format!(
            "victim {} stdout (time from the fault): {}",
            round.victim,
            out.join(" | ")
        ));
    }
    Ok((worst, notes))
}

/// `at - from` in seconds, negative when `at` is earlier.
fn signed(at: Instant, from: Instant) -> f64 {
    if at >= from {
        (at - from).as_secs_f64()
    } else {
        -(from - at).as_secs_f64()
    }
}

/// One survivor's verdict, from its last line and its stderr.
fn judge(
    round: &Round,
    fault_at: Instant,
    in_time: Duration,
    stderr: &str,
    end: Option<&Line>,
) -> (Verdict, String) {
    if let Some(i) = stderr.find("panicked") {
        let text: String = stderr[i..].lines().next().unwrap_or_default().into();
        return (Verdict::Panic, text);
    }
    let Some(end) = end else {
        return (Verdict::Hang, "no verdict".into());
    };
    if let Some(what) = end.text.strip_prefix("BAD ") {
        return (Verdict::WrongResult, what.into());
    }
    if end.text == "DONE" {
        return if round.fault == Fault::Late {
            (Verdict::Correct, String::new())
        } else {
            (
                Verdict::WrongBlame,
                "finished although a rank was faulted".into(),
            )
        };
    }
    let rest = end.text.strip_prefix("FAIL ").unwrap_or_default();
    let (peer, message) = rest.split_once(' ').unwrap_or((rest, ""));
    let took = end.at.saturating_duration_since(fault_at);
    if round.fault == Fault::Late {
        return (
            Verdict::WrongBlame,
            format!("failed although lateness was within the timeout: {message}"),
        );
    }
    if peer != round.victim.to_string() {
        return (
            Verdict::WrongBlame,
            format!(
                "named {peer} instead of {} after {took:.2?}: {message}",
                round.victim
            ),
        );
    }
    if took > in_time {
        return (
            Verdict::Late,
            format!("named {peer} after {took:.2?}: {message}"),
        );
    }
    (Verdict::Correct, String::new())
}

/// Starts one rank of `round`, in its namespace when there is one; its stdout lines go to
/// `lines`, its stderr is kept.
fn spawn_rank(
    rank: usize,
    round: &Round,
    options: &Options,
    hostfile: &Path,
    late: Option<(usize, Duration)>,
    netns: Option<&Netns>,
    lines: mpsc::Sender<Line>,
) -> std::io::Result<RankProcess> {
    let mut argv: Vec<String> = Vec::new();
    if let Some(net) = netns {
        argv.extend(["ip", "netns", "exec", &net.ranks[rank]].map(String::from));
    }
    argv.extend(options.rank_program.iter().cloned());
    argv.extend([
        "--seed".into(),
        round.seed.to_string(),
        "--steps".into(),
        options.steps.to_string(),
    ]);
    if let Some((at, pause)) = late {
        argv.extend([
            "--late-at".into(),
            at.to_string(),
            "--late-ms".into(),
            pause.as_millis().to_string(),
        ]);
    }
    let mut command = Command::new(&argv[0]);
    command
        .args(&argv[1..])
        .env(
            nuvec_distributed_engine::config::env::HOSTFILE_VAR,
            hostfile,
        )
        .env(
            nuvec_distributed_engine::config::env::RANK_VAR,
            rank.to_string(),
        )
        .env(
            nuvec_distributed_engine::config::env::TIMEOUT_VAR,
            format!("{}", options.timeout.as_secs_f64()),
        )
        .env(
            nuvec_distributed_engine::WIRE_VAR,
            crate::wire_name(options.wire),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    if netns.is_some() {
        // A cut link cuts TCP; ranks in network namespaces of one kernel still share
        // /dev/shm, so the native wire's shared memory would carry the data past the cut.
        command.env(nuvec_distributed_engine::SHM_VAR, "0");
    }
    // A killed chaos run must not leave ranks behind.
    ffi::process::kill_when_parent_dies(&mut command);
    let mut child = command.spawn()?;
    if let Some(out) = child.stdout.take() {
        thread::spawn(move || {
            for text in BufReader::new(out).lines().map_while(Result::ok) {
                let line = Line {
                    rank,
                    text,
                    at: Instant::now(),
                };
                if lines.send(line).is_err() {
                    break;
                }
            }
        });
    }
    let stderr = Arc::new(Mutex::new(String::new()));
    if let Some(mut err) = child.stderr.take() {
        let sink = Arc::clone(&stderr);
        thread::spawn(move || {
            let mut text = String::new();
            let _ = err.read_to_string(&mut text);
            if let Ok(mut s) = sink.lock() {
                *s = text;
            }
        });
    }
    Ok(RankProcess {
        child,
        stderr,
        exited: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_and_steps_are_the_seeds() {
        let faults = [Fault::Kill, Fault::Stop, Fault::Late];
        let t = Duration::from_millis(1500);
        let a = Round::new(42, &faults, 30, t);
        let b = Round::new(42, &faults, 30, t);
        assert_eq!(format!("{a}"), format!("{b}"));
        assert_eq!(steps(7, 50), steps(7, 50));
        assert_ne!(steps(7, 50), steps(8, 50));
        let mut seen = std::collections::HashSet::new();
        for seed in 0..400 {
            let r = Round::new(seed, &faults, 30, t);
            assert!((3..=5).contains(&r.size) && r.victim < r.size);
            assert!(r.at < 15, "{r}");
            assert!(r.pause < t / 2 && r.pause >= t / 10);
            seen.insert(r.fault);
        }
        assert_eq!(seen.len(), 3, "every fault occurs");
        let all = steps(1, 2000);
        let smallest = all.iter().map(|s| s.elements).min().unwrap();
        let largest = all.iter().map(|s| s.elements).max().unwrap();
        assert!(smallest < 4 && largest > (1 << 20) && largest <= 1 << 21);
    }

    #[test]
    fn verdicts() {
        let faults = [Fault::Kill];
        let round = Round::new(1, &faults, 30, Duration::from_secs(1));
        let victim = round.victim;
        let t0 = Instant::now();
        let line = |text: String, after_ms: u64| Line {
            rank: 0,
            text,
            at: t0 + Duration::from_millis(after_ms),
        };
        let in_time = Duration::from_secs(3);
        let v = |l: &Line| judge(&round, t0, in_time, "", Some(l)).0;
        assert_eq!(
            v(&line(format!("FAIL {victim} lost"), 900)),
            Verdict::Correct
        );
        assert_eq!(v(&line(format!("FAIL {victim} lost"), 3500)), Verdict::Late);
        let other = (victim + 1) % round.size;
        assert_eq!(v(&line(format!("FAIL {other} x"), 10)), Verdict::WrongBlame);
        assert_eq!(v(&line("FAIL - x".into(), 10)), Verdict::WrongBlame);
        assert_eq!(v(&line("DONE".into(), 10)), Verdict::WrongBlame);
        assert_eq!(v(&line("BAD step 3".into(), 10)), Verdict::WrongResult);
        assert_eq!(judge(&round, t0, in_time, "", None).0, Verdict::Hang);
        let panic = "thread 'main' panicked at src/x.rs:1:1";
        assert_eq!(
            judge(&round, t0, in_time, panic, Some(&line("DONE".into(), 1))).0,
            Verdict::Panic
        );
        let late = Round {
            fault: Fault::Late,
            ..round
        };
        assert_eq!(
            judge(&late, t0, in_time, "", Some(&line("DONE".into(), 1))).0,
            Verdict::Correct
        );
        assert_eq!(
            judge(&late, t0, in_time, "", Some(&line("FAIL 1 x".into(), 1))).0,
            Verdict::WrongBlame
        );
    }
}
