//! `scr`: State-Compute Replication (Ghasemirahni et al.): a sequencer
//! sprays with piggybacked history; every core keeps a replica of all state.

use super::{Delivery, Strategy, StrategyInfo};

/// Registration (see [`super::STRATEGIES`]).
pub const INFO: StrategyInfo = StrategyInfo {
    name: "scr",
    about: "State-Compute Replication: a sequencer sprays with history, every core replicates all state",
    build: |_| Box::new(Scr),
};

/// SCR: round-robin spray with piggybacked history and per-core state
/// replicas. Workers share nothing at run time (a core reads another's log
/// only to recover a lost packet), so a projection over logical workers is
/// meaningful.
#[derive(Debug, Default)]
pub struct Scr;

impl Strategy for Scr {
    fn name(&self) -> &'static str {
        INFO.name
    }
    fn delivery(&self) -> Delivery {
        Delivery::Sequenced
    }
}
