//! Bad port names and options: one line on stderr, exit code 2, no panic.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_flowplane");

fn fails(args: &[&str], needle: &str) {
    let out = Command::new(BIN).args(args).output().expect("spawn flowplane");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: one line: {err}");
    assert!(err.contains(needle), "{args:?}: '{needle}' not in: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn bad_ports_are_one_line_errors() {
    fails(&["run", "--input", "afpacket:fp-nosuch0", "--chain", "forward"], "interface fp-nosuch0");
    fails(&["run", "--input", "afpacket:a/b", "--chain", "forward"], "afpacket:a/b");
    fails(&["run", "--input", "afxdp:eth0:x", "--chain", "forward"], "queue must be a number");
    fails(&["run", "--gen", "--flows 10 --packets 10", "--port", "afpacket:lo"], "needs --output");
    fails(&["run", "--gen", "--flows 10 --packets 10", "--metrics", "nonsense"], "--metrics nonsense");
    fails(&["run", "--input", "afpacket:lo", "--rate", "10"], "not to a live port");
    fails(&["run", "--gen", "--flows 10 --packets 10", "--output", "afpacket:fp-nosuch1"], "interface fp-nosuch1");
}
