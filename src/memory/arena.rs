//! One registered region carved into buffers in O(1) (primer pitfall 6.5:
//! register once, never per buffer).
//!
//! - [`Arena`]: page-aligned `mmap` memory (huge pages on request),
//!   registered once, carved by the [`crate::tlsf`] offset allocator whose
//!   metadata lives outside the registered memory (a peer can never corrupt
//!   it). Allocation takes `&mut Arena`: one owner, no lock, no system call,
//!   no atomic read-modify-write (it takes returned buffers with loads).
//! - [`ArenaBuf`]: owns its sub-range, returns it on drop from any thread
//!   through a wait-free return queue (one atomic swap per drop) that the
//!   owner drains on its next allocation; [`Arena::free`] gives one back
//!   on the owner's thread with no atomic at all. Freed buffers wait in a
//!   small per-size front cache ([`ArenaConfig::front_cache`]) for the
//!   next allocation of their size. It is a [`NicBuf`], so it
//!   moves into the queue pair while in flight.
//! - The registration and the return queue are freed with the arena only
//!   when no buffer is left; otherwise they are leaked, so a buffer never
//!   outlives its memory.
//! - [`SharedArena`] (std): the arena behind a mutex, for many allocating
//!   threads; frees stay lock-free. A mutex rather than per-thread caches,
//!   which would hoard registered (pinned) memory per thread.
//! - Least privilege: the region is registered without remote access unless
//!   the caller opts in ([`ArenaConfig::whole_region_access`]); a peer gets
//!   one buffer through [`crate::engine::Engine::expose`].

use alloc::boxed::Box;
use core::ptr::NonNull;

use crate::endpoint::RemoteRegion;
use crate::error::{site, Error, ErrorKind};
use crate::pd::ProtectionDomain;
use crate::raw::{PageMemory, RawMr};
use crate::tlsf::{Stats, TlsfError};

use super::access::Access;
use super::carve::{arena_tlsf, Carver};
use super::contract::{HostBuf, NicBuf};
use super::return_queue::ReturnQueue;

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
    /// life of the arena; prefer exposing single buffers.
    pub whole_region_access: Access,
    /// Freed buffers kept aside per exact size (up to 255 granules of 64
    /// bytes) for the next allocation of that size: a buffer dropped and
    /// one allocated of the same size are then a push and a pop. Memory
    /// held there is taken back before an allocation fails. 0: no cache.
    pub front_cache: u32,
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
            front_cache: DEFAULT_FRONT_CACHE,
        }
    }
}

/// [`ArenaConfig::front_cache`]'s default.
pub const DEFAULT_FRONT_CACHE: u32 = 8;

/// The registered region and the return queue, shared by the arena and
/// every buffer through a raw pointer (no reference count).
pub(crate) struct ArenaShared {
    raw: RawMr<PageMemory>,
    pub(crate) pd: ProtectionDomain,
    access: Access,
    returned: ReturnQueue,
}

impl ArenaShared {
    /// The region's registration (for a window bind).
    pub(crate) fn mr(&self) -> &RawMr<PageMemory> {
        &self.raw
    }

    /// The access the region was registered with.
    pub(crate) fn mr_access(&self) -> Access {
        self.access
    }
}

/// One registered region carved into buffers. See the module docs.
pub struct Arena {
    /// The allocator and the owner's place in the return queue.
    carver: Carver,
    /// Boxed and leaked at creation; freed by `Drop` only when no buffer is left.
    shared: NonNull<ArenaShared>,
    default_align: u64,
}

// SAFETY: the arena owns its allocator; the shared part is Sync (below).
unsafe impl Send for Arena {}

impl Arena {
    /// Maps and registers the region.
    pub fn new(pd: &ProtectionDomain, config: &ArenaConfig) -> Result<Arena, Error> {
        let memory = PageMemory::map(config.capacity, config.huge_pages)?;
        let mut access = Access::LOCAL_WRITE | config.whole_region_access;
        if config.windows {
            access |= Access::MW_BIND;
        }
        let base = memory.as_ptr() as u64;
        let tlsf = arena_tlsf(
            memory.len() as u64,
            base,
            config.max_buffers,
            config.front_cache,
        )
        .map_err(tlsf_error)?;
        // SAFETY: the registration owns the mapping; buffers reach only their
        // own ranges, and lend slices only when `access` lets no peer write
        // the whole region (`ArenaBuf::peer_writable`).
        let raw = unsafe { RawMr::register(&pd.raw, memory, access) }.map_err(|(e, _)| e)?;
        let (carver, returned) = Carver::new(tlsf);
        let shared = Box::new(ArenaShared {
            raw,
            pd: pd.clone(),
            access,
            returned,
        });
        Ok(Arena {
            carver,
            shared: NonNull::from(Box::leak(shared)),
            default_align: config.default_align.max(8),
        })
    }

    fn shared(&self) -> &ArenaShared {
        // SAFETY: leaked at creation and freed only in `Drop`.
        unsafe { self.shared.as_ref() }
    }

    /// A buffer of `len` bytes at the default alignment (a cache line).
    #[inline(always)]
    pub fn alloc(&mut self, len: usize) -> Result<ArenaBuf, Error> {
        self.alloc_aligned(len, self.default_align)
    }

    /// A buffer of `len` bytes whose address is a multiple of `align` (a
    /// power of two; at least 8 for atomic targets). The address, not only
    /// the offset: the region starts on a page (or a huge page), and the
    /// allocator aligns the region's start plus the offset, so alignments
    /// above a page hold too; one no free block of the region can give
    /// (say, larger than the region) is the error of exhaustion, never a
    /// misaligned buffer. O(1), no system call, no lock, no atomic
    /// read-modify-write. Exhaustion is an error, never a panic; it is
    /// reported only after every buffer dropped so far has been taken back.
    /// Inlined whole (the common case is a few dozen instructions), so
    /// that an allocation pays no call.
    #[inline(always)]
    pub fn alloc_aligned(&mut self, len: usize, align: u64) -> Result<ArenaBuf, Error> {
        // SAFETY: see `shared`; borrowed apart from `self.carver`.
        let returned = unsafe { &self.shared.as_ref().returned };
        let a = self
            .carver
            .alloc(returned, len as u64, align)
            .map_err(tlsf_error)?;
        Ok(ArenaBuf {
            shared: self.shared,
            offset: a.offset as usize,
            len,
            slot: self.carver.tlsf.handle_slot(a.handle) as u32,
        })
    }

    /// Gives `buf` back at once: for a buffer back on the thread that owns
    /// the arena, which a drop would send through the return queue (one
    /// atomic swap, and the allocator's free on the next allocation). A
    /// buffer of another arena is dropped as usual.
    #[inline]
    pub fn free(&mut self, buf: ArenaBuf) {
        if buf.shared != self.shared {
            drop(buf);
            return;
        }
        let slot = buf.slot;
        // Its range goes back to the allocator here instead of through the
        // queue; nothing else of the buffer needs dropping.
        core::mem::forget(buf);
        self.carver.free(slot);
    }

    /// Every buffer dropped so far taken back, and the front cache merged
    /// back into the free lists.
    fn flush(&mut self) {
        // SAFETY: see `shared`; borrowed apart from `self.carver`.
        let returned = unsafe { &self.shared.as_ref().returned };
        self.carver.flush(returned);
        self.carver.tlsf.flush_cache();
    }

    /// Bytes in use, free, largest free block, high-water mark, counts,
    /// with every buffer dropped so far taken back and the front cache
    /// emptied (so `free_blocks` and `largest_free` are exact).
    pub fn stats(&mut self) -> Stats {
        self.flush();
        self.carver.tlsf.stats()
    }

    /// True when the region got huge pages (asked for and available).
    pub fn huge_pages(&self) -> bool {
        self.shared().raw.memory().is_huge()
    }

    /// Registered bytes.
    pub fn capacity(&self) -> usize {
        self.shared().raw.memory().len()
    }

    /// Local key of the region.
    pub fn lkey(&self) -> u32 {
        self.shared().raw.lkey()
    }

    /// The protection domain.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.shared().pd
    }

    /// The descriptor of the WHOLE region, only when remote access was
    /// explicitly granted to it ([`ArenaConfig::whole_region_access`]):
    /// whoever holds it may access every byte of the arena.
    pub fn whole_region(&self) -> Option<RemoteRegion> {
        let shared = self.shared();
        shared.access.grants_remote().then(|| RemoteRegion {
            addr: shared.raw.memory().as_ptr() as u64,
            len: shared.raw.memory().len() as u64,
            rkey: shared.raw.rkey(),
        })
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        self.flush();
        if self.carver.tlsf.alloc_count() != 0 {
            // A buffer is alive (held, in flight, forgotten or leaked with a
            // queue whose destroy failed): its memory must stay.
            return;
        }
        // SAFETY: leaked by `new`, reclaimed once; no buffer is left to use
        // it (every buffer came back, through the queue, drained above, or
        // through `free`), and a drop's last access to it is its push.
        drop(unsafe { Box::from_raw(self.shared.as_ptr()) });
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
fn tlsf_error(e: TlsfError) -> Error {
    match e {
        TlsfError::OutOfMemory { .. } => Error::new(
            site!(
                "Arena::alloc",
                "the arena is exhausted (no free block large enough)"
            ),
            ErrorKind::QueueFull,
        ),
        TlsfError::OutOfNodes { .. } => Error::new(
            site!("Arena::alloc", "the arena has max_buffers buffers alive"),
            ErrorKind::QueueFull,
        ),
        TlsfError::ZeroSize => Error::invalid(site!("Arena::alloc", "zero-length buffer")),
        TlsfError::TooLarge { .. } => {
            Error::invalid(site!("Arena::alloc", "larger than the arena"))
        }
        _ => Error::invalid(site!("Arena", "bad size, alignment or configuration")),
    }
}

/// A buffer carved from an [`Arena`]: owns its sub-range until dropped.
pub struct ArenaBuf {
    /// Valid while any buffer lives: the arena frees it only when none is left.
    shared: NonNull<ArenaShared>,
    offset: usize,
    len: usize,
    /// The allocator's node-table slot of its block, live and held by this
    /// buffer alone: what its drop queues, and the queue's table index.
    slot: u32,
}

// SAFETY: the buffer owns its range; the shared part is only read (keys,
// addresses) and pushed to through the atomic return queue.
unsafe impl Send for ArenaBuf {}
// SAFETY: `&ArenaBuf` allows volatile copies out and, when no peer can
// write, shared slices of memory nothing else writes.
unsafe impl Sync for ArenaBuf {}

impl ArenaBuf {
    /// Offset of the buffer in the arena.
    pub fn offset(&self) -> usize {
        self.offset
    }

    pub(crate) fn shared(&self) -> &ArenaShared {
        // SAFETY: valid while this buffer lives (see the field).
        unsafe { self.shared.as_ref() }
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
    #[inline]
    fn drop(&mut self) {
        // Wait-free: the owner frees it on a later allocation. Nothing of
        // the shared part is touched after the push.
        self.shared().returned.push(self.slot);
    }
}

// SAFETY: the allocator hands each range to one buffer until its slot is
// freed, which happens only after this value is dropped; the memory is the
// arena's mapping, which does not move and stays registered under lkey
// while any buffer lives (the arena frees it only when none is left).
unsafe impl NicBuf for ArenaBuf {
    fn addr(&self) -> u64 {
        self.as_ptr() as u64
    }
    fn len(&self) -> usize {
        self.len
    }
    fn lkey(&self) -> u32 {
        self.shared().raw.lkey()
    }
}

// SAFETY: CPU memory of the arena's mapping; a peer can write a buffer
// only through the whole region's own rkey (windows and per-buffer
// registrations own the buffer they expose: `ExposedBuf`).
unsafe impl HostBuf for ArenaBuf {
    fn as_ptr(&self) -> *mut u8 {
        // SAFETY: offset + len lies within the mapping (the allocator's range).
        unsafe { self.shared().raw.memory().as_ptr().add(self.offset) }
    }
    fn peer_writable(&self) -> bool {
        self.shared()
            .access
            .without(Access::MW_BIND)
            .lets_peer_write()
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
