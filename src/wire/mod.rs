//! The crate's versioned wire format for an [`Endpoint`].
//!
//! Two processes on different hosts (possibly different endianness,
//! possibly different versions of this crate) must agree on every byte, so
//! nothing here depends on Rust struct layout: each field is written
//! big-endian at a fixed offset, after a header that names the format
//! (magic), its version, and the exact body length. A reader takes the
//! fixed-size header first and validates it with [`parse_header`] *before*
//! reading the body, so a peer claiming a huge body is refused without
//! allocating or waiting for it.
//!
//! # Layout (version 1)
//!
//! | offset      | size | field                                        |
//! |-------------|------|----------------------------------------------|
//! | 0           | 4    | magic `b"VRBS"` (`0x56524253`)               |
//! | 4           | 2    | version, `1`                                 |
//! | 6           | 2    | region count `n`, `0..=64`                   |
//! | 8           | 4    | body length, exactly `28 + 20 × n`           |
//! | 12          | 4    | qpn (top 8 bits zero)                        |
//! | 16          | 4    | psn (top 8 bits zero)                        |
//! | 20          | 2    | lid                                          |
//! | 22          | 2    | mtu code (`enum ibv_mtu`, `1..=5`)           |
//! | 24          | 16   | gid (raw bytes, as in `union ibv_gid`)       |
//! | 40 + 20 i   | 8    | region `i` addr                              |
//! | 48 + 20 i   | 8    | region `i` len (addr + len fits in `u64`)    |
//! | 56 + 20 i   | 4    | region `i` rkey                              |
//!
//! Integers are big-endian. Every bit is either meaningful or required to
//! be zero, so the encoding is canonical: [`decode`] accepts exactly the
//! byte strings [`encode`] produces.
//!
//! The primer's raw `struct conn_info` format is in [`tutorial`].

use alloc::vec::Vec;
use core::fmt;

use crate::endpoint::{Endpoint, EndpointError, Mtu, RemoteRegion, MAX_REGIONS};
use crate::gid::Gid;

mod token;
pub mod tutorial;

pub use token::{Token, MAX_TOKEN_LEN};

/// First four bytes of every message: tells a confused peer (a port
/// scanner, the primer's C client, an HTTP probe) apart at once.
pub const MAGIC: [u8; 4] = *b"VRBS";

/// The wire format version this build writes and the only one it reads.
pub const VERSION: u16 = 1;

/// Length of the fixed header (magic, version, region count, body length).
pub const HEADER_LEN: usize = 12;

/// Length of the body without regions (qpn, psn, lid, mtu, gid).
pub const BODY_FIXED_LEN: usize = 28;

/// Length of one encoded region (addr, len, rkey).
pub const REGION_LEN: usize = 20;

/// Largest body a valid message can have (with [`MAX_REGIONS`] regions).
pub const MAX_BODY_LEN: usize = BODY_FIXED_LEN + REGION_LEN * MAX_REGIONS;

/// Largest valid message, header included: a buffer this big holds any
/// message, so readers never need to allocate per peer claim.
pub const MAX_MESSAGE_LEN: usize = HEADER_LEN + MAX_BODY_LEN;

/// The header length as a function, for readers written against the
/// streaming API: read this many bytes, then call [`parse_header`].
pub const fn header_len() -> usize {
    HEADER_LEN
}

/// The body length that `region_count` regions imply.
pub const fn body_len_for(region_count: usize) -> usize {
    BODY_FIXED_LEN + REGION_LEN * region_count
}

/// The exact number of bytes [`encode`] writes for `ep` (whether or not
/// `ep` is valid).
pub fn encoded_len(ep: &Endpoint) -> usize {
    HEADER_LEN + body_len_for(ep.regions.len())
}

/// What was wrong with a message (or with an endpoint we tried to encode).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum WireError {
    /// Fewer bytes than the message needs (header, or header + body).
    Truncated {
        /// Bytes the message needs.
        needed: usize,
        /// Bytes available.
        got: usize,
    },
    /// The header claims a body longer than any valid message has.
    Oversized {
        /// Body length the header claims.
        claimed: usize,
        /// Largest valid body length ([`MAX_BODY_LEN`]).
        max: usize,
    },
    /// The first four bytes (read big-endian) are not [`MAGIC`].
    BadMagic(u32),
    /// The version field is not [`VERSION`].
    BadVersion(u16),
    /// The lengths disagree or a field is out of range; says which.
    Inconsistent(&'static str),
    /// [`encode_into`] was given a buffer shorter than the message.
    BufferTooSmall {
        /// Bytes the message needs.
        needed: usize,
        /// Bytes the buffer has.
        got: usize,
    },
}

impl fmt::Display for WireError {
    /// Says what was wrong and what was expected.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            WireError::Truncated { needed, got } => {
                write!(f, "endpoint message truncated: needed {needed} bytes, got {got}")
            }
            WireError::Oversized { claimed, max } => write!(
                f,
                "endpoint message too large: header claims a {claimed}-byte body, at most {max} allowed"
            ),
            WireError::BadMagic(magic) => write!(
                f,
                "bad magic {magic:#010x}: expected {:#010x} (\"VRBS\"); the peer does not speak this protocol",
                u32::from_be_bytes(MAGIC)
            ),
            WireError::BadVersion(version) => {
                write!(f, "unsupported wire version {version}: expected {VERSION}")
            }
            WireError::Inconsistent(what) => write!(f, "inconsistent endpoint message: {what}"),
            WireError::BufferTooSmall { needed, got } => {
                write!(f, "output buffer too small: message needs {needed} bytes, buffer has {got}")
            }
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for WireError {}

impl From<EndpointError> for WireError {
    /// An invalid endpoint is an inconsistent message.
    fn from(e: EndpointError) -> Self {
        WireError::Inconsistent(e.reason())
    }
}

/// Validates a message header and returns the body length that follows.
///
/// `buf` must start with at least [`HEADER_LEN`] bytes; anything after
/// them is ignored. Checks, in order: length, magic, version, body length
/// ≤ [`MAX_BODY_LEN`], region count ≤ [`MAX_REGIONS`], and body length ==
/// `28 + 20 × count`. A reader calls this before reading the body, so the
/// returned length is safe to read into a [`MAX_MESSAGE_LEN`] buffer.
pub fn parse_header(buf: &[u8]) -> Result<usize, WireError> {
    let mut r = Reader::new(buf);
    let header = r.bytes::<HEADER_LEN>()?;
    let mut r = Reader::new(&header);
    let magic = r.u32()?;
    if magic != u32::from_be_bytes(MAGIC) {
        return Err(WireError::BadMagic(magic));
    }
    let version = r.u16()?;
    if version != VERSION {
        return Err(WireError::BadVersion(version));
    }
    let count = usize::from(r.u16()?);
    // u32 → usize cannot lose bits on the 32/64-bit targets verbs runs on;
    // saturate anyway so a 16-bit build still refuses instead of wrapping.
    let body_len = usize::try_from(r.u32()?).unwrap_or(usize::MAX);
    if body_len > MAX_BODY_LEN {
        return Err(WireError::Oversized {
            claimed: body_len,
            max: MAX_BODY_LEN,
        });
    }
    if count > MAX_REGIONS {
        return Err(WireError::Inconsistent(
            "region count above MAX_REGIONS (64)",
        ));
    }
    if body_len != body_len_for(count) {
        return Err(WireError::Inconsistent(
            "body length differs from 28 + 20 x region count",
        ));
    }
    Ok(body_len)
}

/// Decodes one complete message: `buf` must hold exactly the header and
/// the body it announces. Never panics; accepts only canonical messages
/// whose endpoint passes [`Endpoint::validate`].
pub fn decode(buf: &[u8]) -> Result<Endpoint, WireError> {
    let body_len = parse_header(buf)?;
    let total = HEADER_LEN + body_len;
    if buf.len() < total {
        return Err(WireError::Truncated {
            needed: total,
            got: buf.len(),
        });
    }
    if buf.len() > total {
        return Err(WireError::Inconsistent(
            "trailing bytes after the body the header announces",
        ));
    }
    let count = (body_len - BODY_FIXED_LEN) / REGION_LEN;
    let mut r = Reader::new(buf);
    r.bytes::<HEADER_LEN>()?;
    let qpn = r.u32()?;
    let psn = r.u32()?;
    let lid = r.u16()?;
    let mtu = Mtu(u32::from(r.u16()?));
    let gid = Gid::from_raw(r.bytes::<16>()?);
    let mut regions = Vec::with_capacity(count);
    for _ in 0..count {
        regions.push(RemoteRegion {
            addr: r.u64()?,
            len: r.u64()?,
            rkey: r.u32()?,
        });
    }
    let ep = Endpoint {
        qpn,
        psn,
        lid,
        gid,
        mtu,
        regions,
    };
    ep.validate()?;
    Ok(ep)
}

/// Encodes `ep` at the start of `out` and returns the bytes written.
/// Refuses an endpoint that fails [`Endpoint::validate`] (so a peer is
/// never sent what it must reject) and a buffer that is too short; a
/// buffer of [`MAX_MESSAGE_LEN`] bytes always suffices.
pub fn encode_into(ep: &Endpoint, out: &mut [u8]) -> Result<usize, WireError> {
    ep.validate()?;
    let len = encoded_len(ep);
    let got = out.len();
    let out = out
        .get_mut(..len)
        .ok_or(WireError::BufferTooSmall { needed: len, got })?;
    // validate() bounded the count by MAX_REGIONS, so these fit.
    let count = u16::try_from(ep.regions.len())
        .map_err(|_| WireError::Inconsistent("more regions than MAX_REGIONS (64)"))?;
    let body_len = u32::try_from(len - HEADER_LEN)
        .map_err(|_| WireError::Inconsistent("more regions than MAX_REGIONS (64)"))?;
    let mut w = Writer { out, pos: 0 };
    w.put(&MAGIC);
    w.put(&VERSION.to_be_bytes());
    w.put(&count.to_be_bytes());
    w.put(&body_len.to_be_bytes());
    w.put(&ep.qpn.to_be_bytes());
    w.put(&ep.psn.to_be_bytes());
    w.put(&ep.lid.to_be_bytes());
    // validate() checked the code is 1..=5.
    w.put(&(ep.mtu.0 as u16).to_be_bytes());
    w.put(ep.gid.as_bytes());
    for region in &ep.regions {
        w.put(&region.addr.to_be_bytes());
        w.put(&region.len.to_be_bytes());
        w.put(&region.rkey.to_be_bytes());
    }
    debug_assert_eq!(w.pos, len);
    Ok(len)
}

/// Encodes `ep` into a new `Vec` of exactly [`encoded_len`] bytes.
pub fn encode(ep: &Endpoint) -> Result<Vec<u8>, WireError> {
    let mut out = alloc::vec![0u8; encoded_len(ep)];
    encode_into(ep, &mut out)?;
    Ok(out)
}

/// Bounds-checked big-endian reads: a short input is an error, never a panic.
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }

    fn bytes<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        match self.buf.split_first_chunk::<N>() {
            Some((head, rest)) => {
                self.buf = rest;
                Ok(*head)
            }
            None => Err(WireError::Truncated {
                needed: N,
                got: self.buf.len(),
            }),
        }
    }

    fn u16(&mut self) -> Result<u16, WireError> {
        self.bytes().map(u16::from_be_bytes)
    }

    fn u32(&mut self) -> Result<u32, WireError> {
        self.bytes().map(u32::from_be_bytes)
    }

    fn u64(&mut self) -> Result<u64, WireError> {
        self.bytes().map(u64::from_be_bytes)
    }
}

/// Sequential writes into a buffer already sized to the message.
struct Writer<'a> {
    out: &'a mut [u8],
    pos: usize,
}

impl Writer<'_> {
    fn put(&mut self, bytes: &[u8]) {
        let end = self.pos + bytes.len();
        self.out[self.pos..end].copy_from_slice(bytes);
        self.pos = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    fn sample() -> Endpoint {
        Endpoint {
            qpn: 0x00ab_cdef,
            psn: 0x0012_3456,
            lid: 0x0102,
            gid: Gid::from_ipv4([192, 168, 1, 2]),
            mtu: Mtu::MTU_4096,
            regions: vec![RemoteRegion {
                addr: 0x0000_7f00_1234_5000,
                len: 4096,
                rkey: 0xdead_beef,
            }],
        }
    }

    #[test]
    fn golden_bytes() {
        let bytes = encode(&sample()).unwrap();
        let want: [u8; 60] = [
            b'V', b'R', b'B', b'S', 0, 1, 0, 1, 0, 0, 0, 48, // header
            0x00, 0xab, 0xcd, 0xef, 0x00, 0x12, 0x34, 0x56, 0x01, 0x02, 0,
            5, // qpn psn lid mtu
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 1, 2, // gid
            0, 0, 0x7f, 0, 0x12, 0x34, 0x50, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0xde, 0xad, 0xbe,
            0xef, // region
        ];
        assert_eq!(bytes, want);
        assert_eq!(decode(&bytes).unwrap(), sample());
        assert_eq!(parse_header(&bytes), Ok(48));
    }

    #[test]
    fn limits() {
        assert_eq!(MAX_BODY_LEN, 1308);
        assert_eq!(MAX_MESSAGE_LEN, 1320);
        let mut ep = sample();
        ep.regions = vec![ep.regions[0]; MAX_REGIONS];
        let mut buf = [0u8; MAX_MESSAGE_LEN];
        assert_eq!(encode_into(&ep, &mut buf), Ok(MAX_MESSAGE_LEN));
        assert_eq!(decode(&buf).unwrap(), ep);
        assert_eq!(
            encode_into(&ep, &mut buf[..100]),
            Err(WireError::BufferTooSmall {
                needed: MAX_MESSAGE_LEN,
                got: 100
            })
        );
        ep.regions.push(ep.regions[0]);
        assert!(matches!(encode(&ep), Err(WireError::Inconsistent(_))));
    }
}
