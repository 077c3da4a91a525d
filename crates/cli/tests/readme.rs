//! The README's command lines run (issue 35, item 8): every line of its ```sh blocks that
//! starts with `flowplane ` is read from README.md when the test runs, brought to CI size by
//! the rules below, and must exit 0 — so a README line cannot rot. Lines that need what a test
//! machine lacks (root for live ports, DPDK, a running process to talk to, an SMF) are skipped,
//! each by a rule naming the tests that cover it; a new README line runs unless a rule skips it.
//!
//! CI size, for a newcomer: every run reads small traffic (1,000 flows, 5,000 packets), `...`
//! becomes `--gen` of that traffic, `a|b|c` the first choice, `[x]` is left out, `--duration`
//! is 0.2 s, tables hold 65,536 flows per core, `synthetic(...)` gets a 4 MB array; each `bench` suite runs `--quick` with the few
//! rows [`bench_size`] names.

use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_flowplane");
/// The traffic of a `run` line that names none.
const SMALL_GEN: &str = "--flows 1000 --packets 5000 --seed 1";

/// The README's command lines: each `flowplane ...` line of a ```sh block, without its comment.
fn readme_commands() -> Vec<String> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md")).expect("README");
    let mut out = Vec::new();
    let mut in_sh = false;
    for line in text.lines() {
        if line.starts_with("```") {
            in_sh = !in_sh && line.trim() == "```sh";
            continue;
        }
        if in_sh && line.starts_with("flowplane ") {
            out.push(without_comment(line).trim().to_string());
        }
    }
    out
}

/// `line` up to a ` #` outside quotes.
fn without_comment(line: &str) -> &str {
    let mut quoted = false;
    for (i, c) in line.char_indices() {
        match c {
            '"' => quoted = !quoted,
            '#' if !quoted && line[..i].ends_with(' ') => return &line[..i],
            _ => {}
        }
    }
    line
}

/// Why a README line cannot run on a test machine (None: it runs).
fn skipped(line: &str) -> Option<&'static str> {
    if line.contains("afpacket:") || line.contains("afxdp:") {
        Some("live ports need root (ports_live.rs, ports_afpacket.rs, ports_afxdp.rs, ports_mlffr.rs)")
    } else if line.contains("dpdk:") {
        Some("DPDK needs --features dpdk (ports_dpdk.rs)")
    } else if line.starts_with("flowplane ctl ") {
        Some("talks to a live run's control socket (ports_ctl.rs, cli_served.rs)")
    } else if line.contains("pfcp=") {
        Some("an SMF drives it over PFCP (cli_upf.rs)")
    } else {
        None
    }
}

/// Shell words (double quotes group; no escapes in the README's lines).
fn words(line: &str) -> Vec<String> {
    let (mut out, mut cur, mut quoted, mut any) = (Vec::new(), String::new(), false, false);
    for c in line.chars() {
        match c {
            '"' => (quoted, any) = (!quoted, true),
            ' ' if !quoted => {
                if any {
                    out.push(std::mem::take(&mut cur));
                }
                any = false;
            }
            c => {
                cur.push(c);
                any = true;
            }
        }
    }
    if any {
        out.push(cur);
    }
    out
}

/// Generator options at CI size.
fn small_gen(opts: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for w in opts {
        let prev = out.last().map(String::as_str);
        let w = match (prev, w.parse::<u64>()) {
            (Some("--flows"), Ok(n)) => n.min(1000).to_string(),
            (Some("--packets"), Ok(n)) => n.min(5000).to_string(),
            (Some("--sessions"), Ok(n)) => n.min(50).to_string(),
            (Some("--pdrs"), Ok(n)) => n.min(4).to_string(),
            (Some("--upf"), _) => format!("50x4:{}", w.rsplit(':').next().unwrap_or("both")),
            _ => w.clone(),
        };
        out.push(w);
    }
    out
}

/// The few rows each `bench` suite runs here (its README line measures all of them).
fn bench_size(suite: &str, dir: &Path) -> Vec<String> {
    let d = dir.display().to_string();
    let v: &[&str] = match suite {
        "io" | "parse" => &[],
        "table" => &["--sizes", "1024", "--batches", "1", "--insert-every", "10", "--ops", "20000"],
        "pipeline" => &["--only", "chains", "--base-flows", "1000", "--seconds", "0.05"],
        "upf" => &[
            "--sessions",
            "100",
            "--pdrs",
            "1",
            "--exec",
            "batch",
            "--dir",
            "ul",
            "--mode",
            "rtc",
            "--amf-ues",
            "0",
            "--seconds",
            "0.05",
            "--packets",
            "5000",
        ],
        "interleave" => &["--only", "chain", "--ks", "1", "--seconds", "0.05", "--warmup", "0.02"],
        "scaling" => &[
            "--chains",
            "fw",
            "--traffic",
            "uniform",
            "--strategies",
            "rss",
            "--cores",
            "1,2",
            "--seconds",
            "0.05",
            "--packets",
            "5000",
            "--flows",
            "500",
        ],
        "dyssect" => {
            &["--traces", "uniform", "--cores", "2", "--packets", "5000", "--flows", "500", "--seconds", "0.05"]
        }
        "scr" => &[
            "--programs",
            "ddos",
            "--traces",
            "single",
            "--strategies",
            "scr",
            "--cores",
            "1",
            "--burn",
            "0",
            "--losses",
            "0",
            "--packets",
            "5000",
            "--loops",
            "1",
        ],
        other => panic!("bench {other}: add its CI size to bench_size"),
    };
    let mut out: Vec<String> = std::iter::once("--quick").chain(v.iter().copied()).map(String::from).collect();
    if matches!(suite, "scaling" | "dyssect" | "scr") {
        out.extend(["--png".to_string(), d]);
    }
    out
}

/// A README line as it runs here.
fn ci_size(line: &str, dir: &Path) -> Vec<String> {
    // `a | b ...`: the first alternative (with the rest of the line after the last one).
    let line = match line.split_once(" | ") {
        Some((a, b)) => format!("{a} {}", b.split_once(' ').map_or("", |x| x.1)),
        None => line.to_string(),
    };
    let mut w: Vec<String> = words(&line)
        .into_iter()
        .filter(|w| !(w == "..." || (w.starts_with('[') && w.ends_with(']'))))
        .map(|w| {
            // `interleaved[:K]` -> `interleaved`; `rtc|pernf` -> `rtc` (not inside a chain or an option string).
            let w = match (w.find('['), w.ends_with(']')) {
                (Some(i), true) => w[..i].to_string(),
                _ => w,
            };
            if w.contains('|') && !w.contains(' ') && !w.contains('(') {
                w.split('|').next().unwrap_or_default().to_string()
            } else if w.starts_with("synthetic(") && !w.contains("mem=") {
                // The synthetic NF's array (256 MiB by default) at CI size.
                w.replacen(')', ", mem=4M)", 1)
            } else {
                w
            }
        })
        .collect();
    assert_eq!(w[0], "flowplane", "{line}");
    w.remove(0);
    let mut out = Vec::new();
    let mut i = 0;
    while i < w.len() {
        let x = w[i].clone();
        match x.as_str() {
            "--gen" if i + 1 < w.len() => {
                out.push(x);
                out.push(small_gen(&words(&w[i + 1])).join(" "));
                i += 2;
                continue;
            }
            "--duration" if i + 1 < w.len() => {
                out.extend(["--duration".to_string(), "0.2".to_string()]);
                i += 2;
                continue;
            }
            _ => out.push(x),
        }
        i += 1;
    }
    let mut out = match out.first().map(String::as_str) {
        Some("gen") | Some("upf") => small_gen(&out),
        _ => out,
    };
    let sub = out.first().cloned().unwrap_or_default();
    if sub == "run" || sub == "mlffr" {
        if !out.iter().any(|x| x == "--input" || x == "--gen" || x == "--config") {
            out.extend(["--gen".to_string(), SMALL_GEN.to_string()]);
        }
        if !out.iter().any(|x| x == "--cores") {
            out.extend(["--cores".to_string(), "1".to_string()]);
        }
        if !out.iter().any(|x| x == "--table-capacity") {
            out.extend(["--table-capacity".to_string(), "65536".to_string()]);
        }
    }
    if sub == "mlffr" {
        out.extend(["--trial", "0.05", "--resolution", "25", "--warmup", "0.02"].map(String::from));
    }
    if sub == "bench" {
        let suite = out.get(1).cloned().unwrap_or_default();
        out.extend(bench_size(&suite, dir));
    }
    out
}

#[test]
fn every_readme_command_line_runs() {
    let dir = std::env::temp_dir().join(format!("flowplane-readme-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // The files the README's lines read besides what earlier lines write.
    std::fs::write(dir.join("chain.toml"), "[[nf]]\nname = \"fsc\"\n\n[[nf]]\nname = \"hh\"\n").unwrap();
    let lines = readme_commands();
    assert!(lines.len() > 25, "{lines:?}");
    let (mut ran, mut skips, mut times) = (0, Vec::new(), Vec::new());
    let t = std::time::Instant::now();
    for line in &lines {
        if let Some(why) = skipped(line) {
            skips.push(format!("{line}: {why}"));
            continue;
        }
        let args = ci_size(line, &dir);
        let t0 = std::time::Instant::now();
        let o = Command::new(BIN).args(&args).current_dir(&dir).output().expect("spawn flowplane");
        times.push((t0.elapsed(), line.clone()));
        assert!(
            o.status.success(),
            "README: `{line}`\nran as flowplane {args:?}: exit {:?}\n{}",
            o.status.code(),
            String::from_utf8_lossy(&o.stderr)
        );
        ran += 1;
    }
    times.sort();
    let slowest: Vec<String> = times.iter().rev().take(5).map(|(d, l)| format!("{d:.1?} {l}")).collect();
    eprintln!(
        "{ran} README lines ran in {:?}, slowest:\n{}\nskipped:\n{}",
        t.elapsed(),
        slowest.join("\n"),
        skips.join("\n")
    );
    // Most lines run; the skips are the live-port, DPDK, control-socket and SMF lines.
    assert!(ran > 2 * skips.len(), "ran {ran}, skipped {skips:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn readme_lines_are_brought_to_ci_size_as_documented() {
    let d = Path::new("/tmp");
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert_eq!(
        ci_size("flowplane run --exec rtc|pernf|microbatch ...", d),
        s(&["run", "--exec", "rtc", "--gen", SMALL_GEN, "--cores", "1", "--table-capacity", "65536"])
    );
    assert_eq!(
        ci_size("flowplane run --no-packing | --no-match-sharing ...", d),
        s(&["run", "--no-packing", "--gen", SMALL_GEN, "--cores", "1", "--table-capacity", "65536"])
    );
    assert_eq!(ci_size("flowplane nfs [NAME] [--json]", d), s(&["nfs"]));
    assert_eq!(
        ci_size(
            "flowplane run --gen \"--flows 100000 --packets 1000000 --proto tcp-bidir\" --chain fw --duration 5",
            d
        ),
        s(&[
            "run",
            "--gen",
            "--flows 1000 --packets 5000 --proto tcp-bidir",
            "--chain",
            "fw",
            "--duration",
            "0.2",
            "--cores",
            "1",
            "--table-capacity",
            "65536"
        ])
    );
    assert_eq!(
        ci_size("flowplane gen --proto gtpu --upf 130000x16:both --packets 4000000 -o upf.pcap", d),
        s(&["gen", "--proto", "gtpu", "--upf", "50x4:both", "--packets", "5000", "-o", "upf.pcap"])
    );
    assert_eq!(ci_size("flowplane run --exec interleaved[:K] ...", d)[2], "interleaved");
    assert_eq!(ci_size("flowplane mlffr --chain \"synthetic(k=8)\" --cores 1 ...", d)[2], "synthetic(k=8, mem=4M)");
    assert_eq!(without_comment("flowplane x \"a # b\"  # c"), "flowplane x \"a # b\"  ");
    assert!(skipped("flowplane ctl /run/fp.sock show runtime|errors").is_some());
}
