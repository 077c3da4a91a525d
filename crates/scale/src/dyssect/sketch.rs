//! Per-core heavy-flow measurement: a space-saving sketch (Metwally et al.)
//! of N counters, fed one sampled packet in `stride` by the worker after
//! its batch (off the per-packet path), published now and then for the
//! controller.

use flowplane_wire::flow::FiveTupleV4;

use crate::steer::HeavyFlow;

/// Counters per core's sketch.
pub const COUNTERS: usize = 32;

/// A space-saving sketch over flows keyed by their RSS hash.
#[derive(Clone, Debug)]
pub struct SpaceSaving {
    hash: [u32; COUNTERS],
    count: [u64; COUNTERS],
    flow: [HeavyFlow; COUNTERS],
    used: usize,
    /// Weight of one sampled packet (the sampling stride).
    weight: u64,
}

impl SpaceSaving {
    /// An empty sketch whose samples each stand for `weight` packets.
    pub fn new(weight: u64) -> Self {
        let empty = HeavyFlow { tuple: FiveTupleV4::default(), hash: 0, packets: 0, priority: false };
        SpaceSaving {
            hash: [0; COUNTERS],
            count: [0; COUNTERS],
            flow: [empty; COUNTERS],
            used: 0,
            weight: weight.max(1),
        }
    }

    /// Counts one sampled packet of `tuple` (hash `hash`).
    #[inline]
    pub fn add(&mut self, hash: u32, tuple: &FiveTupleV4, priority: bool) {
        if let Some(i) = self.hash[..self.used].iter().position(|&h| h == hash) {
            self.count[i] += self.weight;
            return;
        }
        let i = if self.used < COUNTERS {
            self.used += 1;
            self.used - 1
        } else {
            // Replace the minimum; the newcomer inherits its count (the space-saving overestimate).
            (0..COUNTERS).min_by_key(|&i| self.count[i]).unwrap_or(0)
        };
        self.hash[i] = hash;
        self.count[i] += self.weight;
        self.flow[i] = HeavyFlow { tuple: tuple.with_flags(0), hash, packets: 0, priority };
    }

    /// The counted flows, heaviest first (cumulative estimated packets).
    pub fn top(&self, out: &mut Vec<HeavyFlow>) {
        out.clear();
        out.extend((0..self.used).map(|i| HeavyFlow { packets: self.count[i], ..self.flow[i] }));
        out.sort_by_key(|f| std::cmp::Reverse(f.packets));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn finds_the_heavy_hitters() {
        let mut s = SpaceSaving::new(4);
        let t = |i: u32| FiveTupleV4::new(Ipv4Addr::from(i), Ipv4Addr::new(1, 1, 1, 1), 1, 2, 17);
        for round in 0..1000u32 {
            s.add(7, &t(7), false);
            s.add(9, &t(9), true);
            s.add(1000 + round, &t(1000 + round), false);
        }
        let mut top = Vec::new();
        s.top(&mut top);
        assert_eq!((top[0].hash, top[1].hash), (7, 9));
        assert!(top[1].priority && top[0].packets >= 4000);
    }
}
