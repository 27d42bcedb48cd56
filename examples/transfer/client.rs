//! The active side: builds one engine, arena and set of queue pairs per
//! plane, connects every path with its own flow label and the retry
//! policy, runs the transfer with a live progress line, then compares
//! checksums with the server and prints the figures of the run.

use std::io::{IsTerminal, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use verbs::exchange;
use verbs::transfer::{
    PathOptions, PathState, Plane, PlaneEngine, RetryPolicy, Transfer, TransferConfig, TransferOp,
};
use verbs::{
    Arena, ArenaBuf, ArenaConfig, Context, Deadline, EngineConfig, HostBuf, ProtectionDomain,
    QpConfig,
};

use crate::proto::{self, Checksum, Control};
use crate::report::{progress_line, result_line, Failed, Sample, Trigger};
use crate::{BoxError, Opts};

/// Longest the whole transfer may take: far beyond any drill case.
const TRANSFER_LIMIT: Duration = Duration::from_secs(240);
/// How often the run records its bytes (for the figures after a cut) and
/// checks whether `--at-half` is due.
const SAMPLE: Duration = Duration::from_millis(5);

pub fn run(opts: &Opts, host: &str) -> Result<bool, BoxError> {
    let source = match &opts.file {
        Some(path) => Some(std::fs::read(path)?),
        None => None,
    };
    let len = source.as_ref().map_or(opts.mib << 20, |s| s.len() as u64);
    let chunk_len = opts.chunk_kib << 10;
    let available = match &opts.devs {
        Some(list) => list.len(),
        None => verbs::devices()?.len(),
    };
    let devs = crate::devices(&opts.devs, opts.planes.unwrap_or(available))?;
    let config = TransferConfig {
        op: if opts.read {
            TransferOp::Read
        } else {
            TransferOp::Write
        },
        len,
        chunk_len,
        depth: opts.depth,
        paths: PathOptions {
            retry: RetryPolicy {
                timeout: opts.timeout,
                retry_cnt: opts.retry,
                slack: opts.slack,
            },
            traffic_class: opts.traffic_class,
            hop_limit: opts.hop_limit,
            ..PathOptions::default()
        },
        readmit: opts.readmit,
        trace: if opts.trace { 1 << 16 } else { 0 },
        qp: QpConfig {
            max_send_wr: (opts.depth * 2 + 4).max(16),
            ..QpConfig::default()
        },
        ..TransferConfig::default()
    };
    config.paths.retry.validate()?;

    // Every plane gets its own copy of every chunk (registered memory is
    // per device); the checksum of the source is taken on the way.
    let chunks = config.chunks();
    let mut planes = Vec::new();
    // Declared before the transfer, so dropped after it: an arena dropped
    // while its buffers live leaks its registration.
    let mut arenas = Vec::new();
    for dev in &devs {
        let ctx = Context::open(Some(dev))?;
        let pd = ProtectionDomain::new(&ctx)?;
        let arena = Arena::new(
            &pd,
            &ArenaConfig {
                capacity: len as usize + chunks * 4096 + (1 << 20),
                max_buffers: chunks as u32 + 16,
                ..ArenaConfig::default()
            },
        )?;
        let engine: PlaneEngine<ArenaBuf> = PlaneEngine::new(&pd, &EngineConfig::default())?;
        planes.push(engine);
        arenas.push(arena);
    }
    let mut sum = Checksum::new();
    let mut chunk_sums = Vec::with_capacity(chunks);
    let mut scratch = vec![0u8; chunk_len as usize];
    let mut bufs: Vec<Vec<Option<ArenaBuf>>> = (0..devs.len()).map(|_| Vec::new()).collect();
    for c in 0..chunks {
        let (offset, n) = config.chunk_range(c);
        let bytes: &[u8] = match &source {
            Some(s) => &s[offset as usize..(offset + n) as usize],
            None => {
                proto::generate(offset, &mut scratch[..n as usize]);
                &scratch[..n as usize]
            }
        };
        sum.update(bytes);
        chunk_sums.push(chunk_sum(bytes));
        for (p, arena) in arenas.iter_mut().enumerate() {
            let mut buf = arena.alloc(n as usize)?;
            if !opts.read {
                buf.write_at(0, bytes)?;
            }
            bufs[p].push(Some(buf));
        }
    }
    let source_sum = sum.value();

    // Where a drill that hangs at its start got to.
    println!("client: connecting to {host}:{}", opts.port);
    let mut session =
        exchange::connect((host, opts.port), Deadline::after(Duration::from_secs(120)))?;
    println!(
        "client: connected after {:.2} s",
        opts.t0.elapsed().as_secs_f64()
    );
    // Connect every path: plane-major, the server's order. The first
    // hello carries the token, and the setup rides right behind it: the
    // server judges both before it registers or reveals anything.
    let qp_config = config.qp;
    let mut paths = Vec::new();
    let mut remotes = Vec::new();
    let deadline = Deadline::after(Duration::from_secs(60));
    for (p, engine) in planes.iter_mut().enumerate() {
        let mut remote = None;
        for _ in 0..opts.qps {
            let qp = engine.add_qp(&qp_config)?;
            let index = paths.len();
            let ours = engine.endpoint(qp)?;
            let peer = if index == 0 {
                session.send_hello(&ours, opts.token.as_ref(), deadline)?;
                let shape = ((devs.len() as u64) << 32) | opts.qps as u64;
                proto::send(&mut session, proto::SETUP, len, shape)?;
                proto::send(&mut session, proto::SETUP, u64::from(opts.read), chunk_len)?;
                session.read_reply(deadline)?
            } else {
                session.client_exchange(&ours, None, deadline)?
            };
            remote = remote.or(peer.regions.first().copied());
            proto::connect_retrying(deadline, || {
                engine.connect_with(qp, &peer, &config.paths.connect_options(index))
            })?;
            let a = engine.query(qp)?;
            let psn = engine.endpoint(qp)?.psn;
            println!(
                "client: path {index} {}/{} qpn {} psn {psn:#x} -> qpn {} psn {:#x}: flow_label {:#x} traffic_class {} hop_limit {} timeout {} retry_cnt {} ({} read back)",
                devs[p], index % opts.qps, engine.qp_num(qp)?, peer.qpn, peer.psn, a.flow_label, a.traffic_class,
                a.hop_limit, a.timeout, a.retry_cnt,
                if a.flow_label == config.paths.flow_label(index) { "as set," } else { "DIFFERENT," },
            );
            paths.push((p as u16, qp));
        }
        remotes.push(remote.ok_or("the server shared no region")?);
    }
    session.sync(deadline)?;
    let setup = opts.t0.elapsed();
    let planes: Vec<Plane<ArenaBuf>> = planes
        .into_iter()
        .zip(bufs)
        .zip(remotes)
        .map(|((engine, bufs), remote)| Plane {
            engine,
            port: 1,
            bufs,
            remote,
        })
        .collect();

    if let Some(at) = opts.start_at {
        let at = Duration::from_secs_f64(at);
        match at.checked_sub(setup) {
            Some(wait) => std::thread::sleep(wait),
            None => println!(
                "client: set-up took {:.2} s, past --start-at",
                setup.as_secs_f64()
            ),
        }
    }
    let mut transfer = Transfer::new(planes, &paths, config)?;
    let bound = transfer.bound();
    println!(
        "client: {} MiB {} over {} planes x {} queue pairs, chunks of {} KiB, {} in flight per path; set-up {:.2} s; detection bound {} ms (device nominal {} ms)",
        len >> 20,
        if opts.read { "read" } else { "written" },
        devs.len(),
        opts.qps,
        opts.chunk_kib,
        opts.depth,
        setup.as_secs_f64(),
        bound.watchdog.as_millis(),
        bound.nominal.as_millis()
    );
    // Started now, waiting on its stdin: starting a program in a busy
    // guest takes a second or more, which at half way would move the cut.
    let mut at_half = match &opts.at_half {
        Some(cmd) => Some(half_command(cmd)?),
        None => None,
    };
    let mut trigger: Trigger = None;
    let mut failed: Failed = vec![None; paths.len()];
    let mut failures_then: Vec<u32> = Vec::new();
    let tty = std::io::stdout().is_terminal();
    let mut samples: Vec<Sample> = Vec::with_capacity(1 << 16);
    let mut last_line = Instant::now();
    let tick = Duration::from_millis(opts.tick_ms);
    let (mut churn_at, churn_every) = match opts.fail_every {
        0 => (u64::MAX, 0),
        mib => (mib << 20, mib << 20),
    };
    let outcome: Result<(), verbs::Error> = {
        let mut control = Control {
            session: &mut session,
        };
        let deadline = Deadline::after(TRANSFER_LIMIT);
        let mut last_sample = Instant::now();
        loop {
            let step = match transfer.step(&mut control) {
                Ok(s) => s,
                Err(e) => break Err(e),
            };
            let t = &transfer;
            if last_sample.elapsed() >= SAMPLE || step.done {
                last_sample = Instant::now();
                let sample = Sample::of(t);
                if trigger.is_none() && sample.bytes * 2 >= t.progress().total {
                    if let Some(child) = at_half.as_mut() {
                        if let Some(mut stdin) = child.stdin.take() {
                            let _ = stdin.write_all(b"half\n");
                        }
                        trigger = Some((sample.at, sample.bytes));
                        failures_then = t.paths().map(|s| s.failures).collect();
                    }
                }
                if samples.len() < samples.capacity() {
                    samples.push(sample);
                }
                if last_line.elapsed() >= tick || step.done {
                    last_line = Instant::now();
                    progress_line(t, &devs, opts.qps, tty);
                }
            }
            if trigger.is_some() {
                for ((f, s), then) in failed.iter_mut().zip(t.paths()).zip(&failures_then) {
                    if f.is_none() && s.failures > *then {
                        *f = Some(Instant::now());
                    }
                }
            }
            if step.done {
                break Ok(());
            }
            if t.progress().bytes >= churn_at {
                churn_at += churn_every;
                // The busiest live path: its writes are on the wire.
                let victim = t
                    .paths()
                    .enumerate()
                    .filter(|(_, s)| s.state == PathState::Up)
                    .max_by_key(|(_, s)| s.in_flight)
                    .map(|(i, _)| i);
                if let Some(v) = victim {
                    transfer.fail_path(v);
                }
            }
            if deadline.passed() {
                break Err(verbs::Error::new(
                    verbs::site!("transfer client", "the transfer took too long"),
                    verbs::ErrorKind::TimedOut,
                ));
            }
            if step.events == 0 {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    };
    if tty {
        println!();
    }
    if let Err(e) = outcome {
        progress_line(&transfer, &devs, opts.qps, false);
        return Err(e.into());
    }

    // Per chunk as well as in all, end to end: a completion says the
    // device is done, not that the bytes are right. Differing chunks are
    // named (a lead), sent again and checked again, a few rounds at most.
    let mut repaired = 0u64;
    let mut round = 0;
    let (ours, theirs, bad_chunks) = loop {
        let mut bad: Vec<u32> = Vec::new();
        let ours = if opts.read {
            let mut sum = Checksum::new();
            for (c, &expected) in chunk_sums.iter().enumerate() {
                let plane = transfer.placement(c).ok_or("a chunk is not done")?;
                let n = config.chunk_range(c).1 as usize;
                let buf = transfer.planes()[usize::from(plane)].bufs[c]
                    .as_ref()
                    .ok_or("buffer missing")?;
                buf.read_at(0, &mut scratch[..n])?;
                sum.update(&scratch[..n]);
                if chunk_sum(&scratch[..n]) != expected {
                    bad.push(c as u32);
                }
            }
            sum.value()
        } else {
            source_sum
        };
        let placement: Vec<u8> = (0..chunks)
            .map(|c| transfer.placement(c).map_or(u8::MAX, |p| p as u8))
            .collect();
        proto::send(&mut session, proto::DONE, ours, 0)?;
        proto::send_bytes(&mut session, &placement)?;
        let sums: Vec<u8> = chunk_sums.iter().flat_map(|s| s.to_le_bytes()).collect();
        proto::send_bytes(&mut session, &sums)?;
        let (_, theirs, their_bad) = proto::recv(&mut session, Duration::from_secs(120))?;
        let mut named = vec![0u8; 4 * their_bad.min(proto::BAD_NAMED) as usize];
        proto::recv_bytes(&mut session, &mut named)?;
        bad.extend(
            named
                .chunks(4)
                .map(|b| u32::from_le_bytes(b.try_into().unwrap())),
        );
        let bad_chunks = their_bad + if opts.read { bad.len() as u64 } else { 0 };
        for &c in &bad {
            let c = c as usize;
            let by = transfer.done_by(c).map(usize::from);
            let path = by.and_then(|i| transfer.paths().nth(i));
            println!(
                "client: chunk {c} BAD: placed on plane {:?}, posted {} times, completed by path {by:?} ({} failures, {} re-admissions, {:?} now)",
                transfer.placement(c),
                transfer.posts(c),
                path.map_or(0, |p| p.failures),
                path.map_or(0, |p| p.readmissions),
                path.map(|p| p.state),
            );
        }
        if bad_chunks == 0 || round == proto::REPAIR_ROUNDS {
            break (ours, theirs, bad_chunks);
        }
        round += 1;
        for &c in &bad {
            repaired += u64::from(transfer.redo(c as usize));
        }
        println!(
            "client: repair round {round}: {} chunks sent again",
            bad.len()
        );
        let mut control = Control {
            session: &mut session,
        };
        let deadline = Deadline::after(TRANSFER_LIMIT);
        while !transfer.step(&mut control)?.done {
            if deadline.passed() {
                return Err("the repair took too long".into());
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    };
    let matched = ours == theirs && (!opts.read || ours == source_sum) && bad_chunks == 0;
    println!(
        "checksum client={ours:#018x} server={theirs:#018x} {}, {bad_chunks} chunks differ, {repaired} repaired",
        if matched { "match" } else { "MISMATCH" }
    );
    if let Some(child) = at_half.take() {
        finish(child, trigger.is_some());
    }
    for (i, s) in transfer.paths().enumerate() {
        println!(
            "path {i} {}/{}: {} {:.1} MiB in {} chunks ({} resent), {} failures ({}), {} re-admitted, {} failed probes",
            devs[usize::from(s.plane)],
            i % opts.qps,
            s.state.name(),
            s.bytes as f64 / 1048576.0,
            s.chunks,
            s.resent_chunks,
            s.failures,
            s.last_cause.map_or("none".into(), |c| format!("last {c:?}")),
            s.readmissions,
            s.failed_probes
        );
    }
    if opts.trace {
        let (events, dropped) = transfer.trace();
        for e in events {
            println!("trace {e}");
        }
        println!("trace: {} events, {dropped} dropped", events.len());
    }
    println!(
        "{}",
        result_line(
            &transfer,
            opts,
            &samples,
            trigger,
            &failed,
            (bad_chunks, repaired),
            matched
        )
    );
    Ok(matched)
}

/// One chunk's checksum, as the server computes it.
fn chunk_sum(bytes: &[u8]) -> u64 {
    let mut sum = Checksum::new();
    sum.update(bytes);
    sum.value()
}

/// `sh -c cmd`, started now with its stdin a pipe that gets a line at
/// half way: whatever `cmd` runs then is loaded and waiting already.
fn half_command(cmd: &str) -> Result<Child, BoxError> {
    let child = Command::new("sh")
        .args(["-c", cmd])
        .stdin(Stdio::piped())
        .spawn()
        .map_err(|e| format!("--at-half: sh: {e}"))?;
    Ok(child)
}

/// Lets the `--at-half` command end (it may restore what it cut), or
/// stops it when it never ran or runs too long.
fn finish(mut child: Child, ran: bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while ran && Instant::now() < deadline {
        match child.try_wait() {
            Ok(Some(status)) => {
                println!("client: --at-half command ended: {status}");
                return;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(_) => break,
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    println!("client: --at-half command stopped (ran: {ran})");
}
