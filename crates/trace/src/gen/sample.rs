//! Random sampling primitives of the generator: integer/float draws from the
//! seeded PRNG, Vose alias tables, and the flow pickers behind `--dist`.
//!
//! Everything here is deterministic for a given seed and allocation-free per
//! draw; tables are built once in `Generator::new`.

use rand::Rng;
use rand_distr::{Distribution, Zipf};
use rand_xoshiro::Xoshiro256PlusPlus;

/// The generator's PRNG: fast, seedable, and stable across platforms.
pub(crate) type GenRng = Xoshiro256PlusPlus;

/// Uniform integer in `0..n` (Lemire's multiply-shift; `n == 0` yields 0).
/// The bias is below 2^-32 for any `n < 2^32`, irrelevant for traffic shapes.
#[inline]
pub(crate) fn below(rng: &mut GenRng, n: u64) -> u64 {
    ((rng.next_u64() as u128 * n as u128) >> 64) as u64
}

/// Uniform float in `[0, 1)` with 53 random bits.
#[inline]
pub(crate) fn unit(rng: &mut GenRng) -> f64 {
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Vose alias table over `n` weighted outcomes: O(n) build, O(1) draw.
#[derive(Debug, Clone)]
pub(crate) struct AliasTable {
    /// Acceptance threshold of each slot, scaled to 2^32.
    threshold: Vec<u32>,
    alias: Vec<u32>,
}

impl AliasTable {
    /// Builds the table; `None` if there are no outcomes, more than 2^32, or no positive weight.
    pub(crate) fn new(weights: &[f64]) -> Option<Self> {
        let n = weights.len();
        if n == 0 || n > u32::MAX as usize {
            return None;
        }
        let total: f64 = weights.iter().filter(|w| w.is_finite() && **w > 0.0).sum();
        if total <= 0.0 || !total.is_finite() {
            return None;
        }
        // Scaled so that the mean slot weight is 1.
        let mut scaled: Vec<f64> =
            weights.iter().map(|&w| if w.is_finite() && w > 0.0 { w * n as f64 / total } else { 0.0 }).collect();
        let mut threshold = vec![u32::MAX; n];
        let mut alias: Vec<u32> = (0..n as u32).collect();
        let (mut small, mut large): (Vec<u32>, Vec<u32>) = (Vec::new(), Vec::new());
        for (i, &s) in scaled.iter().enumerate() {
            if s < 1.0 {
                small.push(i as u32);
            } else {
                large.push(i as u32);
            }
        }
        while let (Some(&s), Some(&l)) = (small.last(), large.last()) {
            small.pop();
            let ps = scaled[s as usize];
            threshold[s as usize] = (ps * 4_294_967_296.0).min(u32::MAX as f64) as u32;
            alias[s as usize] = l;
            let pl = scaled[l as usize] + ps - 1.0;
            scaled[l as usize] = pl;
            if pl < 1.0 {
                large.pop();
                small.push(l);
            }
        }
        // Leftovers (rounding) keep their own slot with probability 1.
        Some(AliasTable { threshold, alias })
    }

    #[inline]
    pub(crate) fn sample(&self, rng: &mut GenRng) -> u64 {
        let r = rng.next_u64();
        // High bits choose the slot, low 32 bits decide slot vs alias.
        let slot = ((r >> 32) * self.threshold.len() as u64) >> 32;
        let slot = slot as usize;
        if (r as u32) < self.threshold[slot] || self.threshold[slot] == u32::MAX {
            slot as u64
        } else {
            self.alias[slot] as u64
        }
    }
}

/// Chooses the flow of each packet according to `--dist`.
#[derive(Debug)]
pub(crate) enum FlowPicker {
    /// Every flow once per round, each round in a fresh random order
    /// (lazy Fisher-Yates: one swap per draw).
    Rounds { perm: Vec<u32>, pos: usize },
    /// Zipf rank sampling (rejection-inversion, O(1)); rank 1 is flow 0.
    Zipf(Zipf<f64>),
    /// `k` elephants take `share` of the packets, the other flows the rest, uniformly.
    Elephants { n: u64, k: u64, share: f64 },
    /// Per-flow weights drawn once (e.g. from an empirical flow-size CDF).
    Weighted(AliasTable),
}

impl FlowPicker {
    #[inline]
    pub(crate) fn pick(&mut self, rng: &mut GenRng) -> u64 {
        match self {
            FlowPicker::Rounds { perm, pos } => {
                let n = perm.len();
                if n == 0 {
                    return 0;
                }
                if *pos >= n {
                    *pos = 0;
                }
                let j = *pos + below(rng, (n - *pos) as u64) as usize;
                perm.swap(*pos, j);
                let f = perm[*pos];
                *pos += 1;
                f as u64
            }
            FlowPicker::Zipf(z) => {
                let r: f64 = z.sample(rng);
                (r as u64).max(1) - 1
            }
            FlowPicker::Elephants { n, k, share } => {
                if *k >= *n || unit(rng) < *share {
                    below(rng, (*k).min(*n))
                } else {
                    *k + below(rng, *n - *k)
                }
            }
            FlowPicker::Weighted(t) => t.sample(rng),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn alias_matches_weights() {
        let t = AliasTable::new(&[1.0, 2.0, 7.0, 0.0]).expect("table");
        let mut rng = GenRng::seed_from_u64(3);
        let mut c = [0u64; 4];
        for _ in 0..200_000 {
            c[t.sample(&mut rng) as usize] += 1;
        }
        assert_eq!(c[3], 0);
        let f: Vec<f64> = c.iter().map(|&x| x as f64 / 200_000.0).collect();
        assert!((f[0] - 0.1).abs() < 0.01 && (f[1] - 0.2).abs() < 0.01 && (f[2] - 0.7).abs() < 0.01, "{f:?}");
    }

    #[test]
    fn alias_rejects_empty_and_zero() {
        assert!(AliasTable::new(&[]).is_none());
        assert!(AliasTable::new(&[0.0, f64::NAN]).is_none());
    }

    #[test]
    fn rounds_visit_every_flow_once_per_round() {
        let mut p = FlowPicker::Rounds { perm: (0..100).collect(), pos: 0 };
        let mut rng = GenRng::seed_from_u64(9);
        for _ in 0..3 {
            let mut seen = [false; 100];
            for _ in 0..100 {
                seen[p.pick(&mut rng) as usize] = true;
            }
            assert!(seen.iter().all(|&s| s));
        }
    }

    #[test]
    fn elephants_share() {
        let mut p = FlowPicker::Elephants { n: 1000, k: 10, share: 0.9 };
        let mut rng = GenRng::seed_from_u64(1);
        let hits = (0..100_000).filter(|_| p.pick(&mut rng) < 10).count();
        assert!((hits as f64 / 100_000.0 - 0.9).abs() < 0.01);
    }

    #[test]
    fn below_stays_in_range() {
        let mut rng = GenRng::seed_from_u64(5);
        assert_eq!(below(&mut rng, 0), 0);
        assert!((0..10_000).all(|_| below(&mut rng, 7) < 7));
        assert!((0..10_000).all(|_| (0.0..1.0).contains(&unit(&mut rng))));
    }
}
