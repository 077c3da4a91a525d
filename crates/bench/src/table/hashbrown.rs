//! hashbrown (SwissTable) rows of `flowplane bench table`, on the same keys, hashes and access streams as the
//! per-core table. `hashbrown::HashTable<(BenchKey, [u8; 64])>` is driven with the precomputed hashes (no
//! hashing cost), preallocated like the flow table; it has no batch API, so its rows are batch 1. As for the flow
//! table, the lookup, update and insertion-rate rows are measured one after the other ([`super::steady_rows`]).

use super::{steady_rows, BenchKey, BenchRow, StreamCursor, TableBenchOptions, Workload, KEY_SEED};
use crate::pages::{self, PageBacking};
use crate::tsc::rdtsc;
use hashbrown::HashTable;
use std::hint::black_box;

const NAME: &str = "hashbrown";

type Map = HashTable<(BenchKey, [u8; 64])>;

fn insert(m: &mut Map, k: &BenchKey, h: u64) {
    if m.find(h, |e| e.0 == *k).is_none() {
        let mut v = [0u8; 64];
        v[0] = 1;
        m.insert_unique(h, (*k, v), |e| super::bench_hash(&e.0));
    }
}

/// Runs `n` operations over `keys` (cycled from `*at`); returns the TSC cycles.
fn cycle_ops<F: FnMut(&BenchKey, u64) -> u64>(
    keys: &[BenchKey],
    hashes: &[u64],
    at: &mut usize,
    n: u64,
    mut f: F,
) -> u64 {
    let mut sum = 0u64;
    let t0 = rdtsc();
    for _ in 0..n {
        if *at >= keys.len() {
            *at = 0;
        }
        sum = sum.wrapping_add(f(&keys[*at], hashes[*at]));
        *at += 1;
    }
    let t = rdtsc().wrapping_sub(t0);
    black_box(sum);
    t
}

/// The page backing of the mapping holding the map's entries (heap memory, not advised for hugepages).
fn backing(m: &Map, w: &Workload) -> PageBacking {
    let e = w.resident.first().zip(w.resident_hashes.first()).and_then(|(k, h)| m.find(*h, |e| e.0 == *k));
    e.map_or_else(PageBacking::default, |e| pages::of_addr(e as *const _ as usize))
}

/// The rows, as in `percore`: lookups and updates on `a`, the insertion-rate sweep on `b`
/// (each measured slice's new flows removed after it; warm-up only hits).
#[derive(Clone, Copy)]
enum Op {
    Hit,
    Miss,
    Update,
    Mixed(u64),
}

/// One row: its operation and where its slices read the key streams.
struct Job {
    op: Op,
    cursor: StreamCursor,
}

fn run_job(job: &mut Job, a: &mut Map, b: &mut Map, w: &Workload, n: u64, warming: bool) -> u64 {
    let (hit_at, absent_at) = job.cursor.next_slice(w);
    let mut cursor = if matches!(job.op, Op::Miss) { absent_at } else { hit_at };
    let at = &mut cursor;
    match job.op {
        Op::Hit => cycle_ops(&w.hit_stream, &w.hit_stream_hashes, at, n, |k, h| {
            a.find(h, |e| e.0 == *k).map_or(0, |e| u64::from(e.1[0]))
        }),
        Op::Miss => cycle_ops(&w.absent, &w.absent_hashes, at, n, |k, h| u64::from(a.find(h, |e| e.0 == *k).is_some())),
        Op::Update => {
            cycle_ops(&w.hit_stream, &w.hit_stream_hashes, at, n, |k, h| match a.find_mut(h, |e| e.0 == *k) {
                Some(e) => {
                    let v = u64::from_le_bytes(e.1[8..16].try_into().unwrap_or([0; 8])) + 1;
                    e.1[8..16].copy_from_slice(&v.to_le_bytes());
                    1
                }
                None => 0,
            })
        }
        Op::Mixed(r) => {
            let mut next_new = absent_at;
            let t0 = rdtsc();
            for i in 0..n {
                let (k, h) = if !warming && i % r == r - 1 {
                    next_new += 1;
                    (w.absent[next_new - 1], w.absent_hashes[next_new - 1])
                } else {
                    *at = if *at + 1 >= w.hit_stream.len() { 0 } else { *at + 1 };
                    (w.hit_stream[*at], w.hit_stream_hashes[*at])
                };
                match b.find_mut(h, |e| e.0 == k) {
                    Some(e) => e.1[1] = e.1[1].wrapping_add(1),
                    None => insert(b, &k, h),
                }
            }
            let t = rdtsc().wrapping_sub(t0);
            for (k, h) in w.absent[absent_at..next_new].iter().zip(&w.absent_hashes[absent_at..next_new]) {
                if let Ok(e) = b.find_entry(*h, |e| e.0 == *k) {
                    e.remove();
                }
            }
            t
        }
    }
}

/// Measures hashbrown on the same workloads as `percore::run_percore`.
pub fn run_hashbrown(opts: &TableBenchOptions) -> Vec<BenchRow> {
    let mut rows = Vec::new();
    let ops = opts.ops.max(1);
    let (sizes, _, rates) = opts.ordered();
    for size in sizes {
        let w = Workload::for_rows(size, ops, KEY_SEED, 3 + rates.len());
        let mut a = Map::with_capacity(size);
        let t0 = rdtsc();
        for (k, h) in w.resident.iter().zip(&w.resident_hashes) {
            insert(&mut a, k, *h);
        }
        let pa = backing(&a, &w);
        let fresh = BenchRow::new(NAME, "insert-fresh", size, 1, 0, size as u64, rdtsc().wrapping_sub(t0));
        rows.push(fresh.with_pages(pa));
        let mut b = Map::with_capacity(size + (ops / super::SLICES) as usize + super::ABSENT_SLACK);
        for (k, h) in w.resident.iter().zip(&w.resident_hashes) {
            insert(&mut b, k, *h);
        }
        let pb = backing(&b, &w);
        if opts.reverse {
            rows.extend(churn(&mut a, ops, size, &w, pa));
        }
        let mut jobs: Vec<Job> = [Op::Hit, Op::Miss, Op::Update]
            .into_iter()
            .chain(rates.iter().map(|&r| Op::Mixed(r.max(1))))
            .enumerate()
            .map(|(row, op)| Job { op, cursor: StreamCursor::new(row) })
            .collect();
        if opts.reverse {
            jobs.reverse();
        }
        let results =
            steady_rows(ops, jobs.len(), |i, n, warming| run_job(&mut jobs[i], &mut a, &mut b, &w, n, warming));
        for (job, s) in jobs.iter().zip(&results) {
            rows.push(match job.op {
                Op::Hit => BenchRow::steady(NAME, "lookup-hit", size, 1, 0, s).with_pages(pa),
                Op::Miss => BenchRow::steady(NAME, "lookup-miss", size, 1, 0, s).with_pages(pa),
                Op::Update => BenchRow::steady(NAME, "update", size, 1, 0, s).with_pages(pa),
                Op::Mixed(r) => BenchRow::steady(NAME, "mixed", size, 1, r, s).with_pages(pb),
            });
        }
        drop(b);
        if !opts.reverse {
            rows.extend(churn(&mut a, ops, size, &w, pa));
        }
    }
    rows
}

/// Delete / re-insert rounds, as in `percore`.
fn churn(m: &mut Map, ops: u64, size: usize, w: &Workload, pages: PageBacking) -> Vec<BenchRow> {
    let ck: Vec<BenchKey> = w.churn.iter().map(|&i| w.resident[i as usize]).collect();
    let ch: Vec<u64> = w.churn.iter().map(|&i| w.resident_hashes[i as usize]).collect();
    let (mut dc, mut ic, mut n) = (0u64, 0u64, 0u64);
    while n < ops {
        let t0 = rdtsc();
        for (k, h) in ck.iter().zip(&ch) {
            if let Ok(e) = m.find_entry(*h, |e| e.0 == *k) {
                black_box(e.remove());
            }
        }
        let t1 = rdtsc();
        for (k, h) in ck.iter().zip(&ch) {
            insert(m, k, *h);
        }
        ic += rdtsc().wrapping_sub(t1);
        dc += t1.wrapping_sub(t0);
        n += ck.len() as u64;
    }
    vec![
        BenchRow::new(NAME, "insert", size, 1, 0, n, ic).with_pages(pages),
        BenchRow::new(NAME, "delete", size, 1, 0, n, dc).with_pages(pages),
    ]
}
