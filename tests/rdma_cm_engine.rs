//! rdma_cm connections on one shared engine (one completion queue, one
//! shared receive queue): receives posted before the accept, the
//! connection manager's events read through the engine and waited on
//! beside its completions, so a peer's disconnect wakes a server that
//! was waiting for completions. And the hostile cases: a queue pair
//! removed behind the connection manager's back, an engine of another
//! protection domain, events read after the peer vanished, an id dropped
//! with receives posted, the calls made out of order.
#![cfg(feature = "rdmacm")]

mod support;

use std::net::{IpAddr, SocketAddr};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use verbs::cm::{self, CmConnection, CmEventType as Ev, CmListener, Wake};
use verbs::{
    Arena, ArenaBuf, ArenaConfig, Deadline, Engine, EngineConfig, ErrorKind, HostBuf, Local,
    MemoryRegion, NicBuf, ProtectionDomain, QpId, QpState, RecvRequest, SendOp, SendRequest,
    SrqConfig, WcStatus,
};

fn deadline() -> Deadline {
    Deadline::after(Duration::from_secs(60))
}

fn addr(test: &str, port: u16) -> SocketAddr {
    let ctx = support::test_context(test);
    SocketAddr::new(IpAddr::V4(support::device_ipv4(&ctx)), port)
}

fn engine_on<B: NicBuf>(pd: &ProtectionDomain, srq: bool) -> Engine<B> {
    let config = EngineConfig {
        events: true,
        srq: srq.then_some(SrqConfig {
            max_wr: 64,
            max_sge: 1,
        }),
        ..EngineConfig::default()
    };
    Engine::new(pd, &config).expect("an engine on the listener's device")
}

/// The next client's request placed on `engine`, with `receives` posted
/// on its queue pair before anything is accepted.
fn place_next<B: NicBuf>(
    listener: &CmListener,
    engine: &mut Engine<B>,
    receives: impl IntoIterator<Item = RecvRequest<B>>,
) -> QpId {
    let qp = listener
        .request(deadline())
        .unwrap()
        .place(engine, &support::config())
        .unwrap();
    for req in receives {
        engine.post_recv(qp, req).map_err(|e| e.error).unwrap();
    }
    qp
}

/// An arena of 1 MiB on `pd`.
fn arena_on(pd: &ProtectionDomain) -> Arena {
    let config = ArenaConfig {
        capacity: 1 << 20,
        ..ArenaConfig::default()
    };
    Arena::new(pd, &config).unwrap()
}

/// Waits (completions to `on_done`) until `qp`'s `want`; any other event
/// of `qp` that ends it fails the test.
fn until_event<B: NicBuf>(
    engine: &mut Engine<B>,
    qp: QpId,
    want: Ev,
    mut on_done: impl FnMut(verbs::CompletionRef<'_, B>),
) -> cm::CmEvent {
    loop {
        match engine.wait_with_cm(deadline(), &mut on_done) {
            Ok(Wake::Event(ev)) if ev.qp() == Some(qp) && ev.kind() == want => return ev,
            Ok(Wake::Event(ev)) if ev.qp() == Some(qp) && ev.error().is_some() => {
                panic!("{:?} instead of {want:?}: {:?}", ev.kind(), ev.error())
            }
            Ok(_) => {}
            Err(e) => panic!("waiting for {want:?} on {qp:?}: {e}"),
        }
    }
}

/// The next completion (no connection-manager event may come first).
fn next_completion<B: NicBuf>(engine: &mut Engine<B>) -> verbs::Completion<B> {
    let mut got = None;
    while got.is_none() {
        match engine.wait_with_cm(deadline(), |c| got = Some(c.into_owned())) {
            Ok(Wake::Completions(_)) => {}
            other => panic!("a completion, not {other:?}"),
        }
    }
    got.unwrap()
}

fn send_text(conn: &mut CmConnection<MemoryRegion>, text: &[u8]) {
    let mut buf = MemoryRegion::new(conn.pd(), 64).unwrap();
    buf.write_at(0, text).unwrap();
    let req = SendRequest::new(SendOp::Send, Local::range(buf, 0, text.len()).unwrap());
    conn.post_send(req).map_err(|e| e.error).unwrap();
    conn.wait_one(support::deadline())
        .unwrap()
        .result()
        .unwrap();
}

/// Issue 37's rping port: the server posts its receives before the
/// accept and then only waits for completions; the client sends one
/// message and disconnects. The peer's `rdma_disconnect` must end the
/// server's wait (the event, not its deadline), and the receives left
/// posted come back flushed through the same poll. The delay is printed
/// (`--nocapture`), not asserted.
#[test]
fn a_peer_disconnect_wakes_a_server_waiting_on_completions() {
    let addr = addr("rdma_cm_engine disconnect wakes", 20910);
    let listener = CmListener::bind(addr).expect("rdma_bind_addr + rdma_listen");
    let (waiting, client_may_go) = mpsc::channel::<()>();
    let (disconnected_at, when) = mpsc::channel::<Instant>();
    let server = std::thread::spawn(move || {
        let pd = listener.pd().expect("a PD on the listener's device");
        let mut engine: Engine<MemoryRegion> = engine_on(&pd, false);
        let req = listener.request(deadline()).expect("a connect request");
        let qp = req.place(&mut engine, &support::config()).unwrap();
        assert_eq!(engine.state(qp).unwrap(), QpState::INIT);
        for slot in 0..4 {
            let buf = MemoryRegion::new(&pd, 64).unwrap();
            engine
                .post_recv(qp, RecvRequest::new(buf).tag(slot))
                .map_err(|e| e.error)
                .expect("a receive posted before the accept");
        }
        engine.cm_accept(qp, b"").unwrap();
        // The client's first message may land before ESTABLISHED is read.
        let mut early = None;
        until_event(&mut engine, qp, Ev::ESTABLISHED, |c| {
            early = Some(c.into_owned())
        });
        assert_eq!(engine.state(qp).unwrap(), QpState::RTS);
        let mut first = early.unwrap_or_else(|| next_completion(&mut engine));
        first.result().unwrap();
        assert_eq!((first.qp, first.tag), (Some(qp), 0));
        let mut got = [0u8; 5];
        first.take_buf().unwrap().read_at(0, &mut got).unwrap();
        assert_eq!(
            &got, b"hello",
            "landed in a receive posted before the accept"
        );

        // Now only waiting for completions that will never come.
        waiting.send(()).unwrap();
        let mut flushed = Vec::new();
        let woke = engine.wait_with_cm(Deadline::after(Duration::from_secs(300)), |c| {
            flushed.push(c.into_owned())
        });
        let woke_at = Instant::now();
        // What the peer's disconnect does ends the wait, not the deadline:
        // its DISCONNECTED, or (iWARP, whose queue pair goes to the error
        // state with its TCP connection) the receives that flushes.
        let mut disconnected = match woke {
            Ok(Wake::Event(ev)) => {
                assert_eq!((ev.kind(), ev.qp()), (Ev::DISCONNECTED, Some(qp)));
                assert!(ev.error().unwrap().to_string().contains("DISCONNECTED"));
                true
            }
            Ok(Wake::Completions(_)) if support::is_iwarp(pd.context()) => {
                assert!(flushed.iter().all(|c| c.status == WcStatus::WR_FLUSH_ERR));
                false
            }
            Ok(other) => panic!("woken by {other:?}, not the peer's DISCONNECTED"),
            Err(e) => panic!("the peer's disconnect did not end the wait: {e}"),
        };
        println!(
            "woken by {} {:?} after the client's rdma_disconnect returned",
            if disconnected {
                "DISCONNECTED"
            } else {
                "flushed receives"
            },
            woke_at.saturating_duration_since(when.recv().unwrap())
        );
        // This side disconnects too: the other three receives flush back.
        while !disconnected || flushed.len() < 3 {
            let woke = engine.wait_with_cm(deadline(), |c| flushed.push(c.into_owned()));
            if let Wake::Event(ev) = woke.unwrap() {
                assert_eq!((ev.kind(), ev.qp()), (Ev::DISCONNECTED, Some(qp)));
                disconnected = true;
            }
        }
        assert_eq!(engine.state(qp).unwrap(), QpState::ERR, "no more posts");
        let mut tags: Vec<u64> = flushed.iter().map(|c| c.tag).collect();
        tags.sort();
        assert_eq!(tags, [1, 2, 3]);
        assert!(flushed
            .iter_mut()
            .all(|c| c.status == WcStatus::WR_FLUSH_ERR && c.take_buf().is_some()));
        engine.remove_qp(qp).unwrap();
    });

    let mut conn: CmConnection<MemoryRegion> =
        cm::connect(addr, &support::config(), b"", deadline()).expect("rdma_cm connect");
    send_text(&mut conn, b"hello");
    client_may_go.recv().unwrap();
    conn.disconnect().unwrap();
    disconnected_at.send(Instant::now()).unwrap();
    server.join().unwrap();
}

/// Three clients on one server engine: one completion queue, one shared
/// receive queue, one polling thread; each receive comes back with the
/// queue pair of the client that sent it, each event names its queue
/// pair.
#[test]
fn many_connections_share_one_engine_and_one_receive_queue() {
    const CLIENTS: u8 = 3;
    let addr = addr("rdma_cm_engine one engine", 20911);
    let listener = CmListener::bind(addr).expect("rdma_bind_addr + rdma_listen");
    let server = std::thread::spawn(move || {
        let pd = listener.pd().unwrap();
        let mut engine: Engine<MemoryRegion> = engine_on(&pd, true);
        for _ in 0..2 * CLIENTS {
            let buf = MemoryRegion::new(&pd, 64).unwrap();
            engine
                .post_srq_recv(RecvRequest::new(buf))
                .map_err(|e| e.error)
                .unwrap();
        }
        let mut who = std::collections::HashMap::new();
        for _ in 0..CLIENTS {
            let req = listener.request(deadline()).unwrap();
            let client = req.peer_private_data()[0];
            let qp = req.place(&mut engine, &support::config()).unwrap();
            engine.cm_accept(qp, &[client]).unwrap();
            who.insert(qp, client);
        }
        let (mut up, mut down, mut heard) = (0, 0, Vec::new());
        while down < CLIENTS {
            let woke = engine
                .wait_with_cm(deadline(), |mut c| {
                    c.result().unwrap();
                    let mut got = [0u8; 8];
                    c.take_buf().unwrap().read_at(0, &mut got).unwrap();
                    heard.push((c.qp().unwrap(), got));
                })
                .unwrap();
            if let Wake::Event(ev) = woke {
                let qp = ev.qp().expect("every event names its queue pair");
                assert!(who.contains_key(&qp));
                match ev.kind() {
                    Ev::ESTABLISHED => up += 1,
                    Ev::DISCONNECTED => down += 1,
                    other => panic!("{other:?}"),
                }
            }
        }
        assert_eq!(up, CLIENTS);
        assert_eq!(heard.len(), usize::from(CLIENTS));
        for (qp, got) in heard {
            let mut want = *b"client \0";
            want[7] = who[&qp];
            assert_eq!(got, want, "each receive names the queue pair that sent it");
        }
        assert_eq!(engine.qps().count(), usize::from(CLIENTS));
    });
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            std::thread::spawn(move || {
                let mut conn: CmConnection<MemoryRegion> =
                    cm::connect(addr, &support::config(), &[i], deadline()).unwrap();
                assert_eq!(&conn.peer_private_data()[..1], &[i]);
                let mut msg = *b"client \0";
                msg[7] = i;
                send_text(&mut conn, &msg);
                conn
            })
        })
        .collect();
    let conns: Vec<_> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    drop(conns); // each disconnects
    server.join().unwrap();
}

/// The client's half on a shared engine: resolve, place, receives
/// posted before `rdma_connect`, ESTABLISHED with the accept's private
/// data; the server sends the moment it is connected.
#[test]
fn a_client_places_its_queue_pair_and_posts_receives_before_connecting() {
    let addr = addr("rdma_cm_engine client side", 20912);
    let listener = CmListener::bind(addr).unwrap();
    let server = std::thread::spawn(move || {
        let mut conn: CmConnection<MemoryRegion> = listener
            .accept(&support::config(), b"welcome", deadline())
            .unwrap();
        send_text(&mut conn, b"first");
        conn.wait_disconnected(deadline()).unwrap();
    });
    let resolved = cm::resolve(addr, deadline()).unwrap();
    let pd = resolved.pd().clone();
    let mut engine: Engine<MemoryRegion> = engine_on(&pd, false);
    let qp = resolved.place(&mut engine, &support::config()).unwrap();
    let buf = MemoryRegion::new(&pd, 64).unwrap();
    engine
        .post_recv(qp, RecvRequest::new(buf))
        .map_err(|e| e.error)
        .unwrap();
    let refused = engine.cm_accept(qp, b"").unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::BadState, "{refused}");
    let long = [0u8; cm::MAX_CONNECT_PRIVATE_DATA + 1];
    let refused = engine.cm_connect(qp, &long).unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::InvalidArgument, "{refused}");
    engine.cm_connect(qp, b"hi").unwrap();
    let again = engine.cm_connect(qp, b"hi").unwrap_err();
    assert_eq!(again.kind(), ErrorKind::BadState, "connects once: {again}");
    let mut first = None;
    let ev = until_event(&mut engine, qp, Ev::ESTABLISHED, |c| {
        first = Some(c.into_owned())
    });
    assert!(ev.private_data().starts_with(b"welcome"));
    let mut first = first.unwrap_or_else(|| next_completion(&mut engine));
    first.result().unwrap();
    let mut got = [0u8; 5];
    first.take_buf().unwrap().read_at(0, &mut got).unwrap();
    assert_eq!(&got, b"first");
    engine.cm_disconnect(qp).unwrap();
    engine.cm_disconnect(qp).unwrap(); // once: the second does nothing
    assert_eq!(engine.state(qp).unwrap(), QpState::ERR);
    server.join().unwrap();
}

/// Hostile: the queue pair of a connection is removed from the shared
/// engine behind the connection manager's back. Its id goes with it (the
/// peer sees DISCONNECTED); the engine answers the connection's calls
/// with `NotFound` and serves the next client.
#[test]
fn a_connection_removed_behind_the_cms_back_ends_cleanly() {
    let addr = addr("rdma_cm_engine removed", 20913);
    let listener = CmListener::bind(addr).unwrap();
    let server = std::thread::spawn(move || {
        let pd = listener.pd().unwrap();
        let mut engine: Engine<MemoryRegion> = engine_on(&pd, false);
        let mut early = Vec::new();
        let mut serve = |engine: &mut Engine<MemoryRegion>| {
            let buf = MemoryRegion::new(&pd, 64).unwrap();
            let qp = place_next(&listener, engine, [RecvRequest::new(buf)]);
            engine.cm_accept(qp, b"").unwrap();
            until_event(engine, qp, Ev::ESTABLISHED, |c| early.push(c.into_owned()));
            qp
        };
        let gone = serve(&mut engine);
        engine.remove_qp(gone).unwrap();
        for e in [
            engine.cm_disconnect(gone).unwrap_err(),
            engine.cm_accept(gone, b"").unwrap_err(),
        ] {
            assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
        }
        while let Some(ev) = engine.cm_event().unwrap() {
            assert_eq!(
                ev.qp(),
                None,
                "a removed queue pair's late event names none"
            );
        }
        let next = serve(&mut engine);
        let c = early.pop().unwrap_or_else(|| next_completion(&mut engine));
        c.result().unwrap();
        assert_eq!(c.qp, Some(next));
        until_event(&mut engine, next, Ev::DISCONNECTED, |_| {});
    });
    let mut first: CmConnection<MemoryRegion> =
        cm::connect(addr, &support::config(), b"", deadline()).unwrap();
    first
        .wait_disconnected(deadline())
        .expect("the removed queue pair's id went with it: DISCONNECTED");
    let mut second: CmConnection<MemoryRegion> =
        cm::connect(addr, &support::config(), b"", deadline()).unwrap();
    send_text(&mut second, b"again");
    drop((first, second));
    server.join().unwrap();
}

/// Hostile: a request placed on an engine whose protection domain is on
/// another context of the device (`Context::open`'s, not librdmacm's) is
/// refused with the fix, and the refused request rejects its client;
/// a queue pair rdma_cm did not make has no connection to accept.
#[test]
fn an_engine_of_another_protection_domain_is_refused() {
    let addr = addr("rdma_cm_engine foreign pd", 20914);
    let listener = CmListener::bind(addr).unwrap();
    let server = std::thread::spawn(move || {
        // Context::open's context of the device, not librdmacm's.
        let ctx = support::test_context("foreign");
        let foreign =
            ProtectionDomain::new(&verbs::Context::open(Some(ctx.name())).unwrap()).unwrap();
        let mut engine: Engine<MemoryRegion> = engine_on(&foreign, false);
        let req = listener.request(deadline()).unwrap();
        let e = req.place(&mut engine, &support::config()).unwrap_err();
        println!("{e}");
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(e.to_string().contains("cm::context()"), "{e}");
        assert_eq!(engine.qps().count(), 0, "nothing placed");
        let plain = engine.add_qp(&support::config()).unwrap();
        let e = engine.cm_accept(plain, b"").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    });
    let refused = cm::connect::<MemoryRegion>(addr, &support::config(), b"", deadline())
        .err()
        .expect("the refused request rejects its client");
    println!("client: {refused}");
    server.join().unwrap();
}

/// Hostile: the peer vanishes (its queue pair and id destroyed without a
/// disconnect). Its DISCONNECTED arrives once, later reads find nothing,
/// the queue pair refuses posts, and the receive it held comes back to
/// its arena (flushed through the poll, or at the latest with the queue
/// pair's destroy: Soft-iWARP may keep it until then).
#[test]
fn events_read_after_the_peer_vanished() {
    let addr = addr("rdma_cm_engine peer vanished", 20915);
    let listener = CmListener::bind(addr).unwrap();
    let server = std::thread::spawn(move || {
        let pd = listener.pd().unwrap();
        let mut arena = arena_on(&pd);
        let mut engine: Engine<ArenaBuf> = engine_on(&pd, false);
        let receive = RecvRequest::new(arena.alloc(64).unwrap()).tag(7);
        let qp = place_next(&listener, &mut engine, [receive]);
        engine.cm_accept(qp, b"").unwrap();
        until_event(&mut engine, qp, Ev::ESTABLISHED, |_| {});
        let mut flushed = Vec::new();
        until_event(&mut engine, qp, Ev::DISCONNECTED, |c| {
            flushed.push(c.into_owned())
        });
        for _ in 0..3 {
            assert!(engine.cm_event().unwrap().is_none(), "DISCONNECTED once");
        }
        engine.cm_disconnect(qp).unwrap(); // nothing left to disconnect
        let msg = Local::range(arena.alloc(64).unwrap(), 0, 8).unwrap();
        let refused = engine
            .post_send(qp, SendRequest::new(SendOp::Send, msg))
            .unwrap_err();
        assert_eq!(
            refused.error.kind(),
            ErrorKind::BadState,
            "{}",
            refused.error
        );
        drop(refused);
        engine.poll(|c| flushed.push(c.into_owned())).unwrap();
        for c in &flushed {
            assert_eq!((c.tag, c.status), (7, WcStatus::WR_FLUSH_ERR));
        }
        drop(flushed);
        engine.remove_qp(qp).unwrap();
        assert!(engine.cm_event().unwrap().is_none());
        assert_eq!(arena.stats().alloc_count, 0, "the receive's buffer is back");
    });
    let conn: CmConnection<MemoryRegion> =
        cm::connect(addr, &support::config(), b"", deadline()).unwrap();
    drop(conn.into_queue_pair()); // destroyed, never disconnected
    server.join().unwrap();
}

/// Hostile: ids dropped with receives posted. Before the accept (the
/// queue pair removed: its client is refused) and after (the engine
/// dropped: its client sees DISCONNECTED); either way every receive
/// buffer comes back to the arena once the device is done with it.
#[test]
fn ids_dropped_with_receives_posted_give_every_buffer_back() {
    let addr = addr("rdma_cm_engine dropped with receives", 20916);
    let listener = CmListener::bind(addr).unwrap();
    let (server_done, wait_server) = mpsc::channel::<()>();
    let server = std::thread::spawn(move || {
        let pd = listener.pd().unwrap();
        let mut arena = arena_on(&pd);
        let mut engine: Engine<ArenaBuf> = engine_on(&pd, false);
        let mut place_with_receives = |engine: &mut Engine<ArenaBuf>| {
            let receives = (0..8).map(|_| RecvRequest::new(arena.alloc(256).unwrap()));
            place_next(&listener, engine, receives)
        };
        let refused = place_with_receives(&mut engine);
        engine.remove_qp(refused).unwrap();
        let accepted = place_with_receives(&mut engine);
        engine.cm_accept(accepted, b"").unwrap();
        until_event(&mut engine, accepted, Ev::ESTABLISHED, |_| {});
        drop(engine);
        assert_eq!(arena.stats().alloc_count, 0, "every receive buffer back");
        server_done.send(()).unwrap();
    });
    let e = cm::connect::<MemoryRegion>(addr, &support::config(), b"", deadline())
        .err()
        .expect("a request whose queue pair was removed is refused");
    println!("first client: {e}");
    let mut second: CmConnection<MemoryRegion> =
        cm::connect(addr, &support::config(), b"", deadline()).unwrap();
    wait_server.recv().unwrap();
    second
        .wait_disconnected(deadline())
        .expect("the dropped engine's connection ended");
    server.join().unwrap();
}
