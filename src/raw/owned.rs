//! Memory the crate owns and registers: page-aligned anonymous mappings
//! and heap bytes taken from a `Vec` or `Box`. Both stay at one address
//! while their owner lives, so a registration can own them.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::ptr::NonNull;

use crate::error::{site, Error};

use super::mr::StableMemory;
use super::os::page_size;
use super::ret::errno;

/// Bytes in a huge page (2 MiB on x86-64 and the usual aarch64 setups).
pub(crate) const HUGE_PAGE: usize = 2 << 20;

/// Anonymous, page-aligned, zero-filled memory from `mmap`, unmapped on drop.
pub(crate) struct PageMemory {
    ptr: NonNull<u8>,
    len: usize,
    huge: bool,
}

// SAFETY: plain memory owned by this value; no thread affinity.
unsafe impl Send for PageMemory {}
// SAFETY: `&PageMemory` gives out only the address; access to the bytes
// goes through the owners' own rules (volatile copies, `&mut`).
unsafe impl Sync for PageMemory {}

impl PageMemory {
    /// Maps `len` bytes (rounded up to whole pages). With `huge`, tries
    /// 2 MiB huge pages first and falls back to normal pages;
    /// [`PageMemory::is_huge`] says which it got.
    pub(crate) fn map(len: usize, huge: bool) -> Result<PageMemory, Error> {
        if len == 0 {
            return Err(Error::invalid(site!("mmap", "zero-length memory")));
        }
        if huge {
            if let Some(rounded) = len.checked_next_multiple_of(HUGE_PAGE) {
                if let Some(ptr) = mmap(rounded, libc::MAP_HUGETLB) {
                    return Ok(PageMemory {
                        ptr,
                        len: rounded,
                        huge: true,
                    });
                }
            }
        }
        let rounded = len
            .checked_next_multiple_of(page_size())
            .ok_or(Error::invalid(site!(
                "mmap",
                "length overflows when rounded to pages"
            )))?;
        let ptr = mmap(rounded, 0).ok_or_else(|| Error::os(site!("mmap"), errno()))?;
        Ok(PageMemory {
            ptr,
            len: rounded,
            huge: false,
        })
    }

    /// The first byte.
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Bytes mapped (whole pages).
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// True when the mapping got huge pages.
    pub(crate) fn is_huge(&self) -> bool {
        self.huge
    }
}

fn mmap(len: usize, extra_flags: i32) -> Option<NonNull<u8>> {
    // SAFETY: an anonymous private mapping at an address of the kernel's
    // choosing touches no existing memory.
    let p = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | extra_flags,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        None
    } else {
        NonNull::new(p.cast())
    }
}

// SAFETY: a private anonymous mapping, owned by the value, unmapped on drop.
unsafe impl StableMemory for PageMemory {
    fn as_ptr(&self) -> *mut u8 {
        PageMemory::as_ptr(self)
    }
    fn len(&self) -> usize {
        PageMemory::len(self)
    }
}

impl Drop for PageMemory {
    fn drop(&mut self) {
        // SAFETY: this mapping was created by `map` with exactly this length
        // and is unmapped once. A registration of it owns it (`RawMr`) and
        // drops it only after a successful deregistration.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Heap bytes taken over from a `Vec<u8>` or `Box<[u8]>`, kept as a raw
/// pointer (so copies through it and the device's writes alias nothing),
/// given back as a `Box` or freed on drop.
pub(crate) struct HeapMemory {
    ptr: NonNull<[u8]>,
}

// SAFETY: owned heap bytes; no thread affinity.
unsafe impl Send for HeapMemory {}
// SAFETY: `&HeapMemory` gives out only the address.
unsafe impl Sync for HeapMemory {}

impl HeapMemory {
    /// Takes `bytes` (a `Vec` is shrunk to its length first, which may move
    /// it once, before anything is registered). Refuses an empty one.
    pub(crate) fn new(bytes: impl Into<Box<[u8]>>) -> Result<HeapMemory, Error> {
        let bytes: Box<[u8]> = bytes.into();
        if bytes.is_empty() {
            return Err(Error::invalid(site!("register", "zero-length memory")));
        }
        Ok(HeapMemory {
            ptr: NonNull::from(Box::leak(bytes)),
        })
    }

    /// The bytes back, as the `Vec` they came from (same length).
    pub(crate) fn into_vec(self) -> Vec<u8> {
        let ptr = self.ptr;
        core::mem::forget(self);
        // SAFETY: `ptr` came from `Box::leak` in `new` and is reclaimed once.
        unsafe { Box::from_raw(ptr.as_ptr()) }.into_vec()
    }
}

// SAFETY: the heap allocation is owned by the value, does not move while
// it lives, and is freed only on drop.
unsafe impl StableMemory for HeapMemory {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr().cast()
    }
    fn len(&self) -> usize {
        self.ptr.len()
    }
}

impl Drop for HeapMemory {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `Box::leak` in `new` and is freed once.
        drop(unsafe { Box::from_raw(self.ptr.as_ptr()) });
    }
}

/// Either kind of memory the crate registers for the CPU and the device.
pub(crate) enum OwnedMemory {
    /// Mapped pages (page-aligned).
    Pages(PageMemory),
    /// The caller's heap bytes.
    Heap(HeapMemory),
}

// SAFETY: both variants are StableMemory; the enum adds nothing.
unsafe impl StableMemory for OwnedMemory {
    fn as_ptr(&self) -> *mut u8 {
        match self {
            OwnedMemory::Pages(m) => m.as_ptr(),
            OwnedMemory::Heap(m) => StableMemory::as_ptr(m),
        }
    }
    fn len(&self) -> usize {
        match self {
            OwnedMemory::Pages(m) => m.len(),
            OwnedMemory::Heap(m) => StableMemory::len(m),
        }
    }
}
