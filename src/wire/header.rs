//! The fixed-size header, checked before a reader commits to the body.

use super::error::WireError;
use super::layout::{body_len_for, HEADER_LEN, MAGIC, MAX_BODY_LEN, VERSION};
use super::message::Kind;
use crate::endpoint::MAX_REGIONS;

use super::layout::MAX_TOKEN_LEN;
use super::reader::Reader;

/// A header that passed [`parse_header`]: what the body will hold.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Header {
    /// Hello (client to server) or reply (server to client).
    pub kind: Kind,
    /// Token bytes at the start of the body (0 = none; always 0 in a reply).
    pub token_len: usize,
    /// Regions in the body, at most [`MAX_REGIONS`].
    pub region_count: usize,
    /// Body length: exactly [`body_len_for`]`(token_len, region_count)`,
    /// at most [`MAX_BODY_LEN`].
    pub body_len: usize,
}

/// Checks the header fields that `prefix` (the first bytes received so
/// far, possibly fewer than [`HEADER_LEN`]) holds completely: magic once
/// 4 bytes are in, version once 6, kind once 7.
///
/// A reader calls this after every partial read, so a peer sending
/// garbage or an HTTP probe shorter than a header is refused at once
/// rather than when its deadline passes. Fields not yet complete are not
/// judged.
pub fn check_prefix(prefix: &[u8]) -> Result<(), WireError> {
    if let Some(magic) = prefix.first_chunk::<4>() {
        if *magic != MAGIC {
            return Err(WireError::BadMagic(u32::from_be_bytes(*magic)));
        }
    }
    if let Some(&[_, _, _, _, hi, lo]) = prefix.first_chunk::<6>() {
        let version = u16::from_be_bytes([hi, lo]);
        if version != VERSION {
            return Err(WireError::BadVersion(version));
        }
    }
    if let Some(&code) = prefix.get(6) {
        Kind::from_code(code).ok_or(WireError::BadKind(code))?;
    }
    Ok(())
}

/// Validates a message header and returns what the body will hold.
///
/// `buf` must start with at least [`HEADER_LEN`] bytes; anything after
/// them is ignored. Checks, in order: magic, version and kind as far as
/// `buf` holds them ([`check_prefix`]), length, then body
/// length ≤ [`MAX_BODY_LEN`], region count ≤ [`MAX_REGIONS`], token
/// length ≤ [`MAX_TOKEN_LEN`] (0 in a reply), and body length ==
/// `token + 28 + 20 × count`. A reader calls this before reading the
/// body, so the length it returns is safe to read into a
/// [`super::MAX_MESSAGE_LEN`] buffer.
pub fn parse_header(buf: &[u8]) -> Result<Header, WireError> {
    // A bad magic says more than "truncated", even in a short buffer.
    check_prefix(buf)?;
    let header = Reader::new(buf).bytes::<HEADER_LEN>()?;
    let mut r = Reader::new(&header);
    r.bytes::<6>()?; // magic and version: checked above
    let [code, token_len] = r.bytes::<2>()?;
    let kind = Kind::from_code(code).ok_or(WireError::BadKind(code))?;
    let token_len = usize::from(token_len);
    let region_count = usize::from(r.u16()?);
    // u32 → usize cannot lose bits on the 32/64-bit targets verbs runs on;
    // saturate anyway so a 16-bit build still refuses instead of wrapping.
    let body_len = usize::try_from(r.u32()?).unwrap_or(usize::MAX);
    if body_len > MAX_BODY_LEN {
        return Err(WireError::Oversized {
            claimed: body_len,
            max: MAX_BODY_LEN,
        });
    }
    if region_count > MAX_REGIONS {
        return Err(WireError::Inconsistent(
            "region count above MAX_REGIONS (64)",
        ));
    }
    if token_len > MAX_TOKEN_LEN {
        return Err(WireError::Inconsistent("token longer than 64 bytes"));
    }
    if kind == Kind::Reply && token_len != 0 {
        return Err(WireError::Inconsistent("a reply carries no token"));
    }
    if body_len != body_len_for(token_len, region_count) {
        return Err(WireError::Inconsistent(
            "body length differs from token + 28 + 20 x region count",
        ));
    }
    Ok(Header {
        kind,
        token_len,
        region_count,
        body_len,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(kind: u8, token_len: u8, count: u16, body_len: u32) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[..4].copy_from_slice(&MAGIC);
        h[4..6].copy_from_slice(&VERSION.to_be_bytes());
        h[6] = kind;
        h[7] = token_len;
        h[8..10].copy_from_slice(&count.to_be_bytes());
        h[10..14].copy_from_slice(&body_len.to_be_bytes());
        h
    }

    #[test]
    fn valid_headers() {
        let h = parse_header(&header(1, 5, 2, 5 + 28 + 40)).unwrap();
        assert_eq!(
            h,
            Header {
                kind: Kind::Hello,
                token_len: 5,
                region_count: 2,
                body_len: 73
            }
        );
        assert_eq!(
            parse_header(&header(2, 0, 0, 28)).unwrap().kind,
            Kind::Reply
        );
        let max = header(1, 64, 64, MAX_BODY_LEN as u32);
        assert_eq!(parse_header(&max).unwrap().body_len, MAX_BODY_LEN);
    }

    #[test]
    fn refusals_in_order() {
        assert_eq!(
            parse_header(b"GET /"),
            Err(WireError::BadMagic(0x4745_5420))
        );
        assert_eq!(
            parse_header(&header(1, 0, 0, 28)[..13]),
            Err(WireError::Truncated {
                needed: 14,
                got: 13
            })
        );
        let mut h = header(1, 0, 0, 28);
        h[4..6].copy_from_slice(&1u16.to_be_bytes());
        assert_eq!(parse_header(&h), Err(WireError::BadVersion(1)));
        assert_eq!(
            parse_header(&header(3, 0, 0, 28)),
            Err(WireError::BadKind(3))
        );
        let huge = parse_header(&header(1, 0, 0, u32::MAX));
        assert!(matches!(huge, Err(WireError::Oversized { .. })));
        let inconsistent =
            |h: [u8; HEADER_LEN]| matches!(parse_header(&h), Err(WireError::Inconsistent(_)));
        assert!(inconsistent(header(1, 0, 65, 28)), "count above 64");
        assert!(inconsistent(header(1, 65, 0, 65 + 28)), "token above 64");
        assert!(inconsistent(header(2, 1, 0, 29)), "reply with a token");
        assert!(inconsistent(header(1, 0, 1, 28)), "length ignores a region");
        assert!(
            inconsistent(header(1, 1, 0, 28)),
            "length ignores the token"
        );
    }

    #[test]
    fn prefixes_fail_as_soon_as_a_field_is_whole() {
        assert_eq!(check_prefix(b""), Ok(()));
        assert_eq!(check_prefix(b"GE"), Ok(()), "half a magic is not judged");
        assert_eq!(check_prefix(b"GET "), Err(WireError::BadMagic(0x4745_5420)));
        assert_eq!(check_prefix(b"VRBS\0"), Ok(()));
        assert_eq!(check_prefix(b"VRBS\0\x01"), Err(WireError::BadVersion(1)));
        assert_eq!(check_prefix(b"VRBS\0\x02"), Ok(()));
        assert_eq!(check_prefix(b"VRBS\0\x02\x00"), Err(WireError::BadKind(0)));
        assert_eq!(check_prefix(&header(2, 0, 0, 28)), Ok(()));
    }
}
