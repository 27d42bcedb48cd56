//! Full consistency check of a [`Tlsf`], for tests and debugging.

use super::allocator::{bin_index, State, Tlsf, BINS, FL_SLOTS};
use super::types::{FL_COUNT, NIL, SL_COUNT};

impl Tlsf {
    /// Verifies every structural invariant; O(`max_blocks`). For tests.
    ///
    /// Checks that the physical blocks are contiguous, start at offset 0 and
    /// cover the capacity exactly, with consistent neighbour links and no two
    /// adjacent free blocks; that every node slot is a block or on the unused
    /// stack; that each free block is on exactly the list of its size's bin
    /// and the bitmaps match the non-empty bins; that each cached block is on
    /// exactly the front cache's stack of its size; and that the counters
    /// (`in_use`, live allocations, free blocks, high water) are exact.
    ///
    /// # Errors
    ///
    /// A description of the first violated invariant.
    pub fn check_invariants(&self) -> Result<(), &'static str> {
        let n = self.nodes.len();

        // The unused-slot stack.
        let mut unused = 0u32;
        let mut i = self.unused_head;
        while i != NIL {
            let Some(node) = self.nodes.get(i as usize) else {
                return Err("unused stack index out of range");
            };
            if node.state != State::Unused {
                return Err("unused stack holds a live block");
            }
            if node.stamp & self.index_mask == i {
                return Err("an unused slot's stamp matches a handle");
            }
            unused += 1;
            if unused as usize > n {
                return Err("unused stack has a cycle");
            }
            i = node.next_free;
        }
        if unused != self.unused_count {
            return Err("unused_count does not match the unused stack");
        }
        // Every other slot is a block. The walk below visits distinct blocks
        // (offsets strictly increase), none unused, so reaching exactly this
        // many accounts for every slot.
        let blocks = (n - unused as usize) as u64;

        // Physical walk. Splits keep the front part's node and merges keep
        // the predecessor's, so node 0 is always the block at offset 0.
        let head = 0;
        if self.nodes[head as usize].prev_phys != NIL {
            return Err("node 0 has a physical predecessor");
        }
        let mut expect_offset = 0u64;
        let mut used_units = 0u64;
        let mut live = 0u64;
        let mut free_blocks = 0u64;
        let mut cached_blocks = 0u64;
        let mut cached_units = 0u64;
        let mut walked = 0u64;
        let mut prev = NIL;
        let mut prev_free = false;
        let mut i = head;
        while i != NIL {
            let Some(node) = self.nodes.get(i as usize) else {
                return Err("physical link out of range");
            };
            walked += 1;
            if walked > blocks {
                return Err("physical list has a cycle");
            }
            if node.state == State::Unused {
                return Err("physical list reaches an unused slot");
            }
            if node.prev_phys != prev {
                return Err("prev_phys does not match the walk");
            }
            if node.offset != expect_offset {
                return Err("blocks are not contiguous");
            }
            if node.size == 0 {
                return Err("zero-size block");
            }
            if (node.stamp & self.index_mask == i) != (node.state == State::Used) {
                return Err("a stamp's index bits disagree with the block's state");
            }
            expect_offset = node
                .offset
                .checked_add(node.size)
                .ok_or("block end overflows")?;
            if expect_offset > self.cap_units {
                return Err("block extends past the capacity");
            }
            let is_free = node.state == State::Free;
            if is_free {
                if prev_free {
                    return Err("two adjacent free blocks");
                }
                free_blocks += 1;
            } else if node.state == State::Cached {
                cached_blocks += 1;
                cached_units += node.size;
            } else {
                used_units += node.size;
                live += 1;
            }
            prev_free = is_free;
            prev = i;
            i = node.next_phys;
        }
        if walked != blocks {
            return Err("blocks unreachable from the first block");
        }
        if expect_offset != self.cap_units {
            return Err("blocks do not cover the capacity");
        }
        if used_units + cached_units != self.taken_units {
            return Err("taken units accounting is off");
        }
        if live + cached_blocks != self.taken {
            return Err("taken block count is off");
        }
        if (cached_blocks, cached_units) != self.cache_totals() {
            return Err("the cache's room disagrees with its blocks");
        }
        if free_blocks != self.free_block_count() {
            return Err("free block count is off");
        }
        if self.high_water_units < self.taken_units || self.high_water_units > self.cap_units {
            return Err("high water mark is off");
        }
        if self.total_allocs < live {
            return Err("total_allocs below the live count");
        }

        // Bins and bitmaps.
        if self.fl_bitmap >> FL_COUNT != 0 {
            return Err("first-level bitmap has bits past the last class");
        }
        if self.sl_bitmap[FL_COUNT..FL_SLOTS].iter().any(|&m| m != 0)
            || self.heads[FL_COUNT * SL_COUNT..BINS]
                .iter()
                .any(|&h| h != NIL)
        {
            return Err("bins past the last class are in use");
        }
        let mut listed = 0u64;
        for fl in 0..FL_COUNT {
            if (self.fl_bitmap >> fl & 1 == 1) != (self.sl_bitmap[fl] != 0) {
                return Err("first-level bitmap disagrees with second-level bitmap");
            }
            if self.sl_bitmap[fl] == 0 {
                if self.heads[fl * SL_COUNT..(fl + 1) * SL_COUNT] != [NIL; SL_COUNT] {
                    return Err("bin head set in an empty class");
                }
                continue;
            }
            for sl in 0..SL_COUNT {
                let head = self.heads[fl * SL_COUNT + sl];
                if (self.sl_bitmap[fl] >> sl & 1 == 1) != (head != NIL) {
                    return Err("second-level bitmap disagrees with bin head");
                }
                let mut prev = NIL;
                let mut i = head;
                while i != NIL {
                    let Some(node) = self.nodes.get(i as usize) else {
                        return Err("free link out of range");
                    };
                    listed += 1;
                    if listed > free_blocks {
                        return Err("free lists hold more entries than free blocks");
                    }
                    if node.state != State::Free {
                        return Err("free list holds a block that is not free");
                    }
                    if node.prev_free != prev {
                        return Err("prev_free does not match the list");
                    }
                    if bin_index(node.size) != fl * SL_COUNT + sl {
                        return Err("free block on the wrong bin");
                    }
                    if usize::from(node.bin) != fl * SL_COUNT + sl {
                        return Err("free block's recorded bin is not its list");
                    }
                    prev = i;
                    i = node.next_free;
                }
            }
        }
        if listed != free_blocks {
            return Err("free blocks missing from the free lists");
        }
        self.check_cache(cached_blocks)
    }
}
