//! Shared receive queues (`struct ibv_srq`).

use alloc::sync::Arc;
use core::mem::{ManuallyDrop, MaybeUninit};
use core::ptr::NonNull;

use crate::error::{site, Error};
use crate::sys;

use super::pd::RawPd;
use super::ret::{check_ptr, check_rc, link, refused, PostFailed};

/// A shared receive queue, holding its PD alive.
pub struct RawSrq {
    ptr: NonNull<sys::ibv_srq>,
    /// Dropped only after a successful destroy; leaked otherwise.
    pd: ManuallyDrop<Arc<RawPd>>,
}

// SAFETY: verbs on an SRQ may be called from any thread; the pointer is
// only passed to verbs.
unsafe impl Send for RawSrq {}
// SAFETY: as above.
unsafe impl Sync for RawSrq {}

impl RawSrq {
    /// `ibv_create_srq` for `max_wr` receives of `max_sge` entries; returns
    /// the SRQ and the granted `(max_wr, max_sge)`.
    pub(crate) fn create(
        pd: &Arc<RawPd>,
        max_wr: u32,
        max_sge: u32,
    ) -> Result<(RawSrq, u32, u32), Error> {
        let mut init = sys::ibv_srq_init_attr {
            srq_context: core::ptr::null_mut(),
            attr: sys::ibv_srq_attr {
                max_wr,
                max_sge,
                srq_limit: 0,
            },
        };
        // SAFETY: live PD; `init` fully initialized.
        let ptr = check_ptr(
            site!(
                "ibv_create_srq",
                "",
                "`ibv_devinfo -v` shows max_srq_wr and max_srq_sge"
            ),
            unsafe { sys::ibv_create_srq(pd.as_ptr(), &mut init) },
        )?;
        let srq = RawSrq {
            ptr,
            pd: ManuallyDrop::new(pd.clone()),
        };
        Ok((srq, init.attr.max_wr, init.attr.max_sge))
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_srq {
        self.ptr.as_ptr()
    }

    /// Posts `wrs` as one chain.
    ///
    /// # Safety
    ///
    /// As [`super::qp::RawQp::post_recv`]: every entry names registered memory
    /// that only the device touches until the receive completes.
    #[inline(always)]
    pub(crate) unsafe fn post_recv(&self, wrs: &mut [sys::ibv_recv_wr]) -> Result<(), PostFailed> {
        link(wrs, |w, next| w.next = next);
        let first = wrs.as_mut_ptr();
        let mut bad = MaybeUninit::<*mut sys::ibv_recv_wr>::uninit();
        // SAFETY: live SRQ; linked chain; the caller upholds the contract.
        let rc =
            unsafe { sys::verbs_shim_post_srq_recv(self.ptr.as_ptr(), first, bad.as_mut_ptr()) };
        if rc == 0 {
            return Ok(());
        }
        // SAFETY: on failure the provider wrote `bad` (NULL or an element).
        Err(refused(
            site!("ibv_post_srq_recv"),
            rc,
            first,
            unsafe { bad.assume_init() },
            wrs.len(),
        ))
    }

    /// Arms the limit event: when fewer than `limit` receives remain, the
    /// device raises `SRQ_LIMIT_REACHED` once.
    pub(crate) fn arm_limit(&self, limit: u32) -> Result<(), Error> {
        let mut attr = sys::ibv_srq_attr {
            max_wr: 0,
            max_sge: 0,
            srq_limit: limit,
        };
        // SAFETY: live SRQ; only srq_limit is read (mask LIMIT).
        check_rc(site!("ibv_modify_srq(LIMIT)"), unsafe {
            sys::ibv_modify_srq(
                self.ptr.as_ptr(),
                &mut attr,
                sys::ibv_srq_attr_mask::LIMIT.0 as i32,
            )
        })
    }

    /// Destroys the SRQ; on failure it is leaked (counted), and the caller
    /// forgets the buffers posted to it.
    pub(crate) fn destroy(mut self) -> Result<(), Error> {
        let result = self.destroy_in_place();
        core::mem::forget(self);
        result
    }

    /// Called exactly once per handle: by `destroy` or by `Drop`.
    fn destroy_in_place(&mut self) -> Result<(), Error> {
        // SAFETY: live SRQ, destroyed once.
        let rc = unsafe { sys::ibv_destroy_srq(self.ptr.as_ptr()) };
        if let Err(e) = check_rc(site!("ibv_destroy_srq"), rc) {
            super::leak::count_leak();
            return Err(e);
        }
        // SAFETY: dropped once, after the SRQ is gone.
        unsafe { ManuallyDrop::drop(&mut self.pd) };
        Ok(())
    }
}

impl Drop for RawSrq {
    fn drop(&mut self) {
        let _ = self.destroy_in_place();
    }
}
