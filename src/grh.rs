//! The 40 bytes that start every UD receive buffer: the Global Route
//! Header the message came with (InfiniBand with a GRH, RoCE v1), or on
//! RoCE v2 over IPv4 the packet's IPv4 header in the last 20 of them (the
//! first 20 are reserved). A UD receive's payload starts after them
//! ([`GRH_LEN`]); the completion says whether they were written
//! (`IBV_WC_GRH`). What a server needs from them is the sender's GID, to
//! build the address handle of its reply.

use crate::gid::Gid;

/// Bytes a UD receive buffer reserves for the GRH before the payload.
pub const GRH_LEN: usize = 40;

/// The GRH area of a UD receive, read as the header it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grh {
    bytes: [u8; GRH_LEN],
}

impl Grh {
    /// The first [`GRH_LEN`] bytes of a UD receive buffer; `None` if
    /// `buf` is shorter.
    pub fn from_bytes(buf: &[u8]) -> Option<Grh> {
        let bytes: [u8; GRH_LEN] = buf.get(..GRH_LEN)?.try_into().ok()?;
        Some(Grh { bytes })
    }

    /// True when the area holds an IPv6-style GRH (version 6 in its first
    /// nibble: InfiniBand, RoCE v1, RoCE v2 over IPv6).
    pub fn is_ipv6(&self) -> bool {
        self.bytes[0] >> 4 == 6
    }

    /// True when the last 20 bytes hold an IPv4 header (RoCE v2 over
    /// IPv4: version 4, a 20-byte header).
    pub fn is_ipv4(&self) -> bool {
        !self.is_ipv6() && self.bytes[20] == 0x45
    }

    /// The sender's GID: the GRH's source GID, or for an IPv4 header its
    /// source address as an IPv4-mapped GID (`::ffff:a.b.c.d`, the entry
    /// RoCE v2 uses for that address). `None` when the area holds neither
    /// (the completion had no `IBV_WC_GRH`: nothing was written there).
    pub fn source_gid(&self) -> Option<Gid> {
        if self.is_ipv6() {
            let mut raw = [0u8; 16];
            raw.copy_from_slice(&self.bytes[8..24]);
            Some(Gid::from_raw(raw))
        } else if self.is_ipv4() {
            let mut ip = [0u8; 4];
            ip.copy_from_slice(&self.bytes[32..36]);
            Some(Gid::from_ipv4(ip))
        } else {
            None
        }
    }

    /// The destination GID (the receiver's own), as [`Grh::source_gid`].
    pub fn dest_gid(&self) -> Option<Gid> {
        if self.is_ipv6() {
            let mut raw = [0u8; 16];
            raw.copy_from_slice(&self.bytes[24..40]);
            Some(Gid::from_raw(raw))
        } else if self.is_ipv4() {
            let mut ip = [0u8; 4];
            ip.copy_from_slice(&self.bytes[36..40]);
            Some(Gid::from_ipv4(ip))
        } else {
            None
        }
    }

    /// The hop limit (IPv4: the TTL) the packet arrived with.
    pub fn hop_limit(&self) -> Option<u8> {
        if self.is_ipv6() {
            Some(self.bytes[7])
        } else if self.is_ipv4() {
            Some(self.bytes[28])
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv4_header_in_the_last_20_bytes_gives_a_mapped_gid() {
        let mut b = [0u8; GRH_LEN];
        b[20] = 0x45;
        b[28] = 64;
        b[32..36].copy_from_slice(&[10, 78, 0, 2]);
        b[36..40].copy_from_slice(&[10, 78, 0, 1]);
        let g = Grh::from_bytes(&b).unwrap();
        assert!(g.is_ipv4() && !g.is_ipv6());
        assert_eq!(g.source_gid(), Some(Gid::from_ipv4([10, 78, 0, 2])));
        assert_eq!(g.dest_gid(), Some(Gid::from_ipv4([10, 78, 0, 1])));
        assert_eq!(g.hop_limit(), Some(64));
    }

    #[test]
    fn an_ipv6_grh_gives_its_source_gid() {
        let mut b = [0u8; 48];
        b[0] = 0x60;
        b[7] = 1;
        for (i, x) in b[8..24].iter_mut().enumerate() {
            *x = 0xa0 + i as u8;
        }
        let g = Grh::from_bytes(&b).unwrap();
        assert!(g.is_ipv6());
        assert_eq!(g.source_gid().unwrap().raw()[0], 0xa0);
        assert_eq!(g.source_gid().unwrap().raw()[15], 0xa0 + 15);
        assert_eq!(g.hop_limit(), Some(1));
    }

    #[test]
    fn an_empty_area_or_a_short_buffer_is_no_header() {
        assert_eq!(Grh::from_bytes(&[0u8; GRH_LEN]).unwrap().source_gid(), None);
        assert!(Grh::from_bytes(&[0u8; GRH_LEN - 1]).is_none());
    }
}
