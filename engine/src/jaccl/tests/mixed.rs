//! Groups that mix nuvec and MLX ranks, as far as the set-up tells them apart: a rank made to
//! publish its records as MLX does (no mark in the padding) stands for an MLX rank. It still
//! runs this crate's algorithms, so what these tests check is what the nuvec ranks do with
//! the knowledge, not MLX's arithmetic (which the README's MLX measurements cover).

use super::{Layout, run_ok};
use crate::error::Error;
use crate::jaccl::config::MlxAllGather;
use crate::transport::rdma::emulated::Network;

/// Every rank's block of an all_gather of `n` floats: rank `r`'s element `i` is
/// `r * 1000 + i`.
fn block(rank: usize, n: usize) -> Vec<f32> {
    (0..n).map(|i| (rank * 1000 + i) as f32).collect()
}

/// What each rank's all_gather (of `n` floats per rank) returned, then whether an all_sum
/// right after it still gives the exact sum on every rank.
fn gather_then_sum(layout: Layout, n: usize) -> Vec<(Result<Vec<f32>, Error>, bool)> {
    let net = Network::new();
    let size = layout.size;
    run_ok(layout, &net, |rank, g| {
        let mut out = vec![0f32; n * size];
        let gathered = g.all_gather(&block(rank, n), &mut out).map(|()| out);
        let mut v = vec![rank as f32 + 1.0; 3000];
        let summed =
            g.all_sum(&mut v).is_ok() && v.iter().all(|&x| x == (size * (size + 1) / 2) as f32);
        (gathered, summed)
    })
}

fn every_block(size: usize, n: usize) -> Vec<f32> {
    (0..size).flat_map(|r| block(r, n)).collect()
}

/// A ring of nuvec ranks knows that its all_gather is right, and runs it.
#[test]
fn a_ring_of_nuvec_ranks_gathers() {
    for n in [1, 5000, 200_000] {
        for (rank, (gathered, summed)) in gather_then_sum(Layout::ring(3, 2), n)
            .into_iter()
            .enumerate()
        {
            assert_eq!(gathered.unwrap(), every_block(3, n), "rank {rank}, n = {n}");
            assert!(summed, "rank {rank}");
        }
    }
}

/// With an MLX rank in the ring, every nuvec rank refuses the all_gather, naming the MLX
/// rank, MLX's defect, the fix and the switch; the messages were exchanged, so the group is
/// still in step (the all_sum after it is right on every rank, the MLX rank included).
#[test]
fn nuvec_ranks_of_a_ring_with_an_mlx_rank_refuse_all_gather_and_stay_usable() {
    let n = 5000;
    let results = gather_then_sum(Layout::ring(4, 2).mlx_rank(2), n);
    for (rank, (gathered, summed)) in results.into_iter().enumerate() {
        assert!(summed, "rank {rank}: the group must stay usable");
        if rank == 2 {
            // The rank playing MLX sees only nuvec ranks: it gathers (as a fixed MLX would).
            assert_eq!(gathered.unwrap(), every_block(4, n));
            continue;
        }
        let e = gathered.unwrap_err();
        assert!(matches!(e, Error::Unsupported(_)), "rank {rank}: {e:?}");
        assert!(!e.is_fatal(), "rank {rank}: {e}");
        let text = e.to_string();
        for needle in [
            "rank(s) 2",
            "MLX 0.32.1",
            "defective",
            "PR #4443",
            "NUVEC_JACCL_MLX_ALL_GATHER=fixed",
        ] {
            assert!(text.contains(needle), "rank {rank}: {needle:?} in {text}");
        }
    }
}

/// Declaring the MLX ranks' all_gather fixed lets the mixed ring gather.
#[test]
fn a_mixed_ring_declared_fixed_gathers() {
    let n = 5000;
    let layout = Layout::ring(3, 1)
        .mlx_rank(0)
        .mlx_all_gather(MlxAllGather::Fixed);
    for (rank, (gathered, summed)) in gather_then_sum(layout, n).into_iter().enumerate() {
        assert_eq!(gathered.unwrap(), every_block(3, n), "rank {rank}");
        assert!(summed, "rank {rank}");
    }
}

/// MLX's mesh all_gather is right: a mesh with MLX ranks gathers.
#[test]
fn a_mixed_mesh_gathers() {
    let n = 5000;
    for (rank, (gathered, summed)) in gather_then_sum(Layout::mesh(3).mlx_rank(1), n)
        .into_iter()
        .enumerate()
    {
        assert_eq!(gathered.unwrap(), every_block(3, n), "rank {rank}");
        assert!(summed, "rank {rank}");
    }
}
