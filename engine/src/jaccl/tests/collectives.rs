//! Every collective on the emulated fabric, checked element by element against a reference
//! computed here: P = 2..8 in a mesh, P = 2..8 in a ring of 1..4 wires, all 14 dtypes and
//! three ops at small sizes, and sizes across every buffer class (and MLX's thresholds
//! between algorithms) for a few dtypes.
//!
//! Inputs are a deterministic function of (rank, index, case), so each rank computes the
//! expected result of every rank's contribution by itself. Float inputs are small integers,
//! so every reduction order gives the exact same result and the check is bit for bit.

use std::any::Any;
use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex, OnceLock};

use half::{bf16, f16};

use super::{Layout, run_ok};
use crate::element::{Complex64, Element};
use crate::group::Group;
use crate::jaccl::frames::SizeClasses;
use crate::jaccl::group::Kind;
use crate::reduce::ReduceOp;
use crate::transport::rdma::emulated::Network;

/// Test-side knowledge of an element type.
pub(super) trait TestElem: Element + Copy + PartialEq + Debug + Send + Sync {
    /// A value every reduction order computes exactly.
    fn value(seed: u64) -> Self;
    /// JACCL's reduction, written independently of the crate's kernels.
    fn reduce(op: ReduceOp, acc: Self, inc: Self) -> Self;
}

/// A well-mixed 64-bit hash.
pub(super) fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

macro_rules! int_elem {
    ($($t:ty),*) => {$(
        impl TestElem for $t {
            fn value(seed: u64) -> Self { mix(seed) as $t }
            fn reduce(op: ReduceOp, a: Self, b: Self) -> Self {
                match op {
                    ReduceOp::Sum => a.wrapping_add(b),
                    ReduceOp::Max => if a > b { a } else { b },
                    ReduceOp::Min => if a < b { a } else { b },
                }
            }
        }
    )*};
}
int_elem!(u8, u16, u32, u64, i8, i16, i32, i64);

impl TestElem for bool {
    fn value(seed: u64) -> Self {
        mix(seed) & 1 == 1
    }
    fn reduce(op: ReduceOp, a: Self, b: Self) -> Self {
        match op {
            ReduceOp::Sum | ReduceOp::Max => a || b,
            ReduceOp::Min => a && b,
        }
    }
}

/// Small integers: sums of up to 8 of them are exact in every float type.
fn small(seed: u64) -> f32 {
    (mix(seed) % 17) as f32 - 8.0
}

macro_rules! float_elem {
    ($t:ty, $from:expr, $to:expr) => {
        impl TestElem for $t {
            fn value(seed: u64) -> Self {
                $from(small(seed))
            }
            fn reduce(op: ReduceOp, a: Self, b: Self) -> Self {
                match op {
                    ReduceOp::Sum => $from($to(a) + $to(b)),
                    ReduceOp::Max => {
                        if a > b {
                            a
                        } else {
                            b
                        }
                    }
                    ReduceOp::Min => {
                        if a < b {
                            a
                        } else {
                            b
                        }
                    }
                }
            }
        }
    };
}
float_elem!(f32, |x: f32| x, |x: f32| x);
float_elem!(f64, f64::from, |x: f64| x as f32);
float_elem!(f16, f16::from_f32, f16::to_f32);
float_elem!(bf16, bf16::from_f32, bf16::to_f32);

impl TestElem for Complex64 {
    fn value(seed: u64) -> Self {
        Complex64::new(small(seed), small(seed ^ 0x5555))
    }
    fn reduce(op: ReduceOp, a: Self, b: Self) -> Self {
        let gt = |x: Complex64, y: Complex64| x.re > y.re || (x.re == y.re && x.im > y.im);
        match op {
            ReduceOp::Sum => Complex64::new(a.re + b.re, a.im + b.im),
            ReduceOp::Max => {
                if gt(a, b) {
                    a
                } else {
                    b
                }
            }
            ReduceOp::Min => {
                if gt(b, a) {
                    a
                } else {
                    b
                }
            }
        }
    }
}

/// Rank `rank`'s element `i` in case `case`.
pub(super) fn input<T: TestElem>(case: u64, rank: usize, i: usize) -> T {
    T::value(case.wrapping_mul(0x9E37_79B9) ^ (rank as u64) << 40 ^ i as u64)
}

fn vec_of<T: TestElem>(case: u64, rank: usize, n: usize) -> Vec<T> {
    (0..n).map(|i| input(case, rank, i)).collect()
}

/// Expected results, computed once per case for all the ranks of a group (each rank checks
/// its own result against it).
#[derive(Default)]
pub(super) struct Expected {
    cases: Mutex<HashMap<u64, Arc<Cell>>>,
}

/// One case's expected result, of whatever element type.
type Cell = OnceLock<Arc<dyn Any + Send + Sync>>;

impl Expected {
    fn get<T: TestElem>(&self, case: u64, compute: impl FnOnce() -> Vec<T>) -> Arc<Vec<T>> {
        let cell = self.cases.lock().unwrap().entry(case).or_default().clone();
        let any = cell.get_or_init(|| Arc::new(compute()) as Arc<dyn Any + Send + Sync>);
        any.clone()
            .downcast::<Vec<T>>()
            .expect("one element type per case")
    }

    /// The reduction of every rank's `n` inputs of case `case`.
    fn reduced<T: TestElem>(&self, case: u64, op: ReduceOp, size: usize, n: usize) -> Arc<Vec<T>> {
        self.get(case, || {
            (0..n)
                .map(|i| {
                    (1..size).fold(input::<T>(case, 0, i), |acc, r| {
                        T::reduce(op, acc, input(case, r, i))
                    })
                })
                .collect()
        })
    }
}

fn check_all_reduce<T: TestElem>(g: &Group, x: &Expected, case: u64, op: ReduceOp, n: usize) {
    let (rank, size) = (g.rank(), g.size());
    let mut data = vec_of::<T>(case, rank, n);
    g.all_reduce(op, &mut data)
        .unwrap_or_else(|e| panic!("rank {rank}: {op} of {n} {}: {e}", T::DTYPE));
    let want = x.reduced::<T>(case, op, size, n);
    if let Some(i) = (0..n).find(|&i| data[i] != want[i]) {
        panic!(
            "rank {rank}: {op} of {n} {} (case {case}), element {i}: got {:?}, want {:?}",
            T::DTYPE,
            data[i],
            want[i]
        );
    }
}

fn check_all_gather<T: TestElem>(g: &Group, case: u64, n: usize) {
    let (rank, size) = (g.rank(), g.size());
    let mine = vec_of::<T>(case, rank, n);
    let mut out = vec![input::<T>(0, 0, 0); n * size];
    g.all_gather(&mine, &mut out)
        .unwrap_or_else(|e| panic!("rank {rank}: all_gather of {n} {}: {e}", T::DTYPE));
    for r in 0..size {
        if let Some(i) = (0..n).find(|&i| out[r * n + i] != input(case, r, i)) {
            panic!(
                "rank {rank}: all_gather of {n} {}, block {r} element {i}",
                T::DTYPE
            );
        }
    }
}

fn check_sum_scatter<T: TestElem>(g: &Group, x: &Expected, case: u64, n: usize) {
    let (rank, size) = (g.rank(), g.size());
    let mine = vec_of::<T>(case, rank, n * size);
    let mut out = vec![input::<T>(0, 0, 0); n];
    g.sum_scatter(&mine, &mut out)
        .unwrap_or_else(|e| panic!("rank {rank}: sum_scatter of {n} {}: {e}", T::DTYPE));
    let want = x.reduced::<T>(case, ReduceOp::Sum, size, n * size);
    if let Some(i) = (0..n).find(|&i| out[i] != want[rank * n + i]) {
        panic!(
            "rank {rank}: sum_scatter of {n} {}, element {i}: got {:?}, want {:?}",
            T::DTYPE,
            out[i],
            want[rank * n + i]
        );
    }
}

/// Every (sender, receiver) pair the topology allows, in a global order every rank follows.
fn pairs(size: usize, kind: Kind) -> Vec<(usize, usize)> {
    let mut pairs = Vec::new();
    match kind {
        Kind::Mesh => {
            for a in 0..size {
                for b in 0..size {
                    if a != b {
                        pairs.push((a, b));
                    }
                }
            }
        }
        Kind::Ring { .. } => {
            for a in 0..size {
                let b = (a + 1) % size;
                pairs.push((a, b));
                if size > 2 {
                    pairs.push((b, a));
                }
            }
        }
    }
    pairs
}

fn check_send_recv(g: &Group, kind: Kind, case: u64, n: usize) {
    let rank = g.rank();
    for (k, (from, to)) in pairs(g.size(), kind).into_iter().enumerate() {
        let case = case * 1000 + k as u64;
        if rank == from {
            let data = vec_of::<u8>(case, from, n);
            g.send(&data, to)
                .unwrap_or_else(|e| panic!("rank {rank}: send of {n} to {to}: {e}"));
        } else if rank == to {
            let mut data = vec![0u8; n];
            g.recv(&mut data, from)
                .unwrap_or_else(|e| panic!("rank {rank}: recv of {n} from {from}: {e}"));
            assert!(
                data == vec_of::<u8>(case, from, n),
                "rank {rank}: recv of {n} bytes from {from} differs"
            );
        }
    }
}

/// Small cases of every op, for every dtype (`all`) or a few of each width and kind.
fn every_dtype_and_op(g: &Group, x: &Expected, all: bool) {
    let size = g.size();
    let counts = [1, size.saturating_sub(1).max(1), size, size + 1, 37, 1000];
    let mut case = 1;
    macro_rules! each {
        ($($t:ty),*) => {$(
            for op in ReduceOp::ALL {
                for &n in &counts {
                    case += 1;
                    check_all_reduce::<$t>(g, x, case, op, n);
                }
            }
            case += 1;
            check_all_gather::<$t>(g, case, 5);
            case += 1;
            check_sum_scatter::<$t>(g, x, case, 3);
        )*};
    }
    if all {
        each!(
            bool, u8, u16, u32, u64, i8, i16, i32, i64, f16, bf16, f32, f64, Complex64
        );
    } else {
        each!(bool, i16, bf16, f32, Complex64);
    }
}

/// Byte sizes that reach every size class and cross MLX's thresholds (32 KiB and 64 KiB),
/// each also with a few bytes more, so chunks and frames do not divide evenly.
const BYTES: [usize; 12] = [
    4096,
    8192,
    16384,
    32768,
    32768 + 12,
    65536 + 4,
    131072,
    262144 + 20,
    524288,
    1 << 20,
    (2 << 20) + 8,
    4 << 20,
];

/// Large cases across every size class, for a few dtypes.
fn every_class(g: &Group, x: &Expected, kind: Kind) {
    let size = g.size();
    let mut case = 10_000;
    for bytes in BYTES {
        case += 1;
        check_all_reduce::<f32>(g, x, case, ReduceOp::Sum, bytes / 4);
        if bytes > 1 << 20 {
            // The largest sizes only reach the largest classes; one dtype is enough there.
            continue;
        }
        case += 1;
        check_all_reduce::<u8>(g, x, case, ReduceOp::Max, bytes + 1);
        case += 1;
        check_all_reduce::<f16>(g, x, case, ReduceOp::Min, bytes / 2 + 3);
        // all_gather and sum_scatter over one rank's share of the same bytes.
        let share = (bytes / size).max(1);
        case += 1;
        check_all_gather::<u8>(g, case, share + 1);
        case += 1;
        check_sum_scatter::<i32>(g, x, case, share / 4 + 1);
        case += 1;
        check_sum_scatter::<f32>(g, x, case, share / 4);
    }
    for n in [1, 4095, 4096, 4097, 100_000, 1 << 20] {
        case += 1;
        check_send_recv(g, kind, case, n);
    }
    g.barrier().expect("barrier");
}

/// Every collective on `layout`: all dtypes, or (`all_dtypes` false, for layouts whose small
/// cases take the same path as one already covered) a few.
fn whole_matrix(layout: Layout, all_dtypes: bool) {
    let net = Network::new();
    let x = Expected::default();
    run_ok(layout, &net, |_, g| {
        every_dtype_and_op(&g, &x, all_dtypes);
        every_class(&g, &x, layout.kind);
        // Back to back, without barriers: send/recv of different sizes between collectives
        // (MLX issue #3149's pattern).
        for round in 0..3u64 {
            check_send_recv(&g, layout.kind, 90_000 + round, 10 + 5000 * round as usize);
            check_all_reduce::<f32>(&g, &x, 91_000 + round, ReduceOp::Sum, 3);
        }
    });
    assert!(net.check_wiring().is_ok(), "{:?}", net.check_wiring());
}

#[test]
fn mesh_p2_every_op_dtype_and_class() {
    whole_matrix(Layout::mesh(2), true);
}

#[test]
fn mesh_p3_every_op_dtype_and_class() {
    whole_matrix(Layout::mesh(3), true);
}

#[test]
fn mesh_p4_every_op_dtype_and_class() {
    whole_matrix(Layout::mesh(4), true);
}

#[test]
fn mesh_p5_to_p8_every_op_dtype_and_class() {
    for p in 5..=8 {
        whole_matrix(Layout::mesh(p), p == 8);
    }
}

#[test]
fn ring_p2_one_to_four_wires_every_op_dtype_and_class() {
    for wires in 1..=4 {
        whole_matrix(Layout::ring(2, wires), wires == 1);
    }
}

#[test]
fn ring_p3_one_to_four_wires_every_op_dtype_and_class() {
    for wires in 1..=4 {
        whole_matrix(Layout::ring(3, wires), wires == 2);
    }
}

/// Small all-reduces take one wire whatever the wire count, so every dtype is run on one
/// wire count per size; sum_scatter, all_gather and send/recv use every wire and run on all.
#[test]
fn ring_p4_to_p8_one_to_four_wires_every_op_dtype_and_class() {
    for p in [4, 5, 8] {
        for wires in 1..=4 {
            whole_matrix(Layout::ring(p, wires), wires == 1 && p != 5);
        }
    }
    for p in [6, 7] {
        whole_matrix(Layout::ring(p, 3), false);
    }
}

#[test]
fn macos_26_2_uses_4_kib_messages_throughout() {
    let net = Network::new();
    for layout in [Layout::mesh(3), Layout::ring(3, 2)] {
        let layout = layout.classes(SizeClasses::Small);
        let x = Expected::default();
        run_ok(layout, &net, |_, g| {
            every_class(&g, &x, layout.kind);
        });
    }
}

/// JACCL's max and min let a NaN on either side win for the incoming value. The mesh's
/// small all-reduce folds ranks in order 0, 1, ..., P-1, so the result is exactly the
/// left fold with JACCL's rule, on every rank.
#[test]
fn max_and_min_follow_jaccls_nan_rule_in_rank_order() {
    let net = Network::new();
    let size = 3;
    // Element i on rank r: NaN where the pattern says so, else r + 1.
    let value = |r: usize, i: usize| {
        if i >> r & 1 == 1 {
            f32::NAN
        } else {
            r as f32 + 1.0
        }
    };
    let results = run_ok(Layout::mesh(size), &net, |rank, g| {
        let mut max: Vec<f32> = (0..8).map(|i| value(rank, i)).collect();
        let mut min = max.clone();
        g.all_max(&mut max).unwrap();
        g.all_min(&mut min).unwrap();
        (max, min)
    });
    for i in 0..8 {
        let fold =
            |pick: fn(f32, f32) -> f32| (1..size).fold(value(0, i), |a, r| pick(a, value(r, i)));
        let want_max = fold(|a, b| if a > b { a } else { b });
        let want_min = fold(|a, b| if a < b { a } else { b });
        for (max, min) in &results {
            assert_eq!(max[i].to_bits(), want_max.to_bits(), "max element {i}");
            assert_eq!(min[i].to_bits(), want_min.to_bits(), "min element {i}");
        }
    }
    // Element 4 is NaN on rank 2 only: the last rank's NaN wins over 2.0 (the ring's rule
    // would keep 2.0).
    assert!(results[0].0[4].is_nan());
    // Element 1 is NaN on rank 0 only: rank 1's value replaces it, then rank 2's is larger.
    assert_eq!(results[0].0[1], 3.0);
}

/// Every rank ends with the same bits even for sums that round, because the final values
/// are distributed, not recomputed.
#[test]
fn rounded_float_sums_are_identical_on_every_rank() {
    let net = Network::new();
    for layout in [Layout::mesh(4), Layout::ring(4, 2)] {
        let results = run_ok(layout, &net, |rank, g| {
            let mut v: Vec<f32> = (0..50_000)
                .map(|i| (mix((rank * 1_000_003 + i) as u64) % 10_000) as f32 * 1.0e-3 + 0.1)
                .collect();
            g.all_sum(&mut v).unwrap();
            v.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        });
        for r in &results[1..] {
            assert!(r == &results[0], "{layout:?}: ranks disagree");
        }
    }
}

#[test]
fn ring_send_and_recv_reach_neighbours_only() {
    let net = Network::new();
    run_ok(Layout::ring(4, 1), &net, |rank, g| {
        let far = (rank + 2) % 4;
        let e = g.send(&[1u8], far).unwrap_err();
        assert!(e.to_string().contains("only neighbours"), "{e}");
        assert!(!e.is_fatal());
        let e = g.recv(&mut [0u8], far).unwrap_err();
        assert!(e.to_string().contains("only neighbours"), "{e}");
        g.barrier().unwrap();
    });
}

#[test]
fn empty_collectives_move_nothing() {
    let net = Network::new();
    net.record(false);
    run_ok(Layout::mesh(3), &net, |_, g| {
        g.all_sum::<f32>(&mut []).unwrap();
        g.all_gather::<u8>(&[], &mut []).unwrap();
        g.sum_scatter::<u8>(&[], &mut []).unwrap();
    });
    for rank in 0..3 {
        for conn in 0..3 {
            assert!(net.posted(rank, conn).is_empty());
        }
    }
}

/// The flight record names MLX's schedules: on a mesh of 3, the all-reduce one-shot up to
/// 32 KiB and by scatter-gather past it (`mesh::uses_scatter_gather`), the barrier (an
/// all-reduce of one byte) one-shot, all_gather and sum_scatter direct, send and receive
/// none; on a ring, the ring for every collective.
#[test]
fn the_flight_record_names_mlxs_schedules() {
    let calls = |g: &Group| {
        let me = g.rank();
        g.all_sum(&mut [1.0f32; 4]).unwrap();
        g.all_sum(&mut vec![1.0f32; (32 << 10) / 4 + 1]).unwrap();
        g.barrier().unwrap();
        g.all_gather(&[1u8], &mut [0u8; 3]).unwrap();
        g.sum_scatter(&[1i32; 3], &mut [0i32; 1]).unwrap();
        match me {
            0 => g.send(&[1u8], 1).unwrap(),
            1 => g.recv(&mut [0u8], 0).unwrap(),
            _ => {}
        }
        g.flight_record()
            .entries
            .iter()
            .map(|e| e.algorithm.map(crate::Algorithm::name))
            .collect::<Vec<_>>()
    };
    let net = Network::new();
    for (rank, names) in run_ok(Layout::mesh(3), &net, |_, g| calls(&g))
        .into_iter()
        .enumerate()
    {
        let mut want = vec![
            Some("one_shot"),
            Some("scatter_gather"),
            Some("one_shot"),
            Some("direct"),
            Some("direct"),
        ];
        if rank < 2 {
            want.push(None);
        }
        assert_eq!(names, want, "mesh, rank {rank}");
    }
    let net = Network::new();
    for (rank, names) in run_ok(Layout::ring(3, 1), &net, |_, g| calls(&g))
        .into_iter()
        .enumerate()
    {
        let mut want = vec![Some("ring"); 5];
        if rank < 2 {
            want.push(None);
        }
        assert_eq!(names, want, "ring, rank {rank}");
    }
}
