//! The control socket of a live run (issue 31), as root on a veth pair made
//! by the test: every `flowplane ctl` command round trip, an ACL rule swap
//! under traffic (tshark reads what passed: one switch point, every flow
//! judged again by the new rules, nothing judged by a mix), a run-time
//! parameter change, a mid-run export, a peer of another user refused, and
//! `stop` ending the run with its report.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

mod ports_common;

use ports_common::{ctl, ctl_ok, tshark_rows, wait_ready, Proc, Veth};

/// `ctl` that must succeed: its answer.
fn ok(sock: &Path, words: &[&str]) -> serde_json::Value {
    ctl_ok(sock, words)
}

/// Sends `n` UDP packets on `iface` alternating destination ports 5001 and
/// 5002 (one flow each), payload `seq=NNNNNN`, about `gap` seconds apart (scapy).
fn send(iface: &str, n: usize, gap: f64) -> std::process::Child {
    let script = format!(
        "from scapy.all import Ether, IP, UDP, Raw, sendp\n\
         pk=[Ether(src='02:00:00:00:00:01',dst='02:00:00:00:00:02')/IP(src='10.0.0.1',dst='10.0.0.2')/\
         UDP(sport=4000,dport=5001+i%2)/Raw(b'seq=%06d' % i) for i in range({n})]\n\
         sendp(pk, iface='{iface}', inter={gap}, verbose=False)\n"
    );
    Command::new("/usr/bin/python3").args(["-c", &script]).spawn().expect("python3 with scapy")
}

#[test]
fn ctl_commands_round_trip_and_an_acl_swap_under_traffic_lands_at_one_batch() {
    let v = Veth::new("c");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("ctl{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (sock, out, rules) = (dir.join("fp.sock"), dir.join("out.pcap"), dir.join("new.rules"));
    let old_rules = dir.join("old.rules");
    std::fs::write(&old_rules, "drop proto udp dport 5001\n").unwrap();
    std::fs::write(&rules, "# the swap: 5002 dropped from now on, 5001 passes\ndrop proto udp dport 5002\n").unwrap();
    let chain = format!("acl(rules={}) -> ddos(threshold=1000000)", old_rules.display());
    let mut fp = Proc::spawn(&[
        "run",
        "--input",
        &format!("afpacket:{}", v.0),
        "--output",
        out.to_str().unwrap(),
        "--chain",
        &chain,
        "--cores",
        "1",
        "--no-pin",
        "--ctl",
        sock.to_str().unwrap(),
        "--json",
    ]);
    wait_ready(&sock, &mut fp);
    let mode = std::fs::metadata(&sock).map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions())).unwrap();
    assert_eq!(mode & 0o777, 0o600, "socket mode");

    // Traffic, and the swap in its middle.
    let n = 1200;
    let mut sender = send(&v.peer(), n, 0.002);
    // The swap when about 40% of the packets have arrived (scapy's start-up time varies).
    let t1 = Instant::now();
    while ok(&sock, &["show", "runtime"])["cores"][0]["packets"].as_u64().unwrap_or(0) < (n as u64) * 2 / 5 {
        assert!(t1.elapsed() < Duration::from_secs(30), "traffic did not arrive");
        std::thread::sleep(Duration::from_millis(10));
    }
    let swap = ok(&sock, &["load", "acl", rules.to_str().unwrap()]);
    assert_eq!(swap["cores"], 1, "{swap}");
    assert!(sender.wait().unwrap().success(), "scapy sender");
    std::thread::sleep(Duration::from_millis(700));

    // Every read command answers, with figures that agree.
    let rt = ok(&sock, &["show", "runtime"]);
    assert_eq!(rt["cores"][0]["packets"].as_u64(), Some(n as u64), "{rt}");
    assert!(rt["cores"][0]["batches"].as_u64().unwrap() >= 1, "{rt}");
    let nfs = ok(&sock, &["show", "nfs"]);
    assert_eq!(nfs[0]["nf"], "acl");
    assert!(nfs[0]["params"]["rules"].as_str().unwrap().ends_with("new.rules"), "{nfs}");
    assert_eq!(nfs[0]["packets_in"].as_u64(), Some(n as u64), "{nfs}");
    let dropped = nfs[0]["dropped"].as_u64().unwrap();
    let errs = ok(&sock, &["show", "errors"]);
    assert_eq!(errs["nfs"][0]["dropped"].as_u64(), Some(dropped), "{errs}");
    let tables = ok(&sock, &["show", "tables"]);
    assert!(tables[0]["flows"].as_u64().unwrap() >= 2, "{tables}");
    let ports = ok(&sock, &["show", "ports"]);
    assert_eq!(ports[0]["rx_packets"].as_u64(), Some(n as u64), "{ports}");
    assert!(ok(&sock, &["help"]).as_str().unwrap().contains("set NF PARAM VALUE"));

    // One flow's state in each NF (acl's verdict per flow, ddos's per source), and a source's alone.
    let flow = ok(&sock, &["show", "flow", "udp", "10.0.0.1", "4000", "10.0.0.2", "5002"]);
    let nfs_of = |v: &serde_json::Value| -> Vec<String> {
        v.as_array().unwrap().iter().map(|r| r["nf"].as_str().unwrap().to_string()).collect()
    };
    assert_eq!(nfs_of(&flow), ["acl", "ddos"], "{flow}");
    assert_eq!(flow[1]["state"]["src"], "10.0.0.1", "{flow}");
    let src = ok(&sock, &["show", "flow", "10.0.0.1"]);
    assert_eq!(nfs_of(&src), ["ddos"], "{src}");
    assert_eq!(ok(&sock, &["show", "flow", "udp", "10.9.9.9", "1", "10.0.0.2", "2"]), serde_json::json!([]));
    let (good, _, err) = ctl(&sock, &["show", "flow", "udp", "nope"]);
    assert!(!good && err.contains("show flow PROTO SRC SPORT DST DPORT"), "{err}");

    // A run-time parameter; refusals are one line and change nothing.
    let set = ok(&sock, &["set", "ddos", "threshold", "5"]);
    assert_eq!(set["value"], "5", "{set}");
    assert_eq!(ok(&sock, &["show", "nfs"])[1]["params"]["threshold"], "5");
    for (words, why) in [
        (&["set", "ddos", "bogus", "1"][..], "unknown parameter 'bogus'"),
        (&["set", "ddos", "threshold", "0"][..], "threshold"),
        (&["set", "nat", "pool", "x"][..], "no NF 'nat'"),
        (&["load", "ddos", "/etc/hostname"][..], "reads no file"),
        (&["frobnicate"][..], "unknown command"),
    ] {
        let (good, _, err) = ctl(&sock, words);
        assert!(!good && err.contains(why) && err.lines().count() == 1, "{words:?}: {err}");
    }
    assert_eq!(ok(&sock, &["show", "nfs"])[1]["params"]["threshold"], "5");

    // A mid-run export of ddos's per-source state.
    let exp = dir.join("ddos.json");
    let e = ok(&sock, &["export", "ddos", exp.to_str().unwrap()]);
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&std::fs::read(&exp).unwrap()).unwrap();
    assert_eq!(e["rows"].as_u64(), Some(rows.len() as u64));
    assert_eq!(
        rows.len(),
        1,
        "one source: {rows:?} {} {}",
        ok(&sock, &["show", "tables"]),
        ok(&sock, &["show", "nfs"])
    );

    // Another user's peer is closed unanswered, even with the socket opened to everyone.
    std::fs::set_permissions(&sock, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    let other = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c"])
        .arg(format!(
            "import socket,sys\ns=socket.socket(socket.AF_UNIX)\ns.connect('{}')\ntry:\n  s.sendall(b'[\"stop\"]\\n')\n  a=s.recv(100)\nexcept ConnectionError:\n  a=b''\nsys.stdout.write(repr(a))",
            sock.display()
        ))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&other.stdout), "b''", "{}", String::from_utf8_lossy(&other.stderr));
    assert!(fp.running(), "a stranger's stop was obeyed");

    let (good, _, err) = ctl(&sock, &["stop"]);
    assert!(good, "{err}");
    let t1 = Instant::now();
    while fp.running() {
        assert!(t1.elapsed() < Duration::from_secs(10), "stop did not end the run");
        std::thread::sleep(Duration::from_millis(50));
    }
    let done = fp.signal_and_wait("-0");
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    let report: serde_json::Value = serde_json::from_slice(&done.stdout).expect("JSON report");
    assert_eq!(report["nfs"][0]["details"]["version"], 1, "one swap");
    assert!(!sock.exists(), "the socket file is removed at the end");

    // What passed (tshark, not flowplane, reads it): before the swap only 5002's packets, after it
    // only 5001's, around one switch point, and none missing on either side of it.
    let got = tshark_rows(&out, &["udp.dstport", "data.data"]);
    let seqs: Vec<(u16, usize)> = got
        .iter()
        .map(|r| {
            let text = String::from_utf8(
                (0..r[1].len() / 2).map(|i| u8::from_str_radix(&r[1][2 * i..2 * i + 2], 16).unwrap()).collect(),
            )
            .unwrap();
            (r[0].parse().unwrap(), text.trim_start_matches("seq=").parse().unwrap())
        })
        .collect();
    let last_old = seqs.iter().filter(|s| s.0 == 5002).map(|s| s.1).max().expect("5002 passed before the swap");
    let first_new = seqs.iter().filter(|s| s.0 == 5001).map(|s| s.1).min().expect("5001 passed after the swap");
    assert!(last_old < first_new, "a packet judged by the old rules after one judged by the new: {seqs:?}");
    // The switch point S: passed = odd seqs below S (5002) and even ones from S (5001).
    assert!(matches!(first_new - last_old, 1 | 3), "one switch point: last old {last_old}, first new {first_new}");
    let switch = if first_new == last_old + 1 { first_new } else { last_old + 2 };
    let expect: Vec<(u16, usize)> =
        (0..n).filter(|&i| (i % 2 == 1) == (i < switch)).map(|i| (5001 + (i % 2) as u16, i)).collect();
    assert_eq!(seqs, expect, "every packet judged by exactly one rule set, none lost");
    assert!(switch > n / 10 && switch < n * 9 / 10, "the swap landed mid-traffic: {switch}");
    let _ = std::fs::remove_dir_all(&dir);
}
