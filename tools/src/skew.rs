//! Late arrivals: what a collective costs the ranks that reach it first, when one rank
//! arrives late. The measurement of `nuvec bench --skew`, run inside every rank.
//!
//! Methodology (the same as `tools/anchors/skew.py`, so figures compare with Open MPI's and
//! MLX's):
//!
//! - per delay `d`: a barrier, then the last rank spins for `d` while the others go
//!   straight on, then every rank calls an all_sum of `bytes` (float32 ones);
//! - rank 0 (an early rank) times its all_sum; its **excess** is that time minus `d`, the
//!   part of the wait that is not the late rank's lateness: what a wait policy costs
//!   (waking up, polling slower than the data arrives);
//! - its CPU time per call (the process's, as `time.process_time()` in skew.py) says what
//!   it paid for that: a rank that spins through the whole wait uses `d` of CPU;
//! - `min(iters, max(20, 1e6 / (d + 1)))` calls per delay after 50 warm-up calls; rank 0
//!   computes the counts and every rank learns them through a broadcast, so all ranks run
//!   the same collectives in the same order;
//! - every result is checked: each element must equal the number of ranks.

use std::time::{Duration, Instant};

use nuvec_distributed_engine::{Error, Group, Result};
use serde::{Deserialize, Serialize};

/// Warm-up calls before the first delay, as skew.py.
pub const WARMUP: usize = 50;

/// The delays skew.py measures by default, µs.
pub const DEFAULT_DELAYS_US: [u64; 6] = [0, 10, 50, 200, 1000, 5000];

/// The all_sum size skew.py measures by default, bytes.
pub const DEFAULT_BYTES: usize = 2048;

/// What rank 0 paid at one delay.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SkewPoint {
    /// How late the last rank arrived, µs.
    pub delay_us: u64,
    /// Calls measured at this delay.
    pub calls: usize,
    /// Median of rank 0's call time minus the delay, µs.
    pub excess_median_us: f64,
    /// 90th percentile of the same, µs.
    pub excess_p90_us: f64,
    /// Rank 0's process CPU time per call, µs.
    pub cpu_us: f64,
    /// Elements that differed from the expected sum, over every rank.
    pub wrong: u64,
}

/// Calls at delay `d_us`, at most `iters`: as skew.py, enough calls for about a second of
/// delays, and at least 20.
pub fn calls(d_us: u64, iters: usize) -> usize {
    let budget = usize::try_from(1_000_000 / (d_us.saturating_add(1))).unwrap_or(usize::MAX);
    iters.min(budget.max(20))
}

/// This process's CPU time (user and system, every thread).
fn process_cpu() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_PROCESS_CPUTIME_ID)
        .map(Duration::from)
        .unwrap_or_default()
}

/// Spins (without yielding) until `until`: a late rank that is busy, as between layers.
fn spin_until(until: Instant) {
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

/// The value at quantile `q` of sorted `v` (0 for none).
fn quantile(v: &[f64], q: f64) -> f64 {
    v.get(((v.len().max(1) - 1) as f64 * q).round() as usize)
        .copied()
        .unwrap_or(0.0)
}

/// Runs the skew measurement on `group` (every rank with the same arguments) and returns
/// rank 0's points (other ranks get zeros for its timings).
///
/// # Errors
///
/// Any collective's error; a group of one rank has no late peer and is refused.
pub fn run(group: &Group, bytes: usize, delays_us: &[u64], iters: usize) -> Result<Vec<SkewPoint>> {
    let (rank, n) = (group.rank(), group.size());
    if n < 2 {
        return Err(Error::InvalidArgument(
            "nuvec bench --skew needs at least two ranks: one to arrive late".into(),
        ));
    }
    let late = n - 1;
    let elems = (bytes / 4).max(1);
    let mut x = vec![1.0f32; elems];
    for _ in 0..WARMUP {
        x.fill(1.0);
        group.all_sum(&mut x)?;
    }
    // Rank 0 decides the counts; every rank runs what it decided.
    let mut counts: Vec<u64> = delays_us
        .iter()
        .map(|&d| if rank == 0 { calls(d, iters) as u64 } else { 0 })
        .collect();
    group.broadcast(&mut counts, 0)?;
    let mut out = Vec::with_capacity(delays_us.len());
    for (&d, &count) in delays_us.iter().zip(&counts) {
        let count = count as usize;
        let delay = Duration::from_micros(d);
        let mut excess = Vec::with_capacity(count);
        let mut cpu = Duration::ZERO;
        let mut wrong = 0u64;
        for _ in 0..count {
            x.fill(1.0);
            group.barrier()?;
            if rank == late {
                spin_until(Instant::now() + delay);
            }
            let (t, c) = (Instant::now(), process_cpu());
            group.all_sum(&mut x)?;
            let took = t.elapsed();
            cpu += process_cpu().saturating_sub(c);
            excess.push((took.as_secs_f64() - delay.as_secs_f64()) * 1e6);
            wrong += x.iter().filter(|&&v| v != n as f32).count() as u64;
        }
        let mut total = [wrong];
        group.all_sum(&mut total)?;
        excess.sort_by(f64::total_cmp);
        out.push(SkewPoint {
            delay_us: d,
            calls: count,
            excess_median_us: quantile(&excess, 0.5),
            excess_p90_us: quantile(&excess, 0.9),
            cpu_us: cpu.as_secs_f64() * 1e6 / count.max(1) as f64,
            wrong: total[0],
        });
    }
    Ok(out)
}

/// Parses one of skew.py's lines, `skew d_us=D excess_us=E p90_us=P cpu_us=C`, into a
/// point (`calls` as skew.py chose them for `iters`; `wrong` 0: skew.py asserts its
/// results and fails otherwise).
pub fn parse_anchor_line(line: &str, iters: usize) -> Option<SkewPoint> {
    let rest = line.trim().strip_prefix("skew ")?;
    let field = |name: &str| -> Option<f64> {
        rest.split_whitespace()
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))?
            .parse()
            .ok()
    };
    let delay_us = field("d_us")? as u64;
    Some(SkewPoint {
        delay_us,
        calls: calls(delay_us, iters),
        excess_median_us: field("excess_us")?,
        excess_p90_us: field("p90_us")?,
        cpu_us: field("cpu_us")?,
        wrong: 0,
    })
}

/// The table of one run: a line per delay.
pub fn table(title: &str, points: &[SkewPoint]) -> String {
    let mut s = format!(
        "\n== {title} ==\n{:>9} {:>7} {:>12} {:>10} {:>12} {:>7}\n",
        "delay_us", "calls", "excess_us", "p90_us", "cpu_us/call", "#wrong"
    );
    for p in points {
        s.push_str(&format!(
            "{:>9} {:>7} {:>12.1} {:>10.1} {:>12.1} {:>7}\n",
            p.delay_us, p.calls, p.excess_median_us, p.excess_p90_us, p.cpu_us, p.wrong
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_follow_skew_py() {
        // min(ITERS, max(20, 1e6 // (d + 1))) with ITERS = 300.
        assert_eq!(calls(0, 300), 300);
        assert_eq!(calls(5000, 300), 199);
        assert_eq!(calls(1_000_000, 300), 20);
        assert_eq!(calls(u64::MAX, 300), 20);
        assert_eq!(calls(10, 5), 5);
    }

    #[test]
    fn anchor_lines_parse_and_others_do_not() {
        let p = parse_anchor_line(
            "skew d_us=1000 excess_us=12.5 p90_us=20.0 cpu_us=1010.3",
            300,
        )
        .unwrap();
        assert_eq!((p.delay_us, p.calls), (1000, 300));
        assert_eq!(
            (p.excess_median_us, p.excess_p90_us, p.cpu_us),
            (12.5, 20.0, 1010.3)
        );
        assert!(parse_anchor_line("skew d_us=10 excess_us=x", 300).is_none());
        assert!(parse_anchor_line("warning: something", 300).is_none());
    }

    #[test]
    fn two_ranks_run_the_same_calls_and_sum_exactly() {
        crate::testing::two_ranks(|group| {
            let points = run(&group, 64, &[0, 300], 25)?;
            assert_eq!(points.len(), 2);
            assert_eq!(
                points
                    .iter()
                    .map(|p| (p.delay_us, p.calls))
                    .collect::<Vec<_>>(),
                [(0, 25), (300, 25)]
            );
            assert!(points.iter().all(|p| p.wrong == 0), "{points:?}");
            // Timings are the benchmark's to report, not a test's to assert: under load the
            // early rank may leave the barrier after the late one has finished spinning.
            assert!(
                points
                    .iter()
                    .all(|p| p.cpu_us >= 0.0 && p.excess_p90_us >= p.excess_median_us)
            );
            Ok(())
        });
    }

    #[test]
    fn a_group_of_one_is_refused() {
        let e = run(&Group::single(), 64, &[0], 5).unwrap_err();
        assert!(e.to_string().contains("two ranks"), "{e}");
    }
}
