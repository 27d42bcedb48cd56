//! A thousand connected RC queue pairs in one process: engine `a` holds
//! 1000, each connected in loopback to its own queue pair on engine `b`.
//! Every queue pair carries a Write and a Send; every buffer comes back
//! exactly once, to the queue pair that posted it, and every byte lands
//! where it was sent. Prints how long setup and traffic took.
//!
//! Depths are small (4 sends, 4 receives per queue pair) because an
//! engine's one completion queue must hold every completion its queue
//! pairs' rings can owe, and rxe's CQs hold at most 32767: 1000 queue
//! pairs on one engine allow at most 32 per queue pair (the default
//! 128 + 128 allows 127 queue pairs). Memory is not what binds: rxe maps
//! 12 KiB of queues per queue pair at 4 + 4 (24 MiB for the 2000), and
//! even at the default depths 2000 queue pairs (168 KiB each) fit the
//! test guest's 1 GiB (`tests/softroce/scale_compare`, docs/PERF.md).

mod support;

use std::collections::HashMap;
use std::time::Instant;

use verbs::{
    Access, Arena, ArenaBuf, ArenaConfig, Engine, EngineConfig, HostBuf, Local, ProtectionDomain,
    QpConfig, QpId, RecvRequest, RemoteSlice, SendOp, SendRequest, WcOpcode,
};

/// Queue pairs per engine.
const QPS: usize = 1000;

/// Bytes each queue pair writes, and sends.
const LEN: usize = 32;

/// Which queue pair posted what: `op` 1 the Write, 2 the Send, 3 the receive.
fn tag(qp: usize, op: u64) -> u64 {
    (qp as u64) << 8 | op
}

fn qp_config() -> QpConfig {
    QpConfig {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_sge: 1,
        max_inline_data: 0,
        remote_access: Access::REMOTE_WRITE,
        ..QpConfig::default()
    }
}

/// Waits until `expected` requests came back on `engine`, checking each:
/// success, once, on the queue pair its tag names, with the buffer it was
/// posted with; a receive also carries the Send's bytes.
fn drain(
    engine: &mut Engine<ArenaBuf>,
    qps: &[QpId],
    posted: &mut HashMap<u64, usize>,
    expected: usize,
) -> Vec<ArenaBuf> {
    let mut back = Vec::with_capacity(expected);
    while back.len() < expected {
        engine
            .wait(support::deadline(), |mut c| {
                c.result().unwrap();
                let t = c.tag();
                let owner = (t >> 8) as usize;
                assert_eq!(c.qp(), Some(qps[owner]), "tag {t:#x} on its own queue pair");
                let offset = posted
                    .remove(&t)
                    .unwrap_or_else(|| panic!("tag {t:#x} handed back twice, or never posted"));
                let buf = c.take_buf().expect("a buffer with every request");
                assert_eq!(
                    buf.offset(),
                    offset,
                    "tag {t:#x}: the buffer it was posted with"
                );
                if c.opcode() == WcOpcode::RECV {
                    let mut got = [0u8; LEN];
                    buf.read_at(0, &mut got).unwrap();
                    assert_eq!(got[..], support::pattern(tag(owner, 2), LEN)[..]);
                }
                back.push(buf);
            })
            .unwrap();
    }
    back
}

#[test]
fn a_thousand_queue_pairs_on_one_engine_each_carry_a_write_and_a_send() {
    let ctx = support::test_context("a_thousand_queue_pairs_on_one_engine");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let engine_config = EngineConfig {
        cq_depth: Some(QPS as u32 * 8),
        ..EngineConfig::default()
    };
    let config = qp_config();

    let started = Instant::now();
    let mut a: Engine<ArenaBuf> = Engine::new(&pd, &engine_config).unwrap();
    let mut b: Engine<ArenaBuf> = Engine::new(&pd, &engine_config).unwrap();
    let qa: Vec<QpId> = (0..QPS).map(|_| a.add_qp(&config).unwrap()).collect();
    let qb: Vec<QpId> = (0..QPS).map(|_| b.add_qp(&config).unwrap()).collect();
    for (&x, &y) in qa.iter().zip(&qb) {
        let (ex, ey) = (a.endpoint(x).unwrap(), b.endpoint(y).unwrap());
        a.connect(x, &ey).unwrap();
        b.connect(y, &ex).unwrap();
    }
    let setup = started.elapsed();

    let mut memory = Arena::new(
        &pd,
        &ArenaConfig {
            capacity: 4 << 20,
            max_buffers: 4 * QPS as u32,
            whole_region_access: Access::REMOTE_WRITE,
            ..ArenaConfig::default()
        },
    )
    .unwrap();
    let target = memory.whole_region().unwrap();
    // Queue pair i writes into slot i of one landing buffer.
    let mut landing = memory.alloc(QPS * LEN).unwrap();
    landing.write_at(0, &vec![0u8; QPS * LEN]).unwrap();

    let traffic = Instant::now();
    let mut posted_a = HashMap::new();
    let mut posted_b = HashMap::new();
    for (i, (&x, &y)) in qa.iter().zip(&qb).enumerate() {
        let inbox = memory.alloc(LEN).unwrap();
        posted_b.insert(tag(i, 3), inbox.offset());
        b.post_recv(y, RecvRequest::new(inbox).tag(tag(i, 3)))
            .map_err(|e| e.error)
            .unwrap();
        let slot = landing.offset() as u64 + (i * LEN) as u64;
        let dst = RemoteSlice::new(&target, slot, LEN as u64).unwrap();
        for (op, send) in [(1, SendOp::Write(dst)), (2, SendOp::Send)] {
            let mut buf = memory.alloc(LEN).unwrap();
            buf.write_at(0, &support::pattern(tag(i, op), LEN)).unwrap();
            posted_a.insert(tag(i, op), buf.offset());
            let local = Local::range(buf, 0, LEN).map_err(|(e, _)| e).unwrap();
            a.post_send(x, SendRequest::new(send, local).tag(tag(i, op)))
                .map_err(|e| e.error)
                .unwrap();
        }
    }
    let sent = drain(&mut a, &qa, &mut posted_a, QPS * 2);
    let received = drain(&mut b, &qb, &mut posted_b, QPS);
    let traffic = traffic.elapsed();

    assert!(
        posted_a.is_empty() && posted_b.is_empty(),
        "every request came back"
    );
    assert_eq!(sent.len() + received.len(), QPS * 3, "every buffer once");
    for (&x, &y) in qa.iter().zip(&qb) {
        assert_eq!(a.in_flight(x).unwrap(), (0, 0));
        assert_eq!(b.in_flight(y).unwrap(), (0, 0));
    }
    let mut landed = vec![0u8; QPS * LEN];
    landing.read_at(0, &mut landed).unwrap();
    for (i, got) in landed.chunks(LEN).enumerate() {
        assert_eq!(
            got,
            &support::pattern(tag(i, 1), LEN)[..],
            "queue pair {i}'s Write"
        );
    }
    println!(
        "{} connected RC queue pairs: setup (create, INIT, RTR, RTS) {setup:?}, \
         a Write and a Send on each {traffic:?}",
        2 * QPS
    );
}
