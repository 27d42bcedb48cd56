//! The benchmark's data path allocates nothing.
//!
//! This test includes `examples/perf/loops.rs` (the very loops `perf`
//! measures), `side.rs` (the resources they run on), `opts.rs` and
//! `params.rs` (the parameters perf derives from its command line) and runs every test
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
#[path = "support/heap_count.rs"]
mod heap_count;
#[allow(dead_code)]
#[path = "../examples/perf/loops.rs"]
mod loops;
#[allow(dead_code)]
#[path = "../examples/perf/opts.rs"]
mod opts;
#[allow(dead_code)]
#[path = "../examples/perf/params.rs"]
mod params;
#[allow(dead_code)]
#[path = "../examples/perf/side.rs"]
mod side;

#[path = "../examples/perf/stream.rs"]
mod stream;

use std::sync::atomic::Ordering;
use std::time::Duration;

use heap_count::{counted, HEAP_OPS};

use opts::Opts;
use params::Params;
use side::Side;
use verbs::ProtectionDomain;

#[global_allocator]
static GLOBAL: heap_count::Counting = heap_count::Counting;

/// One path through the loops each: perf's command lines, so the loops
/// run with the parameters perf derives from them. Sizes take both the
/// inline and the buffered path where the test has both; counts give
/// thousands of post/poll cycles per case.
const CASES: [&str; 14] = [
    "write_lat -s 64 -I 220 -n 2000",
    "write_lat -s 4096 -I 220 -n 2000",
    "send_lat -s 64 -I 236 -n 2000",
    "send_lat -s 1024 -I 0 -n 2000",
    "read_lat -s 64 -n 2000",
    "atomic_lat -n 2000",
    "write_bw -s 64 -I 0 -n 5000",
    "write_bw -s 64 -I 64 -n 5000",
    "write_bw -s 2 -I 0 -l 16 -n 8000",
    "write_bw -s 2 -I 0 -l 16 --plain -n 8000",
    "write_bw -s 2 -I 0 --plain -n 8000",
    "write_bw -s 2 -I 64 -l 16 -n 8000",
    "read_bw -s 4096 -q 2 -n 2000",
    "send_bw -s 1024 -q 2 -n 3000",
];

/// Prepares both sides and runs one round, counting only the loops.
/// Returns the heap operations they made.
fn round(a: &mut Side, b: &mut Side, o: &Opts, iters: u64, clock: &clock::Clock) -> u64 {
    let size = o.sizes()[0];
    let pa = Params {
        iters,
        ..o.params(a, size, true, clock).unwrap()
    };
    let pb = Params {
        iters,
        ..o.params(b, size, false, clock).unwrap()
    };
    let c = &o.fingerprint();
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
    assert_eq!(posted.len() as u64, iters * o.qps as u64, "{c:?}");
    assert!(
        posted.iter().all(|&t| t != 0),
        "{c:?}: a request was never posted"
    );
    assert!(
        posted.windows(2).all(|w| w[0] <= w[1]),
        "{c:?}: timestamps out of order"
    );
    if !o.test.is_latency() {
        let last = a.stamps.completed.last().map(|&(i, _)| i + 1);
        assert_eq!(
            last,
            Some(iters * o.qps as u64),
            "{c:?}: the last completion"
        );
    }
    ops
}

#[test]
fn rdma_benchmark_loops_allocate_nothing() {
    let ctx = support::test_context("rdma_benchmark_loops_allocate_nothing");
    let pd = ProtectionDomain::new(&ctx).expect("alloc PD");
    let clock = clock::Clock::calibrate(Duration::from_millis(20));
    let mut failures = Vec::new();
    for line in CASES {
        let args: Vec<String> = line.split(' ').map(String::from).collect();
        let o = Opts::parse(&args).expect(line);
        let setup = o.setup().expect(line);
        let (mut a, mut b) = Side::loopback_pair(&pd, &setup).expect("two connected sides");
        // Warm-up: first-touch costs (lazy library state, page faults).
        round(&mut a, &mut b, &o, 200, &clock);
        let ops = round(&mut a, &mut b, &o, o.iters(), &clock);
        println!("{line}: {ops} heap operations in {} iterations", o.iters());
        if ops != 0 {
            failures.push(format!("{line}: {ops} heap operations"));
        }
    }
    assert!(
        failures.is_empty(),
        "the data path allocated: {failures:#?}"
    );
}
