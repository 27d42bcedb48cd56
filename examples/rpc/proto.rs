//! The RPC's message format: a 16-byte header, then `len` payload bytes.
//! Requests and responses share it; a response echoes the request's id.
//!
//! ```text
//!  0      2    3        4          8                 16
//!  | magic | op | status | len (LE) | request id (LE) | payload ...
//! ```

/// Bytes before the payload.
pub const HEADER: usize = 16;
/// First two bytes of every message ("RV").
pub const MAGIC: u16 = 0x5652;

/// What a request asks for. A plain byte on the wire, so an unknown value
/// is just "unknown" (answered with [`Status::UNKNOWN_OP`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Op(pub u8);

impl Op {
    /// The payload back as it came.
    pub const ECHO: Op = Op(1);
    /// The payload back with every byte inverted (the server touches it).
    pub const INVERT: Op = Op(2);
    /// Stop the server (answered first), when it allows it.
    pub const STOP: Op = Op(9);
}

/// A response's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status(pub u8);

impl Status {
    pub const OK: Status = Status(0);
    /// Shorter than a header, wrong magic, or a length that disagrees with
    /// the bytes received.
    pub const MALFORMED: Status = Status(1);
    /// A payload over the server's limit.
    pub const TOO_LARGE: Status = Status(2);
    pub const UNKNOWN_OP: Status = Status(3);
    /// A stop the server does not allow.
    pub const REFUSED: Status = Status(4);

    pub fn name(self) -> &'static str {
        match self {
            Status::OK => "ok",
            Status::MALFORMED => "malformed",
            Status::TOO_LARGE => "too large",
            Status::UNKNOWN_OP => "unknown op",
            Status::REFUSED => "refused",
            _ => "unknown status",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub magic: u16,
    pub op: Op,
    pub status: Status,
    pub len: u32,
    pub id: u64,
}

impl Header {
    pub fn new(op: Op, status: Status, len: u32, id: u64) -> Header {
        Header {
            magic: MAGIC,
            op,
            status,
            len,
            id,
        }
    }

    pub fn encode(&self) -> [u8; HEADER] {
        let mut b = [0u8; HEADER];
        b[0..2].copy_from_slice(&self.magic.to_le_bytes());
        b[2] = self.op.0;
        b[3] = self.status.0;
        b[4..8].copy_from_slice(&self.len.to_le_bytes());
        b[8..16].copy_from_slice(&self.id.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; HEADER]) -> Header {
        Header {
            magic: u16::from_le_bytes([b[0], b[1]]),
            op: Op(b[2]),
            status: Status(b[3]),
            len: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            id: u64::from_le_bytes(b[8..16].try_into().unwrap()),
        }
    }
}

/// The server's verdict on a request of `received` bytes whose first
/// bytes decoded to `h` (`None`: fewer than a header): what to answer.
pub fn judge(h: Option<&Header>, received: usize, max_payload: u32, allow_stop: bool) -> Status {
    let Some(h) = h else {
        return Status::MALFORMED;
    };
    if h.magic != MAGIC || received != HEADER + h.len as usize {
        return Status::MALFORMED;
    }
    if h.len > max_payload {
        return Status::TOO_LARGE;
    }
    match h.op {
        Op::ECHO | Op::INVERT => Status::OK,
        Op::STOP if allow_stop => Status::OK,
        Op::STOP => Status::REFUSED,
        _ => Status::UNKNOWN_OP,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_bad_requests_are_named() {
        let h = Header::new(Op::INVERT, Status::OK, 5, 0x0102_0304_0506_0708);
        assert_eq!(Header::decode(&h.encode()), h);
        assert_eq!(judge(Some(&h), HEADER + 5, 64, false), Status::OK);
        assert_eq!(judge(None, 3, 64, false), Status::MALFORMED);
        assert_eq!(judge(Some(&h), HEADER + 4, 64, false), Status::MALFORMED);
        assert_eq!(
            judge(Some(&Header { magic: 1, ..h }), HEADER + 5, 64, false),
            Status::MALFORMED
        );
        assert_eq!(judge(Some(&h), HEADER + 5, 4, false), Status::TOO_LARGE);
        assert_eq!(
            judge(Some(&Header { op: Op(77), ..h }), HEADER + 5, 64, false),
            Status::UNKNOWN_OP
        );
        assert_eq!(
            judge(Some(&Header { op: Op::STOP, ..h }), HEADER + 5, 64, false),
            Status::REFUSED
        );
    }
}
