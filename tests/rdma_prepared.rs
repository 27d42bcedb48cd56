//! Prepared requests (built once, posted again and again) and the lending
//! poll (`poll`, and per queue with a separate receive CQ), on a real
//! device: data lands byte-exact on every post, buffers stay out of reach
//! while a post is in flight, and misuse is refused.

mod support;

use verbs::{
    CompletionRef, EngineConfig, ErrorKind, HostBuf, Local, MemoryRegion, Prepared,
    ProtectionDomain, Queue, QueuePair, RecvRequest, RemoteSlice, SendOp, SendRequest, WcOpcode,
    WcStatus,
};

type Qp = QueuePair<MemoryRegion>;

fn setup(name: &str) -> (ProtectionDomain, Qp, Qp) {
    support::pd_and_pair(name)
}

/// A region the peer may write and read, and its first `len` bytes as a
/// remote target.
fn remote_target(
    pd: &ProtectionDomain,
    region_len: usize,
    len: u64,
) -> (MemoryRegion, RemoteSlice) {
    let region = support::remote_region(pd, region_len);
    let dst = RemoteSlice::new(&region.remote().unwrap(), 0, len).unwrap();
    (region, dst)
}

/// Polls `qp` until one request came back; returns its
/// (tag, prepared handle, status, opcode, byte_len).
fn next(qp: &mut Qp) -> (u64, Option<Prepared>, WcStatus, WcOpcode, u32) {
    let deadline = support::deadline();
    loop {
        let mut got = None;
        qp.poll(|c| {
            got = Some((c.tag(), c.prepared(), c.status(), c.opcode(), c.byte_len()));
        })
        .expect("poll");
        if let Some(g) = got {
            return g;
        }
        assert!(!deadline.passed(), "no completion");
    }
}

#[test]
fn a_prepared_write_posted_again_lands_each_new_payload() {
    let (pd, mut a, _b) = setup("a_prepared_write_posted_again_lands_each_new_payload");
    let (target, dst) = remote_target(&pd, 4096, 256);
    let local = Local::range(MemoryRegion::new(&pd, 4096).unwrap(), 0, 256).unwrap();
    let w = a
        .prepare_send(SendRequest::new(SendOp::Write(dst), local).tag(9))
        .map_err(|e| e.error)
        .unwrap();
    for round in 1..=50u64 {
        let data = support::pattern(round, 256);
        // Both ways in: a copy, or the buffer lent out.
        if round % 2 == 0 {
            a.write_prepared(w, 0, &data).unwrap();
        } else {
            a.prepared_buf(w).unwrap().write_at(0, &data).unwrap();
        }
        a.post_prepared(w).unwrap();
        let err = a
            .write_prepared(w, 0, &data)
            .expect_err("no copy in while in flight");
        assert_eq!(err.kind(), ErrorKind::BadState);
        let err = a
            .prepared_buf(w)
            .expect_err("the buffer is the NIC's until completion");
        assert_eq!(err.kind(), ErrorKind::BadState);
        let (tag, prepared, status, opcode, _) = next(&mut a);
        assert_eq!(
            (tag, prepared, status),
            (9, Some(Prepared::Send(w)), WcStatus::SUCCESS)
        );
        assert_eq!(opcode, WcOpcode::RDMA_WRITE);
        let mut landed = vec![0u8; 256];
        target.read_at(0, &mut landed).unwrap();
        assert_eq!(landed, data, "round {round} landed byte-exact");
    }
    assert_eq!(a.in_flight().unwrap(), (0, 0));
    let bufs: Vec<MemoryRegion> = a.release_prepared(w).unwrap().collect();
    assert_eq!(bufs.len(), 1, "release hands the buffer back");
    assert!(
        a.post_prepared(w).is_err(),
        "a released request cannot be posted"
    );
}

#[test]
fn prepared_receives_are_posted_again_and_read_between_posts() {
    let (pd, mut a, mut b) = setup("prepared_receives_are_posted_again_and_read_between_posts");
    let inbox = Local::range(MemoryRegion::new(&pd, 4096).unwrap(), 0, 1024).unwrap();
    let r = b
        .prepare_recv(RecvRequest::new(inbox).tag(3))
        .map_err(|e| e.error)
        .unwrap();
    let msg = Local::range(MemoryRegion::new(&pd, 4096).unwrap(), 0, 1000).unwrap();
    let s = a
        .prepare_send(SendRequest::new(SendOp::Send, msg))
        .map_err(|e| e.error)
        .unwrap();
    for round in 1..=20u64 {
        b.post_prepared(r).unwrap();
        let data = support::pattern(round + 100, 1000);
        a.prepared_buf(s).unwrap().write_at(0, &data).unwrap();
        a.post_prepared(s).unwrap();
        assert_eq!(next(&mut a).2, WcStatus::SUCCESS);
        let (tag, prepared, status, opcode, len) = next(&mut b);
        assert_eq!(
            (tag, prepared, status, len),
            (3, Some(Prepared::Recv(r)), WcStatus::SUCCESS, 1000)
        );
        assert_eq!(opcode, WcOpcode::RECV);
        let mut got = vec![0u8; 1000];
        if round % 2 == 0 {
            b.read_prepared(r, 0, &mut got).unwrap();
        } else {
            b.prepared_buf(r).unwrap().read_at(0, &mut got).unwrap();
        }
        assert_eq!(got, data, "round {round} received byte-exact");
    }
}

/// Entries move when the table grows or a released slot is reused: each
/// kept request must still point at its own scatter/gather entries (the
/// crate sets those pointers where entries move, not at every post).
#[test]
fn prepared_requests_still_post_their_own_buffers_after_the_table_grows() {
    let (pd, mut a, mut b) =
        setup("prepared_requests_still_post_their_own_buffers_after_the_table_grows");
    let (target, dst) = remote_target(&pd, 4096, 64);
    let region = || MemoryRegion::new(&pd, 64).unwrap();
    let w = a
        .prepare_send(SendRequest::new(
            SendOp::Write(dst),
            Local::range(region(), 0, 64).unwrap(),
        ))
        .map_err(|e| e.error)
        .unwrap();
    let r = b
        .prepare_recv(RecvRequest::new(Local::range(region(), 0, 64).unwrap()).tag(5))
        .map_err(|e| e.error)
        .unwrap();
    // Grow both tables well past their first allocation, then release
    // every other new entry and prepare into the freed slots.
    let mut sends = Vec::new();
    let mut recvs = Vec::new();
    for _ in 0..40 {
        let local = Local::range(region(), 0, 64).unwrap();
        sends.push(
            a.prepare_send(SendRequest::new(SendOp::Send, local))
                .map_err(|e| e.error)
                .unwrap(),
        );
        let local = Local::range(region(), 0, 64).unwrap();
        recvs.push(
            b.prepare_recv(RecvRequest::new(local))
                .map_err(|e| e.error)
                .unwrap(),
        );
    }
    for i in (0..40).step_by(2) {
        drop(a.release_prepared(sends[i]).unwrap());
        drop(b.release_prepared(recvs[i]).unwrap());
        let local = Local::range(region(), 0, 64).unwrap();
        sends[i] = a
            .prepare_send(SendRequest::new(SendOp::Send, local))
            .map_err(|e| e.error)
            .unwrap();
        let local = Local::range(region(), 0, 64).unwrap();
        recvs[i] = b
            .prepare_recv(RecvRequest::new(local))
            .map_err(|e| e.error)
            .unwrap();
    }
    // The first Write still sends its own buffer...
    let data = support::pattern(7, 64);
    a.write_prepared(w, 0, &data).unwrap();
    a.post_prepared(w).unwrap();
    assert_eq!(next(&mut a).2, WcStatus::SUCCESS);
    let mut landed = vec![0u8; 64];
    target.read_at(0, &mut landed).unwrap();
    assert_eq!(landed, data, "the Write sent its own buffer");
    // ...and the first receive still lands in its own, from a send
    // prepared into a reused slot.
    let s = sends[38];
    let data = support::pattern(8, 64);
    a.write_prepared(s, 0, &data).unwrap();
    b.post_prepared(r).unwrap();
    a.post_prepared(s).unwrap();
    assert_eq!(next(&mut a).2, WcStatus::SUCCESS);
    let (tag, prepared, status, _, len) = next(&mut b);
    assert_eq!(
        (tag, prepared, status, len),
        (5, Some(Prepared::Recv(r)), WcStatus::SUCCESS, 64)
    );
    let mut got = vec![0u8; 64];
    b.read_prepared(r, 0, &mut got).unwrap();
    assert_eq!(got, data, "the receive landed in its own buffer");
}

#[test]
fn prepared_requests_refuse_misuse() {
    let (pd, mut a, mut b) = setup("prepared_requests_refuse_misuse");
    let (target, dst) = remote_target(&pd, 8192, 512);
    // Checked once, at prepare: local data longer than the remote slice.
    let long = Local::range(MemoryRegion::new(&pd, 4096).unwrap(), 0, 1024).unwrap();
    let refused = a
        .prepare_send(SendRequest::new(SendOp::Write(dst), long))
        .expect_err("longer than the remote slice");
    assert_eq!(refused.error.kind(), ErrorKind::InvalidArgument);

    let big = RemoteSlice::new(&target.remote().unwrap(), 0, 8000).unwrap();
    let local = Local::range(MemoryRegion::new(&pd, 8192).unwrap(), 0, 8000).unwrap();
    let w = a
        .prepare_send(SendRequest::new(SendOp::Write(big), local))
        .map_err(|e| e.error)
        .unwrap();
    // Copies stay inside the buffer.
    let err = a
        .write_prepared(w, 8190, &[0; 4])
        .expect_err("past the end");
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(
        a.read_prepared(w, usize::MAX, &mut [0; 2]).is_err(),
        "offset overflow"
    );
    // A handle is only good on the queue pair that prepared it.
    assert!(b.post_prepared(w).is_err());
    assert!(b.prepared_buf(w).is_err());
    // A buffer swapped in through `prepared_buf` is used as it is, and a
    // shorter one than the prepared range is refused at the next post.
    let short = MemoryRegion::new(&pd, 4096).unwrap();
    let old = std::mem::replace(a.prepared_buf(w).unwrap(), short);
    drop(old);
    let err = a
        .post_prepared(w)
        .expect_err("the swapped-in buffer is too short");
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert_eq!(a.in_flight().unwrap(), (0, 0), "nothing was posted");
    // A released handle stays dead, even once its entry is reused.
    drop(a.release_prepared(w).unwrap());
    assert!(a.release_prepared(w).is_err(), "released twice");
    let local = Local::range(MemoryRegion::new(&pd, 4096).unwrap(), 0, 512).unwrap();
    let w2 = a
        .prepare_send(SendRequest::new(SendOp::Write(dst), local))
        .map_err(|e| e.error)
        .unwrap();
    assert_ne!(w, w2);
    assert!(
        a.post_prepared(w).is_err(),
        "a stale handle reaches nothing"
    );
    a.post_prepared(w2).unwrap();
    assert_eq!(next(&mut a).2, WcStatus::SUCCESS);
}

#[test]
fn a_prepared_request_stays_busy_until_its_last_post_completes() {
    let (pd, mut a, _b) = setup("a_prepared_request_stays_busy_until_its_last_post_completes");
    let (_target, dst) = remote_target(&pd, 4096, 64);
    let local = Local::range(MemoryRegion::new(&pd, 64).unwrap(), 0, 64).unwrap();
    let w = a
        .prepare_send(SendRequest::new(SendOp::Write(dst), local))
        .map_err(|e| e.error)
        .unwrap();
    a.post_prepared(w).unwrap();
    a.post_prepared(w).unwrap();
    // `wait_one` takes one completion entry at a time: the first post's.
    let first = a.wait_one(support::deadline()).unwrap();
    assert_eq!(
        (first.prepared(), first.status),
        (Some(Prepared::Send(w)), WcStatus::SUCCESS)
    );
    let err = a
        .prepared_buf(w)
        .expect_err("the second post still owns the buffer");
    assert_eq!(err.kind(), ErrorKind::BadState);
    assert!(a.release_prepared(w).is_err(), "no release while in flight");
    let second = a.wait_one(support::deadline()).unwrap();
    assert_eq!(
        (second.prepared(), second.status),
        (Some(Prepared::Send(w)), WcStatus::SUCCESS)
    );
    a.prepared_buf(w)
        .expect("free once the last post completed");
    assert_eq!(a.release_prepared(w).unwrap().count(), 1);
}

#[test]
fn prepared_receives_count_in_flight_among_plain_receives_and_flush_on_reset() {
    let (pd, mut a, mut b) =
        setup("prepared_receives_count_in_flight_among_plain_receives_and_flush_on_reset");
    let inbox = |len| Local::range(MemoryRegion::new(&pd, 4096).unwrap(), 0, len).unwrap();
    let r1 = b
        .prepare_recv(RecvRequest::new(inbox(100)).tag(3))
        .map_err(|e| e.error)
        .unwrap();
    let r2 = b
        .prepare_recv(RecvRequest::new(inbox(300)).tag(7))
        .map_err(|e| e.error)
        .unwrap();
    // Prepared, plain, prepared: one receive queue, completed in post order.
    b.post_prepared(r1).unwrap();
    b.post_recv(RecvRequest::new(inbox(200)).tag(5))
        .map_err(|e| e.error)
        .unwrap();
    b.post_prepared(r2).unwrap();
    assert_eq!(
        b.in_flight().unwrap(),
        (0, 3),
        "prepared receives count in flight"
    );
    for call in [
        b.prepared_buf(r1).map(|_| ()),
        b.read_prepared(r1, 0, &mut [0u8; 4]),
        b.release_prepared(r1).map(|_| ()),
    ] {
        assert_eq!(call.unwrap_err().kind(), ErrorKind::BadState);
    }
    let messages: Vec<Vec<u8>> = [100, 200, 300]
        .iter()
        .enumerate()
        .map(|(i, &len)| support::pattern(40 + i as u64, len))
        .collect();
    for (i, data) in messages.iter().enumerate() {
        let mut buf = MemoryRegion::new(&pd, 4096).unwrap();
        buf.write_at(0, data).unwrap();
        let local = Local::range(buf, 0, data.len()).unwrap();
        a.post_send(SendRequest::new(SendOp::Send, local).tag(i as u64))
            .map_err(|e| e.error)
            .unwrap();
        assert_eq!(next(&mut a).2, WcStatus::SUCCESS);
    }
    // One poll may take all three: collect every one handed back.
    let mut got = Vec::new();
    let deadline = support::deadline();
    while got.len() < 3 {
        b.poll(|c| got.push((c.tag(), c.prepared(), c.status(), c.opcode(), c.byte_len())))
            .unwrap();
        assert!(!deadline.passed(), "only {} receives completed", got.len());
    }
    let ok = WcStatus::SUCCESS;
    let recv = WcOpcode::RECV;
    assert_eq!(
        got,
        [
            (3, Some(Prepared::Recv(r1)), ok, recv, 100),
            (5, None, ok, recv, 200),
            (7, Some(Prepared::Recv(r2)), ok, recv, 300)
        ]
    );
    assert_eq!(b.in_flight().unwrap(), (0, 0));
    let mut landed = vec![0u8; 300];
    b.read_prepared(r2, 0, &mut landed).unwrap();
    assert_eq!(landed, messages[2], "byte-exact into the prepared buffer");

    // A flushed prepared receive comes back with its handle, and frees it.
    b.post_prepared(r1).unwrap();
    let mut flushed = Vec::new();
    b.reset(support::deadline(), |c| {
        flushed.push((c.tag(), c.prepared(), c.status(), c.opcode()))
    })
    .unwrap();
    assert_eq!(
        flushed,
        [(
            3,
            Some(Prepared::Recv(r1)),
            WcStatus::WR_FLUSH_ERR,
            WcOpcode::RECV
        )]
    );
    assert_eq!(b.in_flight().unwrap(), (0, 0));
    assert_eq!(b.release_prepared(r1).unwrap().count(), 1);
}

#[test]
fn poll_hands_back_unsignaled_requests_with_their_buffers() {
    let (pd, mut a, _b) = setup("poll_hands_back_unsignaled_requests_with_their_buffers");
    let (_target, dst) = remote_target(&pd, 4096, 64);
    for k in 0..4u64 {
        let local = Local::range(MemoryRegion::new(&pd, 64).unwrap(), 0, 64).unwrap();
        let req = SendRequest::new(SendOp::Write(dst), local).tag(k);
        let req = if k < 3 { req.unsignaled() } else { req };
        a.post_send(req).map_err(|e| e.error).unwrap();
    }
    let mut seen = Vec::new();
    let deadline = support::deadline();
    while seen.len() < 4 {
        a.poll(|mut c| {
            c.result().unwrap();
            let buf = c.take_buf();
            // An unsignaled request has no entry of its own: no length.
            let len = if c.signaled() {
                None
            } else {
                Some(c.byte_len())
            };
            seen.push((c.tag(), c.signaled(), len, buf.is_some()));
        })
        .unwrap();
        assert!(!deadline.passed(), "no completion");
    }
    assert_eq!(
        seen,
        [
            (0, false, Some(0), true),
            (1, false, Some(0), true),
            (2, false, Some(0), true),
            (3, true, None, true)
        ]
    );
    // Buffers the callback does not take are dropped, never left behind.
    let local = Local::range(MemoryRegion::new(&pd, 64).unwrap(), 0, 64).unwrap();
    a.post_send(SendRequest::new(SendOp::Write(dst), local))
        .map_err(|e| e.error)
        .unwrap();
    assert_eq!(next(&mut a).2, WcStatus::SUCCESS);
    assert_eq!(a.in_flight().unwrap(), (0, 0));
}

#[test]
fn inline_requests_land_without_the_nic_reading_their_buffer() {
    let (pd, mut a, _b) = setup("inline_requests_land_without_the_nic_reading_their_buffer");
    let granted = a.caps().unwrap().max_inline_data as usize;
    assert!(
        granted >= 16,
        "device granted {granted} bytes of inline data"
    );
    let (target, dst) = remote_target(&pd, 4096, granted as u64);
    // Registered in another protection domain: a NIC reading it would fail
    // the request (LOC_PROT_ERR); inline data is copied by the provider at
    // post time, so its lkey is never used.
    let other_pd = ProtectionDomain::new(pd.context()).unwrap();
    let foreign = |data: &[u8]| {
        let mut mr = MemoryRegion::new(&other_pd, 4096).unwrap();
        mr.write_at(0, data).unwrap();
        Local::range(mr, 0, granted).unwrap()
    };

    let w = a
        .prepare_send(SendRequest::new(SendOp::Write(dst), foreign(&[])).inline())
        .map_err(|e| e.error)
        .unwrap();
    for round in 1..=5u64 {
        let data = support::pattern(round, granted);
        a.write_prepared(w, 0, &data).unwrap();
        a.post_prepared(w).unwrap();
        let (_, prepared, status, _, _) = next(&mut a);
        assert_eq!(
            (prepared, status),
            (Some(Prepared::Send(w)), WcStatus::SUCCESS)
        );
        let mut landed = vec![0u8; granted];
        target.read_at(0, &mut landed).unwrap();
        assert_eq!(landed, data, "round {round} landed byte-exact");
    }
    drop(a.release_prepared(w).unwrap());

    let data = support::pattern(7, granted);
    a.post_send(SendRequest::new(SendOp::Write(dst), foreign(&data)).inline())
        .map_err(|e| e.error)
        .unwrap();
    assert_eq!(next(&mut a).2, WcStatus::SUCCESS);
    let mut landed = vec![0u8; granted];
    target.read_at(0, &mut landed).unwrap();
    assert_eq!(landed, data, "post_send inline landed byte-exact");

    // Refused before anything reaches the device: past the granted size,
    // and for operations that carry no data out.
    let whole = RemoteSlice::whole(&target.remote().unwrap());
    let too_big = || {
        let local = Local::range(MemoryRegion::new(&pd, 4096).unwrap(), 0, granted + 1).unwrap();
        SendRequest::new(SendOp::Write(whole), local).inline()
    };
    let e = a.prepare_send(too_big()).unwrap_err();
    assert!(
        e.error.to_string().contains("max_inline_data"),
        "{}",
        e.error
    );
    let e = a.post_send(too_big()).unwrap_err();
    assert!(
        e.error.to_string().contains("max_inline_data"),
        "{}",
        e.error
    );
    let read = SendRequest::new(SendOp::Read(dst), foreign(&[])).inline();
    let e = a.prepare_send(read).unwrap_err();
    assert!(e.error.to_string().contains("inline"), "{}", e.error);
    assert_eq!(a.in_flight().unwrap(), (0, 0));
}

#[test]
fn with_a_separate_receive_cq_each_poll_takes_only_its_queue() {
    let name = "with_a_separate_receive_cq_each_poll_takes_only_its_queue";
    let ctx = support::test_context(name);
    let pd = ProtectionDomain::new(&ctx).expect("alloc PD");
    let config = support::config();
    let separate = EngineConfig {
        separate_recv_cq: true,
        ..EngineConfig::default()
    };
    let refused = QueuePair::<MemoryRegion>::with_engine(
        &pd,
        &config,
        &EngineConfig {
            events: true,
            ..separate
        },
    )
    .expect_err("events sleep on one CQ");
    assert_eq!(refused.kind(), ErrorKind::InvalidArgument);
    let (mut a, mut b): (Qp, Qp) = support::connected_pair_in(&pd, &config, &separate);
    let buf = |len| Local::range(MemoryRegion::new(&pd, 4096).unwrap(), 0, len).unwrap();
    a.post_recv(RecvRequest::new(buf(64)).tag(1))
        .map_err(|e| e.error)
        .unwrap();
    b.post_recv(RecvRequest::new(buf(64)).tag(2))
        .map_err(|e| e.error)
        .unwrap();
    // b's send completes once a acknowledged it, after a's receive completed
    // (rxe completes a receive before it acknowledges).
    b.post_send(SendRequest::new(SendOp::Send, buf(8)).tag(20))
        .map_err(|e| e.error)
        .unwrap();
    assert_eq!(polled(&mut b, "send"), [(20, false)]);
    // a's receive is queued; polling a's send CQ must leave it there.
    a.post_send(SendRequest::new(SendOp::Send, buf(8)).tag(10))
        .map_err(|e| e.error)
        .unwrap();
    let sent = polled(&mut a, "send");
    assert_eq!(sent, [(10, false)], "the send CQ holds the send only");
    let received = polled(&mut a, "recv");
    assert_eq!(received, [(1, true)], "the receive CQ holds the receive");
    assert_eq!(polled(&mut b, "both"), [(2, true)], "poll takes both");
}

/// Polls `qp`'s `cq` ("send", "recv", or both) until something comes back;
/// the (tag, is_recv) of each request handed back.
fn polled(qp: &mut Qp, cq: &str) -> Vec<(u64, bool)> {
    let deadline = support::deadline();
    let mut seen = Vec::new();
    while seen.is_empty() {
        let mut note = |c: CompletionRef<'_, MemoryRegion>| seen.push((c.tag(), c.is_recv()));
        match cq {
            "send" => qp.engine_mut().poll_queue(Queue::Send, &mut note),
            "recv" => qp.engine_mut().poll_queue(Queue::Recv, &mut note),
            _ => qp.poll(&mut note),
        }
        .unwrap();
        assert!(!deadline.passed(), "nothing came back on the {cq} CQ");
    }
    seen
}
