//! hashbrown (SwissTable) rows of `flowplane bench table`, on the same keys, hashes and access streams as the
//! per-core table. `hashbrown::HashTable<(BenchKey, [u8; 64])>` is driven with the precomputed hashes (no
//! hashing cost), preallocated like the flow table; it has no batch API, so its rows are batch 1.

use super::{BenchKey, BenchRow, TableBenchOptions, Workload, KEY_SEED};
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

fn cycle_ops<F: FnMut(&BenchKey, u64) -> u64>(keys: &[BenchKey], hashes: &[u64], ops: u64, mut f: F) -> u64 {
    let mut sum = 0u64;
    let mut done = 0u64;
    let t0 = rdtsc();
    while done < ops {
        for (k, h) in keys.iter().zip(hashes) {
            sum = sum.wrapping_add(f(k, *h));
        }
        done += keys.len().max(1) as u64;
    }
    let t = rdtsc().wrapping_sub(t0);
    black_box(sum);
    t * ops / done.max(1)
}

/// Measures hashbrown on the same workloads as `percore::run_percore`.
pub fn run_hashbrown(opts: &TableBenchOptions) -> Vec<BenchRow> {
    let mut rows = Vec::new();
    let ops = opts.ops.max(1);
    for &size in &opts.sizes {
        let w = Workload::new(size, ops, KEY_SEED);
        let mut m = Map::with_capacity(size);
        let t0 = rdtsc();
        for (k, h) in w.resident.iter().zip(&w.resident_hashes) {
            insert(&mut m, k, *h);
        }
        rows.push(BenchRow::new(NAME, "insert-fresh", size, 1, 0, size as u64, rdtsc().wrapping_sub(t0)));
        let c = cycle_ops(&w.hit_stream, &w.hit_stream_hashes, ops, |k, h| {
            m.find(h, |e| e.0 == *k).map_or(0, |e| u64::from(e.1[0]))
        });
        rows.push(BenchRow::new(NAME, "lookup-hit", size, 1, 0, ops, c));
        let miss_n = w.hit_stream.len().min(w.absent.len());
        let c = cycle_ops(&w.absent[..miss_n], &w.absent_hashes[..miss_n], ops, |k, h| {
            u64::from(m.find(h, |e| e.0 == *k).is_some())
        });
        rows.push(BenchRow::new(NAME, "lookup-miss", size, 1, 0, ops, c));
        let c = cycle_ops(&w.hit_stream, &w.hit_stream_hashes, ops, |k, h| match m.find_mut(h, |e| e.0 == *k) {
            Some(e) => {
                let v = u64::from_le_bytes(e.1[8..16].try_into().unwrap_or([0; 8])) + 1;
                e.1[8..16].copy_from_slice(&v.to_le_bytes());
                1
            }
            None => 0,
        });
        rows.push(BenchRow::new(NAME, "update", size, 1, 0, ops, c));
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
                insert(&mut m, k, *h);
            }
            ic += rdtsc().wrapping_sub(t1);
            dc += t1.wrapping_sub(t0);
            n += ck.len() as u64;
        }
        rows.push(BenchRow::new(NAME, "insert", size, 1, 0, n, ic));
        rows.push(BenchRow::new(NAME, "delete", size, 1, 0, n, dc));
        drop(m);
        // Insertion-rate sweep, batch 1, same op stream as the flow table's.
        let mut m = Map::with_capacity(size + ops as usize);
        for (k, h) in w.resident.iter().zip(&w.resident_hashes) {
            insert(&mut m, k, *h);
        }
        for &r in &opts.insert_rates {
            let r = r.max(1);
            let (mut next_new, mut next_hit) = (0usize, 0usize);
            let t0 = rdtsc();
            for done in 0..ops {
                let (k, h) = if done % r == r - 1 {
                    next_new += 1;
                    (w.absent[next_new - 1], w.absent_hashes[next_new - 1])
                } else {
                    next_hit = if next_hit + 1 == w.hit_stream.len() { 0 } else { next_hit + 1 };
                    (w.hit_stream[next_hit], w.hit_stream_hashes[next_hit])
                };
                match m.find_mut(h, |e| e.0 == k) {
                    Some(e) => e.1[1] = e.1[1].wrapping_add(1),
                    None => insert(&mut m, &k, h),
                }
            }
            rows.push(BenchRow::new(NAME, "mixed", size, 1, r, ops, rdtsc().wrapping_sub(t0)));
            for (k, h) in w.absent[..next_new].iter().zip(&w.absent_hashes[..next_new]) {
                if let Ok(e) = m.find_entry(*h, |e| e.0 == *k) {
                    e.remove();
                }
            }
        }
    }
    rows
}
