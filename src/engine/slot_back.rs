//! A lane's queue pair slot put back into its engine while the router
//! runs (it may route the queue pair's shared or raw completions, or the
//! engine's receives of a lane without its own), posts on it refused
//! meanwhile (a callback's post would mix a request with entries into the
//! lane's queues, which keep none), and taken out again when this is
//! dropped, even if the caller's callback panics.

use crate::memory::NicBuf;

use super::core::Engine;
use super::doorbell::Provider;
use super::qp_slot::QpSlot;

pub(super) struct SlotBack<'a, B: NicBuf, P: Provider> {
    pub(super) engine: &'a mut Engine<B, P>,
    slot: &'a mut QpSlot<P::Qp>,
    qp: u32,
}

impl<'a, B: NicBuf, P: Provider> SlotBack<'a, B, P> {
    /// Swaps the lane's `slot` with its placeholder at `qp` in `engine`.
    pub(super) fn new(engine: &'a mut Engine<B, P>, slot: &'a mut QpSlot<P::Qp>, qp: u32) -> Self {
        core::mem::swap(slot, &mut engine.qps[qp as usize]);
        let back = &mut engine.qps[qp as usize];
        (back.send_room, back.recv_room) = (0, 0);
        SlotBack { engine, slot, qp }
    }
}

impl<B: NicBuf, P: Provider> Drop for SlotBack<'_, B, P> {
    fn drop(&mut self) {
        core::mem::swap(self.slot, &mut self.engine.qps[self.qp as usize]);
        // The rooms its state allows (the router may have moved it to ERR).
        self.slot.set_state(self.slot.state);
    }
}
