//! The `flowplane gen` and `flowplane trace` commands end to end: output files,
//! JSON, and one-line errors with exit code 2 on bad options.

use std::path::PathBuf;
use std::process::{Command, Output};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_flowplane"))
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("flowplane-h4-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("spawn flowplane")
}

fn assert_one_line_error(out: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "exit code 2, stderr: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err:?}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains(needle), "'{needle}' not in {err:?}");
}

#[test]
fn gen_then_stats_json() {
    let p = tmp("g.pcap");
    let ps = p.to_str().expect("utf-8 path");
    let out = run(&["gen", "--flows", "200", "--packets", "20000", "--dist", "zipf:1.1", "--seed", "7", "-o", ps]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = run(&["trace", "stats", ps, "--json", "--top", "2"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["packets"], 20_000);
    assert_eq!(v["top_flows"].as_array().map(Vec::len), Some(2));
    assert!(v["flows"].as_u64().is_some_and(|f| f > 100 && f <= 200));
    let text = run(&["trace", "stats", ps]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("zipf exponent"));
    // Same seed again: identical file.
    let q = tmp("g2.pcap");
    let qs = q.to_str().expect("utf-8 path");
    run(&["gen", "--flows", "200", "--packets", "20000", "--dist", "zipf:1.1", "--seed", "7", "-o", qs]);
    assert_eq!(std::fs::read(&p).expect("p"), std::fs::read(&q).expect("q"));
}

#[test]
fn trace_tools_run() {
    let p = tmp("t.pcap");
    let ps = p.to_str().expect("utf-8 path");
    assert!(run(&["gen", "--packets", "1000", "--size", "64..1500", "--proto", "tcp", "-o", ps]).status.success());
    let c = tmp("t64.pcap");
    let out = run(&["trace", "truncate", ps, c.to_str().unwrap(), "--bytes", "64"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let l = tmp("tx4.pcap");
    let out = run(&["trace", "loadscale", ps, l.to_str().unwrap(), "--factor", "4"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value =
        serde_json::from_slice(&run(&["trace", "stats", l.to_str().unwrap(), "--json"]).stdout).expect("json");
    assert_eq!(v["packets"], 1000);
}

#[test]
fn bad_options_give_one_line_errors() {
    let o = tmp("bad.pcap");
    let os = o.to_str().expect("utf-8 path");
    let cases: &[(&[&str], &str)] = &[
        (&["gen", "--dist", "zipf:abc", "-o", os], "--dist"),
        (&["gen", "--dist", "pareto", "-o", os], "--dist"),
        (&["gen", "--flows", "ten", "-o", os], "--flows"),
        (&["gen", "--size", "10", "-o", os], "size"),
        (&["gen", "--size-mix", "64:x", "-o", os], "size mix"),
        (&["gen", "--proto", "sctp", "-o", os], "--proto"),
        (&["gen", "--order", "burst:0", "-o", os], "--order"),
        (&["gen", "--rate", "0", "-o", os], "--rate"),
        (&["gen", "--bogus", "-o", os], "--bogus"),
        (&["gen", "--proto", "gtpu", "--ipv6", "-o", os], "--ipv6"),
        (&["gen", "--new-flow-every", "0", "-o", os], "--new-flow-every"),
        (&["gen", "--dist", "cdf:/nonexistent/cdf.txt", "-o", os], "cdf"),
        (&["gen", "--flows", "10"], "output"),
        (&["gen", "-o", "/nonexistent-dir/x.pcap"], "nonexistent-dir"),
        (&["trace", "stats", "/nonexistent/in.pcap"], "in.pcap"),
        (&["trace", "stats", os, "--top", "many"], "--top"),
        (&["trace", "truncate", os, os, "--bytes", "0"], "--bytes"),
        (&["trace", "loadscale", os, os, "--factor", "0"], "--factor"),
    ];
    for (args, needle) in cases {
        assert_one_line_error(&run(args), needle);
    }
    // A file that is not a trace.
    let junk = tmp("junk.pcap");
    std::fs::write(&junk, b"definitely not a pcap file").expect("write");
    assert_one_line_error(&run(&["trace", "stats", junk.to_str().unwrap()]), "junk.pcap");
}

/// Issue 35, item 5: on a terminal (a pty from util-linux's `script`) `gen` draws a progress bar on stderr; with
/// `--quiet`, or with stderr captured (as every other test here has it), not a byte of one.
#[test]
fn progress_bar_on_a_terminal_only_and_never_with_quiet() {
    let out = tmp("progress.pcap");
    let line = |quiet: &str| {
        format!("{} gen --flows 1000 --packets 400000 -o {} {quiet}", env!("CARGO_BIN_EXE_flowplane"), out.display())
    };
    let pty = |cmd: String| match Command::new("script").args(["-qefc", &cmd, "/dev/null"]).output() {
        Ok(o) if o.status.success() => Some(String::from_utf8_lossy(&o.stdout).into_owned()),
        _ => None,
    };
    let Some(shown) = pty(line("")) else {
        eprintln!("skipped: script(1) cannot give flowplane a terminal here");
        return;
    };
    assert!(shown.contains("writing") && shown.contains("packets ("), "no bar on a terminal: {shown:?}");
    let quiet = pty(line("--quiet")).expect("script ran once already");
    assert!(!quiet.contains("writing") && !quiet.contains('\x1b') && !quiet.contains("wrote"), "{quiet:?}");
    let o = run(&["gen", "--flows", "1000", "--packets", "400000", "-o", out.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && err.lines().count() == 1 && err.starts_with("flowplane: wrote"), "{err:?}");
    assert!(!err.contains('\x1b') && !err.contains('\r'), "progress bytes in captured stderr: {err:?}");
}
