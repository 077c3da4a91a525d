//! Trace statistics (`flowplane trace stats`): owns the per-trace summary
//! [`TraceStats`], its incremental builder [`StatsCollector`] and the Zipf fit.
//!
//! Definitions:
//! * a **flow** is a distinct 5-tuple as `flowplane_wire::flow::extract_five_tuple`
//!   (the key every NF sees) returns it; the direction matters, so a
//!   bidirectional connection is two flows. Frames that are not IPv4/IPv6
//!   (after up to two VLAN tags) are counted as `non_ip_packets`, IP frames
//!   whose headers are truncated or inconsistent as `malformed_packets`.
//! * **sizes and bytes** use the original (wire) length of each packet.
//! * **temporal locality**: the *reuse distance* of a packet is the number of
//!   packets since the previous packet of its flow (1 = back to back). We
//!   report its median and 90th percentile over all packets that are not the
//!   first of their flow (exact below 4096, within 3% above), and the fraction
//!   of packets whose flow equals the previous packet's. Bursty traces have a
//!   median of 1; a uniformly random order over F flows has a median near
//!   F·ln 2.
//! * **Zipf exponent**: flows sorted by packet count give c_1 >= c_2 >= ...;
//!   we fit ln c_r = b - a·ln r by least squares over ranks r = 1..R, where R
//!   is the last rank with c_r >= 16 (below that, sampling noise flattens the
//!   curve), using geometrically spaced ranks (⌈1.1^k⌉) so each decade weighs
//!   the same. `a` is reported with the fit's R².

use std::fmt;
use std::path::Path;

use hashbrown::HashMap;
use serde::Serialize;

use flowplane_wire::flow::{extract_five_tuple, FiveTuple, FlowError};

use crate::{to_ethernet, TraceError, TraceReader, Unparsed, UnparsedCounts};

/// Minimum count of a rank used in the Zipf fit.
pub const ZIPF_MIN_COUNT: u64 = 16;

fn proto_name(proto: u8) -> String {
    match proto {
        6 => "tcp".into(),
        17 => "udp".into(),
        1 => "icmp".into(),
        58 => "icmpv6".into(),
        132 => "sctp".into(),
        p => format!("ip-{p}"),
    }
}

fn endpoint(ip: std::net::IpAddr, port: u16) -> String {
    std::net::SocketAddr::new(ip, port).to_string()
}

#[derive(Debug, Clone, Copy)]
struct FlowStat {
    packets: u64,
    bytes: u64,
    last: u64,
}

/// Reuse-distance histogram: exact below `EXACT`, then 32 buckets per octave.
#[derive(Debug, Clone)]
struct ReuseHist {
    buckets: Vec<u64>,
    total: u64,
}

const EXACT: u64 = 4096;
const SUB_BITS: u32 = 5;

impl ReuseHist {
    fn new() -> Self {
        ReuseHist { buckets: vec![0; EXACT as usize + (64 - 12) * 32], total: 0 }
    }

    fn index(d: u64) -> usize {
        if d < EXACT {
            return d as usize;
        }
        let e = 63 - d.leading_zeros(); // >= 12
        let sub = (d >> (e - SUB_BITS)) & 31;
        EXACT as usize + (e as usize - 12) * 32 + sub as usize
    }

    fn lower_bound(i: usize) -> u64 {
        if i < EXACT as usize {
            return i as u64;
        }
        let j = i - EXACT as usize;
        let (e, sub) = (j / 32 + 12, (j % 32) as u64);
        (32 + sub) << (e as u32 - SUB_BITS)
    }

    fn add(&mut self, d: u64) {
        self.buckets[Self::index(d)] += 1;
        self.total += 1;
    }

    /// The `q`-quantile (lower bound of its bucket); `None` if empty.
    fn quantile(&self, q: f64) -> Option<u64> {
        if self.total == 0 {
            return None;
        }
        let target = ((self.total as f64 * q).ceil() as u64).clamp(1, self.total);
        let mut acc = 0;
        for (i, &c) in self.buckets.iter().enumerate() {
            acc += c;
            if acc >= target {
                return Some(Self::lower_bound(i));
            }
        }
        None
    }
}

/// Frame size summary (wire lengths).
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct SizeSummary {
    /// Smallest.
    pub min: u32,
    /// Mean.
    pub mean: f64,
    /// Largest.
    pub max: u32,
}

/// Distribution of packets per flow.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct PerFlow {
    /// Mean packets per flow.
    pub mean: f64,
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Largest flow.
    pub max: u64,
}

/// One of the largest flows.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TopFlow {
    /// `tcp`, `udp`, ...
    pub proto: String,
    /// `addr:port` of the source.
    pub src: String,
    /// `addr:port` of the destination.
    pub dst: String,
    /// Packets of the flow.
    pub packets: u64,
    /// Bytes of the flow.
    pub bytes: u64,
}

/// Temporal locality (see the module docs).
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Locality {
    /// Median packets between consecutive packets of a flow (`None` if no flow repeats).
    pub reuse_distance_median: Option<u64>,
    /// 90th percentile of the reuse distance.
    pub reuse_distance_p90: Option<u64>,
    /// Packets that were not the first of their flow.
    pub reuses: u64,
    /// Fraction of IP packets whose flow is the previous packet's flow.
    pub same_flow_as_previous: f64,
}

/// Least-squares fit of the rank/frequency curve (see the module docs).
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct ZipfFit {
    /// Fitted exponent `a` of c_r ∝ r^-a.
    pub exponent: f64,
    /// Coefficient of determination of the log-log fit.
    pub r2: f64,
    /// Largest rank used (R).
    pub ranks: u64,
    /// Number of (rank, count) points in the fit.
    pub points: u64,
}

/// Everything `flowplane trace stats` reports.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TraceStats {
    /// Packets in the trace.
    pub packets: u64,
    /// Sum of wire lengths.
    pub bytes: u64,
    /// Sum of captured lengths.
    pub captured_bytes: u64,
    /// Frame sizes (`None` for an empty trace).
    pub frame_size: Option<SizeSummary>,
    /// Last minus first timestamp.
    pub duration_ns: u64,
    /// Packets per second over the duration (`None` if the duration is 0).
    pub pps: Option<f64>,
    /// Distinct 5-tuples.
    pub flows: u64,
    /// IPv4/IPv6 packets.
    pub ip_packets: u64,
    /// Packets that are not IP.
    pub non_ip_packets: u64,
    /// IP packets whose headers are truncated or inconsistent (no 5-tuple).
    pub malformed_packets: u64,
    /// Packets whose link layer could not be read (counted in `packets`; their reasons are in `unparsed`).
    pub unreadable_packets: u64,
    /// Records and packets that could not be read, by reason (a JSON object with every reason's count).
    pub unparsed: UnparsedCounts,
    /// Records longer than the snapshot length (read in full, as Wireshark does).
    pub over_snaplen_records: u64,
    /// Why reading ended before the end of the file, when it did (a truncated or corrupt record).
    pub stopped_early: Option<String>,
    /// Packets per flow (`None` without flows).
    pub packets_per_flow: Option<PerFlow>,
    /// The largest flows, by packets.
    pub top_flows: Vec<TopFlow>,
    /// Temporal locality.
    pub locality: Locality,
    /// Zipf fit (`None` with fewer than 3 usable ranks).
    pub zipf: Option<ZipfFit>,
}

/// Builds [`TraceStats`] one packet at a time (memory O(flows)).
#[derive(Debug)]
pub struct StatsCollector {
    packets: u64,
    bytes: u64,
    captured: u64,
    min: u32,
    max: u32,
    first_ts: u64,
    last_ts: u64,
    ip: u64,
    non_ip: u64,
    malformed: u64,
    unreadable: u64,
    flows: HashMap<FiveTuple, FlowStat>,
    reuse: ReuseHist,
    prev: Option<FiveTuple>,
    same_as_prev: u64,
}

impl Default for StatsCollector {
    fn default() -> Self {
        Self::new()
    }
}

impl StatsCollector {
    /// An empty collector.
    pub fn new() -> Self {
        StatsCollector {
            packets: 0,
            bytes: 0,
            captured: 0,
            min: u32::MAX,
            max: 0,
            first_ts: u64::MAX,
            last_ts: 0,
            ip: 0,
            non_ip: 0,
            malformed: 0,
            unreadable: 0,
            flows: HashMap::new(),
            reuse: ReuseHist::new(),
            prev: None,
            same_as_prev: 0,
        }
    }

    fn count(&mut self, ts_ns: u64, orig_len: u32, captured: usize) -> u64 {
        let i = self.packets;
        self.packets += 1;
        self.bytes += orig_len as u64;
        self.captured += captured as u64;
        self.min = self.min.min(orig_len);
        self.max = self.max.max(orig_len);
        self.first_ts = self.first_ts.min(ts_ns);
        self.last_ts = self.last_ts.max(ts_ns);
        i
    }

    /// Adds one Ethernet frame (`orig_len` is its wire length).
    pub fn add(&mut self, ts_ns: u64, orig_len: u32, frame: &[u8]) {
        let i = self.count(ts_ns, orig_len, frame.len());
        let key = match extract_five_tuple(frame) {
            Ok(k) => k,
            Err(e) => {
                if e == FlowError::NotIp {
                    self.non_ip += 1;
                } else {
                    self.malformed += 1;
                }
                self.prev = None;
                return;
            }
        };
        self.ip += 1;
        if self.prev == Some(key) {
            self.same_as_prev += 1;
        }
        self.prev = Some(key);
        match self.flows.get_mut(&key) {
            Some(f) => {
                self.reuse.add(i - f.last);
                f.packets += 1;
                f.bytes += orig_len as u64;
                f.last = i;
            }
            None => {
                self.flows.insert(key, FlowStat { packets: 1, bytes: orig_len as u64, last: i });
            }
        }
    }

    /// Counts a packet whose link layer could not be presented as Ethernet.
    pub fn add_unreadable(&mut self, ts_ns: u64, orig_len: u32, captured: usize) {
        self.count(ts_ns, orig_len, captured);
        self.unreadable += 1;
        self.prev = None;
    }

    /// The summary, with the `top` largest flows.
    pub fn finish(self, top: usize) -> TraceStats {
        let mut flows: Vec<(FiveTuple, FlowStat)> = self.flows.into_iter().collect();
        // Largest first; ties broken by key so that output is deterministic.
        flows.sort_unstable_by(|a, b| b.1.packets.cmp(&a.1.packets).then(a.0.cmp(&b.0)));
        let counts: Vec<u64> = flows.iter().map(|f| f.1.packets).collect();
        let packets_per_flow = (!counts.is_empty()).then(|| {
            let n = counts.len();
            // counts are descending: the q-quantile sits at index n - ceil(q n).
            let q = |p: f64| counts[n - ((p * n as f64).ceil() as usize).clamp(1, n)];
            PerFlow {
                mean: counts.iter().sum::<u64>() as f64 / n as f64,
                p50: q(0.5),
                p90: q(0.9),
                p99: q(0.99),
                p999: q(0.999),
                max: counts[0],
            }
        });
        let top_flows = flows
            .iter()
            .take(top)
            .map(|(k, s)| TopFlow {
                proto: proto_name(k.proto()),
                src: endpoint(k.src_ip(), k.src_port()),
                dst: endpoint(k.dst_ip(), k.dst_port()),
                packets: s.packets,
                bytes: s.bytes,
            })
            .collect();
        let duration_ns = self.last_ts.saturating_sub(self.first_ts);
        TraceStats {
            packets: self.packets,
            bytes: self.bytes,
            captured_bytes: self.captured,
            frame_size: (self.packets > 0).then(|| SizeSummary {
                min: self.min,
                mean: self.bytes as f64 / self.packets as f64,
                max: self.max,
            }),
            duration_ns: if self.packets > 0 { duration_ns } else { 0 },
            pps: (self.packets > 0 && duration_ns > 0).then(|| (self.packets - 1) as f64 * 1e9 / duration_ns as f64),
            flows: counts.len() as u64,
            ip_packets: self.ip,
            non_ip_packets: self.non_ip,
            malformed_packets: self.malformed,
            unreadable_packets: self.unreadable,
            unparsed: UnparsedCounts::default(),
            over_snaplen_records: 0,
            stopped_early: None,
            packets_per_flow,
            top_flows,
            locality: Locality {
                reuse_distance_median: self.reuse.quantile(0.5),
                reuse_distance_p90: self.reuse.quantile(0.9),
                reuses: self.reuse.total,
                same_flow_as_previous: if self.ip > 0 { self.same_as_prev as f64 / self.ip as f64 } else { 0.0 },
            },
            zipf: fit_zipf(&counts),
        }
    }
}

/// Fits the Zipf exponent to flow sizes sorted in descending order (see the module docs).
pub fn fit_zipf(counts_desc: &[u64]) -> Option<ZipfFit> {
    let r_max = counts_desc.iter().take_while(|&&c| c >= ZIPF_MIN_COUNT).count() as u64;
    let mut pts: Vec<(f64, f64)> = Vec::new();
    let mut last = 0u64;
    let mut g = 1.0f64;
    loop {
        let r = g.ceil() as u64;
        if r > r_max {
            break;
        }
        if r != last {
            pts.push(((r as f64).ln(), (counts_desc[r as usize - 1] as f64).ln()));
            last = r;
        }
        g *= 1.1;
    }
    if pts.len() < 3 {
        return None;
    }
    let n = pts.len() as f64;
    let mx = pts.iter().map(|p| p.0).sum::<f64>() / n;
    let my = pts.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = pts.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let syy: f64 = pts.iter().map(|p| (p.1 - my).powi(2)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let slope = sxy / sxx;
    let r2 = if syy > 0.0 { (sxy * sxy) / (sxx * syy) } else { 1.0 };
    Some(ZipfFit { exponent: -slope, r2, ranks: r_max, points: pts.len() as u64 })
}

/// Reads a trace file and summarises it.
pub fn trace_stats(path: &Path, top: usize) -> Result<TraceStats, TraceError> {
    let mut reader = TraceReader::open(path)?;
    let mut col = StatsCollector::new();
    let mut scratch = Vec::new();
    let mut unparsed = UnparsedCounts::default();
    let size = std::fs::metadata(path).map_or(0, |m| m.len());
    let bar = crate::progress::Progress::bar(format!("reading {}", path.display()), size, crate::progress::Unit::Bytes);
    let mut n = 0u64;
    while let Some(pkt) = reader.next_packet()? {
        match to_ethernet(&pkt, &mut scratch) {
            Ok(frame) => col.add(pkt.ts_ns, pkt.orig_len, frame),
            Err(e) => {
                unparsed.add(e.kind().unparsed_reason().unwrap_or(Unparsed::CorruptRecord));
                col.add_unreadable(pkt.ts_ns, pkt.orig_len, pkt.data.len());
            }
        }
        n += 1;
        if n.is_multiple_of(1 << 16) {
            bar.set(reader.offset());
        }
    }
    let mut stats = col.finish(top);
    unparsed.merge(reader.unparsed());
    stats.unparsed = unparsed;
    stats.over_snaplen_records = reader.over_snaplen();
    stats.stopped_early = reader.stopped_early().map(ToString::to_string);
    Ok(stats)
}

fn opt<T: fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_string(), |v| v.to_string())
}

impl fmt::Display for TraceStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "packets            {}", self.packets)?;
        writeln!(f, "bytes              {} (captured {})", self.bytes, self.captured_bytes)?;
        if let Some(s) = self.frame_size {
            writeln!(f, "frame size         min {} / mean {:.1} / max {}", s.min, s.mean, s.max)?;
        }
        writeln!(f, "duration           {:.6} s ({} ns)", self.duration_ns as f64 / 1e9, self.duration_ns)?;
        writeln!(f, "rate               {} pps", self.pps.map_or("-".into(), |p| format!("{p:.0}")))?;
        writeln!(
            f,
            "flows              {} ({} IP packets, {} non-IP, {} malformed, {} unreadable)",
            self.flows, self.ip_packets, self.non_ip_packets, self.malformed_packets, self.unreadable_packets
        )?;
        if self.unparsed.total() > 0 {
            writeln!(f, "unparsed           {}", self.unparsed)?;
        }
        if self.over_snaplen_records > 0 {
            writeln!(
                f,
                "over snaplen       {} records longer than the snapshot length (read in full)",
                self.over_snaplen_records
            )?;
        }
        if let Some(why) = &self.stopped_early {
            writeln!(f, "stopped early      {why}")?;
        }
        if let Some(p) = self.packets_per_flow {
            writeln!(
                f,
                "packets per flow   mean {:.2}, p50 {}, p90 {}, p99 {}, p99.9 {}, max {}",
                p.mean, p.p50, p.p90, p.p99, p.p999, p.max
            )?;
        }
        let l = &self.locality;
        writeln!(
            f,
            "locality           reuse distance median {} p90 {} packets; same flow as previous {:.3}",
            opt(l.reuse_distance_median),
            opt(l.reuse_distance_p90),
            l.same_flow_as_previous
        )?;
        match self.zipf {
            Some(z) => writeln!(
                f,
                "zipf exponent      {:.3} (R^2 {:.3}, ranks 1..{}, {} points)",
                z.exponent, z.r2, z.ranks, z.points
            )?,
            None => writeln!(f, "zipf exponent      - (too few flows with >= {ZIPF_MIN_COUNT} packets)")?,
        }
        if !self.top_flows.is_empty() {
            writeln!(f, "top flows")?;
            for t in &self.top_flows {
                writeln!(f, "  {:>10} pkts {:>12} B  {} {} -> {}", t.packets, t.bytes, t.proto, t.src, t.dst)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hist_buckets_are_monotone_and_tight() {
        let mut prev = 0;
        for d in (0..1_000_000u64).step_by(7) {
            let i = ReuseHist::index(d);
            assert!(i >= prev);
            prev = i;
            let lb = ReuseHist::lower_bound(i);
            assert!(lb <= d && (d - lb) as f64 <= d as f64 * 0.035 + 0.5, "d {d} lb {lb}");
        }
        assert!(ReuseHist::index(u64::MAX) < ReuseHist::new().buckets.len());
    }

    #[test]
    fn zipf_fit_of_exact_power_law() {
        let counts: Vec<u64> = (1..=10_000).map(|r| (1e6 * (r as f64).powf(-1.2)) as u64).collect();
        let z = fit_zipf(&counts).expect("fit");
        assert!((z.exponent - 1.2).abs() < 0.02, "{z:?}");
        assert!(fit_zipf(&[5, 4, 3]).is_none());
    }

    #[test]
    fn empty_collector() {
        let s = StatsCollector::new().finish(5);
        assert_eq!(s.packets, 0);
        assert!(s.frame_size.is_none() && s.zipf.is_none() && s.packets_per_flow.is_none());
        assert!(!s.to_string().is_empty());
    }
}
