//! `verbs`: hand-written Rust bindings to libibverbs.
//!
//! Layers, bottom up: [`sys`] (the audited FFI core, the only place with
//! `unsafe`), the safe layer (device, PD, CQ, QP, MR, work requests,
//! completions), the [`tlsf`] allocator core behind the arena, and the
//! out-of-band [`endpoint`] exchange.
#![cfg_attr(not(feature = "std"), no_std)]
#![deny(unsafe_code)]
#![warn(
    missing_docs,
    unsafe_op_in_unsafe_fn,
    clippy::undocumented_unsafe_blocks
)]

extern crate alloc;

#[allow(unsafe_code)]
pub mod sys;

pub mod endpoint;
#[cfg(feature = "std")]
pub mod exchange;
pub mod gid;
pub mod tlsf;
pub mod wire;

pub mod arena;
#[cfg(feature = "rdmacm")]
pub mod cm;
pub mod cq;
pub mod device;
pub mod dmabuf;
pub mod error;
pub mod memory;
pub mod mr;
pub mod pd;
pub mod qp;
mod ret;
pub mod srq;
pub mod time;
pub mod wr;

pub use arena::{Arena, ArenaBuf, ArenaConfig, ExposedBuf};
pub use cq::{CompletionChannel, CompletionQueue, WcOpcode, WcStatus, WorkCompletion};
pub use device::{devices, Context, DeviceInfo, GidEntry};
pub use endpoint::{Endpoint, Mtu, RemoteRegion};
pub use error::{Error, ErrorKind, WcError};
pub use gid::Gid;
pub use memory::LocalBuf;
pub use mr::{Access, MemoryRegion};
pub use pd::ProtectionDomain;
pub use qp::{Completion, CompletionRef, ConnectOptions, PostError, Prepared, QpConfig, QueuePair};
pub use srq::SharedReceiveQueue;
pub use time::Deadline;
pub use wr::{Local, RecvRequest, RemoteSlice, SendOp, SendRequest};
