//! `flowplane bench scr`: state-compute replication against sharding and
//! shared state, the SCR paper's experiments on this runtime.
//!
//! - **Scaling** (Fig. 6/7 shape): per program (Table 1: ddos, hh,
//!   portknock, ratelimit as the token-bucket policer, conntrack) and trace
//!   (`single`, `univdc`, `backbone`, `hyperscale`: `flowplane gen
//!   --profile`), throughput against cores for rss, shared and scr. One and
//!   two cores are real runs, more are `--virtual-cores` projections.
//!   Figures are the workers' own busy time (packets / the busiest worker's
//!   batch cycles without the NIC emulation's; the sequencer's history
//!   prefixing counts as the NIC's), the median of `reps` rounds over the
//!   whole suite, with min and max (issue 35: one convention for every suite).
//! - **Compute limit** (Fig. 9): `burn(iters=N)` on one flow, scr at each
//!   core count, N growing: scaling fades as replicated compute overtakes dispatch.
//! - **Loss recovery** (Fig. 10): portknock on `univdc`, scr on the real
//!   cores, recovery off, then on at 0, 0.01, 0.1 and 1% injected loss;
//!   whether the replicas ended identical.
//!
//! Every scr row says whether its replicas ended identical (digests).

use std::path::{Path, PathBuf};

use flowplane_engine::exec::ExecConfig;
use flowplane_engine::runner::{prepare, run_prepared, Input, Output};
use flowplane_engine::scr::ScrConfig;
use flowplane_engine::spec;
use flowplane_engine::{Report, RunConfig};
use flowplane_trace::gen::{GenConfig, Generator};
use serde::Serialize;

use crate::reps::{Spread, Trust};

/// The programs: (name, chain spec, needs both TCP directions).
pub const PROGRAMS: &[(&str, &str, bool)] = &[
    ("ddos", "ddos", false),
    ("hh", "hh", false),
    ("portknock", "portknock", false),
    ("tbf", "ratelimit(pps=1000000,burst=64)", false),
    ("conntrack", "conntrack", true),
];

/// Traces (generator profiles).
pub const TRACES: &[&str] = &["single", "univdc", "backbone", "hyperscale"];

/// What to measure.
#[derive(Clone, Debug)]
pub struct ScrOptions {
    /// Packets per trace.
    pub packets: u64,
    /// Passes over the trace per run (unless `seconds`).
    pub loops: u64,
    /// Seconds per run instead of `loops` passes (the trace replayed until then): the run length every suite takes.
    pub seconds: Option<f64>,
    /// Rounds over the whole suite (`--reps`): each row's figure is the median, with min and max.
    pub reps: usize,
    /// Worker counts.
    pub cores: Vec<usize>,
    /// Programs (names in [`PROGRAMS`]).
    pub programs: Vec<String>,
    /// Traces (names in [`TRACES`]).
    pub traces: Vec<String>,
    /// Strategies.
    pub strategies: Vec<String>,
    /// Compute rounds for the Fig. 9 sweep.
    pub burn: Vec<u32>,
    /// Loss rates for the Fig. 10 sweep.
    pub losses: Vec<f64>,
    /// `flowplane mlffr` per real-core configuration, with trials of this
    /// length (None: not measured; projected rows never: a paced run of
    /// logical workers taking turns is no machine's loss-free rate).
    pub mlffr_trial: Option<std::time::Duration>,
}

impl ScrOptions {
    /// The full experiment, or a small one for a smoke run.
    pub fn new(quick: bool) -> Self {
        ScrOptions {
            packets: if quick { 50_000 } else { 1_000_000 },
            loops: if quick { 2 } else { 3 },
            seconds: None,
            reps: if quick { 1 } else { 3 },
            cores: if quick { vec![1, 2, 4] } else { vec![1, 2, 4, 8, 16] },
            programs: PROGRAMS.iter().map(|p| p.0.to_string()).collect(),
            traces: TRACES.iter().map(|t| t.to_string()).collect(),
            strategies: vec!["rss".into(), "shared".into(), "scr".into()],
            burn: if quick { vec![0, 64] } else { vec![0, 16, 64, 256, 1024] },
            losses: vec![0.0, 0.0001, 0.001, 0.01],
            mlffr_trial: None,
        }
    }
}

/// One measurement.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Row {
    /// Experiment: `scaling`, `compute` or `recovery`.
    pub experiment: String,
    /// Program.
    pub program: String,
    /// Trace.
    pub trace: String,
    /// Strategy.
    pub strategy: String,
    /// Workers.
    pub cores: usize,
    /// Projected from logical workers (`--virtual-cores`).
    pub projected: bool,
    /// Compute rounds (`compute`).
    pub iters: u32,
    /// Injected loss rate and recovery (`recovery`).
    pub loss: f64,
    /// Recovery on.
    pub recovery: bool,
    /// Mpps (workers' busy time; projected above the real cores); None when refused.
    pub mpps: Option<f64>,
    /// Against the same strategy (and program, trace, iters) on one core.
    pub ratio: Option<f64>,
    /// scr: history bytes per packet (on a wire).
    pub history_bytes: Option<usize>,
    /// scr: fast-forward cycles per packet (sampled).
    pub ff_cycles: Option<f64>,
    /// scr: replicas identical at the end.
    pub identical: Option<bool>,
    /// Maximum loss-free forwarding rate (Mpps; `flowplane mlffr`, 0.1% loss, 2% resolution), when asked.
    pub mlffr_mpps: Option<f64>,
    /// Why the runtime refused.
    pub refused: Option<String>,
    /// `mpps` over the repetitions (None with one, or when refused in one).
    pub spread: Option<Spread>,
    /// What the figure rests on and why not to quote it ([`flowplane_engine::trust`]).
    pub trust: Trust,
}

fn gen(trace: &str, packets: u64, both: bool) -> Result<GenConfig, String> {
    let mut g =
        GenConfig { packets, seed: 1, ..GenConfig::default() }.with_profile(trace).map_err(|e| e.to_string())?;
    if both && trace != "hyperscale" {
        g.proto = flowplane_trace::gen::Proto::TcpBidir;
    }
    Ok(g)
}

/// One run's figure: (Mpps, report, MLFFR in Mpps when `mlffr` gives a trial length and the cores are real).
fn measure(
    cfg: &RunConfig,
    chain: &str,
    g: &GenConfig,
    mlffr: Option<std::time::Duration>,
) -> Result<(f64, Report, Option<f64>), String> {
    let spec = spec::parse(chain).map_err(|e| e.to_string())?;
    let gen = Generator::new(g.clone()).map_err(|e| e.to_string())?;
    let p = prepare(cfg, &spec, Input::Generated(Box::new(gen)), false).map_err(|e| e.to_string())?;
    let r = run_prepared(cfg, &spec, &p, Output::Discard).map_err(|e| e.to_string())?;
    let sc = r.scale.as_ref();
    let m = if cfg.virtual_cores.is_some() {
        sc.and_then(|s| s.projected_mpps).unwrap_or(0.0)
    } else {
        sc.map_or(r.mpps, |s| s.busy_mpps)
    };
    let rate = match mlffr {
        Some(trial) if cfg.virtual_cores.is_none() => {
            let mc = flowplane_engine::mlffr::MlffrConfig { trial, resolution: 0.02, ..Default::default() };
            let x = flowplane_engine::mlffr::search(cfg, &spec, &p, &mc).map_err(|e| e.to_string())?;
            Some(x.mlffr_pps / 1e6)
        }
        _ => None,
    };
    Ok((m, r, rate))
}

fn config(n: usize, real: usize, strategy: &str, o: &ScrOptions, scr: ScrConfig) -> RunConfig {
    let projected = n > real;
    RunConfig {
        cores: if projected { 1 } else { n },
        virtual_cores: projected.then_some(n),
        loops: if o.seconds.is_some() { None } else { Some(o.loops) },
        duration: o.seconds.map(std::time::Duration::from_secs_f64),
        scale: strategy.to_string(),
        scr,
        exec: ExecConfig { flows: 1 << 20, default_idle_timeout_ns: 3_600_000_000_000, ..ExecConfig::default() },
        ..RunConfig::default()
    }
}

fn fill(row: &mut Row, res: Result<(f64, Report, Option<f64>), String>) {
    match res {
        Ok((m, r, mlffr)) => {
            row.mpps = Some(m);
            row.trust = r.trust.clone();
            row.mlffr_mpps = mlffr;
            if let Some(s) = &r.scr {
                row.history_bytes = Some(s.history_bytes_per_packet);
                row.ff_cycles = Some(s.ff_cycles_per_packet);
                row.identical = Some(s.consistent && s.comparable);
            }
        }
        Err(e) => row.refused = Some(e),
    }
}

/// Runs the three experiments `o.reps` times over; `progress` sees each
/// row as it is measured. Each row's figure is the median round's; ratios
/// are taken between the medians (scaling and compute rows against the same
/// row on one core, recovery rows against recovery off).
pub fn run_scr(o: &ScrOptions, mut progress: impl FnMut(&Row)) -> Result<Vec<Row>, String> {
    let merged = crate::reps::repeat(o.reps, |_| once(o, &mut progress), |r| r.mpps)?;
    let mut rows: Vec<Row> = crate::reps::settle(merged, |r| (&mut r.trust, &mut r.spread));
    let snapshot = rows.clone();
    for r in rows.iter_mut() {
        let base = if r.experiment == "recovery" {
            snapshot.iter().find(|b| b.experiment == "recovery" && !b.recovery)
        } else {
            snapshot.iter().find(|b| {
                b.experiment == r.experiment
                    && b.program == r.program
                    && b.trace == r.trace
                    && b.strategy == r.strategy
                    && b.iters == r.iters
                    && b.cores == 1
            })
        };
        r.ratio = match (r.mpps, base.and_then(|b| b.mpps)) {
            (Some(m), Some(b)) if b > 0.0 => Some(m / b),
            _ => None,
        };
        // A base row (one core; recovery off) is its own base: its own flags say it all.
        let is_base = if r.experiment == "recovery" { !r.recovery } else { r.cores == 1 };
        if r.refused.is_none() && !is_base {
            // Recovery rows compare equal cores: only a flagged base or a gain past linear is suspect.
            let cores = if r.experiment == "recovery" { 1 } else { r.cores };
            r.trust.speedup(r.ratio, cores, base.is_some_and(|b| b.trust.ok()));
        }
    }
    Ok(rows)
}

/// One round of the three experiments (ratios are filled in by [`run_scr`]).
fn once(o: &ScrOptions, progress: &mut impl FnMut(&Row)) -> Result<Vec<Row>, String> {
    let real = flowplane_io::cpu::available_cores().clamp(1, 2);
    let mut rows = Vec::new();
    let mut push = |row: Row, rows: &mut Vec<Row>| {
        progress(&row);
        rows.push(row);
    };
    for pname in &o.programs {
        let &(_, chain, both) =
            PROGRAMS.iter().find(|p| p.0 == pname).ok_or_else(|| format!("unknown program '{pname}'"))?;
        for t in &o.traces {
            let g = gen(t, o.packets, both)?;
            for s in &o.strategies {
                for &n in &o.cores {
                    let mut row = Row {
                        experiment: "scaling".into(),
                        program: pname.clone(),
                        trace: t.clone(),
                        strategy: s.clone(),
                        cores: n,
                        projected: n > real,
                        ..Row::default()
                    };
                    let cfg = config(n, real, s, o, ScrConfig::default());
                    fill(&mut row, measure(&cfg, chain, &g, o.mlffr_trial));
                    push(row, &mut rows);
                }
            }
        }
    }
    // Fig. 9: growing compute on one flow.
    let g = gen("single", o.packets, false)?;
    for &iters in &o.burn {
        let chain = format!("burn(iters={iters})");
        for &n in &o.cores {
            let mut row = Row {
                experiment: "compute".into(),
                program: "burn".into(),
                trace: "single".into(),
                strategy: "scr".into(),
                cores: n,
                projected: n > real,
                iters,
                ..Row::default()
            };
            let cfg = config(n, real, "scr", o, ScrConfig::default());
            fill(&mut row, measure(&cfg, &chain, &g, o.mlffr_trial));
            push(row, &mut rows);
        }
    }
    // Fig. 10: recovery off, then on at each loss rate, on the real cores.
    let g = gen("univdc", o.packets, false)?;
    let mut cases = vec![(false, 0.0)];
    cases.extend(o.losses.iter().map(|&l| (true, l)));
    for (recovery, loss) in cases {
        let mut row = Row {
            experiment: "recovery".into(),
            program: "portknock".into(),
            trace: "univdc".into(),
            strategy: "scr".into(),
            cores: real,
            loss,
            recovery,
            ..Row::default()
        };
        let cfg = config(real, real, "scr", o, ScrConfig { recovery, loss, seed: 7, ..ScrConfig::default() });
        fill(&mut row, measure(&cfg, "portknock", &g, o.mlffr_trial));
        row.cores = real;
        progress(&row);
        rows.push(row);
    }
    Ok(rows)
}

/// The table.
pub fn table(rows: &[Row]) -> String {
    let mut s = format!(
        "{:<9} {:<10} {:<10} {:<7} {:>5} {:>6} {:>7} {:>9} {:>13} {:>7} {:>8} {:>9} {:>9} {:>7}\n",
        "exp",
        "program",
        "trace",
        "scale",
        "cores",
        "iters",
        "loss%",
        "Mpps",
        "min-max",
        "x1",
        "hist B",
        "ff cyc/p",
        "replicas",
        "MLFFR"
    );
    for r in rows {
        let cores = if r.projected { format!("{}p", r.cores) } else { r.cores.to_string() };
        let loss = if r.experiment == "recovery" {
            if r.recovery {
                format!("{}", r.loss * 100.0)
            } else {
                "off".to_string()
            }
        } else {
            "-".to_string()
        };
        let head = format!(
            "{:<9} {:<10} {:<10} {:<7} {:>5} {:>6} {:>7}",
            r.experiment, r.program, r.trace, r.strategy, cores, r.iters, loss
        );
        match (&r.refused, r.mpps) {
            (Some(e), _) => s.push_str(&format!("{head} refused: {e}\n")),
            (None, m) => s.push_str(&format!(
                "{head} {:>9.2} {:>13} {:>7} {:>8} {:>9} {:>9} {:>7}{}\n",
                m.unwrap_or(0.0),
                r.spread.as_ref().map_or("-".to_string(), |x| x.cell(2)),
                r.ratio.map_or("-".to_string(), |x| format!("{x:.2}")),
                r.history_bytes.map_or("-".to_string(), |b| b.to_string()),
                r.ff_cycles.map_or("-".to_string(), |c| format!("{c:.0}")),
                r.identical.map_or("-", |i| if i { "identical" } else { "DIVERGED" }),
                r.mlffr_mpps.map_or("-".to_string(), |x| format!("{x:.2}")),
                r.trust.cell(),
            )),
        }
    }
    s.push_str("(Mpps: packets / the busiest worker's own busy time, the median of --reps rounds, min-max over them; Np: projected from N logical workers on one core; x1: against the same strategy on 1 core, recovery rows against recovery off; MLFFR: `flowplane mlffr` in Mpps with --mlffr, real cores only)\n");
    if let Some(n) = crate::reps::footnote(rows.iter().map(|r| &r.trust)) {
        s.push_str(&n);
        s.push('\n');
    }
    s
}

/// One PNG per program (Mpps and speed-up against cores per trace and strategy) and one for the compute sweep
/// (per compute cost), see `plot::cores_png`, and `scr-recovery.png` (Fig. 10: Mpps with recovery off, then on at
/// each injected loss rate). Returns the files.
pub fn plot(rows: &[Row], dir: &Path) -> Result<Vec<PathBuf>, String> {
    use crate::plot::{CorePoint, CoreSeries};
    let text = crate::plot::register_font();
    let mut out = Vec::new();
    let mut groups: Vec<(String, String)> = Vec::new();
    for r in rows.iter().filter(|r| r.experiment != "recovery") {
        let g = (r.experiment.clone(), r.program.clone());
        if !groups.contains(&g) {
            groups.push(g);
        }
    }
    for (exp, prog) in &groups {
        let mine: Vec<&Row> =
            rows.iter().filter(|r| &r.experiment == exp && &r.program == prog && r.mpps.is_some()).collect();
        let compute = exp == "compute";
        let key =
            |r: &Row| if compute { format!("iters={}", r.iters) } else { format!("{} / {}", r.trace, r.strategy) };
        let mut keys: Vec<String> = Vec::new();
        for r in &mine {
            if !keys.contains(&key(r)) {
                keys.push(key(r));
            }
        }
        let series: Vec<CoreSeries> = keys
            .iter()
            .map(|k| CoreSeries {
                label: k.clone(),
                points: mine
                    .iter()
                    .filter(|r| &key(r) == k)
                    .map(|r| CorePoint {
                        cores: r.cores as u32,
                        mpps: r.mpps.unwrap_or(0.0),
                        speedup: r.ratio,
                        projected: r.projected,
                        ok: r.trust.ok(),
                        bar: r.spread.as_ref().map(|x| (x.min, x.max)),
                    })
                    .collect(),
            })
            .collect();
        let note = crate::plot::flagged_note(mine.iter().any(|r| !r.trust.ok()));
        let title = if compute {
            format!("SCR compute limit: burn(iters=N) on one flow, scr{note}")
        } else {
            format!("{prog}: throughput vs cores per trace and strategy{note}")
        };
        let path = dir.join(format!("scr-{exp}-{prog}.png"));
        crate::plot::cores_png(&path, &title, &series, text)?;
        out.push(path);
    }
    let recovery: Vec<&Row> = rows.iter().filter(|r| r.experiment == "recovery" && r.mpps.is_some()).collect();
    if !recovery.is_empty() {
        let path = dir.join("scr-recovery.png");
        recovery_png(&path, &recovery, text)?;
        out.push(path);
    }
    Ok(out)
}

/// The loss-recovery PNG (SCR Fig. 10): one bar per case, recovery off (grey) then on at each injected loss rate,
/// with the figure and its ratio to recovery off above each bar, min-max whiskers with `--reps`, flagged bars
/// hollow, and the legend beside the plot.
fn recovery_png(path: &Path, rows: &[&Row], text: bool) -> Result<(), String> {
    use crate::plot::Sample;
    use plotters::prelude::*;
    let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let n = rows.len();
    let top = rows.iter().map(|r| r.spread.as_ref().map_or(r.mpps.unwrap_or(0.0), |s| s.max)).fold(0.1f64, f64::max);
    let root = BitMapBackend::new(path, (1200, 620)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    crate::plot::footer(&root, text).map_err(|e| err(&e))?;
    let root = root.margin(0, 22, 0, 0);
    let (plot, legend) = root.split_horizontally(880);
    let first = rows[0];
    let mut b = ChartBuilder::on(&plot);
    b.margin(16);
    if text {
        let note = crate::plot::flagged_note(rows.iter().any(|r| !r.trust.ok()));
        b.caption(
            format!("SCR loss recovery: {} on {}, {} real cores{note}", first.program, first.trace, first.cores),
            ("sans-serif", 20),
        )
        .x_label_area_size(44)
        .y_label_area_size(60);
    }
    // x in hundredths of a slot (integer coordinates: plotters labels those at chosen points); bar i centred at
    // 100 i + 50.
    let keys: Vec<u32> = (0..n as u32).map(|i| 100 * i + 50).collect();
    let mut chart =
        b.build_cartesian_2d((0u32..100 * n as u32).with_key_points(keys), 0.0..top * 1.25).map_err(|e| err(&e))?;
    let label = |r: &Row| if r.recovery { format!("{}%", r.loss * 100.0) } else { "off".to_string() };
    if text {
        let names: Vec<String> = rows.iter().map(|r| label(r)).collect();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_label_formatter(&|x| names.get((*x / 100) as usize).cloned().unwrap_or_default())
            .x_desc("recovery: off, or on at this injected loss rate")
            .y_desc("Mpps")
            .draw()
            .map_err(|e| err(&e))?;
    } else {
        chart.configure_mesh().disable_x_mesh().disable_y_mesh().draw().map_err(|e| err(&e))?;
    }
    let (off, on) = (RGBColor(150, 150, 150), crate::plot::colour(5));
    for (i, r) in rows.iter().enumerate() {
        let (x, m) = (100 * i as u32, r.mpps.unwrap_or(0.0));
        let c = if r.recovery { on } else { off };
        let fill = if r.trust.ok() { c.filled() } else { WHITE.filled() };
        chart.draw_series([Rectangle::new([(x + 20, 0.0), (x + 80, m)], fill)]).map_err(|e| err(&e))?;
        chart.draw_series([Rectangle::new([(x + 20, 0.0), (x + 80, m)], c.stroke_width(2))]).map_err(|e| err(&e))?;
        if let Some(s) = &r.spread {
            chart
                .draw_series([PathElement::new(vec![(x + 50, s.min), (x + 50, s.max)], BLACK.stroke_width(2))])
                .map_err(|e| err(&e))?;
        }
        if text {
            let ratio = r.ratio.filter(|_| r.recovery).map_or(String::new(), |x| format!(" ({x:.2}x)"));
            let at = (x + 20, m.max(r.spread.as_ref().map_or(0.0, |s| s.max)) + top * 0.04);
            chart.draw_series([Text::new(format!("{m:.2}{ratio}"), at, ("sans-serif", 15))]).map_err(|e| err(&e))?;
        }
    }
    if text {
        let entries = [
            (Sample::Bar(off), "recovery off".to_string()),
            (Sample::Bar(on), "recovery on".to_string()),
            (Sample::Heading, "above a bar: Mpps (x recovery off)".to_string()),
            (Sample::Hollow, "flagged: not to quote".to_string()),
            (Sample::Range, "min-max over --reps".to_string()),
        ];
        crate::plot::side_legend(&legend, &entries).map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_matrix_measures_refuses_and_keeps_replicas_identical() {
        let o = ScrOptions {
            packets: 20_000,
            loops: 1,
            seconds: None,
            reps: 1,
            cores: vec![1, 2, 4],
            programs: vec!["ddos".into(), "conntrack".into()],
            traces: vec!["single".into()],
            strategies: vec!["rss".into(), "shared".into(), "scr".into()],
            burn: vec![0, 32],
            losses: vec![0.0, 0.01],
            mlffr_trial: None,
        };
        let rows = run_scr(&o, |_| {}).unwrap();
        assert_eq!(rows.len(), 2 * 3 * 3 + 2 * 3 + 3);
        let scr: Vec<&Row> = rows.iter().filter(|r| r.strategy == "scr" && r.mpps.is_some()).collect();
        assert!(
            scr.len() >= 2 * 3 + 2 * 3 + 3,
            "{:?}",
            rows.iter().filter(|r| r.refused.is_some()).collect::<Vec<_>>()
        );
        for r in &scr {
            if r.recovery || r.loss == 0.0 {
                assert_eq!(r.identical, Some(true), "{r:?}");
            }
        }
        // conntrack's per-core connection table cannot be shared by sprayed packets.
        assert!(rows.iter().any(|r| r.program == "conntrack" && r.strategy == "shared" && r.refused.is_some()));
        assert!(table(&rows).contains("identical"));
        // Issue 35 (`bench scr` printed 476.81 Mpps on 1 core, 0.17x on 2): 20,000 packets in one pass are too few
        // to quote, and so is every ratio against such a figure.
        let r2 = rows
            .iter()
            .find(|r| r.experiment == "scaling" && r.program == "ddos" && r.strategy == "scr" && r.cores == 2)
            .unwrap();
        let has = |p: &str| r2.trust.flags.iter().any(|f| f.contains(p));
        assert!(has("few packets") && has("flagged 1-core"), "{r2:?}");
        // The table marks the row (its reasons in the order found: under load "too short" may come first).
        let t = table(&rows);
        assert!(t.lines().any(|l| l.contains("! ") && l.contains("few packets")), "{t}");
        let dir = std::env::temp_dir().join(format!("fp-scr-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let files = plot(&rows, &dir).unwrap();
        // One scaling plot per program, the compute plot, and the recovery plot the README promises (issue 35).
        assert_eq!(files.len(), 4, "{files:?}");
        assert!(files.iter().any(|f| f.ends_with("scr-recovery.png")), "{files:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn mlffr_is_searched_on_real_cores_only() {
        let o = ScrOptions {
            packets: 5_000,
            loops: 1,
            seconds: None,
            reps: 1,
            cores: vec![1, 3],
            programs: vec!["ddos".into()],
            traces: vec!["single".into()],
            strategies: vec!["scr".into()],
            burn: vec![],
            losses: vec![],
            mlffr_trial: Some(std::time::Duration::from_millis(40)),
        };
        let rows = run_scr(&o, |_| {}).unwrap();
        let one = rows.iter().find(|r| r.experiment == "scaling" && r.cores == 1).unwrap();
        assert!(one.mlffr_mpps.is_some_and(|m| m > 0.0), "{one:?}");
        let proj = rows.iter().find(|r| r.experiment == "scaling" && r.cores == 3).unwrap();
        assert!(proj.projected && proj.mlffr_mpps.is_none(), "{proj:?}");
        assert!(table(&rows).contains("MLFFR"));
    }
}
