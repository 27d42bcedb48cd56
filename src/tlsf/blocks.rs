//! The block-level steps of the allocator: finding a block for a request,
//! splitting and placing it, merging freed neighbours, the bins' free lists.

use super::allocator::{bin_of, search_bin, Node, State, Tlsf};
use super::types::{TlsfError, NIL};

impl Tlsf {
    /// The aligned path: `align_units >= 2`.
    #[inline]
    pub(super) fn alloc_aligned(
        &mut self,
        size: u64,
        units: u64,
        align_units: u64,
    ) -> Result<u32, TlsfError> {
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

    /// Granules from the start of block `idx` to its first multiple of
    /// `align_units`; `None` if that overflows.
    #[inline]
    pub(super) fn front_pad(&self, idx: u32, align_units: u64) -> Option<u64> {
        let offset = self.nodes[idx as usize].offset;
        let mask = align_units - 1;
        offset.checked_add(mask).map(|end| (end & !mask) - offset)
    }

    /// A free block of at least `units` granules, O(1): the head of the
    /// request's own bin if it is large enough (the tightest fit on offer),
    /// else the head of the first non-empty bin at or above the request
    /// rounded up to a bin boundary, all of whose blocks fit.
    #[inline]
    pub(super) fn find_block(&self, units: u64) -> Option<u32> {
        let (fl, sl) = bin_of(units);
        let head = self.heads[fl][sl];
        if head != NIL && self.nodes[head as usize].size >= units {
            return Some(head);
        }
        if let Some((fl, sl)) = search_bin(units) {
            let sl_map = u32::from(self.sl_bitmap[fl]) & (u32::MAX << sl);
            if sl_map != 0 {
                return Some(self.heads[fl][sl_map.trailing_zeros() as usize]);
            }
            let fl_map = self.fl_bitmap & (u64::MAX << (fl + 1));
            if fl_map != 0 {
                let fl = fl_map.trailing_zeros() as usize;
                let sl = self.sl_bitmap[fl].trailing_zeros() as usize;
                return Some(self.heads[fl][sl]);
            }
        }
        None
    }

    /// Allocates `units` granules from free block `idx` after `pad` granules
    /// of front padding; padding and tail stay free. The front part keeps
    /// node `idx`, so node 0 is always the block at offset 0. Checks node
    /// slots before changing anything. Returns the allocated node.
    #[inline]
    pub(super) fn place(&mut self, idx: u32, pad: u64, units: u64) -> Result<u32, TlsfError> {
        let block = self.nodes[idx as usize];
        let rest = block.size - pad - units;
        let needed = u32::from(pad != 0) + u32::from(rest != 0);
        if needed > self.unused_count {
            return Err(self.out_of_nodes());
        }
        self.remove_free(idx);
        let used = if pad == 0 {
            idx
        } else {
            let a = self.take_slot();
            self.nodes[a as usize] = Node {
                offset: block.offset + pad,
                prev_phys: idx,
                next_phys: block.next_phys,
                ..self.nodes[a as usize]
            };
            if block.next_phys != NIL {
                self.nodes[block.next_phys as usize].prev_phys = a;
            }
            let front = &mut self.nodes[idx as usize];
            front.size = pad;
            front.next_phys = a;
            self.insert_free(idx);
            a
        };
        if rest != 0 {
            let r = self.take_slot();
            self.nodes[r as usize] = Node {
                offset: block.offset + pad + units,
                size: rest,
                prev_phys: used,
                next_phys: block.next_phys,
                state: State::Free,
                ..self.nodes[r as usize]
            };
            if block.next_phys != NIL {
                self.nodes[block.next_phys as usize].prev_phys = r;
            }
            self.nodes[used as usize].next_phys = r;
            self.insert_free(r);
        }
        let node = &mut self.nodes[used as usize];
        node.size = units;
        node.state = State::Used;
        self.used_units += units;
        self.high_water_units = self.high_water_units.max(self.used_units);
        self.live += 1;
        self.total_allocs += 1;
        Ok(used)
    }

    /// Merges block `next` (free, already off its list) into its physical
    /// predecessor `keep` and recycles `next`'s slot.
    #[inline]
    pub(super) fn absorb_next(&mut self, keep: u32, next: u32) {
        let gone = self.nodes[next as usize];
        let node = &mut self.nodes[keep as usize];
        node.size += gone.size;
        node.next_phys = gone.next_phys;
        if gone.next_phys != NIL {
            self.nodes[gone.next_phys as usize].prev_phys = keep;
        }
        let slot = &mut self.nodes[next as usize];
        slot.state = State::Unused;
        slot.prev_phys = NIL;
        slot.next_phys = NIL;
        slot.prev_free = NIL;
        slot.next_free = self.unused_head;
        self.unused_head = next;
        self.unused_count += 1;
    }

    /// Pops an unused slot; the caller has checked `unused_count`.
    #[inline]
    pub(super) fn take_slot(&mut self) -> u32 {
        let slot = self.unused_head;
        self.unused_head = self.nodes[slot as usize].next_free;
        self.unused_count -= 1;
        slot
    }

    /// Pushes free block `idx` on the list of its bin.
    #[inline]
    pub(super) fn insert_free(&mut self, idx: u32) {
        let (fl, sl) = bin_of(self.nodes[idx as usize].size);
        let head = self.heads[fl][sl];
        let node = &mut self.nodes[idx as usize];
        node.prev_free = NIL;
        node.next_free = head;
        if head != NIL {
            self.nodes[head as usize].prev_free = idx;
        }
        self.heads[fl][sl] = idx;
        self.sl_bitmap[fl] |= 1 << sl;
        self.fl_bitmap |= 1 << fl;
        self.free_blocks += 1;
    }

    /// Unlinks free block `idx` from the list of its bin.
    #[inline]
    pub(super) fn remove_free(&mut self, idx: u32) {
        let node = self.nodes[idx as usize];
        let (fl, sl) = bin_of(node.size);
        if node.prev_free != NIL {
            self.nodes[node.prev_free as usize].next_free = node.next_free;
        } else {
            self.heads[fl][sl] = node.next_free;
            if node.next_free == NIL {
                self.sl_bitmap[fl] &= !(1 << sl);
                if self.sl_bitmap[fl] == 0 {
                    self.fl_bitmap &= !(1 << fl);
                }
            }
        }
        if node.next_free != NIL {
            self.nodes[node.next_free as usize].prev_free = node.prev_free;
        }
        self.free_blocks -= 1;
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
        let mut i = self.heads[fl][sl];
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
    pub(super) fn out_of_nodes(&self) -> TlsfError {
        TlsfError::OutOfNodes {
            max_blocks: self.max_blocks(),
        }
    }
}
