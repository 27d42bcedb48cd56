//! Devices, the opened context, and what they report: device attributes,
//! port attributes and the GID table.
#![allow(unsafe_code)]

use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::ffi::CStr;
use core::ptr::NonNull;

use crate::error::{Error, ErrorKind};
use crate::gid::Gid;
use crate::ret::{check_count, check_ptr, check_rc};
use crate::sys::{self, Zeroed};

pub use crate::sys::{
    ibv_gid_type as GidType, ibv_link_layer as LinkLayer, ibv_mtu as PortMtu,
    ibv_port_state as PortState,
};

/// A device the library lists: its kernel name and node GUID.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Kernel device name, e.g. `mlx5_0` or `rxe0`.
    pub name: String,
    /// Node GUID, in host byte order.
    pub guid: u64,
}

/// Every RDMA device the library finds (empty, not an error, when there is none).
pub fn devices() -> Result<Vec<DeviceInfo>, Error> {
    let list = DeviceList::get()?;
    Ok(list
        .iter()
        .map(|dev| DeviceInfo {
            name: device_name(dev),
            // SAFETY: `dev` is an element of a live device list (DeviceList::iter).
            guid: u64::from_be(unsafe { sys::ibv_get_device_guid(dev.as_ptr()) }),
        })
        .collect())
}

/// The array `ibv_get_device_list` returns, freed on drop.
struct DeviceList {
    ptr: Option<NonNull<*mut sys::ibv_device>>,
    len: usize,
}

impl DeviceList {
    fn get() -> Result<DeviceList, Error> {
        let mut n = 0;
        // SAFETY: `n` is a valid out-pointer for the duration of the call.
        let ptr = match check_ptr("ibv_get_device_list", unsafe {
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
    // SAFETY: `dev` is a live device; the name is a NUL-terminated string
    // owned by the device, valid while the list is alive, copied here.
    let name = unsafe { sys::ibv_get_device_name(dev.as_ptr()) };
    if name.is_null() {
        return String::new();
    }
    // SAFETY: non-null, NUL-terminated (see above).
    String::from_utf8_lossy(unsafe { CStr::from_ptr(name) }.to_bytes()).into_owned()
}

pub(crate) struct ContextInner {
    pub(crate) ptr: NonNull<sys::ibv_context>,
    name: String,
    /// For a context the connection manager opened: what keeps it open
    /// (the CM id), dropped instead of closing the device.
    #[allow(dead_code)] // held for its Drop
    keep_alive: Option<Arc<dyn core::any::Any + Send + Sync>>,
}

// SAFETY: libibverbs contexts are thread-safe: every verb may be called on
// one context from any thread (rdma-core's documented threading model).
unsafe impl Send for ContextInner {}
// SAFETY: as above; `&ContextInner` only ever passes the pointer to verbs.
unsafe impl Sync for ContextInner {}

impl Drop for ContextInner {
    fn drop(&mut self) {
        if self.keep_alive.is_none() {
            // SAFETY: the context was opened by Context::open and every child
            // (PD, CQ, ...) holds an Arc to this, so none is alive any more.
            unsafe { sys::ibv_close_device(self.ptr.as_ptr()) };
        }
    }
}

/// An opened device (`struct ibv_context`).
///
/// Children (protection domains, completion queues, ...) hold an `Arc` to
/// their parent, so a parent is closed only after its last child: `Arc`
/// rather than lifetimes because RDMA objects live in long-lived service
/// state shared across threads, where borrowed lifetimes do not fit. The
/// counts are touched at setup only, never on the data path.
#[derive(Clone)]
pub struct Context {
    pub(crate) inner: Arc<ContextInner>,
}

impl core::fmt::Debug for Context {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Context")
            .field("device", &self.inner.name)
            .finish()
    }
}

impl Context {
    /// Opens the device called `name`, or the first device when `None`.
    pub fn open(name: Option<&str>) -> Result<Context, Error> {
        let list = DeviceList::get()?;
        let dev = list.iter().find(|d| name.is_none_or(|n| device_name(*d) == n)).ok_or_else(|| {
            let e = Error::new("open device", ErrorKind::NotFound);
            if name.is_some() {
                e.with_detail("no RDMA device with that name").with_hint("`ibv_devices` lists the names")
            } else {
                e.with_detail("no RDMA device found").with_hint(
                    "a NIC with its driver, or Soft-RoCE: `modprobe rdma_rxe; rdma link add rxe0 type rxe \
                     netdev eth0` (README: Testing without RDMA hardware)",
                )
            }
        })?;
        // SAFETY: `dev` is a live element of `list`.
        let ptr = check_ptr("ibv_open_device", unsafe {
            sys::ibv_open_device(dev.as_ptr())
        })?;
        Ok(Context {
            inner: Arc::new(ContextInner {
                keep_alive: None,
                ptr,
                name: device_name(dev),
            }),
        })
    }

    /// Wraps a context someone else opened and keeps open while `owner`
    /// lives (the connection manager's id); dropping the last clone drops
    /// `owner` instead of closing the device.
    #[cfg(feature = "rdmacm")]
    pub(crate) fn borrowed(
        ptr: NonNull<sys::ibv_context>,
        owner: Arc<dyn core::any::Any + Send + Sync>,
    ) -> Context {
        // SAFETY: `ptr` is a live context (kept open by `owner`, held below).
        let dev = unsafe { sys::verbs_shim_context_device(ptr.as_ptr()) };
        let name = NonNull::new(dev).map(device_name).unwrap_or_default();
        Context {
            inner: Arc::new(ContextInner {
                ptr,
                name,
                keep_alive: Some(owner),
            }),
        }
    }

    /// The device's kernel name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The raw context, for calls the safe layer does not wrap.
    pub fn as_raw(&self) -> *mut sys::ibv_context {
        self.inner.ptr.as_ptr()
    }

    /// Device attributes (`ibv_query_device`).
    pub fn query_device(&self) -> Result<DeviceAttr, Error> {
        let mut attr = sys::ibv_device_attr::zeroed();
        // SAFETY: live context; `attr` is a valid out-pointer.
        check_rc("ibv_query_device", unsafe {
            sys::ibv_query_device(self.as_raw(), &mut attr)
        })?;
        Ok(DeviceAttr(attr))
    }

    /// Port attributes (the `ibv_query_port` macro through the shim, so the
    /// extended fields are filled). Refuses a port past the device's count.
    pub fn query_port(&self, port: u8) -> Result<PortAttr, Error> {
        let count = self.query_device()?.0.phys_port_cnt;
        if port == 0 || port > count {
            return Err(Error::new("ibv_query_port", ErrorKind::NotFound)
                .with_detail("port number past the device's port count (ports count from 1)")
                .with_hint("`ibv_devinfo` shows phys_port_cnt"));
        }
        let mut attr = sys::ibv_port_attr::zeroed();
        // SAFETY: live context; `attr` is a valid out-pointer of the full struct.
        check_rc("ibv_query_port", unsafe {
            sys::verbs_shim_query_port(self.as_raw(), port, &mut attr)
        })?;
        Ok(PortAttr(attr))
    }

    /// The port's whole GID table: every valid entry with its type (IB,
    /// RoCE v1, RoCE v2) and network device.
    pub fn gid_table(&self, port: u8) -> Result<Vec<GidEntry>, Error> {
        let attr = self.query_port(port)?;
        let len = attr.0.gid_tbl_len.max(0) as usize;
        let mut raw = alloc::vec![sys::ibv_gid_entry::default(); len];
        // SAFETY: live context; `raw` has room for `len` entries.
        let n = unsafe { sys::verbs_shim_query_gid_table(self.as_raw(), raw.as_mut_ptr(), len, 0) };
        let n = check_count("ibv_query_gid_table", n)?;
        Ok(raw[..n.min(len)]
            .iter()
            .filter(|e| e.port_num == u32::from(port))
            .map(|e| GidEntry {
                index: e.gid_index,
                gid: Gid::from_raw(e.gid.raw),
                gid_type: e.gid_type,
                ifindex: e.ndev_ifindex,
            })
            .collect())
    }

    /// Reads the next asynchronous event (QP fatal, port error, ...),
    /// waiting at most `timeout_ms` milliseconds (`-1`: forever).
    /// Returns `Ok(None)` when none arrived in time.
    pub fn next_async_event(&self, timeout_ms: i32) -> Result<Option<AsyncEvent>, Error> {
        // SAFETY: live context.
        let fd = unsafe { sys::verbs_shim_context_async_fd(self.as_raw()) };
        if !crate::ret::wait_readable("poll(async fd)", fd, timeout_ms)? {
            return Ok(None);
        }
        let mut ev = sys::ibv_async_event::zeroed();
        // SAFETY: live context; the fd is readable, so this does not block.
        check_rc("ibv_get_async_event", unsafe {
            sys::ibv_get_async_event(self.as_raw(), &mut ev)
        })?;
        let event = AsyncEvent {
            event_type: ev.event_type,
            // SAFETY: every member of the element union is plain data; the
            // port number is only meaningful for port events (documented).
            port: unsafe { ev.element.port_num },
            // Port and device events carry a port number (or nothing), not an object.
            element: match ev.event_type {
                sys::ibv_event_type::PORT_ACTIVE
                | sys::ibv_event_type::PORT_ERR
                | sys::ibv_event_type::LID_CHANGE
                | sys::ibv_event_type::PKEY_CHANGE
                | sys::ibv_event_type::SM_CHANGE
                | sys::ibv_event_type::CLIENT_REREGISTER
                | sys::ibv_event_type::GID_CHANGE
                | sys::ibv_event_type::DEVICE_FATAL => 0,
                // SAFETY: as above: the pointer is read as a number, never dereferenced.
                _ => unsafe { ev.element.qp }.cast::<u8>() as usize,
            },
        };
        // SAFETY: `ev` came from ibv_get_async_event and is acked exactly once.
        unsafe { sys::ibv_ack_async_event(&mut ev) };
        Ok(Some(event))
    }
}

/// An asynchronous event, already acknowledged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AsyncEvent {
    /// What happened.
    pub event_type: sys::ibv_event_type,
    /// The port, for port events (`PORT_ACTIVE`, `PORT_ERR`, ...).
    pub port: i32,
    /// The address of the affected QP/CQ/SRQ, an identity to compare with
    /// `as_raw()` of those objects (0 for port and device events).
    pub element: usize,
}

/// `struct ibv_device_attr`, with accessors for what the crate uses.
#[derive(Clone, Copy)]
pub struct DeviceAttr(pub sys::ibv_device_attr);

impl DeviceAttr {
    /// Number of physical ports.
    pub fn phys_port_cnt(&self) -> u8 {
        self.0.phys_port_cnt
    }
    /// Largest work queue depth.
    pub fn max_qp_wr(&self) -> u32 {
        self.0.max_qp_wr.max(0) as u32
    }
    /// Largest memory region.
    pub fn max_mr_size(&self) -> u64 {
        self.0.max_mr_size
    }
    /// Number of memory windows (0: windows unsupported).
    pub fn max_mw(&self) -> u32 {
        self.0.max_mw.max(0) as u32
    }
    /// Atomic capability.
    pub fn atomic_cap(&self) -> sys::ibv_atomic_cap {
        self.0.atomic_cap
    }
    /// Largest scatter/gather list.
    pub fn max_sge(&self) -> u32 {
        self.0.max_sge.max(0) as u32
    }
    /// Outstanding RDMA reads/atomics a QP may have as initiator.
    pub fn max_qp_rd_atom(&self) -> u8 {
        self.0.max_qp_rd_atom.clamp(0, 255) as u8
    }
    /// Outstanding RDMA reads/atomics a QP may accept as responder.
    pub fn max_qp_init_rd_atom(&self) -> u8 {
        self.0.max_qp_init_rd_atom.clamp(0, 255) as u8
    }
}

impl core::fmt::Debug for DeviceAttr {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("DeviceAttr")
            .field("phys_port_cnt", &self.phys_port_cnt())
            .field("max_qp_wr", &self.max_qp_wr())
            .field("max_mr_size", &self.max_mr_size())
            .field("max_mw", &self.max_mw())
            .field("atomic_cap", &self.atomic_cap())
            .finish_non_exhaustive()
    }
}

/// `struct ibv_port_attr`, with accessors for what the crate uses.
#[derive(Clone, Copy, Debug)]
pub struct PortAttr(pub sys::ibv_port_attr);

impl PortAttr {
    /// Port state (`ACTIVE` when usable).
    pub fn state(&self) -> PortState {
        self.0.state
    }
    /// MTU currently in effect on the port.
    pub fn active_mtu(&self) -> PortMtu {
        self.0.active_mtu
    }
    /// Largest MTU the port supports.
    pub fn max_mtu(&self) -> PortMtu {
        self.0.max_mtu
    }
    /// The port's LID (InfiniBand; 0 on RoCE).
    pub fn lid(&self) -> u16 {
        self.0.lid
    }
    /// InfiniBand or Ethernet (RoCE).
    pub fn link_layer(&self) -> LinkLayer {
        self.0.link_layer
    }
    /// GID table length.
    pub fn gid_tbl_len(&self) -> u32 {
        self.0.gid_tbl_len.max(0) as u32
    }
}

/// One valid entry of a port's GID table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GidEntry {
    /// The GID index (what `sgid_index` takes).
    pub index: u32,
    /// The GID.
    pub gid: Gid,
    /// IB, RoCE v1 or RoCE v2.
    pub gid_type: GidType,
    /// The network device's interface index (0 on InfiniBand).
    pub ifindex: u32,
}

impl GidEntry {
    /// The network device's name (e.g. `eth0`), when the library reports one.
    pub fn netdev(&self) -> Option<String> {
        if self.ifindex == 0 {
            return None;
        }
        let mut buf = [0 as core::ffi::c_char; libc::IF_NAMESIZE];
        // SAFETY: `buf` has IF_NAMESIZE bytes, as if_indextoname requires.
        let p = unsafe { libc::if_indextoname(self.ifindex, buf.as_mut_ptr()) };
        if p.is_null() {
            return None;
        }
        // SAFETY: on success `buf` holds a NUL-terminated name.
        Some(
            String::from_utf8_lossy(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_bytes())
                .into_owned(),
        )
    }
}

/// Picks the GID index to use when the caller did not name one: RoCE v2
/// before v1 (and IB), IPv4-mapped before IPv6, never link-local while a
/// routable GID exists, never a zero GID. `None` when the table has no
/// usable entry.
pub fn choose_gid_index(table: &[GidEntry]) -> Option<u32> {
    choose_gid(table).map(|e| e.index)
}

/// The entry [`choose_gid_index`] picks (its address, type and netdev).
pub fn choose_gid(table: &[GidEntry]) -> Option<&GidEntry> {
    table.iter().filter(|e| !e.gid.is_zero()).max_by_key(|e| {
        let v2 = u32::from(e.gid_type == GidType::ROCE_V2);
        let ipv4 = u32::from(e.gid.ipv4().is_some());
        let routable = u32::from(!e.gid.is_link_local());
        // Routable first, then RoCE v2, then IPv4; lowest index breaks ties.
        (routable * 4 + v2 * 2 + ipv4, core::cmp::Reverse(e.index))
    })
}

/// Checks an explicitly requested GID index against the table.
pub fn validate_gid_index(
    table: &[GidEntry],
    index: u32,
    table_len: u32,
) -> Result<GidEntry, Error> {
    let call = "GID index";
    if index >= table_len {
        return Err(Error::new(call, ErrorKind::NotFound)
            .with_detail("GID index past the port's GID table")
            .with_hint("`ibv_devinfo -v` or `show_gids` lists the valid indexes; omit the index to choose automatically"));
    }
    match table.iter().find(|e| e.index == index) {
        Some(e) if !e.gid.is_zero() => Ok(*e),
        _ => Err(Error::new(call, ErrorKind::NotFound)
            .with_detail("the GID table entry at that index is empty")
            .with_hint("omit the index to choose automatically (RoCE v2, IPv4-mapped first)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u32, gid: Gid, gid_type: GidType) -> GidEntry {
        GidEntry {
            index,
            gid,
            gid_type,
            ifindex: 0,
        }
    }

    fn link_local() -> Gid {
        let mut raw = [0u8; 16];
        raw[0] = 0xfe;
        raw[1] = 0x80;
        raw[15] = 1;
        Gid::from_raw(raw)
    }

    #[test]
    fn rxe_table_picks_the_ipv4_mapped_v2_entry() {
        let table = [
            entry(0, link_local(), GidType::ROCE_V2),
            entry(1, Gid::from_ipv4([10, 0, 0, 1]), GidType::ROCE_V2),
        ];
        assert_eq!(choose_gid_index(&table), Some(1));
    }

    #[test]
    fn mlx_style_table_picks_index_3() {
        let table = [
            entry(0, link_local(), GidType::ROCE_V1),
            entry(1, link_local(), GidType::ROCE_V2),
            entry(2, Gid::from_ipv4([10, 0, 0, 1]), GidType::ROCE_V1),
            entry(3, Gid::from_ipv4([10, 0, 0, 1]), GidType::ROCE_V2),
        ];
        assert_eq!(choose_gid_index(&table), Some(3));
    }

    #[test]
    fn link_local_only_when_nothing_else_and_never_zero() {
        let table = [
            entry(0, Gid::ZERO, GidType::ROCE_V2),
            entry(1, link_local(), GidType::IB),
        ];
        assert_eq!(choose_gid_index(&table), Some(1));
        assert_eq!(
            choose_gid_index(&[entry(0, Gid::ZERO, GidType::ROCE_V2)]),
            None
        );
    }

    #[test]
    fn explicit_index_is_validated() {
        let table = [entry(0, link_local(), GidType::ROCE_V2)];
        assert!(validate_gid_index(&table, 0, 16).is_ok());
        assert_eq!(
            validate_gid_index(&table, 16, 16).unwrap_err().kind(),
            ErrorKind::NotFound
        );
        assert_eq!(
            validate_gid_index(&table, 5, 16).unwrap_err().kind(),
            ErrorKind::NotFound
        );
    }
}
