//! The crate's versioned wire format for exchanging [`Endpoint`](crate::endpoint::Endpoint)s.
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
//! | 14 + t        | 4    | qpn: 24 bits, not 0, 1 or `0xffffff`         |
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

mod codec;
mod error;
mod header;
mod layout;
mod message;
mod reader;
mod token;
pub mod tutorial;

#[cfg(test)]
mod tests;

pub use codec::{decode, encode, encode_into, encoded_len};
pub use error::WireError;
pub use header::{check_prefix, parse_header, Header};
pub use layout::{
    body_len_for, header_len, is_peer_qpn, BODY_FIXED_LEN, HEADER_LEN, MAGIC, MAX_BODY_LEN,
    MAX_MESSAGE_LEN, MAX_PEER_QPN, MAX_TOKEN_LEN, MIN_PEER_QPN, REGION_LEN, VERSION,
};
pub use message::{Kind, Message};
pub use token::Token;
