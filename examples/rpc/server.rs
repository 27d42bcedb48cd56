//! The service: one engine (one completion queue, one shared receive
//! queue) holding every client's queue pair, one thread polling it. A
//! request's receive buffer carries its response back (the header
//! rewritten, the payload echoed or inverted in place), then returns to
//! the shared receive queue. Handshakes run on the exchange server's
//! threads (bounded, a stalled one never blocks the data path); the loop
//! only picks up finished ones.

use std::time::{Duration, Instant};

use verbs::exchange::{Server, ServerConfig};
use verbs::{
    ArenaBuf, ConnectOptions, Context, Deadline, Engine, EngineConfig, HostBuf, KeepaliveTable,
    Local, ProtectionDomain, QpConfig, QpId, RecvRequest, SendOp, SendRequest, SrqConfig, WcStatus,
};

use crate::nap::Nap;
use crate::proto::{judge, Header, Op, Status, HEADER};
use crate::scrape::{self, Published};
use crate::{BoxError, Opts};

/// Queue-pair send depth: a closed-loop client has one request out, a
/// pipelining one a few; beyond this its responses are dropped (counted).
const SEND_DEPTH: u32 = 8;

/// How often a response a client has no receive for is tried again, each
/// after the timer the client's queue pair asks for (at most 655 ms),
/// before its connection fails and is dropped: a client that never posts
/// a receive holds its slot at most 4 x 655 ms, so such clients cannot
/// hold every slot. A closed-loop client posts its receive before its
/// request and never meets it.
pub const RNR_RETRY: u8 = 3;

/// How long a connection may be silent before the library's keepalive
/// asks whether its client is there (`Engine::keepalive`: a zero-length
/// RDMA Write naming no memory, which clients allow at their queue pairs).
/// A dead client is dropped within about this plus the retries.
const KEEPALIVE_ROUND: Duration = Duration::from_millis(500);

/// A keepalive's tag (a response's is 0).
const KEEPALIVE: u64 = 1;

/// What a shard counts (metrics.rs renders it for `--metrics`).
pub use crate::metrics::ShardCounts as Counters;

impl Counters {
    pub fn errors(&self) -> String {
        format!(
            "malformed={} too_large={} unknown_op={} dropped={} conns_gone={} (silent {})",
            self.malformed,
            self.too_large,
            self.unknown_op,
            self.dropped,
            self.conns_gone,
            self.silent_gone
        )
    }
}

/// Once a second: the request rate since the last line, connections and
/// errors.
pub struct Summary {
    started: Instant,
    last: Instant,
    last_requests: u64,
}

impl Summary {
    pub fn new() -> Summary {
        let now = Instant::now();
        Summary {
            started: now,
            last: now,
            last_requests: 0,
        }
    }

    pub fn tick(&mut self, n: &Counters, conns: usize) {
        let secs = self.last.elapsed().as_secs_f64();
        if secs < 1.0 {
            return;
        }
        println!(
            "server: t={:.0}s req/s={:.0} conns={conns} errors: {}",
            self.started.elapsed().as_secs_f64(),
            (n.requests - self.last_requests) as f64 / secs,
            n.errors()
        );
        (self.last, self.last_requests) = (Instant::now(), n.requests);
    }

    /// True once `seconds` (0: never) have passed.
    pub fn over(&self, seconds: u64) -> bool {
        seconds > 0 && self.started.elapsed().as_secs() >= seconds
    }

    pub fn last_line(&self, n: &Counters) {
        println!(
            "server: stopped after {:.1}s: {} requests, {}",
            self.started.elapsed().as_secs_f64(),
            n.requests,
            n.errors()
        );
    }
}

pub fn run(opts: &Opts) -> Result<(), BoxError> {
    let ctx = Context::open(opts.dev.as_deref())?;
    let pd = ProtectionDomain::new(&ctx)?;
    // Receive buffers hold twice the largest payload served: a request
    // claiming more than the limit but fitting is answered "too large";
    // one bigger than the buffer is the transport's error (its
    // connection alone goes to ERR and is dropped).
    let buf_len = HEADER + 2 * opts.max_payload as usize;
    let srq_depth = opts.srq_depth;
    let spare = opts.max_conns * SEND_DEPTH;
    let buffers = srq_depth + spare;
    let mut arena = crate::arena(&pd, buffers as usize, buf_len)?;
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
    let server = Server::bind(
        ("0.0.0.0", opts.port),
        ServerConfig {
            max_pending: 64,
            link_layer: Some(ctx.query_port(1)?.link_layer()),
            ..ServerConfig::default()
        },
        |peer, err| eprintln!("server: refused {peer}: {err}"),
    )?;
    println!(
        "server: listening on port {}, payloads up to {} B, {} receives shared, up to {} clients",
        opts.port, opts.max_payload, srq_depth, opts.max_conns
    );
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
    let mut live = KeepaliveTable::with_capacity(opts.max_conns as usize);
    let mut round_ends = Instant::now() + KEEPALIVE_ROUND;
    let mut dead: Vec<QpId> = Vec::with_capacity(opts.max_conns as usize);
    // Buffers a post refused (none while the shared receive queue holds
    // what the loop takes from it), posted again after the poll.
    let mut free: Vec<ArenaBuf> = Vec::with_capacity(buffers as usize);
    let mut scratch = vec![0u8; buf_len];
    let mut n = Counters::default();
    let published = metrics(opts, &ctx)?;
    let mut summary = Summary::new();
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
            n.engine.completions += 1;
            if failed {
                n.engine.failed(c.status());
            }
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
                recv_again(&mut c, buf, &mut free, &mut n);
                return;
            }
            if let Some(qp) = qp {
                live.heard_from(qp);
            }
            n.requests += 1;
            let received = c.byte_len() as usize;
            n.engine.bytes += received as u64;
            let refused = match respond(buf, 0, received, opts, &mut scratch, &mut n, &mut stop) {
                Ok(response) => match c.reply(response) {
                    Ok(()) => {
                        n.engine.posts += 1;
                        return;
                    }
                    Err(e) => {
                        n.dropped += 1;
                        e.request.into_bufs().next()
                    }
                },
                Err(buf) => Some(buf),
            };
            if let Some(buf) = refused {
                recv_again(&mut c, buf, &mut free, &mut n);
            }
        });
        let got = got?;
        while (engine.srq_posted() as u32) < srq_depth {
            let Some(buf) = free.pop() else { break };
            if let Err(e) = engine.post_srq_recv(RecvRequest::new(buf)) {
                free.extend(e.request.into_bufs());
                break;
            }
            n.engine.posts += 1;
        }
        for qp in dead.drain(..) {
            // A failed destroy leaks the queue pair; the connection is
            // gone either way.
            let _ = engine.remove_qp(qp);
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
            accept(&server, &mut engine, &qp_config, &connect, &mut live, opts)?;
            if Instant::now() >= round_ends {
                n.engine.posts += live.probe_silent(&mut engine, KEEPALIVE) as u64;
                round_ends = Instant::now() + KEEPALIVE_ROUND;
            }
            n.conns = live.len() as u64;
            if let Some(p) = &published {
                p.publish(0, &n);
            }
            summary.tick(&n, live.len());
            if summary.over(opts.seconds) {
                break;
            }
        }
    }
    summary.last_line(&n);
    Ok(())
}

/// Posts `buf` on the shared receive queue from the poll's handler
/// (kept in `free` if refused, for the loop to post again).
fn recv_again(
    c: &mut verbs::CompletionRef<'_, ArenaBuf>,
    buf: ArenaBuf,
    free: &mut Vec<ArenaBuf>,
    n: &mut Counters,
) {
    match c.poster().post_srq_recv(RecvRequest::new(buf)) {
        Ok(()) => n.engine.posts += 1,
        Err(e) => free.extend(e.request.into_bufs()),
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

/// With `--metrics PORT`, the scrape endpoint's counts, published to once
/// a second by the loop.
pub fn metrics(opts: &Opts, ctx: &Context) -> Result<Option<Published>, BoxError> {
    let Some(port) = opts.metrics else {
        return Ok(None);
    };
    let published = Published::new(1);
    scrape::serve(port, ctx.name().to_string(), published.clone())?;
    Ok(Some(published))
}

/// The response to the request of `received` bytes at offset `at` of
/// `buf`, built in `buf` itself; `Err(buf)` when there is nothing to answer.
pub fn respond(
    mut buf: ArenaBuf,
    at: usize,
    received: usize,
    opts: &Opts,
    scratch: &mut [u8],
    n: &mut Counters,
    stop: &mut bool,
) -> Result<SendRequest<ArenaBuf>, ArenaBuf> {
    let mut raw = [0u8; HEADER];
    let header =
        (received >= HEADER && buf.read_at(at, &mut raw).is_ok()).then(|| Header::decode(&raw));
    let status = judge(header.as_ref(), received, opts.max_payload, opts.allow_stop);
    let id = header.map_or(0, |h| h.id);
    let op = header.map_or(Op(0), |h| h.op);
    let len = match status {
        Status::OK => header.map_or(0, |h| h.len) as usize,
        Status::MALFORMED => {
            n.malformed += 1;
            0
        }
        Status::TOO_LARGE => {
            n.too_large += 1;
            0
        }
        _ => {
            n.unknown_op += 1;
            0
        }
    };
    if status == Status::OK && op == Op::INVERT {
        let payload = &mut scratch[..len];
        if buf.read_at(at + HEADER, payload).is_err() {
            return Err(buf);
        }
        for b in payload.iter_mut() {
            *b = !*b;
        }
        if buf.write_at(at + HEADER, payload).is_err() {
            return Err(buf);
        }
    }
    if status == Status::OK && op == Op::STOP {
        *stop = true;
    }
    let reply = Header::new(op, status, len as u32, id);
    if buf.write_at(at, &reply.encode()).is_err() {
        return Err(buf);
    }
    match Local::range(buf, at, HEADER + len) {
        Ok(local) => {
            n.engine.bytes += (HEADER + len) as u64;
            Ok(SendRequest::new(SendOp::Send, local))
        }
        Err((_, buf)) => Err(buf),
    }
}

/// Takes every client whose handshake finished: a queue pair on the
/// engine, connected before our endpoint is revealed.
fn accept(
    server: &Server,
    engine: &mut Engine<ArenaBuf>,
    qp_config: &QpConfig,
    connect: &ConnectOptions,
    live: &mut KeepaliveTable,
    opts: &Opts,
) -> Result<(), BoxError> {
    while let Ok(hs) = server.next_client(Deadline::after(Duration::ZERO)) {
        if live.len() >= opts.max_conns as usize {
            eprintln!("server: full ({} clients): refused one", live.len());
            continue; // dropping the handshake closes it unanswered
        }
        let qp = engine.add_qp(qp_config)?;
        let ours = match engine
            .connect_with(qp, hs.peer_endpoint(), connect)
            .and_then(|_| engine.endpoint(qp))
        {
            Ok(ours) => ours,
            Err(e) => {
                eprintln!("server: a client's endpoint did not connect: {e}");
                engine.remove_qp(qp)?;
                continue;
            }
        };
        match hs.reply(&ours) {
            Ok(_session) => {
                live.add(qp);
            }
            Err(e) => {
                eprintln!("server: a client left during its handshake: {e}");
                engine.remove_qp(qp)?;
            }
        }
    }
    Ok(())
}
