//! `flowplane mlffr`: the maximum loss-free forwarding rate of one
//! configuration (chain, cores, strategy, traffic), by binary search of the
//! paced offered rate. Loss is the port's (receive-ring overflow, transmit
//! errors), never an NF's verdict. On live ports (`--input afpacket:IFACE`,
//! ...) the search is `cmd_mlffr_port`'s: a built-in sender and receiver on
//! the far ends of the links.

use std::time::Duration;

use flowplane_engine::mlffr::{search, MlffrConfig};
use flowplane_engine::runner::{prepare, Input, RunConfig};

use crate::cmd_run::{config, parse_gen, validate, RunArgs, DEFAULT_GEN};
use crate::error::CliError;

/// How to wire the links for `mlffr` on ports (shown by `flowplane mlffr --help`).
const PORTS_HELP: &str = "\
On live ports (--input afpacket:IFACE | afxdp:IFACE | dpdk:..., --output likewise), each trial sends
the traffic (--trace, or --trace-gen) at the trial's rate from a sender built into flowplane into the
peer end of the input's link (--send), flowplane forwards it, and a receiver counts what leaves the
peer end of the output's link (--recv): loss is sent - received over the measured phase (the kernel's
RX ring drops are listed beside it). The first trial sends flat out: the sender's own maximum, which
bounds the search. One veth pair per side, the peer ends in namespaces (as root):
  ip netns add fpA; ip netns add fpB
  ip link add fa type veth peer name v0 netns fpA
  ip link add fb type veth peer name v0 netns fpB
  ip link set fa up; ip link set fb up
  ip -n fpA link set v0 up; ip -n fpB link set v0 up
  flowplane mlffr --input afpacket:fa --output afpacket:fb --send afpacket:v0@fpA --recv afpacket:v0@fpB \\
      --chain forward --cores 1
(scripts/bench_ports.sh mlffr does this for every backend; remove with ip netns del fpA; ip netns del fpB.)";

/// Traffic the port sender sends when neither --trace nor --trace-gen is given.
pub const PORT_GEN: &str = "--flows 1000 --packets 100000 --size 64 --proto udp --seed 1";

#[derive(clap::Args, Debug)]
#[command(after_long_help = PORTS_HELP)]
pub struct MlffrArgs {
    /// The configuration (as `flowplane run`; --rate, --duration, --loops and --export are set by the search;
    /// --warmup is each trial's learning phase, default 0.25 s).
    #[command(flatten)]
    pub run: RunArgs,
    /// Loss counted as loss-free, in percent.
    #[arg(help_heading = "Search", long, default_value_t = 0.1, allow_negative_numbers = true, value_parser = crate::num::real(0.0, 100.0))]
    pub loss: f64,
    /// Stop when the bracket is narrower than this percentage of its upper end.
    #[arg(help_heading = "Search", long, default_value_t = 1.0, allow_negative_numbers = true, value_parser = crate::num::positive(100.0))]
    pub resolution: f64,
    /// Seconds per trial.
    #[arg(help_heading = "Search", long, default_value_t = 1.0, allow_negative_numbers = true, value_parser = crate::num::real(0.05, 600.0))]
    pub trial: f64,
    /// Repeats of a lossy trial before its rate counts as lossy (a shared machine's interference is not the
    /// chain being slow; 0: one trial per rate).
    #[arg(help_heading = "Search", long, default_value_t = 1, value_parser = crate::num::whole::<u32>(0, 100))]
    pub retries: u32,
    /// Upper end of the search in packets/s, suffixes k/M/G (default: 1.5x the unpaced rate; on ports: the sender's maximum).
    #[arg(help_heading = "Search", long, allow_negative_numbers = true,
          value_parser = crate::num::positive(1e12))]
    pub max_rate: Option<f64>,
    /// On ports: the sender, on the peer end of the input port's link: afpacket:IFACE[@NETNS] or afxdp:IFACE[@NETNS].
    #[arg(help_heading = "Search", long, value_name = "PEER")]
    pub send: Option<String>,
    /// On ports: the receiver, on the peer end of the output port's link (as --send).
    #[arg(help_heading = "Search", long, value_name = "PEER")]
    pub recv: Option<String>,
    /// On ports: the pcap the sender sends (looped; each frame gets a 6-byte trailer).
    #[arg(help_heading = "Search", long, value_name = "FILE", conflicts_with = "trace_gen")]
    pub trace: Option<std::path::PathBuf>,
    /// On ports: generate the sender's traffic with `flowplane gen` options (default: 1000 UDP flows, 64-B packets).
    #[arg(help_heading = "Search", long, value_name = "OPTIONS", allow_hyphen_values = true)]
    pub trace_gen: Option<String>,
    /// On ports: packets per transmit call of the sender.
    #[arg(help_heading = "Search", long, default_value_t = 64, allow_negative_numbers = true, value_parser = crate::num::whole::<usize>(1, 256))]
    pub send_batch: usize,
    /// On ports: seconds after a trial during which its packets may still come out; later ones count
    /// as lost (they were queued behind an overloaded worker).
    #[arg(help_heading = "Search", long, default_value_t = 0.1, allow_negative_numbers = true, value_parser = crate::num::real(0.001, 10.0))]
    pub drain: f64,
    /// On ports: the CPU the sender runs on (default: the last CPU when workers are pinned and one is left over).
    #[arg(help_heading = "Search", long, allow_negative_numbers = true, value_parser = crate::num::whole::<usize>(0, 4095))]
    pub send_cpu: Option<usize>,
}

/// The search's settings from the options (shared by the in-memory and the port search).
pub(crate) fn search_config(a: &MlffrArgs, cfg: &RunConfig) -> MlffrConfig {
    MlffrConfig {
        loss: a.loss / 100.0,
        resolution: a.resolution / 100.0,
        trial: Duration::from_secs_f64(a.trial),
        max_rate: a.max_rate,
        // `--warmup`: the learning phase before each trial (losses there do not count).
        warmup: cfg.warmup.unwrap_or(MlffrConfig::default().warmup),
        retries: a.retries,
    }
}

/// `flowplane mlffr`: the in-memory search, or the port search when `--input` names a port.
pub fn run(mut a: MlffrArgs) -> Result<(), CliError> {
    if a.run.config.is_some() {
        return Err(CliError::new("--config holds a `flowplane run`; mlffr takes its options on the command line"));
    }
    validate(&a.run)?;
    if !(a.loss.is_finite() && (0.0..100.0).contains(&a.loss)) {
        return Err(CliError::new(format!("--loss {}: must be a percentage in [0, 100)", a.loss)));
    }
    if !(a.resolution.is_finite() && a.resolution > 0.0 && a.resolution < 100.0) {
        return Err(CliError::new(format!("--resolution {}: must be a percentage in (0, 100)", a.resolution)));
    }
    if !(a.trial.is_finite() && (0.05..=600.0).contains(&a.trial)) {
        return Err(CliError::new(format!("--trial {}: must be between 0.05 and 600 seconds", a.trial)));
    }
    if let Some(r) = a.max_rate {
        if !(r.is_finite() && r > 0.0) {
            return Err(CliError::new(format!("--max-rate {r}: must be a positive packet rate")));
        }
    }
    if let Some(port) = crate::cmd_live::live_input(&a.run)? {
        return crate::cmd_mlffr_port::run(a, port);
    }
    if a.send.is_some() || a.recv.is_some() || a.trace.is_some() || a.trace_gen.is_some() {
        return Err(CliError::new(
            "--send, --recv, --trace and --trace-gen apply to live ports (--input afpacket:IFACE, ...)",
        ));
    }
    if a.run.traffic.input.is_none() && a.run.traffic.gen.is_none() {
        a.run.traffic.gen = Some(DEFAULT_GEN.to_string());
    }
    a.run.traffic.duration = Some(a.trial);
    let (cfg, spec) = config(&a.run)?;
    let input = match &a.run.traffic.input {
        Some(path) => Input::File(path),
        None => Input::Generated(Box::new(parse_gen(a.run.traffic.gen.as_deref().unwrap_or(DEFAULT_GEN))?)),
    };
    let prepared = prepare(&cfg, &spec, input, a.run.strategy.symmetric_rss)?;
    let r = search(&cfg, &spec, &prepared, &search_config(&a, &cfg))?;
    if a.run.outputs.json {
        let mut v = serde_json::to_value(&r)?;
        v["chain"] = serde_json::Value::String(a.run.pipeline.chain.clone());
        v["cores"] = cfg.cores.into();
        v["scale"] = serde_json::Value::String(cfg.scale.clone());
        outln!("{}", serde_json::to_string_pretty(&crate::provenance::stamp(serde_json::to_value(&v)?))?);
        return Ok(());
    }
    outln!("mlffr        {} on {} core(s), --scale {}", a.run.pipeline.chain, cfg.cores, cfg.scale);
    outln!("{:>14} {:>12} {:>12} {:>10} {:>9}", "rate (Mpps)", "offered", "lost", "loss %", "loss-free");
    for t in &r.trials {
        outln!(
            "{:>14.3} {:>12} {:>12} {:>10.4} {:>9}{}",
            t.rate_pps / 1e6,
            t.offered,
            t.lost,
            t.loss * 100.0,
            if t.loss_free { "yes" } else { "no" },
            if t.repeat > 0 { format!(" (repeat {})", t.repeat) } else { String::new() }
        );
    }
    outln!(
        "MLFFR        {:.3} Mpps (loss <= {}%, resolution {}%); unpaced {:.3} Mpps before the search, {:.3} after",
        r.mlffr_pps / 1e6,
        a.loss,
        a.resolution,
        r.full_speed_pps / 1e6,
        r.full_speed_after_pps / 1e6
    );
    Ok(())
}
