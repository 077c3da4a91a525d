//! What a live run on real ports shows while it goes on: [`Live`] holds the
//! input and output ports (their per-queue counters are atomics the workers
//! write once per burst) and each core's snapshot (packets, busy cycles,
//! tables, NF counters and each NF's own report, latency), which the workers
//! publish about twice a second at a batch boundary ([`crate::runtime`] runs
//! them); a status line and a metrics scrape read it. Also here: the sink that sends a worker's
//! packets on the output ports by verdict, and how a live run steers
//! packets to its workers ([`Steer`], reported).
//!
//! The run itself goes through the one runtime a replay uses
//! ([`crate::runner::run_port`]); its control loop polls each port's
//! [`flowplane_io::port::LinkWatch`] every 200 ms (off the packet path): a
//! link that goes down or up, an interface that vanishes or is re-created is
//! reported at once on stderr (the queues re-attach to a re-created one
//! themselves); a queue that cannot re-attach stops the run with that error.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use flowplane_io::dispatch::DispatchStats;
use flowplane_io::port::{Port, PortSink};
use flowplane_io::TxCounters;
use flowplane_nf::NfCounters;
use flowplane_packet::tsc;

use crate::error::EngineError;
use crate::exec::StoreReport;
use crate::hist::Histogram;
use crate::worker::Worker;

/// One core's figures at its last publication.
#[derive(Clone, Default)]
pub struct CoreSnap {
    /// Packets received (after warm-up).
    pub packets: u64,
    /// Batches processed (after warm-up).
    pub batches: u64,
    /// Transmit counters.
    pub tx: TxCounters,
    /// TSC cycles spent on batches.
    pub busy_cycles: u64,
    /// TSC cycles from the first packet to the end of the last batch (the report's per-core span).
    pub cycles: u64,
    /// TSC reading at publication.
    pub at_tsc: u64,
    /// Flow-table figures.
    pub store: StoreReport,
    /// Per-NF counters in chain order.
    pub nfs: Vec<(String, NfCounters)>,
    /// Per NF (chain order), its own report on this core (`report()`; the
    /// metrics export its numeric fields).
    pub nf_details: Vec<Option<serde_json::Value>>,
    /// Receive-to-transmit cycles per batch.
    pub latency: Option<Histogram>,
    /// Per NF of the root segment, its cost while a profile runs (`ctl profile start`).
    pub profile: Option<Vec<crate::tap::StageCost>>,
}

/// What a running data plane shows and takes requests on: its ports (a
/// live run) and cores. A replay served on `--ctl`/`--metrics` has no
/// input port (its input is the trace) and writes pcap files, not ports.
pub struct Live {
    /// The input port (None: a served replay).
    pub input: Option<Arc<dyn Port>>,
    /// What feeds the workers, as `show runtime` and the status line name it.
    pub source: String,
    /// Output ports by verdict.
    pub outputs: Vec<Arc<dyn Port>>,
    /// Per core, the last snapshot.
    pub cores: Vec<Mutex<CoreSnap>>,
    /// Packets whose verdict named no output port.
    pub no_port: Arc<AtomicU64>,
    /// TSC ticks per second.
    pub hz: f64,
    /// The dispatcher's figures while one runs ([`Steer::Dispatcher`]).
    pub dispatch: Mutex<Option<Arc<DispatchStats>>>,
    /// Every worker is built and polls (tables prefaulted, queues open): the data plane is up.
    pub ready: AtomicBool,
    /// Requests to the workers (`flowplane ctl`), served between batches.
    pub ctl: crate::control::Mailboxes,
    /// `--replicate`: the replication thread's live counters.
    pub repl: Mutex<Option<Arc<crate::repl::ReplStats>>>,
}

impl Live {
    /// A view over `input` and `outputs` for `cores` workers.
    pub fn new(input: Arc<dyn Port>, outputs: Vec<Arc<dyn Port>>, cores: usize) -> Live {
        Live { input: Some(Arc::clone(&input)), outputs, ..Live::for_replay(input.name(), cores) }
    }

    /// A replay served while it runs: `workers` logical workers fed by `source` (a trace), no ports.
    pub fn for_replay(source: String, workers: usize) -> Live {
        Live {
            input: None,
            source,
            outputs: Vec::new(),
            cores: (0..workers).map(|_| Mutex::new(CoreSnap::default())).collect(),
            no_port: Arc::new(AtomicU64::new(0)),
            hz: tsc::hz(),
            dispatch: Mutex::new(None),
            ready: AtomicBool::new(false),
            ctl: crate::control::Mailboxes::new(workers),
            repl: Mutex::new(None),
        }
    }

    /// The input port (if any), then the outputs.
    pub fn ports(&self) -> impl Iterator<Item = &Arc<dyn Port>> {
        self.input.iter().chain(self.outputs.iter())
    }

    /// Every core's last snapshot.
    pub fn snapshots(&self) -> Vec<CoreSnap> {
        self.cores.iter().map(|c| c.lock().map(|s| s.clone()).unwrap_or_default()).collect()
    }
}

/// A sink that sends worker `w`'s packets on `ports` by verdict.
pub fn port_sink(ports: &[Arc<dyn Port>], w: usize, no_port: Option<Arc<AtomicU64>>) -> Result<PortSink, EngineError> {
    let mut tx = Vec::with_capacity(ports.len());
    let mut counters = Vec::with_capacity(ports.len());
    for p in ports {
        let q = w % p.queues().max(1);
        tx.push(p.open_tx(q).map_err(|e| EngineError::Config(e.to_string()))?);
        counters.push(Arc::clone(&p.counters()[q]));
    }
    Ok(PortSink::new(tx, counters, no_port.unwrap_or_default()))
}

/// How a live run steers packets to its workers (chosen by [`crate::runner::run_port`], reported).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Steer {
    /// The port's own spreading: worker i polls input queue i (the kernel's fanout hash, the device's RSS).
    Port,
    /// A dispatcher core polls every input queue and steers by the run's table ([`flowplane_io::dispatch`]).
    Dispatcher,
    /// The kernel steers by the run's table: an AF_PACKET input's fanout group runs flowplane's
    /// classifier as a program ([`flowplane_io::port::fanout_steer`]); worker i polls queue i.
    /// Moves (RSS++, Dyssect) follow [`flowplane_io::steered`]'s protocol.
    Kernel,
}

impl Steer {
    /// As the report names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Steer::Port => "port",
            Steer::Dispatcher => "dispatcher",
            Steer::Kernel => "kernel",
        }
    }
}

/// The report's account of a live run's steering.
pub(crate) fn steer_report(
    steer: Steer,
    strategy: &str,
    notes: &[String],
    d: Option<&DispatchStats>,
    hz: f64,
) -> crate::report::SteerReport {
    let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let packets = d.map_or(0, |d| l(&d.packets));
    let busy = d.map_or(0, |d| l(&d.busy_cycles));
    crate::report::SteerReport {
        by: steer.as_str().to_string(),
        strategy: strategy.to_string(),
        notes: notes.to_vec(),
        dispatched: packets,
        dispatch_cycles_per_packet: if packets > 0 { busy as f64 / packets as f64 } else { 0.0 },
        dispatch_busy_s: busy as f64 / hz,
        dispatch_ring_full: d.map_or(0, |d| d.ring_full.iter().map(l).sum()),
        unclassified: d.map_or(0, |d| l(&d.unclassified)),
        oversize: d.map_or(0, |d| l(&d.oversize)),
        ..Default::default()
    }
}

/// Publishes worker `wk`'s figures (a lock and a few small allocations, twice a second, between
/// batches). Each NF's `report()` is built here too: an NF with a large report (upf's usage per
/// URR) costs its worker that much every half second.
pub(crate) fn publish(cell: &Mutex<CoreSnap>, wk: &Worker<'_>, now: u64) {
    let r = wk.result();
    let p = wk.pipeline();
    let (nfs, nf_details) = p.nf_results().into_iter().map(|(n, c, d)| ((n, c), d)).unzip();
    let snap = CoreSnap {
        packets: r.packets,
        batches: r.batches,
        tx: r.tx,
        busy_cycles: r.busy_cycles,
        cycles: wk.span_cycles(),
        at_tsc: now,
        store: wk.store_report(),
        nfs,
        nf_details,
        latency: Some(r.batch_latency.clone()),
        profile: p.profile(),
    };
    if let Ok(mut c) = cell.lock() {
        *c = snap;
    }
}
