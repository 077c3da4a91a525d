//! Preparing a run: the configuration, the strategy, the chain built once
//! per core with its placement checked, the steering planned, and the input
//! made ready — a trace loaded through the dispatch stage, or a live port's
//! queues opened (behind a dispatcher core when flowplane steers). Every
//! entry point then hands the run to the one runtime ([`crate::runtime`]).
//! The CLI and the benchmarks go through here.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use flowplane_io::dispatch::{Dispatcher, Spread as DispatchSpread};
use flowplane_io::port::fanout_steer::KernelSteer;
use flowplane_io::replay::ReplayTrace;
use flowplane_io::sink::SharedPcapWriter;
use flowplane_nf::Export;
use flowplane_packet::{PacketPool, PoolConfig, MAX_BATCH};

pub use flowplane_scale::dyssect::class::PriorityClass;
use flowplane_scale::rss::DEFAULT_RETA_SIZE;
use flowplane_scale::steer::{Classifier, HashOn, Steering};
use flowplane_scale::strategy::{self, Delivery, Strategy, StrategyConfig};
pub use flowplane_scale::NicProfile;
use flowplane_trace::gen::Generator;

use crate::chain::Chain;
use crate::error::EngineError;
use crate::exec::ExecConfig;
use crate::kernel_moves::KernelMover;
use crate::live::{Live, Steer};
use crate::load::{load_generated_with, load_trace_with, LoadStats, Spread};
use crate::placement::{self, Plan};
use crate::report::Report;
use crate::runtime::{run_workers, Feed, PortFeed, Watch};
use crate::spec::ChainSpec;

/// Where forwarded packets go.
#[derive(Clone, Default)]
pub enum Output {
    /// Freed (the benchmark sink).
    #[default]
    Discard,
    /// Written to a pcap file shared by all workers.
    Pcap(SharedPcapWriter),
    /// Written by verdict (verdict i = file i) to pcap files shared by all
    /// workers: a replay's `--output` and `--port` files.
    Pcaps(Vec<SharedPcapWriter>),
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
    /// `--ipfix`: export flow records and NAT events to collectors (None: off).
    pub ipfix: Option<crate::ipfix::IpfixConfig>,
    /// `--replicate`: state replication to and from a peer instance (None: off).
    pub repl: Option<crate::repl::ReplConfig>,
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
            ipfix: None,
            repl: None,
        }
    }
}

/// The strategy `cfg` names, with its settings (Dyssect's come from the run's
/// options; `trace_rate`: the trace's own packet rate, Dyssect's offered load
/// for virtual cores at full speed, where latency is taken in trace time).
pub(crate) fn make_strategy(cfg: &RunConfig, trace_rate: Option<f64>) -> Result<Box<dyn Strategy>, EngineError> {
    let c = StrategyConfig {
        period: cfg.scale_period,
        long_period: cfg.long_period,
        solver_budget: cfg.solver_budget,
        priority: cfg.priority.as_ref().map(|p| p.1),
        slo_us: cfg.slo_us,
        rate_pps: cfg.rate_pps.or(trace_rate.filter(|_| cfg.virtual_cores.is_some())),
        batch: cfg.batch_size,
    };
    Ok(strategy::build(&cfg.scale, &c)?)
}

/// Flow-rule slots the strategy's controller needs in the NIC (Dyssect's per-flow rules).
fn flow_slots(s: &dyn Strategy) -> usize {
    s.controller().map_or(0, |c| c.flow_slots())
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
        Classifier::new(DEFAULT_RETA_SIZE, plan.symmetric, plan.hash_on, plan.icmp_inner, plan.rules.clone())?
            .with_key(&run_rss_key(cfg, plan.symmetric));
    let (trace, load) = match input {
        Input::File(path) => load_trace_with(path, Spread::Steered(&classifier), None)?,
        Input::Generated(gen) => load_generated_with(*gen, Spread::Steered(&classifier))?,
    };
    if load.packets == 0 {
        return Err(EngineError::EmptyInput);
    }
    Ok(Prepared { trace, load, plan, classifier, auto_symmetric })
}

/// The run's Toeplitz key: drawn from its hash secret (`--hash-seed` reproduces it), symmetric when the plan
/// needs both directions on one core. The emulated NIC, the dispatcher and the kernel steering programs hash
/// with it; a port whose own queues serve (one core, plain `rss`) keeps its NIC's key.
fn run_rss_key(cfg: &RunConfig, symmetric: bool) -> [u8; 40] {
    let bits = DEFAULT_RETA_SIZE.trailing_zeros();
    flowplane_wire::rss::keyed_key(u64::from(cfg.exec.hash_seed), symmetric, bits)
}

/// Runs a prepared input (a fresh table and strategy each time).
pub fn run_prepared(cfg: &RunConfig, spec: &ChainSpec, p: &Prepared, output: Output) -> Result<Report, EngineError> {
    run_prepared_watched(cfg, spec, p, output, Watch::default())
}

/// [`run_prepared`], watched: stopped by the caller's flag, served while it runs (`watch.service`:
/// a [`Live`] made by [`Live::for_replay`] with [`workers`] cores).
pub fn run_prepared_watched(
    cfg: &RunConfig,
    spec: &ChainSpec,
    p: &Prepared,
    output: Output,
    watch: Watch<'_>,
) -> Result<Report, EngineError> {
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
        Steering::with_flow_slots(workers, &p.classifier, &[], flow_slots(strategy.as_ref()))?
            .with_nic_profile(cfg.nic_profile.clone()),
    );
    let nic = Nic { steering, classifier: p.classifier.clone(), strategy, plan: p.plan.clone() };
    run_workers(cfg, spec, chains, Feed::Replay(Arc::clone(&p.trace)), output, Some(nic), watch)
}

/// Logical workers of a run.
pub fn workers(cfg: &RunConfig) -> usize {
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
    run_workers(cfg, spec, chains, Feed::Replay(trace), output, Some(nic), Watch::default())
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
        // A graph's NF by its path (`deny/count`) or a name only one NF has.
        let Some(i) = spec.find_nf(e).map_err(EngineError::Config)? else {
            return Err(EngineError::ExportNotInChain(e.clone()));
        };
        // Refused before any traffic: an NF without exportable state would write an empty file.
        let stage = chains.first().and_then(|c| c.all_stages().get(i).map(|s| s.1));
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
    run_workers(cfg, spec, chains, Feed::Replay(trace), output, nic, Watch::default())
}

/// Frames per worker's dispatcher ring.
const DISPATCH_RING: usize = 4096;

/// Runs `spec` on `live.input`'s queues (one worker per core) until
/// `watch.stop` is raised or `cfg.duration` (plus warm-up) has passed;
/// `watch.tick` is called about once a second on the calling thread (status
/// line). Returns the merged report (its clock names the ports' receive time).
///
/// The strategy (`cfg.scale`) and the chain's placement decide the steering
/// as for a replay ([`placement::plan`]): where the port's own hash is not
/// enough — a spray (`shared`), flow-director rules (nat's replies by port,
/// fw's ICMP errors by quoted flow), per-core parameter shares, a symmetric
/// or address-only hash — a dispatcher core steers by flowplane's table
/// ([`Steer::Dispatcher`]), which also carries out the moves of strategies
/// that rebalance (RSS++'s RETA moves, Dyssect's shard moves and per-flow
/// rules) with their state, and is SCR's sequencer (stamping, histories,
/// spray: [`Dispatcher::with_sequencer`]). On an AF_PACKET input a table
/// (no spray, no sequencer) runs in the kernel instead ([`Steer::Kernel`]:
/// the same classifier, rules and RETA as a fanout program, no dispatcher
/// core); a strategy that moves entries (RSS++, Dyssect) then moves them in
/// the program by the switch-time protocol of [`flowplane_io::steered`]
/// (the control loop's half: `kernel_moves.rs`). Where the program
/// cannot load (built without clang, no CAP_BPF, a verifier that refuses it)
/// the dispatcher steers and the report says why in one line.
pub fn run_port(
    cfg: &RunConfig,
    spec: &ChainSpec,
    symmetric_rss: bool,
    live: &Live,
    watch: Watch<'_>,
) -> Result<Report, EngineError> {
    let Some(input) = live.input.as_ref() else {
        return Err(EngineError::Config("a port run needs an input port".into()));
    };
    let nw = cfg.cores.max(1);
    if cfg.batch_size == 0 || cfg.batch_size > MAX_BATCH {
        return Err(EngineError::Config(format!("batch size {} out of range [1, {MAX_BATCH}]", cfg.batch_size)));
    }
    let chain0 = Chain::build(spec)?;
    let strat = make_strategy(cfg, None)?;
    let plan = placement::plan(&chain0, spec, strat.as_ref(), nw, symmetric_rss)?;
    // SCR's sequencer is the dispatcher core, on one worker too.
    let (delivery, moves) = (strat.delivery(), strat.controller().is_some());
    let steer = if delivery == Delivery::Sequenced
        || nw > 1
            && (delivery.sprays()
                || moves
                || plan.symmetric
                || plan.icmp_inner
                || plan.hash_on != HashOn::FiveTuple
                || !plan.rules.is_empty()
                || plan.overrides.iter().any(|o| !o.is_empty()))
    {
        Steer::Dispatcher
    } else {
        Steer::Port
    };
    // Per-core chains with their port shares; exports checked (and refused) as for a replay.
    let chains = build_chains_planned(cfg, spec, &plan, nw)?;
    let mut notes = plan.notes.clone();
    // The run's table: the same classifier and RETA a replay's emulated NIC steers with.
    let classifier =
        Classifier::new(DEFAULT_RETA_SIZE, plan.symmetric, plan.hash_on, plan.icmp_inner, plan.rules.clone())?
            .with_key(&run_rss_key(cfg, plan.symmetric));
    let steering = Arc::new(Steering::with_flow_slots(nw, &classifier, &[], flow_slots(strat.as_ref()))?);
    // A table on an AF_PACKET input (no spray, no sequencer): the kernel's fanout program steers,
    // no dispatcher core; moves follow the switch-time protocol of flowplane_io::steered.
    let (steer, kernel) = if steer == Steer::Dispatcher && delivery == Delivery::Table && kernel_steerable(live) {
        match kernel_steering(&classifier, &steering, moves, live) {
            Ok(k) => (Steer::Kernel, Some(k)),
            Err(why) => {
                notes.push(format!("kernel steering unavailable, a dispatcher core steers: {why}"));
                (steer, None)
            }
        }
    } else {
        (steer, None)
    };
    let mut port = PortFeed {
        live,
        steer,
        dispatcher: None,
        dispatched: Vec::new(),
        strategy: strat.name().to_string(),
        notes,
        kernel_moves: kernel.as_ref().filter(|_| moves).map(|k| KernelMover::new(Arc::clone(k), &steering)),
        kernel,
    };
    let nic = match steer {
        Steer::Port => None,
        // A static table lives in the program alone; moves need the table (the workers' hand-over).
        Steer::Kernel if !moves => None,
        Steer::Kernel => Some(Nic { steering, classifier, strategy: strat, plan }),
        Steer::Dispatcher => {
            let spread = if delivery.sprays() { DispatchSpread::Spray } else { DispatchSpread::Table };
            // The dispatcher opens every input queue into a pool of its own (an AF_XDP queue's UMEM).
            let mut rxs = Vec::with_capacity(nw);
            for q in 0..input.queues() {
                let mut pool = PacketPool::new(PoolConfig {
                    buffers: cfg.pool_buffers.max(2 * MAX_BATCH),
                    ..PoolConfig::default()
                })?;
                pool.prefault();
                let rx = input.open_rx_into(q, &mut pool).map_err(|e| EngineError::Config(e.to_string()))?;
                rxs.push((rx, pool));
            }
            let (d, srcs) = Dispatcher::new(rxs, classifier.clone(), Arc::clone(&steering), spread, DISPATCH_RING)
                .map_err(|e| EngineError::Config(e.to_string()))?;
            port.dispatcher = Some(if moves { d.with_moves() } else { d });
            port.dispatched = srcs.into_iter().map(Some).collect();
            Some(Nic { steering, classifier, strategy: strat, plan })
        }
    };
    run_workers(cfg, spec, chains, Feed::Port(Box::new(port)), Output::Discard, nic, watch)
}

/// The input port's kind can steer its queues in the kernel (its registry entry says so).
fn kernel_steerable(live: &Live) -> bool {
    flowplane_io::port::PortSpec::parse(&live.source).is_ok_and(|s| s.kind().caps.kernel_steering)
}

/// Loads the kernel steering program with the run's table (the classifier and RETA a
/// dispatcher would use; per-(worker, key) counts when the strategy moves keys) and hands
/// it to the input port, before any of its queues opens.
fn kernel_steering(
    classifier: &Classifier,
    steering: &Steering,
    moves: bool,
    live: &Live,
) -> Result<Arc<KernelSteer>, String> {
    let k = Arc::new(KernelSteer::for_steering(classifier, steering).map_err(|e| e.to_string())?);
    if moves {
        k.start_counting().map_err(|e| e.to_string())?;
    }
    let input = live.input.as_ref().ok_or("no input port")?;
    input.steer_in_kernel(Arc::clone(&k)).map_err(|e| e.to_string())?;
    Ok(k)
}
