//! A finished request lent to the caller of [`QueuePair::poll_ref`]: a view
//! of the completion entry and of the request's in-flight slot, read on
//! demand. Nothing is copied unless asked for: a buffer moves out only on
//! `take_buf`, and [`CompletionRef::into_owned`] builds the full
//! [`Completion`] that [`QueuePair::poll`] hands out. Buffers the callback
//! leaves in the slot are dropped when it returns.

use crate::cq::{WcOpcode, WcStatus, WorkCompletion};
use crate::error::Error;

use super::inflight::{Bufs, Completion, Slot, NOT_PREPARED};
use super::prepared::Prepared;
#[cfg(doc)]
use super::QueuePair;

/// One finished request, borrowed from the queue pair for the duration of
/// the `poll_ref` callback.
pub struct CompletionRef<'a, B> {
    pub(crate) wc: &'a WorkCompletion,
    /// What the queue pair kept of the request.
    pub(crate) origin: Origin<'a, B>,
    /// False for an unsignaled request completed by a later entry.
    pub(crate) own_entry: bool,
    pub(crate) is_recv: bool,
}

/// What the queue pair kept of a finished request.
pub(crate) enum Origin<'a, B> {
    /// Its in-flight slot.
    Slot(&'a mut Slot<B>),
    /// A prepared receive, which keeps no slot (its entry holds the
    /// buffers): its tag, and the index and generation of its entry.
    PreparedRecv {
        tag: u64,
        index: u32,
        generation: u32,
    },
    /// Nothing: a raw post, or a receive on a shared receive queue (their
    /// buffers are not in this queue pair).
    Foreign,
}

impl<B> CompletionRef<'_, B> {
    /// The caller's tag (for a raw post, its `wr_id`; 0 for a receive on a
    /// shared receive queue until `SharedReceiveQueue::complete`).
    #[inline]
    pub fn tag(&self) -> u64 {
        match &self.origin {
            Origin::Slot(slot) => slot.tag,
            Origin::PreparedRecv { tag, .. } => *tag,
            Origin::Foreign if self.is_recv => 0,
            Origin::Foreign => self.wc.wr_id() & super::post::SEQ_MASK,
        }
    }

    /// True for a receive-queue request.
    #[inline]
    pub fn is_recv(&self) -> bool {
        self.is_recv
    }

    /// The outcome (`SUCCESS` for an unsignaled request completed by a
    /// later one on its queue).
    #[inline]
    pub fn status(&self) -> WcStatus {
        if self.own_entry {
            self.wc.status()
        } else {
            WcStatus::SUCCESS
        }
    }

    /// What completed (what was posted, where the entry cannot say).
    #[inline]
    pub fn opcode(&self) -> WcOpcode {
        // The entry's opcode is undefined on errors.
        let failed = self.wc.status() != WcStatus::SUCCESS;
        match &self.origin {
            Origin::Slot(slot) if !self.own_entry || failed => slot.opcode,
            Origin::PreparedRecv { .. } if failed => WcOpcode::RECV,
            _ => self.wc.opcode(),
        }
    }

    /// Bytes received, read or fetched (0 for unsignaled requests).
    #[inline]
    pub fn byte_len(&self) -> u32 {
        if self.own_entry {
            self.wc.byte_len()
        } else {
            0
        }
    }

    /// Immediate data (host order), if the completion carried one.
    #[inline]
    pub fn imm(&self) -> Option<u32> {
        if self.own_entry {
            self.wc.imm()
        } else {
            None
        }
    }

    /// False for an unsignaled request (no completion entry of its own).
    #[inline]
    pub fn signaled(&self) -> bool {
        match &self.origin {
            Origin::Slot(slot) => slot.signaled,
            _ => true,
        }
    }

    /// The provider's vendor error code.
    #[inline]
    pub fn vendor_err(&self) -> u32 {
        if self.own_entry {
            self.wc.0.vendor_err
        } else {
            0
        }
    }

    /// The prepared request this was a post of (its buffers stayed with
    /// the queue pair).
    #[inline]
    pub fn prepared(&self) -> Option<Prepared> {
        let (index, generation) = match &self.origin {
            Origin::Slot(slot) if slot.prepared != NOT_PREPARED => (slot.prepared, slot.generation),
            Origin::PreparedRecv {
                index, generation, ..
            } => (*index, *generation),
            _ => return None,
        };
        // The queue pair owns its CQ, so the entry's QP number is ours.
        Some(Prepared::of_post(
            index,
            generation,
            self.wc.qp_num(),
            self.is_recv,
        ))
    }

    /// `Ok` on success, else the typed error with the primer's meaning
    /// (as [`Completion::result`]).
    #[inline]
    pub fn result(&self) -> Result<(), Error> {
        if self.status() == WcStatus::SUCCESS {
            return Ok(());
        }
        Err(super::inflight::completion_error(
            self.is_recv,
            self.status(),
            self.opcode(),
            self.tag(),
            self.vendor_err(),
        ))
    }

    /// Takes the first buffer the request still holds.
    #[inline]
    pub fn take_buf(&mut self) -> Option<B> {
        match &mut self.origin {
            Origin::Slot(slot) => slot.take_first(),
            _ => None,
        }
    }

    /// The full completion, with every buffer the request still holds.
    #[inline]
    pub fn into_owned(mut self) -> Completion<B> {
        let mut c = Completion {
            tag: self.tag(),
            is_recv: self.is_recv,
            status: self.status(),
            opcode: self.opcode(),
            byte_len: self.byte_len(),
            imm: self.imm(),
            signaled: self.signaled(),
            vendor_err: self.vendor_err(),
            bufs: Bufs::new([None, None, None, None]),
            srq_wr_id: 0,
            prepared: self.prepared(),
        };
        match &mut self.origin {
            Origin::Slot(slot) => slot.take_bufs_into(&mut c.bufs),
            Origin::Foreign if self.is_recv => c.srq_wr_id = self.wc.wr_id(),
            _ => {}
        }
        c
    }
}

impl<B> Drop for CompletionRef<'_, B> {
    #[inline(always)]
    fn drop(&mut self) {
        if let Origin::Slot(slot) = &mut self.origin {
            slot.drop_leftover();
        }
    }
}

impl<B> core::fmt::Debug for CompletionRef<'_, B> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CompletionRef")
            .field("tag", &self.tag())
            .field("is_recv", &self.is_recv)
            .field("status", &self.status())
            .field("opcode", &self.opcode())
            .field("byte_len", &self.byte_len())
            .field("signaled", &self.signaled())
            .field("prepared", &self.prepared())
            .finish()
    }
}
