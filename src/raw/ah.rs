//! Address handles (`struct ibv_ah`): where a UD send goes.

use alloc::sync::Arc;
use core::mem::ManuallyDrop;
use core::ptr::NonNull;

use crate::error::{site, Error};
use crate::sys;

use super::pd::RawPd;
use super::ret::check_ptr;

/// An address handle, holding its PD alive; destroyed on drop (leaked,
/// and counted, if the destroy fails).
pub(crate) struct RawAh {
    ptr: NonNull<sys::ibv_ah>,
    /// Dropped only after a successful destroy; leaked otherwise.
    pd: ManuallyDrop<Arc<RawPd>>,
}

// SAFETY: verbs on an AH may be called from any thread (rdma-core's
// threading model); the pointer is only passed to verbs and put in work
// requests.
unsafe impl Send for RawAh {}
// SAFETY: as above; `&RawAh` gives out only the pointer.
unsafe impl Sync for RawAh {}

impl RawAh {
    /// `ibv_create_ah` in `pd` for `attr`.
    pub(crate) fn create(pd: &Arc<RawPd>, attr: &sys::ibv_ah_attr) -> Result<RawAh, Error> {
        let mut attr = *attr;
        // SAFETY: live PD (the caller's Arc); `attr` is a fully initialized
        // copy on this frame that the call only reads.
        let ptr = check_ptr(
            site!(
                "ibv_create_ah",
                "",
                "RoCE needs is_global = 1 with a populated sgid_index; `ibv_devinfo -v` shows max_ah"
            ),
            unsafe { sys::ibv_create_ah(pd.as_ptr(), &mut attr) },
        )?;
        Ok(RawAh {
            ptr,
            pd: ManuallyDrop::new(pd.clone()),
        })
    }

    /// The C handle, for a UD work request's `wr.ud.ah`.
    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_ah {
        self.ptr.as_ptr()
    }
}

impl Drop for RawAh {
    fn drop(&mut self) {
        // SAFETY: live AH, destroyed once. Its owner (the engine's AH table)
        // drops it only when no posted send names it, and forgets it instead
        // when a queue pair that may still send with it was leaked.
        if unsafe { sys::ibv_destroy_ah(self.ptr.as_ptr()) } != 0 {
            super::leak::count_leak();
            return;
        }
        // SAFETY: dropped once, after the AH is gone.
        unsafe { ManuallyDrop::drop(&mut self.pd) };
    }
}
