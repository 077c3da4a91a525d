//! Synthetic traffic generator: owns the traffic model behind `flowplane gen`
//! ([`GenConfig`]) and the streaming frame producer ([`Generator`]).
//!
//! The model, decided per packet with a seeded xoshiro256++ PRNG (same
//! config and seed, byte-identical output):
//!
//! * **which flow** (`--dist`): `uniform` gives every flow `packets / flows`
//!   packets (±1), each round over all flows in a fresh random order;
//!   `zipf:A` draws flow ranks i.i.d. from Zipf(A) over `flows` ranks
//!   (rejection-inversion, O(1)); `elephants:K[:S]` sends share `S` (default
//!   0.9; 1.0 = only the elephants carry traffic) of the packets to `K`
//!   elephant flows and the rest uniformly to the others; `cdf:FILE` draws
//!   each flow's relative size from an empirical CDF (lines
//!   `size cumulative_prob`) and then picks flows in proportion to their size
//!   (alias table, O(1)). With skewed distributions some of the `flows` may
//!   receive no packet: `flows` is the population, not a guaranteed count.
//! * **order** (`--order`): `random` draws every packet independently (so
//!   consecutive packets almost always belong to different flows, as in
//!   FAJITA's synthetic traces); `burst:N` (default 8) sends `N` consecutive
//!   packets of the chosen flow.
//! * **size** (`--size N | A..B | mix`): frame length as stored in the pcap
//!   (Ethernet header to payload end, no FCS). Sizes below the headers are
//!   raised to them; frames below 60 bytes are padded with a trailer.
//! * **protocol**: `udp`; `tcp` (per flow: SYN, data, FIN+ACK on the last
//!   packet); `tcp-bidir` (SYN, SYN-ACK, ACK, request/response data with
//!   consistent seq/ack numbers, FIN-ACK each way, final ACK; a flow with
//!   fewer than 6 packets gets the prefix of that script, i.e. an unfinished
//!   connection); `gtpu` (uplink G-PDUs, UDP 2152, per-UE TEID, PDU session
//!   container with a QFI, inner IPv4/UDP; four flows per UE).
//! * **patterns**: `new_flow_every = R` makes packet `i` open a new flow when
//!   `i % R == 0` and sends every other packet to one of the `flows` most
//!   recently opened flows (PNA add-on-miss insertion-rate experiment: the
//!   trace has exactly `ceil(packets / R)` flows); port scans and
//!   port-knocking sessions take `pattern_share` of the packets.
//! * **time**: packet `i` has timestamp `start + i / rate`.
//!
//! TCP needs to know each flow's last packet, so for `tcp`/`tcp-bidir` the
//! flow sequence is drawn twice from the same seed: once to count packets per
//! flow, once to emit. Memory is O(flows), never O(packets).
//!
//! Every payload of at least 8 bytes starts with the packet's index in the
//! trace (big endian), so reordering and loss are visible downstream.

mod flows;
mod frame;
mod pattern;
mod sample;
mod upf;

pub use pattern::{knock_transition, KnockSession, KnockState, KNOCK_PORTS, KNOCK_SERVER, KNOCK_SERVICE_PORT};
pub use upf::{UpfDir, UpfFlow, UpfPlan};

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use rand::SeedableRng;
use rand_distr::Zipf;

use crate::{PcapWriter, TraceError, WriterOptions};
use flows::AddrPlan;
use frame::{TcpFields, TCP_ACK, TCP_FIN, TCP_PSH, TCP_SYN};
use sample::{below, unit, AliasTable, FlowPicker, GenRng};

/// Largest `flows` accepted (flow state is O(flows)).
pub const MAX_FLOWS: u64 = 1 << 26;
/// Largest `packets` accepted (flow indices stay below 2^32).
pub const MAX_PACKETS: u64 = u32::MAX as u64;
/// Largest number of port scanners.
pub const MAX_SCANNERS: u64 = 1 << 17;
/// Timestamp of the first packet: 2023-11-14T22:13:20Z, a fixed epoch so that output is reproducible.
pub const START_NS: u64 = 1_700_000_000_000_000_000;

/// An invalid generator option or an I/O failure, as one line of text.
#[derive(Debug)]
pub enum GenError {
    /// A bad option value; the message names the option.
    Invalid(String),
    /// Reading a spec file or writing the trace failed.
    Trace(TraceError),
    /// Reading a spec file failed.
    Io(String),
}

impl fmt::Display for GenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GenError::Invalid(m) | GenError::Io(m) => f.write_str(m),
            GenError::Trace(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for GenError {}

impl From<TraceError> for GenError {
    fn from(e: TraceError) -> Self {
        GenError::Trace(e)
    }
}

/// Largest size-mix or CDF file read: such files are a few lines.
const MAX_SPEC_FILE: u64 = 16 << 20;

/// Reads a size-mix or CDF file, refusing devices and files past [`MAX_SPEC_FILE`] (`/dev/zero` never ends).
fn read_small_file(path: &Path) -> Result<String, String> {
    use std::io::Read;
    use std::os::unix::fs::FileTypeExt;
    let f = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let ft = f.metadata().map_err(|e| e.to_string())?.file_type();
    if ft.is_char_device() || ft.is_block_device() {
        return Err("is a device, not a file".into());
    }
    let mut bytes = Vec::new();
    f.take(MAX_SPEC_FILE + 1).read_to_end(&mut bytes).map_err(|e| e.to_string())?;
    if bytes.len() as u64 > MAX_SPEC_FILE {
        return Err(format!("larger than {} MiB", MAX_SPEC_FILE >> 20));
    }
    String::from_utf8(bytes).map_err(|_| "not UTF-8 text".into())
}

fn invalid(msg: impl Into<String>) -> GenError {
    GenError::Invalid(msg.into())
}

/// Frame sizes (`--size` / `--size-mix`).
#[derive(Debug, Clone, PartialEq)]
pub enum SizeSpec {
    /// Every frame has this length.
    Fixed(u16),
    /// Uniform in `min..=max`.
    Range(u16, u16),
    /// Empirical mix: `(frame length, weight)`; weights need not sum to 1.
    Mix(Vec<(u16, f64)>),
}

const MIN_SIZE: u64 = 42;

fn parse_size_value(s: &str) -> Result<u16, GenError> {
    let v: u64 = s.trim().parse().map_err(|_| invalid(format!("bad frame size '{s}': expected a number of bytes")))?;
    if !(MIN_SIZE..=frame::MAX_FRAME as u64).contains(&v) {
        return Err(invalid(format!("frame size {v} out of range {MIN_SIZE}..={}", frame::MAX_FRAME)));
    }
    Ok(v as u16)
}

impl SizeSpec {
    /// `64` or `64..1514` (inclusive bounds).
    pub fn parse_size(s: &str) -> Result<Self, GenError> {
        if let Some((a, b)) = s.split_once("..") {
            let (a, b) = (parse_size_value(a)?, parse_size_value(b.trim_start_matches('='))?);
            if a > b {
                return Err(invalid(format!("bad size range '{s}': lower bound above upper bound")));
            }
            Ok(SizeSpec::Range(a, b))
        } else {
            Ok(SizeSpec::Fixed(parse_size_value(s)?))
        }
    }

    /// `imix`, an inline list `64:0.5,576:0.3,1500:0.2`, or a file with one
    /// `size weight` (or `size:weight`) per line (`#` comments allowed).
    ///
    /// `imix` is the simple IMIX 7:4:1 of 40/576/1500-byte IP packets as
    /// frames of 64, 590 and 1514 bytes.
    pub fn parse_mix(spec: &str) -> Result<Self, GenError> {
        if spec.eq_ignore_ascii_case("imix") {
            return Ok(SizeSpec::Mix(vec![(64, 7.0), (590, 4.0), (1514, 1.0)]));
        }
        let path = Path::new(spec);
        let (text, entries): (String, Vec<&str>);
        if path.is_file() {
            text = read_small_file(path).map_err(|e| GenError::Io(format!("{spec}: {e}")))?;
            entries =
                text.lines().map(|l| l.split('#').next().unwrap_or("").trim()).filter(|l| !l.is_empty()).collect();
        } else if spec.contains(':') {
            entries = spec.split(',').map(str::trim).filter(|l| !l.is_empty()).collect();
        } else {
            return Err(invalid(format!("size mix '{spec}': neither 'imix', 'SIZE:WEIGHT,...' nor a readable file")));
        }
        let mut mix = Vec::with_capacity(entries.len());
        for e in entries {
            let mut it = e.split(|c: char| c == ':' || c == ',' || c.is_whitespace()).filter(|t| !t.is_empty());
            let (Some(s), Some(w), None) = (it.next(), it.next(), it.next()) else {
                return Err(invalid(format!("size mix entry '{e}': expected SIZE:WEIGHT")));
            };
            let w: f64 = w.parse().map_err(|_| invalid(format!("size mix entry '{e}': bad weight")))?;
            if !w.is_finite() || w < 0.0 {
                return Err(invalid(format!("size mix entry '{e}': weight must be >= 0")));
            }
            mix.push((parse_size_value(s)?, w));
        }
        if mix.iter().map(|m| m.1).sum::<f64>() <= 0.0 {
            return Err(invalid(format!("size mix '{spec}': no positive weight")));
        }
        Ok(SizeSpec::Mix(mix))
    }
}

/// Which flow each packet belongs to (`--dist`); see the module docs.
#[derive(Debug, Clone, PartialEq)]
pub enum FlowDist {
    /// Every flow gets `packets / flows` packets, rounds in random order.
    Uniform,
    /// Zipf with this exponent over the flow ranks.
    Zipf(f64),
    /// `k` elephants take `share` of the packets.
    Elephants { k: u64, share: f64 },
    /// Empirical flow-size CDF: `(size, cumulative probability)`, increasing.
    Cdf(Vec<(f64, f64)>),
}

impl FromStr for FlowDist {
    type Err = GenError;

    /// `uniform`, `zipf:A`, `elephants:K[:SHARE]` or `cdf:FILE`.
    fn from_str(s: &str) -> Result<Self, GenError> {
        let (kind, arg) = s.split_once(':').unwrap_or((s, ""));
        match kind {
            "uniform" if arg.is_empty() => Ok(FlowDist::Uniform),
            "zipf" => {
                let a: f64 = arg.parse().map_err(|_| invalid(format!("--dist '{s}': expected zipf:EXPONENT")))?;
                if !(0.0..=10.0).contains(&a) {
                    return Err(invalid(format!("--dist '{s}': Zipf exponent must be in 0..=10")));
                }
                Ok(FlowDist::Zipf(a))
            }
            "elephants" => {
                let (k, share) = arg.split_once(':').unwrap_or((arg, "0.9"));
                let k: u64 = k.parse().map_err(|_| invalid(format!("--dist '{s}': expected elephants:K[:SHARE]")))?;
                let share: f64 = share.parse().map_err(|_| invalid(format!("--dist '{s}': bad elephant share")))?;
                if k == 0 || !(share > 0.0 && share <= 1.0) {
                    return Err(invalid(format!("--dist '{s}': need K >= 1 and 0 < SHARE <= 1")));
                }
                Ok(FlowDist::Elephants { k, share })
            }
            "cdf" if !arg.is_empty() => {
                let text =
                    read_small_file(Path::new(arg)).map_err(|e| GenError::Io(format!("--dist cdf: {arg}: {e}")))?;
                parse_cdf(&text).map_err(|m| invalid(format!("--dist cdf: {arg}: {m}")))
            }
            _ => {
                Err(invalid(format!("unknown --dist '{s}': expected uniform, zipf:A, elephants:K[:SHARE] or cdf:FILE")))
            }
        }
    }
}

/// Trace profiles resembling the SCR evaluation's traces (`--profile`).
pub const PROFILES: &[&str] = &["univdc", "backbone", "hyperscale", "single"];

impl GenConfig {
    /// Applies a trace profile: sets the flow population, the flow-size
    /// distribution and the transport (packets, sizes, seed, rate stay).
    ///
    /// - `univdc`: a university data center (Benson et al., IMC 2010, SCR's
    ///   "Univ DC"): many short flows — 100K flows whose sizes in packets
    ///   follow a heavy-tailed CDF (20% single-packet, 70% at most 8, 1% over 2K), one-way TCP.
    /// - `backbone`: an Internet backbone link (CAIDA): Zipf(1.0) popularity
    ///   over 1M flows, one-way TCP.
    /// - `hyperscale`: a hyperscaler data center (SCR's synthetic trace from
    ///   Microsoft's web-search flow-size distribution, as in DCTCP/pFabric):
    ///   10K TCP connections with SYN, SYN-ACK, data both ways and FIN both
    ///   ways, sizes drawn from that CDF (in 1460-byte segments, 4 to 13.7K).
    /// - `single`: one TCP flow (an elephant: sharding cannot split it).
    pub fn with_profile(mut self, name: &str) -> Result<GenConfig, GenError> {
        match name {
            "univdc" => {
                self.flows = 100_000;
                self.dist = FlowDist::Cdf(vec![
                    (1.0, 0.20),
                    (2.0, 0.35),
                    (4.0, 0.55),
                    (8.0, 0.70),
                    (16.0, 0.80),
                    (64.0, 0.90),
                    (256.0, 0.96),
                    (2048.0, 0.99),
                    (20_000.0, 1.0),
                ]);
                self.proto = Proto::Tcp;
            }
            "backbone" => {
                self.flows = 1_000_000;
                self.dist = FlowDist::Zipf(1.0);
                self.proto = Proto::Tcp;
            }
            "hyperscale" => {
                self.flows = 10_000;
                self.dist = FlowDist::Cdf(vec![
                    (4.0, 0.15),
                    (9.0, 0.20),
                    (13.0, 0.30),
                    (23.0, 0.40),
                    (36.0, 0.53),
                    (91.0, 0.60),
                    (457.0, 0.70),
                    (913.0, 0.80),
                    (2283.0, 0.90),
                    (4566.0, 0.97),
                    (13_699.0, 1.0),
                ]);
                self.proto = Proto::TcpBidir;
            }
            "single" => {
                self.flows = 1;
                self.dist = FlowDist::Uniform;
                self.proto = Proto::Tcp;
            }
            _ => return Err(invalid(format!("unknown --profile '{name}': expected {}", PROFILES.join(", ")))),
        }
        self.pattern = Pattern::None;
        Ok(self)
    }
}

/// Parses `size cumulative_prob` lines (whitespace or comma separated, `#` comments).
pub fn parse_cdf(text: &str) -> Result<FlowDist, String> {
    let mut pts: Vec<(f64, f64)> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut it = line.split(|c: char| c == ',' || c.is_whitespace()).filter(|t| !t.is_empty());
        let (Some(a), Some(b), None) = (it.next(), it.next(), it.next()) else {
            return Err(format!("line {}: expected 'size cumulative_prob'", n + 1));
        };
        let (size, p): (f64, f64) = match (a.parse(), b.parse()) {
            (Ok(x), Ok(y)) => (x, y),
            _ => return Err(format!("line {}: not two numbers", n + 1)),
        };
        if !(size.is_finite() && size > 0.0 && (0.0..=1.0).contains(&p)) {
            return Err(format!("line {}: need size > 0 and 0 <= prob <= 1", n + 1));
        }
        if let Some(&(ls, lp)) = pts.last() {
            if size <= ls || p < lp {
                return Err(format!("line {}: sizes must increase and probabilities must not decrease", n + 1));
            }
        }
        pts.push((size, p));
    }
    match pts.last() {
        None => Err("no data lines".into()),
        Some(&(_, p)) if p <= 0.0 => Err("last cumulative probability must be > 0".into()),
        Some(_) => Ok(FlowDist::Cdf(pts)),
    }
}

/// Packet order (`--order`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// Independent draws per packet.
    Random,
    /// Bursts of this many consecutive packets per flow.
    Burst(u32),
}

impl FromStr for Order {
    type Err = GenError;

    fn from_str(s: &str) -> Result<Self, GenError> {
        match s.split_once(':') {
            None if s == "random" => Ok(Order::Random),
            None if s == "burst" => Ok(Order::Burst(8)),
            Some(("burst", n)) => match n.parse::<u32>() {
                Ok(n) if n >= 1 => Ok(Order::Burst(n)),
                _ => Err(invalid(format!("--order '{s}': burst length must be a number >= 1"))),
            },
            _ => Err(invalid(format!("unknown --order '{s}': expected random or burst[:N]"))),
        }
    }
}

/// Transport (`--proto`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    /// UDP datagrams.
    Udp,
    /// One-way TCP: SYN, data, FIN per flow.
    Tcp,
    /// Full TCP connections in both directions.
    TcpBidir,
    /// GTP-U G-PDUs carrying IPv4/UDP.
    Gtpu,
    /// AMF messages over UDP (the `amf` NF's format): one UE per flow.
    Amf,
}

impl FromStr for Proto {
    type Err = GenError;

    fn from_str(s: &str) -> Result<Self, GenError> {
        match s {
            "udp" => Ok(Proto::Udp),
            "tcp" => Ok(Proto::Tcp),
            "tcp-bidir" => Ok(Proto::TcpBidir),
            "gtpu" | "gtp-u" => Ok(Proto::Gtpu),
            "amf" => Ok(Proto::Amf),
            _ => Err(invalid(format!("unknown --proto '{s}': expected udp, tcp, tcp-bidir, gtpu or amf"))),
        }
    }
}

/// Extra traffic mixed into the flows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// Background flows only.
    None,
    /// This many scanners sweep destination ports 1..=65535 of one target each (TCP SYN probes).
    PortScan(u64),
    /// Port-knocking sessions (see [`KnockSession`]).
    PortKnock,
}

/// Everything that defines a generated trace.
#[derive(Debug, Clone, PartialEq)]
pub struct GenConfig {
    /// Flow population (see the module docs).
    pub flows: u64,
    /// Packets in the trace.
    pub packets: u64,
    /// Frame sizes.
    pub size: SizeSpec,
    /// Flow popularity.
    pub dist: FlowDist,
    /// Packet order.
    pub order: Order,
    /// Transport.
    pub proto: Proto,
    /// IPv6 outer headers (udp, tcp, tcp-bidir).
    pub ipv6: bool,
    /// Port scan or knocking sessions.
    pub pattern: Pattern,
    /// Fraction of packets that belong to `pattern` (0..=1).
    pub pattern_share: f64,
    /// Open a new flow every this many packets (PNA insertion-rate experiment).
    pub new_flow_every: Option<u64>,
    /// Packets per second used for the timestamps.
    pub rate_pps: f64,
    /// PRNG seed.
    pub seed: u64,
    /// UPF mode of `gtpu` (`--upf NxM[:dir]`): `flows` must be N x M.
    pub upf: Option<UpfPlan>,
    /// Shifting skew: every this many packets the popularity ranks rotate
    /// to other flows (the heavy flows change; the distribution does not).
    pub shift_every: Option<u64>,
}

impl Default for GenConfig {
    fn default() -> Self {
        GenConfig {
            flows: 1000,
            packets: 100_000,
            size: SizeSpec::Fixed(64),
            dist: FlowDist::Uniform,
            order: Order::Random,
            proto: Proto::Udp,
            ipv6: false,
            pattern: Pattern::None,
            pattern_share: 0.1,
            new_flow_every: None,
            rate_pps: 10e6,
            seed: 1,
            upf: None,
            shift_every: None,
        }
    }
}

impl GenConfig {
    /// Checks option combinations; every error names the option.
    pub fn validate(&self) -> Result<(), GenError> {
        if self.flows > MAX_FLOWS {
            return Err(invalid(format!("--flows {} exceeds the maximum {MAX_FLOWS}", self.flows)));
        }
        if self.flows == 0 && (self.pattern == Pattern::None || self.pattern_share < 1.0) {
            return Err(invalid("--flows must be >= 1 (0 only with a pattern and --pattern-share 1)"));
        }
        if self.packets > MAX_PACKETS {
            return Err(invalid(format!("--packets {} exceeds the maximum {MAX_PACKETS}", self.packets)));
        }
        if !(self.rate_pps.is_finite() && self.rate_pps > 0.0 && self.rate_pps <= 1e12) {
            return Err(invalid("--rate must be a packet rate in (0, 1e12] per second"));
        }
        if !(0.0..=1.0).contains(&self.pattern_share) {
            return Err(invalid("--pattern-share must be within 0..=1"));
        }
        if self.ipv6 && self.proto == Proto::Gtpu {
            return Err(invalid("--ipv6 applies to udp, tcp and tcp-bidir, not gtpu"));
        }
        if let Some(u) = &self.upf {
            u.validate()?;
            if self.proto != Proto::Gtpu {
                return Err(invalid("--upf needs --proto gtpu"));
            }
            if self.flows != u.flows() {
                return Err(invalid(format!("--upf {u}: --flows must be sessions x PDRs = {}", u.flows())));
            }
            if self.new_flow_every.is_some() {
                return Err(invalid("--upf cannot be combined with --new-flow-every"));
            }
        }
        if self.proto == Proto::Gtpu && self.flows > 1 << 26 {
            return Err(invalid("--proto gtpu supports at most 2^26 flows (2^24 UEs)"));
        }
        match &self.size {
            SizeSpec::Range(a, b) if a > b => return Err(invalid("--size: lower bound above upper bound")),
            SizeSpec::Mix(m)
                if !m.iter().any(|e| e.1.is_finite() && e.1 > 0.0)
                    || m.iter().any(|e| !e.1.is_finite() || e.1 < 0.0) =>
            {
                return Err(invalid("--size-mix: needs at least one positive weight and no negative one"));
            }
            _ => {}
        }
        match &self.dist {
            FlowDist::Zipf(a) if !(0.0..=10.0).contains(a) => {
                return Err(invalid("--dist zipf: exponent must be in 0..=10"));
            }
            FlowDist::Elephants { k, share } if *k == 0 || !(*share > 0.0 && *share <= 1.0) => {
                return Err(invalid("--dist elephants: need K >= 1 and 0 < SHARE <= 1"));
            }
            FlowDist::Cdf(pts) if pts.is_empty() || pts.iter().all(|p| !(p.0 > 0.0 && p.1 > 0.0)) => {
                return Err(invalid("--dist cdf: needs at least one point with size > 0 and probability > 0"));
            }
            _ => {}
        }
        if self.order == Order::Burst(0) {
            return Err(invalid("--order burst: length must be >= 1"));
        }
        if let Pattern::PortScan(k) = self.pattern {
            if k == 0 || k > MAX_SCANNERS {
                return Err(invalid(format!("--portscan needs 1..={MAX_SCANNERS} scanners")));
            }
        }
        if let FlowDist::Elephants { k, .. } = self.dist {
            if k > self.flows {
                return Err(invalid(format!("--dist elephants:{k}: more elephants than --flows {}", self.flows)));
            }
        }
        if let Some(r) = self.new_flow_every {
            if r == 0 {
                return Err(invalid("--new-flow-every must be >= 1"));
            }
            if self.dist != FlowDist::Uniform {
                return Err(invalid("--new-flow-every works with --dist uniform only"));
            }
            if self.order != Order::Random {
                return Err(invalid("--new-flow-every works with --order random only"));
            }
            if self.pattern != Pattern::None {
                return Err(invalid("--new-flow-every cannot be combined with --portscan/--portknock"));
            }
            if matches!(self.proto, Proto::Tcp | Proto::TcpBidir) && self.packets.div_ceil(r) > MAX_FLOWS {
                return Err(invalid(format!("--new-flow-every {r}: TCP keeps state for at most {MAX_FLOWS} flows")));
            }
        }
        Ok(())
    }
}

/// Samples frame sizes.
#[derive(Debug)]
enum SizePicker {
    Fixed(usize),
    Range(usize, usize),
    /// Cumulative weights scaled to 2^53, with their sizes.
    Mix(Vec<(u64, usize)>),
}

impl SizePicker {
    fn new(spec: &SizeSpec) -> Self {
        match spec {
            SizeSpec::Fixed(s) => SizePicker::Fixed(*s as usize),
            SizeSpec::Range(a, b) => SizePicker::Range(*a as usize, *b as usize),
            SizeSpec::Mix(m) => {
                let total: f64 = m.iter().map(|e| e.1).sum();
                let mut acc = 0.0;
                let cum = m
                    .iter()
                    .map(|&(s, w)| {
                        acc += w;
                        (((acc / total) * (1u64 << 53) as f64) as u64, s as usize)
                    })
                    .collect();
                SizePicker::Mix(cum)
            }
        }
    }

    #[inline]
    fn pick(&self, rng: &mut GenRng) -> usize {
        match self {
            SizePicker::Fixed(s) => *s,
            SizePicker::Range(a, b) => a + below(rng, (b - a + 1) as u64) as usize,
            SizePicker::Mix(cum) => {
                let u = rng_bits53(rng);
                let i = cum.partition_point(|&(c, _)| c <= u).min(cum.len() - 1);
                cum[i].1
            }
        }
    }
}

fn rng_bits53(rng: &mut GenRng) -> u64 {
    use rand::Rng;
    rng.next_u64() >> 11
}

/// What the next packet is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Flow(u64),
    Pattern,
}

/// Draws the slot sequence; replayable from the seed (TCP counts in a first pass).
#[derive(Debug)]
struct Scheduler {
    rng: GenRng,
    picker: Option<FlowPicker>,
    order: Order,
    burst_flow: u64,
    burst_left: u32,
    new_every: Option<u64>,
    window: u64,
    opened: u64,
    pattern_share: f64,
    i: u64,
    shift_every: Option<u64>,
    flows: u64,
}

impl Scheduler {
    fn new(cfg: &GenConfig, picker: Option<FlowPicker>) -> Self {
        Scheduler {
            rng: GenRng::seed_from_u64(cfg.seed ^ 0x0005_c4ed_u64),
            picker,
            order: cfg.order,
            burst_flow: 0,
            burst_left: 0,
            new_every: cfg.new_flow_every,
            window: cfg.flows.max(1),
            opened: 0,
            pattern_share: if cfg.pattern == Pattern::None { 0.0 } else { cfg.pattern_share },
            i: 0,
            shift_every: cfg.shift_every.filter(|&s| s > 0),
            flows: cfg.flows.max(1),
        }
    }

    /// Number of flow indices the sequence can produce (bound for per-flow arrays).
    fn flow_space(cfg: &GenConfig) -> u64 {
        match cfg.new_flow_every {
            Some(r) => cfg.packets.div_ceil(r),
            None => cfg.flows,
        }
    }

    #[inline]
    fn next(&mut self) -> Slot {
        let i = self.i;
        self.i += 1;
        if let Some(r) = self.new_every {
            if i.is_multiple_of(r) {
                self.opened += 1;
                return Slot::Flow(self.opened - 1);
            }
            let live = self.opened.min(self.window);
            return Slot::Flow(self.opened - 1 - below(&mut self.rng, live));
        }
        if self.pattern_share > 0.0 && unit(&mut self.rng) < self.pattern_share {
            return Slot::Pattern;
        }
        let Some(picker) = self.picker.as_mut() else { return Slot::Pattern };
        let rank = match self.order {
            Order::Random => picker.pick(&mut self.rng),
            Order::Burst(n) => {
                if self.burst_left == 0 {
                    self.burst_flow = picker.pick(&mut self.rng);
                    self.burst_left = n;
                }
                self.burst_left -= 1;
                self.burst_flow
            }
        };
        Slot::Flow(self.shifted(rank, i))
    }

    /// Shifting skew: the flow holding popularity `rank` in the epoch of packet `i`.
    #[inline]
    fn shifted(&self, rank: u64, i: u64) -> u64 {
        match self.shift_every {
            // A rotation by a large odd step per epoch: the heavy ranks land on other flows.
            Some(e) => (rank + (i / e).wrapping_mul(0x9e37_79b9 | 1)) % self.flows,
            None => rank,
        }
    }
}

fn build_picker(cfg: &GenConfig) -> Result<Option<FlowPicker>, GenError> {
    if cfg.flows == 0 || cfg.new_flow_every.is_some() {
        return Ok(None);
    }
    let n = cfg.flows;
    Ok(Some(match &cfg.dist {
        FlowDist::Uniform => FlowPicker::Rounds { perm: (0..n as u32).collect(), pos: 0 },
        FlowDist::Zipf(a) => {
            FlowPicker::Zipf(Zipf::new(n as f64, *a).map_err(|e| invalid(format!("--dist zipf:{a}: {e}")))?)
        }
        FlowDist::Elephants { k, share } => FlowPicker::Elephants { n, k: *k, share: *share },
        FlowDist::Cdf(pts) => {
            // Each flow's relative size by inverse transform on the CDF (own stream).
            let mut rng = GenRng::seed_from_u64(cfg.seed ^ 0x00cd_f5e1);
            let last = pts.last().map_or(1.0, |p| p.1);
            let weights: Vec<f64> = (0..n)
                .map(|_| {
                    let u = unit(&mut rng) * last;
                    let i = pts.partition_point(|p| p.1 < u).min(pts.len() - 1);
                    pts[i].0
                })
                .collect();
            FlowPicker::Weighted(AliasTable::new(&weights).ok_or_else(|| invalid("--dist cdf: no positive flow size"))?)
        }
    }))
}

/// Per-flow TCP progress.
#[derive(Debug, Clone, Copy, Default)]
struct TcpFlow {
    total: u64,
    sent: u64,
    /// Next sequence numbers of the client and the server.
    seq_c: u32,
    seq_s: u32,
}

/// Streams the frames of one configured trace; see the module docs.
#[derive(Debug)]
pub struct Generator {
    cfg: GenConfig,
    sched: Scheduler,
    sizes: SizePicker,
    size_rng: GenRng,
    pattern_rng: GenRng,
    pattern: Option<pattern::PatternGen>,
    tcp: Vec<TcpFlow>,
    /// AMF: per UE, messages sent (low 31 bits) and registered (bit 31).
    amf: Vec<u32>,
    plan: AddrPlan,
    idx: u64,
    period_ns: f64,
}

impl Generator {
    /// Validates `cfg` and prepares tables (and, for TCP, the per-flow packet counts).
    pub fn new(cfg: GenConfig) -> Result<Self, GenError> {
        cfg.validate()?;
        let sched = Scheduler::new(&cfg, build_picker(&cfg)?);
        let mut tcp = Vec::new();
        if matches!(cfg.proto, Proto::Tcp | Proto::TcpBidir) {
            // Pass 1: replay the slot sequence to learn each flow's packet count.
            tcp = vec![TcpFlow::default(); Scheduler::flow_space(&cfg) as usize];
            let mut counter = Scheduler::new(&cfg, build_picker(&cfg)?);
            for _ in 0..cfg.packets {
                if let Slot::Flow(f) = counter.next() {
                    if let Some(t) = tcp.get_mut(f as usize) {
                        t.total += 1;
                    }
                }
            }
        }
        let amf = if cfg.proto == Proto::Amf { vec![0u32; Scheduler::flow_space(&cfg) as usize] } else { Vec::new() };
        let pattern = match cfg.pattern {
            Pattern::None => None,
            Pattern::PortScan(k) => Some(pattern::PatternGen::scan(k, cfg.seed, cfg.ipv6)),
            Pattern::PortKnock => Some(pattern::PatternGen::knock(cfg.seed)),
        };
        Ok(Generator {
            sizes: SizePicker::new(&cfg.size),
            size_rng: GenRng::seed_from_u64(cfg.seed ^ 0x0000_512e),
            pattern_rng: GenRng::seed_from_u64(cfg.seed ^ 0x0000_7a77),
            plan: AddrPlan::new(cfg.seed, cfg.ipv6),
            period_ns: 1e9 / cfg.rate_pps,
            sched,
            pattern,
            tcp,
            amf,
            idx: 0,
            cfg,
        })
    }

    /// The configuration this generator runs.
    pub fn config(&self) -> &GenConfig {
        &self.cfg
    }

    /// Packets not yet produced.
    pub fn remaining(&self) -> u64 {
        self.cfg.packets - self.idx
    }

    /// Knocking sessions started so far, with the verdict of the reference
    /// state machine (empty unless the pattern is [`Pattern::PortKnock`]).
    pub fn knock_sessions(&self) -> &[KnockSession] {
        self.pattern.as_ref().map_or(&[], |p| p.knock_log())
    }

    /// Writes the next frame into `buf` (cleared first; reused without
    /// reallocation once it has grown) and returns its timestamp in ns, or
    /// `None` when the trace is complete.
    pub fn next_frame(&mut self, buf: &mut Vec<u8>) -> Option<u64> {
        if self.idx >= self.cfg.packets {
            return None;
        }
        let i = self.idx;
        self.idx += 1;
        let ts = START_NS + (i as f64 * self.period_ns) as u64;
        let size = self.sizes.pick(&mut self.size_rng);
        match self.sched.next() {
            Slot::Pattern => match self.pattern.as_mut() {
                Some(p) => p.next(&mut self.pattern_rng, buf, i),
                None => frame::udp(buf, &self.plan.flow(0).addrs, 9, 9, size, i),
            },
            Slot::Flow(f) => match self.cfg.proto {
                Proto::Udp => {
                    let fa = self.plan.flow(f);
                    frame::udp(buf, &fa.addrs, fa.sport, fa.dport, size, i);
                }
                Proto::Gtpu => match self.cfg.upf {
                    Some(u) if u.uplink(i, self.cfg.seed) => frame::gtpu(buf, &u.gtpu(f), size, i),
                    Some(u) => {
                        let fl = u.flow(f);
                        let addrs = frame::Addrs::V4 { src: fl.remote, dst: fl.ue };
                        frame::udp(buf, &addrs, fl.remote_port, fl.ue_port, size, i);
                    }
                    None => frame::gtpu(buf, &self.plan.gtpu(f), size, i),
                },
                Proto::Amf => self.amf_message(f, size, buf, i),
                Proto::Tcp => self.tcp_oneway(f, size, buf, i),
                Proto::TcpBidir => self.tcp_bidir(f, size, buf, i),
            },
        }
        Some(ts)
    }

    /// The next AMF message of UE `f`: a registration first (and after a
    /// deregistration), then service requests 45%, PDU sessions 25%,
    /// handovers 20%, deregistrations 10%.
    fn amf_message(&mut self, f: u64, size: usize, buf: &mut Vec<u8>, i: u64) {
        let Some(st) = self.amf.get_mut(f as usize) else { return };
        let (sent, registered) = (*st & 0x7fff_ffff, *st >> 31 == 1);
        let h = flows::mix64(f ^ (u64::from(sent) << 32) ^ self.cfg.seed);
        let t = if !registered {
            frame::AMF_REGISTRATION
        } else {
            match h % 100 {
                0..45 => frame::AMF_SERVICE,
                45..70 => frame::AMF_PDU_SESSION,
                70..90 => frame::AMF_HANDOVER,
                _ => frame::AMF_DEREGISTRATION,
            }
        };
        let registered = t != frame::AMF_DEREGISTRATION;
        *st = ((sent + 1) & 0x7fff_ffff) | (u32::from(registered) << 31);
        let (a, b) = match t {
            frame::AMF_PDU_SESSION => ((h >> 8) as u32 & 7 | 1 << 8, (h >> 16) as u32),
            _ => ((h >> 8) as u32 & 0xffff, 1),
        };
        let ue = 208_930_000_000_000 + f;
        frame::amf(buf, ue, (f % 4096) as u32, t, sent + 1, a, b, size, i);
    }

    /// Initial sequence numbers of a flow (client, server).
    fn isn(&self, f: u64) -> (u32, u32) {
        let h = flows::mix64(f ^ flows::mix64(self.cfg.seed ^ 0x15e9));
        (h as u32, (h >> 32) as u32)
    }

    fn tcp_oneway(&mut self, f: u64, size: usize, buf: &mut Vec<u8>, i: u64) {
        let fa = self.plan.flow(f);
        let (isn_c, isn_s) = self.isn(f);
        let payload = size.saturating_sub(frame::header_len(&fa.addrs, true));
        let Some(st) = self.tcp.get_mut(f as usize) else { return };
        let k = st.sent;
        st.sent += 1;
        // The server side is not in the trace; ACKs acknowledge its SYN-ACK.
        let (fields, len) = if k == 0 {
            st.seq_c = isn_c.wrapping_add(1);
            (TcpFields { seq: isn_c, ack: 0, flags: TCP_SYN }, 0)
        } else if k + 1 >= st.total {
            let t = TcpFields { seq: st.seq_c, ack: isn_s.wrapping_add(1), flags: TCP_FIN | TCP_ACK };
            st.seq_c = st.seq_c.wrapping_add(1);
            (t, 0)
        } else {
            let t = TcpFields { seq: st.seq_c, ack: isn_s.wrapping_add(1), flags: TCP_PSH | TCP_ACK };
            st.seq_c = st.seq_c.wrapping_add(payload as u32);
            (t, payload)
        };
        frame::tcp(buf, &fa.addrs, fa.sport, fa.dport, fields, len, i);
    }

    fn tcp_bidir(&mut self, f: u64, size: usize, buf: &mut Vec<u8>, i: u64) {
        let fa = self.plan.flow(f);
        let (isn_c, isn_s) = self.isn(f);
        let payload = size.saturating_sub(frame::header_len(&fa.addrs, true));
        let Some(st) = self.tcp.get_mut(f as usize) else { return };
        let k = st.sent;
        st.sent += 1;
        // Script: SYN, SYN-ACK, ACK, data (request/response alternating), FIN-ACK c, FIN-ACK s, ACK c.
        let data = st.total.saturating_sub(6);
        let (from_client, fields, len) = match k {
            0 => {
                st.seq_c = isn_c.wrapping_add(1);
                (true, TcpFields { seq: isn_c, ack: 0, flags: TCP_SYN }, 0)
            }
            1 => {
                st.seq_s = isn_s.wrapping_add(1);
                (false, TcpFields { seq: isn_s, ack: st.seq_c, flags: TCP_SYN | TCP_ACK }, 0)
            }
            2 => (true, TcpFields { seq: st.seq_c, ack: st.seq_s, flags: TCP_ACK }, 0),
            k if k < 3 + data => {
                if (k - 3) % 2 == 0 {
                    let t = TcpFields { seq: st.seq_c, ack: st.seq_s, flags: TCP_PSH | TCP_ACK };
                    st.seq_c = st.seq_c.wrapping_add(payload as u32);
                    (true, t, payload)
                } else {
                    let t = TcpFields { seq: st.seq_s, ack: st.seq_c, flags: TCP_PSH | TCP_ACK };
                    st.seq_s = st.seq_s.wrapping_add(payload as u32);
                    (false, t, payload)
                }
            }
            k if k == 3 + data => {
                let t = TcpFields { seq: st.seq_c, ack: st.seq_s, flags: TCP_FIN | TCP_ACK };
                st.seq_c = st.seq_c.wrapping_add(1);
                (true, t, 0)
            }
            k if k == 4 + data => {
                let t = TcpFields { seq: st.seq_s, ack: st.seq_c, flags: TCP_FIN | TCP_ACK };
                st.seq_s = st.seq_s.wrapping_add(1);
                (false, t, 0)
            }
            _ => (true, TcpFields { seq: st.seq_c, ack: st.seq_s, flags: TCP_ACK }, 0),
        };
        if from_client {
            frame::tcp(buf, &fa.addrs, fa.sport, fa.dport, fields, len, i);
        } else {
            frame::tcp(buf, &fa.addrs.swapped(), fa.dport, fa.sport, fields, len, i);
        }
    }
}

/// What [`write_pcap`] produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GenSummary {
    /// Packets written.
    pub packets: u64,
    /// Frame bytes written (sum of frame lengths).
    pub bytes: u64,
}

/// Packets between two updates of a progress bar.
const PROGRESS_EVERY: u64 = 1 << 16;

/// Generates the whole trace into a nanosecond pcap file, streaming (a progress bar on a terminal).
pub fn write_pcap(cfg: GenConfig, path: &Path) -> Result<GenSummary, GenError> {
    let mut gen = Generator::new(cfg)?;
    let mut w = PcapWriter::create(path, WriterOptions { nanosecond: true, ..WriterOptions::default() })?;
    let mut buf = Vec::with_capacity(frame::MAX_FRAME);
    let mut sum = GenSummary { packets: 0, bytes: 0 };
    let bar = crate::progress::Progress::bar(
        format!("writing {}", path.display()),
        gen.remaining(),
        crate::progress::Unit::Packets,
    );
    while let Some(ts) = gen.next_frame(&mut buf) {
        w.write_packet(ts, &buf, buf.len() as u32)?;
        sum.packets += 1;
        sum.bytes += buf.len() as u64;
        if sum.packets.is_multiple_of(PROGRESS_EVERY) {
            bar.set(sum.packets);
        }
    }
    w.finish()?;
    Ok(sum)
}

// Keep the frame constants reachable for tests of other modules.
#[cfg(test)]
pub(crate) use frame::{GTPU_HEADERS, GTPU_PORT};

#[cfg(test)]
mod tests {

    #[test]
    fn shifting_skew_changes_the_heavy_flows() {
        let cfg = GenConfig {
            flows: 1000,
            packets: 40_000,
            dist: FlowDist::Elephants { k: 2, share: 0.8 },
            shift_every: Some(10_000),
            ..GenConfig::default()
        };
        let mut s = Scheduler::new(&cfg, build_picker(&cfg).unwrap());
        let mut tops = Vec::new();
        for _ in 0..4 {
            let mut count = vec![0u32; 1000];
            for _ in 0..10_000 {
                if let Slot::Flow(f) = s.next() {
                    count[f as usize] += 1;
                }
            }
            let top = (0..1000).max_by_key(|&f| count[f]).unwrap();
            assert!(count[top] > 3000);
            tops.push(top);
        }
        tops.dedup();
        assert_eq!(tops.len(), 4, "{tops:?}");
    }
    use super::*;

    fn frames(cfg: GenConfig) -> Vec<Vec<u8>> {
        let mut g = Generator::new(cfg).expect("config");
        let mut buf = Vec::new();
        let mut out = Vec::new();
        while g.next_frame(&mut buf).is_some() {
            out.push(buf.clone());
        }
        out
    }

    #[test]
    fn parses_specs() {
        assert_eq!("zipf:1.1".parse::<FlowDist>().unwrap(), FlowDist::Zipf(1.1));
        assert_eq!("elephants:4".parse::<FlowDist>().unwrap(), FlowDist::Elephants { k: 4, share: 0.9 });
        assert_eq!("elephants:4:1".parse::<FlowDist>().unwrap(), FlowDist::Elephants { k: 4, share: 1.0 });
        assert!("zipf:x".parse::<FlowDist>().is_err());
        assert!("cdf:/nonexistent/file".parse::<FlowDist>().is_err());
        assert!("nope".parse::<FlowDist>().is_err());
        assert_eq!("burst".parse::<Order>().unwrap(), Order::Burst(8));
        assert_eq!("burst:3".parse::<Order>().unwrap(), Order::Burst(3));
        assert!("burst:0".parse::<Order>().is_err());
        assert_eq!(SizeSpec::parse_size("64..1514").unwrap(), SizeSpec::Range(64, 1514));
        assert!(SizeSpec::parse_size("20").is_err());
        assert!(SizeSpec::parse_size("100..64").is_err());
        assert_eq!(SizeSpec::parse_mix("64:1,1500:1").unwrap(), SizeSpec::Mix(vec![(64, 1.0), (1500, 1.0)]));
        assert!(SizeSpec::parse_mix("64:x").is_err());
        assert!(SizeSpec::parse_mix("imix").is_ok());
        assert!(parse_cdf("1 0.5\n10 1.0\n").is_ok());
        assert!(parse_cdf("10 0.5\n1 1.0\n").is_err());
        assert!(parse_cdf("# only comments\n").is_err());
    }

    #[test]
    fn uniform_rounds_spread_exactly() {
        let cfg = GenConfig { flows: 50, packets: 500, ..GenConfig::default() };
        let mut seen = std::collections::HashMap::new();
        for f in frames(cfg) {
            *seen.entry(f[26..38].to_vec()).or_insert(0) += 1;
        }
        assert_eq!(seen.len(), 50);
        assert!(seen.values().all(|&c| c == 10));
    }

    #[test]
    fn size_mix_is_respected() {
        let cfg = GenConfig { size: SizeSpec::parse_mix("64:0.5,1500:0.5").unwrap(), ..GenConfig::default() };
        let fr = frames(cfg);
        let big = fr.iter().filter(|f| f.len() == 1500).count();
        assert!(fr.iter().all(|f| f.len() == 64 || f.len() == 1500));
        assert!((big as f64 / fr.len() as f64 - 0.5).abs() < 0.02);
    }

    #[test]
    fn gtpu_frames_have_gtp_header() {
        let cfg = GenConfig { proto: Proto::Gtpu, packets: 100, size: SizeSpec::Fixed(64), ..GenConfig::default() };
        for f in frames(cfg) {
            assert_eq!(f.len(), GTPU_HEADERS, "64 is raised to the headers' length");
            assert_eq!(u16::from_be_bytes([f[36], f[37]]), GTPU_PORT);
            assert_eq!(f[42], 0x34);
        }
    }

    #[test]
    fn invalid_combinations_are_rejected() {
        let bad = [
            GenConfig { flows: 0, ..GenConfig::default() },
            GenConfig { rate_pps: 0.0, ..GenConfig::default() },
            GenConfig { proto: Proto::Gtpu, ipv6: true, ..GenConfig::default() },
            GenConfig { new_flow_every: Some(0), ..GenConfig::default() },
            GenConfig { new_flow_every: Some(4), dist: FlowDist::Zipf(1.0), ..GenConfig::default() },
            GenConfig { pattern: Pattern::PortScan(0), ..GenConfig::default() },
            GenConfig { dist: FlowDist::Elephants { k: 5000, share: 0.9 }, ..GenConfig::default() },
            GenConfig { dist: FlowDist::Elephants { k: 5, share: 0.0 }, ..GenConfig::default() },
            GenConfig { dist: FlowDist::Zipf(f64::NAN), ..GenConfig::default() },
            GenConfig { dist: FlowDist::Cdf(vec![]), ..GenConfig::default() },
            GenConfig { size: SizeSpec::Range(100, 64), ..GenConfig::default() },
            GenConfig { size: SizeSpec::Mix(vec![]), ..GenConfig::default() },
            GenConfig { size: SizeSpec::Mix(vec![(64, 1.0), (128, f64::NAN)]), ..GenConfig::default() },
            GenConfig { order: Order::Burst(0), ..GenConfig::default() },
            GenConfig { flows: MAX_FLOWS + 1, ..GenConfig::default() },
            GenConfig { packets: MAX_PACKETS + 1, ..GenConfig::default() },
        ];
        for c in bad {
            let e = Generator::new(c).expect_err("must be rejected").to_string();
            assert!(!e.contains('\n') && !e.is_empty());
        }
    }

    #[test]
    fn pattern_only_trace() {
        let cfg = GenConfig {
            flows: 0,
            pattern: Pattern::PortScan(2),
            pattern_share: 1.0,
            packets: 10,
            ..GenConfig::default()
        };
        assert_eq!(frames(cfg).len(), 10);
    }
}
