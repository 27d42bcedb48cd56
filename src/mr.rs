//! Memory regions that own their memory.
#![allow(unsafe_code)]

use core::ptr::NonNull;

use crate::endpoint::RemoteRegion;
use crate::error::{Error, ErrorKind};
use crate::memory::{check_range, volatile_copy_in, volatile_copy_out, LocalBuf, PageMemory};
use crate::pd::{destroy, ProtectionDomain};
use crate::ret::check_ptr;
use crate::sys;

pub use crate::sys::ibv_access_flags as Access;

/// Access that lets a peer touch the memory (`REMOTE_*`) or bind windows.
const REMOTE: Access =
    Access(Access::REMOTE_WRITE.0 | Access::REMOTE_READ.0 | Access::REMOTE_ATOMIC.0);

/// A registered memory region that owns its (page-aligned, zeroed) memory.
///
/// Bytes only. Access defaults to local only; remote read, remote write
/// and remote atomic are asked for explicitly with [`MemoryRegion::with_access`]
/// (`LOCAL_WRITE` is always included: receives and RDMA Read results need it).
///
/// A region a peer may access is never handed out as `&[u8]`/`&mut [u8]`:
/// the peer's NIC can write it at any time, so [`MemoryRegion::read_at`] and
/// [`MemoryRegion::write_at`] copy with volatile accesses instead. A
/// local-only region gives slices, since only a work request (which owns
/// the region while in flight) can make the NIC touch it.
pub struct MemoryRegion {
    mr: NonNull<sys::ibv_mr>,
    // Dropped after `mr` is deregistered (Drop order is explicit below).
    memory: PageMemory,
    access: Access,
    pd: ProtectionDomain,
}

// SAFETY: the region owns its memory; ibv_mr is only passed to verbs,
// which are thread-safe.
unsafe impl Send for MemoryRegion {}
// SAFETY: shared references only allow volatile copies or, for local-only
// regions, shared slices of memory no one else can write.
unsafe impl Sync for MemoryRegion {}

impl MemoryRegion {
    /// A local-only region of `len` bytes (rounded up to pages).
    pub fn new(pd: &ProtectionDomain, len: usize) -> Result<MemoryRegion, Error> {
        Self::with_access(pd, len, Access::LOCAL_WRITE)
    }

    /// A region of `len` bytes with the given access (plus `LOCAL_WRITE`).
    pub fn with_access(
        pd: &ProtectionDomain,
        len: usize,
        access: Access,
    ) -> Result<MemoryRegion, Error> {
        let memory = PageMemory::map(len, false)?;
        let access = access | Access::LOCAL_WRITE;
        let mr = register(pd, memory.as_ptr(), memory.len(), access)?;
        Ok(MemoryRegion {
            mr,
            memory,
            access,
            pd: pd.clone(),
        })
    }

    /// Start address.
    pub fn addr(&self) -> u64 {
        self.memory.as_ptr() as u64
    }

    /// Length in bytes (a whole number of pages).
    pub fn len(&self) -> usize {
        self.memory.len()
    }

    /// Always false: regions are at least one page.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Local key: goes in this side's scatter/gather entries.
    pub fn lkey(&self) -> u32 {
        // SAFETY: `mr` is a live registration owned by self.
        unsafe { self.mr.as_ref().lkey }
    }

    /// Remote key: what a peer puts in its RDMA requests. Meaningful only
    /// when remote access was granted.
    pub fn rkey(&self) -> u32 {
        // SAFETY: as in lkey.
        unsafe { self.mr.as_ref().rkey }
    }

    /// The access this region was registered with.
    pub fn access(&self) -> Access {
        self.access
    }

    /// The protection domain.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// The descriptor to give a peer: the whole region. `None` when no
    /// remote access was granted (there is nothing to share).
    pub fn remote(&self) -> Option<RemoteRegion> {
        (self.access & REMOTE != Access::EMPTY).then(|| RemoteRegion {
            addr: self.addr(),
            len: self.len() as u64,
            rkey: self.rkey(),
        })
    }

    /// True when a peer may write or read this region on its own.
    pub fn is_remote_accessible(&self) -> bool {
        self.access & REMOTE != Access::EMPTY
    }

    /// Copies `src` into the region at `offset`.
    #[inline]
    pub fn write_at(&mut self, offset: usize, src: &[u8]) -> Result<(), Error> {
        check_range("MemoryRegion::write_at", offset, src.len(), self.len())?;
        // SAFETY: range checked above; `&mut self` means no work request owns the region.
        unsafe { volatile_copy_in(self.memory.as_ptr().add(offset), src) };
        Ok(())
    }

    /// Copies from the region at `offset` into `dst`.
    #[inline]
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<(), Error> {
        check_range("MemoryRegion::read_at", offset, dst.len(), self.len())?;
        // SAFETY: range checked above.
        unsafe { volatile_copy_out(self.memory.as_ptr().add(offset), dst) };
        Ok(())
    }

    /// The bytes, for a region no peer can write.
    pub fn as_slice(&self) -> Result<&[u8], Error> {
        self.local_only("MemoryRegion::as_slice")?;
        // SAFETY: local-only region not owned by a work request (we hold
        // `&self`), so nothing writes it while the borrow lives.
        Ok(unsafe { core::slice::from_raw_parts(self.memory.as_ptr(), self.len()) })
    }

    /// The bytes, mutably, for a region no peer can write.
    pub fn as_mut_slice(&mut self) -> Result<&mut [u8], Error> {
        self.local_only("MemoryRegion::as_mut_slice")?;
        // SAFETY: as in as_slice, and `&mut self` makes the borrow unique.
        Ok(unsafe { core::slice::from_raw_parts_mut(self.memory.as_ptr(), self.len()) })
    }

    /// The bytes of a region a peer may access.
    ///
    /// # Safety
    ///
    /// No peer may write the region while the returned slice lives (for
    /// example, the application protocol guarantees the peer finished and
    /// will not write again). A concurrent remote write is a data race.
    pub unsafe fn as_slice_unchecked(&self) -> &[u8] {
        // SAFETY: the caller guarantees no concurrent writer; memory valid for len.
        unsafe { core::slice::from_raw_parts(self.memory.as_ptr(), self.len()) }
    }

    /// The raw registration, for calls the safe layer does not wrap.
    pub fn as_raw(&self) -> *mut sys::ibv_mr {
        self.mr.as_ptr()
    }

    fn local_only(&self, call: &'static str) -> Result<(), Error> {
        if self.is_remote_accessible() {
            return Err(Error::new(call, ErrorKind::InvalidArgument)
                .with_detail("a peer may write this region at any time, so no slice is handed out")
                .with_hint("use read_at/write_at, or the unsafe as_slice_unchecked"));
        }
        Ok(())
    }
}

impl core::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .field("lkey", &format_args!("{:#x}", self.lkey()))
            .field("access", &self.access.0)
            .finish()
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: registered by `register`, deregistered once, before the
        // memory (dropped after this body) is unmapped.
        destroy("ibv_dereg_mr", unsafe {
            sys::ibv_dereg_mr(self.mr.as_ptr())
        });
    }
}

// SAFETY: the region owns [addr, addr+len) exclusively (its mapping), the
// mapping does not move with the value, and it is registered under lkey.
unsafe impl LocalBuf for MemoryRegion {
    fn addr(&self) -> u64 {
        MemoryRegion::addr(self)
    }
    fn len(&self) -> usize {
        MemoryRegion::len(self)
    }
    fn lkey(&self) -> u32 {
        MemoryRegion::lkey(self)
    }
}

/// Registers `[addr, addr + len)` with `access` (`ibv_reg_mr` through the shim).
pub(crate) fn register(
    pd: &ProtectionDomain,
    addr: *mut u8,
    len: usize,
    access: Access,
) -> Result<NonNull<sys::ibv_mr>, Error> {
    if access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_ATOMIC) {
        debug_assert!(access.contains(Access::LOCAL_WRITE));
    }
    // SAFETY: live PD; the caller owns `[addr, addr+len)` and keeps it
    // mapped until the registration is deregistered.
    let mr = unsafe { sys::verbs_shim_reg_mr(pd.as_raw(), addr.cast(), len, access.0 as i32) };
    check_ptr("ibv_reg_mr", mr).map_err(|e| match e.errno() {
        Some(libc::ENOMEM) | Some(libc::EPERM) | Some(libc::EFAULT) => e.with_hint(
            "the memlock limit (`ulimit -l`) may be too low to pin this much memory; raise it or run with \
             CAP_IPC_LOCK",
        ),
        Some(libc::EINVAL) => e.with_hint("access flags: REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE"),
        _ => e,
    })
}
