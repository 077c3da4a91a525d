//! Per-core `FlowTable` rows of `flowplane bench table`: lookup-hit, lookup-miss, update, add-on-miss insertion
//! (into a fresh table and after deletions), delete, and the PNA insertion-rate sweep, per size and batch size.

use super::{BenchKey, BenchRow, TableBenchOptions, Workload, KEY_SEED, MAX_BATCH_BENCH};
use crate::tsc::rdtsc;
use flowplane_table::{FlowTable, FullPolicy, Handle, TableConfig, INVALID_HANDLE};
use std::hint::black_box;

const NAME: &str = "flowplane";

fn table(capacity: usize, state_size: usize) -> FlowTable<BenchKey> {
    let cfg =
        TableConfig { capacity, state_size, idle_timeout_ns: None, full_policy: FullPolicy::Reject, hugepages: true };
    match FlowTable::new(cfg) {
        Ok(t) => t,
        // Benchmark sizes are fixed by the options; running out of memory here is an environment failure.
        Err(e) => panic!("cannot create a {capacity}-entry table: {e}"),
    }
}

/// Inserts `keys` with batched add-on-miss; returns cycles spent.
fn fill(t: &mut FlowTable<BenchKey>, keys: &[BenchKey], hashes: &[u64], batch: usize) -> u64 {
    let mut out = [0 as Handle; MAX_BATCH_BENCH];
    let t0 = rdtsc();
    for (k, h) in keys.chunks(batch).zip(hashes.chunks(batch)) {
        if batch == 1 {
            let _ = black_box(t.insert(&k[0], h[0], 0, |s| s[0] = 1));
        } else {
            black_box(t.lookup_or_insert_batch(k, h, 0, &mut out, |_, s| s[0] = 1));
        }
    }
    rdtsc().wrapping_sub(t0)
}

/// Runs `ops` operations over `stream` (cycled) in batches; `f` does one batch and returns a checksum.
fn timed<F: FnMut(&[BenchKey], &[u64]) -> u64>(
    keys: &[BenchKey],
    hashes: &[u64],
    ops: u64,
    batch: usize,
    mut f: F,
) -> u64 {
    let per_pass = (keys.len() / batch * batch).max(batch) as u64;
    let mut done = 0u64;
    let mut sum = 0u64;
    let t0 = rdtsc();
    while done < ops {
        for (k, h) in keys.chunks_exact(batch).zip(hashes.chunks_exact(batch)) {
            sum = sum.wrapping_add(f(k, h));
        }
        done += per_pass;
    }
    let t = rdtsc().wrapping_sub(t0);
    black_box(sum);
    // Cycles per op use the real op count.
    t * ops / done.max(1)
}

/// Measures the per-core table for every size and batch size in `opts`.
pub fn run_percore(opts: &TableBenchOptions) -> Vec<BenchRow> {
    let mut rows = Vec::new();
    for &size in &opts.sizes {
        rows.extend(run_size(opts, size));
    }
    rows
}

fn run_size(opts: &TableBenchOptions, size: usize) -> Vec<BenchRow> {
    let ops = opts.ops.max(1);
    let w = Workload::new(size, ops, KEY_SEED);
    let mut rows = Vec::new();
    let mut t = table(size, opts.state_size);
    let c = fill(&mut t, &w.resident, &w.resident_hashes, MAX_BATCH_BENCH);
    let mut r = BenchRow::new(NAME, "insert-fresh", size, MAX_BATCH_BENCH, 0, size as u64, c);
    r.extra.push(("hugepages".into(), f64::from(u8::from(t.hugepages()))));
    rows.push(r);
    let miss_n = w.hit_stream.len().min(w.absent.len());
    let (miss_keys, miss_hashes) = (&w.absent[..miss_n], &w.absent_hashes[..miss_n]);
    let mut out = [0 as Handle; MAX_BATCH_BENCH];
    for &batch in &opts.batch_sizes {
        let batch = batch.clamp(1, MAX_BATCH_BENCH);
        // Lookup-hit: find the handle and read the first state byte (as hashbrown reads its value).
        let c = timed(&w.hit_stream, &w.hit_stream_hashes, ops, batch, |k, h| {
            if batch == 1 {
                t.lookup(&k[0], h[0]).map_or(0, |x| u64::from(t.state(x)[0]))
            } else {
                t.lookup_batch(k, h, &mut out);
                let mut s = 0;
                for &x in &out[..k.len()] {
                    if x != INVALID_HANDLE {
                        s += u64::from(t.state(x)[0]);
                    }
                }
                s
            }
        });
        rows.push(BenchRow::new(NAME, "lookup-hit", size, batch, 0, ops, c));
        let c = timed(miss_keys, miss_hashes, ops, batch, |k, h| {
            if batch == 1 {
                u64::from(t.lookup(&k[0], h[0]).is_some())
            } else {
                t.lookup_batch(k, h, &mut out) as u64
            }
        });
        rows.push(BenchRow::new(NAME, "lookup-miss", size, batch, 0, ops, c));
        // Update: lookup, then read-modify-write a 64-bit counter in the state (PNA writable parameters).
        let c = timed(&w.hit_stream, &w.hit_stream_hashes, ops, batch, |k, h| {
            let hits = if batch == 1 {
                out[0] = t.lookup(&k[0], h[0]).unwrap_or(INVALID_HANDLE);
                usize::from(out[0] != INVALID_HANDLE)
            } else {
                t.lookup_batch(k, h, &mut out)
            };
            for &x in &out[..k.len()] {
                // A miss (INVALID_HANDLE) has no state: `state_as_mut` returns None.
                if let Some(v) = t.state_as_mut::<u64>(x, 8) {
                    *v += 1;
                }
            }
            hits as u64
        });
        rows.push(BenchRow::new(NAME, "update", size, batch, 0, ops, c));
    }
    // Delete / re-insert rounds on a random subset of resident keys: inserts land in freed, scattered entries
    // of a full table (steady-state churn), unlike the fresh fill above.
    let ck: Vec<BenchKey> = w.churn.iter().map(|&i| w.resident[i as usize]).collect();
    let ch: Vec<u64> = w.churn.iter().map(|&i| w.resident_hashes[i as usize]).collect();
    let (mut del_cycles, mut del_ops) = (0u64, 0u64);
    for &batch in &opts.batch_sizes {
        let batch = batch.clamp(1, MAX_BATCH_BENCH);
        let (mut ins_cycles, mut ins_ops) = (0u64, 0u64);
        while ins_ops < ops {
            let t0 = rdtsc();
            for (k, h) in ck.iter().zip(&ch) {
                black_box(t.remove(k, *h));
            }
            del_cycles += rdtsc().wrapping_sub(t0);
            del_ops += ck.len() as u64;
            ins_cycles += fill(&mut t, &ck, &ch, batch);
            ins_ops += ck.len() as u64;
        }
        rows.push(BenchRow::new(NAME, "insert", size, batch, 0, ins_ops, ins_cycles));
    }
    rows.push(BenchRow::new(NAME, "delete", size, 1, 0, del_ops, del_cycles));
    drop(t);
    rows.extend(sweep(opts, size, &w));
    rows
}

/// PNA insertion-rate sweep: every `r`-th op is the first packet of a new flow (add-on-miss), the others hit
/// resident flows. One table with room for `size + ops` flows; each rate's new flows are removed afterwards.
fn sweep(opts: &TableBenchOptions, size: usize, w: &Workload) -> Vec<BenchRow> {
    let ops = opts.ops.max(1);
    let mut rows = Vec::new();
    let mut t = table(size + ops as usize + MAX_BATCH_BENCH, opts.state_size);
    fill(&mut t, &w.resident, &w.resident_hashes, MAX_BATCH_BENCH);
    let mut out = [0 as Handle; MAX_BATCH_BENCH];
    let mut kb = [BenchKey::default(); MAX_BATCH_BENCH];
    let mut hb = [0u64; MAX_BATCH_BENCH];
    for &batch in &opts.batch_sizes {
        let batch = batch.clamp(1, MAX_BATCH_BENCH);
        for &r in &opts.insert_rates {
            let r = r.max(1);
            let (mut next_new, mut next_hit, mut done) = (0usize, 0usize, 0u64);
            let t0 = rdtsc();
            while done < ops {
                // Build the batch the way packets arrive: keys copied into a small in-cache array.
                for j in 0..batch {
                    if (done + j as u64) % r == r - 1 {
                        kb[j] = w.absent[next_new];
                        hb[j] = w.absent_hashes[next_new];
                        next_new += 1;
                    } else {
                        kb[j] = w.hit_stream[next_hit];
                        hb[j] = w.hit_stream_hashes[next_hit];
                        next_hit = if next_hit + 1 == w.hit_stream.len() { 0 } else { next_hit + 1 };
                    }
                }
                if batch == 1 {
                    let _ = black_box(t.insert(&kb[0], hb[0], done, |s| s[0] = 1));
                } else {
                    black_box(t.lookup_or_insert_batch(&kb[..batch], &hb[..batch], done, &mut out, |_, s| s[0] = 1));
                }
                done += batch as u64;
            }
            let c = rdtsc().wrapping_sub(t0);
            rows.push(BenchRow::new(NAME, "mixed", size, batch, r, done, c));
            for (k, h) in w.absent[..next_new].iter().zip(&w.absent_hashes[..next_new]) {
                t.remove(k, *h);
            }
        }
    }
    rows
}
