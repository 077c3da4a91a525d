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
use std::sync::atomic::{AtomicBool, Ordering};
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
        if !port.kind().caps.peer {
            let peers: Vec<&str> = super::PORTS.iter().filter(|k| k.caps.peer).map(|k| k.syntax).collect();
            return Err(PortError::Spec(format!("{s}: a peer is {} (with @NETNS)", peers.join(" or "))));
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

/// The receiver: polls an RX queue and counts frames by trailer phase.
/// It runs on the sender's thread, between the sender's bursts and while
/// the sender waits: one thread, so a sender spinning at a real-time
/// priority cannot starve it (its ring would overflow and the loss be
/// blamed on the ports under test).
pub struct Counter {
    rx: Box<dyn RxQueue>,
    pool: PacketPool,
    batch: Box<Batch>,
    phase: [u64; PHASES],
    other: u64,
    reordered: u64,
    last: Option<u32>,
}

impl Counter {
    /// A counter over `rx`, whose buffers are `pool`'s.
    pub fn new(rx: Box<dyn RxQueue>, pool: PacketPool) -> Counter {
        let batch = Batch::new(&pool);
        Counter { rx, pool, batch, phase: [0; PHASES], other: 0, reordered: 0, last: None }
    }

    /// Receives and counts what is waiting (up to a few bursts); returns the frames seen.
    pub fn poll(&mut self) -> usize {
        let mut seen = 0;
        for _ in 0..4 {
            let n = self.rx.rx_burst(&mut self.pool, &mut self.batch, MAX_BATCH);
            if n == 0 {
                break;
            }
            seen += n;
            for i in 0..self.batch.len() {
                match read_stamp(self.batch.data(i)) {
                    Some((p, seq)) => {
                        self.phase[p as usize] += 1;
                        if p == PHASE_MEASURE {
                            if self.last.is_some_and(|l| seq <= l) {
                                self.reordered += 1;
                            }
                            self.last = Some(seq);
                        }
                    }
                    None => self.other += 1,
                }
            }
            let _ = self.batch.free_all(&mut self.pool);
        }
        seen
    }

    /// Frames received in `phase`.
    pub fn get(&self, phase: u8) -> u64 {
        self.phase[phase as usize % PHASES]
    }

    /// Frames without the sender's trailer (other traffic on the link).
    pub fn other(&self) -> u64 {
        self.other
    }

    /// Measured frames whose sequence number was not above the previous one's.
    pub fn reordered(&self) -> u64 {
        self.reordered
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
    /// How long after the measured phase its last frames may still arrive; later
    /// ones count as lost (queued behind an overloaded forwarder: a deep ring can
    /// hide overload for a whole trial, but not its backlog at the end).
    pub drain: Duration,
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

/// A sender's transmit state (and the receiver it polls).
struct Tx<'a> {
    tx: &'a mut dyn TxQueue,
    rx: &'a mut Counter,
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
        // Waits longer than two naps are slept (all but one nap), not spun: a sender
        // spinning at a real-time priority would be throttled by the kernel (RT tasks
        // get 95% of a CPU by default) and stall 50 ms in every second.
        let nap = (25e-6 * hz) as u64;
        // A paced sender sends at least 100 us worth of packets per call (up to a burst):
        // one packet per system call would cap it far below its flat-out rate.
        let min_burst = rate.map_or(1, |r| ((r * 100e-6) as u64).clamp(1, b as u64));
        // While waiting, the receiver is polled every 20 us (not on every spin: its
        // queue reads the kernel's drop counter every few hundred polls).
        let poll_every = (20e-6 * hz) as u64;
        let mut polled = start;
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
                    if due < min_burst {
                        if now.wrapping_sub(polled) > poll_every {
                            polled = now;
                            if self.rx.poll() > 0 {
                                continue;
                            }
                        }
                        let at = start + ((sched + min_burst - 1) as f64 * c) as u64;
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
            self.rx.poll();
        }
        let secs = (tsc::rdtsc() - start) as f64 / hz;
        (sent, secs, behind)
    }
}

/// Runs one trial's traffic on `tx`, counting what `rx` receives: probes
/// (one per millisecond) until `ready` says the path carries them, then the
/// learning phase and the measured phase at `plan.rate_pps`, then the drain
/// (until every measured frame is counted, `plan.drain` at most). Stops early
/// when `abort` is raised.
#[allow(clippy::too_many_arguments)]
pub fn send(
    tx: &mut dyn TxQueue,
    pool: &mut PacketPool,
    batch: &mut Batch,
    frames: &Frames,
    plan: &SendPlan,
    rx: &mut Counter,
    ready: &dyn Fn(&Counter) -> bool,
    abort: &AtomicBool,
) -> Result<SendResult, PortError> {
    if frames.is_empty() {
        return Err(PortError::Spec("the sender has no frames to send".to_string()));
    }
    let b = plan.batch.clamp(1, MAX_BATCH);
    let mut t = Tx { tx, rx, pool, batch, frames, next: 0, seq: 0, short: 0 };
    let mut r = SendResult::default();
    let t0 = Instant::now();
    loop {
        t.rx.poll();
        if ready(t.rx) {
            break;
        }
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
    let t1 = Instant::now();
    while t1.elapsed() < Duration::from_millis(20) {
        t.rx.poll();
        std::thread::sleep(Duration::from_millis(1));
    }
    let (w, _, b1) = t.phase(PHASE_WARMUP, plan.rate_pps, plan.warmup, b, abort);
    let (s, secs, b2) = t.phase(PHASE_MEASURE, plan.rate_pps, plan.measure, b, abort);
    // Drain: until every measured frame is counted or `plan.drain` has passed.
    let t2 = Instant::now();
    while t.rx.get(PHASE_MEASURE) < s && t2.elapsed() < plan.drain {
        if t.rx.poll() == 0 {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
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
        assert_eq!(p.port, PortSpec::parse("afpacket:v0").unwrap());
        assert_eq!(p.netns.as_deref(), Some("fpA1"));
        assert_eq!(p.to_string(), "afpacket:v0@fpA1");
        let p = PeerSpec::parse("afxdp:v0:1").unwrap();
        assert_eq!((p.port, p.netns), (PortSpec::parse("afxdp:v0:1").unwrap(), None));
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

    type Wire = std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<Vec<u8>>>>;

    /// A transmit queue that keeps what it was given (up to `room` per call) and puts it on `wire`.
    struct Keep {
        got: Vec<(u8, u32)>,
        room: usize,
        wire: Wire,
    }

    impl TxQueue for Keep {
        fn tx_batch(&mut self, batch: &Batch, port: Verdict) -> (u64, u64, u64) {
            let mut n = 0;
            for i in 0..batch.len() {
                if batch.verdicts()[i] == port && n < self.room {
                    self.got.push(read_stamp(batch.data(i)).unwrap());
                    self.wire.lock().unwrap().push_back(batch.data(i).to_vec());
                    n += 1;
                }
            }
            (n as u64, 0, (batch.len() - n) as u64)
        }
    }

    /// The far end of `wire`: every frame arrives, unless it is a measured one with a sequence number in `lose`.
    struct Far {
        wire: Wire,
        lose: std::ops::Range<u32>,
    }

    impl RxQueue for Far {
        fn rx_burst(&mut self, pool: &mut PacketPool, batch: &mut Batch, max: usize) -> usize {
            let mut n = 0;
            let mut w = self.wire.lock().unwrap();
            while n < max.min(batch.room()) {
                let Some(f) = w.pop_front() else { break };
                if read_stamp(&f).is_some_and(|(p, s)| p == PHASE_MEASURE && self.lose.contains(&s)) {
                    continue;
                }
                assert!(batch.push_copy(pool, &f, 0));
                n += 1;
            }
            n
        }
    }

    fn rig(room: usize, lose: std::ops::Range<u32>) -> (Keep, Counter) {
        let wire = Wire::default();
        let pool = PacketPool::new(PoolConfig { buffers: 256, ..PoolConfig::default() }).unwrap();
        (Keep { got: Vec::new(), room, wire: wire.clone() }, Counter::new(Box::new(Far { wire, lose }), pool))
    }

    #[test]
    fn paced_sender_sends_at_the_rate_in_phases_and_the_counter_counts_them() {
        let mut frames = Frames::new();
        for l in [60usize, 100, 200] {
            assert!(frames.push(&vec![0xab; l], 2048));
        }
        assert!(!frames.push(&[1; 2045], 2048));
        let mut pool = PacketPool::new(PoolConfig { buffers: 256, ..PoolConfig::default() }).unwrap();
        let mut batch = Batch::new(&pool);
        let (mut q, mut c) = rig(usize::MAX, 0..0);
        let plan = SendPlan {
            rate_pps: Some(20_000.0),
            warmup: Duration::from_millis(50),
            measure: Duration::from_millis(200),
            batch: 16,
            probe_timeout: Duration::from_secs(1),
            drain: Duration::from_millis(100),
        };
        let probes = std::cell::Cell::new(0);
        let ready = |_: &Counter| {
            probes.set(probes.get() + 1);
            probes.get() > 3
        };
        let r = send(&mut q, &mut pool, &mut batch, &frames, &plan, &mut c, &ready, &AtomicBool::new(false)).unwrap();
        assert_eq!(r.probes, 3);
        let rate = r.sent as f64 / r.measured_s;
        // Never above the rate; below it only when the thread was kept off the CPU (a loaded machine), and then said.
        assert!(rate < 22_000.0 && (rate > 18_000.0 || r.behind > 0), "rate {rate} ({r:?})");
        assert_eq!(q.got.iter().filter(|g| g.0 == PHASE_PROBE).count(), 3);
        assert_eq!(q.got.iter().filter(|g| g.0 == PHASE_WARMUP).count() as u64, r.warmup_sent);
        assert_eq!(q.got.iter().filter(|g| g.0 == PHASE_MEASURE).count() as u64, r.sent);
        assert!(q.got.windows(2).all(|w| w[1].1 == w[0].1 + 1), "sequence numbers follow each other");
        assert_eq!((c.get(PHASE_PROBE), c.get(PHASE_WARMUP), c.get(PHASE_MEASURE)), (3, r.warmup_sent, r.sent));
        assert_eq!((c.other(), c.reordered()), (0, 0));
        assert_eq!(pool.stats().free, 256, "every buffer back");
        // A path that never answers is a one-line error.
        let e = send(
            &mut q,
            &mut pool,
            &mut batch,
            &frames,
            &SendPlan { probe_timeout: Duration::from_millis(20), ..plan },
            &mut c,
            &|_: &Counter| false,
            &AtomicBool::new(false),
        );
        assert!(e.is_err());
    }

    #[test]
    fn lost_frames_are_missing_from_the_count_and_a_full_queue_is_a_shortfall() {
        let mut frames = Frames::new();
        frames.push(&[0; 60], 2048);
        let mut pool = PacketPool::new(PoolConfig { buffers: 256, ..PoolConfig::default() }).unwrap();
        let mut batch = Batch::new(&pool);
        // One frame per call goes; measured frames 100..150 (by sequence number) are lost on the way.
        let (mut q, mut c) = rig(1, 100..150);
        let plan = SendPlan {
            rate_pps: None,
            warmup: Duration::from_millis(10),
            measure: Duration::from_millis(30),
            batch: 32,
            probe_timeout: Duration::from_secs(1),
            drain: Duration::from_millis(100),
        };
        let r =
            send(&mut q, &mut pool, &mut batch, &frames, &plan, &mut c, &|_: &Counter| true, &AtomicBool::new(false))
                .unwrap();
        assert!(r.sent > 0 && r.short_sends > 0, "{r:?}");
        let m: Vec<u32> = q.got.iter().filter(|g| g.0 == PHASE_MEASURE).map(|g| g.1).collect();
        assert_eq!(m.len() as u64, r.sent);
        let lost = m.iter().filter(|s| (100..150).contains(*s)).count() as u64;
        assert_eq!(c.get(PHASE_MEASURE), r.sent - lost);
    }
}
