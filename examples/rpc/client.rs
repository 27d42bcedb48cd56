//! The load generator: closed-loop connections (one request out each),
//! every one a queue pair on one engine, stepped through load levels in
//! step with the other client nodes; and the checks of what the server
//! answers to bad requests. Over RC, or over UD (`--ud`): one datagram
//! queue pair per connection, each request addressed to the server's.

use std::time::{Duration, Instant};

use verbs::exchange::connect_and_exchange;
use verbs::{
    Access, Arena, ArenaBuf, ConnectOptions, Context, Deadline, Engine, EngineConfig, HostBuf,
    Local, ProtectionDomain, QpConfig, QpId, RecvRequest, SendOp, SendRequest, Transport, UdDest,
    WcStatus, DEFAULT_QKEY, GRH_LEN,
};

use crate::barrier::Barrier;
use crate::clock::{ticks, Clock};
use crate::nap::Nap;
use crate::proto::{Header, Op, Status, HEADER};
use crate::stats::Histogram;
use crate::{BoxError, Opts};

/// Send buffers per connection: a response can overtake the completion
/// of the request it answers.
const SPARES: usize = 2;

pub(crate) struct Conn {
    pub(crate) qp: QpId,
    /// The server's queue pair, for a datagram connection.
    dest: Option<UdDest>,
    spare: [Option<ArenaBuf>; SPARES],
    waiting: bool,
    next_id: u64,
    /// `ticks()` when the request out was posted.
    sent_at: u64,
    alive: bool,
}

pub(crate) struct Client {
    pub(crate) engine: Engine<ArenaBuf>,
    arena: Arena,
    pub(crate) conns: Vec<Conn>,
    /// Connection of each engine queue-pair index.
    by_index: Vec<usize>,
    buf_len: usize,
    /// Datagrams: responses arrive after the GRH, and some get lost.
    pub(crate) ud: bool,
    /// Datagram requests sent again after going unanswered.
    lost: u64,
}

pub fn run(opts: &Opts) -> Result<bool, BoxError> {
    let ctx = Context::open(opts.dev.as_deref())?;
    let pd = ProtectionDomain::new(&ctx)?;
    let most = opts.sweep.iter().copied().max().unwrap_or(1) as usize;
    let most = most.max(opts.rnr).max(1);
    let buf_len = GRH_LEN + HEADER + opts.size.max(opts.max_payload as usize + 1);
    let buffers = most * (SPARES + 1) + 8;
    let arena = crate::arena(&pd, buffers, buf_len)?;
    let engine = Engine::new(
        &pd,
        &EngineConfig {
            cq_depth: Some((most * (SPARES + 1)) as u32 + 16),
            events: opts.sleep_after > 0,
            ..EngineConfig::default()
        },
    )?;
    let mut c = Client {
        engine,
        arena,
        conns: Vec::new(),
        by_index: Vec::new(),
        buf_len,
        ud: opts.ud,
        lost: 0,
    };
    let server = (opts.host.as_str(), opts.port);
    if opts.bad {
        return crate::refusals::bad_requests(&mut c, server, opts);
    }
    if opts.rnr > 0 {
        return crate::probes::never_receiving(&mut c, server, opts.rnr);
    }
    if opts.hellos > 0 {
        return crate::probes::made_up_peers(server, opts.hellos);
    }
    let clock = Clock::calibrate(Duration::from_millis(100));
    if opts.rank == 0 {
        println!("client: timestamps: {}", clock.source());
    }
    let mut barrier = Barrier::join(opts.rank, opts.nodes, &opts.leader, opts.port + 1)?;
    let mut ok = true;
    let mut rows = Vec::new();
    for &total in &opts.sweep {
        let total = total as usize;
        let mine = total / opts.nodes + usize::from(opts.rank < total % opts.nodes);
        for _ in 0..mine {
            c.open(server)?;
        }
        barrier.wait()?;
        let (mut h, mut errors) = c.load(opts, &clock)?;
        c.close_all()?;
        if barrier.gather(&mut h, &mut errors)? {
            let rate = h.total as f64 / opts.seconds as f64;
            let us = |q| h.quantile(q) as f64 / 1000.0;
            let row = format!(
                "RESULT conns={total} nodes={} size={} requests={} rate={rate:.0} p50_us={:.2} p99_us={:.2} p999_us={:.2} errors={errors}",
                opts.nodes,
                opts.size,
                h.total,
                us(0.5),
                us(0.99),
                us(0.999)
            );
            println!("{row}");
            rows.push(row);
        }
        ok &= errors == 0;
        if c.ud {
            println!(
                "client: rank {}: {} datagram requests sent again after 500 ms unanswered",
                opts.rank, c.lost
            );
        }
    }
    if opts.stop && opts.rank == 0 {
        c.open(server)?;
        let h = c.call(0, &Header::new(Op::STOP, Status::OK, 0, 1).encode())?;
        println!("client: asked the server to stop: {}", h.status.name());
        ok &= h.status == Status::OK;
    }
    Ok(ok)
}

impl Client {
    /// One more connection to the server, its receive posted.
    pub(crate) fn open(&mut self, server: (&str, u16)) -> Result<(), BoxError> {
        let timer = ConnectOptions::default().min_rnr_timer;
        self.open_as(server, true, timer)
    }

    /// One more connection, its receive posted only when `receive` (one
    /// that never posts any is a probe's), asking a sender that finds no
    /// receive to wait RNR timer code `rnr_timer` before trying again.
    pub(crate) fn open_as(
        &mut self,
        server: (&str, u16),
        receive: bool,
        rnr_timer: u8,
    ) -> Result<(), BoxError> {
        let qp = self.engine.add_qp(&QpConfig {
            transport: if self.ud {
                Transport::Ud
            } else {
                Transport::Rc
            },
            max_send_wr: SPARES as u32,
            max_recv_wr: 1,
            // The server's keepalive, a zero-length RDMA Write; no memory
            // of ours allows remote writes, so it is all a server can do.
            remote_access: if self.ud {
                Access::EMPTY
            } else {
                Access::REMOTE_WRITE
            },
            ..QpConfig::default()
        })?;
        let ours = self.engine.endpoint(qp)?;
        let (_session, theirs) = connect_and_exchange(
            server,
            &ours,
            None,
            Deadline::after(Duration::from_secs(30)),
        )?;
        // A datagram queue pair has no peer: each request names the
        // server's queue pair through an address handle to its port.
        let dest = if self.ud {
            self.engine.ready_ud(qp)?;
            let ah = self.engine.create_ah(qp, theirs.gid, theirs.lid)?;
            Some(UdDest {
                ah,
                qpn: theirs.qpn,
                qkey: DEFAULT_QKEY,
            })
        } else {
            let opts = ConnectOptions {
                retry_cnt: 3,
                min_rnr_timer: rnr_timer,
                ..ConnectOptions::default()
            };
            self.engine.connect_with(qp, &theirs, &opts)?;
            None
        };
        if receive {
            let recv = self.arena.alloc(self.buf_len)?;
            self.engine
                .post_recv(qp, RecvRequest::new(recv))
                .map_err(|e| e.error)?;
        }
        let mut spare = [None, None];
        for s in &mut spare {
            let mut buf = self.arena.alloc(self.buf_len)?;
            buf.write_at(HEADER, &vec![0xA5; self.buf_len - HEADER])?;
            *s = Some(buf);
        }
        if self.by_index.len() <= qp.index() {
            self.by_index.resize(qp.index() + 1, usize::MAX);
        }
        self.by_index[qp.index()] = self.conns.len();
        self.conns.push(Conn {
            qp,
            dest,
            spare,
            waiting: false,
            next_id: 1,
            sent_at: 0,
            alive: true,
        });
        Ok(())
    }

    /// Posts a receive on connection `i`.
    pub(crate) fn post_receive(&mut self, i: usize) -> Result<(), BoxError> {
        let recv = self.arena.alloc(self.buf_len)?;
        self.engine
            .post_recv(self.conns[i].qp, RecvRequest::new(recv))
            .map_err(|e| e.error)?;
        Ok(())
    }

    /// False once a request on connection `i` failed.
    pub(crate) fn is_alive(&self, i: usize) -> bool {
        self.conns[i].alive
    }

    fn close_all(&mut self) -> Result<(), BoxError> {
        for conn in self.conns.drain(..) {
            // Drops whatever the queue pair still holds, the device done with it.
            self.engine.remove_qp(conn.qp)?;
        }
        Ok(())
    }

    /// Sends connection `i`'s next request of `len` payload bytes (`bytes`
    /// instead, as they are, when given). False when no buffer is back yet.
    pub(crate) fn send(
        &mut self,
        i: usize,
        op: Op,
        len: usize,
        bytes: Option<&[u8]>,
    ) -> Result<bool, BoxError> {
        let conn = &mut self.conns[i];
        let Some(mut buf) = conn.spare.iter_mut().find_map(Option::take) else {
            return Ok(false);
        };
        let id = conn.next_id;
        let n = match bytes {
            Some(b) => {
                buf.write_at(0, b)?;
                b.len()
            }
            None => {
                buf.write_at(0, &Header::new(op, Status::OK, len as u32, id).encode())?;
                let tag = id.to_le_bytes();
                buf.write_at(HEADER, &tag[..len.min(8)])?;
                HEADER + len
            }
        };
        let req = SendRequest::new(SendOp::Send, Local::range(buf, 0, n).map_err(|(e, _)| e)?);
        match &conn.dest {
            Some(dest) => self.engine.post_ud_send(conn.qp, dest, req),
            None => self.engine.post_send(conn.qp, req),
        }
        .map_err(|e| e.error)?;
        conn.next_id += 1;
        conn.waiting = true;
        conn.sent_at = ticks();
        Ok(true)
    }

    /// Polls once: send buffers back to their connections, responses
    /// checked and handed to `on_response` (connection, header, payload
    /// head, latency), receives posted again.
    pub(crate) fn poll(
        &mut self,
        mut on_response: impl FnMut(usize, u64, Option<Header>, [u8; 8], u64),
        errors: &mut u64,
    ) -> Result<usize, BoxError> {
        let Client {
            engine,
            conns,
            by_index,
            ..
        } = self;
        let mut back: [Option<(QpId, ArenaBuf)>; 16] = Default::default();
        let mut n_back = 0;
        let got = engine.poll(|mut c| {
            let Some(i) = c.qp().and_then(|q| by_index.get(q.index()).copied()) else {
                return;
            };
            let Some(conn) = conns.get_mut(i) else { return };
            let buf = c.take_buf();
            if c.status() != WcStatus::SUCCESS {
                if conn.alive {
                    eprintln!("client: connection {i} failed: {:?}", c.result().err());
                    *errors += 1;
                }
                conn.alive = false;
                conn.waiting = false;
                return;
            }
            let Some(buf) = buf else { return };
            if !c.is_recv() {
                if let Some(s) = conn.spare.iter_mut().find(|s| s.is_none()) {
                    *s = Some(buf);
                }
                return;
            }
            let latency = ticks().wrapping_sub(conn.sent_at);
            let mut raw = [0u8; HEADER];
            let mut head = [0u8; 8];
            let at = c.payload_offset();
            let header = (c.byte_len() as usize >= at + HEADER
                && buf.read_at(at, &mut raw).is_ok())
            .then(|| Header::decode(&raw));
            let _ = buf.read_at(at + HEADER, &mut head);
            let want = conn.next_id - 1;
            // A datagram answer to a request sent again since: late, not
            // wrong (id 0 answers a request too malformed to have one).
            let stale = conn.dest.is_some() && header.is_some_and(|h| h.id != 0 && h.id < want);
            if !stale {
                conn.waiting = false;
                on_response(i, want, header, head, latency);
            }
            if n_back < back.len() {
                back[n_back] = Some((conn.qp, buf));
                n_back += 1;
            }
        })?;
        for (qp, buf) in back.iter_mut().filter_map(Option::take) {
            engine
                .post_recv(qp, RecvRequest::new(buf))
                .map_err(|e| e.error)?;
        }
        Ok(got)
    }

    /// One load level: every connection keeps one request out for the
    /// warm-up and `opts.seconds`; latencies after the warm-up are kept.
    /// A node with no connection at this level sleeps through it (a
    /// spinning idle guest would take a core from the others).
    fn load(&mut self, opts: &Opts, clock: &Clock) -> Result<(Histogram, u64), BoxError> {
        let mut h = Histogram::new();
        let mut errors = 0;
        let mut failed = 0;
        let warm_up = Duration::from_millis(300);
        if self.conns.is_empty() {
            std::thread::sleep(warm_up + Duration::from_secs(opts.seconds));
            return Ok((h, 0));
        }
        let t0 = ticks();
        let measure_from = t0 + clock.ticks_in(warm_up);
        let end = measure_from + clock.ticks_in(Duration::from_secs(opts.seconds));
        let grace = clock.ticks_in(Duration::from_secs(5));
        let mut ready: Vec<usize> = (0..self.conns.len()).collect();
        let mut answered = Vec::with_capacity(self.conns.len());
        let mut overdue = Vec::with_capacity(self.conns.len());
        let (size, op) = (opts.size, opts.op);
        let mut sending = true;
        let mut nap = Nap::new(opts.sleep_after, Duration::from_millis(10));
        let resend = clock.ticks_in(Duration::from_millis(500));
        let mut sweeps = 0u32;
        loop {
            let now = ticks();
            if now >= end {
                sending = false;
            }
            if sending {
                let mut k = 0;
                while k < ready.len() {
                    if self.send(ready[k], op, size, None)? {
                        ready.swap_remove(k);
                    } else {
                        k += 1;
                    }
                }
            } else if !self.conns.iter().any(|c| c.waiting && c.alive) {
                break;
            } else if now >= end + grace {
                errors += 1;
                eprintln!("client: responses still missing 5 s after the level ended");
                break;
            }
            let got = self.poll(
                |i, want, header, head, latency| {
                    if !response_ok(header, head, want, size, op) {
                        errors += 1;
                        if errors <= 5 {
                            eprintln!("client: connection {i}: wrong response to request {want}: {header:?}");
                        }
                    } else if now >= measure_from {
                        h.record((clock.us(latency) * 1000.0) as u64);
                    }
                    answered.push(i);
                },
                &mut failed,
            )?;
            for i in answered.drain(..) {
                if self.conns[i].alive {
                    ready.push(i);
                }
            }
            // Datagrams get lost: a request unanswered for 500 ms is sent
            // again (the service is idempotent), now and then looked for.
            // Also after the level's end: an answer is still owed.
            sweeps = sweeps.wrapping_add(1);
            if self.ud && sweeps % 1024 == 0 {
                overdue.extend(self.conns.iter().enumerate().filter_map(|(i, c)| {
                    (c.waiting && c.alive && now.wrapping_sub(c.sent_at) > resend).then_some(i)
                }));
                for i in overdue.drain(..) {
                    // Without a send buffer back yet, the next look tries again.
                    if self.send(i, op, size, None)? {
                        self.lost += 1;
                    }
                }
            }
            nap.after_poll(&self.engine, got)?;
        }
        Ok((h, errors + failed))
    }

    /// Sends `bytes` on connection `i` and waits for the response's header.
    pub(crate) fn call(&mut self, i: usize, bytes: &[u8]) -> Result<Header, BoxError> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.send(i, Op(0), 0, Some(bytes))? {
            self.poll(|_, _, _, _, _| {}, &mut 0)?;
        }
        let mut got = None;
        let mut errors = 0;
        while got.is_none() {
            if Instant::now() > deadline || errors > 0 {
                return Err("no response from the server".into());
            }
            self.poll(|_, _, h, _, _| got = Some(h), &mut errors)?;
        }
        got.flatten()
            .ok_or_else(|| "a response shorter than a header".into())
    }
}

fn response_ok(header: Option<Header>, head: [u8; 8], id: u64, size: usize, op: Op) -> bool {
    let Some(h) = header else { return false };
    let mut want = id.to_le_bytes();
    if op == Op::INVERT {
        want = want.map(|b| !b);
    }
    let n = size.min(8);
    h.magic == crate::proto::MAGIC
        && h.status == Status::OK
        && h.id == id
        && h.len as usize == size
        && head[..n] == want[..n]
}
