//! An RDMA fabric in memory, with the semantics observed on Apple's Thunderbolt transport,
//! for testing the algorithms without hardware.
//!
//! - **In order.** Messages on a queue pair arrive in the order they were sent, each into the
//!   next receive posted on the peer's queue pair.
//! - **Early sends are held.** A SEND that arrives before the peer posted a receive waits
//!   until one is posted (Apple's transport evidently tolerates this, and JACCL depends on it:
//!   it has no credits). The send completes when the message is delivered, so a sender's
//!   pipeline stalls behind a receiver that is slow to post.
//! - **Whole buffers.** A message longer than the receive buffer completes the receive with
//!   a length error; a shorter one fills its front.
//! - **Faults**, injected per queue pair and message: a message can be *dropped* (the send
//!   completes successfully, nothing arrives: what UC does on a lost packet), fail at the
//!   *sender* (an error completion, nothing arrives), or fail at the *receiver* (the receive
//!   completes with an error).
//!
//! Queue pairs find each other through the [`Destination`]s the group exchanges over its real
//! side channel: each emulated queue pair has a unique number in its [`Network`], and
//! connecting looks the peer's number up, so a mistake in who connects to whom shows up as
//! wrong data or a hang, as it would on hardware.
//!
//! Buffers are lent exactly as the verbs fabric lends them ([`Pool`]): a posted receive
//! buffer moves into the peer-facing queue, and the sender's bytes are copied into it on
//! delivery.
//!
//! The network can also record what every queue pair posts, so tests can compare the frame
//! sequence with MLX's.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use super::fabric::{
    BufId, BufferSpec, Completion, Destination, Fabric, FabricResult, Pool, pack_wr, unpack_wr,
};

/// A fault to inject into the `nth` message (from 0) a queue pair sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    /// The message is lost; the sender sees success.
    Drop,
    /// The send completes with an error; nothing arrives.
    SendError,
    /// The receive it lands in completes with an error.
    RecvError,
}

/// What a queue pair posted, as recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Posted {
    /// Whether it was a receive.
    pub(crate) recv: bool,
    /// The buffer's length: the message size for a send.
    pub(crate) len: usize,
    /// A send's bytes (when recording contents).
    pub(crate) bytes: Option<Vec<u8>>,
}

type Buf = Arc<Vec<u8>>;

struct Held {
    from: Arc<EmuQp>,
    wr: u64,
    data: Buf,
    /// An injected receive error, applied on delivery.
    fail: bool,
}

#[derive(Default)]
struct QpState {
    remote: Option<Arc<EmuQp>>,
    posted: VecDeque<(u64, Buf)>,
    held: VecDeque<Held>,
    sent: usize,
}

struct EmuCompletion {
    wr: u64,
    recv: bool,
    status: Result<(), String>,
    buf: Buf,
}

/// Rung whenever a completion lands on one of a rank's queue pairs, so the rank's engine can
/// sleep until then (the emulated counterpart of a completion channel).
#[derive(Default)]
struct Bell {
    rung: Mutex<u64>,
    cv: Condvar,
}

impl Bell {
    fn ring(&self) {
        *lock(&self.rung) += 1;
        self.cv.notify_all();
    }
}

/// One emulated queue pair.
struct EmuQp {
    qpn: u32,
    rank: usize,
    conn: usize,
    state: Mutex<QpState>,
    cq: Mutex<VecDeque<EmuCompletion>>,
    faults: Vec<(usize, Fault)>,
    bell: Arc<Bell>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl EmuQp {
    fn complete(&self, c: EmuCompletion) {
        lock(&self.cq).push_back(c);
        self.bell.ring();
    }

    /// Delivers `data` from `from` into the receive `(wr, buf)` posted on `self`.
    fn deliver(
        &self,
        from: &EmuQp,
        send_wr: u64,
        data: Buf,
        (wr, mut buf): (u64, Buf),
        fail: bool,
    ) {
        let status = if fail {
            Err("injected receive error".to_string())
        } else if data.len() > buf.len() {
            Err(format!(
                "local length error: a {} byte message into a {} byte buffer",
                data.len(),
                buf.len()
            ))
        } else {
            match Arc::get_mut(&mut buf) {
                Some(bytes) => {
                    bytes[..data.len()].copy_from_slice(&data);
                    Ok(())
                }
                None => Err("receive buffer shared while posted".to_string()),
            }
        };
        self.complete(EmuCompletion {
            wr,
            recv: true,
            status,
            buf,
        });
        from.complete(EmuCompletion {
            wr: send_wr,
            recv: false,
            status: Ok(()),
            buf: data,
        });
    }
}

/// Per (rank, connection): the faults to inject, by message number.
type Faults = HashMap<(usize, usize), Vec<(usize, Fault)>>;

/// Per (rank, connection): what was posted.
type Record = HashMap<(usize, usize), Vec<Posted>>;

#[derive(Default)]
struct NetInner {
    qps: Mutex<HashMap<u32, Arc<EmuQp>>>,
    next_qpn: AtomicU32,
    faults: Mutex<Faults>,
    record: Mutex<Option<Record>>,
    record_bytes: std::sync::atomic::AtomicBool,
}

/// The emulated network every rank of a test shares.
#[derive(Clone, Default)]
pub(crate) struct Network {
    inner: Arc<NetInner>,
}

impl Network {
    /// A network without faults or recording.
    pub(crate) fn new() -> Network {
        let net = Network::default();
        net.inner.next_qpn.store(0x100, Ordering::Relaxed);
        net
    }

    /// Records what every queue pair posts from now on; with `bytes`, also what sends carry.
    pub(crate) fn record(&self, bytes: bool) {
        *lock(&self.inner.record) = Some(HashMap::new());
        self.inner.record_bytes.store(bytes, Ordering::Relaxed);
    }

    /// What rank `rank` posted on connection `conn` since recording started.
    pub(crate) fn posted(&self, rank: usize, conn: usize) -> Vec<Posted> {
        lock(&self.inner.record)
            .as_ref()
            .and_then(|r| r.get(&(rank, conn)).cloned())
            .unwrap_or_default()
    }

    /// Forgets what was recorded so far.
    pub(crate) fn clear_record(&self) {
        if let Some(r) = lock(&self.inner.record).as_mut() {
            r.clear();
        }
    }

    /// Injects `fault` into message `nth` that rank `rank` sends on connection `conn` (set it
    /// before the rank opens its fabric).
    pub(crate) fn inject(&self, rank: usize, conn: usize, nth: usize, fault: Fault) {
        lock(&self.inner.faults)
            .entry((rank, conn))
            .or_default()
            .push((nth, fault));
    }

    /// Whether every connected queue pair's peer is connected back to it.
    pub(crate) fn check_wiring(&self) -> Result<usize, String> {
        let qps = lock(&self.inner.qps);
        let mut pairs = 0;
        for qp in qps.values() {
            let remote = lock(&qp.state).remote.clone();
            let Some(remote) = remote else { continue };
            let back = lock(&remote.state).remote.clone();
            match back {
                Some(back) if back.qpn == qp.qpn => pairs += 1,
                _ => {
                    return Err(format!(
                        "rank {} connection {} is connected to rank {} connection {}, which is \
                         not connected back",
                        qp.rank, qp.conn, remote.rank, remote.conn
                    ));
                }
            }
        }
        Ok(pairs)
    }

    fn log(&self, qp: &EmuQp, recv: bool, data: &[u8]) {
        let mut record = lock(&self.inner.record);
        if let Some(record) = record.as_mut() {
            let bytes =
                (!recv && self.inner.record_bytes.load(Ordering::Relaxed)).then(|| data.to_vec());
            record.entry((qp.rank, qp.conn)).or_default().push(Posted {
                recv,
                len: data.len(),
                bytes,
            });
        }
    }
}

/// One rank's end of the emulated network.
pub(crate) struct EmulatedFabric {
    net: Network,
    rank: usize,
    /// The packet sequence number its queue pairs advertise and expect.
    psn: u32,
    qps: Vec<Option<Arc<EmuQp>>>,
    pool: Pool<Vec<u8>>,
    scratch: Vec<EmuCompletion>,
    bell: Arc<Bell>,
    /// The bell's count when this rank last woke.
    seen: u64,
}

impl EmulatedFabric {
    /// Opens rank `rank`'s connections (`present[c]` says whether connection `c` exists),
    /// whose queue pairs start at `psn`, and allocates `buffers`.
    pub(crate) fn open(
        net: &Network,
        rank: usize,
        present: &[bool],
        buffers: &[BufferSpec],
        psn: u32,
    ) -> Self {
        let bell = Arc::new(Bell::default());
        let qps = present
            .iter()
            .enumerate()
            .map(|(conn, &here)| {
                here.then(|| {
                    let qpn = net.inner.next_qpn.fetch_add(1, Ordering::Relaxed);
                    let faults = lock(&net.inner.faults)
                        .get(&(rank, conn))
                        .cloned()
                        .unwrap_or_default();
                    let qp = Arc::new(EmuQp {
                        qpn,
                        rank,
                        conn,
                        state: Mutex::new(QpState::default()),
                        cq: Mutex::new(VecDeque::new()),
                        faults,
                        bell: bell.clone(),
                    });
                    lock(&net.inner.qps).insert(qpn, qp.clone());
                    qp
                })
            })
            .collect();
        let buffers = buffers
            .iter()
            .map(|spec| (!spec.conns.is_empty()).then(|| vec![0u8; spec.bytes]))
            .collect();
        EmulatedFabric {
            net: net.clone(),
            rank,
            psn,
            qps,
            pool: Pool::new(buffers),
            scratch: Vec::new(),
            bell,
            seen: 0,
        }
    }

    fn qp(&self, conn: usize) -> FabricResult<&Arc<EmuQp>> {
        self.qps
            .get(conn)
            .and_then(Option::as_ref)
            .ok_or_else(|| format!("rank {} has no connection {conn}", self.rank))
    }
}

impl Drop for EmulatedFabric {
    fn drop(&mut self) {
        let mut qps = lock(&self.net.inner.qps);
        for qp in self.qps.iter().flatten() {
            qps.remove(&qp.qpn);
            // Break the reference cycles between connected queue pairs and the messages
            // they hold; a peer still sending here finds a queue pair that never answers,
            // like a rank that is gone.
            let mut state = lock(&qp.state);
            state.remote = None;
            state.held.clear();
            state.posted.clear();
        }
    }
}

impl Fabric for EmulatedFabric {
    fn local(&mut self, conn: usize) -> FabricResult<Destination> {
        let qp = self.qp(conn)?;
        let mut gid = [0u8; 16];
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&[169, 254, 0, self.rank as u8]);
        Ok(Destination {
            lid: 0,
            qpn: qp.qpn,
            psn: self.psn,
            gid,
        })
    }

    fn connect(&mut self, conn: usize, remote: &Destination) -> FabricResult<()> {
        let qp = self.qp(conn)?.clone();
        if remote.psn != self.psn {
            return Err(format!(
                "the peer advertised PSN {}, expected {}",
                remote.psn, self.psn
            ));
        }
        let peer = lock(&self.net.inner.qps)
            .get(&remote.qpn)
            .cloned()
            .ok_or_else(|| format!("no queue pair {:#x} on the emulated network", remote.qpn))?;
        lock(&qp.state).remote = Some(peer);
        Ok(())
    }

    fn buffer(&mut self, id: BufId) -> FabricResult<&mut [u8]> {
        self.pool.bytes(id)
    }

    fn post_send(&mut self, conn: usize, id: BufId, tag: u64) -> FabricResult<()> {
        let qp = self.qp(conn)?.clone();
        let data = self.pool.lend_for_send(id)?;
        let wr = pack_wr(id, tag);
        self.net.log(&qp, false, &data);
        let (nth, remote) = {
            let mut state = lock(&qp.state);
            state.sent += 1;
            (state.sent - 1, state.remote.clone())
        };
        let remote = remote.ok_or_else(|| "the queue pair is not connected".to_string())?;
        let fault = qp.faults.iter().find(|(n, _)| *n == nth).map(|&(_, f)| f);
        match fault {
            Some(Fault::Drop) => {
                qp.complete(EmuCompletion {
                    wr,
                    recv: false,
                    status: Ok(()),
                    buf: data,
                });
                return Ok(());
            }
            Some(Fault::SendError) => {
                qp.complete(EmuCompletion {
                    wr,
                    recv: false,
                    status: Err("injected send error (transport retry counter exceeded)".into()),
                    buf: data,
                });
                return Ok(());
            }
            _ => {}
        }
        let fail_recv = fault == Some(Fault::RecvError);
        let mut state = lock(&remote.state);
        match state.posted.pop_front() {
            Some(recv) => {
                drop(state);
                remote.deliver(&qp, wr, data, recv, fail_recv);
            }
            None => state.held.push_back(Held {
                from: qp.clone(),
                wr,
                data,
                fail: fail_recv,
            }),
        }
        Ok(())
    }

    fn post_recv(&mut self, conn: usize, id: BufId, tag: u64) -> FabricResult<()> {
        let qp = self.qp(conn)?.clone();
        let buf = self.pool.lend_for_recv(id)?;
        self.net.log(&qp, true, &buf);
        let wr = pack_wr(id, tag);
        let mut state = lock(&qp.state);
        match state.held.pop_front() {
            Some(held) => {
                drop(state);
                qp.deliver(&held.from, held.wr, held.data, (wr, buf), held.fail);
            }
            None => state.posted.push_back((wr, buf)),
        }
        Ok(())
    }

    fn wait(&mut self, wait: Duration) -> bool {
        let rung = lock(&self.bell.rung);
        let rung = if *rung == self.seen {
            self.bell
                .cv
                .wait_timeout(rung, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0
        } else {
            rung
        };
        self.seen = *rung;
        true
    }

    fn poll(&mut self, conn: usize, out: &mut Vec<Completion>) -> FabricResult<()> {
        let qp = self.qp(conn)?.clone();
        self.scratch.extend(lock(&qp.cq).drain(..));
        for c in self.scratch.drain(..) {
            let (id, tag) = unpack_wr(c.wr);
            self.pool.give_back(id, c.buf);
            out.push(Completion {
                conn,
                recv: c.recv,
                tag,
                status: c.status,
            });
        }
        Ok(())
    }
}
