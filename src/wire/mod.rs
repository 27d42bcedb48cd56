//! The crate's versioned wire format for exchanging [`Endpoint`]s.
//!
//! Two processes on different hosts (possibly different endianness,
//! possibly different versions of this crate) must agree on every byte, so
//! nothing here depends on Rust struct layout: each field is written
//! big-endian at a fixed place, after a header that names the format
//! (magic), its version, the message kind and the exact body length. A
//! reader takes the fixed-size header first and validates it with
//! [`parse_header`] *before* reading the body, so a peer claiming a huge
//! body is refused without allocating or waiting for it; [`check_prefix`]
//! even refuses a bad magic, version or kind before the header is whole.
//!
//! # Conversation
//!
//! The client speaks first: it sends a [`Kind::Hello`] carrying its
//! endpoint and, when the server asks for one, a [`Token`]. The server
//! validates the whole hello (format, token, endpoint) before it reveals
//! anything, and answers a valid one with a [`Kind::Reply`] carrying its
//! own endpoint. A hello it refuses gets no reply at all: whoever cannot
//! produce a valid hello (a port scanner, an HTTP health check, a client
//! without the token) learns nothing, least of all an `rkey`.
//!
//! # Layout (version 2)
//!
//! | offset        | size | field                                        |
//! |---------------|------|----------------------------------------------|
//! | 0             | 4    | magic `b"VRBS"` (`0x56524253`)               |
//! | 4             | 2    | version, `2`                                 |
//! | 6             | 1    | kind: `1` hello, `2` reply                   |
//! | 7             | 1    | token length `t`, `0..=64`; `0` in a reply   |
//! | 8             | 2    | region count `n`, `0..=64`                   |
//! | 10            | 4    | body length, exactly `t + 28 + 20 × n`       |
//! | 14            | t    | token (hello only)                           |
//! | 14 + t        | 4    | qpn: 24 bits, neither 0 nor 1                |
//! | 18 + t        | 4    | psn (top 8 bits zero)                        |
//! | 22 + t        | 2    | lid                                          |
//! | 24 + t        | 2    | mtu code (`enum ibv_mtu`, `1..=5`)           |
//! | 26 + t        | 16   | gid (raw bytes, as in `union ibv_gid`)       |
//! | 42 + t + 20 i | 8    | region `i` addr                              |
//! | 50 + t + 20 i | 8    | region `i` len (addr + len fits in `u64`)    |
//! | 58 + t + 20 i | 4    | region `i` rkey                              |
//!
//! Integers are big-endian. Every bit is either meaningful or required to
//! be zero, so the encoding is canonical: [`decode`] accepts exactly the
//! byte strings [`encode`] produces.
//!
//! Version 1 (12-byte header, no kind, no token, both sides writing
//! first) is refused with [`WireError::BadVersion`]: its server revealed
//! its endpoint to whoever connected.
//!
//! The primer's raw `struct conn_info` format is in [`tutorial`].

use crate::endpoint::{Endpoint, MAX_REGIONS};

mod codec;
mod error;
mod header;
mod token;
pub mod tutorial;

#[cfg(test)]
mod tests;

pub use codec::{decode, encode, encode_into, encoded_len};
pub use error::WireError;
pub use header::{check_prefix, parse_header, Header};
pub use token::{Token, MAX_TOKEN_LEN};

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

/// Smallest QPN a peer may name: 0 and 1 are the special SMI and GSI
/// queue pairs, which no reliable-connected queue pair has.
pub const MIN_PEER_QPN: u32 = 2;

/// The header length as a function, for readers written against the
/// streaming API: read this many bytes, then call [`parse_header`].
pub const fn header_len() -> usize {
    HEADER_LEN
}

/// The body length a token of `token_len` bytes and `region_count`
/// regions imply.
pub const fn body_len_for(token_len: usize, region_count: usize) -> usize {
    token_len + BODY_FIXED_LEN + REGION_LEN * region_count
}

/// Which way a message travels.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    /// Client to server, first: the client's endpoint and maybe a token.
    Hello = 1,
    /// Server to client, only after a valid hello: the server's endpoint.
    Reply = 2,
}

impl Kind {
    /// The kind byte on the wire.
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// The kind a wire byte names, if any.
    pub const fn from_code(code: u8) -> Option<Kind> {
        match code {
            1 => Some(Kind::Hello),
            2 => Some(Kind::Reply),
            _ => None,
        }
    }
}

/// One message: an endpoint, which way it travels, and (hello only) the
/// token the client presents.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Message {
    /// Hello or reply.
    pub kind: Kind,
    /// The token a hello presents; always `None` in a reply.
    pub token: Option<Token>,
    /// The sender's endpoint.
    pub endpoint: Endpoint,
}

impl Message {
    /// A client's hello.
    pub fn hello(endpoint: Endpoint, token: Option<Token>) -> Message {
        Message {
            kind: Kind::Hello,
            token,
            endpoint,
        }
    }

    /// A server's reply.
    pub fn reply(endpoint: Endpoint) -> Message {
        Message {
            kind: Kind::Reply,
            token: None,
            endpoint,
        }
    }

    /// What both [`encode`] and [`decode`] require: the endpoint passes
    /// [`Endpoint::validate`] (24-bit QPN and PSN, known MTU, at most
    /// [`MAX_REGIONS`] regions none of which wraps around), its QPN is
    /// at least [`MIN_PEER_QPN`], and a reply carries no token.
    pub fn validate(&self) -> Result<(), WireError> {
        self.endpoint.validate()?;
        if self.endpoint.qpn < MIN_PEER_QPN {
            return Err(WireError::ReservedQpn(self.endpoint.qpn));
        }
        if self.kind == Kind::Reply && self.token.is_some() {
            return Err(WireError::Inconsistent("a reply carries no token"));
        }
        Ok(())
    }
}
