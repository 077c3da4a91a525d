//! `flowplane bench pipeline`: FAJITA's experiments on this machine — one
//! core, in-memory replay, 64-byte packets, uniformly random flow order:
//! throughput vs number of flows, chain length, the four executors side by
//! side, prefetch on/off, the synthetic NF with k indirect accesses with and
//! without its prefetch hook, the flow table's two layouts (issue 37: `layout`,
//! bucketed vs inline entries, for `fsc` and the 3-NF chain at the base flow
//! count and four times it). Every figure of one run shares the process,
//! so ratios between rows are meaningful on a noisy machine.
//!
//! Rows must not depend on their order: each is its own run with fresh tables,
//! filled during the warm-up (so no page fault is left for the measured part),
//! and reports the page backing of the flow tables sampled in the middle of its
//! measurement (`huge_pages`, see [`crate::pages`]) and the CPU share the
//! process got (`cpu_share`). `reverse` runs the rows in the opposite order
//! (they are listed in the usual order either way), to check that.

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
    /// Which experiments (empty: all): flows, chains, executors, prefetch, synthetic, aux, ipfix, repl, layout.
    pub only: Vec<String>,
    /// Rounds over the experiments (`--reps`): each row's figure is the median, with min and max.
    pub reps: usize,
    /// Run the rows in the opposite order (a check: the figures must not depend on it).
    pub reverse: bool,
    /// Seconds of warm-up before each measurement (default: half the
    /// measurement, at most 1 s).
    pub warmup: Option<f64>,
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
            reps: 1,
            reverse: false,
            warmup: None,
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
            reps: 1,
            reverse: false,
            warmup: None,
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
    /// Fraction of the flow tables' resident memory on 2 MiB pages in the middle of the measurement (`None` if
    /// unknown).
    pub huge_pages: Option<f64>,
    /// Process CPU time over wall time during the run: below 1 when other processes took the core.
    pub cpu_share: f64,
    /// `ipfix` with export on: the exporter's own rate — records encoded and sent per second of the exporter
    /// thread's CPU time (what one core doing nothing else would export).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ipfix_records_per_s: Option<f64>,
    /// `ipfix` with export on: records the run offered per second of its wall time (warm-up included: the active
    /// timeout reports from the start), by its one worker.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ipfix_offered_per_s: Option<f64>,
    /// `ipfix` with export on: the exporter thread's share of one core over the run (its CPU time / wall time).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ipfix_cpu_share: Option<f64>,
    /// `ipfix` with export on: records lost (a full queue).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ipfix_lost: Option<u64>,
    /// `repl` with replication on: state updates sent per second of the run, by its one core.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repl_updates_per_s: Option<f64>,
    /// `repl` with replication on: updates a full queue refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repl_queue_lost: Option<u64>,
    /// `mpps` over `--reps` rounds (None with one).
    pub spread: Option<crate::reps::Spread>,
    /// What the figure rests on and why not to quote it ([`flowplane_engine::trust`]).
    pub trust: crate::reps::Trust,
}

/// What one run measured.
#[derive(Clone, Debug)]
pub(crate) struct Measured {
    pub(crate) mpps: f64,
    pub(crate) cycles_per_packet: f64,
    pub(crate) huge_pages: Option<f64>,
    pub(crate) cpu_share: f64,
    /// IPFIX export on: what the exporter did.
    pub(crate) ipfix: Option<IpfixRate>,
    /// Replication on: updates sent per second of wall time, updates lost to a full queue.
    pub(crate) repl: Option<(f64, u64)>,
    pub(crate) trust: crate::reps::Trust,
}

/// CPU time of the whole process, in ns (0 if unavailable).
pub(crate) fn process_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec into the valid, exclusively borrowed `ts`.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    if rc == 0 {
        (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64)
    } else {
        0
    }
}

/// All rows.
#[derive(Clone, Debug, Serialize)]
pub struct PipelineReport {
    /// Rows in run order.
    pub rows: Vec<PipelineRow>,
}

pub(crate) fn trace_for(flows: u64) -> Result<Arc<ReplayTrace>, String> {
    trace_with(flows, Proto::Udp)
}

/// What a row of `flows` flows allocates: its trace (`cfg`) and the run's flow table (sized as
/// `Measure::one_with` sizes it, for the largest state a measured chain has) — checked against the machine's
/// memory before either is allocated: a one-line refusal, not an abort (issue 29: `--flows 67108864` asked for
/// 22 GiB of trace and 16 GiB of table and died in the allocator).
fn needs(flows: u64, cfg: &GenConfig) -> Vec<flowplane_engine::budget::Need> {
    use flowplane_engine::budget::{generated_bytes, Need};
    let table_flows = ((flows as f64 * 1.25) as usize).max(4096);
    let table = flowplane_table::FlowTable::<flowplane_wire::flow::FiveTupleV4>::footprint(table_flows, 128);
    vec![
        Need {
            what: format!("bench pipeline --flows {flows} (a trace of {} packets)", cfg.packets),
            bytes: generated_bytes(cfg),
        },
        Need {
            what: format!("bench pipeline --flows {flows} (a flow table of {table_flows} entries)"),
            bytes: table.unwrap_or(0),
        },
    ]
}

/// [`trace_for`] with another transport.
pub(crate) fn trace_with(flows: u64, proto: Proto) -> Result<Arc<ReplayTrace>, String> {
    let cfg = trace_config(flows, proto);
    flowplane_engine::budget::check(&needs(flows, &cfg)).map_err(|e| e.to_string())?;
    let gen = Generator::new(cfg).map_err(|e| e.to_string())?;
    let dispatch = RssDispatcher::new(1, false).map_err(|e| e.to_string())?;
    let (t, _) = load_generated(gen, &dispatch).map_err(|e| e.to_string())?;
    Ok(t)
}

/// The trace of a row of `flows` flows.
fn trace_config(flows: u64, proto: Proto) -> GenConfig {
    // At least 4 packets per flow and 2M packets, so each loop is long.
    let packets = (flows * 4).max(2_000_000);
    GenConfig {
        flows,
        packets,
        size: SizeSpec::Fixed(64),
        dist: FlowDist::Uniform,
        order: Order::Random,
        proto,
        seed: 7,
        ..GenConfig::default()
    }
}

/// What the exporter of an `ipfix` row did.
#[derive(Clone, Copy, Debug)]
pub(crate) struct IpfixRate {
    /// Records sent per second of the exporter thread's CPU time.
    pub(crate) per_cpu_s: f64,
    /// Records sent per second of the run's wall time.
    pub(crate) offered_per_s: f64,
    /// Exporter CPU time / wall time.
    pub(crate) cpu_share: f64,
    /// Records lost (a full queue).
    pub(crate) lost: u64,
}

pub(crate) struct Measure<'a> {
    pub(crate) opts: &'a PipelineOptions,
}

impl Measure<'_> {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn one_with(
        &self,
        trace: &Arc<ReplayTrace>,
        chain: &str,
        knobs: ExecConfig,
        flows: u64,
        ipfix: Option<flowplane_engine::ipfix::IpfixConfig>,
        repl: Option<flowplane_engine::repl::ReplConfig>,
    ) -> Result<Measured, String> {
        let spec = spec::parse(chain).map_err(|e| e.to_string())?;
        let warmup = Duration::from_secs_f64(self.opts.warmup.unwrap_or((self.opts.seconds / 2.0).min(1.0)));
        let cfg = RunConfig {
            cores: 1,
            batch_size: self.opts.batch,
            loops: None,
            duration: Some(Duration::from_secs_f64(self.opts.seconds)),
            // Fill the tables and settle page faults before measuring.
            warmup: Some(warmup),
            exec: ExecConfig {
                // Room for every flow at <= 80% load (the table refuses more than its capacity).
                flows: ((flows as f64 * 1.25) as usize).max(4096),
                // Flows must not expire in the middle of a measurement.
                default_idle_timeout_ns: 3_600_000_000_000,
                ..knobs
            },
            ipfix,
            repl,
            ..RunConfig::default()
        };
        // The tables live inside the run: sample their page backing (the process's hugepage-advised memory) in the
        // middle of the measurement, from a thread that sleeps until then.
        let sample_at = warmup + Duration::from_secs_f64(self.opts.seconds / 2.0);
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let sampler = std::thread::spawn(move || match rx.recv_timeout(sample_at) {
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Some(crate::pages::of_advised()),
            _ => None,
        });
        let (cpu0, wall0) = (process_cpu_ns(), std::time::Instant::now());
        let r = run(&cfg, &spec, trace.clone(), Output::Discard).map_err(|e| e.to_string());
        let wall = wall0.elapsed().as_nanos() as f64;
        let cpu_share = if wall > 0.0 { (process_cpu_ns().saturating_sub(cpu0) as f64 / wall).min(1.0) } else { 0.0 };
        let _ = tx.send(());
        let pages = sampler.join().ok().flatten();
        let r = r?;
        let secs = wall / 1e9;
        Ok(Measured {
            mpps: r.mpps,
            cycles_per_packet: r.cycles_per_packet,
            huge_pages: pages.and_then(|p| p.fraction()),
            cpu_share,
            ipfix: r.ipfix.as_ref().map(|x| IpfixRate {
                per_cpu_s: x.records_per_cpu_s().unwrap_or(0.0),
                offered_per_s: if secs > 0.0 { x.records() as f64 / secs } else { 0.0 },
                cpu_share: if secs > 0.0 { x.cpu_ms / 1e3 / secs } else { 0.0 },
                lost: x.lost,
            }),
            repl: r
                .replication
                .as_ref()
                .map(|x| (if secs > 0.0 { x.sent_records as f64 / secs } else { 0.0 }, x.queue_lost)),
            trust: r.trust.clone(),
        })
    }
}

/// One row to measure: experiment, variant, chain, executor, prefetch flag, aux flag, hooks flag, flows.
struct Job {
    experiment: &'static str,
    variant: String,
    chain: String,
    kind: ExecKind,
    prefetch: bool,
    aux: bool,
    hooks: bool,
    flows: u64,
    /// Reported in the row's `prefetch` column (the synthetic rows report their hook there).
    shown_prefetch: bool,
    /// IPFIX export on (the `ipfix` experiment).
    ipfix: Option<flowplane_engine::ipfix::IpfixConfig>,
    /// Replication on (the `repl` experiment).
    repl: Option<flowplane_engine::repl::ReplConfig>,
    /// The compiler may store small blocks inline (off: the bucketed layout; the `layout` experiment).
    inline: bool,
}

impl Job {
    /// The executor configuration this row measures (flows and timeout are set per run).
    fn knobs(&self) -> ExecConfig {
        ExecConfig {
            kind: self.kind,
            prefetch: self.prefetch,
            aux: self.aux,
            prefetch_hooks: self.hooks,
            inline_entries: self.inline,
            ..ExecConfig::default()
        }
    }
}

/// Runs the experiments `opts.reps` rounds over: each row's figure is the median round's, with min and max;
/// ratios are taken between the medians.
pub fn run_pipeline(opts: &PipelineOptions) -> Result<PipelineReport, String> {
    let merged = crate::reps::repeat(opts.reps, |_| once(opts), |r| Some(r.mpps))?;
    let mut rows: Vec<PipelineRow> = crate::reps::settle(merged, |r| (&mut r.trust, &mut r.spread));
    fill_ratios(&mut rows);
    Ok(PipelineReport { rows })
}

/// One round of the experiments (ratios are filled in by [`run_pipeline`]).
fn once(opts: &PipelineOptions) -> Result<Vec<PipelineRow>, String> {
    let m = Measure { opts };
    let job = |experiment, variant: String, chain: &str, kind, prefetch, flows| Job {
        experiment,
        variant,
        chain: chain.to_string(),
        kind,
        prefetch,
        aux: true,
        hooks: true,
        flows,
        shown_prefetch: prefetch,
        ipfix: None,
        repl: None,
        inline: true,
    };
    const CHAIN3: &str = "lb -> fsc -> ratelimit(pps=1000000000)";
    let mut jobs: Vec<Job> = Vec::new();
    if opts.wants("flows") {
        for &f in &opts.flows {
            jobs.push(job("flows", format!("flows={f}"), "fsc", ExecKind::BATCH, true, f));
        }
    }
    let base = opts.base_flows;
    if opts.wants("chains") {
        for chain in ["lb", "lb -> fsc", CHAIN3] {
            let variant = format!("{} NF(s)", chain.split("->").count());
            jobs.push(job("chains", variant, chain, ExecKind::BATCH, true, base));
        }
    }
    if opts.wants("executors") {
        for kind in ExecKind::all() {
            jobs.push(job("executors", kind.to_string(), CHAIN3, kind, true, base));
        }
    }
    if opts.wants("prefetch") {
        for pf in [true, false] {
            let variant = format!("prefetch={}", if pf { "on" } else { "off" });
            jobs.push(job("prefetch", variant, CHAIN3, ExecKind::BATCH, pf, base));
        }
    }
    if opts.wants("aux") {
        // FAJITA Fig. 9's chain: two NFs with state shared between cores
        // (source IP, destination IP) and a 5-tuple LB.
        const MIXED: &str = "srcctr -> policer(rate=1000000000000) -> lb";
        for aux in [true, false] {
            let variant = format!("aux={}", if aux { "on" } else { "off" });
            jobs.push(Job { aux, ..job("aux", variant, MIXED, ExecKind::BATCH, true, base) });
        }
    }
    if opts.wants("synthetic") && flowplane_nf::registry::find("synthetic").is_some() {
        // The NF's prefetch hook on vs off; the table's own prefetching stays on in both.
        for &k in &opts.synthetic_k {
            for hook in [true, false] {
                let variant = format!("k={k} hook={}", if hook { "on" } else { "off" });
                let j = job("synthetic", variant, &format!("synthetic(k={k})"), ExecKind::BATCH, true, base);
                jobs.push(Job { hooks: hook, shown_prefetch: hook, ..j });
            }
        }
    }
    if opts.wants("ipfix") {
        // Issue 34: fsc's flow records exported (1 s active timeout, to a file in the temp dir) vs not.
        let file = std::env::temp_dir().join(format!("flowplane-bench-ipfix-{}", std::process::id()));
        for on in [false, true] {
            let variant = format!("export={}", if on { "on" } else { "off" });
            let ipfix = on.then(|| flowplane_engine::ipfix::IpfixConfig {
                collectors: vec![flowplane_engine::ipfix::Collector::File(file.clone())],
                active_ns: Some(1_000_000_000),
                queue: flowplane_engine::ipfix::DEFAULT_QUEUE,
            });
            jobs.push(Job { ipfix, ..job("ipfix", variant, "fsc", ExecKind::BATCH, true, base) });
        }
    }
    if opts.wants("repl") {
        // Issue 36: lb's connection table replicated (to the discard port: sent, never read) vs not. Every
        // flow is sent again in a walk without pause (refresh 0): the most updates one core hands over.
        for on in [false, true] {
            let variant = format!("replication={}", if on { "on" } else { "off" });
            let repl = on
                .then(|| flowplane_engine::repl::ReplConfig::new(Some("udp:127.0.0.1:9"), None, None))
                .transpose()?
                .map(|c| flowplane_engine::repl::ReplConfig { refresh: Duration::ZERO, ..c });
            jobs.push(Job { repl, ..job("repl", variant, "lb", ExecKind::BATCH, true, base) });
        }
    }
    if opts.wants("layout") {
        // Issue 37: bucket line then entry (bucketed) vs the entry alone (inline), at two table sizes.
        for chain in ["fsc", CHAIN3] {
            for flows in [base, 4 * base] {
                for inline in [false, true] {
                    let layout = if inline { "inline" } else { "bucketed" };
                    let variant = format!("{} NF(s) flows={flows} layout={layout}", chain.split("->").count());
                    jobs.push(Job { inline, ..job("layout", variant, chain, ExecKind::BATCH, true, flows) });
                }
            }
        }
    }
    // Run order: as listed, or reversed; rows are reported in the listed order either way. Traces are generated per
    // flow count and kept while rows still need them.
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    if opts.reverse {
        order.reverse();
    }
    let mut measured: Vec<Option<Measured>> = vec![None; jobs.len()];
    let mut traces: Vec<(u64, Arc<ReplayTrace>)> = Vec::new();
    for (n, &i) in order.iter().enumerate() {
        let j = &jobs[i];
        let t = match traces.iter().find(|(f, _)| *f == j.flows) {
            Some((_, t)) => t.clone(),
            None => {
                let t = trace_for(j.flows)?;
                traces.push((j.flows, t.clone()));
                t
            }
        };
        measured[i] = Some(m.one_with(&t, &j.chain, j.knobs(), j.flows, j.ipfix.clone(), j.repl.clone())?);
        if let Some(flowplane_engine::ipfix::Collector::File(p)) = j.ipfix.as_ref().and_then(|c| c.collectors.first()) {
            let _ = std::fs::remove_file(p);
        }
        drop(t);
        // Free the traces no later row needs (they are large at 4M flows).
        traces.retain(|(f, _)| order[n + 1..].iter().any(|&k| jobs[k].flows == *f));
    }
    let rows: Vec<PipelineRow> = jobs
        .iter()
        .zip(measured)
        .filter_map(|(j, r)| {
            let r = r?;
            Some(PipelineRow {
                experiment: j.experiment.to_string(),
                variant: j.variant.clone(),
                chain: j.chain.clone(),
                exec: j.kind.to_string(),
                prefetch: j.shown_prefetch,
                flows: j.flows,
                mpps: r.mpps,
                cycles_per_packet: r.cycles_per_packet,
                ratio: 1.0,
                ratio_to: String::new(),
                huge_pages: r.huge_pages,
                cpu_share: r.cpu_share,
                ipfix_records_per_s: r.ipfix.map(|x| x.per_cpu_s),
                ipfix_offered_per_s: r.ipfix.map(|x| x.offered_per_s),
                ipfix_cpu_share: r.ipfix.map(|x| x.cpu_share),
                ipfix_lost: r.ipfix.map(|x| x.lost),
                repl_updates_per_s: r.repl.map(|x| x.0),
                repl_queue_lost: r.repl.map(|x| x.1),
                spread: None,
                trust: r.trust,
            })
        })
        .collect();
    Ok(rows)
}

/// Ratios within each experiment: flows vs the smallest flow count, chains vs
/// 1 NF, executors vs `batch`, prefetch vs off, synthetic with vs without hook,
/// layout inline vs bucketed (same chain and flows).
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
            "ipfix" => snapshot.iter().find(|x| x.experiment == "ipfix" && x.variant == "export=off"),
            "repl" => snapshot.iter().find(|x| x.experiment == "repl" && x.variant == "replication=off"),
            "layout" => snapshot.iter().find(|x| {
                x.experiment == "layout"
                    && x.chain == r.chain
                    && x.flows == r.flows
                    && x.variant.ends_with("layout=bucketed")
            }),
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
        let mut s = String::from(
            "experiment,variant,chain,exec,prefetch,flows,mpps,cycles_per_packet,ratio,ratio_to,huge_pages,cpu_share,mpps_min,mpps_max,flags\n",
        );
        for r in &self.rows {
            s.push_str(&format!(
                "{},{},\"{}\",{},{},{},{:.3},{:.1},{:.3},{},{},{:.3},{},{},\"{}\"\n",
                r.experiment,
                r.variant,
                r.chain,
                r.exec,
                r.prefetch,
                r.flows,
                r.mpps,
                r.cycles_per_packet,
                r.ratio,
                r.ratio_to,
                r.huge_pages.map_or(String::new(), |h| format!("{h:.3}")),
                r.cpu_share,
                r.spread.as_ref().map_or(String::new(), |x| format!("{:.3}", x.min)),
                r.spread.as_ref().map_or(String::new(), |x| format!("{:.3}", x.max)),
                r.trust.flags.join("; ").replace('"', "'")
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
            "{:<10} {:<22} {:<40} {:>8} {:>13} {:>11} {:>8} {:>6} {:>5}  vs",
            "experiment", "variant", "chain", "Mpps", "min-max", "cycles/pkt", "ratio", "huge%", "cpu%"
        )?;
        for r in &self.rows {
            let huge = r.huge_pages.map_or_else(|| "-".to_string(), |h| format!("{:.0}%", h * 100.0));
            writeln!(
                f,
                "{:<10} {:<22} {:<40} {:>8.2} {:>13} {:>11.1} {:>8.2} {:>6} {:>4.0}%  {}{}",
                r.experiment,
                r.variant,
                r.chain,
                r.mpps,
                r.spread.as_ref().map_or("-".to_string(), |x| x.cell(2)),
                r.cycles_per_packet,
                r.ratio,
                huge,
                r.cpu_share * 100.0,
                r.ratio_to,
                r.trust.cell()
            )?;
        }
        // Issue 34's two figures, spelled out: the data path's cost of export, and the exporter's rate.
        if let Some(on) = self.rows.iter().find(|r| r.experiment == "ipfix" && r.ipfix_records_per_s.is_some()) {
            writeln!(
                f,
                "ipfix: fsc at {} flows, 1 s active timeout: export on/off = {:.3} ({:+.1}% Mpps; target >= 0.95); \
                 exporter {:.2}M records/s per core of its CPU time ({:.2}M/s offered, {:.0}% of a core), {} lost \
                 (target >= 1M/s, 0 lost)",
                on.flows,
                on.ratio,
                (on.ratio - 1.0) * 100.0,
                on.ipfix_records_per_s.unwrap_or(0.0) / 1e6,
                on.ipfix_offered_per_s.unwrap_or(0.0) / 1e6,
                on.ipfix_cpu_share.unwrap_or(0.0) * 100.0,
                on.ipfix_lost.unwrap_or(0)
            )?;
        }
        if let Some(on) = self.rows.iter().find(|r| r.experiment == "repl" && r.repl_updates_per_s.is_some()) {
            writeln!(
                f,
                "repl: lb at {} flows, every flow re-sent without pause: replication on/off = {:.3} ({:+.1}% Mpps; \
                 target >= 0.95); {:.0} updates/s from one core, {} lost to a full queue (target >= 1M/s)",
                on.flows,
                on.ratio,
                (on.ratio - 1.0) * 100.0,
                on.repl_updates_per_s.unwrap_or(0.0),
                on.repl_queue_lost.unwrap_or(0)
            )?;
        }
        if let Some(n) = crate::reps::footnote(self.rows.iter().map(|r| &r.trust)) {
            writeln!(f, "{n}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 29: `bench pipeline --flows 67108864` (the largest count it takes) aborted in the allocator; now
    /// its trace and table are checked first: on a host with 21.6 GiB available, one line naming the option.
    #[test]
    fn the_largest_flow_count_is_refused_in_one_line_where_memory_is_short() {
        let flows = 67_108_864;
        let n = needs(flows, &trace_config(flows, Proto::Udp));
        let total: u128 = n.iter().map(|x| x.bytes).sum();
        assert!(total > 38 << 30, "{n:?}");
        let e = flowplane_engine::budget::check_against(&n, 21_600 << 20).unwrap_err().to_string();
        assert!(e.contains("bench pipeline --flows 67108864") && !e.contains('\n'), "{e}");
        // The default sweep's largest row fits a 16 GiB host.
        assert!(flowplane_engine::budget::check_against(
            &needs(4_000_000, &trace_config(4_000_000, Proto::Udp)),
            16 << 30
        )
        .is_ok());
    }
}
