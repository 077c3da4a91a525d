//! `flowplane bench interleave`: GuNFu's experiment on this machine — one
//! core, in-memory replay, 64-byte packets, uniformly random flow order —
//! each case under `rtc`, `batch` and `interleaved:K` for every K, in one
//! run so ratios between rows are meaningful on a shared machine. Cases:
//! the synthetic NF with k = 1, 2, 4, 8 dependent reads; `nat` at 1M flows;
//! `route` over a full-size generated IPv4 table; `fw` on two-way TCP
//! connections; `lb -> fsc -> ratelimit`; chains of 2 to 6 NFs from lb,
//! nat, fw, acl and route.
//!
//! The route table: `prefixes` IPv4 prefixes (default 1M, about a full BGP
//! table) drawn with the length distribution of public BGP tables (RouteViews
//! 2023: /24 about 60%, /22 12%, /23 10%, /21 5%, /20 4%, /19 3%, /16 1.3%,
//! /8../15 1%, longer than /24 under 2% — kept to exercise DIR-24-8's second
//! level), at random addresses in 1.0.0.0..224.0.0.0, next hops 0..16. Each
//! flow's destination is a random address inside a random route (fixed per
//! flow), so lookups spread over the 64 MiB first-level table as real
//! traffic to a full table does.

use rand::{Rng as _, SeedableRng};
use rand_xoshiro::SplitMix64;
use std::fmt;
use std::io::Write as _;
use std::sync::Arc;

use flowplane_engine::exec::{ExecConfig, ExecKind};
use flowplane_io::replay::{ReplayBuilder, ReplayTrace};
use flowplane_scale::{Dispatch, RssDispatcher};
use flowplane_trace::gen::{FlowDist, GenConfig, Generator, Order, Proto, SizeSpec};
use serde::Serialize;

use crate::pipeline::{trace_with, Measure, PipelineOptions};

/// What to run.
#[derive(Clone, Debug)]
pub struct InterleaveOptions {
    /// Flows in the nat, route and chain traces.
    pub flows: u64,
    /// Flows in the synthetic NF's trace (fewer: its chase, not the flow
    /// table, is the point, and a slow row must still see every flow
    /// during its warm-up).
    pub synthetic_flows: u64,
    /// Seconds of warm-up before each measurement (every flow must exist by then).
    pub warmup: f64,
    /// Seconds per measurement.
    pub seconds: f64,
    /// Packets per batch.
    pub batch: usize,
    /// Tasks in flight to try.
    pub ks: Vec<u16>,
    /// Dependent reads of the synthetic NF.
    pub synthetic_k: Vec<u32>,
    /// Route-table size.
    pub prefixes: usize,
    /// Cases to run (empty: all): synthetic, nat, route, fw, chain, chains, opt.
    pub only: Vec<String>,
    /// Rounds over every case (`--reps`): each row's figure is the median, with min and max.
    pub reps: usize,
}

impl Default for InterleaveOptions {
    fn default() -> Self {
        InterleaveOptions {
            flows: 1_000_000,
            synthetic_flows: 100_000,
            warmup: 2.0,
            seconds: 1.0,
            batch: 64,
            ks: vec![1, 2, 4, 8, 16, 32, 64],
            synthetic_k: vec![1, 2, 4, 8],
            prefixes: 1_000_000,
            only: Vec::new(),
            reps: 1,
        }
    }
}

impl InterleaveOptions {
    /// Small and short, for CI smoke runs.
    pub fn quick() -> Self {
        InterleaveOptions {
            flows: 16_000,
            synthetic_flows: 16_000,
            warmup: 0.1,
            seconds: 0.1,
            ks: vec![1, 16],
            synthetic_k: vec![1, 4],
            prefixes: 10_000,
            ..InterleaveOptions::default()
        }
    }

    fn wants(&self, c: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|o| o == c)
    }
}

/// One measurement.
#[derive(Clone, Debug, Serialize)]
pub struct InterleaveRow {
    /// Case (`synthetic k=8`, `nat`, `route`, `lb -> fsc -> ratelimit`).
    pub case: String,
    /// Chain spec.
    pub chain: String,
    /// Executor (`interleaved:K` names K).
    pub exec: String,
    /// Tasks in flight (interleaved rows).
    pub k: Option<u16>,
    /// Flows in the trace.
    pub flows: u64,
    /// Million packets/s (one core).
    pub mpps: f64,
    /// TSC cycles per packet.
    pub cycles_per_packet: f64,
    /// Throughput over the case's `rtc` row.
    pub vs_rtc: f64,
    /// Throughput over the case's `batch` row.
    pub vs_batch: f64,
    /// Process CPU time over wall time: below 1 when other processes took the core.
    pub cpu_share: f64,
    /// `mpps` over `--reps` rounds (None with one).
    pub spread: Option<crate::reps::Spread>,
    /// What the figure rests on and why not to quote it ([`flowplane_engine::trust`]).
    pub trust: crate::reps::Trust,
}

/// Per case: the best interleaved K and what it gains.
#[derive(Clone, Debug, Serialize)]
pub struct InterleaveBest {
    /// Case.
    pub case: String,
    /// Best K.
    pub k: u16,
    /// Its throughput over rtc.
    pub vs_rtc: f64,
    /// Its throughput over batch.
    pub vs_batch: f64,
    /// interleaved:1 over rtc (the scheduler's cost with nothing to overlap).
    pub k1_vs_rtc: Option<f64>,
}

/// All rows and the summary.
#[derive(Clone, Debug, Serialize)]
pub struct InterleaveReport {
    /// Rows in run order.
    pub rows: Vec<InterleaveRow>,
    /// Best K per case.
    pub best: Vec<InterleaveBest>,
    /// How the route table was generated.
    pub route_table: Option<String>,
    /// What redundant-match removal and data packing gain (the `opt` case).
    pub chain_opts: Option<ChainOpts>,
}

/// The chain-level optimisations measured on six 5-tuple NFs.
#[derive(Clone, Debug, Serialize)]
pub struct ChainOpts {
    /// The chain.
    pub chain: String,
    /// `batch` (one match for the chain) over `batch --no-match-sharing` (one match per NF).
    pub match_sharing_gain: Option<f64>,
    /// `batch` over `batch --no-packing`.
    pub packing_gain_batch: Option<f64>,
    /// `interleaved:16` over `interleaved:16 --no-packing`.
    pub packing_gain_interleaved: Option<f64>,
    /// The six-NF chain whose every NF keeps all its state in the flow's
    /// block (`route` as the sixth NF instead of `fw`, whose connection
    /// table is a second, private match no chain-level sharing removes).
    pub block_only_chain: String,
    /// `batch` over `batch --no-match-sharing` on that chain.
    pub match_sharing_gain_block_only: Option<f64>,
}

/// The case name of the chain-optimisation rows.
const OPT_CASE: &str = "6 five-tuple NFs";

/// Six NFs keyed on the 5-tuple (the redundant-match case): one match serves them all.
const SIX_FIVE_TUPLE: &str = "lb -> fsc -> ratelimit(pps=1000000000) -> acl -> hh -> fw(allow_new=any)";

/// The case name of the redundant-match rows whose NFs keep no private table.
const OPT_CASE_BLOCK: &str = "6 five-tuple NFs, route";

/// The first five of [`SIX_FIVE_TUPLE`], then `route` to the load
/// balancer's backends (`LB_ROUTES`): every NF's state is in the flow's block.
const FIVE_BEFORE_ROUTE: &str = "lb -> fsc -> ratelimit(pps=1000000000) -> acl -> hh";

/// The routes of that chain: lb's default backends (10.10.0.1-16) on port 2, the rest on port 1.
const LB_ROUTES: &str = "0.0.0.0/0 1\n10.10.0.0/24 2\n";

/// The NAT of the 1M-flow cases: 16 addresses x 64512 ports, a port for each flow.
const NAT_1M: &str = "nat(addrs=16, ports=1024-65535, timeout=3600)";

/// Which generated traffic a case runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Traffic {
    /// UDP, 10.0.0.0/8 to 172.16.0.0/12.
    Udp,
    /// Two-way TCP connections (handshake, data, FIN).
    TcpBidir,
    /// UDP with each flow's destination inside a route of the generated table.
    Routed,
}

/// SplitMix64 seeded with exactly `seed` (its state), from rand_xoshiro.
fn rng(seed: u64) -> SplitMix64 {
    SplitMix64::from_seed(seed.to_le_bytes())
}

/// Prefix lengths in per-mille of a public BGP table (see the module docs).
const LENGTHS: &[(u8, u32)] = &[
    (8, 1),
    (10, 1),
    (12, 1),
    (13, 1),
    (14, 2),
    (15, 3),
    (16, 13),
    (17, 8),
    (18, 14),
    (19, 28),
    (20, 42),
    (21, 50),
    (22, 120),
    (23, 100),
    (24, 597),
    (25, 4),
    (26, 4),
    (27, 3),
    (28, 3),
    (29, 2),
    (30, 2),
    (32, 1),
];

/// `n` routes `(network, length, port)`.
fn gen_routes(n: usize, seed: u64) -> Vec<(u32, u8, u16)> {
    let total: u32 = LENGTHS.iter().map(|l| l.1).sum();
    let mut rng = rng(seed);
    (0..n)
        .map(|_| {
            let mut x = (rng.next_u64() % u64::from(total)) as u32;
            let len = LENGTHS
                .iter()
                .find(|(_, w)| {
                    if x < *w {
                        true
                    } else {
                        x -= w;
                        false
                    }
                })
                .map_or(24, |l| l.0);
            // 1.0.0.0 .. 224.0.0.0 (unicast).
            let a = 0x0100_0000 + (rng.next_u64() % (0xe000_0000 - 0x0100_0000)) as u32;
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - u32::from(len)) };
            (a & mask, len, (rng.next_u64() % 16) as u16)
        })
        .collect()
}

/// Writes the route file; returns its path.
fn write_routes(routes: &[(u32, u8, u16)]) -> Result<std::path::PathBuf, String> {
    let path = std::env::temp_dir().join(format!("flowplane-bench-routes-{}.txt", std::process::id()));
    let f = std::fs::File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut w = std::io::BufWriter::new(f);
    for (a, l, p) in routes {
        writeln!(w, "{}/{l} {p}", std::net::Ipv4Addr::from(*a)).map_err(|e| e.to_string())?;
    }
    w.flush().map_err(|e| e.to_string())?;
    Ok(path)
}

/// The standard trace with each flow's destination moved inside a random route.
fn route_trace(flows: u64, routes: &[(u32, u8, u16)]) -> Result<Arc<ReplayTrace>, String> {
    let cfg = GenConfig {
        flows,
        packets: (flows * 4).max(2_000_000),
        size: SizeSpec::Fixed(64),
        dist: FlowDist::Uniform,
        order: Order::Random,
        proto: Proto::Udp,
        seed: 7,
        ..GenConfig::default()
    };
    let mut gen = Generator::new(cfg).map_err(|e| e.to_string())?;
    let dispatch = RssDispatcher::new(1, false).map_err(|e| e.to_string())?;
    let mut b = ReplayBuilder::new(1);
    b.reserve(gen.remaining() as usize, 64);
    let mut buf = Vec::with_capacity(2048);
    while let Some(ts) = gen.next_frame(&mut buf) {
        // Ethernet + IPv4 (20 bytes) + UDP: the generator's 64-byte UDP frames.
        if buf.len() >= 42 && buf[12..14] == [0x08, 0x00] && buf[14] == 0x45 && !routes.is_empty() {
            // The flow's identity (source address and ports) picks its route and host.
            let id = u64::from_be_bytes(buf[26..34].try_into().unwrap_or([0; 8]))
                ^ u64::from(u32::from_be_bytes(buf[34..38].try_into().unwrap_or([0; 4])));
            let mut rng = rng(id);
            let (net, len, _) = routes[(rng.next_u64() % routes.len() as u64) as usize];
            let host = if len >= 32 { 0 } else { u32::MAX >> len };
            let dst = net | (rng.next_u64() as u32 & host);
            buf[30..34].copy_from_slice(&dst.to_be_bytes());
            buf[24..26].fill(0);
            let c = flowplane_wire::checksum::checksum(&buf[14..34]);
            buf[24..26].copy_from_slice(&c.to_be_bytes());
            // UDP over IPv4: checksum 0 = none (the pseudo-header changed).
            buf[40..42].fill(0);
        }
        let (q, h) = dispatch.classify(&buf).unwrap_or((0, 0));
        b.push(usize::from(q), &buf, h, ts).map_err(|e| e.to_string())?;
    }
    Ok(b.build())
}

/// Runs the cases.
pub fn run_interleave(opts: &InterleaveOptions) -> Result<InterleaveReport, String> {
    let popts = PipelineOptions {
        seconds: opts.seconds,
        batch: opts.batch,
        warmup: Some(opts.warmup),
        ..PipelineOptions::default()
    };
    let m = Measure { opts: &popts };
    // One match per NF inserts every flow into six tables: warm up longer.
    let popts_opt = PipelineOptions { warmup: Some(4.0 * opts.warmup), ..popts.clone() };
    let m_opt = Measure { opts: &popts_opt };
    let mut execs: Vec<ExecKind> = vec![ExecKind::parse("rtc").map_err(|e| e.to_string())?, ExecKind::BATCH];
    for &k in &opts.ks {
        execs.push(ExecKind::parse(&format!("interleaved:{k}")).map_err(|e| e.to_string())?);
    }
    // (case, chain, traffic, flows)
    let mut cases: Vec<(String, String, Traffic, u64)> = Vec::new();
    if opts.wants("synthetic") {
        for &k in &opts.synthetic_k {
            cases.push((format!("synthetic k={k}"), format!("synthetic(k={k})"), Traffic::Udp, opts.synthetic_flows));
        }
    }
    if opts.wants("nat") {
        cases.push(("nat".into(), NAT_1M.into(), Traffic::Udp, opts.flows));
    }
    let mut route_table = None;
    let mut routes_path = None;
    let mut routes = Vec::new();
    if opts.wants("route") || opts.wants("chains") {
        routes = gen_routes(opts.prefixes, 42);
        let tbl8 = routes.iter().filter(|r| r.1 > 24).count();
        route_table = Some(format!(
            "{} IPv4 prefixes, BGP-like lengths (/24 60%, /22 12%, /23 10%, ..., >/24 {:.1}%), random unicast networks, 16 next hops",
            routes.len(),
            100.0 * tbl8 as f64 / routes.len().max(1) as f64
        ));
        routes_path = Some(write_routes(&routes)?);
    }
    let route = format!("route(routes={})", routes_path.as_ref().map(|p| p.display().to_string()).unwrap_or_default());
    if opts.wants("route") {
        cases.push(("route".into(), route.clone(), Traffic::Routed, opts.flows));
    }
    if opts.wants("fw") {
        cases.push(("fw tcp-bidir".into(), "fw(allow_new=any)".into(), Traffic::TcpBidir, opts.flows));
    }
    if opts.wants("chain") {
        let chain = "lb -> fsc -> ratelimit(pps=1000000000)";
        cases.push(("lb -> fsc -> ratelimit".into(), chain.into(), Traffic::Udp, opts.flows));
    }
    if opts.wants("chains") {
        let nfs = ["lb", NAT_1M, "fw(allow_new=any)", "acl", route.as_str(), "acl(rule=drop:udp:any:any:any:1)"];
        for len in 2..=6 {
            cases.push((format!("chain of {len}"), nfs[..len].join(" -> "), Traffic::Routed, opts.flows));
        }
    }
    // Every case runs under each executor; the chain-optimisation case adds
    // the switches of redundant-match removal and data packing.
    let plain: Vec<(String, ExecConfig)> =
        execs.iter().map(|&kind| (kind.to_string(), ExecConfig { kind, ..ExecConfig::default() })).collect();
    let mut variants: Vec<Vec<(String, ExecConfig)>> = vec![plain.clone(); cases.len()];
    if opts.wants("opt") {
        cases.push((OPT_CASE.into(), SIX_FIVE_TUPLE.into(), Traffic::Udp, opts.flows));
        let il = ExecKind::parse("interleaved:16").map_err(|e| e.to_string())?;
        let mut v = plain[..1].to_vec();
        for (kind, label) in [(ExecKind::BATCH, "batch"), (il, "interleaved:16")] {
            let on = ExecConfig { kind, ..ExecConfig::default() };
            v.push((label.to_string(), on));
            v.push((format!("{label} --no-packing"), ExecConfig { packing: false, ..on }));
        }
        v.push(("batch --no-match-sharing".into(), ExecConfig { match_sharing: false, ..ExecConfig::default() }));
        variants.push(v);
    }
    let mut lb_routes_path = None;
    if opts.wants("opt") {
        let path = std::env::temp_dir().join(format!("flowplane-bench-lb-routes-{}.txt", std::process::id()));
        std::fs::write(&path, LB_ROUTES).map_err(|e| format!("{}: {e}", path.display()))?;
        let chain = format!("{FIVE_BEFORE_ROUTE} -> route(routes={})", path.display());
        lb_routes_path = Some(path);
        cases.push((OPT_CASE_BLOCK.into(), chain, Traffic::Udp, opts.flows));
        let mut v = plain[..2].to_vec();
        v.push(("batch --no-match-sharing".into(), ExecConfig { match_sharing: false, ..ExecConfig::default() }));
        variants.push(v);
    }
    let mut traces: Vec<(u64, Traffic, Arc<ReplayTrace>)> = Vec::new();
    // One round over every case and variant; `--reps` rounds, merged around each row's median.
    let round = |_: usize| -> Result<Vec<InterleaveRow>, String> {
        let mut rows = Vec::new();
        for ((case, chain, traffic, flows), variants) in cases.iter().zip(&variants) {
            let (flows, traffic) = (*flows, *traffic);
            let trace = match traces.iter().find(|t| t.0 == flows && t.1 == traffic) {
                Some(t) => t.2.clone(),
                None => {
                    let t = match traffic {
                        Traffic::Udp => trace_with(flows, Proto::Udp)?,
                        Traffic::TcpBidir => trace_with(flows, Proto::TcpBidir)?,
                        Traffic::Routed => route_trace(flows, &routes)?,
                    };
                    traces.push((flows, traffic, t.clone()));
                    t
                }
            };
            for (label, knobs) in variants {
                let m = if case == OPT_CASE || case == OPT_CASE_BLOCK { &m_opt } else { &m };
                let r = m.one_with(&trace, chain, *knobs, flows, None, None)?;
                let kind = knobs.kind;
                let k = (kind.name().eq("interleaved") && knobs.packing).then(|| kind.param());
                rows.push(InterleaveRow {
                    case: case.clone(),
                    chain: chain.clone(),
                    exec: label.clone(),
                    k,
                    flows,
                    mpps: r.mpps,
                    cycles_per_packet: r.cycles_per_packet,
                    vs_rtc: 1.0,
                    vs_batch: 1.0,
                    cpu_share: r.cpu_share,
                    spread: None,
                    trust: r.trust,
                });
            }
        }
        Ok(rows)
    };
    let mut rows: Vec<InterleaveRow> =
        crate::reps::settle(crate::reps::repeat(opts.reps, round, |r| Some(r.mpps))?, |r| {
            (&mut r.trust, &mut r.spread)
        });
    // Each case's first variant is rtc, its second batch.
    for (case, _, _, _) in &cases {
        let at: Vec<usize> = (0..rows.len()).filter(|&i| rows[i].case == *case).collect();
        let (Some(&a), Some(&b)) = (at.first(), at.get(1)) else { continue };
        let (rtc, batch) = (rows[a].mpps, rows[b].mpps);
        for &i in &at {
            let r = &mut rows[i];
            r.vs_rtc = if rtc > 0.0 { r.mpps / rtc } else { 0.0 };
            r.vs_batch = if batch > 0.0 { r.mpps / batch } else { 0.0 };
        }
    }
    let of_case = |case: &str, label: &str| rows.iter().find(|r| r.case == case && r.exec == label).map(|r| r.mpps);
    let of = |label: &str| of_case(OPT_CASE, label);
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    let chain_opts = ChainOpts {
        chain: SIX_FIVE_TUPLE.to_string(),
        match_sharing_gain: ratio(of("batch"), of("batch --no-match-sharing")),
        packing_gain_batch: ratio(of("batch"), of("batch --no-packing")),
        packing_gain_interleaved: ratio(of("interleaved:16"), of("interleaved:16 --no-packing")),
        block_only_chain: format!("{FIVE_BEFORE_ROUTE} -> route"),
        match_sharing_gain_block_only: ratio(
            of_case(OPT_CASE_BLOCK, "batch"),
            of_case(OPT_CASE_BLOCK, "batch --no-match-sharing"),
        ),
    };
    for p in [routes_path, lb_routes_path].into_iter().flatten() {
        let _ = std::fs::remove_file(p);
    }
    let best = cases
        .iter()
        .filter_map(|(case, _, _, _)| {
            let il = rows.iter().filter(|r| &r.case == case && r.k.is_some());
            let b = il.clone().max_by(|a, b| a.mpps.total_cmp(&b.mpps))?;
            Some(InterleaveBest {
                case: case.clone(),
                k: b.k.unwrap_or(0),
                vs_rtc: b.vs_rtc,
                vs_batch: b.vs_batch,
                k1_vs_rtc: il.clone().find(|r| r.k == Some(1)).map(|r| r.vs_rtc),
            })
        })
        .collect();
    let chain_opts = opts.wants("opt").then_some(chain_opts);
    Ok(InterleaveReport { rows, best, route_table, chain_opts })
}

impl InterleaveReport {
    /// Writes a PNG: throughput (Mpps) against K (log scale, a tick at every K measured) for each case, with each
    /// case's `batch` and `rtc` figures as dashed and dotted levels in the case's colour; the legend beside the
    /// plot names every case and the two baseline styles.
    pub fn plot_png(&self, path: &std::path::Path) -> Result<(), String> {
        use crate::plot::Sample;
        use plotters::prelude::*;
        if !crate::plot::register_font() {
            return Err("no TrueType font found for the plot's text (install fonts-dejavu-core)".to_string());
        }
        let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
        let cases: Vec<&str> = self.rows.iter().fold(Vec::new(), |mut v, r| {
            if !v.contains(&r.case.as_str()) {
                v.push(r.case.as_str());
            }
            v
        });
        let mut ks: Vec<u16> = self.rows.iter().filter_map(|r| r.k).fold(Vec::new(), |mut v, k| {
            if !v.contains(&k) {
                v.push(k);
            }
            v
        });
        ks.sort_unstable();
        let (kmin, kmax) = (ks.first().copied().unwrap_or(1), ks.last().copied().unwrap_or(64).max(2));
        let ymax =
            self.rows.iter().map(|r| r.spread.as_ref().map_or(r.mpps, |s| s.max.max(r.mpps))).fold(1.0f64, f64::max)
                * 1.1;
        let root = BitMapBackend::new(path, (1500, 800)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        crate::plot::footer(&root, true).map_err(|e| err(&e))?;
        let root = root.margin(0, 22, 0, 0);
        let (plot, legend) = root.split_horizontally(1140);
        // A little room left and right of the extreme Ks, so their markers are not cut by the axes.
        let (x0, x1) = (f64::from(kmin) / 1.15, f64::from(kmax) * 1.15);
        let keys: Vec<f64> = ks.iter().map(|&k| f64::from(k)).collect();
        let mut chart = ChartBuilder::on(&plot)
            .caption(
                format!(
                    "interleaved:K against rtc and batch, one core, 64-B packets{}",
                    crate::plot::flagged_note(self.rows.iter().any(|r| !r.trust.ok()))
                ),
                ("sans-serif", 22),
            )
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(60)
            .build_cartesian_2d((x0..x1).log_scale().with_key_points(keys), 0.0..ymax)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc("K (tasks in flight per core, log scale)")
            .y_desc("Mpps")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .draw()
            .map_err(|e| err(&e))?;
        let mut entries: Vec<(Sample, String)> = vec![(Sample::Heading, "case (interleaved:K)".to_string())];
        for (n, case) in cases.iter().enumerate() {
            let c = crate::plot::colour(n);
            let color = c.to_rgba();
            let rows: Vec<&InterleaveRow> = self.rows.iter().filter(|r| r.case == *case).collect();
            let pts: Vec<(f64, f64)> = rows.iter().filter_map(|r| r.k.map(|k| (f64::from(k), r.mpps))).collect();
            chart.draw_series(LineSeries::new(pts, color.stroke_width(2))).map_err(|e| err(&e))?;
            let marks: Vec<crate::plot::Mark> = rows
                .iter()
                .filter_map(|r| {
                    r.k.map(|k| crate::plot::Mark {
                        x: f64::from(k),
                        y: r.mpps,
                        bar: r.spread.as_ref().map(|s| (s.min, s.max)),
                        ok: r.trust.ok(),
                    })
                })
                .collect();
            let triangle = crate::plot::marker_triangle(n);
            crate::plot::marks(&mut chart, &marks, color, triangle).map_err(|e| err(&e))?;
            for (exec, dash) in [("batch", 12u32), ("rtc", 3u32)] {
                if let Some(r) = rows.iter().find(|r| r.exec == exec) {
                    chart
                        .draw_series(DashedLineSeries::new(
                            vec![(x0, r.mpps), (x1, r.mpps)],
                            dash,
                            6,
                            color.stroke_width(1),
                        ))
                        .map_err(|e| err(&e))?;
                }
            }
            entries.push((if triangle { Sample::SeriesTriangle(c) } else { Sample::Series(c) }, case.to_string()));
        }
        let grey = RGBColor(90, 90, 90);
        entries.extend([
            (Sample::Heading, String::new()),
            (Sample::Heading, "baselines, in the case's colour".to_string()),
            (Sample::Dashed(grey), "batch executor".to_string()),
            (Sample::Dotted(grey), "rtc executor".to_string()),
            (Sample::Hollow, "flagged: not to quote".to_string()),
            (Sample::Range, "min-max over --reps".to_string()),
        ]);
        crate::plot::side_legend(&legend, &entries).map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
        Ok(())
    }
}

impl fmt::Display for InterleaveReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "interleave: 1 core, in-memory replay, 64-B packets, uniformly random flow order")?;
        if let Some(t) = &self.route_table {
            writeln!(f, "route table: {t}")?;
        }
        writeln!(
            f,
            "{:<24} {:<28} {:>8} {:>8} {:>13} {:>11} {:>7} {:>7} {:>5}",
            "case", "exec", "flows", "Mpps", "min-max", "cycles/pkt", "vs rtc", "vs bat", "cpu%"
        )?;
        for r in &self.rows {
            writeln!(
                f,
                "{:<24} {:<28} {:>8} {:>8.2} {:>13} {:>11.1} {:>7.2} {:>7.2} {:>4.0}%{}",
                r.case,
                r.exec,
                r.flows,
                r.mpps,
                r.spread.as_ref().map_or("-".to_string(), |x| x.cell(2)),
                r.cycles_per_packet,
                r.vs_rtc,
                r.vs_batch,
                r.cpu_share * 100.0,
                r.trust.cell()
            )?;
        }
        if let Some(n) = crate::reps::footnote(self.rows.iter().map(|r| &r.trust)) {
            writeln!(f, "{n}")?;
        }
        writeln!(f, "\nbest K per case:")?;
        for b in &self.best {
            writeln!(
                f,
                "{:<24} K={:<3} {:.2}x rtc, {:.2}x batch; K=1 {}",
                b.case,
                b.k,
                b.vs_rtc,
                b.vs_batch,
                b.k1_vs_rtc.map_or_else(|| "-".to_string(), |x| format!("{x:.2}x rtc"))
            )?;
        }
        if let Some(o) = &self.chain_opts {
            let x = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.2}x"));
            writeln!(f, "\nchain-level optimisations on {}:", o.chain)?;
            writeln!(f, "redundant-match removal (one match vs one per NF, batch): {}", x(o.match_sharing_gain))?;
            writeln!(
                f,
                "redundant-match removal on {} (every state in the flow's block): {}",
                o.block_only_chain,
                x(o.match_sharing_gain_block_only)
            )?;
            writeln!(
                f,
                "data packing: batch {}, interleaved:16 {}",
                x(o.packing_gain_batch),
                x(o.packing_gain_interleaved)
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_lengths_follow_the_table() {
        let r = gen_routes(100_000, 1);
        let share = |l: u8| r.iter().filter(|x| x.1 == l).count() as f64 / r.len() as f64;
        assert!((share(24) - 0.597).abs() < 0.01, "{}", share(24));
        assert!((share(22) - 0.12).abs() < 0.01);
        assert!(r.iter().all(|&(a, l, p)| (0x0100_0000..0xe000_0000).contains(&a) && (8..=32).contains(&l) && p < 16));
        assert!(r.iter().all(|&(a, l, _)| l == 32 || a & (u32::MAX >> l) == 0), "host bits cleared");
    }
}
