//! An `rdma_cm_id`: created on a channel or taken from a connect
//! request, moved between channels, and every call the crate makes on it.

use alloc::sync::Arc;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, Ordering};
use std::net::SocketAddr;

use crate::error::{site, Error};
use crate::sys::rdmacm as cm;

use super::channel::{PlacedAs, RawCmChannel, RawCmRequest};
use super::devices::RawCmDevices;
use crate::raw::device::RawContext;
use crate::raw::ret::check_rc;

/// An `rdma_cm_id` and the channel its events arrive on.
pub(crate) struct RawCmId {
    ptr: NonNull<cm::rdma_cm_id>,
    channel: Arc<RawCmChannel>,
    /// ESTABLISHED seen, and neither side disconnected since: whoever
    /// holds the id's queue pair disconnects it (once).
    connected: AtomicBool,
    /// Made by a connect request (accepts), else by `create` (connects).
    passive: bool,
    /// `rdma_connect` or `rdma_accept` was called (once per id).
    started: AtomicBool,
    /// DISCONNECTED arrived.
    peer_disconnected: AtomicBool,
}

// SAFETY: librdmacm ids may be used from any thread; the pointer is only
// passed to librdmacm.
unsafe impl Send for RawCmId {}
// SAFETY: as above.
unsafe impl Sync for RawCmId {}

impl RawCmId {
    /// `rdma_create_id` (RDMA_PS_TCP) on `channel`.
    pub(crate) fn create(channel: &Arc<RawCmChannel>) -> Result<RawCmId, Error> {
        let mut id = core::ptr::null_mut();
        // SAFETY: live channel; valid out-pointer.
        check_rc(site!("rdma_create_id"), unsafe {
            cm::rdma_create_id(
                channel.as_ptr(),
                &mut id,
                core::ptr::null_mut(),
                cm::rdma_port_space::PS_TCP,
            )
        })?;
        let ptr = NonNull::new(id).ok_or(Error::os(site!("rdma_create_id"), libc::EINVAL))?;
        Ok(RawCmId::fresh(ptr, channel, false))
    }

    /// An id nothing has been done with yet, its events on `channel`.
    fn fresh(ptr: NonNull<cm::rdma_cm_id>, channel: &Arc<RawCmChannel>, passive: bool) -> RawCmId {
        RawCmId {
            ptr,
            channel: channel.clone(),
            connected: AtomicBool::new(false),
            passive,
            started: AtomicBool::new(false),
            peer_disconnected: AtomicBool::new(false),
        }
    }

    /// The id of the connect request `req`, moved to `to`
    /// (`rdma_migrate_id`) so its later events reach whoever holds it; it
    /// accepts. On failure the request is refused and destroyed.
    pub(crate) fn from_request(
        req: RawCmRequest,
        to: &Arc<RawCmChannel>,
    ) -> Result<RawCmId, Error> {
        // SAFETY: live id whose events are all acked; live channel.
        check_rc(site!("rdma_migrate_id"), unsafe {
            cm::rdma_migrate_id(req.as_ptr(), to.as_ptr())
        })?;
        let (ptr, _old_channel) = req.into_parts();
        Ok(RawCmId::fresh(ptr, to, true))
    }

    /// Moves the id to `to` (`rdma_migrate_id`): its later events arrive
    /// there. On failure the id is destroyed.
    pub(crate) fn migrate(self, to: &Arc<RawCmChannel>) -> Result<RawCmId, Error> {
        if Arc::ptr_eq(&self.channel, to) {
            return Ok(self);
        }
        // SAFETY: live id whose events are all acked (they are acked as
        // they are read); live channel.
        check_rc(site!("rdma_migrate_id"), unsafe {
            cm::rdma_migrate_id(self.ptr.as_ptr(), to.as_ptr())
        })?;
        self.channel.forget(self.addr());
        let moved = RawCmId {
            ptr: self.ptr,
            channel: to.clone(),
            connected: AtomicBool::new(self.connected.load(Ordering::Relaxed)),
            passive: self.passive,
            started: AtomicBool::new(self.started.load(Ordering::Relaxed)),
            peer_disconnected: AtomicBool::new(self.peer_disconnected.load(Ordering::Relaxed)),
        };
        let this = core::mem::ManuallyDrop::new(self);
        // SAFETY: read once out of a value whose drop never runs (the id
        // lives on in `moved`); the old channel's Arc goes.
        drop(unsafe { core::ptr::read(&this.channel) });
        Ok(moved)
    }

    /// The id's address, as an identity (events name their id by it).
    pub(crate) fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// True for the id of a connect request (it accepts), false for one
    /// that connects.
    pub(crate) fn is_passive(&self) -> bool {
        self.passive
    }

    /// Records that the queue pair made on this id was placed as `placed`.
    pub(crate) fn placed_as(&self, placed: PlacedAs) {
        self.channel.enter(self.addr(), placed);
    }

    /// The channel this id's events arrive on.
    pub(crate) fn channel(&self) -> &Arc<RawCmChannel> {
        &self.channel
    }

    /// `rdma_bind_addr`.
    pub(crate) fn bind_addr(&self, addr: &SocketAddr) -> Result<(), Error> {
        let (mut ss, _) = sockaddr(addr);
        // SAFETY: live id; `ss` is a valid sockaddr for the call.
        check_rc(site!("rdma_bind_addr"), unsafe {
            cm::rdma_bind_addr(
                self.ptr.as_ptr(),
                (&mut ss as *mut libc::sockaddr_storage).cast(),
            )
        })
    }

    /// `rdma_listen`.
    pub(crate) fn listen(&self, backlog: i32) -> Result<(), Error> {
        // SAFETY: live, bound id.
        check_rc(site!("rdma_listen"), unsafe {
            cm::rdma_listen(self.ptr.as_ptr(), backlog)
        })
    }

    /// `rdma_resolve_addr` to `addr` (ADDR_RESOLVED follows on the channel).
    pub(crate) fn resolve_addr(&self, addr: &SocketAddr, timeout_ms: i32) -> Result<(), Error> {
        let (mut dst, _) = sockaddr(addr);
        // SAFETY: live id; `dst` is a valid sockaddr for the call.
        check_rc(site!("rdma_resolve_addr"), unsafe {
            cm::rdma_resolve_addr(
                self.ptr.as_ptr(),
                core::ptr::null_mut(),
                (&mut dst as *mut libc::sockaddr_storage).cast(),
                timeout_ms,
            )
        })
    }

    /// `rdma_resolve_route` (ROUTE_RESOLVED follows on the channel).
    pub(crate) fn resolve_route(&self, timeout_ms: i32) -> Result<(), Error> {
        // SAFETY: live id with a resolved address.
        check_rc(site!("rdma_resolve_route"), unsafe {
            cm::rdma_resolve_route(self.ptr.as_ptr(), timeout_ms)
        })
    }

    /// The device context librdmacm opened for this id (after binding to
    /// a device's address, ROUTE_RESOLVED or a connect request), kept
    /// open by librdmacm's device list rather than by the id, which can
    /// go with its connection.
    pub(crate) fn context(&self) -> Result<RawContext, Error> {
        // SAFETY: live id.
        let verbs = unsafe { cm::verbs_shim_cm_id_verbs(self.ptr.as_ptr()) };
        let verbs = NonNull::new(verbs).ok_or(Error::new(
            site!(
                "rdma_cm: the id has no device",
                "",
                "bind to the address of an RDMA device's network interface, not the unspecified address"
            ),
            crate::error::ErrorKind::NotFound,
        ))?;
        RawCmDevices::get()?.context(verbs)
    }

    /// True when `ctx` is the context librdmacm opened for this id.
    pub(crate) fn is_on(&self, ctx: &RawContext) -> bool {
        // SAFETY: live id.
        core::ptr::eq(
            unsafe { cm::verbs_shim_cm_id_verbs(self.ptr.as_ptr()) },
            ctx.as_ptr(),
        )
    }

    /// The port the id resolved to.
    pub(crate) fn port(&self) -> u8 {
        // SAFETY: live id.
        unsafe { cm::verbs_shim_cm_id_port(self.ptr.as_ptr()) }
    }

    pub(crate) fn as_ptr(&self) -> *mut cm::rdma_cm_id {
        self.ptr.as_ptr()
    }

    /// `rdma_connect` (active side) or `rdma_accept` (passive side).
    pub(crate) fn connect_or_accept(
        &self,
        accept: bool,
        private: &[u8],
        rd_atomic: u8,
    ) -> Result<(), Error> {
        let mut param = cm::rdma_conn_param {
            private_data: if private.is_empty() {
                core::ptr::null()
            } else {
                private.as_ptr().cast()
            },
            private_data_len: private.len().min(255) as u8,
            responder_resources: rd_atomic,
            initiator_depth: rd_atomic,
            flow_control: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: 0,
            qp_num: 0,
        };
        // SAFETY: live id with a QP; `param` and its private data outlive the call.
        let rc = unsafe {
            if accept {
                cm::rdma_accept(self.ptr.as_ptr(), &mut param)
            } else {
                cm::rdma_connect(self.ptr.as_ptr(), &mut param)
            }
        };
        check_rc(
            if accept {
                site!("rdma_accept")
            } else {
                site!("rdma_connect")
            },
            rc,
        )
    }

    /// `rdma_reject`.
    pub(crate) fn reject(&self) -> Result<(), Error> {
        // SAFETY: live, unaccepted id.
        check_rc(site!("rdma_reject"), unsafe {
            cm::rdma_reject(self.ptr.as_ptr(), core::ptr::null(), 0)
        })
    }

    /// Records ESTABLISHED.
    pub(crate) fn set_connected(&self) {
        self.connected.store(true, Ordering::Relaxed);
    }

    /// Records that `rdma_connect` or `rdma_accept` is being called; false
    /// if it was already.
    pub(crate) fn take_start(&self) -> bool {
        !self.started.swap(true, Ordering::Relaxed)
    }

    /// Records the peer's DISCONNECTED.
    pub(crate) fn set_peer_disconnected(&self) {
        self.peer_disconnected.store(true, Ordering::Relaxed);
    }

    /// True once the peer's DISCONNECTED arrived.
    pub(crate) fn peer_disconnected(&self) -> bool {
        self.peer_disconnected.load(Ordering::Relaxed)
    }

    /// Records that the connection ended; true if it was up until now.
    pub(crate) fn take_connected(&self) -> bool {
        self.connected.swap(false, Ordering::Relaxed)
    }

    /// `rdma_disconnect`: the id's QP (if it still has one) goes to ERR and
    /// the peer sees DISCONNECTED. Called by whoever holds the id's QP
    /// (`CmConnection` reaches the id through its queue pair), so no other
    /// thread is destroying that QP meanwhile.
    pub(crate) fn disconnect(&self) -> Result<(), Error> {
        // SAFETY: live id; id->qp is live or NULL (cleared before the QP's
        // destroy, `set_qp`).
        check_rc(site!("rdma_disconnect"), unsafe {
            cm::rdma_disconnect(self.ptr.as_ptr())
        })
    }

    /// Points the id at `qp`: NULL just before the crate destroys the
    /// id's QP, the QP again if that destroy failed (it is then leaked,
    /// alive). So id->qp is never a freed QP, even for an instant.
    ///
    /// # Safety
    ///
    /// `qp` is NULL or the live QP `rdma_create_qp` made on this id.
    pub(crate) unsafe fn set_qp(&self, qp: *mut crate::sys::ibv_qp) {
        // SAFETY: live id; only its `qp` pointer is written, with NULL or
        // its own live QP (the caller's contract).
        unsafe { cm::verbs_shim_cm_id_set_qp(self.ptr.as_ptr(), qp) }
    }
}

impl Drop for RawCmId {
    fn drop(&mut self) {
        // Out of the table before the address can be reused.
        self.channel.forget(self.addr());
        // SAFETY: its QP holds an Arc to this id and is gone (librdmacm's
        // device list, not the id, keeps its context open); events were
        // acked as they were read.
        if unsafe { cm::rdma_destroy_id(self.ptr.as_ptr()) } != 0 {
            // The id is leaked, alive, on its channel: the channel stays too.
            core::mem::forget(self.channel.clone());
            crate::raw::leak::count_leak();
        }
    }
}

fn sockaddr(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { core::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_in fits in sockaddr_storage, which is suitably aligned.
            unsafe { core::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
            core::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above.
            unsafe { core::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
            core::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}
