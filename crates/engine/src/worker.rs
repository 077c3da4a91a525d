//! The per-core run loop: receive a batch, run the chain over it, transmit.

use std::sync::atomic::{AtomicBool, Ordering};

use flowplane_io::{Rx, Sink, Source, TxCounters};
use flowplane_nf::{NfContext, NfCounters};
use flowplane_packet::{tsc, Batch, PacketPool};

use crate::exec::{Pipeline, StoreReport};
use crate::hist::Histogram;

/// What one worker measured.
#[derive(Debug, Default)]
pub struct WorkerResult {
    /// Core index.
    pub core: usize,
    /// Packets received.
    pub packets: u64,
    /// Bytes received.
    pub bytes: u64,
    /// TSC cycles from first receive to the end of the last batch.
    pub cycles: u64,
    /// Batches processed.
    pub batches: u64,
    /// Transmit counters.
    pub tx: TxCounters,
    /// Per-NF counters, in chain order.
    pub nfs: Vec<(String, NfCounters, Option<serde_json::Value>)>,
    /// Cycles from receive to transmit completion, per batch.
    pub batch_latency: Histogram,
    /// Flow-table figures.
    pub store: StoreReport,
}

/// Runs until the source is done or `stop` is raised. Batches received
/// before `measure_from_tsc` are processed but not measured (warm-up).
#[allow(clippy::too_many_arguments)]
pub fn run_worker(
    core: usize,
    pool: &mut PacketPool,
    source: &mut dyn Source,
    exec: &mut Pipeline,
    sink: &mut dyn Sink,
    batch_size: usize,
    stop: &AtomicBool,
    measure_from_tsc: u64,
) -> WorkerResult {
    let mut batch = Batch::new(pool);
    let mut res = WorkerResult { core, ..Default::default() };
    let mut first: Option<u64> = None;
    let mut last_end = 0u64;
    loop {
        let now = tsc::rdtsc();
        let n = match source.rx_burst(pool, &mut batch, batch_size, now) {
            Rx::Packets(n) => n,
            Rx::Idle => {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                std::hint::spin_loop();
                continue;
            }
            Rx::Done => break,
        };
        if first.is_none() && now >= measure_from_tsc {
            // Warm-up over: throughput, cycles and latency count from here
            // (tables filled, caches and page tables warm). NF counters keep totals.
            first = Some(now);
            res.packets = 0;
            res.bytes = 0;
            res.batches = 0;
            res.tx = TxCounters::default();
            res.batch_latency = Histogram::default();
        }
        res.packets += n as u64;
        res.bytes += batch.lens().iter().map(|&l| l as u64).sum::<u64>();
        // The packet clock: NF actions see each packet's own time; table
        // bookkeeping (last seen, expiry) the latest time in the batch.
        let now_ns = batch.timestamps().iter().copied().max().unwrap_or(0);
        let ctx = NfContext { now_tsc: now, now_ns };
        exec.process(&mut batch, &ctx);
        let tx = sink.tx_burst(pool, &mut batch);
        res.tx.sent += tx.sent;
        res.tx.bytes += tx.bytes;
        res.tx.dropped += tx.dropped;
        res.tx.errors += tx.errors;
        res.batches += 1;
        last_end = tsc::rdtsc();
        res.batch_latency.record(last_end.saturating_sub(now));
        if stop.load(Ordering::Relaxed) {
            break;
        }
    }
    // Buffers still held (none unless a sink failed) go back to the pool.
    let _ = batch.free_all(pool);
    res.cycles = first.map_or(0, |f| last_end.saturating_sub(f));
    res.nfs = exec.nf_results();
    res.store = exec.store_report();
    res
}
