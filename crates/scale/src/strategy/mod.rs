//! Multi-core strategies as components. A strategy says how packets reach
//! the workers ([`Delivery`]: steered by the NIC's table, sprayed, or
//! sprayed by a sequencer with history), which with the NFs' declared
//! placement decides what each worker runs (the chain over per-core or
//! shared tables, or an SCR replica), and may bring a [`Controller`]: the
//! control loop run every period that changes the steering (RETA moves and
//! flow rules, carried out with state hand-over). The runtime asks for these
//! pieces; it never branches on a strategy's name.
//!
//! One file per strategy in this directory exporting its registration
//! `pub const INFO: StrategyInfo`, named on the one `strategies!(...)` line
//! that declares the modules and [`STRATEGIES`] — the same descriptor-table
//! style as the executors (`EXECUTORS`), the NFs (`NFS`) and the ports
//! (`PORTS`):
//! - `rss`: shared-nothing sharding by the RETA, never changed.
//! - `shared`: round-robin spray, one flow over every core; state must live
//!   in shared tables.
//! - `rsspp`: RSS++ (Barbette et al., CoNEXT 2019): per-RETA-entry packet
//!   counters; every period a few entries move from the busiest cores to the
//!   least busy ones.
//! - `scr`: SCR (Ghasemirahni et al.): a sequencer sprays with history,
//!   every core keeps a replica of all state.
//! - `dyssect`: Dyssect (shards plus offloaded heavy flows, an MILP
//!   controller on two timescales; [`crate::dyssect`]).

use std::time::Duration;

use crate::dyssect::class::PriorityClass;
use crate::ScaleError;

pub use rss::Rss;
pub use rsspp::RssPlusPlus;
pub use scr::Scr;
pub use shared::Shared;

/// Declares the registry: each strategy's module and its descriptor, in `--scale` order.
macro_rules! strategies {
    ($($name:ident),+ $(,)?) => {
        $(mod $name;)+
        /// Every strategy, by name; the first is the default.
        pub static STRATEGIES: &[StrategyInfo] = &[$($name::INFO),+];
    };
}

// The registry: one file per strategy in this directory, named here.
strategies!(rss, shared, rsspp, scr, dyssect);

/// A registered strategy.
pub struct StrategyInfo {
    /// Name for `--scale`.
    pub name: &'static str,
    /// One line for help texts.
    pub about: &'static str,
    /// Builds the strategy for a run.
    pub build: fn(&StrategyConfig) -> Box<dyn Strategy>,
}

/// The run's settings a strategy may use.
#[derive(Clone, Debug)]
pub struct StrategyConfig {
    /// Control period (the short timescale).
    pub period: Duration,
    /// Dyssect's long timescale.
    pub long_period: Duration,
    /// Dyssect's MILP time budget.
    pub solver_budget: Duration,
    /// A traffic class kept on cores sized for its SLO (Dyssect).
    pub priority: Option<PriorityClass>,
    /// The priority class's latency SLO (µs).
    pub slo_us: Option<f64>,
    /// Offered rate when known (paced runs; Dyssect's utilisations).
    pub rate_pps: Option<f64>,
    /// Packets per batch (Dyssect's service unit).
    pub batch: usize,
}

impl Default for StrategyConfig {
    fn default() -> Self {
        StrategyConfig {
            period: DEFAULT_PERIOD,
            long_period: Duration::from_secs(1),
            solver_budget: Duration::from_millis(200),
            priority: None,
            slo_us: None,
            rate_pps: None,
            batch: 64,
        }
    }
}

/// The strategies `--scale` accepts, in registry order.
pub fn names() -> Vec<&'static str> {
    STRATEGIES.iter().map(|s| s.name).collect()
}

/// The strategy named `name`, built for `cfg`.
pub fn build(name: &str, cfg: &StrategyConfig) -> Result<Box<dyn Strategy>, ScaleError> {
    STRATEGIES.iter().find(|s| s.name == name).map(|s| (s.build)(cfg)).ok_or_else(|| ScaleError::Strategy(name.into()))
}

/// The strategy named `name` with its control period (other settings default).
pub fn by_name(name: &str, period: Duration) -> Result<Box<dyn Strategy>, ScaleError> {
    build(name, &StrategyConfig { period, ..Default::default() })
}

/// Default control period (RSS++'s and Dyssect's minimum suggested one).
pub const DEFAULT_PERIOD: Duration = Duration::from_millis(100);

/// How packets reach the workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// Steered by the table (RETA, flow rules): a flow stays on its worker
    /// until a controller moves it, with its state.
    Table,
    /// Sprayed round robin: a flow over every worker; its state lives in
    /// shared tables (the NFs' placement decides which may run).
    Spray,
    /// Sprayed round robin by a sequencer that stamps each packet with its
    /// sequence number and the recent history: every worker keeps a replica
    /// of all state and runs it in sequence order (SCR).
    Sequenced,
}

impl Delivery {
    /// A flow's packets go to more than one worker.
    pub fn sprays(self) -> bool {
        self != Delivery::Table
    }
}

/// A multi-core strategy: its delivery, and its controller if it has one.
pub trait Strategy: Send {
    /// Name for `--scale`.
    fn name(&self) -> &'static str;
    /// How packets reach the workers.
    fn delivery(&self) -> Delivery {
        Delivery::Table
    }
    /// Logical workers are independent (shared-nothing): a projection from
    /// per-worker busy time means something. False where the cost is contention.
    fn projectable(&self) -> bool {
        true
    }
    /// The control loop, if the strategy changes the steering while running.
    fn controller(&self) -> Option<&dyn Controller> {
        None
    }
    /// The control loop, to run a period.
    fn controller_mut(&mut self) -> Option<&mut dyn Controller> {
        None
    }
    /// The strategy's own report section (decisions, loads over time).
    fn report_json(&self) -> Option<serde_json::Value> {
        self.controller().and_then(|c| c.report_json())
    }
}

/// A strategy's control loop: run every period on the runtime's control
/// thread, it moves RETA entries (with the flows' state) and installs flow
/// rules. Its presence means flows move at run time: every NF's per-flow
/// state must be migratable (the placement check refuses the chain else).
pub trait Controller: Send {
    /// Control period.
    fn period(&self) -> Duration {
        DEFAULT_PERIOD
    }
    /// The control loop needs per-RETA-entry packet counts.
    fn counts_loads(&self) -> bool {
        false
    }
    /// Rebalance CPU load (entry packets x its core's cycles per packet)
    /// rather than packets. Cycle figures are noisy on a shared machine.
    fn balance_cpu(&self) -> bool {
        false
    }
    /// Called every period: RETA entries to move, as (entry, new queue).
    fn rebalance(&mut self, _s: &LoadSample<'_>) -> Vec<(u16, u16)> {
        Vec::new()
    }
    /// Run-time exact-match flow-rule slots the controller needs in the NIC (Dyssect).
    fn flow_slots(&self) -> usize {
        0
    }
    /// Workers sample one packet in this many into a heavy-flow sketch (0: no sampling).
    fn sample_stride(&self) -> u32 {
        0
    }
    /// Called every period instead of [`Controller::rebalance`] by
    /// controllers that drive the table themselves (RETA moves and flow
    /// rules); `cpp`: each queue's worker cycles per packet, `hz`: TSC rate.
    /// True if handled.
    fn drive(&mut self, _st: &crate::steer::Steering, _s: &LoadSample<'_>, _cpp: &[f64], _hz: f64) -> bool {
        false
    }
    /// The controller's report section (decisions, loads over time).
    fn report_json(&self) -> Option<serde_json::Value> {
        None
    }
    /// True once the controller has done what the run is for: the run stops
    /// (as at its deadline). Tests whose length is a number of moves, not
    /// of packets, end this way.
    fn finished(&self) -> bool {
        false
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_builds_every_strategy_by_name() {
        assert_eq!(names(), ["rss", "shared", "rsspp", "scr", "dyssect"]);
        for n in names() {
            assert_eq!(by_name(n, DEFAULT_PERIOD).unwrap().name(), n);
        }
        assert!(by_name("scr2", DEFAULT_PERIOD).is_err());
        let d = |n: &str| by_name(n, DEFAULT_PERIOD).unwrap().delivery();
        assert_eq!((d("rss"), d("shared"), d("scr")), (Delivery::Table, Delivery::Spray, Delivery::Sequenced));
        let moves = |n: &str| by_name(n, DEFAULT_PERIOD).unwrap().controller().is_some();
        assert!(moves("rsspp") && moves("dyssect") && !moves("rss") && !moves("shared") && !moves("scr"));
    }
}
