//! Page-aligned memory for registration, the copies that are sound while a
//! NIC may write it, and the [`LocalBuf`] contract the posting API relies on.
#![allow(unsafe_code)]

use core::ptr::NonNull;

use crate::error::{Error, ErrorKind};

/// Registered memory a queue pair may own while a work request uses it.
///
/// The safe posting API moves a `LocalBuf` into the queue pair and hands it
/// back with the request's completion, so the primer's rule (never touch a
/// buffer between post and completion) holds by construction: while the
/// NIC may read or write the memory, no Rust code can reach it, and
/// `mem::forget` of the queue pair leaks the buffer instead of freeing it.
///
/// # Safety
///
/// An implementor guarantees that, for as long as the value lives:
/// - `[addr, addr + len)` is valid memory owned by this value alone (no
///   other value or reference can read or write it), which moving the value
///   does not move;
/// - that memory is registered under `lkey` (in the protection domain of
///   the queue pairs the value is posted to).
pub unsafe trait LocalBuf: Send {
    /// Start address of the buffer.
    fn addr(&self) -> u64;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// Local key of the registration covering the buffer.
    fn lkey(&self) -> u32;
    /// True for an empty buffer.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Anonymous, page-aligned memory from `mmap`, unmapped on drop.
pub(crate) struct PageMemory {
    ptr: NonNull<u8>,
    len: usize,
    huge: bool,
}

// SAFETY: plain memory owned by this value; no thread affinity.
unsafe impl Send for PageMemory {}
// SAFETY: `&PageMemory` exposes only the address; access goes through
// the owners' own rules (volatile copies, &mut).
unsafe impl Sync for PageMemory {}

impl PageMemory {
    /// Maps `len` bytes (rounded up to whole pages), zero-filled. With
    /// `huge`, tries 2 MiB huge pages first and falls back to normal pages;
    /// [`PageMemory::is_huge`] says which it got.
    pub(crate) fn map(len: usize, huge: bool) -> Result<PageMemory, Error> {
        if len == 0 {
            return Err(Error::invalid("mmap", "zero-length memory"));
        }
        const HUGE: usize = 2 << 20;
        if huge {
            if let Some(rounded) = len.checked_next_multiple_of(HUGE) {
                if let Some(ptr) = mmap(rounded, libc::MAP_HUGETLB) {
                    return Ok(PageMemory {
                        ptr,
                        len: rounded,
                        huge: true,
                    });
                }
            }
        }
        let page = page_size();
        let rounded = len
            .checked_next_multiple_of(page)
            .ok_or_else(|| Error::invalid("mmap", "length overflows when rounded to pages"))?;
        let ptr = mmap(rounded, 0).ok_or_else(|| Error::os("mmap", crate::ret::errno()))?;
        Ok(PageMemory {
            ptr,
            len: rounded,
            huge: false,
        })
    }

    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

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

pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 {
        n as usize
    } else {
        4096
    }
}

impl Drop for PageMemory {
    fn drop(&mut self) {
        // SAFETY: this mapping was created by `map` with exactly this
        // length and is unmapped once; owners deregister before dropping.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Checks `[offset, offset + len)` against a buffer of `size` bytes.
#[inline]
pub(crate) fn check_range(
    call: &'static str,
    offset: usize,
    len: usize,
    size: usize,
) -> Result<(), Error> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(out_of_range(call)),
    }
}

#[cold]
fn out_of_range(call: &'static str) -> Error {
    Error::new(call, ErrorKind::InvalidArgument).with_detail("range past the end of the buffer")
}

/// Copies from memory a NIC may be writing into `dst`, with volatile
/// reads so the compiler assumes nothing about the source.
///
/// # Safety
///
/// `src` must be valid for reads of `dst.len()` bytes.
#[inline]
pub(crate) unsafe fn volatile_copy_out(src: *const u8, dst: &mut [u8]) {
    core::sync::atomic::fence(core::sync::atomic::Ordering::Acquire);
    let mut i = 0;
    // Word-sized where the source is aligned, for speed on large copies.
    while i < dst.len() && (src as usize + i) % 8 != 0 {
        // SAFETY: i < len, within the caller's valid range.
        dst[i] = unsafe { src.add(i).read_volatile() };
        i += 1;
    }
    while i + 8 <= dst.len() {
        // SAFETY: in range and 8-byte aligned (loop above).
        let w = unsafe { src.add(i).cast::<u64>().read_volatile() };
        dst[i..i + 8].copy_from_slice(&w.to_ne_bytes());
        i += 8;
    }
    while i < dst.len() {
        // SAFETY: i < len.
        dst[i] = unsafe { src.add(i).read_volatile() };
        i += 1;
    }
}

/// Copies `src` into memory a NIC may be reading or writing, with
/// volatile writes.
///
/// # Safety
///
/// `dst` must be valid for writes of `src.len()` bytes.
#[inline]
pub(crate) unsafe fn volatile_copy_in(dst: *mut u8, src: &[u8]) {
    let mut i = 0;
    while i < src.len() && (dst as usize + i) % 8 != 0 {
        // SAFETY: i < len, within the caller's valid range.
        unsafe { dst.add(i).write_volatile(src[i]) };
        i += 1;
    }
    while i + 8 <= src.len() {
        let w = u64::from_ne_bytes(src[i..i + 8].try_into().unwrap_or([0; 8]));
        // SAFETY: in range and 8-byte aligned.
        unsafe { dst.add(i).cast::<u64>().write_volatile(w) };
        i += 8;
    }
    while i < src.len() {
        // SAFETY: i < len.
        unsafe { dst.add(i).write_volatile(src[i]) };
        i += 1;
    }
    core::sync::atomic::fence(core::sync::atomic::Ordering::Release);
}
