//! The per-core run loop: receive a batch, run the chain over it, transmit.

use std::sync::atomic::{AtomicBool, Ordering};

use flowplane_io::{Rx, RxStats, Sink, Source, TxCounters};
use flowplane_nf::{NfContext, NfCounters};
use flowplane_packet::{tsc, Batch, PacketPool};
use flowplane_scale::dyssect::class::PriorityClass;
use flowplane_scale::dyssect::sketch::SpaceSaving;
use flowplane_scale::steer::{Classifier, FlowRule, Handover, HeavyFlow, Steering};

use crate::exec::{Pipeline, StoreReport};
use crate::hist::Histogram;
use crate::scr::{ScrCoreReport, ScrReplica};

/// What one worker measured.
#[derive(Debug, Default)]
pub struct WorkerResult {
    /// Core index.
    pub core: usize,
    /// Packets received.
    pub packets: u64,
    /// Bytes received.
    pub bytes: u64,
    /// TSC cycles from first receive to the end of the last batch.
    pub cycles: u64,
    /// Batches processed.
    pub batches: u64,
    /// Transmit counters.
    pub tx: TxCounters,
    /// Per-NF counters, in chain order.
    pub nfs: Vec<(String, NfCounters, Option<serde_json::Value>)>,
    /// Cycles from receive to transmit completion, per batch.
    pub batch_latency: Histogram,
    /// Paced runs: cycles from each packet's arrival at the port to the end
    /// of its batch's transmit (includes the wait in the receive ring).
    pub packet_latency: Histogram,
    /// Flow-table figures.
    pub store: StoreReport,
    /// TSC cycles spent on batches (receive to transmit), not idle polling.
    pub busy_cycles: u64,
    /// The receive queue's counters (NIC emulation, ring drops).
    pub rx: RxStats,
    /// Stream positions the queue had walked when measuring started (`rx.scanned` then).
    pub scanned_from: u64,
    /// Receive-ring drops when measuring started (`rx.rx_ring_full` then).
    pub ring_full_from: u64,
    /// `busy_cycles` with the batches the OS interrupted (cycles per packet over
    /// [`PREEMPTED`] times the recent figure) counted at the recent figure: the
    /// chain's own work on a shared machine, where a thread descheduled for a
    /// few ms mid-batch would otherwise count that time as work.
    pub busy_on_cpu: u64,
    /// Flow entries handed to other cores / taken from them.
    pub flows_out: u64,
    /// Flow entries imported from other cores.
    pub flows_in: u64,
    /// Imported entries refused (table full).
    pub flows_refused: u64,
    /// `--scale scr`: the core's replica (digest, fast-forward cost, recovery).
    pub scr: Option<ScrCoreReport>,
    /// `--priority`: latency of the class's packets (cycles; as `packet_latency`
    /// when paced, else their batch's receive-to-transmit).
    pub prio_latency: Histogram,
    /// `--priority`: latency of the other packets.
    pub normal_latency: Histogram,
}

/// A batch costing more than this many times the recent cycles per packet
/// was interrupted (descheduled): a batch's own variation is a few times at
/// most, a time slice is hundreds of batches.
pub const PREEMPTED: f64 = 8.0;

/// A worker's side of the control plane: its queue's steering table and
/// hand-over mailbox, and the classifier that maps a flow to its RETA entry.
pub struct Control<'a> {
    /// The port's live table.
    pub steering: &'a Steering,
    /// The classifier the trace was steered with.
    pub classifier: &'a Classifier,
    mail: Vec<Handover>,
    /// Heavy-flow sampling (Dyssect): the sketch, its stride, packets seen.
    sketch: Option<(SpaceSaving, u32, u64)>,
    heavy: Vec<HeavyFlow>,
}

impl<'a> Control<'a> {
    /// A control channel over `steering`.
    pub fn new(steering: &'a Steering, classifier: &'a Classifier) -> Self {
        Control { steering, classifier, mail: Vec::new(), sketch: None, heavy: Vec::new() }
    }

    /// Samples one packet in `stride` into a heavy-flow sketch, published for the strategy.
    pub fn with_sampling(mut self, stride: u32) -> Self {
        if stride > 0 {
            self.sketch = Some((SpaceSaving::new(u64::from(stride)), stride, 0));
        }
        self
    }

    /// Feeds the sampled packets of `batch` (before the chain rewrites them) to the sketch.
    fn sample(&mut self, core: usize, batch: &Batch, class: Option<&PriorityClass>) {
        let Some((sk, stride, seen)) = self.sketch.as_mut() else { return };
        let n = batch.len() as u64;
        let stride = u64::from(*stride);
        // The packets whose running index is a multiple of the stride.
        let mut i = (stride - *seen % stride) % stride;
        while i < n {
            let f = batch.data(i as usize);
            if let Ok(flowplane_wire::flow::FiveTuple::V4(t)) = flowplane_wire::flow::extract_five_tuple(f) {
                sk.add(batch.rss_hashes()[i as usize], &t, class.is_some_and(|c| c.matches(f)));
            }
            i += stride;
        }
        *seen += n;
        // Published every 256 strides' worth of packets (a try-lock: never waits).
        if (*seen / stride) % 256 < n.div_ceil(stride) {
            sk.top(&mut self.heavy);
            self.steering.publish_heavy(core, &self.heavy);
        }
    }

    /// Imports the state handed to this core (at a batch boundary).
    fn import(&mut self, core: usize, exec: &mut Pipeline, res: &mut WorkerResult) {
        if !self.steering.has_mail(core) {
            return;
        }
        self.steering.take_mail(core, &mut self.mail);
        for h in self.mail.drain(..) {
            let (ok, bad) = exec.import_flows(&h.state);
            res.flows_in += ok as u64;
            res.flows_refused += bad as u64;
            self.steering.imported(h.mv);
        }
    }

    /// Hands over the state of every move the queue says is due (one pass
    /// over the tables for all of them); the cycles that took (0: none due).
    fn release(&mut self, source: &mut dyn Source, exec: &mut Pipeline, res: &mut WorkerResult) -> u64 {
        let mut due = Vec::new();
        while let Some(mv) = source.take_due() {
            due.push(mv);
        }
        if due.is_empty() {
            return 0;
        }
        let t0 = tsc::rdtsc();
        let c = self.classifier;
        let mut outs = vec![Vec::new(); due.len()];
        let keys: Vec<u16> = due.iter().map(|m| m.key).collect();
        // A flow with an exact-match rule belongs to the rule's key, not its RETA entry.
        let rules = self.steering.flow_rules();
        res.flows_out += if rules.is_empty() {
            exec.export_flows_by(&|k| keys.iter().position(|&e| e == c.entry_of(k)), &mut outs)
        } else {
            // The rules of the due slots, and those of the due entries' other flows (few).
            let due_rules: Vec<(usize, FlowRule)> =
                rules.iter().filter_map(|(key, r)| keys.iter().position(|k| k == key).map(|i| (i, *r))).collect();
            let entry_rules: Vec<FlowRule> =
                rules.iter().map(|(_, r)| *r).filter(|r| keys.contains(&r.entry)).collect();
            let pick = |k: &flowplane_wire::flow::FiveTuple| {
                let e = c.entry_of(k);
                if let flowplane_wire::flow::FiveTuple::V4(t) = k {
                    if let Some((i, _)) = due_rules.iter().find(|(_, r)| r.entry == e && r.matches(t)) {
                        return Some(*i);
                    }
                    if entry_rules.iter().any(|r| r.entry == e && r.matches(t)) {
                        // Its own slot owns it, not moving now.
                        return None;
                    }
                }
                keys.iter().position(|&x| x == e)
            };
            exec.export_flows_by(&pick, &mut outs)
        } as u64;
        for (mv, out) in due.into_iter().zip(outs) {
            self.steering.hand_over(mv, out);
        }
        tsc::rdtsc().saturating_sub(t0)
    }
}

/// What one step of a worker did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Processed a batch.
    Busy,
    /// Nothing to receive now.
    Idle,
    /// The source is exhausted or the run was stopped.
    Done,
}

/// One (real or logical) worker: its queue, chain, pool and sink, run a
/// batch at a time by [`Worker::step`], so a real thread can run one worker
/// or take turns over several (`--virtual-cores`).
pub struct Worker<'a> {
    core: usize,
    pool: PacketPool,
    batch: Box<Batch>,
    source: Box<dyn Source + 'a>,
    exec: Pipeline,
    sink: Box<dyn Sink + 'a>,
    batch_size: usize,
    measure_from_tsc: u64,
    ctl: Option<Control<'a>>,
    res: WorkerResult,
    first: Option<u64>,
    last_end: u64,
    /// Packet times of the batch in flight (paced runs: per-packet latency).
    arrivals: Vec<u64>,
    /// The worker's own batch cycles (without the NIC's walk) since the start,
    /// warm-up included (published for rebalancing).
    busy_total: u64,
    /// `--scale scr`: the core's private replica of the chain's state.
    scr: Option<Box<ScrReplica>>,
    /// The source said it is exhausted (not stopped by time).
    source_done: bool,
    /// `--priority`: the class, and per packet of the batch in flight whether it is in it.
    priority: Option<PriorityClass>,
    /// `--replicate`: imports and table walks between two batches.
    repl: Option<Box<crate::repl::ReplLink>>,
    prio: Vec<bool>,
    /// Virtual-time latency (`--virtual-cores` at full speed): this logical
    /// worker as a dedicated core serving its packets FIFO, each arriving at
    /// its trace timestamp, each taking its batch's measured cost per packet.
    /// (core free at, ns; TSC cycles per ns)
    vclock: Option<(f64, f64)>,
    /// Recent batch cycles per packet (moving average), to spot interrupted batches.
    recent_cpp: f64,
    /// Idle timer ticks (live sources): TSC cycles between two, and the last one's TSC.
    tick_every: u64,
    last_tick: u64,
    /// The chain keeps packets to send later (`Pipeline::holds_packets`): asked after every batch and when idle.
    holds: bool,
}

/// How often an idle live worker advances its packet clock (expiry, NF timers): 100 ms.
const IDLE_TICK: std::time::Duration = std::time::Duration::from_millis(100);

impl<'a> Worker<'a> {
    /// A worker for core (or logical worker) `core`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        core: usize,
        pool: PacketPool,
        source: Box<dyn Source + 'a>,
        exec: Pipeline,
        sink: Box<dyn Sink + 'a>,
        batch_size: usize,
        measure_from_tsc: u64,
        ctl: Option<Control<'a>>,
    ) -> Self {
        let batch = Batch::new(&pool);
        let holds = exec.holds_packets();
        Worker {
            core,
            pool,
            batch,
            source,
            exec,
            sink,
            batch_size,
            measure_from_tsc,
            ctl,
            res: WorkerResult { core, ..Default::default() },
            first: None,
            last_end: 0,
            busy_total: 0,
            arrivals: Vec::with_capacity(flowplane_packet::MAX_BATCH),
            scr: None,
            source_done: false,
            priority: None,
            repl: None,
            prio: Vec::with_capacity(flowplane_packet::MAX_BATCH),
            vclock: None,
            recent_cpp: 0.0,
            tick_every: (IDLE_TICK.as_secs_f64() * tsc::hz()) as u64,
            last_tick: 0,
            holds,
        }
    }

    /// An idle source: at most every [`IDLE_TICK`], the chain's clock moves to the
    /// source's clock (live ports only; a replay's time is its trace's), so flows
    /// expire, shared tables' clocks advance and NF timers run without packets.
    fn idle_tick(&mut self, now_tsc: u64) {
        if self.scr.is_some() || now_tsc.wrapping_sub(self.last_tick) < self.tick_every {
            return;
        }
        self.last_tick = now_tsc;
        if let Some(ns) = self.source.clock_ns() {
            self.exec.tick(ns);
        }
    }

    /// Runs the chain on a private SCR replica (the source must carry a sequencer).
    pub fn with_scr(mut self, r: ScrReplica) -> Self {
        self.scr = Some(Box::new(r));
        self
    }

    /// Measures the class latencies in virtual time (see `vclock`), with `hz` TSC cycles per second.
    pub fn set_virtual_latency(&mut self, hz: f64) {
        self.vclock = Some((0.0, hz / 1e9));
    }

    /// Measures the latency of a priority class apart (`--priority`).
    pub fn set_priority(&mut self, class: Option<PriorityClass>) {
        self.priority = class;
    }

    /// Replicates state with a peer (`--replicate`): served between two bursts.
    pub fn set_repl(&mut self, link: crate::repl::ReplLink) {
        self.repl = Some(Box::new(link));
    }

    /// Receives one burst and runs the chain over it.
    pub fn step(&mut self, stop: &AtomicBool) -> Step {
        if let Some(r) = self.repl.as_mut() {
            r.serve(&mut self.exec);
        }
        let res = &mut self.res;
        if let Some(c) = self.ctl.as_mut() {
            c.import(self.core, &mut self.exec, res);
        }
        let nic0 = if self.ctl.is_some() { self.source.rx_stats().nic_cycles } else { 0 };
        let now = tsc::rdtsc();
        let n = match self.source.rx_burst(&mut self.pool, &mut self.batch, self.batch_size, now) {
            Rx::Packets(n) => n,
            Rx::Idle => {
                if let Some(c) = self.ctl.as_mut() {
                    c.release(self.source.as_mut(), &mut self.exec, res);
                }
                if self.holds {
                    // Packets an element releases with no traffic (a buffering FAR forwarding again).
                    let ctx = NfContext { now_tsc: now, now_ns: self.source.clock_ns().unwrap_or(0) };
                    self.exec.release(&mut self.pool, &mut self.batch, &ctx);
                    if !self.batch.is_empty() {
                        let tx = self.sink.tx_burst(&mut self.pool, &mut self.batch);
                        let res = &mut self.res;
                        res.tx.sent += tx.sent;
                        res.tx.bytes += tx.bytes;
                        res.tx.dropped += tx.dropped;
                        res.tx.errors += tx.errors;
                    }
                }
                self.idle_tick(now);
                return if stop.load(Ordering::Relaxed) { Step::Done } else { Step::Idle };
            }
            Rx::Done => {
                self.source_done = true;
                self.exec.clock_done();
                return Step::Done;
            }
        };
        if self.first.is_none() && now >= self.measure_from_tsc {
            // Warm-up over: throughput, cycles and latency count from here
            // (tables filled, caches and page tables warm). NF counters keep totals.
            self.first = Some(now);
            clear_measured(res);
            // The virtual core's backlog from the warm-up is not measured either.
            if let Some(v) = self.vclock.as_mut() {
                v.0 = 0.0;
            }
            res.scanned_from = self.source.rx_stats().scanned;
            res.ring_full_from = self.source.rx_stats().rx_ring_full;
        }
        let batch = &mut self.batch;
        res.packets += n as u64;
        res.bytes += batch.lens().iter().map(|&l| l as u64).sum::<u64>();
        // The packet clock: NF actions see each packet's own time; table
        // bookkeeping (last seen, expiry) the latest time in the batch.
        let now_ns = batch.max_timestamp();
        let arrival = self.source.arrival_clock();
        let ctx = NfContext { now_tsc: now, now_ns };
        if let Some(c) = self.ctl.as_mut() {
            c.sample(self.core, batch, self.priority.as_ref());
        }
        if self.vclock.is_some() {
            self.arrivals.clear();
            self.arrivals.extend_from_slice(batch.timestamps());
        }
        if let Some(class) = &self.priority {
            // Classified before the chain rewrites headers; within the reserved capacity.
            self.prio.clear();
            self.prio.extend((0..n).map(|i| class.matches(batch.data(i))));
        }
        match self.scr.as_mut().and_then(|r| Some((r, self.source.scr_side()?))) {
            Some((r, side)) => {
                let (chain, tap) = self.exec.scr_parts();
                r.process(chain, batch, side, &ctx, tap)
            }
            None => self.exec.process(batch, &ctx),
        }
        if arrival.is_some() {
            // Within the reserved capacity: no allocation.
            self.arrivals.clear();
            self.arrivals.extend_from_slice(batch.timestamps());
        }
        if self.holds {
            // Released packets leave behind the batch's own (not counted as received or timed).
            self.exec.release(&mut self.pool, batch, &ctx);
        }
        let tx = self.sink.tx_burst(&mut self.pool, batch);
        res.tx.sent += tx.sent;
        res.tx.bytes += tx.bytes;
        res.tx.dropped += tx.dropped;
        res.tx.errors += tx.errors;
        res.batches += 1;
        let handed = match self.ctl.as_mut() {
            Some(c) => c.release(self.source.as_mut(), &mut self.exec, res),
            None => 0,
        };
        self.last_end = tsc::rdtsc();
        res.batch_latency.record(self.last_end.saturating_sub(now));
        res.busy_cycles += self.last_end.saturating_sub(now);
        // The batch without its hand-overs (real work, kept whole) against the recent cost per packet.
        let own = self.last_end.saturating_sub(now).saturating_sub(handed);
        let per = own as f64 / n.max(1) as f64;
        let kept = if self.recent_cpp > 0.0 && per > PREEMPTED * self.recent_cpp {
            (self.recent_cpp * n as f64) as u64
        } else {
            // Down fast, up slowly: interruptions only ever inflate a batch, and a
            // first batch (cold tables, set-up) must not hold the figure up for long.
            self.recent_cpp = match self.recent_cpp {
                r if r <= 0.0 => per,
                r if per < r => 0.5 * r + 0.5 * per,
                r => 0.97 * r + 0.03 * per,
            };
            own
        };
        res.busy_on_cpu += kept + handed;
        if let Some((t0, k)) = arrival {
            for (i, &ts) in self.arrivals.iter().enumerate() {
                let l = self.last_end.saturating_sub(t0 + (ts as f64 * k) as u64);
                res.packet_latency.record(l);
                if self.priority.is_some() {
                    if self.prio.get(i) == Some(&true) { &mut res.prio_latency } else { &mut res.normal_latency }
                        .record(l);
                }
            }
        } else if let (Some((clock, k)), true) = (self.vclock.as_mut(), self.priority.is_some()) {
            // Per packet: FIFO on a dedicated core, service = the batch's own cost per packet
            // (an interrupted batch at the recent cost: a dedicated core is not descheduled).
            let nic = self.source.rx_stats().nic_cycles.saturating_sub(nic0);
            let per = (kept + handed).saturating_sub(nic) as f64 / *k / n.max(1) as f64;
            for (i, &ts) in self.arrivals.iter().enumerate() {
                let a = ts as f64;
                *clock = clock.max(a) + per;
                let l = ((*clock - a) * *k) as u64;
                if self.prio.get(i) == Some(&true) { &mut res.prio_latency } else { &mut res.normal_latency }.record(l);
            }
        } else if self.priority.is_some() {
            let l = self.last_end.saturating_sub(now);
            for &p in &self.prio {
                if p { &mut res.prio_latency } else { &mut res.normal_latency }.record(l);
            }
        }
        if let Some(c) = self.ctl.as_ref() {
            // The worker's own work (not the NIC's walk), for rebalancing by load.
            let nic = self.source.rx_stats().nic_cycles.saturating_sub(nic0);
            self.busy_total += self.last_end.saturating_sub(now).saturating_sub(nic);
            c.steering.publish_busy(self.core, self.busy_total);
        }
        if stop.load(Ordering::Relaxed) {
            Step::Done
        } else {
            Step::Busy
        }
    }

    /// Runs until the source is done or `stop` is raised.
    pub fn run(&mut self, stop: &AtomicBool) {
        loop {
            match self.step(stop) {
                Step::Busy => {}
                Step::Idle => std::hint::spin_loop(),
                Step::Done => break,
            }
        }
    }

    /// The executor, to change between two batches (run-time requests).
    pub fn pipeline_mut(&mut self) -> &mut Pipeline {
        &mut self.exec
    }

    /// The worker's index (its queue, its core's snapshot).
    pub fn core(&self) -> usize {
        self.core
    }

    /// The run starts now (every worker is built): pacing and warm-up count from `tsc`.
    pub fn start(&mut self, tsc: u64, measure_from_tsc: u64) {
        self.source.start(tsc);
        self.measure_from_tsc = measure_from_tsc;
    }

    /// The figures measured so far (live runs publish them while running;
    /// per-NF counters are in [`Worker::pipeline`] until `finish`).
    pub fn result(&self) -> &WorkerResult {
        &self.res
    }

    /// Its flow tables' figures now: the pipeline's, or under scr the replica's (where the state is).
    pub fn store_report(&self) -> crate::exec::StoreReport {
        let base = self.exec.store_report();
        match &self.scr {
            Some(r) => r.store_report(base),
            None => base,
        }
    }

    /// The worker's pipeline (live runs read its table and NF counters).
    pub fn pipeline(&self) -> &Pipeline {
        &self.exec
    }

    /// Measured figures so far: busy cycles (for `--virtual-cores` turn-taking).
    pub fn busy_cycles(&self) -> u64 {
        self.res.busy_cycles
    }

    /// TSC cycles from the first measured packet to the end of the last batch (the result's `cycles`).
    pub fn span_cycles(&self) -> u64 {
        self.first.map_or(0, |f| self.last_end.saturating_sub(f))
    }

    /// The results and the chain (whose state exports read).
    pub fn finish(self) -> (WorkerResult, Pipeline) {
        let (res, exec, _) = self.finish_with_replica();
        (res, exec)
    }

    /// [`Worker::finish`], keeping the `--scale scr` replica (its state is what `--export` writes).
    pub fn finish_with_replica(mut self) -> (WorkerResult, Pipeline, Option<Box<ScrReplica>>) {
        // Buffers still held (none unless a sink failed) go back to the pool.
        let _ = self.batch.free_all(&mut self.pool);
        let span = self.span_cycles();
        let mut res = self.res;
        if self.first.is_none() {
            // The run ended inside its warm-up (or saw no packet): nothing was measured.
            clear_measured(&mut res);
        }
        res.cycles = span;
        res.rx = self.source.rx_stats();
        if let Some(r) = self.scr.as_mut() {
            r.finish(self.exec.chain_mut(), self.source_done);
            res.scr = Some(r.report(self.exec.chain(), self.source.scr_lost()));
        }
        res.nfs = self.exec.nf_results();
        res.store = self.exec.store_report();
        (res, self.exec, self.scr)
    }
}

/// Zeroes what a worker measures (throughput, latency, busy time); NF counters keep their totals.
fn clear_measured(res: &mut WorkerResult) {
    res.packets = 0;
    res.bytes = 0;
    res.batches = 0;
    res.tx = TxCounters::default();
    res.batch_latency = Histogram::default();
    res.packet_latency = Histogram::default();
    res.prio_latency = Histogram::default();
    res.normal_latency = Histogram::default();
    res.busy_cycles = 0;
    res.busy_on_cpu = 0;
}
