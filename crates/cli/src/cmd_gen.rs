//! `flowplane gen`: synthetic traffic to a pcap file.

use crate::error::CliError;

#[derive(clap::Args, Debug)]
pub struct GenArgs {
    /// Output pcap file.
    #[arg(short = 'o', long = "output")]
    pub output: std::path::PathBuf,
}

pub fn run(_args: GenArgs) -> Result<(), CliError> {
    Err(CliError::new("gen: not built yet"))
}
