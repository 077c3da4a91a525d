//! `flowplane`: the command-line front end, as a library so that its input
//! parsers can be fuzzed (`fuzz/`) and reused. Each subcommand lives in its
//! own module (`cmd_*`); they all return [`CliError`], which [`run`] prints as
//! one line and turns into exit code 2 (1 for a run that reported but lost
//! results, see `results`). Nothing here may panic on user input.
//! The `flowplane` binary is `main.rs`: one call to [`run`].

#![forbid(unsafe_code)]

/// `println!` that returns a closed or failing stdout as a [`CliError`]
/// (with `?`) instead of panicking.
macro_rules! outln {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($t)*).map_err($crate::error::CliError::stdout)?
    }};
}

/// `print!` likewise.
macro_rules! out {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        write!(std::io::stdout().lock(), $($t)*).map_err($crate::error::CliError::stdout)?
    }};
}

mod cmd_bench;
mod cmd_ctl;
mod cmd_dyssect;
mod cmd_gen;
mod cmd_ipfix;
mod cmd_live;
mod cmd_mlffr;
mod cmd_mlffr_port;
mod cmd_nfs;
mod cmd_ports;
mod cmd_run;
mod cmd_scaling;
mod cmd_scr;
mod cmd_sweep;
mod cmd_trace;
mod cmd_upf;
mod ctl;
mod ctl_trace;
mod error;
mod metrics;
mod provenance;
mod results;
mod run_config;

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub use cmd_run::{parse_exports, parse_gen, parse_gen_config};
pub use error::CliError;

/// A port name parsed, or None if malformed (the error is reported where it is opened).
fn io_port_spec(s: &str) -> Option<flowplane_io::port::PortSpec> {
    flowplane_io::port::PortSpec::parse(s).ok()
}

#[derive(Parser, Debug)]
#[command(name = "flowplane", version = provenance::VERSION, about = "Stateful packet processing on commodity multi-core CPUs")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Write synthetic traffic to a pcap file.
    Gen(cmd_gen::GenArgs),
    /// Trace tools: stats, truncate, loadscale.
    Trace(cmd_trace::TraceArgs),
    /// Run a chain over a trace or generated traffic and report (no arguments: the default demo).
    Run(cmd_run::RunArgs),
    /// List the NFs usable in chain specs: what each is keyed by, its parameters with type, range and default.
    Nfs(cmd_nfs::NfsArgs),
    /// List the port kinds --input, --output and --port take: syntax, capabilities, built in or not.
    Ports(cmd_ports::PortsArgs),
    /// Benchmarks: io, parse, table, pipeline.
    Bench(cmd_bench::BenchArgs),
    /// Maximum loss-free forwarding rate of one configuration (binary search of the paced rate).
    Mlffr(cmd_mlffr::MlffrArgs),
    /// UPF tools: `upf sessions` writes the session file matching `gen --proto gtpu --upf NxM`.
    Upf(cmd_upf::UpfArgs),
    /// IPFIX tools: `ipfix read FILE|udp:PORT` decodes and prints records.
    Ipfix(cmd_ipfix::IpfixArgs),
    /// An experiment: a grid of runs from a TOML file, repeated; CSV/JSON results and a PNG per variable; resumable.
    Sweep(cmd_sweep::SweepArgs),
    /// Ask a running `run --ctl PATH`: show runtime|errors|nfs|tables|ports, set, load, export, reload, stop.
    Ctl(cmd_ctl::CtlArgs),
}

/// Runs the command line `args` (program name first, as `std::env::args_os`
/// gives it): exit code 0 on success and for `--help`/`--version`, 2 with a
/// one-line `flowplane: ...` message on stderr for any error.
pub fn run<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let raw: Vec<OsString> = args.into_iter().map(Into::into).collect();
    // `run --config FILE` merges the file under the command line's own words.
    let run_words = raw.iter().skip(1).position(|w| w == "run").map_or(&[][..], |i| &raw[i + 2..]);
    let cli = match Cli::try_parse_from(&raw) {
        Ok(c) => c,
        Err(e) => {
            // --help / --version are not errors; everything else is a usage
            // error: one line naming the problem, exit code 2.
            if !e.use_stderr() {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            let text = e.to_string();
            let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("invalid arguments");
            // The values an option takes belong in the one line (clap lists them on a later one).
            let valid = match e.get(clap::error::ContextKind::ValidValue) {
                Some(clap::error::ContextValue::Strings(v)) if !v.is_empty() => format!(" (one of: {})", v.join(", ")),
                _ => String::new(),
            };
            eprintln!("flowplane: {}{valid}", error::printable(first));
            return ExitCode::from(2);
        }
    };
    let result: Result<(), CliError> = match cli.command {
        Command::Gen(a) => cmd_gen::run(a),
        Command::Trace(a) => cmd_trace::run(a),
        Command::Run(a) => cmd_run::run_cmd(a, run_words),
        Command::Nfs(a) => cmd_nfs::run(a),
        Command::Ports(a) => cmd_ports::run(a),
        Command::Bench(a) => cmd_bench::run(a),
        Command::Mlffr(a) => cmd_mlffr::run(a),
        Command::Upf(a) => cmd_upf::run(a),
        Command::Ctl(a) => cmd_ctl::run(a),
        Command::Sweep(a) => cmd_sweep::run(a),
        Command::Ipfix(a) => cmd_ipfix::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is_stdout_closed() => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("flowplane: error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
