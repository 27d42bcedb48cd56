//! How dropped buffers get back to their arena: a multi-producer,
//! single-consumer queue of freed allocator slots (Vyukov's intrusive
//! queue), linked through a fixed table indexed by the slot, which is
//! unique among live buffers, so a push never allocates. The slot is all
//! the owner needs: its allocator knows the live block in each slot.
//!
//! - A push (a buffer's drop, on any thread) is one atomic swap and two
//!   stores: wait-free, no retry loop.
//! - The owner takes entries with loads and plain stores only, so the
//!   arena's allocation does no atomic read-modify-write. Its position, the
//!   [`Cursor`], is its own, not shared.
//! - The entry the cursor stands on has been read but its slot not freed:
//!   freeing it would let the allocator hand the slot out again, and that
//!   buffer's drop would re-push an entry the queue still links from. So the
//!   last returned slot waits until another is returned, or until
//!   [`ReturnQueue::flush`] moves the cursor past it onto the table's extra
//!   entry (the stub) with one swap of its own: for statistics, for a retry
//!   after exhaustion, and when the arena is dropped.
//! - Why a queue and its swap rather than a per-slot "returned" flag set
//!   with a plain store: the owner would have to sweep every slot's flag
//!   to find the returned ones, which costs `max_buffers` loads a sweep
//!   however few came back, and sweeping less often holds dropped buffers
//!   out of reuse for longer. The queue hands over each return in O(1).
//!
//! # Safety
//!
//! Every index the queue reads a link at is in the table, which has a
//! power-of-two length: a push masks its slot to the table, the stub is an
//! entry, and a link and the producers' end hold only those (or `NIL`,
//! which is never followed). So the table is indexed without bounds checks,
//! whatever slot a caller pushes: a wrong one can only confuse the queue,
//! never reach outside it.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU32, Ordering};

const NIL: u32 = u32::MAX;

pub(crate) struct ReturnQueue {
    /// The producers' end: the entry pushed last.
    last: AtomicU32,
    /// Per slot, then the stub, then unused entries up to a power of two:
    /// the entry pushed after it.
    next: Box<[AtomicU32]>,
    /// The table's length minus one: a pushed slot is masked with it.
    mask: u32,
}

/// The consumer's position, kept by the owner.
pub(crate) struct Cursor {
    /// The entry last taken (its slot not freed yet, unless the stub).
    at: u32,
    /// The stub's index, kept here so that a pop need not derive it.
    stub: u32,
    /// The stub is in the queue ahead of the cursor.
    stub_queued: bool,
}

impl ReturnQueue {
    /// A queue for `slots` slots, and its consumer's cursor.
    pub(crate) fn new(slots: usize) -> (ReturnQueue, Cursor) {
        let stub = slots as u32;
        let len = (slots + 1).next_power_of_two();
        let queue = ReturnQueue {
            last: AtomicU32::new(stub),
            next: (0..len)
                .map(|_| AtomicU32::new(NIL))
                .collect::<Vec<_>>()
                .into_boxed_slice(),
            mask: len as u32 - 1,
        };
        let cursor = Cursor {
            at: stub,
            stub,
            stub_queued: false,
        };
        (queue, cursor)
    }

    /// The table of links, its address read once (an atomic swap makes the
    /// compiler read a field of `self` again).
    #[inline(always)]
    fn links(&self) -> Links<'_> {
        Links(&self.next)
    }

    /// The link of entry `at` (see [`Links::at`]).
    #[inline(always)]
    fn link(&self, at: u32) -> &AtomicU32 {
        self.links().at(at)
    }

    /// Queues a freed slot. Wait-free, allocation-free.
    ///
    /// `slot` is below the `slots` the queue was made for (a live
    /// allocation's slot of the allocator the queue was sized by), and no
    /// other push of it is in the queue: only the one holder of a live
    /// slot pushes it, once, and the owner frees it only after taking it
    /// out (so a reissued slot's next push comes after). Otherwise the
    /// queue may lose or repeat entries, but it stays within its table.
    #[inline]
    pub(crate) fn push(&self, slot: u32) {
        let slot = slot & self.mask;
        let links = self.links();
        links.at(slot).store(NIL, Ordering::Relaxed);
        self.append(links, slot);
    }

    /// Appends entry `slot`, whose link the caller has just reset to `NIL`.
    /// The swap is AcqRel: Release so that the next producer, linking
    /// after this entry, writes its link after that reset; Acquire for the
    /// same with the previous producer.
    #[inline(always)]
    fn append(&self, links: Links<'_>, slot: u32) {
        let prev = self.last.swap(slot, Ordering::AcqRel);
        // Release: the stores before (the buffer's last use included) are
        // visible to the consumer that reads this link. Nothing of the
        // queue is touched after it.
        links.at(prev).store(slot, Ordering::Release);
    }

    /// Frees, through `free`, every slot returned since the last call but
    /// the newest (see the module docs). Loads and plain stores only.
    #[inline]
    pub(crate) fn drain(&self, cursor: &mut Cursor, mut free: impl FnMut(u32)) {
        while let Some(slot) = self.pop(cursor) {
            free(slot);
        }
    }

    /// The next slot to free, if one was returned after the entry the
    /// cursor stands on: one load when none was. Small enough to inline
    /// into the owner's allocation, where a loop around it frees inline.
    #[inline(always)]
    pub(crate) fn pop(&self, cursor: &mut Cursor) -> Option<u32> {
        let done = cursor.at;
        let next = self.link(done).load(Ordering::Acquire);
        if next == NIL {
            return None;
        }
        cursor.at = next;
        if done == cursor.stub {
            return self.pop_past_stub(cursor);
        }
        Some(done)
    }

    /// [`pop`](Self::pop) once the cursor has left the stub, which was
    /// queued by a flush: the next entry, if any, is a slot.
    #[cold]
    #[inline(never)]
    fn pop_past_stub(&self, cursor: &mut Cursor) -> Option<u32> {
        cursor.stub_queued = false;
        self.pop(cursor)
    }

    /// [`drain`](Self::drain), the newest slot included: queues the stub
    /// (one swap) and drains up to it. A drop still in the middle of its
    /// push on another thread is left for later.
    #[cold]
    pub(crate) fn flush(&self, cursor: &mut Cursor, mut free: impl FnMut(u32)) {
        // First onto the newest entry: a cursor on the stub may still have
        // one ahead of it.
        self.drain(cursor, &mut free);
        if cursor.at != cursor.stub && !cursor.stub_queued {
            self.link(cursor.stub).store(NIL, Ordering::Relaxed);
            self.append(self.links(), cursor.stub);
            cursor.stub_queued = true;
        }
        self.drain(cursor, &mut free);
    }
}

/// A queue's table of links (only ever made from one, by `links`).
#[derive(Clone, Copy)]
struct Links<'a>(&'a [AtomicU32]);

impl<'a> Links<'a> {
    /// The link of entry `at`: a slot masked by `push`, the stub, or a
    /// value read from a link or the producers' end, which hold only those.
    #[inline(always)]
    fn at(self, at: u32) -> &'a AtomicU32 {
        debug_assert!((at as usize) < self.0.len(), "entry {at} out of the table");
        // SAFETY: `at <= mask < len` (the module's `# Safety`: `push` masks
        // every slot it stores, `new` makes the stub an entry and `mask` the
        // table's length minus one, and no other value is ever stored in a
        // link or `last`).
        unsafe { self.0.get_unchecked(at as usize) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A flush frees the newest slot also when the cursor stands on the
    /// stub (after an earlier flush) with one entry queued after it.
    #[test]
    fn a_flush_from_the_stub_frees_the_newest() {
        let (queue, mut cursor) = ReturnQueue::new(4);
        let mut freed = Vec::new();
        for _ in 0..3 {
            queue.push(1);
            queue.flush(&mut cursor, |s| freed.push(s));
            assert_eq!(freed.last(), Some(&1));
        }
        queue.push(2);
        queue.push(3);
        queue.drain(&mut cursor, |s| freed.push(s));
        assert_eq!(freed.last(), Some(&2), "a drain keeps the newest");
        queue.flush(&mut cursor, |s| freed.push(s));
        assert_eq!(freed, [1, 1, 1, 2, 3]);
        // A drop between two flushes, and one after: each taken once.
        queue.push(0);
        queue.drain(&mut cursor, |s| freed.push(s));
        queue.push(2);
        queue.flush(&mut cursor, |s| freed.push(s));
        queue.flush(&mut cursor, |s| freed.push(s));
        assert_eq!(freed, [1, 1, 1, 2, 3, 0, 2]);
    }

    #[test]
    fn a_wrong_slot_stays_in_the_table() {
        // Slots beyond the queue's (a caller's bug) land on entries of the
        // table, whatever they are: Miri checks every access.
        let (queue, mut cursor) = ReturnQueue::new(5);
        for slot in [u32::MAX, 6, 1 << 20] {
            queue.push(slot);
        }
        let mut got = Vec::new();
        queue.flush(&mut cursor, |s| got.push(s));
        assert!(got.iter().all(|&s| s <= queue.mask), "{got:?}");
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
                let q = queue.clone();
                std::thread::spawn(move || (0..PER).for_each(|i| q.push(t * PER + i)))
            })
            .collect();
        let mut seen = Vec::new();
        for t in threads {
            queue.drain(&mut cursor, |s| seen.push(s));
            t.join().unwrap();
        }
        queue.drain(&mut cursor, |s| seen.push(s));
        assert_eq!(
            seen.len(),
            4 * PER as usize - 1,
            "the newest waits for the next return"
        );
        queue.flush(&mut cursor, |s| seen.push(s));
        seen.sort_unstable();
        assert_eq!(seen, (0..4 * PER).collect::<Vec<_>>());
    }

    #[test]
    fn slots_reissued_to_other_threads_come_back_once() {
        // As buffers travel: the owner issues slots to two threads, which
        // drop (push) them while the owner drains and reissues what it got
        // back. Every issue returns once, and no slot comes back while it
        // is out of the owner's hands only once.
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
                    for slot in rx {
                        q.push(slot);
                    }
                });
                (tx, t)
            })
            .unzip();
        let (mut issued, mut returned) = (0u32, 0u32);
        let mut out = [false; SLOTS as usize];
        let issue = |slot: u32, issued: &mut u32, out: &mut [bool]| {
            assert!(!out[slot as usize], "slot {slot} issued twice");
            out[slot as usize] = true;
            *issued += 1;
            senders[(*issued % 2) as usize].send(slot).unwrap();
        };
        for slot in 0..SLOTS {
            issue(slot, &mut issued, &mut out);
        }
        let mut idle = 0;
        while issued < rounds {
            let mut got = Vec::new();
            queue.drain(&mut cursor, |s| got.push(s));
            idle = if got.is_empty() { idle + 1 } else { 0 };
            assert!(idle < 1_000_000, "returned slots went missing");
            for slot in got {
                assert!(out[slot as usize], "slot {slot} returned twice");
                out[slot as usize] = false;
                returned += 1;
                if issued < rounds {
                    issue(slot, &mut issued, &mut out);
                }
            }
            std::thread::yield_now();
        }
        drop(senders);
        for t in threads {
            t.join().unwrap();
        }
        queue.flush(&mut cursor, |slot| {
            assert!(out[slot as usize], "slot {slot} returned twice");
            out[slot as usize] = false;
            returned += 1;
        });
        assert_eq!(returned, issued, "every issued slot came back");
        assert!(out.iter().all(|o| !o), "none is still out");
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
            queue.drain(cursor, |s| tlsf.free_slot(s).unwrap());
            let a = match tlsf.alloc(size, 64) {
                Ok(a) => a,
                Err(_) => {
                    queue.flush(cursor, |s| tlsf.free_slot(s).unwrap());
                    tlsf.alloc(size, 64).unwrap()
                }
            };
            tlsf.handle_slot(a.handle) as u32
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
            queue.push(live[i]);
            live[i] = alloc(&mut tlsf, &mut cursor, 8 + rand() % 8192);
        }
        for slot in live {
            queue.push(slot);
        }
        queue.flush(&mut cursor, |s| tlsf.free_slot(s).unwrap());
        assert_eq!(tlsf.alloc_count(), 0, "everything came back");
        tlsf.check_invariants().unwrap();
    }

    #[test]
    fn slots_are_reused_after_they_are_taken() {
        // The owner takes a slot back and reissues it at once, and the
        // new buffer comes back: every push is taken exactly once.
        let (queue, mut cursor) = ReturnQueue::new(3);
        let (mut pushed, mut taken) = (0, 0);
        // Per slot: held by a buffer (true) or in the queue.
        let mut held = [true; 3];
        let mut take = |s: u32, held: &mut [bool; 3]| {
            assert!(!held[s as usize], "slot {s} taken while held");
            held[s as usize] = true;
            taken += 1;
        };
        for round in 0..50u32 {
            let slot = round % 3;
            if held[slot as usize] {
                held[slot as usize] = false;
                queue.push(slot);
                pushed += 1;
            }
            if round % 7 == 6 {
                queue.flush(&mut cursor, |s| take(s, &mut held));
            } else {
                queue.drain(&mut cursor, |s| take(s, &mut held));
            }
        }
        queue.flush(&mut cursor, |s| take(s, &mut held));
        queue.flush(&mut cursor, |s| take(s, &mut held));
        assert_eq!(
            taken, pushed,
            "each push taken once, a second flush finds nothing"
        );
    }
}
