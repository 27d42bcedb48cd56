//! The fixed-size table of requests in flight on one queue: a ring in post
//! order, because a queue completes in post order (an unsignaled request is
//! complete when a later one on the same queue completes, and a receive
//! queue consumes its receives in order).
//!
//! A slot holds a posted request's buffers from its post until a completion
//! of its sequence number or a later one retires it (or until its queue
//! pair is destroyed): that is what lets the NIC own them.

use alloc::boxed::Box;
use alloc::vec::Vec;

use crate::sgl::Sgl;
use crate::sys::ibv_wc_opcode as WcOpcode;

use super::id::SEQ_MASK;

/// `Slot::prepared` of a request posted with its own buffers.
pub(crate) const NOT_PREPARED: u32 = u32::MAX;

/// What the ring keeps of a posted request until it completes.
pub(crate) struct Slot<B> {
    pub(crate) tag: u64,
    /// The opcode a successful completion reports (for unsignaled requests,
    /// which get no completion entry of their own, and for errors, whose
    /// entry's opcode is undefined).
    pub(crate) opcode: WcOpcode,
    /// The prepared request this is a post of (its table index), or
    /// `NOT_PREPARED`; its buffers stay in the table.
    pub(crate) prepared: u32,
    /// That prepared request's generation.
    pub(crate) generation: u32,
    /// The request's own buffers (empty for prepared, inline and bind posts).
    pub(crate) sgl: Sgl<B>,
}

/// A ring of slots indexed by a sequence number (the work request id's
/// low bits), at most `capacity` in flight.
pub(crate) struct Ring<B> {
    /// A power of two long, so a sequence number maps to a slot by a mask.
    slots: Box<[Slot<B>]>,
    mask: u64,
    capacity: u64,
    /// Sequence number of the oldest request in flight.
    head: u64,
    /// Sequence number the next request gets.
    tail: u64,
}

impl<B> Ring<B> {
    /// A ring for `capacity` requests whose first request gets `start`
    /// (a queue pair index reused by a new queue pair continues where the
    /// old one stopped, so a stale completion of the old one is out of the
    /// new one's window). Allocated once, here: setup time.
    pub(crate) fn new(capacity: u32, start: u64) -> Ring<B> {
        // No slot for no request: a vacant queue pair's rings allocate
        // nothing (`QpSlot::lent_to_lane`).
        let len = match capacity {
            0 => 0,
            n => n.next_power_of_two() as usize,
        };
        let mut slots = Vec::with_capacity(len);
        slots.resize_with(len, || Slot {
            tag: 0,
            opcode: WcOpcode::SEND,
            prepared: NOT_PREPARED,
            generation: 0,
            sgl: Sgl::empty(),
        });
        Ring {
            slots: slots.into_boxed_slice(),
            mask: (len as u64).saturating_sub(1),
            capacity: u64::from(capacity),
            head: start,
            tail: start,
        }
    }

    /// Requests it can hold in flight.
    #[inline(always)]
    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
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

    /// Records a posted request: the next slot, filled in and counted in
    /// flight; the caller moves the request's buffers in (`slot.sgl`). The
    /// caller checked the room (`len() < capacity()`).
    #[inline(always)]
    pub(crate) fn push(&mut self, tag: u64, opcode: WcOpcode) -> &mut Slot<B> {
        debug_assert!(self.len() < self.capacity);
        let at = (self.tail & self.mask) as usize;
        self.tail += 1;
        let slot = &mut self.slots[at];
        slot.tag = tag;
        slot.opcode = opcode;
        slot.prepared = NOT_PREPARED;
        slot
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

    /// Records a post whose slot already holds what the post would write
    /// there: a lane's, whose rings `fill` prepared (`lane.rs`).
    #[inline(always)]
    pub(crate) fn push_filled(&mut self) {
        debug_assert!(self.len() < self.capacity);
        self.tail += 1;
    }

    /// Retires the requests a completion of `seq` finishes, as `through`
    /// counts them, without reading their slots (a lane's: they hold no
    /// buffers). Returns how many.
    #[inline(always)]
    pub(crate) fn retire_filled(&mut self, seq: u64) -> u64 {
        let n = self.through(seq);
        self.head += n;
        n
    }

    /// The slots of the requests in flight, oldest first.
    pub(crate) fn in_flight(&self) -> impl Iterator<Item = &Slot<B>> {
        (self.head..self.tail).map(|seq| &self.slots[(seq & self.mask) as usize])
    }

    /// Writes `tag`, `opcode` and the prepared request into
    /// every slot, as each post of that request would: for a lane, whose
    /// posts then only count (`push_filled`). Every slot must hold no
    /// buffers (the caller checked that what is in flight is posts of
    /// that request).
    pub(crate) fn fill(&mut self, tag: u64, opcode: WcOpcode, prepared: u32, generation: u32) {
        for slot in self.slots.iter_mut() {
            debug_assert!(slot.sgl.len() == 0);
            slot.tag = tag;
            slot.opcode = opcode;
            slot.prepared = prepared;
            slot.generation = generation;
        }
    }

    /// Removes the oldest request, which `through` counted; the caller takes
    /// its buffers out of the slot before the next push.
    #[inline(always)]
    pub(crate) fn pop_oldest(&mut self) -> &mut Slot<B> {
        debug_assert!(self.head < self.tail);
        let at = (self.head & self.mask) as usize;
        self.head += 1;
        &mut self.slots[at]
    }
}
