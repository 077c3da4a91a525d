//! `flowplane`: the command-line front end. Each subcommand lives in its own
//! module (`cmd_*`); they all return [`CliError`], which `main` prints as one
//! line and turns into exit code 2. Nothing here may panic on user input.

#![forbid(unsafe_code)]

mod cmd_bench;
mod cmd_gen;
mod cmd_nfs;
mod cmd_run;
mod cmd_trace;
mod error;

use clap::{Parser, Subcommand};
use error::CliError;

#[derive(Parser, Debug)]
#[command(name = "flowplane", version, about = "Stateful packet processing on commodity multi-core CPUs")]
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
    /// Benchmarks: io, parse, table, pipeline.
    Bench(cmd_bench::BenchArgs),
}

fn main() {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            // --help / --version are not errors; everything else is a usage
            // error: one line naming the problem, exit code 2.
            if !e.use_stderr() {
                let _ = e.print();
                std::process::exit(0);
            }
            let text = e.to_string();
            let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("invalid arguments");
            eprintln!("flowplane: {}", first.trim());
            std::process::exit(2);
        }
    };
    let result: Result<(), CliError> = match cli.command {
        Command::Gen(a) => cmd_gen::run(a),
        Command::Trace(a) => cmd_trace::run(a),
        Command::Run(a) => cmd_run::run_cmd(a),
        Command::Nfs(a) => cmd_nfs::run(a),
        Command::Bench(a) => cmd_bench::run(a),
    };
    if let Err(e) = result {
        eprintln!("flowplane: error: {e}");
        std::process::exit(2);
    }
}
