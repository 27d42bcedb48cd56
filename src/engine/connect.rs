//! INIT -> RTR -> RTS (primer 1.5), reset back to INIT, and what a peer
//! needs to connect to a queue pair.

use alloc::vec::Vec;

use crate::endpoint::{is_peer_qpn, Endpoint, Mtu};
use crate::error::{site, Error, ErrorKind};
use crate::memory::NicBuf;
use crate::sys::{self, ibv_qp_attr_mask as M, Zeroed};
use crate::time::Deadline;

use super::completion::CompletionRef;
use super::config::ConnectOptions;
use super::core::Engine;
use super::doorbell::Verbs;
use super::path::PathInfo;
use super::qp_slot::{QpId, QpState};

/// What the device reports of a connected queue pair (`ibv_query_qp`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpAttributes {
    /// Its state now (ERR after a failure).
    pub state: QpState,
    /// The path MTU the connection settled on.
    pub path_mtu: Mtu,
    /// GRH hop limit in effect: on RoCE the IP route's, whatever
    /// [`ConnectOptions::hop_limit`] asked (see there).
    pub hop_limit: u8,
    /// GRH traffic class.
    pub traffic_class: u8,
    /// GRH flow label.
    pub flow_label: u32,
    /// Local ACK timeout code.
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// Receiver-not-ready retries.
    pub rnr_retry: u8,
}

impl<B: NicBuf> Engine<B, Verbs> {
    /// `qp`'s endpoint, to send to the peer: QPN, PSN, LID, GID, the MTU
    /// this side can do, and no memory (add the regions you choose to share).
    pub fn endpoint(&self, qp: QpId) -> Result<Endpoint, Error> {
        let slot = self.slot(qp)?;
        let info = &slot.info;
        Ok(Endpoint {
            qpn: slot.qp_num,
            psn: info.psn,
            lid: info.port.lid(),
            gid: info.gid.map(|g| g.gid).unwrap_or_default(),
            mtu: Mtu(info.port.active_mtu().0.min(info.config.max_mtu.0)),
            regions: Vec::new(),
        })
    }

    /// Sets `qp`'s first send PSN (random by default) before connecting:
    /// for peers that assume one, like the primer's C programs (PSN 0).
    pub fn set_psn(&mut self, qp: QpId, psn: u32) -> Result<(), Error> {
        let slot = self.slot_mut(qp)?;
        if slot.state != QpState::INIT || psn > crate::endpoint::MAX_PSN {
            return Err(Error::invalid(site!(
                "set_psn",
                "a 24-bit PSN, set in INIT before connect"
            )));
        }
        slot.info.psn = psn;
        Ok(())
    }

    /// Connects `qp` to `peer` with default transport options.
    pub fn connect(&mut self, qp: QpId, peer: &Endpoint) -> Result<PathInfo, Error> {
        self.connect_with(qp, peer, &ConnectOptions::default())
    }

    /// Connects `qp` to `peer`: INIT -> RTR (the peer's QPN, PSN, address,
    /// the agreed MTU) -> RTS (our PSN, timeout and retries). Refuses a
    /// queue pair that is not in INIT (see [`Engine::reset`]).
    pub fn connect_with(
        &mut self,
        qp: QpId,
        peer: &Endpoint,
        opts: &ConnectOptions,
    ) -> Result<PathInfo, Error> {
        let local = self.endpoint(qp)?;
        let slot = self.slot_mut(qp)?;
        if slot.transport == super::config::Transport::Ud {
            return Err(Error::new(
                site!(
                    "connect",
                    "a UD queue pair has no peer to connect to",
                    "ready_ud() moves it to RTS; each send names its destination (post_ud_send)"
                ),
                ErrorKind::BadState,
            ));
        }
        if slot.state != QpState::INIT {
            return Err(Error::new(
                site!(
                    "connect",
                    "a queue pair connects once, from INIT",
                    "reset() it (back to INIT) or create a new one to reconnect"
                ),
                ErrorKind::BadState,
            ));
        }
        peer.validate()
            .map_err(|_| Error::invalid(site!("connect", "the peer's endpoint is malformed")))?;
        if !is_peer_qpn(peer.qpn) {
            return Err(Error::invalid(site!(
                "connect",
                "QPN 0 and 1 are special queue pairs and 0xFFFFFF is the multicast QPN: no connected peer has them"
            )));
        }
        let path = PathInfo::plan(
            slot.info.port.link_layer(),
            slot.info.gid,
            local.mtu,
            peer,
            opts.force_grh,
        )?;
        let mut attr = sys::ibv_qp_attr::zeroed();
        attr.qp_state = QpState::RTR;
        attr.path_mtu = sys::ibv_mtu(path.path_mtu.0);
        attr.dest_qp_num = peer.qpn;
        attr.rq_psn = peer.psn;
        attr.max_dest_rd_atomic = slot.info.max_dest_rd_atomic;
        attr.min_rnr_timer = opts.min_rnr_timer;
        attr.ah_attr.is_global = u8::from(path.is_global);
        attr.ah_attr.dlid = path.dlid;
        attr.ah_attr.sl = opts.service_level;
        attr.ah_attr.port_num = slot.info.config.port;
        if path.is_global {
            attr.ah_attr.grh.dgid.raw = path.dgid.raw();
            attr.ah_attr.grh.sgid_index = path.sgid_index;
            attr.ah_attr.grh.hop_limit = opts.hop_limit;
            attr.ah_attr.grh.traffic_class = opts.traffic_class;
            attr.ah_attr.grh.flow_label = opts.flow_label & 0xF_FFFF;
        }
        let mut mask = M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN;
        if slot.transport == super::config::Transport::Rc {
            mask |= M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER;
        }
        slot.qp.as_ref().ok_or(Error::invalid(site!("queue pair")))?.modify(
            site!(
                "ibv_modify_qp(INIT->RTR)",
                "",
                "GID index (sgid_index must be a populated entry), is_global for the link layer, the peer's QPN and GID, path MTU"
            ),
            &mut attr,
            mask,
        )?;
        slot.set_state(QpState::RTR);
        let mut attr = sys::ibv_qp_attr::zeroed();
        attr.qp_state = QpState::RTS;
        attr.sq_psn = slot.info.psn;
        let mut mask = M::STATE | M::SQ_PSN;
        if slot.transport == super::config::Transport::Rc {
            attr.timeout = opts.timeout;
            attr.retry_cnt = opts.retry_cnt.min(7);
            attr.rnr_retry = opts.rnr_retry.min(7);
            attr.max_rd_atomic = slot.info.max_rd_atomic;
            mask |= M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC;
        }
        slot.qp
            .as_ref()
            .ok_or(Error::invalid(site!("queue pair")))?
            .modify(site!("ibv_modify_qp(RTR->RTS)"), &mut attr, mask)?;
        slot.set_state(QpState::RTS);
        Ok(path)
    }

    /// Moves `qp` to ERR, hands back every request still in flight through
    /// `on_done` (flushed, `WR_FLUSH_ERR`), then back to RESET and INIT
    /// with a new PSN, ready to connect again. Other queue pairs' completions
    /// taken meanwhile go to `on_done` too.
    ///
    /// The flushes the device reports are handed back as they come, for a
    /// short while (within `deadline`); what is left (an unsignaled request
    /// that finished before the error has no completion of its own) is
    /// handed back as flushed once the queue pair is in RESET, where it owns
    /// no work request.
    pub fn reset(
        &mut self,
        qp: QpId,
        deadline: Deadline,
        mut on_done: impl FnMut(CompletionRef<'_, B>),
    ) -> Result<(), Error> {
        let settle = deadline.min(Deadline::after(core::time::Duration::from_millis(100)));
        self.flush_to_reset(qp, || !settle.passed(), &mut on_done)?;
        self.slot_mut(qp)?.info.psn = crate::time::random_u32() & crate::endpoint::MAX_PSN;
        self.enter_init(qp)
    }

    /// What the device reports of `qp` (`ibv_query_qp`): its state, the
    /// path MTU, and the GRH and retry settings connecting gave it.
    pub fn query(&self, qp: QpId) -> Result<QpAttributes, Error> {
        let raw = self
            .slot(qp)?
            .qp
            .as_ref()
            .ok_or(Error::invalid(site!("queue pair")))?;
        let a =
            raw.query(M::STATE | M::PATH_MTU | M::AV | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY)?;
        Ok(QpAttributes {
            state: a.qp_state,
            path_mtu: Mtu(a.path_mtu.0),
            hop_limit: a.ah_attr.grh.hop_limit,
            traffic_class: a.ah_attr.grh.traffic_class,
            flow_label: a.ah_attr.grh.flow_label,
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
        })
    }

    /// The GID entry `qp` uses (None on InfiniBand without GIDs).
    pub fn gid(&self, qp: QpId) -> Result<Option<crate::device::GidEntry>, Error> {
        Ok(self.slot(qp)?.info.gid)
    }

    /// The port attributes read when `qp` was created.
    pub fn port(&self, qp: QpId) -> Result<crate::device::PortAttr, Error> {
        Ok(self.slot(qp)?.info.port)
    }
}
