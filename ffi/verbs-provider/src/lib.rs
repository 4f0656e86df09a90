//! A verbs provider for tests: a shared library exporting the libibverbs entry points MLX's
//! JACCL uses (and the binding in `ffi/src/verbs` resolves), with the device context's
//! operations table filled in for `poll_cq`, `post_send` and `post_recv`, so the unchanged
//! binding drives it exactly as it drives rdma-core or Apple's `librdma`. Point
//! `NUVEC_DISTRIBUTED_VERBS_LIBRARY` at the built `cdylib` to use it.
//!
//! It implements what JACCL needs between processes on one machine: devices with one port
//! each (state, LID 0, Ethernet link layer, a GID table with a link-local entry and an
//! IPv4-mapped one; see [`config`]), protection domains, memory registration, completion
//! queues, and Unreliable Connected queue pairs with a 1024-byte MTU whose transitions are
//! checked as the kernel checks them (RESET, INIT, RTR, RTS, ERR; a missing or extra
//! attribute, a bad port, P_Key index, MTU or source GID index, or a route without a GRH on
//! an Ethernet port is `EINVAL`).
//!
//! Underneath, every queue pair binds a Unix datagram socket named after its number in the
//! fabric directory; a SEND travels as fragments of at most [`FRAGMENT`] bytes, each with a
//! header naming the sending queue pair and the destination GID. UC rules apply at the
//! receiver: a message from a queue pair other than the connected one, to a GID the port
//! does not have, or for a queue pair not in RTR or RTS is lost; a message that finds no
//! receive posted is held until one is (Apple's transport, the default) or lost (the UC of
//! the InfiniBand specification), as [`EARLY_VAR`] says; one longer than the posted buffer
//! completes that receive with a length error. Sends complete once handed to the kernel (UC
//! has no acknowledgement), so a send to a peer that is gone completes successfully and is
//! lost, as on the wire. Faults ([`FAULT_VAR`]) drop a send, fail it, end the process or take
//! the ports down; [`LOG_VAR`] logs every post and completion, [`TRACE_VAR`] records the
//! set-up for tests to check.
//!
//! There is no thread: data moves when the process calls into the provider (any post or
//! poll moves every queue pair's pending fragments both ways). So a message counts as
//! arriving when the receiving process next polls, not when it was sent: in `drop` mode a
//! receive posted after the send but before that poll still gets the message, where
//! hardware would have dropped it. Tests of that rule make the receiver poll first.
//!
//! Completion channels are there too (`ibv_create_comp_channel`, `ibv_req_notify_cq`
//! through the operations table, `ibv_get_cq_event`, `ibv_ack_cq_events`): a channel's
//! descriptor is the socket of the first queue pair whose receive CQ uses it, readable when
//! a datagram waits for it, and `ibv_get_cq_event` never blocks (it moves data, then reports
//! an armed CQ that has completions, or `EAGAIN`). [`CHANNELS_VAR`]` = off` refuses channels,
//! as a library without them would.

mod abi;
pub mod config;

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_char, c_int, c_void};
use std::io;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::{LazyLock, Mutex, MutexGuard};

use abi::*;
pub use config::{CHANNELS_VAR, DEVICES_VAR, DIR_VAR, EARLY_VAR, FAULT_VAR};

/// The largest payload of one fragment: well under the default socket buffer limits of
/// Linux and macOS, so one fragment always fits a datagram.
pub const FRAGMENT: usize = 32 * 1024;

/// A fragment's header: magic, source QPN, destination QPN, message length, offset, the
/// destination GID.
const HEADER: usize = 4 * 5 + 16;
const MAGIC: u32 = 0x4e56_5242;

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
    hold: Option<bool>,
    ports_down: bool,
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

    fn port_state(&self, ctx: usize) -> Option<u32> {
        let spec = self.device_of(ctx)?;
        Some(if self.ports_down {
            IBV_PORT_DOWN
        } else {
            spec.state
        })
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
        let hold = *self.hold.get_or_insert_with(config::hold_early_sends);
        for qp in self.qps.values_mut() {
            qp.pump_sends(down, &mut done);
            qp.pump_arrivals(down, hold, &mut done);
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

impl Qp {
    fn pump_sends(&mut self, down: bool, done: &mut Vec<(usize, ibv_wc)>) {
        while let Some(s) = self.sends.front_mut() {
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
                        s.offset = s.len
                    }
                }
                if s.offset < s.len {
                    continue;
                }
            }
            let status = status.unwrap_or(IBV_WC_SUCCESS);
            let signaled = s.signaled || status != IBV_WC_SUCCESS;
            let (wr_id, len) = (s.wr_id, s.len);
            self.sends.pop_front();
            if signaled {
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
            if n < HEADER {
                continue;
            }
            let word = |i: usize| {
                let b = &self.buf[4 * i..4 * i + 4];
                u32::from_le_bytes([b[0], b[1], b[2], b[3]])
            };
            let (magic, src, dst, total, offset) = (word(0), word(1), word(2), word(3), word(4));
            let mut dgid = [0u8; 16];
            dgid.copy_from_slice(&self.buf[20..36]);
            let (total, offset, len) = (total as usize, offset as usize, n - HEADER);
            let accepted = magic == MAGIC
                && dst == self.qpn
                && src == self.dest_qpn
                && matches!(self.state, IBV_QPS_RTR | IBV_QPS_RTS)
                && self.port_up
                && !down
                && dgid != [0; 16]
                && self.local_gids.contains(&dgid)
                && offset + len <= total;
            if !accepted {
                if log_enabled() {
                    eprintln!(
                        "verbs provider: qp {:#x} drops a fragment from {src:#x}",
                        self.qpn
                    );
                }
                continue;
            }
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
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
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
    let specs = match config::devices() {
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
    let rc = close_device(ctx);
    trace(format_args!("close_device rc={rc}"));
    rc
}

fn close_device(ctx: *mut c_void) -> c_int {
    let mut st = state();
    let addr = ctx.addr();
    if !st.contexts.contains_key(&addr) {
        return libc::EINVAL;
    }
    if st.pds.values().any(|p| p.ctx == addr)
        || st.cqs.values().any(|c| c.ctx == addr)
        || st.channels.values().any(|c| c.ctx == addr)
    {
        return libc::EBUSY;
    }
    st.contexts.remove(&addr);
    // SAFETY: `addr` was a live context from `give::<ibv_context>`, now removed from the
    // table, so it is freed once; the caller gives up the pointer by closing it.
    unsafe { reclaim::<ibv_context>(addr) };
    0
}

/// `int ibv_query_port(struct ibv_context *, uint8_t port_num, struct ibv_port_attr *)`.
///
/// # Safety
///
/// `attr` points to a writable `struct ibv_port_attr` of rdma-core v44's size.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_port(ctx: *mut c_void, port: u8, attr: *mut c_void) -> c_int {
    let attr = attr.cast::<ibv_port_attr>();
    let st = state();
    let (Some(spec), Some(state)) = (st.device_of(ctx.addr()), st.port_state(ctx.addr())) else {
        return libc::EINVAL;
    };
    if port != 1 || attr.is_null() {
        return libc::EINVAL;
    }
    let out = ibv_port_attr {
        state,
        max_mtu: IBV_MTU_1024,
        active_mtu: IBV_MTU_1024,
        gid_tbl_len: spec.gids.len() as c_int,
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
        .filter(|_| port == 1 && !gid.is_null())
        .and_then(|spec| spec.gids.get(usize::try_from(index).ok()?));
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
    st.pds.insert(addr, Pd { ctx: ctx.addr() });
    std::ptr::with_exposed_provenance_mut(addr)
}

/// `int ibv_dealloc_pd(struct ibv_pd *)`: `EBUSY` while a queue pair or region uses it.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_dealloc_pd(pd: *mut c_void) -> c_int {
    let rc = dealloc_pd(pd);
    trace(format_args!("dealloc_pd rc={rc}"));
    rc
}

fn dealloc_pd(pd: *mut c_void) -> c_int {
    let mut st = state();
    let addr = pd.addr();
    if !st.pds.contains_key(&addr) {
        return libc::EINVAL;
    }
    if st.qps.values().any(|q| q.pd == addr) || st.mrs.values().any(|m| m.pd == addr) {
        return libc::EBUSY;
    }
    st.pds.remove(&addr);
    // SAFETY: a live PD from `give::<ibv_pd>`, removed from the table: freed once.
    unsafe { reclaim::<ibv_pd>(addr) };
    0
}

/// `struct ibv_mr *ibv_reg_mr(struct ibv_pd *, void *addr, size_t length, int access)`.
/// Remote write or atomic access without local write is `EINVAL`, as the verbs spec says.
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
    let bad = !st.pds.contains_key(&pd.addr())
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

/// `int ibv_dereg_mr(struct ibv_mr *)`.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_dereg_mr(mr: *mut c_void) -> c_int {
    let rc = dereg_mr(mr);
    trace(format_args!("dereg_mr rc={rc}"));
    rc
}

fn dereg_mr(mr: *mut c_void) -> c_int {
    let mut st = state();
    if st.mrs.remove(&mr.addr()).is_none() {
        return libc::EINVAL;
    }
    // SAFETY: a live region from `give::<ibv_mr>`, removed from the table: freed once.
    unsafe { reclaim::<ibv_mr>(mr.addr()) };
    0
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
    let rc = destroy_cq(cq);
    trace(format_args!("destroy_cq rc={rc}"));
    rc
}

fn destroy_cq(cq: *mut c_void) -> c_int {
    let mut st = state();
    let addr = cq.addr();
    if !st.cqs.contains_key(&addr) {
        return libc::EINVAL;
    }
    if st
        .qps
        .values()
        .any(|q| q.send_cq == addr || q.recv_cq == addr)
    {
        return libc::EBUSY;
    }
    st.cqs.remove(&addr);
    // SAFETY: a live CQ from `give::<ibv_cq>`, removed from the table: freed once.
    unsafe { reclaim::<ibv_cq>(addr) };
    0
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
    let rc = destroy_comp_channel(channel);
    trace(format_args!("destroy_comp_channel rc={rc}"));
    rc
}

fn destroy_comp_channel(channel: *mut c_void) -> c_int {
    let mut st = state();
    let addr = channel.addr();
    if !st.channels.contains_key(&addr) {
        return libc::EINVAL;
    }
    if st.cqs.values().any(|c| c.channel == addr) {
        return libc::EBUSY;
    }
    st.channels.remove(&addr);
    // SAFETY: a live channel from `give::<ibv_comp_channel>`, removed from the table: freed
    // once (its descriptor closed with the table entry).
    unsafe { reclaim::<ibv_comp_channel>(addr) };
    0
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
/// one scatter-gather entry, no inline data, no shared receive queue.
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
    let port_up = st.port_state(ctx) == Some(IBV_PORT_ACTIVE);
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
            port_up,
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
        },
    );
    std::ptr::with_exposed_provenance_mut(addr)
}

/// `int ibv_destroy_qp(struct ibv_qp *)`.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_destroy_qp(qp: *mut c_void) -> c_int {
    let rc = destroy_qp(qp);
    trace(format_args!("destroy_qp rc={rc}"));
    rc
}

fn destroy_qp(qp: *mut c_void) -> c_int {
    let mut st = state();
    if st.qps.remove(&qp.addr()).is_none() {
        return libc::EINVAL;
    }
    // SAFETY: a live QP from `give::<ibv_qp>`, removed from the table: freed once.
    unsafe { reclaim::<ibv_qp>(qp.addr()) };
    0
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
    let ctx = q.ctx;
    let Some(gids) = st.device_of(ctx).map(|d| d.gids.clone()) else {
        return libc::EINVAL;
    };
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
    if mask & IBV_QP_PORT != 0 && a.port_num != 1 {
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
        // and the source GID index must name a GID the port has.
        let sgid_ok = gids
            .get(usize::from(ah.grh.sgid_index))
            .is_some_and(|g| *g != [0; 16]);
        if ah.port_num != 1 || ah.is_global == 0 || !sgid_ok || ah.grh.dgid.raw == [0; 16] {
            return libc::EINVAL;
        }
    }
    let mut done = Vec::new();
    match a.qp_state {
        IBV_QPS_INIT => q.local_gids = gids,
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
    for (cq, wc) in done {
        st.push(cq, wc);
    }
    0
}

/// `ibv_post_send`, through the operations table: SENDs of one registered buffer each, on a
/// QP in RTS (else `EINVAL`), at most `max_send_wr` outstanding (else `ENOMEM`). A scatter
/// entry outside a region of the QP's PD completes with a protection error, as hardware
/// reports it.
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
    let mut rc = 0;
    while !wr.is_null() {
        // SAFETY: non-null and, by the caller's contract, a readable work request.
        let w = unsafe { wr.read() };
        let Some(q) = st.qps.get(&qp.addr()) else {
            rc = libc::EINVAL;
            break;
        };
        let valid = q.state == IBV_QPS_RTS
            && w.opcode == IBV_WR_SEND
            && (0..=MAX_SGE as c_int).contains(&w.num_sge)
            && (w.num_sge == 0 || !w.sg_list.is_null());
        if !valid {
            rc = libc::EINVAL;
            break;
        }
        if q.sends.len() >= q.max_send_wr {
            rc = libc::ENOMEM;
            break;
        }
        let sge = if w.num_sge == 1 {
            // SAFETY: `num_sge` is 1 and `sg_list` non-null: one readable entry.
            Some(unsafe { w.sg_list.read() })
        } else {
            None
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

/// `ibv_post_recv`, through the operations table: on a QP in INIT, RTR or RTS (a QP in ERR
/// flushes the request), at most `max_recv_wr` outstanding, into a region of the QP's PD
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
    let mut st = state();
    let mut rc = 0;
    let mut done = Vec::new();
    while !wr.is_null() {
        // SAFETY: non-null and, by the caller's contract, a readable work request.
        let w = unsafe { wr.read() };
        let Some(q) = st.qps.get(&qp.addr()) else {
            rc = libc::EINVAL;
            break;
        };
        let valid = matches!(
            q.state,
            IBV_QPS_INIT | IBV_QPS_RTR | IBV_QPS_RTS | IBV_QPS_ERR
        ) && (0..=MAX_SGE as c_int).contains(&w.num_sge)
            && (w.num_sge == 0 || !w.sg_list.is_null());
        if !valid {
            rc = libc::EINVAL;
            break;
        }
        if q.recvs.len() >= q.max_recv_wr {
            rc = libc::ENOMEM;
            break;
        }
        let sge = if w.num_sge == 1 {
            // SAFETY: `num_sge` is 1 and `sg_list` non-null: one readable entry.
            Some(unsafe { w.sg_list.read() })
        } else {
            None
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
