//! `flowplane trace ...`: trace tools.

use crate::error::CliError;

#[derive(clap::Args, Debug)]
pub struct TraceArgs {
    /// Input trace.
    pub input: std::path::PathBuf,
}

pub fn run(_args: TraceArgs) -> Result<(), CliError> {
    Err(CliError::new("trace: not built yet"))
}
