//! Latency histogram: log-linear buckets (16 per power of two, so a
//! reading is within 1/16 of its octave), mergeable across clients by
//! adding counts, sent between nodes as little-endian words.

pub const SUB: u32 = 16;
pub const BUCKETS: usize = 64 * SUB as usize;

pub struct Histogram {
    pub counts: Vec<u64>,
    pub total: u64,
}

impl Histogram {
    pub fn new() -> Histogram {
        Histogram {
            counts: vec![0; BUCKETS],
            total: 0,
        }
    }

    fn bucket(ns: u64) -> usize {
        if ns < u64::from(SUB) {
            return ns as usize;
        }
        let octave = 63 - ns.leading_zeros(); // >= 4
        let sub = (ns >> (octave - 4)) & u64::from(SUB - 1);
        ((octave - 3) * SUB) as usize + sub as usize
    }

    /// The middle of bucket `b`'s range, in ns.
    fn value(b: usize) -> u64 {
        if b < SUB as usize {
            return b as u64;
        }
        let octave = b as u32 / SUB + 3;
        let sub = b as u64 % u64::from(SUB);
        let low = (u64::from(SUB) + sub) << (octave - 4);
        low + (1u64 << (octave - 4)) / 2
    }

    pub fn record(&mut self, ns: u64) {
        self.counts[Self::bucket(ns)] += 1;
        self.total += 1;
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.total += other.total;
    }

    /// The `q` quantile (0..=1) in ns; 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Self::value(b);
            }
        }
        Self::value(BUCKETS - 1)
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity((BUCKETS + 1) * 8);
        out.extend_from_slice(&self.total.to_le_bytes());
        for c in &self.counts {
            out.extend_from_slice(&c.to_le_bytes());
        }
        out
    }

    pub fn from_bytes(b: &[u8]) -> Histogram {
        let word = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
        Histogram {
            total: word(0),
            counts: (0..BUCKETS).map(|i| word(i + 1)).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_land_within_a_sixteenth_of_an_octave() {
        let mut h = Histogram::new();
        for ns in 1..=100_000u64 {
            h.record(ns);
        }
        for (q, want) in [(0.5, 50_000.0), (0.99, 99_000.0), (0.999, 99_900.0)] {
            let got = h.quantile(q) as f64;
            assert!(
                (got - want).abs() / want < 1.0 / 16.0,
                "q {q}: {got} vs {want}"
            );
        }
        let back = Histogram::from_bytes(&h.to_bytes());
        assert_eq!(back.total, h.total);
        assert_eq!(back.quantile(0.5), h.quantile(0.5));
    }
}
