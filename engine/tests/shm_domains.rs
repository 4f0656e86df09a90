//! Shared-memory domains between processes in private mount namespaces (`unshare
//! --mount`), as containers on one kernel:
//!
//! - two "hosts": some ranks see another file system on `/dev/shm` (a directory of
//!   another file system bind-mounted there, one for all of them), so their host
//!   identity differs (it covers `/dev/shm`'s device) and the group runs hierarchically:
//!   shared memory inside each host, TCP between them. Every collective is correct (2x2
//!   and 3+1), and a member or a leader killed with SIGKILL is named by every survivor
//!   within the timeout.
//! - a rank that sees the same file system on `/dev/shm` but not the same files (a
//!   subdirectory of it bind-mounted there): the same host identity, yet it cannot open
//!   rank 0's segment. Setup finds that out, tells every rank, and keeps TCP for every
//!   link (no error, no segment mapped), with a verbose line on every rank that names the
//!   rank and why.
//!
//! Needs root (a mount namespace and a bind mount), so it is ignored by default;
//! `tools/test.sh` runs it when the machine allows it and says so when it does not.
#![cfg(target_os = "linux")]

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use nuvec_distributed_engine::Group;
use nuvec_tools::testing::{self, Launch, maps_a_segment, until_failure};

/// The variable that tells a wrapped rank which directory to mount on `/dev/shm`.
const SHM_VAR: &str = "NUVEC_TEST_DEV_SHM";

/// A rank of test `name` in its own mount namespace with `dir` on `/dev/shm`.
fn in_namespace(name: &str, dir: &Path) -> Command {
    let mut c = testing::this_test_in(
        &[
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            "mount --bind \"$NUVEC_TEST_DEV_SHM\" /dev/shm && exec \"$0\" \"$@\"",
        ],
        name,
    );
    c.env(SHM_VAR, dir);
    c
}

/// A fresh directory for a second host's `/dev/shm`, under `parent`; removed on drop. In
/// a rank (which runs the test's body only) a placeholder that touches nothing.
struct Dir(PathBuf, bool);

impl Dir {
    fn new(parent: &Path, name: &str) -> Dir {
        if testing::is_rank(name) {
            return Dir(PathBuf::new(), false);
        }
        let path = parent.join(format!("nuvtest-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&path).expect("a directory for /dev/shm");
        Dir(path, true)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        if self.1 {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Launches `size` native ranks with verbose lines, those in `host_b` in a namespace of
/// their own whose `/dev/shm` is `dir`.
fn launch(size: usize, host_b: &'static [usize], dir: &Path, name: &'static str) -> Launch {
    let dir = dir.to_path_buf();
    Launch::new(size, 1)
        .env("NUVEC_DISTRIBUTED_WIRE", "native")
        .env("NUVEC_DISTRIBUTED_VERBOSE", "1")
        .command(move |rank| {
            if host_b.contains(&rank) {
                in_namespace(name, &dir)
            } else {
                testing::this_test(name)
            }
        })
}

/// A second host's `/dev/shm`: a directory on a file system other than `/dev/shm`'s.
fn other_file_system(name: &str) -> Dir {
    let dir = Dir::new(&std::env::temp_dir(), name);
    if !dir.1 {
        return dir;
    }
    let dev = |p: &Path| std::fs::metadata(p).expect("a directory").dev();
    assert_ne!(
        dev(&dir.0),
        dev(Path::new("/dev/shm")),
        "{} is on /dev/shm's file system: no second host here",
        dir.0.display()
    );
    dir
}

/// Every collective of the group in `body`, on `size` ranks with `host_b` on the second
/// host: results, segments mapped by ranks of two-rank domains, and the verbose line.
fn hosts(name: &'static str, size: usize, host_b: &'static [usize], domains: &str) {
    let dir = other_file_system(name);
    let outputs = launch(size, host_b, &dir.0, name).all_ok(name, |g| {
        let rank = g.rank();
        let alone = if host_b.contains(&rank) {
            host_b.len() == 1
        } else {
            size - host_b.len() == 1
        };
        g.barrier().unwrap();
        assert_eq!(maps_a_segment(), !alone, "rank {rank}: segment mapped");
        // Small (one-shot between leaders), and past a chunk (by shares).
        for n in [1000, 300_000] {
            let mut x = vec![rank as f32 + 0.5; n];
            g.all_sum(&mut x).unwrap();
            let want = (0..size).map(|r| r as f32 + 0.5).sum::<f32>();
            assert!(x.iter().all(|&v| v == want), "x{n}: {:?}", &x[..4]);
        }
        let mut m = [rank as i32 - 7; 5];
        g.all_max(&mut m).unwrap();
        assert_eq!(m, [size as i32 - 8; 5]);
        g.all_min(&mut m).unwrap();
        assert_eq!(m, [size as i32 - 8; 5]);
        let mut out = vec![0u16; size * 300];
        g.all_gather(&[rank as u16; 300], &mut out).unwrap();
        for (r, c) in out.chunks(300).enumerate() {
            assert!(c.iter().all(|&v| v == r as u16), "block {r}");
        }
        let input: Vec<i64> = (0..size * 101).map(|i| (i / 101 + rank) as i64).collect();
        let mut part = vec![0i64; 101];
        g.sum_scatter(&input, &mut part).unwrap();
        let want = (0..size).map(|r| (rank + r) as i64).sum::<i64>();
        assert!(part.iter().all(|&v| v == want), "{:?}", &part[..4]);
        let mut b = [rank as u8; 7];
        g.broadcast(&mut b, size - 1).unwrap();
        assert_eq!(b, [(size - 1) as u8; 7]);
        g.barrier().unwrap();
    });
    if outputs.is_empty() {
        // This process is a rank: the parent checks.
        return;
    }
    for o in &outputs {
        o.assert_hierarchical(domains);
    }
    let left: Vec<_> = std::fs::read_dir(&dir.0).expect("the directory").collect();
    assert!(left.is_empty(), "left behind on the second host: {left:?}");
}

#[test]
#[ignore = "needs root (unshare --mount, a bind mount on /dev/shm); tools/test.sh runs it when the machine allows it"]
fn two_hosts_of_two_ranks_run_hierarchically() {
    hosts(
        "two_hosts_of_two_ranks_run_hierarchically",
        4,
        &[2, 3],
        "[[0, 1], [2, 3]]",
    );
}

#[test]
#[ignore = "needs root (unshare --mount, a bind mount on /dev/shm); tools/test.sh runs it when the machine allows it"]
fn a_host_of_three_ranks_and_one_of_one_run_hierarchically() {
    hosts(
        "a_host_of_three_ranks_and_one_of_one_run_hierarchically",
        4,
        &[3],
        "[[0, 1, 2], [3]]",
    );
}

/// A member of the second host (rank 3 of 2x2) killed while the group sums: every
/// survivor, on either host, names it within the timeout.
#[test]
#[ignore = "needs root (unshare --mount, a bind mount on /dev/shm); tools/test.sh runs it when the machine allows it"]
fn a_killed_member_of_one_host_is_named_on_every_host() {
    killed("a_killed_member_of_one_host_is_named_on_every_host", 3);
}

/// The same with the second host's leader (rank 2) killed.
#[test]
#[ignore = "needs root (unshare --mount, a bind mount on /dev/shm); tools/test.sh runs it when the machine allows it"]
fn a_killed_leader_of_one_host_is_named_on_every_host() {
    killed("a_killed_leader_of_one_host_is_named_on_every_host", 2);
}

/// Kills `victim` of a 2x2 group (ranks 2 and 3 on the second host) while all sum.
fn killed(name: &'static str, victim: usize) {
    const TIMEOUT_S: f64 = 3.0;
    let size = 4;
    let dir = other_file_system(name);
    let launch = launch(size, &[2, 3], &dir.0, name).timeout(TIMEOUT_S);
    let Some(mut running) = launch.start(name, |g: Group| {
        g.barrier().unwrap();
        until_failure(|| g.all_sum(&mut [1.0f32; 8]));
    }) else {
        return;
    };
    running.strike(victim, "KILL", Duration::from_millis(300));
    let outputs = running.finish();
    for o in outputs.iter().filter(|o| o.rank != victim) {
        let (ms, peer, message) = o.finished_failure();
        assert_eq!(peer, Some(victim), "rank {} blamed: {message}", o.rank);
        assert!(
            ms <= (TIMEOUT_S * 1000.0) as u64,
            "rank {} needed {ms} ms: {message}",
            o.rank
        );
    }
}

#[test]
#[ignore = "needs root (unshare --mount, a bind mount on /dev/shm); tools/test.sh runs it when the machine allows it"]
fn a_rank_without_the_creators_segment_keeps_the_group_on_tcp() {
    const NAME: &str = "a_rank_without_the_creators_segment_keeps_the_group_on_tcp";
    // /dev/shm's own file system, another directory of it: the same device, so the same
    // host identity, but not rank 0's segment.
    let dir = Dir::new(Path::new("/dev/shm"), NAME);
    let outputs = launch(3, &[2], &dir.0, NAME).all_ok(NAME, |g| {
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
