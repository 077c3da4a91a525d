//! `flowplane run --gen "..."`: the option string goes through `flowplane gen`'s own parser
//! (`flowplane_cli::parse_gen_config`); it never panics, errors are one line naming `--gen` or
//! an option, and a configuration it accepts builds a generator whose trace has exactly the
//! packets asked for, in time order, each a frame the NFs' parser accepts.
//!
//! Kept off the filesystem and fast: inputs that could name a file (`--dist cdf:FILE`, a
//! `--size-mix` value that is not an inline `SIZE:WEIGHT` list or `imix`) are skipped, and
//! accepted configurations over 4096 flows, 2048 packets or 1024 scanners are not generated.
#![no_main]

use flowplane_cli::parse_gen_config;
use flowplane_nf::PktMeta;
use flowplane_trace::gen::{Generator, Pattern};
use libfuzzer_sys::fuzz_target;

/// True if the option string could make the parser read a file.
fn names_a_file(s: &str) -> bool {
    if s.contains("cdf") {
        return true;
    }
    let toks: Vec<&str> = s.split_whitespace().flat_map(|t| t.splitn(2, '=')).collect();
    toks.iter().enumerate().any(|(i, t)| {
        t.starts_with("--size-m")
            && toks.get(i + 1).is_some_and(|v| !v.eq_ignore_ascii_case("imix") && (!v.contains(':') || v.contains('/')))
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if names_a_file(text) {
        return;
    }
    let cfg = match parse_gen_config(text) {
        Ok(c) => c,
        Err(e) => {
            let msg = e.to_string();
            assert!(!msg.is_empty() && !msg.contains('\n'), "{msg:?}");
            return;
        }
    };
    if cfg.flows > 4096 || cfg.packets > 2048 || matches!(cfg.pattern, Pattern::PortScan(k) if k > 1024) {
        return;
    }
    let packets = cfg.packets;
    let mut g = match Generator::new(cfg) {
        Ok(g) => g,
        Err(e) => panic!("a validated configuration must build: {e}"),
    };
    let (mut n, mut last) = (0u64, 0u64);
    let mut buf = Vec::new();
    while let Some(ts) = g.next_frame(&mut buf) {
        assert!(ts >= last, "timestamps go back: {last} then {ts}");
        assert!(buf.len() >= 42 && buf.len() <= 9216, "frame of {} bytes", buf.len());
        assert!(PktMeta::parse(&buf).valid, "generated frame does not parse: {buf:02x?}");
        last = ts;
        n += 1;
        assert!(n <= packets, "more packets than asked for");
    }
    assert_eq!(n, packets);
    assert_eq!(g.remaining(), 0);
});
