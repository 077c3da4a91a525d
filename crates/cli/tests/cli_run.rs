//! `flowplane run` end to end: the JSON report, agreement of the four executors, the output pcap as
//! tshark sees it, NF state export, pcap input, multi-core runs, and `flowplane nfs`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::Value;

/// The chain of FAJITA's evaluation, with a limiter that never drops at these packet counts.
const CHAIN: &str = "lb -> fsc -> ratelimit(pps=1000000)";

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_flowplane"))
}

/// A fresh directory per call: tests run in parallel and several processes may share temp_dir.
fn tmpdir(name: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("flowplane-qa-run-{}-{n}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("spawn flowplane")
}

/// Runs `flowplane` expecting success and one JSON document on stdout.
fn run_json(args: &[&str]) -> Value {
    let out = run(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "flowplane {args:?} failed ({:?}): {err}", out.status.code());
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("stdout of {args:?} is not one JSON document ({e}): {}", String::from_utf8_lossy(&out.stdout))
    })
}

fn u(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("'{key}' is not an unsigned integer in {v}"))
}

fn f(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("'{key}' is not a number in {v}"))
}

/// The report's NF entry called `name`.
fn nf<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["nfs"]
        .as_array()
        .and_then(|a| a.iter().find(|n| n["name"] == name))
        .unwrap_or_else(|| panic!("no NF '{name}' in {}", report["nfs"]))
}

/// Per-NF counters are consistent: each NF forwards or drops what it got, and the next NF gets
/// what the previous one forwarded.
fn check_nf_chain(report: &Value, names: &[&str]) {
    let nfs = report["nfs"].as_array().expect("nfs array");
    let got: Vec<&str> = nfs.iter().map(|n| n["name"].as_str().unwrap_or("?")).collect();
    assert_eq!(got, names, "NFs in chain order");
    let mut expect_in = u(report, "packets");
    for n in nfs {
        let (pin, pout, drop) = (u(n, "packets_in"), u(n, "packets_out"), u(n, "dropped"));
        assert_eq!(pin, expect_in, "packets_in of {n}");
        assert_eq!(pin, pout + drop, "in = out + dropped for {n}");
        expect_in = pout;
    }
    assert_eq!(u(report, "packets_out") + u(report, "dropped"), u(report, "packets"), "report totals");
    assert_eq!(u(report, "packets_out"), expect_in, "the report's packets_out is the last NF's");
}

#[test]
fn json_report_has_the_contract_keys() {
    let r = run_json(&["run", "--gen", "--flows 1000 --packets 20000", "--chain", CHAIN, "--cores", "1", "--json"]);
    assert_eq!(u(&r, "packets"), 20_000);
    assert!(f(&r, "mpps") > 0.0, "mpps {}", r["mpps"]);
    assert!(f(&r, "cycles_per_packet") > 0.0, "cycles_per_packet {}", r["cycles_per_packet"]);
    assert!(f(&r, "duration_s") > 0.0, "duration_s {}", r["duration_s"]);
    let cores = r["per_core"].as_array().expect("per_core array");
    assert_eq!(cores.len(), 1);
    assert_eq!(u(&cores[0], "packets"), 20_000);
    check_nf_chain(&r, &["lb", "fsc", "ratelimit"]);
    assert_eq!(u(nf(&r, "ratelimit"), "dropped"), 0, "1 Mpps per flow never limits 20 packets per flow");
    let lat = &r["latency"];
    let (p50, p99, p999) = (u(lat, "p50_cycles"), u(lat, "p99_cycles"), u(lat, "p999_cycles"));
    assert!(p50 > 0 && p50 <= p99 && p99 <= p999, "latency percentiles {lat}");
    assert!(f(lat, "p50_ns") > 0.0 && f(lat, "p50_ns") <= f(lat, "p999_ns"), "latency ns {lat}");
    let t = &r["tables"];
    assert_eq!(u(t, "flows"), 1000, "one aggregated entry per flow: {t}");
    assert_eq!(u(t, "insertions"), 1000, "{t}");
    assert_eq!(u(t, "table_full"), 0, "{t}");
    assert!(u(t, "capacity") >= 1000, "{t}");
}

/// Export rows reduced to the time-independent columns, sorted.
fn flow_rows(path: &Path) -> Vec<String> {
    let v: Value = serde_json::from_slice(&std::fs::read(path).expect("export written")).expect("export is JSON");
    let mut rows: Vec<String> = v
        .as_array()
        .expect("export is a JSON array")
        .iter()
        .map(|r| {
            format!(
                "{} {} {} {} {} {} {}",
                r["proto"], r["src"], r["dst"], r["sport"], r["dport"], r["packets"], r["bytes"]
            )
        })
        .collect();
    rows.sort();
    rows
}

/// Runs `chain` on the same generated traffic under each executor, with fsc's table exported;
/// asserts that the per-NF counters and the exported table agree, and returns batch's report and rows.
fn executors_agree(chain: &str, gen: &str, tag: &str) -> (Value, Vec<String>) {
    let dir = tmpdir(tag);
    let mut first: Option<(Value, Vec<Value>, Value, Vec<String>)> = None;
    for exec in ["batch", "rtc", "pernf", "microbatch"] {
        let export = dir.join(format!("fsc-{exec}.json"));
        let export_arg = format!("fsc={}", s(&export));
        let r = run_json(&[
            "run",
            "--gen",
            gen,
            "--chain",
            chain,
            "--cores",
            "1",
            "--exec",
            exec,
            "--export",
            &export_arg,
            "--json",
        ]);
        assert_eq!(r["exec"], exec);
        let rows = flow_rows(&export);
        let counters: Vec<Value> = r["nfs"]
            .as_array()
            .expect("nfs")
            .iter()
            .map(|n| serde_json::json!([n["name"], n["packets_in"], n["packets_out"], n["dropped"], n["bytes_in"]]))
            .collect();
        // tables.flows is not compared: pernf keeps one table per stateful NF, so it counts each flow
        // once per NF.
        let table = serde_json::json!([r["tables"]["table_full"], r["packets_out"], r["dropped"]]);
        match &first {
            None => first = Some((r, counters, table, rows)),
            Some((_, c0, t0, rows0)) => {
                assert_eq!(&counters, c0, "{chain}: {exec}: per-NF counters differ from batch");
                assert_eq!(&table, t0, "{chain}: {exec}: table figures differ from batch");
                assert!(
                    &rows == rows0,
                    "{chain}: {exec}: exported fsc table differs from batch's ({} rows vs {})",
                    rows.len(),
                    rows0.len()
                );
            }
        }
    }
    let (r, _, _, rows) = first.expect("four runs");
    (r, rows)
}

/// The packets column of a [`flow_rows`] line.
fn row_packets(line: &str) -> u64 {
    line.split(' ').nth(5).and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("packets in {line:?}"))
}

#[test]
fn every_executor_gives_the_same_counters_and_state() {
    // burst=3 at 1 packet/s: each flow passes exactly its first 3 packets within a run this short,
    // so the limiter's verdicts are deterministic and differ per flow.
    let (r, rows) =
        executors_agree("lb -> fsc -> ratelimit(pps=1, burst=3)", "--flows 500 --packets 10000 --seed 3", "execs");
    assert_eq!(u(&r, "packets"), 10_000);
    check_nf_chain(&r, &["lb", "fsc", "ratelimit"]);
    assert_eq!(rows.len(), 500, "one fsc row per flow");
    assert_eq!(rows.iter().map(|l| row_packets(l)).sum::<u64>(), 10_000, "fsc rows count every packet");
    let passed: u64 = rows.iter().map(|l| row_packets(l).min(3)).sum();
    assert_eq!(u(nf(&r, "ratelimit"), "packets_out"), passed, "3 packets per flow pass");
}

#[test]
fn executors_agree_when_an_nf_upstream_of_fsc_drops_flows() {
    // The ACL drops every flow to UDP port 80 before fsc: fsc never sees them, so it must not
    // export them (whatever the executor's table layout).
    let (r, rows) = executors_agree(
        "acl(rule=drop:udp:any:any:any:80) -> fsc",
        "--flows 500 --packets 10000 --seed 3",
        "execs-acl",
    );
    check_nf_chain(&r, &["acl", "fsc"]);
    assert!(u(nf(&r, "acl"), "dropped") > 0, "the generator makes flows to port 80");
    assert_eq!(rows.iter().map(|l| row_packets(l)).sum::<u64>(), u(nf(&r, "fsc"), "packets_in"));
    let unseen: Vec<&String> = rows.iter().filter(|l| row_packets(l) == 0).collect();
    assert!(unseen.is_empty(), "{} fsc rows for flows fsc never saw, e.g. {:?}", unseen.len(), unseen.first());
}

#[test]
fn exporting_one_nf_to_csv_and_json_writes_each_flow_once() {
    let dir = tmpdir("twice");
    let (csv, json) = (dir.join("f.csv"), dir.join("f.json"));
    let (a, b) = (format!("fsc={}", s(&csv)), format!("fsc={}", s(&json)));
    let r = run_json(&[
        "run",
        "--gen",
        "--flows 50 --packets 1000",
        "--chain",
        "lb -> fsc",
        "--cores",
        "1",
        "--export",
        &a,
        "--export",
        &b,
        "--json",
    ]);
    assert_eq!(u(&r["tables"], "flows"), 50);
    let rows = flow_rows(&json);
    assert_eq!(rows.len(), 50, "JSON export: one row per flow");
    assert_eq!(rows.iter().map(|l| row_packets(l)).sum::<u64>(), 1000);
    let text = std::fs::read_to_string(&csv).expect("csv");
    assert_eq!(text.lines().count(), 51, "CSV export: header + one row per flow");
}

/// Reads `fields` of every packet of `pcap` with tshark's checksum validation on; `None` (test
/// passes vacuously) only when FLOWPLANE_SKIP_TSHARK=1 and tshark is missing.
fn tshark_fields(pcap: &Path, fields: &[&str]) -> Option<Vec<Vec<String>>> {
    const TSHARK: &str = "/usr/bin/tshark";
    if !Path::new(TSHARK).exists() {
        if std::env::var("FLOWPLANE_SKIP_TSHARK").as_deref() == Ok("1") {
            eprintln!("tshark missing: skipped (FLOWPLANE_SKIP_TSHARK=1)");
            return None;
        }
        panic!("{TSHARK} not found: install it (apt-get install -y tshark) or set FLOWPLANE_SKIP_TSHARK=1");
    }
    let mut cmd = Command::new(TSHARK);
    cmd.args(["-n", "-r", s(pcap)])
        .args(["-o", "ip.check_checksum:TRUE", "-o", "tcp.check_checksum:TRUE", "-o", "udp.check_checksum:TRUE"])
        // Payloads are synthetic: decode every port as raw data so that, e.g., a generated flow to
        // port 53 or 123 is not reported as a malformed DNS/NTP message.
        .args(["-d", "udp.port==0-65535,data", "-d", "tcp.port==0-65535,data"])
        .args(["-T", "fields", "-E", "separator=|", "-E", "occurrence=a", "-E", "aggregator=,"]);
    for f in fields {
        cmd.args(["-e", f]);
    }
    let out = cmd.output().expect("spawn tshark");
    assert!(out.status.success(), "tshark failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).expect("tshark prints UTF-8");
    Some(text.lines().map(|l| l.split('|').map(str::to_string).collect()).collect())
}

#[test]
fn output_pcap_is_valid_for_tshark_and_rewritten_by_lb() {
    for proto in ["udp", "tcp"] {
        let dir = tmpdir(&format!("out-{proto}"));
        let out = dir.join("out.pcap");
        let gen = format!("--flows 300 --packets 5000 --proto {proto} --seed 5");
        let r = run_json(&["run", "--gen", &gen, "--chain", CHAIN, "--cores", "1", "--output", s(&out), "--json"]);
        let sent = u(&r, "packets_out");
        assert_eq!(sent, 5000, "{proto}: nothing limited");
        let fields = [
            "ip.dst",
            "ip.checksum.status",
            "udp.checksum.status",
            "tcp.checksum.status",
            "_ws.malformed",
            "_ws.expert.severity",
        ];
        let Some(rows) = tshark_fields(&out, &fields) else { return };
        assert_eq!(rows.len() as u64, sent, "{proto}: tshark's packet count");
        for (i, row) in rows.iter().enumerate() {
            assert_eq!(row.len(), fields.len(), "{proto}: packet {}: {row:?}", i + 1);
            let dst: std::net::Ipv4Addr =
                row[0].parse().unwrap_or_else(|_| panic!("{proto}: packet {}: ip.dst {row:?}", i + 1));
            assert_eq!(dst.octets()[..3], [10, 10, 0], "{proto}: packet {}: dst not in the backend pool", i + 1);
            // Wireshark's checksum status: 0 bad, 1 good, 2 unverified, 3 not present; with validation on,
            // every checksum must be present and good.
            let l4 = if proto == "udp" { &row[2] } else { &row[3] };
            for (what, st) in [("ip", &row[1]), (proto, l4)] {
                assert!(st == "1", "{proto}: packet {}: {what} checksum status {st:?} in {row:?}", i + 1);
            }
            assert!(row[4].is_empty(), "{proto}: packet {}: malformed: {row:?}", i + 1);
            // Expert severities: chat 0x200000 and note 0x400000 are fine (a SYN is "chat"); warning/error are not.
            for sev in row[5].split(',').filter(|x| !x.is_empty()) {
                let v = sev.parse::<u64>().ok().or_else(|| u64::from_str_radix(sev.trim_start_matches("0x"), 16).ok());
                assert!(
                    v.is_some_and(|v| v < 0x0060_0000),
                    "{proto}: packet {}: expert severity {sev} in {row:?}",
                    i + 1
                );
            }
        }
    }
}

#[test]
fn csv_export_has_the_columns_and_counts_every_packet() {
    let dir = tmpdir("csv");
    let csv = dir.join("flows.csv");
    let export = format!("fsc={}", s(&csv));
    let r = run_json(&[
        "run",
        "--gen",
        "--flows 1000 --packets 20000",
        "--chain",
        CHAIN,
        "--cores",
        "1",
        "--export",
        &export,
        "--json",
    ]);
    let text = std::fs::read_to_string(&csv).expect("csv written");
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("a header line").split(',').collect();
    for col in ["proto", "src", "dst", "sport", "dport", "packets", "bytes"] {
        assert!(header.contains(&col), "column {col} missing from {header:?}");
    }
    let idx = |c: &str| header.iter().position(|h| *h == c).expect("column");
    let (pk, by) = (idx("packets"), idx("bytes"));
    let mut packets = 0u64;
    let mut rows = 0u64;
    for l in lines {
        let cells: Vec<&str> = l.split(',').collect();
        assert_eq!(cells.len(), header.len(), "row {l:?}");
        packets += cells[pk].parse::<u64>().unwrap_or_else(|_| panic!("packets cell in {l:?}"));
        assert!(cells[by].parse::<u64>().is_ok_and(|b| b >= 60), "bytes cell in {l:?}");
        let src: Result<std::net::IpAddr, _> = cells[idx("src")].parse();
        assert!(src.is_ok(), "src cell in {l:?}");
        rows += 1;
    }
    assert_eq!(packets, u(nf(&r, "fsc"), "packets_in"), "packet column sums to fsc's packets_in");
    assert_eq!(rows, 1000, "one row per flow");
}

#[test]
fn runs_a_pcap_written_by_gen() {
    let dir = tmpdir("input");
    let pcap = dir.join("t.pcap");
    let out = run(&["gen", "--flows", "200", "--packets", "3000", "--proto", "tcp", "--seed", "9", "-o", s(&pcap)]);
    assert!(out.status.success(), "gen: {}", String::from_utf8_lossy(&out.stderr));
    let r = run_json(&["run", "--input", s(&pcap), "--chain", CHAIN, "--cores", "1", "--json"]);
    assert_eq!(u(&r, "packets"), 3000);
    assert_eq!(u(&r["load"], "packets"), 3000, "load stats {}", r["load"]);
    check_nf_chain(&r, &["lb", "fsc", "ratelimit"]);
    assert_eq!(u(&r["tables"], "flows"), u(&r["tables"], "insertions"));
    assert!(u(&r["tables"], "flows") <= 200);
}

/// An Ethernet/IPv4/UDP frame with valid checksums, built independently of flowplane's own builders.
fn udp_frame(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    fn csum(words: &[u8]) -> u16 {
        let mut acc: u32 = 0;
        for c in words.chunks(2) {
            acc += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
        }
        while acc > 0xffff {
            acc = (acc & 0xffff) + (acc >> 16);
        }
        !(acc as u16)
    }
    let udp_len = 8 + payload.len() as u16;
    let mut f = vec![0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2, 0x08, 0x00];
    let ip_start = f.len();
    f.extend_from_slice(&[0x45, 0, 0, 0, 0, 1, 0x40, 0, 64, 17, 0, 0]);
    f[ip_start + 2..ip_start + 4].copy_from_slice(&(20 + udp_len).to_be_bytes());
    f.extend_from_slice(&src);
    f.extend_from_slice(&dst);
    let c = csum(&f[ip_start..ip_start + 20]);
    f[ip_start + 10..ip_start + 12].copy_from_slice(&c.to_be_bytes());
    let mut udp = Vec::new();
    udp.extend_from_slice(&sport.to_be_bytes());
    udp.extend_from_slice(&dport.to_be_bytes());
    udp.extend_from_slice(&udp_len.to_be_bytes());
    udp.extend_from_slice(&[0, 0]);
    udp.extend_from_slice(payload);
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&src);
    pseudo.extend_from_slice(&dst);
    pseudo.extend_from_slice(&[0, 17]);
    pseudo.extend_from_slice(&udp_len.to_be_bytes());
    pseudo.extend_from_slice(&udp);
    let c = match csum(&pseudo) {
        0 => 0xffff,
        c => c,
    };
    udp[6..8].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&udp);
    f
}

#[test]
fn runs_a_handwritten_pcap_and_counts_flows_exactly() {
    use flowplane_trace::{PcapWriter, WriterOptions};
    let dir = tmpdir("handpcap");
    let pcap = dir.join("three.pcap");
    let out = dir.join("out.pcap");
    let csv = dir.join("flows.csv");
    let mut w = PcapWriter::create(&pcap, WriterOptions::default()).expect("create pcap");
    // Two flows: A sends 3 packets, B sends 2; the limiter lets 2 per flow through.
    let a = udp_frame([192, 168, 1, 1], [198, 51, 100, 1], 1000, 53, &[0xab; 18]);
    let b = udp_frame([192, 168, 1, 2], [198, 51, 100, 1], 2000, 53, &[0xcd; 30]);
    for (i, fr) in [&a, &b, &a, &a, &b].iter().enumerate() {
        w.write_packet(1_000 * i as u64, fr, fr.len() as u32).expect("write packet");
    }
    w.finish().expect("finish pcap");
    let export = format!("fsc={}", s(&csv));
    let r = run_json(&[
        "run",
        "--input",
        s(&pcap),
        "--chain",
        "lb(backends=4) -> fsc -> ratelimit(pps=1, burst=2)",
        "--cores",
        "1",
        "--output",
        s(&out),
        "--export",
        &export,
        "--json",
    ]);
    assert_eq!(u(&r, "packets"), 5);
    assert_eq!(u(&r, "bytes"), (3 * a.len() + 2 * b.len()) as u64);
    check_nf_chain(&r, &["lb", "fsc", "ratelimit"]);
    assert_eq!(u(nf(&r, "ratelimit"), "dropped"), 1, "the third packet of flow A is limited");
    assert_eq!(u(&r["tables"], "flows"), 2);
    let text = std::fs::read_to_string(&csv).expect("csv");
    let mut rows: Vec<&str> = text.lines().skip(1).collect();
    rows.sort();
    assert_eq!(rows.len(), 2, "{text}");
    assert!(rows[0].contains("192.168.1.1") && rows[0].contains(",1000,53,3,"), "{text}");
    assert!(rows[1].contains("192.168.1.2") && rows[1].contains(",2000,53,2,"), "{text}");
    if let Some(pk) = tshark_fields(&out, &["ip.dst", "ip.checksum.status", "udp.checksum.status", "udp.dstport"]) {
        assert_eq!(pk.len(), 4);
        for row in &pk {
            assert!(["10.10.0.1", "10.10.0.2", "10.10.0.3", "10.10.0.4"].contains(&row[0].as_str()), "{row:?}");
            assert_eq!((row[1].as_str(), row[2].as_str(), row[3].as_str()), ("1", "1", "53"), "{row:?}");
        }
        // Round robin: the two flows went to two different backends, each sticky.
        let mut per_backend: BTreeMap<&str, usize> = BTreeMap::new();
        for row in &pk {
            *per_backend.entry(row[0].as_str()).or_default() += 1;
        }
        assert_eq!(per_backend.len(), 2, "{per_backend:?}");
    }
}

#[test]
fn two_cores_process_every_packet() {
    let r = run_json(&["run", "--gen", "--flows 1000 --packets 20000", "--chain", CHAIN, "--cores", "2", "--json"]);
    assert_eq!(u(&r, "packets"), 20_000);
    assert_eq!(u(&r, "cores"), 2);
    let cores = r["per_core"].as_array().expect("per_core");
    assert_eq!(cores.len(), 2);
    let sum: u64 = cores.iter().map(|c| u(c, "packets")).sum();
    assert_eq!(sum, 20_000, "per-core packets add up: {cores:?}");
    assert!(cores.iter().all(|c| u(c, "packets") > 0), "RSS spreads 1000 flows over both cores: {cores:?}");
    check_nf_chain(&r, &["lb", "fsc", "ratelimit"]);
    // RSS keeps each flow on one core: one table entry per flow over both cores.
    assert_eq!(u(&r["tables"], "flows"), 1000);
}

#[test]
fn nfs_lists_the_library_with_parameters() {
    let out = run(&["nfs"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let names: Vec<&str> =
        text.lines().filter(|l| !l.starts_with(' ')).filter_map(|l| l.split_whitespace().next()).collect();
    for n in ["lb", "fsc", "ratelimit"] {
        assert!(names.contains(&n), "'{n}' not listed in:\n{text}");
    }
    // Each NF's parameters follow its line.
    let params_of = |nf: &str| -> Vec<String> {
        text.lines()
            .skip_while(|l| l.split_whitespace().next() != Some(nf))
            .skip(1)
            .take_while(|l| l.starts_with(' '))
            .filter(|l| !l.trim_start().starts_with("handlers:"))
            .filter_map(|l| l.split_whitespace().next().map(|p| p.trim_end_matches(':').to_string()))
            .collect()
    };
    // Each NF's handlers: what ctl reads and changes while it runs.
    let handlers_of = |nf: &str| -> String {
        text.lines()
            .skip_while(|l| l.split_whitespace().next() != Some(nf))
            .skip(1)
            .take_while(|l| l.starts_with(' '))
            .find(|l| l.trim_start().starts_with("handlers:"))
            .unwrap_or("")
            .to_string()
    };
    let acl = handlers_of("acl");
    assert!(
        acl.contains("per-key state (ctl show flow") && acl.contains("set rules, rule, default; load FILE (rules)"),
        "{acl}"
    );
    assert!(handlers_of("route").contains("set routes, miss; load FILE (routes)"), "{text}");
    assert!(handlers_of("nat").contains("set external, addrs") && !handlers_of("nat").contains("load"), "{text}");
    assert!(
        handlers_of("count").contains("set nothing (fixed for the run)") && !handlers_of("count").contains("state")
    );
    assert_eq!(
        params_of("lb"),
        ["backends", "base", "base6", "backends6", "mode", "backends_file"],
        "lb params in:\n{text}"
    );
    assert_eq!(params_of("ratelimit"), ["pps", "burst"], "ratelimit params in:\n{text}");
    // What each NF is keyed by, on its line; each parameter with type, range and default.
    let line_of = |nf: &str| text.lines().find(|l| l.split_whitespace().next() == Some(nf)).unwrap_or("");
    assert!(line_of("srcctr").contains("keyed by src-ip"), "{text}");
    assert!(line_of("policer").contains("keyed by dst-ip"), "{text}");
    assert!(line_of("keyctr").contains("keyed by param key"), "{text}");
    assert!(line_of("count").contains("(stateless)"), "{text}");
    // Issue 35: amf keeps its UE contexts in its own table (the README's "UE id"), not "stateless".
    assert!(line_of("amf").contains("keyed by UE id (own table)"), "{text}");
    assert!(text.contains("window  float [0.001, 86400]  default 10 "), "{text}");

    let out = run(&["nfs", "--json"]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("nfs --json is JSON");
    let nfs = v.as_array().expect("an array of NFs");
    let psd = nfs.iter().find(|n| n["name"] == "psd").expect("psd listed");
    assert_eq!(psd["keyed_by"], "src-ip");
    assert_eq!(psd["params"][0]["name"], "window");
    assert_eq!(psd["params"][0]["default"], 10.0);
    assert_eq!(psd["params"][0]["min"], 0.001);
    assert_eq!(psd["handlers"]["set"], serde_json::json!(["window", "ports", "action", "tcp"]), "{psd}");
    let lb = nfs.iter().find(|n| n["name"] == "lb").expect("lb listed");
    assert_eq!(
        (lb["handlers"]["load"].as_str(), &lb["handlers"]["read"][2]),
        (Some("backends_file"), &serde_json::json!("state"))
    );
    let out = run(&["nfs", "nat"]);
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().filter(|l| !l.starts_with(' ')).count(), 1);
    let out = run(&["nfs", "nope"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown NF 'nope'"));
}

#[test]
fn run_help_exits_zero() {
    let out = run(&["run", "--help"]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    for opt in ["--input", "--gen", "--output", "--chain", "--cores", "--exec", "--json", "--export"] {
        assert!(text.contains(opt), "{opt} missing from run --help");
    }
}

/// The BRIEF's contract: `flowplane run` with no arguments runs the default
/// demo (generated 64-B trace, 1M flows, lb -> fsc -> ratelimit, all cores).
#[test]
fn run_without_arguments_runs_the_default_demo() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_flowplane")).arg("run").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("lb(backends=16) -> fsc -> ratelimit(pps=1000)"), "{stdout}");
    assert!(stdout.contains("loaded       4000000 packets"), "{stdout}");
    assert!(stdout.contains("flow table   1000000 flows"), "{stdout}");
}

/// Every NF's `--export` writes what the NF holds, or the run refuses it up
/// front (exit 2, one line, no file); count, keyctr, lb and hh export.
#[test]
fn every_nf_export_is_written_or_refused() {
    let dir = tmpdir("exports");
    let out = run(&["nfs", "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).expect("nfs --json");
    let names: Vec<String> =
        v.as_array().expect("NFs").iter().map(|n| n["name"].as_str().expect("name").to_string()).collect();
    let mut written = Vec::new();
    for name in &names {
        let chain = match name.as_str() {
            "synthetic" => "synthetic(mem=65536)".to_string(),
            "hh" => "hh(k=3)".to_string(),
            "route" => {
                let routes = dir.join("routes.txt");
                std::fs::write(&routes, "0.0.0.0/0 1\n::/0 2\n").expect("route file");
                format!("route(routes={})", s(&routes))
            }
            n => n.to_string(),
        };
        let file = dir.join(format!("{name}.csv"));
        let export = format!("{name}={}", s(&file));
        let out =
            run(&["run", "--gen", "--flows 50 --packets 2000", "--cores", "1", "--chain", &chain, "--export", &export]);
        let err = String::from_utf8_lossy(&out.stderr);
        match out.status.code() {
            Some(0) => {
                let text = std::fs::read_to_string(&file).expect("export written");
                let lines: Vec<&str> = text.lines().collect();
                assert!(lines.len() >= 2, "{name}: header and at least one row:\n{text}");
                if name == "hh" {
                    assert_eq!(lines.len(), 4, "hh(k=3) exports its top 3:\n{text}");
                }
                if name == "count" {
                    assert_eq!(lines, ["packets,bytes", "2000,128000"], "count exports its totals");
                }
                written.push(name.as_str());
            }
            Some(2) => {
                assert_eq!(err.lines().count(), 1, "{name}: {err}");
                assert!(err.contains(&format!("--export {name}: {name} has no state to export")), "{name}: {err}");
                assert!(!file.exists(), "{name}: a refused export writes no file");
            }
            c => panic!("{name}: exit {c:?}: {err}"),
        }
    }
    for must in ["count", "keyctr", "lb", "hh", "fsc", "nat", "srcctr"] {
        assert!(written.contains(&must), "{must} exports (exported: {written:?})");
    }
}

/// Issue 35 item 2: every JSON report says where it comes from (version and commit, CPU, cores,
/// kernel, the command as its arguments, the date); `--version` names the commit too.
#[test]
fn json_reports_carry_their_provenance() {
    let bin = env!("CARGO_BIN_EXE_flowplane");
    for args in [
        &["run", "--gen", "--flows 10 --packets 100", "--chain", "fsc", "--cores", "1", "--json"][..],
        &["bench", "io", "--quick", "--json"][..],
    ] {
        let o = std::process::Command::new(bin).args(args).output().unwrap();
        assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let p = &v["provenance"];
        assert_eq!(p["flowplane"], env!("CARGO_PKG_VERSION"), "{args:?}: {p}");
        assert!(p["commit"].as_str().is_some_and(|c| !c.is_empty()), "{p}");
        assert!(p["cores_available"].as_u64().unwrap() >= 1 && p["tsc_ghz"].as_f64().unwrap() > 0.0, "{p}");
        assert!(p["kernel"].as_str().is_some_and(|k| !k.is_empty()), "{p}");
        let cmd: Vec<&str> = p["command"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
        assert_eq!(&cmd[1..], args, "the command as its arguments");
        let date = p["date"].as_str().unwrap();
        assert!(date.len() == 20 && date.starts_with("20") && date.ends_with('Z'), "{date}");
    }
    let o = std::process::Command::new(bin).arg("--version").output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.starts_with(&format!("flowplane {} (", env!("CARGO_PKG_VERSION"))), "{text}");
}
