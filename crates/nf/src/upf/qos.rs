//! QER rates enforced per session, whatever core a packet reaches (TS
//! 29.244 §5.4.2, QER IEs §7.5.2.5): the MBR of a QER (a flow's, or the
//! session AMBR: a QER every PDR of the session names) and GBR accounting.
//!
//! A rate is a token bucket on the packet clock: tokens in 1/8,000,000 byte
//! (so kbit/s x ns adds exactly), capacity (the burst) 100 ms of the rate and
//! at least 3,000 bytes, full at the first packet; a packet conforms if its
//! IP bytes fit, and only a conforming packet takes tokens.
//!
//! One core: each QER direction is a [`Bucket`] of that core (no shared
//! line is touched). Several cores sharing a rule set (one PFCP endpoint, or
//! one session file in one process): each QER direction with a rate has one
//! shared bucket ([`Shared`], in a [`Meter`] slot of the [`Meters`] pool
//! every core holds) and each core spends credit it leases from it: a core
//! whose credit does not cover a packet refills the shared bucket to the
//! packet's time and takes at least what the packet lacks, up to a lease
//! (1/16 of the capacity), or nothing if the bucket holds less than the
//! packet lacks (the packet does not conform). Two atomic updates per lease,
//! none per packet in between. Refills are exact across cores: each core
//! claims the interval between the latest time any core refilled at and its
//! own (`fetch_max`), so every nanosecond adds its tokens once. So a
//! session's bytes over any interval exceed one bucket's by at most the
//! credit the cores hold unspent: cores x capacity/16 (6.25 ms of the rate
//! per core); a core's credit is not returned.
//!
//! Slots are kept by (SEID, QER ID) across rule-set versions (a modified QER
//! keeps its bucket); slots of QERs gone from the newest version are reused
//! (reset full). The pool holds up to [`MAX_SLOTS`] rated QERs; past that a
//! QER is metered per core (counted in `qos_unshared`).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use super::rules::{RuleSet, NONE};

/// Token units per byte.
pub const UNITS_PER_BYTE: u64 = 8_000_000;
/// Slots per chunk of the pool (chunks are allocated as needed and never move).
const CHUNK: usize = 4096;
/// Rated QERs the pool can share.
pub const MAX_SLOTS: usize = CHUNK * 1024;

/// A bucket's capacity (burst) for `kbps`, in units: 100 ms of the rate, at least 3,000 bytes.
#[inline]
pub fn capacity(kbps: u64) -> u64 {
    // kbit/s adds kbps units per ns: 100 ms is 10^8 ns (at most 10^17 units at MAX_MBR_KBPS).
    (kbps * 100_000_000).max(3_000 * UNITS_PER_BYTE)
}

/// A lease: 1/16 of the capacity (6.25 ms of the rate).
#[inline]
fn lease(kbps: u64) -> u64 {
    capacity(kbps) / 16
}

/// A core's own token bucket (one core), or its leased credit (several).
#[derive(Clone, Copy, Debug, Default)]
pub struct Bucket {
    tokens: u64,
    last_ns: u64,
    started: bool,
}

impl Bucket {
    /// Refills to `now` at `kbps` (full at the first packet); true if `bytes` fit.
    /// Charges nothing ([`Bucket::charge`] does).
    #[inline]
    pub fn conforms(&mut self, kbps: u64, bytes: u64, now: u64) -> bool {
        let cap = capacity(kbps);
        if !self.started {
            *self = Bucket { tokens: cap, last_ns: now, started: true };
        }
        let dt = now.saturating_sub(self.last_ns).min(1_000_000_000);
        self.last_ns = self.last_ns.max(now);
        self.tokens = (self.tokens + dt * kbps).min(cap);
        self.tokens >= bytes * UNITS_PER_BYTE
    }

    /// Several cores: true if this core's credit covers `bytes`, leasing
    /// from the shared bucket `s` when it does not.
    #[inline]
    pub fn conforms_shared(&mut self, s: &Shared, kbps: u64, bytes: u64, now: u64) -> bool {
        let need = bytes * UNITS_PER_BYTE;
        if self.tokens >= need {
            return true;
        }
        match s.lease(kbps, need - self.tokens, lease(kbps), now) {
            Some(got) => {
                self.tokens += got;
                true
            }
            None => false,
        }
    }

    /// Takes `bytes` from a bucket (or credit) found conforming.
    #[inline]
    pub fn charge(&mut self, bytes: u64) {
        self.tokens = self.tokens.saturating_sub(bytes * UNITS_PER_BYTE);
    }
}

/// One direction's bucket shared by the cores.
#[derive(Debug, Default)]
pub struct Shared {
    tokens: AtomicU64,
    last_ns: AtomicU64,
}

impl Shared {
    fn reset(&self, kbps: u64) {
        self.tokens.store(capacity(kbps), Ordering::Relaxed);
        self.last_ns.store(0, Ordering::Relaxed);
    }

    /// Refills to `now`, then takes `want` units (at least `need`), or all
    /// it holds if that is at least `need`; `None` (nothing taken) if it
    /// holds less than `need`.
    pub fn lease(&self, kbps: u64, need: u64, want: u64, now: u64) -> Option<u64> {
        let cap = capacity(kbps);
        // Each core adds the interval since the latest refill time any core claimed.
        let prev = self.last_ns.fetch_max(now, Ordering::AcqRel);
        if now > prev {
            let add = (now - prev).min(1_000_000_000) * kbps;
            let _ =
                self.tokens.fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| Some(t.saturating_add(add).min(cap)));
        }
        let want = want.max(need);
        let mut got = 0;
        self.tokens
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                // A lowered rate: the capacity applies at once.
                let t = t.min(cap);
                if t < need {
                    return None;
                }
                got = t.min(want);
                Some(t - got)
            })
            .ok()?;
        Some(got)
    }

    /// Tokens now, in bytes (tests, reports).
    pub fn bytes(&self) -> u64 {
        self.tokens.load(Ordering::Relaxed) / UNITS_PER_BYTE
    }
}

/// A QER's shared buckets: MBR and GBR, uplink and downlink (one cache line).
#[derive(Debug, Default)]
#[repr(C, align(64))]
pub struct Meter {
    /// MBR buckets (uplink, downlink).
    pub mbr: [Shared; 2],
    /// GBR buckets (uplink, downlink): bytes within them count as guaranteed.
    pub gbr: [Shared; 2],
}

#[derive(Debug, Default)]
struct Slots {
    at: HashMap<(u64, u32), u32>,
    free: Vec<u32>,
    next: u32,
    version: u64,
}

/// The shared buckets of the cores running one rule set.
#[derive(Debug)]
pub struct Meters {
    chunks: Box<[OnceLock<Box<[Meter]>>]>,
    slots: Mutex<Slots>,
    cores: AtomicUsize,
    /// Rated QERs metered per core because the pool was full.
    pub unshared: AtomicU64,
}

impl Default for Meters {
    fn default() -> Self {
        Meters {
            chunks: (0..MAX_SLOTS / CHUNK).map(|_| OnceLock::new()).collect(),
            slots: Mutex::new(Slots::default()),
            cores: AtomicUsize::new(0),
            unshared: AtomicU64::new(0),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Meters {
    /// An empty pool.
    pub fn new() -> Arc<Meters> {
        Arc::new(Meters::default())
    }

    /// The pool of every core whose rules come from `key` (a session file's
    /// path) in this process: held weakly, so it ends with the last core.
    pub fn shared(key: &str) -> Arc<Meters> {
        static REGISTRY: OnceLock<Mutex<HashMap<String, Weak<Meters>>>> = OnceLock::new();
        let mut m = lock(REGISTRY.get_or_init(|| Mutex::new(HashMap::new())));
        if let Some(p) = m.get(key).and_then(Weak::upgrade) {
            return p;
        }
        let p = Meters::new();
        m.retain(|_, w| w.strong_count() > 0);
        m.insert(key.to_string(), Arc::downgrade(&p));
        p
    }

    /// One more core meters with this pool.
    pub fn attach(&self) {
        self.cores.fetch_add(1, Ordering::Relaxed);
    }

    /// Cores attached.
    pub fn cores(&self) -> usize {
        self.cores.load(Ordering::Relaxed)
    }

    /// The meter in `slot` ([`NONE`]: none).
    #[inline]
    pub fn get(&self, slot: u32) -> Option<&Meter> {
        let s = slot as usize;
        self.chunks.get(s / CHUNK)?.get()?.get(s % CHUNK)
    }

    /// The slot of each of `rules`' rated QERs (by [`super::rules::Qer::rated`];
    /// [`NONE`]: the pool is full), by (SEID, QER ID): kept across versions;
    /// a newer `version` frees the slots of QERs it no longer has.
    pub fn slots(&self, rules: &RuleSet, version: u64) -> Vec<u32> {
        let mut m = lock(&self.slots);
        let rated: Vec<((u64, u32), &super::rules::Qer)> =
            rules.keys(&rules.qers, |q| (q.session, q.id)).zip(&rules.qers).filter(|(_, q)| q.rated != NONE).collect();
        if version > m.version {
            let live: HashSet<(u64, u32)> = rated.iter().map(|r| r.0).collect();
            let gone: Vec<((u64, u32), u32)> =
                m.at.iter().filter(|(k, _)| !live.contains(k)).map(|(k, s)| (*k, *s)).collect();
            for (k, s) in gone {
                m.at.remove(&k);
                m.free.push(s);
            }
            m.version = version;
        }
        rated
            .iter()
            .map(|(k, q)| {
                if let Some(&s) = m.at.get(k) {
                    return s;
                }
                let s = match m.free.pop() {
                    Some(s) => s,
                    None if (m.next as usize) < MAX_SLOTS => {
                        m.next += 1;
                        m.next - 1
                    }
                    None => {
                        self.unshared.fetch_add(1, Ordering::Relaxed);
                        return NONE;
                    }
                };
                let chunk = self.chunks[s as usize / CHUNK]
                    .get_or_init(|| (0..CHUNK).map(|_| Meter::default()).collect::<Vec<_>>().into_boxed_slice());
                let meter = &chunk[s as usize % CHUNK];
                for d in 0..2 {
                    meter.mbr[d].reset(q.mbr_kbps[d]);
                    meter.gbr[d].reset(q.gbr_kbps[d]);
                }
                m.at.insert(*k, s);
                s
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two cores alternating packets on one shared bucket pass what one
    /// bucket passes, within the lease bound.
    #[test]
    fn leases_share_one_rate() {
        let kbps = 8_000; // 1 MB/s
        let s = Shared::default();
        s.reset(kbps);
        let mut one = Bucket::default();
        let mut cores = [Bucket::default(); 2];
        let (mut a, mut b) = (0u64, 0u64);
        // 1,000-byte packets every 250 us for 2 s: 4 MB/s offered.
        for k in 0..8_000u64 {
            let now = 1_000 + k * 250_000;
            if one.conforms(kbps, 1_000, now) {
                one.charge(1_000);
                a += 1_000;
            }
            let c = &mut cores[(k % 2) as usize];
            if c.conforms_shared(&s, kbps, 1_000, now) {
                c.charge(1_000);
                b += 1_000;
            }
        }
        // 100 KB burst + 2 s x 1 MB/s.
        assert!((2_095_000..=2_101_000).contains(&a), "{a}");
        let bound = 2 * capacity(kbps) / 16 / UNITS_PER_BYTE;
        assert!(b.abs_diff(a) <= bound, "{b} vs {a} (bound {bound})");
    }

    #[test]
    fn slots_are_kept_by_seid_and_id_and_reused() {
        use super::super::rules::{QerSpec, SessionSpec};
        let spec = |seid: u64, kbps: Option<u64>| SessionSpec {
            seid,
            qers: vec![QerSpec { id: 1, mbr_ul_kbps: kbps, ..Default::default() }],
            ..Default::default()
        };
        let m = Meters::new();
        let r1 = RuleSet::compile(&[spec(1, Some(100)), spec(2, Some(100)), spec(3, None)]).unwrap();
        let s1 = m.slots(&r1, 1);
        assert_eq!((s1.len(), s1[0] != s1[1]), (2, true), "session 3's QER has no rate: no slot");
        let r2 = RuleSet::compile(&[spec(2, Some(200)), spec(4, Some(100))]).unwrap();
        let s2 = m.slots(&r2, 2);
        assert_eq!(s2[0], s1[1], "session 2's QER keeps its bucket");
        assert_eq!(s2[1], s1[0], "session 1's slot is reused");
        assert!(m.get(s2[1]).is_some() && m.get(NONE).is_none());
    }
}
