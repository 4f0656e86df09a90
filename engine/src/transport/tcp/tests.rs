//! A group's connections over real loopback sockets: what a rank does with an urgent byte
//! that reaches it while it waits on another connection.

use std::thread;
use std::time::{Duration, Instant};

use super::Connections;
use super::notice::Inquiry;
use crate::comm::progress::Spin;
use crate::config::env;
use crate::native::tests::loopback_mesh;
use crate::options::Options;

/// Rank `rank`'s connections of a loopback mesh of `size`, on the driver
/// `NUVEC_DISTRIBUTED_IO` names (epoll if unset): the test runs on io_uring too.
fn meshes(size: usize, timeout: Duration) -> Vec<Connections> {
    let io = env::io(&env::process, Options::default().io).expect("a valid event loop");
    loopback_mesh(size, 1, timeout)
        .into_iter()
        .map(|mut f| {
            f.transport
                .select_io(io)
                .expect("the driver the environment names");
            f.transport
        })
        .collect()
}

/// Rank 1 waits for rank 2, which sends nothing; rank 0, whose collective timed out, asks
/// rank 1 whether it is alive. Rank 1 must answer within the grace rank 0 gives it, or rank
/// 0 names it stalled although it is alive (a wrong blame, seen on io_uring at P = 5 when a
/// link was cut). Epoll reports the byte with the arrival; io_uring's polls cannot, so its
/// steps and waits end at [`Inquiry::answer_within`] to look for it.
#[test]
fn a_rank_waiting_on_one_neighbour_answers_another_s_query_within_the_grace() {
    let timeout = Duration::from_secs(4);
    let grace = Inquiry::grace(timeout);
    let mut ranks = meshes(3, timeout).into_iter();
    let (mut r0, mut r1, _r2) = (
        ranks.next().unwrap(),
        ranks.next().unwrap(),
        ranks.next().unwrap(),
    );
    let (from0, from2, to1) = (r1.recv_conn(0), r1.recv_conn(2), r0.send_conn(1));
    thread::scope(|s| {
        let waiter = s.spawn(move || {
            let deadline = Instant::now() + timeout;
            let look = Some(Inquiry::answer_within(timeout));
            let mut buf = [0u8; 16];
            while Instant::now() < deadline && !r1.conn(from0).notices.spoke() {
                if r1.can_step() {
                    let spin = Spin {
                        total: Duration::ZERO,
                        eager: Duration::ZERO,
                    };
                    let stepped = r1
                        .step(None, Some((from2, &mut buf)), (deadline, look), spin)
                        .expect("a step");
                    assert!(
                        matches!(stepped.received, Ok(super::Transfer::Blocked)),
                        "rank 2 sent nothing: {:?}",
                        stepped.received
                    );
                } else {
                    r1.wait(deadline, look).expect("a wait");
                }
            }
            // Kept open until rank 0 has read the answer: closing with the query's
            // position unread would reset the connection and destroy the answer.
            (r1.conn(from0).notices.spoke(), r1)
        });
        // Rank 1 is inside its wait by now (and if not, the query waits for it).
        thread::sleep(Duration::from_millis(50));
        let asked = Instant::now();
        let conn = r0.conn(to1);
        conn.notices.start_inquiry();
        conn.flush_urgent();
        while !conn.notices.answered() {
            assert!(
                asked.elapsed() < grace,
                "rank 1 did not answer within the grace ({grace:?})"
            );
            thread::sleep(Duration::from_millis(1));
            conn.take_notice();
        }
        let (heard, _r1) = waiter.join().expect("rank 1's thread");
        assert!(heard, "rank 1 heard the query");
    });
}

/// Rank 2 asks rank 1 (which takes the query and answers), then gives up naming rank 0,
/// leaving its notice right before its close. Rank 1, reading on, must take the notice
/// before its read passes it and finds the close: from then on rank 1's reads of rank 2
/// are plain `recv(2)`s (an io_uring receive is refused where a taken byte stood), which
/// skip an urgent byte at their start, so on io_uring the read looks first.
#[test]
fn a_notice_right_before_a_close_is_taken_after_a_query() {
    let timeout = Duration::from_secs(4);
    let mut ranks = meshes(3, timeout).into_iter();
    let (_r0, mut r1, mut r2) = (
        ranks.next().unwrap(),
        ranks.next().unwrap(),
        ranks.next().unwrap(),
    );
    let (from2, to1) = (r1.recv_conn(2), r2.send_conn(1));
    let deadline = Instant::now() + timeout;
    let look = Some(Inquiry::answer_within(timeout));
    let conn = r2.conn(to1);
    conn.notices.start_inquiry();
    conn.flush_urgent();
    while !r1.conn(from2).notices.spoke() {
        assert!(Instant::now() < deadline, "rank 1 never took the query");
        r1.wait(deadline, look).expect("a wait");
        r1.conn(from2).take_notice();
    }
    let conn = r2.conn(to1);
    assert!(
        conn.notices.abandon(Some(0)),
        "a notice naming rank 0 is due"
    );
    conn.flush_urgent();
    assert!(!conn.notices.notice_pending(), "the notice went out");
    conn.stream
        .shutdown(std::net::Shutdown::Write)
        .expect("closing rank 2's side");
    // Both have arrived before rank 1 reads.
    thread::sleep(Duration::from_millis(50));
    let mut buf = [0u8; 64];
    loop {
        assert!(Instant::now() < deadline, "rank 1 never saw the close");
        r1.wait(deadline, look).expect("a wait");
        match r1.conn(from2).read(&mut buf).expect("a read") {
            super::Transfer::Closed => break,
            super::Transfer::Blocked => {}
            super::Transfer::Moved(n) => panic!("rank 2 sent no data, yet {n} bytes came"),
        }
    }
    assert_eq!(
        r1.conn(from2).notices.notice(),
        Some(0),
        "the notice was taken"
    );
}
