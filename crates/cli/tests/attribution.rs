//! Issue 33 item 4: who holds the NAT's ports, who runs its pool dry, and who fills the flow table — in the
//! report. Scapy-written traces of three inside hosts opening new UDP flows in blocks
//! (`tests/models/attribution.py`, which also applies the documented rules: the first POOL/CAPACITY flows are
//! admitted, every later one refused and counted against its source); the report's lists must be the model's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_flowplane");

fn python() -> &'static str {
    ["/usr/bin/python3", "python3"]
        .into_iter()
        .find(|p| Command::new(p).args(["-c", "import scapy.all"]).output().is_ok_and(|o| o.status.success()))
        .expect("a python3 with scapy")
}

fn model(mode: &str, pcap: &Path, room: u32) -> Value {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/models/attribution.py");
    let o =
        Command::new(python()).arg(script).args([mode, pcap.to_str().unwrap(), &room.to_string()]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn run(args: &[&str]) -> Value {
    let o = Command::new(BIN).args(args).output().unwrap();
    assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// A report list `[{key: host, what: n}]` as a map.
fn listed(v: &Value, key: &str, what: &str) -> BTreeMap<String, u64> {
    v.as_array()
        .unwrap_or_else(|| panic!("a list: {v}"))
        .iter()
        .map(|r| (r[key].as_str().unwrap().to_string(), r[what].as_u64().unwrap()))
        .collect()
}

fn modelled(v: &Value) -> BTreeMap<String, u64> {
    v.as_object().unwrap().iter().map(|(k, n)| (k.clone(), n.as_u64().unwrap())).collect()
}

#[test]
fn nat_names_who_holds_the_ports_and_who_was_refused_and_the_table_who_filled_it() {
    let dir = std::env::temp_dir().join(format!("flowplane-attribution-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();

    let nat_pcap = dir.join("nat.pcap");
    let want = model("nat", &nat_pcap, 1024);
    let full_pcap = dir.join("full.pcap");
    let want_full = model("full", &full_pcap, 512);
    for exec in ["batch", "rtc"] {
        let r = run(&[
            "run",
            "--input",
            nat_pcap.to_str().unwrap(),
            "--chain",
            "nat(ports=1024-2047)",
            "--table-capacity",
            "4096",
            "--exec",
            exec,
            "--cores",
            "1",
            "--json",
        ]);
        let d = &r["nfs"][0]["details"];
        assert_eq!(listed(&d["top_hosts_by_ports"], "inside", "ports"), modelled(&want["held"]), "{exec}: {d}");
        assert_eq!(listed(&d["top_hosts_refused"], "inside", "refused"), modelled(&want["refused"]), "{exec}: {d}");

        let r = run(&[
            "run",
            "--input",
            full_pcap.to_str().unwrap(),
            "--chain",
            "fsc",
            "--table-capacity",
            "512",
            "--exec",
            exec,
            "--cores",
            "1",
            "--json",
        ]);
        let t = &r["tables"];
        assert_eq!(listed(&t["table_full_sources"], "src", "packets"), modelled(&want_full["refused"]), "{exec}: {t}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 33 item 2: nat's declared table-full behaviour — `evict` would take one direction of a translated
/// connection and remap it mid-way, so it is refused in one line naming nat; `reject` (the default) drops the
/// packets that find no room (counted `dropped_table_full`), never passing them untranslated.
#[test]
fn nat_refuses_evict_and_drops_what_finds_no_room() {
    let gen = "--flows 300 --packets 600";
    let o = Command::new(BIN)
        .args([
            "run",
            "--gen",
            gen,
            "--chain",
            "nat",
            "--table-capacity",
            "64",
            "--table-full",
            "evict",
            "--cores",
            "1",
        ])
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(e.trim().lines().count() == 1 && e.contains("nat") && e.contains("evict"), "{e}");
    let r = run(&[
        "run",
        "--gen",
        gen,
        "--chain",
        "nat",
        "--table-capacity",
        "64",
        "--exec",
        "rtc",
        "--cores",
        "1",
        "--json",
    ]);
    let d = &r["nfs"][0]["details"];
    let full = r["tables"]["table_full"].as_u64().unwrap();
    assert!(full > 0, "{}", r["tables"]);
    assert_eq!(d["dropped_table_full"].as_u64().unwrap(), full, "{d}");
    assert_eq!(r["packets_out"].as_u64().unwrap() + full, r["packets"].as_u64().unwrap(), "{d}");
}
