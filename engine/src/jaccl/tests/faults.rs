//! Faults end in errors that name the peer, never in a hang: lost and failed messages
//! (injected into the emulated fabric), a rank that disappears, and one that stops
//! answering. Every test bounds how long the survivors may take.

use std::time::{Duration, Instant};

use super::{Layout, run_ok};
use crate::error::{Error, PeerOp};
use crate::transport::rdma::emulated::{Fault, Network};

const SHORT: Duration = Duration::from_millis(1500);

/// What a rank reports: its error (if any) and how long the collective took.
type Outcome = (Option<Error>, Duration);

fn all_sum_once(g: &crate::group::Group) -> Outcome {
    let start = Instant::now();
    let mut v = vec![1.0f32; 3000];
    (g.all_sum(&mut v).err(), start.elapsed())
}

/// Rank `rank`'s error, which must name `peer`, and how long its call took.
fn failure_naming(out: &[Outcome], rank: usize, peer: usize) -> (&Error, Duration) {
    let (e, t) = &out[rank];
    let e = e
        .as_ref()
        .unwrap_or_else(|| panic!("rank {rank} should fail"));
    assert_eq!(e.peer(), Some(peer), "rank {rank}: {e}");
    (e, *t)
}

/// Injects `fault` into the `message`-th message `from` sends on `connection`, runs
/// [`all_sum_once`] on every rank of `layout` (with a 20 s timeout), and returns rank
/// `rank`'s error, which must be an RDMA error of `op` naming `peer`, with every outcome.
fn injected(
    layout: Layout,
    (from, connection, message, fault): (usize, usize, usize, Fault),
    (rank, peer, op): (usize, usize, PeerOp),
) -> (Error, Vec<Outcome>) {
    let net = Network::new();
    net.inject(from, connection, message, fault);
    let mut out = run_ok(layout.timeout(Duration::from_secs(20)), &net, |_, g| {
        all_sum_once(&g)
    });
    let e = out[rank]
        .0
        .take()
        .unwrap_or_else(|| panic!("rank {rank} fails"));
    assert!(
        matches!(&e, Error::Rdma { peer: p, op: o, .. } if *p == peer && *o == op),
        "rank {rank}: {e}"
    );
    (e, out)
}

#[test]
fn a_dropped_message_times_out_naming_its_sender() {
    let net = Network::new();
    // Rank 1's first message to rank 0 (mesh connection 0) is lost; rank 1 sees success.
    net.inject(1, 0, 0, Fault::Drop);
    let out = run_ok(Layout::mesh(2).timeout(SHORT), &net, |rank, g| {
        let first = all_sum_once(&g);
        if rank == 1 {
            // Rank 1 finished (UC reports a lost message as sent). Had it gone on at once,
            // its next messages would have slid into rank 0's receives for the lost one:
            // without sequence numbers (MLX's wire has none) only a timeout can tell. Once
            // rank 0 gave up, rank 1's next collective learns so at once.
            assert!(first.0.is_none(), "rank 1: {:?}", first.0);
            std::thread::sleep(SHORT * 2);
            return all_sum_once(&g);
        }
        first
    });
    let (e0, t0) = &out[0];
    let e0 = e0.as_ref().expect("rank 0 fails");
    assert!(
        matches!(
            e0,
            Error::Timeout {
                peer: 1,
                op: PeerOp::Receive,
                ..
            }
        ),
        "rank 0: {e0}"
    );
    assert!(*t0 < SHORT * 3, "rank 0 took {t0:?}");
    let (e1, t1) = &out[1];
    let e1 = e1.as_ref().expect("rank 1's next collective fails");
    assert_eq!(e1.peer(), Some(0), "rank 1: {e1}");
    assert!(*t1 < SHORT, "rank 1 took {t1:?}");
}

#[test]
fn a_failed_send_completion_names_the_peer_on_both_sides() {
    let (e1, out) = injected(
        Layout::mesh(2),
        (1, 0, 0, Fault::SendError),
        (1, 0, PeerOp::Send),
    );
    assert!(e1.to_string().contains("injected send error"), "{e1}");
    // Rank 0 waited on rank 1's message; rank 1's failure notice (naming rank 0) tells it at
    // once that rank 1 gave up, long before its 20 s timeout.
    let (e0, t0) = &out[0];
    let e0 = e0.as_ref().expect("rank 0 fails");
    assert!(matches!(e0, Error::Closed { peer: 1, .. }), "rank 0: {e0}");
    assert!(*t0 < Duration::from_secs(5), "rank 0 took {t0:?}");
}

#[test]
fn a_failed_receive_completion_names_the_sender() {
    // Ring of 3, one wire: rank 2's second message on its right wire (connection 1) fails
    // where rank 0 receives it.
    let (_, out) = injected(
        Layout::ring(3, 1),
        (2, 1, 1, Fault::RecvError),
        (0, 2, PeerOp::Receive),
    );
    for (rank, (e, t)) in out.iter().enumerate().skip(1) {
        let e = e
            .as_ref()
            .unwrap_or_else(|| panic!("rank {rank} should fail"));
        assert!(e.is_fatal(), "rank {rank}: {e}");
        assert!(*t < Duration::from_secs(5), "rank {rank} took {t:?}: {e}");
    }
}

/// A rank that vanishes without a word (its process died): rank 0 sees its side channel
/// close and tells the others, which name the lost rank, long before the timeout.
#[test]
fn a_lost_rank_is_named_by_every_survivor_in_a_mesh() {
    let net = Network::new();
    let out = run_ok(
        Layout::mesh(4).timeout(Duration::from_secs(30)),
        &net,
        |rank, g| {
            if rank == 2 {
                std::thread::sleep(Duration::from_millis(100));
                drop(g); // gone, mid-collective for the others
                return (None, Duration::ZERO);
            }
            let first = all_sum_once(&g);
            // The group is failed for good: the next call says so at once.
            let again = g.barrier().unwrap_err();
            assert!(matches!(again, Error::Failed(_)), "rank {rank}: {again}");
            assert_eq!(again.peer(), Some(2), "rank {rank}: {again}");
            first
        },
    );
    for rank in [0, 1, 3] {
        let (e, t) = failure_naming(&out, rank, 2);
        assert!(t < Duration::from_secs(5), "rank {rank} took {t:?}");
        if rank != 0 {
            assert!(
                matches!(
                    e,
                    Error::Lost {
                        peer: 2,
                        via: 0,
                        ..
                    }
                ),
                "rank {rank}: {e}"
            );
        }
    }
}

/// In a ring, only rank 0 has a side channel to every rank, and a plain close may be a rank
/// that finished; the lost rank's neighbours time out naming it, and their notices tell
/// everyone else.
#[test]
fn a_lost_rank_is_named_in_a_ring_within_the_timeout() {
    let net = Network::new();
    let out = run_ok(Layout::ring(4, 2).timeout(SHORT), &net, |rank, g| {
        if rank == 2 {
            drop(g);
            return (None, Duration::ZERO);
        }
        let mut v = vec![1u32; 100_000];
        let start = Instant::now();
        (g.all_sum(&mut v).err(), start.elapsed())
    });
    for rank in [0, 1, 3] {
        let (_, t) = failure_naming(&out, rank, 2);
        assert!(t < SHORT * 3, "rank {rank} took {t:?}");
    }
}

/// A rank that is alive but never joins the collective: the others time out naming it.
#[test]
fn a_silent_rank_is_named_when_the_timeout_expires() {
    let net = Network::new();
    let out = run_ok(Layout::mesh(3).timeout(SHORT), &net, |rank, g| {
        if rank == 1 {
            std::thread::sleep(SHORT * 2);
            // By now the others gave up on it: it learns so from the side channel.
            return all_sum_once(&g);
        }
        all_sum_once(&g)
    });
    for rank in [0, 2] {
        let (_, t) = failure_naming(&out, rank, 1);
        assert!(t >= SHORT / 2 && t < SHORT * 3, "rank {rank} took {t:?}");
    }
    let e1 = out[1].0.as_ref().expect("rank 1 learns the others gave up");
    assert!(e1.is_fatal(), "rank 1: {e1}");
    assert!(out[1].1 < SHORT * 2, "rank 1 took {:?}", out[1].1);
}

#[test]
fn health_names_a_rank_that_is_gone() {
    let net = Network::new();
    let out = run_ok(Layout::mesh(3), &net, |rank, g| {
        if rank == 2 {
            return (None, Duration::ZERO);
        }
        let start = Instant::now();
        loop {
            match g.health() {
                Ok(()) if start.elapsed() < Duration::from_secs(10) => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Ok(()) => return (None, start.elapsed()),
                Err(e) => return (Some(e), start.elapsed()),
            }
        }
    });
    assert_eq!(
        out[0].0.as_ref().and_then(Error::peer),
        Some(2),
        "{:?}",
        out[0].0
    );
    assert_eq!(
        out[1].0.as_ref().and_then(Error::peer),
        Some(2),
        "{:?}",
        out[1].0
    );
}
