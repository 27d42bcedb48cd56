//! The raw FFI core: hand-written mirrors of `infiniband/verbs.h`.
//!
//! # Safety
//!
//! This is one of the few modules where `unsafe` is allowed. Everything
//! here is a direct mirror of C: structs ([`types`]), enums and flag sets as
//! transparent newtypes ([`consts`]), and the extern functions ([`funcs`]),
//! each quoting its C prototype. Nothing here checks anything; the safe
//! layer above does. Layouts and constants are verified against the
//! installed header by `tests/layout.rs`; prototypes by the C compiler
//! (`c_shim/verbs_shim.h`) and `tests/ffi_surface.rs`.
#![allow(non_camel_case_types)]

#[macro_use]
mod newtype;
pub mod consts;
pub mod funcs;
#[cfg(feature = "rdmacm")]
pub mod rdmacm;
pub mod types;
pub mod wr_types;

pub use consts::*;
pub use funcs::*;
pub use newtype::Zeroed;
pub use types::*;
pub use wr_types::*;

/// Every C function the crate can call (libibverbs, the shim, and with the
/// `rdmacm` feature librdmacm), with its C prototype.
pub fn ffi_surface() -> impl Iterator<Item = &'static FfiItem> {
    let rdmacm: &[FfiItem] = {
        #[cfg(feature = "rdmacm")]
        {
            rdmacm::FFI_SURFACE_RDMACM
        }
        #[cfg(not(feature = "rdmacm"))]
        {
            &[]
        }
    };
    FFI_SURFACE.iter().chain(rdmacm)
}
