//! A verbs provider for tests: a shared library exporting the libibverbs entry points MLX's
//! JACCL uses (and the binding in `ffi/src/verbs` resolves), with the device context's
//! operations table filled in for `poll_cq`, `post_send` and `post_recv`, so the unchanged
//! binding drives it exactly as it drives rdma-core or Apple's `librdma`. Point
//! `NUVEC_DISTRIBUTED_VERBS_LIBRARY` at the built `cdylib` to use it.
//!
//! It implements what JACCL needs between processes on one machine: devices with one or more
//! ports (state, LID 0, Ethernet link layer, a GID table with a link-local entry and, on the
//! cabled port, an IPv4-mapped one; see [`config`]), device queries, protection domains,
//! memory registration, completion queues, and Unreliable Connected queue pairs with a
//! 1024-byte MTU whose transitions are checked as the kernel checks them (RESET, INIT, RTR,
//! RTS, ERR; a missing or extra attribute, a bad port, P_Key index, MTU or source GID index,
//! or a route without a GRH on an Ethernet port is `EINVAL`).
//!
//! Underneath, every queue pair binds a Unix datagram socket named after its number in the
//! fabric directory; a SEND travels as fragments of at most [`FRAGMENT`] bytes, each with a
//! header naming the sending queue pair and the destination GID. UC rules apply at the
//! receiver: a message from a queue pair other than the connected one, to a GID the port
//! does not have, or for a queue pair not in RTR or RTS is lost. Faults ([`FAULT_VAR`]) drop a
//! send, fail it, end the process or take the ports down; [`LOG_VAR`] logs every post and
//! completion, [`TRACE_VAR`] records the set-up and teardown for tests to check.
//!
//! There is no thread: data moves when the process calls into the provider (any post or
//! poll moves every queue pair's pending fragments both ways). So a message counts as
//! arriving when the receiving process next polls, not when it was sent.
//!
//! Completion channels are there too (`ibv_create_comp_channel`, `ibv_req_notify_cq`
//! through the operations table, `ibv_get_cq_event`, `ibv_ack_cq_events`): a channel's
//! descriptor is the socket of the first queue pair whose receive CQ uses it, readable when
//! a datagram waits for it, and `ibv_get_cq_event` never blocks (it moves data, then reports
//! an armed CQ that has completions, or `EAGAIN`). [`CHANNELS_VAR`]` = off` refuses channels,
//! as a library without them would.
//!
//! # Two profiles
//!
//! [`PROFILE_VAR`] chooses whose rules apply. **`rdma-core`** is the InfiniBand
//! specification as rdma-core's providers implement it: a send completes once handed over
//! (UC has no acknowledgement), a message that finds no receive posted is held or lost as
//! [`EARLY_VAR`] says, one longer than the posted buffer completes that receive with a length
//! error, queue depths count work requests, receives may be posted from INIT, and teardown
//! may go in any order the reference counts allow.
//!
//! **`apple`** (the default, and the JACCL tests' fabric) adds every rule reported for
//! Apple's `librdma` over Thunderbolt. Apple publishes its rules in TN3205 ("Low-latency
//! communication with RDMA over Thunderbolt"); the copy this crate follows is what two
//! programs that ran on the hardware report:
//!
//! - **Regions need the remote rights.** `ibv_reg_mr` without local write, remote read and
//!   remote write is refused (`EINVAL`), even for SEND and RECV. Source: llama.cpp's Apple
//!   transport (`ggml/src/ggml-rpc/transport-apple.cpp`, PR #26421): "Apple's provider rejects
//!   LOCAL_WRITE-only MRs even for two-sided SEND/RECV"; MLX registers with all three.
//! - **Receives only from RTS.** `ibv_post_recv` on a queue pair that has not reached RTS is
//!   refused (`EINVAL`). Source: the same file ("Apple's provider rejects ibv_post_recv on a QP
//!   that has not reached RTS").
//! - **A SEND and its RECV cover the same number of 4 KiB Thunderbolt frames.** A message
//!   whose frame count differs from the receive it lands in completes in error on both sides:
//!   the receive with a length error, the send with a remote invalid-request error. Source:
//!   the same file, citing TN3205 ("a SEND and its corresponding RECV must cover the same
//!   number of 4 KiB Thunderbolt frames ... a short send would fail the peer's receive").
//! - **Credit-based flow control.** A message waits at the receiver until a receive is posted
//!   (never lost for want of one), and its SEND completes only once it has landed in one, with
//!   the receiver's verdict. Source: the same PR's description ("relying on Apple's hardware
//!   credit based flow control"; "in practice UC on Apple is still lossless").
//! - **Queue depth counts frames, not work requests.** The `max_send_wr` and `max_recv_wr` a
//!   queue pair is created with bound the 4 KiB frames of the requests outstanding on each
//!   queue: a post that would exceed it is refused (`ENOMEM`). Source: the same file ("TN3205
//!   counts queue depth in Thunderbolt frames, not work requests"; it sizes its queues as
//!   ring depth x frames per message). For JACCL: MLX's 32 work requests then hold 32 frames,
//!   128 KiB; its pipeline keeps two messages in flight per queue, which fits up to the
//!   64 KiB class (2 x 16 frames) but not from 128 KiB (2 x 32 frames), and a single 256 or
//!   512 KiB message (64, 128 frames) exceeds it alone. The binding asks for two of the
//!   largest message's frames instead (see `src/jaccl/frames.rs`).
//! - **The active port is not always 1.** Devices have several ports (2 by default) and the
//!   cabled one is the last (configurable: `ports=`, `active=`); the others are down and
//!   publish no IPv4-mapped GID. Source: the same file ("it is not always port 1, so the port
//!   cannot be hardcoded"; it takes the first active port of `ibv_query_device`'s
//!   `phys_port_cnt`).
//! - **Ten queue pairs per device.** The 11th `ibv_create_qp` on a device fails with `EBUSY`,
//!   however the queue pairs are spread over contexts (here: within one process, where the
//!   limit was measured). Source: mlx PR #4209 and issue #3162 (M5 Max and M4 Pro, macOS
//!   26.5.1: "ten succeed whether they are spread across ten ibv_contexts or all created on a
//!   single one").
//! - **A region outlives no queue pair of its domain.** `ibv_dereg_mr` while a queue pair of
//!   the region's protection domain exists is refused (`EBUSY`). Source: llama.cpp's
//!   transport ("destroy the QP first: it can still write to the rings until it is gone") and
//!   PR #27908 (the errors Apple's driver logs when regions are unmapped first).
//! - **Never ERR before destroying.** Once a queue pair has been moved to ERR, every later
//!   `ibv_dereg_mr` of its protection domain's regions fails (`EIO`). Source: llama.cpp's
//!   transport ("no IBV_QPS_ERR before it - Apple's provider then fails every region unmap").
//!
//! What the Apple profile cannot show is Apple's driver itself: the statuses and error codes
//! it reports (the ones above are this provider's choice where the sources give none), its
//! timing, and anything the sources do not report.

mod abi;
pub mod config;

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_char, c_int, c_void};
use std::io;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::{LazyLock, Mutex, MutexGuard};

use abi::*;
pub use config::{CHANNELS_VAR, DEVICES_VAR, DIR_VAR, EARLY_VAR, FAULT_VAR, PROFILE_VAR};

/// The largest payload of one fragment: well under the default socket buffer limits of
/// Linux and macOS, so one fragment always fits a datagram.
pub const FRAGMENT: usize = 32 * 1024;

/// A fragment's header: magic, source QPN, destination QPN, message length, offset, the
/// destination GID.
const HEADER: usize = 4 * 5 + 16;
const MAGIC: u32 = 0x4e56_5242;
/// An acknowledgement (Apple profile): magic, the receiving queue pair, the sending queue
/// pair, the status the send completes with.
const ACK: usize = 4 * 4;
const ACK_MAGIC: u32 = 0x4e56_4143;

/// A Thunderbolt frame: the unit Apple's transport counts queue depth and messages in.
const TB_FRAME: usize = 4096;

/// The Thunderbolt frames a message of `len` bytes covers (a message is at least one).
fn frames(len: usize) -> usize {
    len.div_ceil(TB_FRAME).max(1)
}

/// The largest queue a queue pair may ask for, and the scatter-gather entries per request
/// (JACCL uses one).
const MAX_WR: u32 = 4096;
const MAX_SGE: u32 = 1;

/// The exit code of the `exit=N` fault.
pub const EXIT_CODE: i32 = 86;

struct Device {
    spec: config::DeviceSpec,
    /// The leaked `ibv_device` handed out in lists (devices live as long as the process, as
    /// in rdma-core).
    c: usize,
}

struct Ctx {
    device: usize,
}

struct Pd {
    ctx: usize,
    /// Apple profile: a queue pair of this PD was moved to ERR, after which Apple's driver
    /// fails every deregistration of the PD's regions.
    poisoned: bool,
}

struct Mr {
    pd: usize,
    addr: usize,
    len: usize,
    lkey: u32,
}

struct Cq {
    ctx: usize,
    cqe: usize,
    entries: VecDeque<ibv_wc>,
    overrun: bool,
    /// The completion channel's address, or 0.
    channel: usize,
    /// Armed by `req_notify_cq`: the next completion raises an event.
    armed: bool,
    /// Events handed out and not yet acknowledged.
    unacked: u64,
}

/// A completion channel. Its descriptor starts as a placeholder socket and becomes (by
/// `dup2`) the socket of the first queue pair whose receive CQ uses the channel, so it is
/// readable exactly when a datagram waits for that queue pair: what a process waiting on
/// it needs to wake up, since data moves only when it calls in. (Sends complete when they
/// are posted, so only arrivals need a wake-up.)
struct Channel {
    ctx: usize,
    fd: std::os::fd::OwnedFd,
    bound: bool,
}

/// What happens to a send, decided when it is posted.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fate {
    Deliver,
    Drop,
    Fail(u32),
}

struct SendWr {
    wr_id: u64,
    addr: usize,
    len: usize,
    signaled: bool,
    offset: usize,
    fate: Fate,
}

#[derive(Clone, Copy)]
struct RecvWr {
    wr_id: u64,
    addr: usize,
    len: usize,
}

/// The message being received: into a posted receive, or discarded.
struct Incoming {
    recv: Option<RecvWr>,
    total: usize,
    got: usize,
}

/// Apple profile: a send whose message is out, waiting for the receiver's verdict.
struct Unacked {
    wr_id: u64,
    len: usize,
    signaled: bool,
}

/// Apple profile: a message from queue pair `src`, whole, waiting for a receive.
struct Held {
    src: u32,
    data: Vec<u8>,
}

struct Qp {
    ctx: usize,
    pd: usize,
    send_cq: usize,
    recv_cq: usize,
    qpn: u32,
    state: u32,
    sq_sig_all: bool,
    max_send_wr: usize,
    max_recv_wr: usize,
    /// The port given at INIT (0 before).
    port: u8,
    port_up: bool,
    local_gids: Vec<[u8; 16]>,
    dest_qpn: u32,
    dgid: [u8; 16],
    dest_path: PathBuf,
    sock: UnixDatagram,
    path: PathBuf,
    sends: VecDeque<SendWr>,
    recvs: VecDeque<RecvWr>,
    incoming: Option<Incoming>,
    buf: Vec<u8>,
    /// Apple profile: sends out and not yet acknowledged, in order.
    unacked: VecDeque<Unacked>,
    /// Apple profile: the message being reassembled, and whole ones waiting for a receive.
    assembling: Option<Held>,
    assembling_total: usize,
    held: VecDeque<Held>,
    /// Apple profile: acknowledgements the peer's socket had no room for yet.
    pending_acks: VecDeque<(PathBuf, [u8; ACK])>,
}

/// One of a queue pair's two queues.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Queue {
    Send,
    Recv,
}

impl Qp {
    /// The frames outstanding on the send queue (Apple) or its work requests (rdma-core).
    fn send_depth(&self, profile: config::Profile) -> usize {
        match profile {
            config::Profile::Apple => {
                let queued: usize = self.sends.iter().map(|s| frames(s.len)).sum();
                queued + self.unacked.iter().map(|u| frames(u.len)).sum::<usize>()
            }
            config::Profile::RdmaCore => self.sends.len(),
        }
    }

    /// The scatter entry of a work request for `queue`, or the error that refuses the
    /// request: `EINVAL` unless `valid` (the post's own checks) and its `num_sge` entries at
    /// `sg_list` are at most [`MAX_SGE`] in a non-null list; `ENOMEM`, traced, if it does not
    /// fit the queue (4 KiB frames with the Apple profile, work requests with rdma-core).
    /// Reads the entry only once the request is valid.
    ///
    /// # Safety
    ///
    /// A list with `num_sge` at most [`MAX_SGE`] and not null holds `num_sge` readable
    /// entries.
    unsafe fn admit(
        &self,
        profile: config::Profile,
        queue: Queue,
        valid: bool,
        (num_sge, sg_list): (c_int, *mut ibv_sge),
    ) -> Result<Option<ibv_sge>, c_int> {
        let listed = (0..=MAX_SGE as c_int).contains(&num_sge);
        if !valid || !listed || (num_sge > 0 && sg_list.is_null()) {
            return Err(libc::EINVAL);
        }
        // SAFETY: one entry in a non-null list: readable, by the caller's contract.
        let sge = (num_sge == 1).then(|| unsafe { sg_list.read() });
        let (call, depth, max) = match queue {
            Queue::Send => ("post_send", self.send_depth(profile), self.max_send_wr),
            Queue::Recv => ("post_recv", self.recv_depth(profile), self.max_recv_wr),
        };
        let asked = match profile {
            config::Profile::Apple => frames(sge.map_or(0, |s| s.length as usize)),
            config::Profile::RdmaCore => 1,
        };
        if depth + asked > max {
            trace(format_args!(
                "{call} qpn={} refused: {depth} + {asked} over a depth of {max} (ENOMEM)",
                self.qpn
            ));
            return Err(libc::ENOMEM);
        }
        Ok(sge)
    }

    /// The frames outstanding on the receive queue (Apple) or its work requests (rdma-core).
    fn recv_depth(&self, profile: config::Profile) -> usize {
        match profile {
            config::Profile::Apple => self.recvs.iter().map(|r| frames(r.len)).sum(),
            config::Profile::RdmaCore => self.recvs.len(),
        }
    }
}

#[derive(Default)]
struct State {
    devices: Vec<Device>,
    lists: HashMap<usize, usize>,
    contexts: HashMap<usize, Ctx>,
    pds: HashMap<usize, Pd>,
    mrs: HashMap<usize, Mr>,
    cqs: HashMap<usize, Cq>,
    channels: HashMap<usize, Channel>,
    qps: HashMap<usize, Qp>,
    next_key: u32,
    sends_posted: u64,
    faults: Option<config::Faults>,
    settings: Option<Settings>,
    ports_down: bool,
}

/// The profile and the fate of early messages, read once.
#[derive(Clone, Copy)]
struct Settings {
    profile: config::Profile,
    hold: bool,
}

impl Settings {
    /// The settings the environment gives, or why they are unusable.
    fn read() -> Result<Settings, String> {
        let profile = config::profile()?;
        Ok(Settings {
            profile,
            hold: config::hold_early_sends(profile)?,
        })
    }
}

static STATE: LazyLock<Mutex<State>> = LazyLock::new(|| Mutex::new(State::default()));

fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Moves `value` to the heap for C to hold, returning its address (with its provenance
/// exposed, so [`reclaim`] can rebuild the pointer).
fn give<T>(value: T) -> usize {
    Box::into_raw(Box::new(value)).expose_provenance()
}

/// Frees what [`give`] handed out.
///
/// # Safety
///
/// `addr` came from `give::<T>` and is reclaimed once; no reference into it is live.
unsafe fn reclaim<T>(addr: usize) {
    let ptr = std::ptr::with_exposed_provenance_mut::<T>(addr);
    // SAFETY: the caller guarantees `ptr` is a live `Box<T>` allocation, freed once.
    drop(unsafe { Box::from_raw(ptr) });
}

/// An entry of one of [`State`]'s tables of objects handed out to C. Each table holds one C
/// type, and each entry is keyed by the address [`give`] returned for its object.
trait Handed: Sized {
    /// The C struct behind each key.
    type C;

    /// The table in `st`.
    fn table(st: &mut State) -> &mut HashMap<usize, Self>;
}

/// Names the table and the C type of each kind of entry.
macro_rules! handed {
    ($($entry:ty => $field:ident, $c:ty;)*) => {$(
        impl Handed for $entry {
            type C = $c;

            fn table(st: &mut State) -> &mut HashMap<usize, Self> {
                &mut st.$field
            }
        }
    )*};
}

handed! {
    Ctx => contexts, ibv_context;
    Pd => pds, ibv_pd;
    Mr => mrs, ibv_mr;
    Cq => cqs, ibv_cq;
    Channel => channels, ibv_comp_channel;
    Qp => qps, ibv_qp;
}

/// The verbs call `call` that destroys `obj`, an object of a `V` entry: `EINVAL` for an
/// unknown object, the error `refuse` gives while something still needs it, else 0 once the
/// entry is removed and the object freed. Traces `call rc=...`, with the table unlocked.
fn destroy<V: Handed>(
    call: &str,
    obj: *mut c_void,
    refuse: impl FnOnce(&mut State, usize) -> Option<c_int>,
) -> c_int {
    let addr = obj.addr();
    let rc = {
        let mut st = state();
        if !V::table(&mut st).contains_key(&addr) {
            libc::EINVAL
        } else if let Some(e) = refuse(&mut st, addr) {
            e
        } else {
            V::table(&mut st).remove(&addr);
            // SAFETY: `addr` keyed a live entry of `V`'s table, so `give::<V::C>` returned it;
            // the entry is gone now, so it is freed once, and C gave up the pointer by
            // destroying the object.
            unsafe { reclaim::<V::C>(addr) };
            0
        }
    };
    trace(format_args!("{call} rc={rc}"));
    rc
}

/// Whether [`LOG_VAR`] asks for a line per post and completion on stderr.
fn log_enabled() -> bool {
    static ON: LazyLock<bool> = LazyLock::new(|| std::env::var_os(LOG_VAR).is_some());
    *ON
}

/// Set (to anything) to log every post and completion on stderr, for debugging a test.
pub const LOG_VAR: &str = "NUVEC_VERBS_PROVIDER_LOG";

/// Set (to anything) to record every resource created and every queue-pair transition, with
/// its attributes, in `trace-<pid>` of the fabric directory: tests read it to check that the
/// set-up is MLX's.
pub const TRACE_VAR: &str = "NUVEC_VERBS_PROVIDER_TRACE";

/// Appends `line` to this process's trace file, if [`TRACE_VAR`] asks for one. Set-up calls
/// only: never on the data path.
fn trace(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    if std::env::var_os(TRACE_VAR).is_none() {
        return;
    }
    let path = config::fabric_dir().join(format!("trace-{}", std::process::id()));
    let _ = std::fs::create_dir_all(config::fabric_dir());
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = writeln!(f, "{line}");
    }
}

/// Sets this thread's `errno`, for functions that return NULL on failure.
fn set_errno(e: c_int) {
    #[cfg(target_os = "linux")]
    // SAFETY: `__errno_location` has no preconditions; it returns this thread's errno slot.
    let slot = unsafe { libc::__errno_location() };
    #[cfg(target_os = "macos")]
    // SAFETY: `__error` has no preconditions; it returns this thread's errno slot.
    let slot = unsafe { libc::__error() };
    #[cfg(any(target_os = "linux", target_os = "macos"))]
    // SAFETY: the slot is valid, aligned and writable for the life of the thread.
    unsafe {
        *slot = e
    };
    #[cfg(not(any(target_os = "linux", target_os = "macos")))]
    let _ = e;
}

impl State {
    fn faults(&mut self) -> config::Faults {
        *self.faults.get_or_insert_with(config::faults)
    }

    fn device_of(&self, ctx: usize) -> Option<&config::DeviceSpec> {
        let c = self.contexts.get(&ctx)?;
        self.devices.get(c.device).map(|d| &d.spec)
    }

    /// The settings, read on first use; unusable ones (reported by `ibv_get_device_list`,
    /// the first call of any program) fall back to the Apple profile, holding.
    fn settings(&mut self) -> Settings {
        *self.settings.get_or_insert_with(|| {
            Settings::read().unwrap_or(Settings {
                profile: config::Profile::Apple,
                hold: true,
            })
        })
    }

    fn profile(&mut self) -> config::Profile {
        self.settings().profile
    }

    /// Port `port`'s state on `ctx`'s device (every port is down after the `down` fault).
    fn port_state(&self, ctx: usize, port: u8) -> Option<u32> {
        let state = self.device_of(ctx)?.port_state(port)?;
        Some(if self.ports_down {
            IBV_PORT_DOWN
        } else {
            state
        })
    }

    /// Queue pairs alive on device `device` (an index into `devices`), through any context.
    fn queue_pairs_on(&self, device: usize) -> usize {
        self.qps
            .values()
            .filter(|q| {
                self.contexts
                    .get(&q.ctx)
                    .is_some_and(|c| c.device == device)
            })
            .count()
    }

    fn push(&mut self, cq: usize, wc: ibv_wc) {
        if log_enabled() {
            eprintln!(
                "verbs provider: qp {:#x} completes wr {:#x} status {} opcode {} len {}",
                wc.qp_num, wc.wr_id, wc.status, wc.opcode, wc.byte_len
            );
        }
        if let Some(cq) = self.cqs.get_mut(&cq) {
            if cq.entries.len() >= cq.cqe {
                cq.overrun = true;
            } else {
                cq.entries.push_back(wc);
            }
        }
    }

    /// Moves every queue pair's fragments: pending sends out, arrivals in.
    fn progress(&mut self) {
        let mut done: Vec<(usize, ibv_wc)> = Vec::new();
        let down = self.ports_down;
        let Settings { profile, hold } = self.settings();
        for qp in self.qps.values_mut() {
            match profile {
                config::Profile::Apple => {
                    qp.pump_sends(down, true, &mut done);
                    qp.pump_apple(down, &mut done);
                }
                config::Profile::RdmaCore => {
                    qp.pump_sends(down, false, &mut done);
                    qp.pump_arrivals(down, hold, &mut done);
                }
            }
        }
        for (cq, wc) in done {
            self.push(cq, wc);
        }
    }
}

fn wc(wr_id: u64, status: u32, opcode: u32, byte_len: usize, qpn: u32) -> ibv_wc {
    ibv_wc {
        wr_id,
        status,
        opcode,
        byte_len: u32::try_from(byte_len).unwrap_or(u32::MAX),
        qp_num: qpn,
        ..Default::default()
    }
}

/// The little-endian `u32` at word `i` of `b`, which holds at least `4 * (i + 1)` bytes.
fn word(b: &[u8], i: usize) -> u32 {
    let w = &b[4 * i..4 * i + 4];
    u32::from_le_bytes([w[0], w[1], w[2], w[3]])
}

/// A received fragment's header (see [`HEADER`]) and payload length.
struct Fragment {
    magic: u32,
    src: u32,
    dst: u32,
    total: usize,
    offset: usize,
    dgid: [u8; 16],
    len: usize,
}

impl Fragment {
    /// The header of `datagram`, or `None` if it is too short to hold one.
    fn read(datagram: &[u8]) -> Option<Fragment> {
        if datagram.len() < HEADER {
            return None;
        }
        let mut dgid = [0u8; 16];
        dgid.copy_from_slice(&datagram[20..36]);
        Some(Fragment {
            magic: word(datagram, 0),
            src: word(datagram, 1),
            dst: word(datagram, 2),
            total: word(datagram, 3) as usize,
            offset: word(datagram, 4) as usize,
            dgid,
            len: datagram.len() - HEADER,
        })
    }
}

impl Qp {
    /// Whether UC delivers fragment `f` here: this provider's magic, sent by the connected
    /// queue pair to this one and to a GID of its port, which is up (`down`: the ports-down
    /// fault), in RTR or RTS, and within its message. A refused fragment is logged.
    fn accepts(&self, f: &Fragment, down: bool) -> bool {
        let accepted = f.magic == MAGIC
            && f.dst == self.qpn
            && f.src == self.dest_qpn
            && matches!(self.state, IBV_QPS_RTR | IBV_QPS_RTS)
            && self.port_up
            && !down
            && f.dgid != [0; 16]
            && self.local_gids.contains(&f.dgid)
            && f.offset + f.len <= f.total;
        if !accepted && log_enabled() {
            eprintln!(
                "verbs provider: qp {:#x} drops a fragment from {:#x}",
                self.qpn, f.src
            );
        }
        accepted
    }

    /// Sends the fragments of the queued SENDs. A send completes once its message is out,
    /// lost (the peer's queue pair is gone) or failed; with `acked` (the Apple profile) a
    /// message that went out completes only when the receiver's acknowledgement comes.
    fn pump_sends(&mut self, down: bool, acked: bool, done: &mut Vec<(usize, ibv_wc)>) {
        self.flush_acks();
        while let Some(s) = self.sends.front_mut() {
            let mut lost = false;
            let status = match s.fate {
                _ if down || !self.port_up => Some(IBV_WC_RETRY_EXC_ERR),
                Fate::Fail(status) => Some(status),
                Fate::Drop => Some(IBV_WC_SUCCESS),
                Fate::Deliver => None,
            };
            if status.is_none() {
                let n = (s.len - s.offset).min(FRAGMENT);
                self.buf.clear();
                for word in [
                    MAGIC,
                    self.qpn,
                    self.dest_qpn,
                    s.len as u32,
                    s.offset as u32,
                ] {
                    self.buf.extend_from_slice(&word.to_le_bytes());
                }
                self.buf.extend_from_slice(&self.dgid);
                if n > 0 {
                    let src = std::ptr::with_exposed_provenance::<u8>(s.addr + s.offset);
                    // SAFETY: `post_send` checked that [addr, addr + len) lies inside a
                    // memory region registered with this QP's PD; the caller keeps
                    // registered memory mapped and does not free a buffer before its send
                    // completes (verbs' rule). The bytes are only read.
                    let payload = unsafe { std::slice::from_raw_parts(src, n) };
                    self.buf.extend_from_slice(payload);
                }
                if log_enabled() {
                    eprintln!(
                        "verbs provider: qp {:#x} sends {n} bytes from {:#x}+{}: {:02x?}",
                        self.qpn,
                        s.addr,
                        s.offset,
                        &self.buf[HEADER..HEADER + n.min(8)]
                    );
                }
                match self.sock.send_to(&self.buf, &self.dest_path) {
                    Ok(_) => s.offset += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                    // The peer's queue pair is gone: UC has no acknowledgement, so the send
                    // completes and the message is lost.
                    Err(e) => {
                        if log_enabled() {
                            eprintln!("verbs provider: qp {:#x} loses a send: {e}", self.qpn);
                        }
                        s.offset = s.len;
                        lost = true;
                    }
                }
                if s.offset < s.len {
                    continue;
                }
            }
            let status = status.unwrap_or(IBV_WC_SUCCESS);
            let signaled = s.signaled || status != IBV_WC_SUCCESS;
            let (wr_id, len) = (s.wr_id, s.len);
            let out = s.fate == Fate::Deliver && !lost && status == IBV_WC_SUCCESS;
            self.sends.pop_front();
            if acked && out {
                self.unacked.push_back(Unacked {
                    wr_id,
                    len,
                    signaled,
                });
            } else if signaled {
                done.push((self.send_cq, wc(wr_id, status, IBV_WC_SEND, len, self.qpn)));
            }
        }
    }

    fn pump_arrivals(&mut self, down: bool, hold: bool, done: &mut Vec<(usize, ibv_wc)>) {
        self.buf.resize(HEADER + FRAGMENT, 0);
        loop {
            // Holding early sends: the next datagram starts a message, and no receive is
            // posted for it, so it stays in the socket (its sender waits as the buffer fills).
            if hold && self.incoming.is_none() && self.recvs.is_empty() {
                break;
            }
            let n = match self.sock.recv(&mut self.buf) {
                Ok(n) => n,
                Err(_) => break,
            };
            let Some(f) = Fragment::read(&self.buf[..n]) else {
                continue;
            };
            if !self.accepts(&f, down) {
                continue;
            }
            let (total, offset, len) = (f.total, f.offset, f.len);
            if offset == 0 {
                if let Some(Incoming { recv: Some(r), .. }) = self.incoming.take() {
                    // A message cut short (its sender went away): its receive stays posted.
                    self.recvs.push_front(r);
                }
                let recv = self.recvs.pop_front();
                match recv {
                    Some(r) if total > r.len => {
                        done.push((
                            self.recv_cq,
                            wc(r.wr_id, IBV_WC_LOC_LEN_ERR, IBV_WC_RECV, 0, self.qpn),
                        ));
                        self.incoming = Some(Incoming {
                            recv: None,
                            total,
                            got: 0,
                        });
                    }
                    recv => {
                        self.incoming = Some(Incoming {
                            recv,
                            total,
                            got: 0,
                        })
                    }
                }
            }
            let Some(inc) = self.incoming.as_mut() else {
                continue;
            };
            if offset != inc.got || total != inc.total {
                // Out of sequence: UC drops the rest of the message.
                self.incoming = None;
                continue;
            }
            if let Some(r) = inc.recv
                && len > 0
            {
                let dst = std::ptr::with_exposed_provenance_mut::<u8>(r.addr + offset);
                // SAFETY: `post_recv` checked that [addr, addr + r.len) lies inside a region
                // registered with this QP's PD for local write, and `offset + len <= total
                // <= r.len`; until the receive completes the caller does not touch the
                // buffer (verbs' rule, which the binding enforces by holding the only
                // reference), so this is the only access.
                let target = unsafe { std::slice::from_raw_parts_mut(dst, len) };
                target.copy_from_slice(&self.buf[HEADER..n]);
                if log_enabled() {
                    eprintln!(
                        "verbs provider: qp {:#x} writes {len} bytes at {:#x}+{offset}: {:02x?}",
                        self.qpn,
                        r.addr,
                        &self.buf[HEADER..HEADER + len.min(8)]
                    );
                }
            }
            inc.got += len;
            if inc.got == inc.total {
                if let Some(r) = inc.recv {
                    done.push((
                        self.recv_cq,
                        wc(r.wr_id, IBV_WC_SUCCESS, IBV_WC_RECV, total, self.qpn),
                    ));
                }
                self.incoming = None;
            }
        }
    }

    /// Apple profile: takes every datagram waiting in the socket. Acknowledgements complete
    /// this queue pair's sends in order; fragments are reassembled into whole messages, which
    /// wait (credit-based flow control: never lost for want of a receive) until a receive is
    /// posted and then land in it, or fail it and their send if the two cover different
    /// numbers of frames; each message's sender is acknowledged with the verdict. A message
    /// UC would drop (wrong queue pair, GID or state, a port down) is acknowledged as
    /// delivered and discarded, since UC tells its sender nothing.
    fn pump_apple(&mut self, down: bool, done: &mut Vec<(usize, ibv_wc)>) {
        self.buf.resize(HEADER + FRAGMENT, 0);
        while let Ok(n) = self.sock.recv(&mut self.buf) {
            if n == ACK && word(&self.buf, 0) == ACK_MAGIC {
                let (dst, status) = (word(&self.buf, 2), word(&self.buf, 3));
                if dst != self.qpn {
                    continue;
                }
                if let Some(u) = self.unacked.pop_front()
                    && (u.signaled || status != IBV_WC_SUCCESS)
                {
                    done.push((
                        self.send_cq,
                        wc(u.wr_id, status, IBV_WC_SEND, u.len, self.qpn),
                    ));
                }
                continue;
            }
            let Some(f) = Fragment::read(&self.buf[..n]).filter(|f| f.magic == MAGIC) else {
                continue;
            };
            let (src, total, offset) = (f.src, f.total, f.offset);
            if !self.accepts(&f, down) {
                if offset == 0 {
                    self.ack(src, IBV_WC_SUCCESS);
                }
                continue;
            }
            if offset == 0 {
                // A message cut short before (its sender went away) is abandoned.
                self.assembling = Some(Held {
                    src,
                    data: Vec::with_capacity(total),
                });
                self.assembling_total = total;
            }
            let Some(msg) = self.assembling.as_mut() else {
                continue;
            };
            if offset != msg.data.len() || total != self.assembling_total || src != msg.src {
                // Out of sequence: the message is lost, and its sender told so.
                self.assembling = None;
                self.ack(src, IBV_WC_SUCCESS);
                continue;
            }
            msg.data.extend_from_slice(&self.buf[HEADER..n]);
            if msg.data.len() == total
                && let Some(whole) = self.assembling.take()
            {
                self.held.push_back(whole);
            }
        }
        self.deliver(done);
        self.flush_acks();
    }

    /// Apple profile: lands held messages in posted receives, in order.
    fn deliver(&mut self, done: &mut Vec<(usize, ibv_wc)>) {
        while !self.held.is_empty() && !self.recvs.is_empty() {
            let (Some(msg), Some(r)) = (self.held.pop_front(), self.recvs.pop_front()) else {
                break;
            };
            let len = msg.data.len();
            let (recv_status, send_status) = if frames(len) != frames(r.len) || len > r.len {
                (IBV_WC_LOC_LEN_ERR, IBV_WC_REM_INV_REQ_ERR)
            } else {
                if len > 0 {
                    let dst = std::ptr::with_exposed_provenance_mut::<u8>(r.addr);
                    // SAFETY: `post_recv` checked that [addr, addr + r.len) lies inside a region
                    // registered with this QP's PD for local write, and `len <= r.len`; until the
                    // receive completes the caller does not touch the buffer (verbs' rule, which
                    // the binding enforces by holding the only reference), so this is the only
                    // access.
                    let target = unsafe { std::slice::from_raw_parts_mut(dst, len) };
                    target.copy_from_slice(&msg.data);
                }
                (IBV_WC_SUCCESS, IBV_WC_SUCCESS)
            };
            if log_enabled() {
                eprintln!(
                    "verbs provider: qp {:#x} lands {len} bytes from qp {:#x} in a {} byte \
                     receive: status {recv_status}",
                    self.qpn, msg.src, r.len
                );
            }
            let byte_len = if recv_status == IBV_WC_SUCCESS {
                len
            } else {
                0
            };
            done.push((
                self.recv_cq,
                wc(r.wr_id, recv_status, IBV_WC_RECV, byte_len, self.qpn),
            ));
            self.ack(msg.src, send_status);
        }
    }

    /// Apple profile: queues the verdict on queue pair `to`'s message.
    fn ack(&mut self, to: u32, status: u32) {
        let mut ack = [0u8; ACK];
        for (i, word) in [ACK_MAGIC, self.qpn, to, status].into_iter().enumerate() {
            ack[4 * i..4 * i + 4].copy_from_slice(&word.to_le_bytes());
        }
        let path = config::fabric_dir().join(format!("qp-{to}"));
        self.pending_acks.push_back((path, ack));
        self.flush_acks();
    }

    /// Sends the queued acknowledgements the peers' sockets have room for; one whose
    /// queue pair is gone is dropped (nobody waits for it).
    fn flush_acks(&mut self) {
        while let Some((path, ack)) = self.pending_acks.front() {
            match self.sock.send_to(ack, path) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                _ => {
                    self.pending_acks.pop_front();
                }
            }
        }
    }

    /// Completes every outstanding request with a flush error (the QP entered ERR).
    fn flush(&mut self, done: &mut Vec<(usize, ibv_wc)>) {
        for s in self.sends.drain(..) {
            done.push((
                self.send_cq,
                wc(s.wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND, 0, self.qpn),
            ));
        }
        if let Some(Incoming { recv: Some(r), .. }) = self.incoming.take() {
            self.recvs.push_front(r);
        }
        for r in self.recvs.drain(..) {
            done.push((
                self.recv_cq,
                wc(r.wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0, self.qpn),
            ));
        }
        for u in self.unacked.drain(..) {
            done.push((
                self.send_cq,
                wc(u.wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND, 0, self.qpn),
            ));
        }
        self.discard_held();
    }

    /// Apple profile: drops the messages waiting for a receive, telling their senders they
    /// were delivered (UC reports no loss).
    fn discard_held(&mut self) {
        self.assembling = None;
        let senders: Vec<u32> = self.held.drain(..).map(|h| h.src).collect();
        for src in senders {
            self.ack(src, IBV_WC_SUCCESS);
        }
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // Apple profile: senders still waiting on this queue pair learn that their messages
        // went nowhere; the socket gets a moment to pass the last acknowledgements on.
        self.discard_held();
        if !self.pending_acks.is_empty()
            && self.sock.set_nonblocking(false).is_ok()
            && self
                .sock
                .set_write_timeout(Some(std::time::Duration::from_millis(100)))
                .is_ok()
        {
            while let Some((path, ack)) = self.pending_acks.pop_front() {
                let _ = self.sock.send_to(&ack, &path);
            }
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

// ---------------------------------------------------------------------------------------
// Devices and contexts

/// `struct ibv_device **ibv_get_device_list(int *num_devices)`.
///
/// # Safety
///
/// `num` is NULL or points to a writable `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_device_list(num: *mut c_int) -> *mut *mut c_void {
    let specs = match Settings::read().and_then(|s| config::devices(s.profile)) {
        Ok(specs) => specs,
        Err(e) => {
            eprintln!("nuvec verbs provider: {e}");
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
    };
    let mut st = state();
    let mut list: Vec<*mut c_void> = Vec::with_capacity(specs.len() + 1);
    for spec in specs {
        let index = match st.devices.iter().position(|d| d.spec.name == spec.name) {
            Some(i) => {
                st.devices[i].spec = spec;
                i
            }
            None => {
                let mut name = [0 as c_char; 64];
                for (to, &from) in name.iter_mut().zip(spec.name.as_bytes()) {
                    *to = from as c_char;
                }
                let device: &'static mut ibv_device = Box::leak(Box::new(ibv_device { name }));
                let c = (device as *mut ibv_device).expose_provenance();
                st.devices.push(Device { spec, c });
                st.devices.len() - 1
            }
        };
        list.push(std::ptr::with_exposed_provenance_mut(st.devices[index].c));
    }
    let count = list.len();
    list.push(std::ptr::null_mut());
    let list = Box::into_raw(list.into_boxed_slice());
    let addr = list.cast::<*mut c_void>().expose_provenance();
    st.lists.insert(addr, count + 1);
    if !num.is_null() {
        // SAFETY: `num` is non-null and, by the caller's contract, a writable int.
        unsafe { num.write(c_int::try_from(count).unwrap_or(c_int::MAX)) };
    }
    std::ptr::with_exposed_provenance_mut(addr)
}

/// `void ibv_free_device_list(struct ibv_device **list)`.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_free_device_list(list: *mut *mut c_void) {
    let Some(len) = state().lists.remove(&list.addr()) else {
        return;
    };
    let slice = std::ptr::slice_from_raw_parts_mut(list, len);
    // SAFETY: `list` is a list this provider built (it was in `lists`, now removed, so it is
    // freed once) as a boxed slice of `len` pointers.
    drop(unsafe { Box::from_raw(slice) });
}

/// `const char *ibv_get_device_name(struct ibv_device *device)`.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_get_device_name(device: *mut c_void) -> *const c_char {
    let st = state();
    match st.devices.iter().find(|d| d.c == device.addr()) {
        Some(d) => std::ptr::with_exposed_provenance::<c_char>(d.c),
        None => std::ptr::null(),
    }
}

/// `struct ibv_context *ibv_open_device(struct ibv_device *device)`.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_open_device(device: *mut c_void) -> *mut c_void {
    let mut st = state();
    let Some(index) = st.devices.iter().position(|d| d.c == device.addr()) else {
        set_errno(libc::ENODEV);
        return std::ptr::null_mut();
    };
    let poll: PollCqFn = poll_cq;
    let notify: ReqNotifyCqFn = req_notify_cq;
    let send: PostSendFn = post_send;
    let recv: PostRecvFn = post_recv;
    let ctx = ibv_context {
        device: std::ptr::with_exposed_provenance_mut(st.devices[index].c),
        ops: ibv_context_ops {
            _before_poll_cq: [std::ptr::null(); 11],
            poll_cq: Some(poll),
            req_notify_cq: Some(notify),
            _before_post_send: [std::ptr::null(); 12],
            post_send: Some(send),
            post_recv: Some(recv),
            _after_post_recv: [std::ptr::null(); 5],
        },
        cmd_fd: -1,
        async_fd: -1,
        num_comp_vectors: 1,
        _mutex: [0; 8],
        abi_compat: std::ptr::null_mut(),
    };
    let addr = give(ctx);
    st.contexts.insert(addr, Ctx { device: index });
    std::ptr::with_exposed_provenance_mut(addr)
}

/// `int ibv_close_device(struct ibv_context *context)`: `EBUSY` while anything created on
/// it is alive (rdma-core would leak it; refusing shows a wrong teardown order).
#[unsafe(no_mangle)]
pub extern "C" fn ibv_close_device(ctx: *mut c_void) -> c_int {
    destroy::<Ctx>("close_device", ctx, |st, addr| {
        let used = st.pds.values().any(|p| p.ctx == addr)
            || st.cqs.values().any(|c| c.ctx == addr)
            || st.channels.values().any(|c| c.ctx == addr);
        used.then_some(libc::EBUSY)
    })
}

/// `int ibv_query_device(struct ibv_context *, struct ibv_device_attr *)`: the port count
/// and the queue-pair limit the device was given; the other limits are this provider's.
///
/// # Safety
///
/// `attr` points to a writable `struct ibv_device_attr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_device(ctx: *mut c_void, attr: *mut c_void) -> c_int {
    let attr = attr.cast::<ibv_device_attr>();
    let st = state();
    let Some(spec) = st.device_of(ctx.addr()) else {
        return libc::EINVAL;
    };
    if attr.is_null() {
        return libc::EINVAL;
    }
    let mut fw_ver = [0 as c_char; 64];
    for (to, &from) in fw_ver.iter_mut().zip(b"nuvec-verbs-provider") {
        *to = from as c_char;
    }
    let out = ibv_device_attr {
        fw_ver,
        guids: [0; 2],
        max_mr_size: 1 << 40,
        page_size_cap: 0x1000,
        ids: [0; 3],
        max_qp: c_int::try_from(spec.max_qp).unwrap_or(c_int::MAX),
        max_qp_wr: MAX_WR as c_int,
        device_cap_flags: 0,
        max_sge: MAX_SGE as c_int,
        max_sge_rd: 0,
        max_cq: 1 << 16,
        max_cqe: 1 << 16,
        max_mr: 1 << 16,
        max_pd: 1 << 16,
        other_limits: [0; 20],
        max_pkeys: 1,
        local_ca_ack_delay: 0,
        phys_port_cnt: spec.ports,
    };
    // SAFETY: `attr` is non-null and, by the caller's contract, a writable device_attr.
    unsafe { attr.write(out) };
    0
}

/// `int ibv_query_port(struct ibv_context *, uint8_t port_num, struct ibv_port_attr *)`:
/// any port of the device; the cabled one has its state and GID table, the others are down
/// with a link-local GID only.
///
/// # Safety
///
/// `attr` points to a writable `struct ibv_port_attr` of rdma-core v44's size.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_port(ctx: *mut c_void, port: u8, attr: *mut c_void) -> c_int {
    let attr = attr.cast::<ibv_port_attr>();
    let st = state();
    let (Some(gids), Some(state)) = (
        st.device_of(ctx.addr()).and_then(|d| d.port_gids(port)),
        st.port_state(ctx.addr(), port),
    ) else {
        return libc::EINVAL;
    };
    if attr.is_null() {
        return libc::EINVAL;
    }
    let out = ibv_port_attr {
        state,
        max_mtu: IBV_MTU_1024,
        active_mtu: IBV_MTU_1024,
        gid_tbl_len: gids.len() as c_int,
        max_msg_sz: 1 << 30,
        pkey_tbl_len: 1,
        link_layer: IBV_LINK_LAYER_ETHERNET,
        phys_state: if state == IBV_PORT_ACTIVE { 5 } else { 3 },
        ..Default::default()
    };
    // SAFETY: `attr` is non-null and, by the caller's contract, a writable port_attr.
    unsafe { attr.write(out) };
    0
}

/// `int ibv_query_gid(struct ibv_context *, uint8_t port_num, int index, union ibv_gid *)`:
/// -1 with `errno` for a bad port or index, as rdma-core.
///
/// # Safety
///
/// `gid` points to a writable 16-byte `union ibv_gid`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_gid(
    ctx: *mut c_void,
    port: u8,
    index: c_int,
    gid: *mut c_void,
) -> c_int {
    let gid = gid.cast::<ibv_gid>();
    let st = state();
    let entry = st
        .device_of(ctx.addr())
        .filter(|_| !gid.is_null())
        .and_then(|spec| spec.port_gids(port)?.get(usize::try_from(index).ok()?));
    let Some(&raw) = entry else {
        set_errno(libc::EINVAL);
        return -1;
    };
    // SAFETY: `gid` is non-null and, by the caller's contract, a writable gid.
    unsafe { gid.write(ibv_gid { raw }) };
    0
}

// ---------------------------------------------------------------------------------------
// Protection domains and memory regions

/// `struct ibv_pd *ibv_alloc_pd(struct ibv_context *)`.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_alloc_pd(ctx: *mut c_void) -> *mut c_void {
    let mut st = state();
    if !st.contexts.contains_key(&ctx.addr()) {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    st.next_key += 1;
    let addr = give(ibv_pd {
        context: ctx.cast(),
        handle: st.next_key,
    });
    st.pds.insert(
        addr,
        Pd {
            ctx: ctx.addr(),
            poisoned: false,
        },
    );
    std::ptr::with_exposed_provenance_mut(addr)
}

/// `int ibv_dealloc_pd(struct ibv_pd *)`: `EBUSY` while a queue pair or region uses it.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_dealloc_pd(pd: *mut c_void) -> c_int {
    destroy::<Pd>("dealloc_pd", pd, |st, addr| {
        let used = st.qps.values().any(|q| q.pd == addr) || st.mrs.values().any(|m| m.pd == addr);
        used.then_some(libc::EBUSY)
    })
}

/// `struct ibv_mr *ibv_reg_mr(struct ibv_pd *, void *addr, size_t length, int access)`.
/// Remote write or atomic access without local write is `EINVAL`, as the verbs spec says;
/// with the Apple profile, so is anything short of local write, remote read and remote
/// write.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_reg_mr(
    pd: *mut c_void,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> *mut c_void {
    let mut st = state();
    let known = IBV_ACCESS_LOCAL_WRITE
        | IBV_ACCESS_REMOTE_WRITE
        | IBV_ACCESS_REMOTE_READ
        | IBV_ACCESS_REMOTE_ATOMIC;
    let remote_writes = access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC) != 0;
    let apple_rights = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
    let apple_refuses =
        st.profile() == config::Profile::Apple && access & apple_rights != apple_rights;
    let bad = !st.pds.contains_key(&pd.addr())
        || apple_refuses
        || access & !known != 0
        || (remote_writes && access & IBV_ACCESS_LOCAL_WRITE == 0)
        || (addr.is_null() && len > 0)
        || addr.addr().checked_add(len).is_none();
    if bad {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    let ctx = st.pds[&pd.addr()].ctx;
    st.next_key += 1;
    let lkey = st.next_key;
    let mr = give(ibv_mr {
        context: std::ptr::with_exposed_provenance_mut(ctx),
        pd: pd.cast(),
        addr,
        length: len,
        handle: lkey,
        lkey,
        rkey: lkey,
    });
    trace(format_args!("reg_mr len={len} access={access}"));
    st.mrs.insert(
        mr,
        Mr {
            pd: pd.addr(),
            addr: addr.expose_provenance(),
            len,
            lkey,
        },
    );
    std::ptr::with_exposed_provenance_mut(mr)
}

/// `int ibv_dereg_mr(struct ibv_mr *)`: with the Apple profile, `EBUSY` while a queue pair
/// of the region's PD exists and `EIO` once one of them was moved to ERR (the region then
/// stays).
#[unsafe(no_mangle)]
pub extern "C" fn ibv_dereg_mr(mr: *mut c_void) -> c_int {
    destroy::<Mr>("dereg_mr", mr, |st, addr| {
        let Some(pd) = st.mrs.get(&addr).map(|m| m.pd) else {
            return Some(libc::EINVAL);
        };
        if st.profile() != config::Profile::Apple {
            None
        } else if st.pds.get(&pd).is_some_and(|p| p.poisoned) {
            Some(libc::EIO)
        } else {
            st.qps.values().any(|q| q.pd == pd).then_some(libc::EBUSY)
        }
    })
}

/// The region of `pd` that holds `[addr, addr + len)` under key `lkey`.
fn region_holds(st: &State, pd: usize, lkey: u32, addr: u64, len: u32) -> bool {
    let (Ok(addr), Ok(len)) = (usize::try_from(addr), usize::try_from(len)) else {
        return false;
    };
    st.mrs.values().any(|m| {
        m.lkey == lkey
            && m.pd == pd
            && addr >= m.addr
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= m.addr + m.len)
    })
}

// ---------------------------------------------------------------------------------------
// Completion queues

/// `struct ibv_cq *ibv_create_cq(struct ibv_context *, int cqe, void *cq_context, struct
/// ibv_comp_channel *, int comp_vector)`. The channel, if any, must be one of the same
/// context.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_create_cq(
    ctx: *mut c_void,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut c_void,
    vector: c_int,
) -> *mut c_void {
    let mut st = state();
    if !st.contexts.contains_key(&ctx.addr()) || !(1..=65536).contains(&cqe) || vector != 0 {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    if !channel.is_null()
        && st
            .channels
            .get(&channel.addr())
            .is_none_or(|c| c.ctx != ctx.addr())
    {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    st.next_key += 1;
    let addr = give(ibv_cq {
        context: ctx.cast(),
        channel,
        cq_context,
        handle: st.next_key,
        cqe,
    });
    trace(format_args!(
        "create_cq cqe={cqe} channel={}",
        !channel.is_null()
    ));
    st.cqs.insert(
        addr,
        Cq {
            ctx: ctx.addr(),
            cqe: cqe as usize,
            entries: VecDeque::with_capacity(cqe as usize),
            overrun: false,
            channel: channel.addr(),
            armed: false,
            unacked: 0,
        },
    );
    std::ptr::with_exposed_provenance_mut(addr)
}

/// `int ibv_destroy_cq(struct ibv_cq *)`: `EBUSY` while a queue pair uses it.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_destroy_cq(cq: *mut c_void) -> c_int {
    destroy::<Cq>("destroy_cq", cq, |st, addr| {
        let used = st
            .qps
            .values()
            .any(|q| q.send_cq == addr || q.recv_cq == addr);
        used.then_some(libc::EBUSY)
    })
}

/// `struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *)`.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_create_comp_channel(ctx: *mut c_void) -> *mut c_void {
    if std::env::var(CHANNELS_VAR).is_ok_and(|v| v == "off") {
        set_errno(libc::ENOSYS);
        return std::ptr::null_mut();
    }
    let mut st = state();
    if !st.contexts.contains_key(&ctx.addr()) {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    let placeholder = match UnixDatagram::unbound().and_then(|s| {
        s.set_nonblocking(true)?;
        Ok(s)
    }) {
        Ok(s) => std::os::fd::OwnedFd::from(s),
        Err(e) => {
            set_errno(e.raw_os_error().unwrap_or(libc::EIO));
            return std::ptr::null_mut();
        }
    };
    let addr = give(ibv_comp_channel {
        context: ctx.cast(),
        fd: std::os::fd::AsRawFd::as_raw_fd(&placeholder),
        refcnt: 0,
    });
    trace(format_args!("create_comp_channel"));
    st.channels.insert(
        addr,
        Channel {
            ctx: ctx.addr(),
            fd: placeholder,
            bound: false,
        },
    );
    std::ptr::with_exposed_provenance_mut(addr)
}

/// `int ibv_destroy_comp_channel(struct ibv_comp_channel *)`: `EBUSY` while a CQ uses it.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_destroy_comp_channel(channel: *mut c_void) -> c_int {
    destroy::<Channel>("destroy_comp_channel", channel, |st, addr| {
        st.cqs
            .values()
            .any(|c| c.channel == addr)
            .then_some(libc::EBUSY)
    })
}

/// `ibv_req_notify_cq`, through the operations table: the next completion of `cq` raises an
/// event on its channel. Solicited-only is treated as any (UC SENDs here are unsolicited).
extern "C" fn req_notify_cq(cq: *mut ibv_cq, _solicited_only: c_int) -> c_int {
    let mut st = state();
    match st.cqs.get_mut(&cq.addr()) {
        Some(c) if c.channel != 0 => {
            c.armed = true;
            0
        }
        _ => libc::EINVAL,
    }
}

/// `int ibv_get_cq_event(struct ibv_comp_channel *, struct ibv_cq **, void **)`: moves data,
/// then hands out the event of an armed CQ of the channel that has completions (disarming
/// it). Never blocks: with no event it fails with `EAGAIN`, as a non-blocking channel does.
///
/// # Safety
///
/// `cq_out` and `context_out` point to writable pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_cq_event(
    channel: *mut c_void,
    cq_out: *mut *mut c_void,
    context_out: *mut *mut c_void,
) -> c_int {
    let mut st = state();
    if !st.channels.contains_key(&channel.addr()) || cq_out.is_null() || context_out.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    st.progress();
    let ready = st.cqs.iter_mut().find(|(_, c)| {
        c.channel == channel.addr() && c.armed && (!c.entries.is_empty() || c.overrun)
    });
    let Some((&addr, cq)) = ready else {
        set_errno(libc::EAGAIN);
        return -1;
    };
    cq.armed = false;
    cq.unacked += 1;
    let cq_ptr = std::ptr::with_exposed_provenance_mut::<ibv_cq>(addr);
    // SAFETY: `addr` is a live CQ from `give::<ibv_cq>`; its `cq_context` is read.
    let context = unsafe { (*cq_ptr).cq_context };
    // SAFETY: the caller guarantees both out-pointers are writable.
    unsafe { cq_out.write(cq_ptr.cast()) };
    // SAFETY: as above.
    unsafe { context_out.write(context) };
    0
}

/// `void ibv_ack_cq_events(struct ibv_cq *, unsigned int nevents)`.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_ack_cq_events(cq: *mut c_void, nevents: std::ffi::c_uint) {
    if let Some(c) = state().cqs.get_mut(&cq.addr()) {
        c.unacked = c.unacked.saturating_sub(u64::from(nevents));
    }
}

/// `ibv_poll_cq`, through the operations table: moves data, then hands out up to `n`
/// completions. A CQ that overflowed returns `-EOVERFLOW` from then on.
///
/// # Safety
///
/// `wc` points to `n` writable `struct ibv_wc`.
unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    let mut st = state();
    st.progress();
    let Some(cq) = st.cqs.get_mut(&cq.addr()) else {
        return -libc::EINVAL;
    };
    if cq.overrun {
        return -libc::EOVERFLOW;
    }
    let want = usize::try_from(n).unwrap_or(0);
    let mut given = 0;
    while given < want {
        let Some(entry) = cq.entries.pop_front() else {
            break;
        };
        let slot = wc.wrapping_add(given);
        // SAFETY: `slot` is entry `given < n` of the caller's array of `n` writable entries.
        unsafe { slot.write(entry) };
        given += 1;
    }
    given as c_int
}

// ---------------------------------------------------------------------------------------
// Queue pairs

/// `struct ibv_qp *ibv_create_qp(struct ibv_pd *, struct ibv_qp_init_attr *)`: UC only,
/// one scatter-gather entry, no inline data, no shared receive queue; `EBUSY` once the
/// device has as many queue pairs as it allows (ten with the Apple profile), counted over
/// all its contexts.
///
/// # Safety
///
/// `init` points to a readable `struct ibv_qp_init_attr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_qp(pd: *mut c_void, init: *mut c_void) -> *mut c_void {
    let init = init.cast::<ibv_qp_init_attr>();
    if init.is_null() {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    // SAFETY: non-null and, by the caller's contract, a readable init_attr.
    let attr = unsafe { init.read() };
    let mut st = state();
    let Some(ctx) = st.pds.get(&pd.addr()).map(|p| p.ctx) else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    let cq_ok = |cq: *mut ibv_cq| st.cqs.get(&cq.addr()).is_some_and(|c| c.ctx == ctx);
    let cap = attr.cap;
    let valid = attr.qp_type == IBV_QPT_UC
        && cq_ok(attr.send_cq)
        && cq_ok(attr.recv_cq)
        && attr.srq.is_null()
        && (1..=MAX_WR).contains(&cap.max_send_wr)
        && (1..=MAX_WR).contains(&cap.max_recv_wr)
        && cap.max_send_sge <= MAX_SGE
        && cap.max_recv_sge <= MAX_SGE
        && cap.max_inline_data == 0;
    if !valid {
        set_errno(if attr.qp_type == IBV_QPT_UC {
            libc::EINVAL
        } else {
            libc::EOPNOTSUPP
        });
        return std::ptr::null_mut();
    }
    let device = st.contexts.get(&ctx).map_or(usize::MAX, |c| c.device);
    let limit = st.device_of(ctx).map_or(usize::MAX, |d| d.max_qp);
    let held = st.queue_pairs_on(device);
    if held >= limit {
        let name = st.device_of(ctx).map_or("?", |d| d.name.as_str());
        trace(format_args!(
            "create_qp device={name} refused: {held} queue pairs of {limit} (EBUSY)"
        ));
        set_errno(libc::EBUSY);
        return std::ptr::null_mut();
    }
    let dir = config::fabric_dir();
    if let Err(e) = std::fs::create_dir_all(&dir) {
        set_errno(e.raw_os_error().unwrap_or(libc::EIO));
        return std::ptr::null_mut();
    }
    // Queue-pair numbers are 24 bits and must be unique on the fabric: the socket's name
    // is the number, so a bind that succeeds is the claim.
    let mut qpn = (std::process::id().wrapping_mul(40_503) & 0xff_ff00) | 1;
    let (sock, path) = loop {
        let path = dir.join(format!("qp-{qpn}"));
        match UnixDatagram::bind(&path) {
            Ok(sock) => break (sock, path),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => qpn = (qpn + 1) & 0xff_ffff,
            Err(e) => {
                set_errno(e.raw_os_error().unwrap_or(libc::EIO));
                return std::ptr::null_mut();
            }
        }
    };
    if let Err(e) = sock.set_nonblocking(true) {
        set_errno(e.raw_os_error().unwrap_or(libc::EIO));
        return std::ptr::null_mut();
    }
    st.next_key += 1;
    let addr = give(ibv_qp {
        context: std::ptr::with_exposed_provenance_mut(ctx),
        qp_context: attr.qp_context,
        pd: pd.cast(),
        send_cq: attr.send_cq,
        recv_cq: attr.recv_cq,
        srq: std::ptr::null_mut(),
        handle: st.next_key,
        qp_num: qpn,
        state: IBV_QPS_RESET,
        qp_type: IBV_QPT_UC,
    });
    let device = st
        .device_of(ctx)
        .map_or_else(String::new, |d| d.name.clone());
    trace(format_args!(
        "create_qp qpn={qpn} device={device} type={} send_wr={} recv_wr={} send_sge={} \
         recv_sge={} inline={} sig_all={} same_cq={}",
        attr.qp_type,
        cap.max_send_wr,
        cap.max_recv_wr,
        cap.max_send_sge,
        cap.max_recv_sge,
        cap.max_inline_data,
        attr.sq_sig_all,
        attr.send_cq == attr.recv_cq
    ));
    // The receive CQ's channel, if any and not yet bound, follows this queue pair's socket.
    let channel = st.cqs.get(&attr.recv_cq.addr()).map_or(0, |c| c.channel);
    if let Some(ch) = st.channels.get_mut(&channel)
        && !ch.bound
    {
        use std::os::fd::AsRawFd;
        // SAFETY: both descriptors are open and owned by this provider (the socket by the
        // queue pair, the target by the channel); `dup2` makes the channel's descriptor
        // number refer to the socket, closing the placeholder, without touching memory.
        let rc = unsafe { libc::dup2(sock.as_raw_fd(), ch.fd.as_raw_fd()) };
        ch.bound = rc >= 0;
    }
    st.qps.insert(
        addr,
        Qp {
            ctx,
            pd: pd.addr(),
            send_cq: attr.send_cq.addr(),
            recv_cq: attr.recv_cq.addr(),
            qpn,
            state: IBV_QPS_RESET,
            sq_sig_all: attr.sq_sig_all != 0,
            max_send_wr: cap.max_send_wr as usize,
            max_recv_wr: cap.max_recv_wr as usize,
            port: 0,
            port_up: false,
            local_gids: Vec::new(),
            dest_qpn: 0,
            dgid: [0; 16],
            dest_path: PathBuf::new(),
            sock,
            path,
            sends: VecDeque::new(),
            recvs: VecDeque::new(),
            incoming: None,
            buf: Vec::with_capacity(HEADER + FRAGMENT),
            unacked: VecDeque::new(),
            assembling: None,
            assembling_total: 0,
            held: VecDeque::new(),
            pending_acks: VecDeque::new(),
        },
    );
    std::ptr::with_exposed_provenance_mut(addr)
}

/// `int ibv_destroy_qp(struct ibv_qp *)`.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_destroy_qp(qp: *mut c_void) -> c_int {
    destroy::<Qp>("destroy_qp", qp, |_, _| None)
}

/// The attributes a UC transition requires and allows (the kernel's `qp_state_table`).
fn transition(from: u32, to: u32) -> Option<(c_int, c_int)> {
    let s = IBV_QP_STATE;
    Some(match (from, to) {
        (_, IBV_QPS_RESET) | (_, IBV_QPS_ERR) => (s, 0),
        (IBV_QPS_RESET, IBV_QPS_INIT) => {
            (s | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0)
        }
        (IBV_QPS_INIT, IBV_QPS_INIT) => (s, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
        (IBV_QPS_INIT, IBV_QPS_RTR) => (
            s | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN,
            IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX,
        ),
        (IBV_QPS_RTR, IBV_QPS_RTS) => (
            s | IBV_QP_SQ_PSN,
            IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PATH_MIG_STATE,
        ),
        (IBV_QPS_RTS, IBV_QPS_RTS) => (
            s,
            IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE,
        ),
        _ => return None,
    })
}

/// `int ibv_modify_qp(struct ibv_qp *, struct ibv_qp_attr *, int attr_mask)`: `EINVAL` for a
/// transition UC does not have, a required attribute missing or one not allowed given, or a
/// bad value.
///
/// # Safety
///
/// `attr` points to a readable `struct ibv_qp_attr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_modify_qp(qp: *mut c_void, attr: *mut c_void, mask: c_int) -> c_int {
    let attr = attr.cast::<ibv_qp_attr>();
    if attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: non-null and, by the caller's contract, a readable qp_attr.
    let a = unsafe { attr.read() };
    let mut st = state();
    let Some(q) = st.qps.get(&qp.addr()) else {
        return libc::EINVAL;
    };
    let (ctx, pd) = (q.ctx, q.pd);
    let Some(spec) = st.device_of(ctx).cloned() else {
        return libc::EINVAL;
    };
    let port_state = (mask & IBV_QP_PORT != 0)
        .then(|| st.port_state(ctx, a.port_num))
        .flatten();
    let apple = st.profile() == config::Profile::Apple;
    let Some(q) = st.qps.get_mut(&qp.addr()) else {
        return libc::EINVAL;
    };
    if mask & IBV_QP_STATE == 0 {
        return libc::EINVAL;
    }
    let Some((required, optional)) = transition(q.state, a.qp_state) else {
        return libc::EINVAL;
    };
    if mask & required != required || mask & !(required | optional) != 0 {
        return libc::EINVAL;
    }
    if mask & IBV_QP_CUR_STATE != 0 && a.cur_qp_state != q.state {
        return libc::EINVAL;
    }
    if mask & IBV_QP_PORT != 0 && port_state.is_none() {
        return libc::EINVAL;
    }
    if mask & IBV_QP_PKEY_INDEX != 0 && a.pkey_index != 0 {
        return libc::EINVAL;
    }
    if mask & IBV_QP_ACCESS_FLAGS != 0
        && a.qp_access_flags
            & !((IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ) as u32)
            != 0
    {
        return libc::EINVAL;
    }
    if mask & IBV_QP_PATH_MTU != 0 && !(1..=IBV_MTU_1024).contains(&a.path_mtu) {
        return libc::EINVAL;
    }
    for (bit, value) in [
        (IBV_QP_DEST_QPN, a.dest_qp_num),
        (IBV_QP_RQ_PSN, a.rq_psn),
        (IBV_QP_SQ_PSN, a.sq_psn),
    ] {
        if mask & bit != 0 && value > 0xff_ffff {
            return libc::EINVAL;
        }
    }
    if mask & IBV_QP_AV != 0 {
        let ah = a.ah_attr;
        // An Ethernet port routes by GID: an address without a GRH is refused (as for RoCE),
        // the source GID index must name a GID the port has, and the port must be the one
        // the queue pair was bound to at INIT.
        let sgid_ok = q
            .local_gids
            .get(usize::from(ah.grh.sgid_index))
            .is_some_and(|g| *g != [0; 16]);
        if ah.port_num != q.port || ah.is_global == 0 || !sgid_ok || ah.grh.dgid.raw == [0; 16] {
            return libc::EINVAL;
        }
    }
    let mut done = Vec::new();
    match a.qp_state {
        IBV_QPS_INIT if mask & IBV_QP_PORT != 0 => {
            q.port = a.port_num;
            q.port_up = port_state == Some(IBV_PORT_ACTIVE);
            q.local_gids = spec.port_gids(a.port_num).unwrap_or_default().to_vec();
        }
        IBV_QPS_RTR => {
            q.dest_qpn = a.dest_qp_num;
            q.dgid = a.ah_attr.grh.dgid.raw;
            q.dest_path = config::fabric_dir().join(format!("qp-{}", a.dest_qp_num));
        }
        IBV_QPS_ERR => q.flush(&mut done),
        IBV_QPS_RESET => {
            q.sends.clear();
            q.recvs.clear();
            q.incoming = None;
        }
        _ => {}
    }
    let ah = a.ah_attr;
    match a.qp_state {
        IBV_QPS_INIT => trace(format_args!(
            "modify qpn={} INIT port={} pkey={} access={}",
            q.qpn, a.port_num, a.pkey_index, a.qp_access_flags
        )),
        IBV_QPS_RTR => trace(format_args!(
            "modify qpn={} RTR mtu={} dest={} rq_psn={} global={} hop={} sgid={} dlid={} \
             port={} dgid={}",
            q.qpn,
            a.path_mtu,
            a.dest_qp_num,
            a.rq_psn,
            ah.is_global,
            ah.grh.hop_limit,
            ah.grh.sgid_index,
            ah.dlid,
            ah.port_num,
            ah.grh
                .dgid
                .raw
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        )),
        IBV_QPS_RTS => trace(format_args!("modify qpn={} RTS sq_psn={}", q.qpn, a.sq_psn)),
        other => trace(format_args!("modify qpn={} state={other}", q.qpn)),
    }
    q.state = a.qp_state;
    if apple
        && a.qp_state == IBV_QPS_ERR
        && let Some(p) = st.pds.get_mut(&pd)
    {
        p.poisoned = true;
    }
    for (cq, wc) in done {
        st.push(cq, wc);
    }
    0
}

/// `ibv_post_send`, through the operations table: SENDs of one registered buffer each, on a
/// QP in RTS (else `EINVAL`), at most `max_send_wr` outstanding (else `ENOMEM`): work
/// requests with the rdma-core profile, 4 KiB frames with the Apple one. A scatter entry
/// outside a region of the QP's PD completes with a protection error, as hardware reports
/// it.
///
/// # Safety
///
/// `wr` is a readable list of work requests, each with `num_sge` readable entries; `bad` is
/// NULL or writable.
unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    mut wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    let mut st = state();
    st.progress();
    let faults = st.faults();
    let profile = st.profile();
    let mut rc = 0;
    while !wr.is_null() {
        // SAFETY: non-null and, by the caller's contract, a readable work request.
        let w = unsafe { wr.read() };
        let Some(q) = st.qps.get(&qp.addr()) else {
            rc = libc::EINVAL;
            break;
        };
        let valid = q.state == IBV_QPS_RTS && w.opcode == IBV_WR_SEND;
        // SAFETY: the request's entries are readable, by the caller's contract.
        let sge = match unsafe { q.admit(profile, Queue::Send, valid, (w.num_sge, w.sg_list)) } {
            Ok(sge) => sge,
            Err(e) => {
                rc = e;
                break;
            }
        };
        let pd = q.pd;
        let (addr, len, mut fate) = match sge {
            Some(s) if !region_holds(&st, pd, s.lkey, s.addr, s.length) => {
                (0, 0, Fate::Fail(IBV_WC_LOC_PROT_ERR))
            }
            Some(s) => (s.addr as usize, s.length as usize, Fate::Deliver),
            None => (0, 0, Fate::Deliver),
        };
        st.sends_posted += 1;
        let n = Some(st.sends_posted);
        if faults.exit == n {
            eprintln!(
                "nuvec verbs provider: exiting at send {} ({FAULT_VAR})",
                st.sends_posted
            );
            std::process::exit(EXIT_CODE);
        }
        if faults.down == n {
            st.ports_down = true;
        }
        if faults.drop == n {
            fate = Fate::Drop;
        }
        if faults.error == n {
            fate = Fate::Fail(IBV_WC_GENERAL_ERR);
        }
        let Some(q) = st.qps.get_mut(&qp.addr()) else {
            rc = libc::EINVAL;
            break;
        };
        let signaled = q.sq_sig_all || w.send_flags & IBV_SEND_SIGNALED != 0;
        if log_enabled() {
            eprintln!(
                "verbs provider: qp {:#x} posts send wr {:#x} len {len} to qp {:#x}",
                q.qpn, w.wr_id, q.dest_qpn
            );
        }
        q.sends.push_back(SendWr {
            wr_id: w.wr_id,
            addr,
            len,
            signaled,
            offset: 0,
            fate,
        });
        wr = w.next;
    }
    if rc != 0 && !bad.is_null() {
        // SAFETY: `bad` is non-null and, by the caller's contract, writable.
        unsafe { bad.write(wr) };
    }
    st.progress();
    rc
}

/// `ibv_post_recv`, through the operations table: on a QP in INIT, RTR or RTS (RTS only with
/// the Apple profile; a QP in ERR flushes the request), at most `max_recv_wr` outstanding
/// (work requests, or 4 KiB frames with the Apple profile), into a region of the QP's PD
/// registered for local write.
///
/// # Safety
///
/// As [`post_send`].
unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    mut wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    let mut done = Vec::new();
    let mut st = state();
    let mut rc = 0;
    let profile = st.profile();
    while !wr.is_null() {
        // SAFETY: non-null and, by the caller's contract, a readable work request.
        let w = unsafe { wr.read() };
        let Some(q) = st.qps.get(&qp.addr()) else {
            rc = libc::EINVAL;
            break;
        };
        let state_ok = match profile {
            config::Profile::Apple => matches!(q.state, IBV_QPS_RTS | IBV_QPS_ERR),
            config::Profile::RdmaCore => matches!(
                q.state,
                IBV_QPS_INIT | IBV_QPS_RTR | IBV_QPS_RTS | IBV_QPS_ERR
            ),
        };
        if !state_ok {
            trace(format_args!(
                "post_recv qpn={} refused: state {} is not RTS (EINVAL)",
                q.qpn, q.state
            ));
        }
        // SAFETY: the request's entries are readable, by the caller's contract.
        let sge = match unsafe { q.admit(profile, Queue::Recv, state_ok, (w.num_sge, w.sg_list)) } {
            Ok(sge) => sge,
            Err(e) => {
                rc = e;
                break;
            }
        };
        let (pd, state, recv_cq, qpn) = (q.pd, q.state, q.recv_cq, q.qpn);
        let writable = |s: &ibv_sge| region_holds(&st, pd, s.lkey, s.addr, s.length);
        let (addr, len) = match sge {
            Some(s) if !writable(&s) => {
                rc = libc::EINVAL;
                break;
            }
            Some(s) => (s.addr as usize, s.length as usize),
            None => (0, 0),
        };
        if state == IBV_QPS_ERR {
            done.push((
                recv_cq,
                wc(w.wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0, qpn),
            ));
        } else if let Some(q) = st.qps.get_mut(&qp.addr()) {
            if log_enabled() {
                eprintln!(
                    "verbs provider: qp {:#x} posts recv wr {:#x} len {len}",
                    q.qpn, w.wr_id
                );
            }
            q.recvs.push_back(RecvWr {
                wr_id: w.wr_id,
                addr,
                len,
            });
        }
        wr = w.next;
    }
    for (cq, wc) in done {
        st.push(cq, wc);
    }
    if rc != 0 && !bad.is_null() {
        // SAFETY: `bad` is non-null and, by the caller's contract, writable.
        unsafe { bad.write(wr) };
    }
    st.progress();
    rc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_provider_lays_out_the_structs_as_the_binding_reads_them() {
        let binding: HashMap<_, _> = nuvec_distributed_ffi::verbs::layout().into_iter().collect();
        for (name, value) in abi::layout() {
            assert_eq!(binding.get(name), Some(&value), "{name}");
        }
    }

    /// The Apple rules no binding call of `ffi::verbs` can break (it registers with all three
    /// rights, destroys queue pairs before regions, never moves one to ERR), checked on the
    /// provider's entry points directly: a region for local write only is refused; a region
    /// whose protection domain has a queue pair is not deregistered (EBUSY) until the queue
    /// pair is destroyed; after an ERR transition it is never deregistered (EIO).
    #[test]
    fn apple_refuses_local_write_regions_early_deregistration_and_err_first() {
        let spec = config::parse_devices("provider-unit-apple", config::Profile::Apple)
            .unwrap()
            .remove(0);
        let mut name = [0 as c_char; 64];
        for (to, &from) in name.iter_mut().zip(spec.name.as_bytes()) {
            *to = from as c_char;
        }
        let device: &'static mut ibv_device = Box::leak(Box::new(ibv_device { name }));
        let c = (device as *mut ibv_device).expose_provenance();
        state().devices.push(Device { spec, c });
        let ctx = ibv_open_device(std::ptr::with_exposed_provenance_mut(c));
        assert!(!ctx.is_null());
        let mut memory = vec![0u8; 2 * 4096];
        let cq = ibv_create_cq(ctx, 8, std::ptr::null_mut(), std::ptr::null_mut(), 0);
        assert!(!cq.is_null());
        let all = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
        // `err_first`: whether the queue pair goes to ERR before it is destroyed.
        for (half, err_first) in [(0, false), (1, true)] {
            let pd = ibv_alloc_pd(ctx);
            let addr = memory[half * 4096..].as_mut_ptr().cast::<c_void>();
            let local_only = ibv_reg_mr(pd, addr, 4096, IBV_ACCESS_LOCAL_WRITE);
            assert!(
                local_only.is_null(),
                "Apple refuses local-write-only regions"
            );
            assert_eq!(
                io::Error::last_os_error().raw_os_error(),
                Some(libc::EINVAL)
            );
            let mr = ibv_reg_mr(pd, addr, 4096, all);
            assert!(!mr.is_null());
            let mut init = ibv_qp_init_attr {
                qp_context: std::ptr::null_mut(),
                send_cq: cq.cast(),
                recv_cq: cq.cast(),
                srq: std::ptr::null_mut(),
                cap: ibv_qp_cap {
                    max_send_wr: 4,
                    max_recv_wr: 4,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                qp_type: IBV_QPT_UC,
                sq_sig_all: 0,
            };
            // SAFETY: `init` is a live, fully initialised init_attr, which the call only reads.
            let qp = unsafe { ibv_create_qp(pd, (&raw mut init).cast()) };
            assert!(!qp.is_null());
            assert_eq!(
                ibv_dereg_mr(mr),
                libc::EBUSY,
                "a queue pair of the PD is alive"
            );
            if err_first {
                let mut attr = ibv_qp_attr {
                    qp_state: IBV_QPS_ERR,
                    ..Default::default()
                };
                // SAFETY: `attr` is a live, fully initialised qp_attr, which the call reads.
                let rc = unsafe { ibv_modify_qp(qp, (&raw mut attr).cast(), IBV_QP_STATE) };
                assert_eq!(rc, 0);
            }
            assert_eq!(ibv_destroy_qp(qp), 0);
            if err_first {
                assert_eq!(ibv_dereg_mr(mr), libc::EIO, "ERR before destroying poisons");
                // The region stays registered, and so the PD stays too.
                assert_eq!(ibv_dealloc_pd(pd), libc::EBUSY);
            } else {
                assert_eq!(ibv_dereg_mr(mr), 0);
                assert_eq!(ibv_dealloc_pd(pd), 0);
            }
        }
        assert_eq!(ibv_destroy_cq(cq), 0);
        // The poisoned region keeps the memory it covers registered: it is leaked, as a
        // caller would have to.
        std::mem::forget(memory);
    }

    #[test]
    fn transitions_follow_the_uc_table() {
        assert!(transition(IBV_QPS_RESET, IBV_QPS_RTR).is_none());
        assert!(transition(IBV_QPS_INIT, IBV_QPS_RTS).is_none());
        assert!(transition(IBV_QPS_RTS, IBV_QPS_RTR).is_none());
        let (req, _) = transition(IBV_QPS_INIT, IBV_QPS_RTR).unwrap();
        assert_ne!(req & IBV_QP_DEST_QPN, 0);
        assert_eq!(
            transition(IBV_QPS_RTS, IBV_QPS_ERR),
            Some((IBV_QP_STATE, 0))
        );
    }
}
