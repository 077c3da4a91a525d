//! Shared-table rows of `flowplane bench table` (`flowplane-shared`): the lock-free
//! `SharedFlowTable` on 1 and 2 cores, lookup-hit and the PNA insertion-rate sweep
//! (every `r`-th op is an add-on-miss insertion of a new key), with the 2-core/1-core
//! scaling ratio and reader-starvation figures.
//!
//! This module owns the multi-core measurement: one table per size shared by all
//! threads (`&SharedFlowTable` from several cores), threads pinned to distinct CPUs
//! and released together by a barrier, aggregate Mops = all threads' ops / the
//! slowest thread's time. Every thread looks up the *same* resident keys (random
//! order, different offsets) and inserts its own new keys.
//!
//! To keep the table's size and memory constant however many ops run, each thread
//! removes the key it inserted [`CHURN_WINDOW`] insertions earlier; that removal is
//! timed but not counted as an op (so the figures are conservative).
//!
//! Extras per row: `scaling_vs_1core` (this row / the 1-core row of the same
//! configuration), `slowest_vs_fastest` (min/max per-thread ops/s: 1 = no thread is
//! starved), `p999_batch_ns` and `max_batch_ns` (per-call latency, all threads),
//! `cpu_share` (least CPU time / wall time of any thread: below 1 when other processes
//! took the cores), `mops_per_cpu` (sum over threads of ops per second of CPU actually
//! received) and `scaling_cpu_vs_1core` (the same ratio on that basis, robust to a
//! machine shared with other jobs).

use super::{thread_cpu_ns, BenchKey, BenchRow, TableBenchOptions, Workload, KEY_SEED, MAX_BATCH_BENCH};
use crate::pages::{self, PageBacking};
use crate::tsc::{cycles_to_ns, rdtsc};
use flowplane_table::shared::{SharedFlowTable, SharedHandle, SharedKey, SharedTableConfig};
use std::hint::black_box;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Barrier};

const NAME: &str = "flowplane-shared";
/// New keys a thread keeps resident before removing its oldest one.
pub const CHURN_WINDOW: usize = 4096;
/// Largest table measured (the 16M-entry size would need ~2 GiB and minutes to build per core count).
const MAX_SHARED_SIZE: usize = 1 << 22;

/// The benchmark key as a shared-table key (a local newtype: the trait and `BenchKey` live in other modules).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct SKey(BenchKey);

impl SharedKey for SKey {
    fn to_words(&self) -> [u64; 2] {
        [self.0.addrs, self.0.rest]
    }
    fn from_words(w: [u64; 2]) -> Self {
        SKey(BenchKey { addrs: w[0], rest: w[1] })
    }
}

/// What one measurement does per operation.
#[derive(Clone, Copy)]
enum Mode {
    /// Lookup of resident keys, then a read of the first state word.
    LookupHit,
    /// Add-on-miss where every `r`-th key is new.
    Mixed(u64),
}

/// Result of one thread.
struct ThreadResult {
    ops: u64,
    cycles: u64,
    /// CPU time the thread actually got (ns) and the wall time it took (ns).
    cpu_ns: u64,
    wall_ns: u64,
    /// Per-call latencies (cycles), one per batch.
    lat: Vec<u32>,
}

/// Pins the calling thread to CPU `cpu` (best effort: returns false if refused).
fn pin_to(cpu: usize) -> bool {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `cpu_set_t` is plain data (zeroed = empty set); CPU_SET writes inside it
        // (cpu is reduced modulo CPU_SETSIZE), and sched_setaffinity only reads it.
        unsafe {
            let mut set: libc::cpu_set_t = core::mem::zeroed();
            libc::CPU_SET(cpu % libc::CPU_SETSIZE as usize, &mut set);
            libc::sched_setaffinity(0, core::mem::size_of::<libc::cpu_set_t>(), &set) == 0
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = cpu;
        false
    }
}

/// The table, filled with the resident keys, and the page backing of its entries' mapping.
fn build(size: usize, cores: usize, state_words: usize, w: &Workload) -> (Arc<SharedFlowTable<SKey>>, PageBacking) {
    let cfg = SharedTableConfig {
        capacity: size + cores * (CHURN_WINDOW + MAX_BATCH_BENCH) + MAX_BATCH_BENCH,
        state_words,
        idle_timeout_ns: 0,
    };
    let t = match SharedFlowTable::new(cfg) {
        Ok(t) => t,
        // Sizes come from the options; an invalid one is a programming error of the caller.
        Err(e) => panic!("cannot create a {size}-entry shared table: {e}"),
    };
    let mut out = [SharedHandle::NONE; MAX_BATCH_BENCH];
    let resident: Vec<SKey> = w.resident.iter().map(|k| SKey(*k)).collect();
    let mut state_addr = 0usize;
    for (k, h) in resident.chunks(MAX_BATCH_BENCH).zip(w.resident_hashes.chunks(MAX_BATCH_BENCH)) {
        t.lookup_or_insert_batch(k, h, 0, &mut out, |_, s| {
            s[0].store(1, Relaxed);
            state_addr = s.as_ptr() as usize;
        });
    }
    let pages = if state_addr == 0 { PageBacking::default() } else { pages::of_addr(state_addr) };
    (Arc::new(t), pages)
}

/// One thread's measurement loop.
fn worker(
    t: &SharedFlowTable<SKey>,
    w: &Workload,
    tid: usize,
    cores: usize,
    mode: Mode,
    batch: usize,
    ops: u64,
) -> ThreadResult {
    let hit_n = w.hit_stream.len();
    let mut next_hit = (tid * hit_n / cores.max(1)) % hit_n.max(1);
    let mut next_new = tid;
    let mut kb = [SKey::default(); MAX_BATCH_BENCH];
    let mut hb = [0u64; MAX_BATCH_BENCH];
    let mut out = [SharedHandle::NONE; MAX_BATCH_BENCH];
    // Ring of this thread's resident new keys (indices into `w.absent`).
    let mut ring = vec![0usize; CHURN_WINDOW];
    let (mut ring_head, mut ring_len) = (0usize, 0usize);
    let mut lat = Vec::with_capacity((ops as usize).div_ceil(batch) + 1);
    let mut sum = 0u64;
    let mut done = 0u64;
    let cpu0 = thread_cpu_ns();
    let wall0 = std::time::Instant::now();
    let t0 = rdtsc();
    while done < ops {
        let mut new_in_batch = 0usize;
        let mut new_idx = [0usize; MAX_BATCH_BENCH];
        for j in 0..batch {
            let is_new = matches!(mode, Mode::Mixed(r) if (done + j as u64) % r == r - 1) && next_new < w.absent.len();
            if is_new {
                kb[j] = SKey(w.absent[next_new]);
                hb[j] = w.absent_hashes[next_new];
                new_idx[new_in_batch] = next_new;
                new_in_batch += 1;
                next_new += cores;
            } else {
                kb[j] = SKey(w.hit_stream[next_hit]);
                hb[j] = w.hit_stream_hashes[next_hit];
                next_hit = if next_hit + 1 == hit_n { 0 } else { next_hit + 1 };
            }
        }
        let c0 = rdtsc();
        match mode {
            Mode::LookupHit => {
                if batch == 1 {
                    let h = t.lookup(&kb[0], hb[0]);
                    sum += t.state(h).map_or(0, |s| s[0].load(Relaxed));
                } else {
                    t.lookup_batch(&kb[..batch], &hb[..batch], &mut out[..batch]);
                    for h in &out[..batch] {
                        sum += t.state(*h).map_or(0, |s| s[0].load(Relaxed));
                    }
                }
            }
            Mode::Mixed(_) => {
                if batch == 1 {
                    black_box(t.lookup_or_insert(&kb[0], hb[0], done, |_, s| s[0].store(1, Relaxed)));
                } else {
                    black_box(t.lookup_or_insert_batch(&kb[..batch], &hb[..batch], done, &mut out[..batch], |_, s| {
                        s[0].store(1, Relaxed)
                    }));
                }
                // Steady state: retire the key inserted CHURN_WINDOW insertions ago.
                for &ni in &new_idx[..new_in_batch] {
                    if ring_len == CHURN_WINDOW {
                        let old = ring[ring_head];
                        t.remove(&SKey(w.absent[old]), w.absent_hashes[old]);
                        ring[ring_head] = ni;
                        ring_head = (ring_head + 1) % CHURN_WINDOW;
                    } else {
                        ring[(ring_head + ring_len) % CHURN_WINDOW] = ni;
                        ring_len += 1;
                    }
                }
            }
        }
        lat.push(rdtsc().wrapping_sub(c0).min(u64::from(u32::MAX)) as u32);
        done += batch as u64;
    }
    let cycles = rdtsc().wrapping_sub(t0);
    let wall_ns = wall0.elapsed().as_nanos() as u64;
    let cpu_ns = thread_cpu_ns().saturating_sub(cpu0);
    black_box(sum);
    // Leave the table as it was: only resident keys.
    for k in 0..ring_len {
        let i = ring[(ring_head + k) % CHURN_WINDOW];
        t.remove(&SKey(w.absent[i]), w.absent_hashes[i]);
    }
    ThreadResult { ops: done, cycles, cpu_ns, wall_ns, lat }
}

/// Runs one configuration on `cores` pinned threads; returns the row.
fn measure(
    t: &Arc<SharedFlowTable<SKey>>,
    w: &Arc<Workload>,
    size: usize,
    cores: usize,
    mode: Mode,
    batch: usize,
    ops: u64,
) -> BenchRow {
    let ncpu = std::thread::available_parallelism().map_or(1, |n| n.get());
    let barrier = Arc::new(Barrier::new(cores));
    let handles: Vec<_> = (0..cores)
        .map(|tid| {
            let (t, w, barrier) = (t.clone(), w.clone(), barrier.clone());
            std::thread::spawn(move || {
                let pinned = pin_to(tid % ncpu);
                barrier.wait();
                (worker(&t, &w, tid, cores, mode, batch, ops), pinned)
            })
        })
        .collect();
    let mut results = Vec::with_capacity(cores);
    let mut all_pinned = true;
    for h in handles {
        match h.join() {
            Ok((r, p)) => {
                all_pinned &= p;
                results.push(r);
            }
            // A worker panicking is a bug in the table; surface it to the caller.
            Err(e) => std::panic::resume_unwind(e),
        }
    }
    let total_ops: u64 = results.iter().map(|r| r.ops).sum();
    let max_cycles = results.iter().map(|r| r.cycles).max().unwrap_or(0).max(1);
    let (op, every) = match mode {
        Mode::LookupHit => ("lookup-hit", 0),
        Mode::Mixed(r) => ("mixed", r),
    };
    let mut row = BenchRow::new(NAME, op, size, batch, every, total_ops, max_cycles);
    row.cores = cores;
    row.cycles_per_op = max_cycles as f64 * cores as f64 / total_ops.max(1) as f64;
    let rate = |r: &ThreadResult| r.ops as f64 / r.cycles.max(1) as f64;
    let fastest = results.iter().map(rate).fold(0.0, f64::max);
    let slowest = results.iter().map(rate).fold(f64::INFINITY, f64::min);
    let mut lat: Vec<u32> = results.iter().flat_map(|r| r.lat.iter().copied()).collect();
    lat.sort_unstable();
    let pct = |p: f64| lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1))).copied();
    row.extra.push(("slowest_vs_fastest".into(), if fastest > 0.0 { slowest / fastest } else { 0.0 }));
    row.extra.push(("p999_batch_ns".into(), cycles_to_ns(u64::from(pct(0.999).unwrap_or(0)))));
    row.extra.push(("max_batch_ns".into(), cycles_to_ns(u64::from(lat.last().copied().unwrap_or(0)))));
    row.extra.push(("pinned".into(), f64::from(u8::from(all_pinned))));
    // On a shared machine other processes steal cores: report how much CPU the threads got,
    // and the aggregate rate each thread reached per second of CPU it actually ran.
    let share = results.iter().map(|r| r.cpu_ns as f64 / r.wall_ns.max(1) as f64).fold(f64::INFINITY, f64::min);
    row.extra.push(("cpu_share".into(), share.min(1.0)));
    let per_cpu: f64 = results.iter().map(|r| r.ops as f64 * 1e3 / r.cpu_ns.max(1) as f64).sum();
    row.extra.push(("mops_per_cpu".into(), per_cpu));
    row
}

fn extra(row: &BenchRow, name: &str) -> f64 {
    row.extra.iter().find(|(n, _)| n == name).map_or(0.0, |(_, v)| *v)
}

/// Measures the shared table for every size (up to 4M), batch size, insertion rate and
/// core count in `opts`; adds `scaling_vs_1core` to multi-core rows.
pub fn run_shared(opts: &TableBenchOptions) -> Vec<BenchRow> {
    let ops = opts.ops.max(1);
    let state_words = opts.state_size.div_ceil(8).max(1);
    let max_cores = opts.cores.iter().copied().max().unwrap_or(1).max(1);
    let mut rows: Vec<BenchRow> = Vec::new();
    let (sizes, batches, rates) = opts.ordered();
    for size in sizes.into_iter().filter(|&s| s > 0 && s <= MAX_SHARED_SIZE) {
        // Enough new keys for every thread of the largest core count at rate 1.
        let w = Arc::new(Workload::new(size, ops * max_cores as u64, KEY_SEED));
        let (t, pages) = build(size, max_cores, state_words, &w);
        let mut modes = vec![Mode::LookupHit];
        modes.extend(rates.iter().map(|&r| Mode::Mixed(r.max(1))));
        if opts.reverse {
            modes.reverse();
        }
        for &batch in &batches {
            let batch = batch.clamp(1, MAX_BATCH_BENCH);
            for &mode in &modes {
                let mut base: Option<(f64, f64)> = None;
                for &cores in &opts.cores {
                    let cores = cores.max(1);
                    let mut row = measure(&t, &w, size, cores, mode, batch, ops).with_pages(pages);
                    let per_cpu = extra(&row, "mops_per_cpu");
                    if cores == 1 {
                        base = Some((row.mops, per_cpu));
                    } else if let Some((b, bc)) = base.filter(|b| b.0 > 0.0 && b.1 > 0.0) {
                        row.extra.insert(0, ("scaling_cpu_vs_1core".into(), per_cpu / bc));
                        row.extra.insert(0, ("scaling_vs_1core".into(), row.mops / b));
                    }
                    rows.push(row);
                }
            }
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_run_produces_scaling_rows() {
        let opts = TableBenchOptions {
            sizes: vec![1 << 10],
            batch_sizes: vec![1, 32],
            insert_rates: vec![1, 10],
            state_size: 16,
            ops: 20_000,
            cores: vec![1, 2],
            quick: true,
            reverse: false,
        };
        let rows = run_shared(&opts);
        // (lookup-hit + 2 rates) x 2 batch sizes x 2 core counts.
        assert_eq!(rows.len(), 12);
        for r in &rows {
            assert!(r.mops > 0.0, "{r:?}");
            assert_eq!(r.impl_name, NAME);
        }
        let two = rows.iter().filter(|r| r.cores == 2);
        for r in two {
            assert!(r.extra.iter().any(|(n, v)| n == "scaling_vs_1core" && *v > 0.0), "{r:?}");
            assert!(r.extra.iter().any(|(n, v)| n == "slowest_vs_fastest" && *v > 0.0 && *v <= 1.0));
        }
    }

    #[test]
    fn bench_key_round_trips() {
        let k = BenchKey::new(1, 2, 3, 4, 6);
        assert_eq!(SKey::from_words(SKey(k).to_words()), SKey(k));
    }
}
