//! The control socket of a live run on two cores (issue 31, targets), as
//! root on a 2-queue veth the test makes, 2 workers (the kernel's fanout
//! spreads the flows over them):
//!
//! - An ACL swap under sequence-numbered traffic (scapy: 16 UDP flows, the
//!   odd ones to dport 5002, the even ones to 5001, payload `seq=NNNNNN`):
//!   the old rules drop 5001, the new ones drop 5002, so every packet's fate
//!   in the output (tshark reads it) says which rule set judged it. Per
//!   core (a flow's core is where `show flow` finds its state), its packets
//!   in the order sent are judged old up to one switch point and new after
//!   it — no packet judged by a mixed rule set, none lost — and the two
//!   cores' switch points are close (the change reached both between two
//!   batches while `ctl load` waited for their answers). fsc's 16 flows keep
//!   their state across the swap.
//! - `show runtime`, `show nfs`, `show tables` and `show errors` read once
//!   the traffic is over agree with the final JSON report after `ctl stop`,
//!   exactly, per core where the report has per-core figures (show runtime's
//!   rows: packets, cycles and busy cycles per packet, mpps, batches, vectors
//!   per call, busy seconds — every field of the report's `per_core` row).
//! - A `set` (ddos's threshold) under sequence-numbered traffic: per core one
//!   switch point, every packet after it judged by the new value, each core
//!   switching within one batch of the `ctl set` request and reply.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

mod ports_common;

use ports_common::{ctl, ctl_ok, tshark_rows, wait_ready, Proc, Veth};

const FLOWS: usize = 16;

/// Packet i's flow: sport 4000 + i % 16, dport 5001 + i % 2 (one dport per flow).
fn flow(i: usize) -> (u16, u16) {
    (4000 + (i % FLOWS) as u16, 5001 + (i % 2) as u16)
}

/// Sends `n` packets on `iface`, about `gap` seconds apart (scapy), payload `seq=NNNNNN`.
fn send(iface: &str, n: usize, gap: f64) -> std::process::Child {
    let script = format!(
        "from scapy.all import Ether, IP, UDP, Raw, sendp\n\
         pk=[Ether(src='02:00:00:00:00:01',dst='02:00:00:00:00:02')/IP(src='10.0.0.1',dst='10.0.0.2')/\
         UDP(sport=4000+i%{FLOWS},dport=5001+i%2)/Raw(b'seq=%06d' % i) for i in range({n})]\n\
         sendp(pk, iface='{iface}', inter={gap}, verbose=False)\n"
    );
    Command::new("/usr/bin/python3").args(["-c", &script]).spawn().expect("python3 with scapy")
}

fn total(rt: &Value, key: &str) -> u64 {
    rt["cores"].as_array().unwrap().iter().map(|c| c[key].as_u64().unwrap()).sum()
}

#[test]
fn an_acl_swap_on_two_cores_switches_each_core_once_and_show_runtime_agrees_with_the_report() {
    let v = Veth::with_queues("ca", 2);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("ctl2-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (sock, out, old, new) =
        (dir.join("fp.sock"), dir.join("out.pcap"), dir.join("old.rules"), dir.join("new.rules"));
    std::fs::write(&old, "drop proto udp dport 5001\n").unwrap();
    std::fs::write(&new, "drop proto udp dport 5002\n").unwrap();
    let chain = format!("acl(rules={}) -> fsc", old.display());
    let mut fp = Proc::spawn(&[
        "run",
        "--input",
        &format!("afpacket:{}", v.0),
        "--output",
        out.to_str().unwrap(),
        "--chain",
        &chain,
        "--cores",
        "2",
        "--no-pin",
        "--ctl",
        sock.to_str().unwrap(),
        "--json",
    ]);
    wait_ready(&sock, &mut fp);

    let n = 1200;
    let mut sender = send(&v.peer(), n, 0.002);
    let t1 = Instant::now();
    while total(&ctl_ok(&sock, &["show", "runtime"]), "packets") < (n as u64) * 2 / 5 {
        assert!(t1.elapsed() < Duration::from_secs(30), "traffic did not arrive");
        std::thread::sleep(Duration::from_millis(10));
    }
    let swap = ctl_ok(&sock, &["load", "acl", new.to_str().unwrap()]);
    assert_eq!(swap["cores"], 2, "{swap}");
    assert!(sender.wait().unwrap().success(), "scapy sender");

    // The traffic is over: wait until every packet is counted, then one more publication (twice a second).
    let t2 = Instant::now();
    while total(&ctl_ok(&sock, &["show", "runtime"]), "packets") < n as u64 {
        assert!(t2.elapsed() < Duration::from_secs(10), "{}", ctl_ok(&sock, &["show", "runtime"]));
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(1200));
    let (rt, nfs, tables, errs) = (
        ctl_ok(&sock, &["show", "runtime"]),
        ctl_ok(&sock, &["show", "nfs"]),
        ctl_ok(&sock, &["show", "tables"]),
        ctl_ok(&sock, &["show", "errors"]),
    );
    // Each flow's core: where fsc keeps its state.
    let core_of: Vec<u64> = (0..FLOWS)
        .map(|s| {
            let (sport, dport) = flow(s);
            let rows =
                ctl_ok(&sock, &["show", "flow", "udp", "10.0.0.1", &sport.to_string(), "10.0.0.2", &dport.to_string()]);
            let cores: Vec<u64> = rows
                .as_array()
                .unwrap()
                .iter()
                .filter(|r| r["nf"] == "fsc")
                .map(|r| r["core"].as_u64().unwrap())
                .collect();
            assert_eq!(cores.len(), 1, "flow {s} on one core: {rows}");
            cores[0]
        })
        .collect();
    assert!(ctl(&sock, &["stop"]).0);
    let done = fp.signal_and_wait("-0");
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    let report: Value = serde_json::from_slice(&done.stdout).expect("JSON report");

    // show runtime/nfs/tables/errors agree with the report exactly.
    let cores = rt["cores"].as_array().unwrap();
    assert_eq!(cores.len(), 2);
    for c in cores {
        let i = c["core"].as_u64().unwrap() as usize;
        let pc = &report["per_core"][i];
        // Every figure of the report's row, cycles, batches and vectors per call included, from the same counts.
        let keys: Vec<&String> = pc.as_object().unwrap().keys().collect();
        for k in ["packets", "mpps", "cycles_per_packet", "batches", "vectors_per_call", "busy_cycles", "busy_s"] {
            assert!(keys.iter().any(|x| *x == k), "the report's per-core row has {k}: {pc}");
        }
        for k in keys {
            assert_eq!(c[k], pc[k], "core {i}, {k}: show runtime {c} vs report {pc}");
        }
        assert!(c["busy_cycles"].as_u64().unwrap() > 0 && c["vectors_per_call"].as_f64().unwrap() >= 1.0, "{c}");
    }
    assert_eq!(total(&rt, "packets"), report["packets"].as_u64().unwrap(), "{rt}");
    assert_eq!(report["packets"].as_u64(), Some(n as u64));
    assert_eq!(total(&rt, "packets_out"), report["packets_out"].as_u64().unwrap(), "{rt}");
    assert_eq!(total(&rt, "batches"), report["latency"]["batches"].as_u64().unwrap(), "{rt}");
    for (i, nf) in nfs.as_array().unwrap().iter().enumerate() {
        let r = &report["nfs"][i];
        assert_eq!(nf["nf"], r["name"]);
        for k in ["packets_in", "packets_out", "dropped"] {
            assert_eq!(nf[k], r[k], "{k} of {}: {nf} vs {r}", nf["nf"]);
        }
        assert_eq!(errs["nfs"][i]["dropped"], r["dropped"], "{errs}");
    }
    for k in ["flows", "insertions", "expiries", "table_full"] {
        let sum: u64 = tables.as_array().unwrap().iter().map(|c| c[k].as_u64().unwrap()).sum();
        assert_eq!(Some(sum), report["tables"][k].as_u64(), "{k}: {tables} vs {}", report["tables"]);
    }
    // No flow lost its state across the swap: fsc's 16 flows, created once each.
    assert_eq!(report["tables"]["flows"].as_u64(), Some(FLOWS as u64), "{}", report["tables"]);
    assert_eq!(report["tables"]["insertions"].as_u64(), Some(FLOWS as u64), "{}", report["tables"]);

    // What passed (tshark reads it): each packet's fate says which rule set judged it.
    let passed: std::collections::HashSet<usize> = tshark_rows(&out, &["data.data"])
        .iter()
        .map(|r| {
            let text: String =
                (0..r[0].len() / 2).map(|i| u8::from_str_radix(&r[0][2 * i..2 * i + 2], 16).unwrap() as char).collect();
            text.trim_start_matches("seq=").parse().unwrap()
        })
        .collect();
    assert_eq!(passed.len() as u64, report["packets_out"].as_u64().unwrap());
    let mut switch = Vec::new();
    for c in 0..2u64 {
        // This core's packets in the order sent: old rules pass 5002, new rules pass 5001.
        let judged: Vec<(usize, bool)> = (0..n)
            .filter(|&i| core_of[i % FLOWS] == c)
            .map(|i| (i, passed.contains(&i) == (flow(i).1 == 5001)))
            .collect();
        let first_new = judged.iter().position(|&(_, new)| new).unwrap_or(judged.len());
        let mixed: Vec<usize> = judged[first_new..].iter().filter(|(_, new)| !new).map(|(i, _)| *i).collect();
        assert!(mixed.is_empty(), "core {c}: packets judged by the old rules after its switch: {mixed:?}");
        assert!(
            first_new > 0 && first_new < judged.len(),
            "core {c}: the swap landed mid-traffic ({first_new} of {} judged old)",
            judged.len()
        );
        switch.push(judged[first_new].0);
    }
    // Both cores took the new rules close together (one batch boundary each, while `ctl load` waited
    // for both): packets were sent 2 ms apart, so 100 packets is 200 ms (room for a descheduled worker).
    assert!(switch[0].abs_diff(switch[1]) < 100, "switch points per core (packet sent): {switch:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Seconds since the epoch (the clock Python's `time.time()` reads).
fn wall() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64()
}

/// A `set` (a parameter, not a rules swap) on two cores: `ddos` starts with a threshold no source reaches
/// (every packet passes) and `ctl set ddos threshold 3` lowers it mid-traffic. 1200 sequence-numbered
/// packets from 16 sources (one UDP flow each), 2 ms apart; the sender logs each packet's send time.
/// The documented rule is the oracle: a source's k-th packet in the window passes iff k <= threshold, so
/// the new value drops every later packet of a source that already sent 3. Per core (a source's core is
/// where fsc keeps its flow's state): one switch point, every packet before it passed (old value), every
/// one after it judged by the new value; no packet sent before `ctl set` was asked beyond one batch judged
/// new, none sent after its reply beyond one batch judged old.
#[test]
fn a_set_on_two_cores_switches_each_core_once_within_a_batch_of_the_reply() {
    let v = Veth::with_queues("ka", 2);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("ctl2set-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (sock, out, log) = (dir.join("fp.sock"), dir.join("out.pcap"), dir.join("sent.txt"));
    let mut fp = Proc::spawn(&[
        "run",
        "--input",
        &format!("afpacket:{}", v.0),
        "--output",
        out.to_str().unwrap(),
        "--chain",
        "ddos(threshold=1000000000,window=86400) -> fsc",
        "--cores",
        "2",
        "--no-pin",
        "--ctl",
        sock.to_str().unwrap(),
        "--json",
    ]);
    wait_ready(&sock, &mut fp);
    let (n, sources) = (1200usize, 16usize);
    let script = format!(
        "import time\nfrom scapy.all import Ether, IP, UDP, Raw, conf\n\
         s=conf.L2socket(iface='{iface}')\n\
         pk=[bytes(Ether(src='02:00:00:00:00:01',dst='02:00:00:00:00:02')/IP(src='10.0.1.%d' % (1+i%{sources}),\
         dst='10.0.0.2')/UDP(sport=4000+i%{sources},dport=5001)/Raw(b'seq=%06d' % i)) for i in range({n})]\n\
         t=[]\nfor p in pk:\n    s.send(p)\n    t.append(time.time())\n    time.sleep(0.002)\n\
         open('{log}','w').write('\\n'.join('%.6f' % x for x in t))\n",
        iface = v.peer(),
        log = log.display()
    );
    let mut sender = Command::new("/usr/bin/python3").args(["-c", &script]).spawn().expect("python3 with scapy");
    let t1 = Instant::now();
    while total(&ctl_ok(&sock, &["show", "runtime"]), "packets") < (n as u64) * 2 / 5 {
        assert!(t1.elapsed() < Duration::from_secs(30), "traffic did not arrive");
        std::thread::sleep(Duration::from_millis(10));
    }
    let asked = wall();
    let set = ctl_ok(&sock, &["set", "ddos", "threshold", "3"]);
    let replied = wall();
    assert_eq!((set["cores"].as_u64(), set["value"].as_str()), (Some(2), Some("3")), "{set}");
    assert!(sender.wait().unwrap().success(), "scapy sender");
    let t2 = Instant::now();
    while total(&ctl_ok(&sock, &["show", "runtime"]), "packets") < n as u64 {
        assert!(t2.elapsed() < Duration::from_secs(10), "{}", ctl_ok(&sock, &["show", "runtime"]));
        std::thread::sleep(Duration::from_millis(50));
    }
    let core_of: Vec<u64> = (0..sources)
        .map(|s| {
            let (src, sport) = (format!("10.0.1.{}", 1 + s), (4000 + s).to_string());
            let rows = ctl_ok(&sock, &["show", "flow", "udp", &src, &sport, "10.0.0.2", "5001"]);
            let cores: Vec<u64> = rows
                .as_array()
                .unwrap()
                .iter()
                .filter(|r| r["nf"] == "fsc")
                .map(|r| r["core"].as_u64().unwrap())
                .collect();
            assert_eq!(cores.len(), 1, "source {s} on one core: {rows}");
            cores[0]
        })
        .collect();
    assert!(ctl(&sock, &["stop"]).0);
    let done = fp.signal_and_wait("-0");
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    let report: Value = serde_json::from_slice(&done.stdout).expect("JSON report");
    assert_eq!(report["packets"].as_u64(), Some(n as u64));
    assert_eq!(report["nfs"][0]["details"]["threshold"], 3, "{}", report["nfs"][0]["details"]);
    let batch = report["batch"].as_u64().unwrap() as usize;
    let sent: Vec<f64> = std::fs::read_to_string(&log).unwrap().lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(sent.len(), n);

    let passed: std::collections::HashSet<usize> = tshark_rows(&out, &["data.data"])
        .iter()
        .map(|r| {
            let text: String =
                (0..r[0].len() / 2).map(|i| u8::from_str_radix(&r[0][2 * i..2 * i + 2], 16).unwrap() as char).collect();
            text.trim_start_matches("seq=").parse().unwrap()
        })
        .collect();
    for c in 0..2u64 {
        // This core's packets in the order sent: (seq, passed, what the new threshold says: k-th of its source <= 3).
        let judged: Vec<(usize, bool, bool)> =
            (0..n).filter(|&i| core_of[i % sources] == c).map(|i| (i, passed.contains(&i), i / sources < 3)).collect();
        let switch = judged.iter().position(|&(_, p, _)| !p).unwrap_or(judged.len());
        assert!(switch > 0 && switch < judged.len(), "core {c}: the change landed mid-traffic ({switch} judged old)");
        let wrong: Vec<usize> = judged[switch..].iter().filter(|(_, p, new)| p != new).map(|j| j.0).collect();
        assert!(wrong.is_empty(), "core {c}: packets after its switch not judged by the new threshold: {wrong:?}");
        // Judged new though sent before `set` was asked (queued when the change landed), or old though sent
        // after its reply: at most one batch's worth each.
        let early = judged[switch..].iter().filter(|j| sent[j.0] < asked).count();
        let late = judged[..switch].iter().filter(|j| sent[j.0] > replied).count();
        assert!(
            early <= batch && late <= batch,
            "core {c}: switched at packet {} (sent {:.3} s after the request; reply after {:.3} s): {early} judged new \
             before the request, {late} judged old after the reply",
            judged[switch].0,
            sent[judged[switch].0] - asked,
            replied - asked
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
