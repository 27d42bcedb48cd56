//! The active side: resolve the peer's address and route, then connect,
//! on an engine of its own or placed on a shared one.

use std::net::SocketAddr;

use crate::engine::{Engine, QpConfig, QpId};
use crate::error::{site, Error};
use crate::memory::NicBuf;
use crate::pd::ProtectionDomain;
use crate::raw::cm::RawCmId;
use crate::sys::rdmacm::rdma_cm_event_type as Ev;
use crate::time::Deadline;

use super::connection::{establish, CmConnection};

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
    let id = super::steps::fresh_id()?;
    id.resolve_addr(&addr, super::steps::step_ms(deadline))?;
    super::steps::expect(
        id.channel(),
        Ev::ADDR_RESOLVED,
        site!("rdma_cm: resolve address"),
        deadline,
    )?;
    id.resolve_route(super::steps::step_ms(deadline))?;
    super::steps::expect(
        id.channel(),
        Ev::ROUTE_RESOLVED,
        site!("rdma_cm: resolve route"),
        deadline,
    )?;
    let pd = super::steps::pd_on(&id)?;
    Ok(CmResolved { id, pd })
}

/// A client id whose route is resolved, ready to connect.
pub struct CmResolved {
    id: RawCmId,
    pd: ProtectionDomain,
}

impl CmResolved {
    /// The protection domain the connection will use.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// Creates the queue pair and connects, sending `private_data` (at most
    /// [`super::MAX_CONNECT_PRIVATE_DATA`] bytes); waits for ESTABLISHED.
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
        establish(self.id, pd, config, private_data, deadline)
    }

    /// Creates the queue pair on `engine`, in INIT, and returns its id
    /// there: post receives on it now, then connect
    /// ([`Engine::cm_connect`]). As [`super::CmRequest::place`]: from here
    /// the connection is the queue pair, and the same engines are refused.
    pub fn place<B: NicBuf>(
        self,
        engine: &mut Engine<B>,
        config: &QpConfig,
    ) -> Result<QpId, Error> {
        engine.place_cm(self.id, config).map(|(qp, _)| qp)
    }
}
