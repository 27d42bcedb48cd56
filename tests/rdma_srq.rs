//! An engine's shared receive queue feeding several queue pairs: every
//! receive comes back with its buffer and the queue pair it arrived on,
//! and the limit event names the queue.

mod support;

use std::collections::BTreeSet;

use verbs::sys::ibv_event_type;
use verbs::{
    Engine, EngineConfig, HostBuf, MemoryRegion, ProtectionDomain, RecvRequest, SendOp, SrqConfig,
};

#[test]
fn several_queue_pairs_share_one_receive_pool() {
    let ctx = support::test_context("several_queue_pairs_share_one_receive_pool");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let config = support::config();
    let mut engine: Engine<MemoryRegion> = Engine::new(
        &pd,
        &EngineConfig {
            srq: Some(SrqConfig {
                max_wr: 16,
                max_sge: 1,
            }),
            ..EngineConfig::default()
        },
    )
    .unwrap();
    for tag in 0..12u64 {
        engine
            .post_srq_recv(RecvRequest::new(MemoryRegion::new(&pd, 4096).unwrap()).tag(100 + tag))
            .map_err(|e| e.error)
            .unwrap();
    }
    assert_eq!(engine.srq_posted(), 12);
    engine.arm_srq_limit(4).unwrap();

    let mut senders = Vec::new();
    let mut receivers = Vec::new();
    for _ in 0..3 {
        let (sender, receiver) = support::sender_to::<MemoryRegion>(&pd, &mut engine, &config);
        // A receive through the SRQ: refused on the queue pair itself.
        let refused = engine.post_recv(
            receiver,
            RecvRequest::new(MemoryRegion::new(&pd, 64).unwrap()),
        );
        assert_eq!(
            refused.unwrap_err().error.kind(),
            verbs::ErrorKind::BadState
        );
        senders.push(sender);
        receivers.push(receiver);
    }

    for (i, sender) in senders.iter_mut().enumerate() {
        for m in 0..3u32 {
            sender
                .post_inline(SendOp::Send, format!("qp{i} msg{m}").as_bytes(), 0, true)
                .unwrap();
            sender
                .wait_one(support::deadline())
                .unwrap()
                .result()
                .unwrap();
        }
    }

    let mut got = Vec::new();
    while got.len() < 9 {
        engine
            .wait(support::deadline(), |mut c| {
                c.result().unwrap();
                let tag = c.tag();
                let qp = c.qp();
                let buf = c
                    .take_buf()
                    .expect("the receive comes back with its buffer");
                // "qp{i} msg{m}": who sent it is in the message.
                let text = &buf.as_slice().unwrap()[..8];
                let (i, m) = (usize::from(text[2] - b'0'), u32::from(text[7] - b'0'));
                assert_eq!(text, format!("qp{i} msg{m}").as_bytes());
                assert_eq!(
                    qp,
                    Some(receivers[i]),
                    "each message comes back with its queue pair"
                );
                got.push((i as u32 * 10 + m, tag));
            })
            .unwrap();
    }
    got.sort_unstable();
    let tags: BTreeSet<u64> = got.iter().map(|&(_, t)| t).collect();
    assert_eq!(tags.len(), 9, "nine distinct receive buffers were used");
    assert_eq!(engine.srq_posted(), 3);

    // 3 posted < limit 4: the device says so, once.
    let mut limit = None;
    let deadline = support::deadline();
    while limit.is_none() && !deadline.passed() {
        if let Some(ev) = ctx.next_async_event(1000).unwrap() {
            println!("async event {:?}", ev.event_type);
            if ev.event_type == ibv_event_type::SRQ_LIMIT_REACHED {
                limit = Some(ev);
            }
        }
    }
    let ev = limit.expect("SRQ_LIMIT_REACHED");
    assert_eq!(
        Some(ev.element),
        engine.srq_raw_id(),
        "the event names our SRQ"
    );
}
