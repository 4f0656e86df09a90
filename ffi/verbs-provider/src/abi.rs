//! The C structs and constants of `infiniband/verbs.h` (rdma-core v44) that the provider
//! allocates, reads or fills, transcribed independently of the binding's `ffi/src/verbs/sys.rs`
//! so that a mistake in one is not copied into the other (the provider's unit test compares
//! the two sets of offsets).
//!
//! Structs this provider allocates (`ibv_context`, `ibv_pd`, `ibv_cq`, `ibv_qp`, `ibv_mr`,
//! `ibv_device`) carry the header's fields up to the last one a caller may read; the ones the
//! caller allocates are read only up to the last field used (`ibv_send_wr`) or in full.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_void};

// enum ibv_qp_type
pub(crate) const IBV_QPT_UC: u32 = 3;

// enum ibv_qp_state
pub(crate) const IBV_QPS_RESET: u32 = 0;
pub(crate) const IBV_QPS_INIT: u32 = 1;
pub(crate) const IBV_QPS_RTR: u32 = 2;
pub(crate) const IBV_QPS_RTS: u32 = 3;
pub(crate) const IBV_QPS_ERR: u32 = 6;

// enum ibv_mtu
pub(crate) const IBV_MTU_1024: u32 = 3;

// enum ibv_port_state
pub(crate) const IBV_PORT_DOWN: u32 = 1;
pub(crate) const IBV_PORT_ACTIVE: u32 = 4;

// IBV_LINK_LAYER_ETHERNET: Thunderbolt RDMA ports, like RoCE, route by GID.
pub(crate) const IBV_LINK_LAYER_ETHERNET: u8 = 2;

// enum ibv_wr_opcode / enum ibv_wc_opcode
pub(crate) const IBV_WR_SEND: u32 = 2;
pub(crate) const IBV_WC_SEND: u32 = 0;
pub(crate) const IBV_WC_RECV: u32 = 1 << 7;

// enum ibv_send_flags
pub(crate) const IBV_SEND_SIGNALED: u32 = 1 << 1;

// enum ibv_access_flags (the ones a UC queue pair and a region may carry)
pub(crate) const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
pub(crate) const IBV_ACCESS_REMOTE_WRITE: c_int = 1 << 1;
pub(crate) const IBV_ACCESS_REMOTE_READ: c_int = 1 << 2;
pub(crate) const IBV_ACCESS_REMOTE_ATOMIC: c_int = 1 << 3;

// enum ibv_qp_attr_mask
pub(crate) const IBV_QP_STATE: c_int = 1 << 0;
pub(crate) const IBV_QP_CUR_STATE: c_int = 1 << 1;
pub(crate) const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub(crate) const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub(crate) const IBV_QP_PORT: c_int = 1 << 5;
pub(crate) const IBV_QP_AV: c_int = 1 << 7;
pub(crate) const IBV_QP_PATH_MTU: c_int = 1 << 8;
pub(crate) const IBV_QP_RQ_PSN: c_int = 1 << 12;
pub(crate) const IBV_QP_ALT_PATH: c_int = 1 << 14;
pub(crate) const IBV_QP_SQ_PSN: c_int = 1 << 16;
pub(crate) const IBV_QP_PATH_MIG_STATE: c_int = 1 << 18;
pub(crate) const IBV_QP_DEST_QPN: c_int = 1 << 20;

// enum ibv_wc_status (the ones this provider reports)
pub(crate) const IBV_WC_SUCCESS: u32 = 0;
pub(crate) const IBV_WC_LOC_LEN_ERR: u32 = 1;
pub(crate) const IBV_WC_LOC_PROT_ERR: u32 = 4;
pub(crate) const IBV_WC_WR_FLUSH_ERR: u32 = 5;
pub(crate) const IBV_WC_REM_INV_REQ_ERR: u32 = 9;
pub(crate) const IBV_WC_RETRY_EXC_ERR: u32 = 12;
pub(crate) const IBV_WC_GENERAL_ERR: u32 = 21;

/// `struct ibv_device`, as far as this provider fills it: the name callers ask for through
/// `ibv_get_device_name`. (rdma-core's starts with private ops and node and transport types;
/// no caller reads those fields directly.)
#[repr(C)]
pub(crate) struct ibv_device {
    pub(crate) name: [c_char; 64],
}

/// `struct ibv_context_ops`: 32 entries, of which only the three the header's inline
/// functions call are filled in (rdma-core leaves the `_compat_*` ones empty too).
#[repr(C)]
pub(crate) struct ibv_context_ops {
    pub(crate) _before_poll_cq: [*const c_void; 11],
    pub(crate) poll_cq: Option<PollCqFn>,
    pub(crate) req_notify_cq: Option<ReqNotifyCqFn>,
    pub(crate) _before_post_send: [*const c_void; 12],
    pub(crate) post_send: Option<PostSendFn>,
    pub(crate) post_recv: Option<PostRecvFn>,
    pub(crate) _after_post_recv: [*const c_void; 5],
}

/// `struct ibv_context`, up to `abi_compat`, with room for the mutex of either platform.
#[repr(C)]
pub(crate) struct ibv_context {
    pub(crate) device: *mut ibv_device,
    pub(crate) ops: ibv_context_ops,
    pub(crate) cmd_fd: c_int,
    pub(crate) async_fd: c_int,
    pub(crate) num_comp_vectors: c_int,
    pub(crate) _mutex: [u64; 8],
    pub(crate) abi_compat: *mut c_void,
}

/// `struct ibv_pd`.
#[repr(C)]
pub(crate) struct ibv_pd {
    pub(crate) context: *mut ibv_context,
    pub(crate) handle: u32,
}

/// `struct ibv_comp_channel`.
#[repr(C)]
pub(crate) struct ibv_comp_channel {
    pub(crate) context: *mut ibv_context,
    pub(crate) fd: c_int,
    pub(crate) refcnt: c_int,
}

/// `struct ibv_cq`, up to `cqe` (the mutex and condition variable after it are not used).
#[repr(C)]
pub(crate) struct ibv_cq {
    pub(crate) context: *mut ibv_context,
    pub(crate) channel: *mut c_void,
    pub(crate) cq_context: *mut c_void,
    pub(crate) handle: u32,
    pub(crate) cqe: c_int,
}

/// `struct ibv_qp`, up to `qp_type`.
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
    pub(crate) state: u32,
    pub(crate) qp_type: u32,
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

/// `union ibv_gid`.
#[repr(C, align(8))]
#[derive(Clone, Copy, Default)]
pub(crate) struct ibv_gid {
    pub(crate) raw: [u8; 16],
}

/// `struct ibv_device_attr`, which the caller allocates and the provider fills in full:
/// the firmware string, two GUIDs, the MR size and page-size caps, three IDs, then 29 `int`
/// limits (the nine named here first, then `max_qp_rd_atom` .. `max_srq_sge`, the atomic
/// capability among them), the P_Key count, the ACK delay and the port count.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct ibv_device_attr {
    pub(crate) fw_ver: [c_char; 64],
    pub(crate) guids: [u64; 2],
    pub(crate) max_mr_size: u64,
    pub(crate) page_size_cap: u64,
    pub(crate) ids: [u32; 3],
    pub(crate) max_qp: c_int,
    pub(crate) max_qp_wr: c_int,
    pub(crate) device_cap_flags: c_int,
    pub(crate) max_sge: c_int,
    pub(crate) max_sge_rd: c_int,
    pub(crate) max_cq: c_int,
    pub(crate) max_cqe: c_int,
    pub(crate) max_mr: c_int,
    pub(crate) max_pd: c_int,
    pub(crate) other_limits: [c_int; 20],
    pub(crate) max_pkeys: u16,
    pub(crate) local_ca_ack_delay: u8,
    pub(crate) phys_port_cnt: u8,
}

/// `struct ibv_port_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
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
#[derive(Clone, Copy)]
pub(crate) struct ibv_sge {
    pub(crate) addr: u64,
    pub(crate) length: u32,
    pub(crate) lkey: u32,
}

/// `struct ibv_send_wr`, up to `send_flags`: the unions after it (RDMA, atomics, UD, XRC,
/// memory windows, TSO) mean nothing to a SEND, the only opcode this provider accepts.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct ibv_send_wr {
    pub(crate) wr_id: u64,
    pub(crate) next: *mut ibv_send_wr,
    pub(crate) sg_list: *mut ibv_sge,
    pub(crate) num_sge: c_int,
    pub(crate) opcode: u32,
    pub(crate) send_flags: u32,
}

/// `struct ibv_recv_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct ibv_recv_wr {
    pub(crate) wr_id: u64,
    pub(crate) next: *mut ibv_recv_wr,
    pub(crate) sg_list: *mut ibv_sge,
    pub(crate) num_sge: c_int,
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
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
#[derive(Clone, Copy, Default)]
pub(crate) struct ibv_qp_cap {
    pub(crate) max_send_wr: u32,
    pub(crate) max_recv_wr: u32,
    pub(crate) max_send_sge: u32,
    pub(crate) max_recv_sge: u32,
    pub(crate) max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
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
#[derive(Clone, Copy, Default)]
pub(crate) struct ibv_global_route {
    pub(crate) dgid: ibv_gid,
    pub(crate) flow_label: u32,
    pub(crate) sgid_index: u8,
    pub(crate) hop_limit: u8,
    pub(crate) traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
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
#[derive(Clone, Copy, Default)]
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

/// The operations table's entries this provider fills in.
pub(crate) type PollCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int;
/// See [`PollCqFn`].
pub(crate) type ReqNotifyCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int;
/// See [`PollCqFn`].
pub(crate) type PostSendFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
/// See [`PollCqFn`].
pub(crate) type PostRecvFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;

/// The offsets a caller relies on, by the names of `ffi::verbs::layout()`, for the test that
/// compares the provider's transcription with the binding's.
#[cfg(test)]
pub(crate) fn layout() -> Vec<(&'static str, usize)> {
    use std::mem::{offset_of, size_of};
    vec![
        ("size:ibv_gid", size_of::<ibv_gid>()),
        ("ibv_context.device", offset_of!(ibv_context, device)),
        ("ibv_context.ops", offset_of!(ibv_context, ops)),
        (
            "ibv_context.ops.poll_cq",
            offset_of!(ibv_context, ops.poll_cq),
        ),
        (
            "ibv_context.ops.post_send",
            offset_of!(ibv_context, ops.post_send),
        ),
        (
            "ibv_context.ops.post_recv",
            offset_of!(ibv_context, ops.post_recv),
        ),
        ("ibv_cq.context", offset_of!(ibv_cq, context)),
        ("ibv_qp.context", offset_of!(ibv_qp, context)),
        ("ibv_qp.pd", offset_of!(ibv_qp, pd)),
        ("ibv_qp.send_cq", offset_of!(ibv_qp, send_cq)),
        ("ibv_qp.recv_cq", offset_of!(ibv_qp, recv_cq)),
        ("ibv_qp.qp_num", offset_of!(ibv_qp, qp_num)),
        ("size:ibv_mr", size_of::<ibv_mr>()),
        ("ibv_mr.lkey", offset_of!(ibv_mr, lkey)),
        ("size:ibv_device_attr", size_of::<ibv_device_attr>()),
        (
            "ibv_device_attr.max_qp",
            offset_of!(ibv_device_attr, max_qp),
        ),
        (
            "ibv_device_attr.max_qp_wr",
            offset_of!(ibv_device_attr, max_qp_wr),
        ),
        (
            "ibv_device_attr.max_cqe",
            offset_of!(ibv_device_attr, max_cqe),
        ),
        (
            "ibv_device_attr.max_mr",
            offset_of!(ibv_device_attr, max_mr),
        ),
        (
            "ibv_device_attr.phys_port_cnt",
            offset_of!(ibv_device_attr, phys_port_cnt),
        ),
        ("size:ibv_port_attr", size_of::<ibv_port_attr>()),
        ("ibv_port_attr.state", offset_of!(ibv_port_attr, state)),
        (
            "ibv_port_attr.active_mtu",
            offset_of!(ibv_port_attr, active_mtu),
        ),
        (
            "ibv_port_attr.gid_tbl_len",
            offset_of!(ibv_port_attr, gid_tbl_len),
        ),
        ("ibv_port_attr.lid", offset_of!(ibv_port_attr, lid)),
        (
            "ibv_port_attr.link_layer",
            offset_of!(ibv_port_attr, link_layer),
        ),
        ("size:ibv_sge", size_of::<ibv_sge>()),
        ("ibv_send_wr.sg_list", offset_of!(ibv_send_wr, sg_list)),
        ("ibv_send_wr.num_sge", offset_of!(ibv_send_wr, num_sge)),
        ("ibv_send_wr.opcode", offset_of!(ibv_send_wr, opcode)),
        (
            "ibv_send_wr.send_flags",
            offset_of!(ibv_send_wr, send_flags),
        ),
        ("size:ibv_recv_wr", size_of::<ibv_recv_wr>()),
        ("size:ibv_wc", size_of::<ibv_wc>()),
        ("ibv_wc.status", offset_of!(ibv_wc, status)),
        ("ibv_wc.byte_len", offset_of!(ibv_wc, byte_len)),
        ("size:ibv_qp_init_attr", size_of::<ibv_qp_init_attr>()),
        (
            "ibv_qp_init_attr.qp_type",
            offset_of!(ibv_qp_init_attr, qp_type),
        ),
        ("size:ibv_qp_attr", size_of::<ibv_qp_attr>()),
        (
            "ibv_qp_attr.dest_qp_num",
            offset_of!(ibv_qp_attr, dest_qp_num),
        ),
        (
            "ibv_qp_attr.ah_attr.grh.dgid",
            offset_of!(ibv_qp_attr, ah_attr.grh.dgid),
        ),
        (
            "ibv_qp_attr.ah_attr.grh.sgid_index",
            offset_of!(ibv_qp_attr, ah_attr.grh.sgid_index),
        ),
        (
            "ibv_qp_attr.ah_attr.is_global",
            offset_of!(ibv_qp_attr, ah_attr.is_global),
        ),
        (
            "ibv_qp_attr.ah_attr.port_num",
            offset_of!(ibv_qp_attr, ah_attr.port_num),
        ),
        (
            "ibv_qp_attr.pkey_index",
            offset_of!(ibv_qp_attr, pkey_index),
        ),
        ("ibv_qp_attr.port_num", offset_of!(ibv_qp_attr, port_num)),
    ]
}
