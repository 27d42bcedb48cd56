//! Memory regions that own their memory: pages the crate maps, or the
//! caller's heap bytes (`Vec<u8>`, `Box<[u8]>`), registered once.

use alloc::boxed::Box;
use alloc::vec::Vec;

use crate::endpoint::RemoteRegion;
use crate::error::Error;
use crate::pd::ProtectionDomain;
use crate::raw::{HeapMemory, OwnedMemory, PageMemory, RawMr, StableMemory};

use super::contract::{HostBuf, NicBuf};

use super::access::Access;

/// A registered memory region that owns its memory: page-aligned pages
/// the crate maps ([`MemoryRegion::new`]), or heap bytes the caller hands
/// over ([`MemoryRegion::from_vec`]).
///
/// Access defaults to local only; remote read, write and atomic are asked
/// for explicitly (`LOCAL_WRITE` is always included: receives and RDMA
/// Read results need it). A region a peer may write is never lent as a
/// slice: [`HostBuf::read_at`] and [`HostBuf::write_at`] copy with volatile
/// accesses instead.
pub struct MemoryRegion {
    raw: RawMr<OwnedMemory>,
    access: Access,
    pd: ProtectionDomain,
}

impl MemoryRegion {
    /// A local-only region of `len` bytes (rounded up to whole pages, zeroed).
    pub fn new(pd: &ProtectionDomain, len: usize) -> Result<MemoryRegion, Error> {
        Self::with_access(pd, len, Access::LOCAL_WRITE)
    }

    /// A region of `len` page-aligned bytes with `access` (plus `LOCAL_WRITE`).
    pub fn with_access(
        pd: &ProtectionDomain,
        len: usize,
        access: Access,
    ) -> Result<MemoryRegion, Error> {
        Self::register(pd, OwnedMemory::Pages(PageMemory::map(len, false)?), access)
    }

    /// Registers the caller's bytes, which the region then owns (a `Vec`
    /// is shrunk to its length first). They need not be page-aligned: the
    /// device registers whole pages around them (primer 6.8), and
    /// `ibv_reg_mr` marks those pages do-not-fork, which affects whatever
    /// else the allocator put on them.
    pub fn from_vec(
        pd: &ProtectionDomain,
        bytes: impl Into<Box<[u8]>>,
        access: Access,
    ) -> Result<MemoryRegion, Error> {
        Self::register(pd, OwnedMemory::Heap(HeapMemory::new(bytes)?), access)
    }

    fn register(
        pd: &ProtectionDomain,
        memory: OwnedMemory,
        access: Access,
    ) -> Result<MemoryRegion, Error> {
        let access = access | Access::LOCAL_WRITE;
        // SAFETY: the region owns `memory`; while the registration lives it
        // is reached only through this value, which lends slices only when
        // `access` lets no peer write (`peer_writable`).
        let raw = unsafe { RawMr::register(&pd.raw, memory, access) }.map_err(|(e, _memory)| e)?;
        Ok(MemoryRegion {
            raw,
            access,
            pd: pd.clone(),
        })
    }

    /// Deregisters and gives back the caller's bytes (a region made by
    /// [`MemoryRegion::from_vec`]); `None` for mapped pages, which are freed.
    /// A failed deregistration leaks the bytes (the device may reach them).
    pub fn into_vec(self) -> Result<Option<Vec<u8>>, Error> {
        match self.raw.deregister()? {
            OwnedMemory::Heap(heap) => Ok(Some(heap.into_vec())),
            OwnedMemory::Pages(_) => Ok(None),
        }
    }

    /// Remote key: what a peer puts in its RDMA requests (meaningful when
    /// remote access was granted).
    pub fn rkey(&self) -> u32 {
        self.raw.rkey()
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
        self.access.grants_remote().then(|| RemoteRegion {
            addr: self.addr(),
            len: self.len() as u64,
            rkey: self.rkey(),
        })
    }

    /// The bytes of a region a peer may write.
    ///
    /// # Safety
    ///
    /// No peer may write the region while the returned slice lives (the
    /// application protocol guarantees the peer finished and will not write
    /// again). A concurrent remote write is a data race.
    pub unsafe fn as_slice_unchecked(&self) -> &[u8] {
        // SAFETY: valid memory owned by `self`; the caller rules out writers.
        unsafe { core::slice::from_raw_parts(self.raw.memory().as_ptr(), self.len()) }
    }

    /// The raw registration, for calls the safe layer does not wrap.
    pub fn as_raw(&self) -> *mut crate::sys::ibv_mr {
        self.raw.as_ptr()
    }
}

impl core::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .field("lkey", &format_args!("{:#x}", self.lkey()))
            .field("access", &self.access)
            .finish()
    }
}

// SAFETY: the region owns its memory exclusively (the registration owns it,
// and the registration is owned by this value), the memory does not move
// with the value, and it is registered under lkey while the value lives.
unsafe impl NicBuf for MemoryRegion {
    fn addr(&self) -> u64 {
        self.raw.memory().as_ptr() as u64
    }
    fn len(&self) -> usize {
        self.raw.memory().len()
    }
    fn lkey(&self) -> u32 {
        self.raw.lkey()
    }
}

// SAFETY: the memory is CPU memory the region owns; `peer_writable` is
// true exactly when the registration's access lets a peer change it.
unsafe impl HostBuf for MemoryRegion {
    fn as_ptr(&self) -> *mut u8 {
        self.raw.memory().as_ptr()
    }
    fn peer_writable(&self) -> bool {
        self.access.lets_peer_write()
    }
}

/// Memory the crate did not allocate, registered for the device only (a
/// `cudaMalloc` pointer, primer 7.2): the CPU never reads or writes it
/// through the crate, so it is a [`NicBuf`] and not a [`HostBuf`].
pub struct ForeignRegion {
    raw: RawMr<Box<dyn core::any::Any + Send>>,
    addr: u64,
    len: usize,
    access: Access,
}

impl ForeignRegion {
    /// Registers `[addr, addr + len)` with `access` (plus `LOCAL_WRITE`)
    /// and keeps `owner` (whatever keeps that memory allocated, e.g. a
    /// handle whose drop frees the GPU buffer) until the registration is
    /// gone: `owner` is dropped only after a successful deregistration.
    ///
    /// # Safety
    ///
    /// While `owner` lives, the range stays allocated and is read or written
    /// by nothing but the device while the region is posted or a peer holds
    /// its descriptor (no kernel, no other registration's user, no CPU code).
    pub unsafe fn register(
        pd: &ProtectionDomain,
        addr: u64,
        len: usize,
        access: Access,
        owner: Box<dyn core::any::Any + Send>,
    ) -> Result<ForeignRegion, Error> {
        let access = access | Access::LOCAL_WRITE;
        // SAFETY: the caller keeps the range valid and unshared while `owner`
        // lives; the registration keeps `owner` until it is gone.
        let raw =
            unsafe { RawMr::register_range(&pd.raw, addr as usize as *mut u8, len, access, owner) }
                .map_err(|(e, _owner)| e)?;
        Ok(ForeignRegion {
            raw,
            addr,
            len,
            access,
        })
    }

    /// The descriptor to give a peer, when remote access was granted.
    pub fn remote(&self) -> Option<RemoteRegion> {
        self.access.grants_remote().then(|| RemoteRegion {
            addr: self.addr,
            len: self.len as u64,
            rkey: self.raw.rkey(),
        })
    }
}

// SAFETY: `register`'s contract gives this value exclusive use of the
// range, registered under lkey while the registration (owned here) lives.
unsafe impl NicBuf for ForeignRegion {
    fn addr(&self) -> u64 {
        self.addr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn lkey(&self) -> u32 {
        self.raw.lkey()
    }
}

impl core::fmt::Debug for ForeignRegion {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ForeignRegion")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .finish()
    }
}
