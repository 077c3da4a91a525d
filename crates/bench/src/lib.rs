//! `flowplane-bench`: measurement — the TSC clock, machine ceilings and the
//! benchmarks behind `flowplane bench ...`. Benchmarks report ratios measured
//! in one run (flowplane vs its baselines), because this machine is shared and noisy.

pub mod tsc;
