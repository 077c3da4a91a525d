//! The one runtime every run goes through, replayed or live: it builds the
//! worker set (one worker per chain, each on its thread with its pool,
//! source, executor and sink), starts them together, and runs one control
//! loop on the calling thread — the strategy's period (RSS++ and Dyssect
//! moves), the NIC's pending updates, the deadline, the caller's stop flag
//! (signals) and status tick, the ports' links. What feeds the workers is a
//! `Feed`: a loaded trace through the emulated NIC, or a live port's
//! queues (directly, through a dispatcher core that steers by flowplane's
//! table, or as the kernel's steering program puts them — whose moves the
//! control loop writes into the program: `kernel_moves.rs`). At the end it
//! merges the workers' results into the report, exports included. The
//! entry points that prepare a run (load a trace, open a port, plan the
//! steering) are in [`crate::runner`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flowplane_io::dispatch::{DispatchedSource, Dispatcher};
use flowplane_io::nic::{NicConfig, NicQueue};
use flowplane_io::port::PortSource;
use flowplane_io::replay::{ReplayConfig, ReplayQueue, ReplayTrace};
use flowplane_io::sink::{Discard, PcapSink, Stamp};
use flowplane_io::steered::{KernelSource, SwitchTimes};
use flowplane_io::{cpu, Sink, Source};
use flowplane_nf::Export;
use flowplane_packet::{tsc, PacketPool, PoolConfig, MAX_BATCH};
use flowplane_scale::steer::{Classifier, Steering};
use flowplane_scale::strategy::{imbalance, Controller, Delivery, LoadSample, DEFAULT_PERIOD};

use crate::chain::Chain;
use crate::coarse::SharedStores;
use crate::error::EngineError;
use crate::exec::{ExecConfig, Pipeline};
use crate::kernel_moves::{KernelMover, KERNEL_DRAIN};
use crate::live::{Live, Steer};
use crate::report::{Report, ScaleReport};
use crate::runner::{workers, Nic, Output, RunConfig};
use crate::spec::ChainSpec;
use crate::worker::{Control, Step, Worker, WorkerResult};

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

/// Where the workers' packets come from.
pub(crate) enum Feed<'a> {
    /// A loaded trace: per worker a queue of the emulated NIC (a steered
    /// trace, `nic` given) or its own part of a trace split at load.
    Replay(Arc<ReplayTrace>),
    /// A live input port: per worker its queue of the port, or the ring a
    /// dispatcher core fills ([`Steer::Dispatcher`]).
    Port(Box<PortFeed<'a>>),
}

/// A live port's side of a run.
pub(crate) struct PortFeed<'a> {
    /// The ports and what the run publishes while it goes on.
    pub(crate) live: &'a Live,
    /// How packets reach the workers.
    pub(crate) steer: Steer,
    /// The dispatcher core (with [`Steer::Dispatcher`]).
    pub(crate) dispatcher: Option<Dispatcher>,
    /// Per worker, its ring from the dispatcher.
    pub(crate) dispatched: Vec<Option<DispatchedSource>>,
    /// The strategy's name and the placement's notes (the report's steering section).
    pub(crate) strategy: String,
    pub(crate) notes: Vec<String>,
    /// The kernel's steering program (with [`Steer::Kernel`]), for its figures.
    pub(crate) kernel: Option<Arc<flowplane_io::port::fanout_steer::KernelSteer>>,
    /// Moves under kernel steering (a strategy with a controller on [`Steer::Kernel`]):
    /// the control loop's half of [`flowplane_io::steered`]'s protocol.
    pub(crate) kernel_moves: Option<KernelMover>,
}

/// What the caller sees and controls while a run goes on.
#[derive(Default)]
pub struct Watch<'a> {
    /// Raised by the caller (SIGINT/SIGTERM): the run ends as at its deadline.
    pub stop: Option<&'a AtomicBool>,
    /// Called about once a second on the calling thread (the status line).
    pub tick: Option<StatusTick<'a>>,
    /// A replay served while it runs (`--ctl`, `--metrics`): its workers publish
    /// their snapshots here and serve its mailboxes, as a live run's do.
    pub service: Option<&'a Live>,
}

/// The caller's status tick: the ports and cores, and the time since the run started.
pub type StatusTick<'a> = &'a mut dyn FnMut(&Live, Duration);

/// How often a live worker publishes its snapshot.
const PUBLISH_EVERY: Duration = Duration::from_millis(500);
/// Steps between two looks at the publication clock (64 naps of an idle worker: ~3 ms).
const PUBLISH_CHECK: u32 = 64;
/// How often the control loop looks at the ports' interfaces.
const LINK_CHECK: Duration = Duration::from_millis(200);
/// The longest the control loop sleeps while a caller's stop flag (a signal) may rise.
const STOP_POLL: Duration = Duration::from_millis(20);
/// The longest it sleeps while a kernel-steered move is under way (retired once its state is in).
const MOVE_POLL: Duration = Duration::from_millis(1);

/// The one runtime: builds one worker per chain on its thread (real
/// workers one per thread, or logical workers taking turns on `cfg.cores`
/// threads), whatever feeds them — a replayed trace through the emulated
/// NIC, a live port's queues, a dispatcher core — and runs one control
/// loop over them: the strategy's period (RSS++ and Dyssect moves), the
/// NIC's pending updates, the deadline, the caller's stop flag and status
/// tick, and the ports' links. At the end it merges the workers' results
/// into the report, exports included.
pub(crate) fn run_workers(
    cfg: &RunConfig,
    spec: &ChainSpec,
    chains: Vec<Chain>,
    mut feed: Feed<'_>,
    output: Output,
    mut nic: Option<Nic>,
    watch: Watch<'_>,
) -> Result<Report, EngineError> {
    let nw = match &feed {
        Feed::Replay(_) => workers(cfg),
        Feed::Port(_) => cfg.cores.max(1),
    };
    if chains.len() != nw {
        return Err(EngineError::Config(format!("{nw} workers but {} chains", chains.len())));
    }
    match &feed {
        Feed::Replay(trace) => {
            if nic.is_none() && trace.queues() != nw {
                return Err(EngineError::Config(format!("{nw} workers but the trace has {} queues", trace.queues())));
            }
            if nic.as_ref().is_some_and(|n| n.steering.queues() != nw || !trace.is_steered()) {
                return Err(EngineError::Config(format!(
                    "{nw} workers but the steering table has {} queues",
                    nic.as_ref().map_or(0, |n| n.steering.queues())
                )));
            }
        }
        Feed::Port(p) => {
            let queues = p.live.input.as_ref().map_or(0, |i| i.queues());
            if queues != nw || p.live.cores.len() != nw {
                return Err(EngineError::Config(format!("{nw} workers but the input port has {queues} queues")));
            }
        }
    }
    if let (Feed::Replay(_), Some(l)) = (&feed, watch.service) {
        if l.cores.len() != nw {
            return Err(EngineError::Config(format!("{nw} workers but the service has {} cores", l.cores.len())));
        }
    }
    let (trace, port) = match &mut feed {
        Feed::Replay(t) => (Some(Arc::clone(t)), None),
        Feed::Port(p) => (None, Some(&mut **p)),
    };
    let threads = if port.is_some() { nw } else { cfg.cores.min(nw).max(1) };
    // Coarse state is shared by every core: one table per coarse group, created once.
    let shared = match chains.first() {
        Some(c) => {
            let s = SharedStores::for_chain(c, cfg.exec.flows, cfg.exec.default_idle_timeout_ns)?;
            if trace.is_some() {
                s.for_replay()
            } else {
                s
            }
        }
        None => SharedStores::default(),
    };
    let hz = tsc::hz();
    let epoch_ns =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let start_tsc = tsc::rdtsc();
    let measure_from = start_tsc + cfg.warmup.map_or(0, |w| (w.as_secs_f64() * hz) as u64);
    let wall = Instant::now();
    let (nic_parts, mut strategy) = match nic.take() {
        Some(Nic { steering, classifier, strategy, plan }) => (Some((steering, classifier, plan)), Some(strategy)),
        None => (None, None),
    };
    let delivery = strategy.as_ref().map_or(Delivery::Table, |s| s.delivery());
    let spray = delivery.sprays();
    let controller = strategy.as_ref().and_then(|s| s.controller());
    // Every SCR replica holds every flow's state: each core would report every flow.
    if delivery == Delivery::Sequenced && cfg.ipfix.is_some() {
        return Err(EngineError::Unsupported(
            "--ipfix with --scale scr: every replica holds every flow, so each core would report each flow; use rss or shared"
                .into(),
        ));
    }
    // Packet time 0 is the trace's first packet (a replay) or the run's start.
    let exporter = match &cfg.ipfix {
        Some(c) => Some(crate::ipfix::Exporter::start(c, trace.as_ref().map_or(epoch_ns, |t| t.base_ns()))?),
        None => None,
    };
    // A standby imports a flow into the core of the sender that held it: flows must stay on their core.
    if cfg.repl.is_some() {
        if delivery != Delivery::Table || controller.is_some() {
            return Err(EngineError::Unsupported(format!(
                "--replicate with --scale {}: flows must stay on the core that holds them (a standby imports into the sender's core); use rss",
                cfg.scale
            )));
        }
        if let Some(c) = chains.first() {
            crate::exec::repl::repl_check(c).map_err(EngineError::Unsupported)?;
        }
    }
    let replicator = match &cfg.repl {
        Some(c) => Some(crate::repl::Replicator::start(c, nw)?),
        None => None,
    };
    let scr = match (delivery == Delivery::Sequenced, chains.first(), &trace) {
        (true, Some(c), Some(t)) => Some(crate::scr::ScrRun::new(&cfg.scr, nw, threads, cfg.loops, t, c)?),
        // A port: the dispatcher core stamps packets as they arrive.
        (true, Some(c), None) => Some(crate::scr::ScrRun::streaming(&cfg.scr, nw, threads, cfg.exec.flows, c)?),
        _ => None,
    };
    let scr = scr.as_ref();
    let counts = controller.is_some_and(|c| c.counts_loads());
    // SCR bounds the drift between cores itself (a replica waits before its log would overwrite).
    // Projected runs are held within a bounded distance: logical workers taking turns process a
    // burst each per turn, so free-running queues would each walk their own span of the
    // stream and every strategy would look balanced (packets / busiest worker).
    let bounded = controller.is_some() || (cfg.virtual_cores.is_some_and(|v| v > threads) && nic_parts.is_some());
    let stride = controller.map_or(0, |c| c.sample_stride());
    let steering = nic_parts.as_ref().map(|n| &*n.0);
    let classifier = nic_parts.as_ref().map(|n| &n.1);
    // A port's workers read its queues; a served replay's only publish and take requests.
    let port_live = port.as_ref().map(|p| p.live);
    let live = port_live.or(watch.service);
    if let (Some(Ok(mut m)), Some(r)) = (live.map(|l| l.repl.lock()), &replicator) {
        *m = Some(r.stats());
    }
    let (dispatcher, mut dispatched, mut mover) = match port {
        Some(p) => (p.dispatcher.take(), std::mem::take(&mut p.dispatched), p.kernel_moves.take()),
        None => (None, Vec::new(), None),
    };
    // Kernel-steered moves: each worker's source reads the switch times the control loop publishes.
    let switch = mover.as_ref().map(KernelMover::switch_times);
    // SCR on a port: the dispatcher core is the sequencer (stamps, histories, spray).
    let dispatcher = match (dispatcher, scr) {
        (Some(d), Some(r)) => Some(
            d.with_sequencer(Arc::clone(&r.seq), dispatched.iter_mut().flatten())
                .map_err(|e| EngineError::Config(e.to_string()))?,
        ),
        (d, _) => d,
    };
    let dispatch_stats = dispatcher.as_ref().map(Dispatcher::stats);
    if let Some(Ok(mut d)) = live.map(|l| l.dispatch.lock()) {
        *d = dispatch_stats.clone();
    }
    // Per thread: its workers' chains (and dispatcher rings), in worker order.
    type Mine = Vec<(usize, Chain, Option<DispatchedSource>)>;
    let mut per_thread: Vec<Mine> = (0..threads).map(|_| Vec::new()).collect();
    for (w, chain) in chains.into_iter().enumerate() {
        per_thread[w % threads].push((w, chain, dispatched.get_mut(w).and_then(Option::take)));
    }
    let mut log = ControlLog::default();
    // Every worker is built (tables allocated, queues open) before the traffic starts.
    let barrier = std::sync::Barrier::new(threads);
    let go = AtomicU64::new(0);
    let warm = cfg.warmup.map_or(0, |w| (w.as_secs_f64() * hz) as u64);
    // Workers end on `halt`; those behind the dispatcher end when it has stopped and their ring is empty,
    // never on `halt` (`never` rises only if the dispatcher failed).
    let halt = AtomicBool::new(false);
    let never = AtomicBool::new(false);
    let stop_dispatch = AtomicBool::new(false);
    type Done = Result<Vec<(WorkerResult, Pipeline, Option<Box<crate::scr::ScrReplica>>)>, EngineError>;
    // Workers wake the coordinating thread when they end, so it can sleep until its next control tick (or the
    // deadline) instead of polling: on a machine with as many CPUs as workers, every wake-up preempts one.
    let coordinator = std::thread::current();
    let (results, link_failure): (Vec<Done>, Option<String>) = std::thread::scope(|s| {
        let handles: Vec<_> = per_thread
            .into_iter()
            .enumerate()
            .map(|(t, mine)| {
                let trace = trace.clone();
                let output = output.clone();
                let (shared, barrier, go) = (&shared, &barrier, &go);
                let exporter = exporter.as_ref();
                let replicator = replicator.as_ref();
                let halt = if mine.iter().any(|m| m.2.is_some()) { &never } else { &halt };
                let steering_arc = nic_parts.as_ref().map(|n| Arc::clone(&n.0));
                let kernel = switch.as_ref().zip(nic_parts.as_ref()).map(|(sw, n)| (Arc::clone(sw), n.1.clone()));
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
                            for (w, chain, fed) in mine {
                                let mut pool = PacketPool::new(PoolConfig {
                                    buffers: cfg.pool_buffers.max(2 * MAX_BATCH),
                                    // In memory, no port registers the region: spread the buffers over the L1's sets.
                                    buf_size: if port_live.is_some() {
                                        PoolConfig::default().buf_size
                                    } else {
                                        flowplane_packet::SPREAD_BUF_SIZE
                                    },
                                    ..PoolConfig::default()
                                })?;
                                let replica = scr
                                    .map(|r| {
                                        crate::scr::ScrReplica::new(
                                            w,
                                            &chain,
                                            cfg.exec.flows.min(r.keys.saturating_mul(2).max(1024)),
                                            cfg.exec.default_idle_timeout_ns,
                                            Arc::clone(&r.seq),
                                            r.logs.clone(),
                                            r.end,
                                        )
                                        // Every replica keys its tables with the run's secret (they must agree).
                                        .map(|r| r.with_secret(cfg.exec.hash_seed))
                                        .map_err(|source| EngineError::Table { what: "scr replica table", source })
                                    })
                                    .transpose()?;
                                // A port's queue opens first: what arrives while the tables fault in waits in its ring.
                                let feed = Fed { dispatched: fed, kernel: kernel.clone() };
                                let source = source(cfg, w, &trace, port_live, feed, &mut pool, &steering_arc, scr, {
                                    NicConfig {
                                        loops: cfg.loops,
                                        rate_pps: cfg.rate_pps,
                                        tsc_hz: hz,
                                        start_tsc,
                                        ring: cfg.ring,
                                        spray,
                                        count_loads: counts,
                                        bounded_drift: bounded,
                                    }
                                })?;
                                // Under scr the chain's state lives in the replica: the executor's tables stay small.
                                let ecfg =
                                    if scr.is_some() { ExecConfig { flows: 1024, ..cfg.exec } } else { cfg.exec };
                                let mut exec = Pipeline::new(chain, ecfg, shared.clone())?;
                                if let (Some(e), Some(c)) = (exporter, &cfg.ipfix) {
                                    if exec.attach_ipfix(&mut || e.queue(w as u32), c.active_ns) == 0 {
                                        return Err(EngineError::Config(
                                            "--ipfix: no NF of the chain exports IPFIX records (fsc, hh, lb, conntrack, fw, nat, upf)".into(),
                                        ));
                                    }
                                }
                                if let Some(r) = replicator {
                                    exec.attach_repl(&mut |stage| r.queue(stage, w));
                                }
                                if cfg.rate_pps.is_some() || port_live.is_some() {
                                    // Paced or live: a page fault on the packet path is a stall that loses packets.
                                    exec.prefault();
                                    pool.prefault();
                                }
                                let stamp = if cfg.restamp {
                                    Stamp::Transmit { tsc0: start_tsc, epoch_ns, tsc_hz: hz }
                                } else {
                                    Stamp::Packet { base_ns: trace.as_ref().map_or(0, |t| t.base_ns()) }
                                };
                                let sink: Box<dyn Sink> = match (&output, port_live) {
                                    (_, Some(l)) => {
                                        Box::new(crate::live::port_sink(&l.outputs, w, Some(Arc::clone(&l.no_port)))?)
                                    }
                                    (Output::Discard, None) => Box::new(Discard),
                                    (Output::Pcap(wr), None) => Box::new(PcapSink::new(wr.clone(), stamp)),
                                    (Output::Pcaps(ws), None) => Box::new(PcapSink::by_verdict(ws.clone(), stamp)),
                                    (Output::Ports(ports), None) => Box::new(crate::live::port_sink(ports, w, None)?),
                                };
                                // Behind a steering table a worker hands state over and takes it in (moves).
                                let ctl = match (steering, classifier) {
                                    (Some(st), Some(c)) => Some(Control::new(st, c).with_sampling(stride)),
                                    _ => None,
                                };
                                let mut wk =
                                    Worker::new(w, pool, source, exec, sink, cfg.batch_size, measure_from, ctl);
                                wk.set_priority(cfg.priority.as_ref().map(|p| p.1));
                                if let Some(r) = replicator {
                                    wk.set_repl(r.link(w));
                                }
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
                        match live {
                            Some(l) => serve(&mut ws, halt, l, hz),
                            None if ws.len() == 1 => ws[0].run(halt),
                            None => take_turns(&mut ws, halt),
                        }
                        // Exports wait for every worker (shared state is still changing).
                        Ok(ws.into_iter().map(Worker::finish_with_replica).collect())
                    })
                    .map_err(EngineError::Thread)
            })
            .collect();
        let running = || handles.iter().any(|h| h.as_ref().is_ok_and(|h| !h.is_finished()));
        // The run's clock starts when every worker is ready.
        while go.load(Ordering::SeqCst) == 0 && running() {
            std::thread::sleep(Duration::from_micros(200));
        }
        // The dispatcher hands packets over once every worker polls (until then they wait in the port's rings).
        let dispatcher_thread = dispatcher.map(|d| {
            let stop_dispatch = &stop_dispatch;
            std::thread::Builder::new()
                .name("fp-dispatch".into())
                .spawn_scoped(s, move || d.run(stop_dispatch))
                .map_err(EngineError::Thread)
        });
        if let Some(l) = live {
            l.ready.store(true, Ordering::Relaxed);
        }
        let controller = strategy.as_deref_mut().and_then(|s| s.controller_mut());
        let link_failure = control_loop(cfg, &running, steering, controller, mover.as_mut(), &mut log, live, watch);
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
    // Every worker has stopped: the state is final. Each NF is told the run's
    // end (its last packet time across cores), so its report and export judge
    // at the same time on one core or several; then each NF's per-core
    // reports merge into one with its hook; exports read the final state.
    for (w, p) in workers.iter_mut().zip(pipelines.iter_mut()) {
        if p.end_of_run().is_some() {
            w.nfs = p.nf_results();
        }
    }
    // The flows still live at the run's end are exported (forced end); the queues may now wait for room.
    let ipfix = exporter.inspect(|e| {
        e.workers_stopped();
        for (i, p) in pipelines.iter_mut().enumerate() {
            p.ipfix_flush(i == 0);
        }
    });
    let details = merge_details(&workers, &pipelines);
    let mut report = Report::from_workers(spec, cfg, &workers, details, elapsed, hz);
    report.ipfix = ipfix.map(crate::ipfix::Exporter::finish);
    report.replication = replicator.map(crate::repl::Replicator::finish);
    if let Feed::Port(p) = &feed {
        report.clock = format!("port receive time ({})", p.live.source);
        // On a port the run's span is mostly waiting for packets: the cost per
        // packet is the workers' busy cycles (receive to transmit) per packet.
        let busy: u64 = workers.iter().map(|w| w.busy_cycles).sum();
        report.cycles_per_packet = if report.packets > 0 { busy as f64 / report.packets as f64 } else { 0.0 };
        let mut sr = crate::live::steer_report(p.steer, &p.strategy, &p.notes, dispatch_stats.as_deref(), hz);
        // Every move started is done or still under way (Dyssect starts its own, outside the log's count).
        let st = nic_parts.as_ref().map(|n| &n.0);
        sr.moves_done = st.map_or(0, |st| st.moves_done());
        sr.moves_started = sr.moves_done + st.map_or(0, |st| st.active_moves() as u64);
        sr.stalls = workers.iter().map(|w| w.rx.stalls).sum();
        sr.controller = strategy.as_ref().and_then(|s| s.controller()).and_then(|c| c.report_json());
        sr.priority =
            cfg.priority.as_ref().map(|(name, _)| crate::report::PriorityReport::new(name, cfg.slo_us, &workers, hz));
        if let Some(k) = &p.kernel {
            let s = k.stats();
            sr.kernel_steered = s.reta + s.fdir + s.flow + s.unclassified + s.frag;
            sr.unclassified = s.unclassified;
        }
        report.steering = Some(sr);
    } else if let (Some((st, _, plan)), Some(strat)) = (&nic_parts, &strategy) {
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
            if strat.controller().is_some() || !st.nic_profile().is_ideal() {
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
        let sr = crate::scr::ScrReport::new(r.seq.history(), r.fields, cfg.scr.recovery, cfg.scr.loss, cores);
        // The run's tables are the replicas' (the executors' stay empty): every replica holds the same keys, so
        // one replica's counters are the run's; a packet refused for want of room counts on the core that owned it.
        if let Some(c) = sr.cores.first() {
            let t = &mut report.tables;
            (t.entries, t.insertions, t.expiries) = (c.entries, c.insertions, c.expiries);
            t.table_full = sr.cores.iter().map(|c| c.table_full).sum();
        }
        report.scr = Some(sr);
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
    // fingerprints) are named from the input, read again once for an export (a replay's; a port keeps no input).
    let keys = match &trace {
        Some(t) if !cfg.export.is_empty() && spray => Some(ExportKeys::of(t)),
        _ => None,
    };
    // Under scr the state is the replicas' (the pipelines' tables stay empty): export core 0's, which every
    // replica equals when the digests agree.
    // A port keeps no input: its replicas' keys are named from the records alone (IPv4; no IPv6 fold is known).
    let no_keys = ExportKeys::default();
    let scr_state = replicas.first().map(|r| (&**r, keys.as_ref().unwrap_or(&no_keys)));
    report.exports = collect_exports(cfg, &pipelines, scr_state, keys.as_ref(), &report);
    report.trust = crate::trust::Trust::of_report(&report);
    Ok(report)
}

/// How a live worker's packets reach it besides its own queue of the port.
struct Fed {
    /// Its ring from the dispatcher core.
    dispatched: Option<DispatchedSource>,
    /// Under kernel-steered moves: the switch times and the run's classifier.
    kernel: Option<(Arc<SwitchTimes>, Classifier)>,
}

/// Worker `w`'s source: its queue of the emulated NIC (with the SCR
/// sequencer's side data), its part of a split trace, its ring from the
/// dispatcher, or its queue of the live input port (opened into `pool`;
/// under kernel-steered moves, behind [`KernelSource`]'s protocol).
#[allow(clippy::too_many_arguments)]
fn source<'a>(
    cfg: &RunConfig,
    w: usize,
    trace: &Option<Arc<ReplayTrace>>,
    live: Option<&Live>,
    fed: Fed,
    pool: &mut PacketPool,
    steering: &Option<Arc<Steering>>,
    scr: Option<&crate::scr::ScrRun>,
    nic: NicConfig,
) -> Result<Box<dyn Source + 'a>, EngineError> {
    if let Some(src) = fed.dispatched {
        return Ok(Box::new(src));
    }
    if let Some(input) = live.and_then(|l| l.input.as_ref()) {
        let rx = input.open_rx_into(w, pool).map_err(|e| EngineError::Config(e.to_string()))?;
        let counters = Arc::clone(&input.counters()[w]);
        return Ok(match (fed.kernel, steering) {
            (Some((switch, classifier)), Some(st)) => Box::new(KernelSource::new(
                rx,
                counters,
                w as u16,
                Arc::clone(st),
                classifier,
                switch,
                KERNEL_DRAIN.as_nanos() as u64,
            )),
            _ => Box::new(PortSource::new(rx, counters)),
        });
    }
    let Some(trace) = trace else { return Err(EngineError::Config("a run needs an input".into())) };
    Ok(match steering {
        Some(st) => {
            let q = NicQueue::new(Arc::clone(trace), Arc::clone(st), w as u16, nic);
            match scr {
                Some(r) => Box::new(q.with_sequencer(Arc::clone(&r.seq))),
                None => Box::new(q),
            }
        }
        None => Box::new(ReplayQueue::new(
            Arc::clone(trace),
            w,
            ReplayConfig {
                loops: cfg.loops,
                max_packets: None,
                // The whole trace's rate: each queue paces by trace time.
                rate_pps: cfg.rate_pps,
                tsc_hz: nic.tsc_hz,
            },
        )),
    })
}

/// A live port's worker loop: steps until its source ends, naps when the
/// port is idle (an idle port should not burn a shared core), and publishes
/// its figures about twice a second (read at a batch boundary).
fn serve(ws: &mut [Worker<'_>], halt: &AtomicBool, live: &Live, hz: f64) {
    let every = (PUBLISH_EVERY.as_secs_f64() * hz) as u64;
    let mut last = tsc::rdtsc();
    let mut backoff = cpu::IdleBackoff::default();
    let mut steps = 0u32;
    let mut open: Vec<usize> = (0..ws.len()).collect();
    // What each worker's mailbox had posted when it last looked.
    let mut seen = vec![0u64; ws.len()];
    while !open.is_empty() {
        let mut busy = false;
        open.retain(|&i| {
            // Requests land between two batches.
            let wk = &mut ws[i];
            live.ctl.serve(wk.core(), &mut seen[i], wk.pipeline_mut());
            match wk.step(halt) {
                Step::Busy => {
                    busy = true;
                    true
                }
                Step::Idle => true,
                Step::Done => false,
            }
        });
        if busy {
            backoff.busy();
        } else {
            backoff.idle();
        }
        // The clock is read every PUBLISH_CHECK steps, not per batch.
        steps = steps.wrapping_add(1);
        if steps.is_multiple_of(PUBLISH_CHECK) {
            let now = tsc::rdtsc();
            if now.wrapping_sub(last) >= every {
                last = now;
                for wk in ws.iter() {
                    crate::live::publish(&live.cores[wk.core()], wk, now);
                }
            }
        }
    }
    let now = tsc::rdtsc();
    for wk in ws.iter() {
        crate::live::publish(&live.cores[wk.core()], wk, now);
    }
}

/// The control loop on the calling thread, until the workers end, the
/// deadline passes, the strategy is finished or the caller's stop flag
/// rises: the NIC's due updates land, the strategy ticks every period, the
/// ports' links are checked, the caller's status tick runs once a second.
/// Returns why a port failed, if one did.
#[allow(clippy::too_many_arguments)]
fn control_loop(
    cfg: &RunConfig,
    running: &dyn Fn() -> bool,
    steering: Option<&Steering>,
    mut controller: Option<&mut dyn Controller>,
    mut mover: Option<&mut KernelMover>,
    log: &mut ControlLog,
    live: Option<&Live>,
    mut watch: Watch<'_>,
) -> Option<String> {
    let start = Instant::now();
    let deadline = cfg.duration.map(|d| start + d + cfg.warmup.unwrap_or_default());
    let period = controller.as_ref().map_or(DEFAULT_PERIOD, |c| c.period());
    let mut next_tick = start + period;
    let mut next_status = start + Duration::from_secs(1);
    let mut next_link = start + LINK_CHECK;
    // The NIC's update latencies (`--nic-profile`) run on this loop's
    // clock, the wall clock, as the control period does: a 359 ms update
    // spans 3.6 periods of 100 ms whatever the run. With virtual cores
    // (logical workers taking turns on fewer threads) a wall-clock
    // second carries fewer packets than the projected cores would take,
    // so an update covers fewer packets than on real cores; the period
    // does the same, so the controller's view (how many periods a change
    // takes to land) is the paper's, while packets per update are not.
    while running() {
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) || watch.stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
            break;
        }
        if let Some(st) = steering {
            // Updates whose time has come land (the old table steered until now).
            st.pump(now);
        }
        if now >= next_tick {
            next_tick += period;
            if let Some(st) = steering {
                // Kernel steering: the program's per-(worker, key) counts are the loads the strategy reads.
                if let Some(m) = mover.as_deref_mut() {
                    m.publish(st);
                }
                control_tick(st, controller.as_deref_mut(), log);
                // This period's changes go to the NIC (its RETA moves as one write).
                st.pump(Instant::now());
                if controller.as_ref().is_some_and(|c| c.finished()) {
                    break;
                }
            }
        }
        // Kernel steering: landed changes go into the program, finished moves are retired.
        if let (Some(st), Some(m)) = (steering, mover.as_deref_mut()) {
            if let Err(e) = m.apply(st) {
                return Some(format!("kernel steering: {e}"));
            }
        }
        if let Some(l) = live {
            if now >= next_link {
                next_link = now + LINK_CHECK;
                if let Some(why) = check_links(l) {
                    return Some(why);
                }
            }
            if now >= next_status {
                // Advanced with or without a status tick: a deadline left in the past would make
                // this loop spin (it sleeps until the earliest of them) on a core the workers need.
                next_status = now + Duration::from_secs(1);
                if let Some(tick) = watch.tick.as_mut() {
                    tick(l, start.elapsed());
                }
            }
        }
        let mut until = deadline.map_or(next_tick, |d| d.min(next_tick));
        if let Some(l) = steering.and_then(|st| st.next_landing()) {
            until = until.min(l);
        }
        if live.is_some() {
            until = until.min(next_link).min(next_status);
        }
        if watch.stop.is_some() {
            until = until.min(now + STOP_POLL);
        }
        if mover.as_ref().is_some_and(|m| m.in_flight()) {
            until = until.min(now + MOVE_POLL);
        }
        // Woken early by a worker that ends (`WakeOnExit`); spurious wake-ups just loop.
        std::thread::park_timeout(until.saturating_duration_since(Instant::now()));
    }
    None
}

/// Polls every port's interface: each change is one line on stderr; a queue that
/// could not re-attach to a re-created interface is the run's end (its error).
fn check_links(live: &Live) -> Option<String> {
    for p in live.ports() {
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
pub(crate) fn control_tick<'c>(st: &Steering, controller: Option<&mut (dyn Controller + 'c)>, log: &mut ControlLog) {
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
    let Some(strat) = controller else { return };
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
        .stages()
        .into_iter()
        .enumerate()
        .map(|(i, (_, stage))| {
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
        let Some(i) = first.stage_index(name) else { continue };
        let stages = first.stages();
        let stage = stages[i].1;
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
