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
//!   Alignment is of the address, the region's base
//!   ([`TlsfConfig::base`]) plus the offset: a registered region starts on
//!   a page, and a buffer aligned above one must still be.
//! * **Metadata.** A node table of `max_blocks` block descriptors (offset,
//!   size, state, physical neighbours, free-list links, generation, and a
//!   free block's bin), allocated once; unused slots form an intrusive stack.
//!   Bin heads and bitmaps are fixed arrays, sized to powers of two so that
//!   masked indices need no bounds check. `alloc` and `free` never allocate,
//!   lock or make a system call. `free` merges with both physical neighbours
//!   in O(1).
//! * **Fast path.** `alloc` inlines only the common case (a valid size, an
//!   alignment up to the granule, a block and a node slot at hand) and
//!   leaves errors and large alignments to an out-of-line slow path, which
//!   starts over; `free` is inlined whole.
//! * **Front cache** (opt-in, [`TlsfConfig::with_front_cache`]). A freed
//!   block of fewer than [`CACHE_CLASSES`] granules goes onto a LIFO stack
//!   for its exact size, up to `front_cache` blocks per size, instead of
//!   being merged; an allocation of that size (alignment up to the granule)
//!   pops it first. Such a pair is a push and a pop: no bin search, split
//!   or merge, and the block is warm in the cache. Cached blocks are free
//!   for the caller and held for the bins (never merged, never handed out
//!   twice: a cached block is not `Used`, so its old handle is stale like
//!   any freed one). The cost is memory held back, at most `front_cache`
//!   blocks of each size; an allocation that would fail first merges the
//!   whole cache back ([`Tlsf::flush_cache`]) and tries again, so every
//!   bound below holds with the cache too.
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

mod allocator;
mod blocks;
mod cache;
mod check;
#[cfg(feature = "std")]
mod shared;
#[cfg(test)]
mod tests;
mod types;

pub use allocator::Tlsf;
#[cfg(feature = "std")]
pub use shared::SharedTlsf;
pub use types::{
    Allocation, Stats, TlsfConfig, TlsfError, CACHE_CLASSES, DEFAULT_ALIGN, DEFAULT_GRANULE,
    DEFAULT_MAX_BLOCKS, MAX_BLOCKS_LIMIT,
};
