//! The front cache: per exact size, a short LIFO stack of freed blocks
//! kept out of the bins, so that a free followed by an allocation of the
//! same size is a push and a pop, with no search, split or merge.

use super::allocator::{State, Tlsf};
use super::types::{Allocation, CACHE_CLASSES, NIL};

impl Tlsf {
    /// A cached block of exactly `units` granules, allocated for a request of
    /// `size` bytes; `None`, changing nothing, if that class is empty (or
    /// there is none).
    #[inline(always)]
    pub(super) fn cache_pop(&mut self, units: u64, size: u64) -> Option<Allocation> {
        let class = &mut self.cache[units as usize & (CACHE_CLASSES - 1)];
        let idx = class.head;
        if units >= CACHE_CLASSES as u64 || idx == NIL {
            return None;
        }
        let node = self.nodes.get_mut(idx as usize)?;
        class.head = node.next_free;
        class.room += 1;
        node.state = State::Used;
        node.stamp ^= self.index_mask;
        // Taken all along: only the count of allocations moves.
        self.total_allocs += 1;
        Some(Allocation {
            offset: node.offset << self.shift,
            len: size,
            handle: node.stamp,
        })
    }

    /// Merges every block of the front cache back into the free lists.
    /// Returns whether there was any. O(cached blocks + classes).
    ///
    /// An allocation that would fail does this by itself before it reports
    /// the failure; call it to make [`Stats::largest_free`](super::Stats)
    /// and `free_blocks` describe all the free memory.
    pub fn flush_cache(&mut self) -> bool {
        let mut any = false;
        for class in 1..CACHE_CLASSES {
            let mut idx = self.cache[class].head;
            while idx != NIL {
                any = true;
                let next = self.nodes[idx as usize].next_free;
                self.release(idx);
                idx = next;
            }
        }
        self.reset_cache();
        any
    }

    /// Empties every class, with the configured room.
    pub(super) fn reset_cache(&mut self) {
        for (units, class) in self.cache.iter_mut().enumerate() {
            class.head = NIL;
            class.room = if units == 0 { 0 } else { self.cache_depth };
        }
    }

    /// `(blocks, granules)` held by the front cache, from the classes' room
    /// (every block of class `u` has `u` granules). O(classes).
    #[inline]
    pub(super) fn cache_totals(&self) -> (u64, u64) {
        if self.cache_depth == 0 {
            return (0, 0);
        }
        self.cache
            .iter()
            .enumerate()
            .skip(1)
            .fold((0, 0), |(blocks, units), (u, class)| {
                let n = u64::from(self.cache_depth - class.room);
                (blocks + n, units + n * u as u64)
            })
    }

    /// The front cache's part of [`Tlsf::check_invariants`]: each class's
    /// stack holds distinct cached blocks of its exact size, as many as its
    /// room says, and every cached block of the physical walk
    /// (`cached_blocks`) is on one.
    pub(super) fn check_cache(&self, cached_blocks: u64) -> Result<(), &'static str> {
        if self.cache[0].head != NIL || self.cache[0].room != 0 {
            return Err("cache class 0 is in use");
        }
        let mut listed = 0u64;
        for (units, class) in self.cache.iter().enumerate().skip(1) {
            if class.room > self.cache_depth {
                return Err("cache class has more room than its depth");
            }
            let mut count = 0u32;
            let mut i = class.head;
            while i != NIL {
                let Some(node) = self.nodes.get(i as usize) else {
                    return Err("cache link out of range");
                };
                count += 1;
                listed += 1;
                if listed > cached_blocks {
                    return Err("cache lists hold more entries than cached blocks");
                }
                if node.state != State::Cached {
                    return Err("cache list holds a block that is not cached");
                }
                if node.size != units as u64 {
                    return Err("cached block in the wrong class");
                }
                i = node.next_free;
            }
            if count + class.room != self.cache_depth {
                return Err("cache class count and room disagree");
            }
        }
        if listed != cached_blocks {
            return Err("cached blocks missing from the cache lists");
        }
        Ok(())
    }
}
