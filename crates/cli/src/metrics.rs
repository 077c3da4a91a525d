//! `--metrics ADDR:PORT`: Prometheus text format for a live run, encoded by
//! `prometheus-client` from the run's live view at each scrape (no counter is
//! kept twice), served by `tiny_http` on a thread of its own. Also the
//! one-line status a terminal gets once a second.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use flowplane_engine::live::{CoreSnap, Live};
use flowplane_io::port::PortStats;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::error::CliError;

/// Drop reasons, summed over ports and cores: (reason, packets).
pub fn drops(live: &Live, cores: &[CoreSnap]) -> Vec<(&'static str, u64)> {
    let (rx, tx) = port_totals(live);
    let nf: u64 = cores.iter().map(|c| c.tx.dropped).sum();
    let table_full: u64 = cores.iter().map(|c| c.store.table_full).sum();
    vec![
        ("rx_overrun", rx.rx_overrun),
        ("pool_empty", rx.rx_pool_empty),
        ("rx_oversize", rx.rx_oversize),
        ("tx_full", tx.tx_full),
        ("tx_error", tx.tx_errors),
        ("no_port", live.no_port.load(Ordering::Relaxed)),
        ("nf_verdict", nf),
        ("table_full", table_full),
    ]
}

/// The input port's counters and the output ports' counters.
fn port_totals(live: &Live) -> (PortStats, PortStats) {
    let rx = live.input.stats();
    let mut tx = PortStats::default();
    for p in &live.outputs {
        tx.merge(&p.stats());
    }
    (rx, tx)
}

/// The status line's memory between two ticks.
#[derive(Default)]
pub struct Status {
    last: Option<(Duration, u64, u64, Vec<u64>)>,
}

impl Status {
    /// One line: Mpps in/out over the last interval, drops by reason, per-core load, table occupancy.
    pub fn line(&mut self, live: &Live, at: Duration) -> String {
        let cores = live.snapshots();
        let (rx, tx) = port_totals(live);
        let busy: Vec<u64> = cores.iter().map(|c| c.busy_cycles).collect();
        let (din, dout, dt, loads) = match &self.last {
            Some((t, i, o, b)) => {
                let dt = (at - *t).as_secs_f64().max(1e-3);
                let loads = busy
                    .iter()
                    .zip(b)
                    .map(|(&x, &y)| (x.saturating_sub(y) as f64 / (live.hz * dt) * 100.0).min(100.0))
                    .collect();
                (rx.rx_packets - i, tx.tx_packets - o, dt, loads)
            }
            None => (rx.rx_packets, tx.tx_packets, at.as_secs_f64().max(1e-3), vec![0.0; busy.len()]),
        };
        self.last = Some((at, rx.rx_packets, tx.tx_packets, busy));
        let flows: u64 = cores.iter().map(|c| c.store.flows).sum();
        let cap: u64 = cores.iter().map(|c| c.store.capacity).sum();
        let drops: Vec<String> =
            drops(live, &cores).into_iter().filter(|d| d.1 > 0).map(|(r, n)| format!("{r} {n}")).collect();
        let load: Vec<String> = loads.iter().enumerate().map(|(i, l)| format!("c{i} {l:.0}%")).collect();
        format!(
            "{:>6.0}s  in {:.4} Mpps  out {:.4} Mpps  drops [{}]  load [{}]  flows {flows}/{cap}",
            at.as_secs_f64(),
            din as f64 / dt / 1e6,
            dout as f64 / dt / 1e6,
            if drops.is_empty() { "none".to_string() } else { drops.join(", ") },
            load.join(" "),
        )
    }
}

/// Encodes the live view at each scrape.
struct LiveCollector(Arc<Live>);

impl fmt::Debug for LiveCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LiveCollector")
    }
}

fn counter<'a>(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (Vec<(&'a str, String)>, u64)>,
) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, v) in rows {
        m.encode_family(&labels)?.encode_counter::<NoLabelSet, _, u64>(&v, None)?;
    }
    Ok(())
}

fn gauge<'a>(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (Vec<(&'a str, String)>, i64)>,
) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in rows {
        m.encode_family(&labels)?.encode_gauge(&v)?;
    }
    Ok(())
}

/// Latency buckets in TSC cycles (1K .. 16M).
const LAT_BUCKETS: [u64; 8] = [1_000, 4_000, 16_000, 64_000, 256_000, 1_000_000, 4_000_000, 16_000_000];

impl Collector for LiveCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let live = &self.0;
        let cores = live.snapshots();
        let per_core = |f: &dyn Fn(&CoreSnap) -> u64| -> Vec<(Vec<(&str, String)>, u64)> {
            cores.iter().enumerate().map(|(i, c)| (vec![("core", i.to_string())], f(c))).collect()
        };
        counter(&mut enc, "flowplane_core_packets", "Packets received per worker core", per_core(&|c| c.packets))?;
        counter(
            &mut enc,
            "flowplane_core_packets_out",
            "Packets transmitted per worker core",
            per_core(&|c| c.tx.sent),
        )?;
        counter(
            &mut enc,
            "flowplane_core_busy_cycles",
            "TSC cycles spent on batches per core",
            per_core(&|c| c.busy_cycles),
        )?;
        let mut ports = vec![Arc::clone(&live.input)];
        ports.extend(live.outputs.iter().cloned());
        let mut rows_rx = Vec::new();
        let mut rows_tx = Vec::new();
        for p in &ports {
            for (q, c) in p.counters().iter().enumerate() {
                let s = c.snapshot();
                let l = vec![("port", p.name()), ("queue", q.to_string())];
                rows_rx.push((l.clone(), s.rx_packets));
                rows_tx.push((l, s.tx_packets));
            }
        }
        counter(&mut enc, "flowplane_port_rx_packets", "Packets received per port queue", rows_rx)?;
        counter(&mut enc, "flowplane_port_tx_packets", "Packets transmitted per port queue", rows_tx)?;
        counter(
            &mut enc,
            "flowplane_drops",
            "Packets dropped, by reason (table_full: inserts refused, the packet passes without state)",
            drops(live, &cores).into_iter().map(|(r, n)| (vec![("reason", r.to_string())], n)),
        )?;
        let mut nfs: Vec<(String, flowplane_nf::NfCounters)> = Vec::new();
        for c in &cores {
            for (i, (n, k)) in c.nfs.iter().enumerate() {
                if nfs.len() <= i {
                    nfs.push((n.clone(), *k));
                } else {
                    nfs[i].1.merge(k);
                }
            }
        }
        let per_nf = |f: &dyn Fn(&flowplane_nf::NfCounters) -> u64| -> Vec<(Vec<(&str, String)>, u64)> {
            nfs.iter()
                .enumerate()
                .map(|(i, (n, k))| (vec![("nf", n.clone()), ("index", i.to_string())], f(k)))
                .collect()
        };
        counter(&mut enc, "flowplane_nf_packets_in", "Packets that reached each NF", per_nf(&|k| k.packets_in))?;
        counter(&mut enc, "flowplane_nf_packets_out", "Packets each NF passed on", per_nf(&|k| k.packets_out))?;
        counter(&mut enc, "flowplane_nf_dropped", "Packets each NF dropped", per_nf(&|k| k.dropped))?;
        gauge(
            &mut enc,
            "flowplane_table_flows",
            "Live flow entries per core",
            per_core(&|c| c.store.flows).into_iter().map(|(l, v)| (l, v as i64)),
        )?;
        gauge(
            &mut enc,
            "flowplane_table_capacity",
            "Flow table capacity per core",
            per_core(&|c| c.store.capacity).into_iter().map(|(l, v)| (l, v as i64)),
        )?;
        counter(
            &mut enc,
            "flowplane_table_insertions",
            "Flow entries inserted per core",
            per_core(&|c| c.store.insertions),
        )?;
        counter(
            &mut enc,
            "flowplane_table_expiries",
            "Flow entries expired per core",
            per_core(&|c| c.store.expiries),
        )?;
        counter(
            &mut enc,
            "flowplane_table_full",
            "Inserts refused because the table was full, per core",
            per_core(&|c| c.store.table_full),
        )?;
        let mut h = flowplane_engine::hist::Histogram::default();
        for c in &cores {
            if let Some(l) = &c.latency {
                h.merge(l);
            }
        }
        let buckets: Vec<(f64, u64)> = LAT_BUCKETS
            .iter()
            .map(|&b| (b as f64, h.count_below(b)))
            .chain(std::iter::once((f64::INFINITY, h.count())))
            .collect();
        // prometheus-client wants per-bucket counts and accumulates them itself.
        let mut prev = 0;
        let per_bucket: Vec<(f64, u64)> = buckets
            .iter()
            .map(|&(le, cum)| {
                let d = cum.saturating_sub(prev);
                prev = cum;
                (le, d)
            })
            .collect();
        let m = enc.encode_descriptor(
            "flowplane_batch_latency_cycles",
            "Receive-to-transmit TSC cycles per batch (all cores)",
            None,
            MetricType::Histogram,
        )?;
        HistMetric(h.sum_approx(), h.count(), per_bucket).encode(m)?;
        Ok(())
    }
}

/// A histogram given by its sum, count and per-bucket counts.
#[derive(Debug)]
struct HistMetric(f64, u64, Vec<(f64, u64)>);

impl EncodeMetric for HistMetric {
    fn encode(&self, mut m: prometheus_client::encoding::MetricEncoder) -> fmt::Result {
        m.encode_histogram::<NoLabelSet>(self.0, self.1, &self.2, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// The Prometheus text of `live` now.
pub fn render(live: &Arc<Live>) -> Result<String, CliError> {
    let mut reg = Registry::default();
    reg.register_collector(Box::new(LiveCollector(Arc::clone(live))));
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &reg).map_err(|e| CliError::new(format!("metrics: {e}")))?;
    Ok(out)
}

/// Serves `render(live)` on `addr` until `stop` is raised (a thread of its own).
pub fn serve(addr: &str, live: Arc<Live>, stop: Arc<AtomicBool>) -> Result<std::thread::JoinHandle<()>, CliError> {
    let server = tiny_http::Server::http(addr).map_err(|e| CliError::new(format!("--metrics {addr}: {e}")))?;
    std::thread::Builder::new()
        .name("fp-metrics".to_string())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let Ok(Some(req)) = server.recv_timeout(Duration::from_millis(100)) else { continue };
                let (code, body) = match render(&live) {
                    Ok(b) => (200, b),
                    Err(e) => (500, e.to_string()),
                };
                let ct = tiny_http::Header::from_bytes(
                    &b"Content-Type"[..],
                    &b"application/openmetrics-text; version=1.0.0; charset=utf-8"[..],
                );
                let mut resp = tiny_http::Response::from_string(body).with_status_code(code);
                if let Ok(h) = ct {
                    resp = resp.with_header(h);
                }
                let _ = req.respond(resp);
            }
        })
        .map_err(|e| CliError::new(format!("--metrics: {e}")))
}
