//! What one side of a reliable-connected (RC) queue pair must tell the
//! other before the pair can be connected: the values the peer feeds into
//! its `INIT → RTR` transition, plus the memory it may touch remotely.
//!
//! Only plain data lives here (no_std + `alloc`); the byte layout is in
//! [`crate::wire`] and the TCP exchange in `crate::exchange`.

use alloc::vec::Vec;
use core::fmt;

use crate::gid::Gid;
use crate::sys::ibv_link_layer as LinkLayer;

/// Largest queue pair number: QPNs are 24-bit on the wire (BTH `DestQP`).
pub const MAX_QPN: u32 = 0x00FF_FFFF;

/// Smallest QPN a peer may have: 0 and 1 are the special SMI and GSI
/// queue pairs, which no reliable-connected queue pair is.
pub const MIN_PEER_QPN: u32 = 2;

/// Largest QPN a peer may have: `0xFFFFFF` addresses a multicast group,
/// which no reliable-connected queue pair is.
pub const MAX_PEER_QPN: u32 = 0x00FF_FFFE;

/// Whether a peer's queue pair can have `qpn`:
/// [`MIN_PEER_QPN`]`..=`[`MAX_PEER_QPN`].
pub const fn is_peer_qpn(qpn: u32) -> bool {
    qpn >= MIN_PEER_QPN && qpn <= MAX_PEER_QPN
}

/// Largest packet sequence number: PSNs are 24-bit on the wire (BTH `PSN`).
pub const MAX_PSN: u32 = 0x00FF_FFFF;

/// Largest unicast LID: `0xC000..=0xFFFE` are multicast LIDs and
/// `0xFFFF` the permissive one, none of which names one port.
pub const MAX_UNICAST_LID: u16 = 0xBFFF;

/// Most regions one endpoint may share. Bounds the wire message (and so
/// what a peer can make us allocate) at [`crate::wire::MAX_MESSAGE_LEN`].
pub const MAX_REGIONS: usize = 64;

/// A path MTU as the value of C `enum ibv_mtu` (1 = 256 … 5 = 4096 bytes).
///
/// A newtype over the raw code rather than a Rust enum, so a value the
/// kernel reports that this crate does not know yet is carried, shown as
/// `unknown(n)` and rejected by [`Endpoint::validate`], never UB.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Mtu(pub u32);

impl Mtu {
    /// `IBV_MTU_256`.
    pub const MTU_256: Mtu = Mtu(1);
    /// `IBV_MTU_512`.
    pub const MTU_512: Mtu = Mtu(2);
    /// `IBV_MTU_1024`: what the primer hard-codes, safe on RoCE over a
    /// 1500-byte Ethernet MTU.
    pub const MTU_1024: Mtu = Mtu(3);
    /// `IBV_MTU_2048`.
    pub const MTU_2048: Mtu = Mtu(4);
    /// `IBV_MTU_4096`: needs jumbo frames on RoCE.
    pub const MTU_4096: Mtu = Mtu(5);

    /// The MTU in bytes, or `None` for a code `enum ibv_mtu` does not define.
    pub const fn bytes(self) -> Option<u32> {
        match self.0 {
            1..=5 => Some(128 << self.0),
            _ => None,
        }
    }

    /// The code for an MTU given in bytes (256, 512, 1024, 2048 or 4096),
    /// or `None` for any other size: the hardware supports no others.
    pub const fn from_bytes(bytes: u32) -> Option<Mtu> {
        match bytes {
            256 => Some(Mtu::MTU_256),
            512 => Some(Mtu::MTU_512),
            1024 => Some(Mtu::MTU_1024),
            2048 => Some(Mtu::MTU_2048),
            4096 => Some(Mtu::MTU_4096),
            _ => None,
        }
    }

    /// True when the code is one `enum ibv_mtu` defines.
    pub const fn is_known(self) -> bool {
        self.bytes().is_some()
    }
}

impl fmt::Display for Mtu {
    /// The size in bytes (`1024`), or `unknown(7)` for an undefined code.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.bytes() {
            Some(bytes) => write!(f, "{bytes}"),
            None => write!(f, "unknown({})", self.0),
        }
    }
}

/// A memory region the peer may read or write with one-sided RDMA:
/// its remote address, length and `rkey`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct RemoteRegion {
    /// Start address in the owner's virtual address space (as registered).
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// The remote key the owner's `ibv_reg_mr` returned.
    pub rkey: u32,
}

impl RemoteRegion {
    /// One past the last byte, or `None` when `addr + len` overflows
    /// `u64` (such a region is never valid).
    pub const fn end(&self) -> Option<u64> {
        self.addr.checked_add(self.len)
    }

    /// True when `[addr, addr + len)` lies wholly inside this region, so
    /// a work request can be checked locally before the NIC rejects it
    /// with a remote access error. Overflow-safe: a range whose end does
    /// not fit in `u64` is never contained. A zero-length range is
    /// contained when `addr` is within `[self.addr, self.end]`.
    pub const fn contains(&self, addr: u64, len: u64) -> bool {
        let (Some(end), Some(self_end)) = (addr.checked_add(len), self.end()) else {
            return false;
        };
        addr >= self.addr && end <= self_end
    }
}

/// Everything the peer needs to connect its RC queue pair to ours and
/// to target our memory.
///
/// QPN and PSN are 24-bit quantities stored in `u32`. The endpoint carries
/// only the regions the caller chose to share — least privilege: a region
/// not listed here is memory the peer has no `rkey` for.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Endpoint {
    /// Our queue pair number: the peer's `dest_qp_num` (24-bit).
    pub qpn: u32,
    /// Our first send PSN: the peer's `rq_psn` (24-bit).
    pub psn: u32,
    /// Our port's LID: the peer's `ah_attr.dlid` on InfiniBand (0 on RoCE).
    pub lid: u16,
    /// Our port's GID: the peer's `ah_attr.grh.dgid` (required on RoCE).
    pub gid: Gid,
    /// The path MTU we will use; both sides should agree.
    pub mtu: Mtu,
    /// The regions we let the peer access, at most [`MAX_REGIONS`].
    pub regions: Vec<RemoteRegion>,
}

impl Endpoint {
    /// The endpoint of a peer that sent the four values C programs
    /// exchange (the primer's `conn_info`, rdma-core's examples): its
    /// queue pair number, first PSN, LID and GID, sharing no memory (push
    /// the regions it told you about onto `regions`).
    ///
    /// Refused: a QPN no reliable-connected queue pair can have (0 and 1
    /// are the special SMI and GSI queue pairs, `0xFFFFFF` is multicast,
    /// anything wider than 24 bits), and a PSN wider than 24 bits; the
    /// same rules a server applies to a hello (`verbs::exchange`).
    ///
    /// # MTU
    ///
    /// `mtu` is set to [`Mtu::MTU_4096`], the largest, because C peers do
    /// not send theirs: [`crate::Engine::connect`] uses the smaller of
    /// the peer's `mtu` and this side's port's active MTU (and
    /// [`crate::QpConfig::max_mtu`]), so the path MTU becomes this port's.
    /// Both sides of a connection must agree on it: if the C peer
    /// hard-codes one (the primer uses `IBV_MTU_1024`), set `mtu` to it
    /// (`Endpoint { mtu: Mtu::MTU_1024, ..Endpoint::new(..)? }`).
    ///
    /// ```
    /// use verbs::{Endpoint, Gid, Mtu};
    /// // What a C peer printed or sent: qpn 0x11, psn 0, lid 0, its GID.
    /// let gid = Gid::from_ipv4([10, 0, 0, 2]);
    /// let peer = Endpoint { mtu: Mtu::MTU_1024, ..Endpoint::new(0x11, 0, 0, gid)? };
    /// assert!(Endpoint::new(1, 0, 0, gid).is_err()); // the GSI queue pair
    /// # Ok::<(), verbs::endpoint::EndpointError>(())
    /// ```
    pub fn new(qpn: u32, psn: u32, lid: u16, gid: Gid) -> Result<Endpoint, EndpointError> {
        if qpn > MAX_QPN {
            return Err(EndpointError::QpnTooWide(qpn));
        }
        if !is_peer_qpn(qpn) {
            return Err(EndpointError::ReservedQpn(qpn));
        }
        if psn > MAX_PSN {
            return Err(EndpointError::PsnTooWide(psn));
        }
        Ok(Endpoint {
            qpn,
            psn,
            lid,
            gid,
            mtu: Mtu::MTU_4096,
            regions: Vec::new(),
        })
    }

    /// Checks what the wire format and `modify_qp` rely on: QPN and PSN
    /// fit 24 bits, the MTU code is known, at most [`MAX_REGIONS`] regions
    /// and no region whose `addr + len` overflows. Encoding refuses, and
    /// decoding never yields, an endpoint that fails this.
    pub fn validate(&self) -> Result<(), EndpointError> {
        if self.qpn > MAX_QPN {
            return Err(EndpointError::QpnTooWide(self.qpn));
        }
        if self.psn > MAX_PSN {
            return Err(EndpointError::PsnTooWide(self.psn));
        }
        if !self.mtu.is_known() {
            return Err(EndpointError::UnknownMtu(self.mtu));
        }
        if self.regions.len() > MAX_REGIONS {
            return Err(EndpointError::TooManyRegions(self.regions.len()));
        }
        if let Some(index) = self.regions.iter().position(|r| r.end().is_none()) {
            return Err(EndpointError::RegionOverflow { index });
        }
        Ok(())
    }

    /// Checks that a queue pair on a port of `link_layer` can address
    /// this endpoint: what a server asks of a client's hello before it
    /// reveals anything, since no connection can come of an endpoint
    /// that fails this.
    ///
    /// - Ethernet (RoCE) addresses every peer by GID: a zero GID is
    ///   refused ([`EndpointError::ZeroGid`]); the LID is not used.
    /// - InfiniBand routes by LID: LID 0 (no subnet manager assigned one)
    ///   and multicast or permissive LIDs are refused
    ///   ([`EndpointError::NotUnicastLid`]); a zero GID with a unicast
    ///   LID is fine.
    /// - Any other link layer, or `None` (the port is not known): only an
    ///   endpoint no port can address, neither a GID nor a LID, is
    ///   refused ([`EndpointError::NoAddress`]).
    pub fn check_addressable(&self, link_layer: Option<LinkLayer>) -> Result<(), EndpointError> {
        match link_layer {
            Some(LinkLayer::ETHERNET) if self.gid.is_zero() => Err(EndpointError::ZeroGid),
            Some(LinkLayer::INFINIBAND) if !(1..=MAX_UNICAST_LID).contains(&self.lid) => {
                Err(EndpointError::NotUnicastLid(self.lid))
            }
            _ if self.gid.is_zero() && self.lid == 0 => Err(EndpointError::NoAddress),
            _ => Ok(()),
        }
    }

    /// The first shared region that wholly contains `[addr, addr + len)`,
    /// i.e. whose `rkey` a work request for that range must carry.
    pub fn region_for(&self, addr: u64, len: u64) -> Option<&RemoteRegion> {
        self.regions.iter().find(|r| r.contains(addr, len))
    }
}

/// Why an [`Endpoint`] failed [`Endpoint::validate`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum EndpointError {
    /// The QPN does not fit 24 bits.
    QpnTooWide(u32),
    /// The QPN (carried) is one no reliable-connected queue pair has:
    /// 0 (SMI), 1 (GSI) or `0xFFFFFF` (multicast).
    ReservedQpn(u32),
    /// The PSN does not fit 24 bits.
    PsnTooWide(u32),
    /// The MTU code is not one of `enum ibv_mtu`'s.
    UnknownMtu(Mtu),
    /// More than [`MAX_REGIONS`] regions (the count is carried).
    TooManyRegions(usize),
    /// The region at `index` has `addr + len` beyond `u64::MAX`.
    RegionOverflow {
        /// Position in [`Endpoint::regions`].
        index: usize,
    },
    /// The GID is zero, where the port addresses peers by GID (RoCE).
    ZeroGid,
    /// The LID (carried) is not a unicast LID, where the port routes by
    /// LID (InfiniBand).
    NotUnicastLid(u16),
    /// Neither a GID nor a LID: no port can address the endpoint.
    NoAddress,
}

impl EndpointError {
    /// A fixed description, for callers (such as the wire decoder) that
    /// keep a `&'static str` rather than the values.
    pub const fn reason(&self) -> &'static str {
        match self {
            EndpointError::QpnTooWide(_) => "qpn wider than 24 bits (max 0xffffff)",
            EndpointError::ReservedQpn(_) => {
                "qpn reserved (0 is SMI, 1 is GSI, 0xffffff is multicast): no RC peer has it"
            }
            EndpointError::PsnTooWide(_) => "psn wider than 24 bits (max 0xffffff)",
            EndpointError::UnknownMtu(_) => {
                "unknown mtu code (expected 1..=5, IBV_MTU_256..IBV_MTU_4096)"
            }
            EndpointError::TooManyRegions(_) => "more regions than MAX_REGIONS (64)",
            EndpointError::RegionOverflow { .. } => "region addr + len overflows u64",
            EndpointError::ZeroGid => "gid is zero, and RoCE addresses peers by gid",
            EndpointError::NotUnicastLid(_) => {
                "lid is not unicast (1..=0xbfff), and InfiniBand routes by lid"
            }
            EndpointError::NoAddress => "neither a gid nor a lid: no port can address it",
        }
    }
}

impl fmt::Display for EndpointError {
    /// Says what was wrong and what was expected, with the offending value.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EndpointError::QpnTooWide(v) => {
                write!(f, "qpn {v:#x} wider than 24 bits (max {MAX_QPN:#x})")
            }
            EndpointError::ReservedQpn(v) => write!(
                f,
                "qpn {v:#x} is reserved (0 is SMI, 1 is GSI, 0xffffff is multicast): \
                 no reliable-connected peer has it"
            ),
            EndpointError::PsnTooWide(v) => {
                write!(f, "psn {v:#x} wider than 24 bits (max {MAX_PSN:#x})")
            }
            EndpointError::UnknownMtu(m) => write!(f, "mtu code {} unknown (expected 1..=5)", m.0),
            EndpointError::TooManyRegions(n) => {
                write!(f, "{n} regions shared, at most {MAX_REGIONS} allowed")
            }
            EndpointError::RegionOverflow { index } => {
                write!(f, "region {index}: addr + len overflows u64")
            }
            EndpointError::ZeroGid => write!(
                f,
                "gid is zero, and this port (RoCE) addresses peers by gid: \
                 the peer's gid index, or an IP address on its network device"
            ),
            EndpointError::NotUnicastLid(lid) => write!(
                f,
                "lid {lid:#x} is not unicast (1..={MAX_UNICAST_LID:#x}), and this port \
                 (InfiniBand) routes by lid: is the peer's port ACTIVE with a subnet manager?"
            ),
            EndpointError::NoAddress => {
                write!(f, "neither a gid nor a lid: no port can address it")
            }
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for EndpointError {}

#[cfg(test)]
mod tests;
