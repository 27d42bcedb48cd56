//! The engine's shared receive queue: one pool of receives for every queue
//! pair. Receives complete in any order across queue pairs, so each has a
//! slot with a generation rather than a ring position; its id names both,
//! so a stale, duplicated or foreign id reaches no buffer.
//!
//! A completed receive's buffers stay in their slot, lent to the poll's
//! callback (its generation moved on, so the old id reaches nothing): the
//! callback reads them there, posts the slot again in place (its entries
//! as its first post built them), or takes them out; what it leaves is
//! dropped when it returns, the slot free. A shared-receive lane's
//! request (`srq_request.rs`) holds its slot as a [`LentSlot`] until it
//! is posted again or dropped, and the slot's id stays its receive's
//! meanwhile: the request borrows the lane, so no completion is polled
//! while it lives, and the next post or the release moves the id on.
//!
//! A slot keeps one id: while posted, its receive's; otherwise the one
//! its next post uses, with [`id::UNPOSTED`] flipped. A completion's id
//! names its slot in its slot bits, and an unposted slot's id names
//! another (the flipped bit is one of them), so one comparison finds
//! whether an id is its slot's receive in flight.

use alloc::boxed::Box;
use alloc::vec::Vec;

use crate::error::{site, Error, ErrorKind};
use crate::sgl::Sgl;

use super::doorbell::SrqWr;
use super::id::{self, UNPOSTED};
use super::ring::NONE;

/// One receive's slot: its buffers from post to completion, and while
/// lent.
pub(crate) struct SrqSlot<B> {
    pub(crate) tag: u64,
    pub(crate) sgl: Sgl<B>,
    /// The slot's request: its first `num_sge` entries built from `sgl` by
    /// the post that moved it here (`doorbell::srq_recv`), current while
    /// the slot is posted or lent (`sgl` changes only by a take, which
    /// frees the slot, and a free slot is posted again only by a post that
    /// builds them anew). Its id is the slot's: while posted (or lent to a
    /// lane's request), its receive's; otherwise the one its next post
    /// uses, `UNPOSTED` flipped.
    pub(crate) wr: SrqWr,
}

impl<B> SrqSlot<B> {
    /// The id the slot's next post uses (it is not posted).
    #[inline(always)]
    pub(crate) fn next_id(&self) -> u64 {
        self.wr.id() ^ UNPOSTED
    }

    /// The id of the slot's next post, for a slot lent in place: its
    /// receive's id (still the slot's) at the next generation.
    #[inline(always)]
    pub(crate) fn next_in_place(&self) -> u64 {
        id::next_generation(self.wr.id())
    }

    /// The slot is about to be posted again in place with `id` (its
    /// `next_id`, or its `next_in_place`): its request carries it.
    #[inline(always)]
    pub(crate) fn reposted(&mut self, id: u64) {
        self.wr.set_id(id);
    }

    /// The post of `id` (marked by `reposted`) was refused: not posted,
    /// the same id next.
    #[cold]
    pub(crate) fn refused(&mut self, id: u64) {
        self.wr.set_id(id ^ UNPOSTED);
    }

    /// The receive this slot's id names completed: no longer posted, its
    /// next post at the next generation.
    #[inline(always)]
    fn completed(&mut self, id: u64) {
        self.wr.set_id(id::next_generation(id) ^ UNPOSTED);
    }
}

/// The shared receive queue's handle and slots. `S` is the provider's handle.
pub(crate) struct SrqSlots<B, S> {
    pub(crate) srq: S,
    slots: Box<[SrqSlot<B>]>,
    /// Free slot numbers; allocated once, never grows past `slots`.
    free: Vec<u32>,
    /// The slot lent to the running callback, or `NONE`.
    lent: u32,
    pub(crate) max_sge: u32,
}

impl<B, S> SrqSlots<B, S> {
    /// Slots for `capacity` receives (what the device granted).
    pub(crate) fn new(srq: S, capacity: u32, max_sge: u32) -> SrqSlots<B, S> {
        let capacity = capacity.clamp(1, id::MAX_SRQ_SLOTS);
        let mut slots = Vec::with_capacity(capacity as usize);
        for slot in 0..capacity {
            slots.push(SrqSlot {
                tag: 0,
                sgl: Sgl::empty(),
                wr: SrqWr::new(id::srq(slot, 0) ^ UNPOSTED),
            });
        }
        SrqSlots {
            srq,
            slots: slots.into_boxed_slice(),
            free: (0..capacity).rev().collect(),
            lent: NONE,
            max_sge,
        }
    }

    /// The handle and the slots, apart (to destroy the one before dropping
    /// the other, or to leak the other if that fails).
    pub(crate) fn into_parts(self) -> (S, Box<[SrqSlot<B>]>) {
        (self.srq, self.slots)
    }

    /// Receives it can hold.
    pub(crate) fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Receives posted and not yet completed.
    pub(crate) fn posted(&self) -> usize {
        self.slots.len() - self.free.len() - usize::from(self.lent != NONE)
    }

    /// A free slot for the next receive, its id, and the slot's list to move
    /// the buffers into once posted; `commit` marks it posted.
    pub(crate) fn reserve(&mut self) -> Result<(u32, u64), Error> {
        let Some(&slot) = self.free.last() else {
            return Err(Error::new(
                site!(
                    "post_srq_recv",
                    "every slot of the shared receive queue is posted",
                    "poll receives to return buffers, or a larger SrqConfig::max_wr"
                ),
                ErrorKind::QueueFull,
            ));
        };
        Ok((slot, self.slots[slot as usize].next_id()))
    }

    /// The queue's handle and a reserved slot, to build its entries in
    /// and move the posted buffers into.
    pub(crate) fn handle_and_slot(&mut self, slot: u32) -> (&S, &mut SrqSlot<B>) {
        (&self.srq, &mut self.slots[slot as usize])
    }

    /// Marks the reserved slot posted, with the caller's tag.
    pub(crate) fn commit(&mut self, slot: u32, tag: u64) {
        let popped = self.free.pop();
        debug_assert_eq!(popped, Some(slot));
        let s = &mut self.slots[slot as usize];
        s.tag = tag;
        s.wr.set_id(s.next_id());
    }

    /// The slot whose receive in flight `id` names, if one does.
    #[inline(always)]
    pub(crate) fn posted_slot(&self, id: u64) -> Option<u32> {
        let slot = id::srq_slot_bits(id);
        match self.slots.get(slot as usize) {
            Some(s) if s.wr.id() == id => Some(slot),
            _ => None,
        }
    }

    /// Completes the receive a completion's `id` names: its slot lent to
    /// the poll's callback (its generation moves on), its buffers staying
    /// there; its tag. `None` for an id that names no posted receive.
    #[inline]
    pub(crate) fn lend(&mut self, id: u64) -> Option<u64> {
        let slot = self.posted_slot(id)?;
        let s = &mut self.slots[slot as usize];
        s.completed(id);
        self.lent = slot;
        Some(s.tag)
    }

    /// Completes the receive a completion's `id` names, lent to the
    /// returned [`LentSlot`] with its id unchanged (see the module's
    /// notes). `None` for an id that names no posted receive.
    #[inline(always)]
    pub(crate) fn lend_in_place(&mut self, id: u64) -> Option<LentSlot<'_, B, S>> {
        let index = self.posted_slot(id)?;
        let slot = &mut self.slots[index as usize];
        Some(LentSlot {
            srq: &self.srq,
            slot,
            free: &mut self.free,
        })
    }

    /// The first buffer of the lent slot, if one is lent.
    #[inline]
    pub(crate) fn lent_first(&self) -> Option<&B> {
        self.slots.get(self.lent as usize)?.sgl.first()
    }

    /// The queue's handle and the lent slot, to post it again in place
    /// (then `SrqSlot::reposted` and `SrqSlots::unlend`).
    #[inline(always)]
    pub(crate) fn lent_for_repost(&mut self) -> Option<(&S, &mut SrqSlot<B>)> {
        let s = self.slots.get_mut(self.lent as usize)?;
        Some((&self.srq, s))
    }

    /// The lent slot was posted again (`SrqSlot::reposted`): none is lent.
    #[inline(always)]
    pub(crate) fn unlend(&mut self) {
        self.lent = NONE;
    }

    /// The lent slot's buffers, moved out; the slot free. `None` when no
    /// slot is lent (posted again, or taken already).
    #[inline]
    pub(crate) fn take_lent(&mut self) -> Option<Sgl<B>> {
        let slot = core::mem::replace(&mut self.lent, NONE);
        let s = self.slots.get_mut(slot as usize)?;
        self.free.push(slot);
        let mut sgl = Sgl::empty();
        s.sgl.move_into(&mut sgl);
        Some(sgl)
    }

    /// Drops what the callback left in the lent slot (the device is done
    /// with it), the slot free: once per shared receive, after its
    /// callback returned or panicked.
    #[inline(always)]
    pub(crate) fn release_lent(&mut self) {
        if self.lent != NONE {
            self.release_lent_slot();
        }
    }

    #[cold]
    #[inline(never)]
    fn release_lent_slot(&mut self) {
        drop(self.take_lent());
    }
}

/// A completed shared receive lent in its slot to a shared-receive lane's
/// request (`SrqSlots::lend_in_place`): read there, then posted again in
/// place (and forgotten: nothing is left to release). Dropped without,
/// it frees the slot and drops its buffers (the device is done with
/// them). Forgotten otherwise, the slot keeps its buffers and its
/// receive's id until the queue is destroyed: it leaks, except that a
/// duplicate of that receive's completion would lend it again, which
/// is sound (the device completed it, and the forgotten one can no
/// longer reach it).
pub(crate) struct LentSlot<'a, B, S> {
    pub(crate) srq: &'a S,
    pub(crate) slot: &'a mut SrqSlot<B>,
    free: &'a mut Vec<u32>,
}

impl<B, S> Drop for LentSlot<'_, B, S> {
    #[inline(always)]
    fn drop(&mut self) {
        release(self.free, self.slot);
    }
}

/// Frees a lent slot that was not posted again, its buffers dropped. Out
/// of line and given the parts, so the request that holds them stays in
/// registers on the path that posts it again.
#[cold]
#[inline(never)]
fn release<B>(free: &mut Vec<u32>, slot: &mut SrqSlot<B>) {
    // Its id is a receive's: the one it was lent for, or a refused
    // repost's. That receive's completion reaches nothing now.
    let next = slot.next_in_place();
    slot.wr.set_id(next ^ UNPOSTED);
    free.push(id::srq_slot_bits(next));
    drop(core::mem::take(&mut slot.sgl));
}
