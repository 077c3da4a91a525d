//! The monomorphised SCR loops of one NF over its replica table: the
//! fast-forward of history entries and the NF's share of an NF-major batch.
//!
//! Both keep the state of the key in hand (slot, last-seen time, state) in
//! locals across entries *and* packets: a run of one key — a heavy flow's
//! history entries and own packets, interleaved — costs one table lookup and
//! one write-back, and each entry only its idle check and the NF's
//! transition. Exact for any NF: the state is the same slot's, written back
//! before any other key is looked up (a lookup may insert or sweep).

use bytemuck::Pod;
use flowplane_nf::stateful::{Action, ScrRecord, StatefulNf};
use flowplane_nf::{NfContext, NfCounters, Pkt};
use flowplane_packet::{Batch, DROP};

use super::{ReplicaTable, ScrBatch};
use crate::stage::apply_action;

/// No record's key: every key kind leaves bits 2..24 clear (see `KeyOf::key`).
const NO_KEY: u128 = u128::MAX;

/// The key in hand: its slot, last-seen time and state (written back by [`Hot::flush`]).
struct Hot<S> {
    key: u128,
    at: usize,
    last: u64,
    st: S,
}

impl<S: Pod> Hot<S> {
    #[inline(always)]
    fn new() -> Self {
        Hot { key: NO_KEY, at: 0, last: 0, st: S::zeroed() }
    }

    /// Writes the state in hand back to its slot and lets it go.
    #[inline(always)]
    fn flush(&mut self, t: &mut ReplicaTable) {
        if self.key != NO_KEY {
            t.write_slot(self.at, self.last, &self.st);
            self.key = NO_KEY;
        }
    }

    /// Makes `key` the key in hand at time `now` (false: the table is full
    /// on every core alike, the record goes untracked). Its state is fresh
    /// when new or idle past the timeout: `init` builds it then.
    #[inline(always)]
    fn take<T: StatefulNf<State = S>>(
        &mut self,
        nf: &mut T,
        t: &mut ReplicaTable,
        key: u128,
        r: &ScrRecord,
        ctx: &NfContext,
    ) -> bool {
        if key == self.key {
            // `ReplicaTable::touch`, on the copy in hand.
            let now = ctx.now_ns;
            let fresh = now.saturating_sub(self.last) > t.timeout_ns();
            self.last = if fresh { now } else { self.last.max(now) };
            if fresh {
                self.st = nf.scr_init(r, ctx);
            }
            return true;
        }
        self.flush(t);
        let Some(slot) = t.lookup(key, ctx.now_ns) else { return false };
        let (last, st) = t.read_slot::<S>(slot.at);
        *self = Hot { key, at: slot.at, last, st };
        if slot.fresh {
            self.st = nf.scr_init(r, ctx);
        }
        true
    }
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
    hot: &mut Hot<T::State>,
    recs: &[ScrRecord],
    alive: &mut [bool],
    key: &K,
) {
    if !SOLE && alive.len() < recs.len() {
        return;
    }
    let mut j = 0;
    while j < recs.len() {
        // A run of the key in hand (a heavy flow's N - 1 entries): back to
        // back, no bookkeeping per entry. Not for a last single entry (the
        // run's setup would cost more than it saves).
        if recs.len() - j > 1 && hot.key != NO_KEY && key(&recs[j]) == hot.key {
            let limit = hot.last.saturating_add(t.timeout_ns());
            let al = if SOLE { &mut [][..] } else { &mut alive[j..] };
            j += run_in_hand::<T, K, SOLE>(nf, &mut hot.st, &mut hot.last, &recs[j..], al, key, hot.key, limit);
            if j == recs.len() {
                break;
            }
        }
        // One entry the general way (not live, another key, or idle past the timeout).
        let r = &recs[j];
        let live = if SOLE { r.valid() } else { alive[j] };
        if live {
            let ctx = NfContext { now_tsc: 0, now_ns: r.ts_ns() };
            if hot.take(nf, t, key(r), r, &ctx) {
                let pass = nf.scr_transition(&mut hot.st, r, &ctx);
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
/// now - last <= timeout`: what `Hot::take` would find), and `last` becomes
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
    let mut hot = Hot::new();
    ff_entries::<T, K, false>(nf, t, &mut hot, recs, alive, &key);
    hot.flush(t);
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
    let mut hot = Hot::new();
    for p in b.plan {
        let i = p.i as usize;
        let base = i * hn;
        let (lo, hi) = (base + p.ff.0 as usize, base + p.ff.1 as usize);
        if let Some(recs) = hist.get(lo..hi) {
            let al = if SOLE { &mut [][..] } else { alive.get_mut(lo..hi).unwrap_or(&mut []) };
            ff_entries::<T, K, SOLE>(nf, t, &mut hot, recs, al, &key);
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
        } else if hot.take(nf, t, key(r), r, &c) {
            nf.process(&mut Pkt::new(batch.data_mut(i), meta), &mut hot.st, &c)
        } else {
            // Table full on every core alike: the packet passes untracked.
            Action::Pass
        };
        apply_action(batch, i, action, counters);
    }
    hot.flush(t);
}
