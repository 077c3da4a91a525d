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

/// Hash of a coarse key under the run's secret `seed` (every core sharing the table uses the same one). The
/// secret is XOR-ed into both words before the table's multiply mix, which is not linear over XOR: which keys
/// collide changes with the seed.
#[inline(always)]
pub fn coarse_hash(k: u128, seed: u32) -> u64 {
    let s = u128::from(seed).wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835);
    hash_key(&(k ^ s))
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
/// Marks (in the clock word) a core that is done: its source is exhausted.
const DONE: u64 = 1 << 62;
/// Clocks are kept below [`DONE`] (2^62 ns: past the year 2116).
const MAX_CLOCK: u64 = DONE - 1;

/// The packet clocks of the cores sharing the coarse tables: the one clock
/// that shared state's idleness is judged on.
///
/// Why: each core's packet clock is its own (in a replay a fast core may be
/// seconds of trace time ahead of a slow one), and shared state is one
/// state for every core. Judged at the accessing core's clock, an entry
/// whose packets also reach a slower core (a source's flows on two cores, a
/// sprayed flow under `shared`) looked idle to the core ahead while the one
/// behind was still inside it, and was started over (hh counts halved,
/// portknock's knock state lost): a result that depended on the cores'
/// relative speed.
///
/// The rule, for the sweep and for every access to shared state: a core's
/// clock is the latest packet time of its last finished batch, and all its
/// packets still to come are at or after it. The *watermark* is the
/// earliest clock of the cores that may still send packets to the state.
/// An entry last touched at `s` is idle for a packet at `t` only when
/// `min(t, clocks of the other cores) - s > timeout`: when every core that
/// could still touch it is past `s + timeout`, so no packet of any core
/// fell in the gap. A core behind therefore never sees a live entry as
/// idle, and a core ahead never starts over state another core is still
/// in; the cost is that a state that did idle out is started over only
/// once every core has passed the gap (a core further behind than the gap
/// exceeds the timeout lets the packet after the gap continue the old
/// state). The sweep frees entries idle at the watermark (its own clock
/// included), so it only collects what a packet would find idle anyway.
///
/// Who holds the watermark: every registered core that has processed a
/// batch and is not done; in a replay also a core that has not started
/// (its first packets may be the trace's first), never one whose source is
/// exhausted ([`ClockSlot::done`]); on live ports neither a core that has
/// not started nor one that has processed no batch for a second of wall
/// time (idle, its next packets come later anyway; in a replay a silent
/// core holds it until it is done, see [`SharedStores::for_replay`]).
pub struct CoreClocks {
    /// Per registered context: (latest batch time ns, with [`DONE`] once done; TSC when set).
    slots: Box<[(AtomicU64, AtomicU64)]>,
    /// Slots ever handed out (scan bound).
    used: AtomicUsize,
    /// TSC ticks after which a silent core no longer holds the watermark.
    stale: u64,
    /// A replay: a core that has not started holds the watermark at zero.
    replay: bool,
}

impl Default for CoreClocks {
    fn default() -> Self {
        CoreClocks {
            slots: (0..CLOCK_SLOTS).map(|_| (AtomicU64::new(FREE), AtomicU64::new(0))).collect(),
            used: AtomicUsize::new(0),
            stale: flowplane_packet::tsc::hz() as u64,
            replay: false,
        }
    }
}

/// What one core knows of the others' clocks at the start of a batch (read
/// once per batch, [`CoreClocks::view`]): what shared state's idleness is
/// judged on during the batch ([`touch_shared`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedClock {
    /// The earliest clock of the other cores that hold the watermark
    /// (`u64::MAX`: none). Clocks only move on, so a value read at the
    /// batch's start is a safe bound for the whole batch.
    pub behind: u64,
    /// The latest clock of every core, this one's batch included (a stamp
    /// further ahead than a timeout means the clock went back).
    pub latest: u64,
}

impl Default for SharedClock {
    /// No other core: the accessing core's packet time alone.
    fn default() -> Self {
        SharedClock { behind: u64::MAX, latest: 0 }
    }
}

/// The idle rule of shared state on one clock (see [`CoreClocks`]): a
/// stamp `stamp` (the latest packet time that touched the state) is idle
/// for a packet at `now_ns` when `min(now_ns, clock.behind) - stamp` exceeds
/// `timeout_ns` (strictly, [`flowplane_nf::stateful::is_idle`]). The stamp
/// then records the touch: the later of the two, so a core behind never
/// moves it back. When no other core holds the watermark (one core, or the
/// others done), a stamp more than the timeout ahead of every core's clock
/// means the clock went backwards (a trace out of time order) and is
/// rebased to `now_ns`, so nothing stays live forever; while other cores
/// run, such a stamp is kept (their batches in flight may have written it)
/// and the state stays live until the clocks pass it. Returns whether the
/// state was idle (the caller starts it over).
#[inline(always)]
pub fn touch_shared(stamp: &mut u64, now_ns: u64, clock: &SharedClock, timeout_ns: u64) -> bool {
    let idle = flowplane_nf::stateful::is_idle(*stamp, now_ns.min(clock.behind), timeout_ns);
    // Clocks are published at the end of each batch, so while another core holds the
    // watermark its batch in flight may have touched the state past every published
    // clock: only with no other core running is a stamp that far ahead a clock gone back.
    let back = clock.behind == u64::MAX && *stamp > now_ns.max(clock.latest).saturating_add(timeout_ns);
    *stamp = if idle || back { now_ns } else { (*stamp).max(now_ns) };
    idle
}

impl CoreClocks {
    /// A slot for one core's clock, freed when dropped (None: all taken;
    /// that core then does not hold the sweep back).
    pub fn register(self: &Arc<Self>) -> Option<ClockSlot> {
        let i = self
            .slots
            .iter()
            .position(|(c, _)| c.compare_exchange(FREE, NOT_STARTED, Ordering::AcqRel, Ordering::Relaxed).is_ok())?;
        self.slots[i].1.store(0, Ordering::Relaxed);
        self.used.fetch_max(i + 1, Ordering::AcqRel);
        Some(ClockSlot { clocks: Arc::clone(self), i })
    }

    /// Slot `i`'s clock if it holds the watermark (see [`CoreClocks`]), and
    /// its clock if it has one (for [`CoreClocks::latest`]).
    #[inline]
    fn read(&self, i: usize, tsc: u64) -> (Option<u64>, Option<u64>) {
        let (c, t) = &self.slots[i];
        let c = c.load(Ordering::Acquire);
        if c == FREE {
            return (None, None);
        }
        if c == NOT_STARTED {
            return (self.replay.then_some(0), None);
        }
        if c & DONE != 0 {
            // (Zero: done before its first batch, no clock.)
            let t = c & MAX_CLOCK;
            return (None, (t != 0).then_some(t));
        }
        // A replay's cores hold it however long they are silent: no TSC read.
        let fresh = self.stale == u64::MAX || tsc.saturating_sub(t.load(Ordering::Relaxed)) < self.stale;
        (fresh.then_some(c), Some(c))
    }

    /// The earliest clock of the cores holding the watermark, at most
    /// `now_ns`; `tsc` is the caller's TSC reading (to tell silent cores).
    pub fn watermark(&self, now_ns: u64, tsc: u64) -> u64 {
        let used = self.used.load(Ordering::Acquire).min(self.slots.len());
        (0..used).filter_map(|i| self.read(i, tsc).0).fold(now_ns, u64::min)
    }

    /// The other cores' clocks as `own` (this core, at a batch whose latest
    /// packet is at `now_ns`) judges shared state by during the batch: one
    /// load per other core.
    pub fn view(&self, own: &ClockSlot, now_ns: u64, tsc: u64) -> SharedClock {
        let used = self.used.load(Ordering::Acquire).min(self.slots.len());
        let mut v = SharedClock { behind: u64::MAX, latest: now_ns };
        for i in (0..used).filter(|&i| i != own.i) {
            let (holds, clock) = self.read(i, tsc);
            v.behind = v.behind.min(holds.unwrap_or(u64::MAX));
            v.latest = v.latest.max(clock.unwrap_or(0));
        }
        v
    }

    /// These clocks as a replay's (see [`SharedStores::for_replay`]).
    #[cfg(test)]
    fn for_replay_clocks(mut self: Arc<Self>) -> Arc<Self> {
        if let Some(c) = Arc::get_mut(&mut self) {
            c.stale = u64::MAX;
            c.replay = true;
        }
        self
    }

    /// A replay's clocks (cores hold the watermark however long they are silent).
    pub fn is_replay(&self) -> bool {
        self.replay
    }

    /// The latest packet time any core of the run has reached (None: no
    /// core has processed a packet): the time exports and end-of-run
    /// reports judge idleness at (a done core keeps its last time).
    pub fn latest(&self) -> Option<u64> {
        let used = self.used.load(Ordering::Acquire).min(self.slots.len());
        (0..used).filter_map(|i| self.read(i, 0).1).max()
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
        c.store(now_ns.min(MAX_CLOCK), Ordering::Release);
    }

    /// The core's source is exhausted: it sends no more packets to shared
    /// state, so it no longer holds the watermark (its clock still counts
    /// for [`CoreClocks::latest`]).
    pub fn done(&self) {
        let c = &self.clocks.slots[self.i].0;
        // A core done before its first batch: no clock (zero, below every packet time).
        let now = match c.load(Ordering::Relaxed) {
            NOT_STARTED => 0,
            t => t & MAX_CLOCK,
        };
        c.store(now | DONE, Ordering::Release);
    }

    /// The clocks this slot is one of.
    pub fn clocks(&self) -> &CoreClocks {
        &self.clocks
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

    /// For a replay: a silent core holds the watermark until it is done,
    /// however long it is off the CPU, and a core that has not started holds
    /// it from the trace's start. Replayed clocks are the trace's, not the
    /// wall's: a worker descheduled for a second on a busy host is not idle,
    /// and letting the others sweep past its clock took state it still saw
    /// live (portknock's verdicts changed under load). A done core no longer
    /// holds it (it has no packets left). Live ports keep the one-second
    /// rule (their clocks follow the wall).
    pub fn for_replay(mut self) -> Self {
        if let Some(c) = Arc::get_mut(&mut self.clocks) {
            c.stale = u64::MAX;
            c.replay = true;
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

    const S: u64 = 1_000_000_000;

    /// Issue 29's drift: a sprayed flow with packets every 40 ms on two cores, core A three
    /// seconds of trace time ahead of core B, timeout 2 s. Judged at A's clock alone, B's
    /// touch made the stamp look idle to A (a reset); on the one clock it never is.
    #[test]
    fn a_core_ahead_never_resets_state_a_core_behind_is_in() {
        let clocks = Arc::new(CoreClocks::default()).for_replay_clocks();
        let (a, b) = (clocks.register().unwrap(), clocks.register().unwrap());
        let mut stamp = 0u64;
        let mut resets = 0;
        // B at 0.04 s .. 1 s, A at 3.04 s .. 4 s, interleaved access by access.
        for k in 1..=25u64 {
            let (tb, ta) = (k * 40_000_000, 3 * S + k * 40_000_000);
            b.set(tb - 40_000_000, 0);
            a.set(ta - 40_000_000, 0);
            let vb = clocks.view(&b, tb, 0);
            resets += u32::from(touch_shared(&mut stamp, tb, &vb, 2 * S));
            let va = clocks.view(&a, ta, 0);
            assert_eq!(va.behind, tb - 40_000_000, "A judges at B's clock");
            resets += u32::from(touch_shared(&mut stamp, ta, &va, 2 * S));
        }
        assert_eq!(resets, 0);
        // The accessing core's clock alone (no other core): the same touches reset.
        let mut alone = 0u64;
        let r = touch_shared(&mut alone, S, &SharedClock::default(), 2 * S)
            | touch_shared(&mut alone, 4 * S, &SharedClock::default(), 2 * S);
        assert!(r, "idle past the timeout with no other core");
    }

    #[test]
    fn idle_only_once_every_core_passed_the_gap() {
        let clocks = Arc::new(CoreClocks::default()).for_replay_clocks();
        let (a, b) = (clocks.register().unwrap(), clocks.register().unwrap());
        // Not started: in a replay B holds the watermark at the trace's start.
        assert_eq!(clocks.view(&a, 10 * S, 0).behind, 0);
        assert_eq!(clocks.watermark(10 * S, 0), 0);
        b.set(S, 0);
        let mut stamp = S / 2;
        // A at 5 s, B at 1 s: 1 s - 0.5 s is within 2 s, live (and the stamp moves on).
        assert!(!touch_shared(&mut stamp, 5 * S, &clocks.view(&a, 5 * S, 0), 2 * S));
        assert_eq!(stamp, 5 * S, "the later touch");
        a.set(5 * S, 0);
        // B behind touching never moves the stamp back, however far ahead A's batch in flight
        // (unpublished) wrote it.
        assert!(!touch_shared(&mut stamp, S, &clocks.view(&b, S, 0), 2 * S));
        assert_eq!(stamp, 5 * S);
        let mut in_flight = 30 * S;
        assert!(!touch_shared(&mut in_flight, S, &clocks.view(&b, S, 0), 2 * S));
        assert_eq!(in_flight, 30 * S);
        // B past 7 s: A at 8 s finds the state idle (7 - 5 > 2).
        b.set(7 * S + 1, 0);
        assert!(touch_shared(&mut stamp, 8 * S, &clocks.view(&a, 8 * S, 0), 2 * S));
        // B done: it holds nothing, its clock still counts as the run's latest.
        b.done();
        a.set(8 * S, 0);
        assert_eq!(clocks.view(&a, 9 * S, 0).behind, u64::MAX);
        assert_eq!(clocks.watermark(9 * S, 0), 8 * S, "A's own clock");
        assert_eq!(clocks.latest(), Some(8 * S));
        // A stamp more than the timeout past every core's clock, no other core running: the
        // clock went back, rebased.
        let mut future = 100 * S;
        assert!(!touch_shared(&mut future, 9 * S, &clocks.view(&a, 9 * S, 0), 2 * S));
        assert_eq!(future, 9 * S);
    }

    #[test]
    fn live_clocks_skip_cores_not_started() {
        let clocks = Arc::new(CoreClocks::default());
        let (a, _b) = (clocks.register().unwrap(), clocks.register().unwrap());
        let tsc = flowplane_packet::tsc::rdtsc();
        a.set(3 * S, tsc);
        assert_eq!(clocks.view(&a, 3 * S, tsc).behind, u64::MAX, "a live core not started holds nothing");
        assert_eq!(clocks.watermark(5 * S, tsc), 3 * S);
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
