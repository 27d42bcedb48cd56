//! Connections on a shared engine: a queue pair placed with
//! [`super::CmRequest::place`] or [`super::CmResolved::place`] is
//! connected, and disconnected, through the engine that holds it; the id
//! is found through the queue pair, as for a [`super::CmConnection`].

use crate::engine::{Engine, QpId, QpState};
use crate::error::{site, Error, ErrorKind};
use crate::memory::NicBuf;

use super::steps::check_private_data;

#[cfg_attr(docsrs, doc(cfg(feature = "rdmacm")))]
impl<B: NicBuf> Engine<B> {
    /// Accepts the connect request whose queue pair
    /// [`super::CmRequest::place`] put on this engine as `qp`
    /// (`rdma_accept`), sending `private_data` (at most
    /// [`super::MAX_ACCEPT_PRIVATE_DATA`] bytes). Returns at once: ESTABLISHED
    /// arrives through [`Engine::cm_event`], and only then may the queue
    /// pair send (receives may be posted from the start). Once per queue
    /// pair; `NotFound` for a queue pair rdma_cm did not make (or one
    /// removed), `BadState` for one that connects instead.
    pub fn cm_accept(&mut self, qp: QpId, private_data: &[u8]) -> Result<(), Error> {
        self.cm_start(qp, true, private_data)
    }

    /// Connects the queue pair [`super::CmResolved::place`] put on this
    /// engine as `qp` (`rdma_connect`), sending `private_data` (at most
    /// [`super::MAX_CONNECT_PRIVATE_DATA`] bytes). Returns at once: ESTABLISHED
    /// (with the peer's accept data) or the reason it failed (REJECTED,
    /// UNREACHABLE, ...) arrives through [`Engine::cm_event`]. Once per
    /// queue pair.
    pub fn cm_connect(&mut self, qp: QpId, private_data: &[u8]) -> Result<(), Error> {
        self.cm_start(qp, false, private_data)
    }

    /// Disconnects `qp` (`rdma_disconnect`): it goes to the error state
    /// (requests in flight flush back through the poll) and its peer sees
    /// DISCONNECTED. Once, and only once ESTABLISHED was seen: later
    /// calls, and calls after the peer's disconnect, do nothing. To give
    /// up on a connection still being made, remove its queue pair
    /// ([`Engine::remove_qp`]): that destroys its id too.
    pub fn cm_disconnect(&mut self, qp: QpId) -> Result<(), Error> {
        let id = self.cm_id(qp)?;
        if !id.take_connected() {
            return Ok(());
        }
        id.disconnect()?;
        self.mark_state(qp, QpState::ERR)
    }

    /// `rdma_accept` (`passive`) or `rdma_connect` on `qp`'s id.
    pub(crate) fn cm_start(
        &mut self,
        qp: QpId,
        passive: bool,
        private_data: &[u8],
    ) -> Result<(), Error> {
        let id = self.cm_id(qp)?;
        if id.is_passive() != passive {
            return Err(Error::new(
                site!(
                    "rdma_cm",
                    "cm_accept is for a placed request, cm_connect for a placed resolved id"
                ),
                ErrorKind::BadState,
            ));
        }
        check_private_data(passive, private_data)?;
        if self.state(qp)? != QpState::INIT || !id.take_start() {
            return Err(Error::new(
                site!(
                    "rdma_cm",
                    "a placed queue pair connects (or accepts) once, from INIT"
                ),
                ErrorKind::BadState,
            ));
        }
        let dev = self.context().query_device()?;
        // Both the reads this end may have outstanding and those it serves.
        let rd = dev
            .max_qp_rd_atom()
            .min(dev.max_qp_init_rd_atom())
            .clamp(1, 16);
        id.connect_or_accept(passive, private_data, rd)
    }
}
