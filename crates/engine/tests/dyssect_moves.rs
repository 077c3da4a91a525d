//! Dyssect's moves during a run: shard moves (RETA entries) and flow moves
//! (exact-match flow rules: a flow's rule installed, its slot moved between
//! three cores, moved home, the rule removed), many in flight at once in
//! every direction, lose and reorder no packet of any flow — checked on the
//! transmitted packets, which carry a per-flow sequence number — and leave
//! each flow's state as one core processing the same packets would.
//!
//! Two runs: one sized by moves (100,000 in release builds, fewer in debug:
//! an endless replay stopped once the moves are done, so a loaded machine
//! makes it slower, not shorter), and one sized by packets whose moves go
//! on until the stream ends (moves racing the queues' finish: a switch
//! point before a finished queue's end once stalled the run).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flowplane_engine::exec::ExecConfig;
use flowplane_engine::runner::{run_steered, Nic, Output};
use flowplane_engine::spec::parse;
use flowplane_engine::{run, RunConfig};
use flowplane_io::replay::{ReplayBuilder, ReplayTrace};
use flowplane_nf::testutil::ipv4_frame;
use flowplane_scale::steer::{Classifier, FlowRule, HashOn, Steering};
use flowplane_scale::strategy::{Controller, LoadSample, Strategy};
use flowplane_trace::{PcapWriter, TraceReader, WriterOptions};
use flowplane_wire::flow::{extract_five_tuple, FiveTuple};

const FLOWS: u32 = 2000;
const PACKETS: u32 = 40_000;
const LOOPS: u64 = 60;
const CORES: usize = 3;
/// Moves of the run sized by moves: 100,000 in release builds, 30,000 in
/// test builds (CI; about 15 s); `FP_DYSSECT_MOVES` overrides.
fn moves() -> u64 {
    let default = if cfg!(debug_assertions) { 30_000 } else { 100_000 };
    std::env::var("FP_DYSSECT_MOVES").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}
/// The longest that run may take: a protocol stall ends here, reported.
const CAP: Duration = Duration::from_secs(240);

fn frame(f: u32, seq: u32) -> Vec<u8> {
    let mut u = vec![0u8; 8 + 12];
    u[0..2].copy_from_slice(&(1024 + (f % 50_000) as u16).to_be_bytes());
    u[2..4].copy_from_slice(&53u16.to_be_bytes());
    u[4..6].copy_from_slice(&20u16.to_be_bytes());
    u[8..12].copy_from_slice(&f.to_be_bytes());
    u[12..16].copy_from_slice(&seq.to_be_bytes());
    ipv4_frame([10, (f >> 8) as u8, f as u8, 1], [192, 0, 2, (f % 7) as u8], 17, &u)
}

/// The flow of each packet of the stream, in order. Skewed: a tenth of the
/// flows carry half the packets (the ones worth offloading).
fn flow_of_packets() -> impl Iterator<Item = u32> {
    let mut x = 0x9e37_79b9u32;
    (0..PACKETS).map(move |_| {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        if x & 1 == 0 {
            (x >> 1) % (FLOWS / 10)
        } else {
            (x >> 1) % FLOWS
        }
    })
}

fn trace(c: &Classifier) -> (Arc<ReplayTrace>, Vec<u32>, Vec<FlowRule>) {
    let mut b = ReplayBuilder::new(1);
    let mut next = vec![0u32; FLOWS as usize];
    for (i, f) in (0..PACKETS).zip(flow_of_packets()) {
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

/// Every period: random shard moves and flow-rule operations, until
/// `total` moves completed; then a quiet tail of `tail` periods without
/// moves (a packet lost by a late move would leave a gap before the end).
struct Churn {
    rules: Vec<FlowRule>,
    per_tick: usize,
    total: u64,
    started: u64,
    x: u64,
    done: u64,
    quiet: u32,
    tail: u32,
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
    fn finished(&self) -> bool {
        self.done >= self.total && self.quiet >= self.tail
    }
    fn drive(&mut self, st: &Steering, _s: &LoadSample<'_>, _cpp: &[f64], _hz: f64) -> bool {
        let q = st.queues() as u16;
        self.done = st.moves_done();
        if self.done >= self.total {
            self.quiet += 1;
            return true;
        }
        let mut tries = 0;
        while tries < 4 * self.per_tick {
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

fn cfg(cores: usize, loops: Option<u64>) -> RunConfig {
    RunConfig {
        cores,
        pin: false,
        loops,
        duration: loops.is_none().then_some(CAP),
        export: vec!["fsc".into()],
        exec: ExecConfig { flows: 1 << 14, hugepages: false, ..ExecConfig::default() },
        ..RunConfig::default()
    }
}

/// What one churned run transmitted and kept.
struct Churned {
    report: flowplane_engine::Report,
    /// Per flow: packets transmitted (each flow's first ones, in order).
    sent: Vec<u64>,
    took: Duration,
}

/// Runs `fsc` on 3 cores under churn; checks every flow's transmitted
/// packets are its first ones in order (no loss before the last, no
/// duplicate, no reordering).
fn churned(loops: Option<u64>, total: u64, tail: u32) -> (Churned, Vec<u32>, Vec<Vec<u32>>, u64) {
    let c = Classifier::new(512, false, HashOn::FiveTuple, false, Vec::new()).unwrap();
    let (t, per_flow, rules) = trace(&c);
    let (loop_ns, n) = (t.loop_ns(), t.packets());
    // Each flow's stream indices within a loop (its packets' times).
    let mut at: Vec<Vec<u32>> = vec![Vec::new(); FLOWS as usize];
    for (i, f) in (0..PACKETS).zip(flow_of_packets()) {
        at[f as usize].push(i);
    }
    assert_eq!(n, PACKETS as usize);
    let spec = parse("fsc").unwrap();
    let path = std::env::temp_dir().join(format!("fp-dyssect-moves-{}-{total}.pcap", std::process::id()));
    let w = Arc::new(Mutex::new(PcapWriter::create(&path, WriterOptions::default()).unwrap()));
    let steering = Arc::new(Steering::with_flow_slots(CORES, &c, &[], 64).unwrap());
    let nic = Nic {
        steering: steering.clone(),
        classifier: c,
        strategy: Box::new(Churn { rules, per_tick: 128, total, started: 0, x: 11, done: 0, quiet: 0, tail }),
        plan: Default::default(),
    };
    let t0 = Instant::now();
    let report = run_steered(&cfg(CORES, loops), &spec, t, nic, Output::Pcap(w.clone())).unwrap();
    let took = t0.elapsed();
    Arc::try_unwrap(w).ok().unwrap().into_inner().unwrap().finish().unwrap();

    let mut seen = vec![0u64; FLOWS as usize];
    let mut r = TraceReader::open(&path).unwrap();
    let mut buf = Vec::new();
    while let Some(p) = r.next_frame(&mut buf).unwrap() {
        let d = p.data;
        let f = u32::from_be_bytes(d[42..46].try_into().unwrap());
        let seq = u32::from_be_bytes(d[46..50].try_into().unwrap());
        let k = &mut seen[f as usize];
        let want = (*k % u64::from(per_flow[f as usize])) as u32;
        assert_eq!(seq, want, "flow {f}: packet {} out of order (lost, duplicated or reordered)", *k);
        *k += 1;
    }
    let _ = std::fs::remove_file(&path);
    (Churned { report, sent: seen, took }, per_flow, at, loop_ns)
}

/// The `fsc` row of flow `f` after its first `k` packets on one core.
fn expected_row(f: u32, k: u64, at: &[u32], loop_ns: u64) -> (u64, u64, u64, u64) {
    let len = frame(f, 0).len() as u64;
    let ts = |j: u64| (j / at.len() as u64) * loop_ns + u64::from(at[(j % at.len() as u64) as usize]) * 100;
    (k, k * len, ts(0), ts(k - 1))
}

/// Each flow's exported state and the NF's counters are those of one core
/// that processed exactly the transmitted packets.
fn state_is_one_cores(run: &Churned, at: &[Vec<u32>], loop_ns: u64) {
    let rows = &run.report.exports.iter().find(|(n, _)| n == "fsc").unwrap().1;
    let flows = run.sent.iter().filter(|&&k| k > 0).count();
    assert_eq!(rows.len(), flows, "one row per flow that sent a packet (none twice)");
    for r in rows {
        let src: Vec<u32> = r["src"].as_str().unwrap().split('.').map(|x| x.parse().unwrap()).collect();
        let f = src[1] << 8 | src[2];
        let got = (
            r["packets"].as_u64().unwrap(),
            r["bytes"].as_u64().unwrap(),
            r["first_ns"].as_u64().unwrap(),
            r["last_ns"].as_u64().unwrap(),
        );
        let want = expected_row(f, run.sent[f as usize], &at[f as usize], loop_ns);
        assert_eq!(got, want, "flow {f}: (packets, bytes, first, last) on {CORES} cores vs 1");
    }
    let c = &run.report.nfs[0].counters;
    let (n, bytes) =
        run.sent.iter().enumerate().fold((0, 0), |(n, b), (f, &k)| (n + k, b + k * frame(f as u32, 0).len() as u64));
    assert_eq!((c.packets_in, c.packets_out, c.dropped, c.bytes_in), (n, n, 0, bytes));
}

#[test]
fn shard_and_flow_moves_lose_and_reorder_nothing() {
    let total = moves();
    let (run, _, at, loop_ns) = churned(None, total, 50);
    let sc = run.report.scale.as_ref().unwrap();
    let n: u64 = run.sent.iter().sum();
    eprintln!(
        "{} moves completed, {} flow entries handed over, {n} packets, {:.1} s",
        sc.moves,
        sc.flows_moved,
        run.took.as_secs_f64()
    );
    assert!(
        sc.moves >= total,
        "only {} of {total} moves completed within {} s: a stalled hand-over (or a machine too slow)",
        sc.moves,
        CAP.as_secs()
    );
    assert!(sc.flows_moved > 0 && sc.flows_refused == 0, "{sc:?}");
    state_is_one_cores(&run, &at, loop_ns);
}

#[test]
fn moves_up_to_the_end_of_the_stream_lose_and_reorder_nothing() {
    let loops = if cfg!(debug_assertions) { 6 } else { LOOPS };
    // Moves never stop: many race the queues' finish (some after a queue has finished).
    let (run, per_flow, at, loop_ns) = churned(Some(loops), u64::MAX, 0);
    let sc = run.report.scale.as_ref().unwrap();
    eprintln!("{} moves completed, {} flow entries handed over", sc.moves, sc.flows_moved);
    assert!(sc.moves > 100 && sc.flows_refused == 0, "{sc:?}");
    for (f, &m) in per_flow.iter().enumerate() {
        assert_eq!(run.sent[f], u64::from(m) * loops, "flow {f}: every packet of every loop");
    }
    state_is_one_cores(&run, &at, loop_ns);
    // And as a real 1-core run over the same loops.
    let c = Classifier::new(512, false, HashOn::FiveTuple, false, Vec::new()).unwrap();
    let (t, _, _) = trace(&c);
    let one = run_1(&cfg(1, Some(loops)), t);
    let sorted = |r: &flowplane_engine::Report| {
        let mut v = r.exports.iter().find(|(n, _)| n == "fsc").unwrap().1.clone();
        v.sort_by_key(|r| r.to_string());
        v
    };
    assert_eq!(sorted(&one), sorted(&run.report), "per-flow state vs a 1-core run");
    assert_eq!(one.nfs[0].counters, run.report.nfs[0].counters);
}

fn run_1(cfg: &RunConfig, t: Arc<ReplayTrace>) -> flowplane_engine::Report {
    run(cfg, &parse("fsc").unwrap(), t, Output::Discard).unwrap()
}
