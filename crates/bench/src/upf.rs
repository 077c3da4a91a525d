//! The UPF workload: the session file that goes with a generated UPF trace
//! (`flowplane upf sessions`, [`sessions_for`]) — built from the same plan
//! functions as the generator's `--upf` mode, so trace and rules agree —
//! and `flowplane bench upf` ([`run_upf`]): one core, in-memory replay,
//! N sessions x M PDRs (GuNFu's UPF experiment: 130K sessions, 1-16 PDRs),
//! uplink and downlink, for each registered executor and each UPF mode
//! (`staged`: the batch's lookups overlap, prefetched pass by pass; `rtc`:
//! each packet to completion). The `upf` is a batch element, so with a
//! chain of only the `upf` every executor hands it the same batches: the
//! executor rows differ only by noise, the mode rows show the prefetching.

use std::fmt;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use flowplane_engine::exec::{ExecConfig, ExecKind};
use flowplane_engine::load::load_generated;
use flowplane_engine::runner::Output;
use flowplane_engine::{run, spec, RunConfig};
use flowplane_io::replay::ReplayTrace;
use flowplane_nf::upf::control::{self, UpfControl};
use flowplane_nf::upf::rules::{
    FarAction, FarSpec, Iface, PdrSpec, QerSpec, RuleSet, SessionSpec, SessionsFile, UrrSpec,
};
use flowplane_scale::RssDispatcher;
use flowplane_trace::gen::{FlowDist, GenConfig, Generator, Order, Proto, SizeSpec, UpfDir, UpfPlan};
use serde::Serialize;

/// The sessions of `plan`: per session `k`, UE 10.0.0.0/8 + k + 1, uplink
/// TEID k + 1; M uplink PDRs (F-TEID, QFI, SDF of PDR j, outer-header
/// removal, FAR 1 forward to the core) and M downlink PDRs (same SDF, FAR 2
/// with outer-header creation to the session's gNB and peer TEID, QER j + 1
/// marking the PDR's QFI); every PDR counts into URR 1.
pub fn sessions_for(plan: &UpfPlan) -> SessionsFile {
    let sessions = (0..plan.sessions)
        .map(|k| {
            let mut pdrs = Vec::with_capacity(2 * plan.pdrs as usize);
            for (source, base) in [(Iface::Access, 0u16), (Iface::Core, 1000)] {
                for j in 0..plan.pdrs {
                    let ul = source == Iface::Access;
                    pdrs.push(PdrSpec {
                        id: base + j as u16 + 1,
                        precedence: UpfPlan::precedence(j),
                        source,
                        teid: ul.then(|| UpfPlan::teid(k)),
                        ue_ip: true,
                        qfi: ul.then(|| UpfPlan::qfi(j)),
                        sdf: vec![UpfPlan::sdf(j)],
                        outer_header_removal: ul,
                        far: if ul { 1 } else { 2 },
                        qers: if ul { Vec::new() } else { vec![j + 1] },
                        urrs: vec![1],
                    });
                }
            }
            SessionSpec {
                seid: u64::from(k) + 1,
                ue_ipv4: Some(Ipv4Addr::from(UpfPlan::ue(k))),
                ue_ipv6: None,
                pdrs,
                fars: vec![
                    FarSpec { id: 1, action: FarAction::Forward, destination: None, ohc_teid: None, ohc_addr: None },
                    FarSpec {
                        id: 2,
                        action: FarAction::Forward,
                        destination: None,
                        ohc_teid: Some(UpfPlan::peer_teid(k)),
                        ohc_addr: Some(Ipv4Addr::from(UpfPlan::gnb(k))),
                    },
                ],
                qers: (0..plan.pdrs)
                    .map(|j| QerSpec { id: j + 1, qfi: Some(UpfPlan::qfi(j)), ..Default::default() })
                    .collect(),
                urrs: vec![UrrSpec { id: 1, volume_threshold: None }],
            }
        })
        .collect();
    SessionsFile { sessions }
}

/// What `flowplane bench upf` measures.
#[derive(Clone, Debug)]
pub struct UpfBenchOptions {
    /// Sessions.
    pub sessions: u32,
    /// PDR counts per session and direction.
    pub pdrs: Vec<u32>,
    /// Directions.
    pub dirs: Vec<UpfDir>,
    /// Executors by name (empty: every registered executor).
    pub execs: Vec<String>,
    /// UPF modes (`staged`, `rtc`).
    pub modes: Vec<String>,
    /// Packets in each trace (replayed in a loop).
    pub packets: u64,
    /// Frame size (uplink frames carry the GTP-U headers within it).
    pub size: u16,
    /// Seconds per measurement.
    pub seconds: f64,
    /// Packets per batch.
    pub batch: usize,
}

impl Default for UpfBenchOptions {
    fn default() -> Self {
        UpfBenchOptions {
            sessions: 130_000,
            pdrs: vec![1, 4, 8, 16],
            dirs: vec![UpfDir::Uplink, UpfDir::Downlink],
            execs: Vec::new(),
            modes: vec!["rtc".into(), "staged".into()],
            packets: 1_000_000,
            size: 128,
            seconds: 2.0,
            batch: 64,
        }
    }
}

impl UpfBenchOptions {
    /// Small and short (CI smoke run).
    pub fn quick() -> Self {
        UpfBenchOptions {
            sessions: 2_000,
            pdrs: vec![1, 4],
            packets: 50_000,
            seconds: 0.2,
            ..UpfBenchOptions::default()
        }
    }
}

/// One measurement.
#[derive(Clone, Debug, Serialize)]
pub struct UpfRow {
    /// Sessions.
    pub sessions: u32,
    /// PDRs per session and direction.
    pub pdrs: u32,
    /// `ul` or `dl`.
    pub dir: &'static str,
    /// Executor.
    pub exec: String,
    /// UPF mode.
    pub mode: String,
    /// Million packets per second.
    pub mpps: f64,
    /// TSC cycles per packet.
    pub cycles_per_packet: f64,
    /// Packets the UPF forwarded / packets it saw (1.0: every packet matched its PDR).
    pub forwarded: f64,
    /// Throughput relative to the `rtc` mode row of the same PDRs, direction and executor.
    pub vs_rtc: Option<f64>,
    /// Staged mode: TSC cycles per packet of each pass (parse, lookup, classify, prepare, act).
    pub passes: Vec<(String, f64)>,
}

/// Every row.
#[derive(Clone, Debug, Serialize)]
pub struct UpfReport {
    /// Rows in run order.
    pub rows: Vec<UpfRow>,
}

/// The generated trace of `plan` (`packets` frames of `size` bytes, flows in random order), on one queue.
pub fn trace(plan: &UpfPlan, packets: u64, size: u16) -> Result<Arc<ReplayTrace>, String> {
    let cfg = GenConfig {
        flows: plan.flows(),
        packets,
        size: SizeSpec::Fixed(size),
        dist: FlowDist::Uniform,
        order: Order::Random,
        proto: Proto::Gtpu,
        seed: 11,
        upf: Some(*plan),
        ..GenConfig::default()
    };
    let gen = Generator::new(cfg).map_err(|e| e.to_string())?;
    let dispatch = RssDispatcher::new(1, false).map_err(|e| e.to_string())?;
    Ok(load_generated(gen, &dispatch).map_err(|e| e.to_string())?.0)
}

/// Runs the UPF benchmark.
pub fn run_upf(o: &UpfBenchOptions) -> Result<UpfReport, String> {
    let execs: Vec<ExecKind> = if o.execs.is_empty() {
        ExecKind::all().collect()
    } else {
        o.execs.iter().map(|e| ExecKind::parse(e).map_err(|e| e.to_string())).collect::<Result<_, _>>()?
    };
    let dir_name = |d: UpfDir| match d {
        UpfDir::Uplink => "ul",
        UpfDir::Downlink => "dl",
        UpfDir::Both => "both",
    };
    let mut rows = Vec::new();
    for &m in &o.pdrs {
        let plan = UpfPlan { sessions: o.sessions, pdrs: m, dir: UpfDir::Both };
        plan.validate().map_err(|e| e.to_string())?;
        // Compiled in-process: 130K sessions x 32 PDRs would be a ~1 GB session file.
        let rules = RuleSet::compile(&sessions_for(&plan).sessions)?;
        let ctl = UpfControl::new(Arc::new(rules));
        let name = format!("bench-upf-{m}");
        control::register(&name, &ctl);
        for &dir in &o.dirs {
            let t = trace(&UpfPlan { dir, ..plan }, o.packets, o.size)?;
            for &kind in &execs {
                for mode in &o.modes {
                    // Staged rows time their passes (a TSC read per pass per batch).
                    let profile = mode == "staged";
                    let chain = format!("upf(rules={name}, mode={mode}, usage=false, profile={profile})");
                    let spec = spec::parse(&chain).map_err(|e| e.to_string())?;
                    let cfg = RunConfig {
                        cores: 1,
                        batch_size: o.batch,
                        loops: None,
                        duration: Some(Duration::from_secs_f64(o.seconds)),
                        warmup: Some(Duration::from_secs_f64((o.seconds / 2.0).min(1.0))),
                        exec: ExecConfig { kind, flows: 4096, ..ExecConfig::default() },
                        ..RunConfig::default()
                    };
                    let r = run(&cfg, &spec, t.clone(), Output::Discard).map_err(|e| e.to_string())?;
                    let nf = r.nfs.iter().find(|n| n.name == "upf");
                    let forwarded =
                        nf.map_or(0.0, |n| n.counters.packets_out as f64 / n.counters.packets_in.max(1) as f64);
                    let prof = nf.and_then(|n| n.details.as_ref()).and_then(|d| d.get("profile"));
                    let timed = prof.and_then(|p| p["packets"].as_u64()).unwrap_or(0).max(1) as f64;
                    let passes = prof
                        .and_then(|p| p["cycles"].as_object())
                        .map(|c| {
                            ["parse", "lookup", "classify", "prepare", "act"]
                                .iter()
                                .map(|k| {
                                    (k.to_string(), c.get(*k).and_then(|v| v.as_u64()).unwrap_or(0) as f64 / timed)
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    rows.push(UpfRow {
                        sessions: o.sessions,
                        pdrs: m,
                        dir: dir_name(dir),
                        exec: kind.name().to_string(),
                        mode: mode.clone(),
                        mpps: r.mpps,
                        cycles_per_packet: r.cycles_per_packet,
                        forwarded,
                        vs_rtc: None,
                        passes,
                    });
                }
            }
        }
        drop(ctl);
    }
    let base: Vec<(u32, &'static str, String, f64)> =
        rows.iter().filter(|r| r.mode == "rtc").map(|r| (r.pdrs, r.dir, r.exec.clone(), r.mpps)).collect();
    for r in &mut rows {
        r.vs_rtc = base
            .iter()
            .find(|b| b.0 == r.pdrs && b.1 == r.dir && b.2 == r.exec)
            .filter(|b| b.3 > 0.0)
            .map(|b| r.mpps / b.3);
    }
    Ok(UpfReport { rows })
}

impl fmt::Display for UpfReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "UPF, one core: sessions x PDRs, uplink (GTP-U decap) / downlink (encap), per executor and UPF mode"
        )?;
        writeln!(
            f,
            "{:>8} {:>5} {:>4} {:>11} {:>7} {:>8} {:>11} {:>10} {:>7}",
            "sessions", "pdrs", "dir", "executor", "mode", "Mpps", "cycles/pkt", "forwarded", "vs rtc"
        )?;
        for r in &self.rows {
            let v = r.vs_rtc.map_or("-".to_string(), |x| format!("{x:.2}x"));
            writeln!(
                f,
                "{:>8} {:>5} {:>4} {:>11} {:>7} {:>8.2} {:>11.1} {:>9.1}% {:>7}",
                r.sessions,
                r.pdrs,
                r.dir,
                r.exec,
                r.mode,
                r.mpps,
                r.cycles_per_packet,
                r.forwarded * 100.0,
                v
            )?;
        }
        // The headline: the best row of each PDR count and direction against
        // the honest baseline, the `rtc` executor with the UPF in `rtc` mode.
        let mut keys: Vec<(u32, &str)> = self.rows.iter().map(|r| (r.pdrs, r.dir)).collect();
        keys.dedup();
        for (pdrs, dir) in keys {
            let of = |r: &&UpfRow| r.pdrs == pdrs && r.dir == dir;
            let base = self.rows.iter().filter(of).find(|r| r.exec == "rtc" && r.mode == "rtc");
            let best = self.rows.iter().filter(of).max_by(|a, b| a.mpps.total_cmp(&b.mpps));
            if let (Some(base), Some(best)) = (base, best) {
                if base.mpps > 0.0 {
                    writeln!(
                        f,
                        "{pdrs} PDRs {dir}: best {} / {} {:.2} Mpps = {:.2}x rtc / rtc ({:.2} Mpps)",
                        best.exec,
                        best.mode,
                        best.mpps,
                        best.mpps / base.mpps,
                        base.mpps
                    )?;
                }
            }
        }
        writeln!(f, "\nwhere the cycles go (staged rows; TSC cycles per packet of each pass, whole batches timed):")?;
        writeln!(
            f,
            "{:>8} {:>5} {:>4} {:>11} {:>7} {:>7} {:>9} {:>7} {:>7}",
            "sessions", "pdrs", "dir", "executor", "parse", "lookup", "classify", "prepare", "act"
        )?;
        for r in self.rows.iter().filter(|r| !r.passes.is_empty()) {
            write!(f, "{:>8} {:>5} {:>4} {:>11}", r.sessions, r.pdrs, r.dir, r.exec)?;
            for (k, (_, c)) in r.passes.iter().enumerate() {
                let w = if k == 2 { 9 } else { 7 };
                write!(f, " {c:>w$.1}")?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_bench_forwards_everything() {
        let o = UpfBenchOptions {
            sessions: 500,
            pdrs: vec![4],
            execs: vec!["batch".into()],
            packets: 20_000,
            seconds: 0.05,
            ..UpfBenchOptions::default()
        };
        let r = run_upf(&o).unwrap();
        assert_eq!(r.rows.len(), 4);
        for row in &r.rows {
            assert!(row.mpps > 0.0, "{row:?}");
            assert_eq!(row.forwarded, 1.0, "{row:?}");
        }
        assert!(r.rows.iter().all(|x| x.vs_rtc.is_some()));
        assert!(r.to_string().contains("staged"));
        // Staged rows say where the cycles went, pass by pass; rtc rows are not timed.
        for row in &r.rows {
            if row.mode == "staged" {
                assert_eq!(row.passes.len(), 5, "{row:?}");
                assert!(row.passes.iter().all(|(_, c)| *c > 0.0), "{row:?}");
            } else {
                assert!(row.passes.is_empty(), "{row:?}");
            }
        }
        assert!(r.to_string().contains("where the cycles go"));
    }
}
