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

use std::fmt;

use flowplane_nf::stateful::{apply_action, BatchOutcome};
use flowplane_nf::store::{FlowStore, StoreConfig, NO_SLOT};
use flowplane_nf::{NfContext, NfCounters, Pkt, PktMeta};
use flowplane_packet::{Batch, MAX_BATCH};
use flowplane_table::{FullPolicy, TableStats, INVALID_HANDLE, MAX_BATCH as TABLE_BATCH};
use flowplane_wire::flow::{FiveTuple, FiveTupleV4};
use flowplane_wire::hash::HashableKey;
use serde::Serialize;

use crate::chain::{Chain, Stage};

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
    pernf_slots: Vec<Box<[u32; MAX_BATCH]>>,
    scratch: Scratch,
    ended: u64,
    unparsed: u64,
    /// Bytes of the aggregated block spanning more than one cache line after the entry header.
    multi_line: bool,
}

#[inline(always)]
fn hash_tuple(t: &FiveTuple) -> u64 {
    match t {
        FiveTuple::V4(k) => k.hash64(HASH_SEED),
        FiveTuple::V6(k) => k.hash64(HASH_SEED),
    }
}

impl Executor {
    /// Builds the executor and allocates its tables.
    pub fn new(chain: Chain, cfg: ExecConfig) -> Result<Self, String> {
        let timeout = Some(chain.idle_timeout_ns.unwrap_or(cfg.default_idle_timeout_ns));
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
                        pernf_slots.push(Box::new([NO_SLOT; MAX_BATCH]));
                    }
                }
            } else {
                stores.push(FlowStore::new(store_cfg(chain.state_size)).map_err(|e| e.to_string())?);
            }
        }
        // Entry header (key 16 + hash 8 + last-seen 8) shares the first line with the state.
        let multi_line = chain.state_size > 32;
        Ok(Executor { cfg, chain, stores, pernf_slots, scratch: Scratch::new(), ended: 0, unparsed: 0, multi_line })
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
            self.scratch.metas[i] = PktMeta::parse(batch.data(i));
        }
        self.unparsed += self.scratch.metas[..n].iter().filter(|m| !m.valid).count() as u64;
        match self.cfg.kind {
            ExecKind::Batch => self.run_batch(batch, ctx),
            ExecKind::Rtc => self.run_rtc(batch, ctx),
            ExecKind::PerNf => self.run_pernf(batch, ctx),
            ExecKind::MicroBatch => self.run_microbatch(batch, ctx),
        }
        // Bounded expiry work per batch: about two slab entries per packet.
        let budget = 2 * n.max(16);
        let stages = &mut self.chain.stages;
        for (k, store) in self.stores.iter_mut().enumerate() {
            let pernf = self.cfg.kind == ExecKind::PerNf;
            store.expire(ctx.now_ns, budget, |key, block| release_all(stages, pernf.then_some(k), key, block));
        }
    }

    /// Looks up (inserting misses) every valid packet of the batch in the
    /// aggregated store; fills `scratch.slots`. Bulk for IPv4 when prefetch
    /// is on, key by key otherwise and for IPv6.
    fn lookup_aggregated(&mut self, batch: &mut Batch, ctx: &NfContext, bulk: bool) {
        let n = batch.len();
        let Executor { stores, chain, scratch, .. } = self;
        let store = &mut stores[0];
        let stages = &mut chain.stages;
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
                    let r = store.lookup_or_insert(&t, h, ctx.now_ns, |block| init_all(stages, None, data, &meta, ctx, block));
                    if let Some((slot, _)) = r {
                        scratch.slots[i] = slot;
                    }
                }
            }
        }
        let mut start = 0;
        while start < m {
            let end = (start + TABLE_BATCH).min(m);
            let (keys, hashes, idx) = (&scratch.keys[start..end], &scratch.hashes[start..end], &scratch.idx[start..end]);
            let metas = &scratch.metas;
            let handles = &mut scratch.handles[..end - start];
            store.v4().lookup_or_insert_batch(keys, hashes, ctx.now_ns, handles, |j, block| {
                let i = idx[j] as usize;
                init_all(stages, None, batch.data_mut(i), &metas[i], ctx, block)
            });
            for (j, &h) in handles.iter().enumerate() {
                scratch.slots[idx[start + j] as usize] = if h == INVALID_HANDLE { NO_SLOT } else { h };
            }
            start = end;
        }
    }

    fn run_batch(&mut self, batch: &mut Batch, ctx: &NfContext) {
        let prefetch = self.cfg.prefetch;
        self.lookup_aggregated(batch, ctx, prefetch);
        let n = batch.len();
        let Executor { stores, chain, scratch, ended, multi_line, .. } = self;
        let store = &mut stores[0];
        if prefetch && *multi_line {
            // The lookup brought each entry's first line; fetch the next one now,
            // a full chain pass before the NFs that keep state there need it.
            for &s in &scratch.slots[..n] {
                if s != NO_SLOT {
                    let b = store.block(s);
                    if b.len() > 32 {
                        flowplane_packet::prefetch::write(&b[32]);
                    }
                }
            }
        }
        let ahead = if prefetch { PREFETCH_AHEAD } else { 0 };
        let mut ends = [0u64; 4];
        for stage in chain.stages.iter_mut() {
            match stage {
                Stage::Stateless(nf) => nf.process(batch, ctx),
                Stage::Stateful { nf, offset, counters } => {
                    let mut out = BatchOutcome::default();
                    nf.process_batch(batch, &scratch.metas[..n], &scratch.slots[..n], store, *offset, ctx, ahead, &mut out);
                    counters.merge(&out.counters);
                    for (e, o) in ends.iter_mut().zip(out.end) {
                        *e |= o;
                    }
                }
            }
        }
        *ended += end_flows(&mut chain.stages, store, None, &scratch.slots[..n], &ends);
    }

    fn run_rtc(&mut self, batch: &mut Batch, ctx: &NfContext) {
        let n = batch.len();
        let Executor { stores, chain, scratch, ended, .. } = self;
        let store = &mut stores[0];
        let stages = &mut chain.stages;
        // Stateless stages split the chain into segments of stateful NFs; each
        // segment runs packet by packet, all its NFs on one packet before the next.
        let mut seg_start = 0;
        let mut looked_up = false;
        while seg_start < stages.len() {
            if let Stage::Stateless(nf) = &mut stages[seg_start] {
                nf.process(batch, ctx);
                seg_start += 1;
                continue;
            }
            let seg_end = (seg_start..stages.len()).find(|&k| matches!(stages[k], Stage::Stateless(_))).unwrap_or(stages.len());
            for i in 0..n {
                let meta = scratch.metas[i];
                if !looked_up {
                    scratch.slots[i] = NO_SLOT;
                    if meta.valid {
                        let h = hash_tuple(&meta.tuple);
                        let data = batch.data_mut(i);
                        let stages_ro = &mut *stages;
                        if let Some((slot, _)) =
                            store.lookup_or_insert(&meta.tuple, h, ctx.now_ns, |b| init_all(stages_ro, None, data, &meta, ctx, b))
                        {
                            scratch.slots[i] = slot;
                        }
                    }
                }
                let slot = scratch.slots[i];
                let mut end = false;
                for stage in stages[seg_start..seg_end].iter_mut() {
                    if let Stage::Stateful { nf, offset, counters } = stage {
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
                            let mut pkt = Pkt::new(batch.data_mut(i), &meta);
                            nf.process_bytes(&mut pkt, &mut block[*offset..*offset + sz], ctx)
                        };
                        end |= apply_action(batch, i, action, counters);
                    }
                }
                if end && slot != NO_SLOT {
                    *ended += remove_flow(stages, store, None, slot) as u64;
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

    fn run_pernf(&mut self, batch: &mut Batch, ctx: &NfContext) {
        let n = batch.len();
        let Executor { stores, chain, scratch, ended, pernf_slots, .. } = self;
        let mut k = 0;
        for si in 0..chain.stages.len() {
            if let Stage::Stateless(nf) = &mut chain.stages[si] {
                nf.process(batch, ctx);
                continue;
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
                        if let Some((slot, _)) = store.lookup_or_insert(&t, h, ctx.now_ns, |b| init_one(stage, data, &meta, ctx, b)) {
                            slots[i] = slot;
                        }
                    }
                }
            }
            let mut start = 0;
            while start < m {
                let end = (start + TABLE_BATCH).min(m);
                let idx = &scratch.idx[start..end];
                let metas = &scratch.metas;
                let stage = &mut chain.stages[si];
                let handles = &mut scratch.handles[..end - start];
                store.v4().lookup_or_insert_batch(&scratch.keys[start..end], &scratch.hashes[start..end], ctx.now_ns, handles, |j, b| {
                    let i = idx[j] as usize;
                    init_one(stage, batch.data_mut(i), &metas[i], ctx, b)
                });
                for (j, &h) in handles.iter().enumerate() {
                    slots[idx[j] as usize] = if h == INVALID_HANDLE { NO_SLOT } else { h };
                }
                start = end;
            }
            let mut out = BatchOutcome::default();
            if let Stage::Stateful { nf, counters, .. } = &mut chain.stages[si] {
                nf.process_batch(batch, &scratch.metas[..n], &slots[..n], store, 0, ctx, PREFETCH_AHEAD, &mut out);
                counters.merge(&out.counters);
            }
            *ended += end_flows(&mut chain.stages, store, Some(k), &slots[..n], &out.end);
            k += 1;
        }
    }

    fn run_microbatch(&mut self, batch: &mut Batch, ctx: &NfContext) {
        let n = batch.len();
        let Executor { stores, chain, scratch, ended, .. } = self;
        let store = &mut stores[0];
        let stages = &mut chain.stages;
        // Cut the batch into runs of consecutive packets of one flow; one lookup per run.
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
                let st = &mut *stages;
                if let Some((s, _)) = store.lookup_or_insert(&meta.tuple, h, ctx.now_ns, |b| init_all(st, None, data, &meta, ctx, b)) {
                    slot = s;
                }
            }
            for s in scratch.slots[i..j].iter_mut() {
                *s = slot;
            }
            i = j;
        }
        let mut ends = [0u64; 4];
        for stage in stages.iter_mut() {
            match stage {
                Stage::Stateless(nf) => nf.process(batch, ctx),
                Stage::Stateful { nf, offset, counters } => {
                    let mut out = BatchOutcome::default();
                    nf.process_batch(batch, &scratch.metas[..n], &scratch.slots[..n], store, *offset, ctx, 0, &mut out);
                    counters.merge(&out.counters);
                    for (e, o) in ends.iter_mut().zip(out.end) {
                        *e |= o;
                    }
                }
            }
        }
        *ended += end_flows(stages, store, None, &scratch.slots[..n], &ends);
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
        let mut r = StoreReport { ended: self.ended, unparsed: self.unparsed, ..Default::default() };
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

    /// Export rows of NF `name` (one JSON object per live flow), if it exports state.
    pub fn export(&self, name: &str) -> Option<Vec<serde_json::Value>> {
        let mut k = 0;
        for s in &self.chain.stages {
            if let Stage::Stateful { nf, offset, .. } = s {
                if nf.name() == name {
                    let (store, off) =
                        if self.cfg.kind == ExecKind::PerNf { (self.stores.get(k)?, 0) } else { (self.stores.first()?, *offset) };
                    let sz = nf.state_size();
                    let mut rows = Vec::new();
                    store.for_each(|key, block| {
                        if let Some(r) = nf.export_row_bytes(key, &block[off..off + sz]) {
                            rows.push(r);
                        }
                    });
                    return Some(rows);
                }
                k += 1;
            }
        }
        None
    }
}

/// Runs the default action (add-on-miss) of every stateful NF (or only
/// stage `only`) into a fresh block.
#[inline]
fn init_all(stages: &mut [Stage], only: Option<usize>, data: &mut [u8], meta: &PktMeta, ctx: &NfContext, block: &mut [u8]) {
    let pkt = Pkt::new(data, meta);
    for (k, s) in stages.iter_mut().enumerate() {
        if only.is_some_and(|o| o != k) {
            continue;
        }
        if let Stage::Stateful { nf, offset, .. } = s {
            let sz = nf.state_size();
            if let Some(dst) = block.get_mut(*offset..*offset + sz) {
                nf.init_into(&pkt, ctx, dst);
            }
        }
    }
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

/// Calls every NF's release callback for a flow's block (all NFs, or the
/// `pernf`-th stateful stage with its own block at offset 0).
fn release_all(stages: &mut [Stage], pernf: Option<usize>, key: &FiveTuple, block: &[u8]) {
    let mut k = 0;
    for s in stages.iter_mut() {
        if let Stage::Stateful { nf, offset, .. } = s {
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
fn remove_flow(stages: &mut [Stage], store: &mut FlowStore, pernf: Option<usize>, slot: u32) -> bool {
    // A slot already removed (a second end request in the same batch) has no key.
    let Some(key) = store.key(slot) else { return false };
    release_all(stages, pernf, &key, store.block(slot));
    store.remove_slot(slot)
}

/// Removes the flows whose packets asked to end them (each slot once).
fn end_flows(stages: &mut [Stage], store: &mut FlowStore, pernf: Option<usize>, slots: &[u32], ends: &[u64; 4]) -> u64 {
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
                removed += remove_flow(stages, store, pernf, slot) as u64;
            }
        }
    }
    removed
}

