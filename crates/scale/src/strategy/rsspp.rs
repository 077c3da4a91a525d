//! `rsspp`: RSS++ (Barbette et al., CoNEXT 2019): per-RETA-entry packet
//! counts; every period a few entries move from the busiest cores to the
//! least busy ones, with their flows' state.

use std::time::Duration;

use super::{imbalance, Controller, LoadSample, Strategy, StrategyInfo, DEFAULT_PERIOD};

/// Registration (see [`super::STRATEGIES`]).
pub const INFO: StrategyInfo = StrategyInfo {
    name: "rsspp",
    about: "RSS++: RETA entries move from the busiest cores every period, with their flows' state",
    build: |c| Box::new(RssPlusPlus::with_period(c.period)),
};

/// RSS++: incremental RETA rebalancing from per-entry packet counts.
#[derive(Debug)]
pub struct RssPlusPlus {
    /// Imbalance (see [`imbalance`]) below which nothing moves.
    pub threshold: f64,
    /// Most entries moved per period.
    pub max_moves: usize,
    /// Balance CPU load instead of packets.
    pub by_cpu: bool,
    period: Duration,
}

impl Default for RssPlusPlus {
    fn default() -> Self {
        RssPlusPlus { threshold: 0.10, max_moves: 8, by_cpu: false, period: DEFAULT_PERIOD }
    }
}

impl RssPlusPlus {
    /// With a control period.
    pub fn with_period(period: Duration) -> Self {
        RssPlusPlus { period, ..Default::default() }
    }
}

impl Strategy for RssPlusPlus {
    fn name(&self) -> &'static str {
        INFO.name
    }
    fn controller(&self) -> Option<&dyn Controller> {
        Some(self)
    }
    fn controller_mut(&mut self) -> Option<&mut dyn Controller> {
        Some(self)
    }
}

impl Controller for RssPlusPlus {
    fn counts_loads(&self) -> bool {
        true
    }
    fn period(&self) -> Duration {
        self.period
    }
    fn balance_cpu(&self) -> bool {
        self.by_cpu
    }

    /// Greedy, as RSS++: the busiest core gives the entry whose load best
    /// fills half the gap to the least busy core, until the imbalance is
    /// under the threshold or no entry helps; few moves per period. An entry
    /// helps if it is lighter than the whole gap (the pair's larger load
    /// drops; the sum of squared loads strictly falls, so no cycle): an
    /// elephant entry a little over half the gap still moves in one step,
    /// where only entries under half the gap would take dozens of small ones.
    fn rebalance(&mut self, s: &LoadSample<'_>) -> Vec<(u16, u16)> {
        let mut loads = s.queue_loads();
        let mut owners = s.owners.to_vec();
        let mut moves = Vec::new();
        while moves.len() < self.max_moves && imbalance(&loads) > self.threshold {
            let Some((hi, &max)) = loads.iter().enumerate().max_by_key(|(_, &l)| l) else { break };
            let Some((lo, &min)) = loads.iter().enumerate().min_by_key(|(_, &l)| l) else { break };
            let gap = max - min;
            // The entry of the busiest core that best halves the gap (ties: the heavier).
            let best = owners
                .iter()
                .enumerate()
                .filter(|&(e, &o)| o as usize == hi && s.entry_packets[e] > 0 && s.entry_packets[e] < gap)
                .min_by_key(|&(e, _)| {
                    (s.entry_packets[e].saturating_mul(2).abs_diff(gap), u64::MAX - s.entry_packets[e])
                })
                .map(|(e, _)| e);
            let Some(e) = best else { break };
            let p = s.entry_packets[e];
            loads[hi] -= p;
            loads[lo] += p;
            owners[e] = lo as u16;
            moves.push((e as u16, lo as u16));
        }
        moves
    }
}


#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rsspp_moves_load_from_the_busiest_core() {
        // 8 entries on 2 cores; core 0 carries an elephant entry and more.
        let packets = [500, 10, 300, 10, 200, 10, 100, 10];
        let owners = [0, 1, 0, 1, 0, 1, 0, 1];
        let s = LoadSample { entry_packets: &packets, owners: &owners, queues: 2 };
        assert!(imbalance(&s.queue_loads()) > 0.9);
        let mut r = RssPlusPlus::default();
        let moves = r.rebalance(&s);
        let mut o = owners;
        for (e, q) in &moves {
            o[*e as usize] = *q;
        }
        let after = LoadSample { entry_packets: &packets, owners: &o, queues: 2 }.queue_loads();
        assert!(imbalance(&after) < 0.2, "{after:?} after {moves:?}");
        assert!(moves.len() <= 3);
    }

    #[test]
    fn rsspp_moves_an_elephant_entry_a_little_over_half_the_gap() {
        // 8 cores, 64 entries each of load 10; elephants (+625) on entries 0, 8 (core 0) and 1, 9 (core 1):
        // cores 0 and 1 carry 1890, cores 2..7 640. Balanced is 952.5 per core.
        let mut packets = vec![10u64; 512];
        for e in [0, 8, 1, 9] {
            packets[e] += 625;
        }
        let owners: Vec<u16> = (0..512).map(|e| (e % 8) as u16).collect();
        let s = LoadSample { entry_packets: &packets, owners: &owners, queues: 8 };
        let mut r = RssPlusPlus::default();
        let moves = r.rebalance(&s);
        let mut o = owners.clone();
        for (e, q) in &moves {
            o[*e as usize] = *q;
        }
        let after = LoadSample { entry_packets: &packets, owners: &o, queues: 8 }.queue_loads();
        // One elephant leaves each loaded core in the first period (later periods even out small entries).
        assert!(moves.iter().filter(|(e, _)| packets[*e as usize] > 600).count() >= 2, "{moves:?}");
        assert!(moves.len() <= r.max_moves);
        // Four indivisible elephants on eight cores: the best is one per core (max 1265).
        assert!(after.iter().max() <= Some(&1265), "{after:?}");
    }
}
