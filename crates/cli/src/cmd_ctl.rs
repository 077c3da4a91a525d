//! `flowplane ctl PATH COMMAND...`: asks a running `flowplane run --ctl PATH`
//! (see [`crate::ctl`] for the protocol and who may connect).

use std::path::PathBuf;

use clap::Args;
use serde_json::Value;

use crate::error::CliError;

/// `flowplane ctl` arguments.
#[derive(Args, Debug)]
#[command(
    after_help = "COMMANDS:\n  show runtime    per core, the report's per_core row from the same counts (equal to it once the traffic\n                  is over): packets, mpps and cycles per packet (first packet to last batch), batches,\n                  vectors per call, busy cycles and seconds (in batches), busy cycles per packet; packets out\n  show errors     drops by reason, and per NF\n  show nfs        the chain with each NF's parameters, counters and own report fields per core\n  show tables     per core: flows, capacity, insertions, expiries, table full\n  show ports      per port: received, transmitted, overruns, errors\n  show attribution   summed over cores, at most 10 rows each: the sources a full flow table refused;\n                  each NF's top lists (nat: inside hosts by ports held, by new flows refused)\n  show flow PROTO SRC SPORT DST DPORT   each NF's state of one flow (show flow SRC: a source's)\n  set NF PARAM VALUE [PARAM VALUE ...]   change run-time parameters (NF or NF#N; several change together),\n                  between two batches on every core (flowplane nfs marks them 'live'), e.g. set nat external\n                  198.51.100.1 addrs 2: a new NAT pool, every mapping kept\n  load NF FILE    the NF's file parameter (acl's rules, route's table, lb's backends) from FILE, as set\n  export NF FILE  the NF's state now (JSON or CSV by extension)\n  trace add N [PROTO SRC SPORT DST DPORT | SRC]   record the next N packets in total over every worker\n                  (matching the flow or source; none: any packet): worker, queue, 5-tuple, each NF's\n                  verdict (pass, port N, drop, not reached) and its state for the flow before and after\n                  (as show flow); a graph's branch taken; a new trace add replaces the previous trace\n  trace show      the traced packets, in time order\n  trace clear     disarm the trace and forget its packets\n  capture start FILE [--at NF] [--dropped]   write a pcap of the packets entering the chain (or leaving\n                  NF, a graph branch's NF by its path), or only of those dropped (by NF, or by any NF), from every worker; FILE is created\n                  now; workers queue copies to one writer thread, a full queue drops and counts them\n  capture stop    close the pcap: packets written, packets dropped (the run's end stops it too)\n  profile start   time each NF (a graph's branches too) on every core from now: show runtime then\n                  lists per NF its calls, packets, vectors per call, cycles per packet (the first NF's\n                  include the flow lookup; a batched executor times a stage per batch, rtc per packet)\n  profile stop    stop timing (the executors' loops without the observation point again)\n  reload          re-read the run's --config file: changed NF parameters and rule files applied (all or\n                  nothing); any other change (cores, ports, strategy, chain shape, ...) refused\n  stop            end the run (as SIGTERM)\n  help            the commands"
)]
pub struct CtlArgs {
    /// The run's control socket (`flowplane run ... --ctl PATH`).
    pub socket: PathBuf,
    /// The command and its arguments (its own options, as `capture start FILE --at NF`, included).
    #[arg(required = true, num_args = 1.., trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<String>,
    /// Print the answer as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Sends the command and prints the answer.
pub fn run(a: CtlArgs) -> Result<(), CliError> {
    // `--json` after the command is ctl's own option, not one of the command's words.
    let json = a.json || a.command.iter().any(|w| w == "--json");
    let mut words: Vec<String> = a.command.iter().filter(|w| *w != "--json").cloned().collect();
    // Files are named for the server, which may run elsewhere in the tree: absolute paths.
    let file = match words.as_mut_slice() {
        [verb, _, file] if verb == "export" || verb == "load" => Some(file),
        [verb, start, file, ..] if verb == "capture" && start == "start" => Some(file),
        _ => None,
    };
    if let Some(file) = file {
        let p = PathBuf::from(&*file);
        if p.is_relative() {
            let cwd = std::env::current_dir().map_err(|e| CliError::new(format!("ctl: {e}")))?;
            *file = cwd.join(p).to_string_lossy().into_owned();
        }
    }
    let v = crate::ctl::request(&a.socket, &words)?;
    if json {
        outln!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    if words.len() == 2 && words[0] == "trace" && words[1] == "show" {
        return print_trace(&v);
    }
    print_human(&v)
}

/// `trace show`: each packet on a line, then its NFs' verdicts one per line (as VPP's `show trace`).
fn print_trace(v: &Value) -> Result<(), CliError> {
    let packets = v.as_array().map_or(&[][..], Vec::as_slice);
    if packets.is_empty() {
        outln!("no packets traced");
    }
    for (k, p) in packets.iter().enumerate() {
        let f = &p["flow"];
        let flow = if f.is_null() {
            "no flow key".to_string()
        } else {
            format!("{} {}:{} -> {}:{}", s(&f["proto"]), s(&f["src"]), f["sport"], s(&f["dst"]), f["dport"])
        };
        outln!(
            "packet {}: worker {} port {} queue {} time {:.6} s len {} {flow} => {}",
            k + 1,
            p["worker"],
            s(&p["port"]),
            p["queue"],
            p["ts_ns"].as_u64().unwrap_or(0) as f64 / 1e9,
            p["len"],
            s(&p["verdict"])
        );
        if let Some(b) = p["branch"].as_str() {
            outln!("  branch {b}");
        }
        for st in p["stages"].as_array().map_or(&[][..], Vec::as_slice) {
            outln!("  {:<12} {}", s(&st["nf"]), s(&st["verdict"]));
            // The NF's state for the packet's flow, as show flow prints it ("-": none).
            let state = |x: &Value| if x.is_null() { "-".to_string() } else { x.to_string() };
            if let Some(c) = st.get("state") {
                outln!("    before {}", state(&c["before"]));
                outln!("    after  {}", state(&c["after"]));
            }
        }
    }
    Ok(())
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or("")
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
