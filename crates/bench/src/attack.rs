//! `flowplane bench attack` (issue 33 item 6): the chains the issue names
//! under the attacks it names, each beside the same chain on normal traffic
//! in the same run — one core, in-memory replay, fresh tables per row, the
//! tables filled during the warm-up so each row measures the steady state.
//!
//! Scenarios (traces crafted here, deterministic; `--write-traces DIR` saves
//! them as pcap so tshark/scapy can check they are what they claim):
//! * `syn-flood` / `syn-flood-evict`: `fsc` with a table of 2 x `flows`
//!   entries; normal = `flows` TCP flows of 8 packets; attack = 16 x `flows`
//!   spoofed sources, one SYN each, to one server port: the table fills and
//!   every later new flow is refused (`--table-full reject`) or evicts the
//!   least recently seen of its 16 candidates (`evict`).
//! * `udp-flood`: `ddos(threshold=8, window=0.01)`; each pass of a trace
//!   spans one window (10 ms of packet time); normal = `flows` sources of 4
//!   packets (under the threshold); attack = 8 x `flows` sources of 16
//!   packets: 4 x the source table, so most sources are judged by the
//!   count-min sketch (`sketch_dropped`).
//! * `nat-exhaustion`: `nat` (one address; quick: 1,024 ports); normal =
//!   half the pool's worth of flows; attack = 4 x the pool in new flows of 2
//!   packets: every flow past the pool is refused (`pool_exhausted`,
//!   `tables.refused`), and inserts nothing.
//! * `hash-collision`: `fsc` with a small table (2,048 entries; quick 512);
//!   normal = half its capacity in flows; attack = flows built offline so
//!   every candidate position of each is the same under a secret the attacker
//!   learnt, for the table layout the chain compiler picks for `fsc`: one
//!   bucket pair (16 slots) of the bucketed layout, one home's window (128
//!   positions) of the inline one; 48 more flows than that room, refused on
//!   every packet; run once with that leaked secret and once with the run's
//!   own random secret.
//! * `fragment-flood`: `fsc`; normal = the syn-flood normal trace's shape in
//!   UDP; attack = 8 x `flows` spoofed sources each sending one UDP datagram
//!   in 3 IPv4 fragments (non-first fragments are keyed without ports).
//!
//! Every attack row carries `cycles_vs_normal` and `mpps_vs_normal` against
//! the same scenario's normal row under the same executor, what got through
//! (`passed`: packets out / packets in) and the counters that say what the
//! tables and NFs did (over the whole run, warm-up included).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use flowplane_engine::exec::{random_hash_seed, ExecConfig, ExecKind};
use flowplane_engine::runner::Output;
use flowplane_engine::{run, spec, RunConfig};
use flowplane_io::replay::{ReplayBuilder, ReplayTrace};
use flowplane_scale::{Dispatch, RssDispatcher};
use flowplane_table::{FlowTable, FullPolicy, Layout, TableConfig};
use flowplane_trace::{PcapWriter, WriterOptions};
use flowplane_wire::checksum;
use flowplane_wire::flow::FiveTupleV4;
use flowplane_wire::hash::HashableKey;
use serde::Serialize;

use crate::table::SplitMix;

/// Scenario names, in run order.
pub const SCENARIOS: [&str; 6] =
    ["syn-flood", "syn-flood-evict", "udp-flood", "nat-exhaustion", "hash-collision", "fragment-flood"];

/// Flows the hash-collision attacker builds beyond what their shared positions hold (refused on every packet).
pub const OVERFLOWING_KEYS: usize = 48;
/// Slots of one bucket pair (2 buckets x 8): what the bucketed layout holds of keys sharing both buckets.
pub const PAIR_SLOTS: usize = 16;
/// The first packet's time (any fixed epoch: traces are reproducible).
const T0: u64 = 1_700_000_000_000_000_000;
/// Packet spacing of the traces whose time does not matter (10 Mpps of packet time).
const GAP_NS: u64 = 100;
/// `udp-flood`: one pass of either trace spans one ddos window.
const DDOS_WINDOW_NS: u64 = 10_000_000;
/// `udp-flood`: packets a source may send per window.
const DDOS_THRESHOLD: u64 = 8;
const SERVER: [u8; 4] = [172, 16, 0, 1];

/// What to run.
#[derive(Clone, Debug)]
pub struct AttackOptions {
    /// Legitimate flows (sources) of the normal traces; the attacks scale with it.
    pub flows: u64,
    /// Seconds per measurement.
    pub seconds: f64,
    /// Seconds of warm-up before each measurement.
    pub warmup: f64,
    /// Passes over each trace instead of `seconds` (no warm-up): every pass is measured, so the counters are
    /// the traces' whatever the machine's speed (the quick mode's, for tests).
    pub loops: Option<u64>,
    /// Packets per batch.
    pub batch: usize,
    /// Executors (each scenario runs under each).
    pub execs: Vec<ExecKind>,
    /// Scenarios to run (empty: all).
    pub only: Vec<String>,
    /// `nat-exhaustion`'s port range per address.
    pub nat_ports: (u16, u16),
    /// `hash-collision`'s table capacity.
    pub collision_table: usize,
    /// Write every trace as pcap into this directory (`<scenario>.normal.pcap`, `<scenario>.attack.pcap`).
    pub write_traces: Option<PathBuf>,
}

impl Default for AttackOptions {
    fn default() -> Self {
        AttackOptions {
            flows: 8192,
            seconds: 1.0,
            warmup: 0.3,
            loops: None,
            batch: 64,
            execs: vec![ExecKind::BATCH, ExecKind::parse("rtc").unwrap_or(ExecKind::BATCH)],
            only: Vec::new(),
            nat_ports: (1024, 65535),
            collision_table: 2048,
            write_traces: None,
        }
    }
}

impl AttackOptions {
    /// Small and short: a CI smoke run of a few seconds, even in a debug build.
    pub fn quick() -> Self {
        AttackOptions {
            flows: 128,
            seconds: 0.03,
            warmup: 0.0,
            loops: Some(3),
            execs: vec![ExecKind::BATCH],
            nat_ports: (1024, 2047),
            collision_table: 512,
            ..AttackOptions::default()
        }
    }

    fn wants(&self, s: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|o| o == s)
    }
}

/// One measurement.
#[derive(Clone, Debug, Serialize)]
pub struct AttackRow {
    /// Scenario name (one of [`SCENARIOS`]).
    pub scenario: String,
    /// `normal`, `attack`, or for `hash-collision` `attack (leaked secret)` / `attack (random secret)`.
    pub traffic: String,
    /// Chain spec.
    pub chain: String,
    /// Executor.
    pub exec: String,
    /// `--table-full` policy: reject or evict.
    pub table_full_policy: String,
    /// Flow-table capacity (entries; the shared source table of `ddos` too).
    pub table_capacity: u64,
    /// Packets in one pass of the trace.
    pub trace_packets: u64,
    /// Distinct flows (or sources) in the trace.
    pub trace_flows: u64,
    /// Million packets/s (one core).
    pub mpps: f64,
    /// TSC cycles per packet.
    pub cycles_per_packet: f64,
    /// Packets out / packets in (what got through).
    pub passed: f64,
    /// Packets processed (measured part).
    pub packets: u64,
    /// Packets dropped (measured part).
    pub dropped: u64,
    /// Inserts refused because the flow table was full.
    pub table_full: u64,
    /// Entries evicted to make room (`evict`).
    pub evictions: u64,
    /// New flows an NF refused (their entry removed as never inserted).
    pub refused: u64,
    /// Flow-table insertions.
    pub insertions: u64,
    /// Shared (coarse) table inserts refused because it was full.
    pub shared_table_full: u64,
    /// `ddos`: packets of untracked sources dropped by the sketch.
    pub sketch_dropped: u64,
    /// `nat`: new flows dropped because the port pool was exhausted.
    pub pool_exhausted: u64,
    /// Later IPv4 fragments that followed their first fragment's flow (the fragment table).
    pub fragments_followed: u64,
    /// Later fragments whose first fragment was not in the fragment table.
    pub fragment_orphans: u64,
    /// Cycles per packet / the same scenario's normal row's (same executor).
    pub cycles_vs_normal: Option<f64>,
    /// Mpps / the same scenario's normal row's.
    pub mpps_vs_normal: Option<f64>,
    /// Process CPU time over wall time during the run.
    pub cpu_share: f64,
}

/// The hash-collision attack's keys.
#[derive(Clone, Debug, Serialize)]
pub struct CollisionInfo {
    /// The secret the attacker built the keys against (run as `--hash-seed` in the leaked row).
    pub leaked_seed: u32,
    /// The secret of the `attack (random secret)` row.
    pub random_seed: u32,
    /// Table capacity the keys were built for.
    pub table_capacity: u64,
    /// The bucket pair every key's two candidates fall in (inline layout: the home position, twice).
    pub buckets: (usize, usize),
    /// The table layout the keys were built for (`fsc`'s, as the chain compiler picks it).
    pub layout: String,
    /// Keys built.
    pub keys: usize,
    /// Keys hashed to find them.
    pub tried: u64,
}

/// All rows.
#[derive(Clone, Debug, Serialize)]
pub struct AttackReport {
    /// Rows in run order.
    pub rows: Vec<AttackRow>,
    /// The hash-collision attack, when it ran.
    pub collision: Option<CollisionInfo>,
}

/// A crafted trace: loaded for replay and, optionally, written as pcap.
struct Trace {
    replay: Arc<ReplayTrace>,
    packets: u64,
    flows: u64,
}

/// Frames in, one replay queue (and a pcap file) out.
struct TraceOut {
    builder: ReplayBuilder,
    rss: RssDispatcher,
    pcap: Option<PcapWriter<std::fs::File>>,
    packets: u64,
    err: Option<String>,
}

impl TraceOut {
    fn new(packets: usize, path: Option<PathBuf>) -> Result<Self, String> {
        let mut builder = ReplayBuilder::new(1);
        builder.reserve(packets, 64);
        let pcap = match path {
            Some(p) => {
                let opts = WriterOptions { nanosecond: true, ..WriterOptions::default() };
                Some(PcapWriter::create(&p, opts).map_err(|e| format!("{}: {e}", p.display()))?)
            }
            None => None,
        };
        Ok(TraceOut {
            builder,
            rss: RssDispatcher::new(1, false).map_err(|e| e.to_string())?,
            pcap,
            packets: 0,
            err: None,
        })
    }

    fn push(&mut self, frame: &[u8], ts: u64) {
        let (_, h) = self.rss.classify(frame).unwrap_or((0, 0));
        if let Err(e) = self.builder.push(0, frame, h, ts) {
            self.err.get_or_insert(e.to_string());
        }
        if let Some(w) = &mut self.pcap {
            if let Err(e) = w.write_packet(ts, frame, frame.len() as u32) {
                self.err.get_or_insert(e.to_string());
            }
        }
        self.packets += 1;
    }

    fn finish(self, flows: u64) -> Result<Trace, String> {
        if let Some(e) = self.err {
            return Err(e);
        }
        if let Some(w) = self.pcap {
            w.finish().map_err(|e| e.to_string())?;
        }
        Ok(Trace { replay: self.builder.build(), packets: self.packets, flows })
    }
}

/// Ethernet + IPv4 around `payload` (the IP payload: a whole L4 segment or a fragment of one), padded to 60
/// bytes. `frag` is the IPv4 flags-and-offset word.
fn ipv4(out: &mut Vec<u8>, src: [u8; 4], dst: [u8; 4], proto: u8, id: u16, frag: u16, payload: &[u8]) {
    out.clear();
    out.extend_from_slice(&[2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00]);
    let total = (20 + payload.len()) as u16;
    let mut h = [0u8; 20];
    h[0] = 0x45;
    h[2..4].copy_from_slice(&total.to_be_bytes());
    h[4..6].copy_from_slice(&id.to_be_bytes());
    h[6..8].copy_from_slice(&frag.to_be_bytes());
    h[8] = 64;
    h[9] = proto;
    h[12..16].copy_from_slice(&src);
    h[16..20].copy_from_slice(&dst);
    let c = checksum::checksum(&h);
    h[10..12].copy_from_slice(&c.to_be_bytes());
    out.extend_from_slice(&h);
    out.extend_from_slice(payload);
    if out.len() < 60 {
        out.resize(60, 0);
    }
}

/// A UDP segment (`payload_len` bytes of payload, its first 8 the packet's index) with its checksum.
fn udp_segment(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16, payload_len: usize, index: u64) -> Vec<u8> {
    let mut u = vec![0u8; 8 + payload_len];
    u[0..2].copy_from_slice(&sport.to_be_bytes());
    u[2..4].copy_from_slice(&dport.to_be_bytes());
    u[4..6].copy_from_slice(&((8 + payload_len) as u16).to_be_bytes());
    let n = payload_len.min(8);
    u[8..8 + n].copy_from_slice(&index.to_be_bytes()[..n]);
    l4_checksum(src, dst, 17, &mut u, 6);
    u
}

/// A TCP segment without payload.
fn tcp_segment(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16, flags: u8, seq: u32) -> Vec<u8> {
    let mut t = vec![0u8; 20];
    t[0..2].copy_from_slice(&sport.to_be_bytes());
    t[2..4].copy_from_slice(&dport.to_be_bytes());
    t[4..8].copy_from_slice(&seq.to_be_bytes());
    t[12] = 5 << 4;
    t[13] = flags;
    t[14..16].copy_from_slice(&65535u16.to_be_bytes());
    l4_checksum(src, dst, 6, &mut t, 16);
    t
}

fn l4_checksum(src: [u8; 4], dst: [u8; 4], proto: u8, seg: &mut [u8], at: usize) {
    seg[at..at + 2].copy_from_slice(&[0, 0]);
    let ph = checksum::pseudo_header_v4(src, dst, proto, seg.len() as u16);
    let mut c = checksum::finish(checksum::combine(ph, checksum::sum(seg)));
    if proto == 17 && c == 0 {
        c = 0xffff;
    }
    seg[at..at + 2].copy_from_slice(&c.to_be_bytes());
}

const TCP_SYN: u8 = 0x02;
const TCP_ACK: u8 = 0x10;

/// A distinct 10.0.0.0/8 address per `i < 2^24` (an odd multiply and an xor are bijections mod 2^24).
fn inside(i: u64, salt: u32) -> [u8; 4] {
    let x = ((i as u32).wrapping_mul(0x9E37_79B1) ^ salt) & 0xFF_FFFF;
    (0x0A00_0000 | x).to_be_bytes()
}

/// Each of `flows` flows repeated `per_flow` times, in a random order (deterministic in `seed`).
fn shuffled(flows: u64, per_flow: u64, seed: u64) -> Vec<u32> {
    let mut v: Vec<u32> = (0..flows * per_flow).map(|i| (i % flows) as u32).collect();
    let mut rng = SplitMix(seed);
    for i in (1..v.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
    v
}

fn pcap_path(opts: &AttackOptions, scenario: &str, which: &str) -> Option<PathBuf> {
    opts.write_traces.as_ref().map(|d| d.join(format!("{scenario}.{which}.pcap")))
}

/// `flows` UDP (or TCP ACK) flows of `per_flow` packets in a random order, `gap` ns apart.
fn normal_trace(flows: u64, per_flow: u64, tcp: bool, gap: u64, path: Option<PathBuf>) -> Result<Trace, String> {
    let order = shuffled(flows, per_flow, 11);
    let mut out = TraceOut::new(order.len(), path)?;
    let mut f = Vec::with_capacity(64);
    for (n, &i) in order.iter().enumerate() {
        let src = inside(u64::from(i), 0x11_1111);
        let sport = 1024 + (i % 60_000) as u16;
        let seg = if tcp {
            tcp_segment(src, SERVER, sport, 443, TCP_ACK, n as u32)
        } else {
            udp_segment(src, SERVER, sport, 443, 18, n as u64)
        };
        ipv4(&mut f, src, SERVER, if tcp { 6 } else { 17 }, n as u16, 0, &seg);
        out.push(&f, T0 + n as u64 * gap);
    }
    out.finish(flows)
}

/// One SYN from each of `sources` spoofed sources to the server's port 80.
fn syn_flood(sources: u64, path: Option<PathBuf>) -> Result<Trace, String> {
    let mut out = TraceOut::new(sources as usize, path)?;
    let mut f = Vec::with_capacity(64);
    let mut rng = SplitMix(5);
    for n in 0..sources {
        let src = inside(n, 0x5A_5A5A);
        let r = rng.next_u64();
        let seg = tcp_segment(src, SERVER, 1024 + (r % 64_000) as u16, 80, TCP_SYN, (r >> 32) as u32);
        ipv4(&mut f, src, SERVER, 6, r as u16, 0, &seg);
        out.push(&f, T0 + n * GAP_NS);
    }
    out.finish(sources)
}

/// `sources` sources of `per_source` UDP packets each, random order; one pass spans `span_ns`.
fn source_flood(
    sources: u64,
    per_source: u64,
    salt: u32,
    span_ns: u64,
    path: Option<PathBuf>,
) -> Result<Trace, String> {
    let order = shuffled(sources, per_source, u64::from(salt));
    let gap = (span_ns / order.len().max(1) as u64).max(1);
    let mut out = TraceOut::new(order.len(), path)?;
    let mut f = Vec::with_capacity(64);
    for (n, &i) in order.iter().enumerate() {
        let src = inside(u64::from(i), salt);
        let seg = udp_segment(src, SERVER, 4000 + (i % 1000) as u16, 53, 18, n as u64);
        ipv4(&mut f, src, SERVER, 17, n as u16, 0, &seg);
        out.push(&f, T0 + n as u64 * gap);
    }
    out.finish(sources)
}

/// `flows` new UDP flows from inside of `per_flow` packets each (nat's outbound direction), random order.
fn nat_flows(flows: u64, per_flow: u64, salt: u32, path: Option<PathBuf>) -> Result<Trace, String> {
    let order = shuffled(flows, per_flow, u64::from(salt) ^ 3);
    let mut out = TraceOut::new(order.len(), path)?;
    let mut f = Vec::with_capacity(64);
    let remote = [198, 51, 100, 1];
    for (n, &i) in order.iter().enumerate() {
        let src = inside(u64::from(i), salt);
        let seg = udp_segment(src, remote, 20_000 + (i % 40_000) as u16, 443, 18, n as u64);
        ipv4(&mut f, src, remote, 17, n as u16, 0, &seg);
        out.push(&f, T0 + n as u64 * GAP_NS);
    }
    out.finish(flows)
}

/// The i-th candidate key of the collision search: UDP from a distinct inside address to the server's port 53.
fn collision_key(i: u64) -> ([u8; 4], u16) {
    (inside(i, 0x0C_0C0C), 1024 + (i % 50_000) as u16)
}

fn collision_tuple(i: u64) -> FiveTupleV4 {
    let (s, sport) = collision_key(i);
    FiveTupleV4::new(s.into(), SERVER.into(), sport, 53, 17)
}

/// The collision search's result: the keys' indices, their bucket pair, the keys tried.
type Colliding = (Vec<u64>, (usize, usize), u64);

/// The layout the chain compiler picks for `chain`'s IPv4 table of `capacity` flows.
fn chain_layout(chain: &str, capacity: usize) -> Result<Layout, String> {
    let spec = spec::parse(chain).map_err(|e| e.to_string())?;
    let c = flowplane_engine::chain::Chain::build(&spec).map_err(|e| e.to_string())?;
    Ok(flowplane_engine::store::store_layout::<FiveTupleV4>(true, c.state_size.max(1), capacity))
}

/// Searches keys whose candidate positions (both buckets, or the inline home) are the same under `seed` in a
/// table of `capacity` and layout `layout` (what an attacker who learnt the secret computes offline): `extra`
/// more keys than such positions hold. Returns the candidates' indices, the positions, the keys tried.
fn colliding_keys(capacity: usize, seed: u32, layout: Layout, extra: usize) -> Result<Colliding, String> {
    let cfg = TableConfig { layout, ..TableConfig::new(capacity, 8) };
    let t = FlowTable::<FiveTupleV4>::new(cfg).map_err(|e| e.to_string())?;
    let want = t.collision_room() + extra;
    let target = t.candidate_buckets(collision_tuple(0).hash64(seed));
    let mut keys = vec![0];
    let mut i = 1u64;
    // ~2 / buckets^2 of the keys qualify: bounded so a huge table is refused, not searched for hours.
    let limit = 1u64 << 32;
    while keys.len() < want {
        if i >= limit {
            return Err(format!("hash-collision: no {want} colliding keys in {limit} tries (table too large)"));
        }
        let (a, b) = t.candidate_buckets(collision_tuple(i).hash64(seed));
        if (a, b) == target || (b, a) == target {
            keys.push(i);
        }
        i += 1;
    }
    Ok((keys, target, i))
}

/// The colliding keys, `per_key` packets each, random order.
fn collision_trace(keys: &[u64], per_key: u64, path: Option<PathBuf>) -> Result<Trace, String> {
    let order = shuffled(keys.len() as u64, per_key, 17);
    let mut out = TraceOut::new(order.len(), path)?;
    let mut f = Vec::with_capacity(64);
    for (n, &k) in order.iter().enumerate() {
        let (src, sport) = collision_key(keys[k as usize]);
        let seg = udp_segment(src, SERVER, sport, 53, 18, n as u64);
        ipv4(&mut f, src, SERVER, 17, n as u16, 0, &seg);
        out.push(&f, T0 + n as u64 * GAP_NS);
    }
    out.finish(keys.len() as u64)
}

/// Fragment payload per fragment (a multiple of 8); each datagram is a UDP header and 40 bytes of payload
/// (48 bytes of IP payload) in three fragments.
const FRAG: usize = 16;

/// One UDP datagram from each of `sources` spoofed sources, each in three IPv4 fragments sent in order.
fn fragment_flood(sources: u64, path: Option<PathBuf>) -> Result<Trace, String> {
    let mut out = TraceOut::new(sources as usize * 3, path)?;
    let mut f = Vec::with_capacity(64);
    let mut n = 0u64;
    for s in 0..sources {
        let src = inside(s, 0x3F_3F3F);
        let dgram = udp_segment(src, SERVER, 5000 + (s % 50_000) as u16, 9999, 40, s);
        let id = (s as u16).wrapping_mul(7) | 1;
        for (k, chunk) in dgram.chunks(FRAG).enumerate() {
            let more = if (k + 1) * FRAG < dgram.len() { 0x2000 } else { 0 };
            ipv4(&mut f, src, SERVER, 17, id, more | (k * FRAG / 8) as u16, chunk);
            out.push(&f, T0 + n * GAP_NS);
            n += 1;
        }
    }
    out.finish(sources)
}

/// What one run measured.
struct Measured {
    report: flowplane_engine::Report,
    cpu_share: f64,
}

fn measure(
    opts: &AttackOptions,
    trace: &Trace,
    chain: &str,
    kind: ExecKind,
    capacity: usize,
    policy: FullPolicy,
    seed: u32,
) -> Result<Measured, String> {
    let spec = spec::parse(chain).map_err(|e| e.to_string())?;
    let cfg = RunConfig {
        cores: 1,
        batch_size: opts.batch,
        loops: opts.loops,
        duration: opts.loops.is_none().then(|| Duration::from_secs_f64(opts.seconds)),
        warmup: (opts.loops.is_none() && opts.warmup > 0.0).then(|| Duration::from_secs_f64(opts.warmup)),
        exec: ExecConfig {
            kind,
            flows: capacity,
            // Nothing expires during a measurement: a full table stays full.
            default_idle_timeout_ns: 3_600_000_000_000,
            full_policy: policy,
            hash_seed: seed,
            ..ExecConfig::default()
        },
        ..RunConfig::default()
    };
    let (cpu0, wall0) = (crate::pipeline::process_cpu_ns(), std::time::Instant::now());
    let report = run(&cfg, &spec, trace.replay.clone(), Output::Discard).map_err(|e| format!("{chain}: {e}"))?;
    let wall = wall0.elapsed().as_nanos() as f64;
    let cpu_share =
        if wall > 0.0 { (crate::pipeline::process_cpu_ns().saturating_sub(cpu0) as f64 / wall).min(1.0) } else { 0.0 };
    Ok(Measured { report, cpu_share })
}

fn detail(r: &flowplane_engine::Report, key: &str) -> u64 {
    r.nfs.iter().filter_map(|n| n.details.as_ref()).filter_map(|d| d.get(key)).filter_map(|v| v.as_u64()).sum()
}

/// One scenario: its chain and table, the normal trace and the attack variants (name, trace, hash seed).
struct Scenario {
    name: &'static str,
    chain: String,
    capacity: usize,
    policy: FullPolicy,
    normal: Trace,
    attacks: Vec<(String, Arc<Trace>, u32)>,
}

fn build(opts: &AttackOptions, name: &'static str, collision: &mut Option<CollisionInfo>) -> Result<Scenario, String> {
    let l = opts.flows;
    let seed = random_hash_seed();
    let p = |which| pcap_path(opts, name, which);
    let one = |t: Trace| vec![("attack".to_string(), Arc::new(t), seed)];
    Ok(match name {
        "syn-flood" | "syn-flood-evict" => {
            let policy = if name == "syn-flood" { FullPolicy::Reject } else { FullPolicy::EvictLruIdle };
            Scenario {
                name,
                chain: "fsc".into(),
                capacity: 2 * l as usize,
                policy,
                normal: normal_trace(l, 8, true, GAP_NS, p("normal"))?,
                attacks: one(syn_flood(16 * l, p("attack"))?),
            }
        }
        "udp-flood" => Scenario {
            name,
            chain: format!("ddos(threshold={DDOS_THRESHOLD}, window={})", DDOS_WINDOW_NS as f64 / 1e9),
            capacity: 2 * l as usize,
            policy: FullPolicy::Reject,
            normal: source_flood(l, DDOS_THRESHOLD / 2, 0x22_2222, DDOS_WINDOW_NS, p("normal"))?,
            attacks: one(source_flood(8 * l, 2 * DDOS_THRESHOLD, 0x33_3333, DDOS_WINDOW_NS, p("attack"))?),
        },
        "nat-exhaustion" => {
            let (lo, hi) = opts.nat_ports;
            let pool = u64::from(hi - lo) + 1;
            Scenario {
                name,
                chain: format!("nat(ports={lo}-{hi})"),
                capacity: (2 * pool + l) as usize,
                policy: FullPolicy::Reject,
                normal: nat_flows((pool / 2).min(l).max(1), 8, 0x44_4444, p("normal"))?,
                attacks: one(nat_flows(4 * pool, 2, 0x55_5555, p("attack"))?),
            }
        }
        "hash-collision" => {
            let cap = opts.collision_table;
            let leaked = random_hash_seed();
            let layout = chain_layout("fsc", cap)?;
            let (keys, buckets, tried) = colliding_keys(cap, leaked, layout, OVERFLOWING_KEYS)?;
            let mut secret = random_hash_seed();
            while secret == leaked {
                secret = random_hash_seed();
            }
            *collision = Some(CollisionInfo {
                leaked_seed: leaked,
                random_seed: secret,
                table_capacity: cap as u64,
                buckets,
                layout: layout.name().into(),
                keys: keys.len(),
                tried,
            });
            let attack = Arc::new(collision_trace(&keys, 64, p("attack"))?);
            Scenario {
                name,
                chain: "fsc".into(),
                capacity: cap,
                policy: FullPolicy::Reject,
                normal: normal_trace(cap as u64 / 2, 16, false, GAP_NS, p("normal"))?,
                attacks: vec![
                    ("attack (leaked secret)".into(), attack.clone(), leaked),
                    ("attack (random secret)".into(), attack, secret),
                ],
            }
        }
        "fragment-flood" => Scenario {
            name,
            chain: "fsc".into(),
            capacity: 2 * l as usize,
            policy: FullPolicy::Reject,
            normal: normal_trace(l, 8, false, GAP_NS, p("normal"))?,
            attacks: one(fragment_flood(8 * l, p("attack"))?),
        },
        other => return Err(format!("bench attack: no scenario '{other}'")),
    })
}

/// Runs the scenarios.
pub fn run_attack(opts: &AttackOptions) -> Result<AttackReport, String> {
    if let Some(d) = &opts.write_traces {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    let mut rows = Vec::new();
    let mut collision = None;
    for &name in SCENARIOS.iter().filter(|s| opts.wants(s)) {
        let sc = build(opts, name, &mut collision)?;
        let policy = match sc.policy {
            FullPolicy::Reject => "reject",
            FullPolicy::EvictLruIdle => "evict",
        };
        for &kind in &opts.execs {
            let normal_seed = sc.attacks.first().map_or_else(random_hash_seed, |a| a.2);
            let mut runs: Vec<(String, &Trace, u32)> = vec![("normal".into(), &sc.normal, normal_seed)];
            runs.extend(sc.attacks.iter().map(|(n, t, s)| (n.clone(), &**t, *s)));
            let mut base: Option<(f64, f64)> = None;
            for (traffic, trace, seed) in runs {
                let m = measure(opts, trace, &sc.chain, kind, sc.capacity, sc.policy, seed)?;
                let r = &m.report;
                let vs = base.map(|(c, mp)| {
                    (if c > 0.0 { r.cycles_per_packet / c } else { 0.0 }, if mp > 0.0 { r.mpps / mp } else { 0.0 })
                });
                if traffic == "normal" {
                    base = Some((r.cycles_per_packet, r.mpps));
                }
                rows.push(AttackRow {
                    scenario: sc.name.to_string(),
                    traffic,
                    chain: sc.chain.clone(),
                    exec: kind.to_string(),
                    table_full_policy: policy.to_string(),
                    table_capacity: r.tables.capacity,
                    trace_packets: trace.packets,
                    trace_flows: trace.flows,
                    mpps: r.mpps,
                    cycles_per_packet: r.cycles_per_packet,
                    passed: if r.packets > 0 { r.packets_out as f64 / r.packets as f64 } else { 0.0 },
                    packets: r.packets,
                    dropped: r.dropped,
                    table_full: r.tables.table_full,
                    evictions: r.tables.evictions,
                    refused: r.tables.refused,
                    insertions: r.tables.insertions,
                    shared_table_full: r.tables.shared_table_full,
                    sketch_dropped: detail(r, "sketch_dropped"),
                    pool_exhausted: detail(r, "dropped_pool_exhausted"),
                    fragments_followed: r.tables.fragments.followed,
                    fragment_orphans: r.tables.fragments.orphans,
                    cycles_vs_normal: vs.map(|v| v.0),
                    mpps_vs_normal: vs.map(|v| v.1),
                    cpu_share: m.cpu_share,
                });
            }
        }
    }
    Ok(AttackReport { rows, collision })
}

impl AttackReport {
    /// Mpps per scenario, normal beside attack, for the first executor's rows: one group of bars per scenario (its
    /// name under the group), each bar's figure and its ratio to normal above it, the legend beside the plot.
    pub fn plot_png(&self, path: &Path) -> Result<(), String> {
        use crate::plot::Sample;
        use plotters::prelude::*;
        if !crate::plot::register_font() {
            return Err("no TrueType font found for the plot's text (install fonts-dejavu-core)".to_string());
        }
        let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
        let exec = self.rows.first().map_or(String::new(), |r| r.exec.clone());
        let rows: Vec<&AttackRow> = self.rows.iter().filter(|r| r.exec == exec).collect();
        let mut scenarios: Vec<&str> = Vec::new();
        for r in &rows {
            if !scenarios.contains(&r.scenario.as_str()) {
                scenarios.push(r.scenario.as_str());
            }
        }
        let ymax = rows.iter().map(|r| r.mpps).fold(0.1f64, f64::max) * 1.2;
        let root = BitMapBackend::new(path, (1500, 700)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        crate::plot::footer(&root, true).map_err(|e| err(&e))?;
        let root = root.margin(0, 22, 0, 0);
        let (plot, legend) = root.split_horizontally(1120);
        // x in hundredths of a group (integer coordinates take chosen label points): group g's centre is 100 g + 50.
        let keys: Vec<u32> = (0..scenarios.len() as u32).map(|g| 100 * g + 50).collect();
        let mut chart = ChartBuilder::on(&plot)
            .caption(format!("Under attack, one core, executor {exec}: normal vs attack traffic"), ("sans-serif", 20))
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(60)
            .build_cartesian_2d((0u32..100 * scenarios.len().max(1) as u32).with_key_points(keys), 0.0..ymax)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_label_formatter(&|x| scenarios.get((*x / 100) as usize).map_or(String::new(), |s| s.to_string()))
            .x_desc("scenario")
            .y_desc("Mpps")
            .draw()
            .map_err(|e| err(&e))?;
        // Up to three bars per scenario: normal, attack, and hash-collision's second attack row.
        let colours = [crate::plot::colour(5), crate::plot::colour(6), crate::plot::colour(1)];
        let w = 26u32;
        let mut used = [false; 3];
        for (g, sc) in scenarios.iter().enumerate() {
            let mine: Vec<&&AttackRow> = rows.iter().filter(|r| r.scenario == *sc).collect();
            // Centred whatever the number of bars.
            let start = 100 * g as u32 + 50 - w * mine.len().min(3) as u32 / 2;
            for (slot, r) in mine.iter().enumerate().take(3) {
                used[slot] = true;
                let x0 = start + slot as u32 * w;
                let c = colours[slot];
                chart
                    .draw_series([Rectangle::new([(x0, 0.0), (x0 + w * 9 / 10, r.mpps)], c.filled())])
                    .map_err(|e| err(&e))?;
                let ratio = r.mpps_vs_normal.filter(|_| slot > 0).map_or(String::new(), |x| format!(" {x:.2}x"));
                let label = Text::new(format!("{:.2}{ratio}", r.mpps), (x0, r.mpps + ymax * 0.02), ("sans-serif", 12));
                chart.draw_series([label]).map_err(|e| err(&e))?;
            }
        }
        let names = ["normal traffic", "attack traffic", "hash-collision: the same keys, random secret"];
        let mut entries: Vec<(Sample, String)> =
            (0..3).filter(|&k| used[k]).map(|k| (Sample::Bar(colours[k]), names[k].to_string())).collect();
        if used[2] {
            entries[1].1 = "attack traffic (hash-collision: leaked secret)".to_string();
        }
        entries.push((Sample::Heading, "above a bar: Mpps (x normal)".to_string()));
        crate::plot::side_legend(&legend, &entries).map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
        Ok(())
    }
}

impl fmt::Display for AttackReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "attack: 1 core, in-memory replay; each attack row against its scenario's normal row (same executor)"
        )?;
        writeln!(
            f,
            "{:<16} {:<23} {:<6} {:>7} {:>8} {:>9} {:>7} {:>7} {:>8} {:>8} {:>8} {:>8} {:>8}",
            "scenario",
            "traffic",
            "exec",
            "policy",
            "Mpps",
            "cyc/pkt",
            "x cyc",
            "passed",
            "tbl_full",
            "evicted",
            "refused",
            "sketch",
            "no_port"
        )?;
        for r in &self.rows {
            let x = r.cycles_vs_normal.map_or("-".to_string(), |v| format!("{v:.2}"));
            writeln!(
                f,
                "{:<16} {:<23} {:<6} {:>7} {:>8.2} {:>9.1} {:>7} {:>6.1}% {:>8} {:>8} {:>8} {:>8} {:>8}",
                r.scenario,
                r.traffic,
                r.exec,
                r.table_full_policy,
                r.mpps,
                r.cycles_per_packet,
                x,
                r.passed * 100.0,
                r.table_full,
                r.evictions,
                r.refused,
                r.sketch_dropped,
                r.pool_exhausted
            )?;
        }
        if let Some(c) = &self.collision {
            writeln!(
                f,
                "hash-collision: {} keys share buckets {:?} of a {}-entry {} table under the leaked secret {:#x} ({} \
                 keys tried); the random secret was {:#x}",
                c.keys, c.buckets, c.table_capacity, c.layout, c.leaked_seed, c.tried, c.random_seed
            )?;
        }
        // The target: nat at exhaustion, batch never slower than rtc.
        let nat =
            |e: &str| self.rows.iter().find(|r| r.scenario == "nat-exhaustion" && r.traffic == "attack" && r.exec == e);
        if let (Some(b), Some(r)) = (nat("batch"), nat("rtc")) {
            writeln!(
                f,
                "nat-exhaustion attack: batch {:.1} vs rtc {:.1} cycles/packet (batch/rtc {:.2})",
                b.cycles_per_packet,
                r.cycles_per_packet,
                if r.cycles_per_packet > 0.0 { b.cycles_per_packet / r.cycles_per_packet } else { 0.0 }
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inside_addresses_are_distinct_and_inside() {
        let mut seen = std::collections::HashSet::new();
        for i in 0..100_000 {
            let a = inside(i, 0x12_3456);
            assert_eq!(a[0], 10);
            assert!(seen.insert(a), "{i}");
        }
    }

    #[test]
    fn shuffled_holds_each_flow_per_flow_times() {
        let v = shuffled(10, 3, 1);
        let mut c = [0; 10];
        for &i in &v {
            c[i as usize] += 1;
        }
        assert_eq!(c, [3; 10]);
    }

    /// The keys found share one bucket pair (or inline home), and a table with that secret refuses all but the
    /// documented room: 16 slots of a bucket pair, the inline layout's 128-position window.
    #[test]
    fn colliding_keys_overflow_one_bucket_pair_under_their_secret() {
        let seed = 0x1234_5678;
        for (layout, room) in [(Layout::Bucketed, PAIR_SLOTS), (Layout::Inline, 128)] {
            let (keys, pair, _) = colliding_keys(512, seed, layout, 8).unwrap();
            assert_eq!(keys.len(), room + 8);
            let mut t = FlowTable::<FiveTupleV4>::new(TableConfig { layout, ..TableConfig::new(512, 8) }).unwrap();
            let refused = keys
                .iter()
                .map(|&i| collision_tuple(i))
                .filter(|k| {
                    let (a, b) = t.candidate_buckets(k.hash64(seed));
                    assert!((a, b) == pair || (b, a) == pair);
                    t.insert(k, k.hash64(seed), 0, |_| {}).is_err()
                })
                .count();
            assert_eq!(refused, 8, "{layout:?}");
        }
        // fsc's 32-byte block fits one line: the compiler stores it inline.
        assert_eq!(chain_layout("fsc", 512).unwrap(), Layout::Inline);
    }
}
