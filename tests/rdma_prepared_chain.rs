//! Prepared chains (`post_prepared_chain`: several prepared sends, one
//! call, one doorbell), on a real device: each request lands and comes
//! back as a post of its own, a handle may repeat, buffers stay out of
//! reach while any chained post of them is in flight, and a chain that
//! cannot be posted whole is refused before anything is posted.

mod support;

use verbs::{
    ConnectOptions, Engine, EngineConfig, ErrorKind, HostBuf, Local, MemoryRegion, Prepared,
    PreparedSend, ProtectionDomain, QpConfig, QueuePair, RemoteSlice, SendOp, SendRequest,
    WcStatus, MAX_CHAIN,
};

type Qp = QueuePair<MemoryRegion>;

/// A prepared Write of `len` bytes from a fresh buffer to `dst`.
fn write(qp: &mut Qp, pd: &ProtectionDomain, dst: RemoteSlice, tag: u64) -> PreparedSend {
    let len = dst.len() as usize;
    let local = Local::range(MemoryRegion::new(pd, 4096).unwrap(), 0, len).unwrap();
    qp.prepare_send(SendRequest::new(SendOp::Write(dst), local).tag(tag))
        .map_err(|e| e.error)
        .unwrap()
}

/// Polls until `n` requests came back: (tag, prepared, status, signaled).
fn back(qp: &mut Qp, n: usize) -> Vec<(u64, Option<Prepared>, WcStatus, bool)> {
    let deadline = support::deadline();
    let mut got = Vec::new();
    while got.len() < n {
        qp.poll(|c| got.push((c.tag(), c.prepared(), c.status(), c.signaled())))
            .expect("poll");
        assert!(!deadline.passed(), "{} of {n} came back", got.len());
    }
    got
}

#[test]
fn a_chain_lands_every_request_and_each_comes_back_as_its_own_post() {
    let (pd, mut a, _b) =
        support::pd_and_pair("a_chain_lands_every_request_and_each_comes_back_as_its_own_post");
    let target = support::remote_region(&pd, 4096);
    let remote = target.remote().unwrap();
    let w1 = write(&mut a, &pd, RemoteSlice::new(&remote, 0, 256).unwrap(), 1);
    let w2 = write(&mut a, &pd, RemoteSlice::new(&remote, 256, 256).unwrap(), 2);
    a.write_prepared(w1, 0, &support::pattern(1, 256)).unwrap();
    a.write_prepared(w2, 0, &support::pattern(2, 256)).unwrap();
    // w1 twice: one source behind two Writes.
    a.post_prepared_chain(&[w1, w2, w1], |_| true).unwrap();
    assert_eq!(a.in_flight().unwrap().0, 3);
    for h in [w1, w2] {
        let err = a
            .prepared_buf(h)
            .expect_err("the NIC's until its last post completes");
        assert_eq!(err.kind(), ErrorKind::BadState);
        assert!(a.release_prepared(h).is_err(), "no release while in flight");
    }
    let got = back(&mut a, 3);
    let want = |tag, h| (tag, Some(Prepared::Send(h)), WcStatus::SUCCESS, true);
    assert_eq!(got, vec![want(1, w1), want(2, w2), want(1, w1)]);
    let mut landed = vec![0u8; 512];
    target.read_at(0, &mut landed).unwrap();
    assert_eq!(&landed[..256], &support::pattern(1, 256)[..]);
    assert_eq!(&landed[256..], &support::pattern(2, 256)[..]);
    assert_eq!(a.release_prepared(w1).unwrap().count(), 1);
}

#[test]
fn an_unsignaled_chain_comes_back_with_its_signaled_last_request() {
    let (pd, mut a, _b) =
        support::pd_and_pair("an_unsignaled_chain_comes_back_with_its_signaled_last_request");
    let target = support::remote_region(&pd, 4096);
    let w = write(
        &mut a,
        &pd,
        RemoteSlice::new(&target.remote().unwrap(), 0, 64).unwrap(),
        7,
    );
    for round in 0..20 {
        a.post_prepared_chain(&[w; 8], |i| i == 7).unwrap();
        let got = back(&mut a, 8);
        let signaled: Vec<bool> = got.iter().map(|g| g.3).collect();
        assert_eq!(
            signaled,
            [false, false, false, false, false, false, false, true],
            "round {round}"
        );
        assert!(got.iter().all(|g| g.2 == WcStatus::SUCCESS && g.0 == 7));
        assert_eq!(a.in_flight().unwrap(), (0, 0));
    }
    a.prepared_buf(w)
        .expect("idle once the signaled one completed");
}

#[test]
fn chains_refuse_misuse_before_posting_anything() {
    let ctx = support::test_context("chains_refuse_misuse_before_posting_anything");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let config = QpConfig {
        max_send_wr: 8,
        ..support::config()
    };
    let (mut a, mut b): (Qp, Qp) =
        support::connected_pair_with(&pd, &config, &ConnectOptions::default());
    let target = support::remote_region(&pd, 4096);
    let remote = target.remote().unwrap();
    let w = write(&mut a, &pd, RemoteSlice::new(&remote, 0, 64).unwrap(), 1);
    a.post_prepared_chain(&[], |_| true)
        .expect("an empty chain posts nothing");
    let err = a
        .post_prepared_chain(&[w; MAX_CHAIN + 1], |_| true)
        .expect_err("longer than MAX_CHAIN");
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    // Another queue pair's handle, alone or in the middle of a chain.
    assert!(b.post_prepared_chain(&[w], |_| true).is_err());
    let wb = write(&mut b, &pd, RemoteSlice::new(&remote, 64, 64).unwrap(), 2);
    assert!(a.post_prepared_chain(&[w, wb, w], |_| true).is_err());
    // More than the send queue has room for: refused whole.
    let depth = config.max_send_wr as usize;
    let err = a
        .post_prepared_chain(&[w; MAX_CHAIN][..depth + 1], |_| true)
        .expect_err("no room for a chain longer than the queue");
    assert_eq!(a.in_flight().unwrap(), (0, 0), "nothing was posted ({err})");
    // A released handle anywhere in a chain.
    let dead = write(&mut a, &pd, RemoteSlice::new(&remote, 128, 64).unwrap(), 3);
    drop(a.release_prepared(dead).unwrap());
    assert!(a.post_prepared_chain(&[w, dead], |_| true).is_err());
    assert_eq!(a.in_flight().unwrap(), (0, 0), "nothing was posted");
    a.post_prepared_chain(&[w, w], |_| true).unwrap();
    assert_eq!(back(&mut a, 2).len(), 2);
}

#[test]
fn a_chain_mixes_with_plain_posts_on_an_engine_of_several_queue_pairs() {
    let ctx =
        support::test_context("a_chain_mixes_with_plain_posts_on_an_engine_of_several_queue_pairs");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let config = support::config();
    let mut e: Engine<MemoryRegion> = Engine::new(&pd, &EngineConfig::default()).unwrap();
    let (x, y) = support::pair_on(&mut e, &config);
    let target = support::remote_region(&pd, 4096);
    let dst = RemoteSlice::new(&target.remote().unwrap(), 0, 32).unwrap();
    let prep = |e: &mut Engine<MemoryRegion>, qp, tag| {
        let local = Local::range(MemoryRegion::new(&pd, 64).unwrap(), 0, 32).unwrap();
        e.prepare_send(qp, SendRequest::new(SendOp::Write(dst), local).tag(tag))
            .map_err(|err| err.error)
            .unwrap()
    };
    let (px, py) = (prep(&mut e, x, 1), prep(&mut e, y, 2));
    let err = e
        .post_prepared_chain(&[px, py], |_| true)
        .expect_err("two queue pairs in one chain");
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    let local = Local::range(MemoryRegion::new(&pd, 64).unwrap(), 0, 32).unwrap();
    e.post_send(
        x,
        SendRequest::new(SendOp::Write(dst), local)
            .tag(9)
            .unsignaled(),
    )
    .map_err(|err| err.error)
    .unwrap();
    e.post_prepared_chain(&[px, px], |i| i == 1).unwrap();
    let mut tags = Vec::new();
    let deadline = support::deadline();
    while tags.len() < 3 {
        e.poll(|c| {
            assert_eq!(c.qp(), Some(x));
            tags.push(c.tag());
        })
        .unwrap();
        assert!(!deadline.passed());
    }
    assert_eq!(tags, [9, 1, 1], "in post order, the plain one first");
}
