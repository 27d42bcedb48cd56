//! Edge-case unit tests of the TLSF allocator.

use super::allocator::{bin_of, search_bin};
use super::types::{FL_COUNT, SL_COUNT, SL_LOG2};
use super::*;

fn cfg(granule: u64, max_blocks: u32) -> TlsfConfig {
    TlsfConfig::new()
        .with_granule(granule)
        .with_max_blocks(max_blocks)
}

/// The default configuration, with fewer block slots under Miri (which
/// runs the invariant checks' walks thousands of times slower).
fn defaults() -> TlsfConfig {
    if cfg!(miri) {
        TlsfConfig::default().with_max_blocks(1024)
    } else {
        TlsfConfig::default()
    }
}

fn checked(t: &Tlsf) {
    if let Err(e) = t.check_invariants() {
        panic!("invariant violated: {e}; {t:?}");
    }
}

#[test]
fn config_validation() {
    let bad = |r: Result<Tlsf, TlsfError>| matches!(r, Err(TlsfError::InvalidConfig { .. }));
    assert!(bad(Tlsf::new(4096, cfg(0, 16))));
    assert!(bad(Tlsf::new(4096, cfg(48, 16))));
    assert!(bad(Tlsf::new(4096, cfg(64, 0))));
    assert!(bad(Tlsf::new(4096, cfg(64, MAX_BLOCKS_LIMIT + 1))));
    assert!(bad(Tlsf::new(63, cfg(64, 16))));
    assert!(bad(Tlsf::new(0, TlsfConfig::default())));
    assert_eq!(
        TlsfConfig::new().with_max_live(100).max_blocks,
        201,
        "2 * live + 1"
    );
    assert_eq!(
        TlsfConfig::new().with_max_live(u32::MAX).max_blocks,
        MAX_BLOCKS_LIMIT
    );
}

#[test]
fn capacity_rounds_down_to_granule() {
    let t = Tlsf::new(1000, cfg(64, 16)).unwrap();
    assert_eq!(t.capacity(), 960);
    assert_eq!(t.granule(), 64);
    assert_eq!(t.max_blocks(), 16);
    let s = t.stats();
    assert_eq!(
        (s.capacity, s.free, s.largest_free, s.free_blocks),
        (960, 960, 960, 1)
    );
    checked(&t);
}

#[test]
fn rejects_bad_requests() {
    let mut t = Tlsf::new(4096, defaults()).unwrap();
    assert_eq!(t.alloc(0, 64), Err(TlsfError::ZeroSize));
    assert_eq!(t.alloc(64, 0), Err(TlsfError::BadAlignment { align: 0 }));
    assert_eq!(t.alloc(64, 24), Err(TlsfError::BadAlignment { align: 24 }));
    assert_eq!(
        t.alloc(4097, 64),
        Err(TlsfError::TooLarge {
            requested: 4097,
            capacity: 4096
        })
    );
    assert_eq!(
        t.alloc(u64::MAX, 8),
        Err(TlsfError::TooLarge {
            requested: u64::MAX,
            capacity: 4096
        })
    );
    assert_eq!(t.stats().total_allocs, 0);
    checked(&t);
}

#[test]
fn alloc_free_roundtrip_and_stats() {
    let mut t = Tlsf::new(1 << 20, defaults()).unwrap();
    let a = t.alloc(100, 8).unwrap();
    assert_eq!((a.offset, a.len), (0, 100));
    let b = t.alloc(64, 64).unwrap();
    assert_eq!(b.offset, 128, "100 bytes take two granules");
    checked(&t);
    let s = t.stats();
    assert_eq!(s.in_use, 192);
    assert_eq!(s.free, (1 << 20) - 192);
    assert_eq!(s.alloc_count, 2);
    assert_eq!(s.total_allocs, 2);
    assert_eq!(s.high_water, 192);
    assert_eq!(s.largest_free, (1 << 20) - 192);
    t.free(a.handle).unwrap();
    checked(&t);
    assert_eq!(t.stats().free_blocks, 2);
    t.free(b.handle).unwrap();
    checked(&t);
    let s = t.stats();
    assert_eq!((s.in_use, s.alloc_count, s.free_blocks), (0, 0, 1));
    assert_eq!((s.high_water, s.total_allocs), (192, 2));
    assert_eq!(s.largest_free, 1 << 20);
}

#[test]
fn fill_exactly_then_out_of_memory() {
    let mut t = Tlsf::new(1024, cfg(64, 64)).unwrap();
    let all: Vec<_> = (0..16).map(|_| t.alloc(64, 64).unwrap()).collect();
    for (i, a) in all.iter().enumerate() {
        assert_eq!(a.offset, 64 * i as u64);
    }
    checked(&t);
    assert_eq!(
        t.alloc(1, 8),
        Err(TlsfError::OutOfMemory {
            requested: 1,
            largest_free: 0
        })
    );
    // Free 5, 6 and 8: a hole of 128 and one of 64.
    for i in [5, 8, 6] {
        t.free(all[i].handle).unwrap();
        checked(&t);
    }
    assert_eq!(t.stats().free_blocks, 2);
    assert_eq!(t.stats().largest_free, 128);
    assert_eq!(
        t.alloc(129, 64),
        Err(TlsfError::OutOfMemory {
            requested: 129,
            largest_free: 128
        })
    );
    let c = t.alloc(128, 64).unwrap();
    assert_eq!(c.offset, 320);
    checked(&t);
}

#[test]
fn coalesces_with_both_neighbours() {
    let mut t = Tlsf::new(64 * 8, cfg(64, 32)).unwrap();
    let v: Vec<_> = (0..8).map(|_| t.alloc(64, 64).unwrap()).collect();
    t.free(v[1].handle).unwrap(); // lone
    t.free(v[3].handle).unwrap(); // lone
    assert_eq!(t.stats().free_blocks, 2);
    t.free(v[2].handle).unwrap(); // merges with both: 1..=3
    checked(&t);
    assert_eq!(t.stats().free_blocks, 1);
    assert_eq!(t.stats().largest_free, 192);
    t.free(v[0].handle).unwrap(); // merges with next: 0..=3
    t.free(v[7].handle).unwrap(); // lone at the end
    t.free(v[6].handle).unwrap(); // merges with next: 6..=7
    checked(&t);
    assert_eq!(t.stats().free_blocks, 2);
    t.free(v[4].handle).unwrap(); // merges with prev: 0..=4
    t.free(v[5].handle).unwrap(); // merges with both: everything
    checked(&t);
    let s = t.stats();
    assert_eq!((s.free_blocks, s.largest_free, s.in_use), (1, 512, 0));
}

#[test]
fn double_free_and_stale_handles_are_errors() {
    let mut t = Tlsf::new(4096, cfg(64, 8)).unwrap();
    let a = t.alloc(64, 64).unwrap();
    t.free(a.handle).unwrap();
    assert_eq!(
        t.free(a.handle),
        Err(TlsfError::InvalidHandle { handle: a.handle })
    );
    // The same slot is reused for the next allocation with a new generation.
    let b = t.alloc(64, 64).unwrap();
    assert_eq!(b.offset, a.offset);
    assert_ne!(b.handle, a.handle);
    assert!(matches!(
        t.free(a.handle),
        Err(TlsfError::InvalidHandle { .. })
    ));
    checked(&t);
    assert_eq!(t.alloc_count(), 1, "the stale free changed nothing");
    // Indices of unused slots, of free blocks and out of range.
    for h in [1, 7, b.handle + 8, b.handle ^ (1 << 31), 1000, u32::MAX] {
        assert!(matches!(t.free(h), Err(TlsfError::InvalidHandle { .. })));
    }
    t.free(b.handle).unwrap();
    checked(&t);
}

#[test]
fn large_alignment_splits_front_padding() {
    let mut t = Tlsf::new(1 << 16, defaults()).unwrap();
    let a = t.alloc(64, 64).unwrap();
    let b = t.alloc(100, 4096).unwrap();
    assert_eq!(b.offset, 4096);
    checked(&t);
    let s = t.stats();
    assert_eq!(s.in_use, 64 + 128, "padding is not counted as used");
    assert_eq!(s.free_blocks, 2, "front padding and tail are free");
    let c = t.alloc(4096 - 64, 64).unwrap();
    assert_eq!(c.offset, 64, "the padding is reusable");
    for h in [a.handle, b.handle, c.handle] {
        t.free(h).unwrap();
        checked(&t);
    }
    assert_eq!(t.stats().free_blocks, 1);
}

#[test]
fn alignment_up_to_the_whole_region() {
    // The padded search (size + align - granule) cannot fit; the fallback
    // checks the unpadded candidate.
    let mut t = Tlsf::new(4096, cfg(64, 8)).unwrap();
    let a = t.alloc(4096, 4096).unwrap();
    assert_eq!(a.offset, 0);
    t.free(a.handle).unwrap();
    let a = t.alloc(64, 1 << 63).unwrap();
    assert_eq!(a.offset, 0);
    assert!(matches!(
        t.alloc(64, 1 << 63),
        Err(TlsfError::OutOfMemory { .. })
    ));
    assert!(matches!(
        t.alloc(64, 8192),
        Err(TlsfError::OutOfMemory {
            largest_free: 4032,
            ..
        })
    ));
    let b = t.alloc(64, 2048).unwrap();
    assert_eq!(b.offset, 2048);
    checked(&t);
    t.free(a.handle).unwrap();
    t.free(b.handle).unwrap();
    checked(&t);
    assert_eq!(t.stats().free_blocks, 1);
}

#[test]
fn alignment_is_of_the_base_plus_the_offset() {
    // A region at 0x1000 (a page, not two): 8 KiB alignment is offset 0x1000.
    let mut t = Tlsf::new(1 << 16, defaults().with_base(0x1000)).unwrap();
    let a = t.alloc(100, 8192).unwrap();
    assert_eq!(a.offset, 0x1000);
    // Up to the granule the base does not matter, and the padding is free.
    let b = t.alloc(64, 64).unwrap();
    assert_eq!(b.offset, 0);
    checked(&t);
    // Aligned to the whole address space: no address in the region is.
    assert!(matches!(
        t.alloc(64, 1 << 63),
        Err(TlsfError::OutOfMemory { .. })
    ));
    assert!(matches!(
        Tlsf::new(1 << 16, defaults().with_base(0x1020)),
        Err(TlsfError::InvalidConfig { .. })
    ));
}

#[test]
fn small_alignment_is_free() {
    let mut t = Tlsf::new(4096, cfg(64, 8)).unwrap();
    for align in [1, 2, 4, 8, 16, 32, 64] {
        let a = t.alloc(8, align).unwrap();
        assert_eq!(a.offset % 64, 0);
        t.free(a.handle).unwrap();
    }
    assert_eq!(t.stats().free_blocks, 1);
}

#[test]
fn out_of_nodes_is_an_error_and_changes_nothing() {
    let mut t = Tlsf::new(4096, cfg(64, 1)).unwrap();
    assert_eq!(
        t.alloc(64, 64),
        Err(TlsfError::OutOfNodes { max_blocks: 1 })
    );
    checked(&t);
    let whole = t.alloc(4096, 64).unwrap(); // no split: needs no slot
    assert_eq!(
        t.alloc(64, 8).unwrap_err(),
        TlsfError::OutOfMemory {
            requested: 64,
            largest_free: 0
        }
    );
    t.free(whole.handle).unwrap();

    let mut t = Tlsf::new(4096, cfg(64, 2)).unwrap();
    let a = t.alloc(64, 64).unwrap();
    assert_eq!(
        t.alloc(64, 64),
        Err(TlsfError::OutOfNodes { max_blocks: 2 })
    );
    let s = t.stats();
    assert_eq!((s.in_use, s.alloc_count, s.free_blocks), (64, 1, 1));
    checked(&t);
    let b = t.alloc(4096 - 64, 64).unwrap(); // exact fit, no split
    checked(&t);
    t.free(a.handle).unwrap();
    t.free(b.handle).unwrap();
    checked(&t);
}

/// Smallest size (granules) in bin `(fl, sl)`.
fn bin_lower((fl, sl): (usize, usize)) -> u64 {
    if fl == 0 {
        sl as u64
    } else {
        let log = fl as u32 + SL_LOG2 - 1;
        (1u64 << log) + ((sl as u64) << (log - SL_LOG2))
    }
}

/// `small` under Miri (which runs these loops thousands of times slower),
/// `full` otherwise.
fn miri_or(small: u64, full: u64) -> u64 {
    if cfg!(miri) {
        small
    } else {
        full
    }
}

#[test]
fn bins_cover_sizes_and_search_rounds_up() {
    let mut last = (0, 0);
    for u in 1..miri_or(3_000, 100_000) {
        let bin = bin_of(u);
        assert!(bin >= last, "bins are monotonic in size");
        last = bin;
        assert!(bin.0 < FL_COUNT && bin.1 < SL_COUNT);
        // Every block in the search bin (and the bins above) holds `u`:
        // the smallest size mapping to it is at least `u`.
        let s = search_bin(u).unwrap();
        assert!(s >= bin);
        let lowest = bin_lower(s);
        assert_eq!(bin_of(lowest), s);
        assert!(lowest == 1 || bin_of(lowest - 1) < s);
        assert!(lowest >= u, "u = {u}: search bin starts at {lowest}");
        assert!(lowest - u < u.div_ceil(16).max(1), "rounding below 1/16");
    }
    assert_eq!(bin_of(u64::MAX), (FL_COUNT - 1, SL_COUNT - 1));
    assert_eq!(search_bin(u64::MAX), None);
}

#[test]
fn byte_granule_and_huge_capacity() {
    let mut t = Tlsf::new(u64::MAX, cfg(1, 8)).unwrap();
    assert_eq!(t.capacity(), u64::MAX);
    let a = t.alloc(3, 1).unwrap();
    let b = t.alloc(1 << 62, 1 << 62).unwrap();
    assert_eq!(b.offset, 1 << 62);
    let c = t.alloc(u64::MAX / 2, 1).unwrap();
    checked(&t);
    assert!(matches!(
        t.alloc(u64::MAX, 1),
        Err(TlsfError::OutOfMemory { .. })
    ));
    for h in [b.handle, a.handle, c.handle] {
        t.free(h).unwrap();
        checked(&t);
    }
    let all = t.alloc(u64::MAX, 1).unwrap();
    assert_eq!(all.offset, 0);
    t.free(all.handle).unwrap();
    checked(&t);
}

#[test]
fn generations_distinguish_reuse() {
    let mut t = Tlsf::new(4096, cfg(64, 2)).unwrap();
    let mut seen = Vec::new();
    for _ in 0..miri_or(100, 1000) {
        let a = t.alloc(4096, 64).unwrap();
        assert!(!seen.contains(&a.handle));
        seen.push(a.handle);
        t.free(a.handle).unwrap();
    }
    checked(&t);
}

#[test]
fn errors_display() {
    let all = [
        TlsfError::ZeroSize,
        TlsfError::TooLarge {
            requested: 2,
            capacity: 1,
        },
        TlsfError::BadAlignment { align: 3 },
        TlsfError::OutOfMemory {
            requested: 2,
            largest_free: 1,
        },
        TlsfError::OutOfNodes { max_blocks: 1 },
        TlsfError::InvalidHandle { handle: 5 },
        TlsfError::InvalidConfig { reason: "x" },
    ];
    for e in all {
        assert!(!alloc::format!("{e}").is_empty());
    }
}

#[cfg(feature = "std")]
#[test]
fn shared_across_threads() {
    let shared = std::sync::Arc::new(SharedTlsf::new(1 << 24, defaults()).unwrap());
    let threads: Vec<_> = (0..4u64)
        .map(|k| {
            let shared = std::sync::Arc::clone(&shared);
            std::thread::spawn(move || {
                let mut mine = Vec::new();
                for i in 0..miri_or(60, 2000) {
                    mine.push(shared.alloc(64 + (i * 7 + k) % 5000, 8 << (i % 6)).unwrap());
                    if i % 3 == 0 {
                        let a = mine.swap_remove((i as usize * 13) % mine.len());
                        shared.free(a.handle).unwrap();
                    }
                }
                for a in mine {
                    shared.free(a.handle).unwrap();
                }
            })
        })
        .collect();
    for th in threads {
        th.join().unwrap();
    }
    shared.check_invariants().unwrap();
    let s = shared.stats();
    assert_eq!((s.in_use, s.alloc_count, s.free_blocks), (0, 0, 1));
    assert_eq!(s.total_allocs, 4 * miri_or(60, 2000));
    let t = std::sync::Arc::into_inner(shared).unwrap().into_inner();
    checked(&t);
}

#[test]
fn is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tlsf>();
    #[cfg(feature = "std")]
    assert_send_sync::<SharedTlsf>();
}
