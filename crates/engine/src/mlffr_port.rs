//! The maximum loss-free forwarding rate on live ports (`flowplane mlffr
//! --input afpacket:IFACE ...`): the same binary search as [`crate::mlffr`],
//! with real links in place of the paced in-memory replay. Per trial a
//! sender injects the trace into the peer end of the input port's link at
//! the trial's rate (TSC-paced bursts, `flowplane_io::port::peer`),
//! flowplane runs the chain on the ports ([`crate::runner::run_port`]), and a receiver on
//! the same thread (polled between the sender's bursts) counts what leaves
//! the peer end of the output port's link. Every
//! frame carries its phase (probe, learning, measured) and a sequence number
//! in a trailer, so loss over the measured phase — sent minus received,
//! whichever ring, queue or link dropped it (the kernel's RX ring drops,
//! PACKET_STATISTICS or the XDP socket's rx_dropped/rx_ring_full, are shown
//! beside it) — is exact. A measured packet that has not come out within
//! the drain time after the phase (default 100 ms: longer than the 50-ms
//! stall of a worker the kernel throttles at a real-time priority) counts
//! as lost: a deep RX ring (AF_PACKET's default holds ~100K small packets)
//! could otherwise hide an overloaded worker for a whole trial.
//!
//! The first trial sends flat out: its achieved rate is the sender's own
//! maximum on this machine (sender, kernel and flowplane sharing the CPUs),
//! the search's upper end. If flowplane loses nothing even there, the MLFFR
//! is the sender's maximum and the result says the sender was the limit.
//! Cycles per packet are the workers' busy TSC cycles (receive to transmit,
//! idle polls excluded) per packet received, at the MLFFR trial; the
//! in-memory replay of the same trace and chain is measured beside it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use flowplane_io::cpu;
use flowplane_io::port::peer::{self, Counter, Frames, PeerSpec, SendPlan, SendResult};
use flowplane_io::port::{self, netns, Port, PortOptions, PortStats};
use flowplane_packet::{Batch, PacketPool, PoolConfig};
use serde::Serialize;

use crate::error::EngineError;
use crate::live::Live;
use crate::mlffr::{trial_config, MlffrConfig};
use crate::runner::{run_prepared, Output, Prepared, RunConfig};
use crate::runtime::Watch;
use crate::spec::ChainSpec;

/// The lowest rate the search tries (packets/s).
const MIN_RATE: f64 = 1000.0;

/// Opens the ports flowplane runs on for one trial: (input, outputs by verdict).
pub type OpenPorts<'a> = dyn Fn() -> Result<(Arc<dyn Port>, Vec<Arc<dyn Port>>), EngineError> + Sync + 'a;

/// The measurement set-up around flowplane's ports.
pub struct PortRig<'a> {
    /// Opens flowplane's ports (fresh per trial where the backend allows it).
    pub open: &'a OpenPorts<'a>,
    /// The sender: the peer end of the input port's link.
    pub sender: PeerSpec,
    /// The receiver: the peer end of the output port's link.
    pub receiver: PeerSpec,
    /// Options for the peer ports.
    pub peer_opts: PortOptions,
    /// What the sender sends (looped).
    pub frames: Frames,
    /// Packets per transmit call of the sender.
    pub send_batch: usize,
    /// The CPU the sender is pinned to (None: not pinned).
    pub sender_cpu: Option<usize>,
    /// How long after a trial's measured phase its packets may still come out (later: lost).
    pub drain: Duration,
    /// Steer by flowplane's symmetric table (`--symmetric-rss`), as `flowplane run` on the ports would.
    pub symmetric_rss: bool,
}

/// One trial on ports.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PortTrial {
    /// Rate asked of the sender (packets/s); 0: flat out.
    pub rate_pps: f64,
    /// Rate the sender achieved over the measured phase (packets/s).
    pub offered_pps: f64,
    /// Packets sent in the measured phase.
    pub offered: u64,
    /// Of those, packets the receiver counted.
    pub received: u64,
    /// offered - received.
    pub lost: u64,
    /// lost / offered.
    pub loss: f64,
    /// Within the threshold.
    pub loss_free: bool,
    /// flowplane's input port: the kernel's RX ring drops (whole trial, learning included).
    pub rx_overrun: u64,
    /// flowplane's input port: packets dropped for want of a pool buffer.
    pub rx_pool_empty: u64,
    /// flowplane's output ports: transmit ring/socket full.
    pub tx_full: u64,
    /// flowplane's output ports: transmit errors.
    pub tx_errors: u64,
    /// Measured packets received out of sequence.
    pub reordered: u64,
    /// The receiver's own RX ring drops (the measurement's limit, not the ports': should be 0).
    pub receiver_drops: u64,
    /// Times the sender fell behind its schedule (its own limit).
    pub sender_behind: u64,
    /// Packets flowplane's workers received after their learning phase.
    pub worker_packets: u64,
    /// Workers' busy TSC cycles per packet (receive to transmit).
    pub cycles_per_packet: f64,
    /// Fraction of the workers' time busy at the offered rate (cycles per packet x rate / TSC Hz / cores):
    /// how near flowplane itself was to its limit.
    pub worker_busy: f64,
    /// Who steered packets to the workers (the report's `steering.by`: port, dispatcher, kernel).
    pub steered_by: String,
}

/// The search's result on ports.
#[derive(Clone, Debug, Serialize)]
pub struct PortMlffr {
    /// flowplane's input port.
    pub input: String,
    /// flowplane's output ports.
    pub outputs: Vec<String>,
    /// The sender's port.
    pub sender: String,
    /// The receiver's port.
    pub receiver: String,
    /// Mean frame length sent, trailer included (bytes).
    pub frame_bytes: f64,
    /// The highest loss-free rate found (packets/s, as achieved by the sender).
    pub mlffr_pps: f64,
    /// The sender's own maximum (its flat-out trial, packets/s).
    pub sender_max_pps: f64,
    /// "sender" when flowplane lost nothing at the sender's maximum (or the sender
    /// twice fell short of a trial's rate), "max-rate" when nothing at the given cap,
    /// else "flowplane".
    pub limited_by: &'static str,
    /// Workers' busy cycles per packet at the MLFFR trial.
    pub cycles_per_packet: f64,
    /// TSC frequency (GHz), the unit of the cycle counts.
    pub tsc_ghz: f64,
    /// The in-memory replay of the same trace and chain: busy cycles per packet.
    pub replay_cycles_per_packet: Option<f64>,
    /// The in-memory replay's throughput (packets/s).
    pub replay_pps: Option<f64>,
    /// Who steered packets to the workers in the trials (port, dispatcher or kernel; see [`PortTrial::steered_by`]).
    pub steered_by: String,
    /// Loss threshold used.
    pub loss_threshold: f64,
    /// Resolution used.
    pub resolution: f64,
    /// Every trial, in order (the first is the sender flat out).
    pub trials: Vec<PortTrial>,
}

/// The frames of a prepared (loaded) trace, in trace order, for a sender whose buffers hold `max` bytes.
pub fn frames_of(p: &Prepared, max: usize) -> Result<Frames, EngineError> {
    let t = &p.trace;
    let mut f = Frames::new();
    let mut buf = Vec::with_capacity(2048);
    for q in 0..t.queues() {
        for i in 0..t.queue_packets(q) {
            if t.copy_frame(q, i, &mut buf) {
                f.push(&buf, max);
            }
        }
    }
    if f.is_empty() {
        return Err(EngineError::Config(format!("no frame of the trace fits a sender buffer ({max} bytes)")));
    }
    Ok(f)
}

fn cfg_err(e: impl std::fmt::Display) -> EngineError {
    EngineError::Config(e.to_string())
}

fn sum(ports: &[Arc<dyn Port>]) -> PortStats {
    let mut s = PortStats::default();
    for p in ports {
        s.merge(&p.stats());
    }
    s
}

/// Opens a peer's port in its namespace (on the calling thread, which stays there).
fn open_peer(p: &PeerSpec, opts: PortOptions) -> Result<Arc<dyn Port>, EngineError> {
    if let Some(ns) = &p.netns {
        netns::enter(ns).map_err(cfg_err)?;
    }
    port::open(&p.port, 1, opts).map_err(|e| EngineError::Config(format!("{p}: {e}")))
}

fn sender_pool() -> Result<(PacketPool, Box<Batch>), EngineError> {
    let pool = PacketPool::new(PoolConfig { buffers: 1024, ..PoolConfig::default() })?;
    let batch = Batch::new(&pool);
    Ok((pool, batch))
}

/// The data room of the sender's buffers (the largest frame it sends, trailer included).
pub fn sender_frame_room() -> usize {
    sender_pool().map_or(1500, |(p, _)| p.data_room())
}

/// Runs one trial at `rate` (None: the sender flat out).
pub fn port_trial(
    cfg: &RunConfig,
    spec: &ChainSpec,
    rig: &PortRig<'_>,
    rate: Option<f64>,
    m: &MlffrConfig,
) -> Result<PortTrial, EngineError> {
    let c = RunConfig {
        rate_pps: None,
        loops: None,
        duration: None,
        warmup: Some(m.warmup),
        export: Vec::new(),
        ..cfg.clone()
    };
    let (input, outputs) = (rig.open)()?;
    let live = Live::new(Arc::clone(&input), outputs.clone(), c.cores);
    let (in0, out0) = (input.stats(), sum(&outputs));
    let stop = AtomicBool::new(false);
    let plan = SendPlan {
        rate_pps: rate,
        warmup: m.warmup,
        measure: m.trial,
        batch: rig.send_batch,
        probe_timeout: Duration::from_secs(5),
        drain: rig.drain,
    };
    type Peer = (SendResult, u64, u64, PortStats);
    let (report, peer) = std::thread::scope(|s| {
        let (stop, input) = (&stop, &input);
        // One thread sends and counts (see `peer::Counter`): it enters the
        // receiver's namespace to open the receiver, then the sender's.
        let h = std::thread::Builder::new()
            .name("fp-mlffr-peer".into())
            .spawn_scoped(s, move || -> Result<Peer, EngineError> {
                let r = (|| {
                    if let Some(cpu) = rig.sender_cpu {
                        cpu::pin_current_thread(cpu);
                    }
                    let rport = open_peer(&rig.receiver, rig.peer_opts)?;
                    let mut rpool = PacketPool::new(PoolConfig { buffers: 4096, ..PoolConfig::default() })?;
                    let rx =
                        rport.open_rx_into(0, &mut rpool).map_err(|e| cfg_err(format!("{}: {e}", rig.receiver)))?;
                    let mut counter = Counter::new(rx, rpool);
                    let sport = open_peer(&rig.sender, rig.peer_opts)?;
                    let (mut pool, mut batch) = sender_pool()?;
                    let mut tx = sport.open_tx(0).map_err(|e| cfg_err(format!("{}: {e}", rig.sender)))?;
                    let base = in0.rx_packets;
                    let ready = |c: &Counter| c.get(peer::PHASE_PROBE) > 0 && input.stats().rx_packets > base;
                    let r =
                        peer::send(tx.as_mut(), &mut pool, &mut batch, &rig.frames, &plan, &mut counter, &ready, stop)
                            .map_err(cfg_err)?;
                    let (got, reordered) = (counter.get(peer::PHASE_MEASURE), counter.reordered());
                    // Closing the receive queue reads the kernel's last drop count.
                    drop(counter);
                    Ok((r, got, reordered, rport.stats()))
                })();
                stop.store(true, Ordering::Relaxed);
                r
            })
            .map_err(EngineError::Thread);
        let report = crate::runner::run_port(
            &c,
            spec,
            rig.symmetric_rss,
            &live,
            Watch { stop: Some(stop), tick: None, service: None },
        );
        stop.store(true, Ordering::Relaxed);
        let peer =
            h.and_then(|h| h.join().unwrap_or_else(|_| Err(EngineError::Config("the sender thread panicked".into()))));
        (report, peer)
    });
    // The peer's error explains a run that never saw traffic better than the run's.
    let (sent, got, reordered, rstats) = peer?;
    let report = report?;
    let (in1, out1) = (live.input.as_ref().map(|i| i.stats()).unwrap_or_default(), sum(&live.outputs));
    let got = got.min(sent.sent);
    let lost = sent.sent - got;
    let offered_pps = if sent.measured_s > 0.0 { sent.sent as f64 / sent.measured_s } else { 0.0 };
    Ok(PortTrial {
        rate_pps: rate.unwrap_or(0.0),
        offered_pps,
        offered: sent.sent,
        received: got,
        lost,
        loss: if sent.sent > 0 { lost as f64 / sent.sent as f64 } else { 1.0 },
        loss_free: false,
        rx_overrun: in1.rx_overrun.saturating_sub(in0.rx_overrun),
        rx_pool_empty: in1.rx_pool_empty.saturating_sub(in0.rx_pool_empty),
        tx_full: out1.tx_full.saturating_sub(out0.tx_full),
        tx_errors: out1.tx_errors.saturating_sub(out0.tx_errors),
        reordered,
        receiver_drops: rstats.rx_overrun,
        sender_behind: sent.behind,
        worker_packets: report.packets,
        cycles_per_packet: report.cycles_per_packet,
        worker_busy: report.cycles_per_packet * offered_pps / (live.hz * c.cores.max(1) as f64),
        steered_by: report.steering.as_ref().map_or_else(String::new, |s| s.by.clone()),
    })
}

/// Searches the MLFFR of `spec` on the rig's ports: the sender flat out
/// first (its maximum), then a binary search below it (or below
/// `m.max_rate` when that is lower). `replay`: the same trace loaded in
/// memory, for the replay's cycles per packet beside the ports'.
pub fn search_ports(
    cfg: &RunConfig,
    spec: &ChainSpec,
    rig: &PortRig<'_>,
    m: &MlffrConfig,
    replay: Option<&Prepared>,
    names: (String, Vec<String>),
) -> Result<PortMlffr, EngineError> {
    if !((0.0..1.0).contains(&m.loss) && m.resolution > 0.0 && m.resolution < 1.0) {
        return Err(EngineError::Config("mlffr: loss must be in [0, 1) and resolution in (0, 1)".to_string()));
    }
    let judge = |mut t: PortTrial| {
        t.loss_free = t.offered > 0 && t.loss <= m.loss;
        t
    };
    let mut trials = Vec::new();
    let first = judge(port_trial(cfg, spec, rig, None, m)?);
    let sender_max = first.offered_pps;
    let (mut lo, mut hi) = (0.0f64, sender_max);
    let mut best: Option<usize> = None;
    if first.loss_free {
        lo = sender_max;
        best = Some(0);
    }
    trials.push(first);
    if let Some(cap) = m.max_rate.filter(|&c| c < sender_max) {
        // A cap below the sender's maximum: try it first; loss-free there ends the search.
        let t = judge(port_trial(cfg, spec, rig, Some(cap), m)?);
        let ok = t.loss_free;
        trials.push(t);
        if ok {
            // Loss-free at the cap: the cap is the answer (capped search).
            lo = cap.min(trials[trials.len() - 1].offered_pps);
            hi = lo;
            best = Some(trials.len() - 1);
        } else {
            (lo, hi, best) = (0.0, cap, None);
        }
    }
    let mut sender_short = false;
    let mut retried = false;
    // Repeats of a lossy rate so far (`m.retries`: interference on a shared machine is not flowplane being slow).
    let mut lossy_repeats = 0u32;
    while lo < hi && hi - lo > m.resolution * hi && trials.len() < 64 {
        let mid = (lo + hi) / 2.0;
        if mid < MIN_RATE {
            // Lossy even at a trickle: nothing is loss-free (MLFFR 0).
            break;
        }
        let t = judge(port_trial(cfg, spec, rig, Some(mid), m)?);
        // Loss-free, but the sender could not offer the rate asked (a noisy machine): counted
        // at the rate it achieved, tried once more; short again, the sender is the limit here.
        let short = t.offered_pps < mid * (1.0 - m.resolution / 2.0);
        let ok = t.loss_free;
        let at = t.offered_pps.min(mid);
        trials.push(t);
        if ok && at > lo {
            lo = at;
            best = Some(trials.len() - 1);
        }
        if ok && short {
            if retried {
                sender_short = true;
                break;
            }
            retried = true;
            continue;
        }
        retried = false;
        if !ok {
            if lossy_repeats < m.retries {
                lossy_repeats += 1;
                continue;
            }
            hi = mid;
        }
        lossy_repeats = 0;
    }
    let cycles_per_packet = best.map_or(0.0, |i| trials[i].cycles_per_packet);
    let (replay_cycles_per_packet, replay_pps) = match replay {
        Some(p) => {
            let r = run_prepared(&trial_config(cfg, m, None), spec, p, Output::Discard)?;
            (Some(r.cycles_per_packet), Some(r.mpps * 1e6))
        }
        None => (None, None),
    };
    Ok(PortMlffr {
        input: names.0,
        outputs: names.1,
        sender: rig.sender.to_string(),
        receiver: rig.receiver.to_string(),
        frame_bytes: rig.frames.mean_len(),
        mlffr_pps: lo,
        sender_max_pps: sender_max,
        limited_by: match best {
            Some(0) => "sender",
            Some(1) if m.max_rate.is_some_and(|c| c < sender_max) => "max-rate",
            _ if sender_short => "sender (short of a trial's rate)",
            _ => "flowplane",
        },
        cycles_per_packet,
        tsc_ghz: flowplane_packet::tsc::hz() / 1e9,
        replay_cycles_per_packet,
        replay_pps,
        steered_by: trials.first().map_or_else(String::new, |t| t.steered_by.clone()),
        loss_threshold: m.loss,
        resolution: m.resolution,
        trials,
    })
}
