//! Building a send work request from its checked description: only data
//! opcodes, whose union members carry no pointer.

use crate::error::{site, Error};
use crate::sys::{self, ibv_send_flags as F, ibv_wr_opcode as O, Zeroed};
use crate::wr::SendOp;

/// What the ring records of a posted send besides its buffers.
#[derive(Clone, Copy)]
pub(crate) struct SendMeta {
    pub(crate) tag: u64,
    pub(crate) opcode: sys::ibv_wc_opcode,
    pub(crate) signaled: bool,
}

/// Flags of a send: the caller's, plus `SIGNALED` as decided.
#[inline(always)]
pub(crate) fn send_flags(signaled: bool, fence: bool, solicited: bool, inline: bool) -> F {
    let mut f = F::EMPTY;
    if signaled {
        f |= F::SIGNALED;
    }
    if fence {
        f |= F::FENCE;
    }
    if solicited {
        f |= F::SOLICITED;
    }
    if inline {
        f |= F::INLINE;
    }
    f
}

/// The work request of `op` with `wr_id` and `flags`, its scatter/gather
/// list not yet attached. Only data opcodes can be built here: no bind,
/// invalidate or TSO, whose union members carry pointers.
#[inline(always)]
pub(crate) fn send_wr(op: &SendOp, wr_id: u64, flags: F) -> sys::ibv_send_wr {
    let mut wr = sys::ibv_send_wr::zeroed();
    wr.wr_id = wr_id;
    wr.send_flags = flags;
    let rdma = |r: &crate::wr::RemoteSlice| sys::ibv_send_wr_wr {
        rdma: sys::ibv_send_wr_rdma {
            remote_addr: r.addr,
            rkey: r.rkey,
        },
    };
    let atomic = |r: &crate::wr::RemoteSlice, compare_add: u64, swap: u64| sys::ibv_send_wr_wr {
        atomic: sys::ibv_send_wr_atomic {
            remote_addr: r.addr,
            compare_add,
            swap,
            rkey: r.rkey,
        },
    };
    match op {
        SendOp::Write(r) => {
            wr.opcode = O::RDMA_WRITE;
            wr.wr = rdma(r);
        }
        SendOp::WriteImm(r, imm) => {
            wr.opcode = O::RDMA_WRITE_WITH_IMM;
            wr.imm_data = imm.to_be();
            wr.wr = rdma(r);
        }
        SendOp::Read(r) => {
            wr.opcode = O::RDMA_READ;
            wr.wr = rdma(r);
        }
        SendOp::Send => wr.opcode = O::SEND,
        SendOp::SendImm(imm) => {
            wr.opcode = O::SEND_WITH_IMM;
            wr.imm_data = imm.to_be();
        }
        SendOp::FetchAdd { remote, add } => {
            wr.opcode = O::ATOMIC_FETCH_AND_ADD;
            wr.wr = atomic(remote, *add, 0);
        }
        SendOp::CompareSwap {
            remote,
            compare,
            swap,
        } => {
            wr.opcode = O::ATOMIC_CMP_AND_SWP;
            wr.wr = atomic(remote, *compare, *swap);
        }
    }
    wr
}

/// An atomic writes its 8-byte result into the local entries: refuse a
/// list that does not hold exactly 8 bytes, so the device never writes past
/// the buffer it was given.
#[inline(always)]
pub(crate) fn check_atomic_result(op: &SendOp, total: u64) -> Result<(), Error> {
    if matches!(op, SendOp::FetchAdd { .. } | SendOp::CompareSwap { .. }) && total != 8 {
        return Err(Error::invalid(site!(
            "post_send(atomic)",
            "the local result buffer must be exactly 8 bytes"
        )));
    }
    Ok(())
}
