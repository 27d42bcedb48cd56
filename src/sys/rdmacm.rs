//! librdmacm, hand-mirrored from `rdma/rdma_cma.h` (cargo feature `rdmacm`).
//!
//! `struct rdma_cm_id` stays opaque (its route and address unions are large
//! and the crate needs two fields, read through shim accessors);
//! `rdma_cm_event`, `rdma_conn_param`, `rdma_ud_param` and
//! `rdma_event_channel` are mirrored and checked by `tests/layout.rs`.
// Fields carry their C names; documenting each again would be noise.
#![allow(missing_docs)]

use core::ffi::{c_char, c_int, c_void};
use core::marker::{PhantomData, PhantomPinned};

use super::funcs::{extern_c, FfiItem};
use super::types::*;

/// `struct rdma_cm_id` (opaque: read through `verbs_shim_cm_id_*`).
#[repr(C)]
pub struct rdma_cm_id {
    _opaque: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}

/// `struct rdma_event_channel { int fd; }`
#[repr(C)]
#[derive(Debug)]
pub struct rdma_event_channel {
    pub fd: c_int,
}

/// `struct rdma_conn_param`
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct rdma_conn_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: u8,
    pub qp_num: u32,
}

/// `struct rdma_ud_param`
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct rdma_ud_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub ah_attr: ibv_ah_attr,
    pub qp_num: u32,
    pub qkey: u32,
}

/// `union { struct rdma_conn_param conn; struct rdma_ud_param ud; } param`
#[repr(C)]
#[derive(Clone, Copy)]
pub union rdma_cm_event_param {
    pub conn: rdma_conn_param,
    pub ud: rdma_ud_param,
}

/// `struct rdma_cm_event`
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_cm_event {
    pub id: *mut rdma_cm_id,
    pub listen_id: *mut rdma_cm_id,
    pub event: rdma_cm_event_type,
    pub status: c_int,
    pub param: rdma_cm_event_param,
}

c_enum! {
    /// `enum rdma_cm_event_type`
    pub struct rdma_cm_event_type(u32), prefix "RDMA_CM_EVENT_" {
        ADDR_RESOLVED = 0,
        ADDR_ERROR = 1,
        ROUTE_RESOLVED = 2,
        ROUTE_ERROR = 3,
        CONNECT_REQUEST = 4,
        CONNECT_RESPONSE = 5,
        CONNECT_ERROR = 6,
        UNREACHABLE = 7,
        REJECTED = 8,
        ESTABLISHED = 9,
        DISCONNECTED = 10,
        DEVICE_REMOVAL = 11,
        MULTICAST_JOIN = 12,
        MULTICAST_ERROR = 13,
        ADDR_CHANGE = 14,
        TIMEWAIT_EXIT = 15,
    }
}

c_enum! {
    /// `enum rdma_port_space`
    pub struct rdma_port_space(u32), prefix "RDMA_" {
        PS_IPOIB = 0x0002,
        PS_TCP = 0x0106,
        PS_UDP = 0x0111,
        PS_IB = 0x013F,
    }
}

extern_c! {
    const FFI_SURFACE_RDMACM;

    "shim" "struct ibv_context *verbs_shim_cm_id_verbs(struct rdma_cm_id *id)"
    /// `id->verbs`: the device context librdmacm opened for the id.
    pub fn verbs_shim_cm_id_verbs(id: *mut rdma_cm_id) -> *mut ibv_context;
    "shim" "struct ibv_qp *verbs_shim_cm_id_qp(struct rdma_cm_id *id)"
    /// `id->qp`: the QP `rdma_create_qp` created.
    pub fn verbs_shim_cm_id_qp(id: *mut rdma_cm_id) -> *mut ibv_qp;
    "shim" "uint8_t verbs_shim_cm_id_port(struct rdma_cm_id *id)"
    /// `id->port_num`.
    pub fn verbs_shim_cm_id_port(id: *mut rdma_cm_id) -> u8;
    "shim" "void verbs_shim_cm_id_set_qp(struct rdma_cm_id *id, struct ibv_qp *qp)"
    /// `id->qp = qp`: NULL before the crate destroys the QP itself with
    /// `ibv_destroy_qp` (whose failure, unlike `rdma_destroy_qp`'s, is
    /// seen), the QP again if that destroy failed.
    pub fn verbs_shim_cm_id_set_qp(id: *mut rdma_cm_id, qp: *mut ibv_qp);

    "librdmacm" "struct rdma_event_channel *rdma_create_event_channel(void)"
    pub fn rdma_create_event_channel() -> *mut rdma_event_channel;
    "librdmacm" "void rdma_destroy_event_channel(struct rdma_event_channel *channel)"
    pub fn rdma_destroy_event_channel(channel: *mut rdma_event_channel);
    "librdmacm" "int rdma_create_id(struct rdma_event_channel *channel, struct rdma_cm_id **id, void *context, enum rdma_port_space ps)"
    pub fn rdma_create_id(channel: *mut rdma_event_channel, id: *mut *mut rdma_cm_id, context: *mut c_void, ps: rdma_port_space) -> c_int;
    "librdmacm" "int rdma_destroy_id(struct rdma_cm_id *id)"
    pub fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int;
    "librdmacm" "int rdma_bind_addr(struct rdma_cm_id *id, struct sockaddr *addr)"
    pub fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut libc::sockaddr) -> c_int;
    "librdmacm" "int rdma_resolve_addr(struct rdma_cm_id *id, struct sockaddr *src_addr, struct sockaddr *dst_addr, int timeout_ms)"
    pub fn rdma_resolve_addr(id: *mut rdma_cm_id, src_addr: *mut libc::sockaddr, dst_addr: *mut libc::sockaddr, timeout_ms: c_int) -> c_int;
    "librdmacm" "int rdma_resolve_route(struct rdma_cm_id *id, int timeout_ms)"
    pub fn rdma_resolve_route(id: *mut rdma_cm_id, timeout_ms: c_int) -> c_int;
    "librdmacm" "int rdma_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *qp_init_attr)"
    /// Creates the id's QP and moves it to INIT; connect/accept take it to RTS.
    pub fn rdma_create_qp(id: *mut rdma_cm_id, pd: *mut ibv_pd, qp_init_attr: *mut ibv_qp_init_attr) -> c_int;
    "librdmacm" "int rdma_connect(struct rdma_cm_id *id, struct rdma_conn_param *conn_param)"
    pub fn rdma_connect(id: *mut rdma_cm_id, conn_param: *mut rdma_conn_param) -> c_int;
    "librdmacm" "int rdma_listen(struct rdma_cm_id *id, int backlog)"
    pub fn rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int;
    "librdmacm" "int rdma_accept(struct rdma_cm_id *id, struct rdma_conn_param *conn_param)"
    pub fn rdma_accept(id: *mut rdma_cm_id, conn_param: *mut rdma_conn_param) -> c_int;
    "librdmacm" "int rdma_reject(struct rdma_cm_id *id, const void *private_data, uint8_t private_data_len)"
    pub fn rdma_reject(id: *mut rdma_cm_id, private_data: *const c_void, private_data_len: u8) -> c_int;
    "librdmacm" "int rdma_disconnect(struct rdma_cm_id *id)"
    pub fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int;
    "librdmacm" "int rdma_migrate_id(struct rdma_cm_id *id, struct rdma_event_channel *channel)"
    pub fn rdma_migrate_id(id: *mut rdma_cm_id, channel: *mut rdma_event_channel) -> c_int;
    "librdmacm" "int rdma_get_cm_event(struct rdma_event_channel *channel, struct rdma_cm_event **event)"
    /// Returns 0, or -1 with `errno` (EAGAIN on a non-blocking channel).
    pub fn rdma_get_cm_event(channel: *mut rdma_event_channel, event: *mut *mut rdma_cm_event) -> c_int;
    "librdmacm" "int rdma_ack_cm_event(struct rdma_cm_event *event)"
    pub fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int;
    "librdmacm" "struct ibv_context **rdma_get_devices(int *num_devices)"
    /// The device contexts librdmacm opened (NULL-terminated); each stays
    /// open at least until the list is freed.
    pub fn rdma_get_devices(num_devices: *mut c_int) -> *mut *mut ibv_context;
    "librdmacm" "void rdma_free_devices(struct ibv_context **list)"
    pub fn rdma_free_devices(list: *mut *mut ibv_context);
    "librdmacm" "const char *rdma_event_str(enum rdma_cm_event_type event)"
    pub fn rdma_event_str(event: rdma_cm_event_type) -> *const c_char;
}
