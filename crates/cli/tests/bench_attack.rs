//! Issue 33 item 6: `flowplane bench attack --quick` (the CI smoke run) gives every scenario a normal row and
//! its attack rows under the same chain, with ratios, table counters and its provenance; each scenario's
//! counters say what its documented rule says they must; the traces it crafted are what it claims, checked by
//! tshark (SYNs from distinct sources, fragments that reassemble into whole UDP datagrams with good checksums,
//! new NAT flows past the pool) and, for the collision keys, by the flow table's documented rule (a bucket pair
//! holds 16 entries) through `flowplane run` with the leaked secret and with another.

use std::collections::HashSet;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_flowplane");

fn flowplane(args: &[&str]) -> Value {
    let o = Command::new(BIN).args(args).output().unwrap();
    assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// tshark's field lines for `file` (`extra` options first).
fn tshark(file: &Path, extra: &[&str], fields: &[&str]) -> Vec<String> {
    let mut cmd = Command::new("tshark");
    cmd.arg("-n").arg("-r").arg(file).args(extra).args(["-T", "fields"]);
    for f in fields {
        cmd.args(["-e", f]);
    }
    let o = cmd.output().expect("tshark");
    assert!(o.status.success(), "tshark {file:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).lines().map(str::to_string).collect()
}

fn rows<'a>(r: &'a Value, scenario: &str) -> Vec<&'a Value> {
    r["rows"].as_array().unwrap().iter().filter(|x| x["scenario"] == scenario).collect()
}

fn row<'a>(r: &'a Value, scenario: &str, traffic: &str) -> &'a Value {
    rows(r, scenario)
        .into_iter()
        .find(|x| x["traffic"] == traffic)
        .unwrap_or_else(|| panic!("no {scenario} {traffic} row: {r}"))
}

fn u(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"))
}

#[test]
fn quick_run_rows_counters_and_traces_are_what_each_scenario_claims() {
    let dir = std::env::temp_dir().join(format!("flowplane-bench-attack-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.to_str().unwrap();
    let t0 = std::time::Instant::now();
    let r = flowplane(&["bench", "attack", "--quick", "--json", "--write-traces", d]);
    assert!(t0.elapsed().as_secs() < 60, "a smoke run: {:?}", t0.elapsed());
    assert!(r["provenance"]["commit"].as_str().is_some_and(|c| !c.is_empty()), "{}", r["provenance"]);

    for s in ["syn-flood", "syn-flood-evict", "udp-flood", "nat-exhaustion", "hash-collision", "fragment-flood"] {
        let rs = rows(&r, s);
        assert!(rs.len() >= 2 && rs[0]["traffic"] == "normal", "{s}: {rs:?}");
        for a in &rs[1..] {
            assert!(a["traffic"].as_str().unwrap().starts_with("attack"), "{a}");
            assert_eq!(a["chain"], rs[0]["chain"], "the same chain beside its attack");
            assert!(a["cycles_vs_normal"].as_f64().unwrap() > 0.0 && a["mpps"].as_f64().unwrap() > 0.0, "{a}");
            assert!(a["packets"].as_u64().unwrap() > 0, "{a}");
        }
        assert!(rs[0]["cycles_vs_normal"].is_null());
        assert!(rs[0]["passed"].as_f64().unwrap() > 0.999 && u(rs[0], "table_full") == 0, "{s} normal: {}", rs[0]);
    }

    // A SYN flood of 16 x flows sources into a table of 2 x flows: refused (reject) or evicting (evict).
    let syn = row(&r, "syn-flood", "attack");
    assert!(u(syn, "table_full") > 0 && u(syn, "evictions") == 0, "{syn}");
    let ev = row(&r, "syn-flood-evict", "attack");
    assert!(u(ev, "evictions") > 0, "{ev}");
    // ddos: sources over the threshold, 4x the source table: the sketch judges the untracked ones and drops.
    let dd = row(&r, "udp-flood", "attack");
    assert!(u(dd, "sketch_dropped") > 0 && u(dd, "shared_table_full") > 0, "{dd}");
    assert!(dd["passed"].as_f64().unwrap() < 0.9, "{dd}");
    assert_eq!(u(row(&r, "udp-flood", "normal"), "dropped"), 0);
    // nat: 4x the pool in new flows: exhaustion refuses, inserts nothing past the pool.
    let nat = row(&r, "nat-exhaustion", "attack");
    assert!(u(nat, "pool_exhausted") > 0 && u(nat, "refused") > 0, "{nat}");
    assert!(u(nat, "insertions") <= 1024, "one entry per port of the 1,024-port pool at most: {nat}");
    assert_eq!(u(row(&r, "nat-exhaustion", "normal"), "pool_exhausted"), 0);
    // Collision keys overflow their bucket pair only under the secret they were built against.
    let leaked = row(&r, "hash-collision", "attack (leaked secret)");
    let secret = row(&r, "hash-collision", "attack (random secret)");
    assert!(u(leaked, "table_full") > 0, "{leaked}");
    assert_eq!(u(secret, "table_full"), 0, "{secret}");

    // Fragments: every later fragment follows its first one (one core, in order).
    let fr = row(&r, "fragment-flood", "attack");
    assert!(u(fr, "fragments_followed") > 0 && u(fr, "fragment_orphans") == 0, "{fr}");

    // The traces. SYN flood: every packet a SYN without ACK, each from its own source.
    let syn_pcap = dir.join("syn-flood.attack.pcap");
    let lines = tshark(&syn_pcap, &[], &["ip.src", "tcp.flags.syn", "tcp.flags.ack"]);
    assert_eq!(lines.len() as u64, u(syn, "trace_packets"));
    let srcs: HashSet<&str> = lines.iter().map(|l| l.split('\t').next().unwrap()).collect();
    assert_eq!(srcs.len(), lines.len(), "one SYN per spoofed source");
    assert!(lines.iter().all(|l| {
        let f: Vec<&str> = l.split('\t').collect();
        matches!(f[1], "1" | "True") && matches!(f[2], "0" | "False")
    }));
    // Fragment flood: tshark reassembles one 48-byte UDP datagram with a good checksum per source.
    let frag = row(&r, "fragment-flood", "attack");
    let frag_pcap = dir.join("fragment-flood.attack.pcap");
    let all = tshark(&frag_pcap, &[], &["ip.flags.mf", "ip.frag_offset"]);
    assert_eq!(all.len() as u64, 3 * u(frag, "trace_flows"), "three fragments per datagram");
    let dgrams = tshark(
        &frag_pcap,
        &["-o", "ip.defragment:TRUE", "-o", "udp.check_checksum:TRUE", "-Y", "udp"],
        &["ip.src", "udp.length", "udp.checksum.status"],
    );
    assert_eq!(dgrams.len() as u64, u(frag, "trace_flows"), "one reassembled datagram per source");
    for l in &dgrams {
        let f: Vec<&str> = l.split('\t').collect();
        assert_eq!((f[1], f[2]), ("48", "1"), "{l}");
    }
    // NAT: 4 x 1,024 distinct inside flows (the quick pool's four times).
    let nat_lines = tshark(&dir.join("nat-exhaustion.attack.pcap"), &[], &["ip.src", "udp.srcport"]);
    let flows: HashSet<&String> = nat_lines.iter().collect();
    assert_eq!(flows.len() as u64, 4 * 1024, "4 x the quick pool");
    assert_eq!(flows.len() as u64, u(nat, "trace_flows"));

    // The collision keys through `flowplane run` one pass, one packet at a time (rtc): under the leaked secret
    // the room the table's documented rule gives keys that share every candidate position (bucketed: one
    // bucket pair, 16 slots; inline: one home's window of 128 positions) holds that many of them and the 48
    // others are refused at each of their 64 packets; under any other secret they spread and none is refused.
    let c = &r["collision"];
    let (seed, cap) = (u(c, "leaked_seed"), u(c, "table_capacity"));
    let coll = dir.join("hash-collision.attack.pcap");
    let run = |s: u64| {
        let (s, cap) = (s.to_string(), cap.to_string());
        let args = [
            "run",
            "--input",
            coll.to_str().unwrap(),
            "--chain",
            "fsc",
            "--exec",
            "rtc",
            "--cores",
            "1",
            "--table-capacity",
        ];
        let mut a: Vec<&str> = args.to_vec();
        a.extend([cap.as_str(), "--hash-seed", s.as_str(), "--loops", "1", "--json"]);
        flowplane(&a)["tables"]["table_full"].as_u64().unwrap()
    };
    let room = match c["layout"].as_str().unwrap() {
        "bucketed" => 16,
        "inline" => 128,
        other => panic!("layout {other}"),
    };
    assert_eq!(u(c, "keys"), room + 48, "{c}");
    assert_eq!(run(seed), 48 * 64);
    assert_eq!(run(seed ^ 0x5bd1_e995), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_options_are_one_line_errors() {
    for (args, want) in [
        (&["bench", "attack", "--flows", "3"][..], "--flows"),
        (&["bench", "attack", "--seconds", "0"], "--seconds"),
        (&["bench", "attack", "--exec", "turbo"], "--exec"),
        (&["bench", "attack", "--only", "nothing"], "--only"),
    ] {
        let o = Command::new(BIN).args(args).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(e.trim().lines().count() == 1 && e.contains(want), "{args:?}: {e}");
    }
}
