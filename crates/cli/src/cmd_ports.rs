//! `flowplane ports`: the port kinds `--input`, `--output` and `--port`
//! take, from the registry's descriptors (`flowplane_io::port::PORTS`): how
//! each is written, what it can do, and whether this binary has it.

use clap::Args;
use flowplane_io::port::{kind, PortInfo, PORTS};

use crate::error::CliError;

#[derive(Args, Debug)]
pub struct PortsArgs {
    /// Only this kind.
    pub name: Option<String>,
    /// Print the descriptors as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: PortsArgs) -> Result<(), CliError> {
    let list: Vec<&PortInfo> = match &a.name {
        None => PORTS.iter().collect(),
        Some(n) => vec![kind(n).ok_or_else(|| {
            let known: Vec<&str> = PORTS.iter().map(|k| k.name).collect();
            CliError::new(format!("unknown port kind '{n}' (known: {})", known.join(", ")))
        })?],
    };
    if a.json {
        let v: Vec<serde_json::Value> = list.iter().map(|k| to_json(k)).collect();
        outln!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let w = list.iter().map(|k| k.syntax.len()).max().unwrap_or(0);
    for k in list {
        outln!("{:<w$}  {}", k.syntax, k.about);
        outln!("{:<w$}  {}", "", caps(k).join(", "));
    }
    Ok(())
}

/// The capabilities as words, for the listing.
fn caps(k: &PortInfo) -> Vec<String> {
    let c = &k.caps;
    let mut v = vec![if c.live { "live" } else { "file" }.to_string()];
    let flags = [
        (c.kernel_steering, "kernel steering"),
        (c.peer, "mlffr peer"),
        (c.once_per_process, "once per process"),
        (c.needs_root, "needs root"),
    ];
    v.extend(flags.iter().filter(|f| f.0).map(|f| f.1.to_string()));
    v.extend(c.options.iter().map(|o| format!("takes {o}")));
    v.push(match c.missing {
        None => "built in".to_string(),
        Some(why) => format!("missing: {why}"),
    });
    v
}

fn to_json(k: &PortInfo) -> serde_json::Value {
    let c = &k.caps;
    serde_json::json!({
        "name": k.name,
        "syntax": k.syntax,
        "about": k.about,
        "live": c.live,
        "kernel_steering": c.kernel_steering,
        "peer": c.peer,
        "once_per_process": c.once_per_process,
        "needs_root": c.needs_root,
        "options": c.options,
        "built": c.missing.is_none(),
        "missing": c.missing,
    })
}
