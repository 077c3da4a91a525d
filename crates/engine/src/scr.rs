//! State-compute replication (`--scale scr`; Ghasemirahni et al., SCR):
//! each core keeps a private replica of the whole chain's state. The
//! sequencer ([`flowplane_io::scr`]) sprays packets round robin and
//! piggybacks on each the records of the last N packets; before processing
//! its own packet a core fast-forwards its replica over the entries it has
//! not seen (each NF's `scr_transition`, in chain order, no verdict, no
//! output), then runs the unchanged NFs (`process`) on its packet with the
//! sequencer's timestamp as the packet clock.
//!
//! This module owns the replicas (one open-addressing table per stateful NF,
//! keyed from the history record, so every core keys alike), the per-core
//! single-writer logs and the loss recovery of Algorithm 1 (Appendix B:
//! NOT_INIT / LOST markers, finite circular logs, a missing entry recovered
//! from the other cores' logs), and the state digest that proves the
//! replicas identical at the end of a run.
//!
//! Algorithm 1 assumes a later packet reveals every loss. At the end of a
//! run (finite trace, or stopped by `--duration`) each core claims the last
//! sequence number it knows the sequencer emitted, and every core catches
//! up to the highest claim from the other cores' logs: a loss burst that
//! reaches the end is recovered, lost everywhere, or reported, like any
//! other. A core never runs more than the log size ahead of what the
//! slowest core still has to read (it waits; see `wait_for_slowest`), so
//! entries are overwritten only past the wait limit, and then reported.
//!
//! Replicas stay identical because everything that changes them is a
//! function of the packet sequence: the records (keys, fields, time),
//! insertion and idle expiry on record time, and the table sweep (run when
//! a table is 7/8 full, at the same sequence number on every core).

use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use flowplane_io::scr::{ScrSide, Sequencer};
use flowplane_nf::stateful::{Granularity, ScrFields, ScrRecord};
use flowplane_nf::{NfContext, Pkt, PktMeta};
use flowplane_packet::{tsc, Batch, DROP, MAX_BATCH};
use flowplane_wire::hash::crc32c_u64;
use serde::Serialize;

use crate::chain::{Chain, Stage};
use crate::stage::apply_action;

pub(crate) mod ff;

/// Default log entries per core (a power of two; 40 B each: 640 KB, in a
/// core's L2 here). A core logs every sequence it receives: a log the cache
/// holds costs a few stores per record, one larger than the cache a
/// write-allocate miss per line (`bench scr`'s recovery rows, 2 cores,
/// portknock: 0.84-0.86 of recovery off with 256 K entries, 0.89-0.98 with
/// 16 K). A core may run at most the log size (less N) ahead of the slowest
/// before it waits (see `ScrReplica::wait_for_slowest`): 16 K sequences is
/// a few hundred microseconds at full speed, so a core waits when the other
/// is descheduled (counted: `drift_waits`), never overwrites what it may
/// still need (`--scr-log` changes it; the paper's logs have 1024 entries).
pub const DEFAULT_LOG: usize = 1 << 14;

/// Batches between two samples of the fast-forward cost (two TSC reads per
/// packet when sampled, and the packet-by-packet path: rare enough not to
/// weigh on the figures it samples, thousands of samples a second).
const SAMPLE_EVERY: u64 = 256;

/// A sampled packet taking longer than this (cycles) was preempted or
/// waited (recovery, drift): left out of the per-packet cost figures.
const SAMPLE_MAX_CYCLES: u64 = 20_000;

/// Spins before a core waiting for another core's log entry gives up and
/// declares the entry unrecoverable (never hang: ~2^32 cycles is seconds).
const WAIT_LIMIT_CYCLES: u64 = 1 << 32;

/// How SCR runs (`--scr-history`, `--scr-recovery`, `--scr-loss`, `--seed`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScrConfig {
    /// Records piggybacked per packet (None: the number of workers).
    pub history: Option<usize>,
    /// Per-core logs and Algorithm 1.
    pub recovery: bool,
    /// Probability that a packet is lost between the sequencer and its core.
    pub loss: f64,
    /// Seed of the loss pattern.
    pub seed: u64,
    /// Log entries per core (a power of two).
    pub log_entries: usize,
}

impl Default for ScrConfig {
    fn default() -> Self {
        ScrConfig { history: None, recovery: false, loss: 0.0, seed: 1, log_entries: DEFAULT_LOG }
    }
}

// ---------------------------------------------------------------------------
// Logs (Algorithm 1)
// ---------------------------------------------------------------------------

/// One log entry's record words (half a cache line).
#[repr(C, align(32))]
struct LogRec([AtomicU64; 4]);

/// One core's single-writer, multiple-reader circular log: the records it
/// received, each at slot `seq % entries`, a dense array of their sequence
/// numbers beside them, and its `max[c]`. Algorithm 1's markers follow from
/// `max`: NOT_INIT is `k > max`; LOST is `k <= max` with no record of `k`
/// (a gap is marked by raising `max` alone, so marking a long gap
/// overwrites nothing another core may still need). A reader detects a
/// record being overwritten by the batch seqlock `writing` (raised before
/// the owner writes, `max` after). On x86 every store here is a plain move:
/// no atomic read-modify-write, no fence instruction.
#[repr(C, align(128))]
pub struct ScrLog {
    /// Highest sequence number this core has logged or marked (its `max[c]`).
    max: AtomicU64,
    /// Highest sequence number the owner is writing (>= `max`).
    writing: AtomicU64,
    /// Every sequence up to this one the core has received or read from
    /// another log: it reads no log below it again (the drift bound).
    resolved: AtomicU64,
    /// The core has finished (its log will not change).
    done: AtomicBool,
    /// The core has stopped receiving: the last sequence number it knows
    /// the sequencer emitted (the stream's end, or its own highest), plus
    /// one (0: still receiving). Every core catches up to the highest claim.
    claim: AtomicU64,
    tags: Box<[AtomicU64]>,
    recs: Box<[LogRec]>,
}

/// What a core's log says about sequence `k`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogRead {
    /// `history[k]`.
    Rec(ScrRecord),
    /// LOST: the core received a later sequence but not `k`.
    Lost,
    /// NOT_INIT: the core has not got that far (yet).
    NotInit,
    /// The entry was overwritten by a later sequence (the log wrapped).
    Gone,
}

impl ScrLog {
    fn new(entries: usize) -> ScrLog {
        let n = entries.max(2).next_power_of_two();
        ScrLog {
            max: AtomicU64::new(0),
            writing: AtomicU64::new(0),
            resolved: AtomicU64::new(0),
            done: AtomicBool::new(false),
            claim: AtomicU64::new(0),
            tags: (0..n).map(|_| AtomicU64::new(0)).collect(),
            recs: (0..n).map(|_| LogRec(std::array::from_fn(|_| AtomicU64::new(0)))).collect(),
        }
    }

    /// Entries.
    pub fn entries(&self) -> usize {
        self.tags.len()
    }

    /// The owner is about to write records up to `hi` (seqlock open).
    #[inline(always)]
    fn begin(&self, hi: u64) {
        self.writing.store(hi, Ordering::Relaxed);
        fence(Ordering::Release);
    }

    /// Writes `history[k]` — by the owning core only, between [`ScrLog::begin`] and [`ScrLog::publish`].
    #[inline(always)]
    fn put(&self, k: u64, r: &ScrRecord) {
        let i = (k as usize) & (self.tags.len() - 1);
        for (a, v) in self.recs[i].0.iter().zip(r.to_words()) {
            a.store(v, Ordering::Relaxed);
        }
        self.tags[i].store(k, Ordering::Relaxed);
    }

    /// Everything up to `k` is logged or marked LOST (seqlock close).
    #[inline(always)]
    fn publish(&self, k: u64) {
        self.max.store(k, Ordering::Release);
    }

    /// Tests: writes `history[k]` and publishes it.
    #[cfg(test)]
    fn write(&self, k: u64, r: &ScrRecord) {
        self.begin(k);
        self.put(k, r);
        self.publish(k);
    }

    /// Reads what the log says about `k`.
    pub fn read(&self, k: u64) -> LogRead {
        if self.max.load(Ordering::Acquire) < k {
            return LogRead::NotInit;
        }
        let i = (k as usize) & (self.tags.len() - 1);
        let t = self.tags[i].load(Ordering::Relaxed);
        let w = std::array::from_fn(|j| self.recs[i].0[j].load(Ordering::Relaxed));
        fence(Ordering::Acquire);
        if self.writing.load(Ordering::Relaxed) >= k + self.tags.len() as u64 {
            // A later sequence may have taken the slot (or be taking it).
            return LogRead::Gone;
        }
        if t == k {
            LogRead::Rec(ScrRecord::from_words(w))
        } else {
            LogRead::Lost
        }
    }
}

/// Every core's log.
pub struct ScrLogs {
    logs: Box<[ScrLog]>,
}

impl ScrLogs {
    /// Logs for `cores` cores of `entries` entries each.
    pub fn new(cores: usize, entries: usize) -> ScrLogs {
        ScrLogs { logs: (0..cores).map(|_| ScrLog::new(entries)).collect() }
    }

    /// Core `c`'s log.
    pub fn log(&self, c: usize) -> &ScrLog {
        &self.logs[c]
    }
}

/// The outcome of recovering one missing sequence number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recovered {
    /// Another core logged it.
    Rec(ScrRecord),
    /// Every other core marked it LOST: nobody saw it, nobody processes it.
    LostEverywhere,
    /// Not recoverable: overwritten in the logs that might hold it, or the wait timed out.
    Unrecoverable,
}

/// `handle_loss_recovery(k, c)` of Algorithm 1: read the other cores' logs
/// until one holds `history[k]` or all say LOST. A core that has not got to
/// `k` is waited for (it will log `k` or LOST: it marks a whole gap before
/// resolving any of it, and a finished core has logged up to the end). A
/// wrapped entry, or a wait past the limit, makes `k` unrecoverable.
pub fn recover(logs: &ScrLogs, me: usize, k: u64) -> Recovered {
    let n = logs.logs.len();
    let t0 = tsc::rdtsc();
    loop {
        let (mut lost, mut gone, mut waiting) = (0usize, 0usize, 0usize);
        for c in (0..n).filter(|&c| c != me) {
            match logs.logs[c].read(k) {
                LogRead::Rec(r) => return Recovered::Rec(r),
                LogRead::Lost => lost += 1,
                LogRead::Gone => gone += 1,
                LogRead::NotInit => {
                    let l = &logs.logs[c];
                    let stopped = l.done.load(Ordering::Acquire) || l.claim.load(Ordering::Acquire) != 0;
                    if stopped && l.max.load(Ordering::Acquire) < k {
                        // Stopped receiving before k: it never had it (its
                        // end-of-run catch-up will mark k LOST; it may be
                        // waiting for this core's claim, so do not wait for it).
                        lost += 1;
                    } else {
                        waiting += 1;
                    }
                }
            }
        }
        if waiting == 0 {
            return if gone == 0 && lost == n - 1 { Recovered::LostEverywhere } else { Recovered::Unrecoverable };
        }
        if tsc::rdtsc().saturating_sub(t0) > WAIT_LIMIT_CYCLES {
            return Recovered::Unrecoverable;
        }
        std::hint::spin_loop();
    }
}

// ---------------------------------------------------------------------------
// Replica tables
// ---------------------------------------------------------------------------

/// How an NF's replica is keyed from a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum KeyOf {
    /// Source address.
    Src,
    /// Destination address.
    Dst,
    /// The 5-tuple.
    Flow,
    /// The 5-tuple, either direction.
    Connection,
}

impl KeyOf {
    #[inline(always)]
    pub fn key(self, r: &ScrRecord) -> u128 {
        let v6 = u128::from(r.kind() & flowplane_wire::scr::kind::V6);
        match self {
            KeyOf::Src => (u128::from(r.src) << 8) | v6,
            KeyOf::Dst => (u128::from(r.dst) << 8) | v6,
            KeyOf::Flow => r.five_tuple_key(),
            KeyOf::Connection => r.connection_key(),
        }
    }
}

impl KeyOf {
    /// The record bits a key is made of, with the kind's VALID bit, as a
    /// mask over [`ScrRecord::to_words`] (None: either direction, not a
    /// field match). A record matches a [`KeyPattern`] taken from a valid
    /// record of key `k` exactly when it is valid and its key is `k`.
    #[inline(always)]
    pub(crate) fn mask(self) -> Option<[u64; 4]> {
        use flowplane_wire::scr::kind::{V6, VALID};
        let fields = match self {
            KeyOf::Src => ScrFields::SRC_IP,
            KeyOf::Dst => ScrFields::DST_IP,
            KeyOf::Flow => ScrFields::FIVE_TUPLE,
            KeyOf::Connection => return None,
        };
        let w = fields_mask(fields);
        Some([u64::from(VALID | V6) << 56, w[1], w[2], w[3]])
    }

    /// The mask of a record's key (as [`KeyOf::mask`]), its whole kind byte
    /// and the fields `f` names: what a pure transition
    /// ([`StatefulNf::SCR_PURE`](flowplane_nf::StatefulNf::SCR_PURE)) reads.
    /// Two records equal under it take a state to the same next state. None
    /// when the transition reads the time (every record's differs) or the
    /// key kind has no mask.
    pub(crate) fn still_mask(self, f: ScrFields) -> Option<[u64; 4]> {
        if f.0 & ScrFields::TIME.0 != 0 {
            return None;
        }
        let (key, w) = (self.mask()?, fields_mask(f));
        Some([key[0] | u64::from(u8::MAX) << 56, key[1] | w[1], key[2] | w[2], key[3] | w[3]])
    }
}

/// The bits of [`ScrRecord::to_words`] the header fields `f` occupy (the
/// time and kind word left out): built from a record with those fields set,
/// so it follows the record's layout.
#[inline(always)]
fn fields_mask(f: ScrFields) -> [u64; 4] {
    type Set = fn(&mut ScrRecord);
    const SET: [(ScrFields, Set); 7] = [
        (ScrFields::SRC_IP, |r| r.src = u32::MAX),
        (ScrFields::DST_IP, |r| r.dst = u32::MAX),
        (ScrFields::PORTS, |r| (r.sport, r.dport) = (u16::MAX, u16::MAX)),
        (ScrFields::PROTO, |r| r.proto = u8::MAX),
        (ScrFields::LEN, |r| r.len = u16::MAX),
        (ScrFields::TCP_FLAGS, |r| r.flags = u8::MAX),
        (ScrFields::TCP_SEQ_ACK, |r| (r.seq, r.ack) = (u32::MAX, u32::MAX)),
    ];
    let mut r = ScrRecord::default();
    for (x, set) in SET {
        if f.0 & x.0 != 0 {
            set(&mut r);
        }
    }
    let w = r.to_words();
    [0, w[1], w[2], w[3]]
}

/// A key as a masked comparison of a record's words (one vector compare
/// per four records, see [`KeyPattern::four_match`]), where computing the
/// key of every record of a run would build and compare 128-bit keys.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KeyPattern {
    mask: [u64; 4],
    want: [u64; 4],
}

impl KeyPattern {
    /// The pattern of valid record `r`'s key under `mask` ([`KeyOf::mask`]).
    #[inline(always)]
    pub(crate) fn of(mask: [u64; 4], r: &ScrRecord) -> KeyPattern {
        let w = r.to_words();
        KeyPattern { mask, want: std::array::from_fn(|i| w[i] & mask[i]) }
    }

    /// `r` is valid and has the pattern's key.
    #[inline(always)]
    pub(crate) fn matches(&self, r: &ScrRecord) -> bool {
        self.four_match(&[*r; 4])
    }

    /// How many leading records of `recs` match: a heavy key's N - 1
    /// records per packet, so four at a time ([`KeyPattern::four_match`]),
    /// then one by one from the first group of four with a mismatch.
    #[inline(always)]
    pub(crate) fn leading(&self, recs: &[ScrRecord]) -> usize {
        let (fours, _) = recs.as_chunks::<4>();
        let n = 4 * fours.iter().take_while(|f| self.four_match(f)).count();
        n + recs[n..].iter().take_while(|r| self.matches(r)).count()
    }

    /// Every record of `recs` matches: four at a time, the last four
    /// overlapping the ones before where the count is not a multiple of four
    /// (7 records: two tests); fewer than four one by one.
    #[inline(always)]
    pub(crate) fn all_match(&self, recs: &[ScrRecord]) -> bool {
        let (fours, rest) = recs.as_chunks::<4>();
        match recs.last_chunk::<4>() {
            None => rest.iter().all(|r| self.matches(r)),
            Some(last) => fours.iter().all(|f| self.four_match(f)) && (rest.is_empty() || self.four_match(last)),
        }
    }

    /// All four records match: their differences from the pattern or-ed
    /// (one 256-bit xor and or per record), then one test against the mask
    /// (`vptest`). A record is exactly one AVX2 register.
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
    #[inline(always)]
    fn four_match(&self, four: &[ScrRecord; 4]) -> bool {
        use safe_arch::{bitor_m256i, bitxor_m256i, m256i, testz_m256i};
        let want = m256i::from(self.want);
        let d =
            four.iter().fold(m256i::default(), |d, r| bitor_m256i(d, bitxor_m256i(m256i::from(r.to_words()), want)));
        testz_m256i(d, m256i::from(self.mask)) == 1
    }

    /// All four records match (without AVX2: the same or-ed differences, word by word).
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2")))]
    #[inline(always)]
    fn four_match(&self, four: &[ScrRecord; 4]) -> bool {
        let d = four.iter().fold([0u64; 4], |d, r| {
            let w = r.to_words();
            std::array::from_fn(|i| d[i] | (w[i] ^ self.want[i]))
        });
        (d[0] & self.mask[0]) | (d[1] & self.mask[1]) | (d[2] & self.mask[2]) | (d[3] & self.mask[3]) == 0
    }
}

#[inline(always)]
fn hash128(k: u128) -> u64 {
    let a = crc32c_u64(0x5bd1_e995, k as u64);
    let b = crc32c_u64(a, (k >> 64) as u64);
    (u64::from(a) << 32) | u64::from(b)
}

/// A replica slot's header: key, last-seen time, occupancy (half a line).
#[derive(Clone, Copy, Default)]
#[repr(C, align(32))]
struct Hdr {
    key: u128,
    last: u64,
    used: u64,
}

/// One NF's private replica: linear probing over preallocated arrays, and
/// a one-entry cache of the last key (a heavy flow's records hit it).
pub struct ReplicaTable {
    pub(crate) key_of: KeyOf,
    hdr: Box<[Hdr]>,
    /// States, `stride` words each (8-byte aligned for the NF's `Pod` state).
    states: Box<[u64]>,
    stride: usize,
    size: usize,
    len: usize,
    timeout_ns: u64,
    sweeps: u64,
    full: u64,
    /// The last key looked up and its slot (usize::MAX: none).
    hot_key: u128,
    hot_at: usize,
}

/// A slot found for a record: its index and whether its state is new.
#[derive(Clone, Copy)]
pub(crate) struct Slot {
    pub(crate) at: usize,
    pub(crate) fresh: bool,
}

impl ReplicaTable {
    fn new(key_of: KeyOf, capacity: usize, state_size: usize, timeout_ns: u64) -> ReplicaTable {
        let cap = (capacity.max(64) * 8 / 7).next_power_of_two();
        let stride = state_size.div_ceil(8).max(1);
        ReplicaTable {
            key_of,
            hdr: vec![Hdr::default(); cap].into_boxed_slice(),
            states: vec![0; cap * stride].into_boxed_slice(),
            stride,
            size: state_size,
            len: 0,
            timeout_ns: timeout_ns.max(1),
            sweeps: 0,
            full: 0,
            hot_key: 0,
            hot_at: usize::MAX,
        }
    }

    #[inline(always)]
    pub(crate) fn state(&mut self, at: usize) -> &mut [u8] {
        let w = &mut self.states[at * self.stride..(at + 1) * self.stride];
        &mut bytemuck::cast_slice_mut::<u64, u8>(w)[..self.size]
    }

    /// The slot of `key` when it is the key looked up last (a run of it needs no lookup).
    #[inline(always)]
    pub(crate) fn cached(&self, key: u128) -> Option<usize> {
        (key == self.hot_key && self.hot_at != usize::MAX).then_some(self.hot_at)
    }

    /// Slot `at`'s state (`S` the NF's state: `size` bytes, alignment <= 8).
    #[inline(always)]
    pub(crate) fn state_of<S: bytemuck::Pod>(&mut self, at: usize) -> &mut S {
        let w = &mut self.states[at * self.stride..(at + 1) * self.stride];
        bytemuck::from_bytes_mut(&mut bytemuck::cast_slice_mut::<u64, u8>(w)[..std::mem::size_of::<S>()])
    }

    /// The idle timeout.
    #[inline(always)]
    pub(crate) fn timeout_ns(&self) -> u64 {
        self.timeout_ns
    }

    /// Slot `at`'s last-seen time and state (`S` the NF's state: `size` bytes, alignment <= 8).
    #[inline(always)]
    pub(crate) fn read_slot<S: bytemuck::Pod>(&self, at: usize) -> (u64, S) {
        let w = &self.states[at * self.stride..(at + 1) * self.stride];
        (self.hdr[at].last, *bytemuck::from_bytes(&bytemuck::cast_slice::<u64, u8>(w)[..std::mem::size_of::<S>()]))
    }

    /// Writes slot `at`'s last-seen time and state (a run of records of one
    /// key kept them in hand: see [`ff`]).
    #[inline(always)]
    pub(crate) fn write_slot<S: bytemuck::Pod>(&mut self, at: usize, last: u64, st: &S) {
        self.hdr[at].last = last;
        let w = &mut self.states[at * self.stride..(at + 1) * self.stride];
        *bytemuck::from_bytes_mut(&mut bytemuck::cast_slice_mut::<u64, u8>(w)[..std::mem::size_of::<S>()]) = *st;
    }

    /// Touches slot `at` at `now`: whether the state starts over (idle past the timeout).
    #[inline(always)]
    fn touch(&mut self, at: usize, now: u64) -> Slot {
        let h = &mut self.hdr[at];
        // Idle past the timeout: the flow starts over (as a conntrack lookup does).
        let fresh = now.saturating_sub(h.last) > self.timeout_ns;
        h.last = if fresh { now } else { h.last.max(now) };
        Slot { at, fresh }
    }

    /// Finds or inserts the key at time `now` (None: full even after a sweep).
    #[inline(always)]
    pub(crate) fn lookup(&mut self, key: u128, now: u64) -> Option<Slot> {
        if key == self.hot_key && self.hot_at != usize::MAX {
            return Some(self.touch(self.hot_at, now));
        }
        self.lookup_slow(key, now)
    }

    #[inline(never)]
    fn lookup_slow(&mut self, key: u128, now: u64) -> Option<Slot> {
        let mask = self.hdr.len() - 1;
        let mut i = (hash128(key) as usize) & mask;
        loop {
            let h = &self.hdr[i];
            if h.used == 0 {
                break;
            }
            if h.key == key {
                self.hot_key = key;
                self.hot_at = i;
                return Some(self.touch(i, now));
            }
            i = (i + 1) & mask;
        }
        if (self.len + 1) * 8 > self.hdr.len() * 7 {
            self.sweep(now);
            if (self.len + 1) * 8 > self.hdr.len() * 7 {
                self.full += 1;
                return None;
            }
            return self.lookup_slow(key, now);
        }
        self.hdr[i] = Hdr { key, last: now, used: 1 };
        self.len += 1;
        self.hot_key = key;
        self.hot_at = i;
        Some(Slot { at: i, fresh: true })
    }

    /// Drops every entry idle past the timeout at `now` and re-inserts the
    /// rest (linear probing has no tombstone-free delete). Deterministic: it
    /// runs at the same record on every core.
    #[cold]
    fn sweep(&mut self, now: u64) {
        self.sweeps += 1;
        self.hot_at = usize::MAX;
        let mask = self.hdr.len() - 1;
        let mut live: Vec<(Hdr, Vec<u64>)> = Vec::new();
        for i in 0..self.hdr.len() {
            let h = self.hdr[i];
            if h.used != 0 && now.saturating_sub(h.last) <= self.timeout_ns {
                live.push((h, self.states[i * self.stride..(i + 1) * self.stride].to_vec()));
            }
        }
        self.hdr.iter_mut().for_each(|h| h.used = 0);
        self.len = 0;
        // Re-insert in key order so the layout is a function of the live set alone.
        live.sort_unstable_by_key(|e| e.0.key);
        for (h, st) in live {
            let mut i = (hash128(h.key) as usize) & mask;
            while self.hdr[i].used != 0 {
                i = (i + 1) & mask;
            }
            self.hdr[i] = h;
            self.states[i * self.stride..(i + 1) * self.stride].copy_from_slice(&st);
            self.len += 1;
        }
    }

    /// Order-independent digest of the keys, their last-seen times and states.
    fn digest(&self) -> u64 {
        let mut d = 0u64;
        for (i, h) in self.hdr.iter().enumerate() {
            if h.used != 0 {
                let mut x = hash128(h.key) ^ h.last.rotate_left(17);
                for &w in &self.states[i * self.stride..(i + 1) * self.stride] {
                    x = hash128(u128::from(x) << 64 | u128::from(w)) ^ x.rotate_left(29);
                }
                d = d.wrapping_add(x.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            }
        }
        d
    }
}

// ---------------------------------------------------------------------------
// The per-core replica
// ---------------------------------------------------------------------------

/// What one core's replica did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ScrCoreReport {
    /// Core.
    pub core: usize,
    /// Highest sequence number applied.
    pub max_seq: u64,
    /// The replica caught up to the stream's end (a bounded run that ran to completion).
    pub reached_end: bool,
    /// Digest of the replica's state (equal on every core when consistent).
    pub digest: u64,
    /// History entries fast-forwarded (applied without a verdict).
    pub fast_forwarded: u64,
    /// Own packets processed.
    pub own: u64,
    /// Sampled: fast-forward cycles and the own packets they covered.
    pub ff_cycles_sampled: u64,
    /// Own packets in the sampled batches.
    pub ff_packets_sampled: u64,
    /// Sampled: cycles of the own packets' actions (every NF, the same batches).
    pub own_cycles_sampled: u64,
    /// Cycles the sequencer spent on this core's packets (the NIC's or switch's work).
    pub seq_cycles: u64,
    /// Packets this core lost between the sequencer and itself (injected).
    pub lost: u64,
    /// Sequence numbers missing from the history a core received (lost packets' coverage).
    pub gaps: u64,
    /// Missing entries recovered from other cores' logs.
    pub recovered: u64,
    /// Missing entries every other core had lost too (skipped everywhere, consistently).
    pub lost_everywhere: u64,
    /// Missing entries skipped: no recovery, or not recoverable (the replica may diverge).
    pub unrecovered: u64,
    /// Records a replica table could not take (full after a sweep).
    pub table_full: u64,
    /// Table sweeps (deterministic, at 7/8 full).
    pub sweeps: u64,
    /// Times logging waited for the slowest core to come within the log size (recovery on).
    pub drift_waits: u64,
    /// Cycles those waits took.
    pub drift_wait_cycles: u64,
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
    tables: Vec<Option<ReplicaTable>>,
    seq: Arc<Sequencer>,
    logs: Option<Arc<ScrLogs>>,
    /// Highest sequence applied (`max[c]`).
    max: u64,
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

/// Why a chain cannot run under SCR (None: it can), for the placement check.
pub fn refusal(chain: &Chain) -> Option<String> {
    for s in &chain.stages {
        if let Stage::Stateful { nf, .. } = s {
            if nf.scr_fields().is_none() {
                return Some(format!(
                    "{} does not declare an SCR state transition (scr_fields/scr_transition); SCR-aware NFs: ddos, hh, portknock, ratelimit, conntrack, burn",
                    nf.name()
                ));
            }
            // Opting in declares the NF's own state a function of the packet
            // sequence (conntrack's table); a per-core port pool never is.
            if matches!(nf.placement().global, flowplane_nf::GlobalState::PortPool { .. }) {
                return Some(format!(
                    "{} keeps NF-global state that is not a function of the packet sequence",
                    nf.name()
                ));
            }
            if !matches!(nf.granularity(), Granularity::FiveTuple | Granularity::SrcIp | Granularity::DstIp) {
                return Some(format!(
                    "{} is keyed by {}, which SCR records do not carry",
                    nf.name(),
                    nf.granularity().name()
                ));
            }
            if nf.state_align() > 8 {
                return Some(format!("{}'s state needs {}-byte alignment", nf.name(), nf.state_align()));
            }
        }
    }
    None
}

/// The fields the chain's history records carry (union of the NFs' declarations).
pub fn chain_fields(chain: &Chain) -> ScrFields {
    chain.stages.iter().fold(ScrFields::default(), |f, s| match s {
        Stage::Stateful { nf, .. } => f.with(nf.scr_fields().unwrap_or_default()),
        Stage::Stateless(_) => f,
    })
}

impl ScrReplica {
    /// A replica for `core` of `chain` (checked with [`refusal`]), `flows`
    /// entries per NF table, idle timeouts from the NFs or `default_timeout_ns`.
    pub fn new(
        core: usize,
        chain: &Chain,
        flows: usize,
        default_timeout_ns: u64,
        seq: Arc<Sequencer>,
        logs: Option<Arc<ScrLogs>>,
        end: Option<u64>,
    ) -> ScrReplica {
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
                    Some(ReplicaTable::new(key_of, flows, nf.state_size(), t))
                }
                Stage::Stateless(_) => None,
            })
            .collect();
        let h = seq.history();
        ScrReplica {
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
        }
    }

    /// Queues one history entry for fast-forwarding.
    #[inline(always)]
    fn apply(&mut self, r: &ScrRecord) {
        self.ff.push(*r);
    }

    /// Fast-forwards the queued entries (recovered ones).
    #[inline]
    fn run_ff(&mut self, chain: &mut Chain) {
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
    /// per packet, fast-forward, then every NF's action on it.
    pub fn process(&mut self, chain: &mut Chain, batch: &mut Batch, side: ScrSide<'_>, ctx: &NfContext) {
        let n = batch.len().min(side.seqs.len());
        let hn = side.history;
        self.batches += 1;
        self.rep.seq_cycles = side.cycles;
        let sample = self.batches.is_multiple_of(SAMPLE_EVERY);
        if !sample && (self.logs.is_none() || self.no_gaps(&side, n)) {
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
                self.own_packet(chain, batch, i, &r, ctx);
                let t2 = tsc::rdtsc();
                // A sample the thread was preempted in says nothing about the work: dropped.
                if t2.saturating_sub(t0) < SAMPLE_MAX_CYCLES {
                    self.rep.ff_cycles_sampled += t1.saturating_sub(t0);
                    self.rep.own_cycles_sampled += t2.saturating_sub(t1);
                    self.rep.ff_packets_sampled += 1;
                }
            } else {
                self.catch_up(chain, s, h);
                self.own_packet(chain, batch, i, &r, ctx);
            }
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
    fn step_record(&mut self, chain: &mut Chain, seq: u64, h: &[ScrRecord]) {
        self.catch_up(chain, seq, h);
        self.apply(&h[h.len() - 1]);
        self.run_ff(chain);
    }

    /// The core's own packet: each NF's unchanged action, in chain order, with the sequencer's time.
    #[inline]
    fn own_packet(&mut self, chain: &mut Chain, batch: &mut Batch, i: usize, r: &ScrRecord, ctx: &NfContext) {
        let c = NfContext { now_ns: r.ts_ns(), ..*ctx };
        let meta = PktMeta::parse(batch.data(i));
        for (s, t) in chain.stages.iter_mut().zip(self.tables.iter_mut()) {
            if batch.verdicts()[i] == DROP {
                break;
            }
            match (s, t.as_mut()) {
                (Stage::Stateless(nf), _) => nf.process(batch, i..i + 1, &c),
                (Stage::Stateful { nf, counters, .. }, Some(t)) => {
                    counters.packets_in += 1;
                    counters.bytes_in += u64::from(batch.lens()[i]);
                    let action = if !r.valid() || !meta.valid {
                        nf.on_unparsed()
                    } else if let Some(slot) = t.lookup(t.key_of.key(r), c.now_ns) {
                        let st = t.state(slot.at);
                        if slot.fresh {
                            nf.scr_init_bytes(r, &c, st);
                        }
                        let mut pkt = Pkt::new(batch.data_mut(i), &meta);
                        nf.process_bytes(&mut pkt, st, &c)
                    } else {
                        // Table full on every core alike: the packet passes untracked.
                        flowplane_nf::Action::Pass
                    };
                    apply_action(batch, i, action, counters);
                }
                (Stage::Stateful { .. }, None) => {}
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
    pub fn finish(&mut self, chain: &mut Chain, ran_to_end: bool) {
        if let Some(logs) = self.logs.clone() {
            let claim = match self.end {
                Some(e) if ran_to_end => e,
                _ => self.max,
            };
            let me = logs.log(self.core);
            me.claim.store(claim + 1, Ordering::Release);
            let t0 = tsc::rdtsc();
            let mut target = claim;
            let mut all = true;
            for l in logs.logs.iter() {
                let mut c = l.claim.load(Ordering::Acquire);
                while c == 0 {
                    if tsc::rdtsc().saturating_sub(t0) > WAIT_LIMIT_CYCLES {
                        break;
                    }
                    std::hint::spin_loop();
                    c = l.claim.load(Ordering::Acquire);
                }
                all &= c != 0;
                target = target.max(c.saturating_sub(1));
            }
            if target > self.max {
                self.catch_up_gap(chain, &logs, target);
            }
            // Comparable when every core's claim was seen (all catch up to the same target).
            self.end = all.then_some(target);
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
    /// still recover: logging `seq` waits until every other core still
    /// receiving has resolved (received or recovered) everything up to
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
    /// for a lower max). A wait past the limit goes on (an overwritten
    /// entry is then reported unrecoverable).
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
                .filter(|&(c, l)| c != self.core && l.claim.load(Ordering::Acquire) == 0)
                .map(|(_, l)| l.resolved.load(Ordering::Acquire))
                .min()
                .unwrap_or(u64::MAX);
            let bound = slowest.saturating_add(room);
            let now = tsc::rdtsc();
            let need = if spins == 0 { seq } else { seq.saturating_add(hyst) };
            if need <= bound || now.saturating_sub(t0) > WAIT_LIMIT_CYCLES {
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
        r.table_full = self.tables.iter().flatten().map(|t| t.full).sum();
        r.sweeps = self.tables.iter().flatten().map(|t| t.sweeps).sum();
        r
    }
}

impl ScrReplica {
    /// Export rows of NF `name` (as [`crate::exec::Pipeline::export`] makes them from a flow table or a shared
    /// table) from this replica's table for it: every replica holds the same state (the digests check it), so
    /// one replica's rows are the run's. None if no stateful NF is called `name`. Records fold IPv6 addresses
    /// to 32 bits: `v6` maps each fold back to an address of the input (see [`add_v6_folds`]); a key whose fold it
    /// lacks, or keyed by connection (the direction is not kept), has no row.
    pub fn export(
        &self,
        chain: &Chain,
        name: &str,
        v6: &std::collections::HashMap<u32, std::net::Ipv6Addr>,
    ) -> Option<Vec<serde_json::Value>> {
        use flowplane_wire::flow::FiveTuple;
        use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
        let si = chain.stages.iter().position(|s| matches!(s, Stage::Stateful { nf, .. } if nf.name() == name))?;
        let (Stage::Stateful { nf, .. }, Some(t)) = (&chain.stages[si], self.tables.get(si)?.as_ref()) else {
            return None;
        };
        let ip = |a: u32, is_v6: bool| -> Option<IpAddr> {
            if is_v6 {
                v6.get(&a).map(|&x| IpAddr::V6(x))
            } else {
                Some(IpAddr::V4(Ipv4Addr::from(a)))
            }
        };
        let zero =
            |is_v6: bool| if is_v6 { IpAddr::V6(Ipv6Addr::UNSPECIFIED) } else { IpAddr::V4(Ipv4Addr::UNSPECIFIED) };
        let mut rows = Vec::new();
        for (i, h) in t.hdr.iter().enumerate() {
            if h.used == 0 {
                continue;
            }
            let k = h.key;
            let is_v6 = k as u8 & flowplane_wire::scr::kind::V6 != 0;
            let tuple = match t.key_of {
                KeyOf::Src => ip((k >> 8) as u32, is_v6).and_then(|a| FiveTuple::new(a, zero(is_v6), 0, 0, 0)),
                KeyOf::Dst => ip((k >> 8) as u32, is_v6).and_then(|a| FiveTuple::new(zero(is_v6), a, 0, 0, 0)),
                KeyOf::Flow => match (ip((k >> 96) as u32, is_v6), ip((k >> 64) as u32, is_v6)) {
                    (Some(s), Some(d)) => FiveTuple::new(s, d, (k >> 48) as u16, (k >> 32) as u16, (k >> 24) as u8),
                    _ => None,
                },
                KeyOf::Connection => None,
            };
            let Some(tuple) = tuple else { continue };
            let w = &t.states[i * t.stride..(i + 1) * t.stride];
            rows.extend(nf.export_row_bytes(&tuple, &bytemuck::cast_slice::<u64, u8>(w)[..t.size]));
        }
        Some(rows)
    }
}

impl ScrReplica {
    /// Keys in the replica's first table keyed by the 5-tuple (None: no NF keeps per-flow state): the live flows.
    pub fn flows(&self) -> Option<u64> {
        self.tables.iter().flatten().find(|t| t.key_of == KeyOf::Flow).map(|t| t.len as u64)
    }
}

/// Adds `frame`'s IPv6 addresses to `m`, by their 32-bit fold in SCR records (what [`ScrReplica::export`] needs to
/// show IPv6 keys).
pub fn add_v6_folds(m: &mut std::collections::HashMap<u32, std::net::Ipv6Addr>, frame: &[u8]) {
    let meta = PktMeta::parse(frame);
    if let (true, flowplane_wire::flow::FiveTuple::V6(t)) = (meta.valid, meta.tuple) {
        let r = ScrRecord::from_frame(frame, &meta);
        m.insert(r.src, t.src());
        m.insert(r.dst, t.dst());
    }
}

/// An SCR run's shared parts: the sequencer, the logs, the stream's end.
pub struct ScrRun {
    /// The sequencer (shared by every queue and replica).
    pub seq: Arc<Sequencer>,
    /// Per-core logs (recovery on).
    pub logs: Option<Arc<ScrLogs>>,
    /// Last sequence number of a bounded run.
    pub end: Option<u64>,
    /// Fields the records carry for the chain.
    pub fields: ScrFields,
    /// Distinct connections (canonical 5-tuples) in the stream: sizes the replica tables.
    pub keys: usize,
}

impl ScrRun {
    /// Checks the configuration for `workers` workers on `threads` threads
    /// and builds the sequencer over `trace`.
    pub fn new(
        cfg: &ScrConfig,
        workers: usize,
        threads: usize,
        loops: Option<u64>,
        trace: &flowplane_io::replay::ReplayTrace,
        chain: &Chain,
    ) -> Result<ScrRun, crate::error::EngineError> {
        let bad = |m: String| Err(crate::error::EngineError::Config(m));
        let history = cfg.history.unwrap_or(workers);
        if history < workers || history > 4096 {
            return bad(format!(
                "--scr-history {history}: must be at least the number of cores ({workers}; a core sees every N-th packet) and at most 4096"
            ));
        }
        if !(0.0..=1.0).contains(&cfg.loss) {
            return bad(format!("--scr-loss {}: a rate between 0 and 1", cfg.loss));
        }
        if cfg.recovery && threads < workers {
            return bad(
                "--scr-recovery needs one real core per worker (a core waits for the others' logs; logical workers taking turns would wait forever)"
                    .to_string(),
            );
        }
        if !cfg.log_entries.is_power_of_two() || cfg.log_entries < 2 * history {
            return bad(format!("SCR log of {} entries: a power of two of at least 2N", cfg.log_entries));
        }
        let seq = Arc::new(Sequencer::new(trace, history, cfg.loss, cfg.seed));
        let end = loops.map(|l| l.saturating_mul(seq.stream_len()));
        // One core has no other log to recover from: a token log (never written per packet).
        let entries = if workers > 1 { cfg.log_entries } else { 2 };
        let logs = cfg.recovery.then(|| Arc::new(ScrLogs::new(workers, entries)));
        let keys = (1..=seq.stream_len())
            .map(|s| seq.record(s).connection_key())
            .collect::<std::collections::HashSet<u128>>()
            .len();
        Ok(ScrRun { seq, logs, end, fields: chain_fields(chain), keys })
    }
}

/// The SCR section of a report.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ScrReport {
    /// Records piggybacked per packet (N).
    pub history: usize,
    /// Fields the records carry for this chain.
    pub fields: Vec<&'static str>,
    /// Bytes a sequencer would prefix to each packet: N records of the
    /// declared fields, a 2-byte index of the earliest, an 8-byte sequence number.
    pub history_bytes_per_packet: usize,
    /// Bytes each core copies per packet here (N fixed 32-byte records).
    pub copied_bytes_per_packet: usize,
    /// Fast-forward cycles per own packet (sampled batches, run packet by
    /// packet to time the two apart; catch-up and logging): an upper bound
    /// of the batch path's, which takes a heavy flow's records and packet in
    /// one scan (its cost shows in the workers' cycles and the projection).
    pub ff_cycles_per_packet: f64,
    /// History entries fast-forwarded per own packet.
    pub ff_entries_per_packet: f64,
    /// Own packet's actions (every NF), cycles per packet (the same sampled batches).
    pub own_cycles_per_packet: f64,
    /// The sequencer's cycles per packet (stamping, history; the NIC's work, not in the workers' figures).
    pub seq_cycles_per_packet: f64,
    /// Loss recovery (logs, Algorithm 1) on.
    pub recovery: bool,
    /// Injected loss rate.
    pub loss: f64,
    /// Every core's replica digest is the same.
    pub consistent: bool,
    /// The run had a known end (loops), so every replica caught up to it and the digests are comparable.
    pub comparable: bool,
    /// Per core.
    pub cores: Vec<ScrCoreReport>,
}

impl ScrReport {
    /// Sums the cores' reports.
    pub fn new(history: usize, fields: ScrFields, recovery: bool, loss: f64, cores: Vec<ScrCoreReport>) -> ScrReport {
        let comparable = cores.iter().all(|c| c.reached_end);
        let own: u64 = cores.iter().map(|c| c.own).sum();
        let ff: u64 = cores.iter().map(|c| c.fast_forwarded).sum();
        let (cy, pk) = cores.iter().fold((0, 0), |a, c| (a.0 + c.ff_cycles_sampled, a.1 + c.ff_packets_sampled));
        let owncy: u64 = cores.iter().map(|c| c.own_cycles_sampled).sum();
        let seqcy: u64 = cores.iter().map(|c| c.seq_cycles).sum();
        let consistent = cores.windows(2).all(|w| w[0].digest == w[1].digest && w[0].max_seq == w[1].max_seq);
        ScrReport {
            history,
            fields: fields.names(),
            history_bytes_per_packet: history * fields.wire_bytes() + 2 + 8,
            copied_bytes_per_packet: history * std::mem::size_of::<ScrRecord>(),
            ff_cycles_per_packet: if pk > 0 { cy as f64 / pk as f64 } else { 0.0 },
            ff_entries_per_packet: if own > 0 { ff as f64 / own as f64 } else { 0.0 },
            own_cycles_per_packet: if pk > 0 { owncy as f64 / pk as f64 } else { 0.0 },
            seq_cycles_per_packet: if own > 0 { seqcy as f64 / own as f64 } else { 0.0 },
            recovery,
            loss,
            consistent,
            comparable,
            cores,
        }
    }

    /// Text lines for the report.
    pub fn lines(&self) -> Vec<String> {
        let mut v = vec![format!(
            "scr          history N={} ({}): {} B/packet on a wire, {} B copied; fast-forward {:.1} cycles/packet sampled ({:.2} entries/packet); recovery {}, loss {}",
            self.history,
            self.fields.join("+"),
            self.history_bytes_per_packet,
            self.copied_bytes_per_packet,
            self.ff_cycles_per_packet,
            self.ff_entries_per_packet,
            if self.recovery { "on" } else { "off" },
            self.loss
        )];
        let per_entry = if self.ff_entries_per_packet > 0.0 {
            format!(" ({:.1}/entry)", self.ff_cycles_per_packet / self.ff_entries_per_packet)
        } else {
            String::new()
        };
        v.push(format!(
            "scr cycles   per packet: sequencer {:.1} (NIC side), fast-forward {:.1}{}, own packet {:.1} (TSC, sampled batches run packet by packet: an upper bound, the batch path fuses a heavy flow's records and packet)",
            self.seq_cycles_per_packet, self.ff_cycles_per_packet, per_entry, self.own_cycles_per_packet
        ));
        let digests: Vec<String> = self.cores.iter().map(|c| format!("{:016x}", c.digest)).collect();
        let verdict = match (self.comparable, self.consistent) {
            (false, _) => "not comparable (run stopped by time: replicas at different points)",
            (true, true) => "identical",
            (true, false) => "DIVERGED",
        };
        v.push(format!("scr replicas {verdict}: {}", digests.join(" ")));
        let sum = |f: fn(&ScrCoreReport) -> u64| self.cores.iter().map(f).sum::<u64>();
        v.push(format!(
            "scr loss     {} lost, {} gaps: {} recovered, {} lost everywhere, {} unrecovered; {} table-full; {} drift waits",
            sum(|c| c.lost),
            sum(|c| c.gaps),
            sum(|c| c.recovered),
            sum(|c| c.lost_everywhere),
            sum(|c| c.unrecovered),
            sum(|c| c.table_full),
            sum(|c| c.drift_waits)
        ));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(src: u32, ts: u64) -> ScrRecord {
        rec_to(src, 0, ts)
    }

    /// A TCP frame from `src` to port `dport`.
    fn frame_to(src: u32, dport: u16) -> Vec<u8> {
        let mut f = vec![0u8; 60];
        // Ethernet + IPv4 + TCP, source address `src`.
        f[12] = 0x08;
        f[14] = 0x45;
        f[16..18].copy_from_slice(&46u16.to_be_bytes());
        f[22] = 64;
        f[23] = 6;
        f[26..30].copy_from_slice(&src.to_be_bytes());
        f[30..34].copy_from_slice(&[10, 0, 0, 1]);
        f[36..38].copy_from_slice(&dport.to_be_bytes());
        f[46] = 0x50;
        f
    }

    /// The record of a TCP packet from `src` to port `dport` at `ts`.
    fn rec_to(src: u32, dport: u16, ts: u64) -> ScrRecord {
        let f = frame_to(src, dport);
        let m = PktMeta::parse(&f);
        let mut r = ScrRecord::from_frame(&f, &m);
        r.set_ts_ns(ts);
        r
    }

    #[test]
    fn log_markers_and_wrap() {
        let logs = ScrLogs::new(3, 8);
        let l = logs.log(0);
        assert_eq!(l.read(5), LogRead::NotInit);
        l.write(5, &rec(1, 7));
        assert_eq!(l.read(5), LogRead::Rec(rec(1, 7)));
        // A gap is marked by raising max alone: LOST below it, nothing overwritten.
        l.publish(12);
        assert_eq!(l.read(6), LogRead::Lost);
        assert_eq!(l.read(5), LogRead::Rec(rec(1, 7)));
        l.write(13, &rec(2, 8));
        assert_eq!(l.read(5), LogRead::Gone);
        // Core 1 has k, core 2 lost it.
        logs.log(1).write(9, &rec(3, 9));
        logs.log(2).publish(9);
        assert_eq!(recover(&logs, 2, 9), Recovered::Rec(rec(3, 9)));
        logs.log(1).publish(10);
        assert_eq!(recover(&logs, 2, 10), Recovered::LostEverywhere);
        // Finished cores that never got there count as lost.
        logs.log(0).done.store(true, Ordering::Release);
        logs.log(1).done.store(true, Ordering::Release);
        assert_eq!(recover(&logs, 2, 100), Recovered::LostEverywhere);
    }

    #[test]
    fn table_expires_and_sweeps_deterministically() {
        let mut a = ReplicaTable::new(KeyOf::Src, 64, 8, 100);
        let mut b = ReplicaTable::new(KeyOf::Src, 64, 8, 100);
        for i in 0..1000u32 {
            let r = rec(i % 300, u64::from(i));
            for t in [&mut a, &mut b] {
                if let Some(s) = t.lookup(t.key_of.key(&r), r.ts_ns()) {
                    t.state(s.at)[0] = t.state(s.at)[0].wrapping_add(1);
                }
            }
        }
        assert!(a.sweeps > 0);
        assert_eq!(a.digest(), b.digest());
        let s = a.lookup(a.key_of.key(&rec(999 % 300, 999)), 999).unwrap();
        assert!(!s.fresh);
        let s = a.lookup(a.key_of.key(&rec(999 % 300, 999)), 2000).unwrap();
        assert!(s.fresh, "idle past the timeout starts over");
    }

    /// A still mask is the key, the kind byte and the declared fields, no
    /// more: a record differing in an undeclared field (or the time) still
    /// matches; one differing in a declared field or the kind does not. A
    /// transition that reads the time has none.
    #[test]
    fn still_mask_is_the_key_kind_and_declared_fields() {
        use flowplane_wire::scr::kind::{PORTS, TCP, VALID};
        let f = ScrFields::SRC_IP.with(ScrFields::PORTS).with(ScrFields::PROTO);
        assert!(KeyOf::Src.still_mask(f.with(ScrFields::TIME)).is_none());
        assert!(KeyOf::Connection.still_mask(f).is_none());
        let m = KeyOf::Src.still_mask(f).unwrap();
        let w = [u64::from(VALID | PORTS | TCP) << 56 | 5, 0x0a00_0001 | 7 << 32, 1234 | 80 << 16, 6 << 48];
        let a = ScrRecord::from_words(w);
        let p = KeyPattern::of(m, &a);
        let changed = |set: fn(&mut ScrRecord)| {
            let mut b = a;
            set(&mut b);
            p.matches(&b)
        };
        assert!(changed(|b| b.set_ts_ns(99)));
        assert!(changed(|b| b.dst = 9));
        assert!(changed(|b| (b.len, b.flags, b.seq, b.ack) = (60, 2, 3, 4)));
        assert!(!changed(|b| b.src = 2));
        assert!(!changed(|b| b.dport = 81));
        assert!(!changed(|b| b.sport = 1));
        assert!(!changed(|b| b.proto = 17));
        assert!(!changed(|b| *b = ScrRecord::from_words({
            let mut w = b.to_words();
            w[0] &= !(u64::from(PORTS) << 56);
            w
        })));
    }

    /// Time unit of the key-in-hand tests: a tenth of the ddos window (1 ms).
    const U: u64 = 100_000;

    /// The first stage of a chain of one stateful NF.
    fn nf0(c: &mut Chain) -> &mut Box<dyn crate::stage::StatefulStage> {
        match &mut c.stages[0] {
            Stage::Stateful { nf, .. } => nf,
            Stage::Stateless(_) => unreachable!(),
        }
    }

    /// Two chains of `spec` (one NF keyed by source) and a 64-slot replica
    /// table for each (idle timeout 5 ddos windows: small enough to sweep).
    fn pair(spec: &str) -> (Chain, Chain, ReplicaTable, ReplicaTable) {
        let spec = crate::spec::parse(spec).unwrap();
        let (mut ca, cb) = (Chain::build(&spec).unwrap(), Chain::build(&spec).unwrap());
        let size = nf0(&mut ca).state_size();
        let table = || ReplicaTable::new(KeyOf::Src, 64, size, 5 * U);
        (ca, cb, table(), table())
    }

    /// Xorshift32 draws below `m`.
    fn xorshift(mut x: u32) -> impl FnMut(u32) -> u32 {
        move |m: u32| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x % m
        }
    }

    /// `n` records to random ports: the source changes one time in `switch` (to one of
    /// `heavy` heavy sources, or one of 200 others one time in 8), the port one time in
    /// `port_change`, the time jumps past the idle timeout or back one time in `jumps`
    /// each, one record in 64 is invalid.
    fn hostile_records(
        next: &mut impl FnMut(u32) -> u32,
        n: usize,
        switch: u32,
        heavy: u32,
        port_change: u32,
        jumps: u32,
    ) -> Vec<ScrRecord> {
        let (mut ts, mut src, mut dport, mut recs) = (1_000u64, 1u32, 80, Vec::with_capacity(n));
        for _ in 0..n {
            if next(switch) == 0 {
                src = if next(8) == 0 { 1000 + next(200) } else { 1 + next(heavy) };
            }
            ts = match next(jumps) {
                0 => ts + 200 * U,
                1 => ts.saturating_sub(30 * U),
                _ => ts + u64::from(next(12)) * U / 4,
            };
            // Knocks and the protected port of portknock's defaults, and
            // others; drawn again one time in `port_change` (runs of
            // records equal in all portknock reads: its fixed points).
            if port_change <= 1 || next(port_change) == 0 {
                dport = [1111, 2222, 3333, 22, 80][next(5) as usize];
            }
            let mut r = rec_to(src, dport, ts);
            if next(64) == 0 {
                r = ScrRecord::default();
                r.set_ts_ns(ts);
            }
            recs.push(r);
        }
        recs
    }

    /// The fast-forward with the key in hand (runs back to back, one
    /// write-back) leaves the same states, last-seen times and survivals as
    /// a lookup and a transition per entry: keys interleaved, runs going
    /// idle past the timeout inside and between calls, times going back,
    /// invalid records, a table small enough to sweep.
    #[test]
    fn fast_forward_in_hand_equals_entry_by_entry() {
        let (mut ca, mut cb, mut ta, mut tb) = pair("ddos(threshold=3,window=0.001)");
        let mut next = xorshift(0x9e37_79b9);
        let recs = hostile_records(&mut next, 20_000, 4, 3, 1, 16);
        let (mut i, mut got, mut want) = (0, Vec::new(), Vec::new());
        while i < recs.len() {
            let n = (1 + next(9) as usize).min(recs.len() - i);
            let chunk = &recs[i..i + n];
            let mut alive: Vec<bool> = chunk.iter().map(|r| r.valid()).collect();
            nf0(&mut ca).scr_fast_forward(&mut ta, chunk, &mut alive);
            got.extend(alive);
            for r in chunk {
                let ctx = NfContext { now_tsc: 0, now_ns: r.ts_ns() };
                let pass = r.valid()
                    && match tb.lookup(tb.key_of.key(r), r.ts_ns()) {
                        Some(s) => {
                            if s.fresh {
                                nf0(&mut cb).scr_init_bytes(r, &ctx, tb.state(s.at));
                            }
                            let st = tb.state(s.at);
                            nf0(&mut cb).scr_transition_bytes(st, r, &ctx)
                        }
                        None => true,
                    };
                want.push(pass);
            }
            i += n;
        }
        assert!(ta.sweeps > 0 && got.iter().any(|&a| !a) && got.iter().filter(|&&a| a).count() > 1000);
        assert_eq!(got, want);
        assert_eq!(ta.digest(), tb.digest());
    }

    /// The NF-major batch (the state of the key seen last kept in hand
    /// across records and packets) against the same sequence applied record
    /// by record with a lookup each: a heavy source interleaved with others,
    /// time jumps past the idle timeout and backwards, invalid records.
    #[test]
    fn batch_with_state_in_hand_equals_record_by_record() {
        // ddos and portknock take a key's records as runs (`scr_run`), hh
        // record by record in one pass. Times that go back take the general
        // runs; times that never do (a sequencer's clock) the pattern runs
        // (`run_hand`) and, for the closed forms, whole packets.
        for spec in ["ddos(threshold=3,window=0.001)", "portknock", "hh"] {
            for monotonic in [false, true] {
                batch_in_hand_case(spec, monotonic, 1);
            }
        }
        // Ports that stay: portknock's fixed points (a pure transition: a
        // heavy source's records equal to one that leaves its state as it
        // is are passed over), the state changing between them.
        for port_change in [3, 12] {
            batch_in_hand_case("portknock", true, port_change);
        }
    }

    fn batch_in_hand_case(spec: &str, monotonic: bool, port_change: u32) {
        use flowplane_nf::stateful::Action;
        use flowplane_nf::NfCounters;
        use flowplane_packet::{PacketPool, PoolConfig};
        let (mut ca, mut cb, mut ta, mut tb) = pair(spec);
        let mut next = xorshift(0x2545_f491);
        let mut recs = hostile_records(&mut next, 30_000, 6, 2, port_change, 32);
        if monotonic {
            let mut latest = 0;
            for r in &mut recs {
                latest = r.ts_ns().max(latest);
                r.set_ts_ns(latest);
            }
        }
        // A core of three: packet s carries records s-2, s-1 (fast-forwarded) and its own.
        const N: usize = 3;
        let mut pool = PacketPool::new(PoolConfig { buffers: 256, ..PoolConfig::default() }).unwrap();
        let mut batch = Batch::new(&pool);
        let ctx = NfContext::default();
        let (mut s, mut got, mut want) = (N, Vec::new(), Vec::new());
        let mut counters = NfCounters::default();
        while s < recs.len() {
            let n = (1 + next(40) as usize).min((recs.len() - s).div_ceil(N));
            let (mut hist, mut plan, mut metas) = (Vec::new(), Vec::new(), Vec::new());
            for i in 0..n {
                let at = s + i * N;
                if at >= recs.len() {
                    break;
                }
                hist.extend_from_slice(&recs[at + 1 - N..=at]);
                // The packet the own record was taken from.
                let frame = frame_to(recs[at].src, recs[at].dport);
                assert!(batch.push_copy(&mut pool, &frame, 0));
                // One packet in 16 dropped by a stage before: its records
                // are applied, the packet itself is not (no lookup either).
                let dropped_before = next(16) == 0;
                if dropped_before {
                    batch.drop_packet(i);
                }
                metas.push(PktMeta::parse(&frame));
                plan.push(Planned { i: i as u32, ff: (0, N as u32 - 1) });
                // The reference: each record with a lookup, the own one through `process`.
                for (j, r) in recs[at + 1 - N..=at].iter().enumerate() {
                    let c = NfContext { now_ns: r.ts_ns(), ..ctx };
                    let own = j == N - 1;
                    if own && dropped_before {
                        want.push(false);
                        continue;
                    }
                    if !r.valid() {
                        if own {
                            want.push(nf0(&mut cb).on_unparsed() != Action::Drop);
                        }
                        continue;
                    }
                    match tb.lookup(tb.key_of.key(r), r.ts_ns()) {
                        Some(slot) => {
                            if slot.fresh {
                                nf0(&mut cb).scr_init_bytes(r, &c, tb.state(slot.at));
                            }
                            let st = tb.state(slot.at);
                            if own {
                                let mut f = frame.clone();
                                let m = PktMeta::parse(&f);
                                let a = nf0(&mut cb).process_bytes(&mut Pkt::new(&mut f, &m), st, &c);
                                want.push(a != Action::Drop);
                            } else {
                                nf0(&mut cb).scr_transition_bytes(st, r, &c);
                            }
                        }
                        None if own => want.push(true),
                        None => {}
                    }
                }
            }
            let b = ScrBatch { plan: &plan, hist: &hist, history: N, metas: &metas, ctx: &ctx, sole: true, monotonic };
            nf0(&mut ca).scr_batch(&mut ta, &b, &mut [], &mut batch, &mut counters);
            got.extend(batch.verdicts().iter().map(|&v| v != flowplane_packet::DROP));
            batch.free_all(&mut pool).unwrap();
            s += plan.len() * N;
        }
        assert_eq!(got.len(), want.len());
        assert!(
            ta.sweeps > 0 && got.iter().filter(|&&p| !p).count() > 100 && got.iter().filter(|&&p| p).count() > 1000
        );
        assert_eq!(got, want);
        assert_eq!(ta.digest(), tb.digest());
    }

    /// Fast-forward cost per history entry (run with --ignored --nocapture; a figure, not a check).
    #[test]
    #[ignore]
    fn apply_cost() {
        let mut chain = Chain::build(&crate::spec::parse("ddos").unwrap()).unwrap();
        let mut b = flowplane_io::replay::ReplayBuilder::new(1);
        b.push_steered(&[0u8; 60], 0, 0, 0).unwrap();
        let seq = Arc::new(Sequencer::new(&b.build(), 8, 0.0, 1));
        let mut r = ScrReplica::new(0, &chain, 1 << 21, 30_000_000_000, seq, None, None);
        let recs: Vec<ScrRecord> = (0..8).map(|i| rec(7, i)).collect();
        for _ in 0..3 {
            let t0 = tsc::rdtsc();
            for _ in 0..1_000_000 {
                for x in &recs {
                    r.apply(x);
                }
                r.run_ff(&mut chain);
            }
            eprintln!("{:.1} cycles/entry", (tsc::rdtsc() - t0) as f64 / 8e6);
        }
    }

    fn trace(sources: u32, packets: u32) -> Arc<flowplane_io::replay::ReplayTrace> {
        let mut b = flowplane_io::replay::ReplayBuilder::new(1);
        let mut x = 7u32;
        for i in 0..packets {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let mut f = vec![0u8; 60];
            f[12] = 0x08;
            f[14] = 0x45;
            f[16..18].copy_from_slice(&46u16.to_be_bytes());
            f[22] = 64;
            f[23] = 6;
            f[26..30].copy_from_slice(&(0x0a00_0000 + x % sources).to_be_bytes());
            f[30..34].copy_from_slice(&[10, 9, 9, 9]);
            f[46] = 0x50;
            b.push_steered(&f, 0, u64::from(i) * 20_000, 0).unwrap();
        }
        b.build()
    }

    /// One core of a simulated run: its packets (every k-th), minus the lost ones.
    fn core_run(
        core: usize,
        k: usize,
        end: u64,
        lost: &[bool],
        seq: &Arc<Sequencer>,
        logs: &Arc<ScrLogs>,
    ) -> (ScrCoreReport, u64) {
        let spec = crate::spec::parse("ddos(threshold=3,window=0.001) -> hh").unwrap();
        let mut chain = Chain::build(&spec).unwrap();
        let mut r =
            ScrReplica::new(core, &chain, 1024, u64::MAX / 4, Arc::clone(seq), Some(Arc::clone(logs)), Some(end));
        let mut h = vec![ScrRecord::default(); seq.history()];
        let mut s = core as u64 + 1;
        while s <= end {
            if !lost[(s - 1) as usize] {
                seq.fill(s, &mut h);
                r.step_record(&mut chain, s, &h);
            }
            s += k as u64;
        }
        r.finish(&mut chain, true);
        let rep = r.report(&chain, 0);
        (rep.clone(), rep.digest)
    }

    #[test]
    fn single_losses_recover_a_core_burst_longer_than_the_log_is_reported() {
        let end = 600u64;
        let t = trace(12, end as u32);
        // (lost sequence numbers, log entries): singles with a log covering any
        // drift between the threads; 60 of core 0's packets in a row with an 8-entry log.
        let singles: Vec<u64> = vec![100, 301, 302, 450];
        let burst: Vec<u64> = (0..60).map(|i| 200 + 2 * i).collect();
        for (lost_seqs, log, must_recover) in [(singles, 1024usize, true), (burst, 8, false)] {
            let mut lost = vec![false; end as usize];
            for s in lost_seqs {
                lost[s as usize] = true;
            }
            let seq = Arc::new(Sequencer::new(&t, 2, 0.0, 1));
            let logs = Arc::new(ScrLogs::new(2, log));
            let out: Vec<(ScrCoreReport, u64)> = std::thread::scope(|sc| {
                let hs: Vec<_> = (0..2)
                    .map(|c| {
                        let (seq, logs, lost) = (&seq, &logs, &lost);
                        sc.spawn(move || core_run(c, 2, end, lost, seq, logs))
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let unrec: u64 = out.iter().map(|o| o.0.unrecovered).sum();
            assert!(out.iter().map(|o| o.0.gaps).sum::<u64>() > 0);
            if must_recover {
                assert_eq!(unrec, 0, "{out:?}");
                assert!(out.iter().map(|o| o.0.recovered).sum::<u64>() > 0);
            }
            if unrec == 0 {
                assert_eq!(out[0].1, out[1].1, "no core reports a loss: replicas identical");
            } else {
                assert!(out[0].0.unrecovered > 0, "only core 0 lost packets: {out:?}");
            }
        }
    }

    /// Runs `k` cores (history N = k, logs of `log` entries) over a
    /// 600-packet trace with the packets `lost[s - 1]` lost, and checks
    /// every core: it caught up to the end, and unless it reports an
    /// unrecovered entry its replica equals the reference (every sequence
    /// carried by some received packet — `s ..= s + k - 1` — in order;
    /// the others were lost everywhere). Returns the cores' reports.
    fn check_loss_pattern(k: usize, log: usize, lost: &[bool]) -> Result<Vec<ScrCoreReport>, String> {
        let end = lost.len() as u64;
        let t = trace(12, end as u32);
        let seq = Arc::new(Sequencer::new(&t, k, 0.0, 1));
        let logs = Arc::new(ScrLogs::new(k, log));
        let out: Vec<(ScrCoreReport, u64)> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..k)
                .map(|c| {
                    let (seq, logs) = (&seq, &logs);
                    sc.spawn(move || core_run(c, k, end, lost, seq, logs))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let spec = crate::spec::parse("ddos(threshold=3,window=0.001) -> hh").unwrap();
        let mut chain = Chain::build(&spec).unwrap();
        let mut reference = ScrReplica::new(0, &chain, 1024, u64::MAX / 4, Arc::clone(&seq), None, Some(end));
        for s in 1..=end {
            if (s..(s + k as u64).min(end + 1)).any(|q| !lost[(q - 1) as usize]) {
                reference.apply(&seq.record(s));
                reference.run_ff(&mut chain);
            }
        }
        reference.max = end;
        let want = reference.report(&chain, 0).digest;
        for (rep, digest) in &out {
            if rep.max_seq != end || !rep.reached_end {
                return Err(format!("core {} did not reach the end: {rep:?}", rep.core));
            }
            if rep.unrecovered == 0 && *digest != want {
                return Err(format!("core {} diverged silently: {rep:?}", rep.core));
            }
        }
        Ok(out.into_iter().map(|o| o.0).collect())
    }

    /// A loss burst running to the very end of a finite trace (no later
    /// packet carries its history): the end-of-run claim reveals it, the
    /// cores recover what any of them received and agree on the rest.
    #[test]
    fn a_loss_burst_reaching_the_end_is_recovered() {
        for (k, from) in [(2usize, 568usize), (2, 567), (3, 590), (2, 599), (3, 0)] {
            let mut lost = vec![false; 600];
            lost[from..].iter_mut().for_each(|l| *l = true);
            let out = check_loss_pattern(k, 32, &lost).unwrap();
            assert_eq!(out.iter().map(|c| c.unrecovered).sum::<u64>(), 0, "k={k} from={from}: {out:?}");
            assert!(out.iter().map(|c| c.gaps).sum::<u64>() > 0);
        }
    }

    proptest::proptest! {
        // PROPTEST_CASES overrides the count (e.g. 2000 for a deeper search).
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(160),
            ..Default::default()
        })]

        /// A record matches the pattern of a valid record exactly when it is
        /// valid and has that record's key, for every key kind with a mask
        /// (records drawn near each other: fields equal or one bit apart).
        #[test]
        fn key_pattern_matches_exactly_the_key(
            a in proptest::prelude::any::<[u64; 4]>(),
            flips in proptest::collection::vec(0u32..256, 0..3),
            kinds in 0u8..16,
        ) {
            use flowplane_wire::scr::kind::VALID;
            let a = ScrRecord::from_words([a[0] | u64::from(VALID) << 56, a[1], a[2], a[3]]);
            let mut w = a.to_words();
            for f in flips {
                w[(f / 64) as usize] ^= 1 << (f % 64);
            }
            w[0] = (w[0] & !(0xff << 56)) | u64::from(kinds) << 56;
            let b = ScrRecord::from_words(w);
            for k in [KeyOf::Src, KeyOf::Dst, KeyOf::Flow] {
                let p = KeyPattern::of(k.mask().unwrap(), &a);
                proptest::prop_assert!(p.matches(&a));
                proptest::prop_assert_eq!(p.matches(&b), b.valid() && k.key(&b) == k.key(&a), "{:?}", k);
            }
            proptest::prop_assert!(KeyOf::Connection.mask().is_none());
        }

        /// `leading` and `all_match` (four records per test, the last four
        /// overlapping) agree with `matches` record by record: runs of 0-13
        /// records, each the pattern's own or one bit off it.
        #[test]
        fn pattern_runs_agree_with_record_by_record(
            a in proptest::prelude::any::<[u64; 4]>(),
            flips in proptest::collection::vec(proptest::option::weighted(0.2, 0u32..256), 0..14),
        ) {
            use flowplane_wire::scr::kind::VALID;
            let a = ScrRecord::from_words([a[0] | u64::from(VALID) << 56, a[1], a[2], a[3]]);
            let recs: Vec<ScrRecord> = flips
                .iter()
                .map(|f| {
                    let mut w = a.to_words();
                    if let Some(f) = f {
                        w[(f / 64) as usize] ^= 1 << (f % 64);
                    }
                    ScrRecord::from_words(w)
                })
                .collect();
            let fields = ScrFields::SRC_IP.with(ScrFields::PORTS).with(ScrFields::PROTO);
            for m in [KeyOf::Src.mask(), KeyOf::Flow.mask(), KeyOf::Src.still_mask(fields)].into_iter().flatten() {
                let p = KeyPattern::of(m, &a);
                let lead = recs.iter().take_while(|r| p.matches(r)).count();
                proptest::prop_assert_eq!(p.leading(&recs), lead);
                proptest::prop_assert_eq!(p.all_match(&recs), lead == recs.len());
            }
        }

        /// The still mask covers what portknock's transition reads: records
        /// equal under it take any stage to the same stage with the same
        /// verdict (the `SCR_PURE` promise checked against the NF itself).
        #[test]
        fn still_mask_covers_what_portknock_reads(
            a in proptest::prelude::any::<[u64; 4]>(),
            b in proptest::prelude::any::<[u64; 4]>(),
            port in proptest::sample::select(vec![1111u16, 2222, 3333, 22, 80]),
            stage in 0u32..5,
        ) {
            use flowplane_nf::portknock::{KnockState, PortKnock};
            use flowplane_nf::stateful::StatefulNf;
            let mut nf = PortKnock::new(&[1111, 2222, 3333], 22).unwrap();
            let m = KeyOf::Src.still_mask(nf.scr_fields().unwrap()).unwrap();
            // `b` equal to `a` under the mask, free elsewhere; a knock port and TCP often.
            let mut a = ScrRecord::from_words(a);
            (a.dport, a.proto) = (port, if a.proto.is_multiple_of(2) { 6 } else { a.proto });
            let w = a.to_words();
            let b = ScrRecord::from_words(std::array::from_fn(|i| (w[i] & m[i]) | (b[i] & !m[i])));
            proptest::prop_assert!(!a.valid() || KeyPattern::of(m, &a).matches(&b));
            let (mut sa, mut sb) = (KnockState { stage }, KnockState { stage });
            let (ca, cb) = (NfContext { now_tsc: 0, now_ns: a.ts_ns() }, NfContext { now_tsc: 0, now_ns: b.ts_ns() });
            let (pa, pb) = (nf.scr_transition(&mut sa, &a, &ca), nf.scr_transition(&mut sb, &b, &cb));
            proptest::prop_assert_eq!((pa, sa.stage), (pb, sb.stage));
        }

        /// Random loss (single packets and bursts, some longer than the log,
        /// some reaching the end of the trace) between the sequencer and 2-3
        /// cores: a replica that reports nothing unrecovered equals the
        /// reference; the others say so.
        #[test]
        fn loss_patterns_recover_exactly_or_are_reported(
            k in 2usize..=3,
            log_pow in 3u32..=6,
            singles in proptest::collection::vec(0u64..600, 0..20),
            bursts in proptest::collection::vec((0u64..600, 1u64..80), 0..3),
        ) {
            let end = 600u64;
            let mut lost = vec![false; end as usize];
            for s in singles { lost[s as usize] = true; }
            for (at, len) in bursts {
                for s in at..(at + len).min(end) { lost[s as usize] = true; }
            }
            if let Err(e) = check_loss_pattern(k, 1 << log_pow, &lost) {
                proptest::prop_assert!(false, "{}", e);
            }
        }
    }
}
