//! How an SCR run is configured (`--scr-history`, `--scr-recovery`, `--scr-loss`,
//! `--scr-log`, `--seed`).

/// Default log entries per core (a power of two; 40 B each: 640 KB, in a
/// core's L2 here). A core logs every sequence it receives: a log the cache
/// holds costs a few stores per record, one larger than the cache a
/// write-allocate miss per line (`bench scr`'s recovery rows, 2 cores,
/// portknock: 0.84-0.86 of recovery off with 256 K entries, 0.89-0.98 with
/// 16 K). A core may run at most the log size (less N) ahead of the slowest
/// before it waits (see `ScrReplica::wait_for_slowest`): 16 K sequences is
/// a few hundred microseconds at full speed, so a core waits when the other
/// is descheduled (counted: `drift_waits`), never overwrites what it may
/// still need (`--scr-log` changes it; the paper's logs have 1024 entries).
pub const DEFAULT_LOG: usize = 1 << 14;

/// How SCR runs (`--scr-history`, `--scr-recovery`, `--scr-loss`, `--seed`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScrConfig {
    /// Records piggybacked per packet (None: the number of workers).
    pub history: Option<usize>,
    /// Per-core logs and Algorithm 1.
    pub recovery: bool,
    /// Probability that a packet is lost between the sequencer and its core.
    pub loss: f64,
    /// Seed of the loss pattern.
    pub seed: u64,
    /// Log entries per core (a power of two).
    pub log_entries: usize,
}

impl Default for ScrConfig {
    fn default() -> Self {
        ScrConfig { history: None, recovery: false, loss: 0.0, seed: 1, log_entries: DEFAULT_LOG }
    }
}
