//! Randomised test of the TLSF offset allocator against an independent shadow
//! model.
//!
//! A seeded splitmix64 drives over a million alloc/free steps of mixed sizes
//! (1 B ..= 1 MiB, log-uniform so small sizes dominate) and alignments
//! (8 ..= 4096), in phases that alternate between draining and pushing the
//! region to exhaustion. After every step the allocator's own
//! `check_invariants` runs, and the shadow model (a sorted list of live ranges)
//! checks that the new range is aligned, inside the region and overlaps no
//! live range, that every counter of `stats()` is exact, and that the free
//! blocks are exactly the maximal gaps between live ranges (so coalescing is
//! complete). Every `OutOfMemory` is checked against the shadow's largest gap
//! and against the documented good-fit bound. The same runs with the front
//! cache on check that it never hands out a live range, keeps every count
//! exact, and is merged back before a failure is reported (free blocks
//! and the largest are compared whenever the cache is empty, which a
//! flush every thousand steps ensures now and then).

use std::collections::HashSet;

use verbs::tlsf::{Allocation, Tlsf, TlsfConfig, TlsfError};

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

    fn per_mille(&mut self, p: u64) -> bool {
        self.below(1000) < p
    }

    /// 1 ..= 1 MiB, log-uniform: each power of two range is equally likely.
    fn size(&mut self) -> u64 {
        let k = self.below(21);
        1 + self.below(1 << k)
    }

    /// 8 ..= 4096, uniform over the powers of two.
    fn align(&mut self) -> u64 {
        8 << self.below(10)
    }
}

/// `units` rounded up to the boundary of its TLSF bin (16 linear
/// subdivisions per power of two): any free block at least this large must
/// satisfy a request of `units` granules.
fn bin_round(units: u64) -> u64 {
    if units < 16 {
        return units;
    }
    let step = 1u64 << (63 - units.leading_zeros() - 4);
    (units + step - 1) & !(step - 1)
}

/// The independent model: live ranges by offset, and the counters.
struct Shadow {
    capacity: u64,
    granule: u64,
    live: Vec<Allocation>,
    handles: HashSet<u32>,
    /// Reserved (granule-rounded) ranges `(offset, end)`, sorted.
    ranges: Vec<(u64, u64)>,
    in_use: u64,
    high_water: u64,
    total_allocs: u64,
}

impl Shadow {
    fn new(capacity: u64, granule: u64) -> Self {
        Self {
            capacity,
            granule,
            live: Vec::new(),
            handles: HashSet::new(),
            ranges: Vec::new(),
            in_use: 0,
            high_water: 0,
            total_allocs: 0,
        }
    }

    fn reserved(&self, len: u64) -> u64 {
        len.div_ceil(self.granule) * self.granule
    }

    fn on_alloc(&mut self, a: Allocation, size: u64, align: u64) {
        assert_eq!(a.len, size, "len is the requested size");
        assert_eq!(
            a.offset % align,
            0,
            "offset {} not aligned to {align}",
            a.offset
        );
        assert_eq!(a.offset % self.granule, 0);
        let end = a.offset + self.reserved(size);
        assert!(end <= self.capacity, "range past the capacity");
        let at = self.ranges.partition_point(|&(o, _)| o < a.offset);
        if let Some(&(o, e)) = at.checked_sub(1).map(|i| &self.ranges[i]) {
            assert!(e <= a.offset, "overlaps [{o}, {e}) from below");
        }
        if let Some(&(o, e)) = self.ranges.get(at) {
            assert!(end <= o, "overlaps [{o}, {e}) from above");
        }
        assert!(self.handles.insert(a.handle), "handle issued twice");
        self.ranges.insert(at, (a.offset, end));
        self.in_use += end - a.offset;
        self.high_water = self.high_water.max(self.in_use);
        self.total_allocs += 1;
        self.live.push(a);
    }

    fn on_free(&mut self, index: usize) -> Allocation {
        let a = self.live.swap_remove(index);
        self.handles.remove(&a.handle);
        let at = self
            .ranges
            .binary_search_by_key(&a.offset, |&(o, _)| o)
            .expect("shadow lost a range");
        let (o, e) = self.ranges.remove(at);
        self.in_use -= e - o;
        a
    }

    /// (number of maximal gaps, largest gap) between live ranges.
    fn gaps(&self) -> (u64, u64) {
        let (mut count, mut largest, mut at) = (0, 0, 0);
        for &(o, e) in &self.ranges {
            if o > at {
                count += 1;
                largest = largest.max(o - at);
            }
            at = e;
        }
        if self.capacity > at {
            count += 1;
            largest = largest.max(self.capacity - at);
        }
        (count, largest)
    }

    fn verify(&self, t: &Tlsf) {
        if let Err(e) = t.check_invariants() {
            panic!("invariant violated: {e}");
        }
        let s = t.stats();
        let (gaps, largest) = self.gaps();
        assert_eq!(s.capacity, self.capacity);
        assert_eq!(s.in_use, self.in_use, "in_use");
        assert_eq!(s.free, self.capacity - self.in_use, "free");
        assert_eq!(s.alloc_count, self.live.len() as u64, "alloc_count");
        assert_eq!(s.total_allocs, self.total_allocs, "total_allocs");
        // With the front cache the peak includes cached blocks (the caller
        // checks it exactly without).
        assert!(s.high_water >= self.high_water, "high_water");
        if s.cached != 0 {
            // Cached blocks are free but sit between the bins' blocks.
            return;
        }
        assert_eq!(s.free_blocks, gaps, "free blocks are the maximal gaps");
        assert_eq!(s.largest_free, largest, "largest_free");
    }
}

struct Outcome {
    allocs: u64,
    frees: u64,
    out_of_memory: u64,
}

/// `steps` random operations with full checks after each; ends by freeing
/// everything and checking the region is one free block again.
fn run(seed: u64, granule: u64, capacity: u64, max_live: u32, steps: u64) -> Outcome {
    run_cached(seed, granule, capacity, max_live, steps, 0)
}

/// [`run`] with a front cache `depth` deep.
fn run_cached(
    seed: u64,
    granule: u64,
    capacity: u64,
    max_live: u32,
    steps: u64,
    depth: u32,
) -> Outcome {
    let mut rng = SplitMix64(seed);
    let config = TlsfConfig::new()
        .with_granule(granule)
        .with_max_live(max_live)
        .with_front_cache(depth);
    let exact_high_water = depth == 0;
    let mut t = Tlsf::new(capacity, config).unwrap();
    let mut shadow = Shadow::new(capacity, granule);
    let mut stale: Vec<u32> = Vec::new();
    let mut out = Outcome {
        allocs: 0,
        frees: 0,
        out_of_memory: 0,
    };
    // Allocation probability per phase, in per mille: drain, balance, fill.
    const PHASES: [u64; 8] = [550, 950, 300, 700, 900, 100, 500, 800];
    let phase_len = (steps / 50).max(1);

    for step in 0..steps {
        let p_alloc = PHASES[(step / phase_len) as usize % PHASES.len()];
        let roll = rng.below(1000);
        if roll < 5 && !stale.is_empty() {
            // Double free / stale handle: an error, and nothing changes.
            let h = stale[rng.below(stale.len() as u64) as usize];
            assert_eq!(t.free(h), Err(TlsfError::InvalidHandle { handle: h }));
        } else if roll < 7 {
            assert_eq!(t.alloc(0, 8), Err(TlsfError::ZeroSize));
            let big = capacity + 1 + rng.below(1 << 40);
            assert_eq!(
                t.alloc(big, 64),
                Err(TlsfError::TooLarge {
                    requested: big,
                    capacity
                })
            );
            let bad = (rng.align() << 1) | 1 | (rng.align() << 2);
            assert_eq!(
                t.alloc(64, bad),
                Err(TlsfError::BadAlignment { align: bad })
            );
        } else if shadow.live.len() >= max_live as usize
            || (!shadow.live.is_empty() && !rng.per_mille(p_alloc))
        {
            let index = rng.below(shadow.live.len() as u64) as usize;
            let a = shadow.on_free(index);
            t.free(a.handle).unwrap();
            out.frees += 1;
            if stale.len() < 64 {
                stale.push(a.handle);
            } else {
                stale[rng.below(64) as usize] = a.handle;
            }
        } else {
            let (size, align) = (rng.size(), rng.align());
            match t.alloc(size, align) {
                Ok(a) => {
                    shadow.on_alloc(a, size, align);
                    out.allocs += 1;
                }
                Err(TlsfError::OutOfMemory {
                    requested,
                    largest_free,
                }) => {
                    assert_eq!(requested, size);
                    assert_eq!(largest_free, shadow.gaps().1, "reported largest_free");
                    // The good-fit guarantee: failure means no free block
                    // reaches the request (plus alignment slack) rounded up
                    // to its bin boundary.
                    let units = size.div_ceil(granule);
                    let need = units + (align / granule).max(1) - 1;
                    assert!(
                        largest_free / granule < bin_round(need),
                        "failed {size} B align {align} with a {largest_free} B block free"
                    );
                    out.out_of_memory += 1;
                }
                Err(e) => panic!("step {step}: unexpected {e}"),
            }
        }
        if step % 1000 == 999 {
            t.flush_cache();
        }
        shadow.verify(&t);
        if exact_high_water {
            assert_eq!(t.stats().high_water, shadow.high_water, "high_water");
        }
    }

    // Free everything, in random order, still checking every step.
    while !shadow.live.is_empty() {
        let index = rng.below(shadow.live.len() as u64) as usize;
        let a = shadow.on_free(index);
        t.free(a.handle).unwrap();
        shadow.verify(&t);
    }
    t.flush_cache();
    let s = t.stats();
    assert_eq!((s.in_use, s.alloc_count), (0, 0));
    assert_eq!(s.free_blocks, 1, "everything coalesced into one block");
    assert_eq!(s.largest_free, capacity);
    let all = t.alloc(capacity, 4096).unwrap();
    assert_eq!(all.offset, 0);
    t.free(all.handle).unwrap();
    t.check_invariants().unwrap();
    eprintln!(
        "granule {granule}: {steps} steps, {} allocs, {} frees, {} out of memory",
        out.allocs, out.frees, out.out_of_memory
    );
    out
}

#[test]
fn million_random_ops_granule_64() {
    // 8 MiB with up to 256 live allocations averaging ~50 KiB: the fill
    // phases run out of memory regularly.
    let out = run(0x5EED_0001, 64, 8 << 20, 256, 1_000_000);
    assert!(out.allocs > 300_000 && out.frees > 300_000);
    assert!(
        out.out_of_memory > 10_000,
        "exhaustion exercised: {}",
        out.out_of_memory
    );
}

#[test]
fn random_ops_with_the_front_cache() {
    // The arena's setting (granule 64, a cache 8 deep), then a shallow
    // cache on granule 8 (sizes up to 2 KiB cached, most padded).
    let out = run_cached(0x5EED_0004, 64, 8 << 20, 256, 400_000, 8);
    assert!(
        out.out_of_memory > 1_000,
        "exhaustion exercised: {}",
        out.out_of_memory
    );
    let out = run_cached(0x5EED_0005, 8, 4 << 20, 128, 100_000, 2);
    assert!(
        out.out_of_memory > 100,
        "exhaustion exercised: {}",
        out.out_of_memory
    );
}

#[test]
fn random_ops_granule_8_alignment_path() {
    // Granule 8: almost every request takes the aligned (front padding) path.
    let out = run(0x5EED_0002, 8, 4 << 20, 128, 200_000);
    assert!(
        out.out_of_memory > 1_000,
        "exhaustion exercised: {}",
        out.out_of_memory
    );
}

#[test]
fn random_ops_granule_4096_no_padding() {
    // Granule 4096: alignment never needs padding, rounding is coarse.
    let out = run(0x5EED_0003, 4096, 4 << 20, 128, 200_000);
    assert!(
        out.out_of_memory > 1_000,
        "exhaustion exercised: {}",
        out.out_of_memory
    );
}

#[test]
fn exhaustion_is_an_error_and_recoverable() {
    let mut t = Tlsf::new(8 << 20, TlsfConfig::new()).unwrap();
    let mut live = Vec::new();
    let err = loop {
        match t.alloc(1 << 20, 4096) {
            Ok(a) => live.push(a),
            Err(e) => break e,
        }
    };
    assert_eq!(live.len(), 8);
    assert_eq!(
        err,
        TlsfError::OutOfMemory {
            requested: 1 << 20,
            largest_free: 0
        }
    );
    assert_eq!(t.alloc(1, 8).unwrap_err(), err_oom(1, 0));
    let a = live.swap_remove(3);
    t.free(a.handle).unwrap();
    let b = t.alloc(1 << 20, 4096).unwrap();
    assert_eq!(b.offset, a.offset);
    live.push(b);
    for a in live {
        t.free(a.handle).unwrap();
    }
    t.check_invariants().unwrap();
    assert_eq!(t.stats().free_blocks, 1);
}

fn err_oom(requested: u64, largest_free: u64) -> TlsfError {
    TlsfError::OutOfMemory {
        requested,
        largest_free,
    }
}

#[test]
fn node_exhaustion_is_an_error_and_changes_nothing() {
    let mut rng = SplitMix64(7);
    let mut t = Tlsf::new(1 << 30, TlsfConfig::new().with_max_blocks(33)).unwrap();
    let mut live = Vec::new();
    let mut hit = 0;
    for _ in 0..10_000 {
        if live.len() > 20 || (rng.per_mille(300) && !live.is_empty()) {
            let a: Allocation = live.swap_remove(rng.below(live.len() as u64) as usize);
            t.free(a.handle).unwrap();
        } else {
            let before = t.stats();
            match t.alloc(rng.size(), rng.align()) {
                Ok(a) => live.push(a),
                Err(TlsfError::OutOfNodes { max_blocks }) => {
                    assert_eq!(max_blocks, 33);
                    assert_eq!(t.stats(), before, "a failed alloc changes nothing");
                    hit += 1;
                }
                Err(e) => panic!("unexpected {e}"),
            }
        }
        t.check_invariants().unwrap();
    }
    assert!(hit > 0, "node exhaustion exercised");
    for a in live {
        t.free(a.handle).unwrap();
    }
    assert_eq!(t.stats().free_blocks, 1);
}

#[test]
fn zero_size_and_oversized_are_rejected() {
    let mut t = Tlsf::new(1 << 20, TlsfConfig::new()).unwrap();
    assert_eq!(t.alloc(0, 64), Err(TlsfError::ZeroSize));
    assert_eq!(
        t.alloc((1 << 20) + 1, 8),
        Err(TlsfError::TooLarge {
            requested: (1 << 20) + 1,
            capacity: 1 << 20
        })
    );
    let all = t.alloc(1 << 20, 8).unwrap();
    assert_eq!(all.offset, 0);
    t.free(all.handle).unwrap();
    assert_eq!(t.stats().total_allocs, 1);
}
