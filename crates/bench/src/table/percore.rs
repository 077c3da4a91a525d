//! Per-core `FlowTable` rows of `flowplane bench table`: lookup-hit, lookup-miss, update, add-on-miss insertion
//! (into a fresh table and after deletions), delete, and the PNA insertion-rate sweep, per size and batch size.
//! The lookup, update and insertion-rate rows of one size are measured one after the other, each in its steady
//! state ([`super::steady_rows`]), on two prefaulted tables. Every row is measured for both table layouts:
//! `flowplane` (bucketed: bucket line, then entry) and `flowplane-inline` (entries in place, issue 37).

use super::{
    steady_rows, BenchKey, BenchRow, StreamCursor, TableBenchOptions, Workload, ABSENT_SLACK, KEY_SEED, MAX_BATCH_BENCH,
};
use crate::pages::{self, PageBacking};
use crate::tsc::rdtsc;
use flowplane_table::{FlowTable, FullPolicy, Handle, Layout, TableConfig, INVALID_HANDLE};
use std::hint::black_box;

/// The row name of each layout.
pub const LAYOUT_NAMES: [(Layout, &str); 2] = [(Layout::Bucketed, "flowplane"), (Layout::Inline, "flowplane-inline")];

fn table(capacity: usize, state_size: usize, layout: Layout) -> FlowTable<BenchKey> {
    let cfg = TableConfig {
        capacity,
        state_size,
        idle_timeout_ns: None,
        full_policy: FullPolicy::Reject,
        hugepages: true,
        layout,
    };
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

/// Runs `n` operations over `keys` (cycled from `*at`) in batches of `batch`; `f` does one batch and returns a
/// checksum. Returns the TSC cycles, scaled to exactly `n` operations.
fn run_ops<F: FnMut(&[BenchKey], &[u64]) -> u64>(
    keys: &[BenchKey],
    hashes: &[u64],
    at: &mut usize,
    n: u64,
    batch: usize,
    mut f: F,
) -> u64 {
    let batch = batch.min(keys.len()).max(1);
    let mut done = 0u64;
    let mut sum = 0u64;
    let t0 = rdtsc();
    while done < n {
        if *at + batch > keys.len() {
            *at = 0;
        }
        sum = sum.wrapping_add(f(&keys[*at..*at + batch], &hashes[*at..*at + batch]));
        *at += batch;
        done += batch as u64;
    }
    let t = rdtsc().wrapping_sub(t0);
    black_box(sum);
    t * n / done.max(1)
}

/// Measures the per-core table for every size and batch size in `opts`.
pub fn run_percore(opts: &TableBenchOptions) -> Vec<BenchRow> {
    let mut rows = Vec::new();
    let mut layouts = LAYOUT_NAMES.to_vec();
    if opts.reverse {
        layouts.reverse();
    }
    for (layout, name) in layouts {
        for size in opts.ordered().0 {
            rows.extend(run_size(opts, size, layout, name));
        }
    }
    rows
}

/// The page backing of a table's memory now.
fn backing(t: &FlowTable<BenchKey>) -> PageBacking {
    pages::of_spans(&t.memory_spans())
}

/// The rows measured by [`super::steady_rows`].
#[derive(Clone, Copy, Debug)]
enum Op {
    /// Find the handle and read the first state byte (as hashbrown reads its value).
    Hit,
    Miss,
    /// Lookup, then read-modify-write a 64-bit counter in the state (PNA writable parameters).
    Update,
    /// PNA insertion-rate sweep: every `r`-th op is the first packet of a new flow (add-on-miss), the others hit
    /// resident flows. Each slice's new flows are removed after it (not timed), so every slice starts from the
    /// resident set; warm-up slices only hit (they must not use up the new keys).
    Mixed(u64),
}

/// One row of one size, with its place in the key streams and its packet clock.
struct Job {
    op: Op,
    batch: usize,
    /// Where its slices read the key streams.
    cursor: StreamCursor,
    now: u64,
}

/// The two tables of one size: `a` holds exactly the resident flows (lookups, updates), `b` has room for `ops`
/// new ones (insertion-rate sweep).
struct Tables {
    a: FlowTable<BenchKey>,
    b: FlowTable<BenchKey>,
}

/// Runs `n` operations of `job`; returns the TSC cycles.
fn run_job(job: &mut Job, t: &mut Tables, w: &Workload, n: u64, warming: bool) -> u64 {
    let mut out = [0 as Handle; MAX_BATCH_BENCH];
    let batch = job.batch;
    let (hit_at, absent_at) = job.cursor.next_slice(w);
    let mut at = if matches!(job.op, Op::Miss) { absent_at } else { hit_at };
    match job.op {
        Op::Hit => {
            let a = &t.a;
            run_ops(&w.hit_stream, &w.hit_stream_hashes, &mut at, n, batch, |k, h| {
                if batch == 1 {
                    a.lookup(&k[0], h[0]).map_or(0, |x| u64::from(a.state(x)[0]))
                } else {
                    a.lookup_batch(k, h, &mut out);
                    let mut s = 0;
                    for &x in &out[..k.len()] {
                        if x != INVALID_HANDLE {
                            s += u64::from(a.state(x)[0]);
                        }
                    }
                    s
                }
            })
        }
        Op::Miss => {
            let a = &t.a;
            run_ops(&w.absent, &w.absent_hashes, &mut at, n, batch, |k, h| {
                if batch == 1 {
                    u64::from(a.lookup(&k[0], h[0]).is_some())
                } else {
                    a.lookup_batch(k, h, &mut out) as u64
                }
            })
        }
        Op::Update => {
            let a = &mut t.a;
            run_ops(&w.hit_stream, &w.hit_stream_hashes, &mut at, n, batch, |k, h| {
                let hits = if batch == 1 {
                    out[0] = a.lookup(&k[0], h[0]).unwrap_or(INVALID_HANDLE);
                    usize::from(out[0] != INVALID_HANDLE)
                } else {
                    a.lookup_batch(k, h, &mut out)
                };
                for &x in &out[..k.len()] {
                    // A miss (INVALID_HANDLE) has no state: `state_as_mut` returns None.
                    if let Some(v) = a.state_as_mut::<u64>(x, 8) {
                        *v += 1;
                    }
                }
                hits as u64
            })
        }
        Op::Mixed(r) => {
            let b = &mut t.b;
            let mut kb = [BenchKey::default(); MAX_BATCH_BENCH];
            let mut hb = [0u64; MAX_BATCH_BENCH];
            let (first_new, mut k) = (absent_at, 0u64);
            let mut next_new = first_new;
            let t0 = rdtsc();
            while k < n {
                // Build the batch the way packets arrive: keys copied into a small in-cache array.
                for j in 0..batch {
                    if !warming && (k + j as u64) % r == r - 1 {
                        kb[j] = w.absent[next_new];
                        hb[j] = w.absent_hashes[next_new];
                        next_new += 1;
                    } else {
                        kb[j] = w.hit_stream[at];
                        hb[j] = w.hit_stream_hashes[at];
                        at = if at + 1 == w.hit_stream.len() { 0 } else { at + 1 };
                    }
                }
                let now = job.now + k;
                if batch == 1 {
                    let _ = black_box(b.insert(&kb[0], hb[0], now, |s| s[0] = 1));
                } else {
                    black_box(b.lookup_or_insert_batch(&kb[..batch], &hb[..batch], now, &mut out, |_, s| s[0] = 1));
                }
                k += batch as u64;
            }
            let c = rdtsc().wrapping_sub(t0);
            job.now += k;
            for (key, h) in w.absent[first_new..next_new].iter().zip(&w.absent_hashes[first_new..next_new]) {
                b.remove(key, *h);
            }
            c * n / k.max(1)
        }
    }
}

fn run_size(opts: &TableBenchOptions, size: usize, layout: Layout, name: &'static str) -> Vec<BenchRow> {
    let ops = opts.ops.max(1);
    let (_, batches, rates) = opts.ordered();
    let w = Workload::for_rows(size, ops, KEY_SEED, batches.len() * (3 + rates.len()));
    let mut rows = Vec::new();
    let mut a = table(size, opts.state_size, layout);
    let c = fill(&mut a, &w.resident, &w.resident_hashes, MAX_BATCH_BENCH);
    // The fill's own page faults stay in its figure (as hashbrown's do); every later row finds the tables fully
    // backed, their hugepages assembled now rather than whenever khugepaged gets to them.
    let fresh = backing(&a);
    a.prefault();
    let mut r = BenchRow::new(name, "insert-fresh", size, MAX_BATCH_BENCH, 0, size as u64, c).with_pages(fresh);
    r.extra.push(("hugepages".into(), f64::from(u8::from(a.hugepages()))));
    rows.push(r);
    // A per-slice insertion at rate 1 adds up to a slice of new flows (plus a batch).
    let mut b = table(size + (ops / super::SLICES) as usize + ABSENT_SLACK, opts.state_size, layout);
    fill(&mut b, &w.resident, &w.resident_hashes, MAX_BATCH_BENCH);
    b.prefault();
    let mut t = Tables { a, b };
    if opts.reverse {
        rows.extend(churn(&mut t.a, opts, size, &w, &batches, name));
    }
    let mut jobs: Vec<Job> = Vec::new();
    for &batch in &batches {
        let batch = batch.clamp(1, MAX_BATCH_BENCH);
        for op in [Op::Hit, Op::Miss, Op::Update].into_iter().chain(rates.iter().map(|&r| Op::Mixed(r.max(1)))) {
            jobs.push(Job { op, batch, cursor: StreamCursor::new(jobs.len()), now: 0 });
        }
    }
    if opts.reverse {
        jobs.reverse();
    }
    let results = steady_rows(ops, jobs.len(), |i, n, warming| run_job(&mut jobs[i], &mut t, &w, n, warming));
    let (pa, pb) = (backing(&t.a), backing(&t.b));
    for (j, s) in jobs.iter().zip(&results) {
        let row = match j.op {
            Op::Hit => BenchRow::steady(name, "lookup-hit", size, j.batch, 0, s).with_pages(pa),
            Op::Miss => BenchRow::steady(name, "lookup-miss", size, j.batch, 0, s).with_pages(pa),
            Op::Update => BenchRow::steady(name, "update", size, j.batch, 0, s).with_pages(pa),
            Op::Mixed(r) => BenchRow::steady(name, "mixed", size, j.batch, r, s).with_pages(pb),
        };
        rows.push(row);
    }
    drop(t.b);
    if !opts.reverse {
        rows.extend(churn(&mut t.a, opts, size, &w, &batches, name));
    }
    rows
}

/// Delete / re-insert rounds on a random subset of resident keys: inserts land in freed, scattered entries of a
/// full table (steady-state churn), unlike the fresh fill.
fn churn(
    t: &mut FlowTable<BenchKey>,
    opts: &TableBenchOptions,
    size: usize,
    w: &Workload,
    batches: &[usize],
    name: &'static str,
) -> Vec<BenchRow> {
    let ops = opts.ops.max(1);
    let pages = backing(t);
    let mut rows = Vec::new();
    let ck: Vec<BenchKey> = w.churn.iter().map(|&i| w.resident[i as usize]).collect();
    let ch: Vec<u64> = w.churn.iter().map(|&i| w.resident_hashes[i as usize]).collect();
    let (mut del_cycles, mut del_ops) = (0u64, 0u64);
    for &batch in batches {
        let batch = batch.clamp(1, MAX_BATCH_BENCH);
        let (mut ins_cycles, mut ins_ops) = (0u64, 0u64);
        while ins_ops < ops {
            let t0 = rdtsc();
            for (k, h) in ck.iter().zip(&ch) {
                black_box(t.remove(k, *h));
            }
            del_cycles += rdtsc().wrapping_sub(t0);
            del_ops += ck.len() as u64;
            ins_cycles += fill(t, &ck, &ch, batch);
            ins_ops += ck.len() as u64;
        }
        rows.push(BenchRow::new(name, "insert", size, batch, 0, ins_ops, ins_cycles).with_pages(pages));
    }
    rows.push(BenchRow::new(name, "delete", size, 1, 0, del_ops, del_cycles).with_pages(pages));
    rows
}
