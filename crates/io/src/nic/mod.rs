//! The emulated NIC's receive side: one [`NicQueue`] per worker over a
//! steered replay trace (one stream in arrival order, a steering key per
//! packet), steering each packet when it is received by the live table of
//! [`flowplane_scale::steer::Steering`].
//!
//! A queue is a shared part, `Ring` (its bounded descriptor ring, its
//! stream position, counters and the clock every mode paces by), and one
//! delivery `Mode` owning exactly the state that mode needs. A packet
//! that finds the ring full is dropped and counted (`rx_ring_full`), as a
//! NIC does. The NIC's work (walking, steering) is counted apart from the
//! worker's (`nic_cycles`); copying a packet into a pool buffer (the DMA)
//! stays the worker's. `rx_burst` matches the mode once per burst and runs
//! that mode's loop: no per-packet branch on the mode.
//!
//! The modes, and when a queue is in each:
//! - `Mode::Static` (`own.rs`): from the start while the table is the one
//!   the queue was built with, when no move is in progress, the drift bound
//!   is off (`NicConfig::bounded_drift`: no controller moves keys) and the
//!   queue owns some keys but not all (or, paced, all: its list is the
//!   whole stream). The queue reads its own packets' stream indices (its
//!   own descriptor stream, as a static split has it; often a private copy
//!   of their bytes), not the shared stream. Paced, the packets due arrive
//!   as runs of that list and what finds the ring full is dropped. When
//!   the table first changes the queue turns into `Mode::Walk`
//!   (`Static::into_walk`): the packets its ring holds become ring entries
//!   described from the stream and the walk goes on from its next own
//!   packet. It never goes back.
//! - `Mode::Walk` (`walk.rs`): every other table-steered queue, and any
//!   queue once its table has changed. It walks the shared stream ("the
//!   wire") and takes the packets whose key it owns into its ring. At full
//!   speed it walks only as far as it needs (the ring never fills); paced,
//!   up to the packets due by the shared clock, so a core that cannot keep
//!   up loses packets. Moves: a key changing owner switches at a stream
//!   position past every queue's receive point
//!   ([`flowplane_scale::steer::Move::at`]); the old owner keeps the key's
//!   packets before it, then hands the key's state over
//!   ([`crate::Source::take_due`]); the new owner parks (or, out of room,
//!   stalls at) the key's packets from `at` until the state is imported. A
//!   flow's packets are neither lost nor reordered. Owning every key and
//!   unpaced, with nothing in its ring, it delivers straight from the
//!   stream (the plain replay).
//! - `Mode::Spray` (`spray.rs`, `NicConfig::spray`): packets go round
//!   robin by stream position (the shared-state strategy), no table: a
//!   move never involves the queue. Over queues that divide the loop its
//!   positions' packets are copied contiguously and read from there.
//! - `Mode::Sequenced` (`spray.rs`, [`NicQueue::with_sequencer`]): a
//!   spray with the SCR sequencer in front: each packet may be lost on its
//!   way (`--scr-loss`) and gets its sequence number and history
//!   ([`crate::Source::scr_side`]).

use std::sync::Arc;

use flowplane_packet::{Batch, Line, PacketPool};
use flowplane_scale::steer::{Move, Steering, MAX_DRIFT};

use crate::replay::{QueueData, ReplayTrace};
use crate::scr::{ScrSide, ScrTap, Sequencer};
use crate::{Rx, RxStats, Source};

mod own;
mod spray;
mod walk;

use own::Static;
use spray::Spray;
use walk::Walk;

/// Ring entries ahead whose arena line delivery prefetches.
const PREFETCH_AHEAD: usize = 96;

/// Largest private copy of a queue's packets (lines, 1 GiB).
const MAX_GATHER_LINES: usize = 1 << 24;

/// Bursts between two publications of the per-key packet counts.
const LOAD_PUBLISH_BURSTS: u64 = 64;

/// How a NIC queue runs.
#[derive(Clone, Copy, Debug)]
pub struct NicConfig {
    /// Passes over the trace (None: endless).
    pub loops: Option<u64>,
    /// Offered rate of the whole port (packets/s); None: full speed.
    pub rate_pps: Option<f64>,
    /// TSC ticks per second.
    pub tsc_hz: f64,
    /// TSC reading all queues pace from (one clock for the port).
    pub start_tsc: u64,
    /// Descriptor ring entries (a power of two).
    pub ring: usize,
    /// Round-robin spray by position instead of the table.
    pub spray: bool,
    /// Count packets per key and publish the counts (for rebalancing).
    pub count_loads: bool,
    /// Walk at most [`MAX_DRIFT`] ahead of the slowest queue (needed when
    /// keys move: a move's old owner must reach its switch point soon). Off,
    /// each queue runs at its own pace at full speed, as with a static table.
    pub bounded_drift: bool,
}

impl Default for NicConfig {
    fn default() -> Self {
        NicConfig {
            loops: Some(1),
            rate_pps: None,
            tsc_hz: 1e9,
            start_tsc: 0,
            ring: 4096,
            spray: false,
            count_loads: false,
            bounded_drift: false,
        }
    }
}

/// One queue of the emulated NIC: the per-worker source.
pub struct NicQueue {
    ring: Ring,
    mode: Mode,
}

/// How a queue delivers (see the module doc for when a queue is in each).
// A queue holds one mode for its life (changing once at most): boxing the
// larger ones would only add a load per burst.
#[allow(clippy::large_enum_variant)]
enum Mode {
    /// The table as it started: this queue's own list of stream indices.
    Static(Static),
    /// The shared stream walked with the live table (moves, flow rules).
    Walk(Walk),
    /// Round robin by stream position.
    Spray(Spray),
    /// Round robin behind the SCR sequencer (loss, sequence numbers, histories).
    Sequenced(Spray, ScrTap),
}

/// What every mode shares: the stream, the table's handle, this queue's
/// stream position, its descriptor ring and its counters.
struct Ring {
    trace: Arc<ReplayTrace>,
    steering: Arc<Steering>,
    me: u16,
    nq: u64,
    cfg: NicConfig,
    /// Packets per loop.
    n: u64,
    /// End of the stream (absolute position), if the loops are bounded.
    end: Option<u64>,
    /// Next stream position to receive (absolute: loop * n + index).
    scan: u64,
    /// A lower bound of the slowest other queue's position (re-read when the walk nears it).
    slowest: u64,
    /// Ring entries: (loop << 32) | stream index.
    entries: Box<[u64]>,
    /// Beside each ring entry, what the NIC writes back for it ([`Desc`]).
    desc: Box<[Desc]>,
    head: u64,
    tail: u64,
    /// Packets taken per key (empty unless `count_loads`).
    counts: Box<[u64]>,
    bursts: u64,
    stats: RxStats,
}

/// A receive descriptor as a NIC writes it back beside a ring entry: where
/// the packet's bytes are, its length, RSS hash and time within its loop.
/// The worker reads these from its own ring, not the shared stream's
/// per-packet arrays (which the NIC's walk has just read), as a driver
/// reads a NIC's descriptors.
#[derive(Clone, Copy, Default)]
struct Desc {
    ts: u64,
    first_line: u32,
    hash: u32,
    len: u16,
    /// `first_line` is in the queue's own copy (a spray's), not the stream.
    own: bool,
}

/// Where one walk may go this time: the clock's due time and the bound.
struct Span {
    /// Trace time due (u64::MAX: no time bound).
    due_ns: u64,
    paced: bool,
    /// Stream position the walk stops before.
    limit: u64,
    /// Ring fill the walk stops at (full speed), u64::MAX paced.
    target: u64,
}

impl NicQueue {
    /// Queue `me` of a steered trace (see [`ReplayTrace::is_steered`]).
    /// Panics never: a trace that is not steered yields no packets.
    pub fn new(trace: Arc<ReplayTrace>, steering: Arc<Steering>, me: u16, cfg: NicConfig) -> Self {
        let n = if trace.is_steered() { trace.queues[0].packets() as u64 } else { 0 };
        let keys = steering.keys();
        let ring = cfg.ring.max(2 * flowplane_packet::MAX_BATCH + PREFETCH_AHEAD).next_power_of_two();
        let nq = steering.queues().max(1) as u64;
        let r = Ring {
            end: cfg.loops.map(|l| l.saturating_mul(n)),
            trace,
            me,
            nq,
            cfg,
            n,
            scan: if cfg.spray { u64::from(me) } else { 0 },
            slowest: 0,
            entries: vec![0u64; ring].into_boxed_slice(),
            desc: vec![Desc::default(); ring].into_boxed_slice(),
            head: 0,
            tail: 0,
            counts: vec![0u64; if cfg.count_loads { keys } else { 0 }].into_boxed_slice(),
            bursts: 0,
            steering,
            stats: RxStats::default(),
        };
        let mode = if cfg.spray {
            Mode::Spray(Spray::new(&r))
        } else {
            let mut w = Walk::new(keys);
            w.refresh(&r);
            if Static::fits(&r, &w) {
                Mode::Static(Static::new(&r, w))
            } else {
                Mode::Walk(w)
            }
        };
        NicQueue { ring: r, mode }
    }

    /// Puts the SCR sequencer in front of this (spraying) queue: each packet
    /// gets its sequence number and history ([`Source::scr_side`]) and may
    /// be lost on the way (`--scr-loss`). A queue steered by the table
    /// (built without [`NicConfig::spray`]) is left as it is.
    pub fn with_sequencer(mut self, seq: Arc<Sequencer>) -> Self {
        self.mode = match self.mode {
            Mode::Spray(s) | Mode::Sequenced(s, _) => Mode::Sequenced(s, ScrTap::new(seq)),
            m => m,
        };
        self
    }

    /// The table has changed since the start: the own-list delivery turns
    /// into the walk of the stream ([`Static::into_walk`]).
    #[cold]
    fn unlist(&mut self) {
        if let Mode::Static(s) = std::mem::replace(&mut self.mode, Mode::Walk(Walk::new(0))) {
            self.mode = Mode::Walk(s.into_walk(&mut self.ring));
        }
    }
}

impl Ring {
    /// How far the paced clock has got: (trace time due in ns, or for a
    /// trace whose packets share one time, the stream position due).
    fn due(&self, now: u64) -> Option<(u64, u64)> {
        let rate = self.cfg.rate_pps?;
        let elapsed = now.saturating_sub(self.cfg.start_tsc) as f64 / self.cfg.tsc_hz.max(1.0);
        if self.trace.loop_ns > 1 {
            let loop_s = self.trace.loop_ns as f64 / 1e9;
            Some(((elapsed * rate * loop_s / (self.n.max(1) as f64) * 1e9) as u64, u64::MAX))
        } else {
            Some((u64::MAX, (elapsed * rate) as u64 + 1))
        }
    }

    /// Stream position of a ring entry.
    #[inline]
    fn abs(&self, e: u64) -> u64 {
        (e >> 32) * self.n + (e & 0xffff_ffff)
    }

    /// Where a walk from `scan` toward `claim` may go now: the end, the
    /// clock, and (bounded drift) the slowest other queue.
    #[inline]
    fn span(&mut self, want: usize, now: u64, claim: u64) -> Span {
        let due = self.due(now);
        let paced = due.is_some();
        let (due_ns, due_pos) = due.unwrap_or((u64::MAX, u64::MAX));
        let mut limit = self.end.unwrap_or(u64::MAX).min(claim).min(due_pos);
        if self.cfg.bounded_drift && self.nq > 1 && limit > self.slowest.saturating_add(MAX_DRIFT) {
            // Positions only grow: re-read the slowest queue only when near the bound.
            self.slowest = self.steering.slowest_other(self.me as usize);
            limit = limit.min(self.slowest.saturating_add(MAX_DRIFT).max(self.scan));
        }
        // At full speed fill the ring only to what this burst delivers plus the prefetch distance.
        let target = if paced { u64::MAX } else { (want + PREFETCH_AHEAD) as u64 };
        Span { due_ns, paced, limit, target }
    }

    /// A walk has got to `pos`, dropping `drops` packets at the full ring.
    #[inline]
    fn walked(&mut self, pos: u64, drops: u64) {
        self.stats.scanned += pos - self.scan;
        self.stats.rx_ring_full += drops;
        self.scan = pos;
        self.steering.publish_progress(self.me as usize, pos, self.stats.packets);
    }

    /// Writes the descriptors of the ring entries from `from` to the tail
    /// (the entries the walk and the held packets' release just added),
    /// from the shared stream. Once per burst, out of line.
    #[inline(never)]
    fn write_back(&mut self, from: u64) {
        let d = &self.trace.queues[0];
        let mask = self.entries.len() as u64 - 1;
        for t in from..self.tail {
            let at = (t & mask) as usize;
            let i = (self.entries[at] & 0xffff_ffff) as usize;
            if let (Some(&first_line), Some(&hash), Some(&len)) = (d.first_line.get(i), d.hash.get(i), d.len.get(i)) {
                self.desc[at] = Desc { ts: d.ts_at(i), first_line, hash, len, own: false };
            }
        }
    }

    /// Counts the burst and publishes the per-key counts every so often.
    #[inline]
    fn count_burst(&mut self) {
        self.bursts += 1;
        if !self.counts.is_empty() && self.bursts.is_multiple_of(LOAD_PUBLISH_BURSTS) {
            self.steering.publish_loads(self.me as usize, &self.counts, self.scan);
        }
    }

    /// Nothing to deliver: done when the stream has ended, the ring is
    /// empty and the mode owes nothing (`settled`), else idle.
    #[cold]
    fn empty(&mut self, settled: bool) -> Rx {
        let at_end = self.end.is_some_and(|e| self.scan >= e);
        if at_end && self.head == self.tail && settled {
            if !self.counts.is_empty() {
                self.steering.publish_loads(self.me as usize, &self.counts, self.scan);
            }
            // Finished: no longer holds the others back.
            self.steering.publish_progress(self.me as usize, u64::MAX, self.stats.packets);
            Rx::Done
        } else {
            Rx::Idle
        }
    }

    /// Receives the `take` packets at the ring's head into the batch (the
    /// descriptors tell where their bytes are: the stream, or `own`, a
    /// spray's copy): the number received. The head stays (see [`Ring::advance`]).
    #[inline(always)]
    fn deliver(&mut self, pool: &mut PacketPool, batch: &mut Batch, take: usize, own: Option<&QueueData>) -> usize {
        let d = &self.trace.queues[0];
        let own = own.map_or(&d.lines, |m| &m.lines);
        let (ring, desc, head, tail) = (&self.entries, &self.desc, self.head, self.tail);
        let mask = ring.len() as u64 - 1;
        let loop_ns = self.trace.loop_ns;
        let mut bytes = 0u64;
        let got = batch.rx_burst_lines(pool, take, |k| {
            let h = head + k as u64;
            if h + (PREFETCH_AHEAD as u64) < tail {
                let a = desc[((h + PREFETCH_AHEAD as u64) & mask) as usize];
                if let Some(l) = if a.own { own } else { &d.lines }.get(a.first_line as usize) {
                    flowplane_packet::prefetch::read(l);
                }
            }
            let at = (h & mask) as usize;
            let (lp, w) = (ring[at] >> 32, desc[at]);
            let first = w.first_line as usize;
            bytes += u64::from(w.len);
            let ts = lp.saturating_mul(loop_ns).saturating_add(w.ts);
            let lines = if w.own { own } else { &d.lines };
            (&lines[first..first + Line::count_for(w.len as usize)], w.len, w.hash, ts)
        });
        if got < take {
            self.stats.pool_empty += 1;
        }
        self.stats.bytes += bytes;
        got
    }

    /// The `got` packets at the head are delivered.
    #[inline]
    fn advance(&mut self, got: usize) -> Rx {
        self.head += got as u64;
        self.stats.packets += got as u64;
        if got > 0 {
            Rx::Packets(got)
        } else {
            Rx::Idle
        }
    }
}

impl Source for NicQueue {
    fn rx_burst(&mut self, pool: &mut PacketPool, batch: &mut Batch, max: usize, now: u64) -> Rx {
        if self.ring.n == 0 {
            return Rx::Done;
        }
        let want = max.min(batch.room());
        let r = &mut self.ring;
        match &mut self.mode {
            Mode::Walk(w) => w.burst(r, pool, batch, want, now),
            Mode::Spray(s) => s.burst(r, pool, batch, want, now, None),
            Mode::Sequenced(s, tap) => s.burst(r, pool, batch, want, now, Some(tap)),
            Mode::Static(s) => match s.burst(r, pool, batch, want, now) {
                Some(rx) => rx,
                None => {
                    // The table changed: walk the stream from this queue's next own packet on.
                    self.unlist();
                    match &mut self.mode {
                        Mode::Walk(w) => w.burst_walk(&mut self.ring, pool, batch, want, now),
                        _ => Rx::Idle,
                    }
                }
            },
        }
    }

    fn rx_stats(&self) -> RxStats {
        self.ring.stats
    }

    fn scr_side(&self) -> Option<ScrSide<'_>> {
        match &self.mode {
            Mode::Sequenced(_, tap) => Some(tap.side()),
            _ => None,
        }
    }

    fn scr_lost(&self) -> u64 {
        match &self.mode {
            Mode::Sequenced(_, tap) => tap.lost,
            _ => 0,
        }
    }

    fn start(&mut self, tsc: u64) {
        self.ring.cfg.start_tsc = tsc;
    }

    fn arrival_clock(&self) -> Option<(u64, f64)> {
        // Inverse of `due`: trace time t is due after t * n / (rate * loop_s) ns of wall time.
        let r = &self.ring;
        let rate = r.cfg.rate_pps?;
        if r.trace.loop_ns <= 1 || r.n == 0 {
            return None;
        }
        let loop_s = r.trace.loop_ns as f64 / 1e9;
        let wall_per_trace_ns = r.n as f64 / (rate * loop_s);
        Some((r.cfg.start_tsc, wall_per_trace_ns * r.cfg.tsc_hz / 1e9))
    }

    fn take_due(&mut self) -> Option<Move> {
        match &mut self.mode {
            Mode::Walk(w) => w.take_due(&self.ring),
            // Static: the table has not changed (no move); a spray has no table.
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests;
