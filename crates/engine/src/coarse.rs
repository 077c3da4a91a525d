//! Coarse-granularity state (source IP, destination IP, IP pair): one
//! shared table per granularity, reached by every core, as FAJITA ③.
//!
//! An entry's state is a block of `AtomicU64` words: word 0 is a small
//! lock (bit 0) plus one "initialised" bit per NF of the group (bits 1..);
//! the NFs' plain-data states follow, packed in chain order. A core that
//! processes a packet takes the entry's lock, copies the words into a local
//! buffer, runs the NF's action on it as ordinary `&mut State`, copies back
//! and unlocks — so NFs stay plain safe Rust whatever the executor, and
//! updates from several cores never get lost. The lock is per entry (one
//! source IP), held for a few nanoseconds, never across packets.
//!
//! Without the auxiliary table every batch pins (`acquire_batch`) and later
//! unpins the coarse entries of its packets: one shared lookup per packet
//! per group. With it, the pinned handle lives in the flow's aggregated
//! 5-tuple block from the flow's first packet to its removal (reference
//! counted), so later packets reach the shared state without a lookup.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use flowplane_nf::stateful::Granularity;
use flowplane_nf::PktMeta;
use flowplane_table::shared::{hash_key, SharedFlowTable, SharedHandle, SharedTableConfig};
use flowplane_wire::flow::{FieldSet, FiveTuple, FiveTupleV4};

use crate::error::EngineError;

/// Most state words a coarse group may have (after the lock word).
pub const MAX_GROUP_WORDS: usize = 63;

/// Hash of a coarse key.
#[inline(always)]
pub fn coarse_hash(k: u128) -> u64 {
    hash_key(&k)
}

/// Layout of one coarse group, decided by the chain compiler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupLayout {
    /// The granularity.
    pub granularity: Granularity,
    /// State words (after the lock word).
    pub words: usize,
    /// Offset in the aggregated 5-tuple block where the auxiliary table keeps this group's pinned handle.
    pub aux_offset: usize,
    /// Longest idle timeout the group's NFs ask for (None: the run's default).
    pub idle_timeout_ns: Option<u64>,
}

/// The shared tables of one run (one per coarse group), shared by all cores.
#[derive(Clone, Default)]
pub struct SharedStores {
    /// Tables in group order.
    pub tables: Vec<Arc<SharedFlowTable<u128>>>,
    /// The packet clocks of the cores sharing them (for the sweep).
    pub clocks: Arc<CoreClocks>,
    /// A chain graph's branches' tables, in [`crate::chain::Chain::branches`]
    /// order (each segment has its own groups; empty for a linear chain).
    pub branches: Vec<SharedStores>,
}

/// Most cores (contexts) whose clocks hold the shared sweep back at once.
const CLOCK_SLOTS: usize = 1024;
/// A slot no context holds.
const FREE: u64 = u64::MAX;
/// A slot whose context has processed no batch yet.
const NOT_STARTED: u64 = u64::MAX - 1;

/// The packet clocks of the cores sharing the coarse tables, so that the
/// shared sweep never expires an entry before the slowest core would.
///
/// Why: each core's packet clock is its own (in a replay a fast core may be
/// seconds of trace time ahead of a slow one), and an entry the sweep
/// frees is gone for every core. Swept at one core's clock, a key whose
/// packets go to a slower core (portknock: a source on one core) could lose
/// its state while that core still sees it live — a verdict that depended
/// on the cores' relative speed. So the sweep judges idleness at the
/// *watermark*: the earliest clock of the cores still running (each core's
/// latest batch time; a core that has not started does not hold it back,
/// nor, on live ports, one that has processed no batch for a second of wall
/// time — idle, its next packets come later anyway; in a replay a silent
/// core holds it until it is done, see [`SharedStores::for_replay`]). Every core's
/// next packets are at or after the watermark, so an entry idle there
/// would have been found idle by any of them: the sweep only collects what
/// the per-NF stamps (`chain::IdleSlot`) already treat as gone.
pub struct CoreClocks {
    /// Per registered context: (latest batch time ns, TSC when set).
    slots: Box<[(AtomicU64, AtomicU64)]>,
    /// Slots ever handed out (scan bound).
    used: AtomicUsize,
    /// TSC ticks after which a silent core no longer holds the watermark.
    stale: u64,
}

impl Default for CoreClocks {
    fn default() -> Self {
        CoreClocks {
            slots: (0..CLOCK_SLOTS).map(|_| (AtomicU64::new(FREE), AtomicU64::new(0))).collect(),
            used: AtomicUsize::new(0),
            stale: flowplane_packet::tsc::hz() as u64,
        }
    }
}

impl CoreClocks {
    /// A slot for one core's clock, freed when dropped (None: all taken;
    /// that core then does not hold the sweep back).
    pub fn register(self: &Arc<Self>) -> Option<ClockSlot> {
        let i = self
            .slots
            .iter()
            .position(|(c, _)| c.compare_exchange(FREE, NOT_STARTED, Ordering::AcqRel, Ordering::Relaxed).is_ok())?;
        self.used.fetch_max(i + 1, Ordering::AcqRel);
        Some(ClockSlot { clocks: Arc::clone(self), i })
    }

    /// The earliest clock of the running cores, at most `now_ns`; `tsc`
    /// is the caller's TSC reading (to tell silent cores).
    pub fn watermark(&self, now_ns: u64, tsc: u64) -> u64 {
        let used = self.used.load(Ordering::Acquire).min(self.slots.len());
        self.slots[..used]
            .iter()
            .filter_map(|(c, t)| {
                let c = c.load(Ordering::Acquire);
                let fresh = tsc.saturating_sub(t.load(Ordering::Relaxed)) < self.stale;
                (c < NOT_STARTED && fresh).then_some(c)
            })
            .fold(now_ns, u64::min)
    }

    /// The latest packet time any core of the run has reached (None: no
    /// core has processed a packet): the time exports judge idleness at.
    pub fn latest(&self) -> Option<u64> {
        let used = self.used.load(Ordering::Acquire).min(self.slots.len());
        self.slots[..used].iter().map(|(c, _)| c.load(Ordering::Acquire)).filter(|&c| c < NOT_STARTED).max()
    }
}

/// One core's slot in [`CoreClocks`].
pub struct ClockSlot {
    clocks: Arc<CoreClocks>,
    i: usize,
}

impl ClockSlot {
    /// The core has processed packets up to `now_ns` (at TSC `tsc`).
    #[inline]
    pub fn set(&self, now_ns: u64, tsc: u64) {
        let (c, t) = &self.clocks.slots[self.i];
        t.store(tsc, Ordering::Relaxed);
        c.store(now_ns.min(NOT_STARTED - 1), Ordering::Release);
    }
}

impl Drop for ClockSlot {
    fn drop(&mut self) {
        self.clocks.slots[self.i].0.store(FREE, Ordering::Release);
    }
}

impl SharedStores {
    /// Creates one table per group with room for `capacity` keys each; a
    /// group's entries idle out after the longest timeout its NFs declare,
    /// `default_idle_timeout_ns` when none does.
    pub fn new(groups: &[GroupLayout], capacity: usize, default_idle_timeout_ns: u64) -> Result<Self, EngineError> {
        let mut tables = Vec::with_capacity(groups.len());
        for g in groups {
            let idle_timeout_ns = g.idle_timeout_ns.unwrap_or(default_idle_timeout_ns);
            let t = SharedFlowTable::new(SharedTableConfig { capacity, state_words: 1 + g.words, idle_timeout_ns })?;
            tables.push(Arc::new(t));
        }
        Ok(SharedStores { tables, clocks: Arc::default(), branches: Vec::new() })
    }

    /// [`SharedStores::new`] for every segment of `chain` (a graph's branches too).
    pub fn for_chain(
        chain: &crate::chain::Chain,
        capacity: usize,
        default_idle_timeout_ns: u64,
    ) -> Result<Self, EngineError> {
        let mut s = SharedStores::new(&chain.groups, capacity, default_idle_timeout_ns)?;
        for b in &chain.branches {
            s.branches.push(SharedStores::for_chain(&b.chain, capacity, default_idle_timeout_ns)?);
        }
        Ok(s)
    }

    /// For a replay: a silent core holds the sweep back until it drops its
    /// slot, however long it is off the CPU. Replayed clocks are the
    /// trace's, not the wall's: a worker descheduled for a second on a busy
    /// host is not idle, and letting the others sweep past its clock took
    /// state it still saw live (portknock's verdicts changed under load). A
    /// finished core holds the watermark at its last time: later entries
    /// only expire later, never early. Live ports keep the one-second rule
    /// (their clocks follow the wall).
    pub fn for_replay(mut self) -> Self {
        if let Some(c) = Arc::get_mut(&mut self.clocks) {
            c.stale = u64::MAX;
        }
        self.branches = std::mem::take(&mut self.branches).into_iter().map(SharedStores::for_replay).collect();
        self
    }
}

/// Bit 0 of word 0: the entry lock.
const LOCK: u64 = 1;

/// Runs `f` on a private copy of the entry's state words under the entry
/// lock, with the word-0 flags (init bits) passed along; `f`'s returned
/// flags are stored back. Words beyond `words.len()` are ignored.
#[inline]
pub fn with_locked<R>(words: &[AtomicU64], f: impl FnOnce(&mut u64, &mut [u64]) -> R) -> Option<R> {
    let (head, rest) = words.split_first()?;
    let n = rest.len().min(MAX_GROUP_WORDS);
    // Spin on a test-and-test-and-set lock: uncontended it is one CAS. The
    // holder may be a preempted vCPU, so after a while yield instead of burning
    // the rest of our time slice.
    let mut spins = 0u32;
    loop {
        let cur = head.load(Ordering::Relaxed);
        if cur & LOCK == 0 && head.compare_exchange_weak(cur, cur | LOCK, Ordering::Acquire, Ordering::Relaxed).is_ok()
        {
            break;
        }
        spins += 1;
        if spins.is_multiple_of(128) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
    let mut buf = [0u64; MAX_GROUP_WORDS];
    for (b, w) in buf[..n].iter_mut().zip(rest) {
        *b = w.load(Ordering::Relaxed);
    }
    let mut flags = head.load(Ordering::Relaxed) & !LOCK;
    let r = f(&mut flags, &mut buf[..n]);
    for (b, w) in buf[..n].iter().zip(rest) {
        w.store(*b, Ordering::Relaxed);
    }
    // Release: the state stores above are visible to the next locker.
    head.store(flags & !LOCK, Ordering::Release);
    Some(r)
}

/// A coarse key as the 5-tuple NFs' export rows expect it: the address(es)
/// in place, everything else zero.
/// Marks (top byte) a group key that packs an IPv4 5-tuple.
const V4_TUPLE: u128 = 0x03 << 120;
/// Marks a group key that is an IPv6 5-tuple's fingerprint.
const V6_TUPLE: u128 = 0x06 << 120;

/// A packet's key in a coarse group of granularity `g`: the NF's key, or for
/// the 5-tuple (NFs whose per-flow state is shared, the `shared` strategy)
/// the packed IPv4 tuple — reversible, for exports — or a keyed 120-bit
/// fingerprint of an IPv6 tuple.
#[inline]
pub fn group_key(g: Granularity, m: &PktMeta) -> Option<u128> {
    match (g, &m.tuple) {
        (Granularity::FiveTuple, FiveTuple::V4(t)) => Some(
            V4_TUPLE
                | u128::from(u32::from(t.src())) << 80
                | u128::from(u32::from(t.dst())) << 48
                | u128::from(t.src_port()) << 32
                | u128::from(t.dst_port()) << 16
                | u128::from(t.proto()) << 8
                | u128::from(t.flags()),
        ),
        (Granularity::FiveTuple, FiveTuple::V6(_)) => {
            let custom = Granularity::Custom(FieldSet::FIVE_TUPLE).key(m)?;
            Some(V6_TUPLE | (custom & ((1u128 << 120) - 1)))
        }
        _ => g.key(m),
    }
}

/// The flow key a coarse entry stands for, for exports (None: a TEID, a
/// field-set or IPv6 5-tuple fingerprint, which have no key to show).
pub fn key_tuple(g: Granularity, k: u128) -> Option<FiveTuple> {
    use std::net::{Ipv4Addr, Ipv6Addr};
    let ip = |v: u128| {
        let a = Ipv6Addr::from(v);
        a.to_ipv4_mapped().map_or(IpAddr::V6(a), IpAddr::V4)
    };
    let zero =
        |a: IpAddr| if a.is_ipv4() { IpAddr::V4(Ipv4Addr::UNSPECIFIED) } else { IpAddr::V6(Ipv6Addr::UNSPECIFIED) };
    let (s, d) = match g {
        Granularity::FiveTuple if k >> 120 == V4_TUPLE >> 120 => {
            let (s, d) = (Ipv4Addr::from((k >> 80) as u32), Ipv4Addr::from((k >> 48) as u32));
            let t = FiveTupleV4::new(s, d, (k >> 32) as u16, (k >> 16) as u16, (k >> 8) as u8).with_flags(k as u8);
            return Some(FiveTuple::V4(t));
        }
        // A TEID or a fingerprint has no address to show.
        Granularity::FiveTuple | Granularity::Teid | Granularity::Custom(_) => return None,
        Granularity::SrcIp => (ip(k), zero(ip(k))),
        Granularity::DstIp => (zero(ip(k)), ip(k)),
        Granularity::IpPair => (IpAddr::V4(Ipv4Addr::from((k >> 32) as u32)), IpAddr::V4(Ipv4Addr::from(k as u32))),
    };
    FiveTuple::new(s, d, 0, 0, 0)
}

/// Bits of a handle for storage in a flow's aggregated block.
#[inline(always)]
pub fn handle_bits(h: SharedHandle) -> u64 {
    h.to_bits()
}

/// An auxiliary slot whose pin the shared table refused when the flow
/// started (read as `NONE` everywhere): the packet that started the flow was
/// counted there, so its own pin step does not ask again; later packets do
/// (`ExecContext`'s retry), each refusal counted once.
pub fn aux_refused_bits() -> u64 {
    handle_bits(SharedHandle::NONE) & !(1u64 << 32)
}

/// The handle stored in a flow block's 8-byte auxiliary slot (`NONE` if the slot is short).
#[inline(always)]
pub fn aux_handle(slot: &[u8]) -> SharedHandle {
    SharedHandle::from_bits(u64::from_ne_bytes(slot.try_into().unwrap_or([0xff; 8])))
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowplane_nf::PktMeta;
    use std::net::Ipv4Addr;

    #[test]
    fn keys() {
        let t = FiveTuple::new(IpAddr::V4(Ipv4Addr::new(1, 2, 3, 4)), IpAddr::V4(Ipv4Addr::new(5, 6, 7, 8)), 1, 2, 17)
            .unwrap();
        let m = PktMeta { valid: true, tuple: t, ..PktMeta::default() };
        let r = PktMeta { tuple: t.reversed(), ..m };
        assert_eq!(Granularity::SrcIp.key(&m), Granularity::DstIp.key(&r));
        assert_ne!(Granularity::SrcIp.key(&m), Granularity::DstIp.key(&m));
        assert!(Granularity::IpPair.key(&m).is_some());
        assert_eq!(Granularity::FiveTuple.key(&m), None);
        assert_eq!(Granularity::Teid.key(&m), None, "not GTP-U");
        let g = PktMeta { teid: 7, has_teid: true, ..m };
        assert_eq!(Granularity::Teid.key(&g), Granularity::Teid.key(&PktMeta { tuple: t.reversed(), ..g }));
        let c = Granularity::parse("src_ip,dport").unwrap();
        let other_sport = FiveTuple::new(t.src_ip(), t.dst_ip(), 9, 2, 17).unwrap();
        assert_eq!(c.key(&m), c.key(&PktMeta { tuple: other_sport, ..m }), "sport is not in the key");
        assert_ne!(c.key(&m), c.key(&r));
        let src = key_tuple(Granularity::SrcIp, Granularity::SrcIp.key(&m).unwrap()).map(|k| k.src_ip());
        assert_eq!(src, Some(t.src_ip()));
        assert_eq!(key_tuple(Granularity::Teid, 7), None);
    }

    #[test]
    fn locked_updates_from_threads_are_not_lost() {
        let words: Arc<Vec<AtomicU64>> = Arc::new((0..4).map(|_| AtomicU64::new(0)).collect());
        let hs: Vec<_> = (0..2)
            .map(|_| {
                let w = Arc::clone(&words);
                std::thread::spawn(move || {
                    for _ in 0..100_000 {
                        with_locked(&w, |flags, s| {
                            *flags |= 2;
                            s[0] += 1;
                            s[2] += 3;
                        });
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(words[1].load(Ordering::Relaxed), 200_000);
        assert_eq!(words[3].load(Ordering::Relaxed), 600_000);
        assert_eq!(words[0].load(Ordering::Relaxed), 2, "lock released, flags kept");
        assert!(with_locked(&[], |_, _| ()).is_none());
    }
}
