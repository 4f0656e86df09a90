//! `close()` from another thread aborts a collective in flight: the call returns
//! [`Error::Aborted`] promptly, later calls get [`Error::GroupClosed`], and the peers, which
//! join late, name the rank that closed.

use std::sync::Barrier;
use std::time::{Duration, Instant};

use super::{Layout, run_ok};
use crate::error::{Error, Fault, Phase};
use crate::transport::rdma::emulated::Network;

/// What rank 0 measured: the collective's error, how long after `close()` it returned, and
/// how long `health()` from the other thread took while the collective ran.
struct Aborted {
    result: crate::error::Result<()>,
    /// When the all_sum returned, relative to `close()`: negative if before.
    after_close: Option<Duration>,
    health: Duration,
    healthy: bool,
    /// Whether later calls said the group is closed.
    later_closed: bool,
}

/// Rank 0 runs an all_sum of `elems` f32 that the others join only after it gave up;
/// another thread of rank 0 checks health and closes the group 200 ms in.
fn abort_from_another_thread(layout: Layout, elems: usize) {
    let net = Network::new();
    // Rank 0 is through with its group before the others start their all_sum.
    let closed = Barrier::new(layout.size);
    let out = run_ok(layout, &net, |rank, g| {
        if rank != 0 {
            closed.wait();
            let start = Instant::now();
            let error = g
                .all_sum(&mut vec![1.0f32; elems])
                .expect_err("rank 0 closed the group");
            return (None, Some((error, start.elapsed())));
        }
        let (result, returned, (health, health_took, closed_at)) = std::thread::scope(|s| {
            let closer = s.spawn(|| {
                std::thread::sleep(Duration::from_millis(200));
                let start = Instant::now();
                let health = g.health();
                let health_took = start.elapsed();
                let closed_at = Instant::now();
                g.close().unwrap();
                (health, health_took, closed_at)
            });
            let result = g.all_sum(&mut vec![1.0f32; elems]);
            let returned = Instant::now();
            (result, returned, closer.join().unwrap())
        });
        let later_closed = matches!(g.barrier(), Err(Error::GroupClosed))
            && matches!(g.health(), Err(Error::GroupClosed));
        // Nothing above panics, so the others are never left waiting here.
        closed.wait();
        let measured = Aborted {
            result,
            after_close: returned.checked_duration_since(closed_at),
            health: health_took,
            healthy: health.is_ok(),
            later_closed,
        };
        (Some(measured), None)
    });
    let a = out[0].0.as_ref().expect("rank 0 measured");
    let error = a.result.as_ref().expect_err("the all_sum was aborted");
    let after_close = a.after_close.expect("the all_sum returned after close()");
    println!(
        "{layout:?}: aborted {after_close:?} after close(), health() took {:?}: {error}",
        a.health
    );
    assert!(
        matches!(
            error,
            Error::Aborted {
                context: Phase::AllSum
            }
        ),
        "{error}"
    );
    assert_eq!(error.fault(), Fault::Closed);
    assert!(after_close < Duration::from_secs(1), "{after_close:?}");
    assert!(a.later_closed, "later calls say the group is closed");
    assert!(a.health < Duration::from_secs(1), "{:?}", a.health);
    assert!(a.healthy, "nobody failed: health is fine while a call runs");
    for (rank, (_, peer)) in out.iter().enumerate().skip(1) {
        let (e, took) = peer.as_ref().expect("a peer's error");
        println!("rank {rank}: {e} after {took:?}");
        assert_eq!(e.peer(), Some(0), "rank {rank}: {e}");
        assert!(*took < Duration::from_secs(5), "rank {rank} took {took:?}");
    }
}

#[test]
fn close_from_another_thread_aborts_a_mesh_all_sum() {
    abort_from_another_thread(Layout::mesh(3), 3000);
}

#[test]
fn close_from_another_thread_aborts_a_ring_all_sum() {
    abort_from_another_thread(Layout::ring(3, 2), 1 << 20);
}
