//! The real fabric: queue pairs on RDMA devices through the verbs binding in `ffi`, set up as
//! MLX 0.32.1 sets them up (`rdma.cpp`) except where Apple's driver is reported to want
//! otherwise, and the device listing behind [`devices`].
//!
//! Per connection: the named device is opened (a context of its own, even when two
//! connections name the same device, as the two sides of a two-rank ring do), then a
//! protection domain, a completion queue shared by both directions, and an Unreliable
//! Connected queue pair (one scatter-gather entry, no inline data). Then every buffer the
//! backend asks for is mapped and registered, with MLX's rights (local write, remote read,
//! remote write), with the connections that use it, and every queue pair moves to INIT on
//! the device's first active port. The address a peer needs is the port's LID, the
//! queue-pair number, the backend's PSN (JACCL's is MLX's 7) and the port's first
//! IPv4-mapped GID (`::ffff:a.b.c.d`, which Thunderbolt ports publish once the interface has
//! an IPv4 address). RTR uses a 1024-byte path MTU and, when the peer's GID has a non-zero
//! interface half, a global route with hop limit 1; RTS starts at the same PSN. Dropping the
//! fabric destroys each queue pair from the state it is in, then deregisters the buffers
//! (the binding keeps that order, see `ffi::verbs`).
//!
//! Where the calls depart from MLX's (each is local: nothing on the wire changes; the
//! module docs of [`jaccl`](crate::jaccl) list them all, with `ffi::verbs`'s):
//!
//! - **The port** is the device's first active one (`ibv_query_device`'s port count, then
//!   `ibv_query_port` on each), not MLX's fixed 1: llama.cpp's Apple transport reports that
//!   the active port is not always 1. Where it is 1, the two agree.
//! - **The source GID index** of the global route is the one the GID scan found, not MLX's
//!   fixed 1 (a known source of `EINVAL` at RTR, MLX PRs #3389 and #3468). On the Thunderbolt
//!   setups reported so far that index is 1, so the two agree there; where they differ,
//!   MLX's choice is the one that fails.
//! - **The queue depth** is the backend's [`Queues::depth`] (JACCL's is
//!   [`SizeClasses::queue_depth`](crate::jaccl::SizeClasses::queue_depth), 256 with large
//!   messages, rather than MLX's 32), and the completion queue holds both queues' worth: Apple's transport counts depth in 4 KiB frames, in which MLX's 32 cannot
//!   hold its own pipeline of 512 KiB messages.
//! - **A completion channel** per completion queue when the library has them (MLX polls
//!   without one), and every completion's status is checked.
//! - **Errors say which limit:** an `EBUSY` from `ibv_create_qp` is reported as the
//!   device's queue-pair limit (ten on Apple's devices, mlx PR #4209), naming the device, how
//!   many this group needs on it and how many this process already held; a device without
//!   an active port is refused before any queue pair is created.

use std::io;
use std::net::Ipv4Addr;

use ffi::verbs::{
    ACCESS_JACCL, Completion as VerbsCompletion, Connection, FrameBuffer, QueueSizes,
};

use super::fabric::{
    BufId, BufferSpec, Completion, Destination, Fabric, FabricResult, FrameMemory, Pool, Queues,
    pack_wr, unpack_wr,
};
use crate::error::{Error, PeerOp, Phase, Result};

/// The queue-pair limit of Apple's Thunderbolt RDMA devices: the 11th `ibv_create_qp` on a
/// device fails with `EBUSY`, however the queue pairs are spread over contexts (mlx PR
/// #4209, measured on an M5 Max and an M4 Pro, macOS 26.5.1).
pub const APPLE_QUEUE_PAIRS_PER_DEVICE: usize = 10;

impl FrameMemory for FrameBuffer {
    fn bytes_mut(&mut self) -> &mut [u8] {
        FrameBuffer::bytes_mut(self)
    }
}

/// A port's state, as `ibv_query_port` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PortState {
    /// The link is down: the cable is unplugged, or RDMA is not enabled at the other end.
    Down,
    /// The link is up but not yet configured.
    Init,
    /// Configured, not yet active.
    Armed,
    /// Ready for traffic.
    Active,
    /// Any other state the library reports.
    Other,
}

/// An RDMA device on this machine, with the port JACCL would use.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RdmaDevice {
    /// The device's name, as the device file names it (`rdma_en5`).
    pub name: String,
    /// How many ports the device has.
    pub ports: u8,
    /// The port JACCL uses and the fields below describe: the first active one, or port 1
    /// when none is active (then `state` says why the device cannot be used).
    pub port: u8,
    /// That port's state.
    pub state: PortState,
    /// That port's LID.
    pub lid: u16,
    /// The IPv4 address of that port's first IPv4-mapped GID: JACCL needs one, and
    /// Thunderbolt ports publish it only once the interface has an IPv4 address.
    pub ipv4: Option<Ipv4Addr>,
}

/// The first IPv4-mapped GID (`::ffff:a.b.c.d`) of port `port`, with its index.
fn ipv4_gid(ctx: &ffi::verbs::Context, port: u8) -> io::Result<Option<(u8, [u8; 16])>> {
    let attr = ctx.query_port(port)?;
    for index in 0..attr.gid_table_len.max(0) {
        let Ok(gid) = ctx.query_gid(port, index) else {
            continue;
        };
        if gid[..10] == [0; 10] && gid[10..12] == [0xff, 0xff] {
            return Ok(u8::try_from(index).ok().map(|i| (i, gid)));
        }
    }
    Ok(None)
}

fn port_state(state: ffi::verbs::PortState) -> PortState {
    match state {
        ffi::verbs::PortState::Down => PortState::Down,
        ffi::verbs::PortState::Init => PortState::Init,
        ffi::verbs::PortState::Armed => PortState::Armed,
        ffi::verbs::PortState::Active | ffi::verbs::PortState::ActiveDefer => PortState::Active,
        _ => PortState::Other,
    }
}

/// The ports of an [`ffi::verbs::ActivePort`] search, for messages: "port 1 down, port 2
/// down".
fn describe_ports(found: &ffi::verbs::ActivePort) -> String {
    if found.states.is_empty() {
        return "it reports no ports".into();
    }
    found
        .states
        .iter()
        .map(|(p, s)| format!("port {p} {:?}", port_state(*s)).to_lowercase())
        .collect::<Vec<_>>()
        .join(", ")
}

/// This machine's RDMA devices, each with the port JACCL would bind its queue pairs to (the
/// first active one: on Thunderbolt devices it is not always 1) and that port's state, LID
/// and IPv4 address.
///
/// # Examples
///
/// ```
/// # #[cfg(feature = "jaccl")] {
/// use nuvec_distributed_engine::jaccl;
///
/// // Without a verbs library, or without RDMA in the kernel, there is nothing to list.
/// match jaccl::devices() {
///     Ok(devices) => {
///         for d in devices {
///             println!("{}: port {} of {}, {:?}, {:?}", d.name, d.port, d.ports, d.state, d.ipv4);
///         }
///     }
///     Err(e) => println!("no RDMA here: {e}"),
/// }
/// # }
/// ```
///
/// # Errors
///
/// [`Error::Unavailable`] if the verbs library cannot be loaded; [`Error::Local`] if it
/// cannot list the devices for a reason other than having none (`ENOSYS`, which Linux
/// answers without RDMA support in the kernel, is read as no devices).
pub fn devices() -> Result<Vec<RdmaDevice>> {
    let verbs = ffi::verbs::Verbs::load().map_err(|e| Error::Unavailable {
        backend: "jaccl",
        reason: e.to_string(),
    })?;
    let names = match verbs.device_names() {
        Ok(names) => names,
        Err(e) if e.raw_os_error() == Some(ffi::verbs::ENOSYS) => return Ok(Vec::new()),
        Err(e) => return Err(Error::local("listing RDMA devices", e)),
    };
    let mut devices = Vec::with_capacity(names.len());
    for name in names {
        let ctx = verbs
            .open(&name)
            .map_err(|e| Error::local(format!("opening RDMA device {name}"), e))?;
        let found = ctx
            .active_port()
            .map_err(|e| Error::local(format!("querying the ports of {name}"), e))?;
        let ports = ctx
            .query_device()
            .map_err(|e| Error::local(format!("querying {name}"), e))?
            .ports;
        let (port, attr) = match found.port {
            Some(active) => active,
            None => (
                1,
                ctx.query_port(1)
                    .map_err(|e| Error::local(format!("querying port 1 of {name}"), e))?,
            ),
        };
        let ipv4 = ipv4_gid(&ctx, port)
            .ok()
            .flatten()
            .map(|(_, gid)| Ipv4Addr::new(gid[12], gid[13], gid[14], gid[15]));
        devices.push(RdmaDevice {
            name,
            ports,
            port,
            state: port_state(attr.state),
            lid: attr.lid,
            ipv4,
        });
    }
    Ok(devices)
}

/// Why JACCL cannot run on this machine, or `None` if the verbs library loads and lists at
/// least one device.
///
/// On macOS every reason ends with a note that the verbs binding calls `post_send`,
/// `post_recv` and `poll_cq` through the device context's function table at offsets checked
/// only against Linux rdma-core's header, and `ffi/tests/verbs_layout.rs` has not yet run
/// against the macOS SDK's. A `None` there means the library loads and lists a device, not
/// that the binding has been verified against it.
pub fn unavailable_reason() -> Option<String> {
    reason().map(|r| format!("{r}{}", platform_caveat()))
}

/// What a macOS reason adds until `ffi/tests/verbs_layout.rs` has passed on a Mac (then this
/// goes, with the matching notes in the module docs and SAFETY.md).
const MACOS_LAYOUT_CAVEAT: &str = " (note: on macOS the verbs binding is unverified: it \
     calls post/poll through the device context's function table at offsets checked only \
     against Linux rdma-core's header, not yet against the macOS SDK's)";

fn platform_caveat() -> &'static str {
    if cfg!(target_os = "macos") {
        MACOS_LAYOUT_CAVEAT
    } else {
        ""
    }
}

fn reason() -> Option<String> {
    match devices() {
        Ok(devices) if devices.is_empty() => Some(format!(
            "{} reports no RDMA devices (RDMA over Thunderbolt needs macOS 26.2 or later, \
             Thunderbolt 5, and `rdma_ctl enable` run once from recoveryOS; on Linux, \
             `Function not implemented` means the kernel has no RDMA support)",
            ffi::verbs::Verbs::load().map_or("the verbs library", |v| v.library())
        )),
        Ok(_) => None,
        Err(Error::Unavailable { reason, .. }) => Some(reason),
        Err(e) => Some(e.to_string()),
    }
}

/// One connection's set-up state.
struct Conn {
    conn: Connection,
    local: Destination,
    /// The device's first active port, which the queue pair is bound to.
    port: u8,
    gid_index: u8,
}

/// Queue pairs on RDMA devices.
pub(crate) struct VerbsFabric {
    conns: Vec<Option<Conn>>,
    /// The packet sequence number the queue pairs start at.
    psn: u32,
    pool: Pool<FrameBuffer>,
    scratch: Vec<VerbsCompletion>,
    /// Sleeping on the completion channels; `None` when the library has none (MLX's
    /// set-up, and possibly Apple's), and the engine naps on the backend's liveness instead.
    waiter: Option<Waiter>,
}

/// A poller over every connection's completion-channel descriptor.
struct Waiter {
    poll: mio::Poll,
    events: mio::Events,
    /// Whether every completion queue is armed since the last wake-up.
    armed: bool,
}

impl Waiter {
    /// A poller over `conns`' channels, if every connection has one and all register.
    fn new(conns: &[Option<Conn>]) -> Option<Waiter> {
        let poll = mio::Poll::new().ok()?;
        for (c, conn) in conns.iter().enumerate() {
            let Some(conn) = conn else { continue };
            let fd = conn.conn.completion_fd()?;
            poll.registry()
                .register(
                    &mut mio::unix::SourceFd(&fd),
                    mio::Token(c),
                    mio::Interest::READABLE,
                )
                .ok()?;
        }
        Some(Waiter {
            poll,
            events: mio::Events::with_capacity(conns.len().max(1)),
            armed: false,
        })
    }
}

impl VerbsFabric {
    /// Opens `devices[c]` for every connection `c` that has one, creates its queue pair as
    /// `queues` says, registers `buffers` with the connections each names, moves the queue
    /// pairs to INIT and reads the addresses to publish. Errors name the peer `peers[c]` the
    /// connection leads to, the device, and `context` (the backend's set-up phase).
    pub(crate) fn open(
        verbs: &ffi::verbs::Verbs,
        devices: &[Option<String>],
        buffers: &[BufferSpec],
        queues: Queues,
        peers: &[usize],
        context: Phase,
    ) -> Result<VerbsFabric> {
        let fail = |c: usize, what: String, e: io::Error| Error::Rdma {
            peer: peers[c],
            op: PeerOp::Connect,
            context,
            reason: format!("{what}: {e}"),
        };
        let refuse = |c: usize, reason: String| Error::Rdma {
            peer: peers[c],
            op: PeerOp::Connect,
            context,
            reason,
        };
        let depth = queues.depth;
        let sizes = QueueSizes {
            cq_entries: 2 * depth,
            max_send_wr: depth,
            max_recv_wr: depth,
        };
        // How many of this group's queue pairs each device carries.
        let needed = |name: &str| devices.iter().flatten().filter(|d| *d == name).count();
        let mut conns = Vec::with_capacity(devices.len());
        for (c, device) in devices.iter().enumerate() {
            let Some(name) = device else {
                conns.push(None);
                continue;
            };
            let ctx = verbs
                .open(name)
                .map_err(|e| fail(c, format!("opening device {name}"), e))?;
            let found = ctx
                .active_port()
                .map_err(|e| fail(c, format!("querying the ports of {name}"), e))?;
            let Some((port, _)) = found.port else {
                return Err(refuse(
                    c,
                    format!(
                        "{name} has no active port ({}): JACCL needs a cabled Thunderbolt 5 \
                         port with RDMA enabled at both ends (`rdma_ctl enable` from \
                         recoveryOS)",
                        describe_ports(&found)
                    ),
                ));
            };
            let (need, held) = (needed(name), ctx.queue_pairs());
            let conn = ctx.connection(sizes).map_err(|e| {
                if e.kind() == io::ErrorKind::ResourceBusy {
                    let reported = ctx
                        .query_device()
                        .map_or_else(|_| "unknown".into(), |d| d.max_qp.to_string());
                    refuse(
                        c,
                        format!(
                            "{name} refused a queue pair with EBUSY: its queue-pair limit is \
                             reached (Apple's Thunderbolt RDMA devices allow \
                             {APPLE_QUEUE_PAIRS_PER_DEVICE} per device, however they are \
                             spread over contexts, mlx PR #4209; this one reports max_qp \
                             {reported}): this process held {held} queue pairs on it, and \
                             this group needs {need} there in all"
                        ),
                    )
                } else {
                    fail(
                        c,
                        format!("creating a queue pair on {name} ({depth} frames per queue)"),
                        e,
                    )
                }
            })?;
            conns.push(Some((name.clone(), port, conn)));
        }
        // Buffers, registered with every connection that uses them.
        let mut mapped = Vec::with_capacity(buffers.len());
        for spec in buffers {
            if spec.conns.is_empty() {
                mapped.push(None);
                continue;
            }
            let mut buf = FrameBuffer::new(spec.bytes)
                .map_err(|e| Error::local("mapping JACCL's buffers", e))?;
            for &c in &spec.conns {
                if let Some((name, _, conn)) = &conns[c] {
                    buf.register(conn).map_err(|e| {
                        fail(
                            c,
                            format!(
                                "registering a {} byte buffer on {name} (Apple allows about \
                                 100 memory regions per device)",
                                spec.bytes
                            ),
                            e,
                        )
                    })?;
                }
            }
            mapped.push(Some(buf));
        }
        let mut ready = Vec::with_capacity(conns.len());
        for (c, entry) in conns.into_iter().enumerate() {
            let Some((name, port, mut conn)) = entry else {
                ready.push(None);
                continue;
            };
            conn.to_init(port, ACCESS_JACCL).map_err(|e| {
                fail(
                    c,
                    format!("moving the queue pair on {name} to INIT on port {port}"),
                    e,
                )
            })?;
            let attr = conn
                .context()
                .query_port(port)
                .map_err(|e| fail(c, format!("querying port {port} of {name}"), e))?;
            let (gid_index, gid) = ipv4_gid(conn.context(), port)
                .map_err(|e| fail(c, format!("reading the GID table of {name} port {port}"), e))?
                .ok_or_else(|| {
                    refuse(
                        c,
                        format!(
                            "{name} (port {port}) has no IPv4-mapped GID: Thunderbolt RDMA \
                             ports publish one only once the interface has an IPv4 address \
                             (for example a link-local alias: ifconfig <interface> inet \
                             169.254.0.1 netmask 255.255.0.0 alias)"
                        ),
                    )
                })?;
            let local = Destination {
                lid: i32::from(attr.lid),
                qpn: conn.qp_num(),
                psn: queues.psn,
                gid,
            };
            ready.push(Some(Conn {
                conn,
                local,
                port,
                gid_index,
            }));
        }
        let waiter = Waiter::new(&ready);
        Ok(VerbsFabric {
            waiter,
            conns: ready,
            psn: queues.psn,
            pool: Pool::new(mapped),
            // Completions are polled in batches the binding bounds (below a completion
            // queue's worth); reserved now, so that no burst of them makes a collective
            // allocate.
            scratch: Vec::with_capacity(sizes.cq_entries as usize),
        })
    }

    fn conn(&mut self, c: usize) -> FabricResult<&mut Conn> {
        self.conns
            .get_mut(c)
            .and_then(Option::as_mut)
            .ok_or_else(|| format!("there is no connection {c}"))
    }
}

/// `enum ibv_wc_status`'s names, for messages.
fn wc_status(status: u32) -> &'static str {
    const NAMES: [&str; 24] = [
        "success",
        "local length error",
        "local QP operation error",
        "local EE context operation error",
        "local protection error",
        "work request flushed",
        "memory window bind error",
        "bad response",
        "local access error",
        "remote invalid request",
        "remote access error",
        "remote operation error",
        "transport retry counter exceeded",
        "RNR retry counter exceeded",
        "local RDD violation",
        "remote invalid RD request",
        "remote aborted",
        "invalid EE context number",
        "invalid EE context state",
        "fatal error",
        "response timeout",
        "general error",
        "tag matching error",
        "tag matching rendezvous incomplete",
    ];
    NAMES
        .get(status as usize)
        .copied()
        .unwrap_or("unknown status")
}

impl Fabric for VerbsFabric {
    fn local(&mut self, conn: usize) -> FabricResult<Destination> {
        Ok(self.conn(conn)?.local)
    }

    fn connect(&mut self, conn: usize, remote: &Destination) -> FabricResult<()> {
        let psn = self.psn;
        let c = self.conn(conn)?;
        let lid = u16::try_from(remote.lid)
            .map_err(|_| format!("the peer advertised LID {}", remote.lid))?;
        let endpoint = ffi::verbs::RemoteEndpoint {
            lid,
            qp_num: remote.qpn,
            psn: remote.psn,
            gid: remote.gid,
        };
        c.conn
            .to_rtr(&endpoint, c.port, c.gid_index)
            .map_err(|e| format!("RTR towards queue pair {:#x}: {e}", remote.qpn))?;
        c.conn.to_rts(psn).map_err(|e| format!("RTS: {e}"))
    }

    fn buffer(&mut self, id: BufId) -> FabricResult<&mut [u8]> {
        self.pool.bytes(id)
    }

    fn post_send(&mut self, conn: usize, id: BufId, tag: u64) -> FabricResult<()> {
        let buf = self.pool.lend_for_send(id)?;
        let c = self.conn(conn)?;
        c.conn
            .post_send(buf, pack_wr(id, tag))
            .map_err(|e| format!("posting a send: {}", e.error))
    }

    fn post_recv(&mut self, conn: usize, id: BufId, tag: u64) -> FabricResult<()> {
        let buf = self.pool.lend_for_recv(id)?;
        let posted = self
            .conn(conn)
            .map(|c| c.conn.post_recv(buf, pack_wr(id, tag)));
        match posted {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                self.pool.give_back(id, e.buffer);
                Err(format!("posting a receive: {}", e.error))
            }
            Err(e) => Err(e),
        }
    }

    /// With completion channels: the first call arms every completion queue and returns at
    /// once, so that the caller polls once more (completions queued before arming raise no
    /// event); the next sleeps until a channel fires or `wait` passes, then takes and
    /// acknowledges the events. A channel that fails puts the fabric back on naps.
    fn wait(&mut self, wait: std::time::Duration) -> bool {
        let VerbsFabric { conns, waiter, .. } = self;
        let Some(w) = waiter else {
            return false;
        };
        let mut live = conns.iter_mut().flatten();
        if !w.armed {
            if live.all(|c| c.conn.arm().is_ok()) {
                w.armed = true;
                return true;
            }
            *waiter = None;
            return false;
        }
        if w.poll.poll(&mut w.events, Some(wait)).is_err() {
            *waiter = None;
            return false;
        }
        w.armed = false;
        if !live.all(|c| c.conn.take_events().is_ok()) {
            *waiter = None;
        }
        true
    }

    fn poll(&mut self, conn: usize, out: &mut Vec<Completion>) -> FabricResult<()> {
        let mut scratch = std::mem::take(&mut self.scratch);
        let polled = self
            .conn(conn)?
            .conn
            .poll(&mut scratch)
            .map_err(|e| format!("polling the completion queue: {e}"));
        for c in scratch.drain(..) {
            let (id, tag) = unpack_wr(c.wr_id);
            let status = if c.is_ok() {
                Ok(())
            } else {
                Err(format!(
                    "work completion status {} ({}), vendor error {:#x}",
                    c.status,
                    wc_status(c.status),
                    c.vendor_err
                ))
            };
            self.pool.give_back(id, c.buffer);
            out.push(Completion {
                conn,
                recv: c.is_recv,
                tag,
                status,
            });
        }
        self.scratch = scratch;
        polled.map(drop)
    }
}
