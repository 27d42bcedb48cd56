/* The whole C surface of the `verbs` crate, on one screen.
 *
 * Part 1: verbs.h offers these only as `static inline` functions or macros,
 * so there is no symbol to link; verbs_shim.c turns each into a real one.
 * Part 2: the libibverbs exports the crate calls directly, each with the
 * exact prototype the Rust side declares. VERBS_DIRECT makes the compiler
 * assign the library's function to a pointer of that type, so a prototype
 * drift is a build error of the shim, not silent ABI breakage.
 * tests/ffi_surface.rs checks that both parts and src/sys/funcs.rs agree. */
#ifndef VERBS_SHIM_H
#define VERBS_SHIM_H
#include <infiniband/verbs.h>

/* Part 1: shim symbols (one-line wrappers in verbs_shim.c). */
int verbs_shim_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr);
int verbs_shim_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);
int verbs_shim_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);
int verbs_shim_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc);
int verbs_shim_req_notify_cq(struct ibv_cq *cq, int solicited_only);
int verbs_shim_query_port(struct ibv_context *context, uint8_t port_num, struct ibv_port_attr *port_attr);
struct ibv_mr *verbs_shim_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access);
int verbs_shim_query_gid_ex(struct ibv_context *context, uint32_t port_num, uint32_t gid_index, struct ibv_gid_entry *entry, uint32_t flags);
ssize_t verbs_shim_query_gid_table(struct ibv_context *context, struct ibv_gid_entry *entries, size_t max_entries, uint32_t flags);
struct ibv_mw *verbs_shim_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type);
int verbs_shim_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mw_bind *mw_bind);
int verbs_shim_dealloc_mw(struct ibv_mw *mw);
int verbs_shim_context_async_fd(struct ibv_context *context);
struct ibv_device *verbs_shim_context_device(struct ibv_context *context);

/* Part 2: libibverbs exports called directly. */
#define VERBS_DIRECT(ret, name, args) typedef ret (*verbs_direct_##name##_t) args
VERBS_DIRECT(struct ibv_device **, ibv_get_device_list, (int *num_devices));
VERBS_DIRECT(void, ibv_free_device_list, (struct ibv_device **list));
VERBS_DIRECT(const char *, ibv_get_device_name, (struct ibv_device *device));
VERBS_DIRECT(__be64, ibv_get_device_guid, (struct ibv_device *device));
VERBS_DIRECT(struct ibv_context *, ibv_open_device, (struct ibv_device *device));
VERBS_DIRECT(int, ibv_close_device, (struct ibv_context *context));
VERBS_DIRECT(int, ibv_query_device, (struct ibv_context *context, struct ibv_device_attr *device_attr));
VERBS_DIRECT(int, ibv_query_gid, (struct ibv_context *context, uint8_t port_num, int index, union ibv_gid *gid));
VERBS_DIRECT(int, ibv_get_async_event, (struct ibv_context *context, struct ibv_async_event *event));
VERBS_DIRECT(void, ibv_ack_async_event, (struct ibv_async_event *event));
VERBS_DIRECT(struct ibv_pd *, ibv_alloc_pd, (struct ibv_context *context));
VERBS_DIRECT(int, ibv_dealloc_pd, (struct ibv_pd *pd));
VERBS_DIRECT(int, ibv_dereg_mr, (struct ibv_mr *mr));
VERBS_DIRECT(struct ibv_mr *, ibv_reg_dmabuf_mr, (struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd, int access));
VERBS_DIRECT(struct ibv_comp_channel *, ibv_create_comp_channel, (struct ibv_context *context));
VERBS_DIRECT(int, ibv_destroy_comp_channel, (struct ibv_comp_channel *channel));
VERBS_DIRECT(struct ibv_cq *, ibv_create_cq, (struct ibv_context *context, int cqe, void *cq_context, struct ibv_comp_channel *channel, int comp_vector));
VERBS_DIRECT(int, ibv_destroy_cq, (struct ibv_cq *cq));
VERBS_DIRECT(int, ibv_get_cq_event, (struct ibv_comp_channel *channel, struct ibv_cq **cq, void **cq_context));
VERBS_DIRECT(void, ibv_ack_cq_events, (struct ibv_cq *cq, unsigned int nevents));
VERBS_DIRECT(struct ibv_qp *, ibv_create_qp, (struct ibv_pd *pd, struct ibv_qp_init_attr *qp_init_attr));
VERBS_DIRECT(int, ibv_modify_qp, (struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask));
VERBS_DIRECT(int, ibv_query_qp, (struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask, struct ibv_qp_init_attr *init_attr));
VERBS_DIRECT(int, ibv_destroy_qp, (struct ibv_qp *qp));
VERBS_DIRECT(struct ibv_srq *, ibv_create_srq, (struct ibv_pd *pd, struct ibv_srq_init_attr *srq_init_attr));
VERBS_DIRECT(int, ibv_modify_srq, (struct ibv_srq *srq, struct ibv_srq_attr *srq_attr, int srq_attr_mask));
VERBS_DIRECT(int, ibv_destroy_srq, (struct ibv_srq *srq));
VERBS_DIRECT(struct ibv_ah *, ibv_create_ah, (struct ibv_pd *pd, struct ibv_ah_attr *attr));
VERBS_DIRECT(int, ibv_destroy_ah, (struct ibv_ah *ah));
VERBS_DIRECT(const char *, ibv_wc_status_str, (enum ibv_wc_status status));
VERBS_DIRECT(const char *, ibv_event_type_str, (enum ibv_event_type event));

#endif
