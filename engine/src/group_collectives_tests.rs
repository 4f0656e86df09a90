//! broadcast, all_to_all and the allocating conveniences through [`Group`], on rings of
//! threads over loopback formed by `init_with`, on both wires: every root, every P from 1
//! to 6, several dtypes, and sizes around the ring's chunk and the native wire's switch.

use std::time::Duration;

use super::*;
use crate::element::Complex64;
use crate::options::{Backend, Options};
use half::bf16;

/// Runs `body` on every rank of a group of `size` threads on `wire`.
fn on_group(size: usize, wire: Backend, body: impl Fn(&Group) + Sync) {
    let ports = nuvec_tools::testing::free_ports(size, 1);
    let nodes = nuvec_tools::testing::loopback_nodes(&ports);
    let options = Options::default()
        .backend(wire)
        .timeout(Duration::from_secs(20));
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..size)
            .map(|rank| {
                let (nodes, options, body) = (&nodes, &options, &body);
                s.spawn(move || {
                    let g = crate::init_with(nodes, rank, options).expect("a group");
                    body(&g);
                    // No rank drops its connections while another still uses them.
                    g.barrier().expect("the closing barrier");
                })
            })
            .collect();
        for h in handles {
            h.join().expect("a rank's thread");
        }
    });
}

/// Element values a test can make from a number, distinct enough that a wrong block or
/// offset shows.
trait Make: Element + Default + PartialEq + fmt::Debug {
    fn make(n: u64) -> Self;
}

impl Make for u8 {
    fn make(n: u64) -> Self {
        (n ^ (n >> 8)) as u8
    }
}
impl Make for bool {
    fn make(n: u64) -> Self {
        (n ^ (n >> 3)) & 1 == 1
    }
}
impl Make for f32 {
    fn make(n: u64) -> Self {
        n as f32 * 0.5 - 7.0
    }
}
impl Make for bf16 {
    fn make(n: u64) -> Self {
        bf16::from_f32((n % 251) as f32)
    }
}
impl Make for Complex64 {
    fn make(n: u64) -> Self {
        Complex64::new(n as f32, -(n as f32))
    }
}

fn values<T: Make>(who: usize, len: usize) -> Vec<T> {
    (0..len as u64)
        .map(|i| T::make(i * 7 + who as u64 * 1_000_003))
        .collect()
}

fn broadcast_every_root<T: Make>(g: &Group, lens: &[usize]) {
    for root in 0..g.size() {
        for &len in lens {
            let mut data = values::<T>(g.rank() + 50, len);
            if g.rank() == root {
                data = values(root, len);
            }
            g.broadcast(&mut data, root)
                .unwrap_or_else(|e| panic!("rank {}: broadcast from {root}: {e}", g.rank()));
            assert!(
                data == values::<T>(root, len),
                "rank {} of {}: a broadcast of {len} {} from {root} left other values",
                g.rank(),
                g.size(),
                T::DTYPE
            );
        }
    }
}

fn all_to_all_blocks<T: Make>(g: &Group, blocks: &[usize]) {
    let (me, p) = (g.rank(), g.size());
    for &block in blocks {
        let input: Vec<T> = (0..p).flat_map(|j| values(me * 16 + j, block)).collect();
        let mut output = vec![T::default(); input.len()];
        g.all_to_all(&input, &mut output)
            .unwrap_or_else(|e| panic!("rank {me}: all_to_all of {block}: {e}"));
        let want: Vec<T> = (0..p).flat_map(|i| values(i * 16 + me, block)).collect();
        assert!(
            output == want,
            "rank {me} of {p}: all_to_all of {block} {} per block",
            T::DTYPE
        );
    }
}

/// Everything at one P on one wire: the lengths cross the ring's broadcast chunk (256 KiB,
/// so several pipeline steps) and the native wire's switch to scatter + all-gather (32 KiB).
fn everything(size: usize, wire: Backend) {
    on_group(size, wire, |g| {
        broadcast_every_root::<u8>(g, &[0, 1, 5, 32 << 10, (32 << 10) + 1]);
        broadcast_every_root::<f32>(g, &[3, 8 << 10, (8 << 10) + 1]);
        broadcast_every_root::<bool>(g, &[9]);
        broadcast_every_root::<Complex64>(g, &[2, 1000]);
        all_to_all_blocks::<u8>(g, &[0, 1, 3, 5000]);
        all_to_all_blocks::<bf16>(g, &[2, 700]);
        all_to_all_blocks::<bool>(g, &[4]);
        // Several ring chunks and a length that is not a whole chunk, from the last root.
        let big = (2 << 20) / 4 + 3;
        let root = size - 1;
        let mut data = values::<f32>(g.rank(), big);
        broadcast(&mut data, root, Some(g)).expect("a large broadcast");
        assert!(
            data == values::<f32>(root, big),
            "rank {}: large broadcast",
            g.rank()
        );
        let mut output = vec![0.0f32; size * 20_000];
        let input: Vec<f32> = (0..size)
            .flat_map(|j| values(g.rank() * 16 + j, 20_000))
            .collect();
        all_to_all(&input, &mut output, Some(g)).expect("a large all_to_all");
        // The conveniences.
        let mine = values::<u8>(g.rank(), 3);
        let all = all_gather_vec(&mine, Some(g)).expect("all_gather_vec");
        let want: Vec<u8> = (0..size).flat_map(|r| values::<u8>(r, 3)).collect();
        assert_eq!(all, want);
        if size > 1 {
            // To the right and from the left: neighbours, as the ring requires.
            let (right, left) = ((g.rank() + 1) % size, (g.rank() + size - 1) % size);
            let theirs: Vec<bf16> = values(left, 17);
            if g.rank() % 2 == 0 {
                g.send(&values::<bf16>(g.rank(), 17), right).expect("send");
                assert_eq!(g.recv_vec::<bf16>(17, left).expect("recv_vec"), theirs);
            } else {
                let got = recv_vec::<bf16>(17, left, Some(g)).expect("recv_vec");
                g.send(&values::<bf16>(g.rank(), 17), right).expect("send");
                assert_eq!(got, theirs);
            }
        }
    });
}

#[test]
fn ring_broadcast_and_all_to_all_at_every_p() {
    for size in 1..=6 {
        everything(size, Backend::Ring);
    }
}

#[test]
fn native_broadcast_and_all_to_all_at_every_p() {
    for size in 1..=6 {
        everything(size, Backend::Native);
    }
}

#[test]
fn wrong_arguments_are_refused_and_the_group_stays_usable() {
    for wire in [Backend::Ring, Backend::Native] {
        on_group(3, wire, |g| {
            let e = g.broadcast(&mut [0u8; 4], 3).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
            assert!(e.to_string().contains("broadcast: root 3"), "{e}");
            let e = g.all_to_all(&[0u8; 6], &mut [0u8; 3]).unwrap_err();
            assert!(
                e.to_string().contains("all_to_all: the input holds 6"),
                "{e}"
            );
            let e = g.all_to_all(&[0u8; 4], &mut [0u8; 4]).unwrap_err();
            assert!(e.to_string().contains("3 equal blocks"), "{e}");
            let e = g.recv_vec::<u8>(4, 7).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
            // Still usable: a broadcast that goes through.
            let mut x = [g.rank() as u32; 2];
            g.broadcast(&mut x, 1).expect("a broadcast after refusals");
            assert_eq!(x, [1, 1]);
        });
    }
}

#[test]
fn a_backend_without_them_refuses_by_name() {
    // `Single` keeps the trait's defaults, as JACCL and users' backends do.
    let e = Single.broadcast(&mut [0u8; 4], 0).unwrap_err();
    assert!(matches!(e, Error::Unsupported(_)), "{e}");
    assert!(
        e.to_string()
            .contains("broadcast from rank 0: the single backend"),
        "{e}"
    );
    let e = Single.all_to_all(&[0u8; 4], &mut [0u8; 4]).unwrap_err();
    assert!(
        e.to_string().contains("all_to_all: the single backend"),
        "{e}"
    );
}
