//! NFs run on the packet clock: a replayed trace means what its timestamps
//! say, whatever speed it is replayed at. Checked against a token-bucket
//! model computed from the trace's own timestamps.

use flowplane_engine::exec::ExecConfig;
use flowplane_engine::load::load_generated;
use flowplane_engine::spec::parse;
use flowplane_engine::{run, RunConfig};
use flowplane_scale::RssDispatcher;
use flowplane_trace::gen::{GenConfig, Generator};

/// Packets a token bucket of `rate` tokens/s and depth `burst` passes, one
/// token per packet, starting full, at the given times (ns).
fn bucket_model(times: &[u64], rate: f64, burst: f64) -> u64 {
    let (mut tokens, mut last, mut passed) = (burst, times.first().copied().unwrap_or(0), 0);
    for &t in times {
        tokens = (tokens + (t - last) as f64 * rate / 1e9).min(burst);
        last = t;
        if tokens >= 1.0 {
            tokens -= 1.0;
            passed += 1;
        }
    }
    passed
}

fn gen(flows: u64, packets: u64, rate: f64) -> (GenConfig, Vec<u64>) {
    let (cfg, pkts) = gen_with_dst(flows, packets, rate);
    (cfg, pkts.into_iter().map(|(t, _)| t).collect())
}

/// The generator's packets as (time, IPv4 destination).
fn gen_with_dst(flows: u64, packets: u64, rate: f64) -> (GenConfig, Vec<(u64, [u8; 4])>) {
    let cfg = GenConfig { flows, packets, rate_pps: rate, seed: 3, ..GenConfig::default() };
    let mut g = Generator::new(cfg.clone()).unwrap();
    let mut buf = Vec::new();
    let mut out = Vec::new();
    while let Some(t) = g.next_frame(&mut buf) {
        out.push((t, [buf[30], buf[31], buf[32], buf[33]]));
    }
    (cfg, out)
}

fn pass_count(chain: &str, cfg: GenConfig, cores: usize, loops: u64) -> (u64, u64) {
    let (trace, load) =
        load_generated(Generator::new(cfg).unwrap(), &RssDispatcher::new(cores, false).unwrap()).unwrap();
    let rc = RunConfig {
        cores,
        pin: false,
        loops: Some(loops),
        exec: ExecConfig { flows: 4096, hugepages: false, ..ExecConfig::default() },
        ..RunConfig::default()
    };
    let r = run(&rc, &parse(chain).unwrap(), trace, Default::default()).unwrap();
    let nf = &r.nfs[0].counters;
    (nf.packets_out, load.packets * loops)
}

#[test]
fn ratelimit_follows_the_trace_clock() {
    // One flow at 100 kpps through a 10 kpps bucket: ~10% passes, whatever
    // speed the replay runs at (full speed here: ~1000x faster than the trace).
    let (cfg, times) = gen(1, 50_000, 100_000.0);
    let expected = bucket_model(&times, 10_000.0, 100.0);
    let (passed, total) = pass_count("ratelimit(pps=10000, burst=100)", cfg, 1, 1);
    assert_eq!(total, 50_000);
    let err = (passed as f64 - expected as f64).abs() / expected as f64;
    assert!(err < 0.02, "passed {passed}, model {expected} ({:.1}% off)", err * 100.0);
    assert!((4_500..6_500).contains(&passed), "about 10%: {passed}");
}

#[test]
fn policer_follows_the_trace_clock_on_two_cores() {
    // Many flows to one server (policer keys on the destination), split over
    // two cores: the shared bucket sees both cores' packets at trace time.
    let (cfg, pkts) = gen_with_dst(200, 40_000, 200_000.0);
    let mut by_dst: std::collections::BTreeMap<[u8; 4], Vec<u64>> = Default::default();
    for (t, d) in &pkts {
        by_dst.entry(*d).or_default().push(*t);
    }
    let expected: u64 = by_dst.values().map(|ts| bucket_model(ts, 100.0, 5.0)).sum();
    let chain = "policer(rate=100, burst=5, pps=true)";
    for cores in [1, 2] {
        let (passed, total) = pass_count(chain, cfg.clone(), cores, 1);
        assert_eq!(total, 40_000);
        let err = (passed as f64 - expected as f64).abs() / expected as f64;
        assert!(err < 0.02, "{cores} core(s): passed {passed}, model {expected} ({} servers)", by_dst.len());
        assert!(passed < total / 2, "the policer limits: {passed} of {total}");
    }
}

#[test]
fn time_keeps_moving_over_loops() {
    // Three loops over a 0.5 s trace are 1.5 s of packet time: the bucket refills.
    let (cfg, times) = gen(1, 10_000, 20_000.0);
    let mut looped = times.clone();
    let span = times.last().unwrap() - times[0] + (times.last().unwrap() - times[0]) / (times.len() as u64 - 1);
    for k in 1..3 {
        looped.extend(times.iter().map(|t| t + k * span));
    }
    let expected = bucket_model(&looped, 2_000.0, 10.0);
    let (passed, total) = pass_count("ratelimit(pps=2000, burst=10)", cfg, 1, 3);
    assert_eq!(total, 30_000);
    let err = (passed as f64 - expected as f64).abs() / expected as f64;
    assert!(err < 0.02, "passed {passed}, model {expected}");
}
