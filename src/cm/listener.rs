//! The passive side: a listening id, and the connect requests it hands
//! out, each accepted on an engine of its own or placed on a shared one.

use alloc::vec::Vec;
use std::net::SocketAddr;

use crate::engine::{Engine, QpConfig, QpId};
use crate::error::{site, Error};
use crate::memory::NicBuf;
use crate::pd::ProtectionDomain;
use crate::raw::cm::{CmEvent as RawEvent, RawCmChannel, RawCmId};
use crate::sys::rdmacm::rdma_cm_event_type as Ev;
use crate::time::Deadline;

use super::connection::{establish, CmConnection};

/// A listening connection-manager id.
pub struct CmListener {
    id: RawCmId,
}

impl CmListener {
    /// Binds to `addr` (an address of an RDMA device's netdev, or the
    /// unspecified address) and listens.
    pub fn bind(addr: SocketAddr) -> Result<CmListener, Error> {
        let id = super::steps::fresh_id()?;
        id.bind_addr(&addr)?;
        id.listen(16)?;
        Ok(CmListener { id })
    }

    /// A protection domain on the device the listener is bound to (it
    /// must be bound to a device's address): an engine made on it can
    /// place every request this listener hands out
    /// ([`CmRequest::place`]), before the first one arrives.
    pub fn pd(&self) -> Result<ProtectionDomain, Error> {
        super::steps::pd_on(&self.id)
    }

    /// The descriptor connect requests arrive on: non-blocking, readable
    /// while [`CmListener::try_request`] has one.
    pub fn fd(&self) -> i32 {
        self.id.channel().fd()
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
        let req = super::steps::expect(
            self.id.channel(),
            Ev::CONNECT_REQUEST,
            site!("rdma_cm: wait for a connect request"),
            deadline,
        )?;
        CmRequest::from_event(req)
    }

    /// The next connect request if one is pending, or `None` at once
    /// (never blocks); the listener's other events are skipped.
    pub fn try_request(&self) -> Result<Option<CmRequest>, Error> {
        while let Some(ev) = self.id.channel().try_event()? {
            if ev.kind == Ev::CONNECT_REQUEST && ev.status == 0 {
                return CmRequest::from_event(ev).map(Some);
            }
        }
        Ok(None)
    }
}

/// A connect request, not yet accepted (dropping it rejects it).
pub struct CmRequest {
    id: RawCmId,
    pd: ProtectionDomain,
    peer_private_data: Vec<u8>,
}

impl CmRequest {
    /// The request a CONNECT_REQUEST event carries, moved to a channel of
    /// its own (so its later events do not reach the listener's).
    fn from_event(mut ev: RawEvent) -> Result<CmRequest, Error> {
        let child = ev
            .request
            .take()
            .ok_or(Error::os(site!("rdma_cm: connect request"), libc::EINVAL))?;
        let id = RawCmId::from_request(child, &RawCmChannel::create()?)?;
        let pd = super::steps::pd_on(&id)?;
        Ok(CmRequest {
            id,
            pd,
            peer_private_data: ev.private,
        })
    }

    /// The protection domain the connection will use.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// What the peer put in its connect request.
    pub fn peer_private_data(&self) -> &[u8] {
        &self.peer_private_data
    }

    /// Creates the queue pair, accepts with `private_data` (at most
    /// [`super::MAX_ACCEPT_PRIVATE_DATA`] bytes) and waits for ESTABLISHED.
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
        let CmRequest {
            id,
            peer_private_data,
            ..
        } = self;
        let mut conn = establish(id, pd, config, private_data, deadline)?;
        conn.set_peer_private_data(peer_private_data);
        Ok(conn)
    }

    /// Creates the request's queue pair on `engine` (its completion
    /// queue, and its shared receive queue if it has one), in INIT, and
    /// returns its id there: post receives on it now, then accept
    /// ([`Engine::cm_accept`]). From here the connection is the queue
    /// pair: its events come through [`Engine::cm_event`], removing it
    /// ([`Engine::remove_qp`]) ends the connection (before the accept:
    /// refuses it), and the engine's drop does too.
    ///
    /// Refused (and the request with it): an engine whose protection
    /// domain is not on the connection manager's context for the device
    /// the request came in on ([`CmListener::pd`], [`CmRequest::pd`] and
    /// [`super::context`] give one that is), a transport other than RC,
    /// or a queue pair the engine's completion queue cannot hold.
    pub fn place<B: NicBuf>(
        self,
        engine: &mut Engine<B>,
        config: &QpConfig,
    ) -> Result<QpId, Error> {
        engine.place_cm(self.id, config).map(|(qp, _)| qp)
    }

    /// Refuses the request (the peer sees REJECTED).
    pub fn reject(self) -> Result<(), Error> {
        self.id.reject()
    }
}
