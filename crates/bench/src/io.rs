//! `flowplane bench io`: the I/O-only baseline — in-memory replay ->
//! `forward` -> discard on one core, 64-byte packets — and what each stage
//! costs on top of the bare receive/free loop.

use std::fmt;
use std::time::Duration;

use flowplane_engine::load::load_generated;
use flowplane_engine::runner::Output;
use flowplane_engine::{run, spec, Report, RunConfig};
use flowplane_scale::RssDispatcher;
use flowplane_trace::gen::{FlowDist, GenConfig, Generator, Order, Proto, SizeSpec};
use serde::Serialize;

use crate::reps::{Spread, Trust};

/// What to run.
#[derive(Clone, Debug)]
pub struct IoBenchOptions {
    /// Distinct flows in the generated trace.
    pub flows: u64,
    /// Packets in the generated trace (replayed in a loop).
    pub packets: u64,
    /// Frame size in bytes.
    pub size: usize,
    /// Seconds per measurement.
    pub seconds: f64,
    /// Packets per batch.
    pub batch: usize,
    /// Rounds over the chains (`--reps`): each row's figure is the median, with min and max.
    pub reps: usize,
}

impl Default for IoBenchOptions {
    fn default() -> Self {
        IoBenchOptions { flows: 1_000_000, packets: 4_000_000, size: 64, seconds: 2.0, batch: 64, reps: 1 }
    }
}

impl IoBenchOptions {
    /// Small and short, for CI smoke runs.
    pub fn quick() -> Self {
        IoBenchOptions { flows: 10_000, packets: 100_000, size: 64, seconds: 0.2, batch: 64, reps: 1 }
    }
}

/// One measured chain.
#[derive(Clone, Debug, Serialize)]
pub struct IoRow {
    /// Chain spec.
    pub chain: String,
    /// Million packets per second on one core.
    pub mpps: f64,
    /// TSC cycles per packet.
    pub cycles_per_packet: f64,
    /// Median batch latency in ns.
    pub p50_batch_ns: f64,
    /// `mpps` over the repetitions (None with one).
    pub spread: Option<Spread>,
    /// What the figure rests on and why not to quote it ([`flowplane_engine::trust`]).
    pub trust: Trust,
}

/// The benchmark's result.
#[derive(Clone, Debug, Serialize)]
pub struct IoBenchReport {
    /// Trace packets and flows.
    pub packets: u64,
    /// Flows in the trace.
    pub flows: u64,
    /// Frame size.
    pub size: usize,
    /// Replay memory in bytes.
    pub replay_bytes: usize,
    /// Rows.
    pub rows: Vec<IoRow>,
}

fn row(r: &Report) -> IoRow {
    IoRow {
        chain: r.chain.clone(),
        mpps: r.mpps,
        cycles_per_packet: r.cycles_per_packet,
        p50_batch_ns: r.latency.p50_ns,
        spread: None,
        trust: r.trust.clone(),
    }
}

/// Runs the baseline chains on one core.
pub fn run_io(opts: &IoBenchOptions) -> Result<IoBenchReport, String> {
    let cfg = GenConfig {
        flows: opts.flows,
        packets: opts.packets,
        size: SizeSpec::Fixed(opts.size.min(u16::MAX as usize) as u16),
        dist: FlowDist::Uniform,
        order: Order::Random,
        proto: Proto::Udp,
        seed: 1,
        ..GenConfig::default()
    };
    let gen = Generator::new(cfg).map_err(|e| e.to_string())?;
    let dispatch = RssDispatcher::new(1, false).map_err(|e| e.to_string())?;
    let (trace, _) = load_generated(gen, &dispatch).map_err(|e| e.to_string())?;
    let round = |_: usize| -> Result<Vec<IoRow>, String> {
        let mut rows = Vec::new();
        for chain in ["forward", "forward -> count"] {
            let spec = spec::parse(chain).map_err(|e| e.to_string())?;
            let rc = RunConfig {
                cores: 1,
                batch_size: opts.batch,
                loops: None,
                duration: Some(Duration::from_secs_f64(opts.seconds)),
                warmup: Some(Duration::from_secs_f64((opts.seconds / 4.0).min(0.5))),
                ..RunConfig::default()
            };
            let rep = run(&rc, &spec, trace.clone(), Output::Discard).map_err(|e| e.to_string())?;
            rows.push(row(&rep));
        }
        Ok(rows)
    };
    let rows = crate::reps::settle(crate::reps::repeat(opts.reps, round, |r| Some(r.mpps))?, |r| {
        (&mut r.trust, &mut r.spread)
    });
    Ok(IoBenchReport {
        packets: opts.packets,
        flows: opts.flows,
        size: opts.size,
        replay_bytes: trace.memory_bytes(),
        rows,
    })
}

impl fmt::Display for IoBenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "I/O baseline: replay -> chain -> discard, 1 core, {}-byte packets, {} flows, {} packets ({:.1} MiB replay)",
            self.size,
            self.flows,
            self.packets,
            self.replay_bytes as f64 / (1 << 20) as f64
        )?;
        writeln!(f, "{:<24} {:>10} {:>13} {:>12} {:>14}", "chain", "Mpps", "min-max", "cycles/pkt", "p50 batch ns")?;
        for r in &self.rows {
            writeln!(
                f,
                "{:<24} {:>10.2} {:>13} {:>12.1} {:>14.0}{}",
                r.chain,
                r.mpps,
                r.spread.as_ref().map_or("-".to_string(), |x| x.cell(2)),
                r.cycles_per_packet,
                r.p50_batch_ns,
                r.trust.cell()
            )?;
        }
        if let Some(n) = crate::reps::footnote(self.rows.iter().map(|r| &r.trust)) {
            writeln!(f, "{n}")?;
        }
        Ok(())
    }
}
