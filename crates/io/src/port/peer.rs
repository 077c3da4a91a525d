//! Measurement traffic on the far ends of a port's links (`flowplane mlffr`
//! on live ports): a paced sender that injects a trace into the peer of
//! the input port, and a receiver that counts what comes out of the peer of
//! the output port. Both are ordinary ports (AF_PACKET: sendmmsg with
//! PACKET_QDISC_BYPASS / a TPACKET_V3 ring; AF_XDP), optionally opened from
//! inside a network namespace (`afpacket:v0@NETNS`).
//!
//! Every frame sent carries a 6-byte trailer after the frame's own bytes
//! (Ethernet padding beyond the IP datagram: no header, length or checksum
//! changes): a magic byte, the phase (probe, learning, measured) and a
//! sequence number. The receiver counts per phase, so loss over the measured
//! phase is exact — packets still queued at a phase boundary are not
//! mistaken for loss or for delivery — and counts measured packets that
//! arrive out of sequence.
//!
//! The sender paces by the TSC in bursts of up to `batch` packets: it sends
//! what is due, sleeps when the next packet is far ahead and spins when it
//! is near. After a scheduling gap it catches up on up to 2 ms of backlog
//! (in bursts); a sender further behind drops the rest: its achieved rate
//! is then below the asked one, which the result shows.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use flowplane_packet::{tsc, Batch, PacketPool, MAX_BATCH};

use super::{PortError, PortSpec, RxQueue, TxQueue};

/// Bytes of the trailer each sent frame carries.
pub const TRAILER: usize = 6;
const MAGIC: u8 = 0xF1;
/// Phase of the probes that check the path before a trial.
pub const PHASE_PROBE: u8 = 0;
/// Phase of the learning (warm-up) packets.
pub const PHASE_WARMUP: u8 = 1;
/// Phase of the measured packets.
pub const PHASE_MEASURE: u8 = 2;
const PHASES: usize = 3;

/// A peer end: a live port, optionally in a network namespace (`afpacket:v0@ns1`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerSpec {
    /// The port (afpacket or afxdp).
    pub port: PortSpec,
    /// The network namespace to open it in (a name under /run/netns or a path).
    pub netns: Option<String>,
}

impl PeerSpec {
    /// Parses `afpacket:IFACE[@NETNS]` or `afxdp:IFACE[:QUEUE][@NETNS]`.
    pub fn parse(s: &str) -> Result<PeerSpec, PortError> {
        let (p, ns) = match s.rsplit_once('@') {
            Some((p, ns)) if !ns.is_empty() => (p, Some(ns.to_string())),
            Some(_) => return Err(PortError::Spec(format!("{s}: expected PORT@NETNS"))),
            None => (s, None),
        };
        let port = PortSpec::parse(p)?;
        if !matches!(port, PortSpec::AfPacket { .. } | PortSpec::AfXdp { .. }) {
            return Err(PortError::Spec(format!("{s}: a peer is afpacket:IFACE or afxdp:IFACE (with @NETNS)")));
        }
        Ok(PeerSpec { port, netns: ns })
    }
}

impl fmt::Display for PeerSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.netns {
            Some(ns) => write!(f, "{}@{ns}", self.port),
            None => write!(f, "{}", self.port),
        }
    }
}

/// Writes the trailer (phase, sequence) into the last [`TRAILER`] bytes of `frame`.
#[inline]
pub fn stamp(frame: &mut [u8], phase: u8, seq: u32) {
    let n = frame.len();
    if n >= TRAILER {
        frame[n - TRAILER] = MAGIC;
        frame[n - TRAILER + 1] = phase;
        frame[n - 4..].copy_from_slice(&seq.to_le_bytes());
    }
}

/// The trailer of a frame the sender stamped: (phase, sequence).
#[inline]
pub fn read_stamp(frame: &[u8]) -> Option<(u8, u32)> {
    let n = frame.len();
    if n < TRAILER || frame[n - TRAILER] != MAGIC || frame[n - TRAILER + 1] as usize >= PHASES {
        return None;
    }
    let seq = u32::from_le_bytes([frame[n - 4], frame[n - 3], frame[n - 2], frame[n - 1]]);
    Some((frame[n - TRAILER + 1], seq))
}

/// The frames a sender cycles through, each with room for the trailer.
#[derive(Default)]
pub struct Frames {
    data: Vec<u8>,
    spans: Vec<(usize, usize)>,
}

impl Frames {
    /// No frames.
    pub fn new() -> Frames {
        Frames::default()
    }

    /// Adds `frame` (plus trailer room); frames longer than `max` with the trailer are skipped (false).
    pub fn push(&mut self, frame: &[u8], max: usize) -> bool {
        if frame.is_empty() || frame.len() + TRAILER > max {
            return false;
        }
        let start = self.data.len();
        self.data.extend_from_slice(frame);
        self.data.extend_from_slice(&[0; TRAILER]);
        self.spans.push((start, frame.len() + TRAILER));
        true
    }

    /// Number of frames.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Frame `i` with its (zeroed) trailer room.
    pub fn get(&self, i: usize) -> &[u8] {
        let (s, l) = self.spans[i];
        &self.data[s..s + l]
    }

    /// Mean frame length on the wire (trailer included).
    pub fn mean_len(&self) -> f64 {
        if self.spans.is_empty() {
            0.0
        } else {
            self.spans.iter().map(|s| s.1).sum::<usize>() as f64 / self.spans.len() as f64
        }
    }
}

/// What the receiver has counted so far (one writer: the receiver thread).
#[derive(Debug, Default)]
pub struct PeerCounts {
    /// Frames received per phase (probe, learning, measured).
    pub phase: [AtomicU64; PHASES],
    /// Frames without the sender's trailer (other traffic on the link).
    pub other: AtomicU64,
    /// Measured frames whose sequence number was not above the previous one's.
    pub reordered: AtomicU64,
}

impl PeerCounts {
    /// Frames received in `phase`.
    pub fn get(&self, phase: u8) -> u64 {
        self.phase[phase as usize % PHASES].load(Ordering::Relaxed)
    }
}

/// Receives on `rx` and counts frames by trailer phase into `counts` until
/// `stop` is raised (then returns after the queue is empty). Naps when idle.
pub fn receive(rx: &mut dyn RxQueue, pool: &mut PacketPool, batch: &mut Batch, counts: &PeerCounts, stop: &AtomicBool) {
    let mut local = [0u64; PHASES];
    let (mut other, mut reordered) = (0u64, 0u64);
    let mut last: Option<u32> = None;
    let mut idle = 0u32;
    loop {
        let n = rx.rx_burst(pool, batch, MAX_BATCH);
        if n == 0 {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            idle += 1;
            if idle > 64 {
                std::thread::sleep(Duration::from_micros(200));
            } else {
                std::hint::spin_loop();
            }
            continue;
        }
        idle = 0;
        for i in 0..batch.len() {
            match read_stamp(batch.data(i)) {
                Some((p, seq)) => {
                    local[p as usize] += 1;
                    if p == PHASE_MEASURE {
                        if last.is_some_and(|l| seq <= l) {
                            reordered += 1;
                        }
                        last = Some(seq);
                    }
                }
                None => other += 1,
            }
        }
        let _ = batch.free_all(pool);
        for (c, v) in counts.phase.iter().zip(local) {
            c.store(v, Ordering::Relaxed);
        }
        counts.other.store(other, Ordering::Relaxed);
        counts.reordered.store(reordered, Ordering::Relaxed);
    }
}

/// How a sender runs one trial.
#[derive(Clone, Copy, Debug)]
pub struct SendPlan {
    /// Offered rate in packets/s; None: as fast as the sender can.
    pub rate_pps: Option<f64>,
    /// Learning phase (sent at the same rate, counted apart).
    pub warmup: Duration,
    /// Measured phase.
    pub measure: Duration,
    /// Packets per transmit call at most.
    pub batch: usize,
    /// How long probes may take to cross before the trial fails.
    pub probe_timeout: Duration,
}

/// What a sender did in one trial.
#[derive(Clone, Copy, Debug, Default)]
pub struct SendResult {
    /// Probes sent before the path answered.
    pub probes: u64,
    /// Packets sent in the learning phase.
    pub warmup_sent: u64,
    /// Packets sent in the measured phase.
    pub sent: u64,
    /// Length of the measured phase in seconds (TSC).
    pub measured_s: f64,
    /// Transmit calls that sent fewer packets than asked (socket or ring full).
    pub short_sends: u64,
    /// Times the sender fell more than 2 ms (or two bursts) behind its schedule and dropped the backlog.
    pub behind: u64,
}

/// A sender's transmit state.
struct Tx<'a> {
    tx: &'a mut dyn TxQueue,
    pool: &'a mut PacketPool,
    batch: &'a mut Batch,
    frames: &'a Frames,
    next: usize,
    seq: u32,
    short: u64,
}

impl Tx<'_> {
    /// Sends up to `k` frames of `phase` in one call; returns how many went.
    fn burst(&mut self, k: usize, phase: u8) -> u64 {
        let k = k.min(MAX_BATCH);
        for _ in 0..k {
            let f = self.frames.get(self.next);
            self.next += 1;
            if self.next == self.frames.len() {
                self.next = 0;
            }
            if !self.batch.push_copy(self.pool, f, 0) {
                break;
            }
            let i = self.batch.len() - 1;
            stamp(self.batch.data_mut(i), phase, self.seq);
            self.seq = self.seq.wrapping_add(1);
        }
        let asked = self.batch.len();
        let (sent, _, _) = self.tx.tx_batch(self.batch, 0);
        let _ = self.batch.free_all(self.pool);
        if (sent as usize) < asked {
            self.short += 1;
        }
        sent
    }

    /// Sends `phase` at `rate` (None: flat out) for `dur`; (sent, seconds, times behind).
    fn phase(&mut self, phase: u8, rate: Option<f64>, dur: Duration, b: usize, abort: &AtomicBool) -> (u64, f64, u64) {
        let hz = tsc::hz().max(1.0);
        let start = tsc::rdtsc();
        let end = start + (dur.as_secs_f64() * hz) as u64;
        let per = rate.map(|r| hz / r.max(1.0));
        let nap = (100e-6 * hz) as u64;
        // Backlog the sender catches up on after a scheduling gap (a late wake-up, a
        // preemption): 2 ms worth or two bursts; beyond that it is dropped.
        let cap = per.map_or(0, |c| ((2e-3 * hz / c) as u64).max(2 * b as u64));
        let (mut sent, mut sched, mut behind) = (0u64, 0u64, 0u64);
        let mut polls = 0u32;
        loop {
            let now = tsc::rdtsc();
            if now >= end {
                break;
            }
            polls = polls.wrapping_add(1);
            if polls.is_multiple_of(1024) && abort.load(Ordering::Relaxed) {
                break;
            }
            let want = match per {
                None => b as u64,
                Some(c) => {
                    let due_total = ((now - start) as f64 / c) as u64 + 1;
                    let mut due = due_total.saturating_sub(sched);
                    if due > cap {
                        // Far behind schedule: forget the backlog (the achieved rate shows it).
                        behind += 1;
                        sched = due_total - b as u64;
                        due = b as u64;
                    }
                    if due == 0 {
                        let at = start + (sched as f64 * c) as u64;
                        let wait = at.saturating_sub(now);
                        if wait > 2 * nap {
                            std::thread::sleep(Duration::from_secs_f64((wait - nap) as f64 / hz));
                        } else {
                            std::hint::spin_loop();
                        }
                        continue;
                    }
                    due.min(b as u64)
                }
            };
            let k = self.burst(want as usize, phase);
            sent += k;
            sched += k;
        }
        let secs = (tsc::rdtsc() - start) as f64 / hz;
        (sent, secs, behind)
    }
}

/// Runs one trial's traffic on `tx`: probes (one per millisecond) until
/// `ready` says the path carries them, then the learning phase and the
/// measured phase at `plan.rate_pps`. Stops early when `abort` is raised.
pub fn send(
    tx: &mut dyn TxQueue,
    pool: &mut PacketPool,
    batch: &mut Batch,
    frames: &Frames,
    plan: &SendPlan,
    ready: &dyn Fn() -> bool,
    abort: &AtomicBool,
) -> Result<SendResult, PortError> {
    if frames.is_empty() {
        return Err(PortError::Spec("the sender has no frames to send".to_string()));
    }
    let b = plan.batch.clamp(1, MAX_BATCH);
    let mut t = Tx { tx, pool, batch, frames, next: 0, seq: 0, short: 0 };
    let mut r = SendResult::default();
    let t0 = Instant::now();
    while !ready() {
        if abort.load(Ordering::Relaxed) {
            return Ok(r);
        }
        if t0.elapsed() > plan.probe_timeout {
            return Err(PortError::Unsupported(format!(
                "no probe crossed in {:?} ({} sent): is the sender's link the input port's peer, and the receiver's the output's?",
                plan.probe_timeout, r.probes
            )));
        }
        r.probes += t.burst(1, PHASE_PROBE);
        std::thread::sleep(Duration::from_millis(1));
    }
    // Probes still in flight settle before the learning phase starts.
    std::thread::sleep(Duration::from_millis(20));
    let (w, _, b1) = t.phase(PHASE_WARMUP, plan.rate_pps, plan.warmup, b, abort);
    let (s, secs, b2) = t.phase(PHASE_MEASURE, plan.rate_pps, plan.measure, b, abort);
    r.warmup_sent = w;
    r.sent = s;
    r.measured_s = secs;
    r.short_sends = t.short;
    r.behind = b1 + b2;
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowplane_packet::{PoolConfig, Verdict};

    #[test]
    fn peer_names() {
        let p = PeerSpec::parse("afpacket:v0@fpA1").unwrap();
        assert_eq!(p.port, PortSpec::AfPacket { iface: "v0".into() });
        assert_eq!(p.netns.as_deref(), Some("fpA1"));
        assert_eq!(p.to_string(), "afpacket:v0@fpA1");
        let p = PeerSpec::parse("afxdp:v0:1").unwrap();
        assert_eq!((p.port, p.netns), (PortSpec::AfXdp { iface: "v0".into(), queue: 1 }, None));
        for bad in ["afpacket:v0@", "x.pcap", "dpdk:net_null0@ns", "afpacket:@ns"] {
            assert!(PeerSpec::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn trailer_round_trip_and_strangers() {
        let mut f = vec![0u8; 70];
        stamp(&mut f, PHASE_MEASURE, 0xdead_beef);
        assert_eq!(read_stamp(&f), Some((PHASE_MEASURE, 0xdead_beef)));
        assert_eq!(read_stamp(&[0u8; 60]), None);
        assert_eq!(read_stamp(&[MAGIC; 3]), None);
        let mut g = vec![0u8; 64];
        stamp(&mut g, 7, 1);
        assert_eq!(read_stamp(&g), None, "unknown phase");
    }

    /// A transmit queue that keeps what it was given (up to `room` per call).
    struct Keep {
        got: Vec<(u8, u32)>,
        room: usize,
    }

    impl TxQueue for Keep {
        fn tx_batch(&mut self, batch: &Batch, port: Verdict) -> (u64, u64, u64) {
            let mut n = 0;
            for i in 0..batch.len() {
                if batch.verdicts()[i] == port && n < self.room {
                    self.got.push(read_stamp(batch.data(i)).unwrap());
                    n += 1;
                }
            }
            (n as u64, 0, (batch.len() - n) as u64)
        }
    }

    #[test]
    fn paced_sender_sends_at_the_rate_in_phases() {
        let mut frames = Frames::new();
        for l in [60usize, 100, 200] {
            assert!(frames.push(&vec![0xab; l], 2048));
        }
        assert!(!frames.push(&[1; 2045], 2048));
        let mut pool = PacketPool::new(PoolConfig { buffers: 256, ..PoolConfig::default() }).unwrap();
        let mut batch = Batch::new(&pool);
        let mut q = Keep { got: Vec::new(), room: usize::MAX };
        let plan = SendPlan {
            rate_pps: Some(20_000.0),
            warmup: Duration::from_millis(50),
            measure: Duration::from_millis(200),
            batch: 16,
            probe_timeout: Duration::from_secs(1),
        };
        let probes = std::cell::Cell::new(0);
        let ready = || {
            probes.set(probes.get() + 1);
            probes.get() > 3
        };
        let r = send(&mut q, &mut pool, &mut batch, &frames, &plan, &ready, &AtomicBool::new(false)).unwrap();
        assert_eq!(r.probes, 3);
        let rate = r.sent as f64 / r.measured_s;
        // Never above the rate; below it only when the thread was kept off the CPU (a loaded machine), and then said.
        assert!(rate < 22_000.0 && (rate > 18_000.0 || r.behind > 0), "rate {rate} ({r:?})");
        assert_eq!(q.got.iter().filter(|g| g.0 == PHASE_PROBE).count(), 3);
        assert_eq!(q.got.iter().filter(|g| g.0 == PHASE_WARMUP).count() as u64, r.warmup_sent);
        assert_eq!(q.got.iter().filter(|g| g.0 == PHASE_MEASURE).count() as u64, r.sent);
        assert!(q.got.windows(2).all(|w| w[1].1 == w[0].1 + 1), "sequence numbers follow each other");
        assert_eq!(pool.stats().free, 256, "every buffer back");
        // A path that never answers is a one-line error.
        let e = send(
            &mut q,
            &mut pool,
            &mut batch,
            &frames,
            &SendPlan { probe_timeout: Duration::from_millis(20), ..plan },
            &|| false,
            &AtomicBool::new(false),
        );
        assert!(e.is_err());
    }

    #[test]
    fn a_full_queue_is_a_shortfall_not_a_hang() {
        let mut frames = Frames::new();
        frames.push(&[0; 60], 2048);
        let mut pool = PacketPool::new(PoolConfig { buffers: 256, ..PoolConfig::default() }).unwrap();
        let mut batch = Batch::new(&pool);
        let mut q = Keep { got: Vec::new(), room: 1 };
        let plan = SendPlan {
            rate_pps: None,
            warmup: Duration::from_millis(10),
            measure: Duration::from_millis(30),
            batch: 32,
            probe_timeout: Duration::from_secs(1),
        };
        let r = send(&mut q, &mut pool, &mut batch, &frames, &plan, &|| true, &AtomicBool::new(false)).unwrap();
        assert!(r.sent > 0 && r.short_sends > 0, "{r:?}");
        assert_eq!(q.got.iter().filter(|g| g.0 == PHASE_MEASURE).count() as u64, r.sent);
    }
}
