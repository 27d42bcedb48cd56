//! The completion engine: many queue pairs sharing one completion queue
//! (or a send/receive pair) and optionally one shared receive queue, the
//! object one polling thread owns.
//!
//! - `id`: the one work-request id codec.
//! - `flights`, `ring`, `srq`, `prepared`: who owns each posted request's
//!   buffers until it completes (an entry of the engine's table of requests
//!   in flight, chained per queue; a shared-receive slot; a prepared entry).
//! - `doorbell`: the only place work requests reach the device.
//! - `post`, `poll`: the data path; `poster`: posting from a poll's
//!   callback; `check`: what a send is checked for;
//!   `lane`: one queue pair's prepared pair, checked once, posted often.
//! - `setup`, `connect`, `expose`: building, connecting, exposing memory.
//! - `ud`, `ah_table`: datagrams and the address handles they name.
//! - `keepalive`: finding a silent dead peer of a reliable connection.
//!
//! See `docs/ARCHITECTURE.md` for the path of one post and one poll.

mod addressing;
#[cfg(feature = "rdmacm")]
mod adopt;
mod ah_table;
mod bind;
mod bind_table;
mod check;
mod completion;
mod config;
mod connect;
mod core;
mod counters;
mod counters_of;
mod doorbell;
mod expose;
mod flights;
pub(crate) mod id;
mod keepalive;
mod lane;
mod lane_room;
mod lend;
mod path;
mod poll;
mod post;
mod poster;
mod prepared;
mod prepared_chain;
mod prepared_table;
mod qp_slot;
mod remove;
mod ring;
mod setup;
#[cfg(test)]
pub(crate) mod sim;
mod slot_back;
mod srq;
mod srq_lane;
mod srq_request;
mod ud;

pub use ah_table::AhId;
pub use completion::{Completion, CompletionRef};
pub use config::{
    ConnectOptions, EngineConfig, QpConfig, Queue, SrqConfig, Transport, DEFAULT_QKEY, MAX_CHAIN,
};
pub use connect::QpAttributes;
pub use core::Engine;
pub use counters::{EngineCounters, PortCounters, QpCounters, STATUS_SLOTS};
pub use doorbell::RawSend;
pub use doorbell::Verbs;
pub use expose::Exposing;
// For `QueuePair`'s and the transfer's bounds; outside the crate the
// trait stays unnamed.
pub(crate) use doorbell::Provider;
pub use id::RAW_ID_LIMIT;
pub use keepalive::KeepaliveTable;
pub use lane::{Lane, LanePoll};
pub use path::PathInfo;
pub use post::PostError;
pub use poster::Poster;
pub use prepared_table::{Prepared, PreparedHandle, PreparedRecv, PreparedSend};
pub use qp_slot::{QpId, QpState};
pub use srq_lane::SrqLane;
pub use srq_request::SrqRequest;
pub use ud::UdDest;

// An engine, and so a `QueuePair`, moves to another thread with its
// buffers (its prepared requests' raw pointers point into its own heap).
const _: () = {
    fn send<T: Send>() {}
    let _ = send::<Engine<crate::memory::ArenaBuf>>;
    let _ = send::<Engine<crate::memory::MemoryRegion>>;
};
