//! The service over RC: an acceptor (this thread, the exchange server's
//! handshakes) handing each new client to one of `--threads` shards in
//! turn, past the full ones (shard.rs: each its own engine, shared
//! receive queue and arena, no lock between them), once a second a line
//! of the shards' sums, and what a request gets back (`respond`, shared
//! with the UD server).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use verbs::exchange::{Handshake, Server, ServerConfig};
use verbs::{ArenaBuf, Context, Deadline, HostBuf, Local, SendOp, SendRequest};

use crate::proto::{judge, Header, Op, Status, HEADER};
use crate::scrape::{self, Published};
use crate::shard;
use crate::{BoxError, Opts};

/// Queue-pair send depth: a closed-loop client has one request out, a
/// pipelining one a few; beyond this its responses are dropped (counted).
pub const SEND_DEPTH: u32 = 8;

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
pub const KEEPALIVE_ROUND: Duration = Duration::from_millis(500);

/// A keepalive's tag (a response's is 0).
pub const KEEPALIVE: u64 = 1;

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
    let threads = opts.threads.max(1);
    let ctx = Context::open(opts.dev.as_deref())?;
    let server = Server::bind(
        ("0.0.0.0", opts.port),
        ServerConfig {
            max_pending: 64,
            link_layer: Some(ctx.query_port(1)?.link_layer()),
            ..ServerConfig::default()
        },
        |peer, err| eprintln!("server: refused {peer}: {err}"),
    )?;
    // Each shard holds its part of --max-conns.
    let per_shard = opts.max_conns.div_ceil(threads as u32);
    println!(
        "server: listening on port {}, payloads up to {} B, {} receives shared per shard, up to {} clients, {} shard(s)",
        opts.port, opts.max_payload, opts.srq_depth, opts.max_conns, threads
    );
    let published = Published::new(threads);
    if let Some(port) = opts.metrics {
        scrape::serve(port, ctx.name().to_string(), published.clone())?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut to_shards = Vec::with_capacity(threads);
    let mut shards = Vec::with_capacity(threads);
    for i in 0..threads {
        // A shard slow to pick up clients makes the acceptor refuse more,
        // not queue without end.
        let (tx, rx) = mpsc::sync_channel::<Handshake>(64);
        let (opts, published, stop) = (opts.clone(), published.clone(), stop.clone());
        let shard = std::thread::Builder::new()
            .name(format!("shard{i}"))
            .spawn(move || {
                let result = shard::run(i, &opts, per_shard, rx, published, &stop);
                stop.store(true, Ordering::Relaxed);
                result.map_err(|e| e.to_string())
            })?;
        to_shards.push(tx);
        shards.push(shard);
    }
    let mut summary = Summary::new();
    let mut next = 0;
    while !stop.load(Ordering::Relaxed) {
        // Round robin over the shards with room (as they last published):
        // a shard's queue pairs stay with it for their life, and a client
        // is refused only when no shard takes it.
        if let Ok(hs) = server.next_client(Deadline::after(Duration::from_millis(50))) {
            let conns = published.conns();
            let mut left = Some(hs);
            for s in (0..threads).map(|k| (next + k) % threads) {
                let Some(hs) = left.take() else { break };
                if conns.get(s).is_some_and(|&c| c >= u64::from(per_shard)) {
                    left = Some(hs);
                    continue;
                }
                if let Err(TrySendError::Full(hs) | TrySendError::Disconnected(hs)) =
                    to_shards[s].try_send(hs)
                {
                    left = Some(hs);
                }
            }
            if left.is_some() {
                eprintln!("server: no shard takes a client now: refused one");
            }
            next = (next + 1) % threads;
        }
        let now = published.total();
        summary.tick(&now, now.conns as usize);
        if summary.over(opts.seconds) {
            stop.store(true, Ordering::Relaxed);
        }
    }
    drop(to_shards);
    let mut total = Counters::default();
    let mut failed = None;
    for shard in shards {
        match shard.join() {
            Ok(Ok(n)) => total.add(&n),
            Ok(Err(e)) => failed = Some(e),
            Err(_) => failed = Some("a shard panicked".to_string()),
        }
    }
    summary.last_line(&total);
    match failed {
        Some(e) => Err(e.into()),
        None => Ok(()),
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
        Ok(local) => Ok(SendRequest::new(SendOp::Send, local)),
        Err((_, buf)) => Err(buf),
    }
}
