//! Shared by the port tests (`ports_*.rs`): flowplane on real interfaces, as root: two network
//! namespaces, each joined by a veth pair to an interface flowplane runs on.
//! A sender in the first namespace injects a known pcap at a modest rate
//! (flowplane itself, replaying into `afpacket:`), flowplane runs the chain
//! between the two veths until SIGINT, and tshark captures in the second
//! namespace: every packet must arrive, in order, with the chain's
//! rewrites and checksums tshark validates. The metrics endpoint is scraped
//! mid-run. Namespaces and interfaces get unique names and are removed even
//! when the test fails (Drop guard). A machine where they cannot be made
//! fails this test loudly: it never passes without running.

// Each port test crate uses a part of this module (ports_live its process helpers only).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_flowplane");

pub fn sh(args: &[&str]) -> bool {
    Command::new(args[0])
        .args(&args[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

pub fn must(args: &[&str]) {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?} failed (these tests need root, iproute2 and network namespaces): {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Two namespaces and two veth pairs; removed on drop.
struct Topo {
    ns_a: String,
    ns_b: String,
    /// flowplane's side of each pair (in the test's namespace).
    fa: String,
    fb: String,
    dir: PathBuf,
}

impl Topo {
    fn new(tag: &str) -> Topo {
        Topo::with_queues(tag, 1)
    }

    /// As `new`, with `queues` RX and TX queues on every veth (AF_XDP binds one socket per queue).
    fn with_queues(tag: &str, queues: usize) -> Topo {
        let q = queues.to_string();
        let qs = ["numrxqueues", q.as_str(), "numtxqueues", q.as_str()];
        let id = format!("{tag}{}", std::process::id() % 100_000);
        let t = Topo {
            ns_a: format!("fpA{id}"),
            ns_b: format!("fpB{id}"),
            fa: format!("fa{id}"),
            fb: format!("fb{id}"),
            dir: std::env::temp_dir().join(format!("fp-ports-{id}")),
        };
        t.cleanup();
        std::fs::create_dir_all(&t.dir).unwrap();
        must(&["ip", "netns", "add", &t.ns_a]);
        must(&["ip", "netns", "add", &t.ns_b]);
        for (me, ns) in [(&t.fa, &t.ns_a), (&t.fb, &t.ns_b)] {
            let mut args = vec!["ip", "link", "add", "name", me.as_str()];
            args.extend(qs);
            args.extend(["type", "veth", "peer", "name", "v0"]);
            args.extend(qs);
            args.extend(["netns", ns.as_str()]);
            must(&args);
        }
        for (ns, me) in [(&t.ns_a, &t.fa), (&t.ns_b, &t.fb)] {
            // No IPv6 chatter (router solicitations, MLD) on the test's links.
            let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{me}/disable_ipv6"), "1");
            must(&["ip", "link", "set", me, "up"]);
            must(&["ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"]);
            must(&["ip", "netns", "exec", ns, "ip", "link", "set", "v0", "up"]);
        }
        t
    }

    fn cleanup(&self) {
        let _ = sh(&["ip", "link", "del", &self.fa]);
        let _ = sh(&["ip", "link", "del", &self.fb]);
        let _ = sh(&["ip", "netns", "del", &self.ns_a]);
        let _ = sh(&["ip", "netns", "del", &self.ns_b]);
    }
}

impl Drop for Topo {
    fn drop(&mut self) {
        self.cleanup();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A child process killed on drop (a failing test leaves nothing running).
pub struct Proc(pub Option<Child>);

impl Proc {
    /// flowplane with `args`, its output piped.
    pub fn spawn(args: &[&str]) -> Proc {
        Proc(Some(
            Command::new(BIN)
                .args(args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn flowplane"),
        ))
    }

    pub fn pid(&self) -> u32 {
        self.0.as_ref().expect("running").id()
    }

    /// Sends `sig` (as `kill` takes it) and waits for the exit.
    pub fn signal_and_wait(&mut self, sig: &str) -> std::process::Output {
        let c = self.0.take().expect("running");
        let _ = sh(&["kill", sig, &c.id().to_string()]);
        c.wait_with_output().expect("wait")
    }

    pub fn interrupt_and_wait(&mut self) -> std::process::Output {
        self.signal_and_wait("-INT")
    }

    pub fn running(&mut self) -> bool {
        self.0.as_mut().is_some_and(|c| c.try_wait().is_ok_and(|s| s.is_none()))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub fn scrape(port: u16) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("metrics endpoint");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// The data plane polls (the metrics answer and say so): traffic sent from now on is received.
fn ready(port: u16) -> bool {
    TcpStream::connect(("127.0.0.1", port)).is_ok() && scrape(port).contains("\nflowplane_ready 1")
}

fn metric(text: &str, line_prefix: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with(line_prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("{line_prefix} not in the metrics:\n{text}")) as u64
}

pub fn tshark_rows(pcap: &Path, fields: &[&str]) -> Vec<Vec<String>> {
    let mut cmd = Command::new("tshark");
    cmd.args(["-n", "-r"]).arg(pcap);
    cmd.args(["-o", "ip.check_checksum:TRUE", "-o", "udp.check_checksum:TRUE", "-o", "tcp.check_checksum:TRUE"])
        .args(["-d", "udp.port==0-65535,data", "-d", "tcp.port==0-65535,data"])
        .args(["-T", "fields", "-E", "separator=|"]);
    for f in fields {
        cmd.args(["-e", f]);
    }
    let out = cmd.output().expect("tshark (apt-get install tshark)");
    assert!(out.status.success(), "tshark: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(|l| l.split('|').map(str::to_string).collect()).collect()
}

/// The port name of interface `iface` for `backend` (`dpdk_af_packet`: DPDK's net_af_packet vdev `n`).
fn port_name(backend: &str, iface: &str, n: usize) -> String {
    match backend {
        "dpdk_af_packet" => format!("dpdk:net_af_packet{n},iface={iface},qdisc_bypass=1"),
        b => format!("{b}:{iface}"),
    }
}

/// Runs `chain` between the two veths over a generated trace of `packets`
/// UDP packets on `backend` ports (`afpacket`, `afxdp`); returns (input
/// rows, captured rows, final JSON report).
pub fn run_between(
    backend: &str,
    tag: &str,
    chain: &str,
    packets: usize,
    metrics_port: u16,
) -> (Vec<Vec<String>>, Vec<Vec<String>>, String) {
    let t = Topo::new(&format!("{}{tag}", &backend[..2]));
    let input = t.dir.join("in.pcap");
    let n = packets.to_string();
    must(&[
        BIN,
        "gen",
        "--flows",
        "16",
        "--packets",
        &n,
        "--proto",
        "udp",
        "--seed",
        "7",
        "-o",
        input.to_str().unwrap(),
    ]);
    // flowplane between the veths until SIGINT, tshark in the second namespace.
    let run = Between::start(backend, &t, &["--chain", chain, "--cores", "1"], metrics_port);
    run.send(&t, &input, 2000);
    // Everything has crossed once the metrics count it out (or 20 s pass).
    let text = run.wait_out(packets as u64);
    assert!(text.contains("200 OK") && text.contains("# TYPE flowplane_drops_total counter"), "{text}");
    let (inn, out) = (
        metric(&text, "flowplane_core_packets_total{core=\"0\"}"),
        metric(&text, "flowplane_core_packets_out_total{core=\"0\"}"),
    );
    assert_eq!((inn, out), (packets as u64, packets as u64), "{backend}: packets in/out: {text}");
    assert_eq!(metric(&text, "flowplane_drops_total{reason=\"rx_overrun\"}"), 0);
    assert_eq!(metric(&text, "flowplane_drops_total{reason=\"tx_full\"}"), 0);
    assert!(text.contains("flowplane_batch_latency_seconds_bucket"), "latency histogram: {text}");
    assert!(text.contains("flowplane_table_flows{core=\"0\"}"), "{text}");
    std::thread::sleep(Duration::from_millis(200));
    let capture = run.capture.clone();
    let report = run.stop();
    assert_no_xdp_left(backend, &t);
    let fields =
        ["ip.src", "ip.dst", "udp.srcport", "udp.dstport", "data.data", "ip.checksum.status", "udp.checksum.status"];
    let sent = tshark_rows(&input, &fields);
    let got = tshark_rows(&capture, &fields);
    (sent, got, report)
}

/// flowplane running `run` between the topology's two veths (its own input and output
/// ports, plus `args`), and tshark capturing UDP/TCP in the second namespace.
struct Between {
    fp: Proc,
    cap: Proc,
    metrics_port: u16,
    capture: PathBuf,
}

impl Between {
    /// Starts both and waits until they listen (the capture file exists, the metrics answer).
    fn start(backend: &str, t: &Topo, args: &[&str], metrics_port: u16) -> Between {
        let capture = t.dir.join("cap.pcap");
        let mut fp = Proc(Some(
            Command::new(BIN)
                .args(["run", "--input", &port_name(backend, &t.fa, 0), "--output", &port_name(backend, &t.fb, 1)])
                .args(["--no-pin", "--json", "--metrics", &format!("127.0.0.1:{metrics_port}")])
                .args(args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn flowplane"),
        ));
        let cap = Proc(Some(
            Command::new("ip")
                .args(["netns", "exec", &t.ns_b, "tshark", "-n", "-i", "v0", "-f", "udp or tcp or icmp", "-w"])
                .arg(&capture)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn tshark"),
        ));
        let t0 = Instant::now();
        while !(capture.exists() && ready(metrics_port)) {
            if let Some(Ok(Some(_))) = fp.0.as_mut().map(|c| c.try_wait()) {
                let out = fp.0.take().unwrap().wait_with_output().unwrap();
                panic!("flowplane on {backend} ports exited at start: {}", String::from_utf8_lossy(&out.stderr));
            }
            assert!(t0.elapsed() < Duration::from_secs(20), "flowplane or tshark did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        std::thread::sleep(Duration::from_millis(500));
        Between { fp, cap, metrics_port, capture }
    }

    /// Replays `pcap` into the first namespace's veth at `rate` packets/s (flowplane as the sender).
    fn send(&self, t: &Topo, pcap: &Path, rate: u32) {
        must(&[
            "ip",
            "netns",
            "exec",
            &t.ns_a,
            BIN,
            "run",
            "--input",
            pcap.to_str().unwrap(),
            "--output",
            "afpacket:v0",
            "--chain",
            "forward",
            "--rate",
            &rate.to_string(),
            "--cores",
            "1",
            "--no-pin",
        ]);
    }

    /// Packets out of every core (as the metrics count them now).
    fn out_total(&self) -> (u64, String) {
        let text = scrape(self.metrics_port);
        let n = (0..)
            .map(|c| format!("flowplane_core_packets_out_total{{core=\"{c}\"}}"))
            .take_while(|m| text.contains(m.as_str()))
            .map(|m| metric(&text, &m))
            .sum();
        (n, text)
    }

    /// Waits (up to 20 s) until `want` packets are out; returns the metrics then.
    fn wait_out(&self, want: u64) -> String {
        let t0 = Instant::now();
        loop {
            let (n, text) = self.out_total();
            if n >= want || t0.elapsed() > Duration::from_secs(20) {
                return text;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Stops flowplane (SIGINT) and the capture; flowplane's report.
    fn stop(mut self) -> String {
        std::thread::sleep(Duration::from_millis(300));
        let out = self.fp.interrupt_and_wait();
        assert!(out.status.success(), "flowplane exit on SIGINT: {}", String::from_utf8_lossy(&out.stderr));
        let _ = self.cap.interrupt_and_wait();
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
    }
}

/// A tshark `data.data` field (hex) as text.
fn payload_text(hex: &str) -> String {
    let bytes: Vec<u8> =
        (0..hex.len() / 2).filter_map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

pub fn json_u(report: &str, key: &str) -> u64 {
    let needle = format!("\"{key}\": ");
    let i = report.find(&needle).unwrap_or_else(|| panic!("{key} in {report}"));
    report[i + needle.len()..].split([',', '\n']).next().unwrap().trim().parse().unwrap()
}

/// `forward` between the veths: every packet arrives, unchanged and in order.
pub fn check_forward(backend: &str, metrics_port: u16) {
    let n = 400;
    let (sent, got, report) = run_between(backend, "f", "forward", n, metrics_port);
    assert_eq!(sent.len(), n);
    assert_eq!(got.len(), n, "{backend}: every packet arrives (report: {report})");
    assert_eq!(got, sent, "{backend}: unchanged and in order");
    assert_eq!(json_u(&report, "packets"), n as u64);
    assert_eq!(json_u(&report, "packets_out"), n as u64);
    assert_eq!(json_u(&report, "rx_overrun"), 0);
}

/// `nat` between the veths: sources translated, one stable port per flow, checksums valid, in order.
pub fn check_nat(backend: &str, metrics_port: u16) {
    let n = 400;
    let (sent, got, report) = run_between(backend, "n", "nat(external=198.51.100.7)", n, metrics_port);
    assert_eq!(got.len(), n, "{backend}: every packet arrives (report: {report})");
    let mut map = std::collections::HashMap::new();
    for (i, (s, g)) in sent.iter().zip(&got).enumerate() {
        // Same order: the payload of packet i is packet i's.
        assert_eq!(s[4], g[4], "packet {i}: payload/order");
        assert_eq!((&s[1], &s[3]), (&g[1], &g[3]), "packet {i}: destination untouched");
        assert_eq!(g[0], "198.51.100.7", "packet {i}: source translated");
        assert_eq!((g[5].as_str(), g[6].as_str()), ("1", "1"), "packet {i}: checksums tshark validates: {g:?}");
        // One mapping per inside flow, stable for the flow's life.
        let inside = (s[0].clone(), s[2].clone(), s[1].clone(), s[3].clone());
        let port = g[2].clone();
        assert_eq!(map.entry(inside).or_insert_with(|| port.clone()), &port, "packet {i}: mapping changed");
    }
    let ports: std::collections::HashSet<_> = map.values().collect();
    assert_eq!(ports.len(), map.len(), "distinct flows get distinct external ports");
}

/// `nat` on 2 cores between veths with 2 queues each: the chain needs replies steered by
/// destination port to the core whose port share mapped them, which the port's own hash
/// cannot do, so flowplane's table steers (AF_PACKET: in the kernel; else a dispatcher core). Phase 1 sends 64 inside
/// flows out; phase 2 sends one reply per flow from its remote (scapy, built from what
/// tshark captured) to the external port the flow got. Every flow gets its own external
/// port (no port given twice across the cores), every reply reaches the inside address
/// and port that owns it, both cores translate, and the report names who steered.
pub fn check_nat_two_cores(backend: &str, metrics_port: u16) {
    let (n, flows) = (640usize, 64usize);
    let t = Topo::with_queues(&format!("{}2", &backend[..2]), 2);
    let input = t.dir.join("in.pcap");
    let replies = t.dir.join("replies.pcap");
    let (nn, nf) = (n.to_string(), flows.to_string());
    must(&[
        BIN,
        "gen",
        "--flows",
        &nf,
        "--packets",
        &nn,
        "--proto",
        "udp",
        "--seed",
        "5",
        "-o",
        input.to_str().unwrap(),
    ]);
    let run = Between::start(backend, &t, &["--chain", "nat(external=198.51.100.7)", "--cores", "2"], metrics_port);
    run.send(&t, &input, 2000);
    let text = run.wait_out(n as u64);
    assert_eq!(run.out_total().0, n as u64, "{backend}: every outbound packet out: {text}");
    // The replies: from each flow's remote to the external address and port the flow was given.
    std::thread::sleep(Duration::from_millis(500));
    let script = r#"
import sys
from scapy.all import rdpcap, wrpcap, Ether, IP, UDP, Raw
seen, out = set(), []
for p in rdpcap(sys.argv[1]):
    if IP not in p or UDP not in p:
        continue
    k = (p[IP].dst, p[UDP].dport, p[UDP].sport)
    if k in seen:
        continue
    seen.add(k)
    out.append(Ether(src=p[Ether].dst, dst=p[Ether].src) / IP(src=p[IP].dst, dst=p[IP].src)
               / UDP(sport=p[UDP].dport, dport=p[UDP].sport) / Raw(b"reply to %d" % p[UDP].sport))
wrpcap(sys.argv[2], out)
print(len(out))
"#;
    let made = Command::new("/usr/bin/python3")
        .args(["-c", script])
        .arg(&run.capture)
        .arg(&replies)
        .output()
        .expect("python3");
    assert!(made.status.success(), "scapy: {}", String::from_utf8_lossy(&made.stderr));
    let made: usize = String::from_utf8_lossy(&made.stdout).trim().parse().expect("reply count");
    assert_eq!(made, flows, "{backend}: one external port per flow");
    run.send(&t, &replies, 2000);
    let text = run.wait_out((n + flows) as u64);
    let per_core = [
        metric(&text, "flowplane_core_packets_out_total{core=\"0\"}"),
        metric(&text, "flowplane_core_packets_out_total{core=\"1\"}"),
    ];
    assert_eq!(per_core[0] + per_core[1], (n + flows) as u64, "{backend}: every reply out: {text}");
    assert!(per_core.iter().all(|&c| c > 0), "{backend}: both cores translate: {per_core:?}");
    let capture = run.capture.clone();
    let report = run.stop();
    assert_no_xdp_left(backend, &t);
    let by = table_steering(backend);
    assert!(report.contains(&format!("\"by\": \"{by}\"")), "{backend}: steered by the {by}: {report}");
    assert_eq!(json_u(&report, "dispatch_ring_full"), 0, "{report}");
    if by == "kernel" {
        assert!(
            json_u(&report, "kernel_steered") >= (n + flows) as u64,
            "{backend}: every packet in the kernel: {report}"
        );
    }
    let fields =
        ["ip.src", "ip.dst", "udp.srcport", "udp.dstport", "ip.checksum.status", "udp.checksum.status", "data.data"];
    let sent = tshark_rows(&input, &fields);
    let got = tshark_rows(&capture, &fields);
    assert_eq!(got.len(), n + flows, "{backend}: captured");
    // Outbound: the inside flow behind each external port (one port, one flow).
    let mut owner: std::collections::HashMap<String, (String, String)> = std::collections::HashMap::new();
    let mut port_of = std::collections::HashMap::new();
    for g in &got[..n] {
        assert_eq!(g[0], "198.51.100.7", "{backend}: source translated: {g:?}");
        assert_eq!((g[4].as_str(), g[5].as_str()), ("1", "1"), "{backend}: checksums: {g:?}");
    }
    // Per flow (remote address and port), the outbound packets keep their order, so the i-th
    // translated packet to a remote is the i-th inside packet to it.
    let mut by_remote: std::collections::HashMap<(String, String), Vec<&Vec<String>>> = Default::default();
    for s in &sent {
        by_remote.entry((s[1].clone(), s[3].clone())).or_default().push(s);
    }
    let mut seen: std::collections::HashMap<(String, String), usize> = Default::default();
    for g in &got[..n] {
        let k = (g[1].clone(), g[3].clone());
        let i = seen.entry(k.clone()).or_insert(0);
        let s = by_remote.get(&k).and_then(|v| v.get(*i)).unwrap_or_else(|| panic!("{backend}: unexpected {g:?}"));
        *i += 1;
        let inside = (s[0].clone(), s[2].clone());
        let flow = (inside.clone(), k.clone());
        let prev = port_of.entry(flow).or_insert_with(|| g[2].clone());
        assert_eq!(prev, &g[2], "{backend}: a flow's external port changed");
        if let Some(o) = owner.insert(g[2].clone(), inside.clone()) {
            assert_eq!(o, inside, "{backend}: external port {} given to two flows", g[2]);
        }
    }
    assert_eq!(owner.len(), flows, "{backend}: one external port per flow");
    // Inbound: each reply translated back to the inside address and port that own the external
    // port it was sent to (its payload names that port), with checksums tshark validates.
    let mut replied = std::collections::HashSet::new();
    for g in &got[n..] {
        let text: Vec<u8> =
            (0..g[6].len() / 2).filter_map(|i| u8::from_str_radix(&g[6][2 * i..2 * i + 2], 16).ok()).collect();
        let text = String::from_utf8_lossy(&text);
        let ext = text.strip_prefix("reply to ").unwrap_or_else(|| panic!("{backend}: not a reply: {g:?}")).to_string();
        let want = owner.get(&ext).unwrap_or_else(|| panic!("{backend}: reply to an unknown port {ext}"));
        assert_eq!((&g[1], &g[3]), (&want.0, &want.1), "{backend}: the reply to port {ext} reached another flow");
        assert_eq!((g[4].as_str(), g[5].as_str()), ("1", "1"), "{backend}: checksums: {g:?}");
        assert!(replied.insert(ext), "{backend}: a reply arrived twice");
    }
    assert_eq!(replied.len(), flows, "{backend}: every flow's reply reaches its owner");
}

/// `fsc` on 2 cores under a rebalancing strategy (`rsspp`, `dyssect`) between veths: 16 UDP
/// flows of very different weights (scapy; each payload names its flow and its sequence
/// number in the flow), so the controller moves RETA entries (and Dyssect offloads heavy
/// flows) between the cores while the traffic flows. Every packet arrives, each flow's
/// sequence numbers in order with no gap, the moves handed their flows' state over (the
/// export counts every flow's packets exactly once), and the report counts the moves. On
/// AF_PACKET the kernel's fanout program steers and the moves follow its protocol
/// (`flowplane_io::steered`); elsewhere the dispatcher's markers.
pub fn check_moves(backend: &str, scale: &str, metrics_port: u16) {
    let t = Topo::with_queues(&format!("{}{}", &backend[..2], &scale[..2]), 2);
    let input = t.dir.join("in.pcap");
    let export = t.dir.join("fsc.csv");
    let script = r#"
import random, sys
from scapy.all import wrpcap, Ether, IP, UDP, Raw
random.seed(11)
flows = 16
weights = [(flows - i) ** 3 for i in range(flows)]
order = random.choices(range(flows), weights=weights, k=4000)
seq, out = [0] * flows, []
for f in order:
    out.append(Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / IP(src="10.0.0.%d" % (f + 1), dst="10.9.9.9")
               / UDP(sport=1000 + f, dport=53) / Raw(b"flow %d seq %d" % (f, seq[f])))
    seq[f] += 1
wrpcap(sys.argv[1], out)
"#;
    let made = Command::new("/usr/bin/python3").args(["-c", script]).arg(&input).output().expect("python3");
    assert!(made.status.success(), "scapy: {}", String::from_utf8_lossy(&made.stderr));
    let args = ["--chain", "fsc", "--cores", "2", "--scale", scale, "--scale-period-ms", "50"];
    let exp = format!("fsc={}", export.display());
    let run = Between::start(backend, &t, &[&args[..], &["--export", &exp]].concat(), metrics_port);
    run.send(&t, &input, 4000);
    let text = run.wait_out(4000);
    assert_eq!(run.out_total().0, 4000, "{backend}: every packet out: {text}");
    let capture = run.capture.clone();
    let report = run.stop();
    // On AF_PACKET the kernel's fanout program steers and the moves follow its protocol
    // (flowplane_io::steered); elsewhere the dispatcher's markers.
    let by = moves_steering(backend);
    assert!(report.contains(&format!("\"by\": \"{by}\"")), "{backend} {scale}: moved by the {by}: {report}");
    if scale == "rsspp" {
        assert!(json_u(&report, "moves_done") > 0, "{backend}: RSS++ moved entries under traffic: {report}");
    } else {
        assert!(report.contains("\"controller\""), "{backend} {scale}: the controller's account: {report}");
    }
    // A move the control loop starts as the dispatcher stops may not complete.
    assert!(json_u(&report, "moves_done") <= json_u(&report, "moves_started"), "{report}");
    eprintln!(
        "{backend}: {scale} moves started {}, done {}, receives held {}",
        json_u(&report, "moves_started"),
        json_u(&report, "moves_done"),
        json_u(&report, "stalls")
    );
    // Per flow, sequence numbers 0, 1, 2, ... in the order captured: nothing lost, nothing reordered.
    let got = tshark_rows(&capture, &["data.data"]);
    assert_eq!(got.len(), 4000, "{backend}: captured");
    let mut next = std::collections::HashMap::new();
    for g in &got {
        let text = payload_text(&g[0]);
        let mut w = text.split(' ');
        let (flow, seq): (u32, u32) = match (w.next(), w.next(), w.next(), w.next()) {
            (Some("flow"), Some(f), Some("seq"), Some(s)) => (f.parse().unwrap(), s.parse().unwrap()),
            _ => panic!("{backend}: unexpected payload {text}"),
        };
        let n = next.entry(flow).or_insert(0u32);
        assert_eq!(seq, *n, "{backend}: flow {flow} out of order or with a gap");
        *n += 1;
    }
    // The state moved with its entries: each flow counted once, with all its packets.
    let rows = std::fs::read_to_string(&export).expect("export");
    let mut counted = std::collections::HashMap::new();
    for line in rows.lines().skip(1) {
        let c: Vec<&str> = line.split(',').collect();
        let flow: u32 = c[3].parse::<u32>().unwrap() - 1000;
        assert!(counted.insert(flow, c[5].parse::<u32>().unwrap()).is_none(), "{backend}: flow {flow} exported twice");
    }
    assert_eq!(counted, next, "{backend}: exported packets per flow = packets sent per flow");
}

/// An export file's rows without the columns of time (a port's clock is the receive
/// time, a replay's the trace's), sorted: the state, whatever the order it was written in.
fn export_state(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut lines = text.lines();
    let head: Vec<&str> = lines.next().unwrap_or("").split(',').collect();
    let keep: Vec<usize> = (0..head.len()).filter(|&i| !head[i].ends_with("_ns")).collect();
    let mut rows: Vec<String> = lines
        .map(|l| {
            let c: Vec<&str> = l.split(',').collect();
            keep.iter().map(|&i| c.get(i).copied().unwrap_or("")).collect::<Vec<_>>().join(",")
        })
        .collect();
    rows.sort();
    rows
}

/// The same trace (50 TCP connections, both directions) through a replay and through the
/// veths gives the same exported state for a chain of counting NFs, whatever the steering:
/// the port's own queues (1 and 2 cores), flowplane's symmetric table (`--symmetric-rss`:
/// the kernel's fanout program on AF_PACKET, the dispatcher elsewhere), the dispatcher's spray
/// (`shared`) and its RETA with RSS++ moves (`rsspp`). The replay on one core is the reference.
pub fn check_same_exports_as_replay(backend: &str, metrics_port: u16) {
    let t = Topo::with_queues(&format!("{}d", &backend[..2]), 2);
    let input = t.dir.join("in.pcap");
    must(
        &[BIN, "gen", "--flows", "50", "--packets", "2000", "--proto", "tcp-bidir", "--seed", "9", "-o"]
            .iter()
            .copied()
            .chain([input.to_str().unwrap()])
            .collect::<Vec<_>>(),
    );
    let chain = "fsc -> hh(export=all) -> keyctr(key=ip_pair) -> srcctr";
    let nfs = ["fsc", "hh", "keyctr", "srcctr"];
    let exports = |tag: &str| -> Vec<String> {
        nfs.iter()
            .flat_map(|nf| {
                ["--export".to_string(), format!("{nf}={}", t.dir.join(format!("{tag}-{nf}.csv")).display())]
            })
            .collect()
    };
    let states = |tag: &str| -> Vec<Vec<String>> {
        nfs.iter().map(|nf| export_state(&t.dir.join(format!("{tag}-{nf}.csv")))).collect()
    };
    let replay = Command::new(BIN)
        .args(["run", "--input", input.to_str().unwrap(), "--chain", chain])
        .args(exports("replay"))
        .output()
        .expect("replay");
    assert!(replay.status.success(), "replay: {}", String::from_utf8_lossy(&replay.stderr));
    let want = states("replay");
    assert_eq!(want[0].len(), 100, "the reference: 100 5-tuples");
    for (tag, args) in [
        ("rss1", vec!["--cores", "1"]),
        ("rss2", vec!["--cores", "2"]),
        ("sym2", vec!["--cores", "2", "--symmetric-rss"]),
        ("shared2", vec!["--cores", "2", "--scale", "shared"]),
        ("rsspp2", vec!["--cores", "2", "--scale", "rsspp", "--scale-period-ms", "50"]),
    ] {
        let ex = exports(tag);
        let mut all: Vec<&str> = vec!["--chain", chain];
        all.extend(args.iter().copied());
        all.extend(ex.iter().map(String::as_str));
        let run = Between::start(backend, &t, &all, metrics_port);
        run.send(&t, &input, 4000);
        let text = run.wait_out(2000);
        let out = run.out_total().0;
        let report = run.stop();
        assert_eq!(out, 2000, "{backend} {tag}: every packet out: {text}\n{report}");
        for ((nf, w), g) in nfs.iter().zip(&want).zip(states(tag)) {
            assert_eq!(&g, w, "{backend} {tag}: {nf}'s export differs from the replay's (report: {report})");
        }
        if tag == "sym2" {
            let by = table_steering(backend);
            assert!(report.contains(&format!("\"by\": \"{by}\"")), "{backend} {tag}: steered by the {by}: {report}");
        }
    }
}

/// `fw` on 2 cores between veths: both directions of a connection and the ICMP errors that
/// quote it must reach the one core that tracks it, which takes the dispatcher's symmetric
/// key and its steering of ICMP errors by the quoted flow. Scapy writes the traffic and each
/// packet's expected verdict in its IP id (1 passes, 0 is dropped): 32 inside UDP flows out,
/// their replies in, ICMP port-unreachable errors from a router quoting each flow (related:
/// pass), errors quoting flows that never existed and unsolicited outside packets (drop).
pub fn check_fw_icmp_two_cores(backend: &str, metrics_port: u16) {
    let t = Topo::with_queues(&format!("{}w", &backend[..2]), 2);
    let (first, second) = (t.dir.join("flows.pcap"), t.dir.join("errors.pcap"));
    let script = r#"
import sys
from scapy.all import wrpcap, Ether, IP, UDP, ICMP, IPerror, UDPerror, Raw
e = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
flows = [("10.0.0.%d" % (i + 1), 2000 + i, "198.51.100.%d" % (i % 5 + 1), 53) for i in range(32)]
one, two = [], []
for (a, ap, b, bp) in flows:
    one.append(e / IP(src=a, dst=b, id=1) / UDP(sport=ap, dport=bp) / Raw(b"out"))
for (a, ap, b, bp) in flows:
    one.append(e / IP(src=b, dst=a, id=1) / UDP(sport=bp, dport=ap) / Raw(b"reply"))
for i, (a, ap, b, bp) in enumerate(flows):
    one.append(e / IP(src="203.0.113.%d" % (i + 1), dst=a, id=0) / UDP(sport=bp, dport=ap + 100) / Raw(b"unsolicited"))
for (a, ap, b, bp) in flows:
    quoted = IPerror(src=a, dst=b) / UDPerror(sport=ap, dport=bp) / Raw(b"out")
    two.append(e / IP(src="192.0.2.1", dst=a, id=1) / ICMP(type=3, code=3) / quoted)
    bogus = IPerror(src=a, dst=b) / UDPerror(sport=ap + 500, dport=bp) / Raw(b"never")
    two.append(e / IP(src="192.0.2.1", dst=a, id=0) / ICMP(type=3, code=3) / bogus)
wrpcap(sys.argv[1], one)
wrpcap(sys.argv[2], two)
"#;
    let made =
        Command::new("/usr/bin/python3").args(["-c", script]).arg(&first).arg(&second).output().expect("python3");
    assert!(made.status.success(), "scapy: {}", String::from_utf8_lossy(&made.stderr));
    let run = Between::start(backend, &t, &["--chain", "fw(allow_new=inside)", "--cores", "2"], metrics_port);
    run.send(&t, &first, 2000);
    let text = run.wait_out(64);
    std::thread::sleep(Duration::from_millis(300));
    run.send(&t, &second, 2000);
    let text2 = run.wait_out(96);
    let out = run.out_total().0;
    let capture = run.capture.clone();
    let report = run.stop();
    assert_eq!(out, 96, "{backend}: 32 out, 32 replies, 32 related errors pass: {text}\n{text2}\n{report}");
    assert_no_xdp_left(backend, &t);
    let by = table_steering(backend);
    assert!(report.contains(&format!("\"by\": \"{by}\"")), "{backend}: steered by the {by}: {report}");
    let got = tshark_rows(&capture, &["ip.id", "icmp.type", "ip.src"]);
    assert_eq!(got.len(), 96, "{backend}: captured {got:?}");
    // (an ICMP error's row lists its own IP id, then the quoted header's)
    assert!(
        got.iter().all(|g| g[0].split(',').next() == Some("0x0001")),
        "{backend}: only packets marked to pass: {got:?}"
    );
    assert_eq!(got.iter().filter(|g| g[1] == "3").count(), 32, "{backend}: every related ICMP error passes");
    // Both cores track connections (the flows spread over them).
    let v: serde_json::Value =
        serde_json::from_str(&report[..report.rfind('}').map_or(0, |i| i + 1)]).expect("JSON report");
    let per_core: Vec<u64> =
        v["per_core"].as_array().expect("per_core").iter().map(|c| c["packets"].as_u64().unwrap()).collect();
    assert!(per_core.len() == 2 && per_core.iter().all(|&p| p > 0), "{backend}: both cores work: {per_core:?}");
    let through = if by == "kernel" { "kernel_steered" } else { "dispatched" };
    assert!(json_u(&report, through) >= 160, "{backend}: every packet through the {by}: {report}");
}

/// Teardown: no XDP program (libxdp's redirect program, or flowplane's steering program on
/// several cores) is left on flowplane's interfaces after a run.
fn assert_no_xdp_left(backend: &str, t: &Topo) {
    for me in [&t.fa, &t.fb] {
        let l = Command::new("ip").args(["-d", "link", "show", me]).output().unwrap();
        let l = String::from_utf8_lossy(&l.stdout);
        assert!(!l.contains("prog/xdp"), "{backend}: XDP program left on {me}: {l}");
    }
}

/// Who steers by flowplane's table when a chain needs it and the strategy neither sprays nor
/// moves flows: flowplane's program in the kernel on AF_PACKET (fanout) and AF_XDP (XDP), a
/// dispatcher core elsewhere.
fn table_steering(backend: &str) -> &'static str {
    if backend == "afpacket" || backend == "afxdp" {
        "kernel"
    } else {
        "dispatcher"
    }
}

/// Who steers a table whose entries move: AF_PACKET's fanout program (the move protocol reads
/// each frame's kernel receive time, which AF_XDP descriptors lack); elsewhere the dispatcher.
fn moves_steering(backend: &str) -> &'static str {
    if backend == "afpacket" {
        "kernel"
    } else {
        "dispatcher"
    }
}

/// `--scale scr` on a port: one UDP flow's packets over 2 workers through the dispatcher
/// core (the SCR software sequencer: stamping, spraying, histories). Every packet is out,
/// both workers processed their share, the replicas ended identical, and the exported
/// per-flow state (hh: packets, bytes) equals a Python model's count of what scapy wrote.
pub fn check_scr_one_flow(backend: &str, metrics_port: u16) {
    let t = Topo::with_queues(&format!("{}sc", &backend[..2]), 2);
    let input = t.dir.join("in.pcap");
    let export = t.dir.join("hh.csv");
    let script = r#"
import sys
from scapy.all import wrpcap, Ether, IP, UDP, Raw
out = [Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / IP(src="10.0.0.1", dst="10.9.9.9")
       / UDP(sport=4000, dport=53) / Raw(b"s" * (20 + i % 37)) for i in range(1000)]
wrpcap(sys.argv[1], out)
# The model: one flow, its packets and frame bytes.
print(len(out), sum(len(p) for p in out))
"#;
    let made = Command::new("/usr/bin/python3").args(["-c", script]).arg(&input).output().expect("python3");
    assert!(made.status.success(), "scapy: {}", String::from_utf8_lossy(&made.stderr));
    let model: Vec<u64> =
        String::from_utf8_lossy(&made.stdout).split_whitespace().map(|w| w.parse().unwrap()).collect();
    let exp = format!("hh={}", export.display());
    let args =
        ["--chain", "hh(export=all)", "--cores", "2", "--scale", "scr", "--table-capacity", "4096", "--export", &exp];
    let run = Between::start(backend, &t, &args, metrics_port);
    run.send(&t, &input, 4000);
    let text = run.wait_out(1000);
    assert_eq!(run.out_total().0, 1000, "{backend}: every packet out: {text}");
    let report = run.stop();
    let json_start = report.find('{').expect("a JSON report");
    let v: serde_json::Value = serde_json::Deserializer::from_str(&report[json_start..])
        .into_iter()
        .next()
        .and_then(Result::ok)
        .unwrap_or_else(|| panic!("{backend}: report: {report}"));
    let scr = &v["scr"];
    assert_eq!(scr["consistent"], true, "{backend}: replicas identical: {report}");
    assert_eq!(scr["comparable"], true, "{backend}: every replica reached the stream's end: {report}");
    let cores = scr["cores"].as_array().expect("per-core scr");
    assert_eq!(cores.len(), 2);
    for c in cores {
        assert!(c["own"].as_u64().unwrap() >= 400, "{backend}: both workers processed packets: {c}");
        assert_eq!(c["max_seq"].as_u64(), Some(1000), "{backend}: {c}");
        assert_eq!((c["gaps"].as_u64(), c["unrecovered"].as_u64()), (Some(0), Some(0)), "{backend}: {c}");
    }
    assert_eq!(cores.iter().map(|c| c["own"].as_u64().unwrap()).sum::<u64>(), 1000);
    let rows = std::fs::read_to_string(&export).expect("export");
    let mut lines = rows.lines();
    let head: Vec<&str> = lines.next().unwrap_or("").split(',').collect();
    let col = |n: &str| head.iter().position(|h| *h == n).unwrap_or_else(|| panic!("{n} in {head:?}"));
    let body: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(body.len(), 1, "{backend}: one flow exported: {rows}");
    let r = &body[0];
    assert_eq!((r[col("src")], r[col("sport")], r[col("dport")]), ("10.0.0.1", "4000", "53"), "{rows}");
    let got: Vec<u64> = [col("packets"), col("bytes")].iter().map(|&i| r[i].parse().unwrap()).collect();
    assert_eq!(got, model, "{backend}: exported packets and bytes = the model's");
}

/// One `GET /metrics` with an `Accept` header (or none): (response head, body).
fn get_metrics(port: u16, accept: Option<&str>) -> (String, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("metrics endpoint");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let accept = accept.map_or(String::new(), |a| format!("Accept: {a}\r\n"));
    write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\n{accept}\r\n").unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no HTTP head: {out}"));
    (head.to_string(), body.to_string())
}

/// A sample line's series: its name and labels (values here never hold `"` or `\`).
type Series = (String, std::collections::BTreeMap<String, String>);

/// The sample lines of an exposition: series -> value.
fn samples(text: &str) -> std::collections::BTreeMap<Series, f64> {
    let mut out = std::collections::BTreeMap::new();
    for l in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let (series, value) = l.rsplit_once(' ').unwrap_or_else(|| panic!("sample line {l}"));
        let (name, labels) = match series.split_once('{') {
            Some((n, rest)) => (n, rest.strip_suffix('}').unwrap_or_else(|| panic!("labels of {l}"))),
            None => (series, ""),
        };
        assert!(!labels.contains('\\'), "{l}");
        let labels = labels
            .split("\",")
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once("=\"").unwrap_or_else(|| panic!("label {p} in {l}"));
                (k.to_string(), v.trim_end_matches('"').to_string())
            })
            .collect();
        let v = if value == "+Inf" { f64::INFINITY } else { value.parse().unwrap_or_else(|_| panic!("value {l}")) };
        assert!(out.insert((name.to_string(), labels), v).is_none(), "series twice: {l}");
    }
    out
}

/// `promtool check metrics` (Debian's `prometheus` package) on `text`: (exit status 0, what it printed).
fn promtool(text: &str) -> (bool, String) {
    let mut c = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (apt-get install prometheus)");
    c.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let o = c.wait_with_output().unwrap();
    (o.status.success(), String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr))
}

/// The reference OpenMetrics parser (the Python client's, Debian's python3-prometheus-client,
/// strict about family and sample names and `# EOF`) on `text`: its error, if any.
fn openmetrics_error(text: &str) -> Option<String> {
    const PARSE: &str =
        "import sys\nfrom prometheus_client.openmetrics.parser import text_string_to_metric_families as p\n\
                         print(len(list(p(sys.stdin.read()))))";
    let py = ["/usr/bin/python3", "python3"]
        .into_iter()
        .find(|py| Command::new(py).args(["-c", "import prometheus_client"]).output().is_ok_and(|o| o.status.success()))
        .expect("python3 with prometheus_client (apt-get install python3-prometheus-client)");
    let mut c = Command::new(py)
        .args(["-c", PARSE])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let o = c.wait_with_output().unwrap();
    (!o.status.success()).then(|| String::from_utf8_lossy(&o.stderr).into_owned())
}

/// An NF report's numeric fields as the metrics name them (nested names joined by `.`), written
/// from the rule in crates/cli/src/metrics.rs's doc: arrays, strings, booleans, nulls and
/// objects keyed by data (not `[A-Za-z_][A-Za-z0-9_]*`) left out.
fn report_numbers(v: &serde_json::Value, path: &str, out: &mut Vec<(String, f64)>) {
    let name = |k: &str| {
        k.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    match v {
        serde_json::Value::Number(n) => out.push((path.to_string(), n.as_f64().unwrap())),
        serde_json::Value::Object(m) if m.keys().all(|k| name(k)) => {
            for (k, x) in m {
                report_numbers(x, &if path.is_empty() { k.clone() } else { format!("{path}.{k}") }, out);
            }
        }
        _ => {}
    }
}

/// Issue 31 (metrics): `promtool check metrics` failed on every counter, busy time and latency
/// were TSC cycles, OpenMetrics was sent whatever the `Accept` header, `drops_total{reason=
/// "table_full"}` counted packets that passed, and the NFs' own counters were missing.
/// A chain whose table is too small for the trace (200 flows, room for 64: the rest pass without
/// state), scraped in both formats once the traffic is through: the 0.0.4 text passes promtool,
/// the OpenMetrics text the reference parser; the values match the run's final report.
pub fn check_metrics(backend: &str, metrics_port: u16) {
    let t = Topo::new(&format!("{}m", &backend[..2]));
    let input = t.dir.join("in.pcap");
    let (packets, flows) = (400u64, 200);
    must(
        &[BIN, "gen", "--flows", &flows.to_string(), "--packets", &packets.to_string()]
            .into_iter()
            .chain(["--proto", "udp", "--seed", "7", "-o", input.to_str().unwrap()])
            .collect::<Vec<_>>(),
    );
    let chain = "lb(backends=4) -> hh -> fsc -> count";
    let run = Between::start(backend, &t, &["--chain", chain, "--cores", "1", "--table-capacity", "8"], metrics_port);
    run.send(&t, &input, 4000);
    run.wait_out(packets);
    let prometheus_accept = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;\
                             q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
    let (head, text) = get_metrics(metrics_port, None);
    let (om_head, om) = get_metrics(metrics_port, Some(prometheus_accept));
    for (accept, want) in [
        (Some("application/openmetrics-text; version=1.0.0"), "application/openmetrics-text; version=1.0.0"),
        (Some("text/plain;version=0.0.4"), "text/plain; version=0.0.4"),
        (Some("*/*"), "text/plain; version=0.0.4"),
        (Some("application/openmetrics-text;q=0, text/plain"), "text/plain; version=0.0.4"),
    ] {
        let (h, _) = get_metrics(metrics_port, accept);
        assert!(h.contains(&format!("Content-Type: {want}")), "Accept {accept:?}: {h}");
    }
    let report = run.stop();
    let r: serde_json::Value = serde_json::Deserializer::from_str(&report)
        .into_iter()
        .next()
        .and_then(Result::ok)
        .unwrap_or_else(|| panic!("JSON report: {report}"));

    // Formats: each as its content type says, each valid by an outside checker.
    assert!(head.contains("Content-Type: text/plain; version=0.0.4; charset=utf-8") && head.contains("Vary: Accept"));
    assert!(om_head.contains("Content-Type: application/openmetrics-text; version=1.0.0; charset=utf-8"), "{om_head}");
    assert!(!text.contains("# EOF") && !text.contains("_created"), "{text}");
    assert!(om.ends_with("# EOF\n") && !om.contains("_created"), "{om}");
    let (ok, problems) = promtool(&text);
    assert!(ok && problems.trim().is_empty(), "promtool check metrics on the text format:\n{problems}\n{text}");
    assert_eq!(openmetrics_error(&om), None, "OpenMetrics:\n{om}");
    // promtool reads only the 0.0.4 format (prometheus/prometheus#8932): on OpenMetrics its one
    // complaint is that a counter family `x` (OpenMetrics' name) has no HELP for its `x_total` samples.
    let (_, om_problems) = promtool(&om);
    for p in om_problems.lines() {
        let family = p.strip_suffix("_total no help text").unwrap_or_else(|| panic!("promtool on OpenMetrics: {p}"));
        assert!(om.contains(&format!("# TYPE {family} counter\n")), "{p}");
    }
    let s = samples(&text);
    assert_eq!(s.keys().collect::<Vec<_>>(), samples(&om).keys().collect::<Vec<_>>(), "the same series in both");

    let get = |name: &str, labels: &[(&str, &str)]| -> f64 {
        let key = (name.to_string(), labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        *s.get(&key).unwrap_or_else(|| panic!("{name}{labels:?} not in\n{text}"))
    };
    let u = |v: &serde_json::Value| v.as_f64().unwrap_or_else(|| panic!("{v} in {r}"));
    assert_eq!(get("flowplane_build_info", &[("version", env!("CARGO_PKG_VERSION"))]), 1.0);
    assert_eq!(get("flowplane_core_packets_total", &[("core", "0")]), u(&r["packets"]));
    assert_eq!(get("flowplane_core_packets_out_total", &[("core", "0")]), u(&r["packets_out"]));
    assert_eq!(u(&r["packets_out"]), packets as f64, "every packet passes: {report}");
    // A full table is no drop: 136 flows passed without state, counted apart; nothing was lost.
    let full = get("flowplane_table_full_total", &[("core", "0")]);
    assert_eq!(full, u(&r["tables"]["table_full"]));
    assert!(full > 0.0, "the table filled: {report}");
    for ((name, labels), v) in &s {
        if name == "flowplane_drops_total" {
            assert_eq!(*v, 0.0, "{labels:?}: nothing was dropped\n{text}");
            assert_ne!(labels["reason"], "table_full");
        }
    }
    // Every NF: its packet counters, and every numeric field of its report as the report has it.
    let nfs = r["nfs"].as_array().unwrap();
    let mut fields = 0;
    for (i, nf) in nfs.iter().enumerate() {
        let (name, index) = (nf["name"].as_str().unwrap(), i.to_string());
        let l = [("nf", name), ("index", index.as_str())];
        for (metric, key) in [("packets_in", "packets_in"), ("packets_out", "packets_out"), ("dropped", "dropped")]
            .into_iter()
            .chain([("bytes_in", "bytes_in")])
        {
            assert_eq!(get(&format!("flowplane_nf_{metric}_total"), &l), u(&nf[key]), "{name} {key}");
        }
        let mut numbers = Vec::new();
        report_numbers(&nf["details"], "", &mut numbers);
        for (field, v) in &numbers {
            let want = [("nf", name), ("index", index.as_str()), ("core", "0"), ("name", field.as_str())];
            assert_eq!(get("flowplane_nf_stat", &want), *v, "{name} {field}");
        }
        fields += numbers.len();
    }
    assert_eq!(s.keys().filter(|k| k.0 == "flowplane_nf_stat").count(), fields, "no other NF fields\n{text}");
    for (nf, field) in [("lb", "ipv4.flows"), ("hh", "flows_seen"), ("fsc", "flows_seen"), ("count", "packets")] {
        assert!(
            s.keys().any(|k| k.0 == "flowplane_nf_stat" && k.1["nf"] == nf && k.1["name"] == field),
            "{nf} {field}"
        );
    }
    // Seconds: the latency histogram counts the report's batches; busy time is the sum of the
    // batches' times, which the histogram's sum gives to its bucket resolution (1/16).
    let count = get("flowplane_batch_latency_seconds_count", &[]);
    assert_eq!(count, u(&r["latency"]["batches"]));
    assert_eq!(get("flowplane_batch_latency_seconds_bucket", &[("le", "+Inf")]), count);
    let (busy, sum) =
        (get("flowplane_core_busy_seconds_total", &[("core", "0")]), get("flowplane_batch_latency_seconds_sum", &[]));
    assert!(sum > 0.0 && busy >= sum && busy <= sum * (1.0 + 1.0 / 16.0) + 1e-9, "busy {busy} s, latency sum {sum} s");
    assert!(busy < u(&r["duration_s"]), "busy {busy} s within the run");
}

/// A veth pair in the test's namespace (IPv6 off, both ends up), removed on drop: flowplane
/// runs on the first end, the test sends into the peer.
pub struct Veth(pub String);

impl Veth {
    pub fn new(tag: &str) -> Veth {
        Veth::with_queues(tag, 1)
    }
    /// As `new`, with `queues` RX and TX queues on both ends (AF_XDP binds one socket per queue).
    pub fn with_queues(tag: &str, queues: usize) -> Veth {
        let v = Veth(format!("fl{tag}{}", std::process::id() % 100_000));
        let q = queues.to_string();
        let qs = ["numrxqueues", q.as_str(), "numtxqueues", q.as_str()];
        let _ = sh(&["ip", "link", "del", &v.0]);
        let peer = v.peer();
        let mut args = vec!["ip", "link", "add", v.0.as_str()];
        args.extend(qs);
        args.extend(["type", "veth", "peer", "name", peer.as_str()]);
        args.extend(qs);
        must(&args);
        for i in [&v.0, &v.peer()] {
            let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{i}/disable_ipv6"), "1");
            must(&["ip", "link", "set", i, "up"]);
        }
        v
    }
    pub fn peer(&self) -> String {
        format!("{}p", self.0)
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        let _ = sh(&["ip", "link", "del", &self.0]);
    }
}

/// `flowplane ctl SOCK words... --json`: (exit ok, answer, stderr).
pub fn ctl(sock: &Path, words: &[&str]) -> (bool, serde_json::Value, String) {
    let out = Command::new(BIN).arg("ctl").arg(sock).args(words).arg("--json").output().unwrap();
    let v = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (out.status.success(), v, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Waits until the run behind `sock` says its data plane is up (`show runtime`'s `ready`).
pub fn wait_ready(sock: &Path, fp: &mut Proc) {
    let t0 = std::time::Instant::now();
    while !ctl(sock, &["show", "runtime"]).1["ready"].as_bool().unwrap_or(false) {
        assert!(fp.running(), "flowplane exited at start");
        assert!(t0.elapsed() < Duration::from_secs(20), "control socket did not come up");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `ctl` that must succeed: its answer.
pub fn ctl_ok(sock: &Path, words: &[&str]) -> serde_json::Value {
    let (good, v, err) = ctl(sock, words);
    assert!(good, "ctl {words:?}: {err}");
    v
}
