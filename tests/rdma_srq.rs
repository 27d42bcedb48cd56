//! A shared receive queue feeding several queue pairs, and its limit event.

mod support;

use verbs::sys::ibv_event_type;
use verbs::{MemoryRegion, ProtectionDomain, QueuePair, RecvRequest, SendOp, SharedReceiveQueue};

type Qp = QueuePair<MemoryRegion>;

#[test]
fn several_queue_pairs_share_one_receive_pool() {
    let Some(ctx) = support::test_context("several_queue_pairs_share_one_receive_pool") else {
        return;
    };
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let mut srq = SharedReceiveQueue::<MemoryRegion>::new(&pd, 16, 1).unwrap();
    for tag in 0..12u64 {
        srq.post_recv(RecvRequest::new(MemoryRegion::new(&pd, 4096).unwrap()).tag(100 + tag))
            .map_err(|e| e.error)
            .unwrap();
    }
    srq.arm_limit(4).unwrap();

    let config = support::config();
    let mut pairs: Vec<(Qp, Qp)> = (0..3)
        .map(|_| {
            let mut sender = Qp::new(&pd, &config).unwrap();
            let mut receiver = Qp::with_srq(&pd, &config, &srq).unwrap();
            let (es, er) = (sender.endpoint(), receiver.endpoint());
            sender.connect(&er).unwrap();
            receiver.connect(&es).unwrap();
            (sender, receiver)
        })
        .collect();

    for (i, (sender, _)) in pairs.iter_mut().enumerate() {
        for m in 0..3u32 {
            let imm = i as u32 * 10 + m;
            sender
                .post_inline(
                    SendOp::SendImm(imm),
                    format!("qp{i} msg{m}").as_bytes(),
                    0,
                    true,
                )
                .unwrap();
            sender
                .wait_one(support::deadline())
                .unwrap()
                .result()
                .unwrap();
        }
    }

    let mut got = Vec::new();
    for (i, (_, receiver)) in pairs.iter_mut().enumerate() {
        let mut n = 0;
        while n < 3 {
            receiver
                .wait(support::deadline(), |c| {
                    assert!(
                        c.is_srq_pending(),
                        "the buffer is the SRQ's until it completes it"
                    );
                    let mut c = srq.complete(c);
                    c.result().unwrap();
                    let imm = c.imm.unwrap();
                    assert_eq!(imm / 10, i as u32, "each message arrives on its own QP");
                    let buf = c.take_buf().expect("the SRQ handed the buffer back");
                    let text = format!("qp{i} msg{}", imm % 10);
                    assert_eq!(&buf.as_slice().unwrap()[..text.len()], text.as_bytes());
                    got.push((imm, c.tag));
                    n += 1;
                })
                .unwrap();
        }
    }
    got.sort_unstable();
    assert_eq!(got.len(), 9);
    let tags: std::collections::BTreeSet<u64> = got.iter().map(|&(_, t)| t).collect();
    assert_eq!(tags.len(), 9, "nine distinct receive buffers were used");
    assert_eq!(srq.posted(), 3);

    // 3 posted < limit 4: the device says so, once.
    let mut limit = None;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while limit.is_none() && std::time::Instant::now() < deadline {
        if let Some(ev) = ctx.next_async_event(1000).unwrap() {
            println!("async event {:?}", ev.event_type);
            if ev.event_type == ibv_event_type::SRQ_LIMIT_REACHED {
                limit = Some(ev);
            }
        }
    }
    let ev = limit.expect("SRQ_LIMIT_REACHED");
    assert_eq!(ev.element, srq.as_raw() as usize, "the event names our SRQ");
    drop(pairs); // queue pairs before their SRQ
}
