//! Issue 30: no option of `flowplane run` is silently ignored. The options
//! are read from `flowplane run --help` when the test runs, and each must
//! have a case here (a new option without one fails the test): a run with
//! the option against the run without it, on a small generated trace,
//! showing what it changed (a result in the `--json` report, a file written,
//! the exit code) or that it is refused with exit 2 in one line. The few
//! options that only change speed (prefetching, packing, pinning, pool
//! size) are checked to leave every result as it was, each with the reason
//! a replay cannot show more. Live-port behaviour is covered by the
//! `ports_*` tests (`ports_matrix.rs`: every strategy on every port kind);
//! here the live-only options must be refused on a replay, and each port
//! option on a run without a port of a kind that takes it.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_flowplane");
/// 2,000 packets of 200 UDP flows: a run takes a few tens of ms in a debug build.
const GEN: &str = "--flows 200 --packets 2000 --seed 1";
/// Dyssect needs time for its control periods, and flows worth moving.
const DYS_GEN: &str = "--flows 2000 --packets 20000 --seed 1 --dist zipf:1.2";

/// What one run gave.
#[derive(Clone, Debug)]
struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    json: Option<Value>,
}

impl Out {
    fn at(&self, ptr: &str) -> Value {
        self.json.as_ref().and_then(|v| v.pointer(ptr)).cloned().unwrap_or(Value::Null)
    }

    fn u(&self, ptr: &str) -> u64 {
        self.at(ptr).as_u64().unwrap_or(0)
    }

    /// Every result of the run (what the packets did), without its timings.
    fn results(&self) -> Value {
        let mut v = self.json.clone().unwrap_or(Value::Null);
        if let Some(o) = v.as_object_mut() {
            for k in [
                "mpps",
                "gbps",
                "cycles_per_packet",
                "duration_s",
                "tsc_ghz",
                "latency",
                "scale",
                "provenance",
                "trust",
            ] {
                o.remove(k);
            }
            if let Some(cores) = o.get_mut("per_core").and_then(Value::as_array_mut) {
                for c in cores {
                    *c = c["packets"].clone();
                }
            }
            // SCR: each replica's state digest and what it lost or recovered, not its cycles and waits.
            if let Some(cores) = o.get_mut("scr").and_then(|r| r.get_mut("cores")).and_then(Value::as_array_mut) {
                for c in cores {
                    *c = serde_json::json!([c["digest"], c["lost"], c["recovered"], c["unrecovered"]]);
                }
            }
            if let Some(r) = o.get_mut("scr").and_then(Value::as_object_mut) {
                r.retain(|k, _| !k.contains("cycles"));
            }
        }
        v
    }
}

type CheckFn = Box<dyn Fn(&Out, &Out) -> Result<(), String> + Sync>;

enum Expect {
    /// Both runs succeed and the value at every JSON pointer differs.
    Changes(&'static [&'static str]),
    /// The run with the option exits 2 with one line containing this.
    Refused(&'static str),
    /// Speed only: both succeed with the same results; the reason a replay cannot show more.
    SameResults(&'static str),
    /// A check of its own on (without, with).
    Check(CheckFn),
}

struct Case {
    opt: &'static str,
    without: Vec<String>,
    with: Vec<String>,
    expect: Expect,
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

/// `run` on the small trace, one core, small tables, JSON, `chain`, then `extra`.
fn base(chain: &str, extra: &[&str]) -> Vec<String> {
    let mut a = s(&["run", "--gen", GEN, "--table-capacity", "4096", "--json", "--chain", chain]);
    if !extra.contains(&"--cores") {
        a.extend(s(&["--cores", "1"]));
    }
    a.extend(s(extra));
    a
}

fn plus(mut a: Vec<String>, extra: &[&str]) -> Vec<String> {
    a.extend(s(extra));
    a
}

/// Each distinct command once (cases share their runs without the option).
fn run_all(cmds: &[Vec<String>]) -> HashMap<Vec<String>, Out> {
    let todo = Mutex::new(cmds.iter().collect::<BTreeSet<_>>().into_iter().collect::<Vec<_>>());
    let done = Mutex::new(HashMap::new());
    std::thread::scope(|sc| {
        for _ in 0..3 {
            sc.spawn(|| loop {
                let Some(args) = todo.lock().unwrap().pop() else { break };
                let o = Command::new(BIN).args(args).output().expect("spawn flowplane");
                let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
                let out = Out {
                    code: o.status.code(),
                    json: serde_json::from_str(&stdout).ok(),
                    stdout,
                    stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
                };
                done.lock().unwrap().insert(args.clone(), out);
            });
        }
    });
    done.into_inner().unwrap()
}

/// The long options `flowplane run --help` lists.
fn help_options() -> BTreeSet<String> {
    let o = Command::new(BIN).args(["run", "--help"]).output().expect("spawn flowplane");
    assert!(o.status.success());
    let text = String::from_utf8_lossy(&o.stdout);
    let opts: BTreeSet<String> = text
        .lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with('-'))
        .filter_map(|l| l.split([' ', ',']).find(|w| w.starts_with("--")).map(str::to_string))
        .collect();
    assert!(opts.len() > 30 && opts.contains("--exec") && opts.contains("--help"), "{opts:?}");
    opts
}

/// Packets in a pcap file and the first one's time in ns (microsecond or nanosecond pcap).
fn pcap(path: &Path) -> Result<(usize, u64), String> {
    let d = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let le = |o: usize| u32::from_le_bytes(d[o..o + 4].try_into().unwrap());
    if d.len() < 24 {
        return Err(format!("{}: no pcap header", path.display()));
    }
    let nano = le(0) == 0xa1b2_3c4d;
    let (mut n, mut off, mut first) = (0, 24, 0);
    while off + 16 <= d.len() {
        if n == 0 {
            first = u64::from(le(off)) * 1_000_000_000 + u64::from(le(off + 4)) * if nano { 1 } else { 1000 };
        }
        off += 16 + le(off + 8) as usize;
        n += 1;
    }
    Ok((n, first))
}

fn ok(c: bool, why: impl FnOnce() -> String) -> Result<(), String> {
    if c {
        Ok(())
    } else {
        Err(why())
    }
}

fn dyssect_long(o: &Out) -> Vec<String> {
    let d = o.at("/scale/controller/decisions");
    let all = d.as_array().cloned().unwrap_or_default();
    all.iter().filter(|x| x["kind"] == "long").map(|x| x["status"].as_str().unwrap_or("").to_string()).collect()
}

fn cases(dir: &Path) -> Vec<Case> {
    let p = |name: &str| dir.join(name).to_string_lossy().into_owned();
    let (trace, out, port, export, chain_file) =
        (p("in.pcap"), p("out.pcap"), p("port.pcap"), p("hh.json"), p("c.toml"));
    let (r0, r1) = (p("r0.pcap"), p("r1.pcap"));
    let (ipfix_file, ipfix_file2) = (p("flows.ipfix"), p("flows2.ipfix"));
    let exp_ipfix = ipfix_file.clone();
    let lb = "lb(backends=4) -> fsc -> srcctr";
    let std = || base(lb, &[]);
    let scr = |extra: &[&str]| {
        base(
            "ddos -> hh",
            &plus(s(&["--cores", "2", "--scale", "scr"]), extra).iter().map(String::as_str).collect::<Vec<_>>(),
        )
    };
    let dys = |extra: &[&str]| {
        plus(
            s(&["run", "--gen", DYS_GEN, "--table-capacity", "8192", "--cores", "2", "--json", "--chain", "fsc"]),
            &plus(s(&["--scale", "dyssect", "--duration", "0.3"]), extra)
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        )
    };
    let no = |v: &[&str]| s(v);
    let exp_out = out.clone();
    let (exp_o3, exp_port) = (p("o3.pcap"), port.clone());
    let exp_export = export.clone();
    let (rr0, rr1) = (r0.clone(), r1.clone());
    vec![
        Case {
            opt: "--input",
            without: std(),
            with: no(&["run", "--input", &trace, "--table-capacity", "4096", "--cores", "1", "--json", "--chain", lb]),
            expect: Expect::Changes(&["/packets", "/load/bytes"]),
        },
        Case {
            opt: "--gen",
            without: no(&["run", "--input", &trace, "--table-capacity", "4096", "--cores", "1", "--json", "--chain", lb]),
            with: std(),
            expect: Expect::Changes(&["/packets", "/load/bytes"]),
        },
        Case {
            opt: "--output",
            without: std(),
            with: plus(std(), &["--output", &out]),
            expect: Expect::Check(Box::new(move |_, w| {
                let (n, _) = pcap(Path::new(&exp_out))?;
                ok(n as u64 == w.u("/packets_out") && n > 0, || format!("{n} packets written"))
            })),
        },
        Case {
            // A replay writes verdict i to the i-th --port file (without it, every verdict to --output).
            opt: "--port",
            without: base("forward(port=1)", &["--output", &p("o2.pcap")]),
            with: base("forward(port=1)", &["--output", &p("o3.pcap"), "--port", &format!("b={port}")]),
            expect: Expect::Check(Box::new(move |_, w| {
                let (n0, _) = pcap(Path::new(&exp_o3))?;
                let (n1, _) = pcap(Path::new(&exp_port))?;
                ok(n0 == 0 && n1 as u64 == w.u("/packets_out") && n1 > 0, || format!("{n0} to --output, {n1} to --port"))
            })),
        },
        Case { opt: "--promisc", without: std(), with: plus(std(), &["--promisc"]), expect: Expect::Refused("--promisc configures live ports") },
        Case { opt: "--eal", without: std(), with: plus(std(), &["--eal", "--no-huge"]), expect: Expect::Refused("--eal configures live ports") },
        Case {
            opt: "--metrics",
            without: std(),
            with: plus(std(), &["--metrics", "127.0.0.1:0"]),
            expect: Expect::SameResults("serving the run's figures changes none of them (cli_served.rs scrapes a served replay)"),
        },
        Case {
            opt: "--ctl",
            without: std(),
            with: plus(std(), &["--ctl", "/tmp/flowplane-options.sock"]),
            expect: Expect::SameResults("a control socket nobody asks changes nothing (cli_served.rs drives a served replay)"),
        },
        Case {
            opt: "--chain",
            without: no(&["run", "--gen", GEN, "--table-capacity", "4096", "--cores", "1", "--json"]),
            with: std(),
            expect: Expect::Changes(&["/nfs"]),
        },
        Case {
            opt: "--chain-file",
            without: no(&["run", "--gen", GEN, "--table-capacity", "4096", "--cores", "1", "--json"]),
            with: no(&["run", "--gen", GEN, "--table-capacity", "4096", "--cores", "1", "--json", "--chain-file", &chain_file]),
            expect: Expect::Changes(&["/nfs"]),
        },
        Case {
            opt: "--config",
            without: std(),
            with: no(&["run", "--config", &p("run.toml"), "--chain", lb]),
            expect: Expect::Check(Box::new(|wo, w| {
                let names = |o: &Out| [o.at("/nfs/0/name"), o.at("/nfs/2/name")];
                ok(names(w) == names(wo) && w.at("/nfs/0/name") == "lb", || "the command line's --chain wins".into())?;
                ok(w.u("/cores") == 2 && w.u("/per_core/1/packets") > 0, || "cores = 2 from the file".into())?;
                ok(w.u("/packets") == wo.u("/packets"), || "gen from the file".into())
            })),
        },
        Case {
            opt: "--cores",
            without: std(),
            with: no(&["run", "--gen", GEN, "--table-capacity", "4096", "--cores", "2", "--json", "--chain", lb]),
            expect: Expect::Changes(&["/per_core/0/packets", "/cores"]),
        },
        // pernf keeps a table per 5-tuple NF: lb's and fsc's entries.
        Case { opt: "--exec", without: std(), with: plus(std(), &["--exec", "pernf"]), expect: Expect::Changes(&["/tables/entries"]) },
        Case {
            opt: "--no-prefetch",
            without: std(),
            with: plus(std(), &["--no-prefetch"]),
            expect: Expect::SameResults("prefetch hints change no result; only cycles, which a debug build cannot compare"),
        },
        Case {
            opt: "--no-prefetch-hooks",
            without: base("nat", &[]),
            with: base("nat", &["--no-prefetch-hooks"]),
            expect: Expect::SameResults("an NF's prefetch hook is a hint; only cycles change"),
        },
        Case {
            opt: "--no-aux",
            without: std(),
            with: plus(std(), &["--no-aux"]),
            expect: Expect::Changes(&["/tables/shared_lookups"]),
        },
        Case {
            opt: "--no-packing",
            without: std(),
            with: plus(std(), &["--no-packing"]),
            expect: Expect::SameResults("the block layout changes which cache lines a flow's states share; only cycles change"),
        },
        Case {
            opt: "--no-match-sharing",
            without: std(),
            with: plus(std(), &["--no-match-sharing"]),
            expect: Expect::Changes(&["/tables/entries"]),
        },
        Case {
            opt: "--table-capacity",
            without: no(&["run", "--gen", GEN, "--cores", "1", "--json", "--chain", "fsc"]),
            with: no(&["run", "--gen", GEN, "--cores", "1", "--json", "--chain", "fsc", "--table-capacity", "64"]),
            expect: Expect::Changes(&["/tables/table_full"]),
        },
        Case {
            opt: "--idle-timeout",
            without: std(),
            with: plus(std(), &["--idle-timeout", "0.000001"]),
            expect: Expect::Changes(&["/tables/expiries"]),
        },
        Case {
            opt: "--table-full",
            without: no(&["run", "--gen", GEN, "--cores", "1", "--json", "--chain", "fsc", "--table-capacity", "64"]),
            with: no(&["run", "--gen", GEN, "--cores", "1", "--json", "--chain", "fsc", "--table-capacity", "64", "--table-full", "evict"]),
            expect: Expect::Changes(&["/tables/evictions"]),
        },
        Case {
            // The hash secret decides which entries share candidate buckets, so which one an eviction picks:
            // a fixed seed reproduces a run whose table filled (the two seeds here evict differently).
            opt: "--hash-seed",
            without: no(&["run", "--gen", GEN, "--cores", "1", "--json", "--chain", "fsc", "--table-capacity", "64", "--table-full", "evict", "--hash-seed", "1"]),
            with: no(&["run", "--gen", GEN, "--cores", "1", "--json", "--chain", "fsc", "--table-capacity", "64", "--table-full", "evict", "--hash-seed", "2"]),
            expect: Expect::Changes(&["/tables/evictions"]),
        },
        Case {
            opt: "--export",
            without: base("hh(export=all)", &[]),
            with: base("hh(export=all)", &["--export", &format!("hh={export}")]),
            expect: Expect::Check(Box::new(move |_, _| {
                let text = std::fs::read_to_string(&exp_export).map_err(|e| format!("{exp_export}: {e}"))?;
                let v: Value = serde_json::from_str(&text).map_err(|e| format!("{exp_export}: {e}"))?;
                let rows = v.as_array().map_or(0, Vec::len);
                ok(rows == 200, || format!("{rows} rows exported, one per flow expected"))
            })),
        },
        Case {
            opt: "--ipfix",
            without: std(),
            with: plus(std(), &["--ipfix", &format!("file:{ipfix_file}")]),
            expect: Expect::Check(Box::new(move |_, w| {
                let n = std::fs::metadata(&exp_ipfix).map_or(0, |m| m.len());
                // One record per flow at the run's end from lb and one from fsc, written to the file collector.
                ok(w.u("/ipfix/flow_records") == 400 && n > 0, || format!("{} records, {n} bytes", w.u("/ipfix/flow_records")))
            })),
        },
        Case {
            opt: "--ipfix-active",
            without: plus(std(), &["--ipfix", &format!("file:{ipfix_file2}")]),
            // The trace spans 200 µs of packet time: a 100-µs active timeout reports live flows on the way.
            with: plus(std(), &["--ipfix", &format!("file:{ipfix_file2}"), "--ipfix-active", "0.0001"]),
            expect: Expect::Check(Box::new(|wo, w| {
                let (a, b) = (wo.u("/ipfix/flow_records"), w.u("/ipfix/flow_records"));
                ok(a == 400 && b > a, || format!("records {a} -> {b}"))
            })),
        },
        Case {
            opt: "--replicate",
            without: base("lb(backends=4)", &[]),
            // Nothing listens on the discard port: the updates are sent all the same (UDP), and counted.
            with: base("lb(backends=4)", &["--replicate", "udp:127.0.0.1:9"]),
            expect: Expect::Check(Box::new(|wo, w| {
                let r = w.at("/replication");
                ok(wo.at("/replication").is_null() && r["role"] == "active" && r["sent_records"] == 200, || format!("{r}"))
            })),
        },
        Case {
            opt: "--replicate-listen",
            without: base("lb(backends=4)", &[]),
            with: base("lb(backends=4)", &["--replicate-listen", "udp:127.0.0.1:0"]),
            expect: Expect::Check(Box::new(|wo, w| {
                let r = w.at("/replication");
                let bound = r["listen"].as_str().is_some_and(|l| l.starts_with("udp:127.0.0.1:") && !l.ends_with(":0"));
                ok(wo.at("/replication").is_null() && r["role"] == "standby" && bound, || format!("{r}"))
            })),
        },
        Case {
            opt: "--replicate-role",
            without: base("lb(backends=4)", &["--replicate", "udp:127.0.0.1:9"]),
            with: base("lb(backends=4)", &["--replicate", "udp:127.0.0.1:9", "--replicate-role", "both"]),
            expect: Expect::Refused("needs --replicate-listen"),
        },
        Case {
            opt: "--scale",
            without: base("fsc", &["--cores", "2"]),
            with: base("fsc", &["--cores", "2", "--scale", "shared"]),
            expect: Expect::Changes(&["/tables/shared_keys"]),
        },
        Case {
            opt: "--scr-history",
            without: scr(&[]),
            with: scr(&["--scr-history", "4"]),
            expect: Expect::Changes(&["/scr/history_bytes_per_packet"]),
        },
        Case {
            opt: "--scr-recovery",
            without: scr(&["--scr-loss", "0.1"]),
            with: scr(&["--scr-loss", "0.1", "--scr-recovery"]),
            expect: Expect::Check(Box::new(|wo, w| {
                let rec = |o: &Out| (0..2).map(|c| o.u(&format!("/scr/cores/{c}/recovered"))).sum::<u64>();
                ok(rec(wo) == 0 && rec(w) > 0, || format!("recovered {} -> {}", rec(wo), rec(w)))
            })),
        },
        Case {
            opt: "--scr-loss",
            without: scr(&[]),
            with: scr(&["--scr-loss", "0.1"]),
            expect: Expect::Changes(&["/nfs/0/packets_in"]),
        },
        Case {
            opt: "--scr-log",
            without: scr(&["--scr-recovery"]),
            with: scr(&["--scr-recovery", "--scr-log", "1024"]),
            expect: Expect::SameResults("a core waits rather than overwrite a log entry another core may need: only its waits change"),
        },
        Case {
            opt: "--seed",
            without: scr(&["--scr-loss", "0.1"]),
            with: scr(&["--scr-loss", "0.1", "--seed", "7"]),
            expect: Expect::Changes(&["/nfs/1/details"]),
        },
        Case {
            opt: "--priority",
            without: base("fsc", &[]),
            with: base("fsc", &["--priority", "dport=80"]),
            expect: Expect::Check(Box::new(|_, w| {
                let (p, n) = (w.u("/scale/priority/packets"), w.u("/scale/priority/normal_packets"));
                ok(p > 0 && p + n == w.u("/packets"), || format!("class {p} + other {n} packets"))
            })),
        },
        Case {
            opt: "--slo-us",
            without: base("fsc", &["--priority", "dport=80"]),
            with: base("fsc", &["--priority", "dport=80", "--slo-us", "5"]),
            expect: Expect::Changes(&["/scale/priority/p99_within_slo"]),
        },
        Case {
            opt: "--long-period-ms",
            without: dys(&["--scale-period-ms", "10"]),
            with: dys(&["--scale-period-ms", "10", "--long-period-ms", "20"]),
            expect: Expect::Check(Box::new(|wo, w| {
                ok(dyssect_long(wo).is_empty() && !dyssect_long(w).is_empty(), || {
                    format!("long decisions {:?} -> {:?}", dyssect_long(wo), dyssect_long(w))
                })
            })),
        },
        Case {
            opt: "--solver-budget-ms",
            // Ten minutes never cut a solve short (200 ms can, on a loaded machine); 1 ms does.
            without: dys(&["--scale-period-ms", "10", "--long-period-ms", "20", "--solver-budget-ms", "600000"]),
            with: dys(&["--scale-period-ms", "10", "--long-period-ms", "20", "--solver-budget-ms", "1"]),
            expect: Expect::Check(Box::new(|wo, w| {
                let cut = |o: &Out| dyssect_long(o).iter().filter(|s| s.contains("time_limit")).count();
                ok(cut(wo) == 0 && cut(w) > 0, || format!("long decisions {:?} -> {:?}", dyssect_long(wo), dyssect_long(w)))
            })),
        },
        Case {
            opt: "--nic-profile",
            without: dys(&[]),
            with: dys(&["--nic-profile", "connectx4"]),
            expect: Expect::Check(Box::new(|wo, w| {
                let p = |o: &Out| o.at("/scale/nic/profile").as_str().unwrap_or("").to_string();
                ok(p(wo) == "ideal" && p(w) == "connectx4", || format!("NIC profile {} -> {}", p(wo), p(w)))
            })),
        },
        Case {
            opt: "--scale-period-ms",
            without: dys(&[]),
            with: dys(&["--scale-period-ms", "10"]),
            expect: Expect::Check(Box::new(|wo, w| {
                // One row of per-core loads per control period: 0.3 s / 100 ms vs / 10 ms.
                let n = |o: &Out| o.at("/scale/controller/loads").as_array().map_or(0, Vec::len);
                ok(n(w) >= n(wo) + 5, || format!("control periods {} -> {}", n(wo), n(w)))
            })),
        },
        // Paced at 1 Gpps the trace arrives at once: 512 entries overflow, the default 4096 hold it.
        Case {
            opt: "--ring",
            without: base("fsc", &["--rate", "1G"]),
            with: base("fsc", &["--rate", "1G", "--ring", "512"]),
            expect: Expect::Changes(&["/scale/rx_ring_full", "/packets"]),
        },
        Case {
            opt: "--virtual-cores",
            without: std(),
            with: plus(std(), &["--virtual-cores", "4"]),
            expect: Expect::Changes(&["/per_core/0/packets", "/scale/workers"]),
        },
        Case {
            opt: "--symmetric-rss",
            without: plus(no(&["run", "--gen", "--flows 200 --packets 2000 --proto tcp-bidir", "--table-capacity", "4096"]), &["--cores", "2", "--json", "--chain", "fsc"]),
            with: plus(no(&["run", "--gen", "--flows 200 --packets 2000 --proto tcp-bidir", "--table-capacity", "4096"]), &["--cores", "2", "--json", "--chain", "fsc", "--symmetric-rss"]),
            // The RSS key is random per run (issue 33), so the cores' shares differ between any two runs;
            // what the option changes for sure is the key's form, which the report names.
            expect: Expect::Changes(&["/symmetric_rss"]),
        },
        Case { opt: "--loops", without: std(), with: plus(std(), &["--loops", "2"]), expect: Expect::Changes(&["/packets"]) },
        Case { opt: "--duration", without: std(), with: plus(std(), &["--duration", "0.05"]), expect: Expect::Changes(&["/packets"]) },
        // Warm-up traffic is processed (the NFs count it) but not measured.
        Case {
            opt: "--warmup",
            without: base("fsc", &["--duration", "0.05"]),
            with: base("fsc", &["--duration", "0.05", "--warmup", "0.05"]),
            expect: Expect::Check(Box::new(|wo, w| {
                let extra = |o: &Out| o.u("/nfs/0/packets_in").saturating_sub(o.u("/packets"));
                ok(extra(wo) == 0 && extra(w) > 0, || format!("unmeasured packets {} -> {}", extra(wo), extra(w)))
            })),
        },
        Case { opt: "--batch", without: std(), with: plus(std(), &["--batch", "4"]), expect: Expect::Changes(&["/latency/batches"]) },
        // 2,000 packets at 20,000/s take 0.1 s.
        Case {
            opt: "--rate",
            without: std(),
            with: plus(std(), &["--rate", "20k"]),
            expect: Expect::Check(Box::new(|_, w| {
                let d = w.at("/duration_s").as_f64().unwrap_or(0.0);
                ok(d > 0.095, || format!("paced run took {d} s"))
            })),
        },
        Case {
            opt: "--pool",
            without: std(),
            with: plus(std(), &["--pool", "512"]),
            expect: Expect::SameResults("a replay's batches return their buffers before the next receive: the pool only sizes memory (live ports' rings use it)"),
        },
        Case {
            opt: "--no-pin",
            without: std(),
            with: plus(std(), &["--no-pin"]),
            expect: Expect::SameResults("pinning chooses the CPU a worker runs on; only timings change"),
        },
        Case {
            opt: "--restamp",
            without: plus(std(), &["--output", &r0]),
            with: plus(std(), &["--output", &r1, "--restamp"]),
            expect: Expect::Check(Box::new(move |_, _| {
                let (a, b) = (pcap(Path::new(&rr0))?, pcap(Path::new(&rr1))?);
                let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
                ok(a.0 == b.0 && a.1 != b.1 && now.abs_diff(b.1) < 3_600_000_000_000, || {
                    format!("first packet at {} ns, restamped {} ns (now {now})", a.1, b.1)
                })
            })),
        },
        Case {
            opt: "--json",
            without: no(&["run", "--gen", GEN, "--table-capacity", "4096", "--cores", "1", "--chain", lb]),
            with: std(),
            expect: Expect::Check(Box::new(|wo, w| {
                ok(wo.json.is_none() && w.json.is_some() && wo.stdout.contains("packets"), || "text vs JSON".to_string())
            })),
        },
        Case {
            // Global (every subcommand's). Captured stderr is not a terminal: no bar or status line either way; with
            // --quiet the results are the same and stderr stays empty (the deprecated --flows still warns).
            opt: "--quiet",
            without: std(),
            with: plus(std(), &["--quiet"]),
            expect: Expect::Check(Box::new(|wo, w| {
                ok(w.stderr.is_empty() && wo.stderr.is_empty() && wo.results() == w.results(), || {
                    format!("stderr {:?} / {:?}", wo.stderr, w.stderr)
                })
            })),
        },
        Case {
            opt: "--help",
            without: std(),
            with: no(&["run", "--help"]),
            expect: Expect::Check(Box::new(|wo, w| {
                ok(w.code == Some(0) && w.stdout.contains("Usage: flowplane run") && !wo.stdout.contains("Usage"), || "help".into())
            })),
        },
    ]
}

fn judge(c: &Case, wo: &Out, w: &Out) -> Result<(), String> {
    let ran = |o: &Out| ok(o.code == Some(0) && o.json.is_some(), || format!("exit {:?}: {}", o.code, o.stderr.trim()));
    let exit0 = |o: &Out| ok(o.code == Some(0), || format!("exit {:?}: {}", o.code, o.stderr.trim()));
    match &c.expect {
        Expect::Changes(ptrs) => {
            ran(wo)?;
            ran(w)?;
            for p in *ptrs {
                let (a, b) = (wo.at(p), w.at(p));
                ok(a != b, || format!("{p} unchanged: {a}"))?;
            }
            Ok(())
        }
        Expect::Refused(msg) => {
            ran(wo)?;
            let lines = w.stderr.trim_end().lines().count();
            ok(w.code == Some(2) && lines == 1 && w.stderr.contains(msg), || {
                format!("expected a one-line refusal naming {msg:?}, got exit {:?}: {}", w.code, w.stderr)
            })
        }
        Expect::SameResults(why) => {
            ran(wo)?;
            ran(w)?;
            ok(wo.results() == w.results(), || {
                format!("results differ, though {why}:\n{}\n{}", wo.results(), w.results())
            })
        }
        Expect::Check(f) => {
            exit0(wo)?;
            exit0(w)?;
            f(wo, w)
        }
    }
}

#[test]
fn every_run_option_changes_the_run_or_is_refused() {
    let dir: PathBuf = std::env::temp_dir().join(format!("flowplane-cli-options-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("in.pcap");
    let g = Command::new(BIN)
        .args(["gen", "--flows", "50", "--packets", "500", "--seed", "2", "-o", trace.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(g.status.success(), "{}", String::from_utf8_lossy(&g.stderr));
    std::fs::write(dir.join("c.toml"), "chain = \"fsc\"\n").unwrap();
    // The standard run's options in a file, with two changed; the command line's --chain overrides the file's.
    std::fs::write(
        dir.join("run.toml"),
        format!("gen = \"{GEN}\"\nflows = 4096\ncores = 2\njson = true\nchain = \"fsc\"\n"),
    )
    .unwrap();

    let cases = cases(&dir);
    let covered: BTreeSet<String> = cases.iter().map(|c| c.opt.to_string()).collect();
    let listed = help_options();
    let missing: Vec<_> = listed.difference(&covered).collect();
    let stale: Vec<_> = covered.difference(&listed).collect();
    assert!(missing.is_empty(), "options without a case (add one to cli_options.rs): {missing:?}");
    assert!(stale.is_empty(), "cases for options `run --help` no longer lists: {stale:?}");
    for c in &cases {
        // The run with the option names it (the one without may give it another value: --cores 1 vs 2).
        assert!(c.with.iter().any(|a| a == c.opt), "{}: the case does not pass it", c.opt);
    }

    let cmds: Vec<Vec<String>> = cases.iter().flat_map(|c| [c.without.clone(), c.with.clone()]).collect();
    let outs = run_all(&cmds);
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|c| judge(c, &outs[&c.without], &outs[&c.with]).err().map(|e| format!("{}: {e}", c.opt)))
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "{} of {} options:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

/// The options that act only in some runs are refused, in one line naming
/// the option, where they would change nothing (found by the walk above).
#[test]
fn options_that_would_change_nothing_are_refused() {
    let out = std::env::temp_dir().join(format!("flowplane-cli-options-r-{}.pcap", std::process::id()));
    let o = out.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["--seed", "7"], "--seed 7"),
        (&["--scale", "scr", "--cores", "2", "--chain", "ddos", "--seed", "7"], "--seed 7"),
        (&["--scr-log", "1024"], "--scr-log 1024"),
        (&["--scale", "scr", "--cores", "2", "--chain", "ddos", "--scr-log", "1024"], "--scr-log 1024"),
        (&["--long-period-ms", "20"], "--long-period-ms 20"),
        (&["--scale", "rsspp", "--cores", "2", "--solver-budget-ms", "20"], "--solver-budget-ms 20"),
        (&["--slo-us", "50"], "--slo-us 50"),
        (&["--scale-period-ms", "10"], "--scale-period-ms 10"),
        (&["--scale", "shared", "--cores", "2", "--scale-period-ms", "10"], "--scale-period-ms 10"),
        (&["--scale", "shared", "--cores", "2", "--symmetric-rss"], "--symmetric-rss"),
        (&["--scale", "scr", "--cores", "2", "--chain", "ddos", "--symmetric-rss"], "--symmetric-rss"),
        (&["--restamp"], "--restamp"),
        (&["--promisc", "--output", o], "--promisc"),
        (&["--eal", "--no-huge", "--output", o], "--eal"),
    ];
    for (extra, name) in cases {
        let mut args = vec!["run", "--gen", GEN, "--table-capacity", "4096", "--json"];
        if !extra.contains(&"--cores") {
            args.extend(["--cores", "1"]);
        }
        args.extend_from_slice(extra);
        let r = Command::new(BIN).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(2), "{extra:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{extra:?}: {err}");
        assert!(err.contains(name), "{extra:?}: {err}");
        assert!(r.stdout.is_empty(), "{extra:?}: nothing run");
    }
    // Refused before any file is created.
    assert!(!out.exists());
}

/// The options under `run --help`'s "Live ports and service" heading.
fn live_options() -> BTreeSet<String> {
    let o = Command::new(BIN).args(["run", "--help"]).output().expect("spawn flowplane");
    let text = String::from_utf8_lossy(&o.stdout);
    let section = text.split("\nLive ports and service:\n").nth(1).expect("the heading");
    // Up to the next heading (a line that starts at the margin).
    section
        .lines()
        .take_while(|l| l.is_empty() || l.starts_with(' '))
        .map(str::trim_start)
        .filter(|l| l.starts_with("--"))
        .filter_map(|l| l.split([' ', ',']).next().map(str::to_string))
        .collect()
}

/// `flowplane ports --json`: every registered port kind.
fn port_kinds() -> Vec<Value> {
    let o = Command::new(BIN).args(["ports", "--json"]).output().expect("spawn flowplane");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice::<Value>(&o.stdout).unwrap().as_array().cloned().unwrap()
}

/// A port of `kind` that names nothing on this machine, from its syntax (`afxdp:IFACE[:QUEUE]` -> `afxdp:fpnosuch0`).
fn absent_port(kind: &Value) -> String {
    let syntax = kind["syntax"].as_str().unwrap();
    format!("{}:fpnosuch0", syntax.split(':').next().unwrap())
}

/// Issue 30: a port option acts only on the port kinds whose registry entry takes it
/// (`flowplane ports`); on a run whose ports are all of other kinds it would change
/// nothing, and is refused in one line before any port is opened. Walks every option
/// under the live heading of `run --help` and every registered kind, so a new option
/// or kind is covered (an option no kind takes must be one of the service options).
#[test]
fn port_options_act_only_on_the_kinds_that_take_them() {
    let kinds = port_kinds();
    assert!(kinds.len() >= 4, "{kinds:?}");
    let taken: BTreeSet<String> = kinds
        .iter()
        .flat_map(|k| k["options"].as_array().unwrap().iter().map(|o| o.as_str().unwrap().to_string()))
        .collect();
    // Served by a live run whatever its ports (the walk above checks them refused on a replay).
    let service: BTreeSet<String> = ["--metrics", "--ctl"].iter().map(|s| s.to_string()).collect();
    let live = live_options();
    assert!(live.contains("--promisc") && live.contains("--metrics") && !live.contains("--chain"), "{live:?}");
    let unowned: Vec<_> = live.iter().filter(|o| !taken.contains(*o) && !service.contains(*o)).collect();
    assert!(
        unowned.is_empty(),
        "live options no port kind takes (declare them in the kind's PortCaps::options): {unowned:?}"
    );
    assert!(taken.is_subset(&live), "kinds take options `run --help` does not list: {taken:?} vs {live:?}");
    // Each option with a value for it, from the help's `--opt <VALUE>`.
    let help =
        String::from_utf8_lossy(&Command::new(BIN).args(["run", "--help"]).output().unwrap().stdout).into_owned();
    let mut checked = 0;
    for opt in &taken {
        let with_value = help.lines().map(str::trim_start).any(|l| l.starts_with(&format!("{opt} <")));
        for k in kinds.iter().filter(|k| k["live"] == true) {
            let port = absent_port(k);
            let mut args = vec!["run", "--input", &port, "--chain", "fsc", "--duration", "0.1", "--json", opt.as_str()];
            if with_value {
                args.push("x");
            }
            let r = Command::new(BIN).args(&args).output().unwrap();
            let err = String::from_utf8_lossy(&r.stderr);
            let takes = k["options"].as_array().unwrap().iter().any(|o| o == opt.as_str());
            // Either way the run cannot start (no such port here): exit 2 in one line.
            assert_eq!(r.status.code(), Some(2), "{args:?}: {err}");
            assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
            let refused = err.contains(&format!("{opt} configures live ports"));
            assert_eq!(refused, !takes, "{args:?}: {err}");
            checked += 1;
        }
    }
    assert!(checked >= 6, "{checked} option x kind pairs");
}
