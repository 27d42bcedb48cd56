//! Explicit edge cases of the format, one per rule (the mutation fuzzer
//! in `tests/wire_fuzz.rs` covers the space between them). No I/O and
//! small loops, so Miri runs them.

use alloc::string::ToString;
use alloc::vec;
use alloc::vec::Vec;

use super::tutorial::ConnInfo;
use super::*;
use crate::endpoint::{Endpoint, MAX_REGIONS};
use crate::endpoint::{Mtu, RemoteRegion};
use crate::gid::Gid;

fn sample() -> Endpoint {
    Endpoint {
        qpn: 0x12_3456,
        psn: 0xab_cdef,
        lid: 7,
        gid: Gid::from_ipv4([10, 0, 0, 2]),
        mtu: Mtu::MTU_1024,
        regions: vec![
            RemoteRegion {
                addr: 0x1000,
                len: 0x2000,
                rkey: 1,
            },
            RemoteRegion {
                addr: 0x9000,
                len: 0x10,
                rkey: 2,
            },
        ],
    }
}

/// A hello for `sample()` with a 5-byte token: fields start at 19.
fn sample_hello() -> Vec<u8> {
    encode(&Message::hello(
        sample(),
        Some(Token::new(b"token").unwrap()),
    ))
    .unwrap()
}

#[test]
fn round_trip_edges() {
    let mut msg = Message::reply(sample());
    assert_eq!(decode(&encode(&msg).unwrap()).unwrap(), msg);
    msg.endpoint.regions.clear();
    assert_eq!(encode(&msg).unwrap().len(), HEADER_LEN + 28);
    assert_eq!(decode(&encode(&msg).unwrap()).unwrap(), msg);
    let ep = &mut msg.endpoint;
    ep.qpn = MAX_PEER_QPN;
    ep.psn = 0xff_ffff;
    ep.lid = u16::MAX;
    ep.gid = Gid::from_raw([0xff; 16]);
    ep.mtu = Mtu::MTU_4096;
    ep.regions = vec![
        RemoteRegion {
            addr: u64::MAX,
            len: 0,
            rkey: u32::MAX
        };
        MAX_REGIONS
    ];
    let hello = Message::hello(msg.endpoint, Some(Token::new(&[0; MAX_TOKEN_LEN]).unwrap()));
    let bytes = encode(&hello).unwrap();
    assert_eq!(bytes.len(), MAX_MESSAGE_LEN);
    assert_eq!(decode(&bytes).unwrap(), hello);
    let mut lowest = hello.clone();
    lowest.endpoint.qpn = 2;
    assert_eq!(decode(&encode(&lowest).unwrap()).unwrap(), lowest);
}

#[test]
fn truncated_at_every_length() {
    let bytes = sample_hello();
    for cut in 0..bytes.len() {
        let needed = if cut < HEADER_LEN {
            HEADER_LEN
        } else {
            bytes.len()
        };
        assert_eq!(
            decode(&bytes[..cut]),
            Err(WireError::Truncated { needed, got: cut }),
            "cut at {cut}"
        );
        assert_eq!(check_prefix(&bytes[..cut]), Ok(()), "cut at {cut}");
    }
}

#[test]
fn oversized_claims_are_refused_from_the_header_alone() {
    let mut header = sample_hello()[..HEADER_LEN].to_vec();
    for claim in [MAX_BODY_LEN as u32 + 1, 1 << 20, u32::MAX] {
        header[10..14].copy_from_slice(&claim.to_be_bytes());
        let want = WireError::Oversized {
            claimed: claim as usize,
            max: MAX_BODY_LEN,
        };
        assert_eq!(parse_header(&header).unwrap_err(), want);
        assert_eq!(decode(&header), Err(want));
    }
    header[8..10].copy_from_slice(&(MAX_REGIONS as u16 + 1).to_be_bytes());
    header[10..14].copy_from_slice(&(MAX_BODY_LEN as u32).to_be_bytes());
    assert!(matches!(
        parse_header(&header),
        Err(WireError::Inconsistent(_))
    ));
}

#[test]
fn wrong_magic_version_and_kind() {
    let good = sample_hello();
    let mut bad = good.clone();
    bad[..4].copy_from_slice(b"GET ");
    assert_eq!(decode(&bad), Err(WireError::BadMagic(0x4745_5420)));
    assert_eq!(decode(&bad[..4]), Err(WireError::BadMagic(0x4745_5420)));
    let msg = WireError::BadMagic(0x4745_5420).to_string();
    assert!(
        msg.contains("0x47455420") && msg.contains("0x56524253"),
        "{msg}"
    );
    for version in [1u16, 3] {
        let mut bad = good.clone();
        bad[4..6].copy_from_slice(&version.to_be_bytes());
        assert_eq!(decode(&bad), Err(WireError::BadVersion(version)));
    }
    assert!(WireError::BadVersion(1).to_string().contains("expected 2"));
    for kind in [0u8, 3, 0xff] {
        let mut bad = good.clone();
        bad[6] = kind;
        assert_eq!(decode(&bad), Err(WireError::BadKind(kind)));
    }
    // The primer's raw conn_info is not our format.
    let tutorial = ConnInfo::default().to_bytes();
    assert!(matches!(decode(&tutorial), Err(WireError::BadMagic(0))));
}

#[test]
fn inconsistent_fields() {
    let good = sample_hello();
    let edit = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut b = good.clone();
        f(&mut b);
        decode(&b)
    };
    let inconsistent = |r: Result<Message, WireError>| matches!(r, Err(WireError::Inconsistent(_)));
    assert!(inconsistent(edit(&|b| b.push(0))), "trailing byte");
    assert!(
        inconsistent(edit(&|b| b[9] = 1)),
        "count says 1, length says 2"
    );
    assert!(inconsistent(edit(&|b| b[13] += 1)), "length off by one");
    assert!(inconsistent(edit(&|b| b[7] = 4)), "token length off by one");
    assert!(inconsistent(edit(&|b| b[6] = 2)), "a reply with a token");
    assert!(inconsistent(edit(&|b| b[19] = 1)), "qpn > 24 bits");
    assert!(inconsistent(edit(&|b| b[23] = 0x80)), "psn > 24 bits");
    for code in [0u8, 6, 0xff] {
        assert!(inconsistent(edit(&|b| b[30] = code)), "mtu code {code}");
    }
    assert!(
        inconsistent(edit(&|b| b[55..63].copy_from_slice(&u64::MAX.to_be_bytes()))),
        "region overflow"
    );
    for qpn in [0u32, 1, 0xFF_FFFF] {
        let r = edit(&|b| b[19..23].copy_from_slice(&qpn.to_be_bytes()));
        assert_eq!(r, Err(WireError::ReservedQpn(qpn)));
    }
    let mut ep = sample();
    ep.qpn = 1 << 24;
    assert!(matches!(
        encode(&Message::reply(ep)),
        Err(WireError::Inconsistent(_))
    ));
    assert!(WireError::Inconsistent("x").to_string().contains("x"));
}
