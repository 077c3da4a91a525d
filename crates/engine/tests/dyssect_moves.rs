//! Dyssect's moves during a run: 100,000 moves of RETA entries (shards)
//! and of exact-match flow rules (offloaded flows: a flow's rule installed,
//! its slot moved between three cores, moved home, the rule removed), many
//! in flight at once in every direction, lose and reorder no packet of any
//! flow — checked on the transmitted packets, which carry a per-flow
//! sequence number — and the final per-flow state and counters equal a
//! 1-core run's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flowplane_engine::exec::ExecConfig;
use flowplane_engine::runner::{run_steered, Nic, Output};
use flowplane_engine::spec::parse;
use flowplane_engine::{run, RunConfig};
use flowplane_io::replay::{ReplayBuilder, ReplayTrace};
use flowplane_nf::testutil::ipv4_frame;
use flowplane_scale::steer::{Classifier, FlowRule, HashOn, Steering};
use flowplane_scale::strategy::{LoadSample, Strategy};
use flowplane_trace::{PcapWriter, TraceReader, WriterOptions};
use flowplane_wire::flow::{extract_five_tuple, FiveTuple};

const FLOWS: u32 = 2000;
const PACKETS: u32 = 40_000;
const LOOPS: u64 = 60;
const CORES: usize = 3;
const MOVES: u64 = 100_000;

fn frame(f: u32, seq: u32) -> Vec<u8> {
    let mut u = vec![0u8; 8 + 12];
    u[0..2].copy_from_slice(&(1024 + (f % 50_000) as u16).to_be_bytes());
    u[2..4].copy_from_slice(&53u16.to_be_bytes());
    u[4..6].copy_from_slice(&20u16.to_be_bytes());
    u[8..12].copy_from_slice(&f.to_be_bytes());
    u[12..16].copy_from_slice(&seq.to_be_bytes());
    ipv4_frame([10, (f >> 8) as u8, f as u8, 1], [192, 0, 2, (f % 7) as u8], 17, &u)
}

fn trace(c: &Classifier) -> (Arc<ReplayTrace>, Vec<u32>, Vec<FlowRule>) {
    let mut b = ReplayBuilder::new(1);
    let mut next = vec![0u32; FLOWS as usize];
    let mut x = 0x9e37_79b9u32;
    for i in 0..PACKETS {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        // Skewed: a tenth of the flows carry half the packets (the ones worth offloading).
        let f = if x & 1 == 0 { (x >> 1) % (FLOWS / 10) } else { (x >> 1) % FLOWS };
        let fr = frame(f, next[f as usize]);
        next[f as usize] += 1;
        let (k, h) = c.classify(&fr).unwrap();
        b.push_steered(&fr, h, u64::from(i) * 100, k).unwrap();
    }
    let rules = (0..FLOWS)
        .map(|f| {
            let fr = frame(f, 0);
            let (entry, hash) = c.classify(&fr).unwrap();
            let Ok(FiveTuple::V4(tuple)) = extract_five_tuple(&fr) else { panic!("v4") };
            FlowRule { entry, hash, tuple }
        })
        .collect();
    (b.build(), next, rules)
}

/// Every period: random shard moves and flow-rule operations, until `total` moves started.
struct Churn {
    rules: Vec<FlowRule>,
    per_tick: usize,
    total: u64,
    started: u64,
    x: u64,
}

impl Churn {
    fn rnd(&mut self) -> u64 {
        self.x = self.x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.x >> 33
    }
}

impl Strategy for Churn {
    fn name(&self) -> &'static str {
        "churn"
    }
    fn moves_flows(&self) -> bool {
        true
    }
    fn counts_loads(&self) -> bool {
        true
    }
    fn period(&self) -> Duration {
        Duration::from_millis(1)
    }
    fn drive(&mut self, st: &Steering, _s: &LoadSample<'_>, _cpp: &[f64], _hz: f64) -> bool {
        let q = st.queues() as u16;
        let mut tries = 0;
        while tries < 4 * self.per_tick && self.started < self.total {
            tries += 1;
            let owners = st.owners();
            if self.rnd().is_multiple_of(2) {
                // A shard (with or without offloaded flows) to another core.
                let e = (self.rnd() as usize % st.reta_size()) as u16;
                let to = (owners[e as usize] + 1 + (self.rnd() % 2) as u16) % q;
                self.started += u64::from(st.start_move(e, to).is_ok());
                continue;
            }
            // A flow (mostly heavy ones): offload, move on, bring home, or drop its rule.
            let f = if self.rnd().is_multiple_of(4) {
                self.rnd() as usize % self.rules.len()
            } else {
                self.rnd() as usize % (self.rules.len() / 10)
            };
            let rule = self.rules[f];
            let slot = st.flow_rules().iter().find(|(_, r)| r.tuple == rule.tuple).map(|(k, _)| *k);
            match slot {
                None => {
                    if let Ok(key) = st.install_flow_rule(rule) {
                        let to = (owners[rule.entry as usize] + 1) % q;
                        self.started += u64::from(st.start_move(key, to).is_ok());
                    }
                }
                Some(key) => {
                    let home = owners[rule.entry as usize];
                    if owners[key as usize] == home && self.rnd().is_multiple_of(2) {
                        let _ = st.remove_flow_rule(key);
                    } else {
                        let to = if self.rnd().is_multiple_of(2) { home } else { (owners[key as usize] + 1) % q };
                        self.started += u64::from(st.start_move(key, to).is_ok());
                    }
                }
            }
        }
        true
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

// Passed 11 of 13 runs; one failed and one stalled on a loaded machine (issue 11 note):
// kept out of CI until the stall is found. Run: `cargo test -p flowplane-engine --test
// dyssect_moves -- --ignored`.
#[test]
#[ignore = "an intermittent stall under investigation (issue 11)"]
fn a_hundred_thousand_shard_and_flow_moves_lose_and_reorder_nothing() {
    let c = Classifier::new(512, false, HashOn::FiveTuple, false, Vec::new()).unwrap();
    let (t, per_flow, rules) = trace(&c);
    let spec = parse("fsc").unwrap();
    let one = run(&cfg(1), &spec, t.clone(), Output::Discard).unwrap();

    let path = std::env::temp_dir().join(format!("fp-dyssect-moves-{}.pcap", std::process::id()));
    let w = Arc::new(Mutex::new(PcapWriter::create(&path, WriterOptions::default()).unwrap()));
    let steering = Arc::new(Steering::with_flow_slots(CORES, &c, &[], 64).unwrap());
    let nic = Nic {
        steering: steering.clone(),
        classifier: c,
        strategy: Box::new(Churn { rules, per_tick: 128, total: MOVES, started: 0, x: 11 }),
        plan: Default::default(),
    };
    let many = run_steered(&cfg(CORES), &spec, t, nic, Output::Pcap(w.clone())).unwrap();
    Arc::try_unwrap(w).ok().unwrap().into_inner().unwrap().finish().unwrap();
    let sc = many.scale.as_ref().unwrap();
    eprintln!("{} moves completed, {} flow entries handed over", sc.moves, sc.flows_moved);
    assert!(sc.moves >= MOVES, "only {} moves completed (run too short?)", sc.moves);
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
    let rows = |r: &flowplane_engine::Report| sorted(r.exports.iter().find(|(n, _)| n == "fsc").unwrap().1.clone());
    let (a, b) = (rows(&one), rows(&many));
    assert_eq!(a.len(), b.len(), "flows");
    if let Some((x, y)) = a.iter().zip(&b).find(|(x, y)| x != y) {
        panic!("per-flow state differs: 1 core {x}, {CORES} cores {y}");
    }
    assert_eq!(one.nfs[0].counters, many.nfs[0].counters);
}
