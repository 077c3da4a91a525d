//! A run-time rule swap (`flowplane ctl load acl FILE`: `control::Command::Reconfigure`
//! served from the workers' mailboxes between two batches) under every executor, batch
//! size and core count: every packet is judged by exactly one rule set — the old one
//! before the batch where its core served the request, the new one from there on —
//! as the documented rule (`drop proto udp dport P`) says, and no flow loses its state
//! (fsc's flows are initialised once per flow, before and after the swap).

use std::time::Duration;

use flowplane_engine::chain::Chain;
use flowplane_engine::coarse::SharedStores;
use flowplane_engine::control::{Answer, Command, Mailboxes};
use flowplane_engine::exec::{ExecConfig, ExecKind, Pipeline};
use flowplane_engine::spec::parse;
use flowplane_nf::testutil::udp4;
use flowplane_nf::NfContext;
use flowplane_packet::{Batch, PacketPool, PoolConfig, DROP};

/// Packets per core.
const N: usize = 240;
/// Flows per core (source ports).
const FLOWS: usize = 6;

/// Core `c`'s packet `i`: 10.0.0.1:(4000 + c * 100 + i % FLOWS) -> 10.0.0.2:(5001 + i / FLOWS % 2).
fn frame(c: usize, i: usize) -> (u16, Vec<u8>) {
    let dport = 5001 + (i / FLOWS % 2) as u16;
    (dport, udp4([10, 0, 0, 1], [10, 0, 0, 2], 4000 + (c * 100 + i % FLOWS) as u16, dport))
}

fn pipeline(kind: ExecKind, rules: &std::path::Path) -> Pipeline {
    let spec = format!("acl(rules={}) -> fsc", rules.display());
    let c = Chain::build(&parse(&spec).unwrap()).unwrap();
    let shared = SharedStores::new(&c.groups, 4096, 3_600_000_000_000).unwrap();
    let cfg = ExecConfig { kind, flows: 4096, hugepages: false, ..ExecConfig::default() };
    Pipeline::new(c, cfg, shared).unwrap()
}

/// Runs each core's packets in batches of `bs`, the swap posted to every core and
/// served before batch `at`; returns each core's verdicts and fsc's flows seen.
fn run(
    kind: ExecKind,
    cores: usize,
    bs: usize,
    at: usize,
    old: &std::path::Path,
    new: &std::path::Path,
) -> Vec<Vec<u16>> {
    let mut pipes: Vec<Pipeline> = (0..cores).map(|_| pipeline(kind, old)).collect();
    let boxes = Mailboxes::new(cores);
    let swap =
        Command::Reconfigure { index: 0, nf: parse(&format!("acl(rules={})", new.display())).unwrap().nfs[0].clone() };
    let mut pool = PacketPool::new(PoolConfig { buffers: 1024, ..Default::default() }).unwrap();
    let mut batch = Batch::new(&pool);
    let mut verdicts = vec![Vec::new(); cores];
    std::thread::scope(|s| {
        let asker = s.spawn(|| boxes.ask(&swap, Duration::from_secs(30)));
        let mut seen = vec![0u64; cores];
        for (b, start) in (0..N).step_by(bs).enumerate() {
            for (c, p) in pipes.iter_mut().enumerate() {
                if b == at {
                    // The request lands here, between two batches, on every core.
                    while seen[c] == 0 {
                        boxes.serve(c, &mut seen[c], p);
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
                for i in start..(start + bs).min(N) {
                    assert!(batch.push_copy(&mut pool, &frame(c, i).1, i as u64 * 1000));
                }
                p.process(&mut batch, &NfContext { now_tsc: 0, now_ns: start as u64 * 1000 });
                verdicts[c].extend_from_slice(batch.verdicts());
                batch.free_all(&mut pool).unwrap();
            }
        }
        let answers = asker.join().unwrap().unwrap();
        assert!(answers.iter().all(|a| matches!(a, Answer::Done)), "{answers:?}");
    });
    for p in &pipes {
        let fsc = p.nf_results().into_iter().find(|r| r.0 == "fsc").unwrap();
        let seen = fsc.2.as_ref().and_then(|d| d["flows_seen"].as_u64());
        // Every flow of this core was created once (its block at its first packet): the swap reset none.
        assert_eq!(seen, Some(2 * FLOWS as u64), "{kind} {cores} cores batch {bs}: fsc {:?}", fsc.2);
    }
    verdicts
}

#[test]
fn an_acl_swap_lands_between_two_batches_on_every_core_under_every_executor() {
    let dir = std::env::temp_dir().join(format!("fp-swap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (old, new) = (dir.join("old.rules"), dir.join("new.rules"));
    std::fs::write(&old, "drop proto udp dport 5001\n").unwrap();
    std::fs::write(&new, "drop proto udp dport 5002\n").unwrap();
    for kind in ExecKind::all() {
        for bs in [1, 4, 64] {
            for cores in [1, 2] {
                let at = (N / bs) / 2;
                let got = run(kind, cores, bs, at, &old, &new);
                for (c, v) in got.iter().enumerate() {
                    // The model: the rule in force at the packet's batch.
                    let want: Vec<u16> = (0..N)
                        .map(|i| {
                            let denied = if i / bs < at { 5001 } else { 5002 };
                            if frame(c, i).0 == denied {
                                DROP
                            } else {
                                0
                            }
                        })
                        .collect();
                    assert_eq!(v, &want, "{kind}, batch {bs}, {cores} cores: core {c}");
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
