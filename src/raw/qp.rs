//! Queue pairs (`struct ibv_qp`): create, modify, query, post, destroy.

use alloc::sync::Arc;
use core::mem::{ManuallyDrop, MaybeUninit};
use core::ptr::NonNull;

use crate::error::{site, Error};
use crate::sys::{self, Zeroed};

use super::cq::RawCq;
use super::pd::RawPd;
use super::ret::{check_ptr, check_rc, link, refused, PostFailed};
use super::srq::RawSrq;

/// Who destroys a queue pair besides `ibv_destroy_qp`: nobody, or the
/// connection manager's id, which must outlive the QP and forget it before
/// it is destroyed (so librdmacm never touches a freed QP).
pub(crate) enum QpOwner {
    /// Created with `ibv_create_qp`.
    Verbs,
    /// Created with `rdma_create_qp` on this id.
    #[cfg(feature = "rdmacm")]
    Cm(Arc<super::cm::RawCmId>),
}

/// A queue pair, holding its PD, CQs and (if any) SRQ alive.
pub struct RawQp {
    ptr: NonNull<sys::ibv_qp>,
    /// Dropped only after a successful destroy; leaked with the QP otherwise.
    keep: ManuallyDrop<Keep>,
}

/// What a queue pair needs alive until it is destroyed.
struct Keep {
    #[cfg_attr(not(feature = "rdmacm"), allow(dead_code))] // held: the id outlives its QP
    owner: QpOwner,
    _pd: Arc<RawPd>,
    _send_cq: Arc<RawCq>,
    _recv_cq: Arc<RawCq>,
    _srq: Option<Arc<RawSrq>>,
}

// SAFETY: verbs on a QP may be called from any thread (the provider locks
// its queues); the pointer is only passed to verbs.
unsafe impl Send for RawQp {}
// SAFETY: as above.
unsafe impl Sync for RawQp {}

/// What a queue pair is created from.
pub(crate) struct QpParts<'a> {
    pub(crate) pd: &'a Arc<RawPd>,
    pub(crate) send_cq: &'a Arc<RawCq>,
    pub(crate) recv_cq: &'a Arc<RawCq>,
    pub(crate) srq: Option<&'a Arc<RawSrq>>,
    pub(crate) qp_type: sys::ibv_qp_type,
    pub(crate) cap: sys::ibv_qp_cap,
}

impl QpParts<'_> {
    /// The init attributes these parts describe.
    pub(crate) fn init_attr(&self) -> sys::ibv_qp_init_attr {
        let mut init = sys::ibv_qp_init_attr::zeroed();
        init.send_cq = self.send_cq.as_ptr();
        init.recv_cq = self.recv_cq.as_ptr();
        init.srq = self.srq.map_or(core::ptr::null_mut(), |s| s.as_ptr());
        init.qp_type = self.qp_type;
        init.cap = self.cap;
        init
    }

    /// The handle of a QP created from these parts (`ptr` live, owned).
    pub(crate) fn handle(&self, ptr: NonNull<sys::ibv_qp>, owner: QpOwner) -> RawQp {
        RawQp {
            ptr,
            keep: ManuallyDrop::new(Keep {
                owner,
                _pd: self.pd.clone(),
                _send_cq: self.send_cq.clone(),
                _recv_cq: self.recv_cq.clone(),
                _srq: self.srq.cloned(),
            }),
        }
    }
}

impl RawQp {
    /// `ibv_create_qp`; returns the QP and what the device granted.
    pub(crate) fn create(parts: &QpParts<'_>) -> Result<(RawQp, sys::ibv_qp_cap), Error> {
        let mut init = parts.init_attr();
        // SAFETY: live PD; `init` is fully initialized and names live CQs
        // (and SRQ) that the handle keeps alive.
        let ptr = check_ptr(site!("ibv_create_qp"), unsafe {
            sys::ibv_create_qp(parts.pd.as_ptr(), &mut init)
        })?;
        Ok((parts.handle(ptr, QpOwner::Verbs), init.cap))
    }

    /// `rdma_create_qp` on `id` (which also moves it to INIT); the QP keeps
    /// the id alive and is destroyed the way librdmacm expects.
    #[cfg(feature = "rdmacm")]
    pub(crate) fn create_on(
        id: &Arc<super::cm::RawCmId>,
        parts: &QpParts<'_>,
    ) -> Result<(RawQp, sys::ibv_qp_cap), Error> {
        use crate::sys::rdmacm as cm;
        let mut init = parts.init_attr();
        // Some of its failure paths (a provider's) set no errno: one left
        // over from an earlier call must not be reported as the reason.
        super::ret::clear_errno();
        // SAFETY: live id and PD; `init` names live CQs the QP keeps alive.
        let rc = unsafe { cm::rdma_create_qp(id.as_ptr(), parts.pd.as_ptr(), &mut init) };
        if rc != 0 && super::ret::errno() == 0 {
            return Err(Error::os(
                site!(
                    "rdma_create_qp",
                    "failed without saying why (no errno: the provider's own check)"
                ),
                libc::EIO,
            ));
        }
        check_rc(site!("rdma_create_qp"), rc)?;
        // SAFETY: rdma_create_qp succeeded, so id->qp is the new QP.
        let ptr = check_ptr(site!("rdma_create_qp"), unsafe {
            cm::verbs_shim_cm_id_qp(id.as_ptr())
        })?;
        Ok((parts.handle(ptr, QpOwner::Cm(id.clone())), init.cap))
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_qp {
        self.ptr.as_ptr()
    }

    /// The queue pair number.
    pub(crate) fn qp_num(&self) -> u32 {
        // SAFETY: live QP; qp_num is set at creation and never changes.
        unsafe { self.ptr.as_ref().qp_num }
    }

    /// `ibv_modify_qp`.
    pub(crate) fn modify(
        &self,
        site: &'static crate::error::Site,
        attr: &mut sys::ibv_qp_attr,
        mask: sys::ibv_qp_attr_mask,
    ) -> Result<(), Error> {
        // SAFETY: live QP; `attr` is initialized for every bit of `mask`.
        check_rc(site, unsafe {
            sys::ibv_modify_qp(self.ptr.as_ptr(), attr, mask.0 as i32)
        })
    }

    /// `ibv_query_qp`: the attributes `mask` asks for.
    pub(crate) fn query(&self, mask: sys::ibv_qp_attr_mask) -> Result<sys::ibv_qp_attr, Error> {
        let mut attr = sys::ibv_qp_attr::zeroed();
        let mut init = sys::ibv_qp_init_attr::zeroed();
        // SAFETY: live QP; valid out-pointers.
        check_rc(site!("ibv_query_qp"), unsafe {
            sys::ibv_query_qp(self.ptr.as_ptr(), &mut attr, mask.0 as i32, &mut init)
        })?;
        Ok(attr)
    }

    /// Posts `wrs` as one chain (one doorbell), linked here.
    ///
    /// # Safety
    ///
    /// Each request's `sg_list` points at `num_sge` valid entries for the
    /// call. Each entry names memory registered in this QP's protection
    /// domain (or, for an inline request, readable memory) that stays valid,
    /// and that nothing but the device reads or writes, until the request's
    /// completion (or that of a later signaled request on this queue) has
    /// been polled. A bind request names a live window and region that stay
    /// alive until its completion.
    #[inline(always)]
    pub(crate) unsafe fn post_send(&self, wrs: &mut [sys::ibv_send_wr]) -> Result<(), PostFailed> {
        link(wrs, |w, next| w.next = next);
        let first = wrs.as_mut_ptr();
        // Written by the provider only on failure.
        let mut bad = MaybeUninit::<*mut sys::ibv_send_wr>::uninit();
        // SAFETY: live QP; the chain is linked within `wrs`; the caller
        // upholds the memory contract above.
        let rc = unsafe { sys::verbs_shim_post_send(self.ptr.as_ptr(), first, bad.as_mut_ptr()) };
        if rc == 0 {
            return Ok(());
        }
        // SAFETY: on failure the provider wrote `bad` (NULL or an element).
        Err(refused(
            site!("ibv_post_send"),
            rc,
            first,
            unsafe { bad.assume_init() },
            wrs.len(),
        ))
    }

    /// Posts `wrs` to the receive queue as one chain.
    ///
    /// # Safety
    ///
    /// As [`RawQp::post_send`]: every entry names registered memory that
    /// only the device touches until the receive completes.
    #[inline(always)]
    pub(crate) unsafe fn post_recv(&self, wrs: &mut [sys::ibv_recv_wr]) -> Result<(), PostFailed> {
        link(wrs, |w, next| w.next = next);
        let first = wrs.as_mut_ptr();
        let mut bad = MaybeUninit::<*mut sys::ibv_recv_wr>::uninit();
        // SAFETY: live QP; linked chain; the caller upholds the contract.
        let rc = unsafe { sys::verbs_shim_post_recv(self.ptr.as_ptr(), first, bad.as_mut_ptr()) };
        if rc == 0 {
            return Ok(());
        }
        // SAFETY: on failure the provider wrote `bad`.
        Err(refused(
            site!("ibv_post_recv"),
            rc,
            first,
            unsafe { bad.assume_init() },
            wrs.len(),
        ))
    }

    /// Destroys the queue pair. On failure it is leaked (counted), and so
    /// must be everything it may still reach: the caller forgets the
    /// buffers posted to it.
    pub(crate) fn destroy(mut self) -> Result<(), Error> {
        let result = self.destroy_in_place();
        // Destroyed, or leaked on purpose: either way `Drop` must not run.
        core::mem::forget(self);
        result
    }

    /// The connection manager's id this QP was made on, if any.
    #[cfg(feature = "rdmacm")]
    pub(crate) fn cm_id(&self) -> Option<&Arc<super::cm::RawCmId>> {
        match &self.keep.owner {
            QpOwner::Cm(id) => Some(id),
            QpOwner::Verbs => None,
        }
    }

    /// `ibv_destroy_qp`, then (only on success) the release of what it kept
    /// alive. Called exactly once per handle: by `destroy` or by `Drop`.
    /// An rdma_cm id forgets its QP before the destroy and gets it back if
    /// the destroy fails, so the id never points at a freed QP.
    fn destroy_in_place(&mut self) -> Result<(), Error> {
        #[cfg(feature = "rdmacm")]
        if let QpOwner::Cm(id) = &self.keep.owner {
            // SAFETY: NULL is always a valid id->qp.
            unsafe { id.set_qp(core::ptr::null_mut()) };
        }
        // SAFETY: live QP; this runs once per handle (see above).
        let rc = unsafe { sys::ibv_destroy_qp(self.ptr.as_ptr()) };
        if let Err(e) = check_rc(site!("ibv_destroy_qp"), rc) {
            #[cfg(feature = "rdmacm")]
            if let QpOwner::Cm(id) = &self.keep.owner {
                // SAFETY: the QP made on this id, alive (leaked) after the
                // failed destroy.
                unsafe { id.set_qp(self.ptr.as_ptr()) };
            }
            super::leak::count_leak();
            return Err(e);
        }
        // SAFETY: dropped once, here, after the QP is gone.
        unsafe { ManuallyDrop::drop(&mut self.keep) };
        Ok(())
    }
}

impl Drop for RawQp {
    fn drop(&mut self) {
        // Owners with posted buffers call `destroy` and handle its failure;
        // this is the path of a QP that holds nothing.
        let _ = self.destroy_in_place();
    }
}
