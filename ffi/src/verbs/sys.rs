//! The C declarations of the verbs API that the binding uses, mirrored by hand.
//!
//! Only what JACCL needs is here: the device list, a context, a protection domain, one
//! completion queue and one UC queue pair per connection, memory regions, device, port and
//! GID queries, and `modify_qp` to INIT, RTR and RTS. `post_send`, `post_recv` and `poll_cq` are
//! `static inline` in the header: they call through the context's operations table, so the
//! table's layout is mirrored up to the last entry used.
//!
//! Two kinds of struct are declared:
//!
//! - **Full** structs, which this side allocates and the library reads or fills
//!   (`ibv_qp_attr`, `ibv_qp_init_attr`, `ibv_device_attr`, `ibv_port_attr`, `ibv_send_wr`,
//!   `ibv_recv_wr`, `ibv_sge`, `ibv_wc`, `ibv_gid`, `ibv_mr`): every field is declared, and the size must be at
//!   least the header's (larger is harmless: the tail is zeroed and never read).
//! - **Prefix** structs, which the library allocates and this side only reads through a
//!   pointer (`ibv_context`, `ibv_qp`, `ibv_cq`): only the fields up to the last one used are
//!   declared. They are never created or moved by value, so their size does not matter, and
//!   the fields after the prefix (which include `pthread_mutex_t`, whose size differs between
//!   Linux and macOS) are not needed.
//!
//! # Platforms
//!
//! On Linux the declarations follow rdma-core's `infiniband/verbs.h` (checked against v44).
//! Apple's `librdma.dylib` (macOS 26.2 and later) is documented by Apple as "RDMA Verbs
//! compatible", and MLX compiles the same field accesses against the SDK's header, so the same
//! layout is assumed there for every field used here. That assumption is checked by
//! `ffi/tests/verbs_layout.rs`, which compiles a C probe against the platform's header (the
//! SDK's, through `xcrun`, on macOS) and compares every size and offset; until it has run on
//! a Mac, the macOS layout is unverified. Only the library's name is per platform.
//!
//! The test provider (`ffi/verbs-provider/src/abi.rs`) transcribes the same header a second
//! time on purpose rather than sharing these declarations: a mistake made once would
//! otherwise be on both sides of every test and go unseen. Its unit test compares the two
//! sets of offsets.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_uint, c_void};

/// The library the binding loads.
#[cfg(target_os = "linux")]
pub(crate) const LIBRARY: Option<&str> = Some("libibverbs.so.1");
/// The library the binding loads.
#[cfg(target_os = "macos")]
pub(crate) const LIBRARY: Option<&str> = Some("librdma.dylib");
/// No verbs library is known on this platform.
#[cfg(not(any(target_os = "linux", target_os = "macos")))]
pub(crate) const LIBRARY: Option<&str> = None;

// enum ibv_qp_type
pub(crate) const IBV_QPT_UC: u32 = 3;

// enum ibv_qp_state
pub(crate) const IBV_QPS_INIT: u32 = 1;
pub(crate) const IBV_QPS_RTR: u32 = 2;
pub(crate) const IBV_QPS_RTS: u32 = 3;
pub(crate) const IBV_QPS_ERR: u32 = 6;

// enum ibv_mtu
pub(crate) const IBV_MTU_1024: u32 = 3;

// enum ibv_wr_opcode
pub(crate) const IBV_WR_SEND: u32 = 2;

// enum ibv_send_flags
pub(crate) const IBV_SEND_SIGNALED: u32 = 1 << 1;

// enum ibv_access_flags
pub(crate) const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
pub(crate) const IBV_ACCESS_REMOTE_WRITE: c_int = 1 << 1;
pub(crate) const IBV_ACCESS_REMOTE_READ: c_int = 1 << 2;

// enum ibv_qp_attr_mask
pub(crate) const IBV_QP_STATE: c_int = 1 << 0;
pub(crate) const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub(crate) const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub(crate) const IBV_QP_PORT: c_int = 1 << 5;
pub(crate) const IBV_QP_AV: c_int = 1 << 7;
pub(crate) const IBV_QP_PATH_MTU: c_int = 1 << 8;
pub(crate) const IBV_QP_RQ_PSN: c_int = 1 << 12;
pub(crate) const IBV_QP_SQ_PSN: c_int = 1 << 16;
pub(crate) const IBV_QP_DEST_QPN: c_int = 1 << 20;

// enum ibv_wc_status
pub(crate) const IBV_WC_SUCCESS: u32 = 0;

/// `struct ibv_device`: opaque here; only its name is asked for, through a function.
#[repr(C)]
pub(crate) struct ibv_device {
    _opaque: [u8; 0],
}

/// `struct ibv_pd`: opaque here.
#[repr(C)]
pub(crate) struct ibv_pd {
    _opaque: [u8; 0],
}

/// `struct ibv_comp_channel`, prefix: the context and the file descriptor that becomes
/// readable when an armed completion queue of the channel gets a completion.
#[repr(C)]
pub(crate) struct ibv_comp_channel {
    pub(crate) context: *mut ibv_context,
    pub(crate) fd: c_int,
}

/// `union ibv_gid`: 16 raw bytes, aligned as the union's pair of `__be64`.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ibv_gid {
    pub(crate) raw: [u8; 16],
}

/// `struct ibv_context_ops`, up to `post_recv`. The `_compat_*` entries and the operations
/// the binding never calls are kept as untyped pointers, so only the three it calls need
/// their exact signatures.
#[repr(C)]
pub(crate) struct ibv_context_ops {
    /// `_compat_query_device` .. `_compat_create_cq` (11 entries).
    _before_poll_cq: [*mut c_void; 11],
    pub(crate) poll_cq: Option<PollCqFn>,
    pub(crate) req_notify_cq: Option<ReqNotifyCqFn>,
    /// `_compat_cq_event` .. `_compat_destroy_qp` (12 entries).
    _before_post_send: [*mut c_void; 12],
    pub(crate) post_send: Option<PostSendFn>,
    pub(crate) post_recv: Option<PostRecvFn>,
}

/// `struct ibv_context`, prefix: the device and the operations table.
#[repr(C)]
pub(crate) struct ibv_context {
    pub(crate) device: *mut ibv_device,
    pub(crate) ops: ibv_context_ops,
}

/// `struct ibv_cq`, prefix: the context whose operations poll it.
#[repr(C)]
pub(crate) struct ibv_cq {
    pub(crate) context: *mut ibv_context,
}

/// `struct ibv_qp`, prefix up to `qp_num`.
#[repr(C)]
pub(crate) struct ibv_qp {
    pub(crate) context: *mut ibv_context,
    pub(crate) qp_context: *mut c_void,
    pub(crate) pd: *mut ibv_pd,
    pub(crate) send_cq: *mut ibv_cq,
    pub(crate) recv_cq: *mut ibv_cq,
    pub(crate) srq: *mut c_void,
    pub(crate) handle: u32,
    pub(crate) qp_num: u32,
}

/// `struct ibv_mr`.
#[repr(C)]
pub(crate) struct ibv_mr {
    pub(crate) context: *mut ibv_context,
    pub(crate) pd: *mut ibv_pd,
    pub(crate) addr: *mut c_void,
    pub(crate) length: usize,
    pub(crate) handle: u32,
    pub(crate) lkey: u32,
    pub(crate) rkey: u32,
}

/// `struct ibv_device_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct ibv_device_attr {
    pub(crate) fw_ver: [c_char; 64],
    pub(crate) node_guid: u64,
    pub(crate) sys_image_guid: u64,
    pub(crate) max_mr_size: u64,
    pub(crate) page_size_cap: u64,
    pub(crate) vendor_id: u32,
    pub(crate) vendor_part_id: u32,
    pub(crate) hw_ver: u32,
    pub(crate) max_qp: c_int,
    pub(crate) max_qp_wr: c_int,
    pub(crate) device_cap_flags: c_uint,
    pub(crate) max_sge: c_int,
    pub(crate) max_sge_rd: c_int,
    pub(crate) max_cq: c_int,
    pub(crate) max_cqe: c_int,
    pub(crate) max_mr: c_int,
    pub(crate) max_pd: c_int,
    pub(crate) max_qp_rd_atom: c_int,
    pub(crate) max_ee_rd_atom: c_int,
    pub(crate) max_res_rd_atom: c_int,
    pub(crate) max_qp_init_rd_atom: c_int,
    pub(crate) max_ee_init_rd_atom: c_int,
    pub(crate) atomic_cap: u32,
    pub(crate) max_ee: c_int,
    pub(crate) max_rdd: c_int,
    pub(crate) max_mw: c_int,
    pub(crate) max_raw_ipv6_qp: c_int,
    pub(crate) max_raw_ethy_qp: c_int,
    pub(crate) max_mcast_grp: c_int,
    pub(crate) max_mcast_qp_attach: c_int,
    pub(crate) max_total_mcast_qp_attach: c_int,
    pub(crate) max_ah: c_int,
    pub(crate) max_fmr: c_int,
    pub(crate) max_map_per_fmr: c_int,
    pub(crate) max_srq: c_int,
    pub(crate) max_srq_wr: c_int,
    pub(crate) max_srq_sge: c_int,
    pub(crate) max_pkeys: u16,
    pub(crate) local_ca_ack_delay: u8,
    pub(crate) phys_port_cnt: u8,
}

impl Default for ibv_device_attr {
    fn default() -> Self {
        ibv_device_attr {
            fw_ver: [0; 64],
            node_guid: 0,
            sys_image_guid: 0,
            max_mr_size: 0,
            page_size_cap: 0,
            vendor_id: 0,
            vendor_part_id: 0,
            hw_ver: 0,
            max_qp: 0,
            max_qp_wr: 0,
            device_cap_flags: 0,
            max_sge: 0,
            max_sge_rd: 0,
            max_cq: 0,
            max_cqe: 0,
            max_mr: 0,
            max_pd: 0,
            max_qp_rd_atom: 0,
            max_ee_rd_atom: 0,
            max_res_rd_atom: 0,
            max_qp_init_rd_atom: 0,
            max_ee_init_rd_atom: 0,
            atomic_cap: 0,
            max_ee: 0,
            max_rdd: 0,
            max_mw: 0,
            max_raw_ipv6_qp: 0,
            max_raw_ethy_qp: 0,
            max_mcast_grp: 0,
            max_mcast_qp_attach: 0,
            max_total_mcast_qp_attach: 0,
            max_ah: 0,
            max_fmr: 0,
            max_map_per_fmr: 0,
            max_srq: 0,
            max_srq_wr: 0,
            max_srq_sge: 0,
            max_pkeys: 0,
            local_ca_ack_delay: 0,
            phys_port_cnt: 0,
        }
    }
}

/// `struct ibv_port_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ibv_port_attr {
    pub(crate) state: u32,
    pub(crate) max_mtu: u32,
    pub(crate) active_mtu: u32,
    pub(crate) gid_tbl_len: c_int,
    pub(crate) port_cap_flags: u32,
    pub(crate) max_msg_sz: u32,
    pub(crate) bad_pkey_cntr: u32,
    pub(crate) qkey_viol_cntr: u32,
    pub(crate) pkey_tbl_len: u16,
    pub(crate) lid: u16,
    pub(crate) sm_lid: u16,
    pub(crate) lmc: u8,
    pub(crate) max_vl_num: u8,
    pub(crate) sm_sl: u8,
    pub(crate) subnet_timeout: u8,
    pub(crate) init_type_reply: u8,
    pub(crate) active_width: u8,
    pub(crate) active_speed: u8,
    pub(crate) phys_state: u8,
    pub(crate) link_layer: u8,
    pub(crate) flags: u8,
    pub(crate) port_cap_flags2: u16,
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ibv_sge {
    pub(crate) addr: u64,
    pub(crate) length: u32,
    pub(crate) lkey: u32,
}

/// `struct ibv_send_wr`. The unions after `imm_data` (remote address and keys for RDMA,
/// atomics and UD, XRC, memory-window binding, TSO) are unused by a two-sided SEND and are
/// kept as zeroed bytes of the header's size.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct ibv_send_wr {
    pub(crate) wr_id: u64,
    pub(crate) next: *mut ibv_send_wr,
    pub(crate) sg_list: *mut ibv_sge,
    pub(crate) num_sge: c_int,
    pub(crate) opcode: u32,
    pub(crate) send_flags: u32,
    pub(crate) imm_data: u32,
    _unions: [u64; 11],
}

impl ibv_send_wr {
    /// A signaled SEND of the one scatter-gather entry `sge`.
    pub(crate) fn send(wr_id: u64, sge: *mut ibv_sge) -> Self {
        ibv_send_wr {
            wr_id,
            next: std::ptr::null_mut(),
            sg_list: sge,
            num_sge: 1,
            opcode: IBV_WR_SEND,
            send_flags: IBV_SEND_SIGNALED,
            imm_data: 0,
            _unions: [0; 11],
        }
    }
}

/// `struct ibv_recv_wr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct ibv_recv_wr {
    pub(crate) wr_id: u64,
    pub(crate) next: *mut ibv_recv_wr,
    pub(crate) sg_list: *mut ibv_sge,
    pub(crate) num_sge: c_int,
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ibv_wc {
    pub(crate) wr_id: u64,
    pub(crate) status: u32,
    pub(crate) opcode: u32,
    pub(crate) vendor_err: u32,
    pub(crate) byte_len: u32,
    pub(crate) imm_data: u32,
    pub(crate) qp_num: u32,
    pub(crate) src_qp: u32,
    pub(crate) wc_flags: u32,
    pub(crate) pkey_index: u16,
    pub(crate) slid: u16,
    pub(crate) sl: u8,
    pub(crate) dlid_path_bits: u8,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ibv_qp_cap {
    pub(crate) max_send_wr: u32,
    pub(crate) max_recv_wr: u32,
    pub(crate) max_send_sge: u32,
    pub(crate) max_recv_sge: u32,
    pub(crate) max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct ibv_qp_init_attr {
    pub(crate) qp_context: *mut c_void,
    pub(crate) send_cq: *mut ibv_cq,
    pub(crate) recv_cq: *mut ibv_cq,
    pub(crate) srq: *mut c_void,
    pub(crate) cap: ibv_qp_cap,
    pub(crate) qp_type: u32,
    pub(crate) sq_sig_all: c_int,
}

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ibv_global_route {
    pub(crate) dgid: ibv_gid,
    pub(crate) flow_label: u32,
    pub(crate) sgid_index: u8,
    pub(crate) hop_limit: u8,
    pub(crate) traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ibv_ah_attr {
    pub(crate) grh: ibv_global_route,
    pub(crate) dlid: u16,
    pub(crate) sl: u8,
    pub(crate) src_path_bits: u8,
    pub(crate) static_rate: u8,
    pub(crate) is_global: u8,
    pub(crate) port_num: u8,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ibv_qp_attr {
    pub(crate) qp_state: u32,
    pub(crate) cur_qp_state: u32,
    pub(crate) path_mtu: u32,
    pub(crate) path_mig_state: u32,
    pub(crate) qkey: u32,
    pub(crate) rq_psn: u32,
    pub(crate) sq_psn: u32,
    pub(crate) dest_qp_num: u32,
    pub(crate) qp_access_flags: u32,
    pub(crate) cap: ibv_qp_cap,
    pub(crate) ah_attr: ibv_ah_attr,
    pub(crate) alt_ah_attr: ibv_ah_attr,
    pub(crate) pkey_index: u16,
    pub(crate) alt_pkey_index: u16,
    pub(crate) en_sqd_async_notify: u8,
    pub(crate) sq_draining: u8,
    pub(crate) max_rd_atomic: u8,
    pub(crate) max_dest_rd_atomic: u8,
    pub(crate) min_rnr_timer: u8,
    pub(crate) port_num: u8,
    pub(crate) timeout: u8,
    pub(crate) retry_cnt: u8,
    pub(crate) rnr_retry: u8,
    pub(crate) alt_port_num: u8,
    pub(crate) alt_timeout: u8,
    pub(crate) rate_limit: u32,
}

// Exported functions, resolved by name.
pub(crate) type GetDeviceListFn = unsafe extern "C" fn(*mut c_int) -> *mut *mut ibv_device;
pub(crate) type FreeDeviceListFn = unsafe extern "C" fn(*mut *mut ibv_device);
pub(crate) type GetDeviceNameFn = unsafe extern "C" fn(*mut ibv_device) -> *const c_char;
pub(crate) type OpenDeviceFn = unsafe extern "C" fn(*mut ibv_device) -> *mut ibv_context;
pub(crate) type CloseDeviceFn = unsafe extern "C" fn(*mut ibv_context) -> c_int;
pub(crate) type AllocPdFn = unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd;
pub(crate) type DeallocPdFn = unsafe extern "C" fn(*mut ibv_pd) -> c_int;
pub(crate) type CreateCqFn = unsafe extern "C" fn(
    *mut ibv_context,
    c_int,
    *mut c_void,
    *mut ibv_comp_channel,
    c_int,
) -> *mut ibv_cq;
pub(crate) type DestroyCqFn = unsafe extern "C" fn(*mut ibv_cq) -> c_int;
pub(crate) type CreateQpFn =
    unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp;
pub(crate) type DestroyQpFn = unsafe extern "C" fn(*mut ibv_qp) -> c_int;
pub(crate) type ModifyQpFn = unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int;
pub(crate) type QueryDeviceFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_device_attr) -> c_int;
/// The exported `ibv_query_port`. In rdma-core the header wraps it in an inline function
/// that zeroes the attributes first, because the exported symbol fills only the older,
/// shorter form of the struct; the binding zeroes them too.
pub(crate) type QueryPortFn =
    unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int;
pub(crate) type QueryGidFn =
    unsafe extern "C" fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int;
pub(crate) type RegMrFn =
    unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr;
pub(crate) type DeregMrFn = unsafe extern "C" fn(*mut ibv_mr) -> c_int;
pub(crate) type CreateCompChannelFn =
    unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_comp_channel;
pub(crate) type DestroyCompChannelFn = unsafe extern "C" fn(*mut ibv_comp_channel) -> c_int;
pub(crate) type GetCqEventFn =
    unsafe extern "C" fn(*mut ibv_comp_channel, *mut *mut ibv_cq, *mut *mut c_void) -> c_int;
pub(crate) type AckCqEventsFn = unsafe extern "C" fn(*mut ibv_cq, c_uint);

// Entries of the operations table, called as the header's inline functions call them.
pub(crate) type PollCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int;
pub(crate) type ReqNotifyCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int;
pub(crate) type PostSendFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
pub(crate) type PostRecvFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;

/// The sizes, offsets and constants above, by the names the C probe of
/// `ffi/tests/verbs_layout.rs` prints: `size:<struct>` for full structs, `<struct>.<field>`
/// for offsets, and the constants by their C names.
pub(crate) fn layout() -> Vec<(&'static str, usize)> {
    use std::mem::{offset_of, size_of};
    macro_rules! off {
        ($t:ident, $($f:tt)+) => {
            (concat!(stringify!($t), ".", stringify!($($f)+)), offset_of!($t, $($f)+))
        };
    }
    macro_rules! size {
        ($t:ident) => {
            (concat!("size:", stringify!($t)), size_of::<$t>())
        };
    }
    macro_rules! constant {
        ($c:ident) => {
            (stringify!($c), $c as usize)
        };
    }
    vec![
        size!(ibv_gid),
        off!(ibv_context, device),
        off!(ibv_context, ops),
        off!(ibv_context, ops.poll_cq),
        off!(ibv_context, ops.req_notify_cq),
        off!(ibv_context, ops.post_send),
        off!(ibv_context, ops.post_recv),
        off!(ibv_cq, context),
        off!(ibv_comp_channel, context),
        off!(ibv_comp_channel, fd),
        off!(ibv_qp, context),
        off!(ibv_qp, pd),
        off!(ibv_qp, send_cq),
        off!(ibv_qp, recv_cq),
        off!(ibv_qp, qp_num),
        size!(ibv_mr),
        off!(ibv_mr, addr),
        off!(ibv_mr, length),
        off!(ibv_mr, lkey),
        off!(ibv_mr, rkey),
        size!(ibv_device_attr),
        off!(ibv_device_attr, max_qp),
        off!(ibv_device_attr, max_qp_wr),
        off!(ibv_device_attr, max_cqe),
        off!(ibv_device_attr, max_mr),
        off!(ibv_device_attr, phys_port_cnt),
        size!(ibv_port_attr),
        off!(ibv_port_attr, state),
        off!(ibv_port_attr, active_mtu),
        off!(ibv_port_attr, gid_tbl_len),
        off!(ibv_port_attr, lid),
        off!(ibv_port_attr, link_layer),
        size!(ibv_sge),
        off!(ibv_sge, addr),
        off!(ibv_sge, length),
        off!(ibv_sge, lkey),
        size!(ibv_send_wr),
        off!(ibv_send_wr, wr_id),
        off!(ibv_send_wr, next),
        off!(ibv_send_wr, sg_list),
        off!(ibv_send_wr, num_sge),
        off!(ibv_send_wr, opcode),
        off!(ibv_send_wr, send_flags),
        off!(ibv_send_wr, imm_data),
        size!(ibv_recv_wr),
        off!(ibv_recv_wr, wr_id),
        off!(ibv_recv_wr, next),
        off!(ibv_recv_wr, sg_list),
        off!(ibv_recv_wr, num_sge),
        size!(ibv_wc),
        off!(ibv_wc, wr_id),
        off!(ibv_wc, status),
        off!(ibv_wc, opcode),
        off!(ibv_wc, vendor_err),
        off!(ibv_wc, byte_len),
        off!(ibv_wc, qp_num),
        size!(ibv_qp_cap),
        size!(ibv_qp_init_attr),
        off!(ibv_qp_init_attr, qp_context),
        off!(ibv_qp_init_attr, send_cq),
        off!(ibv_qp_init_attr, recv_cq),
        off!(ibv_qp_init_attr, srq),
        off!(ibv_qp_init_attr, cap),
        off!(ibv_qp_init_attr, cap.max_send_wr),
        off!(ibv_qp_init_attr, cap.max_recv_wr),
        off!(ibv_qp_init_attr, cap.max_send_sge),
        off!(ibv_qp_init_attr, cap.max_recv_sge),
        off!(ibv_qp_init_attr, cap.max_inline_data),
        off!(ibv_qp_init_attr, qp_type),
        off!(ibv_qp_init_attr, sq_sig_all),
        size!(ibv_qp_attr),
        off!(ibv_qp_attr, qp_state),
        off!(ibv_qp_attr, path_mtu),
        off!(ibv_qp_attr, rq_psn),
        off!(ibv_qp_attr, sq_psn),
        off!(ibv_qp_attr, dest_qp_num),
        off!(ibv_qp_attr, qp_access_flags),
        off!(ibv_qp_attr, ah_attr),
        off!(ibv_qp_attr, ah_attr.grh.dgid),
        off!(ibv_qp_attr, ah_attr.grh.sgid_index),
        off!(ibv_qp_attr, ah_attr.grh.hop_limit),
        off!(ibv_qp_attr, ah_attr.dlid),
        off!(ibv_qp_attr, ah_attr.sl),
        off!(ibv_qp_attr, ah_attr.src_path_bits),
        off!(ibv_qp_attr, ah_attr.is_global),
        off!(ibv_qp_attr, ah_attr.port_num),
        off!(ibv_qp_attr, pkey_index),
        off!(ibv_qp_attr, port_num),
        constant!(IBV_QPT_UC),
        constant!(IBV_QPS_INIT),
        constant!(IBV_QPS_RTR),
        constant!(IBV_QPS_RTS),
        constant!(IBV_QPS_ERR),
        constant!(IBV_MTU_1024),
        constant!(IBV_WR_SEND),
        constant!(IBV_SEND_SIGNALED),
        constant!(IBV_ACCESS_LOCAL_WRITE),
        constant!(IBV_ACCESS_REMOTE_WRITE),
        constant!(IBV_ACCESS_REMOTE_READ),
        constant!(IBV_QP_STATE),
        constant!(IBV_QP_ACCESS_FLAGS),
        constant!(IBV_QP_PKEY_INDEX),
        constant!(IBV_QP_PORT),
        constant!(IBV_QP_AV),
        constant!(IBV_QP_PATH_MTU),
        constant!(IBV_QP_RQ_PSN),
        constant!(IBV_QP_SQ_PSN),
        constant!(IBV_QP_DEST_QPN),
        constant!(IBV_WC_SUCCESS),
        ("IBV_PORT_ACTIVE", 4),
    ]
}
