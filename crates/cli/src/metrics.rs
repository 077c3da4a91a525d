//! `--metrics ADDR:PORT`: Prometheus text format for a live run, encoded by
//! `prometheus-client` from the run's live view at each scrape (no counter is
//! kept twice), served by a small bounded HTTP/1.1 server on one thread of
//! its own (see [`serve`]). Also the one-line status a terminal gets once a
//! second.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use flowplane_engine::live::{CoreSnap, Live};
use flowplane_io::port::{LinkState, Port, PortStats};
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
        ("table_full", table_full),
        ("dispatch_ring_full", ring_full),
        ("dispatch_oversize", oversize),
    ]
}

/// The input port, then the output ports.
fn ports(live: &Live) -> impl Iterator<Item = &Arc<dyn Port>> {
    std::iter::once(&live.input).chain(&live.outputs)
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
        // Interfaces not up are named on every line until they are back.
        let links: String = ports(live)
            .filter_map(|p| p.link().map(|w| (p.name(), w.stats().state)))
            .filter(|(_, st)| *st != LinkState::Up)
            .map(|(n, st)| format!("  link {n} {}", st.as_str()))
            .collect();
        format!(
            "{:>6.0}s  in {:.4} Mpps  out {:.4} Mpps  drops [{}]  load [{}]  flows {flows}/{cap}{links}",
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
            links.iter().flat_map(|(n, s)| {
                [("down", s.downs), ("gone", s.gone), ("reattached", s.reattached)]
                    .map(|(e, v)| (vec![("port", n.clone()), ("event", e.to_string())], v))
            }),
        )?;
        enc.encode_descriptor(
            "flowplane_ready",
            "1 once every worker (and the dispatcher) polls its queue: traffic sent from then on is received",
            None,
            MetricType::Gauge,
        )?
        .encode_gauge(&(live.ready.load(Ordering::Relaxed) as i64))?;
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
    Some(match render(live) {
        Ok(b) => ("200 OK", "application/openmetrics-text; version=1.0.0; charset=utf-8", b),
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
            if status.starts_with("405") { "Allow: GET\r\n" } else { "" },
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

/// Serves `render(live)` on `addr` until `stop` is raised: one thread, non-blocking
/// sockets, at most [`MAX_CONNS`] connections (a new one closes the oldest), each
/// closed after [`CONN_TIMEOUT`]. `GET /metrics` answers the metrics, `GET /` a link
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
