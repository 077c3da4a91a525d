//! Every NF of the library, in one of eight chains (5-tuple, firewalling/NAT, coarse state in
//! shared tables, synthetic, field-set keys, stateless, a tiny NAT pool, mixed), under every
//! registered executor, on arbitrary and synthesised frames, batch after batch with the clock
//! jumping so that state expires; with a flow table of 1024 or of 64 flows (full-table
//! rejects or LRU evictions), on one core or on two threads sharing the coarse tables. Checks:
//! no panic, every batch keeps its packets, each NF forwards or drops what it was given, each
//! NF is given what the one before forwarded, the chain's output is what left the batches
//! undropped, and the tables' counters add up.
//!
//! Input layout: byte 0 picks the executor (bits 0-1), the chain (bits 2-4), NF prefetch hooks
//! off (bit 5), the auxiliary table off (bit 6) and prefetch off (bit 7); byte 1 the tiny table
//! (bit 0), the evict policy (bit 1), two cores (bit 2) and the default idle timeout (bits 3-4:
//! 1, 5, 30 or 300 s); then records as `flowplane_fuzz::for_each_record` reads them (raw or
//! synthesised frames; the gap byte advances the clock, picks the core and closes the batch;
//! a batch also closes every 32 frames; at most 2048 frames). `FLOWPLANE_FUZZ_VERBOSE=1` prints
//! each core's figures when reproducing an input.

use crate::for_each_record;
use flowplane_engine::chain::Chain;
use flowplane_engine::coarse::SharedStores;
use flowplane_engine::exec::{ExecConfig, ExecKind, Pipeline, StateLayout, StoreReport};
use flowplane_engine::spec::{self, ChainSpec};
use flowplane_engine::EngineError;
use flowplane_nf::{NfContext, NfCounters};
use flowplane_packet::{Batch, PacketPool, PoolConfig};
use flowplane_table::FullPolicy;

const CHAINS: [&str; 8] = [
    "lb(backends=8) -> fsc -> ratelimit(pps=50) -> hh(k=4) -> count",
    "acl(rule=drop:udp:any:any:any:53;allow:tcp:10.0.0.0/8) -> nat(ports=1024-1279) -> fw(allow_new=any, conns=256) -> forward(port=1)",
    "srcctr -> policer(rate=20k) -> psd(ports=4, window=5) -> ddos(threshold=20) -> portknock -> lb",
    "synthetic(k=3, mem=4096) -> fsc",
    "keyctr(key=dst_ip) -> fw(conns=128) -> keyctr(key=sport+dport+proto) -> keyctr(key=teid) -> count",
    "count -> forward(port=2) -> count",
    "nat(ports=2000-2031, timeout=5) -> fsc -> forward",
    "fsc -> srcctr -> acl(rule=drop:tcp:any:any:any:22, default=allow) -> keyctr(key=ip_pair) -> hh(k=2)",
];

/// Most frames per batch before it closes on its own.
const BATCH: usize = 32;

/// Most frames per input (bursts of synthesised frames could make more), to keep runs short.
const MAX_FRAMES: usize = 2048;

/// One frame's place in the arena, its timestamp, its core and whether it closes its batch.
struct Rec {
    at: usize,
    len: usize,
    now_ns: u64,
    core: usize,
    flush: bool,
}

/// What one core saw and ended with.
struct CoreRun {
    results: Vec<(String, NfCounters, Option<serde_json::Value>)>,
    report: StoreReport,
    packets: u64,
    live: u64,
}

/// Runs one input (see the module doc); panics where a check fails.
pub fn run(data: &[u8]) {
    let Some(([pick, mode], body)) = data.split_first_chunk::<2>() else { return };
    let kinds: Vec<ExecKind> = ExecKind::all().collect();
    let kind = kinds[usize::from(pick & 3) % kinds.len()];
    let text = CHAINS[usize::from(pick >> 2 & 7)];
    let spec = spec::parse(text).expect("chain parses");
    let cfg = ExecConfig {
        kind,
        prefetch: pick & 0x80 == 0,
        aux: pick & 0x40 == 0,
        prefetch_hooks: pick & 0x20 == 0,
        flows: if mode & 1 != 0 { 64 } else { 1024 },
        full_policy: if mode & 2 != 0 { FullPolicy::EvictLruIdle } else { FullPolicy::Reject },
        default_idle_timeout_ns: [1, 5, 30, 300][usize::from(mode >> 3 & 3)] * 1_000_000_000,
        hugepages: false,
        packing: mode & 0x20 == 0,
        // `batch` only: other executors refuse per-NF matching.
        match_sharing: kind != ExecKind::BATCH || mode & 0x40 == 0,
        // A fixed secret: an input replays the same table placement.
        hash_seed: 0x9e37_79b9,
        // Both flow-table layouts (issue 37): the compiler's choice, or bucketed throughout.
        inline_entries: mode & 0x80 == 0,
    };
    let cores = if mode & 4 != 0 { 2 } else { 1 };

    let mut arena = Vec::new();
    let mut recs = Vec::new();
    let mut now_ns: u64 = 1_000;
    for_each_record(body, MAX_FRAMES, |frame, gap| {
        recs.push(Rec {
            at: arena.len(),
            len: frame.len(),
            now_ns,
            core: if cores == 2 { gap.core() } else { 0 },
            flush: gap.flush(),
        });
        arena.extend_from_slice(frame);
        now_ns += gap.seconds() * 1_000_000_000;
    });

    let chains: Vec<Chain> = (0..cores).map(|_| Chain::build(&spec).expect("chain builds")).collect();
    let shared = SharedStores::new(&chains[0].groups, cfg.flows, cfg.default_idle_timeout_ns).expect("shared tables");
    let runs: Vec<Option<CoreRun>> = if cores == 1 {
        chains.into_iter().map(|c| run_core(c, cfg, shared.clone(), &recs, &arena, 0)).collect()
    } else {
        std::thread::scope(|s| {
            let handles: Vec<_> = chains
                .into_iter()
                .enumerate()
                .map(|(core, c)| {
                    let (shared, recs, arena) = (shared.clone(), &recs, &arena);
                    s.spawn(move || run_core(c, cfg, shared, recs, arena, core))
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("core panicked")).collect()
        })
    };
    let verbose = std::env::var_os("FLOWPLANE_FUZZ_VERBOSE").is_some();
    for run in runs.iter().flatten() {
        if verbose {
            eprintln!("{} on {kind}, {cfg:?}: {} packets, {} forwarded, {:?}", text, run.packets, run.live, run.report);
        }
        check(&spec, &cfg, run);
    }
    // Without the auxiliary table every pin on shared state lasts one batch or one packet.
    let pins_outlive_batches = cfg.aux && kind.info().layout == StateLayout::Aggregated;
    for t in &shared.tables {
        assert!(t.len() <= t.capacity(), "shared table over capacity: {} > {}", t.len(), t.capacity());
        if !pins_outlive_batches && runs.iter().all(Option::is_some) {
            t.for_each(|h, _, _| assert_eq!(t.refcount(h), Some(0), "a pin on shared state leaked"));
        }
    }
}

/// Runs core `core`'s records through a pipeline of `chain`. `None` when the pipeline refuses
/// the settings, which only the evict policy may cause (NFs with release callbacks, auxiliary
/// pins on shared state).
fn run_core(
    chain: Chain,
    cfg: ExecConfig,
    shared: SharedStores,
    recs: &[Rec],
    arena: &[u8],
    core: usize,
) -> Option<CoreRun> {
    let mut pipe = match Pipeline::new(chain, cfg, shared) {
        Ok(p) => p,
        Err(EngineError::Unsupported(msg)) if cfg.full_policy == FullPolicy::EvictLruIdle => {
            assert!(msg.contains("evict"), "{msg}");
            return None;
        }
        Err(e) => panic!("pipeline: {e}"),
    };
    let mut pool =
        PacketPool::new(PoolConfig { buffers: 2 * BATCH, buf_size: 512, ..PoolConfig::default() }).expect("pool");
    let mut batch = Batch::new(&pool);
    let (mut packets, mut live) = (0u64, 0u64);
    let mut flush = |batch: &mut Batch, pool: &mut PacketPool, now_ns: u64| {
        let n = batch.len();
        if n == 0 {
            return;
        }
        pipe.process(batch, &NfContext { now_tsc: now_ns.wrapping_mul(3), now_ns });
        assert_eq!(batch.len(), n, "the executor must keep the batch whole");
        live += (0..n).filter(|&i| !batch.is_dropped(i)).count() as u64;
        batch.free_all(pool).expect("own pool");
    };
    let mut last_ns = 0;
    for r in recs.iter().filter(|r| r.core == core) {
        assert!(batch.push_copy(&mut pool, &arena[r.at..r.at + r.len], r.now_ns), "room in batch and pool");
        packets += 1;
        last_ns = r.now_ns;
        if batch.len() == BATCH || r.flush {
            flush(&mut batch, &mut pool, r.now_ns);
        }
    }
    flush(&mut batch, &mut pool, last_ns);
    let _ = (pipe.export("fsc", core == 0), pipe.export("srcctr", core == 0), pipe.export("keyctr", core == 0));
    Some(CoreRun { results: pipe.nf_results(), report: pipe.store_report(), packets, live })
}

/// Conservation along the chain and in the tables.
fn check(spec: &ChainSpec, cfg: &ExecConfig, run: &CoreRun) {
    let r = &run.results;
    assert_eq!(r.len(), spec.nfs.len());
    // Fragments the fragment table dropped at parse (overlapping, too many) reach no NF.
    let mut given = run.packets - run.report.fragments.dropped();
    for (name, c, _) in r {
        assert_eq!(c.packets_in, given, "{name} was given {} packets, the NF before forwarded {given}", c.packets_in);
        assert_eq!(c.packets_in, c.packets_out + c.dropped, "{name}: {c:?}");
        given = c.packets_out;
    }
    assert_eq!(given, run.live, "the chain forwarded {given} packets, {} left the batches undropped", run.live);
    let t = &run.report;
    // The store's IPv4 table holds `capacity` and its IPv6 table `capacity_v6`; entries count both.
    assert!(t.entries <= t.capacity + t.capacity_v6, "{t:?}");
    assert_eq!(t.entries + t.expiries + t.ended + t.evictions, t.insertions, "table counters: {t:?}");
    assert!(t.flows <= t.entries, "live flows are entries of the first table: {t:?}");
    if cfg.full_policy == FullPolicy::Reject {
        assert_eq!(t.evictions, 0, "{t:?}");
    }
}

#[cfg(test)]
mod tests {
    /// Issue 29: `pernf` counted a flow ended in two per-NF tables (nat's, fw's) once, so the table counters
    /// did not add up (`flows + expiries + ended + evictions = insertions`).
    #[test]
    fn pernf_counts_every_entry_an_end_removes() {
        super::run(&[0x26, 0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x0c]);
    }

    /// The ASan campaign's crash: 64 IPv4 and 64 IPv6 flows in a 64-flow table (the IPv6 table is
    /// its own, `capacity_v6`); the harness compared entries with the IPv4 capacity alone.
    #[test]
    fn entries_count_both_tables() {
        super::run(&[0x49, 0xff, 0xf6, 0x00, 0x20, 0x04, 0x00, 0x20, 0xec, 0xff]);
    }
}
