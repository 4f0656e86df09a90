//! Overlapping communication with compute: a 16 MiB `all_sum` runs on the group's loop
//! thread while this thread multiplies matrices, against the same two done one after the
//! other.
//!
//! ```text
//! cargo build --release --example overlap
//! cargo run --release --bin nuvec -- launch -n 2 -- target/release/examples/overlap
//! ```
//!
//! This is the pattern of data-parallel training and of pipelined inference: the gradients
//! (or activations) of one step are summed while the next step's matrix products run. The
//! buffer is lent to [`Group::scope`] for the duration of the scope; the compute must not
//! touch it, and the borrow checker makes sure it does not.
//!
//! Each round times the two phases alone, then one after the other, then overlapped, and
//! checks that both orders give the same sums and the same product. Rank 0 prints the
//! medians and the time saved. The saving is at most the shorter of the two phases; on a
//! machine whose cores are all busy it is smaller, since the loop thread needs a core too.

use std::time::{Duration, Instant};

use clap::Parser;
use nuvec_distributed_engine::{Group, Result};

/// A large all_sum behind a matrix product, against the two in sequence.
#[derive(Parser, Debug)]
struct Args {
    /// Size of the all_sum's buffer, in MiB of f32.
    #[arg(long, default_value_t = 16)]
    mib: usize,
    /// Side of the square matrices multiplied meanwhile.
    #[arg(long, default_value_t = 384)]
    n: usize,
    /// Timed rounds (after one warm-up round).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Calls of a one-element all_sum timed blocking and nonblocking (start, then wait at
    /// once): what handing a call to the loop thread and back costs.
    #[arg(long, default_value_t = 200)]
    latency_calls: usize,
}

/// `c = a · b` for `n × n` row-major matrices: the compute the all_sum hides behind.
fn matmul(a: &[f32], b: &[f32], c: &mut [f32], n: usize) {
    c.fill(0.0);
    for (a_row, c_row) in a.chunks_exact(n).zip(c.chunks_exact_mut(n)) {
        for (&a_ik, b_row) in a_row.iter().zip(b.chunks_exact(n)) {
            for (c_ij, &b_kj) in c_row.iter_mut().zip(b_row) {
                *c_ij += a_ik * b_kj;
            }
        }
    }
}

/// The all_sum's input on this rank: small integers, so every sum is exact.
fn fill(buf: &mut [f32], rank: usize) {
    for (i, v) in buf.iter_mut().enumerate() {
        *v = ((i + rank) % 7) as f32;
    }
}

/// Whether `buf` holds the sum over `size` ranks of what [`fill`] writes.
fn summed(buf: &[f32], size: usize) -> bool {
    buf.iter().enumerate().all(|(i, &v)| {
        let expect: usize = (0..size).map(|r| (i + r) % 7).sum();
        v == expect as f32
    })
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn main() -> Result<()> {
    let args = Args::parse();
    let group = nuvec_distributed_engine::init(false)?;
    let (rank, size) = (group.rank(), group.size());
    let n = args.n.max(1);
    let elems = (args.mib.max(1) << 20) / size_of::<f32>();
    let a: Vec<f32> = (0..n * n).map(|i| (i % 13) as f32 * 0.25).collect();
    let b: Vec<f32> = (0..n * n).map(|i| (i % 11) as f32 * 0.5).collect();
    let mut c = vec![0.0f32; n * n];
    let mut reference = vec![0.0f32; n * n];
    matmul(&a, &b, &mut reference, n);
    let mut buf = vec![0.0f32; elems];

    let (mut comm, mut compute, mut sequential, mut overlapped) = (vec![], vec![], vec![], vec![]);
    for round in 0..=args.rounds {
        let timed = round > 0;

        fill(&mut buf, rank);
        group.barrier()?;
        let t = Instant::now();
        group.all_sum(&mut buf)?;
        let comm_t = t.elapsed();

        let t = Instant::now();
        matmul(&a, &b, &mut c, n);
        let compute_t = t.elapsed();

        fill(&mut buf, rank);
        group.barrier()?;
        let t = Instant::now();
        matmul(&a, &b, &mut c, n);
        group.all_sum(&mut buf)?;
        let sequential_t = t.elapsed();
        let sequential_ok = summed(&buf, size) && c == reference;

        fill(&mut buf, rank);
        group.barrier()?;
        let t = Instant::now();
        overlap(&group, &mut buf, &a, &b, &mut c, n)?;
        let overlapped_t = t.elapsed();
        let overlapped_ok = summed(&buf, size) && c == reference;

        if !(sequential_ok && overlapped_ok) {
            eprintln!(
                "rank {rank}: wrong result (sequential ok: {sequential_ok}, overlapped ok: \
                 {overlapped_ok})"
            );
            std::process::exit(1);
        }
        if timed {
            comm.push(comm_t);
            compute.push(compute_t);
            sequential.push(sequential_t);
            overlapped.push(overlapped_t);
        }
    }
    let (blocking_us, nonblocking_us) = latency(&group, args.latency_calls)?;
    if rank == 0 && args.rounds > 0 {
        let (comm, compute) = (median(comm), median(compute));
        let (sequential, overlapped) = (median(sequential), median(overlapped));
        // Negative when overlapping cost more than it hid (every core busy already).
        let saved = ms(sequential) - ms(overlapped);
        let bound = comm.min(compute);
        println!(
            "{size} ranks, all_sum of {} MiB f32, matmul {n}x{n}, median of {} rounds",
            args.mib, args.rounds
        );
        println!("  all_sum alone      {:8.2} ms", ms(comm));
        println!("  matmul alone       {:8.2} ms", ms(compute));
        println!("  one after another  {:8.2} ms", ms(sequential));
        println!("  overlapped         {:8.2} ms", ms(overlapped));
        println!(
            "  saved              {:8.2} ms ({:.0}% of the most overlap can save, {:.2} ms)",
            saved,
            100.0 * saved / ms(bound).max(1e-6),
            ms(bound)
        );
        println!(
            "  one-element all_sum: blocking {blocking_us:.1} us, nonblocking start + wait \
             {nonblocking_us:.1} us (mean of {} calls)",
            args.latency_calls
        );
        println!("results: ok");
    }
    Ok(())
}

/// The all_sum of `buf` on the loop thread while this thread computes `c = a · b`.
fn overlap(
    group: &Group,
    buf: &mut [f32],
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
    n: usize,
) -> Result<()> {
    group.scope(|s| {
        let sum = s.start_all_sum(buf)?;
        matmul(a, b, c, n);
        sum.wait()
    })
}

/// Mean microseconds per call of a one-element all_sum, blocking and nonblocking.
fn latency(group: &Group, calls: usize) -> Result<(f64, f64)> {
    let calls = calls.max(1);
    let mut x = [1.0f32];
    group.barrier()?;
    let t = Instant::now();
    for _ in 0..calls {
        group.all_sum(&mut x)?;
    }
    let blocking = t.elapsed();
    group.barrier()?;
    let t = Instant::now();
    for _ in 0..calls {
        group.scope(|s| s.start_all_sum(&mut x)?.wait())?;
    }
    let nonblocking = t.elapsed();
    let per_call = |d: Duration| d.as_secs_f64() * 1e6 / calls as f64;
    Ok((per_call(blocking), per_call(nonblocking)))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
