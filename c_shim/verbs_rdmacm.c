/* Accessors for struct rdma_cm_id (kept opaque on the Rust side) and the
 * compiler's check of every librdmacm prototype the crate declares. */
#include "verbs_rdmacm.h"

struct ibv_context *verbs_shim_cm_id_verbs(struct rdma_cm_id *id) { return id->verbs; }
struct ibv_qp *verbs_shim_cm_id_qp(struct rdma_cm_id *id) { return id->qp; }
uint8_t verbs_shim_cm_id_port(struct rdma_cm_id *id) { return id->port_num; }
/* rdma_destroy_qp ignores ibv_destroy_qp's result; the crate destroys the QP
 * itself: the id forgets it first (so id->qp never names a freed QP), and
 * gets it back if the destroy fails (the QP is then leaked, and alive). */
void verbs_shim_cm_id_set_qp(struct rdma_cm_id *id, struct ibv_qp *qp) { id->qp = qp; }

#define VERBS_CHECK(name) static verbs_direct_##name##_t verbs_check_##name __attribute__((unused)) = name
VERBS_CHECK(rdma_create_event_channel);
VERBS_CHECK(rdma_destroy_event_channel);
VERBS_CHECK(rdma_create_id);
VERBS_CHECK(rdma_destroy_id);
VERBS_CHECK(rdma_bind_addr);
VERBS_CHECK(rdma_resolve_addr);
VERBS_CHECK(rdma_resolve_route);
VERBS_CHECK(rdma_create_qp);
VERBS_CHECK(rdma_connect);
VERBS_CHECK(rdma_listen);
VERBS_CHECK(rdma_accept);
VERBS_CHECK(rdma_reject);
VERBS_CHECK(rdma_disconnect);
VERBS_CHECK(rdma_migrate_id);
VERBS_CHECK(rdma_get_cm_event);
VERBS_CHECK(rdma_ack_cm_event);
VERBS_CHECK(rdma_get_devices);
VERBS_CHECK(rdma_free_devices);
VERBS_CHECK(rdma_event_str);
