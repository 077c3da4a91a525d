//! A fixed-size log-linear histogram of cycle counts (no allocation after
//! creation), for batch latency percentiles.

/// Sub-buckets per power of two: relative error <= 1/16.
const SUB_BITS: u32 = 4;
const SUB: usize = 1 << SUB_BITS;
const BUCKETS: usize = 64 * SUB;

/// Histogram of `u64` values with ~6% resolution.
#[derive(Clone)]
pub struct Histogram {
    counts: Box<[u64; BUCKETS]>,
    total: u64,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram { counts: Box::new([0; BUCKETS]), total: 0, max: 0 }
    }
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Histogram").field("total", &self.total).field("max", &self.max).finish()
    }
}

#[inline(always)]
fn index(v: u64) -> usize {
    if v < SUB as u64 {
        return v as usize;
    }
    let msb = 63 - v.leading_zeros();
    let shift = msb - SUB_BITS;
    let sub = (v >> shift) as usize & (SUB - 1);
    ((msb - SUB_BITS + 1) as usize) * SUB + sub
}

/// Smallest value that maps to bucket `i` (inverse of `index`).
fn lower_bound(i: usize) -> u64 {
    if i < SUB {
        return i as u64;
    }
    let group = (i / SUB) as u32;
    let sub = (i % SUB) as u64;
    let msb = group + SUB_BITS - 1;
    (1u64 << msb) | (sub << (msb - SUB_BITS))
}

impl Histogram {
    /// Records one value.
    #[inline(always)]
    pub fn record(&mut self, v: u64) {
        self.counts[index(v)] += 1;
        self.total += 1;
        self.max = self.max.max(v);
    }

    /// Number of values recorded.
    pub fn count(&self) -> u64 {
        self.total
    }

    /// Largest value recorded.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// Adds another histogram.
    pub fn merge(&mut self, o: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(o.counts.iter()) {
            *a += b;
        }
        self.total += o.total;
        self.max = self.max.max(o.max);
    }

    /// Values recorded below `v` (whole buckets, ~6% resolution): a
    /// cumulative bucket for exporters (Prometheus `le`).
    pub fn count_below(&self, v: u64) -> u64 {
        let end = index(v.saturating_add(1)).min(BUCKETS);
        self.counts[..end].iter().sum()
    }

    /// Sum of the recorded values, each taken at its bucket's lower bound.
    pub fn sum_approx(&self) -> f64 {
        self.counts.iter().enumerate().filter(|(_, &c)| c > 0).map(|(i, &c)| c as f64 * lower_bound(i) as f64).sum()
    }

    /// The value at quantile `q` in [0, 1] (bucket lower bound; 0 if empty).
    pub fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return lower_bound(i).min(self.max);
            }
        }
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_roundtrip_and_monotone() {
        let mut last = 0;
        for v in (0..100_000u64).chain([u64::MAX / 3, u64::MAX]) {
            let i = index(v);
            assert!(i < BUCKETS);
            assert!(i >= last || v > 100_000);
            last = i;
            let lb = lower_bound(i);
            assert!(lb <= v, "v {v} lb {lb}");
            assert!(v - lb <= v / 16 + 1, "v {v} lb {lb}");
        }
    }

    #[test]
    fn quantiles() {
        let mut h = Histogram::default();
        assert_eq!(h.quantile(0.5), 0);
        for v in 1..=1000u64 {
            h.record(v);
        }
        let p50 = h.quantile(0.5);
        assert!((470..=500).contains(&p50), "{p50}");
        let p99 = h.quantile(0.99);
        assert!((930..=990).contains(&p99), "{p99}");
        assert!(h.quantile(1.0) >= 960 && h.quantile(1.0) <= 1000);
        assert_eq!(h.count_below(0), 0);
        assert!((470..=530).contains(&h.count_below(500)));
        assert_eq!(h.count_below(u64::MAX), 1000);
        let s = h.sum_approx();
        assert!(s > 0.9 * 500_500.0 && s <= 500_500.0, "{s}");
        let mut g = Histogram::default();
        g.record(5000);
        h.merge(&g);
        assert_eq!(h.count(), 1001);
        assert_eq!(h.max(), 5000);
    }
}
