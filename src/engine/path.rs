//! How a queue pair reaches its peer: the addressing decided from the link
//! layer (primer 4.3: `is_global`, LID or GID) and the MTU both sides can do.

use crate::device::{GidEntry, LinkLayer};
use crate::endpoint::{Endpoint, Mtu};
use crate::error::{site, Error, ErrorKind};
use crate::gid::Gid;

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
        let path_mtu = Mtu(local_mtu.0.min(peer.mtu.0));
        if !path_mtu.is_known() {
            return Err(Error::invalid(site!(
                "ibv_modify_qp(INIT->RTR)",
                "unknown path MTU",
                "both endpoints must carry an MTU code 1..=5"
            )));
        }
        let is_global = match link_layer {
            LinkLayer::INFINIBAND => {
                let other_subnet = local_gid.is_some_and(|g| {
                    !peer.gid.is_zero() && g.gid.subnet_prefix() != peer.gid.subnet_prefix()
                });
                if !(force_grh || other_subnet) && peer.lid == 0 {
                    return Err(Error::invalid(site!(
                        "ibv_modify_qp(INIT->RTR)",
                        "the peer's LID is 0 on InfiniBand",
                        "LID 0 means no subnet manager assigned one: check opensm runs and the port is ACTIVE"
                    )));
                }
                force_grh || other_subnet
            }
            _ => true,
        };
        let sgid_index = match (is_global, local_gid) {
            (false, _) => 0,
            (true, Some(g)) => u8::try_from(g.index).map_err(|_| {
                Error::invalid(site!("ibv_modify_qp(INIT->RTR)", "GID index above 255"))
            })?,
            (true, None) => {
                return Err(Error::new(
                    site!(
                        "ibv_modify_qp(INIT->RTR)",
                        "the GRH is needed but this port has no usable GID",
                        "GID index; RoCE needs an IP address on the network device"
                    ),
                    ErrorKind::NotFound,
                ))
            }
        };
        if is_global && peer.gid.is_zero() {
            return Err(Error::invalid(site!(
                "ibv_modify_qp(INIT->RTR)",
                "the peer sent a zero GID but the GRH is needed",
                "the peer's GID index (RoCE needs a populated RoCE v2 GID; is_global must be 1 on Ethernet)"
            )));
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
