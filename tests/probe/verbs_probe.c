/* Layout probe: compiled from the installed verbs.h by tests/layout.rs,
 * it prints the size, alignment and every field's offset and size of each
 * struct the crate mirrors, and the value of every constant it mirrors.
 * Listing every field here is the point: tests/layout.rs fails if a field
 * printed here has no Rust counterpart, or differs in offset or size. */
#include <stddef.h>
#include <stdio.h>
#include <infiniband/verbs.h>

#define STRUCT(T) printf("type %s %zu %zu\n", #T, sizeof(struct T), _Alignof(struct T));
#define UNION(T) printf("type %s %zu %zu\n", #T, sizeof(union T), _Alignof(union T));
#define FIELD(T, f) printf("field %s %s %zu %zu\n", #T, #f, offsetof(struct T, f), sizeof(((struct T *)0)->f));
#define CONST(k) printf("const %s %lld\n", #k, (long long)(k));

int main(void)
{
	UNION(ibv_gid) printf("field ibv_gid raw 0 %zu\n", sizeof(((union ibv_gid *)0)->raw));

	STRUCT(ibv_device_attr)
	FIELD(ibv_device_attr, fw_ver) FIELD(ibv_device_attr, node_guid) FIELD(ibv_device_attr, sys_image_guid)
	FIELD(ibv_device_attr, max_mr_size) FIELD(ibv_device_attr, page_size_cap) FIELD(ibv_device_attr, vendor_id)
	FIELD(ibv_device_attr, vendor_part_id) FIELD(ibv_device_attr, hw_ver) FIELD(ibv_device_attr, max_qp)
	FIELD(ibv_device_attr, max_qp_wr) FIELD(ibv_device_attr, device_cap_flags) FIELD(ibv_device_attr, max_sge)
	FIELD(ibv_device_attr, max_sge_rd) FIELD(ibv_device_attr, max_cq) FIELD(ibv_device_attr, max_cqe)
	FIELD(ibv_device_attr, max_mr) FIELD(ibv_device_attr, max_pd) FIELD(ibv_device_attr, max_qp_rd_atom)
	FIELD(ibv_device_attr, max_ee_rd_atom) FIELD(ibv_device_attr, max_res_rd_atom) FIELD(ibv_device_attr, max_qp_init_rd_atom)
	FIELD(ibv_device_attr, max_ee_init_rd_atom) FIELD(ibv_device_attr, atomic_cap) FIELD(ibv_device_attr, max_ee)
	FIELD(ibv_device_attr, max_rdd) FIELD(ibv_device_attr, max_mw) FIELD(ibv_device_attr, max_raw_ipv6_qp)
	FIELD(ibv_device_attr, max_raw_ethy_qp) FIELD(ibv_device_attr, max_mcast_grp) FIELD(ibv_device_attr, max_mcast_qp_attach)
	FIELD(ibv_device_attr, max_total_mcast_qp_attach) FIELD(ibv_device_attr, max_ah) FIELD(ibv_device_attr, max_fmr)
	FIELD(ibv_device_attr, max_map_per_fmr) FIELD(ibv_device_attr, max_srq) FIELD(ibv_device_attr, max_srq_wr)
	FIELD(ibv_device_attr, max_srq_sge) FIELD(ibv_device_attr, max_pkeys) FIELD(ibv_device_attr, local_ca_ack_delay)
	FIELD(ibv_device_attr, phys_port_cnt)

	STRUCT(ibv_port_attr)
	FIELD(ibv_port_attr, state) FIELD(ibv_port_attr, max_mtu) FIELD(ibv_port_attr, active_mtu)
	FIELD(ibv_port_attr, gid_tbl_len) FIELD(ibv_port_attr, port_cap_flags) FIELD(ibv_port_attr, max_msg_sz)
	FIELD(ibv_port_attr, bad_pkey_cntr) FIELD(ibv_port_attr, qkey_viol_cntr) FIELD(ibv_port_attr, pkey_tbl_len)
	FIELD(ibv_port_attr, lid) FIELD(ibv_port_attr, sm_lid) FIELD(ibv_port_attr, lmc) FIELD(ibv_port_attr, max_vl_num)
	FIELD(ibv_port_attr, sm_sl) FIELD(ibv_port_attr, subnet_timeout) FIELD(ibv_port_attr, init_type_reply)
	FIELD(ibv_port_attr, active_width) FIELD(ibv_port_attr, active_speed) FIELD(ibv_port_attr, phys_state)
	FIELD(ibv_port_attr, link_layer) FIELD(ibv_port_attr, flags) FIELD(ibv_port_attr, port_cap_flags2)

	STRUCT(ibv_gid_entry)
	FIELD(ibv_gid_entry, gid) FIELD(ibv_gid_entry, gid_index) FIELD(ibv_gid_entry, port_num)
	FIELD(ibv_gid_entry, gid_type) FIELD(ibv_gid_entry, ndev_ifindex)

	STRUCT(ibv_global_route)
	FIELD(ibv_global_route, dgid) FIELD(ibv_global_route, flow_label) FIELD(ibv_global_route, sgid_index)
	FIELD(ibv_global_route, hop_limit) FIELD(ibv_global_route, traffic_class)

	STRUCT(ibv_ah_attr)
	FIELD(ibv_ah_attr, grh) FIELD(ibv_ah_attr, dlid) FIELD(ibv_ah_attr, sl) FIELD(ibv_ah_attr, src_path_bits)
	FIELD(ibv_ah_attr, static_rate) FIELD(ibv_ah_attr, is_global) FIELD(ibv_ah_attr, port_num)

	STRUCT(ibv_qp_cap)
	FIELD(ibv_qp_cap, max_send_wr) FIELD(ibv_qp_cap, max_recv_wr) FIELD(ibv_qp_cap, max_send_sge)
	FIELD(ibv_qp_cap, max_recv_sge) FIELD(ibv_qp_cap, max_inline_data)

	STRUCT(ibv_qp_init_attr)
	FIELD(ibv_qp_init_attr, qp_context) FIELD(ibv_qp_init_attr, send_cq) FIELD(ibv_qp_init_attr, recv_cq)
	FIELD(ibv_qp_init_attr, srq) FIELD(ibv_qp_init_attr, cap) FIELD(ibv_qp_init_attr, qp_type)
	FIELD(ibv_qp_init_attr, sq_sig_all)

	STRUCT(ibv_qp_attr)
	FIELD(ibv_qp_attr, qp_state) FIELD(ibv_qp_attr, cur_qp_state) FIELD(ibv_qp_attr, path_mtu)
	FIELD(ibv_qp_attr, path_mig_state) FIELD(ibv_qp_attr, qkey) FIELD(ibv_qp_attr, rq_psn) FIELD(ibv_qp_attr, sq_psn)
	FIELD(ibv_qp_attr, dest_qp_num) FIELD(ibv_qp_attr, qp_access_flags) FIELD(ibv_qp_attr, cap)
	FIELD(ibv_qp_attr, ah_attr) FIELD(ibv_qp_attr, alt_ah_attr) FIELD(ibv_qp_attr, pkey_index)
	FIELD(ibv_qp_attr, alt_pkey_index) FIELD(ibv_qp_attr, en_sqd_async_notify) FIELD(ibv_qp_attr, sq_draining)
	FIELD(ibv_qp_attr, max_rd_atomic) FIELD(ibv_qp_attr, max_dest_rd_atomic) FIELD(ibv_qp_attr, min_rnr_timer)
	FIELD(ibv_qp_attr, port_num) FIELD(ibv_qp_attr, timeout) FIELD(ibv_qp_attr, retry_cnt) FIELD(ibv_qp_attr, rnr_retry)
	FIELD(ibv_qp_attr, alt_port_num) FIELD(ibv_qp_attr, alt_timeout) FIELD(ibv_qp_attr, rate_limit)

	STRUCT(ibv_sge)
	FIELD(ibv_sge, addr) FIELD(ibv_sge, length) FIELD(ibv_sge, lkey)

	STRUCT(ibv_send_wr)
	FIELD(ibv_send_wr, wr_id) FIELD(ibv_send_wr, next) FIELD(ibv_send_wr, sg_list) FIELD(ibv_send_wr, num_sge)
	FIELD(ibv_send_wr, opcode) FIELD(ibv_send_wr, send_flags) FIELD(ibv_send_wr, imm_data)
	FIELD(ibv_send_wr, invalidate_rkey) FIELD(ibv_send_wr, wr)
	FIELD(ibv_send_wr, wr.rdma.remote_addr) FIELD(ibv_send_wr, wr.rdma.rkey)
	FIELD(ibv_send_wr, wr.atomic.remote_addr) FIELD(ibv_send_wr, wr.atomic.compare_add)
	FIELD(ibv_send_wr, wr.atomic.swap) FIELD(ibv_send_wr, wr.atomic.rkey)
	FIELD(ibv_send_wr, wr.ud.ah) FIELD(ibv_send_wr, wr.ud.remote_qpn) FIELD(ibv_send_wr, wr.ud.remote_qkey)
	FIELD(ibv_send_wr, qp_type) FIELD(ibv_send_wr, qp_type.xrc.remote_srqn)
	FIELD(ibv_send_wr, bind_mw) FIELD(ibv_send_wr, bind_mw.mw) FIELD(ibv_send_wr, bind_mw.rkey)
	FIELD(ibv_send_wr, bind_mw.bind_info) FIELD(ibv_send_wr, tso) FIELD(ibv_send_wr, tso.hdr)
	FIELD(ibv_send_wr, tso.hdr_sz) FIELD(ibv_send_wr, tso.mss)

	STRUCT(ibv_recv_wr)
	FIELD(ibv_recv_wr, wr_id) FIELD(ibv_recv_wr, next) FIELD(ibv_recv_wr, sg_list) FIELD(ibv_recv_wr, num_sge)

	STRUCT(ibv_wc)
	FIELD(ibv_wc, wr_id) FIELD(ibv_wc, status) FIELD(ibv_wc, opcode) FIELD(ibv_wc, vendor_err)
	FIELD(ibv_wc, byte_len) FIELD(ibv_wc, imm_data) FIELD(ibv_wc, invalidated_rkey) FIELD(ibv_wc, qp_num)
	FIELD(ibv_wc, src_qp) FIELD(ibv_wc, wc_flags) FIELD(ibv_wc, pkey_index) FIELD(ibv_wc, slid)
	FIELD(ibv_wc, sl) FIELD(ibv_wc, dlid_path_bits)

	STRUCT(ibv_mw_bind_info)
	FIELD(ibv_mw_bind_info, mr) FIELD(ibv_mw_bind_info, addr) FIELD(ibv_mw_bind_info, length)
	FIELD(ibv_mw_bind_info, mw_access_flags)

	STRUCT(ibv_mw_bind)
	FIELD(ibv_mw_bind, wr_id) FIELD(ibv_mw_bind, send_flags) FIELD(ibv_mw_bind, bind_info)

	STRUCT(ibv_async_event)
	FIELD(ibv_async_event, element) FIELD(ibv_async_event, element.cq) FIELD(ibv_async_event, element.qp)
	FIELD(ibv_async_event, element.srq) FIELD(ibv_async_event, element.wq) FIELD(ibv_async_event, element.port_num)
	FIELD(ibv_async_event, event_type)

	STRUCT(ibv_srq_attr)
	FIELD(ibv_srq_attr, max_wr) FIELD(ibv_srq_attr, max_sge) FIELD(ibv_srq_attr, srq_limit)

	STRUCT(ibv_srq_init_attr)
	FIELD(ibv_srq_init_attr, srq_context) FIELD(ibv_srq_init_attr, attr)

	STRUCT(ibv_pd)
	FIELD(ibv_pd, context) FIELD(ibv_pd, handle)

	STRUCT(ibv_mr)
	FIELD(ibv_mr, context) FIELD(ibv_mr, pd) FIELD(ibv_mr, addr) FIELD(ibv_mr, length)
	FIELD(ibv_mr, handle) FIELD(ibv_mr, lkey) FIELD(ibv_mr, rkey)

	STRUCT(ibv_mw)
	FIELD(ibv_mw, context) FIELD(ibv_mw, pd) FIELD(ibv_mw, rkey) FIELD(ibv_mw, handle) FIELD(ibv_mw, type)

	STRUCT(ibv_comp_channel)
	FIELD(ibv_comp_channel, context) FIELD(ibv_comp_channel, fd) FIELD(ibv_comp_channel, refcnt)

	STRUCT(ibv_cq)
	FIELD(ibv_cq, context) FIELD(ibv_cq, channel) FIELD(ibv_cq, cq_context) FIELD(ibv_cq, handle)
	FIELD(ibv_cq, cqe) FIELD(ibv_cq, mutex) FIELD(ibv_cq, cond) FIELD(ibv_cq, comp_events_completed)
	FIELD(ibv_cq, async_events_completed)

	STRUCT(ibv_qp)
	FIELD(ibv_qp, context) FIELD(ibv_qp, qp_context) FIELD(ibv_qp, pd) FIELD(ibv_qp, send_cq)
	FIELD(ibv_qp, recv_cq) FIELD(ibv_qp, srq) FIELD(ibv_qp, handle) FIELD(ibv_qp, qp_num) FIELD(ibv_qp, state)
	FIELD(ibv_qp, qp_type) FIELD(ibv_qp, mutex) FIELD(ibv_qp, cond) FIELD(ibv_qp, events_completed)

	STRUCT(ibv_srq)
	FIELD(ibv_srq, context) FIELD(ibv_srq, srq_context) FIELD(ibv_srq, pd) FIELD(ibv_srq, handle)
	FIELD(ibv_srq, mutex) FIELD(ibv_srq, cond) FIELD(ibv_srq, events_completed)

	/* enums and flag sets */
	CONST(IBV_WC_SUCCESS) CONST(IBV_WC_LOC_LEN_ERR) CONST(IBV_WC_LOC_QP_OP_ERR) CONST(IBV_WC_LOC_EEC_OP_ERR)
	CONST(IBV_WC_LOC_PROT_ERR) CONST(IBV_WC_WR_FLUSH_ERR) CONST(IBV_WC_MW_BIND_ERR) CONST(IBV_WC_BAD_RESP_ERR)
	CONST(IBV_WC_LOC_ACCESS_ERR) CONST(IBV_WC_REM_INV_REQ_ERR) CONST(IBV_WC_REM_ACCESS_ERR) CONST(IBV_WC_REM_OP_ERR)
	CONST(IBV_WC_RETRY_EXC_ERR) CONST(IBV_WC_RNR_RETRY_EXC_ERR) CONST(IBV_WC_LOC_RDD_VIOL_ERR)
	CONST(IBV_WC_REM_INV_RD_REQ_ERR) CONST(IBV_WC_REM_ABORT_ERR) CONST(IBV_WC_INV_EECN_ERR)
	CONST(IBV_WC_INV_EEC_STATE_ERR) CONST(IBV_WC_FATAL_ERR) CONST(IBV_WC_RESP_TIMEOUT_ERR)
	CONST(IBV_WC_GENERAL_ERR) CONST(IBV_WC_TM_ERR) CONST(IBV_WC_TM_RNDV_INCOMPLETE)

	CONST(IBV_WC_SEND) CONST(IBV_WC_RDMA_WRITE) CONST(IBV_WC_RDMA_READ) CONST(IBV_WC_COMP_SWAP)
	CONST(IBV_WC_FETCH_ADD) CONST(IBV_WC_BIND_MW) CONST(IBV_WC_LOCAL_INV) CONST(IBV_WC_TSO)
	CONST(IBV_WC_ATOMIC_WRITE) CONST(IBV_WC_RECV) CONST(IBV_WC_RECV_RDMA_WITH_IMM)

	CONST(IBV_WC_GRH) CONST(IBV_WC_WITH_IMM) CONST(IBV_WC_IP_CSUM_OK) CONST(IBV_WC_WITH_INV)

	CONST(IBV_WR_RDMA_WRITE) CONST(IBV_WR_RDMA_WRITE_WITH_IMM) CONST(IBV_WR_SEND) CONST(IBV_WR_SEND_WITH_IMM)
	CONST(IBV_WR_RDMA_READ) CONST(IBV_WR_ATOMIC_CMP_AND_SWP) CONST(IBV_WR_ATOMIC_FETCH_AND_ADD)
	CONST(IBV_WR_LOCAL_INV) CONST(IBV_WR_BIND_MW) CONST(IBV_WR_SEND_WITH_INV) CONST(IBV_WR_TSO)
	CONST(IBV_WR_DRIVER1) CONST(IBV_WR_ATOMIC_WRITE)

	CONST(IBV_SEND_FENCE) CONST(IBV_SEND_SIGNALED) CONST(IBV_SEND_SOLICITED) CONST(IBV_SEND_INLINE)
	CONST(IBV_SEND_IP_CSUM)

	CONST(IBV_QPS_RESET) CONST(IBV_QPS_INIT) CONST(IBV_QPS_RTR) CONST(IBV_QPS_RTS) CONST(IBV_QPS_SQD)
	CONST(IBV_QPS_SQE) CONST(IBV_QPS_ERR) CONST(IBV_QPS_UNKNOWN)

	CONST(IBV_QPT_RC) CONST(IBV_QPT_UC) CONST(IBV_QPT_UD) CONST(IBV_QPT_RAW_PACKET) CONST(IBV_QPT_XRC_SEND)
	CONST(IBV_QPT_XRC_RECV) CONST(IBV_QPT_DRIVER)

	CONST(IBV_MTU_256) CONST(IBV_MTU_512) CONST(IBV_MTU_1024) CONST(IBV_MTU_2048) CONST(IBV_MTU_4096)

	CONST(IBV_PORT_NOP) CONST(IBV_PORT_DOWN) CONST(IBV_PORT_INIT) CONST(IBV_PORT_ARMED) CONST(IBV_PORT_ACTIVE)
	CONST(IBV_PORT_ACTIVE_DEFER)

	CONST(IBV_LINK_LAYER_UNSPECIFIED) CONST(IBV_LINK_LAYER_INFINIBAND) CONST(IBV_LINK_LAYER_ETHERNET)

	CONST(IBV_GID_TYPE_IB) CONST(IBV_GID_TYPE_ROCE_V1) CONST(IBV_GID_TYPE_ROCE_V2)

	CONST(IBV_EVENT_CQ_ERR) CONST(IBV_EVENT_QP_FATAL) CONST(IBV_EVENT_QP_REQ_ERR) CONST(IBV_EVENT_QP_ACCESS_ERR)
	CONST(IBV_EVENT_COMM_EST) CONST(IBV_EVENT_SQ_DRAINED) CONST(IBV_EVENT_PATH_MIG) CONST(IBV_EVENT_PATH_MIG_ERR)
	CONST(IBV_EVENT_DEVICE_FATAL) CONST(IBV_EVENT_PORT_ACTIVE) CONST(IBV_EVENT_PORT_ERR) CONST(IBV_EVENT_LID_CHANGE)
	CONST(IBV_EVENT_PKEY_CHANGE) CONST(IBV_EVENT_SM_CHANGE) CONST(IBV_EVENT_SRQ_ERR)
	CONST(IBV_EVENT_SRQ_LIMIT_REACHED) CONST(IBV_EVENT_QP_LAST_WQE_REACHED) CONST(IBV_EVENT_CLIENT_REREGISTER)
	CONST(IBV_EVENT_GID_CHANGE) CONST(IBV_EVENT_WQ_FATAL)

	CONST(IBV_ATOMIC_NONE) CONST(IBV_ATOMIC_HCA) CONST(IBV_ATOMIC_GLOB)
	CONST(IBV_MW_TYPE_1) CONST(IBV_MW_TYPE_2)
	CONST(IBV_MIG_MIGRATED) CONST(IBV_MIG_REARM) CONST(IBV_MIG_ARMED)

	CONST(IBV_QP_STATE) CONST(IBV_QP_CUR_STATE) CONST(IBV_QP_EN_SQD_ASYNC_NOTIFY) CONST(IBV_QP_ACCESS_FLAGS)
	CONST(IBV_QP_PKEY_INDEX) CONST(IBV_QP_PORT) CONST(IBV_QP_QKEY) CONST(IBV_QP_AV) CONST(IBV_QP_PATH_MTU)
	CONST(IBV_QP_TIMEOUT) CONST(IBV_QP_RETRY_CNT) CONST(IBV_QP_RNR_RETRY) CONST(IBV_QP_RQ_PSN)
	CONST(IBV_QP_MAX_QP_RD_ATOMIC) CONST(IBV_QP_ALT_PATH) CONST(IBV_QP_MIN_RNR_TIMER) CONST(IBV_QP_SQ_PSN)
	CONST(IBV_QP_MAX_DEST_RD_ATOMIC) CONST(IBV_QP_PATH_MIG_STATE) CONST(IBV_QP_CAP) CONST(IBV_QP_DEST_QPN)
	CONST(IBV_QP_RATE_LIMIT)

	CONST(IBV_SRQ_MAX_WR) CONST(IBV_SRQ_LIMIT)

	CONST(IBV_ACCESS_LOCAL_WRITE) CONST(IBV_ACCESS_REMOTE_WRITE) CONST(IBV_ACCESS_REMOTE_READ)
	CONST(IBV_ACCESS_REMOTE_ATOMIC) CONST(IBV_ACCESS_MW_BIND) CONST(IBV_ACCESS_ZERO_BASED)
	CONST(IBV_ACCESS_ON_DEMAND) CONST(IBV_ACCESS_HUGETLB) CONST(IBV_ACCESS_RELAXED_ORDERING)
	return 0;
}
