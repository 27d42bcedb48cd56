//! A plane's engine: [`PlaneEngine`], the transfer's alone (nobody else
//! can post on it or poll it), and what the transfer asks of it besides
//! posting and polling, the calls that reach the device's control path
//! (queue pairs made and connected, resets, the port's state and events).
//! One implementation drives a device; the crate's tests give the
//! transfer a simulated one (`transfer::sim`), where a reset or a destroy
//! can be made to fail.

use core::ops::Deref;

use crate::device::PortState;
use crate::endpoint::Endpoint;
use crate::engine::{
    CompletionRef, ConnectOptions, Engine, EngineConfig, PathInfo, Provider, QpConfig, QpId, Verbs,
};
use crate::error::Error;
use crate::memory::NicBuf;
use crate::pd::ProtectionDomain;
use crate::sys::ibv_event_type as Event;
use crate::time::Deadline;

/// One plane's engine, whose requests are a transfer's alone.
///
/// It is made empty, and its owner can add queue pairs, connect them and
/// read everything about them (it derefs to `&Engine`), but never post
/// on it or poll it: there is no `&mut Engine` to be had until
/// [`PlaneEngine::into_engine`] gives it up. So every request in flight on
/// it was posted by the [`Transfer`](super::Transfer) it belongs to, and
/// every completion the transfer settles a chunk by is one of its own
/// posts'. A request of anyone else's, tagged like a chunk's, would
/// otherwise mark that chunk done while its own post is still in flight
/// (for a Read, before its bytes landed).
///
/// ```compile_fail,E0596
/// # fn f(e: &mut verbs::transfer::PlaneEngine<verbs::MemoryRegion>, qp: verbs::QpId,
/// #      req: verbs::SendRequest<verbs::MemoryRegion>) {
/// e.post_send(qp, req); // only the transfer posts on a plane's engine
/// # }
/// ```
pub struct PlaneEngine<B, P: Provider = Verbs>(pub(crate) Engine<B, P>);

impl<B: NicBuf> PlaneEngine<B> {
    /// An engine on `pd`'s device with nothing on it yet (see [`Engine::new`]).
    pub fn new(pd: &ProtectionDomain, config: &EngineConfig) -> Result<PlaneEngine<B>, Error> {
        Engine::new(pd, config).map(PlaneEngine)
    }

    /// A queue pair for a path (see [`Engine::add_qp`]).
    pub fn add_qp(&mut self, config: &QpConfig) -> Result<QpId, Error> {
        self.0.add_qp(config)
    }

    /// Connects a path's queue pair (see [`Engine::connect_with`]); a path
    /// connects with [`PathOptions::connect_options`](super::PathOptions::connect_options).
    pub fn connect_with(
        &mut self,
        qp: QpId,
        peer: &Endpoint,
        options: &ConnectOptions,
    ) -> Result<PathInfo, Error> {
        self.0.connect_with(qp, peer, options)
    }

    /// The engine, to post on and poll as any other, once no transfer
    /// holds it (completions of requests the transfer left in flight,
    /// probes say, come back to whoever polls it).
    pub fn into_engine(self) -> Engine<B> {
        self.0
    }
}

impl<B, P: Provider> Deref for PlaneEngine<B, P> {
    type Target = Engine<B, P>;

    fn deref(&self) -> &Engine<B, P> {
        &self.0
    }
}

/// A plane's engine as the transfer uses it (see the module docs).
pub trait PlaneDevice<B, P: Provider = Verbs> {
    /// `qp`'s number, the PSN its next request starts at (its first, as
    /// connected) and its path MTU in bytes: what the trace records.
    fn describe(&self, qp: QpId) -> Result<(u32, u32, u32), Error>;

    /// A fresh queue pair in INIT, and the endpoint the peer connects to.
    fn fresh_qp(&mut self, config: &QpConfig) -> Result<(QpId, Endpoint), Error>;

    /// Connects `qp` to `peer`; returns the path MTU in bytes.
    fn connect_qp(
        &mut self,
        qp: QpId,
        peer: &Endpoint,
        options: &ConnectOptions,
    ) -> Result<u32, Error>;

    /// Moves `qp` through ERR and RESET back to INIT, handing back every
    /// request it held (see [`Engine::reset`]).
    fn reset_qp(
        &mut self,
        qp: QpId,
        deadline: Deadline,
        on_done: impl FnMut(CompletionRef<'_, B, P>),
    ) -> Result<(), Error>;

    /// Whether `port` is active now.
    fn port_active(&self, port: u8) -> bool;

    /// The next pending `PORT_ERR` or `PORT_ACTIVE` (others are read and
    /// dropped), without waiting.
    fn next_port_event(&self) -> Result<Option<Event>, Error>;
}

impl<B: NicBuf> PlaneDevice<B> for Engine<B, Verbs> {
    fn describe(&self, qp: QpId) -> Result<(u32, u32, u32), Error> {
        let ours = self.endpoint(qp)?;
        let mtu = self.query(qp)?.path_mtu.bytes().unwrap_or(1024);
        Ok((ours.qpn, ours.psn, mtu))
    }

    fn fresh_qp(&mut self, config: &QpConfig) -> Result<(QpId, Endpoint), Error> {
        let qp = self.add_qp(config)?;
        Ok((qp, self.endpoint(qp)?))
    }

    fn connect_qp(
        &mut self,
        qp: QpId,
        peer: &Endpoint,
        options: &ConnectOptions,
    ) -> Result<u32, Error> {
        let info = self.connect_with(qp, peer, options)?;
        Ok(info.path_mtu.bytes().unwrap_or(1024))
    }

    fn reset_qp(
        &mut self,
        qp: QpId,
        deadline: Deadline,
        on_done: impl FnMut(CompletionRef<'_, B>),
    ) -> Result<(), Error> {
        self.reset(qp, deadline, on_done)
    }

    fn port_active(&self, port: u8) -> bool {
        self.context()
            .query_port(port)
            .is_ok_and(|a| a.state() == PortState::ACTIVE)
    }

    fn next_port_event(&self) -> Result<Option<Event>, Error> {
        while let Some(ev) = self.context().next_async_event(0)? {
            if ev.event_type == Event::PORT_ERR || ev.event_type == Event::PORT_ACTIVE {
                return Ok(Some(ev.event_type));
            }
        }
        Ok(None)
    }
}
