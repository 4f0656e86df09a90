//! What a group costs while it works and while it waits: no heap allocation per collective
//! once warmed up, and no CPU while idle.
//!
//! The allocation count uses `ffi`'s counting global allocator, installed in this test
//! binary; it counts only the calling thread's allocations, because a collective runs
//! entirely on the thread that calls it.
//!
//! JACCL (feature `jaccl`) is counted on the project's test verbs provider
//! (`ffi/verbs-provider`), ranks in separate processes, through the real binding: the count
//! covers this crate and the binding (Rust code allocating through this binary's allocator).
//! The provider is a `cdylib` with its own copy of the standard library and allocator, so
//! what it allocates inside `post_send` or `poll_cq` is not counted, as a vendor's library
//! would not be.

use ffi::alloc::CountingAllocator;
use nuvec_distributed_engine::{Complex64, Group, bf16, f16};
use nuvec_tools::testing::{Launch, steady_allocations};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// How [`every_collective`] pairs ranks for send and recv.
#[derive(Clone, Copy)]
enum Exchange {
    /// Everyone sends right and receives from the left, even ranks sending first.
    Around,
    /// Ranks 2k and 2k+1 swap messages, the lower sending first; a rank without a partner
    /// skips (JACCL's ring reaches neighbours only, and MLX's JACCL posts no handshake, so
    /// a cycle of sends would wait on itself).
    #[cfg_attr(
        not(feature = "jaccl"),
        allow(dead_code, reason = "only JACCL pairs ranks")
    )]
    Pairs,
}

fn every_collective(g: &Group, elems: usize, exchange: Exchange) -> Vec<(String, u64)> {
    let (rank, size) = (g.rank(), g.size());
    let (left, right) = match exchange {
        Exchange::Around => ((rank + size - 1) % size, (rank + 1) % size),
        Exchange::Pairs => (rank ^ 1, rank ^ 1),
    };
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
    let mut counts: Vec<(String, u64)> = Vec::new();
    let mut count = |what: &str, f: &mut dyn FnMut()| {
        counts.push((what.into(), steady_allocations(20, f)));
    };
    count("all_sum f32", &mut || g.all_sum(&mut f32s).unwrap());
    count("all_max f16", &mut || g.all_max(&mut f16s).unwrap());
    count("all_min bf16", &mut || g.all_min(&mut bf16s).unwrap());
    count("all_sum i64", &mut || g.all_sum(&mut ints).unwrap());
    count("all_sum bool", &mut || g.all_sum(&mut bools).unwrap());
    count("all_max complex64", &mut || {
        g.all_max(&mut complex).unwrap()
    });
    count("all_gather u32", &mut || {
        g.all_gather(&gather_in, &mut gathered).unwrap()
    });
    count("sum_scatter f32", &mut || {
        g.sum_scatter(&scatter_in, &mut scattered).unwrap()
    });
    count("barrier", &mut || g.barrier().unwrap());
    count("send/recv u8", &mut || {
        if right >= size {
            // No partner: nothing to exchange.
        } else if rank.is_multiple_of(2) {
            g.send(&message, right).unwrap();
            g.recv(&mut received, left).unwrap();
        } else {
            g.recv(&mut received, left).unwrap();
            g.send(&message, right).unwrap();
        }
    });
    counts
        .into_iter()
        .map(|(n, c)| (format!("{n} x{elems}"), c))
        .collect()
}

/// Asserts that [`every_collective`] of `elems` allocated nothing; `backend` (empty, or
/// the backend's name and a space) starts each collective's name in a failure.
fn assert_no_allocation(g: &Group, elems: usize, exchange: Exchange, backend: &str) {
    for (what, count) in every_collective(g, elems, exchange) {
        assert_eq!(
            count,
            0,
            "rank {}: {backend}{what} allocated {count} times in 20 rounds",
            g.rank()
        );
    }
}

/// Every collective, small and large (across MLX's split into parallel rings), makes no
/// heap allocation once warmed up.
#[test]
fn collectives_do_not_allocate_once_warm() {
    Launch::new(3, 2).all_ok("collectives_do_not_allocate_once_warm", |g| {
        for elems in [1, 3, 1000, 700_000] {
            assert_no_allocation(&g, elems, Exchange::Around, "");
        }
    });
}

/// The same on the native wire, at four ranks (so some peers are reached over the mesh's own
/// connections), across its switches between algorithms: one-shot, direct, ring.
#[test]
fn native_collectives_do_not_allocate_once_warm() {
    Launch::new(4, 1)
        .env("NUVEC_DISTRIBUTED_WIRE", "native")
        .all_ok("native_collectives_do_not_allocate_once_warm", |g| {
            for elems in [1, 3, 1000, 100_000, 700_000] {
                assert_no_allocation(&g, elems, Exchange::Around, "native ");
            }
        });
}

/// A formed group runs nothing between collectives: no thread, no polling.
#[cfg(target_os = "linux")]
#[test]
fn an_idle_group_uses_no_cpu() {
    idle("an_idle_group_uses_no_cpu", "mlx");
}

/// The same on the native wire.
#[cfg(target_os = "linux")]
#[test]
fn an_idle_native_group_uses_no_cpu() {
    idle("an_idle_native_group_uses_no_cpu", "native");
}

#[cfg(target_os = "linux")]
fn idle(name: &str, wire: &str) {
    let launch = Launch::new(2, 1).env("NUVEC_DISTRIBUTED_WIRE", wire);
    launch.all_ok(name, |g| {
        let mut x = [1.0f32; 16];
        g.all_sum(&mut x).unwrap();
        let before = nuvec_tools::testing::cpu_ticks();
        std::thread::sleep(std::time::Duration::from_secs(2));
        let used = nuvec_tools::testing::cpu_ticks() - before;
        // Two seconds of a spinning thread would be ~200 ticks; allow one tick of noise.
        assert!(
            used <= 1,
            "rank {} used {used} clock ticks of CPU while idle",
            g.rank()
        );
        g.all_sum(&mut x).unwrap();
    });
}

/// JACCL on the test verbs provider: a mesh of three ranks (which takes the scatter-gather
/// all-reduce as well as the fully connected one) and a ring of two ranks on two cables.
#[cfg(feature = "jaccl")]
mod jaccl {
    use std::process::Stdio;

    use super::{Exchange, assert_no_allocation};
    use nuvec_distributed_engine::{Backend, init_backend};
    use nuvec_tools::testing;

    fn no_allocation_on(name: &str, size: usize, wires: usize) {
        if testing::is_rank(name) {
            let g = init_backend(true, Backend::Jaccl).unwrap();
            assert_eq!(g.backend(), "jaccl");
            // 1 element; under 4 KiB; 32 KiB of f32 and more (the mesh's scatter-gather,
            // the ring's both directions on every wire); several 512 KiB messages.
            for elems in [1, 3, 1000, 9000, 300_000] {
                assert_no_allocation(&g, elems, Exchange::Pairs, "JACCL ");
            }
            println!("{}", testing::DONE);
            return;
        }
        let lib = testing::verbs_provider();
        let dir = tempfile::tempdir().unwrap();
        let (matrix, devices) = testing::verbs_layout(size, wires);
        let file = dir.path().join("devices.json");
        std::fs::write(&file, matrix).unwrap();
        let port = testing::free_port_block(1).unwrap();
        let children: Vec<_> = (0..size)
            .map(|rank| {
                let mut cmd = testing::this_test(name);
                cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
                for var in [
                    "NUVEC_VERBS_PROVIDER_FAULT",
                    "NUVEC_JACCL_BUFFERS",
                    "MLX_HOSTFILE",
                ] {
                    cmd.env_remove(var);
                }
                cmd.env(ffi::verbs::LIBRARY_VAR, lib)
                    .env("NUVEC_VERBS_PROVIDER_DIR", dir.path())
                    .env("NUVEC_VERBS_PROVIDER_DEVICES", devices.join(","))
                    .env("NUVEC_DISTRIBUTED_TIMEOUT", "60")
                    .env("MLX_RANK", rank.to_string())
                    .env("MLX_IBV_DEVICES", &file)
                    .env("MLX_JACCL_COORDINATOR", format!("127.0.0.1:{port}"));
                if wires > 0 {
                    cmd.env("MLX_JACCL_RING", "1");
                } else {
                    cmd.env_remove("MLX_JACCL_RING");
                }
                cmd.spawn().unwrap()
            })
            .collect();
        let outputs: Vec<_> = children
            .into_iter()
            .map(|c| std::thread::spawn(move || c.wait_with_output().unwrap()))
            .collect::<Vec<_>>()
            .into_iter()
            .map(|w| w.join().unwrap())
            .collect();
        for (rank, o) in outputs.iter().enumerate() {
            let stdout = String::from_utf8_lossy(&o.stdout);
            assert!(
                o.status.success() && stdout.contains(testing::DONE),
                "rank {rank} ({}):\n{stdout}{}",
                o.status,
                String::from_utf8_lossy(&o.stderr)
            );
        }
    }

    #[test]
    fn jaccl_mesh_collectives_do_not_allocate_once_warm() {
        no_allocation_on(
            "jaccl::jaccl_mesh_collectives_do_not_allocate_once_warm",
            3,
            0,
        );
    }

    #[test]
    fn jaccl_ring_collectives_do_not_allocate_once_warm() {
        no_allocation_on(
            "jaccl::jaccl_ring_collectives_do_not_allocate_once_warm",
            2,
            2,
        );
    }
}
