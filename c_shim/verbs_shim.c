/* One-line wrappers that give verbs.h's static inlines and macros a symbol.
 * Each calls the header's own inline or macro, so the provider's fast path
 * (context->ops) is used exactly as a C program would use it. */
#include "verbs_shim.h"

int verbs_shim_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr) { return ibv_post_send(qp, wr, bad_wr); }
int verbs_shim_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr) { return ibv_post_recv(qp, wr, bad_wr); }
int verbs_shim_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr) { return ibv_post_srq_recv(srq, wr, bad_wr); }
int verbs_shim_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc) { return ibv_poll_cq(cq, num_entries, wc); }
int verbs_shim_req_notify_cq(struct ibv_cq *cq, int solicited_only) { return ibv_req_notify_cq(cq, solicited_only); }
/* The macro, not the exported compat symbol: the extended op fills the whole struct. */
int verbs_shim_query_port(struct ibv_context *context, uint8_t port_num, struct ibv_port_attr *port_attr) { return ibv_query_port(context, port_num, port_attr); }
/* access is not a compile-time constant here, so the macro takes ibv_reg_mr_iova2, which honours optional flags. */
struct ibv_mr *verbs_shim_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access) { return ibv_reg_mr(pd, addr, length, access); }
int verbs_shim_query_gid_ex(struct ibv_context *context, uint32_t port_num, uint32_t gid_index, struct ibv_gid_entry *entry, uint32_t flags) { return ibv_query_gid_ex(context, port_num, gid_index, entry, flags); }
ssize_t verbs_shim_query_gid_table(struct ibv_context *context, struct ibv_gid_entry *entries, size_t max_entries, uint32_t flags) { return ibv_query_gid_table(context, entries, max_entries, flags); }
struct ibv_mw *verbs_shim_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type) { return ibv_alloc_mw(pd, type); }
int verbs_shim_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mw_bind *mw_bind) { return ibv_bind_mw(qp, mw, mw_bind); }
int verbs_shim_dealloc_mw(struct ibv_mw *mw) { return ibv_dealloc_mw(mw); }
/* Read here so the Rust side can keep struct ibv_context opaque. */
int verbs_shim_context_async_fd(struct ibv_context *context) { return context->async_fd; }
struct ibv_device *verbs_shim_context_device(struct ibv_context *context) { return context->device; }

/* Prototype checks for Part 2 of the header: assigning each export to a
 * pointer of the declared type fails to compile if the prototypes differ
 * (build.rs passes -Werror=incompatible-pointer-types). */
#define VERBS_CHECK(name) static verbs_direct_##name##_t verbs_check_##name __attribute__((unused)) = name
VERBS_CHECK(ibv_get_device_list);
VERBS_CHECK(ibv_free_device_list);
VERBS_CHECK(ibv_get_device_name);
VERBS_CHECK(ibv_get_device_guid);
VERBS_CHECK(ibv_open_device);
VERBS_CHECK(ibv_close_device);
VERBS_CHECK(ibv_query_device);
VERBS_CHECK(ibv_query_gid);
VERBS_CHECK(ibv_get_async_event);
VERBS_CHECK(ibv_ack_async_event);
VERBS_CHECK(ibv_alloc_pd);
VERBS_CHECK(ibv_dealloc_pd);
VERBS_CHECK(ibv_dereg_mr);
VERBS_CHECK(ibv_reg_dmabuf_mr);
VERBS_CHECK(ibv_create_comp_channel);
VERBS_CHECK(ibv_destroy_comp_channel);
VERBS_CHECK(ibv_create_cq);
VERBS_CHECK(ibv_destroy_cq);
VERBS_CHECK(ibv_get_cq_event);
VERBS_CHECK(ibv_ack_cq_events);
VERBS_CHECK(ibv_create_qp);
VERBS_CHECK(ibv_modify_qp);
VERBS_CHECK(ibv_query_qp);
VERBS_CHECK(ibv_destroy_qp);
VERBS_CHECK(ibv_create_srq);
VERBS_CHECK(ibv_modify_srq);
VERBS_CHECK(ibv_destroy_srq);
VERBS_CHECK(ibv_create_ah);
VERBS_CHECK(ibv_destroy_ah);
VERBS_CHECK(ibv_wc_status_str);
VERBS_CHECK(ibv_event_type_str);
