//! Protection domains: the security boundary that ties memory regions and
//! queue pairs together.

use alloc::sync::Arc;

use crate::device::Context;
use crate::error::Error;
use crate::raw::RawPd;

/// A protection domain (`struct ibv_pd`). Memory regions and queue pairs
/// keep it alive; a region is usable only by queue pairs of the same PD.
#[derive(Clone)]
pub struct ProtectionDomain {
    pub(crate) raw: Arc<RawPd>,
    ctx: Context,
}

impl ProtectionDomain {
    /// Allocates a protection domain on `ctx`.
    pub fn new(ctx: &Context) -> Result<ProtectionDomain, Error> {
        Ok(ProtectionDomain {
            raw: Arc::new(RawPd::alloc(&ctx.raw)?),
            ctx: ctx.clone(),
        })
    }

    /// The context this PD belongs to.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The raw PD, for calls the safe layer does not wrap.
    pub fn as_raw(&self) -> *mut crate::sys::ibv_pd {
        self.raw.as_ptr()
    }

    /// True when both handles are the same protection domain.
    pub fn same_as(&self, other: &ProtectionDomain) -> bool {
        Arc::ptr_eq(&self.raw, &other.raw)
    }
}

impl core::fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ProtectionDomain")
            .field("context", &self.ctx)
            .finish()
    }
}
