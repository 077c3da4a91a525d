//! Idle timeouts enforced at access (issue 29, item 1): an NF's state idle
//! past the NF's own timeout is released and starts afresh, wherever it
//! lives — in an aggregated block whose timeout is longer (another NF of the
//! chain asks for more), in a coarse entry that flows keep pinned — under
//! every executor and batch size. Checked against the rule itself: a tally
//! NF numbers the packets its state has seen since `init`, so each packet's
//! verdict says whether its state was fresh.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use flowplane_engine::chain::{Chain, Stage};
use flowplane_engine::coarse::SharedStores;
use flowplane_engine::exec::{ExecConfig, ExecKind, Pipeline, EXECUTORS};
use flowplane_nf::stateful::{Action, Granularity, StatefulNf};
use flowplane_nf::testutil::udp4;
use flowplane_nf::{NfContext, Pkt};
use flowplane_packet::{Batch, PacketPool, PoolConfig};
use flowplane_wire::flow::FiveTuple;

const SEC: u64 = 1_000_000_000;

/// Counts the packets its state has seen; verdict `Port(count)` when `tell`.
struct Tally {
    name: &'static str,
    granularity: Granularity,
    timeout_ns: u64,
    tell: bool,
    releases: Arc<AtomicU64>,
}

impl StatefulNf for Tally {
    type State = u64;
    const HAS_RELEASE: bool = true;
    fn name(&self) -> &'static str {
        self.name
    }
    fn granularity(&self) -> Granularity {
        self.granularity
    }
    fn idle_timeout_ns(&self) -> Option<u64> {
        Some(self.timeout_ns)
    }
    fn init(&mut self, _: &Pkt<'_>, _: &NfContext) -> u64 {
        0
    }
    fn process(&mut self, _: &mut Pkt<'_>, n: &mut u64, _: &NfContext) -> Action {
        *n += 1;
        if self.tell {
            Action::Port(*n as u16)
        } else {
            Action::Pass
        }
    }
    fn release(&mut self, _: &FiveTuple, n: &u64) {
        assert!(*n > 0, "released state had seen packets");
        self.releases.fetch_add(1, Ordering::Relaxed);
    }
}

fn tally(name: &'static str, g: Granularity, timeout_s: u64, tell: bool) -> (Stage, Arc<AtomicU64>) {
    let releases = Arc::new(AtomicU64::new(0));
    let nf = Tally { name, granularity: g, timeout_ns: timeout_s * SEC, tell, releases: Arc::clone(&releases) };
    (Stage::stateful(nf), releases)
}

/// Packet times (s) and, by the rule (timeout 5 s, strictly more is idle),
/// each packet's count since its state was fresh.
const TIMES: [u64; 7] = [0, 1, 3, 9, 14, 20, 20];
const COUNTS: [u16; 7] = [1, 2, 3, 1, 2, 1, 2];
const RESETS: u64 = 2;

/// Runs `frames` (one per entry of `TIMES`) through `chain` in batches of
/// `per_batch`; returns each packet's verdict and the report's state resets.
fn run(chain: Chain, kind: ExecKind, frames: &[Vec<u8>], per_batch: usize) -> (Vec<u16>, u64, u64) {
    let cfg = ExecConfig { kind, flows: 1024, hugepages: false, ..ExecConfig::default() };
    let shared = SharedStores::new(&chain.groups, 1024, cfg.default_idle_timeout_ns).unwrap();
    let mut p = Pipeline::new(chain, cfg, shared).unwrap();
    let mut pool = PacketPool::new(PoolConfig { buffers: 64, ..Default::default() }).unwrap();
    let mut verdicts = Vec::new();
    for (frames, times) in frames.chunks(per_batch).zip(TIMES.chunks(per_batch)) {
        let mut batch = Batch::new(&pool);
        for (f, &t) in frames.iter().zip(times) {
            assert!(batch.push_copy(&mut pool, f, t * SEC));
        }
        let now_ns = batch.max_timestamp();
        p.process(&mut batch, &NfContext { now_tsc: 0, now_ns });
        verdicts.extend_from_slice(batch.verdicts());
        batch.free_all(&mut pool).unwrap();
    }
    let r = p.store_report();
    (verdicts, r.state_resets, r.expiries)
}

/// A 5-tuple NF with a shorter timeout than the block's: its own stamp.
#[test]
fn shorter_timeout_in_a_longer_block_expires_at_its_own_time() {
    let frames: Vec<Vec<u8>> = TIMES.iter().map(|_| udp4([10, 0, 0, 1], [10, 0, 0, 2], 1000, 53)).collect();
    for info in EXECUTORS {
        let kind = ExecKind::parse(info.name).unwrap();
        for per_batch in [1, 4, 64] {
            let (long, long_rel) = tally("long", Granularity::FiveTuple, 100, false);
            let (short, short_rel) = tally("short", Granularity::FiveTuple, 5, true);
            let chain = Chain::from_stages(vec![long, short], false).unwrap();
            assert_eq!(chain.idle_timeout_ns, Some(100 * SEC), "the block lives as long as the longest");
            let (v, resets, expiries) = run(chain, kind, &frames, per_batch);
            let what = format!("{} batch {per_batch}", info.name);
            assert_eq!(v, COUNTS, "{what}");
            assert_eq!(short_rel.load(Ordering::Relaxed), RESETS, "{what}: old state released");
            assert_eq!(long_rel.load(Ordering::Relaxed), 0, "{what}: the long NF keeps its state");
            // Aggregated: resets inside the live block; per-NF tables: the short NF's table expires on lookup.
            assert_eq!(resets + expiries, RESETS, "{what}: counted once");
        }
    }
}

/// A coarse NF whose entry every packet's flow keeps pinned (each packet is
/// a new flow of the same source, and flows live 30 s): still expires.
#[test]
fn pinned_coarse_state_expires_at_its_own_time() {
    let frames: Vec<Vec<u8>> =
        (0..TIMES.len() as u16).map(|k| udp4([198, 51, 100, 20], [10, 0, 0, 1], 40000 + k, 22)).collect();
    for info in EXECUTORS {
        let kind = ExecKind::parse(info.name).unwrap();
        for per_batch in [1, 4, 64] {
            let (src, rel) = tally("src", Granularity::SrcIp, 5, true);
            let chain = Chain::from_stages(vec![src], false).unwrap();
            let (v, resets, _) = run(chain, kind, &frames, per_batch);
            let what = format!("{} batch {per_batch}", info.name);
            assert_eq!(v, COUNTS, "{what}");
            assert_eq!((rel.load(Ordering::Relaxed), resets), (RESETS, RESETS), "{what}");
        }
    }
}
