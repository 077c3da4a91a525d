//! `dyssect`: Dyssect's registration (the controller is [`crate::dyssect`]).

use super::{Controller, Strategy, StrategyInfo};
use crate::dyssect::{Config, Dyssect};

/// Registration (see [`super::STRATEGIES`]).
pub const INFO: StrategyInfo = StrategyInfo {
    name: "dyssect",
    about: "Dyssect: shards and offloaded heavy flows moved by an MILP controller on two timescales",
    build: |c| {
        Box::new(Dyssect::new(Config {
            short: c.period,
            long: c.long_period,
            budget: c.solver_budget,
            priority: c.priority,
            slo_us: c.slo_us,
            rate_pps: c.rate_pps,
            batch: c.batch,
            ..Default::default()
        }))
    },
};

impl Strategy for Dyssect {
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
