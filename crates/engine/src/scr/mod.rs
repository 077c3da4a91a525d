//! State-compute replication (`--scale scr`; Ghasemirahni et al., SCR):
//! each core keeps a private replica of the whole chain's state. The
//! sequencer ([`flowplane_io::scr`]) sprays packets round robin and
//! piggybacks on each the records of the last N packets; before processing
//! its own packet a core fast-forwards its replica over the entries it has
//! not seen (each NF's `scr_transition`, in chain order, no verdict, no
//! output), then runs the unchanged NFs (`process`) on its packet with the
//! sequencer's timestamp as the packet clock.
//!
//! This module owns the replicas (one [`flowplane_table::FixedMap`] of exactly
//! `--flows` keys per stateful NF, keyed from the history record, so every
//! core keys alike), the per-core
//! single-writer logs and the loss recovery of Algorithm 1 (Appendix B:
//! NOT_INIT / LOST markers, finite circular logs, a missing entry recovered
//! from the other cores' logs), and the state digest that proves the
//! replicas identical at the end of a run.
//!
//! Algorithm 1 assumes a later packet reveals every loss. At the end of a
//! run (finite trace, or stopped by `--duration`) each core claims the last
//! sequence number it knows the sequencer emitted, and every core catches
//! up to the highest claim from the other cores' logs: a loss burst that
//! reaches the end is recovered, lost everywhere, or reported, like any
//! other. A core never runs more than the log size ahead of what the
//! slowest core still has to read (it waits; see `wait_for_slowest`), and
//! a core that has claimed keeps catching up to the others until they all
//! have, so no entry is overwritten before every core has read it. These
//! waits have no time limit (a descheduled core comes back): they end when
//! the other core progresses, finishes, or is gone (its worker ended early).
//!
//! Replicas stay identical because everything that changes them is a
//! function of the packet sequence: the records (keys, fields, time),
//! insertion and idle expiry on record time, and the removal of idle keys
//! when a new key finds a table full (at the same sequence number on every
//! core; a key that still finds no room is refused on every core alike, and
//! counted once, as `table_full`, on the core whose packet it was).

mod config;
mod export;
pub(crate) mod ff;
mod log;
mod replica;
mod report;
mod run;
mod table;
#[cfg(test)]
mod tests;

pub use config::{ScrConfig, DEFAULT_LOG};
pub use export::add_v6_folds;
pub use log::{recover, LogRead, Recovered, ScrLog, ScrLogs};
pub use replica::{Planned, ScrBatch, ScrReplica};
pub use report::{ScrCoreReport, ScrReport};
pub use run::{chain_fields, refusal, ScrRun};
pub(crate) use table::KeyPattern;
pub use table::{KeyOf, ReplicaTable};
