//! `flowplane`: the command-line front end. Each subcommand lives in its own
//! module (`cmd_*`); they all return [`CliError`], which `main` prints as one
//! line and turns into exit code 2. Nothing here may panic on user input.

mod cmd_gen;
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
}

fn main() {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            // --help / --version are not errors; everything else is a usage error (exit 2).
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            std::process::exit(code);
        }
    };
    let result: Result<(), CliError> = match cli.command {
        Command::Gen(a) => cmd_gen::run(a),
        Command::Trace(a) => cmd_trace::run(a),
    };
    if let Err(e) = result {
        eprintln!("flowplane: error: {e}");
        std::process::exit(2);
    }
}
