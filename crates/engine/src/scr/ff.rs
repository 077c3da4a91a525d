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

use flowplane_nf::stateful::{ScrRecord, ScrRun, StatefulNf};
use flowplane_nf::{NfContext, NfCounters, Pkt};
use flowplane_packet::{Batch, DROP};

use super::{KeyPattern, ReplicaTable, ScrBatch};
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
            match state(nf, t, key(r), r, &ctx) {
                Some(st) => {
                    let pass = nf.scr_transition(st, r, &ctx);
                    if !SOLE {
                        alive[j] = pass;
                    }
                }
                // Table full on every core alike: the verdict the core that owns the packet gives it.
                None if !SOLE => alive[j] = nf.passes_without_state(),
                None => {}
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

/// The state of the key in hand: a slot's state and last-seen time held in
/// locals while consecutive records and packets of that key run on it
/// (written back when another key comes, or at the end of the batch). Exact
/// for the same reason as [`run_in_hand`]: nothing else touches the slot
/// meanwhile, and no time in hand passes `limit` (the slot's last-seen time
/// when taken plus the idle timeout), so none would start the state over.
struct Hand<S> {
    at: usize,
    key: u128,
    /// The key as a masked compare of a record's words (None: the key kind has none).
    pat: Option<KeyPattern>,
    last: u64,
    limit: u64,
    st: S,
    /// Records that leave `st` as it is, while it is still the state they
    /// were found for (a pure transition's fixed point: [`Still`]).
    still: Option<Still<S>>,
}

/// A fixed point of a pure transition (`StatefulNf::SCR_PURE`): every
/// record matching `pat` (the key, the kind byte and the fields the
/// transition reads, as [`KeyOf::still_mask`](super::KeyOf::still_mask))
/// takes state `st` to `st`.
#[derive(Clone, Copy)]
struct Still<S> {
    pat: KeyPattern,
    st: S,
}

/// The same state, byte for byte.
#[inline(always)]
fn same_state<S: bytemuck::Pod>(a: &S, b: &S) -> bool {
    bytemuck::bytes_of(a) == bytemuck::bytes_of(b)
}

impl<S: bytemuck::Pod> Hand<S> {
    #[inline(always)]
    fn take(t: &ReplicaTable, at: usize, key: u128, pat: Option<KeyPattern>) -> Hand<S> {
        let (last, st) = t.read_slot::<S>(at);
        Hand { at, key, pat, last, limit: last.saturating_add(t.timeout_ns()), st, still: None }
    }

    #[inline(always)]
    fn put_back(&self, t: &mut ReplicaTable) {
        t.write_slot(self.at, self.last, &self.st);
    }
}

/// The state of valid record `r`'s key `k` at time `now` in hand: the hand
/// when it holds `k` and `now` is within its limit; else the hand goes back
/// to the table and the table's last key is taken when it is `k` (a heavy
/// flow's records and packets follow each other). None: the general path
/// (a lookup) applies. `mask`: the key kind's ([`KeyOf::mask`](super::KeyOf::mask)).
#[inline(always)]
fn in_hand<'h, S: bytemuck::Pod>(
    hand: &'h mut Option<Hand<S>>,
    t: &mut ReplicaTable,
    k: u128,
    r: &ScrRecord,
    mask: Option<[u64; 4]>,
    now: u64,
) -> Option<&'h mut Hand<S>> {
    if hand.as_ref().is_some_and(|h| h.key != k || now > h.limit) {
        if let Some(h) = hand.take() {
            h.put_back(t);
        }
    }
    if hand.is_none() {
        let at = t.cached(k)?;
        let h = Hand::take(t, at, k, mask.map(|m| KeyPattern::of(m, r)));
        if now > h.limit {
            return None;
        }
        *hand = Some(h);
    }
    hand.as_mut()
}

/// Applies the leading records of `recs` to the state in hand while they
/// are live, of its key and within its limit; returns how many it went
/// through. The chain's only stateful NF (`SOLE`) with a closed form
/// (`StatefulNf::SCR_RUN`) takes them as one run (`StatefulNf::scr_run`);
/// otherwise record by record in one pass (records not live are passed
/// over), the state in registers.
///
/// With the key's pattern a record is valid and of the key in one masked
/// compare; for a closed form, times that never go back (`monotonic`) make
/// the run's records within the limit a prefix, its first and last time its
/// earliest and latest: no time is looked at per record.
#[inline(always)]
fn run_hand<T: StatefulNf, K: Fn(&ScrRecord) -> u128, const SOLE: bool>(
    nf: &mut T,
    h: &mut Hand<T::State>,
    recs: &[ScrRecord],
    alive: &mut [bool],
    key: &K,
    monotonic: bool,
) -> usize {
    let (hk, limit, pat) = (h.key, h.limit, h.pat);
    // Valid and of the key in hand: one masked compare with the key's pattern.
    let same = |r: &ScrRecord| match &pat {
        Some(p) => p.matches(r),
        None => r.valid() && key(r) == hk,
    };
    if SOLE && T::SCR_RUN {
        // The leading valid records of the key within the limit, as one run
        // (`StatefulNf::scr_run`: a closed form where the NF has one).
        let (mut lo, mut hi, mut n) = (u64::MAX, 0u64, 0usize);
        if let (Some(p), true) = (&pat, monotonic) {
            // Times in order: those within the limit are a prefix.
            n = recs[..p.leading(recs)].partition_point(|r| r.ts_ns() <= limit);
            if n > 0 {
                (lo, hi) = (recs[0].ts_ns(), recs[n - 1].ts_ns());
            }
        } else {
            for r in recs {
                let now = r.ts_ns();
                if !same(r) || now > limit {
                    break;
                }
                lo = lo.min(now);
                hi = hi.max(now);
                n += 1;
            }
        }
        if n > 0 {
            nf.scr_run(&mut h.st, &ScrRun { recs: &recs[..n], min_ns: lo, max_ns: hi });
            h.last = h.last.max(hi);
        }
        return n;
    }
    let (mut st, mut last) = (h.st, h.last);
    let mut n = 0;
    for (j, r) in recs.iter().enumerate() {
        let live = if SOLE { r.valid() } else { alive.get(j).copied().unwrap_or(false) };
        if live {
            let now = r.ts_ns();
            if !same(r) || now > limit {
                break;
            }
            last = last.max(now);
            let pass = nf.scr_transition(&mut st, r, &NfContext { now_tsc: 0, now_ns: now });
            if let Some(a) = alive.get_mut(j).filter(|_| !SOLE) {
                *a = pass;
            }
        }
        n = j + 1;
    }
    h.st = st;
    h.last = last;
    n
}

/// A heavy flow's packet in one step (the chain's only stateful NF, with a
/// closed form, times that never go back): its unapplied records and its
/// own (`all`, the own last) all of the key in hand within its limit — the
/// records as one run, then the packet's action on the state in hand, what
/// the general path does for them with one scan instead of a scan and a key
/// check per packet. False, nothing done: the general path applies. (The
/// action is here, not left to the general path's own-packet step: that
/// step's key check and hand lookup cost one core 13% more, measured.)
///
/// With `still` (the NF's transition is pure: [`KeyOf::still_mask`](super::KeyOf::still_mask)),
/// records that all equal one the state in hand is a fixed point of are
/// passed over in the same scan, the run not looked at again; after the
/// packet, the state is tested against its own record for the next packets.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn whole_packet<T: StatefulNf>(
    nf: &mut T,
    h: &mut Hand<T::State>,
    all: &[ScrRecord],
    i: usize,
    batch: &mut Batch,
    meta: Option<&flowplane_nf::PktMeta>,
    ctx: &NfContext,
    counters: &mut NfCounters,
    still: Option<[u64; 4]>,
) -> bool {
    let (Some(p), Some((own, recs)), Some(meta)) = (h.pat, all.split_last(), meta.filter(|m| m.valid)) else {
        return false;
    };
    // Times never go back: the own record's is the latest.
    if own.ts_ns() > h.limit {
        return false;
    }
    // Still: a fixed point of the state in hand, matched by every record
    // (the own one too, which puts it under the key in hand): nothing to apply.
    if h.still.is_some_and(|f| same_state(&f.st, &h.st) && f.pat.all_match(all)) {
        if let Some(last) = recs.last() {
            h.last = h.last.max(last.ts_ns());
        }
    } else {
        if !p.all_match(all) {
            return false;
        }
        if let (Some(first), Some(last)) = (recs.first(), recs.last()) {
            nf.scr_run(&mut h.st, &ScrRun { recs, min_ns: first.ts_ns(), max_ns: last.ts_ns() });
            h.last = h.last.max(last.ts_ns());
        }
    }
    if batch.verdicts()[i] == DROP {
        return true;
    }
    let now = own.ts_ns();
    h.last = h.last.max(now);
    counters.packets_in += 1;
    counters.bytes_in += u64::from(batch.lens()[i]);
    let c = NfContext { now_ns: now, ..*ctx };
    let action = nf.process(&mut Pkt::new(batch.data_mut(i), meta), &mut h.st, &c);
    apply_action(batch, i, action, counters);
    // A state that changed (or none found yet): is it a fixed point of the
    // own record? (Each packet's a probe while the state keeps changing.)
    if let Some(m) = still.filter(|_| !h.still.is_some_and(|f| same_state(&f.st, &h.st))) {
        let mut next = h.st;
        nf.scr_transition(&mut next, own, &c);
        h.still = same_state(&next, &h.st).then(|| Still { pat: KeyPattern::of(m, own), st: h.st });
    }
    true
}

/// `StatefulStage::scr_batch` for one NF type and key kind (`mask`: the
/// kind's [`KeyOf::mask`](super::KeyOf::mask); `still`: its
/// [`KeyOf::still_mask`](super::KeyOf::still_mask) for a pure transition,
/// else None): per planned packet, its
/// history entries not yet applied, then its own action. `SOLE`: as in
/// [`ff_entries`] (the batch's `alive` is not set up).
///
/// The state of the key looked up last stays in hand across records and
/// packets ([`Hand`]): a heavy flow's N - 1 records and its packet per
/// packet cost one transition each, with no lookup, for the whole batch.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn batch<T: StatefulNf, K: Fn(&ScrRecord) -> u128, const SOLE: bool>(
    nf: &mut T,
    t: &mut ReplicaTable,
    b: &ScrBatch<'_>,
    alive: &mut [bool],
    batch: &mut Batch,
    counters: &mut NfCounters,
    key: K,
    mask: Option<[u64; 4]>,
    still: Option<[u64; 4]>,
) {
    let (hist, hn) = (b.hist, b.history);
    let mut hand: Option<Hand<T::State>> = None;
    for p in b.plan {
        let i = p.i as usize;
        let base = i * hn;
        let (lo, hi) = (base + p.ff.0 as usize, base + p.ff.1 as usize);
        if let (true, true, Some(h), Some(all)) = (SOLE && T::SCR_RUN, b.monotonic, hand.as_mut(), hist.get(lo..=hi)) {
            if whole_packet(nf, h, all, i, batch, b.metas.get(i), b.ctx, counters, still) {
                continue;
            }
        }
        if let Some(recs) = hist.get(lo..hi) {
            let al = if SOLE { &mut [][..] } else { alive.get_mut(lo..hi).unwrap_or(&mut []) };
            let mut j = 0;
            while j < recs.len() {
                if let Some(h) = hand.as_mut() {
                    let al = al.get_mut(j..).unwrap_or(&mut []);
                    j += run_hand::<T, K, SOLE>(nf, h, &recs[j..], al, &key, b.monotonic);
                    if j >= recs.len() {
                        break;
                    }
                }
                // Not live, another key, or past the hand's limit.
                let r = &recs[j];
                let live = if SOLE { r.valid() } else { al.get(j).copied().unwrap_or(false) };
                if live {
                    let (k, now) = (key(r), r.ts_ns());
                    if in_hand(&mut hand, t, k, r, mask, now).is_some() {
                        // The next turn's run takes it.
                        continue;
                    }
                    let ctx = NfContext { now_tsc: 0, now_ns: now };
                    let pass = match state(nf, t, k, r, &ctx) {
                        Some(st) => nf.scr_transition(st, r, &ctx),
                        // Table full on every core alike: as the owning core's `on_no_state`.
                        None => nf.passes_without_state(),
                    };
                    if let Some(a) = al.get_mut(j).filter(|_| !SOLE) {
                        *a = pass;
                    }
                }
                j += 1;
            }
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
        } else {
            let k = key(r);
            match in_hand(&mut hand, t, k, r, mask, c.now_ns) {
                Some(h) => {
                    h.last = h.last.max(c.now_ns);
                    nf.process(&mut Pkt::new(batch.data_mut(i), meta), &mut h.st, &c)
                }
                None => match state(nf, t, k, r, &c) {
                    Some(st) => nf.process(&mut Pkt::new(batch.data_mut(i), meta), st, &c),
                    // Table full on every core alike: counted, and judged as the NF says (`passes_without_state`).
                    None => {
                        t.refuse();
                        nf.on_no_state()
                    }
                },
            }
        };
        apply_action(batch, i, action, counters);
    }
    if let Some(h) = hand {
        h.put_back(t);
    }
}
