//! rdma_cm on a real device: connect, transfer with every verb path,
//! disconnect seen by the peer; nobody listening fails in time, named.
#![cfg(feature = "rdmacm")]

mod support;

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use verbs::cm::{self, CmConnection, CmListener};
use verbs::{
    Access, Deadline, ErrorKind, HostBuf, Local, MemoryRegion, QpState, QueuePair, RemoteSlice,
    SendOp, SendRequest,
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
    // Context::open's context of the device, not librdmacm's.
    let foreign =
        verbs::ProtectionDomain::new(&verbs::Context::open(Some(ctx.name())).unwrap()).unwrap();
    let err = cm::resolve(addr, deadline())
        .unwrap()
        .connect_in::<MemoryRegion>(&foreign, &support::config(), b"", deadline())
        .err()
        .expect("a PD on another context is refused");
    println!("{err}");
    assert!(err.to_string().contains("cm::context()"), "{err}");

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
        // iWARP connects over TCP: the refusal comes back from rdma_connect.
        ErrorKind::Os if err.errno() == Some(libc::ECONNREFUSED) && support::is_iwarp(&ctx) => {}
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

/// A listener on the device's address at `port` whose thread accepts `n`
/// connections and waits until each sees DISCONNECTED.
fn serve(test: &str, port: u16, n: usize) -> (SocketAddr, std::thread::JoinHandle<()>) {
    let ctx = support::test_context(test);
    let addr = SocketAddr::new(IpAddr::V4(support::device_ipv4(&ctx)), port);
    let listener = CmListener::bind(addr).expect("rdma_bind_addr + rdma_listen");
    let server = std::thread::spawn(move || {
        let mut conns: Vec<CmConnection<MemoryRegion>> = (0..n)
            .map(|_| {
                listener
                    .accept(&support::config(), b"", deadline())
                    .unwrap()
            })
            .collect();
        for conn in &mut conns {
            conn.wait_disconnected(deadline())
                .expect("every client's id disconnects, whoever ends it");
        }
    });
    (addr, server)
}

fn dial(addr: SocketAddr) -> CmConnection<MemoryRegion> {
    cm::connect(addr, &support::config(), b"", deadline()).expect("rdma_cm connect")
}

/// The state the device reports for `qp`, where it reports one: Soft-iWARP's
/// `ibv_query_qp` leaves the state 0 (RESET) whatever it is.
fn device_state(qp: &QueuePair<MemoryRegion>) -> Option<QpState> {
    (!support::is_iwarp(qp.pd().context())).then(|| qp.query().unwrap().state)
}

/// The status of a zero-length RDMA Write (no memory named) on `qp`: it
/// completes on a connected queue pair, and fails to post or flushes on
/// one that was disconnected.
fn keepalive(qp: &mut QueuePair<MemoryRegion>) -> Option<verbs::WcStatus> {
    let req = SendRequest::empty(SendOp::Write(RemoteSlice::unchecked(0, 0, 0)));
    qp.post_send(req).ok()?;
    Some(qp.wait_one(support::deadline()).unwrap().status)
}

/// Audit finding 7, a hostile caller swapping two connections' queue pairs
/// (`mem::swap(&mut *a, &mut *b)`, which `DerefMut` allows): `disconnect`
/// moves the queue pair the connection holds to ERR on the device and
/// records it on that same queue pair. The other connection's queue pair
/// stays RTS, on the device and in its bookkeeping.
#[test]
fn disconnect_moves_the_queue_pair_the_connection_holds() {
    let (addr, server) = serve("rdma_cm swapped queue pairs", 20888, 2);
    let (mut a, mut b) = (dial(addr), dial(addr));
    core::mem::swap(&mut *a, &mut *b);
    a.disconnect().unwrap();
    let iwarp = support::is_iwarp(a.context());
    let on_device = |state| (!iwarp).then_some(state);
    assert_eq!(
        (device_state(&a), a.state().unwrap(), keepalive(&mut a)),
        (on_device(QpState::ERR), QpState::ERR, None),
        "the disconnected connection's queue pair, on the device and recorded"
    );
    assert_eq!(
        (device_state(&b), b.state().unwrap(), keepalive(&mut b)),
        (
            on_device(QpState::RTS),
            QpState::RTS,
            Some(verbs::WcStatus::SUCCESS)
        ),
        "the other connection's queue pair, untouched"
    );
    drop((a, b));
    server.join().unwrap();
}

/// Audit finding 1, a hostile caller moving a connection's queue pair out
/// (`mem::replace(&mut *conn, other)`) to another thread: the connection
/// left behind, its `disconnect` and its drop, never reach that queue pair
/// (they would read the id's pointer to it while the other thread may be
/// destroying it). The queue pair stays RTS where it went, and its own
/// drop there tears it down (and the peer sees DISCONNECTED when its id
/// goes).
#[test]
fn a_queue_pair_moved_to_another_thread_is_left_alone_by_its_old_connection() {
    let (addr, server) = serve("rdma_cm queue pair on another thread", 20889, 1);
    let mut conn = dial(addr);
    let plain = QueuePair::new(conn.pd(), &support::config()).unwrap();
    let moved = core::mem::replace(&mut *conn, plain);
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let iwarp = support::is_iwarp(conn.context());
    let owner = std::thread::spawn(move || {
        let mut moved = moved;
        wait.recv().unwrap();
        let seen = (
            device_state(&moved),
            moved.state().unwrap(),
            keepalive(&mut moved),
        );
        drop(moved);
        seen
    });
    let _ = conn.disconnect(); // whatever it says, it must not reach `moved`
    drop(conn);
    go.send(()).unwrap();
    assert_eq!(
        owner.join().unwrap(),
        (
            (!iwarp).then_some(QpState::RTS),
            QpState::RTS,
            Some(verbs::WcStatus::SUCCESS)
        ),
        "the old connection's disconnect reached a queue pair another thread owns"
    );
    server.join().unwrap();
}

/// Finding 1's race itself, run a few times: the moved queue pair is
/// dropped on its thread while its old connection disconnects and drops
/// on this one. Nothing to assert but that nothing crashes: the
/// connection reaches only what it holds, and a queue pair's drop clears
/// the id's pointer before destroying it.
#[test]
fn a_moved_queue_pair_dropped_while_its_old_connection_disconnects() {
    const ROUNDS: usize = 4;
    let (addr, server) = serve("rdma_cm drop race", 20890, ROUNDS);
    for _ in 0..ROUNDS {
        let mut conn = dial(addr);
        let plain = QueuePair::new(conn.pd(), &support::config()).unwrap();
        let moved = core::mem::replace(&mut *conn, plain);
        let start = std::sync::Arc::new(std::sync::Barrier::new(2));
        let go = start.clone();
        let owner = std::thread::spawn(move || {
            go.wait();
            drop(moved);
        });
        start.wait();
        let _ = conn.disconnect();
        drop(conn);
        owner.join().unwrap();
    }
    server.join().unwrap();
}
