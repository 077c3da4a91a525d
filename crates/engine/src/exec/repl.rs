//! A core's side of state replication (`run --replicate`, see
//! [`crate::repl`]): importing received records into this core's flow
//! tables through the table's own insert (what the hand-over between cores
//! uses, `exec/migrate`), and the walk over the tables that pushes every
//! replicated entry again (a bulk resync, or the periodic refresh that keeps
//! a standby's copies from idling out). Both run between two batches.

use flowplane_nf::repl::{Op, Record, MAX_STATE};
use flowplane_wire::flow::FiveTuple;

use super::context::hash_tuple;
use super::{ExecContext, Pipeline};
use crate::chain::{Chain, Stage};
use crate::exec::StateLayout;
use flowplane_table::Upsert;

/// What importing one record did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Imported {
    /// An upsert created or replaced the flow's entry.
    Upserted,
    /// A delete removed it.
    Deleted,
    /// Refused: no such replicated NF, a state the NF does not adopt (another configuration), a full table,
    /// or a delete of a flow this core does not hold.
    Refused,
}

/// Where the `n`-th stateful NF's state lives: (its index in the chain, its store, its offset in the block).
fn locate(cx: &ExecContext, n: usize) -> Option<(usize, usize, usize)> {
    let mut k = 0;
    for (i, s) in cx.chain.stages.iter().enumerate() {
        let Stage::Stateful { offset, group, .. } = s else { continue };
        if group.is_some() {
            // Coarse NFs refuse replication before the run (see `Pipeline::repl_check`).
            return None;
        }
        if k == n {
            return Some(match cx.layout {
                StateLayout::PerNf => (i, k, 0),
                StateLayout::Aggregated => (i, 0, *offset),
            });
        }
        k += 1;
    }
    None
}

/// The walk over the tables (resync or refresh): a cursor and the entries left per store.
#[derive(Debug, Default)]
pub(crate) struct ReplWalk {
    at: Vec<(u32, u32)>,
    left: Vec<(usize, usize)>,
}

impl ExecContext {
    /// Imports one record at this core's packet time `now`.
    pub(crate) fn repl_import(&mut self, rec: &Record, now: u64) -> Imported {
        let Some((i, si, off)) = locate(self, usize::from(rec.stage)) else { return Imported::Refused };
        let seed = self.scratch.seed;
        let ExecContext { chain, stores, .. } = self;
        let Some(Stage::Stateful { nf, idle, .. }) = chain.stages.get_mut(i) else { return Imported::Refused };
        let Some(store) = stores.get_mut(si) else { return Imported::Refused };
        let size = nf.state_size();
        let key: FiveTuple = rec.key;
        let h = hash_tuple(&key, seed);
        match rec.op {
            Op::Upsert => {
                let mut st = [0u8; MAX_STATE];
                if size > MAX_STATE || !nf.repl_adopt_bytes(&key, rec.state(), now, &mut st) {
                    return Imported::Refused;
                }
                // Replaced whole: a refresh or a resync of a flow held already starts its entry's clock again.
                if let Some(r) = store.find(&key, h) {
                    store.remove(r);
                }
                let stamp = idle.as_ref().map(|s| s.at);
                match store.upsert(&key, h, now, |u| {
                    if let Upsert::New(b) = u {
                        if let Some(d) = b.get_mut(off..off + size) {
                            d.copy_from_slice(&st[..size]);
                        }
                        if let Some(d) = stamp.and_then(|at| b.get_mut(at..at + 8)) {
                            d.copy_from_slice(&now.to_ne_bytes());
                        }
                    }
                }) {
                    Some(_) => Imported::Upserted,
                    None => Imported::Refused,
                }
            }
            Op::Delete => {
                let Some(r) = store.find(&key, h) else { return Imported::Refused };
                if let Some(b) = store.block(r).get(off..off + size) {
                    nf.repl_forget_bytes(&key, b);
                }
                store.remove(r);
                Imported::Deleted
            }
        }
    }

    /// Starts a walk over every entry of this core's tables.
    pub(crate) fn repl_walk_start(&mut self, w: &mut ReplWalk) {
        w.at.resize(self.stores.len(), (0, 0));
        w.left = self.stores.iter().map(|s| (s.len_v4(), s.len_v6())).collect();
    }

    /// Walks up to `budget` entries of each table, each replicated NF pushing its entry's upsert; true when
    /// the walk is over.
    pub(crate) fn repl_walk_step(&mut self, w: &mut ReplWalk, budget: usize) -> bool {
        let pernf = self.layout == StateLayout::PerNf;
        let ExecContext { stores, chain, .. } = self;
        let mut done = true;
        for (k, store) in stores.iter().enumerate() {
            let (Some(at), Some(left)) = (w.at.get_mut(k), w.left.get_mut(k)) else { continue };
            let b = (left.0.min(budget), left.1.min(budget));
            if b == (0, 0) {
                continue;
            }
            left.0 -= b.0;
            left.1 -= b.1;
            done &= *left == (0, 0);
            store.visit(at, b, |key, block| {
                let mut j = 0;
                for s in chain.stages.iter_mut() {
                    let Stage::Stateful { nf, offset, group: None, .. } = s else { continue };
                    // Per-NF tables hold one NF's state each, at offset 0.
                    let mine = !pernf || j == k;
                    let off = if pernf { 0 } else { *offset };
                    j += 1;
                    if !mine || nf.repl().is_err() {
                        continue;
                    }
                    if let Some(st) = block.get(off..off + nf.state_size()) {
                        nf.repl_entry_bytes(key, st);
                    }
                }
            });
        }
        done
    }
}

/// Why `chain` cannot be replicated, if it cannot (one line): a graph, a coarse NF, a stateful NF that does
/// not replicate, several stateful NFs (an imported entry would leave the others' state zeroed), or none.
pub fn repl_check(chain: &Chain) -> Result<(), String> {
    if chain.port.is_some() || !chain.branches.is_empty() {
        return Err("--replicate: chain graphs (branches, ports) are not replicated; use a linear chain".into());
    }
    let mut n = 0;
    for s in &chain.stages {
        let Stage::Stateful { nf, group, .. } = s else { continue };
        if group.is_some() {
            return Err(format!(
                "--replicate: {} keeps state shared by several flows (coarse), which is not replicated",
                nf.name()
            ));
        }
        nf.repl().map_err(|why| format!("--replicate: {}: {why} (replicated NFs: nat, lb)", nf.name()))?;
        n += 1;
    }
    match n {
        0 => Err("--replicate: no NF of the chain keeps per-flow state to replicate (replicated NFs: nat, lb)".into()),
        1 => Ok(()),
        _ => {
            Err("--replicate: one stateful NF per chain (an imported flow would leave the other NFs' state unset)"
                .into())
        }
    }
}

impl Pipeline {
    /// Hands every replicated NF its queue: `make(stage)` for the `stage`-th stateful NF.
    pub fn attach_repl(&mut self, make: &mut dyn FnMut(u8) -> Option<flowplane_nf::repl::ReplTx>) -> usize {
        let mut k = 0u8;
        let mut n = 0;
        for s in self.cx.chain.stages.iter_mut() {
            if let Stage::Stateful { nf, .. } = s {
                if let (Ok(()), Some(tx)) = (nf.repl(), make(k)) {
                    nf.attach_repl(tx);
                    n += 1;
                }
                k = k.wrapping_add(1);
            }
        }
        n
    }

    /// Imports one received record at this core's packet time: the NF adopts the state, then the flow's entry
    /// is created (an existing one replaced) through the table's insert; a delete removes it.
    pub fn repl_import(&mut self, rec: &Record, now_ns: u64) -> Imported {
        self.cx.repl_import(rec, now_ns)
    }

    /// This core's packet clock for imports: where its expiry sweep stands (the last batch's time, or 0).
    pub fn repl_now(&self) -> u64 {
        self.cx.sweep_ns()
    }

    /// Starts a walk over the tables (see [`ExecContext::repl_walk_step`]).
    pub(crate) fn repl_walk_start(&mut self, w: &mut ReplWalk) {
        self.cx.repl_walk_start(w)
    }

    /// A step of the walk: true when over.
    pub(crate) fn repl_walk_step(&mut self, w: &mut ReplWalk, budget: usize) -> bool {
        self.cx.repl_walk_step(w, budget)
    }
}
