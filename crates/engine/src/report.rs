//! The run report: throughput, cycles/packet, batch latency, per-core and per-NF counters.

use std::fmt;
use std::time::Duration;

use flowplane_nf::report::compact_line;
use flowplane_nf::NfCounters;
use serde::Serialize;

use crate::exec::StoreReport;
use crate::hist::Histogram;
use crate::runner::RunConfig;
use crate::spec::ChainSpec;
use crate::worker::WorkerResult;

/// Batch latency percentiles.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Latency {
    /// Batches measured.
    pub batches: u64,
    /// Median cycles from receive to transmit of a batch.
    pub p50_cycles: u64,
    /// 99th percentile.
    pub p99_cycles: u64,
    /// 99.9th percentile.
    pub p999_cycles: u64,
    /// Median in nanoseconds.
    pub p50_ns: f64,
    /// 99th percentile in nanoseconds.
    pub p99_ns: f64,
    /// 99.9th percentile in nanoseconds.
    pub p999_ns: f64,
}

/// One core's figures. `flowplane ctl show runtime` shows the same row, built by
/// [`CoreReport::new`] from the core's last publication: read once the traffic
/// is over, it equals the report's.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CoreReport {
    /// Core index.
    pub core: usize,
    /// Packets received.
    pub packets: u64,
    /// Packets/s on this core, in millions (over the span from its first packet to the end of its last batch).
    pub mpps: f64,
    /// TSC cycles per packet on this core (that span over its packets; idle polling included).
    pub cycles_per_packet: f64,
    /// Batches (calls of the chain) with at least one packet.
    pub batches: u64,
    /// Packets per batch (VPP's vectors per call).
    pub vectors_per_call: f64,
    /// TSC cycles spent on batches, receive to transmit (idle polling not included).
    pub busy_cycles: u64,
    /// The same in seconds.
    pub busy_s: f64,
    /// Busy cycles per packet.
    pub busy_cycles_per_packet: f64,
}

impl CoreReport {
    /// Core `core`'s row from its counts: `cycles` from its first packet to the end of its last batch,
    /// `busy_cycles` in batches, at `hz` TSC ticks per second.
    pub fn new(core: usize, packets: u64, batches: u64, cycles: u64, busy_cycles: u64, hz: f64) -> CoreReport {
        let per = |c: u64, n: u64| if n > 0 { c as f64 / n as f64 } else { 0.0 };
        let secs = cycles as f64 / hz;
        CoreReport {
            core,
            packets,
            mpps: if secs > 0.0 { packets as f64 / secs / 1e6 } else { 0.0 },
            cycles_per_packet: per(cycles, packets),
            batches,
            vectors_per_call: per(packets, batches),
            busy_cycles,
            busy_s: busy_cycles as f64 / hz,
            busy_cycles_per_packet: per(busy_cycles, packets),
        }
    }
}

/// One NF's counters summed over cores.
#[derive(Clone, Debug, Default, Serialize)]
pub struct NfReport {
    /// NF name.
    pub name: String,
    /// Counters.
    #[serde(flatten)]
    pub counters: NfCounters,
    /// NF-specific results, every core's merged with the NF's merge hook.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub details: Option<serde_json::Value>,
}

/// The whole run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    /// Chain spec as given.
    pub chain: String,
    /// Executor.
    pub exec: String,
    /// The clock NFs ran on: `trace` (each packet's capture or generation
    /// time, also when paced) and how `--output` was stamped.
    pub clock: String,
    /// Worker cores.
    pub cores: usize,
    /// Packets per receive burst at most (`--batch`).
    pub batch: usize,
    /// Packets received (all cores).
    pub packets: u64,
    /// Bytes received.
    pub bytes: u64,
    /// Packets transmitted.
    pub packets_out: u64,
    /// Packets dropped by NFs.
    pub dropped: u64,
    /// Packets lost to sink errors.
    pub tx_errors: u64,
    /// Aggregate million packets per second (packets / wall time).
    pub mpps: f64,
    /// Aggregate Gbit/s of frame bytes.
    pub gbps: f64,
    /// TSC cycles per packet per core (sum of busy cycles / packets).
    pub cycles_per_packet: f64,
    /// Wall-clock duration.
    pub duration_s: f64,
    /// Measured TSC frequency.
    pub tsc_ghz: f64,
    /// Batch latency.
    pub latency: Latency,
    /// Per core.
    pub per_core: Vec<CoreReport>,
    /// Per NF.
    pub nfs: Vec<NfReport>,
    /// Flow tables (summed over cores).
    pub tables: StoreReport,
    /// The multi-core runtime: strategy, NIC emulation, balance, projection.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scale: Option<ScaleReport>,
    /// A live run's steering: the port's own spreading or the dispatcher's, and what it cost.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steering: Option<SteerReport>,
    /// `--scale scr`: history, fast-forward cost, recovery, replica digests.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scr: Option<crate::scr::ScrReport>,
    /// `--ipfix`: records exported, lost, messages sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ipfix: Option<crate::ipfix::IpfixReport>,
    /// `--replicate`: records sent and received, losses, resyncs, lag.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replication: Option<crate::repl::ReplReport>,
    /// Whether the throughput figure can be quoted: the work and packets it
    /// rests on, and the reasons not to ([`crate::trust`]).
    pub trust: crate::trust::Trust,
    /// Exported NF state (not serialised in the report; written by `--export`).
    #[serde(skip)]
    pub exports: Vec<(String, Vec<serde_json::Value>)>,
}

/// What a strategy that sprays one key's packets over cores (`shared`) guarantees for the NFs whose state depends
/// on per-key packet order (ddos, ratelimit, policer, portknock, psd, ...): each packet still updates its key's
/// state exactly once, under the entry's lock, so per-key packet and byte counts are exact; but the packets of a
/// key are applied in the order the cores reach them, and that order is not bounded (a core taken off the CPU lags
/// by as many packets as it missed). Any verdict that depends on earlier packets of its key — which packets a rate
/// limit drops, the window in which a source is blocked, whether a knock sequence completed — may differ from a
/// serial run, and with it the NF's state, report and export.
#[derive(Clone, Debug, Default, Serialize)]
pub struct VerdictDrift {
    /// The NFs concerned (those of `order_not_guaranteed`).
    pub nfs: Vec<String>,
    /// The one-line statement of the bound (see the type's doc).
    pub bound: String,
}

impl VerdictDrift {
    /// For `nfs` (None if empty).
    pub fn of(nfs: &[String]) -> Option<VerdictDrift> {
        (!nfs.is_empty()).then(|| VerdictDrift {
            nfs: nfs.to_vec(),
            bound: "per-key packet and byte counts exact; per-key order unbounded, so any verdict that depends on \
                    earlier packets of its key (and state, reports, exports) may differ from a serial run; use rss \
                    for exact results"
                .to_string(),
        })
    }
}

/// How a live run's packets reached their workers.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SteerReport {
    /// `port` (each worker polls its own input queue), `dispatcher` (a core steers by flowplane's
    /// table) or `kernel` (an AF_PACKET fanout program steers by flowplane's table; each worker polls its queue).
    pub by: String,
    /// The strategy (`--scale`).
    pub strategy: String,
    /// Why the steering is what it is (the NFs' placement).
    pub notes: Vec<String>,
    /// Packets the dispatcher received.
    pub dispatched: u64,
    /// The dispatcher's TSC cycles per packet (its own core; not in the workers' figures).
    pub dispatch_cycles_per_packet: f64,
    /// Seconds the dispatcher spent on bursts that received something.
    pub dispatch_busy_s: f64,
    /// Packets dropped because a worker's ring was full.
    pub dispatch_ring_full: u64,
    /// Frames the kernel's steering program placed (`by: "kernel"`).
    pub kernel_steered: u64,
    /// Packets the dispatcher (or the kernel program) could not classify (not IP, malformed): sent to key 0's owner.
    pub unclassified: u64,
    /// Packets too large for a dispatcher buffer (dropped).
    pub oversize: u64,
    /// RETA moves the strategy started (rsspp), and those whose state the new owner imported.
    pub moves_started: u64,
    /// See `moves_started`.
    pub moves_done: u64,
    /// Receives held back at a moved key's packet until its state arrived.
    pub stalls: u64,
    /// The strategy's own account (RSS++'s and Dyssect's decisions).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub controller: Option<serde_json::Value>,
    /// `--priority`: the class's receive-to-transmit latency against its SLO, and the other traffic's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<PriorityReport>,
}

/// The multi-core runtime's figures.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ScaleReport {
    /// Strategy (`--scale`).
    pub strategy: String,
    /// Workers (real cores, or logical workers with `--virtual-cores`).
    pub workers: usize,
    /// Real threads they ran on.
    pub threads: usize,
    /// Logical workers took turns on the real cores (`--virtual-cores`).
    pub virtual_cores: bool,
    /// How the NIC was programmed for the NFs' declared state placement.
    pub steering: Vec<String>,
    /// NFs whose per-key packet order the strategy does not keep (results may differ from one core).
    pub order_not_guaranteed: Vec<String>,
    /// How far those NFs' results may drift from a serial run (None: every NF's results are exact).
    pub verdicts_may_differ: Option<VerdictDrift>,
    /// Packets that arrived at the port (stream positions the NIC passed).
    pub offered: u64,
    /// Packets dropped because a core's receive ring was full.
    pub rx_ring_full: u64,
    /// `offered` and `rx_ring_full` after the warm-up (what `flowplane mlffr`
    /// counts: the trial, not its learning phase).
    pub offered_measured: u64,
    /// See `offered_measured`.
    pub rx_ring_full_measured: u64,
    /// NIC emulation (steering walk) cycles per received packet, not counted as workers' work.
    pub nic_cycles_per_packet: f64,
    /// RETA moves completed (state handed over and imported).
    pub moves: u64,
    /// Flow entries handed between cores.
    pub flows_moved: u64,
    /// Handed-over entries the new owner could not take (table full).
    pub flows_refused: u64,
    /// Control period (ms).
    pub period_ms: f64,
    /// FAJITA's load-imbalance factor per period window: (busiest - least
    /// busy) / busiest, in packets each core received per packet of traffic.
    pub imbalance: Vec<f64>,
    /// Mean of `imbalance` over the windows after the first second (all windows if the run was shorter).
    pub imbalance_settled: f64,
    /// The same factor in CPU load: busy cycles of each core per packet of traffic, per window.
    pub imbalance_cpu: Vec<f64>,
    /// Mean of `imbalance_cpu` after the first second.
    pub imbalance_cpu_settled: f64,
    /// Per worker: busy time (batches) / run time.
    pub utilisation: Vec<f64>,
    /// Per worker: its own work (busy time without the NIC's walk), ms: the projection's basis.
    pub work_ms: Vec<f64>,
    /// Packet latency, ns (p50, p99, p99.9): paced, from each packet's
    /// arrival at the port to the end of its transmit (ring wait included);
    /// at full speed, from its batch's receive to transmit.
    pub latency_ns: [f64; 3],
    /// What `latency_ns` measures: `arrival-to-transmit` or `receive-to-transmit`.
    pub latency_from: String,
    /// Packets / the busiest worker's own busy time (batches, without the
    /// NIC's walk; a batch the OS interrupted counts at the worker's recent
    /// cost per packet), Mpps: what the run's cores sustain while working; at
    /// most the stream rate the slowest worker keeps up with (its stream
    /// positions walked per second of its work: a core owning a larger
    /// share of the traffic bounds the port's rate).
    pub busy_mpps: f64,
    /// `--virtual-cores`: `busy_mpps` of the logical workers (Mpps),
    /// a PROJECTION of N real cores each running one worker.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub projected_mpps: Option<f64>,
    /// `--priority`: the class's latency against its SLO, and the other traffic's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<PriorityReport>,
    /// The strategy's own section (Dyssect: decisions, per-core load over time).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub controller: Option<serde_json::Value>,
    /// The emulated NIC's update latencies and what they delayed (strategies that change the table).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nic: Option<NicReport>,
}

/// The NIC profile a run applied (`--nic-profile`) and the updates it delayed.
#[derive(Clone, Debug, Serialize)]
pub struct NicReport {
    /// Profile name.
    pub profile: String,
    /// Latency of one RETA update (µs).
    pub reta_update_us: f64,
    /// Latency of one flow-rule operation (µs).
    pub rule_insert_us: f64,
    /// Updates applied (a RETA write, a flow-rule operation).
    pub updates: u64,
    /// Changes they carried (RETA entries moved, rules installed, rule slots moved).
    pub changes: u64,
    /// Sum over the applied updates of the time from request to landing (ms).
    pub waited_total_ms: f64,
    /// The longest of those (ms).
    pub waited_max_ms: f64,
    /// Updates still queued in the NIC when the run ended (never applied).
    pub pending_updates: usize,
    /// Changes they carried.
    pub pending_changes: usize,
}

impl NicReport {
    /// From the profile and the steering table's figures.
    pub fn new(p: &flowplane_scale::NicProfile, s: flowplane_scale::steer::UpdateStats) -> Self {
        NicReport {
            profile: p.name.clone(),
            reta_update_us: p.reta_update.as_secs_f64() * 1e6,
            rule_insert_us: p.rule_insert.as_secs_f64() * 1e6,
            updates: s.updates,
            changes: s.changes,
            waited_total_ms: s.waited_total.as_secs_f64() * 1e3,
            waited_max_ms: s.waited_max.as_secs_f64() * 1e3,
            pending_updates: s.pending_updates,
            pending_changes: s.pending_changes,
        }
    }
}

/// Latency of the priority class and of the rest (`--priority`, `--slo-us`).
#[derive(Clone, Debug, Serialize)]
pub struct PriorityReport {
    /// The class as given.
    pub class: String,
    /// Its SLO (µs), if any.
    pub slo_us: Option<f64>,
    /// What the latencies measure (as `latency_from`).
    pub latency_from: String,
    /// Priority packets measured.
    pub packets: u64,
    /// Priority class p50, p99, p99.9 (ns).
    pub latency_ns: [f64; 3],
    /// Other packets measured.
    pub normal_packets: u64,
    /// Other traffic p50, p99, p99.9 (ns).
    pub normal_latency_ns: [f64; 3],
    /// p99 of the class within its SLO.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p99_within_slo: Option<bool>,
}

impl PriorityReport {
    /// From the workers' class histograms.
    pub fn new(class: &str, slo_us: Option<f64>, ws: &[WorkerResult], hz: f64) -> Self {
        let (mut p, mut n) = (Histogram::default(), Histogram::default());
        for w in ws {
            p.merge(&w.prio_latency);
            n.merge(&w.normal_latency);
        }
        let paced = ws.iter().any(|w| w.packet_latency.count() > 0);
        let ns = |c: u64| c as f64 * 1e9 / hz;
        let q = |h: &Histogram| [ns(h.quantile(0.5)), ns(h.quantile(0.99)), ns(h.quantile(0.999))];
        let latency_ns = q(&p);
        PriorityReport {
            class: class.to_string(),
            slo_us,
            latency_from: if paced { "arrival-to-transmit" } else { "receive-to-transmit" }.to_string(),
            packets: p.count(),
            latency_ns,
            normal_packets: n.count(),
            normal_latency_ns: q(&n),
            p99_within_slo: slo_us.map(|s| latency_ns[1] <= s * 1e3),
        }
    }

    /// The report's `priority` line.
    fn write(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = self;
        let slo = match (p.slo_us, p.p99_within_slo) {
            (Some(s), Some(ok)) => format!("; SLO {s} us: p99 {}", if ok { "within" } else { "OVER" }),
            _ => String::new(),
        };
        writeln!(
            f,
            "priority     {}: {} packets p50 {:.0} ns, p99 {:.0} ns, p99.9 {:.0} ns; others {} packets p99 {:.0} ns ({}){slo}",
            p.class,
            p.packets,
            p.latency_ns[0],
            p.latency_ns[1],
            p.latency_ns[2],
            p.normal_packets,
            p.normal_latency_ns[1],
            p.latency_from
        )
    }
}

impl ScaleReport {
    /// From the workers' results and the control loop's windows.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cfg: &RunConfig,
        strategy: &str,
        plan: &crate::placement::Plan,
        ws: &[WorkerResult],
        threads: usize,
        (windows, cpu_windows): (&[f64], &[f64]),
        moves: u64,
        elapsed: Duration,
        hz: f64,
    ) -> ScaleReport {
        let packets: u64 = ws.iter().map(|w| w.packets).sum();
        let nic: u64 = ws.iter().map(|w| w.rx.nic_cycles).sum();
        let wall = elapsed.as_secs_f64() * hz;
        let period_s = cfg.scale_period.as_secs_f64().max(1e-6);
        let settled = |w: &[f64]| {
            let skip = ((1.0 / period_s) as usize).min(w.len().saturating_sub(1));
            let s = &w[skip..];
            if s.is_empty() {
                0.0
            } else {
                s.iter().sum::<f64>() / s.len() as f64
            }
        };
        let mut hist = Histogram::default();
        let paced = ws.iter().any(|w| w.packet_latency.count() > 0);
        for w in ws {
            hist.merge(if paced { &w.packet_latency } else { &w.batch_latency });
        }
        let ns = |c: u64| c as f64 * 1e9 / hz;
        // A logical worker's own work: its batches minus the NIC's steering walk.
        // Batches the OS interrupted count at the worker's recent cost (see `busy_on_cpu`).
        let work = |w: &WorkerResult| w.busy_on_cpu.saturating_sub(w.rx.nic_cycles);
        let busiest = ws.iter().map(work).max().unwrap_or(0) as f64 / hz;
        // The stream rate the slowest worker keeps up with: the stream positions
        // it walked per second of its own work. Workers that walk the stream at
        // their own pace (a static table) each deliver as many packets as their
        // turns allow, so packets / busiest alone would not see that a worker
        // owning a larger share falls behind the stream.
        let keeps_up = ws
            .iter()
            .filter(|w| work(w) > 0 && w.packets > 0)
            .map(|w| w.rx.scanned.saturating_sub(w.scanned_from) as f64 / (work(w) as f64 / hz))
            .fold(f64::INFINITY, f64::min);
        let sustained = if busiest > 0.0 { (packets as f64 / busiest).min(keeps_up) / 1e6 } else { 0.0 };
        ScaleReport {
            strategy: strategy.to_string(),
            workers: ws.len(),
            threads,
            virtual_cores: cfg.virtual_cores.is_some(),
            steering: plan.notes.clone(),
            order_not_guaranteed: plan.unordered.clone(),
            verdicts_may_differ: VerdictDrift::of(&plan.unordered),
            offered: ws.iter().map(|w| w.rx.scanned).max().unwrap_or(0),
            rx_ring_full: ws.iter().map(|w| w.rx.rx_ring_full).sum(),
            offered_measured: ws.iter().map(|w| w.rx.scanned.saturating_sub(w.scanned_from)).max().unwrap_or(0),
            rx_ring_full_measured: ws.iter().map(|w| w.rx.rx_ring_full.saturating_sub(w.ring_full_from)).sum(),
            nic_cycles_per_packet: if packets > 0 { nic as f64 / packets as f64 } else { 0.0 },
            moves,
            flows_moved: ws.iter().map(|w| w.flows_out).sum(),
            flows_refused: ws.iter().map(|w| w.flows_refused).sum(),
            period_ms: period_s * 1e3,
            imbalance: windows.to_vec(),
            imbalance_settled: settled(windows),
            imbalance_cpu: cpu_windows.to_vec(),
            imbalance_cpu_settled: settled(cpu_windows),
            utilisation: ws.iter().map(|w| if wall > 0.0 { w.busy_cycles as f64 / wall } else { 0.0 }).collect(),
            work_ms: ws.iter().map(|w| work(w) as f64 * 1e3 / hz).collect(),
            latency_ns: [ns(hist.quantile(0.5)), ns(hist.quantile(0.99)), ns(hist.quantile(0.999))],
            latency_from: if paced { "arrival-to-transmit" } else { "receive-to-transmit" }.to_string(),
            busy_mpps: sustained,
            projected_mpps: (cfg.virtual_cores.is_some() && busiest > 0.0).then_some(sustained),
            priority: None,
            controller: None,
            nic: None,
        }
    }
}

/// A packet rate given in Mpps, for people: Mpps from 1 Mpps up, kpps and pps below (a veth port's 2 kpps is not
/// "0.00 Mpps").
pub fn fmt_rate(mpps: f64) -> String {
    let pps = mpps * 1e6;
    if !pps.is_finite() || pps >= 1e6 {
        format!("{mpps:.2} Mpps")
    } else if pps >= 1e3 {
        format!("{:.2} kpps", pps / 1e3)
    } else {
        format!("{pps:.0} pps")
    }
}

/// A bit rate given in Gbit/s, likewise: Gbit/s from 1 Gbit/s up, Mbit/s and kbit/s below.
pub fn fmt_bits(gbps: f64) -> String {
    if !gbps.is_finite() || gbps >= 1.0 {
        format!("{gbps:.2} Gbit/s")
    } else if gbps >= 1e-3 {
        format!("{:.2} Mbit/s", gbps * 1e3)
    } else {
        format!("{:.2} kbit/s", gbps * 1e6)
    }
}

fn spec_string(spec: &ChainSpec) -> String {
    spec.to_string()
}

impl Report {
    /// Merges worker results; `details[i]` is NF i's report merged over every
    /// core (see `StatefulNf::merge_report`).
    pub fn from_workers(
        spec: &ChainSpec,
        cfg: &RunConfig,
        ws: &[WorkerResult],
        details: Vec<Option<serde_json::Value>>,
        elapsed: Duration,
        hz: f64,
    ) -> Report {
        let mut r = Report {
            chain: spec_string(spec),
            exec: cfg.exec.kind.to_string(),
            clock: format!(
                "trace ({}; output stamped with {})",
                cfg.rate_pps.map_or("replayed at full speed".to_string(), |r| format!("replayed at {r} packets/s")),
                if cfg.restamp { "the transmit time" } else { "the packets' own times" }
            ),
            cores: ws.len(),
            batch: cfg.batch_size,
            duration_s: elapsed.as_secs_f64(),
            tsc_ghz: hz / 1e9,
            ..Default::default()
        };
        let mut hist = Histogram::default();
        let mut cycles = 0u64;
        for w in ws {
            r.packets += w.packets;
            r.bytes += w.bytes;
            r.packets_out += w.tx.sent;
            r.dropped += w.tx.dropped;
            r.tx_errors += w.tx.errors;
            cycles += w.cycles;
            r.tables.merge(&w.store);
            hist.merge(&w.batch_latency);
            r.per_core.push(CoreReport::new(w.core, w.packets, w.batches, w.cycles, w.busy_cycles, hz));
            for (i, (name, c, _)) in w.nfs.iter().enumerate() {
                if r.nfs.len() <= i {
                    r.nfs.push(NfReport { name: name.clone(), ..Default::default() });
                }
                r.nfs[i].counters.merge(c);
            }
        }
        // Busy time of the slowest core bounds the run; wall time includes thread start.
        for (n, d) in r.nfs.iter_mut().zip(details) {
            n.details = d;
        }
        let busy = ws.iter().map(|w| w.cycles).max().unwrap_or(0) as f64 / hz;
        let secs = if busy > 0.0 { busy } else { r.duration_s };
        if secs > 0.0 {
            r.mpps = r.packets as f64 / secs / 1e6;
            r.gbps = r.bytes as f64 * 8.0 / secs / 1e9;
        }
        r.cycles_per_packet = if r.packets > 0 { cycles as f64 / r.packets as f64 } else { 0.0 };
        let ns = |c: u64| c as f64 * 1e9 / hz;
        r.latency = Latency {
            batches: hist.count(),
            p50_cycles: hist.quantile(0.5),
            p99_cycles: hist.quantile(0.99),
            p999_cycles: hist.quantile(0.999),
            p50_ns: ns(hist.quantile(0.5)),
            p99_ns: ns(hist.quantile(0.99)),
            p999_ns: ns(hist.quantile(0.999)),
        };
        r
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "chain        {}", self.chain)?;
        writeln!(f, "executor     {} on {} core(s)", self.exec, self.cores)?;
        writeln!(f, "clock        {}", self.clock)?;
        writeln!(
            f,
            "packets      {} in, {} out, {} dropped, {} tx errors",
            self.packets, self.packets_out, self.dropped, self.tx_errors
        )?;
        writeln!(f, "throughput   {}, {}", fmt_rate(self.mpps), fmt_bits(self.gbps))?;
        if !self.trust.ok() {
            writeln!(f, "trust        NOT TO BE QUOTED: {}", self.trust.flags.join("; "))?;
        }
        writeln!(f, "cycles/pkt   {:.1} (TSC {:.2} GHz)", self.cycles_per_packet, self.tsc_ghz)?;
        writeln!(f, "duration     {:.3} s", self.duration_s)?;
        writeln!(
            f,
            "batch lat.   p50 {:.0} ns, p99 {:.0} ns, p99.9 {:.0} ns ({} batches)",
            self.latency.p50_ns, self.latency.p99_ns, self.latency.p999_ns, self.latency.batches
        )?;
        for c in &self.per_core {
            writeln!(
                f,
                "core {:<7} {} packets, {}, {:.1} cycles/pkt",
                c.core,
                c.packets,
                fmt_rate(c.mpps),
                c.cycles_per_packet
            )?;
        }
        if let Some(x) = &self.ipfix {
            writeln!(f, "{}", x.line())?;
        }
        if let Some(x) = &self.replication {
            writeln!(f, "{}", x.line())?;
        }
        if let Some(st) = &self.steering {
            let by = if st.by == "dispatcher" {
                format!(
                    "a dispatcher core ({} packets, {:.1} cycles/pkt not in the workers' figures, ring_full {}, unclassified {}, oversize {})",
                    st.dispatched, st.dispatch_cycles_per_packet, st.dispatch_ring_full, st.unclassified, st.oversize
                )
            } else if st.by == "kernel" {
                format!(
                    "the kernel (flowplane's fanout or XDP program with its table, no dispatcher core; {} frames, unclassified {})",
                    st.kernel_steered, st.unclassified
                )
            } else {
                "the port's own queues".to_string()
            };
            writeln!(f, "steering     {} by {by}", st.strategy)?;
            if st.moves_started > 0 {
                writeln!(
                    f,
                    "steering     {} RETA moves started, {} done (state handed over), {} receives held for state",
                    st.moves_started, st.moves_done, st.stalls
                )?;
            }
            for n in &st.notes {
                writeln!(f, "steering     {n}")?;
            }
            if let Some(p) = &st.priority {
                p.write(f)?;
            }
        }
        if let Some(sc) = &self.scale {
            writeln!(
                f,
                "scale        {} over {} worker(s) on {} thread(s); rx_ring_full {}; NIC emulation {:.1} cycles/pkt (not in the workers' figures)",
                sc.strategy, sc.workers, sc.threads, sc.rx_ring_full, sc.nic_cycles_per_packet
            )?;
            for n in &sc.steering {
                writeln!(f, "steering     {n}")?;
            }
            if !sc.order_not_guaranteed.is_empty() {
                writeln!(f, "order        not guaranteed per key for: {}", sc.order_not_guaranteed.join(", "))?;
            }
            if let Some(d) = &sc.verdicts_may_differ {
                writeln!(f, "verdicts     may differ from a serial run for {}: {}", d.nfs.join(", "), d.bound)?;
            }
            let util: Vec<String> = sc.utilisation.iter().map(|u| format!("{:.0}%", u * 100.0)).collect();
            let last = sc.imbalance.last().copied().unwrap_or(0.0);
            writeln!(
                f,
                "balance      imbalance {:.1}% in packets, {:.1}% in CPU load after 1 s (last window {:.1}%, {} windows of {:.0} ms); utilisation {}; {} moves, {} flows moved",
                sc.imbalance_settled * 100.0,
                sc.imbalance_cpu_settled * 100.0,
                last * 100.0,
                sc.imbalance.len(),
                sc.period_ms,
                util.join(" "),
                sc.moves,
                sc.flows_moved
            )?;
            writeln!(
                f,
                "latency      p50 {:.0} ns, p99 {:.0} ns, p99.9 {:.0} ns ({})",
                sc.latency_ns[0], sc.latency_ns[1], sc.latency_ns[2], sc.latency_from
            )?;
            if let Some(p) = sc.projected_mpps {
                writeln!(
                    f,
                    "projected    {p:.2} Mpps on {} cores (PROJECTION: the stream rate the busiest logical worker sustains)",
                    sc.workers
                )?;
            }
            if let Some(p) = &sc.priority {
                p.write(f)?;
            }
            if let Some(n) = &sc.nic {
                let ms = |us: f64| flowplane_scale::nic_profile::fmt(Duration::from_secs_f64(us / 1e6));
                writeln!(
                    f,
                    "nic          profile {}: RETA update {}, flow rule {}; {} updates applied ({} changes), waited {:.1} ms in all, at most {:.1} ms; {} updates ({} changes) still queued at the end",
                    n.profile,
                    ms(n.reta_update_us),
                    ms(n.rule_insert_us),
                    n.updates,
                    n.changes,
                    n.waited_total_ms,
                    n.waited_max_ms,
                    n.pending_updates,
                    n.pending_changes
                )?;
            }
            if let Some(c) = &sc.controller {
                let g = |k: &str| c.get(k).and_then(|v| v.as_f64()).unwrap_or(0.0);
                let n = c.get("decisions").and_then(|d| d.as_array()).map_or(0, Vec::len);
                writeln!(
                    f,
                    "controller   {n} decisions, {:.0} shard moves, {:.0} flow moves, {:.0} flows offloaded at the end, {:.1} ms controller time",
                    g("shard_moves"),
                    g("flow_moves"),
                    g("offloaded"),
                    g("controller_ms")
                )?;
            }
        }
        if let Some(s) = &self.scr {
            for l in s.lines() {
                writeln!(f, "{l}")?;
            }
        }
        let t = &self.tables;
        if t.capacity > 0 {
            writeln!(
                f,
                "flow table   {} flows{} / {} capacity (+ {} IPv6), {} insertions, {} expiries, {} ended, {} table-full, {} evictions, {} unparsed{}",
                t.flows,
                if t.entries != t.flows { format!(" ({} entries)", t.entries) } else { String::new() },
                t.capacity,
                t.capacity_v6,
                t.insertions,
                t.expiries,
                t.ended,
                t.table_full,
                t.evictions,
                t.unparsed,
                if t.moved_in + t.moved_out > 0 {
                    format!(", {} moved out, {} moved in", t.moved_out, t.moved_in)
                } else {
                    String::new()
                }
            )?;
        }
        if t.table_full_sources.pairs().next().is_some() {
            let top: Vec<String> =
                t.table_full_sources.pairs().map(|(a, n)| format!("{} ({n})", std::net::Ipv4Addr::from(a))).collect();
            writeln!(f, "table-full   top sources: {}", top.join(", "))?;
        }
        let fr = &t.fragments;
        if fr.first + fr.orphans + fr.dropped() > 0 {
            writeln!(
                f,
                "fragments    {} datagrams, {} later fragments followed their first, {} without a first (port-less \
                 key), {} dropped ({} overlapping, {} past the limit), {} datagrams pushed out; {} IPv6 fragments",
                fr.first,
                fr.followed,
                fr.orphans,
                fr.dropped(),
                fr.overlaps,
                fr.too_many,
                fr.evicted,
                fr.v6
            )?;
        }
        if t.shared_capacity > 0 {
            writeln!(
                f,
                "shared       {} keys / {} capacity, {} table-full, {} lookups, {} packets via direct lookup (5-tuple table full)",
                t.shared_keys, t.shared_capacity, t.shared_table_full, t.shared_lookups, t.aux_fallbacks
            )?;
        }
        writeln!(f, "{:<14} {:>12} {:>12} {:>12}", "nf", "in", "out", "dropped")?;
        for n in &self.nfs {
            writeln!(
                f,
                "{:<14} {:>12} {:>12} {:>12}",
                n.name, n.counters.packets_in, n.counters.packets_out, n.counters.dropped
            )?;
        }
        // What each NF reported, merged over cores, one line per NF.
        for n in &self.nfs {
            if let Some(d) = &n.details {
                writeln!(f, "{:<14} {}", format!("{}:", n.name), compact_line(d))?;
            }
        }
        Ok(())
    }
}
