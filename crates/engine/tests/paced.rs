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
    // The answer is a trial that was loss-free; every lossy trial was faster.
    assert!(r.trials.iter().any(|t| t.loss_free && t.rate_pps == r.mlffr_pps), "{:?}", r.trials);
    for t in r.trials.iter().filter(|t| !t.loss_free) {
        assert!(t.rate_pps > r.mlffr_pps && t.loss > m.loss, "{t:?}");
    }
}
