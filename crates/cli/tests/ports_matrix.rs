//! Issue 30: every strategy x backend combination runs, or is refused in one
//! line naming why. The strategies are `--scale`'s possible values in `run
//! --help`, the backends the replay and every port kind of the registry
//! (`flowplane ports --json`), so a new strategy or kind is in the matrix by
//! itself. Live kinds on a Linux interface run on a veth pair with 2 queues
//! (root); a kind this binary lacks must be refused with the registry's reason.
//! A run that starts must report the strategy it was given (nothing silently
//! falls back to another) on 2 cores.

mod ports_common;

use std::process::Command;

use ports_common::Veth;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_flowplane");

/// `--scale`'s possible values, from `run --help`.
fn strategies() -> Vec<String> {
    let o = Command::new(BIN).args(["run", "--help"]).output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let at = text.find("--scale <").expect("--scale in run --help");
    let rest = &text[at..];
    let list = rest.split("[possible values: ").nth(1).and_then(|r| r.split(']').next()).expect("possible values");
    list.split(", ").map(str::to_string).collect()
}

fn kinds() -> Vec<Value> {
    let o = Command::new(BIN).args(["ports", "--json"]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice::<Value>(&o.stdout).unwrap().as_array().cloned().unwrap()
}

/// Ports of kinds that are not a Linux interface, as the test names them (a new kind needs one here).
const DEVICE_EXAMPLES: &[(&str, &str)] = &[("dpdk", "dpdk:net_null0")];

#[test]
fn every_strategy_runs_on_every_backend_or_is_refused_in_one_line() {
    let strategies = strategies();
    assert!(strategies.len() >= 5 && strategies.iter().any(|s| s == "scr"), "{strategies:?}");
    let veth = Veth::with_queues("pt", 2);
    let dir = std::env::temp_dir().join(format!("fp-ports-matrix-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("in.pcap");
    let g = Command::new(BIN)
        .args(["gen", "--flows", "50", "--packets", "500", "--seed", "3", "-o", trace.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(g.status.success());

    // (backend, --input or None for a generated replay, the kind's reason when it is not built in).
    let mut backends: Vec<(String, Option<String>, Option<String>)> = vec![("replay".into(), None, None)];
    for k in kinds() {
        let name = k["name"].as_str().unwrap().to_string();
        let missing = k["missing"].as_str().map(str::to_string);
        let input = if k["live"] != true {
            format!("{name}:{}", trace.display())
        } else if k["peer"] == true {
            // A Linux interface.
            format!("{name}:{}", veth.0)
        } else {
            let ex = DEVICE_EXAMPLES.iter().find(|(n, _)| *n == name);
            ex.unwrap_or_else(|| panic!("port kind {name}: add an example port to DEVICE_EXAMPLES")).1.to_string()
        };
        backends.push((name, Some(input), missing));
    }
    assert!(backends.len() >= 5, "{backends:?}");

    let mut failures = Vec::new();
    let mut ran = 0;
    for (backend, input, missing) in &backends {
        for s in &strategies {
            // hh: SCR-aware and valid under every strategy; a live run for 0.3 s.
            let mut args =
                vec!["run", "--chain", "hh", "--cores", "2", "--scale", s, "--json", "--table-capacity", "4096"];
            match input {
                Some(i) => args.extend(["--input", i.as_str()]),
                None => args.extend(["--gen", "--flows 50 --packets 500"]),
            }
            let live = input.as_ref().is_some_and(|_| backend != "pcap");
            if live {
                args.extend(["--duration", "0.3"]);
            }
            let r = Command::new(BIN).args(&args).output().unwrap();
            let err = String::from_utf8_lossy(&r.stderr).into_owned();
            let what = format!("{s} on {backend}");
            match missing {
                Some(why) => {
                    let one_line = r.status.code() == Some(2) && err.trim_end().lines().count() == 1;
                    if !(one_line && err.contains(why.as_str())) {
                        failures.push(format!(
                            "{what}: expected a one-line refusal naming {why:?}, got {:?}: {err}",
                            r.status.code()
                        ));
                    }
                }
                None => {
                    let v: Value = serde_json::from_slice(&r.stdout).unwrap_or(Value::Null);
                    let named = if live { &v["steering"]["strategy"] } else { &v["scale"]["strategy"] };
                    if r.status.code() != Some(0) || named != s.as_str() || v["cores"] != 2 {
                        failures.push(format!(
                            "{what}: exit {:?}, strategy {named}, cores {}: {}",
                            r.status.code(),
                            v["cores"],
                            err.trim()
                        ));
                    } else {
                        ran += 1;
                    }
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The replay, a pcap file, AF_PACKET (and AF_XDP where built) under every strategy.
    assert!(ran >= 3 * strategies.len(), "{ran} runs");
}

/// Regression (found by the matrix): the two workers of a 2-core AF_XDP run set their
/// sockets up at once and raced over the interface's XDP program; about one run in four
/// failed with EBUSY on queue 1. Eight runs in a row must all start (~0.1% by chance before).
#[test]
fn afxdp_on_two_queues_starts_every_time() {
    let afxdp = kinds().into_iter().find(|k| k["name"] == "afxdp").expect("afxdp registered");
    let veth = Veth::with_queues("ptx", 2);
    let port = format!("afxdp:{}", veth.0);
    for i in 0..8 {
        let args = [
            "run",
            "--input",
            &port,
            "--chain",
            "fsc",
            "--cores",
            "2",
            "--duration",
            "0.1",
            "--table-capacity",
            "4096",
        ];
        let r = Command::new(BIN).args(args).output().unwrap();
        let err = String::from_utf8_lossy(&r.stderr);
        if let Some(why) = afxdp["missing"].as_str() {
            assert!(r.status.code() == Some(2) && err.contains(why), "{err}");
            return;
        }
        assert!(r.status.success(), "run {i}: {err}");
    }
}
