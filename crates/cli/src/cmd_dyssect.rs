//! `flowplane bench dyssect`: rss, rsspp and dyssect on uniform, Zipf,
//! elephants and shifting-skew traces at projected 8 and 16 cores; a table
//! (or JSON) and a PNG per trace and core count. `--nic-profile`: the runs
//! under each emulated NIC's update latencies, rsspp and dyssect side by side.

use std::path::PathBuf;

use flowplane_bench::dyssect::{ceiling_table, nic_table, plot, run_dyssect, table, DyssectOptions, TRACES};
use flowplane_engine::runner::NicProfile;

use crate::error::CliError;

#[derive(clap::Args, Debug)]
pub struct DyssectArgs {
    /// Seconds per run (after a one-second warm-up).
    #[arg(long, allow_negative_numbers = true, value_parser = crate::num::positive(600.0))]
    pub seconds: Option<f64>,
    /// Packets per trace.
    #[arg(long, allow_negative_numbers = true, value_parser = crate::num::whole::<u64>(1000, 1 << 28))]
    pub packets: Option<u64>,
    /// Flows per trace.
    #[arg(long, allow_negative_numbers = true, value_parser = crate::num::whole::<u64>(1, 1 << 26))]
    pub flows: Option<u64>,
    /// Offered rate in trace time, packets/s (the arrivals of the virtual-time latency); suffixes k/M/G (2M).
    #[arg(long, allow_negative_numbers = true, value_parser = crate::num::real(1.0, 1e10))]
    pub rate: Option<f64>,
    /// Projected core counts, comma-separated.
    #[arg(long, value_delimiter = ',', value_parser = crate::num::whole::<usize>(2, 4096))]
    pub cores: Option<Vec<usize>>,
    /// Traces: uniform, zipf, elephants, shifting.
    #[arg(long, value_delimiter = ',', value_parser = TRACES.to_vec())]
    pub traces: Vec<String>,
    /// Strategies.
    #[arg(long, value_delimiter = ',', value_parser = ["rss", "rsspp", "dyssect"])]
    pub strategies: Vec<String>,
    /// NIC profiles, comma-separated: how long the emulated NIC takes to apply a RETA
    /// update or a flow rule (ideal, bcm57416, nfp4000, connectx4, or reta=DUR:rule=DUR);
    /// rsspp and dyssect (unless --strategies) run under each, shown side by side.
    #[arg(long, value_delimiter = ',', value_name = "NAME")]
    pub nic_profile: Vec<String>,
    /// The priority class's SLO, µs.
    #[arg(long, allow_negative_numbers = true, value_parser = crate::num::positive(1e9))]
    pub slo_us: Option<f64>,
    /// Rounds over the whole experiment: each row shows the median, min and max (1..=100).
    #[arg(long, default_value_t = 1, value_parser = crate::num::whole::<usize>(1, 100))]
    pub reps: usize,
    /// Write the PNG plots into this directory (created if missing; none without it). `--plot-dir` is its old name.
    #[arg(long, alias = "plot-dir", value_name = "DIR")]
    pub png: Option<PathBuf>,
    /// Print only each trace's balance ceiling (no runs): how much any
    /// balancer keeping flows whole could gain over RETA entries placed by
    /// LPT, at RETA sizes 128 (the Dyssect paper's RSS++ setting) and 512.
    #[arg(long)]
    pub ceiling: bool,
    /// Small and short (CI smoke run).
    #[arg(long)]
    pub quick: bool,
    /// JSON output.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: DyssectArgs) -> Result<(), CliError> {
    let mut o = DyssectOptions::new(a.quick);
    if let Some(s) = a.seconds {
        if !(s.is_finite() && s > 0.0 && s <= 600.0) {
            return Err(CliError::new(format!("--seconds {s}: must be between 0 and 600")));
        }
        o.seconds = s;
    }
    if let Some(p) = a.packets {
        if !(1000..=1 << 28).contains(&p) {
            return Err(CliError::new(format!("--packets {p}: must be between 1000 and {}", 1u64 << 28)));
        }
        o.packets = p;
    }
    if let Some(f) = a.flows {
        if f == 0 || f > 1 << 26 {
            return Err(CliError::new(format!("--flows {f}: must be between 1 and {}", 1u64 << 26)));
        }
        o.flows = f;
    }
    if let Some(r) = a.rate {
        if !(r.is_finite() && (1.0..=1e10).contains(&r)) {
            return Err(CliError::new(format!("--rate {r}: must be between 1 and 1e10 packets/s")));
        }
        o.rate = r;
    }
    if let Some(s) = a.slo_us {
        if !(s.is_finite() && s > 0.0) {
            return Err(CliError::new(format!("--slo-us {s}: must be positive")));
        }
        o.slo_us = s;
    }
    if let Some(c) = a.cores {
        if c.iter().any(|&n| !(2..=4096).contains(&n)) {
            return Err(CliError::new("--cores: each must be between 2 and 4096"));
        }
        o.cores = c;
    }
    if !a.traces.is_empty() {
        o.traces = a.traces;
    }
    o.reps = flowplane_bench::reps::check(a.reps).map_err(CliError::new)?;
    let profiles = !a.nic_profile.is_empty();
    if profiles {
        o.profiles =
            a.nic_profile.iter().map(|p| NicProfile::parse(p)).collect::<Result<_, _>>().map_err(CliError::new)?;
        // rss never changes the table: the profiles compare the two that do.
        o.strategies = vec!["rsspp".into(), "dyssect".into()];
    }
    if !a.strategies.is_empty() {
        o.strategies = a.strategies;
    }
    if a.ceiling {
        out!("{}", ceiling_table(&o, &[128, 512]).map_err(CliError::new)?);
        return Ok(());
    }
    let json = a.json;
    let rows = run_dyssect(&o, |r| {
        if !json {
            flowplane_trace::progress::note(&format!(
                "  {} {} {}p{}: {:.2} Mpps, prio p99 {:.1} us, {} moves",
                r.trace,
                r.strategy,
                r.cores,
                if profiles { format!(" {}", r.nic) } else { String::new() },
                r.mpps,
                r.prio_p99_us,
                r.moves
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
        let mut v = serde_json::json!({ "rows": rows, "plots": files, "slo_us": o.slo_us, "rate_pps": o.rate });
        if profiles {
            v["nic_profiles"] = o
                .profiles
                .iter()
                .map(|p| {
                    serde_json::json!({
                        "name": p.name,
                        "reta_update_us": p.reta_update.as_secs_f64() * 1e6,
                        "rule_insert_us": p.rule_insert.as_secs_f64() * 1e6,
                    })
                })
                .collect();
        }
        outln!("{}", serde_json::to_string_pretty(&crate::provenance::stamp(serde_json::to_value(&v)?))?);
    } else {
        out!("{}", table(&rows, o.slo_us));
        if profiles {
            out!("{}", nic_table(&rows, &o.profiles));
        }
        for f in files {
            outln!("plot         {}", f.display());
        }
    }
    Ok(())
}
