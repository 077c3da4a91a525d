//! `flowplane bench ...`: the benchmarks. Each prints a table (or JSON) of
//! figures measured in one run, with ratios against the baselines of the
//! same run. Every suite takes `--reps N` (N rounds over all its rows: the
//! median, min and max of each figure) and flags each figure too short,
//! too small or too noisy to quote (`flowplane_engine::trust`); plots go
//! to `--png DIR`.

use clap::{Args, Subcommand};
use flowplane_bench::attack::{run_attack, AttackOptions, SCENARIOS};
use flowplane_bench::interleave::{run_interleave, InterleaveOptions};
use flowplane_bench::io::{run_io, IoBenchOptions};
use flowplane_bench::parse::{run_parse, ParseBenchOptions};
use flowplane_bench::pipeline::{run_pipeline, PipelineOptions};
use flowplane_bench::table::{self, TableBenchOptions};
use flowplane_bench::upf::{run_upf, UpfBenchOptions};

use std::path::{Path, PathBuf};

use crate::error::CliError;

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub which: BenchCmd,
}

#[derive(Subcommand, Debug)]
pub enum BenchCmd {
    /// Multi-core scaling: throughput vs cores (1, 2 real; more projected, not for shared) per strategy, chain and traffic, with PNG plots.
    Scaling(crate::cmd_scaling::ScalingArgs),
    /// State-compute replication: Mpps vs cores for rss, shared, scr per program and trace; compute limit; loss recovery.
    Scr(crate::cmd_scr::ScrArgs),
    /// Dyssect vs rss and rsspp: projected throughput, imbalance, priority and other p99 latency, moves, controller time.
    Dyssect(crate::cmd_dyssect::DyssectArgs),
    /// I/O-only baseline: replay -> forward -> discard on one core.
    Io {
        /// Flows in the generated trace.
        #[arg(long, default_value_t = 1_000_000, value_parser = crate::num::whole::<u64>(1, 1 << 26))]
        flows: u64,
        /// Packets in the generated trace (replayed in a loop).
        #[arg(long, default_value_t = 4_000_000, value_parser = crate::num::whole::<u64>(1, 1 << 28))]
        packets: u64,
        /// Frame size.
        #[arg(long, default_value_t = 64, value_parser = crate::num::whole::<usize>(60, 9216))]
        size: usize,
        /// Seconds per measurement.
        #[arg(long, default_value_t = 2.0, allow_negative_numbers = true, value_parser = crate::num::positive(3600.0))]
        seconds: f64,
        /// Packets per batch.
        #[arg(long, default_value_t = 64, value_parser = crate::num::whole::<usize>(1, 256))]
        batch: usize,
        /// Rounds over every row: each row shows the median, min and max (1..=100).
        #[arg(long, default_value_t = 1, value_parser = crate::num::whole::<usize>(1, 100))]
        reps: usize,
        /// Small and short (CI smoke run).
        #[arg(long)]
        quick: bool,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Flow-key fast path: cycles/packet of parse to 5-tuple + hash, Toeplitz vs CRC hash (L1/L2/DRAM frame sets).
    Parse {
        /// Seconds per measurement (each of the 48 runs whole blocks until then), as every suite takes; instead of --millions.
        #[arg(long, allow_negative_numbers = true, value_parser = crate::num::positive(600.0))]
        seconds: Option<f64>,
        /// Million packets per measurement (default 20; quick: 0.1).
        #[arg(long, allow_negative_numbers = true, value_parser = crate::num::positive(10000.0))]
        millions: Option<f64>,
        /// Rounds over every row: each row shows the median, min and max (1..=100).
        #[arg(long, default_value_t = 1, value_parser = crate::num::whole::<usize>(1, 100))]
        reps: usize,
        /// Small and short (CI smoke run).
        #[arg(long)]
        quick: bool,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// FAJITA's experiments: throughput vs flows, chain length, executors, prefetch, synthetic NF (one core).
    Pipeline {
        /// Flow counts for the throughput-vs-flows sweep, comma-separated.
        #[arg(long, value_delimiter = ',', value_parser = crate::num::whole::<u64>(1, 1 << 26))]
        flows: Option<Vec<u64>>,
        /// Flows for the chain/executor/prefetch experiments.
        #[arg(long, value_parser = crate::num::whole::<u64>(1, 1 << 26))]
        base_flows: Option<u64>,
        /// Seconds per measurement.
        #[arg(long, allow_negative_numbers = true, value_parser = crate::num::positive(3600.0))]
        seconds: Option<f64>,
        /// Experiments to run (default all): flows,chains,executors,prefetch,synthetic,aux,ipfix (fsc with IPFIX export off vs on),
        /// repl (lb with state replication off vs on: updates/s, Mpps), layout (flow table bucketed vs inline).
        #[arg(long, value_delimiter = ',', value_parser = ["flows", "chains", "executors", "prefetch", "synthetic", "aux", "ipfix", "repl", "layout"])]
        only: Vec<String>,
        /// Also write the rows as CSV to this file.
        #[arg(long)]
        csv: Option<std::path::PathBuf>,
        /// Rounds over every row: each row shows the median, min and max (1..=100).
        #[arg(long, default_value_t = 1, value_parser = crate::num::whole::<usize>(1, 100))]
        reps: usize,
        /// Small and short (CI smoke run).
        #[arg(long)]
        quick: bool,
        /// Run the rows in the opposite order (a check: the figures must not depend on it).
        #[arg(long)]
        reverse: bool,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// GuNFu's experiment: rtc, batch and interleaved:K (K = 1..64) on synthetic k=1..8, nat, route (full table), lb -> fsc -> ratelimit.
    Interleave {
        /// Flows in every case's trace.
        #[arg(long, value_parser = crate::num::whole::<u64>(1, 1 << 24))]
        flows: Option<u64>,
        /// Seconds per measurement.
        #[arg(long, allow_negative_numbers = true, value_parser = crate::num::positive(3600.0))]
        seconds: Option<f64>,
        /// Tasks in flight to try, comma-separated (1..=64).
        #[arg(long, value_delimiter = ',', value_parser = crate::num::whole::<u16>(1, 64))]
        ks: Option<Vec<u16>>,
        /// IPv4 prefixes in the generated route table.
        #[arg(long, value_parser = crate::num::whole::<usize>(0, 4_000_000))]
        prefixes: Option<usize>,
        /// Cases to run (default all): synthetic,nat,route,fw,chain (lb -> fsc -> ratelimit),chains (2..6 NFs),opt (match sharing and packing on/off).
        #[arg(long, value_delimiter = ',', value_parser = ["synthetic", "nat", "route", "fw", "chain", "chains", "opt"])]
        only: Vec<String>,
        /// Seconds of warm-up before each measurement (every flow must be in the tables by then; `opt` warms 4x longer).
        #[arg(long, allow_negative_numbers = true, value_parser = crate::num::real(0.0, 600.0))]
        warmup: Option<f64>,
        /// Also draw Mpps against K per case: DIR/interleave.png (or a FILE.png).
        #[arg(long, value_name = "DIR")]
        png: Option<PathBuf>,
        /// Rounds over every row: each row shows the median, min and max (1..=100).
        #[arg(long, default_value_t = 1, value_parser = crate::num::whole::<usize>(1, 100))]
        reps: usize,
        /// Small and short (CI smoke run).
        #[arg(long)]
        quick: bool,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// 5G UPF (GuNFu): 130K sessions x 1/4/8/16 PDRs, uplink and downlink, per executor and UPF mode (one core).
    Upf {
        /// Sessions.
        #[arg(long, value_parser = crate::num::whole::<u32>(1, (1 << 24) - 2))]
        sessions: Option<u32>,
        /// PDR counts per session, comma-separated.
        #[arg(long, value_delimiter = ',', value_parser = crate::num::whole::<u32>(1, 64))]
        pdrs: Option<Vec<u32>>,
        /// Executors, comma-separated (default: every registered executor).
        #[arg(long = "exec", value_delimiter = ',')]
        execs: Vec<String>,
        /// Directions, comma-separated: ul, dl (default: both).
        #[arg(long = "dir", value_delimiter = ',')]
        dirs: Vec<String>,
        /// UPF modes, comma-separated: rtc, staged (default: both).
        #[arg(long = "mode", value_delimiter = ',')]
        modes: Vec<String>,
        /// UEs of the `amf` rows (0: none; default 131072).
        #[arg(long, value_parser = crate::num::whole::<u32>(0, 1 << 22))]
        amf_ues: Option<u32>,
        /// Also draw the rows (Mpps vs PDRs; the amf modes): DIR/upf.png (or a FILE.png).
        #[arg(long, value_name = "DIR")]
        png: Option<PathBuf>,
        /// Seconds per measurement.
        #[arg(long, allow_negative_numbers = true, value_parser = crate::num::positive(3600.0))]
        seconds: Option<f64>,
        /// Packets per trace.
        #[arg(long, value_parser = crate::num::whole::<u64>(1, 1 << 28))]
        packets: Option<u64>,
        /// Rounds over every row: each row shows the median, min and max (1..=100).
        #[arg(long, default_value_t = 1, value_parser = crate::num::whole::<usize>(1, 100))]
        reps: usize,
        /// Small and short (CI smoke run).
        #[arg(long)]
        quick: bool,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Under attack (issue 33): SYN flood, random-source UDP flood (ddos), NAT exhaustion, hash-collision keys (leaked vs random secret), fragment flood; each beside the same chain on normal traffic (one core).
    Attack {
        /// Legitimate flows of the normal traces; the attacks scale with it (default 8192; quick 128).
        #[arg(long, value_parser = crate::num::whole::<u64>(16, 1 << 20))]
        flows: Option<u64>,
        /// Seconds per measurement (default 1; quick: 3 passes over each trace instead).
        #[arg(long, allow_negative_numbers = true, value_parser = crate::num::positive(3600.0))]
        seconds: Option<f64>,
        /// Executors, comma-separated (default batch,rtc; quick batch).
        #[arg(long = "exec", value_delimiter = ',')]
        execs: Vec<String>,
        /// Scenarios to run (default all).
        #[arg(long, value_delimiter = ',', value_parser = SCENARIOS)]
        only: Vec<String>,
        /// Write each scenario's normal and attack traces as pcap into this directory.
        #[arg(long)]
        write_traces: Option<std::path::PathBuf>,
        /// Also draw Mpps, normal vs attack per scenario: DIR/attack.png (or a FILE.png).
        #[arg(long, value_name = "DIR")]
        png: Option<std::path::PathBuf>,
        /// Small and short (CI smoke run: a few seconds).
        #[arg(long)]
        quick: bool,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Flow-table cost model (PNA methodology): cycles per lookup/insert/update/delete vs hashbrown and the memory ceiling.
    Table {
        /// Table sizes, comma-separated (e.g. 1024,65536,1048576).
        #[arg(long, value_delimiter = ',', value_parser = crate::num::whole::<usize>(1, 1 << 26))]
        sizes: Option<Vec<usize>>,
        /// Batch sizes, comma-separated.
        #[arg(long, value_delimiter = ',', value_parser = crate::num::whole::<usize>(1, 64))]
        batches: Option<Vec<usize>>,
        /// Insertion rates (every r-th op inserts), comma-separated.
        #[arg(long, value_delimiter = ',', value_parser = crate::num::whole::<u64>(1, 1_000_000_000))]
        insert_every: Option<Vec<u64>>,
        /// Seconds per measurement, as every suite takes (instead of --ops; 0.01..=600): a pilot run turns it into
        /// one operation count for every row, so the fastest row lasts about this long and slower ones longer.
        #[arg(long, allow_negative_numbers = true, value_parser = crate::num::real(0.01, 600.0))]
        seconds: Option<f64>,
        /// Operations per measurement (1..=400000000; default 4000000, quick: fewer).
        #[arg(long, value_parser = crate::num::whole::<u64>(1, 400_000_000))]
        ops: Option<u64>,
        /// Rounds over every row: each row shows the median, min and max (1..=100).
        #[arg(long, default_value_t = 1, value_parser = crate::num::whole::<usize>(1, 100))]
        reps: usize,
        /// Small and short (CI smoke run).
        #[arg(long)]
        quick: bool,
        /// Run the rows in the opposite order (a check: the figures must not depend on it).
        #[arg(long)]
        reverse: bool,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
}

/// `--png DIR`, the one plot convention of every suite: the directory, created if missing.
pub(crate) fn png_dir(dir: &Path) -> Result<(), CliError> {
    std::fs::create_dir_all(dir).map_err(|e| CliError::new(format!("--png {}: {e}", dir.display())))
}

/// The file a one-plot suite writes for `--png ARG`: `ARG/<name>` (ARG a directory, created if missing), or ARG
/// itself when it names a `.png` file (the old form).
fn png_file(arg: &Path, name: &str) -> Result<PathBuf, CliError> {
    if arg.extension().is_some_and(|e| e.eq_ignore_ascii_case("png")) {
        return Ok(arg.to_path_buf());
    }
    png_dir(arg)?;
    Ok(arg.join(name))
}

/// A one-plot suite's report: its PNG when asked, then the JSON (with provenance) or the text table.
fn show<E: std::fmt::Display>(
    rep: &dyn std::fmt::Display,
    value: impl FnOnce() -> serde_json::Result<serde_json::Value>,
    png: Option<&Path>,
    plot: impl FnOnce(&Path) -> Result<(), E>,
    json: bool,
) -> Result<(), CliError> {
    if let Some(p) = png {
        plot(p).map_err(|e| CliError::new(e.to_string()))?;
    }
    if json {
        outln!("{}", serde_json::to_string_pretty(&crate::provenance::stamp(value()?))?);
    } else {
        out!("{rep}");
        if let Some(p) = png {
            outln!("plot         {}", p.display());
        }
    }
    Ok(())
}

pub fn run(a: BenchArgs) -> Result<(), CliError> {
    // Every plot carries where it comes from (the JSON reports carry the whole provenance).
    flowplane_bench::set_footer(crate::provenance::line());
    match a.which {
        BenchCmd::Scaling(s) => crate::cmd_scaling::run(s)?,
        BenchCmd::Scr(s) => crate::cmd_scr::run(s)?,
        BenchCmd::Dyssect(d) => crate::cmd_dyssect::run(d)?,
        BenchCmd::Io { flows, packets, size, seconds, batch, reps, quick, json } => {
            let reps = flowplane_bench::reps::check(reps).map_err(CliError::new)?;
            let opts = if quick {
                IoBenchOptions { reps, ..IoBenchOptions::quick() }
            } else {
                IoBenchOptions { flows, packets, size, seconds, batch, reps }
            };
            if !(opts.seconds.is_finite() && opts.seconds > 0.0) {
                return Err(CliError::new(format!("--seconds {seconds}: must be positive")));
            }
            let rep = run_io(&opts).map_err(CliError::new)?;
            if json {
                outln!("{}", serde_json::to_string_pretty(&crate::provenance::stamp(serde_json::to_value(&rep)?))?);
            } else {
                out!("{rep}");
            }
        }
        BenchCmd::Parse { seconds, millions, reps, quick, json } => {
            let mut o = if quick { ParseBenchOptions::quick() } else { ParseBenchOptions::default() };
            o.reps = flowplane_bench::reps::check(reps).map_err(CliError::new)?;
            if let Some(s) = seconds {
                if millions.is_some() {
                    return Err(CliError::new(
                        "--seconds and --millions both given: a measurement lasts one or the other",
                    ));
                }
                if !(s.is_finite() && s > 0.0 && s <= 600.0) {
                    return Err(CliError::new(format!("--seconds {s}: must be between 0 and 600")));
                }
                o.seconds = Some(s);
            }
            if let Some(m) = millions {
                // Above 10^4 M packets a measurement would run for hours.
                if !(m.is_finite() && m > 0.0 && m <= 10_000.0) {
                    return Err(CliError::new(format!("--millions {m}: must be between 0 and 10000")));
                }
                o.millions = m;
            }
            let rep = run_parse(&o);
            if json {
                outln!("{}", serde_json::to_string_pretty(&crate::provenance::stamp(serde_json::to_value(&rep)?))?);
            } else {
                out!("{rep}");
            }
        }
        BenchCmd::Pipeline { flows, base_flows, seconds, only, csv, reps, quick, reverse, json } => {
            let mut o = if quick { PipelineOptions::quick() } else { PipelineOptions::default() };
            o.reps = flowplane_bench::reps::check(reps).map_err(CliError::new)?;
            o.reverse = reverse;
            if let Some(f) = flows {
                o.flows = f;
            }
            if let Some(b) = base_flows {
                o.base_flows = b;
            }
            if let Some(s) = seconds {
                o.seconds = s;
            }
            o.only = only;
            if !(o.seconds.is_finite() && o.seconds > 0.0) {
                return Err(CliError::new("--seconds: must be positive"));
            }
            if o.flows.iter().chain(std::iter::once(&o.base_flows)).any(|&f| f == 0 || f > 1 << 26) {
                return Err(CliError::new("--flows/--base-flows: each must be between 1 and 67108864"));
            }
            let rep = run_pipeline(&o).map_err(CliError::new)?;
            if let Some(p) = csv {
                std::fs::write(&p, rep.to_csv()).map_err(|e| CliError::new(format!("{}: {e}", p.display())))?;
            }
            if json {
                outln!("{}", serde_json::to_string_pretty(&crate::provenance::stamp(serde_json::to_value(&rep)?))?);
            } else {
                out!("{rep}");
            }
        }
        BenchCmd::Interleave { flows, seconds, ks, prefixes, only, warmup, png, reps, quick, json } => {
            let mut o = if quick { InterleaveOptions::quick() } else { InterleaveOptions::default() };
            o.reps = flowplane_bench::reps::check(reps).map_err(CliError::new)?;
            if let Some(w) = warmup {
                if !(w.is_finite() && w >= 0.0) {
                    return Err(CliError::new("--warmup: must be zero or positive"));
                }
                o.warmup = w;
            }
            if let Some(f) = flows {
                o.flows = f;
            }
            if let Some(s) = seconds {
                o.seconds = s;
            }
            if let Some(k) = ks {
                o.ks = k;
            }
            if let Some(p) = prefixes {
                o.prefixes = p;
            }
            o.only = only;
            if !(o.seconds.is_finite() && o.seconds > 0.0) {
                return Err(CliError::new("--seconds: must be positive"));
            }
            if o.flows == 0 || o.flows > 1 << 24 {
                return Err(CliError::new("--flows: must be between 1 and 16777216"));
            }
            if o.ks.is_empty() || o.ks.iter().any(|&k| k == 0 || k > 64) {
                return Err(CliError::new("--ks: each K must be between 1 and 64"));
            }
            if o.prefixes > 4_000_000 {
                return Err(CliError::new("--prefixes: at most 4000000"));
            }
            let png = png.map(|p| png_file(&p, "interleave.png")).transpose()?;
            let rep = run_interleave(&o).map_err(CliError::new)?;
            show(&rep, || serde_json::to_value(&rep), png.as_deref(), |p| rep.plot_png(p), json)?;
        }
        BenchCmd::Upf { sessions, pdrs, execs, dirs, modes, amf_ues, png, seconds, packets, reps, quick, json } => {
            let mut o = if quick { UpfBenchOptions::quick() } else { UpfBenchOptions::default() };
            o.reps = flowplane_bench::reps::check(reps).map_err(CliError::new)?;
            if let Some(s) = sessions {
                o.sessions = s;
            }
            if let Some(p) = pdrs {
                o.pdrs = p;
            }
            if let Some(s) = seconds {
                o.seconds = s;
            }
            if let Some(p) = packets {
                o.packets = p;
            }
            o.execs = execs;
            if !dirs.is_empty() {
                o.dirs = dirs
                    .iter()
                    .map(|d| match d.as_str() {
                        "ul" => Ok(flowplane_trace::gen::UpfDir::Uplink),
                        "dl" => Ok(flowplane_trace::gen::UpfDir::Downlink),
                        _ => Err(CliError::new(format!("--dir: '{d}' is not ul or dl"))),
                    })
                    .collect::<Result<_, _>>()?;
            }
            if !modes.is_empty() {
                if let Some(m) = modes.iter().find(|m| !matches!(m.as_str(), "rtc" | "staged")) {
                    return Err(CliError::new(format!("--mode: '{m}' is not rtc or staged")));
                }
                o.modes = modes;
            }
            if !(o.seconds.is_finite() && o.seconds > 0.0) {
                return Err(CliError::new("--seconds: must be positive"));
            }
            if o.packets == 0 || o.packets > 1 << 28 {
                return Err(CliError::new("--packets: must be between 1 and 268435456"));
            }
            if let Some(u) = amf_ues {
                if u > 1 << 22 {
                    return Err(CliError::new("--amf-ues: at most 4194304"));
                }
                o.amf_ues = u;
            }
            let png = png.map(|p| png_file(&p, "upf.png")).transpose()?;
            let rep = run_upf(&o).map_err(CliError::new)?;
            show(&rep, || serde_json::to_value(&rep), png.as_deref(), |p| rep.plot_png(p), json)?;
        }
        BenchCmd::Attack { flows, seconds, execs, only, write_traces, png, quick, json } => {
            let mut o = if quick { AttackOptions::quick() } else { AttackOptions::default() };
            if let Some(f) = flows {
                if !(16..=1 << 20).contains(&f) {
                    return Err(CliError::new(format!("--flows {f}: must be between 16 and 1048576")));
                }
                o.flows = f;
            }
            if let Some(s) = seconds {
                if !(s.is_finite() && s > 0.0 && s <= 3600.0) {
                    return Err(CliError::new(format!("--seconds {s}: must be positive, at most 3600")));
                }
                o.seconds = s;
                o.warmup = (s * 0.3).min(o.warmup.max(0.01));
                o.loops = None;
            }
            if !execs.is_empty() {
                o.execs = execs
                    .iter()
                    .map(|e| {
                        flowplane_engine::exec::ExecKind::parse(e)
                            .map_err(|err| CliError::new(format!("--exec: {err}")))
                    })
                    .collect::<Result<_, _>>()?;
            }
            o.only = only;
            o.write_traces = write_traces;
            let png = png.map(|p| png_file(&p, "attack.png")).transpose()?;
            // No rounds to count (no --reps): a spinner with the time spent, on a terminal.
            let spin = flowplane_trace::progress::Progress::spinner("bench attack");
            let rep = run_attack(&o).map_err(CliError::new)?;
            drop(spin);
            show(&rep, || serde_json::to_value(&rep), png.as_deref(), |p| rep.plot_png(p), json)?;
        }
        BenchCmd::Table { sizes, batches, insert_every, seconds, ops, reps, quick, reverse, json } => {
            let reps = flowplane_bench::reps::check(reps).map_err(CliError::new)?;
            let mut o = if quick { TableBenchOptions::quick() } else { TableBenchOptions::default() };
            o.reverse = reverse;
            if let Some(s) = sizes {
                o.sizes = s;
            }
            if let Some(b) = batches {
                o.batch_sizes = b;
            }
            if let Some(r) = insert_every {
                o.insert_rates = r;
            }
            if let Some(n) = ops {
                if seconds.is_some() {
                    return Err(CliError::new("--seconds and --ops both given: a measurement lasts one or the other"));
                }
                if !(1..=table::MAX_OPS).contains(&n) {
                    return Err(CliError::new(format!("--ops {n}: must be between 1 and {}", table::MAX_OPS)));
                }
                o.ops = n;
            }
            if o.sizes.iter().any(|&s| s == 0 || s > 1 << 26) {
                return Err(CliError::new("--sizes: each size must be between 1 and 67108864"));
            }
            if o.batch_sizes.iter().any(|&b| b == 0 || b > 64) {
                return Err(CliError::new("--batches: each batch size must be between 1 and 64"));
            }
            if o.insert_rates.contains(&0) {
                return Err(CliError::new("--insert-every: rates must be at least 1"));
            }
            if let Some(s) = seconds {
                if !(s.is_finite() && (0.01..=600.0).contains(&s)) {
                    return Err(CliError::new(format!("--seconds {s}: must be between 0.01 and 600")));
                }
                o.ops = table::ops_for_seconds(&o, s);
            }
            let rows = table::run_reps(&o, reps).map_err(CliError::new)?;
            if json {
                // Provenance with the rows, as every suite's JSON (`table::to_json` stays the bare array).
                let v = serde_json::json!({ "rows": serde_json::to_value(&rows)? });
                outln!("{}", serde_json::to_string_pretty(&crate::provenance::stamp(v))?);
            } else {
                out!("{}", table::format_text(&rows));
            }
        }
    }
    Ok(())
}
