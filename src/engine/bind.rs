//! Window binds: from the post of a bind until the engine has seen its
//! completion, the engine holds the window (and through it the buffer it
//! binds), so that nothing can deallocate the window or free the buffer
//! while the device may still carry the bind out (the io_uring rule: an
//! operation's memory stays with the driver until its completion).
//! [`Engine::bind_posted`] takes the window and gives a [`BindTicket`];
//! [`Engine::claim_bind`] gives the window back only once the bind is no
//! longer in flight: its completion (or a later one) polled, a reset's
//! flush, or its queue pair destroyed. A queue pair whose destroy failed,
//! or that a forgotten lane leaked, keeps its binds' windows forever.

use crate::error::{site, Error, ErrorKind};
use crate::memory::NicBuf;
use crate::sys::ibv_wc_opcode as WcOpcode;

use super::bind_table::BindTicket;
use super::check::{cannot_send_on, engine_full};
use super::core::Engine;
use super::doorbell::Provider;
use super::flights::NOT_PREPARED;
use super::id;
use super::qp_slot::QpId;

impl<B: NicBuf, P: Provider> Engine<B, P> {
    /// Where a bind on `qp` goes, once its send queue and the engine's
    /// table of requests in flight have room (a bind is signaled, so it
    /// takes an entry like any send): the provider, the queue pair's
    /// handle and the work request id of its next send. The caller posts
    /// the bind with that id, then calls [`Engine::bind_posted`] before
    /// anything else posts on this engine.
    pub(crate) fn bind_slot(&mut self, qp: QpId) -> Result<(&mut P, &P::Qp, u64), Error> {
        let (prov, slot, flights) = self.parts(qp)?;
        if slot.send.len() >= slot.send_room {
            return Err(cannot_send_on(slot));
        }
        if flights[0].available() == 0 {
            return Err(engine_full());
        }
        let seq = slot.send.next_seq();
        let raw = slot
            .qp
            .as_ref()
            .ok_or(Error::invalid(site!("queue pair")))?;
        Ok((prov, raw, id::ring(false, qp.index, seq)))
    }

    /// Records the bind just posted on `qp` (with the id `bind_slot` gave)
    /// as a signaled send tagged `tag`, in an entry of the table its
    /// completion retires, and keeps `window` until then.
    pub(crate) fn bind_posted(&mut self, qp: QpId, tag: u64, window: P::Window) -> BindTicket {
        let engine = self.id;
        let (_, slot, flights) = match self.parts(qp) {
            Ok(p) if p.2[0].available() > 0 => p,
            // Not the queue pair (or the room) `bind_slot` found: nothing
            // can say when the bind ends, so its window is kept for good.
            _ => return self.binds.insert(engine, qp, 0, window, true),
        };
        let seq = slot.send.next_seq();
        slot.unsignaled_run = 0;
        flights[0].push_bare(
            &mut slot.send,
            tag,
            WcOpcode::BIND_MW,
            NOT_PREPARED,
            0,
            false,
        );
        self.binds.insert(engine, qp, seq, window, false)
    }

    /// The window of `ticket`'s bind, once the bind is no longer in
    /// flight; until then (or for another engine's ticket) the ticket
    /// comes back with the error.
    pub(crate) fn claim_bind(
        &mut self,
        ticket: BindTicket,
    ) -> Result<P::Window, (Error, BindTicket)> {
        let Some((qp, seq, leaked)) = self.binds.find(self.id, &ticket) else {
            return Err((not_ours(), ticket));
        };
        if self.bind_in_flight(qp, seq, leaked) {
            return Err((in_flight(), ticket));
        }
        match self.binds.take(&ticket) {
            Some(window) => Ok(window),
            None => Err((not_ours(), ticket)),
        }
    }

    /// True while the device may still carry out bind `seq` of `qp`.
    fn bind_in_flight(&self, qp: QpId, seq: u64, leaked: bool) -> bool {
        match self.qps.get(qp.index as usize) {
            _ if leaked => true,
            // A forgotten lane leaked the queue pair.
            Some(s) if s.lane_out => true,
            Some(s) => s.generation == qp.generation && s.is_live() && s.send.contains(seq),
            None => false,
        }
    }
}

#[cold]
fn not_ours() -> Error {
    Error::new(
        site!("expose", "not a bind of this engine, or claimed"),
        ErrorKind::NotFound,
    )
}

#[cold]
fn in_flight() -> Error {
    Error::new(
        site!(
            "expose",
            "the window's bind has not completed: the device may still carry it out",
            "poll until its completion (opcode BIND_MW, the tag given to expose) comes back"
        ),
        ErrorKind::BadState,
    )
}
