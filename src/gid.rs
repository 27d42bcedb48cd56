//! The 128-bit Global Identifier (GID) that addresses a port on the fabric.
//!
//! On RoCE the GID *is* the port's IP address (IPv6, or IPv4 mapped into
//! IPv6 as `::ffff:a.b.c.d`); on InfiniBand it is a 64-bit subnet prefix
//! followed by a 64-bit interface id. Either way it travels as 16 raw
//! bytes in network order, which is what this type stores: no
//! interpretation happens until a caller asks for one.

use core::fmt;

/// A port's 128-bit Global Identifier, kept as the 16 raw bytes of
/// `union ibv_gid` (network order) so it round-trips exactly.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid {
    raw: [u8; 16],
}

impl Gid {
    /// The all-zero GID, which a port reports for an unpopulated GID
    /// table slot; connecting to it never works.
    pub const ZERO: Gid = Gid { raw: [0; 16] };

    /// Wraps the 16 bytes as read from `union ibv_gid` (network order).
    pub const fn from_raw(raw: [u8; 16]) -> Self {
        Gid { raw }
    }

    /// Builds the IPv4-mapped GID (`::ffff:a.b.c.d`) that RoCEv2 uses for
    /// an IPv4 interface address.
    pub const fn from_ipv4(octets: [u8; 4]) -> Self {
        let mut raw = [0u8; 16];
        raw[10] = 0xff;
        raw[11] = 0xff;
        raw[12] = octets[0];
        raw[13] = octets[1];
        raw[14] = octets[2];
        raw[15] = octets[3];
        Gid { raw }
    }

    /// The 16 raw bytes, by value, ready to copy into `union ibv_gid`.
    pub const fn raw(&self) -> [u8; 16] {
        self.raw
    }

    /// The 16 raw bytes, borrowed, for hashing or writing without a copy.
    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.raw
    }

    /// True for the all-zero GID: an empty GID table slot, so a caller
    /// can refuse it before a `modify_qp` fails obscurely.
    pub fn is_zero(&self) -> bool {
        self.raw == [0; 16]
    }

    /// True for `fe80::/10`: the port's link-local GID (RoCEv1 / IB
    /// default), which is only routable on the local link.
    pub const fn is_link_local(&self) -> bool {
        self.raw[0] == 0xfe && (self.raw[1] & 0xc0) == 0x80
    }

    /// The IPv4 address of an IPv4-mapped GID (`::ffff:a.b.c.d`, what
    /// RoCEv2 uses on an IPv4 interface), or `None` for any other GID.
    pub fn ipv4(&self) -> Option<[u8; 4]> {
        if self.raw[..10] == [0; 10] && self.raw[10] == 0xff && self.raw[11] == 0xff {
            Some([self.raw[12], self.raw[13], self.raw[14], self.raw[15]])
        } else {
            None
        }
    }

    /// The upper 64 bits read big-endian: the InfiniBand subnet prefix
    /// (`ibv_gid.global.subnet_prefix` in host order).
    pub const fn subnet_prefix(&self) -> u64 {
        let r = &self.raw;
        u64::from_be_bytes([r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]])
    }

    /// The lower 64 bits read big-endian: the InfiniBand interface id
    /// (`ibv_gid.global.interface_id` in host order).
    pub const fn interface_id(&self) -> u64 {
        let r = &self.raw;
        u64::from_be_bytes([r[8], r[9], r[10], r[11], r[12], r[13], r[14], r[15]])
    }

    /// The eight 16-bit groups of the IPv6 text form.
    fn groups(&self) -> [u16; 8] {
        let mut g = [0u16; 8];
        for (i, slot) in g.iter_mut().enumerate() {
            *slot = u16::from_be_bytes([self.raw[2 * i], self.raw[2 * i + 1]]);
        }
        g
    }

    /// Writes the RFC 5952 text form (lower-case hex, no leading zeros,
    /// the longest run of two or more zero groups — the first on a tie —
    /// written as `::`, IPv4-mapped addresses in dotted form).
    fn write_text(&self, w: &mut impl fmt::Write) -> fmt::Result {
        if let Some([a, b, c, d]) = self.ipv4() {
            return write!(w, "::ffff:{a}.{b}.{c}.{d}");
        }
        let g = self.groups();
        // Longest run of zero groups; a run of one is not compressed.
        let (mut best_start, mut best_len) = (0usize, 0usize);
        let mut i = 0;
        while i < g.len() {
            if g[i] == 0 {
                let start = i;
                while i < g.len() && g[i] == 0 {
                    i += 1;
                }
                if i - start > best_len {
                    best_start = start;
                    best_len = i - start;
                }
            } else {
                i += 1;
            }
        }
        if best_len < 2 {
            return write_groups(w, &g);
        }
        write_groups(w, &g[..best_start])?;
        w.write_str("::")?;
        write_groups(w, &g[best_start + best_len..])
    }
}

/// Writes groups as `x:y:z` (nothing for an empty slice).
fn write_groups(w: &mut impl fmt::Write, groups: &[u16]) -> fmt::Result {
    for (i, group) in groups.iter().enumerate() {
        if i > 0 {
            w.write_str(":")?;
        }
        write!(w, "{group:x}")?;
    }
    Ok(())
}

/// A stack buffer big enough for any GID's text form, so `Display` can
/// honour width/alignment flags (via `Formatter::pad`) without `alloc`.
struct TextBuf {
    bytes: [u8; 48],
    len: usize,
}

impl fmt::Write for TextBuf {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len.checked_add(s.len()).ok_or(fmt::Error)?;
        let dst = self.bytes.get_mut(self.len..end).ok_or(fmt::Error)?;
        dst.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

impl fmt::Display for Gid {
    /// IPv6 text form per RFC 5952, e.g. `fe80::1` or `::ffff:10.0.0.1`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut buf = TextBuf {
            bytes: [0; 48],
            len: 0,
        };
        self.write_text(&mut buf)?;
        let text = core::str::from_utf8(&buf.bytes[..buf.len]).map_err(|_| fmt::Error)?;
        f.pad(text)
    }
}

impl fmt::Debug for Gid {
    /// Same as `Display`: the address form is what a reader wants to see.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl From<[u8; 16]> for Gid {
    /// Same as [`Gid::from_raw`].
    fn from(raw: [u8; 16]) -> Self {
        Gid::from_raw(raw)
    }
}

impl From<Gid> for [u8; 16] {
    /// Same as [`Gid::raw`].
    fn from(gid: Gid) -> Self {
        gid.raw
    }
}

impl From<core::net::Ipv6Addr> for Gid {
    /// A RoCE GID is the interface's IPv6 address, so one parsed from
    /// text (`"fe80::1".parse::<Ipv6Addr>()`) converts directly.
    fn from(addr: core::net::Ipv6Addr) -> Self {
        Gid::from_raw(addr.octets())
    }
}

impl From<Gid> for core::net::Ipv6Addr {
    /// The GID's 16 bytes read as an IPv6 address.
    fn from(gid: Gid) -> Self {
        core::net::Ipv6Addr::from(gid.raw)
    }
}

#[cfg(test)]
mod tests {
    use super::Gid;
    use alloc::format;
    use alloc::string::ToString;
    use core::net::Ipv6Addr;

    fn gid(s: &str) -> Gid {
        Gid::from(s.parse::<Ipv6Addr>().unwrap())
    }

    #[test]
    fn text_form() {
        let cases = [
            ("::", "::"),
            ("::1", "::1"),
            ("1::", "1::"),
            ("fe80::1", "fe80::1"),
            ("fe80:0:0:0:0:0:0:1", "fe80::1"),
            ("2001:db8:0:0:1:0:0:1", "2001:db8::1:0:0:1"),
            ("2001:db8:0:1:0:0:0:1", "2001:db8:0:1::1"),
            ("2001:db8:1:1:1:1:1:0", "2001:db8:1:1:1:1:1:0"),
            ("2001:db8:0:1:1:1:1:1", "2001:db8:0:1:1:1:1:1"),
            ("1:0:1:0:1:0:1:0", "1:0:1:0:1:0:1:0"),
            (
                "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
                "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            ),
            ("::ffff:10.0.0.1", "::ffff:10.0.0.1"),
            ("::ffff:0.0.0.0", "::ffff:0.0.0.0"),
            ("::fffe:a00:1", "::fffe:a00:1"),
            ("0:0:0:0:0:1:ffff:a00", "::1:ffff:a00"),
        ];
        for (input, want) in cases {
            assert_eq!(gid(input).to_string(), want, "{input}");
            assert_eq!(format!("{:?}", gid(input)), want, "{input}");
        }
    }

    #[test]
    fn text_form_matches_core_net() {
        // Exhaustive over which groups are zero (2^8 patterns) and a few
        // non-zero values: core::net::Ipv6Addr also follows RFC 5952.
        // Under Miri (safe code, and a minute of formatting) every 16th.
        let step = if cfg!(miri) { 16 } else { 1 };
        for mask in (0u32..256).step_by(step) {
            for fill in [1u16, 0xabc, 0xffff] {
                let mut raw = [0u8; 16];
                for i in 0..8 {
                    if mask & (1 << i) != 0 {
                        let v = fill.wrapping_add(i as u16);
                        raw[2 * i..2 * i + 2].copy_from_slice(&v.to_be_bytes());
                    }
                }
                let g = Gid::from_raw(raw);
                assert_eq!(g.to_string(), Ipv6Addr::from(raw).to_string(), "{raw:?}");
            }
        }
    }

    #[test]
    fn padding_flags_apply() {
        assert_eq!(format!("[{:>8}]", gid("::1")), "[     ::1]");
        assert_eq!(format!("[{:<6}]", gid("::")), "[::    ]");
    }

    #[test]
    fn accessors() {
        let g = Gid::from_ipv4([10, 0, 0, 1]);
        assert_eq!(g.ipv4(), Some([10, 0, 0, 1]));
        assert_eq!(g, gid("::ffff:10.0.0.1"));
        assert!(!g.is_link_local());
        assert!(!g.is_zero());
        assert!(Gid::ZERO.is_zero());
        assert!(Gid::default().is_zero());
        assert_eq!(Gid::ZERO.ipv4(), None);
        assert!(gid("fe80::1").is_link_local());
        assert!(gid("febf::1").is_link_local());
        assert!(!gid("fec0::1").is_link_local());
        let ib = gid("fe80::2:c903:a:b1c2");
        assert_eq!(ib.subnet_prefix(), 0xfe80_0000_0000_0000);
        assert_eq!(ib.interface_id(), 0x0002_c903_000a_b1c2);
        assert_eq!(ib.raw(), *ib.as_bytes());
        assert_eq!(<[u8; 16]>::from(ib), ib.raw());
        assert_eq!(
            Ipv6Addr::from(ib),
            "fe80::2:c903:a:b1c2".parse::<Ipv6Addr>().unwrap()
        );
    }
}
