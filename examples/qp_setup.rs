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
//! One engine per side, its completion queue as deep as the N queue pairs'
//! depths add up to, at most the device's largest (rxe: 32767): the engine
//! gates posting on its completion queue's room, so its queue pairs' depths
//! need not fit it. The C program makes one CQ per side of the same depth.
//! Both are made before the memory baseline, and each engine's first
//! queue pair added and removed (what C reads before its clock, the
//! device's limits, the port and the GID table, an engine reads with its
//! first queue pair); the engine's heap (its tables of requests in
//! flight, their first entries made, the rest reserved and touched only
//! as requests fill them) is printed apart, per engine (`engine_kib`).

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
    let per_qp = u64::from(config.max_send_wr + config.max_recv_wr);
    let max_cqe = ctx.query_device()?.max_cqe();
    let cq_depth = (per_qp * n as u64).clamp(1, u64::from(max_cqe)) as u32;
    let engine_config = EngineConfig {
        cq_depth: Some(cq_depth),
        ..EngineConfig::default()
    };
    let bare = resident();
    let mut a: Engine<MemoryRegion> = Engine::new(&pd, &engine_config)?;
    let mut b: Engine<MemoryRegion> = Engine::new(&pd, &engine_config)?;
    // What C reads before its clock (the device's limits, the port, the
    // GID table), each engine reads with its first queue pair: one is
    // added and removed before the clock. What that leaves allocated (an
    // engine's first slot, the overflow table's reservation) counts as
    // the engine's.
    for engine in [&mut a, &mut b] {
        let warm = engine.add_qp(&config)?;
        engine.remove_qp(warm)?;
    }
    let mut qa: Vec<QpId> = Vec::with_capacity(n);
    let mut qb: Vec<QpId> = Vec::with_capacity(n);

    let before = resident();
    let started = Instant::now();
    for _ in 0..n {
        qa.push(a.add_qp(&config)?);
    }
    for _ in 0..n {
        qb.push(b.add_qp(&config)?);
    }
    let created = started.elapsed();
    for (&x, &y) in qa.iter().zip(&qb) {
        let (px, py) = (a.endpoint(x)?, b.endpoint(y)?);
        a.connect(x, &py)?;
        b.connect(y, &px)?;
    }
    let total = started.elapsed();
    let after = resident();

    let qps = (2 * n) as f64;
    let us = |d: std::time::Duration| d.as_secs_f64() * 1e6 / qps;
    println!(
        "RESULT impl=rust n={n} qps={} cqs=2 cq_depth={cq_depth} send_wr={} recv_wr={} \
         create_init_us={:.1} rtr_rts_us={:.1} setup_us={:.1} \
         anon_kib={:.2} file_kib={:.2} rss_kib={:.2} engine_kib={:.1}",
        2 * n,
        config.max_send_wr,
        config.max_recv_wr,
        us(created),
        us(total - created),
        us(total),
        after.anon.saturating_sub(before.anon) as f64 / qps,
        after.file.saturating_sub(before.file) as f64 / qps,
        (after.anon + after.file).saturating_sub(before.anon + before.file) as f64 / qps,
        // The two engines and their completion queues, per engine, before
        // the clock: their tables of requests in flight, the first slot.
        before.anon.saturating_sub(bare.anon) as f64 / 2.0,
    );
    eprintln!("qp_setup: device max_cqe {max_cqe}, one engine per side, CQ depth {cq_depth}");
    Ok(())
}
