//! Issue 33: `ddos` never fails open. With `--flows 1024` and 10,000 spoofed sources the source table held
//! 1,024 of them and the rest passed unchecked (30,760 drops against 300,040 with room). Sources the table
//! cannot hold are now judged by a count-min sketch under the same threshold, and `admit=PREFIX` always
//! passes. `tests/models/ddos_sketch.py`, written from the declared rule, gives the fewest drops it allows;
//! every executor and two cores must drop at least that, and pass every admitted packet. Scaled down from the
//! issue's trace: 2,000 sources, 40 packets each, a 256-source table.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_flowplane");
const ADMIT: &str = "10.0.0.0/10";

fn python() -> String {
    std::env::var("FLOWPLANE_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn model(trace: &Path, output: Option<&Path>) -> Value {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/models/ddos_sketch.py");
    let mut cmd = Command::new(python());
    cmd.arg(script).arg(trace).args(["10", "1", ADMIT]);
    if let Some(o) = output {
        cmd.arg(o);
    }
    let out = cmd.output().expect("spawn python3");
    assert!(out.status.success(), "model: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("model JSON")
}

fn run(args: &[&str]) -> Value {
    let out = Command::new(BIN).args(args).output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

#[test]
fn a_spoofed_flood_past_the_table_drops_at_least_what_the_rule_says() {
    let dir = std::env::temp_dir().join(format!("flowplane-ddos-flood-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("flood.pcap");
    let t = trace.to_str().unwrap();
    let g = Command::new(BIN)
        .args(["gen", "--flows", "2000", "--packets", "80000", "--seed", "8", "-o", t])
        .output()
        .unwrap();
    assert!(g.status.success(), "{}", String::from_utf8_lossy(&g.stderr));
    let want = model(&trace, None);
    let min_drops = want["min_drops"].as_u64().unwrap();
    assert!(min_drops > 40_000 && want["admitted_in"].as_u64().unwrap() > 0, "the trace is a flood: {want}");

    // The regression: past the table, the old rule let most of the flood through.
    let chain = format!("ddos(threshold=10, admit={ADMIT})");
    let mut cases: Vec<(String, Vec<&str>)> =
        flowplane_engine::exec::ExecKind::all().map(|k| (k.name().to_string(), vec!["--cores", "1"])).collect();
    cases.push(("batch".into(), vec!["--cores", "2"]));
    // Sprayed: each core's sketch sees about half of a source's packets and scales its count by 2 (it let
    // threshold x cores through before).
    cases.push(("batch".into(), vec!["--cores", "2", "--scale", "shared"]));
    for (n, (exec, cores)) in cases.iter().enumerate() {
        let what = format!("{exec} {cores:?}");
        let out = dir.join(format!("out-{n}-{exec}.pcap"));
        let mut args =
            vec!["run", "--input", t, "--table-capacity", "256", "--json", "--exec", exec, "--chain", &chain];
        args.extend(cores);
        let o = out.to_str().unwrap().to_string();
        args.extend(["--output", &o]);
        let r = run(&args);
        let d = &r["nfs"][0]["details"];
        assert!(d["table_full"].as_u64().unwrap() > 0, "{what}: the table filled: {d}");
        let dropped = r["dropped"].as_u64().unwrap();
        assert!(dropped >= min_drops, "{what}: {dropped} drops, the rule allows no fewer than {min_drops}: {d}");
        let seen = model(&trace, Some(&out));
        assert_eq!(seen["admitted_out"], want["admitted_in"], "{what}: every admitted packet passes");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
