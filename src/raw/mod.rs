//! The raw layer: owned handles over [`crate::sys`], one function per verb.
//!
//! # Safety
//!
//! This layer and `sys` are where the crate's FFI calls live (with
//! `memory`'s copies and slices, the only modules allowed `unsafe`; the
//! list is checked by `tests/architecture.rs`). Each handle owns one C
//! object and destroys it in `Drop`, so a live handle always holds a live
//! pointer; each holds an `Arc` of its parent (a QP its PD and CQs, a PD its
//! context), so a parent outlives its children. A function is `unsafe` only
//! where the verb hands memory to the device (posting, registering): its
//! `# Safety` section says what the caller keeps valid, and until when.
//!
//! A destroy that fails leaks: the handle's pointer stays with the library,
//! and whatever the device may still reach (a registration's memory, a
//! window's buffer, a queue pair's posted buffers) is never freed.
//! [`leaked_objects`] counts these.
#![allow(unsafe_code)]

mod ah;
#[cfg(feature = "rdmacm")]
pub(crate) mod cm;
mod cq;
mod device;
mod leak;
mod mr;
pub(crate) mod os;
mod owned;
mod pd;
mod qp;
mod ret;
mod srq;

pub(crate) use ah::RawAh;
pub(crate) use cq::{RawChannel, RawCq};
pub(crate) use device::{raw_devices, RawContext};
pub use leak::leaked_objects;
pub(crate) use mr::{RawMr, RawMw, StableMemory};
pub(crate) use owned::{HeapMemory, OwnedMemory, PageMemory};
pub(crate) use pd::RawPd;
pub(crate) use qp::{QpParts, RawQp};
pub(crate) use ret::PostFailed;

pub(crate) use srq::RawSrq;
