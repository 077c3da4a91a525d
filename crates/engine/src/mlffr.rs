//! Maximum loss-free forwarding rate (the SCR paper's methodology): a
//! binary search of the offered (paced) rate of one configuration for the
//! highest rate whose loss stays under a threshold. Loss is what the port
//! loses — receive-ring overflow (`rx_ring_full`) and transmit failures —
//! never an NF's verdict; pool exhaustion delays receive (the packets wait
//! in the ring) and shows up as ring overflow.
//!
//! Each trial starts with a learning phase at the trial's rate (RFC 2544
//! §23: the device learns its flows first) whose losses do not count: the
//! first packets of a run insert every flow and find cold caches, and a
//! worker paced just under its capacity runs with small batches and little
//! slack, so that transient alone would decide the search otherwise.
//!
//! A lossy trial is repeated (`retries`, default 1) and the rate counts as
//! lossy only if every attempt loses: on a shared machine a core taken off
//! the CPU for a few ms loses a ring's worth of packets at any rate, which
//! is not the chain being slow (RFC 2544 asks for the rate at which the
//! device drops nothing; a repeat that drops nothing shows it can). The
//! unpaced rate is measured before and after the search, so the report
//! shows how far the configuration's own speed moved meanwhile (a
//! memory-bound chain on a shared host moves by several percent).

use std::time::Duration;

use serde::Serialize;

use crate::error::EngineError;
use crate::runner::{run_prepared, Output, Prepared, RunConfig};
use crate::spec::ChainSpec;

/// How to search.
#[derive(Clone, Copy, Debug)]
pub struct MlffrConfig {
    /// Largest loss fraction counted as loss-free (default 0.001 = 0.1%).
    pub loss: f64,
    /// Stop when the bracket is narrower than this fraction of its upper end (default 0.01).
    pub resolution: f64,
    /// Length of each trial.
    pub trial: Duration,
    /// Upper end of the search (packets/s); None: 1.5x the full-speed rate.
    pub max_rate: Option<f64>,
    /// Learning phase before each trial, at the trial's rate, not counted (default 250 ms).
    pub warmup: Duration,
    /// Repeats of a lossy trial before its rate counts as lossy (default 1; the upper end's first trial is not repeated).
    pub retries: u32,
}

impl Default for MlffrConfig {
    fn default() -> Self {
        MlffrConfig {
            loss: 0.001,
            resolution: 0.01,
            trial: Duration::from_secs(1),
            max_rate: None,
            warmup: Duration::from_millis(250),
            retries: 1,
        }
    }
}

/// One trial.
#[derive(Clone, Debug, Serialize)]
pub struct Trial {
    /// Offered rate (packets/s over the port).
    pub rate_pps: f64,
    /// Packets that arrived at the port (after the learning phase).
    pub offered: u64,
    /// Packets received by the workers.
    pub received: u64,
    /// Packets lost by the port (ring overflow, transmit errors).
    pub lost: u64,
    /// lost / offered.
    pub loss: f64,
    /// Within the threshold.
    pub loss_free: bool,
    /// 0 for a rate's first trial, k for its k-th repeat (the earlier ones lost).
    pub repeat: u32,
}

/// The search's result.
#[derive(Clone, Debug, Serialize)]
pub struct Mlffr {
    /// The maximum loss-free forwarding rate found (packets/s).
    pub mlffr_pps: f64,
    /// Unpaced throughput of the same configuration (packets/s), the search's reference.
    pub full_speed_pps: f64,
    /// The unpaced throughput again after the search (packets/s): how far it moved meanwhile.
    pub full_speed_after_pps: f64,
    /// Loss threshold used.
    pub loss_threshold: f64,
    /// Resolution used.
    pub resolution: f64,
    /// Every trial, in order.
    pub trials: Vec<Trial>,
}

/// One trial's run of `cfg`: offered at `rate` (None: full speed), for the
/// trial's time after its learning phase, no export files.
pub(crate) fn trial_config(cfg: &RunConfig, m: &MlffrConfig, rate: Option<f64>) -> RunConfig {
    RunConfig {
        rate_pps: rate,
        loops: None,
        duration: Some(m.trial),
        warmup: Some(m.warmup),
        export: Vec::new(),
        ..cfg.clone()
    }
}

fn trial(
    cfg: &RunConfig,
    spec: &ChainSpec,
    p: &Prepared,
    rate: Option<f64>,
    m: &MlffrConfig,
) -> Result<(Trial, f64), EngineError> {
    let r = run_prepared(&trial_config(cfg, m, rate), spec, p, Output::Discard)?;
    let sc = r.scale.as_ref();
    // Counted from the end of the learning phase (the transmit counters restart there too).
    let lost = sc.map_or(0, |s| s.rx_ring_full_measured) + r.tx_errors;
    let offered = sc.map_or(0, |s| s.offered_measured).max(r.packets + lost);
    let loss = if offered > 0 { lost as f64 / offered as f64 } else { 0.0 };
    let t =
        Trial { rate_pps: rate.unwrap_or(0.0), offered, received: r.packets, lost, loss, loss_free: false, repeat: 0 };
    // Packets over the busy span of the slowest core (not the table set-up).
    Ok((t, r.mpps * 1e6))
}

/// Searches the MLFFR of `spec` on the prepared input under `cfg` (cores, strategy, ...).
pub fn search(cfg: &RunConfig, spec: &ChainSpec, p: &Prepared, m: &MlffrConfig) -> Result<Mlffr, EngineError> {
    if !((0.0..1.0).contains(&m.loss) && m.resolution > 0.0 && m.resolution < 1.0) {
        return Err(EngineError::Config("mlffr: loss must be in [0, 1) and resolution in (0, 1)".to_string()));
    }
    let (_, full) = trial(cfg, spec, p, None, m)?;
    let mut hi = m.max_rate.unwrap_or(full * 1.5).max(1.0);
    let mut lo = 0.0f64;
    let mut trials = Vec::new();
    // The upper end must lose; if it does not, it is the answer (capped search).
    while hi - lo > m.resolution * hi {
        let first = trials.is_empty();
        let mid = if first { hi } else { (lo + hi) / 2.0 };
        let mut ok = false;
        for repeat in 0..=if first { 0 } else { m.retries } {
            let (mut t, _) = trial(cfg, spec, p, Some(mid), m)?;
            t.loss_free = t.loss <= m.loss;
            t.repeat = repeat;
            ok = t.loss_free;
            trials.push(t);
            if ok {
                break;
            }
        }
        if ok {
            lo = mid;
            if mid >= hi {
                break;
            }
        } else {
            hi = mid;
        }
    }
    let (_, after) = trial(cfg, spec, p, None, m)?;
    Ok(Mlffr {
        mlffr_pps: lo,
        full_speed_pps: full,
        full_speed_after_pps: after,
        loss_threshold: m.loss,
        resolution: m.resolution,
        trials,
    })
}
