#![doc = include_str!("../README.md")]
//!
//! # Cancellation cannot free what the NIC owns
//!
//! A posted request's buffers belong to the engine's ring from the post
//! until its completion is polled (the core's guarantee). A future here
//! only waits: it owns no buffer and no completion while it is pending.
//! What a poll takes off the completion queue is, within that same poll,
//! either returned or put in the engine's ready queue, where
//! [`AsyncEngine::next_completion`] finds it. So a future dropped, `mem::forget`-ed,
//! aborted with its task, or left behind by a panic or a runtime shut
//! down loses nothing and frees nothing; an engine dropped with requests
//! in flight destroys its queue pairs before their buffers (the core's
//! `Drop`).
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
