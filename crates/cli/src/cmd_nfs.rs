//! `flowplane nfs`: the NF library, as usable in chain specs — each NF's
//! name, what its state is keyed by, description and declared parameters
//! (type, range, default, doc), from the registry's descriptors, and its
//! handlers: what `flowplane ctl` reads and changes while it runs.

use clap::Args;
use flowplane_nf::registry::{find, KeyedBy, NfInfo, NFS};

use crate::error::CliError;

#[derive(Args, Debug)]
pub struct NfsArgs {
    /// Only this NF.
    pub name: Option<String>,
    /// Print the descriptors as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: NfsArgs) -> Result<(), CliError> {
    let list: Vec<&NfInfo> = match &a.name {
        None => NFS.iter().collect(),
        Some(n) => vec![find(n).ok_or_else(|| {
            let known: Vec<&str> = NFS.iter().map(|k| k.name).collect();
            CliError::new(format!("unknown NF '{n}' (known: {})", known.join(", ")))
        })?],
    };
    if a.json {
        let v: Vec<serde_json::Value> = list.iter().map(|d| d.to_json()).collect();
        outln!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    for d in list {
        out!("{}", describe(d));
    }
    Ok(())
}

/// One NF: `name  keyed by K  about`, then one indented line per parameter.
fn describe(d: &NfInfo) -> String {
    let keyed = match d.keyed_by {
        KeyedBy::Stateless => "\u{2013} (stateless)".to_string(),
        k => k.describe(),
    };
    let mut out = format!("{:<10} keyed by {keyed:<14} {}\n", d.name, d.about);
    let ty = |p: &flowplane_nf::ParamSpec| match p.range() {
        Some(r) => format!("{} {r}", p.type_name()),
        None => p.type_name(),
    };
    let wn = d.params.iter().map(|p| p.name.len()).max().unwrap_or(0);
    let wt = d.params.iter().map(|p| ty(p).len()).max().unwrap_or(0);
    let wd = d.params.iter().map(|p| p.default_text().len()).max().unwrap_or(0);
    for p in d.params {
        // `(live)`: `flowplane ctl set` changes it while the NF runs.
        let live = if p.live { " (live)" } else { "" };
        out += &format!("    {:<wn$}  {:<wt$}  default {:<wd$}  {}{live}\n", p.name, ty(p), p.default_text(), p.doc);
    }
    out + &format!("    handlers: {}\n", handlers(d))
}

/// What `flowplane ctl` (and the metrics) serve for the NF while it runs, on one line.
fn handlers(d: &NfInfo) -> String {
    let h = d.handlers();
    let mut read = "read counters and report (ctl show nfs, show errors; metrics flowplane_nf_*)".to_string();
    if h["read"].as_array().is_some_and(|r| r.iter().any(|x| x == "state")) {
        read += ", per-key state (ctl show flow, trace, export)";
    }
    let set: Vec<&str> = h["set"].as_array().map_or(vec![], |a| a.iter().filter_map(|x| x.as_str()).collect());
    let set = if set.is_empty() { "nothing (fixed for the run)".to_string() } else { set.join(", ") };
    let load = h["load"].as_str().map_or(String::new(), |f| format!("; load FILE ({f})"));
    format!("{read}; set {set}{load}")
}
