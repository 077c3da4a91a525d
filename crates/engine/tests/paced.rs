//! Paced runs through the emulated NIC: offered below capacity nothing is
//! lost and latency is measured from each packet's arrival at the port; the
//! MLFFR search returns a rate its own trials found loss-free, below the
//! first rate they found lossy.

use std::time::Duration;

use flowplane_engine::exec::ExecConfig;
use flowplane_engine::mlffr::{search, MlffrConfig};
use flowplane_engine::runner::{prepare, run_prepared, Input, Output};
use flowplane_engine::spec::parse;
use flowplane_engine::RunConfig;
use flowplane_trace::gen::{GenConfig, Generator};

fn cfg(cores: usize) -> RunConfig {
    RunConfig {
        cores,
        pin: false,
        loops: None,
        duration: Some(Duration::from_millis(300)),
        exec: ExecConfig { flows: 1 << 14, hugepages: false, ..ExecConfig::default() },
        ..RunConfig::default()
    }
}

fn gen() -> Input<'static> {
    let g = GenConfig { flows: 2000, packets: 50_000, seed: 9, rate_pps: 1e6, ..GenConfig::default() };
    Input::Generated(Box::new(Generator::new(g).unwrap()))
}

#[test]
fn paced_below_capacity_loses_nothing_and_measures_from_arrival() {
    let spec = parse("fsc").unwrap();
    for cores in [1, 2] {
        // A deep ring: the machine is shared, and a core descheduled for a few ms is not the chain being slow.
        let c = RunConfig { rate_pps: Some(200_000.0), ring: 1 << 16, ..cfg(cores) };
        let p = prepare(&c, &spec, gen(), false).unwrap();
        let r = run_prepared(&c, &spec, &p, Output::Discard).unwrap();
        let sc = r.scale.unwrap();
        assert_eq!(sc.rx_ring_full, 0, "{cores} core(s)");
        assert_eq!(sc.latency_from, "arrival-to-transmit");
        assert!(sc.latency_ns[0] > 0.0 && sc.latency_ns[0] <= sc.latency_ns[2]);
        // 0.3 s at 200 Kpps: about 60K packets offered, all received.
        assert!((40_000..=70_000).contains(&r.packets), "{} packets", r.packets);
        assert!(sc.offered >= r.packets);
    }
}

#[test]
fn mlffr_brackets_the_loss_free_rate() {
    let spec = parse("fsc").unwrap();
    let c = cfg(1);
    let p = prepare(&c, &spec, gen(), false).unwrap();
    let m = MlffrConfig { trial: Duration::from_millis(200), resolution: 0.1, ..MlffrConfig::default() };
    let r = search(&c, &spec, &p, &m).unwrap();
    assert!(r.mlffr_pps > 0.0 && r.full_speed_pps > 0.0);
    assert!(!r.trials.is_empty());
    // The answer is a trial that was loss-free; every lossy rate was faster. A
    // rate is lossy when every try of it lost (a lossy trial is repeated, and a
    // loss-free repeat makes its rate loss-free: `MlffrConfig::retries`).
    assert!(r.trials.iter().any(|t| t.loss_free && t.rate_pps == r.mlffr_pps), "{:?}", r.trials);
    let passed = |rate: f64| r.trials.iter().any(|u| u.loss_free && u.rate_pps == rate);
    for t in r.trials.iter().filter(|t| !t.loss_free) {
        assert!(t.loss > m.loss, "{t:?}");
        assert!(passed(t.rate_pps) || t.rate_pps > r.mlffr_pps, "{t:?} in {:?}", r.trials);
    }
}

/// `flowplane mlffr` on a deliberately slowed chain (`synthetic(k=8)`: eight
/// dependent DRAM reads per packet) finds, within 5%, the rate at which it
/// starts losing packets: the chain's capacity from its measured service
/// time (packets / the busiest core's busy cycles at full speed, unpaced),
/// on 1 and 2 cores. A performance figure: run it on a quiet machine
/// (`cargo test --release -p flowplane-engine --test paced -- --ignored --nocapture`).
///
/// The capacity is measured three times before and three times after the
/// search and the median is the reference: this chain is memory-bound, and
/// on a shared host its own unpaced rate moves by several percent from one
/// second to the next (2026-11-25: 4.13-4.79 Mpps in runs seconds apart,
/// while `burn(iters=150)` stayed within 1%). When those six measurements
/// spread more than 10%, the reference is not known to 5% and the test says
/// so and skips; likewise when the workers had the CPU less than 90% of a
/// run (a paced core off the CPU loses packets below its capacity).
///
/// History: before the learning phase and the prefaulted tables the ratio
/// was 0.52-0.72 (cold tables and caches decided the search); before the
/// paced queues took only their own packets (2026-11-25) 2 cores were at
/// 0.78 (each core walked the whole stream: 20-29 cycles/packet vs 13).
#[test]
#[ignore]
fn mlffr_finds_where_a_slowed_chain_starts_losing() {
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        eprintln!("one CPU: skipped");
        return;
    }
    let spec = parse("synthetic(k=8)").unwrap();
    for cores in [1, 2] {
        // A ring deep enough for a few ms off the CPU, shallow enough that 5% over capacity fills it within a trial.
        let c = RunConfig { ring: 1 << 14, pin: true, ..cfg(cores) };
        let p = prepare(&c, &spec, gen(), false).unwrap();
        // Capacity from the service time, and the share of the run the busiest core had the CPU.
        let service = || {
            let full = RunConfig { rate_pps: None, warmup: Some(Duration::from_millis(100)), ..c.clone() };
            let r = run_prepared(&full, &spec, &p, Output::Discard).unwrap();
            let busy = r.scale.unwrap().busy_mpps * 1e6;
            (busy, r.mpps * 1e6 / busy.max(1.0))
        };
        let mut runs: Vec<(f64, f64)> = (0..3).map(|_| service()).collect();
        let before = runs.iter().map(|r| r.0).fold(0.0, f64::max);
        let m = MlffrConfig {
            trial: Duration::from_millis(600),
            resolution: 0.02,
            max_rate: Some(before * 1.3),
            ..MlffrConfig::default()
        };
        let r = search(&c, &spec, &p, &m).unwrap();
        runs.extend((0..3).map(|_| service()));
        let mut caps: Vec<f64> = runs.iter().map(|r| r.0).collect();
        caps.sort_by(f64::total_cmp);
        let capacity = (caps[2] + caps[3]) / 2.0;
        let spread = caps[5] / caps[0] - 1.0;
        let on_cpu = runs.iter().map(|r| r.1).fold(f64::MAX, f64::min);
        let ratio = r.mlffr_pps / capacity;
        eprintln!(
            "{cores} core(s): capacity {capacity:.0} pps (median of 6, spread {:.1}%), on the CPU {:.0}% of the run, \
             mlffr {:.0} pps, ratio {ratio:.3}; trials {:?}",
            spread * 100.0,
            on_cpu * 100.0,
            r.mlffr_pps,
            r.trials.iter().map(|t| (t.rate_pps as u64, t.loss_free)).collect::<Vec<_>>()
        );
        if on_cpu < 0.9 {
            eprintln!("the workers had the CPU less than 90% of the time: machine busy, skipped");
            continue;
        }
        if spread > 0.10 {
            eprintln!("the chain's own capacity moved more than 10% during the search: machine busy, skipped");
            continue;
        }
        assert!((0.95..=1.05).contains(&ratio), "{cores} core(s): mlffr {} vs capacity {capacity}", r.mlffr_pps);
    }
}
