//! The datagram data path allocates nothing: after a warm-up, hundreds of
//! `post_recv` / `post_ud_send` / `poll` cycles on a loopback pair of UD
//! queue pairs make no heap allocation, free or reallocation (counted by a
//! global allocator, on the measuring thread only, as `rdma_zero_alloc`:
//! the other tests of the binary run beside it uncounted).

use super::support;

#[path = "../support/heap_count.rs"]
mod heap_count;

use std::sync::atomic::Ordering;

use heap_count::{counted, HEAP_OPS};

use verbs::{
    Arena, ArenaBuf, ArenaConfig, Engine, EngineConfig, Local, ProtectionDomain, QpConfig,
    RecvRequest, SendOp, SendRequest, Transport, UdDest, DEFAULT_QKEY, GRH_LEN,
};

#[global_allocator]
static GLOBAL: heap_count::Counting = heap_count::Counting;

/// `rounds` of: a receive posted at b, a datagram from a to b, both
/// polled back, their buffers kept for the next round.
fn cycles(
    e: &mut Engine<ArenaBuf>,
    a: verbs::QpId,
    b: verbs::QpId,
    to: &UdDest,
    bufs: &mut [Option<ArenaBuf>; 2],
    rounds: u32,
) {
    for _ in 0..rounds {
        let recv = bufs[0].take().unwrap();
        e.post_recv(b, RecvRequest::new(recv).tag(1))
            .map_err(|e| e.error)
            .unwrap();
        let send = Local::range(bufs[1].take().unwrap(), 0, 32)
            .map_err(|(e, _)| e)
            .unwrap();
        e.post_ud_send(a, to, SendRequest::new(SendOp::Send, send).tag(2))
            .map_err(|e| e.error)
            .unwrap();
        let mut back = 0;
        while back < 2 {
            back += e
                .wait(support::deadline(), |mut c| {
                    c.result().unwrap();
                    let i = usize::from(c.tag() == 2);
                    if i == 0 {
                        assert_eq!(c.byte_len() as usize, GRH_LEN + 32);
                    }
                    bufs[i] = c.take_buf();
                })
                .unwrap();
        }
    }
}

#[test]
fn the_ud_data_path_allocates_nothing() {
    let ctx = support::test_context("the_ud_data_path_allocates_nothing");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let mut arena = Arena::new(&pd, &ArenaConfig::default()).unwrap();
    let mut e: Engine<ArenaBuf> = Engine::new(&pd, &EngineConfig::default()).unwrap();
    let config = QpConfig {
        transport: Transport::Ud,
        max_send_wr: 8,
        max_recv_wr: 8,
        ..QpConfig::default()
    };
    let a = e.add_qp(&config).unwrap();
    let b = e.add_qp(&config).unwrap();
    e.ready_ud(a).unwrap();
    e.ready_ud(b).unwrap();
    let peer = e.endpoint(b).unwrap();
    let to = UdDest {
        ah: e.create_ah(a, peer.gid, peer.lid).unwrap(),
        qpn: peer.qpn,
        qkey: DEFAULT_QKEY,
    };
    let mut bufs = [
        Some(arena.alloc(GRH_LEN + 64).unwrap()),
        Some(arena.alloc(64).unwrap()),
    ];
    cycles(&mut e, a, b, &to, &mut bufs, 20);
    let before = HEAP_OPS.load(Ordering::Relaxed);
    counted(|| cycles(&mut e, a, b, &to, &mut bufs, 500));
    let ops = HEAP_OPS.load(Ordering::Relaxed) - before;
    assert_eq!(ops, 0, "heap operations in 500 UD send/receive cycles");
}
