//! `shared`: round-robin spray over the cores with state in shared tables.

use super::{Delivery, Strategy, StrategyInfo};

/// Registration (see [`super::STRATEGIES`]).
pub const INFO: StrategyInfo = StrategyInfo {
    name: "shared",
    about: "round-robin spray, one flow over every core, state in shared tables (locks)",
    build: |_| Box::new(Shared),
};

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
        INFO.name
    }
    fn delivery(&self) -> Delivery {
        Delivery::Spray
    }
    fn projectable(&self) -> bool {
        false
    }
}
