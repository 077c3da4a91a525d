//! Long-running runs on real ports: one worker per core polls its RX queue
//! of the input port (the kernel or NIC spreads flows over the queues: AF_PACKET
//! fanout hash, RSS) and transmits on the output ports the verdicts name,
//! until the caller raises `stop` (SIGINT/SIGTERM in the CLI) or the
//! duration ends. While it runs, [`Live`] holds what a status line or a
//! metrics scrape reads: the ports' per-queue counters (atomics the workers
//! write once per burst) and each core's snapshot (packets, busy cycles,
//! tables, NF counters, latency), published about twice a second at a batch
//! boundary. At the end the report is merged as for a replay, exports included.
//!
//! The control loop also polls each port's [`flowplane_io::port::LinkWatch`]
//! every `LINK_CHECK` (200 ms, off the packet path): a link that goes down or up,
//! an interface that vanishes or is re-created is reported at once on stderr
//! (the queues re-attach to a re-created one themselves); a queue that cannot
//! re-attach stops the run with that error.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use flowplane_io::dispatch::{DispatchStats, Dispatcher, Spread};
use flowplane_io::port::fanout_steer::KernelSteer;
use flowplane_io::port::{Port, PortSink, PortSource};
use flowplane_io::steered::{KernelSource, SwitchTimes};
use flowplane_io::{cpu, Source, TxCounters};
use flowplane_nf::NfCounters;
use flowplane_packet::{tsc, PacketPool, PoolConfig, MAX_BATCH};
use flowplane_scale::rss::DEFAULT_RETA_SIZE;
use flowplane_scale::steer::{Classifier, HashOn, Steering};

use crate::chain::Chain;
use crate::coarse::SharedStores;
use crate::error::EngineError;
use crate::exec::{Pipeline, StoreReport};
use crate::hist::Histogram;
use crate::kernel_moves::KernelMover;
use crate::placement;
use crate::report::Report;
use crate::runner::{
    build_chains_planned, collect_exports, control_tick, import_late_mail, join_workers, make_strategy, merge_details,
    ControlLog, RunConfig,
};
use crate::spec::ChainSpec;
use crate::worker::{Control, Step, Worker, WorkerResult};

/// One core's figures at its last publication.
#[derive(Clone, Default)]
pub struct CoreSnap {
    /// Packets received (after warm-up).
    pub packets: u64,
    /// Transmit counters.
    pub tx: TxCounters,
    /// TSC cycles spent on batches.
    pub busy_cycles: u64,
    /// TSC reading at publication.
    pub at_tsc: u64,
    /// Flow-table figures.
    pub store: StoreReport,
    /// Per-NF counters in chain order.
    pub nfs: Vec<(String, NfCounters)>,
    /// Receive-to-transmit cycles per batch.
    pub latency: Option<Histogram>,
}

/// What a running live data plane shows: its ports and cores.
pub struct Live {
    /// The input port.
    pub input: Arc<dyn Port>,
    /// Output ports by verdict.
    pub outputs: Vec<Arc<dyn Port>>,
    /// Per core, the last snapshot.
    pub cores: Vec<Mutex<CoreSnap>>,
    /// Packets whose verdict named no output port.
    pub no_port: Arc<AtomicU64>,
    /// TSC ticks per second.
    pub hz: f64,
    /// The dispatcher's figures while one runs ([`Steer::Dispatcher`]).
    pub dispatch: Mutex<Option<Arc<DispatchStats>>>,
    /// Every worker is built and polls (tables prefaulted, queues open): the data plane is up.
    pub ready: AtomicBool,
}

impl Live {
    /// A view over `input` and `outputs` for `cores` workers.
    pub fn new(input: Arc<dyn Port>, outputs: Vec<Arc<dyn Port>>, cores: usize) -> Live {
        Live {
            input,
            outputs,
            cores: (0..cores).map(|_| Mutex::new(CoreSnap::default())).collect(),
            no_port: Arc::new(AtomicU64::new(0)),
            hz: tsc::hz(),
            dispatch: Mutex::new(None),
            ready: AtomicBool::new(false),
        }
    }

    /// Every core's last snapshot.
    pub fn snapshots(&self) -> Vec<CoreSnap> {
        self.cores.iter().map(|c| c.lock().map(|s| s.clone()).unwrap_or_default()).collect()
    }
}

/// A sink that sends worker `w`'s packets on `ports` by verdict.
pub fn port_sink(ports: &[Arc<dyn Port>], w: usize, no_port: Option<Arc<AtomicU64>>) -> Result<PortSink, EngineError> {
    let mut tx = Vec::with_capacity(ports.len());
    let mut counters = Vec::with_capacity(ports.len());
    for p in ports {
        let q = w % p.queues().max(1);
        tx.push(p.open_tx(q).map_err(|e| EngineError::Config(e.to_string()))?);
        counters.push(Arc::clone(&p.counters()[q]));
    }
    Ok(PortSink::new(tx, counters, no_port.unwrap_or_default()))
}

/// How often a worker publishes its snapshot.
const PUBLISH_EVERY: Duration = Duration::from_millis(500);
/// Steps between two looks at the publication clock (64 naps of an idle worker: ~3 ms).
const PUBLISH_CHECK: u32 = 64;
/// How often the control loop looks at the ports' interfaces.
const LINK_CHECK: Duration = Duration::from_millis(200);

/// Idle polls in a row before a worker naps (an idle port should not burn a shared core).
const IDLE_SPINS: u32 = 2048;

/// How a live run steers packets to its workers (chosen by [`run_live`], reported).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Steer {
    /// The port's own spreading: worker i polls input queue i (the kernel's fanout hash, the device's RSS).
    Port,
    /// A dispatcher core polls every input queue and steers by the run's table ([`flowplane_io::dispatch`]).
    Dispatcher,
    /// The kernel steers by the run's table: an AF_PACKET input's fanout group runs flowplane's
    /// classifier as a program ([`flowplane_io::port::fanout_steer`]); worker i polls queue i.
    /// Moves (RSS++, Dyssect) follow [`flowplane_io::steered`]'s protocol.
    Kernel,
}

impl Steer {
    /// As the report names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Steer::Port => "port",
            Steer::Dispatcher => "dispatcher",
            Steer::Kernel => "kernel",
        }
    }
}

/// Frames per worker's dispatcher ring.
const DISPATCH_RING: usize = 4096;

/// Runs `spec` on `live.input`'s queues (one worker per core) until `stop`
/// is raised or `cfg.duration` (plus warm-up) has passed; `tick` is called
/// about once a second on the calling thread (status line). Returns the
/// merged report (its clock names the ports' receive time).
///
/// The strategy (`cfg.scale`) and the chain's placement decide the steering
/// as for a replay ([`placement::plan`]): where the port's own hash is not
/// enough — a spray (`shared`), flow-director rules (nat's replies by port,
/// fw's ICMP errors by quoted flow), per-core parameter shares, a symmetric
/// or address-only hash — a dispatcher core steers by flowplane's table
/// ([`Steer::Dispatcher`]), which also carries out the moves of strategies
/// that rebalance (RSS++'s RETA moves, Dyssect's shard moves and per-flow
/// rules) with their state. On an AF_PACKET input the table runs in the
/// kernel instead unless the strategy sprays ([`Steer::Kernel`]: the same
/// classifier, rules and RETA as a fanout program, no dispatcher core; moves
/// by the switch-time protocol of [`flowplane_io::steered`]); where the
/// program cannot load (built without clang, no CAP_BPF, a verifier that
/// refuses it) the dispatcher steers and the report says why in one line.
/// SCR (replicated state) is refused on ports in one line.
pub fn run_live(
    cfg: &RunConfig,
    spec: &ChainSpec,
    symmetric_rss: bool,
    live: &Live,
    stop: &AtomicBool,
    tick: &mut dyn FnMut(&Live, Duration),
) -> Result<Report, EngineError> {
    let nw = cfg.cores.max(1);
    if live.input.queues() != nw || live.cores.len() != nw {
        return Err(EngineError::Config(format!("{nw} workers but the input port has {} queues", live.input.queues())));
    }
    if cfg.batch_size == 0 || cfg.batch_size > MAX_BATCH {
        return Err(EngineError::Config(format!("batch size {} out of range [1, {MAX_BATCH}]", cfg.batch_size)));
    }
    let chain0 = Chain::build(spec)?;
    let mut strat = make_strategy(cfg, None)?;
    let why_not = if strat.replicates() {
        Some("its sequencer stamps and replays a history per packet, which the port dispatcher does not do yet")
    } else {
        None
    };
    if let Some(why) = why_not {
        return Err(EngineError::Config(format!(
            "--scale {} on a live port ({}): {why}; rss and shared run on ports",
            strat.name(),
            live.input.name()
        )));
    }
    let plan = placement::plan(&chain0, spec, strat.as_ref(), nw, symmetric_rss)?;
    let needs_table = nw > 1
        && (strat.spray()
            || strat.moves_flows()
            || plan.symmetric
            || plan.icmp_inner
            || plan.hash_on != HashOn::FiveTuple
            || !plan.rules.is_empty()
            || plan.overrides.iter().any(|o| !o.is_empty()));
    // Per-core chains with their port shares; exports checked (and refused) as for a replay.
    let chains = build_chains_planned(cfg, spec, &plan, nw)?;
    let moving = strat.moves_flows();
    // The run's table: the same classifier and RETA a replay's emulated NIC steers with.
    let made = if needs_table {
        let classifier =
            Classifier::new(DEFAULT_RETA_SIZE, plan.symmetric, plan.hash_on, plan.icmp_inner, plan.rules.clone())?;
        let steering = Arc::new(Steering::with_flow_slots(nw, &classifier, &[], strat.flow_slots())?);
        Some((classifier, steering))
    } else {
        None
    };
    let (steer, kernel, kernel_note) = match &made {
        None => (Steer::Port, None, None),
        Some(_) if strat.spray() || !live.input.name().starts_with("afpacket:") => (Steer::Dispatcher, None, None),
        Some((c, st)) => match kernel_steering(c, st, moving, live) {
            Ok(k) => (Steer::Kernel, Some(k), None),
            Err(why) => {
                (Steer::Dispatcher, None, Some(format!("kernel steering unavailable, a dispatcher core steers: {why}")))
            }
        },
    };
    // Kernel-steered moves: the switch times the control loop publishes to the workers' sources.
    let switch = Arc::new(SwitchTimes::default());
    let mut mover = kernel.as_ref().filter(|_| moving).map(|k| KernelMover::new(Arc::clone(k), Arc::clone(&switch)));
    let steering = match (steer, made.as_ref()) {
        (Steer::Dispatcher, Some((c, st))) => {
            Some((c.clone(), Arc::clone(st), if strat.spray() { Spread::Spray } else { Spread::Table }))
        }
        _ => None,
    };
    let shared = match chains.first() {
        Some(c) => SharedStores::new(&c.groups, cfg.exec.flows, cfg.exec.default_idle_timeout_ns)?,
        None => SharedStores::default(),
    };
    let hz = live.hz;
    let warm = cfg.warmup.map_or(0, |w| (w.as_secs_f64() * hz) as u64);
    // Workers hand state over and take it in (moves) behind the dispatcher or under kernel steering.
    let table = if steer == Steer::Dispatcher || mover.is_some() { made.clone() } else { None };
    // The dispatcher opens every input queue into a pool of its own (an AF_XDP queue's UMEM).
    // Dyssect samples heavy flows on the workers for its per-flow rules.
    let stride = strat.sample_stride();
    let (dispatcher, mut dispatched) = match steering {
        Some((classifier, steering, spread)) => {
            let mut rxs = Vec::with_capacity(nw);
            for q in 0..live.input.queues() {
                let mut pool = PacketPool::new(PoolConfig {
                    buffers: cfg.pool_buffers.max(2 * MAX_BATCH),
                    ..PoolConfig::default()
                })?;
                pool.prefault();
                let rx = live.input.open_rx_into(q, &mut pool).map_err(|e| EngineError::Config(e.to_string()))?;
                rxs.push((rx, pool));
            }
            let (d, srcs) = Dispatcher::new(rxs, classifier, steering, spread, DISPATCH_RING)
                .map_err(|e| EngineError::Config(e.to_string()))?;
            (Some(if moving { d.with_moves() } else { d }), srcs.into_iter().map(Some).collect())
        }
        None => (None, Vec::new()),
    };
    let dispatch_stats = dispatcher.as_ref().map(Dispatcher::stats);
    if let Ok(mut d) = live.dispatch.lock() {
        *d = dispatch_stats.clone();
    }
    let barrier = Barrier::new(nw + 1);
    let mut log = ControlLog::default();
    let halt = AtomicBool::new(false);
    // Workers behind the dispatcher end when it has stopped and their ring is empty, never on `halt`.
    let never = AtomicBool::new(false);
    let stop_dispatch = AtomicBool::new(false);
    let wall = Instant::now();
    type Done = Result<(WorkerResult, Pipeline), EngineError>;
    let (results, link_failure): (Vec<Done>, Option<String>) = std::thread::scope(|s| {
        let handles: Vec<_> = chains
            .into_iter()
            .enumerate()
            .map(|(w, chain)| {
                let (shared, barrier, table, switch) = (&shared, &barrier, &table, &switch);
                let kernel_moves = mover.is_some();
                let fed = dispatched.get_mut(w).and_then(Option::take);
                let halt = if fed.is_some() { &never } else { &halt };
                std::thread::Builder::new()
                    .name(format!("fp-live-{w}"))
                    .spawn_scoped(s, move || -> Done {
                        if cfg.pin {
                            cpu::pin_current_thread(w);
                        }
                        let build = || -> Result<Worker<'_>, EngineError> {
                            let mut pool = PacketPool::new(PoolConfig {
                                buffers: cfg.pool_buffers.max(2 * MAX_BATCH),
                                ..PoolConfig::default()
                            })?;
                            // The queue opens first: what arrives while the tables fault in waits in its ring.
                            let source: Box<dyn Source> = match fed {
                                Some(src) => Box::new(src),
                                None => {
                                    let rx = live
                                        .input
                                        .open_rx_into(w, &mut pool)
                                        .map_err(|e| EngineError::Config(e.to_string()))?;
                                    let counters = Arc::clone(&live.input.counters()[w]);
                                    match table.as_ref().filter(|_| kernel_moves) {
                                        Some((c, st)) => Box::new(KernelSource::new(
                                            rx,
                                            counters,
                                            w as u16,
                                            Arc::clone(st),
                                            c.clone(),
                                            Arc::clone(switch),
                                            KERNEL_DRAIN.as_nanos() as u64,
                                        )),
                                        None => Box::new(PortSource::new(rx, counters)),
                                    }
                                }
                            };
                            let mut exec = Pipeline::new(chain, cfg.exec, shared.clone())?;
                            // A page fault on the packet path is a stall that overflows the port's ring.
                            exec.prefault();
                            pool.prefault();
                            let sink = port_sink(&live.outputs, w, Some(Arc::clone(&live.no_port)))?;
                            // Behind the dispatcher a worker hands state over and takes it in (moves).
                            let ctl = table.as_ref().map(|(c, st)| Control::new(st, c).with_sampling(stride));
                            Ok(Worker::new(w, pool, source, exec, Box::new(sink), cfg.batch_size, 0, ctl))
                        };
                        let built = build();
                        barrier.wait();
                        let mut wk = built?;
                        let t0 = tsc::rdtsc();
                        wk.start(t0, t0 + warm);
                        let every = (PUBLISH_EVERY.as_secs_f64() * hz) as u64;
                        let mut last = t0;
                        let mut idle = 0u32;
                        let mut steps = 0u32;
                        loop {
                            match wk.step(halt) {
                                Step::Busy => idle = 0,
                                Step::Idle => {
                                    idle += 1;
                                    if idle >= IDLE_SPINS {
                                        std::thread::sleep(Duration::from_micros(50));
                                    } else {
                                        std::hint::spin_loop();
                                    }
                                }
                                Step::Done => break,
                            }
                            // The clock is read every PUBLISH_CHECK steps, not per batch.
                            steps = steps.wrapping_add(1);
                            if steps.is_multiple_of(PUBLISH_CHECK) {
                                let now = tsc::rdtsc();
                                if now.wrapping_sub(last) >= every {
                                    last = now;
                                    publish(&live.cores[w], &wk, now);
                                }
                            }
                        }
                        publish(&live.cores[w], &wk, tsc::rdtsc());
                        Ok(wk.finish())
                    })
                    .map_err(EngineError::Thread)
            })
            .collect();
        // Every worker is built (or failed) before the clock starts, and before the dispatcher
        // hands anything over (until then the input's packets wait in the port's rings).
        barrier.wait();
        let dispatcher_thread = dispatcher.map(|d| {
            let stop_dispatch = &stop_dispatch;
            std::thread::Builder::new()
                .name("fp-dispatch".into())
                .spawn_scoped(s, move || d.run(stop_dispatch))
                .map_err(EngineError::Thread)
        });
        live.ready.store(true, Ordering::Relaxed);
        let deadline = cfg.duration.map(|d| Instant::now() + d + cfg.warmup.unwrap_or_default());
        let start = Instant::now();
        let mut next = start + Duration::from_secs(1);
        let mut next_link = start + LINK_CHECK;
        let mut link_failure = None;
        // The strategy's control loop (RSS++: RETA moves from the dispatcher's per-key counts).
        let period = strat.period();
        let mut next_ctl = start + period;
        while !stop.load(Ordering::Relaxed)
            && deadline.is_none_or(|d| Instant::now() < d)
            && handles.iter().any(|h| h.as_ref().is_ok_and(|h| !h.is_finished()))
        {
            std::thread::sleep(Duration::from_millis(20));
            if Instant::now() >= next_link {
                next_link += LINK_CHECK;
                link_failure = check_links(live);
                if link_failure.is_some() {
                    break;
                }
            }
            if Instant::now() >= next {
                next += Duration::from_secs(1);
                tick(live, start.elapsed());
            }
            if let (true, Some((_, st))) = (moving, table.as_ref()) {
                if Instant::now() >= next_ctl {
                    next_ctl += period;
                    if let Some(m) = mover.as_mut() {
                        m.publish(st);
                    }
                    control_tick(st, strat.as_mut(), &mut log);
                    // The period's changes go to the table (a port's dispatcher applies them at once).
                    st.pump(Instant::now());
                }
                // Kernel steering: landed changes into the program, finished moves retired.
                if let Some(m) = mover.as_mut() {
                    if let Err(e) = m.apply(st) {
                        link_failure = Some(e);
                        break;
                    }
                }
            }
        }
        // The dispatcher stops first: its workers then take what it handed them and end.
        stop_dispatch.store(true, Ordering::Relaxed);
        let dispatch_failed = match dispatcher_thread {
            Some(Ok(h)) => h.join().is_err(),
            Some(Err(e)) => {
                eprintln!("flowplane: {e}");
                true
            }
            None => false,
        };
        halt.store(true, Ordering::Relaxed);
        if dispatch_failed {
            never.store(true, Ordering::Relaxed);
        }
        (join_workers(handles), link_failure)
    });
    if let Some(why) = link_failure {
        return Err(EngineError::Config(why));
    }
    let elapsed = wall.elapsed();
    let mut pairs = Vec::with_capacity(nw);
    for r in results {
        pairs.push(r?);
    }
    let (mut workers, mut pipelines): (Vec<WorkerResult>, Vec<Pipeline>) = pairs.into_iter().unzip();
    if let Some((_, st)) = &table {
        import_late_mail(st, &mut pipelines, &mut workers);
    }
    let details = merge_details(&workers, &pipelines);
    let mut report = Report::from_workers(spec, cfg, &workers, details, elapsed, hz);
    report.clock = format!("port receive time ({})", live.input.name());
    // On a port the run's span is mostly waiting for packets: the cost per
    // packet is the workers' busy cycles (receive to transmit) per packet.
    let busy: u64 = workers.iter().map(|w| w.busy_cycles).sum();
    report.cycles_per_packet = if report.packets > 0 { busy as f64 / report.packets as f64 } else { 0.0 };
    report.exports = collect_exports(cfg, &pipelines, None, None, &report);
    let mut sr = steer_report(steer, strat.name(), &plan, dispatch_stats.as_deref(), hz);
    sr.notes.extend(kernel_note);
    if let Some(k) = &kernel {
        let s = k.stats();
        sr.kernel_steered = s.reta + s.fdir + s.flow + s.unclassified;
        sr.unclassified = s.unclassified;
    }
    // Every move started is done or still under way (Dyssect starts its own, outside the log's count).
    sr.moves_done = table.as_ref().map_or(0, |(_, st)| st.moves_done());
    sr.moves_started = sr.moves_done + table.as_ref().map_or(0, |(_, st)| st.active_moves() as u64);
    sr.stalls = workers.iter().map(|w| w.rx.stalls).sum();
    sr.controller = if moving { strat.report_json() } else { None };
    report.steering = Some(sr);
    Ok(report)
}

/// Longest a frame steered before a move can sit unseen in its old owner's ring: the
/// ring's block timeout (1 ms by default), its timer's jiffies, and a margin.
const KERNEL_DRAIN: Duration = Duration::from_millis(25);

/// Loads the kernel steering program with the run's table (the classifier and RETA a
/// dispatcher would use; per-(worker, key) counts when the strategy moves keys) and hands
/// it to the input port, before any of its queues opens.
fn kernel_steering(c: &Classifier, st: &Steering, moving: bool, live: &Live) -> Result<Arc<KernelSteer>, String> {
    let k = Arc::new(KernelSteer::for_steering(c, st).map_err(|e| e.to_string())?);
    if moving {
        k.start_counting().map_err(|e| e.to_string())?;
    }
    live.input.steer_in_kernel(Arc::clone(&k)).map_err(|e| e.to_string())?;
    Ok(k)
}

/// The report's account of a live run's steering.
fn steer_report(
    steer: Steer,
    strategy: &str,
    plan: &placement::Plan,
    d: Option<&DispatchStats>,
    hz: f64,
) -> crate::report::SteerReport {
    let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let packets = d.map_or(0, |d| l(&d.packets));
    let busy = d.map_or(0, |d| l(&d.busy_cycles));
    crate::report::SteerReport {
        by: steer.as_str().to_string(),
        strategy: strategy.to_string(),
        notes: plan.notes.clone(),
        dispatched: packets,
        dispatch_cycles_per_packet: if packets > 0 { busy as f64 / packets as f64 } else { 0.0 },
        dispatch_busy_s: busy as f64 / hz,
        dispatch_ring_full: d.map_or(0, |d| d.ring_full.iter().map(l).sum()),
        unclassified: d.map_or(0, |d| l(&d.unclassified)),
        oversize: d.map_or(0, |d| l(&d.oversize)),
        ..Default::default()
    }
}

/// Polls every port's interface: each change is one line on stderr; a queue that
/// could not re-attach to a re-created interface is the run's end (its error).
fn check_links(live: &Live) -> Option<String> {
    for p in std::iter::once(&live.input).chain(&live.outputs) {
        let Some(w) = p.link() else { continue };
        if let Some(line) = w.poll() {
            eprintln!("flowplane: {line}");
        }
        if let Some(why) = w.failure() {
            return Some(why);
        }
    }
    None
}

/// Publishes worker `wk`'s figures (a lock and a few small allocations, twice a second).
fn publish(cell: &Mutex<CoreSnap>, wk: &Worker<'_>, now: u64) {
    let r = wk.result();
    let p = wk.pipeline();
    let snap = CoreSnap {
        packets: r.packets,
        tx: r.tx,
        busy_cycles: r.busy_cycles,
        at_tsc: now,
        store: p.store_report(),
        nfs: p.nf_results().into_iter().map(|(n, c, _)| (n, c)).collect(),
        latency: Some(r.batch_latency.clone()),
    };
    if let Ok(mut c) = cell.lock() {
        *c = snap;
    }
}
