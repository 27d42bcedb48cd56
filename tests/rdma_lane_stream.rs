//! A lane as a bandwidth sender (`Lane::post_send_unsignaled`) on a real
//! device: every write of a stream lands and is counted once, through the
//! signaled ones that complete it; a queue filled with unsignaled posts
//! still completes (the lane signals one when the queue needs it); the
//! buffer stays the NIC's while any post is in flight; and a lane dropped
//! with unsignaled posts in flight leaves them to the engine, which hands
//! them back, unsignaled, with the next signaled one.

mod support;

use verbs::{
    ErrorKind, HostBuf, Local, MemoryRegion, Prepared, PreparedSend, Queue, QueuePair, RemoteSlice,
    SendOp, SendRequest, WcStatus,
};

type Qp = QueuePair<MemoryRegion>;

/// A connected pair, a target region on the peer's side, and a prepared
/// 64-byte write of a pattern into the target's first 64 bytes.
fn writer(test: &str) -> (Qp, Qp, MemoryRegion, PreparedSend) {
    let (pd, mut a, b) = support::pd_and_pair::<MemoryRegion>(test);
    let target = support::remote_region(&pd, 4096);
    let mut src = MemoryRegion::new(&pd, 64).unwrap();
    src.write_at(0, &support::pattern(5, 64)).unwrap();
    let dst = RemoteSlice::new(&target.remote().unwrap(), 0, 64).unwrap();
    let local = Local::range(src, 0, 64).unwrap();
    let w = a
        .prepare_send(SendRequest::new(SendOp::Write(dst), local).tag(5))
        .map_err(|e| e.error)
        .unwrap();
    (a, b, target, w)
}

/// Polls until at least one send completes; returns how many did.
fn wait_sent(lane: &mut verbs::Lane<'_, MemoryRegion>) -> u64 {
    let deadline = support::deadline();
    loop {
        let got = lane
            .poll(Queue::Send, |c| panic!("no other request: {c:?}"))
            .expect("lane poll");
        if got.sent != 0 {
            return got.sent;
        }
        assert!(!deadline.passed(), "no send completed");
    }
}

#[test]
fn a_streaming_lane_lands_every_write_and_counts_each_once() {
    let (mut a, _b, target, w) = writer("a_streaming_lane_lands_every_write_and_counts_each_once");
    let mut lane = a.lane(w, None).unwrap();
    let (total, mut posted, mut sent) = (2000u64, 0u64, 0u64);
    while sent < total {
        // Every 16th and the last signaled, as a bandwidth test posts.
        while posted < total && posted - sent < 64 {
            posted += 1;
            if posted % 16 == 0 || posted == total {
                lane.post_send().unwrap();
            } else {
                lane.post_send_unsignaled().unwrap();
            }
        }
        let err = lane
            .write_send(0, &[0])
            .expect_err("the NIC's while a post is in flight");
        assert_eq!(err.kind(), ErrorKind::BadState);
        sent += wait_sent(&mut lane);
        assert!(sent <= posted, "{sent} counted of {posted} posted");
    }
    assert_eq!(sent, total, "each write counted once");
    lane.write_send(0, &[1]).expect("idle once all completed");
    drop(lane);
    assert_eq!(a.in_flight().unwrap(), (0, 0));
    let mut landed = [0u8; 64];
    target.read_at(0, &mut landed).unwrap();
    assert_eq!(&landed[..], &support::pattern(5, 64)[..]);
}

#[test]
fn a_queue_full_of_unsignaled_posts_still_completes() {
    let (mut a, _b, _target, w) = writer("a_queue_full_of_unsignaled_posts_still_completes");
    let mut lane = a.lane(w, None).unwrap();
    for round in 0..3 {
        // Only unsignaled posts asked for, until the queue refuses one.
        let mut posted = 0u64;
        let refused = loop {
            match lane.post_send_unsignaled() {
                Ok(()) => posted += 1,
                Err(e) => break e,
            }
            assert!(posted <= 4096, "the queue never filled");
        };
        assert_eq!(refused.kind(), ErrorKind::QueueFull, "round {round}");
        assert!(posted >= 2, "round {round}: {posted}");
        // The lane signaled some of them: they complete while nothing
        // else is posted.
        let mut sent = wait_sent(&mut lane);
        // One signaled post completes the rest.
        lane.post_send().unwrap();
        posted += 1;
        while sent < posted {
            sent += wait_sent(&mut lane);
        }
        assert_eq!(sent, posted, "round {round}");
    }
}

#[test]
fn a_lane_dropped_with_unsignaled_posts_leaves_them_to_the_engine() {
    let (mut a, _b, _target, w) =
        writer("a_lane_dropped_with_unsignaled_posts_leaves_them_to_the_engine");
    let mut lane = a.lane(w, None).unwrap();
    for _ in 0..3 {
        lane.post_send_unsignaled().unwrap();
    }
    drop(lane);
    assert_eq!(a.in_flight().unwrap(), (3, 0));
    let err = a.prepared_buf(w).expect_err("the NIC's until a completion");
    assert_eq!(err.kind(), ErrorKind::BadState);
    // Nothing completes them until a signaled post does.
    a.post_prepared(w).unwrap();
    let mut back = Vec::new();
    let deadline = support::deadline();
    while back.len() < 4 {
        a.poll(|c| back.push((c.prepared(), c.status(), c.signaled())))
            .unwrap();
        assert!(!deadline.passed(), "{back:?}");
    }
    let (p, ok) = (Some(Prepared::Send(w)), WcStatus::SUCCESS);
    assert_eq!(
        back,
        [
            (p, ok, false),
            (p, ok, false),
            (p, ok, false),
            (p, ok, true)
        ]
    );
    a.prepared_buf(w).expect("idle once polled");
}
