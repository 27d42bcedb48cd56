#![doc = include_str!("../README.md")]
//!
//! # Layers
//!
//! Bottom up (each module imports only from those below it; see
//! `docs/ARCHITECTURE.md`): [`sys`] (the mirror of `verbs.h`), the raw
//! layer of owned handles (internal), [`error`], [`memory`] (what the NIC
//! and the CPU may touch), [`device`], [`pd`], work requests ([`wr`]), the
//! completion [`engine`], the single [`qp`] front, `cm` (librdmacm, cargo
//! feature `rdmacm`: `cargo doc --features rdmacm` documents it, as docs.rs
//! does), and the out-of-band exchange ([`endpoint`], [`wire`], `exchange`).
//!
//! `unsafe` is allowed only in `sys`, the raw layer, `memory`, the engine's
//! doorbell and its test-only simulated provider (listed and checked by
//! `tests/architecture.rs`).
#![cfg_attr(not(feature = "std"), no_std)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(unsafe_code)]
#![warn(
    missing_docs,
    unsafe_op_in_unsafe_fn,
    clippy::undocumented_unsafe_blocks
)]

extern crate alloc;

#[allow(unsafe_code)]
pub mod sys;

pub mod error;
mod raw;

pub mod gid;
pub mod grh;
pub mod time;
pub mod tlsf;

pub mod endpoint;
pub mod wire;

pub mod memory;

pub mod device;
pub mod pd;
pub mod sgl;
pub mod wr;

pub mod engine;
pub mod qp;

#[cfg(feature = "rdmacm")]
#[cfg_attr(docsrs, doc(cfg(feature = "rdmacm")))]
pub mod cm;
#[cfg(feature = "std")]
pub mod exchange;
#[cfg(feature = "std")]
pub mod transfer;

pub use device::{devices, AsyncEvent, Context, DeviceInfo, GidEntry};
pub use endpoint::{Endpoint, Mtu, RemoteRegion};
pub use engine::{
    AhId, Completion, CompletionRef, ConnectOptions, Engine, EngineConfig, EngineCounters,
    Exposing, KeepaliveTable, Lane, LanePoll, PathInfo, PortCounters, PostError, Poster, Prepared,
    PreparedHandle, PreparedRecv, PreparedSend, QpAttributes, QpConfig, QpCounters, QpId, QpState,
    Queue, RawSend, SrqConfig, SrqLane, SrqRequest, Transport, UdDest, DEFAULT_QKEY, MAX_CHAIN,
    RAW_ID_LIMIT, STATUS_SLOTS,
};
pub use error::{Error, ErrorKind};
pub use gid::Gid;
pub use grh::{Grh, GRH_LEN};
#[cfg(feature = "std")]
pub use memory::SharedArena;
pub use memory::{
    Access, Arena, ArenaBuf, ArenaConfig, DmabufRegion, Exposed, ExposedBuf, ForeignRegion,
    HostBuf, MemoryRegion, NicBuf,
};
pub use pd::ProtectionDomain;
pub use qp::QueuePair;
pub use raw::leaked_objects;
pub use sgl::{Local, MAX_SGE};
pub use sys::{ibv_wc_opcode as WcOpcode, ibv_wc_status as WcStatus};
pub use time::Deadline;
pub use wr::{RecvRequest, RemoteSlice, SendOp, SendRequest};
