//! Completion queues and the work completions polled from them.
#![allow(unsafe_code)]

use alloc::sync::Arc;
use core::ptr::NonNull;

use crate::device::Context;
use crate::error::{Error, ErrorKind, WcError};
use crate::pd::destroy;
use crate::ret::{check_count, check_ptr};
use crate::sys::{self, Zeroed};

pub use crate::sys::{ibv_wc_opcode as WcOpcode, ibv_wc_status as WcStatus};

pub(crate) struct CqInner {
    pub(crate) ptr: NonNull<sys::ibv_cq>,
    depth: u32,
    _ctx: Context,
}

// SAFETY: ibv_poll_cq and the other CQ verbs are thread-safe in rdma-core
// providers (they lock internally); the pointer is only passed to verbs.
unsafe impl Send for CqInner {}
// SAFETY: as above.
unsafe impl Sync for CqInner {}

impl Drop for CqInner {
    fn drop(&mut self) {
        // SAFETY: every QP using this CQ holds an Arc to it, so none is alive.
        destroy("ibv_destroy_cq", unsafe {
            sys::ibv_destroy_cq(self.ptr.as_ptr())
        });
    }
}

/// A completion queue (`struct ibv_cq`). Queue pairs keep it alive.
#[derive(Clone)]
pub struct CompletionQueue {
    pub(crate) inner: Arc<CqInner>,
}

impl CompletionQueue {
    /// A completion queue with room for at least `depth` completions.
    pub fn new(ctx: &Context, depth: u32) -> Result<CompletionQueue, Error> {
        let cqe = i32::try_from(depth.max(1))
            .map_err(|_| Error::invalid("ibv_create_cq", "depth too large"))?;
        // SAFETY: live context; no channel, no user context.
        let ptr = check_ptr("ibv_create_cq", unsafe {
            sys::ibv_create_cq(
                ctx.as_raw(),
                cqe,
                core::ptr::null_mut(),
                core::ptr::null_mut(),
                0,
            )
        })?;
        // SAFETY: `ptr` is a live CQ; `cqe` is what the provider granted.
        let granted = unsafe { ptr.as_ref().cqe }.max(0) as u32;
        Ok(CompletionQueue {
            inner: Arc::new(CqInner {
                ptr,
                depth: granted,
                _ctx: ctx.clone(),
            }),
        })
    }

    /// The number of completions the queue can hold (as granted).
    pub fn depth(&self) -> u32 {
        self.inner.depth
    }

    /// Polls up to `out.len()` completions into the caller's array and
    /// returns how many were written. Never allocates, never blocks.
    #[inline]
    pub fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize, Error> {
        let n = out.len().min(i32::MAX as usize) as i32;
        // SAFETY: live CQ; `out` is valid for `n` writes of `ibv_wc`
        // (WorkCompletion is a transparent wrapper).
        let got =
            unsafe { sys::verbs_shim_poll_cq(self.inner.ptr.as_ptr(), n, out.as_mut_ptr().cast()) };
        check_count("ibv_poll_cq", got as isize)
    }

    /// The raw CQ, for calls the safe layer does not wrap.
    pub fn as_raw(&self) -> *mut sys::ibv_cq {
        self.inner.ptr.as_ptr()
    }
}

impl core::fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("depth", &self.depth())
            .finish()
    }
}

/// One work completion (`struct ibv_wc`), as polled.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default)]
pub struct WorkCompletion(pub sys::ibv_wc);

impl WorkCompletion {
    /// An empty completion, to fill a polling array.
    pub fn zeroed() -> WorkCompletion {
        WorkCompletion(sys::ibv_wc::zeroed())
    }
    /// The work request's id.
    pub fn wr_id(&self) -> u64 {
        self.0.wr_id
    }
    /// The status.
    pub fn status(&self) -> WcStatus {
        self.0.status
    }
    /// The opcode (not meaningful for error completions).
    pub fn opcode(&self) -> WcOpcode {
        self.0.opcode
    }
    /// Bytes transferred (receives, reads, atomics).
    pub fn byte_len(&self) -> u32 {
        self.0.byte_len
    }
    /// The immediate data, in host order, when the completion carries one.
    pub fn imm(&self) -> Option<u32> {
        self.0
            .wc_flags
            .contains(sys::ibv_wc_flags::WITH_IMM)
            .then(|| u32::from_be(self.0.imm_data))
    }
    /// The local QP number the completion belongs to.
    pub fn qp_num(&self) -> u32 {
        self.0.qp_num
    }
    /// `Ok` for success, otherwise the typed error with its meaning.
    pub fn result(&self) -> Result<(), Error> {
        if self.0.status == WcStatus::SUCCESS {
            return Ok(());
        }
        Err(Error::new(
            "work completion",
            ErrorKind::Completion(WcError {
                status: self.0.status,
                opcode: self.0.opcode,
                wr_id: self.0.wr_id,
                vendor_err: self.0.vendor_err,
            }),
        ))
    }
}
