//! Stateful NFs against independent Python models (issue 29, item 9): for acl, ratelimit,
//! policer, ddos, psd, hh, lb and fsc, a model in `tests/models/<nf>.py`, written from the NF's
//! documented rule (its module doc and the README), crafts a capture with scapy, and
//! `tests/models/harness.py` runs `flowplane` over it across executors, batch sizes and
//! placements (1 core; 2 cores under rss, shared, rsspp, scr, dyssect; 8 virtual cores) and
//! compares what was forwarded, exported and counted with the model.
//!
//! The matrix is pairwise, 35 runs per NF: every executor with every placement, each at one
//! batch size of 1/4/64/256 chosen so that every (executor, batch) and (placement, batch) pair
//! is covered too. `FLOWPLANE_MODELS_FULL=1` runs the whole product (140 runs per NF).
//! Needs scapy (`apt-get install python3-scapy`); `FLOWPLANE_PYTHON` names the interpreter.

use std::path::PathBuf;
use std::process::Command;

/// Runs per NF: 5 executors x 7 placements (x 4 batch sizes in the full matrix).
const PAIRWISE_RUNS: usize = 35;
const FULL_RUNS: usize = 140;

/// The first interpreter that can import scapy.
fn python() -> String {
    let mut tried = Vec::new();
    let candidates = std::env::var("FLOWPLANE_PYTHON").into_iter().chain(["python3".into(), "/usr/bin/python3".into()]);
    for py in candidates {
        let ok = Command::new(&py).args(["-c", "import scapy.all"]).output().is_ok_and(|o| o.status.success());
        if ok {
            return py;
        }
        tried.push(py);
    }
    panic!("no Python with scapy among {tried:?}: install python3-scapy (apt-get) or set FLOWPLANE_PYTHON");
}

fn check_model(nf: &str) {
    let full = std::env::var_os("FLOWPLANE_MODELS_FULL").is_some_and(|v| v == "1");
    let harness = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/models/harness.py");
    let tmp = std::env::temp_dir().join(format!("flowplane-models-{}-{nf}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let mut cmd = Command::new(python());
    cmd.arg(&harness).arg(env!("CARGO_BIN_EXE_flowplane")).arg(nf).arg(&tmp);
    if full {
        cmd.arg("--full");
    }
    let out = cmd.output().expect("spawn the model harness");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Known bugs owned elsewhere and order-dependent drift are listed, not failed: show them.
    eprintln!("{nf} model:\n{stdout}{stderr}");
    let _ = std::fs::remove_dir_all(&tmp);
    let last = stdout.lines().last().unwrap_or("");
    let nums: Vec<usize> = last.split(|c: char| !c.is_ascii_digit()).filter_map(|w| w.parse().ok()).collect();
    let plan = if full { FULL_RUNS } else { PAIRWISE_RUNS };
    assert!(last.starts_with("checked "), "{nf}: the harness did not finish: {stdout}{stderr}");
    assert_eq!(nums.len(), 3, "{nf}: unexpected summary line {last:?}");
    let (checked, planned, failed) = (nums[0], nums[1], nums[2]);
    assert!(checked > 0, "{nf}: no run checked");
    assert_eq!((checked, planned), (plan, plan), "{nf}: runs checked against the plan");
    assert_eq!(failed, 0, "{nf}: {failed} runs disagree with the model:\n{stdout}");
    assert!(out.status.success(), "{nf}: harness exit {:?}", out.status.code());
}

#[test]
fn acl_matches_its_model() {
    check_model("acl");
}

#[test]
fn ratelimit_matches_its_model() {
    check_model("ratelimit");
}

#[test]
fn policer_matches_its_model() {
    check_model("policer");
}

#[test]
fn ddos_matches_its_model() {
    check_model("ddos");
}

#[test]
fn psd_matches_its_model() {
    check_model("psd");
}

#[test]
fn hh_matches_its_model() {
    check_model("hh");
}

#[test]
fn lb_matches_its_model() {
    check_model("lb");
}

#[test]
fn fsc_matches_its_model() {
    check_model("fsc");
}
