//! Protection domains: the security boundary that ties memory regions and
//! queue pairs together.
#![allow(unsafe_code)]

use alloc::sync::Arc;
use core::ptr::NonNull;

use crate::device::Context;
use crate::error::Error;
use crate::ret::{check_ptr, check_rc};
use crate::sys;

pub(crate) struct PdInner {
    pub(crate) ptr: NonNull<sys::ibv_pd>,
    pub(crate) ctx: Context,
}

// SAFETY: verbs on a PD are thread-safe (rdma-core threading model); the
// pointer is only passed to verbs.
unsafe impl Send for PdInner {}
// SAFETY: as above.
unsafe impl Sync for PdInner {}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: every MR, MW and QP of this PD holds an Arc to it, so none
        // is alive; deallocated exactly once.
        unsafe { sys::ibv_dealloc_pd(self.ptr.as_ptr()) };
    }
}

/// A protection domain (`struct ibv_pd`). Memory regions and queue pairs
/// keep it alive; a region is usable only by queue pairs of the same PD.
#[derive(Clone)]
pub struct ProtectionDomain {
    pub(crate) inner: Arc<PdInner>,
}

impl ProtectionDomain {
    /// Allocates a protection domain on `ctx`.
    pub fn new(ctx: &Context) -> Result<ProtectionDomain, Error> {
        // SAFETY: live context.
        let ptr = check_ptr("ibv_alloc_pd", unsafe { sys::ibv_alloc_pd(ctx.as_raw()) })?;
        Ok(ProtectionDomain {
            inner: Arc::new(PdInner {
                ptr,
                ctx: ctx.clone(),
            }),
        })
    }

    /// The context this PD belongs to.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// The raw PD, for calls the safe layer does not wrap.
    pub fn as_raw(&self) -> *mut sys::ibv_pd {
        self.inner.ptr.as_ptr()
    }
}

impl core::fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ProtectionDomain")
            .field("context", &self.inner.ctx)
            .finish()
    }
}

/// Destroys through an errno-returning call, for Drop impls that cannot
/// report: a failure here means a child is still alive, which the `Arc`
/// structure rules out, so it is only checked in debug builds.
pub(crate) fn destroy(call: &'static str, rc: core::ffi::c_int) {
    let r = check_rc(call, rc);
    debug_assert!(r.is_ok(), "{call} failed in drop: {r:?}");
}
