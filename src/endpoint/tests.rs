//! The endpoint's checks and constructor.

use super::*;
use alloc::string::ToString;
use alloc::vec;

fn ep() -> Endpoint {
    Endpoint {
        qpn: 0x11,
        psn: 0x22,
        lid: 3,
        gid: Gid::from_ipv4([10, 0, 0, 1]),
        mtu: Mtu::MTU_1024,
        regions: vec![RemoteRegion {
            addr: 0x1000,
            len: 0x100,
            rkey: 7,
        }],
    }
}

#[test]
fn mtu() {
    assert_eq!(Mtu::MTU_256.bytes(), Some(256));
    assert_eq!(Mtu::MTU_4096.bytes(), Some(4096));
    assert_eq!(Mtu(0).bytes(), None);
    assert_eq!(Mtu(6).bytes(), None);
    assert_eq!(Mtu(u32::MAX).bytes(), None);
    for code in 1..=5 {
        assert_eq!(Mtu::from_bytes(Mtu(code).bytes().unwrap()), Some(Mtu(code)));
    }
    assert_eq!(Mtu::from_bytes(1500), None);
    assert_eq!(Mtu::MTU_1024.to_string(), "1024");
    assert_eq!(Mtu(7).to_string(), "unknown(7)");
}

#[test]
fn contains() {
    let r = RemoteRegion {
        addr: 100,
        len: 50,
        rkey: 1,
    };
    assert!(r.contains(100, 50));
    assert!(r.contains(149, 1));
    assert!(r.contains(150, 0));
    assert!(!r.contains(150, 1));
    assert!(!r.contains(99, 1));
    assert!(!r.contains(120, u64::MAX));
    let top = RemoteRegion {
        addr: u64::MAX - 9,
        len: 9,
        rkey: 1,
    };
    assert!(top.contains(u64::MAX - 1, 1));
    assert!(!top.contains(u64::MAX, 1));
    let bad = RemoteRegion {
        addr: u64::MAX,
        len: 1,
        rkey: 1,
    };
    assert!(!bad.contains(u64::MAX, 0));
    assert_eq!(ep().region_for(0x1010, 0x10).map(|r| r.rkey), Some(7));
    assert_eq!(ep().region_for(0x10f0, 0x20), None);
}

#[test]
fn validate() {
    assert_eq!(ep().validate(), Ok(()));
    let mut e = ep();
    e.qpn = MAX_QPN + 1;
    assert_eq!(e.validate(), Err(EndpointError::QpnTooWide(MAX_QPN + 1)));
    let mut e = ep();
    e.psn = u32::MAX;
    assert_eq!(e.validate(), Err(EndpointError::PsnTooWide(u32::MAX)));
    let mut e = ep();
    e.mtu = Mtu(0);
    assert_eq!(e.validate(), Err(EndpointError::UnknownMtu(Mtu(0))));
    let mut e = ep();
    e.regions = vec![e.regions[0]; MAX_REGIONS + 1];
    assert_eq!(
        e.validate(),
        Err(EndpointError::TooManyRegions(MAX_REGIONS + 1))
    );
    let mut e = ep();
    e.regions.push(RemoteRegion {
        addr: u64::MAX,
        len: 1,
        rkey: 0,
    });
    assert_eq!(
        e.validate(),
        Err(EndpointError::RegionOverflow { index: 1 })
    );
    assert!(e.validate().unwrap_err().to_string().contains("region 1"));
}

#[test]
fn new_takes_what_c_peers_exchange_and_refuses_what_no_peer_has() {
    let gid = Gid::from_ipv4([10, 0, 0, 2]);
    let e = Endpoint::new(0x11, 0x22, 3, gid).unwrap();
    assert_eq!((e.qpn, e.psn, e.lid, e.gid), (0x11, 0x22, 3, gid));
    assert_eq!(e.mtu, Mtu::MTU_4096, "the port's MTU decides");
    assert!(e.regions.is_empty());
    assert_eq!(e.validate(), Ok(()));
    for qpn in [0, 1, MAX_QPN] {
        assert_eq!(
            Endpoint::new(qpn, 0, 0, gid),
            Err(EndpointError::ReservedQpn(qpn))
        );
    }
    assert_eq!(
        Endpoint::new(MAX_QPN + 1, 0, 0, gid),
        Err(EndpointError::QpnTooWide(MAX_QPN + 1))
    );
    assert_eq!(
        Endpoint::new(2, MAX_PSN + 1, 0, gid),
        Err(EndpointError::PsnTooWide(MAX_PSN + 1))
    );
    assert!(Endpoint::new(MAX_PEER_QPN, MAX_PSN, 0, gid).is_ok());
    let text = Endpoint::new(1, 0, 0, gid).unwrap_err().to_string();
    assert!(text.contains("GSI"), "{text}");
}

#[test]
fn addressable_by_what_the_port_routes_on() {
    let at = |lid: u16, gid: Gid| Endpoint { lid, gid, ..ep() };
    let roce = Some(LinkLayer::ETHERNET);
    let ib = Some(LinkLayer::INFINIBAND);
    let v4 = Gid::from_ipv4([10, 0, 0, 2]);
    assert_eq!(at(0, v4).check_addressable(roce), Ok(()));
    assert_eq!(
        at(7, Gid::ZERO).check_addressable(roce),
        Err(EndpointError::ZeroGid)
    );
    // On InfiniBand a zero GID with a unicast LID is the usual case.
    assert_eq!(at(7, Gid::ZERO).check_addressable(ib), Ok(()));
    assert_eq!(at(MAX_UNICAST_LID, v4).check_addressable(ib), Ok(()));
    for lid in [0, MAX_UNICAST_LID + 1, 0xFFFF] {
        assert_eq!(
            at(lid, v4).check_addressable(ib),
            Err(EndpointError::NotUnicastLid(lid))
        );
    }
    // A port not known, or of another kind: only what no port can address.
    for port in [None, Some(LinkLayer::UNSPECIFIED)] {
        assert_eq!(at(0, v4).check_addressable(port), Ok(()));
        assert_eq!(at(7, Gid::ZERO).check_addressable(port), Ok(()));
        assert_eq!(
            at(0, Gid::ZERO).check_addressable(port),
            Err(EndpointError::NoAddress)
        );
    }
    let said = EndpointError::NotUnicastLid(0).to_string();
    assert!(said.contains("lid 0x0 is not unicast"), "{said}");
}
