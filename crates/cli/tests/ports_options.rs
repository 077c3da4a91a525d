//! Issue 30: no option of `flowplane run` is silently ignored on a live
//! port either. As `cli_options.rs` does for replays, the options are read
//! from `flowplane run --help` when the test runs and each must have a
//! case here (a new option without one fails the test). A case says what
//! the option does on an AF_PACKET input (a 2-queue veth the test makes,
//! as root): refused with exit 2 in one line, or a check on one of a few
//! live runs against the baseline run, or speed only (the same results as
//! the baseline, with the reason nothing else can show). Each run is
//! served on a control socket: the test waits until the data plane is up,
//! sends 1,000 packets of 16 UDP flows into the veth's peer (flowplane
//! replaying a pcap), waits until the port has counted them, looks at the
//! running process where a case needs it (metrics, the interface's
//! flags), then stops it with SIGINT (or lets it end on its own) and reads
//! the `--json` report.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

mod ports_common;

use ports_common::{ctl, Proc, Veth};

const BIN: &str = env!("CARGO_BIN_EXE_flowplane");
const METRICS: u16 = 19_671;
/// Packets and flows sent into each run.
const PACKETS: u64 = 1000;
const FLOWS: u64 = 16;

/// What a run gave: its exit, its report and what was seen while it ran.
#[derive(Default)]
struct Got {
    code: Option<i32>,
    stderr: String,
    json: Value,
    /// The metrics endpoint's answer mid-run (runs with --metrics).
    metrics: String,
    /// `ip link show` of the input mid-run.
    link: String,
    /// Seconds from spawn to exit.
    secs: f64,
}

impl Got {
    fn at(&self, ptr: &str) -> Value {
        self.json.pointer(ptr).cloned().unwrap_or(Value::Null)
    }
    fn u(&self, ptr: &str) -> u64 {
        self.at(ptr).as_u64().unwrap_or(0)
    }
    fn s(&self, ptr: &str) -> String {
        self.at(ptr).as_str().unwrap_or("").to_string()
    }
    /// What the packets did: per NF counters and the flow table's figures.
    fn results(&self) -> Value {
        serde_json::json!([self.at("/packets"), self.at("/packets_out"), self.at("/nfs"), self.at("/tables/flows")])
    }
}

/// One live run: its options (besides the input, the control socket, --json and --no-pin).
struct Run {
    args: Vec<String>,
    /// Ends on its own (--duration): not interrupted.
    own_end: bool,
    /// Extra time after the packets are in (timers).
    linger: Duration,
}

type Check = Box<dyn Fn(&Got, &Got) -> Result<(), String>>;

enum Live {
    /// Exit 2, one line containing this, nothing run.
    Refused(&'static str),
    /// A check on (baseline, the named run).
    On(&'static str, Check),
    /// Speed only: the named run's results equal the baseline's; why nothing else shows.
    Same(&'static str, &'static str),
    /// Not an option of a run's behaviour, or covered elsewhere (the reason).
    Elsewhere(&'static str),
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

fn ok(c: bool, why: impl FnOnce() -> String) -> Result<(), String> {
    if c {
        Ok(())
    } else {
        Err(why())
    }
}

fn help_options() -> BTreeSet<String> {
    let o = Command::new(BIN).args(["run", "--help"]).output().expect("spawn flowplane");
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(str::trim_start)
        .filter_map(|l| {
            let l = l.strip_prefix("-").and_then(|r| r.split_once(", ").map(|x| x.1)).unwrap_or(l);
            l.starts_with("--").then(|| l.split([' ', ',']).next().unwrap().to_string())
        })
        .collect()
}

fn pcap_packets(path: &Path) -> u64 {
    let d = std::fs::read(path).unwrap_or_default();
    if d.len() < 24 {
        return 0;
    }
    let (mut at, mut n) = (24, 0);
    while at + 16 <= d.len() {
        let cap = u32::from_le_bytes(d[at + 8..at + 12].try_into().unwrap()) as usize;
        at += 16 + cap;
        n += 1;
    }
    n
}

/// Spawns one live run, feeds it, stops it; what it gave.
fn live_run(v: &Veth, dir: &Path, name: &str, run: &Run, trace: &Path) -> Got {
    let sock = dir.join(format!("{name}.sock"));
    let iface = format!("afpacket:{}", v.0);
    let mut args = s(&["run", "--input", &iface, "--no-pin", "--json", "--ctl", sock.to_str().unwrap()]);
    args.extend(run.args.iter().cloned());
    let t0 = Instant::now();
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut fp = Proc::spawn(&argv);
    let mut got = Got::default();
    // Up (or refused at once).
    loop {
        if !fp.running() {
            let out = fp.0.take().unwrap().wait_with_output().unwrap();
            panic!("{name}: {args:?} exited at start: {}", String::from_utf8_lossy(&out.stderr));
        }
        if ctl(&sock, &["show", "runtime"]).1["ready"].as_bool() == Some(true) {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "{name}: not up in 30 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    let send = Command::new(BIN)
        .args(["run", "--input", trace.to_str().unwrap(), "--output", &format!("afpacket:{}", v.peer())])
        .args(["--chain", "forward", "--rate", "20000", "--cores", "1", "--no-pin"])
        .output()
        .unwrap();
    assert!(send.status.success(), "sender: {}", String::from_utf8_lossy(&send.stderr));
    // Until the port has counted every packet (also during a warm-up, where the workers do not).
    let t1 = Instant::now();
    while t1.elapsed() < Duration::from_secs(10) {
        let p = ctl(&sock, &["show", "ports"]).1;
        if p[0]["rx_packets"].as_u64().unwrap_or(0) >= PACKETS {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300) + run.linger);
    got.link = String::from_utf8_lossy(&Command::new("ip").args(["-d", "link", "show", &v.0]).output().unwrap().stdout)
        .into_owned();
    if run.args.iter().any(|a| a == "--metrics") {
        got.metrics = ports_common::scrape(METRICS);
    }
    let out = if run.own_end {
        let c = fp.0.take().unwrap();
        let t2 = Instant::now();
        let mut c = c;
        while c.try_wait().unwrap().is_none() {
            assert!(t2.elapsed() < Duration::from_secs(20), "{name}: did not end on its own");
            std::thread::sleep(Duration::from_millis(50));
        }
        c.wait_with_output().unwrap()
    } else {
        fp.interrupt_and_wait()
    };
    got.code = out.status.code();
    got.stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    got.json = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    got.secs = t0.elapsed().as_secs_f64();
    assert_eq!(got.code, Some(0), "{name}: {args:?}: {}", got.stderr);
    got
}

#[test]
fn every_run_option_acts_on_a_live_port_or_is_refused() {
    let v = Veth::with_queues("po", 2);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("ports-options{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let p = |n: &str| dir.join(n).to_string_lossy().into_owned();
    let trace = dir.join("in.pcap");
    let g = Command::new(BIN)
        .args(["gen", "--flows", &FLOWS.to_string(), "--packets", &PACKETS.to_string(), "--proto", "udp"])
        .args(["--seed", "5", "-o", trace.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(g.status.success(), "{}", String::from_utf8_lossy(&g.stderr));
    std::fs::write(dir.join("c.toml"), "chain = \"fsc -> count\"\n").unwrap();
    std::fs::write(dir.join("run.toml"), "exec = \"pernf\"\n").unwrap();
    let common = |out: &str| s(&["--output", &p(out), "--table-capacity", "4096"]);
    let with = |out: &str, extra: &[&str]| {
        let mut a = common(out);
        a.extend(s(extra));
        a
    };
    let runs: BTreeMap<&str, Run> = BTreeMap::from([
        (
            "base",
            Run {
                args: with("base.pcap", &["--chain", "fsc", "--cores", "1"]),
                own_end: false,
                linger: Duration::ZERO,
            },
        ),
        (
            "a",
            Run {
                args: with(
                    "a.pcap",
                    &[
                        "--chain-file",
                        &p("c.toml"),
                        "--cores",
                        "2",
                        "--exec",
                        "rtc",
                        "--batch",
                        "8",
                        "--export",
                        &format!("fsc={}", p("fsc.json")),
                        "--metrics",
                        &format!("127.0.0.1:{METRICS}"),
                        "--scale",
                        "rsspp",
                        "--scale-period-ms",
                        "50",
                        "--idle-timeout",
                        "0.2",
                        "--promisc",
                    ],
                ),
                own_end: false,
                // The idle timeout passes, the timers expire every flow.
                linger: Duration::from_millis(1200),
            },
        ),
        (
            "b",
            Run {
                args: with(
                    "b.pcap",
                    &[
                        "--config",
                        &p("run.toml"),
                        "--chain",
                        "fsc",
                        "--cores",
                        "1",
                        "--pool",
                        "8192",
                        "--hash-seed",
                        "7",
                        "--no-prefetch",
                        "--no-prefetch-hooks",
                        "--no-aux",
                        "--no-packing",
                        "--no-match-sharing",
                    ],
                ),
                own_end: false,
                linger: Duration::ZERO,
            },
        ),
        (
            "scr",
            Run {
                args: with(
                    "scr.pcap",
                    &[
                        "--chain",
                        "ddos -> hh",
                        "--cores",
                        "2",
                        "--scale",
                        "scr",
                        "--scr-history",
                        "4",
                        "--scr-loss",
                        "0.1",
                        "--scr-recovery",
                        "--scr-log",
                        "4096",
                        "--seed",
                        "7",
                    ],
                ),
                own_end: false,
                linger: Duration::ZERO,
            },
        ),
        (
            "dys",
            Run {
                args: with(
                    "dys.pcap",
                    &[
                        "--chain",
                        "fsc",
                        "--cores",
                        "2",
                        "--scale",
                        "dyssect",
                        "--priority",
                        "dscp=0",
                        "--slo-us",
                        "100000",
                        "--scale-period-ms",
                        "10",
                        "--long-period-ms",
                        "20",
                        "--solver-budget-ms",
                        "50",
                    ],
                ),
                own_end: false,
                linger: Duration::from_millis(300),
            },
        ),
        (
            "sym",
            Run {
                args: with(
                    "sym.pcap",
                    &[
                        "--chain",
                        "fsc",
                        "--cores",
                        "2",
                        "--symmetric-rss",
                        "--duration",
                        "3",
                        "--export",
                        &format!("fsc={}", p("fsc.json")),
                        "--ipfix",
                        &format!("file:{}", p("ipfix.bin")),
                        "--ipfix-active",
                        "0.01",
                    ],
                ),
                own_end: true,
                linger: Duration::ZERO,
            },
        ),
        (
            "full",
            Run {
                args: s(&[
                    "--output",
                    &p("full.pcap"),
                    "--table-capacity",
                    "8",
                    "--table-full",
                    "evict",
                    "--chain",
                    "fsc",
                    "--cores",
                    "1",
                ]),
                own_end: false,
                linger: Duration::ZERO,
            },
        ),
        (
            "port",
            Run {
                args: with("port0.pcap", &["--chain", "forward(port=1)", "--cores", "1", "--port", &p("port1.pcap")]),
                own_end: false,
                linger: Duration::ZERO,
            },
        ),
        (
            "warm",
            Run {
                args: with("warm.pcap", &["--chain", "fsc", "--cores", "1", "--warmup", "60"]),
                own_end: false,
                linger: Duration::ZERO,
            },
        ),
    ]);
    let (fsc_json, p0, p1, base_out) = (p("fsc.json"), p("port0.pcap"), p("port1.pcap"), p("base.pcap"));
    let ipfix_file = p("ipfix.bin");
    let cases: Vec<(&str, Live)> = vec![
        ("--help", Live::Elsewhere("prints the help")),
        (
            "--quiet",
            Live::Elsewhere("no bars or status line, drawn only on a terminal anyway (cli_options.rs: a quiet replay)"),
        ),
        ("--config", Live::On("b", Box::new(|_, r| ok(r.s("/exec") == "pernf", || format!("exec {}", r.s("/exec")))))),
        ("--input", Live::On("base", Box::new(|b, _| ok(b.s("/clock").contains("port receive time (afpacket:"), || b.s("/clock"))))),
        ("--gen", Live::Refused("--gen")),
        ("--loops", Live::Refused("--loops")),
        ("--rate", Live::Refused("--rate")),
        ("--virtual-cores", Live::Refused("--virtual-cores")),
        ("--ring", Live::Refused("--ring")),
        ("--restamp", Live::Refused("--restamp")),
        ("--nic-profile", Live::Refused("--nic-profile")),
        (
            "--duration",
            Live::On("sym", Box::new(|_, r| ok(r.secs < 15.0 && r.code == Some(0), || format!("ended after {:.1} s", r.secs)))),
        ),
        (
            "--warmup",
            Live::On("warm", Box::new(|b, r| ok(b.u("/packets") == PACKETS && r.u("/packets") == 0, || format!("measured {} -> {}", b.u("/packets"), r.u("/packets"))))),
        ),
        (
            "--output",
            Live::On("base", Box::new(move |b, _| {
                let n = pcap_packets(Path::new(&base_out));
                ok(n == PACKETS && b.u("/packets_out") == PACKETS, || format!("{n} packets written, {} out", b.u("/packets_out")))
            })),
        ),
        (
            "--port",
            Live::On("port", Box::new(move |_, r| {
                let (a, b) = (pcap_packets(Path::new(&p0)), pcap_packets(Path::new(&p1)));
                ok(a == 0 && b == PACKETS && r.u("/packets_out") == PACKETS, || format!("port 0 {a}, port 1 {b}"))
            })),
        ),
        (
            "--export",
            Live::On("sym", Box::new(move |_, _| {
                let v: Value = serde_json::from_str(&std::fs::read_to_string(&fsc_json).unwrap_or_default()).unwrap_or(Value::Null);
                let rows = v.as_array().map_or(0, Vec::len) as u64;
                ok(rows == FLOWS, || format!("{rows} rows exported"))
            })),
        ),
        (
            "--ipfix",
            Live::On("sym", Box::new(move |_, r| {
                // Every packet is in some record (active deltas and the run's end), read back by `ipfix read`.
                let o = Command::new(BIN).args(["ipfix", "read", &ipfix_file, "--json"]).output().unwrap();
                let pk: u64 = String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                    .map(|v| v["packets"].as_u64().unwrap_or(0))
                    .sum();
                ok(r.u("/ipfix/flow_records") >= FLOWS && pk == PACKETS, || format!("{} records, {pk} packets", r.u("/ipfix/flow_records")))
            })),
        ),
        (
            "--ipfix-active",
            Live::On("sym", Box::new(|_, r| ok(r.u("/ipfix/flow_records") > FLOWS && r.at("/ipfix/active_timeout_s").as_f64() == Some(0.01), || format!("{}", r.at("/ipfix"))))),
        ),
        // State replication on a port: the chains here (fsc) keep state that is not replicated; nat and lb
        // replicate (cli_served.rs: two instances on loopback).
        ("--replicate", Live::Refused("fsc: its state is not replicated")),
        ("--replicate-listen", Live::Refused("fsc: its state is not replicated")),
        ("--replicate-role", Live::Refused("--replicate-role needs --replicate")),
        ("--json", Live::On("base", Box::new(|b, _| ok(b.u("/packets") == PACKETS, || format!("report {}", b.json))))),
        ("--promisc", Live::On("a", Box::new(|b, r| ok(!r.link.contains("promiscuity 0") && r.link.contains("promiscuity ") && b.link.contains("promiscuity 0"), || format!("link {} / {}", b.link, r.link))))),
        ("--eal", Live::Elsewhere("DPDK's EAL: refused without a dpdk port (cli_options.rs::port_options_act_only_on_the_kinds_that_take_them), acting in ports_dpdk.rs")),
        ("--metrics", Live::On("a", Box::new(|_, r| ok(r.metrics.contains("200 OK") && r.metrics.contains("flowplane_core_packets_total"), || r.metrics.clone())))),
        ("--ctl", Live::On("base", Box::new(|b, _| ok(b.code == Some(0), || "every run is served on --ctl (the test waits for its `ready`)".into())))),
        ("--chain", Live::On("base", Box::new(|b, _| ok(b.s("/chain") == "fsc" && b.u("/tables/flows") == FLOWS, || format!("{} {}", b.s("/chain"), b.u("/tables/flows")))))),
        ("--chain-file", Live::On("a", Box::new(|_, r| ok(r.s("/chain") == "fsc -> count", || r.s("/chain"))))),
        ("--exec", Live::On("a", Box::new(|b, r| ok(r.s("/exec") == "rtc" && b.s("/exec") != "rtc", || format!("{} -> {}", b.s("/exec"), r.s("/exec")))))),
        (
            "--batch",
            Live::On("a", Box::new(|_, r| {
                let (n, batches) = (r.u("/packets"), r.u("/latency/batches"));
                ok(r.u("/batch") == 8 && n == PACKETS && batches * 8 >= n, || format!("batch {}, {n} packets in {batches} batches", r.u("/batch")))
            })),
        ),
        ("--no-prefetch", Live::Same("b", "a prefetch changes when a line is read, not what is computed")),
        ("--no-prefetch-hooks", Live::Same("b", "the NFs' prefetch hooks change when a line is read, not what is computed")),
        ("--no-aux", Live::Same("b", "the auxiliary key table is a faster path to the same state")),
        ("--no-packing", Live::Same("b", "packing lays the state out in fewer lines; the same values")),
        ("--no-match-sharing", Live::Same("b", "a shared match is the same match computed once")),
        ("--hash-seed", Live::Same("b", "the tables' secret: results depend on it only when a table is full (cli_options.rs: two seeds evict differently)")),
        ("--pool", Live::Same("b", "more buffers per core; 1,000 packets at 20 kpps never exhaust the default")),
        ("--no-pin", Live::Elsewhere("every run here is unpinned (a shared test machine); pinning moves threads, not results")),
        (
            "--table-capacity",
            Live::On("full", Box::new(|b, r| ok(r.u("/tables/capacity") < b.u("/tables/capacity") && r.u("/tables/capacity") <= 8, || format!("capacity {} -> {}", b.u("/tables/capacity"), r.u("/tables/capacity"))))),
        ),
        (
            "--table-full",
            Live::On("full", Box::new(|b, r| ok(b.u("/tables/evictions") == 0 && r.u("/tables/evictions") > 0, || format!("evictions {} -> {}", b.u("/tables/evictions"), r.u("/tables/evictions"))))),
        ),
        (
            "--idle-timeout",
            Live::On("a", Box::new(|b, r| ok(b.u("/tables/expiries") == 0 && r.u("/tables/expiries") >= FLOWS, || format!("expiries {} -> {}", b.u("/tables/expiries"), r.u("/tables/expiries"))))),
        ),
        ("--cores", Live::On("a", Box::new(|b, r| ok(b.u("/cores") == 1 && r.u("/cores") == 2 && r.at("/per_core").as_array().map_or(0, Vec::len) == 2, || format!("{} -> {}", b.u("/cores"), r.u("/cores")))))),
        ("--scale", Live::On("a", Box::new(|b, r| ok(b.s("/steering/strategy") == "rss" && r.s("/steering/strategy") == "rsspp", || format!("{} -> {}", b.s("/steering/strategy"), r.s("/steering/strategy")))))),
        (
            "--scale-period-ms",
            Live::On("dys", Box::new(|_, r| {
                let loads = r.at("/steering/controller/loads").as_array().map_or(0, Vec::len);
                // 10-ms periods over a run of a second or more: dozens of load rows (the default 100 ms gives ~10).
                ok(loads >= 30, || format!("{loads} control periods logged"))
            })),
        ),
        ("--symmetric-rss", Live::On("sym", Box::new(|_, r| ok(r.s("/steering/by") == "kernel", || format!("steered by {}", r.s("/steering/by")))))),
        ("--scr-history", Live::On("scr", Box::new(|_, r| ok(r.u("/scr/history") == 4, || format!("history {}", r.at("/scr/history")))))),
        (
            "--scr-loss",
            Live::On("scr", Box::new(|_, r| {
                let lost: u64 = (0..2).map(|c| r.u(&format!("/scr/cores/{c}/lost"))).sum();
                ok(lost > 0 && r.at("/scr/loss").as_f64() == Some(0.1), || format!("lost {lost}"))
            })),
        ),
        (
            "--scr-recovery",
            Live::On("scr", Box::new(|_, r| {
                let rec: u64 = (0..2).map(|c| r.u(&format!("/scr/cores/{c}/recovered"))).sum();
                ok(r.at("/scr/recovery") == Value::Bool(true) && rec > 0, || format!("recovered {rec}"))
            })),
        ),
        ("--scr-log", Live::Elsewhere("a core waits rather than overwrite a log entry another core may need: only its waits change (cli_options.rs: the same results on a replay)")),
        ("--seed", Live::Elsewhere("seeds SCR's injected loss: which sequence numbers are lost (checked on a replay in cli_options.rs); on a port the numbers follow arrival order")),
        (
            "--priority",
            Live::On("dys", Box::new(|_, r| {
                let (p, n) = (r.u("/steering/priority/packets"), r.u("/steering/priority/normal_packets"));
                ok(p > 0 && p + n > 0, || format!("class {p}, others {n}: {}", r.at("/steering")))
            })),
        ),
        ("--slo-us", Live::On("dys", Box::new(|_, r| ok(r.at("/steering/priority/slo_us").as_f64() == Some(100000.0) && r.at("/steering/controller/slo_us").as_f64() == Some(100000.0), || format!("{}", r.at("/steering")))))),
        (
            "--long-period-ms",
            Live::On("dys", Box::new(|_, r| {
                let long = r.at("/steering/controller/decisions").as_array().map_or(0, |d| d.iter().filter(|x| x["kind"] == "long").count());
                ok(long > 0, || format!("no long-timescale decision: {}", r.at("/steering/controller/decisions")))
            })),
        ),
        ("--solver-budget-ms", Live::Elsewhere("bounds dyssect's MILP solve (checked on a replay in cli_options.rs, where solves are cut short); the controller is the same object on a port")),
    ];
    // Every option has a case, and every case an option.
    let opts = help_options();
    let named: BTreeSet<String> = cases.iter().map(|c| c.0.to_string()).collect();
    let missing: Vec<_> = opts.difference(&named).collect();
    let stale: Vec<_> = named.difference(&opts).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "options without a live case: {missing:?}; cases without an option: {stale:?}"
    );
    // Refusals first: cheap, nothing opened.
    for (opt, l) in &cases {
        if let Live::Refused(word) = l {
            let value = match *opt {
                "--gen" => Some("--flows 10 --packets 10"),
                "--loops" => Some("2"),
                "--rate" => Some("1000"),
                "--virtual-cores" => Some("4"),
                "--ring" => Some("1024"),
                "--nic-profile" => Some("bcm57416"),
                "--replicate" => Some("udp:127.0.0.1:9"),
                "--replicate-listen" => Some("udp:127.0.0.1:0"),
                "--replicate-role" => Some("standby"),
                _ => None,
            };
            let mut args =
                s(&["run", "--input", &format!("afpacket:{}", v.0), "--chain", "fsc", "--output", &p("r.pcap"), opt]);
            args.extend(value.map(str::to_string));
            let r = Command::new(BIN).args(&args).output().unwrap();
            let err = String::from_utf8_lossy(&r.stderr);
            assert_eq!(r.status.code(), Some(2), "{args:?}: {err}");
            assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
            assert!(err.contains(word), "{args:?}: {err}");
            assert!(r.stdout.is_empty(), "{args:?}: nothing run");
        }
    }
    let mut got = BTreeMap::new();
    for (name, run) in &runs {
        got.insert(*name, live_run(&v, &dir, name, run, &trace));
    }
    let base = &got["base"];
    let mut failed = Vec::new();
    for (opt, l) in &cases {
        let r = match l {
            Live::On(run, check) => check(base, &got[run]),
            Live::Same(run, why) => {
                println!("{opt}: speed only ({why})");
                let r = &got[run];
                ok(r.results() == base.results(), || format!("results differ: {} vs {}", r.results(), base.results()))
            }
            Live::Elsewhere(why) => {
                println!("{opt}: {why}");
                Ok(())
            }
            Live::Refused(_) => Ok(()),
        };
        if let Err(e) = r {
            failed.push(format!("{opt}: {e}"));
        }
    }
    assert!(failed.is_empty(), "live options that did not act:\n{}", failed.join("\n"));
    let _ = std::fs::remove_dir_all(&dir);
}
