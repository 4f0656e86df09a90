//! JACCL's real verbs path, end to end, on the project's test verbs provider
//! (`ffi/verbs-provider`): the unchanged binding loads it through
//! `NUVEC_DISTRIBUTED_VERBS_LIBRARY`, and ranks are separate processes launched with MLX's
//! JACCL environment (`MLX_RANK`, `MLX_IBV_DEVICES`, `MLX_JACCL_COORDINATOR`,
//! `MLX_JACCL_RING`), so the side channel, the queue-pair set-up (INIT, address exchange,
//! RTR, RTS, with the provider checking every transition as the kernel does), posting and
//! polling all run as they would on hardware.
//!
//! The provider runs its Apple profile (its default): every rule reported for Apple's
//! `librdma` over Thunderbolt is enforced (regions with the remote rights, receives only from
//! RTS, a SEND and its RECV covering the same 4 KiB frames, credit-based flow control, queue
//! depth counted in frames, the active port not at 1, ten queue pairs per device, no region
//! deregistered while a queue pair of its domain lives, no ERR before destroying; see the
//! provider's crate docs for each rule's source). Each rule has a test below showing the
//! binding meets it, or fails naming the device and the rule where the project cannot.
//!
//! Each rank checks every collective against a reference it computes itself (the same
//! reference the emulated-fabric tests in `src/jaccl/tests/` are held to), for meshes of 2 to
//! 8 ranks and rings of 1 to 4 cables. Faults (a lost message, an error completion, a rank
//! that exits mid-collective, a port that goes down) must end in errors naming the peer. The
//! binding's own checks (transition order, attributes, UC loss, ordering) run against the
//! provider's rdma-core profile directly.
//!
//! The provider is built by `cargo build -p nuvec-verbs-provider` (the test runs it, with
//! this test binary's profile, once).

#![cfg(feature = "jaccl")]

use std::path::Path;
use std::process::{Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use ffi::verbs::{
    ACCESS_JACCL, Connection, FrameBuffer, LIBRARY_VAR, QueueSizes, RemoteEndpoint, Verbs,
};
use nuvec_distributed_engine::jaccl::SizeClasses;
use nuvec_distributed_engine::{Backend, Error, Group, bf16, f16, init_backend, jaccl};
use nuvec_tools::test_cases;
use nuvec_tools::testing;

const DONE: &str = "PROVIDER-CHILD-DONE";

/// The provider's own variables, removed from children (with
/// [`testing::JACCL_LAUNCH_VARS`]) unless a test sets them.
const PROVIDER_VARS: [&str; 8] = [
    "NUVEC_VERBS_PROVIDER_TRACE",
    "NUVEC_VERBS_PROVIDER_PROFILE",
    "NUVEC_JACCL_MLX_ALL_GATHER",
    "NUVEC_VERBS_PROVIDER_CHANNELS",
    "NUVEC_VERBS_PROVIDER_EARLY",
    "NUVEC_VERBS_PROVIDER_DEVICES",
    "NUVEC_VERBS_PROVIDER_DIR",
    "NUVEC_VERBS_PROVIDER_FAULT",
];

/// A layout's device file and the provider's device list.
struct Fabric {
    size: usize,
    ring: bool,
    matrix: String,
    devices: Vec<String>,
}

impl Fabric {
    /// A full mesh: rank `i` reaches rank `j` through device `m{i}to{j}`.
    fn mesh(size: usize) -> Fabric {
        Fabric::of(size, 0)
    }

    /// A ring of `wires` cables between neighbours: device `r{i}to{j}c{k}`.
    fn ring(size: usize, wires: usize) -> Fabric {
        Fabric::of(size, wires)
    }

    /// [`testing::verbs_layout`] of `size` and `wires`.
    fn of(size: usize, wires: usize) -> Fabric {
        let (matrix, devices) = testing::verbs_layout(size, wires);
        Fabric {
            size,
            ring: wires > 0,
            matrix,
            devices,
        }
    }
}

/// Launches `fabric.size` ranks of test `name` on the provider; `per_rank` adds variables
/// for one rank (faults). The provider's fabric directory (and the device file) is `dir`,
/// or a temporary one. Returns each rank's output.
fn launch(
    dir: Option<&Path>,
    name: &str,
    fabric: &Fabric,
    timeout_s: u32,
    device_settings: &[(&str, &str)],
    per_rank: &[(usize, &str, String)],
) -> Vec<Output> {
    let temporary = tempfile::tempdir().unwrap();
    let dir = dir.unwrap_or(temporary.path());
    let lib = testing::verbs_provider();
    let file = dir.join("devices.json");
    std::fs::write(&file, &fabric.matrix).unwrap();
    let devices: Vec<String> = fabric
        .devices
        .iter()
        .map(|d| {
            let extra: String = device_settings
                .iter()
                .filter(|(name, _)| name == d)
                .map(|(_, s)| format!(":{s}"))
                .collect();
            format!("{d}{extra}")
        })
        .collect();
    // Four: the queue-pair limit test forms four groups, at this port and the next three.
    let port = testing::free_port_block(4).unwrap();
    let children: Vec<_> = (0..fabric.size)
        .map(|rank| {
            let mut cmd = testing::this_test(name);
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
            for var in testing::JACCL_LAUNCH_VARS.iter().chain(&PROVIDER_VARS) {
                cmd.env_remove(var);
            }
            cmd.env(LIBRARY_VAR, lib)
                .env("NUVEC_VERBS_PROVIDER_DIR", dir)
                .env("NUVEC_VERBS_PROVIDER_DEVICES", devices.join(","))
                .env("NUVEC_DISTRIBUTED_TIMEOUT", timeout_s.to_string())
                .env("MLX_RANK", rank.to_string())
                .env("MLX_IBV_DEVICES", &file)
                .env("MLX_JACCL_COORDINATOR", format!("127.0.0.1:{port}"));
            if fabric.ring {
                cmd.env("MLX_JACCL_RING", "1");
            }
            for (r, k, v) in per_rank {
                if *r == rank {
                    cmd.env(k, v);
                }
            }
            cmd.spawn().unwrap()
        })
        .collect();
    // Each rank's pipes are drained by a thread of its own: a rank blocked writing to a full
    // pipe while another is waited for would stall the whole group.
    let waiting: Vec<_> = children
        .into_iter()
        .map(|c| std::thread::spawn(move || c.wait_with_output().unwrap()))
        .collect();
    waiting.into_iter().map(|w| w.join().unwrap()).collect()
}

fn show(outputs: &[Output]) -> String {
    outputs
        .iter()
        .enumerate()
        .map(|(rank, o)| {
            format!(
                "--- rank {rank} ({}):\n{}{}",
                o.status,
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            )
        })
        .collect()
}

fn finished(o: &Output) -> bool {
    o.status.success() && String::from_utf8_lossy(&o.stdout).contains(DONE)
}

fn rank() -> usize {
    std::env::var("MLX_RANK").unwrap().parse().unwrap()
}

// ---------------------------------------------------------------------------------------
// Every collective, checked against a reference

/// A value every rank can compute for any rank: small integers, so float sums are exact.
fn seed(rank: usize, i: usize, case: usize) -> u64 {
    let mut x = (rank as u64) << 40 ^ (i as u64) << 8 ^ case as u64;
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^ (x >> 29)
}

fn f32_of(rank: usize, i: usize, case: usize) -> f32 {
    (seed(rank, i, case) % 17) as f32 - 8.0
}

fn i32_of(rank: usize, i: usize, case: usize) -> i32 {
    seed(rank, i, case) as i32
}

fn u8_of(rank: usize, i: usize, case: usize) -> u8 {
    seed(rank, i, case) as u8
}

/// Every collective on `group`, for element counts crossing JACCL's buffer classes and its
/// algorithm thresholds (f32, i32 and u8 for every op; f64, bf16, f16 and i64 for the
/// reductions too; every dtype is covered on the emulated fabric); panics (naming the case)
/// on the first wrong element.
fn every_collective(group: &Group) {
    let (me, p) = (group.rank(), group.size());
    // 1 element; under 4 KiB; 32 KiB of f32 (MLX's mesh threshold); several 512 KiB frames.
    let counts = [300_000usize, 1, 1000, 8192];
    for (c, &n) in counts.iter().enumerate() {
        // all_sum / all_max / all_min, f32
        let mut v: Vec<f32> = (0..n).map(|i| f32_of(me, i, c)).collect();
        group.all_sum(&mut v).unwrap();
        for (i, x) in v.iter().enumerate() {
            let want: f32 = (0..p).map(|r| f32_of(r, i, c)).sum();
            assert_eq!(*x, want, "all_sum f32 n={n} element {i}");
        }
        let mut v: Vec<i32> = (0..n).map(|i| i32_of(me, i, c)).collect();
        group.all_max(&mut v).unwrap();
        for (i, x) in v.iter().enumerate() {
            let want = (0..p).map(|r| i32_of(r, i, c)).max().unwrap();
            assert_eq!(*x, want, "all_max i32 n={n} element {i}");
        }
        let mut v: Vec<u8> = (0..n).map(|i| u8_of(me, i, c)).collect();
        group.all_min(&mut v).unwrap();
        for (i, x) in v.iter().enumerate() {
            let want = (0..p).map(|r| u8_of(r, i, c)).min().unwrap();
            assert_eq!(*x, want, "all_min u8 n={n} element {i}");
        }
        let mut v: Vec<i32> = (0..n).map(|i| i32_of(me, i, c + 10)).collect();
        group.all_sum(&mut v).unwrap();
        for (i, x) in v.iter().enumerate() {
            let want = (0..p).fold(0i32, |a, r| a.wrapping_add(i32_of(r, i, c + 10)));
            assert_eq!(*x, want, "all_sum i32 n={n} element {i}");
        }
        // Other element types: the wire carries bytes, the reduction is per type.
        let mut v: Vec<f64> = (0..n).map(|i| f64::from(f32_of(me, i, c + 50))).collect();
        group.all_sum(&mut v).unwrap();
        for (i, x) in v.iter().enumerate() {
            let want: f64 = (0..p).map(|r| f64::from(f32_of(r, i, c + 50))).sum();
            assert_eq!(*x, want, "all_sum f64 n={n} element {i}");
        }
        let mut v: Vec<bf16> = (0..n)
            .map(|i| bf16::from_f32(f32_of(me, i, c + 60)))
            .collect();
        group.all_max(&mut v).unwrap();
        for (i, x) in v.iter().enumerate() {
            let want = (0..p)
                .map(|r| f32_of(r, i, c + 60))
                .fold(f32::MIN, f32::max);
            assert_eq!(x.to_f32(), want, "all_max bf16 n={n} element {i}");
        }
        let mut v: Vec<f16> = (0..n)
            .map(|i| f16::from_f32(f32_of(me, i, c + 70)))
            .collect();
        group.all_sum(&mut v).unwrap();
        for (i, x) in v.iter().enumerate() {
            let want: f32 = (0..p).map(|r| f32_of(r, i, c + 70)).sum();
            assert_eq!(x.to_f32(), want, "all_sum f16 n={n} element {i}");
        }
        let mut v: Vec<i64> = (0..n).map(|i| seed(me, i, c + 80) as i64).collect();
        group.all_min(&mut v).unwrap();
        for (i, x) in v.iter().enumerate() {
            let want = (0..p).map(|r| seed(r, i, c + 80) as i64).min().unwrap();
            assert_eq!(*x, want, "all_min i64 n={n} element {i}");
        }
        // all_gather
        let input: Vec<f32> = (0..n).map(|i| f32_of(me, i, c + 20)).collect();
        let mut out = vec![0f32; n * p];
        group.all_gather(&input, &mut out).unwrap();
        for (k, x) in out.iter().enumerate() {
            assert_eq!(
                *x,
                f32_of(k / n, k % n, c + 20),
                "all_gather n={n} element {k}"
            );
        }
        // sum_scatter
        let input: Vec<f32> = (0..n * p).map(|i| f32_of(me, i, c + 30)).collect();
        let mut out = vec![0f32; n];
        group.sum_scatter(&input, &mut out).unwrap();
        for (i, x) in out.iter().enumerate() {
            let want: f32 = (0..p).map(|r| f32_of(r, me * n + i, c + 30)).sum();
            assert_eq!(*x, want, "sum_scatter n={n} element {i}");
        }
        // send / recv between pairs (2k, 2k + 1): neighbours in a ring too
        let partner = me ^ 1;
        if partner < p {
            let mine: Vec<f32> = (0..n).map(|i| f32_of(me, i, c + 40)).collect();
            let mut theirs = vec![0f32; n];
            if me < partner {
                group.send(&mine, partner).unwrap();
                group.recv(&mut theirs, partner).unwrap();
            } else {
                group.recv(&mut theirs, partner).unwrap();
                group.send(&mine, partner).unwrap();
            }
            for (i, x) in theirs.iter().enumerate() {
                assert_eq!(*x, f32_of(partner, i, c + 40), "recv n={n} element {i}");
            }
        }
        group.barrier().unwrap();
    }
}

fn collectives_on(name: &str, fabric: Fabric) {
    if testing::is_rank(name) {
        let group = init_backend(true, Backend::Jaccl).unwrap();
        assert_eq!((group.rank(), group.size()), (rank(), fabric.size));
        assert_eq!(group.backend(), "jaccl");
        every_collective(&group);
        println!("{DONE}");
        return;
    }
    let out = launch(None, name, &fabric, 60, &[], &[]);
    assert!(out.iter().all(finished), "{}", show(&out));
}

test_cases!(collectives_on {
    mesh_2: Fabric::mesh(2);
    mesh_3: Fabric::mesh(3);
    mesh_4: Fabric::mesh(4);
    mesh_5: Fabric::mesh(5);
    mesh_6: Fabric::mesh(6);
    mesh_7: Fabric::mesh(7);
    mesh_8: Fabric::mesh(8);
    ring_2_ranks_1_cable: Fabric::ring(2, 1);
    ring_3_ranks_2_cables: Fabric::ring(3, 2);
    ring_4_ranks_3_cables: Fabric::ring(4, 3);
    ring_8_ranks_4_cables: Fabric::ring(8, 4);
    ring_5_ranks_1_cable: Fabric::ring(5, 1);
    ring_2_ranks_4_cables: Fabric::ring(2, 4);
});

// ---------------------------------------------------------------------------------------
// The set-up, as MLX does it

/// The trace lines of every process that ran with `NUVEC_VERBS_PROVIDER_TRACE` in `dir`,
/// one list per process, in the order each wrote them.
fn traces(dir: &Path) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir.join(".nuvec-verbs")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("trace-") {
            let text = std::fs::read_to_string(&path).unwrap();
            out.push(text.lines().map(String::from).collect());
        }
    }
    out
}

/// The value of `key=` in a trace line.
fn field(line: &str, key: &str) -> String {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")).map(String::from))
        .unwrap_or_else(|| panic!("no {key} in {line}"))
}

/// The queue-pair set-up of a mesh of 3 on the Apple profile, read back from the provider's
/// trace: MLX's set-up (one UC queue pair per peer with one SGE, no inline data and one CQ
/// for both directions; INIT with P_Key 0 and local write + remote read + remote write; RTR
/// with a 1024-byte MTU, PSN 7, the peer's queue pair and a global route with hop limit 1 to
/// the peer's IPv4-mapped GID; RTS with PSN 7; buffers registered with the same three
/// rights), with this crate's departures: the device's first active port (2 on the Apple
/// profile's devices, 3 on the one with four ports and the third cabled) where MLX uses 1;
/// the source GID index the scan found (3 on the one device that keeps its IPv4 GID there,
/// where MLX's fixed 1 would be refused); queues of 256 frames and a CQ of 512 entries with
/// a completion channel, where MLX has 32, 64 and none. Dropping the group destroys each
/// queue pair from RTS (never ERR first), then deregisters every region: the provider
/// refuses a region deregistered while a queue pair of its domain lives (EBUSY) or after one
/// went to ERR (EIO), and every call must succeed.
#[test]
fn the_queue_pair_set_up_is_mlx_s_with_apple_s_rules() {
    const NAME: &str = "the_queue_pair_set_up_is_mlx_s_with_apple_s_rules";
    if testing::is_rank(NAME) {
        // jaccl::init, not init_backend: the group is not kept as the default, so dropping
        // it tears the connections down through the binding.
        let config = jaccl::Config::from_env().unwrap();
        let group = jaccl::init(&config, &nuvec_distributed_engine::Options::default()).unwrap();
        let mut v = vec![1f32; 300_000];
        group.all_sum(&mut v).unwrap();
        assert!(v.iter().all(|&x| x == 3.0));
        drop(group);
        println!("{DONE}");
        return;
    }
    let p = 3;
    let fabric = Fabric::mesh(p);
    let settings: Vec<(String, String)> = (0..p)
        .flat_map(|i| (0..p).filter(move |&j| j != i).map(move |j| (i, j)))
        .map(|(i, j)| {
            let extra = match (i, j) {
                (2, 0) => ":gid=3",
                (1, 2) => ":ports=4:active=3",
                _ => "",
            };
            (format!("m{i}to{j}"), format!("ipv4=10.9.{i}.{j}{extra}"))
        })
        .collect();
    let settings: Vec<(&str, &str)> = settings
        .iter()
        .map(|(d, s)| (d.as_str(), s.as_str()))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let trace: Vec<_> = (0..p)
        .map(|r| (r, "NUVEC_VERBS_PROVIDER_TRACE", "1".to_string()))
        .collect();
    let out = launch(Some(dir.path()), NAME, &fabric, 20, &settings, &trace);
    assert!(out.iter().all(finished), "{}", show(&out));
    let per_process = traces(dir.path());
    assert_eq!(per_process.len(), p);
    let lines: Vec<String> = per_process.iter().flatten().cloned().collect();
    let count = |prefix: &str| lines.iter().filter(|l| l.starts_with(prefix)).count();
    let qps = p * (p - 1);
    let depth = SizeClasses::Large.queue_depth();
    assert_eq!(depth, 256);
    assert_eq!(
        count(&format!("create_cq cqe={} channel=true", 2 * depth)),
        qps,
        "{lines:#?}"
    );
    assert_eq!(count("create_comp_channel"), qps, "{lines:#?}");
    assert_eq!(count("create_qp "), qps, "{lines:#?}");
    // qpn -> device
    let mut device = std::collections::HashMap::new();
    for l in lines.iter().filter(|l| l.starts_with("create_qp ")) {
        let tail = format!(
            "type=3 send_wr={depth} recv_wr={depth} send_sge=1 recv_sge=1 inline=0 sig_all=0 \
             same_cq=true"
        );
        assert!(l.ends_with(&tail), "{l}");
        device.insert(field(l, "qpn"), field(l, "device"));
    }
    let ends = |d: &str| -> (usize, usize) {
        let (i, j) = d.trim_start_matches('m').split_once("to").unwrap();
        (i.parse().unwrap(), j.parse().unwrap())
    };
    for (qpn, dev) in &device {
        let (i, j) = ends(dev);
        let port = if (i, j) == (1, 2) { "3" } else { "2" };
        let mine: Vec<&String> = lines
            .iter()
            .filter(|l| l.starts_with(&format!("modify qpn={qpn} ")))
            .collect();
        assert!(
            mine.len() == 3,
            "INIT, RTR, RTS, and no ERR before the queue pair is destroyed: {mine:#?}"
        );
        assert!(
            mine[0].ends_with(&format!("INIT port={port} pkey=0 access=7")),
            "{}",
            mine[0]
        );
        let rtr = mine[1];
        for (k, v) in [
            ("mtu", "3"),
            ("rq_psn", "7"),
            ("global", "1"),
            ("hop", "1"),
            ("dlid", "0"),
            ("port", port),
        ] {
            assert_eq!(field(rtr, k), v, "{k} in {rtr}");
        }
        let sgid = if (i, j) == (2, 0) { "3" } else { "1" };
        assert_eq!(field(rtr, "sgid"), sgid, "{rtr}");
        let dest = field(rtr, "dest");
        assert_eq!(
            device[&dest],
            format!("m{j}to{i}"),
            "{qpn} on {dev} connects to {rtr}"
        );
        let dgid = format!("00000000000000000000ffff0a09{j:02x}{i:02x}");
        assert_eq!(field(rtr, "dgid"), dgid, "{rtr}");
        assert!(mine[2].ends_with("RTS sq_psn=7"), "{}", mine[2]);
    }
    let regs: Vec<_> = lines.iter().filter(|l| l.starts_with("reg_mr ")).collect();
    assert!(!regs.is_empty());
    assert!(regs.iter().all(|l| l.ends_with("access=7")), "{regs:#?}");
    assert_eq!(count("post_recv"), 0, "no receive refused: {lines:#?}");
    assert_eq!(count("post_send"), 0, "no send refused: {lines:#?}");
    // Teardown, children first: every object destroyed once, none refused (EBUSY would
    // mean a parent went before its children, or a region before its queue pair; EIO a
    // queue pair moved to ERR first); in each process every queue pair goes before the
    // first region.
    for (call, n) in [
        ("destroy_qp", qps),
        ("destroy_cq", qps),
        ("destroy_comp_channel", qps),
        ("dealloc_pd", qps),
        ("dereg_mr", regs.len()),
        ("close_device", qps),
    ] {
        assert_eq!(count(&format!("{call} rc=0")), n, "{call}: {lines:#?}");
        assert_eq!(count(&format!("{call} ")), n, "{call}: {lines:#?}");
    }
    for process in &per_process {
        let last_qp = process.iter().rposition(|l| l.starts_with("destroy_qp"));
        let first_mr = process.iter().position(|l| l.starts_with("dereg_mr"));
        assert!(last_qp < first_mr, "{process:#?}");
    }
}

// ---------------------------------------------------------------------------------------
// Faults, named by peer

/// Runs one all_sum per rank and prints the error's peer, or OK.
fn fault_child(name: &str) -> bool {
    if !testing::is_rank(name) {
        return false;
    }
    let group = match init_backend(true, Backend::Jaccl) {
        Ok(group) => group,
        Err(e) => {
            println!("INIT-ERROR peer={:?} {e}", e.peer());
            println!("{DONE}");
            return true;
        }
    };
    for round in 0..3 {
        let mut v = vec![1f32; 4096];
        if let Err(e) = group.all_sum(&mut v) {
            println!("ERROR round={round} peer={:?} {e}", e.peer());
            println!("{DONE}");
            return true;
        }
    }
    println!("OK");
    println!("{DONE}");
    true
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Launches test `name`'s [`fault_child`] on a mesh of `size` with the provider's fault
/// `fault` (`NUVEC_VERBS_PROVIDER_FAULT`) on rank `rank`, the group's timeout `timeout_s`.
fn faulted(name: &str, size: usize, timeout_s: u32, (rank, fault): (usize, &str)) -> Vec<Output> {
    let fault = vec![(rank, "NUVEC_VERBS_PROVIDER_FAULT", fault.to_string())];
    launch(None, name, &Fabric::mesh(size), timeout_s, &[], &fault)
}

/// Asserts that rank `rank` printed every one of `says`.
fn assert_says(out: &[Output], rank: usize, says: &[&str]) {
    let printed = stdout(&out[rank]);
    for s in says {
        assert!(
            printed.contains(s),
            "rank {rank} did not say {s:?}:\n{}",
            show(out)
        );
    }
}

/// A rank that exits in the middle of a collective (the provider's `exit` fault, at its first
/// send) is named by every survivor, promptly.
#[test]
fn a_rank_gone_mid_collective_is_named_by_the_survivors() {
    const NAME: &str = "a_rank_gone_mid_collective_is_named_by_the_survivors";
    if fault_child(NAME) {
        return;
    }
    let start = std::time::Instant::now();
    let out = faulted(NAME, 3, 5, (2, "exit=1"));
    assert_eq!(out[2].status.code(), Some(86), "{}", show(&out));
    for (rank, o) in out[..2].iter().enumerate() {
        assert!(finished(o), "{}", show(&out));
        assert_says(&out, rank, &["ERROR round=0 peer=Some(2)"]);
    }
    assert!(start.elapsed() < Duration::from_secs(30), "{}", show(&out));
}

/// Runs test `name`'s [`fault_child`] on a mesh of 2 with `fault` ([`faulted`]); every
/// rank must finish, and each rank of `says` print each of its lines.
fn fault_says(name: &str, timeout_s: u32, fault: (usize, &str), says: &[(usize, &[&str])]) {
    if fault_child(name) {
        return;
    }
    let out = faulted(name, 2, timeout_s, fault);
    assert!(out.iter().all(finished), "{}", show(&out));
    for &(rank, lines) in says {
        assert_says(&out, rank, lines);
    }
}

test_cases!(fault_says {
    /// A send that completes with an error status fails the sender's collective naming the
    /// peer it was sending to and the status.
    an_error_completion_names_the_peer_and_the_status: 5, (1, "error=1"),
        &[(1, &["ERROR round=0 peer=Some(0)", "general error"]), (0, &["peer=Some(1)"])];
    /// A message lost on the wire (the provider's `drop` fault) leaves its receiver a
    /// message short: it fails naming the sender. (Messages carry no headers, so the
    /// sender's next message may first take the lost one's place, as the README says; the
    /// receiver then fails at the collective the sender no longer answers: a timeout, or the
    /// sender's close.)
    a_lost_message_fails_the_receiver_naming_the_sender: 3, (1, "drop=1"),
        &[(0, &["ERROR round=", "peer=Some(1)"])];
    /// A port that goes down mid-run fails the sends on it, naming the peer behind it.
    a_port_gone_down_fails_naming_the_peer: 3, (0, "down=2"),
        &[(0, &["ERROR round=1 peer=Some(1)", "retry"])];
});

/// A device without an IPv4-mapped GID, or without an active port, cannot be used, and the
/// error names the device and the peer; `jaccl::devices` reports ports, states and
/// addresses as the provider set them.
#[test]
fn device_listing_and_a_missing_ipv4_gid_are_reported() {
    const NAME: &str = "device_listing_and_a_missing_ipv4_gid_are_reported";
    if testing::is_rank(NAME) {
        let devices = jaccl::devices().unwrap();
        let names: Vec<_> = devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["m0to1", "m1to0"]);
        assert_eq!((devices[0].ports, devices[0].port), (2, 2));
        assert_eq!(devices[0].state, jaccl::PortState::Active);
        assert_eq!(devices[0].ipv4, None);
        assert_eq!((devices[1].ports, devices[1].port), (1, 1));
        assert_eq!(devices[1].state, jaccl::PortState::Down);
        assert_eq!(devices[1].ipv4, Some("169.254.7.9".parse().unwrap()));
        assert!(nuvec_distributed_engine::is_available(Backend::Jaccl));
        let e = init_backend(true, Backend::Jaccl).unwrap_err();
        assert!(matches!(e, Error::Rdma { .. }), "{e}");
        let (device, what) = if rank() == 0 {
            ("m0to1 (port 2)", "IPv4")
        } else {
            ("m1to0", "no active port (port 1 down)")
        };
        assert_eq!(e.peer(), Some(1 - rank()), "{e}");
        assert!(
            e.to_string().contains(device) && e.to_string().contains(what),
            "{e}"
        );
        println!("{DONE}");
        return;
    }
    let out = launch(
        None,
        NAME,
        &Fabric::mesh(2),
        3,
        &[
            ("m0to1", "ipv4=none"),
            ("m1to0", "ports=1:state=down:ipv4=169.254.7.9:gid=3"),
        ],
        &[],
    );
    assert!(out.iter().all(finished), "{}", show(&out));
}

// ---------------------------------------------------------------------------------------
// The binding against the provider, one process

/// Whose rules the provider follows in a one-process test.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Profile {
    /// Apple's reported rules (the provider's default).
    Apple,
    /// rdma-core's, with messages that find no receive lost (the UC of the specification).
    RdmaCore,
}

/// Runs `body` in a child process of this test with the provider loaded, following
/// `profile`, on the devices `devices` (the provider's syntax); returns the trace the child
/// left, or `None` in the child.
fn in_provider_process(
    name: &str,
    profile: Profile,
    devices: &str,
    body: impl FnOnce(&Verbs),
) -> Option<Vec<String>> {
    if testing::is_rank(name) {
        let verbs = Verbs::load().unwrap();
        assert_eq!(verbs.library(), provider_path_from_env());
        body(&verbs);
        println!("{DONE}");
        return None;
    }
    let lib = testing::verbs_provider();
    let dir = tempfile::tempdir().unwrap();
    let mut child = testing::this_test(name);
    for var in testing::JACCL_LAUNCH_VARS.iter().chain(&PROVIDER_VARS) {
        child.env_remove(var);
    }
    child
        .env(LIBRARY_VAR, lib)
        .env("NUVEC_VERBS_PROVIDER_DIR", dir.path())
        .env("NUVEC_VERBS_PROVIDER_DEVICES", devices)
        .env("NUVEC_VERBS_PROVIDER_TRACE", "1");
    if profile == Profile::RdmaCore {
        child
            .env("NUVEC_VERBS_PROVIDER_PROFILE", "rdma-core")
            .env("NUVEC_VERBS_PROVIDER_EARLY", "drop");
    }
    let out = child.output().unwrap();
    assert!(finished(&out), "{}", show(&[out]));
    Some(traces(dir.path()).concat())
}

fn provider_path_from_env() -> String {
    std::env::var(LIBRARY_VAR).unwrap()
}

const SIZES: QueueSizes = QueueSizes {
    cq_entries: 64,
    max_send_wr: 32,
    max_recv_wr: 32,
};

/// A connection on device `name` with queues of `sizes`, at INIT on the device's first
/// active port, with its address (the GID at `gid_index` of that port) and the port.
fn endpoint_sized(
    verbs: &Verbs,
    name: &str,
    gid_index: i32,
    sizes: QueueSizes,
) -> (Connection, RemoteEndpoint, u8) {
    let ctx = verbs.open(name).unwrap();
    let port = ctx.active_port().unwrap().port.expect("an active port").0;
    let mut conn = ctx.connection(sizes).unwrap();
    conn.to_init(port, ACCESS_JACCL).unwrap();
    let gid = ctx.query_gid(port, gid_index).unwrap();
    let remote = RemoteEndpoint {
        lid: 0,
        qp_num: conn.qp_num(),
        psn: 7,
        gid,
    };
    (conn, remote, port)
}

/// [`endpoint_sized`] with MLX's queue sizes, without the port.
fn endpoint(verbs: &Verbs, name: &str, gid_index: i32) -> (Connection, RemoteEndpoint) {
    let (conn, remote, _) = endpoint_sized(verbs, name, gid_index, SIZES);
    (conn, remote)
}

/// Two connections on devices `a` and `b` (Apple profile: port 2, IPv4 GID at 1), each in
/// RTS towards the other, with queues of `sizes`.
fn connected_pair(
    verbs: &Verbs,
    (a, b): (&str, &str),
    sizes: QueueSizes,
) -> (Connection, Connection) {
    let (mut a, a_addr, pa) = endpoint_sized(verbs, a, 1, sizes);
    let (mut b, b_addr, pb) = endpoint_sized(verbs, b, 1, sizes);
    a.to_rtr(&b_addr, pa, 1).unwrap();
    a.to_rts(7).unwrap();
    b.to_rtr(&a_addr, pb, 1).unwrap();
    b.to_rts(7).unwrap();
    (a, b)
}

/// A buffer of `len` bytes of `fill`, registered with `conn`.
fn buffer(conn: &Connection, len: usize, fill: u8) -> Arc<FrameBuffer> {
    let mut b = FrameBuffer::new(len).unwrap();
    b.bytes_mut().fill(fill);
    b.register(conn).unwrap();
    Arc::new(b)
}

/// Polls `conn` until `n` completions arrived (or 5 s passed).
fn completions(conn: &mut Connection, n: usize) -> Vec<ffi::verbs::Completion> {
    let mut out = Vec::new();
    let start = std::time::Instant::now();
    while out.len() < n && start.elapsed() < Duration::from_secs(5) {
        conn.poll(&mut out).unwrap();
    }
    out
}

/// The transitions in the wrong order, or with bad attributes, are refused with `EINVAL`;
/// in the right order they succeed, with the GID index the scan finds (rdma-core profile:
/// one port).
#[test]
fn the_provider_checks_queue_pair_transitions_as_the_kernel_does() {
    const NAME: &str = "the_provider_checks_queue_pair_transitions_as_the_kernel_does";
    in_provider_process(NAME, Profile::RdmaCore, "a,b,c:gid=2", |verbs| {
        assert_eq!(verbs.device_names().unwrap(), ["a", "b", "c"]);
        let ctx = verbs.open("c").unwrap();
        let port = ctx.query_port(1).unwrap();
        assert_eq!(port.active_mtu, 3);
        assert_eq!(port.gid_table_len, 3);
        assert!(ctx.query_gid(1, 3).is_err());
        let einval = |r: std::io::Result<()>| {
            let e = r.unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{e}");
        };
        let (_, far) = endpoint(verbs, "a", 1);
        let mut conn = ctx.connection(SIZES).unwrap();
        einval(conn.to_rtr(&far, 1, 2)); // RESET -> RTR
        einval(conn.to_rts(7)); // RESET -> RTS
        einval(conn.to_init(2, ACCESS_JACCL)); // no port 2
        conn.to_init(1, ACCESS_JACCL).unwrap();
        einval(conn.to_rts(7)); // INIT -> RTS
        einval(conn.to_rtr(&far, 1, 1)); // GID index 1 of "c" is empty (its IPv4 GID is at 2)
        einval(conn.to_rtr(&far, 2, 2)); // port 2
        let no_grh = RemoteEndpoint {
            gid: [0; 16],
            ..far
        };
        einval(conn.to_rtr(&no_grh, 1, 2)); // Ethernet ports need a global route
        conn.to_rtr(&far, 1, 2).unwrap();
        einval(conn.to_init(1, ACCESS_JACCL)); // RTR -> INIT
        conn.to_rts(7).unwrap();
    });
}

/// Messages arrive whole and in order; one that finds no receive posted is lost (UC); one
/// longer than the receive completes it with a length error; registered memory is checked
/// (rdma-core profile: the specification's UC).
#[test]
fn the_provider_delivers_in_order_and_drops_without_a_receive() {
    const NAME: &str = "the_provider_delivers_in_order_and_drops_without_a_receive";
    in_provider_process(NAME, Profile::RdmaCore, "a,b,c:gid=2", |verbs| {
        let (mut a, a_addr) = endpoint(verbs, "a", 1);
        let (mut b, b_addr) = endpoint(verbs, "b", 1);
        a.to_rtr(&b_addr, 1, 1).unwrap();
        a.to_rts(7).unwrap();
        // b not yet connected: a can send (UC) but nothing is accepted by b.
        b.to_rtr(&a_addr, 1, 1).unwrap();
        b.to_rts(7).unwrap();
        // No receive posted: the message is lost once b looks at its queue.
        a.post_send(buffer(&a, 4096, 1), 1).unwrap();
        let sent = completions(&mut a, 1);
        assert!(sent[0].is_ok());
        assert!(completions(&mut b, 1).is_empty());
        // In order, whole, across fragments (100 KiB > the provider's 32 KiB fragments).
        for i in 0..4u8 {
            b.post_recv(buffer(&b, 100 * 1024, 0), u64::from(i))
                .unwrap();
        }
        for i in 0..4u8 {
            a.post_send(buffer(&a, 100 * 1024, 10 + i), 100 + u64::from(i))
                .unwrap();
        }
        let mut got = completions(&mut b, 4);
        assert_eq!(got.len(), 4);
        for (i, c) in got.iter_mut().enumerate() {
            assert!(c.is_ok() && c.is_recv && c.byte_len == 100 * 1024);
            assert_eq!(c.wr_id, i as u64);
            let bytes = Arc::get_mut(&mut c.buffer).unwrap().bytes_mut();
            assert!(bytes.iter().all(|&x| x == 10 + i as u8), "message {i}");
        }
        assert_eq!(completions(&mut a, 4).len(), 4);
        // Too long for the receive: a length error on the receiver.
        b.post_recv(buffer(&b, 4096, 0), 9).unwrap();
        a.post_send(buffer(&a, 8192, 3), 10).unwrap();
        let c = completions(&mut b, 1);
        assert_eq!((c[0].wr_id, c[0].status), (9, 1));
        // The same buffers, reused: every round's bytes arrive.
        let mut send = buffer(&a, 4096, 0);
        let mut recv = buffer(&b, 4096, 0);
        for round in 1..6u8 {
            Arc::get_mut(&mut send).unwrap().bytes_mut().fill(round);
            b.post_recv(recv, 20).unwrap();
            a.post_send(send, 21).unwrap();
            let mut c = completions(&mut b, 1).pop().unwrap();
            assert!(c.is_ok());
            assert!(
                Arc::get_mut(&mut c.buffer)
                    .unwrap()
                    .bytes_mut()
                    .iter()
                    .all(|&x| x == round),
                "round {round}"
            );
            recv = c.buffer;
            send = completions(&mut a, 1).pop().unwrap().buffer;
        }
        // A buffer registered elsewhere is refused before it reaches the provider.
        assert!(a.post_send(buffer(&b, 64, 0), 11).is_err());
    });
}

// ---------------------------------------------------------------------------------------
// Apple's rules (the provider's Apple profile), one test each: the binding meets them

/// Polls `conn` for `ms` milliseconds, returning what completed (for "nothing yet").
fn completions_for(conn: &mut Connection, ms: u64) -> Vec<ffi::verbs::Completion> {
    let mut out = Vec::new();
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_millis(ms) {
        conn.poll(&mut out).unwrap();
    }
    out
}

/// The queue sizes the JACCL fabric creates with large messages (256 frames per queue).
fn jaccl_sizes() -> QueueSizes {
    let depth = SizeClasses::Large.queue_depth();
    QueueSizes {
        cq_entries: 2 * depth,
        max_send_wr: depth,
        max_recv_wr: depth,
    }
}

/// Regions carry MLX's rights: the Apple profile refuses a region without remote read and
/// write, and every region the binding registers has all three (access=7 in the trace).
#[test]
fn apple_regions_are_registered_with_mlx_s_rights() {
    const NAME: &str = "apple_regions_are_registered_with_mlx_s_rights";
    let Some(trace) = in_provider_process(NAME, Profile::Apple, "a", |verbs| {
        let ctx = verbs.open("a").unwrap();
        let conn = ctx.connection(SIZES).unwrap();
        let mut b = FrameBuffer::new(4096).unwrap();
        b.register(&conn).unwrap();
        assert!(b.is_registered_with(&conn));
    }) else {
        return;
    };
    let regs: Vec<_> = trace.iter().filter(|l| l.starts_with("reg_mr ")).collect();
    assert_eq!(regs, ["reg_mr len=4096 access=7"], "{trace:#?}");
}

/// Receives are posted only from RTS: the Apple profile refuses them at INIT and RTR, and
/// the JACCL collectives (which post none before the group is formed) all run on it.
#[test]
fn apple_receives_are_refused_before_rts() {
    const NAME: &str = "apple_receives_are_refused_before_rts";
    let Some(trace) = in_provider_process(NAME, Profile::Apple, "a,b", |verbs| {
        let (mut a, _, pa) = endpoint_sized(verbs, "a", 1, SIZES);
        let (_, b_addr, _) = endpoint_sized(verbs, "b", 1, SIZES);
        let refused = |conn: &mut Connection, state: &str| {
            let e = conn
                .post_recv(buffer(conn, 4096, 0), 1)
                .expect_err("a receive before RTS");
            assert_eq!(
                e.error.kind(),
                std::io::ErrorKind::InvalidInput,
                "{state}: {e:?}"
            );
        };
        refused(&mut a, "INIT");
        a.to_rtr(&b_addr, pa, 1).unwrap();
        refused(&mut a, "RTR");
        a.to_rts(7).unwrap();
        a.post_recv(buffer(&a, 4096, 0), 2).unwrap();
    }) else {
        return;
    };
    let refusals = trace.iter().filter(|l| l.contains("is not RTS")).count();
    assert_eq!(refusals, 2, "{trace:#?}");
}

/// A SEND and its RECV must cover the same number of 4 KiB frames: a 4 KiB message landing
/// in an 8 KiB receive fails both (the receive with a length error, the send with a remote
/// invalid-request error); equal frame counts succeed. And the send completes only once the
/// message has landed (credit-based flow control): not while no receive is posted.
#[test]
fn apple_a_send_and_its_receive_cover_the_same_frames() {
    const NAME: &str = "apple_a_send_and_its_receive_cover_the_same_frames";
    in_provider_process(NAME, Profile::Apple, "a,b", |verbs| {
        let (mut a, mut b) = connected_pair(verbs, ("a", "b"), SIZES);
        a.post_send(buffer(&a, 4096, 1), 1).unwrap();
        assert!(completions_for(&mut a, 50).is_empty(), "no receive yet");
        assert!(completions_for(&mut b, 50).is_empty());
        assert!(completions_for(&mut a, 50).is_empty(), "still no receive");
        b.post_recv(buffer(&b, 8192, 0), 2).unwrap();
        let r = completions(&mut b, 1);
        assert_eq!((r[0].wr_id, r[0].status), (2, 1), "local length error");
        let s = completions(&mut a, 1);
        assert_eq!((s[0].wr_id, s[0].status), (1, 9), "remote invalid request");
        // Equal frames: 8 KiB into 8 KiB, and 6 KiB (2 frames) into 8 KiB.
        for (len, fill) in [(8192, 3u8), (6144, 4)] {
            b.post_recv(buffer(&b, 8192, 0), 10).unwrap();
            a.post_send(buffer(&a, len, fill), 11).unwrap();
            let mut r = completions(&mut b, 1);
            assert!(r[0].is_ok(), "{len}: {:?}", r[0]);
            assert_eq!(r[0].byte_len as usize, len);
            let bytes = Arc::get_mut(&mut r[0].buffer).unwrap().bytes_mut();
            assert!(bytes[..len].iter().all(|&x| x == fill));
            assert!(completions(&mut a, 1)[0].is_ok());
        }
    });
}

/// Queue depth counts 4 KiB frames: with MLX's 32 per queue, one 128 KiB receive fits and a
/// second does not, and a 512 KiB one (128 frames) fits not even alone, which is why MLX's
/// pipeline of two 512 KiB messages cannot run on it; with the depth this crate asks for
/// (256), two 512 KiB messages fit each way, and a third is refused until one completes.
#[test]
fn apple_queue_depth_counts_frames() {
    const NAME: &str = "apple_queue_depth_counts_frames";
    let Some(trace) = in_provider_process(NAME, Profile::Apple, "a,b,c,d", |verbs| {
        const KIB: usize = 1024;
        let full = |what: &str, r: Result<(), ffi::verbs::PostError>| {
            let e = r.expect_err(what);
            assert_eq!(e.error.raw_os_error(), Some(libc_enomem()), "{what}: {e:?}");
        };
        // MLX's sizes, 32 frames a queue.
        let (mut a, mut b) = connected_pair(verbs, ("a", "b"), SIZES);
        a.post_recv(buffer(&a, 128 * KIB, 0), 1).unwrap();
        full(
            "a second 128 KiB receive",
            a.post_recv(buffer(&a, 128 * KIB, 0), 2),
        );
        full(
            "a 512 KiB receive",
            b.post_recv(buffer(&b, 512 * KIB, 0), 3),
        );
        full("a 512 KiB send", b.post_send(buffer(&b, 512 * KIB, 0), 4));
        drop((a, b));
        // This crate's sizes, 256 frames a queue: MLX's pipeline of two 512 KiB messages.
        let sizes = jaccl_sizes();
        let (mut c, mut d) = connected_pair(verbs, ("c", "d"), sizes);
        // Two sends with no receive at d stay outstanding (credit-based flow control): a third
        // would exceed the 256 frames.
        for i in 0..2u8 {
            c.post_send(buffer(&c, 512 * KIB, 10 + i), u64::from(i))
                .unwrap();
        }
        full(
            "a third 512 KiB send",
            c.post_send(buffer(&c, 512 * KIB, 0), 9),
        );
        for i in 0..2u8 {
            d.post_recv(buffer(&d, 512 * KIB, 0), u64::from(i)).unwrap();
        }
        let mut got = completions(&mut d, 2);
        for (i, r) in got.iter_mut().enumerate() {
            assert!(r.is_ok(), "{r:?}");
            let bytes = Arc::get_mut(&mut r.buffer).unwrap().bytes_mut();
            assert!(bytes.iter().all(|&x| x == 10 + i as u8), "message {i}");
        }
        let sent = completions(&mut c, 2);
        assert!(sent.iter().all(ffi::verbs::Completion::is_ok), "{sent:?}");
        // Completed requests gave their frames back: two receives fit again, not a third.
        for i in 0..2u8 {
            d.post_recv(buffer(&d, 512 * KIB, 0), 20 + u64::from(i))
                .unwrap();
        }
        full(
            "a third 512 KiB receive",
            d.post_recv(buffer(&d, 512 * KIB, 0), 29),
        );
        c.post_send(buffer(&c, 512 * KIB, 0), 30).unwrap();
        assert!(completions(&mut d, 1)[0].is_ok());
    }) else {
        return;
    };
    let refused = trace.iter().filter(|l| l.contains("(ENOMEM)")).count();
    assert_eq!(refused, 5, "{trace:#?}");
}

/// `ENOMEM` (the same value on Linux and macOS).
fn libc_enomem() -> i32 {
    12
}

/// The active port is not always 1: the binding finds each device's first active one, and
/// `jaccl::devices()` reports it (with the port count), where MLX would use port 1.
#[test]
fn apple_the_first_active_port_is_found() {
    const NAME: &str = "apple_the_first_active_port_is_found";
    in_provider_process(
        NAME,
        Profile::Apple,
        "a, b:ports=4:active=3, c:ports=1, d:ports=3:state=down",
        |verbs| {
            let port = |name: &str| {
                let found = verbs.open(name).unwrap().active_port().unwrap();
                (found.port.map(|(p, _)| p), found.states.len())
            };
            assert_eq!(port("a"), (Some(2), 2));
            assert_eq!(port("b"), (Some(3), 3));
            assert_eq!(port("c"), (Some(1), 1));
            assert_eq!(port("d"), (None, 3));
            // Port 1 of "a" is down and publishes no IPv4-mapped GID: MLX's fixed port 1
            // finds none there.
            let a = verbs.open("a").unwrap();
            let p1 = a.query_port(1).unwrap();
            assert_eq!(
                (p1.state, p1.gid_table_len),
                (ffi::verbs::PortState::Down, 1)
            );
            assert_eq!(a.query_device().unwrap().ports, 2);
            let devices = jaccl::devices().unwrap();
            let seen: Vec<_> = devices
                .iter()
                .map(|d| (d.name.as_str(), d.ports, d.port, d.state))
                .collect();
            use jaccl::PortState::{Active, Down};
            assert_eq!(
                seen,
                [
                    ("a", 2, 2, Active),
                    ("b", 4, 3, Active),
                    ("c", 1, 1, Active),
                    ("d", 3, 1, Down)
                ]
            );
            assert!(devices[..3].iter().all(|d| d.ipv4.is_some()));
            assert_eq!(devices[3].ipv4, None);
        },
    );
}

/// Ten queue pairs per device, however they are spread over contexts: the 11th is refused
/// with `EBUSY`; another device is unaffected; destroying one makes room.
#[test]
fn apple_the_eleventh_queue_pair_on_a_device_is_refused() {
    const NAME: &str = "apple_the_eleventh_queue_pair_on_a_device_is_refused";
    let Some(trace) = in_provider_process(NAME, Profile::Apple, "a,b", |verbs| {
        let contexts: Vec<_> = (0..5).map(|_| verbs.open("a").unwrap()).collect();
        let mut held: Vec<Connection> = contexts
            .iter()
            .flat_map(|ctx| {
                [
                    ctx.connection(SIZES).unwrap(),
                    ctx.connection(SIZES).unwrap(),
                ]
            })
            .collect();
        assert_eq!(contexts[0].queue_pairs(), 10);
        let e = contexts[3].connection(SIZES).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ResourceBusy, "{e:?}");
        let other = verbs.open("b").unwrap();
        let _b = other.connection(SIZES).unwrap();
        assert_eq!(other.queue_pairs(), 1);
        held.pop();
        assert_eq!(contexts[0].queue_pairs(), 9);
        held.push(contexts[0].connection(SIZES).unwrap());
    }) else {
        return;
    };
    let refused: Vec<_> = trace.iter().filter(|l| l.contains("refused")).collect();
    assert_eq!(
        refused,
        ["create_qp device=a refused: 10 queue pairs of 10 (EBUSY)"],
        "{trace:#?}"
    );
}

/// Teardown as Apple's driver wants it: a queue pair is destroyed before any region of its
/// protection domain is deregistered, and never moved to ERR first. A send buffer
/// registered with two connections and still in flight on one (its receiver posted no
/// receive) is released when that connection is dropped: its region there goes at once, and
/// the one with the other connection's domain waits until that queue pair is destroyed. The
/// provider refuses a region deregistered too early (EBUSY) or after an ERR (EIO): every
/// call succeeds, in that order.
#[test]
fn apple_teardown_destroys_queue_pairs_before_their_regions() {
    const NAME: &str = "apple_teardown_destroys_queue_pairs_before_their_regions";
    let Some(trace) = in_provider_process(NAME, Profile::Apple, "a,b,c", |verbs| {
        let (mut x, z) = connected_pair(verbs, ("a", "c"), SIZES);
        let (y, _, _) = endpoint_sized(verbs, "b", 1, SIZES);
        let mut shared = FrameBuffer::new(4096).unwrap();
        shared.register(&x).unwrap();
        shared.register(&y).unwrap();
        x.post_send(Arc::new(shared), 1).unwrap();
        assert!(
            completions_for(&mut x, 20).is_empty(),
            "in flight: z posted nothing"
        );
        assert_eq!(x.in_flight(), 1);
        drop(x);
        drop(y);
        drop(z);
    }) else {
        return;
    };
    let teardown: Vec<&str> = trace
        .iter()
        .filter(|l| l.starts_with("destroy_qp") || l.starts_with("dereg_mr"))
        .map(String::as_str)
        .collect();
    assert_eq!(
        teardown,
        [
            "destroy_qp rc=0", // x
            "dereg_mr rc=0",   // the buffer's region with x's domain
            "destroy_qp rc=0", // y
            "dereg_mr rc=0",   // ... with y's domain, kept until now
            "destroy_qp rc=0", // z
        ],
        "{trace:#?}"
    );
    assert!(!trace.iter().any(|l| l.ends_with("state=6")), "{trace:#?}");
}

/// A process that needs an 11th queue pair on a device gets an error naming the device and
/// the rule: four ranks, each reaching its three peers through one device, form groups
/// until the fourth needs queue pairs 10 to 12 there; the 11th is refused (EBUSY) and every
/// rank reports its own device, the limit and mlx PR #4209.
#[test]
fn a_process_needing_an_eleventh_queue_pair_on_a_device_is_told_which_and_why() {
    const NAME: &str = "a_process_needing_an_eleventh_queue_pair_on_a_device_is_told_which_and_why";
    let p = 4;
    if testing::is_rank(NAME) {
        let base = jaccl::Config::from_env().unwrap();
        let first = base.coordinator_addr().unwrap().port();
        let options = nuvec_distributed_engine::Options::default().timeout(Duration::from_secs(10));
        let mut groups = Vec::new();
        for g in 0..4u16 {
            let mut config = base.clone();
            config.coordinator = Some(format!("127.0.0.1:{}", first + g));
            match jaccl::init(&config, &options) {
                Ok(group) => {
                    group.barrier().unwrap();
                    groups.push(group);
                }
                Err(e) => {
                    println!("GROUP {g} ERROR {e}");
                    break;
                }
            }
        }
        println!("FORMED {}", groups.len());
        println!("{DONE}");
        return;
    }
    // Every cell of rank i's row names device d{i}.
    let fabric = Fabric {
        size: p,
        ring: false,
        matrix: testing::mesh_matrix(p, |i, _| format!("d{i}")),
        devices: (0..p).map(|i| format!("d{i}")).collect(),
    };
    let out = launch(
        None,
        "a_process_needing_an_eleventh_queue_pair_on_a_device_is_told_which_and_why",
        &fabric,
        20,
        &[],
        &[],
    );
    assert!(out.iter().all(finished), "{}", show(&out));
    for (rank, o) in out.iter().enumerate() {
        let text = stdout(o);
        assert!(text.contains("FORMED 3"), "rank {rank}: {}", show(&out));
        let error = text
            .lines()
            .find_map(|l| l.find("GROUP 3 ERROR").map(|at| &l[at..]))
            .unwrap_or_else(|| panic!("rank {rank}: {}", show(&out)));
        for needle in [
            format!("d{rank} refused a queue pair with EBUSY"),
            "allow 10 per device".into(),
            "mlx PR #4209".into(),
            "held 10 queue pairs".into(),
            "needs 3".into(),
        ] {
            assert!(
                error.contains(&needle),
                "rank {rank}: {needle:?} in {error}"
            );
        }
    }
}

/// Without the variable the platform's library is loaded; a path that does not exist is an
/// error naming the variable and the path.
#[test]
fn the_library_variable_is_named_in_load_errors() {
    const NAME: &str = "the_library_variable_is_named_in_load_errors";
    if testing::is_rank(NAME) {
        let e = Verbs::load().unwrap_err().to_string();
        assert!(
            e.contains(LIBRARY_VAR) && e.contains("/nonexistent/libverbs.so"),
            "{e}"
        );
        println!("{DONE}");
        return;
    }
    let out = testing::this_test(NAME)
        .env(LIBRARY_VAR, "/nonexistent/libverbs.so")
        .output()
        .unwrap();
    assert!(finished(&out), "{}", show(&[out]));
    if let Ok(verbs) = Verbs::load()
        && std::env::var_os(LIBRARY_VAR).is_none()
    {
        assert!(verbs.library().starts_with("lib"), "{}", verbs.library());
    }
}

// ---------------------------------------------------------------------------------------
// Waiting for a late rank

/// Nanoseconds since the epoch: one clock for every process on the machine.
fn wall_ns() -> i64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("a clock after 1970");
    i64::try_from(since.as_nanos()).expect("before 2262")
}

/// How long a rank that waits for a late peer takes to notice it arrived: rank 1 comes to an
/// all_max 0.6 to 2 ms after rank 0 (where the wait has left spinning for naps), many times;
/// rank 0 prints the delay from the later of the two calls to its own return (median, 90th
/// percentile) and fails if the median exceeds 5 ms, far above any nap the wait takes. It
/// runs with completion channels (the provider's default) and without them (the
/// provider refusing them, as a library without channels would), so the two waits are
/// compared on one build. The printed figures (`--nocapture`) are the
/// measurement of the two waits.
#[test]
fn a_late_peer_is_noticed_promptly() {
    late_peer("a_late_peer_is_noticed_promptly", "on");
}

/// [`a_late_peer_is_noticed_promptly`] without completion channels: the bounded spin, yield
/// and nap.
#[test]
fn a_late_peer_is_noticed_without_completion_channels() {
    late_peer("a_late_peer_is_noticed_without_completion_channels", "off");
}

fn late_peer(name: &str, channels: &str) {
    const ROUNDS: usize = 150;
    if testing::is_rank(name) {
        let group = init_backend(true, Backend::Jaccl).unwrap();
        let me = group.rank();
        let mut extra = Vec::with_capacity(ROUNDS);
        let mut late = 0;
        for round in 0..ROUNDS {
            group.barrier().unwrap();
            if me == 1 {
                let delay = 600 + (round * 97) % 1400;
                std::thread::sleep(Duration::from_micros(delay as u64));
            }
            let called = wall_ns();
            let mut v = [called];
            group.all_max(&mut v).unwrap();
            let returned = wall_ns();
            if me == 0 {
                // v[0] is the later call of the two (the clocks are the same clock).
                assert!(v[0] >= called, "round {round}: all_max lost rank 0's value");
                late += usize::from(v[0] > called);
                extra.push((returned - v[0]) as f64 / 1000.0);
            }
        }
        if me == 0 {
            extra.sort_by(f64::total_cmp);
            let median = extra[ROUNDS / 2];
            let p90 = extra[ROUNDS * 9 / 10];
            println!(
                "LATE-PEER channels={channels} rounds={ROUNDS} rank1-later={late} \
                 median_us={median:.0} p90_us={p90:.0} max_us={:.0}",
                extra[ROUNDS - 1]
            );
            assert!(median < 5000.0, "median {median} us after the late call");
        }
        println!("{DONE}");
        return;
    }
    let vars: Vec<_> = (0..2)
        .map(|r| (r, "NUVEC_VERBS_PROVIDER_CHANNELS", channels.to_string()))
        .collect();
    let out = launch(None, name, &Fabric::mesh(2), 30, &[], &vars);
    assert!(out.iter().all(finished), "{}", show(&out));
    // The harness's "test ... " line has no newline before the rank's first line.
    for line in stdout(&out[0])
        .lines()
        .filter_map(|l| l.find("LATE-PEER").map(|at| &l[at..]))
    {
        println!("{line}");
    }
}
