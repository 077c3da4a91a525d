//! Multi-core strategies behind one trait: how packets are spread over
//! cores (the NIC's table or a round-robin spray), what that demands of the
//! NFs' state (the runtime checks each NF's declared placement against
//! these properties), and a control loop run every period that may change
//! the spreading (RETA moves, carried out with state hand-over).
//!
//! - `rss`: shared-nothing sharding by the RETA, never changed.
//! - `shared`: round-robin spray, one flow over every core; state must live
//!   in shared tables.
//! - `rsspp`: RSS++ (Barbette et al., CoNEXT 2019): per-RETA-entry packet
//!   counters; every period a few entries move from the busiest cores to the
//!   least busy ones.
//!
//! SCR (a sequencer spraying with history) and Dyssect (shards plus
//! offloaded flows, an optimisation-based controller) plug in here: SCR as
//! a spraying strategy whose NFs replicate state, Dyssect as a table
//! strategy with its own `rebalance` and flow-level rules.

use std::time::Duration;

use crate::ScaleError;

/// The strategies `--scale` accepts now.
pub const NAMES: &[&str] = &["rss", "shared", "rsspp", "scr", "dyssect"];

/// Default control period (RSS++'s and Dyssect's minimum suggested one).
pub const DEFAULT_PERIOD: Duration = Duration::from_millis(100);

/// What the control loop sees every period.
#[derive(Clone, Debug)]
pub struct LoadSample<'a> {
    /// Packets received per RETA entry during the period.
    pub entry_packets: &'a [u64],
    /// Current owner of each RETA entry.
    pub owners: &'a [u16],
    /// Queues (cores).
    pub queues: usize,
}

impl LoadSample<'_> {
    /// Packets per queue during the period.
    pub fn queue_loads(&self) -> Vec<u64> {
        let mut l = vec![0u64; self.queues];
        for (&p, &o) in self.entry_packets.iter().zip(self.owners) {
            if let Some(x) = l.get_mut(o as usize) {
                *x += p;
            }
        }
        l
    }
}

/// FAJITA's load-imbalance factor of per-core packet counts: the
/// difference between the busiest and least busy core relative to the
/// busiest (0 balanced, 1 one core idle).
pub fn imbalance(loads: &[u64]) -> f64 {
    let max = loads.iter().copied().max().unwrap_or(0);
    let min = loads.iter().copied().min().unwrap_or(0);
    if max == 0 {
        0.0
    } else {
        (max - min) as f64 / max as f64
    }
}

/// A multi-core strategy.
pub trait Strategy: Send {
    /// Name for `--scale`.
    fn name(&self) -> &'static str;
    /// Packets sprayed round robin (a flow over all cores) instead of steered by the table.
    fn spray(&self) -> bool {
        false
    }
    /// RETA entries move between cores at run time (per-flow state must be migratable).
    fn moves_flows(&self) -> bool {
        false
    }
    /// Logical workers are independent (shared-nothing): a projection from
    /// per-worker busy time means something. False where the cost is contention.
    fn projectable(&self) -> bool {
        true
    }
    /// The control loop needs per-RETA-entry packet counts.
    fn counts_loads(&self) -> bool {
        false
    }
    /// Control period.
    fn period(&self) -> Duration {
        DEFAULT_PERIOD
    }
    /// Rebalance CPU load (entry packets x its core's cycles per packet)
    /// rather than packets. Cycle figures are noisy on a shared machine.
    fn balance_cpu(&self) -> bool {
        false
    }
    /// State-compute replication: packets sprayed round robin by a
    /// sequencer that piggybacks the recent history; every core keeps a
    /// private replica of all state (NFs must opt in, see `engine::scr`).
    fn replicates(&self) -> bool {
        false
    }
    /// Called every period: RETA entries to move, as (entry, new queue).
    fn rebalance(&mut self, _s: &LoadSample<'_>) -> Vec<(u16, u16)> {
        Vec::new()
    }
    /// Run-time exact-match flow-rule slots the strategy needs in the NIC (Dyssect).
    fn flow_slots(&self) -> usize {
        0
    }
    /// Workers sample one packet in this many into a heavy-flow sketch (0: no sampling).
    fn sample_stride(&self) -> u32 {
        0
    }
    /// Called every period instead of [`Strategy::rebalance`] by strategies
    /// that drive the table themselves (RETA moves and flow rules); `cpp`:
    /// each queue's worker cycles per packet, `hz`: TSC rate. True if handled.
    fn drive(&mut self, _st: &crate::steer::Steering, _s: &LoadSample<'_>, _cpp: &[f64], _hz: f64) -> bool {
        false
    }
    /// The strategy's own report section (decisions, loads over time).
    fn report_json(&self) -> Option<serde_json::Value> {
        None
    }
    /// True once the strategy has done what the run is for: the run stops
    /// (as at its deadline). Tests whose length is a number of moves, not
    /// of packets, end this way.
    fn finished(&self) -> bool {
        false
    }
}

/// Shared-nothing RSS sharding (a static table).
#[derive(Debug, Default)]
pub struct Rss;

impl Strategy for Rss {
    fn name(&self) -> &'static str {
        "rss"
    }
}

/// Round-robin spray over cores with shared state (SCR's and FAJITA's baseline).
///
/// Every NF whose state updates commute (counters, lb's per-flow backend, acl) gives the same results as `rss`.
/// NFs whose verdicts depend on per-key packet order (ddos, ratelimit, policer, portknock, psd) run, but a key's
/// packets reach its state in whatever order the cores get there, with no bound on how far apart: their verdicts,
/// state and exports may differ from a serial run (per-key packet and byte counts stay exact). The report says so
/// (`order_not_guaranteed`, `verdicts_may_differ`); NFs with per-core state (fw, nat, conntrack) are refused.
#[derive(Debug, Default)]
pub struct Shared;

impl Strategy for Shared {
    fn name(&self) -> &'static str {
        "shared"
    }
    fn spray(&self) -> bool {
        true
    }
    fn projectable(&self) -> bool {
        false
    }
}

/// SCR (Ghasemirahni et al.): round-robin spray with piggybacked history
/// and per-core state replicas. Workers share nothing at run time (a
/// core reads another's log only to recover a lost packet), so a
/// projection over logical workers is meaningful.
#[derive(Debug, Default)]
pub struct Scr;

impl Strategy for Scr {
    fn name(&self) -> &'static str {
        "scr"
    }
    fn spray(&self) -> bool {
        true
    }
    fn replicates(&self) -> bool {
        true
    }
}

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
        "rsspp"
    }
    fn moves_flows(&self) -> bool {
        true
    }
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

/// The strategy named `name` with its control period.
pub fn by_name(name: &str, period: Duration) -> Result<Box<dyn Strategy>, ScaleError> {
    match name {
        "rss" => Ok(Box::new(Rss)),
        "shared" => Ok(Box::new(Shared)),
        "rsspp" => Ok(Box::new(RssPlusPlus::with_period(period))),
        "scr" => Ok(Box::new(Scr)),
        "dyssect" => {
            Ok(Box::new(crate::dyssect::Dyssect::new(crate::dyssect::Config { short: period, ..Default::default() })))
        }
        _ => Err(ScaleError::Strategy(name.to_string())),
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
        assert!(Rss.rebalance(&s).is_empty());
        assert!(by_name("dyssect", DEFAULT_PERIOD).is_ok() && by_name("scr2", DEFAULT_PERIOD).is_err());
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
