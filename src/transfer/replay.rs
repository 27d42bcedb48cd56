//! The drill's churn and loss, replayed on the simulated device: paths
//! failed by the watchdog while their requests are in flight, requests
//! failing with an error (and the rest flushed), the device finishing
//! requests late and in any amount, flushing at once or (as rxe on a
//! starved guest) only after the transfer's reset took back what the
//! queue pair held, over many seeds. Whatever happens, a
//! chunk the transfer calls done must have had a post of it completed
//! with success on the plane its placement names: the device's own record
//! of which buffers it finished, kept here, is the ground truth.

use alloc::collections::BTreeSet;
use alloc::vec::Vec;

use crate::engine::sim::device::{Sim, SimBuf};
use crate::engine::sim::rng::Rng;
use crate::sys::ibv_wc_status as WcStatus;

use super::sim::{bed, device_qp, Peer};
use super::Transfer;

/// The device's queue pairs on plane `p` that may still complete.
fn live(t: &Transfer<SimBuf, Sim>, p: usize) -> Vec<usize> {
    let dev = &t.planes[p].engine.0.prov.dev;
    (0..dev.qps.len())
        .filter(|&q| !dev.qps[q].destroyed && !dev.qps[q].error)
        .collect()
}

/// One seeded run; returns (steps, path failures, chunks landed twice).
fn replay(seed: u64) -> (u64, u32, usize) {
    const PLANES: usize = 2;
    const CHUNKS: usize = 64;
    let mut t = bed(PLANES, 2, CHUNKS, 4);
    // Which chunk each plane's buffer is (the device names buffers).
    let ids: Vec<Vec<u64>> = t
        .planes
        .iter()
        .map(|p| p.bufs.iter().map(|b| b.as_ref().unwrap().id).collect())
        .collect();
    let mut landed: BTreeSet<(usize, usize)> = BTreeSet::new();
    let mut twice = 0;
    // Half the runs flush late, as rxe on a starved guest: a reset then
    // finds what the queue pair held unreported and takes it back itself.
    let lazy = seed % 2 == 1;
    for plane in &mut t.planes {
        plane.engine.0.prov.dev.lazy_flush = lazy;
    }
    let mut rng = Rng::new(seed);
    let mut peer = Peer { reconnects: 0 };
    let mut steps = 0;
    while !t.step(&mut peer).unwrap().done {
        steps += 1;
        assert!(steps < 100_000, "seed {seed}: no end: {:?}", t.progress());
        let p = rng.below(PLANES as u64) as usize;
        let qps = live(&t, p);
        if qps.is_empty() {
            continue;
        }
        let q = qps[rng.below(qps.len() as u64) as usize];
        match rng.below(100) {
            // The device finishes some of what it holds, oldest first.
            0..=59 => {
                let n = 1 + rng.below(4) as usize;
                let dev = &mut t.planes[p].engine.0.prov.dev;
                for held in dev.qps[q].queues[0].iter().take(n) {
                    for b in &held.bufs {
                        let c = ids[p].iter().position(|id| id == b).unwrap();
                        twice += usize::from(!landed.insert((p, c)));
                    }
                }
                dev.complete(q, false, n);
            }
            // A request fails (retries exceeded, say); the rest flush, now
            // or (lazily) not before the reset.
            60..=63 if lazy => t.planes[p]
                .engine
                .0
                .prov
                .dev
                .fail_head(q, WcStatus::RETRY_EXC_ERR),
            60..=63 => t.planes[p].engine.0.prov.dev.fail(q),
            // The watchdog fails a live path, requests in flight.
            64..=69 => {
                let path = rng.below(t.paths.len() as u64) as usize;
                if device_qp(&t, path).is_some() {
                    t.fail_path(path);
                }
            }
            _ => {}
        }
    }
    for c in 0..CHUNKS {
        let p = usize::from(t.placement(c).expect("every chunk done"));
        assert!(
            landed.contains(&(p, c)),
            "seed {seed}: chunk {c} done on plane {p}, where no post of it completed"
        );
    }
    let failures = t.paths().map(|s| s.failures).sum();
    (steps, failures, twice)
}

#[test]
fn under_churn_and_errors_a_done_chunk_has_landed_where_its_placement_says() {
    let seeds: u64 = std::env::var("VERBS_TRANSFER_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        // Under Miri a seed takes seconds: a few find what it looks for
        // (undefined behaviour), the native runs the rest.
        .unwrap_or(if cfg!(miri) { 4 } else { 200 });
    let (mut steps, mut failures, mut twice) = (0, 0, 0);
    for seed in 0..seeds {
        let (s, f, t) = replay(seed);
        steps += s;
        failures += f;
        twice += t;
    }
    println!("{seeds} runs, {steps} steps, {failures} path failures, {twice} chunks landed twice");
    assert!(failures > seeds as u32, "the replay failed paths");
}
