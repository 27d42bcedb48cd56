//! Connection churn drill (FAULTS.md): CYCLES add/connect/remove cycles of
//! two RC queue pairs on one engine (a Send carried every K-th cycle), with
//! the process's heap, descriptors and `verbs::leaked_objects()` sampled
//! as it goes; fails if any of them grew after the first tenth of the run.
//!
//! ```text
//! qp_setup_churn CYCLES [--every K]     (K: 100)
//! ```
//!
//! `tests/rdma_scale.rs` runs the same cycles, fewer of them, in CI.

mod churn;

use std::time::Instant;

use verbs::{Context, Engine, EngineConfig, MemoryRegion, ProtectionDomain};

fn usage() -> ! {
    eprintln!("usage: qp_setup_churn CYCLES [--every K]");
    std::process::exit(2)
}

fn main() -> Result<(), verbs::Error> {
    let mut args = std::env::args().skip(1);
    let cycles: u64 = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| usage());
    let every = match (args.next().as_deref(), args.next()) {
        (None, _) => 100,
        (Some("--every"), Some(k)) => k.parse().unwrap_or_else(|_| usage()),
        _ => usage(),
    };
    let ctx = Context::open(None)?;
    let pd = ProtectionDomain::new(&ctx)?;
    let mut engine: Engine<MemoryRegion> = Engine::new(
        &pd,
        &EngineConfig {
            cq_depth: Some(64),
            ..EngineConfig::default()
        },
    )?;
    let sample_every = (cycles / 20).max(1);
    let warm = cycles / 10;
    let started = Instant::now();
    let mut samples = Vec::new();
    churn::churn(&mut engine, &pd, cycles, every, sample_every, |cycle| {
        let h = churn::held();
        println!(
            "cycle {cycle}: heap {} KiB, {} descriptors, {} leaked objects, {:.1} s",
            h.anon_kib,
            h.fds,
            h.leaked,
            started.elapsed().as_secs_f64()
        );
        samples.push((cycle, h));
    })?;
    let base = samples
        .iter()
        .find(|(c, _)| *c >= warm)
        .map(|(_, h)| *h)
        .expect("a sample after the first tenth");
    let last = samples.last().expect("a sample").1;
    let secs = started.elapsed().as_secs_f64();
    println!(
        "churn: {cycles} cycles ({} queue pairs) in {secs:.0} s, {:.2} ms a cycle; \
         from cycle {warm} on: heap {:+} KiB, descriptors {:+}, leaked objects {:+}",
        2 * cycles,
        secs * 1e3 / cycles as f64,
        last.anon_kib as i64 - base.anon_kib as i64,
        last.fds as i64 - base.fds as i64,
        last.leaked as i64 - base.leaked as i64,
    );
    // The heap may move by an allocator's page or two; it must not grow
    // with the cycles.
    let flat =
        last.anon_kib <= base.anon_kib + 64 && last.fds == base.fds && last.leaked == base.leaked;
    if !flat {
        eprintln!("churn: the process kept what the cycles made");
        std::process::exit(1);
    }
    Ok(())
}
