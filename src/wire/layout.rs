//! The wire format's constants: magic, version, and every length.

use crate::endpoint::MAX_REGIONS;

/// Longest token a hello can carry.
pub const MAX_TOKEN_LEN: usize = 64;

/// First four bytes of every message: tells a confused peer (a port
/// scanner, the primer's C client, an HTTP probe) apart at once.
pub const MAGIC: [u8; 4] = *b"VRBS";

/// The wire format version this build writes and the only one it reads.
pub const VERSION: u16 = 2;

/// Length of the fixed header (magic, version, kind, token length,
/// region count, body length).
pub const HEADER_LEN: usize = 14;

/// Length of the endpoint's fixed fields (qpn, psn, lid, mtu, gid).
pub const BODY_FIXED_LEN: usize = 28;

/// Length of one encoded region (addr, len, rkey).
pub const REGION_LEN: usize = 20;

/// Largest body a valid message can have (a hello with a
/// [`MAX_TOKEN_LEN`] token and [`MAX_REGIONS`] regions).
pub const MAX_BODY_LEN: usize = body_len_for(MAX_TOKEN_LEN, MAX_REGIONS);

/// Largest valid message, header included: a buffer this big holds any
/// message, so readers never need to allocate per peer claim.
pub const MAX_MESSAGE_LEN: usize = HEADER_LEN + MAX_BODY_LEN;

pub use crate::endpoint::{is_peer_qpn, MAX_PEER_QPN, MIN_PEER_QPN};

/// The header length as a function, for readers written against the
/// streaming API: read this many bytes, then call [`super::parse_header`].
pub const fn header_len() -> usize {
    HEADER_LEN
}

/// The body length a token of `token_len` bytes and `region_count`
/// regions imply.
pub const fn body_len_for(token_len: usize, region_count: usize) -> usize {
    token_len + BODY_FIXED_LEN + REGION_LEN * region_count
}
