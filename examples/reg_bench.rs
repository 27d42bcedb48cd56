//! Carving a buffer from the arena vs registering a fresh memory region of
//! the same size (primer pitfall 6.5), side by side in one run, on a real
//! device: `tests/softroce/cargo run --release --example reg_bench`.
//!
//! Both sides get the memory already mapped: the arena carves its one
//! registration; the other side calls `ibv_reg_mr` + `ibv_dereg_mr` on a
//! page-aligned buffer each time, which is what per-buffer registration costs.

use std::time::Instant;

use verbs::{Access, Arena, ArenaConfig, Context, ProtectionDomain};

/// The largest size timed: the scratch area and the arena are sized by it.
const MAX: usize = 64 << 20;
const SIZES: [usize; 6] = [4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, MAX];

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ctx = Context::open(std::env::var("VERBS_TEST_DEVICE").ok().as_deref())?;
    let pd = ProtectionDomain::new(&ctx)?;
    let mut arena = Arena::new(
        &pd,
        &ArenaConfig {
            capacity: 2 * MAX,
            ..Default::default()
        },
    )?;
    let scratch = vec![0u8; MAX + 4096];
    let base = (scratch.as_ptr() as usize).next_multiple_of(4096) as *mut u8;
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    println!(
        "device {}; median and p99 of one acquire+release, ns",
        ctx.name()
    );
    println!(
        "{:>9} {:>12} {:>12} {:>14} {:>14} {:>10}",
        "size", "arena p50", "arena p99", "reg_mr p50", "reg_mr p99", "ratio p50"
    );
    for size in SIZES {
        // Timed in batches: one carve is far shorter than reading the clock
        // (especially under emulation), so per-op figures are batch means.
        let (batches, batch) = (200, 1000);
        let mut carve = Vec::with_capacity(batches);
        for _ in 0..batches {
            let t = Instant::now();
            for _ in 0..batch {
                let buf = arena.alloc(size)?;
                drop(std::hint::black_box(buf));
            }
            carve.push(t.elapsed().as_nanos() as f64 / batch as f64);
        }
        let reg_iters = 200;
        let mut reg = Vec::with_capacity(reg_iters);
        for _ in 0..reg_iters {
            let t = Instant::now();
            // SAFETY: `base..base+size` lies inside `scratch` (MAX + 4 KiB
            // long, `base` its first page boundary, `size` <= MAX), which
            // outlives the registration, and no work request uses it.
            let mr = unsafe {
                verbs::sys::verbs_shim_reg_mr(pd.as_raw(), base.cast(), size, access.0 as i32)
            };
            assert!(!mr.is_null(), "ibv_reg_mr failed (memlock limit?)");
            // SAFETY: registered just above, deregistered once.
            unsafe { verbs::sys::ibv_dereg_mr(mr) };
            reg.push(t.elapsed().as_nanos() as f64);
        }
        carve.sort_by(f64::total_cmp);
        reg.sort_by(f64::total_cmp);
        let (c50, c99, r50, r99) = (
            percentile(&carve, 0.5),
            percentile(&carve, 0.99),
            percentile(&reg, 0.5),
            percentile(&reg, 0.99),
        );
        println!(
            "{size:>9} {c50:>12.0} {c99:>12.0} {r50:>14.0} {r99:>14.0} {:>9.0}x",
            r50 / c50
        );
    }
    Ok(())
}
