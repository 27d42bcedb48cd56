//! One arena buffer for a peer: through a type-2 memory window bound to
//! exactly its range, where the device enforces window bounds, else through
//! a registration of the buffer alone. Soft-RoCE's responder checks a
//! window's accesses against the whole region (rxe_resp.c, check_rkey), so
//! a window there would grant the whole arena: the engine never binds one.

use crate::error::{site, Error};
use crate::memory::{check_access, Access, ArenaBuf, Exposed, ExposedBuf, NicBuf};
use crate::raw::RawMw;

use super::bind_table::BindTicket;
use super::check::post_hint;
use super::core::Engine;
use super::doorbell::{self, Verbs};
use super::qp_slot::QpId;

/// What [`Engine::expose`] gives: the [`ExposedBuf`] comes out of
/// [`Engine::exposed`], at once for a registration, and for a window only
/// once its bind's completion has come back. Until then the engine holds
/// the window and the buffer, so no one can hand out the descriptor,
/// revoke the window or get the buffer back while the device may still
/// carry the bind out.
///
/// Hostile use, each refused: claiming before the bind's completion
/// (`BadState`, the value comes back), claiming on another engine
/// (`NotFound`), claiming twice (it is moved by the first claim),
/// dropping or forgetting it (the window and buffer stay with the engine
/// until the engine is dropped, after its queue pairs are destroyed, and
/// are leaked if a destroy fails). Tests: `engine::sim::binds`.
#[must_use = "the exposed buffer comes out of Engine::exposed; dropped, a window stays with the engine until it is dropped"]
pub struct Exposing {
    state: State,
}

enum State {
    Ready(ExposedBuf),
    Binding(BindTicket),
}

impl Exposing {
    /// Window or registration.
    pub fn kind(&self) -> Exposed {
        match &self.state {
            State::Ready(e) => e.kind(),
            State::Binding(_) => Exposed::Window,
        }
    }

    /// True for a window whose bind must complete (its completion polled)
    /// before [`Engine::exposed`] gives the buffer out.
    pub fn is_binding(&self) -> bool {
        matches!(self.state, State::Binding(_))
    }
}

impl core::fmt::Debug for Exposing {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Exposing")
            .field("kind", &self.kind())
            .field("binding", &self.is_binding())
            .finish()
    }
}

impl<B: NicBuf> Engine<B, Verbs> {
    /// Gives the peer of `qp` access to exactly `buf`, and nothing else of
    /// its arena (`access`: `REMOTE_WRITE`, `REMOTE_READ`, `REMOTE_ATOMIC`).
    ///
    /// Where the device's windows enforce their bounds and the arena allows
    /// windows, a type-2 window is bound through `qp`'s send queue, and the
    /// engine keeps it, with the buffer, until that bind's completion
    /// (opcode `BIND_MW`, tag `tag`) has come back from [`Engine::poll`]:
    /// then [`Engine::exposed`] gives the [`ExposedBuf`]. Otherwise the
    /// buffer gets a registration of its own, which [`Engine::exposed`]
    /// gives at once ([`Exposing::kind`] says which). See [`Exposing`] for
    /// what a hostile caller can try.
    pub fn expose(
        &mut self,
        qp: QpId,
        buf: ArenaBuf,
        access: Access,
        tag: u64,
    ) -> Result<Exposing, (Error, ArenaBuf)> {
        if let Err(e) = check_access(access) {
            return Err((e, buf));
        }
        let windows =
            self.prov.windows_bounded && buf.shared().mr_access().contains(Access::MW_BIND);
        if !windows {
            let ready = ExposedBuf::register(buf, access)?;
            return Ok(Exposing {
                state: State::Ready(ready),
            });
        }
        if !buf.shared().pd.same_as(&self.prov.pd) {
            let e = Error::invalid(site!(
                "expose",
                "the arena and the queue pair are in different protection domains"
            ));
            return Err((e, buf));
        }
        let (prov, raw, wr_id) = match self.bind_slot(qp) {
            Ok(s) => s,
            Err(e) => return Err((e, buf)),
        };
        let mut mw = match RawMw::alloc(&prov.pd.raw) {
            Ok(mw) => mw,
            Err(e) => return Err((e, buf)),
        };
        // A new tag in the rkey's low byte for each bind (`ibv_inc_rkey`).
        let old = mw.rkey();
        let rkey = (old & !0xff) | (old.wrapping_add(1) & 0xff);
        if let Err(e) = doorbell::bind(raw, wr_id, &mw, &buf, rkey, access) {
            // Never bound: the buffer was never reachable through the window.
            drop(mw);
            return Err((post_hint(e), buf));
        }
        // From the post on, the window keeps the buffer until deallocated,
        // and the engine keeps the window until the bind's completion.
        mw.keep(buf);
        let ticket = self.bind_posted(qp, tag, ExposedBuf::window(mw, rkey));
        Ok(Exposing {
            state: State::Binding(ticket),
        })
    }

    /// The buffer `exposing` exposes: at once for a registration, and for
    /// a window once its bind is no longer in flight (its completion
    /// polled, the queue pair reset or removed). A bind that failed, or
    /// whose queue pair was reset or removed first, may have bound
    /// nothing: its [`ExposedBuf::remote`] then grants nothing, and
    /// [`ExposedBuf::revoke`] gives the buffer back. Before that, or on
    /// another engine, the error comes with `exposing` back.
    pub fn exposed(&mut self, exposing: Exposing) -> Result<ExposedBuf, (Error, Exposing)> {
        match exposing.state {
            State::Ready(e) => Ok(e),
            State::Binding(ticket) => self.claim_bind(ticket).map_err(|(e, ticket)| {
                (
                    e,
                    Exposing {
                        state: State::Binding(ticket),
                    },
                )
            }),
        }
    }
}
