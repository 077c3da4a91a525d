//! The per-core single-writer logs and the loss recovery of Algorithm 1
//! (SCR Appendix B: NOT_INIT / LOST markers, finite circular logs, a
//! missing entry recovered from the other cores' logs).

use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};

use flowplane_io::cpu::IdleBackoff;
use flowplane_nf::stateful::ScrRecord;

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
    pub(super) max: AtomicU64,
    /// Highest sequence number the owner is writing (>= `max`).
    writing: AtomicU64,
    /// Every sequence up to this one the core has received or read from
    /// another log: it reads no log below it again (the drift bound).
    pub(super) resolved: AtomicU64,
    /// The core has finished (its log will not change).
    pub(super) done: AtomicBool,
    /// The core has stopped receiving: the last sequence number it knows
    /// the sequencer emitted (the stream's end, or its own highest), plus
    /// one (0: still receiving). Every core catches up to the highest claim.
    pub(super) claim: AtomicU64,
    /// The core's replica is gone without finishing (its worker ended
    /// early): it will log nothing more, so nobody waits for it.
    pub(super) gone: AtomicBool,
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
            gone: AtomicBool::new(false),
            tags: (0..n).map(|_| AtomicU64::new(0)).collect(),
            recs: (0..n).map(|_| LogRec(std::array::from_fn(|_| AtomicU64::new(0)))).collect(),
        }
    }

    /// The core still logs or resolves sequences: it has not finished and
    /// its replica is not gone (a core catching up at the end of the run
    /// still advances its resolved mark).
    pub(super) fn active(&self) -> bool {
        !self.done.load(Ordering::Acquire) && !self.gone.load(Ordering::Acquire)
    }

    /// Entries.
    pub fn entries(&self) -> usize {
        self.tags.len()
    }

    /// The owner is about to write records up to `hi` (seqlock open).
    #[inline(always)]
    pub(super) fn begin(&self, hi: u64) {
        self.writing.store(hi, Ordering::Relaxed);
        fence(Ordering::Release);
    }

    /// Writes `history[k]` — by the owning core only, between [`ScrLog::begin`] and [`ScrLog::publish`].
    #[inline(always)]
    pub(super) fn put(&self, k: u64, r: &ScrRecord) {
        let i = (k as usize) & (self.tags.len() - 1);
        for (a, v) in self.recs[i].0.iter().zip(r.to_words()) {
            a.store(v, Ordering::Relaxed);
        }
        self.tags[i].store(k, Ordering::Relaxed);
    }

    /// Everything up to `k` is logged or marked LOST (seqlock close).
    #[inline(always)]
    pub(super) fn publish(&self, k: u64) {
        self.max.store(k, Ordering::Release);
    }

    /// Tests: writes `history[k]` and publishes it.
    #[cfg(test)]
    pub(super) fn write(&self, k: u64, r: &ScrRecord) {
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
    pub(super) logs: Box<[ScrLog]>,
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
    /// Not recoverable: overwritten in the logs that might hold it, or the
    /// only core that might hold it is gone (its worker ended early).
    Unrecoverable,
}

/// `handle_loss_recovery(k, c)` of Algorithm 1: read the other cores' logs
/// until one holds `history[k]` or all say LOST. A core that has not got to
/// `k` is waited for (it will log `k` or LOST: it marks a whole gap before
/// resolving any of it, and a finished core has logged up to the end), for
/// as long as it lives: a descheduled core comes back, and no time limit
/// can tell it from a slow one (a wait that gave up made the replicas
/// diverge under load). The wait spins, then naps, so a core that shares
/// this CPU gets to run. A wrapped entry, or a core gone without
/// finishing (its worker ended early), makes `k` unrecoverable.
pub fn recover(logs: &ScrLogs, me: usize, k: u64) -> Recovered {
    let n = logs.logs.len();
    let mut backoff = IdleBackoff::default();
    loop {
        let (mut lost, mut gone, mut waiting) = (0usize, 0usize, 0usize);
        for c in (0..n).filter(|&c| c != me) {
            match logs.logs[c].read(k) {
                LogRead::Rec(r) => return Recovered::Rec(r),
                LogRead::Lost => lost += 1,
                LogRead::Gone => gone += 1,
                LogRead::NotInit => {
                    let l = &logs.logs[c];
                    // `gone` first, then the log read again: what the core wrote before it went is seen.
                    let went = l.gone.load(Ordering::Acquire);
                    match if went { l.read(k) } else { LogRead::NotInit } {
                        LogRead::Rec(r) => return Recovered::Rec(r),
                        LogRead::Lost => lost += 1,
                        LogRead::Gone => gone += 1,
                        LogRead::NotInit => {
                            let stopped = l.done.load(Ordering::Acquire) || l.claim.load(Ordering::Acquire) != 0;
                            if stopped && l.max.load(Ordering::Acquire) < k {
                                // Stopped receiving before k: it never had it (its
                                // end-of-run catch-up will mark k LOST; it may be
                                // waiting for this core's claim, so do not wait for it).
                                lost += 1;
                            } else if went {
                                gone += 1;
                            } else {
                                waiting += 1;
                            }
                        }
                    }
                }
            }
        }
        if waiting == 0 {
            return if gone == 0 && lost == n - 1 { Recovered::LostEverywhere } else { Recovered::Unrecoverable };
        }
        backoff.idle();
    }
}
