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
    scrape_at(METRICS)
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

/// A python3 with scapy.
fn python() -> &'static str {
    ["/usr/bin/python3", "python3"]
        .into_iter()
        .find(|p| Command::new(p).args(["-c", "import scapy.all"]).output().is_ok_and(|o| o.status.success()))
        .expect("a python3 with scapy")
}

/// `tests/models/swap.py ARGS`: its JSON output.
fn swap_model(args: &[&str]) -> Value {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/models/swap.py");
    let o = Command::new(python()).arg(script).args(args).output().unwrap();
    assert!(o.status.success(), "swap.py {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap_or(Value::Null)
}

/// The core each flow of `flows` (UDP from `src`, (sport, dst, dport)) is on: where `nf` keeps its state.
fn cores_of(sock: &Path, nf: &str, src: &str, flows: &[(u16, &str, u16)]) -> Vec<u64> {
    flows
        .iter()
        .map(|&(sport, dst, dport)| {
            let rows = ctl(sock, &["show", "flow", "udp", src, &sport.to_string(), dst, &dport.to_string()]).1;
            let cores: Vec<u64> = rows
                .as_array()
                .unwrap()
                .iter()
                .filter(|r| r["nf"] == nf)
                .map(|r| r["core"].as_u64().unwrap())
                .collect();
            assert_eq!(cores.len(), 1, "flow {sport}->{dst} on one core: {rows}");
            cores[0]
        })
        .collect()
}

/// Issue 31, `ctl load route FILE`: a paced replay on 2 cores (16 UDP flows, payload `seq=NNNNNN`, 4,000
/// packets at 2,000/s; each verdict port to its own pcap) swaps its route table mid-run. The oracle is
/// `tests/models/swap.py` (longest prefix match over the files' prefixes with Python's ipaddress): per core
/// (a flow's core is where `show flow` finds route's state), its packets in the order sent are routed by
/// the old table up to one switch point and by the new one after it — none lost, none by a mixed table —
/// and the cores switch close together; flows keep their state (route's packet counts go on). A bad file
/// before it is refused in one line naming the file and line, and changes nothing.
#[test]
fn a_route_table_swapped_mid_replay_routes_every_later_packet_by_the_new_table() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("served-route{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (sock, trace, old, new, bad) =
        (dir.join("fp.sock"), dir.join("t.pcap"), dir.join("old.routes"), dir.join("new.routes"), dir.join("bad"));
    let n = 4000usize;
    swap_model(&["route-trace", trace.to_str().unwrap(), &n.to_string()]);
    std::fs::write(&old, "10.0.0.0/8 0\n10.1.0.0/16 1\n10.1.2.0/24 2\n").unwrap();
    std::fs::write(&new, "# the new table\n10.0.0.0/8 1\n10.1.0.0/16 2\n10.1.2.128/25 3\n10.2.0.0/16 0\n").unwrap();
    std::fs::write(&bad, "10.0.0.0/8 1\n10.1.0.0/16 two\n").unwrap();
    let outs: Vec<PathBuf> = (0..4).map(|p| dir.join(format!("port{p}.pcap"))).collect();
    let chain = format!("route(routes={}) -> fsc", old.display());
    let mut args = vec!["run", "--input", trace.to_str().unwrap(), "--rate", "2000", "--chain", &chain, "--cores", "2"];
    args.extend(["--output", outs[0].to_str().unwrap()]);
    for o in &outs[1..] {
        args.extend(["--port", o.to_str().unwrap()]);
    }
    let fp = served(&args, &sock);
    let flows: Vec<(u16, &str, u16)> = (0..16).map(|f| (4000 + f as u16, DSTS[f % DSTS.len()], 53)).collect();
    let t1 = Instant::now();
    while packets(&sock) < 32 {
        assert!(t1.elapsed() < Duration::from_secs(10), "the replay did not play");
        std::thread::sleep(Duration::from_millis(20));
    }
    let core_of = cores_of(&sock, "route", "10.0.0.1", &flows);
    while packets(&sock) < n as u64 * 2 / 5 {
        assert!(t1.elapsed() < Duration::from_secs(10), "the replay did not play");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (good, _, err) = ctl(&sock, &["load", "route", bad.to_str().unwrap()]);
    assert!(!good && err.trim().lines().count() == 1, "{err}");
    assert!(err.contains("/bad:2: port must be 0..=65534: '10.1.0.0/16 two'"), "{err}");
    let (good, v, err) = ctl(&sock, &["load", "route", new.to_str().unwrap()]);
    assert!(good && v["cores"] == 2, "load route: {err} {v}");
    let out = fp.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["packets"].as_u64(), Some(n as u64), "the whole trace played");
    assert_eq!(r["nfs"][0]["details"]["version"], 1, "one swap: {}", r["nfs"][0]["details"]);
    // Flow state kept: route's and fsc's 16 flows, created once each.
    assert_eq!(r["tables"]["insertions"].as_u64(), Some(16), "{}", r["tables"]);

    let mut judge = vec!["route-judge", old.to_str().unwrap(), new.to_str().unwrap()];
    judge.extend(outs.iter().map(|o| o.to_str().unwrap()));
    let rows = swap_model(&judge);
    let rows = rows.as_array().unwrap();
    let mut switch = Vec::new();
    for c in 0..2 {
        // This core's packets in trace order: (seq, routed as the old table says, as the new one says).
        let judged: Vec<(u64, bool, bool)> = rows
            .iter()
            .filter(|x| core_of[x[0].as_u64().unwrap() as usize % 16] == c)
            .map(|x| (x[0].as_u64().unwrap(), x[1] == x[2], x[1] == x[3]))
            .collect();
        // Destinations both tables route alike say nothing: the switch is the first packet only the new one explains.
        let first_new = judged.iter().position(|&(_, o, nw)| nw && !o).expect("a packet routed by the new table");
        let before: Vec<u64> = judged[..first_new].iter().filter(|j| !j.1).map(|j| j.0).collect();
        let after: Vec<u64> = judged[first_new..].iter().filter(|j| !j.2).map(|j| j.0).collect();
        assert!(before.is_empty(), "core {c}: packets not routed by the old table before the switch: {before:?}");
        assert!(after.is_empty(), "core {c}: packets not routed by the new table after the switch: {after:?}");
        assert!(judged[..first_new].iter().any(|j| !j.2), "core {c}: the swap landed mid-replay");
        switch.push(judged[first_new].0);
    }
    // 2,000 packets/s: 200 packets is 100 ms (room for a worker descheduled while it builds the table).
    assert!(switch[0].abs_diff(switch[1]) < 200, "switch points per core (seq): {switch:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// swap.py's destinations (flow f goes to DSTS[f % 6]).
const DSTS: [&str; 6] = ["10.1.2.5", "10.1.2.200", "10.1.9.9", "10.2.3.4", "10.3.3.3", "11.0.0.1"];

/// Issue 31, a NAT pool changed while running (`ctl set nat external 192.0.2.10 addrs 2`): a paced replay
/// (`tests/models/swap.py nat-trace`: 2,000 UDP packets at 1,000/s, 8 flows from the start, 64 starting
/// over the trace, replies to the first 8 flows' documented mappings and to an unmapped port) on one core,
/// changed mid-run; the translated pcap read by scapy. Every flow keeps its external address and port from
/// its first packet to its last, the 8 first flows and their replies on 203.0.113.1 after it left the pool
/// too; new flows take 203.0.113.1 up to one switch point and the new pool's addresses after it; the
/// unmapped port stays closed; the report counts the mappings left on the retired address.
#[test]
fn a_nat_pool_changed_mid_replay_keeps_every_mapping() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("served-nat{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (sock, trace, out) = (dir.join("fp.sock"), dir.join("t.pcap"), dir.join("out.pcap"));
    let n = 2000u64;
    swap_model(&["nat-trace", trace.to_str().unwrap(), &n.to_string()]);
    let t = trace.to_str().unwrap();
    let args = ["run", "--input", t, "--rate", "1000", "--cores", "1", "--chain", "nat(ports=40000-40099)", "--output"];
    let fp = served(&[&args[..], &[out.to_str().unwrap()]].concat(), &sock);
    let t1 = Instant::now();
    while packets(&sock) < n * 2 / 5 {
        assert!(t1.elapsed() < Duration::from_secs(10), "the replay did not play");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (good, v, err) = ctl(&sock, &["set", "nat", "external", "192.0.2.10", "addrs", "2"]);
    assert!(good && v["cores"] == 1 && v["params"]["addrs"] == "2", "set nat: {err} {v}");
    let (good, _, err) = ctl(&sock, &["set", "nat", "ports", "2000-3000"]);
    assert!(!good && err.contains("'ports' is fixed for the run") && err.contains("external, addrs"), "{err}");
    let o = fp.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["packets"].as_u64(), Some(n));

    let rows = swap_model(&["nat-read", t, out.to_str().unwrap()]);
    let s = |v: &Value| v.as_str().map(str::to_string);
    let u = |v: &Value| v.as_u64();
    let old_ext = Some("203.0.113.1".to_string());
    let (mut unmapped, mut replies) = (0, 0);
    // New flows (from 10.0.0.2): sport -> (first seq, its translations).
    let mut new_flows: std::collections::BTreeMap<u64, (u64, std::collections::BTreeSet<(String, u64)>)> =
        Default::default();
    for x in rows.as_array().unwrap() {
        let (seq, src, sport, dport) = (u(&x[0]).unwrap(), s(&x[1]).unwrap(), u(&x[2]).unwrap(), u(&x[4]).unwrap());
        match src.as_str() {
            "198.51.100.9" if dport == 40090 => {
                assert!(x[5].is_null(), "packet {seq} to an unmapped port passed: {x}");
                unmapped += 1;
            }
            "198.51.100.9" => {
                // A reply to an old flow's mapping: back to 10.0.0.1:(5000 + k), before and after the change.
                assert_eq!((s(&x[7]), u(&x[8])), (Some("10.0.0.1".into()), Some(5000 + dport - 40000)), "{x}");
                replies += 1;
            }
            "10.0.0.1" => assert_eq!((s(&x[5]), u(&x[6])), (old_ext.clone(), Some(40000 + sport - 5000)), "{x}"),
            _ => {
                let e = new_flows.entry(sport).or_insert((seq, Default::default()));
                e.1.insert((s(&x[5]).expect("passed"), u(&x[6]).unwrap()));
            }
        }
    }
    assert!(unmapped > 0 && replies > 0);
    let mut by_start: Vec<(u64, String)> = new_flows
        .values()
        .map(|(first, tr)| {
            assert_eq!(tr.len(), 1, "a flow kept one mapping: {tr:?}");
            (*first, tr.first().unwrap().0.clone())
        })
        .collect();
    by_start.sort();
    let switch = by_start.iter().position(|(_, a)| Some(a) != old_ext.as_ref()).expect("new flows on the new pool");
    assert!(switch > 0, "new flows before the change took the old address");
    for (first, a) in &by_start[switch..] {
        assert!(a == "192.0.2.10" || a == "192.0.2.11", "flow starting at {first} on {a}: {by_start:?}");
    }
    let d = &r["nfs"][0]["details"];
    assert_eq!(d["retired_addrs"], serde_json::json!(["203.0.113.1"]), "{d}");
    assert_eq!(d["mappings_on_retired_addrs"].as_u64(), Some(8 + switch as u64), "{d}");
    assert_eq!((d["external"].as_str(), d["addrs"].as_u64()), (Some("192.0.2.10"), Some(2)), "{d}");
    assert_eq!(d["dropped_unmapped"].as_u64(), Some(unmapped), "{d}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 31 item 6 for route and nat: a paced replay started from `run --config run.toml` (chain
/// `route(routes=FILE) -> nat(...)`); `ctl reload` applies an edited route file (same path) and a new NAT
/// pool in the file together, and refuses in one line, applying nothing, what needs a restart (nat's
/// ports, the cores) or does not parse (the route file's bad line).
#[test]
fn reload_applies_a_route_file_and_a_nat_pool_and_refuses_a_restart() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("served-reload{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (sock, routes, conf) = (dir.join("fp.sock"), dir.join("r.routes"), dir.join("run.toml"));
    std::fs::write(&routes, "0.0.0.0/0 0\n").unwrap();
    let toml = |ext: &str, ports: &str, cores: u32| {
        format!(
            "gen = \"--flows 20 --packets 200000 --proto udp --seed 7\"\nrate = 20000\ncores = {cores}\nno_pin = true\n\
             json = true\nctl = \"{}\"\nchain = \"route(routes={}) -> nat(external={ext},ports={ports})\"\n",
            sock.display(),
            routes.display()
        )
    };
    std::fs::write(&conf, toml("203.0.113.1", "40000-49999", 1)).unwrap();
    let t0 = Instant::now();
    let fp = Command::new(BIN)
        .args(["run", "--config", conf.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    while ctl(&sock, &["show", "runtime"]).1["ready"].as_bool() != Some(true) {
        assert!(t0.elapsed() < Duration::from_secs(60), "the control socket did not come up");
        std::thread::sleep(Duration::from_millis(20));
    }
    let reload = || ctl(&sock, &["reload"]);
    assert_eq!(reload().1["applied"], serde_json::json!([]), "nothing changed");
    std::fs::write(&routes, "0.0.0.0/0 1\n10.0.0.0/8 2\n").unwrap();
    std::fs::write(&conf, toml("198.51.100.1", "40000-49999", 1)).unwrap();
    let (good, v, err) = reload();
    assert!(good, "{err}");
    let applied: Vec<&str> = v["applied"].as_array().unwrap().iter().map(|a| a["nf"].as_str().unwrap()).collect();
    assert_eq!(applied, ["route", "nat"], "{v}");
    let t1 = Instant::now();
    loop {
        let nfs = ctl(&sock, &["show", "nfs"]).1;
        let (route, nat) = (&nfs[0]["stats"][0]["fields"], &nfs[1]);
        if route["version"] == 1 && route["routes_v4"] == 2 {
            assert_eq!(nat["params"]["external"], "198.51.100.1", "{nfs}");
            break;
        }
        assert!(t1.elapsed() < Duration::from_secs(3), "the new table in show nfs: {nfs}");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Refused in one line, nothing applied: nat's ports, the cores, a route file that does not parse.
    let (good_table, bad_table) = ("0.0.0.0/0 1\n10.0.0.0/8 2\n", "0.0.0.0/0 1\n10.0.0.0/8 two\n");
    for (table, ports, cores, why) in [
        (good_table, "2000-2999", 1, "nat: 'ports' is fixed for the run"),
        (good_table, "40000-49999", 2, "'cores' changed from '1' to '2'"),
        (bad_table, "40000-49999", 1, "r.routes:2: port must be 0..=65534"),
    ] {
        // The new pool beside each: refused with the rest.
        std::fs::write(&routes, table).unwrap();
        std::fs::write(&conf, toml("192.0.2.1", ports, cores)).unwrap();
        let (good, _, err) = reload();
        assert!(!good && err.contains(why) && err.trim().lines().count() == 1, "{why}: {err}");
        assert!(err.contains("nothing applied") || err.contains("restart"), "{err}");
    }
    assert_eq!(ctl(&sock, &["show", "nfs"]).1[1]["params"]["external"], "198.51.100.1", "nothing applied");
    assert!(ctl(&sock, &["stop"]).0);
    let out = fp.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["nfs"][1]["details"]["external"], "198.51.100.1", "{}", r["nfs"][1]["details"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 33 item 4: the attribution lists served while a replay runs. The scapy traces of
/// `tests/models/attribution.py` (three inside hosts) loop at a paced rate: through `nat` with a 512-port
/// pool, which holds the model's ports (stable from the first loop on) and refuses the rest on every loop;
/// then through `fsc` with a 512-entry table, which refuses the model's flows past its 512th. `ctl show
/// attribution` lists them summed over the cores; the metrics serve the same as bounded labelled gauges,
/// and the 0.0.4 text passes `promtool check metrics`.
#[test]
fn attribution_is_served_on_the_control_socket_and_as_metrics() {
    const METRICS_ATTR: u16 = 19_731;
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("served-attr{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (sock, pcap) = (dir.join("fp.sock"), dir.join("nat.pcap"));
    let py = ["/usr/bin/python3", "python3"]
        .into_iter()
        .find(|p| Command::new(p).args(["-c", "import scapy.all"]).output().is_ok_and(|o| o.status.success()))
        .expect("a python3 with scapy");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/models/attribution.py");
    let o = Command::new(py).arg(&script).args(["nat", pcap.to_str().unwrap(), "512"]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let model: Value = serde_json::from_slice(&o.stdout).unwrap();
    let held: Vec<(String, u64)> = {
        let mut v: Vec<(String, u64)> =
            model["held"].as_object().unwrap().iter().map(|(k, n)| (k.clone(), n.as_u64().unwrap())).collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v
    };
    let metrics = format!("127.0.0.1:{METRICS_ATTR}");
    let args = [
        "run",
        "--input",
        pcap.to_str().unwrap(),
        "--loops",
        "2000",
        "--rate",
        "20000",
        "--chain",
        "nat(ports=1024-1535)",
        "--table-capacity",
        "4096",
        "--cores",
        "1",
        "--metrics",
        &metrics,
    ];
    let fp = served(&args, &sock);
    // Two loops at least: the pool holds its ports, and every list has rows.
    let t0 = Instant::now();
    let attr = loop {
        let v = ctl(&sock, &["show", "attribution"]).1;
        let ok = v["nfs"].as_array().is_some_and(|l| l.len() == 2) && packets(&sock) > 2 * 879;
        if ok {
            break ctl(&sock, &["show", "attribution"]).1;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "show attribution: {v}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let rows = |v: &Value, k: &str, n: &str| -> Vec<(String, u64)> {
        v.as_array().unwrap().iter().map(|r| (r[k].as_str().unwrap().to_string(), r[n].as_u64().unwrap())).collect()
    };
    let list = |name: &str| attr["nfs"].as_array().unwrap().iter().find(|l| l["list"] == name).unwrap().clone();
    let (by_ports, refused) = (list("top_hosts_by_ports"), list("top_hosts_refused"));
    assert_eq!((by_ports["nf"].as_str(), by_ports["index"].as_u64()), (Some("nat"), Some(0)), "{attr}");
    assert_eq!(rows(&by_ports["rows"], "inside", "ports"), held, "the model's ports held: {attr}");
    let refused = rows(&refused["rows"], "inside", "refused");
    let want_refused: std::collections::BTreeSet<&str> =
        model["refused"].as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(refused.iter().map(|r| r.0.as_str()).collect::<std::collections::BTreeSet<_>>(), want_refused);
    assert_eq!(attr["table_full_sources"], Value::Array(vec![]), "the table has room: {attr}");
    // The metrics: the same lists as labelled gauges (counts only grow meanwhile), promtool-clean.
    let m = scrape_at(METRICS_ATTR);
    let body = m.split("\r\n\r\n").nth(1).unwrap_or("");
    let gauge = |name: &str, labels: &[(&str, &str)]| -> Option<u64> {
        body.lines().find_map(|l| {
            let (series, v) = l.rsplit_once(' ')?;
            let ok = series.starts_with(&format!("{name}{{"))
                && labels.iter().all(|(k, x)| series.contains(&format!("{k}=\"{x}\"")));
            ok.then(|| v.parse::<f64>().ok().map(|f| f as u64)).flatten()
        })
    };
    for (host, n) in &held {
        let got = gauge("flowplane_nf_top", &[("nf", "nat"), ("list", "top_hosts_by_ports"), ("key", host)]);
        assert_eq!(got, Some(*n), "{host}: {body}");
    }
    for (host, n) in &refused {
        let got = gauge("flowplane_nf_top", &[("list", "top_hosts_refused"), ("key", host)]).unwrap();
        assert!(got >= *n, "{host}: {got} < {n}");
    }
    let series = body.lines().filter(|l| l.starts_with("flowplane_nf_top{")).count();
    assert!(series <= 2 * 10, "bounded: {series}");
    let mut c = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (apt-get install prometheus)");
    c.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
    let o = c.wait_with_output().unwrap();
    assert!(
        o.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(ctl(&sock, &["stop"]).0);
    let out = fp.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // The flow table's attribution: fsc with room for 512 of the trace's flows.
    let full_pcap = dir.join("full.pcap");
    let o = Command::new(py).arg(&script).args(["full", full_pcap.to_str().unwrap(), "512"]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let model: Value = serde_json::from_slice(&o.stdout).unwrap();
    let args = ["run", "--input", full_pcap.to_str().unwrap(), "--loops", "2000", "--rate", "20000", "--chain", "fsc"];
    let fp = served(&[&args[..], &["--table-capacity", "512", "--cores", "1", "--metrics", &metrics]].concat(), &sock);
    let t0 = Instant::now();
    let full = loop {
        let v = ctl(&sock, &["show", "attribution"]).1;
        if v["table_full_sources"].as_array().is_some_and(|r| r.len() == 3) {
            break rows(&v["table_full_sources"], "src", "packets");
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "show attribution: {v}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let want: std::collections::BTreeSet<&str> =
        model["refused"].as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(full.iter().map(|r| r.0.as_str()).collect::<std::collections::BTreeSet<_>>(), want);
    let m = scrape_at(METRICS_ATTR);
    let body = m.split("\r\n\r\n").nth(1).unwrap_or("");
    for (src, n) in &full {
        let line =
            body.lines().find(|l| l.starts_with(&format!("flowplane_table_full_source_packets{{src=\"{src}\"}}")));
        let got = line.and_then(|l| l.rsplit_once(' ')).and_then(|(_, v)| v.parse::<f64>().ok()).unwrap_or(0.0);
        assert!(got as u64 >= *n, "{src}: {body}");
    }
    assert!(ctl(&sock, &["stop"]).0);
    let out = fp.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_dir_all(&dir);
}

fn scrape_at(port: u16) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("metrics endpoint");
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut t = String::new();
    s.read_to_string(&mut t).unwrap();
    t
}

/// Issue 36, item 2: the remote and the flows of the replication tests: `FLOWS` inside hosts each send one
/// UDP datagram to `REMOTE:53` through `nat(ports=1024-1535)`.
const REPL_FLOWS: usize = 300;
const REPL_NAT: &str = "nat(ports=1024-1535)";

/// Writes, with scapy, the active instance's trace (`REPL_FLOWS` outbound flows, 1 ms apart) and the
/// standby's (`filler` transit packets 1 ms apart, then a reply from the remote to every port of the pool,
/// 203.0.113.1:1024..=1535, in port order).
fn repl_traces(dir: &Path, filler: usize) -> (PathBuf, PathBuf) {
    let (a, b) = (dir.join("a.pcap"), dir.join("b.pcap"));
    let py = format!(
        r#"
from scapy.all import Ether, IP, UDP, Raw, wrpcap
e = dict(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
a = []
for i in range({flows}):
    p = Ether(**e)/IP(src="10.0.%d.%d" % (i // 250, i % 250 + 1), dst="198.51.100.7")/UDP(sport=1000 + i, dport=53)/Raw(b"q" * 16)
    p.time = 1.0 + i * 0.001
    a.append(p)
wrpcap("{a}", a)
b = []
for i in range({filler}):
    p = Ether(**e)/IP(src="192.0.2.1", dst="192.0.2.2")/UDP(sport=7, dport=7)/Raw(b"f" * 16)
    p.time = 1.0 + i * 0.001
    b.append(p)
for k, port in enumerate(range(1024, 1536)):
    p = Ether(**e)/IP(src="198.51.100.7", dst="203.0.113.1")/UDP(sport=53, dport=port)/Raw(b"r" * 16)
    p.time = 1.0 + ({filler} + k) * 0.001
    b.append(p)
wrpcap("{b}", b)
"#,
        flows = REPL_FLOWS,
        a = a.display(),
        b = b.display(),
    );
    let o = Command::new("/usr/bin/python3").arg("-c").arg(py).output().expect("python3");
    assert!(o.status.success(), "scapy: {}", String::from_utf8_lossy(&o.stderr));
    (a, b)
}

/// A nat export's outbound rows: (inside address, inside port, remote, remote port, translated address, port).
fn nat_out_rows(path: &Path) -> Vec<(String, u64, String, u64, String, u64)> {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut rows: Vec<_> = v
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["direction"] == "out")
        .map(|r| {
            let t = |k: &str| r[k].as_str().unwrap().to_string();
            let n = |k: &str| r[k].as_u64().unwrap();
            (t("src"), n("sport"), t("dst"), n("dport"), t("translated_addr"), n("translated_port"))
        })
        .collect();
    rows.sort();
    rows
}

/// (source, source port, destination, destination port) of every IPv4/UDP frame of a classic pcap.
fn pcap_udp(path: &Path) -> Vec<([u8; 4], u16, [u8; 4], u16)> {
    let d = std::fs::read(path).unwrap();
    let le = |o: usize| u32::from_le_bytes(d[o..o + 4].try_into().unwrap()) as usize;
    let be = |o: usize| u16::from_be_bytes([d[o], d[o + 1]]);
    let (mut out, mut off) = (Vec::new(), 24);
    while off + 16 <= d.len() {
        let (len, f) = (le(off + 8), off + 16);
        if len >= 42 && d[f + 12..f + 14] == [8, 0] && d[f + 23] == 17 {
            let l4 = f + 14 + usize::from(d[f + 14] & 15) * 4;
            out.push((
                d[f + 26..f + 30].try_into().unwrap(),
                be(l4),
                d[f + 30..f + 34].try_into().unwrap(),
                be(l4 + 2),
            ));
        }
        off += 16 + len;
    }
    out
}

/// Runs the standby (B) on its trace and the active instance (A) once B is up, A's updates going to
/// `a_to` (B, or a proxy in front of it); returns (A's report, B's report, A's nat export, B's nat export,
/// B's output pcap, B's metrics once A ended when `metrics` names B's metrics port).
#[allow(clippy::type_complexity)]
fn repl_pair(
    dir: &Path,
    b_listen: &str,
    a_to: &str,
    a_listen: Option<&str>,
    metrics: Option<u16>,
) -> (Value, Value, PathBuf, PathBuf, PathBuf, String) {
    let (ta, tb) = repl_traces(dir, 3000);
    let (ea, eb, ob, sock) = (dir.join("a.json"), dir.join("b.json"), dir.join("b-out.pcap"), dir.join("b.sock"));
    let mut b_args = vec![
        "run".to_string(),
        "--chain".into(),
        REPL_NAT.into(),
        "--input".into(),
        tb.display().to_string(),
        "--rate".into(),
        "1000".into(),
        "--cores".into(),
        "1".into(),
        "--table-capacity".into(),
        "4096".into(),
        "--output".into(),
        ob.display().to_string(),
        "--export".into(),
        format!("nat={}", eb.display()),
        "--replicate-listen".into(),
        format!("udp:{b_listen}"),
        "--replicate-role".into(),
        "standby".into(),
    ];
    if let Some(al) = a_listen {
        // Resync requests go straight to A (its updates come through the proxy).
        b_args.extend(["--replicate".into(), format!("udp:{al}")]);
    }
    if let Some(m) = metrics {
        b_args.extend(["--metrics".into(), format!("127.0.0.1:{m}")]);
    }
    let b = served(&b_args.iter().map(String::as_str).collect::<Vec<_>>(), &sock);
    let mut a_args = vec![
        "run".to_string(),
        "--chain".into(),
        REPL_NAT.into(),
        "--input".into(),
        ta.display().to_string(),
        "--rate".into(),
        "1000".into(),
        "--cores".into(),
        "1".into(),
        "--table-capacity".into(),
        "4096".into(),
        "--no-pin".into(),
        "--json".into(),
        "--export".into(),
        format!("nat={}", ea.display()),
        "--replicate".into(),
        format!("udp:{a_to}"),
    ];
    if let Some(al) = a_listen {
        a_args.extend(["--replicate-listen".into(), format!("udp:{al}")]);
    }
    let a = Command::new(BIN).args(&a_args).output().unwrap();
    assert!(a.status.success(), "A: {}", String::from_utf8_lossy(&a.stderr));
    // B is still in its filler (3 s): the replies come after A's whole trace was replicated.
    // What B imported shows in its metrics while it runs (the worker imports between batches: wait for it).
    let mut text = String::new();
    if let Some(m) = metrics {
        let t0 = Instant::now();
        while !text.contains(&format!("flowplane_replication_records_total{{event=\"imported\"}} {REPL_FLOWS}")) {
            assert!(t0.elapsed() < Duration::from_secs(2), "B's metrics: {text}");
            std::thread::sleep(Duration::from_millis(20));
            let mut c = std::net::TcpStream::connect(("127.0.0.1", m)).expect("metrics endpoint");
            c.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
            text.clear();
            c.read_to_string(&mut text).unwrap();
        }
    }
    let seen = packets(&sock);
    assert!(
        seen < 3000,
        "the standby passed its filler ({seen} packets) before the active instance ended: machine too slow"
    );
    let out = b.wait_with_output().unwrap();
    assert!(out.status.success(), "B: {}", String::from_utf8_lossy(&out.stderr));
    let ra: Value = serde_json::from_slice(&a.stdout).unwrap();
    let rb: Value = serde_json::from_slice(&out.stdout).unwrap();
    (ra, rb, ea, eb, ob, text)
}

/// Checks that B holds A's mappings and translates the replies by them: B's exported outbound rows equal
/// A's (the same inside flow on the same external port), and the replies B let through are exactly those to
/// A's ports, each sent to the inside endpoint A's export names for its port (replies to other ports
/// dropped as unmapped).
fn check_standby_follows(ea: &Path, eb: &Path, ob: &Path, rb: &Value) {
    let (a, b) = (nat_out_rows(ea), nat_out_rows(eb));
    assert_eq!(a.len(), REPL_FLOWS, "A's mappings");
    assert_eq!(a, b, "B's exported mappings differ from A's");
    let mut by_port: Vec<_> = a.iter().map(|r| (r.5, (r.0.clone(), r.1))).collect();
    by_port.sort();
    let want: Vec<(String, u64)> = by_port.into_iter().map(|(_, e)| e).collect();
    let got: Vec<(String, u64)> = pcap_udp(ob)
        .into_iter()
        .filter(|&(s, sp, _, _)| s == [198, 51, 100, 7] && sp == 53)
        .map(|(_, _, d, dp)| (std::net::Ipv4Addr::from(d).to_string(), u64::from(dp)))
        .collect();
    assert_eq!(got, want, "replies through B");
    let nat = &rb["nfs"][0]["details"];
    assert_eq!(nat["dropped_unmapped"].as_u64(), Some(512 - REPL_FLOWS as u64), "{nat}");
    assert_eq!(nat["mappings_created"].as_u64(), Some(0), "B made no mapping of its own: {nat}");
}

/// Two instances on loopback UDP: A runs nat on a paced replay and replicates to B (standby, on a paced
/// filler); B's nat export then equals A's mappings and B translates the replies as A would have.
#[test]
fn a_standby_imports_the_active_nat_mappings_and_translates_their_replies() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("repl-plain{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (ra, rb, ea, eb, ob, metrics) = repl_pair(&dir, "127.0.0.1:19771", "127.0.0.1:19771", None, Some(19_771));
    for m in
        ["flowplane_replication_lost_datagrams_total{from=\"peer\"} 0", "flowplane_replication_lag_p99_microseconds "]
    {
        assert!(metrics.contains(m), "{m}: {metrics}");
    }
    let (a, b) = (&ra["replication"], &rb["replication"]);
    assert_eq!(a["sent_records"].as_u64(), Some(REPL_FLOWS as u64), "{a}");
    assert_eq!(a["queue_lost"].as_u64(), Some(0), "{a}");
    assert_eq!(
        (b["received_records"].as_u64(), b["lost_datagrams"].as_u64()),
        (Some(REPL_FLOWS as u64), Some(0)),
        "{b}"
    );
    assert_eq!((b["imported"].as_u64(), b["refused"].as_u64()), (Some(REPL_FLOWS as u64), Some(0)), "{b}");
    assert!(b["lag_p99_us"].as_u64().is_some_and(|l| l < 2_000_000), "{b}");
    check_standby_follows(&ea, &eb, &ob, &rb);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The same through a proxy that drops the 3rd and 5th of A's datagrams with records: B counts the gap (2 lost), asks A for a
/// resync (straight to A's listening address), A's workers send every mapping again, and B ends with A's
/// mappings all the same.
#[test]
fn lost_replication_datagrams_are_counted_and_a_resync_repairs_them() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("repl-loss{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let proxy = std::net::UdpSocket::bind("127.0.0.1:19774").unwrap();
    proxy.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (d2, p2) = (std::sync::Arc::clone(&done), proxy.try_clone().unwrap());
    let fwd = std::thread::spawn(move || {
        let (mut n, mut dropped, mut buf) = (0u64, 0u64, [0u8; 2048]);
        while !d2.load(std::sync::atomic::Ordering::Relaxed) {
            let Ok((len, _)) = p2.recv_from(&mut buf) else { continue };
            // Datagrams with records (header bytes 24..26: their count), not heartbeats.
            n += u64::from(len > 26 && buf[24..26] != [0, 0]);
            if (n == 3 || n == 5) && buf[24..26] != [0, 0] {
                dropped += 1;
                continue;
            }
            let _ = p2.send_to(&buf[..len], "127.0.0.1:19772");
        }
        dropped
    });
    let (ra, rb, ea, eb, ob, _) = repl_pair(&dir, "127.0.0.1:19772", "127.0.0.1:19774", Some("127.0.0.1:19773"), None);
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(fwd.join().unwrap(), 2);
    let (a, b) = (&ra["replication"], &rb["replication"]);
    assert_eq!(b["lost_datagrams"].as_u64(), Some(2), "{b}");
    assert!(b["resyncs_requested"].as_u64() >= Some(1) && a["resyncs_served"].as_u64() >= Some(1), "{a} {b}");
    // The resync sent every mapping again: more records than flows.
    assert!(a["sent_records"].as_u64() > Some(REPL_FLOWS as u64), "{a}");
    check_standby_follows(&ea, &eb, &ob, &rb);
    let _ = std::fs::remove_dir_all(&dir);
}
