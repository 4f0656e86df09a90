//! A tampering relay on the connection of a keyed two-rank native group: rank 0 dials a
//! loopback relay in place of rank 1 (its addresses are the same hostfile's, only the
//! address it dials differs, which the public API cannot express), and the relay forwards
//! the handshake untouched. After a clean all_sum it alters one direction of the stream:
//! flips a byte (of a record's length, ciphertext or tag), injects a 24-byte record of
//! its own, replays the first 4 KiB, drops a whole record, or cuts the connection inside a
//! record. Every tampered call (an all_sum, or a send and its recv across the tampered
//! direction) fails on the rank that receives the tampered direction with an
//! authentication failure or a close naming the other rank, and no rank returns a wrong
//! result as `Ok`.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use super::connect;
use crate::comm::Communicator;
use crate::element::DType;
use crate::error::Error;
use crate::native::Native;
use crate::options::{Io, Options};
use crate::reduce::ReduceOp;

const SECRET: &str = "a shared secret of enough length";

/// What the relay does to one direction once armed. Positions count from the first byte
/// of that direction after arming.
#[derive(Clone, Copy, Debug)]
enum Tamper {
    /// Flips `bit` of the byte at `at`.
    Flip { at: usize, bit: u8 },
    /// Sends a record of its own (a length of 4, 4 bytes, a made-up tag) before the rest.
    Inject,
    /// Sends the first 4 KiB again right after them.
    Replay,
    /// Drops the first record whole.
    Drop,
    /// Closes both connections after `at` bytes, inside a record.
    Cut { at: usize },
}

/// The relay's state for the tampered direction.
struct Tampering {
    tamper: Tamper,
    pos: usize,
    /// The first record's length field (for [`Tamper::Drop`]) and the replayed bytes.
    field: [u8; 4],
    saved: Vec<u8>,
    done: Arc<AtomicBool>,
}

impl Tampering {
    /// What of `chunk` goes on, into `out`; `true` to close the connection instead.
    fn apply(&mut self, chunk: &[u8], out: &mut Vec<u8>) -> bool {
        for &b in chunk {
            let p = self.pos;
            self.pos += 1;
            match self.tamper {
                Tamper::Flip { at, bit } => {
                    if p == at {
                        self.done.store(true, Ordering::SeqCst);
                        out.push(b ^ bit);
                    } else {
                        out.push(b);
                    }
                }
                Tamper::Inject => {
                    if p == 0 {
                        out.extend_from_slice(&[4, 0, 0, 0]);
                        out.extend_from_slice(b"evil");
                        out.extend_from_slice(&[0x5a; 16]);
                        self.done.store(true, Ordering::SeqCst);
                    }
                    out.push(b);
                }
                Tamper::Replay => {
                    out.push(b);
                    if p < 4096 {
                        self.saved.push(b);
                    }
                    if p == 4095 {
                        out.extend_from_slice(&self.saved);
                        self.done.store(true, Ordering::SeqCst);
                    }
                }
                Tamper::Drop => {
                    if p < 4 {
                        self.field[p] = b;
                        continue;
                    }
                    let total = u32::from_le_bytes(self.field) as usize + 20;
                    if p < total {
                        if p + 1 == total {
                            self.done.store(true, Ordering::SeqCst);
                        }
                        continue;
                    }
                    out.push(b);
                }
                Tamper::Cut { at } => {
                    if p == at {
                        self.done.store(true, Ordering::SeqCst);
                        return true;
                    }
                    out.push(b);
                }
            }
        }
        false
    }
}

/// Copies `from` to `to` until either ends, tampering once `armed` if `tampering` is
/// given; closes both on a cut.
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    armed: Arc<AtomicBool>,
    tampering: Option<Arc<Mutex<Tampering>>>,
) {
    let mut buf = vec![0u8; 64 << 10];
    let mut out = Vec::with_capacity(128 << 10);
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        out.clear();
        let cut = match &tampering {
            Some(t) if armed.load(Ordering::SeqCst) => t.lock().unwrap().apply(&buf[..n], &mut out),
            _ => {
                out.extend_from_slice(&buf[..n]);
                false
            }
        };
        if to.write_all(&out).is_err() || cut {
            if cut {
                let _ = to.write_all(&out);
                let _ = from.shutdown(Shutdown::Both);
            }
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

/// A relay on a fresh loopback port that forwards every connection to `target`, tampering
/// with the direction from the dialling rank (`towards_acceptor`) or back, once armed.
struct Relay {
    addr: SocketAddr,
    armed: Arc<AtomicBool>,
    done: Arc<AtomicBool>,
}

fn relay(target: SocketAddr, tamper: Tamper, towards_acceptor: bool) -> Relay {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let armed = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicBool::new(false));
    let (a, d) = (armed.clone(), done.clone());
    thread::spawn(move || {
        for incoming in listener.incoming() {
            let Ok(dialler) = incoming else { return };
            let until = Instant::now() + Duration::from_secs(10);
            let acceptor = loop {
                match TcpStream::connect(target) {
                    Ok(s) => break s,
                    Err(_) if Instant::now() < until => thread::sleep(Duration::from_millis(2)),
                    Err(_) => return,
                }
            };
            let tampering = Arc::new(Mutex::new(Tampering {
                tamper,
                pos: 0,
                field: [0; 4],
                saved: Vec::new(),
                done: d.clone(),
            }));
            let (there, back) = if towards_acceptor {
                (Some(tampering), None)
            } else {
                (None, Some(tampering))
            };
            let (d1, a1) = (dialler.try_clone().unwrap(), acceptor.try_clone().unwrap());
            let armed1 = a.clone();
            thread::spawn(move || pump(d1, a1, armed1, there));
            let armed2 = a.clone();
            thread::spawn(move || pump(acceptor, dialler, armed2, back));
        }
    });
    Relay { addr, armed, done }
}

/// The two ranks' `call` of `n` i32 through a relay doing `tamper` to the direction
/// `towards_acceptor` (rank 0 to rank 1) or back; returns each rank's result (what it
/// received, nothing for a send) and whether the relay tampered.
fn tampered_call(
    tamper: Tamper,
    towards_acceptor: bool,
    (call, n): (Call, usize),
    seal_threads: usize,
) -> (Vec<Result<Vec<i32>, Error>>, bool) {
    let ports = crate::loopback_ports::free_addrs(2);
    let nodes: Vec<Vec<String>> = ports.iter().map(|p| vec![p.to_string()]).collect();
    let relay = relay(ports[1], tamper, towards_acceptor);
    let mut options = Options::default()
        .key(SECRET)
        .timeout(Duration::from_secs(5))
        .shared_memory(false)
        .io(Io::Epoll);
    options.seal_threads = Some(seal_threads);
    let gate = Barrier::new(3);
    let results = thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                let (nodes, options, gate) = (&nodes, &options, &gate);
                let relay_addr = relay.addr;
                s.spawn(move || {
                    // A rank that cannot form or sum cleanly still passes both gates, so
                    // that the test fails with its reason instead of waiting for it.
                    let formed = (|| {
                        let mut addrs =
                            crate::config::hostfile::resolve(nodes, rank, Path::new("hosts.json"))
                                .map_err(|e| e.to_string())?;
                        if rank == 0 {
                            addrs.right = vec![relay_addr];
                        }
                        let formed = connect(&addrs, options)
                            .map_err(|e| format!("forming through the relay: {e}"))?;
                        let comm = Native::new(formed, options).map_err(|e| e.to_string())?;
                        let mut clean = bytes(&[1i32; 1000]);
                        comm.all_reduce(ReduceOp::Sum, DType::I32, &mut clean)
                            .map_err(|e| format!("the clean all_sum: {e}"))?;
                        if words(&clean).iter().any(|&x| x != 2) {
                            return Err("the clean all_sum returned a wrong result".to_string());
                        }
                        Ok(comm)
                    })();
                    gate.wait();
                    gate.wait();
                    let comm = formed.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
                    let data: Vec<i32> = (0..n).map(|i| value(rank, i)).collect();
                    let mut data = bytes(&data);
                    // The tampered direction's sender sends, its receiver receives.
                    let sends = (rank == 0) == towards_acceptor;
                    let result = match call {
                        Call::AllSum => comm
                            .all_reduce(ReduceOp::Sum, DType::I32, &mut data)
                            .map(|()| words(&data)),
                        Call::Send if sends => comm.send(&data, 1 - rank).map(|()| Vec::new()),
                        Call::Send => comm.recv(&mut data, 1 - rank).map(|()| words(&data)),
                    };
                    let _ = comm.close();
                    result
                })
            })
            .collect();
        gate.wait();
        relay.armed.store(true, Ordering::SeqCst);
        gate.wait();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    (results, relay.done.load(Ordering::SeqCst))
}

/// The call made through the relay.
#[derive(Clone, Copy, Debug)]
enum Call {
    /// Both ranks' all_sum.
    AllSum,
    /// The tampered direction's sender sends, its receiver receives.
    Send,
}

fn value(rank: usize, i: usize) -> i32 {
    (rank as i32 + 1) * 1000 + (i % 977) as i32
}

fn bytes(data: &[i32]) -> Vec<u8> {
    data.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn words(bytes: &[u8]) -> Vec<i32> {
    bytes
        .as_chunks::<4>()
        .0
        .iter()
        .map(|w| i32::from_le_bytes(*w))
        .collect()
}

#[test]
fn every_tampered_call_fails_on_the_receiving_rank_and_none_is_wrong() {
    tampered_calls_fail(1);
}

/// As above with records sealed and opened in batches on two threads: a batch that holds
/// the tampered record passes on nothing from it or behind it.
#[test]
fn every_tampered_call_fails_with_batched_records_too() {
    tampered_calls_fail(2);
}

/// Every case of tampering, in each direction, for records sealed and opened on
/// `seal_threads` threads.
fn tampered_calls_fail(seal_threads: usize) {
    // 4 B: one record of 40 bytes (length 4, header 16 + data 4, tag 16); 64 KiB + 4 and
    // 1 MiB: records across the data.
    let small = 1;
    let large = (64 << 10) / 4 + 1;
    let huge = (1 << 20) / 4;
    let cases = [
        (Tamper::Flip { at: 3, bit: 0x01 }, small), // the length: above the cap
        (Tamper::Flip { at: 5, bit: 0x01 }, small), // the header, encrypted
        (Tamper::Flip { at: 30, bit: 0x80 }, small), // the tag
        (
            Tamper::Flip {
                at: 40_000,
                bit: 0x04,
            },
            large,
        ), // the data, encrypted
        (Tamper::Flip { at: 2, bit: 0x01 }, huge),  // a length of 0 instead of 64 KiB
        (Tamper::Inject, small),
        (Tamper::Inject, huge),
        (Tamper::Replay, large),
        (Tamper::Drop, large),
        (Tamper::Drop, huge),
        (Tamper::Cut { at: 20 }, small),
        (Tamper::Cut { at: 70_000 }, huge),
    ];
    let sends = [
        (Tamper::Flip { at: 5, bit: 0x01 }, small),
        (
            Tamper::Flip {
                at: 40_000,
                bit: 0x04,
            },
            large,
        ),
        (Tamper::Inject, small),
        (Tamper::Replay, large),
        (Tamper::Drop, huge),
        (Tamper::Cut { at: 70_000 }, huge),
    ];
    let calls = cases
        .iter()
        .map(|&(t, n)| (t, (Call::AllSum, n)))
        .chain(sends.iter().map(|&(t, n)| (t, (Call::Send, n))));
    for (tamper, (call, n)) in calls {
        for towards_acceptor in [true, false] {
            let what = format!(
                "{tamper:?} on {} of {call:?} of {n} i32",
                if towards_acceptor {
                    "rank 0 -> 1"
                } else {
                    "rank 1 -> 0"
                }
            );
            let what = format!("{what}, {seal_threads} sealing thread(s)");
            let (results, done) = tampered_call(tamper, towards_acceptor, (call, n), seal_threads);
            assert!(done, "{what}: the relay did not tamper");
            let receiver = usize::from(towards_acceptor);
            let sender = 1 - receiver;
            match &results[receiver] {
                Ok(_) => panic!("{what}: rank {receiver} received tampered bytes and succeeded"),
                Err(e) => {
                    assert!(
                        matches!(e, Error::Auth { .. } | Error::Closed { .. }),
                        "{what}: rank {receiver}: {e:?}"
                    );
                    assert_eq!(e.peer(), Some(sender), "{what}: rank {receiver}: {e}");
                }
            }
            for (rank, result) in results.iter().enumerate() {
                if let Ok(data) = result {
                    for (i, got) in data.iter().enumerate() {
                        let want = match call {
                            Call::AllSum => value(0, i) + value(1, i),
                            Call::Send => value(sender, i),
                        };
                        assert_eq!(
                            *got, want,
                            "{what}: rank {rank} returned a wrong result as Ok at {i}"
                        );
                    }
                }
            }
        }
    }
}
