//! The audit's ways to undefined behaviour from safe code, and its logic
//! bugs, each as the scenario that broke the crate before the engine:
//! every test here failed (or crashed) on the code it was written against,
//! and must hold now.

mod support;

use verbs::sys::ibv_wc_status as S;
use verbs::{
    Access, Arena, ArenaBuf, ArenaConfig, Engine, EngineConfig, ErrorKind, Exposed, HostBuf, Local,
    MemoryRegion, NicBuf, ProtectionDomain, QpConfig, QpId, Queue, QueuePair, RawSend, RecvRequest,
    RemoteSlice, SendOp, SendRequest, SrqConfig,
};

fn arena(pd: &ProtectionDomain, windows: bool) -> Arena {
    let config = ArenaConfig {
        capacity: 1 << 20,
        windows,
        ..ArenaConfig::default()
    };
    Arena::new(pd, &config).unwrap()
}

/// An engine with a shared receive queue and one queue pair on it,
/// connected to a plain sender.
fn srq_engine(pd: &ProtectionDomain) -> (Engine<ArenaBuf>, verbs::QpId, QueuePair<ArenaBuf>) {
    let srq = EngineConfig {
        srq: Some(SrqConfig {
            max_wr: 8,
            max_sge: 1,
        }),
        ..EngineConfig::default()
    };
    let mut engine = Engine::new(pd, &srq).unwrap();
    let config = support::config();
    let (sender, qp) = support::sender_to(pd, &mut engine, &config);
    (engine, qp, sender)
}

/// Hole 1: with two shared receive queues whose ids both start at slot 0,
/// generation 0, a completion of A handed another queue's still-posted
/// buffer to B's caller. Now a receive comes back with its own queue's
/// buffer, from its own engine, and nothing else reaches the victim.
#[test]
fn a_shared_receive_never_hands_out_another_queues_buffer() {
    let ctx = support::test_context("a_shared_receive_never_hands_out_another_queues_buffer");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let mut memory = arena(&pd, false);
    let (mut a, _qa, mut to_a) = srq_engine(&pd);
    let (mut b, _qb, mut to_b) = srq_engine(&pd);
    let mine = memory.alloc(64).unwrap();
    let mine_addr = mine.addr();
    a.post_srq_recv(RecvRequest::new(mine).tag(1))
        .map_err(|e| e.error)
        .unwrap();
    let victim = memory.alloc(64).unwrap();
    let victim_addr = victim.addr();
    b.post_srq_recv(RecvRequest::new(victim).tag(1))
        .map_err(|e| e.error)
        .unwrap();

    to_a.post_inline(SendOp::Send, b"to A", 1, true).unwrap();
    to_a.wait_one(support::deadline())
        .unwrap()
        .result()
        .unwrap();
    let mut got = None;
    a.wait(support::deadline(), |mut c| {
        got = Some((c.result(), c.take_buf()))
    })
    .unwrap();
    let (result, buf) = got.unwrap();
    result.unwrap();
    assert_eq!(
        buf.map(|b| b.addr()),
        Some(mine_addr),
        "A's receive returns A's buffer"
    );
    assert_eq!(
        b.srq_posted(),
        1,
        "B's victim is still posted, and B's alone"
    );
    let mut nothing = 0;
    b.poll(|_| nothing += 1).unwrap();
    assert_eq!(nothing, 0, "A's completion never shows up on B");

    // The victim stays the device's: the range it owns cannot be handed out
    // again, and B's peer's message lands in it.
    let again = memory.alloc(64).unwrap();
    assert_ne!(
        again.addr(),
        victim_addr,
        "the posted range is not reallocated"
    );
    to_b.post_inline(SendOp::Send, b"to B", 2, true).unwrap();
    to_b.wait_one(support::deadline())
        .unwrap()
        .result()
        .unwrap();
    let mut landed = None;
    b.wait(support::deadline(), |mut c| landed = c.take_buf())
        .unwrap();
    let landed = landed.expect("B's receive comes back with its buffer");
    assert_eq!(landed.addr(), victim_addr);
    assert_eq!(&landed.as_slice().unwrap()[..4], b"to B");
}

/// Hole 2: on Soft-RoCE a window's rkey reached the whole arena, so a peer
/// wrote a never-exposed buffer while the owner held it as `&mut [u8]`.
/// Now exposing grants exactly the buffer on every device: a write to the
/// private buffer with the grant's rkey is refused, and its slice is intact.
#[test]
fn an_exposed_buffer_grants_nothing_beyond_itself_on_any_device() {
    let ctx = support::test_context("an_exposed_buffer_grants_nothing_beyond_itself");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let mut memory = arena(&pd, true);
    let (mut a, mut b): (QueuePair<ArenaBuf>, QueuePair<ArenaBuf>) = support::connected_pair(&pd);
    let mut private = memory.alloc(4096).unwrap();
    private.as_mut_slice().unwrap().fill(0x11);
    let exposing = b
        .expose(memory.alloc(4096).unwrap(), Access::REMOTE_WRITE, 9)
        .map_err(|(e, _)| e)
        .unwrap();
    if exposing.kind() == Exposed::Window {
        assert!(
            ctx.windows_enforce_bounds().unwrap(),
            "windows only where bounded"
        );
        b.wait_one(support::deadline()).unwrap().result().unwrap();
    } else {
        assert!(
            !ctx.windows_enforce_bounds().unwrap(),
            "Soft-RoCE gets a registration"
        );
    }
    let exposed = b.exposed(exposing).map_err(|(e, _)| e).unwrap();
    let rkey = exposed.remote().rkey;
    let mut src = memory.alloc(64).unwrap();
    src.write_at(0, &[0xAB; 64]).unwrap();
    let aim = RemoteSlice::unchecked(private.addr(), 64, rkey);
    a.post_send(SendRequest::new(SendOp::Write(aim), src))
        .map_err(|e| e.error)
        .unwrap();
    let c = a.wait_one(support::deadline()).unwrap();
    assert_eq!(
        c.status,
        S::REM_ACCESS_ERR,
        "the grant does not reach the private buffer"
    );
    assert!(
        private.as_mut_slice().unwrap().iter().all(|&x| x == 0x11),
        "the live slice is intact"
    );
}

/// Audit finding 2: `expose` returned the `ExposedBuf` before its window's
/// bind completed, so dropping or revoking it deallocated the window and
/// gave the buffer back to the arena while the bind could still be queued.
/// Now `expose` gives an `Exposing`, and the buffer (with its descriptor)
/// comes out of `exposed` only once the grant is in place: at once for a
/// registration (Soft-RoCE, which never binds), after the bind's
/// completion for a window (refused before it, the value back). The
/// engine simulation holds the window case to it on the host
/// (`engine::sim::binds`). An `Exposing` dropped unclaimed frees nothing
/// the device may use: a registration's buffer comes back at once.
#[test]
fn an_exposed_buffer_comes_out_only_once_its_grant_is_in_place() {
    let ctx = support::test_context("an_exposed_buffer_comes_out_only_once_its_grant_is_in_place");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let mut memory = arena(&pd, true);
    let (mut a, mut b): (QueuePair<ArenaBuf>, QueuePair<ArenaBuf>) = support::connected_pair(&pd);
    let exposing = b
        .expose(memory.alloc(4096).unwrap(), Access::REMOTE_WRITE, 31)
        .map_err(|(e, _)| e)
        .unwrap();
    let exposing = if exposing.is_binding() {
        let (e, exposing) = b.exposed(exposing).unwrap_err();
        assert_eq!(
            e.kind(),
            ErrorKind::BadState,
            "before the bind's completion: {e}"
        );
        let c = b.wait_one(support::deadline()).unwrap();
        assert_eq!((c.tag, c.opcode), (31, verbs::WcOpcode::BIND_MW));
        exposing
    } else {
        assert_eq!(exposing.kind(), Exposed::Registration);
        assert!(!ctx.windows_enforce_bounds().unwrap());
        exposing
    };
    let exposed = b.exposed(exposing).map_err(|(e, _)| e).unwrap();
    let mut src = memory.alloc(64).unwrap();
    src.write_at(0, b"granted").unwrap();
    let dst = RemoteSlice::new(&exposed.remote(), 0, 7).unwrap();
    let src = Local::range(src, 0, 7).unwrap();
    a.post_send(SendRequest::new(SendOp::Write(dst), src))
        .map_err(|e| e.error)
        .unwrap();
    a.wait_one(support::deadline()).unwrap().result().unwrap();
    let mut got = [0u8; 7];
    exposed.read_at(0, &mut got).unwrap();
    assert_eq!(&got, b"granted");
    drop(exposed.revoke().unwrap());
    let held = memory.stats().alloc_count;
    let unclaimed = b
        .expose(memory.alloc(64).unwrap(), Access::REMOTE_READ, 32)
        .map_err(|(e, _)| e)
        .unwrap();
    let binding = unclaimed.is_binding();
    drop(unclaimed);
    if !binding {
        assert_eq!(
            memory.stats().alloc_count,
            held,
            "a registration's buffer is back"
        );
    }
}

/// Hole 3: a queue pair swapped out of an rdma_cm connection was destroyed
/// behind librdmacm's back, and the connection's drop made
/// `rdma_disconnect` touch the freed QP (a segfault). Now the queue pair
/// carries its id and is destroyed the way librdmacm expects, wherever it
/// goes.
#[cfg(feature = "rdmacm")]
#[test]
fn a_connections_queue_pair_swapped_out_tears_down_cleanly() {
    use std::net::{IpAddr, SocketAddr};
    let ctx = support::test_context("a_connections_queue_pair_swapped_out");
    let addr = SocketAddr::new(IpAddr::V4(support::device_ipv4(&ctx)), 20991);
    let listener = verbs::cm::CmListener::bind(addr).unwrap();
    let server = std::thread::spawn(move || {
        let mut conn: verbs::cm::CmConnection<MemoryRegion> = listener
            .accept(&support::config(), &[], support::deadline())
            .unwrap();
        conn.wait_disconnected(support::deadline()).unwrap();
    });
    let mut conn: verbs::cm::CmConnection<MemoryRegion> =
        verbs::cm::connect(addr, &support::config(), &[], support::deadline()).unwrap();
    let fresh = QueuePair::<MemoryRegion>::new(conn.pd(), &QpConfig::default()).unwrap();
    let old = std::mem::replace(&mut *conn, fresh);
    drop(old); // the connection's own queue pair, destroyed first
    drop(conn); // rdma_disconnect on an id that no longer has a QP
    server.join().unwrap();
}

/// Hole 4 (the other half is a compile-time check: `write_prepared`,
/// `read_at` and `inline()` do not exist for device-only memory, see the
/// `compile_fail` examples on `HostBuf`): memory the caller owns is
/// registered safely, and foreign memory through one unsafe constructor,
/// NIC-addressable only.
#[test]
fn owned_and_foreign_memory_register_and_carry_verbs() {
    let ctx = support::test_context("owned_and_foreign_memory_register_and_carry_verbs");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let (mut a, _b): (QueuePair<MemoryRegion>, QueuePair<MemoryRegion>) =
        support::connected_pair(&pd);
    let target = support::remote_region(&pd, 4096);
    let dst = RemoteSlice::new(&target.remote().unwrap(), 0, 13).unwrap();
    // A Vec, unaligned and not page-sized: the region owns it, gives it back.
    let bytes = b"Hello, heap!\0".to_vec();
    let heap = MemoryRegion::from_vec(&pd, bytes, Access::EMPTY).unwrap();
    a.post_send(SendRequest::new(SendOp::Write(dst), heap))
        .map_err(|e| e.error)
        .unwrap();
    let mut c = a.wait_one(support::deadline()).unwrap();
    c.result().unwrap();
    let back = c.take_buf().unwrap().into_vec().unwrap().unwrap();
    assert_eq!(back, b"Hello, heap!\0");
    let mut landed = [0u8; 13];
    target.read_at(0, &mut landed).unwrap();
    assert_eq!(&landed, b"Hello, heap!\0");

    // Foreign memory (here a mapping the test owns, standing in for a
    // cudaMalloc pointer): registered with an owner that keeps it alive.
    struct Mapping(*mut libc::c_void, usize);
    // SAFETY: a private mapping used by this test only.
    unsafe impl Send for Mapping {}
    impl Drop for Mapping {
        fn drop(&mut self) {
            // SAFETY: mapped below, unmapped once, after the deregistration.
            unsafe { libc::munmap(self.0, self.1) };
        }
    }
    // SAFETY: an anonymous mapping of our own.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    // SAFETY: the mapping is writable and ours.
    unsafe { std::ptr::copy_nonoverlapping(b"foreign bytes".as_ptr(), p.cast(), 13) };
    let owner = Box::new(Mapping(p, 4096));
    // SAFETY: the range stays mapped while `owner` lives, and only the
    // device touches it while the region is posted.
    let foreign =
        unsafe { verbs::ForeignRegion::register(&pd, p as u64, 4096, Access::EMPTY, owner) }
            .unwrap();
    let (mut x, _y): (
        QueuePair<verbs::ForeignRegion>,
        QueuePair<verbs::ForeignRegion>,
    ) = support::connected_pair(&pd);
    let local = Local::range(foreign, 0, 13).map_err(|(e, _)| e).unwrap();
    x.post_send(SendRequest::new(SendOp::Write(dst), local))
        .map_err(|e| e.error)
        .unwrap();
    x.wait_one(support::deadline()).unwrap().result().unwrap();
    target.read_at(0, &mut landed).unwrap();
    assert_eq!(&landed, b"foreign bytes");
}

/// Hole 5: a chain whose second request had more scatter/gather entries
/// than the queue was granted was refused by the provider mid-chain, the
/// unsignaled run was restored as if nothing was posted, and after eight
/// rounds the send queue held eight unsignaled requests: no completion
/// ever came. Now the request is refused before anything is posted, and
/// the queue never wedges.
#[test]
fn partial_chains_never_wedge_the_send_queue() {
    let ctx = support::test_context("partial_chains_never_wedge_the_send_queue");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let config = QpConfig {
        max_send_wr: 8,
        max_sge: 1,
        max_inline_data: 0,
        ..support::config()
    };
    let (mut a, _b): (QueuePair<MemoryRegion>, QueuePair<MemoryRegion>) =
        support::connected_pair_with(&pd, &config, &verbs::ConnectOptions::default());
    let target = support::remote_region(&pd, 4096);
    let dst = RemoteSlice::new(&target.remote().unwrap(), 0, 8).unwrap();
    let small = || Local::range(MemoryRegion::new(&pd, 4096).unwrap(), 0, 4).unwrap();
    for _ in 0..8 {
        let ok = SendRequest::new(SendOp::Write(dst), small()).unsignaled();
        let two = SendRequest::new(SendOp::Write(dst), small())
            .sge(small())
            .unwrap()
            .unsignaled();
        let mut chain = [Some(ok), Some(two)];
        let e = a.post_send_chain(&mut chain).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        assert!(
            chain.iter().all(Option::is_some),
            "nothing was posted: both stay with the caller"
        );
    }
    assert_eq!(a.in_flight().unwrap(), (0, 0));
    // Unsignaled requests up to the depth still drain: the engine signals
    // one by itself before they could fill the queue.
    let mut back = 0;
    for i in 0..64u64 {
        loop {
            match a.post_send(
                SendRequest::new(SendOp::Write(dst), small())
                    .unsignaled()
                    .tag(i),
            ) {
                Ok(()) => break,
                Err(e) if e.error.kind() == ErrorKind::QueueFull => {
                    a.wait(support::deadline(), |_| back += 1)
                        .expect("the queue drains");
                }
                Err(e) => panic!("{}", e.error),
            }
        }
    }
    while a.in_flight().unwrap().0 > 0 {
        a.wait(support::deadline(), |_| back += 1)
            .expect("the queue drains");
    }
    assert_eq!(back, 64);
}

/// Hole 6: a failed `ibv_dereg_mr` (Soft-RoCE refuses while a memory
/// window is bound to the region) unmapped the memory anyway in release
/// builds. Now the registration and its memory are leaked: still mapped,
/// and counted.
#[test]
fn a_failed_deregistration_leaks_instead_of_freeing() {
    use verbs::sys;
    let ctx = support::test_context("a_failed_deregistration_leaks_instead_of_freeing");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let (_a, mut b): (QueuePair<MemoryRegion>, QueuePair<MemoryRegion>) =
        support::connected_pair(&pd);
    let region = MemoryRegion::with_access(&pd, 4096, Access::MW_BIND).unwrap();
    let addr = region.addr();
    // A type-2 window bound to the region by hand, so that the provider
    // refuses to deregister it (IBA 10.6.7.2.6).
    // SAFETY: the window stays allocated (never freed) for the process.
    let mw = unsafe { sys::verbs_shim_alloc_mw(pd.as_raw(), sys::ibv_mw_type::TYPE_2) };
    assert!(!mw.is_null());
    let mut wr = <sys::ibv_send_wr as sys::Zeroed>::zeroed();
    wr.opcode = sys::ibv_wr_opcode::BIND_MW;
    wr.send_flags = sys::ibv_send_flags::SIGNALED;
    // SAFETY: `mw` is live; its rkey is plain data.
    let old = unsafe { (*mw).rkey };
    wr.bind_mw_or_tso.bind_mw = sys::ibv_send_wr_bind_mw {
        mw,
        rkey: (old & !0xff) | (old.wrapping_add(1) & 0xff),
        bind_info: sys::ibv_mw_bind_info {
            mr: region.as_raw(),
            addr,
            length: 4096,
            mw_access_flags: Access::REMOTE_WRITE,
        },
    };
    let qp = b.id();
    // SAFETY: the bind names a live window and the live region; it reads
    // no memory; one request fits the empty send ring.
    let raw = unsafe { RawSend::new(std::slice::from_mut(&mut wr)) };
    b.engine_mut().post_send_raw(qp, raw).unwrap();
    b.wait_one(support::deadline()).unwrap().result().unwrap();
    let leaked = verbs::leaked_objects();
    drop(region);
    // Other tests run in this process at the same time: at least ours.
    assert!(
        verbs::leaked_objects() > leaked,
        "the failed deregistration is counted"
    );
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let mapped = maps.lines().any(|l| {
        let range = l.split(' ').next().unwrap();
        let (lo, hi) = range.split_once('-').unwrap();
        let (lo, hi) = (
            u64::from_str_radix(lo, 16).unwrap(),
            u64::from_str_radix(hi, 16).unwrap(),
        );
        (lo..hi).contains(&addr)
    });
    assert!(mapped, "the memory the window still reaches stays mapped");
    // The window holds the queue pair that bound it in the kernel: its
    // destroy would wait out rxe's reference timeout (about 50 s).
    std::mem::forget(b);
}

/// The engine's completion queue bounds what its queue pairs have in
/// flight together, not how many queue pairs it takes: three queue pairs
/// of 32 receives each fit an engine whose CQ holds 64 completions, and a
/// post the CQ has no room for is refused (`QueueFull`, the request given
/// back) even though its own queue is empty, until room comes back.
#[test]
fn posts_past_the_completion_queue_are_refused_not_queue_pairs() {
    let ctx = support::test_context("posts_past_the_completion_queue_are_refused");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let mut engine: Engine<MemoryRegion> = Engine::new(
        &pd,
        &EngineConfig {
            cq_depth: Some(64),
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let config = QpConfig {
        max_send_wr: 32,
        max_recv_wr: 32,
        ..support::config()
    };
    let qps: Vec<QpId> = (0..3).map(|_| engine.add_qp(&config).unwrap()).collect();
    assert_eq!(engine.room(Queue::Recv), 64);
    for &qp in &qps[..2] {
        for _ in 0..32 {
            let buf = MemoryRegion::new(&pd, 64).unwrap();
            engine
                .post_recv(qp, RecvRequest::new(buf))
                .map_err(|e| e.error)
                .unwrap();
        }
    }
    assert_eq!(engine.room(Queue::Recv), 0);
    let refused = engine
        .post_recv(
            qps[2],
            RecvRequest::new(MemoryRegion::new(&pd, 64).unwrap()),
        )
        .unwrap_err();
    assert_eq!(
        refused.error.kind(),
        ErrorKind::QueueFull,
        "{}",
        refused.error
    );
    assert_eq!(refused.request.into_bufs().count(), 1, "the buffer back");
    assert_eq!(engine.in_flight(qps[2]).unwrap(), (0, 0));
    // Removing a queue pair gives its requests' room back.
    engine.remove_qp(qps[0]).unwrap();
    assert_eq!(engine.room(Queue::Recv), 32);
    engine
        .post_recv(
            qps[2],
            RecvRequest::new(MemoryRegion::new(&pd, 64).unwrap()),
        )
        .map_err(|e| e.error)
        .unwrap();
    // A handle of another engine, or of a removed queue pair, reaches nothing.
    let mut other: Engine<MemoryRegion> = Engine::new(&pd, &EngineConfig::default()).unwrap();
    let theirs = other.add_qp(&config).unwrap();
    assert_eq!(
        engine.qp_num(theirs).unwrap_err().kind(),
        ErrorKind::NotFound
    );
    other.remove_qp(theirs).unwrap();
    assert_eq!(
        other.qp_num(theirs).unwrap_err().kind(),
        ErrorKind::NotFound
    );
}
