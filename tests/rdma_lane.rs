//! Lanes (`Engine::lane`: one queue pair's prepared send and receive,
//! checked once and posted often) on a real device: a ping-pong lands
//! every message; other queue pairs' completions come back with their
//! buffers meanwhile; a failed completion is the lane's error and stops the
//! queue pair; and a lane dropped or forgotten with posts in flight leaves
//! their buffers out of reach until the engine's poll hands them back.

mod support;

use verbs::{
    Engine, ErrorKind, Local, MemoryRegion, NicBuf, Prepared, PreparedRecv, PreparedSend,
    ProtectionDomain, QpId, QpState, Queue, QueuePair, RecvRequest, RemoteSlice, SendOp,
    SendRequest, WcStatus,
};

type Qp = QueuePair<MemoryRegion>;

fn prepared_send(qp: &mut Qp, pd: &ProtectionDomain, op: SendOp, tag: u64) -> PreparedSend {
    let local = Local::range(MemoryRegion::new(pd, 4096).unwrap(), 0, 64).unwrap();
    qp.prepare_send(SendRequest::new(op, local).tag(tag))
        .map_err(|e| e.error)
        .unwrap()
}

fn prepared_recv(qp: &mut Qp, pd: &ProtectionDomain, tag: u64) -> PreparedRecv {
    let buf = MemoryRegion::new(pd, 4096).unwrap();
    qp.prepare_recv(RecvRequest::new(Local::whole(buf)).tag(tag))
        .map_err(|e| e.error)
        .unwrap()
}

/// Polls `lane` on both queues until `want` says it saw enough; every
/// other request must not come.
fn poll_until(
    lane: &mut verbs::Lane<'_, MemoryRegion>,
    mut want: impl FnMut(verbs::LanePoll) -> bool,
) {
    let deadline = support::deadline();
    loop {
        for q in [Queue::Send, Queue::Recv] {
            let got = lane
                .poll(q, |c| panic!("no other request is in flight: {c:?}"))
                .expect("lane poll");
            if want(got) {
                return;
            }
        }
        assert!(!deadline.passed(), "the lane's completion did not come");
    }
}

#[test]
fn a_lane_ping_pong_lands_every_message() {
    let (pd, mut a, mut b) =
        support::pd_and_pair::<MemoryRegion>("a_lane_ping_pong_lands_every_message");
    let (sa, ra) = (
        prepared_send(&mut a, &pd, SendOp::Send, 1),
        prepared_recv(&mut a, &pd, 2),
    );
    let (sb, rb) = (
        prepared_send(&mut b, &pd, SendOp::Send, 3),
        prepared_recv(&mut b, &pd, 4),
    );
    let mut la = a.lane(sa, Some(ra)).unwrap();
    let mut lb = b.lane(sb, Some(rb)).unwrap();
    assert_eq!(la.qp().index(), 0);
    lb.post_recv().unwrap();
    la.post_recv().unwrap();
    for k in 0..500u32 {
        let msg = k.to_le_bytes();
        la.write_send(0, &msg).unwrap();
        la.post_send().unwrap();
        let err = la
            .write_send(0, &msg)
            .expect_err("the NIC's while the send is in flight");
        assert_eq!(err.kind(), ErrorKind::BadState);
        poll_until(&mut lb, |p| p.received == 1);
        assert_eq!(lb.received_len(), 64, "a whole 64-byte send arrived");
        let mut got = [0u8; 4];
        lb.read_recv(0, &mut got).unwrap();
        assert_eq!(u32::from_le_bytes(got), k, "message {k} landed");
        lb.post_recv().unwrap();
        // The reply, and a's own send's completion.
        lb.write_send(0, &(!k).to_le_bytes()).unwrap();
        lb.post_send().unwrap();
        let (mut sent, mut back) = (0, 0);
        poll_until(&mut la, |p| {
            sent += p.sent;
            back += p.received;
            sent == 1 && back == 1
        });
        la.read_recv(0, &mut got).unwrap();
        assert_eq!(u32::from_le_bytes(got), !k, "reply {k} landed");
        la.post_recv().unwrap();
        poll_until(&mut lb, |p| p.sent == 1);
    }
    drop((la, lb));
    assert_eq!(
        a.in_flight().unwrap(),
        (0, 1),
        "the last receive is still posted"
    );
    assert!(a.prepared_buf(ra).is_err(), "and its buffer the NIC's");
    a.prepared_buf(sa).expect("the send is idle");
}

/// Two engines of two queue pairs each, pair `i` of one connected to pair
/// `i` of the other.
fn two_engines(
    pd: &ProtectionDomain,
) -> (
    Engine<MemoryRegion>,
    Vec<QpId>,
    Engine<MemoryRegion>,
    Vec<QpId>,
) {
    let mut a: Engine<MemoryRegion> = Engine::new(pd, &Default::default()).unwrap();
    let mut b: Engine<MemoryRegion> = Engine::new(pd, &Default::default()).unwrap();
    let (qa, qb) = support::engine_pairs(&mut a, &mut b, &support::config(), 2);
    (a, qa, b, qb)
}

#[test]
fn other_queue_pairs_completions_come_back_with_their_buffers_during_a_lane() {
    let ctx = support::test_context(
        "other_queue_pairs_completions_come_back_with_their_buffers_during_a_lane",
    );
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let (mut a, qa, b, _qb) = two_engines(&pd);
    let target = support::remote_region(&pd, 4096);
    let remote = target.remote().unwrap();
    let write = |at| SendOp::Write(RemoteSlice::new(&remote, at, 64).unwrap());
    let lane_src = Local::range(MemoryRegion::new(&pd, 4096).unwrap(), 0, 64).unwrap();
    let ping = a
        .prepare_send(qa[0], SendRequest::new(write(0), lane_src).tag(10))
        .map_err(|e| e.error)
        .unwrap();
    // A receive of the other queue pair on the same engine: refused.
    let other_recv = a
        .prepare_recv(
            qa[1],
            RecvRequest::new(Local::whole(MemoryRegion::new(&pd, 64).unwrap())),
        )
        .map_err(|e| e.error)
        .unwrap();
    assert_eq!(
        a.lane(ping, Some(other_recv)).err().map(|e| e.kind()),
        Some(ErrorKind::InvalidArgument),
        "a send and a receive of two queue pairs"
    );
    // Queue pair 1's own-buffer Writes, in flight when the lane starts.
    let mut posted = Vec::new();
    for k in 0..4u64 {
        let buf = MemoryRegion::new(&pd, 4096).unwrap();
        posted.push(buf.addr());
        let local = Local::range(buf, 0, 64).unwrap();
        a.post_send(
            qa[1],
            SendRequest::new(write(64 + 64 * k), local).tag(20 + k),
        )
        .map_err(|e| e.error)
        .unwrap();
    }
    let mut lane = a.lane(ping, None).unwrap();
    lane.post_send().unwrap();
    let (mut sent, mut back) = (0, Vec::new());
    let deadline = support::deadline();
    while sent < 1 || back.len() < 4 {
        let got = lane
            .poll(Queue::Send, |mut c| {
                assert_eq!(
                    c.qp(),
                    Some(qa[1]),
                    "only queue pair 1's come to the callback"
                );
                assert_eq!(c.status(), WcStatus::SUCCESS);
                let tag = c.tag();
                back.push((tag, c.take_buf().expect("its buffer comes back").addr()));
            })
            .unwrap();
        sent += got.sent;
        assert!(
            !deadline.passed(),
            "{sent} lane sends, {} others came back",
            back.len()
        );
    }
    back.sort();
    let want: Vec<(u64, u64)> = (0..4).map(|k| (20 + k, posted[k as usize])).collect();
    assert_eq!(back, want, "each buffer came back once, with its tag");
    drop(lane);
    assert_eq!(a.in_flight(qa[0]).unwrap(), (0, 0));
    assert_eq!(a.in_flight(qa[1]).unwrap(), (0, 0));
    drop(b);
}

#[test]
fn a_lane_refuses_what_it_cannot_own() {
    let (pd, mut a, mut b) =
        support::pd_and_pair::<MemoryRegion>("a_lane_refuses_what_it_cannot_own");
    let send = prepared_send(&mut a, &pd, SendOp::Send, 1);
    let recv_b = prepared_recv(&mut b, &pd, 2);
    // Another engine's receive, and another engine's send.
    assert_eq!(
        a.lane(send, Some(recv_b)).err().map(|e| e.kind()),
        Some(ErrorKind::NotFound)
    );
    assert!(
        b.lane(send, None).is_err(),
        "a's handle reaches nothing on b"
    );
    // A request in flight on the queue pair that is not the lane's.
    b.post_recv(RecvRequest::new(Local::whole(
        MemoryRegion::new(&pd, 64).unwrap(),
    )))
    .map_err(|e| e.error)
    .unwrap();
    let other = prepared_recv(&mut a, &pd, 3);
    a.post_prepared(other).unwrap();
    let recv = prepared_recv(&mut a, &pd, 4);
    assert_eq!(
        a.lane(send, Some(recv)).err().map(|e| e.kind()),
        Some(ErrorKind::InvalidArgument),
        "another prepared receive is posted"
    );
    // The lane without a receive side is fine: that receive is not its.
    let mut lane = a.lane(send, None).unwrap();
    assert!(lane.post_recv().is_err(), "no receive to post");
    assert!(lane.read_recv(0, &mut [0]).is_err());
    drop(lane);
    // A released handle.
    a.post_prepared(send).unwrap();
    let mut n = 0;
    let deadline = support::deadline();
    while n < 2 {
        n += b.poll(|_| {}).unwrap();
        n += a
            .poll(|c| assert_eq!(c.prepared(), Some(Prepared::Send(send))))
            .unwrap();
        assert!(!deadline.passed());
    }
    let _ = a.release_prepared(send).unwrap();
    assert_eq!(
        a.lane(send, None).err().map(|e| e.kind()),
        Some(ErrorKind::NotFound)
    );
}

#[test]
fn a_failed_completion_is_the_lanes_error_and_stops_its_queue_pair() {
    let (pd, mut a, _b) = support::pd_and_pair::<MemoryRegion>(
        "a_failed_completion_is_the_lanes_error_and_stops_its_queue_pair",
    );
    // A Write the peer refuses: no region has this rkey.
    let bad = SendOp::Write(RemoteSlice::unchecked(0x1000, 64, 0xdead_beef));
    let send = prepared_send(&mut a, &pd, bad, 5);
    let mut lane = a.lane(send, None).unwrap();
    lane.post_send().unwrap();
    let deadline = support::deadline();
    let err = loop {
        match lane.poll(Queue::Send, |c| panic!("not the lane's: {c:?}")) {
            Ok(p) => assert_eq!(p.sent, 0, "a refused Write does not succeed"),
            Err(e) => break e,
        }
        assert!(!deadline.passed(), "the failure did not come");
    };
    assert_eq!(err.wc_status(), Some(WcStatus::REM_ACCESS_ERR));
    let err = lane.post_send().expect_err("the queue pair is in ERR");
    assert_eq!(err.kind(), ErrorKind::BadState);
    drop(lane);
    assert_eq!(a.state().unwrap(), QpState::ERR);
    assert_eq!(a.in_flight().unwrap(), (0, 0));
    a.prepared_buf(send)
        .expect("idle: its post came back failed");
}

/// The NIC may still use both requests' buffers: a loan of the send's and
/// a release of the receive's are refused.
fn refuses_both(engine: &mut Engine<MemoryRegion>, send: PreparedSend, recv: PreparedRecv) {
    assert_eq!(
        engine.prepared_buf(send).err().map(|e| e.kind()),
        Some(ErrorKind::BadState)
    );
    assert_eq!(
        engine.release_prepared(recv).err().map(|e| e.kind()),
        Some(ErrorKind::BadState)
    );
}

/// Dropped, a lane leaves its posts in flight to the engine: their
/// buffers stay out of reach until the engine's own poll hands the posts
/// back, each as a post of its prepared request.
#[test]
fn a_dropped_lane_leaves_its_buffers_out_of_reach_until_polled() {
    let (pd, mut a, mut b) = support::pd_and_pair::<MemoryRegion>(
        "a_dropped_lane_leaves_its_buffers_out_of_reach_until_polled",
    );
    let send = prepared_send(&mut a, &pd, SendOp::Send, 7);
    let recv = prepared_recv(&mut a, &pd, 8);
    let reply = prepared_send(&mut b, &pd, SendOp::Send, 9);
    for round in 0..2 {
        let mut lane = a.lane(send, Some(recv)).unwrap();
        lane.post_recv().unwrap();
        lane.post_recv().unwrap();
        b.post_recv(RecvRequest::new(Local::whole(
            MemoryRegion::new(&pd, 64).unwrap(),
        )))
        .map_err(|e| e.error)
        .unwrap();
        lane.post_send().unwrap();
        drop(lane);
        assert_eq!(a.in_flight().unwrap(), (1, 2));
        refuses_both(a.engine_mut(), send, recv);
        // The ping arrives; the peer's two replies fill the two receives.
        let deadline = support::deadline();
        while b
            .poll(|c| assert_eq!(c.status(), WcStatus::SUCCESS))
            .unwrap()
            == 0
        {
            assert!(!deadline.passed(), "the ping did not arrive");
        }
        b.post_prepared(reply).unwrap();
        b.post_prepared(reply).unwrap();
        let mut back = Vec::new();
        while back.len() < 3 {
            b.poll(|c| assert_eq!(c.status(), WcStatus::SUCCESS))
                .unwrap();
            a.poll(|c| back.push((c.tag(), c.prepared(), c.status())))
                .unwrap();
            assert!(!deadline.passed(), "{back:?}");
        }
        back.sort_by_key(|b| b.0);
        assert_eq!(
            back,
            vec![
                (7, Some(Prepared::Send(send)), WcStatus::SUCCESS),
                (8, Some(Prepared::Recv(recv)), WcStatus::SUCCESS),
                (8, Some(Prepared::Recv(recv)), WcStatus::SUCCESS),
            ],
            "round {round}"
        );
        while b.in_flight().unwrap().0 != 0 {
            b.poll(|_| {}).unwrap();
            assert!(!deadline.passed());
        }
        a.prepared_buf(send).expect("idle once polled");
        a.prepared_buf(recv).expect("idle once polled");
    }
}

/// Forgotten (`mem::forget` skips its `Drop`), a lane keeps its queue
/// pair: the queue pair is leaked, as after a failed destroy, and so are
/// the buffers of its prepared requests, which are never lent, released
/// or posted again, whatever the peer does.
#[test]
fn a_forgotten_lane_leaks_its_queue_pair_and_its_buffers() {
    let (pd, mut a, mut b) = support::pd_and_pair::<MemoryRegion>(
        "a_forgotten_lane_leaks_its_queue_pair_and_its_buffers",
    );
    let send = prepared_send(&mut a, &pd, SendOp::Send, 7);
    let recv = prepared_recv(&mut a, &pd, 8);
    let mut lane = a.lane(send, Some(recv)).unwrap();
    lane.post_recv().unwrap();
    b.post_recv(RecvRequest::new(Local::whole(
        MemoryRegion::new(&pd, 64).unwrap(),
    )))
    .map_err(|e| e.error)
    .unwrap();
    lane.post_send().unwrap();
    std::mem::forget(lane);
    // The peer's reply lands in the forgotten lane's receive.
    let reply = prepared_send(&mut b, &pd, SendOp::Send, 9);
    let deadline = support::deadline();
    while b.poll(|_| {}).unwrap() == 0 {
        assert!(!deadline.passed(), "the ping did not arrive");
    }
    b.post_prepared(reply).unwrap();
    while b.in_flight().unwrap().0 != 0 {
        b.poll(|_| {}).unwrap();
        assert!(!deadline.passed());
    }
    let engine = a.engine_mut();
    assert_eq!(
        engine
            .poll(|c| panic!("nothing comes back: {c:?}"))
            .unwrap(),
        0
    );
    assert_eq!(engine.qps().count(), 0, "the queue pair went with the lane");
    refuses_both(engine, send, recv);
    assert!(engine.post_prepared(send).is_err());
    assert!(engine.lane(send, Some(recv)).is_err());
    // Dropping the engine leaks what the queue pair may still use.
    drop(a);
}

/// A callback that panics on another queue pair's completion unwinds out
/// of the lane's poll; the lane stays whole (its queue pair is back in the
/// lane, not lost in the engine) and goes on posting and polling.
#[test]
fn a_panicking_callback_leaves_the_lane_whole() {
    let ctx = support::test_context("a_panicking_callback_leaves_the_lane_whole");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let (mut a, qa, b, _qb) = two_engines(&pd);
    let target = support::remote_region(&pd, 4096);
    let remote = target.remote().unwrap();
    let write = |at| SendOp::Write(RemoteSlice::new(&remote, at, 64).unwrap());
    let src = Local::range(MemoryRegion::new(&pd, 4096).unwrap(), 0, 64).unwrap();
    let ping = a
        .prepare_send(qa[0], SendRequest::new(write(0), src))
        .map_err(|e| e.error)
        .unwrap();
    let other = Local::range(MemoryRegion::new(&pd, 4096).unwrap(), 0, 64).unwrap();
    a.post_send(qa[1], SendRequest::new(write(64), other).tag(1))
        .map_err(|e| e.error)
        .unwrap();
    let mut lane = a.lane(ping, None).unwrap();
    let deadline = support::deadline();
    let mut panicked = false;
    while !panicked {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            lane.poll(Queue::Send, |_| panic!("the caller's callback panics"))
        }));
        panicked = r.is_err();
        assert!(!deadline.passed(), "queue pair 1's Write did not complete");
    }
    assert_eq!(lane.qp(), qa[0]);
    for _ in 0..10 {
        lane.post_send().unwrap();
        poll_until(&mut lane, |p| p.sent == 1);
    }
    drop(lane);
    assert_eq!(a.in_flight(qa[0]).unwrap(), (0, 0));
    assert_eq!(
        a.in_flight(qa[1]).unwrap(),
        (0, 0),
        "the panic's request was retired"
    );
    assert_eq!(a.qps().count(), 2);
    drop(b);
}
