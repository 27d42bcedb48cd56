//! The fixed-size table of requests in flight on one queue: a ring in post
//! order, because a queue completes in post order (an unsignaled request is
//! complete when a later one on the same queue completes).

use alloc::vec::Vec;

use crate::cq::{WcOpcode, WcStatus};
use crate::wr::{Local, MAX_SGE};

/// What the queue pair keeps of a posted request until it completes.
pub(crate) struct Slot<B> {
    pub(crate) tag: u64,
    pub(crate) locals: [Option<Local<B>>; MAX_SGE],
    pub(crate) signaled: bool,
    /// The opcode a successful completion reports (for unsignaled requests,
    /// which get no completion entry of their own).
    pub(crate) opcode: WcOpcode,
}

/// A ring of `capacity` slots indexed by a monotonically increasing
/// sequence number (the work request id).
pub(crate) struct InFlight<B> {
    slots: Vec<Option<Slot<B>>>,
    /// Sequence number of the oldest request in flight.
    head: u64,
    /// Sequence number the next request gets.
    tail: u64,
}

impl<B> InFlight<B> {
    /// A table for `capacity` requests, allocated once here (setup time).
    pub(crate) fn new(capacity: u32) -> InFlight<B> {
        let mut slots = Vec::with_capacity(capacity as usize);
        slots.resize_with(capacity.max(1) as usize, || None);
        InFlight {
            slots,
            head: 0,
            tail: 0,
        }
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.slots.len() as u64
    }

    pub(crate) fn len(&self) -> u64 {
        self.tail - self.head
    }

    pub(crate) fn is_full(&self) -> bool {
        self.len() >= self.capacity()
    }

    /// The sequence number the next pushed request will get.
    pub(crate) fn next_seq(&self) -> u64 {
        self.tail
    }

    /// Records a posted request. The caller checked `!is_full()`.
    #[inline]
    pub(crate) fn push(&mut self, slot: Slot<B>) -> u64 {
        debug_assert!(!self.is_full());
        let seq = self.tail;
        let i = (seq % self.capacity()) as usize;
        self.slots[i] = Some(slot);
        self.tail += 1;
        seq
    }

    /// True when `seq` is in flight.
    pub(crate) fn contains(&self, seq: u64) -> bool {
        seq >= self.head && seq < self.tail
    }

    /// Removes the oldest request.
    #[inline]
    pub(crate) fn pop(&mut self) -> Option<(u64, Slot<B>)> {
        if self.head == self.tail {
            return None;
        }
        let seq = self.head;
        let i = (seq % self.capacity()) as usize;
        self.head += 1;
        self.slots[i].take().map(|s| (seq, s))
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
    pub(crate) locals: [Option<Local<B>>; MAX_SGE],
    /// For a receive on a shared receive queue: its id there (0 otherwise).
    pub(crate) srq_wr_id: u64,
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
    pub fn result(&self) -> Result<(), crate::error::Error> {
        if self.status == WcStatus::SUCCESS {
            return Ok(());
        }
        Err(crate::error::Error::new(
            if self.is_recv {
                "receive completion"
            } else {
                "send completion"
            },
            crate::error::ErrorKind::Completion(crate::error::WcError {
                status: self.status,
                opcode: self.opcode,
                wr_id: self.tag,
                vendor_err: self.vendor_err,
            }),
        ))
    }

    /// Takes the first buffer back (most requests have exactly one).
    pub fn take_buf(&mut self) -> Option<B> {
        self.locals.iter_mut().find_map(|l| l.take()).map(|l| l.buf)
    }

    /// All buffers back, in scatter/gather order.
    pub fn into_bufs(self) -> impl Iterator<Item = B> {
        self.locals.into_iter().flatten().map(|l| l.buf)
    }
}
