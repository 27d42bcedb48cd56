//! Connection management with librdmacm (cargo feature `rdmacm`): the
//! connection manager resolves the address, route, GID, LID and MTU by
//! itself and walks the queue pair to RTS (primer 7.1). On iWARP
//! (Soft-iWARP, `siw`) it is the only way to connect.
//!
//! Two shapes:
//!
//! - **One connection, one completion queue**: [`connect`] and
//!   [`CmListener::accept`] block until ESTABLISHED (errors name the event
//!   that arrived instead: ADDR_ERROR, ROUTE_ERROR, UNREACHABLE,
//!   REJECTED, ...), each step bounded by the caller's deadline, and give
//!   a [`CmConnection`]: the queue pair, on an engine of its own.
//! - **Many connections on one [`Engine`]** (one completion queue, one
//!   polling thread, optionally one shared receive queue), as a server
//!   bootstrapping with rdma_cm wants: [`CmRequest::place`] (or
//!   [`CmResolved::place`]) creates the connection's queue pair on the
//!   engine, in INIT, so receives can be posted before the handshake;
//!   [`Engine::cm_accept`] (or [`Engine::cm_connect`]) starts it and
//!   returns. The connection manager's events of every such queue pair
//!   come through the engine, without blocking ([`Engine::cm_event`]),
//!   on a descriptor to poll beside [`Engine::event_fd`]
//!   ([`Engine::cm_event_fd`]), or together with completions
//!   ([`Engine::wait_with_cm`]): ESTABLISHED lets the queue pair send;
//!   DISCONNECTED (the peer's `rdma_disconnect`, or its end) moves it to
//!   the error state, which flushes its receives back through the poll.
//!
//! The connection is its queue pair: the queue pair's handle holds the
//! id, and every piece of the connection's bookkeeping (the id, whether
//! it is still connected, its events) is found through the queue pair,
//! never kept beside it. So a [`CmConnection`] derefs to its
//! [`QueuePair`] for every verb of the safe layer, and a queue pair
//! swapped out of it (`mem::swap(&mut *a, &mut *b)`, `mem::replace`) takes
//! its connection with it: `disconnect` reaches only the queue pair the
//! connection holds, wherever the other went (another connection, another
//! thread), and a queue pair is destroyed the way librdmacm expects (the
//! id forgets it first, and outlives it), whoever drops or removes it.
//!
//! Both shapes carry private data, for instance memory descriptors
//! ([`encode_regions`]).
//!
//! A server with every client on one engine (C's rping, ported: receives
//! posted before the accept, and a peer's disconnect wakes the loop):
//!
//! ```no_run
//! use std::time::Duration;
//! use verbs::cm::{CmEventType, CmListener, Wake};
//! use verbs::{Deadline, Engine, EngineConfig, ErrorKind, MemoryRegion, QpConfig, RecvRequest};
//! # fn main() -> Result<(), verbs::Error> {
//! let listener = CmListener::bind("10.0.0.1:7471".parse().unwrap())?;
//! let pd = listener.pd()?; // on the device the listener is bound to
//! let config = EngineConfig { events: true, ..EngineConfig::default() };
//! let mut engine: Engine<MemoryRegion> = Engine::new(&pd, &config)?;
//! // Poll listener.fd(), engine.event_fd() and engine.cm_event_fd() together
//! // in an event loop; this one just looks at the listener now and then.
//! loop {
//!     while let Some(request) = listener.try_request()? {
//!         let qp = request.place(&mut engine, &QpConfig::default())?; // INIT
//!         let buf = MemoryRegion::new(&pd, 4096)?;
//!         engine.post_recv(qp, RecvRequest::new(buf)).map_err(|e| e.error)?;
//!         engine.cm_accept(qp, b"")?; // ESTABLISHED comes as an event
//!     }
//!     let wait = Deadline::after(Duration::from_millis(100));
//!     match engine.wait_with_cm(wait, |c| println!("{:?} from {:?}", c.status(), c.qp())) {
//!         Ok(Wake::Event(ev)) if ev.kind() == CmEventType::DISCONNECTED => {
//!             // Done with it: its id goes too, and what it still held is
//!             // dropped once the device is done with it.
//!             if let Some(qp) = ev.qp() {
//!                 engine.remove_qp(qp)?;
//!             }
//!         }
//!         Ok(_) => {}
//!         Err(e) if e.kind() == ErrorKind::TimedOut => {}
//!         Err(e) => return Err(e),
//!     }
//! }
//! # }
//! ```
//!
//! [`QueuePair`]: crate::qp::QueuePair

use crate::device::Context;
use crate::error::{site, Error, ErrorKind};
use crate::raw::cm::RawCmDevices;

#[cfg(doc)]
use crate::engine::Engine;

mod connection;
mod event;
mod listener;
mod regions;
mod resolve;
mod shared;
mod steps;

pub use crate::sys::rdmacm::rdma_cm_event_type as CmEventType;
pub use connection::CmConnection;
pub use event::{CmEvent, Wake};
pub use listener::{CmListener, CmRequest};
pub use regions::{decode_regions, encode_regions};
pub use resolve::{connect, resolve, CmResolved};
pub use steps::{MAX_ACCEPT_PRIVATE_DATA, MAX_CONNECT_PRIVATE_DATA};

/// The device context librdmacm uses for the device called `name` (or
/// the first): a protection domain made on it serves queue pairs of
/// rdma_cm ids on that device (an [`Engine`] on it can place them) as
/// well as plain ones. A context from [`Context::open`] is another
/// context of the same device, which librdmacm refuses.
pub fn context(name: Option<&str>) -> Result<Context, Error> {
    let raw = RawCmDevices::get()?.by_name(name).ok_or(Error::new(
        site!(
            "rdma_get_devices",
            "no such RDMA device",
            "`rdma link` lists the devices; is the module (rdma_rxe, siw) loaded and the link added?"
        ),
        ErrorKind::NotFound,
    ))?;
    Ok(Context {
        raw: alloc::sync::Arc::new(raw),
    })
}
