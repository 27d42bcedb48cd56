//! The steps every connection takes: waiting for an event, naming the one
//! that came instead, the protection domain on the connection manager's
//! context, and the limits of private data.

use alloc::sync::Arc;

use crate::device::Context;
use crate::error::{site, Error, ErrorKind, Site};
use crate::pd::ProtectionDomain;
use crate::raw::cm::{CmEvent as RawEvent, RawCmChannel, RawCmId};
use crate::sys::rdmacm::rdma_cm_event_type as Ev;
use crate::time::Deadline;

/// Most private data a connect request carries (RC, RDMA_PS_TCP).
pub const MAX_CONNECT_PRIVATE_DATA: usize = 56;
/// Most private data an accept carries.
pub const MAX_ACCEPT_PRIVATE_DATA: usize = 196;

/// The next event on `channel`, or `TimedOut` at `deadline`.
pub(super) fn next(
    channel: &Arc<RawCmChannel>,
    step: &'static Site,
    deadline: Deadline,
) -> Result<RawEvent, Error> {
    loop {
        let ms = deadline.remaining_ms().clamp(1, 1000);
        if let Some(ev) = channel.next_event(ms)? {
            return Ok(ev);
        }
        if deadline.passed() {
            return Err(Error::new(step, ErrorKind::TimedOut));
        }
    }
}

/// The next event, which must be `want`; any other names itself in the error.
pub(super) fn expect(
    channel: &Arc<RawCmChannel>,
    want: Ev,
    step: &'static Site,
    deadline: Deadline,
) -> Result<RawEvent, Error> {
    let ev = next(channel, step, deadline)?;
    if ev.kind == want && ev.status == 0 {
        return Ok(ev);
    }
    Err(event_error(ev.kind, ev.status, step))
}

/// The error an event that ends a connection (or its attempt) stands for,
/// with what to check; `other` names the step for any other event.
pub(super) fn event_error(kind: Ev, status: i32, other: &'static Site) -> Error {
    let site = match kind {
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
        Ev::DISCONNECTED => site!("rdma_cm", "", "the peer disconnected (or went away)"),
        Ev::DEVICE_REMOVAL => site!(
            "rdma_cm",
            "",
            "the RDMA device was removed: everything on it must be dropped"
        ),
        _ => other,
    };
    Error::cm(site, kind.0, status)
}

/// The step timeout librdmacm takes in milliseconds, bounded by the deadline.
pub(super) fn step_ms(deadline: Deadline) -> i32 {
    deadline.remaining_ms().clamp(1, 5000)
}

/// A protection domain on the device the connection manager chose for `id`.
pub(super) fn pd_on(id: &RawCmId) -> Result<ProtectionDomain, Error> {
    let ctx = Context {
        raw: Arc::new(id.context()?),
    };
    ProtectionDomain::new(&ctx)
}

/// A new id on a channel of its own, for a step that waits on its events.
pub(super) fn fresh_id() -> Result<RawCmId, Error> {
    RawCmId::create(&RawCmChannel::create()?)
}

/// Refuses private data longer than a connect request (56 bytes) or an
/// accept (196) carries.
pub(super) fn check_private_data(passive: bool, private_data: &[u8]) -> Result<(), Error> {
    let max = if passive {
        MAX_ACCEPT_PRIVATE_DATA
    } else {
        MAX_CONNECT_PRIVATE_DATA
    };
    if private_data.len() > max {
        return Err(Error::invalid(site!(
            "rdma_connect/rdma_accept",
            "private data too long: at most 56 bytes in a connect request, 196 in an accept (RC, RDMA_PS_TCP)"
        )));
    }
    Ok(())
}
