//! The primer's own exchange format: its packed `struct conn_info`, sent
//! raw over TCP port 18515, so a Rust program can talk to the primer's C
//! `server`/`client`.
//!
//! ```c
//! struct conn_info {
//!     uint32_t qpn;  uint32_t lid;  union ibv_gid gid;
//!     uint64_t addr; uint32_t rkey;
//! } __attribute__((packed));   // 36 bytes
//! ```
//!
//! | offset | size | field |
//! |--------|------|-------|
//! | 0      | 4    | qpn   |
//! | 4      | 4    | lid   |
//! | 8      | 16   | gid   |
//! | 24     | 8    | addr  |
//! | 32     | 4    | rkey  |
//!
//! The integers are in **host byte order**, exactly as the C program
//! `write()`s its struct (little-endian on x86-64), so this format only
//! works between hosts of the same endianness. It has no magic, no
//! version and no length: nothing detects a peer speaking something else,
//! and the region length, the PSN and the MTU are not sent at all (the
//! primer hard-codes PSN 0 and `IBV_MTU_1024`). Prefer [`crate::wire`]'s
//! own format for anything but interoperating with the primer.
//!
//! # Unauthenticated
//!
//! The primer's server writes its `conn_info` first, before reading a
//! byte, and the format has no room for a token: **anyone who connects
//! learns the server's buffer address and `rkey`**, which is a
//! capability to read and write that memory over RDMA. Serve it only on a
//! network where every host may touch that buffer, and only while
//! interoperating with the primer. The byte order of the exchange (server
//! writes, then reads; client reads, then writes) is kept exactly, since
//! the C programs block on it.

use super::error::WireError;
use crate::endpoint::is_peer_qpn;
use crate::endpoint::{Endpoint, Mtu, RemoteRegion};
use crate::gid::Gid;

/// Size of the packed `struct conn_info`.
pub const CONN_INFO_LEN: usize = 36;

/// The primer's `TCP_PORT`.
pub const TUTORIAL_TCP_PORT: u16 = 18515;

/// The primer's `BUF_SIZE`: the length of the one buffer each side
/// registers, which the format does not carry. Pass it to
/// [`ConnInfo::to_endpoint`] when talking to the primer's programs.
pub const TUTORIAL_BUF_SIZE: u64 = 4096;

/// The primer's `struct conn_info`, field for field.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct ConnInfo {
    /// Queue pair number (24 bits used).
    pub qpn: u32,
    /// Port LID; `uint32_t` in the C struct although LIDs are 16-bit.
    pub lid: u32,
    /// Port GID (raw bytes, as in `union ibv_gid`).
    pub gid: Gid,
    /// Start of the sender's registered buffer.
    pub addr: u64,
    /// `rkey` of that buffer.
    pub rkey: u32,
}

impl ConnInfo {
    /// The 36 bytes the C program would `write()` for this struct
    /// (integers in host byte order, no padding).
    pub fn to_bytes(&self) -> [u8; CONN_INFO_LEN] {
        let mut out = [0u8; CONN_INFO_LEN];
        out[0..4].copy_from_slice(&self.qpn.to_ne_bytes());
        out[4..8].copy_from_slice(&self.lid.to_ne_bytes());
        out[8..24].copy_from_slice(self.gid.as_bytes());
        out[24..32].copy_from_slice(&self.addr.to_ne_bytes());
        out[32..36].copy_from_slice(&self.rkey.to_ne_bytes());
        out
    }

    /// Reads the struct as the C program `read()`s it. Every 36-byte
    /// string is some `conn_info`, so this cannot fail; check the values
    /// with [`ConnInfo::to_endpoint`].
    pub fn from_bytes(bytes: &[u8; CONN_INFO_LEN]) -> Self {
        let (qpn, rest) = split::<4>(bytes);
        let (lid, rest) = split::<4>(rest);
        let (gid, rest) = split::<16>(rest);
        let (addr, rest) = split::<8>(rest);
        let (rkey, _) = split::<4>(rest);
        ConnInfo {
            qpn: u32::from_ne_bytes(qpn),
            lid: u32::from_ne_bytes(lid),
            gid: Gid::from_raw(gid),
            addr: u64::from_ne_bytes(addr),
            rkey: u32::from_ne_bytes(rkey),
        }
    }

    /// Like [`ConnInfo::from_bytes`] for a slice, which must be exactly
    /// [`CONN_INFO_LEN`] bytes long.
    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        match <&[u8; CONN_INFO_LEN]>::try_from(bytes) {
            Ok(array) => Ok(Self::from_bytes(array)),
            Err(_) if bytes.len() < CONN_INFO_LEN => Err(WireError::Truncated {
                needed: CONN_INFO_LEN,
                got: bytes.len(),
            }),
            Err(_) => Err(WireError::Inconsistent(
                "trailing bytes after the 36-byte conn_info",
            )),
        }
    }

    /// The primer's view of `ep`. Refuses what the format cannot say:
    /// `ep` must be valid with a QPN a peer can have ([`super::MIN_PEER_QPN`]`..=`[`super::MAX_PEER_QPN`]), have
    /// PSN 0 and MTU 1024 (the primer's hard-coded values, which its peer
    /// will assume), and share exactly one region — whose length is
    /// dropped, as the format has no field for it.
    pub fn from_endpoint(ep: &Endpoint) -> Result<Self, WireError> {
        ep.validate()?;
        if !is_peer_qpn(ep.qpn) {
            return Err(WireError::ReservedQpn(ep.qpn));
        }
        if ep.psn != 0 {
            return Err(WireError::Inconsistent(
                "the tutorial format implies psn 0 (primer hard-codes it)",
            ));
        }
        if ep.mtu != Mtu::MTU_1024 {
            return Err(WireError::Inconsistent(
                "the tutorial format implies mtu 1024 (primer hard-codes it)",
            ));
        }
        let [region] = ep.regions.as_slice() else {
            return Err(WireError::Inconsistent(
                "the tutorial format carries exactly one region",
            ));
        };
        Ok(ConnInfo {
            qpn: ep.qpn,
            lid: u32::from(ep.lid),
            gid: ep.gid,
            addr: region.addr,
            rkey: region.rkey,
        })
    }

    /// The [`Endpoint`] this `conn_info` describes: PSN 0 and
    /// [`Mtu::MTU_1024`] as the primer hard-codes them, and one region of
    /// `region_len` bytes at `addr` — the length is not on the wire, so
    /// the caller supplies what it knows out of band
    /// ([`TUTORIAL_BUF_SIZE`] for the primer). Fails when the QPN is wider
    /// than 24 bits or is 0, 1 or `0xFFFFFF` (no RC peer has those), the LID is wider
    /// than 16 bits, or `addr + region_len` overflows.
    pub fn to_endpoint(&self, region_len: u64) -> Result<Endpoint, WireError> {
        let lid = u16::try_from(self.lid)
            .map_err(|_| WireError::Inconsistent("lid wider than 16 bits (max 0xffff)"))?;
        let mut ep = Endpoint {
            mtu: Mtu::MTU_1024,
            ..Endpoint::new(self.qpn, 0, lid, self.gid)?
        };
        ep.regions.push(RemoteRegion {
            addr: self.addr,
            len: region_len,
            rkey: self.rkey,
        });
        ep.validate()?;
        Ok(ep)
    }
}

/// Splits a fixed-size head off a slice known to be long enough (the
/// callers' offsets add up to [`CONN_INFO_LEN`]).
fn split<const N: usize>(bytes: &[u8]) -> ([u8; N], &[u8]) {
    match bytes.split_first_chunk::<N>() {
        Some((head, rest)) => (*head, rest),
        None => ([0; N], &[]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_order_layout() {
        let ci = ConnInfo {
            qpn: 0x11,
            lid: 0x0203,
            gid: Gid::from_ipv4([10, 0, 0, 1]),
            addr: 0x7f00_0000_1000,
            rkey: 0xabcd,
        };
        let b = ci.to_bytes();
        assert_eq!(&b[0..4], &0x11u32.to_ne_bytes());
        assert_eq!(&b[4..8], &0x0203u32.to_ne_bytes());
        assert_eq!(&b[8..24], ci.gid.as_bytes());
        assert_eq!(&b[24..32], &0x7f00_0000_1000u64.to_ne_bytes());
        assert_eq!(&b[32..36], &0xabcdu32.to_ne_bytes());
        assert_eq!(ConnInfo::from_bytes(&b), ci);
        assert_eq!(ConnInfo::decode(&b), Ok(ci));
        assert!(matches!(
            ConnInfo::decode(&b[..35]),
            Err(WireError::Truncated {
                needed: 36,
                got: 35
            })
        ));
        let ep = ci.to_endpoint(TUTORIAL_BUF_SIZE).unwrap();
        assert_eq!(ep.psn, 0);
        assert_eq!(ep.mtu, Mtu::MTU_1024);
        assert_eq!(ep.regions[0].len, 4096);
        assert_eq!(ConnInfo::from_endpoint(&ep), Ok(ci));
    }

    #[test]
    fn refusals() {
        let valid = ConnInfo {
            qpn: 2,
            ..ConnInfo::default()
        };
        let ci = ConnInfo {
            qpn: 1 << 24,
            ..valid
        };
        assert!(ci.to_endpoint(1).is_err());
        for qpn in [0, 1, 0xFF_FFFF] {
            let ci = ConnInfo { qpn, ..valid };
            assert_eq!(ci.to_endpoint(1), Err(WireError::ReservedQpn(qpn)));
        }
        let ci = ConnInfo {
            lid: 1 << 16,
            ..valid
        };
        assert!(ci.to_endpoint(1).is_err());
        let ci = ConnInfo {
            addr: u64::MAX,
            ..valid
        };
        assert!(ci.to_endpoint(1).is_err());
        let mut ep = valid.to_endpoint(8).unwrap();
        for qpn in [1, 0xFF_FFFF] {
            ep.qpn = qpn;
            assert_eq!(
                ConnInfo::from_endpoint(&ep),
                Err(WireError::ReservedQpn(qpn))
            );
        }
        ep.qpn = 2;
        ep.psn = 1;
        assert!(ConnInfo::from_endpoint(&ep).is_err());
        ep.psn = 0;
        ep.mtu = Mtu::MTU_4096;
        assert!(ConnInfo::from_endpoint(&ep).is_err());
        ep.mtu = Mtu::MTU_1024;
        ep.regions.clear();
        assert!(ConnInfo::from_endpoint(&ep).is_err());
    }
}
