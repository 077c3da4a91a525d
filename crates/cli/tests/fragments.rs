//! Issue 33 item 5: IP fragments without reassembly. A scapy-written trace (`tests/models/fragments.py`: 20
//! UDP datagrams of 10 inside flows, each in three fragments, interleaved; two orphan fragments; a datagram
//! whose second fragment overlaps its first) goes through `nat` and `fw` under every executor. The report's
//! fragment counters are what the trace holds by the fragment table's rule; tshark reassembles the output:
//! every datagram whole, with a good UDP checksum and the original payload; through nat each from the external
//! address, one external port per inside flow (both datagrams of a flow translated alike), through fw
//! untouched; the orphans and the overlapping fragment do not come out. On 2 cores (`rss`; fw's symmetric
//! key) the same: a later fragment is steered where its first fragment went (`flowplane_scale::fragsteer`),
//! so no fragment of a whole datagram is an orphan on the other core.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_flowplane");
const EXTERNAL: &str = "203.0.113.1";

fn python() -> &'static str {
    ["/usr/bin/python3", "python3"]
        .into_iter()
        .find(|p| Command::new(p).args(["-c", "import scapy.all"]).output().is_ok_and(|o| o.status.success()))
        .expect("a python3 with scapy")
}

/// (source, source port, payload hex) of every datagram tshark reassembles from `pcap` to the remote,
/// asserting each one's UDP checksum is good.
fn datagrams(pcap: &Path) -> Vec<(String, String, String)> {
    let o = Command::new("tshark")
        .arg("-n")
        .arg("-r")
        .arg(pcap)
        .args(["-o", "ip.defragment:TRUE", "-o", "udp.check_checksum:TRUE", "-Y", "udp && ip.dst == 198.51.100.7"])
        .args(["-T", "fields", "-e", "ip.src", "-e", "udp.srcport", "-e", "udp.checksum.status", "-e", "udp.payload"])
        .output()
        .expect("tshark");
    assert!(o.status.success(), "tshark: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            assert_eq!(f[2], "1", "a good UDP checksum: {l}");
            (f[0].to_string(), f[1].to_string(), f[3].to_string())
        })
        .collect()
}

fn run(args: &[&str]) -> Value {
    let o = Command::new(BIN).args(args).output().unwrap();
    assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn fragmented_udp_through_nat_and_fw_reassembles_to_the_originals() {
    let dir: PathBuf = std::env::temp_dir().join(format!("flowplane-fragments-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join("in.pcap");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/models/fragments.py");
    let g = Command::new(python()).arg(script).arg(&input).output().expect("python3 with scapy");
    assert!(g.status.success(), "{}", String::from_utf8_lossy(&g.stderr));
    let want: Value = serde_json::from_slice(&g.stdout).unwrap();
    // The originals: the 20 whole datagrams (not the orphan's nor the overlapping one's).
    let orig: Vec<_> = datagrams(&input).into_iter().filter(|(s, _, _)| s != "10.1.0.60" && s != "10.1.0.50").collect();
    assert_eq!(orig.len() as u64, want["datagrams"].as_u64().unwrap());
    let flow_of: BTreeMap<&str, (&str, &str)> =
        orig.iter().map(|(s, p, d)| (d.as_str(), (s.as_str(), p.as_str()))).collect();
    assert_eq!(flow_of.len(), orig.len(), "payloads tell the datagrams apart");
    let payloads = |v: &[(String, String, String)]| v.iter().map(|x| x.2.clone()).collect::<BTreeSet<_>>();

    for (exec, cores) in [("batch", "1"), ("rtc", "1"), ("interleaved", "1"), ("batch", "2"), ("rtc", "2")] {
        for chain in ["nat", "fw"] {
            let what = format!("{chain} --exec {exec} --cores {cores}");
            // Small tables: the trace holds 24 flows.
            let spec = if chain == "fw" { "fw(conns=1024)" } else { chain };
            let out = dir.join(format!("out-{chain}-{exec}-{cores}.pcap"));
            let r = run(&[
                "run",
                "--input",
                input.to_str().unwrap(),
                "--chain",
                spec,
                "--table-capacity",
                "4096",
                "--exec",
                exec,
                "--cores",
                cores,
                "--output",
                out.to_str().unwrap(),
                "--json",
            ]);
            let f = &r["tables"]["fragments"];
            for k in ["first", "followed", "orphans", "overlaps"] {
                assert_eq!(f[k], want[k], "{what}: {k}: {f}");
            }
            assert_eq!(f["too_many"], 0, "{what}");
            // Dropped: the overlapping fragment (by the table) and the two orphans (by the NF: no ports).
            assert_eq!(r["dropped"], 3, "{what}: {}", r["nfs"][0]["details"]);
            let got = datagrams(&out);
            assert_eq!(got.len(), orig.len(), "{what}: every datagram reassembles");
            assert_eq!(payloads(&got), payloads(&orig), "{what}: the original payloads");
            if chain == "fw" {
                let mut a = got.clone();
                let mut b = orig.clone();
                a.sort();
                b.sort();
                assert_eq!(a, b, "{what}: untouched");
                assert_eq!(r["nfs"][0]["details"]["fragments_followed"], want["followed"], "{what}");
                continue;
            }
            // nat: one external port per inside flow, for both of its datagrams; different flows, different ports.
            let mut ports: BTreeMap<(&str, &str), BTreeSet<&str>> = BTreeMap::new();
            for (src, port, payload) in &got {
                assert_eq!(src, EXTERNAL, "{what}");
                ports.entry(flow_of[payload.as_str()]).or_default().insert(port.as_str());
            }
            assert_eq!(ports.len(), 10, "{what}");
            assert!(ports.values().all(|p| p.len() == 1), "{what}: {ports:?}");
            let distinct: BTreeSet<_> = ports.values().flatten().collect();
            assert_eq!(distinct.len(), 10, "{what}: {ports:?}");
            assert_eq!(r["nfs"][0]["details"]["dropped_fragments"], want["orphans"], "{what}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// (source, source port, payload hex) of every IPv6 datagram tshark reassembles from `pcap` to the remote,
/// asserting each one's UDP checksum is good.
fn datagrams6(pcap: &Path) -> Vec<(String, String, String)> {
    let o = Command::new("tshark")
        .arg("-n")
        .arg("-r")
        .arg(pcap)
        .args(["-o", "ipv6.defragment:TRUE", "-o", "udp.check_checksum:TRUE", "-Y", "udp && ipv6.dst == 2001:db8::7"])
        .args(["-T", "fields", "-e", "ipv6.src", "-e", "udp.srcport", "-e", "udp.checksum.status", "-e", "udp.payload"])
        .output()
        .expect("tshark");
    assert!(o.status.success(), "tshark: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            assert_eq!(f[2], "1", "a good UDP checksum: {l}");
            (f[0].to_string(), f[1].to_string(), f[3].to_string())
        })
        .collect()
}

/// Issue 33 item 3: IPv6 fragments (a Fragment extension header, behind hop-by-hop and destination-options
/// headers for half the hosts; scapy's fragment6) through fw on 1 and 2 cores: the fragment table's counters
/// are the trace's by its rule, every whole datagram reassembles (tshark) to its original, untouched; the
/// orphans and the overlapping fragment do not come out.
#[test]
fn ipv6_fragments_follow_their_first_through_fw() {
    let dir: PathBuf = std::env::temp_dir().join(format!("flowplane-fragments6-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join("in.pcap");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/models/fragments.py");
    let g = Command::new(python()).arg(script).arg(&input).arg("v6").output().expect("python3 with scapy");
    assert!(g.status.success(), "{}", String::from_utf8_lossy(&g.stderr));
    let want: Value = serde_json::from_slice(&g.stdout).unwrap();
    let mut orig: Vec<_> =
        datagrams6(&input).into_iter().filter(|(s, _, _)| s != "fd00::60" && s != "fd00::50").collect();
    orig.sort();
    assert_eq!(orig.len() as u64, want["datagrams"].as_u64().unwrap());
    for (exec, cores) in [("batch", "1"), ("rtc", "1"), ("batch", "2")] {
        let what = format!("fw --exec {exec} --cores {cores}");
        let out = dir.join(format!("out-{exec}-{cores}.pcap"));
        let r = run(&[
            "run",
            "--input",
            input.to_str().unwrap(),
            "--chain",
            "fw(conns=1024,inside=fd00::/16)",
            "--table-capacity",
            "4096",
            "--exec",
            exec,
            "--cores",
            cores,
            "--output",
            out.to_str().unwrap(),
            "--json",
        ]);
        let f = &r["tables"]["fragments"];
        for k in ["first", "followed", "orphans", "overlaps", "v6"] {
            assert_eq!(f[k], want[k], "{what}: {k}: {f}");
        }
        assert_eq!(r["dropped"], 3, "{what}: {}", r["nfs"][0]["details"]);
        let mut got = datagrams6(&out);
        got.sort();
        assert_eq!(got, orig, "{what}: every datagram whole and untouched");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
