//! Drives one `upf` directly (no engine) over a generated UPF trace, so
//! profilers see only the NF: `cargo run --release --example upf_profile --
//! SESSIONS PDRS ul|dl staged|rtc PACKETS [ROUNDS]`. Each round copies the
//! trace into batches of 64 (copying is outside `Upf::process`, so
//! `valgrind --tool=callgrind --toggle-collect='*Upf*process*'` counts the
//! NF alone) and prints TSC cycles per packet inside `process` (best round).

use std::sync::Arc;

use flowplane_bench::upf::{sessions_for, trace};
use flowplane_nf::upf::rules::RuleSet;
use flowplane_nf::upf::{Upf, UpfConfig};
use flowplane_nf::{Nf, NfContext};
use flowplane_packet::{tsc, Batch, PacketPool, PoolConfig};
use flowplane_trace::gen::{UpfDir, UpfPlan};

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let arg = |k: usize, d: &str| a.get(k).cloned().unwrap_or_else(|| d.to_string());
    let sessions: u32 = arg(0, "130000").parse().expect("SESSIONS");
    let pdrs: u32 = arg(1, "16").parse().expect("PDRS");
    let dir = if arg(2, "ul") == "dl" { UpfDir::Downlink } else { UpfDir::Uplink };
    let staged = arg(3, "staged") == "staged";
    let packets: u64 = arg(4, "200000").parse().expect("PACKETS");
    let rounds: usize = arg(5, "5").parse().expect("ROUNDS");
    let plan = UpfPlan { sessions, pdrs, dir: UpfDir::Both };
    let rules = Arc::new(RuleSet::compile(&sessions_for(&plan).sessions).expect("rules"));
    let t = trace(&UpfPlan { dir, ..plan }, packets, 128).expect("trace");
    let mut frames = Vec::with_capacity(t.packets());
    for i in 0..t.packets() {
        let mut f = Vec::new();
        assert!(t.copy_frame(0, i, &mut f));
        frames.push(f);
    }
    let cfg = UpfConfig { staged, usage: false, profile: staged, ..UpfConfig::default() };
    let mut u = Upf::new(cfg, rules);
    let mut pool = PacketPool::new(PoolConfig { buffers: 256, ..Default::default() }).expect("pool");
    let mut b = Batch::new(&pool);
    let ctx = NfContext::default();
    let mut best = f64::MAX;
    for _ in 0..rounds {
        let mut cycles = 0u64;
        for (k, chunk) in frames.chunks(64).enumerate() {
            for (j, f) in chunk.iter().enumerate() {
                assert!(b.push_copy(&mut pool, f, (k * 64 + j) as u64 * 100));
            }
            let n = b.len();
            let t0 = tsc::rdtsc();
            u.process(&mut b, 0..n, &ctx);
            cycles += tsc::rdtsc() - t0;
            b.free_all(&mut pool).expect("free");
        }
        best = best.min(cycles as f64 / frames.len() as f64);
    }
    let c = u.counters();
    // Staged: cycles per packet of each pass over every round (the profile sums them).
    let passes = u.report().and_then(|r| {
        let p = r.get("profile")?;
        let n = p["packets"].as_u64()?.max(1) as f64;
        let c = p["cycles"].as_object()?;
        Some(
            ["parse", "probe", "lookup", "classify", "prepare", "act"]
                .iter()
                .map(|k| format!("{k} {:.1}", c.get(*k).and_then(|v| v.as_u64()).unwrap_or(0) as f64 / n))
                .collect::<Vec<_>>()
                .join(", "),
        )
    });
    println!(
        "{sessions} x {pdrs} {} {}: {best:.1} cycles/packet in process (best of {rounds}); in {} out {}",
        if dir == UpfDir::Downlink { "dl" } else { "ul" },
        if staged { "staged" } else { "rtc" },
        c.packets_in,
        c.packets_out
    );
    if let Some(p) = passes {
        println!("  passes (all rounds): {p}");
    }
}
