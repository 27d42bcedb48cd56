//! Protection domains (`struct ibv_pd`).

use alloc::sync::Arc;
use core::mem::ManuallyDrop;
use core::ptr::NonNull;

use crate::error::{site, Error};
use crate::sys;

use super::device::RawContext;
use super::ret::check_ptr;

/// A protection domain; deallocated on drop.
pub(crate) struct RawPd {
    ptr: NonNull<sys::ibv_pd>,
    /// Dropped only after a successful deallocation; leaked otherwise.
    ctx: ManuallyDrop<Arc<RawContext>>,
}

// SAFETY: verbs on a PD are thread-safe (rdma-core threading model); the
// pointer is only passed to verbs.
unsafe impl Send for RawPd {}
// SAFETY: as above.
unsafe impl Sync for RawPd {}

impl RawPd {
    /// `ibv_alloc_pd`.
    pub(crate) fn alloc(ctx: &Arc<RawContext>) -> Result<RawPd, Error> {
        // SAFETY: live context.
        let ptr = check_ptr(site!("ibv_alloc_pd"), unsafe {
            sys::ibv_alloc_pd(ctx.as_ptr())
        })?;
        Ok(RawPd {
            ptr,
            ctx: ManuallyDrop::new(ctx.clone()),
        })
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_pd {
        self.ptr.as_ptr()
    }
}

impl Drop for RawPd {
    fn drop(&mut self) {
        // SAFETY: every MR, MW, SRQ and QP of this PD holds an Arc to it, so
        // none is alive (a leaked one keeps its Arc); deallocated once.
        if unsafe { sys::ibv_dealloc_pd(self.ptr.as_ptr()) } != 0 {
            super::leak::count_leak();
            return;
        }
        // SAFETY: dropped once, after the PD is gone.
        unsafe { ManuallyDrop::drop(&mut self.ctx) };
    }
}
