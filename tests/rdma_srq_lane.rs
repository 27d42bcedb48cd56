//! A shared-receive lane (`Engine::srq_lane`) on a real device: a server
//! that reads each request where it landed, answers from a ring of
//! prepared replies and posts the receive again in its slot, request
//! after request, without a heap operation once warm; and a reply refused
//! while the send queue is full, its buffer (the NIC may still be reading
//! it) untouched; and a request dropped instead of posted again, its slot
//! freed.

mod support;

#[path = "support/heap_count.rs"]
mod heap_count;

use std::sync::atomic::Ordering;

use heap_count::{counted, HEAP_OPS};

#[global_allocator]
static GLOBAL: heap_count::Counting = heap_count::Counting;

use support::numbered::{self, NumberedClient, MSG};

use verbs::{
    ErrorKind, HostBuf, MemoryRegion, PreparedSend, ProtectionDomain, Queue, RecvRequest, SendOp,
    SendRequest,
};

const SRQ_DEPTH: u32 = 4;

fn buf(pd: &ProtectionDomain) -> MemoryRegion {
    MemoryRegion::new(pd, MSG).unwrap()
}

/// As many replies as the server's send queue holds (`shallow_config`).
fn replies(
    pd: &ProtectionDomain,
    server: &mut verbs::Engine<MemoryRegion>,
    qp: verbs::QpId,
) -> Vec<PreparedSend> {
    let depth = support::shallow_config().max_send_wr;
    (0..depth)
        .map(|_| {
            let req = SendRequest::new(SendOp::Send, buf(pd));
            server.prepare_send(qp, req).map_err(|e| e.error).unwrap()
        })
        .collect()
}

/// The client sends numbered requests, a few in flight; the lane answers
/// each with its number marked and its bytes, and posts its receive
/// again. Every reply matches its request, in order, and the shared
/// receive queue keeps its depth.
#[test]
fn a_lane_answers_every_request_and_posts_each_receive_again() {
    let ctx = support::test_context("a_lane_answers_every_request");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let (mut server, mut client, s, c) = support::srq_server_and_client(&pd, SRQ_DEPTH, MSG);
    let ring = replies(&pd, &mut server, s);
    let mut numbered = NumberedClient::new(&pd, &mut client, c, 300, 3);
    let mut lane = server.srq_lane(&ring).unwrap();
    assert_eq!(lane.qp(), s);
    let mut answered = 0u64;
    let deadline = support::deadline();
    while !numbered.done() {
        assert!(!deadline.passed(), "{} replies", numbered.received);
        numbered.send(&pd, &mut client, c);
        // Counted once warm (first touches allocate in the library).
        let warm = answered >= 10;
        let count = |f: &mut dyn FnMut()| if warm { counted(f) } else { f() };
        let mut request = [0u8; MSG];
        let mut len = None;
        count(&mut || {
            let polled = lane.poll(Queue::Send, |c| panic!("not the lane's: {:?}", c.result()));
            if let Some(mut got) = polled.unwrap() {
                len = Some(got.byte_len());
                got.read(0, &mut request).unwrap();
                got.reply(0, &numbered::answer(&request)).unwrap();
                got.repost().unwrap();
            }
        });
        if let Some(len) = len {
            assert!(len as usize >= MSG, "a request of {len} bytes");
            assert_eq!(numbered::number(&request), answered, "requests in order");
            answered += 1;
        }
        numbered.poll(&mut client);
    }
    assert_eq!(answered, numbered.sent);
    assert_eq!(
        HEAP_OPS.load(Ordering::Relaxed),
        0,
        "the lane's poll, read, reply and repost allocated"
    );
    drop(lane);
    assert_eq!(server.srq_posted(), SRQ_DEPTH as usize);
}

/// With the send queue full (the lane has seen no completion yet), the
/// next reply would reuse the first reply's buffer: refused, and the
/// first reply arrives with what was written for it.
#[test]
fn a_reply_is_refused_while_the_send_queue_is_full_and_its_buffer_left_alone() {
    let ctx = support::test_context("a_reply_is_refused_while_the_send_queue_is_full");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let (mut server, mut client, s, c) = support::srq_server_and_client(&pd, SRQ_DEPTH, MSG);
    let ring = replies(&pd, &mut server, s);
    let depth = ring.len() as u64;
    for _ in 0..depth {
        client
            .post_recv(c, RecvRequest::new(buf(&pd)))
            .map_err(|e| e.error)
            .unwrap();
    }
    let mut lane = server.srq_lane(&ring).unwrap();
    for k in 0..depth {
        lane.send(0, &[k as u8 + 1; MSG]).unwrap();
    }
    let full = lane.send(0, &[0xEE; MSG]).unwrap_err();
    assert_eq!(full.kind(), ErrorKind::QueueFull);
    let mut got = Vec::new();
    let deadline = support::deadline();
    while (got.len() as u64) < depth {
        assert!(!deadline.passed(), "{} replies of {depth}", got.len());
        client
            .poll(|done| {
                done.result().unwrap();
                let mut first = [0u8; MSG];
                done.buf().unwrap().read_at(0, &mut first).unwrap();
                got.push(first[0]);
            })
            .unwrap();
    }
    let expected: Vec<u8> = (1..=depth as u8).collect();
    assert_eq!(got, expected, "a reply's buffer written while in flight");
    // Once the lane has seen the completions, the ring turns over.
    client
        .post_recv(c, RecvRequest::new(buf(&pd)))
        .map_err(|e| e.error)
        .unwrap();
    while lane.send(0, &[0x77; MSG]).is_err() {
        assert!(!deadline.passed(), "no reply completion came back");
        let polled = lane.poll(Queue::Send, |c| panic!("not the lane's: {:?}", c.result()));
        assert!(polled.unwrap().is_none(), "a request");
    }
    let mut last = None;
    while last.is_none() {
        assert!(!deadline.passed(), "the last reply did not arrive");
        client
            .poll(|done| {
                done.result().unwrap();
                let mut first = [0u8; 1];
                done.buf().unwrap().read_at(0, &mut first).unwrap();
                last = Some(first[0]);
            })
            .unwrap();
    }
    assert_eq!(last, Some(0x77));
}

/// A request dropped instead of posted again (its handler gave up on it)
/// frees its slot: the next request still arrives and is answered, and
/// once the lane is dropped the shared receive queue holds one receive
/// fewer, until one is posted again into the freed slot.
#[test]
fn a_request_dropped_unposted_frees_its_slot_and_the_next_is_answered() {
    let ctx = support::test_context("a_request_dropped_unposted_frees_its_slot");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let (mut server, mut client, s, c) = support::srq_server_and_client(&pd, SRQ_DEPTH, MSG);
    let ring = replies(&pd, &mut server, s);
    client
        .post_recv(c, RecvRequest::new(buf(&pd)))
        .map_err(|e| e.error)
        .unwrap();
    for k in 0..2u8 {
        let mut request = buf(&pd);
        request.write_at(0, &[k; MSG]).unwrap();
        client
            .post_send(c, SendRequest::new(SendOp::Send, request))
            .map_err(|e| e.error)
            .unwrap();
    }
    let mut lane = server.srq_lane(&ring).unwrap();
    let deadline = support::deadline();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        assert!(!deadline.passed(), "requests seen: {seen:?}");
        let polled = lane.poll(Queue::Send, |c| panic!("not the lane's: {:?}", c.result()));
        if let Some(mut request) = polled.unwrap() {
            let mut first = [0u8; 1];
            request.read(0, &mut first).unwrap();
            seen.push(first[0]);
            if first[0] == 0 {
                drop(request);
            } else {
                request.reply(0, &[0xAB; MSG]).unwrap();
                request.repost().unwrap();
            }
        }
    }
    assert_eq!(seen, [0, 1], "requests in order");
    let mut answer = None;
    while answer.is_none() {
        assert!(!deadline.passed(), "the answer did not arrive");
        client
            .poll(|done| {
                done.result().unwrap();
                if done.is_recv() {
                    let mut first = [0u8; 1];
                    done.buf().unwrap().read_at(0, &mut first).unwrap();
                    answer = Some(first[0]);
                }
            })
            .unwrap();
    }
    assert_eq!(answer, Some(0xAB));
    drop(lane);
    assert_eq!(server.srq_posted(), SRQ_DEPTH as usize - 1);
    server
        .post_srq_recv(RecvRequest::new(buf(&pd)))
        .map_err(|e| e.error)
        .unwrap();
    assert_eq!(server.srq_posted(), SRQ_DEPTH as usize);
}
