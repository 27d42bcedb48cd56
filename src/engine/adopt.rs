//! Queue pairs the connection manager makes, placed on an engine like any
//! other (its completion queue, its shared receive queue, its table of
//! requests in flight), and the one event channel their ids report on.
//!
//! Who owns what: the queue pair's handle holds its rdma_cm id (which
//! outlives it, and forgets it before it is destroyed: `raw::qp`), so
//! removing the queue pair, or dropping the engine, ends the connection
//! too. The engine's channel is read only through the engine (`&mut`):
//! librdmacm may act on an id's queue pair while it reads an event (a
//! connect response moves it to RTR and RTS), so the reader must be
//! whoever could otherwise be destroying that queue pair.

use alloc::sync::Arc;

use crate::error::{site, Error};
use crate::memory::NicBuf;
use crate::raw::cm::{CmEvent, RawCmChannel, RawCmId};
use crate::raw::RawQp;

use super::config::{QpConfig, Transport};
use super::core::Engine;
use super::doorbell::Verbs;
use super::qp_slot::QpId;

impl<B: NicBuf> Engine<B, Verbs> {
    /// The channel the ids of this engine's rdma_cm queue pairs report on,
    /// made the first time one is asked for.
    pub(crate) fn cm_channel(&mut self) -> Result<Arc<RawCmChannel>, Error> {
        if let Some(c) = &self.cm_channel {
            return Ok(c.clone());
        }
        let c = RawCmChannel::create()?;
        self.cm_channel = Some(c.clone());
        Ok(c)
    }

    /// Moves `id` to this engine's channel and places a queue pair
    /// `rdma_create_qp` makes on it (in INIT: receives may be posted), on
    /// this engine's completion queue(s) and shared receive queue.
    pub(crate) fn place_cm(
        &mut self,
        id: RawCmId,
        config: &QpConfig,
    ) -> Result<(QpId, Arc<RawCmId>), Error> {
        if !id.is_on(&self.pd().context().raw) {
            return Err(Error::invalid(site!(
                "rdma_create_qp",
                "the engine's protection domain is not on the connection manager's context for this device",
                "make the engine on cm::context(), or on the pd() of a listener, request or resolved id; a PD from Context::open is on another context"
            )));
        }
        if config.transport != Transport::Rc {
            return Err(Error::invalid(site!(
                "rdma_create_qp",
                "rdma_cm connects reliable-connected queue pairs here (RDMA_PS_TCP)"
            )));
        }
        let channel = self.cm_channel()?;
        let id = Arc::new(id.migrate(&channel)?);
        let config = QpConfig {
            port: id.port(),
            ..*config
        };
        let maker = id.clone();
        let qp = self.add_qp_made(&config, &mut |parts| RawQp::create_on(&maker, parts))?;
        id.placed_as((qp.engine, qp.index, qp.generation));
        Ok((qp, id))
    }

    /// The queue pair of this engine an event's id made, and the id: only
    /// while the slot its id was placed in still holds a queue pair made
    /// on that same id (not once it was removed, its slot reused, or the
    /// event came from another engine's id).
    pub(crate) fn cm_placed(&self, ev: &CmEvent) -> Option<(QpId, Arc<RawCmId>)> {
        let (engine, index, generation) = ev.placed?;
        let qp = QpId {
            engine,
            index,
            generation,
        };
        let id = self.cm_id(qp).ok()?;
        (id.addr() == ev.id).then_some((qp, id))
    }
}
