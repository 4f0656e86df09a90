//! A binding to the RDMA verbs API, loaded at run time, with safe wrappers that own their
//! resources.
//!
//! It covers what MLX's JACCL uses, plus the device query that finds the active port: list
//! and open devices, query a device, a port and its GID table, and build one *connection* per
//! peer and wire: a protection domain, a completion queue and an Unreliable Connected queue
//! pair, moved through INIT, RTR and RTS. Data moves as two-sided SENDs of whole registered
//! buffers.
//!
//! # Ownership of registered memory
//!
//! A [`FrameBuffer`] is page-aligned anonymous memory registered with the protection
//! domains of the connections that use it. While a work request is in flight the hardware
//! reads (send) or writes (receive) that memory, so the buffer is handed over by value, as an
//! `Arc<FrameBuffer>`, and comes back inside the [`Completion`]:
//!
//! - a receive needs the only reference ([`Connection::post_recv`] refuses a shared one), so
//!   nobody else can look at the memory the hardware is writing;
//! - a send may share the buffer (MLX posts one send buffer to every peer at once), and
//!   nobody can write to it while any send holds a reference, because the bytes are only
//!   reachable through `&mut FrameBuffer`, which `Arc::get_mut` grants only to a sole owner.
//!
//! # Teardown order
//!
//! Apple's driver wants a queue pair destroyed before the memory regions it may use are
//! deregistered, and a queue pair never moved to the error state first (llama.cpp's Apple
//! transport, `ggml/src/ggml-rpc/transport-apple.cpp`: after an ERR transition "Apple's
//! provider then fails every region unmap"). So a dropped [`Connection`] destroys its queue
//! pair straight from whatever state it is in, and a region is deregistered only once no
//! queue pair of its protection domain is alive: a [`FrameBuffer`] dropped earlier (a send
//! buffer in flight on one connection and registered with another, say) leaves its
//! registration, and the memory under it, with the protection domain, which deregisters it
//! when its last queue pair is destroyed. If the library refuses to destroy a queue pair, or
//! to deregister a region, the memory involved is leaked rather than unmapped under the
//! hardware.
//!
//! Memory regions keep their protection domain alive, protection domains and connections keep
//! their device context alive, and everything keeps the library loaded, through reference
//! counts: regions are deregistered before their protection domain is deallocated, which
//! happens before the device is closed.

mod loader;
pub(crate) mod sys;

use std::ffi::{CStr, c_int, c_void};
use std::fmt;
use std::io;
use std::ptr::NonNull;
use std::sync::Arc;

use loader::Api;
pub use loader::{LIBRARY_VAR, LoadError};

/// The access rights MLX gives its queue pairs at INIT and its memory regions at
/// registration (`rdma.cpp`): local write, remote read and remote write. Two-sided SENDs use
/// none of the remote rights, but llama.cpp's Apple transport (PR #26421) reports that Apple's
/// driver refuses regions registered for local write alone, even for SEND and RECV, so the
/// regions carry them too. No peer can use them: RDMA READ and WRITE need the region's address
/// and remote key, and neither ever leaves this process (the side channel carries only the
/// LID, queue-pair number, PSN and GID).
pub const ACCESS_JACCL: i32 =
    sys::IBV_ACCESS_LOCAL_WRITE | sys::IBV_ACCESS_REMOTE_READ | sys::IBV_ACCESS_REMOTE_WRITE;

/// What a memory region allows: [`ACCESS_JACCL`], as MLX registers its buffers.
const ACCESS_REGION: c_int = ACCESS_JACCL;

/// The verbs library, loaded. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Verbs {
    api: Arc<Api>,
}

impl Verbs {
    /// Loads the platform's verbs library: `libibverbs.so.1` on Linux, `librdma.dylib` on
    /// macOS.
    ///
    /// # Errors
    ///
    /// The library is missing, or lacks one of the functions the binding needs.
    pub fn load() -> Result<Verbs, LoadError> {
        Ok(Verbs {
            api: Arc::new(Api::load()?),
        })
    }

    /// The name of the library that was loaded.
    pub fn library(&self) -> &'static str {
        self.api.library
    }

    /// The names of this machine's RDMA devices.
    ///
    /// # Errors
    ///
    /// The library's error: on Linux without RDMA support in the kernel that is `ENOSYS`
    /// ("Function not implemented"), which callers should read as "no devices".
    pub fn device_names(&self) -> io::Result<Vec<String>> {
        let list = DeviceList::get(&self.api)?;
        Ok((0..list.len()).map(|i| list.name(i)).collect())
    }

    /// Opens the device called `name`.
    ///
    /// # Errors
    ///
    /// `NotFound` (naming how many devices there are) if no device has that name; the
    /// library's error if the device cannot be listed or opened.
    pub fn open(&self, name: &str) -> io::Result<Context> {
        let list = DeviceList::get(&self.api)?;
        let index = (0..list.len())
            .find(|&i| list.name(i) == name)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!(
                        "no RDMA device is called {name:?} ({} available: {})",
                        list.len(),
                        (0..list.len())
                            .map(|i| list.name(i))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )
            })?;
        let device = list.device(index);
        // SAFETY: `device` is an entry of the live device list (`list` is dropped only at the
        // end of this function), which is what `ibv_open_device` takes. The context it returns
        // stays valid after the list is freed.
        let ctx = unsafe { (self.api.open_device)(device) };
        let ctx = NonNull::new(ctx).ok_or_else(|| last_error("ibv_open_device"))?;
        Ok(Context {
            inner: Arc::new(ContextInner {
                api: self.api.clone(),
                ctx,
                name: name.to_string(),
            }),
        })
    }
}

/// `ibv_get_device_list`'s result, freed on drop.
struct DeviceList<'a> {
    api: &'a Api,
    list: NonNull<*mut sys::ibv_device>,
    len: usize,
}

impl<'a> DeviceList<'a> {
    fn get(api: &'a Api) -> io::Result<Self> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a live, writable int for the count; the function returns a
        // NULL-terminated array owned by the library (or NULL with errno set).
        let list = unsafe { (api.get_device_list)(&mut n) };
        let list = NonNull::new(list).ok_or_else(|| last_error("ibv_get_device_list"))?;
        Ok(DeviceList {
            api,
            list,
            len: usize::try_from(n).unwrap_or(0),
        })
    }

    fn len(&self) -> usize {
        self.len
    }

    fn device(&self, i: usize) -> *mut sys::ibv_device {
        assert!(i < self.len, "device {i} of a list of {}", self.len);
        let entry = self.list.as_ptr().wrapping_add(i);
        // SAFETY: the list holds `len` device pointers (then a NULL) and `i < len`, so
        // `entry` is in bounds, aligned and initialised.
        unsafe { entry.read() }
    }

    fn name(&self, i: usize) -> String {
        let device = self.device(i);
        // SAFETY: `device` is an entry of the live list; the function returns a pointer to
        // the device's NUL-terminated name, owned by the device (or NULL).
        let name = unsafe { (self.api.get_device_name)(device) };
        if name.is_null() {
            return String::new();
        }
        // SAFETY: `name` is non-null and points to a NUL-terminated string that lives as
        // long as the device list; it is copied out before the list is freed.
        let name = unsafe { CStr::from_ptr(name) };
        name.to_string_lossy().into_owned()
    }
}

impl Drop for DeviceList<'_> {
    fn drop(&mut self) {
        // SAFETY: `list` came from `ibv_get_device_list` and is freed exactly once, here.
        unsafe { (self.api.free_device_list)(self.list.as_ptr()) }
    }
}

/// An open device context: its handle, closed when the last user lets go of it.
struct ContextInner {
    api: Arc<Api>,
    ctx: NonNull<sys::ibv_context>,
    name: String,
}

// SAFETY: the context is only ever passed to verbs functions, which libibverbs documents as
// thread-safe, and is closed once, by `Drop`, when the last reference is gone. No Rust data
// is reachable through the pointer.
unsafe impl Send for ContextInner {}
// SAFETY: as for `Send`: shared use only calls thread-safe verbs functions.
unsafe impl Sync for ContextInner {}

impl Drop for ContextInner {
    fn drop(&mut self) {
        // SAFETY: every protection domain, queue pair, completion queue and memory region
        // created on this context holds a reference to it, so they are all gone; the
        // context is closed exactly once.
        unsafe { (self.api.close_device)(self.ctx.as_ptr()) };
    }
}

/// An open RDMA device.
#[derive(Clone)]
pub struct Context {
    inner: Arc<ContextInner>,
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("device", &self.inner.name)
            .finish()
    }
}

/// A port's state (`enum ibv_port_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PortState {
    /// No state change (`IBV_PORT_NOP`).
    Nop,
    /// The link is down (`IBV_PORT_DOWN`).
    Down,
    /// The link is up but not configured (`IBV_PORT_INIT`).
    Init,
    /// Configured, not yet active (`IBV_PORT_ARMED`).
    Armed,
    /// Ready to carry traffic (`IBV_PORT_ACTIVE`).
    Active,
    /// Active, deferred (`IBV_PORT_ACTIVE_DEFER`).
    ActiveDefer,
    /// A value this binding does not know.
    Other(u32),
}

impl PortState {
    fn from_raw(state: u32) -> Self {
        match state {
            0 => PortState::Nop,
            1 => PortState::Down,
            2 => PortState::Init,
            3 => PortState::Armed,
            4 => PortState::Active,
            5 => PortState::ActiveDefer,
            other => PortState::Other(other),
        }
    }
}

/// What `ibv_query_port` says about a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PortAttr {
    /// The port's state.
    pub state: PortState,
    /// The local identifier (LID) the port advertises.
    pub lid: u16,
    /// The number of entries of the GID table.
    pub gid_table_len: i32,
    /// The active MTU, as `enum ibv_mtu` (3 is 1024 bytes).
    pub active_mtu: u32,
    /// The link layer (`IBV_LINK_LAYER_*`).
    pub link_layer: u8,
}

/// Sizes of a queue pair and its completion queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueSizes {
    /// Entries of the completion queue (MLX: 64).
    pub cq_entries: u32,
    /// Send work requests that may be outstanding (MLX: 32).
    pub max_send_wr: u32,
    /// Receive work requests that may be outstanding (MLX: 32).
    pub max_recv_wr: u32,
}

impl Context {
    /// The device's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Queries port `port` (ports count from 1).
    ///
    /// # Errors
    ///
    /// The library's error.
    pub fn query_port(&self, port: u8) -> io::Result<PortAttr> {
        let mut attr = sys::ibv_port_attr::default();
        let api = &self.inner.api;
        // SAFETY: the context is open (we hold it) and `attr` is a zeroed, writable struct at
        // least as large as the library's (checked by the layout test).
        let rc = unsafe { (api.query_port)(self.inner.ctx.as_ptr(), port, &mut attr) };
        check(rc, "ibv_query_port")?;
        Ok(PortAttr {
            state: PortState::from_raw(attr.state),
            lid: attr.lid,
            gid_table_len: attr.gid_tbl_len,
            active_mtu: attr.active_mtu,
            link_layer: attr.link_layer,
        })
    }

    /// Entry `index` of port `port`'s GID table, as 16 raw bytes.
    ///
    /// # Errors
    ///
    /// The library's error.
    pub fn query_gid(&self, port: u8, index: i32) -> io::Result<[u8; 16]> {
        let mut gid = sys::ibv_gid::default();
        let api = &self.inner.api;
        // SAFETY: the context is open and `gid` is a writable 16-byte, 8-aligned union.
        let rc = unsafe { (api.query_gid)(self.inner.ctx.as_ptr(), port, index, &mut gid) };
        check(rc, "ibv_query_gid")?;
        Ok(gid.raw)
    }

    /// What `ibv_query_device` says about the device (MLX never asks; the binding needs the
    /// number of ports to find the active one).
    ///
    /// # Errors
    ///
    /// The library's error.
    pub fn query_device(&self) -> io::Result<DeviceAttr> {
        let mut attr = sys::ibv_device_attr::default();
        let api = &self.inner.api;
        // SAFETY: the context is open and `attr` is a zeroed, writable struct of the header's
        // size (checked by the layout test), which the call fills.
        let rc = unsafe { (api.query_device)(self.inner.ctx.as_ptr(), &mut attr) };
        check(rc, "ibv_query_device")?;
        Ok(DeviceAttr {
            ports: attr.phys_port_cnt,
            max_qp: attr.max_qp,
            max_qp_wr: attr.max_qp_wr,
            max_cqe: attr.max_cqe,
            max_mr: attr.max_mr,
        })
    }

    /// The device's first active port (`IBV_PORT_ACTIVE`, or its deferred form) with its
    /// attributes, or `None` if no port is active, with every port's number and state for
    /// messages. Thunderbolt devices do not always have their active port at 1 (llama.cpp's
    /// Apple transport scans for it the same way), so the port is found, not assumed.
    ///
    /// # Errors
    ///
    /// The library's error for the device query or a port query.
    pub fn active_port(&self) -> io::Result<ActivePort> {
        let attr = self.query_device()?;
        let mut states = Vec::with_capacity(usize::from(attr.ports));
        for port in 1..=attr.ports {
            let p = self.query_port(port)?;
            states.push((port, p.state));
            if matches!(p.state, PortState::Active | PortState::ActiveDefer) {
                return Ok(ActivePort {
                    port: Some((port, p)),
                    states,
                });
            }
        }
        Ok(ActivePort { port: None, states })
    }

    /// Queue pairs this process holds on this device now, through any of its contexts: a
    /// device's limit counts them all (Apple's refuses the 11th with `EBUSY` however they are
    /// spread over contexts, mlx PR #4209).
    pub fn queue_pairs(&self) -> usize {
        queue_pairs(&self.inner.name)
    }
}

/// What `ibv_query_device` reports, in part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceAttr {
    /// The number of ports (`phys_port_cnt`), numbered from 1.
    pub ports: u8,
    /// The most queue pairs the device claims to support.
    pub max_qp: i32,
    /// The most work requests per queue the device claims to support.
    pub max_qp_wr: i32,
    /// The most entries per completion queue.
    pub max_cqe: i32,
    /// The most memory regions.
    pub max_mr: i32,
}

/// A device's first active port, as [`Context::active_port`] found it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ActivePort {
    /// The port's number and attributes; `None` if no port is active.
    pub port: Option<(u8, PortAttr)>,
    /// The ports queried, in order, with their states (up to the active one).
    pub states: Vec<(u8, PortState)>,
}

/// Live queue pairs per device name, across every context of this process.
static QUEUE_PAIRS: std::sync::Mutex<Vec<(String, usize)>> = std::sync::Mutex::new(Vec::new());

fn queue_pairs(device: &str) -> usize {
    let held = QUEUE_PAIRS.lock().unwrap_or_else(|e| e.into_inner());
    held.iter()
        .find(|(d, _)| d == device)
        .map_or(0, |&(_, n)| n)
}

/// Counts a queue pair created (`+1`) or destroyed (`-1`) on `device`.
fn count_queue_pair(device: &str, created: bool) {
    let mut held = QUEUE_PAIRS.lock().unwrap_or_else(|e| e.into_inner());
    match held.iter_mut().find(|(d, _)| d == device) {
        Some((_, n)) if created => *n += 1,
        Some((_, n)) => *n = n.saturating_sub(1),
        None if created => held.push((device.to_string(), 1)),
        None => {}
    }
}

impl Context {
    /// Creates a connection on this device as MLX does: a protection domain of its own, a
    /// completion queue for both directions, and an Unreliable Connected queue pair with
    /// one scatter-gather entry per request, no inline data and no signalling by default.
    ///
    /// # Errors
    ///
    /// The library's error for the step that failed (on Apple's stack `EBUSY` from
    /// `ibv_create_qp` means the device's queue-pair limit was reached).
    pub fn connection(&self, sizes: QueueSizes) -> io::Result<Connection> {
        let api = self.inner.api.clone();
        let ctx = self.inner.ctx.as_ptr();
        // SAFETY: the context is open; the result is NULL or a new protection domain.
        let pd = unsafe { (api.alloc_pd)(ctx) };
        let pd = NonNull::new(pd).ok_or_else(|| last_error("ibv_alloc_pd"))?;
        let pd = Arc::new(PdInner {
            ctx: self.inner.clone(),
            pd,
            state: std::sync::Mutex::new(PdState::default()),
        });
        let entries = c_int::try_from(sizes.cq_entries)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "too many CQ entries"))?;
        // A completion channel if the library offers them (MLX creates none: this is local,
        // nothing of it reaches the wire); without one the caller polls and naps.
        let channel = self.channel();
        let channel_ptr = channel
            .as_ref()
            .map_or(std::ptr::null_mut(), |c| c.ch.as_ptr());
        // SAFETY: the context is open; the channel is NULL or a live channel of this
        // context, which outlives the CQ (`Cq` destroys the CQ before its channel); vector
        // 0, as MLX.
        let cq = unsafe { (api.create_cq)(ctx, entries, std::ptr::null_mut(), channel_ptr, 0) };
        let cq = NonNull::new(cq).ok_or_else(|| last_error("ibv_create_cq"))?;
        let cq = Cq {
            api: api.clone(),
            cq,
            unacked: 0,
            channel,
            _ctx: self.inner.clone(),
        };
        let mut init = sys::ibv_qp_init_attr {
            qp_context: ctx.cast::<c_void>(),
            send_cq: cq.cq.as_ptr(),
            recv_cq: cq.cq.as_ptr(),
            srq: std::ptr::null_mut(),
            cap: sys::ibv_qp_cap {
                max_send_wr: sizes.max_send_wr,
                max_recv_wr: sizes.max_recv_wr,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: sys::IBV_QPT_UC,
            sq_sig_all: 0,
        };
        // SAFETY: `pd` and the CQ are live objects of this context; `init` is a fully
        // initialised attribute struct the call only reads (and may update `cap` in).
        let qp = unsafe { (api.create_qp)(pd.pd.as_ptr(), &mut init) };
        let qp = NonNull::new(qp).ok_or_else(|| last_error("ibv_create_qp"))?;
        pd.lock().live_qps += 1;
        count_queue_pair(&self.inner.name, true);
        // SAFETY: `qp` was just returned by `ibv_create_qp`, so it points to a live
        // `struct ibv_qp` whose prefix `sys::ibv_qp` mirrors; `qp_num` is read once.
        let qp_num = unsafe { (*qp.as_ptr()).qp_num };
        let slots = (sizes.max_send_wr + sizes.max_recv_wr) as usize;
        Ok(Connection {
            api,
            qp,
            qp_num,
            cq,
            pd,
            ctx: self.clone(),
            slots: (0..slots).map(|_| None).collect(),
            free: (0..slots).rev().collect(),
        })
    }
}

impl Context {
    /// A new completion channel with a non-blocking descriptor, or `None` if the library
    /// has no channels, its operations table cannot arm a CQ, or creating one fails.
    fn channel(&self) -> Option<Channel> {
        let fns = self.inner.api.channels?;
        let ctx = self.inner.ctx.as_ptr();
        // SAFETY: the context is open (held by `self`); its operations table is only read.
        let can_arm = unsafe { (*ctx).ops.req_notify_cq.is_some() };
        if !can_arm {
            return None;
        }
        // SAFETY: the context is open; the result is NULL or a new channel of it.
        let ch = NonNull::new(unsafe { (fns.create)(ctx) })?;
        let channel = Channel {
            destroy: fns.destroy,
            ch,
            _ctx: self.inner.clone(),
        };
        // SAFETY: `ch` is the live channel just created; its prefix `sys::ibv_comp_channel`
        // mirrors the header's (checked by the layout test); `fd` is read once.
        let fd = unsafe { (*ch.as_ptr()).fd };
        // SAFETY: `fd` is the channel's open descriptor; F_GETFL and F_SETFL only read and
        // set its status flags.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: as above.
        if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return None;
        }
        Some(channel)
    }
}

/// A completion channel, destroyed after the CQ that uses it.
struct Channel {
    destroy: sys::DestroyCompChannelFn,
    ch: NonNull<sys::ibv_comp_channel>,
    _ctx: Arc<ContextInner>,
}

impl Drop for Channel {
    fn drop(&mut self) {
        // SAFETY: the channel is live and its only CQ is already destroyed (`Cq` declares
        // it after its handle and destroys the CQ in its own `Drop`); destroyed once.
        unsafe { (self.destroy)(self.ch.as_ptr()) };
    }
}

/// A protection domain, deallocated when the last connection or memory region using it is
/// gone. It also keeps the registrations that must outlive its queue pairs (see the module
/// docs, "Teardown order").
struct PdInner {
    ctx: Arc<ContextInner>,
    pd: NonNull<sys::ibv_pd>,
    state: std::sync::Mutex<PdState>,
}

/// A protection domain's queue pairs and deferred deregistrations.
#[derive(Default)]
struct PdState {
    /// Queue pairs of this PD not yet destroyed.
    live_qps: usize,
    /// A queue pair of this PD could not be destroyed: its regions stay registered, and
    /// their memory mapped, for the life of the process.
    stuck: bool,
    /// Regions of buffers dropped while a queue pair was alive, each with the memory it
    /// covers, deregistered when the last queue pair is destroyed.
    deferred: Vec<(NonNull<sys::ibv_mr>, Arc<memmap2::MmapMut>)>,
}

// SAFETY: the handle is only passed to thread-safe verbs functions and deallocated once, in
// `Drop`, after every user released it; the deferred region handles are touched only under
// the mutex.
unsafe impl Send for PdInner {}
// SAFETY: as for `Send`.
unsafe impl Sync for PdInner {}

impl PdInner {
    fn lock(&self) -> std::sync::MutexGuard<'_, PdState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Deregisters `mr`, a region of this PD covering `map`, now if no queue pair of the PD
    /// is alive, else when the last one is destroyed.
    fn retire(&self, mr: NonNull<sys::ibv_mr>, map: &Arc<memmap2::MmapMut>) {
        let mut state = self.lock();
        if state.live_qps > 0 || state.stuck {
            state.deferred.push((mr, map.clone()));
            return;
        }
        drop(state);
        self.deregister(mr, map.clone());
    }

    /// Deregisters `mr` and lets go of the memory it covers; if the library refuses, the
    /// memory stays mapped for the life of the process, since the device may still use it.
    fn deregister(&self, mr: NonNull<sys::ibv_mr>, map: Arc<memmap2::MmapMut>) {
        // SAFETY: `mr` is a live region of this PD (registered by `FrameBuffer::register`,
        // retired once), and no queue pair of the PD is alive, so the hardware no longer uses
        // it; the PD is alive (we are borrowed from it).
        let rc = unsafe { (self.ctx.api.dereg_mr)(mr.as_ptr()) };
        if rc != 0 {
            std::mem::forget(map);
        }
    }

    /// Records that a queue pair of this PD was destroyed (`destroyed`), or that the
    /// library refused (then the PD's regions are never deregistered); when the last one
    /// goes, deregisters the regions kept for it.
    fn queue_pair_gone(&self, destroyed: bool) {
        let mut state = self.lock();
        if !destroyed {
            state.stuck = true;
            return;
        }
        state.live_qps = state.live_qps.saturating_sub(1);
        if state.live_qps > 0 || state.stuck {
            return;
        }
        let deferred = std::mem::take(&mut state.deferred);
        drop(state);
        for (mr, map) in deferred {
            self.deregister(mr, map);
        }
    }
}

impl Drop for PdInner {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        if state.stuck {
            // A queue pair of this PD may still use its regions: they, their memory and the
            // PD itself stay for the life of the process.
            std::mem::forget(std::mem::take(&mut state.deferred));
            return;
        }
        for (mr, map) in std::mem::take(&mut state.deferred) {
            self.deregister(mr, map);
        }
        // SAFETY: every queue pair and memory region of this PD holds a reference to it, so
        // none is left (the deferred regions were just deregistered); the PD is deallocated
        // exactly once.
        unsafe { (self.ctx.api.dealloc_pd)(self.pd.as_ptr()) };
    }
}

/// A completion queue, destroyed with its connection (after the queue pair).
struct Cq {
    api: Arc<Api>,
    cq: NonNull<sys::ibv_cq>,
    /// Events taken from the channel and not yet acknowledged (destroying a CQ waits for
    /// every event to be acknowledged).
    unacked: u32,
    /// Dropped after the CQ is destroyed (fields drop after `Drop::drop`).
    channel: Option<Channel>,
    _ctx: Arc<ContextInner>,
}

impl Drop for Cq {
    fn drop(&mut self) {
        if let Some(fns) = self.api.channels
            && self.unacked > 0
        {
            // SAFETY: the CQ is live; `unacked` events of it were taken and not acknowledged.
            unsafe { (fns.ack_events)(self.cq.as_ptr(), self.unacked) };
        }
        // SAFETY: the only queue pair using this CQ is destroyed before it (the connection
        // destroys its QP in `Drop`, then drops this field); destroyed exactly once.
        unsafe { (self.api.destroy_cq)(self.cq.as_ptr()) };
    }
}

/// What a work request holds while it is in flight.
struct InFlight {
    wr_id: u64,
    buffer: Arc<FrameBuffer>,
    is_recv: bool,
}

/// One queue pair with its completion queue and protection domain: one side of a link to a
/// peer.
///
/// Work requests carry the caller's `wr_id` and the buffer; the connection tags the
/// hardware's request with a slot number of its own, so a completion always finds its
/// buffer.
pub struct Connection {
    api: Arc<Api>,
    qp: NonNull<sys::ibv_qp>,
    qp_num: u32,
    /// Declared after `qp`'s owner logic: `Drop` destroys the QP before fields drop.
    cq: Cq,
    pd: Arc<PdInner>,
    ctx: Context,
    slots: Vec<Option<InFlight>>,
    free: Vec<usize>,
}

// SAFETY: the queue pair and CQ handles are used only through `&mut self` (one thread at a
// time) and by thread-safe verbs calls; the in-flight buffers are `Arc<FrameBuffer>`, which
// is `Send`.
unsafe impl Send for Connection {}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("device", &self.ctx.name())
            .field("qp_num", &self.qp_num)
            .field("in_flight", &self.in_flight())
            .finish()
    }
}

/// The far end of a connection, as the peer advertised it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteEndpoint {
    /// The peer's port LID.
    pub lid: u16,
    /// The peer's queue-pair number.
    pub qp_num: u32,
    /// The packet sequence number the peer starts sending with.
    pub psn: u32,
    /// The peer's GID.
    pub gid: [u8; 16],
}

/// A work request that could not be posted; the buffer comes back.
#[derive(Debug)]
pub struct PostError {
    /// What went wrong.
    pub error: io::Error,
    /// The buffer that was to be posted.
    pub buffer: Arc<FrameBuffer>,
}

/// A finished work request.
#[derive(Debug)]
pub struct Completion {
    /// The caller's identifier of the request.
    pub wr_id: u64,
    /// Whether it was a receive (else a send).
    pub is_recv: bool,
    /// `enum ibv_wc_status`: 0 is success.
    pub status: u32,
    /// The device's own error code, for failed requests.
    pub vendor_err: u32,
    /// Bytes received (receives only).
    pub byte_len: u32,
    /// The buffer the request used, handed back.
    pub buffer: Arc<FrameBuffer>,
}

impl Completion {
    /// Whether the request succeeded.
    pub fn is_ok(&self) -> bool {
        self.status == sys::IBV_WC_SUCCESS
    }
}

impl Connection {
    /// The queue pair's number, which the peer needs.
    pub fn qp_num(&self) -> u32 {
        self.qp_num
    }

    /// The device this connection is on.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Work requests posted and not yet completed.
    pub fn in_flight(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    fn modify(&mut self, attr: &mut sys::ibv_qp_attr, mask: c_int, what: &str) -> io::Result<()> {
        // SAFETY: the QP is live (owned by `self`); `attr` is a fully initialised struct of
        // at least the library's size, which the call reads for the fields in `mask`.
        let rc = unsafe { (self.api.modify_qp)(self.qp.as_ptr(), attr, mask) };
        check(rc, what)
    }

    /// RESET to INIT: pkey index 0, port `port`, the given access rights.
    ///
    /// # Errors
    ///
    /// The library's error.
    pub fn to_init(&mut self, port: u8, access: i32) -> io::Result<()> {
        let mut attr = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_INIT,
            pkey_index: 0,
            port_num: port,
            qp_access_flags: access as u32,
            ..Default::default()
        };
        let mask = sys::IBV_QP_STATE
            | sys::IBV_QP_PKEY_INDEX
            | sys::IBV_QP_PORT
            | sys::IBV_QP_ACCESS_FLAGS;
        self.modify(&mut attr, mask, "ibv_modify_qp to INIT")
    }

    /// INIT to RTR (ready to receive) towards `remote`, with a 1024-byte path MTU. A remote
    /// GID whose interface half is non-zero makes the address global, with hop limit 1 and
    /// source GID `sgid_index`.
    ///
    /// # Errors
    ///
    /// The library's error.
    pub fn to_rtr(&mut self, remote: &RemoteEndpoint, port: u8, sgid_index: u8) -> io::Result<()> {
        let mut attr = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_RTR,
            path_mtu: sys::IBV_MTU_1024,
            rq_psn: remote.psn,
            dest_qp_num: remote.qp_num,
            ..Default::default()
        };
        attr.ah_attr.dlid = remote.lid;
        attr.ah_attr.sl = 0;
        attr.ah_attr.src_path_bits = 0;
        attr.ah_attr.port_num = port;
        if remote.gid[8..] != [0; 8] {
            attr.ah_attr.is_global = 1;
            attr.ah_attr.grh.hop_limit = 1;
            attr.ah_attr.grh.dgid = sys::ibv_gid { raw: remote.gid };
            attr.ah_attr.grh.sgid_index = sgid_index;
        }
        let mask = sys::IBV_QP_STATE
            | sys::IBV_QP_AV
            | sys::IBV_QP_PATH_MTU
            | sys::IBV_QP_DEST_QPN
            | sys::IBV_QP_RQ_PSN;
        self.modify(&mut attr, mask, "ibv_modify_qp to RTR")
    }

    /// RTR to RTS (ready to send), starting at packet sequence number `sq_psn`.
    ///
    /// # Errors
    ///
    /// The library's error.
    pub fn to_rts(&mut self, sq_psn: u32) -> io::Result<()> {
        let mut attr = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_RTS,
            sq_psn,
            ..Default::default()
        };
        self.modify(
            &mut attr,
            sys::IBV_QP_STATE | sys::IBV_QP_SQ_PSN,
            "ibv_modify_qp to RTS",
        )
    }

    fn take_slot(&mut self, entry: InFlight) -> Result<usize, PostError> {
        match self.free.pop() {
            Some(slot) => {
                self.slots[slot] = Some(entry);
                Ok(slot)
            }
            None => Err(PostError {
                error: io::Error::new(
                    io::ErrorKind::WouldBlock,
                    "every work request slot of the queue pair is in flight",
                ),
                buffer: entry.buffer,
            }),
        }
    }

    /// Takes back the buffer of a request the library refused with `rc`.
    fn unpost(&mut self, slot: usize, rc: c_int) -> PostError {
        match self.release_slot(slot) {
            Some(entry) => PostError {
                error: io::Error::from_raw_os_error(rc.abs()),
                buffer: entry.buffer,
            },
            // `slot` was taken by the caller just before and nothing released it since.
            None => unreachable!("work request slot {slot} vanished before it was released"),
        }
    }

    fn release_slot(&mut self, slot: usize) -> Option<InFlight> {
        let entry = self.slots.get_mut(slot)?.take()?;
        self.free.push(slot);
        Some(entry)
    }

    /// The scatter-gather entry covering all of `buffer`, with this connection's key.
    fn sge(&self, buffer: &FrameBuffer) -> io::Result<sys::ibv_sge> {
        let lkey = buffer.lkey(&self.pd).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "the buffer is not registered with this connection's protection domain",
            )
        })?;
        Ok(sys::ibv_sge {
            addr: buffer.addr as u64,
            length: u32::try_from(buffer.len).map_err(|_| {
                io::Error::new(io::ErrorKind::InvalidInput, "buffer larger than 4 GiB")
            })?,
            lkey,
        })
    }

    /// Posts a signaled SEND of the whole of `buffer`. The buffer may be shared with other
    /// sends (nobody can write to it meanwhile: see the module docs); it comes back in the
    /// completion.
    ///
    /// # Errors
    ///
    /// The buffer is not registered with this connection, every slot is in use, or the
    /// library refused the request; the buffer comes back in the error.
    pub fn post_send(&mut self, buffer: Arc<FrameBuffer>, wr_id: u64) -> Result<(), PostError> {
        let (mut sge, slot) = self.hold(buffer, wr_id, false)?;
        let mut wr = sys::ibv_send_wr::send(slot as u64, &mut sge);
        let mut bad: *mut sys::ibv_send_wr = std::ptr::null_mut();
        let post = self.post_send_fn();
        // SAFETY: the QP is live and in a state the library checks; `wr` and `sge` are live
        // locals the call reads before returning (a SEND is not inline, so the library keeps
        // only the address and key, which point into the buffer held in `slots[slot]` until
        // its completion is polled).
        let rc = unsafe { post(self.qp.as_ptr(), &mut wr, &mut bad) };
        self.posted(slot, rc)
    }

    /// Posts a receive into the whole of `buffer`, which must be the only reference: the
    /// hardware writes into it until the completion hands it back.
    ///
    /// # Errors
    ///
    /// The buffer is shared or not registered with this connection, every slot is in use,
    /// or the library refused the request; the buffer comes back in the error.
    pub fn post_recv(&mut self, mut buffer: Arc<FrameBuffer>, wr_id: u64) -> Result<(), PostError> {
        if Arc::get_mut(&mut buffer).is_none() {
            return Err(PostError {
                error: io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "a receive buffer must not be shared while the hardware writes into it",
                ),
                buffer,
            });
        }
        let (mut sge, slot) = self.hold(buffer, wr_id, true)?;
        let mut wr = sys::ibv_recv_wr {
            wr_id: slot as u64,
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad: *mut sys::ibv_recv_wr = std::ptr::null_mut();
        let post = self.post_recv_fn();
        // SAFETY: as for `post_send`; the buffer behind the SGE is held, unshared, in
        // `slots[slot]` until the completion is polled, so nothing reads or frees it while
        // the hardware writes.
        let rc = unsafe { post(self.qp.as_ptr(), &mut wr, &mut bad) };
        self.posted(slot, rc)
    }

    /// The scatter-gather entry of `buffer` and the slot that holds the buffer until its
    /// completion is polled; on error the buffer comes back.
    fn hold(
        &mut self,
        buffer: Arc<FrameBuffer>,
        wr_id: u64,
        is_recv: bool,
    ) -> Result<(sys::ibv_sge, usize), PostError> {
        let sge = match self.sge(&buffer) {
            Ok(sge) => sge,
            Err(error) => return Err(PostError { error, buffer }),
        };
        let slot = self.take_slot(InFlight {
            wr_id,
            buffer,
            is_recv,
        })?;
        Ok((sge, slot))
    }

    /// The result of a post the library answered with `rc`: refused (non-zero) frees `slot`
    /// and returns its buffer in the error.
    fn posted(&mut self, slot: usize, rc: c_int) -> Result<(), PostError> {
        match rc {
            0 => Ok(()),
            _ => Err(self.unpost(slot, rc)),
        }
    }

    /// The descriptor of this connection's completion channel, readable once an armed
    /// completion queue has a completion; `None` without a channel (the library has none),
    /// when the caller must poll.
    pub fn completion_fd(&self) -> Option<std::os::fd::RawFd> {
        let channel = self.cq.channel.as_ref()?;
        // SAFETY: the channel is live (held by `self.cq`); `fd` is read once.
        Some(unsafe { (*channel.ch.as_ptr()).fd })
    }

    /// Asks for one event on the channel at the next completion. Completions that are
    /// already queued raise none: poll once more after arming, before waiting.
    ///
    /// # Errors
    ///
    /// The connection has no channel, or the library refused.
    pub fn arm(&mut self) -> io::Result<()> {
        if self.cq.channel.is_none() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "the connection has no completion channel",
            ));
        }
        let ctx = self.ctx.inner.ctx.as_ptr();
        // SAFETY: the context is open (held by `self.ctx`); its table is only read.
        let Some(notify) = (unsafe { (*ctx).ops.req_notify_cq }) else {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "the library cannot arm a completion queue",
            ));
        };
        // SAFETY: the CQ is live and has a channel; 0 asks for any completion, not only
        // solicited ones.
        let rc = unsafe { notify(self.cq.cq.as_ptr(), 0) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc.abs()));
        }
        Ok(())
    }

    /// Takes and acknowledges the events waiting on the channel, without blocking; returns
    /// how many there were (0 without a channel).
    ///
    /// # Errors
    ///
    /// The library reports an error other than "no event" (`EAGAIN`).
    pub fn take_events(&mut self) -> io::Result<u32> {
        let (Some(fns), Some(channel)) = (self.api.channels, self.cq.channel.as_ref()) else {
            return Ok(0);
        };
        let mut taken = 0;
        loop {
            let mut cq: *mut sys::ibv_cq = std::ptr::null_mut();
            let mut context: *mut c_void = std::ptr::null_mut();
            // SAFETY: the channel is live and its descriptor non-blocking (set when it was
            // created), so the call returns at once; it writes the two out-pointers, which
            // are live locals.
            let rc = unsafe { (fns.get_event)(channel.ch.as_ptr(), &mut cq, &mut context) };
            if rc != 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::WouldBlock || taken > 0 {
                    break;
                }
                return Err(e);
            }
            taken += 1;
            self.cq.unacked = self.cq.unacked.saturating_add(1);
        }
        if self.cq.unacked > 0 {
            // SAFETY: the CQ is live; `unacked` events of it were taken and not yet
            // acknowledged.
            unsafe { (fns.ack_events)(self.cq.cq.as_ptr(), self.cq.unacked) };
            self.cq.unacked = 0;
        }
        Ok(taken)
    }

    /// Polls the completion queue once, appending what completed (with its buffer) to
    /// `out`. Returns how many were appended.
    ///
    /// # Errors
    ///
    /// The library reports a polling error, or a completion names a request this connection
    /// did not post.
    pub fn poll(&mut self, out: &mut Vec<Completion>) -> io::Result<usize> {
        const BATCH: usize = 16;
        let mut wcs = [sys::ibv_wc::default(); BATCH];
        let poll = self.poll_cq_fn();
        // SAFETY: the CQ is live; `wcs` has room for the BATCH entries asked for, each a
        // `struct ibv_wc` of the header's size (checked by the layout test).
        let n = unsafe { poll(self.cq.cq.as_ptr(), BATCH as c_int, wcs.as_mut_ptr()) };
        if n < 0 {
            return Err(io::Error::other(format!("ibv_poll_cq returned {n}")));
        }
        let n = n as usize;
        for wc in &wcs[..n.min(BATCH)] {
            let entry = usize::try_from(wc.wr_id)
                .ok()
                .and_then(|slot| self.release_slot(slot))
                .ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("a completion for unknown work request {}", wc.wr_id),
                    )
                })?;
            out.push(Completion {
                wr_id: entry.wr_id,
                is_recv: entry.is_recv,
                status: wc.status,
                vendor_err: wc.vendor_err,
                byte_len: wc.byte_len,
                buffer: entry.buffer,
            });
        }
        Ok(n)
    }

    /// The operations table of the context that owns the QP, as `ibv_post_send` reads it.
    fn ops(&self) -> &sys::ibv_context_ops {
        // SAFETY: the QP is live (owned by `self`), so its mirrored prefix can be read; its
        // `context` field is the context that created it.
        let ctx = unsafe { (*self.qp.as_ptr()).context };
        // SAFETY: `ctx` is the live context of a live QP (we hold the context, which outlives
        // the QP); the library never changes its operations table after opening, and the
        // reference does not outlive `&self`.
        unsafe { &(*ctx).ops }
    }

    fn post_send_fn(&self) -> sys::PostSendFn {
        self.ops().post_send.unwrap_or(missing_post_send)
    }

    fn post_recv_fn(&self) -> sys::PostRecvFn {
        self.ops().post_recv.unwrap_or(missing_post_recv)
    }

    fn poll_cq_fn(&self) -> sys::PollCqFn {
        self.ops().poll_cq.unwrap_or(missing_poll_cq)
    }
}

/// Defines stand-ins for an operations table's entries, each `name(argument types) -> result`:
/// a function of the entry's C signature that ignores its arguments and returns `result`.
macro_rules! stand_ins {
    ($($name:ident($($arg:ty),*) -> $result:expr;)*) => {$(
        extern "C" fn $name($(_: $arg),*) -> c_int {
            $result
        }
    )*};
}

// Stand-ins for an operations table with an empty entry: they fail like the library does.
stand_ins! {
    missing_post_send(*mut sys::ibv_qp, *mut sys::ibv_send_wr, *mut *mut sys::ibv_send_wr)
        -> libc::ENOSYS;
    missing_post_recv(*mut sys::ibv_qp, *mut sys::ibv_recv_wr, *mut *mut sys::ibv_recv_wr)
        -> libc::ENOSYS;
    missing_poll_cq(*mut sys::ibv_cq, c_int, *mut sys::ibv_wc) -> -libc::ENOSYS;
}

impl Drop for Connection {
    fn drop(&mut self) {
        // Destroy the QP straight from its state, with no move to ERR first (Apple's driver
        // then fails every later deregistration: see the module docs). Destroying it stops
        // the hardware and discards outstanding requests, so their buffers can go after.
        // SAFETY: the QP is live and destroyed exactly once, here; nothing uses it after.
        let rc = unsafe { (self.api.destroy_qp)(self.qp.as_ptr()) };
        if rc != 0 {
            // The hardware may still own these buffers and the PD's regions: leaking them is
            // the safe choice.
            for entry in self.slots.drain(..).flatten() {
                std::mem::forget(entry.buffer);
            }
        } else {
            count_queue_pair(self.ctx.name(), false);
        }
        self.pd.queue_pair_gone(rc == 0);
        // `slots` (whose buffers may now deregister), `cq`, `pd` and `ctx` drop after this.
    }
}

/// A memory region's registration with one protection domain.
struct Registration {
    pd: Arc<PdInner>,
    mr: NonNull<sys::ibv_mr>,
    lkey: u32,
}

/// Page-aligned memory that the hardware sends from or receives into, registered with the
/// protection domains of the connections that use it.
///
/// The bytes are reachable only through `&mut self` ([`FrameBuffer::bytes_mut`]): a buffer
/// shared with the hardware (inside an `Arc` a connection holds) cannot be read or written
/// until it is handed back.
pub struct FrameBuffer {
    /// `None` only while the buffer is dropped (the mapping then moves to whoever
    /// deregisters it: see [`PdInner::retire`]).
    map: Option<memmap2::MmapMut>,
    /// The mapping's address and length, taken once, so posting needs no reference to the
    /// bytes.
    addr: usize,
    len: usize,
    regs: Vec<Registration>,
}

// SAFETY: the memory region handles are used only by `Drop` (handed to their PD, which
// deregisters each once) and their keys are plain integers; the mapping is owned. Moving the
// buffer between threads moves nothing the hardware holds (the mapping's address does not
// change).
unsafe impl Send for FrameBuffer {}
// SAFETY: `&FrameBuffer` gives access to the keys and length only, never to the bytes.
unsafe impl Sync for FrameBuffer {}

impl fmt::Debug for FrameBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FrameBuffer")
            .field("len", &self.len)
            .field("registrations", &self.regs.len())
            .finish()
    }
}

impl FrameBuffer {
    /// Maps `len` bytes of zeroed, page-aligned anonymous memory (which Apple's
    /// `ibv_reg_mr` reportedly accepts where heap memory is refused).
    ///
    /// # Errors
    ///
    /// The mapping failed.
    pub fn new(len: usize) -> io::Result<FrameBuffer> {
        let mut map = memmap2::MmapOptions::new().len(len).map_anon()?;
        let addr = map.as_mut_ptr() as usize;
        Ok(FrameBuffer {
            map: Some(map),
            addr,
            len,
            regs: Vec::new(),
        })
    }

    /// The buffer's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes, to fill before a send or read after a receive.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self.map.as_deref_mut().unwrap_or_default()
    }

    fn lkey(&self, pd: &Arc<PdInner>) -> Option<u32> {
        self.regs
            .iter()
            .find(|r| Arc::ptr_eq(&r.pd, pd))
            .map(|r| r.lkey)
    }

    /// Whether the buffer is registered with `conn`'s protection domain.
    pub fn is_registered_with(&self, conn: &Connection) -> bool {
        self.lkey(&conn.pd).is_some()
    }

    /// Registers the buffer with `conn`'s protection domain (once; registering again is a
    /// no-op), with MLX's rights, [`ACCESS_JACCL`] (see there why the remote rights are
    /// asked for, and why no peer can use them).
    ///
    /// # Errors
    ///
    /// The library's error (on Apple's stack, reportedly, when a device's limit of about 100
    /// memory regions is reached).
    pub fn register(&mut self, conn: &Connection) -> io::Result<()> {
        if self.is_registered_with(conn) {
            return Ok(());
        }
        let pd = conn.pd.clone();
        // SAFETY: `pd` is live; the address range is our own mapping of `len` bytes, which
        // stays mapped until the registration is removed (`Drop` hands the mapping to the PD
        // with the region, and the PD drops it only after deregistering).
        let mr = unsafe {
            (pd.ctx.api.reg_mr)(
                pd.pd.as_ptr(),
                self.addr as *mut c_void,
                self.len,
                ACCESS_REGION,
            )
        };
        let mr = NonNull::new(mr).ok_or_else(|| last_error("ibv_reg_mr"))?;
        // SAFETY: `mr` was just returned by `ibv_reg_mr`: a live `struct ibv_mr`, mirrored in
        // full by `sys::ibv_mr`; its key is read once.
        let lkey = unsafe { (*mr.as_ptr()).lkey };
        self.regs.push(Registration { pd, mr, lkey });
        Ok(())
    }
}

impl Drop for FrameBuffer {
    fn drop(&mut self) {
        // A buffer is only dropped when no connection holds it (in-flight requests hold an
        // `Arc`). Each region goes to its PD, which deregisters it at once, or, while a queue
        // pair of the PD is alive, when the last one is destroyed; the mapping lives until
        // every region over it is deregistered (each keeps a reference).
        let Some(map) = self.map.take() else { return };
        let map = Arc::new(map);
        for reg in self.regs.drain(..) {
            reg.pd.retire(reg.mr, &map);
        }
    }
}

/// Maps a verbs return code (0, or an errno value, sometimes negated, or -1 with `errno`).
fn check(rc: c_int, what: &str) -> io::Result<()> {
    match rc {
        0 => Ok(()),
        -1 => Err(last_error(what)),
        rc => {
            let e = io::Error::from_raw_os_error(rc.abs());
            Err(io::Error::new(e.kind(), format!("{what}: {e}")))
        }
    }
}

/// `errno` after a failed call, with the call's name.
fn last_error(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        // Keep the raw code readable for callers that test for ENOSYS.
        Some(_) => e,
        None => io::Error::other(format!("{what} failed")),
    }
}

/// The Rust side's sizes, offsets and constants, for `ffi/tests/verbs_layout.rs`.
#[doc(hidden)]
pub fn layout() -> Vec<(&'static str, usize)> {
    sys::layout()
}

/// The ENOSYS code, which libibverbs returns for "no RDMA support in this kernel".
pub const ENOSYS: i32 = libc::ENOSYS;

#[cfg(test)]
mod tests {
    use super::*;

    /// On machines without the library, or without RDMA in the kernel (`ENOSYS`), the
    /// binding says so instead of failing to start; where devices exist, they are listed.
    #[test]
    fn loading_and_listing_report_what_is_missing() {
        match Verbs::load() {
            Err(e) => {
                let text = e.to_string();
                assert!(text.contains("verbs") || text.contains("lib"), "{text}");
            }
            Ok(verbs) => {
                assert!(!verbs.library().is_empty());
                match verbs.device_names() {
                    Ok(names) => {
                        for name in names {
                            let ctx = verbs.open(&name).expect("a listed device opens");
                            assert_eq!(ctx.name(), name);
                        }
                    }
                    Err(e) => assert!(e.raw_os_error().is_some(), "{e:?}"),
                }
                let e = verbs.open("no-such-rdma-device").unwrap_err();
                assert!(
                    e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(ENOSYS),
                    "{e:?}"
                );
            }
        }
    }

    #[test]
    fn frame_buffers_are_zeroed_page_aligned_memory() {
        let mut buf = FrameBuffer::new(8192).unwrap();
        assert_eq!(buf.len(), 8192);
        assert!(!buf.is_empty());
        assert_eq!(buf.addr % 4096, 0);
        assert!(buf.bytes_mut().iter().all(|&b| b == 0));
        buf.bytes_mut()[8191] = 7;
        assert_eq!(buf.bytes_mut()[8191], 7);
        // Moving the buffer (into an Arc, as posting does) keeps its address.
        let before = buf.addr;
        let mut shared = Arc::new(buf);
        assert_eq!(shared.addr, before);
        assert_eq!(Arc::get_mut(&mut shared).unwrap().bytes_mut()[8191], 7);
    }

    #[test]
    fn verbs_return_codes_become_errors_with_the_call_named() {
        assert!(check(0, "x").is_ok());
        let e = check(libc::EINVAL, "ibv_modify_qp to RTR").unwrap_err();
        assert!(e.to_string().contains("ibv_modify_qp to RTR"), "{e}");
        let e = check(-libc::EBUSY, "ibv_create_qp").unwrap_err();
        assert!(e.to_string().contains("ibv_create_qp"), "{e}");
    }
}
