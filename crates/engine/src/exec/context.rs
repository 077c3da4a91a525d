//! The explicit context every executor works over: the compiled chain, the
//! per-core flow stores, the shared (coarse) tables, the per-batch scratch
//! arrays and the counters — plus the steps executors compose: lookups with
//! add-on-miss, the coarse-state path (written once here), the staged NF
//! pass, end of flow, expiry and export.

// Per-packet arrays (metas, flows, handles, the batch) are walked together by index.
#![allow(clippy::needless_range_loop)]

use std::ops::Range;

use flowplane_nf::ipfix::EndReason;
use flowplane_nf::stateful::{is_idle, Action, Granularity};
use flowplane_nf::{Export, NfContext, NfCounters, Pkt, PktMeta};
use flowplane_packet::{Batch, MAX_BATCH};
use flowplane_table::shared::{SharedFlowTable, SharedHandle};
use flowplane_table::{FullPolicy, TableStats, Upsert, INVALID_HANDLE};
use flowplane_wire::flow::{FiveTuple, FiveTupleV4};
use flowplane_wire::hash::HashableKey;

use super::{ExecConfig, StateLayout, StoreReport, TopSources};
use crate::chain::{Chain, IdleSlot, Stage};
use crate::coarse::{
    aux_handle, aux_refused_bits, coarse_hash, group_key, handle_bits, key_tuple, touch_shared, with_locked, ClockSlot,
    GroupLayout, SharedClock, SharedStores,
};
use crate::error::EngineError;
use crate::frag::{FragTable, Judged};
use crate::stage::{apply_action, arrive, packet_ctx, BatchOutcome, StatefulStage};
use crate::store::{FlowRef, FlowStore, StoreConfig};

/// Packets ahead at which the prefetch hook runs.
pub(crate) const PREFETCH_AHEAD: usize = 4;

/// Per-batch scratch arrays, allocated once (no allocation per batch).
pub struct Scratch {
    /// Parsed metadata of each packet (filled before the executor runs).
    pub metas: Box<[PktMeta; MAX_BATCH]>,
    /// Each packet's flow entry in the aggregated store.
    pub flows: Box<[FlowRef; MAX_BATCH]>,
    /// Per coarse group: each packet's pinned shared entry.
    pub coarse: Vec<[SharedHandle; MAX_BATCH]>,
    /// The executor pinned packet i's coarse entries itself (to release after the chain).
    coarse_pinned: Box<[bool; MAX_BATCH]>,
    /// Flows seen in the current segment (see [`ExecContext::segment_end`]).
    seen: SeenSet,
    keys: Box<[FiveTupleV4; MAX_BATCH]>,
    hashes: Box<[u64; MAX_BATCH]>,
    idx: Box<[u16; MAX_BATCH]>,
    handles: Box<[u32; MAX_BATCH]>,
    /// Each gathered key's packet time (idle checks on lookup are per packet).
    times: Box<[u64; MAX_BATCH]>,
    /// The run's flow-table hash secret ([`ExecConfig::hash_seed`]), read from here once per key.
    pub(crate) seed: u32,
}

impl Scratch {
    /// Queues packet `i`'s IPv4 key as the `m`-th of a bulk lookup; returns the new count.
    #[inline(always)]
    fn gather_v4(&mut self, m: usize, i: usize, k: FiveTupleV4, ts: u64) -> usize {
        self.keys[m] = k;
        self.hashes[m] = k.hash64(self.seed);
        self.idx[m] = i as u16;
        self.times[m] = ts;
        m + 1
    }

    /// Drops from the first `len` gathered keys those whose packet `dropped`
    /// says is dropped (order kept); returns how many remain.
    #[inline]
    fn retain_gathered(&mut self, len: usize, dropped: impl Fn(usize) -> bool) -> usize {
        let mut w = 0;
        for j in 0..len {
            if dropped(self.idx[j] as usize) {
                continue;
            }
            if w != j {
                self.keys[w] = self.keys[j];
                self.hashes[w] = self.hashes[j];
                self.idx[w] = self.idx[j];
                self.times[w] = self.times[j];
            }
            w += 1;
        }
        w
    }

    fn new(groups: usize, seed: u32) -> Self {
        Scratch {
            metas: Box::new([PktMeta::default(); MAX_BATCH]),
            flows: Box::new([FlowRef::NONE; MAX_BATCH]),
            coarse: vec![[SharedHandle::NONE; MAX_BATCH]; groups],
            coarse_pinned: Box::new([false; MAX_BATCH]),
            seen: SeenSet::new(),
            keys: Box::new([FiveTupleV4::default(); MAX_BATCH]),
            hashes: Box::new([0; MAX_BATCH]),
            idx: Box::new([0; MAX_BATCH]),
            handles: Box::new([0; MAX_BATCH]),
            times: Box::new([0; MAX_BATCH]),
            seed,
        }
    }
}

/// A set of flow entries, emptied in O(1) by bumping a stamp: which flows a
/// batch segment already holds (the interleaved executor: which flows a
/// batch already stepped).
pub(crate) struct SeenSet {
    slots: Box<[(u32, u32); SEEN_SLOTS]>,
    stamp: u32,
}

/// Twice the largest batch: open addressing stays short.
const SEEN_SLOTS: usize = 2 * MAX_BATCH;

impl SeenSet {
    pub(crate) fn new() -> Self {
        SeenSet { slots: Box::new([(0, 0); SEEN_SLOTS]), stamp: 0 }
    }

    pub(crate) fn clear(&mut self) {
        self.stamp = self.stamp.wrapping_add(1);
        if self.stamp == 0 {
            // Stamp wrapped: forget every old entry for real.
            self.slots.fill((0, 0));
            self.stamp = 1;
        }
    }

    /// Adds `id`; false if it was already there.
    pub(crate) fn insert(&mut self, id: u32) -> bool {
        let mut at = (id.wrapping_mul(0x9e37_79b1) >> 23) as usize % SEEN_SLOTS;
        loop {
            let (k, st) = self.slots[at];
            if st != self.stamp {
                self.slots[at] = (id, self.stamp);
                return true;
            }
            if k == id {
                return false;
            }
            at = (at + 1) % SEEN_SLOTS;
        }
    }
}

/// How batches are cut so that flow ends take effect at their packet.
///
/// Stage by stage over a segment, an NF that ends a flow stops at that
/// packet (the segment's frontier) and the later NFs stop there too; the
/// flow is removed (its state released) before anything runs past it. NFs
/// before the ending one have run further: that is exact when none of them
/// holds resources an end releases (their per-flow state is private, and a
/// later packet of the ended flow starts a new segment), so only chains
/// with such an NF before an ending one run packet by packet.
#[derive(Clone, Copy, Debug, Default)]
struct ExactEnds {
    /// Some 5-tuple NF may end flows: a flow seen twice starts a new segment.
    repeats: bool,
    /// An NF with a release callback runs before an NF that ends flows.
    per_packet: bool,
}

/// Counters the context keeps for the report.
#[derive(Clone, Copy, Debug, Default)]
pub struct ExecStats {
    /// Flows ended by an NF.
    pub ended: u64,
    /// Entries removed because an NF refused the flow on its first packet ([`Action::Refuse`]): not
    /// insertions, not ended.
    pub refused: u64,
    /// Packets without a flow key.
    pub unparsed: u64,
    /// Lookups in the shared tables (aux off: one per packet per group).
    pub shared_lookups: u64,
    /// Packets that reached coarse state by a direct shared lookup because
    /// the 5-tuple table had no entry for them (it was full).
    pub aux_fallbacks: u64,
    /// Entries handed over to another core, and taken over from one (`exec/migrate`).
    pub moved_out: u64,
    pub moved_in: u64,
    /// Coarse NF states found idle past their NF's timeout by their stamp
    /// (`chain::IdleSlot`) and reset in place.
    pub state_resets: u64,
}

/// Expiry pacing: time of the last sweep step, entries to sweep, sweep period.
/// The IPFIX active-timeout walk: every live flow is reported once per
/// `period_ns` of packet time, paced like the expiry sweep.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ActiveSweep {
    period_ns: u64,
    last_ns: u64,
}

struct Sweep {
    /// Packet time up to which the sweep has done its work.
    last_ns: u64,
    /// Slab entries of one full pass (the table's capacity).
    entries: u64,
    /// Time of one full pass: [`sweep_period_ns`].
    period_ns: u64,
}

/// The sweep period's floor for timeouts past 10 s: one second.
const SWEEP_FLOOR_NS: u64 = 1_000_000_000;

/// Time in which the sweep visits every entry of a table once: a tenth of
/// the idle timeout, but at least one second, and never more than a quarter
/// of the timeout (so `timeout/4` below 4 s, 1 s up to 10 s, `timeout/10`
/// beyond). An idle flow is therefore expired at most
/// `timeout + sweep_period_ns(timeout)` (plus the gap to the next batch)
/// after its last packet, whatever the table's size or load; a packet of a
/// flow idle past its timeout finds fresh state in any case (the idle check
/// on lookup). The period grows with the timeout because every visit reads
/// an entry from memory: a 4M-entry table swept every second with an hour's
/// timeout cost ~5% of a core's packet rate (`bench pipeline`, 4M flows),
/// for a bound that a 10% lag already gives.
pub fn sweep_period_ns(timeout_ns: u64) -> u64 {
    (timeout_ns / 10).max(SWEEP_FLOOR_NS).min(timeout_ns / 4).max(1)
}

/// One core's chain with its state, as executors see it.
pub struct ExecContext {
    /// Settings.
    pub cfg: ExecConfig,
    /// Where 5-tuple state lives.
    pub layout: StateLayout,
    /// The compiled chain.
    pub chain: Chain,
    /// The aggregated store (`Aggregated`) or one store per 5-tuple stage in chain order (`PerNf`).
    pub stores: Vec<FlowStore>,
    /// The coarse groups' tables, shared with the other cores.
    pub shared: SharedStores,
    /// Per-batch arrays.
    pub scratch: Scratch,
    /// Counters.
    pub stats: ExecStats,
    /// The aggregated block spans more than the entry's first cache line.
    multi_line: bool,
    sweep: Sweep,
    /// IPFIX active timeout (None: off or no NF exports flows).
    active: Option<ActiveSweep>,
    /// Where the active-timeout walk resumes in each store (IPv4, IPv6 positions).
    active_at: Vec<(u32, u32)>,
    exact: ExactEnds,
    /// Per stage: packets of the current batch it has run (see `run_stages`).
    pub(crate) progress: Vec<usize>,
    /// Packets (bits) whose flow an NF ended that not every stage has run yet.
    pending_ends: [u64; 4],
    /// Of `pending_ends`: refusals.
    pending_refused: [u64; 4],
    /// The shortest idle timeout of the flow tables (lookup windows, see `window_end`).
    idle_ns: u64,
    /// The current batch spans at most `idle_ns`: one lookup window.
    one_window: bool,
    /// This core's packet clock among those the shared sweep waits for
    /// (None: no coarse state).
    clock: Option<ClockSlot>,
    /// An armed trace or capture (`crate::tap`): None on the fast path.
    pub(crate) tap: Option<Box<crate::tap::Tap>>,
    /// The other cores' clocks for this batch: what shared state's idleness
    /// is judged on (see [`crate::coarse::CoreClocks`]).
    shared_clock: SharedClock,
    /// The core's IPv4 fragment table ([`crate::frag`]), consulted at parse.
    frags: FragTable,
    /// Sources of the packets that found the flow table full (attribution; counted only in such batches).
    full_sources: flowplane_nf::topk::TopK,
}

/// What the auxiliary table needs: the coarse groups and their shared tables.
pub(crate) struct Aux<'a> {
    groups: &'a [GroupLayout],
    shared: &'a SharedStores,
    now: u64,
    /// The run's hash secret (coarse keys are placed by it too).
    seed: u32,
}

/// A state with no export row, as its bytes (little-endian hex).
fn raw_state(b: &[u8]) -> serde_json::Value {
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    serde_json::json!({ "state_bytes": hex })
}

/// Stage `stage`'s state bytes `b` for flow `key`'s packet, as `show flow` shows them (a trace's state
/// change): the NF's export row for the flow, or for its coarse key, or the bytes.
pub(crate) fn render_state(stage: &Stage, key: &FiveTuple, b: &[u8]) -> Option<serde_json::Value> {
    let Stage::Stateful { nf, .. } = stage else { return None };
    let gran = nf.granularity();
    let row = if gran == Granularity::FiveTuple {
        nf.export_row_bytes(key, b)
    } else {
        let meta = PktMeta { tuple: *key, valid: true, ..Default::default() };
        group_key(gran, &meta).and_then(|gk| match key_tuple(gran, gk) {
            Some(t) => nf.export_row_bytes(&t, b),
            None => nf.export_raw_row_bytes(gk, b),
        })
    };
    Some(row.unwrap_or_else(|| raw_state(b)))
}

/// The flow tables' hash of `t` under the run's secret `seed` (every core of a run uses the same one, so
/// hand-over and replicas place a key alike).
#[inline(always)]
pub(crate) fn hash_tuple(t: &FiveTuple, seed: u32) -> u64 {
    match t {
        FiveTuple::V4(k) => k.hash64(seed),
        FiveTuple::V6(k) => k.hash64(seed),
    }
}

impl ExecContext {
    /// Builds the context and allocates its per-core stores.
    pub fn new(
        mut chain: Chain,
        cfg: ExecConfig,
        shared: SharedStores,
        layout: StateLayout,
    ) -> Result<Self, EngineError> {
        if cfg.full_policy == FullPolicy::EvictLruIdle {
            // Eviction drops a flow without the release callbacks: refuse it
            // where that would leak (NAT ports, pins on shared state).
            for st in &chain.stages {
                if let Stage::Stateful { nf, .. } = st {
                    if let Some(why) = nf.no_evict() {
                        return Err(EngineError::Unsupported(format!(
                            "table-full policy 'evict': {}: {why}; use 'reject'",
                            nf.name()
                        )));
                    }
                    if nf.has_release() {
                        return Err(EngineError::Unsupported(format!(
                            "table-full policy 'evict' would drop {} state without releasing it; use 'reject'",
                            nf.name()
                        )));
                    }
                }
            }
            if cfg.aux && !chain.groups.is_empty() {
                return Err(EngineError::Unsupported(
                    "table-full policy 'evict' would leak the auxiliary table's pins on shared state; use 'reject' or --no-aux"
                        .to_string(),
                ));
            }
        }
        if shared.tables.len() != chain.groups.len() {
            return Err(EngineError::Unsupported(format!(
                "the chain has {} coarse groups but {} shared tables were given",
                chain.groups.len(),
                shared.tables.len()
            )));
        }
        let timeout_ns = chain.idle_timeout_ns.unwrap_or(cfg.default_idle_timeout_ns);
        // NFs with private tables of keys others choose key their hash with the run's secret (issue 33).
        for st in chain.stages.iter_mut() {
            if let Stage::Stateful { nf, .. } = st {
                nf.set_hash_secret(cfg.hash_seed);
            }
        }
        // A coarse NF that declares no timeout takes its group's (known now).
        let Chain { stages, groups, .. } = &mut chain;
        for st in stages.iter_mut() {
            if let Stage::Stateful { group: Some(g), idle: Some(slot), .. } = st {
                if slot.timeout_ns == 0 {
                    slot.timeout_ns = groups[*g].idle_timeout_ns.unwrap_or(cfg.default_idle_timeout_ns);
                }
            }
        }
        // The per-NF layout gives each NF a table with its own timeout: no block stamps there.
        let mut idle_ns = timeout_ns;
        if layout == StateLayout::PerNf {
            for st in stages.iter_mut() {
                if let Stage::Stateful { nf, group: None, .. } = st {
                    nf.set_idle(None);
                    idle_ns = idle_ns.min(nf.idle_timeout_ns().unwrap_or(timeout_ns));
                }
            }
        }
        let store_cfg = |size: usize, timeout: Option<u64>| StoreConfig {
            capacity: cfg.flows,
            capacity_v6: (cfg.flows / 4).max(1024),
            state_size: size,
            idle_timeout_ns: Some(timeout.unwrap_or(timeout_ns)),
            full_policy: cfg.full_policy,
            hugepages: cfg.hugepages,
            inline: cfg.inline_entries,
        };
        let table_err = |source| EngineError::Table { what: "flow table", source };
        let mut stores = Vec::new();
        if chain.is_stateful() {
            match layout {
                StateLayout::PerNf => {
                    for s in &chain.stages {
                        if let Stage::Stateful { nf, group: None, .. } = s {
                            let c = store_cfg(nf.state_size(), nf.idle_timeout_ns());
                            stores.push(FlowStore::new(c).map_err(table_err)?);
                        }
                    }
                }
                StateLayout::Aggregated => {
                    stores.push(FlowStore::new(store_cfg(chain.state_size, None)).map_err(table_err)?);
                }
            }
        }
        // Entry header (key 16 + hash 8 + last-seen 8) shares the first line with the state.
        let multi_line = chain.state_size > 32;
        let groups = chain.groups.len();
        let five_tuple = || {
            chain.stages.iter().filter_map(|s| match s {
                Stage::Stateful { nf, group: None, .. } => Some(nf),
                _ => None,
            })
        };
        let repeats = five_tuple().any(|nf| nf.ends_flows());
        let last_end = five_tuple().enumerate().filter(|(_, nf)| nf.ends_flows()).map(|(k, _)| k).last();
        let per_packet = five_tuple().enumerate().any(|(k, nf)| nf.has_release() && last_end.is_some_and(|e| k < e));
        let stages = chain.stages.len();
        let exact = ExactEnds { repeats, per_packet };
        // Every core's clock, also without shared tables: exports judge idleness at the run's latest packet time.
        let clock = shared.clocks.register();
        Ok(ExecContext {
            cfg,
            layout,
            chain,
            stores,
            shared,
            scratch: Scratch::new(groups, cfg.hash_seed),
            stats: ExecStats::default(),
            multi_line,
            active: None,
            active_at: Vec::new(),
            sweep: Sweep { last_ns: 0, entries: (cfg.flows as u64).max(64), period_ns: sweep_period_ns(idle_ns) },
            exact,
            progress: vec![0; stages],
            pending_ends: [0; 4],
            pending_refused: [0; 4],
            idle_ns,
            one_window: true,
            clock,
            tap: None,
            shared_clock: SharedClock::default(),
            frags: FragTable::new(cfg.hash_seed),
            full_sources: flowplane_nf::topk::TopK::default(),
        })
    }

    /// Whether coarse handles live in the flows' aggregated blocks (FAJITA's auxiliary table).
    #[inline]
    pub fn aux_on(&self) -> bool {
        self.cfg.aux && self.layout == StateLayout::Aggregated && !self.chain.groups.is_empty()
    }

    /// Start of a batch whose latest packet is at `now`: reads the other
    /// cores' clocks once (one relaxed load per other core) for the coarse
    /// NFs' idle checks of the batch; nothing without coarse state.
    #[inline]
    pub(crate) fn begin_batch(&mut self, now: u64) {
        if let (Some(c), false) = (&self.clock, self.chain.groups.is_empty()) {
            let tsc = if c.clocks().is_replay() { 0 } else { flowplane_packet::tsc::rdtsc() };
            self.shared_clock = c.clocks().view(c, now, tsc);
        }
    }

    /// The core's source is exhausted: its clock no longer holds the shared
    /// state's watermark (see [`crate::coarse::CoreClocks`]).
    pub(crate) fn clock_done(&mut self) {
        if let Some(c) = &self.clock {
            c.done();
        }
    }

    /// Where the expiry sweep stands on this core's packet clock (0 before the first batch).
    pub(crate) fn sweep_ns(&self) -> u64 {
        self.sweep.last_ns
    }

    /// The run's latest packet time across cores (None: no packet).
    pub(crate) fn run_end(&self) -> Option<u64> {
        self.shared.clocks.latest()
    }

    /// Inserts the per-flow tables refused because they were full, so far (one read per table: checked once
    /// per batch, so attribution costs nothing in a batch without such an event).
    #[inline]
    pub(crate) fn table_full_events(&self) -> u64 {
        self.stores.iter().map(|s| s.stats().full_events).sum()
    }

    /// A batch had table-full events: counts the source of each valid IPv4 packet left without a flow entry.
    #[cold]
    pub(crate) fn attribute_table_full(&mut self, batch: &Batch) {
        for i in 0..batch.len() {
            let m = &self.scratch.metas[i];
            if let (true, FiveTuple::V4(k), true) = (m.valid, &m.tuple, self.scratch.flows[i] == FlowRef::NONE) {
                self.full_sources.add(u32::from(k.src()));
            }
        }
    }

    /// Parses every packet of the batch into `scratch.metas`. IPv4 and IPv6 fragments are judged by the
    /// fragment table ([`crate::frag`]): a later fragment takes its first fragment's key; overlapping ones and
    /// too many of one datagram are dropped here, before any lookup.
    pub(crate) fn parse(&mut self, batch: &mut Batch) {
        let ExecContext { scratch, stats, frags, .. } = self;
        for i in 0..batch.len() {
            let m = &mut scratch.metas[i];
            m.parse_into(batch.data(i));
            stats.unparsed += u64::from(!m.valid);
            if !m.valid {
                continue;
            }
            match frags.judge(batch.data(i), usize::from(m.l3), &m.tuple, batch.timestamps()[i]) {
                Judged::Keep => {}
                Judged::Follow(t) => m.tuple = t,
                Judged::Drop => batch.drop_packet(i),
            }
        }
    }

    /// Expiry work for the time since the last call, paced by packet time
    /// rather than packets: the sweep visits every entry once per
    /// [`sweep_period_ns`], which bounds the expiry lag whatever the table's
    /// size, instead of touching DRAM-resident entries on every packet. A
    /// call does at most one full pass, so a clock jump costs one pass.
    pub(crate) fn expire(&mut self, now: u64) {
        if self.active.is_some() {
            self.active_sweep(now);
        }
        let tsc = flowplane_packet::tsc::rdtsc();
        if let Some(c) = &self.clock {
            c.set(now, tsc);
        }
        if self.sweep.last_ns == 0 {
            // The first batch starts the clock (trace times may be since the epoch).
            self.sweep.last_ns = now;
            return;
        }
        let elapsed = now.saturating_sub(self.sweep.last_ns);
        let Sweep { entries, period_ns, .. } = self.sweep;
        let due = (u128::from(elapsed) * u128::from(entries) / u128::from(period_ns)) as u64;
        if due == 0 {
            return;
        }
        let budget = if due >= entries {
            self.sweep.last_ns = now;
            entries
        } else {
            self.sweep.last_ns += (u128::from(due) * u128::from(period_ns) / u128::from(entries)) as u64;
            due
        } as usize;
        let aux_on = self.aux_on();
        let pernf = self.layout == StateLayout::PerNf;
        // Shared entries expire at the slowest running core's clock (see `CoreClocks`).
        let shared_now = if self.clock.is_some() { self.shared.clocks.watermark(now, tsc) } else { now };
        let ExecContext { stores, chain, shared, scratch, .. } = self;
        let Chain { stages, groups, .. } = chain;
        let aux = Aux { groups, shared, now, seed: scratch.seed };
        for (k, store) in stores.iter_mut().enumerate() {
            store.expire(now, budget, |key, block| {
                release_all(stages, pernf.then_some(k), aux_on.then_some(&aux), key, block, EndReason::IdleTimeout)
            });
        }
        for (g, t) in shared.tables.iter().enumerate() {
            let gran = groups[g].granularity;
            // Coarse NFs get their release callback too (on whichever core sweeps).
            t.expire(shared_now, budget, |key, words| {
                let Some(tuple) = key_tuple(gran, *key) else { return };
                let _ = with_locked(words, |flags, buf| {
                    let bytes: &mut [u8] = bytemuck::cast_slice_mut(buf);
                    for st in stages.iter_mut() {
                        if let Stage::Stateful { nf, offset, group: Some(sg), member, .. } = st {
                            let sz = nf.state_size();
                            if *sg == g && *flags & (2u64 << *member) != 0 {
                                if let Some(b) = bytes.get(*offset..*offset + sz) {
                                    nf.release_bytes(&tuple, b, EndReason::IdleTimeout);
                                }
                            }
                        }
                    }
                });
            });
        }
    }

    /// Turns on the IPFIX active timeout (reports of live flows every `period_ns`).
    pub(crate) fn set_active_timeout(&mut self, period_ns: u64) {
        self.active = Some(ActiveSweep { period_ns: period_ns.max(1), last_ns: 0 });
        self.active_at = vec![(0, 0); self.stores.len()];
    }

    /// The active-timeout walk's work for the time since its last call: the
    /// flows visited get an IPFIX record ([`EndReason::ActiveTimeout`]).
    fn active_sweep(&mut self, now: u64) {
        let Some(a) = self.active.as_mut() else { return };
        if a.last_ns == 0 {
            a.last_ns = now;
            return;
        }
        // Each table visits its share of the period's walk: len * elapsed / period entries, rounded up.
        let (period, elapsed) = (u128::from(a.period_ns), u128::from(now.saturating_sub(a.last_ns)));
        let share = |len: usize| (len as u128 * elapsed).div_ceil(period).min(len as u128) as usize;
        let most = self.stores.iter().map(|s| s.len_v4().max(s.len_v6())).max().unwrap_or(0);
        if (most as u128 * elapsed) < period {
            return;
        }
        a.last_ns = now;
        let pernf = self.layout == StateLayout::PerNf;
        let ExecContext { stores, chain, active_at, .. } = self;
        for (k, (store, at)) in stores.iter().zip(active_at.iter_mut()).enumerate() {
            let budget = (share(store.len_v4()), share(store.len_v6()));
            store.visit(at, budget, |key, block| {
                report_flow(&mut chain.stages, pernf.then_some(k), key, block, EndReason::ActiveTimeout)
            });
        }
    }

    /// A flow record of every live flow, with `reason` (the run's end: forced end); with
    /// `include_shared`, also of the shared tables' entries (one core reports those). A flow
    /// already idle past its timeout at the run's last packet time ended by expiry (idle timeout).
    pub(crate) fn ipfix_report_all(&mut self, reason: EndReason, include_shared: bool) {
        let pernf = self.layout == StateLayout::PerNf;
        let end = self.run_end().unwrap_or(0);
        let ExecContext { stores, chain, shared, .. } = self;
        for (k, store) in stores.iter().enumerate() {
            store.for_each_judged(end, |key, block, idle| {
                let why = if idle { EndReason::IdleTimeout } else { reason };
                report_flow(&mut chain.stages, pernf.then_some(k), key, block, why)
            });
        }
        if !include_shared {
            return;
        }
        let Chain { stages, groups, .. } = chain;
        for (g, t) in shared.tables.iter().enumerate() {
            let gran = groups[g].granularity;
            t.for_each(|_, key, words| {
                let Some(tuple) = key_tuple(gran, *key) else { return };
                let _ = with_locked(words, |flags, buf| {
                    let bytes: &mut [u8] = bytemuck::cast_slice_mut(buf);
                    for st in stages.iter_mut() {
                        if let Stage::Stateful { nf, offset, group: Some(sg), member, .. } = st {
                            let sz = nf.state_size();
                            if *sg == g && *flags & (2u64 << *member) != 0 && nf.ipfix_on() {
                                if let Some(b) = bytes.get(*offset..*offset + sz) {
                                    nf.ipfix_flow_bytes(&tuple, b, reason);
                                }
                            }
                        }
                    }
                });
            });
        }
    }

    // ---- Lookups (aggregated layout) ----

    /// Looks up (inserting misses) every valid packet of the batch in the
    /// aggregated store; fills `scratch.flows`. Bulk (prefetching) for IPv4
    /// when `bulk`, key by key otherwise and for IPv6. On insertion, every
    /// NF's default action runs and (aux on) the flow pins its coarse entries.
    pub(crate) fn lookup_bulk(&mut self, batch: &mut Batch, range: Range<usize>, ctx: &NfContext, bulk: bool) {
        let aux_on = self.aux_on();
        let ExecContext { stores, chain, scratch, shared, .. } = self;
        let Chain { stages, groups, .. } = chain;
        let aux = Aux { groups, shared, now: ctx.now_ns, seed: scratch.seed };
        let aux = aux_on.then_some(&aux);
        let store = &mut stores[0];
        let mut m = 0usize;
        for i in range {
            scratch.flows[i] = FlowRef::NONE;
            // The common case reads the key in place; the rest copies the metadata.
            match &scratch.metas[i] {
                meta if !meta.valid => {}
                &PktMeta { tuple: FiveTuple::V4(k), .. } if bulk => {
                    m = scratch.gather_v4(m, i, k, batch.timestamps()[i])
                }
                other => {
                    let meta = *other;
                    let h = hash_tuple(&meta.tuple, scratch.seed);
                    let pctx = packet_ctx(batch, i, ctx);
                    let data = batch.data_mut(i);
                    let r =
                        store.upsert(&meta.tuple, h, pctx.now_ns, |u| upsert_all(stages, aux, data, &meta, &pctx, u));
                    if let Some((r, _)) = r {
                        scratch.flows[i] = r;
                    }
                }
            }
        }
        let Scratch { keys, hashes, idx, handles, flows, metas, times, .. } = scratch;
        let gathered = Gathered { keys: &keys[..m], hashes: &hashes[..m], idx: &idx[..m], times: &times[..m] };
        bulk_upsert(store, gathered, handles, flows, |i, u| {
            let pctx = packet_ctx(batch, i, ctx);
            upsert_all(stages, aux, batch.data_mut(i), &metas[i], &pctx, u)
        });
    }

    /// Single-key add-on-miss lookup of packet `i` in the aggregated store
    /// (the latency-optimised path); `FlowRef::NONE` for unparsed packets
    /// and a full table.
    pub(crate) fn lookup_one(&mut self, batch: &mut Batch, i: usize, ctx: &NfContext) -> FlowRef {
        let aux_on = self.aux_on();
        // Split borrows: the packet's metadata is read in place, not copied.
        let ExecContext { stores, chain, shared, scratch, .. } = self;
        let meta = &scratch.metas[i];
        if !meta.valid {
            return FlowRef::NONE;
        }
        let Chain { stages, groups, .. } = chain;
        let aux = Aux { groups, shared, now: ctx.now_ns, seed: scratch.seed };
        let aux = aux_on.then_some(&aux);
        let h = hash_tuple(&meta.tuple, scratch.seed);
        let pctx = packet_ctx(batch, i, ctx);
        let data = batch.data_mut(i);
        let Some(store) = stores.first_mut() else { return FlowRef::NONE };
        store
            .upsert(&meta.tuple, h, pctx.now_ns, |u| upsert_all(stages, aux, data, meta, &pctx, u))
            .map_or(FlowRef::NONE, |(r, _)| r)
    }

    /// One single-key lookup per run of consecutive packets of one flow in
    /// `range` (FastClick's micro-batches), every packet of the run getting
    /// its entry; the entry is last seen at the run's last packet (the
    /// lookup window keeps a run within the idle timeout).
    pub(crate) fn lookup_runs(&mut self, batch: &mut Batch, range: Range<usize>, ctx: &NfContext) {
        let aux_on = self.aux_on();
        let ExecContext { stores, chain, shared, scratch, .. } = self;
        let Some(store) = stores.first_mut() else { return };
        let Chain { stages, groups, .. } = chain;
        let aux = Aux { groups, shared, now: ctx.now_ns, seed: scratch.seed };
        let aux = aux_on.then_some(&aux);
        let Scratch { metas, flows, seed, .. } = scratch;
        let seed = *seed;
        let (mut i, n) = (range.start, range.end);
        while i < n {
            let meta = &metas[i];
            let mut j = i + 1;
            while j < n && metas[j].valid == meta.valid && metas[j].tuple == meta.tuple {
                j += 1;
            }
            let mut flow = FlowRef::NONE;
            if meta.valid {
                let h = hash_tuple(&meta.tuple, seed);
                let pctx = packet_ctx(batch, i, ctx);
                let data = batch.data_mut(i);
                if let Some((r, _)) =
                    store.upsert(&meta.tuple, h, pctx.now_ns, |u| upsert_all(stages, aux, data, meta, &pctx, u))
                {
                    flow = r;
                    if j > i + 1 {
                        let last = batch.timestamps()[i + 1..j].iter().copied().max().unwrap_or(0);
                        store.touch(r, last);
                    }
                }
            }
            flows[i..j].fill(flow);
            i = j;
        }
    }

    /// True when the chain can end flows, so executors must make each end
    /// take effect at its packet (see `ExecContext::segment_end`).
    #[inline]
    pub fn exact_ends(&self) -> bool {
        self.exact.repeats
    }

    /// End of the segment of packets starting at `start` (looked up, within
    /// `..n`) that [`ExecContext::run_stages`] can run stage by stage with the
    /// result of packet-by-packet processing: it stops before a second packet
    /// of a flow already in the segment (an end would have given it fresh
    /// state). Chains that never end flows run the whole batch as one
    /// segment; chains where an NF holding releasable resources runs before
    /// an NF that ends flows run packet by packet (the earlier NF would have
    /// seen the release; see `ExactEnds`).
    pub(crate) fn segment_end(&mut self, start: usize, n: usize) -> usize {
        self.segment_end_with(start, n, |s, i| s.flows[i].is_some().then(|| s.flows[i].bits()))
    }

    /// The segment rule over packet ids `id(scratch, i)` (None: never repeats).
    #[inline]
    fn segment_end_with(&mut self, start: usize, n: usize, id: impl Fn(&Scratch, usize) -> Option<u32>) -> usize {
        if !self.exact.repeats || start >= n {
            return n;
        }
        if self.exact.per_packet {
            return start + 1;
        }
        let s = &mut self.scratch;
        s.seen.clear();
        for i in start..n {
            if let Some(x) = id(s, i) {
                if !s.seen.insert(x) {
                    return i;
                }
            }
        }
        n
    }

    /// [`ExecContext::segment_end`] before the lookups (the per-NF layout,
    /// whose NFs each look up on their own): a segment stops before a second
    /// packet of a 5-tuple already in it. Keys are told apart by their hash;
    /// a collision only ends a segment early.
    pub(crate) fn segment_end_by_key(&mut self, start: usize, n: usize) -> usize {
        self.segment_end_with(start, n, |s, i| s.metas[i].valid.then(|| hash_tuple(&s.metas[i].tuple, s.seed) as u32))
    }

    /// Handle of packet `i`'s group-`g` entry as the auxiliary table keeps it in the flow's block.
    #[inline]
    fn aux_handle_of(&self, g: usize, flow: FlowRef) -> SharedHandle {
        let layout = &self.chain.groups[g];
        match self.stores[0].block(flow).get(layout.aux_offset..layout.aux_offset + 8) {
            Some(b) if flow.is_some() => aux_handle(b),
            _ => SharedHandle::NONE,
        }
    }

    /// [`Self::aux_handle_of`], except that a flow whose block holds no pin
    /// although its packet has a key of group `g` — the shared table was full
    /// when the flow started — tries again now, and a pin it gets goes into
    /// the block (released with the flow, like one taken at its start). So
    /// the flow reaches its shared state as soon as there is room, and every
    /// packet the table refuses counts once in the table's `table_full`, as
    /// the NFs count it (issue 29: they counted 1,750 against the table's 1,694).
    #[inline]
    fn aux_handle_retrying(&mut self, g: usize, i: usize, flow: FlowRef, now: u64) -> SharedHandle {
        let h = self.aux_handle_of(g, flow);
        if h.is_some() || !flow.is_some() {
            return h;
        }
        self.repin_aux(g, i, flow, now)
    }

    /// The cold half of [`Self::aux_handle_retrying`].
    #[cold]
    #[inline(never)]
    fn repin_aux(&mut self, g: usize, i: usize, flow: FlowRef, now: u64) -> SharedHandle {
        let at = self.chain.groups[g].aux_offset;
        if let Some(slot) = self.stores[0].block_mut(flow).get_mut(at..at + 8) {
            if u64::from_ne_bytes(slot.try_into().unwrap_or([0; 8])) == aux_refused_bits() {
                // The packet that started the flow: refused (and counted) a moment ago.
                slot.copy_from_slice(&handle_bits(SharedHandle::NONE).to_ne_bytes());
                return SharedHandle::NONE;
            }
        }
        let meta = &self.scratch.metas[i];
        let layout = &self.chain.groups[g];
        let Some(k) = meta.valid.then(|| group_key(layout.granularity, meta)).flatten() else {
            return SharedHandle::NONE;
        };
        self.stats.shared_lookups += 1;
        let Some((h, _)) = self.shared.tables[g].acquire(&k, coarse_hash(k, self.scratch.seed), now, |_, _| {}) else {
            return SharedHandle::NONE;
        };
        match self.stores[0].block_mut(flow).get_mut(at..at + 8) {
            Some(dst) => {
                dst.copy_from_slice(&handle_bits(h).to_ne_bytes());
                h
            }
            None => {
                self.shared.tables[g].release(h, now);
                SharedHandle::NONE
            }
        }
    }

    /// Fills the coarse handles (`scratch.coarse`) of packets `range`: from
    /// the flows' blocks (aux on; `scratch.flows` must be filled) or by
    /// pinning every packet's coarse entries with one bulk shared lookup per
    /// group (aux off). A packet that has no flow entry although it has keys
    /// (the 5-tuple table was full) is pinned directly too: coarse NFs (DDoS,
    /// port-scan, per-source limits) must see every packet, never fail open.
    /// [`ExecContext::unpin_coarse_batch`] releases what was pinned here.
    pub(crate) fn pin_coarse_batch(&mut self, range: Range<usize>, now: u64) {
        if self.chain.groups.is_empty() {
            return;
        }
        if self.aux_on() {
            for i in range.clone() {
                let flow = self.scratch.flows[i];
                let direct = !flow.is_some() && self.scratch.metas[i].valid;
                self.scratch.coarse_pinned[i] = direct;
                if direct {
                    self.stats.aux_fallbacks += 1;
                }
                for g in 0..self.chain.groups.len() {
                    let h = if direct { self.pin_direct(g, i, now) } else { self.aux_handle_retrying(g, i, flow, now) };
                    self.scratch.coarse[g][i] = h;
                    // The shared entries are as cold as the flow's block was:
                    // start their misses for the whole batch before the NFs run.
                    // (For writing: every packet takes the entry's lock.)
                    if let Some(w) = self.shared.tables[g].state(h).and_then(|w| w.first()) {
                        flowplane_packet::prefetch::write(w);
                    }
                }
            }
            return;
        }
        let mut keys = [0u128; MAX_BATCH];
        let mut hashes = [0u64; MAX_BATCH];
        let mut idx = [0u16; MAX_BATCH];
        let mut out = [SharedHandle::NONE; MAX_BATCH];
        for i in range.clone() {
            self.scratch.coarse_pinned[i] = true;
        }
        for (g, layout) in self.chain.groups.iter().enumerate() {
            let mut m = 0;
            for i in range.clone() {
                self.scratch.coarse[g][i] = SharedHandle::NONE;
                let meta = &self.scratch.metas[i];
                if let Some(k) = meta.valid.then(|| group_key(layout.granularity, meta)).flatten() {
                    keys[m] = k;
                    hashes[m] = coarse_hash(k, self.scratch.seed);
                    idx[m] = i as u16;
                    m += 1;
                }
            }
            self.shared.tables[g].acquire_batch(&keys[..m], &hashes[..m], now, &mut out[..m], |_, _| {});
            self.stats.shared_lookups += m as u64;
            for j in 0..m {
                self.scratch.coarse[g][idx[j] as usize] = out[j];
            }
        }
    }

    /// One shared lookup (add-on-miss, pinned) of packet `i`'s group-`g` key.
    fn pin_direct(&mut self, g: usize, i: usize, now: u64) -> SharedHandle {
        let meta = &self.scratch.metas[i];
        match meta.valid.then(|| group_key(self.chain.groups[g].granularity, meta)).flatten() {
            Some(k) => {
                self.stats.shared_lookups += 1;
                self.shared.tables[g]
                    .acquire(&k, coarse_hash(k, self.scratch.seed), now, |_, _| {})
                    .map_or(SharedHandle::NONE, |(h, _)| h)
            }
            None => SharedHandle::NONE,
        }
    }

    /// Releases the pins [`ExecContext::pin_coarse_batch`] took for packets `range`.
    pub(crate) fn unpin_coarse_batch(&mut self, range: Range<usize>, now: u64) {
        if self.chain.groups.is_empty() {
            return;
        }
        for i in range {
            self.unpin_coarse_packet(i, now);
        }
    }

    /// Packet `i`'s coarse handles alone (run-to-completion): from its
    /// flow's block (aux on) or one shared lookup per group (aux off, or no
    /// flow entry), released by [`ExecContext::unpin_coarse_packet`].
    pub(crate) fn pin_coarse_packet(&mut self, i: usize, now: u64) {
        if self.chain.groups.is_empty() {
            return;
        }
        let flow = self.scratch.flows[i];
        let direct = !self.aux_on() || (!flow.is_some() && self.scratch.metas[i].valid);
        self.scratch.coarse_pinned[i] = direct;
        if direct && self.aux_on() {
            self.stats.aux_fallbacks += 1;
        }
        for g in 0..self.chain.groups.len() {
            let h = if direct { self.pin_direct(g, i, now) } else { self.aux_handle_retrying(g, i, flow, now) };
            self.scratch.coarse[g][i] = h;
        }
    }

    /// Releases the pins taken for packet `i`, if any.
    pub(crate) fn unpin_coarse_packet(&mut self, i: usize, now: u64) {
        if self.chain.groups.is_empty() || !self.scratch.coarse_pinned[i] {
            return;
        }
        self.scratch.coarse_pinned[i] = false;
        for (g, t) in self.shared.tables.iter().enumerate() {
            let h = self.scratch.coarse[g][i];
            if h.is_some() {
                t.release(h, now);
            }
        }
    }

    /// Runs coarse stage `si` on packet `i` through its pinned handle in
    /// `scratch.coarse` and applies the verdict.
    #[inline]
    pub(crate) fn run_coarse(&mut self, si: usize, batch: &mut Batch, i: usize, ctx: &NfContext) {
        let ExecContext { chain, shared, scratch, .. } = self;
        let Chain { stages, groups, .. } = chain;
        if let Stage::Stateful { nf, offset, group: Some(g), member, idle, counters } = &mut stages[si] {
            let place = Coarse {
                member: *member,
                offset: *offset,
                idle: *idle,
                granularity: groups[*g].granularity,
                table: &shared.tables[*g],
                h: scratch.coarse[*g][i],
                clock: self.shared_clock,
            };
            let resets = &mut self.stats.state_resets;
            if let Some(a) = coarse_one(nf.as_mut(), &place, batch, i, &scratch.metas[i], ctx, counters, resets) {
                apply_action(batch, i, a, counters);
            }
        }
    }

    /// Runs coarse stage `si` over packets `range`.
    pub(crate) fn run_coarse_batch(&mut self, si: usize, batch: &mut Batch, range: Range<usize>, ctx: &NfContext) {
        for i in range {
            self.run_coarse(si, batch, i, ctx);
        }
    }

    // ---- The staged pass (aggregated layout) ----

    /// Marks a new batch: no stage has run any packet yet.
    pub(crate) fn start_batch(&mut self, batch: &Batch) {
        self.progress.fill(0);
        self.pending_ends = [0; 4];
        self.pending_refused = [0; 4];
        let ts = batch.timestamps();
        let (lo, hi) = ts.iter().fold((u64::MAX, 0), |(lo, hi), &t| (lo.min(t), hi.max(t)));
        self.one_window = hi.saturating_sub(lo) <= self.idle_ns;
    }

    /// End of the lookup window starting at `start` (within `..n`): the
    /// packets a batched lookup may serve at once. A bulk lookup hands every
    /// packet of a flow the same entry, which is right only while no packet
    /// of the window finds its flow idle since an earlier one of the window:
    /// so a window spans at most the idle timeout of packet time. Batches
    /// span microseconds at speed (one window); a slow capture replayed at
    /// full speed is cut where its time jumps.
    pub(crate) fn window_end(&self, batch: &Batch, start: usize, n: usize) -> usize {
        if self.one_window || start >= n {
            return n;
        }
        let ts = batch.timestamps();
        let (mut lo, mut hi) = (ts[start], ts[start]);
        for i in start + 1..n {
            lo = lo.min(ts[i]);
            hi = hi.max(ts[i]);
            if hi - lo > self.idle_ns {
                return i;
            }
        }
        n
    }

    /// Each NF over the segment `range`, in chain order, after `scratch.flows`
    /// and the coarse handles are filled; then the flows that asked to end
    /// are removed. A stage resumes where it stopped in an earlier segment of
    /// the batch, and an NF that ends a flow stops right after that packet:
    /// the stages after it stop there too (a refusal, [`Action::Refuse`], does
    /// not stop). Returns the flows removed (ended or refused) and the
    /// end of what every stage has run (the next segment starts there).
    /// `prefetch` starts the second line of multi-line blocks and runs the
    /// NFs' prefetch hooks ahead of their actions.
    pub(crate) fn run_stages(
        &mut self,
        batch: &mut Batch,
        range: Range<usize>,
        ctx: &NfContext,
        prefetch: bool,
    ) -> (u64, usize) {
        // One test per segment: the loop is built with and without the observation point.
        if self.tap.is_some() {
            self.run_stages_with::<true>(batch, range, ctx, prefetch)
        } else {
            self.run_stages_with::<false>(batch, range, ctx, prefetch)
        }
    }

    /// Stage `si` ran packets `range`: the armed tap looks at their verdicts, and a traced packet's
    /// state after the stage is read (exact: a traced packet runs alone, see `Pipeline::run_chunked`).
    #[inline]
    pub(crate) fn observe(&mut self, si: usize, batch: &Batch, range: Range<usize>) {
        let Some(mut t) = self.tap.take() else { return };
        t.after(si, batch, range.clone());
        if t.tracing() && t.any_traced() && self.chain.stages[si].state_size() > 0 {
            for i in range {
                if let Some(mut slot) = t.state_slot(i, si, true) {
                    let had = self.copy_state(si, &self.scratch.metas[i], slot.buf());
                    slot.set(had);
                }
            }
        }
        self.tap = Some(t);
    }

    /// Copies stage `si`'s state for the packet parsed as `meta` into `out` (its state size): the flow's
    /// 5-tuple state, or the coarse state of its source, destination or other key. One lookup, nothing
    /// inserted; false when there is none (a new flow, an unparsed packet).
    pub(crate) fn copy_state(&self, si: usize, meta: &PktMeta, out: &mut [u8]) -> bool {
        if !meta.valid {
            return false;
        }
        let Some(Stage::Stateful { nf, offset, group, member, .. }) = self.chain.stages.get(si) else { return false };
        let sz = nf.state_size().min(out.len());
        let out = &mut out[..sz];
        match *group {
            Some(g) => {
                let bit = 2u64 << member;
                let Some(gk) = group_key(self.chain.groups[g].granularity, meta) else { return false };
                let t = &self.shared.tables[g];
                let hdl = t.lookup(&gk, coarse_hash(gk, self.scratch.seed));
                let Some(words) = t.state(hdl) else { return false };
                with_locked(words, |flags, buf| {
                    let bytes: &mut [u8] = bytemuck::cast_slice_mut(buf);
                    match bytes.get(*offset..*offset + sz) {
                        Some(b) if *flags & bit != 0 => {
                            out.copy_from_slice(b);
                            true
                        }
                        _ => false,
                    }
                })
                .unwrap_or(false)
            }
            None => {
                let (store, off) = match self.layout {
                    StateLayout::PerNf => {
                        // This NF's own table: one per 5-tuple stage before it.
                        let k = self.chain.stages[..si]
                            .iter()
                            .filter(|s| matches!(s, Stage::Stateful { group: None, .. }))
                            .count();
                        (self.stores.get(k), 0)
                    }
                    StateLayout::Aggregated => (self.stores.first(), *offset),
                };
                let h = hash_tuple(&meta.tuple, self.scratch.seed);
                match store.and_then(|st| st.block(st.find(&meta.tuple, h)?).get(off..off + sz)) {
                    Some(b) => {
                        out.copy_from_slice(b);
                        true
                    }
                    None => false,
                }
            }
        }
    }

    #[inline(always)]
    fn run_stages_with<const OBS: bool>(
        &mut self,
        batch: &mut Batch,
        range: Range<usize>,
        ctx: &NfContext,
        prefetch: bool,
    ) -> (u64, usize) {
        let mut frontier = range.end;
        if prefetch && self.multi_line {
            // The lookup brought each entry's first line; fetch the next one now,
            // a full chain pass before the NFs that keep state there need it.
            let store = &self.stores[0];
            for &r in &self.scratch.flows[range.clone()] {
                if let Some(b) = store.block(r).get(32) {
                    flowplane_packet::prefetch::write(b);
                }
            }
        }
        let ahead = if prefetch && self.cfg.prefetch_hooks { PREFETCH_AHEAD } else { 0 };
        // Ends requested so far in the batch: an earlier stage may have ended
        // a flow past where a later stage stopped; that end waits until the
        // later stage has run the packet too.
        let (mut ends, mut refused) = self.pending_ends();
        for si in 0..self.chain.stages.len() {
            let from = self.progress[si].max(range.start);
            if from >= frontier {
                continue;
            }
            let todo = from..frontier;
            self.progress[si] = frontier;
            if self.chain.stages[si].is_coarse() {
                self.run_coarse_batch(si, batch, todo.clone(), ctx);
                if OBS {
                    self.observe(si, batch, todo);
                }
                continue;
            }
            let ExecContext { stores, chain, scratch, .. } = self;
            let mut ran = todo.clone();
            match &mut chain.stages[si] {
                Stage::Stateless(nf) => nf.process(batch, todo, ctx),
                Stage::Stateful { nf, offset, counters, .. } => {
                    let mut out = BatchOutcome::default();
                    let (metas, flows) = (&scratch.metas[..frontier], &scratch.flows[..frontier]);
                    let store = &mut stores[0];
                    nf.process_batch(batch, todo, metas, flows, store, *offset, ctx, ahead, &mut out);
                    counters.merge(&out.counters);
                    out.merge_into(&mut ends, &mut refused);
                    if let Some(stop) = out.stopped_at {
                        frontier = stop;
                        self.progress[si] = stop;
                        ran.end = stop;
                    }
                }
            }
            if OBS {
                self.observe(si, batch, ran);
            }
        }
        let aux_on = self.aux_on();
        let ExecContext { stores, chain, scratch, shared, stats, .. } = self;
        let Chain { stages, groups, .. } = chain;
        let aux = Aux { groups, shared, now: ctx.now_ns, seed: scratch.seed };
        let flows = &scratch.flows[..frontier];
        let (ended, gone) = end_flows(stages, &mut stores[0], None, aux_on.then_some(&aux), flows, &ends, &refused);
        stats.ended += ended;
        stats.refused += gone;
        self.keep_ends_past(ends, refused, frontier);
        // Either kind of removal leaves later packets of the window with a stale entry: the caller looks them up again.
        (ended + gone, frontier)
    }

    /// Ends requested in the batch that not every stage has run yet (see
    /// [`ExecContext::keep_ends_past`]); executors start a segment's `ends` from these.
    /// With them, which of those are refusals ([`Action::Refuse`]).
    #[inline]
    pub(crate) fn pending_ends(&self) -> ([u64; 4], [u64; 4]) {
        (self.pending_ends, self.pending_refused)
    }

    /// Keeps the ends of packets at or past `frontier` pending (those before
    /// it have been applied): a stage may have ended a flow past where a later
    /// stage stopped, and that end waits until the later stage has run it.
    pub(crate) fn keep_ends_past(&mut self, mut ends: [u64; 4], refused: [u64; 4], frontier: usize) {
        for (w, e) in ends.iter_mut().enumerate() {
            let lo = w * 64;
            if frontier >= lo + 64 {
                *e = 0;
            } else if frontier > lo {
                *e &= !((1u64 << (frontier - lo)) - 1);
            }
            self.pending_refused[w] = refused[w] & *e;
        }
        self.pending_ends = ends;
    }

    /// Removes one flow of store `k` (releasing its state) and forgets it in
    /// `flows[from..]` so later packets of the batch do not reuse the entry.
    /// `refused`: the flow was refused on its first packet (counted apart, see [`ExecStats::refused`]).
    pub(crate) fn end_flow(&mut self, k: usize, flow: FlowRef, now: u64, flows_from: usize, refused: bool) {
        let aux_on = self.aux_on();
        let pernf = (self.layout == StateLayout::PerNf).then_some(k);
        let ExecContext { stores, chain, scratch, shared, stats, .. } = self;
        let Chain { stages, groups, .. } = chain;
        let aux = Aux { groups, shared, now, seed: scratch.seed };
        let removed = remove_flow(stages, &mut stores[k], pernf, aux_on.then_some(&aux), flow) as u64;
        if refused {
            stats.refused += removed;
        } else {
            stats.ended += removed;
        }
        for f in scratch.flows[flows_from..].iter_mut() {
            if *f == flow {
                *f = FlowRef::NONE;
            }
        }
    }

    /// Ends the flow `key` in every store of the per-NF layout (each NF's
    /// release callback on its own state), counted once per entry removed.
    pub(crate) fn end_flow_everywhere(&mut self, key: &FiveTuple, refused: bool) {
        let h = hash_tuple(key, self.scratch.seed);
        // `ended` counts entries, as insertions do: a flow with an entry in n per-NF tables ends n times, so
        // every table's `flows + expiries + ended + evictions = insertions` holds in the sum.
        let mut removed = 0;
        // (The per-NF layout keeps no auxiliary handles: nothing to unpin.)
        let ExecContext { stores, chain, .. } = self;
        for (k, store) in stores.iter_mut().enumerate() {
            if let Some(flow) = store.find(key, h) {
                removed += u64::from(remove_flow(&mut chain.stages, store, Some(k), None, flow));
            }
        }
        if refused {
            self.stats.refused += removed;
        } else {
            self.stats.ended += removed;
        }
    }

    /// Each stateful NF's state for the flow `key` on this core (`flowplane ctl show flow`): its
    /// 5-tuple state, or its coarse state for the flow's source, destination or other key. One
    /// lookup per table, nothing inserted; NFs without state for the flow are left out.
    pub fn flow_rows(&self, key: &FiveTuple, include_shared: bool) -> Vec<(String, serde_json::Value)> {
        let h = hash_tuple(key, self.scratch.seed);
        let meta = flowplane_nf::PktMeta { tuple: *key, valid: true, ..Default::default() };
        let mut out = Vec::new();
        let mut k = 0;
        for s in &self.chain.stages {
            let Stage::Stateful { nf, offset, group, member, .. } = s else { continue };
            let sz = nf.state_size();
            let row = match *group {
                Some(g) if include_shared => {
                    let gran = self.chain.groups[g].granularity;
                    let bit = 2u64 << member;
                    crate::coarse::group_key(gran, &meta).and_then(|gk| {
                        let t = &self.shared.tables[g];
                        let hdl = t.lookup(&gk, crate::coarse::coarse_hash(gk, self.scratch.seed));
                        let words = t.state(hdl)?;
                        with_locked(words, |flags, buf| {
                            let bytes: &mut [u8] = bytemuck::cast_slice_mut(buf);
                            if *flags & bit == 0 {
                                return None;
                            }
                            let st = bytes.get(*offset..*offset + sz)?;
                            let row = match key_tuple(gran, gk) {
                                Some(t) => nf.export_row_bytes(&t, st),
                                None => nf.export_raw_row_bytes(gk, st),
                            };
                            Some(row.unwrap_or_else(|| raw_state(st)))
                        })
                        .flatten()
                    })
                }
                Some(_) => None,
                None => {
                    let (store, off) = match self.layout {
                        StateLayout::PerNf => (self.stores.get(k), 0),
                        StateLayout::Aggregated => (self.stores.first(), *offset),
                    };
                    k += 1;
                    store.and_then(|st| {
                        let r = st.find(key, h)?;
                        let b = st.block(r).get(off..off + sz)?;
                        // An NF without an export row (acl) shows its state's bytes.
                        Some(nf.export_row_bytes(key, b).unwrap_or_else(|| raw_state(b)))
                    })
                }
            };
            if let Some(r) = row {
                out.push((nf.name().to_string(), r));
            }
        }
        out
    }

    // ---- Results ----

    /// Per-NF results: (name, counters, details).
    pub fn nf_results(&self) -> Vec<(String, NfCounters, Option<serde_json::Value>)> {
        self.chain
            .stages
            .iter()
            .map(|s| match s {
                Stage::Stateless(nf) => (nf.name().to_string(), nf.counters(), nf.report()),
                Stage::Stateful { nf, counters, .. } => (nf.name().to_string(), *counters, nf.report()),
            })
            .collect()
    }

    /// Table figures (summed over the context's stores).
    pub fn store_report(&self) -> StoreReport {
        let mut r = StoreReport {
            ended: self.stats.ended,
            unparsed: self.stats.unparsed,
            shared_lookups: self.stats.shared_lookups,
            aux_fallbacks: self.stats.aux_fallbacks,
            state_resets: self.stats.state_resets,
            fragments: self.frags.stats,
            table_full_sources: TopSources::from_pairs(self.full_sources.entries().map(|(a, n, _)| (a, n))),
            ..Default::default()
        };
        for st in &self.chain.stages {
            if let Stage::Stateful { nf, .. } = st {
                r.state_resets += nf.idle_resets();
            }
        }
        for s in &self.stores {
            let st: TableStats = s.stats();
            r.entries += s.len() as u64;
            r.capacity += s.capacity() as u64;
            r.capacity_v6 += s.capacity_v6() as u64;
            r.insertions += st.inserts;
            r.expiries += st.expiries;
            r.table_full += st.full_events;
            r.evictions += st.evictions;
        }
        // The tables count imported entries as inserts; the report keeps hand-overs apart. An entry its first
        // packet's NF refused was never admitted: neither an insertion nor ended.
        r.insertions -= (self.stats.moved_in + self.stats.refused).min(r.insertions);
        r.refused = self.stats.refused;
        r.moved_in = self.stats.moved_in;
        r.moved_out = self.stats.moved_out;
        r.flows = self.stores.first().map_or(0, |s| s.len() as u64);
        // Per-flow state in a shared table (the `shared` strategy): its keys are the live flows, the same reading
        // on every core.
        let five_tuple =
            self.chain.groups.iter().position(|g| g.granularity == flowplane_nf::stateful::Granularity::FiveTuple);
        if let Some(t) = five_tuple.and_then(|g| self.shared.tables.get(g)) {
            r.flows = t.len() as u64;
            r.flows_shared = true;
        }
        for t in &self.shared.tables {
            r.shared_keys += t.len() as u64;
            r.shared_capacity += t.capacity() as u64;
            r.shared_table_full += t.failed_inserts();
        }
        r
    }

    /// Export rows of NF `name` (one JSON object per flow or per coarse key),
    /// if it exports state ([`Export::State`]). Coarse state is shared by all
    /// cores: export it from one core only (`include_shared`).
    pub fn export(&self, name: &str, include_shared: bool) -> Option<Vec<serde_json::Value>> {
        self.export_resolving(name, include_shared, &|_| None)
    }

    /// [`ExecContext::export`], with `resolve` naming the flows of coarse keys that do not carry their tuple
    /// (IPv6 5-tuple fingerprints in the `shared` strategy's tables: see [`crate::coarse::group_key`]); a key
    /// neither carries nor `resolve` knows has no row.
    pub fn export_resolving(
        &self,
        name: &str,
        include_shared: bool,
        resolve: &dyn Fn(u128) -> Option<FiveTuple>,
    ) -> Option<Vec<serde_json::Value>> {
        let mut k = 0;
        for s in &self.chain.stages {
            let Stage::Stateful { nf, offset, group, member, idle, .. } = s else { continue };
            if nf.name() != name {
                if group.is_none() {
                    k += 1;
                }
                continue;
            }
            if nf.export_kind() != Export::State {
                return None;
            }
            let sz = nf.state_size();
            let mut rows = Vec::new();
            // The idle rule of a lookup, at the run's latest packet time: a
            // state a packet would find idle (and start over) is not listed.
            let now = self.shared.clocks.latest();
            let stamp_idle = |bytes: &[u8]| match (idle, now) {
                (Some(slot), Some(now)) => bytes
                    .get(slot.at..slot.at + 8)
                    .is_some_and(|b| is_idle(u64::from_ne_bytes(b.try_into().unwrap_or([0; 8])), now, slot.timeout_ns)),
                _ => false,
            };
            if let Some(g) = *group {
                if !include_shared {
                    return Some(rows);
                }
                let gran = self.chain.groups[g].granularity;
                let bit = 2u64 << member;
                self.shared.tables[g].for_each(|_, key, words| {
                    let _ = with_locked(words, |flags, buf| {
                        let bytes: &mut [u8] = bytemuck::cast_slice_mut(buf);
                        if *flags & bit != 0 && !stamp_idle(bytes) {
                            if let Some(st) = bytes.get(*offset..*offset + sz) {
                                // Keys without a 5-tuple projection (TEID, field set) go raw.
                                let row = match key_tuple(gran, *key).or_else(|| resolve(*key)) {
                                    Some(t) => nf.export_row_bytes(&t, st),
                                    None => nf.export_raw_row_bytes(*key, st),
                                };
                                rows.extend(row);
                            }
                        }
                    });
                });
                return Some(rows);
            }
            let (store, off) = match self.layout {
                StateLayout::PerNf => (self.stores.get(k)?, 0),
                StateLayout::Aggregated => (self.stores.first()?, *offset),
            };
            // (Per-NF tables carry the NF's own timeout: no stamps in their blocks.)
            let stamped = self.layout == StateLayout::Aggregated;
            store.for_each_live(now, |key, block| {
                if stamped && stamp_idle(block) {
                    return;
                }
                if let Some(r) = block.get(off..off + sz).and_then(|b| nf.export_row_bytes(key, b)) {
                    rows.push(r);
                }
            });
            return Some(rows);
        }
        None
    }
}

/// The IPv4 keys gathered for a bulk lookup: key j belongs to packet
/// `idx[j]`, seen at `times[j]`.
pub(crate) struct Gathered<'a> {
    keys: &'a [FiveTupleV4],
    hashes: &'a [u64],
    idx: &'a [u16],
    times: &'a [u64],
}

/// Looks up, inserting the misses, the IPv4 keys gathered for a batch (the
/// table works through them in chunks of its bulk size, checking each hit's
/// idle time at its packet's time); `f(i, Upsert)` releases an expired flow's
/// state and runs the default action for packet `i`'s new flow, and
/// `flows[idx[j]]` receives key j's entry.
#[inline]
pub(crate) fn bulk_upsert(
    store: &mut FlowStore,
    g: Gathered<'_>,
    handles: &mut [u32; MAX_BATCH],
    flows: &mut [FlowRef; MAX_BATCH],
    mut f: impl FnMut(usize, Upsert<'_, FiveTuple>),
) {
    let out = &mut handles[..g.keys.len()];
    store.v4().upsert_batch(g.keys, g.hashes, g.times, out, |j, u| {
        crate::store::widen(u, FiveTuple::V4, &mut |u| f(g.idx[j] as usize, u))
    });
    for (&h, &i) in out.iter().zip(g.idx) {
        flows[i as usize] = if h == INVALID_HANDLE { FlowRef::NONE } else { FlowRef::v4(h) };
    }
}

/// The valid IPv4 packets of a range, gathered once (key, hash, packet,
/// time in the scratch arrays, in packet order) for the bulk lookups of every
/// NF of the per-NF layout; `others`: the range also has valid packets that
/// are looked up key by key (IPv6).
pub(crate) struct RangeGather {
    len: usize,
    others: bool,
}

/// Gathers the valid, not-dropped IPv4 packets of `range` for
/// [`lookup_into`]: each NF's own lookup then only leaves out what the stages
/// before it dropped, instead of re-reading every packet's metadata and
/// re-hashing its key (the per-NF layout's lookups cost ~10 cycles per packet
/// more than 57bd9ab's before this).
pub(crate) fn gather_range(cx: &mut ExecContext, batch: &Batch, range: Range<usize>) -> RangeGather {
    let scratch = &mut cx.scratch;
    let (mut m, mut others) = (0, false);
    for i in range {
        match &scratch.metas[i] {
            meta if !meta.valid || batch.is_dropped(i) => {}
            &PktMeta { tuple: FiveTuple::V4(k), .. } => m = scratch.gather_v4(m, i, k, batch.timestamps()[i]),
            _ => others = true,
        }
    }
    RangeGather { len: m, others }
}

/// Looks up `range` in stage `si`'s own store `k` (the per-NF layout),
/// inserting the misses (`init(stage data)` is the default action), from a
/// [`gather_range`] over a range containing this one: the keys of the packets
/// dropped since leave the gather for good (a later NF does not see them
/// either), the keys of `range` (a contiguous run: the gather is in packet
/// order) are looked up in bulk, and the range's IPv6 packets key by key.
#[allow(clippy::too_many_arguments)]
pub(crate) fn lookup_into(
    cx: &mut ExecContext,
    k: usize,
    si: usize,
    batch: &mut Batch,
    range: Range<usize>,
    flows: &mut [FlowRef; MAX_BATCH],
    ctx: &NfContext,
    g: &mut RangeGather,
) {
    g.len = cx.scratch.retain_gathered(g.len, |i| batch.is_dropped(i));
    flows[range.clone()].fill(FlowRef::NONE);
    if g.others {
        for i in range.clone() {
            if !matches!(cx.scratch.metas[i].tuple, FiveTuple::V4(_)) {
                flows[i] = lookup_key(cx, k, si, batch, i, ctx);
            }
        }
    }
    let ExecContext { stores, chain, scratch, .. } = cx;
    let idx = &scratch.idx[..g.len];
    let j0 = idx.partition_point(|&i| usize::from(i) < range.start);
    let j1 = idx.partition_point(|&i| usize::from(i) < range.end);
    let stage = &mut chain.stages[si];
    let Scratch { keys, hashes, idx, handles, metas, times, .. } = scratch;
    let gathered = Gathered { keys: &keys[j0..j1], hashes: &hashes[j0..j1], idx: &idx[j0..j1], times: &times[j0..j1] };
    bulk_upsert(&mut stores[k], gathered, handles, flows, |i, u| {
        let pctx = packet_ctx(batch, i, ctx);
        upsert_one(stage, batch.data_mut(i), &metas[i], &pctx, u)
    });
}

/// Packet `i`'s entry in stage `si`'s own store `k`, looked up key by key
/// (inserting a miss); `FlowRef::NONE` for an unparsed or dropped packet and
/// a full table. The per-NF layout's path for IPv6 and for ranges of one
/// packet (chains that end flows may run packet by packet: a bulk lookup's
/// setup would cost more than it hides).
pub(crate) fn lookup_key(
    cx: &mut ExecContext,
    k: usize,
    si: usize,
    batch: &mut Batch,
    i: usize,
    ctx: &NfContext,
) -> FlowRef {
    let ExecContext { stores, chain, scratch, .. } = cx;
    let meta = scratch.metas[i];
    if !meta.valid || batch.is_dropped(i) {
        return FlowRef::NONE;
    }
    let h = hash_tuple(&meta.tuple, scratch.seed);
    let pctx = packet_ctx(batch, i, ctx);
    let data = batch.data_mut(i);
    let stage = &mut chain.stages[si];
    stores[k]
        .upsert(&meta.tuple, h, pctx.now_ns, |u| upsert_one(stage, data, &meta, &pctx, u))
        .map_or(FlowRef::NONE, |(r, _)| r)
}

/// The aggregated layout's add-on-miss callback for a packet: an expired
/// flow's state is released (NAT ports, pins), a new block initialised.
#[inline]
fn upsert_all(
    stages: &mut [Stage],
    aux: Option<&Aux<'_>>,
    data: &mut [u8],
    meta: &PktMeta,
    ctx: &NfContext,
    u: Upsert<'_, FiveTuple>,
) {
    match u {
        Upsert::Expired(old) => release_all(stages, None, aux, &meta.tuple, old, EndReason::IdleTimeout),
        // Another flow's entry reused (`--table-full evict`): its last record is not lost.
        Upsert::Evicted(key, old) => release_all(stages, None, aux, key, old, EndReason::LackOfResources),
        Upsert::New(block) => init_all(stages, aux, data, meta, ctx, block),
    }
}

/// The per-NF layout's add-on-miss callback for one stage's store.
#[inline]
fn upsert_one(stage: &mut Stage, data: &mut [u8], meta: &PktMeta, ctx: &NfContext, u: Upsert<'_, FiveTuple>) {
    let (key, old, reason) = match u {
        Upsert::New(block) => return init_one(stage, data, meta, ctx, block),
        Upsert::Expired(old) => (&meta.tuple, old, EndReason::IdleTimeout),
        Upsert::Evicted(key, old) => (key, old, EndReason::LackOfResources),
    };
    if let Stage::Stateful { nf, .. } = stage {
        if let Some(b) = old.get(..nf.state_size()) {
            nf.release_bytes(key, b, reason);
        }
    }
}

/// Runs the default action (add-on-miss) of every 5-tuple NF into a fresh
/// aggregated block; with the auxiliary table on, also pins the flow's
/// coarse entries and stores their handles in the block.
#[inline]
fn init_all(
    stages: &mut [Stage],
    aux: Option<&Aux<'_>>,
    data: &mut [u8],
    meta: &PktMeta,
    ctx: &NfContext,
    block: &mut [u8],
) {
    let pkt = Pkt::new(data, meta);
    for s in stages.iter_mut() {
        if let Stage::Stateful { nf, offset, group: None, idle, .. } = s {
            let sz = nf.state_size();
            if let Some(dst) = block.get_mut(*offset..*offset + sz) {
                nf.init_into(&pkt, ctx, dst);
            }
            // The NF's idle stamp starts with the flow (its first packet's time).
            if let Some(dst) = idle.and_then(|s| block.get_mut(s.at..s.at + 8)) {
                dst.copy_from_slice(&ctx.now_ns.to_ne_bytes());
            }
        }
    }
    if let Some(aux) = aux {
        for (g, layout) in aux.groups.iter().enumerate() {
            let bits = match group_key(layout.granularity, meta) {
                Some(k) => aux.shared.tables[g]
                    .acquire(&k, coarse_hash(k, aux.seed), aux.now, |_, _| {})
                    .map_or(aux_refused_bits(), |(h, _)| handle_bits(h)),
                None => handle_bits(SharedHandle::NONE),
            };
            if let Some(dst) = block.get_mut(layout.aux_offset..layout.aux_offset + 8) {
                dst.copy_from_slice(&bits.to_ne_bytes());
            }
        }
    }
}

/// Default action of one stage into its own block (per-NF layout).
#[inline]
fn init_one(stage: &mut Stage, data: &mut [u8], meta: &PktMeta, ctx: &NfContext, block: &mut [u8]) {
    if let Stage::Stateful { nf, .. } = stage {
        let pkt = Pkt::new(data, meta);
        let sz = nf.state_size();
        if let Some(dst) = block.get_mut(..sz) {
            nf.init_into(&pkt, ctx, dst);
        }
    }
}

/// Where a coarse NF's state is for one packet: its shared entry and its place in it.
struct Coarse<'a> {
    /// The NF's index in its group ("initialised" bit).
    member: usize,
    /// Byte offset of its state in the entry's state words.
    offset: usize,
    /// Its idle stamp (every coarse NF has one once the chain is compiled).
    idle: Option<IdleSlot>,
    /// The group's granularity (the key's projection for `release`).
    granularity: Granularity,
    /// The group's shared table.
    table: &'a SharedFlowTable<u128>,
    /// The packet's pinned entry.
    h: SharedHandle,
    /// The other cores' clocks (the idle rule of shared state).
    clock: SharedClock,
}

/// Runs a coarse NF's action for packet `i` on its shared entry, under the
/// entry's lock; its default action runs first if this NF has not initialised
/// the entry yet, or if its stamp says the state idled past the NF's timeout
/// (then after `release` on the old state, counted in `resets`) — whether
/// or not flows pin the entry. Returns the action to apply (None: the packet
/// was already dropped).
#[allow(clippy::too_many_arguments)]
#[inline]
fn coarse_one(
    nf: &mut dyn StatefulStage,
    c: &Coarse<'_>,
    batch: &mut Batch,
    i: usize,
    meta: &PktMeta,
    ctx: &NfContext,
    counters: &mut NfCounters,
    resets: &mut u64,
) -> Option<Action> {
    if !arrive(batch, i, counters) {
        return None;
    }
    if !meta.valid {
        return Some(nf.on_unparsed());
    }
    // No entry: the packet has no key of this granularity (a TEID counter
    // seeing non-GTP-U traffic, an IPv6 packet for an IP pair: as unparsed),
    // or the shared table was full (no room at the flow's start nor now).
    if !c.h.is_some() {
        if group_key(c.granularity, meta).is_none() {
            return Some(nf.on_unparsed());
        }
        let pctx = packet_ctx(batch, i, ctx);
        return Some(nf.on_no_state_pkt(&Pkt::new(batch.data_mut(i), meta), &pctx));
    }
    let Some(words) = c.table.state(c.h) else {
        let pctx = packet_ctx(batch, i, ctx);
        return Some(nf.on_no_state_pkt(&Pkt::new(batch.data_mut(i), meta), &pctx));
    };
    let (sz, offset) = (nf.state_size(), c.offset);
    let bit = 2u64 << c.member;
    let ctx = &packet_ctx(batch, i, ctx);
    let a = with_locked(words, |flags, buf| {
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(buf);
        let fresh = *flags & bit == 0;
        let mut idle = false;
        if let Some(slot) = c.idle {
            if let Some(b) = bytes.get_mut(slot.at..slot.at + 8) {
                let mut stamp = u64::from_ne_bytes(b.try_into().unwrap_or([0; 8]));
                // Judged on the cores' one clock, not this core's alone (see `CoreClocks`) —
                // except for an NF that fails closed (access control: portknock, fw, ...):
                // its state ends at its timeout by the packet's own time, so a core behind
                // never holds a hole open for a packet after the timeout (a knock state that
                // expired is gone for the packet at t = 20 s whatever the other core's clock).
                let clock = if slot.own_clock { SharedClock { behind: u64::MAX, ..c.clock } } else { c.clock };
                idle = touch_shared(&mut stamp, ctx.now_ns, &clock, slot.timeout_ns) && !fresh;
                b.copy_from_slice(&stamp.to_ne_bytes());
            }
        }
        let Some(st) = bytes.get_mut(offset..offset + sz) else { return Action::Drop };
        let mut pkt = Pkt::new(batch.data_mut(i), meta);
        if idle {
            if let Some(t) = c.table.key(c.h).and_then(|k| key_tuple(c.granularity, k)) {
                nf.release_bytes(&t, st, EndReason::IdleTimeout);
            }
            st.fill(0);
            *resets += 1;
        }
        if fresh || idle {
            nf.init_into(&pkt, ctx, st);
            *flags |= bit;
        }
        nf.process_bytes(&mut pkt, st, ctx)
    });
    // A coarse entry outlives any one flow: end-of-flow requests keep only their verdict.
    Some(match a.unwrap_or(Action::Drop) {
        Action::EndFlow => Action::Pass,
        Action::DropEndFlow | Action::Refuse => Action::Drop,
        other => other,
    })
}

/// Calls every 5-tuple NF's release callback for a flow's block (all NFs,
/// or the `pernf`-th 5-tuple stage with its own block at offset 0), and
/// unpins the flow's coarse entries when the auxiliary table is on.
fn release_all(
    stages: &mut [Stage],
    pernf: Option<usize>,
    aux: Option<&Aux<'_>>,
    key: &FiveTuple,
    block: &[u8],
    reason: EndReason,
) {
    if let Some(aux) = aux {
        for (g, layout) in aux.groups.iter().enumerate() {
            if let Some(b) = block.get(layout.aux_offset..layout.aux_offset + 8) {
                let h = aux_handle(b);
                if h.is_some() {
                    aux.shared.tables[g].release(h, aux.now);
                }
            }
        }
    }
    let mut k = 0;
    for s in stages.iter_mut() {
        if let Stage::Stateful { nf, offset, group: None, .. } = s {
            let sz = nf.state_size();
            match pernf {
                Some(p) if p == k => {
                    if let Some(b) = block.get(..sz) {
                        nf.release_bytes(key, b, reason);
                    }
                }
                Some(_) => {}
                None => {
                    if let Some(b) = block.get(*offset..*offset + sz) {
                        nf.release_bytes(key, b, reason);
                    }
                }
            }
            k += 1;
        }
    }
}

/// An IPFIX record of one flow's block from every 5-tuple NF that exports
/// flows (all NFs, or the `pernf`-th 5-tuple stage), the state kept.
fn report_flow(stages: &mut [Stage], pernf: Option<usize>, key: &FiveTuple, block: &[u8], reason: EndReason) {
    let mut k = 0;
    for s in stages.iter_mut() {
        if let Stage::Stateful { nf, offset, group: None, .. } = s {
            let sz = nf.state_size();
            let at = match pernf {
                Some(p) if p == k => Some(0),
                Some(_) => None,
                None => Some(*offset),
            };
            if let Some(b) = at.and_then(|o| block.get(o..o + sz)) {
                if nf.ipfix_on() {
                    nf.ipfix_flow_bytes(key, b, reason);
                }
            }
            k += 1;
        }
    }
}

/// Releases and removes one flow.
fn remove_flow(
    stages: &mut [Stage],
    store: &mut FlowStore,
    pernf: Option<usize>,
    aux: Option<&Aux<'_>>,
    flow: FlowRef,
) -> bool {
    // An entry already removed (a second end request in the same batch) has no key.
    let Some(key) = store.key(flow) else { return false };
    release_all(stages, pernf, aux, &key, store.block(flow), EndReason::EndOfFlow);
    store.remove(flow)
}

/// Removes the flows whose packets asked to end them (each entry once); returns (ended, removed as
/// refused on their first packet: the bits of `refused`).
pub(crate) fn end_flows(
    stages: &mut [Stage],
    store: &mut FlowStore,
    pernf: Option<usize>,
    aux: Option<&Aux<'_>>,
    flows: &[FlowRef],
    ends: &[u64; 4],
    refused: &[u64; 4],
) -> (u64, u64) {
    if ends.iter().all(|&e| e == 0) {
        return (0, 0);
    }
    let (mut ended, mut gone) = (0, 0);
    for (w, &e) in ends.iter().enumerate() {
        let mut m = e;
        while m != 0 {
            let i = w * 64 + m.trailing_zeros() as usize;
            m &= m - 1;
            if let Some(&flow) = flows.get(i) {
                let removed = remove_flow(stages, store, pernf, aux, flow) as u64;
                if refused[w] & (1 << (i & 63)) != 0 {
                    gone += removed;
                } else {
                    ended += removed;
                }
            }
        }
    }
    (ended, gone)
}

#[cfg(test)]
mod tests {
    use super::sweep_period_ns;

    const S: u64 = 1_000_000_000;

    #[test]
    fn sweep_period_is_a_quarter_then_a_second_then_a_tenth() {
        assert_eq!(sweep_period_ns(S), S / 4);
        assert_eq!(sweep_period_ns(4 * S), S);
        assert_eq!(sweep_period_ns(10 * S), S);
        assert_eq!(sweep_period_ns(30 * S), 3 * S);
        assert_eq!(sweep_period_ns(3600 * S), 360 * S);
        // Never zero (a zero period would divide by zero in the pacing), never over a quarter.
        assert_eq!(sweep_period_ns(0), 1);
        assert_eq!(sweep_period_ns(3), 1);
        for t in [1, 7, S / 3, 2 * S, 11 * S, u64::MAX] {
            let p = sweep_period_ns(t);
            assert!(p >= 1 && p <= (t / 4).max(1), "timeout {t}: period {p}");
        }
    }
}
