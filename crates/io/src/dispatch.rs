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
//! (the table is static on a port: strategies that move keys at run time are
//! refused there by the runner).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use flowplane_packet::{tsc, Batch, PacketPool, MAX_BATCH};
use flowplane_scale::steer::{Classifier, Steering};
use rtrb::{Consumer, Producer, RingBuffer};

use crate::port::{QueueCounters, RxQueue};
use crate::{Rx, RxStats, Source};

/// Largest frame a dispatcher buffer holds (a standard MTU frame with VLAN tags and slack).
pub const FRAME_ROOM: usize = 2048;

/// One packet on its way from the dispatcher to a worker.
pub struct Frame {
    buf: Box<[u8]>,
    len: u16,
    hash: u32,
    ts: u64,
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
    /// The dispatcher has stopped: a worker whose ring is empty is done.
    pub closed: AtomicBool,
}

/// Idle polls in a row before the dispatcher naps (an idle port should not burn a shared core).
const IDLE_SPINS: u32 = 2048;

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

/// The dispatcher: reads every input queue, steers, hands over.
pub struct Dispatcher {
    /// Per input queue: the queue, the pool it receives into, a batch over that pool.
    rxs: Vec<(Box<dyn RxQueue>, PacketPool, Box<Batch>)>,
    classifier: Classifier,
    steering: Arc<Steering>,
    owner: Vec<u16>,
    generation: u64,
    spread: Spread,
    next: usize,
    lanes: Vec<Lane>,
    stats: Arc<DispatchStats>,
}

/// A worker's source: the frames the dispatcher steered to it.
pub struct DispatchedSource {
    rx: Consumer<Frame>,
    back: Producer<Box<[u8]>>,
    stats: RxStats,
    shared: Arc<DispatchStats>,
    me: usize,
    counters: Option<Arc<QueueCounters>>,
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
                rx,
                back: back_tx,
                stats: RxStats::default(),
                shared: Arc::clone(&stats),
                me,
                counters: None,
            });
        }
        let rxs = rxs.into_iter().map(|(q, p)| {
            let b = Batch::new(&p);
            (q, p, b)
        });
        let rxs = rxs.collect();
        let owner = steering.owners();
        let generation = steering.generation();
        let d = Dispatcher { rxs, classifier, steering, owner, generation, spread, next: 0, lanes, stats };
        Ok((d, sources))
    }

    /// The dispatcher's figures (shared with whoever reads them while it runs).
    pub fn stats(&self) -> Arc<DispatchStats> {
        Arc::clone(&self.stats)
    }

    /// Polls until `stop` is raised, then closes the workers' rings: each
    /// worker's source ends once it has taken what was handed to it.
    pub fn run(mut self, stop: &AtomicBool) {
        let _close = CloseOnExit(Arc::clone(&self.stats));
        let mut idle = 0u32;
        while !stop.load(Ordering::Relaxed) {
            if self.poll() > 0 {
                idle = 0;
            } else {
                idle += 1;
                if idle >= IDLE_SPINS {
                    std::thread::sleep(Duration::from_micros(50));
                } else {
                    std::hint::spin_loop();
                }
            }
        }
    }

    /// One round over the input queues: receives a burst from each and hands
    /// every packet to its worker. Returns the packets received.
    pub fn poll(&mut self) -> usize {
        if self.steering.generation() != self.generation {
            // A table change (never per packet: the table is static on ports today).
            self.generation = self.steering.generation();
            self.owner = self.steering.owners();
        }
        let t0 = tsc::rdtsc();
        let mut total = 0usize;
        let last = self.lanes.len() - 1;
        let (mut unclassified, mut oversize, mut delivered) = (0u64, 0u64, 0u64);
        for (rxq, pool, batch) in &mut self.rxs {
            let n = rxq.rx_burst_at(pool, batch, MAX_BATCH, t0);
            if n == 0 {
                continue;
            }
            total += n;
            for lane in &mut self.lanes {
                while let Ok(b) = lane.back.pop() {
                    lane.free.push(b);
                }
            }
            for i in 0..batch.len() {
                let data = batch.data(i);
                let (key, hash) = match self.classifier.classify(data) {
                    Some(kh) => kh,
                    None => {
                        unclassified += 1;
                        (0, 0)
                    }
                };
                let w = match self.spread {
                    Spread::Spray => {
                        let w = self.next;
                        self.next = if w + 1 == self.lanes.len() { 0 } else { w + 1 };
                        w
                    }
                    Spread::Table => self.owner.get(key as usize).map_or(0, |&o| o as usize),
                };
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
                let frame = Frame { buf, len: data.len() as u16, hash, ts: batch.timestamps()[i] };
                match lane.tx.push(frame) {
                    Ok(()) => delivered += 1,
                    Err(rtrb::PushError::Full(f)) => {
                        lane.free.push(f.buf);
                        QueueCounters::add(&self.stats.ring_full[w], 1);
                    }
                }
            }
            // The batch's buffers go back to the dispatcher's own pool; it never fails on a batch taken from it.
            let _ = batch.free_all(pool);
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
    fn rx_burst(&mut self, pool: &mut PacketPool, batch: &mut Batch, max: usize, _now: u64) -> Rx {
        // `closed` first: once it reads true every frame pushed is visible, so an empty ring is the end.
        let closed = self.shared.closed.load(Ordering::Acquire);
        let n = max.min(batch.room()).min(self.rx.slots());
        if n == 0 {
            return if closed { Rx::Done } else { Rx::Idle };
        }
        let (mut got, mut bytes, mut no_buf) = (0usize, 0u64, 0u64);
        for _ in 0..n {
            let Ok(f) = self.rx.pop() else { break };
            let len = f.len as usize;
            if batch.push_copy(pool, &f.buf[..len], f.ts) {
                let i = batch.len() - 1;
                batch.rss_hashes_mut()[i] = f.hash;
                got += 1;
                bytes += len as u64;
            } else {
                no_buf += 1;
            }
            // The return ring has room for every buffer of the lane.
            let _ = self.back.push(f.buf);
        }
        self.stats.packets += got as u64;
        self.stats.bytes += bytes;
        self.stats.pool_empty += no_buf;
        if let Some(c) = &self.counters {
            QueueCounters::add(&c.rx_pool_empty, no_buf);
        }
        if got == 0 {
            Rx::Idle
        } else {
            Rx::Packets(got)
        }
    }

    fn rx_stats(&self) -> RxStats {
        RxStats {
            rx_ring_full: self.shared.ring_full.get(self.me).map_or(0, |a| a.load(Ordering::Relaxed)),
            ..self.stats
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
            while n < max && !self.0.is_empty() {
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
}
