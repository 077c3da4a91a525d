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
//!   prefixing counts as the NIC's), best of `reps` runs: the machine is
//!   shared and other processes only ever slow a run down.
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
use plotters::prelude::*;
use serde::Serialize;

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
    /// Passes over the trace per run.
    pub loops: u64,
    /// Runs per configuration (the best counts).
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
    reps: usize,
    mlffr: Option<std::time::Duration>,
) -> Result<(f64, Report, Option<f64>), String> {
    let spec = spec::parse(chain).map_err(|e| e.to_string())?;
    let gen = Generator::new(g.clone()).map_err(|e| e.to_string())?;
    let p = prepare(cfg, &spec, Input::Generated(Box::new(gen)), false).map_err(|e| e.to_string())?;
    let (m, r) = best_of(cfg, &spec, &p, reps)?;
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

/// The best of `reps` runs: (Mpps, report).
fn best_of(
    cfg: &RunConfig,
    spec: &flowplane_engine::spec::ChainSpec,
    p: &flowplane_engine::runner::Prepared,
    reps: usize,
) -> Result<(f64, Report), String> {
    let mut best: Option<(f64, Report)> = None;
    for _ in 0..reps.max(1) {
        let r = run_prepared(cfg, spec, p, Output::Discard).map_err(|e| e.to_string())?;
        let sc = r.scale.as_ref();
        let m = if cfg.virtual_cores.is_some() {
            sc.and_then(|s| s.projected_mpps).unwrap_or(0.0)
        } else {
            sc.map_or(r.mpps, |s| s.busy_mpps)
        };
        if best.as_ref().is_none_or(|b| m > b.0) {
            best = Some((m, r));
        }
    }
    best.ok_or_else(|| "no run".to_string())
}

fn config(n: usize, real: usize, strategy: &str, loops: u64, scr: ScrConfig) -> RunConfig {
    let projected = n > real;
    RunConfig {
        cores: if projected { 1 } else { n },
        virtual_cores: projected.then_some(n),
        loops: Some(loops),
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

/// Runs the three experiments; `progress` sees each row as it is measured.
pub fn run_scr(o: &ScrOptions, mut progress: impl FnMut(&Row)) -> Result<Vec<Row>, String> {
    let real = flowplane_io::cpu::available_cores().clamp(1, 2);
    let mut rows = Vec::new();
    let mut push = |mut row: Row, one: &mut Option<f64>, rows: &mut Vec<Row>| {
        if row.cores == 1 {
            *one = row.mpps;
        }
        row.ratio = match (row.mpps, *one) {
            (Some(m), Some(b)) if b > 0.0 => Some(m / b),
            _ => None,
        };
        progress(&row);
        rows.push(row);
    };
    for pname in &o.programs {
        let &(_, chain, both) =
            PROGRAMS.iter().find(|p| p.0 == pname).ok_or_else(|| format!("unknown program '{pname}'"))?;
        for t in &o.traces {
            let g = gen(t, o.packets, both)?;
            for s in &o.strategies {
                let mut one = None;
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
                    let cfg = config(n, real, s, o.loops, ScrConfig::default());
                    fill(&mut row, measure(&cfg, chain, &g, o.reps, o.mlffr_trial));
                    push(row, &mut one, &mut rows);
                }
            }
        }
    }
    // Fig. 9: growing compute on one flow.
    let g = gen("single", o.packets, false)?;
    for &iters in &o.burn {
        let chain = format!("burn(iters={iters})");
        let mut one = None;
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
            let cfg = config(n, real, "scr", o.loops, ScrConfig::default());
            fill(&mut row, measure(&cfg, &chain, &g, o.reps, o.mlffr_trial));
            push(row, &mut one, &mut rows);
        }
    }
    // Fig. 10: recovery off, then on at each loss rate, on the real cores.
    let g = gen("univdc", o.packets, false)?;
    let mut one = None;
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
        let cfg = config(real, real, "scr", o.loops, ScrConfig { recovery, loss, seed: 7, ..ScrConfig::default() });
        fill(&mut row, measure(&cfg, "portknock", &g, o.reps, o.mlffr_trial));
        // Ratios against recovery off.
        let m = row.mpps;
        row.cores = real;
        if !recovery {
            one = m;
        }
        row.ratio = match (m, one) {
            (Some(a), Some(b)) if b > 0.0 => Some(a / b),
            _ => None,
        };
        progress(&row);
        rows.push(row);
    }
    Ok(rows)
}

/// The table.
pub fn table(rows: &[Row]) -> String {
    let mut s = format!(
        "{:<9} {:<10} {:<10} {:<7} {:>5} {:>6} {:>7} {:>9} {:>7} {:>8} {:>9} {:>9} {:>7}\n",
        "exp",
        "program",
        "trace",
        "scale",
        "cores",
        "iters",
        "loss%",
        "Mpps",
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
                "{head} {:>9.2} {:>7} {:>8} {:>9} {:>9} {:>7}\n",
                m.unwrap_or(0.0),
                r.ratio.map_or("-".to_string(), |x| format!("{x:.2}")),
                r.history_bytes.map_or("-".to_string(), |b| b.to_string()),
                r.ff_cycles.map_or("-".to_string(), |c| format!("{c:.0}")),
                r.identical.map_or("-", |i| if i { "identical" } else { "DIVERGED" }),
                r.mlffr_mpps.map_or("-".to_string(), |x| format!("{x:.2}")),
            )),
        }
    }
    s.push_str("(Mpps: packets / the busiest worker's own busy time, best of the runs; Np: projected from N logical workers on one core; x1: against the same strategy on 1 core, recovery rows against recovery off; MLFFR: `flowplane mlffr` in Mpps with --mlffr, real cores only)\n");
    s
}

/// One PNG per program (Mpps vs cores per trace and strategy), one for
/// the compute sweep (ratio to one core vs cores per compute cost) and one
/// for recovery; returns the files written.
pub fn plot(rows: &[Row], dir: &Path) -> Result<Vec<PathBuf>, String> {
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
        let y = |r: &Row| if compute { r.ratio.unwrap_or(0.0) } else { r.mpps.unwrap_or(0.0) };
        let path = dir.join(format!("scr-{exp}-{prog}.png"));
        let xmax = mine.iter().map(|r| r.cores).max().unwrap_or(1).max(2) as f64;
        let ymax = mine.iter().map(|r| y(r)).fold(1.0f64, f64::max) * 1.1;
        let root = BitMapBackend::new(&path, (1000, 640)).into_drawing_area();
        let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let mut b = ChartBuilder::on(&root);
        b.margin(20);
        if text {
            let cap = if compute {
                "SCR compute limit: speed-up vs cores per compute rounds (>2: projected)".to_string()
            } else {
                format!("{prog}: Mpps vs cores (>2: projected)")
            };
            b.caption(cap, ("sans-serif", 22)).x_label_area_size(40).y_label_area_size(60);
        }
        let mut chart = b.build_cartesian_2d(1.0f64..xmax, 0.0f64..ymax).map_err(|e| err(&e))?;
        if text {
            chart
                .configure_mesh()
                .x_desc("cores")
                .y_desc(if compute { "x one core" } else { "Mpps" })
                .draw()
                .map_err(|e| err(&e))?;
        } else {
            chart.configure_mesh().disable_x_mesh().disable_y_mesh().draw().map_err(|e| err(&e))?;
        }
        let mut series: Vec<(String, String)> = mine
            .iter()
            .map(|r| {
                if compute {
                    (format!("iters={}", r.iters), String::new())
                } else {
                    (r.trace.clone(), r.strategy.clone())
                }
            })
            .collect();
        series.dedup();
        series.sort();
        series.dedup();
        for (i, (a, s)) in series.iter().enumerate() {
            let pts: Vec<(f64, f64)> = mine
                .iter()
                .filter(
                    |r| if compute { &format!("iters={}", r.iters) == a } else { &r.trace == a && &r.strategy == s },
                )
                .map(|r| (r.cores as f64, y(r)))
                .collect();
            let color = Palette99::pick(i).to_rgba();
            let line = chart.draw_series(LineSeries::new(pts, color.stroke_width(2))).map_err(|e| err(&e))?;
            if text {
                line.label(if s.is_empty() { a.clone() } else { format!("{a} / {s}") })
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
            }
        }
        if text {
            crate::plot::legend(&mut chart, SeriesLabelPosition::UpperLeft).map_err(|e| err(&e))?;
        }
        root.present().map_err(|e| err(&e))?;
        drop(chart);
        drop(root);
        out.push(path);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_matrix_measures_refuses_and_keeps_replicas_identical() {
        let o = ScrOptions {
            packets: 20_000,
            loops: 1,
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
        let dir = std::env::temp_dir().join(format!("fp-scr-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let files = plot(&rows, &dir).unwrap();
        assert_eq!(files.len(), 3);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn mlffr_is_searched_on_real_cores_only() {
        let o = ScrOptions {
            packets: 5_000,
            loops: 1,
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
