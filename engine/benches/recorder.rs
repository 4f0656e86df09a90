//! `cargo bench --bench recorder`: what the flight recorder adds to a call, measured on a
//! backend whose calls do nothing, so that only the group's own work remains.
//!
//! Rows: `backend` calls the no-op communicator ([`Stub`]) directly; `group` makes the same
//! call through a [`Group`] over it, which records it (two uncontended lock round trips and
//! two reads of the CPU's counter; the backend's [`Communicator::algorithm`], which this one
//! answers as the native wire does, is asked only when a copy is taken); `group, records 0`
//! through a group whose recorder is off. The difference
//! between the last two is the recorder's cost per call. Each row is the median of 31
//! batches of 100 000 calls; the machine may be shared: run it twice and trust only
//! differences that repeat.
//!
//! `cargo test --benches` runs this binary without `--bench`; it then does nothing.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use nuvec_distributed_engine::{Communicator, DType, Group, Options, ReduceOp, Stub};
use zerocopy::IntoBytes;

/// Nanoseconds per call of `f`: the median of 31 batches of 100 000.
fn per_call(mut f: impl FnMut()) -> f64 {
    const BATCH: u32 = 100_000;
    let mut times: Vec<f64> = (0..31)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..BATCH {
                f();
            }
            start.elapsed().as_nanos() as f64 / f64::from(BATCH)
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    // Two ranks whose calls return at once.
    let noop = || Stub::new(2, "noop");
    let backend = noop();
    let recorded = Group::new(Arc::new(noop()));
    let off = Group::with_options(Arc::new(noop()), &Options::default().flight_records(0));
    let mut data = [1.0f32];
    let rows = [
        (
            "backend",
            per_call(|| {
                backend
                    .all_reduce(ReduceOp::Sum, DType::F32, black_box(data.as_mut_bytes()))
                    .unwrap()
            }),
        ),
        (
            "group",
            per_call(|| recorded.all_sum(black_box(&mut data)).unwrap()),
        ),
        (
            "group, records 0",
            per_call(|| off.all_sum(black_box(&mut data)).unwrap()),
        ),
    ];
    println!("# all_sum of one f32 on a backend that does nothing");
    println!("# {:<18} {:>10}", "path", "ns/call");
    for (name, ns) in rows {
        println!("  {name:<18} {ns:>10.1}");
    }
}
