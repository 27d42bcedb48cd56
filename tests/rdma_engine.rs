//! Many queue pairs on one engine (one completion queue): every opcode on
//! every queue pair, and every buffer comes back exactly once, to the
//! queue pair that posted it; with a shared receive queue, receives come
//! back with their buffers.

mod support;

use std::collections::HashMap;

use verbs::{
    Access, Arena, ArenaBuf, ArenaConfig, Engine, EngineConfig, HostBuf, Local, ProtectionDomain,
    QpConfig, QpId, RecvRequest, RemoteSlice, SendOp, SendRequest, SrqConfig, WcOpcode,
};

const PAIRS: usize = 256;

/// What a tag says: which queue pair posted what.
fn tag(qp: usize, op: u64) -> u64 {
    (qp as u64) << 8 | op
}

fn arena(pd: &ProtectionDomain) -> Arena {
    let config = ArenaConfig {
        capacity: 32 << 20,
        max_buffers: 16 * 1024,
        whole_region_access: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
        ..ArenaConfig::default()
    };
    Arena::new(pd, &config).unwrap()
}

/// Two engines, `PAIRS` queue pairs each, pair `i` of one connected to
/// pair `i` of the other.
fn engines(
    pd: &ProtectionDomain,
    left: &EngineConfig,
    right: &EngineConfig,
) -> (Engine<ArenaBuf>, Vec<QpId>, Engine<ArenaBuf>, Vec<QpId>) {
    let config = QpConfig {
        max_send_wr: 8,
        max_recv_wr: 8,
        max_inline_data: 16,
        ..support::config()
    };
    let mut a = Engine::new(pd, left).unwrap();
    let mut b = Engine::new(pd, right).unwrap();
    let (qa, qb) = support::engine_pairs(&mut a, &mut b, &config, PAIRS);
    (a, qa, b, qb)
}

/// Drains `engine` until `expected` requests came back, checking that each
/// comes back once, to the queue pair its tag names, with the buffer that
/// was posted (its arena offset) when it had one.
fn drain(
    engine: &mut Engine<ArenaBuf>,
    qps: &[QpId],
    posted: &mut HashMap<u64, Option<usize>>,
    expected: usize,
    bufs: &mut Vec<ArenaBuf>,
) {
    let mut back = 0;
    while back < expected {
        engine
            .wait(support::deadline(), |mut c| {
                c.result().unwrap();
                let t = c.tag();
                let owner = (t >> 8) as usize;
                assert_eq!(
                    c.qp(),
                    Some(qps[owner]),
                    "tag {t:#x} came back to the queue pair that posted it"
                );
                let offset = posted
                    .remove(&t)
                    .unwrap_or_else(|| panic!("tag {t:#x} handed back twice, or never posted"));
                let buf = c.take_buf();
                assert_eq!(
                    buf.as_ref().map(|b| b.offset()),
                    offset,
                    "tag {t:#x}: the buffer it was posted with"
                );
                bufs.extend(buf);
                back += 1;
            })
            .unwrap();
    }
}

#[test]
fn every_opcode_on_256_queue_pairs_comes_back_to_its_own_queue_pair() {
    let ctx = support::test_context("every_opcode_on_256_queue_pairs");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let config = EngineConfig {
        cq_depth: Some(PAIRS as u32 * 16),
        ..EngineConfig::default()
    };
    let (mut a, qa, mut b, qb) = engines(&pd, &config, &config);
    let mut memory = arena(&pd);
    let target = memory.whole_region().unwrap();
    let mut posted_a = HashMap::new();
    let mut posted_b = HashMap::new();
    let mut spare = Vec::new();
    for (i, (&x, &y)) in qa.iter().zip(&qb).enumerate() {
        // b receives a Send and a Write-with-immediate.
        for op in [10, 11] {
            let inbox = memory.alloc(64).unwrap();
            posted_b.insert(tag(i, op), Some(inbox.offset()));
            b.post_recv(y, RecvRequest::new(inbox).tag(tag(i, op)))
                .map_err(|e| e.error)
                .unwrap();
        }
        let mut dst_buf = memory.alloc(64).unwrap();
        dst_buf.write_at(0, &[0u8; 64]).unwrap();
        let word = RemoteSlice::new(&target, dst_buf.offset() as u64, 8).unwrap();
        let dst = RemoteSlice::new(&target, dst_buf.offset() as u64 + 8, 32).unwrap();
        spare.push(dst_buf);
        let mut post = |op: u64, send: SendOp, len: usize| {
            let mut buf = memory.alloc(64).unwrap();
            buf.write_at(0, &support::pattern(tag(i, op), 64)).unwrap();
            posted_a.insert(tag(i, op), Some(buf.offset()));
            let req =
                SendRequest::new(send, Local::range(buf, 0, len).map_err(|(e, _)| e).unwrap())
                    .tag(tag(i, op));
            a.post_send(x, req).map_err(|e| e.error).unwrap();
        };
        post(1, SendOp::Write(dst), 32);
        post(2, SendOp::Read(dst), 32);
        post(3, SendOp::Send, 16);
        post(4, SendOp::WriteImm(dst, i as u32), 8);
        post(
            5,
            SendOp::FetchAdd {
                remote: word,
                add: 1,
            },
            8,
        );
        post(
            6,
            SendOp::CompareSwap {
                remote: word,
                compare: 1,
                swap: 7,
            },
            8,
        );
        a.post_inline(x, SendOp::Write(dst), b"inline", tag(i, 7), true)
            .unwrap();
        posted_a.insert(tag(i, 7), None);
    }
    let mut bufs = Vec::new();
    drain(&mut a, &qa, &mut posted_a, PAIRS * 7, &mut bufs);
    drain(&mut b, &qb, &mut posted_b, PAIRS * 2, &mut bufs);
    assert!(
        posted_a.is_empty() && posted_b.is_empty(),
        "every request came back"
    );
    assert_eq!(bufs.len(), PAIRS * 8, "every buffer came back exactly once");
    for (&x, &y) in qa.iter().zip(&qb) {
        assert_eq!(a.in_flight(x).unwrap(), (0, 0));
        assert_eq!(b.in_flight(y).unwrap(), (0, 0));
    }
    // Atomics ran in order on each pair's word: add 1 (0 -> 1), then swap 1 -> 7.
    for d in &spare {
        let mut word = [0u8; 8];
        d.read_at(0, &mut word).unwrap();
        assert_eq!(u64::from_ne_bytes(word), 7);
    }
}

#[test]
fn a_shared_receive_queue_feeds_256_queue_pairs_and_returns_each_buffer_with_its_receive() {
    let ctx = support::test_context("a_shared_receive_queue_feeds_256_queue_pairs");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let sender = EngineConfig {
        cq_depth: Some(PAIRS as u32 * 16),
        ..EngineConfig::default()
    };
    let receiver = EngineConfig {
        cq_depth: Some(PAIRS as u32 * 16 + 1024),
        srq: Some(SrqConfig {
            max_wr: 1000,
            max_sge: 1,
        }),
        ..EngineConfig::default()
    };
    let (mut a, qa, mut b, qb) = engines(&pd, &sender, &receiver);
    let mut memory = arena(&pd);
    let mut posted = HashMap::new();
    for n in 0..PAIRS as u64 * 2 {
        let inbox = memory.alloc(64).unwrap();
        posted.insert(n, inbox.offset());
        b.post_srq_recv(RecvRequest::new(inbox).tag(n))
            .map_err(|e| e.error)
            .unwrap();
    }
    for (i, &x) in qa.iter().enumerate() {
        for m in 0..2u32 {
            a.post_inline(x, SendOp::Send, format!("from {i}.{m}").as_bytes(), 0, true)
                .unwrap();
        }
    }
    let mut sent = 0;
    while sent < PAIRS * 2 {
        a.wait(support::deadline(), |c| {
            c.result().unwrap();
            sent += 1;
        })
        .unwrap();
    }
    let mut seen = vec![false; PAIRS * 2];
    let mut got = 0;
    while got < PAIRS * 2 {
        b.wait(support::deadline(), |mut c| {
            c.result().unwrap();
            assert_eq!(c.opcode(), WcOpcode::RECV);
            let (qp, tag, len) = (c.qp(), c.tag(), c.byte_len() as usize);
            let offset = posted.remove(&tag).expect("a buffer comes back once");
            let buf = c.take_buf().expect("with its buffer");
            assert_eq!(buf.offset(), offset);
            // "from {i}.{m}": who sent it is in the message (no immediate
            // data, which iWARP has not).
            let mut landed = vec![0u8; len];
            buf.read_at(0, &mut landed).unwrap();
            let text = String::from_utf8(landed).unwrap();
            let (i, m) = text
                .strip_prefix("from ")
                .and_then(|t| t.split_once('.'))
                .map(|(i, m)| (i.parse::<usize>().unwrap(), m.parse::<usize>().unwrap()))
                .unwrap_or_else(|| panic!("a message of ours: {text:?}"));
            assert_eq!(
                qp,
                Some(qb[i]),
                "the receive names the queue pair it arrived on"
            );
            let n = i << 1 | m;
            assert!(
                !std::mem::replace(&mut seen[n], true),
                "message {text} once"
            );
            got += 1;
        })
        .unwrap();
    }
    assert!(posted.is_empty());
    assert_eq!(b.srq_posted(), 0);
    assert!(seen.iter().all(|&s| s));
}
