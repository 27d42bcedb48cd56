//! Datagrams (UD, issue 23) on a device: a datagram arrives after its
//! 40-byte routing header with the sender's QPN; what UD cannot do is
//! refused before anything is posted (RDMA operations, a message above the
//! MTU, a receive with no room for the header, an address handle of another
//! engine or protection domain); buffers come back exactly once; and a
//! hostile caller (removing an address handle in flight, forgetting,
//! dropping the engine mid-flight) reaches no freed memory; and the UD data
//! path allocates nothing (`zero_alloc.rs`, in this binary so that CI boots
//! one guest for both).

#[path = "../support/mod.rs"]
mod support;
mod zero_alloc;

use std::collections::HashSet;

use verbs::{
    Completion, Engine, EngineConfig, ErrorKind, Grh, HostBuf, Local, MemoryRegion,
    ProtectionDomain, QpConfig, QpId, QpState, RecvRequest, RemoteSlice, SendOp, SendRequest,
    Transport, UdDest, DEFAULT_QKEY, GRH_LEN,
};

fn ud_config() -> QpConfig {
    QpConfig {
        transport: Transport::Ud,
        max_send_wr: 16,
        max_recv_wr: 16,
        ..QpConfig::default()
    }
}

/// An engine with two UD queue pairs in RTS.
fn ud_engine(pd: &ProtectionDomain) -> (Engine<MemoryRegion>, QpId, QpId) {
    let mut e = Engine::new(pd, &EngineConfig::default()).expect("engine");
    let a = e.add_qp(&ud_config()).expect("UD queue pair a");
    let b = e.add_qp(&ud_config()).expect("UD queue pair b");
    assert_eq!(e.state(a).unwrap(), QpState::INIT);
    e.ready_ud(a).expect("a to RTS");
    e.ready_ud(b).expect("b to RTS");
    assert_eq!(e.state(b).unwrap(), QpState::RTS);
    (e, a, b)
}

/// `from`'s way to `to` (its GID, QPN and the default Q_Key).
fn dest(e: &mut Engine<MemoryRegion>, from: QpId, to: QpId) -> UdDest {
    let ep = e.endpoint(to).unwrap();
    let ah = e.create_ah(from, ep.gid, ep.lid).expect("create_ah");
    UdDest {
        ah,
        qpn: ep.qpn,
        qkey: DEFAULT_QKEY,
    }
}

fn region(pd: &ProtectionDomain) -> MemoryRegion {
    MemoryRegion::new(pd, 4096).unwrap()
}

/// The first 64 bytes of a fresh region: a datagram well inside the MTU.
fn small(pd: &ProtectionDomain) -> Local<MemoryRegion> {
    Local::range(region(pd), 0, 64).map_err(|(e, _)| e).unwrap()
}

/// Polls until `n` requests came back, owned.
fn collect(e: &mut Engine<MemoryRegion>, n: usize) -> Vec<Completion<MemoryRegion>> {
    let mut out = Vec::new();
    while out.len() < n {
        e.wait(support::deadline(), |c| out.push(c.into_owned()))
            .expect("completions within the deadline");
    }
    out
}

fn setup(test: &str) -> (ProtectionDomain, Engine<MemoryRegion>, QpId, QpId) {
    let ctx = support::test_context(test);
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let (e, a, b) = ud_engine(&pd);
    (pd, e, a, b)
}

#[test]
fn a_datagram_arrives_after_its_grh_with_the_senders_qpn() {
    let (pd, mut e, a, b) = setup("a_datagram_arrives_after_its_grh_with_the_senders_qpn");
    let to_b = dest(&mut e, a, b);
    e.post_recv(b, RecvRequest::new(region(&pd)).tag(1))
        .map_err(|e| e.error)
        .unwrap();
    let mut buf = region(&pd);
    buf.write_at(0, b"hello, datagram").unwrap();
    let local = Local::range(buf, 0, 15).map_err(|(e, _)| e).unwrap();
    e.post_ud_send(a, &to_b, SendRequest::new(SendOp::SendImm(7), local).tag(2))
        .map_err(|e| e.error)
        .unwrap();
    let done = collect(&mut e, 2);
    let recv = done.iter().find(|c| c.tag == 1).expect("the receive");
    let send = done.iter().find(|c| c.tag == 2).expect("the send");
    send.result().unwrap();
    recv.result().unwrap();
    assert_eq!(recv.qp, Some(b));
    assert!(
        recv.wc_flags.contains(verbs::sys::ibv_wc_flags::GRH),
        "RoCE: every UD receive has a GRH"
    );
    assert_eq!(
        recv.byte_len as usize,
        GRH_LEN + 15,
        "byte_len counts the GRH"
    );
    assert_eq!(recv.payload_offset(), GRH_LEN);
    assert_eq!(recv.src_qp, e.qp_num(a).unwrap());
    assert_eq!(recv.imm, Some(7));
    let mut recv = done.into_iter().find(|c| c.tag == 1).unwrap();
    let buf = recv.take_buf().unwrap();
    let bytes = buf.as_slice().unwrap();
    assert_eq!(&bytes[GRH_LEN..GRH_LEN + 15], b"hello, datagram");
    let grh = Grh::from_bytes(bytes).unwrap();
    let a_gid = e.endpoint(a).unwrap().gid;
    assert_eq!(
        grh.source_gid(),
        Some(a_gid),
        "the sender's GID, for a reply's address handle"
    );
    assert_eq!(grh.dest_gid(), Some(e.endpoint(b).unwrap().gid));
    // A reply built from what arrived: the GRH's GID and the completion's QPN.
    let back = e.create_ah(b, grh.source_gid().unwrap(), 0).unwrap();
    let reply = UdDest {
        ah: back,
        qpn: recv.src_qp,
        qkey: DEFAULT_QKEY,
    };
    e.post_recv(a, RecvRequest::new(region(&pd)).tag(3))
        .map_err(|e| e.error)
        .unwrap();
    let echo = Local::range(buf, GRH_LEN, 15).map_err(|(e, _)| e).unwrap();
    e.post_ud_send(b, &reply, SendRequest::new(SendOp::Send, echo).tag(4))
        .map_err(|e| e.error)
        .unwrap();
    let mut done = collect(&mut e, 2);
    let at = done.iter().position(|c| c.tag == 3).unwrap();
    let mut r = done.swap_remove(at);
    r.result().unwrap();
    assert_eq!(r.src_qp, e.qp_num(b).unwrap());
    assert_eq!(r.byte_len as usize, GRH_LEN + 15);
    let buf = r.take_buf().unwrap();
    assert_eq!(
        &buf.as_slice().unwrap()[GRH_LEN..GRH_LEN + 15],
        b"hello, datagram",
        "echoed"
    );
}

#[test]
fn a_datagram_above_the_mtu_is_refused_before_posting() {
    let (pd, mut e, a, b) = setup("a_datagram_above_the_mtu_is_refused_before_posting");
    let max = e.ud_max_payload(a).unwrap() as usize;
    let port = e.port(a).unwrap();
    assert_eq!(
        Some(max as u32),
        verbs::Mtu(port.active_mtu().0).bytes(),
        "the port's active MTU"
    );
    let to_b = dest(&mut e, a, b);
    let big = Local::range(region(&pd), 0, max + 1)
        .map_err(|(e, _)| e)
        .unwrap();
    let refused = e
        .post_ud_send(a, &to_b, SendRequest::new(SendOp::Send, big))
        .expect_err("one byte above the MTU");
    assert_eq!(refused.error.kind(), ErrorKind::InvalidArgument);
    assert!(
        refused.error.to_string().contains("larger than the MTU"),
        "{}",
        refused.error
    );
    assert_eq!(
        refused.request.local_len(),
        max + 1,
        "the request comes back whole"
    );
    assert_eq!(e.in_flight(a).unwrap(), (0, 0), "nothing was posted");
    // Exactly the MTU goes, and arrives whole.
    e.post_recv(b, RecvRequest::new(region(&pd)).tag(1))
        .map_err(|e| e.error)
        .unwrap();
    let fits = Local::range(region(&pd), 0, max)
        .map_err(|(e, _)| e)
        .unwrap();
    e.post_ud_send(a, &to_b, SendRequest::new(SendOp::Send, fits).tag(2))
        .map_err(|e| e.error)
        .unwrap();
    let done = collect(&mut e, 2);
    for c in &done {
        c.result().unwrap();
    }
    let r = done.iter().find(|c| c.tag == 1).unwrap();
    assert_eq!(r.byte_len as usize, GRH_LEN + max);
}

#[test]
fn rdma_operations_and_connected_posts_are_refused_on_ud() {
    let (pd, mut e, a, b) = setup("rdma_operations_and_connected_posts_are_refused_on_ud");
    let to_b = dest(&mut e, a, b);
    let remote = RemoteSlice::unchecked(0x1000, 8, 1);
    for op in [
        SendOp::Write(remote),
        SendOp::WriteImm(remote, 1),
        SendOp::Read(remote),
        SendOp::FetchAdd { remote, add: 1 },
        SendOp::CompareSwap {
            remote,
            compare: 0,
            swap: 1,
        },
    ] {
        let local = Local::range(region(&pd), 0, 8).map_err(|(e, _)| e).unwrap();
        let r = e
            .post_ud_send(a, &to_b, SendRequest::new(op, local))
            .expect_err("refused");
        assert_eq!(
            r.error.kind(),
            ErrorKind::Unsupported,
            "{op:?}: {}",
            r.error
        );
        assert!(r
            .error
            .to_string()
            .contains("Send and Send-with-immediate only"));
    }
    // The connected paths name no destination: refused too.
    let r = e
        .post_send(a, SendRequest::new(SendOp::Send, small(&pd)))
        .expect_err("post_send on UD");
    assert_eq!(r.error.kind(), ErrorKind::Unsupported);
    let e2 = e
        .post_inline(a, SendOp::Send, b"x", 0, true)
        .expect_err("post_inline on UD");
    assert_eq!(e2.kind(), ErrorKind::Unsupported);
    let r = e
        .prepare_send(a, SendRequest::new(SendOp::Send, small(&pd)))
        .expect_err("a prepared send would name no destination");
    assert_eq!(r.error.kind(), ErrorKind::Unsupported);
    let peer = e.endpoint(b).unwrap();
    assert_eq!(e.connect(a, &peer).unwrap_err().kind(), ErrorKind::BadState);
    assert_eq!(e.in_flight(a).unwrap(), (0, 0));
    // And a UD send on a connected queue pair is refused.
    let rc = e.add_qp(&QpConfig::default()).unwrap();
    let r = e
        .post_ud_send(rc, &to_b, SendRequest::new(SendOp::Send, small(&pd)))
        .expect_err("post_ud_send on RC");
    assert_eq!(r.error.kind(), ErrorKind::BadState);
    assert_eq!(e.ready_ud(rc).unwrap_err().kind(), ErrorKind::BadState);
}

#[test]
fn an_address_handle_of_another_engine_or_protection_domain_is_refused() {
    let (pd, mut e, a, b) =
        setup("an_address_handle_of_another_engine_or_protection_domain_is_refused");
    let ep_b = e.endpoint(b).unwrap();
    // Another protection domain on the same device, its own engine and handle.
    let pd2 = ProtectionDomain::new(pd.context()).unwrap();
    let (mut e2, x, _) = ud_engine(&pd2);
    let foreign = e2.create_ah(x, ep_b.gid, ep_b.lid).unwrap();
    // The same protection domain, another engine.
    let (mut e3, y, _) = ud_engine(&pd);
    let other_engine = e3.create_ah(y, ep_b.gid, ep_b.lid).unwrap();
    for ah in [foreign, other_engine] {
        let to = UdDest {
            ah,
            qpn: ep_b.qpn,
            qkey: DEFAULT_QKEY,
        };
        let r = e
            .post_ud_send(a, &to, SendRequest::new(SendOp::Send, small(&pd)))
            .expect_err("a handle this engine does not own");
        assert_eq!(r.error.kind(), ErrorKind::NotFound);
        assert_eq!(e.remove_ah(ah).unwrap_err().kind(), ErrorKind::NotFound);
    }
    // A removed handle's id stays dead when its slot is reused.
    let old = dest(&mut e, a, b);
    e.remove_ah(old.ah).unwrap();
    let new = dest(&mut e, a, b);
    assert_ne!(old.ah, new.ah);
    let r = e
        .post_ud_send(a, &old, SendRequest::new(SendOp::Send, small(&pd)))
        .expect_err("a removed handle");
    assert_eq!(r.error.kind(), ErrorKind::NotFound);
    assert_eq!(e.ah_count(), 1);
    assert_eq!(e2.ah_count(), 1);
    assert_eq!(e3.ah_count(), 1);
}

#[test]
fn a_ud_receive_needs_room_for_the_grh_and_a_byte() {
    let (pd, mut e, _a, b) = setup("a_ud_receive_needs_room_for_the_grh_and_a_byte");
    let short = Local::range(region(&pd), 0, GRH_LEN)
        .map_err(|(e, _)| e)
        .unwrap();
    let r = e
        .post_recv(b, RecvRequest::new(short))
        .expect_err("40 bytes: no payload room");
    assert_eq!(r.error.kind(), ErrorKind::InvalidArgument);
    assert!(r.error.to_string().contains("GRH_LEN"), "{}", r.error);
    assert_eq!(e.in_flight(b).unwrap(), (0, 0));
    let short = Local::range(region(&pd), 0, GRH_LEN)
        .map_err(|(e, _)| e)
        .unwrap();
    let r = e
        .prepare_recv(b, RecvRequest::new(short))
        .expect_err("prepared: the same rule");
    assert_eq!(r.error.kind(), ErrorKind::InvalidArgument);
    let enough = Local::range(region(&pd), 0, GRH_LEN + 1)
        .map_err(|(e, _)| e)
        .unwrap();
    e.post_recv(b, RecvRequest::new(enough))
        .map_err(|e| e.error)
        .unwrap();
    assert_eq!(e.in_flight(b).unwrap(), (0, 1));
}

#[test]
fn every_buffer_comes_back_exactly_once() {
    let (pd, mut e, a, b) = setup("every_buffer_comes_back_exactly_once");
    let to_b = dest(&mut e, a, b);
    for t in 0..16u64 {
        e.post_recv(b, RecvRequest::new(region(&pd)).tag(1000 + t))
            .map_err(|e| e.error)
            .unwrap();
    }
    let mut posted = HashSet::new();
    for round in 0..3u64 {
        for t in 0..4u64 {
            let tag = round * 4 + t;
            let mut req = SendRequest::new(
                SendOp::Send,
                Local::range(region(&pd), 0, 64)
                    .map_err(|(e, _)| e)
                    .unwrap(),
            )
            .tag(tag);
            if t % 2 == 0 {
                req = req.unsignaled();
            }
            e.post_ud_send(a, &to_b, req).map_err(|e| e.error).unwrap();
            posted.insert(tag);
        }
        // 4 sends and 4 receives per round.
        for c in collect(&mut e, 8) {
            c.result().unwrap();
            let fresh = if c.is_recv {
                posted.insert(c.tag)
            } else {
                posted.remove(&c.tag)
            };
            assert!(fresh, "tag {} came back once", c.tag);
            assert_eq!(c.into_bufs().count(), 1, "with its buffer");
        }
    }
    let recvs: Vec<u64> = posted.iter().copied().filter(|t| *t >= 1000).collect();
    assert_eq!(recvs.len(), 12, "12 receives came back, 4 still posted");
    assert_eq!(posted.len(), 12, "every send came back");
    assert_eq!(e.in_flight(b).unwrap(), (0, 4));
    // Removing the queue pair hands the device's last hold on them back.
    e.remove_qp(b).unwrap();
}

#[test]
fn an_address_handle_outlives_every_send_that_names_it() {
    let before = verbs::leaked_objects();
    let (pd, mut e, a, b) = setup("an_address_handle_outlives_every_send_that_names_it");
    let to_b = dest(&mut e, a, b);
    // No receive at b: the datagram is dropped there, the send completes here.
    e.post_ud_send(a, &to_b, SendRequest::new(SendOp::Send, small(&pd)).tag(9))
        .map_err(|e| e.error)
        .unwrap();
    let busy = e
        .remove_ah(to_b.ah)
        .expect_err("a send in flight may name it");
    assert_eq!(busy.kind(), ErrorKind::BadState);
    // An `AhId` is `Copy`: dropping or forgetting one changes nothing, the
    // engine owns the handle (no `mem::forget` can end it early).
    let done = collect(&mut e, 1);
    done[0].result().unwrap();
    e.remove_ah(to_b.ah).expect("nothing in flight any more");
    assert_eq!(e.ah_count(), 0);
    // A reset queue pair comes back to RTS with ready_ud and sends again.
    let to_b = dest(&mut e, a, b);
    e.reset(a, support::deadline(), |_| {}).unwrap();
    assert_eq!(e.state(a).unwrap(), QpState::INIT);
    e.ready_ud(a).unwrap();
    e.post_recv(b, RecvRequest::new(region(&pd)).tag(1))
        .map_err(|e| e.error)
        .unwrap();
    e.post_ud_send(a, &to_b, SendRequest::new(SendOp::Send, small(&pd)).tag(2))
        .map_err(|e| e.error)
        .unwrap();
    for c in collect(&mut e, 2) {
        c.result().unwrap();
    }
    assert_eq!(verbs::leaked_objects(), before, "nothing leaked");
}

#[test]
fn dropping_or_removing_mid_flight_frees_nothing_the_device_may_use() {
    let before = verbs::leaked_objects();
    let ctx =
        support::test_context("dropping_or_removing_mid_flight_frees_nothing_the_device_may_use");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    // Drop the engine with sends and receives in flight: queue pairs are
    // destroyed first, then their buffers dropped, then the handles.
    {
        let (mut e, a, b) = ud_engine(&pd);
        let to_b = dest(&mut e, a, b);
        for t in 0..8 {
            e.post_recv(b, RecvRequest::new(region(&pd)))
                .map_err(|e| e.error)
                .unwrap();
            e.post_ud_send(a, &to_b, SendRequest::new(SendOp::Send, small(&pd)).tag(t))
                .map_err(|e| e.error)
                .unwrap();
        }
    }
    // Remove the sending queue pair mid-flight: then the handle may go.
    {
        let (mut e, a, b) = ud_engine(&pd);
        let to_b = dest(&mut e, a, b);
        for t in 0..8 {
            e.post_ud_send(a, &to_b, SendRequest::new(SendOp::Send, small(&pd)).tag(t))
                .map_err(|e| e.error)
                .unwrap();
        }
        e.remove_qp(a).unwrap();
        e.remove_ah(to_b.ah).expect("no UD send left in flight");
    }
    assert_eq!(verbs::leaked_objects(), before, "every destroy succeeded");
    // Forget an engine mid-flight: everything it holds leaks, nothing is freed
    // under the device (its handles included).
    let (mut e, a, b) = ud_engine(&pd);
    let to_b = dest(&mut e, a, b);
    e.post_ud_send(a, &to_b, SendRequest::new(SendOp::Send, small(&pd)))
        .map_err(|e| e.error)
        .unwrap();
    std::mem::forget(e);
}

/// rxe flags `IBV_WC_GRH` on RoCE receives of every transport, but only a
/// datagram queue pair's buffer starts with the header: an RC receive's
/// payload is at offset 0, whatever the flag says.
#[test]
fn a_connected_receive_has_its_payload_at_offset_zero() {
    let (pd, mut a, mut b) = support::pd_and_pair::<MemoryRegion>("rc payload offset");
    let mut out = region(&pd);
    out.write_at(0, b"connected").unwrap();
    let inbox = region(&pd);
    b.post_recv(RecvRequest::new(inbox))
        .map_err(|e| e.error)
        .unwrap();
    a.post_send(SendRequest::new(
        SendOp::Send,
        Local::range(out, 0, 9).map_err(|(e, _)| e).unwrap(),
    ))
    .map_err(|e| e.error)
    .unwrap();
    a.wait_one(support::deadline()).unwrap().result().unwrap();
    let mut got = b.wait_one(support::deadline()).unwrap();
    got.result().unwrap();
    assert_eq!(got.byte_len, 9);
    assert_eq!(got.payload_offset(), 0, "flags {:?}", got.wc_flags);
    let buf = got.take_buf().unwrap();
    let mut bytes = [0u8; 9];
    buf.read_at(got.payload_offset(), &mut bytes).unwrap();
    assert_eq!(&bytes, b"connected");
}
