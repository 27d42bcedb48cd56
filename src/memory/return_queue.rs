//! How dropped buffers get back to their arena: a multi-producer,
//! single-consumer queue of freed handles (Vyukov's intrusive queue), linked
//! through a fixed table indexed by the handle's allocator slot, which is
//! unique among live buffers, so a push never allocates.
//!
//! - A push (a buffer's drop, on any thread) is one atomic swap and three
//!   stores: wait-free, no retry loop.
//! - The owner takes entries with loads and plain stores only, so the
//!   arena's allocation does no atomic read-modify-write. Its position, the
//!   [`Cursor`], is its own, not shared.
//! - The entry the cursor stands on has been read but its handle not freed:
//!   freeing it would let the allocator hand its slot out again, and that
//!   buffer's drop would re-push an entry the queue still links from. So the
//!   last returned handle waits until another is returned, or until
//!   [`ReturnQueue::flush`] moves the cursor past it onto the table's extra
//!   entry (the stub) with one swap of its own: for statistics, for a retry
//!   after exhaustion, and when the arena is dropped.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU32, Ordering};

const NIL: u32 = u32::MAX;

pub(crate) struct ReturnQueue {
    /// The producers' end: the entry pushed last.
    last: AtomicU32,
    /// Per slot, then the stub.
    entries: Box<[Entry]>,
}

/// One slot's link and handle side by side: a push or a pop touches one
/// cache line and passes one bounds check per entry.
struct Entry {
    /// The entry pushed after this one.
    next: AtomicU32,
    /// The full handle (slot + generation) to free; unused in the stub.
    handle: AtomicU32,
}

/// The consumer's position, kept by the owner.
pub(crate) struct Cursor {
    /// The entry last taken (its handle not freed yet, unless the stub).
    at: u32,
    /// The stub is in the queue ahead of the cursor.
    stub_queued: bool,
}

impl ReturnQueue {
    /// A queue for `slots` slots, and its consumer's cursor.
    pub(crate) fn new(slots: usize) -> (ReturnQueue, Cursor) {
        let stub = slots as u32;
        let queue = ReturnQueue {
            last: AtomicU32::new(stub),
            entries: (0..=slots)
                .map(|_| Entry {
                    next: AtomicU32::new(NIL),
                    handle: AtomicU32::new(NIL),
                })
                .collect::<Vec<_>>()
                .into_boxed_slice(),
        };
        let cursor = Cursor {
            at: stub,
            stub_queued: false,
        };
        (queue, cursor)
    }

    fn stub(&self) -> u32 {
        self.entries.len() as u32 - 1
    }

    /// Queues a freed handle. Wait-free, allocation-free.
    #[inline]
    pub(crate) fn push(&self, handle: u32, slot: u32) {
        let entry = &self.entries[slot as usize];
        entry.handle.store(handle, Ordering::Relaxed);
        entry.next.store(NIL, Ordering::Relaxed);
        self.append(slot);
    }

    /// Appends entry `slot`, whose `next` the caller has just reset to
    /// `NIL`. The swap is AcqRel: Release so that the next producer, linking
    /// after this entry, writes its `next` after that reset; Acquire for the
    /// same with the previous producer.
    #[inline]
    fn append(&self, slot: u32) {
        let prev = self.last.swap(slot, Ordering::AcqRel);
        // Release: the stores before are visible to the consumer that reads
        // this link. Nothing of the queue is touched after it.
        self.entries[prev as usize]
            .next
            .store(slot, Ordering::Release);
    }

    /// Frees, through `free`, every handle returned since the last call but
    /// the newest (see the module docs). Loads and plain stores only.
    #[inline]
    pub(crate) fn drain(&self, cursor: &mut Cursor, mut free: impl FnMut(u32)) {
        while let Some(handle) = self.pop(cursor) {
            free(handle);
        }
    }

    /// The next handle to free, if one was returned after the entry the
    /// cursor stands on: one load when none was. Small enough to inline
    /// into the owner's allocation, where a loop around it frees inline.
    #[inline(always)]
    pub(crate) fn pop(&self, cursor: &mut Cursor) -> Option<u32> {
        let stub = self.stub();
        loop {
            let next = self.entries[cursor.at as usize]
                .next
                .load(Ordering::Acquire);
            if next == NIL {
                return None;
            }
            let done = core::mem::replace(&mut cursor.at, next);
            if next == stub {
                cursor.stub_queued = false;
            }
            if done != stub {
                return Some(self.entries[done as usize].handle.load(Ordering::Relaxed));
            }
        }
    }

    /// [`drain`](Self::drain), the newest handle included: queues the stub
    /// (one swap) and drains up to it. A drop still in the middle of its
    /// push on another thread is left for later.
    #[cold]
    pub(crate) fn flush(&self, cursor: &mut Cursor, mut free: impl FnMut(u32)) {
        // First onto the newest entry: a cursor on the stub may still have
        // one ahead of it.
        self.drain(cursor, &mut free);
        if cursor.at != self.stub() && !cursor.stub_queued {
            self.entries[self.stub() as usize]
                .next
                .store(NIL, Ordering::Relaxed);
            self.append(self.stub());
            cursor.stub_queued = true;
        }
        self.drain(cursor, &mut free);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A flush frees the newest handle also when the cursor stands on the
    /// stub (after an earlier flush) with one entry queued after it.
    #[test]
    fn a_flush_from_the_stub_frees_the_newest() {
        let (queue, mut cursor) = ReturnQueue::new(4);
        let mut freed = Vec::new();
        for round in 0..3u32 {
            queue.push(100 + round, 1);
            queue.flush(&mut cursor, |h| freed.push(h));
            assert_eq!(freed.last(), Some(&(100 + round)), "round {round}");
        }
        queue.push(7, 2);
        queue.push(8, 3);
        queue.drain(&mut cursor, |h| freed.push(h));
        assert_eq!(freed.last(), Some(&7), "a drain keeps the newest");
        queue.flush(&mut cursor, |h| freed.push(h));
        assert_eq!(freed, [100, 101, 102, 7, 8]);
    }

    #[test]
    fn pushes_from_many_threads_are_all_freed_once() {
        extern crate std;
        // Fewer under Miri, where every push is interpreted.
        const PER: u32 = if cfg!(miri) { 150 } else { 1000 };
        let (queue, mut cursor) = ReturnQueue::new(4 * PER as usize);
        let queue = std::sync::Arc::new(queue);
        let threads: Vec<_> = (0..4u32)
            .map(|t| {
                let s = queue.clone();
                std::thread::spawn(move || {
                    (0..PER).for_each(|i| s.push(100_000 + t * PER + i, t * PER + i))
                })
            })
            .collect();
        let mut seen = Vec::new();
        for t in threads {
            queue.drain(&mut cursor, |h| seen.push(h));
            t.join().unwrap();
        }
        queue.drain(&mut cursor, |h| seen.push(h));
        assert_eq!(
            seen.len(),
            4 * PER as usize - 1,
            "the newest waits for the next return"
        );
        queue.flush(&mut cursor, |h| seen.push(h));
        seen.sort_unstable();
        assert_eq!(seen, (0..4 * PER).map(|i| 100_000 + i).collect::<Vec<_>>());
    }

    #[test]
    fn slots_reissued_to_other_threads_come_back_once() {
        // As buffers travel: the owner issues slots to two threads, which
        // drop (push) them while the owner drains and reissues what it got
        // back with a new generation. Every issued handle returns once.
        extern crate std;
        use std::sync::mpsc;
        const SLOTS: u32 = 8;
        let rounds: u32 = if cfg!(miri) { 60 } else { 20_000 };
        let (queue, mut cursor) = ReturnQueue::new(SLOTS as usize);
        let queue = std::sync::Arc::new(queue);
        let (senders, threads): (Vec<_>, Vec<_>) = (0..2)
            .map(|_| {
                let (tx, rx) = mpsc::channel::<u32>();
                let q = queue.clone();
                let t = std::thread::spawn(move || {
                    for h in rx {
                        q.push(h, h % SLOTS);
                    }
                });
                (tx, t)
            })
            .unzip();
        let (mut issued, mut returned) = (0u32, Vec::new());
        let mut next_gen = [1u32; SLOTS as usize];
        let mut issue = |slot: u32, issued: &mut u32| {
            let h = next_gen[slot as usize] * SLOTS + slot;
            next_gen[slot as usize] += 1;
            *issued += 1;
            senders[(h % 2) as usize].send(h).unwrap();
        };
        for slot in 0..SLOTS {
            issue(slot, &mut issued);
        }
        let mut idle = 0;
        while issued < rounds {
            let mut got = Vec::new();
            queue.drain(&mut cursor, |h| got.push(h));
            idle = if got.is_empty() { idle + 1 } else { 0 };
            assert!(idle < 1_000_000, "returned handles went missing");
            for h in got {
                returned.push(h);
                if issued < rounds {
                    issue(h % SLOTS, &mut issued);
                }
            }
            std::thread::yield_now();
        }
        drop(senders);
        for t in threads {
            t.join().unwrap();
        }
        queue.flush(&mut cursor, |h| returned.push(h));
        assert_eq!(
            returned.len() as u32,
            issued,
            "every issued handle came back"
        );
        returned.sort_unstable();
        returned.dedup();
        assert_eq!(returned.len() as u32, issued, "none came back twice");
    }

    #[test]
    fn with_the_allocator_as_the_arena_uses_it() {
        // Drop = push; allocation = drain, allocate, and on failure flush
        // and retry: a window of live buffers replaced in random order.
        use crate::tlsf::{Tlsf, TlsfConfig};
        let live_max = 64u32;
        let mut tlsf = Tlsf::new(1 << 20, TlsfConfig::new().with_max_live(live_max + 1)).unwrap();
        let (queue, mut cursor) = ReturnQueue::new(tlsf.max_blocks() as usize);
        let alloc = |tlsf: &mut Tlsf, cursor: &mut Cursor, size: u64| {
            queue.drain(cursor, |h| tlsf.free(h).unwrap());
            let a = match tlsf.alloc(size, 64) {
                Ok(a) => a,
                Err(_) => {
                    queue.flush(cursor, |h| tlsf.free(h).unwrap());
                    tlsf.alloc(size, 64).unwrap()
                }
            };
            (a.handle, tlsf.handle_slot(a.handle) as u32)
        };
        let mut seed = 7u64;
        let mut rand = move || {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            seed >> 33
        };
        let mut live: Vec<_> = (0..live_max)
            .map(|_| alloc(&mut tlsf, &mut cursor, 8 + rand() % 8192))
            .collect();
        let steps = if cfg!(miri) { 300 } else { 100_000 };
        for _ in 0..steps {
            let i = (rand() % u64::from(live_max)) as usize;
            let (handle, slot) = live[i];
            queue.push(handle, slot);
            live[i] = alloc(&mut tlsf, &mut cursor, 8 + rand() % 8192);
        }
        for (handle, slot) in live {
            queue.push(handle, slot);
        }
        queue.flush(&mut cursor, |h| tlsf.free(h).unwrap());
        assert_eq!(tlsf.alloc_count(), 0, "everything came back");
        tlsf.check_invariants().unwrap();
    }

    #[test]
    fn slots_are_reused_after_their_handle_is_freed() {
        // The owner frees a handle, reallocates its slot, and the new
        // buffer comes back: every push is taken exactly once.
        let (queue, mut cursor) = ReturnQueue::new(3);
        let mut freed = Vec::new();
        let mut live = [0u32, 1, 2];
        let mut generation = 0;
        for round in 0..50u32 {
            let slot = round % 3;
            queue.push(live[slot as usize], slot);
            let mut got = Vec::new();
            if round % 7 == 6 {
                queue.flush(&mut cursor, |h| got.push(h));
            } else {
                queue.drain(&mut cursor, |h| got.push(h));
            }
            for h in got {
                // Reallocate the freed slot with a new generation.
                let s = (h & 3) as usize;
                generation += 4;
                live[s] = generation | s as u32;
                freed.push(h);
            }
        }
        queue.flush(&mut cursor, |h| freed.push(h));
        assert_eq!(freed.len(), 50);
        let mut unique = freed.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), 50, "no handle taken twice");
        let mut again = Vec::new();
        queue.flush(&mut cursor, |h| again.push(h));
        assert!(again.is_empty(), "a second flush finds nothing");
    }
}
