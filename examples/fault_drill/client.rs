//! The active side: keeps `depth` lanes of write + read-back jobs in
//! flight against the server's region, verifies every read byte-exact
//! against a shadow copy of what the server's memory must hold, injects
//! the scenario's fault mid-stream, checks how the failure is reported,
//! reconnects and resumes, and finally has the server hash its whole
//! region to compare with the shadow.

use std::time::{Duration, Instant};

use verbs::exchange;
use verbs::{
    Arena, ArenaBuf, ArenaConfig, Completion, ConnectOptions, Context, Deadline, EngineConfig,
    ErrorKind, HostBuf, ProtectionDomain, QpConfig, QueuePair, RemoteRegion, RemoteSlice, SendOp,
    SendRequest, WcStatus,
};

use crate::chan::{self, Chan, Digest};
use crate::events::Watcher;
use crate::fault::{self, Bound};
use crate::load::{op_size, Job, Range, Rng, MAX_OP};
use crate::{BoxError, Opts, Qp, Scenario};

/// Longest wait for one completion while the wire works (or for the first
/// error after a fault, beyond which it counts as a hang): far above any
/// retransmission delay, far below the guest's time limit.
const HANG: Duration = Duration::from_secs(30);
/// Longest wait for each flushed request once the QP is in error.
const DRAIN: Duration = Duration::from_secs(10);
/// Connection set-up: TCP connect (retried while nobody listens), exchange.
const SETUP: Duration = Duration::from_secs(60);
/// A bad request is refused by the responder's NAK: one round trip, no
/// timer; 1 s is generous for a TCG guest.
const NAK_BOUND_MS: f64 = 1000.0;
/// The tag of the deliberately bad request (lanes use 0..2*depth).
const BAD_TAG: u64 = 1 << 40;

/// What one drill did, for the RESULT line.
#[derive(Debug, Default)]
pub struct Report {
    pub attempted: u64,
    pub verified: u64,
    pub flushed: u64,
    /// Non-flush error completions, in order.
    pub errors: Vec<WcStatus>,
    /// The first error completion (flush or not) and when it was polled.
    pub first_error: Option<(WcStatus, Instant)>,
    pub mismatches: u64,
    pub hangs: u64,
    pub bytes: u64,
    pub detect_ms: Option<f64>,
    pub bound_ms: Option<f64>,
    pub nominal_ms: Option<f64>,
    pub recover_ms: Option<f64>,
    /// Operations attempted and verified after the reconnection.
    pub resumed: Option<(u64, u64)>,
    pub hash_ok: Option<bool>,
    /// Link down only: the requests in flight neither failed nor completed
    /// within the bound (an rxe behaviour); the drill reset the QP itself.
    pub stalled: bool,
    /// The reset QP failed again with no cause after reconnecting, and
    /// the drill went on with a new QP.
    pub fresh_qp: bool,
    pub elapsed_ms: f64,
    pub events: Vec<String>,
    /// rxe's count of requester retries (timeouts and NAKs) in this guest.
    pub retries: Option<u64>,
    pub failure: Option<String>,
}

pub struct Client<'a> {
    opts: &'a Opts,
    dev: String,
    host: String,
    config: QpConfig,
    connect: ConnectOptions,
    watcher: Watcher,
    qp: Qp,
    arena: Arena,
    chan: Chan,
    server_pid: u64,
    remote: RemoteRegion,
    /// What the server's region must hold: updated when a write is posted.
    shadow: Vec<u8>,
    lane_len: usize,
    lanes: Vec<Option<Job>>,
    /// Writes that failed (their range's content on the server is unknown):
    /// rewritten from the shadow after reconnecting.
    repairs: Vec<Range>,
    rng: Rng,
    next_job: u64,
    /// The QP reported an error: post nothing until reconnected.
    errored: bool,
    done: Vec<Completion<ArenaBuf>>,
    pub r: Report,
}

/// Runs the drill and returns its report (a failure is in `failure`).
pub fn run(opts: &Opts, host: &str) -> Report {
    let mut client = match Client::new(opts, host) {
        Ok(c) => c,
        Err(e) => {
            return Report {
                failure: Some(format!("set-up: {e}")),
                ..Report::default()
            }
        }
    };
    // Timed from the first post to the final verification: set-up excluded.
    let t0 = Instant::now();
    if let Err(e) = client.drill() {
        client.r.failure = Some(e.to_string());
    }
    client.r.elapsed_ms = ms(t0.elapsed());
    // Let the server go either way, so the pair ends without its grace period.
    if client.chan.send(chan::QUIT, 0, 0).is_ok() {
        let _ = client
            .chan
            .expect(chan::BYE, Deadline::after(Duration::from_secs(5)));
    }
    client.r.events = client.watcher.seen();
    let counters = crate::events::counters(&client.dev);
    let list: Vec<String> = counters.iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!("NOTE device counters: {}", list.join(" "));
    client.r.retries = Some(
        counters
            .iter()
            .find(|(k, _)| k == "completer_retry_err")
            .map_or(0, |(_, v)| *v),
    );
    client.r
}

/// The QP's completion queue has a channel: waits sleep on it instead of
/// spinning a vCPU that the other guest needs.
fn engine_config() -> EngineConfig {
    EngineConfig {
        events: true,
        ..EngineConfig::default()
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl<'a> Client<'a> {
    fn new(opts: &'a Opts, host: &str) -> Result<Client<'a>, BoxError> {
        let t0 = Instant::now();
        let ctx = Context::open(opts.dev.as_deref())?;
        let pd = ProtectionDomain::new(&ctx)?;
        let depth = opts.depth;
        // Per lane: a write and a read of at most a lane each, plus slack.
        let arena = Arena::new(
            &pd,
            &ArenaConfig {
                capacity: depth * 3 * MAX_OP.min(opts.region / depth) + (1 << 20),
                ..ArenaConfig::default()
            },
        )?;
        let config = QpConfig {
            max_send_wr: (2 * depth + 8) as u32,
            ..QpConfig::default()
        };
        let qp: Qp = QueuePair::with_engine(&pd, &config, &engine_config())?;
        let watcher = Watcher::start(&ctx, "client", t0, qp.engine().raw_id(qp.id())?);
        let connect = ConnectOptions {
            timeout: opts.timeout(),
            retry_cnt: opts.retry(),
            ..ConnectOptions::default()
        };
        println!(
            "STAGE client: connecting to the server at {host}:{}",
            opts.port
        );
        let (mut chan, server_pid) = dial(host, opts.port, None)?;
        let mut qp = qp;
        println!("STAGE client: exchanging endpoints and connecting the queue pair");
        let remote = handshake(&mut chan, &mut qp, &connect)?;
        if (remote.len as usize) < opts.region {
            return Err("the server's region is smaller than --region".into());
        }
        println!(
            "NOTE scenario={} qdisc=[{}] timeout={} retry_cnt={} depth={depth} region_mib={}",
            opts.scenario.name(),
            fault::qdisc(&opts.iface),
            connect.timeout,
            connect.retry_cnt,
            opts.region >> 20
        );
        Ok(Client {
            opts,
            dev: ctx.name().to_string(),
            host: host.to_string(),
            config,
            connect,
            watcher,
            qp,
            arena,
            chan,
            server_pid,
            remote,
            shadow: vec![0; opts.region], // the server's fresh region is zeroed
            lane_len: opts.region / depth,
            lanes: vec![None; depth],
            repairs: Vec::new(),
            rng: Rng::new(opts.seed),
            next_job: 0,
            errored: false,
            done: Vec::with_capacity(64),
            r: Report::default(),
        })
    }

    fn drill(&mut self) -> Result<(), BoxError> {
        let jobs = self.opts.ops.div_ceil(2); // each job is a write and a read
        if !self.opts.scenario.faulty() {
            println!("STAGE client: {jobs} write-and-read jobs");
            self.run(jobs, true)?;
            return self.check_hash("the whole region");
        }
        // Half the jobs, then the fault with requests in flight, then the rest.
        let half = jobs / 2;
        let bad_input = self.opts.scenario == Scenario::BadKey;
        // A bad request behind a full window would wait for the window to
        // drain; alone, its error measures the responder's NAK.
        println!("STAGE client: {half} of {jobs} write-and-read jobs before the fault");
        self.run(half, bad_input)?;
        if let Some((status, _)) = self.r.first_error {
            return Err(format!("{status} before any fault was injected").into());
        }
        let t_fault = self.inject()?;
        self.until_error(t_fault)?;
        self.recover()?;
        let rest = self.next_job + (jobs - half);
        let causes = self.r.errors.len();
        let mut resumed_from = (self.r.attempted, self.r.verified);
        self.run(rest, true)?;
        if self.errored && self.r.errors.len() == causes {
            // rxe (Linux 6.1), a few link-down drills in a hundred: the QP,
            // reset and reconnected, flushes its first requests with no
            // completion naming a cause (and did again after a second
            // reset). A new QP recovers, as an application would do.
            self.r.fresh_qp = true;
            println!(
                "FRESH the reset QP flushed its first requests with no cause: creating a new QP"
            );
            // Nothing is in flight (`run` drained): the old QP goes empty.
            self.qp = QueuePair::with_engine(self.qp.pd(), &self.config, &engine_config())?;
            self.watcher
                .set_own_qp(self.qp.engine().raw_id(self.qp.id())?);
            self.reconnect(false)?;
            resumed_from = (self.r.attempted, self.r.verified);
            self.run(rest, true)?;
        }
        self.r.resumed = Some((
            self.r.attempted - resumed_from.0,
            self.r.verified - resumed_from.1,
        ));
        self.check_hash("the whole region")
    }

    /// Injects the scenario's fault; returns when it took effect.
    fn inject(&mut self) -> Result<Instant, BoxError> {
        let iface = self.opts.iface.as_str();
        let t = Instant::now();
        match self.opts.scenario {
            Scenario::Cut => fault::blackhole(iface)?,
            Scenario::LinkDown => fault::link(iface, false)?,
            Scenario::Kill => self.chan.send(chan::KILL, 0, 0)?,
            Scenario::BadKey => {
                // A write with a key the server never issued.
                let buf = self.arena.alloc(64)?;
                let bad = RemoteSlice::unchecked(self.remote.addr, 64, self.remote.rkey ^ 0x5a5a);
                self.qp
                    .post_send(SendRequest::new(SendOp::Write(bad), buf).tag(BAD_TAG))
                    .map_err(|e| e.error)?;
            }
            _ => {}
        }
        let now = Instant::now();
        println!(
            "FAULT injected scenario={} after_job={} in_flight={} cmd_ms={:.1}",
            self.opts.scenario.name(),
            self.next_job,
            self.qp.in_flight()?.0,
            ms(now - t)
        );
        Ok(now)
    }

    /// Keeps traffic flowing into the fault until the first error
    /// completion, checks it and its timing, then collects the flushes.
    fn until_error(&mut self, t_fault: Instant) -> Result<(), BoxError> {
        let opts = self.opts;
        let bound_ms = if opts.scenario == Scenario::BadKey {
            Some(NAK_BOUND_MS)
        } else {
            let bound = Bound::retry_exceeded(opts.timeout(), opts.retry(), opts.slack);
            self.r.nominal_ms = bound.map(|b| b.nominal_ms);
            bound.map(|b| b.bound_ms)
        };
        self.r.bound_ms = bound_ms;
        // rxe sometimes neither fails nor completes what is in flight once
        // its port went down, not even after the link is back (seen in 3 of
        // 18 runs): give link down its bound, no more; recover() then resets
        // the QP, as an application's own deadline would.
        let give_up = match (opts.scenario, bound_ms) {
            (Scenario::LinkDown, Some(b)) => t_fault + Duration::from_secs_f64(b / 1e3),
            _ => t_fault + HANG,
        };
        while !self.errored {
            self.fill(u64::MAX)?;
            let left = give_up.saturating_duration_since(Instant::now());
            if !left.is_zero() && self.pump(left)? {
                continue;
            }
            if opts.scenario == Scenario::LinkDown {
                self.r.stalled = true;
                println!(
                    "STALL no completion at all within the bound while the port is down; {} requests held",
                    self.qp.in_flight()?.0
                );
                return Ok(());
            }
            self.r.hangs += 1;
            return Err(format!("hang: no error completion {HANG:?} after the fault").into());
        }
        let (first, at) = self.r.first_error.expect("errored means an error was seen");
        let detect = ms(at - t_fault);
        self.r.detect_ms = Some(detect);
        // Everything behind the first error must come back, flushed.
        while self.qp.in_flight()?.0 > 0 {
            self.pump_or_hang(DRAIN, "draining flushed requests")?;
        }
        let expected = match opts.scenario {
            Scenario::Cut | Scenario::Kill => Some(WcStatus::RETRY_EXC_ERR),
            Scenario::BadKey => Some(WcStatus::REM_ACCESS_ERR),
            _ => None, // link down: whatever rxe maps a dead port to; reported
        };
        println!(
            "DETECT first_error={first} after_ms={detect:.1} bound_ms={} flushed={} other_errors={}",
            bound_ms.map_or("none".into(), |b| format!("{b:.0}")),
            self.r.flushed,
            self.r.errors.len().saturating_sub(1)
        );
        if first == WcStatus::WR_FLUSH_ERR {
            return Err("the first error completion was a flush, not its cause".into());
        }
        if expected.is_some_and(|e| e != first) {
            return Err(format!("first error {first}, expected {expected:?}").into());
        }
        if self.r.errors.len() > 1 {
            return Err(format!(
                "after the first error, later requests must flush; got {:?}",
                self.r.errors
            )
            .into());
        }
        match bound_ms {
            Some(b) if detect > b => {
                Err(format!("detected after {detect:.0} ms, bound {b:.0} ms").into())
            }
            None => Err("retry_cnt 7 retries forever on rxe: no bound".into()),
            _ => Ok(()),
        }
    }

    /// Undoes the fault and reconnects.
    fn recover(&mut self) -> Result<(), BoxError> {
        let iface = self.opts.iface.as_str();
        match self.opts.scenario {
            Scenario::Cut => fault::unblackhole(iface)?,
            Scenario::LinkDown => {
                let before = self.watcher.count("PORT_ACTIVE");
                fault::link(iface, true)?;
                // The port, not a timer, says when the device can send again.
                let deadline = Deadline::after(SETUP);
                if !self.watcher.wait_for("PORT_ACTIVE", before, deadline) {
                    self.r.hangs += 1;
                    return Err("hang: the port never became active again".into());
                }
            }
            _ => {}
        }
        if self.r.stalled {
            // The deadline stands in for the error rxe never raised: the
            // reset below moves the QP to ERR, which flushes what it holds.
            println!(
                "RECOVER the QP is stalled, not failed: resetting it flushes the held requests"
            );
        }
        let new_server = self.opts.scenario == Scenario::Kill;
        self.reconnect(new_server)?;
        if new_server {
            self.check_hash("the new server's fresh region")?;
        }
        Ok(())
    }

    /// Both QPs back through RESET to INIT (or, with `new_server`, a new
    /// server process), endpoints exchanged again.
    fn reconnect(&mut self, new_server: bool) -> Result<(), BoxError> {
        println!(
            "NOTE client QP state before the reset: {}",
            self.qp.query()?.state
        );
        let mut flushed = Vec::new();
        self.qp
            .reset(Deadline::after(DRAIN), |c| flushed.push(c.into_owned()))?;
        for c in flushed {
            self.complete(c);
        }
        if new_server {
            // The old server is gone with its memory; a new process answers.
            let (chan, pid) = dial(&self.host, self.opts.port, Some(self.server_pid))?;
            (self.chan, self.server_pid) = (chan, pid);
            self.shadow.fill(0);
            self.repairs.clear();
        } else {
            self.chan.send(chan::RECONNECT, 0, 0)?;
        }
        self.remote = handshake(&mut self.chan, &mut self.qp, &self.connect)?;
        self.errored = false;
        let (_, at) = self.r.first_error.expect("recovering from an error");
        let after = ms(at.elapsed());
        self.r.recover_ms = Some(after);
        println!(
            "RECOVER reconnected after_ms={after:.0} repairs={}",
            self.repairs.len()
        );
        Ok(())
    }

    /// Keeps the lanes busy until job `until` is posted; with `drain`, also
    /// until nothing is in flight. After an error, posts nothing more.
    fn run(&mut self, until: u64, drain: bool) -> Result<(), BoxError> {
        loop {
            self.fill(until)?;
            let more = !self.errored && (self.next_job < until || !self.repairs.is_empty());
            let busy = self.qp.in_flight()?.0 > 0;
            if !busy || (!drain && !more) {
                return Ok(());
            }
            self.pump_or_hang(HANG, "running")?;
        }
    }

    /// Posts a job on every free lane: pending repairs first, then new
    /// jobs while the job count is below `until`.
    fn fill(&mut self, until: u64) -> Result<(), BoxError> {
        for lane in 0..self.lanes.len() {
            if self.errored {
                return Ok(());
            }
            if self.lanes[lane].is_some() {
                continue;
            }
            let span = Range {
                start: lane * self.lane_len,
                len: self.lane_len,
            };
            let write = if let Some(i) = self
                .repairs
                .iter()
                .position(|r| r.start / self.lane_len == lane)
            {
                self.repairs.swap_remove(i)
            } else if self.next_job < until {
                self.new_write(span)
            } else {
                continue;
            };
            self.post(lane, Job::new(write, span))?;
        }
        Ok(())
    }

    /// Picks the next job's range in `span` and its distinct pattern,
    /// which goes into the shadow now (the write is about to be posted).
    fn new_write(&mut self, span: Range) -> Range {
        let job = self.next_job;
        self.next_job += 1;
        let len = op_size(&mut self.rng, job, self.opts.large_permille).min(span.len);
        let start = span.start + self.rng.below((span.len - len + 1) as u64) as usize;
        let pattern_seed = self.opts.seed ^ job.wrapping_mul(0x2545_f491_4f6c_dd1d);
        Rng::new(pattern_seed).fill(&mut self.shadow[start..start + len]);
        Range { start, len }
    }

    /// Posts a job's write and read-back as one chain (one doorbell). The
    /// read buffer starts as the complement of the expected bytes, so a
    /// byte the read failed to deliver can never pass for a right one.
    fn post(&mut self, lane: usize, job: Job) -> Result<(), BoxError> {
        let (w, r) = (job.write, job.read);
        let mut wbuf = self.arena.alloc(w.len)?;
        wbuf.as_mut_slice()?
            .copy_from_slice(&self.shadow[w.start..w.end()]);
        let mut rbuf = self.arena.alloc(r.len)?;
        for (d, s) in rbuf
            .as_mut_slice()?
            .iter_mut()
            .zip(&self.shadow[r.start..r.end()])
        {
            *d = !s;
        }
        let dst = RemoteSlice::new(&self.remote, w.start as u64, w.len as u64)?;
        let src = RemoteSlice::new(&self.remote, r.start as u64, r.len as u64)?;
        let tag = 2 * lane as u64;
        let mut chain = [
            Some(SendRequest::new(SendOp::Write(dst), wbuf).tag(tag)),
            Some(SendRequest::new(SendOp::Read(src), rbuf).tag(tag + 1)),
        ];
        self.qp.post_send_chain(&mut chain)?;
        self.lanes[lane] = Some(job);
        Ok(())
    }

    /// Sleeps until completions arrive and accounts for each; `Ok(false)`
    /// when `wait` passed without any.
    fn pump(&mut self, wait: Duration) -> Result<bool, BoxError> {
        let mut done = std::mem::take(&mut self.done);
        let waited = self
            .qp
            .wait(Deadline::after(wait), |c| done.push(c.into_owned()));
        for c in done.drain(..) {
            self.complete(c);
        }
        self.done = done;
        match waited {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == ErrorKind::TimedOut => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// As `pump`, where waiting `wait` in vain is a hang.
    fn pump_or_hang(&mut self, wait: Duration, what: &str) -> Result<(), BoxError> {
        if self.pump(wait)? {
            return Ok(());
        }
        self.r.hangs += 1;
        Err(format!("hang: no completion within {wait:?} while {what}").into())
    }

    fn complete(&mut self, mut c: Completion<ArenaBuf>) {
        self.r.attempted += 1;
        let ok = c.status == WcStatus::SUCCESS;
        if let Err(e) = c.result() {
            // Show how the crate reports the cause and its first consequence.
            let flush = e.is_flush();
            if flush && self.r.flushed == 0 || !flush && self.r.errors.is_empty() {
                println!("ERROR {e}");
            }
            if flush {
                self.r.flushed += 1;
            } else {
                self.r.errors.push(c.status);
            }
            self.r.first_error.get_or_insert((c.status, Instant::now()));
            self.errored = true;
        }
        if c.tag == BAD_TAG {
            return;
        }
        let lane = (c.tag / 2) as usize;
        let Some(job) = self.lanes[lane].as_mut() else {
            self.r.failure = Some(format!("completion for idle lane {lane}"));
            return;
        };
        if c.tag % 2 == 0 {
            // The write. A failed one may or may not have landed: rewrite it later.
            if ok {
                job.write_ok = true;
                self.r.bytes += job.write.len as u64;
            } else {
                self.repairs.push(job.write);
            }
            return;
        }
        let job = self.lanes[lane].take().expect("checked above");
        if !ok {
            return; // a flushed read verifies nothing; its write (if ok) stands
        }
        self.r.bytes += job.read.len as u64;
        let Some(buf) = c.take_buf() else {
            self.r.failure = Some("a read came back without its buffer".into());
            return;
        };
        let expected = &self.shadow[job.read.start..job.read.end()];
        match buf.as_slice() {
            Ok(got) if got == expected => {
                self.r.verified += 1 + u64::from(job.write_ok);
            }
            Ok(got) => {
                self.r.mismatches += 1;
                let at = got
                    .iter()
                    .zip(expected)
                    .position(|(a, b)| a != b)
                    .unwrap_or(0);
                println!(
                    "MISMATCH read {:?} (write {:?}): first differing byte at region offset {}",
                    job.read,
                    job.write,
                    job.read.start + at
                );
            }
            Err(e) => self.r.failure = Some(e.to_string()),
        }
    }

    /// The server hashes its whole region; it must equal the shadow's hash.
    fn check_hash(&mut self, what: &str) -> Result<(), BoxError> {
        let mut digest = Digest::new();
        digest.update(&self.shadow);
        self.chan.send(chan::HASH, 0, self.shadow.len() as u64)?;
        let (theirs, _) = self
            .chan
            .expect(chan::HASHED, Deadline::after(Duration::from_secs(30)))?;
        let ok = theirs == digest.value();
        self.r.hash_ok = Some(self.r.hash_ok.unwrap_or(true) && ok);
        println!(
            "VERIFY {what}: server hash {theirs:#018x}, expected {:#018x}: {}",
            digest.value(),
            if ok { "match" } else { "MISMATCH" }
        );
        if ok {
            Ok(())
        } else {
            Err(format!("{what}: the server's memory differs from what was written").into())
        }
    }
}

/// Connects the side channel and reads the server's hello. Retries until
/// the deadline while nobody listens, and while the process answering is
/// `not_pid`: a dying server's listener can still complete a connection
/// (then reset it), so only a hello from another process counts.
fn dial(host: &str, port: u16, not_pid: Option<u64>) -> Result<(Chan, u64), BoxError> {
    let deadline = Deadline::after(SETUP);
    loop {
        let mut chan = Chan::new(exchange::connect((host, port), deadline)?);
        match chan.expect(chan::HELLO, deadline) {
            Ok((pid, generation)) if Some(pid) != not_pid => {
                println!("NOTE connected to server pid {pid} generation {generation}");
                return Ok((chan, pid));
            }
            Ok(_) | Err(_) if !deadline.passed() => {
                std::thread::sleep(Duration::from_millis(20)); // the old process is still exiting
            }
            Ok(_) => return Err("only the old server process answered".into()),
            Err(e) => return Err(e),
        }
    }
}

/// Endpoint exchange (ours first, then the server's), connect, barrier;
/// returns the server's region.
fn handshake(
    chan: &mut Chan,
    qp: &mut Qp,
    connect: &ConnectOptions,
) -> Result<RemoteRegion, BoxError> {
    let deadline = Deadline::after(SETUP);
    let peer = chan.client_exchange(&qp.endpoint()?, deadline)?;
    let region = *peer.regions.first().ok_or("the server shared no region")?;
    qp.connect_with(&peer, connect)?;
    chan.sync(deadline)?;
    Ok(region)
}
