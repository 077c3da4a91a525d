//! The IPFIX exporter (RFC 7011; `flowplane run --ipfix udp:HOST:PORT`):
//! one background thread per run, off the data path. NFs that declare
//! `StatefulNf::IPFIX` get one bounded record queue per core (an `rtrb`
//! ring, [`flowplane_nf::ipfix::RecordTx`]); the engine tells them of flow
//! ends (idle expiry — a flow already idle at the run's last packet time
//! included —, ends requested by an NF, eviction from a full table
//! (`--table-full evict`: before the entry is reused), the run's end) and
//! of the active timeout (a paced walk over the flow table,
//! `ExecContext::active_sweep`). Feeders: fsc, hh, lb, conntrack, fw (flow
//! records; lb's carry the backend), nat (RFC 8158 events) and upf (usage
//! records: a batch element, given its queue and the active timeout through
//! `Nf::attach_ipfix`, keeps its own timer on the batch's time and sends
//! deltas; told of the run's end through `Nf::ipfix_end`).
//! A full queue counts the record as lost; a worker never waits.
//!
//! The thread drains the queues, turns packet-clock times into
//! milliseconds since the epoch (packet time 0 = the trace's first packet,
//! or the run's start), turns the NFs' running totals into deltas (a flow
//! reported at an active timeout is remembered until its last record), and
//! writes messages of at most [`MAX_MESSAGE`] bytes with the
//! `flowplane_wire::ipfix` templates: sent in the first message, then again
//! every [`TEMPLATE_REFRESH`] (UDP collectors may have missed them), to
//! every collector. One observation domain (id 1) per run, its sequence
//! number counting the data records sent before each message. UDP sends one
//! datagram per message; TCP and file collectors are buffered (64 KiB, handed
//! to the kernel whenever the exporter is idle). The report carries the
//! exporter thread's CPU time: records per second of it is the exporter's own
//! rate (`bench pipeline --only ipfix`).

use std::collections::HashMap;
use std::io::Write;
use std::net::{TcpStream, ToSocketAddrs, UdpSocket};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use flowplane_nf::ipfix::{EndReason, ExportRecord, RecordTx};
use flowplane_wire::flow::FiveTuple;
use flowplane_wire::ipfix::{templates, FlowRecord, HeaderRepr, MessageBuilder, NatRecord, TemplateRepr, UsageRecord};
use serde::Serialize;

use crate::error::EngineError;

/// Largest message written (fits a 1500-byte MTU with IP and UDP headers).
pub const MAX_MESSAGE: usize = 1400;
/// How often templates are sent again.
pub const TEMPLATE_REFRESH: Duration = Duration::from_secs(2);
/// Records per core's queue by default.
pub const DEFAULT_QUEUE: usize = 1 << 16;
/// The observation domain id of a run.
pub const DOMAIN: u32 = 1;

/// Where records go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Collector {
    /// `udp:HOST:PORT`.
    Udp(String),
    /// `tcp:HOST:PORT` (one connection, templates first).
    Tcp(String),
    /// `file:PATH`: the messages one after the other (an IPFIX file, RFC 5655's layout).
    File(PathBuf),
}

impl std::str::FromStr for Collector {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("--ipfix '{s}': expected udp:HOST:PORT, tcp:HOST:PORT or file:PATH");
        let (kind, rest) = s.split_once(':').ok_or_else(bad)?;
        let addr = |r: &str| -> Result<String, String> {
            let (h, p) = r.rsplit_once(':').ok_or_else(bad)?;
            if h.is_empty() || p.parse::<u16>().map_or(true, |p| p == 0) {
                return Err(bad());
            }
            Ok(r.to_string())
        };
        match kind {
            "udp" => Ok(Collector::Udp(addr(rest)?)),
            "tcp" => Ok(Collector::Tcp(addr(rest)?)),
            "file" if !rest.is_empty() => Ok(Collector::File(PathBuf::from(rest))),
            _ => Err(bad()),
        }
    }
}

impl std::fmt::Display for Collector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Collector::Udp(a) => write!(f, "udp:{a}"),
            Collector::Tcp(a) => write!(f, "tcp:{a}"),
            Collector::File(p) => write!(f, "file:{}", p.display()),
        }
    }
}

/// The exporter's settings.
#[derive(Clone, Debug)]
pub struct IpfixConfig {
    /// Collectors (each gets every message).
    pub collectors: Vec<Collector>,
    /// Active timeout: a live flow is reported every this much packet time (None: only at its end).
    pub active_ns: Option<u64>,
    /// Records per core's queue.
    pub queue: usize,
}

/// What the exporter did (the report's `ipfix`).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct IpfixReport {
    /// Collectors.
    pub collectors: Vec<String>,
    /// Active timeout (s), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub active_timeout_s: Option<f64>,
    /// Flow records sent.
    pub flow_records: u64,
    /// NAT event records sent.
    pub nat_records: u64,
    /// Usage records sent (`upf`: per core, URR and direction, at active timeouts and the run's end).
    pub usage_records: u64,
    /// Records lost: a full queue (the NF went on) or a record the templates cannot carry (IPv6 NAT).
    pub lost: u64,
    /// Messages written (to each collector).
    pub messages: u64,
    /// Bytes of those messages.
    pub bytes: u64,
    /// Sends or writes that failed (a UDP collector not listening, a closed TCP connection).
    pub send_errors: u64,
    /// CPU time of the exporter thread (ms; the thread's CPU clock, 0 where unknown): with the records
    /// sent, the exporter's own rate (records per second of its CPU time), whatever the run's length.
    pub cpu_ms: f64,
}

impl IpfixReport {
    /// Records sent (flow, NAT and usage).
    pub fn records(&self) -> u64 {
        self.flow_records + self.nat_records + self.usage_records
    }

    /// Records sent per second of the exporter thread's CPU time (None: no CPU time measured).
    pub fn records_per_cpu_s(&self) -> Option<f64> {
        (self.cpu_ms > 0.0).then(|| self.records() as f64 / (self.cpu_ms / 1e3))
    }

    /// One line for the text report.
    pub fn line(&self) -> String {
        format!(
            "ipfix        {} flow records, {} NAT events, {} usage records, {} lost, {} messages ({} bytes), {} send errors, exporter {:.1} ms CPU -> {}",
            self.flow_records,
            self.nat_records,
            self.usage_records,
            self.lost,
            self.messages,
            self.bytes,
            self.send_errors,
            self.cpu_ms,
            self.collectors.join(", ")
        )
    }
}

enum Out {
    Udp(UdpSocket),
    /// Buffered: one write per 64 KiB of messages, not per message (flushed whenever the exporter is idle).
    Tcp(Option<std::io::BufWriter<TcpStream>>),
    File(std::io::BufWriter<std::fs::File>),
}

/// Buffer of a TCP collector's stream.
const TCP_BUFFER: usize = 1 << 16;

/// The running exporter: hands out queues, then is finished once the workers stopped.
pub struct Exporter {
    queues: mpsc::Sender<(u32, rtrb::Consumer<ExportRecord>)>,
    stop: Arc<AtomicBool>,
    lost: Arc<AtomicU64>,
    patient: Arc<AtomicBool>,
    queue: usize,
    thread: JoinHandle<IpfixReport>,
}

impl Exporter {
    /// Opens every collector (a bad address or an unreachable TCP collector
    /// is an error now) and starts the thread. `base_ns`: the epoch time
    /// (ns) of packet time 0.
    pub fn start(cfg: &IpfixConfig, base_ns: u64) -> Result<Self, EngineError> {
        let mut outs = Vec::new();
        for c in &cfg.collectors {
            let err = |e: std::io::Error| EngineError::Config(format!("--ipfix {c}: {e}"));
            let resolve = |a: &str| {
                a.to_socket_addrs()
                    .map_err(err)?
                    .next()
                    .ok_or_else(|| EngineError::Config(format!("--ipfix {c}: no address")))
            };
            outs.push(match c {
                Collector::Udp(a) => {
                    let to = resolve(a)?;
                    let local = if to.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
                    let s = UdpSocket::bind(local).map_err(err)?;
                    s.connect(to).map_err(err)?;
                    Out::Udp(s)
                }
                Collector::Tcp(a) => {
                    let s = TcpStream::connect_timeout(&resolve(a)?, Duration::from_secs(2)).map_err(err)?;
                    Out::Tcp(Some(std::io::BufWriter::with_capacity(TCP_BUFFER, s)))
                }
                Collector::File(p) => Out::File(std::io::BufWriter::new(std::fs::File::create(p).map_err(err)?)),
            });
        }
        let (tx, rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let lost = Arc::new(AtomicU64::new(0));
        let report = IpfixReport {
            collectors: cfg.collectors.iter().map(ToString::to_string).collect(),
            active_timeout_s: cfg.active_ns.map(|a| a as f64 / 1e9),
            ..Default::default()
        };
        let enc = Encoder::new(base_ns, outs, report);
        let st = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("fp-ipfix".into())
            .spawn(move || enc.run(rx, &st))
            .map_err(EngineError::Thread)?;
        Ok(Exporter { queues: tx, stop, lost, patient: Arc::new(AtomicBool::new(false)), queue: cfg.queue, thread })
    }

    /// A new queue for one NF on the core whose input is `ingress`.
    pub fn queue(&self, ingress: u32) -> RecordTx {
        let (tx, rx) = RecordTx::new(self.queue, Arc::clone(&self.lost), Arc::clone(&self.patient), ingress);
        // The thread only ends after `finish`, which takes `self`: the receiver is alive.
        let _ = self.queues.send((ingress, rx));
        tx
    }

    /// The workers stopped: from now on a full queue waits for room (the run's end flush).
    pub fn workers_stopped(&self) {
        self.patient.store(true, Ordering::Relaxed);
    }

    /// Sends what is queued and stops the thread.
    pub fn finish(self) -> IpfixReport {
        self.stop.store(true, Ordering::Release);
        drop(self.queues);
        let mut r = self.thread.join().unwrap_or_default();
        r.lost += self.lost.load(Ordering::Relaxed);
        r
    }
}

/// A record ready for the wire.
#[derive(Clone, Copy)]
enum Rec {
    Flow(FlowRecord),
    Nat(NatRecord),
    Usage(UsageRecord),
}

impl Rec {
    fn template(&self) -> (u16, usize) {
        match self {
            Rec::Flow(f) => f.template(),
            Rec::Nat(n) => n.template(),
            Rec::Usage(u) => u.template(),
        }
    }
}

/// What was reported of a flow at its active timeouts: totals and the last packet's time then.
/// foldhash, seeded per map: SipHash (std's default) cost the exporter ~30 instructions per
/// packet at 1M records/s (valgrind), on a thread that shares the workers' CPUs; the keys are
/// wire tuples, so the seed stays random.
type Reported = HashMap<(u32, FiveTuple, u64), (u64, u64, u64), foldhash::fast::RandomState>;

struct Encoder {
    base_ns: u64,
    outs: Vec<Out>,
    report: IpfixReport,
    sequence: u32,
    templates: Vec<TemplateRepr>,
    last_templates: Option<Instant>,
    /// Templates go again after this long ([`TEMPLATE_REFRESH`]; shorter in tests).
    refresh: Duration,
    pending: Vec<Rec>,
    reported: Reported,
    buf: Vec<u8>,
}

impl Encoder {
    fn new(base_ns: u64, outs: Vec<Out>, report: IpfixReport) -> Self {
        Encoder {
            base_ns,
            outs,
            report,
            sequence: 0,
            templates: templates(),
            last_templates: None,
            refresh: TEMPLATE_REFRESH,
            pending: Vec::new(),
            reported: HashMap::default(),
            buf: Vec::with_capacity(MAX_MESSAGE),
        }
    }

    fn run(mut self, rx: mpsc::Receiver<(u32, rtrb::Consumer<ExportRecord>)>, stop: &AtomicBool) -> IpfixReport {
        let cpu0 = flowplane_io::cpu::thread_cpu_ns();
        let mut rings: Vec<(u32, rtrb::Consumer<ExportRecord>)> = Vec::new();
        loop {
            // Read before draining: records pushed before `stop` are then all seen by the last pass.
            let stopping = stop.load(Ordering::Acquire);
            rings.extend(rx.try_iter());
            let mut n = 0;
            for (ingress, ring) in &mut rings {
                // A bounded chunk per ring, so one busy core does not starve the others' queues.
                let Ok(chunk) = ring.read_chunk(ring.slots().min(4096)) else { continue };
                n += chunk.len();
                for r in chunk {
                    self.add(*ingress, r);
                }
            }
            if n == 0 {
                self.flush();
                self.sync();
                if stopping {
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        self.flush();
        self.sync();
        if let (Some(a), Some(b)) = (cpu0, flowplane_io::cpu::thread_cpu_ns()) {
            self.report.cpu_ms = b.saturating_sub(a) as f64 / 1e6;
        }
        self.report
    }

    /// Hands the buffered streams' bytes to the kernel (the exporter is idle, or done).
    fn sync(&mut self) {
        for o in &mut self.outs {
            let r = match o {
                Out::File(f) => f.flush(),
                Out::Tcp(Some(s)) => s.flush(),
                _ => Ok(()),
            };
            if r.is_err() {
                self.report.send_errors += 1;
                if let Out::Tcp(c) = o {
                    *c = None;
                }
            }
        }
    }

    fn ms(&self, ns: u64) -> u64 {
        (self.base_ns + ns) / 1_000_000
    }

    fn add(&mut self, ingress: u32, r: ExportRecord) {
        let rec = match r {
            ExportRecord::Flow(f) => {
                let key = (ingress, f.tuple, f.first_ns);
                // One probe per record: an active report updates its entry in place; an end takes it (no probe
                // at all while no flow has an active report, e.g. without an active timeout).
                let prev = if f.reason == EndReason::ActiveTimeout {
                    let e = self.reported.entry(key).or_insert((0, 0, f.first_ns));
                    let prev = *e;
                    *e = (f.packets, f.bytes, f.last_ns);
                    Some(prev)
                } else if self.reported.is_empty() {
                    None
                } else {
                    self.reported.remove(&key)
                };
                let (p0, b0, start_ns) = prev.unwrap_or((0, 0, f.first_ns));
                let (packets, bytes) = (f.packets.saturating_sub(p0), f.bytes.saturating_sub(b0));
                // Nothing new since the last report.
                if packets == 0 {
                    return;
                }
                Rec::Flow(FlowRecord {
                    tuple: f.tuple,
                    packets,
                    bytes,
                    start_ms: self.ms(start_ns.max(f.first_ns)),
                    end_ms: self.ms(f.last_ns),
                    reason: f.reason as u8,
                    ingress,
                    post_dst: f.post_dst,
                })
            }
            ExportRecord::Usage(u) => {
                let time_ms = self.ms(u.time_ns);
                // Uplink: ingress (0); downlink: egress (1). A direction without new packets sends nothing.
                for (direction, (bytes, packets)) in [(0u8, u.ul), (1, u.dl)] {
                    if packets == 0 {
                        continue;
                    }
                    self.pending.push(Rec::Usage(UsageRecord {
                        seid: u.seid,
                        urr: u.urr,
                        direction,
                        bytes,
                        packets,
                        time_ms,
                    }));
                }
                self.flush_full();
                return;
            }
            ExportRecord::Nat(n) => {
                let (proto, src, sport, dst, dport) = match n.inside {
                    Some(FiveTuple::V4(k)) => (k.proto(), k.src(), k.src_port(), k.dst(), k.dst_port()),
                    Some(FiveTuple::V6(_)) => {
                        self.report.lost += 1;
                        return;
                    }
                    None => (0, [0; 4].into(), 0, [0; 4].into(), 0),
                };
                Rec::Nat(NatRecord {
                    event: n.event as u8,
                    time_ms: self.ms(n.time_ns),
                    proto,
                    src,
                    sport,
                    dst,
                    dport,
                    post_src: n.post_src,
                    post_sport: n.post_sport,
                    pool: n.pool,
                })
            }
        };
        self.pending.push(rec);
        self.flush_full();
    }

    /// Writes the pending records once they fill a message.
    #[inline]
    fn flush_full(&mut self) {
        if self.pending.len() >= MAX_MESSAGE / flowplane_wire::ipfix::FLOW4_LEN {
            self.flush();
        }
    }

    /// Writes the pending records as messages of at most [`MAX_MESSAGE`] bytes.
    fn flush(&mut self) {
        let due = self.last_templates.is_none_or(|t| t.elapsed() >= self.refresh);
        if self.pending.is_empty() && !due {
            return;
        }
        let mut with_templates = due;
        let mut i = 0;
        while i < self.pending.len() || with_templates {
            self.buf.clear();
            let export_time =
                SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs() as u32);
            let hdr = HeaderRepr { export_time, sequence: self.sequence, domain: DOMAIN };
            let mut m = MessageBuilder::new(&mut self.buf, hdr, MAX_MESSAGE);
            if with_templates {
                m.template_set(&self.templates);
                self.last_templates = Some(Instant::now());
                with_templates = false;
            }
            while let Some(r) = self.pending.get(i) {
                let (id, len) = r.template();
                let written = m.record(id, len, |o| match r {
                    Rec::Flow(f) => f.emit(o),
                    Rec::Nat(n) => n.emit(o),
                    Rec::Usage(u) => u.emit(o),
                });
                if !written {
                    break;
                }
                match r {
                    Rec::Flow(_) => self.report.flow_records += 1,
                    Rec::Nat(_) => self.report.nat_records += 1,
                    Rec::Usage(_) => self.report.usage_records += 1,
                }
                i += 1;
            }
            self.sequence = self.sequence.wrapping_add(m.records());
            let len = m.finish();
            self.report.messages += 1;
            self.report.bytes += len as u64;
            for o in &mut self.outs {
                let ok = match o {
                    Out::Udp(s) => s.send(&self.buf).is_ok(),
                    Out::File(f) => f.write_all(&self.buf).is_ok(),
                    Out::Tcp(c) => {
                        let ok = c.as_mut().is_some_and(|s| s.write_all(&self.buf).is_ok());
                        if !ok {
                            // A dropped connection is not retried: the report says what failed.
                            *c = None;
                        }
                        ok
                    }
                };
                if !ok {
                    self.report.send_errors += 1;
                }
            }
        }
        self.pending.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowplane_nf::ipfix::{FlowExport, NatEvent, NatExport, UsageExport};
    use flowplane_wire::ipfix::Decoder;

    fn tuple(sp: u16) -> FiveTuple {
        FiveTuple::new([10, 0, 0, 1].into(), [10, 0, 0, 2].into(), sp, 80, 6).unwrap()
    }

    #[test]
    fn collectors_parse_and_bad_ones_are_one_line_errors() {
        assert_eq!("udp:127.0.0.1:4739".parse::<Collector>().unwrap(), Collector::Udp("127.0.0.1:4739".into()));
        assert_eq!("tcp:[::1]:4739".parse::<Collector>().unwrap(), Collector::Tcp("[::1]:4739".into()));
        assert_eq!("file:/tmp/x".parse::<Collector>().unwrap(), Collector::File("/tmp/x".into()));
        for bad in ["udp:host", "udp:h:0", "udp::5", "sctp:h:1", "file:", "x"] {
            let e = bad.parse::<Collector>().unwrap_err();
            assert!(!e.contains('\n') && e.contains(bad), "{e}");
        }
    }

    #[test]
    fn active_reports_become_deltas_and_the_end_carries_the_rest() {
        let dir = std::env::temp_dir().join(format!("fp-ipfix-unit-{}", std::process::id()));
        let cfg = IpfixConfig { collectors: vec![Collector::File(dir.clone())], active_ns: Some(1), queue: 16 };
        let ex = Exporter::start(&cfg, 1_000_000_000_000).unwrap();
        let mut q = ex.queue(3);
        let f = |packets, bytes, last_ns, reason| {
            ExportRecord::Flow(FlowExport::new(tuple(1), packets, bytes, 0, last_ns, reason))
        };
        q.push(f(2, 200, 5_000_000, EndReason::ActiveTimeout));
        q.push(f(2, 200, 5_000_000, EndReason::ActiveTimeout)); // nothing new: no record
        q.push(f(5, 500, 9_000_000, EndReason::IdleTimeout));
        q.push(ExportRecord::Nat(NatExport {
            event: NatEvent::Nat44SessionCreate,
            time_ns: 1_000_000,
            inside: Some(tuple(7)),
            post_src: [192, 0, 2, 1].into(),
            post_sport: 1024,
            pool: 0,
        }));
        q.push(ExportRecord::Usage(UsageExport { seid: 9, urr: 1, ul: (300, 3), dl: (4000, 4), time_ns: 2_000_000 }));
        // A later delta with nothing downlink: one record.
        q.push(ExportRecord::Usage(UsageExport { seid: 9, urr: 1, ul: (100, 1), dl: (0, 0), time_ns: 3_000_000 }));
        let r = ex.finish();
        assert_eq!((r.flow_records, r.nat_records, r.usage_records, r.lost), (2, 1, 3, 0));
        // The exporter thread's own CPU time is measured (Linux).
        assert!(r.cpu_ms > 0.0 && r.records_per_cpu_s().is_some_and(|x| x > 0.0), "{r:?}");
        let bytes = std::fs::read(&dir).unwrap();
        let _ = std::fs::remove_file(&dir);
        let mut d = Decoder::new();
        let mut recs = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let len = u16::from_be_bytes([bytes[at + 2], bytes[at + 3]]) as usize;
            recs.extend(d.decode(&bytes[at..at + len]).unwrap());
            at += len;
        }
        let flows: Vec<_> = recs.iter().filter_map(FlowRecord::from_fields).collect();
        assert_eq!(flows.len(), 2);
        assert_eq!((flows[0].packets, flows[0].bytes, flows[0].reason), (2, 200, 2));
        assert_eq!((flows[1].packets, flows[1].bytes, flows[1].reason), (3, 300, 1));
        assert_eq!((flows[0].start_ms, flows[1].end_ms, flows[1].ingress), (1_000_000, 1_000_009, 3));
        let nat: Vec<_> = recs.iter().filter(|r| r.template == 258).filter_map(NatRecord::from_fields).collect();
        assert_eq!((nat[0].event, nat[0].sport, nat[0].post_sport), (4, 7, 1024));
        let usage: Vec<_> = recs.iter().filter_map(UsageRecord::from_fields).collect();
        let u =
            |direction, bytes, packets, time_ms| UsageRecord { seid: 9, urr: 1, direction, bytes, packets, time_ms };
        assert_eq!(usage, vec![u(0, 300, 3, 1_000_002), u(1, 4000, 4, 1_000_002), u(0, 100, 1, 1_000_003)]);
        assert_eq!(d.missing, 0);
    }

    /// RFC 7011 section 8.4: over UDP, templates are sent again periodically (the collector may have missed them);
    /// each message's sequence number counts the data records sent before it.
    #[test]
    fn templates_are_sent_again_after_the_refresh_time_and_sequence_numbers_count_records() {
        let dir = std::env::temp_dir().join(format!("fp-ipfix-unit-refresh-{}", std::process::id()));
        let out = Out::File(std::io::BufWriter::new(std::fs::File::create(&dir).unwrap()));
        let mut e = Encoder::new(0, vec![out], IpfixReport::default());
        e.refresh = Duration::from_millis(30);
        let rec =
            |sp, packets| ExportRecord::Flow(FlowExport::new(tuple(sp), packets, 1, 0, 0, EndReason::IdleTimeout));
        // Message 1: templates and 2 records; message 2 (before the refresh time): 3 records, no templates;
        // message 3 (after it): templates again and 1 record.
        e.add(0, rec(1, 1));
        e.add(0, rec(2, 1));
        e.flush();
        for sp in 3..6 {
            e.add(0, rec(sp, 1));
        }
        e.flush();
        std::thread::sleep(Duration::from_millis(40));
        e.add(0, rec(6, 1));
        e.flush();
        e.sync();
        let bytes = std::fs::read(&dir).unwrap();
        let _ = std::fs::remove_file(&dir);
        let mut at = 0;
        let mut seen = Vec::new();
        while at < bytes.len() {
            let m = flowplane_wire::ipfix::Message::new_checked(&bytes[at..]).unwrap();
            let sets: Vec<u16> = m.sets().map(|s| s.unwrap().id).collect();
            seen.push((m.sequence(), sets.contains(&2), sets.iter().filter(|&&id| id >= 256).count()));
            at += m.length() as usize;
        }
        assert_eq!(seen, vec![(0, true, 1), (2, false, 1), (5, true, 1)]);
    }

    #[test]
    fn a_full_queue_counts_lost_records_and_never_blocks() {
        let dir = std::env::temp_dir().join(format!("fp-ipfix-unit-full-{}", std::process::id()));
        let cfg = IpfixConfig { collectors: vec![Collector::File(dir.clone())], active_ns: None, queue: 4 };
        let ex = Exporter::start(&cfg, 0).unwrap();
        let mut q = ex.queue(0);
        let t0 = Instant::now();
        for i in 0..100_000u64 {
            q.push(ExportRecord::Flow(FlowExport::new(tuple(i as u16), 1, 1, 0, 0, EndReason::IdleTimeout)));
        }
        assert!(t0.elapsed() < Duration::from_secs(5));
        let r = ex.finish();
        let _ = std::fs::remove_file(&dir);
        assert_eq!(r.flow_records + r.lost, 100_000);
        assert!(r.lost > 0);
    }
}
