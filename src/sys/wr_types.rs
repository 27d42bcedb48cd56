//! `#[repr(C)]` mirrors of the work-request structs of `infiniband/verbs.h`:
//! scatter/gather entries, send and receive work requests, work completions
//! and memory-window binds. Checked like `types` by `tests/layout.rs`.

// Fields carry their C names and meanings; documenting each again would be noise.
#![allow(missing_docs)]

use core::ffi::{c_int, c_void};

use super::consts::*;
use super::newtype::Zeroed;
use super::types::{ibv_ah, ibv_mr, ibv_mw};

/// `struct ibv_sge`
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `struct { uint64_t remote_addr; uint32_t rkey; } rdma` of `ibv_send_wr.wr`
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_send_wr_rdma {
    pub remote_addr: u64,
    pub rkey: u32,
}

/// `struct { uint64_t remote_addr, compare_add, swap; uint32_t rkey; } atomic`
/// of `ibv_send_wr.wr`
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_send_wr_atomic {
    pub remote_addr: u64,
    pub compare_add: u64,
    pub swap: u64,
    pub rkey: u32,
}

/// `struct { struct ibv_ah *ah; uint32_t remote_qpn, remote_qkey; } ud` of `ibv_send_wr.wr`
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_send_wr_ud {
    pub ah: *mut ibv_ah,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
}

/// `union { rdma; atomic; ud; } wr` of `struct ibv_send_wr`
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_wr {
    pub rdma: ibv_send_wr_rdma,
    pub atomic: ibv_send_wr_atomic,
    pub ud: ibv_send_wr_ud,
}

/// `union { struct { uint32_t remote_srqn; } xrc; } qp_type` of `struct ibv_send_wr`
/// (a one-member union: mirrored as that member).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_send_wr_qp_type {
    /// `xrc.remote_srqn`
    pub xrc_remote_srqn: u32,
}

/// `struct { struct ibv_mw *mw; uint32_t rkey; struct ibv_mw_bind_info bind_info; } bind_mw`
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_send_wr_bind_mw {
    pub mw: *mut ibv_mw,
    pub rkey: u32,
    pub bind_info: ibv_mw_bind_info,
}

/// `struct { void *hdr; uint16_t hdr_sz; uint16_t mss; } tso`
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_send_wr_tso {
    pub hdr: *mut c_void,
    pub hdr_sz: u16,
    pub mss: u16,
}

/// The last, anonymous `union { bind_mw; tso; }` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_bind_mw_or_tso {
    pub bind_mw: ibv_send_wr_bind_mw,
    pub tso: ibv_send_wr_tso,
}

/// `struct ibv_send_wr`
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: ibv_wr_opcode,
    /// `unsigned int send_flags`
    pub send_flags: ibv_send_flags,
    /// Anonymous `union { __be32 imm_data; uint32_t invalidate_rkey; }`:
    /// immediate data in network byte order, or the rkey to invalidate.
    pub imm_data: u32,
    pub wr: ibv_send_wr_wr,
    pub qp_type: ibv_send_wr_qp_type,
    /// Anonymous `union { bind_mw; tso; }`.
    pub bind_mw_or_tso: ibv_send_wr_bind_mw_or_tso,
}

/// `struct ibv_recv_wr`
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

/// `struct ibv_wc`
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: ibv_wc_status,
    pub opcode: ibv_wc_opcode,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// Anonymous `union { __be32 imm_data; uint32_t invalidated_rkey; }`.
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    /// `unsigned int wc_flags`
    pub wc_flags: ibv_wc_flags,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// `struct ibv_mw_bind_info`
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_mw_bind_info {
    pub mr: *mut ibv_mr,
    pub addr: u64,
    pub length: u64,
    /// `unsigned int mw_access_flags; /* use ibv_access_flags */`
    pub mw_access_flags: ibv_access_flags,
}

/// `struct ibv_mw_bind`
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_mw_bind {
    pub wr_id: u64,
    /// `unsigned int send_flags`
    pub send_flags: ibv_send_flags,
    pub bind_info: ibv_mw_bind_info,
}

zeroed!(ibv_send_wr, ibv_recv_wr, ibv_mw_bind, ibv_wc);
