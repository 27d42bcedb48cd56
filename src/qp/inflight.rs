//! The fixed-size table of requests in flight on one queue: a ring in post
//! order, because a queue completes in post order (an unsignaled request is
//! complete when a later one on the same queue completes).
//!
//! Slots are written and emptied in place: a request's buffers are moved in
//! once when it is posted and out once when it completes, one buffer at a
//! time (most requests have one), never the whole slot.

use alloc::vec::Vec;
use core::mem::ManuallyDrop;

use crate::cq::{WcOpcode, WcStatus};
use crate::wr::{Local, MAX_SGE};

use super::prepared::Prepared;

/// `Slot::prepared` of a request posted with its own buffers.
pub(crate) const NOT_PREPARED: u32 = u32::MAX;

/// What the queue pair keeps of a posted request until it completes.
pub(crate) struct Slot<B> {
    pub(crate) tag: u64,
    /// The opcode a successful completion reports (for unsignaled requests,
    /// which get no completion entry of their own).
    pub(crate) opcode: WcOpcode,
    pub(crate) signaled: bool,
    /// The prepared send this post is of (its index in the queue pair's
    /// table), or `NOT_PREPARED`. A prepared receive keeps no slot.
    pub(crate) prepared: u32,
    /// That prepared send's generation (see `Prepared`).
    pub(crate) generation: u32,
    /// How many of `bufs` (a prefix) hold buffers.
    nbufs: u8,
    /// All `None` while the slot is free.
    bufs: [Option<B>; MAX_SGE],
}

impl<B> Slot<B> {
    /// Moves the buffers into `dst` (empty), leaving the slot free. The
    /// common single buffer costs one move.
    #[inline(always)]
    pub(crate) fn take_bufs_into(&mut self, dst: &mut Bufs<B>) {
        // Constant indices only, so that the completion can live in registers.
        let n = self.nbufs;
        let [d0, d1, d2, d3] = &mut *dst.0;
        let [b0, b1, b2, b3] = &mut self.bufs;
        *d0 = b0.take();
        if n > 1 {
            *d1 = b1.take();
            if n > 2 {
                *d2 = b2.take();
                if n > 3 {
                    *d3 = b3.take();
                }
            }
        }
    }

    /// Takes the first buffer still held.
    #[inline(always)]
    pub(crate) fn take_first(&mut self) -> Option<B> {
        if self.nbufs == 0 {
            return None; // a prepared or inline post: no buffers here
        }
        take_first_of(&mut self.bufs)
    }

    /// Drops the buffers nobody took, leaving the slot free.
    #[inline(always)]
    pub(crate) fn drop_leftover(&mut self) {
        if self.nbufs == 0 {
            return; // a prepared or inline post: no buffers here (no store either)
        }
        self.nbufs = 0;
        if any_held(&self.bufs) {
            drop_cold(core::mem::take(&mut self.bufs));
        }
    }
}

/// A ring of slots indexed by a monotonically increasing sequence number
/// (the work request id), at most `capacity` of them in flight.
pub(crate) struct InFlight<B> {
    /// A power of two long, so a sequence number maps to a slot by a mask.
    slots: Vec<Slot<B>>,
    mask: u64,
    capacity: u64,
    /// Sequence number of the oldest request in flight.
    head: u64,
    /// Sequence number the next request gets.
    tail: u64,
}

impl<B> InFlight<B> {
    /// A table for `capacity` requests, allocated once here (setup time).
    pub(crate) fn new(capacity: u32) -> InFlight<B> {
        let capacity = capacity.max(1);
        let len = capacity.next_power_of_two() as usize;
        let mut slots = Vec::with_capacity(len);
        slots.resize_with(len, || Slot {
            tag: 0,
            opcode: WcOpcode::SEND,
            signaled: false,
            prepared: NOT_PREPARED,
            generation: 0,
            nbufs: 0,
            bufs: [None, None, None, None],
        });
        InFlight {
            slots,
            mask: len as u64 - 1,
            capacity: u64::from(capacity),
            head: 0,
            tail: 0,
        }
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    pub(crate) fn len(&self) -> u64 {
        self.tail - self.head
    }

    pub(crate) fn is_full(&self) -> bool {
        self.len() >= self.capacity
    }

    /// The sequence number the next pushed request will get.
    pub(crate) fn next_seq(&self) -> u64 {
        self.tail
    }

    /// Records a posted request and moves its buffers (a prefix of
    /// `locals`, as the request types keep them) in, leaving `locals` empty.
    /// The caller checked `!is_full()`.
    #[inline(always)]
    pub(crate) fn push(
        &mut self,
        tag: u64,
        opcode: WcOpcode,
        signaled: bool,
        locals: &mut [Option<Local<B>>; MAX_SGE],
    ) -> u64 {
        let seq = self.tail;
        let slot = self.claim(tag, opcode, signaled, NOT_PREPARED);
        let mut n = 0;
        // Taken by reference, as moving the request's array by value costs a
        // copy of all of it; every entry is taken, so the caller's drop of
        // the emptied array compiles to nothing.
        for (dst, src) in slot.bufs.iter_mut().zip(locals.iter_mut()) {
            let Some(local) = src.take() else { break }; // a prefix, as documented
            if let Some(stale) = dst.take() {
                drop_cold(stale); // never: a free slot holds no buffers
            }
            *dst = Some(local.buf);
            n += 1;
        }
        slot.nbufs = n;
        seq
    }

    /// Records a posted request that holds no buffers (inline data, a bind).
    /// The caller checked `!is_full()`.
    #[inline(always)]
    pub(crate) fn push_bufless(&mut self, tag: u64, opcode: WcOpcode, signaled: bool) -> u64 {
        let seq = self.tail;
        self.claim(tag, opcode, signaled, NOT_PREPARED);
        seq
    }

    /// The next slot, filled in and counted in flight (its buffers, if
    /// any, are the caller's to move in). The caller checked `!is_full()`.
    #[inline(always)]
    fn claim(&mut self, tag: u64, opcode: WcOpcode, signaled: bool, prepared: u32) -> &mut Slot<B> {
        debug_assert!(!self.is_full());
        let at = (self.tail & self.mask) as usize;
        self.tail += 1;
        let slot = &mut self.slots[at];
        slot.tag = tag;
        slot.opcode = opcode;
        slot.signaled = signaled;
        slot.prepared = prepared;
        slot.nbufs = 0;
        slot
    }

    /// Records a post of prepared send `index`, whose buffers stay in the
    /// prepared table (a prepared receive keeps no slot: see `prepared`).
    /// The caller checked `!is_full()`.
    #[inline(always)]
    pub(crate) fn push_prepared(
        &mut self,
        tag: u64,
        opcode: WcOpcode,
        signaled: bool,
        index: u32,
        generation: u32,
    ) {
        self.claim(tag, opcode, signaled, index).generation = generation;
    }

    /// True when `seq` is in flight.
    #[inline(always)]
    pub(crate) fn contains(&self, seq: u64) -> bool {
        self.through(seq) != 0
    }

    /// How many requests the completion of `seq` finishes: the oldest
    /// through `seq` (a queue completes in post order); 0 if `seq` is not
    /// in flight.
    #[inline(always)]
    pub(crate) fn through(&self, seq: u64) -> u64 {
        // One comparison: below `head`, the difference wraps to a huge value.
        let age = seq.wrapping_sub(self.head);
        if age < self.len() {
            age + 1
        } else {
            0
        }
    }

    /// Removes the oldest request, which `through` counted; the caller
    /// takes its buffers out of the slot before the next push.
    #[inline(always)]
    pub(crate) fn pop_oldest(&mut self) -> &mut Slot<B> {
        debug_assert!(self.head < self.tail);
        let at = (self.head & self.mask) as usize;
        self.head += 1;
        &mut self.slots[at]
    }
}

/// A finished request: its status and the buffers it owned, returned.
#[derive(Debug)]
pub struct Completion<B> {
    /// The caller's tag.
    pub tag: u64,
    /// True for a receive-queue request.
    pub is_recv: bool,
    /// The outcome. For an unsignaled request completed by a later signaled
    /// one on the same queue, `SUCCESS`.
    pub status: WcStatus,
    /// What completed.
    pub opcode: WcOpcode,
    /// Bytes received, read or fetched (0 for unsignaled requests).
    pub byte_len: u32,
    /// Immediate data (host order), if the completion carried one.
    pub imm: Option<u32>,
    /// False for an unsignaled request (no completion entry of its own).
    pub signaled: bool,
    /// The provider's vendor error code.
    pub vendor_err: u32,
    /// The request's buffers in scatter/gather order (offsets and lengths
    /// are not kept: they served the post).
    pub(crate) bufs: Bufs<B>,
    /// For a receive on a shared receive queue: its id there (0 otherwise).
    pub(crate) srq_wr_id: u64,
    /// The prepared request this was a post of.
    pub(crate) prepared: Option<Prepared>,
}

impl<B> Completion<B> {
    /// True for a receive on a shared receive queue whose buffers are still
    /// with the SRQ (see `SharedReceiveQueue::complete`).
    pub fn is_srq_pending(&self) -> bool {
        self.srq_wr_id != 0
    }
}

impl<B> Completion<B> {
    /// `Ok` on success, else the typed error with the primer's meaning;
    /// a flush error says it is the consequence of an earlier error.
    #[inline]
    pub fn result(&self) -> Result<(), crate::error::Error> {
        if self.status == WcStatus::SUCCESS {
            return Ok(());
        }
        Err(completion_error(
            self.is_recv,
            self.status,
            self.opcode,
            self.tag,
            self.vendor_err,
        ))
    }

    /// The prepared request this completion is of
    /// ([`QueuePair::post_prepared`](super::QueuePair::post_prepared)); its
    /// buffers stayed with the queue pair, so `take_buf` gives `None`.
    #[inline]
    pub fn prepared(&self) -> Option<Prepared> {
        self.prepared
    }

    /// Takes the first buffer back (most requests have exactly one).
    #[inline]
    pub fn take_buf(&mut self) -> Option<B> {
        take_first_of(&mut self.bufs.0)
    }

    /// All buffers back, in scatter/gather order.
    pub fn into_bufs(mut self) -> impl Iterator<Item = B> {
        core::mem::take(&mut *self.bufs.0).into_iter().flatten()
    }
}

/// The error a failed completion means.
#[cold]
pub(crate) fn completion_error(
    is_recv: bool,
    status: WcStatus,
    opcode: WcOpcode,
    tag: u64,
    vendor_err: u32,
) -> crate::error::Error {
    crate::error::Error::new(
        if is_recv {
            "receive completion"
        } else {
            "send completion"
        },
        crate::error::ErrorKind::Completion(crate::error::WcError {
            status,
            opcode,
            wr_id: tag,
            vendor_err,
        }),
    )
}

/// The buffers a completion returns. Its drop tests inline and frees out of
/// line: the caller usually took every buffer, and an inlined destructor of
/// a buffer type would keep the whole completion in memory instead of
/// registers.
pub(crate) struct Bufs<B>(ManuallyDrop<[Option<B>; MAX_SGE]>);

impl<B> Bufs<B> {
    #[inline(always)]
    pub(crate) fn new(bufs: [Option<B>; MAX_SGE]) -> Bufs<B> {
        Bufs(ManuallyDrop::new(bufs))
    }
}

impl<B> Drop for Bufs<B> {
    #[inline(always)]
    fn drop(&mut self) {
        if any_held(&self.0) {
            drop_cold(core::mem::take(&mut *self.0));
        }
    }
}

impl<B: core::fmt::Debug> core::fmt::Debug for Bufs<B> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        self.0.fmt(f)
    }
}

/// Takes the first buffer held. Constant indices only, so that a slot's or
/// a completion's buffers can live in registers.
#[inline(always)]
fn take_first_of<B>(bufs: &mut [Option<B>; MAX_SGE]) -> Option<B> {
    let [b0, b1, b2, b3] = bufs;
    b0.take()
        .or_else(|| b1.take())
        .or_else(|| b2.take())
        .or_else(|| b3.take())
}

/// True if any buffer is held; `|`, not `||`: one branch for the usual
/// answer (all taken).
#[inline(always)]
fn any_held<B>(bufs: &[Option<B>; MAX_SGE]) -> bool {
    let [b0, b1, b2, b3] = bufs;
    b0.is_some() | b1.is_some() | b2.is_some() | b3.is_some()
}

/// Drops out of line, for buffers the data path only drops by exception.
#[cold]
#[inline(never)]
fn drop_cold<T>(value: T) {
    drop(value);
}
