//! `flowplane`: the command-line front end; everything is in the library
//! (`lib.rs`), so that its parsers can be fuzzed.

#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    flowplane_cli::run(std::env::args_os())
}
