//! Packet trace and capture on a live run (issue 31), as root on a veth pair
//! made by the test, under the `rtc` and `batch` executors: scapy sends UDP
//! flows to ports 5001-5003 through `acl` (denying 5001) -> `ddos` -> `fsc`;
//! `trace add 5 FLOW` shows exactly that flow's first 5 packets with acl's
//! verdict and the NFs after it not reached, a trace of a passing flow shows
//! every NF passing, with fsc's state for the flow before and after each
//! packet as the scapy sequence says (batch; the engine's `tests/tap.rs`
//! holds every executor to the same per-stage verdicts and states); `capture start FILE --at acl --dropped` writes a pcap
//! whose packets (tshark reads them) are exactly the denied ones; a capture of
//! the input left running is closed by the run's end; an unwritable file and
//! an unknown NF are refused in one line.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

mod ports_common;

use ports_common::{ctl, ctl_ok, tshark_rows, wait_ready, Proc, Veth};

/// Sends packets `from..to` on `iface`: 10.0.0.1:4000 -> 10.0.0.2:(5001 + i % 3), payload `seq=NNNNNN` (scapy).
fn send(iface: &str, from: usize, to: usize) {
    let script = format!(
        "from scapy.all import Ether, IP, UDP, Raw, sendp\n\
         pk=[Ether(src='02:00:00:00:00:01',dst='02:00:00:00:00:02')/IP(src='10.0.0.1',dst='10.0.0.2')/\
         UDP(sport=4000,dport=5001+i%3)/Raw(b'seq=%06d' % i) for i in range({from}, {to})]\n\
         sendp(pk, iface='{iface}', inter=0.001, verbose=False)\n"
    );
    let ok = Command::new("/usr/bin/python3").args(["-c", &script]).status().expect("python3 with scapy");
    assert!(ok.success(), "scapy sender");
}

/// Waits until the run has received `n` packets.
fn received(sock: &Path, n: u64) {
    let t = Instant::now();
    while ctl_ok(sock, &["show", "runtime"])["cores"][0]["packets"].as_u64().unwrap_or(0) < n {
        assert!(t.elapsed() < Duration::from_secs(10), "traffic did not arrive");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Rows of (dport, seq) tshark reads from a pcap.
fn seqs(pcap: &Path) -> Vec<(u16, usize)> {
    tshark_rows(pcap, &["udp.dstport", "data.data"])
        .iter()
        .map(|r| {
            let text: String =
                (0..r[1].len() / 2).map(|i| u8::from_str_radix(&r[1][2 * i..2 * i + 2], 16).unwrap() as char).collect();
            (r[0].parse().unwrap(), text.trim_start_matches("seq=").parse().unwrap())
        })
        .collect()
}

fn verdicts(p: &serde_json::Value) -> Vec<String> {
    p["stages"].as_array().unwrap().iter().map(|s| format!("{} {}", s["nf"], s["verdict"]).replace('"', "")).collect()
}

/// `tail`: also the passing flow's trace and the capture the run's end closes (executor-independent: once).
fn check(exec: &str, tag: &str, tail: bool) {
    let v = Veth::new(tag);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("trace-{exec}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (sock, out, dropped, input) =
        (dir.join("fp.sock"), dir.join("out.pcap"), dir.join("drop.pcap"), dir.join("in.pcap"));
    let mut fp = Proc::spawn(&[
        "run",
        "--input",
        &format!("afpacket:{}", v.0),
        "--output",
        out.to_str().unwrap(),
        "--chain",
        "acl(rule=drop:udp:any:any:any:5001) -> ddos(threshold=1000000) -> fsc",
        "--exec",
        exec,
        "--cores",
        "1",
        "--no-pin",
        "--ctl",
        sock.to_str().unwrap(),
    ]);
    wait_ready(&sock, &mut fp);

    // Refusals: one line each, nothing armed.
    for (words, why) in [
        (&["capture", "start", "/nonexistent/x.pcap"][..], "/nonexistent/x.pcap"),
        (&["capture", "start", dropped.to_str().unwrap(), "--at", "nat"][..], "no NF 'nat'"),
        (&["capture", "stop"][..], "no capture is running"),
        (&["trace", "add", "0"][..], "N must be an integer"),
        (&["trace", "add", "5", "udp", "10.0.0.1"][..], "PROTO SRC SPORT DST DPORT"),
    ] {
        let (good, _, err) = ctl(&sock, words);
        assert!(!good && err.contains(why) && err.trim_end().lines().count() == 1, "{words:?}: {err}");
    }

    // A trace of the denied flow and a capture of what acl drops, over 60 packets.
    let armed = ctl_ok(&sock, &["trace", "add", "5", "udp", "10.0.0.1", "4000", "10.0.0.2", "5001"]);
    assert_eq!(armed["armed"], 5, "{armed}");
    let cap = ctl_ok(&sock, &["capture", "start", dropped.to_str().unwrap(), "--at", "acl", "--dropped"]);
    assert_eq!(cap["at"], "acl", "{cap}");
    send(&v.peer(), 0, 60);
    received(&sock, 60);
    let trace = ctl_ok(&sock, &["trace", "show"]);
    let pkts = trace.as_array().unwrap();
    assert_eq!(pkts.len(), 5, "exactly the 5 packets asked for: {trace}");
    for p in pkts {
        assert_eq!(p["flow"]["dport"], 5001, "{p}");
        assert_eq!(
            (&p["flow"]["proto"], &p["flow"]["src"], &p["flow"]["sport"]),
            (&"udp".into(), &"10.0.0.1".into(), &4000.into())
        );
        assert_eq!((&p["worker"], &p["len"]), (&0.into(), &52.into()), "{p}");
        assert_eq!(verdicts(p), ["acl drop", "ddos not reached", "fsc not reached"], "{p}");
        assert_eq!(p["verdict"], "drop");
    }
    let ts: Vec<u64> = pkts.iter().map(|p| p["ts_ns"].as_u64().unwrap()).collect();
    assert!(ts.windows(2).all(|w| w[0] <= w[1]), "time order: {ts:?}");
    let stop = ctl_ok(&sock, &["capture", "stop"]);
    assert_eq!((&stop["written"], &stop["dropped"]), (&20.into(), &0.into()), "{stop}");
    // tshark, not flowplane, reads the capture: every denied packet (dport 5001), in order, nothing else.
    let denied: Vec<(u16, usize)> = (0..60).filter(|i| i % 3 == 0).map(|i| (5001, i)).collect();
    assert_eq!(seqs(&dropped), denied);

    if !tail {
        assert!(ctl(&sock, &["stop"]).0);
        assert!(fp.signal_and_wait("-0").status.success());
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    // A passing flow's trace (it replaces the first), and a capture of the input left running.
    ctl_ok(&sock, &["trace", "add", "4", "udp", "10.0.0.1", "4000", "10.0.0.2", "5002"]);
    ctl_ok(&sock, &["capture", "start", input.to_str().unwrap()]);
    let (good, _, err) = ctl(&sock, &["capture", "start", dropped.to_str().unwrap()]);
    assert!(!good && err.contains("is running"), "{err}");
    send(&v.peer(), 60, 72);
    received(&sock, 72);
    let pkts = ctl_ok(&sock, &["trace", "show"]);
    assert_eq!(pkts.as_array().unwrap().len(), 4, "{pkts}");
    for (k, p) in pkts.as_array().unwrap().iter().enumerate() {
        assert_eq!(p["flow"]["dport"], 5002, "{p}");
        assert_eq!(verdicts(p), ["acl pass", "ddos pass", "fsc pass"], "{p}");
        assert_eq!(p["verdict"], "out port 0");
        // Each NF's state for the flow before and after the packet. The model, from the scapy sequence:
        // packet i goes to 5001 + i % 3 and acl drops 5001, so fsc has counted 5002's 20 packets of the
        // first burst (i % 3 == 1, i < 60) and the k earlier traced ones, 52 bytes each (14 + 20 + 8 + 10).
        let fsc = &p["stages"][2]["state"];
        let n = 20 + k as u64;
        let counts = |v: &serde_json::Value| (v["packets"].as_u64(), v["bytes"].as_u64());
        assert_eq!(counts(&fsc["before"]), (Some(n), Some(52 * n)), "{p}");
        assert_eq!(counts(&fsc["after"]), (Some(n + 1), Some(52 * (n + 1))), "{p}");
        // ddos counts the source's packets in its window (the flows acl passes): one more after.
        let d = &p["stages"][1]["state"];
        if d["before"]["window_start_ns"] == d["after"]["window_start_ns"] {
            let w = |v: &serde_json::Value| v["window_packets"].as_u64().unwrap();
            assert_eq!(w(&d["after"]), w(&d["before"]) + 1, "{p}");
        }
        // acl's verdict for the flow was cached at its first packet (first burst).
        assert!(!p["stages"][0]["state"]["before"].is_null(), "{p}");
    }
    let human =
        Command::new(env!("CARGO_BIN_EXE_flowplane")).arg("ctl").arg(&sock).args(["trace", "show"]).output().unwrap();
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(
        text.starts_with("packet 1: worker 0 port afpacket:") && text.contains("\n  acl          pass\n"),
        "{text}"
    );
    ctl_ok(&sock, &["trace", "clear"]);
    assert_eq!(ctl_ok(&sock, &["trace", "show"]), serde_json::json!([]));

    // The run's end closes the running capture: the 12 packets of the second burst, all of them.
    assert!(ctl(&sock, &["stop"]).0);
    let done = fp.signal_and_wait("-0");
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    let err = String::from_utf8_lossy(&done.stderr);
    assert!(err.contains("12 packets written, 0 dropped"), "{err}");
    let all: Vec<(u16, usize)> = (60..72).map(|i| (5001 + (i % 3) as u16, i)).collect();
    assert_eq!(seqs(&input), all);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn trace_and_capture_under_rtc() {
    check("rtc", "tra", false);
}

#[test]
fn trace_and_capture_under_batch() {
    check("batch", "trb", true);
}
