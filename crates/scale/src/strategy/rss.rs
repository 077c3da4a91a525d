//! `rss`: shared-nothing sharding by the NIC's table (a static RETA).

use super::{Strategy, StrategyInfo};

/// Registration (see [`super::STRATEGIES`]).
pub const INFO: StrategyInfo = StrategyInfo {
    name: "rss",
    about: "shared-nothing: the NIC's hash and table steer each flow to one core, never changed",
    build: |_| Box::new(Rss),
};

/// Shared-nothing RSS sharding (a static table).
#[derive(Debug, Default)]
pub struct Rss;

impl Strategy for Rss {
    fn name(&self) -> &'static str {
        INFO.name
    }
}
