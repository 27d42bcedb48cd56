//! Connection management with librdmacm (cargo feature `rdmacm`): the
//! connection manager resolves the address, route, GID, LID and MTU by
//! itself and walks the queue pair to RTS (primer 7.1).
//!
//! [`connect`] and [`CmListener::accept`] are event-driven (ADDR_RESOLVED,
//! ROUTE_RESOLVED, CONNECT_REQUEST, ESTABLISHED; errors name the event that
//! arrived instead: ADDR_ERROR, ROUTE_ERROR, UNREACHABLE, REJECTED, ...),
//! each step bounded by the caller's deadline. Both carry private data, for
//! instance memory descriptors ([`encode_regions`]).
//!
//! The connection is its queue pair: the queue pair's handle holds the
//! id, and every piece of the connection's bookkeeping (the id, whether
//! it is still connected, its DISCONNECTED event) is found through the
//! queue pair, never kept beside it. So a [`CmConnection`] derefs to its
//! [`QueuePair`] for every verb of the safe layer, and a queue pair
//! swapped out of it (`mem::swap(&mut *a, &mut *b)`, `mem::replace`) takes
//! its connection with it: `disconnect` reaches only the queue pair the
//! connection holds, wherever the other went (another connection, another
//! thread), and a queue pair is destroyed the way librdmacm expects (the
//! id forgets it first, and outlives it), whoever drops it.

use alloc::sync::Arc;
use alloc::vec::Vec;
use std::net::SocketAddr;

use crate::device::Context;
use crate::engine::{Engine, EngineConfig, QpConfig, QpState};
use crate::error::{site, Error, ErrorKind};
use crate::memory::NicBuf;
use crate::pd::ProtectionDomain;
use crate::qp::QueuePair;
use crate::raw::cm::{CmEvent, RawCmChannel, RawCmId};
use crate::sys::rdmacm::rdma_cm_event_type as Ev;
use crate::time::Deadline;

mod regions;

pub use crate::sys::rdmacm::rdma_cm_event_type as CmEventType;
pub use regions::{decode_regions, encode_regions};

/// Most private data a connect request carries (RC, RDMA_PS_TCP).
pub const MAX_CONNECT_PRIVATE_DATA: usize = 56;
/// Most private data an accept carries.
pub const MAX_ACCEPT_PRIVATE_DATA: usize = 196;

/// The next event on `channel`, or `TimedOut` at `deadline`.
fn next(
    channel: &RawCmChannel,
    step: &'static crate::error::Site,
    deadline: Deadline,
) -> Result<CmEvent, Error> {
    loop {
        let ms = deadline.remaining().as_millis().clamp(1, 1000) as i32;
        if let Some(ev) = channel.next_event(ms)? {
            return Ok(ev);
        }
        if deadline.passed() {
            return Err(Error::new(step, ErrorKind::TimedOut));
        }
    }
}

/// The next event, which must be `want`; any other names itself in the error.
fn expect(
    channel: &RawCmChannel,
    want: Ev,
    step: &'static crate::error::Site,
    deadline: Deadline,
) -> Result<CmEvent, Error> {
    let ev = next(channel, step, deadline)?;
    if ev.kind == want && ev.status == 0 {
        return Ok(ev);
    }
    let site = match ev.kind {
        Ev::REJECTED => site!(
            "rdma_cm",
            "",
            "the peer refused: is anyone listening on that port, and did it accept?"
        ),
        Ev::UNREACHABLE | Ev::CONNECT_ERROR => site!(
            "rdma_cm",
            "",
            "no answer from the peer: address, routing, or the peer's device"
        ),
        Ev::ADDR_ERROR => site!(
            "rdma_cm",
            "",
            "the address does not resolve to an RDMA device: is an rxe/RoCE device on that netdev?"
        ),
        Ev::ROUTE_ERROR => site!("rdma_cm", "", "no route to the peer on the RDMA device"),
        _ => step,
    };
    Err(Error::cm(site, ev.kind.0, ev.status))
}

/// The step timeout librdmacm takes in milliseconds, bounded by the deadline.
fn step_ms(deadline: Deadline) -> i32 {
    deadline.remaining().as_millis().clamp(1, 5000) as i32
}

/// A protection domain on the device the connection manager chose for `id`.
fn pd_on(id: &Arc<RawCmId>) -> Result<ProtectionDomain, Error> {
    let ctx = Context {
        raw: Arc::new(id.context()?),
    };
    ProtectionDomain::new(&ctx)
}

/// A connected RC queue pair set up by the connection manager.
pub struct CmConnection<B: NicBuf> {
    qp: QueuePair<B>,
    peer_private_data: Vec<u8>,
}

impl<B: NicBuf> CmConnection<B> {
    /// What the peer put in its connect request or accept.
    pub fn peer_private_data(&self) -> &[u8] {
        &self.peer_private_data
    }

    /// The device context the connection manager chose.
    pub fn context(&self) -> &Context {
        self.qp.pd().context()
    }

    /// Disconnects (`rdma_disconnect`) the queue pair this connection
    /// holds: it goes to the error state (requests in flight flush) and
    /// its peer sees DISCONNECTED. Once: later calls do nothing.
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
        let qp = self.qp.id();
        let engine = self.qp.engine_mut();
        let id = engine.cm_id(qp)?;
        if !id.take_connected() {
            return Ok(());
        }
        id.disconnect()?;
        engine.mark_state(qp, QpState::ERR)
    }

    /// Waits until the peer disconnects the queue pair this connection
    /// holds (its id's DISCONNECTED event).
    pub fn wait_disconnected(&mut self, deadline: Deadline) -> Result<(), Error> {
        let qp = self.qp.id();
        let engine = self.qp.engine_mut();
        let id = engine.cm_id(qp)?;
        expect(
            id.channel(),
            Ev::DISCONNECTED,
            site!("rdma_cm: wait for DISCONNECTED"),
            deadline,
        )?;
        id.take_connected();
        engine.mark_state(qp, QpState::ERR)
    }
}

/// The connection is its queue pair: `conn.post_send(..)`, `conn.poll(..)`.
impl<B: NicBuf> core::ops::Deref for CmConnection<B> {
    type Target = QueuePair<B>;
    fn deref(&self) -> &QueuePair<B> {
        &self.qp
    }
}

impl<B: NicBuf> core::ops::DerefMut for CmConnection<B> {
    fn deref_mut(&mut self) -> &mut QueuePair<B> {
        &mut self.qp
    }
}

impl<B: NicBuf> Drop for CmConnection<B> {
    fn drop(&mut self) {
        // Disconnects the queue pair it holds, through that queue pair's
        // own id; then the queue pair's drop clears the id's pointer and
        // destroys it.
        let _ = self.disconnect();
    }
}

/// Which end of the connection.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Active,
    Passive,
}

/// What connect and accept share: the queue pair in `pd` on the id,
/// `rdma_connect` or `rdma_accept` with `private_data`, then ESTABLISHED.
fn establish<B: NicBuf>(
    id: Arc<RawCmId>,
    pd: &ProtectionDomain,
    config: &QpConfig,
    private_data: &[u8],
    side: Side,
    deadline: Deadline,
) -> Result<CmConnection<B>, Error> {
    let max = if side == Side::Active {
        MAX_CONNECT_PRIVATE_DATA
    } else {
        MAX_ACCEPT_PRIVATE_DATA
    };
    if private_data.len() > max {
        return Err(Error::invalid(site!(
            "rdma_connect/rdma_accept",
            "private data too long: at most 56 bytes in a connect request, 196 in an accept (RC, RDMA_PS_TCP)"
        )));
    }
    if !id.is_on(&pd.context().raw) {
        return Err(Error::invalid(site!(
            "rdma_create_qp",
            "the protection domain is not on the connection manager's context for this device",
            "share the pd() of an earlier connection, request or resolved id on the same device; a PD from Context::open is on another context"
        )));
    }
    let config = QpConfig {
        port: id.port(),
        ..*config
    };
    let depth = config.max_send_wr.max(1) + config.max_recv_wr.max(1);
    let mut engine: Engine<B> = Engine::new(
        pd,
        &EngineConfig {
            cq_depth: Some(depth),
            ..EngineConfig::default()
        },
    )?;
    let maker = id.clone();
    let qp = engine.add_qp_made(&config, &mut |parts| {
        crate::raw::RawQp::create_on(&maker, parts)
    })?;
    let dev = pd.context().query_device()?;
    // Both the reads this end may have outstanding and those it serves.
    let rd = dev
        .max_qp_rd_atom()
        .min(dev.max_qp_init_rd_atom())
        .clamp(1, 16);
    id.connect_or_accept(side == Side::Passive, private_data, rd)?;
    let step = if side == Side::Active {
        site!("rdma_cm: connect")
    } else {
        site!("rdma_cm: accept")
    };
    let ev = expect(id.channel(), Ev::ESTABLISHED, step, deadline)?;
    engine.mark_state(qp, QpState::RTS)?;
    id.set_connected();
    Ok(CmConnection {
        qp: QueuePair::from_parts(engine, qp)?,
        peer_private_data: ev.private,
    })
}

/// Connects to a listener at `addr`: [`resolve`], then
/// [`CmResolved::connect`], all bounded by `deadline`.
pub fn connect<B: NicBuf>(
    addr: SocketAddr,
    config: &QpConfig,
    private_data: &[u8],
    deadline: Deadline,
) -> Result<CmConnection<B>, Error> {
    resolve(addr, deadline)?.connect(config, private_data, deadline)
}

/// Resolves the address and the route to `addr` (ADDR_RESOLVED,
/// ROUTE_RESOLVED). The result's protection domain is on the device the
/// route uses: register memory there before connecting, to send its
/// descriptors as private data.
pub fn resolve(addr: SocketAddr, deadline: Deadline) -> Result<CmResolved, Error> {
    let channel = RawCmChannel::create()?;
    let id = Arc::new(RawCmId::create(&channel)?);
    id.resolve_addr(&addr, step_ms(deadline))?;
    expect(
        &channel,
        Ev::ADDR_RESOLVED,
        site!("rdma_cm: resolve address"),
        deadline,
    )?;
    id.resolve_route(step_ms(deadline))?;
    expect(
        &channel,
        Ev::ROUTE_RESOLVED,
        site!("rdma_cm: resolve route"),
        deadline,
    )?;
    let pd = pd_on(&id)?;
    Ok(CmResolved { id, pd })
}

/// A client id whose route is resolved, ready to connect.
pub struct CmResolved {
    id: Arc<RawCmId>,
    pd: ProtectionDomain,
}

impl CmResolved {
    /// The protection domain the connection will use.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// Creates the queue pair and connects, sending `private_data` (at most
    /// [`MAX_CONNECT_PRIVATE_DATA`] bytes); waits for ESTABLISHED.
    pub fn connect<B: NicBuf>(
        self,
        config: &QpConfig,
        private_data: &[u8],
        deadline: Deadline,
    ) -> Result<CmConnection<B>, Error> {
        let pd = self.pd.clone();
        self.connect_in(&pd, config, private_data, deadline)
    }

    /// [`CmResolved::connect`] with the queue pair in `pd`, the `pd()` of
    /// an earlier connection on the same device: many connections, one PD,
    /// so memory registered once serves them all.
    pub fn connect_in<B: NicBuf>(
        self,
        pd: &ProtectionDomain,
        config: &QpConfig,
        private_data: &[u8],
        deadline: Deadline,
    ) -> Result<CmConnection<B>, Error> {
        establish(self.id, pd, config, private_data, Side::Active, deadline)
    }
}

/// A listening connection-manager id.
pub struct CmListener {
    id: RawCmId,
}

impl CmListener {
    /// Binds to `addr` (an address of an RDMA device's netdev, or the
    /// unspecified address) and listens.
    pub fn bind(addr: SocketAddr) -> Result<CmListener, Error> {
        let channel = RawCmChannel::create()?;
        let id = RawCmId::create(&channel)?;
        id.bind_addr(&addr)?;
        id.listen(16)?;
        Ok(CmListener { id })
    }

    /// Waits for a connect request and accepts it with `private_data`:
    /// [`CmListener::request`], then [`CmRequest::accept`].
    pub fn accept<B: NicBuf>(
        &self,
        config: &QpConfig,
        private_data: &[u8],
        deadline: Deadline,
    ) -> Result<CmConnection<B>, Error> {
        self.request(deadline)?
            .accept(config, private_data, deadline)
    }

    /// Waits for a connect request (CONNECT_REQUEST). The request's
    /// protection domain is on the device it arrived on: register memory
    /// there before accepting, to send its descriptors as private data.
    pub fn request(&self, deadline: Deadline) -> Result<CmRequest, Error> {
        let req = expect(
            self.id.channel(),
            Ev::CONNECT_REQUEST,
            site!("rdma_cm: wait for a connect request"),
            deadline,
        )?;
        let child = req
            .request
            .ok_or(Error::os(site!("rdma_cm: connect request"), libc::EINVAL))?;
        // Its own channel, so its later events (DISCONNECTED) reach the connection.
        let channel = RawCmChannel::create()?;
        let id = Arc::new(child.migrate(&channel)?);
        let pd = pd_on(&id)?;
        Ok(CmRequest {
            id,
            pd,
            peer_private_data: req.private,
        })
    }
}

/// A connect request, not yet accepted (dropping it rejects it).
pub struct CmRequest {
    id: Arc<RawCmId>,
    pd: ProtectionDomain,
    peer_private_data: Vec<u8>,
}

impl CmRequest {
    /// The protection domain the connection will use.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// What the peer put in its connect request.
    pub fn peer_private_data(&self) -> &[u8] {
        &self.peer_private_data
    }

    /// Creates the queue pair, accepts with `private_data` (at most
    /// [`MAX_ACCEPT_PRIVATE_DATA`] bytes) and waits for ESTABLISHED.
    pub fn accept<B: NicBuf>(
        self,
        config: &QpConfig,
        private_data: &[u8],
        deadline: Deadline,
    ) -> Result<CmConnection<B>, Error> {
        let pd = self.pd.clone();
        self.accept_in(&pd, config, private_data, deadline)
    }

    /// [`CmRequest::accept`] with the queue pair in `pd`, the `pd()` of an
    /// earlier connection or request on the same device.
    pub fn accept_in<B: NicBuf>(
        self,
        pd: &ProtectionDomain,
        config: &QpConfig,
        private_data: &[u8],
        deadline: Deadline,
    ) -> Result<CmConnection<B>, Error> {
        let mut conn = establish(
            self.id.clone(),
            pd,
            config,
            private_data,
            Side::Passive,
            deadline,
        )?;
        conn.peer_private_data = core::mem::take(&mut { self }.peer_private_data);
        Ok(conn)
    }

    /// Refuses the request (the peer sees REJECTED).
    pub fn reject(self) -> Result<(), Error> {
        self.id.reject()
    }
}
