//! `flowplane upf ...`: UPF tools. `upf sessions` writes the session file
//! (TOML, or JSON with `--json`) matching `flowplane gen --proto gtpu --upf NxM`.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use flowplane_trace::gen::{UpfDir, UpfPlan};

use crate::error::CliError;

#[derive(Args, Debug)]
pub struct UpfArgs {
    #[command(subcommand)]
    pub which: UpfCmd,
}

#[derive(Subcommand, Debug)]
pub enum UpfCmd {
    /// Write the session file of N sessions x M PDRs (for `upf(sessions=FILE)`), matching `gen --upf NxM`.
    Sessions {
        /// Sessions.
        #[arg(long, default_value_t = 1000, value_parser = crate::num::whole::<u32>(1, (1 << 24) - 2))]
        sessions: u32,
        /// PDRs per session and direction.
        #[arg(long, default_value_t = 4, value_parser = crate::num::whole::<u32>(1, 64))]
        pdrs: u32,
        /// Output file (default: stdout).
        #[arg(short = 'o', long = "output")]
        output: Option<PathBuf>,
        /// JSON instead of TOML.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(a: UpfArgs) -> Result<(), CliError> {
    match a.which {
        UpfCmd::Sessions { sessions, pdrs, output, json } => {
            let plan = UpfPlan { sessions, pdrs, dir: UpfDir::Both };
            plan.validate().map_err(|e| CliError::new(e.to_string().replace("--upf: ", "")))?;
            // 130K sessions take a while to build and encode: a spinner on a terminal.
            let spin = flowplane_trace::progress::Progress::spinner(format!(
                "building {sessions} sessions x {pdrs} PDRs per direction"
            ));
            let file = flowplane_bench::upf::sessions_for(&plan);
            spin.message(if json { "encoding JSON" } else { "encoding TOML" });
            let text = if json {
                serde_json::to_string(&file)?
            } else {
                file.to_toml().map_err(|e| CliError::new(format!("encoding the session file: {e}")))?
            };
            drop(spin);
            match output {
                Some(p) => {
                    std::fs::write(&p, text).map_err(|e| CliError::new(format!("cannot write {}: {e}", p.display())))?
                }
                None => out!("{text}"),
            }
            Ok(())
        }
    }
}
