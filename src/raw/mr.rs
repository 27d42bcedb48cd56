//! Memory registrations (`struct ibv_mr`) and memory windows (`struct
//! ibv_mw`). Each owns what the device may reach through it (the memory,
//! the window's buffer) and releases it only after a successful
//! deregistration or deallocation: a failure leaks both.

use alloc::sync::Arc;
use core::mem::ManuallyDrop;
use core::ptr::NonNull;

use crate::error::{site, Error};
use crate::sys;

use super::pd::RawPd;
use super::ret::{check_ptr, check_rc};

/// Memory that stays at one address, valid and owned by this value alone,
/// for as long as the value lives (moving the value does not move it).
///
/// # Safety
///
/// `[as_ptr(), as_ptr() + len())` is valid for reads and writes, reachable
/// through no other value or reference, and does not move or change length
/// while the value lives.
pub(crate) unsafe trait StableMemory: Send {
    /// The first byte.
    fn as_ptr(&self) -> *mut u8;
    /// Length in bytes.
    fn len(&self) -> usize;
}

/// A registration, owning `M` (the memory, or what keeps it alive).
pub(crate) struct RawMr<M> {
    ptr: NonNull<sys::ibv_mr>,
    /// Dropped only after a successful deregistration; leaked otherwise.
    keep: ManuallyDrop<(M, Arc<RawPd>)>,
}

// SAFETY: the registration handle is only passed to thread-safe verbs; the
// kept value is Send.
unsafe impl<M: Send> Send for RawMr<M> {}
// SAFETY: `&RawMr` exposes keys and numbers, and `&M` (Sync where M is).
unsafe impl<M: Sync> Sync for RawMr<M> {}

impl<M: StableMemory> RawMr<M> {
    /// Registers all of `memory` with `access` (`ibv_reg_mr`).
    ///
    /// # Safety
    ///
    /// If `access` lets a peer write (`REMOTE_WRITE`, `REMOTE_ATOMIC`), no
    /// reference to the memory may exist while the registration lives: it
    /// is read and written only by volatile copies.
    pub(crate) unsafe fn register(
        pd: &Arc<RawPd>,
        memory: M,
        access: sys::ibv_access_flags,
    ) -> Result<RawMr<M>, (Error, M)> {
        let (addr, len) = (memory.as_ptr(), memory.len());
        // SAFETY: `memory` is stable and owned by the registration until it
        // is deregistered (StableMemory; `keep`); the access contract is the caller's.
        unsafe { RawMr::register_range(pd, addr, len, access, memory) }
    }

    /// The registered memory.
    pub(crate) fn memory(&self) -> &M {
        &self.keep.0
    }
}

impl<M> RawMr<M> {
    /// Registers `[addr, addr + len)` with `access`, keeping `keep` (what
    /// owns that memory) until the registration is gone.
    ///
    /// # Safety
    ///
    /// The range is valid memory that stays allocated while `keep` lives and
    /// that nothing else reads or writes while the device may (the same
    /// contract as [`RawMr::register`] for peer-writable access).
    pub(crate) unsafe fn register_range(
        pd: &Arc<RawPd>,
        addr: *mut u8,
        len: usize,
        access: sys::ibv_access_flags,
        keep: M,
    ) -> Result<RawMr<M>, (Error, M)> {
        // SAFETY: live PD; the caller guarantees the range (see above).
        let mr = unsafe { sys::verbs_shim_reg_mr(pd.as_ptr(), addr.cast(), len, access.0 as i32) };
        match check_ptr(site!("ibv_reg_mr"), mr) {
            Ok(ptr) => Ok(RawMr {
                ptr,
                keep: ManuallyDrop::new((keep, pd.clone())),
            }),
            Err(e) => Err((reg_hint(e), keep)),
        }
    }

    /// Registers `len` bytes at `offset` of the dmabuf `fd`, addressed by
    /// work requests from `iova` on (`ibv_reg_dmabuf_mr`).
    ///
    /// # Safety
    ///
    /// While the registration lives, the caller keeps that range of the
    /// dmabuf allocated and lets nothing else write it while the device may.
    pub(crate) unsafe fn register_dmabuf(
        pd: &Arc<RawPd>,
        fd: i32,
        offset: u64,
        len: usize,
        iova: u64,
        access: sys::ibv_access_flags,
        keep: M,
    ) -> Result<RawMr<M>, (Error, M)> {
        // SAFETY: live PD; the kernel validates fd, offset and length.
        let mr =
            unsafe { sys::ibv_reg_dmabuf_mr(pd.as_ptr(), offset, len, iova, fd, access.0 as i32) };
        match check_ptr(site!("ibv_reg_dmabuf_mr"), mr) {
            Ok(ptr) => Ok(RawMr {
                ptr,
                keep: ManuallyDrop::new((keep, pd.clone())),
            }),
            Err(e) => Err((dmabuf_hint(e), keep)),
        }
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_mr {
        self.ptr.as_ptr()
    }

    /// What the registration keeps (its memory, or the memory's owner).
    pub(crate) fn kept(&self) -> &M {
        &self.keep.0
    }

    /// Local key: goes in this side's scatter/gather entries.
    pub(crate) fn lkey(&self) -> u32 {
        // SAFETY: live registration; lkey is set at creation and never changes.
        unsafe { self.ptr.as_ref().lkey }
    }

    /// Remote key: what a peer puts in its RDMA requests.
    pub(crate) fn rkey(&self) -> u32 {
        // SAFETY: as in `lkey`.
        unsafe { self.ptr.as_ref().rkey }
    }

    /// Deregisters and gives the kept value back; on failure the
    /// registration and the value are leaked (the device may still reach it).
    pub(crate) fn deregister(mut self) -> Result<M, Error> {
        let result = self.deregister_in_place();
        core::mem::forget(self);
        result.map(|(m, _pd)| m)
    }

    /// Called exactly once per handle: by `deregister` or by `Drop`.
    fn deregister_in_place(&mut self) -> Result<(M, Arc<RawPd>), Error> {
        // SAFETY: live registration, deregistered once.
        let rc = unsafe { sys::ibv_dereg_mr(self.ptr.as_ptr()) };
        if let Err(e) = check_rc(site!("ibv_dereg_mr"), rc) {
            super::leak::count_leak();
            return Err(e);
        }
        // SAFETY: taken once, after the registration is gone.
        Ok(unsafe { ManuallyDrop::take(&mut self.keep) })
    }
}

impl<M> Drop for RawMr<M> {
    fn drop(&mut self) {
        drop(self.deregister_in_place());
    }
}

#[cold]
fn reg_hint(e: Error) -> Error {
    match e.errno() {
        Some(libc::ENOMEM) | Some(libc::EPERM) | Some(libc::EFAULT) => e.at(site!(
            "ibv_reg_mr",
            "",
            "the memlock limit (`ulimit -l`) may be too low to pin this much memory; raise it or run with CAP_IPC_LOCK"
        )),
        Some(libc::EINVAL) => e.at(site!(
            "ibv_reg_mr",
            "",
            "access flags: REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE; the region must not exceed max_mr_size"
        )),
        _ => e,
    }
}

#[cold]
fn dmabuf_hint(e: Error) -> Error {
    match e.errno() {
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) | Some(libc::EPROTONOSUPPORT) => Error::new(
            site!(
                "ibv_reg_dmabuf_mr",
                "this provider cannot register dmabuf memory",
                "needs a NIC and driver with dmabuf (peer-memory) support, e.g. mlx5"
            ),
            crate::error::ErrorKind::Unsupported,
        ),
        Some(libc::EBADF) | Some(libc::EINVAL) => e.at(site!(
            "ibv_reg_dmabuf_mr",
            "",
            "fd must be a dmabuf file descriptor"
        )),
        _ => e,
    }
}

/// A type-2 memory window, owning `B` (the buffer it is bound to, once
/// bound) until it is deallocated.
pub(crate) struct RawMw<B> {
    ptr: NonNull<sys::ibv_mw>,
    /// Dropped only after a successful deallocation; leaked otherwise.
    keep: ManuallyDrop<(Option<B>, Arc<RawPd>)>,
}

// SAFETY: the window handle is only passed to thread-safe verbs.
unsafe impl<B: Send> Send for RawMw<B> {}

impl<B> RawMw<B> {
    /// `ibv_alloc_mw(TYPE_2)`, keeping nothing yet.
    pub(crate) fn alloc(pd: &Arc<RawPd>) -> Result<RawMw<B>, Error> {
        // SAFETY: live PD.
        let mw = unsafe { sys::verbs_shim_alloc_mw(pd.as_ptr(), sys::ibv_mw_type::TYPE_2) };
        match check_ptr(site!("ibv_alloc_mw(type 2)"), mw) {
            Ok(ptr) => Ok(RawMw {
                ptr,
                keep: ManuallyDrop::new((None, pd.clone())),
            }),
            Err(e) if e.errno() == Some(libc::EOPNOTSUPP) => Err(Error::new(
                site!("ibv_alloc_mw(type 2)", "this device has no memory windows"),
                crate::error::ErrorKind::Unsupported,
            )),
            Err(e) => Err(e),
        }
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_mw {
        self.ptr.as_ptr()
    }

    /// The window's current rkey (before a bind's increment).
    pub(crate) fn rkey(&self) -> u32 {
        // SAFETY: live window; the field is plain data.
        unsafe { self.ptr.as_ref().rkey }
    }

    /// Keeps `buf` (the buffer a bind just posted covers) until deallocation.
    pub(crate) fn keep(&mut self, buf: B) {
        self.keep.0 = Some(buf);
    }

    /// The buffer the window keeps.
    pub(crate) fn kept(&self) -> Option<&B> {
        self.keep.0.as_ref()
    }

    /// Deallocates and gives the buffer back; on failure both are leaked.
    pub(crate) fn dealloc(mut self) -> Result<Option<B>, Error> {
        let result = self.dealloc_in_place();
        core::mem::forget(self);
        result.map(|(b, _pd)| b)
    }

    /// Called exactly once per handle: by `dealloc` or by `Drop`.
    fn dealloc_in_place(&mut self) -> Result<(Option<B>, Arc<RawPd>), Error> {
        // SAFETY: live window, deallocated once.
        let rc = unsafe { sys::verbs_shim_dealloc_mw(self.ptr.as_ptr()) };
        if let Err(e) = check_rc(site!("ibv_dealloc_mw"), rc) {
            super::leak::count_leak();
            return Err(e);
        }
        // SAFETY: taken once, after the window is gone.
        Ok(unsafe { ManuallyDrop::take(&mut self.keep) })
    }
}

impl<B> Drop for RawMw<B> {
    fn drop(&mut self) {
        drop(self.dealloc_in_place());
    }
}
