//! The monomorphised SCR loops of one NF over its replica table: the
//! fast-forward of history entries and the NF's share of an NF-major batch.
//!
//! States are updated in place in the table (a lookup per entry, the
//! table's one-entry cache answering for the key it saw last), except in a
//! run: history entries of the key the table saw last (a heavy flow's N - 1
//! entries per packet) run back to back on the state copied into locals,
//! with no per-entry lookup or bookkeeping, and are written back once.
//! Exact for any NF: it is the same slot's state, and nothing else touches
//! the table during the run.

use flowplane_nf::stateful::{Action, ScrRecord, StatefulNf};
use flowplane_nf::{NfContext, NfCounters, Pkt};
use flowplane_packet::{Batch, DROP};

use super::{ReplicaTable, ScrBatch};
use crate::stage::apply_action;

/// Finds or inserts `r`'s key at its time and hands its state (None: the
/// table is full on every core alike, the record goes untracked). A state
/// new or idle past the timeout starts over (`init`).
#[inline(always)]
fn state<'t, T: StatefulNf>(
    nf: &mut T,
    t: &'t mut ReplicaTable,
    key: u128,
    r: &ScrRecord,
    ctx: &NfContext,
) -> Option<&'t mut T::State> {
    let slot = t.lookup(key, ctx.now_ns)?;
    let st = t.state_of::<T::State>(slot.at);
    if slot.fresh {
        *st = nf.scr_init(r, ctx);
    }
    Some(st)
}

/// Fast-forwards `recs` (entries not `alive` skipped; without `SOLE`,
/// `alive` cleared for those the transition drops).
///
/// `SOLE`: the chain's only stateful NF — an entry is live when its record
/// is valid and nobody reads `alive` afterwards (it is neither read nor written).
#[inline(always)]
fn ff_entries<T: StatefulNf, K: Fn(&ScrRecord) -> u128, const SOLE: bool>(
    nf: &mut T,
    t: &mut ReplicaTable,
    recs: &[ScrRecord],
    alive: &mut [bool],
    key: &K,
) {
    if !SOLE && alive.len() < recs.len() {
        return;
    }
    let mut j = 0;
    while j < recs.len() {
        // A run of the key the table saw last (not for a last single entry:
        // the run's setup would cost more than it saves).
        if recs.len() - j > 1 {
            if let Some(at) = t.cached(key(&recs[j])) {
                let (mut last, mut st) = t.read_slot::<T::State>(at);
                let limit = last.saturating_add(t.timeout_ns());
                let al = if SOLE { &mut [][..] } else { &mut alive[j..] };
                j += run_in_hand::<T, K, SOLE>(nf, &mut st, &mut last, &recs[j..], al, key, key(&recs[j]), limit);
                t.write_slot(at, last, &st);
                if j == recs.len() {
                    break;
                }
            }
        }
        // One entry the general way (not live, another key, or idle past the timeout).
        let r = &recs[j];
        let live = if SOLE { r.valid() } else { alive[j] };
        if live {
            let ctx = NfContext { now_tsc: 0, now_ns: r.ts_ns() };
            if let Some(st) = state(nf, t, key(r), r, &ctx) {
                let pass = nf.scr_transition(st, r, &ctx);
                if !SOLE {
                    alive[j] = pass;
                }
            }
        }
        j += 1;
    }
}

/// Applies the leading entries of `recs` that are live, of key `k` (the
/// key in hand: state `st`, last seen `last`) and no later than `limit`
/// (`last` at the start plus the idle timeout), back to back; returns how
/// many. None of them starts the state over (`now - max(last, earlier) <=
/// now - last <= timeout`: what a lookup would find), and `last` becomes
/// the latest of their times, as `take` keeps it. Not inlined: a small
/// function keeps the state in registers.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn run_in_hand<T: StatefulNf, K: Fn(&ScrRecord) -> u128, const SOLE: bool>(
    nf: &mut T,
    st: &mut T::State,
    last: &mut u64,
    recs: &[ScrRecord],
    alive: &mut [bool],
    key: &K,
    k: u128,
    limit: u64,
) -> usize {
    let mut s = *st;
    let mut latest = *last;
    let mut n = 0;
    for (j, r) in recs.iter().enumerate() {
        let live = if SOLE { r.valid() } else { alive.get(j).copied().unwrap_or(false) };
        let now = r.ts_ns();
        if !live || now > limit || key(r) != k {
            break;
        }
        latest = latest.max(now);
        let pass = nf.scr_transition(&mut s, r, &NfContext { now_tsc: 0, now_ns: now });
        if !SOLE {
            alive[j] = pass;
        }
        n = j + 1;
    }
    *st = s;
    *last = latest;
    n
}

/// `StatefulStage::scr_fast_forward` for one NF type and key kind (`alive` set up by the caller).
#[inline(always)]
pub(crate) fn fast_forward<T: StatefulNf, K: Fn(&ScrRecord) -> u128>(
    nf: &mut T,
    t: &mut ReplicaTable,
    recs: &[ScrRecord],
    alive: &mut [bool],
    key: K,
) {
    ff_entries::<T, K, false>(nf, t, recs, alive, &key);
}

/// `StatefulStage::scr_batch` for one NF type and key kind: per planned
/// packet, its history entries not yet applied, then its own action.
/// `SOLE`: as in [`ff_entries`] (the batch's `alive` is not set up).
#[inline(always)]
pub(crate) fn batch<T: StatefulNf, K: Fn(&ScrRecord) -> u128, const SOLE: bool>(
    nf: &mut T,
    t: &mut ReplicaTable,
    b: &ScrBatch<'_>,
    alive: &mut [bool],
    batch: &mut Batch,
    counters: &mut NfCounters,
    key: K,
) {
    let (hist, hn) = (b.hist, b.history);
    for p in b.plan {
        let i = p.i as usize;
        let base = i * hn;
        let (lo, hi) = (base + p.ff.0 as usize, base + p.ff.1 as usize);
        if let Some(recs) = hist.get(lo..hi) {
            let al = if SOLE { &mut [][..] } else { alive.get_mut(lo..hi).unwrap_or(&mut []) };
            ff_entries::<T, K, SOLE>(nf, t, recs, al, &key);
        }
        if batch.verdicts()[i] == DROP {
            continue;
        }
        let (Some(r), Some(meta)) = (hist.get(base + hn - 1), b.metas.get(i)) else { continue };
        counters.packets_in += 1;
        counters.bytes_in += u64::from(batch.lens()[i]);
        let c = NfContext { now_ns: r.ts_ns(), ..*b.ctx };
        let action = if !r.valid() || !meta.valid {
            nf.on_unparsed()
        } else if let Some(st) = state(nf, t, key(r), r, &c) {
            nf.process(&mut Pkt::new(batch.data_mut(i), meta), st, &c)
        } else {
            // Table full on every core alike: the packet passes untracked.
            Action::Pass
        };
        apply_action(batch, i, action, counters);
    }
}
