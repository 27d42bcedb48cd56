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

#[cfg(test)]
mod tests {
    use super::super::{Tlsf, TlsfConfig, TlsfError};

    /// A small node table: the invariant checks walk all of it, slowly
    /// under Miri.
    fn cached(capacity: u64, depth: u32) -> Tlsf {
        let config = TlsfConfig::new()
            .with_max_blocks(256)
            .with_front_cache(depth);
        Tlsf::new(capacity, config).unwrap()
    }

    fn checked(t: &Tlsf) {
        if let Err(e) = t.check_invariants() {
            panic!("invariant violated: {e}; {t:?}");
        }
    }

    #[test]
    fn a_freed_block_is_the_next_of_its_size_and_its_handle_goes_stale() {
        let mut t = cached(1 << 20, 4);
        let a = t.alloc(100, 8).unwrap();
        let keep = t.alloc(100, 8).unwrap();
        t.free(a.handle).unwrap();
        assert_eq!(t.stats().cached, 128);
        assert_eq!(t.stats().in_use, 128, "cached bytes are not in use");
        checked(&t);
        let b = t.alloc(65, 64).unwrap();
        assert_eq!(b.offset, a.offset, "the cached block, same granules");
        assert_ne!(b.handle, a.handle, "a new generation");
        assert_eq!(
            t.free(a.handle),
            Err(TlsfError::InvalidHandle { handle: a.handle })
        );
        t.free(b.handle).unwrap();
        assert_eq!(
            t.free(b.handle),
            Err(TlsfError::InvalidHandle { handle: b.handle }),
            "a double free into the cache is caught"
        );
        assert_eq!(t.alloc_count(), 1);
        t.free(keep.handle).unwrap();
        checked(&t);
        assert_eq!(t.stats().total_allocs, 3);
    }

    #[test]
    fn each_size_holds_at_most_depth_blocks() {
        let mut t = cached(1 << 20, 3);
        let v: Vec<_> = (0..5).map(|_| t.alloc(64, 64).unwrap()).collect();
        let w: Vec<_> = (0..2).map(|_| t.alloc(640, 64).unwrap()).collect();
        for a in v.iter().chain(&w) {
            t.free(a.handle).unwrap();
            checked(&t);
        }
        let s = t.stats();
        assert_eq!(s.cached, 3 * 64 + 2 * 640);
        assert_eq!((s.in_use, s.alloc_count), (0, 0));
        assert!(t.flush_cache());
        assert!(!t.flush_cache(), "nothing left");
        let s = t.stats();
        assert_eq!((s.cached, s.free_blocks, s.largest_free), (0, 1, 1 << 20));
        checked(&t);
    }

    #[test]
    fn exhaustion_merges_the_cache_back_first() {
        // Every granule allocated and freed: the cache holds some blocks
        // unmerged, yet the whole region can be had again.
        let mut t = cached(64 * 64, 8);
        let v: Vec<_> = (0..64).map(|_| t.alloc(64, 64).unwrap()).collect();
        assert!(t.alloc(1, 8).is_err());
        for a in &v {
            t.free(a.handle).unwrap();
        }
        assert_eq!(t.stats().cached, 8 * 64);
        let all = t.alloc(64 * 64, 4096).unwrap();
        assert_eq!((all.offset, t.stats().cached), (0, 0));
        checked(&t);
        t.free(all.handle).unwrap();
        // The same with the node table as the limit: cached blocks hold
        // slots, which a split needs.
        let mut t = Tlsf::new(
            1 << 20,
            TlsfConfig::new().with_max_blocks(9).with_front_cache(8),
        )
        .unwrap();
        let v: Vec<_> = (0..8).map(|i| t.alloc(64 * (i + 1), 64).unwrap()).collect();
        for a in &v {
            t.free(a.handle).unwrap();
        }
        assert_eq!(t.stats().free_blocks, 1);
        let a = t
            .alloc(64 * 9, 64)
            .expect("node slots taken back from the cache");
        assert_eq!(a.offset, 0);
        checked(&t);
    }

    #[test]
    fn a_live_block_is_never_handed_out_again() {
        // Hostile churn of one size around an allocation that is never
        // freed (a forgotten buffer): it stays out of every reuse.
        let mut t = cached(1 << 16, 4);
        let mut live = Vec::new();
        let kept = t.alloc(192, 64).unwrap();
        for i in 0..if cfg!(miri) { 200 } else { 5000 } {
            if live.len() > 6 || (i % 3 == 0 && !live.is_empty()) {
                let a: super::super::Allocation = live.swap_remove(i % live.len());
                t.free(a.handle).unwrap();
                assert!(t.free(a.handle).is_err(), "double free");
            } else {
                let a = t.alloc(192 - (i as u64 % 3) * 64, 64).unwrap();
                assert_ne!(a.offset, kept.offset, "a live block reissued");
                for b in &live {
                    assert_ne!(a.offset, b.offset);
                }
                live.push(a);
            }
            if i % 97 == 0 {
                checked(&t);
            }
        }
        checked(&t);
        assert_eq!(t.alloc_count(), live.len() as u64 + 1);
    }

    #[test]
    fn alignment_above_the_granule_skips_the_cache() {
        let mut t = cached(1 << 20, 4);
        let _pad = t.alloc(64, 64).unwrap();
        let a = t.alloc(64, 64).unwrap();
        assert_eq!(a.offset, 64);
        t.free(a.handle).unwrap();
        let b = t.alloc(64, 4096).unwrap();
        assert_eq!(b.offset % 4096, 0, "not the cached block at 64");
        assert_eq!(t.stats().cached, 64);
        checked(&t);
    }

    #[test]
    fn without_depth_nothing_is_cached() {
        let mut t = cached(1 << 20, 0);
        let a = t.alloc(64, 64).unwrap();
        t.free(a.handle).unwrap();
        let s = t.stats();
        assert_eq!((s.cached, s.free_blocks), (0, 1));
        checked(&t);
    }
}
