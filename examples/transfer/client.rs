//! The active side: builds one engine, arena and set of queue pairs per
//! plane, connects every path with its own flow label and the retry
//! policy, runs the transfer with a live progress line, then compares
//! checksums with the server and prints the figures of the run.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use verbs::exchange;
use verbs::transfer::{PathOptions, Plane, RetryPolicy, Transfer, TransferConfig, TransferOp};
use verbs::{
    Arena, ArenaBuf, ArenaConfig, Context, Deadline, Engine, EngineConfig, HostBuf,
    ProtectionDomain, QpConfig,
};

use crate::proto::{self, Checksum, Control};
use crate::{BoxError, Opts};

/// Longest the whole transfer may take: far beyond any drill case.
const TRANSFER_LIMIT: Duration = Duration::from_secs(240);
/// How often the run records (time, bytes) for the figures after a cut.
const SAMPLE: Duration = Duration::from_millis(20);

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
        qp: QpConfig {
            max_send_wr: (opts.depth * 2 + 4).max(16),
            ..QpConfig::default()
        },
        ..TransferConfig::default()
    };
    config.paths.retry.validate()?;

    let mut session =
        exchange::connect((host, opts.port), Deadline::after(Duration::from_secs(120)))?;
    let shape = ((devs.len() as u64) << 32) | opts.qps as u64;
    proto::send(&mut session, proto::SETUP, len, shape)?;
    proto::send(&mut session, proto::SETUP, u64::from(opts.read), chunk_len)?;

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
        let engine: Engine<ArenaBuf> = Engine::new(&pd, &EngineConfig::default())?;
        planes.push(engine);
        arenas.push(arena);
    }
    let mut sum = Checksum::new();
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
        for (p, arena) in arenas.iter_mut().enumerate() {
            let mut buf = arena.alloc(n as usize)?;
            if !opts.read {
                buf.write_at(0, bytes)?;
            }
            bufs[p].push(Some(buf));
        }
    }
    let source_sum = sum.value();

    // Connect every path: plane-major, the server's order.
    let qp_config = config.qp;
    let mut paths = Vec::new();
    let mut remotes = Vec::new();
    let deadline = Deadline::after(Duration::from_secs(60));
    for (p, engine) in planes.iter_mut().enumerate() {
        let mut remote = None;
        for _ in 0..opts.qps {
            let qp = engine.add_qp(&qp_config)?;
            let index = paths.len();
            let peer = session.client_exchange(&engine.endpoint(qp)?, None, deadline)?;
            remote = remote.or(peer.regions.first().copied());
            engine.connect_with(qp, &peer, &config.paths.connect_options(index))?;
            let a = engine.query(qp)?;
            println!(
                "client: path {index} {}/{} qpn {} -> {}: flow_label {:#x} traffic_class {} hop_limit {} timeout {} retry_cnt {} ({} read back)",
                devs[p], index % opts.qps, engine.qp_num(qp)?, peer.qpn, a.flow_label, a.traffic_class,
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
    let tty = std::io::stdout().is_terminal();
    let mut samples: Vec<(Instant, u64)> = Vec::with_capacity(1 << 14);
    let mut last_line = Instant::now();
    let tick = Duration::from_millis(opts.tick_ms);
    let outcome = {
        let mut control = Control {
            session: &mut session,
        };
        transfer.run(
            &mut control,
            Deadline::after(TRANSFER_LIMIT),
            Duration::from_micros(100),
            SAMPLE,
            |t| {
                samples.push((Instant::now(), t.progress().bytes));
                if last_line.elapsed() >= tick || t.progress().chunks_done == t.progress().chunks {
                    last_line = Instant::now();
                    progress_line(t, &devs, opts.qps, tty);
                }
            },
        )
    };
    if tty {
        println!();
    }
    if let Err(e) = outcome {
        progress_line(&transfer, &devs, opts.qps, false);
        return Err(e.into());
    }

    let ours = if opts.read {
        let mut sum = Checksum::new();
        for c in 0..chunks {
            let plane = transfer.placement(c).ok_or("a chunk is not done")?;
            let n = config.chunk_range(c).1 as usize;
            let buf = transfer.planes()[usize::from(plane)].bufs[c]
                .as_ref()
                .ok_or("buffer missing")?;
            buf.read_at(0, &mut scratch[..n])?;
            sum.update(&scratch[..n]);
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
    let (_, theirs, _) = proto::recv(&mut session, Duration::from_secs(120))?;
    let matched = ours == theirs && (!opts.read || ours == source_sum);
    println!(
        "checksum client={ours:#018x} server={theirs:#018x} {}",
        if matched { "match" } else { "MISMATCH" }
    );
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
    println!("{}", result_line(&transfer, opts, &samples, matched));
    Ok(matched)
}

/// One line for a person: the whole, then every path.
fn progress_line(t: &Transfer<ArenaBuf>, devs: &[String], qps: usize, tty: bool) {
    let p = t.progress();
    let mut line = format!(
        "[{:5.1}s] {:6.1}/{:.1} MiB {:3}% {:6.1} MB/s resent {:.1} MiB |",
        p.elapsed.as_secs_f64(),
        p.bytes as f64 / 1048576.0,
        p.total as f64 / 1048576.0,
        (p.bytes * 100).checked_div(p.total).unwrap_or(100),
        p.rate / 1e6,
        p.resent_bytes as f64 / 1048576.0
    );
    for (i, s) in t.paths().enumerate() {
        line.push_str(&format!(
            " {}/{} {} {:.1}",
            devs[usize::from(s.plane)],
            i % qps,
            s.state.name(),
            s.rate / 1e6
        ));
    }
    if tty {
        print!("\r\x1b[K{line}");
        let _ = std::io::stdout().flush();
    } else {
        println!("{line}");
    }
}

/// The machine-readable summary; with a cut (a `PORT_ERR` seen, or
/// `--cut-at`), the times from it.
fn result_line(
    t: &Transfer<ArenaBuf>,
    opts: &Opts,
    samples: &[(Instant, u64)],
    ok: bool,
) -> String {
    let p = t.progress();
    let (started, finished, first_failure) = t.times();
    let finished = finished.unwrap_or_else(Instant::now);
    let secs = (finished - started).as_secs_f64();
    let sum = |f: fn(&verbs::transfer::PathStats) -> u64| t.paths().map(f).sum::<u64>();
    let mut line = format!(
        "RESULT op={} bytes={} planes={} qps={} chunk_kib={} secs={:.3} mbs={:.2} resent_bytes={} failures={} readmissions={} failed_probes={} nominal_ms={} bound_ms={}",
        if opts.read { "read" } else { "write" },
        p.total,
        t.planes().len(),
        opts.qps,
        opts.chunk_kib,
        secs,
        p.total as f64 / secs / 1e6,
        p.resent_bytes,
        sum(|s| u64::from(s.failures)),
        sum(|s| u64::from(s.readmissions)),
        sum(|s| u64::from(s.failed_probes)),
        t.bound().nominal.as_millis(),
        t.bound().watchdog.as_millis(),
    );
    let port_err = (0..t.planes().len())
        .filter_map(|i| t.port_events(i).0)
        .min();
    let timer = opts.cut_at.map(|s| opts.t0 + Duration::from_secs_f64(s));
    let cut = match (port_err, timer) {
        (Some(at), _) => Some((at, "port_err")),
        (None, Some(at)) if at < finished => Some((at, "timer")),
        _ => None,
    };
    if let Some((cut, how)) = cut {
        let done_at_cut = samples
            .iter()
            .take_while(|(at, _)| *at <= cut)
            .last()
            .map_or(0, |s| s.1);
        let ms = |d: Option<Duration>| d.map_or(-1, |d| d.as_millis() as i64);
        let after = first_failure.map(|f| finished.saturating_duration_since(f));
        line.push_str(&format!(
            " cut_from={how} cut_ms={} detect_ms={} cut_to_done_ms={} done_at_cut={} after_cut_mbs={:.2}",
            ms(cut.checked_duration_since(started)),
            ms(first_failure.and_then(|f| f.checked_duration_since(cut))),
            ms(finished.checked_duration_since(cut)),
            done_at_cut,
            after.map_or(0.0, |a| (p.total - done_at_cut) as f64 / a.as_secs_f64().max(1e-9) / 1e6),
        ));
    }
    line.push_str(if ok {
        " checksum=match"
    } else {
        " checksum=MISMATCH"
    });
    line
}
