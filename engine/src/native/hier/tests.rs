//! Hierarchical groups: the partition (sans-IO), and in one process (a thread per rank
//! over loopback meshes whose hellos claim several hosts, all of which can open each
//! other's segments here) every collective against the two-level fold.

use std::time::Duration;

use rand::RngCore;

use super::super::hello::CAP_SHARED_MEMORY;
use super::super::shm_tests::{
    check_all_gather, check_all_reduce, check_sum_scatter, random, start,
};
use super::super::tests::{loopback_mesh, on_ranks};
use super::super::{Formed, Native};
use super::*;
use crate::comm::Communicator;
use crate::options::Options;
use crate::reduce::reduce_into;
use crate::transport::shm::CHUNK;

#[test]
fn ranks_of_one_known_host_form_a_domain_and_unknown_ones_stand_alone() {
    let h = |b: u8| [b; 16];
    assert_eq!(candidates(&[h(1), h(1), h(1)]), vec![vec![0, 1, 2]]);
    assert_eq!(
        candidates(&[h(1), h(2), h(1), h(2)]),
        vec![vec![0, 2], vec![1, 3]]
    );
    assert_eq!(
        candidates(&[h(0), h(3), h(0), h(3), h(3)]),
        vec![vec![0], vec![1, 3, 4], vec![2]]
    );
    assert_eq!(candidates(&[h(4)]), vec![vec![0]]);
    assert!(candidates(&[]).is_empty());
}

#[test]
fn a_domain_whose_segment_fell_through_splits_into_single_ranks_in_rank_order() {
    let cands = vec![vec![0, 3], vec![1, 2, 4], vec![5]];
    assert_eq!(settle(&cands, &[true, true, false]), cands);
    assert_eq!(
        settle(&cands, &[true, false, false]),
        vec![vec![0, 3], vec![1], vec![2], vec![4], vec![5]]
    );
    assert_eq!(
        settle(&cands, &[false, true, true]),
        vec![vec![0], vec![1, 2, 4], vec![3], vec![5]]
    );
}

/// Meshes whose hellos put rank `r` on host `hosts[r]` (0: unknown), shared memory
/// offered by every rank.
fn on_hosts(hosts: &[u8], timeout: Duration) -> Vec<Formed> {
    let mut group = [0u8; 32];
    rand::rng().fill_bytes(&mut group);
    let mut formed = loopback_mesh(hosts.len(), 1, timeout);
    for f in &mut formed {
        for (p, &h) in f.peers.iter_mut().zip(hosts) {
            p.host = [h; 16];
            p.capabilities = CAP_SHARED_MEMORY;
        }
        f.group = group;
    }
    formed
}

fn group(hosts: &[u8]) -> Vec<Native> {
    let timeout = Duration::from_secs(20);
    start(
        on_hosts(hosts, timeout),
        &Options::default().timeout(timeout),
    )
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The fold every rank must compute: inside each domain in rank order, then the
/// domains' results in the order of their leaders.
fn two_level(op: ReduceOp, dtype: DType, domains: &[Vec<usize>], inputs: &[Vec<u8>]) -> Vec<u8> {
    let fold = |ranks: &mut dyn Iterator<Item = Vec<u8>>| {
        let mut acc = ranks.next().expect("a domain has a rank");
        for x in ranks {
            reduce_into(op, dtype, &mut acc, &x);
        }
        acc
    };
    let mut per_domain = domains
        .iter()
        .map(|d| fold(&mut d.iter().map(|&r| inputs[r].clone())));
    fold(&mut per_domain)
}

/// The domains every rank of `ranks` found (they must agree).
fn domains_of(ranks: &[Native]) -> Vec<Vec<usize>> {
    let all: Vec<Vec<Vec<usize>>> = ranks
        .iter()
        .map(|r| {
            let state = r.state.lock().expect("open");
            let Path::Hier(hier) = &state.path else {
                panic!("rank {}: not hierarchical: {:?}", r.rank(), state.path);
            };
            hier.domains().to_vec()
        })
        .collect();
    assert!(all.windows(2).all(|w| w[0] == w[1]), "{all:?}");
    all[0].clone()
}

#[test]
fn every_collective_of_a_hierarchical_group_folds_inside_hosts_then_across() {
    // 2x2, 3+1, hosts interleaved with the ranks, and an unknown host among them.
    let layouts: [(&[u8], &[&[usize]]); 4] = [
        (&[1, 1, 2, 2], &[&[0, 1], &[2, 3]]),
        (&[1, 1, 1, 2], &[&[0, 1, 2], &[3]]),
        (&[5, 6, 5, 6, 5], &[&[0, 2, 4], &[1, 3]]),
        (&[0, 9, 9], &[&[0], &[1, 2]]),
    ];
    for (hosts, want) in layouts {
        let ranks = group(hosts);
        let size = hosts.len();
        let domains = domains_of(&ranks);
        assert_eq!(domains, want, "hosts {hosts:?}");
        for dtype in [DType::F32, DType::BF16] {
            let ds = dtype.size();
            // Around P, the leaders' one-shot limit (the table's over TCP among the
            // hosts), and past a chunk with a ragged end.
            let counts = [
                0,
                1,
                size - 1,
                4099,
                algorithm::one_shot_max(crate::comm::Transport::Tcp, domains.len()) / ds + 1,
                CHUNK / ds + 7,
            ];
            for (i, &n) in counts.iter().enumerate() {
                for op in [ReduceOp::Sum, ReduceOp::Max] {
                    let case = (size * 1000 + i * 10) as u64;
                    let inputs: Vec<Vec<u8>> =
                        (0..size).map(|r| random(case + r as u64, n * ds)).collect();
                    let want = two_level(op, dtype, &domains, &inputs);
                    let case = format!("{hosts:?} {dtype} x{n}");
                    check_all_reduce(&ranks, op, dtype, &inputs, &want, &case);
                }
            }
        }
        for n in [0, 3, CHUNK / 2 + 5] {
            check_all_gather(&ranks, n, &format!("{hosts:?}"));
        }
        for n in [0, 5, CHUNK / 8 + 3] {
            check_sum_scatter(
                &ranks,
                n,
                |inputs| two_level(ReduceOp::Sum, DType::F32, &domains, inputs),
                &format!("{hosts:?}"),
            );
        }
        // The collectives that stay on TCP, and the barrier, between the others.
        for r in on_ranks(&ranks, |c| {
            c.barrier()?;
            let mut b = [c.rank() as u8; 9];
            c.broadcast(&mut b, size - 1)?;
            let input: Vec<u8> = (0..size).map(|j| (c.rank() * 16 + j) as u8).collect();
            let mut out = vec![0u8; size];
            c.all_to_all(&input, &mut out)?;
            c.barrier()?;
            Ok::<_, Error>((b, out))
        }) {
            let (b, out) = r.expect("barrier, broadcast, all_to_all");
            assert_eq!(b, [(size - 1) as u8; 9]);
            assert!(
                out.iter()
                    .enumerate()
                    .all(|(j, &v)| v as usize % 16 < size && v as usize / 16 == j)
            );
        }
    }
}

#[test]
fn a_group_of_single_rank_hosts_stays_on_tcp() {
    let ranks = group(&[1, 2, 3]);
    for r in &ranks {
        let state = r.state.lock().expect("open");
        assert!(matches!(state.path, Path::Tcp), "{:?}", state.path);
    }
    let got = on_ranks(&ranks, |c| {
        let mut x = f32s(&[c.rank() as f32 + 1.0; 5]);
        c.all_reduce(ReduceOp::Sum, DType::F32, &mut x).map(|()| x)
    });
    for x in got {
        assert_eq!(x.expect("all_sum"), f32s(&[6.0; 5]));
    }
}

/// A call that differs on one rank fails every rank with the mismatch, wherever that rank
/// sits: a member, a leader (outvoted by its domain or not), a single-rank host; and
/// against a collective that stays on TCP (broadcast, all_to_all).
#[test]
fn a_mismatch_anywhere_fails_every_rank_as_a_mismatch() {
    for (hosts, odd, other) in [
        (&[1u8, 1, 2, 2][..], 3, "all_max"),
        (&[1, 1, 2, 2], 1, "all_max"),
        (&[1, 1, 2, 2], 2, "all_max"),
        (&[1, 1, 2, 2], 0, "all_max"),
        (&[1, 1, 1, 2, 2, 2], 3, "all_max"),
        (&[1, 1, 1, 2], 3, "all_max"),
        (&[1, 1, 1, 2], 2, "all_max"),
        (&[1, 1, 2, 2], 3, "broadcast"),
        (&[1, 1, 2, 2], 0, "all_to_all"),
    ] {
        let ranks = group(hosts);
        let got = on_ranks(&ranks, |c| {
            let mut x = f32s(&[1.0; 6]);
            if c.rank() != odd {
                return c.all_reduce(ReduceOp::Sum, DType::F32, &mut x);
            }
            match other {
                "all_max" => c.all_reduce(ReduceOp::Max, DType::F32, &mut x),
                "broadcast" => c.broadcast(&mut x, 0),
                _ => {
                    let mut out = vec![0u8; hosts.len() * 4];
                    c.all_to_all(&vec![1u8; hosts.len() * 4], &mut out)
                }
            }
        });
        for (r, e) in got.into_iter().enumerate() {
            let e = e.expect_err("a mismatch");
            assert!(
                matches!(e, Error::Mismatch { .. }),
                "{hosts:?}, rank {odd} odd: rank {r}: {e}"
            );
            let text = e.to_string();
            assert!(
                text.contains(other) && text.contains("all_sum"),
                "{hosts:?}, rank {odd} odd: rank {r}: {text}"
            );
        }
    }
}
