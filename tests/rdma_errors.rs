//! Deliberately provoked errors arrive as the right typed status, with the
//! primer's explanation, and leave the device usable.

mod support;

use verbs::sys::ibv_wc_status as S;
use verbs::{
    Access, Context, ErrorKind, Local, MemoryRegion, NicBuf, ProtectionDomain, QpConfig, QpState,
    QueuePair, RawSend, RecvRequest, RemoteSlice, SendOp, SendRequest, WcStatus,
};

type Qp = QueuePair<MemoryRegion>;

fn setup(name: &str) -> (Context, ProtectionDomain, Qp, Qp) {
    let ctx = support::test_context(name);
    let pd = ProtectionDomain::new(&ctx).expect("alloc PD");
    let (a, b) = support::connected_pair(&pd);
    (ctx, pd, a, b)
}

/// Posts a one-buffer request and returns the status it completed with.
fn status_of(qp: &mut Qp, op: SendOp, local: MemoryRegion, len: usize) -> (WcStatus, verbs::Error) {
    qp.post_send(SendRequest::new(op, Local::range(local, 0, len).unwrap()))
        .map_err(|e| e.error)
        .unwrap();
    let c = qp
        .wait_one(support::deadline())
        .expect("a completion, not a hang");
    let err = c.result().expect_err("this request must fail");
    (c.status, err)
}

#[test]
fn wrong_rkey_is_a_remote_access_error() {
    let (_ctx, pd, mut a, _b) = setup("wrong_rkey_is_a_remote_access_error");
    let target = support::remote_region(&pd, 4096);
    let local = MemoryRegion::new(&pd, 4096).unwrap();
    // The classic mix-up: our lkey where the peer's rkey belongs.
    let bad = RemoteSlice::unchecked(target.addr(), 64, local.lkey() ^ 0x5500);
    let (status, err) = status_of(&mut a, SendOp::Write(bad), local, 64);
    assert_eq!(status, S::REM_ACCESS_ERR);
    assert!(
        err.to_string().contains("rkey"),
        "the error says what to check: {err}"
    );
}

#[test]
fn remote_range_past_the_region_is_refused_locally_and_by_the_nic() {
    let (_ctx, pd, mut a, _b) = setup("remote_range_past_the_region");
    let target = support::remote_region(&pd, 4096);
    let remote = target.remote().unwrap();
    // The checked constructor refuses it before anything is posted ...
    assert!(RemoteSlice::new(&remote, 4000, 200).is_err());
    // ... and the NIC refuses it when the check is bypassed.
    let past = RemoteSlice::unchecked(remote.addr + 4000, 200, remote.rkey);
    let (status, _) = status_of(
        &mut a,
        SendOp::Write(past),
        MemoryRegion::new(&pd, 4096).unwrap(),
        200,
    );
    assert_eq!(status, S::REM_ACCESS_ERR);
}

#[test]
fn region_without_remote_write_is_a_remote_access_error() {
    let (_ctx, pd, mut a, _b) = setup("region_without_remote_write");
    let read_only = MemoryRegion::with_access(&pd, 4096, Access::REMOTE_READ).unwrap();
    let remote = read_only.remote().unwrap();
    let op = SendOp::Write(RemoteSlice::new(&remote, 0, 16).unwrap());
    let (status, err) = status_of(&mut a, op, MemoryRegion::new(&pd, 4096).unwrap(), 16);
    assert_eq!(status, S::REM_ACCESS_ERR);
    assert!(err.to_string().contains("REMOTE_WRITE"), "{err}");
    // A local-only region has nothing to share at all.
    assert!(MemoryRegion::new(&pd, 4096).unwrap().remote().is_none());
}

#[test]
fn local_sge_past_the_region_is_a_local_protection_error() {
    let (_ctx, pd, mut a, _b) = setup("local_sge_past_the_region");
    let target = support::remote_region(&pd, 1 << 16);
    let local = MemoryRegion::new(&pd, 4096).unwrap();
    // The safe API cannot express this (Local::range refuses it) ...
    assert!(Local::range(MemoryRegion::new(&pd, 4096).unwrap(), 0, 8192).is_err());
    // ... so it goes through the raw post, whose contract we keep by never
    // letting the NIC past the region: it must refuse the SGE itself.
    let mut sge = verbs::sys::ibv_sge {
        addr: local.addr(),
        length: 8192,
        lkey: local.lkey(),
    };
    let mut wr = <verbs::sys::ibv_send_wr as verbs::sys::Zeroed>::zeroed();
    // Bit 61 set: raw ids may use every bit below 62, and a raw completion
    // is returned as is (below the raw id limit).
    let id = 5 | 1 << 61;
    wr.wr_id = id;
    wr.sg_list = &mut sge;
    wr.num_sge = 1;
    wr.opcode = verbs::sys::ibv_wr_opcode::RDMA_WRITE;
    wr.send_flags = verbs::sys::ibv_send_flags::SIGNALED;
    wr.wr.rdma = verbs::sys::ibv_send_wr_rdma {
        remote_addr: target.addr(),
        rkey: target.rkey(),
    };
    // SAFETY: the SGE names registered memory of this PD that outlives the
    // completion polled below; the part past the region is refused by the
    // NIC's lkey check (which is what this test asserts), never read.
    let qp = a.id();
    let raw = unsafe { RawSend::new(std::slice::from_mut(&mut wr)) };
    a.engine_mut().post_send_raw(qp, raw).unwrap();
    let c = a.wait_one(support::deadline()).unwrap();
    assert_eq!((c.tag, c.is_recv), (id, false));
    // Soft-iWARP reports every send-queue request it fails, a local
    // protection fault included, as LOC_QP_OP_ERR (and drops the
    // connection); refused all the same.
    let refused = if support::is_soft_iwarp(pd.context()) {
        S::LOC_QP_OP_ERR
    } else {
        S::LOC_PROT_ERR
    };
    assert_eq!(c.status, refused);
    drop(local);
}

#[test]
fn send_without_a_posted_receive_and_rnr_retry_zero_is_rnr_retry_exceeded() {
    let ctx = support::test_context("send_without_a_posted_receive");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let opts = verbs::ConnectOptions {
        rnr_retry: 0,
        ..Default::default()
    };
    let (mut a, _b): (Qp, Qp) = support::connected_pair_with(&pd, &support::config(), &opts);
    let (status, err) = status_of(
        &mut a,
        SendOp::Send,
        MemoryRegion::new(&pd, 4096).unwrap(),
        16,
    );
    assert_eq!(status, S::RNR_RETRY_EXC_ERR);
    assert!(err.to_string().contains("post receives"), "{err}");
}

#[test]
fn a_send_longer_than_the_receive_fails_at_both_ends_naming_the_fix() {
    let (ctx, pd, mut a, mut b) = setup("a_send_longer_than_the_receive_fails_at_both_ends");
    let small = Local::range(MemoryRegion::new(&pd, 4096).unwrap(), 0, 16).unwrap();
    b.post_recv(RecvRequest::new(small))
        .map_err(|e| e.error)
        .unwrap();
    let (status, sent) = status_of(
        &mut a,
        SendOp::Send,
        MemoryRegion::new(&pd, 4096).unwrap(),
        64,
    );
    let c = b
        .wait_one(support::deadline())
        .expect("the receiver's completion");
    let received = c.result().expect_err("the receive must fail");
    // The specification's statuses (LOC_LEN_ERR at the receiver,
    // REM_INV_REQ_ERR at the sender); Soft-RoCE reports the message as a
    // malformed receive instead (LOC_QP_OP_ERR, answered with REM_OP_ERR).
    let want = if support::is_soft_roce(&ctx) {
        (S::LOC_QP_OP_ERR, S::REM_OP_ERR)
    } else {
        (S::LOC_LEN_ERR, S::REM_INV_REQ_ERR)
    };
    assert_eq!((c.status, status), want, "(receiver, sender)");
    for (err, fix) in [
        (received, "post receives as large"),
        (sent, "post larger receives"),
    ] {
        assert!(err.to_string().contains(fix), "{err}");
    }
    for (status, fix) in [
        (S::LOC_LEN_ERR, "post receives as large"),
        (S::REM_INV_REQ_ERR, "post larger receives"),
    ] {
        let meaning = verbs::error::wc_status_explanation(status);
        assert!(meaning.contains(fix), "{status:?}: {meaning}");
    }
}

#[test]
fn after_an_error_later_requests_flush_and_say_so() {
    let (_ctx, pd, mut a, _b) = setup("after_an_error_later_requests_flush");
    let target = support::remote_region(&pd, 4096);
    let bad = RemoteSlice::unchecked(target.addr(), 8, 0xBAD);
    let good = RemoteSlice::new(&target.remote().unwrap(), 0, 8).unwrap();
    let mut reqs: Vec<Option<SendRequest<MemoryRegion>>> = vec![
        Some(
            SendRequest::new(
                SendOp::Write(bad),
                Local::range(MemoryRegion::new(&pd, 4096).unwrap(), 0, 8).unwrap(),
            )
            .tag(1),
        ),
        Some(
            SendRequest::new(
                SendOp::Write(good),
                Local::range(MemoryRegion::new(&pd, 4096).unwrap(), 0, 8).unwrap(),
            )
            .tag(2),
        ),
        Some(
            SendRequest::new(
                SendOp::Write(good),
                Local::range(MemoryRegion::new(&pd, 4096).unwrap(), 0, 8).unwrap(),
            )
            .tag(3),
        ),
    ];
    a.post_send_chain(&mut reqs).unwrap();
    let mut got = Vec::new();
    while got.len() < 3 {
        a.wait(support::deadline(), |c| {
            got.push((c.tag(), c.status(), c.result().err()))
        })
        .unwrap();
    }
    assert_eq!(got[0].1, S::REM_ACCESS_ERR);
    for (tag, status, err) in &got[1..] {
        assert_eq!(*status, S::WR_FLUSH_ERR, "request {tag}");
        let err = err.unwrap();
        assert!(err.is_flush());
        assert!(err.to_string().contains("earlier error"), "{err}");
    }
    // The QP is now in ERR: posting is refused with a clear state error.
    assert_eq!(a.query().unwrap().state, verbs::QpState::ERR);
    let e = a
        .post_inline(SendOp::Write(good), b"x", 4, true)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::BadState);
}

#[test]
fn misuse_is_refused_with_a_typed_error() {
    let (ctx, pd, mut a, b) = setup("misuse_is_refused_with_a_typed_error");
    // Connecting twice.
    let e = a.connect(&b.endpoint().unwrap()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::BadState);
    // Unaligned atomic target.
    let target = support::remote_region(&pd, 4096);
    let odd = RemoteSlice::new(&target.remote().unwrap(), 4, 8).unwrap();
    let req = SendRequest::new(
        SendOp::FetchAdd {
            remote: odd,
            add: 1,
        },
        Local::range(MemoryRegion::new(&pd, 4096).unwrap(), 0, 8).unwrap(),
    );
    let e = a.post_send(req).unwrap_err();
    assert!(
        e.error.to_string().contains("8-byte aligned"),
        "{}",
        e.error
    );
    let _buffer_given_back: MemoryRegion = e.request.into_bufs().next().unwrap();
    // A device that does not exist, a port past the count, a GID index past the table.
    assert_eq!(
        Context::open(Some("no_such_device_0")).unwrap_err().kind(),
        ErrorKind::NotFound
    );
    let ports = ctx.query_device().unwrap().phys_port_cnt();
    assert_eq!(
        ctx.query_port(ports + 1).unwrap_err().kind(),
        ErrorKind::NotFound
    );
    let cfg = QpConfig {
        gid_index: Some(4096),
        ..support::config()
    };
    assert_eq!(
        QueuePair::<MemoryRegion>::new(&pd, &cfg)
            .unwrap_err()
            .kind(),
        ErrorKind::NotFound
    );
    // Queue deeper than the device allows.
    let cfg = QpConfig {
        max_send_wr: u32::MAX / 2,
        ..support::config()
    };
    assert!(QueuePair::<MemoryRegion>::new(&pd, &cfg).is_err());
    // Posting past the send queue depth is QueueFull, and the device stays usable.
    let small = QpConfig {
        max_send_wr: 4,
        ..support::config()
    };
    let (mut x, _y): (Qp, Qp) = support::connected_pair_with(&pd, &small, &Default::default());
    let depth = x.caps().unwrap().max_send_wr;
    let word = RemoteSlice::new(&target.remote().unwrap(), 0, 8).unwrap();
    let mut refused = None;
    for i in 0..=depth {
        if let Err(e) = x.post_inline(SendOp::Write(word), b"12345678", u64::from(i), true) {
            refused = Some(e);
            break;
        }
    }
    assert_eq!(
        refused.expect("refused past the depth").kind(),
        ErrorKind::QueueFull
    );
    let mut n = 0;
    while x.in_flight().unwrap().0 > 0 {
        x.wait(support::deadline(), |c| {
            c.result().unwrap();
            n += 1;
        })
        .unwrap();
    }
    assert_eq!(n, depth);
}

/// What no connected peer can be (QPN 0 and 1, the special queue pairs;
/// 0xFFFFFF, the multicast QPN) is refused by `connect` itself, whoever
/// built the endpoint, before the queue pair leaves INIT.
#[test]
fn connect_refuses_a_reserved_qpn_before_moving_the_queue_pair() {
    let (_ctx, pd, _a, b) = setup("connect_refuses_a_reserved_qpn");
    let mut fresh = QueuePair::<MemoryRegion>::new(&pd, &support::config()).unwrap();
    for qpn in [0, 1, 0x00FF_FFFF] {
        let mut peer = b.endpoint().unwrap();
        peer.qpn = qpn;
        let e = fresh.connect(&peer).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "QPN {qpn:#x}: {e}");
    }
    assert_eq!(fresh.state().unwrap(), QpState::INIT);
}
