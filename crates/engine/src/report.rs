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

/// One core's figures.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CoreReport {
    /// Core index.
    pub core: usize,
    /// Packets received.
    pub packets: u64,
    /// Packets/s on this core, in millions (over its busy time).
    pub mpps: f64,
    /// TSC cycles per packet on this core.
    pub cycles_per_packet: f64,
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
    /// Exported NF state (not serialised in the report; written by `--export`).
    #[serde(skip)]
    pub exports: Vec<(String, Vec<serde_json::Value>)>,
}

fn spec_string(spec: &ChainSpec) -> String {
    spec.nfs
        .iter()
        .map(|n| {
            if n.params.is_empty() {
                n.name.clone()
            } else {
                let ps: Vec<String> = n.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
                format!("{}({})", n.name, ps.join(", "))
            }
        })
        .collect::<Vec<_>>()
        .join(" -> ")
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
            let secs = w.cycles as f64 / hz;
            r.per_core.push(CoreReport {
                core: w.core,
                packets: w.packets,
                mpps: if secs > 0.0 { w.packets as f64 / secs / 1e6 } else { 0.0 },
                cycles_per_packet: if w.packets > 0 { w.cycles as f64 / w.packets as f64 } else { 0.0 },
            });
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
        writeln!(f, "throughput   {:.2} Mpps, {:.2} Gbit/s", self.mpps, self.gbps)?;
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
                "core {:<7} {} packets, {:.2} Mpps, {:.1} cycles/pkt",
                c.core, c.packets, c.mpps, c.cycles_per_packet
            )?;
        }
        let t = &self.tables;
        if t.capacity > 0 {
            writeln!(
                f,
                "flow table   {} flows / {} capacity, {} insertions, {} expiries, {} ended, {} table-full, {} evictions, {} unparsed",
                t.flows, t.capacity, t.insertions, t.expiries, t.ended, t.table_full, t.evictions, t.unparsed
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
