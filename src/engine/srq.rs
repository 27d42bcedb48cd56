//! The engine's shared receive queue: one pool of receives for every queue
//! pair. Receives complete in any order across queue pairs, so each has a
//! slot with a generation rather than a ring position; its id names both,
//! so a stale, duplicated or foreign id reaches no buffer.

use alloc::boxed::Box;
use alloc::vec::Vec;

use crate::error::{site, Error, ErrorKind};
use crate::sgl::Sgl;

use super::id::{self, GEN_MASK};

/// One receive's slot: its buffers from post to completion.
pub(crate) struct SrqSlot<B> {
    pub(crate) tag: u64,
    pub(crate) sgl: Sgl<B>,
    generation: u64,
    posted: bool,
}

/// The shared receive queue's handle and slots. `S` is the provider's handle.
pub(crate) struct SrqSlots<B, S> {
    pub(crate) srq: S,
    slots: Box<[SrqSlot<B>]>,
    /// Free slot numbers; allocated once, never grows past `slots`.
    free: Vec<u32>,
    pub(crate) max_sge: u32,
}

impl<B, S> SrqSlots<B, S> {
    /// Slots for `capacity` receives (what the device granted).
    pub(crate) fn new(srq: S, capacity: u32, max_sge: u32) -> SrqSlots<B, S> {
        let capacity = capacity.clamp(1, id::MAX_SRQ_SLOTS);
        let mut slots = Vec::with_capacity(capacity as usize);
        slots.resize_with(capacity as usize, || SrqSlot {
            tag: 0,
            sgl: Sgl::empty(),
            generation: 0,
            posted: false,
        });
        SrqSlots {
            srq,
            slots: slots.into_boxed_slice(),
            free: (0..capacity).rev().collect(),
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
        self.slots.len() - self.free.len()
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
        Ok((slot, id::srq(slot, self.slots[slot as usize].generation)))
    }

    /// The queue's handle and the list of a reserved slot, to move the
    /// posted buffers into.
    pub(crate) fn handle_and_sgl(&mut self, slot: u32) -> (&S, &mut Sgl<B>) {
        (&self.srq, &mut self.slots[slot as usize].sgl)
    }

    /// Marks the reserved slot posted, with the caller's tag.
    pub(crate) fn commit(&mut self, slot: u32, tag: u64) {
        let popped = self.free.pop();
        debug_assert_eq!(popped, Some(slot));
        let s = &mut self.slots[slot as usize];
        s.tag = tag;
        s.posted = true;
    }

    /// Completes the receive a completion names: its slot free again (its
    /// generation moves on); its tag, and its buffers for the caller to
    /// move out. `None` for an id that names no posted receive.
    #[inline]
    pub(crate) fn complete(&mut self, slot: u32, generation: u64) -> Option<(u64, &mut Sgl<B>)> {
        let s = self.slots.get_mut(slot as usize)?;
        if !s.posted || s.generation != generation {
            return None;
        }
        s.posted = false;
        s.generation = (s.generation + 1) & GEN_MASK;
        self.free.push(slot);
        Some((s.tag, &mut s.sgl))
    }
}
