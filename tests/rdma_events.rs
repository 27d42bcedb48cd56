//! Completion events: a waiting thread sleeps (no CPU), wakes on an
//! arriving completion, and no completion is lost across many wake-ups.

mod support;

use std::os::fd::AsRawFd;
use std::time::Duration;

use verbs::{
    Deadline, EngineConfig, HostBuf, MemoryRegion, ProtectionDomain, QpConfig, QueuePair,
    RecvRequest, SendOp,
};

type Qp = QueuePair<MemoryRegion>;

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer; CLOCK_THREAD_CPUTIME_ID exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn event_pair(name: &str) -> (ProtectionDomain, Qp, Qp) {
    let ctx = support::test_context(name);
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let config = QpConfig {
        max_recv_wr: 256,
        ..support::config()
    };
    let events = EngineConfig {
        events: true,
        ..EngineConfig::default()
    };
    let (a, b) = support::connected_pair_in(&pd, &config, &events);
    assert!(
        b.engine().event_fd().is_some(),
        "an event fd for poll/epoll"
    );
    (pd, a, b)
}

#[test]
fn a_waiting_thread_sleeps_and_wakes_on_a_completion() {
    let (pd, mut a, mut b) = event_pair("a_waiting_thread_sleeps_and_wakes");
    b.post_recv(RecvRequest::new(MemoryRegion::new(&pd, 4096).unwrap()))
        .map_err(|e| e.error)
        .unwrap();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        // Taken before the main thread starts its sleep: the wait below
        // cannot end before that sleep does.
        let cpu0 = thread_cpu();
        let t0 = std::time::Instant::now();
        ready_tx.send(()).unwrap();
        let mut got = None;
        b.wait(Deadline::after(Duration::from_secs(30)), |c| {
            got = Some(c.into_owned())
        })
        .unwrap();
        (
            thread_cpu() - cpu0,
            t0.elapsed(),
            got.unwrap().result().is_ok(),
        )
    });
    ready_rx.recv().unwrap();
    // Let the waiter sit idle for a while before anything arrives.
    std::thread::sleep(Duration::from_millis(1500));
    a.post_inline(SendOp::Send, b"wake up", 1, true).unwrap();
    a.wait_one(support::deadline()).unwrap().result().unwrap();
    let (cpu, wall, ok) = waiter.join().unwrap();
    assert!(ok, "the completion that woke it succeeded");
    assert!(
        wall >= Duration::from_millis(1500),
        "it really waited: {wall:?}"
    );
    assert!(
        cpu < wall / 10,
        "it slept instead of spinning: {cpu:?} CPU over {wall:?}"
    );
    println!("idle wait: {wall:?} wall, {cpu:?} CPU");
}

/// Ten thousand receives in bursts of 64, each burst sent once the
/// receiver has taken the one before: every wait that arms and sleeps
/// between them must still hand back every message, exactly once.
#[test]
fn no_completion_is_lost_across_ten_thousand_receives_in_bursts() {
    let (pd, mut a, mut b) = event_pair("no_completion_is_lost");
    const N: u64 = 10_000;
    const BURST: u64 = 64;
    let recv_buf = || RecvRequest::new(MemoryRegion::new(&pd, 4096).unwrap());
    for _ in 0..128 {
        b.post_recv(recv_buf()).map_err(|e| e.error).unwrap();
    }
    // Receives posted again, so far: the sender keeps within what is
    // posted (iWARP has no RNR to hold a Send that finds none).
    let reposted = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let reposts = reposted.clone();
    let receiver = std::thread::spawn(move || {
        let (mut received, mut wakeups) = (0u64, 0u64);
        let mut seen = vec![false; N as usize];
        while received < N {
            let mut inbox = Vec::new();
            b.wait(Deadline::after(Duration::from_secs(60)), |c| {
                inbox.push(c.into_owned())
            })
            .unwrap();
            wakeups += 1;
            for mut c in inbox {
                c.result().unwrap();
                // Each send carries its number (not as immediate data,
                // which iWARP has not).
                let buf = c.take_buf().unwrap();
                let mut number = [0u8; 8];
                buf.read_at(0, &mut number).unwrap();
                let number = u64::from_le_bytes(number) as usize;
                assert!(!seen[number], "message {number} delivered twice");
                seen[number] = true;
                received += 1;
                // Recycle the buffer as a new receive.
                b.post_recv(RecvRequest::new(buf))
                    .map_err(|e| e.error)
                    .unwrap();
                reposts.fetch_add(1, std::sync::atomic::Ordering::Release);
            }
        }
        (received, wakeups, seen.iter().all(|&s| s))
    });
    let mut sent = 0u64;
    while sent < N {
        // Stay within the receiver's posted receives (rnr_retry 7 would
        // cover it on InfiniBand and RoCE, but the test is about events).
        if sent >= 128 + reposted.load(std::sync::atomic::Ordering::Acquire) {
            std::thread::sleep(Duration::from_micros(100));
            continue;
        }
        let signaled = sent % 32 == 31 || sent == N - 1; // the last one returns the unsignaled tail
        match a.post_inline(SendOp::Send, &sent.to_le_bytes(), sent, signaled) {
            Ok(()) => sent += 1,
            Err(e) if e.kind() == verbs::ErrorKind::QueueFull => {
                a.wait(support::deadline(), |c| c.result().unwrap())
                    .unwrap();
            }
            Err(e) => panic!("{e}"),
        }
        // Bursts of 64, each sent once the receiver has taken every
        // message before it: each burst ends at least one of its waits,
        // whatever the scheduler does, and between bursts it has nothing
        // to poll and goes to sleep (or is about to).
        if sent % BURST == 0 {
            while reposted.load(std::sync::atomic::Ordering::Acquire) < sent {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }
    while a.in_flight().unwrap().0 > 0 {
        a.wait(support::deadline(), |c| c.result().unwrap())
            .unwrap();
    }
    let (received, wakeups, all) = receiver.join().unwrap();
    assert_eq!(received, N);
    assert!(all, "every message number arrived exactly once");
    println!("{received} completions over {wakeups} wake-ups");
    assert!(
        wakeups >= N / BURST,
        "every burst ended one of the receiver's waits ({wakeups})"
    );
}

#[test]
fn solicited_only_wakes_on_the_solicited_send() {
    let (pd, mut a, mut b) = event_pair("solicited_only_wakes_on_the_solicited_send");
    for _ in 0..2 {
        b.post_recv(RecvRequest::new(MemoryRegion::new(&pd, 4096).unwrap()))
            .map_err(|e| e.error)
            .unwrap();
    }
    // Arm for solicited events, then deliver an unsolicited send: no event.
    b.engine().arm(true).unwrap();
    a.post_inline(SendOp::Send, b"quiet", 1, true).unwrap();
    a.wait_one(support::deadline()).unwrap().result().unwrap();
    assert!(
        !b.engine()
            .sleep_until_event(Deadline::after(Duration::from_millis(500)))
            .unwrap(),
        "an unsolicited completion sends no event"
    );
    // A solicited send does wake it.
    let mut req = verbs::SendRequest::<MemoryRegion>::empty(SendOp::Send).solicited();
    req = req.tag(2);
    a.post_send(req).map_err(|e| e.error).unwrap();
    assert!(
        b.engine().sleep_until_event(support::deadline()).unwrap(),
        "the solicited completion sends an event"
    );
    let mut n = 0;
    b.wait(support::deadline(), |c| {
        c.result().unwrap();
        n += 1
    })
    .unwrap();
    assert!(n >= 1);
}

/// Whether `fd` is readable within `ms` (what an event loop's epoll sees).
fn readable(fd: i32, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, ms) == 1 }
}

#[test]
fn take_events_consumes_what_the_channel_holds_without_sleeping() {
    let (pd, mut a, mut b) = event_pair("take_events_without_sleeping");
    let fd = a.engine().event_fd().unwrap();
    // Nothing armed, nothing pending: no event, and no wait for one.
    assert!(!a.engine().take_events().unwrap());
    a.engine().arm(false).unwrap();
    assert!(!readable(fd, 0), "armed, nothing completed yet");
    b.post_recv(RecvRequest::new(MemoryRegion::new(&pd, 64).unwrap()))
        .map_err(|e| e.error)
        .unwrap();
    a.post_inline(SendOp::Send, b"x", 7, true).unwrap();
    // The completion makes the descriptor readable (an event loop's cue).
    assert!(readable(fd, 20_000), "the armed completion raised an event");
    let own = a.engine().dup_event_fd().unwrap().expect("a channel");
    assert_ne!(own.as_raw_fd(), fd, "a descriptor of its own");
    assert!(
        readable(own.as_raw_fd(), 0),
        "the same open file: readable too"
    );
    assert!(a.engine().take_events().unwrap(), "the event is this CQ's");
    assert!(!readable(own.as_raw_fd(), 0), "and quiet once taken");
    assert!(!readable(fd, 0), "taken: the descriptor is quiet again");
    assert!(!a.engine().take_events().unwrap(), "nothing left to take");
    a.wait_one(support::deadline()).unwrap().result().unwrap();
    // Many events, taken in one call each, acknowledged in batches: the
    // engine drops (ibv_destroy_cq waits for every event's ack) cleanly.
    for i in 0..100u64 {
        a.engine().arm(false).unwrap();
        b.post_recv(RecvRequest::new(MemoryRegion::new(&pd, 64).unwrap()))
            .map_err(|e| e.error)
            .unwrap();
        a.post_inline(SendOp::Send, b"x", i, true).unwrap();
        assert!(readable(fd, 20_000));
        assert!(a.engine().take_events().unwrap());
        a.wait_one(support::deadline()).unwrap().result().unwrap();
    }
    // A receive's buffer drained so b drops with nothing in flight.
    while b.in_flight().unwrap().1 > 0 {
        b.wait(support::deadline(), |c| c.result().unwrap())
            .unwrap();
    }
}

#[test]
fn take_events_is_refused_without_a_channel() {
    let ctx = support::test_context("take_events_refused_without_channel");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let qp = Qp::new(&pd, &support::config()).unwrap();
    let e = qp.engine().take_events().unwrap_err();
    assert_eq!(e.kind(), verbs::ErrorKind::InvalidArgument, "{e}");
    assert!(qp.engine().dup_event_fd().unwrap().is_none());
}
