//! One arena buffer for a peer: through a type-2 memory window bound to
//! exactly its range, where the device enforces window bounds, else through
//! a registration of the buffer alone. Soft-RoCE's responder checks a
//! window's accesses against the whole region (rxe_resp.c, check_rkey), so
//! a window there would grant the whole arena: the engine never binds one.

use crate::error::{site, Error};
use crate::memory::{check_access, Access, ArenaBuf, ExposedBuf, NicBuf};
use crate::raw::RawMw;
use crate::sys::ibv_wc_opcode as WcOpcode;

use super::check::{cannot_send, engine_full, post_hint};
use super::core::Engine;
use super::doorbell::{self, Verbs};
use super::flights::NOT_PREPARED;
use super::qp_slot::QpId;

impl<B: NicBuf> Engine<B, Verbs> {
    /// Gives the peer of `qp` access to exactly `buf`, and nothing else of
    /// its arena (`access`: `REMOTE_WRITE`, `REMOTE_READ`, `REMOTE_ATOMIC`).
    ///
    /// Where the device's windows enforce their bounds and the arena allows
    /// windows, a type-2 window is bound through `qp`'s send queue: give the
    /// peer [`ExposedBuf::remote`] only after that bind's completion (opcode
    /// `BIND_MW`, tag `tag`) came back from [`Engine::poll`]. Otherwise the
    /// buffer gets a registration of its own, ready at once (no completion:
    /// [`ExposedBuf::kind`] says which).
    pub fn expose(
        &mut self,
        qp: QpId,
        buf: ArenaBuf,
        access: Access,
        tag: u64,
    ) -> Result<ExposedBuf, (Error, ArenaBuf)> {
        if let Err(e) = check_access(access) {
            return Err((e, buf));
        }
        let windows =
            self.prov.windows_bounded && buf.shared().mr_access().contains(Access::MW_BIND);
        if !windows {
            return ExposedBuf::register(buf, access);
        }
        if !buf.shared().pd.same_as(&self.prov.pd) {
            let e = Error::invalid(site!(
                "expose",
                "the arena and the queue pair are in different protection domains"
            ));
            return Err((e, buf));
        }
        let (prov, slot, flights) = match self.parts(qp) {
            Ok(s) => s,
            Err(e) => return Err((e, buf)),
        };
        if slot.send.len() >= slot.send_room {
            return Err((cannot_send(slot.state), buf));
        }
        if flights[0].available() == 0 {
            return Err((engine_full(), buf));
        }
        let mut mw = match RawMw::alloc(&prov.pd.raw) {
            Ok(mw) => mw,
            Err(e) => return Err((e, buf)),
        };
        // A new tag in the rkey's low byte for each bind (`ibv_inc_rkey`).
        let old = mw.rkey();
        let rkey = (old & !0xff) | (old.wrapping_add(1) & 0xff);
        let seq = slot.send.next_seq();
        let Some(raw) = slot.qp.as_ref() else {
            return Err((Error::invalid(site!("queue pair")), buf));
        };
        if let Err(e) = doorbell::bind(raw, qp.index, seq, &mw, &buf, rkey, access) {
            // Never bound: the buffer was never reachable through the window.
            drop(mw);
            return Err((post_hint(e), buf));
        }
        // From the post on, the window keeps the buffer until deallocated.
        mw.keep(buf);
        slot.unsignaled_run = 0;
        flights[0].push_bare(&mut slot.send, tag, WcOpcode::BIND_MW, NOT_PREPARED, 0);
        Ok(ExposedBuf::window(mw, rkey))
    }
}
