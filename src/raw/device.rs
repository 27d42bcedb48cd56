//! Devices and opened contexts (`struct ibv_context`).

use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::ffi::CStr;
use core::ptr::NonNull;

use crate::error::{site, Error};
use crate::sys::{self, Zeroed};

use super::os::wait_readable;
use super::ret::{check_count, check_ptr, check_rc};

/// The array `ibv_get_device_list` returns, freed on drop.
struct DeviceList {
    ptr: Option<NonNull<*mut sys::ibv_device>>,
    len: usize,
}

impl DeviceList {
    fn get() -> Result<DeviceList, Error> {
        let mut n = 0;
        // SAFETY: `n` is a valid out-pointer for the duration of the call.
        let ptr = match check_ptr(site!("ibv_get_device_list"), unsafe {
            sys::ibv_get_device_list(&mut n)
        }) {
            Ok(ptr) => ptr,
            // No RDMA support in the kernel at all (no /sys/class/infiniband):
            // that is "no devices", not a failure.
            Err(e) if e.errno() == Some(libc::ENOSYS) => {
                return Ok(DeviceList { ptr: None, len: 0 })
            }
            Err(e) => return Err(e),
        };
        Ok(DeviceList {
            ptr: Some(ptr),
            len: n.max(0) as usize,
        })
    }

    fn iter(&self) -> impl Iterator<Item = NonNull<sys::ibv_device>> + '_ {
        let list = self.ptr;
        (0..self.len).filter_map(move |i| {
            // SAFETY: `len` is 0 without a list; otherwise the array holds
            // `len` device pointers (then NULL) and lives until `self` drops.
            list.and_then(|p| NonNull::new(unsafe { *p.as_ptr().add(i) }))
        })
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        if let Some(p) = self.ptr {
            // SAFETY: `p` came from ibv_get_device_list and is freed once.
            unsafe { sys::ibv_free_device_list(p.as_ptr()) }
        }
    }
}

fn device_name(dev: NonNull<sys::ibv_device>) -> String {
    // SAFETY: `dev` is a live device (of a live list, or of a live
    // context); its name is a NUL-terminated string it owns, copied here.
    let name = unsafe { sys::ibv_get_device_name(dev.as_ptr()) };
    if name.is_null() {
        return String::new();
    }
    // SAFETY: non-null and NUL-terminated (above).
    String::from_utf8_lossy(unsafe { CStr::from_ptr(name) }.to_bytes()).into_owned()
}

/// Every device's kernel name and node GUID (host byte order).
pub(crate) fn raw_devices() -> Result<Vec<(String, u64)>, Error> {
    let list = DeviceList::get()?;
    Ok(list
        .iter()
        .map(|dev| {
            // SAFETY: `dev` is an element of the live list.
            let guid = unsafe { sys::ibv_get_device_guid(dev.as_ptr()) };
            (device_name(dev), u64::from_be(guid))
        })
        .collect())
}

/// An opened device. Closed on drop, unless someone else (the connection
/// manager's id, held in `keep_alive`) opened it and keeps it open.
pub(crate) struct RawContext {
    ptr: NonNull<sys::ibv_context>,
    name: String,
    keep_alive: Option<Arc<dyn core::any::Any + Send + Sync>>,
}

// SAFETY: libibverbs contexts are thread-safe: every verb may be called on
// one context from any thread (rdma-core's documented threading model).
unsafe impl Send for RawContext {}
// SAFETY: as above; `&RawContext` only ever passes the pointer to verbs.
unsafe impl Sync for RawContext {}

impl RawContext {
    /// Opens the device called `name`, or the first one; `Ok(None)` when
    /// there is no such device.
    pub(crate) fn open(name: Option<&str>) -> Result<Option<RawContext>, Error> {
        let list = DeviceList::get()?;
        let Some(dev) = list
            .iter()
            .find(|d| name.is_none_or(|n| device_name(*d) == n))
        else {
            return Ok(None);
        };
        // SAFETY: `dev` is a live element of `list`.
        let ptr = check_ptr(site!("ibv_open_device"), unsafe {
            sys::ibv_open_device(dev.as_ptr())
        })?;
        Ok(Some(RawContext {
            ptr,
            name: device_name(dev),
            keep_alive: None,
        }))
    }

    /// A context someone else opened and keeps open while `owner` lives.
    #[cfg(feature = "rdmacm")]
    pub(crate) fn borrowed(
        ptr: NonNull<sys::ibv_context>,
        owner: Arc<dyn core::any::Any + Send + Sync>,
    ) -> RawContext {
        // SAFETY: `ptr` is a live context (kept open by `owner`, held below).
        let dev = unsafe { sys::verbs_shim_context_device(ptr.as_ptr()) };
        RawContext {
            ptr,
            name: NonNull::new(dev).map(device_name).unwrap_or_default(),
            keep_alive: Some(owner),
        }
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_context {
        self.ptr.as_ptr()
    }

    /// The device's kernel name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// `ibv_query_device`.
    pub(crate) fn query_device(&self) -> Result<sys::ibv_device_attr, Error> {
        let mut attr = sys::ibv_device_attr::zeroed();
        // SAFETY: live context; `attr` is a valid out-pointer.
        check_rc(site!("ibv_query_device"), unsafe {
            sys::ibv_query_device(self.as_ptr(), &mut attr)
        })?;
        Ok(attr)
    }

    /// The `ibv_query_port` macro through the shim (the whole struct).
    pub(crate) fn query_port(&self, port: u8) -> Result<sys::ibv_port_attr, Error> {
        let mut attr = sys::ibv_port_attr::zeroed();
        // SAFETY: live context; `attr` is a valid out-pointer of the full struct.
        check_rc(site!("ibv_query_port"), unsafe {
            sys::verbs_shim_query_port(self.as_ptr(), port, &mut attr)
        })?;
        Ok(attr)
    }

    /// The valid entries of the GID tables (all ports), at most `max`.
    pub(crate) fn gid_table(&self, max: usize) -> Result<Vec<sys::ibv_gid_entry>, Error> {
        let mut raw = alloc::vec![sys::ibv_gid_entry::default(); max];
        // SAFETY: live context; `raw` has room for `max` entries.
        let n = unsafe { sys::verbs_shim_query_gid_table(self.as_ptr(), raw.as_mut_ptr(), max, 0) };
        let n = check_count(site!("ibv_query_gid_table"), n)?;
        raw.truncate(n.min(max));
        Ok(raw)
    }

    /// The next asynchronous event, waiting at most `timeout_ms` (`-1`:
    /// forever), acknowledged before it is returned: its type, port number
    /// and the affected object's address as a number (never dereferenced).
    pub(crate) fn next_async_event(
        &self,
        timeout_ms: i32,
    ) -> Result<Option<(sys::ibv_event_type, i32, usize)>, Error> {
        // SAFETY: live context.
        let fd = unsafe { sys::verbs_shim_context_async_fd(self.as_ptr()) };
        if !wait_readable(site!("poll(async fd)"), fd, timeout_ms)? {
            return Ok(None);
        }
        let mut ev = sys::ibv_async_event::zeroed();
        // SAFETY: live context; the fd is readable, so this does not block.
        check_rc(site!("ibv_get_async_event"), unsafe {
            sys::ibv_get_async_event(self.as_ptr(), &mut ev)
        })?;
        // SAFETY: every member of the element union is plain data read as a
        // number; which one is meaningful depends on the type (the caller's).
        let (port, element) = unsafe { (ev.element.port_num, ev.element.qp.cast::<u8>() as usize) };
        let event_type = ev.event_type;
        // SAFETY: `ev` came from ibv_get_async_event and is acked exactly once.
        unsafe { sys::ibv_ack_async_event(&mut ev) };
        Ok(Some((event_type, port, element)))
    }
}

impl Drop for RawContext {
    fn drop(&mut self) {
        if self.keep_alive.is_none() {
            // SAFETY: opened by `open`; every child holds an Arc to this, so
            // none is alive (a leaked child keeps its Arc, so this never runs).
            let rc = unsafe { sys::ibv_close_device(self.ptr.as_ptr()) };
            if rc != 0 {
                super::leak::count_leak();
            }
        }
    }
}
