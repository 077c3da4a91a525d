//! Running a chain: building it once per core, loading the input through the
//! dispatch stage, starting one worker per core over the replay trace, and
//! merging their results. The CLI and the benchmarks go through here.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flowplane_io::replay::{ReplayConfig, ReplayQueue, ReplayTrace};
use flowplane_io::sink::{Discard, PcapSink, SharedPcapWriter, Stamp};
use flowplane_io::{cpu, Sink};
use flowplane_nf::Export;
use flowplane_packet::{tsc, PacketPool, PoolConfig, MAX_BATCH};

use flowplane_scale::RssDispatcher;
use flowplane_trace::gen::Generator;

use crate::chain::Chain;
use crate::coarse::SharedStores;
use crate::error::EngineError;
use crate::exec::{ExecConfig, Pipeline};
use crate::load::{load_generated, load_trace, LoadStats};
use crate::report::Report;
use crate::spec::ChainSpec;
use crate::worker::{run_worker, WorkerResult};

/// Where forwarded packets go.
#[derive(Clone, Default)]
pub enum Output {
    /// Freed (the benchmark sink).
    #[default]
    Discard,
    /// Written to a pcap file shared by all workers.
    Pcap(SharedPcapWriter),
}

/// How to run.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// Worker cores (= replay queues).
    pub cores: usize,
    /// Packets per receive burst (1..=256).
    pub batch_size: usize,
    /// Buffers per core's pool.
    pub pool_buffers: usize,
    /// Passes over the trace per queue (None: until `duration`).
    pub loops: Option<u64>,
    /// Wall-clock limit.
    pub duration: Option<Duration>,
    /// Total offered rate (packets/s over all queues); None = full speed.
    pub rate_pps: Option<f64>,
    /// Pin worker i to CPU i.
    pub pin: bool,
    /// Processed but not measured at the start of the run (tables fill, page faults settle).
    pub warmup: Option<Duration>,
    /// Executor and state-store settings.
    pub exec: ExecConfig,
    /// NFs whose state to export at the end of the run.
    pub export: Vec<String>,
    /// Write the transmit time into `--output` instead of each packet's own time.
    pub restamp: bool,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            cores: 1,
            batch_size: 64,
            pool_buffers: 4096,
            loops: Some(1),
            duration: None,
            rate_pps: None,
            pin: true,
            warmup: None,
            exec: ExecConfig::default(),
            export: Vec::new(),
            restamp: false,
        }
    }
}

/// What to replay.
pub enum Input<'a> {
    /// A pcap/pcapng file.
    File(&'a Path),
    /// Generated traffic, straight into memory.
    Generated(Box<Generator>),
}

/// A run over an input: the report, what loading saw, and the RSS key used.
pub struct InputRun {
    /// The run's report.
    pub report: Report,
    /// What loading saw.
    pub load: LoadStats,
    /// The symmetric RSS key was used; `Some(nf)`: chosen because that NF
    /// needs both directions of a connection on one core.
    pub symmetric: (bool, Option<&'static str>),
}

/// Builds the chain once per core (spec errors surface before any traffic
/// is loaded), spreads `input` over the cores by RSS (the symmetric key when
/// asked for, or when an NF needs both directions of a connection on one
/// core), and runs it.
pub fn run_input(
    cfg: &RunConfig,
    spec: &ChainSpec,
    input: Input<'_>,
    symmetric_rss: bool,
    output: Output,
) -> Result<InputRun, EngineError> {
    check(cfg)?;
    let chains = build_chains(cfg, spec)?;
    let auto = if cfg.cores > 1 && !symmetric_rss { chains[0].needs_symmetric_rss() } else { None };
    let symmetric = symmetric_rss || auto.is_some();
    let dispatch = RssDispatcher::new(cfg.cores, symmetric)?;
    let (trace, load) = match input {
        Input::File(path) => load_trace(path, &dispatch, None)?,
        Input::Generated(gen) => load_generated(*gen, &dispatch)?,
    };
    if load.packets == 0 {
        return Err(EngineError::EmptyInput);
    }
    let report = run_chains(cfg, spec, chains, trace, output)?;
    Ok(InputRun { report, load, symmetric: (symmetric, auto) })
}

fn check(cfg: &RunConfig) -> Result<(), EngineError> {
    if cfg.cores == 0 {
        return Err(EngineError::Config("a run needs at least one core".to_string()));
    }
    if cfg.batch_size == 0 || cfg.batch_size > MAX_BATCH {
        return Err(EngineError::Config(format!("batch size {} out of range [1, {MAX_BATCH}]", cfg.batch_size)));
    }
    if cfg.loops.is_none() && cfg.duration.is_none() {
        return Err(EngineError::Config("a run needs a loop count or a duration".to_string()));
    }
    Ok(())
}

/// One compiled chain per core, and the exports checked against the chain.
fn build_chains(cfg: &RunConfig, spec: &ChainSpec) -> Result<Vec<Chain>, EngineError> {
    let mut chains = Vec::with_capacity(cfg.cores);
    for _ in 0..cfg.cores {
        chains.push(Chain::build(spec)?);
    }
    for e in &cfg.export {
        if !spec.nfs.iter().any(|n| &n.name == e) {
            return Err(EngineError::ExportNotInChain(e.clone()));
        }
        // Refused before any traffic: an NF without exportable state would write an empty file.
        let stage = chains.first().and_then(|c| c.stages.iter().find(|s| s.name() == e));
        if stage.is_some_and(|s| s.export_kind() == Export::None) {
            return Err(EngineError::ExportRefused(e.clone()));
        }
    }
    Ok(chains)
}

/// Runs `spec` over `trace` (one queue per core) and reports.
pub fn run(cfg: &RunConfig, spec: &ChainSpec, trace: Arc<ReplayTrace>, output: Output) -> Result<Report, EngineError> {
    check(cfg)?;
    let chains = build_chains(cfg, spec)?;
    run_chains(cfg, spec, chains, trace, output)
}

/// Runs prebuilt per-core chains over `trace`.
fn run_chains(
    cfg: &RunConfig,
    spec: &ChainSpec,
    chains: Vec<Chain>,
    trace: Arc<ReplayTrace>,
    output: Output,
) -> Result<Report, EngineError> {
    if cfg.cores != trace.queues() || chains.len() != cfg.cores {
        return Err(EngineError::Config(format!("{} cores but the trace has {} queues", cfg.cores, trace.queues())));
    }
    // Coarse state is shared by every core: one table per coarse group, created once.
    let shared = match chains.first() {
        Some(c) => SharedStores::new(&c.groups, cfg.exec.flows, cfg.exec.default_idle_timeout_ns)?,
        None => SharedStores::default(),
    };
    let hz = tsc::hz();
    let stop = AtomicBool::new(false);
    let epoch_ns =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let start_tsc = tsc::rdtsc();
    let measure_from = start_tsc + cfg.warmup.map_or(0, |w| (w.as_secs_f64() * hz) as u64);
    let wall = Instant::now();
    let results: Vec<Result<(WorkerResult, Pipeline), EngineError>> = std::thread::scope(|s| {
        let handles: Vec<_> = chains
            .into_iter()
            .enumerate()
            .map(|(core, chain)| {
                let trace = Arc::clone(&trace);
                let output = output.clone();
                let stop = &stop;
                let shared = &shared;
                std::thread::Builder::new()
                    .name(format!("fp-worker-{core}"))
                    .spawn_scoped(s, move || {
                        if cfg.pin {
                            cpu::pin_current_thread(core);
                        }
                        let mut pool = PacketPool::new(PoolConfig {
                            buffers: cfg.pool_buffers.max(2 * MAX_BATCH),
                            ..PoolConfig::default()
                        })?;
                        let rcfg = ReplayConfig {
                            loops: cfg.loops,
                            max_packets: None,
                            // The whole trace's rate: each queue paces by trace time.
                            rate_pps: cfg.rate_pps,
                            tsc_hz: hz,
                        };
                        let mut exec = Pipeline::new(chain, cfg.exec, shared.clone())?;
                        let base_ns = trace.base_ns();
                        let mut source = ReplayQueue::new(trace, core, rcfg);
                        let mut sink: Box<dyn Sink> = match output {
                            Output::Discard => Box::new(Discard),
                            Output::Pcap(w) => {
                                let stamp = if cfg.restamp {
                                    Stamp::Transmit { tsc0: start_tsc, epoch_ns, tsc_hz: hz }
                                } else {
                                    Stamp::Packet { base_ns }
                                };
                                Box::new(PcapSink::new(w, stamp))
                            }
                        };
                        let res = run_worker(
                            core,
                            &mut pool,
                            &mut source,
                            &mut exec,
                            sink.as_mut(),
                            cfg.batch_size,
                            stop,
                            measure_from,
                        );
                        // Exports wait for every worker (shared state is still changing).
                        Ok((res, exec))
                    })
                    .map_err(EngineError::Thread)
            })
            .collect();
        if let Some(d) = cfg.duration.map(|d| d + cfg.warmup.unwrap_or_default()) {
            // Sleep in slices so a run whose workers finish early returns early.
            let deadline = Instant::now() + d;
            while Instant::now() < deadline && handles.iter().any(|h| h.as_ref().is_ok_and(|h| !h.is_finished())) {
                std::thread::sleep(Duration::from_millis(5).min(deadline.saturating_duration_since(Instant::now())));
            }
            stop.store(true, Ordering::Relaxed);
        }
        handles
            .into_iter()
            .map(|h| match h {
                Ok(h) => h.join().unwrap_or(Err(EngineError::WorkerPanicked)),
                Err(e) => Err(e),
            })
            .collect()
    });
    let elapsed = wall.elapsed();
    let mut workers: Vec<WorkerResult> = Vec::with_capacity(results.len());
    let mut pipelines = Vec::with_capacity(results.len());
    for r in results {
        let (w, p) = r?;
        workers.push(w);
        pipelines.push(p);
    }
    // Every worker has stopped: the state is final. Each NF's per-core
    // reports merge into one with its hook; exports read the final state.
    let details = merge_details(&workers, &pipelines);
    let mut report = Report::from_workers(spec, cfg, &workers, details, elapsed, hz);
    report.exports = collect_exports(cfg, &pipelines, &report);
    Ok(report)
}

/// Each NF's reports of every core, merged with the NF's hook (in chain order).
fn merge_details(workers: &[WorkerResult], pipelines: &[Pipeline]) -> Vec<Option<serde_json::Value>> {
    let Some(first) = pipelines.first() else { return Vec::new() };
    first
        .chain()
        .stages
        .iter()
        .enumerate()
        .map(|(i, stage)| {
            let mut merged: Option<serde_json::Value> = None;
            for d in workers.iter().filter_map(|w| w.nfs.get(i).and_then(|n| n.2.as_ref())) {
                match &mut merged {
                    Some(m) => stage.merge_report(m, d),
                    None => merged = Some(d.clone()),
                }
            }
            merged
        })
        .collect()
}

/// The rows of every `--export`ed NF: its state from every core (shared
/// state once), or rows derived from its merged report.
fn collect_exports(cfg: &RunConfig, pipelines: &[Pipeline], report: &Report) -> Vec<(String, Vec<serde_json::Value>)> {
    let mut names: Vec<&String> = cfg.export.iter().collect();
    names.sort();
    names.dedup();
    let Some(first) = pipelines.first() else { return Vec::new() };
    let mut out = Vec::new();
    for name in names {
        let Some(i) = first.chain().stages.iter().position(|s| s.name() == name) else { continue };
        let stage = &first.chain().stages[i];
        let rows = match stage.export_kind() {
            Export::State => pipelines
                .iter()
                .enumerate()
                .flat_map(|(core, p)| p.export(name, core == 0).unwrap_or_default())
                .collect(),
            Export::Report => {
                let merged = report.nfs.get(i).and_then(|n| n.details.as_ref());
                stage.export_report_rows(merged.unwrap_or(&serde_json::Value::Null))
            }
            Export::None => continue,
        };
        out.push((name.clone(), rows));
    }
    out
}
