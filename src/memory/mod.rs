//! What memory the NIC and the CPU may each touch, and how.
//!
//! - [`NicBuf`]: memory the NIC can address (registered, owned by the value
//!   alone): what a work request may own while the device uses it. Device
//!   memory (a GPU's, through dmabuf) is only this.
//! - [`HostBuf`]: NIC-addressable memory that the CPU can also address at
//!   the same address. Only these are copied into and out of
//!   ([`HostBuf::write_at`], [`HostBuf::read_at`]) and lent as slices
//!   ([`HostBuf::as_slice`]), and a slice only where no peer can write.
//!
//! The copies are volatile, because a peer's NIC may write memory it was
//! given access to at any time; the slices are sound because a buffer in
//! flight is owned by the queue that posted it, and memory a peer can write
//! is never lent.
//!
//! The crate's own buffers live here too, each with the argument for why
//! it meets the contract: [`MemoryRegion`] (pages or the caller's heap
//! bytes), [`ForeignRegion`] and [`DmabufRegion`] (device-only), and the
//! [`Arena`]'s [`ArenaBuf`], with [`ExposedBuf`] for one buffer a peer may reach.
//!
//! # Safety
//!
//! This module is one of the few allowed `unsafe`: the copies, the slices,
//! and the buffer types' implementations of the two contracts.
#![allow(unsafe_code)]

mod access;
mod arena;
mod carve;
mod contract;
mod dmabuf;
mod exposed;
mod region;
mod return_queue;

#[cfg(feature = "std")]
pub use arena::SharedArena;
pub use arena::{Arena, ArenaBuf, ArenaConfig, DEFAULT_FRONT_CACHE};
#[doc(hidden)]
pub use carve::{ArenaModel, ModelBuf};

#[doc(inline)]
pub use access::Access;
pub use dmabuf::DmabufRegion;
pub(crate) use exposed::check_access;
pub use exposed::{Exposed, ExposedBuf};
pub use region::{ForeignRegion, MemoryRegion};

pub use contract::{HostBuf, NicBuf};
