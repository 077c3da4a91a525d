//! `flowplane bench parse`: what the flow-key fast path costs per packet —
//! parsing a 64-byte frame to its 5-tuple plus the table hash, the
//! executor's parser ([`PktMeta::parse_into`]) plus its 64-bit hash, the
//! Toeplitz RSS hash and the CRC table hash alone — in TSC ticks, for
//! UDP/IPv4, TCP/IPv4, UDP/IPv6 and a randomly mixed stream, over frame sets
//! that fit L1, L2, or only DRAM.
//!
//! The machine is shared and noisy, so each measurement is split into
//! [`BLOCK`]-packet blocks and reports the minimum block (the undisturbed
//! cost) and the median block.

use std::fmt;
use std::hint::black_box;
use std::net::{Ipv4Addr, Ipv6Addr};

use flowplane_nf::PktMeta;
use flowplane_wire::flow::{extract_five_tuple, FiveTuple};
use flowplane_wire::hash::{hash_key, hash_key64};
use flowplane_wire::packet_repr::FrameBuilder;
use flowplane_wire::rss::{Toeplitz, MICROSOFT_KEY};
use flowplane_wire::tcp::TcpFlags;
use serde::Serialize;

use crate::tsc::{hz, rdtsc};

/// Frame length: the minimum Ethernet frame without FCS.
pub const FRAME: usize = 64;

/// Packets per timed block: short enough (~0.1-1 ms) that some blocks run
/// without being descheduled on a shared machine.
pub const BLOCK: usize = 16 * 1024;

/// Seed of the CRC table hash, the one the executor uses.
const SEED: u32 = 0x9e37_79b9;

/// Frames in the L1-sized set (16 KiB of frames).
const L1_FRAMES: usize = 256;
/// Frames in the L2-sized set (256 KiB of frames).
const L2_FRAMES: usize = 4096;
/// Frames in the DRAM-sized set (64 MiB of frames).
const DRAM_FRAMES: usize = 1 << 20;
/// Frames in the DRAM-sized set in quick mode (16 MiB: still beyond this
/// machine's effective cache, four times faster to build).
const DRAM_FRAMES_QUICK: usize = 1 << 18;

/// What to run.
#[derive(Clone, Debug, PartialEq)]
pub struct ParseBenchOptions {
    /// Million packets per measurement (at least one block is always timed).
    pub millions: f64,
    /// Smaller DRAM set (CI smoke run; pair with a small `millions`).
    pub quick: bool,
    /// Seconds per measurement instead of `millions` packets (the run length every suite takes).
    pub seconds: Option<f64>,
    /// Rounds over every measurement (`--reps`): each row's parse+crc figure is the median round's, with min and max.
    pub reps: usize,
}

impl Default for ParseBenchOptions {
    fn default() -> Self {
        ParseBenchOptions { millions: 20.0, quick: false, seconds: None, reps: 1 }
    }
}

impl ParseBenchOptions {
    /// Small and short, for CI smoke runs (well under 2 s in release builds).
    pub fn quick() -> Self {
        ParseBenchOptions { millions: 0.1, quick: true, seconds: None, reps: 1 }
    }

    /// Packets per measurement, rounded up to whole blocks; NaN, infinite or
    /// non-positive `millions` gives one block.
    fn packets(&self) -> u64 {
        let p = if self.millions.is_finite() && self.millions > 0.0 { (self.millions * 1e6) as u64 } else { 0 };
        p.max(BLOCK as u64).div_ceil(BLOCK as u64) * BLOCK as u64
    }
}

/// Kind of frames in a set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FrameKind {
    /// Ethernet + IPv4 + UDP.
    Udp4,
    /// Ethernet + IPv4 + TCP (ACK, no options).
    Tcp4,
    /// Ethernet + IPv6 + UDP.
    Udp6,
    /// The three above in random order: defeats per-type branch prediction.
    Mixed,
}

impl FrameKind {
    /// Every kind, in report order.
    pub const ALL: [FrameKind; 4] = [FrameKind::Udp4, FrameKind::Tcp4, FrameKind::Udp6, FrameKind::Mixed];

    /// Short name used in the report.
    pub fn name(self) -> &'static str {
        match self {
            FrameKind::Udp4 => "udp4",
            FrameKind::Tcp4 => "tcp4",
            FrameKind::Udp6 => "udp6",
            FrameKind::Mixed => "mixed",
        }
    }
}

/// Cache level a frame set is sized for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum SetLevel {
    /// Fits L1d.
    L1,
    /// Fits L2.
    L2,
    /// Larger than the effective cache (walked sequentially).
    #[serde(rename = "DRAM")]
    Dram,
}

impl SetLevel {
    /// Short name used in the report.
    pub fn name(self) -> &'static str {
        match self {
            SetLevel::L1 => "L1",
            SetLevel::L2 => "L2",
            SetLevel::Dram => "DRAM",
        }
    }
}

/// Minimum and median TSC ticks per packet over the blocks of one measurement.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Cost {
    /// Cheapest block: the undisturbed cost.
    pub min: f64,
    /// Median block.
    pub median: f64,
    /// Items timed.
    pub items: u64,
}

/// One (frame kind, set) row.
#[derive(Clone, Debug, Serialize)]
pub struct ParseRow {
    /// Frame kind.
    pub kind: FrameKind,
    /// Cache level the set is sized for.
    pub set: SetLevel,
    /// Frames in the set.
    pub set_frames: usize,
    /// Frames the parsers rejected (0 unless the generator is broken).
    pub invalid_frames: usize,
    /// `extract_five_tuple` + CRC32C table hash (`hash_key`).
    pub parse_hash: Cost,
    /// Million packets per second on one core at `parse_hash.min`.
    pub parse_hash_mpps: f64,
    /// `PktMeta::parse_into` + 64-bit table hash (`hash_key64`), as the executor does.
    pub pktmeta_hash64: Cost,
    /// Toeplitz RSS hash of an already-extracted tuple.
    pub toeplitz: Cost,
    /// CRC32C table hash alone of an already-extracted tuple.
    pub crc: Cost,
    /// `toeplitz.min / crc.min`.
    pub toeplitz_over_crc: f64,
    /// `parse_hash.min` over `--reps` rounds (None with one).
    pub spread: Option<crate::reps::Spread>,
    /// The packets `parse_hash` rests on and why not to quote it ([`flowplane_engine::trust`]).
    pub trust: crate::reps::Trust,
}

/// The benchmark's result.
#[derive(Clone, Debug, Serialize)]
pub struct ParseReport {
    /// TSC frequency in GHz (the unit of every cost is one TSC tick).
    pub tsc_ghz: f64,
    /// Packets per measurement.
    pub packets: u64,
    /// Packets per timed block.
    pub block: usize,
    /// Quick mode (smaller DRAM set).
    pub quick: bool,
    /// One row per (kind, set).
    pub rows: Vec<ParseRow>,
}

/// Runs every measurement (4 frame kinds x 3 sets x 4 costs), `opts.reps` rounds over.
pub fn run_parse(opts: &ParseBenchOptions) -> ParseReport {
    let total = opts.packets();
    // With `seconds`, each measurement runs whole blocks until its time is up (at least one block).
    let ticks = opts.seconds.filter(|s| s.is_finite() && *s > 0.0).map(|s| (s * hz()) as u64);
    let total = if ticks.is_some() { u64::MAX } else { total };
    let dram = if opts.quick { DRAM_FRAMES_QUICK } else { DRAM_FRAMES };
    let rss = Toeplitz::new(&MICROSOFT_KEY);
    let round = |_: usize| {
        let mut rows = Vec::with_capacity(FrameKind::ALL.len() * 3);
        for kind in FrameKind::ALL {
            for (set, n) in [(SetLevel::L1, L1_FRAMES), (SetLevel::L2, L2_FRAMES), (SetLevel::Dram, dram)] {
                rows.push(measure_set(kind, set, n, total, ticks, &rss));
            }
        }
        Ok::<_, String>(rows)
    };
    // Every round measures the same rows: `repeat` cannot fail here.
    let merged = crate::reps::repeat(opts.reps, round, |r: &ParseRow| Some(r.parse_hash.min)).unwrap_or_default();
    let rows: Vec<ParseRow> = crate::reps::settle(merged, |r| (&mut r.trust, &mut r.spread));
    // Timed by seconds: the packets of the first measurement (each measurement timed as many as fit).
    let packets = if ticks.is_some() { rows.first().map_or(0, |r| r.parse_hash.items) } else { total };
    ParseReport { tsc_ghz: hz() / 1e9, packets, block: BLOCK, quick: opts.quick, rows }
}

fn measure_set(kind: FrameKind, set: SetLevel, n: usize, total: u64, ticks: Option<u64>, rss: &Toeplitz) -> ParseRow {
    let buf = frames(n, kind);
    // One slice per frame, like the pointer array of a batch.
    let pkts: Vec<&[u8]> = buf.chunks_exact(FRAME).collect();
    let parse_hash = blocks(&pkts, total, ticks, |f| match extract_five_tuple(f) {
        Ok(t) => hash_key(&t, SEED) as u64,
        Err(_) => 0,
    });
    // Reused across packets, as the executor's per-batch metadata array is.
    let mut meta = PktMeta::default();
    let pktmeta_hash64 = blocks(&pkts, total, ticks, |f| {
        meta.parse_into(f);
        if meta.valid {
            hash_key64(&meta.tuple, SEED)
        } else {
            0
        }
    });
    // Tuples extracted beforehand so the next two isolate the hash.
    let mut invalid_frames = 0;
    let tuples: Vec<FiveTuple> = pkts
        .iter()
        .map(|f| {
            extract_five_tuple(f).unwrap_or_else(|_| {
                invalid_frames += 1;
                FiveTuple::default()
            })
        })
        .collect();
    let toeplitz = blocks(&tuples, total, ticks, |t| rss.hash_five_tuple(t) as u64);
    let crc = blocks(&tuples, total, ticks, |t| hash_key(t, SEED) as u64);
    ParseRow {
        kind,
        set,
        set_frames: n,
        invalid_frames,
        parse_hash,
        parse_hash_mpps: hz() / parse_hash.min / 1e6,
        pktmeta_hash64,
        toeplitz,
        crc,
        toeplitz_over_crc: toeplitz.min / crc.min,
        spread: None,
        trust: crate::reps::Trust::of_ops(hz() / parse_hash.min / 1e6, parse_hash.items, "packets"),
    }
}

/// (min, median) TSC ticks per item over blocks of up to [`BLOCK`] items,
/// cycling through `items` until `total` items are done (or, with `ticks`,
/// until that many TSC ticks have passed); returns the items timed too.
fn blocks<T>(items: &[T], total: u64, ticks: Option<u64>, mut body: impl FnMut(&T) -> u64) -> Cost {
    let mut acc = 0u64;
    // Warm-up: page faults, caches, branch predictors.
    for it in items {
        acc ^= body(it);
    }
    let per_block = BLOCK.min(items.len()).max(1);
    let mut samples = Vec::with_capacity((total.min(1 << 30) / per_block as u64) as usize + 1);
    let mut done = 0u64;
    let mut cycle = items.iter().cycle();
    let deadline = ticks.map(|t| rdtsc().saturating_add(t));
    while done < total && !items.is_empty() && !(done > 0 && deadline.is_some_and(|d| rdtsc() >= d)) {
        let start = rdtsc();
        for it in cycle.by_ref().take(per_block) {
            acc = acc.wrapping_add(body(black_box(it)));
        }
        samples.push(rdtsc().wrapping_sub(start) as f64 / per_block as f64);
        done += per_block as u64;
    }
    black_box(acc);
    samples.sort_by(f64::total_cmp);
    Cost {
        min: samples.first().copied().unwrap_or(0.0),
        median: samples.get(samples.len() / 2).copied().unwrap_or(0.0),
        items: done,
    }
}

/// xorshift64*: enough for distinct flows.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// `n` 64-byte frames of `kind`, each a random flow, back to back.
fn frames(n: usize, kind: FrameKind) -> Vec<u8> {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ n as u64 ^ (kind as u64) << 32);
    let mut buf = vec![0u8; n * FRAME];
    let zeros = [0u8; FRAME];
    for f in buf.chunks_exact_mut(FRAME) {
        let k = match kind {
            FrameKind::Mixed => [FrameKind::Udp4, FrameKind::Tcp4, FrameKind::Udp6][(rng.next() % 3) as usize],
            k => k,
        };
        let r = rng.next();
        let (sp, dp) = ((r >> 16) as u16, (r >> 32) as u16);
        let b = match k {
            FrameKind::Tcp4 => FrameBuilder::tcp_v4(v4(rng.next()), v4(rng.next()), sp, dp, TcpFlags::ACK),
            FrameKind::Udp6 => {
                let (s, d) = (v6(&mut rng), v6(&mut rng));
                FrameBuilder::udp_v6(s, d, sp, dp)
            }
            _ => FrameBuilder::udp_v4(v4(rng.next()), v4(rng.next()), sp, dp),
        };
        // Pad the payload to exactly 64 bytes. All three fit, so emit cannot
        // fail; a frame that did would stay zeroed and count as invalid.
        let payload = zeros.get(..FRAME.saturating_sub(b.header_len())).unwrap_or(&[]);
        if b.emit(f, payload).is_err() {
            f.fill(0);
        }
    }
    buf
}

fn v4(r: u64) -> Ipv4Addr {
    Ipv4Addr::from(r as u32)
}

fn v6(rng: &mut Rng) -> Ipv6Addr {
    Ipv6Addr::from((rng.next() as u128) << 64 | rng.next() as u128)
}

impl fmt::Display for ParseReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "Parse + hash cost of {FRAME}-byte frames, TSC ticks per packet ({:.3} GHz), {:.2} M packets per measurement",
            self.tsc_ghz,
            self.packets as f64 / 1e6
        )?;
        writeln!(
            f,
            "min / median over {}-packet blocks (the machine is shared: min = undisturbed); target parse+crc <= 15",
            self.block
        )?;
        writeln!(
            f,
            "{:<6} {:<14} {:>17} {:>13} {:>9} {:>17} {:>15} {:>15} {:>8}",
            "frames", "set", "parse+crc", "min-max", "Mpps@min", "PktMeta+hash64", "toeplitz", "crc alone", "toe/crc"
        )?;
        for r in &self.rows {
            let set = format!("{} ({})", r.set.name(), r.set_frames);
            writeln!(
                f,
                "{:<6} {:<14} {:>7.2} / {:>7.2} {:>13} {:>9.1} {:>7.2} / {:>7.2} {:>6.2} / {:>6.2} {:>6.2} / {:>6.2} {:>8.2}{}",
                r.kind.name(),
                set,
                r.parse_hash.min,
                r.parse_hash.median,
                r.spread.as_ref().map_or("-".to_string(), |x| x.cell(2)),
                r.parse_hash_mpps,
                r.pktmeta_hash64.min,
                r.pktmeta_hash64.median,
                r.toeplitz.min,
                r.toeplitz.median,
                r.crc.min,
                r.crc.median,
                r.toeplitz_over_crc,
                r.trust.cell()
            )?;
        }
        if let Some(n) = crate::reps::footnote(self.rows.iter().map(|r| &r.trust)) {
            writeln!(f, "{n}")?;
        }
        let invalid: usize = self.rows.iter().map(|r| r.invalid_frames).sum();
        if invalid > 0 {
            writeln!(f, "warning: {invalid} generated frames did not parse")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowplane_wire::ipv4::IpProtocol;

    #[test]
    fn generated_frames_parse_to_their_kind() {
        for kind in FrameKind::ALL {
            let buf = frames(64, kind);
            for f in buf.chunks_exact(FRAME) {
                let m = PktMeta::parse(f);
                assert!(m.valid, "{kind:?} frame rejected");
                match kind {
                    FrameKind::Udp4 => assert!(!m.v6 && m.proto == IpProtocol::UDP),
                    FrameKind::Tcp4 => assert!(!m.v6 && m.proto == IpProtocol::TCP),
                    FrameKind::Udp6 => assert!(m.v6 && m.proto == IpProtocol::UDP),
                    FrameKind::Mixed => assert!(matches!(m.proto, IpProtocol::TCP | IpProtocol::UDP)),
                }
                assert_eq!(extract_five_tuple(f).ok(), Some(m.tuple));
            }
        }
    }

    #[test]
    fn packets_round_up_to_blocks_and_survive_bad_input() {
        let p = |millions| ParseBenchOptions { millions, quick: true, seconds: None, reps: 1 }.packets();
        assert_eq!(p(f64::NAN), BLOCK as u64);
        assert_eq!(p(-1.0), BLOCK as u64);
        assert_eq!(p(f64::INFINITY), BLOCK as u64);
        assert_eq!(p(0.1) % BLOCK as u64, 0);
        assert!(p(0.1) >= 100_000);
    }

    #[test]
    fn quick_run_reports_sane_positive_costs() {
        let rep = run_parse(&ParseBenchOptions::quick());
        assert_eq!(rep.rows.len(), 12);
        assert!(rep.tsc_ghz > 0.1 && rep.tsc_ghz < 10.0);
        for r in &rep.rows {
            assert_eq!(r.invalid_frames, 0, "{:?} {:?}", r.kind, r.set);
            for c in [r.parse_hash, r.pktmeta_hash64, r.toeplitz, r.crc] {
                // Positive, finite, ordered, and below a generous bound (debug builds are slow).
                assert!(c.min > 0.0 && c.min.is_finite(), "{r:?}");
                assert!(c.median >= c.min && c.median.is_finite(), "{r:?}");
                assert!(c.min < 100_000.0, "{r:?}");
            }
            assert!(r.parse_hash_mpps > 0.0 && r.toeplitz_over_crc > 0.0);
        }
        let text = rep.to_string();
        assert_eq!(text.lines().count(), 3 + 12);
        assert!(text.contains("udp6") && text.contains("DRAM (262144)"));
        let json = serde_json::to_value(&rep).map_err(|e| e.to_string());
        assert_eq!(json.as_ref().map(|v| v["rows"][11]["kind"].clone()), Ok(serde_json::json!("mixed")));
    }
}
