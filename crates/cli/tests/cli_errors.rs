//! Bad input to `flowplane run` and `flowplane bench`: every case exits with code 2 and prints
//! exactly one line on stderr, starting with "flowplane:", naming the problem — never a panic.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Small generated input so cases that get past option parsing stay fast.
const GEN: &str = "--flows 10 --packets 100";

fn tmpdir(name: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("flowplane-qa-err-{}-{n}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flowplane")).args(args).output().expect("spawn flowplane")
}

/// Checks the error contract (`needle`: words of which the message must contain one, separated by
/// `|`); returns a description of the violation, if any, so that one test
/// can report every failing case at once.
fn violation(args: &[&str], needle: &str) -> Option<String> {
    let out = run(args);
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().collect();
    let problem = if err.contains("panicked") {
        "panicked"
    } else if out.status.code() != Some(2) {
        "exit code is not 2"
    } else if lines.len() != 1 {
        "stderr is not exactly one line"
    } else if !lines[0].starts_with("flowplane:") {
        "stderr does not start with 'flowplane:'"
    } else if !needle.split('|').any(|n| lines[0].to_lowercase().contains(&n.to_lowercase())) {
        "the message does not name the problem"
    } else {
        return None;
    };
    Some(format!(
        "{problem}: flowplane {args:?} -> exit {:?}, stderr {err:?} (expected to mention {needle:?})",
        out.status.code()
    ))
}

fn check_all(cases: &[(Vec<&str>, &str)]) {
    let failures: Vec<String> = cases.iter().filter_map(|(args, needle)| violation(args, needle)).collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases break the error contract:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// `run --gen GEN --cores 1 --chain CHAIN`.
fn chain_case<'a>(chain: &'a str, needle: &'a str) -> (Vec<&'a str>, &'a str) {
    (vec!["run", "--gen", GEN, "--cores", "1", "--chain", chain], needle)
}

#[test]
fn bad_chain_specs() {
    check_all(&[
        chain_case("lb -> nosuchnf", "nosuchnf"),
        chain_case("lb -> fsc -> ratelimt(pps=10)", "ratelimt"),
        chain_case("ratelimit(pps=abc)", "pps"),
        chain_case("ratelimit(pps=0)", "pps"),
        chain_case("ratelimit(pps=-5)", "pps"),
        chain_case("lb(backends=100000000)", "backends"),
        chain_case("lb(base=300.1.1.1)", "300.1.1.1"),
        chain_case("lb(bogus=1)", "bogus"),
        chain_case("lb(backends=4, backends=8)", "backends"),
        chain_case("lb -> -> fsc", "->"),
        chain_case("lb(backends=16", "("),
        chain_case("lb(backends)", "backends"),
        chain_case("lb fsc", "fsc"),
        chain_case("", "chain"),
        chain_case("->", "->"),
        chain_case("lb -> fsc ->", "end"),
        chain_case("l\u{e9}b -> fsc", "\u{e9}b"),
    ]);
}

#[test]
fn bad_input_files() {
    let dir = tmpdir("files");
    let missing = dir.join("does-not-exist.pcap");
    let garbage = dir.join("garbage.pcap");
    std::fs::write(&garbage, b"this is not a packet capture, just some text that goes on for a while\n".repeat(20))
        .expect("write garbage");
    let empty = dir.join("empty.pcap");
    std::fs::write(&empty, b"").expect("write empty");
    // A valid pcap, cut in the middle of its file header. (One cut inside a packet record is a capture: its complete
    // packets are replayed and the cut one counted, see cli_hostile.rs.)
    let full = dir.join("full.pcap");
    {
        use flowplane_trace::{PcapWriter, WriterOptions};
        let mut w = PcapWriter::create(&full, WriterOptions::default()).expect("create pcap");
        let frame = [0u8; 60];
        for i in 0..3u64 {
            w.write_packet(i * 1000, &frame, 60).expect("write packet");
        }
        w.finish().expect("finish pcap");
    }
    let bytes = std::fs::read(&full).expect("read pcap");
    let header_only_cut = dir.join("cut-header.pcap");
    std::fs::write(&header_only_cut, &bytes[..12]).expect("write cut header");
    let a_dir = dir.join("a-directory");
    std::fs::create_dir_all(&a_dir).expect("mkdir");
    let input = |p: &Path, needle: &'static str| -> (Vec<String>, &'static str) {
        (["run", "--cores", "1", "--chain", "lb -> fsc", "--input", s(p)].map(str::to_string).to_vec(), needle)
    };
    let cases = [
        input(&missing, "does-not-exist.pcap"),
        input(&garbage, "garbage.pcap"),
        input(&empty, "empty.pcap"),
        input(&header_only_cut, "cut-header.pcap"),
        input(&a_dir, "a-directory"),
    ];
    let cases: Vec<(Vec<&str>, &str)> =
        cases.iter().map(|(a, n)| (a.iter().map(String::as_str).collect(), *n)).collect();
    check_all(&cases);
}

#[test]
fn bad_options() {
    let dir = tmpdir("opts");
    let out_in_missing_dir = dir.join("no-such-dir").join("out.pcap");
    let csv = dir.join("flows.csv");
    let export_unknown_nf = format!("nosuchnf={}", s(&csv));
    let export_no_ext = format!("fsc={}", s(&dir.join("flows.txt")));
    let export_missing_dir = format!("fsc={}", s(&dir.join("no-such-dir").join("f.csv")));
    let base = ["run", "--gen", GEN, "--chain", "lb -> fsc"];
    let with =
        |extra: &[&'static str]| -> Vec<&'static str> { base.iter().copied().chain(extra.iter().copied()).collect() };
    let owned: Vec<(Vec<String>, &str)> = vec![
        (vec!["--output".into(), s(&out_in_missing_dir).into()], "out.pcap"),
        (vec!["--export".into(), export_unknown_nf, "--cores".into(), "1".into()], "nosuchnf"),
        (vec!["--export".into(), export_no_ext, "--cores".into(), "1".into()], "--export"),
        (vec!["--export".into(), export_missing_dir, "--cores".into(), "1".into()], "f.csv"),
    ];
    let mut cases: Vec<(Vec<&str>, &str)> = vec![
        (with(&["--bogus"]), "--bogus"),
        (vec!["frobnicate"], "frobnicate"),
        (with(&["--cores", "0"]), "--cores"),
        (with(&["--cores", "abc"]), "--cores"),
        (with(&["--cores", "-1"]), "-1|--cores"),
        (with(&["--cores", "100000"]), "--cores"),
        (with(&["--batch", "0"]), "--batch"),
        (with(&["--batch", "257"]), "--batch"),
        (with(&["--batch", "many"]), "--batch"),
        (with(&["--duration", "0"]), "--duration"),
        (with(&["--duration", "-1"]), "-1|--duration"),
        (with(&["--duration=-1"]), "--duration"),
        (with(&["--duration", "NaN"]), "--duration"),
        (with(&["--duration", "inf"]), "--duration"),
        (with(&["--duration", "soon"]), "--duration"),
        (with(&["--loops", "0"]), "--loops"),
        (with(&["--export", "fsc"]), "--export"),
        (with(&["--export", "=x.csv"]), "--export"),
        (with(&["--exec", "turbo"]), "--exec"),
        // The reason is in the one line: the known executors, or the parameter's range.
        (with(&["--exec", "turbo"]), "known: batch, rtc"),
        (with(&["--exec", "interleaved:0"]), "must be an integer in 1..=64"),
        (with(&["--exec", "batch:3"]), "takes no parameter"),
        (with(&["--table-full", "bogus"]), "(one of: reject, evict)"),
        // Rates take k/M/G suffixes everywhere (gen, run, mlffr, bench dyssect): a bad one is named.
        (vec!["mlffr", "--max-rate", "2x", "--chain", "forward"], "for '--max-rate <MAX_RATE>': expected a number"),
        (vec!["bench", "dyssect", "--rate", "abc"], "for '--rate <RATE>': expected a number between 1 and"),
        (with(&["--scale", "bogus"]), "(one of: rss, shared"),
        (with(&["--rate", "0"]), "--rate"),
        (with(&["--table-capacity", "0"]), "--table-capacity"),
        (with(&["--flows", "64", "--table-capacity", "64"]), "both given"),
        (with(&["--pool", "1"]), "--pool"),
        (with(&["--idle-timeout", "-3"]), "-3|--idle-timeout"),
        (vec!["run", "--gen", "--flows abc", "--cores", "1"], "--flows"),
        (vec!["run", "--gen", "--packets 0", "--cores", "1"], "packet"),
        (vec!["run", "--gen", GEN, "--input", "x.pcap"], "--input"),
        (vec!["bench", "pipeline", "--seconds", "-1"], "-1|--seconds"),
        (vec!["bench", "pipeline", "--seconds=-1"], "--seconds"),
        (vec!["bench", "pipeline", "--seconds", "0"], "--seconds"),
        (vec!["bench", "pipeline", "--only", "nothing"], "--only"),
        (vec!["bench", "io", "--seconds=-1"], "--seconds"),
    ];
    let owned_cases: Vec<(Vec<String>, &str)> =
        owned.into_iter().map(|(extra, n)| (base.iter().map(|x| x.to_string()).chain(extra).collect(), n)).collect();
    cases.extend(owned_cases.iter().map(|(a, n)| (a.iter().map(String::as_str).collect::<Vec<_>>(), *n)));
    check_all(&cases);
}

#[test]
fn help_and_version_are_not_errors() {
    for args in [&["--help"][..], &["--version"], &["run", "--help"], &["bench", "pipeline", "--help"]] {
        let out = run(args);
        assert_eq!(out.status.code(), Some(0), "flowplane {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(!out.stdout.is_empty(), "flowplane {args:?} printed nothing");
        assert!(out.stderr.is_empty(), "flowplane {args:?} wrote to stderr");
    }
}

#[test]
fn a_closed_stdout_ends_the_command_quietly() {
    // `flowplane nfs | head -1`: the reader goes away before (or while) we write.
    use std::process::Stdio;
    for args in [vec!["nfs"], vec!["nfs", "--json"]] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_flowplane"))
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn flowplane");
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("wait");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: exit {:?}, stderr {err}", out.status.code());
        assert!(!err.contains("panicked") && !err.contains("Broken pipe"), "{args:?}: {err}");
    }
}

/// Values the CLI accepts but the machine cannot hold, files that never end and rates that never finish
/// (issue 29): each is refused with one line before anything big is allocated or read — no SIGABRT, no OOM
/// kill, and fast (the whole set in well under a second of work each).
#[test]
fn limits_instead_of_aborts() {
    let dir = tmpdir("limits");
    // A regular file just past the 64 MiB cap for rule/route/session/chain files (sparse: no disk used).
    let big = dir.join("big.rules");
    std::fs::File::create(&big).and_then(|f| f.set_len((64 << 20) + 1)).expect("sparse file");
    let big_acl = format!("acl(rules={})", s(&big));
    let zero_gen = "--flows 10 --packets 100 --size-mix /dev/zero";
    let base = ["run", "--gen", GEN, "--cores", "1"];
    let with =
        |extra: &[&'static str]| -> Vec<&'static str> { base.iter().copied().chain(extra.iter().copied()).collect() };
    let mut cases: Vec<(Vec<&str>, &str)> = vec![
        // The documented maximum of --table-capacity: 2^30 flows per core, >100 GiB of tables.
        (with(&["--table-capacity", "1073741824"]), "--table-capacity"),
        (with(&["--table-capacity", "1073741824", "--chain", "srcctr"]), "--table-capacity"),
        (with(&["--chain", "amf(ues=16777216)"]), "ues"),
        (with(&["--chain", "synthetic(mem=16G)", "--virtual-cores", "64"]), "mem"),
        (vec!["run", "--gen", "--packets 1000000000", "--cores", "1"], "--packets"),
        (vec!["run", "--gen", "--packets 1000000000 --proto tcp", "--cores", "1"], "--packets"),
        (with(&["--chain", "ddos", "--scale", "scr", "--scr-recovery", "--scr-log", "4294967296"]), "--scr-log"),
        (with(&["--chain-file", "/dev/zero"]), "/dev/zero"),
        (with(&["--chain", "acl(rules=/dev/zero)"]), "/dev/zero"),
        (with(&["--chain", "route(routes=/dev/zero)"]), "/dev/zero"),
        (with(&["--chain", "upf(sessions=/dev/zero)"]), "/dev/zero"),
        (vec!["run", "--gen", zero_gen, "--cores", "1"], "/dev/zero"),
        (with(&["--rate", "1e-9"]), "--rate"),
        (with(&["--rate", "0.5"]), "--rate"),
        (with(&["--rate", "10", "--loops", "100000000"]), "--rate"),
    ];
    cases.push((vec!["run", "--gen", GEN, "--cores", "1", "--chain", &big_acl], "64 MiB"));
    let t = std::time::Instant::now();
    check_all(&cases);
    // Refused before allocating or reading: the 64 MiB file is the slowest case.
    assert!(t.elapsed() < std::time::Duration::from_secs(20), "{:?}", t.elapsed());
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[test]
fn run_rate_takes_suffixes_like_gen() {
    let out = run(&["run", "--gen", GEN, "--cores", "1", "--chain", "fsc", "--rate", "2M", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Issue 35 item 7: `run --flows` was the table capacity per core while `gen --flows` is the flow population;
/// the capacity is now `--table-capacity`, and `--flows` its deprecated name: the same run, one warning line.
#[test]
fn run_flows_is_the_deprecated_name_of_table_capacity() {
    let gen = "--flows 200 --packets 2000 --seed 1";
    let args = |opt: &'static str| ["run", "--gen", gen, "--cores", "1", "--chain", "fsc", "--json", opt, "64"];
    let (old, new) = (run(&args("--flows")), run(&args("--table-capacity")));
    assert!(old.status.success() && new.status.success(), "{}", String::from_utf8_lossy(&old.stderr));
    let warn = String::from_utf8_lossy(&old.stderr);
    let lines: Vec<&str> = warn.lines().filter(|l| l.contains("deprecated")).collect();
    assert_eq!(lines.len(), 1, "{warn}");
    assert!(lines[0].contains("--table-capacity") && lines[0].contains("gen's --flows"), "{warn}");
    assert!(!String::from_utf8_lossy(&new.stderr).contains("deprecated"));
    let json = |o: &Output| serde_json::from_slice::<serde_json::Value>(&o.stdout).expect("JSON report");
    let (a, b) = (json(&old), json(&new));
    // 200 flows in a table of 64: the same capacity, the same refusals.
    assert_eq!(a["tables"]["capacity"], b["tables"]["capacity"]);
    assert_eq!(a["tables"]["table_full"], b["tables"]["table_full"]);
    assert!(b["tables"]["table_full"].as_u64().unwrap() > 0, "{}", b["tables"]);
}

/// Issue 35 item 6: user input echoed in an error is escaped — `--chain $'\x1b[2J...'` cleared the terminal and a
/// newline broke the one line. Every message is one line of printable characters, on both paths (clap's usage
/// errors and flowplane's own).
#[test]
fn user_input_in_errors_is_escaped() {
    // (arguments, what the line shows of the input: escaped by flowplane; clap drops ANSI sequences itself)
    let cases: [(&[&str], &str); 4] = [
        (&["run", "--gen", GEN, "--cores", "1", "--chain", "\x1b[2J\x1b[Hbad\nnf\r"], "\\u{1b}[2J"),
        (&["run", "--cores", "1", "--input", "no\x07such\n.pcap"], "no\\u{7}such .pcap"),
        (&["run", "--gen", GEN, "--exec", "\x1b[31mturbo"], "'turbo'"),
        (&["trace", "stats", "\x1b]0;title\x07.pcap"], "\\u{7}.pcap"),
    ];
    for (args, shown) in cases {
        let out = run(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        let line = err.strip_suffix('\n').unwrap_or(&err);
        assert!(!line.is_empty() && !line.chars().any(char::is_control), "{args:?}: {err:?}");
        assert!(line.starts_with("flowplane:"), "{args:?}: {err:?}");
        // The input is still named: a reader sees what was typed.
        assert!(line.contains(shown), "{args:?}: {err:?} should show {shown:?}");
    }
}
