//! `Group::split` across real processes on loopback: every color/key pattern at P = 1..=6 on
//! both wires, nested splits, a fault inside one sub-group, and several groups held by one
//! process at once.
//!
//! Each sub-group is checked against the membership and order computed here from the
//! colors and keys alone (MLX's rule: by key, then by parent rank; a negative key is the
//! parent rank), and by collectives whose results depend on exactly who is in it and in
//! which order: an all_gather of the parent ranks and an all_sum.

use std::time::Duration;

use nuvec_distributed_engine::{Backend, Error, Fault, Group, Options, Stub, init_with};
use nuvec_tools::testing::{self, Launch};

/// A split pattern: every rank's color and key, for a group of `size`.
type Pattern = fn(usize, usize) -> (i32, i32);

/// The patterns every size runs: one color, two and three colors with reversed keys, equal
/// keys, a color each, ranks in no group, pairs with tied keys, negative keys mixed with
/// explicit ones, and no rank in any group.
const PATTERNS: [(&str, Pattern); 9] = [
    ("one color", |_, _| (0, -1)),
    ("two colors", |r, _| ((r % 2) as i32, -1)),
    ("three colors, reversed keys", |r, p| {
        ((r % 3) as i32, (p - r) as i32)
    }),
    ("equal keys", |_, _| (5, 0)),
    ("a color each", |r, _| (r as i32 * 3, 1)),
    ("some ranks in no group", |r, _| {
        (if r % 3 == 1 { Group::NO_COLOR } else { 0 }, -1)
    }),
    ("pairs, tied keys", |r, _| {
        ((r / 2) as i32, ((r * 7) % 3) as i32)
    }),
    ("negative and explicit keys", |r, _| {
        let color = if r == 0 { -7 } else { 1 };
        (color, if r % 2 == 0 { -1 } else { 10 - r as i32 })
    }),
    ("no group at all", |_, _| (Group::NO_COLOR, 0)),
];

/// The parent ranks of `rank`'s sub-group in their new order, or `None` for a rank that
/// takes part in none: computed from the pattern alone.
fn expected(pattern: Pattern, size: usize, rank: usize) -> Option<Vec<usize>> {
    let (color, _) = pattern(rank, size);
    if color < 0 {
        return None;
    }
    let mut members: Vec<(i64, usize)> = (0..size)
        .filter(|&r| pattern(r, size).0 == color)
        .map(|r| {
            let key = pattern(r, size).1;
            (if key < 0 { r as i64 } else { key as i64 }, r)
        })
        .collect();
    members.sort();
    Some(members.into_iter().map(|(_, r)| r).collect())
}

/// Checks `sub`, the sub-group of parent rank `rank`, against `members` (`None`: in none).
fn check_sub(sub: &Group, rank: usize, members: Option<&[usize]>, what: &str) {
    let Some(members) = members else {
        assert_eq!((sub.size(), sub.backend()), (1, "single"), "{what}");
        return;
    };
    let me = members.iter().position(|&r| r == rank).unwrap();
    assert_eq!((sub.rank(), sub.size()), (me, members.len()), "{what}");
    if members.len() == 1 {
        assert_eq!(sub.backend(), "single", "{what}");
    }
    // The gather shows the order; the sum and max show who is in it.
    let mut gathered = vec![0u32; members.len() * 3];
    let mine = [rank as u32, 100 + rank as u32, 7];
    sub.all_gather(&mine, &mut gathered).unwrap();
    let want: Vec<u32> = members
        .iter()
        .flat_map(|&r| [r as u32, 100 + r as u32, 7])
        .collect();
    assert_eq!(gathered, want, "{what}");
    let mut sum = [rank as f64 + 1.0, 1.0];
    sub.all_sum(&mut sum).unwrap();
    let total: f64 = members.iter().map(|&r| r as f64 + 1.0).sum();
    assert_eq!(sum, [total, members.len() as f64], "{what}");
    let mut max = [-(rank as i64)];
    sub.all_max(&mut max).unwrap();
    let lowest = *members.iter().min().unwrap();
    assert_eq!(max, [-(lowest as i64)], "{what}");
    sub.barrier().unwrap();
}

/// Shows which wire `sub` runs on: the native wire sends to any rank, MLX's only to
/// neighbours, so a sub-group of four or more tells them apart.
fn check_wire(sub: &Group, wire: &str, what: &str) {
    if sub.size() < 4 {
        return;
    }
    let data = [sub.rank() as u64; 3];
    match (wire, sub.rank()) {
        ("native", 0) => sub.send(&data, 2).unwrap(),
        ("native", 2) => {
            let mut got = [9u64; 3];
            sub.recv(&mut got, 0).unwrap();
            assert_eq!(got, [0; 3], "{what}");
        }
        ("native", _) => {}
        (_, 0) => {
            let refused = sub.send(&data, 2).unwrap_err();
            assert!(
                matches!(refused, Error::InvalidArgument(_)),
                "{what}: {refused}"
            );
        }
        _ => {}
    }
    sub.barrier().unwrap();
}

/// Every pattern at this size, each sub-group checked and closed before the next split;
/// the parent still works at the end.
fn patterns(size: usize, connections: usize, wire: &str, keyed: bool, name: &str) {
    let mut launch = Launch::new(size, connections).env("NUVEC_DISTRIBUTED_WIRE", wire);
    if keyed {
        launch = launch.env("NUVEC_DISTRIBUTED_KEY", "a split test key, 16+ bytes");
    }
    launch.all_ok(name, |g| {
        assert_eq!(g.size(), size);
        let rank = g.rank();
        for (what, pattern) in PATTERNS {
            let (color, key) = pattern(rank, size);
            let what = format!("P = {size}, {what}: rank {rank}");
            let sub = g
                .split(color, key)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            check_sub(&sub, rank, expected(pattern, size, rank).as_deref(), &what);
            check_wire(&sub, wire, &what);
            sub.close().unwrap();
        }
        let mut x = [1u16; 5];
        g.all_sum(&mut x).unwrap();
        assert_eq!(x, [size as u16; 5]);
    });
}

#[test]
fn patterns_p1() {
    patterns(1, 1, "mlx", false, "patterns_p1");
}
#[test]
fn patterns_p2() {
    patterns(2, 1, "mlx", false, "patterns_p2");
}
#[test]
fn patterns_p3() {
    patterns(3, 1, "mlx", false, "patterns_p3");
}
#[test]
fn patterns_p4() {
    patterns(4, 1, "mlx", false, "patterns_p4");
}
#[test]
fn patterns_p5() {
    patterns(5, 1, "mlx", false, "patterns_p5");
}
#[test]
fn patterns_p6() {
    patterns(6, 1, "mlx", false, "patterns_p6");
}
/// Two connections per neighbour: every sub-group gets two fresh ports per rank.
#[test]
fn patterns_p4_c2() {
    patterns(4, 2, "mlx", false, "patterns_p4_c2");
}
/// A keyed parent: the sub-groups authenticate with the same key.
#[test]
fn patterns_p3_keyed() {
    patterns(3, 1, "mlx", true, "patterns_p3_keyed");
}
#[test]
fn native_patterns_p2() {
    patterns(2, 1, "native", false, "native_patterns_p2");
}
#[test]
fn native_patterns_p3_keyed() {
    patterns(3, 1, "native", true, "native_patterns_p3_keyed");
}
#[test]
fn native_patterns_p5() {
    patterns(5, 1, "native", false, "native_patterns_p5");
}
#[test]
fn native_patterns_p6_c2() {
    patterns(6, 2, "native", false, "native_patterns_p6_c2");
}

/// Splits of splits, with every level used in turn afterwards.
fn nested(wire: &str, name: &str) {
    Launch::new(6, 1)
        .env("NUVEC_DISTRIBUTED_WIRE", wire)
        .all_ok(name, |g| {
            let rank = g.rank();
            // Odd and even ranks, each in reverse: [4, 2, 0] and [5, 3, 1].
            let half = g.split((rank % 2) as i32, (10 - rank) as i32).unwrap();
            let halves = [[4usize, 2, 0], [5, 3, 1]][rank % 2];
            check_sub(&half, rank, Some(&halves), "half");
            // Within each half: its first rank alone, the other two together.
            let color = i32::from(half.rank() != 0);
            let quarter = half.split(color, -1).unwrap();
            let quarters: &[usize] = if half.rank() == 0 {
                &halves[..1]
            } else {
                &halves[1..]
            };
            check_sub(&quarter, rank, Some(quarters), "quarter");
            // A third level, in reverse, of the pairs.
            let again = quarter.split(0, (5 - quarter.rank()) as i32).unwrap();
            let reversed: Vec<usize> = quarters.iter().rev().copied().collect();
            check_sub(&again, rank, Some(&reversed), "third level");
            // Every level is still usable, in any order.
            check_sub(&half, rank, Some(&halves), "half again");
            check_sub(&g, rank, Some(&[0, 1, 2, 3, 4, 5]), "parent");
            check_sub(&quarter, rank, Some(quarters), "quarter again");
            for group in [&again, &quarter, &half] {
                group.close().unwrap();
            }
            let closed = half.split(0, -1).unwrap_err();
            assert!(matches!(closed, Error::GroupClosed), "{closed}");
            check_sub(&g, rank, Some(&[0, 1, 2, 3, 4, 5]), "parent after closes");
        });
}

#[test]
fn nested_splits() {
    nested("mlx", "nested_splits");
}
#[test]
fn native_nested_splits() {
    nested("native", "native_nested_splits");
}

/// A rank of one sub-group dies: its sub-group fails, naming it, while the sibling
/// sub-group keeps working.
fn a_killed_rank_fails_only_its_sub_group(wire: &str, name: &str) {
    let outputs = Launch::new(4, 1)
        .timeout(10.0)
        .env("NUVEC_DISTRIBUTED_WIRE", wire)
        .run(name, |g| {
            let rank = g.rank();
            // [0, 1] and [2, 3].
            let sub = g.split((rank / 2) as i32, -1).unwrap();
            sub.barrier().unwrap();
            if rank == 3 {
                std::process::exit(0);
            }
            if rank == 2 {
                let error = sub.all_sum(&mut [1.0f32; 64]).expect_err("rank 3 is gone");
                assert_eq!(
                    error.peer(),
                    Some(1),
                    "named by its sub-group rank: {error}"
                );
                assert_eq!(error.fault(), Fault::PeerFailed, "{error}");
                let again = sub.barrier().expect_err("the sub-group is failed");
                assert_eq!(again.fault(), Fault::FailedEarlier, "{again}");
                println!("SUB-FAILED");
                return;
            }
            // The sibling outlives the death, and keeps working well after it.
            std::thread::sleep(Duration::from_millis(300));
            for round in 0..20u32 {
                let mut x = [round + rank as u32; 16];
                sub.all_sum(&mut x).unwrap();
                assert_eq!(x, [2 * round + 1; 16]);
            }
            println!("SIBLING-OK");
        });
    let Some(outputs) = outputs else { return };
    let show = || outputs.iter().map(|o| o.to_string()).collect::<String>();
    for rank in [0, 1] {
        assert!(outputs[rank].finished(), "{}", show());
        assert_eq!(outputs[rank].lines("SIBLING-OK").len(), 1, "{}", show());
    }
    assert!(outputs[2].finished(), "{}", show());
    assert_eq!(outputs[2].lines("SUB-FAILED").len(), 1, "{}", show());
}

#[test]
fn a_killed_rank_fails_only_its_sub_group_p4() {
    a_killed_rank_fails_only_its_sub_group("mlx", "a_killed_rank_fails_only_its_sub_group_p4");
}
#[test]
fn native_a_killed_rank_fails_only_its_sub_group_p4() {
    a_killed_rank_fails_only_its_sub_group(
        "native",
        "native_a_killed_rank_fails_only_its_sub_group_p4",
    );
}

/// A rank closes its sub-group under its peers (no process dies): the peers' sub-group
/// fails, while the sibling sub-group and the parent keep working on every rank.
#[test]
fn a_fault_in_a_sub_group_spares_the_parent_and_the_sibling() {
    Launch::new(5, 1).timeout(10.0).all_ok(
        "a_fault_in_a_sub_group_spares_the_parent_and_the_sibling",
        |g| {
            let rank = g.rank();
            // [0, 2, 4] and [1, 3].
            let sub = g.split((rank % 2) as i32, -1).unwrap();
            sub.barrier().unwrap();
            if rank == 3 {
                sub.close().unwrap();
            }
            if rank == 1 {
                let error = sub.all_sum(&mut [1u8; 8]).expect_err("rank 3 closed it");
                assert_eq!(error.peer(), Some(1), "{error}");
                assert!(
                    matches!(sub.health().unwrap_err(), Error::Failed(_)),
                    "the sub-group stays failed"
                );
            }
            if rank % 2 == 0 {
                check_sub(&sub, rank, Some(&[0, 2, 4]), "sibling");
            }
            check_sub(&g, rank, Some(&[0, 1, 2, 3, 4]), "parent");
            // The parent can still split, and the new sub-group works.
            let fresh = g.split(0, -1).unwrap();
            check_sub(&fresh, rank, Some(&[0, 1, 2, 3, 4]), "a new split");
        },
    );
}

/// A sub-group waits as long as its parent would: a stalled member is named after the
/// parent's timeout (1 s here), not the default 30 s.
#[test]
fn a_sub_group_keeps_the_parent_s_timeout() {
    const NAME: &str = "a_sub_group_keeps_the_parent_s_timeout";
    let outputs = Launch::new(3, 1).timeout(1.0).run(NAME, |g| {
        let sub = g.split(i32::from(g.rank() == 2), -1).unwrap();
        match g.rank() {
            0 => {
                let start = std::time::Instant::now();
                let error = sub.all_sum(&mut [1i32; 4]).unwrap_err();
                let took = start.elapsed();
                assert_eq!((error.peer(), error.fault()), (Some(1), Fault::PeerFailed));
                assert!(matches!(error, Error::Timeout { .. }), "{error}");
                assert!(took < Duration::from_secs(5), "{took:?}: {error}");
                println!("TIMED-OUT");
            }
            // Stalls well past the timeout, then finds its sub-group failed.
            1 => {
                std::thread::sleep(Duration::from_secs(3));
                assert!(sub.all_sum(&mut [1i32; 4]).is_err());
            }
            _ => assert_eq!(sub.size(), 1),
        }
    });
    let Some(outputs) = outputs else { return };
    testing::assert_all_finished(&outputs);
    assert_eq!(outputs[0].lines("TIMED-OUT").len(), 1, "{}", outputs[0]);
}

/// One process holds several groups at once: per thread (each thread a rank), two rings
/// from `init_with` (one per wire) and sub-groups of both, used in interleaved order.
#[test]
fn several_groups_in_one_process() {
    const P: usize = 4;
    let mlx = testing::loopback_nodes(&testing::free_ports(P, 1));
    let native = testing::loopback_nodes(&testing::free_ports(P, 1));
    let options = Options::default().timeout(Duration::from_secs(20));
    std::thread::scope(|s| {
        let ranks: Vec<_> = (0..P)
            .map(|rank| {
                let (mlx, native, options) = (&mlx, &native, &options);
                s.spawn(move || {
                    let a = init_with(mlx, rank, options).unwrap();
                    let b =
                        init_with(native, rank, &options.clone().backend(Backend::Native)).unwrap();
                    // Pairs across the two rings, split differently.
                    let a_sub = a.split((rank % 2) as i32, -1).unwrap();
                    let b_sub = b.split((rank / 2) as i32, (P - rank) as i32).unwrap();
                    let a_members = [[0usize, 2], [1, 3]][rank % 2];
                    let b_members = [[1usize, 0], [3, 2]][rank / 2];
                    for round in 0..3 {
                        let what = format!("round {round}");
                        check_sub(&b_sub, rank, Some(&b_members), &what);
                        check_sub(&a, rank, Some(&[0, 1, 2, 3]), &what);
                        check_sub(&a_sub, rank, Some(&a_members), &what);
                        check_sub(&b, rank, Some(&[0, 1, 2, 3]), &what);
                    }
                    // Closing one ring leaves its sub-group and the other ring working.
                    a.close().unwrap();
                    check_sub(&a_sub, rank, Some(&a_members), "after closing a");
                    check_sub(&b, rank, Some(&[0, 1, 2, 3]), "after closing a");
                    assert_eq!(
                        (a_sub.backend(), b.backend(), b_sub.backend()),
                        ("ring", "native", "native")
                    );
                })
            })
            .collect();
        for r in ranks {
            r.join().unwrap();
        }
    });
}

#[test]
fn groups_not_formed_here_refuse_to_split_naming_the_call() {
    // A group of two over a communicator of the caller's own, which this crate did not form.
    let group = Group::new(std::sync::Arc::new(Stub::new(2, "foreign")));
    let error = group.split(0, -1).unwrap_err();
    assert!(matches!(error, Error::Unsupported(_)), "{error}");
    let text = error.to_string();
    assert!(text.contains("split") && text.contains("foreign"), "{text}");
    // The group of one splits to itself, whatever the color.
    for color in [0, 3, Group::NO_COLOR] {
        let single = Group::single().split(color, -1).unwrap();
        assert_eq!(
            (single.rank(), single.size(), single.backend()),
            (0, 1, "single")
        );
    }
}

/// `examples/tp_pp.rs`, as `nuvec launch -n 4` runs it: 2 stages x 2 tensor-parallel ranks
/// formed with two splits, checked against the unsharded model.
#[test]
fn the_tp_pp_example_matches_the_unsharded_model() {
    let outputs = testing::run_example(
        ("nuvec-distributed-engine", "tp_pp"),
        &[],
        4,
        "the_tp_pp_example_matches_the_unsharded_model",
    );
    let report = &outputs[0].stdout;
    assert!(
        report.contains("2 stages x 2 tensor-parallel") && report.contains(": ok"),
        "{report}"
    );
}

/// One process holds a JACCL group (a mesh of 3 on the test verbs provider) next to a
/// ring and the ring's sub-groups, and uses them in turn; the JACCL group refuses to split,
/// naming why.
#[cfg(feature = "jaccl")]
#[test]
fn a_jaccl_group_next_to_a_ring_and_its_sub_groups() {
    use nuvec_distributed_engine::{Backend, init_backend};
    use std::process::Stdio;

    const NAME: &str = "a_jaccl_group_next_to_a_ring_and_its_sub_groups";
    const P: usize = 3;
    const RING_PORTS: &str = "NUVEC_TEST_RING_PORTS";
    if testing::is_rank(NAME) {
        let jaccl = init_backend(true, Backend::Jaccl).unwrap();
        assert_eq!((jaccl.backend(), jaccl.size()), ("jaccl", P));
        let rank = jaccl.rank();
        let ports: Vec<Vec<u16>> = std::env::var(RING_PORTS)
            .unwrap()
            .split(',')
            .map(|p| vec![p.parse().unwrap()])
            .collect();
        let options = Options::default().timeout(Duration::from_secs(20));
        let ring = init_with(&testing::loopback_nodes(&ports), rank, &options).unwrap();
        let sub = ring.split((rank % 2) as i32, -1).unwrap();
        let members: &[usize] = if rank.is_multiple_of(2) {
            &[0, 2]
        } else {
            &[1]
        };
        let refused = jaccl.split(0, -1).unwrap_err();
        assert!(matches!(refused, Error::Unsupported(_)), "{refused}");
        assert!(refused.to_string().contains("JACCL"), "{refused}");
        for round in 0..3 {
            let what = format!("round {round}");
            check_sub(&jaccl, rank, Some(&[0, 1, 2]), &what);
            check_sub(&sub, rank, Some(members), &what);
            check_sub(&ring, rank, Some(&[0, 1, 2]), &what);
        }
        // The JACCL group survives the ring's close, and the ring's sub-group too.
        ring.close().unwrap();
        check_sub(&jaccl, rank, Some(&[0, 1, 2]), "after closing the ring");
        check_sub(&sub, rank, Some(members), "after closing the ring");
        println!("{}", testing::DONE);
        return;
    }
    // A full mesh: rank i reaches rank j through provider device m{i}to{j}.
    let cell = |i: usize, j: usize| {
        if i == j {
            "null".to_string()
        } else {
            format!("\"m{i}to{j}\"")
        }
    };
    let matrix: Vec<String> = (0..P)
        .map(|i| {
            format!(
                "[{}]",
                (0..P).map(|j| cell(i, j)).collect::<Vec<_>>().join(", ")
            )
        })
        .collect();
    let devices: Vec<String> = (0..P)
        .flat_map(|i| {
            (0..P)
                .filter(move |&j| j != i)
                .map(move |j| format!("m{i}to{j}"))
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("devices.json");
    std::fs::write(&file, format!("[{}]", matrix.join(", "))).unwrap();
    let coordinator = testing::free_port_block(1).unwrap();
    let ring_ports: Vec<String> = testing::free_ports(P, 1)
        .iter()
        .map(|p| p[0].to_string())
        .collect();
    let children = (0..P)
        .map(|rank| {
            let mut cmd = testing::this_test(NAME);
            for var in [
                "MLX_HOSTFILE",
                "MLX_JACCL_RING",
                "JACCL_RING",
                "NUVEC_JACCL_BUFFERS",
            ] {
                cmd.env_remove(var);
            }
            cmd.env("NUVEC_DISTRIBUTED_VERBS_LIBRARY", testing::verbs_provider())
                .env("NUVEC_VERBS_PROVIDER_DIR", dir.path())
                .env("NUVEC_VERBS_PROVIDER_DEVICES", devices.join(","))
                .env("NUVEC_DISTRIBUTED_TIMEOUT", "20")
                .env("MLX_RANK", rank.to_string())
                .env("MLX_IBV_DEVICES", &file)
                .env("MLX_JACCL_COORDINATOR", format!("127.0.0.1:{coordinator}"))
                .env(RING_PORTS, ring_ports.join(","))
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            (rank, cmd.spawn().unwrap())
        })
        .collect();
    testing::assert_all_finished(&testing::collect(children, Duration::from_secs(120)));
}
