//! Building an engine on a device: its completion queue(s), its shared
//! receive queue, and queue pairs created in INIT with the addressing
//! chosen from the port; and the device-side wait that sleeps on a
//! completion channel.

use alloc::sync::Arc;

use crate::device::{choose_gid, validate_gid_index, Context, GidEntry, LinkLayer, PortAttr};
use crate::error::{site, Error, ErrorKind};
use crate::memory::NicBuf;
use crate::pd::ProtectionDomain;
use crate::raw::{RawChannel, RawCq, RawSrq};
use crate::sgl::MAX_SGE;
use crate::sys::{self, ibv_qp_attr_mask as M, Zeroed};
use crate::time::Deadline;

use super::addressing::Addressing;
use super::completion::CompletionRef;
use super::config::{EngineConfig, QpConfig, Transport};
use super::core::Engine;
use super::doorbell::Verbs;
use super::poll::DEAD_PEER;
use super::qp_slot::{QpId, QpInfo, QpState};
use super::srq::SrqSlots;

/// Creates a queue pair from its parts (the connection manager's way).
pub(crate) type MakeQp<'a> =
    dyn FnMut(&crate::raw::QpParts<'_>) -> Result<(crate::raw::RawQp, sys::ibv_qp_cap), Error> + 'a;

/// Completions an engine's CQ holds when the config does not say.
const DEFAULT_CQ_DEPTH: u32 = 4096;

impl<B: NicBuf> Engine<B, Verbs> {
    /// An engine on `pd`'s device: its completion queue(s) and, if asked
    /// for, its shared receive queue. Queue pairs come with [`Engine::add_qp`].
    pub fn new(pd: &ProtectionDomain, config: &EngineConfig) -> Result<Engine<B, Verbs>, Error> {
        let ctx = pd.context();
        let dev = ctx.query_device()?;
        let depth = config
            .cq_depth
            .unwrap_or(DEFAULT_CQ_DEPTH.min(dev.max_cqe().max(1)));
        if config.events && config.separate_recv_cq {
            return Err(Error::invalid(site!(
                "EngineConfig",
                "events with a separate receive CQ (a wait sleeps on one CQ)"
            )));
        }
        let channel = if config.events {
            Some(Arc::new(RawChannel::create(&ctx.raw)?))
        } else {
            None
        };
        let cq = Arc::new(RawCq::create(&ctx.raw, depth, channel)?);
        let cqe = cq.cqe().min(depth);
        let recv_cq = match config.separate_recv_cq {
            true => {
                let cq = Arc::new(RawCq::create(&ctx.raw, depth, None)?);
                let n = cq.cqe().min(depth);
                Some((cq, n))
            }
            false => None,
        };
        let srq = match config.srq {
            Some(s) => {
                let (raw, max_wr, max_sge) =
                    RawSrq::create(&pd.raw, s.max_wr, s.max_sge.clamp(1, MAX_SGE as u32))?;
                // Never more receives than asked for, whatever was granted.
                Some(SrqSlots::new(
                    Arc::new(raw),
                    max_wr.min(s.max_wr),
                    max_sge.min(MAX_SGE as u32),
                ))
            }
            None => None,
        };
        let verbs = Verbs {
            pd: pd.clone(),
            windows_bounded: ctx.windows_enforce_bounds()?,
        };
        let receives_land_on = recv_cq.as_ref().map_or(cqe, |(_, n)| *n);
        if srq
            .as_ref()
            .is_some_and(|s| s.capacity() as u64 >= u64::from(receives_land_on))
        {
            return Err(Error::new(
                site!(
                    "Engine::new",
                    "the shared receive queue would fill the completion queue its receives complete on",
                    "a larger cq_depth, or a smaller SrqConfig::max_wr"
                ),
                ErrorKind::QueueFull,
            ));
        }
        Ok(Engine::assemble(
            verbs,
            cq,
            cqe,
            recv_cq,
            srq,
            config.events,
        ))
    }

    /// The protection domain.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.prov.pd
    }

    /// The device context.
    pub fn context(&self) -> &Context {
        self.prov.pd.context()
    }

    /// Creates a queue pair on this engine's completion queue(s) (and
    /// shared receive queue) and moves it to INIT, with the GID and
    /// addressing chosen from the port. Its rings hold `max_send_wr` and
    /// `max_recv_wr` requests; refused when the completion queue could not
    /// hold all their completions.
    pub fn add_qp(&mut self, config: &QpConfig) -> Result<QpId, Error> {
        let (raw, caps, info) = self.create_raw(config, None)?;
        let qp_num = raw.qp_num();
        let id = self
            .place(
                raw,
                qp_num,
                config.max_send_wr.max(1),
                config.max_recv_wr.max(1),
                caps,
                info,
            )
            .map_err(|(e, _qp)| e)?;
        if let Err(e) = self.enter_init(id) {
            let _ = self.remove_qp(id);
            return Err(e);
        }
        Ok(id)
    }

    /// Places a queue pair that `make` creates (on a connection-manager id,
    /// which also moves it to INIT).
    #[cfg(feature = "rdmacm")]
    pub(crate) fn add_qp_made(
        &mut self,
        config: &QpConfig,
        make: &mut MakeQp<'_>,
    ) -> Result<QpId, Error> {
        let (raw, caps, info) = self.create_raw(config, Some(make))?;
        let qp_num = raw.qp_num();
        let id = self
            .place(
                raw,
                qp_num,
                config.max_send_wr.max(1),
                config.max_recv_wr.max(1),
                caps,
                info,
            )
            .map_err(|(e, _qp)| e)?;
        self.mark_state(id, QpState::INIT)?;
        Ok(id)
    }

    /// Creates the raw QP (with `ibv_create_qp`, or with `make` for a
    /// connection-manager id) and what connecting it needs.
    pub(crate) fn create_raw(
        &mut self,
        config: &QpConfig,
        make: Option<&mut MakeQp<'_>>,
    ) -> Result<(crate::raw::RawQp, sys::ibv_qp_cap, QpInfo), Error> {
        let at = match self.addressing {
            Some(a) if a.serves(config.port, config.gid_index) => a,
            _ => {
                let ctx = self.prov.pd.context().clone();
                let dev = ctx.query_device()?;
                let port = ctx.query_port(config.port)?;
                let gid = select_gid(&ctx, config, &port)?;
                let limits = (
                    dev.max_qp_wr(),
                    dev.max_qp_init_rd_atom(),
                    dev.max_qp_rd_atom(),
                );
                let a = Addressing::new(config.port, config.gid_index, port, gid, limits);
                self.addressing = Some(a);
                a
            }
        };
        let (port, gid) = (at.port, at.gid);
        if config.transport == Transport::Ud && config.qkey & 0x8000_0000 != 0 {
            return Err(Error::invalid(site!(
                "ibv_create_qp(UD)",
                "a Q_Key with the top bit set is privileged (CAP_NET_RAW)",
                "choose a Q_Key below 0x80000000 (QpConfig::qkey)"
            )));
        }
        let limit = at.max_qp_wr;
        if config.max_send_wr > limit || config.max_recv_wr > limit {
            return Err(Error::invalid(site!(
                "ibv_create_qp",
                "queue depth above the device's max_qp_wr",
                "`ibv_devinfo -v` shows max_qp_wr"
            )));
        }
        let recv_cq = self.recv_cq.as_ref().unwrap_or(&self.cq);
        let srq = self.srq.as_ref().map(|s| &s.srq);
        let parts = crate::raw::QpParts {
            pd: &self.prov.pd.raw,
            send_cq: &self.cq,
            recv_cq,
            srq,
            qp_type: config.transport.qp_type(),
            cap: sys::ibv_qp_cap {
                max_send_wr: config.max_send_wr.max(1),
                max_recv_wr: if srq.is_some() {
                    0
                } else {
                    config.max_recv_wr.max(1)
                },
                max_send_sge: config.max_sge.clamp(1, MAX_SGE as u32),
                max_recv_sge: config.max_sge.clamp(1, MAX_SGE as u32),
                max_inline_data: config.max_inline_data,
            },
        };
        let (raw, mut caps) = match make {
            Some(make) => make(&parts)?,
            None => crate::raw::RawQp::create(&parts)?,
        };
        // The safe layer never builds more entries than it asked for.
        caps.max_send_sge = caps.max_send_sge.min(MAX_SGE as u32);
        caps.max_recv_sge = caps.max_recv_sge.min(MAX_SGE as u32);
        let info = QpInfo {
            config: *config,
            port,
            gid,
            psn: crate::time::random_u32() & crate::endpoint::MAX_PSN,
            // Initiator depth is bounded by the device's init limit, responder
            // resources by its per-QP limit (as perftest: the device's maximum).
            max_rd_atomic: at.max_qp_init_rd_atom.max(1),
            max_dest_rd_atomic: at.max_qp_rd_atom.max(1),
        };
        Ok((raw, caps, info))
    }

    /// RESET -> INIT with the port and the access the peer is granted.
    pub(crate) fn enter_init(&mut self, qp: QpId) -> Result<(), Error> {
        let slot = self.slot_mut(qp)?;
        let mut attr = sys::ibv_qp_attr::zeroed();
        attr.qp_state = QpState::INIT;
        attr.pkey_index = 0;
        attr.port_num = slot.info.config.port;
        // A datagram queue pair has a Q_Key instead of remote access rights.
        let mask = if slot.transport == Transport::Ud {
            attr.qkey = slot.info.config.qkey;
            M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY
        } else {
            attr.qp_access_flags = slot.info.config.remote_access;
            M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS
        };
        let raw = slot
            .qp
            .as_ref()
            .ok_or(Error::invalid(site!("queue pair")))?;
        raw.modify(site!("ibv_modify_qp(RESET->INIT)"), &mut attr, mask)?;
        slot.set_state(QpState::INIT);
        Ok(())
    }

    /// Polls until at least one request is handed back, or `deadline`
    /// passes (`TimedOut`: a dead peer never hangs the caller). With
    /// `EngineConfig::events` it sleeps on the completion channel (no CPU):
    /// poll, arm, poll again (a completion that came before arming makes no
    /// event), then sleep; otherwise it spins.
    pub fn wait(
        &mut self,
        deadline: Deadline,
        mut on_done: impl FnMut(CompletionRef<'_, B>),
    ) -> Result<usize, Error> {
        loop {
            let n = self.poll(&mut on_done)?;
            if n > 0 {
                return Ok(n);
            }
            if deadline.passed() {
                return Err(Error::new(DEAD_PEER, ErrorKind::TimedOut));
            }
            if !self.events {
                core::hint::spin_loop();
                continue;
            }
            self.cq.req_notify(false)?;
            let n = self.poll(&mut on_done)?;
            if n > 0 {
                return Ok(n);
            }
            let ms = deadline.remaining_ms().max(1);
            self.cq.wait_event(ms)?;
        }
    }

    /// The completion channel's descriptor (non-blocking), to register with
    /// `poll`/`epoll`; `None` without `EngineConfig::events`. Arm it with
    /// [`Engine::arm`] before sleeping on it.
    pub fn event_fd(&self) -> Option<i32> {
        self.cq.event_fd()
    }

    /// Arms the completion queue: the next completion (with
    /// `solicited_only`, the next solicited or error one) makes the channel
    /// readable. Poll again after arming before sleeping.
    pub fn arm(&self, solicited_only: bool) -> Result<(), Error> {
        self.cq.req_notify(solicited_only)
    }

    /// Arms the shared receive queue's limit event: when fewer than `limit`
    /// receives remain posted, the device raises `SRQ_LIMIT_REACHED` (read
    /// it with [`Context::next_async_event`]) once; arm again after refilling.
    pub fn arm_srq_limit(&self, limit: u32) -> Result<(), Error> {
        match &self.srq {
            Some(s) => s.srq.arm_limit(limit),
            None => Err(Error::new(
                site!("arm_srq_limit", "this engine has no shared receive queue"),
                ErrorKind::BadState,
            )),
        }
    }

    /// Sleeps until the completion channel has an event or `deadline`
    /// passes, and consumes the events; true if one arrived. Arm first
    /// ([`Engine::arm`]) and poll after (events say "look", not what).
    pub fn sleep_until_event(&self, deadline: Deadline) -> Result<bool, Error> {
        let ms = deadline.remaining_ms();
        self.cq.wait_event(ms)
    }

    /// A descriptor of the caller's own on the completion channel (a
    /// duplicate of [`Engine::event_fd`]: the same open file, readable when
    /// it is), for event loops that must own what they register (tokio's
    /// `AsyncFd`); it stays open until the caller drops it, even past the
    /// engine. `None` without `EngineConfig::events`.
    #[cfg(feature = "std")]
    pub fn dup_event_fd(&self) -> Result<Option<std::os::fd::OwnedFd>, Error> {
        self.cq.dup_event_fd()
    }

    /// Consumes the completion channel's pending events without sleeping
    /// (the channel is non-blocking); true if one arrived. For an event
    /// loop that watches [`Engine::event_fd`] itself (epoll, tokio's
    /// `AsyncFd`): once the descriptor is readable, take the events (they
    /// are acknowledged in batches), then arm and poll again. Refused
    /// without `EngineConfig::events`.
    pub fn take_events(&self) -> Result<bool, Error> {
        self.cq.take_events()
    }

    /// The shared receive queue's identity, to compare with
    /// [`crate::device::AsyncEvent::element`] (`SRQ_LIMIT_REACHED`).
    pub fn srq_raw_id(&self) -> Option<usize> {
        self.srq.as_ref().map(|s| s.srq.as_ptr() as usize)
    }

    /// An identity to compare with [`crate::device::AsyncEvent::element`]:
    /// the address of `qp`'s C object.
    pub fn raw_id(&self, qp: QpId) -> Result<usize, Error> {
        let raw = self
            .slot(qp)?
            .qp
            .as_ref()
            .ok_or(Error::invalid(site!("queue pair")))?;
        Ok(raw.as_ptr() as usize)
    }

    /// The connection manager's id `qp` was made on: what disconnects it,
    /// found through the queue pair so that it follows the queue pair
    /// wherever it is moved.
    #[cfg(feature = "rdmacm")]
    pub(crate) fn cm_id(&self, qp: QpId) -> Result<Arc<crate::raw::cm::RawCmId>, Error> {
        let raw = self.slot(qp)?.qp.as_ref();
        raw.and_then(|q| q.cm_id()).cloned().ok_or(Error::new(
            site!(
                "rdma_cm",
                "this queue pair was not made by the connection manager (was it swapped in?)"
            ),
            ErrorKind::NotFound,
        ))
    }
}

fn select_gid(
    ctx: &Context,
    config: &QpConfig,
    port: &PortAttr,
) -> Result<Option<GidEntry>, Error> {
    let table = ctx.gid_table(config.port)?;
    match config.gid_index {
        Some(i) => validate_gid_index(&table, i, port.gid_tbl_len()).map(Some),
        None => match choose_gid(&table) {
            Some(e) => Ok(Some(*e)),
            None if port.link_layer() == LinkLayer::INFINIBAND => Ok(None),
            None => Err(Error::new(
                site!(
                    "choose GID index",
                    "the port's GID table has no usable entry (RoCE needs one)",
                    "give the network device an IP address; `show_gids`/`rdma link` show the table"
                ),
                ErrorKind::NotFound,
            )),
        },
    }
}
