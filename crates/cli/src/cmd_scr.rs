//! `flowplane bench scr`: state-compute replication against rss and shared
//! (Mpps vs cores per program and trace), its compute limit and its loss
//! recovery; a table (or JSON) and PNG plots.

use std::path::PathBuf;

use flowplane_bench::scr::{plot, run_scr, table, ScrOptions, PROGRAMS, TRACES};

use crate::error::CliError;

#[derive(clap::Args, Debug)]
pub struct ScrArgs {
    /// Packets per generated trace.
    #[arg(long, allow_negative_numbers = true, value_parser = crate::num::whole::<u64>(1, 1 << 28))]
    pub packets: Option<u64>,
    /// Seconds per run (the trace replayed until then), as every suite takes; instead of --loops.
    #[arg(long, allow_negative_numbers = true, value_parser = crate::num::positive(600.0))]
    pub seconds: Option<f64>,
    /// Passes over the trace per run (default 3, quick 2); --seconds gives the run length in time instead.
    #[arg(long, allow_negative_numbers = true, value_parser = crate::num::whole::<u64>(1, 1000))]
    pub loops: Option<u64>,
    /// Rounds over the whole suite: each row shows the median, min and max (1..=100; default 3, quick 1).
    #[arg(long, allow_negative_numbers = true, value_parser = crate::num::whole::<usize>(1, 100))]
    pub reps: Option<usize>,
    /// Worker counts, comma-separated (above the real cores: projected).
    #[arg(long, value_delimiter = ',', value_parser = crate::num::whole::<usize>(1, 4096))]
    pub cores: Option<Vec<usize>>,
    /// Programs: ddos, hh, portknock, tbf (ratelimit), conntrack.
    #[arg(long, value_delimiter = ',', value_parser = PROGRAMS.iter().map(|p| p.0).collect::<Vec<_>>())]
    pub programs: Vec<String>,
    /// Traces: single, univdc, backbone, hyperscale (`flowplane gen --profile`).
    #[arg(long, value_delimiter = ',', value_parser = TRACES.to_vec())]
    pub traces: Vec<String>,
    /// Strategies.
    #[arg(long, value_delimiter = ',', value_parser = ["rss", "shared", "scr"])]
    pub strategies: Vec<String>,
    /// Compute rounds of the Fig. 9 sweep (`burn(iters=N)`), comma-separated.
    #[arg(long, value_delimiter = ',', value_parser = crate::num::whole::<u32>(0, 1_000_000))]
    pub burn: Option<Vec<u32>>,
    /// Loss rates of the Fig. 10 sweep (fractions), comma-separated.
    #[arg(long, value_delimiter = ',', allow_negative_numbers = true, value_parser = crate::num::real(0.0, 1.0))]
    pub losses: Option<Vec<f64>>,
    /// Also search each real-core configuration's maximum loss-free
    /// forwarding rate (`flowplane mlffr`: 0.1% loss, 2% resolution) with
    /// trials of this many seconds (slow: about ten trials per row).
    #[arg(long, value_name = "SECONDS", value_parser = crate::num::real(0.05, 60.0))]
    pub mlffr: Option<f64>,
    /// Write the PNG plots into this directory (created if missing; none without it). `--plot-dir` is its old name.
    #[arg(long, alias = "plot-dir", value_name = "DIR")]
    pub png: Option<PathBuf>,
    /// Small and short (CI smoke run).
    #[arg(long)]
    pub quick: bool,
    /// JSON output.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: ScrArgs) -> Result<(), CliError> {
    let mut o = ScrOptions::new(a.quick);
    if let Some(p) = a.packets {
        if p == 0 || p > 1 << 28 {
            return Err(CliError::new(format!("--packets {p}: must be between 1 and {}", 1u64 << 28)));
        }
        o.packets = p;
    }
    if let Some(l) = a.loops {
        if l == 0 || l > 1000 {
            return Err(CliError::new(format!("--loops {l}: must be between 1 and 1000")));
        }
        o.loops = l;
    }
    if let Some(s) = a.seconds {
        if a.loops.is_some() {
            return Err(CliError::new("--seconds and --loops both given: a run lasts one or the other"));
        }
        if !(s.is_finite() && s > 0.0 && s <= 600.0) {
            return Err(CliError::new(format!("--seconds {s}: must be between 0 and 600")));
        }
        o.seconds = Some(s);
    }
    if let Some(r) = a.reps {
        if r == 0 || r > 100 {
            return Err(CliError::new(format!("--reps {r}: must be between 1 and 100")));
        }
        o.reps = r;
    }
    if let Some(c) = a.cores {
        if c.is_empty() || c.iter().any(|&n| n == 0 || n > 4096) {
            return Err(CliError::new("--cores: each must be between 1 and 4096"));
        }
        o.cores = c;
    }
    if let Some(b) = a.burn {
        o.burn = b;
    }
    if let Some(l) = a.losses {
        if l.iter().any(|x| !(x.is_finite() && (0.0..=1.0).contains(x))) {
            return Err(CliError::new("--losses: each must be a fraction between 0 and 1"));
        }
        o.losses = l;
    }
    if let Some(t) = a.mlffr {
        if !(t.is_finite() && (0.05..=60.0).contains(&t)) {
            return Err(CliError::new(format!("--mlffr {t}: trial seconds between 0.05 and 60")));
        }
        o.mlffr_trial = Some(std::time::Duration::from_secs_f64(t));
    }
    if !a.programs.is_empty() {
        o.programs = a.programs;
    }
    if !a.traces.is_empty() {
        o.traces = a.traces;
    }
    if !a.strategies.is_empty() {
        o.strategies = a.strategies;
    }
    let json = a.json;
    let rows = run_scr(&o, |r| {
        if !json {
            flowplane_trace::progress::note(&format!(
                "  {} {} {} {} {}{}: {}",
                r.experiment,
                r.program,
                r.trace,
                r.strategy,
                r.cores,
                if r.projected { "p" } else { "" },
                r.mpps.map_or("refused".to_string(), |m| format!("{m:.2} Mpps"))
            ));
        }
    })
    .map_err(CliError::new)?;
    let files = match &a.png {
        Some(dir) => {
            crate::cmd_bench::png_dir(dir)?;
            plot(&rows, dir).map_err(CliError::new)?
        }
        None => Vec::new(),
    };
    if json {
        let v = serde_json::json!({ "rows": rows, "plots": files });
        outln!("{}", serde_json::to_string_pretty(&crate::provenance::stamp(serde_json::to_value(&v)?))?);
    } else {
        out!("{}", table(&rows));
        for f in files {
            outln!("plot         {}", f.display());
        }
    }
    Ok(())
}
