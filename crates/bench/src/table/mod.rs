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
//!
//! Rows must not depend on their order. So every single-core row is measured by
//! [`steady`] in one block ([`steady_rows`] says why not interleaved with the
//! others): warm-up slices of its own work until the rate is stable, then
//! [`SLICES`] slices, the median slice being a row's figure (a burst of
//! interference from other processes moves one slice, not the row); rows
//! read disjoint regions of the key streams ([`Workload::slice_start`]); the flow
//! tables are prefaulted with their transparent hugepages assembled before
//! measuring ([`flowplane_table::FlowTable::prefault`]), and every row reports
//! the page backing of the memory it measured (`huge_pages`: the fraction on
//! 2 MiB pages, see [`crate::pages`]). `reverse` runs the rows in the opposite
//! order, to check that the figures do not move.

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
    /// Run the rows in the opposite order (implementations, sizes, batch sizes, rates, and the insertion-rate sweep
    /// before the lookups): the figures must not move.
    #[serde(default)]
    pub reverse: bool,
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
            reverse: false,
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
            reverse: false,
        }
    }

    /// The sizes, batch sizes and insertion rates in run order (reversed with `reverse`).
    pub(crate) fn ordered(&self) -> (Vec<usize>, Vec<usize>, Vec<u64>) {
        let (mut s, mut b, mut r) = (self.sizes.clone(), self.batch_sizes.clone(), self.insert_rates.clone());
        if self.reverse {
            s.reverse();
            b.reverse();
            r.reverse();
        }
        (s, b, r)
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
    /// Fraction of the measured table's resident memory on 2 MiB pages (transparent or hugetlb) when the row was
    /// measured; `None` where unknown.
    #[serde(default)]
    pub huge_pages: Option<f64>,
    /// `mops` over `--reps` rounds (None with one).
    #[serde(default)]
    pub spread: Option<crate::reps::Spread>,
    /// The operations the figure rests on and why not to quote it ([`flowplane_engine::trust`]; ceilings: none).
    #[serde(default)]
    pub trust: crate::reps::Trust,
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
            huge_pages: None,
            spread: None,
            trust: if impl_name == "ceiling" {
                crate::reps::Trust::default()
            } else {
                crate::reps::Trust::of_ops(mops, ops, "operations")
            },
        }
    }

    /// A row from a [`steady`] measurement, with its CPU share and warm-up as extras.
    pub fn steady(impl_name: &str, op: &str, size: usize, batch: usize, insert_every: u64, s: &Steady) -> Self {
        let cycles = (s.cycles_per_op * s.ops as f64).round() as u64;
        let mut r = BenchRow::new(impl_name, op, size, batch, insert_every, s.ops, cycles);
        r.extra.push(("cpu_share".into(), s.cpu_share));
        r.extra.push(("mops_per_cpu".into(), s.mops_per_cpu));
        let best = if s.best_cycles_per_op > 0.0 { crate::tsc::hz() / s.best_cycles_per_op / 1e6 } else { 0.0 };
        r.extra.push(("mops_best".into(), best));
        r.extra.push(("warmup_slices".into(), f64::from(s.warmup)));
        r
    }

    /// Sets the page backing.
    pub fn with_pages(mut self, b: crate::pages::PageBacking) -> Self {
        self.huge_pages = b.fraction();
        self
    }
}

/// Measured slices per row; the row's figure is the median slice.
pub const SLICES: u64 = 9;
/// Warm-up ends when two consecutive slices' rates agree within this fraction...
pub const WARMUP_TOLERANCE: f64 = 0.05;
/// ...or after this many slices (a machine busy with other work may never be stable).
pub const WARMUP_MAX: u32 = 8;

/// How one row was measured, see [`steady`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Steady {
    /// TSC cycles per operation of the median measured slice.
    pub cycles_per_op: f64,
    /// TSC cycles per operation of the fastest measured slice (the least disturbed moment).
    pub best_cycles_per_op: f64,
    /// Operations measured (all slices, warm-up excluded).
    pub ops: u64,
    /// Warm-up rounds run before measuring.
    pub warmup: u32,
    /// Thread CPU time over wall time during the measured slices: below 1 when other processes took the core.
    pub cpu_share: f64,
    /// Million operations per second of CPU time the thread got (median slice): the rate with the time other
    /// processes took the core left out (their cache and memory traffic still counts).
    pub mops_per_cpu: f64,
}

/// Measures `ops` operations of one row in the steady state. `slice(n, warming)` runs `n` operations of the row
/// (continuing where its previous slice stopped) and returns the TSC cycles they took.
///
/// Warm-up slices (`n = ops / SLICES`) run until two consecutive ones agree within [`WARMUP_TOLERANCE`] (at most
/// [`WARMUP_MAX`]); then [`SLICES`] measured slices, the row's figure being the median one. Warm-up is normally the
/// measured work itself; rows that consume keys (insertions) warm up on lookups instead.
pub fn steady(ops: u64, mut slice: impl FnMut(u64, bool) -> u64) -> Steady {
    let n = ops.div_ceil(SLICES).max(1);
    let mut prev: Option<f64> = None;
    let mut warmup = 0;
    loop {
        if warmup == WARMUP_MAX {
            break;
        }
        warmup += 1;
        let c = slice(n, true) as f64;
        let stable = prev.is_some_and(|p| (c - p).abs() <= WARMUP_TOLERANCE * p.max(c));
        prev = Some(c);
        if stable {
            break;
        }
    }
    let mut per_op = Vec::with_capacity(SLICES as usize);
    let mut per_cpu = Vec::with_capacity(SLICES as usize);
    let (mut cpu, mut wall) = (0u64, 0u64);
    for _ in 0..SLICES {
        let (c0, w0) = (thread_cpu_ns(), std::time::Instant::now());
        per_op.push(slice(n, false) as f64 / n as f64);
        let c = thread_cpu_ns().saturating_sub(c0);
        wall += w0.elapsed().as_nanos() as u64;
        cpu += c;
        per_cpu.push(n as f64 * 1e3 / c.max(1) as f64);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Steady {
        cycles_per_op: median(&mut per_op),
        best_cycles_per_op: per_op[0],
        ops: n * SLICES,
        warmup,
        cpu_share: if wall > 0 { (cpu as f64 / wall as f64).min(1.0) } else { 0.0 },
        mops_per_cpu: median(&mut per_cpu),
    }
}

/// Measures `rows` rows of `ops` operations each, one after the other, each by [`steady`] (its own warm-up, then
/// its slices). `slice(row, n, warming)` runs `n` operations of `row`.
///
/// Rows are deliberately not interleaved slice by slice: on this machine the rate of a row depends on what ran in
/// the tens of milliseconds before it, beyond any one slice (a batch-64 lookup slice right after batch-32 work runs
/// at ~100 cycles/op, after batch-64 work at ~40, with the same keys or with disjoint ones, even after a full
/// untimed slice of its own work), so an interleaved row's figure depended on its neighbour in the order (issue 7
/// item 10). A row measured in one block reaches the state its own work sustains; the warm-up waits for it.
pub fn steady_rows(ops: u64, rows: usize, mut slice: impl FnMut(usize, u64, bool) -> u64) -> Vec<Steady> {
    (0..rows).map(|r| steady(ops, |n, warming| slice(r, n, warming))).collect()
}

/// CPU time consumed by the calling thread, in ns (0 if unavailable).
pub(crate) fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec into the valid, exclusively borrowed `ts`.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc == 0 {
        (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64)
    } else {
        0
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
///
/// Rows of one run read disjoint regions of the streams ([`Workload::slice_start`]): a slice that re-reads keys
/// another row just read would find part of their lines still in the caches, a steady state no single workload
/// has. Consecutive slices of a row read consecutive regions, so a key is read again only after every region was.
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
    /// Regions of `hit_stream` and `absent`: one per row of the run.
    regions: usize,
}

impl Workload {
    /// Builds the workload of one table size: `ops + ABSENT_SLACK` absent keys, streams of at most 1M keys, cycled.
    pub fn new(size: usize, ops: u64, seed: u64) -> Self {
        Self::for_rows(size, ops, seed, 1)
    }

    /// The workload of `rows` rows measured by [`steady_rows`] with `ops` operations each: every row gets its own
    /// region of one slice in both streams (see [`Workload::slice_start`]), so the hit stream holds
    /// `rows` slices of keys and `absent` at least that many. With `rows = 1` it is [`Workload::new`]'s.
    pub fn for_rows(size: usize, ops: u64, seed: u64, rows: usize) -> Self {
        let regions = rows.max(1);
        let cycled = (ops as usize).clamp(1, 1 << 20);
        let region_len = ops.div_ceil(SLICES).max(1) as usize + MAX_BATCH_BENCH;
        let absent_n = if regions > 1 {
            (ops as usize + ABSENT_SLACK).max(regions * region_len)
        } else {
            ops as usize + ABSENT_SLACK
        };
        let (mut keys, mut hashes) = make_keys(size + absent_n, seed);
        let absent = keys.split_off(size);
        let absent_hashes = hashes.split_off(size);
        let stream_len = if regions > 1 { regions * region_len } else { cycled };
        let mut rng = SplitMix(seed ^ 0xA5A5);
        let mut hit_stream = Vec::with_capacity(stream_len);
        let mut hit_stream_hashes = Vec::with_capacity(stream_len);
        for _ in 0..stream_len {
            let i = (rng.next_u64() % size.max(1) as u64) as usize;
            hit_stream.push(keys[i]);
            hit_stream_hashes.push(hashes[i]);
        }
        // Distinct indices: multiplying by a prime larger than any size is a bijection mod `size`.
        let churn_n = size.min(cycled);
        let churn = (0..churn_n as u64).map(|j| ((j * 2_654_435_761 + 12_345) % size as u64) as u32).collect();
        Workload {
            resident: keys,
            resident_hashes: hashes,
            absent,
            absent_hashes,
            hit_stream,
            hit_stream_hashes,
            churn,
            regions,
        }
    }

    /// Where row `row`'s `k`-th slice (warm-up included) starts reading, in `hit_stream` and in `absent`: region
    /// `(row + k) mod rows` of each. A region holds a whole slice (plus a batch); rows start in different regions
    /// and move one region per slice.
    pub fn slice_start(&self, row: usize, k: usize) -> (usize, usize) {
        let r = (row + k) % self.regions;
        (r * (self.hit_stream.len() / self.regions), r * (self.absent.len() / self.regions))
    }
}

/// A row's place in the key streams: its index among the rows of its run and the slices it has run.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StreamCursor {
    row: usize,
    slices: usize,
}

impl StreamCursor {
    /// The cursor of row `row`, before its first slice.
    pub(crate) fn new(row: usize) -> Self {
        StreamCursor { row, slices: 0 }
    }

    /// Where the next slice starts in `hit_stream` and in `absent` ([`Workload::slice_start`]).
    pub(crate) fn next_slice(&mut self, w: &Workload) -> (usize, usize) {
        self.slices += 1;
        w.slice_start(self.row, self.slices - 1)
    }
}

/// Seed of the benchmark keys (every implementation measures the same keys).
pub const KEY_SEED: u64 = 0xF10B_A5E5;

/// Largest batch the benchmarks use: one bulk chunk of the tables.
pub const MAX_BATCH_BENCH: usize = flowplane_table::BULK_LOOKUP_MAX;

/// Absent keys beyond `ops`: every [`steady`] slice may overrun its share by most of a batch.
pub const ABSENT_SLACK: usize = (SLICES as usize + 1) * MAX_BATCH_BENCH;

/// Runs every table benchmark selected by `opts` and returns all rows, with ratios and ceiling fractions filled in.
pub fn run(opts: &TableBenchOptions) -> Vec<BenchRow> {
    let mut rows = Vec::new();
    // Ceilings first, while the machine is quiet and before the tables take memory (in both orders: the other rows
    // are compared against them).
    rows.extend(ceiling::measure(opts.quick).rows());
    type Part = fn(&TableBenchOptions) -> Vec<BenchRow>;
    let mut parts: Vec<Part> = vec![percore::run_percore, hashbrown::run_hashbrown];
    #[cfg(feature = "dpdk")]
    parts.push(dpdk::run_dpdk);
    parts.push(shared::run_shared);
    if opts.reverse {
        parts.reverse();
    }
    for part in parts {
        rows.extend(part(opts));
    }
    fill_ratios(&mut rows);
    fill_ceiling_fracs(&mut rows);
    rows
}

/// Most operations `--seconds` may ask per measurement (100x the default; the absent-key streams grow with it).
pub const MAX_OPS: u64 = 400_000_000;

/// `--seconds S` as an operation count: a pilot run (the per-core table at the smallest size and largest batch,
/// 200K operations) gives the fastest operation's rate, and S at that rate is the count, within 10,000 and
/// [`MAX_OPS`]. Every measurement does the same number of operations, so the fastest row lasts about S and the
/// slower ones longer (a DRAM-sized table's several times S).
pub fn ops_for_seconds(opts: &TableBenchOptions, seconds: f64) -> u64 {
    let pilot = TableBenchOptions {
        sizes: vec![opts.sizes.iter().copied().min().unwrap_or(1 << 10)],
        batch_sizes: vec![opts.batch_sizes.iter().copied().max().unwrap_or(32)],
        insert_rates: Vec::new(),
        ops: 200_000,
        ..opts.clone()
    };
    let mops = percore::run_percore(&pilot).iter().map(|r| r.mops).fold(0.0, f64::max);
    let ops = if mops > 0.0 { seconds * mops * 1e6 } else { seconds * 1e8 };
    (ops as u64).clamp(10_000, MAX_OPS)
}

/// [`run`] `reps` rounds over (at least one): each row's figure (Mops) is the median round's, with min and max;
/// ratios and ceiling fractions are taken between the medians.
pub fn run_reps(opts: &TableBenchOptions, reps: usize) -> Result<Vec<BenchRow>, String> {
    let merged = crate::reps::repeat(reps, |_| Ok(run(opts)), |r| Some(r.mops))?;
    let mut rows: Vec<BenchRow> = merged
        .into_iter()
        .map(|(mut r, s)| {
            r.ratio_vs.clear();
            r.ceiling_frac = None;
            if let Some(s) = s.as_ref().filter(|_| r.impl_name != "ceiling") {
                r.trust.spread(s);
            }
            r.spread = s.filter(|s| s.reps > 1);
            r
        })
        .collect();
    fill_ratios(&mut rows);
    fill_ceiling_fracs(&mut rows);
    Ok(rows)
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

/// Sets `ceiling_frac` of per-item table operations from a `ceiling`/`two-line-items` row, if one was measured,
/// and the flowplane rows' fraction of the one-line ceiling (`ceiling`/`random-lines`: what a lookup reading one
/// random line per key can reach) as the extra figure `one_line_frac`.
pub fn fill_ceiling_fracs(rows: &mut [BenchRow]) {
    let one = rows.iter().find(|r| r.impl_name == "ceiling" && r.op == "random-lines").map(|r| r.mops);
    if let Some(one) = one.filter(|&m| m > 0.0) {
        for row in rows.iter_mut().filter(|r| r.impl_name.starts_with("flowplane")) {
            let f = row.mops / (one * row.cores.max(1) as f64);
            match row.extra.iter_mut().find(|(n, _)| n == "one_line_frac") {
                Some(e) => e.1 = f,
                None => row.extra.push(("one_line_frac".into(), f)),
            }
        }
    }
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
        "{:<18} {:<14} {:>10} {:>5} {:>8} {:>5} {:>9} {:>13} {:>10} {:>7} {:>6}  ratios / extra",
        "impl", "op", "size", "batch", "ins/1:r", "cores", "Mops", "min-max", "cycles/op", "ceil%", "huge%"
    );
    for r in rows {
        let ceil = r.ceiling_frac.map(|f| format!("{:.0}%", f * 100.0)).unwrap_or_else(|| "-".into());
        let huge = r.huge_pages.map(|f| format!("{:.0}%", f * 100.0)).unwrap_or_else(|| "-".into());
        let ins = if r.insert_every == 0 { "-".to_string() } else { r.insert_every.to_string() };
        let _ = write!(
            s,
            "{:<18} {:<14} {:>10} {:>5} {:>8} {:>5} {:>9.2} {:>13} {:>10.1} {:>7} {:>6} ",
            r.impl_name,
            r.op,
            r.size,
            r.batch,
            ins,
            r.cores,
            r.mops,
            r.spread.as_ref().map_or("-".to_string(), |x| x.cell(2)),
            r.cycles_per_op,
            ceil,
            huge
        );
        for (n, v) in &r.ratio_vs {
            let _ = write!(s, " x{v:.2} vs {n};");
        }
        for (n, v) in &r.extra {
            let _ = write!(s, " {n}={v:.3};");
        }
        s.push_str(&r.trust.cell());
        s.push('\n');
    }
    if let Some(n) = crate::reps::footnote(rows.iter().map(|r| &r.trust)) {
        s.push_str(&n);
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

    /// Rows of one run start their slices in distinct regions of both streams, each long enough for a slice, and
    /// a row's consecutive slices move to the next region; one row alone keeps `new`'s cycled streams.
    #[test]
    fn rows_read_disjoint_stream_regions() {
        let (size, ops, rows) = (1 << 10, 9_000u64, 5);
        let w = Workload::for_rows(size, ops, KEY_SEED, rows);
        let slice = ops.div_ceil(SLICES) as usize + MAX_BATCH_BENCH;
        assert_eq!(w.hit_stream.len(), rows * slice);
        assert!(w.absent.len() >= rows * slice);
        for k in 0..2 * rows {
            let starts: Vec<(usize, usize)> = (0..rows).map(|r| w.slice_start(r, k)).collect();
            for (i, a) in starts.iter().enumerate() {
                assert!(a.0 + slice <= w.hit_stream.len() && a.1 + slice <= w.absent.len());
                for b in &starts[i + 1..] {
                    assert!(a.0.abs_diff(b.0) >= slice && a.1.abs_diff(b.1) >= slice, "{starts:?}");
                }
            }
            assert_eq!(w.slice_start(0, k + 1), w.slice_start(1, k));
        }
        // Absent keys are never resident; every stream key is.
        let resident: std::collections::HashSet<_> = w.resident.iter().collect();
        assert!(w.absent.iter().all(|k| !resident.contains(k)));
        assert!(w.hit_stream.iter().all(|k| resident.contains(k)));
        let one = Workload::new(size, ops, KEY_SEED);
        assert_eq!((one.hit_stream.len(), one.slice_start(0, 3)), (ops as usize, (0, 0)));
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
    fn steady_warms_until_stable_then_takes_the_median_slice() {
        // Warm-up slices cost 100, 200, 150, 152 cycles per op: the 4th is within 5% of the 3rd, so warming stops.
        let warm = [100u64, 200, 150, 152, 1, 1];
        let measured = [10u64, 50, 20, 30, 40, 35, 25, 45, 15];
        let (mut w, mut m) = (0, 0);
        let s = steady(900, |n, warming| {
            assert_eq!(n, 100);
            if warming {
                w += 1;
                warm[w - 1] * n
            } else {
                m += 1;
                measured[m - 1] * n
            }
        });
        assert_eq!((w, m), (4, SLICES as usize));
        assert_eq!((s.warmup, s.cycles_per_op, s.best_cycles_per_op, s.ops), (4, 30.0, 10.0, 900));
        assert!(s.mops_per_cpu > 0.0 && (0.0..=1.0).contains(&s.cpu_share));
        // A machine that never settles: warm-up gives up after WARMUP_MAX slices.
        let mut k = 0u64;
        let s = steady(18, |_, warming| {
            k += 1;
            if warming {
                k * k * 100
            } else {
                7
            }
        });
        assert_eq!((s.warmup, s.cycles_per_op), (WARMUP_MAX, 7.0 / 2.0));
    }

    #[test]
    fn reverse_order_measures_the_same_rows_with_their_page_backing() {
        let opts = TableBenchOptions {
            sizes: vec![1 << 10, 1 << 12],
            batch_sizes: vec![1, 32],
            insert_rates: vec![1, 10],
            ops: 20_000,
            cores: vec![1],
            ..TableBenchOptions::quick()
        };
        let key = |r: &BenchRow| (r.impl_name.clone(), r.op.clone(), r.size, r.batch, r.insert_every, r.cores);
        let mut fwd: Vec<_> = run(&opts).iter().map(key).collect();
        let rows = run(&TableBenchOptions { reverse: true, ..opts });
        let mut rev: Vec<_> = rows.iter().map(key).collect();
        assert_ne!(fwd, rev, "the order changed");
        fwd.sort();
        rev.sort();
        assert_eq!(fwd, rev);
        // Every table row knows its page backing (smaps is there on Linux).
        if cfg!(target_os = "linux") {
            for r in rows.iter().filter(|r| r.impl_name != "ceiling") {
                assert!(r.huge_pages.is_some_and(|f| (0.0..=1.0).contains(&f)), "{r:?}");
            }
            assert!(format_text(&rows).contains("huge%"));
        }
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
