//! Arena buffers on a real device: every verb, exact landing, windows that
//! grant one buffer and nothing else, revocation, reuse after completion.

mod support;

use verbs::sys::ibv_wc_status as S;
use verbs::{
    Access, Arena, ArenaBuf, ArenaConfig, Exposed, ExposedBuf, HostBuf, Local, NicBuf,
    ProtectionDomain, QueuePair, RecvRequest, RemoteSlice, SendOp, SendRequest, WcOpcode,
};

type Qp = QueuePair<ArenaBuf>;

fn setup(name: &str) -> (ProtectionDomain, Arena, Qp, Qp) {
    let ctx = support::test_context(name);
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let arena = Arena::new(
        &pd,
        &ArenaConfig {
            capacity: 8 << 20,
            windows: true,
            ..Default::default()
        },
    )
    .unwrap();
    let (a, b) = support::connected_pair(&pd);
    (pd, arena, a, b)
}

fn run(qp: &mut Qp, req: SendRequest<ArenaBuf>) -> verbs::Completion<ArenaBuf> {
    qp.post_send(req).map_err(|e| e.error).unwrap();
    let c = qp.wait_one(support::deadline()).unwrap();
    c.result().unwrap();
    c
}

/// Exposes `buf` (least privilege) through `qp`, waiting for a window's bind.
fn expose(qp: &mut Qp, buf: ArenaBuf, access: Access) -> verbs::ExposedBuf {
    let exposing = qp.expose(buf, access, 900).map_err(|(e, _)| e).unwrap();
    if exposing.is_binding() {
        assert_eq!(exposing.kind(), Exposed::Window);
        wait_bind(qp);
    } else {
        assert!(
            !qp.pd().context().windows_enforce_bounds().unwrap(),
            "a registration only where windows are unbounded"
        );
    }
    qp.exposed(exposing).map_err(|(e, _)| e).unwrap()
}

fn wait_bind(qp: &mut Qp) {
    let c = qp.wait_one(support::deadline()).unwrap();
    c.result().unwrap();
    assert_eq!((c.tag, c.opcode), (900, WcOpcode::BIND_MW));
}

#[test]
fn an_exposed_buffer_grants_itself_until_revoked() {
    let (_pd, mut arena, mut a, mut b) = setup("an_exposed_buffer_grants_itself_until_revoked");
    let window = expose(&mut b, arena.alloc(4096).unwrap(), Access::REMOTE_WRITE);
    let dst = RemoteSlice::new(&window.remote(), 0, 64).unwrap();
    let mut src = arena.alloc(64).unwrap();
    src.write_at(0, &[7u8; 64]).unwrap();
    run(&mut a, SendRequest::new(SendOp::Write(dst), src));
    let mut got = [0u8; 64];
    window.read_at(0, &mut got).unwrap();
    assert_eq!(got, [7u8; 64], "the grant reaches its buffer");
    drop(window.revoke().unwrap());
    a.post_send(SendRequest::new(
        SendOp::Write(dst),
        arena.alloc(64).unwrap(),
    ))
    .map_err(|e| e.error)
    .unwrap();
    let c = a.wait_one(support::deadline()).unwrap();
    assert_eq!(c.status, S::REM_ACCESS_ERR, "a revoked grant stops working");
}

#[test]
fn arena_buffers_carry_every_verb() {
    let (_pd, mut arena, mut a, mut b) = setup("arena_buffers_carry_every_verb");
    // The target side exposes one buffer; the arena itself stays private.
    assert!(
        arena.whole_region().is_none(),
        "no whole-region descriptor without opt-in"
    );
    let target = expose(
        &mut b,
        arena.alloc(4096).unwrap(),
        Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
    );
    let remote = target.remote();

    // Write and read back.
    let mut src = arena.alloc(1000).unwrap();
    let data = support::pattern(1, 1000);
    src.write_at(0, &data).unwrap();
    let dst = RemoteSlice::new(&remote, 0, 1000).unwrap();
    let src = run(&mut a, SendRequest::new(SendOp::Write(dst), src))
        .take_buf()
        .unwrap();
    let mut landed = vec![0u8; 1000];
    target.read_at(0, &mut landed).unwrap();
    assert_eq!(landed, data);
    drop(src);
    let back = run(
        &mut a,
        SendRequest::new(SendOp::Read(dst), arena.alloc(1000).unwrap()),
    )
    .take_buf()
    .unwrap();
    let mut got = vec![0u8; 1000];
    back.read_at(0, &mut got).unwrap();
    assert_eq!(got, data);

    // Atomics on an 8-byte aligned word of the exposed buffer.
    let word = RemoteSlice::new(&remote, 1024, 8).unwrap();
    let old = arena.alloc_aligned(8, 8).unwrap();
    let old = run(
        &mut a,
        SendRequest::new(
            SendOp::FetchAdd {
                remote: word,
                add: 5,
            },
            old,
        ),
    )
    .take_buf()
    .unwrap();
    assert_eq!(old.as_slice().unwrap(), &0u64.to_ne_bytes());
    let old = run(
        &mut a,
        SendRequest::new(
            SendOp::CompareSwap {
                remote: word,
                compare: 5,
                swap: 9,
            },
            old,
        ),
    )
    .take_buf()
    .unwrap();
    assert_eq!(old.as_slice().unwrap(), &5u64.to_ne_bytes());
    let mut w = [0u8; 8];
    target.read_at(1024, &mut w).unwrap();
    assert_eq!(u64::from_ne_bytes(w), 9);

    // Send / receive between arena buffers.
    b.post_recv(RecvRequest::new(arena.alloc(256).unwrap()).tag(3))
        .map_err(|e| e.error)
        .unwrap();
    let mut msg = arena.alloc(256).unwrap();
    msg.write_at(0, b"through the arena").unwrap();
    run(
        &mut a,
        SendRequest::new(
            SendOp::Send,
            Local::range(msg, 0, 17).map_err(|(e, _)| e).unwrap(),
        ),
    );
    let mut c = b.wait_one(support::deadline()).unwrap();
    c.result().unwrap();
    assert_eq!((c.tag, c.byte_len), (3, 17));
    let inbox = c.take_buf().unwrap();
    assert_eq!(&inbox.as_slice().unwrap()[..17], b"through the arena");
}

#[test]
fn rdma_lands_exactly_in_the_buffer_range() {
    let (_pd, mut arena, mut a, mut b) = setup("rdma_lands_exactly_in_the_buffer_range");
    // Three neighbours; the middle one is the target. Canaries around it must survive.
    let mut before = arena.alloc(256).unwrap();
    let middle = arena.alloc(256).unwrap();
    let mut after = arena.alloc(256).unwrap();
    assert!(before.addr() + 256 <= middle.addr() && middle.addr() + 256 <= after.addr());
    before.write_at(0, &[0xAA; 256]).unwrap();
    after.write_at(0, &[0xBB; 256]).unwrap();
    let target = expose(&mut b, middle, Access::REMOTE_WRITE);
    let mut src = arena.alloc(256).unwrap();
    src.write_at(0, &[0x5C; 256]).unwrap();
    run(
        &mut a,
        SendRequest::new(SendOp::Write(RemoteSlice::whole(&target.remote())), src),
    );
    let mut got = [0u8; 256];
    target.read_at(0, &mut got).unwrap();
    assert_eq!(got, [0x5C; 256]);
    assert_eq!(
        before.as_slice().unwrap(),
        &[0xAA; 256][..],
        "the buffer before is untouched"
    );
    assert_eq!(
        after.as_slice().unwrap(),
        &[0xBB; 256][..],
        "the buffer after is untouched"
    );
}

#[test]
fn an_exposed_buffer_grants_itself_and_nothing_else() {
    let ctx = support::test_context("an_exposed_buffer_grants_itself_and_nothing_else");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let mut arena = Arena::new(
        &pd,
        &ArenaConfig {
            capacity: 1 << 20,
            windows: true,
            ..Default::default()
        },
    )
    .unwrap();
    let buf_b = arena.alloc(4096).unwrap();
    let b_addr = buf_b.addr();
    for (case, addr_of, len) in [("buffer B", 0u8, 64u64), ("past A's end", 1, 64)] {
        let (mut a, mut b): (Qp, Qp) = support::connected_pair(&pd);
        let window_a = expose(&mut b, arena.alloc(4096).unwrap(), Access::REMOTE_WRITE);
        let ra = window_a.remote();
        let addr = if addr_of == 0 {
            b_addr
        } else {
            ra.addr + ra.len - 32
        };
        let req = SendRequest::new(
            SendOp::Write(RemoteSlice::unchecked(addr, len, ra.rkey)),
            arena.alloc(64).unwrap(),
        );
        a.post_send(req).map_err(|e| e.error).unwrap();
        let c = a.wait_one(support::deadline()).unwrap();
        assert_eq!(
            c.status,
            S::REM_ACCESS_ERR,
            "{case}: A's descriptor must not reach it"
        );
    }
    drop(buf_b);
}

#[test]
fn a_revoked_window_stops_working_and_buffers_are_reused_safely() {
    let (pd, mut arena, mut a, mut b) = setup("a_revoked_window_stops_working");
    let exposed = expose(&mut b, arena.alloc(4096).unwrap(), Access::REMOTE_WRITE);
    let remote = exposed.remote();
    let dst = RemoteSlice::new(&remote, 0, 64).unwrap();
    run(
        &mut a,
        SendRequest::new(SendOp::Write(dst), arena.alloc(64).unwrap()),
    );
    let buf = exposed.revoke().unwrap();
    drop(buf);
    a.post_send(SendRequest::new(
        SendOp::Write(dst),
        arena.alloc(64).unwrap(),
    ))
    .map_err(|e| e.error)
    .unwrap();
    let c = a.wait_one(support::deadline()).unwrap();
    assert_eq!(
        c.status,
        S::REM_ACCESS_ERR,
        "the revoked descriptor no longer works"
    );

    // Reuse: thousands of allocations recycled through completions.
    let (mut x, y): (Qp, Qp) = support::connected_pair(&pd);
    let mut y = y;
    let target = expose(&mut y, arena.alloc(1 << 16).unwrap(), Access::REMOTE_WRITE);
    let before = arena.stats();
    for i in 0..2000u64 {
        let size = 8 + (i as usize * 37) % 4000;
        let mut buf = arena.alloc(size).unwrap();
        let data = support::pattern(i, size);
        buf.write_at(0, &data).unwrap();
        let dst = RemoteSlice::new(&target.remote(), 0, size as u64).unwrap();
        let back = run(&mut x, SendRequest::new(SendOp::Write(dst), buf))
            .take_buf()
            .unwrap();
        if i % 500 == 0 {
            let mut landed = vec![0u8; size];
            target.read_at(0, &mut landed).unwrap();
            assert_eq!(landed, data);
        }
        drop(back); // returned to the arena, reused by the next iteration
    }
    let after = arena.stats();
    assert_eq!(after.in_use, before.in_use, "every buffer came back");
    assert!(after.total_allocs >= before.total_allocs + 2000);
}

#[test]
fn per_buffer_registration_is_the_fallback_without_windows() {
    let (_pd, mut arena, mut a, _b) = setup("per_buffer_registration");
    let neighbour = arena.alloc(4096).unwrap();
    let buf = arena.alloc(4096).unwrap();
    let exposed = ExposedBuf::register(buf, Access::REMOTE_WRITE)
        .map_err(|(e, _)| e)
        .unwrap();
    assert_eq!(exposed.kind(), Exposed::Registration);
    let r = exposed.remote();
    run(
        &mut a,
        SendRequest::new(
            SendOp::Write(RemoteSlice::whole(&r)),
            arena.alloc(4096).unwrap(),
        ),
    );
    let outside = RemoteSlice::unchecked(neighbour.addr(), 64, r.rkey);
    a.post_send(SendRequest::new(
        SendOp::Write(outside),
        arena.alloc(64).unwrap(),
    ))
    .map_err(|e| e.error)
    .unwrap();
    assert_eq!(
        a.wait_one(support::deadline()).unwrap().status,
        S::REM_ACCESS_ERR
    );
}

#[test]
fn exhaustion_is_an_error_not_a_panic() {
    let ctx = support::test_context("arena_exhaustion");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let mut arena = Arena::new(
        &pd,
        &ArenaConfig {
            capacity: 64 * 1024,
            ..Default::default()
        },
    )
    .unwrap();
    let all = arena.alloc(64 * 1024).unwrap();
    let e = arena.alloc(1).unwrap_err();
    assert!(e.to_string().contains("exhausted"), "{e}");
    assert!(arena.alloc(0).is_err());
    drop(all);
    assert!(arena.alloc(64 * 1024).is_ok(), "a dropped buffer is reused");
}

/// `Arena::free` gives a buffer back at once; a buffer of another arena
/// goes back to its own; one dropped on another thread comes back too.
#[test]
fn buffers_come_back_by_free_by_drop_and_from_other_threads() {
    let ctx = support::test_context("arena_free");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let config = ArenaConfig {
        capacity: 64 * 1024,
        ..Default::default()
    };
    let mut a = Arena::new(&pd, &config).unwrap();
    let mut b = Arena::new(&pd, &config).unwrap();
    for _ in 0..3 {
        let all = a.alloc(64 * 1024).unwrap();
        a.free(all);
        let all_b = b.alloc(64 * 1024).unwrap();
        // Not `a`'s: `free` drops it, so it goes back to `b`.
        a.free(all_b);
        let whole = a.alloc(64 * 1024).expect("freed by the owner");
        let whole_b = b
            .alloc(64 * 1024)
            .expect("a foreign free went back to its arena");
        std::thread::spawn(move || drop(whole)).join().unwrap();
        drop(whole_b);
        assert!(a.alloc(64 * 1024).is_ok(), "dropped on another thread");
        assert!(b.alloc(64 * 1024).is_ok(), "dropped on this thread");
    }
    assert_eq!(a.stats().alloc_count, 0);
    assert_eq!(b.stats().alloc_count, 0);
}

#[test]
fn dmabuf_registration_is_a_clear_unsupported_error_where_the_provider_cannot() {
    let ctx = support::test_context("dmabuf_registration");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    // A memfd is a real file descriptor but not a dmabuf: a provider with
    // dmabuf support refuses it (EINVAL/EBADF), one without says Unsupported.
    // SAFETY: a valid NUL-terminated name; memfd_create has no other preconditions.
    let fd = unsafe { libc::memfd_create(c"verbs-test".as_ptr(), 0) };
    assert!(fd >= 0);
    // SAFETY: nothing is ever posted with this registration (it must fail).
    let r = unsafe { verbs::DmabufRegion::register(&pd, fd, 0, 4096, 0, Access::REMOTE_READ) };
    let e = r.expect_err("a memfd is not registrable as a dmabuf");
    println!("{e}");
    if ctx.query_device().unwrap().0.vendor_id == 0x00FF_FFFF {
        assert_eq!(
            e.kind(),
            verbs::ErrorKind::Unsupported,
            "Soft-RoCE has no dmabuf support: {e}"
        );
        assert!(e.to_string().contains("dmabuf"));
    }
    // SAFETY: our own descriptor, closed once.
    unsafe { libc::close(fd) };
}

/// The front cache: a freed buffer is the next one of its size; memory the
/// cache holds is taken back before an allocation fails; a forgotten
/// buffer leaks but its range is never handed out again.
#[test]
fn the_front_cache_reuses_freed_buffers_and_never_a_live_one() {
    let ctx = support::test_context("arena_front_cache");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let config = ArenaConfig {
        capacity: 64 * 1024,
        ..Default::default()
    };
    let mut arena = Arena::new(&pd, &config).unwrap();
    let a = arena.alloc(256).unwrap();
    let at = a.offset();
    arena.free(a);
    let b = arena.alloc(256).unwrap();
    assert_eq!(b.offset(), at, "LIFO per size");
    arena.free(b);
    // Stats merge the cache back: nothing is left out to fragment the
    // region below (a block held in the cache shapes where later ones go,
    // as a live one would).
    assert_eq!((arena.stats().cached, arena.stats().free_blocks), (0, 1));

    // Every granule allocated, all freed: the cache keeps some aside
    // unmerged, yet the whole region is one allocation again.
    let all: Vec<_> = (0..64).map(|_| arena.alloc(1024).unwrap()).collect();
    for b in all {
        arena.free(b);
    }
    let whole = arena.alloc(64 * 1024).expect("the cache was merged back");
    drop(whole);

    // A forgotten buffer: never reissued, whatever comes and goes.
    let forgotten = arena.alloc(512).unwrap();
    let lost = forgotten.offset()..forgotten.offset() + 512;
    std::mem::forget(forgotten);
    let mut live: Vec<ArenaBuf> = Vec::new();
    let mut seed = 0x1234_5678u64;
    for i in 0..5000u64 {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let size = 1 + (seed >> 33) as usize % 2048;
        if live.len() >= 16 {
            let b = live.swap_remove((seed >> 20) as usize % live.len());
            if i % 2 == 0 {
                drop(b);
            } else {
                arena.free(b);
            }
        }
        let b = arena.alloc(size).unwrap();
        let range = b.offset()..b.offset() + size;
        assert!(
            range.end <= lost.start || range.start >= lost.end,
            "{range:?} overlaps the forgotten {lost:?}"
        );
        for other in &live {
            let o = other.offset()..other.offset() + other.len();
            assert!(range.end <= o.start || range.start >= o.end, "overlap");
        }
        live.push(b);
    }
    drop(live);
    let s = arena.stats();
    assert_eq!(s.alloc_count, 1, "only the forgotten buffer is out");
    assert_eq!(s.cached, 0, "stats merge the cache back");
}
