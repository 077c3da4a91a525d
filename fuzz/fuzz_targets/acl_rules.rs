//! ACL rule files (`acl(rules=FILE)`), read from memory: `acl::parse_rules` never panics, an
//! error names the file and a line that exists, every rule line yields one rule, and an ACL of
//! the parsed rules decides arbitrary and synthesised packets (each flow once, by one rule or
//! the default) with its report adding up.
//!
//! Input layout: the rule text up to the first 0xff byte (never in UTF-8), then byte 0 of the
//! rest picks the default verdict (bit 0), then frame records as `flowplane_fuzz::for_each_record`
//! reads them.
#![no_main]

use flowplane_fuzz::for_each_record;
use flowplane_nf::acl::{parse_rules, Acl};
use flowplane_nf::stateful::Action;
use flowplane_nf::{NfContext, Pkt, PktMeta, StatefulNf};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let split = data.iter().position(|&b| b == 0xff).unwrap_or(data.len());
    let Ok(text) = std::str::from_utf8(&data[..split]) else { return };
    let rest = data.get(split + 1..).unwrap_or(&[]);
    let rules = match parse_rules("fuzz.rules", text) {
        Ok(r) => r,
        Err(e) => {
            let line: usize = e
                .strip_prefix("fuzz.rules:")
                .and_then(|r| r.split(':').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("error does not name file and line: {e}"));
            assert!(line >= 1 && line <= text.lines().count(), "line {line} of {}: {e}", text.lines().count());
            return;
        }
    };
    let rule_lines = text.lines().filter(|l| !l.split('#').next().unwrap_or("").trim().is_empty()).count();
    assert_eq!(rules.len(), rule_lines, "one rule per rule line");

    let default_drop = rest.first().is_some_and(|b| b & 1 != 0);
    let mut acl = Acl::new(rules, default_drop);
    let ctx = NfContext { now_tsc: 0, now_ns: 0 };
    let (mut flows, mut unparsed) = (0u64, 0u64);
    let mut frame = Vec::new();
    for_each_record(rest.get(1..).unwrap_or(&[]), 1024, |f, _| {
        let meta = PktMeta::parse(f);
        if !meta.valid {
            unparsed += 1;
            assert!(matches!(acl.on_unparsed(), Action::Pass | Action::Drop));
            return;
        }
        frame.clear();
        frame.extend_from_slice(f);
        let mut pkt = Pkt::new(&mut frame, &meta);
        let mut st = acl.init(&pkt, &ctx);
        flows += 1;
        // A flow's verdict is fixed at its first packet: every later packet gets the same.
        let first = acl.process(&mut pkt, &mut st, &ctx);
        assert!(matches!(first, Action::Pass | Action::Drop), "{first:?}");
        assert_eq!(acl.process(&mut pkt, &mut st, &ctx), first);
    });
    let report = acl.report().expect("acl reports");
    let per_rule = report["per_rule"].as_array().expect("per_rule");
    let rule_flows: u64 = per_rule.iter().map(|r| r["flows"].as_u64().expect("flows")).sum();
    let rule_packets: u64 = per_rule.iter().map(|r| r["packets"].as_u64().expect("packets")).sum();
    assert_eq!(rule_flows + report["default_flows"].as_u64().expect("default_flows"), flows, "{report}");
    assert_eq!(rule_packets + report["default_packets"].as_u64().expect("default_packets"), 2 * flows, "{report}");
    assert_eq!(report["unparsed"].as_u64(), Some(unparsed), "{report}");
});
