//! Removing a queue pair: destroyed first, then what it still held goes
//! back (as flushed, through the caller's callback) and its slot is left
//! vacant; a failed destroy leaks the queue pair with everything posted to
//! it.

use crate::error::{site, Error};
use crate::memory::NicBuf;

use super::completion::CompletionRef;
use super::core::{vacant_slot, Engine};
use super::doorbell::Provider;
use super::qp_slot::{QpId, QpState, Tally, UD_GENERATION, VACANT};
use super::ring::Ring;

impl<B: NicBuf, P: Provider> Engine<B, P> {
    /// Destroys `qp` and drops the buffers it still owned (in flight, or
    /// in its prepared requests): after a successful destroy the device no
    /// longer touches them. If the destroy fails, the queue pair and all of
    /// them are leaked instead, and the error says so.
    pub fn remove_qp(&mut self, qp: QpId) -> Result<(), Error> {
        self.remove_qp_with(qp, |_| {})
    }

    /// [`Engine::remove_qp`], handing back through `on_done`, as flushed,
    /// every request the queue pair still held, once its destroy
    /// succeeded (the device is then done with their buffers): for a
    /// caller that must get its buffers back from a queue pair it could
    /// not reset. A failed destroy hands back nothing.
    pub(crate) fn remove_qp_with(
        &mut self,
        qp: QpId,
        mut on_done: impl FnMut(CompletionRef<'_, B, P>),
    ) -> Result<(), Error> {
        self.slot(qp)?;
        self.teardown_slot(qp.index, &mut on_done)
    }

    /// Destroys the queue pair in slot `index` (see `remove_qp_with`).
    fn teardown_slot(
        &mut self,
        index: u32,
        on_done: &mut impl FnMut(CompletionRef<'_, B, P>),
    ) -> Result<(), Error> {
        let slot = &mut self.qps[index as usize];
        let Some(handle) = slot.qp.take() else {
            return Ok(());
        };
        let qp_num = slot.qp_num;
        self.by_qpn.retain(|&(n, _)| n != qp_num);
        if let Err(e) = self.prov.destroy_qp(handle) {
            // The device may still reach every buffer posted to it: leak
            // the buffers in flight (their entries stay taken: the queue
            // pair may still complete them) and the prepared requests, and
            // never reuse the index (the live queue pair may still complete).
            let mut dead = core::mem::replace(&mut self.qps[index as usize], vacant_slot());
            self.counted.retire_slot(&dead);
            self.flights[0].leak_chain(&mut dead.send);
            self.flights[self.recv_side].leak_chain(&mut dead.recv);
            core::mem::forget(dead);
            self.prepared.leak_qp(index);
            self.binds.leak_qp(index);
            self.ahs.pin();
            return Err(e.leaked(site!(
                "ibv_destroy_qp",
                "the queue pair and every buffer posted to it were leaked"
            )));
        }
        // Destroyed: like RESET, it holds no work request; what its queues
        // still hold in the table goes back as flushed (the device is done
        // with their buffers), each entry released. Its state refuses the
        // posts a callback tries on it. The slot is left vacant when the
        // hand-back ends, or if a callback unwinds out of it.
        self.qps[index as usize].set_state(QpState::RESET);
        let id = self.id_of(index);
        let vacating = Vacating {
            engine: self,
            index,
        };
        vacating.engine.retire_all(id, on_done)?;
        Ok(())
    }

    /// Leaves slot `index`, whose queue pair was destroyed, vacant: no
    /// handle of it matches the slot any more, and its index can be reused.
    fn vacate(&mut self, index: u32) {
        let slot = &mut self.qps[index as usize];
        self.counted.retire_slot(slot);
        slot.tally = Tally::default();
        // Nothing is left but after a callback unwound mid-hand-back (the
        // router handed back the rest); the device is done with it anyway.
        self.flights[0].release_chain(&mut slot.send);
        self.flights[self.recv_side].release_chain(&mut slot.recv);
        slot.qp_num = VACANT;
        // Its completions still queued hold ids of the old window.
        slot.generation = slot.generation.wrapping_add(1) & !UD_GENERATION;
        let keep_send = slot.send.next_seq();
        let keep_recv = slot.recv.next_seq();
        slot.send = Ring::new(0, keep_send);
        slot.recv = Ring::new(0, keep_recv);
        self.prepared.release_qp(index);
        self.vacant.push(index);
    }
}

/// A destroyed queue pair's slot being emptied: left vacant when dropped,
/// whether the hand-back returned or its callback unwound.
struct Vacating<'e, B: NicBuf, P: Provider> {
    engine: &'e mut Engine<B, P>,
    index: u32,
}

impl<B: NicBuf, P: Provider> Drop for Vacating<'_, B, P> {
    fn drop(&mut self) {
        self.engine.vacate(self.index);
    }
}
