//! Chain graphs (issue 31 item 4) against an independent oracle: each branch's output equals
//! running that branch's chain on the trace filtered by the branch verdict.
//!
//! `tests/captures/graph_model.py` crafts a trace with scapy and, from the ACL's documented
//! rule language, writes the input filtered by the ACL's verdict (allow.pcap, deny.pcap) and
//! what the branches' NFs must report (fsc's per-flow export, count's totals). The graph
//! `acl(...) -> { allow: fsc -> port(a) ; deny: count -> port(b) }` runs under every executor
//! on 1 and 2 cores (replay, pcap files as named --ports): a.pcap and b.pcap must hold exactly
//! the model's packets with each flow's packets in input order, the branch NFs' export and
//! report must be the model's, and each branch chain run alone on its filtered trace must give
//! the same export and report as the branch inside the graph. The TOML tables form of the same
//! graph gives the same files; bad graphs are refused in one line (exit 2).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

const CHAIN: &str =
    "acl(rule=drop:udp:10.0.0.0/8;drop:tcp:any:any:any:9000) -> { allow: fsc -> port(a) ; deny: count -> port(b) }";

const TOML: &str = r#"
[[nf]]
name = "acl"
rule = "drop:udp:10.0.0.0/8;drop:tcp:any:any:any:9000"
[nf.branch.allow]
port = "a"
[[nf.branch.allow.nf]]
name = "fsc"
[nf.branch.deny]
port = "b"
[[nf.branch.deny.nf]]
name = "count"
"#;

const EXECUTORS: [&str; 5] = ["batch", "rtc", "pernf", "microbatch", "interleaved"];

/// A Python interpreter that has scapy.
fn python() -> &'static str {
    ["/usr/bin/python3", "python3"]
        .into_iter()
        .find(|p| Command::new(p).args(["-c", "import scapy.all"]).output().is_ok_and(|o| o.status.success()))
        .expect("python3 with scapy (apt install python3-scapy) crafts the graph trace")
}

fn flowplane(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flowplane")).args(args).output().expect("run flowplane")
}

fn run_ok(args: &[&str]) -> Value {
    let o = flowplane(args);
    assert!(o.status.success(), "flowplane {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("--json report")
}

/// A pcap file's frames (classic pcap, either byte order of timestamps: the frames only).
fn frames(path: &Path) -> Vec<Vec<u8>> {
    let d = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(d.len() >= 24, "{}: no pcap header", path.display());
    let le = |o: usize| u32::from_le_bytes(d[o..o + 4].try_into().unwrap()) as usize;
    let (mut out, mut off) = (Vec::new(), 24);
    while off + 16 <= d.len() {
        let len = le(off + 8);
        out.push(d[off + 16..off + 16 + len].to_vec());
        off += 16 + len;
    }
    out
}

/// Frames grouped by flow (IPv4 protocol, addresses and ports), each flow's in file order.
fn by_flow(frames: &[Vec<u8>]) -> BTreeMap<Vec<u8>, Vec<Vec<u8>>> {
    let mut m: BTreeMap<Vec<u8>, Vec<Vec<u8>>> = BTreeMap::new();
    for f in frames {
        let key = [&f[23..24], &f[26..38]].concat();
        m.entry(key).or_default().push(f.clone());
    }
    m
}

/// Same packets, each flow's in the same order (cores interleave flows in a shared file).
fn assert_same_flows(got: &Path, want: &Path, what: &str) {
    let (g, w) = (frames(got), frames(want));
    assert_eq!(g.len(), w.len(), "{what}: {} packets, the model has {}", g.len(), w.len());
    assert!(by_flow(&g) == by_flow(&w), "{what}: packets or per-flow order differ from the model");
}

/// fsc's export rows, sorted, with times shifted by `shift_ns` (another run's packet time 0).
fn fsc_rows(path: &Path, shift_ns: u64) -> Vec<Value> {
    let v: Value = serde_json::from_slice(&std::fs::read(path).expect("export")).expect("export json");
    let mut rows: Vec<Value> = v.as_array().expect("rows").clone();
    for r in &mut rows {
        for k in ["first_ns", "last_ns"] {
            r[k] = Value::from(r[k].as_u64().expect(k) + shift_ns);
        }
    }
    rows.sort_by_key(|r| {
        (
            r["src"].as_str().unwrap().parse::<std::net::Ipv4Addr>().unwrap(),
            r["dst"].as_str().unwrap().parse::<std::net::Ipv4Addr>().unwrap(),
            r["sport"].as_u64(),
            r["dport"].as_u64(),
            r["proto"].as_u64(),
        )
    });
    rows
}

fn model_rows(model: &Value) -> Vec<Value> {
    let mut rows = model["allow_flows"].as_array().unwrap().clone();
    rows.sort_by_key(|r| {
        (
            r["src"].as_str().unwrap().parse::<std::net::Ipv4Addr>().unwrap(),
            r["dst"].as_str().unwrap().parse::<std::net::Ipv4Addr>().unwrap(),
            r["sport"].as_u64(),
            r["dport"].as_u64(),
            r["proto"].as_u64(),
        )
    });
    rows
}

fn nf<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["nfs"].as_array().unwrap().iter().find(|n| n["name"] == name).unwrap_or_else(|| panic!("nf {name}"))
}

struct Dir(PathBuf);

impl Dir {
    fn new(test: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("flowplane-graph-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
    fn p(&self, name: &str) -> String {
        self.0.join(name).to_string_lossy().into_owned()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn each_branch_equals_its_chain_on_the_trace_filtered_by_the_branch_verdict() {
    let dir = Dir::new("oracle");
    let g = Command::new(python())
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/captures/graph_model.py"))
        .arg(&dir.0)
        .arg("2000")
        .output()
        .expect("graph_model.py");
    assert!(g.status.success(), "graph_model.py: {}", String::from_utf8_lossy(&g.stderr));
    let model: Value = serde_json::from_slice(&std::fs::read(dir.p("model.json")).unwrap()).unwrap();
    let (allow, deny) = (PathBuf::from(dir.p("allow.pcap")), PathBuf::from(dir.p("deny.pcap")));
    assert!(frames(&allow).len() > 500 && frames(&deny).len() > 500, "both branches see traffic");
    let want_rows = model_rows(&model);
    let want_count = &model["deny"];

    // The branch chains alone on their filtered traces.
    let solo_fsc = run_ok(&[
        "run",
        "--input",
        &dir.p("allow.pcap"),
        "--cores",
        "1",
        "--table-capacity",
        "4096",
        "--chain",
        "fsc",
        "--export",
        &format!("fsc={}", dir.p("solo_fsc.json")),
        "--json",
    ]);
    let solo_rows = fsc_rows(Path::new(&dir.p("solo_fsc.json")), model["allow_first_ns"].as_u64().unwrap());
    assert_eq!(solo_rows, want_rows, "fsc alone on allow.pcap: the model's flows");
    assert_eq!(solo_fsc["packets_out"], model["allow_packets"]);
    let solo_count = run_ok(&[
        "run",
        "--input",
        &dir.p("deny.pcap"),
        "--cores",
        "1",
        "--table-capacity",
        "4096",
        "--chain",
        "count",
        "--json",
    ]);
    let solo_count = nf(&solo_count, "count")["details"].clone();
    assert_eq!(&solo_count, want_count, "count alone on deny.pcap: the model's totals");

    let mut cells = 0;
    for exec in EXECUTORS {
        for cores in ["1", "2"] {
            for form in ["spec", "toml"] {
                if form == "toml" && (exec != "batch" || cores != "1") {
                    continue;
                }
                let what = format!("--exec {exec} --cores {cores} ({form})");
                let (a, b, o) = (dir.p("a.pcap"), dir.p("b.pcap"), dir.p("o.pcap"));
                let (fx, cx) = (dir.p("fsc.json"), dir.p("count.json"));
                let input = dir.p("in.pcap");
                let mut args = vec!["run", "--input", &input];
                let toml = dir.p("graph.toml");
                if form == "toml" {
                    std::fs::write(&toml, TOML).unwrap();
                    args.extend(["--chain-file", &toml]);
                } else {
                    args.extend(["--chain", CHAIN]);
                }
                let (pa, pb, ef, ec) =
                    (format!("a={a}"), format!("b={b}"), format!("fsc={fx}"), format!("deny/count={cx}"));
                args.extend([
                    "--cores",
                    cores,
                    "--exec",
                    exec,
                    "--table-capacity",
                    "4096",
                    "--output",
                    &o,
                    "--port",
                    &pa,
                    "--port",
                    &pb,
                    "--export",
                    &ef,
                    "--export",
                    &ec,
                    "--json",
                ]);
                let r = run_ok(&args);
                let names: Vec<&str> =
                    r["nfs"].as_array().unwrap().iter().map(|n| n["name"].as_str().unwrap()).collect();
                assert_eq!(names, ["acl", "allow/fsc", "deny/count"], "{what}");
                assert_eq!(r["packets"], model["packets"], "{what}");
                assert_eq!(r["packets_out"], model["packets"], "{what}: every packet leaves by a port");
                assert_same_flows(Path::new(&a), &allow, &format!("{what}: port a"));
                assert_same_flows(Path::new(&b), &deny, &format!("{what}: port b"));
                assert!(frames(Path::new(&o)).is_empty(), "{what}: nothing on --output");
                // The branch NFs: the model's figures, and those of the branch chain run alone.
                let rows = fsc_rows(Path::new(&fx), 0);
                assert_eq!(rows, want_rows, "{what}: allow/fsc export");
                assert_eq!(
                    fsc_rows(Path::new(&fx), 0).len(),
                    solo_rows.len(),
                    "{what}: allow/fsc flows as fsc alone on allow.pcap"
                );
                assert_eq!(nf(&r, "allow/fsc")["details"], nf(&solo_fsc, "fsc")["details"], "{what}");
                assert_eq!(nf(&r, "deny/count")["details"], solo_count, "{what}: deny/count report");
                let c: Value = serde_json::from_slice(&std::fs::read(&cx).unwrap()).unwrap();
                assert_eq!(c[0], *want_count, "{what}: deny/count export");
                assert_eq!(nf(&r, "acl")["dropped"], want_count["packets"], "{what}");
                cells += 1;
            }
        }
    }
    assert_eq!(cells, 11);
}

#[test]
fn bad_graphs_are_refused_in_one_line() {
    let dir = Dir::new("refused");
    let (gen, o, y, c) = (
        "--flows 10 --packets 100",
        dir.p("o.pcap"),
        format!("y={}", dir.p("y.pcap")),
        format!("count={}", dir.p("c.json")),
    );
    for (chain, extra, want) in [
        ("acl -> { allow: fsc ; deny }", vec![], "expected ':' after branch label 'deny'"),
        ("acl -> { allow: fsc -> port(x) }", vec![], "no output port is named 'x'"),
        ("acl -> { allow: fsc -> port(x) }", vec!["--port", y.as_str()], "named: y"),
        ("acl -> { allow: count ; deny: count }", vec!["--export", c.as_str()], "allow/count, deny/count"),
        ("fsc -> { allow: count }", vec!["--cores", "2", "--scale", "scr"], "chain graphs"),
    ] {
        let mut args = vec!["run", "--gen", gen, "--chain", chain, "--output", &o];
        args.extend(extra);
        let out = flowplane(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = err.lines().filter(|l| !l.starts_with("Running as user")).collect();
        assert_eq!(out.status.code(), Some(2), "{chain}: {err}");
        assert_eq!(lines.len(), 1, "{chain}: one line: {err}");
        assert!(lines[0].contains(want), "{chain}: {err}");
    }
}
