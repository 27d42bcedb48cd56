//! The arena's allocator path, apart from its memory: the offset allocator
//! and the owner's end of the return queue. [`Arena`](super::Arena) runs
//! it over its registered region; [`ArenaModel`] runs the same code over
//! no memory at all, so that a host without an RDMA device can measure
//! and test what an arena's allocation and a buffer's drop execute.

use crate::tlsf::{Allocation, Tlsf, TlsfConfig, TlsfError};

use super::return_queue::{Cursor, ReturnQueue};

/// The allocator an arena of `capacity` bytes at address `base` for
/// `max_buffers` live buffers uses, with a front cache `front_cache` deep
/// per size.
pub(crate) fn arena_tlsf(
    capacity: u64,
    base: u64,
    max_buffers: u32,
    front_cache: u32,
) -> Result<Tlsf, TlsfError> {
    Tlsf::new(
        capacity,
        TlsfConfig::new()
            .with_base(base)
            .with_max_live(max_buffers)
            .with_front_cache(front_cache),
    )
}

/// The owner's side: the allocator and its place in the return queue.
pub(crate) struct Carver {
    pub(crate) tlsf: Tlsf,
    cursor: Cursor,
}

impl Carver {
    /// The owner's side of a new arena, and the queue its buffers return by.
    pub(crate) fn new(tlsf: Tlsf) -> (Carver, ReturnQueue) {
        let (queue, cursor) = ReturnQueue::new(tlsf.max_blocks() as usize);
        (Carver { tlsf, cursor }, queue)
    }

    /// Takes back what buffers dropped since the last call, then allocates.
    /// Exhaustion is reported only after every buffer dropped so far has
    /// been taken back. Inlined whole, like the allocator's fast path, so
    /// that the caller's allocation pays no call.
    #[inline(always)]
    pub(crate) fn alloc(
        &mut self,
        queue: &ReturnQueue,
        len: u64,
        align: u64,
    ) -> Result<Allocation, TlsfError> {
        self.reclaim(queue);
        match self.tlsf.alloc(len, align) {
            Ok(a) => Ok(a),
            Err(_) => self.alloc_after_flush(queue, len, align),
        }
    }

    /// The retry of a failed allocation, with the newest dropped buffer
    /// taken back too.
    #[cold]
    #[inline(never)]
    fn alloc_after_flush(
        &mut self,
        queue: &ReturnQueue,
        len: u64,
        align: u64,
    ) -> Result<Allocation, TlsfError> {
        self.flush(queue);
        self.tlsf.alloc(len, align)
    }

    /// Gives a live buffer's slot back on the owner's thread, no queue.
    #[inline]
    pub(crate) fn free(&mut self, slot: u32) {
        let freed = self.tlsf.free_slot(slot);
        debug_assert!(freed.is_ok(), "a buffer's slot is live");
    }

    /// Frees what buffers dropped (on any thread) since the last call, but
    /// the newest (see `return_queue`). One load when nothing came back;
    /// loads and plain stores only.
    #[inline(always)]
    fn reclaim(&mut self, queue: &ReturnQueue) {
        while let Some(slot) = queue.pop(&mut self.cursor) {
            let freed = self.tlsf.free_slot(slot);
            debug_assert!(freed.is_ok(), "a returned buffer's slot is live");
        }
    }

    /// As `reclaim`, the newest dropped buffer included (one atomic swap).
    pub(crate) fn flush(&mut self, queue: &ReturnQueue) {
        let tlsf = &mut self.tlsf;
        queue.flush(&mut self.cursor, |slot| {
            let freed = tlsf.free_slot(slot);
            debug_assert!(freed.is_ok(), "a returned buffer's slot is live");
        });
    }
}

/// An arena's allocator path without the arena's memory (and so without a
/// device), for benchmarks and host tests: [`ArenaModel::alloc`] is
/// `Arena::alloc_aligned` but the buffer, [`ArenaModel::drop_buf`] is an
/// `ArenaBuf`'s drop (its push onto the return queue, from any thread
/// that holds a shared reference).
#[doc(hidden)]
pub struct ArenaModel {
    carver: Carver,
    queue: ReturnQueue,
}

/// What an `ArenaBuf` holds of its allocation: its allocator slot. Not
/// `Copy`: like a buffer, it is dropped once.
#[doc(hidden)]
#[derive(Debug)]
pub struct ModelBuf {
    /// Offset in the (absent) region.
    pub offset: u64,
    /// Its block's allocator slot.
    slot: u32,
}

impl ArenaModel {
    /// The allocator path of an arena of `capacity` bytes with at most
    /// `max_buffers` buffers, front cache `front_cache` deep.
    ///
    /// # Errors
    ///
    /// As [`Tlsf::new`].
    pub fn new(capacity: u64, max_buffers: u32, front_cache: u32) -> Result<Self, TlsfError> {
        let (carver, queue) = Carver::new(arena_tlsf(capacity, 0, max_buffers, front_cache)?);
        Ok(ArenaModel { carver, queue })
    }

    /// As `Arena::alloc_aligned`.
    ///
    /// # Errors
    ///
    /// As [`Tlsf::alloc`].
    #[inline(always)]
    pub fn alloc(&mut self, len: usize, align: u64) -> Result<ModelBuf, TlsfError> {
        let a = self.carver.alloc(&self.queue, len as u64, align)?;
        Ok(ModelBuf {
            offset: a.offset,
            slot: self.carver.tlsf.handle_slot(a.handle) as u32,
        })
    }

    /// As an `ArenaBuf`'s drop: one atomic swap onto the return queue.
    #[inline]
    pub fn drop_buf(&self, buf: ModelBuf) {
        self.queue.push(buf.slot);
    }

    /// As `Arena::free`: back at once, no queue.
    #[inline]
    pub fn free(&mut self, buf: ModelBuf) {
        self.carver.free(buf.slot);
    }

    /// As `Arena::stats`: everything dropped taken back, the front cache
    /// merged back.
    pub fn stats(&mut self) -> crate::tlsf::Stats {
        self.carver.flush(&self.queue);
        self.carver.tlsf.flush_cache();
        self.carver.tlsf.stats()
    }

    /// Live buffers, without taking anything back.
    pub fn alloc_count(&self) -> u64 {
        self.carver.tlsf.alloc_count()
    }

    /// The allocator's own consistency check ([`Tlsf::check_invariants`]).
    ///
    /// # Errors
    ///
    /// As [`Tlsf::check_invariants`].
    pub fn check_invariants(&self) -> Result<(), &'static str> {
        self.carver.tlsf.check_invariants()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;

    /// Audit finding 5 on the host: the arena's allocator aligns the
    /// address (the region's base plus the offset), for regions that start
    /// on a page and no more (as `mmap` gives them), above a page as below;
    /// an empty region always has room for a buffer aligned to half of it.
    #[test]
    fn alignment_is_of_the_address_not_the_offset() {
        const CAPACITY: u64 = 8 << 20;
        let bases = [0x1000, 0x3000, 0x7f13_2587_d000, (2 << 20) + 0x1000];
        for base in bases {
            let (mut carver, queue) = Carver::new(arena_tlsf(CAPACITY, base, 64, 4).unwrap());
            for shift in 3..=22 {
                let align = 1u64 << shift;
                let a = carver.alloc(&queue, 100, align).expect("room for it");
                assert_eq!(
                    (base + a.offset) % align,
                    0,
                    "region at {base:#x}: offset {:#x} for alignment {align:#x}",
                    a.offset
                );
                assert!(a.offset + 100 <= CAPACITY);
                carver.free(carver.tlsf.handle_slot(a.handle) as u32);
            }
        }
    }

    /// The arena's path as a whole, cache on: buffers dropped (some on
    /// another thread), freed, or forgotten, replaced by random sizes; no
    /// range is ever handed out while its buffer lives (or is forgotten),
    /// and everything not forgotten comes back.
    #[test]
    fn no_live_or_forgotten_range_is_reissued() {
        extern crate std;
        let mut model = ArenaModel::new(1 << 20, 65, 4).unwrap();
        let mut seed = 11u64;
        let mut rand = move || {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            seed >> 33
        };
        let mut live: Vec<(ModelBuf, u64)> = Vec::new();
        let mut forgotten: Vec<(u64, u64)> = Vec::new();
        let overlaps = |a: (u64, u64), b: (u64, u64)| a.0 < b.0 + b.1 && b.0 < a.0 + a.1;
        let steps = if cfg!(miri) { 300 } else { 50_000 };
        for i in 0..steps {
            if live.len() >= 48 {
                let (buf, len) = live.swap_remove((rand() % 48) as usize);
                match rand() % 16 {
                    0 if forgotten.len() < 16 => forgotten.push((buf.offset, len)),
                    1..=7 => model.drop_buf(buf),
                    8 if i % 64 == 0 => std::thread::scope(|s| {
                        s.spawn(|| model.drop_buf(buf));
                    }),
                    _ => model.free(buf),
                }
            }
            let len = 1 + rand() % 8192;
            let buf = model.alloc(len as usize, 64).expect("room for 64 buffers");
            let range = (buf.offset, len);
            assert!(live.iter().all(|(b, l)| !overlaps(range, (b.offset, *l))));
            assert!(forgotten.iter().all(|&f| !overlaps(range, f)));
            live.push((buf, len));
            if i % 1000 == 0 {
                model.check_invariants().unwrap();
            }
        }
        let out = forgotten.len() as u64;
        for (buf, _) in live {
            model.drop_buf(buf);
        }
        let s = model.stats();
        assert_eq!((s.alloc_count, s.cached), (out, 0));
        model.check_invariants().unwrap();
    }

    /// Buffers dropped on other threads while the owner allocates: each
    /// holder claims its granules in a shared table on receipt and clears
    /// them before its drop, so a range reissued while held, or while
    /// forgotten (claimed for good), fails a claim.
    #[test]
    fn ranges_dropped_on_other_threads_are_reissued_only_after_their_drop() {
        extern crate std;
        use core::sync::atomic::{AtomicU32, Ordering};
        use std::sync::{mpsc, Arc};
        const GRANULE: u64 = 64;
        // Smaller under Miri, where every step is interpreted.
        const CAPACITY: u64 = if cfg!(miri) { 1 << 16 } else { 1 << 20 };
        const MAX_LEN: u64 = if cfg!(miri) { 512 } else { 8192 };
        let rounds: u32 = if cfg!(miri) { 40 } else { 20_000 };
        // Few buffers: allocations run out and retry after a flush while
        // holders push.
        let (mut carver, queue) = Carver::new(arena_tlsf(CAPACITY, 0, 12, 4).unwrap());
        let queue = Arc::new(queue);
        let owners: Arc<Vec<AtomicU32>> =
            Arc::new((0..CAPACITY / GRANULE).map(|_| AtomicU32::new(0)).collect());
        let claim = |owners: &[AtomicU32], offset: u64, len: u64, who: u32| {
            for g in offset / GRANULE..(offset + len).div_ceil(GRANULE) {
                let was = owners[g as usize].swap(who, Ordering::Relaxed);
                assert_eq!(was, 0, "granule {g} reissued while held by {was}");
            }
        };
        let (senders, threads): (Vec<_>, Vec<_>) = (1..=2u32)
            .map(|who| {
                let (tx, rx) = mpsc::channel::<(u64, u64, u32)>();
                let (q, owners) = (queue.clone(), owners.clone());
                let t = std::thread::spawn(move || {
                    for (offset, len, slot) in rx {
                        claim(&owners, offset, len, who);
                        std::thread::yield_now();
                        for g in offset / GRANULE..(offset + len).div_ceil(GRANULE) {
                            owners[g as usize].store(0, Ordering::Relaxed);
                        }
                        // The drop: Release, after the last use of the range.
                        q.push(slot);
                    }
                });
                (tx, t)
            })
            .unzip();
        let mut seed = 5u64;
        let mut rand = move || {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            seed >> 33
        };
        let mut forgotten = 0;
        for i in 0..rounds {
            let len = 1 + rand() % MAX_LEN;
            let mut waited = 0;
            let a = loop {
                match carver.alloc(&queue, len, 64) {
                    Ok(a) => break a,
                    // Everything is out with the holders: wait for a drop
                    // (a holder that failed a claim drops nothing more).
                    Err(_) => {
                        waited += 1;
                        assert!(waited < 1_000_000, "no drop came back");
                        std::thread::yield_now();
                    }
                }
            };
            let slot = carver.tlsf.handle_slot(a.handle) as u32;
            if i % 997 == 3 && forgotten < 4 {
                // Forgotten: claimed for good, never dropped.
                claim(&owners, a.offset, len, 3);
                forgotten += 1;
            } else {
                let sent = senders[(i % 2) as usize].send((a.offset, len, slot));
                assert!(sent.is_ok(), "a holder failed a claim");
            }
        }
        drop(senders);
        for t in threads {
            t.join().unwrap();
        }
        carver.flush(&queue);
        carver.tlsf.flush_cache();
        assert_eq!(
            carver.tlsf.alloc_count(),
            forgotten,
            "all but the forgotten back"
        );
        carver.tlsf.check_invariants().unwrap();
    }
}
