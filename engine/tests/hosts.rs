//! Two hosts of two ranks each, as near to two machines as one kernel allows: each host is
//! a network namespace and a private mount namespace with a tmpfs of its own on
//! `/dev/shm`, the hosts are joined by a veth pair, and every rank listens on its host's
//! veth address (ranks 0 and 1 on host A's, ranks 2 and 3 on host B's). On the native
//! wire:
//!
//! - the group runs hierarchically: each rank maps its host's segment, reports shared
//!   memory for its host's other rank and TCP for the other host's, and every collective,
//!   broadcast and send/recv (inside a host and between hosts) gives exact results; no
//!   segment is left on either host afterwards.
//! - cutting the veth link while the ranks sum fails every rank within the timeout, naming
//!   a rank of the other host.
//!
//! Needs root and `ip netns` (iproute2), `unshare` and `nsenter` (util-linux), so it is
//! ignored by default; `tools/test.sh` runs it when the machine allows it and says so when
//! it does not. The namespaces, the veth pair and the addresses (10.202.N.0/24) are this
//! run's own (named after its process id) and are removed afterwards.
#![cfg(target_os = "linux")]

use std::io::{BufRead, BufReader};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nuvec_distributed_engine::{Group, Transport};
use nuvec_tools::testing::{self, Launch, VethPair, ip, maps_a_segment};

/// Ranks 0 and 1 run on host A, ranks 2 and 3 on host B.
const SIZE: usize = 4;

/// The host (0 for A, 1 for B) of `rank`.
fn host_of(rank: usize) -> usize {
    rank / 2
}

/// One host: a process that holds the host's network namespace and a mount namespace
/// with a fresh tmpfs on `/dev/shm`, which the host's ranks join (`nsenter`). It sits in
/// `cat` reading a pipe from this process, so it ends (and with it the tmpfs) when this
/// process closes the pipe or dies.
struct Host {
    holder: Child,
}

impl Host {
    fn new(netns: &str) -> Host {
        let mut holder = Command::new("ip")
            .args(["netns", "exec", netns])
            .args(["unshare", "--mount", "--propagation", "private"])
            .args([
                "sh",
                "-c",
                "mount -t tmpfs -o mode=1777,size=256m nuvec-test /dev/shm \
                 && echo ready && exec cat >/dev/null",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting a host's holder (ip netns exec, unshare)");
        // The namespaces are final once it says so: `ip netns exec` and `unshare` exec
        // their command, so the process id stays the one started here.
        let mut line = String::new();
        let said = BufReader::new(holder.stdout.take().expect("piped"))
            .read_line(&mut line)
            .is_ok_and(|_| line.trim() == "ready");
        let host = Host { holder };
        assert!(said, "the holder of {netns} did not mount its /dev/shm");
        host
    }

    /// The wrapper that runs a command in this host's namespaces.
    fn enter(&self) -> Vec<String> {
        ["nsenter", "--target", &self.holder.id().to_string()]
            .into_iter()
            .map(String::from)
            .chain(["--mount", "--net", "--"].map(String::from))
            .collect()
    }

    /// The host's `/dev/shm`, seen from outside its mount namespace.
    fn shm(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root/dev/shm", self.holder.id()))
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        // Closing its stdin ends the holder (cat sees the end of its input); kill it by its
        // handle should it not.
        drop(self.holder.stdin.take());
        let until = Instant::now() + Duration::from_secs(5);
        while matches!(self.holder.try_wait(), Ok(None)) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

/// The two hosts of one run, their network namespaces and the veth pair between them;
/// removed on drop (deleting a namespace deletes its end of the pair, and with it the
/// other end).
struct Hosts {
    /// Dropped first: its processes hold the namespaces.
    hosts: Vec<Host>,
    net: VethPair,
}

impl Hosts {
    /// The hosts of one test, `tag` telling apart tests of one process (one letter).
    fn new(tag: &str) -> Hosts {
        let id = format!("{}{tag}", std::process::id());
        let subnet = std::process::id() % 200 + 20;
        let net = VethPair::new(
            [format!("nuvh{id}a"), format!("nuvh{id}b")],
            [format!("nvh{id}a"), format!("nvh{id}b")],
            subnet,
        );
        let hosts = Hosts {
            hosts: net.netns.iter().map(|ns| Host::new(ns)).collect(),
            net,
        };
        // Each host's /dev/shm its own file system: else the test runs no hierarchy.
        let dev = |p: &Path| std::fs::metadata(p).expect("a /dev/shm").dev();
        let devs = [
            dev(Path::new("/dev/shm")),
            dev(&hosts.hosts[0].shm()),
            dev(&hosts.hosts[1].shm()),
        ];
        assert!(
            devs[0] != devs[1] && devs[0] != devs[2] && devs[1] != devs[2],
            "the hosts' /dev/shm are not file systems of their own: devices {devs:?}"
        );
        hosts
    }

    /// The hostfile: each rank on its host's address, the two ranks of a host on two ports.
    fn nodes(&self) -> Vec<Vec<String>> {
        (0..SIZE)
            .map(|r| vec![format!("{}:{}", self.net.addrs[host_of(r)], 41000 + r)])
            .collect()
    }

    /// Ranks of test `name` on the native wire, each in its host's namespaces, with
    /// verbose lines and a group timeout of `timeout` seconds.
    fn launch(&self, name: &'static str, timeout: f64) -> Launch {
        let enter: Vec<Vec<String>> = self.hosts.iter().map(Host::enter).collect();
        Launch::new(SIZE, 1)
            .nodes(self.nodes())
            .timeout(timeout)
            .deadline(Duration::from_secs(90))
            .env("NUVEC_DISTRIBUTED_WIRE", "native")
            .env("NUVEC_DISTRIBUTED_VERBOSE", "1")
            .command(move |rank| {
                let wrapper: Vec<&str> = enter[host_of(rank)].iter().map(String::as_str).collect();
                testing::this_test_in(&wrapper, name)
            })
    }

    /// Takes host A's end of the link down.
    fn cut(&self) {
        ip(&[
            "-n",
            &self.net.netns[0],
            "link",
            "set",
            &self.net.veth[0],
            "down",
        ]);
    }
}

/// Exchanges `n` bytes with `peer` (the lower rank sends first), checking what arrives.
fn swap(g: &Group, peer: usize, n: usize) {
    let rank = g.rank();
    let fill = |r: usize| -> Vec<u8> { (0..n).map(|i| (i * 7 + r * 31) as u8).collect() };
    let mut got = vec![0u8; n];
    if rank < peer {
        g.send(&fill(rank), peer).unwrap();
        g.recv(&mut got, peer).unwrap();
    } else {
        g.recv(&mut got, peer).unwrap();
        g.send(&fill(rank), peer).unwrap();
    }
    assert!(got == fill(peer), "rank {rank}: {n} B from rank {peer}");
}

const CORRECT: &str = "two_hosts_in_network_namespaces_run_hierarchically";

#[test]
#[ignore = "needs root, ip netns (iproute2), unshare and nsenter; tools/test.sh runs it when the machine allows it"]
fn two_hosts_in_network_namespaces_run_hierarchically() {
    let hosts = (!testing::is_rank(CORRECT)).then(|| Hosts::new("r"));
    let launch = match &hosts {
        Some(h) => h.launch(CORRECT, 20.0),
        None => Launch::new(SIZE, 1),
    };
    let outputs = launch.all_ok(CORRECT, |g| {
        let rank = g.rank();
        assert_eq!(g.size(), SIZE);
        g.barrier().unwrap();
        assert!(maps_a_segment(), "rank {rank}: no segment mapped");
        for peer in 0..SIZE {
            let want = if peer == rank {
                Transport::Local
            } else if host_of(peer) == host_of(rank) {
                Transport::SharedMemory
            } else {
                Transport::Tcp
            };
            assert_eq!(g.transport(peer).unwrap(), want, "rank {rank} to {peer}");
        }
        // Small (one-shot between the leaders) and past 1 MiB (by shares).
        for n in [1000, 300_000] {
            let mut x = vec![rank as f32 + 0.5; n];
            g.all_sum(&mut x).unwrap();
            assert!(x.iter().all(|&v| v == 8.0), "f32 x{n}: {:?}", &x[..4]);
            let mut y: Vec<i32> = (0..n)
                .map(|i| (i % 1009) as i32 - (rank as i32) * 1_000_000)
                .collect();
            g.all_sum(&mut y).unwrap();
            for (i, &v) in y.iter().enumerate() {
                assert_eq!(v, 4 * (i % 1009) as i32 - 6_000_000, "i32 x{n} at {i}");
            }
        }
        let mut out = vec![0u16; SIZE * 300];
        g.all_gather(&[rank as u16 + 1; 300], &mut out).unwrap();
        for (r, c) in out.chunks(300).enumerate() {
            assert!(c.iter().all(|&v| v == r as u16 + 1), "block {r}");
        }
        let input: Vec<i64> = (0..SIZE * 101).map(|i| (i / 101 + rank) as i64).collect();
        let mut part = vec![0i64; 101];
        g.sum_scatter(&input, &mut part).unwrap();
        let want = (0..SIZE).map(|r| (rank + r) as i64).sum::<i64>();
        assert!(part.iter().all(|&v| v == want), "{:?}", &part[..4]);
        g.barrier().unwrap();
        // A root on each host; small, and past broadcast's direct sends.
        for (root, n) in [(3, 7), (0, 100_000)] {
            let mut b: Vec<u8> = (0..n).map(|i| (i + rank) as u8).collect();
            g.broadcast(&mut b, root).unwrap();
            assert!(
                b.iter().enumerate().all(|(i, &v)| v == (i + root) as u8),
                "rank {rank}: broadcast of {n} B from {root}"
            );
        }
        // Inside a host (0-1, 2-3), then between hosts (0-2, 1-3).
        for n in [4, 1 << 20] {
            swap(&g, rank ^ 1, n);
            swap(&g, rank ^ 2, n);
        }
        g.barrier().unwrap();
    });
    let Some(hosts) = hosts else {
        // This process is a rank: the parent checks.
        return;
    };
    for o in &outputs {
        o.assert_hierarchical("[[0, 1], [2, 3]]");
    }
    for (side, host) in hosts.hosts.iter().enumerate() {
        let left: Vec<_> = std::fs::read_dir(host.shm())
            .expect("the host's /dev/shm")
            .collect();
        assert!(left.is_empty(), "left on host {side}'s /dev/shm: {left:?}");
    }
}

const CUT: &str = "cutting_the_link_between_hosts_fails_every_rank_naming_the_other_host";

#[test]
#[ignore = "needs root, ip netns (iproute2), unshare and nsenter; tools/test.sh runs it when the machine allows it"]
fn cutting_the_link_between_hosts_fails_every_rank_naming_the_other_host() {
    const TIMEOUT_S: f64 = 3.0;
    // A cut link is silence, not a close: the leaders find it at the timeout, plus the
    // inquiry's grace (min(timeout / 4, 500 ms)) before a silent peer counts as lost; the
    // members hear it from their leader, which lingers (250 ms) as it closes. And slack
    // for a machine loaded with builds.
    const MARGIN_MS: u64 = 500 + 250 + 750;
    let hosts = (!testing::is_rank(CUT)).then(|| Hosts::new("c"));
    let launch = match &hosts {
        Some(h) => h.launch(CUT, TIMEOUT_S),
        None => Launch::new(SIZE, 1),
    };
    let Some(running) = launch.start(CUT, |g: Group| {
        g.barrier().unwrap();
        assert!(maps_a_segment(), "rank {}: no segment mapped", g.rank());
        testing::until_failure(|| g.all_sum(&mut [1.0f32; 256]));
    }) else {
        return;
    };
    let hosts = hosts.expect("the parent made the hosts");
    running.wait_all("looping", Duration::from_millis(300));
    hosts.cut();
    let outputs = running.finish();
    for o in &outputs {
        o.assert_finished();
    }
    // Every rank's line in each message: who blamed whom, and when, tells a wrong blame
    // apart from a slow one.
    let failures: Vec<_> = outputs.iter().map(|o| (o.rank, o.failure())).collect();
    for (rank, (ms, peer, message)) in &failures {
        assert!(
            peer.is_some_and(|p| host_of(p) != host_of(*rank)),
            "rank {rank} blamed {peer:?}, not a rank of the other host: {message}\n{failures:?}"
        );
        assert!(
            *ms <= (TIMEOUT_S * 1000.0) as u64 + MARGIN_MS,
            "rank {rank} needed {ms} ms: {message}\n{failures:?}"
        );
    }
}
