//! `--metrics ADDR:PORT`: a live run's metrics for Prometheus, encoded from
//! the run's live view at each scrape (no counter is kept twice), served by a
//! small bounded HTTP/1.1 server on one thread of its own (see [`serve`]).
//! Also the one-line status a terminal gets once a second.
//!
//! Formats, by the request's `Accept` header ([`wants_openmetrics`]):
//! OpenMetrics 1.0.0 (`application/openmetrics-text`, ends with `# EOF`) when
//! the client asks for it, as Prometheus does by default; otherwise the
//! Prometheus text format 0.0.4 (`text/plain; version=0.0.4`), which
//! `promtool check metrics` and older scrapers read. Both come from one
//! encoding (`prometheus-client`, which writes OpenMetrics); [`text_004`]
//! renames each counter's HELP/TYPE to its `_total` sample name (0.0.4 names a
//! family after its samples, OpenMetrics without the suffix) and drops the
//! `# UNIT` and `# EOF` lines 0.0.4 does not have. No `_created` sample is
//! written in either.
//!
//! Units: seconds, not TSC cycles (`flowplane_core_busy_seconds_total`,
//! `flowplane_batch_latency_seconds`), divided by the run's measured TSC
//! frequency ([`Live::hz`]). Prometheus's convention is base units: a
//! dashboard or alert then needs no per-host TSC rate to read them, they add
//! up and compare across machines, and `rate(busy_seconds_total)` is a core's
//! load directly. Cycles stay in the final report, where they are the
//! figure of merit.
//!
//! Families: per core `flowplane_core_*` and `flowplane_table_*`; per port
//! queue `flowplane_port_*`; `flowplane_drops_total{reason}` (packets lost,
//! and only those: an insert refused by a full table lets its packet pass
//! without state, counted in `flowplane_table_full_total`);
//! `flowplane_nf_{packets_in,packets_out,dropped,bytes_in}_total{nf,index}`
//! summed over cores; `flowplane_nf_stat{nf,index,core,name}`, every numeric
//! field of each NF's own report on each core ([`report_fields`]: nat's
//! mappings and exhausted pools, fw's connections, ddos's blocked sources; a
//! gauge, since a report mixes counts with levels such as ports in use);
//! `flowplane_nf_top{nf,index,list,key}` and
//! `flowplane_table_full_source_packets{src}`, the attribution lists
//! ([`attribution`]: nat's inside hosts by ports held and by new flows
//! refused, the sources a full flow table refused; at most 10 rows each, so
//! the label sets stay bounded whatever the traffic);
//! `flowplane_build_info{version}`; `flowplane_ready`; the batch latency
//! histogram; with `--replicate`, `flowplane_replication_records_total{event}`,
//! `flowplane_replication_lost_datagrams_total`,
//! `flowplane_replication_resyncs_total{direction}` and
//! `flowplane_replication_lag_p99_microseconds`.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use flowplane_engine::live::{CoreSnap, Live};
use flowplane_engine::report::fmt_rate;
use flowplane_io::port::{LinkState, Port, PortStats};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use serde_json::Value;

use crate::error::CliError;

/// Drop reasons, summed over ports and cores: (reason, packets). Packets lost only:
/// a full table's refused insert passes its packet (see [`table_full`]).
pub fn drops(live: &Live, cores: &[CoreSnap]) -> Vec<(&'static str, u64)> {
    let (rx, tx) = port_totals(live);
    let nf: u64 = cores.iter().map(|c| c.tx.dropped).sum();
    // Behind a dispatcher core: packets its workers' rings had no room for, and frames too large for its buffers.
    let dispatch = live.dispatch.lock().ok().and_then(|d| d.clone());
    let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let ring_full = dispatch.as_ref().map_or(0, |d| d.ring_full.iter().map(l).sum());
    let oversize = dispatch.as_ref().map_or(0, |d| l(&d.oversize));
    vec![
        ("rx_overrun", rx.rx_overrun),
        ("pool_empty", rx.rx_pool_empty),
        ("rx_oversize", rx.rx_oversize),
        ("tx_full", tx.tx_full),
        ("tx_error", tx.tx_errors),
        ("no_port", live.no_port.load(Ordering::Relaxed)),
        ("nf_verdict", nf),
        ("dispatch_ring_full", ring_full),
        ("dispatch_oversize", oversize),
    ]
}

/// Rows listed per attribution list (the NFs' own bound; nat's `TOP_HOSTS`).
pub const TOP_ROWS: usize = 10;

/// One NF's attribution list merged over cores: a top-level `top_*` array of its report whose rows are
/// `{KEY: "name", COUNT: n}` (nat's `top_hosts_by_ports` `{inside, ports}`, `top_hosts_refused`
/// `{inside, refused}`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NfList {
    /// The NF's chain position and name.
    pub index: usize,
    /// The NF's name.
    pub nf: String,
    /// The list's name in the report.
    pub list: String,
    /// The rows' key and count fields.
    pub key: String,
    /// The rows' count field.
    pub what: String,
    /// (key, count), most first (ties: key order), at most [`TOP_ROWS`].
    pub rows: Vec<(String, u64)>,
}

/// Who fills the flow table and the NFs' attribution lists (issue 33), summed by key over the cores'
/// last snapshots: (table-full sources as (address, packets), the NFs' lists). Cold: once per request.
pub fn attribution(cores: &[CoreSnap]) -> (Vec<(String, u64)>, Vec<NfList>) {
    let mut full = flowplane_engine::exec::TopSources::default();
    for c in cores {
        full.merge(&c.store.table_full_sources);
    }
    let full = full.pairs().map(|(a, n)| (std::net::Ipv4Addr::from(a).to_string(), n)).collect();
    let mut lists: Vec<NfList> = Vec::new();
    for c in cores {
        for (i, d) in c.nf_details.iter().enumerate() {
            let (Some(Value::Object(d)), Some((nf, _))) = (d, c.nfs.get(i)) else { continue };
            for (list, v) in d.iter().filter(|(k, _)| k.starts_with("top_")) {
                let Some(rows) = v.as_array() else { continue };
                let shape = |r: &Value| -> Option<(String, String, String, u64)> {
                    let o = r.as_object().filter(|o| o.len() == 2)?;
                    let (k, kv) = o.iter().find_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))?;
                    let (w, n) = o.iter().find_map(|(k, v)| v.as_u64().map(|n| (k.clone(), n)))?;
                    Some((k, kv, w, n))
                };
                for (key, name, what, n) in rows.iter().filter_map(shape) {
                    let at = lists.iter().position(|l| l.index == i && &l.list == list);
                    let l = match at {
                        Some(at) => &mut lists[at],
                        None => {
                            lists.push(NfList {
                                index: i,
                                nf: nf.clone(),
                                list: list.clone(),
                                key,
                                what,
                                rows: Vec::new(),
                            });
                            lists.last_mut().expect("pushed")
                        }
                    };
                    match l.rows.iter_mut().find(|r| r.0 == name) {
                        Some(r) => r.1 += n,
                        None => l.rows.push((name, n)),
                    }
                }
            }
        }
    }
    for l in &mut lists {
        l.rows.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        l.rows.truncate(TOP_ROWS);
    }
    lists.sort_by(|a, b| (a.index, &a.list).cmp(&(b.index, &b.list)));
    (full, lists)
}

/// Inserts a full flow table refused, summed over cores: those packets passed, without state.
pub fn table_full(cores: &[CoreSnap]) -> u64 {
    cores.iter().map(|c| c.store.table_full).sum()
}

/// The input port, then the output ports.
fn ports(live: &Live) -> impl Iterator<Item = &Arc<dyn Port>> {
    live.ports()
}

/// The input port's counters and the output ports' counters.
fn port_totals(live: &Live) -> (PortStats, PortStats) {
    let rx = live.input.as_ref().map(|i| i.stats()).unwrap_or_default();
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
    /// One line: the rate in/out over the last interval, drops by reason, per-core load, table occupancy. A replay
    /// (no ports) counts what its cores received and sent.
    pub fn line(&mut self, live: &Live, at: Duration) -> String {
        let cores = live.snapshots();
        let (mut rx, mut tx) = port_totals(live);
        if live.ports().next().is_none() {
            rx.rx_packets = cores.iter().map(|c| c.packets).sum();
            tx.tx_packets = cores.iter().map(|c| c.tx.sent).sum();
        }
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
        let full = match table_full(&cores) {
            0 => String::new(),
            n => format!(" (table full: {n} passed without state)"),
        };
        // Interfaces not up are named on every line until they are back.
        let links: String = ports(live)
            .filter_map(|p| p.link().map(|w| (p.name(), w.stats().state)))
            .filter(|(_, st)| *st != LinkState::Up)
            .map(|(n, st)| format!("  link {n} {}", st.as_str()))
            .collect();
        format!(
            "{:>6.0}s  in {}  out {}  drops [{}]  load [{}]  flows {flows}/{cap}{full}{links}",
            at.as_secs_f64(),
            fmt_rate(din as f64 / dt / 1e6),
            fmt_rate(dout as f64 / dt / 1e6),
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

/// Label pairs of one sample.
type Labels<'a> = Vec<(&'a str, String)>;

/// A counter family: `name` gets the `_total` suffix (and `_seconds` before it with a unit) from the encoder.
fn counter<'a, V: prometheus_client::encoding::EncodeCounterValue>(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    rows: impl IntoIterator<Item = (Labels<'a>, V)>,
) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, unit, MetricType::Counter)?;
    for (labels, v) in rows {
        m.encode_family(&labels)?.encode_counter::<NoLabelSet, _, u64>(&v, None)?;
    }
    Ok(())
}

fn gauge<'a, V: prometheus_client::encoding::EncodeGaugeValue>(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (Labels<'a>, V)>,
) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in rows {
        // No labels: no `{}` either.
        if labels.is_empty() {
            m.encode_gauge(&v)?;
        } else {
            m.encode_family(&labels)?.encode_gauge(&v)?;
        }
    }
    Ok(())
}

/// Latency bucket bounds in seconds (1 us .. 64 ms, x4), compared with the histogram's cycles at the run's TSC rate.
const LAT_BUCKETS_S: [f64; 9] = [1e-6, 4e-6, 16e-6, 64e-6, 256e-6, 1e-3, 4e-3, 16e-3, 64e-3];

/// Numeric fields exported per NF and core at most (a report's fields are a few dozen; this bounds a scrape).
const MAX_NF_STATS: usize = 256;

/// A number of an NF's report, kept exact when it is an integer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Num {
    U(u64),
    I(i64),
    F(f64),
}

impl From<Num> for Value {
    fn from(n: Num) -> Value {
        match n {
            Num::U(u) => u.into(),
            Num::I(i) => i.into(),
            Num::F(f) => f.into(),
        }
    }
}

impl prometheus_client::encoding::EncodeGaugeValue for Num {
    fn encode(&self, e: &mut prometheus_client::encoding::GaugeValueEncoder) -> fmt::Result {
        match *self {
            Num::U(v) => v.encode(e),
            Num::I(v) => v.encode(e),
            Num::F(v) => v.encode(e),
        }
    }
}

/// The numeric fields of an NF's report as (name, value), nested objects' names joined by `.`
/// (fw's `drops.policy`). Left out: strings and booleans, arrays (per-rule, per-backend and top-k
/// lists: the final report and `--export` carry them), and objects keyed by data rather than
/// names (upf's per-URR usage under `SEID/URR` keys), whose size grows with the traffic or the
/// rules, not with the NF's code. At most [`MAX_NF_STATS`] fields.
pub(crate) fn report_fields(v: &Value) -> Vec<(String, Num)> {
    fn walk(v: &Value, path: &mut String, out: &mut Vec<(String, Num)>) {
        match v {
            Value::Number(n) if !path.is_empty() && out.len() < MAX_NF_STATS => {
                let x = match (n.as_u64(), n.as_i64(), n.as_f64()) {
                    (Some(u), _, _) => Num::U(u),
                    (_, Some(i), _) => Num::I(i),
                    (_, _, Some(f)) if f.is_finite() => Num::F(f),
                    _ => return,
                };
                out.push((path.clone(), x));
            }
            Value::Object(m) if m.keys().all(|k| is_name(k)) => {
                for (k, x) in m {
                    let len = path.len();
                    if !path.is_empty() {
                        path.push('.');
                    }
                    path.push_str(k);
                    walk(x, path, out);
                    path.truncate(len);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(v, &mut String::new(), &mut out);
    out
}

/// A field name as an NF's code writes it (`[a-z_][a-z0-9_]*`, any case), not a key made of data.
fn is_name(k: &str) -> bool {
    let mut c = k.chars();
    c.next().is_some_and(|f| f.is_ascii_alphabetic() || f == '_') && c.all(|x| x.is_ascii_alphanumeric() || x == '_')
}

impl Collector for LiveCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let live = &self.0;
        let cores = live.snapshots();
        let hz = live.hz.max(1.0);
        let per_core = |f: &dyn Fn(&CoreSnap) -> u64| -> Vec<(Labels, u64)> {
            cores.iter().enumerate().map(|(i, c)| (vec![("core", i.to_string())], f(c))).collect()
        };
        gauge(
            &mut enc,
            "flowplane_build_info",
            "flowplane's version (always 1)",
            [(vec![("version", env!("CARGO_PKG_VERSION").to_string())], 1i64)],
        )?;
        counter(
            &mut enc,
            "flowplane_core_packets",
            "Packets received per worker core",
            None,
            per_core(&|c| c.packets),
        )?;
        counter(
            &mut enc,
            "flowplane_core_packets_out",
            "Packets transmitted per worker core",
            None,
            per_core(&|c| c.tx.sent),
        )?;
        counter(
            &mut enc,
            "flowplane_core_busy",
            "Time each worker core spent on batches, receive to transmit (idle polling excluded)",
            Some(&Unit::Seconds),
            cores.iter().enumerate().map(|(i, c)| (vec![("core", i.to_string())], c.busy_cycles as f64 / hz)),
        )?;
        let ports: Vec<Arc<dyn Port>> = live.ports().cloned().collect();
        let mut rows: [Vec<(Labels, u64)>; 4] = Default::default();
        for p in &ports {
            for (q, c) in p.counters().iter().enumerate() {
                let s = c.snapshot();
                let l = vec![("port", p.name()), ("queue", q.to_string())];
                for (r, v) in rows.iter_mut().zip([s.rx_packets, s.rx_bytes, s.tx_packets, s.tx_bytes]) {
                    r.push((l.clone(), v));
                }
            }
        }
        let [rx_p, rx_b, tx_p, tx_b] = rows;
        counter(&mut enc, "flowplane_port_rx_packets", "Packets received per port queue", None, rx_p)?;
        counter(&mut enc, "flowplane_port_rx_bytes", "Bytes received per port queue", None, rx_b)?;
        counter(&mut enc, "flowplane_port_tx_packets", "Packets transmitted per port queue", None, tx_p)?;
        counter(&mut enc, "flowplane_port_tx_bytes", "Bytes transmitted per port queue", None, tx_b)?;
        let links: Vec<_> = ports.iter().filter_map(|p| p.link().map(|w| (p.name(), w.stats()))).collect();
        gauge(
            &mut enc,
            "flowplane_port_link_up",
            "1 if the port's interface is up with carrier, 0 if down or gone",
            links.iter().map(|(n, s)| (vec![("port", n.clone())], (s.state == LinkState::Up) as i64)),
        )?;
        counter(
            &mut enc,
            "flowplane_port_link_events",
            "Interface events per port: down (link lost), gone (deleted), reattached (re-created, queues re-opened)",
            None,
            links.iter().flat_map(|(n, s)| {
                [("down", s.downs), ("gone", s.gone), ("reattached", s.reattached)]
                    .map(|(e, v)| (vec![("port", n.clone()), ("event", e.to_string())], v))
            }),
        )?;
        if let Some(r) = live.repl.lock().ok().and_then(|r| r.clone()) {
            let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
            counter(
                &mut enc,
                "flowplane_replication_records",
                "State replication (--replicate): records sent, received, imported, deleted, refused by the import, lost to a full queue",
                None,
                [
                    ("sent", l(&r.sent_records)),
                    ("received", l(&r.received_records)),
                    ("imported", l(&r.imported)),
                    ("deleted", l(&r.deleted)),
                    ("refused", l(&r.refused)),
                    ("queue_lost", l(&r.queue_lost)),
                ]
                .map(|(e, v)| (vec![("event", e.to_string())], v)),
            )?;
            counter(
                &mut enc,
                "flowplane_replication_lost_datagrams",
                "Datagrams missing from the peer's sequence (each gap asks for a resync)",
                None,
                [(vec![("from", "peer".to_string())], l(&r.lost_datagrams))],
            )?;
            counter(
                &mut enc,
                "flowplane_replication_resyncs",
                "Bulk resyncs requested from the peer (requested) and walks started for the peer (served)",
                None,
                [("requested", l(&r.resyncs_requested)), ("served", l(&r.resyncs_served))]
                    .map(|(e, v)| (vec![("direction", e.to_string())], v)),
            )?;
            gauge(
                &mut enc,
                "flowplane_replication_lag_p99_microseconds",
                "p99 of the received records' lag (arrival minus the datagram's send time, wall clocks)",
                [(Vec::new(), l(&r.lag_p99_us) as i64)],
            )?;
        }
        gauge(
            &mut enc,
            "flowplane_ready",
            "1 once every worker (and the dispatcher) polls its queue: traffic sent from then on is received",
            [(Vec::new(), live.ready.load(Ordering::Relaxed) as i64)],
        )?;
        counter(
            &mut enc,
            "flowplane_drops",
            "Packets lost, by reason (ports, NF verdicts, the dispatcher); a full table is not a drop",
            None,
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
        let nf_labels = |i: usize, n: &str| vec![("nf", n.to_string()), ("index", i.to_string())];
        let per_nf = |f: &dyn Fn(&flowplane_nf::NfCounters) -> u64| -> Vec<(Labels, u64)> {
            nfs.iter().enumerate().map(|(i, (n, k))| (nf_labels(i, n), f(k))).collect()
        };
        counter(&mut enc, "flowplane_nf_packets_in", "Packets that reached each NF", None, per_nf(&|k| k.packets_in))?;
        counter(&mut enc, "flowplane_nf_packets_out", "Packets each NF passed on", None, per_nf(&|k| k.packets_out))?;
        counter(&mut enc, "flowplane_nf_dropped", "Packets each NF dropped", None, per_nf(&|k| k.dropped))?;
        counter(&mut enc, "flowplane_nf_bytes_in", "Bytes that reached each NF", None, per_nf(&|k| k.bytes_in))?;
        let mut stats = Vec::new();
        for (core, c) in cores.iter().enumerate() {
            for (i, d) in c.nf_details.iter().enumerate() {
                let (Some(d), Some((n, _))) = (d, c.nfs.get(i)) else { continue };
                for (name, v) in report_fields(d) {
                    let mut l = nf_labels(i, n);
                    l.extend([("core", core.to_string()), ("name", name)]);
                    stats.push((l, v));
                }
            }
        }
        gauge(
            &mut enc,
            "flowplane_nf_stat",
            "Each numeric field of each NF's own report, per core, as the final report names it (counts and levels)",
            stats,
        )?;
        let (full, lists) = attribution(&cores);
        gauge(
            &mut enc,
            "flowplane_table_full_source_packets",
            "Packets a full flow table refused an entry, by source: the top sources summed over cores (at most 10)",
            full.into_iter().map(|(a, n)| (vec![("src", a)], n)),
        )?;
        gauge(
            &mut enc,
            "flowplane_nf_top",
            "An NF's attribution lists summed over cores, at most 10 rows each (nat: top_hosts_by_ports, ports held \
             per inside host; top_hosts_refused, new flows refused per inside host for an exhausted pool)",
            lists.iter().flat_map(|l| {
                l.rows.iter().map(|(k, n)| {
                    let mut lab = nf_labels(l.index, &l.nf);
                    lab.extend([("list", l.list.clone()), ("key", k.clone())]);
                    (lab, *n)
                })
            }),
        )?;
        gauge(&mut enc, "flowplane_table_flows", "Live flow entries per core", per_core(&|c| c.store.flows))?;
        gauge(&mut enc, "flowplane_table_capacity", "Flow table capacity per core", per_core(&|c| c.store.capacity))?;
        counter(
            &mut enc,
            "flowplane_table_insertions",
            "Flow entries inserted per core",
            None,
            per_core(&|c| c.store.insertions),
        )?;
        counter(
            &mut enc,
            "flowplane_table_expiries",
            "Flow entries expired per core",
            None,
            per_core(&|c| c.store.expiries),
        )?;
        counter(
            &mut enc,
            "flowplane_table_full",
            "Inserts refused because the flow table was full, per core: the packet passed without state (not a drop)",
            None,
            per_core(&|c| c.store.table_full),
        )?;
        let mut h = flowplane_engine::hist::Histogram::default();
        for c in &cores {
            if let Some(l) = &c.latency {
                h.merge(l);
            }
        }
        // prometheus-client wants per-bucket counts and accumulates them itself.
        let mut prev = 0;
        let per_bucket: Vec<(f64, u64)> = LAT_BUCKETS_S
            .iter()
            .map(|&s| (s, h.count_below((s * hz) as u64)))
            .chain(std::iter::once((f64::INFINITY, h.count())))
            .map(|(le, cum)| {
                let d = cum.saturating_sub(prev);
                prev = cum;
                (le, d)
            })
            .collect();
        let m = enc.encode_descriptor(
            "flowplane_batch_latency",
            "Receive-to-transmit time per batch (all cores)",
            Some(&Unit::Seconds),
            MetricType::Histogram,
        )?;
        HistMetric(h.sum_approx() / hz, h.count(), per_bucket).encode(m)?;
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

/// The content type of each format.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const TEXT_004: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The metrics of `live` now: OpenMetrics, or the Prometheus text format 0.0.4 ([`text_004`]).
pub fn render(live: &Arc<Live>, openmetrics: bool) -> Result<String, CliError> {
    let mut reg = Registry::default();
    reg.register_collector(Box::new(LiveCollector(Arc::clone(live))));
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &reg).map_err(|e| CliError::new(format!("metrics: {e}")))?;
    Ok(if openmetrics { out } else { text_004(&out) })
}

/// OpenMetrics text (as `prometheus-client` writes it) as Prometheus text 0.0.4: a counter
/// family's HELP and TYPE take its samples' `_total` name (0.0.4 matches a family to its
/// samples by name, so `# TYPE x counter` over `x_total` leaves the samples untyped and
/// `promtool` reports them), `unknown` becomes `untyped`, and the `# UNIT` and `# EOF`
/// lines go. HELP texts here hold no `\` or `"`, which the two formats escape differently.
pub(crate) fn text_004(om: &str) -> String {
    let mut out = String::with_capacity(om.len());
    let mut help: Option<&str> = None;
    for line in om.lines() {
        if let Some(h) = line.strip_prefix("# HELP ") {
            help = Some(h);
        } else if let Some(t) = line.strip_prefix("# TYPE ") {
            let (name, kind) = t.split_once(' ').unwrap_or((t, "untyped"));
            let (suffix, kind) = match kind {
                "counter" => ("_total", kind),
                "unknown" => ("", "untyped"),
                k => ("", k),
            };
            if let Some(h) = help.take() {
                let text = h.strip_prefix(name).unwrap_or(h);
                out.push_str(&format!("# HELP {name}{suffix}{text}\n"));
            }
            out.push_str(&format!("# TYPE {name}{suffix} {kind}\n"));
        } else if !(line.starts_with("# UNIT ") || line == "# EOF") {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Whether a request head's `Accept` header asks for OpenMetrics: an
/// `application/openmetrics-text` range with q > 0 and no q below what the
/// head gives `text/plain` (`text/*`, `*/*`). Prometheus asks for it first
/// by default; no header, curl's `*/*` or a `text/plain` preference get 0.0.4.
pub(crate) fn wants_openmetrics(head: &str) -> bool {
    let (mut om, mut text) = (0.0f64, 0.0f64);
    for line in head.lines().skip(1) {
        let Some((name, value)) = line.split_once(':') else { continue };
        if !name.trim().eq_ignore_ascii_case("accept") {
            continue;
        }
        for range in value.split(',') {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
            let q = parts
                .filter_map(|p| p.split_once('='))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("q"))
                .map_or(1.0, |(_, v)| v.trim().parse::<f64>().unwrap_or(0.0).clamp(0.0, 1.0));
            match media.as_str() {
                "application/openmetrics-text" => om = om.max(q),
                "text/plain" | "text/*" | "*/*" => text = text.max(q),
                _ => {}
            }
        }
    }
    om > 0.0 && om >= text
}

/// Connections open at once; the oldest is closed to make room for a new one.
const MAX_CONNS: usize = 64;
/// A connection must have sent its request and taken the answer within this time.
const CONN_TIMEOUT: Duration = Duration::from_secs(2);
/// Bytes of request line and headers read at most (the body, if any, is never read).
const MAX_HEAD: usize = 8 << 10;
/// The server's sleep when nothing happened with connections open (a request waits at most
/// this long to be read), and with none (a new connection waits at most this long to be accepted).
const IDLE_NAP: Duration = Duration::from_millis(5);
const EMPTY_NAP: Duration = Duration::from_millis(20);

/// One client connection: its request so far, then the answer being written.
struct Conn {
    s: std::net::TcpStream,
    since: std::time::Instant,
    head: Vec<u8>,
    out: Vec<u8>,
    sent: usize,
}

/// The answer to a request head: (status line, content type, body); None while the head is incomplete.
fn answer(head: &[u8], live: &Arc<Live>) -> Option<(&'static str, &'static str, String)> {
    let end = head.windows(4).position(|w| w == b"\r\n\r\n").or_else(|| head.windows(2).position(|w| w == b"\n\n"));
    if end.is_none() {
        if head.len() >= MAX_HEAD {
            return Some(("431 Request Header Fields Too Large", "text/plain", "request head too large\n".into()));
        }
        return None;
    }
    let text = String::from_utf8_lossy(head);
    let line = text.lines().next().unwrap_or("");
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Some(("400 Bad Request", "text/plain", "bad request line\n".into()));
    };
    if !version.starts_with("HTTP/1.") {
        return Some(("400 Bad Request", "text/plain", "HTTP/1.x only\n".into()));
    }
    let path = target.split('?').next().unwrap_or("");
    if path != "/metrics" && path != "/" {
        return Some(("404 Not Found", "text/plain", "not found: GET /metrics\n".into()));
    }
    if method != "GET" {
        return Some(("405 Method Not Allowed", "text/plain", "GET only\n".into()));
    }
    if path == "/" {
        return Some(("200 OK", "text/html", "<html><body><a href=\"/metrics\">/metrics</a></body></html>\n".into()));
    }
    let om = wants_openmetrics(&text);
    Some(match render(live, om) {
        Ok(b) => ("200 OK", if om { OPENMETRICS } else { TEXT_004 }, b),
        Err(e) => ("500 Internal Server Error", "text/plain", format!("{e}\n")),
    })
}

/// Advances one connection (non-blocking): reads its head, answers, writes. False once it is done.
fn step(c: &mut Conn, live: &Arc<Live>, now: std::time::Instant) -> (bool, bool) {
    use std::io::{ErrorKind, Read, Write};
    if now.duration_since(c.since) > CONN_TIMEOUT {
        return (false, false);
    }
    let mut moved = false;
    if c.out.is_empty() {
        let mut buf = [0u8; 1024];
        loop {
            let room = MAX_HEAD - c.head.len();
            match c.s.read(&mut buf[..room.min(1024)]) {
                Ok(0) => return (false, true),
                Ok(n) => {
                    moved = true;
                    c.head.extend_from_slice(&buf[..n]);
                    if c.head.len() >= MAX_HEAD {
                        break;
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(_) => return (false, true),
            }
        }
        let Some((status, ctype, body)) = answer(&c.head, live) else { return (true, moved) };
        c.out = format!(
            "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n{}\r\n",
            body.len(),
            match status {
                s if s.starts_with("405") => "Allow: GET\r\n",
                // The body depends on the Accept header (caches between must key on it).
                "200 OK" => "Vary: Accept\r\n",
                _ => "",
            },
        )
        .into_bytes();
        c.out.extend_from_slice(body.as_bytes());
        moved = true;
    }
    while c.sent < c.out.len() {
        match c.s.write(&c.out[c.sent..]) {
            Ok(0) => return (false, true),
            Ok(n) => {
                c.sent += n;
                moved = true;
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return (true, moved),
            Err(_) => return (false, true),
        }
    }
    let _ = c.s.shutdown(std::net::Shutdown::Write);
    (false, true)
}

/// Serves `render(live, ...)` on `addr` until `stop` is raised: one thread, non-blocking
/// sockets, at most [`MAX_CONNS`] connections (a new one closes the oldest), each
/// closed after [`CONN_TIMEOUT`]. `GET /metrics` answers the metrics (the format by
/// `Accept`: [`wants_openmetrics`]), `GET /` a link
/// to them; other paths 404, other methods 405, one request per connection.
///
/// Why not a thread per connection (tiny_http did that): idle connections then cost a
/// thread each with no timeout, and a failed spawn took the endpoint down for good.
/// Here an idle connection costs a socket and a read attempt per turn, for 2 s at most.
pub fn serve(addr: &str, live: Arc<Live>, stop: Arc<AtomicBool>) -> Result<std::thread::JoinHandle<()>, CliError> {
    let listener = std::net::TcpListener::bind(addr).map_err(|e| CliError::new(format!("--metrics {addr}: {e}")))?;
    listener.set_nonblocking(true).map_err(|e| CliError::new(format!("--metrics {addr}: {e}")))?;
    std::thread::Builder::new()
        .name("fp-metrics".to_string())
        .spawn(move || {
            let mut conns: std::collections::VecDeque<Conn> = std::collections::VecDeque::with_capacity(MAX_CONNS);
            while !stop.load(Ordering::Relaxed) {
                let mut busy = false;
                let now = std::time::Instant::now();
                // Accept everything pending; past the cap the oldest connection makes room.
                loop {
                    match listener.accept() {
                        Ok((s, _)) => {
                            busy = true;
                            if s.set_nonblocking(true).is_err() {
                                continue;
                            }
                            let _ = s.set_nodelay(true);
                            if conns.len() >= MAX_CONNS {
                                conns.pop_front();
                            }
                            conns.push_back(Conn { s, since: now, head: Vec::new(), out: Vec::new(), sent: 0 });
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        // WouldBlock, or a transient error (EMFILE, ECONNABORTED): try again next turn.
                        Err(_) => break,
                    }
                }
                conns.retain_mut(|c| {
                    let (keep, moved) = step(c, &live, now);
                    busy |= moved;
                    keep
                });
                if !busy {
                    std::thread::sleep(if conns.is_empty() { EMPTY_NAP } else { IDLE_NAP });
                }
            }
        })
        .map_err(|e| CliError::new(format!("--metrics: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `prometheus-client` writes (OpenMetrics), as 0.0.4 wants it: counters' HELP/TYPE
    /// under their `_total` sample name, no UNIT, no EOF; other families untouched.
    #[test]
    fn openmetrics_to_text_004() {
        let om = "# HELP a_packets Packets.\n# TYPE a_packets counter\na_packets_total{core=\"0\"} 3\n\
                  # HELP a_busy_seconds Busy.\n# TYPE a_busy_seconds counter\n# UNIT a_busy_seconds seconds\n\
                  a_busy_seconds_total 0.5\n# HELP a_up Up.\n# TYPE a_up gauge\na_up 1\n\
                  # HELP a_lat_seconds Lat.\n# TYPE a_lat_seconds histogram\n# UNIT a_lat_seconds seconds\n\
                  a_lat_seconds_sum 0.1\na_lat_seconds_count 2\na_lat_seconds_bucket{le=\"+Inf\"} 2\n\
                  # HELP a_x X.\n# TYPE a_x unknown\na_x 7\n# EOF\n";
        let want = "# HELP a_packets_total Packets.\n# TYPE a_packets_total counter\na_packets_total{core=\"0\"} 3\n\
                    # HELP a_busy_seconds_total Busy.\n# TYPE a_busy_seconds_total counter\na_busy_seconds_total 0.5\n\
                    # HELP a_up Up.\n# TYPE a_up gauge\na_up 1\n\
                    # HELP a_lat_seconds Lat.\n# TYPE a_lat_seconds histogram\n\
                    a_lat_seconds_sum 0.1\na_lat_seconds_count 2\na_lat_seconds_bucket{le=\"+Inf\"} 2\n\
                    # HELP a_x X.\n# TYPE a_x untyped\na_x 7\n";
        assert_eq!(text_004(om), want);
    }

    fn head(accept: Option<&str>) -> String {
        let a = accept.map_or(String::new(), |a| format!("Accept: {a}\r\n"));
        format!("GET /metrics HTTP/1.1\r\nHost: x\r\n{a}\r\n")
    }

    #[test]
    fn accept_header_picks_the_format() {
        // Prometheus 2.x and 3.x defaults.
        for a in [
            "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,\
             text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
            "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,\
             text/plain;version=0.0.4;q=0.3,*/*;q=0.2",
            "Application/OpenMetrics-Text",
        ] {
            assert!(wants_openmetrics(&head(Some(a))), "{a}");
        }
        assert!(wants_openmetrics("GET /metrics HTTP/1.1\r\naccept:application/openmetrics-text\r\n\r\n"));
        for a in [
            None,
            Some("*/*"),
            Some("text/plain;version=0.0.4"),
            Some("application/openmetrics-text;q=0, text/plain"),
            Some("application/openmetrics-text;q=0.5, */*"),
            Some("application/json"),
        ] {
            assert!(!wants_openmetrics(&head(a)), "{a:?}");
        }
        // The request line is not a header, even when its target says openmetrics.
        assert!(!wants_openmetrics("GET /accept:application/openmetrics-text HTTP/1.1\r\n\r\n"));
    }

    #[test]
    fn report_fields_are_the_numbers_under_names() {
        let r = serde_json::json!({
            "k": 10, "mode": "drop", "on": true, "none": null, "neg": -3, "ratio": 0.25,
            "drops": {"policy": 2, "deep": {"x": 1}},
            "top": [{"bytes": 5}],
            "usage": {"10/1": {"ul_packets": 4}},
            "by_id": {"7": 1},
        });
        let mut got = report_fields(&r);
        got.sort_by(|a, b| a.0.cmp(&b.0));
        let want = [
            ("drops.deep.x", Num::U(1)),
            ("drops.policy", Num::U(2)),
            ("k", Num::U(10)),
            ("neg", Num::I(-3)),
            ("ratio", Num::F(0.25)),
        ];
        assert_eq!(got, want.map(|(n, v)| (n.to_string(), v)));
        assert!(report_fields(&serde_json::json!(5)).is_empty(), "a bare number has no name");
        let many: serde_json::Map<String, Value> = (0..1000).map(|i| (format!("f{i}"), serde_json::json!(i))).collect();
        assert_eq!(report_fields(&Value::Object(many)).len(), MAX_NF_STATS);
    }
}
