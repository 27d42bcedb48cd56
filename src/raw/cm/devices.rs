//! The device contexts librdmacm opened: every id on a device uses the
//! same `struct ibv_context`, and a protection domain, completion queue
//! or queue pair an id's queue pair uses must be on that one.

use alloc::sync::Arc;
use core::ptr::NonNull;

use crate::error::{site, Error, ErrorKind};
use crate::sys::{self, rdmacm as cm};

use crate::raw::device::RawContext;
use crate::raw::ret::check_ptr;

/// The list `rdma_get_devices` returns: while it lives, librdmacm keeps
/// every context in it open. Freed on drop.
pub(crate) struct RawCmDevices {
    list: NonNull<*mut sys::ibv_context>,
    len: usize,
}

// SAFETY: the list is an array of context pointers librdmacm keeps open;
// it is only read, and freed once.
unsafe impl Send for RawCmDevices {}
// SAFETY: as above.
unsafe impl Sync for RawCmDevices {}

impl RawCmDevices {
    /// `rdma_get_devices`.
    pub(crate) fn get() -> Result<Arc<RawCmDevices>, Error> {
        let mut n = 0;
        // SAFETY: valid out-pointer.
        let list = check_ptr(site!("rdma_get_devices"), unsafe {
            cm::rdma_get_devices(&mut n)
        })?;
        Ok(Arc::new(RawCmDevices {
            list,
            len: usize::try_from(n).unwrap_or(0),
        }))
    }

    fn contexts(&self) -> impl Iterator<Item = NonNull<sys::ibv_context>> + '_ {
        (0..self.len).filter_map(|i| {
            // SAFETY: the array holds `len` entries (then NULL) while it lives.
            NonNull::new(unsafe { *self.list.as_ptr().add(i) })
        })
    }

    /// `verbs`, which must be one of this list's contexts, kept open by
    /// the list.
    pub(crate) fn context(
        self: Arc<Self>,
        verbs: NonNull<sys::ibv_context>,
    ) -> Result<RawContext, Error> {
        if !self.contexts().any(|c| c == verbs) {
            return Err(Error::new(
                site!(
                    "rdma_get_devices",
                    "the id's device is not in librdmacm's list"
                ),
                ErrorKind::NotFound,
            ));
        }
        Ok(RawContext::borrowed(verbs, self))
    }

    /// The context of the device called `name`, or the first, kept open
    /// by the list; `Ok(None)` when there is no such device.
    pub(crate) fn by_name(self: Arc<Self>, name: Option<&str>) -> Option<RawContext> {
        let found: alloc::vec::Vec<_> = self.contexts().collect();
        found
            .into_iter()
            .map(|c| RawContext::borrowed(c, self.clone()))
            .find(|ctx| name.is_none_or(|n| ctx.name() == n))
    }
}

impl Drop for RawCmDevices {
    fn drop(&mut self) {
        // SAFETY: the list rdma_get_devices returned, freed once; every
        // context borrowed from it holds this value alive.
        unsafe { cm::rdma_free_devices(self.list.as_ptr()) };
    }
}
