/* Prints the size, offset or value of everything ffi/src/verbs/sys.rs mirrors, as
 * "<name> <number>" lines, for ffi/tests/verbs_layout.rs to compare with the Rust side.
 * Compiled against the platform's own infiniband/verbs.h. */
#include <stddef.h>
#include <stdio.h>
#include <infiniband/verbs.h>

#define SIZE(t) printf("size:%s %zu\n", #t, sizeof(struct t))
#define OFF(t, f) printf("%s.%s %zu\n", #t, #f, offsetof(struct t, f))
#define CONST(c) printf("%s %ld\n", #c, (long)(c))

int main(void) {
    printf("size:ibv_gid %zu\n", sizeof(union ibv_gid));
    OFF(ibv_context, device);
    OFF(ibv_context, ops);
    OFF(ibv_context, ops.poll_cq);
    OFF(ibv_context, ops.req_notify_cq);
    OFF(ibv_context, ops.post_send);
    OFF(ibv_context, ops.post_recv);
    OFF(ibv_cq, context);
    OFF(ibv_comp_channel, context);
    OFF(ibv_comp_channel, fd);
    OFF(ibv_qp, context);
    OFF(ibv_qp, pd);
    OFF(ibv_qp, send_cq);
    OFF(ibv_qp, recv_cq);
    OFF(ibv_qp, qp_num);
    SIZE(ibv_mr);
    OFF(ibv_mr, addr);
    OFF(ibv_mr, length);
    OFF(ibv_mr, lkey);
    OFF(ibv_mr, rkey);
    SIZE(ibv_device_attr);
    OFF(ibv_device_attr, max_qp);
    OFF(ibv_device_attr, max_qp_wr);
    OFF(ibv_device_attr, max_cqe);
    OFF(ibv_device_attr, max_mr);
    OFF(ibv_device_attr, phys_port_cnt);
    SIZE(ibv_port_attr);
    OFF(ibv_port_attr, state);
    OFF(ibv_port_attr, active_mtu);
    OFF(ibv_port_attr, gid_tbl_len);
    OFF(ibv_port_attr, lid);
    OFF(ibv_port_attr, link_layer);
    SIZE(ibv_sge);
    OFF(ibv_sge, addr);
    OFF(ibv_sge, length);
    OFF(ibv_sge, lkey);
    SIZE(ibv_send_wr);
    OFF(ibv_send_wr, wr_id);
    OFF(ibv_send_wr, next);
    OFF(ibv_send_wr, sg_list);
    OFF(ibv_send_wr, num_sge);
    OFF(ibv_send_wr, opcode);
    OFF(ibv_send_wr, send_flags);
    OFF(ibv_send_wr, imm_data);
    SIZE(ibv_recv_wr);
    OFF(ibv_recv_wr, wr_id);
    OFF(ibv_recv_wr, next);
    OFF(ibv_recv_wr, sg_list);
    OFF(ibv_recv_wr, num_sge);
    SIZE(ibv_wc);
    OFF(ibv_wc, wr_id);
    OFF(ibv_wc, status);
    OFF(ibv_wc, opcode);
    OFF(ibv_wc, vendor_err);
    OFF(ibv_wc, byte_len);
    OFF(ibv_wc, qp_num);
    SIZE(ibv_qp_cap);
    SIZE(ibv_qp_init_attr);
    OFF(ibv_qp_init_attr, qp_context);
    OFF(ibv_qp_init_attr, send_cq);
    OFF(ibv_qp_init_attr, recv_cq);
    OFF(ibv_qp_init_attr, srq);
    OFF(ibv_qp_init_attr, cap);
    OFF(ibv_qp_init_attr, cap.max_send_wr);
    OFF(ibv_qp_init_attr, cap.max_recv_wr);
    OFF(ibv_qp_init_attr, cap.max_send_sge);
    OFF(ibv_qp_init_attr, cap.max_recv_sge);
    OFF(ibv_qp_init_attr, cap.max_inline_data);
    OFF(ibv_qp_init_attr, qp_type);
    OFF(ibv_qp_init_attr, sq_sig_all);
    SIZE(ibv_qp_attr);
    OFF(ibv_qp_attr, qp_state);
    OFF(ibv_qp_attr, path_mtu);
    OFF(ibv_qp_attr, rq_psn);
    OFF(ibv_qp_attr, sq_psn);
    OFF(ibv_qp_attr, dest_qp_num);
    OFF(ibv_qp_attr, qp_access_flags);
    OFF(ibv_qp_attr, ah_attr);
    OFF(ibv_qp_attr, ah_attr.grh.dgid);
    OFF(ibv_qp_attr, ah_attr.grh.sgid_index);
    OFF(ibv_qp_attr, ah_attr.grh.hop_limit);
    OFF(ibv_qp_attr, ah_attr.dlid);
    OFF(ibv_qp_attr, ah_attr.sl);
    OFF(ibv_qp_attr, ah_attr.src_path_bits);
    OFF(ibv_qp_attr, ah_attr.is_global);
    OFF(ibv_qp_attr, ah_attr.port_num);
    OFF(ibv_qp_attr, pkey_index);
    OFF(ibv_qp_attr, port_num);
    CONST(IBV_QPT_UC);
    CONST(IBV_QPS_INIT);
    CONST(IBV_QPS_RTR);
    CONST(IBV_QPS_RTS);
    CONST(IBV_QPS_ERR);
    CONST(IBV_MTU_1024);
    CONST(IBV_WR_SEND);
    CONST(IBV_SEND_SIGNALED);
    CONST(IBV_ACCESS_LOCAL_WRITE);
    CONST(IBV_ACCESS_REMOTE_WRITE);
    CONST(IBV_ACCESS_REMOTE_READ);
    CONST(IBV_QP_STATE);
    CONST(IBV_QP_ACCESS_FLAGS);
    CONST(IBV_QP_PKEY_INDEX);
    CONST(IBV_QP_PORT);
    CONST(IBV_QP_AV);
    CONST(IBV_QP_PATH_MTU);
    CONST(IBV_QP_RQ_PSN);
    CONST(IBV_QP_SQ_PSN);
    CONST(IBV_QP_DEST_QPN);
    CONST(IBV_WC_SUCCESS);
    CONST(IBV_PORT_ACTIVE);
    return 0;
}
