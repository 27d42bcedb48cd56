//! What one connected RC queue pair costs to set up and to keep, through
//! the crate's public API: N queue pairs on engine(s) `a`, N on engine(s)
//! `b`, pair i of one connected to pair i of the other on the same device
//! (loopback, so no exchange is timed). Timed: `add_qp` (create + INIT)
//! for all 2N, then `connect` (RTR + RTS) for all 2N. Memory: the
//! process's resident memory before the first queue pair and after the
//! last, split into anonymous pages (the heap:
//! the crate's and libibverbs' bookkeeping) and file-backed pages (the
//! provider's queues mapped from the kernel).
//!
//! `tests/softroce/qp_setup.c` does the same verbs in C, and
//! `tests/softroce/scale_compare` runs both in turn and tabulates them.
//!
//! ```text
//! qp_setup N [--send-wr S] [--recv-wr R]    (default depths: QpConfig's)
//! ```
//!
//! A completion queue must hold every completion its queue pairs' rings
//! can owe, so at the default depths (128 + 128) one CQ of rxe's largest
//! (32767) takes 127 queue pairs: the engines (one CQ each) are as many
//! as that needs, created before the memory baseline. The C program makes
//! the same number of CQs of the same depth.

use std::time::Instant;

use verbs::{Engine, EngineConfig, MemoryRegion, ProtectionDomain, QpConfig, QpId};

/// Resident memory in KiB, from /proc/self/smaps_rollup: the kernel
/// walks the page tables for it, so it is exact (/proc/self/status's
/// counters lag behind on a 6.1 kernel, which batches them per thread).
#[derive(Clone, Copy)]
struct Resident {
    anon: u64,
    file: u64,
}

fn resident() -> Resident {
    let path = "/proc/self/smaps_rollup";
    let text = std::fs::read_to_string(path).expect("read /proc/self/smaps_rollup");
    let field = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} in {path}"))
    };
    let (rss, anon) = (field("Rss:"), field("Anonymous:"));
    Resident {
        anon,
        file: rss.saturating_sub(anon),
    }
}

fn usage() -> ! {
    eprintln!("usage: qp_setup N [--send-wr S] [--recv-wr R]");
    std::process::exit(2)
}

fn main() -> Result<(), verbs::Error> {
    let mut args = std::env::args().skip(1);
    let n: usize = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| usage());
    let mut config = QpConfig::default();
    while let Some(flag) = args.next() {
        let value: u32 = args
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| usage());
        match flag.as_str() {
            "--send-wr" => config.max_send_wr = value,
            "--recv-wr" => config.max_recv_wr = value,
            _ => usage(),
        }
    }
    let ctx = verbs::Context::open(None)?;
    let pd = ProtectionDomain::new(&ctx)?;
    let per_qp = config.max_send_wr + config.max_recv_wr;
    let max_cqe = ctx.query_device()?.max_cqe();
    let per_engine = ((max_cqe / per_qp) as usize).clamp(1, n.max(1));
    let engines_per_side = n.div_ceil(per_engine);
    let engine_config = EngineConfig {
        cq_depth: Some(per_engine as u32 * per_qp),
        ..EngineConfig::default()
    };
    let side = || -> Result<Vec<Engine<MemoryRegion>>, verbs::Error> {
        (0..engines_per_side)
            .map(|_| Engine::new(&pd, &engine_config))
            .collect()
    };
    let (mut a, mut b) = (side()?, side()?);

    let before = resident();
    let started = Instant::now();
    let mut qa: Vec<QpId> = Vec::with_capacity(n);
    let mut qb: Vec<QpId> = Vec::with_capacity(n);
    for i in 0..n {
        qa.push(a[i / per_engine].add_qp(&config)?);
    }
    for i in 0..n {
        qb.push(b[i / per_engine].add_qp(&config)?);
    }
    let created = started.elapsed();
    for i in 0..n {
        let (ea, eb) = (&mut a[i / per_engine], &mut b[i / per_engine]);
        let (pa, pb) = (ea.endpoint(qa[i])?, eb.endpoint(qb[i])?);
        ea.connect(qa[i], &pb)?;
        eb.connect(qb[i], &pa)?;
    }
    let total = started.elapsed();
    let after = resident();

    let qps = (2 * n) as f64;
    let us = |d: std::time::Duration| d.as_secs_f64() * 1e6 / qps;
    println!(
        "RESULT impl=rust n={n} qps={} cqs={} cq_depth={} send_wr={} recv_wr={} \
         create_init_us={:.1} rtr_rts_us={:.1} setup_us={:.1} \
         anon_kib={:.2} file_kib={:.2} rss_kib={:.2}",
        2 * n,
        2 * engines_per_side,
        engine_config.cq_depth.unwrap_or(0),
        config.max_send_wr,
        config.max_recv_wr,
        us(created),
        us(total - created),
        us(total),
        after.anon.saturating_sub(before.anon) as f64 / qps,
        after.file.saturating_sub(before.file) as f64 / qps,
        (after.anon + after.file).saturating_sub(before.anon + before.file) as f64 / qps,
    );
    eprintln!("qp_setup: device max_cqe {max_cqe}, {per_engine} queue pairs per engine");
    Ok(())
}
