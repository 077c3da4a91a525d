//! `flowplane bench scaling`: throughput against cores for every
//! multi-core strategy, on the traffic shapes that separate them (uniform
//! flows, Zipf, a few elephants carrying most packets, one single flow) and
//! the chains whose state placement differs (`srcctr -> fsc`, `fw` and
//! `nat` on two-way TCP, `ddos`). One and two cores are real runs; more
//! are `--virtual-cores` projections (labelled as such; `shared` is measured
//! on the real cores only: its cost is contention between real cores, which
//! logical workers taking turns cannot show, so its projected rows are
//! refused rows saying so). Each row also
//! gives the ratio to the same strategy's one-core figure and the
//! load-imbalance factor; strategy/NF pairs the runtime refuses are rows
//! saying why. A PNG plot per chain shows throughput against cores.

use std::path::{Path, PathBuf};
use std::time::Duration;

use flowplane_engine::exec::ExecConfig;
use flowplane_engine::runner::{prepare, run_prepared, Input, Output};
use flowplane_engine::spec;
use flowplane_engine::RunConfig;
use flowplane_trace::gen::{FlowDist, GenConfig, Generator, Proto};
use serde::Serialize;

use crate::reps::{Spread, Trust};

/// The chains measured: (name, spec, TCP both ways).
pub const CHAINS: &[(&str, &str, bool)] =
    &[("srcctr-fsc", "srcctr -> fsc", false), ("fw", "fw", true), ("nat", "nat", true), ("ddos", "ddos", false)];

/// The traffic shapes measured.
pub const TRAFFIC: &[&str] = &["uniform", "zipf", "elephants", "single"];

/// What to measure.
#[derive(Clone, Debug)]
pub struct ScalingOptions {
    /// Seconds per run (plus a quarter of it as warm-up).
    pub seconds: f64,
    /// Packets per generated trace.
    pub packets: u64,
    /// Flows of the uniform and Zipf traces.
    pub flows: u64,
    /// Worker counts (1 and 2 real, more projected).
    pub cores: Vec<usize>,
    /// Chains (names in [`CHAINS`]).
    pub chains: Vec<String>,
    /// Traffic shapes (names in [`TRAFFIC`]).
    pub traffic: Vec<String>,
    /// Strategies.
    pub strategies: Vec<String>,
    /// Control period of rsspp.
    pub period: Duration,
    /// Rounds over the whole matrix (`--reps`): each row's figure is the median, with min and max.
    pub reps: usize,
}

impl ScalingOptions {
    /// The full experiment (or a small one for a smoke run).
    pub fn new(quick: bool) -> Self {
        ScalingOptions {
            seconds: if quick { 0.3 } else { 1.5 },
            packets: if quick { 100_000 } else { 2_000_000 },
            flows: if quick { 10_000 } else { 1_000_000 },
            cores: if quick { vec![1, 2, 4] } else { vec![1, 2, 4, 8, 16] },
            chains: CHAINS.iter().map(|c| c.0.to_string()).collect(),
            traffic: TRAFFIC.iter().map(|t| t.to_string()).collect(),
            strategies: vec!["rss".into(), "shared".into(), "rsspp".into()],
            period: Duration::from_millis(100),
            reps: 1,
        }
    }
}

/// One measurement.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// Chain name.
    pub chain: String,
    /// Traffic shape.
    pub traffic: String,
    /// Strategy.
    pub strategy: String,
    /// Workers.
    pub cores: usize,
    /// A `--virtual-cores` projection rather than a real run.
    pub projected: bool,
    /// Throughput (Mpps), real or projected; None when refused.
    pub mpps: Option<f64>,
    /// Against the same strategy on one core.
    pub ratio: Option<f64>,
    /// Load-imbalance factor after the first second (all windows if shorter).
    pub imbalance: Option<f64>,
    /// RETA moves completed.
    pub moves: u64,
    /// Why the runtime refused the configuration.
    pub refused: Option<String>,
    /// `mpps` over the repetitions (None with one, or when refused in one).
    pub spread: Option<Spread>,
    /// What the figure rests on and why not to quote it ([`flowplane_engine::trust`]).
    pub trust: Trust,
}

fn traffic(name: &str, o: &ScalingOptions, tcp: bool) -> Result<GenConfig, String> {
    let (flows, dist) = match name {
        "uniform" => (o.flows, FlowDist::Uniform),
        "zipf" => (o.flows, FlowDist::Zipf(1.1)),
        "elephants" => ((o.flows / 10).max(100), FlowDist::Elephants { k: 8, share: 0.5 }),
        "single" => (1, FlowDist::Uniform),
        _ => return Err(format!("unknown traffic '{name}' (known: {})", TRAFFIC.join(", "))),
    };
    Ok(GenConfig {
        flows,
        packets: o.packets,
        dist,
        proto: if tcp { Proto::TcpBidir } else { Proto::Udp },
        seed: 1,
        ..GenConfig::default()
    })
}

/// Runs the experiment `o.reps` times over; `progress` sees every row as
/// it is measured. Each row's figure is the median round's; ratios are
/// taken between the medians.
pub fn run_scaling(o: &ScalingOptions, mut progress: impl FnMut(&Row)) -> Result<Vec<Row>, String> {
    let merged = crate::reps::repeat(o.reps, |_| once(o, &mut progress), |r| r.mpps)?;
    let mut rows: Vec<Row> = crate::reps::settle(merged, |r| (&mut r.trust, &mut r.spread));
    let snapshot = rows.clone();
    for r in rows.iter_mut() {
        let base = snapshot
            .iter()
            .find(|b| b.chain == r.chain && b.traffic == r.traffic && b.strategy == r.strategy && b.cores == 1);
        r.ratio = match (r.mpps, base.and_then(|b| b.mpps)) {
            (Some(m), Some(b)) if b > 0.0 => Some(m / b),
            _ => None,
        };
        // The one-core row is its own base: its own flags say it all.
        if r.refused.is_none() && r.cores > 1 {
            r.trust.speedup(r.ratio, r.cores, base.is_some_and(|b| b.trust.ok()));
        }
    }
    Ok(rows)
}

/// One round over the matrix.
fn once(o: &ScalingOptions, progress: &mut impl FnMut(&Row)) -> Result<Vec<Row>, String> {
    let real = flowplane_io::cpu::available_cores().clamp(1, 2);
    let mut rows = Vec::new();
    for cname in &o.chains {
        let &(_, chain, tcp) =
            CHAINS.iter().find(|c| c.0 == cname).ok_or_else(|| format!("unknown chain '{cname}'"))?;
        let spec = spec::parse(chain).map_err(|e| e.to_string())?;
        for t in &o.traffic {
            let gen = traffic(t, o, tcp)?;
            for s in &o.strategies {
                for &n in &o.cores {
                    let projected = n > real;
                    let cfg = RunConfig {
                        // Projections take turns on one thread: every logical worker sees the same CPU.
                        cores: if projected { 1 } else { n.min(real) },
                        virtual_cores: projected.then_some(n),
                        loops: None,
                        duration: Some(Duration::from_secs_f64(o.seconds)),
                        warmup: Some(Duration::from_secs_f64(o.seconds / 4.0)),
                        scale: s.clone(),
                        scale_period: o.period,
                        exec: ExecConfig {
                            flows: ((gen.flows as f64 * 2.5 / n as f64) as usize).max(4096),
                            default_idle_timeout_ns: 3_600_000_000_000,
                            ..ExecConfig::default()
                        },
                        ..RunConfig::default()
                    };
                    let mut row = Row {
                        chain: cname.clone(),
                        traffic: t.clone(),
                        strategy: s.clone(),
                        cores: n,
                        projected,
                        mpps: None,
                        ratio: None,
                        imbalance: None,
                        moves: 0,
                        refused: None,
                        spread: None,
                        trust: Trust::default(),
                    };
                    let g = Generator::new(gen.clone()).map_err(|e| e.to_string())?;
                    match prepare(&cfg, &spec, Input::Generated(Box::new(g)), false)
                        .and_then(|p| run_prepared(&cfg, &spec, &p, Output::Discard))
                    {
                        Ok(r) => {
                            let sc = r.scale.as_ref();
                            let m = if projected { sc.and_then(|s| s.projected_mpps).unwrap_or(0.0) } else { r.mpps };
                            row.mpps = Some(m);
                            row.trust = r.trust.clone();
                            row.imbalance = sc.map(|s| s.imbalance_settled);
                            row.moves = sc.map_or(0, |s| s.moves);
                        }
                        Err(e) => row.refused = Some(e.to_string()),
                    }
                    progress(&row);
                    rows.push(row);
                }
            }
        }
    }
    Ok(rows)
}

/// The table, one line per row.
pub fn table(rows: &[Row]) -> String {
    let mut s = format!(
        "{:<11} {:<10} {:<7} {:>5} {:>10} {:>13} {:>7} {:>10} {:>6}\n",
        "chain", "traffic", "scale", "cores", "Mpps", "min-max", "x1core", "imbalance", "moves"
    );
    for r in rows {
        let cores = if r.projected { format!("{}p", r.cores) } else { r.cores.to_string() };
        match (&r.refused, r.mpps) {
            (Some(e), _) => s.push_str(&format!(
                "{:<11} {:<10} {:<7} {:>5} refused: {}\n",
                r.chain, r.traffic, r.strategy, cores, e
            )),
            (None, m) => s.push_str(&format!(
                "{:<11} {:<10} {:<7} {:>5} {:>10.2} {:>13} {:>7} {:>9.1}% {:>6}{}\n",
                r.chain,
                r.traffic,
                r.strategy,
                cores,
                m.unwrap_or(0.0),
                r.spread.as_ref().map_or("-".to_string(), |x| x.cell(2)),
                r.ratio.map_or("-".to_string(), |x| format!("{x:.2}")),
                r.imbalance.unwrap_or(0.0) * 100.0,
                r.moves,
                r.trust.cell()
            )),
        }
    }
    s.push_str("(Np: projected from N logical workers taking turns on the real cores; Mpps: the median of --reps rounds, min-max over them; imbalance: (busiest - least busy) / busiest per 100 ms window)\n");
    if let Some(n) = crate::reps::footnote(rows.iter().map(|r| &r.trust)) {
        s.push_str(&n);
        s.push('\n');
    }
    s
}

/// Writes one PNG per chain into `dir` (Mpps and speed-up against cores, one line per traffic and strategy; see
/// `plot::cores_png`); returns the files written.
pub fn plot(rows: &[Row], dir: &Path) -> Result<Vec<PathBuf>, String> {
    use crate::plot::{CorePoint, CoreSeries};
    let text = crate::plot::register_font();
    let mut out = Vec::new();
    let mut chains: Vec<&str> = rows.iter().map(|r| r.chain.as_str()).collect();
    chains.dedup();
    for c in chains {
        let path = dir.join(format!("scaling-{c}.png"));
        let mine: Vec<&Row> = rows.iter().filter(|r| r.chain == c && r.mpps.is_some()).collect();
        let mut keys: Vec<(&str, &str)> = mine.iter().map(|r| (r.traffic.as_str(), r.strategy.as_str())).collect();
        keys.sort();
        keys.dedup();
        let series: Vec<CoreSeries> = keys
            .iter()
            .map(|(t, s)| CoreSeries {
                label: format!("{t} / {s}"),
                points: mine
                    .iter()
                    .filter(|r| r.traffic == *t && r.strategy == *s)
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
        crate::plot::cores_png(&path, &format!("{c}: throughput vs cores{note}"), &series, text)?;
        out.push(path);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_matrix_measures_refuses_and_plots() {
        let o = ScalingOptions {
            seconds: 0.1,
            packets: 20_000,
            flows: 2_000,
            cores: vec![1, 2, 4],
            chains: vec!["srcctr-fsc".into(), "nat".into()],
            traffic: vec!["zipf".into()],
            strategies: vec!["rss".into(), "shared".into()],
            period: Duration::from_millis(20),
            reps: 2,
        };
        let rows = run_scaling(&o, |_| {}).unwrap();
        assert_eq!(rows.len(), 2 * 2 * 3);
        let get =
            |c: &str, s: &str, n: usize| rows.iter().find(|r| r.chain == c && r.strategy == s && r.cores == n).unwrap();
        assert!(get("srcctr-fsc", "rss", 4).mpps.unwrap() > 0.0 && get("srcctr-fsc", "rss", 4).projected);
        // shared runs per-flow state in shared tables; nat's per-core port pool is refused.
        assert!(get("srcctr-fsc", "shared", 2).mpps.is_some());
        assert!(get("nat", "shared", 2).refused.as_deref().unwrap().contains("nat"));
        assert!(get("nat", "rss", 2).mpps.is_some(), "nat runs on 2 cores under rss");
        assert!(table(&rows).contains("refused"));
        // Two rounds: every measured row has its spread; 4 logical workers sharing 0.1 s each work a quarter of it.
        let measured = get("srcctr-fsc", "rss", 4);
        let sp = measured.spread.as_ref().unwrap();
        assert!(sp.reps == 2 && sp.min <= sp.median && sp.median <= sp.max && measured.mpps == Some(sp.median));
        assert!(measured.trust.flags.iter().any(|f| f.starts_with("short")), "{measured:?}");
        assert!(table(&rows).contains("NOT TO BE QUOTED"));
        let dir = std::env::temp_dir().join(format!("fp-scaling-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let files = plot(&rows, &dir).unwrap();
        assert_eq!(files.len(), 2);
        for f in &files {
            let b = std::fs::read(f).unwrap();
            assert_eq!(&b[1..4], b"PNG");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
