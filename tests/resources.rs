//! What a group costs while it works and while it waits: no heap allocation per collective
//! once warmed up, and no CPU while idle.
//!
//! The allocation count uses `ffi`'s counting global allocator, installed in this test
//! binary; it counts only the calling thread's allocations, because a collective runs
//! entirely on the thread that calls it.

use ffi::alloc::CountingAllocator;
use nuvec_distributed::{Complex64, Group, bf16, f16};
use nuvec_tools::testing::Launch;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn allocations() -> u64 {
    CountingAllocator::thread_allocations()
}

/// Runs `f` once to warm up, then `rounds` more times, and returns how many heap
/// allocations the calling thread made in those rounds.
fn steady_allocations(rounds: usize, mut f: impl FnMut()) -> u64 {
    f();
    let before = allocations();
    for _ in 0..rounds {
        f();
    }
    allocations() - before
}

fn every_collective(g: &Group, elems: usize) -> Vec<(String, u64)> {
    let (rank, size) = (g.rank(), g.size());
    let (left, right) = ((rank + size - 1) % size, (rank + 1) % size);
    let mut f32s = vec![1.0f32; elems];
    let mut f16s = vec![f16::ONE; elems];
    let mut bf16s = vec![bf16::ONE; elems];
    let mut ints = vec![3i64; elems];
    let mut bools = vec![true; elems];
    let mut complex = vec![Complex64::new(1.0, 2.0); elems];
    let gather_in = vec![7u32; elems];
    let mut gathered = vec![0u32; elems * size];
    let scatter_in = vec![2.0f32; elems * size];
    let mut scattered = vec![0.0f32; elems];
    let mut received = vec![0u8; elems];
    let message = vec![5u8; elems];
    let rounds = 20;
    let mut counts: Vec<(String, u64)> = vec![
        (
            "all_sum f32".into(),
            steady_allocations(rounds, || g.all_sum(&mut f32s).unwrap()),
        ),
        (
            "all_max f16".into(),
            steady_allocations(rounds, || g.all_max(&mut f16s).unwrap()),
        ),
        (
            "all_min bf16".into(),
            steady_allocations(rounds, || g.all_min(&mut bf16s).unwrap()),
        ),
        (
            "all_sum i64".into(),
            steady_allocations(rounds, || g.all_sum(&mut ints).unwrap()),
        ),
        (
            "all_sum bool".into(),
            steady_allocations(rounds, || g.all_sum(&mut bools).unwrap()),
        ),
        (
            "all_max complex64".into(),
            steady_allocations(rounds, || g.all_max(&mut complex).unwrap()),
        ),
        (
            "all_gather u32".into(),
            steady_allocations(rounds, || g.all_gather(&gather_in, &mut gathered).unwrap()),
        ),
        (
            "sum_scatter f32".into(),
            steady_allocations(rounds, || {
                g.sum_scatter(&scatter_in, &mut scattered).unwrap()
            }),
        ),
        (
            "barrier".into(),
            steady_allocations(rounds, || g.barrier().unwrap()),
        ),
    ];
    let sendrecv = steady_allocations(rounds, || {
        if rank.is_multiple_of(2) {
            g.send(&message, right).unwrap();
            g.recv(&mut received, left).unwrap();
        } else {
            g.recv(&mut received, left).unwrap();
            g.send(&message, right).unwrap();
        }
    });
    counts.push(("send/recv u8".into(), sendrecv));
    counts
        .into_iter()
        .map(|(n, c)| (format!("{n} x{elems}"), c))
        .collect()
}

/// Every collective, small and large (across MLX's split into parallel rings), makes no
/// heap allocation once warmed up.
#[test]
fn collectives_do_not_allocate_once_warm() {
    Launch::new(3, 2).all_ok("collectives_do_not_allocate_once_warm", |g| {
        for elems in [1, 3, 1000, 700_000] {
            for (what, count) in every_collective(&g, elems) {
                assert_eq!(
                    count,
                    0,
                    "rank {}: {what} allocated {count} times in 20 rounds",
                    g.rank()
                );
            }
        }
    });
}

/// CPU time of this process, from /proc (user + system, in clock ticks of 10 ms or less).
#[cfg(target_os = "linux")]
fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = &stat[stat.rfind(')').expect("a command name") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// A formed group runs nothing between collectives: no thread, no polling.
#[cfg(target_os = "linux")]
#[test]
fn an_idle_group_uses_no_cpu() {
    Launch::new(2, 1).all_ok("an_idle_group_uses_no_cpu", |g| {
        let mut x = [1.0f32; 16];
        g.all_sum(&mut x).unwrap();
        let before = cpu_ticks();
        std::thread::sleep(std::time::Duration::from_secs(2));
        let used = cpu_ticks() - before;
        // Two seconds of a spinning thread would be ~200 ticks; allow one tick of noise.
        assert!(
            used <= 1,
            "rank {} used {used} clock ticks of CPU while idle",
            g.rank()
        );
        g.all_sum(&mut x).unwrap();
    });
}
