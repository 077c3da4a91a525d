//! `flowplane run --config run.toml` and `flowplane ctl PATH reload` (issue
//! 31), as root on a veth pair made by the test: a live run started from a
//! TOML file is changed by editing the files and reloading, between three
//! bursts of traffic. An edit of the acl's rules file (same path) swaps the
//! rules; a ddos threshold edit applies with every source's count kept; an
//! edit of `cores` is refused in one line and nothing changes, not even the
//! threshold edited beside it. tshark, not flowplane, reads what passed.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

mod ports_common;

use ports_common::{ctl, ctl_ok, tshark_rows, wait_ready, Proc, Veth};

/// `ctl` that must succeed: its answer.
fn ok(sock: &Path, words: &[&str]) -> serde_json::Value {
    ctl_ok(sock, words)
}

/// Sends UDP packets `from..to` on `iface` from one source, destination port 5001 for
/// even sequence numbers and 5002 for odd ones, payload `seq=NNNNNN` (scapy), and waits
/// until the run has received `to` packets in all.
fn burst(iface: &str, sock: &Path, from: usize, to: usize) {
    let script = format!(
        "from scapy.all import Ether, IP, UDP, Raw, sendp\n\
         pk=[Ether(src='02:00:00:00:00:01',dst='02:00:00:00:00:02')/IP(src='10.0.0.1',dst='10.0.0.2')/\
         UDP(sport=4000,dport=5001+i%2)/Raw(b'seq=%06d' % i) for i in range({from}, {to})]\n\
         sendp(pk, iface='{iface}', inter=0.0005, verbose=False)\n"
    );
    let st = Command::new("/usr/bin/python3").args(["-c", &script]).status().expect("python3 with scapy");
    assert!(st.success(), "scapy sender");
    let t0 = Instant::now();
    while ok(sock, &["show", "runtime"])["cores"][0]["packets"].as_u64().unwrap_or(0) < to as u64 {
        assert!(t0.elapsed() < Duration::from_secs(20), "burst {from}..{to} did not arrive");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_run_from_run_toml_reloads_rules_and_thresholds_and_refuses_cores() {
    let v = Veth::new("cfg");
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("cfg{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (sock, out, rules, conf) =
        (dir.join("fp.sock"), dir.join("out.pcap"), dir.join("acl.rules"), dir.join("run.toml"));
    std::fs::write(&rules, "drop proto udp dport 5001\n").unwrap();
    let toml = |cores: usize, threshold: u64| {
        format!(
            "# a live run, whole\ninput = \"afpacket:{}\"\noutput = \"{}\"\ncores = {cores}\nctl = \"{}\"\njson = true\n\n\
             [[nf]]\nname = \"acl\"\nrules = \"{}\"\n\n[[nf]]\nname = \"ddos\"\nwindow = 3600\nthreshold = {threshold}\n",
            v.0,
            out.display(),
            sock.display(),
            rules.display()
        )
    };
    std::fs::write(&conf, toml(1, 1_000_000)).unwrap();
    // One option from the command line beside the file.
    let mut fp = Proc::spawn(&["run", "--config", conf.to_str().unwrap(), "--no-pin"]);
    wait_ready(&sock, &mut fp);
    let nfs = ok(&sock, &["show", "nfs"]);
    assert_eq!((nfs[0]["nf"].as_str(), nfs[1]["params"]["threshold"].as_str()), (Some("acl"), Some("1000000")));

    // Nothing changed: nothing applied.
    assert_eq!(ok(&sock, &["reload"])["applied"], serde_json::json!([]));

    // 1. The rules as started: 5001 dropped.
    burst(&v.peer(), &sock, 0, 200);
    // 2. The rules file edited in place (same path): 5002 dropped from now on.
    std::fs::write(&rules, "drop proto udp dport 5002\n").unwrap();
    let r = ok(&sock, &["reload"]);
    assert_eq!(r["applied"].as_array().map(Vec::len), Some(1), "{r}");
    assert_eq!(r["applied"][0]["nf"], "acl", "{r}");
    burst(&v.peer(), &sock, 200, 400);
    // 3. The ddos threshold edited: 200 packets of the source reached ddos so far
    //    (window of an hour: one window), so 50 more pass and then the source is blocked.
    std::fs::write(&conf, toml(1, 250)).unwrap();
    let r = ok(&sock, &["reload"]);
    assert_eq!(r["applied"].as_array().map(Vec::len), Some(1), "{r}");
    assert_eq!(
        (r["applied"][0]["nf"].as_str(), r["applied"][0]["params"]["threshold"].as_str()),
        (Some("ddos"), Some("250"))
    );
    burst(&v.peer(), &sock, 400, 600);
    // 4. cores edited (and the threshold beside it): refused in one line, nothing applied.
    std::fs::write(&conf, toml(2, 10)).unwrap();
    let (good, _, err) = ctl(&sock, &["reload"]);
    assert!(!good && err.contains("'cores' changed from '1' to '2'") && err.contains("restart"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert_eq!(ok(&sock, &["show", "nfs"])[1]["params"]["threshold"], "250", "nothing applied");
    // A broken file: one line naming the file's line and key, nothing applied.
    std::fs::write(&conf, format!("bogus = 1\n{}", toml(1, 10))).unwrap();
    let (good, _, err) = ctl(&sock, &["reload"]);
    assert!(!good && err.contains("run.toml:") && err.contains("unknown key 'bogus'"), "{err}");
    assert_eq!(ok(&sock, &["show", "nfs"])[1]["params"]["threshold"], "250");

    assert!(ctl(&sock, &["stop"]).0);
    let t1 = Instant::now();
    while fp.running() {
        assert!(t1.elapsed() < Duration::from_secs(10), "stop did not end the run");
        std::thread::sleep(Duration::from_millis(50));
    }
    let done = fp.signal_and_wait("-0");
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    let report: serde_json::Value =
        serde_json::from_slice(&done.stdout).expect("JSON report (json = true in the file)");
    assert_eq!(report["nfs"][0]["details"]["version"], 1, "one rules swap: the ddos reload left acl alone");

    // What passed, read by tshark: burst 1 the 5002 packets (odd), burst 2 the 5001 ones (even),
    // burst 3 the first 50 of its 5001 packets (ddos's count carried over the reload).
    let got: Vec<(u16, usize)> = tshark_rows(&out, &["udp.dstport", "data.data"])
        .iter()
        .map(|r| {
            let text: Vec<u8> =
                (0..r[1].len() / 2).map(|i| u8::from_str_radix(&r[1][2 * i..2 * i + 2], 16).unwrap()).collect();
            (r[0].parse().unwrap(), String::from_utf8(text).unwrap().trim_start_matches("seq=").parse().unwrap())
        })
        .collect();
    let expect: Vec<(u16, usize)> = (0..200)
        .filter(|i| i % 2 == 1)
        .chain((200..400).filter(|i| i % 2 == 0))
        .chain((400..600).filter(|i| i % 2 == 0).take(50))
        .map(|i| (5001 + (i % 2) as u16, i))
        .collect();
    assert_eq!(got, expect);
    let _ = std::fs::remove_dir_all(&dir);
}
