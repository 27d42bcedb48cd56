//! The wait protocol against a simulated completion queue and channel,
//! on the host (and under Miri): completions land at random moments,
//! including between a poll and the arm that follows it, and waiters
//! are dropped at random. Checked after every step: a waiter that
//! returned Pending is woken by the next completion (no lost wake-up),
//! a waiter never spins (a bounded number of queue polls per call), and
//! every completion is handed out exactly once, to the waiter it was for
//! or, once that waiter is gone, through the ready queue.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use verbs::Error;

use crate::protocol::{poll_completions, poll_matching, Channel};

/// A CQ, its arming and its channel as the verbs specification has them:
/// only a completion that lands while armed raises an event (and disarms).
#[derive(Default)]
struct SimCq {
    cq: VecDeque<u64>,
    hw_armed: bool,
    /// Events raised and not yet taken.
    events: u32,
    /// What the reactor saw (readable), and whom it wakes.
    readable: bool,
    waker: Option<Waker>,
    /// Completions to land during the next `arm`, before it takes effect.
    land_before_arm: Vec<u64>,
    polls: usize,
    /// Polls that found nothing.
    empty_polls: usize,
    arms: usize,
}

impl SimCq {
    fn land(&mut self, id: u64) {
        self.cq.push_back(id);
        if std::mem::take(&mut self.hw_armed) {
            self.events += 1;
            self.readable = true;
            if let Some(w) = self.waker.take() {
                w.wake();
            }
        }
    }

    /// Takes at most `batch` entries, as a poll of 16 does.
    fn poll_cq(&mut self, batch: usize, out: &mut dyn FnMut(u64)) -> usize {
        self.polls += 1;
        let n = self.cq.len().min(batch);
        self.empty_polls += usize::from(n == 0);
        for id in self.cq.drain(..n) {
            out(id);
        }
        n
    }
}

impl Channel for SimCq {
    fn arm(&mut self) -> Result<(), Error> {
        self.arms += 1;
        for id in std::mem::take(&mut self.land_before_arm) {
            self.land(id);
        }
        self.hw_armed = true;
        Ok(())
    }

    fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Result<bool, Error>> {
        if !self.readable {
            self.waker = Some(cx.waker().clone());
            return Poll::Pending;
        }
        self.readable = false;
        let had = std::mem::take(&mut self.events) > 0;
        Poll::Ready(Ok(had))
    }
}

#[derive(Default)]
struct Count(AtomicUsize);

impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// A small deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn run(seed: u64, steps: usize) {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut sim = SimCq::default();
    let mut armed = false;
    let mut ready: VecDeque<u64> = VecDeque::with_capacity(64);
    let count = Arc::new(Count::default());
    let waker = Waker::from(count.clone());
    let mut cx = Context::from_waker(&waker);
    let (mut next_id, mut delivered) = (0u64, Vec::new());
    // The waiter in progress: the id it waits for, the wakes seen when it
    // last returned Pending.
    let mut waiting: Option<(u64, usize)> = None;
    for step in 0..steps {
        match rng.below(6) {
            0 | 1 => {
                sim.land(next_id);
                next_id += 1;
            }
            2 => {
                sim.land_before_arm.push(next_id);
                next_id += 1;
            }
            3 => waiting = None, // the waiter is dropped (or forgotten)
            _ => {
                let want = match waiting {
                    Some((want, wakes)) => {
                        // Pending earlier: polled again only once woken, as
                        // an executor does.
                        if count.0.load(Ordering::Relaxed) == wakes {
                            assert!(
                                sim.cq.is_empty(),
                                "seed {seed} step {step}: lost wake-up, {} queued",
                                sim.cq.len()
                            );
                            continue;
                        }
                        want
                    }
                    // A new waiter: for anything (the stream) or one id.
                    None if rng.below(2) == 0 => u64::MAX,
                    None => rng.below(next_id + 4),
                };
                let empty = sim.empty_polls;
                let r = poll_matching(
                    &mut sim,
                    &mut armed,
                    &mut ready,
                    &mut cx,
                    |&id| want == u64::MAX || id == want,
                    |sim, sink| Ok(sim.poll_cq(16, sink)),
                );
                // Around an arm, and around the arm after a stale event: no
                // more empty polls than that, however the call goes.
                assert!(
                    sim.empty_polls - empty <= 4,
                    "seed {seed} step {step}: the waiter spun ({} empty polls)",
                    sim.empty_polls - empty
                );
                match r {
                    Poll::Ready(Ok(id)) => {
                        delivered.push(id);
                        waiting = None;
                    }
                    Poll::Ready(Err(e)) => panic!("{e}"),
                    Poll::Pending => {
                        assert!(sim.cq.is_empty(), "Pending with the CQ not empty");
                        waiting = Some((want, count.0.load(Ordering::Relaxed)));
                    }
                }
            }
        }
        assert!(
            !armed || sim.hw_armed || sim.events > 0,
            "seed {seed} step {step}: the protocol believes the CQ armed, it is not"
        );
    }
    // Drain: every completion comes out exactly once.
    for id in std::mem::take(&mut sim.land_before_arm) {
        sim.land(id);
    }
    loop {
        match poll_completions(&mut sim, &mut armed, &mut cx, |sim| {
            Ok(sim.poll_cq(16, &mut |id| ready.push_back(id)))
        }) {
            Poll::Ready(Ok(_)) => {}
            Poll::Ready(Err(e)) => panic!("{e}"),
            Poll::Pending => break,
        }
    }
    delivered.extend(ready.drain(..));
    delivered.sort_unstable();
    let expected: Vec<u64> = (0..next_id).collect();
    assert_eq!(delivered, expected, "seed {seed}: lost or duplicated");
}

#[test]
fn no_completion_is_lost_and_no_waiter_sleeps_through_one() {
    let seeds = if cfg!(miri) { 3 } else { 400 };
    let steps = if cfg!(miri) { 300 } else { 2_000 };
    for seed in 0..seeds {
        run(seed, steps);
    }
}

#[test]
fn a_completion_that_lands_just_before_the_arm_is_found_by_the_poll_after_it() {
    let mut sim = SimCq::default();
    sim.land_before_arm.push(7);
    let count = Arc::new(Count::default());
    let waker = Waker::from(count);
    let mut cx = Context::from_waker(&waker);
    let mut armed = false;
    let mut got = Vec::new();
    let r = poll_completions(&mut sim, &mut armed, &mut cx, |sim| {
        Ok(sim.poll_cq(16, &mut |id| got.push(id)))
    });
    assert!(
        matches!(r, Poll::Ready(Ok(1))),
        "no event came, the second poll found it"
    );
    assert_eq!(got, [7]);
    assert!(armed, "armed once, not again before its event");
}

#[test]
fn an_idle_waiter_arms_once_and_sleeps() {
    let mut sim = SimCq::default();
    let waker = Waker::from(Arc::new(Count::default()));
    let mut cx = Context::from_waker(&waker);
    let mut armed = false;
    for _ in 0..5 {
        let r = poll_completions(&mut sim, &mut armed, &mut cx, |sim| {
            Ok(sim.poll_cq(16, &mut |_| {}))
        });
        assert!(r.is_pending());
    }
    assert_eq!(sim.arms, 1, "armed once for five idle polls");
    assert_eq!(
        sim.polls,
        2 + 4,
        "two polls around the arm, then one per call"
    );
}
