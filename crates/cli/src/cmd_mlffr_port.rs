//! `flowplane mlffr` on live ports: the search of `flowplane_engine::mlffr_port`
//! with flowplane's ports named as for `flowplane run`, a sender (`--send`)
//! and a receiver (`--recv`) on the far ends of the links, and the in-memory
//! replay of the same trace and chain measured beside it.

use std::sync::Arc;
use std::time::Duration;

use flowplane_engine::mlffr_port::{frames_of, search_ports, sender_frame_room, PortRig};
use flowplane_engine::runner::{prepare, Input};
use flowplane_engine::EngineError;
use flowplane_io::port::peer::PeerSpec;
use flowplane_io::port::{self, Port, PortOptions, PortSpec};

use crate::cmd_live::{output_ports, port_options};
use crate::cmd_mlffr::{search_config, MlffrArgs, PORT_GEN};
use crate::cmd_run::{config, parse_gen};
use crate::error::CliError;

type Ports = (Arc<dyn Port>, Vec<Arc<dyn Port>>);

fn open_all(a: &MlffrArgs, input: &PortSpec, cores: usize) -> Result<Ports, CliError> {
    let inp = port::open(input, cores, port_options(&a.run)).map_err(|e| CliError::new(e.to_string()))?;
    let (outs, _) = output_ports(&a.run, cores, 0)?;
    Ok((inp, outs))
}

/// Runs the search on ports.
pub fn run(mut a: MlffrArgs, input: PortSpec) -> Result<(), CliError> {
    #[cfg(feature = "dpdk")]
    if let Some(e) = &a.run.live.eal {
        flowplane_io::port::dpdk::set_eal_args(e.split_whitespace().map(str::to_string).collect());
    }
    let peer = |flag: &str, v: &Option<String>| -> Result<PeerSpec, CliError> {
        let s = v.as_deref().ok_or_else(|| {
            CliError::new(format!("{flag} PEER is needed on ports (see flowplane mlffr --help for the wiring)"))
        })?;
        PeerSpec::parse(s).map_err(|e| CliError::new(format!("{flag} {e}")))
    };
    let (sender, receiver) = (peer("--send", &a.send)?, peer("--recv", &a.recv)?);
    let Some(out) = &a.run.outputs.output else {
        return Err(CliError::new("--output PORT is needed on ports: where flowplane forwards to"));
    };
    for o in std::iter::once(out.to_string_lossy().into_owned()).chain(a.run.outputs.ports.iter().cloned()) {
        if !PortSpec::parse(&o).is_ok_and(|s| s.is_live()) {
            return Err(CliError::new(format!("--output/--port {o}: mlffr on ports forwards to live ports only")));
        }
    }
    if a.run.traffic.loops.is_some()
        || a.run.traffic.rate.is_some()
        || a.run.workers.virtual_cores.is_some()
        || a.run.live.metrics.is_some()
    {
        return Err(CliError::new("--loops, --rate, --virtual-cores and --metrics do not apply to mlffr on ports"));
    }
    if a.send_batch == 0 || a.send_batch > flowplane_packet::MAX_BATCH {
        return Err(CliError::new(format!(
            "--send-batch {}: must be in 1..={}",
            a.send_batch,
            flowplane_packet::MAX_BATCH
        )));
    }
    if !(a.drain.is_finite() && (0.001..=10.0).contains(&a.drain)) {
        return Err(CliError::new(format!("--drain {}: must be between 0.001 and 10 seconds", a.drain)));
    }
    a.run.traffic.duration = Some(a.trial);
    if a.run.strategy.nic_profile.is_some() {
        return Err(CliError::new("--nic-profile models the emulated NIC of a replay; a live port's NIC has its own"));
    }
    let (cfg, spec) = config(&a.run)?;
    // The sender's traffic, loaded as a replay loads it: the in-memory reference runs on the same packets.
    let traffic = match &a.trace {
        Some(p) => Input::File(p),
        None => Input::Generated(Box::new(parse_gen(a.trace_gen.as_deref().unwrap_or(PORT_GEN))?)),
    };
    let prepared = prepare(&cfg, &spec, traffic, a.run.strategy.symmetric_rss)?;
    let frames = frames_of(&prepared, sender_frame_room())?;
    let cores = cfg.cores;
    // A port that starts once per process (DPDK) is opened once and kept for every trial;
    // the others are opened afresh per trial (their counters start at zero).
    let once = |s: &PortSpec| s.kind().caps.once_per_process;
    let keep = once(&input)
        || std::iter::once(out.to_string_lossy().into_owned())
            .chain(a.run.outputs.ports.iter().cloned())
            .any(|o| PortSpec::parse(&o).is_ok_and(|s| once(&s)));
    let kept = if keep { Some(open_all(&a, &input, cores)?) } else { None };
    let names = match &kept {
        Some((i, o)) => (i.name(), o.iter().map(|p| p.name()).collect()),
        None => (
            input.to_string(),
            std::iter::once(out.to_string_lossy().into_owned()).chain(a.run.outputs.ports.iter().cloned()).collect(),
        ),
    };
    let open = || -> Result<Ports, EngineError> {
        match &kept {
            Some((i, o)) => Ok((Arc::clone(i), o.clone())),
            None => open_all(&a, &input, cores).map_err(|e| EngineError::Config(e.to_string())),
        }
    };
    let ncpu = flowplane_io::cpu::available_cores();
    let sender_cpu = a.send_cpu.or((cfg.pin && ncpu > cores).then(|| ncpu - 1));
    let rig = PortRig {
        open: &open,
        sender,
        receiver,
        peer_opts: PortOptions::default(),
        frames,
        send_batch: a.send_batch,
        sender_cpu,
        drain: Duration::from_secs_f64(a.drain),
        symmetric_rss: a.run.strategy.symmetric_rss,
    };
    let m = search_config(&a, &cfg);
    let r = search_ports(&cfg, &spec, &rig, &m, Some(&prepared), names)?;
    if a.run.outputs.json {
        let mut v = serde_json::to_value(&r)?;
        v["chain"] = serde_json::Value::String(a.run.pipeline.chain.clone());
        v["cores"] = cfg.cores.into();
        outln!("{}", serde_json::to_string_pretty(&crate::provenance::stamp(serde_json::to_value(&v)?))?);
        return Ok(());
    }
    outln!(
        "mlffr        {} on {} core(s), --scale {} (steered by {}): {} -> {}; sender {}, receiver {}; {:.0}-B frames (trailer included)",
        a.run.pipeline.chain,
        cfg.cores,
        a.run.strategy.scale,
        if r.steered_by.is_empty() { "?" } else { &r.steered_by },
        r.input,
        r.outputs.join(", "),
        r.sender,
        r.receiver,
        r.frame_bytes
    );
    outln!(
        "{:>11} {:>11} {:>10} {:>10} {:>8} {:>8} {:>10} {:>8} {:>9} {:>8} {:>6} {:>9}",
        "asked kpps",
        "sent kpps",
        "sent",
        "received",
        "lost",
        "loss %",
        "rx_overrun",
        "tx_full",
        "recv_drop",
        "cyc/pkt",
        "busy%",
        "loss-free"
    );
    for t in &r.trials {
        let asked = if t.rate_pps > 0.0 { format!("{:.1}", t.rate_pps / 1e3) } else { "max".to_string() };
        outln!(
            "{:>11} {:>11.1} {:>10} {:>10} {:>8} {:>8.4} {:>10} {:>8} {:>9} {:>8.0} {:>6.1} {:>9}",
            asked,
            t.offered_pps / 1e3,
            t.offered,
            t.received,
            t.lost,
            t.loss * 100.0,
            t.rx_overrun,
            t.tx_full,
            t.receiver_drops,
            t.cycles_per_packet,
            t.worker_busy * 100.0,
            if t.loss_free { "yes" } else { "no" }
        );
    }
    outln!(
        "MLFFR        {:.1} kpps (loss <= {}%, resolution {}%); sender max {:.1} kpps; limited by {}",
        r.mlffr_pps / 1e3,
        a.loss,
        a.resolution,
        r.sender_max_pps / 1e3,
        r.limited_by
    );
    match (r.replay_cycles_per_packet, r.replay_pps) {
        (Some(c), Some(p)) => outln!(
            "cycles/pkt   {:.0} busy cycles per packet on the ports at the MLFFR (TSC {:.2} GHz); in-memory replay of the same chain and trace: {:.1} ({:.2} Mpps)",
            r.cycles_per_packet,
            r.tsc_ghz,
            c,
            p / 1e6
        ),
        _ => outln!("cycles/pkt   {:.0} busy cycles per packet on the ports at the MLFFR", r.cycles_per_packet),
    }
    Ok(())
}
