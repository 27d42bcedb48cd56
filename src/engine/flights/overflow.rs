//! The overflow table: the buffers after the first of a request of
//! several, one entry per such request (see `flights`). Reserved when the
//! first queue pair granted more than one scatter/gather entry is added,
//! it never grows after that; released entries are reused first.

use alloc::vec::Vec;

use crate::engine::ring::NONE;
use crate::sgl::Rest;

/// A request's buffers after its first.
struct Overflow<B> {
    next: u32,
    bufs: Rest<B>,
}

/// The entries, and the released ones linked through `next`.
pub(crate) struct OverflowTable<B> {
    entries: Vec<Overflow<B>>,
    free: u32,
}

impl<B> OverflowTable<B> {
    pub(super) fn new() -> OverflowTable<B> {
        OverflowTable {
            entries: Vec::new(),
            free: NONE,
        }
    }

    /// Room for `want` entries (setup time).
    pub(super) fn reserve(&mut self, want: usize) {
        if self.entries.capacity() < want {
            self.entries.reserve_exact(want - self.entries.len());
        }
    }

    /// Moves a request's buffers after its first into an entry: by
    /// exception, within the room `reserve` made (a request of several
    /// buffers posts only on a queue pair granted them).
    #[cold]
    #[inline(never)]
    pub(super) fn spill(&mut self, rest: Rest<B>) -> u32 {
        let e = self.free;
        if let Some(o) = self.entries.get_mut(e as usize) {
            self.free = o.next;
            core::mem::forget(core::mem::replace(&mut o.bufs, rest));
            return e;
        }
        debug_assert!(self.entries.len() < self.entries.capacity());
        self.entries.push(Overflow {
            next: NONE,
            bufs: rest,
        });
        (self.entries.len() - 1) as u32
    }

    /// The buffers entry `e` kept, and the entry released.
    #[cold]
    #[inline(never)]
    pub(super) fn unspill(&mut self, e: u32) -> Rest<B> {
        let o = &mut self.entries[e as usize];
        let rest = core::mem::take(&mut o.bufs);
        o.next = self.free;
        self.free = e;
        rest
    }

    /// Takes the first buffer entry `e` still holds.
    #[cold]
    #[inline(never)]
    pub(super) fn take_one(&mut self, e: u32) -> Option<B> {
        let o = self.entries.get_mut(e as usize)?;
        o.bufs.iter_mut().find_map(Option::take).map(|l| l.buf)
    }

    /// Leaks the buffers entry `e` (if any) holds, the entry kept taken:
    /// the device may still use them.
    pub(super) fn leak(&mut self, e: u32) {
        if let Some(o) = self.entries.get_mut(e as usize) {
            core::mem::forget(core::mem::take(&mut o.bufs));
        }
    }
}
