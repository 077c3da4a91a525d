//! RETA moves during a run: 10,000 moves between two cores (each one a
//! state hand-over of every flow of the entry) lose and reorder no packet of
//! any flow — checked on the transmitted packets, which carry a per-flow
//! sequence number — and the final per-flow state equals a 1-core run's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flowplane_engine::exec::ExecConfig;
use flowplane_engine::runner::{run_steered, Nic, Output};
use flowplane_engine::spec::parse;
use flowplane_engine::{run, RunConfig};
use flowplane_io::replay::{ReplayBuilder, ReplayTrace};
use flowplane_nf::testutil::ipv4_frame;
use flowplane_scale::steer::{Classifier, HashOn, Steering};
use flowplane_scale::strategy::{Controller, LoadSample, Strategy};
use flowplane_trace::{PcapWriter, TraceReader, WriterOptions};

const FLOWS: u32 = 2000;
const PACKETS: u32 = 40_000;
/// Loops of the trace: enough control ticks (1 ms, up to 256 moves each) for
/// 10,000 moves; an optimised build replays several times faster, so it
/// loops more to last as many ticks.
const LOOPS: u64 = if cfg!(debug_assertions) { 60 } else { 150 };

/// Flow `f`'s `seq`-th packet: UDP with (flow, seq) in the payload.
fn frame(f: u32, seq: u32) -> Vec<u8> {
    let mut u = vec![0u8; 8 + 12];
    u[0..2].copy_from_slice(&(1024 + (f % 50_000) as u16).to_be_bytes());
    u[2..4].copy_from_slice(&53u16.to_be_bytes());
    u[4..6].copy_from_slice(&20u16.to_be_bytes());
    u[8..12].copy_from_slice(&f.to_be_bytes());
    u[12..16].copy_from_slice(&seq.to_be_bytes());
    ipv4_frame([10, (f >> 8) as u8, f as u8, 1], [192, 0, 2, (f % 7) as u8], 17, &u)
}

fn trace(c: &Classifier) -> (Arc<ReplayTrace>, Vec<u32>) {
    let mut b = ReplayBuilder::new(1);
    let mut next = vec![0u32; FLOWS as usize];
    let mut x = 0x9e37_79b9u32;
    for i in 0..PACKETS {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        let f = x % FLOWS;
        let fr = frame(f, next[f as usize]);
        next[f as usize] += 1;
        let (k, h) = c.classify(&fr).unwrap();
        b.push_steered(&fr, h, u64::from(i) * 100, k).unwrap();
    }
    (b.build(), next)
}

/// Moves random RETA entries to the other core every period until it has started `total`.
struct Churn {
    per_tick: usize,
    total: u64,
    started: u64,
    x: u64,
}

impl Strategy for Churn {
    fn name(&self) -> &'static str {
        "churn"
    }
    fn controller(&self) -> Option<&dyn Controller> {
        Some(self)
    }
    fn controller_mut(&mut self) -> Option<&mut dyn Controller> {
        Some(self)
    }
}

impl Controller for Churn {
    fn counts_loads(&self) -> bool {
        true
    }
    fn period(&self) -> Duration {
        Duration::from_millis(1)
    }
    fn rebalance(&mut self, s: &LoadSample<'_>) -> Vec<(u16, u16)> {
        let mut out = Vec::new();
        while out.len() < self.per_tick && self.started < self.total {
            self.x = self.x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let e = ((self.x >> 33) as usize) % s.owners.len();
            if out.iter().any(|&(k, _)| k as usize == e) {
                continue;
            }
            out.push((e as u16, (s.owners[e] + 1) % s.queues as u16));
            self.started += 1;
        }
        out
    }
}

fn cfg(cores: usize) -> RunConfig {
    RunConfig {
        cores,
        pin: false,
        loops: Some(LOOPS),
        export: vec!["fsc".into()],
        exec: ExecConfig { flows: 1 << 14, hugepages: false, ..ExecConfig::default() },
        ..RunConfig::default()
    }
}

fn sorted(mut v: Vec<serde_json::Value>) -> Vec<serde_json::Value> {
    v.sort_by_key(|r| r.to_string());
    v
}

#[test]
fn ten_thousand_reta_moves_lose_and_reorder_nothing() {
    let c = Classifier::new(512, false, HashOn::FiveTuple, false, Vec::new()).unwrap();
    let (t, per_flow) = trace(&c);
    let spec = parse("fsc").unwrap();
    let one = run(&cfg(1), &spec, t.clone(), Output::Discard).unwrap();

    let path = std::env::temp_dir().join(format!("fp-migration-{}.pcap", std::process::id()));
    let w = Arc::new(Mutex::new(PcapWriter::create(&path, WriterOptions::default()).unwrap()));
    let steering = Arc::new(Steering::new(2, &c, &[]).unwrap());
    let nic = Nic {
        steering,
        classifier: c,
        strategy: Box::new(Churn { per_tick: 256, total: u64::MAX, started: 0, x: 7 }),
        plan: Default::default(),
    };
    let two = run_steered(&cfg(2), &spec, t, nic, Output::Pcap(w.clone())).unwrap();
    Arc::try_unwrap(w).ok().unwrap().into_inner().unwrap().finish().unwrap();
    let sc = two.scale.as_ref().unwrap();
    assert!(sc.moves >= 10_000, "only {} moves completed (run too short?)", sc.moves);
    assert!(sc.flows_moved > 0 && sc.flows_refused == 0, "{sc:?}");

    // Every packet once, every flow in order, loop after loop.
    let mut seen: HashMap<u32, u64> = HashMap::new();
    let mut r = TraceReader::open(&path).unwrap();
    let mut buf = Vec::new();
    let mut n = 0u64;
    while let Some(p) = r.next_frame(&mut buf).unwrap() {
        let d = p.data;
        let f = u32::from_be_bytes(d[42..46].try_into().unwrap());
        let seq = u32::from_be_bytes(d[46..50].try_into().unwrap());
        let k = seen.entry(f).or_default();
        let want = (*k % u64::from(per_flow[f as usize])) as u32;
        assert_eq!(seq, want, "flow {f}: packet {} out of order", *k);
        *k += 1;
        n += 1;
    }
    let _ = std::fs::remove_file(&path);
    assert_eq!(n, u64::from(PACKETS) * LOOPS);
    for (f, &m) in per_flow.iter().enumerate() {
        assert_eq!(seen.get(&(f as u32)).copied().unwrap_or(0), u64::from(m) * LOOPS, "flow {f}");
    }
    // Final per-flow state: the 1-core run's.
    let rows = |r: &flowplane_engine::Report| sorted(r.exports.iter().find(|(n, _)| n == "fsc").unwrap().1.clone());
    let (a, b) = (rows(&one), rows(&two));
    assert_eq!(a.len(), b.len(), "flows");
    if let Some((x, y)) = a.iter().zip(&b).find(|(x, y)| x != y) {
        panic!("per-flow state differs: 1 core {x}, 2 cores {y}");
    }
    assert_eq!(one.nfs[0].counters, two.nfs[0].counters);
}
