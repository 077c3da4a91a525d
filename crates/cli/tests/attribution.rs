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

/// Issue 33 item 2: nat's declared table-full behaviours. `reject` (the default) drops the packets that find
/// no room (counted `dropped_table_full`), never passing them untranslated. `evict` takes a NAT pair as a whole:
/// a scapy-written flood (`tests/models/nat_evict.py`) of new flows 16 times the table's capacity after 16
/// answered pairs; every pair's later replies are dropped (their outbound entries were evicted, their ports
/// freed), every outbound packet passes (freed ports reused: more flows than the pool has ports, none refused),
/// and the counters add up (evictions = mappings ended + inbound entries dropped; mappings created - released =
/// ports in use). tshark reads the output: the first replies and no later one reach the inside host, and the
/// outbound packets use fewer distinct ports than flows, all from the range.
#[test]
fn nat_table_full_reject_drops_and_evict_ends_pairs_together() {
    let gen = "--flows 300 --packets 600";
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

    let dir = std::env::temp_dir().join(format!("flowplane-nat-evict-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join("in.pcap");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/models/nat_evict.py");
    let o = Command::new(python()).arg(script).args([input.to_str().unwrap(), "16", "1024"]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let want: Value = serde_json::from_slice(&o.stdout).unwrap();
    let w = |k: &str| want[k].as_u64().unwrap();
    for exec in ["rtc", "batch"] {
        let out = dir.join(format!("out-{exec}.pcap"));
        let r = run(&[
            "run",
            "--input",
            input.to_str().unwrap(),
            "--chain",
            "nat(ports=1024-1279)",
            "--table-capacity",
            "64",
            "--table-full",
            "evict",
            // Batches of 8 leave a new flow an entry no key of its batch holds; a fixed secret fixes the victims.
            "--batch",
            "8",
            "--hash-seed",
            "7",
            "--exec",
            exec,
            "--cores",
            "1",
            "--output",
            out.to_str().unwrap(),
            "--json",
        ]);
        let (d, t) = (&r["nfs"][0]["details"], &r["tables"]);
        let n = |v: &Value, k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{exec}: {k} in {v}"));
        assert_eq!((n(&r, "packets"), n(&r, "packets_out")), (w("packets"), w("passed")), "{exec}: {d}");
        assert_eq!(n(d, "mappings_created"), w("outbound_flows"), "{exec}: every outbound flow mapped: {d}");
        assert_eq!((n(d, "dropped_pool_exhausted"), n(d, "dropped_table_full")), (0, 0), "{exec}: {d}");
        assert_eq!(n(d, "dropped_stale") + n(d, "dropped_unmapped") + n(d, "dropped_filtered"), w("dropped"), "{d}");
        assert!(n(t, "evictions") > 0 && n(t, "table_full") == 0, "{exec}: {t}");
        assert_eq!(n(t, "evictions"), n(d, "evicted_mappings") + n(d, "evicted_inbound"), "{exec}: {t} {d}");
        assert_eq!(n(d, "ports_released"), n(d, "evicted_mappings"), "{exec}: {d}");
        let live = n(d, "udp_ports_in_use");
        assert_eq!(n(d, "mappings_created") - n(d, "ports_released"), live, "{exec}: {d}");
        assert!(live <= 64, "{exec}: no more mappings than entries: {d}");
        // tshark on the output: replies that reached the inside host, and the outbound ports used.
        let fields = |filter: &str, field: &str| -> Vec<String> {
            let o = Command::new("tshark")
                .arg("-n")
                .arg("-r")
                .arg(&out)
                .args(["-Y", filter, "-T", "fields", "-e", field])
                .output()
                .expect("tshark");
            assert!(o.status.success(), "tshark: {}", String::from_utf8_lossy(&o.stderr));
            String::from_utf8_lossy(&o.stdout).lines().map(str::to_string).collect()
        };
        let replies = fields("ip.dst == 10.9.0.1", "frame.number");
        assert_eq!(replies.len() as u64, w("first_replies"), "{exec}: only the first replies: {replies:?}");
        let ports = fields("ip.src == 203.0.113.1", "udp.srcport");
        assert_eq!(ports.len() as u64, w("outbound_flows"), "{exec}");
        let distinct: std::collections::BTreeSet<u16> = ports.iter().map(|p| p.parse().unwrap()).collect();
        assert!(distinct.len() <= 256 && distinct.iter().all(|p| (1024..=1279).contains(p)), "{exec}: {distinct:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
