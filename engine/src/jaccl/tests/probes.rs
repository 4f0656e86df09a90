//! JACCL fires the ring's tracing probes, with the same codes: checked under bpftrace,
//! attached to this test process while emulated groups run collectives. Needs root,
//! bpftrace and tracefs, so it is ignored by default (as `tests/probes.rs` is); asked for
//! with `--ignored`, it fails rather than skips where bpftrace cannot attach.

use nuvec_tools::testing;

use super::{Layout, run_ok};
use crate::transport::rdma::emulated::Network;

#[test]
#[ignore = "needs root, bpftrace and tracefs; run with --ignored where they are"]
fn jaccl_fires_the_ring_s_probes_under_bpftrace() {
    if let Err(why) = testing::bpftrace_can_attach() {
        panic!("bpftrace cannot attach here: {why}");
    }
    // Op codes as tools/trace/ documents them: 0 all_sum, 3 all_gather, 7 barrier.
    let script = "usdt::nuvec:collective_start /arg0 == 0 && arg2 == 256/ { @sum_starts = count(); } \
                  usdt::nuvec:collective_done /arg0 == 0 && arg1 == 11 && arg2 == 256 && arg3 == 2 && arg5 == 1/ { @sums = count(); } \
                  usdt::nuvec:collective_done /arg0 == 3 && arg1 == 255 && arg5 == 1/ { @gathers = count(); } \
                  usdt::nuvec:collective_start /arg0 == 7/ { @barrier_starts = count(); } \
                  usdt::nuvec:collective_done /arg0 == 7 && arg5 == 1/ { @barriers = count(); } \
                  usdt::nuvec:collective_done /arg0 == 0 && arg2 != 256/ { @other_sums = count(); }";
    let tracer = testing::Bpftrace::attach(std::process::id(), script);

    // Two ranks (threads of this process) per layout: 5 all_sums of 64 f32, an all_gather
    // and 2 barriers each.
    for layout in [Layout::mesh(2), Layout::ring(2, 1)] {
        run_ok(layout, &Network::new(), |rank, g| {
            for _ in 0..5 {
                let mut x = [rank as f32; 64];
                g.all_sum(&mut x).unwrap();
                assert_eq!(x, [1.0; 64]);
            }
            let mut all = [0u8; 2];
            g.all_gather(&[rank as u8], &mut all).unwrap();
            assert_eq!(all, [0, 1]);
            g.barrier().unwrap();
            g.barrier().unwrap();
        });
    }

    let (status, text) = tracer.stop();
    let count = |map: &str| testing::traced_count(&text, &format!("@{map}: "));
    // 2 layouts x 2 ranks.
    assert_eq!(
        (count("sum_starts"), count("sums")),
        (20, 20),
        "all_sum of 64 float32 (dtype 11) over 2 ranks ({status}):\n{text}"
    );
    assert_eq!(count("gathers"), 4, "all_gather as bytes:\n{text}");
    assert_eq!(
        (count("barrier_starts"), count("barriers")),
        (8, 8),
        "barriers as op 7:\n{text}"
    );
    assert_eq!(
        count("other_sums"),
        0,
        "barriers traced as all_sums:\n{text}"
    );
}
