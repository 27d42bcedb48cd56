//! Devices, the opened context, and what they report: device attributes,
//! port attributes, the GID table and asynchronous events.

use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;

use crate::error::{site, Error, ErrorKind};
use crate::gid::Gid;
use crate::raw::{raw_devices, RawContext};
use crate::sys;

mod gid_table;

pub use crate::sys::{
    ibv_link_layer as LinkLayer, ibv_mtu as PortMtu, ibv_port_state as PortState,
};
pub use gid_table::{choose_gid, choose_gid_index, validate_gid_index, GidEntry, GidType};

/// The vendor id of Linux Soft-RoCE (rxe), whose responder checks a memory
/// window's accesses against the underlying region's range, not the
/// window's (drivers/infiniband/sw/rxe/rxe_resp.c, check_rkey): a window
/// there grants the whole region.
const SOFT_ROCE_VENDOR_ID: u32 = 0x00FF_FFFF;

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
    Ok(raw_devices()?
        .into_iter()
        .map(|(name, guid)| DeviceInfo { name, guid })
        .collect())
}

/// An opened device (`struct ibv_context`).
///
/// Children (protection domains, completion queues, ...) hold an `Arc` to
/// their parent, so a parent is closed only after its last child: `Arc`
/// rather than lifetimes because RDMA objects live in long-lived service
/// state shared across threads. The counts are touched at setup only.
#[derive(Clone)]
pub struct Context {
    pub(crate) raw: Arc<RawContext>,
}

impl core::fmt::Debug for Context {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Context")
            .field("device", &self.raw.name())
            .finish()
    }
}

impl Context {
    /// Opens the device called `name`, or the first device when `None`.
    pub fn open(name: Option<&str>) -> Result<Context, Error> {
        match RawContext::open(name)? {
            Some(raw) => Ok(Context { raw: Arc::new(raw) }),
            None if name.is_some() => Err(Error::new(
                site!("open device", "no RDMA device with that name", "`ibv_devices` lists the names"),
                ErrorKind::NotFound,
            )),
            None => Err(Error::new(
                site!(
                    "open device",
                    "no RDMA device found",
                    "a NIC with its driver, or Soft-RoCE: `modprobe rdma_rxe; rdma link add rxe0 type rxe netdev eth0` \
                     (README: Testing without RDMA hardware)"
                ),
                ErrorKind::NotFound,
            )),
        }
    }

    /// The device's kernel name.
    pub fn name(&self) -> &str {
        self.raw.name()
    }

    /// The raw context, for calls the safe layer does not wrap.
    pub fn as_raw(&self) -> *mut sys::ibv_context {
        self.raw.as_ptr()
    }

    /// True when both handles are the same opened context.
    pub fn same_as(&self, other: &Context) -> bool {
        Arc::ptr_eq(&self.raw, &other.raw)
    }

    /// Device attributes (`ibv_query_device`).
    pub fn query_device(&self) -> Result<DeviceAttr, Error> {
        self.raw.query_device().map(DeviceAttr)
    }

    /// Port attributes (the `ibv_query_port` macro, so the extended fields
    /// are filled). Refuses a port past the device's count.
    pub fn query_port(&self, port: u8) -> Result<PortAttr, Error> {
        let count = self.query_device()?.phys_port_cnt();
        if port == 0 || port > count {
            return Err(Error::new(
                site!(
                    "ibv_query_port",
                    "port number past the device's port count (ports count from 1)",
                    "`ibv_devinfo` shows phys_port_cnt"
                ),
                ErrorKind::NotFound,
            ));
        }
        self.raw.query_port(port).map(PortAttr)
    }

    /// The port's whole GID table: every valid entry with its type (IB,
    /// RoCE v1, RoCE v2) and network device.
    pub fn gid_table(&self, port: u8) -> Result<Vec<GidEntry>, Error> {
        let attr = self.query_port(port)?;
        let len = attr.gid_tbl_len() as usize * usize::from(self.query_device()?.phys_port_cnt());
        Ok(self
            .raw
            .gid_table(len)?
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

    /// False on devices whose memory windows do not enforce their own
    /// bounds (Soft-RoCE) and on devices with no memory windows at all
    /// (`max_mw` 0, such as Soft-iWARP): the crate never binds a window
    /// there, and exposes a buffer through a registration of its own.
    pub fn windows_enforce_bounds(&self) -> Result<bool, Error> {
        let dev = self.query_device()?;
        Ok(dev.0.vendor_id != SOFT_ROCE_VENDOR_ID && dev.max_mw() > 0)
    }

    /// Reads the next asynchronous event (QP fatal, port error, ...),
    /// waiting at most `timeout_ms` milliseconds (`-1`: forever).
    /// Returns `Ok(None)` when none arrived in time.
    pub fn next_async_event(&self, timeout_ms: i32) -> Result<Option<AsyncEvent>, Error> {
        let Some((event_type, port, element)) = self.raw.next_async_event(timeout_ms)? else {
            return Ok(None);
        };
        use sys::ibv_event_type as T;
        // Port and device events carry a port number (or nothing), not an object.
        let port_event = matches!(
            event_type,
            T::PORT_ACTIVE
                | T::PORT_ERR
                | T::LID_CHANGE
                | T::PKEY_CHANGE
                | T::SM_CHANGE
                | T::CLIENT_REREGISTER
                | T::GID_CHANGE
                | T::DEVICE_FATAL
        );
        Ok(Some(AsyncEvent {
            event_type,
            port: if port_event { port } else { 0 },
            element: if port_event { 0 } else { element },
        }))
    }
}

/// An asynchronous event, already acknowledged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AsyncEvent {
    /// What happened.
    pub event_type: sys::ibv_event_type,
    /// The port, for port events (`PORT_ACTIVE`, `PORT_ERR`, ...).
    pub port: i32,
    /// The affected object's identity (compare with `raw_id()` of a queue
    /// pair, completion queue or shared receive queue); 0 for port and
    /// device events.
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
    /// Largest completion queue.
    pub fn max_cqe(&self) -> u32 {
        self.0.max_cqe.max(0) as u32
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
    /// Outstanding RDMA reads/atomics a QP may accept as responder.
    pub fn max_qp_rd_atom(&self) -> u8 {
        self.0.max_qp_rd_atom.clamp(0, 255) as u8
    }
    /// Outstanding RDMA reads/atomics a QP may have as initiator.
    pub fn max_qp_init_rd_atom(&self) -> u8 {
        self.0.max_qp_init_rd_atom.clamp(0, 255) as u8
    }
}

impl core::fmt::Debug for DeviceAttr {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("DeviceAttr")
            .field("phys_port_cnt", &self.phys_port_cnt())
            .field("max_qp_wr", &self.max_qp_wr())
            .field("max_cqe", &self.max_cqe())
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
