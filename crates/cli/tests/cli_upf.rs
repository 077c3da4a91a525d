//! `flowplane upf sessions` and `gen --proto gtpu --upf`: the session file
//! and the trace agree — every packet of a generated UPF trace (uplink and
//! downlink, several PDRs) is classified and forwarded, under every
//! executor, and the output's downlink is GTP-U with the plan's TEIDs.

use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_flowplane"))
}

fn ok(args: &[&str]) -> String {
    let out = bin().args(args).output().expect("spawn flowplane");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "flowplane {args:?} failed: {err}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn generated_upf_traffic_matches_its_session_file() {
    let dir = std::env::temp_dir().join(format!("flowplane-cli-upf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (sessions, trace) = (dir.join("s.toml"), dir.join("u.pcap"));
    let (s, t) = (sessions.to_str().unwrap(), trace.to_str().unwrap());
    ok(&["upf", "sessions", "--sessions", "300", "--pdrs", "8", "-o", s]);
    ok(&["gen", "--proto", "gtpu", "--upf", "300x8:both", "--packets", "20000", "--size", "100..600", "-o", t]);
    for exec in ["batch", "rtc", "pernf", "microbatch"] {
        let chain = format!("fsc -> upf(sessions={s})");
        let out = ok(&["run", "--chain", &chain, "--input", t, "--exec", exec, "--cores", "1", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let upf = v["nfs"].as_array().unwrap().iter().find(|n| n["name"] == "upf").unwrap();
        let c = &upf["details"]["counters"];
        assert_eq!(upf["dropped"], 0, "{exec}: {c}");
        assert_eq!(c["ul_forwarded"].as_u64().unwrap() + c["dl_forwarded"].as_u64().unwrap(), 20_000, "{exec}");
        assert!(c["uplink"].as_u64().unwrap() > 9000 && c["downlink"].as_u64().unwrap() > 9000, "{c}");
    }
    let err = bin().args(["gen", "--proto", "udp", "--upf", "3x3", "-o", t]).output().unwrap();
    assert_eq!(err.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&err.stderr).contains("--upf needs --proto gtpu"));
    let err = bin().args(["upf", "sessions", "--pdrs", "65"]).output().unwrap();
    assert_eq!(err.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn generated_amf_traffic_runs_without_drops_in_every_mode() {
    let dir = std::env::temp_dir().join(format!("flowplane-cli-amf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("amf.pcap");
    let t = trace.to_str().unwrap();
    ok(&["gen", "--proto", "amf", "--flows", "5000", "--packets", "40000", "-o", t]);
    for mode in ["staged", "all", "rtc"] {
        let chain = format!("amf(ues=8192, mode={mode})");
        let out = ok(&["run", "--chain", &chain, "--input", t, "--cores", "1", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let amf = &v["nfs"][0];
        assert_eq!((amf["packets_in"].as_u64(), amf["dropped"].as_u64()), (Some(40_000), Some(0)), "{mode}: {amf}");
        let d = &amf["details"];
        for k in ["registration", "service", "pdu_session", "handover", "deregistration"] {
            assert!(d[k].as_u64().unwrap() > 1000, "{mode}: {k}: {d}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 30: `amf` keeps its UE contexts in a per-core table, so a UE's
/// messages must all reach the core that registered it. `shared` and `scr`
/// spray them (38.6% were dropped as unknown UE) and `rsspp`/`dyssect` move
/// flows away from their contexts: each is refused in one line naming amf;
/// `rss` and one core run every message.
#[test]
fn amf_is_refused_where_a_ue_cannot_stay_on_one_core() {
    let gen = "--proto amf --flows 500 --packets 4000";
    let chain = "amf(ues=1024)";
    for scale in ["shared", "scr", "rsspp", "dyssect"] {
        let out =
            bin().args(["run", "--chain", chain, "--gen", gen, "--scale", scale, "--cores", "2"]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{scale}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{scale}: {err}");
        assert!(err.contains(&format!("--scale {scale}: amf keeps")) && err.contains("use rss"), "{scale}: {err}");
    }
    for (scale, cores) in [("rss", "2"), ("shared", "1")] {
        let out = ok(&["run", "--chain", chain, "--gen", gen, "--scale", scale, "--cores", cores, "--json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let amf = &v["nfs"][0];
        assert_eq!((amf["packets_in"].as_u64(), amf["dropped"].as_u64()), (Some(4000), Some(0)), "{scale}: {amf}");
    }
}
