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
//! With `--recover` ([`Options::recover`]) the faults are kill and stop only (a cut link or
//! a late rank leaves no failed process to restart), and a round goes on after the fault:
//! every survivor calls [`Group::shrink`] and verifies [`RECOVER_STEPS`] collectives of
//! random op and size on the shrunk group, checked exactly as the loop's are (the fault
//! comes once every rank has formed: a rank still in `init` has no group to shrink); a stopped
//! victim is then woken (SIGCONT), and its own shrink must fail saying it was left out while
//! the shrunk group keeps computing right; the victim is killed and started again at its
//! hostfile address with a plain `init`, the survivors call [`Group::rejoin`], and the full
//! group verifies [`RECOVER_STEPS`] more. A survivor's blame of the fault is judged as in
//! plain chaos, but a round whose recovery held despite a wrong or late blame is counted
//! apart ([`Verdict::RecoveredDespiteBlame`]), not as a failure. The round is correct only if every step verified;
//! otherwise it counts as a failed shrink, a failed rejoin, a wrong result, a hang (a phase
//! still running past its bound) or a panic. Each round prints the slowest survivor's time
//! from its failed collective to its first verified collective on the shrunk group; the
//! summary gives their median and maximum (measured, not asserted). A fault that comes after
//! the loop (every survivor finished it) missed, and is counted so.
//!
//! Each round has its own seed, printed with it; `--seed S` starts at round seed S, so
//! `tools/chaos.sh 1 --seed S` replays that round (the fault's moment within a collective
//! varies with scheduling, the rest is the same).
//!
//! The ranks are this program again (`nuvec chaos-rank`), using only the public API.

use std::collections::HashMap;
use std::fmt;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
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
    /// Recover after a failed collective: shrink, verify, wait for the driver's word, rejoin,
    /// verify (see the module docs).
    pub recover: bool,
    /// A rank restarted in place of a failed one: a plain `init`, then the full group's
    /// verified collectives.
    pub restarted: bool,
}

/// Verified collectives on the shrunk group, and again on the rejoined full group.
pub const RECOVER_STEPS: usize = 5;
/// Step indices (and so inputs) of the shrunk group's, the holding loop's and the full
/// group's collectives: apart from the loop's and from each other.
const SHRUNK_BASE: usize = 1000;
const HOLD_BASE: usize = 2000;
const FULL_BASE: usize = 3000;
/// The largest collective of the holding loop (f32 elements): it keeps the shrunk group
/// busy while the driver wakes or restarts the victim, without slowing that down.
const HOLD_MAX: usize = 4096;
/// The line a recovering survivor reads on its stdin before it rejoins.
const GO: &str = "REJOIN";

/// The steps of a recovery phase (`salt` tells the phases apart): random ops and sizes,
/// as in the loop.
fn recover_steps(seed: u64, salt: u64, count: usize) -> Vec<Step> {
    steps(seed ^ salt, count)
}

/// Runs `steps` on `group` as step indices `base..`, calling `after_first` once the first
/// one is verified.
fn verify(
    group: &Group,
    base: usize,
    steps: &[Step],
    mut after_first: impl FnMut(),
) -> Result<(), StepError> {
    for (i, &step) in steps.iter().enumerate() {
        run_step(group, base + i, step)?;
        if i == 0 {
            after_first();
        }
    }
    Ok(())
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
    if plan.restarted {
        return restarted(plan, &mut say);
    }
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
                return if plan.recover {
                    recover(&group, Instant::now(), plan, &mut say)
                } else {
                    1
                };
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

/// A recovering rank, after its collective failed at `failed_at`: shrinks, printing
/// `SHRUNK <rank> <size>`, runs [`RECOVER_STEPS`] verified collectives on the shrunk group
/// (`FIRST_MS <ms>` after the first: the time from the failure being returned), prints
/// `SHRUNK_OK`, then keeps the shrunk group running small verified collectives until the
/// driver writes [`GO`] on its stdin (every member stops at the same one: each loop agrees
/// on the word first); then rejoins, printing `FULL <rank> <size>`, runs the full group's
/// verified collectives and prints `REJOINED`.
///
/// Ends early with `SHRINKFAIL <error>` (exit code 3: the shrink, or a collective of the
/// shrunk group, failed; what a stopped rank woken after the others shrank must print),
/// `REJOINFAIL <error>` (4) or `BAD <what>` (2).
fn recover(group: &Group, failed_at: Instant, plan: &RankPlan, say: &mut dyn FnMut(String)) -> u8 {
    let go = go_word();
    let shrunk = match group.shrink() {
        Ok(shrunk) => shrunk,
        Err(e) => {
            say(format!("SHRINKFAIL {e}"));
            return 3;
        }
    };
    if let Some(code) = verified_phase(&shrunk, &SHRUNK_PHASE, plan.seed, Some(failed_at), say) {
        return code;
    }
    let hold = recover_steps(plan.seed, 0x401D_0000, 64);
    let mut told = false;
    for i in 0.. {
        told |= go.try_recv().is_ok();
        let mut word = [f32::from(u8::from(told))];
        if let Err(e) = shrunk.all_max(&mut word) {
            say(format!(
                "SHRINKFAIL the shrunk group failed while the victim was woken or restarted: {e}"
            ));
            return 3;
        }
        if word[0] > 0.0 {
            break;
        }
        let step = hold[i % hold.len()];
        let step = Step {
            elements: step.elements.min(HOLD_MAX),
            ..step
        };
        let held = run_step(&shrunk, HOLD_BASE + i, step);
        if let Some(code) = step_failed(
            held,
            "SHRINKFAIL the shrunk group failed while the victim was woken or restarted",
            3,
            say,
        ) {
            return code;
        }
        // The victim's start or wake-up shares the machine's cores with this loop.
        thread::sleep(Duration::from_millis(5));
    }
    let full = match shrunk.rejoin() {
        Ok(full) => full,
        Err(e) => {
            say(format!("REJOINFAIL {e}"));
            return 4;
        }
    };
    let code = verified_phase(&full, &FULL_PHASE, plan.seed, None, say).unwrap_or(0);
    let _ = shrunk.close();
    let _ = full.close();
    code
}

/// A rank restarted in place of a failed one: forms the group with a plain `init` at its
/// hostfile address (the survivors' rejoin forms it with it), then runs the full group's
/// verified collectives.
fn restarted(plan: &RankPlan, say: &mut dyn FnMut(String)) -> u8 {
    match nuvec_distributed_engine::init(true) {
        Ok(full) => {
            let code = verified_phase(&full, &FULL_PHASE, plan.seed, None, say).unwrap_or(0);
            let _ = full.close();
            code
        }
        Err(e) => {
            say(format!("REJOINFAIL init of the restarted rank: {e}"));
            4
        }
    }
}

/// A recovery phase's verified collectives: the lines a rank prints for it (which the driver
/// judges, see [`judge_phase`]), its steps, and how it fails.
struct Phase {
    /// Printed first as `<name> <rank> <size>`.
    name: &'static str,
    /// A failure's line: `<fail> <error>`.
    fail: &'static str,
    /// Printed once every collective is verified.
    done: &'static str,
    /// The group, as failure lines and the driver's notes name it.
    group: &'static str,
    /// The first step index.
    base: usize,
    /// Tells the phase's steps apart from the other phase's ([`recover_steps`]).
    salt: u64,
    /// The rank's exit code when a collective failed.
    code: u8,
    /// The driver's verdict on a survivor whose phase failed or ended early.
    verdict: Verdict,
}

/// The shrunk group's phase: `SHRUNK <rank> <size>`, then `SHRUNK_OK` or `SHRINKFAIL` (3).
const SHRUNK_PHASE: Phase = Phase {
    name: "SHRUNK",
    fail: "SHRINKFAIL",
    done: "SHRUNK_OK",
    group: "shrunk group",
    base: SHRUNK_BASE,
    salt: 0x5A81_7C00,
    code: 3,
    verdict: Verdict::ShrinkFailed,
};

/// The rejoined full group's phase: `FULL <rank> <size>`, then `REJOINED` or `REJOINFAIL`
/// (4).
const FULL_PHASE: Phase = Phase {
    name: "FULL",
    fail: "REJOINFAIL",
    done: "REJOINED",
    group: "rejoined group",
    base: FULL_BASE,
    salt: 0xF011_0000,
    code: 4,
    verdict: Verdict::RejoinFailed,
};

/// Runs `phase` on `group`: prints its group line, verifies its [`RECOVER_STEPS`]
/// collectives (after the first, printing `FIRST_MS <ms>`, the time since `failed_at`, when
/// given), then prints its `done` line. Returns the exit code if a collective failed or was
/// wrong (see [`step_failed`]).
fn verified_phase(
    group: &Group,
    phase: &Phase,
    seed: u64,
    failed_at: Option<Instant>,
    say: &mut dyn FnMut(String),
) -> Option<u8> {
    say(format!("{} {} {}", phase.name, group.rank(), group.size()));
    let steps = recover_steps(seed, phase.salt, RECOVER_STEPS);
    let verified = verify(group, phase.base, &steps, || {
        if let Some(at) = failed_at {
            say(format!("FIRST_MS {}", at.elapsed().as_millis()));
        }
    });
    let failed = format!("{} a collective of the {}", phase.fail, phase.group);
    let code = step_failed(verified, &failed, phase.code, say);
    if code.is_none() {
        say(phase.done.into());
    }
    code
}

/// Says how `result` failed, if it did (`failed` and the error, or `BAD`), and returns the
/// exit code (`code`, or 2 for a wrong result).
fn step_failed(
    result: Result<(), StepError>,
    failed: &str,
    code: u8,
    say: &mut dyn FnMut(String),
) -> Option<u8> {
    match result {
        Ok(()) => None,
        Err(StepError::Failed(e)) => {
            say(format!("{failed}: {e}"));
            Some(code)
        }
        Err(StepError::Wrong(what)) => {
            say(format!("BAD {what}"));
            Some(2)
        }
    }
}

/// A channel that gets a message when the driver writes [`GO`] on stdin.
fn go_word() -> mpsc::Receiver<()> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in std::io::stdin().lock().lines().map_while(Result::ok) {
            if line.trim() == GO && tx.send(()).is_err() {
                break;
            }
        }
    });
    rx
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
    /// Recover mode: kill and stop faults only; the survivors shrink, verify, and rejoin the
    /// restarted victim (see [`run`]).
    pub recover: bool,
}

/// How a round (or one survivor of it) ended, best first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verdict {
    /// As it should.
    Correct,
    /// The fault came after the victim had finished the loop (a link cut takes an `ip`
    /// command, which may be slower than the last collectives): nothing to judge.
    Missed,
    /// Recover mode: every step of the recovery verified, but a survivor named another
    /// rank than the victim for the fault, or named it late. Counted apart, not a failure:
    /// the plain chaos run judges blame, this mode the recovery.
    RecoveredDespiteBlame,
    /// The right rank named, but later than timeout + 2 s after the fault.
    Late,
    /// Another rank (or none) named, or success despite a fault, or an error for lateness.
    WrongBlame,
    /// Recover mode: a survivor's shrink, or a collective of its shrunk group, failed, or
    /// the shrunk group is not the survivors in order; or a stopped victim woken after the
    /// shrink did not fail its own shrink saying it was left out.
    ShrinkFailed,
    /// Recover mode: the rejoin, the restarted victim's `init`, or a collective of the full
    /// group failed, or the full group does not have every rank back at its first rank.
    RejoinFailed,
    /// A collective returned a wrong result.
    WrongResult,
    /// No verdict within timeout + 12 s.
    Hang,
    /// The rank panicked.
    Panic,
}

impl Verdict {
    /// What the summary's counts call rounds of this verdict.
    fn counted(self) -> &'static str {
        match self {
            Verdict::Correct => "correct verdicts",
            Verdict::Missed => "faults that missed the loop",
            Verdict::RecoveredDespiteBlame => "recovered despite the blame",
            Verdict::Late => "late verdicts",
            Verdict::WrongBlame => "wrong blame",
            Verdict::ShrinkFailed => "failed shrinks",
            Verdict::RejoinFailed => "failed rejoins",
            Verdict::WrongResult => "wrong results",
            Verdict::Hang => "hangs",
            Verdict::Panic => "panics",
        }
    }
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
    /// Recover mode: per recovered round, the slowest survivor's time from its collective's
    /// failure being returned to its first verified collective on the shrunk group.
    pub recovered: Vec<Duration>,
    /// Whether this was a recover run.
    pub recover: bool,
}

impl Summary {
    /// Rounds that were not correct (a missed fault is not a failure).
    pub fn failures(&self) -> usize {
        self.verdicts
            .iter()
            .filter(|(v, _)| {
                !matches!(
                    v,
                    Verdict::Correct | Verdict::Missed | Verdict::RecoveredDespiteBlame
                )
            })
            .map(|(_, n)| n)
            .sum()
    }

    fn count(&self, verdict: Verdict) -> usize {
        self.verdicts.get(&verdict).copied().unwrap_or(0)
    }

    /// `<count> <what>` for each of `verdicts`, joined by commas.
    fn tally(&self, verdicts: &[Verdict]) -> String {
        verdicts
            .iter()
            .map(|&v| format!("{} {}", self.count(v), v.counted()))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// A line `  <fault>: <ok> of <n> rounds correct` for each of `faults` that ran.
    fn write_by_fault(&self, f: &mut fmt::Formatter<'_>, faults: &[Fault]) -> fmt::Result {
        for fault in faults {
            if let Some((n, ok)) = self.by_fault.get(fault) {
                writeln!(f, "  {fault}: {ok} of {n} rounds correct")?;
            }
        }
        Ok(())
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use Verdict::*;
        let rounds: usize = self.verdicts.values().sum();
        if self.recover {
            let others = [
                WrongResult,
                Hang,
                Panic,
                ShrinkFailed,
                RejoinFailed,
                WrongBlame,
                Late,
                Missed,
            ];
            writeln!(
                f,
                "chaos --recover: {rounds} rounds, {} shrunk and rejoined with every step \
                 verified ({} of them after a survivor blamed the wrong rank or blamed late), \
                 {}",
                self.count(Correct) + self.count(RecoveredDespiteBlame),
                self.count(RecoveredDespiteBlame),
                self.tally(&others),
            )?;
            let mut times = self.recovered.clone();
            times.sort();
            if let (Some(median), Some(max)) = (times.get(times.len() / 2), times.last()) {
                writeln!(
                    f,
                    "  failure to the first verified collective of the shrunk group: median \
                     {} ms, max {} ms ({} rounds)",
                    median.as_millis(),
                    max.as_millis(),
                    times.len()
                )?;
            }
            return self.write_by_fault(f, &[Fault::Kill, Fault::Stop]);
        }
        writeln!(
            f,
            "chaos: {rounds} rounds, {}",
            self.tally(&[Correct, WrongBlame, WrongResult, Late, Hang, Panic, Missed])
        )?;
        self.write_by_fault(f, &[Fault::Kill, Fault::Stop, Fault::Cut, Fault::Late])?;
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
    /// Recover mode: where the driver writes [`GO`].
    stdin: Option<ChildStdin>,
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
    let mut summary = Summary {
        recover: options.recover,
        ..Summary::default()
    };
    let mut faults = vec![Fault::Kill, Fault::Stop, Fault::Late];
    if options.recover {
        // A cut link or a late rank leaves no rank to restart: recovery is for a rank that
        // died (kill) or stopped answering (stop).
        faults = vec![Fault::Kill, Fault::Stop];
    } else if can_cut_links() {
        faults.insert(2, Fault::Cut);
    } else {
        summary.cut_skipped = true;
        println!("chaos: cut-link faults SKIPPED: they need root and a working `ip netns`");
    }
    println!(
        "chaos: {} rounds from seed {}, timeout {:?}, {} collectives per round, {} wire{}",
        options.rounds,
        options.seed,
        options.timeout,
        options.steps,
        options.wire,
        if options.recover {
            ", recover mode (shrink, verify, restart the victim, rejoin, verify)"
        } else {
            ""
        }
    );
    for i in 0..options.rounds {
        if crate::runner::interrupted() {
            println!("chaos: interrupted");
            break;
        }
        let seed = options.seed.wrapping_add(i as u64);
        let round = Round::new(seed, &faults, options.steps, options.timeout);
        let result = if options.recover {
            run_recover_round(&round, options)
        } else {
            run_round(&round, options).map(|(verdict, notes)| (verdict, notes, None))
        };
        let (verdict, notes, recovered) = match result {
            Ok(result) => result,
            Err(e) => (
                Verdict::WrongBlame,
                vec![format!("could not run: {e}")],
                None,
            ),
        };
        match recovered {
            Some(times) => {
                println!("round {i}: {round}: {verdict:?}; {times}");
                summary.recovered.push(times.known);
            }
            None => println!("round {i}: {round}: {verdict:?}"),
        }
        for note in &notes {
            println!("    {note}");
        }
        *summary.verdicts.entry(verdict).or_default() += 1;
        if verdict != Verdict::Missed {
            let entry = summary.by_fault.entry(round.fault).or_default();
            entry.0 += 1;
            entry.1 += usize::from(matches!(
                verdict,
                Verdict::Correct | Verdict::RecoveredDespiteBlame
            ));
        }
    }
    summary
}

/// A hostfile's nodes for `size` ranks on this machine: one address each, at free ports.
fn local_nodes(size: usize) -> Result<Vec<Vec<String>>, String> {
    let first = crate::launch::free_port_block(size).map_err(|e| e.to_string())?;
    Ok((0..size)
        .map(|r| vec![format!("127.0.0.1:{}", first as usize + r)])
        .collect())
}

/// Writes the hostfile of `nodes` into `dir` and returns its path.
fn write_hostfile(dir: &Path, nodes: &[Vec<String>]) -> Result<PathBuf, String> {
    let hostfile = dir.join("hostfile.json");
    std::fs::write(
        &hostfile,
        nuvec_distributed_engine::config::hostfile::to_json(nodes),
    )
    .map_err(|e| e.to_string())?;
    Ok(hostfile)
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
        None => local_nodes(round.size)?,
    };
    let hostfile = write_hostfile(dir.path(), &nodes)?;

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
        let start = if round.fault == Fault::Late && !round.late_start && rank == round.victim {
            Start::Late(round.at, round.pause)
        } else {
            Start::Plain
        };
        let process = spawn_rank(
            rank,
            round,
            options,
            &hostfile,
            start,
            netns.as_ref(),
            Tagged(rank, tx.clone()),
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

    // A victim that finished its loop did all its communication before the fault took
    // effect, whenever its last line arrived here (a cut link takes effect some
    // milliseconds into `ip`, and a busy machine delivers lines late): the survivors may
    // finish too, and no blame is due.
    if round.fault != Fault::Late
        && lines
            .iter()
            .any(|l| l.rank == round.victim && l.text == "DONE")
    {
        notes.push(format!(
            "rank {} finished the loop before the fault took effect",
            round.victim
        ));
        return Ok((Verdict::Missed, notes));
    }
    let mut worst = Verdict::Correct;
    let mut logs = Vec::new();
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
        }
        if options.verbose {
            // Every survivor's output, the correct ones' too: a wrong verdict is often
            // explained by what its neighbour did (the notice it left, when it closed).
            let out: Vec<&str> = mine.iter().map(|l| l.text.as_str()).collect();
            logs.push(format!(
                "rank {rank} ({verdict:?}) stdout: {}\n    stderr: {}",
                out.join(" | "),
                stderr.trim()
            ));
        }
        worst = worst.max(verdict);
    }
    if worst != Verdict::Correct {
        notes.append(&mut logs);
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

/// Recover mode: how fast a round's survivors computed again.
#[derive(Clone, Copy, Debug)]
pub struct Recovered {
    /// The slowest survivor's time from its collective's failure being returned to its first
    /// verified collective on the shrunk group (the shrink and one collective).
    pub known: Duration,
    /// From the fault's injection to the last survivor's report of that collective (adds
    /// the time to notice the failure: up to the timeout for a stopped rank).
    pub from_fault: Duration,
}

impl fmt::Display for Recovered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "failure to the first verified collective of the shrunk group {} ms ({} ms from \
             the fault)",
            self.known.as_millis(),
            self.from_fault.as_millis()
        )
    }
}

/// A round's verdict, what went wrong, and in recover mode how fast it recovered.
type RoundResult = (Verdict, Vec<String>, Option<Recovered>);

/// Whether `text` ends a recovering rank's run (`SHRUNK_OK` ends its shrink only).
fn is_end(text: &str) -> bool {
    text == "DONE"
        || text == "REJOINED"
        || ["BAD ", "SHRINKFAIL ", "REJOINFAIL "]
            .iter()
            .any(|p| text.starts_with(p))
}

/// Rank `tag`'s first line that `pred` accepts.
fn said(lines: &[Line], tag: usize, pred: impl Fn(&str) -> bool) -> Option<&Line> {
    lines.iter().find(|l| l.rank == tag && pred(&l.text))
}

/// Collects lines until `done` holds (true) or `until` passes (false).
fn collect(
    rx: &mpsc::Receiver<Line>,
    lines: &mut Vec<Line>,
    procs: &mut [RankProcess],
    until: Instant,
    mut done: impl FnMut(&[Line], &mut [RankProcess]) -> bool,
) -> bool {
    loop {
        if done(lines, procs) {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        match rx.recv_timeout(Duration::from_millis(10)) {
            Ok(line) => lines.push(line),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// Ends a rank (a stopped one too) and waits for it.
fn end(p: &mut RankProcess) {
    p.signal(Signal::SIGKILL);
    p.signal(Signal::SIGCONT);
    let _ = p.child.wait();
    p.exited = true;
}

/// One recover round: the loop and the fault as in [`run_round`] (kill or stop, once every
/// rank has formed), then:
///
/// 1. every survivor shrinks and verifies its shrunk group ([`recover`]) and keeps it busy;
/// 2. a stopped victim is woken (SIGCONT): its collective fails, and so must its shrink,
///    saying it was left out; then it is killed;
/// 3. the victim is started again at its hostfile address (a plain `init`), the driver tells
///    the survivors to rejoin, and every rank verifies the full group.
///
/// Each phase runs only if the one before completed on every survivor. Waits are bounded:
/// the shrink by timeout + 2 s (noticing the failure) + 4 timeouts + 10 s, the woken
/// victim's shrink by 5 timeouts + 10 s, the rejoin by 3 timeouts + 20 s; a rank still
/// running then hangs.
fn run_recover_round(round: &Round, options: &Options) -> Result<RoundResult, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let hostfile = write_hostfile(dir.path(), &local_nodes(round.size)?)?;

    let (tx, rx) = mpsc::channel::<Line>();
    let mut procs: Vec<RankProcess> = Vec::new();
    for rank in 0..round.size {
        match spawn_rank(
            rank,
            round,
            options,
            &hostfile,
            Start::Plain,
            None,
            Tagged(rank, tx.clone()),
        ) {
            Ok(p) => procs.push(p),
            Err(e) => {
                procs.iter_mut().for_each(end);
                return Err(format!("starting rank {rank}: {e}"));
            }
        }
    }
    let victim = round.victim;
    // The restarted victim's lines carry this tag; it is also its index in `procs`.
    let restarted = round.size;
    let survivors: Vec<usize> = (0..round.size).filter(|&r| r != victim).collect();
    let timeout = options.timeout;
    let mut lines: Vec<Line> = Vec::new();
    let mut notes = Vec::new();

    // The fault, once every rank has formed (a rank still in `init` has no group to shrink;
    // a failure then is init's to report, as plain chaos checks) and the victim announces
    // the step.
    let want = format!("AT {}", round.at);
    collect(
        &rx,
        &mut lines,
        &mut procs,
        Instant::now() + Duration::from_secs(60),
        |lines, procs| {
            (said(lines, victim, |t| t == want).is_some()
                && (0..round.size).all(|r| said(lines, r, |t| t == "READY").is_some()))
                || procs.iter_mut().any(|p| p.reap())
        },
    );
    if said(&lines, victim, |t| t == want).is_none() {
        notes.push(format!(
            "rank {victim} never reached step {}: no fault injected",
            round.at
        ));
    }
    thread::sleep(Duration::from_micros(
        Rng::new(round.seed ^ 0xFA17).range(0, 3000),
    ));
    match round.fault {
        Fault::Stop => procs[victim].signal(Signal::SIGSTOP),
        _ => procs[victim].signal(Signal::SIGKILL),
    }
    let fault_at = Instant::now();

    // 1. Every survivor notices the failure, shrinks and verifies.
    let in_time = timeout + Duration::from_secs(2);
    let shrunk_by = fault_at + in_time + timeout * 4 + Duration::from_secs(10);
    let settled = |r: usize, lines: &[Line], procs: &mut [RankProcess]| {
        said(lines, r, |t| t == "SHRUNK_OK" || is_end(t)).is_some() || procs[r].reap()
    };
    collect(&rx, &mut lines, &mut procs, shrunk_by, |lines, procs| {
        survivors.iter().all(|&r| settled(r, lines, procs))
    });
    let hung_shrinking: Vec<usize> = survivors
        .iter()
        .copied()
        .filter(|&r| !settled(r, &lines, &mut procs))
        .collect();
    let shrunk = survivors
        .iter()
        .all(|&r| said(&lines, r, |t| t == "SHRUNK_OK").is_some());

    // 2. A stopped victim wakes into a world that shrank without it.
    let mut woken_hung = None;
    if shrunk && round.fault == Fault::Stop {
        procs[victim].signal(Signal::SIGCONT);
        let by = Instant::now() + timeout * 5 + Duration::from_secs(10);
        let answered = collect(&rx, &mut lines, &mut procs, by, |lines, procs| {
            said(lines, victim, |t| is_end(t) || t.starts_with("SHRUNK ")).is_some()
                || procs[victim].reap()
        });
        woken_hung = Some(!answered);
    }
    end(&mut procs[victim]);

    // 3. The victim starts again in place; the survivors rejoin it.
    let mut rejoin_hung: Option<Vec<usize>> = None;
    if shrunk {
        let again = spawn_rank(
            victim,
            round,
            options,
            &hostfile,
            Start::Restarted,
            None,
            Tagged(restarted, tx.clone()),
        );
        match again {
            Ok(p) => procs.push(p),
            Err(e) => {
                procs.iter_mut().for_each(end);
                return Err(format!("restarting rank {victim}: {e}"));
            }
        }
        for &r in &survivors {
            if let Some(stdin) = procs[r].stdin.as_mut() {
                let _ = writeln!(stdin, "{GO}").and_then(|()| stdin.flush());
            }
        }
        let mut ranks = survivors.clone();
        ranks.push(restarted);
        let by = Instant::now() + timeout * 3 + Duration::from_secs(20);
        collect(&rx, &mut lines, &mut procs, by, |_, procs| {
            ranks.iter().all(|&r| procs[r].reap())
        });
        rejoin_hung = Some(
            ranks
                .iter()
                .copied()
                .filter(|&r| !procs[r].reap())
                .collect(),
        );
    }
    drop(tx);
    // What ranks still running say once the driver ends them (a shrunk group whose members
    // are killed fails) is not theirs to answer for. A rank that had exited said everything
    // before, although its reader may deliver its last lines later.
    let ended_at = Instant::now();
    let exited: Vec<bool> = procs.iter_mut().map(|p| p.reap()).collect();
    let counts = |l: &Line| exited.get(l.rank).copied().unwrap_or(false) || l.at <= ended_at;
    procs.iter_mut().for_each(end);
    let drain_until = Instant::now() + Duration::from_secs(2);
    while let Ok(line) = rx.recv_timeout(drain_until.saturating_duration_since(Instant::now())) {
        lines.push(line);
    }

    // Survivors that finished the loop had every collective complete, the victim's part
    // included: the fault came after it (the victim may not have printed DONE yet), and
    // there is nothing to recover from.
    let finished = |r: usize| {
        lines
            .iter()
            .filter(|l| l.rank == r && counts(l))
            .any(|l| l.text == "DONE")
    };
    if lines
        .iter()
        .any(|l| l.rank == victim && l.text == "DONE" && l.at <= fault_at)
        || survivors.iter().all(|&r| finished(r))
    {
        notes.push(format!(
            "rank {victim} finished the loop before the fault took effect"
        ));
        return Ok((Verdict::Missed, notes, None));
    }
    let stderr_of = |p: &RankProcess| p.stderr.lock().map(|s| s.clone()).unwrap_or_default();
    let mine = |tag: usize| -> Vec<&Line> {
        lines
            .iter()
            .filter(|l| l.rank == tag && counts(l))
            .collect()
    };
    let mut findings: Vec<(String, (Verdict, String))> = Vec::new();
    for (position, &r) in survivors.iter().enumerate() {
        let expect = Expect {
            shrunk: (position, survivors.len()),
            full: (r, round.size),
        };
        let verdict = judge_survivor(
            round,
            fault_at,
            in_time,
            &stderr_of(&procs[r]),
            &mine(r),
            expect,
            hung_shrinking.contains(&r),
            rejoin_hung.as_ref().map(|h| h.contains(&r)),
        );
        findings.push((format!("rank {r}"), verdict));
    }
    if let Some(hung) = woken_hung {
        let verdict = judge_woken(&stderr_of(&procs[victim]), &mine(victim), hung);
        findings.push((format!("woken victim {victim}"), verdict));
    }
    if let Some(hung) = &rejoin_hung {
        let verdict = judge_restarted(
            &stderr_of(&procs[restarted]),
            &mine(restarted),
            (victim, round.size),
            hung.contains(&restarted),
        );
        findings.push((format!("restarted victim {victim}"), verdict));
    }
    let mut worst = Verdict::Correct;
    for (who, (verdict, note)) in findings {
        if verdict != Verdict::Correct {
            notes.push(format!("{who}: {verdict:?}: {note}"));
        }
        worst = worst.max(verdict);
    }
    if options.verbose && worst != Verdict::Correct {
        for (tag, p) in procs.iter().enumerate() {
            let out: Vec<String> = mine(tag)
                .iter()
                .map(|l| format!("{} ({:+.3}s)", l.text, signed(l.at, fault_at)))
                .collect();
            let who = if tag == restarted {
                format!("restarted {victim}")
            } else {
                format!("rank {tag}")
            };
            notes.push(format!(
                "{who} stdout (time from the fault): {}\n    stderr: {}",
                out.join(" | "),
                stderr_of(p).trim()
            ));
        }
    }
    let first_verified: Option<Vec<(Duration, Duration)>> = survivors
        .iter()
        .map(|&r| {
            let line = said(&lines, r, |t| t.starts_with("FIRST_MS "))?;
            let ms: u64 = line.text.strip_prefix("FIRST_MS ")?.parse().ok()?;
            Some((
                Duration::from_millis(ms),
                line.at.saturating_duration_since(fault_at),
            ))
        })
        .collect();
    let recovered = first_verified.map(|times| Recovered {
        known: times.iter().map(|t| t.0).max().unwrap_or_default(),
        from_fault: times.iter().map(|t| t.1).max().unwrap_or_default(),
    });
    Ok((worst, notes, recovered))
}

/// The groups a survivor should be in: (rank, size) of the shrunk group and of the full one.
#[derive(Clone, Copy, Debug)]
struct Expect {
    shrunk: (usize, usize),
    full: (usize, usize),
}

/// Whether `line` is `<prefix> <rank> <size>` with the expected numbers; `Err` says what it
/// says instead.
fn check_group(line: Option<&&Line>, prefix: &str, want: (usize, usize)) -> Result<(), String> {
    let Some(line) = line else {
        return Err(format!("never printed {prefix}"));
    };
    let got = line.text.strip_prefix(prefix).unwrap_or_default().trim();
    if got == format!("{} {}", want.0, want.1) {
        Ok(())
    } else {
        Err(format!(
            "is rank and size {got}, expected {} {}",
            want.0, want.1
        ))
    }
}

/// The panic in `stderr`, if any.
fn panicked(stderr: &str) -> Option<String> {
    let i = stderr.find("panicked")?;
    Some(stderr[i..].lines().next().unwrap_or_default().into())
}

/// What a recover round's judges check first: a panic in the rank's `stderr`, then a wrong
/// result (`BAD`) among its lines.
fn panic_or_bad(stderr: &str, mine: &[&Line]) -> Option<(Verdict, String)> {
    if let Some(text) = panicked(stderr) {
        return Some((Verdict::Panic, text));
    }
    let bad = mine.iter().find(|l| l.text.starts_with("BAD "))?;
    Some((Verdict::WrongResult, bad.text[4..].into()))
}

/// A recover round's survivor: its blame of the fault (as in plain chaos), its shrink and
/// shrunk group, and (`rejoin`: whether it hung there, when the rejoin was reached) its
/// rejoin and full group. `hung_shrinking`: still running when the shrink's wait ended.
#[allow(clippy::too_many_arguments)]
fn judge_survivor(
    round: &Round,
    fault_at: Instant,
    in_time: Duration,
    stderr: &str,
    mine: &[&Line],
    expect: Expect,
    hung_shrinking: bool,
    rejoin: Option<bool>,
) -> (Verdict, String) {
    if let Some(verdict) = panic_or_bad(stderr, mine) {
        return verdict;
    }
    let find = |pred: &dyn Fn(&str) -> bool| mine.iter().find(|l| pred(&l.text));
    let noticed = find(&|t| t == "DONE" || t.starts_with("FAIL "));
    let (blame, blame_note) = judge(round, fault_at, in_time, "", noticed.copied());
    if matches!(blame, Verdict::Hang | Verdict::Panic | Verdict::WrongResult) {
        return (blame, blame_note);
    }
    // The recovery is judged whatever the blame: a survivor that named the wrong rank (or
    // named it late) still has to shrink, verify, rejoin and verify, and a round in which
    // all of that held is counted apart from both correct and failed rounds.
    let recovered = || match blame {
        Verdict::Correct => (Verdict::Correct, String::new()),
        _ => (
            Verdict::RecoveredDespiteBlame,
            format!("recovered, but blamed: {blame_note}"),
        ),
    };
    if let Some(judged) = judge_phase(mine, &SHRUNK_PHASE, expect.shrunk, hung_shrinking) {
        return judged;
    }
    let Some(hung) = rejoin else {
        return recovered();
    };
    if let Some(judged) = judge_phase(mine, &FULL_PHASE, expect.full, hung) {
        return judged;
    }
    recovered()
}

/// A survivor's `phase`, from its lines `mine`, if it did not complete: failed, formed a
/// group of another rank and size than `want`, or ended (still running when its wait ended:
/// `hung`) before its collectives were verified.
fn judge_phase(
    mine: &[&Line],
    phase: &Phase,
    want: (usize, usize),
    hung: bool,
) -> Option<(Verdict, String)> {
    let find = |pred: &dyn Fn(&str) -> bool| mine.iter().find(|l| pred(&l.text));
    let fail = format!("{} ", phase.fail);
    if let Some(failed) = find(&|t| t.starts_with(&fail)) {
        return Some((phase.verdict, failed.text[fail.len()..].into()));
    }
    let stuck = |what: String| {
        if hung {
            (Verdict::Hang, format!("still running, {what}"))
        } else {
            (phase.verdict, format!("ended {what}"))
        }
    };
    let prefix = format!("{} ", phase.name);
    let line = find(&|t| t.starts_with(&prefix));
    if line.is_none() {
        return Some(stuck(format!("without a {}", phase.group)));
    }
    if let Err(e) = check_group(line, &prefix, want) {
        return Some((phase.verdict, format!("the {} {e}", phase.group)));
    }
    if find(&|t| t == phase.done).is_none() {
        return Some(stuck(format!(
            "before the {}'s collectives were verified",
            phase.group
        )));
    }
    None
}

/// A stopped victim woken after the survivors shrank: its shrink must fail saying it was
/// left out. `hung`: no verdict within its wait.
fn judge_woken(stderr: &str, mine: &[&Line], hung: bool) -> (Verdict, String) {
    if let Some(verdict) = panic_or_bad(stderr, mine) {
        return verdict;
    }
    let find = |pred: &dyn Fn(&str) -> bool| mine.iter().find(|l| pred(&l.text));
    if let Some(joined) = find(&|t| t.starts_with("SHRUNK ")) {
        return (
            Verdict::ShrinkFailed,
            format!(
                "its shrink succeeded ({}) although it was left out",
                joined.text
            ),
        );
    }
    match find(&|t| t.starts_with("SHRINKFAIL ")) {
        Some(l) if l.text.contains("left out") => (Verdict::Correct, String::new()),
        Some(l) => (
            Verdict::ShrinkFailed,
            format!(
                "its shrink failed without saying it was left out: {}",
                &l.text[11..]
            ),
        ),
        None if hung => (Verdict::Hang, "no shrink verdict after it was woken".into()),
        None => (
            Verdict::ShrinkFailed,
            format!(
                "ended without a shrink verdict; its last line: {}",
                mine.last().map_or("none", |l| l.text.as_str())
            ),
        ),
    }
}

/// The victim restarted at its hostfile address: its `init` must form the full group with
/// the survivors' rejoin, at rank and size `want`, and verify it.
fn judge_restarted(
    stderr: &str,
    mine: &[&Line],
    want: (usize, usize),
    hung: bool,
) -> (Verdict, String) {
    if let Some(verdict) = panic_or_bad(stderr, mine) {
        return verdict;
    }
    let find = |pred: &dyn Fn(&str) -> bool| mine.iter().find(|l| pred(&l.text));
    if let Some(failed) = find(&|t| t.starts_with("REJOINFAIL ")) {
        return (Verdict::RejoinFailed, failed.text[11..].into());
    }
    if let Some(full) = find(&|t| t.starts_with("FULL "))
        && let Err(e) = check_group(Some(full), "FULL ", want)
    {
        return (Verdict::RejoinFailed, format!("its group {e}"));
    }
    match find(&|t| t == "REJOINED") {
        Some(_) => (Verdict::Correct, String::new()),
        None if hung => (
            Verdict::Hang,
            "still running, the full group not verified".into(),
        ),
        None => (
            Verdict::RejoinFailed,
            "ended before the full group was verified".into(),
        ),
    }
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

/// Where a rank's stdout lines go, and the number they carry there (its rank; a restarted
/// rank has another).
struct Tagged(usize, mpsc::Sender<Line>);

/// How a rank starts.
#[derive(Clone, Copy, Debug)]
enum Start {
    /// Runs the loop.
    Plain,
    /// Runs the loop, pausing this long before this step.
    Late(usize, Duration),
    /// Restarted in place of a failed rank (recover mode): joins the rejoin.
    Restarted,
}

/// Starts one rank of `round`, in its namespace when there is one; its stdout lines go to
/// `lines`, its stderr is kept. In recover mode its stdin is a pipe (for [`GO`]).
fn spawn_rank(
    rank: usize,
    round: &Round,
    options: &Options,
    hostfile: &Path,
    start: Start,
    netns: Option<&Netns>,
    Tagged(tag, lines): Tagged,
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
    if options.recover {
        argv.push("--recover".into());
    }
    match start {
        Start::Plain => {}
        Start::Late(at, pause) => argv.extend([
            "--late-at".into(),
            at.to_string(),
            "--late-ms".into(),
            pause.as_millis().to_string(),
        ]),
        Start::Restarted => argv.push("--restarted".into()),
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
        );
    if netns.is_some() {
        // A cut link cuts TCP; ranks in network namespaces of one kernel still share
        // /dev/shm, so the native wire's shared memory would carry the data past the cut.
        command.env(nuvec_distributed_engine::SHM_VAR, "0");
    }
    // A killed chaos run must not leave ranks behind (the parent-death signal).
    crate::runner::prepare_child(&mut command, options.recover);
    let mut child = command.spawn()?;
    let stdin = child.stdin.take();
    if let Some(out) = child.stdout.take() {
        thread::spawn(move || {
            for text in BufReader::new(out).lines().map_while(Result::ok) {
                let line = Line {
                    rank: tag,
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
        stdin,
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

    /// A recover round's lines, judged for one survivor (first rank 2 of 4, the victim 1).
    #[test]
    fn recover_verdicts() {
        let round = Round {
            seed: 1,
            size: 4,
            fault: Fault::Kill,
            victim: 1,
            at: 3,
            late_start: false,
            pause: Duration::ZERO,
        };
        let t0 = Instant::now();
        let in_time = Duration::from_secs(3);
        let expect = Expect {
            shrunk: (1, 3),
            full: (2, 4),
        };
        let lines = |texts: &[&str]| -> Vec<Line> {
            texts
                .iter()
                .map(|t| Line {
                    rank: 2,
                    text: t.to_string(),
                    at: t0 + Duration::from_millis(100),
                })
                .collect()
        };
        let v = |texts: &[&str], stderr: &str, hung: bool, rejoin: Option<bool>| {
            let owned = lines(texts);
            let mine: Vec<&Line> = owned.iter().collect();
            judge_survivor(&round, t0, in_time, stderr, &mine, expect, hung, rejoin).0
        };
        let good = [
            "READY",
            "AT 3",
            "FAIL 1 lost",
            "SHRUNK 1 3",
            "FIRST_MS 20",
            "SHRUNK_OK",
            "FULL 2 4",
            "REJOINED",
        ];
        assert_eq!(v(&good, "", false, Some(false)), Verdict::Correct);
        // Judged only as far as the round went.
        assert_eq!(v(&good[..6], "", false, None), Verdict::Correct);
        assert_eq!(v(&good[..6], "", false, Some(true)), Verdict::Hang);
        assert_eq!(v(&good[..6], "", false, Some(false)), Verdict::RejoinFailed);
        let panic = "thread 'main' panicked at src/x.rs:1:1";
        assert_eq!(v(&good, panic, false, Some(false)), Verdict::Panic);
        // Wrong blame is counted apart when the recovery held, and the recovery's failure
        // is the verdict when it did not.
        assert_eq!(
            v(&["FAIL 0 lost", "SHRUNK 1 3", "SHRUNK_OK"], "", false, None),
            Verdict::RecoveredDespiteBlame
        );
        assert_eq!(
            v(&["FAIL 0 lost", "SHRINKFAIL x"], "", false, None),
            Verdict::ShrinkFailed
        );
        assert_eq!(
            v(&["FAIL 1 lost", "SHRINKFAIL x"], "", false, None),
            Verdict::ShrinkFailed
        );
        assert_eq!(
            v(&["FAIL 1 lost", "SHRUNK 0 3", "SHRUNK_OK"], "", false, None),
            Verdict::ShrinkFailed,
            "renumbered wrongly"
        );
        assert_eq!(
            v(&["FAIL 1 lost", "SHRUNK 1 4", "SHRUNK_OK"], "", false, None),
            Verdict::ShrinkFailed,
            "the victim is still in"
        );
        assert_eq!(v(&["FAIL 1 lost"], "", true, None), Verdict::Hang);
        assert_eq!(v(&["FAIL 1 lost"], "", false, None), Verdict::ShrinkFailed);
        assert_eq!(
            v(&["FAIL 1 lost", "SHRUNK 1 3"], "", true, None),
            Verdict::Hang
        );
        assert_eq!(
            v(
                &["FAIL 1 lost", "SHRUNK 1 3", "BAD step 1000"],
                "",
                false,
                None
            ),
            Verdict::WrongResult
        );
        let mut rejoined_wrongly = good;
        rejoined_wrongly[6] = "FULL 1 4";
        assert_eq!(
            v(&rejoined_wrongly, "", false, Some(false)),
            Verdict::RejoinFailed
        );
        let mut rejoin_failed = good.to_vec();
        rejoin_failed.truncate(6);
        rejoin_failed.push("REJOINFAIL timed out");
        assert_eq!(
            v(&rejoin_failed, "", false, Some(false)),
            Verdict::RejoinFailed
        );

        let woken = |texts: &[&str], hung: bool| {
            let owned = lines(texts);
            let mine: Vec<&Line> = owned.iter().collect();
            judge_woken("", &mine, hung).0
        };
        let left_out = "SHRINKFAIL shrink: first rank 1 is left out of the shrunk group";
        assert_eq!(woken(&["FAIL 0 x", left_out], false), Verdict::Correct);
        assert_eq!(
            woken(&["FAIL 0 x", "SHRINKFAIL timed out"], false),
            Verdict::ShrinkFailed
        );
        assert_eq!(
            woken(&["FAIL 0 x", "SHRUNK 0 2", "SHRUNK_OK"], false),
            Verdict::ShrinkFailed
        );
        assert_eq!(woken(&["FAIL 0 x"], true), Verdict::Hang);
        assert_eq!(woken(&[], false), Verdict::ShrinkFailed);

        let restarted = |texts: &[&str], hung: bool| {
            let owned = lines(texts);
            let mine: Vec<&Line> = owned.iter().collect();
            judge_restarted("", &mine, (1, 4), hung).0
        };
        assert_eq!(
            restarted(&["FULL 1 4", "REJOINED"], false),
            Verdict::Correct
        );
        assert_eq!(
            restarted(&["FULL 0 4", "REJOINED"], false),
            Verdict::RejoinFailed
        );
        assert_eq!(
            restarted(&["REJOINFAIL init: x"], false),
            Verdict::RejoinFailed
        );
        assert_eq!(restarted(&["FULL 1 4"], true), Verdict::Hang);
        assert_eq!(
            restarted(&["FULL 1 4", "BAD step 3000"], false),
            Verdict::WrongResult
        );
    }

    #[test]
    fn recover_summary() {
        let mut summary = Summary {
            recover: true,
            ..Summary::default()
        };
        summary.verdicts.insert(Verdict::Correct, 3);
        summary.verdicts.insert(Verdict::RejoinFailed, 1);
        summary.recovered = [30, 10, 20].map(Duration::from_millis).to_vec();
        let text = summary.to_string();
        assert!(text.contains("4 rounds, 3 shrunk and rejoined"), "{text}");
        assert!(text.contains("1 failed rejoins"), "{text}");
        assert!(
            text.contains("median 20 ms, max 30 ms (3 rounds)"),
            "{text}"
        );
        assert_eq!(summary.failures(), 1);
        assert_eq!(
            text.lines().next(),
            Some(
                "chaos --recover: 4 rounds, 3 shrunk and rejoined with every step verified (0 \
                 of them after a survivor blamed the wrong rank or blamed late), 0 wrong \
                 results, 0 hangs, 0 panics, 0 failed shrinks, 1 failed rejoins, 0 wrong \
                 blame, 0 late verdicts, 0 faults that missed the loop"
            )
        );
    }

    #[test]
    fn summary() {
        let mut summary = Summary::default();
        summary.verdicts.insert(Verdict::Correct, 2);
        summary.verdicts.insert(Verdict::WrongBlame, 1);
        summary.verdicts.insert(Verdict::Hang, 1);
        summary.by_fault.insert(Fault::Kill, (3, 2));
        summary.by_fault.insert(Fault::Late, (1, 0));
        summary.cut_skipped = true;
        assert_eq!(
            summary.to_string(),
            "chaos: 4 rounds, 2 correct verdicts, 1 wrong blame, 0 wrong results, 0 late \
             verdicts, 1 hangs, 0 panics, 0 faults that missed the loop\n  kill -9: 2 of 3 \
             rounds correct\n  late rank: 0 of 1 rounds correct\n  cut link: SKIPPED (needs \
             root and a working `ip netns`; this run has not both)\n"
        );
        assert_eq!(summary.failures(), 2);
    }
}
