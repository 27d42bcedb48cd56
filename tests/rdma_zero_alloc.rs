//! The benchmark's data path allocates nothing.
//!
//! This test includes `examples/perf/loops.rs` (the very loops `perf`
//! measures) and `side.rs` (the resources they run on) and runs every test
//! of them, on both sides of a loopback pair, under a counting global
//! allocator: after a warm-up run, a second run of
//! thousands of post/poll cycles must make zero heap allocations, frees or
//! reallocations. Each case covers one path: inline and buffered writes and
//! sends, receives posted again, reads, atomics, selective signaling,
//! chains of requests (`post_send_chain`) and several queue pairs.
//!
//! Only threads inside [`counted`] are counted, so the test harness and
//! thread start-up (which allocate) do not disturb the figure.

mod support;

// The example's own modules, as source; the test uses part of them.
#[allow(dead_code)]
#[path = "../examples/perf/clock.rs"]
mod clock;
#[allow(dead_code)]
#[path = "../examples/perf/loops.rs"]
mod loops;
#[allow(dead_code)]
#[path = "../examples/perf/side.rs"]
mod side;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use loops::{Params, Test};
use side::{Setup, Side};
use verbs::{Mtu, ProtectionDomain};

/// Counts the heap operations of threads that opted in, then forwards to
/// the system allocator.
struct Counting;

static HEAP_OPS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Set while this thread runs measured code.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

fn note() {
    // try_with: the allocator also runs while thread-locals are torn down.
    if COUNTING.try_with(Cell::get).unwrap_or(false) {
        HEAP_OPS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every call is forwarded unchanged to `System`, which upholds the
// GlobalAlloc contract; counting touches only an atomic and a const-
// initialized thread-local (neither allocates).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note();
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Runs `f` with this thread's heap operations counted.
fn counted<T>(f: impl FnOnce() -> T) -> T {
    COUNTING.with(|c| c.set(true));
    let r = f();
    COUNTING.with(|c| c.set(false));
    r
}

/// One path through the loops.
#[derive(Clone, Copy, Debug)]
struct Case {
    test: Test,
    size: usize,
    inline: u32,
    post_list: u32,
    qps: usize,
    iters: u64,
}

const fn case(
    test: Test,
    size: usize,
    inline: u32,
    post_list: u32,
    qps: usize,
    iters: u64,
) -> Case {
    Case {
        test,
        size,
        inline,
        post_list,
        qps,
        iters,
    }
}

/// Sizes chosen to take both the inline and the buffered path where the
/// test has both; counts give thousands of post/poll cycles per case.
const CASES: [Case; 11] = [
    case(Test::WriteLat, 64, 220, 1, 1, 2000),
    case(Test::WriteLat, 4096, 220, 1, 1, 2000),
    case(Test::SendLat, 64, 236, 1, 1, 2000),
    case(Test::SendLat, 1024, 0, 1, 1, 2000),
    case(Test::ReadLat, 64, 0, 1, 1, 2000),
    case(Test::AtomicLat, 8, 0, 1, 1, 2000),
    case(Test::WriteBw, 64, 0, 1, 1, 5000),
    case(Test::WriteBw, 64, 64, 1, 1, 5000),
    case(Test::WriteBw, 2, 0, 16, 1, 8000),
    case(Test::ReadBw, 4096, 0, 1, 2, 2000),
    case(Test::SendBw, 1024, 0, 1, 2, 3000),
];

fn params(c: &Case, side: &Side, initiator: bool, iters: u64, clock: &clock::Clock) -> Params {
    let bw = !c.test.is_latency();
    let granted = side.lanes[0].qp.caps().max_inline_data as usize;
    Params {
        test: c.test,
        size: c.size,
        iters,
        tx_depth: if bw { 128 } else { 1 },
        cq_mod: if !bw {
            1
        } else if c.post_list > 1 {
            c.post_list
        } else {
            100
        },
        post_list: c.post_list,
        inline: (c.inline as usize).min(granted),
        rx_depth: 512,
        initiator,
        busy_poll: false,
        stall: clock.ticks_in(Duration::from_secs(30)),
    }
}

/// Prepares both sides and runs one round, counting only the loops.
/// Returns the heap operations they made.
fn round(a: &mut Side, b: &mut Side, c: &Case, iters: u64, clock: &clock::Clock) -> u64 {
    let pa = params(c, a, true, iters, clock);
    let pb = params(c, b, false, iters, clock);
    a.prepare(&pa).expect("prepare the initiator");
    b.prepare(&pb).expect("prepare the peer");
    let before = HEAP_OPS.load(Ordering::Relaxed);
    std::thread::scope(|s| {
        let peer = s.spawn(|| counted(|| loops::run(b, &pb)));
        let mine = counted(|| loops::run(a, &pa));
        let theirs = peer.join().expect("peer thread");
        mine.unwrap_or_else(|e| panic!("{c:?}: initiator: {e}"));
        theirs.unwrap_or_else(|e| panic!("{c:?}: peer: {e}"));
    });
    let ops = HEAP_OPS.load(Ordering::Relaxed) - before;
    // The run really happened: every request was timestamped in order and,
    // for bandwidth, the last one came back signaled.
    let posted = &a.stamps.posted;
    assert_eq!(posted.len() as u64, iters * c.qps as u64, "{c:?}");
    assert!(
        posted.iter().all(|&t| t != 0),
        "{c:?}: a request was never posted"
    );
    assert!(
        posted.windows(2).all(|w| w[0] <= w[1]),
        "{c:?}: timestamps out of order"
    );
    if !c.test.is_latency() {
        let last = a.stamps.completed.last().map(|&(i, _)| i + 1);
        assert_eq!(
            last,
            Some(iters * c.qps as u64),
            "{c:?}: the last completion"
        );
    }
    ops
}

#[test]
fn rdma_benchmark_loops_allocate_nothing() {
    let Some(ctx) = support::test_context("rdma_benchmark_loops_allocate_nothing") else {
        return;
    };
    let pd = ProtectionDomain::new(&ctx).expect("alloc PD");
    let clock = clock::Clock::calibrate(Duration::from_millis(20));
    let mut failures = Vec::new();
    for c in CASES {
        let setup = Setup {
            test: c.test,
            qps: c.qps,
            max_size: c.size,
            tx_depth: if c.test.is_latency() { 1 } else { 128 },
            post_list: c.post_list,
            rx_depth: 512,
            inline: c.inline,
            port: 1,
            gid_index: None,
            mtu: Mtu::MTU_4096,
            buf_mem: 64 << 20,
        };
        let mut a = Side::new(&pd, &setup).expect("side a");
        let mut b = Side::new(&pd, &setup).expect("side b");
        let (ea, eb) = (a.endpoints(), b.endpoints());
        a.connect(&eb).expect("connect a");
        b.connect(&ea).expect("connect b");
        // Warm-up: first-touch costs (lazy library state, page faults).
        round(&mut a, &mut b, &c, 200, &clock);
        let ops = round(&mut a, &mut b, &c, c.iters, &clock);
        println!("{c:?}: {ops} heap operations in {} iterations", c.iters);
        if ops != 0 {
            failures.push(format!("{c:?}: {ops} heap operations"));
        }
    }
    assert!(
        failures.is_empty(),
        "the data path allocated: {failures:#?}"
    );
}
