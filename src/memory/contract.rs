//! The two contracts a buffer meets ([`NicBuf`], [`HostBuf`]) and the
//! volatile copies that are sound while a NIC may write the memory.

use crate::error::{site, Error, ErrorKind};

/// Registered memory a queue may own while a work request uses it.
///
/// The posting API moves a `NicBuf` into the queue pair (or the prepared
/// request, or the shared receive queue) and hands it back with the
/// completion, so the primer's rule (never touch a buffer between post and
/// completion) holds by construction, and `mem::forget` of the queue leaks
/// the buffer instead of freeing it.
///
/// # Safety
///
/// For as long as the value lives:
/// - `[addr, addr + len)` (a device address: a virtual address, or an
///   IOVA for device memory) is registered under `lkey`, and stays so;
/// - that memory is owned by this value alone: no other value or reference
///   reads or writes it, and moving the value does not move it;
/// - `len` fits the memory and never changes.
pub unsafe trait NicBuf: Send {
    /// Start address as the device sees it.
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

/// NIC-addressable memory that the CPU also addresses at [`NicBuf::addr`].
///
/// # Safety
///
/// Besides [`NicBuf`]'s contract: `as_ptr` (whose address is `addr`) is
/// valid for reads and writes of `len` bytes while the value lives, and
/// `peer_writable` is true whenever any peer may write the memory (remote
/// write or atomic access through any registration or window that covers it).
pub unsafe trait HostBuf: NicBuf {
    /// The first byte, as a CPU pointer (`as_ptr() as u64 == addr()`).
    fn as_ptr(&self) -> *mut u8;

    /// True when a peer may write the memory on its own at any time: it is
    /// then never lent as a slice.
    fn peer_writable(&self) -> bool;

    /// Copies `src` into the buffer at `offset`.
    #[inline(always)]
    fn write_at(&mut self, offset: usize, src: &[u8]) -> Result<(), Error> {
        check_range(offset, src.len(), self.len())?;
        // SAFETY: the range lies in the buffer, whose memory is CPU-valid and
        // owned by `self` (HostBuf); `&mut self` means no work request owns
        // it; volatile, as a peer may reach memory it was given.
        unsafe { volatile_copy_in(self.as_ptr().add(offset), src) };
        Ok(())
    }

    /// Copies from the buffer at `offset` into `dst`.
    #[inline(always)]
    fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<(), Error> {
        check_range(offset, dst.len(), self.len())?;
        // SAFETY: as in `write_at`; reads only.
        unsafe { volatile_copy_out(self.as_ptr().add(offset), dst) };
        Ok(())
    }

    /// The bytes, when no peer can write them.
    fn as_slice(&self) -> Result<&[u8], Error> {
        local_only(self.peer_writable())?;
        // SAFETY: CPU-valid memory owned by `self`; not in flight (we hold
        // `&self`, a posted buffer is owned by its queue) and no peer can
        // write it, so nothing writes it while the borrow lives.
        Ok(unsafe { core::slice::from_raw_parts(self.as_ptr(), self.len()) })
    }

    /// The bytes, mutably, when no peer can write them.
    fn as_mut_slice(&mut self) -> Result<&mut [u8], Error> {
        local_only(self.peer_writable())?;
        // SAFETY: as in `as_slice`; `&mut self` makes the borrow unique.
        Ok(unsafe { core::slice::from_raw_parts_mut(self.as_ptr(), self.len()) })
    }
}

/// Checks `[offset, offset + len)` against a buffer of `size` bytes.
#[inline]
pub(crate) fn check_range(offset: usize, len: usize, size: usize) -> Result<(), Error> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(out_of_range()),
    }
}

#[cold]
fn out_of_range() -> Error {
    Error::invalid(site!("copy", "range past the end of the buffer"))
}

#[inline]
fn local_only(peer_writable: bool) -> Result<(), Error> {
    if peer_writable {
        return Err(Error::new(
            site!(
                "as_slice",
                "a peer may write this memory at any time, so no slice is handed out",
                "use read_at/write_at (volatile copies)"
            ),
            ErrorKind::InvalidArgument,
        ));
    }
    Ok(())
}

/// Eight bytes at any address: one volatile access of a word where the
/// target allows unaligned ones (x86-64, AArch64), so an 8-byte copy (an
/// id, a counter) needs no alignment test. Aligned, it is one load or
/// store as an aligned `u64` would be.
#[repr(C, packed)]
#[derive(Clone, Copy)]
struct Word(u64);

/// Copies from memory a NIC may be writing into `dst`, with volatile
/// reads so the compiler assumes nothing about the source: 8 bytes inline
/// (one word), anything else out of line.
///
/// # Safety
///
/// `src` must be valid for reads of `dst.len()` bytes.
#[inline(always)]
pub(crate) unsafe fn volatile_copy_out(src: *const u8, dst: &mut [u8]) {
    if let Ok(out) = <&mut [u8; 8]>::try_from(&mut *dst) {
        core::sync::atomic::fence(core::sync::atomic::Ordering::Acquire);
        // SAFETY: 8 bytes, valid for reads (the caller); `Word` needs no
        // alignment.
        *out = unsafe { src.cast::<Word>().read_volatile() }
            .0
            .to_ne_bytes();
        return;
    }
    // SAFETY: the caller's contract, passed on.
    unsafe { volatile_copy_out_any(src, dst) }
}

/// [`volatile_copy_out`] of any length and alignment.
///
/// # Safety
///
/// As [`volatile_copy_out`].
#[inline]
unsafe fn volatile_copy_out_any(src: *const u8, dst: &mut [u8]) {
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
/// volatile writes: 8 bytes inline (one word), anything else out of line.
///
/// # Safety
///
/// `dst` must be valid for writes of `src.len()` bytes.
#[inline(always)]
pub(crate) unsafe fn volatile_copy_in(dst: *mut u8, src: &[u8]) {
    if let Ok(w) = <[u8; 8]>::try_from(src) {
        // SAFETY: 8 bytes, valid for writes (the caller); `Word` needs no
        // alignment.
        unsafe {
            dst.cast::<Word>()
                .write_volatile(Word(u64::from_ne_bytes(w)))
        };
        core::sync::atomic::fence(core::sync::atomic::Ordering::Release);
        return;
    }
    // SAFETY: the caller's contract, passed on.
    unsafe { volatile_copy_in_any(dst, src) }
}

/// [`volatile_copy_in`] of any length and alignment.
///
/// # Safety
///
/// As [`volatile_copy_in`].
#[inline]
unsafe fn volatile_copy_in_any(dst: *mut u8, src: &[u8]) {
    let mut i = 0;
    while i < src.len() && (dst as usize + i) % 8 != 0 {
        // SAFETY: i < len, within the caller's valid range.
        unsafe { dst.add(i).write_volatile(src[i]) };
        i += 1;
    }
    while i + 8 <= src.len() {
        let mut w = [0u8; 8];
        w.copy_from_slice(&src[i..i + 8]);
        // SAFETY: in range and 8-byte aligned.
        unsafe {
            dst.add(i)
                .cast::<u64>()
                .write_volatile(u64::from_ne_bytes(w))
        };
        i += 8;
    }
    while i < src.len() {
        // SAFETY: i < len.
        unsafe { dst.add(i).write_volatile(src[i]) };
        i += 1;
    }
    core::sync::atomic::fence(core::sync::atomic::Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    #[test]
    fn copies_round_trip_at_every_alignment() {
        let mut backing = vec![0u64; 8];
        let base = backing.as_mut_ptr().cast::<u8>();
        for start in 0..8 {
            for len in 0..40 {
                let src: alloc::vec::Vec<u8> = (0..len as u8)
                    .map(|b| b.wrapping_mul(7) ^ start as u8)
                    .collect();
                let mut out = vec![0u8; len];
                // SAFETY: start + len <= 64 bytes of `backing`.
                unsafe {
                    volatile_copy_in(base.add(start), &src);
                    volatile_copy_out(base.add(start), &mut out);
                }
                assert_eq!(out, src);
            }
        }
    }

    #[test]
    fn ranges_are_checked_without_overflow() {
        assert!(check_range(0, 8, 8).is_ok());
        assert!(check_range(1, 8, 8).is_err());
        assert!(check_range(usize::MAX, 2, 8).is_err());
    }
}
