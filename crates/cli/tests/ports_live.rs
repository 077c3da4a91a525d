//! Live-run robustness (issue 29), as root on veth pairs in the test's namespace:
//! the bounded metrics server, interfaces that go down, vanish and come back,
//! and XDP programs left by a run that died. Each test makes its own uniquely
//! named interfaces and removes them even when it fails (Drop guards).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

mod ports_common;

use ports_common::{must, sh, Proc};

const BIN: &str = env!("CARGO_BIN_EXE_flowplane");

/// A veth pair (name, queues per side).
struct Veth(String, usize);

impl Veth {
    fn new(tag: &str) -> Veth {
        Veth::with_queues(tag, 1)
    }
    fn with_queues(tag: &str, queues: usize) -> Veth {
        let v = Veth(format!("fl{tag}{}", std::process::id() % 100_000), queues);
        v.create();
        v
    }
    fn peer(&self) -> String {
        format!("{}p", self.0)
    }
    fn create(&self) {
        let _ = sh(&["ip", "link", "del", &self.0]);
        let q = self.1.to_string();
        let qs = ["numrxqueues", q.as_str(), "numtxqueues", q.as_str()];
        let mut args = vec!["ip", "link", "add", self.0.as_str()];
        args.extend(qs);
        args.extend(["type", "veth", "peer", "name"]);
        let peer = self.peer();
        args.push(&peer);
        args.extend(qs);
        must(&args);
        for i in [&self.0, &self.peer()] {
            let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{i}/disable_ipv6"), "1");
            must(&["ip", "link", "set", i, "up"]);
        }
    }
    fn delete(&self) {
        must(&["ip", "link", "del", &self.0]);
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        let _ = sh(&["ip", "link", "del", &self.0]);
    }
}

/// One request on a fresh connection; the whole answer.
fn http(port: u16, req: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("metrics endpoint");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

fn wait_for_metrics(fp: &mut Proc, port: u16) {
    let t0 = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(fp.running(), "flowplane exited at start");
        assert!(t0.elapsed() < Duration::from_secs(20), "metrics endpoint did not come up");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn threads(pid: u32) -> usize {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines().find_map(|l| l.strip_prefix("Threads:")).unwrap().trim().parse().unwrap()
}

/// Issue 29: 3,000 idle connections made 2,958 threads, and any method and path got 200.
/// Now 500 idle connections leave the thread count alone and /metrics still answers.
#[test]
fn metrics_server_is_bounded_and_answers_only_get_metrics() {
    let v = Veth::new("m");
    let port = 19_571;
    let mut fp = Proc::spawn(&[
        "run",
        "--input",
        &format!("afpacket:{}", v.0),
        "--chain",
        "forward",
        "--cores",
        "1",
        "--no-pin",
        "--metrics",
        &format!("127.0.0.1:{port}"),
    ]);
    wait_for_metrics(&mut fp, port);
    let before = threads(fp.pid());
    let t0 = Instant::now();
    let mut idle = Vec::new();
    while idle.len() < 500 && t0.elapsed() < Duration::from_secs(5) {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => idle.push(s),
            Err(_) => break,
        }
    }
    assert!(idle.len() >= 400, "only {} idle connections opened", idle.len());
    std::thread::sleep(Duration::from_millis(200));
    let during = threads(fp.pid());
    assert!(during <= before, "threads grew with idle connections: {before} -> {during}");
    let m = http(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(m.starts_with("HTTP/1.1 200 OK\r\n"), "{m}");
    assert!(m.contains("# TYPE flowplane_drops_total counter"), "{m}");
    // A partial request holds a connection at most 2 s.
    let mut slow = TcpStream::connect(("127.0.0.1", port)).unwrap();
    slow.write_all(b"GET /metr").unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let t1 = Instant::now();
    let mut rest = Vec::new();
    let _ = slow.read_to_end(&mut rest);
    assert!(t1.elapsed() < Duration::from_secs(4), "slow client kept for {:?}", t1.elapsed());
    drop(idle);
    let post = http(port, "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
    assert!(post.starts_with("HTTP/1.1 405 "), "{post}");
    let other = http(port, "GET /other HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(other.starts_with("HTTP/1.1 404 "), "{other}");
    let bad = http(port, "garbage\r\n\r\n");
    assert!(bad.starts_with("HTTP/1.1 400 "), "{bad}");
    let big = http(port, &format!("GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(20_000)));
    assert!(big.starts_with("HTTP/1.1 431 ") || big.is_empty(), "{big}");
    assert!(http(port, "GET /metrics HTTP/1.0\r\n\r\n").starts_with("HTTP/1.1 200 OK"));
    assert_eq!(threads(fp.pid()), before);
    let out = fp.signal_and_wait("-INT");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

fn metric(text: &str, line_prefix: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.starts_with(line_prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map(|v| v as u64)
}

/// Scrapes until `line_prefix` reads `want` (or 15 s pass: a loaded CI host); how long it took.
fn wait_metric(port: u16, line_prefix: &str, want: u64) -> Duration {
    let t0 = Instant::now();
    loop {
        let text = http(port, "GET /metrics HTTP/1.0\r\n\r\n");
        if metric(&text, line_prefix) == Some(want) {
            return t0.elapsed();
        }
        assert!(t0.elapsed() < Duration::from_secs(15), "{line_prefix} != {want} after 15 s:\n{text}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Replays `pcap` into `iface` (the far end of flowplane's input pair) at 2,000 packets/s.
fn send(pcap: &std::path::Path, iface: &str) {
    must(&[
        BIN,
        "run",
        "--input",
        pcap.to_str().unwrap(),
        "--output",
        &format!("afpacket:{iface}"),
        "--chain",
        "forward",
        "--rate",
        "2000",
        "--cores",
        "1",
        "--no-pin",
    ]);
}

/// The kernel's own counters of an interface (the oracle for what crossed the wire): (packets, bytes) received.
fn kernel_rx(iface: &str) -> (u64, u64) {
    let r = |f: &str| {
        std::fs::read_to_string(format!("/sys/class/net/{iface}/statistics/{f}")).unwrap().trim().parse().unwrap()
    };
    (r("rx_packets"), r("rx_bytes"))
}

fn json_port(report: &str, name: &str, key: &str) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_str(report).unwrap_or_else(|e| panic!("{e}: {report}"));
    let p =
        v["ports"].as_array().unwrap().iter().find(|p| p["name"] == name).unwrap_or_else(|| panic!("{name}: {report}"));
    p[key].clone()
}

fn trace(dir: &std::path::Path) -> std::path::PathBuf {
    let f = dir.join("t.pcap");
    must(&[BIN, "gen", "--flows", "4", "--packets", "200", "--proto", "udp", "--seed", "3", "-o", f.to_str().unwrap()]);
    f
}

/// Issue 29: a deleted input interface was never reported and a re-created one received
/// nothing; a downed output was only a tx_error count; afpacket counted failed sends' bytes.
#[test]
fn afpacket_link_faults_are_reported_and_a_recreated_input_is_reattached() {
    let (vi, vo) = (Veth::new("i"), Veth::new("o"));
    let dir = std::env::temp_dir().join(format!("fp-live-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pcap = trace(&dir);
    let port = 19_572;
    let (pi, po) = (format!("afpacket:{}", vi.0), format!("afpacket:{}", vo.0));
    let mut fp = Proc::spawn(&[
        "run",
        "--input",
        &pi,
        "--output",
        &po,
        "--chain",
        "forward",
        "--cores",
        "1",
        "--no-pin",
        "--json",
        "--metrics",
        &format!("127.0.0.1:{port}"),
    ]);
    wait_for_metrics(&mut fp, port);
    let out_at = |text: &str| metric(text, "flowplane_core_packets_out_total{core=\"0\"}");
    let up = |p: &str| format!("flowplane_port_link_up{{port=\"{p}\"}}");
    let ev = |p: &str, e: &str| format!("flowplane_port_link_events_total{{port=\"{p}\",event=\"{e}\"}}");
    let k0 = kernel_rx(&vo.peer());
    send(&pcap, &vi.peer());
    wait_metric(port, "flowplane_core_packets_out_total{core=\"0\"}", 200);
    // The output goes down: reported within a poll period, its packets are tx errors.
    must(&["ip", "link", "set", &vo.0, "down"]);
    assert!(wait_metric(port, &up(&po), 0) < Duration::from_secs(5));
    send(&pcap, &vi.peer());
    wait_metric(port, "flowplane_drops_total{reason=\"tx_error\"}", 200);
    must(&["ip", "link", "set", &vo.0, "up"]);
    wait_metric(port, &up(&po), 1);
    // The input is deleted (reported), then created again: re-attached, it receives again.
    vi.delete();
    assert!(wait_metric(port, &ev(&pi, "gone"), 1) < Duration::from_secs(5));
    wait_metric(port, &up(&pi), 0);
    vi.create();
    wait_metric(port, &ev(&pi, "reattached"), 1);
    wait_metric(port, &up(&pi), 1);
    send(&pcap, &vi.peer());
    wait_metric(port, "flowplane_core_packets_out_total{core=\"0\"}", 400);
    assert_eq!(out_at(&http(port, "GET /metrics HTTP/1.0\r\n\r\n")), Some(400));
    let out = fp.signal_and_wait("-INT");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    // A re-created interface may be seen before it is set up: then its "link up" follows.
    assert!((4..=5).contains(&lines.len()), "one line per event:\n{err}");
    assert_eq!(lines[0], format!("flowplane: {po}: link down"), "{err}");
    assert_eq!(lines[1], format!("flowplane: {po}: link up"), "{err}");
    assert_eq!(lines[2], format!("flowplane: {pi}: interface gone (deleted); waiting for it to come back"), "{err}");
    assert!(lines[3].starts_with(&format!("flowplane: {pi}: interface re-created (index ")), "{err}");
    assert!(lines.len() == 4 || lines[4] == format!("flowplane: {pi}: link up"), "{err}");
    let report = String::from_utf8_lossy(&out.stdout);
    // Bytes sent are what the far end's kernel counted, not what was attempted.
    let k1 = kernel_rx(&vo.peer());
    let (pk, by) = (k1.0 - k0.0, k1.1 - k0.1);
    assert_eq!(pk, 400, "the far end's kernel counted {pk} packets");
    assert_eq!(json_port(&report, &po, "tx_packets"), 400);
    assert_eq!(json_port(&report, &po, "tx_errors"), 200);
    assert_eq!(json_port(&report, &po, "tx_bytes"), by, "bytes of accepted packets only");
    assert_eq!(json_port(&report, &po, "link_downs"), 1);
    assert_eq!(json_port(&report, &pi, "link_gone"), 1);
    assert_eq!(json_port(&report, &pi, "link_reattached"), 1);
    assert_eq!(json_port(&report, &pi, "link"), "up");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The id of the XDP program on `iface`, if one is attached.
fn xdp_prog(iface: &str) -> Option<String> {
    let l = Command::new("ip").args(["-d", "link", "show", iface]).output().unwrap();
    let l = String::from_utf8_lossy(&l.stdout).into_owned();
    let i = l.find("prog/xdp id ")?;
    Some(l[i + 12..].split(' ').next().unwrap().to_string())
}

fn wait_prog(iface: &str) -> String {
    let t0 = Instant::now();
    loop {
        if let Some(id) = xdp_prog(iface) {
            return id;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "no XDP program appeared on {iface}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits for the run's record of program `id` (written just after the program is attached).
fn wait_marker(id: &str) -> std::path::PathBuf {
    let t0 = Instant::now();
    loop {
        let found = std::fs::read_dir("/run/flowplane")
            .into_iter()
            .flatten()
            .flatten()
            .find(|e| e.file_name().to_string_lossy().ends_with(&format!("-{id}")));
        if let Some(e) = found {
            return e.path();
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "no record of XDP program {id} in /run/flowplane");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Issue 29: after `kill -9` the XDP program stayed attached, a restarted run left it
/// attached even after a clean exit, and a re-created input received nothing.
#[test]
fn afxdp_program_of_a_killed_run_is_removed_and_a_recreated_input_is_reattached() {
    let (vi, vo) = (Veth::new("x"), Veth::new("y"));
    let dir = std::env::temp_dir().join(format!("fp-livex-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pcap = trace(&dir);
    let port = 19_573;
    let pi = format!("afxdp:{}:0", vi.0);
    let args = |json: bool| {
        let mut a: Vec<String> = ["run", "--input", &pi, "--output", &format!("afpacket:{}", vo.0)]
            .iter()
            .chain(&["--chain", "forward", "--cores", "1", "--no-pin", "--metrics", &format!("127.0.0.1:{port}")])
            .map(|s| s.to_string())
            .collect();
        if json {
            a.push("--json".into());
        }
        a
    };
    let spawn = |json: bool| {
        let a = args(json);
        Proc::spawn(&a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    // A run killed outright leaves its program attached.
    let mut fp = spawn(false);
    let first = wait_prog(&vi.0);
    wait_marker(&first);
    let _ = fp.signal_and_wait("-KILL");
    assert_eq!(xdp_prog(&vi.0).as_deref(), Some(first.as_str()), "kill -9 leaves the program (the kernel's rule)");
    // The next run removes it (it was flowplane's), loads its own, and follows a re-created input.
    let mut fp = spawn(true);
    wait_for_metrics(&mut fp, port);
    let second = wait_prog(&vi.0);
    assert_ne!(second, first, "the dead run's program is replaced");
    send(&pcap, &vi.peer());
    wait_metric(port, "flowplane_core_packets_out_total{core=\"0\"}", 200);
    vi.delete();
    vi.create();
    wait_metric(port, &format!("flowplane_port_link_events_total{{port=\"{pi}\",event=\"reattached\"}}"), 1);
    wait_prog(&vi.0);
    send(&pcap, &vi.peer());
    wait_metric(port, "flowplane_core_packets_out_total{core=\"0\"}", 400);
    let out = fp.signal_and_wait("-INT");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.lines().next().unwrap_or("").starts_with(&format!(
            "flowplane: {pi}: removed XDP program xsk_def_prog (id {first}) left attached by flowplane run "
        )),
        "{err}"
    );
    assert_eq!(json_port(&String::from_utf8_lossy(&out.stdout), &pi, "rx_packets"), 400);
    // A clean exit leaves nothing: not on the input, not on the output.
    assert_eq!(xdp_prog(&vi.0), None, "{err}");
    assert_eq!(xdp_prog(&vo.0), None);
    // A program flowplane cannot tell as its own (no record of a run) is left in place, with a notice.
    let mut fp = spawn(false);
    let third = wait_prog(&vi.0);
    let record = wait_marker(&third);
    let _ = fp.signal_and_wait("-KILL");
    std::fs::remove_file(record).unwrap();
    let mut fp = spawn(false);
    wait_for_metrics(&mut fp, port);
    let out = fp.signal_and_wait("-INT");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("xsk_def_prog (id {third}) is attached and was not loaded by flowplane: left in place")),
        "{err}"
    );
    assert_eq!(xdp_prog(&vi.0), Some(third), "someone else's program is never detached");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Kernel steering on AF_XDP (2 cores, nat: the table sends replies to their port's core):
/// flowplane's own XDP program, `fp_xdp_steer`, is attached while the run lives; a run killed
/// outright leaves it, the next run removes it (it was flowplane's), steers with its own and
/// removes that at a clean exit.
#[test]
fn afxdp_steering_program_of_a_killed_run_is_removed_by_the_next() {
    let (vi, vo) = (Veth::with_queues("xk", 2), Veth::with_queues("xl", 2));
    let port = 19_547;
    let pi = format!("afxdp:{}:0", vi.0);
    let args = [
        "run",
        "--input",
        &pi,
        "--output",
        &format!("afpacket:{}", vo.0),
        "--chain",
        "nat(external=198.51.100.7)",
        "--cores",
        "2",
        "--no-pin",
        "--json",
        "--metrics",
        &format!("127.0.0.1:{port}"),
    ]
    .map(String::from);
    let spawn = || Proc::spawn(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let mut fp = spawn();
    let first = wait_prog(&vi.0);
    wait_marker(&first);
    let _ = fp.signal_and_wait("-KILL");
    assert_eq!(xdp_prog(&vi.0).as_deref(), Some(first.as_str()), "kill -9 leaves the program");
    let mut fp = spawn();
    wait_for_metrics(&mut fp, port);
    let second = wait_prog(&vi.0);
    assert_ne!(second, first, "the dead run's program is replaced");
    let out = fp.signal_and_wait("-INT");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains(&format!("removed XDP program fp_xdp_steer (id {first}) left attached by flowplane run ")),
        "{err}"
    );
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(report.contains("\"by\": \"kernel\""), "steered by the XDP program: {report}");
    assert_eq!(xdp_prog(&vi.0), None, "a clean exit leaves nothing: {err}");
}

/// Issue 29: a second Ctrl-C while a run stops used to exit before the XDP program was
/// removed. Now it exits at once (status 1, no report) after removing it; if the first
/// signal's clean stop wins the race, the run ends normally. Either way nothing is left.
#[test]
fn afxdp_second_interrupt_exits_at_once_and_removes_the_program() {
    let (vi, vo) = (Veth::new("d"), Veth::new("e"));
    let pi = format!("afxdp:{}:0", vi.0);
    let (mut second, mut clean) = (0, 0);
    for _ in 0..3 {
        let mut fp = Proc::spawn(&[
            "run",
            "--input",
            &pi,
            "--output",
            &format!("afpacket:{}", vo.0),
            "--chain",
            "forward",
            "--cores",
            "1",
            "--no-pin",
        ]);
        let id = wait_prog(&vi.0);
        wait_marker(&id);
        let pid = fp.pid().to_string();
        must(&["kill", "-INT", &pid]);
        std::thread::sleep(Duration::from_millis(2));
        let out = fp.signal_and_wait("-INT");
        let err = String::from_utf8_lossy(&out.stderr);
        match out.status.code() {
            Some(1) => {
                // 1 removed, or 0 if the first signal's stop had already removed it.
                assert!(err.contains("second signal: exiting now ("), "{err}");
                second += 1;
            }
            Some(0) => clean += 1,
            c => panic!("exit {c:?}: {err}"),
        }
        assert_eq!(xdp_prog(&vi.0), None, "{err}");
        let left = std::fs::read_dir("/run/flowplane")
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().ends_with(&format!("-{id}")));
        assert!(!left, "the run's record of program {id} is removed");
    }
    assert!(second > 0, "the second signal never arrived while stopping ({clean} clean stops)");
}

/// A re-created input that cannot be re-attached (the queue is gone: one RX queue where
/// there were two) stops the run: one line naming the port, a non-zero exit, no program left.
#[test]
fn afxdp_recreated_input_without_its_queue_stops_the_run() {
    let vo = Veth::new("q");
    let name = format!("flz{}", std::process::id() % 100_000);
    let mk = |q: &str| {
        let _ = sh(&["ip", "link", "del", &name]);
        let p = format!("{name}p");
        must(&["ip", "link", "add", &name, "numrxqueues", q, "numtxqueues", q, "type", "veth", "peer", "name", &p]);
        must(&["ip", "link", "set", &name, "up"]);
        must(&["ip", "link", "set", &p, "up"]);
    };
    let _guard = Veth(name.clone(), 2);
    mk("2");
    let pi = format!("afxdp:{name}:1");
    let mut fp = Proc::spawn(&[
        "run",
        "--input",
        &pi,
        "--output",
        &format!("afpacket:{}", vo.0),
        "--chain",
        "forward",
        "--cores",
        "1",
        "--no-pin",
    ]);
    wait_prog(&name);
    must(&["ip", "link", "del", &name]);
    mk("1");
    let t0 = Instant::now();
    while fp.running() {
        assert!(t0.elapsed() < Duration::from_secs(5), "the run went on without its input queue");
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = fp.signal_and_wait("-INT");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let last = err.lines().last().unwrap_or("");
    assert!(
        last.starts_with(&format!("flowplane: error: {pi}: cannot re-attach to the re-created interface: ")),
        "{err}"
    );
    assert_eq!(xdp_prog(&name), None);
}

/// Issue 31: both metrics formats pass outside checkers (promtool, the reference OpenMetrics
/// parser) and agree with the final report (see `ports_common::check_metrics`).
#[test]
fn metrics_pass_promtool_in_both_formats_and_match_the_report() {
    ports_common::check_metrics("afpacket", 19_561);
}
