//! IPFIX export (issue 34) checked by collectors flowplane did not write:
//! nfdump's `nfcapd` receives the UDP datagrams of `run --ipfix` and
//! `nfdump` dumps them (flows, packets and bytes must equal fsc's own
//! `--export` of the same run), tshark's CFLOW dissector reads the same
//! messages (written with `--ipfix file:`) wrapped in a pcap and must find
//! no malformed packet. The TCP transport and the active timeout's deltas
//! are checked through nfdump too (a flow's records sum to its export). nfcapd or tshark missing (not Debian's `nfdump`/`tshark`):
//! those checks print why and are skipped.

use std::collections::HashMap;
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn tmpdir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("flowplane-ipfix-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

fn flowplane(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flowplane")).args(args).output().expect("spawn flowplane")
}

fn ok(o: &Output, what: &str) -> String {
    assert!(o.status.success(), "{what}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn have(tool: &str) -> bool {
    let found = Command::new(tool).arg("-h").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok();
    if !found {
        eprintln!("SKIPPED: {tool} not installed (Debian package nfdump / tshark)");
    }
    found
}

/// `nfcapd` on 127.0.0.1:`port` writing into `dir`; stopped (SIGTERM: it flushes and closes its file) by `stop`.
struct Nfcapd(Child);

impl Nfcapd {
    fn start(port: u16, dir: &Path) -> Nfcapd {
        let c = Command::new("nfcapd")
            .args(["-b", "127.0.0.1", "-p", &port.to_string(), "-w", s(dir), "-t", "3600"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn nfcapd");
        // Listening once the port cannot be bound any more.
        let t0 = Instant::now();
        while UdpSocket::bind(("127.0.0.1", port)).is_ok() {
            assert!(t0.elapsed() < Duration::from_secs(5), "nfcapd did not open port {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
        Nfcapd(c)
    }

    fn stop(mut self) {
        // Datagrams already sent may still wait in the socket: a moment to read them.
        std::thread::sleep(Duration::from_millis(300));
        let pid = self.0.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().expect("kill");
        let t0 = Instant::now();
        while self.0.try_wait().expect("wait").is_none() {
            assert!(t0.elapsed() < Duration::from_secs(5), "nfcapd did not stop");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Nfcapd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

type Key = (String, String, u64, u64, u64);

/// nfdump's records of `dir`, summed per 5-tuple here: key -> (records, packets, bytes).
fn nfdump(dir: &Path) -> HashMap<Key, (u64, u64, u64)> {
    let out = Command::new("nfdump").args(["-R", s(dir), "-o", "json"]).output().expect("run nfdump");
    let text = ok(&out, "nfdump");
    // (An empty dump is no array at all.)
    let text = if text.trim().is_empty() { "[]".to_string() } else { text };
    let rows: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("nfdump json: {e}: {text}"));
    let mut m = HashMap::new();
    for r in rows.as_array().expect("array") {
        let addr = |a: &str, b: &str| r[a].as_str().or(r[b].as_str()).expect("address").to_string();
        let key = (
            addr("src4_addr", "src6_addr"),
            addr("dst4_addr", "dst6_addr"),
            r["src_port"].as_u64().unwrap(),
            r["dst_port"].as_u64().unwrap(),
            r["proto"].as_u64().unwrap(),
        );
        let e = m.entry(key).or_insert((0, 0, 0));
        e.0 += 1;
        e.1 += r["in_packets"].as_u64().unwrap();
        e.2 += r["in_bytes"].as_u64().unwrap();
    }
    m
}

/// fsc's `--export` (JSON rows): key -> (packets, bytes).
fn fsc_export(path: &Path) -> HashMap<Key, (u64, u64)> {
    let rows: Value = serde_json::from_str(&std::fs::read_to_string(path).expect("read export")).expect("json");
    rows.as_array()
        .expect("array")
        .iter()
        .map(|r| {
            let key = (
                r["src"].as_str().unwrap().to_string(),
                r["dst"].as_str().unwrap().to_string(),
                r["sport"].as_u64().unwrap(),
                r["dport"].as_u64().unwrap(),
                r["proto"].as_u64().unwrap(),
            );
            (key, (r["packets"].as_u64().unwrap(), r["bytes"].as_u64().unwrap()))
        })
        .collect()
}

/// The messages of an IPFIX file, each as one UDP datagram to port 4739 in a pcap (for tshark).
fn messages_to_pcap(ipfix: &Path, pcap: &Path) -> usize {
    let b = std::fs::read(ipfix).expect("read ipfix file");
    let mut out = Vec::new();
    out.extend_from_slice(&0xa1b2c3d4u32.to_le_bytes());
    out.extend_from_slice(&[2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    out.extend_from_slice(&65535u32.to_le_bytes());
    out.extend_from_slice(&1u32.to_le_bytes()); // Ethernet
    let mut at = 0;
    let mut n = 0;
    while at < b.len() {
        let len = u16::from_be_bytes([b[at + 2], b[at + 3]]) as usize;
        let msg = &b[at..at + len];
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&[0x08, 0x00]);
        let ip_len = (20 + 8 + len) as u16;
        let mut ip = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0, 127, 0, 0, 1, 127, 0, 0, 1];
        ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
        let mut sum: u32 = ip.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], c[1]]))).sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        ip[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
        f.extend_from_slice(&ip);
        f.extend_from_slice(&40000u16.to_be_bytes());
        f.extend_from_slice(&4739u16.to_be_bytes());
        f.extend_from_slice(&((8 + len) as u16).to_be_bytes());
        f.extend_from_slice(&[0, 0]); // no UDP checksum (IPv4)
        f.extend_from_slice(msg);
        for v in [n as u32, 0, f.len() as u32, f.len() as u32] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&f);
        at += len;
        n += 1;
    }
    std::fs::write(pcap, out).expect("write pcap");
    n
}

/// tshark reads every message as CFLOW without a malformed packet or an error; returns the packets its flow records sum to.
fn tshark_packets(ipfix: &Path, dir: &Path) -> Option<u64> {
    if !have("tshark") {
        return None;
    }
    let pcap = dir.join("ipfix.pcap");
    let messages = messages_to_pcap(ipfix, &pcap);
    let d = ["-d", "udp.port==4739,cflow"];
    let bad = Command::new("tshark")
        .args(["-r", s(&pcap)])
        .args(d)
        .args(["-Y", "_ws.malformed || _ws.expert.severity >= error"])
        .output()
        .expect("tshark");
    let bad_lines = ok(&bad, "tshark");
    assert!(bad_lines.trim().is_empty(), "tshark finds malformed IPFIX: {bad_lines}");
    let f = Command::new("tshark")
        .args(["-r", s(&pcap)])
        .args(d)
        .args(["-Y", "cflow", "-T", "fields", "-e", "cflow.packets"])
        .output()
        .expect("tshark");
    let text = ok(&f, "tshark");
    assert_eq!(text.lines().count(), messages, "every message is dissected as CFLOW");
    Some(text.split([',', '\n']).filter(|v| !v.is_empty()).map(|v| v.parse::<u64>().expect("packets")).sum())
}

fn gen(dir: &Path, extra: &[&str]) -> PathBuf {
    let t = dir.join("t.pcap");
    let mut args = vec!["gen", "--flows", "300", "--packets", "3000", "--seed", "4", "-o", s(&t)];
    args.extend_from_slice(extra);
    ok(&flowplane(&args), "gen");
    t
}

fn report(out: &Output) -> Value {
    serde_json::from_str(&ok(out, "run")).expect("report json")
}

/// The issue's target: nfdump's dump of what nfcapd received equals fsc's export (flows, packets, bytes), IPv4
/// and IPv6, on one and two cores, fsc's state in per-core tables and (`--scale shared`) in the shared table;
/// tshark reads the same messages without a malformed one.
#[test]
fn fsc_records_through_nfcapd_equal_the_fsc_export_and_tshark_reads_them() {
    if !have("nfcapd") {
        return;
    }
    let cases = [(false, "2", "rss", 19_654), (true, "1", "rss", 19_655), (false, "2", "shared", 19_658)];
    for (i, (v6, cores, scale, port)) in cases.into_iter().enumerate() {
        let dir = tmpdir(&format!("fsc{i}"));
        let t = gen(&dir, if v6 { &["--ipv6"] } else { &[] });
        let col = dir.join("nfcapd");
        std::fs::create_dir_all(&col).unwrap();
        let cap = Nfcapd::start(port, &col);
        let (exp, file) = (dir.join("fsc.json"), dir.join("x.ipfix"));
        let udp = format!("udp:127.0.0.1:{port}");
        let file_arg = format!("file:{}", s(&file));
        let export = format!("fsc={}", s(&exp));
        let out = flowplane(&[
            "run",
            "--chain",
            "fsc",
            "--input",
            s(&t),
            "--cores",
            cores,
            "--scale",
            scale,
            "--ipfix",
            &udp,
            "--ipfix",
            &file_arg,
            "--export",
            &export,
            "--json",
        ]);
        let r = report(&out);
        cap.stop();
        let x = &r["ipfix"];
        assert_eq!((x["flow_records"].as_u64(), x["lost"].as_u64()), (Some(300), Some(0)), "{x}");
        let fsc = fsc_export(&exp);
        assert_eq!(fsc.len(), 300);
        let nf = nfdump(&col);
        assert_eq!(nf.len(), 300, "nfdump finds every flow once");
        for (k, (p, b)) in &fsc {
            assert_eq!(nf.get(k).map(|v| (v.0, v.1, v.2)), Some((1, *p, *b)), "flow {k:?}");
        }
        if let Some(p) = tshark_packets(&file, &dir) {
            assert_eq!(p, 3000);
        }
        // `ipfix read` decodes the same file: one line per flow, forced end (4) at the run's end.
        let text = ok(&flowplane(&["ipfix", "read", s(&file)]), "ipfix read");
        assert_eq!(text.lines().filter(|l| l.starts_with("flow ") && l.contains(" reason 4 ")).count(), 300);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// With an active timeout a flow sends several records whose counts are deltas: the sum of nfdump's records per
/// flow still equals fsc's export, and long flows were reported more than once. The same run's TCP stream carries
/// the same records.
#[test]
fn active_timeout_deltas_sum_to_the_export_over_udp_and_tcp() {
    if !have("nfcapd") {
        return;
    }
    let dir = tmpdir("active");
    // 3000 packets over 3 s of packet time: with a 0.5 s active timeout most flows are reported several times.
    let t = gen(&dir, &["--rate", "1000"]);
    let col = dir.join("nfcapd");
    std::fs::create_dir_all(&col).unwrap();
    let port = 19_656;
    let cap = Nfcapd::start(port, &col);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("tcp listener");
    let tcp_port = listener.local_addr().unwrap().port();
    let tcp = std::thread::spawn(move || {
        let (mut c, _) = listener.accept().expect("accept");
        let mut all = Vec::new();
        std::io::Read::read_to_end(&mut c, &mut all).expect("read stream");
        all
    });
    let exp = dir.join("fsc.json");
    let out = flowplane(&[
        "run",
        "--chain",
        "fsc",
        "--input",
        s(&t),
        "--ipfix",
        &format!("udp:127.0.0.1:{port}"),
        "--ipfix",
        &format!("tcp:127.0.0.1:{tcp_port}"),
        "--ipfix-active",
        "0.5",
        "--export",
        &format!("fsc={}", s(&exp)),
        "--json",
    ]);
    let r = report(&out);
    cap.stop();
    let records = r["ipfix"]["flow_records"].as_u64().unwrap();
    assert!(records > 600, "flows reported at active timeouts too: {}", r["ipfix"]);
    let fsc = fsc_export(&exp);
    let nf = nfdump(&col);
    assert_eq!(nf.len(), fsc.len());
    let mut multi = 0;
    for (k, (p, b)) in &fsc {
        let (n, np, nb) = nf[k];
        assert_eq!((np, nb), (*p, *b), "flow {k:?}: {n} records");
        multi += u64::from(n > 1);
    }
    assert!(multi > 100, "only {multi} flows had several records");
    assert_eq!(nf.values().map(|v| v.0).sum::<u64>(), records);
    // The TCP stream: the same records, decoded by `ipfix read`.
    let stream = tcp.join().expect("tcp thread");
    let sf = dir.join("tcp.ipfix");
    std::fs::write(&sf, stream).unwrap();
    let text = ok(&flowplane(&["ipfix", "read", s(&sf), "--json"]), "ipfix read");
    let (mut n, mut packets) = (0u64, 0u64);
    for l in text.lines() {
        let v: Value = serde_json::from_str(l).expect("json line");
        n += 1;
        packets += v["packets"].as_u64().unwrap();
    }
    assert_eq!((n, packets), (records, 3000));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_ipfix_options_are_one_line_errors() {
    for (args, want) in [
        (vec!["--ipfix", "udp:nohost"], "expected udp:HOST:PORT"),
        (vec!["--ipfix", "file:/nonexistent-dir/x"], "--ipfix file:/nonexistent-dir/x"),
        (vec!["--ipfix-active", "1"], "--ipfix-active needs --ipfix"),
        (vec!["--ipfix", "udp:127.0.0.1:19657", "--ipfix-active", "0"], "positive"),
    ] {
        let mut a = vec!["run", "--chain", "fsc", "--gen", "--flows 10 --packets 100"];
        a.extend_from_slice(&args);
        let o = flowplane(&a);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    // A chain without an NF that exports records.
    let o = flowplane(&["run", "--chain", "lb", "--gen", "--flows 10 --packets 100", "--ipfix", "udp:127.0.0.1:19657"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("no NF of the chain exports IPFIX"), "{err}");
    // A file that is not IPFIX.
    let dir = tmpdir("bad");
    let f = dir.join("junk");
    std::fs::write(&f, b"not ipfix at all, just bytes").unwrap();
    let o = flowplane(&["ipfix", "read", s(&f)]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// tshark's view of a pcap's UDP packets: (src, sport, dst, dport) of each.
fn udp_tuples(pcap: &Path) -> Option<Vec<(String, u64, String, u64)>> {
    if !have("tshark") {
        return None;
    }
    let f = ["-T", "fields", "-e", "ip.src", "-e", "udp.srcport", "-e", "ip.dst", "-e", "udp.dstport"];
    let out = Command::new("tshark").args(["-r", s(pcap), "-Y", "udp"]).args(f).output().expect("tshark");
    let text = ok(&out, "tshark");
    Some(
        text.lines()
            .map(|l| {
                let v: Vec<&str> = l.split('\t').collect();
                (v[0].to_string(), v[1].parse().unwrap(), v[2].to_string(), v[3].parse().unwrap())
            })
            .collect(),
    )
}

/// nat's RFC 8158 events: a create per mapping the report counts, each naming the translation the output pcap
/// shows (tshark) for a packet of its inside flow; a delete for every mapping that ended; the mappings live at
/// the end (creates without a delete) are exactly the export's rows; the exhausted pool is logged, at most once
/// per second per pool and core. tshark reads the messages without a malformed one.
#[test]
fn nat_events_match_the_nat_export_and_the_translated_pcap() {
    let dir = tmpdir("nat");
    // 200 UDP flows over 20 s of packet time through 2 x 25 ports with a 1 s timeout: mappings are reclaimed
    // when idle, the pool runs out now and then.
    let t = gen(&dir, &["--rate", "150"]);
    let (file, exp, o) = (dir.join("n.ipfix"), dir.join("nat.json"), dir.join("out.pcap"));
    let out = flowplane(&[
        "run",
        "--chain",
        "nat(ports=1024-1073,timeout=1)",
        "--input",
        s(&t),
        "--cores",
        "2",
        "--output",
        s(&o),
        "--ipfix",
        &format!("file:{}", s(&file)),
        "--export",
        &format!("nat={}", s(&exp)),
        "--json",
    ]);
    let r = report(&out);
    let nat = &r["nfs"][0]["details"];
    assert_eq!(r["ipfix"]["lost"].as_u64(), Some(0), "{}", r["ipfix"]);
    let text = ok(&flowplane(&["ipfix", "read", s(&file), "--json"]), "ipfix read");
    let ev: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).expect("json")).collect();
    let of = |e: u64| ev.iter().filter(move |v| v["event"].as_u64() == Some(e));
    let (creates, deletes) = (of(4).count() as u64, of(5).count() as u64);
    assert_eq!(creates, nat["mappings_created"].as_u64().unwrap(), "{nat}");
    assert!(deletes > 0 && nat["idle_mappings_reclaimed"].as_u64().unwrap() > 0, "{nat}");
    // Live at the end: created and not deleted (by session: inside tuple and translation) = the export's rows.
    let sess = |v: &Value| {
        (
            v["src"].as_str().unwrap().to_string(),
            v["sport"].as_u64().unwrap(),
            v["dst"].as_str().unwrap().to_string(),
            v["dport"].as_u64().unwrap(),
            v["post_src"].as_str().unwrap().to_string(),
            v["post_sport"].as_u64().unwrap(),
        )
    };
    let mut live: HashMap<_, i64> = HashMap::new();
    for v in &ev {
        match v["event"].as_u64() {
            Some(4) => *live.entry(sess(v)).or_default() += 1,
            Some(5) => *live.entry(sess(v)).or_default() -= 1,
            _ => {}
        }
    }
    assert!(live.values().all(|&n| n == 0 || n == 1), "a session deleted before created or created twice");
    let mut live: Vec<_> = live.into_iter().filter(|(_, n)| *n == 1).map(|(k, _)| k).collect();
    let rows: Value = serde_json::from_str(&std::fs::read_to_string(&exp).unwrap()).unwrap();
    let mut want: Vec<_> = rows
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["direction"] == "out")
        .map(|r| {
            (
                r["src"].as_str().unwrap().to_string(),
                r["sport"].as_u64().unwrap(),
                r["dst"].as_str().unwrap().to_string(),
                r["dport"].as_u64().unwrap(),
                r["translated_addr"].as_str().unwrap().to_string(),
                r["translated_port"].as_u64().unwrap(),
            )
        })
        .collect();
    live.sort();
    want.sort();
    assert_eq!(live, want);
    // Exhaustion is logged, rate-limited.
    let exhausted: Vec<u64> = of(3).map(|v| v["time_ms"].as_u64().unwrap()).collect();
    assert!(nat["dropped_pool_exhausted"].as_u64().unwrap() > 0 && !exhausted.is_empty());
    assert!(exhausted.len() as u64 <= 2 * 2 * 21, "{} exhausted events", exhausted.len());
    // The translated pcap (tshark): every create names a translation some output packet carries, and every
    // output packet's source is a translation some create named for its destination.
    if let Some(outp) = udp_tuples(&o) {
        let seen: std::collections::HashSet<_> = outp.iter().cloned().collect();
        for v in of(4) {
            let k = (
                v["post_src"].as_str().unwrap().to_string(),
                v["post_sport"].as_u64().unwrap(),
                v["dst"].as_str().unwrap().to_string(),
                v["dport"].as_u64().unwrap(),
            );
            assert!(seen.contains(&k), "create {v} has no translated packet");
        }
        let named: std::collections::HashSet<_> = of(4)
            .map(|v| {
                (
                    v["post_src"].as_str().unwrap().to_string(),
                    v["post_sport"].as_u64().unwrap(),
                    v["dst"].as_str().unwrap().to_string(),
                    v["dport"].as_u64().unwrap(),
                )
            })
            .collect();
        assert!(outp.iter().all(|k| named.contains(k)));
        assert_eq!(outp.len() as u64, nat["outbound_packets"].as_u64().unwrap());
    }
    if have("tshark") {
        let pcap = dir.join("ipfix.pcap");
        messages_to_pcap(&file, &pcap);
        let bad = Command::new("tshark")
            .args(["-r", s(&pcap), "-d", "udp.port==4739,cflow", "-Y", "_ws.malformed || _ws.expert.severity >= error"])
            .output()
            .expect("tshark");
        assert!(ok(&bad, "tshark").trim().is_empty());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `ipfix read udp:PORT` is a collector too: it prints every record a run sends, and stops at `--count`.
#[test]
fn ipfix_read_on_a_udp_port_prints_what_a_run_sends() {
    let dir = tmpdir("readudp");
    let t = gen(&dir, &[]);
    let port = 19_659;
    let reader = Command::new(env!("CARGO_BIN_EXE_flowplane"))
        .args(["ipfix", "read", &format!("udp:{port}"), "--json", "--count", "300", "--idle", "10"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ipfix read");
    let t0 = Instant::now();
    while UdpSocket::bind(("127.0.0.1", port)).is_ok() {
        assert!(t0.elapsed() < Duration::from_secs(5), "ipfix read did not open port {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let r = report(&flowplane(&[
        "run",
        "--chain",
        "fsc",
        "--input",
        s(&t),
        "--ipfix",
        &format!("udp:127.0.0.1:{port}"),
        "--json",
    ]));
    assert_eq!(r["ipfix"]["flow_records"].as_u64(), Some(300));
    let out = reader.wait_with_output().expect("ipfix read");
    let text = ok(&out, "ipfix read");
    let packets: u64 =
        text.lines().map(|l| serde_json::from_str::<Value>(l).expect("json")["packets"].as_u64().unwrap()).sum();
    assert_eq!((text.lines().count(), packets), (300, 3000));
    std::fs::remove_dir_all(&dir).unwrap();
}
