//! Reliable-connected queue pairs: creation, addressing decided from the
//! port, the RESET -> INIT -> RTR -> RTS walk, and (in `post`) the safe
//! data path.
#![allow(unsafe_code)]

mod completion_ref;
mod connect;
mod inflight;
mod post;
mod prepared;

use core::ptr::NonNull;

pub use completion_ref::CompletionRef;
pub use connect::{ConnectOptions, PathInfo};
pub(crate) use inflight::Bufs;
pub use inflight::Completion;
pub use post::{PostError, MAX_CHAIN};
pub use prepared::Prepared;

use crate::cq::CompletionQueue;
use crate::device::{choose_gid, validate_gid_index, GidEntry, LinkLayer, PortAttr};
use crate::endpoint::{Endpoint, Mtu};
use crate::error::{Error, ErrorKind};
use crate::memory::LocalBuf;
use crate::mr::Access;
use crate::pd::{destroy, ProtectionDomain};
use crate::ret::{check_ptr, check_rc};
use crate::srq::SharedReceiveQueue;
use crate::sys::{self, Zeroed};
use inflight::InFlight;

pub use crate::sys::ibv_qp_state as QpState;

/// The vendor id of Linux Soft-RoCE (rxe), whose responder checks a memory
/// window's accesses against the underlying region's range, not the
/// window's (drivers/infiniband/sw/rxe/rxe_resp.c, check_rkey): a window
/// there grants the whole region.
pub(crate) const SOFT_ROCE_VENDOR_ID: u32 = 0x00FF_FFFF;

/// Sizes and policies of a queue pair; the defaults suit most RC users.
#[derive(Clone, Copy, Debug)]
pub struct QpConfig {
    /// Port number (from 1).
    pub port: u8,
    /// GID index; `None` chooses automatically (RoCE v2, IPv4-mapped,
    /// routable first). An explicit index always wins and is validated.
    pub gid_index: Option<u32>,
    /// Send queue depth asked for.
    pub max_send_wr: u32,
    /// Receive queue depth asked for.
    pub max_recv_wr: u32,
    /// Scatter/gather entries per request (at most [`crate::wr::MAX_SGE`] in the safe API).
    pub max_sge: u32,
    /// Inline data asked for (the device may grant more or refuse).
    pub max_inline_data: u32,
    /// What the peer may do through this QP: `REMOTE_WRITE`, `REMOTE_READ`,
    /// `REMOTE_ATOMIC`. Least privilege: nothing unless asked for.
    pub remote_access: Access,
    /// Upper bound on the path MTU (the port's active MTU and the peer's
    /// also bound it).
    pub max_mtu: Mtu,
    /// Give the QP's completion queue an event channel, so a thread can
    /// sleep until a completion arrives ([`QueuePair::wait_event`]).
    pub events: bool,
    /// Receive completions on a completion queue of their own, as
    /// perftest's send tests set up: [`QueuePair::poll_send_ref`] and
    /// [`QueuePair::poll_recv_ref`] then each poll one queue's completions,
    /// and a wait for one kind never takes the other off its queue.
    /// [`QueuePair::poll_ref`] polls both. Not with `events`.
    pub separate_recv_cq: bool,
}

impl Default for QpConfig {
    fn default() -> Self {
        QpConfig {
            port: 1,
            gid_index: None,
            max_send_wr: 128,
            max_recv_wr: 128,
            max_sge: crate::wr::MAX_SGE as u32,
            max_inline_data: 64,
            remote_access: Access::EMPTY,
            max_mtu: Mtu::MTU_4096,
            events: false,
            separate_recv_cq: false,
        }
    }
}

/// A reliable-connected queue pair with its own completion queue, owning
/// the buffers of every request in flight (type `B`) until they complete.
///
/// Created in INIT; [`QueuePair::connect`] takes it to RTS. Posting and
/// polling take `&mut self`: one owner, no lock on the data path.
pub struct QueuePair<B: LocalBuf> {
    qp: NonNull<sys::ibv_qp>,
    cq: CompletionQueue,
    /// The receive queue's own CQ (`QpConfig::separate_recv_cq`), else
    /// `cq` takes both queues' completions.
    recv_cq: Option<CompletionQueue>,
    pd: ProtectionDomain,
    port: PortAttr,
    port_num: u8,
    gid: Option<GidEntry>,
    psn: u32,
    state: QpState,
    caps: sys::ibv_qp_cap,
    max_rd_atomic: u8,
    max_dest_rd_atomic: u8,
    /// False where memory windows are known not to enforce their bounds.
    windows_bounded: bool,
    send: InFlight<B>,
    recv: InFlight<B>,
    unsignaled_run: u64,
    has_srq: bool,
    /// What the current state lets the data path have in flight: the
    /// queue's capacity, or 0 where the state (or a shared receive queue)
    /// refuses posts. One comparison per post checks state and room.
    send_room: u64,
    recv_room: u64,
    /// Requests kept for posting again (`prepared`), with their buffers.
    prepared: prepared::PreparedTable<B>,
}

// SAFETY: the QP owns its in-flight buffers (B: Send) and its verbs handle,
// which any thread may use; `&mut self` serializes the data path.
unsafe impl<B: LocalBuf> Send for QueuePair<B> {}

impl<B: LocalBuf> QueuePair<B> {
    /// Creates an RC queue pair (and its completion queue) on `pd` and moves
    /// it to INIT, with the GID and addressing chosen from the port.
    pub fn new(pd: &ProtectionDomain, config: &QpConfig) -> Result<QueuePair<B>, Error> {
        Self::create(pd, config, None)
    }

    /// As [`QueuePair::new`], receiving through a shared receive queue: its
    /// receive completions come back from [`QueuePair::poll`] without
    /// buffers; pass them to [`SharedReceiveQueue::complete`]. Drop every
    /// queue pair of an SRQ before the SRQ.
    pub fn with_srq(
        pd: &ProtectionDomain,
        config: &QpConfig,
        srq: &SharedReceiveQueue<B>,
    ) -> Result<QueuePair<B>, Error> {
        Self::create(pd, config, Some(srq.as_raw()))
    }

    fn create(
        pd: &ProtectionDomain,
        config: &QpConfig,
        srq: Option<*mut sys::ibv_srq>,
    ) -> Result<QueuePair<B>, Error> {
        let pd_raw = pd.as_raw();
        let make = |init: &mut sys::ibv_qp_init_attr| {
            // SAFETY: live PD; `init` is fully initialized and names a live CQ.
            check_ptr("ibv_create_qp", unsafe { sys::ibv_create_qp(pd_raw, init) })
        };
        let mut this = Self::create_with(pd, config, srq, make)?;
        this.enter_init(config)?;
        Ok(this)
    }

    /// Builds the QP around `make`, which creates it from the init
    /// attributes (and writes back the granted caps): `ibv_create_qp`, or
    /// `rdma_create_qp` for a connection-manager id (which also moves it to INIT).
    pub(crate) fn create_with(
        pd: &ProtectionDomain,
        config: &QpConfig,
        srq: Option<*mut sys::ibv_srq>,
        make: impl FnOnce(&mut sys::ibv_qp_init_attr) -> Result<NonNull<sys::ibv_qp>, Error>,
    ) -> Result<QueuePair<B>, Error> {
        let ctx = pd.context();
        let dev = ctx.query_device()?;
        let port = ctx.query_port(config.port)?;
        let gid = select_gid(ctx, config, &port)?;

        let limit = dev.max_qp_wr();
        if config.max_send_wr > limit || config.max_recv_wr > limit {
            return Err(Error::invalid(
                "ibv_create_qp",
                "queue depth above the device's max_qp_wr",
            )
            .with_hint("`ibv_devinfo -v` shows max_qp_wr"));
        }
        let (cq, recv_cq) = if config.separate_recv_cq {
            if config.events {
                return Err(Error::invalid(
                    "QpConfig",
                    "events with a separate receive CQ (wait_event sleeps on one CQ)",
                ));
            }
            let recv_cq = CompletionQueue::new(ctx, config.max_recv_wr.max(1))?;
            (
                CompletionQueue::new(ctx, config.max_send_wr.max(1))?,
                Some(recv_cq),
            )
        } else {
            let depth = config.max_send_wr + config.max_recv_wr;
            let cq = if config.events {
                let channel = crate::cq::CompletionChannel::new(ctx)?;
                CompletionQueue::with_channel(ctx, depth, &channel)?
            } else {
                CompletionQueue::new(ctx, depth)?
            };
            (cq, None)
        };
        let mut init = sys::ibv_qp_init_attr::zeroed();
        init.send_cq = cq.as_raw();
        init.recv_cq = recv_cq.as_ref().unwrap_or(&cq).as_raw();
        init.srq = srq.unwrap_or(core::ptr::null_mut());
        init.qp_type = sys::ibv_qp_type::RC;
        init.cap = sys::ibv_qp_cap {
            max_send_wr: config.max_send_wr.max(1),
            max_recv_wr: config.max_recv_wr.max(1),
            max_send_sge: config.max_sge.max(1),
            max_recv_sge: config.max_sge.max(1),
            max_inline_data: config.max_inline_data,
        };
        let qp = make(&mut init)?;
        // ibv_create_qp wrote back what the device granted; size the tables to it.
        let caps = init.cap;
        // SAFETY: `make` returned a live QP; qp_num never changes.
        let qp_num = unsafe { qp.as_ref().qp_num };
        let this = QueuePair {
            qp,
            cq,
            recv_cq,
            pd: pd.clone(),
            port,
            port_num: config.port,
            gid,
            psn: crate::time::random_u32() & crate::endpoint::MAX_PSN,
            state: QpState::RESET,
            caps,
            // Initiator depth is bounded by the device's init limit, responder
            // resources by its per-QP limit (as perftest, the device's maximum).
            max_rd_atomic: dev.max_qp_init_rd_atom().max(1),
            max_dest_rd_atomic: dev.max_qp_rd_atom().max(1),
            windows_bounded: dev.0.vendor_id != SOFT_ROCE_VENDOR_ID,
            send: InFlight::new(caps.max_send_wr),
            recv: InFlight::new(caps.max_recv_wr),
            unsignaled_run: 0,
            has_srq: srq.is_some(),
            send_room: 0,
            recv_room: 0,
            prepared: prepared::PreparedTable::new(qp_num),
        };
        Ok(this)
    }

    fn enter_init(&mut self, config: &QpConfig) -> Result<(), Error> {
        let mut attr = sys::ibv_qp_attr::zeroed();
        attr.qp_state = QpState::INIT;
        attr.pkey_index = 0;
        attr.port_num = config.port;
        attr.qp_access_flags = config.remote_access;
        use sys::ibv_qp_attr_mask as M;
        self.modify(
            "ibv_modify_qp(RESET->INIT)",
            &mut attr,
            M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
        )?;
        self.set_state(QpState::INIT);
        Ok(())
    }

    /// Records the state the QP is now in (moved by this handle, or by the
    /// connection manager), and what that state lets the data path post.
    pub(crate) fn set_state(&mut self, state: QpState) {
        self.state = state;
        self.send_room = if state == QpState::RTS {
            self.send.capacity()
        } else {
            0
        };
        let receives = state != QpState::RESET && state != QpState::ERR && !self.has_srq;
        self.recv_room = if receives { self.recv.capacity() } else { 0 };
    }

    pub(crate) fn modify(
        &mut self,
        call: &'static str,
        attr: &mut sys::ibv_qp_attr,
        mask: sys::ibv_qp_attr_mask,
    ) -> Result<(), Error> {
        // SAFETY: live QP; `attr` is initialized for every bit of `mask`.
        check_rc(call, unsafe {
            sys::ibv_modify_qp(self.qp.as_ptr(), attr, mask.0 as i32)
        })
    }

    /// This side's endpoint, to send to the peer: QPN, PSN, LID, GID, the
    /// MTU this side can do, and no memory (add the regions you choose to
    /// share to `regions`).
    pub fn endpoint(&self) -> Endpoint {
        Endpoint {
            qpn: self.qp_num(),
            psn: self.psn,
            lid: self.port.lid(),
            gid: self.gid.map(|g| g.gid).unwrap_or_default(),
            mtu: Mtu(self.port.active_mtu().0),
            regions: alloc::vec::Vec::new(),
        }
    }

    /// Sets the first send PSN (random by default) before connecting: for
    /// peers that assume one, like the primer's C programs (PSN 0).
    pub fn set_psn(&mut self, psn: u32) -> Result<(), Error> {
        if self.state != QpState::INIT || psn > crate::endpoint::MAX_PSN {
            return Err(Error::invalid(
                "set_psn",
                "a 24-bit PSN, set in INIT before connect",
            ));
        }
        self.psn = psn;
        Ok(())
    }

    /// False on devices whose memory windows do not enforce their own
    /// bounds (Soft-RoCE): [`QueuePair::expose`] then registers the buffer instead.
    pub fn windows_enforce_bounds(&self) -> bool {
        self.windows_bounded
    }

    /// The queue pair number.
    pub fn qp_num(&self) -> u32 {
        // SAFETY: live QP; qp_num is set at creation and never changes.
        unsafe { self.qp.as_ref().qp_num }
    }

    /// The state this handle last moved the QP to.
    pub fn state(&self) -> QpState {
        self.state
    }

    /// The state the device reports (`ibv_query_qp`), e.g. ERR after a failure.
    pub fn query_state(&self) -> Result<QpState, Error> {
        Ok(self.query(sys::ibv_qp_attr_mask::STATE)?.qp_state)
    }

    /// The path MTU the device reports: what the connection settled on,
    /// whoever connected the QP (this crate or rdma_cm).
    pub fn query_path_mtu(&self) -> Result<Mtu, Error> {
        Ok(Mtu(self.query(sys::ibv_qp_attr_mask::PATH_MTU)?.path_mtu.0))
    }

    fn query(&self, mask: sys::ibv_qp_attr_mask) -> Result<sys::ibv_qp_attr, Error> {
        let mut attr = sys::ibv_qp_attr::zeroed();
        let mut init = sys::ibv_qp_init_attr::zeroed();
        // SAFETY: live QP; valid out-pointers.
        check_rc("ibv_query_qp", unsafe {
            sys::ibv_query_qp(self.qp.as_ptr(), &mut attr, mask.0 as i32, &mut init)
        })?;
        Ok(attr)
    }

    /// What the device granted: queue depths, SGEs, inline size.
    pub fn caps(&self) -> sys::ibv_qp_cap {
        self.caps
    }

    /// The GID entry this QP uses (None on InfiniBand without GIDs).
    pub fn gid(&self) -> Option<GidEntry> {
        self.gid
    }

    /// The port attributes read at creation.
    pub fn port(&self) -> &PortAttr {
        &self.port
    }

    /// The completion queue (shared only with this QP): of both queues,
    /// or of the send queue with `QpConfig::separate_recv_cq`.
    pub fn cq(&self) -> &CompletionQueue {
        &self.cq
    }

    /// The protection domain.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// Requests in flight on the send and receive queues.
    pub fn in_flight(&self) -> (u64, u64) {
        (
            self.send.len(),
            self.recv.len() + self.prepared.recvs_in_flight(),
        )
    }

    /// The raw QP, for calls the safe layer does not wrap.
    pub fn as_raw(&self) -> *mut sys::ibv_qp {
        self.qp.as_ptr()
    }
}

fn select_gid(
    ctx: &crate::device::Context,
    config: &QpConfig,
    port: &PortAttr,
) -> Result<Option<GidEntry>, Error> {
    let table = ctx.gid_table(config.port)?;
    match config.gid_index {
        Some(i) => validate_gid_index(&table, i, port.gid_tbl_len()).map(Some),
        None => match choose_gid(&table) {
            Some(e) => Ok(Some(*e)),
            None if port.link_layer() == LinkLayer::INFINIBAND => Ok(None),
            None => Err(Error::new("choose GID index", ErrorKind::NotFound)
                .with_detail("the port's GID table has no usable entry (RoCE needs one)")
                .with_hint(
                    "give the network device an IP address; `show_gids`/`rdma link` show the table",
                )),
        },
    }
}

impl<B: LocalBuf> Drop for QueuePair<B> {
    fn drop(&mut self) {
        // Destroy first: after ibv_destroy_qp returns the device no longer
        // touches this QP's buffers, so dropping the in-flight table (the
        // fields, after this body) frees them safely.
        // SAFETY: live QP, destroyed once; the CQ and PD outlive it (fields).
        destroy("ibv_destroy_qp", unsafe {
            sys::ibv_destroy_qp(self.qp.as_ptr())
        });
    }
}

impl<B: LocalBuf> core::fmt::Debug for QueuePair<B> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("QueuePair")
            .field("qp_num", &self.qp_num())
            .field("state", &self.state)
            .field("in_flight", &self.in_flight())
            .finish()
    }
}
