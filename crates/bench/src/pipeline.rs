//! `flowplane bench pipeline`: FAJITA's experiments on this machine — one
//! core, in-memory replay, 64-byte packets, uniformly random flow order:
//! throughput vs number of flows, chain length, the four executors side by
//! side, prefetch on/off, the synthetic NF with k indirect accesses with and
//! without its prefetch hook. Every figure of one run shares the process,
//! so ratios between rows are meaningful on a noisy machine.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use flowplane_engine::exec::{ExecConfig, ExecKind};
use flowplane_engine::load::load_generated;
use flowplane_engine::runner::Output;
use flowplane_engine::{run, spec, RunConfig};
use flowplane_io::replay::ReplayTrace;
use flowplane_scale::RssDispatcher;
use flowplane_trace::gen::{FlowDist, GenConfig, Generator, Order, Proto, SizeSpec};
use serde::Serialize;

/// What to run.
#[derive(Clone, Debug)]
pub struct PipelineOptions {
    /// Flow counts for the throughput-vs-flows sweep.
    pub flows: Vec<u64>,
    /// Flows for the chain/executor/prefetch experiments.
    pub base_flows: u64,
    /// Seconds per measurement.
    pub seconds: f64,
    /// Packets per batch.
    pub batch: usize,
    /// Indirect-access counts for the synthetic NF.
    pub synthetic_k: Vec<u32>,
    /// Which experiments (empty: all): flows, chains, executors, prefetch, synthetic, aux.
    pub only: Vec<String>,
}

impl Default for PipelineOptions {
    fn default() -> Self {
        PipelineOptions {
            flows: vec![1_000, 16_000, 128_000, 1_000_000, 4_000_000],
            base_flows: 1_000_000,
            seconds: 2.0,
            batch: 64,
            synthetic_k: vec![1, 2, 4, 8],
            only: Vec::new(),
        }
    }
}

impl PipelineOptions {
    /// Small and short, for CI smoke runs.
    pub fn quick() -> Self {
        PipelineOptions {
            flows: vec![1_000, 16_000],
            base_flows: 16_000,
            seconds: 0.1,
            batch: 64,
            synthetic_k: vec![1, 2],
            only: Vec::new(),
        }
    }

    fn wants(&self, e: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|o| o == e)
    }
}

/// One measurement.
#[derive(Clone, Debug, Serialize)]
pub struct PipelineRow {
    /// Experiment name.
    pub experiment: String,
    /// What varies in this row (e.g. "flows=1000000").
    pub variant: String,
    /// Chain spec.
    pub chain: String,
    /// Executor.
    pub exec: String,
    /// Prefetching on.
    pub prefetch: bool,
    /// Flows in the trace.
    pub flows: u64,
    /// Million packets/s (one core).
    pub mpps: f64,
    /// TSC cycles per packet.
    pub cycles_per_packet: f64,
    /// This row's throughput / the experiment's reference row.
    pub ratio: f64,
    /// What `ratio` compares against.
    pub ratio_to: String,
}

/// All rows.
#[derive(Clone, Debug, Serialize)]
pub struct PipelineReport {
    /// Rows in run order.
    pub rows: Vec<PipelineRow>,
}

fn trace_for(flows: u64) -> Result<Arc<ReplayTrace>, String> {
    // At least 4 packets per flow and 2M packets, so each loop is long.
    let packets = (flows * 4).max(2_000_000);
    let cfg = GenConfig {
        flows,
        packets,
        size: SizeSpec::Fixed(64),
        dist: FlowDist::Uniform,
        order: Order::Random,
        proto: Proto::Udp,
        seed: 7,
        ..GenConfig::default()
    };
    let gen = Generator::new(cfg).map_err(|e| e.to_string())?;
    let dispatch = RssDispatcher::new(1, false).map_err(|e| e.to_string())?;
    let (t, _) = load_generated(gen, &dispatch).map_err(|e| e.to_string())?;
    Ok(t)
}

struct Measure<'a> {
    opts: &'a PipelineOptions,
}

impl Measure<'_> {
    fn one(
        &self,
        trace: &Arc<ReplayTrace>,
        chain: &str,
        kind: ExecKind,
        prefetch: bool,
        flows: u64,
    ) -> Result<(f64, f64), String> {
        self.one_with(trace, chain, kind, prefetch, true, true, flows)
    }

    fn one_aux(
        &self,
        trace: &Arc<ReplayTrace>,
        chain: &str,
        kind: ExecKind,
        prefetch: bool,
        aux: bool,
        flows: u64,
    ) -> Result<(f64, f64), String> {
        self.one_with(trace, chain, kind, prefetch, aux, true, flows)
    }

    #[allow(clippy::too_many_arguments)]
    fn one_with(
        &self,
        trace: &Arc<ReplayTrace>,
        chain: &str,
        kind: ExecKind,
        prefetch: bool,
        aux: bool,
        hooks: bool,
        flows: u64,
    ) -> Result<(f64, f64), String> {
        let spec = spec::parse(chain).map_err(|e| e.to_string())?;
        let cfg = RunConfig {
            cores: 1,
            batch_size: self.opts.batch,
            loops: None,
            duration: Some(Duration::from_secs_f64(self.opts.seconds)),
            // Fill the tables and settle page faults before measuring.
            warmup: Some(Duration::from_secs_f64((self.opts.seconds / 2.0).min(1.0))),
            exec: ExecConfig {
                kind,
                prefetch,
                // Room for every flow at <= 80% load (the table refuses more than its capacity).
                flows: ((flows as f64 * 1.25) as usize).max(4096),
                // Flows must not expire in the middle of a measurement.
                default_idle_timeout_ns: 3_600_000_000_000,
                aux,
                prefetch_hooks: hooks,
                ..ExecConfig::default()
            },
            ..RunConfig::default()
        };
        let r = run(&cfg, &spec, trace.clone(), Output::Discard).map_err(|e| e.to_string())?;
        Ok((r.mpps, r.cycles_per_packet))
    }
}

/// Runs the experiments.
pub fn run_pipeline(opts: &PipelineOptions) -> Result<PipelineReport, String> {
    let m = Measure { opts };
    let mut rows: Vec<PipelineRow> = Vec::new();
    let push = |rows: &mut Vec<PipelineRow>,
                experiment: &str,
                variant: String,
                chain: &str,
                kind: ExecKind,
                prefetch: bool,
                flows: u64,
                r: (f64, f64)| {
        rows.push(PipelineRow {
            experiment: experiment.to_string(),
            variant,
            chain: chain.to_string(),
            exec: kind.to_string(),
            prefetch,
            flows,
            mpps: r.0,
            cycles_per_packet: r.1,
            ratio: 1.0,
            ratio_to: String::new(),
        });
    };
    const CHAIN3: &str = "lb -> fsc -> ratelimit(pps=1000000000)";
    if opts.wants("flows") {
        for &f in &opts.flows {
            let t = trace_for(f)?;
            let r = m.one(&t, "fsc", ExecKind::BATCH, true, f)?;
            push(&mut rows, "flows", format!("flows={f}"), "fsc", ExecKind::BATCH, true, f, r);
        }
    }
    let base = opts.base_flows;
    let needs_base = ["chains", "executors", "prefetch", "synthetic", "aux"].iter().any(|e| opts.wants(e));
    if needs_base {
        let t = trace_for(base)?;
        if opts.wants("chains") {
            for chain in ["lb", "lb -> fsc", CHAIN3] {
                let r = m.one(&t, chain, ExecKind::BATCH, true, base)?;
                push(
                    &mut rows,
                    "chains",
                    format!("{} NF(s)", chain.split("->").count()),
                    chain,
                    ExecKind::BATCH,
                    true,
                    base,
                    r,
                );
            }
        }
        if opts.wants("executors") {
            for kind in ExecKind::all() {
                let r = m.one(&t, CHAIN3, kind, true, base)?;
                push(&mut rows, "executors", kind.to_string(), CHAIN3, kind, true, base, r);
            }
        }
        if opts.wants("prefetch") {
            for pf in [true, false] {
                let r = m.one(&t, CHAIN3, ExecKind::BATCH, pf, base)?;
                push(
                    &mut rows,
                    "prefetch",
                    format!("prefetch={}", if pf { "on" } else { "off" }),
                    CHAIN3,
                    ExecKind::BATCH,
                    pf,
                    base,
                    r,
                );
            }
        }
        if opts.wants("aux") {
            // FAJITA Fig. 9's chain: two NFs with state shared between cores
            // (source IP, destination IP) and a 5-tuple LB.
            const MIXED: &str = "srcctr -> policer(rate=1000000000000) -> lb";
            for aux in [true, false] {
                let r = m.one_aux(&t, MIXED, ExecKind::BATCH, true, aux, base)?;
                let variant = format!("aux={}", if aux { "on" } else { "off" });
                push(&mut rows, "aux", variant, MIXED, ExecKind::BATCH, true, base, r);
            }
        }
        if opts.wants("synthetic") && flowplane_nf::registry::find("synthetic").is_some() {
            // The NF's prefetch hook on vs off; the table's own prefetching stays on in both.
            for &k in &opts.synthetic_k {
                for hook in [true, false] {
                    let chain = format!("synthetic(k={k})");
                    let r = m.one_with(&t, &chain, ExecKind::BATCH, true, true, hook, base)?;
                    let variant = format!("k={k} hook={}", if hook { "on" } else { "off" });
                    push(&mut rows, "synthetic", variant, &chain, ExecKind::BATCH, hook, base, r);
                }
            }
        }
    }
    fill_ratios(&mut rows);
    Ok(PipelineReport { rows })
}

/// Ratios within each experiment: flows vs the smallest flow count, chains vs
/// 1 NF, executors vs `batch`, prefetch vs off, synthetic with vs without hook.
fn fill_ratios(rows: &mut [PipelineRow]) {
    let snapshot = rows.to_vec();
    for r in rows.iter_mut() {
        let reference = match r.experiment.as_str() {
            "flows" => snapshot.iter().find(|x| x.experiment == "flows"),
            "chains" => snapshot.iter().find(|x| x.experiment == "chains"),
            "executors" => snapshot.iter().find(|x| x.experiment == "executors" && x.exec == "batch"),
            "prefetch" => snapshot.iter().find(|x| x.experiment == "prefetch" && !x.prefetch),
            "synthetic" => snapshot.iter().find(|x| x.experiment == "synthetic" && x.chain == r.chain && !x.prefetch),
            "aux" => snapshot.iter().find(|x| x.experiment == "aux" && x.variant == "aux=off"),
            _ => None,
        };
        if let Some(b) = reference {
            if b.mpps > 0.0 {
                r.ratio = r.mpps / b.mpps;
                r.ratio_to = b.variant.clone();
            }
        }
    }
}

impl PipelineReport {
    /// CSV with a header line.
    pub fn to_csv(&self) -> String {
        let mut s =
            String::from("experiment,variant,chain,exec,prefetch,flows,mpps,cycles_per_packet,ratio,ratio_to\n");
        for r in &self.rows {
            s.push_str(&format!(
                "{},{},\"{}\",{},{},{},{:.3},{:.1},{:.3},{}\n",
                r.experiment,
                r.variant,
                r.chain,
                r.exec,
                r.prefetch,
                r.flows,
                r.mpps,
                r.cycles_per_packet,
                r.ratio,
                r.ratio_to
            ));
        }
        s
    }
}

impl fmt::Display for PipelineReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "pipeline: 1 core, in-memory replay, 64-B packets, uniformly random flow order")?;
        writeln!(
            f,
            "{:<10} {:<22} {:<40} {:>8} {:>11} {:>8}  vs",
            "experiment", "variant", "chain", "Mpps", "cycles/pkt", "ratio"
        )?;
        for r in &self.rows {
            writeln!(
                f,
                "{:<10} {:<22} {:<40} {:>8.2} {:>11.1} {:>8.2}  {}",
                r.experiment, r.variant, r.chain, r.mpps, r.cycles_per_packet, r.ratio, r.ratio_to
            )?;
        }
        Ok(())
    }
}
