//! Strangers at a forming group's ports: clients that are not ranks of the group connect to
//! rank 0's address before rank 1 does, and send garbage, zeros, two bytes of the hello's
//! magic, nothing, a hello (with what followed it) captured from an earlier run of the same
//! group, the magic one byte at a time, or open 200 connections at once. On the native
//! wire (keyed or not) and on the MLX wire with a key the real group still forms and its
//! all_sum is exact. On the MLX wire without a key no byte is exchanged while forming, so
//! only clients that have left by the time it chooses (port scanners) are passed over; a
//! stranger that stays connected is taken for the neighbour (README, Authentication).
//!
//! Each group is two ranks on threads of this process, on loopback.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use nuvec_distributed_engine::{Backend, Options, init_with};
use nuvec_tools::testing;

/// A key long enough for `Options::key`.
const KEY: &str = "correct horse battery staple 2026";

/// The first bytes of every hello on both wires.
const MAGIC: &[u8; 8] = b"nuvecRNG";

/// Connections of the flood.
const FLOOD: usize = 200;

fn options(backend: Backend, keyed: bool, timeout: Duration) -> Options {
    let options = Options::default().backend(backend).timeout(timeout);
    if keyed { options.key(KEY) } else { options }
}

/// Connects to `addr`, retrying while nobody listens there yet.
fn connect(addr: SocketAddr) -> TcpStream {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        match TcpStream::connect(addr) {
            Ok(s) => return s,
            Err(e) => {
                assert!(Instant::now() < until, "nobody listened on {addr}: {e}");
                thread::sleep(Duration::from_millis(2));
            }
        }
    }
}

/// 4 KiB from a fixed xorshift sequence.
fn garbage() -> Vec<u8> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    (0..4096)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// What rank 1 of the group at `nodes` sends first on its connection to rank 0: an
/// earlier run of rank 1 alone (with a short timeout) dials a listener the test holds on
/// rank 0's address, and whatever arrives within 300 ms is kept.
fn capture_rank1(nodes: &[Vec<String>], backend: Backend, keyed: bool) -> Vec<u8> {
    let listener = TcpListener::bind(&nodes[0][0]).unwrap();
    let nodes1 = nodes.to_vec();
    let earlier = thread::spawn(move || {
        init_with(
            &nodes1,
            1,
            &options(backend, keyed, Duration::from_millis(600)),
        )
    });
    let (mut s, _) = listener.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    // Rank 1 waits for rank 0's reply after its first message, so what it sends first
    // arrives and then the stream goes quiet.
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    drop(s);
    drop(listener);
    assert!(
        earlier.join().unwrap().is_err(),
        "the earlier run formed alone"
    );
    assert!(got.starts_with(MAGIC), "captured {got:?}");
    got
}

/// The strangers, all at rank 0's address `at`, in this order: the flood (silent), a slow
/// writer of the magic, a silent client, two bytes of the magic, 4 KiB of zeros, 4 KiB of
/// garbage, `replay` (if any: a hello of this group, then bytes that do not prove the key),
/// and a port scanner. Returns their connections (held open
/// until dropped) and the slow writer, which stops when `stop` is set.
fn strangers(
    at: SocketAddr,
    replay: Option<&[u8]>,
    stop: &Arc<AtomicBool>,
) -> (Vec<TcpStream>, thread::JoinHandle<()>) {
    let mut held: Vec<TcpStream> = (0..FLOOD).map(|_| connect(at)).collect();
    let mut slow = connect(at);
    let stop_writing = Arc::clone(stop);
    let writer = thread::spawn(move || {
        for &b in MAGIC.iter().cycle() {
            if stop_writing.load(Ordering::Relaxed) || slow.write_all(&[b]).is_err() {
                return;
            }
            thread::sleep(Duration::from_millis(50));
        }
    });
    held.push(connect(at));
    let zeros = vec![0u8; 4096];
    let garbage = garbage();
    let mut sends: Vec<&[u8]> = vec![&MAGIC[..2], &zeros, &garbage];
    sends.extend(replay);
    for bytes in sends {
        let mut s = connect(at);
        // A stranger that is dropped may see its write fail; that is the point.
        let _ = s.write_all(bytes);
        held.push(s);
    }
    drop(connect(at));
    (held, writer)
}

/// Forms a group of two on `backend` with strangers at rank 0's address before rank 1
/// starts (the ones `scanners_only` allows), then checks an all_sum on both ranks.
fn forms_despite_strangers(backend: Backend, keyed: bool, replay: bool, scanners_only: bool) {
    let nodes = testing::loopback_nodes(&testing::free_ports(2, 1));
    // The captured bytes, then what an earlier run's answer to the key's challenge might
    // have been: it cannot be the answer to this run's challenge.
    let captured = replay.then(|| {
        let mut bytes = capture_rank1(&nodes, backend, keyed);
        bytes.extend_from_slice(&garbage()[..200]);
        bytes
    });
    let at: SocketAddr = nodes[0][0].parse().unwrap();
    let long = Duration::from_secs(20);
    let stop = Arc::new(AtomicBool::new(false));
    thread::scope(|s| {
        let rank = |r: usize| {
            let nodes = &nodes;
            move || {
                let group =
                    init_with(nodes, r, &options(backend, keyed, long)).unwrap_or_else(|e| {
                        panic!("{backend:?}, keyed {keyed}: rank {r} did not form: {e}")
                    });
                let mut floats: Vec<f32> = (0..1000).map(|i| (i * (r + 1)) as f32).collect();
                group.all_sum(&mut floats).unwrap();
                let mut ints = vec![r as i64 + 1; 77];
                group.all_sum(&mut ints).unwrap();
                for (i, v) in floats.iter().enumerate() {
                    assert_eq!(*v, (3 * i) as f32, "element {i}");
                }
                assert_eq!(ints, vec![3; 77]);
            }
        };
        let first = s.spawn(rank(0));
        let (held, writer) = if scanners_only {
            for _ in 0..20 {
                drop(connect(at));
            }
            (Vec::new(), None)
        } else {
            let (held, writer) = strangers(at, captured.as_deref(), &stop);
            (held, Some(writer))
        };
        let second = s.spawn(rank(1));
        first.join().unwrap();
        second.join().unwrap();
        stop.store(true, Ordering::Relaxed);
        if let Some(w) = writer {
            w.join().unwrap();
        }
        drop(held);
    });
}

/// Both backends form despite strangers: keyed, with a replayed hello (native) or greeting
/// (MLX's ring) among them; unkeyed, without one, since a hello of this group is then all a
/// rank has to go by and a replayed one cannot be told from the real peer's (README,
/// Authentication); and MLX's ring unkeyed among port scanners alone.
#[test]
fn forms_despite_strangers_on_either_backend() {
    // (backend, keyed, a replayed hello among the strangers, port scanners only)
    for (backend, keyed, replay, scanners_only) in [
        (Backend::Native, false, false, false),
        (Backend::Native, true, true, false),
        (Backend::Ring, true, true, false),
        (Backend::Ring, false, false, true),
    ] {
        forms_despite_strangers(backend, keyed, replay, scanners_only);
    }
}

#[test]
fn native_timeout_names_the_dropped_strangers() {
    for keyed in [false, true] {
        let nodes = testing::loopback_nodes(&testing::free_ports(2, 1));
        let at: SocketAddr = nodes[0][0].parse().unwrap();
        let short = Duration::from_millis(800);
        let nodes0 = nodes.clone();
        let rank0 = thread::spawn(move || {
            match init_with(&nodes0, 0, &options(Backend::Native, keyed, short)) {
                Ok(_) => panic!("formed without rank 1"),
                Err(e) => e,
            }
        });
        let mut held = Vec::new();
        for _ in 0..5 {
            let mut s = connect(at);
            let _ = s.write_all(&[0u8; 64]);
            held.push(s);
        }
        let text = rank0.join().unwrap().to_string();
        assert!(
            text.contains(
                "dropped 5 connection(s) that were not this group's ranks: from 127.0.0.1:"
            ) && text.contains(" and 2 more")
                && text.contains("sent collective data instead of a hello"),
            "keyed {keyed}: {text}"
        );
    }
}

#[test]
fn native_pending_clients_are_capped_oldest_first() {
    // 70 silent clients, and rank 1 never comes: 64 may wait for their hello, so the six
    // oldest are dropped to make room, and the error at the deadline counts them.
    let nodes = testing::loopback_nodes(&testing::free_ports(2, 1));
    let at: SocketAddr = nodes[0][0].parse().unwrap();
    let nodes0 = nodes.clone();
    let rank0 = thread::spawn(move || {
        let options = options(Backend::Native, false, Duration::from_secs(2));
        match init_with(&nodes0, 0, &options) {
            Ok(_) => panic!("formed without rank 1"),
            Err(e) => e,
        }
    });
    let held: Vec<TcpStream> = (0..70).map(|_| connect(at)).collect();
    let text = rank0.join().unwrap().to_string();
    assert!(
        text.contains("dropped 6 connection(s) that were not this group's ranks: from 127.0.0.1:")
            && text.contains("it was the oldest of 64 clients waiting for their hello")
            && text.contains(" and 3 more"),
        "{text}"
    );
    drop(held);
}
