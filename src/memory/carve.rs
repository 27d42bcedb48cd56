//! The arena's allocator path, apart from its memory: the offset allocator
//! and the owner's end of the return queue. [`Arena`](super::Arena) runs
//! it over its registered region; [`ArenaModel`] runs the same code over
//! no memory at all, so that a host without an RDMA device can measure
//! and test what an arena's allocation and a buffer's drop execute.

use crate::tlsf::{Allocation, Tlsf, TlsfConfig, TlsfError};

use super::return_queue::{Cursor, ReturnQueue};

/// The allocator an arena of `capacity` bytes for `max_buffers` live
/// buffers uses, with a front cache `front_cache` deep per size.
pub(crate) fn arena_tlsf(
    capacity: u64,
    max_buffers: u32,
    front_cache: u32,
) -> Result<Tlsf, TlsfError> {
    Tlsf::new(
        capacity,
        TlsfConfig::new()
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
    /// Live allocator slot of the model's own allocator, held by this value
    /// alone (set only by `ArenaModel::alloc`).
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
        let (carver, queue) = Carver::new(arena_tlsf(capacity, max_buffers, front_cache)?);
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
    /// Unlike a buffer, which knows its arena, a `ModelBuf` could come from
    /// another model: one comparison keeps its slot in this model's table
    /// (such a buffer is a caller's bug, and it is dropped unqueued).
    #[inline]
    pub fn drop_buf(&self, buf: ModelBuf) {
        if buf.slot < self.carver.tlsf.max_blocks() {
            // SAFETY: the slot is below the node table's size, which sized
            // the queue, and `buf`, moved in here, was its one holder (set by
            // `alloc`; the field is private).
            unsafe { self.queue.push(buf.slot) }
        }
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
}
