//! One registered region carved into buffers in O(1) (primer pitfall 6.5:
//! register once, never per buffer).
//!
//! - [`Arena`]: page-aligned `mmap` memory (huge pages on request),
//!   registered once, carved by the [`crate::tlsf`] offset allocator whose
//!   metadata lives outside the registered memory (a peer can never corrupt
//!   it). Allocation takes `&mut Arena`: one owner, no lock, no system call.
//! - [`ArenaBuf`]: owns its sub-range, returns it on drop from any thread
//!   through a lock-free return stack that the owner drains on its next
//!   allocation, and keeps the registration alive (it cannot outlive it).
//!   It is a [`LocalBuf`], so it moves into the queue pair while in flight.
//! - [`SharedArena`] (std): the arena behind a mutex, for many allocating
//!   threads; frees stay lock-free. A mutex rather than per-thread caches
//!   because caches would hoard registered (pinned) memory per thread and the
//!   critical section is a few tens of nanoseconds.
//! - Least privilege: the region is registered without remote access unless
//!   the caller opts in ([`ArenaConfig::whole_region_access`]); a peer gets a
//!   descriptor for one buffer through a memory window bound to exactly that
//!   buffer ([`crate::QueuePair::expose`]), or an explicit per-buffer
//!   registration ([`Arena::register_buffer`]).
#![allow(unsafe_code)]

mod ret_stack;
mod window;

use alloc::sync::Arc;
use core::ptr::NonNull;

pub use window::{Exposed, ExposedBuf};

use crate::endpoint::RemoteRegion;
use crate::error::{Error, ErrorKind};
use crate::memory::{check_range, volatile_copy_in, volatile_copy_out, LocalBuf, PageMemory};
use crate::mr::{register, Access};
use crate::pd::{destroy, ProtectionDomain};
use crate::sys;
use crate::tlsf::{Stats, Tlsf, TlsfConfig, TlsfError};
use ret_stack::ReturnStack;

/// How to build an arena.
#[derive(Clone, Copy, Debug)]
pub struct ArenaConfig {
    /// Bytes of registered memory (rounded up to pages).
    pub capacity: usize,
    /// Try 2 MiB huge pages first (falls back to normal pages; see [`Arena::huge_pages`]).
    pub huge_pages: bool,
    /// Most buffers alive at once (sizes the fixed metadata tables).
    pub max_buffers: u32,
    /// Alignment when none is asked for: a cache line.
    pub default_align: u64,
    /// Allow binding memory windows to buffers (adds `MW_BIND` to the region).
    pub windows: bool,
    /// Remote access granted to the WHOLE region through its own rkey
    /// (empty by default). Opting in gives every peer that learns
    /// [`Arena::whole_region`] access to every buffer, free or not, for the
    /// life of the arena; prefer windows or per-buffer registrations.
    pub whole_region_access: Access,
}

impl Default for ArenaConfig {
    fn default() -> Self {
        ArenaConfig {
            capacity: 64 << 20,
            huge_pages: false,
            max_buffers: 4096,
            default_align: 64,
            windows: false,
            whole_region_access: Access::EMPTY,
        }
    }
}

/// The registered region and the return stack, shared by the arena and
/// every buffer (an `Arc`), so the registration outlives every buffer.
pub(crate) struct ArenaShared {
    pub(crate) mr: NonNull<sys::ibv_mr>,
    memory: PageMemory,
    pub(crate) pd: ProtectionDomain,
    access: Access,
    returned: ReturnStack,
}

// SAFETY: the region is plain memory whose sub-ranges are owned by buffers;
// the MR pointer is only passed to thread-safe verbs; the return stack is atomic.
unsafe impl Send for ArenaShared {}
// SAFETY: as above.
unsafe impl Sync for ArenaShared {}

impl Drop for ArenaShared {
    fn drop(&mut self) {
        // SAFETY: the last buffer and the arena are gone; deregistered once,
        // before the memory (a field, dropped after this body) is unmapped.
        destroy("ibv_dereg_mr", unsafe {
            sys::ibv_dereg_mr(self.mr.as_ptr())
        });
    }
}

/// One registered region carved into buffers. See the module docs.
pub struct Arena {
    tlsf: Tlsf,
    shared: Arc<ArenaShared>,
    default_align: u64,
}

impl Arena {
    /// Maps and registers the region.
    pub fn new(pd: &ProtectionDomain, config: &ArenaConfig) -> Result<Arena, Error> {
        let memory = PageMemory::map(config.capacity, config.huge_pages)?;
        let mut access = Access::LOCAL_WRITE | config.whole_region_access;
        if config.windows {
            access |= Access::MW_BIND;
        }
        let tlsf = Tlsf::new(
            memory.len() as u64,
            TlsfConfig::new().with_max_live(config.max_buffers),
        )
        .map_err(|e| tlsf_error("Arena::new", e))?;
        let mr = register(pd, memory.as_ptr(), memory.len(), access)?;
        let returned = ReturnStack::new(tlsf.max_blocks() as usize);
        let shared = Arc::new(ArenaShared {
            mr,
            memory,
            pd: pd.clone(),
            access,
            returned,
        });
        Ok(Arena {
            tlsf,
            shared,
            default_align: config.default_align.max(8),
        })
    }

    /// A buffer of `len` bytes at the default alignment (a cache line).
    #[inline]
    pub fn alloc(&mut self, len: usize) -> Result<ArenaBuf, Error> {
        self.alloc_aligned(len, self.default_align)
    }

    /// A buffer of `len` bytes aligned to `align` (a power of two; at least
    /// 8 for atomic targets). O(1), no system call, no lock. Exhaustion is
    /// an error, never a panic.
    #[inline]
    pub fn alloc_aligned(&mut self, len: usize, align: u64) -> Result<ArenaBuf, Error> {
        self.reclaim();
        let a = self
            .tlsf
            .alloc(len as u64, align)
            .map_err(|e| tlsf_error("Arena::alloc", e))?;
        let slot = self.tlsf.handle_slot(a.handle) as u32;
        Ok(ArenaBuf {
            shared: self.shared.clone(),
            offset: a.offset as usize,
            len,
            handle: a.handle,
            slot,
        })
    }

    /// Frees everything buffers dropped (on any thread) since the last call.
    #[inline]
    fn reclaim(&mut self) {
        let tlsf = &mut self.tlsf;
        self.shared.returned.drain(|handle| {
            let freed = tlsf.free(handle);
            debug_assert!(freed.is_ok(), "a returned buffer's handle is live");
        });
    }

    /// Bytes in use, free, largest free block, high-water mark, counts.
    pub fn stats(&mut self) -> Stats {
        self.reclaim();
        self.tlsf.stats()
    }

    /// True when the region got huge pages (asked for and available).
    pub fn huge_pages(&self) -> bool {
        self.shared.memory.is_huge()
    }

    /// Registered bytes.
    pub fn capacity(&self) -> usize {
        self.shared.memory.len()
    }

    /// Local key of the region.
    pub fn lkey(&self) -> u32 {
        // SAFETY: the registration lives as long as `shared`.
        unsafe { self.shared.mr.as_ref().lkey }
    }

    /// The descriptor of the WHOLE region, only when remote access was
    /// explicitly granted to it ([`ArenaConfig::whole_region_access`]):
    /// whoever holds it may access every byte of the arena.
    pub fn whole_region(&self) -> Option<RemoteRegion> {
        let remote = Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
        (self.shared.access & remote != Access::EMPTY).then(|| RemoteRegion {
            addr: self.shared.memory.as_ptr() as u64,
            len: self.shared.memory.len() as u64,
            // SAFETY: as in lkey.
            rkey: unsafe { self.shared.mr.as_ref().rkey },
        })
    }

    /// Exposes one buffer through its own registration (the fallback where
    /// the device has no memory windows): a peer with the descriptor can
    /// reach exactly this buffer. Costs an `ibv_reg_mr`.
    pub fn register_buffer(
        &self,
        buf: ArenaBuf,
        access: Access,
    ) -> Result<ExposedBuf, (Error, ArenaBuf)> {
        window::register_buffer(buf, access)
    }
}

impl core::fmt::Debug for Arena {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Arena")
            .field("capacity", &self.capacity())
            .field("huge_pages", &self.huge_pages())
            .finish()
    }
}

#[cold]
fn tlsf_error(call: &'static str, e: TlsfError) -> Error {
    let kind = match e {
        TlsfError::OutOfMemory { .. } | TlsfError::OutOfNodes { .. } => ErrorKind::QueueFull,
        _ => ErrorKind::InvalidArgument,
    };
    let detail = match e {
        TlsfError::OutOfMemory { .. } => "the arena is exhausted (no free block large enough)",
        TlsfError::OutOfNodes { .. } => "the arena has max_buffers buffers alive",
        TlsfError::ZeroSize => "zero-length buffer",
        TlsfError::TooLarge { .. } => "larger than the arena",
        _ => "bad size, alignment or configuration",
    };
    Error::new(call, kind).with_detail(detail)
}

/// A buffer carved from an [`Arena`]: owns its sub-range until dropped.
pub struct ArenaBuf {
    shared: Arc<ArenaShared>,
    offset: usize,
    len: usize,
    handle: u32,
    /// The handle's node-table slot: where the return stack links it.
    slot: u32,
}

impl ArenaBuf {
    /// Offset of the buffer in the arena.
    pub fn offset(&self) -> usize {
        self.offset
    }

    fn ptr(&self) -> *mut u8 {
        // SAFETY: offset + len lies within the mapping (the allocator's range).
        unsafe { self.shared.memory.as_ptr().add(self.offset) }
    }

    /// Copies `src` into the buffer at `offset`.
    #[inline]
    pub fn write_at(&mut self, offset: usize, src: &[u8]) -> Result<(), Error> {
        check_range("ArenaBuf::write_at", offset, src.len(), self.len)?;
        // SAFETY: range checked; the buffer owns it (not in flight: we have it).
        unsafe { volatile_copy_in(self.ptr().add(offset), src) };
        Ok(())
    }

    /// Copies from the buffer at `offset` into `dst`.
    #[inline]
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<(), Error> {
        check_range("ArenaBuf::read_at", offset, dst.len(), self.len)?;
        // SAFETY: range checked.
        unsafe { volatile_copy_out(self.ptr().add(offset), dst) };
        Ok(())
    }

    /// The bytes, when no peer can write the region through its own rkey.
    pub fn as_slice(&self) -> Result<&[u8], Error> {
        self.local_only("ArenaBuf::as_slice")?;
        // SAFETY: no remote access to the region and the buffer is not in
        // flight (we hold it) and not exposed (an exposed buffer is owned by
        // its ExposedBuf), so nothing else writes it during the borrow.
        Ok(unsafe { core::slice::from_raw_parts(self.ptr(), self.len) })
    }

    /// The bytes, mutably, when no peer can write the region through its own rkey.
    pub fn as_mut_slice(&mut self) -> Result<&mut [u8], Error> {
        self.local_only("ArenaBuf::as_mut_slice")?;
        // SAFETY: as in as_slice; `&mut self` makes the borrow unique.
        Ok(unsafe { core::slice::from_raw_parts_mut(self.ptr(), self.len) })
    }

    fn local_only(&self, call: &'static str) -> Result<(), Error> {
        let remote = Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
        if self.shared.access & remote != Access::EMPTY {
            return Err(Error::invalid(
                call,
                "the whole arena is remotely accessible: use read_at/write_at",
            ));
        }
        Ok(())
    }

    pub(crate) fn shared(&self) -> &ArenaShared {
        &self.shared
    }
}

impl core::fmt::Debug for ArenaBuf {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ArenaBuf")
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}

impl Drop for ArenaBuf {
    fn drop(&mut self) {
        // Lock-free: the owner frees it on its next allocation.
        self.shared.returned.push(self.handle, self.slot);
    }
}

// SAFETY: the buffer owns [addr, addr+len) exclusively (the allocator hands
// each range to one buffer until its handle is freed, which only happens
// after this value is dropped); the memory is the arena's mapping, which
// does not move and stays registered under lkey while `shared` lives.
unsafe impl LocalBuf for ArenaBuf {
    fn addr(&self) -> u64 {
        self.ptr() as u64
    }
    fn len(&self) -> usize {
        self.len
    }
    fn lkey(&self) -> u32 {
        // SAFETY: the registration lives as long as `shared`.
        unsafe { self.shared.mr.as_ref().lkey }
    }
}

#[cfg(feature = "std")]
/// An [`Arena`] for many allocating threads: allocation takes a mutex
/// (held for the O(1) carve only); frees stay lock-free.
pub struct SharedArena {
    inner: std::sync::Mutex<Arena>,
}

#[cfg(feature = "std")]
impl SharedArena {
    /// Wraps an arena.
    pub fn new(arena: Arena) -> SharedArena {
        SharedArena {
            inner: std::sync::Mutex::new(arena),
        }
    }

    /// As [`Arena::alloc_aligned`].
    pub fn alloc_aligned(&self, len: usize, align: u64) -> Result<ArenaBuf, Error> {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .alloc_aligned(len, align)
    }

    /// As [`Arena::stats`].
    pub fn stats(&self) -> Stats {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).stats()
    }
}
