//! Micro-benchmark: the TLSF offset allocator and the arena built on it
//! against the system allocator, no dependencies.
//!
//! Run with `cargo run --release --example alloc_bench` (`--mix small`,
//! `--only Tlsf --only system`: some rows only; `--cache N`: the front
//! cache's depth for the `Cached` and `Model` rows, default the arena's).
//! Count instructions with
//! `valgrind --tool=callgrind --toggle-collect='*measure*'` (divide by
//! `STEPS`): steadier than time on a shared machine.
//!
//! Each run keeps a window of `WINDOW` live allocations and, at every step,
//! frees a randomly chosen one and allocates a replacement of a random size
//! and alignment (so the pattern is not LIFO). Every allocator replays the same
//! seeded sequence. Steps are timed in batches of `BATCH` with
//! `std::time::Instant`; a sample is the batch time divided by `BATCH`, i.e.
//! nanoseconds per free + alloc pair, and the table shows the median and p99
//! over all batches. Neither side touches the memory: the TLSF only hands out
//! offsets, and the system allocator's blocks are not written.
//!
//! Rows:
//!
//! - `Tlsf`: single owner, no lock, no atomic.
//! - `SharedTlsf`: `Tlsf` behind an uncontended mutex (feature `std`).
//! - `Tlsf+swap`: `Tlsf` plus one atomic swap per free, the older and
//!   rougher host model of what a dropped `ArenaBuf` adds.
//! - `Cached`: `Tlsf` with the arena's front cache (per exact size, a
//!   bounded LIFO of freed blocks).
//! - `Model`, `Model.free`: the arena's own allocator path without its
//!   memory (`verbs::memory::ArenaModel`): the front-cached `Tlsf` and the
//!   real return queue, so a drop is the queue's push (one swap and two
//!   stores, wait-free) and the next allocation takes it back with loads
//!   (no atomic read-modify-write) before it allocates; `Model.free` gives
//!   buffers back as `Arena::free` does. This is what an `Arena` row
//!   executes but for the buffer's fields and the memory.
//! - `Arena`, `Arena.free` (small mix only): the real arena, alloc and drop,
//!   or alloc and [`Arena::free`] (a same-thread free: no atomic at all).
//!   They need an RDMA device, since an arena registers its memory, and are
//!   skipped without one. Under `tests/softroce/cargo run --release
//!   --example alloc_bench` they run in the QEMU guest, where TCG emulation
//!   makes every row several times slower: compare them with that run's
//!   `Tlsf` row, not with a host run.
//! - `system`: `std::alloc::alloc`/`dealloc` with the same `Layout`s.

mod rows;

use std::alloc::Layout;
use std::hint::black_box;
use std::sync::atomic::AtomicU32;
use std::time::Instant;

use verbs::memory::{ArenaModel, DEFAULT_FRONT_CACHE};
#[cfg(feature = "std")]
use verbs::tlsf::SharedTlsf;
use verbs::tlsf::{Tlsf, TlsfConfig};
use verbs::{Arena, ArenaConfig, Context, ProtectionDomain};

use rows::*;

/// Live allocations kept at every step.
const WINDOW: usize = 1024;
/// Measured replace steps per run.
const STEPS: usize = 400_000;
/// Unmeasured warm-up steps before each run.
const WARMUP: usize = 50_000;
/// Steps per timed batch.
const BATCH: usize = 100;
/// The TLSF's region: offsets only, nothing is mapped.
const CAPACITY: u64 = 4 << 30;

/// splitmix64: small, seeded, deterministic.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Log-uniform in `2^lo ..= 2^hi`: each power of two range equally likely.
    fn log_uniform(&mut self, lo: u32, hi: u32) -> u64 {
        let k = lo + self.below(u64::from(hi - lo) + 1) as u32;
        let base = 1u64 << k;
        base + self.below(base)
    }
}

/// One replace step: free the allocation in `slot`, then allocate `layout`.
#[derive(Clone, Copy)]
struct Step {
    slot: usize,
    layout: Layout,
}

/// A size mix: name, log2 size range, log2 alignment range.
struct Mix {
    name: &'static str,
    size_log2: (u32, u32),
    align_log2: (u32, u32),
}

const MIXES: [Mix; 3] = [
    Mix {
        name: "small 8B-8KiB",
        size_log2: (3, 12),
        align_log2: (3, 6),
    },
    Mix {
        name: "mixed 1B-1MiB",
        size_log2: (0, 19),
        align_log2: (3, 12),
    },
    Mix {
        name: "large 64KiB-1MiB",
        size_log2: (16, 19),
        align_log2: (6, 12),
    },
];

/// The initial window and the replace steps of one mix, from a fixed seed.
fn sequence(mix: &Mix, seed: u64) -> (Vec<Layout>, Vec<Step>) {
    let mut rng = SplitMix64(seed);
    let layout = |rng: &mut SplitMix64| {
        let size = rng.log_uniform(mix.size_log2.0, mix.size_log2.1);
        let align = 1usize
            << (mix.align_log2.0
                + rng.below(u64::from(mix.align_log2.1 - mix.align_log2.0) + 1) as u32);
        Layout::from_size_align(size as usize, align).expect("valid layout")
    };
    let fill = (0..WINDOW).map(|_| layout(&mut rng)).collect();
    let steps = (0..WARMUP + STEPS)
        .map(|_| Step {
            slot: rng.below(WINDOW as u64) as usize,
            layout: layout(&mut rng),
        })
        .collect();
    (fill, steps)
}

/// Replays the sequence; returns ns per step for every measured batch,
/// sorted, and the allocator's note, if any.
fn run<B: Bench>(b: &mut B, fill: &[Layout], steps: &[Step]) -> (Vec<f64>, Option<String>) {
    let mut live: Vec<Option<(B::Token, Layout)>> =
        fill.iter().map(|&l| Some((b.alloc(l), l))).collect();
    let (warmup, measured) = steps.split_at(WARMUP);
    for s in warmup {
        let (token, layout) = live[s.slot].take().expect("a live slot");
        b.free(token, layout);
        live[s.slot] = Some((b.alloc(s.layout), s.layout));
    }
    let mut samples = Vec::with_capacity(measured.len() / BATCH + 1);
    measure(b, &mut live, measured, &mut samples);
    let note = b.note();
    for (token, layout) in live.into_iter().flatten() {
        b.free(token, layout);
    }
    samples.sort_by(f64::total_cmp);
    (samples, note)
}

/// The timed steps, kept out of line so that
/// `valgrind --tool=callgrind --toggle-collect='*measure*'` counts exactly
/// them (divide by `STEPS` for instructions per pair).
#[inline(never)]
fn measure<B: Bench>(
    b: &mut B,
    live: &mut [Option<(B::Token, Layout)>],
    measured: &[Step],
    samples: &mut Vec<f64>,
) {
    for batch in measured.chunks(BATCH) {
        let start = Instant::now();
        for s in batch {
            let (token, layout) = live[s.slot].take().expect("a live slot");
            b.free(black_box(token), layout);
            live[s.slot] = Some((black_box(b.alloc(black_box(s.layout))), s.layout));
        }
        samples.push(start.elapsed().as_nanos() as f64 / batch.len() as f64);
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

/// Command-line filters: `--mix WORD` keeps the mixes whose name starts
/// with it, `--only NAME` the allocator rows so named (repeatable).
struct Filter {
    mix: Option<String>,
    only: Vec<String>,
    cache: u32,
}

impl Filter {
    fn from_args() -> Filter {
        let mut f = Filter {
            mix: None,
            only: Vec::new(),
            cache: DEFAULT_FRONT_CACHE,
        };
        let mut args = std::env::args().skip(1);
        while let Some(a) = args.next() {
            match (a.as_str(), args.next()) {
                ("--mix", Some(v)) => f.mix = Some(v),
                ("--only", Some(v)) => f.only.push(v),
                ("--cache", Some(v)) if v.parse::<u32>().is_ok() => f.cache = v.parse().unwrap(),
                _ => {
                    eprintln!(
                        "usage: alloc_bench [--mix small|mixed|large] [--only ROW]... [--cache DEPTH]"
                    );
                    std::process::exit(2);
                }
            }
        }
        f
    }

    fn mix(&self, mix: &Mix) -> bool {
        self.mix
            .as_ref()
            .is_none_or(|m| mix.name.starts_with(m.as_str()))
    }

    fn row(&self, name: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|o| o.eq_ignore_ascii_case(name))
    }
}

fn main() {
    let filter = Filter::from_args();
    let config = TlsfConfig::new().with_max_live(WINDOW as u32 + 1);
    // The arena rows (small mix): a device's protection domain, if any.
    let pd = match Context::open(None).and_then(|ctx| ProtectionDomain::new(&ctx)) {
        Ok(pd) => Some(pd),
        Err(e) => {
            println!("(no Arena rows: they need an RDMA device: {e})");
            None
        }
    };
    let arena_config = ArenaConfig {
        capacity: 64 << 20,
        max_buffers: WINDOW as u32 + 1,
        front_cache: filter.cache,
        ..ArenaConfig::default()
    };
    println!(
        "alloc_bench: window {WINDOW} live, {STEPS} replace steps (free + alloc) per run \
         after {WARMUP} warm-up, timed in batches of {BATCH}; ns per step"
    );
    println!();
    println!(
        "{:<18} {:<11} {:>9} {:>9} {:>13}",
        "mix", "allocator", "median", "p99", "system/this"
    );
    println!("{}", "-".repeat(64));
    for (i, mix) in MIXES.iter().enumerate() {
        if !filter.mix(mix) {
            continue;
        }
        let (fill, steps) = sequence(mix, 0xB0BA_CAFE + i as u64);
        let mut rows = Vec::new();
        let mut stats = None;
        if filter.row("Tlsf") {
            let mut tlsf = Tlsf::new(CAPACITY, config).expect("tlsf");
            rows.push(("Tlsf", run(&mut tlsf, &fill, &steps)));
            stats = Some(tlsf.stats());
        }
        #[cfg(feature = "std")]
        if filter.row("SharedTlsf") {
            let mut shared = SharedTlsf::new(CAPACITY, config).expect("shared tlsf");
            rows.push(("SharedTlsf", run(&mut shared, &fill, &steps)));
        }
        if filter.row("Tlsf+swap") {
            let mut swap = TlsfSwap {
                tlsf: Tlsf::new(CAPACITY, config).expect("tlsf"),
                last: AtomicU32::new(0),
            };
            rows.push(("Tlsf+swap", run(&mut swap, &fill, &steps)));
        }
        if filter.row("Cached") {
            let tlsf = Tlsf::new(CAPACITY, config.with_front_cache(filter.cache)).expect("tlsf");
            rows.push(("Cached", run(&mut Cached(tlsf), &fill, &steps)));
        }
        for (name, by_free) in [("Model", false), ("Model.free", true)] {
            if filter.row(name) {
                let model = ArenaModel::new(CAPACITY, WINDOW as u32 + 1, filter.cache);
                let mut model = Model {
                    model: model.expect("arena model"),
                    by_free,
                };
                rows.push((name, run(&mut model, &fill, &steps)));
                let left = model.model.stats();
                assert_eq!(
                    (left.alloc_count, left.free_blocks),
                    (0, 1),
                    "all came back"
                );
            }
        }
        if i == 0 {
            if let Some(pd) = &pd {
                if filter.row("Arena") {
                    let mut arena = ArenaDrop(Arena::new(pd, &arena_config).expect("arena"));
                    rows.push(("Arena", run(&mut arena, &fill, &steps)));
                }
                if filter.row("Arena.free") {
                    let mut arena = ArenaFree(Arena::new(pd, &arena_config).expect("arena"));
                    rows.push(("Arena.free", run(&mut arena, &fill, &steps)));
                }
            }
        }
        if filter.row("system") {
            rows.push(("system", run(&mut System, &fill, &steps)));
        }
        let sys_median = rows
            .iter()
            .find(|(name, _)| *name == "system")
            .map(|(_, (samples, _))| percentile(samples, 0.5));
        for (name, (samples, note)) in &rows {
            let median = percentile(samples, 0.5);
            let ratio = sys_median.map_or("-".to_string(), |s| format!("{:.2}x", s / median));
            println!(
                "{:<18} {:<11} {:>9.1} {:>9.1} {:>13}",
                mix.name,
                name,
                median,
                percentile(samples, 0.99),
                ratio
            );
            if let Some(note) = note {
                println!("{:<18} {note}", "");
            }
        }
        if let Some(stats) = stats {
            println!(
                "{:<18} (tlsf: {} allocations, high water {:.1} MiB, everything freed: {} free block)",
                "",
                stats.total_allocs,
                stats.high_water as f64 / f64::from(1 << 20),
                stats.free_blocks
            );
        }
    }
}
