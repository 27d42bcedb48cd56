//! One shard of the service: one engine (one completion queue, one
//! shared receive queue, one arena) holding its clients' queue pairs, one
//! thread polling it, nothing shared with the other shards on the data
//! path. A request's receive buffer carries its response back (the header
//! rewritten, the payload echoed or inverted in place), posted from the
//! poll's handler, then returns to the shared receive queue. Clients come
//! finished from the acceptor (server.rs); the loop only picks them up.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use verbs::exchange::Handshake;
use verbs::{
    ArenaBuf, ConnectOptions, Context, Engine, EngineConfig, KeepaliveTable, ProtectionDomain,
    QpConfig, QpId, RecvRequest, SrqConfig, WcStatus,
};

use crate::nap::Nap;
use crate::proto::HEADER;
use crate::scrape::Published;
use crate::server::{respond, Counters, KEEPALIVE, KEEPALIVE_ROUND, RNR_RETRY, SEND_DEPTH};
use crate::{BoxError, Opts};

/// Shard `index`'s loop until `stop` is raised (or a client's stop sets
/// it): its own context, engine, shared receive queue and arena; clients
/// come from the acceptor through `handshakes`, at most `max_conns`.
pub fn run(
    index: usize,
    opts: &Opts,
    max_conns: u32,
    handshakes: Receiver<Handshake>,
    published: Published,
    stop_all: &AtomicBool,
) -> Result<Counters, BoxError> {
    let ctx = Context::open(opts.dev.as_deref())?;
    let pd = ProtectionDomain::new(&ctx)?;
    // Receive buffers hold twice the largest payload served: a request
    // claiming more than the limit but fitting is answered "too large";
    // one bigger than the buffer is the transport's error (its
    // connection alone goes to ERR and is dropped).
    let buf_len = HEADER + 2 * opts.max_payload as usize;
    let srq_depth = opts.srq_depth;
    let spare = max_conns * SEND_DEPTH;
    // Only the shared receive queue's buffers: a reply goes out in its
    // request's buffer, which comes back to the queue after the send.
    let mut arena = crate::arena(&pd, srq_depth as usize, buf_len)?;
    let config = EngineConfig {
        cq_depth: Some(srq_depth + spare),
        srq: Some(SrqConfig {
            max_wr: srq_depth,
            max_sge: 1,
        }),
        events: opts.sleep_after > 0,
        ..EngineConfig::default()
    };
    let mut engine: Engine<ArenaBuf> = Engine::new(&pd, &config)?;
    for _ in 0..srq_depth {
        engine
            .post_srq_recv(RecvRequest::new(arena.alloc(buf_len)?))
            .map_err(|e| e.error)?;
    }
    let qp_config = QpConfig {
        max_send_wr: SEND_DEPTH,
        max_recv_wr: 1,
        ..QpConfig::default()
    };
    // A dead client is found within about a second (timeout 14, 3 retries)
    // of something sent to it: a response, or a keepalive (KEEPALIVE_ROUND);
    // one that posts no receive within RNR_RETRY of its timer; a full
    // shared receive queue makes senders wait, not fail.
    let connect = ConnectOptions {
        retry_cnt: 3,
        rnr_retry: RNR_RETRY,
        ..ConnectOptions::default()
    };
    let mut live = KeepaliveTable::with_capacity(max_conns as usize);
    let mut round_ends = Instant::now() + KEEPALIVE_ROUND;
    let mut dead: Vec<QpId> = Vec::with_capacity(max_conns as usize);
    // Buffers a post refused (none while the shared receive queue holds
    // what the loop takes from it), posted again after the poll.
    let mut free: Vec<ArenaBuf> = Vec::with_capacity(srq_depth as usize);
    let mut scratch = vec![0u8; buf_len];
    let mut n = Counters::default();
    let mut stop = false;
    let mut polls: u32 = 0;
    let mut nap = Nap::new(opts.sleep_after, Duration::from_millis(50));
    while !stop {
        polls = polls.wrapping_add(1);
        // The handler answers each request from inside the poll: the reply
        // goes out on the queue pair the request came from, in the
        // request's own buffer, and a buffer whose reply went out receives
        // the next request.
        let got = engine.poll(|mut c| {
            let qp = c.qp();
            let failed = c.status() != WcStatus::SUCCESS;
            let Some(buf) = c.take_buf() else {
                // A keepalive (no buffer), or a receive whose buffer
                // went with its queue pair.
                if failed {
                    n.silent_gone +=
                        u64::from(c.tag() == KEEPALIVE && c.status() == WcStatus::RETRY_EXC_ERR);
                    mark_dead(&mut dead, qp);
                }
                return;
            };
            if failed || !c.is_recv() || qp.is_none() {
                // A response went out (its buffer receives again), or a
                // flushed or failed request: its connection is done.
                if failed {
                    mark_dead(&mut dead, qp);
                }
                recv_again(&mut c, buf, &mut free);
                return;
            }
            if let Some(qp) = qp {
                live.heard_from(qp);
            }
            n.requests += 1;
            let received = c.byte_len() as usize;
            let refused = match respond(buf, 0, received, opts, &mut scratch, &mut n, &mut stop) {
                Ok(response) => match c.reply(response) {
                    Ok(()) => return,
                    Err(e) => {
                        n.dropped += 1;
                        e.request.into_bufs().next()
                    }
                },
                Err(buf) => Some(buf),
            };
            if let Some(buf) = refused {
                recv_again(&mut c, buf, &mut free);
            }
        });
        let got = got?;
        while (engine.srq_posted() as u32) < srq_depth {
            let Some(buf) = free.pop() else { break };
            if let Err(e) = engine.post_srq_recv(RecvRequest::new(buf)) {
                free.extend(e.request.into_bufs());
                break;
            }
        }
        for qp in dead.drain(..) {
            // The connection is gone either way.
            drop_qp(&mut engine, qp);
            if live.remove(qp) {
                n.conns_gone += 1;
            }
        }
        let slept = nap.after_poll(&engine, got)?;
        // New clients and the clock, every 512th poll or after a sleep: a
        // busy loop stays a poll loop, and a handshake waits microseconds.
        if got == 0 && polls % 512 != 0 && !slept {
            continue;
        }
        if polls % 512 == 0 || slept {
            let new = Clients {
                qp_config: &qp_config,
                connect: &connect,
                max_conns,
            };
            new.take(&handshakes, &mut engine, &mut live);
            let now = Instant::now();
            if now >= round_ends {
                live.probe_silent(&mut engine, KEEPALIVE);
                round_ends = now + KEEPALIVE_ROUND;
                // Published as often (the only lock a shard takes).
                n.conns = live.len() as u64;
                n.engine = engine.counters();
                published.publish(index, &n);
            }
            if stop_all.load(Ordering::Relaxed) {
                break;
            }
        }
    }
    stop_all.store(true, Ordering::Relaxed);
    n.conns = live.len() as u64;
    n.engine = engine.counters();
    published.publish(index, &n);
    Ok(n)
}

/// Posts `buf` on the shared receive queue from the poll's handler
/// (kept in `free` if refused, for the loop to post again).
fn recv_again(c: &mut verbs::CompletionRef<'_, ArenaBuf>, buf: ArenaBuf, free: &mut Vec<ArenaBuf>) {
    if let Err(e) = c.poster().post_srq_recv(RecvRequest::new(buf)) {
        free.extend(e.request.into_bufs());
    }
}

/// Notes `qp` (if still there) for removal after the poll: a queue pair
/// cannot be removed from inside it.
fn mark_dead(dead: &mut Vec<QpId>, qp: Option<QpId>) {
    if let Some(qp) = qp {
        if !dead.contains(&qp) && dead.len() < dead.capacity() {
            dead.push(qp);
        }
    }
}

/// What a shard makes of a client handed to it.
struct Clients<'a> {
    qp_config: &'a QpConfig,
    connect: &'a ConnectOptions,
    max_conns: u32,
}

impl Clients<'_> {
    /// Takes every client the acceptor handed over: a queue pair on the
    /// engine, connected before our endpoint is revealed.
    fn take(
        &self,
        handshakes: &Receiver<Handshake>,
        engine: &mut Engine<ArenaBuf>,
        live: &mut KeepaliveTable,
    ) {
        while let Ok(hs) = handshakes.try_recv() {
            if live.len() >= self.max_conns as usize {
                eprintln!("server: full ({} clients): refused one", live.len());
                continue; // dropping the handshake closes it unanswered
            }
            // One client's failure is that client's: the shard serves on.
            let qp = match engine.add_qp(self.qp_config) {
                Ok(qp) => qp,
                Err(e) => {
                    eprintln!("server: no queue pair for a client: {e}");
                    continue;
                }
            };
            let ours = match engine
                .connect_with(qp, hs.peer_endpoint(), self.connect)
                .and_then(|_| engine.endpoint(qp))
            {
                Ok(ours) => ours,
                Err(e) => {
                    eprintln!("server: a client's endpoint did not connect: {e}");
                    drop_qp(engine, qp);
                    continue;
                }
            };
            match hs.reply(&ours) {
                Ok(_session) => {
                    live.add(qp);
                }
                Err(e) => {
                    eprintln!("server: a client left during its handshake: {e}");
                    drop_qp(engine, qp);
                }
            }
        }
    }
}

/// Removes a client's queue pair; one that cannot be destroyed stays
/// leaked in the engine (its buffers with it), and the shard serves on.
fn drop_qp(engine: &mut Engine<ArenaBuf>, qp: QpId) {
    if let Err(e) = engine.remove_qp(qp) {
        eprintln!("server: a client's queue pair was leaked: {e}");
    }
}
