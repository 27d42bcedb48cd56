//! What can be wrong with a message, said so that a log line explains it.

use core::fmt;

use super::layout::{MAGIC, VERSION};
use crate::endpoint::EndpointError;

/// What was wrong with a message (or with one we tried to encode).
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
        /// Largest valid body length ([`super::MAX_BODY_LEN`]).
        max: usize,
    },
    /// The first four bytes (read big-endian) are not [`MAGIC`].
    BadMagic(u32),
    /// The version field is not [`VERSION`].
    BadVersion(u16),
    /// The kind byte is neither a hello (1) nor a reply (2).
    BadKind(u8),
    /// The endpoint names QPN 0 or 1, the special queue pairs (SMI and
    /// GSI), or `0xFFFFFF`, the multicast QPN: no reliable-connected peer
    /// can have them.
    ReservedQpn(u32),
    /// The lengths disagree or a field is out of range; says which.
    Inconsistent(&'static str),
    /// [`super::encode_into`] was given a buffer shorter than the message.
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
            WireError::BadMagic(magic) => {
                write!(f, "bad magic {magic:#010x} (")?;
                // Printable, so a log shows "GET " for an HTTP probe.
                for b in magic.to_be_bytes() {
                    write!(f, "{}", b.escape_ascii())?;
                }
                write!(
                    f,
                    "), expected {:#010x} (VRBS): the peer does not speak this protocol",
                    u32::from_be_bytes(MAGIC)
                )
            }
            WireError::BadVersion(version) => {
                write!(f, "unsupported wire version {version}: expected {VERSION}")
            }
            WireError::BadKind(kind) => {
                write!(f, "unknown message kind {kind}: expected 1 (hello) or 2 (reply)")
            }
            WireError::ReservedQpn(qpn) => write!(
                f,
                "qpn {qpn} is reserved (0 is SMI, 1 is GSI, 16777215 = 0xffffff is multicast): \
                 no reliable-connected peer has it"
            ),
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
    /// An invalid endpoint is an inconsistent message; a reserved QPN
    /// says which.
    fn from(e: EndpointError) -> Self {
        match e {
            EndpointError::ReservedQpn(qpn) => WireError::ReservedQpn(qpn),
            e => WireError::Inconsistent(e.reason()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;

    #[test]
    fn messages_name_the_fault() {
        let magic = WireError::BadMagic(u32::from_be_bytes(*b"GET ")).to_string();
        assert!(magic.contains("0x47455420 (GET )"), "{magic}");
        assert!(magic.contains("0x56524253"), "{magic}");
        let binary = WireError::BadMagic(0x00ff_0a41).to_string();
        assert!(binary.contains(r"(\x00\xff\nA)"), "{binary}");
        assert!(WireError::BadVersion(1).to_string().contains("expected 2"));
        assert!(WireError::ReservedQpn(1)
            .to_string()
            .contains("qpn 1 is reserved"));
        let multicast = WireError::ReservedQpn(0xFF_FFFF).to_string();
        assert!(
            multicast.contains("qpn 16777215 is reserved"),
            "{multicast}"
        );
        assert!(WireError::BadKind(9).to_string().contains("kind 9"));
    }
}
