//! The per-worker SCR processor: one core's private replica of the chain's
//! state, fast-forwarded over each packet's history before the unchanged NFs
//! run on the packet, logging and recovering per Algorithm 1 when recovery is on.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use flowplane_io::cpu::IdleBackoff;
use flowplane_io::scr::{ScrSide, Sequencer};
use flowplane_nf::stateful::{Granularity, ScrRecord};
use flowplane_nf::{NfContext, Pkt, PktMeta};
use flowplane_packet::{tsc, Batch, DROP, MAX_BATCH};

use super::log::{recover, Recovered, ScrLogs};
use super::report::ScrCoreReport;
use super::table::{KeyOf, ReplicaTable};
use crate::chain::{Chain, Stage};
use crate::stage::apply_action;
use crate::tap::Tap;

/// Batches between two samples of the fast-forward cost (two TSC reads per
/// packet when sampled, and the packet-by-packet path: rare enough not to
/// weigh on the figures it samples, thousands of samples a second).
const SAMPLE_EVERY: u64 = 256;

/// A sampled packet taking longer than this (cycles) was preempted or
/// waited (recovery, drift): left out of the per-packet cost figures.
const SAMPLE_MAX_CYCLES: u64 = 20_000;

/// Copies a replica state into a trace's buffer (the shorter of the two).
fn copy_into(buf: &mut [u8], st: &[u8]) {
    let n = buf.len().min(st.len());
    buf[..n].copy_from_slice(&st[..n]);
}

/// A packet of the batch in flight that the replica applies (SCR without
/// logs): its index, and the part of its history (`h[ff.0..ff.1]`) not yet
/// applied, fast-forwarded before it.
#[derive(Clone, Copy, Debug)]
pub struct Planned {
    /// Index in the batch.
    pub i: u32,
    /// History entries to fast-forward first (range in the packet's history).
    pub ff: (u32, u32),
}

/// What every NF's [`crate::stage::StatefulStage::scr_batch`] reads of a batch.
pub struct ScrBatch<'a> {
    /// The packets applied, in sequence order.
    pub plan: &'a [Planned],
    /// Every packet's history, `history` records each (packet i's at `i * history`), its own last.
    pub hist: &'a [ScrRecord],
    /// N.
    pub history: usize,
    /// Packet i's parse.
    pub metas: &'a [PktMeta],
    /// The worker's context (each packet runs at its record's time).
    pub ctx: &'a NfContext,
    /// The chain has one stateful NF: the history entries' survival
    /// (`alive`) is neither set up nor kept (an entry is live when valid).
    pub sole: bool,
    /// The records' times never go back ([`flowplane_io::scr::ScrSide::monotonic`]).
    pub monotonic: bool,
}

/// One core's private replica of the chain's state.
pub struct ScrReplica {
    core: usize,
    /// Per stage: its table (None for stateless stages).
    pub(super) tables: Vec<Option<ReplicaTable>>,
    seq: Arc<Sequencer>,
    logs: Option<Arc<ScrLogs>>,
    /// Highest sequence applied (`max[c]`).
    pub(super) max: u64,
    /// Highest sequence this core may log without waiting for the slowest (recovery on).
    bound: u64,
    /// The stream's last sequence number (bounded runs): the replica catches up to it at the end.
    end: Option<u64>,
    batches: u64,
    flush: Vec<ScrRecord>,
    /// Entries queued for fast-forward and their survival through the chain (capacity N, reused).
    ff: Vec<ScrRecord>,
    alive: Vec<bool>,
    /// NF-major batches (no logs): the packets applied, their parses and
    /// their history entries' survival (capacity MAX_BATCH, MAX_BATCH * N; reused).
    plan: Vec<Planned>,
    metas: Vec<PktMeta>,
    alive_batch: Vec<bool>,
    /// The chain has one stateful NF (see [`ScrBatch::sole`]).
    sole: bool,
    rep: ScrCoreReport,
}

impl ScrReplica {
    /// The replica with its (still empty) tables' hash keyed by the run's `secret`: the same on every
    /// replica, so they hold the same keys in the same slots; nobody without it can aim keys at one probe run.
    pub fn with_secret(mut self, secret: u32) -> ScrReplica {
        for t in self.tables.iter_mut().flatten() {
            t.map.set_secret(secret);
        }
        self
    }

    /// A replica for `core` of `chain` (checked with [`super::refusal`]), exactly `flows`
    /// keys per NF table, idle timeouts from the NFs or `default_timeout_ns`.
    pub fn new(
        core: usize,
        chain: &Chain,
        flows: usize,
        default_timeout_ns: u64,
        seq: Arc<Sequencer>,
        logs: Option<Arc<ScrLogs>>,
        end: Option<u64>,
    ) -> Result<ScrReplica, flowplane_table::TableError> {
        let tables = chain
            .stages
            .iter()
            .map(|s| match s {
                Stage::Stateful { nf, .. } => {
                    let key_of = match nf.granularity() {
                        Granularity::SrcIp => KeyOf::Src,
                        Granularity::DstIp => KeyOf::Dst,
                        _ if nf.both_directions() => KeyOf::Connection,
                        _ => KeyOf::Flow,
                    };
                    let t = nf.idle_timeout_ns().or(chain.idle_timeout_ns).unwrap_or(default_timeout_ns);
                    ReplicaTable::new(key_of, flows, nf.state_size(), t).map(Some)
                }
                Stage::Stateless(_) => Ok(None),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let h = seq.history();
        Ok(ScrReplica {
            core,
            tables,
            seq,
            logs,
            max: 0,
            bound: 0,
            end,
            batches: 0,
            flush: vec![ScrRecord::default(); h],
            ff: Vec::with_capacity(h.max(64)),
            alive: Vec::with_capacity(h.max(64)),
            plan: Vec::with_capacity(MAX_BATCH),
            metas: Vec::with_capacity(MAX_BATCH),
            alive_batch: Vec::with_capacity(MAX_BATCH * h.max(1)),
            sole: chain.stages.iter().filter(|s| matches!(s, Stage::Stateful { .. })).count() == 1,
            rep: ScrCoreReport { core, ..Default::default() },
        })
    }

    /// Queues one history entry for fast-forwarding.
    #[inline(always)]
    pub(super) fn apply(&mut self, r: &ScrRecord) {
        self.ff.push(*r);
    }

    /// Fast-forwards the queued entries (recovered ones).
    #[inline]
    pub(super) fn run_ff(&mut self, chain: &mut Chain) {
        if self.ff.is_empty() {
            return;
        }
        let ff = std::mem::take(&mut self.ff);
        self.ff_over(chain, &ff);
        self.ff = ff;
        self.ff.clear();
    }

    /// Fast-forwards `recs` in order: each NF over all of them, the next
    /// NF over those the previous ones passed (the same result as entry by
    /// entry through the chain: an NF's state sees only its own sequence of
    /// surviving entries). One monomorphised loop per NF.
    #[inline]
    fn ff_over(&mut self, chain: &mut Chain, recs: &[ScrRecord]) {
        if recs.is_empty() {
            return;
        }
        self.rep.fast_forwarded += recs.len() as u64;
        self.alive.clear();
        self.alive.extend(recs.iter().map(|r| r.valid()));
        for (s, t) in chain.stages.iter_mut().zip(self.tables.iter_mut()) {
            if let (Stage::Stateful { nf, .. }, Some(t)) = (s, t.as_mut()) {
                nf.scr_fast_forward(t, recs, &mut self.alive);
            }
        }
    }

    /// Logs sequences `first..=seq` (`recs`, in order) in this core's log,
    /// waiting first for the slowest core when `seq` is past the bound
    /// (Algorithm 1's logging, gap already handled).
    fn log_entries(&mut self, logs: &ScrLogs, seq: u64, first: u64, recs: &[ScrRecord]) {
        if seq > self.bound {
            self.wait_for_slowest(logs, seq);
        }
        let log = logs.log(self.core);
        log.begin(seq);
        for (k, r) in (first..=seq).zip(recs) {
            log.put(k, r);
        }
        log.publish(seq);
        log.resolved.store(seq, Ordering::Release);
    }

    /// Without logs, sequences `from..minseq` (before `seq`) cannot be recovered: counted.
    fn count_unrecovered_gap(&mut self, from: u64, minseq: u64, seq: u64) {
        let g = minseq.min(seq) - from;
        self.rep.gaps += g;
        self.rep.unrecovered += g;
    }

    /// Brings the replica up to just before `seq` from the history `h`
    /// (oldest first, `seq`'s own record last), logging and recovering per
    /// Algorithm 1 when logs are on. `seq` itself is logged, not applied.
    fn catch_up(&mut self, chain: &mut Chain, seq: u64, h: &[ScrRecord]) {
        let n = h.len() as u64;
        let minseq = seq.saturating_sub(n - 1).max(1);
        let from = self.max + 1;
        let first = from.max(minseq);
        // Sequence k sits at h[n - 1 - (seq - k)].
        let at = |k: u64| (n - 1 - (seq - k)) as usize;
        // Taken, not cloned: an Arc clone per packet would bounce its count between cores.
        if self.logs.as_ref().is_some_and(|l| l.logs.len() == 1) {
            // Algorithm 1 with no other core: every gap is lost everywhere,
            // and nobody would read the log: not written.
            if minseq > from {
                self.rep.gaps += minseq - from;
                self.rep.lost_everywhere += minseq - from;
            }
        } else if let Some(logs) = self.logs.take() {
            let log = logs.log(self.core);
            // Algorithm 1 lines 6-14 in order: the gap is marked LOST (max
            // raised, nothing written) and each of its entries recovered
            // from the other logs, then the packet's entries are logged.
            if minseq > from {
                log.publish(minseq - 1);
                for k in from..minseq {
                    if self.ff.len() == self.ff.capacity() {
                        self.run_ff(chain);
                    }
                    // Reading k: the others must not overwrite it yet.
                    log.resolved.store(k - 1, Ordering::Release);
                    self.rep.gaps += 1;
                    match recover(&logs, self.core, k) {
                        Recovered::Rec(r) => {
                            self.rep.recovered += 1;
                            self.apply(&r);
                        }
                        Recovered::LostEverywhere => self.rep.lost_everywhere += 1,
                        Recovered::Unrecoverable => self.rep.unrecovered += 1,
                    }
                }
                log.resolved.store(minseq - 1, Ordering::Release);
            }
            self.log_entries(&logs, seq, first, &h[at(first)..]);
            self.logs = Some(logs);
            self.run_ff(chain);
        } else if minseq > from {
            self.count_unrecovered_gap(from, minseq, seq);
        }
        if first < seq {
            self.ff_over(chain, &h[at(first)..at(seq)]);
        }
        self.max = self.max.max(seq);
    }

    /// Runs the chain over a batch delivered with its SCR side arrays:
    /// per packet, fast-forward, then every NF's action on it. With a
    /// `tap` armed (`flowplane ctl trace|capture|profile`) the batch runs
    /// packet by packet and the tap sees each of this core's packets after
    /// each NF, with a traced packet's state in the replica before and after
    /// the NF ran it (the other cores' packets fast-forwarded into the
    /// replica are not this core's: they are not observed).
    pub fn process(
        &mut self,
        chain: &mut Chain,
        batch: &mut Batch,
        side: ScrSide<'_>,
        ctx: &NfContext,
        mut tap: Option<&mut Tap>,
    ) {
        let n = batch.len().min(side.seqs.len());
        let hn = side.history;
        self.batches += 1;
        self.rep.seq_cycles = side.cycles;
        let sample = self.batches.is_multiple_of(SAMPLE_EVERY);
        if let Some(t) = tap.as_deref_mut() {
            self.metas.clear();
            self.metas.extend((0..batch.len()).map(|i| PktMeta::parse(batch.data(i))));
            t.begin(batch, &self.metas);
        } else if !sample && (self.logs.is_none() || self.no_gaps(&side, n)) {
            return self.process_nf_major(chain, batch, side, ctx);
        }
        for i in 0..n {
            let s = side.seqs[i];
            let h = &side.hist[i * hn..(i + 1) * hn];
            if s <= self.max {
                // A sequence number at or below what the replica has applied
                // (a reordered or duplicated delivery): it cannot be replayed exactly; counted.
                self.rep.unrecovered += 1;
                continue;
            }
            self.rep.own += 1;
            let r = h[hn - 1];
            if sample {
                let t0 = tsc::rdtsc();
                self.catch_up(chain, s, h);
                let t1 = tsc::rdtsc();
                self.own_packet(chain, batch, i, &r, ctx, tap.as_deref_mut());
                let t2 = tsc::rdtsc();
                // A sample the thread was preempted in says nothing about the work: dropped.
                if t2.saturating_sub(t0) < SAMPLE_MAX_CYCLES {
                    self.rep.ff_cycles_sampled += t1.saturating_sub(t0);
                    self.rep.own_cycles_sampled += t2.saturating_sub(t1);
                    self.rep.ff_packets_sampled += 1;
                }
            } else {
                self.catch_up(chain, s, h);
                self.own_packet(chain, batch, i, &r, ctx, tap.as_deref_mut());
            }
        }
        if let Some(t) = tap {
            t.finish(batch);
        }
    }

    /// Whether the batch's packets follow the replica's sequence with no
    /// gap and no reordering (each packet's history reaches back to what is applied).
    fn no_gaps(&self, side: &ScrSide<'_>, n: usize) -> bool {
        let hn = side.history as u64;
        let mut max = self.max;
        for &s in &side.seqs[..n] {
            if s <= max || s.saturating_sub(hn - 1).max(1) > max + 1 {
                return false;
            }
            max = s;
        }
        true
    }

    /// [`Self::process`] NF by NF: the sequence bookkeeping of
    /// `catch_up` for every packet first, then each NF over the whole batch
    /// in sequence order (each packet's unapplied history, then the packet)
    /// in one monomorphised call. The same result as packet by packet: an
    /// NF's state sees only its own sequence of surviving entries and
    /// packets, and that sequence does not depend on the order in which the
    /// NFs take their turns. Sampled batches take the packet-by-packet path
    /// (it times fast-forward and own packet apart).
    ///
    /// With logs (recovery on) only for a batch [`Self::no_gaps`] passes:
    /// each packet's entries are logged (and the core waits for the slowest,
    /// as in `catch_up`) in the bookkeeping pass, before any NF runs; a
    /// batch with a gap or a reordered packet takes the packet-by-packet path
    /// (Algorithm 1 applies recovered entries in order).
    fn process_nf_major(&mut self, chain: &mut Chain, batch: &mut Batch, side: ScrSide<'_>, ctx: &NfContext) {
        let hn = side.history;
        let n = batch.len().min(side.seqs.len()).min(MAX_BATCH).min(side.hist.len() / hn.max(1));
        // Logging (recovery on, several cores): the batch has no gap
        // (`no_gaps`), so it logs one contiguous range of sequences, up to
        // its last packet's `hi`: the core waits for the slowest once (for
        // `hi`), opens the seqlock once, writes each packet's entries in the
        // bookkeeping pass, and publishes `max` and its resolved mark at the
        // end (a core about to wait publishes what it has written first:
        // `wait_for_slowest`). Waiting for a whole batch ahead keeps the
        // deadlock argument of `wait_for_slowest` when the log's spare room
        // is at least twice the batch's entries; a shorter log logs packet
        // by packet (`log_entries`).
        // Taken, not cloned: an Arc clone per batch would bounce its count between cores.
        let (mut logs, mut per_packet) = (None, None);
        match self.logs.take() {
            Some(l) if l.logs.len() > 1 && n > 0 => {
                let room = (l.log(self.core).entries() as u64).saturating_sub(hn as u64);
                if room >= 2 * (n * hn) as u64 {
                    let hi = side.seqs[n - 1].max(self.max);
                    if hi > self.bound {
                        self.wait_for_slowest(&l, hi);
                    }
                    l.log(self.core).begin(hi);
                    logs = Some(l);
                } else {
                    per_packet = Some(l);
                }
            }
            other => self.logs = other,
        }
        self.plan.clear();
        self.metas.clear();
        self.alive_batch.clear();
        if !self.sole {
            self.alive_batch.extend(side.hist[..n * hn].iter().map(|r| r.valid()));
        }
        for i in 0..n {
            let s = side.seqs[i];
            if s <= self.max {
                // Reordered or duplicated: cannot be replayed exactly; counted (as in `process`).
                self.rep.unrecovered += 1;
                self.metas.push(PktMeta::default());
                continue;
            }
            self.rep.own += 1;
            // `catch_up` without logs: a gap is unrecoverable; the rest of the history is fast-forwarded.
            let minseq = s.saturating_sub(hn as u64 - 1).max(1);
            let from = self.max + 1;
            if minseq > from {
                self.count_unrecovered_gap(from, minseq, s);
            }
            let first = from.max(minseq);
            let at = |k: u64| (hn as u64 - 1 - (s - k)) as u32;
            let ff = if first < s { (at(first), at(s)) } else { (0, 0) };
            self.rep.fast_forwarded += u64::from(ff.1 - ff.0);
            if let Some(l) = &logs {
                // `catch_up`'s logging (no gap here: `no_gaps`), the seqlock open, the wait done.
                let log = l.log(self.core);
                for (k, r) in (first..).zip(&side.hist[i * hn + at(first) as usize..(i + 1) * hn]) {
                    log.put(k, r);
                }
            } else if let Some(l) = &per_packet {
                self.log_entries(l, s, first, &side.hist[i * hn + at(first) as usize..(i + 1) * hn]);
            }
            self.plan.push(Planned { i: i as u32, ff });
            self.max = s;
            self.metas.push(PktMeta::parse(batch.data(i)));
        }
        if let Some(l) = logs {
            let log = l.log(self.core);
            log.publish(self.max);
            log.resolved.store(self.max, Ordering::Release);
            self.logs = Some(l);
        } else if per_packet.is_some() {
            self.logs = per_packet;
        }
        for (st, t) in chain.stages.iter_mut().zip(self.tables.iter_mut()) {
            match (st, t.as_mut()) {
                (Stage::Stateless(nf), _) => {
                    for p in &self.plan {
                        let i = p.i as usize;
                        if batch.verdicts()[i] != DROP {
                            let c = NfContext { now_ns: side.hist[i * hn + hn - 1].ts_ns(), ..*ctx };
                            nf.process(batch, i..i + 1, &c);
                        }
                    }
                }
                (Stage::Stateful { nf, counters, .. }, Some(t)) => {
                    let b = ScrBatch {
                        plan: &self.plan,
                        hist: side.hist,
                        history: hn,
                        metas: &self.metas,
                        ctx,
                        sole: self.sole,
                        monotonic: side.monotonic,
                    };
                    nf.scr_batch(t, &b, &mut self.alive_batch, batch, counters)
                }
                (Stage::Stateful { .. }, None) => {}
            }
        }
    }

    /// Tests: the packet of sequence `seq` arrives with history `h`; its own
    /// record goes through the transitions (not `process`), as in a replica
    /// that only fast-forwards.
    #[cfg(test)]
    pub(super) fn step_record(&mut self, chain: &mut Chain, seq: u64, h: &[ScrRecord]) {
        self.catch_up(chain, seq, h);
        self.apply(&h[h.len() - 1]);
        self.run_ff(chain);
    }

    /// The core's own packet: each NF's unchanged action, in chain order, with the sequencer's time.
    #[inline]
    fn own_packet(
        &mut self,
        chain: &mut Chain,
        batch: &mut Batch,
        i: usize,
        r: &ScrRecord,
        ctx: &NfContext,
        mut tap: Option<&mut Tap>,
    ) {
        let c = NfContext { now_ns: r.ts_ns(), ..*ctx };
        let meta = PktMeta::parse(batch.data(i));
        for (si, (s, t)) in chain.stages.iter_mut().zip(self.tables.iter_mut()).enumerate() {
            if batch.verdicts()[i] == DROP {
                break;
            }
            match (s, t.as_mut()) {
                (Stage::Stateless(nf), _) => nf.process(batch, i..i + 1, &c),
                (Stage::Stateful { nf, counters, .. }, Some(t)) => {
                    counters.packets_in += 1;
                    counters.bytes_in += u64::from(batch.lens()[i]);
                    let mut at = None;
                    let action = if !r.valid() || !meta.valid {
                        nf.on_unparsed()
                    } else if let Some(slot) = t.lookup(t.key_of.key(r), c.now_ns) {
                        let st = t.state(slot.at);
                        at = Some(slot.at);
                        // A traced packet: the replica's state before it (none for a key new here).
                        if let Some(mut ss) = tap.as_deref_mut().and_then(|t| t.state_slot(i, si, false)) {
                            copy_into(ss.buf(), st);
                            ss.set(!slot.fresh);
                        }
                        if slot.fresh {
                            nf.scr_init_bytes(r, &c, st);
                        }
                        let mut pkt = Pkt::new(batch.data_mut(i), &meta);
                        nf.process_bytes(&mut pkt, st, &c)
                    } else {
                        // Table full on every core alike: counted, and judged as the NF says
                        // (`passes_without_state`, which the other replicas' fast-forward uses).
                        t.refuse();
                        nf.on_no_state()
                    };
                    apply_action(batch, i, action, counters);
                    if let Some(tp) = tap.as_deref_mut() {
                        tp.after(si, batch, i..i + 1);
                        if let (Some(at), Some(mut ss)) = (at, tp.state_slot(i, si, true)) {
                            copy_into(ss.buf(), t.state(at));
                            ss.set(true);
                        }
                    }
                    continue;
                }
                (Stage::Stateful { .. }, None) => {}
            }
            if let Some(tp) = tap.as_deref_mut() {
                tp.after(si, batch, i..i + 1);
            }
        }
    }

    /// The end of the run. With logs (recovery on): the core claims the
    /// last sequence number it knows the sequencer emitted (the stream's end
    /// when its queue ran to it, else its own highest), waits until every
    /// core has stopped receiving, and catches up to the highest claim from
    /// the other cores' logs (Algorithm 1: its gap marked LOST, each entry
    /// recovered, lost everywhere, or reported unrecovered). Algorithm 1
    /// assumes a later packet reveals every loss; at the end of a run the
    /// claim is that packet, so a loss burst reaching the end is recovered or
    /// reported like any other. Without logs: a bounded run that ran to its
    /// end catches up from the sequencer's final history (a lossless
    /// control message; earlier gaps stay counted as unrecovered); a run
    /// stopped by time is left where it is (not comparable).
    ///
    /// A streaming sequencer (ports) has no end until its stream stops;
    /// the dispatcher stops before its workers end, so by now the end it
    /// left is the run's ([`Sequencer::end`]).
    pub fn finish(&mut self, chain: &mut Chain, ran_to_end: bool) {
        if self.end.is_none() {
            self.end = self.seq.end();
        }
        if let Some(logs) = self.logs.clone() {
            let claim = match self.end {
                Some(e) if ran_to_end => e,
                _ => self.max,
            };
            let me = logs.log(self.core);
            me.claim.store(claim + 1, Ordering::Release);
            // Until every other core has claimed: catch up to what the
            // others have published so far (no more than any of them will
            // claim), so this core's resolved mark keeps pace with them
            // and a core still receiving never waits for it
            // (`wait_for_slowest` waits for a claimed core until it is done)
            // nor writes over what it has yet to read. No time limit: a
            // descheduled core comes back; only a core gone without
            // finishing (its worker ended early) is not waited for.
            let mut backoff = IdleBackoff::default();
            let all = loop {
                let (mut target, mut all, mut gone) = (claim, true, false);
                for (_, l) in logs.logs.iter().enumerate().filter(|&(c, _)| c != self.core) {
                    // `gone` first: a core that claims and then goes has its claim seen with it.
                    let went = l.gone.load(Ordering::Acquire);
                    match l.claim.load(Ordering::Acquire) {
                        0 if went => gone = true,
                        0 => {
                            all = false;
                            target = target.max(l.max.load(Ordering::Acquire));
                        }
                        c => target = target.max(c - 1),
                    }
                }
                if target > self.max {
                    self.catch_up_gap(chain, &logs, target);
                    backoff.busy();
                }
                if all || gone {
                    break all && !gone;
                }
                backoff.idle();
            };
            // Comparable when every core's claim was seen (all catch up to the same target).
            self.end = all.then_some(self.max);
            me.done.store(true, Ordering::Release);
            return;
        }
        if !ran_to_end {
            self.end = None;
        }
        if let Some(end) = self.end.filter(|&e| e > self.max) {
            let mut h = std::mem::take(&mut self.flush);
            self.seq.fill(end, &mut h);
            self.catch_up(chain, end, &h);
            // The last sequence is nobody's own packet here: apply it too.
            self.apply(&h[h.len() - 1]);
            self.run_ff(chain);
            self.flush = h;
        }
    }

    /// Keeps this core's log from overwriting entries a slower core may
    /// still recover: logging `seq` waits until every other core not done
    /// (still receiving, or catching up at the end: `finish`) has resolved
    /// (received or recovered) everything up to
    /// `seq - (L - N)` (L log entries, N history). The bound is re-read only
    /// when `seq` passes it (a few times per log length), so a core well
    /// within it pays one compare per packet.
    ///
    /// No deadlock (L >= 2N): a core waits here only after resolving its
    /// gap, so its max and resolved mark are at least `seq - N`. A core
    /// recovering `k` waits only for a core C whose max is below `k`; if C
    /// waits here, C's seq exceeds `k - 1 + L - N`, so its max is at least
    /// `k`: C does not hold `k` back. Two cores waiting here for each other
    /// would each be more than `L - N` ahead of the other's `seq - N`:
    /// impossible. Recoveries cannot wait in a cycle either (each waits
    /// for a lower max). A claimed core catches up to every other core's
    /// published max (`finish`), and a core publishes before it waits here:
    /// it does not hold a waiting core back either. So the wait has no time
    /// limit (a limit made a descheduled core's entries be overwritten: the
    /// replicas then diverged under load); only a core gone without
    /// finishing is not waited for.
    #[cold]
    fn wait_for_slowest(&mut self, logs: &ScrLogs, seq: u64) {
        let log = logs.log(self.core);
        // A batch publishes at its end: what is written so far (everything
        // up to `max`, contiguous) is published before waiting, so a core
        // recovering from this log or bounded by its resolved mark is never
        // held back by it (the argument below).
        if log.max.load(Ordering::Relaxed) < self.max {
            log.publish(self.max);
        }
        if log.resolved.load(Ordering::Relaxed) < self.max {
            log.resolved.store(self.max, Ordering::Release);
        }
        let nh = self.seq.history() as u64;
        let room = (log.entries() as u64).saturating_sub(nh).max(nh);
        // Once waiting, wait until the slowest is half the spare room
        // closer (the bound still leaves N: the argument above holds):
        // few long waits rather than a lockstep of short ones.
        let hyst = (room - nh.min(room)) / 2;
        let t0 = tsc::rdtsc();
        let mut spins = 0u64;
        loop {
            let slowest = logs
                .logs
                .iter()
                .enumerate()
                .filter(|&(c, l)| c != self.core && l.active())
                .map(|(_, l)| l.resolved.load(Ordering::Acquire))
                .min()
                .unwrap_or(u64::MAX);
            let bound = slowest.saturating_add(room);
            let now = tsc::rdtsc();
            let need = if spins == 0 { seq } else { seq.saturating_add(hyst) };
            if need <= bound {
                self.bound = bound.max(seq);
                if spins > 0 {
                    self.rep.drift_waits += 1;
                    self.rep.drift_wait_cycles += now.saturating_sub(t0);
                }
                return;
            }
            spins += 1;
            if spins > 4096 {
                // A long wait: the slowest core is likely descheduled and
                // may need this CPU (more threads than CPUs): sleep.
                std::thread::sleep(std::time::Duration::from_micros(50));
            } else if spins.is_multiple_of(256) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// Catches up to `target` with no packet in hand (the end of a run):
    /// every sequence after `max` is a gap, marked LOST, then recovered.
    fn catch_up_gap(&mut self, chain: &mut Chain, logs: &ScrLogs, target: u64) {
        let log = logs.log(self.core);
        let from = self.max + 1;
        log.publish(target);
        for k in from..=target {
            if self.ff.len() == self.ff.capacity() {
                self.run_ff(chain);
            }
            log.resolved.store(k - 1, Ordering::Release);
            self.rep.gaps += 1;
            match recover(logs, self.core, k) {
                Recovered::Rec(r) => {
                    self.rep.recovered += 1;
                    self.apply(&r);
                }
                Recovered::LostEverywhere => self.rep.lost_everywhere += 1,
                Recovered::Unrecoverable => self.rep.unrecovered += 1,
            }
        }
        log.resolved.store(target, Ordering::Release);
        self.run_ff(chain);
        self.max = target;
    }

    /// The flow-table figures of the run's state, which under scr is the
    /// replica's (the executor's own tables stay empty): `base` with its
    /// entries, capacity, insertions, expiries, table-full and flows replaced.
    pub fn store_report(&self, mut base: crate::exec::StoreReport) -> crate::exec::StoreReport {
        let sum = |f: fn(&ReplicaTable) -> u64| -> u64 { self.tables.iter().flatten().map(f).sum() };
        base.entries = sum(|t| t.len() as u64);
        base.capacity = sum(|t| t.capacity() as u64);
        base.insertions = sum(|t| t.insertions);
        base.expiries = sum(|t| t.expiries);
        base.table_full = sum(|t| t.refused);
        if let Some(f) = self.flows() {
            base.flows = f;
        }
        base
    }

    /// The replica's report (digest of the final state).
    pub fn report(&self, chain: &Chain, lost: u64) -> ScrCoreReport {
        let mut r = self.rep.clone();
        r.reached_end = self.end.is_some_and(|e| self.max >= e);
        r.max_seq = self.max;
        r.lost = lost;
        let own = chain.stages.iter().map(|s| match s {
            Stage::Stateful { nf, .. } => nf.scr_digest(),
            Stage::Stateless(_) => 0,
        });
        r.digest = self
            .tables
            .iter()
            .flatten()
            .map(ReplicaTable::digest)
            .chain(own)
            .fold(0xcbf2_9ce4_8422_2325u64, |d, x| (d ^ x).wrapping_mul(0x100_0000_01b3));
        let sum = |f: fn(&ReplicaTable) -> u64| self.tables.iter().flatten().map(f).sum();
        r.table_full = sum(|t| t.refused);
        r.sweeps = sum(|t| t.sweeps);
        r.entries = sum(|t| t.len() as u64);
        r.insertions = sum(|t| t.insertions);
        r.expiries = sum(|t| t.expiries);
        r.capacity = sum(|t| t.capacity() as u64);
        r
    }
}

impl Drop for ScrReplica {
    /// A replica dropped before its `finish` (its worker ended early) tells
    /// the other cores not to wait for its log any more.
    fn drop(&mut self) {
        if let Some(logs) = &self.logs {
            logs.log(self.core).gone.store(true, Ordering::Release);
        }
    }
}
