//! One queue's requests in flight, in post order, because a queue
//! completes in post order (an unsignaled request is complete when a later
//! one on the same queue completes, and a receive queue consumes its
//! receives in order): a window of sequence numbers (the work request ids'
//! low bits) and the chain of the engine's table entries that keep those
//! requests (`flights.rs`). The queue's depth is a maximum, not memory: a
//! queue pair costs its two windows however deep its queues are.

use super::id::SEQ_MASK;

/// No entry: the end of a chain.
pub(crate) const NONE: u32 = u32::MAX;

/// The requests one queue has in flight: sequence numbers `head..tail`,
/// kept by the chain of table entries `first` .. `last` (one per request,
/// oldest first), at most `capacity` at once.
pub(crate) struct Ring {
    /// Sequence number of the oldest request in flight.
    head: u64,
    /// Sequence number the next request gets.
    tail: u64,
    capacity: u64,
    /// Half the capacity, rounded up: a send is signaled before this many
    /// unsignaled ones in a row (`qp_slot::signal_decision`).
    half: u64,
    /// The oldest request's entry and the newest's, while any is in
    /// flight and the queue is not a lane's (a lane's posts only count).
    pub(super) first: u32,
    pub(super) last: u32,
    /// The first sequence number: what the queue counts from
    /// (`Ring::posted`, `Ring::completed`).
    start: u64,
}

impl Ring {
    /// A queue for `capacity` requests whose first request gets `start`
    /// (a queue pair index reused by a new queue pair continues where the
    /// old one stopped, so a stale completion of the old one is out of the
    /// new one's window).
    pub(crate) const fn new(capacity: u32, start: u64) -> Ring {
        Ring {
            head: start,
            tail: start,
            capacity: capacity as u64,
            half: capacity.div_ceil(2) as u64,
            first: NONE,
            last: NONE,
            start,
        }
    }

    /// Requests it can hold in flight.
    #[inline(always)]
    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Half the capacity, rounded up.
    #[inline(always)]
    pub(crate) fn half(&self) -> u64 {
        self.half
    }

    /// Requests in flight.
    #[inline(always)]
    pub(crate) fn len(&self) -> u64 {
        self.tail - self.head
    }

    /// The sequence number the next pushed request gets.
    #[inline(always)]
    pub(crate) fn next_seq(&self) -> u64 {
        self.tail
    }

    /// True when request `seq` (a full sequence number) is in flight.
    #[inline(always)]
    pub(crate) fn contains(&self, seq: u64) -> bool {
        seq.wrapping_sub(self.head) < self.len()
    }

    /// How many requests a completion of `seq` (an id's low 42 bits)
    /// finishes: the oldest through `seq`; 0 when `seq` is not in flight
    /// (a stale, duplicated or foreign id).
    #[inline(always)]
    pub(crate) fn through(&self, seq: u64) -> u64 {
        // One comparison: below `head`, the difference wraps to a huge value.
        let age = seq.wrapping_sub(self.head) & SEQ_MASK;
        if age < self.len() {
            age + 1
        } else {
            0
        }
    }

    /// Counts a post at the tail (its entry, if it has one, is linked by
    /// the table).
    #[inline(always)]
    pub(crate) fn push_filled(&mut self) {
        debug_assert!(self.len() < self.capacity);
        self.tail += 1;
    }

    /// Counts the oldest `n` requests retired (their entries, if they have
    /// any, were unlinked by the table).
    #[inline(always)]
    pub(super) fn pop_counted(&mut self, n: u64) {
        debug_assert!(n <= self.len());
        self.head += n;
    }

    /// Retires the requests a completion of `seq` finishes, as `through`
    /// counts them, without entries (a lane's: its posts only count).
    /// Returns how many.
    #[inline(always)]
    pub(crate) fn retire_filled(&mut self, seq: u64) -> u64 {
        let n = self.through(seq);
        self.head += n;
        n
    }

    /// Requests posted since the queue was made.
    pub(crate) fn posted(&self) -> u64 {
        self.tail.wrapping_sub(self.start)
    }

    /// Requests retired (completed, or handed back as flushed) since the
    /// queue was made.
    pub(crate) fn completed(&self) -> u64 {
        self.head.wrapping_sub(self.start)
    }

    /// A queue that holds nothing and counts what this one has counted
    /// (`Ring::posted`, `Ring::completed`): a lane's placeholder's.
    pub(crate) fn counts_only(&self) -> Ring {
        Ring {
            head: self.head,
            tail: self.tail,
            capacity: 0,
            half: 0,
            first: NONE,
            last: NONE,
            start: self.start,
        }
    }
}
