//! [`super::Mode::Walk`]: the queue walks the shared stream with the live
//! table and takes the packets whose key it owns into its ring; keys on the
//! move and entries with flow rules take the cold path (the switch point,
//! parking until the state arrives, the exact flow match).

use flowplane_packet::{tsc, Batch, Line, PacketPool};
use flowplane_scale::steer::{FlowRule, Move, MAX_SCAN};

use super::{Ring, PREFETCH_AHEAD};
use crate::Rx;

/// Owner value marking a key with a move in progress that involves this queue.
const TRANSIT: u16 = u16::MAX;

/// Owner value marking a RETA entry some of whose flows have exact-match
/// rules (Dyssect): the walk's slow path matches the packet against them.
/// The walk tests `>= FLOWS`, one compare for both markers.
const FLOWS: u16 = u16::MAX - 1;

/// Most packets a queue holds aside for keys whose state is on its way.
const MAX_PARKED: usize = 8192;

/// The walk's state: this queue's view of the table and its moves.
pub(super) struct Walk {
    /// Per key: its queue, or [`TRANSIT`] / [`FLOWS`].
    owner: Box<[u16]>,
    /// The table's generation `owner` was read at.
    pub(super) gen: u64,
    /// Every key owned here and no move in progress.
    all_mine: bool,
    transits: Vec<Move>,
    /// Moves this queue is done with that the table may still list.
    done_ids: Vec<u64>,
    snap_moves: Vec<Move>,
    /// Run-time flow rules of the current generation, as (slot key, rule).
    rules: Vec<(u16, FlowRule)>,
    /// Per key marked [`FLOWS`]: its real owner value (a queue or [`TRANSIT`]).
    shadow: Box<[u16]>,
    /// A move's new owner past the switch point before the state arrived:
    /// the key's packets wait here in arrival order (key, ring entry) while
    /// the walk goes on for every other key (no stall behind the old owner).
    parked: Vec<(u16, u64)>,
}

impl Walk {
    /// A view of a table of `keys` keys, not read yet ([`Walk::refresh`]).
    pub(super) fn new(keys: usize) -> Walk {
        Walk {
            owner: vec![0u16; keys].into_boxed_slice(),
            gen: 0,
            all_mine: false,
            transits: Vec::new(),
            done_ids: Vec::new(),
            snap_moves: Vec::new(),
            rules: Vec::new(),
            shadow: vec![0u16; keys].into_boxed_slice(),
            parked: Vec::new(),
        }
    }

    /// Whether queue `me` owns `key` in this view (a key on the move or with flow rules is no one's).
    #[inline]
    pub(super) fn owns(&self, key: u16, me: u16) -> bool {
        self.owner.get(key as usize) == Some(&me)
    }

    /// The table as read: every key this queue's and nothing moving.
    pub(super) fn all_mine(&self) -> bool {
        self.all_mine
    }

    /// No move in progress involves this queue.
    pub(super) fn no_transits(&self) -> bool {
        self.transits.is_empty()
    }

    /// Re-reads the table after a change.
    pub(super) fn refresh(&mut self, r: &Ring) {
        let mut moves = std::mem::take(&mut self.snap_moves);
        let mut rules = std::mem::take(&mut self.rules);
        self.gen = r.steering.snapshot_rules(r.me, &mut self.owner, &mut moves, &mut rules);
        self.rules = rules;
        self.done_ids.retain(|id| moves.iter().any(|m| m.id == *id));
        for m in &moves {
            if !self.done_ids.contains(&m.id) && !self.transits.iter().any(|t| t.id == m.id) {
                self.transits.push(*m);
            }
        }
        self.snap_moves = moves;
        self.transits.sort_by_key(|m| m.id);
        for m in &self.transits {
            if let Some(o) = self.owner.get_mut(m.key as usize) {
                *o = TRANSIT;
            }
        }
        self.mark_flows();
        self.all_mine = self.transits.is_empty() && self.owner.iter().all(|&o| o == r.me);
    }

    /// Marks the entries with flow rules [`FLOWS`], keeping their owner in `shadow`.
    fn mark_flows(&mut self) {
        for (_, r) in &self.rules {
            let e = r.entry as usize;
            if let Some(o) = self.owner.get_mut(e) {
                if *o != FLOWS {
                    self.shadow[e] = *o;
                    *o = FLOWS;
                }
            }
        }
    }

    /// The steering key of the packet at index `i` of entry `k` (marked
    /// [`FLOWS`]): a rule's slot when the packet's hash and then its 5-tuple
    /// match, else the entry. Cold: only entries with offloaded flows.
    #[cold]
    fn flow_key(&self, r: &Ring, k: u16, i: usize) -> u16 {
        let d = &r.trace.queues[0];
        let h = d.hash.get(i).copied().unwrap_or(0);
        for (slot, rule) in &self.rules {
            if rule.entry != k || rule.hash != h {
                continue;
            }
            // The exact compare: the frame's 5-tuple (the first two lines hold any IPv4 header).
            let first = d.first_line.get(i).copied().unwrap_or(0) as usize;
            let mut buf = [0u8; 128];
            let len = (d.len.get(i).copied().unwrap_or(0) as usize).min(buf.len());
            for (j, l) in d.lines.iter().skip(first).take(len.div_ceil(64)).enumerate() {
                let n = (len - j * 64).min(64);
                buf[j * 64..j * 64 + n].copy_from_slice(&l.0[..n]);
            }
            if rule.matches_frame(&buf[..len]) {
                return *slot;
            }
        }
        k
    }

    /// The owner value of key `k` with the [`FLOWS`] mark resolved.
    #[inline]
    fn owner_of(&self, k: u16) -> u16 {
        match self.owner.get(k as usize).copied().unwrap_or(TRANSIT) {
            FLOWS => self.shadow[k as usize],
            o => o,
        }
    }

    /// Who takes the packet of `key` at `pos` while the key moves: Some(true)
    /// this queue, Some(false) another, None: not yet (state not imported).
    #[cold]
    fn resolve(&self, r: &Ring, key: u16, pos: u64) -> Option<bool> {
        let mut ms = self.transits.iter().filter(|m| m.key == key);
        let first = ms.next()?;
        let (mut owner, mut need) = (first.from, None);
        for m in std::iter::once(first).chain(ms) {
            if pos >= m.at {
                owner = m.to;
                need = Some(*m);
            } else {
                break;
            }
        }
        if owner != r.me {
            return Some(false);
        }
        match need {
            Some(m) if !r.steering.is_ready(key, m.id) => None,
            _ => Some(true),
        }
    }

    /// Holds the packet at ring entry `entry` of moving key `key` aside; false if there is no room.
    #[cold]
    fn park(&mut self, r: &mut Ring, key: u16, entry: u64) -> bool {
        if self.parked.len() >= MAX_PARKED {
            return false;
        }
        if self.parked.capacity() == 0 {
            // Once per queue, on its first hand-over.
            self.parked.reserve_exact(MAX_PARKED);
        }
        self.parked.push((key, entry));
        r.stats.parked += 1;
        true
    }

    /// Moves the held packets of keys whose state has arrived into the
    /// ring, in arrival order, as far as the ring has room (a key's later
    /// packets never pass its earlier ones).
    #[cold]
    fn unpark(&mut self, r: &mut Ring) {
        let cap = r.entries.len() as u64;
        let mut full = false;
        let mut w = 0;
        for i in 0..self.parked.len() {
            let (key, e) = self.parked[i];
            let go = !full && self.resolve(r, key, r.abs(e)) == Some(true);
            if go && r.tail - r.head < cap {
                r.entries[(r.tail & (cap - 1)) as usize] = e;
                r.tail += 1;
                continue;
            }
            // The ring is full: nothing more moves this time (order kept for every key).
            full |= go;
            self.parked[w] = (key, e);
            w += 1;
        }
        self.parked.truncate(w);
    }

    /// Retires moves this queue is done with (after its hand-overs).
    fn retire(&mut self, r: &Ring) {
        let (me, scan) = (r.me, r.scan);
        let steering = &r.steering;
        let parked = &self.parked;
        let done = &mut self.done_ids;
        let mut changed = false;
        self.transits.retain(|m| {
            let finished = if m.to == me {
                scan >= m.at && steering.is_ready(m.key, m.id) && !parked.iter().any(|p| p.0 == m.key)
            } else {
                done.contains(&m.id)
            };
            if finished && m.to == me {
                done.push(m.id);
                // Past the switch point with the state: the move is over for every queue.
                steering.retired(m.id);
            }
            changed |= finished;
            !finished
        });
        if changed {
            for k in 0..self.owner.len() {
                if self.owner[k] == TRANSIT && !self.transits.iter().any(|m| m.key as usize == k) {
                    // The latest owner from the table (a later move would have kept it in transit).
                    self.owner[k] = r.steering.owners().get(k).copied().unwrap_or(0);
                }
                if self.owner[k] == FLOWS
                    && self.shadow[k] == TRANSIT
                    && !self.transits.iter().any(|m| m.key as usize == k)
                {
                    self.shadow[k] = r.steering.owners().get(k).copied().unwrap_or(0);
                }
            }
            self.all_mine = self.transits.is_empty() && self.owner.iter().all(|&o| o == me);
        }
    }

    /// The move this queue owes the state of now (past its switch point
    /// with every packet before it delivered), once.
    pub(super) fn take_due(&mut self, r: &Ring) -> Option<Move> {
        if self.transits.is_empty() {
            return None;
        }
        let consumed =
            if r.head == r.tail { r.scan } else { r.abs(r.entries[(r.head & (r.entries.len() as u64 - 1)) as usize]) };
        let (me, scan) = (r.me, r.scan);
        let m = *self
            .transits
            .iter()
            .find(|m| m.from == me && scan >= m.at && consumed >= m.at && !self.done_ids.contains(&m.id))?;
        self.done_ids.push(m.id);
        self.retire(r);
        Some(m)
    }

    /// One burst: the table re-read if it changed, then [`Walk::burst_walk`].
    #[inline]
    pub(super) fn burst(
        &mut self,
        r: &mut Ring,
        pool: &mut PacketPool,
        batch: &mut Batch,
        want: usize,
        now: u64,
    ) -> Rx {
        if r.steering.generation() != self.gen {
            self.refresh(r);
        }
        self.burst_walk(r, pool, batch, want, now)
    }

    /// One burst with the table as read: straight from the stream when
    /// every key is this queue's (unpaced), else the walk fills the ring
    /// and the burst is taken from its head.
    #[inline]
    pub(super) fn burst_walk(
        &mut self,
        r: &mut Ring,
        pool: &mut PacketPool,
        batch: &mut Batch,
        want: usize,
        now: u64,
    ) -> Rx {
        let paced = r.cfg.rate_pps.is_some();
        let direct = self.all_mine && !paced;
        if direct && r.head == r.tail {
            // One queue owning everything and nothing held in the ring:
            // nothing to steer, deliver straight from the stream (the plain replay).
            let claim = r.scan.saturating_add(want as u64).min(r.end.unwrap_or(u64::MAX));
            r.steering.publish_claim(r.me as usize, claim);
            if r.steering.generation() == self.gen {
                return direct_burst(r, pool, batch, want);
            }
            // The table changed meanwhile: steer from the next burst on.
            self.refresh(r);
            return Rx::Idle;
        }
        if !direct {
            let t0 = tsc::rdtsc();
            let tail0 = r.tail;
            if !self.parked.is_empty() {
                self.unpark(r);
            }
            self.walk(r, want, now);
            r.write_back(tail0);
            r.stats.nic_cycles += tsc::rdtsc().saturating_sub(t0);
        }
        if !self.transits.is_empty() {
            self.retire(r);
        }
        r.count_burst();
        let take = want.min((r.tail - r.head) as usize);
        if take == 0 {
            let owes = self.transits.iter().any(|m| m.from == r.me && m.at <= r.scan && !self.done_ids.contains(&m.id));
            return r.empty(!owes && self.parked.is_empty());
        }
        let got = r.deliver(pool, batch, take, None);
        r.advance(got)
    }

    /// Walks the stream from `scan`, taking owned packets into the ring, in
    /// spans claimed before they are walked ([`flowplane_scale::steer::Steering::publish_claim`])
    /// of about one burst's worth of this queue's packets: a table change
    /// switches at the end of the span a queue is in.
    fn walk(&mut self, r: &mut Ring, want: usize, now: u64) {
        let end = r.end.unwrap_or(u64::MAX).min(r.scan.saturating_add(MAX_SCAN));
        let span = ((want + PREFETCH_AHEAD) as u64 * r.nq).clamp(256, MAX_SCAN);
        let target = (want + PREFETCH_AHEAD) as u64;
        loop {
            let claim = r.scan.saturating_add(span).min(end);
            r.steering.publish_claim(r.me as usize, claim);
            if r.steering.generation() != self.gen {
                // Changed before this span was claimed: walk it with the new table.
                self.refresh(r);
            }
            let from = r.scan;
            self.walk_to(r, want, now, claim);
            // On only if the walk ran to its claim and wants more.
            let more = r.scan == claim && claim < end && (r.cfg.rate_pps.is_some() || r.tail - r.head < target);
            if !more || r.scan == from {
                return;
            }
        }
    }

    /// Walks the stream from `scan` up to position `claim`, taking owned packets into the ring.
    fn walk_to(&mut self, r: &mut Ring, want: usize, now: u64, claim: u64) {
        let s = r.span(want, now, claim);
        let (paced, limit, target, due_ns) = (s.paced, s.limit, s.target, s.due_ns);
        let cap = r.entries.len() as u64;
        let mut pos = r.scan;
        let mut drops = 0u64;
        let n = r.n;
        while pos < limit && (paced || r.tail - r.head < target) {
            let loop_k = pos / n;
            let i0 = pos - loop_k * n;
            let end_i = n.min(i0 + (limit - pos));
            let run = if paced {
                walk_run::<true>(r, &self.owner, loop_k, i0, end_i, due_ns, target)
            } else {
                walk_run::<false>(r, &self.owner, loop_k, i0, end_i, due_ns, target)
            };
            drops += run.drops;
            pos += run.next_i - i0;
            if run.transit {
                // A key on the move: the slow path decides, or holds the walk here.
                let mut k = r.trace.queues[0].keys.get(run.next_i as usize).copied().unwrap_or(0);
                if self.owner.get(k as usize) == Some(&FLOWS) {
                    k = self.flow_key(r, k, run.next_i as usize);
                    let o = self.owner_of(k);
                    if o != TRANSIT {
                        // Settled: the rule's (or the entry's) owner takes it.
                        let mine = o == r.me;
                        let room = r.tail - r.head < cap;
                        if mine && room {
                            r.entries[(r.tail & (cap - 1)) as usize] = (loop_k << 32) | run.next_i;
                            r.tail += 1;
                        }
                        if let Some(c) = r.counts.get_mut(k as usize) {
                            *c += u64::from(mine);
                        }
                        drops += u64::from(mine && !room);
                        pos += 1;
                        continue;
                    }
                }
                let entry = (loop_k << 32) | run.next_i;
                let resolved = self.resolve(r, k, pos);
                if resolved != Some(false) && (resolved.is_none() || self.parked.iter().any(|p| p.0 == k)) {
                    // Ours, but the state is not here yet (or older packets of the key wait): hold it aside.
                    if self.park(r, k, entry) {
                        pos += 1;
                        continue;
                    }
                    r.stats.stalls += 1;
                    break;
                }
                match resolved {
                    Some(mine) => {
                        let room = r.tail - r.head < cap;
                        if mine && room {
                            r.entries[(r.tail & (cap - 1)) as usize] = (loop_k << 32) | run.next_i;
                            r.tail += 1;
                        }
                        drops += u64::from(mine && !room);
                        pos += 1;
                        continue;
                    }
                    None => {
                        r.stats.stalls += 1;
                        break;
                    }
                }
            }
            if run.stop {
                break;
            }
        }
        r.walked(pos, drops);
    }
}

/// What one run of the walk (within one loop of the stream) did.
struct WalkRun {
    next_i: u64,
    drops: u64,
    /// Stopped before `end_i`: ring target reached or not due yet.
    stop: bool,
    /// Stopped at `next_i`, a key on the move (not consumed).
    transit: bool,
}

/// The walk's inner loop over packets `i0..end_i` of loop `loop_k`: one key
/// and one owner load per packet, the ring slot written whenever the ring
/// has room and kept when owned (no unpredictable branch).
#[inline(always)]
fn walk_run<const PACED: bool>(
    q: &mut Ring,
    owner: &[u16],
    loop_k: u64,
    i0: u64,
    end_i: u64,
    due_ns: u64,
    target: u64,
) -> WalkRun {
    let d = &q.trace.queues[0];
    let keys = &d.keys[..];
    let ring = &mut q.entries[..];
    let cap = ring.len() as u64;
    let mask = cap - 1;
    let (head, mut tail) = (q.head, q.tail);
    let me = q.me;
    let shift = loop_k.saturating_mul(q.trace.loop_ns);
    let mut drops = 0u64;
    let mut i = i0;
    let mut stop = false;
    let mut transit = false;
    let counts = &mut q.counts[..];
    let base = loop_k << 32;
    if !PACED {
        // Full speed: the ring cannot overflow (target < capacity).
        let stop_at = head + target;
        let count = !counts.is_empty();
        for &k in keys.get(i0 as usize..end_i as usize).unwrap_or(&[]) {
            let o = owner.get(k as usize).copied().unwrap_or(TRANSIT);
            if o >= FLOWS {
                transit = true;
                break;
            }
            ring[(tail & mask) as usize] = base | i;
            tail += u64::from(o == me);
            if count {
                if let Some(c) = counts.get_mut(k as usize) {
                    *c += u64::from(o == me);
                }
            }
            i += 1;
            if tail >= stop_at {
                stop = true;
                break;
            }
        }
        q.tail = tail;
        return WalkRun { next_i: i, drops, stop, transit };
    }
    while i < end_i {
        if PACED && shift.saturating_add(d.ts_at(i as usize)) > due_ns {
            stop = true;
            break;
        }
        let k = keys.get(i as usize).copied().unwrap_or(0);
        let o = owner.get(k as usize).copied().unwrap_or(TRANSIT);
        if o >= FLOWS {
            transit = true;
            break;
        }
        let mine = o == me;
        if let Some(c) = counts.get_mut(k as usize) {
            *c += u64::from(mine);
        }
        let room = tail - head < cap;
        if room {
            // Full, the slot at the tail is the head's (a packet not yet delivered).
            ring[(tail & mask) as usize] = base | i;
        }
        tail += u64::from(mine & room);
        drops += u64::from(mine & !room);
        i += 1;
        if !PACED && tail - head >= target {
            stop = true;
            break;
        }
    }
    q.tail = tail;
    WalkRun { next_i: i, drops, stop, transit }
}

/// Delivers up to `want` packets in stream order (no steering needed).
fn direct_burst(r: &mut Ring, pool: &mut PacketPool, batch: &mut Batch, want: usize) -> Rx {
    let end = r.end.unwrap_or(u64::MAX);
    if r.scan >= end {
        r.steering.publish_progress(r.me as usize, u64::MAX, r.stats.packets);
        return Rx::Done;
    }
    let d = &r.trace.queues[0];
    let n = r.n;
    let mut loop_k = r.scan / n;
    let mut pos = (r.scan - loop_k * n) as usize;
    let (mut got, mut bytes) = (0usize, 0u64);
    while got < want && r.scan + (got as u64) < end {
        let chunk = (want - got).min(n as usize - pos).min((end - r.scan - got as u64) as usize);
        let (lines, first_line, len, hash) = (&d.lines, &d.first_line[pos..], &d.len[pos..], &d.hash[pos..]);
        let shift = loop_k.saturating_mul(r.trace.loop_ns);
        let k0 = pos;
        let k = batch.rx_burst_lines_timed(pool, chunk, d.times(k0, chunk, shift), |k| {
            if let Some(&ahead) = first_line.get(k + PREFETCH_AHEAD) {
                if let Some(l) = lines.get(ahead as usize) {
                    flowplane_packet::prefetch::read(l);
                }
            }
            let first = first_line[k] as usize;
            let l = len[k];
            bytes += u64::from(l);
            (&lines[first..first + Line::count_for(l as usize)], l, hash[k])
        });
        got += k;
        pos += k;
        if pos == n as usize {
            pos = 0;
            loop_k += 1;
        }
        if k < chunk {
            r.stats.pool_empty += 1;
            break;
        }
    }
    r.scan += got as u64;
    r.stats.scanned += got as u64;
    r.stats.packets += got as u64;
    r.stats.bytes += bytes;
    // Every burst: a move's switch point is computed from these positions.
    r.steering.publish_progress(r.me as usize, r.scan, r.stats.packets);
    if got > 0 {
        Rx::Packets(got)
    } else {
        Rx::Idle
    }
}
