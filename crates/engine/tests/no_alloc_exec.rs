//! The executor's steady state allocates nothing: every executor, with
//! 5-tuple and coarse (shared) state, after the flows exist.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use flowplane_engine::chain::Chain;
use flowplane_engine::coarse::SharedStores;
use flowplane_engine::exec::{ExecConfig, ExecKind, Pipeline};
use flowplane_engine::spec::parse;
use flowplane_nf::testutil::udp4;
use flowplane_nf::NfContext;
use flowplane_packet::{Batch, PacketPool, PoolConfig};

/// Every registered executor, and the interleaved one at several task counts.
fn kinds() -> Vec<ExecKind> {
    let mut v: Vec<ExecKind> = ExecKind::all().collect();
    v.extend(["interleaved:1", "interleaved:4", "interleaved:64"].map(|s| ExecKind::parse(s).unwrap()));
    v
}

struct Counting;

thread_local! {
    // Only the measuring thread counts, into its own counter: the test
    // harness and the other test allocate on their own threads.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator, only counting calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if COUNTING.with(|c| c.get()) {
            ALLOCS.with(|a| a.set(a.get() + 1));
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn the_counter_sees_allocations() {
    COUNTING.with(|c| c.set(true));
    let before = ALLOCS.with(Cell::get);
    let v = std::hint::black_box(vec![1u8; 100]);
    let after = ALLOCS.with(Cell::get);
    COUNTING.with(|c| c.set(false));
    assert_eq!(v.len(), 100);
    assert!(after > before);
}

#[test]
fn executors_allocate_nothing_in_steady_state() {
    let frames: Vec<Vec<u8>> =
        (0..512u32).map(|f| udp4([10, 0, (f >> 8) as u8, f as u8], [192, 168, 1, (f % 7) as u8], 1000, 80)).collect();
    for chain in [
        "lb -> fsc -> ratelimit(pps=1000000000) -> acl",
        "srcctr -> policer(rate=1000000000000) -> lb",
        "srcctr -> policer(rate=1000000000000) -> synthetic(k=4, mem=64k) -> nat(addrs=4) -> fw(allow_new=any) -> acl",
    ] {
        for kind in kinds() {
            for aux in [true, false] {
                let c = Chain::build(&parse(chain).unwrap()).unwrap();
                let shared = SharedStores::new(&c.groups, 4096, 3_600_000_000_000).unwrap();
                let cfg = ExecConfig { kind, flows: 4096, hugepages: false, aux, ..ExecConfig::default() };
                let mut e = Pipeline::new(c, cfg, shared).unwrap();
                let mut pool = PacketPool::new(PoolConfig { buffers: 256, ..Default::default() }).unwrap();
                let mut batch = Batch::new(&pool);
                let mut round = |e: &mut Pipeline, k: u64| {
                    for chunk in frames.chunks(64) {
                        for f in chunk {
                            assert!(batch.push_copy(&mut pool, f, 0));
                        }
                        e.process(&mut batch, &NfContext { now_tsc: 0, now_ns: k * 1_000_000 });
                        batch.free_all(&mut pool).unwrap();
                    }
                };
                round(&mut e, 0); // warm-up: creates every flow and shared entry
                COUNTING.with(|c| c.set(true));
                let before = ALLOCS.with(Cell::get);
                for k in 1..50 {
                    round(&mut e, k);
                }
                let after = ALLOCS.with(Cell::get);
                COUNTING.with(|c| c.set(false));
                assert_eq!(after - before, 0, "{chain} / {kind} / aux={aux}: allocations in steady state");
                assert!(e.nf_results()[0].1.packets_in >= 50 * 512);
            }
        }
    }
}

#[test]
fn graphs_allocate_nothing_in_steady_state() {
    // dst 192.168.1.(f % 7): the ACL drops 0..=3, so every batch splits over both branches.
    let frames: Vec<Vec<u8>> =
        (0..512u32).map(|f| udp4([10, 0, (f >> 8) as u8, f as u8], [192, 168, 1, (f % 7) as u8], 1000, 80)).collect();
    let chain =
        "fsc -> acl(rule=drop:udp:any:192.168.1.0/30) -> { allow: lb -> fsc ; deny: srcctr -> count -> port(2) }";
    for kind in kinds() {
        let c = Chain::build(&parse(chain).unwrap()).unwrap();
        let shared = SharedStores::for_chain(&c, 4096, 3_600_000_000_000).unwrap();
        let cfg = ExecConfig { kind, flows: 4096, hugepages: false, ..ExecConfig::default() };
        let mut e = Pipeline::new(c, cfg, shared).unwrap();
        let mut pool = PacketPool::new(PoolConfig { buffers: 256, ..Default::default() }).unwrap();
        let mut batch = Batch::new(&pool);
        let mut verdicts = [0u64; 3];
        let mut round = |e: &mut Pipeline, k: u64, v: &mut [u64; 3]| {
            for chunk in frames.chunks(64) {
                for f in chunk {
                    assert!(batch.push_copy(&mut pool, f, 0));
                }
                e.process(&mut batch, &NfContext { now_tsc: 0, now_ns: k * 1_000_000 });
                for &x in batch.verdicts() {
                    v[usize::from(x.min(2))] += 1;
                }
                batch.free_all(&mut pool).unwrap();
            }
        };
        round(&mut e, 0, &mut verdicts); // warm-up: flows, shared entries, the sub-batches
        COUNTING.with(|c| c.set(true));
        let before = ALLOCS.with(Cell::get);
        for k in 1..50 {
            round(&mut e, k, &mut verdicts);
        }
        let after = ALLOCS.with(Cell::get);
        COUNTING.with(|c| c.set(false));
        assert_eq!(after - before, 0, "{chain} / {kind}: allocations in steady state");
        // 4 of every 7 destinations denied (to port 2), the rest to port 0; none dropped.
        let denied = (0..512u64).filter(|f| f % 7 <= 3).count() as u64 * 50;
        assert_eq!(verdicts, [50 * 512 - denied, 0, denied], "{kind}");
    }
}

#[test]
fn traces_and_captures_allocate_nothing_while_recording() {
    use flowplane_engine::tap::{CaptureArm, TraceArm, TraceFilter};
    use std::sync::atomic::AtomicU64;
    use std::sync::{Arc, Mutex};
    let frames: Vec<Vec<u8>> =
        (0..512u32).map(|f| udp4([10, 0, (f >> 8) as u8, f as u8], [192, 168, 1, (f % 7) as u8], 1000, 80)).collect();
    for kind in kinds() {
        let c = Chain::build(&parse("fsc -> acl(rule=drop:udp:any:192.168.1.0/30) -> srcctr").unwrap()).unwrap();
        let shared = SharedStores::new(&c.groups, 4096, 3_600_000_000_000).unwrap();
        let cfg = ExecConfig { kind, flows: 4096, hugepages: false, ..ExecConfig::default() };
        let mut e = Pipeline::new(c, cfg, shared).unwrap();
        let mut pool = PacketPool::new(PoolConfig { buffers: 256, ..Default::default() }).unwrap();
        let mut batch = Batch::new(&pool);
        let mut round = |e: &mut Pipeline, k: u64| {
            for chunk in frames.chunks(64) {
                for f in chunk {
                    assert!(batch.push_copy(&mut pool, f, 0));
                }
                e.process(&mut batch, &NfContext { now_tsc: 0, now_ns: k * 1_000_000 });
                batch.free_all(&mut pool).unwrap();
            }
        };
        round(&mut e, 0);
        // Armed on the control path (allocating there); the rounds below fill the records and the ring
        // (which fills up: the rest are counted lost, still without allocating).
        let trace = TraceArm { filter: TraceFilter::Any, count: 5000, left: Arc::new(AtomicU64::new(5000)) };
        e.arm_trace(0, Some(&trace));
        let (prod, _cons) = rtrb::RingBuffer::new(1 << 16);
        let lost = Arc::new(AtomicU64::new(0));
        let cap = CaptureArm { at: Some(1), dropped: true, rings: Arc::new(Mutex::new(vec![Some(prod)])), lost };
        e.arm_capture(0, Some(&cap));
        // The first traced batch makes the two sub-batches a traced batch is cut into (once per worker).
        round(&mut e, 1);
        COUNTING.with(|c| c.set(true));
        let before = ALLOCS.with(Cell::get);
        for k in 2..20 {
            round(&mut e, k);
        }
        let after = ALLOCS.with(Cell::get);
        COUNTING.with(|c| c.set(false));
        assert_eq!(after - before, 0, "{kind}: allocations while tracing and capturing");
        assert_eq!(e.trace_records().len(), 5000, "{kind}");
        assert!(cap.lost.load(std::sync::atomic::Ordering::Relaxed) > 0, "{kind}: the ring filled up");
    }
}
