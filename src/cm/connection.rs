//! One connection with a completion queue of its own: the queue pair on
//! an engine that holds only it, connected before the caller gets it.

use alloc::vec::Vec;

use crate::device::Context;
use crate::engine::{Engine, EngineConfig, QpConfig};
use crate::error::{site, Error};
use crate::memory::NicBuf;
use crate::pd::ProtectionDomain;
use crate::qp::QueuePair;
use crate::raw::cm::RawCmId;
use crate::sys::rdmacm::rdma_cm_event_type as Ev;
use crate::time::Deadline;

/// A connected RC queue pair set up by the connection manager.
pub struct CmConnection<B: NicBuf> {
    /// Always `Some` but inside [`CmConnection::into_queue_pair`].
    qp: Option<QueuePair<B>>,
    peer_private_data: Vec<u8>,
}

impl<B: NicBuf> CmConnection<B> {
    /// What the peer put in its connect request or accept.
    pub fn peer_private_data(&self) -> &[u8] {
        &self.peer_private_data
    }

    pub(super) fn set_peer_private_data(&mut self, data: Vec<u8>) {
        self.peer_private_data = data;
    }

    /// The device context the connection manager chose.
    pub fn context(&self) -> &Context {
        self.pd().context()
    }

    /// Disconnects (`rdma_disconnect`) the queue pair this connection
    /// holds: it goes to the error state (requests in flight flush) and
    /// its peer sees DISCONNECTED. Once: later calls do nothing (see
    /// [`Engine::cm_disconnect`]).
    ///
    /// Hostile use: swap two connections' queue pairs (or move one out to
    /// another thread and put another in its place). The connection
    /// reaches its id through the queue pair it holds now, so it
    /// disconnects and records exactly that one, and never reads the id of
    /// a queue pair another thread may be destroying; one that holds a
    /// queue pair the connection manager did not make has nothing to
    /// disconnect (`NotFound`). Tests: `rdma_cm`'s
    /// `disconnect_moves_the_queue_pair_the_connection_holds` and
    /// `a_queue_pair_moved_to_another_thread_is_left_alone_by_its_old_connection`.
    pub fn disconnect(&mut self) -> Result<(), Error> {
        let qp = self.id();
        self.engine_mut().cm_disconnect(qp)
    }

    /// Waits until the peer disconnects the queue pair this connection
    /// holds (its id's DISCONNECTED event; at once if it came already).
    pub fn wait_disconnected(&mut self, deadline: Deadline) -> Result<(), Error> {
        let qp = self.id();
        let engine = self.engine_mut();
        if engine.cm_id(qp)?.peer_disconnected() {
            return Ok(());
        }
        engine
            .cm_wait_for(
                qp,
                Ev::DISCONNECTED,
                site!("rdma_cm: wait for DISCONNECTED"),
                deadline,
            )
            .map(drop)
    }

    /// The queue pair alone, without this wrapper's disconnect on drop:
    /// it still carries its connection (the id goes with it; dropping it
    /// destroys both, and the peer sees DISCONNECTED).
    pub fn into_queue_pair(mut self) -> QueuePair<B> {
        match self.qp.take() {
            Some(qp) => qp,
            None => unreachable!("a CmConnection holds its queue pair until consumed"),
        }
    }
}

/// The connection is its queue pair: `conn.post_send(..)`, `conn.poll(..)`.
impl<B: NicBuf> core::ops::Deref for CmConnection<B> {
    type Target = QueuePair<B>;
    fn deref(&self) -> &QueuePair<B> {
        match &self.qp {
            Some(qp) => qp,
            None => unreachable!("a CmConnection holds its queue pair until consumed"),
        }
    }
}

impl<B: NicBuf> core::ops::DerefMut for CmConnection<B> {
    fn deref_mut(&mut self) -> &mut QueuePair<B> {
        match &mut self.qp {
            Some(qp) => qp,
            None => unreachable!("a CmConnection holds its queue pair until consumed"),
        }
    }
}

impl<B: NicBuf> Drop for CmConnection<B> {
    fn drop(&mut self) {
        // Disconnects the queue pair it holds, through that queue pair's
        // own id; then the queue pair's drop clears the id's pointer and
        // destroys it.
        if self.qp.is_some() {
            let _ = self.disconnect();
        }
    }
}

/// Connect or accept on `id` (by its side) with a queue pair in `pd` on
/// an engine of its own, sending `private_data`; waits for ESTABLISHED.
pub(super) fn establish<B: NicBuf>(
    id: RawCmId,
    pd: &ProtectionDomain,
    config: &QpConfig,
    private_data: &[u8],
    deadline: Deadline,
) -> Result<CmConnection<B>, Error> {
    super::steps::check_private_data(id.is_passive(), private_data)?;
    let depth = config.max_send_wr.max(1) + config.max_recv_wr.max(1);
    let mut engine: Engine<B> = Engine::new(
        pd,
        &EngineConfig {
            cq_depth: Some(depth),
            ..EngineConfig::default()
        },
    )?;
    let (qp, id) = engine.place_cm(id, config)?;
    engine.cm_start(qp, id.is_passive(), private_data)?;
    let step = if id.is_passive() {
        site!("rdma_cm: accept")
    } else {
        site!("rdma_cm: connect")
    };
    let ev = engine.cm_wait_for(qp, Ev::ESTABLISHED, step, deadline)?;
    Ok(CmConnection {
        qp: Some(QueuePair::from_parts(engine, qp)?),
        peer_private_data: ev.into_private_data(),
    })
}
