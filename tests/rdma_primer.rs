//! What the primer says a connection promises, held to on a device (rxe
//! in a Soft-RoCE guest in CI): UC carries Writes and Sends but nothing
//! that needs a response (1.4), a fence orders a Write after the Read it
//! depends on (cheatsheet, `IBV_SEND_FENCE`), a Send to a peer without a
//! receive waits for one by default (6.4), and the GRH carries the
//! traffic class asked for and, on RoCE, the IP route's hop limit (4.3, 4.6).

mod support;

use std::time::{Duration, Instant};

use verbs::device::LinkLayer;
use verbs::sys::{ibv_send_flags, ibv_send_wr, ibv_send_wr_rdma, ibv_sge, ibv_wr_opcode, Zeroed};
use verbs::{
    Access, ConnectOptions, Deadline, ErrorKind, HostBuf, Local, MemoryRegion, NicBuf,
    ProtectionDomain, QpConfig, QueuePair, RawSend, RecvRequest, RemoteSlice, SendOp, SendRequest,
    Transport, WcOpcode,
};

type Qp = QueuePair<MemoryRegion>;

fn pd(test: &str) -> ProtectionDomain {
    ProtectionDomain::new(&support::test_context(test)).expect("alloc PD")
}

fn local(pd: &ProtectionDomain, data: &[u8]) -> Local<MemoryRegion> {
    let mut mr = MemoryRegion::new(pd, data.len().max(1)).unwrap();
    mr.write_at(0, data).unwrap();
    Local::range(mr, 0, data.len()).unwrap()
}

fn landed(region: &MemoryRegion, offset: usize, len: usize) -> Vec<u8> {
    let mut out = vec![0; len];
    region.read_at(offset, &mut out).unwrap();
    out
}

/// Posts `req` and returns its completion, which must succeed.
fn run(qp: &mut Qp, req: SendRequest<MemoryRegion>) -> verbs::Completion<MemoryRegion> {
    qp.post_send(req).map_err(|e| e.error).expect("post_send");
    let c = qp.wait_one(support::deadline()).expect("a completion");
    c.result().expect("a successful completion");
    c
}

fn uc_pair(pd: &ProtectionDomain) -> (Qp, Qp) {
    let config = QpConfig {
        transport: Transport::Uc,
        remote_access: Access::REMOTE_WRITE,
        ..QpConfig::default()
    };
    support::connected_pair_with(pd, &config, &ConnectOptions::default())
}

#[test]
fn uc_carries_write_write_with_immediate_and_send() {
    let pd = pd("uc_carries_write_write_with_immediate_and_send");
    let (mut a, mut b) = uc_pair(&pd);
    let target = MemoryRegion::with_access(&pd, 8192, Access::REMOTE_WRITE).unwrap();
    let remote = target.remote().unwrap();

    let data = support::pattern(1, 3000);
    let dst = RemoteSlice::new(&remote, 0, 3000).unwrap();
    let c = run(
        &mut a,
        SendRequest::new(SendOp::Write(dst), local(&pd, &data)),
    );
    assert_eq!(c.opcode, WcOpcode::RDMA_WRITE);
    assert_eq!(landed(&target, 0, 3000), data, "the Write landed");

    let data = support::pattern(2, 2500);
    let dst = RemoteSlice::new(&remote, 4096, 2500).unwrap();
    b.post_recv(RecvRequest::new(MemoryRegion::new(&pd, 64).unwrap()))
        .map_err(|e| e.error)
        .unwrap();
    run(
        &mut a,
        SendRequest::new(SendOp::WriteImm(dst, 0xC0FFEE), local(&pd, &data)),
    );
    let c = b.wait_one(support::deadline()).unwrap();
    c.result().unwrap();
    assert_eq!(
        (c.opcode, c.imm, c.byte_len),
        (WcOpcode::RECV_RDMA_WITH_IMM, Some(0xC0FFEE), 2500)
    );
    assert_eq!(
        landed(&target, 4096, 2500),
        data,
        "the Write-with-immediate landed"
    );

    let data = support::pattern(3, 2000);
    b.post_recv(RecvRequest::new(MemoryRegion::new(&pd, 4096).unwrap()))
        .map_err(|e| e.error)
        .unwrap();
    run(
        &mut a,
        SendRequest::new(SendOp::SendImm(7), local(&pd, &data)),
    );
    let mut c = b.wait_one(support::deadline()).unwrap();
    c.result().unwrap();
    assert_eq!(
        (c.opcode, c.imm, c.byte_len),
        (WcOpcode::RECV, Some(7), 2000)
    );
    assert_eq!(
        landed(&c.take_buf().unwrap(), 0, 2000),
        data,
        "the Send arrived"
    );
}

#[test]
fn uc_send_without_a_receive_completes_at_the_sender_and_is_lost() {
    let pd = pd("uc_send_without_a_receive_completes_at_the_sender_and_is_lost");
    let (mut a, mut b) = uc_pair(&pd);
    // No acknowledgement, so no RNR: the sender is done once it sent.
    run(
        &mut a,
        SendRequest::new(SendOp::SendImm(1), local(&pd, b"first")),
    );
    // Time for the first message to reach the peer (and be dropped) while
    // no receive is posted there.
    std::thread::sleep(Duration::from_millis(200));
    b.post_recv(RecvRequest::new(MemoryRegion::new(&pd, 64).unwrap()))
        .map_err(|e| e.error)
        .unwrap();
    run(
        &mut a,
        SendRequest::new(SendOp::SendImm(2), local(&pd, b"second")),
    );
    let c = b.wait_one(support::deadline()).unwrap();
    c.result().unwrap();
    assert_eq!(
        c.imm,
        Some(2),
        "the first message was dropped, not delivered late"
    );
    assert!(b
        .wait_one(Deadline::after(Duration::from_millis(200)))
        .is_err());
}

#[test]
fn uc_refuses_read_and_atomics_before_posting() {
    let pd = pd("uc_refuses_read_and_atomics_before_posting");
    let (mut a, _b) = uc_pair(&pd);
    let target = support::remote_region(&pd, 4096);
    let word = RemoteSlice::new(&target.remote().unwrap(), 0, 8).unwrap();
    let refused = [
        SendOp::Read(word),
        SendOp::FetchAdd {
            remote: word,
            add: 1,
        },
        SendOp::CompareSwap {
            remote: word,
            compare: 0,
            swap: 1,
        },
    ];
    for op in refused {
        let req = SendRequest::new(op, local(&pd, &[0; 8]));
        let e = a.post_send(req).expect_err("refused on UC");
        assert_eq!(
            e.error.kind(),
            ErrorKind::Unsupported,
            "{op:?}: {}",
            e.error
        );
        assert!(
            e.error.hint().is_some_and(|h| h.contains("RC")),
            "{}",
            e.error
        );
        assert_eq!(e.request.into_bufs().count(), 1, "the buffer comes back");

        // In a chain, nothing is posted: the Write before it stays too.
        let write = SendRequest::new(SendOp::Write(word), local(&pd, &[1; 8]));
        let mut chain = [Some(write), Some(SendRequest::new(op, local(&pd, &[0; 8])))];
        let e = a.post_send_chain(&mut chain).expect_err("refused on UC");
        assert_eq!(e.kind(), ErrorKind::Unsupported);
        assert!(
            chain.iter().all(Option::is_some),
            "both stay with the caller"
        );

        let e = a.prepare_send(SendRequest::new(op, local(&pd, &[0; 8])));
        assert_eq!(
            e.expect_err("refused on UC").error.kind(),
            ErrorKind::Unsupported
        );
    }
    assert_eq!(a.in_flight().unwrap(), (0, 0), "nothing reached the device");
    assert_eq!(landed(&target, 0, 8), [0; 8]);
}

/// Bytes each Read fetches and each Write sends back.
const FENCE_LEN: usize = 4096;

/// `rounds` rounds of: an RDMA Read of fresh bytes from the peer's
/// `source` into the local buffer `fetched`, then a Write (fenced if
/// `fenced`) from `fetched` to the peer's `sink`. Returns the rounds whose
/// `sink` did not get the fresh bytes.
fn read_then_write_rounds(
    pd: &ProtectionDomain,
    a: &mut Qp,
    b: &mut Qp,
    fenced: bool,
    rounds: u64,
) -> u64 {
    let mut source = support::remote_region(pd, FENCE_LEN);
    let sink = support::remote_region(pd, FENCE_LEN);
    let from = RemoteSlice::whole(&source.remote().unwrap());
    let to = RemoteSlice::whole(&sink.remote().unwrap());
    let mut fetched = MemoryRegion::new(pd, FENCE_LEN).unwrap();
    let mut inbox = MemoryRegion::new(pd, 64).unwrap();
    let mut stale_rounds = 0;
    for round in 0..rounds {
        let fresh = support::pattern(2 * round + 1, FENCE_LEN);
        source.write_at(0, &fresh).unwrap();
        fetched
            .write_at(0, &support::pattern(2 * round + 2, FENCE_LEN))
            .unwrap();
        // A Send the peer has no receive for yet holds the send queue (RNR,
        // retried until one comes) while the Read and the Write queue up
        // behind it; the receive posted after them lets the device take
        // both at once, as from one doorbell. Posted apart, the Read could
        // finish before the Write is even posted, and prove nothing.
        a.post_send(SendRequest::empty(SendOp::Send))
            .map_err(|e| e.error)
            .unwrap();
        // The safe API lends a buffer to one request at a time, so the Read
        // into `fetched` is a raw post and the Write from it a safe one.
        let mut sge = ibv_sge {
            addr: fetched.addr(),
            length: FENCE_LEN as u32,
            lkey: fetched.lkey(),
        };
        let mut read = ibv_send_wr::zeroed();
        read.wr_id = round;
        read.sg_list = &mut sge;
        read.num_sge = 1;
        read.opcode = ibv_wr_opcode::RDMA_READ;
        read.send_flags = ibv_send_flags::SIGNALED;
        read.wr.rdma = ibv_send_wr_rdma {
            remote_addr: from.addr(),
            rkey: from.rkey(),
        };
        let qp = a.id();
        // SAFETY: the SGE names `fetched`, registered in this PD; it moves
        // into the Write below and comes back only with that Write's
        // completion, which the send queue delivers after the Read's, so
        // nothing but the device touches it until both were polled. One raw
        // request fits beside the two safe ones in the send queue.
        let raw = unsafe { RawSend::new(std::slice::from_mut(&mut read)) };
        a.engine_mut().post_send_raw(qp, raw).unwrap();
        let write = SendRequest::new(SendOp::Write(to), Local::whole(fetched));
        a.post_send(if fenced { write.fence() } else { write })
            .map_err(|e| e.error)
            .unwrap();
        b.post_recv(RecvRequest::new(inbox))
            .map_err(|e| e.error)
            .unwrap();

        let mut done = Vec::new();
        for _ in 0..3 {
            let c = a.wait_one(support::deadline()).unwrap();
            c.result().unwrap();
            done.push(c);
        }
        let opcodes: Vec<_> = done.iter().map(|c| c.opcode).collect();
        assert_eq!(
            opcodes,
            [WcOpcode::SEND, WcOpcode::RDMA_READ, WcOpcode::RDMA_WRITE]
        );
        assert_eq!(done[1].tag, round, "the raw Read's own id");
        fetched = done[2].take_buf().unwrap();
        let mut received = b.wait_one(support::deadline()).unwrap();
        received.result().unwrap();
        inbox = received.take_buf().unwrap();
        if landed(&sink, 0, FENCE_LEN) != fresh {
            stale_rounds += 1;
        }
    }
    stale_rounds
}

#[test]
fn a_fenced_write_sends_what_the_read_before_it_fetched() {
    let pd = pd("a_fenced_write_sends_what_the_read_before_it_fetched");
    // The Send that holds the queue waits for its receive: rnr_retry 7,
    // the default, retries until one comes.
    let (mut a, mut b) = support::connected_pair(&pd);
    let unfenced = read_then_write_rounds(&pd, &mut a, &mut b, false, 20);
    assert!(
        unfenced > 0,
        "unfenced Writes must show the hazard the fence prevents, or the fenced rounds prove nothing"
    );
    let stale = read_then_write_rounds(&pd, &mut a, &mut b, true, 1000);
    assert_eq!(stale, 0, "fenced Writes that sent stale bytes");
}

/// How long the test watches a default Send wait for a receive.
const PENDING_FOR: Duration = Duration::from_secs(2);

/// The RNR NAKs the port received: what shows a Send waiting for a receive
/// (Soft-RoCE's `rcvd_rnr_err`; `None` where the port has no such counter).
fn rnr_naks_received(ctx: &verbs::Context) -> Option<u64> {
    let path = format!(
        "/sys/class/infiniband/{}/ports/1/hw_counters/rcvd_rnr_err",
        ctx.name()
    );
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[test]
fn a_send_without_a_receive_waits_by_default_and_completes_once_one_is_posted() {
    let ctx = support::test_context("a_send_without_a_receive_waits_by_default");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let (mut a, mut b) = support::connected_pair(&pd);
    assert_eq!(ConnectOptions::default().rnr_retry, 7, "forever");
    assert_eq!(a.query().unwrap().rnr_retry, 7);
    let naks_before = rnr_naks_received(&ctx);
    let data = b"waited for a receive";
    a.post_send(SendRequest::new(SendOp::Send, local(&pd, data)))
        .map_err(|e| e.error)
        .unwrap();

    // No completion and no error while the peer has no receive ...
    let pending = a.wait_one(Deadline::after(PENDING_FOR));
    assert_eq!(pending.unwrap_err().kind(), ErrorKind::TimedOut);
    assert_eq!(a.in_flight().unwrap().0, 1, "the Send is still the queue's");
    // ... only the port's RNR counter shows the peer turning it away.
    if support::is_soft_roce(&ctx) {
        let (before, now) = (naks_before.unwrap(), rnr_naks_received(&ctx).unwrap());
        assert!(now > before, "rcvd_rnr_err {before} -> {now}");
    }

    b.post_recv(RecvRequest::new(MemoryRegion::new(&pd, 64).unwrap()))
        .map_err(|e| e.error)
        .unwrap();
    let posted = Instant::now();
    a.wait_one(support::deadline()).unwrap().result().unwrap();
    println!(
        "the Send completed {:?} after the receive was posted; RNR NAKs received {naks_before:?} -> {:?}",
        posted.elapsed(),
        rnr_naks_received(&ctx)
    );
    let mut c = b.wait_one(support::deadline()).unwrap();
    c.result().unwrap();
    assert_eq!(landed(&c.take_buf().unwrap(), 0, data.len()), data);
}

#[test]
fn hop_limit_and_traffic_class_reach_the_queue_pair_and_carry_a_write() {
    let pd = pd("hop_limit_and_traffic_class_reach_the_queue_pair_and_carry_a_write");
    let target = support::remote_region(&pd, 4096);
    let dst = RemoteSlice::new(&target.remote().unwrap(), 0, 1000).unwrap();
    // The primer's hop limit, then the crate's; DSCP 26 (the primer's RoCE
    // class) is traffic class 26 << 2.
    for (round, (hop_limit, traffic_class)) in [(1, 0), (64, 26 << 2)].into_iter().enumerate() {
        let opts = ConnectOptions {
            hop_limit,
            traffic_class,
            ..ConnectOptions::default()
        };
        let (mut a, b): (Qp, Qp) = support::connected_pair_with(&pd, &support::config(), &opts);
        for qp in [&a, &b] {
            let attrs = qp.query().unwrap();
            // RoCE carries the IP route's hop limit, InfiniBand the one asked for.
            let in_effect = match qp.port().unwrap().link_layer() {
                LinkLayer::ETHERNET => support::route_hop_limit(&qp.gid().unwrap().unwrap()),
                _ => hop_limit,
            };
            assert_eq!(
                (attrs.hop_limit, attrs.traffic_class),
                (in_effect, traffic_class)
            );
        }
        let data = support::pattern(round as u64, 1000);
        run(
            &mut a,
            SendRequest::new(SendOp::Write(dst), local(&pd, &data)),
        );
        assert_eq!(landed(&target, 0, 1000), data, "hop limit {hop_limit}");
    }
}
