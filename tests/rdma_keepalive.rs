//! A keepalive over RC: a zero-length RDMA Write that names no memory
//! (address 0, key 0; the spec, C9-88, has the responder check no key for
//! a zero-length Read or Write). The peer's queue pair acknowledges it
//! without touching memory; a peer that is gone never does, and the write
//! fails after the retries. That is how a server finds a client that died
//! with nothing of its in flight (`examples/rpc`): the library's
//! `Engine::keepalive` and `KeepaliveTable`, and what a hostile caller
//! tries with them (a datagram, unconnected, removed or foreign queue pair).

mod support;

use std::time::Instant;

use verbs::{
    Access, ConnectOptions, Engine, EngineConfig, ErrorKind, KeepaliveTable, MemoryRegion,
    ProtectionDomain, QpConfig, QpId, QueuePair, RemoteSlice, SendOp, SendRequest, Transport,
    WcStatus,
};

type Qp = QueuePair<MemoryRegion>;

/// Found dead after about timeout x (retry_cnt + 1): 4 x 67 ms.
fn fast_failing() -> ConnectOptions {
    ConnectOptions {
        timeout: 14,
        retry_cnt: 3,
        ..ConnectOptions::default()
    }
}

/// A connected pair whose queue pairs allow `remote_access`.
fn pair(test: &str, remote_access: Access) -> (ProtectionDomain, Qp, Qp) {
    let pd = ProtectionDomain::new(&support::test_context(test)).unwrap();
    let config = QpConfig {
        remote_access,
        ..QpConfig::default()
    };
    let (a, b) = support::connected_pair_with(&pd, &config, &fast_failing());
    (pd, a, b)
}

fn keepalive() -> SendRequest<MemoryRegion> {
    SendRequest::empty(SendOp::Write(RemoteSlice::unchecked(0, 0, 0)))
}

fn status_of_keepalive(qp: &mut Qp) -> WcStatus {
    qp.post_send(keepalive()).map_err(|e| e.error).unwrap();
    qp.wait_one(support::deadline())
        .expect("a completion, not a hang")
        .status
}

#[test]
fn a_keepalive_is_acknowledged_by_a_live_peer_and_fails_once_the_peer_is_gone() {
    // The peer allows remote writes at the queue pair but registers no
    // memory that allows them: the keepalive is all a peer can do.
    let (_pd, mut a, b) = pair("keepalive_live_then_gone", Access::REMOTE_WRITE);
    for _ in 0..3 {
        assert_eq!(status_of_keepalive(&mut a), WcStatus::SUCCESS);
    }
    // The peer's queue pair is destroyed: its number answers nothing, as
    // a powered-off host does.
    drop(b);
    let started = Instant::now();
    // A status, not the test's deadline: the retries (4 x 67 ms) found it.
    assert_eq!(status_of_keepalive(&mut a), WcStatus::RETRY_EXC_ERR);
    println!("found gone after {:?}", started.elapsed());
}

#[test]
fn a_keepalive_to_a_queue_pair_that_allows_no_remote_write_is_refused_by_the_peer() {
    // The default: least privilege, nothing remote allowed. The peer is
    // alive, but the keepalive is an invalid request to it; a peer that
    // is to be kept alive must allow REMOTE_WRITE at its queue pair.
    let (_pd, mut a, _b) = pair("keepalive_needs_remote_write", Access::EMPTY);
    assert_eq!(status_of_keepalive(&mut a), WcStatus::REM_INV_REQ_ERR);
}

#[test]
fn a_keepalive_carries_no_data() {
    let (pd, mut a, _b) = pair("keepalive_carries_no_data", Access::REMOTE_WRITE);
    // Data aimed at the slice that names no memory is refused before it
    // is posted: the slice is zero bytes long.
    let local = MemoryRegion::new(&pd, 64).unwrap();
    let refused = a
        .post_send(SendRequest::new(
            SendOp::Write(RemoteSlice::unchecked(0, 0, 0)),
            local,
        ))
        .expect_err("64 bytes do not fit a zero-length slice");
    assert!(
        refused.error.to_string().contains("remote slice"),
        "{}",
        refused.error
    );
}

/// Two engines, a prober and a peer, with one queue pair each connected
/// to the other; the peer's allows `remote_access`.
fn engines(
    pd: &ProtectionDomain,
    remote_access: Access,
) -> (Engine<MemoryRegion>, QpId, Engine<MemoryRegion>, QpId) {
    let mut prober: Engine<MemoryRegion> = Engine::new(pd, &EngineConfig::default()).unwrap();
    let mut peer: Engine<MemoryRegion> = Engine::new(pd, &EngineConfig::default()).unwrap();
    let a = prober.add_qp(&QpConfig::default()).unwrap();
    let b = peer
        .add_qp(&QpConfig {
            remote_access,
            ..QpConfig::default()
        })
        .unwrap();
    let (ea, eb) = (prober.endpoint(a).unwrap(), peer.endpoint(b).unwrap());
    prober.connect_with(a, &eb, &fast_failing()).unwrap();
    peer.connect_with(b, &ea, &fast_failing()).unwrap();
    (prober, a, peer, b)
}

/// The library's keepalive on `qp` with `tag`: its completion's status.
fn engine_keepalive(engine: &mut Engine<MemoryRegion>, qp: QpId, tag: u64) -> WcStatus {
    engine.keepalive(qp, tag).unwrap();
    let mut status = None;
    engine
        .wait(support::deadline(), |mut c| {
            assert_eq!((c.qp(), c.tag()), (Some(qp), tag));
            assert!(c.take_buf().is_none(), "a keepalive holds no buffer");
            status = Some(c.status());
        })
        .expect("a completion, not a hang");
    status.unwrap()
}

#[test]
fn the_engines_keepalive_is_acknowledged_by_a_live_peer_and_fails_once_it_is_gone() {
    let pd =
        ProtectionDomain::new(&support::test_context("engine_keepalive_live_then_gone")).unwrap();
    let (mut prober, a, mut peer, b) = engines(&pd, Access::REMOTE_WRITE);
    // Through the table: a connection heard from is not probed; a silent
    // one is, and its live peer acknowledges.
    let mut table = KeepaliveTable::with_capacity(4);
    table.add(a);
    assert_eq!(
        table.probe_silent(&mut prober, 7),
        0,
        "heard from when added"
    );
    assert_eq!(table.probe_silent(&mut prober, 7), 1, "silent for a round");
    let mut done = Vec::new();
    prober
        .wait(support::deadline(), |c| done.push((c.tag(), c.status())))
        .unwrap();
    assert_eq!(done, [(7, WcStatus::SUCCESS)]);
    for tag in 1..=3 {
        assert_eq!(engine_keepalive(&mut prober, a, tag), WcStatus::SUCCESS);
    }
    // The peer's queue pair is destroyed: nothing answers its number.
    peer.remove_qp(b).unwrap();
    assert_eq!(engine_keepalive(&mut prober, a, 9), WcStatus::RETRY_EXC_ERR);
    // In ERR now: a second probe is refused, not posted.
    let err = prober.keepalive(a, 10).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BadState, "{err}");
    assert_eq!(table.probe_silent(&mut prober, 7), 0);
}

#[test]
fn the_engines_keepalive_to_a_peer_allowing_no_remote_write_is_refused_by_it() {
    let pd =
        ProtectionDomain::new(&support::test_context("engine_keepalive_no_remote_write")).unwrap();
    let (mut prober, a, _peer, _b) = engines(&pd, Access::EMPTY);
    assert_eq!(
        engine_keepalive(&mut prober, a, 1),
        WcStatus::REM_INV_REQ_ERR
    );
}

/// What a hostile caller tries: a keepalive on a datagram queue pair, on
/// one not yet connected, on a removed one, on another engine's; each is
/// an error and posts nothing.
#[test]
fn a_keepalive_on_a_datagram_unconnected_removed_or_foreign_queue_pair_is_an_error() {
    let pd = ProtectionDomain::new(&support::test_context("engine_keepalive_hostile")).unwrap();
    let (mut prober, a, mut peer, b) = engines(&pd, Access::REMOTE_WRITE);
    let ud = prober
        .add_qp(&QpConfig {
            transport: Transport::Ud,
            ..QpConfig::default()
        })
        .unwrap();
    prober.ready_ud(ud).unwrap();
    let err = prober.keepalive(ud, 1).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    let unconnected = prober.add_qp(&QpConfig::default()).unwrap();
    let err = prober.keepalive(unconnected, 1).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BadState, "{err}");
    prober.remove_qp(unconnected).unwrap();
    let err = prober.keepalive(unconnected, 1).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    // The peer engine's queue pair, live and connected, named on the
    // prober; and the prober's on the peer.
    let err = prober.keepalive(b, 1).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    let err = peer.keepalive(a, 1).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    // A table takes the prober's queue pairs and refuses the peer's; of
    // those it holds, only the connected RC one is probed.
    let mut table = KeepaliveTable::with_capacity(1);
    assert!(table.add(a) && table.add(ud) && table.add(unconnected));
    assert!(!table.add(b), "another engine's queue pair");
    table.end_round(|_| {});
    assert_eq!(table.probe_silent(&mut prober, 2), 1);
    assert_eq!(prober.in_flight(a).unwrap(), (1, 0));
    assert_eq!(prober.in_flight(ud).unwrap(), (0, 0));
    let mut done = Vec::new();
    prober
        .wait(support::deadline(), |c| {
            done.push((c.qp(), c.tag(), c.status()))
        })
        .unwrap();
    assert_eq!(done, [(Some(a), 2, WcStatus::SUCCESS)]);
}
