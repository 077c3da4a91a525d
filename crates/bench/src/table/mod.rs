//! `flowplane bench table`: the flow-table cost model (issue 3 §6, PNA methodology).
//!
//! This module owns the shared vocabulary of the table benchmark — options
//! ([`TableBenchOptions`]), result rows ([`BenchRow`]), the benchmark keys and
//! their hash ([`BenchKey`], [`bench_hash`], [`make_keys`]) — the driver
//! [`run`] that collects rows from every implementation, the ratio pass and the
//! text/JSON printers. Each implementation lives in its own file:
//!
//! - `percore.rs`: flowplane's per-core `FlowTable` (lookup hit/miss, add-on-miss
//!   insertion, update, delete, insertion-rate sweep),
//! - `hashbrown.rs`: `hashbrown` (SwissTable) on the same keys and hashes,
//! - `shared.rs`: the shared (multi-core) table on 1 and 2 cores, with the insertion-rate sweep,
//! - `ceiling.rs`: this machine's memory ceilings (`measure(quick) -> Ceilings`),
//! - `dpdk.rs` (feature `dpdk`): DPDK's `rte_hash` on the same keys.
//!
//! Every implementation measures on keys from [`make_keys`] with the same seed,
//! so all rows of one run describe the same workload; ratios are only computed
//! between rows of the same process, because this machine is shared and noisy.

pub mod ceiling;
#[cfg(feature = "dpdk")]
pub mod dpdk;
pub mod hashbrown;
pub mod percore;
pub mod shared;

use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// What to measure. `Default` is the full sweep of issue 3; [`TableBenchOptions::quick`] is the CI smoke run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TableBenchOptions {
    /// Table sizes (number of resident entries; the table is created with headroom above this).
    pub sizes: Vec<usize>,
    /// Batch sizes: 1 is latency-optimised (single-key API), 32/64 throughput-optimised.
    pub batch_sizes: Vec<usize>,
    /// Insertion-rate sweep: in a run with rate `r`, every `r`-th operation is an add-on-miss insertion.
    pub insert_rates: Vec<u64>,
    /// Bytes of state per flow.
    pub state_size: usize,
    /// Operations per measurement (each measurement is clamped to at least one pass over its keys).
    pub ops: u64,
    /// Core counts for multi-core measurements (the shared variant).
    pub cores: Vec<usize>,
    /// Quick mode: small sizes, few operations (< 10 s in total).
    pub quick: bool,
}

impl Default for TableBenchOptions {
    fn default() -> Self {
        TableBenchOptions {
            sizes: vec![1 << 10, 1 << 16, 1 << 20, 1 << 22, 1 << 24],
            batch_sizes: vec![1, 32, 64],
            insert_rates: vec![1, 10, 100, 1_000, 10_000, 100_000],
            state_size: 64,
            ops: 4_000_000,
            cores: vec![1, 2],
            quick: false,
        }
    }
}

impl TableBenchOptions {
    /// The CI smoke configuration: small tables, few operations.
    pub fn quick() -> Self {
        TableBenchOptions {
            sizes: vec![1 << 10, 1 << 16],
            batch_sizes: vec![1, 32],
            insert_rates: vec![1, 10, 100],
            state_size: 64,
            ops: 200_000,
            cores: vec![1, 2],
            quick: true,
        }
    }
}

/// One measured figure: an implementation doing one operation kind at one configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BenchRow {
    /// `flowplane`, `hashbrown`, `flowplane-shared`, `rte_hash`, `ceiling`, ...
    pub impl_name: String,
    /// `lookup-hit`, `lookup-miss`, `insert`, `update`, `delete`, `mixed` (insertion-rate sweep),
    /// or a ceiling name (`random-lines`, `two-line-items`, `chase`).
    pub op: String,
    /// Resident entries.
    pub size: usize,
    /// Keys per call (1 = single-key API).
    pub batch: usize,
    /// Every `insert_every`-th op inserts (0 = not an insertion-rate run).
    pub insert_every: u64,
    /// Cores used.
    pub cores: usize,
    /// Million operations per second (aggregate over `cores`).
    pub mops: f64,
    /// TSC cycles per operation (per core).
    pub cycles_per_op: f64,
    /// This row's throughput divided by the named implementation's on the same op/size/batch/rate/cores.
    pub ratio_vs: Vec<(String, f64)>,
    /// Fraction of the machine's two-dependent-line ceiling (`None` when not measured or not meaningful).
    pub ceiling_frac: Option<f64>,
    /// Implementation-specific extra figures (e.g. reader-starvation metrics), name -> value.
    pub extra: Vec<(String, f64)>,
}

impl BenchRow {
    /// A row with no ratios/extras yet; `cycles` is the total TSC cycles spent on `ops` operations on one core.
    pub fn new(impl_name: &str, op: &str, size: usize, batch: usize, insert_every: u64, ops: u64, cycles: u64) -> Self {
        let cycles_per_op = if ops == 0 { 0.0 } else { cycles as f64 / ops as f64 };
        let mops = if cycles == 0 { 0.0 } else { ops as f64 * crate::tsc::hz() / cycles as f64 / 1e6 };
        BenchRow {
            impl_name: impl_name.to_string(),
            op: op.to_string(),
            size,
            batch,
            insert_every,
            cores: 1,
            mops,
            cycles_per_op,
            ratio_vs: Vec::new(),
            ceiling_frac: None,
            extra: Vec::new(),
        }
    }
}

/// A FiveTuple-like 16-byte benchmark key (src, dst, ports, proto packed in two words).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[repr(C, align(8))]
pub struct BenchKey {
    /// Source and destination IPv4 addresses.
    pub addrs: u64,
    /// Source port, destination port, protocol (low 40 bits).
    pub rest: u64,
}

impl BenchKey {
    /// Packs a 5-tuple.
    pub fn new(src: u32, dst: u32, sport: u16, dport: u16, proto: u8) -> Self {
        BenchKey {
            addrs: (u64::from(src) << 32) | u64::from(dst),
            rest: (u64::from(sport) << 24) | (u64::from(dport) << 8) | u64::from(proto),
        }
    }
}

/// The benchmark's hash: two multiply-xorshift rounds (cheap, good avalanche; all implementations use it).
#[inline(always)]
pub fn bench_hash(k: &BenchKey) -> u64 {
    let mut h = k.addrs.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ k.rest.rotate_left(29);
    h = (h ^ (h >> 32)).wrapping_mul(0xD6E8_FEB8_6659_FD93);
    h ^ (h >> 32)
}

/// `n` distinct uniformly random keys and their hashes, deterministic in `seed`.
pub fn make_keys(n: usize, seed: u64) -> (Vec<BenchKey>, Vec<u64>) {
    let mut rng = SplitMix(seed);
    let mut keys = Vec::with_capacity(n);
    let mut hashes = Vec::with_capacity(n);
    // Random-looking 5-tuples made distinct by construction: `addrs` is a bijection of the counter
    // (xor with a constant, multiply by an odd constant), so no dedup set is needed for 16M keys.
    for i in 0..n as u64 {
        let r = rng.next_u64();
        let k = BenchKey {
            addrs: (i ^ 0x5555_5555_5555_5555).wrapping_mul(0x9E37_79B9_7F4A_7C15),
            rest: (r & 0xFF_FFFF_FF00) | 6, // random ports, TCP
        };
        hashes.push(bench_hash(&k));
        keys.push(k);
    }
    (keys, hashes)
}

/// A random permutation of `0..n` (access order for measurements), deterministic in `seed`.
pub fn shuffled_indices(n: usize, seed: u64) -> Vec<u32> {
    let mut v: Vec<u32> = (0..n as u32).collect();
    let mut rng = SplitMix(seed);
    for i in (1..v.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
    v
}

/// SplitMix64: a tiny deterministic generator for key material.
#[derive(Clone, Debug)]
pub struct SplitMix(pub u64);

impl SplitMix {
    /// Next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`), by multiply-shift (bias negligible here).
    #[inline]
    pub fn below(&mut self, n: usize) -> usize {
        ((self.next_u64() as u128 * n as u128) >> 64) as usize
    }
}

/// The keys of one table size, shared by every implementation so rows compare the same work.
///
/// `resident` keys (`0..size`) are inserted before measuring; `absent` keys are never resident at the
/// start of a measurement (lookup-miss stream, new keys of the insertion-rate sweep); the access
/// streams are sequential arrays (keys arrive in packets, i.e. in cache), their targets uniformly random.
pub struct Workload {
    /// Resident keys and hashes.
    pub resident: Vec<BenchKey>,
    /// Hashes of `resident`.
    pub resident_hashes: Vec<u64>,
    /// Keys absent from the table at the start of every measurement.
    pub absent: Vec<BenchKey>,
    /// Hashes of `absent`.
    pub absent_hashes: Vec<u64>,
    /// Uniformly random (with repetition) resident keys in access order, cycled by the measurements.
    pub hit_stream: Vec<BenchKey>,
    /// Hashes of `hit_stream`.
    pub hit_stream_hashes: Vec<u64>,
    /// Distinct resident keys, in random order, for delete/re-insert rounds.
    pub churn: Vec<u32>,
}

impl Workload {
    /// Builds the workload of one table size: `ops + 64` absent keys, streams of at most 1M keys.
    pub fn new(size: usize, ops: u64, seed: u64) -> Self {
        let absent_n = ops as usize + MAX_BATCH_BENCH;
        let (mut keys, mut hashes) = make_keys(size + absent_n, seed);
        let absent = keys.split_off(size);
        let absent_hashes = hashes.split_off(size);
        let stream_len = (ops as usize).clamp(1, 1 << 20);
        let mut rng = SplitMix(seed ^ 0xA5A5);
        let mut hit_stream = Vec::with_capacity(stream_len);
        let mut hit_stream_hashes = Vec::with_capacity(stream_len);
        for _ in 0..stream_len {
            let i = (rng.next_u64() % size.max(1) as u64) as usize;
            hit_stream.push(keys[i]);
            hit_stream_hashes.push(hashes[i]);
        }
        // Distinct indices: multiplying by a prime larger than any size is a bijection mod `size`.
        let churn_n = size.min(stream_len);
        let churn = (0..churn_n as u64).map(|j| ((j * 2_654_435_761 + 12_345) % size as u64) as u32).collect();
        Workload {
            resident: keys,
            resident_hashes: hashes,
            absent,
            absent_hashes,
            hit_stream,
            hit_stream_hashes,
            churn,
        }
    }
}

/// Seed of the benchmark keys (every implementation measures the same keys).
pub const KEY_SEED: u64 = 0xF10B_A5E5;

/// Largest batch the benchmarks use: one bulk chunk of the tables.
pub const MAX_BATCH_BENCH: usize = flowplane_table::BULK_LOOKUP_MAX;

/// Runs every table benchmark selected by `opts` and returns all rows, with ratios and ceiling fractions filled in.
pub fn run(opts: &TableBenchOptions) -> Vec<BenchRow> {
    let mut rows = Vec::new();
    // Ceilings first, while the machine is quiet and before the tables take memory.
    rows.extend(ceiling::measure(opts.quick).rows());
    rows.extend(percore::run_percore(opts));
    rows.extend(hashbrown::run_hashbrown(opts));
    #[cfg(feature = "dpdk")]
    rows.extend(dpdk::run_dpdk(opts));
    rows.extend(shared::run_shared(opts));
    fill_ratios(&mut rows);
    fill_ceiling_fracs(&mut rows);
    rows
}

/// Baseline implementations every non-baseline row is compared against (when a matching row exists).
const BASELINES: &[&str] = &["hashbrown", "rte_hash", "flowplane"];

/// For every row, adds `ratio_vs` entries against each other baseline with the same op/size/rate/cores:
/// the same batch size if that baseline measured it, else the baseline's batch-1 row.
pub fn fill_ratios(rows: &mut [BenchRow]) {
    let snapshot: Vec<BenchRow> = rows.to_vec();
    for row in rows.iter_mut() {
        if row.impl_name == "ceiling" {
            continue;
        }
        for base in BASELINES.iter().filter(|b| **b != row.impl_name) {
            let same = |r: &&BenchRow| {
                r.impl_name == *base
                    && r.op == row.op
                    && r.size == row.size
                    && r.insert_every == row.insert_every
                    && r.cores == row.cores
            };
            let m = snapshot
                .iter()
                .filter(same)
                .find(|r| r.batch == row.batch)
                .or_else(|| snapshot.iter().filter(same).find(|r| r.batch == 1));
            if let Some(b) = m {
                if b.mops > 0.0 && !row.ratio_vs.iter().any(|(n, _)| n == base) {
                    row.ratio_vs.push((base.to_string(), row.mops / b.mops));
                }
            }
        }
    }
}

/// Sets `ceiling_frac` of per-item table operations from a `ceiling`/`two-line-items` row, if one was measured.
pub fn fill_ceiling_fracs(rows: &mut [BenchRow]) {
    let Some(ceil) = rows.iter().find(|r| r.impl_name == "ceiling" && r.op == "two-line-items").map(|r| r.mops) else {
        return;
    };
    if ceil <= 0.0 {
        return;
    }
    for row in rows.iter_mut().filter(|r| r.impl_name != "ceiling") {
        // Per-core fraction: an N-core aggregate is compared against N times the single-core ceiling.
        row.ceiling_frac = Some(row.mops / (ceil * row.cores.max(1) as f64));
    }
}

/// Applies overrides from the environment (comma-separated lists): `FLOWPLANE_TABLE_SIZES`,
/// `FLOWPLANE_TABLE_BATCHES`, `FLOWPLANE_TABLE_RATES`, `FLOWPLANE_TABLE_OPS`. Unparsable values are ignored.
pub fn options_from_env(mut o: TableBenchOptions) -> TableBenchOptions {
    fn list<T: std::str::FromStr>(var: &str) -> Option<Vec<T>> {
        let v = std::env::var(var).ok()?;
        let parsed: Result<Vec<T>, _> = v.split(',').map(|x| x.trim().parse()).collect();
        parsed.ok().filter(|p| !p.is_empty())
    }
    if let Some(v) = list("FLOWPLANE_TABLE_SIZES") {
        o.sizes = v;
    }
    if let Some(v) = list("FLOWPLANE_TABLE_BATCHES") {
        o.batch_sizes = v;
    }
    if let Some(v) = list("FLOWPLANE_TABLE_RATES") {
        o.insert_rates = v;
    }
    if let Some(v) = list::<u64>("FLOWPLANE_TABLE_OPS") {
        o.ops = v[0];
    }
    o
}

/// Renders rows as an aligned text table.
pub fn format_text(rows: &[BenchRow]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<18} {:<14} {:>10} {:>5} {:>8} {:>5} {:>9} {:>10} {:>7}  ratios / extra",
        "impl", "op", "size", "batch", "ins/1:r", "cores", "Mops", "cycles/op", "ceil%"
    );
    for r in rows {
        let ceil = r.ceiling_frac.map(|f| format!("{:.0}%", f * 100.0)).unwrap_or_else(|| "-".into());
        let ins = if r.insert_every == 0 { "-".to_string() } else { r.insert_every.to_string() };
        let _ = write!(
            s,
            "{:<18} {:<14} {:>10} {:>5} {:>8} {:>5} {:>9.2} {:>10.1} {:>7} ",
            r.impl_name, r.op, r.size, r.batch, ins, r.cores, r.mops, r.cycles_per_op, ceil
        );
        for (n, v) in &r.ratio_vs {
            let _ = write!(s, " x{v:.2} vs {n};");
        }
        for (n, v) in &r.extra {
            let _ = write!(s, " {n}={v:.3};");
        }
        s.push('\n');
    }
    s
}

/// Serialises rows as a JSON array.
pub fn to_json(rows: &[BenchRow]) -> String {
    serde_json::to_string_pretty(rows).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_distinct_and_deterministic() {
        let (a, ha) = make_keys(100_000, 7);
        let (b, hb) = make_keys(100_000, 7);
        assert_eq!(a, b);
        assert_eq!(ha, hb);
        let set: std::collections::HashSet<_> = a.iter().collect();
        assert_eq!(set.len(), a.len());
        assert_eq!(ha[5], bench_hash(&a[5]));
    }

    /// The CI smoke run: every implementation produces its rows, with sane numbers.
    #[test]
    fn quick_run_produces_rows() {
        let rows = run(&TableBenchOptions::quick());
        for op in ["lookup-hit", "lookup-miss", "update", "insert", "delete", "mixed"] {
            for imp in ["flowplane", "hashbrown"] {
                assert!(rows.iter().any(|r| r.impl_name == imp && r.op == op && r.mops > 0.0), "{imp} {op}");
            }
        }
        let fp = rows.iter().find(|r| r.impl_name == "flowplane" && r.op == "lookup-hit" && r.batch == 32);
        assert!(fp.is_some_and(|r| r.ratio_vs.iter().any(|(n, x)| n == "hashbrown" && *x > 0.0)));
    }

    /// The full report: `cargo test --release -p flowplane-bench table::tests::report -- --ignored --nocapture`
    /// (override sizes etc. with `FLOWPLANE_TABLE_*`, see [`options_from_env`]).
    #[test]
    #[ignore]
    fn report() {
        let quick = std::env::var("FLOWPLANE_TABLE_QUICK").is_ok();
        let o = options_from_env(if quick { TableBenchOptions::quick() } else { TableBenchOptions::default() });
        let rows = run(&o);
        println!("{}", format_text(&rows));
        if let Ok(path) = std::env::var("FLOWPLANE_TABLE_JSON") {
            std::fs::write(path, to_json(&rows)).ok();
        }
        assert!(!rows.is_empty());
    }

    #[test]
    fn ratios_match_batch_or_fall_back_to_batch_one() {
        let mut rows = vec![
            BenchRow { mops: 60.0, batch: 32, ..BenchRow::new("flowplane", "lookup-hit", 1024, 32, 0, 1, 1) },
            BenchRow { mops: 20.0, ..BenchRow::new("hashbrown", "lookup-hit", 1024, 1, 0, 1, 1) },
            BenchRow { mops: 120.0, ..BenchRow::new("ceiling", "two-line-items", 0, 1, 0, 1, 1) },
        ];
        fill_ratios(&mut rows);
        fill_ceiling_fracs(&mut rows);
        assert_eq!(rows[0].ratio_vs, vec![("hashbrown".to_string(), 3.0)]);
        assert_eq!(rows[0].ceiling_frac, Some(0.5));
        assert!(format_text(&rows).contains("x3.00 vs hashbrown"));
        let back: Vec<BenchRow> = serde_json::from_str(&to_json(&rows)).unwrap();
        assert_eq!(back, rows);
    }
}
