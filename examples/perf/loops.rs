//! The measured loops of `perf`.
//!
//! Everything between the first timestamp and the last runs here (and in
//! module `stream`, the bandwidth tests'), through the crate's safe data
//! path: a `Lane` for the ping-pongs' prepared send and receive and for
//! the bandwidth sender's one source on one queue pair, `post_prepared`
//! for the other latency tests' one request, that source on several
//! queue pairs and the receives (built once in
//! `Side::prepare` and posted again, as perftest posts its prebuilt
//! requests; a latency test's one receive is posted `rx_depth` times),
//! `post_send_chain` (`post_send` for a single request) for chains, whose
//! requests own their buffers, and the engine's `poll_queue` with the
//! lending `CompletionRef` (the send tests give receives a CQ of their
//! own, as perftest's do).
//! `tests/rdma_zero_alloc.rs`
//! includes this very file and runs these functions under a counting
//! allocator, so the rule is: nothing in [`run`] allocates. Every buffer,
//! pool and timestamp table is sized in [`Side::prepare`] (module `side`);
//! pools are `Vec`s pushed and popped within the capacity reserved there;
//! errors are `verbs::Error` (`Copy`, no heap).
//!
//! Methodology, per test (the same as perftest's, implemented here):
//! - `write_lat`, `send_lat`: symmetric ping-pong. Each side waits for the
//!   peer's message number k (write: the last byte of its inbox becomes k;
//!   send: a receive completes), takes a timestamp, sends its own number k
//!   (signaled) and waits for that send to complete; the initiator skips
//!   the first wait. Consecutive timestamps are one round trip apart.
//! - `read_lat`, `atomic_lat`: timestamp, post one signaled request, poll
//!   until it completes; consecutive timestamps are one request apart.
//! - `*_bw`: keep `tx_depth` requests in flight per QP, posted in calls of
//!   `post_list` requests, every `cq_mod`-th (and the last) signaled; one
//!   timestamp per post call and one per signaled completion.

use verbs::error::Site;
use verbs::{
    site, ArenaBuf, CompletionRef, Error, ErrorKind, HostBuf, MemoryRegion, Queue, QueuePair,
    SendOp, WcStatus,
};

use super::clock::ticks;
use super::params::{Params, Test};
use super::side::{Lane, Side};
use super::stream;

/// Most requests in one `post_send_chain` call.
pub use verbs::MAX_CHAIN;

/// Idle polls between two looks at the clock while waiting: a stalled peer
/// is noticed within microseconds of the limit, and the fast path never
/// reads the clock.
const STALL_CHECK_EVERY: u32 = 1 << 14;

/// Runs this side's part of test `p.test` (after [`Side::prepare`] on both sides).
pub fn run(side: &mut Side, p: &Params) -> Result<(), Error> {
    match (p.test, p.initiator) {
        (Test::WriteLat | Test::SendLat, _) => ping_pong(side, p),
        (Test::ReadLat | Test::AtomicLat, true) => round_trips(side, p),
        (Test::WriteBw | Test::ReadBw | Test::SendBw, true) => stream::stream(side, p),
        (Test::SendBw, false) => stream::drain_receives(side, p),
        // The target of one-sided requests: its CPU takes no part.
        _ => Ok(()),
    }
}

/// perftest's `--perform_warm_up`: before a size is measured, the
/// initiator posts and completes one window per QP (`tx_depth` requests,
/// or one post list with `-l`), so the first measured requests find the
/// caches, the page tables and the peer warm; then prepares afresh (the
/// timestamps start again). Nothing else warms up, as in perftest.
pub fn warm_up(side: &mut Side, p: &Params) -> Result<(), Error> {
    if !(p.warm_up && p.initiator) {
        return Ok(());
    }
    let window = if p.post_list > 1 {
        p.post_list
    } else {
        p.tx_depth
    };
    let w = Params {
        iters: u64::from(window.max(1)),
        ..*p
    };
    side.prepare(&w)?;
    run(side, &w)?;
    side.prepare(p)
}

/// Waiting without sleeping, with a limit on how long nothing happens.
pub(crate) struct Spin {
    idle: u32,
    since: u64,
}

impl Spin {
    #[inline(always)]
    pub(crate) fn new() -> Spin {
        Spin { idle: 0, since: 0 }
    }

    /// One empty poll.
    #[inline(always)]
    pub(crate) fn idle(&mut self, p: &Params, what: &'static Site) -> Result<(), Error> {
        if p.spin_hint {
            core::hint::spin_loop();
        }
        self.idle = self.idle.wrapping_add(1);
        if self.idle % STALL_CHECK_EVERY == 0 {
            self.check(p, what)?;
        }
        Ok(())
    }

    #[cold]
    fn check(&mut self, p: &Params, what: &'static Site) -> Result<(), Error> {
        let now = ticks();
        if self.since == 0 {
            self.since = now;
        } else if now.wrapping_sub(self.since) > p.stall {
            return Err(Error::new(what, ErrorKind::TimedOut));
        }
        Ok(())
    }
}

/// What to check when a wait makes no progress.
macro_rules! stalled {
    ($what:expr) => {
        site!(
            $what,
            "",
            "is the peer alive, and running the same test with the same options?"
        )
    };
}

pub(crate) use stalled;

/// Polls the completion queue of `lane`'s receive queue if `RECV`, else
/// of its send queue, once (the send tests have one for each, as
/// perftest's do; see [`reap_received`] for queue pairs with one CQ for
/// both). Buffers go back to their pools, finished requests are
/// counted (`total` counts send-queue requests of every lane), and each
/// signaled send completion is timestamped into `record`. Returns the
/// number of requests handed back. Inlined into each wait loop, which then
/// keeps its state in registers across polls. `RECV` is a constant: the
/// receive queue's CQ holds receives only, so its instance of the
/// callback (and of the engine's poll) has no send-side bookkeeping,
/// which took send_lat's critical path 26 instructions per message.
#[inline(always)]
pub(crate) fn reap<const RECV: bool>(
    lane: &mut Lane,
    total: &mut u64,
    mut record: Option<&mut Vec<(u64, u64)>>,
) -> Result<usize, Error> {
    let Lane {
        qp,
        sends,
        done,
        received,
        ..
    } = lane;
    let mut failed = None;
    // Send completions counted in a local, added to `done` and `total`
    // once the poll returns: a register, not two stores per completion.
    let mut sent = 0u64;
    // Inlined too: `reap` has several call sites, so the closure would
    // otherwise be a call per completion.
    let n = poll_queue(
        qp,
        RECV,
        #[inline(always)]
        |mut c| {
            if c.status() != WcStatus::SUCCESS && failed.is_none() {
                failed = c.result().err();
            }
            // Pushes stay within the capacity reserved in `Side::prepare`.
            // The receive queue's CQ holds receives only.
            if RECV || c.is_recv() {
                *received += 1; // its prepared receive is free again: see `repost`
            } else {
                if let Some(buf) = c.take_buf() {
                    sends.push(buf);
                }
                if c.signaled() {
                    if let Some(r) = record.as_mut() {
                        r.push((*total + sent, ticks()));
                    }
                }
                sent += 1;
            }
        },
    );
    *done += sent;
    *total += sent;
    let n = n?;
    match failed {
        Some(e) => Err(e),
        None => Ok(n),
    }
}

/// Polls the receive queue's CQ if `recv`, else the send queue's. The
/// callback goes by value: the engine's poll then inlines it (through a
/// `&mut` it is called out of line, 19 instructions more per message).
#[inline(always)]
fn poll_queue(
    qp: &mut QueuePair<ArenaBuf>,
    recv: bool,
    on_done: impl FnMut(CompletionRef<'_, ArenaBuf>),
) -> Result<usize, Error> {
    let queue = if recv { Queue::Recv } else { Queue::Send };
    qp.engine_mut().poll_queue(queue, on_done)
}

/// [`reap`] of the receive queue's CQ. A queue pair whose receives have
/// no CQ of their own (`Lane::recv_cq` false: rdma_cm's) finds nothing
/// there and polls its one CQ, which [`reap`] sorts by kind; only an
/// empty poll pays for that test.
#[inline(always)]
pub(crate) fn reap_received(lane: &mut Lane, total: &mut u64) -> Result<usize, Error> {
    let n = reap::<true>(lane, total, None)?;
    if n != 0 || lane.recv_cq {
        return Ok(n);
    }
    reap::<false>(lane, total, None)
}

/// Posts the lane's prepared receives in turn, keeping `recv_window`
/// posted, until `iters` were posted.
#[inline(always)]
pub(crate) fn repost(lane: &mut Lane, p: &Params) -> Result<(), Error> {
    let until = p.iters.min(lane.received + lane.recv_window);
    while lane.recv_posted < until {
        let h = *lane.recvs.get(lane.recv_next).ok_or_else(no_buffer)?;
        lane.recv_next += 1;
        if lane.recv_next == lane.recvs.len() {
            lane.recv_next = 0;
        }
        lane.qp.post_prepared(h)?;
        lane.recv_posted += 1;
    }
    Ok(())
}

/// The send-queue operation of `p.test` on `lane`.
pub(crate) fn operation(lane: &Lane, p: &Params) -> Result<SendOp, Error> {
    Ok(match p.test {
        Test::WriteLat | Test::WriteBw => SendOp::Write(lane.remote(p.size)?),
        Test::ReadLat | Test::ReadBw => SendOp::Read(lane.remote(p.size)?),
        Test::AtomicLat => SendOp::FetchAdd {
            remote: lane.remote(p.size)?,
            add: 1,
        },
        Test::SendLat | Test::SendBw => SendOp::Send,
    })
}

/// Polls until the lane's send-queue requests up to number `n` completed.
#[inline(always)]
fn wait_sent(lane: &mut Lane, n: u64, p: &Params) -> Result<(), Error> {
    let mut spin = Spin::new();
    let mut total = 0;
    while lane.done < n {
        if reap::<false>(lane, &mut total, None)? == 0 {
            spin.idle(p, stalled!("wait for a send completion"))?;
        }
    }
    Ok(())
}

/// Spins until byte `at` of `inbox` reads `want` (the peer's RDMA Write).
#[inline]
fn wait_byte(inbox: &MemoryRegion, at: usize, want: u8, p: &Params) -> Result<(), Error> {
    let mut spin = Spin::new();
    let mut b = [0u8];
    loop {
        // A volatile one-byte read: the NIC writes this memory behind the
        // compiler's back.
        inbox.read_at(at, &mut b)?;
        if b[0] == want {
            return Ok(());
        }
        spin.idle(p, stalled!("wait for the peer's RDMA Write"))?;
    }
}

/// `write_lat` and `send_lat` (see the module docs).
fn ping_pong(side: &mut Side, p: &Params) -> Result<(), Error> {
    let Side {
        lanes,
        inbox,
        stamps,
        ..
    } = side;
    let lane = &mut lanes[0];
    if p.test == Test::WriteLat {
        ping_pong_write(lane, inbox, &mut stamps.posted, p)
    } else {
        ping_pong_send(lane, &mut stamps.posted, p)
    }
}

/// What a ping-pong's lane completed so far.
#[derive(Default)]
struct Done {
    sent: u64,
    received: u64,
}

/// Polls `queue` of the ping-pong's lane once, counting what completed.
#[inline(always)]
fn poll_lane(
    fast: &mut verbs::Lane<'_, ArenaBuf>,
    queue: Queue,
    done: &mut Done,
) -> Result<bool, Error> {
    // Nothing but the lane's two requests is ever in flight on a perf
    // queue pair's engine: nothing else can come back.
    let got = fast.poll(queue, |_| {})?;
    done.sent += got.sent;
    done.received += got.received;
    Ok(got.sent | got.received != 0)
}

/// The `write_lat` ping-pong, on a lane of its one prepared Write. Not
/// inlined into `run`, nor is the `send_lat` one: alone in its function,
/// a loop keeps more of its state in registers.
#[inline(never)]
fn ping_pong_write(
    lane: &mut Lane,
    inbox: &MemoryRegion,
    posted: &mut [u64],
    p: &Params,
) -> Result<(), Error> {
    let ping = lane.ping.ok_or_else(no_buffer)?;
    let mut fast = lane.qp.lane(ping, None)?;
    let mut done = Done::default();
    // Message k answers message k; the initiator sends one ahead.
    let lead = u64::from(p.initiator);
    if p.initiator && p.iters > 0 {
        send(&mut fast, &mut done, posted, 1, true, p)?;
    }
    let last_answer = p.iters.saturating_sub(lead);
    for k in 1..p.iters + 1 {
        // The counter wraps at 256 like a C char: the byte only ever
        // steps to the next value, so the wait is exact.
        wait_byte(inbox, p.size - 1, k as u8, p)?;
        if k <= last_answer {
            send(&mut fast, &mut done, posted, k + lead, true, p)?;
        }
    }
    drop(fast);
    lane.done += done.sent;
    Ok(())
}

/// The `send_lat` ping-pong, on a lane of its prepared send and its one
/// prepared receive, which `Side::prepare` posted `recv_window` times and
/// which is posted again after each message until `iters` were posted,
/// as perftest reposts its one receive request.
#[inline(never)]
fn ping_pong_send(lane: &mut Lane, posted: &mut [u64], p: &Params) -> Result<(), Error> {
    let ping = lane.ping.ok_or_else(no_buffer)?;
    let recv = *lane.recvs.first().ok_or_else(no_buffer)?;
    // rdma_cm's queue pairs have one CQ for both queues.
    let recv_queue = if lane.recv_cq {
        Queue::Recv
    } else {
        Queue::Send
    };
    let mut recv_posted = lane.recv_posted;
    let mut fast = lane.qp.lane(ping, Some(recv))?;
    let mut done = Done::default();
    // As in `ping_pong_write`: the initiator sends one ahead.
    let lead = u64::from(p.initiator);
    if p.initiator && p.iters > 0 {
        send(&mut fast, &mut done, posted, 1, false, p)?;
    }
    let last_answer = p.iters.saturating_sub(lead);
    for k in 1..p.iters + 1 {
        let mut spin = Spin::new();
        while done.received < k {
            if !poll_lane(&mut fast, recv_queue, &mut done)? {
                spin.idle(p, stalled!("wait for the peer's send"))?;
            }
        }
        // One repost per message: the peer sends message k + 1 only after
        // ours, so a wait never takes two, and this keeps `recv_window`
        // posted.
        if recv_posted < p.iters {
            fast.post_recv()?;
            recv_posted += 1;
        }
        if k <= last_answer {
            send(&mut fast, &mut done, posted, k + lead, false, p)?;
        }
    }
    drop(fast);
    lane.recv_posted = recv_posted;
    lane.received += done.received;
    lane.done += done.sent;
    Ok(())
}

/// Sends message `k` (from 1) of a ping-pong on its lane, timestamped into
/// `stamps[k - 1]`, and waits for its completion; with `write`, first
/// stamps `k` into the last byte, which the peer spins on.
#[inline(always)]
fn send(
    fast: &mut verbs::Lane<'_, ArenaBuf>,
    done: &mut Done,
    stamps: &mut [u64],
    k: u64,
    write: bool,
    p: &Params,
) -> Result<(), Error> {
    *stamps.get_mut((k - 1) as usize).ok_or_else(no_stamp)? = ticks();
    if write {
        // The last byte, which the peer spins on.
        fast.write_send(p.size - 1, &[k as u8])?;
    }
    fast.post_send()?;
    let mut spin = Spin::new();
    while done.sent < k {
        if !poll_lane(fast, Queue::Send, done)? {
            spin.idle(p, stalled!("wait for a send completion"))?;
        }
    }
    Ok(())
}

/// `read_lat` and `atomic_lat` (see the module docs).
fn round_trips(side: &mut Side, p: &Params) -> Result<(), Error> {
    let Side { lanes, stamps, .. } = side;
    let lane = &mut lanes[0];
    let ping = lane.ping.ok_or_else(no_buffer)?;
    for k in 0..p.iters {
        stamps.posted[k as usize] = ticks();
        lane.qp.post_prepared(ping)?;
        wait_sent(lane, k + 1, p)?;
    }
    Ok(())
}

#[cold]
pub(crate) fn no_stamp() -> Error {
    Error::new(
        site!("perf", "timestamp table full (a bug in perf)"),
        ErrorKind::QueueFull,
    )
}

#[cold]
pub(crate) fn no_buffer() -> Error {
    Error::new(
        site!("perf", "no free local buffer (a bug in perf)"),
        ErrorKind::QueueFull,
    )
}
