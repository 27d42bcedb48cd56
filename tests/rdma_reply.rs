//! Posting from a poll's callback (`CompletionRef::poster`, `reply`,
//! `repost_recv`): a server answers each request and posts its receives
//! again from inside `Engine::poll`, without collecting anything to post
//! after it; and what a hostile callback tries instead: posting on a queue
//! pair that failed, was removed, belongs to another engine or is being
//! reset, posting again what it already took, posting then panicking,
//! forgetting the completion, filling the completion queue, posting on a
//! lane's queue pair from the lane's callback.

mod support;

use verbs::{
    Engine, EngineConfig, ErrorKind, HostBuf, Local, MemoryRegion, PortCounters, ProtectionDomain,
    QpCounters, QpId, QpState, Queue, RecvRequest, RemoteSlice, SendOp, SendRequest,
};

const MSG: usize = 16;

/// An engine with two queue pairs connected to each other (loopback;
/// through rdma_cm on iWARP).
fn engine_pair(pd: &ProtectionDomain, engine: &EngineConfig) -> (Engine<MemoryRegion>, QpId, QpId) {
    let mut e: Engine<MemoryRegion> = Engine::new(pd, engine).unwrap();
    let (x, y) = support::pair_on(&mut e, &support::shallow_config());
    (e, x, y)
}

fn msg(pd: &ProtectionDomain, byte: u8) -> SendRequest<MemoryRegion> {
    let mut buf = MemoryRegion::new(pd, MSG).unwrap();
    buf.write_at(0, &[byte; MSG]).unwrap();
    SendRequest::new(
        SendOp::Send,
        Local::range(buf, 0, MSG).map_err(|(e, _)| e).unwrap(),
    )
}

/// A client queue pair sends requests to a server queue pair of an engine
/// with a shared receive queue; the server's callback turns each receive's
/// buffer into the reply (the request's byte plus one) and posts it on the
/// queue pair the request came from, and each reply's buffer back to the
/// shared receive queue when its send completes. The client's callback
/// posts its receive again. No request or buffer is collected for later.
#[test]
fn a_server_replies_and_refills_its_receives_from_its_poll_callback() {
    let ctx = support::test_context("a_server_replies_from_its_poll_callback");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let (mut server, mut client, s, c) = support::srq_server_and_client(&pd, 4, MSG);
    client
        .post_recv(c, RecvRequest::new(MemoryRegion::new(&pd, MSG).unwrap()))
        .map_err(|e| e.error)
        .unwrap();

    const ROUNDS: u8 = 50;
    let (mut replies, mut answered) = (0u8, 0u32);
    client
        .post_send(c, msg(&pd, 0))
        .map_err(|e| e.error)
        .unwrap();
    while replies < ROUNDS {
        server
            .poll(|mut done| {
                done.result().unwrap();
                let mut buf = done.take_buf().expect("a buffer");
                if done.is_recv() {
                    let byte = support::first_byte(&buf);
                    buf.write_at(0, &[byte + 1; MSG]).unwrap();
                    let local = Local::range(buf, 0, MSG).map_err(|(e, _)| e).unwrap();
                    done.reply(SendRequest::new(SendOp::Send, local))
                        .map_err(|e| e.error)
                        .unwrap();
                    answered += 1;
                } else {
                    // The reply went out: its buffer receives the next request.
                    done.poster()
                        .post_srq_recv(RecvRequest::new(buf))
                        .map_err(|e| e.error)
                        .unwrap();
                }
            })
            .unwrap();
        client
            .poll(|mut done| {
                done.result().unwrap();
                if done.is_recv() {
                    let buf = done.take_buf().unwrap();
                    assert_eq!(
                        support::first_byte(&buf),
                        2 * replies + 1,
                        "reply {replies}"
                    );
                    replies += 1;
                    done.poster()
                        .post_recv(c, RecvRequest::new(buf))
                        .map_err(|e| e.error)
                        .unwrap();
                    if replies < ROUNDS {
                        done.poster()
                            .post_send(c, msg(&pd, 2 * replies))
                            .map_err(|e| e.error)
                            .unwrap();
                    }
                }
            })
            .unwrap();
    }
    assert_eq!(answered, u32::from(ROUNDS));
    // Drain the last reply's send completion: every receive is posted again.
    while server.srq_posted() < 4 {
        server
            .poll(|mut done| {
                let buf = done.take_buf().unwrap();
                done.poster()
                    .post_srq_recv(RecvRequest::new(buf))
                    .map_err(|e| e.error)
                    .unwrap();
            })
            .unwrap();
    }
    assert_eq!(server.in_flight(s).unwrap(), (0, 0));

    // The counters saw it all: every reply posted and handed back, every
    // request a shared receive on `s` with its bytes, no error.
    let rounds = u64::from(ROUNDS);
    let on_s = server.qp_counters(s).unwrap();
    assert_eq!(
        on_s,
        QpCounters {
            sends_posted: rounds,
            sends_completed: rounds,
            recvs_posted: 0,
            recvs_completed: 0,
            srq_recvs: rounds,
            errors: 0,
            bytes_received: rounds * MSG as u64,
        }
    );
    let all = server.counters();
    assert_eq!((all.qps, all.live_qps, all.srq_posted), (on_s, 1, 4));
    assert!(all.errors_by_status.iter().all(|&n| n == 0));
    let at_c = client.qp_counters(c).unwrap();
    assert_eq!(
        (at_c.sends_posted, at_c.recvs_completed, at_c.bytes_received),
        (rounds, rounds, rounds * MSG as u64)
    );
    // A removed queue pair's counts stay in its engine's.
    server.remove_qp(s).unwrap();
    assert_eq!(server.counters().qps, on_s);
    assert_eq!(server.counters().live_qps, 0);
    // rxe exposes its RNR and retry counters per port; siw has no
    // hw_counters (iWARP's retries are TCP's), so every one is None there.
    let port = PortCounters::read(&ctx, 1);
    if support::is_iwarp(&ctx) {
        assert_eq!(port, PortCounters::default(), "{port:?}");
    } else {
        assert!(
            port.rnr_naks_received.is_some() && port.retries_exceeded.is_some(),
            "{port:?}"
        );
    }
}

/// A receive posted again from its own callback, with the same buffer,
/// range and tag, receives the next message; a send's completion, or a
/// receive whose buffer the callback took, cannot be posted again that way
/// (refused, nothing posted, the buffer where it was).
#[test]
fn a_receive_is_posted_again_from_its_callback_and_nothing_else_is() {
    let ctx = support::test_context("a_receive_is_posted_again");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let (mut e, x, y) = engine_pair(&pd, &EngineConfig::default());
    let inbox = MemoryRegion::new(&pd, MSG).unwrap();
    e.post_recv(y, RecvRequest::new(inbox).tag(77))
        .map_err(|e| e.error)
        .unwrap();
    for round in 0..3u8 {
        e.post_send(x, msg(&pd, round))
            .map_err(|e| e.error)
            .unwrap();
        let mut seen = (false, false);
        while seen != (true, true) {
            e.wait(support::deadline(), |mut c| {
                c.result().unwrap();
                if c.is_recv() {
                    assert_eq!(c.tag(), 77, "the receive's own tag");
                    assert_eq!(c.byte_len() as usize, MSG);
                    c.repost_recv().unwrap();
                    // Its buffers went with it: nothing left to take.
                    assert!(c.take_buf().is_none());
                    seen.0 = true;
                } else {
                    let err = c.repost_recv().unwrap_err();
                    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
                    assert!(c.take_buf().is_some(), "the send's buffer stayed");
                    seen.1 = true;
                }
            })
            .unwrap();
        }
        assert_eq!(
            e.in_flight(y).unwrap(),
            (0, 1),
            "round {round}: posted again"
        );
    }
    // A receive whose buffer was taken is not posted again.
    e.post_send(x, msg(&pd, 9)).map_err(|e| e.error).unwrap();
    let mut taken = None;
    while taken.is_none() {
        e.wait(support::deadline(), |mut c| {
            if c.is_recv() {
                let buf = c.take_buf();
                let err = c.repost_recv().unwrap_err();
                assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
                taken = buf;
            }
        })
        .unwrap();
    }
    assert_eq!(support::first_byte(taken.as_ref().unwrap()), 9);
    assert_eq!(e.in_flight(y).unwrap(), (0, 0), "nothing posted");
}

/// Posting from the callback of a request that failed: its queue pair is
/// in ERR, so a reply or a receive on it is refused (`BadState`) with its
/// buffers given back; handles of a removed queue pair and of another
/// engine reach nothing (`NotFound`); a post on another live queue pair
/// of the engine is taken.
#[test]
fn a_callback_posts_only_where_posting_is_allowed() {
    let ctx = support::test_context("a_callback_posts_only_where_allowed");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let (mut e, x, y) = engine_pair(&pd, &EngineConfig::default());
    let (mut other, ox, _) = engine_pair(&pd, &EngineConfig::default());
    let gone = e.add_qp(&support::shallow_config()).unwrap();
    e.remove_qp(gone).unwrap();
    // A Write with a key the peer never gave: the peer refuses it.
    let buf = MemoryRegion::new(&pd, MSG).unwrap();
    let bad = RemoteSlice::unchecked(1 << 20, MSG as u64, 0xdead);
    let local = Local::range(buf, 0, MSG).map_err(|(e, _)| e).unwrap();
    e.post_send(x, SendRequest::new(SendOp::Write(bad), local).tag(5))
        .map_err(|e| e.error)
        .unwrap();
    let mut checked = false;
    while !checked {
        e.wait(support::deadline(), |mut c| {
            if c.tag() != 5 {
                return;
            }
            assert!(c.result().is_err(), "the Write must fail");
            let refused = c.reply(msg(&pd, 1)).unwrap_err();
            assert_eq!(
                refused.error.kind(),
                ErrorKind::BadState,
                "{}",
                refused.error
            );
            assert_eq!(refused.request.into_bufs().count(), 1, "its buffer back");
            let recv = RecvRequest::new(MemoryRegion::new(&pd, MSG).unwrap());
            let refused = c.poster().post_recv(x, recv).unwrap_err();
            assert_eq!(refused.error.kind(), ErrorKind::BadState);
            for stranger in [gone, ox] {
                let refused = c.poster().post_send(stranger, msg(&pd, 2)).unwrap_err();
                assert_eq!(refused.error.kind(), ErrorKind::NotFound, "{stranger:?}");
                assert_eq!(refused.request.into_bufs().count(), 1);
            }
            // The other queue pair of the engine takes a receive.
            let recv = RecvRequest::new(MemoryRegion::new(&pd, MSG).unwrap()).tag(6);
            c.poster().post_recv(y, recv).map_err(|e| e.error).unwrap();
            checked = true;
        })
        .unwrap();
    }
    assert_eq!(e.state(x).unwrap(), QpState::ERR);
    assert_eq!(e.in_flight(y).unwrap(), (0, 1), "y's receive is in flight");
    assert_eq!(
        other.in_flight(ox).unwrap(),
        (0, 0),
        "nothing reached the other engine"
    );
    other.remove_qp(ox).unwrap();
}

/// A callback that posts and then panics: the panic reaches the caller of
/// `poll`, the request it posted stays in flight and comes back with its
/// completion, and the engine is whole. A callback that forgets its
/// completion leaks nothing: the engine drops what it left.
#[test]
fn a_callback_that_panics_or_forgets_leaves_the_engine_whole() {
    let ctx = support::test_context("a_callback_that_panics_or_forgets");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let (mut e, x, y) = engine_pair(&pd, &EngineConfig::default());
    for _ in 0..2 {
        let inbox = MemoryRegion::new(&pd, MSG).unwrap();
        e.post_recv(y, RecvRequest::new(inbox))
            .map_err(|e| e.error)
            .unwrap();
    }
    e.post_send(x, msg(&pd, 1).tag(1))
        .map_err(|e| e.error)
        .unwrap();
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| loop {
        e.poll(|mut c| {
            if c.tag() == 1 {
                c.poster()
                    .post_send(x, msg(&pd, 2).tag(2))
                    .map_err(|e| e.error)
                    .unwrap();
                panic!("a callback that panics after posting");
            }
        })
        .unwrap();
    }));
    assert!(panicked.is_err());
    // The Send it posted went out and comes back, and its bytes landed.
    let (mut sent, mut landed) = (None, false);
    while sent.is_none() || !landed {
        e.wait(support::deadline(), |mut c| {
            c.result().unwrap();
            let byte = c.take_buf().map(|b| support::first_byte(&b));
            if c.tag() == 2 {
                sent = byte;
            }
            landed |= c.is_recv() && byte == Some(2);
        })
        .unwrap();
    }
    assert_eq!(sent, Some(2));
    assert_eq!(e.in_flight(x).unwrap(), (0, 0));
    assert_eq!(e.in_flight(y).unwrap(), (0, 0));
    // Forgotten: what it held is the engine's to drop; room comes back.
    let room = e.room(Queue::Send);
    let inbox = MemoryRegion::new(&pd, MSG).unwrap();
    e.post_recv(y, RecvRequest::new(inbox))
        .map_err(|e| e.error)
        .unwrap();
    e.post_send(x, msg(&pd, 3).tag(3))
        .map_err(|e| e.error)
        .unwrap();
    let mut n = 0;
    while n < 2 {
        n += e
            .wait(support::deadline(), |c| std::mem::forget(c))
            .unwrap();
    }
    assert_eq!(
        e.room(Queue::Send),
        room,
        "the forgotten request's room is back"
    );
    assert_eq!(e.in_flight(x).unwrap(), (0, 0));
    assert_eq!(e.in_flight(y).unwrap(), (0, 0));
}

/// A callback that posts more than the engine's completion queue holds is
/// refused (`QueueFull`) once it is full, its request given back; what it
/// posted completes, and no completion is lost.
#[test]
fn a_callback_cannot_post_past_the_completion_queue() {
    let ctx = support::test_context("a_callback_cannot_post_past_the_cq");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let small = EngineConfig {
        cq_depth: Some(6),
        ..EngineConfig::default()
    };
    let (mut e, x, y) = engine_pair(&pd, &small);
    let room = e.room(Queue::Send);
    assert!(room <= 8, "the device gave a deeper CQ than asked: {room}");
    let remote = support::remote_region(&pd, 4096);
    let dst = RemoteSlice::new(&remote.remote().unwrap(), 0, MSG as u64).unwrap();
    let write = |tag| {
        let buf = MemoryRegion::new(&pd, MSG).unwrap();
        let local = Local::range(buf, 0, MSG).map_err(|(e, _)| e).unwrap();
        SendRequest::new(SendOp::Write(dst), local).tag(tag)
    };
    e.post_send(x, write(100)).map_err(|e| e.error).unwrap();
    let (mut posted, mut refused) = (0u64, 0);
    let mut first = true;
    while first || e.in_flight(x).unwrap().0 > 0 || e.in_flight(y).unwrap().0 > 0 {
        e.wait(support::deadline(), |mut c| {
            c.result().unwrap();
            if !first {
                return;
            }
            first = false;
            // Both queue pairs: more than the completion queue holds.
            for k in 0..16 {
                let qp = if k % 2 == 0 { x } else { y };
                match c.poster().post_send(qp, write(k)) {
                    Ok(()) => posted += 1,
                    Err(err) => {
                        assert_eq!(err.error.kind(), ErrorKind::QueueFull, "{}", err.error);
                        assert_eq!(err.request.into_bufs().count(), 1);
                        refused += 1;
                    }
                }
            }
        })
        .unwrap();
    }
    assert_eq!(
        posted,
        u64::from(room),
        "the callback filled the completion queue"
    );
    assert_eq!(refused, 16 - posted);
    assert_eq!(e.room(Queue::Send), room, "all of it came back");
    drop(remote);
}

/// A reset hands back what its queue pair held; its callback may post on
/// the engine's other queue pairs, never on the one being reset.
#[test]
fn a_reset_callback_cannot_post_on_the_queue_pair_it_resets() {
    let ctx = support::test_context("a_reset_callback_cannot_post_on_it");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let (mut e, x, y) = engine_pair(&pd, &EngineConfig::default());
    for _ in 0..2 {
        e.post_recv(x, RecvRequest::new(MemoryRegion::new(&pd, MSG).unwrap()))
            .map_err(|e| e.error)
            .unwrap();
    }
    let mut flushed = 0;
    e.reset(x, support::deadline(), |mut c| {
        if c.qp() != Some(x) {
            return;
        }
        flushed += 1;
        let refused = c.repost_recv().unwrap_err();
        assert_eq!(refused.kind(), ErrorKind::BadState, "{refused}");
        let refused = c.reply(msg(&pd, 1)).unwrap_err();
        assert_eq!(refused.error.kind(), ErrorKind::BadState);
        let recv = RecvRequest::new(MemoryRegion::new(&pd, MSG).unwrap());
        c.poster().post_recv(y, recv).map_err(|e| e.error).unwrap();
    })
    .unwrap();
    assert_eq!(flushed, 2);
    assert_eq!(e.in_flight(x).unwrap(), (0, 0));
    assert_eq!(
        e.in_flight(y).unwrap(),
        (0, 2),
        "the other queue pair's receives"
    );
}

/// A lane holds its queue pair: the callback of its poll (for other queue
/// pairs' completions) cannot post on it, whatever the post.
#[test]
fn a_lane_callback_cannot_post_on_the_lanes_queue_pair() {
    let ctx = support::test_context("a_lane_callback_cannot_post_on_its_qp");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let (mut e, x, y) = engine_pair(&pd, &EngineConfig::default());
    let remote = support::remote_region(&pd, 4096);
    let dst = RemoteSlice::new(&remote.remote().unwrap(), 0, MSG as u64).unwrap();
    let buf = MemoryRegion::new(&pd, MSG).unwrap();
    let local = Local::range(buf, 0, MSG).map_err(|(e, _)| e).unwrap();
    // A Write with immediate: it consumes a receive of y, whose completion
    // the lane's poll hands over.
    let ping = e
        .prepare_send(x, SendRequest::new(SendOp::WriteImm(dst, 7), local))
        .map_err(|e| e.error)
        .unwrap();
    e.post_recv(
        y,
        RecvRequest::new(MemoryRegion::new(&pd, MSG).unwrap()).tag(8),
    )
    .map_err(|e| e.error)
    .unwrap();
    let mut lane = e.lane(ping, None).unwrap();
    lane.post_send().unwrap();
    let (mut tried, mut sent) = (false, 0);
    while !tried || sent == 0 {
        sent += lane
            .poll(Queue::Send, |mut c| {
                assert_eq!(c.tag(), 8, "y's receive");
                let refused = c.poster().post_send(x, msg(&pd, 5)).unwrap_err();
                assert_eq!(refused.request.into_bufs().count(), 1);
                let recv = RecvRequest::new(MemoryRegion::new(&pd, MSG).unwrap());
                assert!(c.poster().post_recv(x, recv).is_err());
                assert!(c.poster().post_prepared(ping).is_err());
                tried = true;
            })
            .unwrap()
            .sent;
    }
    drop(lane);
    assert_eq!(e.in_flight(x).unwrap(), (0, 0));
    drop(remote);
}
