//! `flowplane run` on a live input port (`--input afpacket:IFACE`, ...):
//! runs until SIGINT/SIGTERM (or `--duration`), prints a status line per
//! second when stdout is a terminal, serves `--metrics`, and ends with the
//! report, the ports' counters and the `--export` files.

use std::io::IsTerminal;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use flowplane_engine::live::Live;
use flowplane_engine::runner::run_port;
use flowplane_engine::runtime::Watch;
use flowplane_io::port::{self, LinkStats, PcapPort, Port, PortOptions, PortSpec, PortStats};
use flowplane_io::sink::SharedPcapWriter;

use crate::cmd_run::{config, export_rows, parse_exports, RunArgs};
use crate::error::CliError;
use crate::metrics;

/// `--input`'s port, if it names a live one.
pub fn live_input(a: &RunArgs) -> Result<Option<PortSpec>, CliError> {
    let Some(i) = &a.traffic.input else { return Ok(None) };
    let spec = PortSpec::parse(&i.to_string_lossy()).map_err(|e| CliError::new(format!("--input {e}")))?;
    Ok(spec.is_live().then_some(spec))
}

/// Options for live ports from the arguments.
pub fn port_options(a: &RunArgs) -> PortOptions {
    // --pool beyond its default also sizes a device's own buffers (DPDK mbufs per queue).
    let d = PortOptions::default();
    PortOptions {
        promisc: a.live.promisc,
        buffers: if a.workers.pool > 4096 { a.workers.pool } else { d.buffers },
        ..d
    }
}

/// Output ports by verdict, and the pcap files among them (finished at the end).
type OutputPorts = (Vec<Arc<dyn Port>>, Vec<(std::path::PathBuf, SharedPcapWriter)>);

/// The output ports (verdict i = port i): `--output` then each `--port`.
/// Pcap files are created here; `base_ns` is packet time 0 for their stamps.
pub fn output_ports(a: &RunArgs, queues: usize, base_ns: u64) -> Result<OutputPorts, CliError> {
    let mut ports: Vec<Arc<dyn Port>> = Vec::new();
    let mut files = Vec::new();
    // `--port NAME=PORT`: the name is the chain graph's (bound in `config`).
    let names: Vec<String> = a
        .outputs
        .output
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .chain(a.outputs.ports.iter().map(|p| crate::cmd_run::port_arg(p).1.to_string()))
        .collect();
    for n in names {
        let spec = PortSpec::parse(&n).map_err(|e| CliError::new(format!("--output/--port {e}")))?;
        if spec.is_live() {
            ports.push(port::open(&spec, queues, port_options(a)).map_err(|e| CliError::new(e.to_string()))?);
        } else {
            // A file: created here, with the run's other results.
            let path = std::path::PathBuf::from(spec.arg());
            let w = crate::results::create_pcap(&path, "--output/--port")?;
            files.push((path, Arc::clone(&w)));
            ports.push(Arc::new(PcapPort::new(spec.arg(), w, base_ns, queues)));
        }
    }
    Ok((ports, files))
}

/// Runs on a live input until stopped.
/// SIGINT/SIGTERM: the first stops the run cleanly (workers drain, reports and exports are
/// written, ports close); a second one while stopping exits at once with status 1, after
/// detaching the XDP programs this run attached (the ports' destructors will not run).
pub(crate) fn watch_signals(stop: &Arc<AtomicBool>) -> Result<(), CliError> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals =
        signal_hook::iterator::Signals::new([SIGINT, SIGTERM]).map_err(|e| CliError::new(format!("signal: {e}")))?;
    let stop = Arc::clone(stop);
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut seen = 0;
            for _ in signals.forever() {
                seen += 1;
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
                if seen > 1 {
                    let n = flowplane_io::port::release_xdp_programs();
                    eprintln!("flowplane: second signal: exiting now ({n} XDP program(s) removed; no report)");
                    std::process::exit(1);
                }
            }
        })
        .map_err(|e| CliError::new(format!("signal thread: {e}")))?;
    Ok(())
}

pub fn run(a: RunArgs, input: PortSpec) -> Result<(), CliError> {
    if a.traffic.gen.is_some()
        || a.traffic.loops.is_some()
        || a.traffic.rate.is_some()
        || a.workers.virtual_cores.is_some()
    {
        return Err(CliError::new(
            "--gen, --loops, --rate and --virtual-cores apply to replayed input, not to a live port",
        ));
    }
    if a.workers.ring.is_some() {
        return Err(CliError::new(
            "--ring sizes the emulated NIC's receive rings of a replay; a live port's rings are the device's or the kernel's",
        ));
    }
    if a.outputs.restamp {
        return Err(CliError::new(
            "--restamp: a live input's packets are written with the time they were received (there is no trace time to replace)",
        ));
    }
    let (mut cfg, spec) = config(&a)?;
    cfg.loops = None;
    let cores = cfg.cores;
    // Memory is checked before it is allocated, as for a replay (NF arrays first: building the chain allocates them).
    let mut needs = flowplane_engine::budget::nf_needs(&cfg, &spec);
    flowplane_engine::budget::check(&needs)?;
    needs.extend(flowplane_engine::budget::run_needs(&cfg, &flowplane_engine::chain::Chain::build(&spec)?));
    flowplane_engine::budget::check(&needs)?;
    let exports = crate::results::create_exports(&parse_exports(&a.outputs.export)?)?;
    let stop = Arc::new(AtomicBool::new(false));
    watch_signals(&stop)?;
    let inp = port::open(&input, cores, port_options(&a)).map_err(|e| CliError::new(e.to_string()))?;
    let base_ns = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let (outputs, files) = output_ports(&a, cores, base_ns)?;
    let live = Arc::new(Live::new(inp, outputs, cores));
    let server = match &a.live.metrics {
        Some(addr) => Some(metrics::serve(addr, Arc::clone(&live), Arc::clone(&stop))?),
        None => None,
    };
    // Removed (the socket file too) when the run ends.
    let ctl = match &a.live.ctl {
        Some(path) => {
            Some(crate::ctl::serve(path, Arc::clone(&live), spec.clone(), Arc::clone(&stop), a.source.clone())?)
        }
        None => None,
    };
    let tty = std::io::stdout().is_terminal() && !flowplane_trace::progress::quiet();
    let mut status = metrics::Status::default();
    let mut tick = |l: &Live, at: std::time::Duration| {
        if tty {
            use std::io::Write as _;
            let line = status.line(l, at);
            let mut o = std::io::stdout().lock();
            let _ = write!(o, "\r\x1b[2K{line}");
            let _ = o.flush();
        }
    };
    let result = run_port(
        &cfg,
        &spec,
        a.strategy.symmetric_rss,
        &live,
        Watch { stop: Some(&stop), tick: Some(&mut tick), service: None },
    );
    if tty {
        outln!();
    }
    // The metrics server stops with the run (the flag it watches).
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    if let Some(h) = server {
        let _ = h.join();
    }
    drop(ctl);
    let report = result?;
    let mut lost = crate::results::Losses::default();
    lost.commit_exports(exports, |nf| export_rows(&report, nf));
    let ports: Vec<(String, PortStats, Option<LinkStats>)> =
        live.ports().map(|p| (p.name(), p.stats(), p.link().map(|w| w.stats()))).collect();
    let cores_snap = live.snapshots();
    let drops = metrics::drops(&live, &cores_snap);
    // The workers and the server are gone: the files' last handles are ours.
    drop(live);
    for (path, w) in files {
        lost.close_pcap(&path, w);
    }
    if a.outputs.json {
        let mut v = serde_json::to_value(&report)?;
        v["ports"] = serde_json::Value::Array(ports.iter().map(|(n, s, l)| port_json(n, s, l.as_ref())).collect());
        v["drops"] = serde_json::Value::Object(drops.iter().map(|(r, n)| (r.to_string(), (*n).into())).collect());
        v["lost"] = lost.to_json();
        outln!("{}", serde_json::to_string_pretty(&crate::provenance::stamp(serde_json::to_value(&v)?))?);
    } else {
        out!("{report}");
        for (n, s, l) in &ports {
            let link = l.map_or(String::new(), |l| {
                format!("; link {} (down {}, gone {}, re-attached {})", l.state.as_str(), l.downs, l.gone, l.reattached)
            });
            outln!(
                "port         {n}: rx {} ({} B), tx {} ({} B); rx_overrun {}, pool_empty {}, rx_oversize {}, tx_full {}, tx_errors {}{link}",
                s.rx_packets,
                s.rx_bytes,
                s.tx_packets,
                s.tx_bytes,
                s.rx_overrun,
                s.rx_pool_empty,
                s.rx_oversize,
                s.tx_full,
                s.tx_errors
            );
        }
        let d: Vec<String> = drops.iter().map(|(r, n)| format!("{r} {n}")).collect();
        outln!("drops        {}", d.join(", "));
        for l in lost.lines() {
            outln!("{l}");
        }
    }
    lost.into_result()
}

fn port_json(name: &str, s: &PortStats, link: Option<&LinkStats>) -> serde_json::Value {
    let mut v = serde_json::json!({
        "name": name,
        "rx_packets": s.rx_packets,
        "rx_bytes": s.rx_bytes,
        "rx_overrun": s.rx_overrun,
        "rx_pool_empty": s.rx_pool_empty,
        "rx_oversize": s.rx_oversize,
        "tx_packets": s.tx_packets,
        "tx_bytes": s.tx_bytes,
        "tx_full": s.tx_full,
        "tx_errors": s.tx_errors,
    });
    if let Some(l) = link {
        v["link"] = l.state.as_str().into();
        v["link_downs"] = l.downs.into();
        v["link_gone"] = l.gone.into();
        v["link_reattached"] = l.reattached.into();
    }
    v
}

/// `pcap:FILE` or a bare path, as a path (for the replay's `--input`).
pub fn file_of(p: &Path) -> std::path::PathBuf {
    match p.to_str().and_then(crate::io_port_spec).filter(|s| !s.is_live()) {
        Some(file) => file.arg().into(),
        None => p.to_path_buf(),
    }
}
