//! `flowplane mlffr` on live ports (root): two network namespaces, each
//! joined by a veth pair to an interface flowplane runs on; flowplane's own
//! sender injects into the first namespace's end and its receiver counts in
//! the second's. The chain burns cycles (`burn`) so that flowplane, not the
//! sender, is the limit. A short search must find a loss-free rate above zero, keep
//! its bracket consistent (loss-free rates rise, lossy ones fall), report no
//! loss beyond the threshold at the rate it names, and report cycles per
//! packet beside the in-memory replay's. Namespaces and interfaces get
//! unique names and are removed even when the test fails; a machine where
//! they cannot be made fails loudly.

use std::process::{Command, Stdio};
use std::sync::Mutex;

const BIN: &str = env!("CARGO_BIN_EXE_flowplane");

/// The searches share two CPUs: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

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
        "{args:?} failed (this test needs root, iproute2 and network namespaces): {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Two namespaces and two veth pairs; removed on drop.
struct Topo {
    ns_a: String,
    ns_b: String,
    fa: String,
    fb: String,
}

impl Topo {
    fn new(tag: &str) -> Topo {
        let id = format!("{tag}{}", std::process::id() % 100_000);
        let t =
            Topo { ns_a: format!("fmA{id}"), ns_b: format!("fmB{id}"), fa: format!("ma{id}"), fb: format!("mb{id}") };
        t.cleanup();
        must(&["ip", "netns", "add", &t.ns_a]);
        must(&["ip", "netns", "add", &t.ns_b]);
        must(&["ip", "link", "add", &t.fa, "type", "veth", "peer", "name", "v0", "netns", &t.ns_a]);
        must(&["ip", "link", "add", &t.fb, "type", "veth", "peer", "name", "v0", "netns", &t.ns_b]);
        for (ns, me) in [(&t.ns_a, &t.fa), (&t.ns_b, &t.fb)] {
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
    }
}

fn f(v: &serde_json::Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or_else(|| panic!("{k} in {v}"))
}

fn search(backend: &str, tag: &str) {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let t = Topo::new(tag);
    let out = Command::new(BIN)
        .args(["mlffr", "--input", &format!("{backend}:{}", t.fa), "--output", &format!("{backend}:{}", t.fb)])
        .args(["--send", &format!("afpacket:v0@{}", t.ns_a), "--recv", &format!("afpacket:v0@{}", t.ns_b)])
        .args(["--trace-gen", "--flows 64 --packets 5000 --size 64 --proto udp --seed 3"])
        .args(["--chain", "burn(iters=2000)", "--cores", "1", "--no-pin"])
        .args(["--trial", "0.3", "--warmup", "0.1", "--resolution", "25", "--drain", "0.02", "--json"])
        .output()
        .expect("spawn flowplane");
    assert!(out.status.success(), "{backend}: mlffr failed: {}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let (mlffr, max, thr) = (f(&r, "mlffr_pps"), f(&r, "sender_max_pps"), f(&r, "loss_threshold"));
    assert!(mlffr > 0.0 && max > 0.0 && mlffr <= max * 1.001, "{backend}: mlffr {mlffr}, sender max {max}: {r}");
    assert!((thr - 0.001).abs() < 1e-12, "default threshold 0.1%");
    let trials = r["trials"].as_array().expect("trials");
    assert!(!trials.is_empty() && f(&trials[0], "rate_pps") == 0.0, "the sender flat out first");
    for tr in trials {
        let (o, g, l) = (f(tr, "offered"), f(tr, "received"), f(tr, "lost"));
        assert!(o > 0.0 && g + l == o, "{backend}: offered = received + lost: {tr}");
        assert_eq!(tr["loss_free"].as_bool(), Some(f(tr, "loss") <= thr), "{tr}");
    }
    // The bracket: every loss-free rate asked is below every lossy one asked after it, and rises.
    // A rate may be asked twice in a row (a lossy trial repeated, `--retries`; a short sender's
    // loss-free trial tried again): its two answers may differ.
    // The search goes on from the last answer at a rate, so a rate asked again in a row counts once,
    // as its last answer; a loss-free trial whose sender fell short counts at the rate it offered
    // (as the search credits it).
    // A short sender's loss-free trial below the bracket's floor moves nothing (the search keeps its
    // floor): it says what the sender managed on a loaded machine, not where flowplane starts losing.
    let mut runs: Vec<(f64, (f64, bool, bool))> = Vec::new();
    for tr in &trials[1..] {
        let (asked_at, ok) = (f(tr, "rate_pps"), tr["loss_free"].as_bool().unwrap());
        let offered = f(tr, "offered_pps");
        let now = (if ok { asked_at.min(offered) } else { asked_at }, ok, ok && offered < asked_at * 0.99);
        match runs.last_mut() {
            Some(last) if last.0 == asked_at => last.1 = now,
            _ => runs.push((asked_at, now)),
        }
    }
    let asked: Vec<(f64, bool, bool)> = runs.into_iter().map(|r| r.1).collect();
    for (i, a) in asked.iter().enumerate() {
        for b in &asked[i + 1..] {
            match (a.1, b.1) {
                (true, true) => assert!(b.0 >= a.0 || b.2, "{backend}: loss-free rates rise: {asked:?}"),
                (false, false) => assert!(b.0 <= a.0, "{backend}: lossy rates fall: {asked:?}"),
                (true, false) => assert!(b.0 >= a.0, "{backend}: lossy above loss-free: {asked:?}"),
                (false, true) => assert!(b.0 <= a.0, "{backend}: loss-free below lossy: {asked:?}"),
            }
        }
    }
    // The rate reported is a trial's, loss-free (within the threshold) with nothing reordered.
    let at = trials
        .iter()
        .find(|tr| tr["loss_free"].as_bool() == Some(true) && (f(tr, "offered_pps").min(mlffr) - mlffr).abs() < 1.0)
        .or_else(|| trials.iter().find(|tr| tr["loss_free"].as_bool() == Some(true) && f(tr, "rate_pps") == mlffr))
        .unwrap_or_else(|| panic!("{backend}: no loss-free trial at {mlffr}: {r}"));
    assert!(f(at, "loss") <= thr && f(at, "reordered") == 0.0, "{at}");
    assert!(f(&r, "cycles_per_packet") > 0.0, "{r}");
    assert!(f(&r, "replay_cycles_per_packet") > 0.0, "{r}");
    assert_eq!(r["chain"], "burn(iters=2000)");
    // The chain is slower than the sender (burn), so the search searched: the flat-out trial lost.
    assert_eq!(trials[0]["loss_free"].as_bool(), Some(false), "{backend}: {r}");
    assert!(mlffr < max, "{backend}: {r}");
    // Teardown: no XDP program left on flowplane's interfaces.
    for me in [&t.fa, &t.fb] {
        let l = Command::new("ip").args(["-d", "link", "show", me]).output().unwrap();
        assert!(!String::from_utf8_lossy(&l.stdout).contains("prog/xdp"), "{backend}: XDP program left on {me}");
    }
}

#[test]
fn mlffr_over_veth_with_afpacket_finds_a_sane_rate() {
    search("afpacket", "p");
}

/// Fails loudly where AF_XDP was not built in (libxdp-dev/libbpf-dev missing at build time), as the other AF_XDP tests.
#[test]
fn mlffr_over_veth_with_afxdp_finds_a_sane_rate() {
    search("afxdp", "x");
}

#[test]
fn mlffr_on_ports_says_what_is_missing_in_one_line() {
    let run = |args: &[&str]| {
        let out = Command::new(BIN).arg("mlffr").args(args).output().expect("spawn flowplane");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let e = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(e.trim().lines().count(), 1, "{e}");
        e
    };
    let e = run(&["--input", "afpacket:lo", "--output", "afpacket:lo", "--chain", "forward"]);
    assert!(e.contains("--send"), "{e}");
    let e =
        run(&["--input", "afpacket:lo", "--output", "afpacket:lo", "--send", "afpacket:v0@ns", "--chain", "forward"]);
    assert!(e.contains("--recv"), "{e}");
    let e = run(&["--input", "afpacket:lo", "--send", "afpacket:v0", "--recv", "afpacket:v1", "--chain", "forward"]);
    assert!(e.contains("--output"), "{e}");
    let e = run(&["--input", "afpacket:lo", "--output", "o.pcap", "--send", "afpacket:v0", "--recv", "afpacket:v1"]);
    assert!(e.contains("live ports only"), "{e}");
    let e = run(&[
        "--input",
        "afpacket:lo",
        "--output",
        "afpacket:lo",
        "--send",
        "dpdk:net_null0",
        "--recv",
        "afpacket:v1",
    ]);
    assert!(e.contains("--send"), "{e}");
    let e = run(&["--gen", "--flows 10 --packets 100", "--send", "afpacket:v0", "--chain", "forward"]);
    assert!(e.contains("live ports"), "{e}");
}
