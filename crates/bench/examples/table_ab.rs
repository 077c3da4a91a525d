//! One harness for a before/after comparison of the flow table's code: the per-core rows of `bench table`
//! (lookup-hit, lookup-miss, update, and add-on-miss with one new flow every `r` ops), measured as `bench table`
//! measures them (each row in one block, warmed to a stable rate, median of 9 slices, rows reading disjoint
//! regions of the key streams), through only the `FlowTable` calls that have not changed since 57bd9ab — so the
//! same file builds against an older tree (`cp` it into that tree's `crates/bench/examples/`) and the two
//! binaries differ only in the table code.
//!
//! `cargo run --release -p flowplane-bench --example table_ab -- [SIZE]` prints one line per row:
//! `op batch cycles/op Mops` (op is `mixed-R` for one new flow every R ops). `TABLE_AB_BATCHES=32` and
//! `TABLE_AB_OPS=N` narrow a run (e.g. under callgrind). `scripts/table_ab.sh OLD_TREE ROUNDS` builds it in both
//! trees and prints each row's median over alternated runs (some rows settle at one of two rates per run).

use flowplane_bench::table::{make_keys, BenchKey};
use flowplane_bench::tsc::rdtsc;
use flowplane_table::{FlowTable, FullPolicy, Handle, TableConfig, INVALID_HANDLE};
use std::hint::black_box;

const SLICES: usize = 9;
/// Operations per row (`TABLE_AB_OPS` overrides, e.g. for a run under callgrind).
const OPS: usize = 4_000_000;
const BATCH_MAX: usize = 64;

#[derive(Clone, Copy)]
enum Op {
    Hit,
    Miss,
    Update,
    Mixed(usize),
}

/// `a` holds the resident flows (lookups, updates), `b` also has room for one slice of new ones.
struct Tables {
    a: FlowTable<BenchKey>,
    b: FlowTable<BenchKey>,
}

struct Keys {
    stream: Vec<BenchKey>,
    stream_h: Vec<u64>,
    absent: Vec<BenchKey>,
    absent_h: Vec<u64>,
    region: usize,
    regions: usize,
}

fn table(capacity: usize) -> FlowTable<BenchKey> {
    let cfg = TableConfig {
        capacity,
        state_size: 64,
        idle_timeout_ns: None,
        full_policy: FullPolicy::Reject,
        hugepages: true,
        // TABLE_AB_LAYOUT=inline measures the inline layout (default: bucketed).
        layout: if std::env::var("TABLE_AB_LAYOUT").is_ok_and(|v| v == "inline") {
            flowplane_table::Layout::Inline
        } else {
            flowplane_table::Layout::Bucketed
        },
    };
    FlowTable::new(cfg).expect("table")
}

/// `n` ops of `op` from region `reg`; returns TSC cycles.
fn slice(op: Op, batch: usize, t: &mut Tables, k: &Keys, reg: usize, n: usize, warming: bool) -> u64 {
    let Tables { a, b } = t;
    let start = (reg % k.regions) * k.region;
    let mut out = [INVALID_HANDLE as Handle; BATCH_MAX];
    let mut sum = 0u64;
    let t0 = rdtsc();
    let mut i = 0;
    match op {
        Op::Hit | Op::Update | Op::Miss => {
            let (keys, hs) = if matches!(op, Op::Miss) { (&k.absent, &k.absent_h) } else { (&k.stream, &k.stream_h) };
            while i < n {
                let (ks, hh) = (&keys[start + i..start + i + batch], &hs[start + i..start + i + batch]);
                if batch == 1 {
                    out[0] = a.lookup(&ks[0], hh[0]).unwrap_or(INVALID_HANDLE);
                } else {
                    black_box(a.lookup_batch(ks, hh, &mut out[..batch]));
                }
                for &x in &out[..batch] {
                    if x != INVALID_HANDLE {
                        match op {
                            Op::Update => {
                                if let Some(v) = a.state_as_mut::<u64>(x, 8) {
                                    *v += 1;
                                }
                            }
                            _ => sum += u64::from(a.state(x)[0]),
                        }
                    }
                }
                i += batch;
            }
        }
        Op::Mixed(r) => {
            let mut kb = [BenchKey::default(); BATCH_MAX];
            let mut hb = [0u64; BATCH_MAX];
            let (mut hit_at, mut new_at) = (start, start);
            while i < n {
                for j in 0..batch {
                    if !warming && (i + j) % r == r - 1 {
                        kb[j] = k.absent[new_at];
                        hb[j] = k.absent_h[new_at];
                        new_at += 1;
                    } else {
                        kb[j] = k.stream[hit_at];
                        hb[j] = k.stream_h[hit_at];
                        hit_at += 1;
                    }
                }
                if batch == 1 {
                    let _ = black_box(b.insert(&kb[0], hb[0], i as u64, |s| s[0] = 1));
                } else {
                    black_box(
                        b.lookup_or_insert_batch(&kb[..batch], &hb[..batch], i as u64, &mut out, |_, s| s[0] = 1),
                    );
                }
                i += batch;
            }
            let c = rdtsc().wrapping_sub(t0);
            for j in start..new_at {
                black_box(b.remove(&k.absent[j], k.absent_h[j]));
            }
            return c * n as u64 / i as u64;
        }
    }
    let c = rdtsc().wrapping_sub(t0);
    black_box(sum);
    c * n as u64 / i as u64
}

fn main() {
    let size: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(1 << 22);
    let mut rows: Vec<(Op, usize)> = Vec::new();
    // `TABLE_AB_BATCHES=32` keeps only those batch sizes.
    let batches: Vec<usize> = std::env::var("TABLE_AB_BATCHES")
        .ok()
        .map(|v| v.split(',').filter_map(|b| b.parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 32, 64]);
    for batch in batches {
        for op in [Op::Hit, Op::Miss, Op::Update, Op::Mixed(10), Op::Mixed(1000)] {
            rows.push((op, batch));
        }
    }
    let ops = std::env::var("TABLE_AB_OPS").ok().and_then(|v| v.parse().ok()).unwrap_or(OPS);
    let n = ops / SLICES;
    let region = n + BATCH_MAX;
    let regions = rows.len();
    let (mut keys, mut hashes) = make_keys(size + regions * region, 0xF10B_A5E5);
    let absent = keys.split_off(size);
    let absent_h = hashes.split_off(size);
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let (mut stream, mut stream_h) = (Vec::new(), Vec::new());
    for _ in 0..regions * region {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let i = (rng % size as u64) as usize;
        stream.push(keys[i]);
        stream_h.push(hashes[i]);
    }
    let k = Keys { stream, stream_h, absent, absent_h, region, regions };
    let mut a = table(size);
    let mut b = table(size + region);
    let mut out = [INVALID_HANDLE as Handle; BATCH_MAX];
    for t in [&mut a, &mut b] {
        for (kk, hh) in keys.chunks(BATCH_MAX).zip(hashes.chunks(BATCH_MAX)) {
            black_box(t.lookup_or_insert_batch(kk, hh, 0, &mut out[..kk.len()], |_, s| s[0] = 1));
        }
    }
    // The page backing the rows ran on (both trees' tables ask for transparent hugepages).
    if let Ok(r) = std::fs::read_to_string("/proc/self/smaps_rollup") {
        for l in r.lines().filter(|l| l.starts_with("Rss:") || l.starts_with("AnonHugePages:")) {
            eprintln!("{l}");
        }
    }
    let mut t = Tables { a, b };
    for (row, &(op, batch)) in rows.iter().enumerate() {
        let mut reg = row;
        let mut prev: Option<f64> = None;
        for _ in 0..8 {
            let c = slice(op, batch, &mut t, &k, reg, n, true) as f64;
            reg += 1;
            let stable = prev.is_some_and(|p| (c - p).abs() <= 0.05 * p.max(c));
            prev = Some(c);
            if stable {
                break;
            }
        }
        let mut per: Vec<f64> = (0..SLICES)
            .map(|_| {
                reg += 1;
                slice(op, batch, &mut t, &k, reg - 1, n, false) as f64 / n as f64
            })
            .collect();
        per.sort_by(f64::total_cmp);
        let name = match op {
            Op::Hit => "lookup-hit".to_string(),
            Op::Miss => "lookup-miss".to_string(),
            Op::Update => "update".to_string(),
            Op::Mixed(r) => format!("mixed-{r}"),
        };
        println!("{name} {batch} {:.1} {:.2}", per[SLICES / 2], 2.6e3 / per[SLICES / 2]);
    }
}
