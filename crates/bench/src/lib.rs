//! `flowplane-bench`: measurement — machine ceilings and the benchmarks
//! behind `flowplane bench ...`. Benchmarks report ratios measured in one run
//! (flowplane vs its baselines), because this machine is shared and noisy.

/// The TSC clock (re-exported from `flowplane-packet`, where timestamps live).
pub use flowplane_packet::tsc;
pub mod attack;
pub mod dyssect;
pub mod interleave;
pub mod io;
pub mod pages;
pub mod parse;
pub mod pipeline;
mod plot;
pub use plot::{set_footer, sweep_png, SweepPoint, SweepSeries};
pub mod reps;
pub mod scaling;
pub mod scr;
pub mod table;
pub mod upf;
