//! A keepalive over RC: a zero-length RDMA Write that names no memory
//! (address 0, key 0; the spec, C9-88, has the responder check no key for
//! a zero-length Read or Write). The peer's queue pair acknowledges it
//! without touching memory; a peer that is gone never does, and the write
//! fails after the retries. That is how a server finds a client that died
//! with nothing of its in flight (`examples/rpc`).

mod support;

use std::time::Instant;

use verbs::{
    Access, ConnectOptions, MemoryRegion, ProtectionDomain, QpConfig, QueuePair, RemoteSlice,
    SendOp, SendRequest, WcStatus,
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
