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
//! The AMF-like NF (`amf`, 2^17 UEs of 24 cache lines) runs beside it in its
//! three modes (`rtc`: nothing prefetched, `all`: every line of the UE,
//! `staged`: only the lines each message's action touches), and
//! [`UpfReport::plot_png`] draws both.

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
                    FarSpec {
                        id: 1,
                        action: FarAction::Forward,
                        destination: None,
                        ohc_teid: None,
                        ohc_addr: None,
                        tos: None,
                        notify_cp: false,
                    },
                    FarSpec {
                        id: 2,
                        action: FarAction::Forward,
                        destination: None,
                        ohc_teid: Some(UpfPlan::peer_teid(k)),
                        ohc_addr: Some(Ipv4Addr::from(UpfPlan::gnb(k))),
                        tos: None,
                        notify_cp: false,
                    },
                ],
                qers: (0..plan.pdrs)
                    .map(|j| QerSpec { id: j + 1, qfi: Some(UpfPlan::qfi(j)), ..Default::default() })
                    .collect(),
                urrs: vec![UrrSpec { id: 1, volume_threshold: None, ..Default::default() }],
                bar: None,
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
    /// UEs of the `amf` rows (0: no `amf` rows).
    pub amf_ues: u32,
    /// `amf` modes (`rtc`, `all`, `staged`).
    pub amf_modes: Vec<String>,
    /// Rounds over every row (`--reps`): each row's figure is the median, with min and max.
    pub reps: usize,
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
            amf_ues: 1 << 17,
            amf_modes: vec!["rtc".into(), "all".into(), "staged".into()],
            reps: 1,
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
            amf_ues: 4096,
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
    /// Staged mode: TSC cycles per packet of each pass (parse, probe, lookup, classify, prepare, act).
    pub passes: Vec<(String, f64)>,
    /// `mpps` over `--reps` rounds (None with one).
    pub spread: Option<crate::reps::Spread>,
    /// What the figure rests on and why not to quote it ([`flowplane_engine::trust`]).
    pub trust: crate::reps::Trust,
}

/// One `amf` measurement.
#[derive(Clone, Debug, Serialize)]
pub struct AmfRow {
    /// UE contexts.
    pub ues: u32,
    /// Executor.
    pub exec: String,
    /// `amf` mode.
    pub mode: String,
    /// Million messages per second.
    pub mpps: f64,
    /// TSC cycles per message.
    pub cycles_per_packet: f64,
    /// Messages dropped / messages seen (0: every message found its UE and was well formed).
    pub dropped: f64,
    /// Throughput relative to the `rtc` mode row of the same executor.
    pub vs_rtc: Option<f64>,
    /// `mpps` over `--reps` rounds (None with one).
    pub spread: Option<crate::reps::Spread>,
    /// What the figure rests on and why not to quote it ([`flowplane_engine::trust`]).
    pub trust: crate::reps::Trust,
}

/// Every row.
#[derive(Clone, Debug, Serialize)]
pub struct UpfReport {
    /// Rows in run order.
    pub rows: Vec<UpfRow>,
    /// The `amf` rows.
    pub amf: Vec<AmfRow>,
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

/// One measurement's run: one core, `o`'s batch and seconds (half of them, at most 1 s, of warm-up).
fn one_core(o: &UpfBenchOptions, kind: ExecKind) -> RunConfig {
    RunConfig {
        cores: 1,
        batch_size: o.batch,
        loops: None,
        duration: Some(Duration::from_secs_f64(o.seconds)),
        warmup: Some(Duration::from_secs_f64((o.seconds / 2.0).min(1.0))),
        exec: ExecConfig { kind, flows: 4096, ..ExecConfig::default() },
        ..RunConfig::default()
    }
}

/// Runs the UPF benchmark `o.reps` rounds over: each row's figure is the
/// median round's, with min and max; `vs_rtc` compares the medians.
pub fn run_upf(o: &UpfBenchOptions) -> Result<UpfReport, String> {
    let mut amf_rounds: Vec<Vec<AmfRow>> = Vec::new();
    let rows = crate::reps::repeat(
        o.reps,
        |_| {
            let (rows, amf) = once(o)?;
            amf_rounds.push(amf);
            Ok(rows)
        },
        |r| Some(r.mpps),
    )?;
    let mut rounds = amf_rounds.into_iter();
    let amf = crate::reps::repeat(o.reps, |_| Ok(rounds.next().unwrap_or_default()), |r| Some(r.mpps))?;
    let mut rows: Vec<UpfRow> = crate::reps::settle(rows, |r| (&mut r.trust, &mut r.spread));
    let mut amf: Vec<AmfRow> = crate::reps::settle(amf, |r| (&mut r.trust, &mut r.spread));
    let base: Vec<(u32, &'static str, String, f64)> =
        rows.iter().filter(|r| r.mode == "rtc").map(|r| (r.pdrs, r.dir, r.exec.clone(), r.mpps)).collect();
    for r in &mut rows {
        r.vs_rtc = base
            .iter()
            .find(|b| b.0 == r.pdrs && b.1 == r.dir && b.2 == r.exec)
            .filter(|b| b.3 > 0.0)
            .map(|b| r.mpps / b.3);
    }
    let base: Vec<(String, f64)> = amf.iter().filter(|r| r.mode == "rtc").map(|r| (r.exec.clone(), r.mpps)).collect();
    for r in &mut amf {
        r.vs_rtc = base.iter().find(|b| b.0 == r.exec).filter(|b| b.1 > 0.0).map(|b| r.mpps / b.1);
    }
    Ok(UpfReport { rows, amf })
}

/// One round: the UPF rows and the `amf` rows (ratios are filled in by [`run_upf`]).
fn once(o: &UpfBenchOptions) -> Result<(Vec<UpfRow>, Vec<AmfRow>), String> {
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
                    let r = run(&one_core(o, kind), &spec, t.clone(), Output::Discard).map_err(|e| e.to_string())?;
                    let nf = r.nfs.iter().find(|n| n.name == "upf");
                    let forwarded =
                        nf.map_or(0.0, |n| n.counters.packets_out as f64 / n.counters.packets_in.max(1) as f64);
                    let prof = nf.and_then(|n| n.details.as_ref()).and_then(|d| d.get("profile"));
                    let timed = prof.and_then(|p| p["packets"].as_u64()).unwrap_or(0).max(1) as f64;
                    let passes = prof
                        .and_then(|p| p["cycles"].as_object())
                        .map(|c| {
                            ["parse", "probe", "lookup", "classify", "prepare", "act"]
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
                        spread: None,
                        trust: r.trust.clone(),
                    });
                }
            }
        }
        drop(ctl);
    }
    let amf = run_amf(o, &execs)?;
    Ok((rows, amf))
}

/// The `amf` rows: `o.amf_ues` UEs, one UE per flow of a generated AMF
/// trace (every message type, each UE's messages in order), per executor and mode.
fn run_amf(o: &UpfBenchOptions, execs: &[ExecKind]) -> Result<Vec<AmfRow>, String> {
    if o.amf_ues == 0 || o.amf_modes.is_empty() {
        return Ok(Vec::new());
    }
    let cfg = GenConfig {
        flows: u64::from(o.amf_ues),
        packets: o.packets,
        size: SizeSpec::Fixed(o.size),
        dist: FlowDist::Uniform,
        order: Order::Random,
        proto: Proto::Amf,
        seed: 13,
        ..GenConfig::default()
    };
    let gen = Generator::new(cfg).map_err(|e| e.to_string())?;
    let dispatch = RssDispatcher::new(1, false).map_err(|e| e.to_string())?;
    let t = load_generated(gen, &dispatch).map_err(|e| e.to_string())?.0;
    let mut rows: Vec<AmfRow> = Vec::new();
    for &kind in execs {
        for mode in &o.amf_modes {
            let spec = spec::parse(&format!("amf(ues={}, mode={mode})", o.amf_ues)).map_err(|e| e.to_string())?;
            let r = run(&one_core(o, kind), &spec, t.clone(), Output::Discard).map_err(|e| e.to_string())?;
            let nf = r.nfs.iter().find(|n| n.name == "amf");
            let dropped = nf.map_or(1.0, |n| n.counters.dropped as f64 / n.counters.packets_in.max(1) as f64);
            rows.push(AmfRow {
                ues: o.amf_ues,
                exec: kind.name().to_string(),
                mode: mode.clone(),
                mpps: r.mpps,
                cycles_per_packet: r.cycles_per_packet,
                dropped,
                vs_rtc: None,
                spread: None,
                trust: r.trust.clone(),
            });
        }
    }
    Ok(rows)
}

impl UpfReport {
    /// Writes a PNG: on the left Mpps against PDRs per session (a tick at every count measured), the executor by
    /// colour, the direction by line style (uplink solid, downlink dashed), the UPF mode by marker (rtc circle,
    /// staged triangle); on the right the `amf` rows, one group of bars per executor (its name under the group),
    /// one bar per `amf` mode with its figure above it; one legend between the two panels, over no data.
    pub fn plot_png(&self, path: &std::path::Path) -> Result<(), String> {
        use crate::plot::Sample;
        use plotters::prelude::*;
        if !crate::plot::register_font() {
            return Err("no TrueType font found for the plot's text (install fonts-dejavu-core)".to_string());
        }
        let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
        fn distinct<'a>(it: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
            it.fold(Vec::new(), |mut v, x| {
                if !v.contains(&x) {
                    v.push(x);
                }
                v
            })
        }
        let execs = distinct(self.rows.iter().map(|r| r.exec.as_str()).chain(self.amf.iter().map(|r| r.exec.as_str())));
        let colour = |e: &str| crate::plot::colour(execs.iter().position(|x| *x == e).unwrap_or(0));
        let root = BitMapBackend::new(path, (1800, 820)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        crate::plot::footer(&root, true).map_err(|e| err(&e))?;
        let root = root.margin(0, 22, 0, 0);
        let (left, rest) = root.split_horizontally(980);
        let (legend, right) = rest.split_horizontally(360);
        let mut entries: Vec<(Sample, String)> = vec![(Sample::Heading, "executor (colour)".to_string())];
        entries.extend(execs.iter().map(|e| (Sample::Series(colour(e)), e.to_string())));

        let mut pdrs: Vec<u32> = self.rows.iter().map(|r| r.pdrs).collect();
        pdrs.sort_unstable();
        pdrs.dedup();
        if !self.rows.is_empty() {
            let pmax = pdrs.last().copied().unwrap_or(1);
            let ymax = self
                .rows
                .iter()
                .map(|r| r.spread.as_ref().map_or(r.mpps, |s| s.max.max(r.mpps)))
                .fold(1.0f64, f64::max)
                * 1.1;
            let keys = pdrs.clone();
            let mut chart = ChartBuilder::on(&left)
                .caption(
                    format!(
                        "UPF, one core, {} sessions: Mpps vs PDRs per session{}",
                        self.rows[0].sessions,
                        crate::plot::flagged_note(self.rows.iter().any(|r| !r.trust.ok()))
                    ),
                    ("sans-serif", 20),
                )
                .margin(16)
                .x_label_area_size(44)
                .y_label_area_size(60)
                .build_cartesian_2d((0u32..pmax + 1).with_key_points(keys), 0.0..ymax)
                .map_err(|e| err(&e))?;
            chart
                .configure_mesh()
                .x_desc("PDRs per session (each direction)")
                .y_desc("Mpps")
                .draw()
                .map_err(|e| err(&e))?;
            let series = distinct(self.rows.iter().map(|r| r.dir))
                .into_iter()
                .flat_map(|d| execs.iter().flat_map(move |e| ["rtc", "staged"].into_iter().map(move |m| (d, *e, m))));
            for (dir, exec, mode) in series {
                let mine: Vec<&UpfRow> =
                    self.rows.iter().filter(|r| r.dir == dir && r.exec == exec && r.mode == mode).collect();
                if mine.is_empty() {
                    continue;
                }
                let c = colour(exec);
                let pts: Vec<(u32, f64)> = mine.iter().map(|r| (r.pdrs, r.mpps)).collect();
                if dir == "ul" {
                    chart.draw_series(LineSeries::new(pts, c.stroke_width(2))).map_err(|e| err(&e))?;
                } else {
                    chart.draw_series(DashedLineSeries::new(pts, 9, 5, c.stroke_width(2))).map_err(|e| err(&e))?;
                }
                for r in &mine {
                    let at = (r.pdrs, r.mpps);
                    let fill = if r.trust.ok() { c.filled() } else { WHITE.filled() };
                    if let Some(s) = &r.spread {
                        let bar = PathElement::new(vec![(at.0, s.min), (at.0, s.max)], c.stroke_width(1));
                        chart.draw_series([bar]).map_err(|e| err(&e))?;
                    }
                    if mode == "staged" {
                        chart.draw_series([TriangleMarker::new(at, 7, fill)]).map_err(|e| err(&e))?;
                        chart.draw_series([TriangleMarker::new(at, 7, c.stroke_width(2))]).map_err(|e| err(&e))?;
                    } else {
                        chart.draw_series([Circle::new(at, 5, fill)]).map_err(|e| err(&e))?;
                        chart.draw_series([Circle::new(at, 5, c.stroke_width(2))]).map_err(|e| err(&e))?;
                    }
                }
            }
            entries.extend([
                (Sample::Heading, String::new()),
                (Sample::Heading, "direction (line)".to_string()),
                (Sample::Line(BLACK), "uplink (GTP-U decapsulation)".to_string()),
                (Sample::Dashed(BLACK), "downlink (encapsulation)".to_string()),
                (Sample::Heading, "UPF mode (marker)".to_string()),
                (Sample::Series(BLACK), "rtc: one packet at a time".to_string()),
                (Sample::SeriesTriangle(BLACK), "staged: a batch's lookups overlap".to_string()),
            ]);
        }

        // AMF: one group of bars per executor, one bar per mode; the executor's name under its group.
        let amf_execs = distinct(self.amf.iter().map(|r| r.exec.as_str()));
        let modes = distinct(self.amf.iter().map(|r| r.mode.as_str()));
        if !self.amf.is_empty() {
            let ues = self.amf[0].ues;
            let top =
                self.amf.iter().map(|r| r.spread.as_ref().map_or(r.mpps, |s| s.max.max(r.mpps))).fold(0.1f64, f64::max);
            // x in hundredths of a group (integer coordinates take chosen label points): group g's centre is 100 g + 50.
            let keys: Vec<u32> = (0..amf_execs.len() as u32).map(|g| 100 * g + 50).collect();
            let mut bars = ChartBuilder::on(&right)
                .caption(format!("amf, {ues} UEs, one core"), ("sans-serif", 20))
                .margin(16)
                .x_label_area_size(44)
                .y_label_area_size(60)
                .build_cartesian_2d((0u32..100 * amf_execs.len() as u32).with_key_points(keys), 0.0..top * 1.2)
                .map_err(|e| err(&e))?;
            bars.configure_mesh()
                .disable_x_mesh()
                .x_label_formatter(&|x| amf_execs.get((*x / 100) as usize).map_or(String::new(), |e| e.to_string()))
                .x_desc("executor")
                .y_desc("million messages/s")
                .draw()
                .map_err(|e| err(&e))?;
            let w = 80 / modes.len().max(1) as u32;
            let shade = |m: usize| crate::plot::colour(5 + m % 3);
            for (g, e) in amf_execs.iter().enumerate() {
                for (m, mode) in modes.iter().enumerate() {
                    let Some(r) = self.amf.iter().find(|r| r.exec == *e && r.mode == *mode) else { continue };
                    let x0 = 100 * g as u32 + 10 + m as u32 * w;
                    let c = shade(m);
                    let fill = if r.trust.ok() { c.filled() } else { WHITE.filled() };
                    bars.draw_series([Rectangle::new([(x0, 0.0), (x0 + w * 9 / 10, r.mpps)], fill)])
                        .map_err(|e| err(&e))?;
                    bars.draw_series([Rectangle::new([(x0, 0.0), (x0 + w * 9 / 10, r.mpps)], c.stroke_width(1))])
                        .map_err(|e| err(&e))?;
                    if let Some(s) = &r.spread {
                        let mid = x0 + w * 9 / 20;
                        bars.draw_series([PathElement::new(vec![(mid, s.min), (mid, s.max)], BLACK.stroke_width(2))])
                            .map_err(|e| err(&e))?;
                    }
                    let label = Text::new(format!("{:.1}", r.mpps), (x0, r.mpps + top * 0.03), ("sans-serif", 13));
                    bars.draw_series([label]).map_err(|e| err(&e))?;
                }
            }
            entries.extend([(Sample::Heading, String::new()), (Sample::Heading, "amf mode (bar, right)".to_string())]);
            let about = |m: &str| match m {
                "staged" => "staged: prefetch what each message touches".to_string(),
                "all" => "all: prefetch all 24 lines".to_string(),
                "rtc" => "rtc: no prefetch".to_string(),
                other => other.to_string(),
            };
            entries.extend(modes.iter().enumerate().map(|(m, mode)| (Sample::Bar(shade(m)), about(mode))));
        }
        entries.extend([
            (Sample::Heading, String::new()),
            (Sample::Hollow, "flagged: not to quote".to_string()),
            (Sample::Range, "min-max over --reps".to_string()),
        ]);
        crate::plot::side_legend(&legend, &entries).map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
        Ok(())
    }
}

impl fmt::Display for UpfReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "UPF, one core: sessions x PDRs, uplink (GTP-U decap) / downlink (encap), per executor and UPF mode"
        )?;
        writeln!(
            f,
            "{:>8} {:>5} {:>4} {:>11} {:>7} {:>8} {:>13} {:>11} {:>10} {:>7}",
            "sessions", "pdrs", "dir", "executor", "mode", "Mpps", "min-max", "cycles/pkt", "forwarded", "vs rtc"
        )?;
        for r in &self.rows {
            let v = r.vs_rtc.map_or("-".to_string(), |x| format!("{x:.2}x"));
            writeln!(
                f,
                "{:>8} {:>5} {:>4} {:>11} {:>7} {:>8.2} {:>13} {:>11.1} {:>9.1}% {:>7}{}",
                r.sessions,
                r.pdrs,
                r.dir,
                r.exec,
                r.mode,
                r.mpps,
                r.spread.as_ref().map_or("-".to_string(), |x| x.cell(2)),
                r.cycles_per_packet,
                r.forwarded * 100.0,
                v,
                r.trust.cell()
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
        if !self.amf.is_empty() {
            writeln!(f, "\namf (state-heavy NF, 24-line UE contexts), one core, per executor and mode:")?;
            writeln!(
                f,
                "{:>8} {:>11} {:>7} {:>8} {:>13} {:>11} {:>9} {:>7}",
                "UEs", "executor", "mode", "Mpps", "min-max", "cycles/pkt", "dropped", "vs rtc"
            )?;
            for r in &self.amf {
                let v = r.vs_rtc.map_or("-".to_string(), |x| format!("{x:.2}x"));
                writeln!(
                    f,
                    "{:>8} {:>11} {:>7} {:>8.2} {:>13} {:>11.1} {:>8.1}% {:>7}{}",
                    r.ues,
                    r.exec,
                    r.mode,
                    r.mpps,
                    r.spread.as_ref().map_or("-".to_string(), |x| x.cell(2)),
                    r.cycles_per_packet,
                    r.dropped * 100.0,
                    v,
                    r.trust.cell()
                )?;
            }
        }
        if let Some(n) =
            crate::reps::footnote(self.rows.iter().map(|r| &r.trust).chain(self.amf.iter().map(|r| &r.trust)))
        {
            writeln!(f, "{n}")?;
        }
        writeln!(f, "\nwhere the cycles go (staged rows; TSC cycles per packet of each pass, whole batches timed):")?;
        writeln!(
            f,
            "{:>8} {:>5} {:>4} {:>11} {:>7} {:>7} {:>7} {:>9} {:>7} {:>7}",
            "sessions", "pdrs", "dir", "executor", "parse", "probe", "lookup", "classify", "prepare", "act"
        )?;
        for r in self.rows.iter().filter(|r| !r.passes.is_empty()) {
            write!(f, "{:>8} {:>5} {:>4} {:>11}", r.sessions, r.pdrs, r.dir, r.exec)?;
            for (k, (_, c)) in r.passes.iter().enumerate() {
                let w = if k == 3 { 9 } else { 7 };
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
            amf_ues: 2048,
            ..UpfBenchOptions::default()
        };
        let r = run_upf(&o).unwrap();
        assert_eq!(r.rows.len(), 4);
        // The amf rows: every mode, every message to a known UE, each mode against rtc.
        assert_eq!(r.amf.iter().map(|a| a.mode.as_str()).collect::<Vec<_>>(), ["rtc", "all", "staged"]);
        for a in &r.amf {
            assert!(a.mpps > 0.0 && a.dropped == 0.0 && a.vs_rtc.is_some(), "{a:?}");
        }
        assert!(r.to_string().contains("amf (state-heavy NF"));
        // The plot: a PNG file (or, without a font on the machine, an error that says so).
        let png = std::env::temp_dir().join(format!("flowplane-upf-{}.png", std::process::id()));
        match r.plot_png(&png) {
            Ok(()) => assert_eq!(&std::fs::read(&png).unwrap()[1..4], b"PNG"),
            Err(e) => assert!(e.contains("font"), "{e}"),
        }
        let _ = std::fs::remove_file(&png);
        for row in &r.rows {
            assert!(row.mpps > 0.0, "{row:?}");
            assert_eq!(row.forwarded, 1.0, "{row:?}");
        }
        assert!(r.rows.iter().all(|x| x.vs_rtc.is_some()));
        assert!(r.to_string().contains("staged"));
        // Staged rows say where the cycles went, pass by pass; rtc rows are not timed.
        for row in &r.rows {
            if row.mode == "staged" {
                assert_eq!(row.passes.len(), 6, "{row:?}");
                assert!(row.passes.iter().all(|(_, c)| *c > 0.0), "{row:?}");
            } else {
                assert!(row.passes.is_empty(), "{row:?}");
            }
        }
        assert!(r.to_string().contains("where the cycles go"));
    }
}
