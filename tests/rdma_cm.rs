//! rdma_cm on a real device: connect, transfer with every verb path,
//! disconnect seen by the peer; nobody listening fails in time, named.
#![cfg(feature = "rdmacm")]

mod support;

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use verbs::cm::{self, CmConnection, CmListener};
use verbs::{
    Access, Deadline, ErrorKind, HostBuf, Local, MemoryRegion, RemoteSlice, SendOp, SendRequest,
};

fn deadline() -> Deadline {
    Deadline::after(Duration::from_secs(30))
}

#[test]
fn connect_transfer_and_disconnect() {
    let ctx = support::test_context("rdma_cm connect_transfer_and_disconnect");
    let addr = SocketAddr::new(IpAddr::V4(support::device_ipv4(&ctx)), 20886);
    drop(ctx);
    let listener = CmListener::bind(addr).expect("rdma_bind_addr + rdma_listen");
    let server = std::thread::spawn(move || {
        let config = support::config();
        // Register in the request's PD, then accept with the descriptor.
        let req = listener.request(deadline()).expect("a connect request");
        assert!(
            req.peer_private_data()
                .starts_with(b"hello from the client"),
            "padded by the transport"
        );
        let target =
            MemoryRegion::with_access(req.pd(), 4096, Access::REMOTE_WRITE | Access::REMOTE_READ)
                .unwrap();
        let private = cm::encode_regions(&[target.remote().unwrap()]);
        let mut conn: CmConnection<MemoryRegion> =
            req.accept(&config, &private, deadline()).expect("accept");
        // The client writes, then disconnects; we see DISCONNECTED.
        conn.wait_disconnected(deadline())
            .expect("the peer's disconnect is observed");
        let mut got = [0u8; 18];
        target.read_at(0, &mut got).unwrap();
        assert_eq!(&got, b"written via rdmacm");
    });

    let t0 = Instant::now();
    let mut conn: CmConnection<MemoryRegion> = cm::connect(
        addr,
        &support::config(),
        b"hello from the client",
        deadline(),
    )
    .expect("rdma_cm connect");
    println!("connected in {:?}", t0.elapsed());
    let regions =
        cm::decode_regions(conn.peer_private_data()).expect("the accept carried a descriptor");
    let dst = RemoteSlice::new(&regions[0], 0, 18).unwrap();
    let mut src = MemoryRegion::new(conn.pd(), 4096).unwrap();
    src.write_at(0, b"written via rdmacm").unwrap();
    let req = SendRequest::new(SendOp::Write(dst), Local::range(src, 0, 18).unwrap());
    conn.post_send(req).map_err(|e| e.error).unwrap();
    conn.wait_one(support::deadline())
        .unwrap()
        .result()
        .unwrap();
    // Read it back through the same connection.
    let back = MemoryRegion::new(conn.pd(), 4096).unwrap();
    let req = SendRequest::new(SendOp::Read(dst), Local::range(back, 0, 18).unwrap());
    conn.post_send(req).map_err(|e| e.error).unwrap();
    let mut c = conn.wait_one(support::deadline()).unwrap();
    c.result().unwrap();
    assert_eq!(
        &c.take_buf().unwrap().as_slice().unwrap()[..18],
        b"written via rdmacm"
    );
    conn.disconnect().unwrap();
    server.join().unwrap();
}

/// Many connections, one protection domain: one region, registered once,
/// serves two connections accepted and connected into the first's PD; a
/// PD from `Context::open` (another context) is refused with the hint.
#[test]
fn connections_share_one_protection_domain() {
    let ctx = support::test_context("rdma_cm shared PD");
    let addr = SocketAddr::new(IpAddr::V4(support::device_ipv4(&ctx)), 20887);
    let listener = CmListener::bind(addr).expect("rdma_bind_addr + rdma_listen");
    let server = std::thread::spawn(move || {
        let first = listener.request(deadline()).expect("first request");
        let pd = first.pd().clone();
        let target =
            MemoryRegion::with_access(&pd, 4096, Access::REMOTE_WRITE | Access::REMOTE_READ)
                .unwrap();
        let private = cm::encode_regions(&[target.remote().unwrap()]);
        let config = support::config();
        let mut conns: Vec<CmConnection<MemoryRegion>> =
            vec![first.accept_in(&pd, &config, &private, deadline()).unwrap()];
        let second = listener.request(deadline()).expect("second request");
        conns.push(
            second
                .accept_in(&pd, &config, &private, deadline())
                .unwrap(),
        );
        for conn in &mut conns {
            conn.wait_disconnected(deadline()).unwrap();
        }
        let mut got = [0u8; 8];
        target.read_at(0, &mut got).unwrap();
        assert_eq!(&got, b"AAAABBBB", "each connection wrote its half");
    });

    let first = cm::resolve(addr, deadline()).expect("resolve");
    let pd = first.pd().clone();
    let foreign = verbs::ProtectionDomain::new(&ctx).unwrap();
    let err = cm::resolve(addr, deadline())
        .unwrap()
        .connect_in::<MemoryRegion>(&foreign, &support::config(), b"", deadline())
        .err()
        .expect("a PD on another context is refused");
    println!("{err}");
    assert!(
        err.to_string().contains("pd() of an earlier connection"),
        "{err}"
    );

    let mut src = MemoryRegion::new(&pd, 64).unwrap();
    src.write_at(0, b"AAAABBBB").unwrap();
    let mut conns: Vec<CmConnection<MemoryRegion>> = vec![first
        .connect_in(&pd, &support::config(), b"", deadline())
        .unwrap()];
    let second = cm::resolve(addr, deadline()).unwrap();
    conns.push(
        second
            .connect_in(&pd, &support::config(), b"", deadline())
            .unwrap(),
    );
    let region = cm::decode_regions(conns[1].peer_private_data()).unwrap()[0];
    for (i, conn) in conns.iter_mut().enumerate() {
        // Connection i writes bytes 4i..4i+4 from the one shared region.
        let dst = RemoteSlice::new(&region, 4 * i as u64, 4).unwrap();
        let local = Local::range(src, 4 * i, 4).unwrap();
        conn.post_send(SendRequest::new(SendOp::Write(dst), local))
            .map_err(|e| e.error)
            .unwrap();
        let mut c = conn.wait_one(support::deadline()).unwrap();
        c.result().unwrap();
        src = c.take_buf().unwrap();
    }
    for conn in &mut conns {
        conn.disconnect().unwrap();
    }
    server.join().unwrap();
}

#[test]
fn connecting_where_nobody_listens_fails_in_time_and_names_the_event() {
    let ctx = support::test_context("rdma_cm nobody listens");
    let addr = SocketAddr::new(IpAddr::V4(support::device_ipv4(&ctx)), 20999);
    let limit = Duration::from_secs(20);
    let t0 = Instant::now();
    let err = cm::connect::<MemoryRegion>(addr, &support::config(), b"", Deadline::after(limit))
        .err()
        .expect("nobody listens there");
    let took = t0.elapsed();
    println!("{err} after {took:?}");
    assert!(took < limit * 2, "bounded by the deadline: {took:?}");
    match err.kind() {
        ErrorKind::CmEvent => {
            let (event, _status) = err.cm_event().unwrap();
            let name = cm::CmEventType(event).name().unwrap_or("?");
            assert!(
                ["REJECTED", "UNREACHABLE", "CONNECT_ERROR"].contains(&name),
                "named event: {name}"
            );
            assert!(
                err.to_string().contains(name),
                "the message names it: {err}"
            );
        }
        ErrorKind::TimedOut => {}
        other => panic!("unexpected error kind {other:?}: {err}"),
    }
}

#[test]
fn region_lists_round_trip_through_private_data() {
    let regions = [
        verbs::RemoteRegion {
            addr: 0x1000,
            len: 4096,
            rkey: 7,
        },
        verbs::RemoteRegion {
            addr: u64::MAX - 10,
            len: 10,
            rkey: 9,
        },
    ];
    let data = cm::encode_regions(&regions);
    assert!(data.len() <= cm::MAX_CONNECT_PRIVATE_DATA);
    let mut padded = data.clone();
    padded.resize(56, 0);
    assert_eq!(cm::decode_regions(&padded).unwrap(), regions);
    assert!(cm::decode_regions(&data[..10]).is_err());
    assert!(cm::decode_regions(&[]).is_err());
}
