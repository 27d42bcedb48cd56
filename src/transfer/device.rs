//! What a transfer asks of a plane's engine besides posting and polling:
//! the calls that reach the device's control path (queue pairs made and
//! connected, resets, the port's state and events). One implementation
//! drives a device; the crate's tests give the transfer a simulated one
//! (`transfer::sim`), where a reset or a destroy can be made to fail.

use crate::device::PortState;
use crate::endpoint::Endpoint;
use crate::engine::{CompletionRef, ConnectOptions, Engine, QpConfig, QpId, Verbs};
use crate::error::Error;
use crate::memory::NicBuf;
use crate::sys::ibv_event_type as Event;
use crate::time::Deadline;

/// A plane's engine as the transfer uses it (see the module docs).
pub trait PlaneDevice<B> {
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
        on_done: impl FnMut(CompletionRef<'_, B>),
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
