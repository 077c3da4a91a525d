//! `flowplane trace stats | truncate | loadscale`: owns the trace subcommands'
//! options; the work is done by `flowplane_trace::{stats, tools}`.

use std::path::PathBuf;

use clap::Subcommand;
use flowplane_trace::{stats, tools};

use crate::error::CliError;

#[derive(clap::Args, Debug)]
pub struct TraceArgs {
    #[command(subcommand)]
    pub cmd: TraceCmd,
}

#[derive(Subcommand, Debug)]
pub enum TraceCmd {
    /// Describe a trace: sizes, duration, flows, packets per flow, locality, Zipf exponent.
    Stats {
        /// Input trace (pcap or pcapng).
        input: PathBuf,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
        /// Number of largest flows to list.
        #[arg(long, value_name = "K", default_value = "10")]
        top: String,
    },
    /// Cut every packet to N bytes (lengths and checksums rewritten unless --keep-orig-len).
    Truncate {
        /// Input trace.
        input: PathBuf,
        /// Output pcap.
        output: PathBuf,
        /// Bytes to keep per packet.
        #[arg(long, value_name = "N")]
        bytes: String,
        /// Snaplen-style cut: keep the original wire length and headers.
        #[arg(long)]
        keep_orig_len: bool,
    },
    /// Raise the packet rate K times by replaying K time windows in parallel (FAJITA).
    Loadscale {
        /// Input trace.
        input: PathBuf,
        /// Output pcap.
        output: PathBuf,
        /// Scale factor K.
        #[arg(long, value_name = "K")]
        factor: String,
    },
}

fn parse_num<T: std::str::FromStr>(opt: &str, v: &str) -> Result<T, CliError> {
    v.trim().parse().map_err(|_| CliError::new(format!("--{opt} '{v}': expected a positive integer")))
}

pub fn run(args: TraceArgs) -> Result<(), CliError> {
    match args.cmd {
        TraceCmd::Stats { input, json, top } => {
            let top: usize = parse_num("top", &top)?;
            let s = stats::trace_stats(&input, top)?;
            if json {
                outln!("{}", serde_json::to_string(&s)?);
            } else {
                out!("{s}");
            }
        }
        TraceCmd::Truncate { input, output, bytes, keep_orig_len } => {
            let n: u32 = parse_num("bytes", &bytes)?;
            if n == 0 {
                return Err(CliError::new("--bytes must be at least 1"));
            }
            let s = tools::truncate(&input, &output, n, keep_orig_len)?;
            eprintln!("flowplane: wrote {} packets to {} ({} skipped)", s.packets, output.display(), s.skipped);
        }
        TraceCmd::Loadscale { input, output, factor } => {
            let k: u32 = parse_num("factor", &factor)?;
            if !(1..=1024).contains(&k) {
                return Err(CliError::new("--factor must be between 1 and 1024"));
            }
            let s = tools::loadscale(&input, &output, k)?;
            eprintln!("flowplane: wrote {} packets to {} ({} skipped)", s.packets, output.display(), s.skipped);
        }
    }
    Ok(())
}
