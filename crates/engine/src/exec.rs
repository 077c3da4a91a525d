//! Executors: how a compiled chain meets its state.
//!
//! - `batch` (FAJITA): the batch stays whole; one bulk lookup-or-insert per
//!   batch into the aggregated table (buckets and entries prefetched by the
//!   table), a state-slot annotation per packet, the second line of large
//!   blocks and each NF's indirect state (prefetch hook) prefetched ahead of
//!   use, drops only mask packets.
//! - `rtc`: per-packet run-to-completion: parse, single-key lookup, every NF,
//!   next packet; no batching of lookups, no prefetch.
//! - `pernf` (VPP's model): one table per NF, a bulk lookup per NF per batch.
//! - `microbatch` (FastClick without its batch rebuilder): the batch is cut
//!   into runs of consecutive packets of one flow; one lookup per run.
//!
//! All executors run the same NF code and produce the same verdicts and
//! state (checked by tests).

// Per-packet arrays (metas, slots, handles, the batch) are walked together by index.
#![allow(clippy::needless_range_loop)]

use std::fmt;

use flowplane_nf::stateful::{apply_action, Action, BatchOutcome, DynStateful};
use flowplane_nf::store::{FlowStore, StoreConfig, NO_SLOT};
use flowplane_nf::{NfContext, NfCounters, Pkt, PktMeta};
use flowplane_packet::{Batch, MAX_BATCH};
use flowplane_table::{FullPolicy, TableStats, BULK_LOOKUP_MAX as TABLE_BATCH, INVALID_HANDLE};
use flowplane_wire::flow::{FiveTuple, FiveTupleV4};
use flowplane_wire::hash::HashableKey;
use serde::Serialize;

use crate::chain::{Chain, Stage};
use crate::coarse::{aux_handle, coarse_hash, handle_bits, key_tuple, with_locked, GroupLayout, SharedStores};
use flowplane_table::shared::SharedHandle;

/// Seed of the flow-table hash.
const HASH_SEED: u32 = 0x9e37_79b9;
/// Packets ahead at which the prefetch hook runs.
const PREFETCH_AHEAD: usize = 4;

/// Which executor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ExecKind {
    /// FAJITA's batched executor.
    Batch,
    /// Per-packet run-to-completion.
    Rtc,
    /// One table per NF.
    PerNf,
    /// Per-flow micro-batches.
    MicroBatch,
}

impl ExecKind {
    /// Parses `batch|rtc|pernf|microbatch`.
    pub fn parse(s: &str) -> Result<ExecKind, String> {
        match s {
            "batch" => Ok(ExecKind::Batch),
            "rtc" => Ok(ExecKind::Rtc),
            "pernf" => Ok(ExecKind::PerNf),
            "microbatch" => Ok(ExecKind::MicroBatch),
            _ => Err(format!("unknown executor '{s}' (known: batch, rtc, pernf, microbatch)")),
        }
    }

    /// Names of all executors.
    pub const ALL: [&'static str; 4] = ["batch", "rtc", "pernf", "microbatch"];
}

impl fmt::Display for ExecKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ExecKind::Batch => "batch",
            ExecKind::Rtc => "rtc",
            ExecKind::PerNf => "pernf",
            ExecKind::MicroBatch => "microbatch",
        })
    }
}

/// Executor and state-store settings.
#[derive(Clone, Copy, Debug)]
pub struct ExecConfig {
    /// Which executor.
    pub kind: ExecKind,
    /// Software prefetch (bulk lookups, block lines, NF hooks). Off: the
    /// batch executor looks up key by key and skips every prefetch.
    pub prefetch: bool,
    /// Flows per core (IPv4 table; IPv6 gets a quarter).
    pub flows: usize,
    /// Idle timeout when no NF declares one.
    pub default_idle_timeout_ns: u64,
    /// Full-table policy.
    pub full_policy: FullPolicy,
    /// Hugepage-backed tables.
    pub hugepages: bool,
    /// Run the NFs' prefetch hooks (indirect state) ahead of their actions.
    pub prefetch_hooks: bool,
    /// FAJITA's auxiliary table: keep pinned handles to coarse (shared) state
    /// in each flow's aggregated block instead of a shared lookup per packet.
    pub aux: bool,
}

impl Default for ExecConfig {
    fn default() -> Self {
        ExecConfig {
            kind: ExecKind::Batch,
            prefetch: true,
            flows: 1 << 20,
            default_idle_timeout_ns: 30_000_000_000,
            full_policy: FullPolicy::Reject,
            hugepages: true,
            prefetch_hooks: true,
            aux: true,
        }
    }
}

/// Table figures for the report.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct StoreReport {
    /// Live flows at the end.
    pub flows: u64,
    /// Capacity.
    pub capacity: u64,
    /// Insertions (add-on-miss).
    pub insertions: u64,
    /// Expired entries.
    pub expiries: u64,
    /// Flows ended by an NF (FIN/RST, ...).
    pub ended: u64,
    /// Inserts refused because the table was full.
    pub table_full: u64,
    /// Entries evicted to make room.
    pub evictions: u64,
    /// Packets without a flow key (non-IP, malformed).
    pub unparsed: u64,
    /// Lookups in the shared (coarse) tables.
    pub shared_lookups: u64,
}

impl StoreReport {
    /// Adds another core's figures.
    pub fn merge(&mut self, o: &StoreReport) {
        self.flows += o.flows;
        self.capacity += o.capacity;
        self.insertions += o.insertions;
        self.expiries += o.expiries;
        self.ended += o.ended;
        self.table_full += o.table_full;
        self.evictions += o.evictions;
        self.unparsed += o.unparsed;
        self.shared_lookups += o.shared_lookups;
    }
}

/// Per-batch scratch, reused (no allocation per batch).
struct Scratch {
    metas: Box<[PktMeta; MAX_BATCH]>,
    keys: Box<[FiveTupleV4; MAX_BATCH]>,
    hashes: Box<[u64; MAX_BATCH]>,
    idx: Box<[u16; MAX_BATCH]>,
    handles: Box<[u32; MAX_BATCH]>,
    slots: Box<[u32; MAX_BATCH]>,
}

impl Scratch {
    fn new() -> Self {
        Scratch {
            metas: Box::new([PktMeta::default(); MAX_BATCH]),
            keys: Box::new([FiveTupleV4::default(); MAX_BATCH]),
            hashes: Box::new([0; MAX_BATCH]),
            idx: Box::new([0; MAX_BATCH]),
            handles: Box::new([0; MAX_BATCH]),
            slots: Box::new([NO_SLOT; MAX_BATCH]),
        }
    }
}

/// One core's chain with its state: the thing a worker calls per batch.
pub struct Executor {
    cfg: ExecConfig,
    chain: Chain,
    /// Aggregated store (batch, rtc, microbatch) or one per stateful stage (pernf).
    stores: Vec<FlowStore>,
    /// Per-stateful-stage slots for pernf.
    pernf_slots: Vec<[u32; MAX_BATCH]>,
    scratch: Scratch,
    ended: u64,
    unparsed: u64,
    /// Bytes of the aggregated block spanning more than one cache line after the entry header.
    multi_line: bool,
    /// Shared tables of the coarse groups (shared with the other cores).
    shared: SharedStores,
    /// Per coarse group: this batch's handles.
    coarse: Vec<[SharedHandle; MAX_BATCH]>,
    /// Shared-table lookups done (non-aux mode: one per packet per group).
    shared_lookups: u64,
    /// Expiry pacing: time of the last sweep step, entries to sweep, sweep period.
    last_sweep_ns: u64,
    sweep_entries: u64,
    sweep_period_ns: u64,
}

#[inline(always)]
fn hash_tuple(t: &FiveTuple) -> u64 {
    match t {
        FiveTuple::V4(k) => k.hash64(HASH_SEED),
        FiveTuple::V6(k) => k.hash64(HASH_SEED),
    }
}

impl Executor {
    /// Builds the executor and allocates its per-core tables; `shared` holds
    /// the coarse groups' tables (create them once per run with
    /// [`SharedStores::new`] from `chain.groups`; an empty one is fine for
    /// chains without coarse NFs).
    pub fn new(chain: Chain, cfg: ExecConfig, shared: SharedStores) -> Result<Self, String> {
        if cfg.full_policy == FullPolicy::EvictLruIdle {
            // Eviction drops a flow without the release callbacks: refuse it
            // where that would leak (NAT ports, pins on shared state).
            for st in &chain.stages {
                if let Stage::Stateful { nf, .. } = st {
                    if nf.has_release() {
                        return Err(format!(
                            "table-full policy 'evict' would drop {} state without releasing it; use 'reject'",
                            nf.name()
                        ));
                    }
                }
            }
            if cfg.aux && !chain.groups.is_empty() {
                return Err("table-full policy 'evict' would leak the auxiliary table's pins on shared state; use 'reject' or --no-aux".to_string());
            }
        }
        if shared.tables.len() != chain.groups.len() {
            return Err(format!(
                "the chain has {} coarse groups but {} shared tables were given",
                chain.groups.len(),
                shared.tables.len()
            ));
        }
        let timeout_ns = chain.idle_timeout_ns.unwrap_or(cfg.default_idle_timeout_ns);
        let timeout = Some(timeout_ns);
        let store_cfg = |size: usize| StoreConfig {
            capacity: cfg.flows,
            capacity_v6: (cfg.flows / 4).max(1024),
            state_size: size,
            idle_timeout_ns: timeout,
            full_policy: cfg.full_policy,
            hugepages: cfg.hugepages,
        };
        let mut stores = Vec::new();
        let mut pernf_slots = Vec::new();
        if chain.is_stateful() {
            if cfg.kind == ExecKind::PerNf {
                for s in &chain.stages {
                    if let Stage::Stateful { nf, .. } = s {
                        stores.push(FlowStore::new(store_cfg(nf.state_size())).map_err(|e| e.to_string())?);
                        pernf_slots.push([NO_SLOT; MAX_BATCH]);
                    }
                }
            } else {
                stores.push(FlowStore::new(store_cfg(chain.state_size)).map_err(|e| e.to_string())?);
            }
        }
        // Entry header (key 16 + hash 8 + last-seen 8) shares the first line with the state.
        let multi_line = chain.state_size > 32;
        let coarse = chain.groups.iter().map(|_| [SharedHandle::NONE; MAX_BATCH]).collect();
        Ok(Executor {
            cfg,
            chain,
            stores,
            pernf_slots,
            scratch: Scratch::new(),
            ended: 0,
            unparsed: 0,
            multi_line,
            shared,
            coarse,
            shared_lookups: 0,
            last_sweep_ns: 0,
            sweep_entries: (cfg.flows as u64).max(1024),
            sweep_period_ns: (timeout_ns / 4).max(1),
        })
    }

    /// The executor kind.
    pub fn kind(&self) -> ExecKind {
        self.cfg.kind
    }

    /// Processes one batch through the whole chain.
    pub fn process(&mut self, batch: &mut Batch, ctx: &NfContext) {
        if !self.chain.is_stateful() {
            for s in self.chain.stages.iter_mut() {
                if let Stage::Stateless(nf) = s {
                    nf.process(batch, ctx);
                }
            }
            return;
        }
        let n = batch.len();
        for i in 0..n {
            let m = &mut self.scratch.metas[i];
            m.parse_into(batch.data(i));
            self.unparsed += u64::from(!m.valid);
        }
        match self.cfg.kind {
            ExecKind::Batch => self.run_staged(batch, ctx, self.cfg.prefetch),
            ExecKind::MicroBatch => self.run_staged(batch, ctx, false),
            ExecKind::Rtc => self.run_rtc(batch, ctx),
            ExecKind::PerNf => self.run_pernf(batch, ctx),
        }
        self.expire(ctx.now_ns, n);
    }

    /// Whether coarse handles live in the flows' aggregated blocks.
    fn aux_on(&self) -> bool {
        self.cfg.aux && self.cfg.kind != ExecKind::PerNf && !self.chain.groups.is_empty()
    }

    /// Bounded expiry work per batch, paced by time rather than packets: the
    /// sweep visits every slab entry about four times per idle timeout, which
    /// is what expiry needs, instead of touching DRAM-resident entries on
    /// every packet. Capped per batch so a clock jump cannot stall a batch.
    fn expire(&mut self, now: u64, n: usize) {
        let elapsed = now.saturating_sub(self.last_sweep_ns);
        let per_entry_ns = (self.sweep_period_ns / self.sweep_entries.max(1)).max(1);
        let due = elapsed / per_entry_ns;
        if due == 0 {
            return;
        }
        self.last_sweep_ns += due * per_entry_ns;
        let budget = (due as usize).min(4 * n.max(16));
        let aux_on = self.aux_on();
        let Executor { stores, chain, shared, cfg, .. } = self;
        let Chain { stages, groups, .. } = chain;
        let aux = Aux { groups, shared, now };
        let pernf = cfg.kind == ExecKind::PerNf;
        for (k, store) in stores.iter_mut().enumerate() {
            store.expire(now, budget, |key, block| {
                release_all(stages, pernf.then_some(k), aux_on.then_some(&aux), key, block)
            });
        }
        for (g, t) in shared.tables.iter().enumerate() {
            let gran = groups[g].granularity;
            // Coarse NFs get their release callback too (on whichever core sweeps).
            t.expire(now, budget.min(n.max(8)), |key, words| {
                let Some(tuple) = key_tuple(gran, *key) else { return };
                let _ = with_locked(words, |flags, buf| {
                    let bytes: &mut [u8] = bytemuck::cast_slice_mut(buf);
                    for st in stages.iter_mut() {
                        if let Stage::Stateful { nf, offset, group: Some(sg), member, .. } = st {
                            let sz = nf.state_size();
                            if *sg == g && *flags & (2u64 << *member) != 0 {
                                if let Some(b) = bytes.get(*offset..*offset + sz) {
                                    nf.release_bytes(&tuple, b);
                                }
                            }
                        }
                    }
                });
            });
        }
    }

    /// Looks up (inserting misses) every valid packet of the batch in the
    /// aggregated store; fills `scratch.slots`. Bulk for IPv4 when `bulk`,
    /// key by key otherwise and for IPv6. On insertion, every NF's default
    /// action runs and (aux on) the flow pins its coarse entries.
    fn lookup_aggregated(&mut self, batch: &mut Batch, ctx: &NfContext, bulk: bool) {
        let n = batch.len();
        let aux_on = self.aux_on();
        let Executor { stores, chain, scratch, shared, .. } = self;
        let Chain { stages, groups, .. } = chain;
        let aux = Aux { groups, shared, now: ctx.now_ns };
        let aux = aux_on.then_some(&aux);
        let store = &mut stores[0];
        let mut m = 0usize;
        for i in 0..n {
            scratch.slots[i] = NO_SLOT;
            let meta = scratch.metas[i];
            if !meta.valid {
                continue;
            }
            match meta.tuple {
                FiveTuple::V4(k) if bulk => {
                    scratch.keys[m] = k;
                    scratch.hashes[m] = k.hash64(HASH_SEED);
                    scratch.idx[m] = i as u16;
                    m += 1;
                }
                t => {
                    let h = hash_tuple(&t);
                    let data = batch.data_mut(i);
                    let r = store
                        .lookup_or_insert(&t, h, ctx.now_ns, |block| init_all(stages, aux, data, &meta, ctx, block));
                    if let Some((slot, _)) = r {
                        scratch.slots[i] = slot;
                    }
                }
            }
        }
        let Scratch { keys, hashes, idx, handles, slots, metas, .. } = scratch;
        bulk_lookup_or_insert(store, &keys[..m], &hashes[..m], &idx[..m], handles, ctx.now_ns, slots, |i, block| {
            init_all(stages, aux, batch.data_mut(i), &metas[i], ctx, block)
        });
    }

    /// Fills this batch's coarse handles: from the flows' blocks (aux on) or
    /// by pinning every packet's coarse entries in the shared tables (aux off;
    /// released by [`Executor::unpin_coarse`] after the chain).
    fn pin_coarse(&mut self, n: usize, now: u64) {
        if self.chain.groups.is_empty() {
            return;
        }
        if self.aux_on() {
            let store = &self.stores[0];
            for (g, layout) in self.chain.groups.iter().enumerate() {
                let hs = &mut self.coarse[g];
                for i in 0..n {
                    let slot = self.scratch.slots[i];
                    hs[i] = match store.block(slot).get(layout.aux_offset..layout.aux_offset + 8) {
                        Some(b) if slot != NO_SLOT => aux_handle(b),
                        _ => SharedHandle::NONE,
                    };
                    // The shared entries are as cold as the flow's block was:
                    // start their misses for the whole batch before the NFs run.
                    // (For writing: every packet takes the entry's lock.)
                    if let Some(w) = self.shared.tables[g].state(hs[i]).and_then(|w| w.first()) {
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
        for (g, layout) in self.chain.groups.iter().enumerate() {
            let mut m = 0;
            for i in 0..n {
                self.coarse[g][i] = SharedHandle::NONE;
                let meta = &self.scratch.metas[i];
                if let Some(k) = meta.valid.then(|| layout.granularity.key(meta)).flatten() {
                    keys[m] = k;
                    hashes[m] = coarse_hash(k);
                    idx[m] = i as u16;
                    m += 1;
                }
            }
            self.shared.tables[g].acquire_batch(&keys[..m], &hashes[..m], now, &mut out[..m], |_, _| {});
            self.shared_lookups += m as u64;
            for j in 0..m {
                self.coarse[g][idx[j] as usize] = out[j];
            }
        }
    }

    /// Releases the pins of [`Executor::pin_coarse`] (aux off only).
    fn unpin_coarse(&mut self, n: usize, now: u64) {
        if self.chain.groups.is_empty() || self.aux_on() {
            return;
        }
        for (g, t) in self.shared.tables.iter().enumerate() {
            for h in &self.coarse[g][..n] {
                if h.is_some() {
                    t.release(*h, now);
                }
            }
        }
    }

    /// Batched (FAJITA) and micro-batched executors: lookups, then each NF over the whole batch.
    fn run_staged(&mut self, batch: &mut Batch, ctx: &NfContext, prefetch: bool) {
        let n = batch.len();
        if self.cfg.kind == ExecKind::MicroBatch {
            self.lookup_runs(batch, ctx);
        } else {
            self.lookup_aggregated(batch, ctx, prefetch);
        }
        self.pin_coarse(n, ctx.now_ns);
        let aux_on = self.aux_on();
        let self_hooks = self.cfg.prefetch_hooks;
        let Executor { stores, chain, scratch, ended, multi_line, shared, coarse, .. } = self;
        let store = &mut stores[0];
        if prefetch && *multi_line {
            // The lookup brought each entry's first line; fetch the next one now,
            // a full chain pass before the NFs that keep state there need it.
            for &s in &scratch.slots[..n] {
                if s != NO_SLOT {
                    if let Some(b) = store.block(s).get(32) {
                        flowplane_packet::prefetch::write(b);
                    }
                }
            }
        }
        let ahead = if prefetch && self_hooks { PREFETCH_AHEAD } else { 0 };
        let mut ends = [0u64; 4];
        let Chain { stages, groups, .. } = chain;
        for stage in stages.iter_mut() {
            match stage {
                Stage::Stateless(nf) => nf.process(batch, ctx),
                Stage::Stateful { nf, offset, group: None, counters, .. } => {
                    let mut out = BatchOutcome::default();
                    nf.process_batch(
                        batch,
                        &scratch.metas[..n],
                        &scratch.slots[..n],
                        store,
                        *offset,
                        ctx,
                        ahead,
                        &mut out,
                    );
                    counters.merge(&out.counters);
                    for (e, o) in ends.iter_mut().zip(out.end) {
                        *e |= o;
                    }
                }
                Stage::Stateful { nf, offset, group: Some(g), member, counters } => {
                    let t = &shared.tables[*g];
                    for i in 0..n {
                        let h = coarse[*g][i];
                        let a =
                            coarse_one(nf.as_mut(), *member, *offset, t, h, batch, i, &scratch.metas[i], ctx, counters);
                        if let Some(a) = a {
                            apply_action(batch, i, a, counters);
                        }
                    }
                }
            }
        }
        let aux = Aux { groups, shared, now: ctx.now_ns };
        *ended += end_flows(stages, store, None, aux_on.then_some(&aux), &scratch.slots[..n], &ends);
        self.unpin_coarse(n, ctx.now_ns);
    }

    /// FastClick-style lookups: one single-key lookup per run of consecutive
    /// packets of the same flow (no bulk, no prefetch).
    fn lookup_runs(&mut self, batch: &mut Batch, ctx: &NfContext) {
        let n = batch.len();
        let aux_on = self.aux_on();
        let Executor { stores, chain, scratch, shared, .. } = self;
        let Chain { stages, groups, .. } = chain;
        let aux = Aux { groups, shared, now: ctx.now_ns };
        let aux = aux_on.then_some(&aux);
        let store = &mut stores[0];
        let mut i = 0;
        while i < n {
            let meta = scratch.metas[i];
            let mut j = i + 1;
            while j < n && scratch.metas[j].valid == meta.valid && scratch.metas[j].tuple == meta.tuple {
                j += 1;
            }
            let mut slot = NO_SLOT;
            if meta.valid {
                let h = hash_tuple(&meta.tuple);
                let data = batch.data_mut(i);
                if let Some((s, _)) =
                    store.lookup_or_insert(&meta.tuple, h, ctx.now_ns, |b| init_all(stages, aux, data, &meta, ctx, b))
                {
                    slot = s;
                }
            }
            for s in scratch.slots[i..j].iter_mut() {
                *s = slot;
            }
            i = j;
        }
    }

    /// Per-packet run-to-completion: packet i is looked up (single key) and
    /// runs through every NF before packet i+1 is touched. Stateless stages
    /// cut the chain into segments, each run packet by packet.
    fn run_rtc(&mut self, batch: &mut Batch, ctx: &NfContext) {
        let n = batch.len();
        let aux_on = self.aux_on();
        let Executor { stores, chain, scratch, ended, shared, shared_lookups, .. } = self;
        let Chain { stages, groups, .. } = chain;
        let aux = Aux { groups, shared, now: ctx.now_ns };
        let auxr = aux_on.then_some(&aux);
        let store = &mut stores[0];
        let mut seg_start = 0;
        let mut looked_up = false;
        while seg_start < stages.len() {
            if let Stage::Stateless(nf) = &mut stages[seg_start] {
                nf.process(batch, ctx);
                seg_start += 1;
                continue;
            }
            let seg_end =
                (seg_start..stages.len()).find(|&k| matches!(stages[k], Stage::Stateless(_))).unwrap_or(stages.len());
            for i in 0..n {
                let meta = scratch.metas[i];
                if !looked_up {
                    scratch.slots[i] = NO_SLOT;
                    if meta.valid {
                        let h = hash_tuple(&meta.tuple);
                        let data = batch.data_mut(i);
                        let st = &mut *stages;
                        if let Some((slot, _)) = store
                            .lookup_or_insert(&meta.tuple, h, ctx.now_ns, |b| init_all(st, auxr, data, &meta, ctx, b))
                        {
                            scratch.slots[i] = slot;
                        }
                    }
                }
                let slot = scratch.slots[i];
                let mut end = false;
                for stage in stages[seg_start..seg_end].iter_mut() {
                    let Stage::Stateful { nf, offset, group, member, counters } = stage else { continue };
                    if let Some(g) = *group {
                        // Coarse state: the handle from the flow's block (aux) or a pinned lookup for this packet.
                        let t = &shared.tables[g];
                        let layout = &groups[g];
                        let (h, pinned) = if aux_on {
                            let b = store.block(slot).get(layout.aux_offset..layout.aux_offset + 8);
                            (b.map_or(SharedHandle::NONE, aux_handle), false)
                        } else {
                            match meta.valid.then(|| layout.granularity.key(&meta)).flatten() {
                                Some(k) => {
                                    *shared_lookups += 1;
                                    (
                                        t.acquire(&k, coarse_hash(k), ctx.now_ns, |_, _| {})
                                            .map_or(SharedHandle::NONE, |(h, _)| h),
                                        true,
                                    )
                                }
                                None => (SharedHandle::NONE, false),
                            }
                        };
                        if let Some(a) = coarse_one(nf.as_mut(), *member, *offset, t, h, batch, i, &meta, ctx, counters)
                        {
                            apply_action(batch, i, a, counters);
                        }
                        if pinned && h.is_some() {
                            t.release(h, ctx.now_ns);
                        }
                        continue;
                    }
                    if batch.is_dropped(i) {
                        continue;
                    }
                    counters.packets_in += 1;
                    counters.bytes_in += batch.lens()[i] as u64;
                    let action = if slot == NO_SLOT {
                        nf.on_unparsed()
                    } else {
                        let block = store.block_mut(slot);
                        let sz = nf.state_size();
                        match block.get_mut(*offset..*offset + sz) {
                            Some(st) => nf.process_bytes(&mut Pkt::new(batch.data_mut(i), &meta), st, ctx),
                            None => Action::Drop,
                        }
                    };
                    end |= apply_action(batch, i, action, counters);
                }
                if end && slot != NO_SLOT {
                    *ended += remove_flow(stages, store, None, auxr, slot) as u64;
                    // Later packets of this batch must not reuse the freed slot.
                    for s in scratch.slots[i + 1..n].iter_mut() {
                        if *s == slot {
                            *s = NO_SLOT;
                        }
                    }
                }
            }
            looked_up = true;
            seg_start = seg_end;
        }
    }

    /// VPP's model: every stateful NF has its own table and does its own
    /// (bulk) lookup over the batch.
    fn run_pernf(&mut self, batch: &mut Batch, ctx: &NfContext) {
        let n = batch.len();
        self.pin_coarse(n, ctx.now_ns);
        let hooks = self.cfg.prefetch && self.cfg.prefetch_hooks;
        let Executor { stores, chain, scratch, ended, pernf_slots, shared, coarse, .. } = self;
        let mut k = 0;
        for si in 0..chain.stages.len() {
            match &mut chain.stages[si] {
                Stage::Stateless(nf) => {
                    nf.process(batch, ctx);
                    continue;
                }
                Stage::Stateful { nf, offset, group: Some(g), member, counters } => {
                    let t = &shared.tables[*g];
                    for i in 0..n {
                        let h = coarse[*g][i];
                        if let Some(a) =
                            coarse_one(nf.as_mut(), *member, *offset, t, h, batch, i, &scratch.metas[i], ctx, counters)
                        {
                            apply_action(batch, i, a, counters);
                        }
                    }
                    continue;
                }
                Stage::Stateful { .. } => {}
            }
            let store = &mut stores[k];
            // This NF's own bulk lookup (VPP: a lookup per NF per packet).
            let mut m = 0usize;
            let slots = &mut pernf_slots[k];
            for i in 0..n {
                slots[i] = NO_SLOT;
                let meta = scratch.metas[i];
                if !meta.valid || batch.is_dropped(i) {
                    continue;
                }
                match meta.tuple {
                    FiveTuple::V4(key) => {
                        scratch.keys[m] = key;
                        scratch.hashes[m] = key.hash64(HASH_SEED);
                        scratch.idx[m] = i as u16;
                        m += 1;
                    }
                    t => {
                        let h = hash_tuple(&t);
                        let data = batch.data_mut(i);
                        let stage = &mut chain.stages[si];
                        if let Some((slot, _)) =
                            store.lookup_or_insert(&t, h, ctx.now_ns, |b| init_one(stage, data, &meta, ctx, b))
                        {
                            slots[i] = slot;
                        }
                    }
                }
            }
            let stage = &mut chain.stages[si];
            let Scratch { keys, hashes, idx, handles, metas, .. } = &mut *scratch;
            bulk_lookup_or_insert(store, &keys[..m], &hashes[..m], &idx[..m], handles, ctx.now_ns, slots, |i, b| {
                init_one(stage, batch.data_mut(i), &metas[i], ctx, b)
            });
            let mut out = BatchOutcome::default();
            if let Stage::Stateful { nf, counters, .. } = &mut chain.stages[si] {
                let ahead = if hooks { PREFETCH_AHEAD } else { 0 };
                nf.process_batch(batch, &scratch.metas[..n], &slots[..n], store, 0, ctx, ahead, &mut out);
                counters.merge(&out.counters);
            }
            *ended += end_flows(&mut chain.stages, store, Some(k), None, &slots[..n], &out.end);
            k += 1;
        }
        self.unpin_coarse(n, ctx.now_ns);
    }

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

    /// Table figures (summed over the executor's stores).
    pub fn store_report(&self) -> StoreReport {
        let mut r = StoreReport {
            ended: self.ended,
            unparsed: self.unparsed,
            shared_lookups: self.shared_lookups,
            ..Default::default()
        };
        for s in &self.stores {
            let st: TableStats = s.stats();
            r.flows += s.len() as u64;
            r.capacity += s.capacity() as u64;
            r.insertions += st.inserts;
            r.expiries += st.expiries;
            r.table_full += st.full_events;
            r.evictions += st.evictions;
        }
        r
    }

    /// Export rows of NF `name` (one JSON object per flow or per coarse key),
    /// if it exports state. Coarse state is shared by all cores: export it
    /// from one core only (`include_shared`).
    pub fn export(&self, name: &str, include_shared: bool) -> Option<Vec<serde_json::Value>> {
        let mut k = 0;
        for s in &self.chain.stages {
            let Stage::Stateful { nf, offset, group, member, .. } = s else { continue };
            if nf.name() != name {
                if group.is_none() {
                    k += 1;
                }
                continue;
            }
            let sz = nf.state_size();
            let mut rows = Vec::new();
            if let Some(g) = *group {
                if !include_shared {
                    return Some(rows);
                }
                let gran = self.chain.groups[g].granularity;
                let bit = 2u64 << member;
                self.shared.tables[g].for_each(|_, key, words| {
                    let _ = with_locked(words, |flags, buf| {
                        let bytes: &mut [u8] = bytemuck::cast_slice_mut(buf);
                        if *flags & bit != 0 {
                            if let (Some(t), Some(st)) = (key_tuple(gran, *key), bytes.get(*offset..*offset + sz)) {
                                if let Some(r) = nf.export_row_bytes(&t, st) {
                                    rows.push(r);
                                }
                            }
                        }
                    });
                });
                return Some(rows);
            }
            let (store, off) = if self.cfg.kind == ExecKind::PerNf {
                (self.stores.get(k)?, 0)
            } else {
                (self.stores.first()?, *offset)
            };
            store.for_each(|key, block| {
                if let Some(r) = block.get(off..off + sz).and_then(|b| nf.export_row_bytes(key, b)) {
                    rows.push(r);
                }
            });
            return Some(rows);
        }
        None
    }
}

/// What the auxiliary table needs: the coarse groups and their shared tables.
struct Aux<'a> {
    groups: &'a [GroupLayout],
    shared: &'a SharedStores,
    now: u64,
}

/// Looks up, inserting the misses, the IPv4 keys gathered for a batch (the
/// table takes at most 64 per call); `init(i, block)` is the default action
/// for packet `i`'s new flow and `slots[idx[j]]` receives key j's slot.
#[allow(clippy::too_many_arguments)]
#[inline]
fn bulk_lookup_or_insert(
    store: &mut FlowStore,
    keys: &[FiveTupleV4],
    hashes: &[u64],
    idx: &[u16],
    handles: &mut [u32; MAX_BATCH],
    now_ns: u64,
    slots: &mut [u32; MAX_BATCH],
    mut init: impl FnMut(usize, &mut [u8]),
) {
    for ((keys, hashes), idx) in keys.chunks(TABLE_BATCH).zip(hashes.chunks(TABLE_BATCH)).zip(idx.chunks(TABLE_BATCH)) {
        let out = &mut handles[..keys.len()];
        store.v4().lookup_or_insert_batch(keys, hashes, now_ns, out, |j, block| init(idx[j] as usize, block));
        for (&h, &i) in out.iter().zip(idx) {
            slots[i as usize] = if h == INVALID_HANDLE { NO_SLOT } else { h };
        }
    }
}

/// Runs the default action (add-on-miss) of every 5-tuple NF into a fresh
/// aggregated block; with the auxiliary table on,
/// also pins the flow's coarse entries and stores their handles in the block.
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
        if let Stage::Stateful { nf, offset, group: None, .. } = s {
            let sz = nf.state_size();
            if let Some(dst) = block.get_mut(*offset..*offset + sz) {
                nf.init_into(&pkt, ctx, dst);
            }
        }
    }
    if let Some(aux) = aux {
        for (g, layout) in aux.groups.iter().enumerate() {
            let h = match layout.granularity.key(meta) {
                Some(k) => aux.shared.tables[g]
                    .acquire(&k, coarse_hash(k), aux.now, |_, _| {})
                    .map_or(SharedHandle::NONE, |(h, _)| h),
                None => SharedHandle::NONE,
            };
            if let Some(dst) = block.get_mut(layout.aux_offset..layout.aux_offset + 8) {
                dst.copy_from_slice(&handle_bits(h).to_ne_bytes());
            }
        }
    }
}

/// Runs a coarse NF's action for packet `i` on its shared entry `h`, under the
/// entry's lock; its default action runs first if this NF has not initialised
/// the entry yet. Returns the action to apply (None: the packet was already dropped).
#[allow(clippy::too_many_arguments)]
#[inline]
fn coarse_one(
    nf: &mut dyn DynStateful,
    member: usize,
    offset: usize,
    table: &flowplane_table::shared::SharedFlowTable<u128>,
    h: SharedHandle,
    batch: &mut Batch,
    i: usize,
    meta: &PktMeta,
    ctx: &NfContext,
    counters: &mut NfCounters,
) -> Option<Action> {
    if batch.is_dropped(i) {
        return None;
    }
    counters.packets_in += 1;
    counters.bytes_in += batch.lens()[i] as u64;
    if !meta.valid || !h.is_some() {
        return Some(nf.on_unparsed());
    }
    let Some(words) = table.state(h) else { return Some(nf.on_unparsed()) };
    let sz = nf.state_size();
    let bit = 2u64 << member;
    let a = with_locked(words, |flags, buf| {
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(buf);
        let Some(st) = bytes.get_mut(offset..offset + sz) else { return Action::Drop };
        let mut pkt = Pkt::new(batch.data_mut(i), meta);
        if *flags & bit == 0 {
            nf.init_into(&pkt, ctx, st);
            *flags |= bit;
        }
        nf.process_bytes(&mut pkt, st, ctx)
    });
    // A coarse entry outlives any one flow: end-of-flow requests keep only their verdict.
    Some(match a.unwrap_or(Action::Drop) {
        Action::EndFlow => Action::Pass,
        Action::DropEndFlow => Action::Drop,
        other => other,
    })
}

/// Default action of one stage into its own block (pernf).
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

/// Calls every 5-tuple NF's release callback for a flow's block (all NFs,
/// or the `pernf`-th stateful stage with its own block at offset 0), and
/// unpins the flow's coarse entries when the auxiliary table is on.
fn release_all(stages: &mut [Stage], pernf: Option<usize>, aux: Option<&Aux<'_>>, key: &FiveTuple, block: &[u8]) {
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
                        nf.release_bytes(key, b);
                    }
                }
                Some(_) => {}
                None => {
                    if let Some(b) = block.get(*offset..*offset + sz) {
                        nf.release_bytes(key, b);
                    }
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
    slot: u32,
) -> bool {
    // A slot already removed (a second end request in the same batch) has no key.
    let Some(key) = store.key(slot) else { return false };
    release_all(stages, pernf, aux, &key, store.block(slot));
    store.remove_slot(slot)
}

/// Removes the flows whose packets asked to end them (each slot once).
fn end_flows(
    stages: &mut [Stage],
    store: &mut FlowStore,
    pernf: Option<usize>,
    aux: Option<&Aux<'_>>,
    slots: &[u32],
    ends: &[u64; 4],
) -> u64 {
    if ends.iter().all(|&e| e == 0) {
        return 0;
    }
    let mut removed = 0;
    for (w, &e) in ends.iter().enumerate() {
        let mut m = e;
        while m != 0 {
            let i = w * 64 + m.trailing_zeros() as usize;
            m &= m - 1;
            if let Some(&slot) = slots.get(i) {
                removed += remove_flow(stages, store, pernf, aux, slot) as u64;
            }
        }
    }
    removed
}
