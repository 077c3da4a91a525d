//! [`super::Mode::Static`]: while the table is the one the queue started
//! with, the queue delivers from its own list of stream indices (a NIC
//! queue's own descriptor stream, as a static split would have it), read
//! instead of walking the stream; the first change of the table turns it
//! into the walk ([`Static::into_walk`]).

use std::collections::VecDeque;

use flowplane_packet::{tsc, Batch, Line, PacketPool};
use flowplane_scale::steer::MAX_SCAN;

use super::walk::Walk;
use super::{Ring, MAX_GATHER_LINES, PREFETCH_AHEAD};
use crate::replay::QueueData;
use crate::Rx;

/// An own packet of a queue's sequence: index `j` of its own list in loop `k`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct OwnAt {
    k: u64,
    j: usize,
}

/// The own-list delivery's state.
pub(super) struct Static {
    /// The table as the queue started with it (the walk's view once it changes).
    table: Walk,
    /// The stream indices of this queue's packets, in stream order (empty with `own_all`).
    own: Vec<u32>,
    /// The queue owns every key: `own` is implicitly `0..n` (paced only;
    /// unpaced, such a queue walks, delivering straight from the stream).
    own_all: bool,
    /// The next own packet not yet received (unpaced: delivered; paced:
    /// arrived or dropped).
    own_next: OwnAt,
    /// Paced: the packets the ring holds, as runs of the own sequence
    /// (start, count) in arrival order; a run ends where packets found the
    /// ring full.
    runs: VecDeque<(OwnAt, u64)>,
    /// Packets per loop (the stream's).
    n: u64,
    /// Packets per loop in the own sequence (`n` with `own_all`).
    len: u64,
    /// Packets in `runs` (at most the ring's size).
    pub(super) held: u64,
    /// Paced: the claim published last (bursts within it need not publish
    /// again while the generation stays).
    claimed: u64,
    /// `own`'s packets copied contiguously (same order): each core streams
    /// its own memory as behind a real NIC queue, not every other line of
    /// the shared stream (which costs both cores the whole stream's bandwidth).
    pub(super) mine: Option<QueueData>,
}

impl Static {
    /// Whether a queue whose table `table` was just read starts in the
    /// own-list delivery: no drift bound, nothing moving, a stream, and
    /// either some keys another queue's or (paced) every key this one's.
    pub(super) fn fits(r: &Ring, table: &Walk) -> bool {
        let paced = r.cfg.rate_pps.is_some();
        !r.cfg.bounded_drift && table.no_transits() && r.n > 0 && (!table.all_mine() || paced)
    }

    /// The own-list delivery of a queue whose table `table` was just read
    /// (see [`Static::fits`]).
    pub(super) fn new(r: &Ring, table: Walk) -> Static {
        let n = r.n;
        let mut s = Static {
            table,
            own: Vec::new(),
            own_all: false,
            own_next: OwnAt::default(),
            n,
            len: 0,
            runs: VecDeque::with_capacity(r.entries.len()),
            held: 0,
            claimed: 0,
            mine: None,
        };
        if s.table.all_mine() {
            // Owning everything, paced: the stream is the own list.
            s.own_all = true;
            s.len = n;
        } else {
            // This queue's packets, once, in stream order.
            let d = &r.trace.queues[0];
            s.own = (0..n as u32).filter(|&i| s.table.owns(d.keys[i as usize], r.me)).collect();
            s.own.shrink_to_fit();
            let lines: usize = s.own.iter().map(|&i| Line::count_for(d.len[i as usize] as usize)).sum();
            if lines <= MAX_GATHER_LINES {
                s.mine = d.gather(&s.own);
            }
            s.len = s.own.len() as u64;
        }
        s
    }

    /// One burst with the table as the queue started: Some(what it
    /// delivered), or None when the table has changed (read again) and the
    /// queue must walk ([`Static::into_walk`]).
    #[inline]
    pub(super) fn burst(
        &mut self,
        r: &mut Ring,
        pool: &mut PacketPool,
        batch: &mut Batch,
        want: usize,
        now: u64,
    ) -> Option<Rx> {
        if r.steering.generation() != self.table.gen {
            self.table.refresh(r);
            return None;
        }
        if r.cfg.rate_pps.is_none() {
            if r.head != r.tail {
                return None;
            }
            // Claim the positions this burst covers, then check the table is still the one listed.
            r.steering.publish_claim(r.me as usize, self.list_claim(r, want));
            if r.steering.generation() == self.table.gen {
                return Some(self.list_burst(r, pool, batch, want));
            }
            self.table.refresh(r);
            return None;
        }
        // Paced: everything due, claimed span by span (what finds the ring full is dropped, not left waiting).
        let t0 = tsc::rdtsc();
        let end = r.end.unwrap_or(u64::MAX);
        let mut same = true;
        loop {
            if r.scan >= self.claimed {
                // Past the span claimed last (still claimed while the generation is the one read).
                let claim = self.list_claim(r, MAX_SCAN as usize);
                r.steering.publish_claim(r.me as usize, claim);
                if r.steering.generation() != self.table.gen {
                    self.table.refresh(r);
                    same = false;
                    break;
                }
                self.claimed = claim;
            }
            self.arrive(r, now, self.claimed);
            if r.scan < self.claimed || r.scan >= end {
                break;
            }
        }
        r.stats.nic_cycles += tsc::rdtsc().saturating_sub(t0);
        if !same {
            return None;
        }
        Some(match self.run_burst(r, pool, batch, want) {
            0 if r.scan >= end && self.runs.is_empty() => {
                r.steering.publish_progress(r.me as usize, u64::MAX, r.stats.packets);
                Rx::Done
            }
            0 => Rx::Idle,
            got => Rx::Packets(got),
        })
    }

    /// Leaves the own-list delivery (the table changed): the packets the
    /// ring holds as runs become ring entries described from the stream,
    /// and the walk goes on from `scan` with the table as read last.
    pub(super) fn into_walk(self, r: &mut Ring) -> Walk {
        let mask = r.entries.len() as u64 - 1;
        let from = r.tail;
        for &(start, count) in &self.runs {
            let mut at = start;
            for _ in 0..count {
                let i = self.own_pos(at) - at.k * r.n;
                r.entries[(r.tail & mask) as usize] = (at.k << 32) | i;
                r.tail += 1;
                at = self.own_after(at, 1);
            }
        }
        r.write_back(from);
        self.table
    }

    /// Stream position of an own packet.
    #[inline]
    fn own_pos(&self, at: OwnAt) -> u64 {
        at.k * self.n + if self.own_all { at.j as u64 } else { u64::from(self.own[at.j]) }
    }

    /// The own packet `by` after `at` (no division unless past the next loop).
    #[inline]
    fn own_after(&self, at: OwnAt, by: u64) -> OwnAt {
        let len = self.len.max(1);
        let j = at.j as u64 + by;
        if j < len {
            OwnAt { k: at.k, j: j as usize }
        } else if j < 2 * len {
            OwnAt { k: at.k + 1, j: (j - len) as usize }
        } else {
            OwnAt { k: at.k + j / len, j: (j % len) as usize }
        }
    }

    /// The stream position a list burst of `want` packets ends at (at most):
    /// the position of the own packet after them, within the burst's bound.
    fn list_claim(&self, r: &Ring, want: usize) -> u64 {
        let end = r.end.unwrap_or(u64::MAX);
        if self.len == 0 {
            // Nothing of this queue's until the table changes: the claim is the end of the stream.
            return r.end.unwrap_or(r.scan.saturating_add(MAX_SCAN));
        }
        self.own_pos(self.own_after(self.own_next, want as u64)).min(end.min(r.scan.saturating_add(MAX_SCAN)))
    }

    /// Marks everything before own packet `own_next` seen, within `bound`.
    fn own_progress(&self, r: &mut Ring, bound: u64) {
        let next = if self.len == 0 { bound } else { self.own_pos(self.own_next).min(bound) };
        if next > r.scan {
            r.stats.scanned += next - r.scan;
            r.scan = next;
        }
        r.steering.publish_progress(r.me as usize, r.scan, r.stats.packets);
    }

    /// Paced: the port's clock has brought this queue's own packets up to
    /// the one due next (before stream position `claim`); the first that
    /// fit join the ring ([`Static::runs`]), the rest find it full and are
    /// dropped (counted), as a NIC queue's own descriptor stream: the other
    /// queues' packets are not visited and nothing is written per packet
    /// (the NIC does this in hardware).
    fn arrive(&mut self, r: &mut Ring, now: u64, claim: u64) {
        let Some((due_ns, due_pos)) = r.due(now) else { return };
        let end = r.end.unwrap_or(u64::MAX);
        let len = self.len;
        if len == 0 {
            self.own_progress(r, end.min(claim));
            return;
        }
        let limit = end.min(claim).min(due_pos);
        let (d, own, n) = (&r.trace.queues[0], &self.own[..], self.n);
        let mine = self.mine.as_ref();
        let OwnAt { mut k, mut j } = self.own_next;
        let mut arrived = 0u64;
        loop {
            let i = if self.own_all { j } else { own[j] as usize };
            if k * n + i as u64 >= limit {
                break;
            }
            let ts = match mine {
                Some(m) => m.ts_at(j),
                None => d.ts_at(i),
            };
            if k.saturating_mul(r.trace.loop_ns).saturating_add(ts) > due_ns {
                break;
            }
            arrived += 1;
            j += 1;
            if j as u64 == len {
                (k, j) = (k + 1, 0);
            }
        }
        let taken = arrived.min(r.entries.len() as u64 - self.held);
        if taken > 0 {
            let last = self.runs.back().map(|&(at, count)| self.own_after(at, count));
            match self.runs.back_mut() {
                Some(run) if last == Some(self.own_next) => run.1 += taken,
                _ => self.runs.push_back((self.own_next, taken)),
            }
            self.held += taken;
        }
        r.stats.rx_ring_full += arrived - taken;
        self.own_next = OwnAt { k, j };
        self.own_progress(r, end.min(claim));
    }

    /// Delivers up to `want` packets of the runs the ring holds (paced).
    fn run_burst(&mut self, r: &mut Ring, pool: &mut PacketPool, batch: &mut Batch, want: usize) -> usize {
        let len = self.len.max(1);
        let (mut got, mut bytes) = (0usize, 0u64);
        while got < want {
            let Some(&(start, count)) = self.runs.front() else { break };
            let chunk = ((want - got) as u64).min(count).min(len - start.j as u64) as usize;
            let (took, b) = self.deliver_own(r, pool, batch, start.k, start.j, chunk);
            got += took;
            bytes += b;
            self.held -= took as u64;
            if took as u64 == count {
                self.runs.pop_front();
            } else {
                let next = self.own_after(start, took as u64);
                if let Some(run) = self.runs.front_mut() {
                    *run = (next, count - took as u64);
                }
            }
            if took < chunk {
                r.stats.pool_empty += 1;
                break;
            }
        }
        r.stats.packets += got as u64;
        r.stats.bytes += bytes;
        got
    }

    /// Receives own packets `j..j + chunk` of loop `k` (one loop, contiguous
    /// in the own sequence) into the batch: (packets received, their bytes).
    #[inline]
    fn deliver_own(
        &self,
        r: &Ring,
        pool: &mut PacketPool,
        batch: &mut Batch,
        k: u64,
        j: usize,
        chunk: usize,
    ) -> (usize, u64) {
        let d = &r.trace.queues[0];
        let shift = k.saturating_mul(r.trace.loop_ns);
        let mut bytes = 0u64;
        // The private copy (position j of `own` is its packet j), or, when every
        // packet is this queue's, the stream itself in order.
        let whole = self.mine.as_ref().or(if self.own_all { Some(d) } else { None });
        let got = if let Some(m) = whole {
            batch.rx_burst_lines_timed(pool, chunk, m.times(j, chunk, shift), |x| {
                let at = j + x;
                if let Some(&ahead) = m.first_line.get(at + PREFETCH_AHEAD) {
                    if let Some(l) = m.lines.get(ahead as usize) {
                        flowplane_packet::prefetch::read(l);
                    }
                }
                let first = m.first_line[at] as usize;
                let l = m.len[at];
                bytes += u64::from(l);
                (&m.lines[first..first + Line::count_for(l as usize)], l, m.hash[at])
            })
        } else {
            let ids = &self.own[j..];
            batch.rx_burst_lines(pool, chunk, |x| {
                if let Some(&ahead) = ids.get(x + PREFETCH_AHEAD) {
                    if let Some(&first) = d.first_line.get(ahead as usize) {
                        if let Some(l) = d.lines.get(first as usize) {
                            flowplane_packet::prefetch::read(l);
                        }
                    }
                }
                let i = ids[x] as usize;
                let first = d.first_line[i] as usize;
                let l = d.len[i];
                bytes += u64::from(l);
                (&d.lines[first..first + Line::count_for(l as usize)], l, d.hash[i], shift.saturating_add(d.ts_at(i)))
            })
        };
        (got, bytes)
    }

    /// Delivers up to `want` of this queue's packets from its own list
    /// (unpaced: the table has not changed since the start, nothing to steer).
    fn list_burst(&mut self, r: &mut Ring, pool: &mut PacketPool, batch: &mut Batch, want: usize) -> Rx {
        let end = r.end.unwrap_or(u64::MAX);
        let len = self.len;
        if r.scan >= end || len == 0 {
            if r.cfg.loops.is_some() {
                r.scan = end;
                r.steering.publish_progress(r.me as usize, u64::MAX, r.stats.packets);
                return Rx::Done;
            }
            return Rx::Idle;
        }
        let (mut got, mut bytes) = (0usize, 0u64);
        // A burst spans at most MAX_SCAN stream positions (the move protocol's bound).
        let limit = r.scan.saturating_add(MAX_SCAN).min(end);
        while got < want {
            let OwnAt { k, j } = self.own_next;
            let mut chunk = (want - got).min((len - j as u64) as usize);
            while chunk > 0 && self.own_pos(OwnAt { k, j: j + chunk - 1 }) >= limit {
                chunk -= 1;
            }
            if chunk == 0 {
                break;
            }
            let (took, b) = self.deliver_own(r, pool, batch, k, j, chunk);
            got += took;
            bytes += b;
            self.own_next = self.own_after(self.own_next, took as u64);
            if took < chunk {
                r.stats.pool_empty += 1;
                break;
            }
        }
        r.stats.packets += got as u64;
        r.stats.bytes += bytes;
        // Everything before this queue's next packet is seen (none of it is its
        // own), but no further than this burst's bound: a walk taking over
        // after a table change must start where the old view's claim ends.
        self.own_progress(r, limit);
        if got > 0 {
            Rx::Packets(got)
        } else if r.scan >= end {
            Rx::Done
        } else {
            Rx::Idle
        }
    }
}
