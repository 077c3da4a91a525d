//! `flowplane-engine`: turns a chain spec into per-core NF instances and
//! runs them: source -> batch -> chain -> sink on every worker core, then
//! merges counters, TSC cycles and batch-latency histograms into a [`Report`].
//!
//! - [`spec`]: the chain-spec language.
//! - [`chain`]: building NF instances from a spec (one set per core; a
//!   chain graph segment by segment).
//! - [`graph`]: a chain graph's branch points: the batch split into
//!   sub-batches by verdict, each branch's pipeline, the join.
//! - [`worker`]: the per-core run loop.
//! - [`runner`]: starting workers on cores and collecting the report.
//! - [`live`]: long-running runs on real ports (until stopped), with live figures.

#![forbid(unsafe_code)]

pub mod budget;
pub mod chain;
pub mod coarse;
pub mod control;
pub mod error;
pub mod exec;
pub mod frag;
pub mod graph;
pub mod hist;
pub mod ipfix;
mod kernel_moves;
pub mod live;
pub mod load;
pub mod mlffr;
pub mod mlffr_port;
pub mod placement;
pub mod repl;
pub mod report;
pub mod runner;
pub mod runtime;
pub mod scr;
pub mod spec;
pub mod stage;
pub mod store;
pub mod tap;
pub mod trust;
pub mod worker;

pub use error::EngineError;
pub use report::Report;
pub use runner::{run, RunConfig};
