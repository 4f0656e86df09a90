//! The ring's collectives across real processes on loopback, checked against a reference
//! computed here, independently of the crate's own reduction code.
//!
//! The matrix runs every dtype and op for P = 1..=5 ranks and C = 1, 2 connections, with
//! element counts around P and across the sizes where MLX splits an all-reduce into 2, 3 and
//! 4 parallel rings. Values are chosen so that every reduction order gives the same exact
//! result (small integers for floats, any bits for integers), so the result can be compared
//! bit for bit with a plain left fold. Float results under real rounding are checked
//! separately for agreement across ranks and reruns.

use std::fmt::Debug;
use std::hash::{DefaultHasher, Hash, Hasher};

use nuvec_distributed_engine::{Complex64, Element, Error, Group, ReduceOp, bf16, f16};
use nuvec_tools::test_cases;
use nuvec_tools::testing::Launch;
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};

/// MLX's `min_send_size`: the unit of its split into parallel rings.
const MIN_SEND: usize = 262_144;

/// Test-side knowledge of an element type: exact values and a plain reference reduction.
trait TestElem: Element + Debug + Default {
    /// A value every reduction order computes exactly.
    fn exact(rng: &mut SmallRng) -> Self;
    /// A value with real rounding.
    fn noisy(rng: &mut SmallRng) -> Self;
    fn reduce(op: ReduceOp, a: Self, b: Self) -> Self;
    fn bits(self) -> u64;
}

macro_rules! int_elem {
    ($($t:ty),*) => {$(
        impl TestElem for $t {
            fn exact(rng: &mut SmallRng) -> Self { rng.random() }
            fn noisy(rng: &mut SmallRng) -> Self { rng.random() }
            fn reduce(op: ReduceOp, a: Self, b: Self) -> Self {
                match op {
                    ReduceOp::Sum => a.wrapping_add(b),
                    ReduceOp::Max => a.max(b),
                    ReduceOp::Min => a.min(b),
                }
            }
            fn bits(self) -> u64 { self as u64 }
        }
    )*};
}
int_elem!(u8, u16, u32, u64, i8, i16, i32, i64);

impl TestElem for bool {
    fn exact(rng: &mut SmallRng) -> Self {
        rng.random()
    }
    fn noisy(rng: &mut SmallRng) -> Self {
        rng.random()
    }
    fn reduce(op: ReduceOp, a: Self, b: Self) -> Self {
        match op {
            ReduceOp::Sum | ReduceOp::Max => a || b,
            ReduceOp::Min => a && b,
        }
    }
    fn bits(self) -> u64 {
        self as u64
    }
}

/// An integer in -25..=25 from the low 16 bits of `r` (the modulo's bias is of no concern
/// here): floats of every width add such values exactly in any order. Cheaper than
/// `random_range`, which was an eighth of the matrix's time.
fn small_int(r: u32) -> i32 {
    (r & 0xffff) as i32 % 51 - 25
}

macro_rules! float_elem {
    ($t:ty, $from:expr, $to:expr, $bits:expr) => {
        impl TestElem for $t {
            fn exact(rng: &mut SmallRng) -> Self {
                $from(small_int(rng.next_u32()) as f64)
            }
            fn noisy(rng: &mut SmallRng) -> Self {
                $from(rng.random_range(-100.0f64..100.0))
            }
            fn reduce(op: ReduceOp, a: Self, b: Self) -> Self {
                let (x, y): (f64, f64) = ($to(a), $to(b));
                match op {
                    ReduceOp::Sum => $from(x + y),
                    ReduceOp::Max => {
                        if x < y {
                            b
                        } else {
                            a
                        }
                    }
                    ReduceOp::Min => {
                        if y < x {
                            b
                        } else {
                            a
                        }
                    }
                }
            }
            fn bits(self) -> u64 {
                $bits(self)
            }
        }
    };
}
float_elem!(
    f32,
    |v: f64| v as f32,
    |v: f32| v as f64,
    |v: f32| v.to_bits() as u64
);
float_elem!(f64, |v: f64| v, |v: f64| v, f64::to_bits);
// Half precision converts through f32, which has hardware conversions (F16C) where f64 has
// none: the values reduced here are small integers, exact in all three widths.
float_elem!(
    f16,
    |v: f64| f16::from_f32(v as f32),
    |v: f16| v.to_f64(),
    |v: f16| v.to_bits() as u64
);
float_elem!(
    bf16,
    |v: f64| bf16::from_f32(v as f32),
    |v: bf16| v.to_f64(),
    |v: bf16| v.to_bits() as u64
);

impl TestElem for Complex64 {
    fn exact(rng: &mut SmallRng) -> Self {
        let r = rng.next_u32();
        Complex64::new(small_int(r) as f32, small_int(r >> 16) as f32)
    }
    fn noisy(rng: &mut SmallRng) -> Self {
        Complex64::new(
            rng.random_range(-100.0..100.0),
            rng.random_range(-100.0..100.0),
        )
    }
    fn reduce(op: ReduceOp, a: Self, b: Self) -> Self {
        let key = |c: Complex64| (c.re, c.im);
        match op {
            ReduceOp::Sum => Complex64::new(a.re + b.re, a.im + b.im),
            ReduceOp::Max => {
                if key(a) < key(b) {
                    b
                } else {
                    a
                }
            }
            ReduceOp::Min => {
                if key(b) < key(a) {
                    b
                } else {
                    a
                }
            }
        }
    }
    fn bits(self) -> u64 {
        (self.re.to_bits() as u64) << 32 | self.im.to_bits() as u64
    }
}

fn exact_input<T: TestElem>(rank: usize, salt: u64, n: usize) -> Vec<T> {
    let mut rng = SmallRng::seed_from_u64(salt.wrapping_mul(1_000_003) ^ rank as u64);
    (0..n).map(|_| T::exact(&mut rng)).collect()
}

/// Every rank's input of an exact case folded left to right with `op` over `range` of each
/// input, and this rank's whole input. One input is held at a time: at P = 5 the largest case
/// is 5 M elements per rank, and keeping all of them made page faults a tenth of the
/// matrix's time.
fn exact_case<T: TestElem>(
    op: ReduceOp,
    (rank, size): (usize, usize),
    salt: u64,
    n: usize,
    range: std::ops::Range<usize>,
) -> (Vec<T>, Vec<T>) {
    let mine = exact_input(rank, salt, n);
    let mut want = if rank == 0 {
        mine[range.clone()].to_vec()
    } else {
        exact_input::<T>(0, salt, n)[range.clone()].to_vec()
    };
    for q in 1..size {
        let fold = |input: &[T], want: &mut Vec<T>| {
            for (w, &x) in want.iter_mut().zip(&input[range.clone()]) {
                *w = T::reduce(op, *w, x);
            }
        };
        if q == rank {
            fold(&mine, &mut want);
        } else {
            fold(&exact_input(q, salt, n), &mut want);
        }
    }
    (mine, want)
}

fn assert_same_bits<T: TestElem>(what: &str, got: &[T], want: &[T]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = (0..got.len()).find(|&i| got[i].bits() != want[i].bits()) {
        panic!(
            "{what}: element {i} of {} is {:?}, expected {:?}",
            got.len(),
            got[i],
            want[i]
        );
    }
}

/// The element counts of the matrix for one dtype: around P, a few odd sizes, and on both
/// sides of each size where MLX splits an all-reduce into k parallel rings.
fn reduce_counts(size: usize, connections: usize, elem: usize) -> Vec<usize> {
    let mut counts = vec![0, 1, size.saturating_sub(1), size, size + 1, 1000, 4099];
    for k in 2..=(2 * connections).min(4) {
        let n = k * size * MIN_SEND / elem;
        counts.extend([n - 1, n]);
    }
    counts.sort_unstable();
    counts.dedup();
    counts
}

fn gather_counts(connections: usize, elem: usize) -> Vec<usize> {
    let mut counts = vec![0, 1, 3, 1000, 4099];
    for k in 2..=(2 * connections).min(4) {
        counts.push(k * MIN_SEND / elem + 1);
    }
    counts
}

fn check_type<T: TestElem>(g: &Group, connections: usize, salt: u64) {
    let (rank, size) = (g.rank(), g.size());
    let name = T::DTYPE.name();
    for (o, op) in ReduceOp::ALL.into_iter().enumerate() {
        for n in reduce_counts(size, connections, T::DTYPE.size()) {
            let salt = salt ^ (o as u64) << 40 ^ (n as u64) << 8;
            let (mut data, want) = exact_case::<T>(op, (rank, size), salt, n, 0..n);
            g.all_reduce(op, &mut data)
                .unwrap_or_else(|e| panic!("all_{op} {name} x{n}: {e}"));
            assert_same_bits(&format!("all_{op} {name} x{n}"), &data, &want);
        }
    }
    for n in gather_counts(connections, T::DTYPE.size()) {
        let salt = salt ^ 0x6a ^ (n as u64) << 8;
        let inputs: Vec<Vec<T>> = (0..size).map(|q| exact_input(q, salt, n)).collect();
        let mut out = vec![T::default(); n * size];
        g.all_gather(&inputs[rank], &mut out)
            .unwrap_or_else(|e| panic!("all_gather {name} x{n}: {e}"));
        assert_same_bits(&format!("all_gather {name} x{n}"), &out, &inputs.concat());
    }
    let scatter_counts = [0, 1, 7, 1000, 2 * MIN_SEND / T::DTYPE.size() + 3];
    for c in scatter_counts {
        let salt = salt ^ 0x5c ^ (c as u64) << 8;
        let range = rank * c..(rank + 1) * c;
        let (mine, want) = exact_case::<T>(ReduceOp::Sum, (rank, size), salt, c * size, range);
        let mut out = vec![T::default(); c];
        g.sum_scatter(&mine, &mut out)
            .unwrap_or_else(|e| panic!("sum_scatter {name} x{c}: {e}"));
        assert_same_bits(&format!("sum_scatter {name} x{c}"), &out, &want);
    }
}

/// Sends `mine` to `to` and receives as many elements from `from`, sending first when
/// `send_first`; returns what arrived.
fn exchange(g: &Group, mine: &[i32], (to, from): (usize, usize), send_first: bool) -> Vec<i32> {
    let mut got = vec![0i32; mine.len()];
    if send_first {
        g.send(mine, to).unwrap();
        g.recv(&mut got, from).unwrap();
    } else {
        g.recv(&mut got, from).unwrap();
        g.send(mine, to).unwrap();
    }
    got
}

/// Every rank sends to its right neighbour and receives from its left; even ranks send
/// first, so messages larger than the socket buffers cannot deadlock.
fn check_send_recv(g: &Group) {
    let (rank, size) = (g.rank(), g.size());
    if size == 1 {
        assert!(g.send(&[1u8], 0).is_err());
        return;
    }
    let (left, right) = ((rank + size - 1) % size, (rank + 1) % size);
    for n in [0usize, 1, 1023, 1024, 1025, 5000, 1 << 20] {
        let mine: Vec<i32> = exact_input(rank, 77 + n as u64, n);
        let theirs: Vec<i32> = exact_input(left, 77 + n as u64, n);
        let got = exchange(g, &mine, (right, left), rank.is_multiple_of(2));
        assert_same_bits(&format!("recv from {left} x{n}"), &got, &theirs);
    }
    if size >= 4 {
        let far = (rank + 2) % size;
        let e = g.send(&[1u8], far).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        assert!(e.to_string().contains("neighbours"), "{e}");
        // An argument error leaves the group usable.
        let mut x = [1u32];
        g.all_sum(&mut x).unwrap();
        assert_eq!(x, [size as u32]);
    }
}

/// On the native wire every rank may send to any other: each rank sends to the rank
/// `hop` places to its right and receives from the one `hop` places to its left, for every
/// hop. Those transfers form cycles (of `size / gcd(size, hop)` ranks); along each cycle,
/// ranks at even positions send first and those at odd ones receive first, so no rank
/// waits on one that is also waiting, whatever the message size.
fn check_send_recv_any(g: &Group) {
    let (rank, size) = (g.rank(), g.size());
    for hop in 1..size {
        let (to, from) = ((rank + hop) % size, (rank + size - hop) % size);
        // This rank's position along its cycle: steps of `hop` from the cycle's lowest rank.
        let mut at = (0..size).find(|&r| (0..size).any(|k| (r + k * hop) % size == rank));
        let mut position = 0;
        while let Some(r) = at
            && r != rank
        {
            at = Some((r + hop) % size);
            position += 1;
        }
        for n in [0usize, 1, 1025, 70_000] {
            let salt = (hop as u64) << 32 | n as u64;
            let mine: Vec<i32> = exact_input(rank, salt, n);
            let theirs: Vec<i32> = exact_input(from, salt, n);
            let got = exchange(g, &mine, (to, from), position % 2 == 0);
            assert_same_bits(&format!("recv from {from} x{n}"), &got, &theirs);
        }
    }
}

/// [`check_type`] of every element type, each with its own salt; with `every_type` false,
/// of three only (one per reduction kernel family: integer, half float, complex).
fn check_types(g: &Group, connections: usize, every_type: bool) {
    if every_type {
        check_type::<bool>(g, connections, 1);
        check_type::<u8>(g, connections, 2);
        check_type::<u16>(g, connections, 3);
        check_type::<u32>(g, connections, 4);
        check_type::<u64>(g, connections, 5);
        check_type::<i8>(g, connections, 6);
        check_type::<i16>(g, connections, 7);
    }
    check_type::<i32>(g, connections, 8);
    if every_type {
        check_type::<i64>(g, connections, 9);
        check_type::<f16>(g, connections, 10);
    }
    check_type::<bf16>(g, connections, 11);
    if every_type {
        check_type::<f32>(g, connections, 12);
        check_type::<f64>(g, connections, 13);
    }
    check_type::<Complex64>(g, connections, 14);
}

/// The whole matrix on the native wire (`NUVEC_DISTRIBUTED_WIRE=native`): the same types,
/// ops and counts, which cross its switches between algorithms (a few elements, a few
/// KiB, past a MiB), and send/recv between any two ranks. With `every_type` false, three
/// types only ([`check_types`]), for eight ranks on a small machine; the in-process tests
/// of `native` cover every type at P = 8.
fn native_matrix(name: &str, size: usize, connections: usize, every_type: bool) {
    Launch::new(size, connections)
        .env("NUVEC_DISTRIBUTED_WIRE", "native")
        .all_ok(name, |g| {
            assert_eq!(g.size(), size);
            check_types(&g, connections, every_type);
            check_send_recv_any(&g);
            g.barrier().unwrap();
        });
}

/// The matrix on MLX's wire: every type, and send/recv between neighbours.
fn matrix(name: &str, size: usize, connections: usize) {
    Launch::new(size, connections).all_ok(name, |g| {
        assert_eq!(g.size(), size);
        check_types(&g, connections, true);
        check_send_recv(&g);
        g.barrier().unwrap();
    });
}

test_cases!(native_matrix {
    native_matrix_p1_c1: 1, 1, true;
    native_matrix_p2_c1: 2, 1, true;
    native_matrix_p2_c2: 2, 2, true;
    native_matrix_p3_c1: 3, 1, true;
    native_matrix_p4_c2: 4, 2, true;
    native_matrix_p5_c1: 5, 1, true;
    native_matrix_p6_c1: 6, 1, false;
    native_matrix_p8_c1: 8, 1, false;
});

test_cases!(matrix {
    matrix_p1_c1: 1, 1;
    matrix_p2_c1: 2, 1;
    matrix_p2_c2: 2, 2;
    matrix_p3_c1: 3, 1;
    matrix_p3_c2: 3, 2;
    matrix_p4_c1: 4, 1;
    matrix_p4_c2: 4, 2;
    matrix_p5_c1: 5, 1;
    matrix_p5_c2: 5, 2;
});

fn fingerprint<T: TestElem>(data: &[T]) -> u64 {
    let mut h = DefaultHasher::new();
    for x in data {
        x.bits().hash(&mut h);
    }
    h.finish()
}

fn float_agreement<T: TestElem>(g: &Group, n: usize) {
    let mut rng = SmallRng::seed_from_u64(0xf10a7 ^ g.rank() as u64 ^ (n as u64) << 20);
    let input: Vec<T> = (0..n).map(|_| T::noisy(&mut rng)).collect();
    for op in ReduceOp::ALL {
        let mut first = input.clone();
        g.all_reduce(op, &mut first).unwrap();
        let mut again = input.clone();
        g.all_reduce(op, &mut again).unwrap();
        assert_same_bits(
            &format!("rerun of all_{op} {} x{n}", T::DTYPE.name()),
            &again,
            &first,
        );
        println!(
            "BITS {op} {} {n} {:016x}",
            T::DTYPE.name(),
            fingerprint(&first)
        );
    }
}

/// Sums with real rounding: MLX's schedule fixes each segment's reduction order, and the
/// owner's result is what everyone receives, so every rank must hold the same bits, and a
/// rerun must reproduce them. On the native wire (`native`), whichever algorithm the size
/// picks.
fn float_sums_agree(name: &str, size: usize, connections: usize, native: bool) {
    let mut launch = Launch::new(size, connections);
    if native {
        launch = launch.env("NUVEC_DISTRIBUTED_WIRE", "native");
    }
    let outputs = launch.all_ok(name, |g| {
        for n in [1, 4099, 3 * size * MIN_SEND / 4 + 5] {
            float_agreement::<f16>(&g, n);
            float_agreement::<bf16>(&g, n);
            float_agreement::<f32>(&g, n);
            float_agreement::<f64>(&g, n);
            float_agreement::<Complex64>(&g, n);
        }
    });
    if let Some(first) = outputs.first() {
        let want = first.lines("BITS");
        assert!(!want.is_empty());
        for o in &outputs {
            assert_eq!(
                o.lines("BITS"),
                want,
                "rank {} disagrees with rank 0",
                o.rank
            );
        }
    }
}

test_cases!(float_sums_agree {
    native_float_sums_agree_p2: 2, 1, true;
    native_float_sums_agree_p4: 4, 1, true;
    float_sums_agree_p3_c2: 3, 2, false;
    float_sums_agree_p4_c1: 4, 1, false;
});
