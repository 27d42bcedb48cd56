//! Encoding and decoding whole messages, canonically.

use alloc::vec::Vec;

use super::error::WireError;
use super::header::parse_header;
use super::layout::{body_len_for, HEADER_LEN, MAGIC, VERSION};
use super::message::Message;
use super::reader::Reader;
use super::token::Token;
use crate::endpoint::{Endpoint, Mtu, RemoteRegion};
use crate::gid::Gid;

/// The exact number of bytes [`encode`] writes for `msg` (whether or not
/// `msg` is valid).
pub fn encoded_len(msg: &Message) -> usize {
    let token_len = msg.token.as_ref().map_or(0, |t| t.as_bytes().len());
    HEADER_LEN + body_len_for(token_len, msg.endpoint.regions.len())
}

/// Decodes one complete message: `buf` must hold exactly the header and
/// the body it announces. Never panics; accepts only canonical messages
/// that pass [`Message::validate`].
pub fn decode(buf: &[u8]) -> Result<Message, WireError> {
    let header = parse_header(buf)?;
    let total = HEADER_LEN + header.body_len;
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
    let mut r = Reader::new(&buf[HEADER_LEN..]);
    let token = match header.token_len {
        0 => None,
        n => Some(Token::new(r.take(n)?)?),
    };
    let qpn = r.u32()?;
    let psn = r.u32()?;
    let lid = r.u16()?;
    let mtu = Mtu(u32::from(r.u16()?));
    let gid = Gid::from_raw(r.bytes::<16>()?);
    let mut regions = Vec::with_capacity(header.region_count);
    for _ in 0..header.region_count {
        regions.push(RemoteRegion {
            addr: r.u64()?,
            len: r.u64()?,
            rkey: r.u32()?,
        });
    }
    let msg = Message {
        kind: header.kind,
        token,
        endpoint: Endpoint {
            qpn,
            psn,
            lid,
            gid,
            mtu,
            regions,
        },
    };
    msg.validate()?;
    Ok(msg)
}

/// Encodes `msg` at the start of `out` and returns the bytes written.
/// Refuses a message that fails [`Message::validate`] (so a peer is never
/// sent what it must reject) and a buffer that is too short; a buffer of
/// [`super::MAX_MESSAGE_LEN`] bytes always suffices.
pub fn encode_into(msg: &Message, out: &mut [u8]) -> Result<usize, WireError> {
    msg.validate()?;
    let len = encoded_len(msg);
    let got = out.len();
    let out = out
        .get_mut(..len)
        .ok_or(WireError::BufferTooSmall { needed: len, got })?;
    let ep = &msg.endpoint;
    let token = msg.token.as_ref().map_or(&[][..], Token::as_bytes);
    // validate() bounded the count by MAX_REGIONS and the token by
    // MAX_TOKEN_LEN, so these fit.
    let too_many = WireError::Inconsistent("more regions than MAX_REGIONS (64)");
    let count = u16::try_from(ep.regions.len()).map_err(|_| too_many)?;
    let body_len = u32::try_from(len - HEADER_LEN).map_err(|_| too_many)?;
    let token_len = u8::try_from(token.len())
        .map_err(|_| WireError::Inconsistent("token longer than 64 bytes"))?;
    let mut w = Writer { out, pos: 0 };
    w.put(&MAGIC);
    w.put(&VERSION.to_be_bytes());
    w.put(&[msg.kind.code(), token_len]);
    w.put(&count.to_be_bytes());
    w.put(&body_len.to_be_bytes());
    w.put(token);
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

/// Encodes `msg` into a new `Vec` of exactly [`encoded_len`] bytes.
pub fn encode(msg: &Message) -> Result<Vec<u8>, WireError> {
    let mut out = alloc::vec![0u8; encoded_len(msg)];
    encode_into(msg, &mut out)?;
    Ok(out)
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
    use super::super::{MAX_BODY_LEN, MAX_MESSAGE_LEN, MAX_TOKEN_LEN};
    use super::*;
    use crate::endpoint::MAX_REGIONS;
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

    const BODY: [u8; 48] = [
        0x00, 0xab, 0xcd, 0xef, 0x00, 0x12, 0x34, 0x56, 0x01, 0x02, 0, 5, // qpn psn lid mtu
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 1, 2, // gid
        0, 0, 0x7f, 0, 0x12, 0x34, 0x50, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0xde, 0xad, 0xbe,
        0xef, // region
    ];

    #[test]
    fn golden_hello_with_token() {
        let msg = Message::hello(sample(), Some(Token::new(b"k3y").unwrap()));
        let bytes = encode(&msg).unwrap();
        let mut want = vec![b'V', b'R', b'B', b'S', 0, 2, 1, 3, 0, 1, 0, 0, 0, 51];
        want.extend_from_slice(b"k3y");
        want.extend_from_slice(&BODY);
        assert_eq!(bytes, want);
        assert_eq!(decode(&bytes).unwrap(), msg);
    }

    #[test]
    fn golden_reply() {
        let msg = Message::reply(sample());
        let bytes = encode(&msg).unwrap();
        let mut want = vec![b'V', b'R', b'B', b'S', 0, 2, 2, 0, 0, 1, 0, 0, 0, 48];
        want.extend_from_slice(&BODY);
        assert_eq!(bytes, want);
        assert_eq!(decode(&bytes).unwrap(), msg);
        assert_eq!(parse_header(&bytes).unwrap().body_len, 48);
    }

    #[test]
    fn limits() {
        assert_eq!(MAX_BODY_LEN, 1372);
        assert_eq!(MAX_MESSAGE_LEN, 1386);
        let mut ep = sample();
        ep.regions = vec![ep.regions[0]; MAX_REGIONS];
        let token = Token::new(&[0xa5; MAX_TOKEN_LEN]).unwrap();
        let mut msg = Message::hello(ep, Some(token));
        let mut buf = [0u8; MAX_MESSAGE_LEN];
        assert_eq!(encode_into(&msg, &mut buf), Ok(MAX_MESSAGE_LEN));
        assert_eq!(decode(&buf).unwrap(), msg);
        assert_eq!(
            encode_into(&msg, &mut buf[..100]),
            Err(WireError::BufferTooSmall {
                needed: MAX_MESSAGE_LEN,
                got: 100
            })
        );
        msg.endpoint.regions.push(msg.endpoint.regions[0]);
        assert!(matches!(encode(&msg), Err(WireError::Inconsistent(_))));
    }

    #[test]
    fn refusals_both_ways() {
        for qpn in [0, 1, 0xFF_FFFF] {
            let mut ep = sample();
            ep.qpn = qpn;
            let msg = Message::reply(ep);
            assert_eq!(encode(&msg), Err(WireError::ReservedQpn(qpn)));
            let mut bytes = encode(&Message::reply(sample())).unwrap();
            bytes[14..18].copy_from_slice(&qpn.to_be_bytes());
            assert_eq!(decode(&bytes), Err(WireError::ReservedQpn(qpn)));
        }
        let mut reply = Message::reply(sample());
        reply.token = Some(Token::new(b"x").unwrap());
        assert!(matches!(encode(&reply), Err(WireError::Inconsistent(_))));
        let bytes = encode(&Message::hello(sample(), None)).unwrap();
        assert_eq!(
            decode(&bytes[..bytes.len() - 1]),
            Err(WireError::Truncated {
                needed: bytes.len(),
                got: bytes.len() - 1
            })
        );
        let mut long = bytes.clone();
        long.push(0);
        assert!(matches!(decode(&long), Err(WireError::Inconsistent(_))));
    }
}
