//! `verbs` under tokio: an async completion engine, RDMA byte streams and
//! a listener, for services built on a tokio runtime.
//!
//! - [`AsyncEngine`] wraps an [`Engine`](verbs::Engine) built with
//!   `EngineConfig::events`: its completion channel's descriptor is
//!   registered with tokio's reactor (`AsyncFd`), and the arm, poll
//!   again, await readiness, take the events protocol is done once, here.
//!   Posting stays synchronous (it never blocks); waiting is a future
//!   ([`AsyncEngine::completion`], [`AsyncEngine::next`],
//!   [`AsyncEngine::wait`]).
//! - [`RdmaStream`]: `AsyncRead` + `AsyncWrite` over one RC queue pair,
//!   with a ring of pre-posted receives and credits; [`RdmaListener`]
//!   accepts them, [`RdmaStream::connect`] makes one, both over
//!   [`verbs::exchange`] (the client speaks first, optional token,
//!   deadlines).
//!
//! # Cancellation cannot free what the NIC owns
//!
//! A posted request's buffers belong to the engine's ring from the post
//! until its completion is polled (the core's guarantee). A future here
//! only waits: it owns no buffer and no completion while it is pending.
//! What a poll takes off the completion queue is, within that same poll,
//! either returned or put in the engine's ready queue, where
//! [`AsyncEngine::next`] finds it. So a future dropped, `mem::forget`-ed,
//! aborted with its task, or left behind by a panic or a runtime shut
//! down loses nothing and frees nothing; an engine dropped with requests
//! in flight destroys its queue pairs before their buffers (the core's
//! `Drop`).
//!
//! ```no_run
//! use verbs::{Context, EngineConfig, MemoryRegion, ProtectionDomain, QpConfig, SendOp, SendRequest, Local};
//! use verbs_tokio::AsyncEngine;
//! # async fn run() -> Result<(), verbs::Error> {
//! let pd = ProtectionDomain::new(&Context::open(None)?)?;
//! let config = EngineConfig { events: true, ..EngineConfig::default() };
//! let mut engine = AsyncEngine::new(verbs::Engine::<MemoryRegion>::new(&pd, &config)?)
//!     .map_err(|(e, _)| e)?;
//! let qp = engine.engine_mut().add_qp(&QpConfig::default())?;
//! # let peer: verbs::Endpoint = todo!();
//! engine.engine_mut().connect(qp, &peer)?;
//! let msg = Local::range(MemoryRegion::new(&pd, 4096)?, 0, 64).map_err(|(e, _)| e)?;
//! engine.engine_mut().post_send(qp, SendRequest::new(SendOp::Send, msg).tag(7)).map_err(|e| e.error)?;
//! let mut done = engine.completion(qp, 7).await?; // sleeps on the descriptor, no CPU
//! done.result()?;
//! let _buf = done.take_buf(); // back only now
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod channel;
mod engine;
mod listener;
mod protocol;
mod stream;

pub use engine::{AsyncEngine, Handed, DEFAULT_READY_CAPACITY};
pub use listener::{ListenerConfig, RdmaListener};
pub use stream::{RdmaStream, StreamConfig};
#[cfg(test)]
mod sim;
