//! The allocator's state (the node table, the bins and their bitmaps) and
//! its public operations.

use alloc::vec::Vec;
use core::fmt;

use super::types::{invalid_config, invalid_handle, Allocation, Stats, TlsfConfig, TlsfError};
use super::types::{CACHE_CLASSES, MAX_BLOCKS_LIMIT, NIL, SL_COUNT, SL_LOG2};

/// What a node slot currently describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    /// Not a block: on the unused-slot stack (linked through `next_free`).
    Unused,
    /// A free block, on the list of its bin.
    Free,
    /// An allocated block.
    Used,
    /// A freed block held by the front cache (linked through `next_free`):
    /// free for the caller, allocated for the bins, so never merged.
    Cached,
}

/// A block descriptor, 40 bytes. Offsets and sizes are in granules. One
/// record per block rather than one array per field: every step of `alloc`
/// and `free` reads several fields of the same block, so this touches one
/// cache line per block where separate arrays would touch several.
#[derive(Debug, Clone, Copy)]
pub(super) struct Node {
    pub(super) offset: u64,
    pub(super) size: u64,
    pub(super) prev_phys: u32,
    pub(super) next_phys: u32,
    pub(super) prev_free: u32,
    pub(super) next_free: u32,
    /// The handle of this block while it is allocated: the generation in
    /// the bits above the index, then the block's own index while it is
    /// `Used`, and that index with every index bit flipped otherwise. So
    /// one comparison with a handle checks both that the block is live and
    /// that the handle is not stale, and allocating or freeing flips the
    /// index bits (freeing also advances the generation).
    pub(super) stamp: u32,
    /// The bin a free block is listed in (flat index, see [`bin_index`]),
    /// kept so that unlinking it need not recompute it.
    pub(super) bin: u16,
    pub(super) state: State,
}

impl Node {
    const UNUSED: Self = Self {
        offset: 0,
        size: 0,
        prev_phys: NIL,
        next_phys: NIL,
        prev_free: NIL,
        next_free: NIL,
        stamp: 0,
        bin: 0,
        state: State::Unused,
    };
}

/// The front cache's stack for one size (see `cache.rs`): its top block,
/// and how many more it may take.
#[derive(Debug, Clone, Copy)]
pub(super) struct CacheClass {
    pub(super) head: u32,
    /// Counting down rather than up saves the free path a load of the depth.
    pub(super) room: u32,
}

impl CacheClass {
    pub(super) const EMPTY: Self = Self { head: NIL, room: 0 };
}

/// Bin slots: `FL_COUNT * SL_COUNT` (976) rounded up to a power of two, so
/// that a masked index needs no bounds check.
pub(super) const BINS: usize = 1024;
/// First-level bitmap slots, likewise.
pub(super) const FL_SLOTS: usize = 64;

/// Flat bin (`fl * SL_COUNT + sl`) of a free block of `units` granules
/// (`units >= 1`). Without a branch: below 16 granules `s` is 0 and the bin
/// is `units` itself; above, `s` drops all but the leading one and the next
/// `SL_LOG2` bits.
#[inline(always)]
pub(super) fn bin_index(units: u64) -> usize {
    let s = u64::BITS - 1 - (units | SL_COUNT as u64).leading_zeros() - SL_LOG2;
    ((s as usize) << SL_LOG2) + (units >> s) as usize
}

/// First flat bin all of whose blocks hold `units` granules: `units` rounded
/// up to the next bin boundary. `None` if that rounding overflows.
#[inline(always)]
pub(super) fn search_index(units: u64) -> Option<usize> {
    let s = u64::BITS - 1 - (units | SL_COUNT as u64).leading_zeros() - SL_LOG2;
    units.checked_add((1u64 << s) - 1).map(bin_index)
}

/// Bin of a free block of `units` granules, as `(fl, sl)`.
#[cfg(test)]
pub(super) fn bin_of(units: u64) -> (usize, usize) {
    let b = bin_index(units);
    (b >> SL_LOG2, b & (SL_COUNT - 1))
}

/// [`search_index`] as `(fl, sl)`.
#[cfg(test)]
pub(super) fn search_bin(units: u64) -> Option<(usize, usize)> {
    search_index(units).map(|b| (b >> SL_LOG2, b & (SL_COUNT - 1)))
}

/// The TLSF offset allocator. See the [module documentation](crate::tlsf).
///
/// Single owner, no locking: use it directly from one thread (it is `Send`),
/// or through `SharedTlsf` (feature `std`) from many.
pub struct Tlsf {
    pub(super) nodes: Vec<Node>,
    /// Head of each bin's free list, by flat bin index (`NIL` past the last).
    pub(super) heads: [u32; BINS],
    /// Per first-level class, its non-empty bins (0 past the last class).
    pub(super) sl_bitmap: [u16; FL_SLOTS],
    /// The non-empty first-level classes.
    pub(super) fl_bitmap: u64,
    /// The front cache, by exact size in granules (class 0 is never used).
    pub(super) cache: [CacheClass; CACHE_CLASSES],
    /// Blocks each class may hold ([`TlsfConfig::front_cache`]).
    pub(super) cache_depth: u32,
    /// log2 of the granule.
    pub(super) shift: u32,
    /// Where the region starts, in granules ([`TlsfConfig::base`]): an
    /// alignment is of `base + offset`.
    pub(super) base_units: u64,
    /// Managed capacity in granules.
    pub(super) cap_units: u64,
    /// The bits of a handle that hold the node index: `2^k - 1` for the
    /// smallest `k >= 1` that covers `max_blocks - 1`.
    pub(super) index_mask: u32,
    pub(super) unused_head: u32,
    pub(super) unused_count: u32,
    /// Granules in blocks taken out of the bins: allocated or cached. The
    /// cache's push and pop leave it alone; `in_use` subtracts the cache.
    pub(super) taken_units: u64,
    /// Peak of `taken_units`.
    pub(super) high_water_units: u64,
    /// Blocks taken out of the bins, likewise.
    pub(super) taken: u64,
    pub(super) total_allocs: u64,
}

impl fmt::Debug for Tlsf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tlsf")
            .field("capacity", &self.capacity())
            .field("granule", &self.granule())
            .field("max_blocks", &self.max_blocks())
            .field("in_use", &self.in_use())
            .field("alloc_count", &self.alloc_count())
            .field("free_blocks", &self.free_block_count())
            .field("cached", &(self.cache_totals().1 << self.shift))
            .finish_non_exhaustive()
    }
}

impl Tlsf {
    /// Creates an allocator for a region of `capacity` bytes, all free.
    ///
    /// `capacity` is rounded down to a multiple of the granule. This is the
    /// only place that allocates (the node table, `max_blocks` entries of
    /// 40 bytes).
    ///
    /// # Errors
    ///
    /// [`TlsfError::InvalidConfig`] if the granule is not a power of two,
    /// `max_blocks` is 0 or above [`MAX_BLOCKS_LIMIT`], the capacity is
    /// smaller than one granule, or the node table cannot be allocated.
    pub fn new(capacity: u64, config: TlsfConfig) -> Result<Self, TlsfError> {
        if !config.granule.is_power_of_two() {
            return Err(invalid_config("granule must be a power of two"));
        }
        if config.max_blocks == 0 || config.max_blocks > MAX_BLOCKS_LIMIT {
            return Err(invalid_config("max_blocks must be in 1..=MAX_BLOCKS_LIMIT"));
        }
        let shift = config.granule.trailing_zeros();
        if config.base & (config.granule - 1) != 0 {
            return Err(invalid_config("base must be a multiple of the granule"));
        }
        let cap_units = capacity >> shift;
        if cap_units == 0 {
            return Err(invalid_config("capacity is smaller than one granule"));
        }
        let n = config.max_blocks as usize;
        let mut nodes = Vec::new();
        nodes
            .try_reserve_exact(n)
            .map_err(|_| invalid_config("cannot allocate the node table"))?;
        let index_bits = (u32::BITS - (config.max_blocks - 1).leading_zeros()).max(1);
        let index_mask = (1u32 << index_bits) - 1;
        for i in 0..n {
            let next = if i != 0 && i + 1 < n {
                (i + 1) as u32
            } else {
                NIL
            };
            nodes.push(Node {
                next_free: next,
                stamp: i as u32 ^ index_mask,
                ..Node::UNUSED
            });
        }
        let mut tlsf = Self {
            nodes,
            heads: [NIL; BINS],
            sl_bitmap: [0; FL_SLOTS],
            fl_bitmap: 0,
            cache: [CacheClass::EMPTY; CACHE_CLASSES],
            cache_depth: config.front_cache,
            shift,
            base_units: config.base >> shift,
            cap_units,
            index_mask,
            unused_head: if n > 1 { 1 } else { NIL },
            unused_count: config.max_blocks - 1,
            taken_units: 0,
            high_water_units: 0,
            taken: 0,
            total_allocs: 0,
        };
        tlsf.reset_cache();
        tlsf.push_free(0, cap_units);
        Ok(tlsf)
    }

    /// Managed capacity in bytes (a multiple of the granule).
    #[must_use]
    #[inline]
    pub fn capacity(&self) -> u64 {
        self.cap_units << self.shift
    }

    /// The granule in bytes.
    #[must_use]
    #[inline]
    pub fn granule(&self) -> u64 {
        1 << self.shift
    }

    /// Size of the node table.
    #[must_use]
    #[inline]
    pub fn max_blocks(&self) -> u32 {
        self.nodes.len() as u32
    }

    /// Bytes currently allocated (requests rounded up to the granule). O(1)
    /// without the front cache, else O([`CACHE_CLASSES`](super::CACHE_CLASSES)).
    #[must_use]
    #[inline]
    pub fn in_use(&self) -> u64 {
        (self.taken_units - self.cache_totals().1) << self.shift
    }

    /// Number of live allocations. O(1) without the front cache, else
    /// O([`CACHE_CLASSES`](super::CACHE_CLASSES)).
    #[must_use]
    #[inline]
    pub fn alloc_count(&self) -> u64 {
        self.taken - self.cache_totals().0
    }

    /// Reserves `size` bytes at an offset that is a multiple of `align`.
    ///
    /// `align` is a power of two; anything up to the granule is free of
    /// charge ([`DEFAULT_ALIGN`](super::DEFAULT_ALIGN) for buffers, 8 for atomics). The returned
    /// [`Allocation::len`] is `size`; the block behind it is `size` rounded
    /// up to the granule. O(1); no allocation, lock or system call.
    ///
    /// # Errors
    ///
    /// [`TlsfError::ZeroSize`], [`TlsfError::BadAlignment`],
    /// [`TlsfError::TooLarge`] (more than the capacity),
    /// [`TlsfError::OutOfMemory`] (no suitable free block now),
    /// [`TlsfError::OutOfNodes`] (node table full).
    #[inline(always)]
    pub fn alloc(&mut self, size: u64, align: u64) -> Result<Allocation, TlsfError> {
        // The fast path: 1..=capacity bytes at an alignment the granule
        // already gives (a power of two no larger than it), and a cached
        // block of the size, or a block and a node slot at hand. Anything
        // else, including every error, takes the slow path, which starts
        // over.
        // `size - 1` wraps for 0, and `(size - 1) >> shift < cap_units`
        // is `size <= capacity`.
        let whole = size.wrapping_sub(1) >> self.shift;
        if whole < self.cap_units
            && align.wrapping_sub(1) >> self.shift == 0
            && align & align.wrapping_sub(1) == 0
        {
            let units = whole + 1;
            if let Some(a) = self.cache_pop(units, size) {
                return Ok(a);
            }
            if let Some(idx) = self.find_block(units) {
                if let Some(a) = self.take_head(idx, units, size) {
                    return Ok(a);
                }
            }
        }
        self.alloc_slow(size, align)
    }

    /// The node-table slot of a live handle: an index below
    /// [`Tlsf::max_blocks`], unique among live allocations (callers keep
    /// per-allocation side tables indexed by it).
    #[inline]
    pub fn handle_slot(&self, handle: u32) -> usize {
        (handle & self.index_mask) as usize
    }

    /// Returns an allocation's range: to the front cache if its size's
    /// class has room, else to the free lists, merged with free physical
    /// neighbours. O(1).
    ///
    /// # Errors
    ///
    /// [`TlsfError::InvalidHandle`] if `handle` is not a live allocation:
    /// freed already (double free), stale, or never issued. Nothing changes
    /// then.
    #[inline(always)]
    pub fn free(&mut self, handle: u32) -> Result<(), TlsfError> {
        let idx = handle & self.index_mask;
        match self.nodes.get(idx as usize) {
            Some(n) if n.stamp == handle => {
                self.retire(idx);
                Ok(())
            }
            _ => Err(invalid_handle(handle)),
        }
    }

    /// [`free`](Self::free) by node slot ([`handle_slot`](Self::handle_slot))
    /// rather than handle, for a caller that keeps each live allocation's
    /// slot and frees it once (the arena's buffers): no generation to
    /// carry, and still nothing changes, with an error, unless the slot
    /// holds a live allocation.
    #[inline(always)]
    pub(crate) fn free_slot(&mut self, slot: u32) -> Result<(), TlsfError> {
        match self.nodes.get(slot as usize) {
            // Live: the stamp's index bits are the slot itself, not flipped.
            Some(n) if n.stamp & self.index_mask == slot => {
                self.retire(slot);
                Ok(())
            }
            _ => Err(invalid_handle(slot)),
        }
    }

    /// The rest of a free, of live block `idx`.
    #[inline(always)]
    fn retire(&mut self, idx: u32) {
        let mask = self.index_mask;
        let node = &mut self.nodes[idx as usize];
        // The next generation (the generation bits wrap), not live.
        node.stamp = node.stamp.wrapping_add(mask + 1) ^ mask;
        let size = node.size;
        let class = &mut self.cache[size as usize & (CACHE_CLASSES - 1)];
        if size < CACHE_CLASSES as u64 && class.room != 0 {
            class.room -= 1;
            node.state = State::Cached;
            node.next_free = class.head;
            class.head = idx;
            return;
        }
        self.release(idx);
    }

    /// Puts block `idx` (freed or cached, on no list) back in the bins,
    /// merged with its free physical neighbours.
    #[inline(always)]
    pub(super) fn release(&mut self, idx: u32) {
        let node = &self.nodes[idx as usize];
        let (mut size, prev, mut next) = (node.size, node.prev_phys, node.next_phys);
        self.taken_units -= size;
        self.taken -= 1;
        // Merge into the predecessor (which keeps its slot, so node 0 stays
        // the block at offset 0), then swallow the successor; each merged-away
        // slot goes back to the unused stack.
        let mut start = idx;
        if prev != NIL {
            let p = self.nodes[prev as usize];
            if p.state == State::Free {
                self.unlink(p.bin, p.prev_free, p.next_free);
                self.recycle(idx);
                size += p.size;
                start = prev;
            }
        }
        if next != NIL {
            let n = self.nodes[next as usize];
            if n.state == State::Free {
                self.unlink(n.bin, n.prev_free, n.next_free);
                self.recycle(next);
                size += n.size;
                next = n.next_phys;
            }
            if next != NIL {
                self.nodes[next as usize].prev_phys = start;
            }
        }
        self.nodes[start as usize].next_phys = next;
        self.push_free(start, size);
    }

    /// A snapshot of the accounting. O(1) except `largest_free`, which scans
    /// the highest non-empty bin.
    #[must_use]
    pub fn stats(&self) -> Stats {
        let (cached_blocks, cached_units) = self.cache_totals();
        let in_use = (self.taken_units - cached_units) << self.shift;
        Stats {
            capacity: self.capacity(),
            in_use,
            free: self.capacity() - in_use,
            largest_free: self.largest_free_units() << self.shift,
            high_water: self.high_water_units << self.shift,
            alloc_count: self.taken - cached_blocks,
            total_allocs: self.total_allocs,
            free_blocks: self.free_block_count(),
            cached: cached_units << self.shift,
        }
    }
}
