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
        #[arg(long, value_name = "K", default_value_t = 10, value_parser = crate::num::whole::<usize>(0, 1_000_000))]
        top: usize,
    },
    /// Cut every packet to N bytes (lengths and checksums rewritten unless --keep-orig-len).
    Truncate {
        /// Input trace.
        input: PathBuf,
        /// Output pcap.
        output: PathBuf,
        /// Bytes to keep per packet.
        #[arg(long, value_name = "N", value_parser = crate::num::whole::<u32>(1, 262_144))]
        bytes: u32,
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
        #[arg(long, value_name = "K", value_parser = crate::num::whole::<u32>(1, 1024))]
        factor: u32,
    },
}

pub fn run(args: TraceArgs) -> Result<(), CliError> {
    match args.cmd {
        TraceCmd::Stats { input, json, top } => {
            let s = stats::trace_stats(&input, top)?;
            if json {
                outln!("{}", serde_json::to_string(&s)?);
            } else {
                out!("{s}");
            }
        }
        TraceCmd::Truncate { input, output, bytes, keep_orig_len } => {
            let s = tools::truncate(&input, &output, bytes, keep_orig_len)?;
            flowplane_trace::progress::note(&format!(
                "flowplane: wrote {} packets to {} ({} skipped)",
                s.packets,
                output.display(),
                s.skipped
            ));
        }
        TraceCmd::Loadscale { input, output, factor } => {
            let s = tools::loadscale(&input, &output, factor)?;
            flowplane_trace::progress::note(&format!(
                "flowplane: wrote {} packets to {} ({} skipped)",
                s.packets,
                output.display(),
                s.skipped
            ));
        }
    }
    Ok(())
}
