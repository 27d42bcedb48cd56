//! Every C function the crate can call: libibverbs exports and the shim's
//! symbols for what `verbs.h` only offers inline.
//!
//! Each item is declared once, through `extern_c!`, which both emits the
//! `extern "C"` declaration and records its C prototype in [`FFI_SURFACE`];
//! `cargo run --example ffi_surface` prints that list and
//! `tests/ffi_surface.rs` checks it against `c_shim/verbs_shim.h`, whose
//! prototypes the C compiler checks against libibverbs.
//!
//! Return conventions (converted in one place, the safe layer's `ret`
//! module): post/modify/query/destroy calls return 0 or an errno value;
//! create/alloc/reg/open calls return NULL and set `errno`; poll returns a
//! count or a negative value.

// Each function's doc is its C prototype, added by `extern_c!`.
#![allow(missing_docs)]

use core::ffi::{c_char, c_int, c_uint, c_void};

use super::consts::*;
use super::types::*;
use super::wr_types::*;

/// One C function the crate can call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FfiItem {
    /// The Rust (and link) name.
    pub name: &'static str,
    /// The C prototype as the crate relies on it.
    pub prototype: &'static str,
    /// `"shim"` for a symbol of `c_shim/verbs_shim.c`, `"libibverbs"` for an export.
    pub origin: &'static str,
}

/// Declares extern functions and records each one's C prototype in the
/// `FfiItem` table named first, so the audit list cannot omit one.
macro_rules! extern_c {
    (const $surface:ident; $(
        $origin:literal $proto:literal
        $(#[$meta:meta])*
        pub fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?;
    )*) => {
        extern "C" {$(
            #[doc = concat!("`", $proto, "`")]
            #[doc = ""]
            $(#[$meta])*
            pub fn $name($($arg: $ty),*) $(-> $ret)?;
        )*}

        /// Every C function declared in this module, with its C prototype.
        pub const $surface: &[FfiItem] = &[$(
            FfiItem { name: stringify!($name), prototype: $proto, origin: $origin },
        )*];
    };
}
#[cfg_attr(not(feature = "rdmacm"), allow(unused_imports))]
pub(crate) use extern_c;

extern_c! {
    const FFI_SURFACE;

    // ---- shim: static inlines and macros of verbs.h given a symbol ----
    "shim" "int verbs_shim_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)"
    /// `ibv_post_send`: returns 0 or an errno value; on failure `*bad_wr`
    /// is the first request that was not posted.
    pub fn verbs_shim_post_send(qp: *mut ibv_qp, wr: *mut ibv_send_wr, bad_wr: *mut *mut ibv_send_wr) -> c_int;
    "shim" "int verbs_shim_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)"
    /// `ibv_post_recv`.
    pub fn verbs_shim_post_recv(qp: *mut ibv_qp, wr: *mut ibv_recv_wr, bad_wr: *mut *mut ibv_recv_wr) -> c_int;
    "shim" "int verbs_shim_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)"
    /// `ibv_post_srq_recv`.
    pub fn verbs_shim_post_srq_recv(srq: *mut ibv_srq, wr: *mut ibv_recv_wr, bad_wr: *mut *mut ibv_recv_wr) -> c_int;
    "shim" "int verbs_shim_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc)"
    /// `ibv_poll_cq`: the number of completions written to `wc`, or negative on error.
    pub fn verbs_shim_poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int;
    "shim" "int verbs_shim_req_notify_cq(struct ibv_cq *cq, int solicited_only)"
    /// `ibv_req_notify_cq`.
    pub fn verbs_shim_req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int;
    "shim" "int verbs_shim_query_port(struct ibv_context *context, uint8_t port_num, struct ibv_port_attr *port_attr)"
    /// The `ibv_query_port` macro (extended op: the whole struct is filled).
    pub fn verbs_shim_query_port(context: *mut ibv_context, port_num: u8, port_attr: *mut ibv_port_attr) -> c_int;
    "shim" "struct ibv_mr *verbs_shim_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)"
    /// The `ibv_reg_mr` macro: NULL and `errno` on failure.
    pub fn verbs_shim_reg_mr(pd: *mut ibv_pd, addr: *mut c_void, length: usize, access: c_int) -> *mut ibv_mr;
    "shim" "int verbs_shim_query_gid_ex(struct ibv_context *context, uint32_t port_num, uint32_t gid_index, struct ibv_gid_entry *entry, uint32_t flags)"
    /// `ibv_query_gid_ex`: one GID with its type and netdev.
    pub fn verbs_shim_query_gid_ex(context: *mut ibv_context, port_num: u32, gid_index: u32, entry: *mut ibv_gid_entry, flags: u32) -> c_int;
    "shim" "ssize_t verbs_shim_query_gid_table(struct ibv_context *context, struct ibv_gid_entry *entries, size_t max_entries, uint32_t flags)"
    /// `ibv_query_gid_table`: the number of valid entries written, or a negative errno.
    pub fn verbs_shim_query_gid_table(context: *mut ibv_context, entries: *mut ibv_gid_entry, max_entries: usize, flags: u32) -> isize;
    "shim" "struct ibv_mw *verbs_shim_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type)"
    /// `ibv_alloc_mw`: NULL and `errno` (EOPNOTSUPP when the provider has no windows).
    pub fn verbs_shim_alloc_mw(pd: *mut ibv_pd, type_: ibv_mw_type) -> *mut ibv_mw;
    "shim" "int verbs_shim_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mw_bind *mw_bind)"
    /// `ibv_bind_mw` (type-1 windows only; type 2 binds through a send request).
    pub fn verbs_shim_bind_mw(qp: *mut ibv_qp, mw: *mut ibv_mw, mw_bind: *mut ibv_mw_bind) -> c_int;
    "shim" "int verbs_shim_dealloc_mw(struct ibv_mw *mw)"
    /// `ibv_dealloc_mw`.
    pub fn verbs_shim_dealloc_mw(mw: *mut ibv_mw) -> c_int;
    "shim" "int verbs_shim_context_async_fd(struct ibv_context *context)"
    /// `context->async_fd`, so that `struct ibv_context` stays opaque.
    pub fn verbs_shim_context_async_fd(context: *mut ibv_context) -> c_int;
    "shim" "struct ibv_device *verbs_shim_context_device(struct ibv_context *context)"
    /// `context->device`, for a context the crate did not open itself.
    pub fn verbs_shim_context_device(context: *mut ibv_context) -> *mut ibv_device;

    // ---- libibverbs exports ----
    "libibverbs" "struct ibv_device **ibv_get_device_list(int *num_devices)"
    /// NULL-terminated device array, or NULL and `errno`.
    pub fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device;
    "libibverbs" "void ibv_free_device_list(struct ibv_device **list)"
    pub fn ibv_free_device_list(list: *mut *mut ibv_device);
    "libibverbs" "const char *ibv_get_device_name(struct ibv_device *device)"
    pub fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char;
    "libibverbs" "__be64 ibv_get_device_guid(struct ibv_device *device)"
    pub fn ibv_get_device_guid(device: *mut ibv_device) -> u64;
    "libibverbs" "struct ibv_context *ibv_open_device(struct ibv_device *device)"
    pub fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context;
    "libibverbs" "int ibv_close_device(struct ibv_context *context)"
    pub fn ibv_close_device(context: *mut ibv_context) -> c_int;
    "libibverbs" "int ibv_query_device(struct ibv_context *context, struct ibv_device_attr *device_attr)"
    pub fn ibv_query_device(context: *mut ibv_context, device_attr: *mut ibv_device_attr) -> c_int;
    "libibverbs" "int ibv_query_gid(struct ibv_context *context, uint8_t port_num, int index, union ibv_gid *gid)"
    pub fn ibv_query_gid(context: *mut ibv_context, port_num: u8, index: c_int, gid: *mut ibv_gid) -> c_int;
    "libibverbs" "int ibv_get_async_event(struct ibv_context *context, struct ibv_async_event *event)"
    /// Blocks unless the context's async fd is non-blocking; returns 0 or -1.
    pub fn ibv_get_async_event(context: *mut ibv_context, event: *mut ibv_async_event) -> c_int;
    "libibverbs" "void ibv_ack_async_event(struct ibv_async_event *event)"
    pub fn ibv_ack_async_event(event: *mut ibv_async_event);
    "libibverbs" "struct ibv_pd *ibv_alloc_pd(struct ibv_context *context)"
    pub fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd;
    "libibverbs" "int ibv_dealloc_pd(struct ibv_pd *pd)"
    pub fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int;
    "libibverbs" "int ibv_dereg_mr(struct ibv_mr *mr)"
    pub fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int;
    "libibverbs" "struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd, int access)"
    pub fn ibv_reg_dmabuf_mr(pd: *mut ibv_pd, offset: u64, length: usize, iova: u64, fd: c_int, access: c_int) -> *mut ibv_mr;
    "libibverbs" "struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *context)"
    pub fn ibv_create_comp_channel(context: *mut ibv_context) -> *mut ibv_comp_channel;
    "libibverbs" "int ibv_destroy_comp_channel(struct ibv_comp_channel *channel)"
    pub fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int;
    "libibverbs" "struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context, struct ibv_comp_channel *channel, int comp_vector)"
    pub fn ibv_create_cq(context: *mut ibv_context, cqe: c_int, cq_context: *mut c_void, channel: *mut ibv_comp_channel, comp_vector: c_int) -> *mut ibv_cq;
    "libibverbs" "int ibv_destroy_cq(struct ibv_cq *cq)"
    pub fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int;
    "libibverbs" "int ibv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq, void **cq_context)"
    /// Returns 0 or -1 (with `errno`, EAGAIN on a non-blocking channel).
    pub fn ibv_get_cq_event(channel: *mut ibv_comp_channel, cq: *mut *mut ibv_cq, cq_context: *mut *mut c_void) -> c_int;
    "libibverbs" "void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)"
    pub fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: c_uint);
    "libibverbs" "struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *qp_init_attr)"
    /// On success `qp_init_attr.cap` holds what the device actually granted.
    pub fn ibv_create_qp(pd: *mut ibv_pd, qp_init_attr: *mut ibv_qp_init_attr) -> *mut ibv_qp;
    "libibverbs" "int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask)"
    pub fn ibv_modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, attr_mask: c_int) -> c_int;
    "libibverbs" "int ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask, struct ibv_qp_init_attr *init_attr)"
    pub fn ibv_query_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, attr_mask: c_int, init_attr: *mut ibv_qp_init_attr) -> c_int;
    "libibverbs" "int ibv_destroy_qp(struct ibv_qp *qp)"
    pub fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int;
    "libibverbs" "struct ibv_srq *ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *srq_init_attr)"
    pub fn ibv_create_srq(pd: *mut ibv_pd, srq_init_attr: *mut ibv_srq_init_attr) -> *mut ibv_srq;
    "libibverbs" "int ibv_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *srq_attr, int srq_attr_mask)"
    pub fn ibv_modify_srq(srq: *mut ibv_srq, srq_attr: *mut ibv_srq_attr, srq_attr_mask: c_int) -> c_int;
    "libibverbs" "int ibv_destroy_srq(struct ibv_srq *srq)"
    pub fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int;
    "libibverbs" "struct ibv_ah *ibv_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr)"
    /// An address handle for UD sends: NULL and `errno` on failure (RoCE
    /// needs `is_global = 1` and a populated `grh.sgid_index`).
    pub fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah;
    "libibverbs" "int ibv_destroy_ah(struct ibv_ah *ah)"
    pub fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int;
    "libibverbs" "const char *ibv_wc_status_str(enum ibv_wc_status status)"
    pub fn ibv_wc_status_str(status: ibv_wc_status) -> *const c_char;
    "libibverbs" "const char *ibv_event_type_str(enum ibv_event_type event)"
    pub fn ibv_event_type_str(event: ibv_event_type) -> *const c_char;
}
