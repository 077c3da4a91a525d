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

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_flowplane");

fn sh(args: &[&str]) -> bool {
    Command::new(args[0])
        .args(&args[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn must(args: &[&str]) {
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
        must(&["ip", "link", "add", &t.fa, "type", "veth", "peer", "name", "v0", "netns", &t.ns_a]);
        must(&["ip", "link", "add", &t.fb, "type", "veth", "peer", "name", "v0", "netns", &t.ns_b]);
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
struct Proc(Option<Child>);

impl Proc {
    fn interrupt_and_wait(&mut self) -> std::process::Output {
        let c = self.0.take().expect("running");
        let _ = sh(&["kill", "-INT", &c.id().to_string()]);
        c.wait_with_output().expect("wait")
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

fn scrape(port: u16) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("metrics endpoint");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
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
    let capture = t.dir.join("cap.pcap");
    must(&[
        BIN,
        "gen",
        "--flows",
        "16",
        "--packets",
        &packets.to_string(),
        "--proto",
        "udp",
        "--seed",
        "7",
        "-o",
        input.to_str().unwrap(),
    ]);
    // flowplane between the veths, until SIGINT.
    let mut fp = Proc(Some(
        Command::new(BIN)
            .args(["run", "--input", &port_name(backend, &t.fa, 0), "--output", &port_name(backend, &t.fb, 1)])
            .args(["--chain", chain, "--cores", "1", "--no-pin", "--json"])
            .args(["--metrics", &format!("127.0.0.1:{metrics_port}")])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn flowplane"),
    ));
    // The receiver: tshark in the second namespace, UDP only (no stray frames).
    let mut cap = Proc(Some(
        Command::new("ip")
            .args(["netns", "exec", &t.ns_b, "tshark", "-n", "-i", "v0", "-f", "udp", "-w"])
            .arg(&capture)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn tshark"),
    ));
    // Both are listening once the capture file exists and the metrics answer.
    let t0 = Instant::now();
    while !(capture.exists() && TcpStream::connect(("127.0.0.1", metrics_port)).is_ok()) {
        if let Some(Ok(Some(_))) = fp.0.as_mut().map(|c| c.try_wait()) {
            let out = fp.0.take().unwrap().wait_with_output().unwrap();
            panic!("flowplane on {backend} ports exited at start: {}", String::from_utf8_lossy(&out.stderr));
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "flowplane or tshark did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    // The sender: flowplane replaying the pcap into the first namespace's veth at 2000 packets/s.
    must(&[
        "ip",
        "netns",
        "exec",
        &t.ns_a,
        BIN,
        "run",
        "--input",
        input.to_str().unwrap(),
        "--output",
        "afpacket:v0",
        "--chain",
        "forward",
        "--rate",
        "2000",
        "--cores",
        "1",
        "--no-pin",
    ]);
    // Everything has crossed once the metrics count it out (or 10 s pass).
    let t0 = Instant::now();
    let mut text = scrape(metrics_port);
    while metric(&text, "flowplane_core_packets_out_total{core=\"0\"}") < packets as u64
        && t0.elapsed() < Duration::from_secs(20)
    {
        std::thread::sleep(Duration::from_millis(200));
        text = scrape(metrics_port);
    }
    assert!(text.contains("200 OK") && text.contains("# TYPE flowplane_drops counter"), "{text}");
    let (inn, out) = (
        metric(&text, "flowplane_core_packets_total{core=\"0\"}"),
        metric(&text, "flowplane_core_packets_out_total{core=\"0\"}"),
    );
    assert_eq!(
        (inn, out),
        (packets as u64, packets as u64),
        "{backend}: packets in/out after {:?}: {text}",
        t0.elapsed()
    );
    assert_eq!(metric(&text, "flowplane_drops_total{reason=\"rx_overrun\"}"), 0);
    assert_eq!(metric(&text, "flowplane_drops_total{reason=\"tx_full\"}"), 0);
    assert!(text.contains("flowplane_batch_latency_cycles_bucket"), "latency histogram: {text}");
    assert!(text.contains("flowplane_table_flows{core=\"0\"}"), "{text}");
    std::thread::sleep(Duration::from_millis(500));
    let out = fp.interrupt_and_wait();
    assert!(out.status.success(), "flowplane exit on SIGINT: {}", String::from_utf8_lossy(&out.stderr));
    // Teardown: no XDP program is left on flowplane's interfaces.
    for me in [&t.fa, &t.fb] {
        let l = Command::new("ip").args(["-d", "link", "show", me]).output().unwrap();
        let l = String::from_utf8_lossy(&l.stdout);
        assert!(!l.contains("prog/xdp"), "{backend}: XDP program left on {me}: {l}");
    }
    let capo = cap.interrupt_and_wait();
    assert!(capo.status.success() || capture.exists());
    let fields =
        ["ip.src", "ip.dst", "udp.srcport", "udp.dstport", "data.data", "ip.checksum.status", "udp.checksum.status"];
    let sent = tshark_rows(&input, &fields);
    let got = tshark_rows(&capture, &fields);
    (sent, got, String::from_utf8_lossy(&out.stdout).into_owned())
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
