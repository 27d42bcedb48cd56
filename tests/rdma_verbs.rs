//! Every verb of the safe layer, round-tripped on a real device (rxe in a
//! Soft-RoCE guest in CI) with byte-exact checks.

mod support;

use verbs::{
    Completion, HostBuf, Local, MemoryRegion, ProtectionDomain, QueuePair, RecvRequest,
    RemoteSlice, SendOp, SendRequest, WcOpcode, WcStatus,
};

type Qp = QueuePair<MemoryRegion>;

/// Posts `req` on `qp` and returns its completion (which must succeed).
fn run(qp: &mut Qp, req: SendRequest<MemoryRegion>) -> Completion<MemoryRegion> {
    qp.post_send(req).map_err(|e| e.error).expect("post_send");
    let c = qp.wait_one(support::deadline()).expect("completion");
    c.result().expect("successful completion");
    c
}

fn setup(name: &str) -> (ProtectionDomain, Qp, Qp) {
    support::pd_and_pair(name)
}

#[test]
fn rdma_write_then_read_back_is_byte_exact() {
    let (pd, mut a, _b) = setup("rdma_write_then_read_back_is_byte_exact");
    let target = support::remote_region(&pd, 1 << 20);
    let remote = target.remote().unwrap();
    let mut local = MemoryRegion::new(&pd, 1 << 20).unwrap();
    for (i, &size) in [1usize, 2, 63, 64, 4096, 65536, 1 << 20].iter().enumerate() {
        let data = support::pattern(i as u64 + 1, size);
        local.write_at(0, &data).unwrap();
        let dst = RemoteSlice::new(&remote, 0, size as u64).unwrap();
        let mut c = run(
            &mut a,
            SendRequest::new(SendOp::Write(dst), Local::range(local, 0, size).unwrap()),
        );
        assert_eq!(c.opcode, WcOpcode::RDMA_WRITE);
        local = c.take_buf().unwrap();
        let mut landed = vec![0u8; size];
        target.read_at(0, &mut landed).unwrap();
        assert_eq!(landed, data, "write of {size} bytes landed byte-exact");

        local.write_at(0, &vec![0u8; size]).unwrap();
        let mut c = run(
            &mut a,
            SendRequest::new(SendOp::Read(dst), Local::range(local, 0, size).unwrap()),
        );
        assert_eq!(c.opcode, WcOpcode::RDMA_READ);
        assert_eq!(c.byte_len as usize, size);
        local = c.take_buf().unwrap();
        let mut back = vec![0u8; size];
        local.read_at(0, &mut back).unwrap();
        assert_eq!(back, data, "read of {size} bytes came back byte-exact");
    }
}

#[test]
fn send_and_receive_deliver_the_message() {
    let (pd, mut a, mut b) = setup("send_and_receive_deliver_the_message");
    let inbox = MemoryRegion::new(&pd, 4096).unwrap();
    b.post_recv(RecvRequest::new(inbox).tag(77))
        .map_err(|e| e.error)
        .unwrap();
    let mut msg = MemoryRegion::new(&pd, 4096).unwrap();
    let data = support::pattern(5, 1000);
    msg.write_at(0, &data).unwrap();
    run(
        &mut a,
        SendRequest::new(SendOp::Send, Local::range(msg, 0, 1000).unwrap()),
    );
    let mut c = b.wait_one(support::deadline()).unwrap();
    c.result().unwrap();
    assert!(c.is_recv);
    assert_eq!((c.tag, c.byte_len, c.opcode), (77, 1000, WcOpcode::RECV));
    let inbox = c.take_buf().unwrap();
    assert_eq!(&inbox.as_slice().unwrap()[..1000], &data[..]);
}

#[test]
fn write_with_immediate_delivers_the_immediate_and_the_data() {
    let (pd, mut a, mut b) = setup("write_with_immediate_delivers_the_immediate_and_the_data");
    let target = support::remote_region(&pd, 4096);
    let remote = target.remote().unwrap();
    b.post_recv(RecvRequest::new(MemoryRegion::new(&pd, 4096).unwrap()))
        .map_err(|e| e.error)
        .unwrap();
    let mut src = MemoryRegion::new(&pd, 4096).unwrap();
    src.write_at(0, b"immediate!").unwrap();
    let dst = RemoteSlice::new(&remote, 100, 10).unwrap();
    run(
        &mut a,
        SendRequest::new(
            SendOp::WriteImm(dst, 0xDEAD_BEEF),
            Local::range(src, 0, 10).unwrap(),
        ),
    );
    let c = b.wait_one(support::deadline()).unwrap();
    c.result().unwrap();
    assert_eq!(c.opcode, WcOpcode::RECV_RDMA_WITH_IMM);
    assert_eq!(c.imm, Some(0xDEAD_BEEF));
    let mut landed = [0u8; 10];
    target.read_at(100, &mut landed).unwrap();
    assert_eq!(&landed, b"immediate!");
}

#[test]
fn atomics_return_the_old_value_and_update_the_target() {
    let (pd, mut a, _b) = setup("atomics_return_the_old_value_and_update_the_target");
    let mut target = support::remote_region(&pd, 4096);
    target.write_at(8, &40u64.to_ne_bytes()).unwrap();
    let word = RemoteSlice::new(&target.remote().unwrap(), 8, 8).unwrap();
    let result = MemoryRegion::new(&pd, 4096).unwrap();

    let mut c = run(
        &mut a,
        SendRequest::new(
            SendOp::FetchAdd {
                remote: word,
                add: 2,
            },
            Local::range(result, 0, 8).unwrap(),
        ),
    );
    assert_eq!(c.opcode, WcOpcode::FETCH_ADD);
    let result = c.take_buf().unwrap();
    assert_eq!(
        u64::from_ne_bytes(result.as_slice().unwrap()[..8].try_into().unwrap()),
        40,
        "old value"
    );
    let mut now = [0u8; 8];
    target.read_at(8, &mut now).unwrap();
    assert_eq!(u64::from_ne_bytes(now), 42, "target updated");

    let op = SendOp::CompareSwap {
        remote: word,
        compare: 42,
        swap: 7,
    };
    let mut c = run(
        &mut a,
        SendRequest::new(op, Local::range(result, 0, 8).unwrap()),
    );
    assert_eq!(c.opcode, WcOpcode::COMP_SWAP);
    let result = c.take_buf().unwrap();
    assert_eq!(
        u64::from_ne_bytes(result.as_slice().unwrap()[..8].try_into().unwrap()),
        42
    );
    target.read_at(8, &mut now).unwrap();
    assert_eq!(u64::from_ne_bytes(now), 7, "swapped");

    // A failed compare returns the current value and leaves the target alone.
    let op = SendOp::CompareSwap {
        remote: word,
        compare: 1,
        swap: 99,
    };
    let mut c = run(
        &mut a,
        SendRequest::new(op, Local::range(result, 0, 8).unwrap()),
    );
    let result = c.take_buf().unwrap();
    assert_eq!(
        u64::from_ne_bytes(result.as_slice().unwrap()[..8].try_into().unwrap()),
        7
    );
    target.read_at(8, &mut now).unwrap();
    assert_eq!(u64::from_ne_bytes(now), 7);
}

#[test]
fn inline_writes_need_no_buffer_and_respect_the_granted_size() {
    let (pd, mut a, _b) = setup("inline_writes_need_no_buffer_and_respect_the_granted_size");
    let target = support::remote_region(&pd, 4096);
    let remote = target.remote().unwrap();
    let granted = a.caps().unwrap().max_inline_data as usize;
    assert!(
        granted >= 16,
        "device granted {granted} bytes of inline data"
    );
    let data = support::pattern(9, granted);
    a.post_inline(
        SendOp::Write(RemoteSlice::new(&remote, 0, granted as u64).unwrap()),
        &data,
        1,
        true,
    )
    .unwrap();
    a.wait_one(support::deadline()).unwrap().result().unwrap();
    let mut landed = vec![0u8; granted];
    target.read_at(0, &mut landed).unwrap();
    assert_eq!(landed, data);

    let too_big = vec![1u8; granted + 1];
    let e = a
        .post_inline(
            SendOp::Write(RemoteSlice::whole(&remote)),
            &too_big,
            2,
            true,
        )
        .unwrap_err();
    assert!(e.to_string().contains("max_inline_data"), "{e}");
}

#[test]
fn chained_and_selectively_signaled_posts_all_come_back() {
    let (pd, mut a, _b) = setup("chained_and_selectively_signaled_posts_all_come_back");
    let target = support::remote_region(&pd, 64 * 1024);
    let remote = target.remote().unwrap();
    let mut reqs: Vec<Option<SendRequest<MemoryRegion>>> = (0..16u64)
        .map(|i| {
            let mut buf = MemoryRegion::new(&pd, 4096).unwrap();
            buf.write_at(0, &support::pattern(100 + i, 1024)).unwrap();
            let dst = RemoteSlice::new(&remote, i * 1024, 1024).unwrap();
            let req =
                SendRequest::new(SendOp::Write(dst), Local::range(buf, 0, 1024).unwrap()).tag(i);
            Some(if i % 4 == 3 { req } else { req.unsignaled() })
        })
        .collect();
    assert_eq!(a.post_send_chain(&mut reqs).unwrap(), 16);
    assert!(
        reqs.iter().all(Option::is_none),
        "every posted request moved into the QP"
    );
    let mut back = Vec::new();
    while back.len() < 16 {
        a.wait(support::deadline(), |c| back.push(c.into_owned()))
            .unwrap();
    }
    let tags: Vec<u64> = back.iter().map(|c| c.tag).collect();
    assert_eq!(
        tags,
        (0..16).collect::<Vec<_>>(),
        "every request handed back once, in order"
    );
    assert!(back.iter().all(|c| c.status == WcStatus::SUCCESS));
    assert!(
        back.iter().any(|c| !c.signaled),
        "some requests were unsignaled"
    );
    assert_eq!(a.in_flight().unwrap(), (0, 0));
    for i in 0..16u64 {
        let mut landed = vec![0u8; 1024];
        target.read_at(i as usize * 1024, &mut landed).unwrap();
        assert_eq!(landed, support::pattern(100 + i, 1024), "chunk {i}");
    }
}

#[test]
fn unsignaled_requests_never_fill_the_send_queue() {
    let (pd, mut a, _b) = setup("unsignaled_requests_never_fill_the_send_queue");
    let target = support::remote_region(&pd, 4096);
    let remote = target.remote().unwrap();
    let depth = a.caps().unwrap().max_send_wr as usize;
    // Far more unsignaled writes than the queue holds: without forced
    // signaling the queue would fill and never drain.
    let mut done = 0;
    for i in 0..depth * 4 {
        let dst = RemoteSlice::new(&remote, 0, 8).unwrap();
        loop {
            match a.post_inline(
                SendOp::Write(dst),
                &(i as u64).to_ne_bytes(),
                i as u64,
                false,
            ) {
                Ok(()) => break,
                Err(e) if e.kind() == verbs::ErrorKind::QueueFull => {
                    a.wait(support::deadline(), |_| done += 1)
                        .expect("the queue drains");
                }
                Err(e) => panic!("{e}"),
            }
        }
    }
    while a.in_flight().unwrap().0 > 0 {
        a.wait(support::deadline(), |_| done += 1)
            .expect("the queue drains");
    }
    assert_eq!(done, depth * 4);
}

#[test]
fn rxe_gid_auto_selection_picks_the_ipv4_mapped_roce_v2_entry() {
    let ctx = support::test_context("rxe_gid_auto_selection");
    let table = ctx.gid_table(1).unwrap();
    for e in &table {
        println!(
            "GID[{}] {} {:?} {:?}",
            e.index,
            e.gid,
            e.gid_type,
            e.netdev()
        );
    }
    let chosen = verbs::device::choose_gid_index(&table).expect("a usable GID");
    let entry = table.iter().find(|e| e.index == chosen).unwrap();
    assert!(
        entry.gid.ipv4().is_some(),
        "IPv4-mapped chosen: {}",
        entry.gid
    );
    assert_eq!(entry.gid_type, verbs::device::GidType::ROCE_V2);
    if ctx.name().starts_with("rxe") {
        assert_eq!(
            chosen, 1,
            "on rxe index 0 is link-local, 1 the IPv4-mapped RoCE v2 GID"
        );
    }
}

/// Audit finding 6, a hostile caller taking a `QueuePair`'s queue pair
/// away behind its back: removed through `engine_mut()`, or leaked with a
/// forgotten lane. Every accessor then says so with a `NotFound` error
/// (none panics), and `id` and `qp_num` still name the queue pair.
#[test]
fn accessors_of_a_queue_pair_taken_away_are_errors_not_panics() {
    let (pd, mut a, mut b) = setup("accessors_of_a_queue_pair_taken_away_are_errors_not_panics");
    let (qpn_a, qpn_b) = (a.qp_num(), b.qp_num());
    let id = a.id();
    a.engine_mut().remove_qp(id).unwrap();
    let local = Local::range(MemoryRegion::new(&pd, 64).unwrap(), 0, 8).unwrap();
    let send = b
        .prepare_send(SendRequest::new(SendOp::Send, local))
        .map_err(|e| e.error)
        .unwrap();
    std::mem::forget(b.lane(send, None).unwrap());
    for (name, qp) in [("removed", &a), ("leaked with a forgotten lane", &b)] {
        let errors = [
            ("state", qp.state().err()),
            ("in_flight", qp.in_flight().err()),
            ("caps", qp.caps().err()),
            ("raw_id", qp.raw_id().err()),
            ("gid", qp.gid().err()),
            ("port", qp.port().err()),
            ("query", qp.query().err()),
            ("endpoint", qp.endpoint().err()),
        ];
        for (call, e) in errors {
            let e = e.unwrap_or_else(|| panic!("{call}() answered on a queue pair {name}"));
            assert_eq!(e.kind(), verbs::ErrorKind::NotFound, "{call}(): {e}");
        }
    }
    assert_eq!((a.id(), a.qp_num(), b.qp_num()), (id, qpn_a, qpn_b));
    let peer = Qp::new(&pd, &support::config())
        .unwrap()
        .endpoint()
        .unwrap();
    let e = a.connect(&peer).unwrap_err();
    assert_eq!(e.kind(), verbs::ErrorKind::NotFound, "{e}");
}
