//! broadcast, all_to_all and the allocating conveniences across real processes on
//! loopback, on both wires (the in-crate tests in `src/group_collectives_tests.rs` run
//! every P from 1 to 6 in threads; these check the same through `init`'s environment,
//! with two connections per neighbour on the ring, so that its steps are striped).

use nuvec_distributed_engine::{
    Error, Group, all_gather_vec, all_to_all, bf16, broadcast, recv_vec,
};
use nuvec_tools::testing::Launch;

fn values(who: usize, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| i.wrapping_mul(2_654_435_761) ^ (who as u32) << 24)
        .collect()
}

fn check(g: &Group) {
    let (me, p) = (g.rank(), g.size());
    for root in 0..p {
        // A few elements, then more than one 256 KiB ring chunk (and past the native
        // wire's 32 KiB switch).
        for len in [3, 70_001] {
            let mut data = if me == root {
                values(root, len)
            } else {
                values(me + 100, len)
            };
            broadcast(&mut data, root, Some(g)).expect("a broadcast");
            assert!(
                data == values(root, len),
                "rank {me}: broadcast from {root}, {len}"
            );
        }
    }
    for block in [1, 3000] {
        let input: Vec<u32> = (0..p).flat_map(|j| values(me * 16 + j, block)).collect();
        let mut output = vec![0; input.len()];
        all_to_all(&input, &mut output, Some(g)).expect("an all_to_all");
        let want: Vec<u32> = (0..p).flat_map(|i| values(i * 16 + me, block)).collect();
        assert!(output == want, "rank {me}: all_to_all of {block} per block");
    }
    let all = all_gather_vec(&[bf16::from_f32(me as f32)], Some(g)).expect("all_gather_vec");
    let want: Vec<bf16> = (0..p).map(|r| bf16::from_f32(r as f32)).collect();
    assert_eq!(all, want);
    if p > 1 {
        let (right, left) = ((me + 1) % p, (me + p - 1) % p);
        g.send(&values(me, 5), right).expect("a send");
        let got: Vec<u32> = recv_vec(5, left, Some(g)).expect("recv_vec");
        assert_eq!(got, values(left, 5));
    }
    g.barrier().expect("the closing barrier");
}

#[test]
fn ring_p3_c2() {
    Launch::new(3, 2).all_ok("ring_p3_c2", |g| check(&g));
}

#[test]
fn ring_p5_c1() {
    Launch::new(5, 1).all_ok("ring_p5_c1", |g| check(&g));
}

#[test]
fn native_p2_c2() {
    Launch::new(2, 2)
        .env("NUVEC_DISTRIBUTED_WIRE", "native")
        .all_ok("native_p2_c2", |g| check(&g));
}

#[test]
fn native_p4_c1() {
    Launch::new(4, 1)
        .env("NUVEC_DISTRIBUTED_WIRE", "native")
        .all_ok("native_p4_c1", |g| check(&g));
}

/// Ranks that disagree about the root all fail with a mismatch naming both calls, in
/// their own processes.
#[test]
fn native_p3_two_roots_are_a_mismatch() {
    Launch::new(3, 1)
        .env("NUVEC_DISTRIBUTED_WIRE", "native")
        .all_ok("native_p3_two_roots_are_a_mismatch", |g| {
            let root = usize::from(g.rank() == 2);
            let e = g.broadcast(&mut [7u8; 100], root).unwrap_err();
            assert!(matches!(e, Error::Mismatch { .. }), "{e}");
            let msg = e.to_string();
            assert!(
                msg.contains("broadcast of 100 bytes from rank 0")
                    && msg.contains("broadcast of 100 bytes from rank 1"),
                "{msg}"
            );
            assert!(matches!(g.barrier(), Err(Error::Failed(_))));
        });
}
