//! `flowplane bench dyssect`: rss, rsspp and dyssect on the same traces —
//! uniform, Zipf 1.1, a few elephants, and shifting skew (the heavy flows
//! change every half of the trace) — at projected 8 and 16 cores
//! (`--virtual-cores`: logical workers taking turns on one thread). Per row:
//! projected throughput, load imbalance, the priority class's and the other
//! traffic's p99 latency (virtual time: packets arrive at the trace's
//! timestamps, each logical worker a dedicated FIFO core with its measured
//! service times — a projection like the throughput), RETA and flow moves,
//! and the controller's time. A table, JSON and one PNG per trace and core
//! count: load imbalance per 100 ms window over time, one line per strategy.
//!
//! `--nic-profile`: the same runs on emulated NICs that take time to apply
//! a RETA update or a flow rule (the Dyssect paper's measured NICs), and a
//! table with rsspp and dyssect side by side under each profile: moves done,
//! moves still queued in the NIC at the end, imbalance, throughput, latency.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use flowplane_engine::exec::ExecConfig;
use flowplane_engine::runner::{prepare, run_prepared, Input, NicProfile, Output, PriorityClass};
use flowplane_engine::spec;
use flowplane_engine::RunConfig;
use flowplane_scale::rss::DEFAULT_RETA_SIZE;
use flowplane_scale::steer::{Classifier, HashOn};
use flowplane_trace::gen::{FlowDist, GenConfig, Generator};
use flowplane_wire::flow::{extract_five_tuple, FiveTuple};
use plotters::prelude::*;
use serde::Serialize;

use crate::reps::{Spread, Trust};

/// The traces measured.
pub const TRACES: &[&str] = &["uniform", "zipf", "elephants", "shifting"];

/// The priority class of the runs: about 0.6% of the generator's flows, mice.
pub const PRIORITY: &str = "dport=20000-20999";

/// What to measure.
#[derive(Clone, Debug)]
pub struct DyssectOptions {
    /// Seconds per run (after a one-second warm-up).
    pub seconds: f64,
    /// Packets per trace.
    pub packets: u64,
    /// Flows per trace.
    pub flows: u64,
    /// Offered rate in trace time (packets/s): the arrivals of the virtual-time latency.
    pub rate: f64,
    /// Logical worker counts (projected).
    pub cores: Vec<usize>,
    /// Traces (names in [`TRACES`]).
    pub traces: Vec<String>,
    /// Strategies.
    pub strategies: Vec<String>,
    /// Chain.
    pub chain: String,
    /// The priority class's SLO (µs).
    pub slo_us: f64,
    /// NIC profiles (update latencies) each strategy runs under.
    pub profiles: Vec<NicProfile>,
    /// Rounds over the whole experiment (`--reps`): each row's figure is the median, with min and max.
    pub reps: usize,
}

impl DyssectOptions {
    /// The full experiment (or a small one for a smoke run).
    pub fn new(quick: bool) -> Self {
        DyssectOptions {
            seconds: if quick { 1.5 } else { 6.0 },
            packets: if quick { 200_000 } else { 8_000_000 },
            flows: if quick { 20_000 } else { 200_000 },
            rate: 12e6,
            cores: if quick { vec![8] } else { vec![8, 16] },
            traces: TRACES.iter().map(|t| t.to_string()).collect(),
            strategies: vec!["rss".into(), "rsspp".into(), "dyssect".into()],
            chain: "lb -> fsc".into(),
            slo_us: 50.0,
            profiles: vec![NicProfile::ideal()],
            reps: 1,
        }
    }
}

/// One measurement.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// Trace.
    pub trace: String,
    /// Strategy.
    pub strategy: String,
    /// Logical workers (projected cores).
    pub cores: usize,
    /// NIC profile (update latencies).
    pub nic: String,
    /// Changes (RETA entries, flow rules and slots) still queued in the NIC at the end: requested, never applied.
    pub moves_pending: usize,
    /// NIC updates applied, and the longest time one waited from request to landing (ms).
    pub nic_updates: u64,
    /// See `nic_updates`.
    pub nic_waited_max_ms: f64,
    /// Projected throughput (Mpps).
    pub mpps: f64,
    /// Against rsspp on the same trace and cores.
    pub vs_rsspp: Option<f64>,
    /// Load imbalance after the first second.
    pub imbalance: f64,
    /// Priority class p99 (µs, virtual time).
    pub prio_p99_us: f64,
    /// Other traffic p99 (µs, virtual time).
    pub normal_p99_us: f64,
    /// Priority p99 within the SLO.
    pub within_slo: bool,
    /// Moves completed (RETA entries and flow slots).
    pub moves: u64,
    /// Dyssect: flow moves started.
    pub flow_moves: u64,
    /// Dyssect: controller wall time (ms) and decisions.
    pub controller_ms: f64,
    /// See `controller_ms`.
    pub decisions: usize,
    /// Imbalance per window over time.
    pub imbalance_windows: Vec<f64>,
    /// Flow entries handed between cores (the hand-overs' work).
    pub flows_moved: u64,
    /// Per logical worker: packets processed, and busy ms (its own work, the projection's basis).
    pub core_packets: Vec<u64>,
    /// See `core_packets`.
    pub core_busy_ms: Vec<f64>,
    /// The most any balancer that keeps each flow on one core could project
    /// at this run's cost per packet (its packets per busy second per core
    /// over the trace's flow-level bound, [`Ceiling`]).
    pub ceiling_mpps: f64,
    /// The trace's [`Ceiling::flow_over_entries`] at these cores.
    pub flow_over_entries: f64,
    /// The trace's heaviest flow's share of its phase.
    pub top_flow_share: f64,
    /// `mpps` over the repetitions (None with one).
    pub spread: Option<Spread>,
    /// What the figure rests on and why not to quote it ([`flowplane_engine::trust`]).
    pub trust: Trust,
}

fn trace(name: &str, o: &DyssectOptions) -> Result<GenConfig, String> {
    let (dist, shift) = match name {
        "uniform" => (FlowDist::Uniform, None),
        "zipf" => (FlowDist::Zipf(1.1), None),
        "elephants" => (FlowDist::Elephants { k: 8, share: 0.6 }, None),
        "shifting" => (FlowDist::Elephants { k: 8, share: 0.6 }, Some((o.packets / 2).max(1))),
        _ => return Err(format!("unknown trace '{name}' (known: {})", TRACES.join(", "))),
    };
    Ok(GenConfig {
        flows: o.flows,
        packets: o.packets,
        dist,
        rate_pps: o.rate,
        seed: 5,
        shift_every: shift,
        ..GenConfig::default()
    })
}

/// What balance a trace allows, from its packets alone (no run): per phase
/// (the packets between two shifts of the heavy flows), the busiest core's
/// packets when (a) whole flows are placed as well as possible — bounded
/// below by max(an even share, the heaviest flow), which no balancer that
/// keeps a flow on one core beats — and (b) whole RETA entries are placed
/// by LPT (largest first onto the least loaded core), a balance an
/// entry-level balancer such as RSS++ can reach. Summed over phases: the
/// busiest core sets each phase's length.
#[derive(Clone, Debug, Serialize)]
pub struct Ceiling {
    /// Cores.
    pub cores: usize,
    /// Packets in the trace.
    pub packets: u64,
    /// Phases (1 without shifts).
    pub phases: u64,
    /// Sum over phases of max(even share, heaviest flow): the flow-level bound.
    pub flow_bound: f64,
    /// Sum over phases of the busiest core with RETA entries placed by LPT.
    pub entry_lpt: f64,
    /// The heaviest single flow's share of its phase (the largest over phases).
    pub top_flow_share: f64,
}

impl Ceiling {
    /// The most any flow-level balancer can project over an entry-level one
    /// that reaches LPT's balance in every phase (same cost per packet).
    pub fn flow_over_entries(&self) -> f64 {
        self.entry_lpt / self.flow_bound.max(1.0)
    }
}

/// The [`Ceiling`] of the trace `gen` describes, over `cores` cores and the
/// runtime's RETA (its size and Toeplitz hash, as the emulated NIC steers).
pub fn ceiling(gen: &GenConfig, cores: usize) -> Result<Ceiling, String> {
    ceiling_with_reta(gen, cores, DEFAULT_RETA_SIZE)
}

/// [`ceiling`] with a RETA of `reta` entries (a power of two; RSS++ and the
/// Dyssect paper's NIC used 128).
pub fn ceiling_with_reta(gen: &GenConfig, cores: usize, reta: usize) -> Result<Ceiling, String> {
    let cores = cores.max(1);
    let classifier = Classifier::new(reta, false, HashOn::FiveTuple, false, Vec::new()).map_err(|e| e.to_string())?;
    let mut g = Generator::new(gen.clone()).map_err(|e| e.to_string())?;
    let phase_len = gen.shift_every.filter(|&s| s > 0).unwrap_or(u64::MAX);
    let mut buf = Vec::new();
    let mut flows: HashMap<FiveTuple, u64> = HashMap::new();
    let mut entries = vec![0u64; reta];
    let mut c = Ceiling { cores, packets: 0, phases: 0, flow_bound: 0.0, entry_lpt: 0.0, top_flow_share: 0.0 };
    let mut in_phase = 0u64;
    while g.next_frame(&mut buf).is_some() {
        // One parse per frame: the flow, and its RETA entry from the NIC's hash. Frames
        // that are not IP take the default queue (entry 0), as the NIC does; they are no flow.
        match extract_five_tuple(&buf) {
            Ok(t) => {
                entries[classifier.entry_of(&t) as usize] += 1;
                *flows.entry(t).or_insert(0) += 1;
            }
            Err(_) => entries[0] += 1,
        }
        in_phase += 1;
        c.packets += 1;
        if in_phase == phase_len {
            close_phase(&mut c, &mut flows, &mut entries, in_phase);
            in_phase = 0;
        }
    }
    close_phase(&mut c, &mut flows, &mut entries, in_phase);
    Ok(c)
}

/// Adds one phase's bounds to `c` and clears the phase's counts.
fn close_phase(c: &mut Ceiling, flows: &mut HashMap<FiveTuple, u64>, entries: &mut [u64], n: u64) {
    if n == 0 {
        return;
    }
    let top = flows.values().copied().max().unwrap_or(0);
    c.flow_bound += (n as f64 / c.cores as f64).max(top as f64);
    c.top_flow_share = c.top_flow_share.max(top as f64 / n as f64);
    let mut sorted = entries.to_vec();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    let mut load = vec![0u64; c.cores];
    for e in sorted {
        if let Some(min) = load.iter_mut().min() {
            *min += e;
        }
    }
    c.entry_lpt += load.iter().copied().max().unwrap_or(0) as f64;
    c.phases += 1;
    flows.clear();
    entries.iter_mut().for_each(|x| *x = 0);
}

/// The ceilings of every trace of `o` at each core count and RETA size, as
/// a table (no run): how much any balancer that keeps flows whole could
/// gain over RETA entries placed by LPT.
pub fn ceiling_table(o: &DyssectOptions, retas: &[usize]) -> Result<String, String> {
    let mut s = format!(
        "{:<10} {:>6} {:>6} {:>8} {:>14} {:>12}\n",
        "trace", "cores", "reta", "phases", "flow/entries", "top flow %"
    );
    for t in &o.traces {
        let g = trace(t, o)?;
        for &n in &o.cores {
            for &reta in retas {
                let c = ceiling_with_reta(&g, n, reta)?;
                s.push_str(&format!(
                    "{:<10} {:>6} {:>6} {:>8} {:>13.3}x {:>12.2}\n",
                    t,
                    n,
                    reta,
                    c.phases,
                    c.flow_over_entries(),
                    c.top_flow_share * 100.0
                ));
            }
        }
    }
    s.push_str("(flow/entries: the busiest core's packets with RETA entries placed largest-first on the least loaded core, over the least any placement of whole flows allows, max(even share, heaviest flow), summed over the trace's shift phases)\n");
    Ok(s)
}

/// Runs the experiment `o.reps` times over; `progress` sees every row as
/// it is measured. Each row's figure is the median round's; `vs_rsspp`
/// compares the medians.
pub fn run_dyssect(o: &DyssectOptions, mut progress: impl FnMut(&Row)) -> Result<Vec<Row>, String> {
    let merged = crate::reps::repeat(o.reps, |_| once(o, &mut progress), |r| Some(r.mpps))?;
    let mut rows: Vec<Row> = crate::reps::settle(merged, |r| (&mut r.trust, &mut r.spread));
    let snapshot = rows.clone();
    for r in rows.iter_mut() {
        let base = snapshot
            .iter()
            .find(|x| x.trace == r.trace && x.cores == r.cores && x.nic == r.nic && x.strategy == "rsspp");
        r.vs_rsspp = base.filter(|b| b.mpps > 0.0).map(|b| r.mpps / b.mpps);
        if r.vs_rsspp.is_some() && !base.is_some_and(|b| b.trust.ok()) {
            r.trust.flag("ratio against a flagged rsspp figure");
        }
    }
    Ok(rows)
}

/// One round of the experiment (`vs_rsspp` is filled in by [`run_dyssect`]).
fn once(o: &DyssectOptions, progress: &mut impl FnMut(&Row)) -> Result<Vec<Row>, String> {
    let spec = spec::parse(&o.chain).map_err(|e| e.to_string())?;
    let class = PriorityClass::parse(PRIORITY)?;
    let mut rows: Vec<Row> = Vec::new();
    for t in &o.traces {
        let gen = trace(t, o)?;
        for &n in &o.cores {
            let bound = ceiling(&gen, n)?;
            for (nic, s) in o.profiles.iter().flat_map(|p| o.strategies.iter().map(move |s| (p, s))) {
                let cfg = RunConfig {
                    nic_profile: nic.clone(),
                    cores: 1,
                    virtual_cores: Some(n),
                    loops: None,
                    duration: Some(Duration::from_secs_f64(o.seconds)),
                    warmup: Some(Duration::from_secs(1)),
                    scale: s.clone(),
                    priority: Some((PRIORITY.to_string(), class)),
                    slo_us: Some(o.slo_us),
                    ring: 1 << 16,
                    exec: ExecConfig {
                        flows: ((o.flows as f64 * 2.5 / n as f64) as usize).max(4096),
                        default_idle_timeout_ns: 3_600_000_000_000,
                        ..ExecConfig::default()
                    },
                    ..RunConfig::default()
                };
                let g = Generator::new(gen.clone()).map_err(|e| e.to_string())?;
                let r = prepare(&cfg, &spec, Input::Generated(Box::new(g)), false)
                    .and_then(|p| run_prepared(&cfg, &spec, &p, Output::Discard))
                    .map_err(|e| format!("{t} {s} {n} {}: {e}", nic.name))?;
                let sc = r.scale.as_ref().ok_or("no scale report")?;
                let pr = sc.priority.as_ref();
                let ctl = sc.controller.as_ref();
                let g = |k: &str| ctl.and_then(|c| c.get(k)).and_then(|v| v.as_f64()).unwrap_or(0.0);
                let mpps = sc.projected_mpps.unwrap_or(0.0);
                let nr = sc.nic.as_ref();
                let core_packets: Vec<u64> = r.per_core.iter().map(|c| c.packets).collect();
                let busy_s: f64 = sc.work_ms.iter().sum::<f64>() / 1e3;
                let done: u64 = core_packets.iter().sum();
                let per_core_pps = if busy_s > 0.0 { done as f64 / busy_s } else { 0.0 };
                let ceiling_mpps = per_core_pps * bound.packets as f64 / bound.flow_bound.max(1.0) / 1e6;
                let row = Row {
                    trace: t.clone(),
                    strategy: s.clone(),
                    cores: n,
                    nic: nic.name.clone(),
                    moves_pending: nr.map_or(0, |x| x.pending_changes),
                    nic_updates: nr.map_or(0, |x| x.updates),
                    nic_waited_max_ms: nr.map_or(0.0, |x| x.waited_max_ms),
                    mpps,
                    vs_rsspp: None,
                    imbalance: sc.imbalance_settled,
                    prio_p99_us: pr.map_or(0.0, |p| p.latency_ns[1] / 1e3),
                    normal_p99_us: pr.map_or(0.0, |p| p.normal_latency_ns[1] / 1e3),
                    within_slo: pr.and_then(|p| p.p99_within_slo).unwrap_or(false),
                    moves: sc.moves,
                    flow_moves: g("flow_moves") as u64,
                    controller_ms: g("controller_ms"),
                    decisions: ctl.and_then(|c| c.get("decisions")).and_then(|d| d.as_array()).map_or(0, Vec::len),
                    imbalance_windows: sc.imbalance.clone(),
                    flows_moved: sc.flows_moved,
                    core_packets,
                    core_busy_ms: sc.work_ms.clone(),
                    ceiling_mpps,
                    flow_over_entries: bound.flow_over_entries(),
                    top_flow_share: bound.top_flow_share,
                    spread: None,
                    trust: r.trust.clone(),
                };
                progress(&row);
                rows.push(row);
            }
        }
    }
    Ok(rows)
}

/// The table, one line per row.
pub fn table(rows: &[Row], slo_us: f64) -> String {
    let mut s = format!(
        "{:<10} {:<8} {:>5} {:>9} {:>13} {:>9} {:>8} {:>10} {:>13} {:>13} {:>7} {:>6} {:>11}\n",
        "trace",
        "scale",
        "cores",
        "Mpps",
        "min-max",
        "bound",
        "xrsspp",
        "imbalance",
        "prio p99 us",
        "other p99 us",
        "moves",
        "flows",
        "ctl ms"
    );
    // Under several NIC profiles each row names its own (the table is unchanged otherwise).
    let named = rows.iter().any(|r| r.nic != "ideal");
    if named {
        s = s.replacen("scale   ", "scale    nic       ", 1);
    }
    for r in rows {
        let scale = if named { format!("{:<8} {:<9}", r.strategy, r.nic) } else { r.strategy.clone() };
        s.push_str(&format!(
            "{:<10} {:<8} {:>4}p {:>9.2} {:>13} {:>9.2} {:>8} {:>9.1}% {:>12.1}{} {:>13.1} {:>7} {:>6} {:>11.1}{}\n",
            r.trace,
            scale,
            r.cores,
            r.mpps,
            r.spread.as_ref().map_or("-".to_string(), |x| x.cell(2)),
            r.ceiling_mpps,
            r.vs_rsspp.map_or("-".to_string(), |x| format!("{x:.2}")),
            r.imbalance * 100.0,
            r.prio_p99_us,
            if r.within_slo { " " } else { "!" },
            r.normal_p99_us,
            r.moves,
            r.flow_moves,
            r.controller_ms,
            r.trust.cell()
        ));
    }
    let mut seen: Vec<(&str, usize)> = Vec::new();
    for r in rows {
        if seen.contains(&(r.trace.as_str(), r.cores)) {
            continue;
        }
        seen.push((r.trace.as_str(), r.cores));
        s.push_str(&format!(
            "{} {}p: heaviest flow {:.1}% of the packets; whole flows placed at best vs RETA entries placed by LPT: at most {:.3}x\n",
            r.trace,
            r.cores,
            r.top_flow_share * 100.0,
            r.flow_over_entries
        ));
    }
    s.push_str(&format!(
        "(Np: PROJECTED from N logical workers taking turns on one thread; bound: the most any balancer that keeps each flow on one core could project at that row's cost per packet (the trace's flow-level bound); latency in virtual time: trace arrivals, each worker a dedicated FIFO core; ! = priority p99 over its {slo_us} us SLO)\n"
    ));
    if let Some(n) = crate::reps::footnote(rows.iter().map(|r| &r.trust)) {
        s.push_str(&n);
        s.push('\n');
    }
    s
}

/// Per trace, core count and NIC profile: rsspp and dyssect side by side
/// (moves done, moves still queued in the NIC at the end, imbalance,
/// throughput, the priority class's and the other traffic's p99).
pub fn nic_table(rows: &[Row], profiles: &[NicProfile]) -> String {
    let side = |r: Option<&Row>| match r {
        Some(r) => format!(
            "{:>6} {:>7} {:>8.1}% {:>7.2} {:>9.1} {:>9.1}",
            r.moves,
            r.moves_pending,
            r.imbalance * 100.0,
            r.mpps,
            r.prio_p99_us,
            r.normal_p99_us
        ),
        None => format!("{:>6} {:>7} {:>9} {:>7} {:>9} {:>9}", "-", "-", "-", "-", "-", "-"),
    };
    let head = format!(
        "{:>6} {:>7} {:>9} {:>7} {:>9} {:>9}",
        "moves", "pending", "imbalance", "Mpps", "prio p99", "other p99"
    );
    let mut s = format!("{:<10} {:>5} {:<10} | rsspp {head} | dyssect {head}\n", "trace", "cores", "nic");
    let mut keys: Vec<(&str, usize, &str)> = rows.iter().map(|r| (r.trace.as_str(), r.cores, r.nic.as_str())).collect();
    keys.dedup();
    for (t, n, nic) in keys {
        let find = |st: &str| rows.iter().find(|r| r.trace == t && r.cores == n && r.nic == nic && r.strategy == st);
        s.push_str(&format!(
            "{t:<10} {n:>4}p {nic:<10} |       {} |         {}\n",
            side(find("rsspp")),
            side(find("dyssect"))
        ));
    }
    for p in profiles {
        s.push_str(&format!("nic {}\n", p.describe()));
    }
    s.push_str("(moves: completed, state handed over; pending: changes requested but still queued in the NIC at the end; imbalance after the first second; p99 in us, virtual time)\n");
    s
}

/// One PNG per trace, core count and NIC profile: imbalance per window over time, a line per strategy.
pub fn plot(rows: &[Row], dir: &Path) -> Result<Vec<PathBuf>, String> {
    let text = crate::plot::register_font();
    let mut out = Vec::new();
    let mut keys: Vec<(String, usize, String)> =
        rows.iter().map(|r| (r.trace.clone(), r.cores, r.nic.clone())).collect();
    keys.dedup();
    for (t, n, nic) in keys {
        let path = match nic.as_str() {
            "ideal" => dir.join(format!("dyssect-{t}-{n}.png")),
            _ => dir.join(format!("dyssect-{t}-{n}-{nic}.png")),
        };
        let mine: Vec<&Row> = rows.iter().filter(|r| r.trace == t && r.cores == n && r.nic == nic).collect();
        let xmax = mine.iter().map(|r| r.imbalance_windows.len()).max().unwrap_or(1).max(2) as f64 * 0.1;
        let root = BitMapBackend::new(&path, (1300, 600)).into_drawing_area();
        let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
        root.fill(&WHITE).map_err(|e| err(&e))?;
        crate::plot::footer(&root, text).map_err(|e| err(&e))?;
        let root = root.margin(0, 20, 0, 0);
        let (plot_area, legend) = root.split_horizontally(940);
        let mut b = ChartBuilder::on(&plot_area);
        b.margin(20);
        if text {
            let on = if nic == "ideal" { String::new() } else { format!(" ({nic} NIC)") };
            b.caption(format!("{t}, {n} projected cores{on}: load imbalance per 100 ms window"), ("sans-serif", 20))
                .x_label_area_size(40)
                .y_label_area_size(60);
        }
        let mut chart = b.build_cartesian_2d(0.0f64..xmax, 0.0f64..1.0).map_err(|e| err(&e))?;
        if text {
            chart
                .configure_mesh()
                .x_desc("seconds of the run")
                .y_desc("imbalance: (busiest - least busy) / busiest")
                .draw()
                .map_err(|e| err(&e))?;
        } else {
            chart.configure_mesh().disable_x_mesh().disable_y_mesh().draw().map_err(|e| err(&e))?;
        }
        let mut entries = vec![(crate::plot::Sample::Heading, "strategy (projected Mpps)".to_string())];
        for (i, r) in mine.iter().enumerate() {
            let pts: Vec<(f64, f64)> =
                r.imbalance_windows.iter().enumerate().map(|(k, &v)| (k as f64 * 0.1, v)).collect();
            let c = crate::plot::colour(i);
            chart.draw_series(LineSeries::new(pts, c.stroke_width(2))).map_err(|e| err(&e))?;
            let flagged = if r.trust.ok() { "" } else { ", FLAGGED: see the table" };
            entries.push((crate::plot::Sample::Line(c), format!("{} ({:.1} Mpps{flagged})", r.strategy, r.mpps)));
        }
        if text {
            crate::plot::side_legend(&legend, &entries).map_err(|e| err(&e))?;
        }
        root.present().map_err(|e| err(&e))?;
        drop(chart);
        drop(root);
        out.push(path.clone());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceiling_bounds_flow_and_entry_placement() {
        // One flow carries everything: no placement helps (bound = LPT = every packet).
        let one = GenConfig {
            flows: 100,
            packets: 20_000,
            dist: FlowDist::Elephants { k: 1, share: 1.0 },
            ..GenConfig::default()
        };
        let c = ceiling(&one, 8).unwrap();
        assert_eq!((c.packets, c.phases), (20_000, 1));
        assert_eq!(c.flow_bound, 20_000.0);
        assert_eq!(c.entry_lpt, 20_000.0);
        assert!((c.top_flow_share - 1.0).abs() < 1e-12);
        // Many even flows: the flow bound is the even share, entries place within a few percent of it.
        let even = GenConfig { flows: 50_000, packets: 400_000, ..GenConfig::default() };
        let c = ceiling(&even, 8).unwrap();
        assert_eq!(c.flow_bound, 50_000.0);
        assert!(c.entry_lpt >= c.flow_bound && c.flow_over_entries() < 1.02, "{c:?}");
        // Shifting: one phase per shift, each bounded by its own heaviest flow.
        let shifting = GenConfig {
            flows: 1000,
            packets: 40_000,
            dist: FlowDist::Elephants { k: 2, share: 0.8 },
            shift_every: Some(10_000),
            ..GenConfig::default()
        };
        let c = ceiling(&shifting, 8).unwrap();
        assert_eq!(c.phases, 4);
        // Two elephants of ~40% each: each phase's busiest core holds at least one (~4,000 packets).
        assert!(c.flow_bound > 4.0 * 3_800.0 && c.flow_bound < 4.0 * 4_300.0, "{c:?}");
        assert!(c.entry_lpt >= c.flow_bound);
        // A RETA of one entry puts everything on one core: LPT = every packet.
        let c1 = ceiling_with_reta(&shifting, 8, 1).unwrap();
        assert_eq!(c1.entry_lpt, 40_000.0);
        let o = DyssectOptions {
            packets: 20_000,
            flows: 1000,
            cores: vec![8],
            traces: vec!["shifting".into()],
            ..DyssectOptions::new(true)
        };
        let t = ceiling_table(&o, &[128, 512]).unwrap();
        assert_eq!(t.lines().filter(|l| l.starts_with("shifting")).count(), 2, "{t}");
    }

    #[test]
    fn quick_run_measures_every_strategy_and_plots() {
        let o = DyssectOptions {
            seconds: 1.2,
            packets: 50_000,
            flows: 5_000,
            cores: vec![4],
            traces: vec!["shifting".into()],
            ..DyssectOptions::new(true)
        };
        let rows = run_dyssect(&o, |_| {}).unwrap();
        assert_eq!(rows.len(), 3);
        assert!(rows.iter().all(|r| r.mpps > 0.0), "{rows:?}");
        assert!(rows.iter().find(|r| r.strategy == "dyssect").unwrap().vs_rsspp.is_some());
        assert!(table(&rows, o.slo_us).contains("dyssect"));
        let dir = std::env::temp_dir().join(format!("fp-dyssect-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let files = plot(&rows, &dir).unwrap();
        assert_eq!(files.len(), 1);
        assert_eq!(&std::fs::read(&files[0]).unwrap()[1..4], b"PNG");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn nic_table_puts_rsspp_and_dyssect_side_by_side_per_profile() {
        let row = |strategy: &str, nic: &str, moves: u64, pending: usize| Row {
            trace: "zipf".into(),
            strategy: strategy.into(),
            cores: 8,
            nic: nic.into(),
            moves_pending: pending,
            nic_updates: 0,
            nic_waited_max_ms: 0.0,
            mpps: 1.5,
            vs_rsspp: None,
            imbalance: 0.25,
            prio_p99_us: 10.0,
            normal_p99_us: 20.0,
            within_slo: true,
            moves,
            flow_moves: 0,
            controller_ms: 0.0,
            decisions: 0,
            imbalance_windows: Vec::new(),
            flows_moved: 0,
            core_packets: Vec::new(),
            core_busy_ms: Vec::new(),
            ceiling_mpps: 0.0,
            flow_over_entries: 1.0,
            top_flow_share: 0.0,
            spread: None,
            trust: Trust::default(),
        };
        let rows = [row("rsspp", "ideal", 40, 0), row("dyssect", "ideal", 12, 0), row("rsspp", "connectx4", 8, 32)];
        let profiles = [NicProfile::ideal(), NicProfile::parse("connectx4").unwrap()];
        let t = nic_table(&rows, &profiles);
        let line = |nic: &str| t.lines().find(|l| l.starts_with("zipf") && l.contains(nic)).unwrap().to_string();
        let cols = |l: String| l.split_whitespace().map(String::from).collect::<Vec<_>>();
        // trace, cores, nic, |, rsspp's six figures, |, dyssect's six.
        let ideal = cols(line("ideal"));
        assert_eq!((&ideal[4][..], &ideal[5][..], &ideal[11][..]), ("40", "0", "12"), "{t}");
        let cx = cols(line("connectx4"));
        assert_eq!((&cx[4][..], &cx[5][..], &cx[11][..]), ("8", "32", "-"), "{t}");
        assert!(t.contains("nic connectx4 (RETA update 359.23 ms"), "{t}");
    }
}
