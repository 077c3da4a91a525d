//! Running a chain: building it once per core, loading the input through the
//! dispatch stage, starting one worker per core over the replay trace, and
//! merging their results. The CLI and the benchmarks go through here.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flowplane_io::nic::{NicConfig, NicQueue};
use flowplane_io::replay::{ReplayConfig, ReplayQueue, ReplayTrace};
use flowplane_io::sink::{Discard, PcapSink, SharedPcapWriter, Stamp};
use flowplane_io::{cpu, Sink, Source};
use flowplane_nf::Export;
use flowplane_packet::{tsc, PacketPool, PoolConfig, MAX_BATCH};

pub use flowplane_scale::dyssect::class::PriorityClass;
use flowplane_scale::rss::DEFAULT_RETA_SIZE;
use flowplane_scale::steer::{Classifier, HashOn, Steering};
use flowplane_scale::strategy::{self, imbalance, LoadSample, Strategy};
pub use flowplane_scale::NicProfile;
use flowplane_trace::gen::Generator;

use crate::chain::Chain;
use crate::coarse::SharedStores;
use crate::error::EngineError;
use crate::exec::{ExecConfig, Pipeline};
use crate::load::{load_generated_with, load_trace_with, LoadStats, Spread};
use crate::placement::{self, Plan};
use crate::report::{Report, ScaleReport};
use crate::spec::ChainSpec;
use crate::worker::{Control, Step, Worker, WorkerResult};

/// Where forwarded packets go.
#[derive(Clone, Default)]
pub enum Output {
    /// Freed (the benchmark sink).
    #[default]
    Discard,
    /// Written to a pcap file shared by all workers.
    Pcap(SharedPcapWriter),
    /// Sent on ports, by verdict (port i = verdict i); worker w uses TX queue w of each.
    Ports(Vec<Arc<dyn flowplane_io::port::Port>>),
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
    /// Multi-core strategy (`rss`, `shared`, `rsspp`).
    pub scale: String,
    /// The strategy's control period.
    pub scale_period: Duration,
    /// Receive descriptor ring entries per core (NIC emulation).
    pub ring: usize,
    /// Run this many logical workers in turn on `cores` real threads and
    /// project the throughput from their busy time (shared-nothing strategies only).
    pub virtual_cores: Option<usize>,
    /// `--scale scr`: history length, loss recovery, injected loss.
    pub scr: crate::scr::ScrConfig,
    /// `--priority`: a traffic class whose latency is measured apart (and, under
    /// Dyssect, kept on working cores sized for its SLO).
    pub priority: Option<(String, flowplane_scale::dyssect::class::PriorityClass)>,
    /// `--slo-us`: the priority class's latency SLO.
    pub slo_us: Option<f64>,
    /// Dyssect's long timescale (the MILP period).
    pub long_period: Duration,
    /// Dyssect's MILP time budget.
    pub solver_budget: Duration,
    /// How long the emulated NIC takes to apply a RETA update or a flow rule (default `ideal`: at once).
    pub nic_profile: flowplane_scale::NicProfile,
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
            scale: "rss".to_string(),
            scale_period: strategy::DEFAULT_PERIOD,
            ring: 4096,
            virtual_cores: None,
            scr: crate::scr::ScrConfig::default(),
            priority: None,
            slo_us: None,
            long_period: Duration::from_secs(1),
            solver_budget: Duration::from_millis(200),
            nic_profile: flowplane_scale::NicProfile::ideal(),
        }
    }
}

/// The strategy `cfg` names, with its settings (Dyssect's come from the run's
/// options; `trace_rate`: the trace's own packet rate, Dyssect's offered load
/// for virtual cores at full speed, where latency is taken in trace time).
pub(crate) fn make_strategy(cfg: &RunConfig, trace_rate: Option<f64>) -> Result<Box<dyn Strategy>, EngineError> {
    if cfg.scale == "dyssect" {
        let d = flowplane_scale::dyssect::Config {
            short: cfg.scale_period,
            long: cfg.long_period,
            budget: cfg.solver_budget,
            priority: cfg.priority.as_ref().map(|p| p.1),
            slo_us: cfg.slo_us,
            rate_pps: cfg.rate_pps.or(trace_rate.filter(|_| cfg.virtual_cores.is_some())),
            batch: cfg.batch_size,
            ..Default::default()
        };
        return Ok(Box::new(flowplane_scale::dyssect::Dyssect::new(d)));
    }
    Ok(strategy::by_name(&cfg.scale, cfg.scale_period)?)
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

/// The run-time NIC of a steered run: its live table, the classifier the
/// trace was steered with, and the strategy whose control loop drives it.
pub struct Nic {
    /// The live steering table.
    pub steering: Arc<Steering>,
    /// The classifier (maps flow keys to RETA entries for hand-over).
    pub classifier: Classifier,
    /// The strategy.
    pub strategy: Box<dyn Strategy>,
    /// The NIC programming the NFs' placement asked for (notes for the report).
    pub plan: Plan,
}

/// Builds the chain once per core (spec errors surface before any traffic
/// is loaded), checks every NF's declared state placement against the
/// strategy (`cfg.scale`) and programs the NIC accordingly (symmetric key,
/// hash on an address, flow-director rules and per-core port shares), loads
/// `input` as one stream steered at receive, and runs it.
pub fn run_input(
    cfg: &RunConfig,
    spec: &ChainSpec,
    input: Input<'_>,
    symmetric_rss: bool,
    output: Output,
) -> Result<InputRun, EngineError> {
    let p = prepare(cfg, spec, input, symmetric_rss)?;
    let report = run_prepared(cfg, spec, &p, output)?;
    Ok(InputRun { report, load: p.load, symmetric: (p.plan.symmetric, p.auto_symmetric) })
}

/// A loaded, steered input with the NIC programming its chain needs: run
/// it as often as wanted (`flowplane mlffr` runs one per offered rate).
pub struct Prepared {
    /// The steered trace.
    pub trace: Arc<ReplayTrace>,
    /// What loading saw.
    pub load: LoadStats,
    /// The NIC programming for the NFs' placement.
    pub plan: Plan,
    /// The classifier the trace was steered with.
    pub classifier: Classifier,
    /// The NF that made the key symmetric, when `symmetric_rss` was not asked for.
    pub auto_symmetric: Option<&'static str>,
}

/// Checks the strategy and the chain's placement on `cfg`'s workers and
/// loads `input` steered for them.
pub fn prepare(
    cfg: &RunConfig,
    spec: &ChainSpec,
    input: Input<'_>,
    symmetric_rss: bool,
) -> Result<Prepared, EngineError> {
    check(cfg)?;
    let strategy = make_strategy(cfg, None)?;
    let workers = workers(cfg);
    if cfg.virtual_cores.is_some() && !strategy.projectable() {
        return Err(EngineError::Config(format!(
            "--virtual-cores: --scale {} costs contention between real cores, which a projection cannot see",
            strategy.name()
        )));
    }
    // Memory is checked before it is allocated: the NFs' private arrays before
    // the first chain is built, then the tables, pools, logs and the trace.
    let nf_needs = crate::budget::nf_needs(cfg, spec);
    crate::budget::check(&nf_needs)?;
    let chain0 = Chain::build(spec)?;
    let mut needs = nf_needs;
    needs.extend(crate::budget::run_needs(cfg, &chain0));
    match &input {
        Input::File(path) => {
            // The replayed trace costs about its file's size (a 64-byte frame: 80 bytes of file, ~88 in memory).
            let bytes = std::fs::metadata(path).map_or(0, |m| if m.is_file() { m.len() } else { 0 });
            needs.push(crate::budget::Need { what: format!("--input {}", path.display()), bytes: bytes.into() });
        }
        Input::Generated(gen) => needs.push(crate::budget::Need {
            what: format!("--gen --packets {}", gen.remaining()),
            bytes: crate::budget::generated_bytes(gen.config()),
        }),
    }
    crate::budget::check(&needs)?;
    let plan = placement::plan(&chain0, spec, strategy.as_ref(), workers, symmetric_rss)?;
    let auto_symmetric =
        if workers > 1 && !symmetric_rss && plan.symmetric { chain0.needs_symmetric_rss() } else { None };
    // Spec errors in the exports surface before loading.
    build_chains(cfg, spec, 1)?;
    let classifier =
        Classifier::new(DEFAULT_RETA_SIZE, plan.symmetric, plan.hash_on, plan.icmp_inner, plan.rules.clone())?;
    let (trace, load) = match input {
        Input::File(path) => load_trace_with(path, Spread::Steered(&classifier), None)?,
        Input::Generated(gen) => load_generated_with(*gen, Spread::Steered(&classifier))?,
    };
    if load.packets == 0 {
        return Err(EngineError::EmptyInput);
    }
    Ok(Prepared { trace, load, plan, classifier, auto_symmetric })
}

/// Runs a prepared input (a fresh table and strategy each time).
pub fn run_prepared(cfg: &RunConfig, spec: &ChainSpec, p: &Prepared, output: Output) -> Result<Report, EngineError> {
    check(cfg)?;
    let workers = workers(cfg);
    if p.plan.overrides.len() > 1 && p.plan.overrides.len() != workers {
        return Err(EngineError::Config(format!(
            "prepared for {} workers, run with {workers}",
            p.plan.overrides.len()
        )));
    }
    let n = p.trace.packets() as f64;
    let trace_rate = (p.trace.loop_ns() > 1 && n > 0.0).then(|| n * 1e9 / p.trace.loop_ns() as f64);
    let strategy = make_strategy(cfg, trace_rate)?;
    let chains = build_chains_planned(cfg, spec, &p.plan, workers)?;
    let steering = Arc::new(
        Steering::with_flow_slots(workers, &p.classifier, &[], strategy.flow_slots())?
            .with_nic_profile(cfg.nic_profile.clone()),
    );
    let nic = Nic { steering, classifier: p.classifier.clone(), strategy, plan: p.plan.clone() };
    run_chains(cfg, spec, chains, Arc::clone(&p.trace), output, Some(nic))
}

/// Logical workers of a run.
fn workers(cfg: &RunConfig) -> usize {
    cfg.virtual_cores.unwrap_or(cfg.cores).max(1)
}

/// One chain per worker, each from the spec with its plan overrides (per-core port shares).
pub(crate) fn build_chains_planned(
    cfg: &RunConfig,
    spec: &ChainSpec,
    plan: &Plan,
    workers: usize,
) -> Result<Vec<Chain>, EngineError> {
    let mut chains = build_chains(cfg, spec, workers)?;
    for (core, c) in chains.iter_mut().enumerate() {
        if plan.overrides.get(core).is_some_and(|o| !o.is_empty()) {
            *c = Chain::build_with(&placement::spec_for_core(spec, plan, core), plan.shared_flows)?;
        } else if plan.shared_flows {
            *c = Chain::build_with(spec, true)?;
        }
    }
    Ok(chains)
}

/// Runs `spec` over a steered trace (see [`ReplayTrace::is_steered`]) with
/// a given table, classifier and strategy (tests drive RETA moves this way).
pub fn run_steered(
    cfg: &RunConfig,
    spec: &ChainSpec,
    trace: Arc<ReplayTrace>,
    nic: Nic,
    output: Output,
) -> Result<Report, EngineError> {
    check(cfg)?;
    let chains = build_chains_planned(cfg, spec, &nic.plan, workers(cfg))?;
    run_chains(cfg, spec, chains, trace, output, Some(nic))
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
    if cfg.virtual_cores == Some(0) || cfg.virtual_cores.is_some_and(|v| v > 4096) {
        return Err(EngineError::Config("--virtual-cores must be between 1 and 4096".to_string()));
    }
    if cfg.ring < 2 * MAX_BATCH || cfg.ring > 1 << 20 {
        return Err(EngineError::Config(format!(
            "ring of {} entries out of range [{}, {}]",
            cfg.ring,
            2 * MAX_BATCH,
            1 << 20
        )));
    }
    if cfg.scale == "scr" {
        // An SCR replica runs the chain over its own tables in sequence order
        // (worker.rs hands the batch to it, not to the Pipeline): the
        // executor and its table options would change nothing.
        let (e, d) = (&cfg.exec, ExecConfig::default());
        let kind = format!("--exec {}", e.kind);
        let set = [
            (e.kind != d.kind, kind.as_str()),
            (!e.prefetch, "--no-prefetch"),
            (!e.prefetch_hooks, "--no-prefetch-hooks"),
            (!e.aux, "--no-aux"),
            (!e.packing, "--no-packing"),
            (!e.match_sharing, "--no-match-sharing"),
            (e.full_policy != d.full_policy, "--table-full evict"),
        ];
        if let Some((_, opt)) = set.iter().find(|(on, _)| *on) {
            return Err(EngineError::Config(format!(
                "{opt}: --scale scr runs each replica's chain in its own order over its replica tables, not through an executor; drop {opt} or use another --scale"
            )));
        }
    }
    Ok(())
}

/// One compiled chain per worker, and the exports checked against the chain.
fn build_chains(cfg: &RunConfig, spec: &ChainSpec, workers: usize) -> Result<Vec<Chain>, EngineError> {
    let mut chains = Vec::with_capacity(workers);
    for _ in 0..workers {
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

/// Runs `spec` over `trace` and reports: a trace split at load (one queue
/// per worker, a table that never changes), or a steered one under plain
/// RSS (the round-robin table, the plain Toeplitz key).
pub fn run(cfg: &RunConfig, spec: &ChainSpec, trace: Arc<ReplayTrace>, output: Output) -> Result<Report, EngineError> {
    check(cfg)?;
    let chains = build_chains(cfg, spec, workers(cfg))?;
    let nic = if trace.is_steered() {
        let classifier = Classifier::new(DEFAULT_RETA_SIZE, false, HashOn::FiveTuple, false, Vec::new())?;
        let steering = Arc::new(Steering::new(workers(cfg), &classifier, &[])?);
        Some(Nic { steering, classifier, strategy: Box::new(strategy::Rss), plan: Plan::default() })
    } else {
        None
    };
    run_chains(cfg, spec, chains, trace, output, nic)
}

/// What the control loop saw.
#[derive(Default)]
pub(crate) struct ControlLog {
    /// Imbalance factor of the packets each core received, per period window.
    pub(crate) windows: Vec<f64>,
    /// Imbalance factor of the cores' busy cycles, per period window.
    pub(crate) cpu_windows: Vec<f64>,
    /// Per queue: smoothed worker cycles per packet (a window alone is noisy).
    cpp: Vec<f64>,
    /// Moves started.
    pub(crate) started: u64,
    /// What the previous period read (its deltas are the window's figures).
    prev_loads: Vec<(u64, Vec<u64>)>,
    prev_rx: Vec<u64>,
    prev_scan: Vec<u64>,
    prev_busy: Vec<u64>,
}

/// Runs prebuilt per-worker chains over `trace`: real workers one per
/// thread, or logical workers taking turns on `cfg.cores` threads.
fn run_chains(
    cfg: &RunConfig,
    spec: &ChainSpec,
    chains: Vec<Chain>,
    trace: Arc<ReplayTrace>,
    output: Output,
    mut nic: Option<Nic>,
) -> Result<Report, EngineError> {
    let nw = workers(cfg);
    if chains.len() != nw || (nic.is_none() && trace.queues() != nw) {
        return Err(EngineError::Config(format!("{nw} workers but the trace has {} queues", trace.queues())));
    }
    if let Some(n) = &nic {
        if n.steering.queues() != nw || !trace.is_steered() {
            return Err(EngineError::Config(format!(
                "{nw} workers but the steering table has {} queues",
                n.steering.queues()
            )));
        }
    }
    let threads = cfg.cores.min(nw).max(1);
    // Coarse state is shared by every core: one table per coarse group, created once.
    let shared = match chains.first() {
        Some(c) => SharedStores::new(&c.groups, cfg.exec.flows, cfg.exec.default_idle_timeout_ns)?.for_replay(),
        None => SharedStores::default(),
    };
    let hz = tsc::hz();
    let stop = AtomicBool::new(false);
    let epoch_ns =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let start_tsc = tsc::rdtsc();
    let measure_from = start_tsc + cfg.warmup.map_or(0, |w| (w.as_secs_f64() * hz) as u64);
    let wall = Instant::now();
    let (nic_parts, mut strategy) = match nic.take() {
        Some(Nic { steering, classifier, strategy, plan }) => (Some((steering, classifier, plan)), Some(strategy)),
        None => (None, None),
    };
    let spray = strategy.as_ref().is_some_and(|s| s.spray());
    let scr = match (strategy.as_ref().is_some_and(|s| s.replicates()), chains.first()) {
        (true, Some(c)) => Some(crate::scr::ScrRun::new(&cfg.scr, nw, threads, cfg.loops, &trace, c)?),
        _ => None,
    };
    let scr = scr.as_ref();
    let counts = strategy.as_ref().is_some_and(|s| s.counts_loads());
    // SCR bounds the drift between cores itself (a replica waits before its log would overwrite).
    // Projected runs are held within a bounded distance: logical workers taking turns process a
    // burst each per turn, so free-running queues would each walk their own span of the
    // stream and every strategy would look balanced (packets / busiest worker).
    let bounded = strategy.as_ref().is_some_and(|s| s.moves_flows())
        || (cfg.virtual_cores.is_some_and(|v| v > threads) && nic_parts.is_some());
    let stride = strategy.as_ref().map_or(0, |s| s.sample_stride());
    let steering = nic_parts.as_ref().map(|n| &*n.0);
    let classifier = nic_parts.as_ref().map(|n| &n.1);
    // Per thread: its workers' chains, in worker order.
    let mut per_thread: Vec<Vec<(usize, Chain)>> = (0..threads).map(|_| Vec::new()).collect();
    for (w, chain) in chains.into_iter().enumerate() {
        per_thread[w % threads].push((w, chain));
    }
    let mut log = ControlLog::default();
    // Every worker is built (tables allocated) before the traffic starts.
    let barrier = std::sync::Barrier::new(threads);
    let go = std::sync::atomic::AtomicU64::new(0);
    let warm = cfg.warmup.map_or(0, |w| (w.as_secs_f64() * hz) as u64);
    type Done = Result<Vec<(WorkerResult, Pipeline, Option<Box<crate::scr::ScrReplica>>)>, EngineError>;
    // Workers wake the coordinating thread when they end, so it can sleep until its next control tick (or the
    // deadline) instead of polling: on a machine with as many CPUs as workers, every wake-up preempts one.
    let coordinator = std::thread::current();
    let results: Vec<Done> = std::thread::scope(|s| {
        let handles: Vec<_> = per_thread
            .into_iter()
            .enumerate()
            .map(|(t, mine)| {
                let trace = Arc::clone(&trace);
                let output = output.clone();
                let stop = &stop;
                let shared = &shared;
                let (barrier, go) = (&barrier, &go);
                let steering_arc = nic_parts.as_ref().map(|n| Arc::clone(&n.0));
                let wake = WakeOnExit(coordinator.clone());
                std::thread::Builder::new()
                    .name(format!("fp-worker-{t}"))
                    .spawn_scoped(s, move || -> Done {
                        let _wake = wake;
                        if cfg.pin {
                            cpu::pin_current_thread(t);
                        }
                        let build = || -> Result<Vec<Worker<'_>>, EngineError> {
                            let mut ws = Vec::with_capacity(mine.len());
                            for (w, chain) in mine {
                                let mut pool = PacketPool::new(PoolConfig {
                                    buffers: cfg.pool_buffers.max(2 * MAX_BATCH),
                                    // In memory, no port registers the region: spread the buffers over the L1's sets.
                                    buf_size: flowplane_packet::SPREAD_BUF_SIZE,
                                    ..PoolConfig::default()
                                })?;
                                let replica = scr.map(|r| {
                                    crate::scr::ScrReplica::new(
                                        w,
                                        &chain,
                                        cfg.exec.flows.min(r.keys.saturating_mul(2).max(1024)),
                                        cfg.exec.default_idle_timeout_ns,
                                        Arc::clone(&r.seq),
                                        r.logs.clone(),
                                        r.end,
                                    )
                                });
                                // Under scr the chain's state lives in the replica: the executor's tables stay small.
                                let ecfg = if scr.is_some() {
                                    crate::exec::ExecConfig { flows: 1024, ..cfg.exec }
                                } else {
                                    cfg.exec
                                };
                                let mut exec = Pipeline::new(chain, ecfg, shared.clone())?;
                                if cfg.rate_pps.is_some() {
                                    // Paced: a page fault on the packet path is a stall that loses packets.
                                    exec.prefault();
                                    pool.prefault();
                                }
                                let base_ns = trace.base_ns();
                                let source: Box<dyn Source> = match &steering_arc {
                                    Some(st) => {
                                        let q = NicQueue::new(
                                            Arc::clone(&trace),
                                            Arc::clone(st),
                                            w as u16,
                                            NicConfig {
                                                loops: cfg.loops,
                                                rate_pps: cfg.rate_pps,
                                                tsc_hz: hz,
                                                start_tsc,
                                                ring: cfg.ring,
                                                spray,
                                                count_loads: counts,
                                                bounded_drift: bounded,
                                            },
                                        );
                                        match scr {
                                            Some(r) => Box::new(q.with_sequencer(Arc::clone(&r.seq))),
                                            None => Box::new(q),
                                        }
                                    }
                                    None => Box::new(ReplayQueue::new(
                                        Arc::clone(&trace),
                                        w,
                                        ReplayConfig {
                                            loops: cfg.loops,
                                            max_packets: None,
                                            // The whole trace's rate: each queue paces by trace time.
                                            rate_pps: cfg.rate_pps,
                                            tsc_hz: hz,
                                        },
                                    )),
                                };
                                let sink: Box<dyn Sink> = match &output {
                                    Output::Discard => Box::new(Discard),
                                    Output::Pcap(wr) => {
                                        let stamp = if cfg.restamp {
                                            Stamp::Transmit { tsc0: start_tsc, epoch_ns, tsc_hz: hz }
                                        } else {
                                            Stamp::Packet { base_ns }
                                        };
                                        Box::new(PcapSink::new(wr.clone(), stamp))
                                    }
                                    Output::Ports(ports) => Box::new(crate::live::port_sink(ports, w, None)?),
                                };
                                let ctl = match (steering, classifier) {
                                    (Some(st), Some(c)) => Some(Control::new(st, c).with_sampling(stride)),
                                    _ => None,
                                };
                                let mut wk =
                                    Worker::new(w, pool, source, exec, sink, cfg.batch_size, measure_from, ctl);
                                wk.set_priority(cfg.priority.as_ref().map(|p| p.1));
                                if cfg.virtual_cores.is_some() && cfg.rate_pps.is_none() && cfg.priority.is_some() {
                                    wk.set_virtual_latency(hz);
                                }
                                ws.push(match replica {
                                    Some(r) => wk.with_scr(r),
                                    None => wk,
                                });
                            }
                            Ok(ws)
                        };
                        // Every thread reaches the barrier, built or not (a failed one then returns its error).
                        let built = build();
                        if barrier.wait().is_leader() {
                            go.store(tsc::rdtsc(), Ordering::SeqCst);
                        }
                        barrier.wait();
                        let mut ws = built?;
                        let t0 = go.load(Ordering::SeqCst);
                        for w in &mut ws {
                            w.start(t0, t0 + warm);
                        }
                        if ws.len() == 1 {
                            ws[0].run(stop);
                        } else {
                            take_turns(&mut ws, stop);
                        }
                        // Exports wait for every worker (shared state is still changing).
                        Ok(ws.into_iter().map(Worker::finish_with_replica).collect())
                    })
                    .map_err(EngineError::Thread)
            })
            .collect();
        // The run's clock starts when every worker is ready.
        while go.load(Ordering::SeqCst) == 0 && handles.iter().any(|h| h.as_ref().is_ok_and(|h| !h.is_finished())) {
            std::thread::sleep(Duration::from_micros(200));
        }
        let deadline = cfg.duration.map(|d| Instant::now() + d + cfg.warmup.unwrap_or_default());
        let period = strategy.as_ref().map_or(Duration::from_millis(100), |s| s.period());
        let mut next_tick = Instant::now() + period;
        // Sleep in slices so a run whose workers finish early returns early;
        // the strategy's control loop ticks every period meanwhile.
        //
        // The NIC's update latencies (`--nic-profile`) run on this loop's
        // clock, the wall clock, as the control period does: a 359 ms update
        // spans 3.6 periods of 100 ms whatever the run. With virtual cores
        // (logical workers taking turns on fewer threads) a wall-clock
        // second carries fewer packets than the projected cores would take,
        // so an update covers fewer packets than on real cores; the period
        // does the same, so the controller's view (how many periods a change
        // takes to land) is the paper's, while packets per update are not.
        while handles.iter().any(|h| h.as_ref().is_ok_and(|h| !h.is_finished())) {
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                break;
            }
            if let Some(st) = steering {
                // Updates whose time has come land (the old table steered until now).
                st.pump(now);
            }
            if now >= next_tick {
                next_tick += period;
                if let (Some(st), Some(strat)) = (steering, strategy.as_mut()) {
                    control_tick(st, strat.as_mut(), &mut log);
                    // This period's changes go to the NIC (its RETA moves as one write).
                    st.pump(Instant::now());
                    if strat.finished() {
                        break;
                    }
                }
            }
            let until = deadline.map_or(next_tick, |d| d.min(next_tick));
            let until = steering.and_then(|st| st.next_landing()).map_or(until, |l| l.min(until));
            // Woken early by a worker that ends (`WakeOnExit`); spurious wake-ups just loop.
            std::thread::park_timeout(until.saturating_duration_since(Instant::now()));
        }
        stop.store(true, Ordering::Relaxed);
        join_workers(handles)
    });
    let elapsed = wall.elapsed();
    let mut done = Vec::with_capacity(nw);
    for r in results {
        done.extend(r?);
    }
    done.sort_by_key(|(w, _, _)| w.core);
    let (mut workers, mut pipelines, mut replicas) = (Vec::new(), Vec::new(), Vec::new());
    for (w, p, r) in done {
        workers.push(w);
        pipelines.push(p);
        replicas.extend(r);
    }
    if let Some((st, _, _)) = &nic_parts {
        import_late_mail(st, &mut pipelines, &mut workers);
    }
    // Every worker has stopped: the state is final. Each NF's per-core
    // reports merge into one with its hook; exports read the final state.
    let details = merge_details(&workers, &pipelines);
    let mut report = Report::from_workers(spec, cfg, &workers, details, elapsed, hz);
    if let (Some((st, _, plan)), Some(strat)) = (&nic_parts, &strategy) {
        report.scale = Some(ScaleReport::new(
            cfg,
            strat.name(),
            plan,
            &workers,
            threads,
            (&log.windows, &log.cpu_windows),
            st.moves_done(),
            elapsed,
            hz,
        ));
        if let Some(sc) = report.scale.as_mut() {
            sc.controller = strat.report_json();
            if strat.moves_flows() || !st.nic_profile().is_ideal() {
                sc.nic = Some(crate::report::NicReport::new(st.nic_profile(), st.update_stats()));
            }
            sc.priority = cfg
                .priority
                .as_ref()
                .map(|(name, _)| crate::report::PriorityReport::new(name, cfg.slo_us, &workers, hz));
            if let (Some(p), true) = (sc.priority.as_mut(), cfg.virtual_cores.is_some() && cfg.rate_pps.is_none()) {
                p.latency_from =
                    "virtual-time: trace arrivals, each logical worker a dedicated FIFO core (PROJECTION)".into();
            }
        }
    }
    if let Some(r) = scr {
        let cores = workers.iter_mut().filter_map(|w| w.scr.take()).collect();
        report.scr = Some(crate::scr::ScrReport::new(r.seq.history(), r.fields, cfg.scr.recovery, cfg.scr.loss, cores));
    }
    // Live flows where the per-core tables do not give them by a sum: under scr the replicas hold the state
    // (every replica the same), and a sprayed flow has an entry on every core it reached (unless its state lives
    // in a shared 5-tuple table, whose keys each core reports).
    if let Some(n) = replicas.first().and_then(|r| r.flows()) {
        report.tables.flows = n;
    } else if spray && !report.tables.flows_shared {
        let mut keys = std::collections::HashSet::new();
        for p in &pipelines {
            p.for_each_flow(&mut |k| {
                keys.insert(*k);
            });
        }
        report.tables.flows = keys.len() as u64;
    }
    // Keys that do not carry their flow (SCR records' folded IPv6 addresses, the `shared` strategy's IPv6 5-tuple
    // fingerprints) are named from the input, read again once for an export.
    let keys = (!cfg.export.is_empty() && spray).then(|| ExportKeys::of(&trace));
    // Under scr the state is the replicas' (the pipelines' tables stay empty): export core 0's, which every
    // replica equals when the digests agree.
    let scr_state = replicas.first().zip(keys.as_ref()).map(|(r, k)| (&**r, k));
    report.exports = collect_exports(cfg, &pipelines, scr_state, keys.as_ref(), &report);
    Ok(report)
}

/// State handed over after its new owner had finished still belongs there: imported once every worker stopped.
pub(crate) fn import_late_mail(st: &Steering, pipelines: &mut [Pipeline], workers: &mut [WorkerResult]) {
    let mut mail = Vec::new();
    for (q, (p, w)) in pipelines.iter_mut().zip(workers.iter_mut()).enumerate() {
        st.take_mail(q, &mut mail);
        for h in mail.drain(..) {
            let (ok, bad) = p.import_flows(&h.state);
            w.flows_in += ok as u64;
            w.flows_refused += bad as u64;
            st.imported(h.mv);
        }
        // The worker's table figures were read when it stopped, before these entries arrived.
        w.store = p.store_report();
    }
}

/// Bursts a logical worker runs per turn.
const TURN_BURSTS: usize = 16;

/// Logical workers taking turns on one thread, a few bursts each.
fn take_turns(ws: &mut [Worker<'_>], stop: &AtomicBool) {
    let mut live: Vec<usize> = (0..ws.len()).collect();
    while !live.is_empty() {
        let mut busy = false;
        // A few bursts per turn: a worker's caches and prefetches stay warm
        // across its own bursts, as on a core of its own.
        live.retain(|&i| {
            for _ in 0..TURN_BURSTS {
                match ws[i].step(stop) {
                    Step::Busy => busy = true,
                    Step::Idle => return true,
                    Step::Done => return false,
                }
            }
            true
        });
        if !busy {
            std::hint::spin_loop();
        }
    }
}

/// One period of the control loop: the window's per-queue load and
/// imbalance, the strategy's rebalancing, the moves started.
pub(crate) fn control_tick(st: &Steering, strat: &mut dyn Strategy, log: &mut ControlLog) {
    let ControlLog { prev_loads, prev_rx, prev_scan, prev_busy, .. } = log;
    // Each queue's share of the traffic in the window: packets it received per
    // stream position it walked (at full speed queues walk at their own pace;
    // paced, this is its share of the offered load).
    let (rx, scan) = (st.queue_rx(), st.queue_scan());
    prev_rx.resize(rx.len(), 0);
    prev_scan.resize(scan.len(), 0);
    let walked: Vec<u64> =
        scan.iter().zip(prev_scan.iter()).map(|(&a, &b)| if a == u64::MAX { 0 } else { a.saturating_sub(b) }).collect();
    let share: Vec<u64> = rx
        .iter()
        .zip(prev_rx.iter())
        .zip(&walked)
        .map(|((&a, &b), &w)| a.saturating_sub(b).saturating_mul(1_000_000).checked_div(w).unwrap_or(0))
        .collect();
    let active = walked.iter().filter(|&&w| w > 0).count();
    // Cycles per packet of each queue's worker in the window: an entry's load
    // is its packets times its owner's cost per packet (RSS++ balances CPU load).
    let busy = st.queue_busy();
    prev_busy.resize(busy.len(), 0);
    log.cpp.resize(busy.len(), 0.0);
    for (k, ((&b, &pb), (&r, &pr))) in busy.iter().zip(prev_busy.iter()).zip(rx.iter().zip(prev_rx.iter())).enumerate()
    {
        let n = r.saturating_sub(pr);
        if n >= 1000 {
            let x = b.saturating_sub(pb) as f64 / n as f64;
            log.cpp[k] = if log.cpp[k] == 0.0 { x } else { 0.7 * log.cpp[k] + 0.3 * x };
        }
    }
    let cpp: Vec<u64> = log.cpp.iter().map(|&c| c as u64).collect();
    let mean_cpp = (cpp.iter().sum::<u64>() / cpp.len().max(1) as u64).max(1);
    let cpu: Vec<u64> = busy
        .iter()
        .zip(prev_busy.iter())
        .zip(&walked)
        .map(|((&b, &pb), &w)| b.saturating_sub(pb).saturating_mul(1_000).checked_div(w).unwrap_or(0))
        .collect();
    *prev_busy = busy;
    *prev_rx = rx;
    for (p, &s) in prev_scan.iter_mut().zip(&scan) {
        if s != u64::MAX {
            *p = s;
        }
    }
    if active == walked.len() && active > 0 {
        log.windows.push(imbalance(&share));
        log.cpu_windows.push(imbalance(&cpu));
    }
    // Strategies that drive the table themselves (Dyssect: RETA moves and flow rules).
    let empty = LoadSample { entry_packets: &[], owners: &[], queues: st.queues() };
    if strat.drive(st, &empty, &log.cpp, tsc::hz()) {
        return;
    }
    if !strat.counts_loads() {
        return;
    }
    // Per RETA entry: packets per million stream positions, from each
    // queue's counts over the positions it had walked when it published them
    // (a consistent pair; a move mid-window splits an entry over two queues).
    let reta = st.reta_size();
    // As requested: moves still queued in a slow NIC count as done (else they would be asked for again).
    let owners = st.planned_owners();
    let now = st.queue_key_loads();
    let mut delta = vec![0u64; reta];
    for (q, (pos, counts)) in now.iter().enumerate() {
        let (ppos, pcounts) = match prev_loads.get(q) {
            Some(p) => (p.0, &p.1[..]),
            None => (0, &[][..]),
        };
        let w = pos.saturating_sub(ppos);
        if w == 0 {
            continue;
        }
        let c = if strat.balance_cpu() { cpp.get(q).copied().filter(|&c| c > 0).unwrap_or(mean_cpp) } else { 1 };
        for (e, d) in delta.iter_mut().enumerate() {
            let x = counts.get(e).copied().unwrap_or(0).saturating_sub(pcounts.get(e).copied().unwrap_or(0));
            *d += x.saturating_mul(1_000_000) / w * c;
        }
    }
    *prev_loads = now;
    let sample = LoadSample { entry_packets: &delta, owners: &owners[..reta], queues: st.queues() };
    for (e, q) in strat.rebalance(&sample) {
        if st.start_move(e, q).is_ok() {
            log.started += 1;
        }
    }
}

/// Each NF's reports of every core, merged with the NF's hook (in chain order).
pub(crate) fn merge_details(workers: &[WorkerResult], pipelines: &[Pipeline]) -> Vec<Option<serde_json::Value>> {
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
pub(crate) fn collect_exports(
    cfg: &RunConfig,
    pipelines: &[Pipeline],
    scr: Option<(&crate::scr::ScrReplica, &ExportKeys)>,
    keys: Option<&ExportKeys>,
    report: &Report,
) -> Vec<(String, Vec<serde_json::Value>)> {
    let resolve = |k: u128| keys.and_then(|m| m.v6_tuples.get(&k).copied());
    let mut names: Vec<&String> = cfg.export.iter().collect();
    names.sort();
    names.dedup();
    let Some(first) = pipelines.first() else { return Vec::new() };
    let mut out = Vec::new();
    for name in names {
        let Some(i) = first.chain().stages.iter().position(|s| s.name() == name) else { continue };
        let stage = &first.chain().stages[i];
        let rows = match stage.export_kind() {
            Export::State if scr.is_some() => {
                scr.and_then(|(r, k)| r.export(first.chain(), name, &k.v6_folds)).unwrap_or_default()
            }
            Export::State => pipelines
                .iter()
                .enumerate()
                .flat_map(|(core, p)| p.export_resolving(name, core == 0, &resolve).unwrap_or_default())
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

/// The input's IPv6 flows by the keys that stand for them where the key does not carry the addresses.
#[derive(Default)]
pub(crate) struct ExportKeys {
    /// SCR records' 32-bit folds of IPv6 addresses.
    pub(crate) v6_folds: std::collections::HashMap<u32, std::net::Ipv6Addr>,
    /// Shared 5-tuple tables' keys of IPv6 flows (fingerprints).
    pub(crate) v6_tuples: std::collections::HashMap<u128, flowplane_wire::flow::FiveTuple>,
}

impl ExportKeys {
    /// Reads every packet of `trace` once.
    fn of(trace: &ReplayTrace) -> ExportKeys {
        let mut k = ExportKeys::default();
        let mut buf = Vec::new();
        for q in 0..trace.queues() {
            for i in 0..trace.queue_packets(q) {
                if !trace.copy_frame(q, i, &mut buf) {
                    continue;
                }
                let meta = flowplane_nf::PktMeta::parse(&buf);
                if !meta.valid || meta.tuple.is_ipv4() {
                    continue;
                }
                crate::scr::add_v6_folds(&mut k.v6_folds, &buf);
                let g = flowplane_nf::stateful::Granularity::FiveTuple;
                if let Some(key) = crate::coarse::group_key(g, &meta) {
                    k.v6_tuples.insert(key, g.project(&meta.tuple));
                }
            }
        }
        k
    }
}

/// Joins scoped worker threads in spawn order: a thread that could not be
/// spawned keeps its error, one that panicked becomes `WorkerPanicked`.
pub(crate) fn join_workers<T>(
    handles: Vec<Result<std::thread::ScopedJoinHandle<'_, Result<T, EngineError>>, EngineError>>,
) -> Vec<Result<T, EngineError>> {
    handles
        .into_iter()
        .map(|h| match h {
            Ok(h) => h.join().unwrap_or(Err(EngineError::WorkerPanicked)),
            Err(e) => Err(e),
        })
        .collect()
}

/// Unparks the coordinating thread when a worker thread ends (returns, fails or panics), so the coordinator's
/// sleep until its next tick ends as soon as the workers are done.
struct WakeOnExit(std::thread::Thread);

impl Drop for WakeOnExit {
    fn drop(&mut self) {
        self.0.unpark();
    }
}
