//! End-of-run results through the runner: every NF's `--export` is its state
//! (checked against the NF's own figures) or refused before the run; exports
//! and merged NF reports on 2 cores equal 1 core's.

use std::sync::Arc;

use flowplane_engine::chain::Chain;
use flowplane_engine::exec::ExecConfig;
use flowplane_engine::load::load_generated;
use flowplane_engine::spec::parse;
use flowplane_engine::{run, EngineError, Report, RunConfig};
use flowplane_io::replay::ReplayTrace;
use flowplane_nf::registry::NFS;
use flowplane_nf::Export;
use flowplane_scale::RssDispatcher;
use flowplane_trace::gen::{FlowDist, GenConfig, Generator, Proto};
use serde_json::Value;

fn trace(gen: &GenConfig, cores: usize) -> (Arc<ReplayTrace>, u64) {
    let g = Generator::new(gen.clone()).unwrap();
    let (t, load) = load_generated(g, &RssDispatcher::new(cores, false).unwrap()).unwrap();
    (t, load.packets)
}

fn run_chain(chain: &str, gen: &GenConfig, cores: usize, export: &[&str]) -> Result<(Report, u64), EngineError> {
    let (t, packets) = trace(gen, cores);
    let cfg = RunConfig {
        cores,
        pin: false,
        export: export.iter().map(|s| s.to_string()).collect(),
        exec: ExecConfig { flows: 1 << 14, hugepages: false, ..ExecConfig::default() },
        ..RunConfig::default()
    };
    run(&cfg, &parse(chain).unwrap(), t, Default::default()).map(|r| (r, packets))
}

fn rows<'a>(r: &'a Report, nf: &str) -> &'a [Value] {
    &r.exports.iter().find(|(n, _)| n == nf).unwrap_or_else(|| panic!("no export of {nf}")).1
}

fn details<'a>(r: &'a Report, nf: &str) -> &'a Value {
    r.nfs.iter().find(|n| n.name == nf).and_then(|n| n.details.as_ref()).unwrap_or_else(|| panic!("no details of {nf}"))
}

/// Rows as sorted strings, without the fields that depend on which core
/// handled a flow (each core balances and translates with its own state).
fn canonical(rows: &[Value]) -> Vec<String> {
    let mut v: Vec<String> = rows
        .iter()
        .map(|r| {
            let mut r = r.clone();
            if let Value::Object(m) = &mut r {
                for k in ["backend", "translated_addr", "translated_port"] {
                    m.remove(k);
                }
            }
            r.to_string()
        })
        .collect();
    v.sort();
    v
}

/// A chain of one NF with parameters that give it state on generated traffic.
fn chain_of(name: &str) -> String {
    match name {
        "synthetic" => "synthetic(mem=65536)".into(),
        "hh" => "hh(k=5)".into(),
        "route" => {
            let path = std::env::temp_dir().join(format!("fp-exports-routes-{}.txt", std::process::id()));
            std::fs::write(&path, "0.0.0.0/1 1\n128.0.0.0/1 2\n172.16.0.0/12 3\n::/0 4\n").unwrap();
            format!("route(routes={})", path.display())
        }
        other => other.into(),
    }
}

fn udp(flows: u64, packets: u64) -> GenConfig {
    GenConfig { flows, packets, seed: 11, dist: FlowDist::Zipf(1.1), ..GenConfig::default() }
}

#[test]
fn every_nf_exports_what_it_holds_or_is_refused_and_two_cores_equal_one() {
    let gen = udp(600, 12_000);
    let mut exported = 0;
    for d in NFS {
        let chain = chain_of(d.name);
        let kind = Chain::build(&parse(&chain).unwrap()).unwrap().stages[0].export_kind();
        let one = run_chain(&chain, &gen, 1, &[d.name]);
        if kind == Export::None {
            let e = one.err().unwrap_or_else(|| panic!("{}: export not refused", d.name));
            assert!(matches!(e, EngineError::ExportRefused(_)), "{}: {e}", d.name);
            assert!(!e.to_string().contains('\n'), "one line: {e}");
            continue;
        }
        let (one, _) = one.unwrap();
        let (two, _) = run_chain(&chain, &gen, 2, &[d.name]).unwrap();
        assert!(!rows(&one, d.name).is_empty(), "{}: empty export", d.name);
        assert_eq!(
            canonical(rows(&one, d.name)),
            canonical(rows(&two, d.name)),
            "{}: 2 cores export what 1 does",
            d.name
        );
        exported += 1;
    }
    assert!(exported >= 10, "{exported} NFs export state");
}

#[test]
fn exports_agree_with_the_nfs_figures() {
    let gen = udp(800, 20_000);
    for cores in [1, 2] {
        let (r, packets) = run_chain(
            "count -> keyctr -> lb(backends=5) -> hh(k=7) -> fsc",
            &gen,
            cores,
            &["count", "keyctr", "lb", "hh"],
        )
        .unwrap();
        // count: one row, the totals.
        let c = rows(&r, "count");
        assert_eq!(c.len(), 1);
        assert_eq!(c[0]["packets"], packets);
        assert_eq!(c[0]["bytes"], r.bytes);
        // keyctr (by source): every packet in exactly one row, one row per key seen.
        let k = rows(&r, "keyctr");
        assert_eq!(k.iter().map(|r| r["packets"].as_u64().unwrap()).sum::<u64>(), packets);
        assert_eq!(k.len() as u64, details(&r, "keyctr")["keys_seen"].as_u64().unwrap());
        // lb: one row per flow, per-backend counts as the merged report says.
        let l = rows(&r, "lb");
        assert_eq!(l.len() as u64, details(&r, "fsc")["flows_seen"].as_u64().unwrap());
        let per: Vec<u64> =
            (1..=5).map(|i| l.iter().filter(|row| row["backend"] == format!("10.10.0.{i}")).count() as u64).collect();
        assert_eq!(Value::from(per), details(&r, "lb")["ipv4"]["flows_per_backend"], "{cores} core(s)");
        // hh: the top 7 of the merged report, largest first, each matching the flow's own bytes in fsc terms.
        let h = rows(&r, "hh");
        assert_eq!(h.len(), 7);
        assert_eq!(Value::from(h.to_vec()), details(&r, "hh")["top"]);
        let bytes: Vec<u64> = h.iter().map(|r| r["bytes"].as_u64().unwrap()).collect();
        assert!(bytes.windows(2).all(|w| w[0] >= w[1]), "{bytes:?}");
    }
}

#[test]
fn hh_exports_all_flows_on_request_and_the_top_k_match_them() {
    let gen = udp(300, 9_000);
    let (r, _) = run_chain("hh(k=4, export=all) -> fsc", &gen, 2, &["hh", "fsc"]).unwrap();
    let all = rows(&r, "hh");
    assert_eq!(all.len(), rows(&r, "fsc").len(), "every live flow");
    let mut by_bytes: Vec<u64> = all.iter().map(|r| r["bytes"].as_u64().unwrap()).collect();
    by_bytes.sort_unstable_by(|a, b| b.cmp(a));
    let top: Vec<u64> =
        details(&r, "hh")["top"].as_array().unwrap().iter().map(|e| e["bytes"].as_u64().unwrap()).collect();
    assert_eq!(top, by_bytes[..4], "the merged top-k are the k largest flows of the export");
}

#[test]
fn keyctr_exports_teids_and_field_sets() {
    let gtp = GenConfig { proto: Proto::Gtpu, ..udp(400, 8_000) };
    for cores in [1, 2] {
        let (r, packets) = run_chain("keyctr(key=teid)", &gtp, cores, &["keyctr"]).unwrap();
        let k = rows(&r, "keyctr");
        assert!(k.len() > 50 && k.iter().all(|r| r["teid"].as_u64().is_some_and(|t| t > 0)), "{:?}", &k[..2]);
        assert_eq!(k.iter().map(|r| r["packets"].as_u64().unwrap()).sum::<u64>(), packets);
    }
    let gen = udp(500, 10_000);
    let (one, packets) = run_chain("keyctr(key=dst_ip+dport)", &gen, 1, &["keyctr"]).unwrap();
    let (two, _) = run_chain("keyctr(key=dst_ip+dport)", &gen, 2, &["keyctr"]).unwrap();
    let k = rows(&one, "keyctr");
    assert!(k.iter().all(|r| r["dst"].is_string() && r["dport"].is_u64() && r.get("src").is_none()), "{}", k[0]);
    assert_eq!(k.iter().map(|r| r["packets"].as_u64().unwrap()).sum::<u64>(), packets);
    assert_eq!(canonical(k), canonical(rows(&two, "keyctr")));
}

#[test]
fn merged_reports_of_two_cores_equal_one_core() {
    let gen = GenConfig { proto: Proto::Tcp, ..udp(700, 14_000) };
    let chain = "count -> keyctr(key=dst_ip+dport) -> srcctr -> hh(k=6) -> lb(backends=3) -> fsc -> ddos(threshold=1000000) -> acl(rule=drop:tcp:any:any:any:1-1000)";
    let (one, _) = run_chain(chain, &gen, 1, &[]).unwrap();
    let (two, _) = run_chain(chain, &gen, 2, &[]).unwrap();
    // Every figure of these NFs is independent of how flows were split over cores.
    for nf in ["count", "keyctr", "srcctr", "hh", "fsc", "ddos", "acl"] {
        assert_eq!(details(&one, nf), details(&two, nf), "{nf}: merged report on 2 cores");
    }
    // lb: which backend a flow gets depends on its core, the totals do not.
    for key in ["backends", "flows"] {
        assert_eq!(details(&one, "lb")["ipv4"][key], details(&two, "lb")["ipv4"][key], "lb {key}");
    }
    assert_eq!(details(&two, "hh")["k"], 6, "configuration is not summed");
    // The text report prints them, one line per NF.
    let text = two.to_string();
    assert!(
        text.lines().any(|l| l.starts_with("hh:") && l.contains("k=6") && l.contains("top=[6 entries: {")),
        "{text}"
    );
    assert!(text.lines().any(|l| l.starts_with("count:") && l.contains("packets=")), "{text}");
}

#[test]
fn lb_balances_ipv6_over_its_own_pool_or_counts_it_unbalanced() {
    let gen = GenConfig { ipv6: true, ..udp(300, 6_000) };
    for cores in [1, 2] {
        let (r, packets) = run_chain("lb(base6=2001:db8::a, backends6=3) -> fsc", &gen, cores, &["lb"]).unwrap();
        let l = rows(&r, "lb");
        let flows = details(&r, "fsc")["flows_seen"].as_u64().unwrap();
        assert_eq!(l.len() as u64, flows);
        assert!(l
            .iter()
            .all(|row| ["2001:db8::a", "2001:db8::b", "2001:db8::c"].contains(&row["backend"].as_str().unwrap())));
        let d = details(&r, "lb");
        assert_eq!(d["ipv6"]["flows"], flows, "{d}");
        assert_eq!(d["ipv6_unbalanced_flows"], 0);
        // Without an IPv6 pool the flows pass untouched, counted.
        let (r, _) = run_chain("lb -> fsc", &gen, cores, &["lb"]).unwrap();
        let d = details(&r, "lb");
        assert_eq!(
            (d["ipv6_unbalanced_flows"].as_u64(), d["ipv6_unbalanced_packets"].as_u64()),
            (Some(flows), Some(packets))
        );
        assert!(rows(&r, "lb").iter().all(|row| row["backend"] == "unbalanced"));
    }
}
