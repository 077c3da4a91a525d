//! The software dispatcher: steering for ports that cannot steer themselves.
//!
//! A live port spreads flows over its queues with its own hash (the kernel's
//! fanout hash, the device's RSS). Strategies and NFs that need more than
//! that — a round-robin spray (`shared`), flow-director rules (nat's replies
//! by destination port, fw's ICMP errors by the flow they quote), a hash on
//! one address, flowplane's own symmetric Toeplitz table — get it from a
//! dispatcher core, as DPDK's software event dispatcher or the SCR paper's
//! software sequencer: one thread polls every receive queue of the input
//! port, classifies each packet with the run's [`Classifier`] against the
//! live [`Steering`] table, exactly as the emulated NIC does, and hands it to
//! its worker through a lock-free single-producer single-consumer ring.
//!
//! Each worker's ring carries [`Frame`]s: a preallocated buffer, its length,
//! receive time and flow hash. The worker copies the bytes into its own pool
//! (its DMA) and gives the buffer back through a second ring, so the steady
//! state allocates nothing. A packet whose worker's ring is full is dropped
//! and counted against that worker (`rx_ring_full`), as a NIC queue does.
//! The dispatcher's own cycles are counted apart ([`DispatchStats`]).
//!
//! A flow keeps its order: the input port keeps a flow on one of its queues,
//! the dispatcher reads each queue in order, and a flow's key has one owner
//! at a time.
//!
//! Moves (RSS++ on a port): the dispatcher is the port's one wire, its
//! packet count the stream position. It publishes, for every queue, the
//! position it is about to reach before it re-reads the table, as a NIC
//! queue of the emulated NIC does, so a move started by the control loop
//! switches at a position the dispatcher has not passed
//! ([`flowplane_scale::steer::Steering::start_move`]). At the switch point it
//! puts a marker in the old owner's ring behind the key's last packet; the
//! old owner's source reports the move due when it takes the marker
//! ([`Source::take_due`]), and its worker hands the key's state over. The
//! key's later packets go to the new owner tagged with the move; the new
//! owner's source holds them (and what is behind them) until the state is
//! imported. Nothing is lost or reordered; a hold is counted (`stalls`).
//!
//! SCR on a port ([`Dispatcher::with_sequencer`]): the dispatcher core is
//! the SCR paper's software sequencer. Per packet, in arrival order, it
//! stamps the next sequence number and the sequencer's time
//! ([`Stamper`]), writes the packet's history (the last N records, its own
//! last) behind the frame in the same buffer, and sprays round robin. A
//! packet the next worker's ring cannot take is dropped before it is
//! stamped (loss before the sequencer, which SCR does not see: no gap).
//! The worker's source hands the sequence numbers and histories over with
//! each burst ([`Source::scr_side`]), as the emulated NIC's sequencer does;
//! when the dispatcher stops, the last history goes to the [`Sequencer`]
//! so every replica catches up to the stream's end.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use flowplane_packet::{tsc, Batch, PacketPool, MAX_BATCH};
use flowplane_scale::fragsteer::FragSteer;
use flowplane_scale::steer::{Classifier, FlowRule, Move, Steering};
use rtrb::{Consumer, Producer, RingBuffer};

use flowplane_wire::scr::ScrRecord;

use crate::port::{QueueCounters, RxQueue};
use crate::scr::{ScrSide, Sequencer, Stamper};
use crate::{Rx, RxStats, Source};

/// Largest frame a dispatcher buffer holds (a standard MTU frame with VLAN tags and slack).
pub const FRAME_ROOM: usize = 2048;

/// One packet on its way from the dispatcher to a worker, or a hand-over marker.
pub struct Frame {
    buf: Box<[u8]>,
    len: u16,
    hash: u32,
    ts: u64,
    key: u16,
    /// A move whose state must be imported before this packet is delivered (0: none).
    wait: u64,
    /// A marker: every packet of the move's key before its switch point is ahead of it.
    due: Option<Move>,
    /// SCR: the packet's sequence number (its history follows the frame's room in `buf`).
    seq: u64,
}

/// The dispatcher's figures, readable while it runs.
#[derive(Debug, Default)]
pub struct DispatchStats {
    /// Packets received from the input port.
    pub packets: AtomicU64,
    /// Packets handed to a worker.
    pub delivered: AtomicU64,
    /// Packets that could not be classified (not IP, malformed): sent to worker 0, as a NIC's default queue.
    pub unclassified: AtomicU64,
    /// Packets larger than [`FRAME_ROOM`] (dropped).
    pub oversize: AtomicU64,
    /// TSC cycles spent in bursts that received something.
    pub busy_cycles: AtomicU64,
    /// Per worker: packets dropped because the worker's ring was full.
    pub ring_full: Vec<AtomicU64>,
    /// SCR, per worker: packets stamped and then lost on the way to it (injected, `--scr-loss`).
    pub scr_lost: Vec<AtomicU64>,
    /// The dispatcher has stopped: a worker whose ring is empty is done.
    pub closed: AtomicBool,
    /// The input port's receive clock (ns, its timestamps' units) when the dispatcher last
    /// found it idle, plus one: the workers' idle timers read it (0: not yet known).
    pub idle_clock_ns: AtomicU64,
}

/// Marks the dispatcher closed however its loop ends.
struct CloseOnExit(Arc<DispatchStats>);

impl Drop for CloseOnExit {
    fn drop(&mut self) {
        self.0.closed.store(true, Ordering::Release);
    }
}

/// How the dispatcher spreads packets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spread {
    /// By the steering table (RETA and flow-director rules) of the packet's key.
    Table,
    /// Round robin over the workers, by arrival (the `shared` strategy).
    Spray,
}

/// Per worker, the dispatcher's end of its two rings.
struct Lane {
    tx: Producer<Frame>,
    back: Consumer<Box<[u8]>>,
    free: Vec<Box<[u8]>>,
}

/// A move as the dispatcher follows it: switched once its marker is out.
#[derive(Clone, Copy)]
struct Following {
    mv: Move,
    switched: bool,
}

/// Bursts between two publications of the per-key packet counts.
const LOAD_PUBLISH_BURSTS: u64 = 16;

/// The dispatcher: reads every input queue, steers, hands over.
pub struct Dispatcher {
    /// Publish positions and per-key counts, follow moves (a strategy that moves keys).
    moving: bool,
    /// Stream position: packets received so far.
    pos: u64,
    moves: Vec<Following>,
    /// Per worker: packets handed to it, and (moving) per key.
    sent: Vec<u64>,
    counts: Vec<Vec<u64>>,
    bursts: u64,
    /// Per worker: markers not yet in its ring (the ring was full).
    markers: Vec<Vec<Move>>,
    /// Per input queue: the queue, the pool it receives into, a batch over that pool.
    rxs: Vec<(Box<dyn RxQueue>, PacketPool, Box<Batch>)>,
    classifier: Classifier,
    steering: Arc<Steering>,
    owner: Vec<u16>,
    /// Run-time flow rules (slot key, rule) and the RETA's size (keys below it are entries).
    rules: Vec<(u16, FlowRule)>,
    reta_size: usize,
    /// Later fragments go where their first fragment went (`flowplane_scale::fragsteer`).
    frags: FragSteer,
    generation: u64,
    spread: Spread,
    next: usize,
    lanes: Vec<Lane>,
    stats: Arc<DispatchStats>,
    /// SCR: the sequencer's working state (stamping, history).
    stamper: Option<Stamper>,
}

/// A worker's source: the frames the dispatcher steered to it.
pub struct DispatchedSource {
    steering: Arc<Steering>,
    due: std::collections::VecDeque<Move>,
    rx: Consumer<Frame>,
    back: Producer<Box<[u8]>>,
    stats: RxStats,
    shared: Arc<DispatchStats>,
    me: usize,
    counters: Option<Arc<QueueCounters>>,
    /// SCR: the burst's sequence numbers and histories.
    scr: Option<ScrRx>,
}

/// A worker's side arrays under SCR, parallel to its batch (preallocated).
struct ScrRx {
    seqs: Box<[u64]>,
    hist: Box<[ScrRecord]>,
    len: usize,
    history: usize,
    workers: u64,
}

/// Why a dispatcher could not be set up.
#[derive(Debug)]
pub struct DispatchError(pub String);

impl std::fmt::Display for DispatchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DispatchError {}

impl Dispatcher {
    /// A dispatcher over the input queues `rxs`, each with the pool it was
    /// opened into (an AF_XDP queue's UMEM is its pool), for
    /// `steering.queues()` workers with `ring` frames each, and the workers'
    /// sources in worker order.
    pub fn new(
        rxs: Vec<(Box<dyn RxQueue>, PacketPool)>,
        classifier: Classifier,
        steering: Arc<Steering>,
        spread: Spread,
        ring: usize,
    ) -> Result<(Dispatcher, Vec<DispatchedSource>), DispatchError> {
        let workers = steering.queues();
        if workers == 0 || rxs.is_empty() {
            return Err(DispatchError("a dispatcher needs an input queue and a worker".into()));
        }
        if !(2 * MAX_BATCH..=1 << 20).contains(&ring) {
            return Err(DispatchError(format!("dispatcher ring of {ring} frames out of range")));
        }
        let stats = Arc::new(DispatchStats {
            ring_full: (0..workers).map(|_| AtomicU64::new(0)).collect(),
            scr_lost: (0..workers).map(|_| AtomicU64::new(0)).collect(),
            ..DispatchStats::default()
        });
        let mut lanes = Vec::with_capacity(workers);
        let mut sources = Vec::with_capacity(workers);
        for me in 0..workers {
            let (tx, rx) = RingBuffer::new(ring);
            // The return ring holds every buffer of the lane, so giving one back never fails.
            let (back_tx, back) = RingBuffer::new(ring + MAX_BATCH);
            let free = (0..ring + MAX_BATCH).map(|_| vec![0u8; FRAME_ROOM].into_boxed_slice()).collect();
            lanes.push(Lane { tx, back, free });
            sources.push(DispatchedSource {
                steering: Arc::clone(&steering),
                due: std::collections::VecDeque::new(),
                rx,
                back: back_tx,
                stats: RxStats::default(),
                shared: Arc::clone(&stats),
                me,
                counters: None,
                scr: None,
            });
        }
        let rxs = rxs.into_iter().map(|(q, p)| {
            let b = Batch::new(&p);
            (q, p, b)
        });
        let rxs = rxs.collect();
        let owner = steering.owners();
        let generation = steering.generation();
        let keys = steering.keys();
        let d = Dispatcher {
            moving: false,
            pos: 0,
            moves: Vec::new(),
            sent: vec![0; workers],
            counts: vec![vec![0; keys]; workers],
            bursts: 0,
            markers: vec![Vec::new(); workers],
            rules: steering.flow_rules(),
            reta_size: steering.reta_size(),
            frags: FragSteer::new(),
            rxs,
            classifier,
            steering,
            owner,
            generation,
            spread,
            next: 0,
            lanes,
            stats,
            stamper: None,
        };
        Ok((d, sources))
    }

    /// SCR: the dispatcher becomes the sequencer `seq` (streaming:
    /// [`Sequencer::streaming`]) in front of `sources` (this dispatcher's,
    /// in worker order): it stamps every packet and sprays round robin, and
    /// each source hands the sequence numbers and histories over with its
    /// bursts. Needs [`Spread::Spray`] and no moves; before the first poll.
    pub fn with_sequencer<'s>(
        mut self,
        seq: Arc<Sequencer>,
        sources: impl IntoIterator<Item = &'s mut DispatchedSource>,
    ) -> Result<Self, DispatchError> {
        let mut sources: Vec<&mut DispatchedSource> = sources.into_iter().collect();
        if self.spread != Spread::Spray || self.moving || !seq.is_streaming() || sources.len() != self.lanes.len() {
            return Err(DispatchError(
                "an SCR sequencer needs a spraying dispatcher with no moves, a streaming sequencer and its sources"
                    .into(),
            ));
        }
        let n = seq.history();
        // Each buffer holds the frame, then its history (the sequencer's prefix, kept behind the frame here).
        let room = FRAME_ROOM + n * std::mem::size_of::<ScrRecord>();
        for lane in &mut self.lanes {
            for b in &mut lane.free {
                *b = vec![0u8; room].into_boxed_slice();
            }
        }
        let workers = self.lanes.len() as u64;
        for s in sources.iter_mut() {
            s.scr = Some(ScrRx {
                seqs: vec![0; MAX_BATCH].into_boxed_slice(),
                hist: vec![ScrRecord::default(); MAX_BATCH * n].into_boxed_slice(),
                len: 0,
                history: n,
                workers,
            });
        }
        self.stamper = Some(Stamper::new(seq));
        Ok(self)
    }

    /// Follows the table's moves (a strategy that moves keys at run time) and
    /// publishes what its control loop reads: per-queue positions, packets
    /// and per-key counts.
    pub fn with_moves(mut self) -> Self {
        self.moving = true;
        self
    }

    /// The dispatcher's figures (shared with whoever reads them while it runs).
    pub fn stats(&self) -> Arc<DispatchStats> {
        Arc::clone(&self.stats)
    }

    /// Polls until `stop` is raised, then closes the workers' rings: each
    /// worker's source ends once it has taken what was handed to it.
    pub fn run(mut self, stop: &AtomicBool) {
        let _close = CloseOnExit(Arc::clone(&self.stats));
        let mut backoff = crate::cpu::IdleBackoff::default();
        while !stop.load(Ordering::Relaxed) {
            if self.poll() > 0 {
                backoff.busy();
            } else {
                if let Some(ns) = self.rxs.first().and_then(|r| r.0.clock_ns()) {
                    self.stats.idle_clock_ns.store(ns + 1, Ordering::Relaxed);
                }
                backoff.idle();
            }
        }
        // Moves still before their switch point switch now (no packet follows): their old owners hand over.
        if self.moving {
            self.refresh();
            self.switch_due(u64::MAX);
            let t0 = std::time::Instant::now();
            while self.markers.iter().any(|m| !m.is_empty()) && t0.elapsed() < Duration::from_secs(1) {
                Self::reclaim(&mut self.lanes);
                Self::flush(&mut self.lanes, &mut self.markers);
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        // Before the rings close: a worker that finds its ring closed finds the stream's end here.
        if let Some(st) = &self.stamper {
            st.close();
        }
    }

    /// Re-reads the table after a change: owners, and moves not followed yet.
    fn refresh(&mut self) {
        let g = self.steering.generation();
        if g == self.generation {
            return;
        }
        self.generation = g;
        self.owner = self.steering.owners();
        self.rules = self.steering.flow_rules();
        if self.moving {
            for mv in self.steering.moves() {
                if !self.moves.iter().any(|f| f.mv.id == mv.id) {
                    self.moves.push(Following { mv, switched: false });
                }
            }
        }
    }

    /// Switches every followed move whose switch point is at or before `pos`: its marker goes to the old owner.
    fn switch_due(&mut self, pos: u64) {
        for f in self.moves.iter_mut().filter(|f| !f.switched && pos >= f.mv.at) {
            f.switched = true;
            self.markers[f.mv.from as usize].push(f.mv);
        }
    }

    /// One round over the input queues: receives a burst from each and hands
    /// every packet to its worker. Returns the packets received.
    pub fn poll(&mut self) -> usize {
        self.refresh();
        if self.moving {
            self.switch_due(self.pos);
            // A move whose state has arrived needs no tag any more: it leaves the table's active list.
            let st = &self.steering;
            self.moves.retain(|f| {
                let done = f.switched && st.is_ready(f.mv.key, f.mv.id);
                if done {
                    st.retired(f.mv.id);
                }
                !done
            });
        }
        if self.markers.iter().any(|m| !m.is_empty()) {
            Self::reclaim(&mut self.lanes);
            Self::flush(&mut self.lanes, &mut self.markers);
        }
        let t0 = tsc::rdtsc();
        let mut total = 0usize;
        let last = self.lanes.len() - 1;
        let (mut unclassified, mut oversize, mut delivered) = (0u64, 0u64, 0u64);
        for qi in 0..self.rxs.len() {
            let (rxq, pool, batch) = &mut self.rxs[qi];
            let n = rxq.rx_burst_at(pool, batch, MAX_BATCH, t0);
            if n == 0 {
                continue;
            }
            total += n;
            if self.moving {
                // Claim the burst's positions, then re-read the table: a move started from here on switches past them.
                for q in 0..self.lanes.len() {
                    self.steering.publish_claim(q, self.pos + n as u64);
                }
                self.refresh();
            }
            Self::reclaim(&mut self.lanes);
            let (_, pool, batch) = &mut self.rxs[qi];
            for i in 0..batch.len() {
                let p = self.pos;
                self.pos += 1;
                let data = batch.data(i);
                if let Some(st) = self.stamper.as_mut() {
                    // SCR: stamp, attach the history, spray (no classification: every core processes every packet).
                    if data.len() > FRAME_ROOM {
                        oversize += 1;
                        continue;
                    }
                    let w = self.next;
                    let workers = self.lanes.len();
                    let lane = &mut self.lanes[w];
                    if lane.free.is_empty() || lane.tx.slots() == 0 {
                        // Dropped before the sequencer: no sequence number taken, so no gap for the replicas.
                        QueueCounters::add(&self.stats.ring_full[w], 1);
                        continue;
                    }
                    self.next = if w + 1 == workers { 0 } else { w + 1 };
                    let s = st.stamp(data, batch.timestamps()[i]);
                    if st.lost(s) {
                        QueueCounters::add(&self.stats.scr_lost[w], 1);
                        continue;
                    }
                    let hist: &[u8] = bytemuck::cast_slice(st.history());
                    let Some(mut buf) = lane.free.pop() else { continue };
                    buf[..data.len()].copy_from_slice(data);
                    buf[FRAME_ROOM..FRAME_ROOM + hist.len()].copy_from_slice(hist);
                    let ts = batch.timestamps()[i];
                    let frame = Frame { buf, len: data.len() as u16, hash: 0, ts, key: 0, wait: 0, due: None, seq: s };
                    // Room checked above; this core is the ring's only producer.
                    if let Err(rtrb::PushError::Full(f)) = lane.tx.push(frame) {
                        lane.free.push(f.buf);
                        continue;
                    }
                    delivered += 1;
                    self.sent[w] += 1;
                    continue;
                }
                let (key, hash, classified) = match self.classifier.classify(data) {
                    Some((k, h)) => (k, h, true),
                    None => {
                        unclassified += 1;
                        (0, 0, false)
                    }
                };
                // An exact-match rule (Dyssect's offloaded flow) takes the flow out of its RETA entry.
                let mut key = key;
                if !self.rules.is_empty() && (key as usize) < self.reta_size {
                    if let Some((slot, _)) = self.rules.iter().find(|(_, r)| r.entry == key && r.matches_frame(data)) {
                        key = *slot;
                    }
                }
                // A later fragment goes where its datagram's first fragment went (after that one's rules).
                let (key, hash) = if classified { self.frags.follow(data, (key, hash)) } else { (key, hash) };
                let mut w = match self.spread {
                    Spread::Spray => {
                        let w = self.next;
                        self.next = if w + 1 == self.lanes.len() { 0 } else { w + 1 };
                        w
                    }
                    Spread::Table => self.owner.get(key as usize).map_or(0, |&o| o as usize),
                };
                let mut wait = 0;
                if !self.moves.is_empty() {
                    for f in self.moves.iter_mut().filter(|f| f.mv.key == key) {
                        if !f.switched && p >= f.mv.at {
                            f.switched = true;
                            self.markers[f.mv.from as usize].push(f.mv);
                        }
                        if f.switched {
                            wait = f.mv.id;
                        } else {
                            w = f.mv.from as usize;
                        }
                    }
                    if self.markers.iter().any(|m| !m.is_empty()) {
                        Self::flush(&mut self.lanes, &mut self.markers);
                    }
                }
                if data.len() > FRAME_ROOM {
                    oversize += 1;
                    continue;
                }
                let w = w.min(last);
                let lane = &mut self.lanes[w];
                let Some(mut buf) = lane.free.pop() else {
                    QueueCounters::add(&self.stats.ring_full[w], 1);
                    continue;
                };
                buf[..data.len()].copy_from_slice(data);
                let ts = batch.timestamps()[i];
                let frame = Frame { buf, len: data.len() as u16, hash, ts, key, wait, due: None, seq: 0 };
                match lane.tx.push(frame) {
                    Ok(()) => {
                        delivered += 1;
                        self.sent[w] += 1;
                        if self.moving {
                            if let Some(c) = self.counts[w].get_mut(key as usize) {
                                *c += 1;
                            }
                        }
                    }
                    Err(rtrb::PushError::Full(f)) => {
                        lane.free.push(f.buf);
                        QueueCounters::add(&self.stats.ring_full[w], 1);
                    }
                }
            }
            // The batch's buffers go back to the dispatcher's own pool; it never fails on a batch taken from it.
            let _ = batch.free_all(pool);
            if self.moving {
                self.bursts += 1;
                let loads = self.bursts.is_multiple_of(LOAD_PUBLISH_BURSTS);
                for q in 0..self.lanes.len() {
                    self.steering.publish_progress(q, self.pos, self.sent[q]);
                    if loads {
                        self.steering.publish_loads(q, &self.counts[q], self.pos);
                    }
                }
            }
        }
        if total > 0 {
            let s = &self.stats;
            QueueCounters::add(&s.packets, total as u64);
            QueueCounters::add(&s.delivered, delivered);
            QueueCounters::add(&s.unclassified, unclassified);
            QueueCounters::add(&s.oversize, oversize);
            QueueCounters::add(&s.busy_cycles, tsc::rdtsc().wrapping_sub(t0));
        }
        total
    }

    /// Takes back the buffers the workers are done with.
    fn reclaim(lanes: &mut [Lane]) {
        for lane in lanes {
            while let Ok(b) = lane.back.pop() {
                lane.free.push(b);
            }
        }
    }

    /// Puts waiting markers into their rings (each behind everything sent before it).
    fn flush(lanes: &mut [Lane], markers: &mut [Vec<Move>]) {
        for (lane, waiting) in lanes.iter_mut().zip(markers.iter_mut()) {
            while let Some(&mv) = waiting.first() {
                let Some(buf) = lane.free.pop() else { break };
                let f = Frame { buf, len: 0, hash: 0, ts: 0, key: mv.key, wait: 0, due: Some(mv), seq: 0 };
                match lane.tx.push(f) {
                    Ok(()) => {
                        waiting.remove(0);
                    }
                    Err(rtrb::PushError::Full(f)) => {
                        lane.free.push(f.buf);
                        break;
                    }
                }
            }
        }
    }
}

impl DispatchedSource {
    /// Also counts what this worker received on `counters` (the port's per-queue
    /// figures a status line and metrics read).
    pub fn with_counters(mut self, counters: Arc<QueueCounters>) -> Self {
        self.counters = Some(counters);
        self
    }
}

impl Source for DispatchedSource {
    fn clock_ns(&self) -> Option<u64> {
        self.shared.idle_clock_ns.load(Ordering::Relaxed).checked_sub(1)
    }

    fn rx_burst(&mut self, pool: &mut PacketPool, batch: &mut Batch, max: usize, _now: u64) -> Rx {
        // `closed` first: once it reads true every frame pushed is visible, so an empty ring is the end.
        let closed = self.shared.closed.load(Ordering::Acquire);
        let max = max.min(batch.room());
        let (mut got, mut bytes, mut no_buf) = (0usize, 0u64, 0u64);
        let mut stalled = false;
        while got < max {
            let Ok(head) = self.rx.peek() else { break };
            // A moved key's packet waits (and what is behind it) until the key's state is here.
            if head.wait != 0 && !self.steering.is_ready(head.key, head.wait) {
                stalled = true;
                break;
            }
            let Ok(f) = self.rx.pop() else { break };
            if let Some(mv) = f.due {
                // Everything of the key before the switch point was delivered before this marker.
                self.due.push_back(mv);
            } else {
                let len = f.len as usize;
                if batch.push_copy(pool, &f.buf[..len], f.ts) {
                    let i = batch.len() - 1;
                    batch.rss_hashes_mut()[i] = f.hash;
                    if let Some(x) = self.scr.as_mut() {
                        x.put(i, f.seq, &f.buf[FRAME_ROOM..]);
                    }
                    got += 1;
                    bytes += len as u64;
                } else {
                    no_buf += 1;
                }
            }
            // The return ring has room for every buffer of the lane.
            let _ = self.back.push(f.buf);
        }
        if let Some(x) = self.scr.as_mut() {
            x.len = batch.len().min(MAX_BATCH);
        }
        self.stats.packets += got as u64;
        self.stats.bytes += bytes;
        self.stats.pool_empty += no_buf;
        self.stats.stalls += u64::from(stalled && got == 0);
        if let Some(c) = &self.counters {
            QueueCounters::add(&c.rx_pool_empty, no_buf);
        }
        if got > 0 {
            Rx::Packets(got)
        } else if closed && self.rx.is_empty() && self.due.is_empty() {
            Rx::Done
        } else {
            Rx::Idle
        }
    }

    fn rx_stats(&self) -> RxStats {
        RxStats {
            rx_ring_full: self.shared.ring_full.get(self.me).map_or(0, |a| a.load(Ordering::Relaxed)),
            ..self.stats
        }
    }

    fn take_due(&mut self) -> Option<Move> {
        self.due.pop_front()
    }

    fn scr_side(&self) -> Option<ScrSide<'_>> {
        let x = self.scr.as_ref()?;
        Some(ScrSide {
            seqs: &x.seqs[..x.len],
            hist: &x.hist[..x.len * x.history],
            history: x.history,
            // The dispatcher's work is the sequencer's (stamping, history, spraying): its share per worker.
            cycles: self.shared.busy_cycles.load(Ordering::Relaxed) / x.workers,
            monotonic: true,
        })
    }

    fn scr_lost(&self) -> u64 {
        self.shared.scr_lost.get(self.me).map_or(0, |a| a.load(Ordering::Relaxed))
    }
}

impl ScrRx {
    /// Batch packet `i` has sequence number `seq` and the history in `bytes` (N records behind the frame).
    #[inline(always)]
    fn put(&mut self, i: usize, seq: u64, bytes: &[u8]) {
        let n = self.history;
        if let (Some(s), Some(h)) = (self.seqs.get_mut(i), self.hist.get_mut(i * n..(i + 1) * n)) {
            *s = seq;
            let h: &mut [u8] = bytemuck::cast_slice_mut(h);
            h.copy_from_slice(&bytes[..h.len()]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowplane_packet::PoolConfig;
    use flowplane_scale::steer::HashOn;

    /// A queue that yields the given frames once, then nothing.
    struct Frames(Vec<Vec<u8>>);

    impl RxQueue for Frames {
        fn rx_burst(&mut self, pool: &mut PacketPool, batch: &mut Batch, max: usize) -> usize {
            let mut n = 0;
            while n < max.min(32) && !self.0.is_empty() {
                let f = self.0.remove(0);
                assert!(batch.push_copy(pool, &f, n as u64));
                n += 1;
            }
            n
        }
    }

    fn udp(src: [u8; 4], sport: u16) -> Vec<u8> {
        let mut f = vec![0u8; 42];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        f[14] = 0x45;
        f[16..18].copy_from_slice(&28u16.to_be_bytes());
        f[22] = 64;
        f[23] = 17;
        f[26..30].copy_from_slice(&src);
        f[30..34].copy_from_slice(&[10, 9, 9, 9]);
        f[34..36].copy_from_slice(&sport.to_be_bytes());
        f[36..38].copy_from_slice(&53u16.to_be_bytes());
        f[38..40].copy_from_slice(&8u16.to_be_bytes());
        f
    }

    fn setup(frames: Vec<Vec<u8>>, spread: Spread, ring: usize) -> (Dispatcher, Vec<DispatchedSource>, Classifier) {
        let pool = PacketPool::new(PoolConfig { buffers: 1024, ..PoolConfig::default() }).unwrap();
        let c = Classifier::new(128, true, HashOn::FiveTuple, false, Vec::new()).unwrap();
        let st = Arc::new(Steering::new(2, &c, &[]).unwrap());
        let (d, s) = Dispatcher::new(vec![(Box::new(Frames(frames)), pool)], c.clone(), st, spread, ring).unwrap();
        (d, s, c)
    }

    fn drain(s: &mut DispatchedSource) -> Vec<(Vec<u8>, u32)> {
        let mut pool = PacketPool::new(PoolConfig { buffers: 1024, ..PoolConfig::default() }).unwrap();
        let mut b = Batch::new(&pool);
        let mut out = Vec::new();
        while let Rx::Packets(_) = s.rx_burst(&mut pool, &mut b, MAX_BATCH, 0) {
            for i in 0..b.len() {
                out.push((b.data(i).to_vec(), b.rss_hashes()[i]));
            }
            b.free_all(&mut pool).unwrap();
        }
        out
    }

    #[test]
    fn table_spread_sends_each_flow_to_its_owner_in_order() {
        let frames: Vec<Vec<u8>> = (0..200u16).map(|i| udp([10, 0, (i % 7) as u8, 1], 1000 + i % 13)).collect();
        let (mut d, mut srcs, c) = setup(frames.clone(), Spread::Table, 512);
        while d.poll() > 0 {}
        let owners = d.steering.owners();
        let mut all = 0;
        for (w, s) in srcs.iter_mut().enumerate() {
            let got = drain(s);
            for (f, h) in &got {
                let (key, hash) = c.classify(f).unwrap();
                assert_eq!(owners[key as usize] as usize, w, "a flow's packets reach its key's owner");
                assert_eq!(*h, hash, "the flow hash travels with the packet");
            }
            // Per worker, the frames keep the input's order.
            let mine: Vec<&Vec<u8>> =
                frames.iter().filter(|f| owners[c.classify(f).unwrap().0 as usize] as usize == w).collect();
            assert_eq!(got.iter().map(|g| &g.0).collect::<Vec<_>>(), mine);
            all += got.len();
        }
        assert_eq!(all, 200);
        assert_eq!(d.stats().delivered.load(Ordering::Relaxed), 200);
    }

    #[test]
    fn spray_alternates_and_a_full_ring_is_counted_not_blocking() {
        let frames: Vec<Vec<u8>> = (0..1200u16).map(|i| udp([10, 0, 0, 1], i)).collect();
        let (mut d, mut srcs, _) = setup(frames, Spread::Spray, 512);
        while d.poll() > 0 {}
        let st = d.stats();
        let a = drain(&mut srcs[0]).len() as u64;
        let b = drain(&mut srcs[1]).len() as u64;
        let full: u64 = st.ring_full.iter().map(|x| x.load(Ordering::Relaxed)).sum();
        assert_eq!((a, b), (512, 512), "each ring holds 512 frames");
        assert_eq!(a + b + full, 1200, "every packet delivered or counted");
        assert_eq!(srcs[0].rx_stats().rx_ring_full + srcs[1].rx_stats().rx_ring_full, full);
    }

    /// SCR on a port: the dispatcher stamps and sprays; through the
    /// histories every worker sees every record, in order, with the
    /// sequencer's non-decreasing time, and its own packets are the input's
    /// at their sequence numbers. A packet a full ring cannot take is
    /// dropped before it is stamped (no gap), and the last history is left
    /// with the sequencer when the dispatcher stops.
    #[test]
    fn scr_stamps_and_sprays_and_every_worker_sees_every_record_in_order() {
        let frames: Vec<Vec<u8>> = (0..1200u16).map(|i| udp([10, 0, (i % 3) as u8, 1], i)).collect();
        let (d, mut srcs, _) = setup(frames.clone(), Spread::Spray, 512);
        let seq = Arc::new(Sequencer::streaming(3, 0.0, 1));
        let d = d.with_sequencer(Arc::clone(&seq), &mut srcs).unwrap();
        let st = d.stats();
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| d.run(&stop));
            while st.packets.load(Ordering::Relaxed) < 1200 {
                std::thread::yield_now();
            }
            stop.store(true, Ordering::Relaxed);
        });
        // Two rings of 512: 1024 stamped, the rest dropped before the sequencer.
        let full: u64 = st.ring_full.iter().map(|x| x.load(Ordering::Relaxed)).sum();
        assert_eq!(full, 1200 - 1024);
        assert_eq!(seq.end(), Some(1024));
        let want = |k: u64| {
            let f = &frames[(k - 1) as usize];
            ScrRecord::from_frame(f, &flowplane_wire::frame::PktMeta::parse(f))
        };
        let untimed = |mut r: ScrRecord| {
            r.set_ts_ns(0);
            r
        };
        for (w, src) in srcs.iter_mut().enumerate() {
            let mut pool = PacketPool::new(PoolConfig { buffers: 1024, ..PoolConfig::default() }).unwrap();
            let mut b = Batch::new(&pool);
            let (mut own, mut seen) = (Vec::new(), std::collections::BTreeMap::new());
            while let Rx::Packets(_) = src.rx_burst(&mut pool, &mut b, MAX_BATCH, 0) {
                let side = src.scr_side().expect("a sequenced source has side data");
                assert_eq!((side.seqs.len(), side.history), (b.len(), 3));
                for i in 0..b.len() {
                    let k = side.seqs[i];
                    assert_eq!(b.data(i), &frames[(k - 1) as usize][..], "the packet is the input's at its number");
                    own.push(k);
                    for (j, r) in side.hist[i * 3..(i + 1) * 3].iter().enumerate() {
                        if let Some(s) = (k + j as u64).checked_sub(2).filter(|&s| s >= 1) {
                            assert_eq!(*seen.entry(s).or_insert(*r), *r, "one record per sequence number");
                        }
                    }
                }
                b.free_all(&mut pool).unwrap();
            }
            assert_eq!(own, (w as u64 + 1..=1024).step_by(2).collect::<Vec<_>>(), "round robin, in order");
            // Past its last packet, a worker catches up from the history the sequencer kept at the end.
            let mut tail = [ScrRecord::default(); 3];
            seq.fill(1024, &mut tail);
            for (s, r) in (1022..=1024).zip(tail) {
                assert_eq!(*seen.entry(s).or_insert(r), r, "the end's history is the one the packets carried");
            }
            assert_eq!(seen.keys().copied().collect::<Vec<_>>(), (1..=1024).collect::<Vec<_>>());
            assert!(seen.iter().all(|(&k, &r)| untimed(r) == untimed(want(k))), "worker {w}: the input's records");
            assert!(seen.values().zip(seen.values().skip(1)).all(|(a, b)| a.ts_ns() <= b.ts_ns()));
            assert_eq!(src.rx_burst(&mut pool, &mut b, 8, 0), Rx::Done);
            assert_eq!(src.scr_lost(), 0);
        }
    }

    #[test]
    fn scr_needs_a_spraying_dispatcher_and_injected_loss_is_counted_per_worker() {
        let (d, mut srcs, _) = setup(Vec::new(), Spread::Table, 512);
        assert!(d.with_sequencer(Arc::new(Sequencer::streaming(2, 0.0, 1)), &mut srcs).is_err());
        let frames: Vec<Vec<u8>> = (0..400u16).map(|i| udp([10, 0, 0, 1], i)).collect();
        let (d, mut srcs, _) = setup(frames, Spread::Spray, 512);
        let mut d = d.with_sequencer(Arc::new(Sequencer::streaming(2, 0.25, 3)), &mut srcs).unwrap();
        while d.poll() > 0 {}
        let got: usize = srcs.iter_mut().map(|s| drain(s).len()).sum();
        let lost: u64 = srcs.iter().map(|s| s.scr_lost()).sum();
        assert_eq!(got as u64 + lost, 400);
        assert!((60..140).contains(&lost), "{lost}");
    }

    #[test]
    fn garbage_goes_to_worker_zero_and_is_counted() {
        let frames = vec![vec![0xffu8; 3], vec![0u8; 60], udp([1, 2, 3, 4], 5)];
        let (mut d, mut srcs, _) = setup(frames, Spread::Table, 512);
        while d.poll() > 0 {}
        assert_eq!(d.stats().unclassified.load(Ordering::Relaxed), 2);
        let got0 = drain(&mut srcs[0]).len();
        let got1 = drain(&mut srcs[1]).len();
        assert_eq!(got0 + got1, 3);
        assert!(got0 >= 2);
    }

    #[test]
    fn a_stopped_dispatcher_ends_its_workers_after_what_it_handed_over() {
        let frames: Vec<Vec<u8>> = (0..300u16).map(|i| udp([10, 0, 0, 2], i)).collect();
        let (d, mut srcs, _) = setup(frames, Spread::Spray, 512);
        let st = d.stats();
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| d.run(&stop));
            while st.delivered.load(Ordering::Relaxed) < 300 {
                std::thread::yield_now();
            }
            let mut pool = PacketPool::new(PoolConfig::default()).unwrap();
            let mut b = Batch::new(&pool);
            assert!(matches!(srcs[0].rx_burst(&mut pool, &mut b, 8, 0), Rx::Packets(8)), "not done while running");
            b.free_all(&mut pool).unwrap();
            stop.store(true, Ordering::Relaxed);
        });
        assert!(st.closed.load(Ordering::Relaxed));
        let got: usize = srcs.iter_mut().map(|s| drain(s).len()).sum();
        assert_eq!(got + 8, 300, "everything handed over is taken after the stop");
        let mut pool = PacketPool::new(PoolConfig::default()).unwrap();
        let mut b = Batch::new(&pool);
        assert_eq!(srcs[1].rx_burst(&mut pool, &mut b, 8, 0), Rx::Done);
    }

    #[test]
    fn a_moved_key_switches_owner_at_its_switch_point_with_nothing_lost_or_reordered() {
        let frames: Vec<Vec<u8>> = (0..400u16).map(|i| udp([10, 0, (i % 20) as u8, 1], 2000 + i % 20)).collect();
        let (d, mut srcs, c) = setup(frames.clone(), Spread::Table, 512);
        let mut d = d.with_moves();
        assert_eq!(d.poll(), 32);
        let st = Arc::clone(&d.steering);
        let (key, _) = c.classify(&frames[40]).unwrap();
        let from = st.owners()[key as usize];
        let to = 1 - from;
        let mv = st.start_move(key, to).unwrap();
        assert_eq!(mv.at, 32, "the switch point is where the dispatcher stands");
        while d.poll() > 0 {}
        // The new owner delivers up to the key's first moved packet, then holds it until the state arrives.
        let early = drain(&mut srcs[to as usize]);
        assert_eq!(srcs[to as usize].rx_stats().stalls, 1);
        assert!(early.iter().all(|(f, _)| c.classify(f).unwrap().0 != key));
        let old = drain(&mut srcs[from as usize]);
        assert_eq!(srcs[from as usize].take_due(), Some(mv), "the marker comes after the key's last packet");
        assert_eq!(srcs[from as usize].take_due(), None);
        st.imported(mv);
        let late = drain(&mut srcs[to as usize]);
        // Per flow: the old owner's part then the new owner's part is the input's order.
        let of_key = |v: &[(Vec<u8>, u32)]| -> Vec<Vec<u8>> {
            v.iter().filter(|(f, _)| c.classify(f).unwrap().0 == key).map(|(f, _)| f.clone()).collect()
        };
        let mut got = of_key(&old);
        got.extend(of_key(&late));
        let want: Vec<Vec<u8>> = frames.iter().filter(|f| c.classify(f).unwrap().0 == key).cloned().collect();
        assert_eq!(got, want);
        let before: Vec<Vec<u8>> = frames[..32].iter().filter(|f| c.classify(f).unwrap().0 == key).cloned().collect();
        assert_eq!(of_key(&old), before, "the old owner has exactly the key's packets before the switch point");
        assert_eq!(old.len() + early.len() + late.len(), 400);
        // Once the state is in, the dispatcher retires the move: the key may move again.
        d.poll();
        assert_eq!(st.active_moves(), 0);
    }
}
