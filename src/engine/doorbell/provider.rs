//! The seam between the engine and the device: the trait the engine posts
//! and polls through, and its implementation on the device.

use alloc::sync::Arc;
use core::mem::MaybeUninit;

use crate::error::{site, Error};
use crate::memory::ExposedBuf;
use crate::raw::{PostFailed, RawCq, RawQp, RawSrq};
use crate::sys;

/// Where an engine's work requests go: the device ([`Verbs`]) or, in the
/// crate's own tests, a simulated device that checks the bookkeeping.
pub trait Provider {
    /// A queue pair's handle.
    type Qp;
    /// A completion queue's handle.
    type Cq;
    /// A shared receive queue's handle.
    type Srq;
    /// A memory window with the buffer it is (being) bound to: what a
    /// bind's work request names until the bind completes.
    type Window;

    /// Posts `wrs` as one chain on `qp`'s send queue.
    ///
    /// # Safety
    ///
    /// As `RawQp::post_send`: every scatter/gather entry names memory
    /// that stays valid, and that only the device touches, until the
    /// request completes (or a later signaled one on this queue does).
    unsafe fn post_send(
        &mut self,
        qp: &Self::Qp,
        wrs: &mut [sys::ibv_send_wr],
    ) -> Result<(), PostFailed>;

    /// Posts `wrs` as one chain on `qp`'s receive queue.
    ///
    /// # Safety
    ///
    /// As [`Provider::post_send`], until each receive completes.
    unsafe fn post_recv(
        &mut self,
        qp: &Self::Qp,
        wrs: &mut [sys::ibv_recv_wr],
    ) -> Result<(), PostFailed>;

    /// Posts `wrs` as one chain on the shared receive queue.
    ///
    /// # Safety
    ///
    /// As [`Provider::post_recv`].
    unsafe fn post_srq_recv(
        &mut self,
        srq: &Self::Srq,
        wrs: &mut [sys::ibv_recv_wr],
    ) -> Result<(), PostFailed>;

    /// Takes up to `out.len()` completions off `cq`.
    fn poll<'a>(
        &mut self,
        cq: &Self::Cq,
        out: &'a mut [MaybeUninit<sys::ibv_wc>],
    ) -> Result<&'a [sys::ibv_wc], Error>;

    /// Takes at most one completion off `cq` (a lane's poll).
    #[inline(always)]
    fn poll_one<'a>(
        &mut self,
        cq: &Self::Cq,
        out: &'a mut MaybeUninit<sys::ibv_wc>,
    ) -> Result<Option<&'a sys::ibv_wc>, Error> {
        Ok(self.poll(cq, core::slice::from_mut(out))?.first())
    }

    /// Moves a queue pair to ERR (the device flushes what it holds) or to
    /// RESET (it then holds no work request), the transitions that change
    /// who owns posted buffers.
    fn set_state(&mut self, qp: &Self::Qp, state: sys::ibv_qp_state) -> Result<(), Error>;

    /// Destroys a queue pair; on failure it is leaked and so must be the
    /// buffers posted to it.
    fn destroy_qp(&mut self, qp: Self::Qp) -> Result<(), Error>;

    /// Destroys the shared receive queue; on failure as `destroy_qp`.
    fn destroy_srq(&mut self, srq: Self::Srq) -> Result<(), Error>;
}

/// The device: every call goes to libibverbs through the raw layer.
pub struct Verbs {
    pub(crate) pd: crate::pd::ProtectionDomain,
    /// False where windows do not enforce their bounds (Soft-RoCE).
    pub(crate) windows_bounded: bool,
}

impl Provider for Verbs {
    type Qp = RawQp;
    type Cq = Arc<RawCq>;
    type Srq = Arc<RawSrq>;
    type Window = ExposedBuf;

    #[inline(always)]
    unsafe fn post_send(
        &mut self,
        qp: &RawQp,
        wrs: &mut [sys::ibv_send_wr],
    ) -> Result<(), PostFailed> {
        // SAFETY: the caller's contract is RawQp::post_send's.
        unsafe { qp.post_send(wrs) }
    }

    #[inline(always)]
    unsafe fn post_recv(
        &mut self,
        qp: &RawQp,
        wrs: &mut [sys::ibv_recv_wr],
    ) -> Result<(), PostFailed> {
        // SAFETY: the caller's contract is RawQp::post_recv's.
        unsafe { qp.post_recv(wrs) }
    }

    #[inline(always)]
    unsafe fn post_srq_recv(
        &mut self,
        srq: &Arc<RawSrq>,
        wrs: &mut [sys::ibv_recv_wr],
    ) -> Result<(), PostFailed> {
        // SAFETY: the caller's contract is RawSrq::post_recv's.
        unsafe { srq.post_recv(wrs) }
    }

    #[inline(always)]
    fn poll<'a>(
        &mut self,
        cq: &Arc<RawCq>,
        out: &'a mut [MaybeUninit<sys::ibv_wc>],
    ) -> Result<&'a [sys::ibv_wc], Error> {
        cq.poll(out)
    }

    #[inline(always)]
    fn poll_one<'a>(
        &mut self,
        cq: &Arc<RawCq>,
        out: &'a mut MaybeUninit<sys::ibv_wc>,
    ) -> Result<Option<&'a sys::ibv_wc>, Error> {
        cq.poll_one(out)
    }

    fn set_state(&mut self, qp: &RawQp, state: sys::ibv_qp_state) -> Result<(), Error> {
        let mut attr = <sys::ibv_qp_attr as sys::Zeroed>::zeroed();
        attr.qp_state = state;
        let site = if state == sys::ibv_qp_state::RESET {
            site!("ibv_modify_qp(->RESET)")
        } else {
            site!("ibv_modify_qp(->ERR)")
        };
        qp.modify(site, &mut attr, sys::ibv_qp_attr_mask::STATE)
    }

    fn destroy_qp(&mut self, qp: RawQp) -> Result<(), Error> {
        qp.destroy()
    }

    fn destroy_srq(&mut self, srq: Arc<RawSrq>) -> Result<(), Error> {
        match Arc::try_unwrap(srq) {
            Ok(srq) => srq.destroy(),
            // A leaked queue pair still holds it: it stays, and so must its buffers.
            Err(shared) => {
                core::mem::forget(shared);
                Err(Error::os(
                    site!("ibv_destroy_srq", "a leaked queue pair still uses it"),
                    libc::EBUSY,
                ))
            }
        }
    }
}
