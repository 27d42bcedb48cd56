//! External memory (GPU memory exported as a dmabuf, primer 7.2) registered
//! behind the same [`LocalBuf`] abstraction as host memory.
#![allow(unsafe_code)]

use core::ptr::NonNull;

use crate::endpoint::RemoteRegion;
use crate::error::{Error, ErrorKind};
use crate::memory::LocalBuf;
use crate::mr::Access;
use crate::pd::{destroy, ProtectionDomain};
use crate::ret::check_ptr;
use crate::sys;

/// A registration of `len` bytes of a dmabuf (`ibv_reg_dmabuf_mr`). The
/// CPU never touches the memory through it; work requests address it by
/// `iova`. Providers without dmabuf support (Soft-RoCE among them) give an
/// `Unsupported` error.
pub struct DmabufRegion {
    mr: NonNull<sys::ibv_mr>,
    iova: u64,
    len: usize,
    access: Access,
    _pd: ProtectionDomain,
}

// SAFETY: a registration handle, only passed to thread-safe verbs.
unsafe impl Send for DmabufRegion {}
// SAFETY: as above; `&self` exposes only keys and numbers.
unsafe impl Sync for DmabufRegion {}

impl DmabufRegion {
    /// Registers `[offset, offset + len)` of the dmabuf `fd`, addressed by
    /// work requests from `iova` on, with `access` (plus `LOCAL_WRITE`).
    ///
    /// # Safety
    ///
    /// While the region lives and is posted to a queue pair, the caller
    /// keeps that range of the dmabuf allocated and does not let other
    /// users (a GPU kernel, another registration) write it concurrently
    /// with the NIC; the kernel keeps the pages pinned but cannot know
    /// who else writes them.
    pub unsafe fn register(
        pd: &ProtectionDomain,
        fd: i32,
        offset: u64,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<DmabufRegion, Error> {
        let access = access | Access::LOCAL_WRITE;
        // SAFETY: live PD; the kernel validates fd, offset and length.
        let mr =
            unsafe { sys::ibv_reg_dmabuf_mr(pd.as_raw(), offset, len, iova, fd, access.0 as i32) };
        let mr = check_ptr("ibv_reg_dmabuf_mr", mr).map_err(|e| match e.errno() {
            Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) | Some(libc::EPROTONOSUPPORT) => {
                Error::new("ibv_reg_dmabuf_mr", ErrorKind::Unsupported)
                    .with_detail("this provider cannot register dmabuf memory")
                    .with_hint(
                        "needs a NIC and driver with dmabuf (peer-memory) support, e.g. mlx5",
                    )
            }
            Some(libc::EBADF) | Some(libc::EINVAL) => {
                e.with_hint("fd must be a dmabuf file descriptor")
            }
            _ => e,
        })?;
        Ok(DmabufRegion {
            mr,
            iova,
            len,
            access,
            _pd: pd.clone(),
        })
    }

    /// Remote key (meaningful when remote access was granted).
    pub fn rkey(&self) -> u32 {
        // SAFETY: live registration owned by self.
        unsafe { self.mr.as_ref().rkey }
    }

    /// The descriptor to give a peer, when remote access was granted.
    pub fn remote(&self) -> Option<RemoteRegion> {
        let remote = Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
        (self.access & remote != Access::EMPTY).then(|| RemoteRegion {
            addr: self.iova,
            len: self.len as u64,
            rkey: self.rkey(),
        })
    }
}

impl Drop for DmabufRegion {
    fn drop(&mut self) {
        // SAFETY: registered in `register`, deregistered once.
        destroy("ibv_dereg_mr", unsafe {
            sys::ibv_dereg_mr(self.mr.as_ptr())
        });
    }
}

// SAFETY: the registration covers [iova, iova + len) under lkey for as long
// as the value lives, and `register`'s contract gives this value exclusive
// use of that range; the CPU never dereferences `addr`.
unsafe impl LocalBuf for DmabufRegion {
    fn addr(&self) -> u64 {
        self.iova
    }
    fn len(&self) -> usize {
        self.len
    }
    fn lkey(&self) -> u32 {
        // SAFETY: live registration owned by self.
        unsafe { self.mr.as_ref().lkey }
    }
}
