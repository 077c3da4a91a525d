//! Issue 31, item 1: `--ctl` and `--metrics` on a replay, as on a live port.
//! A paced replay (10 s of traffic at 20,000 packets/s on 2 cores) is watched
//! while it plays (`show runtime` counts grow, the metrics endpoint answers),
//! changed (`load acl` swaps the rules: from then on every packet is
//! dropped, with fsc's flows kept) and stopped early (`ctl stop`: the run
//! ends with its report well before the trace's end); profiled (`profile
//! start`: `show runtime` lists each NF's calls, vectors per call and cycles
//! per packet). No root needed.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_flowplane");
const METRICS: u16 = 19_672;

fn ctl(sock: &Path, words: &[&str]) -> (bool, Value, String) {
    let out = Command::new(BIN).arg("ctl").arg(sock).args(words).arg("--json").output().unwrap();
    (
        out.status.success(),
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn packets(sock: &Path) -> u64 {
    let v = ctl(sock, &["show", "runtime"]).1;
    v["cores"].as_array().map_or(0, |c| c.iter().map(|c| c["packets"].as_u64().unwrap_or(0)).sum())
}

fn scrape() -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", METRICS)).expect("metrics endpoint");
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut t = String::new();
    s.read_to_string(&mut t).unwrap();
    t
}

/// `flowplane run ARGS --no-pin --json --ctl SOCK`, once its control socket says the data plane is up.
fn served(args: &[&str], sock: &Path) -> std::process::Child {
    let t0 = Instant::now();
    let fp = Command::new(BIN)
        .args(args)
        .args(["--no-pin", "--json", "--ctl", sock.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    while ctl(sock, &["show", "runtime"]).1["ready"].as_bool() != Some(true) {
        // Generous: under a loaded machine (load 16 on 2 vCPUs) start-up took over 20 s once.
        assert!(t0.elapsed() < Duration::from_secs(60), "the control socket did not come up");
        std::thread::sleep(Duration::from_millis(20));
    }
    fp
}

#[test]
fn a_paced_replay_is_watched_changed_and_stopped_on_its_control_socket() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("served{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (sock, pass, deny) = (dir.join("fp.sock"), dir.join("pass.rules"), dir.join("deny.rules"));
    std::fs::write(&pass, "drop proto tcp\n").unwrap();
    std::fs::write(&deny, "drop proto udp\n").unwrap();
    let chain = format!("acl(rules={}) -> fsc", pass.display());
    let t0 = Instant::now();
    let metrics = format!("127.0.0.1:{METRICS}");
    let args = ["run", "--gen", "--flows 50 --packets 200000 --proto udp --seed 3", "--rate", "20000", "--chain"];
    let fp = served(&[&args[..], &[&chain, "--cores", "2", "--metrics", &metrics]].concat(), &sock);
    // Watched: the counts grow while it plays (published twice a second).
    let t1 = Instant::now();
    let first = loop {
        let n = packets(&sock);
        if n > 0 {
            break n;
        }
        assert!(t1.elapsed() < Duration::from_secs(5), "no packet shown");
        std::thread::sleep(Duration::from_millis(50));
    };
    std::thread::sleep(Duration::from_millis(600));
    let second = packets(&sock);
    assert!(second > first && second < 200_000, "show runtime: {first} then {second}");
    let m = scrape();
    assert!(m.contains("200 OK") && m.contains("flowplane_core_packets_total{core=\"1\"}"), "{m}");
    let (_, runtime, _) = ctl(&sock, &["show", "ports"]);
    assert_eq!(runtime, Value::Array(vec![]), "a replay has no ports");
    // Profiled: each NF's calls, vectors per call and cycles per packet, from `profile start` on.
    let (good, _, err) = ctl(&sock, &["profile", "start"]);
    assert!(good, "profile start: {err}");
    let t2 = Instant::now();
    let nfs = loop {
        let v = ctl(&sock, &["show", "runtime"]).1;
        if v["nfs"].as_array().is_some_and(|n| n.len() == 2 && n[1]["packets"].as_u64().unwrap_or(0) > 0) {
            break v["nfs"].clone();
        }
        assert!(t2.elapsed() < Duration::from_secs(5), "no profile in show runtime: {v}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!((nfs[0]["nf"].as_str(), nfs[1]["nf"].as_str()), (Some("acl"), Some("fsc")), "{nfs}");
    for n in nfs.as_array().unwrap() {
        assert!(n["calls"].as_u64().unwrap() > 0 && n["cycles_per_packet"].as_f64().unwrap() > 0.0, "{nfs}");
        assert!(n["vectors_per_call"].as_f64().unwrap() >= 1.0, "{nfs}");
    }
    // Every packet that reached fsc went through acl first (nothing dropped yet).
    assert!(nfs[0]["packets"].as_u64() >= nfs[1]["packets"].as_u64(), "{nfs}");
    let (good, _, err) = ctl(&sock, &["profile", "stop"]);
    assert!(good, "profile stop: {err}");
    // Changed: every UDP packet is dropped from the swap on.
    let (good, v, err) = ctl(&sock, &["load", "acl", deny.to_str().unwrap()]);
    assert!(good, "load acl: {err} {v}");
    std::thread::sleep(Duration::from_millis(300));
    // Stopped early.
    let (good, _, err) = ctl(&sock, &["stop"]);
    assert!(good, "stop: {err}");
    let out = fp.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(t0.elapsed() < Duration::from_secs(30));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    let (n, dropped, out_n) =
        (r["packets"].as_u64().unwrap(), r["dropped"].as_u64().unwrap(), r["packets_out"].as_u64().unwrap());
    assert!(n >= second && n < 200_000, "stopped early: {n} packets");
    // Before the swap every packet passed; after it every one was dropped.
    assert!(out_n >= first && dropped > 0 && out_n + dropped == n, "out {out_n} + dropped {dropped} = {n}");
    assert_eq!(r["nfs"][0]["packets_out"].as_u64().unwrap(), out_n, "{}", r["nfs"]);
    // fsc's flows were kept across the swap (no state reset): 50 flows seen once each.
    assert_eq!(r["tables"]["flows"].as_u64(), Some(50), "{}", r["tables"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Under `--scale scr` the state is the replicas' (the executors' tables stay empty): `show tables`
/// reads the replicas' figures while the run goes on (every replica holds every flow); a trace shows
/// each core's packets with ddos's per-source state in its replica (counts that grow across the cores'
/// packets), and captures (input, after an NF) take packets.
#[test]
fn show_tables_under_scr_reads_the_replicas() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("served-scr{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("fp.sock");
    let args = ["run", "--gen", "--flows 40 --packets 200000 --proto udp --seed 4", "--rate", "20000"];
    let fp = served(&[&args[..], &["--chain", "ddos -> hh", "--scale", "scr", "--cores", "2"]].concat(), &sock);
    let t1 = Instant::now();
    let tables = loop {
        let t = ctl(&sock, &["show", "tables"]).1;
        let flows: Vec<u64> =
            t.as_array().map_or(vec![], |c| c.iter().map(|c| c["flows"].as_u64().unwrap_or(0)).collect());
        if flows.len() == 2 && flows.iter().all(|&f| f == 40) {
            break t;
        }
        assert!(t1.elapsed() < Duration::from_secs(8), "show tables under scr: {t}");
        std::thread::sleep(Duration::from_millis(100));
    };
    for c in tables.as_array().unwrap() {
        assert!(c["insertions"].as_u64().unwrap() >= 40 && c["capacity"].as_u64().unwrap() >= 40, "{tables}");
    }
    // A trace and captures see each core's own packets on its replica (they used to see nothing).
    let (input, at) = (dir.join("in.pcap"), dir.join("at.pcap"));
    assert!(ctl(&sock, &["capture", "start", input.to_str().unwrap()]).0);
    let (good, armed, err) = ctl(&sock, &["trace", "add", "200"]);
    assert!(good && armed["armed"] == 200, "{err}");
    let t2 = Instant::now();
    let recs = loop {
        let v = ctl(&sock, &["trace", "show"]).1;
        if v.as_array().is_some_and(|a| a.len() == 200) {
            break v;
        }
        assert!(t2.elapsed() < Duration::from_secs(8), "trace under scr: {v}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let stop = ctl(&sock, &["capture", "stop"]).1;
    assert!(stop["written"].as_u64().unwrap() > 0 && stop["dropped"] == 0, "{stop}");
    assert!(ctl(&sock, &["capture", "start", at.to_str().unwrap(), "--at", "hh"]).0);
    std::thread::sleep(Duration::from_millis(200));
    let stop = ctl(&sock, &["capture", "stop"]).1;
    assert!(stop["written"].as_u64().unwrap() > 0, "{stop}");
    let recs = recs.as_array().unwrap();
    let workers: std::collections::BTreeSet<u64> = recs.iter().map(|r| r["worker"].as_u64().unwrap()).collect();
    assert_eq!(workers.len(), 2, "SCR sprays packets over both cores: {workers:?}");
    // Per source and window, the replica's count after each traced packet (whichever core ran it) grows
    // by one from its count before: each replica holds every core's packets (fast-forwarded).
    let mut by_window: std::collections::BTreeMap<(String, u64), Vec<(u64, u64)>> = Default::default();
    for r in recs {
        let verdicts: Vec<&str> =
            r["stages"].as_array().unwrap().iter().map(|s| s["verdict"].as_str().unwrap()).collect();
        assert_eq!(verdicts, ["pass", "pass"], "{r}");
        let st = &r["stages"][0]["state"];
        let after = &st["after"];
        let before = st["before"]["window_packets"].as_u64();
        let key = (after["src"].as_str().unwrap().to_string(), after["window_start_ns"].as_u64().unwrap());
        let n = after["window_packets"].as_u64().unwrap();
        if st["before"]["window_start_ns"].as_u64() == Some(key.1) {
            assert_eq!(before, Some(n - 1), "{r}");
        }
        by_window.entry(key).or_default().push((r["ts_ns"].as_u64().unwrap(), n));
        assert!(!r["stages"][1]["state"]["after"].is_null(), "hh's state: {r}");
    }
    let mut across = 0;
    for (k, mut v) in by_window {
        v.sort_unstable();
        assert!(v.windows(2).all(|w| w[0].1 < w[1].1), "{k:?}: {v:?}");
        across += v.len().saturating_sub(1);
    }
    assert!(across > 0, "no source traced twice in a window");
    assert!(ctl(&sock, &["stop"]).0);
    let out = fp.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_dir_all(&dir);
}

/// IPv4 destination of each frame of a classic pcap (Ethernet, IPv4).
fn pcap_dsts(path: &Path) -> Vec<[u8; 4]> {
    let d = std::fs::read(path).unwrap();
    let le = |o: usize| u32::from_le_bytes(d[o..o + 4].try_into().unwrap()) as usize;
    let (mut out, mut off) = (Vec::new(), 24);
    while off + 16 <= d.len() {
        let len = le(off + 8);
        out.push(d[off + 16 + 30..off + 16 + 34].try_into().unwrap());
        off += 16 + len;
    }
    out
}

/// A chain graph served on a replay: a trace follows each packet along its branch (named, with the
/// branch's NFs by their paths, each with its verdict and fsc's state), and `capture --at` takes the
/// packets after a branch's NF. The ACL's rule (destinations in 172.16.0.0/13 dropped, so denied) is the
/// oracle: read from each traced packet's and each captured frame's own destination.
#[test]
fn a_served_graph_is_traced_and_captured_along_its_branches() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("served-graph{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (sock, deny, allow) = (dir.join("fp.sock"), dir.join("deny.pcap"), dir.join("allow.pcap"));
    let chain = "acl(rule=drop:udp:any:172.16.0.0/13) -> { allow: fsc ; deny: count -> fsc }";
    let args = ["run", "--gen", "--flows 50 --packets 200000 --proto udp --seed 5", "--rate", "20000"];
    let fp = served(&[&args[..], &["--chain", chain, "--cores", "2"]].concat(), &sock);
    let denied = |dst: &str| dst.parse::<std::net::Ipv4Addr>().unwrap().octets()[1] & 0xf8 == 16;
    assert!(ctl(&sock, &["capture", "start", deny.to_str().unwrap(), "--at", "deny/fsc"]).0);
    let (good, _, err) = ctl(&sock, &["trace", "add", "60"]);
    assert!(good, "{err}");
    let t1 = Instant::now();
    let recs = loop {
        let v = ctl(&sock, &["trace", "show"]).1;
        if v.as_array().is_some_and(|a| a.len() == 60) {
            break v;
        }
        assert!(t1.elapsed() < Duration::from_secs(8), "trace of a graph: {v}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let stop = ctl(&sock, &["capture", "stop"]).1;
    assert!(stop["written"].as_u64().unwrap() > 0, "{stop}");
    assert!(ctl(&sock, &["capture", "start", allow.to_str().unwrap(), "--at", "allow/fsc"]).0);
    std::thread::sleep(Duration::from_millis(300));
    assert!(ctl(&sock, &["capture", "stop"]).1["written"].as_u64().unwrap() > 0);
    let (mut seen_allow, mut seen_deny) = (0, 0);
    for r in recs.as_array().unwrap() {
        let nfs: Vec<String> = r["stages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| format!("{} {}", s["nf"].as_str().unwrap(), s["verdict"].as_str().unwrap()))
            .collect();
        let fsc = r["stages"].as_array().unwrap().last().unwrap()["state"]["after"].clone();
        if denied(r["flow"]["dst"].as_str().unwrap()) {
            assert_eq!(r["branch"], "deny", "{r}");
            assert_eq!(nfs, ["acl drop", "deny/count pass", "deny/fsc pass"], "{r}");
            seen_deny += 1;
        } else {
            assert_eq!(r["branch"], "allow", "{r}");
            assert_eq!(nfs, ["acl pass", "allow/fsc pass"], "{r}");
            seen_allow += 1;
        }
        // The branch's fsc counted this packet: its flow's counts after it.
        assert_eq!(fsc["dst"], r["flow"]["dst"], "{r}");
        assert!(fsc["packets"].as_u64().unwrap() >= 1, "{r}");
        assert_eq!(r["verdict"], "out port 0", "{r}");
    }
    assert!(seen_allow > 0 && seen_deny > 0, "both branches traced: {seen_allow} allowed, {seen_deny} denied");
    // show flow reaches a branch's NFs too (by path): a traced flow's fsc is the one of its branch.
    let r = &recs[0];
    let f = &r["flow"];
    let (sport, dport) = (f["sport"].to_string(), f["dport"].to_string());
    let rows =
        ctl(&sock, &["show", "flow", "udp", f["src"].as_str().unwrap(), &sport, f["dst"].as_str().unwrap(), &dport]).1;
    let nfs: Vec<&str> = rows.as_array().unwrap().iter().map(|x| x["nf"].as_str().unwrap()).collect();
    let fsc = if r["branch"] == "deny" { "deny/fsc" } else { "allow/fsc" };
    assert!(nfs.contains(&fsc) && nfs.contains(&"acl"), "show flow on a graph: {rows}");
    let dst = |d: [u8; 4]| std::net::Ipv4Addr::from(d).to_string();
    assert!(pcap_dsts(&deny).into_iter().all(|d| denied(&dst(d))), "deny/fsc's capture holds only denied packets");
    assert!(pcap_dsts(&allow).into_iter().all(|d| !denied(&dst(d))), "allow/fsc's capture holds only allowed ones");
    assert!(ctl(&sock, &["stop"]).0);
    let out = fp.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_dir_all(&dir);
}
