//! The workload: a seeded PRNG of our own (so a run is reproducible and
//! the clean and lossy runs move the same bytes), operation sizes skewed
//! small, and the server's memory split into lanes so the operations in
//! flight never overlap.

/// Largest operation: 1 MiB.
pub const MAX_OP: usize = 1 << 20;

/// Bytes read back on each side of a write, to catch a write that spilled
/// past its range (clipped at the lane's edges).
pub const GUARD: usize = 64;

/// splitmix64: tiny, fast, and good enough to make every pattern distinct.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (the modulo bias is irrelevant here).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    pub fn fill(&mut self, out: &mut [u8]) {
        for chunk in out.chunks_mut(8) {
            chunk.copy_from_slice(&self.next_u64().to_le_bytes()[..chunk.len()]);
        }
    }
}

/// The size of job `job`: the first two jobs are the extremes (2 B and
/// 1 MiB), then log-uniform within three bands, skewed small so that
/// 10,000 operations stay affordable under emulation and 2 % loss:
/// `large_permille`/1000 in 64 KiB..1 MiB, 25 % in 4..64 KiB, the rest
/// in 2 B..4 KiB.
pub fn op_size(rng: &mut Rng, job: u64, large_permille: u64) -> usize {
    match job {
        0 => 2,
        1 => MAX_OP,
        _ => {
            let r = rng.below(1000);
            let (lo, hi) = if r < large_permille {
                (16, 20)
            } else if r < large_permille + 250 {
                (12, 16)
            } else {
                (1, 12)
            };
            let octave = 1u64 << (lo + rng.below(hi - lo));
            ((octave + rng.below(octave + 1)) as usize).clamp(2, MAX_OP)
        }
    }
}

/// A byte range of the server's region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Range {
    pub start: usize,
    pub len: usize,
}

impl Range {
    pub fn end(&self) -> usize {
        self.start + self.len
    }
}

/// One lane's job: a write, then an RDMA Read of the same range plus
/// guard bytes, posted together; the read is the write's verification.
#[derive(Clone, Copy, Debug)]
pub struct Job {
    pub write: Range,
    pub read: Range,
    /// The write completed successfully (its data is on the server).
    pub write_ok: bool,
}

impl Job {
    /// A job writing `write` within `lane`, reading it back with guards.
    pub fn new(write: Range, lane: Range) -> Job {
        let start = write.start.saturating_sub(GUARD).max(lane.start);
        let end = (write.end() + GUARD).min(lane.end());
        Job {
            write,
            read: Range {
                start,
                len: end - start,
            },
            write_ok: false,
        }
    }
}
