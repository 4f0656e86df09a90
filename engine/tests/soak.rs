//! A long run that shows a ring does not leak: 100 000 4-byte all_sums and 1 000 16 MiB
//! all_sums on three ranks, with resident memory and open file descriptors sampled along
//! the way. Ignored by default (about half a minute); `tools/soak.sh` runs it. Linux only: the
//! samples come from /proc.
#![cfg(target_os = "linux")]

use nuvec_tools::testing::Launch;

/// (resident KiB, open file descriptors) of this process.
fn resources() -> (u64, usize) {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    let fds = std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count();
    (rss, fds)
}

#[test]
#[ignore = "a soak run of about half a minute; tools/soak.sh runs it"]
fn soak_three_ranks() {
    let outputs = Launch::new(3, 1).all_ok("soak_three_ranks", |g| {
        let mut small = [1.0f32];
        let mut large = vec![1.0f32; 4 << 20];
        // Warm up every path once, so that later samples see steady state.
        g.all_sum(&mut small).unwrap();
        g.all_sum(&mut large).unwrap();
        let mut samples = vec![resources()];
        for round in 0..10 {
            for _ in 0..10_000 {
                small[0] = 1.0;
                g.all_sum(&mut small).unwrap();
                assert_eq!(small[0], 3.0);
            }
            for _ in 0..100 {
                large.fill(1.0);
                g.all_sum(&mut large).unwrap();
            }
            assert!(
                large.iter().all(|&x| x == 3.0),
                "round {round}: a wrong sum"
            );
            samples.push(resources());
        }
        let line: Vec<String> = samples
            .iter()
            .map(|(rss, fds)| format!("{rss}/{fds}"))
            .collect();
        println!("SOAK rank {} rss_kib/fds {}", g.rank(), line.join(" "));
        let (rss0, fds0) = samples[1];
        let (rss1, fds1) = *samples.last().unwrap();
        assert_eq!(
            fds0,
            fds1,
            "rank {}: open file descriptors grew: {line:?}",
            g.rank()
        );
        // The first round settles the allocator; after it, no growth beyond 1 MiB.
        assert!(
            rss1 <= rss0 + 1024,
            "rank {}: resident memory grew: {line:?}",
            g.rank()
        );
    });
    for o in outputs {
        for line in o.lines("SOAK ") {
            println!("SOAK {line}");
        }
    }
}
