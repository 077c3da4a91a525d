//! An SCR run's setup: whether a chain can run under SCR, the fields its
//! records carry, and the run's shared parts (sequencer, logs, stream end).

use std::sync::Arc;

use flowplane_io::scr::Sequencer;
use flowplane_nf::stateful::{Granularity, ScrFields};

use super::config::ScrConfig;
use super::log::ScrLogs;
use crate::chain::{Chain, Stage};

/// Why a chain cannot run under SCR (None: it can), for the placement check.
pub fn refusal(chain: &Chain) -> Option<String> {
    for s in &chain.stages {
        if let Stage::Stateful { nf, .. } = s {
            if nf.scr_fields().is_none() {
                return Some(format!(
                    "{} does not declare an SCR state transition (scr_fields/scr_transition); SCR-aware NFs: ddos, hh, portknock, ratelimit, conntrack, burn",
                    nf.name()
                ));
            }
            // Opting in declares the NF's own state a function of the packet
            // sequence (conntrack's table); a per-core port pool never is.
            if matches!(nf.placement().global, flowplane_nf::GlobalState::PortPool { .. }) {
                return Some(format!(
                    "{} keeps NF-global state that is not a function of the packet sequence",
                    nf.name()
                ));
            }
            if !matches!(nf.granularity(), Granularity::FiveTuple | Granularity::SrcIp | Granularity::DstIp) {
                return Some(format!(
                    "{} is keyed by {}, which SCR records do not carry",
                    nf.name(),
                    nf.granularity().name()
                ));
            }
            if nf.state_align() > 8 {
                return Some(format!("{}'s state needs {}-byte alignment", nf.name(), nf.state_align()));
            }
        }
    }
    None
}

/// The fields the chain's history records carry (union of the NFs' declarations).
pub fn chain_fields(chain: &Chain) -> ScrFields {
    chain.stages.iter().fold(ScrFields::default(), |f, s| match s {
        Stage::Stateful { nf, .. } => f.with(nf.scr_fields().unwrap_or_default()),
        Stage::Stateless(_) => f,
    })
}

/// An SCR run's shared parts: the sequencer, the logs, the stream's end.
pub struct ScrRun {
    /// The sequencer (shared by every queue and replica).
    pub seq: Arc<Sequencer>,
    /// Per-core logs (recovery on).
    pub logs: Option<Arc<ScrLogs>>,
    /// Last sequence number of a bounded run.
    pub end: Option<u64>,
    /// Fields the records carry for the chain.
    pub fields: ScrFields,
    /// Distinct connections (canonical 5-tuples) in the stream: sizes the replica tables.
    pub keys: usize,
}

impl ScrRun {
    /// Checks the configuration for `workers` workers on `threads` threads
    /// and builds the sequencer over `trace`.
    pub fn new(
        cfg: &ScrConfig,
        workers: usize,
        threads: usize,
        loops: Option<u64>,
        trace: &flowplane_io::replay::ReplayTrace,
        chain: &Chain,
    ) -> Result<ScrRun, crate::error::EngineError> {
        let history = Self::check(cfg, workers, threads)?;
        let seq = Arc::new(Sequencer::new(trace, history, cfg.loss, cfg.seed));
        let end = loops.map(|l| l.saturating_mul(seq.stream_len()));
        let keys = (1..=seq.stream_len())
            .map(|s| seq.record(s).connection_key())
            .collect::<std::collections::HashSet<u128>>()
            .len();
        Ok(ScrRun { seq, logs: Self::logs(cfg, workers), end, fields: chain_fields(chain), keys })
    }

    /// [`ScrRun::new`] for a stream with no trace behind it (live ports:
    /// the dispatcher core stamps packets as they arrive,
    /// [`flowplane_io::scr::Stamper`]). The replica tables take `flows`
    /// entries (the flow-table capacity); the end is not known before the
    /// stream stops (the stamper leaves it with the sequencer, and every
    /// replica catches up to it: [`Sequencer::end`]).
    pub fn streaming(
        cfg: &ScrConfig,
        workers: usize,
        threads: usize,
        flows: usize,
        chain: &Chain,
    ) -> Result<ScrRun, crate::error::EngineError> {
        let history = Self::check(cfg, workers, threads)?;
        let seq = Arc::new(Sequencer::streaming(history, cfg.loss, cfg.seed));
        Ok(ScrRun { seq, logs: Self::logs(cfg, workers), end: None, fields: chain_fields(chain), keys: flows.max(1) })
    }

    /// The configuration's checks; the history N.
    fn check(cfg: &ScrConfig, workers: usize, threads: usize) -> Result<usize, crate::error::EngineError> {
        let bad = |m: String| Err(crate::error::EngineError::Config(m));
        let history = cfg.history.unwrap_or(workers);
        if history < workers || history > 4096 {
            return bad(format!(
                "--scr-history {history}: must be at least the number of cores ({workers}; a core sees every N-th packet) and at most 4096"
            ));
        }
        if !(0.0..=1.0).contains(&cfg.loss) {
            return bad(format!("--scr-loss {}: a rate between 0 and 1", cfg.loss));
        }
        if cfg.recovery && threads < workers {
            return bad(
                "--scr-recovery needs one real core per worker (a core waits for the others' logs; logical workers taking turns would wait forever)"
                    .to_string(),
            );
        }
        if !cfg.log_entries.is_power_of_two() || cfg.log_entries < 2 * history {
            return bad(format!("SCR log of {} entries: a power of two of at least 2N", cfg.log_entries));
        }
        Ok(history)
    }

    /// The per-core logs (recovery on).
    fn logs(cfg: &ScrConfig, workers: usize) -> Option<Arc<ScrLogs>> {
        // One core has no other log to recover from: a token log (never written per packet).
        let entries = if workers > 1 { cfg.log_entries } else { 2 };
        cfg.recovery.then(|| Arc::new(ScrLogs::new(workers, entries)))
    }
}
