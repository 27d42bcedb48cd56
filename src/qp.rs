//! One queue pair with a completion queue of its own: the simple case,
//! built on an [`Engine`] holding that one queue pair (the same data path,
//! the same checks), with every call on it and no ids to pass around.

use crate::device::{GidEntry, PortAttr};
use crate::endpoint::Endpoint;
use crate::engine::{
    Completion, CompletionRef, ConnectOptions, Engine, EngineConfig, Exposing, Lane, PathInfo,
    PostError, PreparedHandle, PreparedRecv, PreparedSend, Provider, QpAttributes, QpConfig, QpId,
    QpState, Verbs,
};
use crate::error::{site, Error, ErrorKind};
use crate::memory::{Access, ArenaBuf, ExposedBuf, HostBuf, NicBuf};
use crate::pd::ProtectionDomain;
use crate::sys;
use crate::time::Deadline;
use crate::wr::{RecvRequest, SendOp, SendRequest};

/// A queue pair with its own completion queue, owning the buffers of every
/// request in flight (type `B`) until they complete.
///
/// Created in INIT; [`QueuePair::connect`] takes it to RTS. Posting and
/// polling take `&mut self`: one owner, no lock on the data path. For many
/// queue pairs on one completion queue, use an [`Engine`] directly
/// ([`QueuePair::engine_mut`] reaches this one's).
///
/// Its queue pair can go away behind its back: removed through
/// [`QueuePair::engine_mut`] (`remove_qp(qp.id())`, or the whole engine
/// replaced), or leaked with a [`Lane`] that was `mem::forget`-ten. Every
/// call that needs it then returns a `NotFound` error saying so; none
/// panics, and [`QueuePair::id`] and [`QueuePair::qp_num`] keep naming
/// the queue pair it was made with.
/// `P` is where its work requests go: the device, unless the crate's own
/// tests put a simulated one there.
pub struct QueuePair<B, P: Provider = Verbs> {
    engine: Engine<B, P>,
    id: QpId,
    /// The number the device gave the queue pair: its identity, like `id`.
    qp_num: u32,
}

impl<B: NicBuf> QueuePair<B> {
    /// Creates an RC (or, per `config.transport`, UC) queue pair with a
    /// completion queue of its own on `pd`, in INIT, with the GID and
    /// addressing chosen from the port.
    pub fn new(pd: &ProtectionDomain, config: &QpConfig) -> Result<QueuePair<B>, Error> {
        let depth = config.max_send_wr.max(1) + config.max_recv_wr.max(1);
        Self::with_engine(
            pd,
            config,
            &EngineConfig {
                cq_depth: Some(depth),
                ..EngineConfig::default()
            },
        )
    }

    /// As [`QueuePair::new`], with the completion queue(s) `engine` asks
    /// for (events, a separate receive CQ, its depth).
    pub fn with_engine(
        pd: &ProtectionDomain,
        config: &QpConfig,
        engine: &EngineConfig,
    ) -> Result<QueuePair<B>, Error> {
        let mut cfg = *engine;
        if cfg.cq_depth.is_none() {
            cfg.cq_depth = Some(config.max_send_wr.max(1) + config.max_recv_wr.max(1));
        }
        let mut engine = Engine::new(pd, &cfg)?;
        let id = engine.add_qp(config)?;
        QueuePair::from_parts(engine, id)
    }

    /// This side's endpoint, to send to the peer: QPN, PSN, LID, GID, MTU,
    /// and no memory (add the regions you choose to share to `regions`).
    /// `NotFound` once this handle's queue pair is gone (see [`QueuePair`]).
    pub fn endpoint(&self) -> Result<Endpoint, Error> {
        self.engine.endpoint(self.id).map_err(|_| gone())
    }

    /// Connects to `peer` with default transport options: INIT -> RTR -> RTS.
    pub fn connect(&mut self, peer: &Endpoint) -> Result<PathInfo, Error> {
        self.engine.connect(self.id, peer)
    }

    /// Connects to `peer` with `opts` (see [`Engine::connect_with`]).
    pub fn connect_with(
        &mut self,
        peer: &Endpoint,
        opts: &ConnectOptions,
    ) -> Result<PathInfo, Error> {
        self.engine.connect_with(self.id, peer, opts)
    }

    /// Sets the first send PSN before connecting (see [`Engine::set_psn`]).
    pub fn set_psn(&mut self, psn: u32) -> Result<(), Error> {
        self.engine.set_psn(self.id, psn)
    }

    /// Flushes every request in flight to `on_done` and returns to INIT
    /// (see [`Engine::reset`]).
    pub fn reset(
        &mut self,
        deadline: Deadline,
        on_done: impl FnMut(CompletionRef<'_, B>),
    ) -> Result<(), Error> {
        self.engine.reset(self.id, deadline, on_done)
    }

    /// What the device reports (see [`Engine::query`]).
    pub fn query(&self) -> Result<QpAttributes, Error> {
        self.engine.query(self.id)
    }

    /// The GID entry this QP uses (None on InfiniBand without GIDs).
    pub fn gid(&self) -> Result<Option<GidEntry>, Error> {
        self.engine.gid(self.id).map_err(|_| gone())
    }

    /// The port attributes read at creation.
    pub fn port(&self) -> Result<PortAttr, Error> {
        self.engine.port(self.id).map_err(|_| gone())
    }

    /// An identity to compare with [`crate::device::AsyncEvent::element`].
    pub fn raw_id(&self) -> Result<usize, Error> {
        self.engine.raw_id(self.id).map_err(|_| gone())
    }

    /// Gives the peer access to exactly `buf` (see [`Engine::expose`]).
    pub fn expose(
        &mut self,
        buf: ArenaBuf,
        access: Access,
        tag: u64,
    ) -> Result<Exposing, (Error, ArenaBuf)> {
        self.engine.expose(self.id, buf, access, tag)
    }

    /// The buffer `exposing` exposes, once its window's bind has completed
    /// (see [`Engine::exposed`]).
    pub fn exposed(&mut self, exposing: Exposing) -> Result<ExposedBuf, (Error, Exposing)> {
        self.engine.exposed(exposing)
    }

    /// Polls until a request is handed back or `deadline` passes (see
    /// [`Engine::wait`]).
    pub fn wait(
        &mut self,
        deadline: Deadline,
        on_done: impl FnMut(CompletionRef<'_, B>),
    ) -> Result<usize, Error> {
        self.engine.wait(deadline, on_done)
    }

    /// The protection domain.
    pub fn pd(&self) -> &ProtectionDomain {
        self.engine.pd()
    }
}

impl<B: NicBuf, P: Provider> QueuePair<B, P> {
    /// A queue pair already placed on `engine` (which holds no other).
    pub(crate) fn from_parts(engine: Engine<B, P>, id: QpId) -> Result<QueuePair<B, P>, Error> {
        let qp_num = engine.qp_num(id)?;
        Ok(QueuePair { engine, id, qp_num })
    }

    /// The front of an engine that holds exactly the queue pair `qp`: for
    /// one made on an engine of the caller's configuration some other
    /// way, such as connected through rdma_cm (`CmRequest::place`, then
    /// `Engine::cm_accept`). Refused, with the engine handed back, when
    /// the engine holds another queue pair or not `qp`.
    #[allow(clippy::result_large_err)] // the engine comes back unboxed
    pub fn from_engine(
        engine: Engine<B, P>,
        qp: QpId,
    ) -> Result<QueuePair<B, P>, (Error, Engine<B, P>)> {
        let only = engine.qps().eq(core::iter::once(qp));
        match engine.qp_num(qp) {
            Ok(qp_num) if only => Ok(QueuePair {
                engine,
                id: qp,
                qp_num,
            }),
            _ => Err((
                Error::invalid(site!(
                    "QueuePair::from_engine",
                    "the engine must hold exactly this queue pair"
                )),
                engine,
            )),
        }
    }

    /// The queue pair's id on its engine.
    pub fn id(&self) -> QpId {
        self.id
    }

    /// The engine (this queue pair's completion queue).
    pub fn engine(&self) -> &Engine<B, P> {
        &self.engine
    }

    /// The engine, for what only it offers (`poll_queue`, more queue pairs).
    /// Removing this handle's own queue pair from it, or replacing it,
    /// leaves this handle with nothing to act on: its calls return errors.
    pub fn engine_mut(&mut self) -> &mut Engine<B, P> {
        &mut self.engine
    }

    /// The queue pair number: the one the device gave this handle's queue
    /// pair at creation. Never fails: like [`QueuePair::id`], it names that
    /// queue pair even once it is gone.
    pub fn qp_num(&self) -> u32 {
        self.qp_num
    }

    /// The state this handle last moved the QP to (ERR after a failed completion).
    pub fn state(&self) -> Result<QpState, Error> {
        self.engine.state(self.id).map_err(|_| gone())
    }

    /// What the device granted: queue depths, SGEs, inline size.
    pub fn caps(&self) -> Result<sys::ibv_qp_cap, Error> {
        self.engine.caps(self.id).map_err(|_| gone())
    }

    /// Requests in flight on the send and receive queues.
    pub fn in_flight(&self) -> Result<(u64, u64), Error> {
        self.engine.in_flight(self.id).map_err(|_| gone())
    }

    /// Posts one send-queue request (see [`Engine::post_send`]).
    #[inline]
    #[allow(clippy::result_large_err)] // the request comes back unboxed
    pub fn post_send(&mut self, req: SendRequest<B>) -> Result<(), PostError<SendRequest<B>>> {
        self.engine.post_send(self.id, req)
    }

    /// Posts up to [`crate::engine::MAX_CHAIN`] requests with one doorbell (see
    /// [`Engine::post_send_chain`]).
    pub fn post_send_chain(&mut self, reqs: &mut [Option<SendRequest<B>>]) -> Result<usize, Error> {
        self.engine.post_send_chain(self.id, reqs)
    }

    /// Posts data copied into the work request (see [`Engine::post_inline`]).
    #[inline]
    pub fn post_inline(
        &mut self,
        op: SendOp,
        data: &[u8],
        tag: u64,
        signaled: bool,
    ) -> Result<(), Error> {
        self.engine.post_inline(self.id, op, data, tag, signaled)
    }

    /// Posts a receive (see [`Engine::post_recv`]).
    #[inline]
    #[allow(clippy::result_large_err)] // the request comes back unboxed
    pub fn post_recv(&mut self, req: RecvRequest<B>) -> Result<(), PostError<RecvRequest<B>>> {
        self.engine.post_recv(self.id, req)
    }

    /// Polls once and hands back every finished request (see [`Engine::poll`]).
    #[inline]
    pub fn poll(&mut self, on_done: impl FnMut(CompletionRef<'_, B, P>)) -> Result<usize, Error> {
        self.engine.poll(on_done)
    }

    /// The next finished request (see [`Engine::wait_one`]).
    pub fn wait_one(&mut self, deadline: Deadline) -> Result<Completion<B>, Error> {
        self.engine.wait_one(deadline)
    }

    /// Keeps a send for posting again (see [`Engine::prepare_send`]).
    #[allow(clippy::result_large_err)] // the request comes back unboxed
    pub fn prepare_send(
        &mut self,
        req: SendRequest<B>,
    ) -> Result<PreparedSend, PostError<SendRequest<B>>> {
        self.engine.prepare_send(self.id, req)
    }

    /// Keeps a receive for posting again (see [`Engine::prepare_recv`]).
    #[allow(clippy::result_large_err)] // the request comes back unboxed
    pub fn prepare_recv(
        &mut self,
        req: RecvRequest<B>,
    ) -> Result<PreparedRecv, PostError<RecvRequest<B>>> {
        self.engine.prepare_recv(self.id, req)
    }

    /// Posts a prepared request (see [`Engine::post_prepared`]).
    #[inline(always)]
    pub fn post_prepared<H: PreparedHandle>(&mut self, p: H) -> Result<(), Error> {
        self.engine.post_prepared(p)
    }

    /// Posts a prepared send unsignaled (see [`Engine::post_prepared_unsignaled`]).
    #[inline(always)]
    pub fn post_prepared_unsignaled(&mut self, p: PreparedSend) -> Result<(), Error> {
        self.engine.post_prepared_unsignaled(p)
    }

    /// Posts a prepared send unsignaled, handed back only if it fails (see
    /// [`Engine::post_prepared_unreported`]).
    #[inline(always)]
    pub fn post_prepared_unreported(&mut self, p: PreparedSend) -> Result<(), Error> {
        self.engine.post_prepared_unreported(p)
    }

    /// Posts prepared sends as one chain (see [`Engine::post_prepared_chain`]).
    #[inline]
    pub fn post_prepared_chain(
        &mut self,
        chain: &[PreparedSend],
        signal: impl Fn(usize) -> bool,
    ) -> Result<(), Error> {
        self.engine.post_prepared_chain(chain, signal)
    }

    /// Starts a lane on this queue pair's prepared send and receive (see
    /// [`Engine::lane`]).
    pub fn lane(
        &mut self,
        send: PreparedSend,
        recv: Option<PreparedRecv>,
    ) -> Result<Lane<'_, B, P>, Error> {
        self.engine.lane(send, recv)
    }

    /// Lends a prepared request's first buffer (see [`Engine::prepared_buf`]).
    pub fn prepared_buf<H: PreparedHandle>(&mut self, p: H) -> Result<&mut B, Error> {
        self.engine.prepared_buf(p)
    }

    /// Ends a prepared request (see [`Engine::release_prepared`]).
    pub fn release_prepared<H: PreparedHandle>(
        &mut self,
        p: H,
    ) -> Result<impl Iterator<Item = B>, Error> {
        self.engine.release_prepared(p)
    }
}

impl<B: HostBuf, P: Provider> QueuePair<B, P> {
    /// Copies into a prepared request's buffer (see [`Engine::write_prepared`]).
    #[inline(always)]
    pub fn write_prepared<H: PreparedHandle>(
        &mut self,
        p: H,
        offset: usize,
        src: &[u8],
    ) -> Result<(), Error> {
        self.engine.write_prepared(p, offset, src)
    }

    /// Copies out of a prepared request's buffer (see [`Engine::read_prepared`]).
    #[inline]
    pub fn read_prepared<H: PreparedHandle>(
        &mut self,
        p: H,
        offset: usize,
        dst: &mut [u8],
    ) -> Result<(), Error> {
        self.engine.read_prepared(p, offset, dst)
    }
}

impl<B, P: Provider> core::fmt::Debug for QueuePair<B, P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("QueuePair").field("id", &self.id).finish()
    }
}

/// The queue pair's own id names a live slot of its own engine unless
/// the caller removed it through `engine_mut` (or replaced the engine) or
/// forgot a lane on it (which leaks it).
#[cold]
fn gone() -> Error {
    Error::new(
        site!(
            "QueuePair",
            "this QueuePair's queue pair is gone: removed through engine_mut(), or leaked with a forgotten Lane"
        ),
        ErrorKind::NotFound,
    )
}

#[cfg(test)]
mod tests;
