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
mod num;
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
    /// No progress bars, status lines or progress notes on stderr (errors and warnings still print). Bars are drawn
    /// only when stderr is a terminal anyway.
    #[arg(long, short = 'q', global = true)]
    quiet: bool,
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
    /// Benchmarks: scaling, scr, dyssect, io, parse, pipeline, interleave, upf, attack, table (`bench --help` says what each measures).
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

/// A usage error as one line: clap's first line, with the values the option takes (clap lists them on a later
/// line); a number's range is in clap's first line already (`num`'s parsers state it).
fn usage_line(e: &clap::Error) -> String {
    let text = e.to_string();
    let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("invalid arguments");
    let valid = match e.get(clap::error::ContextKind::ValidValue) {
        Some(clap::error::ContextValue::Strings(v)) if !v.is_empty() => format!(" (one of: {})", v.join(", ")),
        _ => String::new(),
    };
    format!("{}{valid}", error::printable(first))
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
    // `--quiet` is every subcommand's (global), not a `run` option: the config merge does not see it.
    let run_words: Vec<OsString> = raw
        .iter()
        .skip(1)
        .position(|w| w == "run")
        .map_or(&[][..], |i| &raw[i + 2..])
        .iter()
        .filter(|w| *w != "--quiet" && *w != "-q")
        .cloned()
        .collect();
    let cli = match Cli::try_parse_from(&raw) {
        Ok(c) => c,
        Err(e) => {
            // --help / --version are not errors; everything else is a usage
            // error: one line naming the problem, exit code 2.
            if !e.use_stderr() {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            eprintln!("flowplane: {}", usage_line(&e));
            return ExitCode::from(2);
        }
    };
    flowplane_trace::progress::set_quiet(cli.quiet);
    let result: Result<(), CliError> = match cli.command {
        Command::Gen(a) => cmd_gen::run(a),
        Command::Trace(a) => cmd_trace::run(a),
        Command::Run(a) => cmd_run::run_cmd(a, &run_words),
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;
    use std::any::TypeId;

    /// Issue 35, item 7: every numeric option of every subcommand, found by walking the command tree (a new one
    /// fails here without a ranged parser), refuses a bad value in one line that states its range.
    #[test]
    fn every_numeric_option_states_its_range() {
        fn walk(cmd: &clap::Command, path: &[String], out: &mut Vec<(Vec<String>, String)>) {
            let numeric = [
                TypeId::of::<u8>(),
                TypeId::of::<u16>(),
                TypeId::of::<u32>(),
                TypeId::of::<u64>(),
                TypeId::of::<usize>(),
                TypeId::of::<i64>(),
                TypeId::of::<f64>(),
            ];
            for a in cmd.get_arguments() {
                let id = a.get_value_parser().type_id();
                if let (true, Some(long)) = (numeric.iter().any(|t| id == *t), a.get_long()) {
                    out.push((path.to_vec(), long.to_string()));
                }
            }
            for s in cmd.get_subcommands() {
                let mut p = path.to_vec();
                p.push(s.get_name().to_string());
                walk(s, &p, out);
            }
        }
        let mut found = Vec::new();
        walk(&Cli::command(), &[], &mut found);
        assert!(found.len() > 60, "{} numeric options", found.len());
        let mut bad = Vec::new();
        for (path, long) in &found {
            for value in ["x", "1e30"] {
                let mut words = vec!["flowplane".to_string()];
                words.extend(path.iter().cloned());
                words.extend([format!("--{long}"), value.to_string()]);
                let line = match Cli::try_parse_from(&words) {
                    Ok(_) => continue, // in range (a real option taking 1e30)
                    Err(e) => usage_line(&e),
                };
                if !(line.contains("between") || line.contains("above 0, at most")) || line.contains('\n') {
                    bad.push(format!("{}: {line}", words[1..].join(" ")));
                }
            }
        }
        assert!(bad.is_empty(), "refusals without a range:\n{}", bad.join("\n"));
    }

    #[test]
    fn quiet_is_every_subcommands() {
        for words in [
            &["flowplane", "gen", "--quiet"][..],
            &["flowplane", "bench", "table", "-q"],
            &["flowplane", "run", "--quiet"],
        ] {
            let cli = Cli::try_parse_from(words).unwrap_or_else(|e| panic!("{words:?}: {e}"));
            assert!(cli.quiet, "{words:?}");
        }
    }
}
