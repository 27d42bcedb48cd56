//! Many connected RC queue pairs in one process, on one engine per side
//! whose completion queue holds a fraction of what their queues could
//! owe: engine `a` holds N queue pairs, each connected in loopback to its
//! own queue pair on engine `b`. Every queue pair carries a Write and a
//! Send; a post the engine's completion queue has no room for is refused
//! (`QueueFull`) and posted again after a poll; every buffer comes back
//! exactly once, to the queue pair that posted it, and every byte lands
//! where it was sent. Prints how long setup and traffic took.
//!
//! N is 10,000 (20,000 queue pairs; `VERBS_SCALE_QPS` sets another).
//! Depths are small (4 sends, 4 receives) because rxe maps each queue
//! pair's queues from the kernel (12 KiB at 4 + 4, 168 KiB at 128 + 128:
//! 20,000 queue pairs at the default depths would need 3.3 GiB, the test
//! guest has 1 GiB); the completion queues are 1,024 deep whatever N is,
//! a 78th of what the queue pairs' depths add up to.

// Refused posts come back with their requests, by value, as the API does.
#![allow(clippy::result_large_err)]

mod support;

use std::collections::HashMap;
use std::time::Instant;

use verbs::{
    Access, Arena, ArenaBuf, ArenaConfig, CompletionRef, Engine, EngineConfig, ErrorKind, HostBuf,
    Local, PostError, ProtectionDomain, QpConfig, QpId, RecvRequest, RemoteSlice, SendOp,
    SendRequest, WcOpcode,
};

/// Bytes each queue pair writes, and sends.
const LEN: usize = 32;

/// Completions each engine's queue holds: far fewer than N queue pairs'
/// queues could owe (8 each).
const CQ_DEPTH: u32 = 1024;

fn qps() -> usize {
    std::env::var("VERBS_SCALE_QPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

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

/// What came back on one engine: each request checked as it comes (success,
/// once, on the queue pair its tag names, with the buffer it was posted
/// with; a receive also carries the Send's bytes), its buffer kept.
struct Returns<'q> {
    qps: &'q [QpId],
    posted: HashMap<u64, usize>,
    back: Vec<ArenaBuf>,
}

impl Returns<'_> {
    fn take(&mut self, mut c: CompletionRef<'_, ArenaBuf>) {
        c.result().unwrap();
        let t = c.tag();
        let owner = (t >> 8) as usize;
        assert_eq!(
            c.qp(),
            Some(self.qps[owner]),
            "tag {t:#x} on its own queue pair"
        );
        let offset = self
            .posted
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
        self.back.push(buf);
    }
}

/// Posts with `post` until the engine takes the request, polling it (and
/// checking what comes back) while its completion queue has no room.
fn post_with_room<R>(
    engine: &mut Engine<ArenaBuf>,
    returns: &mut Returns<'_>,
    mut req: R,
    mut post: impl FnMut(&mut Engine<ArenaBuf>, R) -> Result<(), PostError<R>>,
) -> u64 {
    let mut refused = 0;
    loop {
        match post(engine, req) {
            Ok(()) => return refused,
            Err(e) if e.error.kind() == ErrorKind::QueueFull => {
                refused += 1;
                req = e.request;
                engine
                    .wait(support::deadline(), |c| returns.take(c))
                    .unwrap();
            }
            Err(e) => panic!("post: {}", e.error),
        }
    }
}

#[test]
fn many_queue_pairs_on_one_engine_each_carry_a_write_and_a_send() {
    let n = qps();
    let ctx = support::test_context("many_queue_pairs_on_one_engine");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let engine_config = EngineConfig {
        cq_depth: Some(CQ_DEPTH),
        ..EngineConfig::default()
    };
    let config = qp_config();

    let started = Instant::now();
    let mut a: Engine<ArenaBuf> = Engine::new(&pd, &engine_config).unwrap();
    let mut b: Engine<ArenaBuf> = Engine::new(&pd, &engine_config).unwrap();
    let qa: Vec<QpId> = (0..n).map(|_| a.add_qp(&config).unwrap()).collect();
    let qb: Vec<QpId> = (0..n).map(|_| b.add_qp(&config).unwrap()).collect();
    for (&x, &y) in qa.iter().zip(&qb) {
        let (ex, ey) = (a.endpoint(x).unwrap(), b.endpoint(y).unwrap());
        a.connect(x, &ey).unwrap();
        b.connect(y, &ex).unwrap();
    }
    let setup = started.elapsed();

    let mut memory = Arena::new(
        &pd,
        &ArenaConfig {
            capacity: (4 * n * 64 + n * LEN).next_power_of_two().max(4 << 20),
            max_buffers: 4 * n as u32 + 1,
            whole_region_access: Access::REMOTE_WRITE,
            ..ArenaConfig::default()
        },
    )
    .unwrap();
    let target = memory.whole_region().unwrap();
    // Queue pair i writes into slot i of one landing buffer.
    let mut landing = memory.alloc(n * LEN).unwrap();
    landing.write_at(0, &vec![0u8; n * LEN]).unwrap();

    let traffic = Instant::now();
    let mut sent = Returns {
        qps: &qa,
        posted: HashMap::new(),
        back: Vec::with_capacity(2 * n),
    };
    let mut received = Returns {
        qps: &qb,
        posted: HashMap::new(),
        back: Vec::with_capacity(n),
    };
    let mut refused = 0;
    for (i, (&x, &y)) in qa.iter().zip(&qb).enumerate() {
        let inbox = memory.alloc(LEN).unwrap();
        received.posted.insert(tag(i, 3), inbox.offset());
        let recv = RecvRequest::new(inbox).tag(tag(i, 3));
        refused += post_with_room(&mut b, &mut received, recv, |e, r| e.post_recv(y, r));
        let slot = landing.offset() as u64 + (i * LEN) as u64;
        let dst = RemoteSlice::new(&target, slot, LEN as u64).unwrap();
        for (op, send) in [(1, SendOp::Write(dst)), (2, SendOp::Send)] {
            let mut buf = memory.alloc(LEN).unwrap();
            buf.write_at(0, &support::pattern(tag(i, op), LEN)).unwrap();
            sent.posted.insert(tag(i, op), buf.offset());
            let local = Local::range(buf, 0, LEN).map_err(|(e, _)| e).unwrap();
            let req = SendRequest::new(send, local).tag(tag(i, op));
            refused += post_with_room(&mut a, &mut sent, req, |e, r| e.post_send(x, r));
        }
    }
    while !sent.posted.is_empty() {
        a.wait(support::deadline(), |c| sent.take(c)).unwrap();
    }
    while !received.posted.is_empty() {
        b.wait(support::deadline(), |c| received.take(c)).unwrap();
    }
    let traffic = traffic.elapsed();

    assert_eq!(
        sent.back.len() + received.back.len(),
        n * 3,
        "every buffer once"
    );
    assert!(
        n * 3 <= 2 * CQ_DEPTH as usize || refused > 0,
        "more requests than both completion queues hold were posted without a refusal"
    );
    for (&x, &y) in qa.iter().zip(&qb) {
        assert_eq!(a.in_flight(x).unwrap(), (0, 0));
        assert_eq!(b.in_flight(y).unwrap(), (0, 0));
    }
    let mut landed = vec![0u8; n * LEN];
    landing.read_at(0, &mut landed).unwrap();
    for (i, got) in landed.chunks(LEN).enumerate() {
        assert_eq!(
            got,
            &support::pattern(tag(i, 1), LEN)[..],
            "queue pair {i}'s Write"
        );
    }
    println!(
        "{} connected RC queue pairs on two engines of {CQ_DEPTH} completions: \
         setup (create, INIT, RTR, RTS) {setup:?}, a Write and a Send on each {traffic:?} \
         ({refused} posts waited for the completion queue's room)",
        2 * n
    );
}
