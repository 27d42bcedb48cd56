//! The block-level steps of the allocator: finding a block for a request,
//! splitting and placing it, the bins' free lists, the unused-slot stack,
//! and the slow path of `alloc` (errors, large alignments).

use super::allocator::{bin_index, search_index, State, Tlsf, BINS, FL_SLOTS};
use super::types::{
    bad_alignment, too_large, zero_size, Allocation, TlsfError, NIL, SL_COUNT, SL_LOG2,
};

impl Tlsf {
    /// Everything `alloc`'s fast path does not take: errors, alignments
    /// above the granule, exhaustion of blocks or node slots. Out of line,
    /// so that the fast path stays small enough to inline. Exhaustion is
    /// reported only with the front cache empty: its blocks are merged
    /// back and the request tried once more.
    #[cold]
    #[inline(never)]
    pub(super) fn alloc_slow(&mut self, size: u64, align: u64) -> Result<Allocation, TlsfError> {
        match self.alloc_uncached(size, align) {
            Err(TlsfError::OutOfMemory { .. } | TlsfError::OutOfNodes { .. })
                if self.flush_cache() =>
            {
                self.alloc_uncached(size, align)
            }
            r => r,
        }
    }

    /// The slow path without the front cache.
    fn alloc_uncached(&mut self, size: u64, align: u64) -> Result<Allocation, TlsfError> {
        if size == 0 {
            return Err(zero_size());
        }
        if !align.is_power_of_two() {
            return Err(bad_alignment(align));
        }
        if size > self.capacity() {
            return Err(too_large(size, self.capacity()));
        }
        let units = ((size - 1) >> self.shift) + 1;
        let idx = if align >> self.shift <= 1 {
            match self.find_block(units) {
                Some(idx) => self.place(idx, 0, units)?,
                None => return Err(self.out_of_memory(size)),
            }
        } else {
            self.alloc_aligned(size, units, align >> self.shift)?
        };
        let node = &self.nodes[idx as usize];
        Ok(Allocation {
            offset: node.offset << self.shift,
            len: size,
            handle: node.stamp,
        })
    }

    /// The aligned path: `align_units >= 2`.
    fn alloc_aligned(&mut self, size: u64, units: u64, align_units: u64) -> Result<u32, TlsfError> {
        // Any block of `units + align_units - 1` granules has an aligned start
        // with `units` granules after it.
        if let Some(padded) = units.checked_add(align_units - 1) {
            if let Some(idx) = self.find_block(padded) {
                if let Some(pad) = self.front_pad(idx, align_units) {
                    return self.place(idx, pad, units);
                }
            }
        }
        // Fallback: the block the unpadded search finds may happen to fit.
        if let Some(idx) = self.find_block(units) {
            if let Some(pad) = self.front_pad(idx, align_units) {
                if pad
                    .checked_add(units)
                    .is_some_and(|need| need <= self.nodes[idx as usize].size)
                {
                    return self.place(idx, pad, units);
                }
            }
        }
        Err(self.out_of_memory(size))
    }

    /// Granules from the start of block `idx` to its first address (the
    /// region's base plus the offset) that is a multiple of `align_units`;
    /// `None` if that overflows.
    fn front_pad(&self, idx: u32, align_units: u64) -> Option<u64> {
        let mask = align_units - 1;
        let at = self.nodes[idx as usize]
            .offset
            .checked_add(self.base_units & mask)?;
        at.checked_add(mask).map(|end| (end & !mask) - at)
    }

    /// A free block of at least `units` granules, always the head of its
    /// bin, O(1): the head of the request's own bin if it is large enough
    /// (the tightest fit on offer), else the head of the first non-empty bin
    /// at or above the request rounded up to a bin boundary, all of whose
    /// blocks fit.
    #[inline(always)]
    pub(super) fn find_block(&self, units: u64) -> Option<u32> {
        let head = self.heads[bin_index(units) & (BINS - 1)];
        if head != NIL && self.nodes[head as usize].size >= units {
            return Some(head);
        }
        let bin = search_index(units)?;
        let fl = bin >> SL_LOG2;
        let sl_map = u32::from(self.sl_bitmap[fl & (FL_SLOTS - 1)]) & (u32::MAX << (bin & 15));
        let bin = if sl_map != 0 {
            (fl << SL_LOG2) + sl_map.trailing_zeros() as usize
        } else {
            // `fl + 1 <= FL_COUNT < 64`: the shift is in range.
            let fl_map = self.fl_bitmap & (u64::MAX << (fl + 1));
            if fl_map == 0 {
                return None;
            }
            let fl = fl_map.trailing_zeros() as usize;
            let sl = self.sl_bitmap[fl & (FL_SLOTS - 1)].trailing_zeros() as usize;
            (fl << SL_LOG2) + sl
        };
        Some(self.heads[bin & (BINS - 1)])
    }

    /// The fast path's placement: `units` granules from the front of free
    /// block `idx`, the head of its bin, the tail going back to the free
    /// lists. `None`, changing nothing, if the tail needs a node slot and
    /// none is left.
    #[inline(always)]
    pub(super) fn take_head(&mut self, idx: u32, units: u64, size: u64) -> Option<Allocation> {
        let block = self.nodes[idx as usize];
        let rest = block.size - units;
        if rest != 0 && self.unused_head == NIL {
            return None;
        }
        self.unlink(block.bin, NIL, block.next_free);
        if rest != 0 {
            self.split_tail(idx, block.offset + units, rest, block.next_phys);
        }
        self.mark_used(idx, units);
        Some(Allocation {
            offset: block.offset << self.shift,
            len: size,
            handle: block.stamp ^ self.index_mask,
        })
    }

    /// Allocates `units` granules from free block `idx` after `pad` granules
    /// of front padding; padding and tail stay free. The front part keeps
    /// node `idx`, so node 0 is always the block at offset 0. Checks node
    /// slots before changing anything. Returns the allocated node.
    fn place(&mut self, idx: u32, pad: u64, units: u64) -> Result<u32, TlsfError> {
        let block = self.nodes[idx as usize];
        let rest = block.size - pad - units;
        let needed = u32::from(pad != 0) + u32::from(rest != 0);
        if needed > self.unused_count {
            return Err(self.out_of_nodes());
        }
        self.unlink(block.bin, block.prev_free, block.next_free);
        let used = if pad == 0 {
            idx
        } else {
            let a = self.take_slot();
            let node = &mut self.nodes[a as usize];
            node.offset = block.offset + pad;
            node.prev_phys = idx;
            node.next_phys = block.next_phys;
            if block.next_phys != NIL {
                self.nodes[block.next_phys as usize].prev_phys = a;
            }
            self.nodes[idx as usize].next_phys = a;
            self.push_free(idx, pad);
            a
        };
        if rest != 0 {
            self.split_tail(used, block.offset + pad + units, rest, block.next_phys);
        }
        self.mark_used(used, units);
        Ok(used)
    }

    /// Makes a free block of `rest` granules at `offset`, between block
    /// `used` and its old successor `next`. The caller has checked that a
    /// node slot is left.
    #[inline(always)]
    fn split_tail(&mut self, used: u32, offset: u64, rest: u64, next: u32) {
        let r = self.take_slot();
        let node = &mut self.nodes[r as usize];
        node.offset = offset;
        node.prev_phys = used;
        node.next_phys = next;
        if next != NIL {
            self.nodes[next as usize].prev_phys = r;
        }
        self.nodes[used as usize].next_phys = r;
        self.push_free(r, rest);
    }

    /// Marks block `idx` allocated with `units` granules, and counts it.
    #[inline(always)]
    fn mark_used(&mut self, idx: u32, units: u64) {
        let node = &mut self.nodes[idx as usize];
        node.size = units;
        node.state = State::Used;
        node.stamp ^= self.index_mask;
        self.taken_units += units;
        self.high_water_units = self.high_water_units.max(self.taken_units);
        self.taken += 1;
        self.total_allocs += 1;
    }

    /// Pops an unused slot; the caller has checked that one is left.
    #[inline(always)]
    fn take_slot(&mut self) -> u32 {
        let slot = self.unused_head;
        self.unused_head = self.nodes[slot as usize].next_free;
        self.unused_count -= 1;
        slot
    }

    /// Pushes slot `idx` (merged away) on the unused stack.
    #[inline(always)]
    pub(super) fn recycle(&mut self, idx: u32) {
        let node = &mut self.nodes[idx as usize];
        node.state = State::Unused;
        node.next_free = self.unused_head;
        self.unused_head = idx;
        self.unused_count += 1;
    }

    /// Makes node `idx` a free block of `size` granules and pushes it on the
    /// list of its bin (offset and physical links are the caller's).
    #[inline(always)]
    pub(super) fn push_free(&mut self, idx: u32, size: u64) {
        let bin = bin_index(size);
        let head = self.heads[bin & (BINS - 1)];
        let node = &mut self.nodes[idx as usize];
        node.size = size;
        node.bin = bin as u16;
        node.state = State::Free;
        node.prev_free = NIL;
        node.next_free = head;
        if head != NIL {
            self.nodes[head as usize].prev_free = idx;
        }
        self.heads[bin & (BINS - 1)] = idx;
        let fl = bin >> SL_LOG2;
        self.sl_bitmap[fl & (FL_SLOTS - 1)] |= 1 << (bin & (SL_COUNT - 1));
        self.fl_bitmap |= 1 << fl;
    }

    /// Unlinks a free block, given its bin and free-list neighbours, from
    /// the list of that bin.
    #[inline(always)]
    pub(super) fn unlink(&mut self, bin: u16, prev: u32, next: u32) {
        let bin = usize::from(bin);
        if prev != NIL {
            self.nodes[prev as usize].next_free = next;
        } else {
            self.heads[bin & (BINS - 1)] = next;
            if next == NIL {
                let fl = bin >> SL_LOG2;
                let sl_map = &mut self.sl_bitmap[fl & (FL_SLOTS - 1)];
                *sl_map &= !(1 << (bin & (SL_COUNT - 1)));
                if *sl_map == 0 {
                    self.fl_bitmap &= !(1 << fl);
                }
            }
        }
        if next != NIL {
            self.nodes[next as usize].prev_free = prev;
        }
    }

    /// Free blocks: every slot not on the unused stack is a block, and the
    /// blocks that are not free are the taken ones (allocated or cached).
    pub(super) fn free_block_count(&self) -> u64 {
        (self.nodes.len() as u64 - u64::from(self.unused_count)) - self.taken
    }

    /// Size in granules of the largest free block: the biggest block of the
    /// highest non-empty bin (a scan of that one list).
    pub(super) fn largest_free_units(&self) -> u64 {
        if self.fl_bitmap == 0 {
            return 0;
        }
        let fl = (u64::BITS - 1 - self.fl_bitmap.leading_zeros()) as usize;
        let sl = (u16::BITS - 1 - self.sl_bitmap[fl].leading_zeros()) as usize;
        let mut best = 0;
        let mut i = self.heads[(fl << SL_LOG2) + sl];
        // Bounded by the node table even if the lists were corrupt.
        for _ in 0..self.nodes.len() {
            if i == NIL {
                break;
            }
            let node = &self.nodes[i as usize];
            best = best.max(node.size);
            i = node.next_free;
        }
        best
    }

    #[cold]
    #[inline(never)]
    pub(super) fn out_of_memory(&self, requested: u64) -> TlsfError {
        TlsfError::OutOfMemory {
            requested,
            largest_free: self.largest_free_units() << self.shift,
        }
    }

    #[cold]
    #[inline(never)]
    fn out_of_nodes(&self) -> TlsfError {
        TlsfError::OutOfNodes {
            max_blocks: self.max_blocks(),
        }
    }
}
