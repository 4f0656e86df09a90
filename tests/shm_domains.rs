//! Ranks whose hellos put them on one host but that do not share `/dev/shm`, as two
//! containers on one kernel: rank 2 runs in a private mount namespace with its own tmpfs on
//! `/dev/shm` (`unshare --mount`), so it cannot open rank 0's segment. Setup must find that
//! out, tell every rank, and keep TCP for every link (no error, no segment mapped), with a
//! verbose line on every rank that names rank 2 and why; every collective stays correct.
//!
//! Needs root (a mount namespace and a tmpfs mount), so it is ignored by default;
//! `tools/test.sh` runs it when the machine allows it and says so when it does not.
#![cfg(target_os = "linux")]

use nuvec_tools::testing::{self, Launch};

const NAME: &str = "a_rank_without_the_creators_dev_shm_keeps_the_group_on_tcp";

/// Whether this process maps a shared-memory segment of the native wire.
fn maps_a_segment() -> bool {
    std::fs::read_to_string("/proc/self/maps")
        .expect("/proc/self/maps")
        .contains("/nuvec-")
}

#[test]
#[ignore = "needs root (unshare --mount, a tmpfs on /dev/shm); tools/test.sh runs it when the machine allows it"]
fn a_rank_without_the_creators_dev_shm_keeps_the_group_on_tcp() {
    let launch = Launch::new(3, 1)
        .env("NUVEC_DISTRIBUTED_WIRE", "native")
        .env("NUVEC_DISTRIBUTED_VERBOSE", "1")
        .command(|rank| {
            if rank == 2 {
                // Its own /dev/shm, empty: rank 0's segment is not there.
                testing::this_test_in(
                    &[
                        "unshare",
                        "--mount",
                        "--propagation",
                        "private",
                        "sh",
                        "-c",
                        "mount -t tmpfs -o mode=1777 nuvec-test /dev/shm && exec \"$0\" \"$@\"",
                    ],
                    NAME,
                )
            } else {
                testing::this_test(NAME)
            }
        });
    let outputs = launch.all_ok(NAME, |g| {
        assert!(!maps_a_segment(), "rank {}: a segment mapped", g.rank());
        let size = g.size();
        let mut x = vec![g.rank() as f32 + 0.5; 1000];
        g.all_sum(&mut x).unwrap();
        assert!(x.iter().all(|&v| v == 4.5), "{:?}", &x[..4]);
        let mut m = [g.rank() as i32 - 7; 5];
        g.all_max(&mut m).unwrap();
        assert_eq!(m, [-5; 5]);
        let mut out = vec![0u16; size * 300];
        g.all_gather(&[g.rank() as u16; 300], &mut out).unwrap();
        for (r, c) in out.chunks(300).enumerate() {
            assert!(c.iter().all(|&v| v == r as u16), "block {r}");
        }
        let mut part = vec![0i64; 101];
        g.sum_scatter(&vec![3i64; size * 101], &mut part).unwrap();
        assert!(part.iter().all(|&v| v == 3 * size as i64));
        g.barrier().unwrap();
    });
    for o in &outputs {
        let says = o
            .stderr
            .lines()
            .find(|l| l.contains("could not open rank 0's segment"))
            .unwrap_or_else(|| panic!("rank {}: no verbose line:\n{}", o.rank, o.stderr));
        assert!(
            says.contains("rank 2 (No such file") && !says.contains("rank 1 ("),
            "rank {}: {says}",
            o.rank
        );
        assert!(
            o.stderr.contains("links: tcp"),
            "rank {}:\n{}",
            o.rank,
            o.stderr
        );
    }
}
