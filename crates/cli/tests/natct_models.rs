//! `nat` and `conntrack` against independent Python models (issue 29): the scapy-crafted
//! captures of `tests/captures/make_natct.py` (port reuse after RST / TIME_WAIT toward the same
//! remote endpoint, idle mappings freed at lookup, a reply late in the idle timeout beside the
//! flow's next packet in one batch, sequence numbers far outside the window, flows that end long
//! before the trace on one of two cores: ports in use and the export judged at the trace's end) run through the
//! `flowplane` binary under every executor, batch 1/4/64/256, 1 and 2 cores and 8 virtual
//! cores (conntrack also under scr); `tests/captures/check_natct.py` compares every packet's
//! verdict and rewritten addresses, the counters and nat's export with the models of
//! `natct_models.py`, written from the rules in the NFs' module docs. Needs python3-scapy.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A Python interpreter that has scapy.
fn python() -> &'static str {
    ["/usr/bin/python3", "python3"]
        .into_iter()
        .find(|p| Command::new(p).args(["-c", "import scapy.all"]).output().is_ok_and(|o| o.status.success()))
        .expect("python3 with scapy (apt install python3-scapy) runs the nat/conntrack models")
}

/// Runs the checker over one NF's cases; returns how many cells it checked.
fn check(only: &str) -> usize {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/captures");
    let tmp: PathBuf = std::env::temp_dir().join(format!("flowplane-natct-{only}-{}", std::process::id()));
    let out = Command::new(python())
        .arg(dir.join("check_natct.py"))
        .args(["--bin", env!("CARGO_BIN_EXE_flowplane"), "--only", only, "--tmp"])
        .arg(&tmp)
        .output()
        .expect("run check_natct.py");
    let _ = std::fs::remove_dir_all(&tmp);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{only}: model mismatches:\n{text}\n{}", String::from_utf8_lossy(&out.stderr));
    let last = text.lines().last().unwrap_or_default();
    let n: Vec<usize> = last.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    assert_eq!(n.len(), 3, "summary line: {last}");
    assert_eq!((n[0], n[2]), (n[1], 0), "every planned case checked, none failed: {last}");
    n[1]
}

#[test]
fn nat_matches_its_model_under_every_executor_batch_and_core_count() {
    // reuse: apdf 5 executors x 4 batches, eif and adf 5 executors; idle: 20; exec: 20 x 2 cores + 2 virtual;
    // end (ports in use, TIME_WAIT and export judged at the trace's end): 5 executors x 1 and 2 cores.
    assert_eq!(check("nat"), 20 + 10 + 20 + 40 + 10 + 2);
}

#[test]
fn conntrack_matches_its_model_under_every_executor_batch_and_core_count() {
    // 5 executors x 4 batches x 1 and 2 cores, scr on 2 cores, 8 virtual cores.
    assert_eq!(check("conntrack"), 40 + 2);
}
