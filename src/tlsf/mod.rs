//! TLSF offset allocator: carves one registered memory region into buffers.
//!
//! [`Tlsf`] hands out `(offset, len)` ranges inside a region of `capacity`
//! bytes. It never reads or writes the region itself: the region is RDMA
//! registered memory that a remote peer may write at any time, so every piece
//! of metadata lives outside it, in tables allocated once by [`Tlsf::new`].
//!
//! # Design
//!
//! * **Granule.** Offsets and block sizes are multiples of the granule
//!   ([`TlsfConfig::granule`], a power of two, default 64 bytes = one cache
//!   line). A request is rounded up to whole granules.
//! * **Bins (two-level segregated fit).** A free block of `u` granules lives in
//!   bin `(fl, sl)`. Blocks below 16 granules get one exact bin per size
//!   (`fl = 0`, `sl = u`); larger ones use `fl = floor(log2 u) - 3` (the power
//!   of two class) and `sl` = the next 4 bits below the leading one, i.e. 16
//!   linear subdivisions per power of two. 61 first-level classes cover every
//!   `u64` size. A `u64` bitmap marks non-empty first-level classes and a `u16`
//!   per class marks non-empty bins, so finding a bin is one mask and one
//!   trailing-zero count per level.
//! * **Good fit.** First the head of the request's own bin is tried (one
//!   comparison: the tightest fit available). Otherwise the request is
//!   rounded up to the next bin boundary and the first non-empty bin at or
//!   above it is found with the bitmaps; every block there fits, so its head
//!   is taken: no list walk. The chosen block is split: the tail goes back
//!   to the free lists.
//! * **Alignment.** Any power of two. If `align <= granule` every block
//!   qualifies (the fast path). Otherwise the search asks for
//!   `size + align - granule` bytes, which always contains an aligned start;
//!   the front padding is split off as a free block of its own (it is not
//!   lost), and the tail likewise. If that over-sized search fails, the block
//!   the plain-size search finds is checked once for an aligned fit. Both are
//!   O(1); a separate bin structure per alignment or a list walk would not be.
//!   Alignment is of the offset: the address is aligned as well when the
//!   region's base is aligned at least as strictly (registered regions are
//!   page aligned).
//! * **Metadata.** A node table of `max_blocks` block descriptors (offset,
//!   size, state, physical neighbours, free-list links, generation), allocated
//!   once; unused slots form an intrusive stack. Bin heads and bitmaps are
//!   fixed arrays. `alloc` and `free` never allocate, lock or make a system
//!   call. `free` merges with both physical neighbours in O(1).
//! * **Handles.** [`Allocation::handle`] is a node index plus a generation in
//!   the high bits (the bits the index does not need: 8 at least, 21 for
//!   2048 nodes). Freeing bumps the generation, so a double free or a stale
//!   handle is reported as [`TlsfError::InvalidHandle`] (until the same slot
//!   has been freed 2^generation-bits times: then an old handle aliases).
//!
//! # Bounds
//!
//! * `alloc` and `free` are O(1) on success. A failed `alloc` additionally
//!   scans the highest non-empty bin to report the exact largest free block
//!   (cold path; bounded by the number of free blocks in one bin).
//! * Internal fragmentation: less than one granule per live allocation.
//!   Alignment padding is returned to the free lists, not wasted.
//! * External (search) fragmentation: with `align <= granule`, a request of
//!   `s` granules succeeds whenever a free block of at least `s` rounded up to
//!   its bin boundary exists; that rounding adds less than `s / 16` (nothing
//!   below 16 granules). So a request fails only if the largest free block
//!   is smaller than `17/16` of the request rounded up to the granule. With
//!   a larger alignment the same holds for `s + align/granule - 1` granules.
//!   (The random test checks this bound on every failure.)
//! * Nodes: free blocks are never adjacent, so there are at most
//!   `2 * live + 1` blocks. `max_blocks >= 2 * max_live + 1` (see
//!   [`TlsfConfig::with_max_live`]) means [`TlsfError::OutOfNodes`] never
//!   happens.
//!
//! `SharedTlsf` (feature `std`) wraps a `Tlsf` in a mutex for many threads.

use alloc::vec::Vec;
use core::fmt;

mod check;
#[cfg(feature = "std")]
mod shared;
#[cfg(test)]
mod tests;
mod types;

#[cfg(feature = "std")]
pub use shared::SharedTlsf;
use types::{bad_alignment, invalid_config, invalid_handle, too_large, zero_size};
pub use types::{Allocation, Stats, TlsfConfig, TlsfError};

/// Log2 of the number of second-level subdivisions per power of two.
const SL_LOG2: u32 = 4;
/// Second-level subdivisions per power of two (16).
const SL_COUNT: usize = 1 << SL_LOG2;
/// First-level classes: one exact class for sizes below `SL_COUNT` granules,
/// then one per power of two from `2^SL_LOG2` to `2^63` granules.
const FL_COUNT: usize = (u64::BITS - SL_LOG2 + 1) as usize;
/// "No node" in every index field.
const NIL: u32 = u32::MAX;

/// Default granule: 64 bytes, one cache line.
pub const DEFAULT_GRANULE: u64 = 64;
/// Default alignment for buffers: 64 bytes, one cache line.
pub const DEFAULT_ALIGN: u64 = 64;
/// Default node table size ([`TlsfConfig::max_blocks`]).
pub const DEFAULT_MAX_BLOCKS: u32 = 16_384;
/// Largest accepted [`TlsfConfig::max_blocks`] (2^24), which leaves at least
/// 8 bits of generation in every handle.
pub const MAX_BLOCKS_LIMIT: u32 = 1 << 24;

/// What a node slot currently describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Not a block: on the unused-slot stack (linked through `next_free`).
    Unused,
    /// A free block, on the list of its bin.
    Free,
    /// An allocated block.
    Used,
}

/// A block descriptor. Offsets and sizes are in granules.
#[derive(Debug, Clone, Copy)]
struct Node {
    offset: u64,
    size: u64,
    prev_phys: u32,
    next_phys: u32,
    prev_free: u32,
    next_free: u32,
    generation: u32,
    state: State,
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
fn bin_of(units: u64) -> (usize, usize) {
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
fn search_bin(units: u64) -> Option<(usize, usize)> {
    if units < SL_COUNT as u64 {
        return Some((0, units as usize));
    }
    let log = u64::BITS - 1 - units.leading_zeros();
    let round = (1u64 << (log - SL_LOG2)) - 1;
    units.checked_add(round).map(bin_of)
}

/// The TLSF offset allocator. See the [module documentation](self).
///
/// Single owner, no locking: use it directly from one thread (it is `Send`),
/// or through `SharedTlsf` (feature `std`) from many.
pub struct Tlsf {
    nodes: Vec<Node>,
    fl_bitmap: u64,
    sl_bitmap: [u16; FL_COUNT],
    heads: [[u32; SL_COUNT]; FL_COUNT],
    /// log2 of the granule.
    shift: u32,
    /// Managed capacity in granules.
    cap_units: u64,
    /// Bits of a handle that hold the node index.
    index_bits: u32,
    unused_head: u32,
    unused_count: u32,
    used_units: u64,
    high_water_units: u64,
    live: u64,
    total_allocs: u64,
    free_blocks: u64,
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
    /// charge ([`DEFAULT_ALIGN`] for buffers, 8 for atomics). The returned
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

    /// The aligned path: `align_units >= 2`.
    #[inline]
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

    /// Granules from the start of block `idx` to its first multiple of
    /// `align_units`; `None` if that overflows.
    #[inline]
    fn front_pad(&self, idx: u32, align_units: u64) -> Option<u64> {
        let offset = self.nodes[idx as usize].offset;
        let mask = align_units - 1;
        offset.checked_add(mask).map(|end| (end & !mask) - offset)
    }

    /// A free block of at least `units` granules, O(1): the head of the
    /// request's own bin if it is large enough (the tightest fit on offer),
    /// else the head of the first non-empty bin at or above the request
    /// rounded up to a bin boundary, all of whose blocks fit.
    #[inline]
    fn find_block(&self, units: u64) -> Option<u32> {
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
    fn place(&mut self, idx: u32, pad: u64, units: u64) -> Result<u32, TlsfError> {
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
    fn absorb_next(&mut self, keep: u32, next: u32) {
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
    fn take_slot(&mut self) -> u32 {
        let slot = self.unused_head;
        self.unused_head = self.nodes[slot as usize].next_free;
        self.unused_count -= 1;
        slot
    }

    /// Pushes free block `idx` on the list of its bin.
    #[inline]
    fn insert_free(&mut self, idx: u32) {
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
    fn remove_free(&mut self, idx: u32) {
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
    fn largest_free_units(&self) -> u64 {
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
    fn out_of_memory(&self, requested: u64) -> TlsfError {
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
