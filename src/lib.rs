//! `verbs`: hand-written Rust bindings to libibverbs.
//!
//! Layers, bottom up: [`sys`] (the audited FFI core, the only place with
//! `unsafe`), the safe layer (device, PD, CQ, QP, MR, work requests,
//! completions), the [`tlsf`] allocator core behind the arena, and the
//! out-of-band [`endpoint`] exchange.
#![cfg_attr(not(feature = "std"), no_std)]
#![deny(unsafe_code)]
#![warn(missing_docs, unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

extern crate alloc;

#[allow(unsafe_code)]
pub mod sys;

pub mod endpoint;
#[cfg(feature = "std")]
pub mod exchange;
pub mod gid;
pub mod tlsf;
pub mod wire;
