//! The public value types of the TLSF allocator: configuration, allocation,
//! statistics and errors.

use core::fmt;

/// Construction parameters of a [`Tlsf`](super::Tlsf).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TlsfConfig {
    /// Minimum block size and offset unit in bytes; a power of two. Every
    /// request is rounded up to a multiple of it, and alignments up to it
    /// cost nothing.
    pub granule: u64,
    /// Size of the node table: the most blocks (allocated plus free) that can
    /// exist at once, `1..=MAX_BLOCKS_LIMIT`. At most `2 * live + 1` blocks
    /// exist with `live` allocations.
    pub max_blocks: u32,
    /// Depth of the front cache: how many freed blocks of each exact size
    /// below [`CACHE_CLASSES`] granules are kept aside, unmerged, for the
    /// next request of that size (0, the default: no cache). See the
    /// [module documentation](super#front-cache).
    pub front_cache: u32,
    /// Where the region starts (an address; a multiple of the granule, 0
    /// by default): an allocation's alignment is of `base + offset`, so a
    /// region that starts on a page still gives addresses aligned above
    /// one.
    pub base: u64,
}

impl Default for TlsfConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl TlsfConfig {
    /// The defaults: [`DEFAULT_GRANULE`] and [`DEFAULT_MAX_BLOCKS`].
    #[must_use]
    pub const fn new() -> Self {
        Self {
            granule: DEFAULT_GRANULE,
            max_blocks: DEFAULT_MAX_BLOCKS,
            front_cache: 0,
            base: 0,
        }
    }

    /// Sets the granule (a power of two, checked by [`Tlsf::new`](super::Tlsf::new)).
    #[must_use]
    pub const fn with_granule(mut self, granule: u64) -> Self {
        self.granule = granule;
        self
    }

    /// Sets the node table size directly.
    #[must_use]
    pub const fn with_max_blocks(mut self, max_blocks: u32) -> Self {
        self.max_blocks = max_blocks;
        self
    }

    /// Sets where the region starts (a multiple of the granule, checked by
    /// [`Tlsf::new`](super::Tlsf::new)).
    #[must_use]
    pub const fn with_base(mut self, base: u64) -> Self {
        self.base = base;
        self
    }

    /// Sets the front cache's depth per size (0: no cache).
    #[must_use]
    pub const fn with_front_cache(mut self, depth: u32) -> Self {
        self.front_cache = depth;
        self
    }

    /// Sizes the node table for up to `max_live` simultaneous allocations,
    /// `2 * max_live + 1` nodes, which rules out [`TlsfError::OutOfNodes`]
    /// below that many live allocations. Saturates at [`MAX_BLOCKS_LIMIT`].
    #[must_use]
    pub const fn with_max_live(mut self, max_live: u32) -> Self {
        let n = (max_live as u64) * 2 + 1;
        self.max_blocks = if n > MAX_BLOCKS_LIMIT as u64 {
            MAX_BLOCKS_LIMIT
        } else {
            n as u32
        };
        self
    }
}

/// One allocated range of the region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[must_use = "an Allocation must be given back with Tlsf::free, or its range leaks"]
pub struct Allocation {
    /// Start of the range, in bytes from the start of the region: a multiple
    /// of the granule, and the region's base ([`TlsfConfig::base`]) plus it
    /// a multiple of the requested alignment.
    pub offset: u64,
    /// The size that was asked for, in bytes. The block reserved behind it is
    /// this rounded up to the granule (that is what [`Stats::in_use`] counts);
    /// the slack is the caller's to use or ignore.
    pub len: u64,
    /// Token for [`Tlsf::free`](super::Tlsf::free): node index plus generation.
    pub handle: u32,
}

/// A snapshot of the allocator's accounting, from [`Tlsf::stats`](super::Tlsf::stats).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    /// Bytes managed: the capacity given to [`Tlsf::new`](super::Tlsf::new) rounded down to the
    /// granule.
    pub capacity: u64,
    /// Bytes in allocated blocks (requests rounded up to the granule).
    pub in_use: u64,
    /// Bytes in free blocks: `capacity - in_use`.
    pub free: u64,
    /// Size of the largest free block in bytes (the front cache's blocks
    /// not included).
    pub largest_free: u64,
    /// Peak of `in_use + cached` since construction: the most memory taken
    /// out of the free lists at once (`in_use` alone without the cache).
    pub high_water: u64,
    /// Live allocations.
    pub alloc_count: u64,
    /// Successful allocations since construction.
    pub total_allocs: u64,
    /// Number of free blocks (1 when nothing is allocated; more means
    /// fragmentation). Blocks in the front cache are not counted.
    pub free_blocks: u64,
    /// Bytes in blocks held by the front cache: free for the caller (part of
    /// `free`) but not merged, so not part of `free_blocks` or
    /// `largest_free` until [`Tlsf::flush_cache`](super::Tlsf::flush_cache)
    /// (which a failing allocation does by itself).
    pub cached: u64,
}

/// Why an allocator operation failed. Every failure is a value: the
/// allocator does not panic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TlsfError {
    /// A request for zero bytes.
    ZeroSize,
    /// The request exceeds the whole capacity and can never succeed.
    TooLarge {
        /// Bytes requested.
        requested: u64,
        /// Bytes managed.
        capacity: u64,
    },
    /// The alignment is zero or not a power of two.
    BadAlignment {
        /// The alignment given.
        align: u64,
    },
    /// No free block fits the request now (freeing may help).
    OutOfMemory {
        /// Bytes requested.
        requested: u64,
        /// The largest free block in bytes. It may be at least `requested`
        /// when alignment or the good-fit rounding ruled it out.
        largest_free: u64,
    },
    /// A block fits but the node table has no slot for the split-off parts;
    /// raise [`TlsfConfig::max_blocks`].
    OutOfNodes {
        /// Size of the node table.
        max_blocks: u32,
    },
    /// The handle is not a live allocation of this allocator: already freed,
    /// stale, or never issued.
    InvalidHandle {
        /// The handle given.
        handle: u32,
    },
    /// [`Tlsf::new`](super::Tlsf::new) rejected its parameters.
    InvalidConfig {
        /// What was wrong.
        reason: &'static str,
    },
}

impl fmt::Display for TlsfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::ZeroSize => f.write_str("zero-size allocation request"),
            Self::TooLarge {
                requested,
                capacity,
            } => write!(
                f,
                "request of {requested} bytes exceeds the capacity of {capacity} bytes"
            ),
            Self::BadAlignment { align } => {
                write!(f, "alignment {align} is not a power of two")
            }
            Self::OutOfMemory {
                requested,
                largest_free,
            } => write!(
                f,
                "out of memory: {requested} bytes requested, \
                 largest free block {largest_free} bytes"
            ),
            Self::OutOfNodes { max_blocks } => {
                write!(f, "out of block descriptors (max_blocks = {max_blocks})")
            }
            Self::InvalidHandle { handle } => {
                write!(f, "invalid handle {handle:#010x}: freed, stale or foreign")
            }
            Self::InvalidConfig { reason } => write!(f, "invalid TLSF configuration: {reason}"),
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for TlsfError {}

#[cold]
#[inline(never)]
pub(super) fn zero_size() -> TlsfError {
    TlsfError::ZeroSize
}

#[cold]
#[inline(never)]
pub(super) fn too_large(requested: u64, capacity: u64) -> TlsfError {
    TlsfError::TooLarge {
        requested,
        capacity,
    }
}

#[cold]
#[inline(never)]
pub(super) fn bad_alignment(align: u64) -> TlsfError {
    TlsfError::BadAlignment { align }
}

#[cold]
#[inline(never)]
pub(super) fn invalid_handle(handle: u32) -> TlsfError {
    TlsfError::InvalidHandle { handle }
}

#[cold]
#[inline(never)]
pub(super) fn invalid_config(reason: &'static str) -> TlsfError {
    TlsfError::InvalidConfig { reason }
}

/// Log2 of the number of second-level subdivisions per power of two.
pub(super) const SL_LOG2: u32 = 4;
/// Second-level subdivisions per power of two (16).
pub(super) const SL_COUNT: usize = 1 << SL_LOG2;
/// First-level classes: one exact class for sizes below `SL_COUNT` granules,
/// then one per power of two from `2^SL_LOG2` to `2^63` granules.
pub(super) const FL_COUNT: usize = (u64::BITS - SL_LOG2 + 1) as usize;
/// Front-cache classes: one per exact size of `1..CACHE_CLASSES` granules
/// (16 KiB at the default granule). A power of two, so that a masked index
/// needs no bounds check.
pub const CACHE_CLASSES: usize = 256;
/// "No node" in every index field.
pub(super) const NIL: u32 = u32::MAX;

/// Default granule: 64 bytes, one cache line.
pub const DEFAULT_GRANULE: u64 = 64;
/// Default alignment for buffers: 64 bytes, one cache line.
pub const DEFAULT_ALIGN: u64 = 64;
/// Default node table size ([`TlsfConfig::max_blocks`]).
pub const DEFAULT_MAX_BLOCKS: u32 = 16_384;
/// Largest accepted [`TlsfConfig::max_blocks`] (2^24), which leaves at least
/// 8 bits of generation in every handle.
pub const MAX_BLOCKS_LIMIT: u32 = 1 << 24;
