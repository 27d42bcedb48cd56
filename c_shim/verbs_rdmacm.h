/* The librdmacm surface of `verbs` (cargo feature `rdmacm`), on one screen.
 * Same rules as verbs_shim.h: Part 1 are shim symbols (accessors, so that
 * struct rdma_cm_id stays opaque to Rust), Part 2 the librdmacm exports the
 * crate calls, with the exact prototypes the Rust side declares, checked by
 * the compiler in verbs_rdmacm.c. */
#ifndef VERBS_RDMACM_H
#define VERBS_RDMACM_H
#include <rdma/rdma_cma.h>
#include "verbs_shim.h"

/* Part 1: shim symbols. */
struct ibv_context *verbs_shim_cm_id_verbs(struct rdma_cm_id *id);
struct ibv_qp *verbs_shim_cm_id_qp(struct rdma_cm_id *id);
uint8_t verbs_shim_cm_id_port(struct rdma_cm_id *id);
void verbs_shim_cm_id_set_qp(struct rdma_cm_id *id, struct ibv_qp *qp);

/* Part 2: librdmacm exports called directly. */
VERBS_DIRECT(struct rdma_event_channel *, rdma_create_event_channel, (void));
VERBS_DIRECT(void, rdma_destroy_event_channel, (struct rdma_event_channel *channel));
VERBS_DIRECT(int, rdma_create_id, (struct rdma_event_channel *channel, struct rdma_cm_id **id, void *context, enum rdma_port_space ps));
VERBS_DIRECT(int, rdma_destroy_id, (struct rdma_cm_id *id));
VERBS_DIRECT(int, rdma_bind_addr, (struct rdma_cm_id *id, struct sockaddr *addr));
VERBS_DIRECT(int, rdma_resolve_addr, (struct rdma_cm_id *id, struct sockaddr *src_addr, struct sockaddr *dst_addr, int timeout_ms));
VERBS_DIRECT(int, rdma_resolve_route, (struct rdma_cm_id *id, int timeout_ms));
VERBS_DIRECT(int, rdma_create_qp, (struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *qp_init_attr));
VERBS_DIRECT(int, rdma_connect, (struct rdma_cm_id *id, struct rdma_conn_param *conn_param));
VERBS_DIRECT(int, rdma_listen, (struct rdma_cm_id *id, int backlog));
VERBS_DIRECT(int, rdma_accept, (struct rdma_cm_id *id, struct rdma_conn_param *conn_param));
VERBS_DIRECT(int, rdma_reject, (struct rdma_cm_id *id, const void *private_data, uint8_t private_data_len));
VERBS_DIRECT(int, rdma_disconnect, (struct rdma_cm_id *id));
VERBS_DIRECT(int, rdma_migrate_id, (struct rdma_cm_id *id, struct rdma_event_channel *channel));
VERBS_DIRECT(int, rdma_get_cm_event, (struct rdma_event_channel *channel, struct rdma_cm_event **event));
VERBS_DIRECT(int, rdma_ack_cm_event, (struct rdma_cm_event *event));
VERBS_DIRECT(struct ibv_context **, rdma_get_devices, (int *num_devices));
VERBS_DIRECT(void, rdma_free_devices, (struct ibv_context **list));
VERBS_DIRECT(const char *, rdma_event_str, (enum rdma_cm_event_type event));

#endif
