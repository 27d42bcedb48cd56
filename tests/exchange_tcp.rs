//! The TCP endpoint exchange over loopback: happy paths, deadlines, and
//! peers that misbehave. No RDMA hardware involved.
#![cfg(feature = "std")]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use verbs::endpoint::{Endpoint, Mtu, RemoteRegion};
use verbs::exchange::{connect, ExchangeError, Listener};
use verbs::gid::Gid;
use verbs::wire::tutorial::{ConnInfo, TUTORIAL_BUF_SIZE};
use verbs::wire::{self, WireError, MAX_BODY_LEN};

/// Scheduling noise allowed past a deadline before calling it overrun.
const SLACK: Duration = Duration::from_millis(250);

fn endpoint(qpn: u32, regions: usize) -> Endpoint {
    Endpoint {
        qpn,
        psn: qpn ^ 0x5a5a,
        lid: 0,
        gid: Gid::from_ipv4([127, 0, 0, 1]),
        mtu: Mtu::MTU_1024,
        regions: (0..regions as u64)
            .map(|i| RemoteRegion {
                addr: 0x7f00_0000_0000 + i * 0x1000,
                len: 0x1000,
                rkey: 0x100 + i as u32,
            })
            .collect(),
    }
}

/// An endpoint the primer's format can carry: PSN 0, MTU 1024, one region.
fn tutorial_endpoint(qpn: u32) -> Endpoint {
    Endpoint {
        psn: 0,
        ..endpoint(qpn, 1)
    }
}

fn listener() -> (Listener, SocketAddr) {
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    (l, addr)
}

fn in_ms(ms: u64) -> Instant {
    Instant::now() + Duration::from_millis(ms)
}

/// Asserts the call just returned at `deadline` (not early, not much later).
fn assert_at_deadline(deadline: Instant) {
    let now = Instant::now();
    assert!(
        now >= deadline,
        "returned {:?} before the deadline",
        deadline - now
    );
    assert!(
        now <= deadline + SLACK,
        "overran the deadline by {:?}",
        now - deadline
    );
}

#[test]
fn full_exchange_both_ways() {
    let (l, addr) = listener();
    let server = thread::spawn(move || {
        let mut s = l.accept(in_ms(5000)).unwrap();
        let peer = s.exchange(&endpoint(0x11, 3), in_ms(5000)).unwrap();
        s.sync(in_ms(5000)).unwrap();
        peer
    });
    let mut c = connect(addr, in_ms(5000)).unwrap();
    assert_eq!(c.peer_addr(), addr);
    let from_server = c.exchange(&endpoint(0x22, 64), in_ms(5000)).unwrap();
    c.sync(in_ms(5000)).unwrap();
    let from_client = server.join().unwrap();
    assert_eq!(from_server, endpoint(0x11, 3));
    assert_eq!(from_client, endpoint(0x22, 64));
}

#[test]
fn tutorial_format_exchange() {
    let (l, addr) = listener();
    let server_info = ConnInfo::from_endpoint(&tutorial_endpoint(0x33)).unwrap();
    let client_info = ConnInfo::from_endpoint(&tutorial_endpoint(0x44)).unwrap();
    let server = thread::spawn(move || {
        let mut s = l.accept(in_ms(5000)).unwrap();
        s.exchange_tutorial(&server_info, true, in_ms(5000))
            .unwrap()
    });
    let mut c = connect(addr, in_ms(5000)).unwrap();
    let got = c
        .exchange_tutorial(&client_info, false, in_ms(5000))
        .unwrap();
    assert_eq!(got, server_info);
    assert_eq!(server.join().unwrap(), client_info);
    let mut ep = got.to_endpoint(TUTORIAL_BUF_SIZE).unwrap();
    ep.regions[0].len = 0x1000;
    assert_eq!(ep, tutorial_endpoint(0x33));
}

#[test]
fn tutorial_order_interoperates_with_raw_c_style_client() {
    // What the primer's C client does: read 36 bytes, then write 36.
    let (l, addr) = listener();
    let mine = ConnInfo::from_endpoint(&tutorial_endpoint(0x55)).unwrap();
    let theirs = ConnInfo::from_endpoint(&tutorial_endpoint(0x66)).unwrap();
    let client = thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        let mut buf = [0u8; 36];
        s.read_exact(&mut buf).unwrap();
        s.write_all(&theirs.to_bytes()).unwrap();
        ConnInfo::from_bytes(&buf)
    });
    let mut s = l.accept(in_ms(5000)).unwrap();
    assert_eq!(
        s.exchange_tutorial(&mine, true, in_ms(5000)).unwrap(),
        theirs
    );
    assert_eq!(client.join().unwrap(), mine);
}

#[test]
fn accept_times_out_at_deadline() {
    let (l, _) = listener();
    let deadline = in_ms(300);
    let err = l.accept(deadline).unwrap_err();
    assert!(
        matches!(err, ExchangeError::TimedOut { during: "accept" }),
        "{err}"
    );
    assert_at_deadline(deadline);
}

#[test]
fn silent_client_times_out_at_deadline() {
    let (l, addr) = listener();
    let client = TcpStream::connect(addr).unwrap();
    let mut s = l.accept(in_ms(5000)).unwrap();
    let deadline = in_ms(400);
    let err = s.exchange(&endpoint(1, 1), deadline).unwrap_err();
    assert!(
        matches!(
            err,
            ExchangeError::TimedOut {
                during: "read header"
            }
        ),
        "{err}"
    );
    assert!(err.is_timeout());
    assert_at_deadline(deadline);
    drop(client);
}

#[test]
fn slow_drip_is_bounded_by_the_deadline() {
    // One valid byte every 200 ms: each read makes progress, so a timeout
    // reset per read would never fire; the deadline must.
    let (l, addr) = listener();
    let msg = wire::encode(&endpoint(2, 2)).unwrap();
    let client = thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        for byte in msg {
            if s.write_all(&[byte]).is_err() {
                break; // server gave up and closed: expected
            }
            thread::sleep(Duration::from_millis(200)); // the drip rate under test
        }
    });
    let mut s = l.accept(in_ms(5000)).unwrap();
    let deadline = in_ms(1100);
    let err = s.exchange(&endpoint(1, 1), deadline).unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert_at_deadline(deadline);
    drop(s);
    client.join().unwrap();
}

/// Sends `bytes` as the client and returns the server's exchange result
/// and how long the server took.
fn serve_raw(bytes: Vec<u8>) -> (Result<Endpoint, ExchangeError>, Duration) {
    let (l, addr) = listener();
    let client = thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(&bytes).unwrap();
        // Hold the connection open until the server hangs up, so the
        // server's error is about the bytes, not about a close.
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
    });
    let mut s = l.accept(in_ms(5000)).unwrap();
    let start = Instant::now();
    let result = s.exchange(&endpoint(1, 1), in_ms(5000));
    let took = start.elapsed();
    drop(s);
    client.join().unwrap();
    (result, took)
}

#[test]
fn oversized_claim_is_refused_without_waiting_for_the_body() {
    let mut msg = wire::encode(&endpoint(3, 0)).unwrap();
    msg[8..12].copy_from_slice(&u32::MAX.to_be_bytes());
    msg.truncate(wire::HEADER_LEN);
    let (result, took) = serve_raw(msg);
    match result {
        Err(ExchangeError::Decode(WireError::Oversized { claimed, max })) => {
            assert_eq!(claimed, u32::MAX as usize);
            assert_eq!(max, MAX_BODY_LEN);
        }
        other => panic!("expected Oversized, got {other:?}"),
    }
    assert!(took < Duration::from_secs(2), "waited {took:?} for a body");
}

#[test]
fn wrong_magic_is_a_typed_error() {
    let (result, took) = serve_raw(b"GET / HTTP/1.1\r\n\r\n".to_vec());
    let err = result.unwrap_err();
    assert!(
        matches!(err.wire_error(), Some(WireError::BadMagic(0x4745_5420))),
        "{err}"
    );
    assert!(took < Duration::from_secs(2));
}

#[test]
fn wrong_version_is_a_typed_error() {
    let mut msg = wire::encode(&endpoint(4, 1)).unwrap();
    msg[4..6].copy_from_slice(&9u16.to_be_bytes());
    let (result, _) = serve_raw(msg);
    assert!(matches!(
        result,
        Err(ExchangeError::Decode(WireError::BadVersion(9)))
    ));
}

#[test]
fn inconsistent_body_is_a_typed_error() {
    let mut msg = wire::encode(&endpoint(5, 1)).unwrap();
    msg[22..24].copy_from_slice(&42u16.to_be_bytes()); // mtu code 42
    let (result, _) = serve_raw(msg);
    assert!(matches!(
        result,
        Err(ExchangeError::Decode(WireError::Inconsistent(_)))
    ));
}

#[test]
fn peer_closing_mid_message_is_reported() {
    let msg = wire::encode(&endpoint(6, 1)).unwrap();
    let (l, addr) = listener();
    let client = thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(&msg[..20]).unwrap();
    });
    let mut s = l.accept(in_ms(5000)).unwrap();
    client.join().unwrap();
    let err = s.exchange(&endpoint(1, 1), in_ms(5000)).unwrap_err();
    assert!(
        matches!(
            err,
            ExchangeError::PeerClosed {
                during: "read body",
                got: 8,
                needed: 48
            }
        ) || err.kind().is_some(),
        "{err}"
    );
}

#[test]
fn invalid_local_endpoint_is_refused_before_sending() {
    let (l, addr) = listener();
    let _client = TcpStream::connect(addr).unwrap();
    let mut s = l.accept(in_ms(5000)).unwrap();
    let mut bad = endpoint(1, 1);
    bad.qpn = 1 << 24;
    let err = s.exchange(&bad, in_ms(5000)).unwrap_err();
    assert!(
        matches!(err, ExchangeError::Encode(WireError::Inconsistent(_))),
        "{err}"
    );
}

#[test]
fn flood_of_dead_connections_then_a_real_peer_is_served() {
    let (l, addr) = listener();
    for _ in 0..50 {
        drop(TcpStream::connect(addr).unwrap());
    }
    let client = thread::spawn(move || {
        let mut c = connect(addr, in_ms(10_000)).unwrap();
        c.exchange(&endpoint(0x77, 2), in_ms(10_000)).unwrap()
    });
    let deadline = in_ms(10_000);
    let mut failures = 0;
    let got = loop {
        let mut s = l.accept(deadline).expect("listener stays usable");
        let per_peer = (Instant::now() + Duration::from_millis(500)).min(deadline);
        match s.exchange(&endpoint(0x88, 1), per_peer) {
            Ok(ep) => break ep,
            Err(e) => {
                assert!(!e.is_timeout(), "a dead peer should fail fast: {e}");
                failures += 1;
            }
        }
    };
    assert_eq!(got, endpoint(0x77, 2));
    assert_eq!(failures, 50);
    assert_eq!(client.join().unwrap(), endpoint(0x88, 1));
}

#[test]
fn connect_to_nobody_fails_within_deadline() {
    // Reserve a port, then free it so nobody listens there.
    let addr = listener().1;
    let deadline = in_ms(300);
    let err = connect(addr, deadline).unwrap_err();
    assert_eq!(
        err.kind(),
        Some(std::io::ErrorKind::ConnectionRefused),
        "{err}"
    );
    assert!(err.raw_os_error().is_some());
    assert_at_deadline(deadline);
}

#[test]
fn client_may_start_before_the_server() {
    let addr = listener().1;
    let client = thread::spawn(move || {
        let mut c = connect(addr, in_ms(5000)).unwrap();
        c.exchange(&endpoint(0x99, 1), in_ms(5000)).unwrap()
    });
    // Deliberately late, so the client is refused at least once first.
    thread::sleep(Duration::from_millis(150));
    let l = Listener::bind(addr).unwrap();
    let mut s = l.accept(in_ms(5000)).unwrap();
    assert_eq!(
        s.exchange(&endpoint(0xaa, 1), in_ms(5000)).unwrap(),
        endpoint(0x99, 1)
    );
    assert_eq!(client.join().unwrap(), endpoint(0xaa, 1));
}

#[test]
fn sync_rejects_a_wrong_byte() {
    let (l, addr) = listener();
    let client = thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"X").unwrap();
        let mut b = [0u8; 1];
        let _ = s.read(&mut b);
    });
    let mut s = l.accept(in_ms(5000)).unwrap();
    let err = s.sync(in_ms(5000)).unwrap_err();
    assert!(
        matches!(err, ExchangeError::Decode(WireError::Inconsistent(_))),
        "{err}"
    );
    drop(s);
    client.join().unwrap();
}

#[test]
fn errors_convert_to_io_errors() {
    let e: std::io::Error = ExchangeError::TimedOut {
        during: "read header",
    }
    .into();
    assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
    assert!(e.to_string().contains("read header"));
    let e: std::io::Error = ExchangeError::Decode(WireError::BadVersion(3)).into();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
}
