//! Trace and capture (`crate::tap`) under every executor: the per-stage
//! verdicts of the traced packets and the captured packets equal a model
//! written from the NFs' documented rules (acl drops dport 5001; the rate
//! limiter passes a flow's first `burst` packets at one packet time; the
//! route sends 10.0.0.2/32 to port 1), and arming them changes no verdict.
//! A chain graph is traced and captured along each branch (the branch taken,
//! a branch NF's verdict and state, `--at` a branch NF), and a trace gives
//! each NF's state for the packet's flow before and after it, as a model of
//! fsc's and ddos's documented counters says, with flows repeating within a
//! batch.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use flowplane_engine::chain::Chain;
use flowplane_engine::coarse::SharedStores;
use flowplane_engine::exec::{ExecConfig, ExecKind, Pipeline};
use flowplane_engine::spec::parse;
use flowplane_engine::tap::{pop_record, CaptureArm, TraceArm, TraceFilter, NOT_REACHED, NOT_TAKEN};
use flowplane_nf::testutil::udp4;
use flowplane_nf::NfContext;
use flowplane_packet::{Batch, PacketPool, PoolConfig, DROP};
use flowplane_wire::flow::FiveTuple;

const STAGES: usize = 5;
const N: usize = 30;

/// Packet i: 10.0.0.1:4000 -> 10.0.0.2:(5001 + i % 3), at i µs.
fn dport(i: usize) -> u16 {
    5001 + (i % 3) as u16
}

/// The model: each stage's verdict for packet i (None: not reached).
fn model(i: usize) -> [Option<u16>; STAGES] {
    let nth_of_flow = i / 3;
    let mut v = [None; STAGES];
    if dport(i) == 5001 {
        v[0] = Some(DROP);
        return v;
    }
    v[0] = Some(0);
    v[1] = Some(0);
    v[2] = Some(0);
    if nth_of_flow >= 2 {
        v[3] = Some(DROP);
        return v;
    }
    v[3] = Some(0);
    v[4] = Some(1);
    v
}

fn pipeline(kind: ExecKind, dir: &std::path::Path) -> Pipeline {
    let routes = dir.join("routes");
    std::fs::write(&routes, "10.0.0.2/32 1\n").unwrap();
    let spec = format!(
        "acl(rule=drop:udp:any:any:any:5001) -> ddos(threshold=1000000) -> fsc -> ratelimit(pps=1,burst=2) -> route(routes={})",
        routes.display()
    );
    let c = Chain::build(&parse(&spec).unwrap()).unwrap();
    let shared = SharedStores::new(&c.groups, 4096, 3_600_000_000_000).unwrap();
    let cfg = ExecConfig { kind, flows: 4096, hugepages: false, ..ExecConfig::default() };
    Pipeline::new(c, cfg, shared).unwrap()
}

/// Runs the packets in batches of 8; returns every packet's final verdict.
fn run(p: &mut Pipeline) -> Vec<u16> {
    let mut pool = PacketPool::new(PoolConfig { buffers: 256, ..Default::default() }).unwrap();
    let mut batch = Batch::new(&pool);
    let mut out = Vec::new();
    for chunk in (0..N).collect::<Vec<_>>().chunks(8) {
        for &i in chunk {
            assert!(batch.push_copy(&mut pool, &udp4([10, 0, 0, 1], [10, 0, 0, 2], 4000, dport(i)), i as u64 * 1000));
        }
        p.process(&mut batch, &NfContext { now_tsc: 0, now_ns: chunk[0] as u64 * 1000 });
        out.extend_from_slice(batch.verdicts());
        batch.free_all(&mut pool).unwrap();
    }
    out
}

fn capture(p: &mut Pipeline, at: Option<usize>, dropped: bool) -> (Vec<u64>, Arc<AtomicU64>) {
    let (prod, mut cons) = rtrb::RingBuffer::new(1 << 16);
    let lost = Arc::new(AtomicU64::new(0));
    let arm = CaptureArm { at, dropped, rings: Arc::new(Mutex::new(vec![Some(prod)])), lost: Arc::clone(&lost) };
    p.arm_capture(0, Some(&arm));
    run(p);
    p.arm_capture(0, None);
    let mut buf = Vec::new();
    let ts = std::iter::from_fn(|| pop_record(&mut cons, &mut buf).map(|r| r.0 / 1000)).collect();
    (ts, lost)
}

#[test]
fn traces_and_captures_are_the_model_under_every_executor() {
    let dir = std::env::temp_dir().join(format!("fp-tap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let expect_final: Vec<u16> = (0..N).map(|i| model(i).iter().rev().find_map(|v| *v).unwrap()).collect();
    for kind in ExecKind::all() {
        let what = kind.to_string();
        // Armed or not, the verdicts are the model's.
        let mut p = pipeline(kind, &dir);
        assert_eq!(run(&mut p), expect_final, "{what}: without a trace");

        let mut p = pipeline(kind, &dir);
        let key = FiveTuple::new("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap(), 4000, 5003, 17).unwrap();
        let arm = TraceArm { filter: TraceFilter::Flow(key), count: 5, left: Arc::new(AtomicU64::new(5)) };
        p.arm_trace(0, Some(&arm));
        assert_eq!(run(&mut p), expect_final, "{what}: with a trace");
        let recs = p.trace_records();
        let want: Vec<usize> = (0..N).filter(|&i| dport(i) == 5003).take(5).collect();
        assert_eq!(recs.iter().map(|r| (r.ts_ns / 1000) as usize).collect::<Vec<_>>(), want, "{what}");
        for (r, &i) in recs.iter().zip(&want) {
            let stages: Vec<Option<u16>> = r.stages.iter().map(|&s| (s != NOT_REACHED).then_some(s as u16)).collect();
            assert_eq!(stages, model(i), "{what}: packet {i}");
            assert_eq!(r.tuple.map(|t| t.dst_port()), Some(5003));
        }
        assert_eq!(arm.left.load(Ordering::Relaxed), 0);

        // A source filter takes the first packets of every flow from it; a new trace starts over.
        let arm = TraceArm {
            filter: TraceFilter::Source("10.0.0.1".parse().unwrap()),
            count: 4,
            left: Arc::new(AtomicU64::new(4)),
        };
        p.arm_trace(0, Some(&arm));
        run(&mut p);
        let recs = p.trace_records();
        assert_eq!(recs.len(), 4, "{what}");
        assert_eq!(recs[0].stages[0], u32::from(DROP), "{what}: acl drops 5001");
        assert_eq!(recs[0].stages[1], NOT_REACHED, "{what}");
        p.arm_trace(0, None);
        assert!(p.trace_records().is_empty());

        // Captures: the input, drops at the rate limiter (stage 3), drops anywhere, what leaves the route.
        let mut p = pipeline(kind, &dir);
        let (all, lost) = capture(&mut p, None, false);
        assert_eq!(all, (0..N as u64).collect::<Vec<_>>(), "{what}: input");
        assert_eq!(lost.load(Ordering::Relaxed), 0);
        let mut p = pipeline(kind, &dir);
        let rl: Vec<u64> = (0..N).filter(|&i| model(i)[3] == Some(DROP)).map(|i| i as u64).collect();
        assert_eq!(capture(&mut p, Some(3), true).0, rl, "{what}: dropped at ratelimit");
        let mut p = pipeline(kind, &dir);
        let any: Vec<u64> = (0..N).filter(|&i| expect_final[i] == DROP).map(|i| i as u64).collect();
        let mut got = capture(&mut p, None, true).0;
        // Stage-major executors see a batch's drops stage by stage; the set is what counts.
        got.sort_unstable();
        assert_eq!(got, any, "{what}: dropped anywhere");
        let mut p = pipeline(kind, &dir);
        let out: Vec<u64> = (0..N).filter(|&i| expect_final[i] == 1).map(|i| i as u64).collect();
        assert_eq!(capture(&mut p, Some(4), false).0, out, "{what}: leaving route");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A ring too small for the packets counts what it could not take; the worker never waits.
#[test]
fn a_full_capture_ring_counts_its_losses() {
    let dir = std::env::temp_dir().join(format!("fp-tap-full-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut p = pipeline(ExecKind::BATCH, &dir);
    let (prod, mut cons) = rtrb::RingBuffer::new(4 * (16 + 60));
    let lost = Arc::new(AtomicU64::new(0));
    let arm =
        CaptureArm { at: None, dropped: false, rings: Arc::new(Mutex::new(vec![Some(prod)])), lost: Arc::clone(&lost) };
    p.arm_capture(0, Some(&arm));
    run(&mut p);
    let mut buf = Vec::new();
    let got = std::iter::from_fn(|| pop_record(&mut cons, &mut buf)).count() as u64;
    assert_eq!((got, lost.load(Ordering::Relaxed)), (4, N as u64 - 4));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `ctl profile start`: per stage, the packets that reached it (the model's), calls and cycles, under
/// every executor; profiling changes no verdict, and stopping it leaves nothing armed.
#[test]
fn a_profile_counts_the_packets_each_nf_ran_under_every_executor() {
    let dir = std::env::temp_dir().join(format!("fp-tap-prof-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let expect_final: Vec<u16> = (0..N).map(|i| model(i).iter().rev().find_map(|v| *v).unwrap()).collect();
    let reached: Vec<u64> = (0..STAGES).map(|s| (0..N).filter(|&i| model(i)[s].is_some()).count() as u64).collect();
    for kind in ExecKind::all() {
        let what = kind.to_string();
        let mut p = pipeline(kind, &dir);
        assert!(p.profile().is_none());
        p.arm_profile(true);
        assert_eq!(run(&mut p), expect_final, "{what}: profiled");
        let prof = p.profile().expect("a running profile");
        assert_eq!(prof.iter().map(|c| c.packets).collect::<Vec<_>>(), reached, "{what}");
        for (s, c) in prof.iter().enumerate() {
            assert!(c.calls >= 1 && c.calls <= c.packets.max(1) * 2 + 4 && c.cycles > 0, "{what}: stage {s}: {c:?}");
        }
        p.arm_profile(false);
        assert!(p.profile().is_none(), "{what}");
        assert_eq!(run(&mut p).len(), N);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The graph of [`graph_model`]: acl denies dport 5001; allowed packets go through fsc and the rate
/// limiter, denied ones are counted and sent to port 2. Stages in flat order: acl, allow/fsc,
/// allow/ratelimit, deny/count.
fn graph_pipeline(kind: ExecKind) -> Pipeline {
    let spec =
        "acl(rule=drop:udp:any:any:any:5001) -> { allow: fsc -> ratelimit(pps=1,burst=2) ; deny: count -> port(2) }";
    let c = Chain::build(&parse(spec).unwrap()).unwrap();
    let shared = SharedStores::for_chain(&c, 4096, 3_600_000_000_000).unwrap();
    let cfg = ExecConfig { kind, flows: 4096, hugepages: false, ..ExecConfig::default() };
    Pipeline::new(c, cfg, shared).unwrap()
}

/// Per stage (flat order) of the graph: the verdict after it (None: not reached, `NOT_TAKEN`: a branch
/// not taken), the branch, and the verdict the packet leaves with.
fn graph_model(i: usize) -> ([Option<u32>; 4], &'static str, u16) {
    let t = Some(NOT_TAKEN);
    if dport(i) == 5001 {
        // Dropped by acl, taken back in by the deny branch: count passes it, port(2) sends it.
        return ([Some(u32::from(DROP)), t, t, Some(0)], "deny", 2);
    }
    if i / 3 >= 2 {
        return ([Some(0), Some(0), Some(u32::from(DROP)), t], "allow", DROP);
    }
    ([Some(0), Some(0), Some(0), t], "allow", 0)
}

#[test]
fn a_graph_is_traced_and_captured_along_each_branch_under_every_executor() {
    let expect_final: Vec<u16> = (0..N).map(|i| graph_model(i).2).collect();
    for kind in ExecKind::all() {
        let what = kind.to_string();
        let mut p = graph_pipeline(kind);
        assert_eq!(run(&mut p), expect_final, "{what}: without a trace");

        let mut p = graph_pipeline(kind);
        let arm = TraceArm { filter: TraceFilter::Any, count: N, left: Arc::new(AtomicU64::new(N as u64)) };
        p.arm_trace(0, Some(&arm));
        assert_eq!(run(&mut p), expect_final, "{what}: with a trace");
        let recs = p.trace_records();
        assert_eq!(recs.len(), N, "{what}");
        for (i, r) in recs.iter().enumerate() {
            let (stages, branch, out) = graph_model(i);
            let got: Vec<Option<u32>> = r.stages.iter().map(|&s| (s != NOT_REACHED).then_some(s)).collect();
            assert_eq!(got, stages, "{what}: packet {i}");
            assert_eq!((r.branch.as_str(), r.out), (branch, u32::from(out)), "{what}: packet {i}");
            if branch == "deny" {
                assert_eq!(r.entered[3], 0, "{what}: the deny branch takes the packet back in");
            }
            // fsc (allow/fsc) counts the flow's allowed packets: before and after this one.
            let fsc = r.state[1].as_ref().map(|c| (c.before.as_ref().map(|v| v["packets"].clone()), c.after.clone()));
            match branch {
                "allow" => {
                    let (before, after) = fsc.unwrap_or_else(|| panic!("{what}: packet {i}: no fsc state"));
                    let k = (i / 3) as u64;
                    assert_eq!(before, (k > 0).then(|| k.into()), "{what}: packet {i}");
                    assert_eq!(after.unwrap()["packets"], k + 1, "{what}: packet {i}");
                }
                _ => assert!(fsc.is_none(), "{what}: packet {i}: a branch not taken has no state"),
            }
        }

        // Captures at a branch's NF: what deny/count passes (the denied packets), what allow/ratelimit
        // drops; drops anywhere are acl's and the rate limiter's.
        let denied: Vec<u64> = (0..N).filter(|&i| dport(i) == 5001).map(|i| i as u64).collect();
        let mut p = graph_pipeline(kind);
        assert_eq!(capture(&mut p, Some(3), false).0, denied, "{what}: at deny/count");
        let limited: Vec<u64> =
            (0..N).filter(|&i| graph_model(i).0[2] == Some(u32::from(DROP))).map(|i| i as u64).collect();
        let mut p = graph_pipeline(kind);
        assert_eq!(capture(&mut p, Some(2), true).0, limited, "{what}: dropped at allow/ratelimit");
        let mut p = graph_pipeline(kind);
        let mut got = capture(&mut p, None, true).0;
        got.sort_unstable();
        let mut any = [denied.clone(), limited].concat();
        any.sort_unstable();
        assert_eq!(got, any, "{what}: dropped anywhere");
    }
}

/// A trace's per-NF state change, under every executor, against a model of the documented state:
/// fsc counts a flow's packets and bytes (first and last seen at the packet times), ddos a source's
/// packets in its window; acl keeps a verdict per flow. Flows interleave and repeat within a batch
/// (batches of 8), so a stage-major executor's state read after a whole batch would be wrong.
#[test]
fn a_trace_gives_each_nfs_state_before_and_after_each_packet_under_every_executor() {
    let chain = "acl(rule=drop:udp:any:any:any:5001) -> fsc -> ddos(threshold=1000000)";
    let len = udp4([10, 0, 0, 1], [10, 0, 0, 2], 4000, 5001).len() as u64;
    for kind in ExecKind::all() {
        let what = kind.to_string();
        let c = Chain::build(&parse(chain).unwrap()).unwrap();
        let shared = SharedStores::new(&c.groups, 4096, 3_600_000_000_000).unwrap();
        let cfg = ExecConfig { kind, flows: 4096, hugepages: false, ..ExecConfig::default() };
        let mut p = Pipeline::new(c, cfg, shared).unwrap();
        let arm = TraceArm { filter: TraceFilter::Any, count: N, left: Arc::new(AtomicU64::new(N as u64)) };
        p.arm_trace(0, Some(&arm));
        run(&mut p);
        let recs = p.trace_records();
        assert_eq!(recs.len(), N, "{what}");
        // The model: per flow its allowed packets so far and the first one's time; the source's packets.
        let mut flows: std::collections::HashMap<u16, (u64, u64)> = Default::default();
        let mut source = 0u64;
        for (i, r) in recs.iter().enumerate() {
            let ts = i as u64 * 1000;
            let acl = r.state[0].as_ref().unwrap_or_else(|| panic!("{what}: packet {i}: acl's state"));
            assert_eq!(acl.before.is_some(), i >= 3, "{what}: packet {i}: acl's verdict cached from the flow's first");
            assert!(acl.after.is_some(), "{what}: packet {i}");
            if dport(i) == 5001 {
                assert_eq!((&r.state[1], &r.state[2]), (&None, &None), "{what}: packet {i}: fsc, ddos not reached");
                continue;
            }
            let (n, first) = flows.get(&dport(i)).copied().unwrap_or((0, ts));
            let fsc = r.state[1].as_ref().unwrap();
            let row = |k: u64, last: u64| {
                serde_json::json!({"proto": 17, "src": "10.0.0.1", "dst": "10.0.0.2", "sport": 4000, "dport": dport(i),
                    "packets": k, "bytes": k * len, "first_ns": first, "last_ns": last})
            };
            let prev_last = ts.saturating_sub(3000);
            assert_eq!(fsc.before, (n > 0).then(|| row(n, prev_last)), "{what}: packet {i}: fsc before");
            assert_eq!(fsc.after, Some(row(n + 1, ts)), "{what}: packet {i}: fsc after");
            flows.insert(dport(i), (n + 1, first));
            let ddos = r.state[2].as_ref().unwrap();
            let count = |v: &Option<serde_json::Value>| v.as_ref().map(|v| v["window_packets"].as_u64().unwrap());
            assert_eq!(count(&ddos.before), (source > 0).then_some(source), "{what}: packet {i}: ddos before");
            assert_eq!(count(&ddos.after), Some(source + 1), "{what}: packet {i}: ddos after");
            assert_eq!(ddos.after.as_ref().unwrap()["src"], "10.0.0.1");
            source += 1;
        }
    }
}
