//! Connection management with librdmacm (cargo feature `rdmacm`): the
//! connection manager resolves the address, route, GID, LID and MTU by
//! itself and walks the queue pair to RTS (primer 7.1).
//!
//! [`connect`] and [`CmListener::accept`] are event-driven (ADDR_RESOLVED,
//! ROUTE_RESOLVED, CONNECT_REQUEST, ESTABLISHED; errors name the event that
//! arrived instead: ADDR_ERROR, ROUTE_ERROR, UNREACHABLE, REJECTED, ...),
//! each step bounded by the caller's deadline. Both carry private data, for
//! instance memory descriptors ([`encode_regions`]). The result is an
//! ordinary [`QueuePair`], usable with every verb of the safe layer.
#![allow(unsafe_code)]

use alloc::sync::Arc;
use alloc::vec::Vec;
use core::ptr::NonNull;
use std::net::SocketAddr;

use crate::device::Context;
use crate::endpoint::RemoteRegion;
use crate::error::{Error, ErrorKind};
use crate::memory::LocalBuf;
use crate::pd::ProtectionDomain;
use crate::qp::{QpConfig, QpState, QueuePair};
use crate::ret::{check_ptr, check_rc, errno};
use crate::sys::rdmacm::{self as cm, rdma_cm_event_type as Ev};
use crate::time::Deadline;

pub use crate::sys::rdmacm::rdma_cm_event_type as CmEventType;

/// Most private data a connect request carries (RC, RDMA_PS_TCP).
pub const MAX_CONNECT_PRIVATE_DATA: usize = 56;
/// Most private data an accept carries.
pub const MAX_ACCEPT_PRIVATE_DATA: usize = 196;

struct Channel {
    ptr: NonNull<cm::rdma_event_channel>,
}

// SAFETY: an event channel is a file descriptor; librdmacm is thread-safe.
unsafe impl Send for Channel {}
// SAFETY: as above.
unsafe impl Sync for Channel {}

impl Channel {
    fn new() -> Result<Arc<Channel>, Error> {
        // SAFETY: no preconditions.
        let ptr = check_ptr("rdma_create_event_channel", unsafe {
            cm::rdma_create_event_channel()
        })?;
        let ch = Channel { ptr };
        // SAFETY: `fd` is the channel's open descriptor; only its flags change.
        let ok = unsafe {
            let fd = ch.ptr.as_ref().fd;
            let flags = libc::fcntl(fd, libc::F_GETFL);
            flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) == 0
        };
        if !ok {
            return Err(Error::os(
                "fcntl(O_NONBLOCK) on the rdma_cm channel",
                errno(),
            ));
        }
        Ok(Arc::new(ch))
    }

    /// The next event, copied out and acknowledged, or `TimedOut`.
    fn next(&self, step: &'static str, deadline: Deadline) -> Result<Event, Error> {
        loop {
            let mut raw = core::ptr::null_mut();
            // SAFETY: live channel (non-blocking); valid out-pointer.
            if unsafe { cm::rdma_get_cm_event(self.ptr.as_ptr(), &mut raw) } == 0 {
                // SAFETY: the library returned a live event, valid until acked.
                let ev = unsafe { &*raw };
                let private = if matches!(
                    ev.event,
                    Ev::CONNECT_REQUEST | Ev::ESTABLISHED | Ev::REJECTED
                ) {
                    // SAFETY: for these events `param.conn` is the active
                    // member; its private data is valid until the ack below.
                    let conn = unsafe { ev.param.conn };
                    if conn.private_data.is_null() {
                        Vec::new()
                    } else {
                        // SAFETY: as above, `private_data_len` bytes.
                        unsafe {
                            core::slice::from_raw_parts(
                                conn.private_data.cast::<u8>(),
                                usize::from(conn.private_data_len),
                            )
                        }
                        .to_vec()
                    }
                } else {
                    Vec::new()
                };
                let event = Event {
                    kind: ev.event,
                    status: ev.status,
                    id: ev.id,
                    private,
                };
                // SAFETY: acked exactly once, after the copy.
                unsafe { cm::rdma_ack_cm_event(raw) };
                return Ok(event);
            }
            let e = errno();
            if e != libc::EAGAIN && e != libc::EWOULDBLOCK {
                return Err(Error::os("rdma_get_cm_event", e));
            }
            if deadline.passed() {
                return Err(Error::new(step, ErrorKind::TimedOut));
            }
            // SAFETY: live channel.
            let fd = unsafe { self.ptr.as_ref().fd };
            let ms = deadline.remaining().as_millis().clamp(1, 1000) as i32;
            crate::ret::wait_readable("poll(rdma_cm channel)", fd, ms)?;
        }
    }

    /// The next event, which must be `want`; any other names itself in the error.
    fn expect(&self, want: Ev, step: &'static str, deadline: Deadline) -> Result<Event, Error> {
        let ev = self.next(step, deadline)?;
        if ev.kind == want && ev.status == 0 {
            return Ok(ev);
        }
        let hint = match ev.kind {
            Ev::REJECTED => "the peer refused: is anyone listening on that port, and did it accept?",
            Ev::UNREACHABLE | Ev::CONNECT_ERROR => "no answer from the peer: address, routing, or the peer's device",
            Ev::ADDR_ERROR => "the address does not resolve to an RDMA device: is an rxe/RoCE device on that netdev?",
            Ev::ROUTE_ERROR => "no route to the peer on the RDMA device",
            _ => "",
        };
        Err(Error::new(
            step,
            ErrorKind::CmEvent {
                event: ev.kind.name().unwrap_or("UNKNOWN"),
                status: ev.status,
            },
        )
        .with_hint(hint))
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        // SAFETY: every id on the channel holds an Arc to it, so none is alive.
        unsafe { cm::rdma_destroy_event_channel(self.ptr.as_ptr()) };
    }
}

struct Event {
    kind: Ev,
    status: i32,
    id: *mut cm::rdma_cm_id,
    private: Vec<u8>,
}

/// An `rdma_cm_id` and the channel its events arrive on.
struct CmId {
    ptr: NonNull<cm::rdma_cm_id>,
    channel: Arc<Channel>,
}

// SAFETY: librdmacm ids may be used from any thread; the pointer is only
// passed to librdmacm.
unsafe impl Send for CmId {}
// SAFETY: as above.
unsafe impl Sync for CmId {}

impl CmId {
    fn new(channel: &Arc<Channel>) -> Result<CmId, Error> {
        let mut id = core::ptr::null_mut();
        // SAFETY: live channel; valid out-pointer.
        check_rc("rdma_create_id", unsafe {
            cm::rdma_create_id(
                channel.ptr.as_ptr(),
                &mut id,
                core::ptr::null_mut(),
                cm::rdma_port_space::PS_TCP,
            )
        })?;
        let ptr = NonNull::new(id).ok_or(Error::os("rdma_create_id", libc::EINVAL))?;
        Ok(CmId {
            ptr,
            channel: channel.clone(),
        })
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: the QP on this id and everything on its context were
        // dropped first (they hold the context, which holds this); events
        // were acked as they were read.
        unsafe { cm::rdma_destroy_id(self.ptr.as_ptr()) };
    }
}

/// A connected RC queue pair set up by the connection manager.
pub struct CmConnection<B: LocalBuf> {
    // Field order is drop order: the QP, then the PD, then the id.
    qp: QueuePair<B>,
    pd: ProtectionDomain,
    id: Arc<CmId>,
    peer_private_data: Vec<u8>,
    connected: bool,
}

impl<B: LocalBuf> CmConnection<B> {
    /// The queue pair (in RTS), for every verb of the safe layer.
    pub fn qp(&mut self) -> &mut QueuePair<B> {
        &mut self.qp
    }

    /// The protection domain: register the connection's memory here.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// The device context the connection manager chose.
    pub fn context(&self) -> &Context {
        self.pd.context()
    }

    /// What the peer put in its connect request or accept.
    pub fn peer_private_data(&self) -> &[u8] {
        &self.peer_private_data
    }

    /// Disconnects (`rdma_disconnect`): the QP goes to the error state
    /// (in-flight requests flush) and the peer sees DISCONNECTED.
    pub fn disconnect(&mut self) -> Result<(), Error> {
        if !self.connected {
            return Ok(());
        }
        self.connected = false;
        // SAFETY: live id whose QP (id->qp) is still alive (self.qp).
        check_rc("rdma_disconnect", unsafe {
            cm::rdma_disconnect(self.id.ptr.as_ptr())
        })?;
        self.qp.set_state(QpState::ERR);
        Ok(())
    }

    /// Waits until the peer disconnects (the DISCONNECTED event).
    pub fn wait_disconnected(&mut self, deadline: Deadline) -> Result<(), Error> {
        self.id
            .channel
            .expect(Ev::DISCONNECTED, "rdma_cm: wait for DISCONNECTED", deadline)?;
        self.connected = false;
        self.qp.set_state(QpState::ERR);
        Ok(())
    }
}

/// The connection is its queue pair: `conn.post_send(..)`, `conn.poll(..)`.
impl<B: LocalBuf> core::ops::Deref for CmConnection<B> {
    type Target = QueuePair<B>;
    fn deref(&self) -> &QueuePair<B> {
        &self.qp
    }
}

impl<B: LocalBuf> core::ops::DerefMut for CmConnection<B> {
    fn deref_mut(&mut self) -> &mut QueuePair<B> {
        &mut self.qp
    }
}

impl<B: LocalBuf> Drop for CmConnection<B> {
    fn drop(&mut self) {
        // While the QP still exists: rdma_disconnect touches id->qp.
        let _ = self.disconnect();
    }
}

/// Builds the QP on an id whose device is known (route resolved, or a
/// connect request), with `rdma_create_qp` (which also moves it to INIT).
fn qp_on<B: LocalBuf>(
    id: &Arc<CmId>,
    pd: &ProtectionDomain,
    config: &QpConfig,
) -> Result<QueuePair<B>, Error> {
    // SAFETY: live id.
    let port = unsafe { cm::verbs_shim_cm_id_port(id.ptr.as_ptr()) };
    let config = QpConfig { port, ..*config };
    let id_ptr = id.ptr.as_ptr();
    let pd_raw = pd.as_raw();
    let qp = QueuePair::create_with(pd, &config, None, |init| {
        // SAFETY: live id and PD; `init` fully initialized with live CQs.
        check_rc("rdma_create_qp", unsafe {
            cm::rdma_create_qp(id_ptr, pd_raw, init)
        })?;
        // SAFETY: rdma_create_qp succeeded, so id->qp is the new QP.
        check_ptr("rdma_create_qp", unsafe { cm::verbs_shim_cm_id_qp(id_ptr) })
    })?;
    Ok(qp)
}

/// A protection domain on the device the connection manager chose for
/// `id`; the context it borrows keeps the id alive.
fn pd_on(id: &Arc<CmId>) -> Result<ProtectionDomain, Error> {
    // SAFETY: live id with a device (after ROUTE_RESOLVED / CONNECT_REQUEST).
    let verbs = unsafe { cm::verbs_shim_cm_id_verbs(id.ptr.as_ptr()) };
    let verbs =
        NonNull::new(verbs).ok_or(Error::new("rdma_cm: id has no device", ErrorKind::NotFound))?;
    ProtectionDomain::new(&Context::borrowed(verbs, id.clone()))
}

/// `pd` if the connection manager can put `id`'s queue pair in it: it
/// must be on the very context librdmacm opened for the id's device.
fn pd_for(id: &CmId, pd: &ProtectionDomain) -> Result<ProtectionDomain, Error> {
    // SAFETY: live id with a device (after ROUTE_RESOLVED / CONNECT_REQUEST).
    let verbs = unsafe { cm::verbs_shim_cm_id_verbs(id.ptr.as_ptr()) };
    if pd.context().as_raw() != verbs {
        return Err(Error::invalid(
            "rdma_create_qp",
            "the protection domain is not on the connection manager's context for this device",
        )
        .with_hint(
            "share the pd() of an earlier connection, request or resolved id on the same \
             device; a PD from Context::open is on another context",
        ));
    }
    Ok(pd.clone())
}

/// Which end of the connection: the active one connects, the passive
/// one accepts.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Active,
    Passive,
}

/// What connect and accept share: the QP in `pd`, `rdma_connect` or
/// `rdma_accept` with `private_data`, then ESTABLISHED and RTS. The
/// connection's peer private data is the ESTABLISHED event's.
fn establish<B: LocalBuf>(
    id: Arc<CmId>,
    pd: &ProtectionDomain,
    config: &QpConfig,
    private_data: &[u8],
    side: Side,
    deadline: Deadline,
) -> Result<CmConnection<B>, Error> {
    let (call, max, what) = match side {
        Side::Active => ("rdma_connect", MAX_CONNECT_PRIVATE_DATA, "rdma_cm: connect"),
        Side::Passive => ("rdma_accept", MAX_ACCEPT_PRIVATE_DATA, "rdma_cm: accept"),
    };
    if private_data.len() > max {
        return Err(Error::invalid(call, "private data too long").with_detail(
            "at most 56 bytes in a connect request, 196 in an accept (RC, RDMA_PS_TCP)",
        ));
    }
    let pd = pd_for(&id, pd)?;
    let mut qp = qp_on::<B>(&id, &pd, config)?;
    let dev = pd.context().query_device()?;
    // Both the reads this end may have outstanding and those it serves.
    let rd = dev.max_qp_rd_atom().min(dev.max_qp_init_rd_atom());
    let mut param = conn_param(private_data, rd.clamp(1, 16));
    // SAFETY: live id with a QP; `param` and its private data outlive the call.
    let rc = unsafe {
        match side {
            Side::Active => cm::rdma_connect(id.ptr.as_ptr(), &mut param),
            Side::Passive => cm::rdma_accept(id.ptr.as_ptr(), &mut param),
        }
    };
    check_rc(call, rc)?;
    let ev = id.channel.expect(Ev::ESTABLISHED, what, deadline)?;
    qp.set_state(QpState::RTS);
    Ok(CmConnection {
        qp,
        pd,
        id,
        peer_private_data: ev.private,
        connected: true,
    })
}

fn conn_param(private: &[u8], rd_atomic: u8) -> cm::rdma_conn_param {
    cm::rdma_conn_param {
        private_data: if private.is_empty() {
            core::ptr::null()
        } else {
            private.as_ptr().cast()
        },
        private_data_len: private.len() as u8,
        responder_resources: rd_atomic,
        initiator_depth: rd_atomic,
        flow_control: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        srq: 0,
        qp_num: 0,
    }
}

/// The step timeout librdmacm takes in milliseconds, bounded by the deadline.
fn step_ms(deadline: Deadline) -> i32 {
    deadline.remaining().as_millis().clamp(1, 5000) as i32
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

/// Connects to a listener at `addr`: [`resolve`], then
/// [`CmResolved::connect`], all bounded by `deadline`.
pub fn connect<B: LocalBuf>(
    addr: SocketAddr,
    config: &QpConfig,
    private_data: &[u8],
    deadline: Deadline,
) -> Result<CmConnection<B>, Error> {
    resolve(addr, deadline)?.connect(config, private_data, deadline)
}

/// Resolves the address and the route to `addr` (ADDR_RESOLVED,
/// ROUTE_RESOLVED). The result's protection domain is on the device the
/// route uses: register memory there before connecting, to send its
/// descriptors as private data.
pub fn resolve(addr: SocketAddr, deadline: Deadline) -> Result<CmResolved, Error> {
    let channel = Channel::new()?;
    let id = Arc::new(CmId::new(&channel)?);
    let (mut dst, _) = sockaddr(&addr);
    // SAFETY: live id; `dst` is a valid sockaddr for the call.
    check_rc("rdma_resolve_addr", unsafe {
        cm::rdma_resolve_addr(
            id.ptr.as_ptr(),
            core::ptr::null_mut(),
            (&mut dst as *mut libc::sockaddr_storage).cast(),
            step_ms(deadline),
        )
    })?;
    channel.expect(Ev::ADDR_RESOLVED, "rdma_cm: resolve address", deadline)?;
    // SAFETY: live id with a resolved address.
    check_rc("rdma_resolve_route", unsafe {
        cm::rdma_resolve_route(id.ptr.as_ptr(), step_ms(deadline))
    })?;
    channel.expect(Ev::ROUTE_RESOLVED, "rdma_cm: resolve route", deadline)?;
    let pd = pd_on(&id)?;
    Ok(CmResolved { id, pd })
}

/// A client id whose route is resolved, ready to connect.
pub struct CmResolved {
    id: Arc<CmId>,
    pd: ProtectionDomain,
}

impl CmResolved {
    /// The protection domain the connection will use.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// Creates the QP and connects, sending `private_data` (at most
    /// [`MAX_CONNECT_PRIVATE_DATA`] bytes); waits for ESTABLISHED.
    pub fn connect<B: LocalBuf>(
        self,
        config: &QpConfig,
        private_data: &[u8],
        deadline: Deadline,
    ) -> Result<CmConnection<B>, Error> {
        let pd = self.pd.clone();
        self.connect_in(&pd, config, private_data, deadline)
    }

    /// [`CmResolved::connect`] with the QP in `pd`, the `pd()` of an
    /// earlier connection on the same device: many connections, one PD, so
    /// memory registered once serves them all.
    pub fn connect_in<B: LocalBuf>(
        self,
        pd: &ProtectionDomain,
        config: &QpConfig,
        private_data: &[u8],
        deadline: Deadline,
    ) -> Result<CmConnection<B>, Error> {
        establish(self.id, pd, config, private_data, Side::Active, deadline)
    }
}

/// A listening connection-manager id.
pub struct CmListener {
    id: CmId,
}

impl CmListener {
    /// Binds to `addr` (an address of an RDMA device's netdev, or the
    /// unspecified address) and listens.
    pub fn bind(addr: SocketAddr) -> Result<CmListener, Error> {
        let channel = Channel::new()?;
        let id = CmId::new(&channel)?;
        let (mut ss, _) = sockaddr(&addr);
        // SAFETY: live id; `ss` is a valid sockaddr for the call.
        check_rc("rdma_bind_addr", unsafe {
            cm::rdma_bind_addr(
                id.ptr.as_ptr(),
                (&mut ss as *mut libc::sockaddr_storage).cast(),
            )
        })?;
        // SAFETY: live, bound id.
        check_rc("rdma_listen", unsafe {
            cm::rdma_listen(id.ptr.as_ptr(), 16)
        })?;
        Ok(CmListener { id })
    }

    /// Waits for a connect request, accepts it with `private_data` (at
    /// most [`MAX_ACCEPT_PRIVATE_DATA`] bytes) and waits until established:
    /// [`CmListener::request`], then [`CmRequest::accept`].
    pub fn accept<B: LocalBuf>(
        &self,
        config: &QpConfig,
        private_data: &[u8],
        deadline: Deadline,
    ) -> Result<CmConnection<B>, Error> {
        self.request(deadline)?
            .accept(config, private_data, deadline)
    }

    /// Waits for a connect request (CONNECT_REQUEST). The request's
    /// protection domain is on the device it arrived on: register memory
    /// there before accepting, to send its descriptors as private data.
    pub fn request(&self, deadline: Deadline) -> Result<CmRequest, Error> {
        let req = self.id.channel.expect(
            Ev::CONNECT_REQUEST,
            "rdma_cm: wait for a connect request",
            deadline,
        )?;
        let child =
            NonNull::new(req.id).ok_or(Error::os("rdma_cm: connect request", libc::EINVAL))?;
        // Its own channel, so its later events (DISCONNECTED) reach the connection.
        let channel = match Channel::new() {
            Ok(c) => c,
            Err(e) => {
                reject_and_destroy(child);
                return Err(e);
            }
        };
        // SAFETY: live child id whose events are all acked; live channel.
        if let Err(e) = check_rc("rdma_migrate_id", unsafe {
            cm::rdma_migrate_id(child.as_ptr(), channel.ptr.as_ptr())
        }) {
            reject_and_destroy(child);
            return Err(e);
        }
        let id = Arc::new(CmId {
            ptr: child,
            channel,
        });
        let pd = pd_on(&id)?;
        Ok(CmRequest {
            id,
            pd,
            peer_private_data: req.private,
        })
    }
}

fn reject_and_destroy(child: NonNull<cm::rdma_cm_id>) {
    // SAFETY: a child id from a connect request, ours to refuse and destroy once.
    unsafe {
        cm::rdma_reject(child.as_ptr(), core::ptr::null(), 0);
        cm::rdma_destroy_id(child.as_ptr());
    }
}

/// A connect request, not yet accepted (dropping it rejects it).
pub struct CmRequest {
    id: Arc<CmId>,
    pd: ProtectionDomain,
    peer_private_data: Vec<u8>,
}

impl CmRequest {
    /// The protection domain the connection will use.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// What the peer put in its connect request.
    pub fn peer_private_data(&self) -> &[u8] {
        &self.peer_private_data
    }

    /// Creates the QP, accepts with `private_data` (at most
    /// [`MAX_ACCEPT_PRIVATE_DATA`] bytes) and waits for ESTABLISHED.
    pub fn accept<B: LocalBuf>(
        self,
        config: &QpConfig,
        private_data: &[u8],
        deadline: Deadline,
    ) -> Result<CmConnection<B>, Error> {
        let pd = self.pd.clone();
        self.accept_in(&pd, config, private_data, deadline)
    }

    /// [`CmRequest::accept`] with the QP in `pd`, the `pd()` of an earlier
    /// connection or request on the same device (see
    /// [`CmResolved::connect_in`]).
    pub fn accept_in<B: LocalBuf>(
        self,
        pd: &ProtectionDomain,
        config: &QpConfig,
        private_data: &[u8],
        deadline: Deadline,
    ) -> Result<CmConnection<B>, Error> {
        let mut conn = establish(self.id, pd, config, private_data, Side::Passive, deadline)?;
        conn.peer_private_data = self.peer_private_data;
        Ok(conn)
    }

    /// Refuses the request (the peer sees REJECTED).
    pub fn reject(self) -> Result<(), Error> {
        // SAFETY: live, unaccepted id.
        check_rc("rdma_reject", unsafe {
            cm::rdma_reject(self.id.ptr.as_ptr(), core::ptr::null(), 0)
        })
    }
}

/// Encodes up to 2 (connect) or 9 (accept) memory descriptors as private
/// data: a count byte, then per region addr (8), len (8), rkey (4), big-endian.
pub fn encode_regions(regions: &[RemoteRegion]) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + 20 * regions.len());
    out.push(regions.len() as u8);
    for r in regions {
        out.extend_from_slice(&r.addr.to_be_bytes());
        out.extend_from_slice(&r.len.to_be_bytes());
        out.extend_from_slice(&r.rkey.to_be_bytes());
    }
    out
}

/// Decodes [`encode_regions`]; trailing bytes (the transport pads private
/// data) are ignored, a short or overflowing record is an error.
pub fn decode_regions(data: &[u8]) -> Result<Vec<RemoteRegion>, Error> {
    let bad = || Error::invalid("decode private data", "not a region list");
    let (&count, rest) = data.split_first().ok_or_else(bad)?;
    let count = usize::from(count);
    if rest.len() < count * 20 {
        return Err(bad());
    }
    let regions: Vec<RemoteRegion> = rest
        .chunks_exact(20)
        .take(count)
        .map(|c| RemoteRegion {
            addr: u64::from_be_bytes(c[0..8].try_into().unwrap_or_default()),
            len: u64::from_be_bytes(c[8..16].try_into().unwrap_or_default()),
            rkey: u32::from_be_bytes(c[16..20].try_into().unwrap_or_default()),
        })
        .collect();
    if regions.iter().any(|r| r.end().is_none()) {
        return Err(bad());
    }
    Ok(regions)
}
