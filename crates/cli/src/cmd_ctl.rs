//! `flowplane ctl PATH COMMAND...`: asks a running `flowplane run --ctl PATH`
//! (see [`crate::ctl`] for the protocol and who may connect).

use std::path::PathBuf;

use clap::Args;
use serde_json::Value;

use crate::error::CliError;

/// `flowplane ctl` arguments.
#[derive(Args, Debug)]
#[command(
    after_help = "COMMANDS:\n  show runtime    per core: packets, batches, vectors per call, busy seconds, cycles per packet\n  show errors     drops by reason, and per NF\n  show nfs        the chain with each NF's parameters, counters and own report fields per core\n  show tables     per core: flows, capacity, insertions, expiries, table full\n  show ports      per port: received, transmitted, overruns, errors\n  show flow PROTO SRC SPORT DST DPORT   each NF's state of one flow (show flow SRC: a source's)\n  set NF PARAM VALUE   change a run-time parameter (NF or NF#N), between two batches on every core\n  load NF FILE    the NF's file parameter (acl's rules) from FILE, as set\n  export NF FILE  the NF's state now (JSON or CSV by extension)\n  reload          re-read the run's --config file: changed NF parameters and rule files applied (all or\n                  nothing); any other change (cores, ports, strategy, chain shape, ...) refused\n  stop            end the run (as SIGTERM)\n  help            the commands"
)]
pub struct CtlArgs {
    /// The run's control socket (`flowplane run ... --ctl PATH`).
    pub socket: PathBuf,
    /// The command and its arguments.
    #[arg(required = true, num_args = 1..)]
    pub command: Vec<String>,
    /// Print the answer as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Sends the command and prints the answer.
pub fn run(a: CtlArgs) -> Result<(), CliError> {
    let mut words = a.command.clone();
    // Files are named for the server, which may run elsewhere in the tree: absolute paths.
    if let [verb, _, file] = words.as_mut_slice() {
        if verb == "export" || verb == "load" {
            let p = PathBuf::from(&*file);
            if p.is_relative() {
                let cwd = std::env::current_dir().map_err(|e| CliError::new(format!("ctl: {e}")))?;
                *file = cwd.join(p).to_string_lossy().into_owned();
            }
        }
    }
    let v = crate::ctl::request(&a.socket, &words)?;
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    print_human(&v)
}

/// An answer as lines: arrays of objects as one `key value` line per row.
fn print_human(v: &Value) -> Result<(), CliError> {
    match v {
        Value::String(s) => outln!("{s}"),
        Value::Array(rows) => {
            for r in rows {
                outln!("{}", line(r));
            }
        }
        Value::Object(o) => {
            for (k, x) in o {
                match x {
                    Value::Array(rows) => {
                        for r in rows {
                            outln!("{k:<10} {}", line(r));
                        }
                    }
                    _ => outln!("{k:<10} {}", line(x)),
                }
            }
        }
        x => outln!("{x}"),
    }
    Ok(())
}

fn line(v: &Value) -> String {
    match v {
        Value::Object(o) => o
            .iter()
            .map(|(k, x)| match x {
                Value::String(s) => format!("{k} {s}"),
                Value::Number(n) if n.is_f64() => format!("{k} {:.3}", n.as_f64().unwrap_or(0.0)),
                x => format!("{k} {x}"),
            })
            .collect::<Vec<_>>()
            .join(", "),
        Value::String(s) => s.clone(),
        x => x.to_string(),
    }
}
