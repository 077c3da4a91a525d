//! `flowplane bench scaling`: throughput against cores (1 and 2 real, more
//! projected) for each strategy, chain and traffic shape; a table with
//! ratios to one core and the load-imbalance factor, and a PNG plot per chain.

use std::path::PathBuf;
use std::time::Duration;

use flowplane_bench::scaling::{plot, run_scaling, table, ScalingOptions, CHAINS, TRAFFIC};

use crate::error::CliError;

#[derive(clap::Args, Debug)]
pub struct ScalingArgs {
    /// Seconds per run.
    #[arg(long, allow_negative_numbers = true, value_parser = crate::num::positive(600.0))]
    pub seconds: Option<f64>,
    /// Packets per generated trace.
    #[arg(long, allow_negative_numbers = true, value_parser = crate::num::whole::<u64>(1, 1 << 28))]
    pub packets: Option<u64>,
    /// Flows of the uniform and Zipf traces (the elephants trace has a tenth).
    #[arg(long, allow_negative_numbers = true, value_parser = crate::num::whole::<u64>(1, 1 << 26))]
    pub flows: Option<u64>,
    /// Worker counts, comma-separated (above the real cores: projected).
    #[arg(long, value_delimiter = ',', value_parser = crate::num::whole::<usize>(1, 4096))]
    pub cores: Option<Vec<usize>>,
    /// Chains: srcctr-fsc, fw, nat, ddos.
    #[arg(long, value_delimiter = ',', value_parser = CHAINS.iter().map(|c| c.0).collect::<Vec<_>>())]
    pub chains: Vec<String>,
    /// Traffic: uniform, zipf, elephants, single.
    #[arg(long, value_delimiter = ',', value_parser = TRAFFIC.to_vec())]
    pub traffic: Vec<String>,
    /// Strategies: rss, shared (real cores only: a projection cannot see contention), rsspp.
    #[arg(long, value_delimiter = ',', value_parser = ["rss", "shared", "rsspp"])]
    pub strategies: Vec<String>,
    /// Rounds over the whole matrix: each row shows the median, min and max (1..=100).
    #[arg(long, default_value_t = 1, value_parser = crate::num::whole::<usize>(1, 100))]
    pub reps: usize,
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

pub fn run(a: ScalingArgs) -> Result<(), CliError> {
    let mut o = ScalingOptions::new(a.quick);
    if let Some(s) = a.seconds {
        if !(s.is_finite() && s > 0.0 && s <= 600.0) {
            return Err(CliError::new(format!("--seconds {s}: must be between 0 and 600")));
        }
        o.seconds = s;
    }
    if let Some(p) = a.packets {
        if p == 0 || p > 1 << 28 {
            return Err(CliError::new(format!("--packets {p}: must be between 1 and {}", 1u64 << 28)));
        }
        o.packets = p;
    }
    if let Some(f) = a.flows {
        if f == 0 || f > 1 << 26 {
            return Err(CliError::new(format!("--flows {f}: must be between 1 and {}", 1u64 << 26)));
        }
        o.flows = f;
    }
    if let Some(c) = a.cores {
        if c.iter().any(|&n| n == 0 || n > 4096) {
            return Err(CliError::new("--cores: each must be between 1 and 4096"));
        }
        o.cores = c;
    }
    if !a.chains.is_empty() {
        o.chains = a.chains;
    }
    if !a.traffic.is_empty() {
        o.traffic = a.traffic;
    }
    if !a.strategies.is_empty() {
        o.strategies = a.strategies;
    }
    o.period = Duration::from_millis(100);
    o.reps = flowplane_bench::reps::check(a.reps).map_err(CliError::new)?;
    let json = a.json;
    let rows = run_scaling(&o, |r| {
        if !json {
            flowplane_trace::progress::note(&format!(
                "  {} {} {} {}{}: {}",
                r.chain,
                r.traffic,
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
