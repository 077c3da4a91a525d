//! In-memory replay: the benchmark source.
//!
//! A trace is preloaded once into per-queue arenas of cache lines: each
//! packet takes `ceil(len / 64)` lines (so 8M 64-byte packets need 512 MiB of
//! arena plus 10 bytes of index per packet, not 2 KiB each). The queue a
//! packet lands in and its RSS hash are decided at load time by the caller's
//! RSS stage, exactly as a NIC would deliver them. Every receive copies the
//! packet into a recycled pool buffer (the NIC's DMA), so NFs that rewrite
//! packets see pristine input on every loop; that copy is part of the I/O
//! baseline.
//!
//! Time: each packet keeps its capture (or generation) timestamp, as ns
//! after the trace's first packet; received packets carry it as their
//! packet time (`Batch::timestamps`), so NFs see the time the capture meant
//! whether the replay runs at full speed or paced. Loop k of the trace is
//! shifted by k times the trace's span (plus one mean gap), so time keeps
//! moving forward.

use std::fmt;
use std::sync::Arc;

use flowplane_packet::{Batch, Line, PacketPool, RxTimes};

use crate::{Rx, Source};

/// Packets ahead whose arena line the receive loop prefetches: about one
/// DRAM latency of receive work, so it spans bursts.
const RX_PREFETCH_AHEAD: usize = 96;

/// Longest frame the replay accepts (jumbo frames included).
pub const MAX_FRAME: usize = 9216;

/// Why a frame could not be loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplayError {
    /// Zero-length frame.
    Empty,
    /// Longer than [`MAX_FRAME`].
    TooLong(usize),
    /// Queue index out of range.
    BadQueue(usize),
    /// Arena larger than the 2^32-line index can address.
    ArenaFull,
}

impl fmt::Display for ReplayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplayError::Empty => write!(f, "empty frame"),
            ReplayError::TooLong(n) => write!(f, "frame of {n} bytes exceeds the {MAX_FRAME}-byte limit"),
            ReplayError::BadQueue(q) => write!(f, "queue {q} out of range"),
            ReplayError::ArenaFull => write!(f, "trace too large for the replay arena"),
        }
    }
}

impl std::error::Error for ReplayError {}

/// One queue's packets, struct-of-arrays.
#[derive(Default)]
pub(crate) struct QueueData {
    pub(crate) lines: Vec<Line>,
    pub(crate) first_line: Vec<u32>,
    pub(crate) len: Vec<u16>,
    pub(crate) hash: Vec<u32>,
    /// Steering key per packet (RETA entry or flow-director rule) for the
    /// run-time NIC ([`crate::nic`]); empty for a trace split at load.
    pub(crate) keys: Vec<u16>,
    /// Packet time: ns after the trace's first packet (empty when `ts_step` says it).
    ts: Vec<u64>,
    /// Packet k's time is `k * step` (an evenly spaced queue, e.g. a generated
    /// trace on one queue): no per-packet time to stream from memory.
    ts_step: Option<u64>,
    bytes: u64,
}

impl QueueData {
    pub(crate) fn packets(&self) -> usize {
        self.len.len()
    }

    /// Packet `i`'s time (ns after the trace's first packet).
    #[inline(always)]
    pub(crate) fn ts_at(&self, i: usize) -> u64 {
        match self.ts_step {
            Some(step) => i as u64 * step,
            None => self.ts[i],
        }
    }

    /// Times of packets `k0..k0 + n`, each plus `shift`, as the receive burst's rule.
    #[inline]
    pub(crate) fn times(&self, k0: usize, n: usize, shift: u64) -> RxTimes<'_> {
        match self.ts_step {
            Some(step) => RxTimes::Even { first: shift.saturating_add(k0 as u64 * step), step },
            None => RxTimes::Shifted { shift, ts: self.ts.get(k0..k0 + n).unwrap_or(&[]) },
        }
    }

    /// Packets `idx` of this queue, copied contiguously in that order with
    /// their times (a NIC queue's own descriptor memory: one core streams
    /// its packets without touching the others' lines). No steering keys.
    /// None if the copy would not fit the arena's 32-bit line index.
    pub(crate) fn gather(&self, idx: &[u32]) -> Option<QueueData> {
        let mut q = QueueData::default();
        let lines: usize = idx.iter().map(|&i| Line::count_for(self.len[i as usize] as usize)).sum();
        if lines > u32::MAX as usize {
            return None;
        }
        q.lines.reserve_exact(lines);
        // Transparent hugepages for the copy, asked before it is written: each
        // core streams its own copy, and on 4 KiB pages a 2-core replay of 4M
        // packets ran 2-3% slower (2026-11-25, `run --cores 2`, alternated).
        flowplane_table::huge::advise_hugepages(q.lines.spare_capacity_mut());
        q.first_line.reserve_exact(idx.len());
        q.len.reserve_exact(idx.len());
        q.hash.reserve_exact(idx.len());
        q.ts.reserve_exact(idx.len());
        for &i in idx {
            let i = i as usize;
            let (first, n) = (self.first_line[i] as usize, Line::count_for(self.len[i] as usize));
            q.first_line.push(q.lines.len() as u32);
            q.lines.extend_from_slice(&self.lines[first..first + n]);
            q.len.push(self.len[i]);
            q.hash.push(self.hash[i]);
            q.ts.push(self.ts_at(i));
            q.bytes += u64::from(self.len[i]);
        }
        Some(q)
    }
}

/// Accumulates frames, then freezes them into a [`ReplayTrace`].
pub struct ReplayBuilder {
    queues: Vec<QueueData>,
    /// Absolute time (ns) of the first packet pushed.
    base_ns: Option<u64>,
    /// Latest packet time pushed, relative to `base_ns`.
    last_ns: u64,
    packets: u64,
}

impl ReplayBuilder {
    /// A builder for `queues` queues (at least one).
    pub fn new(queues: usize) -> Self {
        ReplayBuilder {
            queues: (0..queues.max(1)).map(|_| QueueData::default()).collect(),
            base_ns: None,
            last_ns: 0,
            packets: 0,
        }
    }

    /// Reserves room for `packets` frames of about `avg_len` bytes in total,
    /// spread evenly over the queues, so loading does not double-copy.
    pub fn reserve(&mut self, packets: usize, avg_len: usize) {
        let n = self.queues.len();
        let per_q = packets / n + 1;
        for q in &mut self.queues {
            q.lines.reserve(per_q * Line::count_for(avg_len.max(1)));
            q.first_line.reserve(per_q);
            q.len.reserve(per_q);
            q.hash.reserve(per_q);
            q.keys.reserve(per_q);
            q.ts.reserve(per_q);
        }
    }

    /// Appends `frame` to `queue` with its flow hash and its timestamp
    /// (absolute ns; a time before the trace's first packet counts as that
    /// first packet's time).
    pub fn push(&mut self, queue: usize, frame: &[u8], hash: u32, ts_ns: u64) -> Result<(), ReplayError> {
        self.push_inner(queue, frame, hash, ts_ns, None)
    }

    /// Appends `frame` to the single stream of a steered trace (build it
    /// with one queue) with its steering key: the run-time NIC
    /// ([`crate::nic::NicQueue`]) picks its queue when it is received.
    pub fn push_steered(&mut self, frame: &[u8], hash: u32, ts_ns: u64, key: u16) -> Result<(), ReplayError> {
        self.push_inner(0, frame, hash, ts_ns, Some(key))
    }

    fn push_inner(
        &mut self,
        queue: usize,
        frame: &[u8],
        hash: u32,
        ts_ns: u64,
        key: Option<u16>,
    ) -> Result<(), ReplayError> {
        if frame.is_empty() {
            return Err(ReplayError::Empty);
        }
        if frame.len() > MAX_FRAME {
            return Err(ReplayError::TooLong(frame.len()));
        }
        let nq = self.queues.len();
        let q = self.queues.get_mut(queue).ok_or(ReplayError::BadQueue(queue))?;
        let first = u32::try_from(q.lines.len()).map_err(|_| ReplayError::ArenaFull)?;
        if nq == 0 || q.lines.len() + Line::count_for(frame.len()) > u32::MAX as usize {
            return Err(ReplayError::ArenaFull);
        }
        for chunk in frame.chunks(64) {
            let mut l = Line::ZERO;
            l.0[..chunk.len()].copy_from_slice(chunk);
            q.lines.push(l);
        }
        q.first_line.push(first);
        q.len.push(frame.len() as u16);
        if let Some(k) = key {
            q.keys.push(k);
        }
        q.hash.push(hash);
        let rel = ts_ns.saturating_sub(*self.base_ns.get_or_insert(ts_ns));
        q.ts.push(rel);
        q.bytes += frame.len() as u64;
        self.last_ns = self.last_ns.max(rel);
        self.packets += 1;
        Ok(())
    }

    /// Freezes the trace; it can then be shared by every worker.
    pub fn build(mut self) -> Arc<ReplayTrace> {
        for q in &mut self.queues {
            q.lines.shrink_to_fit();
            q.first_line.shrink_to_fit();
            q.len.shrink_to_fit();
            q.hash.shrink_to_fit();
            q.keys.shrink_to_fit();
            // The replay is memory-bound: spare the 8 bytes per packet when the times are a formula.
            let step = if q.ts.len() > 1 { q.ts[1] - q.ts[0] } else { 0 };
            if q.ts.first() == Some(&0) && q.ts.iter().enumerate().all(|(k, &t)| t == k as u64 * step) {
                q.ts_step = Some(step);
                q.ts = Vec::new();
            }
            q.ts.shrink_to_fit();
        }
        // A loop lasts the span plus one mean gap, so loop k+1's first packet
        // follows loop k's last one at the trace's own rate.
        let gap = if self.packets > 1 { self.last_ns / (self.packets - 1) } else { 0 };
        let loop_ns = (self.last_ns + gap).max(1);
        Arc::new(ReplayTrace { queues: self.queues, base_ns: self.base_ns.unwrap_or(0), loop_ns })
    }
}

/// A preloaded, immutable trace split into queues.
pub struct ReplayTrace {
    /// Absolute time (ns since the Unix epoch for captures) of the first packet.
    base_ns: u64,
    /// How far packet time advances per loop over the trace.
    pub(crate) loop_ns: u64,
    pub(crate) queues: Vec<QueueData>,
}

impl ReplayTrace {
    /// Absolute time (ns) of the trace's first packet: packet time 0.
    pub fn base_ns(&self) -> u64 {
        self.base_ns
    }

    /// Packet time a loop over the trace spans (ns).
    pub fn loop_ns(&self) -> u64 {
        self.loop_ns
    }

    /// Number of queues.
    pub fn queues(&self) -> usize {
        self.queues.len()
    }

    /// True for a single stream with a steering key per packet (loaded with
    /// [`ReplayBuilder::push_steered`]): queues are picked at receive.
    pub fn is_steered(&self) -> bool {
        self.queues.len() == 1 && self.queues[0].keys.len() == self.queues[0].len.len()
    }

    /// Packets in queue `q` (0 if out of range).
    pub fn queue_packets(&self, q: usize) -> usize {
        self.queues.get(q).map_or(0, |d| d.len.len())
    }

    /// Packets in all queues.
    pub fn packets(&self) -> usize {
        self.queues.iter().map(|q| q.len.len()).sum()
    }

    /// Frame bytes in all queues.
    pub fn bytes(&self) -> u64 {
        self.queues.iter().map(|q| q.bytes).sum()
    }

    /// Memory held by the arenas and indices.
    pub fn memory_bytes(&self) -> usize {
        self.queues
            .iter()
            .map(|q| q.lines.capacity() * 64 + q.len.len() * (4 + 2 + 4) + q.ts.len() * 8 + q.keys.len() * 2)
            .sum()
    }

    /// Copies frame `i` of queue `q` into `out` (any length).
    pub fn copy_frame(&self, q: usize, i: usize, out: &mut Vec<u8>) -> bool {
        let Some(d) = self.queues.get(q) else { return false };
        let Some(&first) = d.first_line.get(i) else { return false };
        let len = d.len[i] as usize;
        out.clear();
        for l in &d.lines[first as usize..first as usize + Line::count_for(len)] {
            out.extend_from_slice(&l.0);
        }
        out.truncate(len);
        true
    }
}

/// How a replay queue runs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ReplayConfig {
    /// Stop after this many passes over the queue (None: endless).
    pub loops: Option<u64>,
    /// Stop after this many packets from this queue (None: no limit).
    pub max_packets: Option<u64>,
    /// Offer the whole trace (all queues) at this many packets per second
    /// (None: full speed). Pacing follows the trace's timestamps scaled to
    /// that rate, so every queue keeps its share and its timing whatever the
    /// split; a trace whose packets all have one timestamp is paced by count,
    /// each queue at its share of the rate.
    pub rate_pps: Option<f64>,
    /// TSC ticks per second (needed for pacing).
    pub tsc_hz: f64,
}

/// Per-queue receive counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplayCounters {
    /// Packets delivered.
    pub packets: u64,
    /// Bytes delivered.
    pub bytes: u64,
    /// Completed passes over the queue.
    pub loops: u64,
    /// Packets not delivered because the pool was empty (counted, retried next burst).
    pub pool_empty: u64,
}

/// One queue of a replay trace: the per-core source.
pub struct ReplayQueue {
    trace: Arc<ReplayTrace>,
    q: usize,
    pos: usize,
    cfg: ReplayConfig,
    start_tsc: Option<u64>,
    counters: ReplayCounters,
}

impl ReplayQueue {
    /// A source over queue `q` of `trace`.
    pub fn new(trace: Arc<ReplayTrace>, q: usize, cfg: ReplayConfig) -> Self {
        ReplayQueue { trace, q, pos: 0, cfg, start_tsc: None, counters: ReplayCounters::default() }
    }

    /// Counters so far.
    pub fn counters(&self) -> ReplayCounters {
        self.counters
    }

    fn budget(&mut self, max: usize, now: u64) -> usize {
        let mut n = max;
        if let Some(limit) = self.cfg.max_packets {
            n = n.min(limit.saturating_sub(self.counters.packets) as usize);
        }
        if let Some(rate) = self.cfg.rate_pps {
            let start = *self.start_tsc.get_or_insert(now);
            let elapsed = now.saturating_sub(start) as f64 / self.cfg.tsc_hz.max(1.0);
            let total = self.trace.packets().max(1) as f64;
            let loop_s = self.trace.loop_ns as f64 / 1e9;
            let d = &self.trace.queues[self.q];
            if self.trace.loop_ns > 1 && d.packets() > 0 {
                // Trace time due now: the trace runs at `total / loop_s` packets/s natively.
                let due_ns = (elapsed * rate * loop_s / total * 1e9) as u64;
                let (mut k, mut pos, mut loops) = (0, self.pos, self.counters.loops);
                while k < n && loops.saturating_mul(self.trace.loop_ns).saturating_add(d.ts_at(pos)) <= due_ns {
                    k += 1;
                    pos += 1;
                    if pos == d.packets() {
                        pos = 0;
                        loops += 1;
                    }
                }
                n = k;
            } else {
                let share = rate * d.packets() as f64 / total;
                let due = (elapsed * share) as u64 + 1;
                n = n.min(due.saturating_sub(self.counters.packets) as usize);
            }
        }
        n
    }
}

impl Source for ReplayQueue {
    #[inline]
    fn rx_burst(&mut self, pool: &mut PacketPool, batch: &mut Batch, max: usize, now: u64) -> Rx {
        let total = self.trace.queue_packets(self.q);
        if total == 0
            || self.cfg.loops.is_some_and(|l| self.counters.loops >= l)
            || self.cfg.max_packets.is_some_and(|m| self.counters.packets >= m)
        {
            return Rx::Done;
        }
        let want = self.budget(max.min(batch.room()), now);
        // Disjoint field borrows: the trace is read while pos/counters change.
        let d = &self.trace.queues[self.q];
        let mut got = 0;
        let mut bytes = 0u64;
        while got < want {
            // One bulk receive per contiguous run (no wrap inside a chunk).
            let pos = self.pos;
            let chunk = (want - got).min(total - pos);
            let (lines, first_line, len, hash) = (&d.lines, &d.first_line[pos..], &d.len[pos..], &d.hash[pos..]);
            // Packet time: the capture's, shifted by the loops already done.
            let shift = self.counters.loops.saturating_mul(self.trace.loop_ns);
            let n = batch.rx_burst_lines_timed(pool, chunk, d.times(pos, chunk, shift), |k| {
                // Under the DRAM pressure of large flow tables the hardware
                // prefetcher loses the replay stream: fetch a few packets ahead.
                if let Some(&ahead) = first_line.get(k + RX_PREFETCH_AHEAD) {
                    if let Some(l) = lines.get(ahead as usize) {
                        flowplane_packet::prefetch::read(l);
                    }
                }
                let first = first_line[k] as usize;
                let l = len[k];
                bytes += l as u64;
                (&lines[first..first + Line::count_for(l as usize)], l, hash[k])
            });
            got += n;
            self.pos += n;
            if self.pos == total {
                self.pos = 0;
                self.counters.loops += 1;
                if self.cfg.loops.is_some_and(|l| self.counters.loops >= l) {
                    break;
                }
            }
            if n < chunk {
                self.counters.pool_empty += 1;
                break;
            }
        }
        self.counters.packets += got as u64;
        self.counters.bytes += bytes;
        if got > 0 {
            Rx::Packets(got)
        } else {
            Rx::Idle
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowplane_packet::PoolConfig;

    fn trace() -> Arc<ReplayTrace> {
        let mut b = ReplayBuilder::new(2);
        for i in 0..10u8 {
            let frame = vec![i; 60 + i as usize * 10];
            b.push((i % 2) as usize, &frame, i as u32, 1000 * i as u64).unwrap();
        }
        b.build()
    }

    #[test]
    fn builder_rejects_bad_frames() {
        let mut b = ReplayBuilder::new(1);
        assert_eq!(b.push(0, &[], 0, 0), Err(ReplayError::Empty));
        assert_eq!(b.push(0, &vec![0; MAX_FRAME + 1], 0, 0), Err(ReplayError::TooLong(MAX_FRAME + 1)));
        assert_eq!(b.push(3, &[1], 0, 0), Err(ReplayError::BadQueue(3)));
    }

    #[test]
    fn compact_memory() {
        let mut b = ReplayBuilder::new(1);
        for _ in 0..10_000 {
            b.push(0, &[0u8; 64], 0, 0).unwrap();
        }
        let t = b.build();
        assert_eq!(t.packets(), 10_000);
        // one line per 64-byte frame plus 10 bytes of index
        assert!(t.memory_bytes() <= 10_000 * 74 + 4096, "{}", t.memory_bytes());
    }

    #[test]
    fn replays_in_order_and_loops() {
        let t = trace();
        assert_eq!(t.queue_packets(0), 5);
        let mut pool = PacketPool::new(PoolConfig { buffers: 64, ..Default::default() }).unwrap();
        let mut batch = Batch::new(&pool);
        let mut q = ReplayQueue::new(t.clone(), 1, ReplayConfig { loops: Some(2), ..Default::default() });
        assert_eq!(q.rx_burst(&mut pool, &mut batch, 32, 0), Rx::Packets(10));
        let firsts: Vec<u8> = (0..10).map(|i| batch.data(i)[0]).collect();
        assert_eq!(firsts, vec![1, 3, 5, 7, 9, 1, 3, 5, 7, 9]);
        assert_eq!(batch.data(1).len(), 90);
        assert_eq!(batch.rss_hashes()[..5], [1, 3, 5, 7, 9]);
        assert_eq!(q.rx_burst(&mut pool, &mut batch, 32, 0), Rx::Done);
        assert_eq!(q.counters().loops, 2);
        let mut v = Vec::new();
        assert!(t.copy_frame(1, 4, &mut v));
        assert_eq!(v, vec![9u8; 150]);
        batch.free_all(&mut pool).unwrap();
    }

    #[test]
    fn rewrites_do_not_leak_into_the_trace() {
        let t = trace();
        let mut pool = PacketPool::new(PoolConfig { buffers: 8, ..Default::default() }).unwrap();
        let mut batch = Batch::new(&pool);
        let mut q = ReplayQueue::new(t, 0, ReplayConfig::default());
        for _ in 0..3 {
            assert_eq!(q.rx_burst(&mut pool, &mut batch, 5, 0), Rx::Packets(5));
            assert_eq!(batch.data(0)[0], 0, "pristine on every loop");
            batch.data_mut(0).fill(0xff);
            batch.free_all(&mut pool).unwrap();
        }
    }

    #[test]
    fn packet_limit_and_pool_exhaustion() {
        let t = trace();
        let mut pool = PacketPool::new(PoolConfig { buffers: 3, ..Default::default() }).unwrap();
        let mut batch = Batch::new(&pool);
        let mut q = ReplayQueue::new(t, 0, ReplayConfig { max_packets: Some(7), ..Default::default() });
        assert_eq!(q.rx_burst(&mut pool, &mut batch, 32, 0), Rx::Packets(3));
        assert_eq!(q.counters().pool_empty, 1);
        batch.free_all(&mut pool).unwrap();
        assert_eq!(q.rx_burst(&mut pool, &mut batch, 32, 0), Rx::Packets(3));
        batch.free_all(&mut pool).unwrap();
        assert_eq!(q.rx_burst(&mut pool, &mut batch, 32, 0), Rx::Packets(1));
        batch.free_all(&mut pool).unwrap();
        assert_eq!(q.rx_burst(&mut pool, &mut batch, 32, 0), Rx::Done);
    }

    #[test]
    fn pacing_limits_rate() {
        let t = trace();
        let mut pool = PacketPool::new(PoolConfig { buffers: 64, ..Default::default() }).unwrap();
        let mut batch = Batch::new(&pool);
        // The whole trace (10 packets, 1 us apart, half of them on queue 0)
        // offered at 1000 pps with a fake 1 MHz clock: after 5 ms (5000
        // ticks) 5 of the trace's packets are due, 3 of them queue 0's
        // (trace times 0, 2, 4 us scaled to 0, 2, 4 ms).
        let mut q = ReplayQueue::new(t, 0, ReplayConfig { rate_pps: Some(1000.0), tsc_hz: 1e6, ..Default::default() });
        assert_eq!(q.rx_burst(&mut pool, &mut batch, 32, 0), Rx::Packets(1));
        assert_eq!(q.rx_burst(&mut pool, &mut batch, 32, 10), Rx::Idle);
        assert_eq!(q.rx_burst(&mut pool, &mut batch, 32, 5000), Rx::Packets(2));
        // Packet time: the trace's own, whatever the pacing.
        assert_eq!(batch.timestamps(), &[0, 2000, 4000]);
        batch.free_all(&mut pool).unwrap();
    }

    #[test]
    fn loops_shift_packet_time_and_equal_stamps_pace_by_count() {
        let mut b = ReplayBuilder::new(1);
        for i in 0..4u64 {
            b.push(0, &[i as u8; 60], 0, 5_000 + 100 * i).unwrap();
        }
        let t = b.build();
        assert_eq!((t.base_ns(), t.loop_ns()), (5_000, 400));
        let mut pool = PacketPool::new(PoolConfig { buffers: 64, ..Default::default() }).unwrap();
        let mut batch = Batch::new(&pool);
        let mut q = ReplayQueue::new(t, 0, ReplayConfig { loops: Some(2), ..Default::default() });
        assert_eq!(q.rx_burst(&mut pool, &mut batch, 32, 0), Rx::Packets(8));
        assert_eq!(batch.timestamps(), &[0, 100, 200, 300, 400, 500, 600, 700]);
        batch.free_all(&mut pool).unwrap();
        // A trace whose packets share one timestamp is paced by count.
        let mut b = ReplayBuilder::new(1);
        for _ in 0..10 {
            b.push(0, &[0; 60], 0, 7).unwrap();
        }
        let mut q =
            ReplayQueue::new(b.build(), 0, ReplayConfig { rate_pps: Some(1000.0), tsc_hz: 1e6, ..Default::default() });
        assert_eq!(q.rx_burst(&mut pool, &mut batch, 32, 0), Rx::Packets(1));
        assert_eq!(q.rx_burst(&mut pool, &mut batch, 32, 5000), Rx::Packets(5));
        batch.free_all(&mut pool).unwrap();
    }
}
