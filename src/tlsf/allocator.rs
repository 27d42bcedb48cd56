//! The allocator's state (the node table, the bins and their bitmaps) and
//! its public operations.

use alloc::vec::Vec;
use core::fmt;

use super::types::{
    bad_alignment, invalid_config, invalid_handle, too_large, zero_size, Allocation, Stats,
    TlsfConfig, TlsfError,
};
use super::types::{FL_COUNT, MAX_BLOCKS_LIMIT, NIL, SL_COUNT, SL_LOG2};

/// What a node slot currently describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    /// Not a block: on the unused-slot stack (linked through `next_free`).
    Unused,
    /// A free block, on the list of its bin.
    Free,
    /// An allocated block.
    Used,
}

/// A block descriptor. Offsets and sizes are in granules.
#[derive(Debug, Clone, Copy)]
pub(super) struct Node {
    pub(super) offset: u64,
    pub(super) size: u64,
    pub(super) prev_phys: u32,
    pub(super) next_phys: u32,
    pub(super) prev_free: u32,
    pub(super) next_free: u32,
    pub(super) generation: u32,
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
        generation: 0,
        state: State::Unused,
    };
}

/// Bin of a free block of `units` granules (`units >= 1`).
#[inline]
pub(super) fn bin_of(units: u64) -> (usize, usize) {
    if units < SL_COUNT as u64 {
        (0, units as usize)
    } else {
        let log = u64::BITS - 1 - units.leading_zeros();
        let sl = (units >> (log - SL_LOG2)) as usize - SL_COUNT;
        ((log - SL_LOG2 + 1) as usize, sl)
    }
}

/// First bin all of whose blocks hold `units` granules: `units` rounded up to
/// the next bin boundary. `None` if that rounding overflows.
#[inline]
pub(super) fn search_bin(units: u64) -> Option<(usize, usize)> {
    if units < SL_COUNT as u64 {
        return Some((0, units as usize));
    }
    let log = u64::BITS - 1 - units.leading_zeros();
    let round = (1u64 << (log - SL_LOG2)) - 1;
    units.checked_add(round).map(bin_of)
}

/// The TLSF offset allocator. See the [module documentation](crate::tlsf).
///
/// Single owner, no locking: use it directly from one thread (it is `Send`),
/// or through `SharedTlsf` (feature `std`) from many.
pub struct Tlsf {
    pub(super) nodes: Vec<Node>,
    pub(super) fl_bitmap: u64,
    pub(super) sl_bitmap: [u16; FL_COUNT],
    pub(super) heads: [[u32; SL_COUNT]; FL_COUNT],
    /// log2 of the granule.
    pub(super) shift: u32,
    /// Managed capacity in granules.
    pub(super) cap_units: u64,
    /// Bits of a handle that hold the node index.
    pub(super) index_bits: u32,
    pub(super) unused_head: u32,
    pub(super) unused_count: u32,
    pub(super) used_units: u64,
    pub(super) high_water_units: u64,
    pub(super) live: u64,
    pub(super) total_allocs: u64,
    pub(super) free_blocks: u64,
}

impl fmt::Debug for Tlsf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tlsf")
            .field("capacity", &self.capacity())
            .field("granule", &self.granule())
            .field("max_blocks", &self.max_blocks())
            .field("in_use", &(self.used_units << self.shift))
            .field("alloc_count", &self.live)
            .field("free_blocks", &self.free_blocks)
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
        let cap_units = capacity >> shift;
        if cap_units == 0 {
            return Err(invalid_config("capacity is smaller than one granule"));
        }
        let n = config.max_blocks as usize;
        let mut nodes = Vec::new();
        nodes
            .try_reserve_exact(n)
            .map_err(|_| invalid_config("cannot allocate the node table"))?;
        nodes.push(Node {
            size: cap_units,
            state: State::Free,
            ..Node::UNUSED
        });
        for i in 1..n {
            let next = if i + 1 < n { (i + 1) as u32 } else { NIL };
            nodes.push(Node {
                next_free: next,
                ..Node::UNUSED
            });
        }
        let index_bits = (u32::BITS - (config.max_blocks - 1).leading_zeros()).max(1);
        let mut tlsf = Self {
            nodes,
            fl_bitmap: 0,
            sl_bitmap: [0; FL_COUNT],
            heads: [[NIL; SL_COUNT]; FL_COUNT],
            shift,
            cap_units,
            index_bits,
            unused_head: if n > 1 { 1 } else { NIL },
            unused_count: config.max_blocks - 1,
            used_units: 0,
            high_water_units: 0,
            live: 0,
            total_allocs: 0,
            free_blocks: 0,
        };
        tlsf.insert_free(0);
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

    /// Bytes currently allocated (requests rounded up to the granule). O(1).
    #[must_use]
    #[inline]
    pub fn in_use(&self) -> u64 {
        self.used_units << self.shift
    }

    /// Number of live allocations. O(1).
    #[must_use]
    #[inline]
    pub fn alloc_count(&self) -> u64 {
        self.live
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
    #[inline]
    pub fn alloc(&mut self, size: u64, align: u64) -> Result<Allocation, TlsfError> {
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
            handle: (node.generation << self.index_bits) | idx,
        })
    }

    /// The node-table slot of a live handle: an index below
    /// [`Tlsf::max_blocks`], unique among live allocations (callers keep
    /// per-allocation side tables indexed by it).
    #[inline]
    pub fn handle_slot(&self, handle: u32) -> usize {
        (handle & ((1 << self.index_bits) - 1)) as usize
    }

    /// Returns an allocation's range to the free lists, merging it with free
    /// physical neighbours. O(1).
    ///
    /// # Errors
    ///
    /// [`TlsfError::InvalidHandle`] if `handle` is not a live allocation:
    /// freed already (double free), stale, or never issued. Nothing changes
    /// then.
    #[inline]
    pub fn free(&mut self, handle: u32) -> Result<(), TlsfError> {
        let idx = handle & ((1 << self.index_bits) - 1);
        let generation = handle >> self.index_bits;
        match self.nodes.get(idx as usize) {
            Some(n) if n.state == State::Used && n.generation == generation => {}
            _ => return Err(invalid_handle(handle)),
        }
        let gen_mask = u32::MAX >> self.index_bits;
        let mut i = idx;
        let node = &mut self.nodes[i as usize];
        node.generation = node.generation.wrapping_add(1) & gen_mask;
        node.state = State::Free;
        self.used_units -= node.size;
        self.live -= 1;

        let prev = self.nodes[i as usize].prev_phys;
        if prev != NIL && self.nodes[prev as usize].state == State::Free {
            self.remove_free(prev);
            self.absorb_next(prev, i);
            i = prev;
        }
        let next = self.nodes[i as usize].next_phys;
        if next != NIL && self.nodes[next as usize].state == State::Free {
            self.remove_free(next);
            self.absorb_next(i, next);
        }
        self.insert_free(i);
        Ok(())
    }

    /// A snapshot of the accounting. O(1) except `largest_free`, which scans
    /// the highest non-empty bin.
    #[must_use]
    pub fn stats(&self) -> Stats {
        let in_use = self.used_units << self.shift;
        Stats {
            capacity: self.capacity(),
            in_use,
            free: self.capacity() - in_use,
            largest_free: self.largest_free_units() << self.shift,
            high_water: self.high_water_units << self.shift,
            alloc_count: self.live,
            total_allocs: self.total_allocs,
            free_blocks: self.free_blocks,
        }
    }
}
