//! INIT -> RTR -> RTS, with the addressing decided from the link layer and
//! the MTU agreed from both sides' endpoints.

use crate::device::{GidEntry, LinkLayer};
use crate::endpoint::{Endpoint, Mtu};
use crate::error::{Error, ErrorKind};
use crate::gid::Gid;
use crate::memory::LocalBuf;
use crate::sys::{self, ibv_qp_attr_mask as M, Zeroed};

use super::{QpState, QueuePair};

/// Transport parameters of the RTR and RTS transitions. The defaults are
/// the primer's (timeout 14, retry 7, RNR retry 7, min RNR timer 12).
#[derive(Clone, Copy, Debug)]
pub struct ConnectOptions {
    /// Local ACK timeout, 4.096 us * 2^timeout (14: about 67 ms).
    pub timeout: u8,
    /// Transport retries before `RETRY_EXC_ERR` (at most 7; Soft-RoCE treats
    /// 7 as "forever", so a dead peer is then found only by your deadline:
    /// use 6 or less to get the error, after about timeout x (retry_cnt + 1)).
    pub retry_cnt: u8,
    /// Receiver-not-ready retries (7: forever).
    pub rnr_retry: u8,
    /// Minimum RNR NAK timer code (12: 0.64 ms).
    pub min_rnr_timer: u8,
    /// GRH hop limit (RoCE: the IP TTL).
    pub hop_limit: u8,
    /// GRH traffic class (RoCE: DSCP/ECN).
    pub traffic_class: u8,
    /// Service level.
    pub service_level: u8,
    /// Force the GRH on InfiniBand (it is always used on RoCE).
    pub force_grh: bool,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            hop_limit: 64,
            traffic_class: 0,
            service_level: 0,
            force_grh: false,
        }
    }
}

/// How the QP reaches the peer: decided from the local port and the peer's
/// endpoint by [`PathInfo::plan`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathInfo {
    /// Use the GRH (`is_global = 1`): always on RoCE, on InfiniBand only
    /// across subnets or when forced.
    pub is_global: bool,
    /// Destination LID (InfiniBand).
    pub dlid: u16,
    /// Destination GID (with the GRH).
    pub dgid: Gid,
    /// Source GID index (with the GRH).
    pub sgid_index: u8,
    /// Path MTU: the smaller of the two sides'.
    pub path_mtu: Mtu,
}

impl PathInfo {
    /// Decides the addressing: Ethernet (RoCE) always uses the GRH with the
    /// peer's GID; InfiniBand routes by LID (and refuses LID 0) unless the
    /// peer is in another subnet or the GRH is forced.
    pub fn plan(
        link_layer: LinkLayer,
        local_gid: Option<GidEntry>,
        local_mtu: Mtu,
        peer: &Endpoint,
        force_grh: bool,
    ) -> Result<PathInfo, Error> {
        let call = "ibv_modify_qp(INIT->RTR)";
        let path_mtu = Mtu(local_mtu.0.min(peer.mtu.0));
        if !path_mtu.is_known() {
            return Err(Error::invalid(call, "unknown path MTU")
                .with_hint("both endpoints must carry an MTU code 1..=5"));
        }
        let is_global = match link_layer {
            LinkLayer::INFINIBAND => {
                let other_subnet = local_gid.is_some_and(|g| {
                    !peer.gid.is_zero() && g.gid.subnet_prefix() != peer.gid.subnet_prefix()
                });
                if !(force_grh || other_subnet) && peer.lid == 0 {
                    return Err(Error::invalid(call, "the peer's LID is 0 on InfiniBand").with_hint(
                        "LID 0 means no subnet manager assigned one: check opensm runs and the port is ACTIVE",
                    ));
                }
                force_grh || other_subnet
            }
            _ => true,
        };
        let sgid_index = match (is_global, local_gid) {
            (false, _) => 0,
            (true, Some(g)) => {
                u8::try_from(g.index).map_err(|_| Error::invalid(call, "GID index above 255"))?
            }
            (true, None) => {
                return Err(Error::new(call, ErrorKind::NotFound)
                    .with_detail("the GRH is needed but this port has no usable GID")
                    .with_hint("GID index; RoCE needs an IP address on the network device"))
            }
        };
        if is_global && peer.gid.is_zero() {
            return Err(Error::invalid(call, "the peer sent a zero GID but the GRH is needed").with_hint(
                "the peer's GID index (RoCE needs a populated RoCE v2 GID; is_global must be 1 on Ethernet)",
            ));
        }
        Ok(PathInfo {
            is_global,
            dlid: peer.lid,
            dgid: peer.gid,
            sgid_index,
            path_mtu,
        })
    }
}

impl<B: LocalBuf> QueuePair<B> {
    /// Connects to `peer` with default transport options: INIT -> RTR -> RTS.
    pub fn connect(&mut self, peer: &Endpoint) -> Result<PathInfo, Error> {
        self.connect_with(peer, &ConnectOptions::default())
    }

    /// Connects to `peer`: INIT -> RTR (the peer's QPN, PSN, address, the
    /// agreed MTU) -> RTS (our PSN, timeout and retries). Refuses a QP that
    /// is not in INIT (connecting twice, or after an error: see [`QueuePair::reset`]).
    pub fn connect_with(
        &mut self,
        peer: &Endpoint,
        opts: &ConnectOptions,
    ) -> Result<PathInfo, Error> {
        if self.state != QpState::INIT {
            return Err(Error::new("connect", ErrorKind::BadState)
                .with_detail("a queue pair connects once, from INIT")
                .with_hint("reset() it (back to INIT) or create a new one to reconnect"));
        }
        peer.validate()
            .map_err(|e| Error::invalid("connect", e.reason()))?;
        let local = self.endpoint();
        let path = PathInfo::plan(
            self.port.link_layer(),
            self.gid,
            local.mtu,
            peer,
            opts.force_grh,
        )?;

        let mut attr = sys::ibv_qp_attr::zeroed();
        attr.qp_state = QpState::RTR;
        attr.path_mtu = sys::ibv_mtu(path.path_mtu.0);
        attr.dest_qp_num = peer.qpn;
        attr.rq_psn = peer.psn;
        attr.max_dest_rd_atomic = self.max_dest_rd_atomic;
        attr.min_rnr_timer = opts.min_rnr_timer;
        attr.ah_attr.is_global = u8::from(path.is_global);
        attr.ah_attr.dlid = path.dlid;
        attr.ah_attr.sl = opts.service_level;
        attr.ah_attr.port_num = self.port_num;
        if path.is_global {
            attr.ah_attr.grh.dgid.raw = path.dgid.raw();
            attr.ah_attr.grh.sgid_index = path.sgid_index;
            attr.ah_attr.grh.hop_limit = opts.hop_limit;
            attr.ah_attr.grh.traffic_class = opts.traffic_class;
        }
        let mask = M::STATE
            | M::AV
            | M::PATH_MTU
            | M::DEST_QPN
            | M::RQ_PSN
            | M::MAX_DEST_RD_ATOMIC
            | M::MIN_RNR_TIMER;
        self.modify("ibv_modify_qp(INIT->RTR)", &mut attr, mask).map_err(|e| {
            e.with_hint("GID index (sgid_index must be a populated entry), is_global for the link layer, the peer's \
                 QPN and GID, path MTU")
        })?;
        self.set_state(QpState::RTR);

        let mut attr = sys::ibv_qp_attr::zeroed();
        attr.qp_state = QpState::RTS;
        attr.timeout = opts.timeout;
        attr.retry_cnt = opts.retry_cnt.min(7);
        attr.rnr_retry = opts.rnr_retry.min(7);
        attr.sq_psn = self.psn;
        attr.max_rd_atomic = self.max_rd_atomic;
        let mask =
            M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC;
        self.modify("ibv_modify_qp(RTR->RTS)", &mut attr, mask)?;
        self.set_state(QpState::RTS);
        Ok(path)
    }

    /// Moves the QP to ERR, returns every request still in flight through
    /// `on_done` (flushed, `WR_FLUSH_ERR`), then back to RESET and INIT with
    /// a new PSN, ready to [`connect`](QueuePair::connect) again.
    ///
    /// On Soft-RoCE (Linux 6.1) a QP reset after its link went down has
    /// been seen to flush its first requests again, with no cause, after
    /// reconnecting; a new QP recovered every time (FAULTS.md).
    pub fn reset(
        &mut self,
        config: &super::QpConfig,
        deadline: crate::time::Deadline,
        mut on_done: impl FnMut(super::Completion<B>),
    ) -> Result<(), Error> {
        let mut attr = sys::ibv_qp_attr::zeroed();
        attr.qp_state = QpState::ERR;
        self.modify("ibv_modify_qp(->ERR)", &mut attr, M::STATE)?;
        self.set_state(QpState::ERR);
        while self.in_flight() != (0, 0) {
            if deadline.passed() {
                return Err(Error::new(
                    "reset: drain flushed requests",
                    ErrorKind::TimedOut,
                ));
            }
            self.poll(&mut on_done)?;
        }
        let mut attr = sys::ibv_qp_attr::zeroed();
        attr.qp_state = QpState::RESET;
        self.modify("ibv_modify_qp(->RESET)", &mut attr, M::STATE)?;
        self.set_state(QpState::RESET);
        self.psn = crate::time::random_u32() & crate::endpoint::MAX_PSN;
        self.unsignaled_run = 0;
        self.enter_init(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::GidType;
    use alloc::vec::Vec;

    fn peer(lid: u16, gid: Gid, mtu: Mtu) -> Endpoint {
        Endpoint {
            qpn: 7,
            psn: 9,
            lid,
            gid,
            mtu,
            regions: Vec::new(),
        }
    }

    fn v2(index: u32, gid: Gid) -> Option<GidEntry> {
        Some(GidEntry {
            index,
            gid,
            gid_type: GidType::ROCE_V2,
            ifindex: 2,
        })
    }

    #[test]
    fn roce_always_uses_the_grh_and_the_smaller_mtu() {
        let p = PathInfo::plan(
            LinkLayer::ETHERNET,
            v2(1, Gid::from_ipv4([10, 0, 0, 1])),
            Mtu::MTU_1024,
            &peer(0, Gid::from_ipv4([10, 0, 0, 2]), Mtu::MTU_4096),
            false,
        )
        .unwrap();
        assert!(p.is_global);
        assert_eq!(p.sgid_index, 1);
        assert_eq!(p.path_mtu, Mtu::MTU_1024);
    }

    #[test]
    fn roce_refuses_a_zero_peer_gid() {
        let e = PathInfo::plan(
            LinkLayer::ETHERNET,
            v2(1, Gid::from_ipv4([10, 0, 0, 1])),
            Mtu::MTU_1024,
            &peer(0, Gid::ZERO, Mtu::MTU_1024),
            false,
        )
        .unwrap_err();
        assert!(e.hint().unwrap().contains("GID index"));
    }

    #[test]
    fn infiniband_uses_the_lid_and_refuses_lid_zero() {
        let p = PathInfo::plan(
            LinkLayer::INFINIBAND,
            None,
            Mtu::MTU_4096,
            &peer(5, Gid::ZERO, Mtu::MTU_2048),
            false,
        )
        .unwrap();
        assert!(!p.is_global);
        assert_eq!(p.dlid, 5);
        assert_eq!(p.path_mtu, Mtu::MTU_2048);
        let e = PathInfo::plan(
            LinkLayer::INFINIBAND,
            None,
            Mtu::MTU_4096,
            &peer(0, Gid::ZERO, Mtu::MTU_2048),
            false,
        )
        .unwrap_err();
        assert!(e.to_string().contains("LID is 0"));
    }
}
