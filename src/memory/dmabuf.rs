//! External memory (GPU memory exported as a dmabuf, primer 7.2),
//! registered for the device only.

use crate::endpoint::RemoteRegion;
use crate::error::Error;
use crate::pd::ProtectionDomain;
use crate::raw::RawMr;

use super::access::Access;
use super::contract::NicBuf;

/// A registration of `len` bytes of a dmabuf (`ibv_reg_dmabuf_mr`). The
/// CPU never touches the memory through it (it is a [`NicBuf`], not a
/// [`super::HostBuf`]); work requests address it by `iova`. Providers
/// without dmabuf support (Soft-RoCE among them) give an `Unsupported`
/// error.
///
/// The CPU-only operations do not compile for it:
///
/// ```compile_fail
/// use verbs::{DmabufRegion, HostBuf};
/// fn peek(r: &DmabufRegion) {
///     let mut b = [0u8; 4];
///     r.read_at(0, &mut b).unwrap(); // DmabufRegion is not HostBuf
/// }
/// ```
///
/// ```compile_fail
/// use verbs::{DmabufRegion, SendOp, SendRequest};
/// fn send(r: DmabufRegion) -> SendRequest<DmabufRegion> {
///     SendRequest::new(SendOp::Send, r).inline() // inline reads with the CPU
/// }
/// ```
///
/// ```compile_fail
/// use verbs::{DmabufRegion, Engine, PreparedSend};
/// fn poke(e: &mut Engine<DmabufRegion>, p: PreparedSend) {
///     e.write_prepared(p, 0, b"x").unwrap(); // a CPU copy into device memory
/// }
/// ```
///
/// Their host-memory twins compile:
///
/// ```no_run
/// use verbs::{Engine, HostBuf, MemoryRegion, PreparedSend, SendOp, SendRequest};
/// fn fine(e: &mut Engine<MemoryRegion>, p: PreparedSend, r: MemoryRegion) {
///     let mut b = [0u8; 4];
///     r.read_at(0, &mut b).unwrap();
///     let _ = SendRequest::new(SendOp::Send, r).inline();
///     e.write_prepared(p, 0, b"x").unwrap();
/// }
/// ```
pub struct DmabufRegion {
    raw: RawMr<()>,
    iova: u64,
    len: usize,
    access: Access,
}

impl DmabufRegion {
    /// Registers `[offset, offset + len)` of the dmabuf `fd`, addressed by
    /// work requests from `iova` on, with `access` (plus `LOCAL_WRITE`).
    ///
    /// # Safety
    ///
    /// While the region lives, the caller keeps that range of the dmabuf
    /// allocated and lets nothing else (a GPU kernel, another registration)
    /// write it while the device may; the kernel keeps the pages pinned but
    /// cannot know who else writes them.
    pub unsafe fn register(
        pd: &ProtectionDomain,
        fd: i32,
        offset: u64,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<DmabufRegion, Error> {
        let access = access | Access::LOCAL_WRITE;
        // SAFETY: the caller's contract above.
        let raw = unsafe { RawMr::register_dmabuf(&pd.raw, fd, offset, len, iova, access, ()) }
            .map_err(|(e, ())| e)?;
        Ok(DmabufRegion {
            raw,
            iova,
            len,
            access,
        })
    }

    /// Remote key (meaningful when remote access was granted).
    pub fn rkey(&self) -> u32 {
        self.raw.rkey()
    }

    /// The descriptor to give a peer, when remote access was granted.
    pub fn remote(&self) -> Option<RemoteRegion> {
        self.access.grants_remote().then(|| RemoteRegion {
            addr: self.iova,
            len: self.len as u64,
            rkey: self.rkey(),
        })
    }
}

// SAFETY: the registration covers [iova, iova + len) under lkey for as
// long as the value lives, and `register`'s contract gives this value
// exclusive use of that range; the CPU never dereferences `addr`.
unsafe impl NicBuf for DmabufRegion {
    fn addr(&self) -> u64 {
        self.iova
    }
    fn len(&self) -> usize {
        self.len
    }
    fn lkey(&self) -> u32 {
        self.raw.lkey()
    }
}

impl core::fmt::Debug for DmabufRegion {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("DmabufRegion")
            .field("iova", &format_args!("{:#x}", self.iova))
            .field("len", &self.len)
            .finish()
    }
}
