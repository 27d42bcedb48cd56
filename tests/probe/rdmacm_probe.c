/* Layout probe for the librdmacm mirrors (feature `rdmacm`); see verbs_probe.c.
 * struct rdma_cm_id is opaque on the Rust side and not probed. */
#include <stddef.h>
#include <stdio.h>
#include <rdma/rdma_cma.h>

#define STRUCT(T) printf("type %s %zu %zu\n", #T, sizeof(struct T), _Alignof(struct T));
#define FIELD(T, f) printf("field %s %s %zu %zu\n", #T, #f, offsetof(struct T, f), sizeof(((struct T *)0)->f));
#define CONST(k) printf("const %s %lld\n", #k, (long long)(k));

int main(void)
{
	STRUCT(rdma_event_channel) FIELD(rdma_event_channel, fd)

	STRUCT(rdma_conn_param)
	FIELD(rdma_conn_param, private_data) FIELD(rdma_conn_param, private_data_len)
	FIELD(rdma_conn_param, responder_resources) FIELD(rdma_conn_param, initiator_depth)
	FIELD(rdma_conn_param, flow_control) FIELD(rdma_conn_param, retry_count)
	FIELD(rdma_conn_param, rnr_retry_count) FIELD(rdma_conn_param, srq) FIELD(rdma_conn_param, qp_num)

	STRUCT(rdma_ud_param)
	FIELD(rdma_ud_param, private_data) FIELD(rdma_ud_param, private_data_len) FIELD(rdma_ud_param, ah_attr)
	FIELD(rdma_ud_param, qp_num) FIELD(rdma_ud_param, qkey)

	STRUCT(rdma_cm_event)
	FIELD(rdma_cm_event, id) FIELD(rdma_cm_event, listen_id) FIELD(rdma_cm_event, event)
	FIELD(rdma_cm_event, status) FIELD(rdma_cm_event, param) FIELD(rdma_cm_event, param.conn)
	FIELD(rdma_cm_event, param.ud)

	CONST(RDMA_CM_EVENT_ADDR_RESOLVED) CONST(RDMA_CM_EVENT_ADDR_ERROR) CONST(RDMA_CM_EVENT_ROUTE_RESOLVED)
	CONST(RDMA_CM_EVENT_ROUTE_ERROR) CONST(RDMA_CM_EVENT_CONNECT_REQUEST) CONST(RDMA_CM_EVENT_CONNECT_RESPONSE)
	CONST(RDMA_CM_EVENT_CONNECT_ERROR) CONST(RDMA_CM_EVENT_UNREACHABLE) CONST(RDMA_CM_EVENT_REJECTED)
	CONST(RDMA_CM_EVENT_ESTABLISHED) CONST(RDMA_CM_EVENT_DISCONNECTED) CONST(RDMA_CM_EVENT_DEVICE_REMOVAL)
	CONST(RDMA_CM_EVENT_MULTICAST_JOIN) CONST(RDMA_CM_EVENT_MULTICAST_ERROR) CONST(RDMA_CM_EVENT_ADDR_CHANGE)
	CONST(RDMA_CM_EVENT_TIMEWAIT_EXIT)
	CONST(RDMA_PS_IPOIB) CONST(RDMA_PS_TCP) CONST(RDMA_PS_UDP) CONST(RDMA_PS_IB)
	return 0;
}
