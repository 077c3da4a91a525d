//! Run-time steering: what the emulated NIC (or a real one) consults when a
//! packet is received.
//!
//! Two halves, as on a NIC:
//! - [`Classifier`]: the receive parser and hash unit. It turns a frame into
//!   a *steering key* — a RETA entry (`hash & (reta - 1)`) or, when a
//!   flow-director rule matches, `reta + rule` — and the flow hash handed to
//!   software. It is fixed for a run (like a programmed NIC), so the replay
//!   classifies once at load.
//! - [`Steering`]: the live indirection table shared by every queue: which
//!   queue owns each key, changeable while packets flow. A change of owner
//!   is a *move*: it takes effect at a stream position `at` past every
//!   queue's receive point, the old owner hands the key's flow state over
//!   once it has processed all the key's packets before `at`, and the new
//!   owner holds the key's packets from `at` until it has imported that state
//!   (no loss, no reordering of a flow). A real port backend (AF_XDP, DPDK)
//!   would program the same table into the NIC and quiesce the same way.
//!
//! Hot path: a queue reads [`Steering::generation`] once per burst and copies
//! the table only when it changed; the mutex guards control operations
//! (moves, hand-over mail), never a packet.
//!
//! Update latency ([`NicProfile`]): a real NIC takes time to apply a change
//! (the Dyssect paper measured 228 µs to 359 ms per RETA update). A change
//! requested at time `t` — a RETA move, a flow rule installed, a rule's slot
//! moved — lands no earlier than `t` + the profile's latency, and the NIC
//! applies updates one at a time: each waits in a serial queue behind the
//! ones before it. Until a change lands the table steers as before: the
//! move's switch point `at` is only chosen when it lands ([`Steering::pump`],
//! called by the control loop), so the old owner keeps the key until then and
//! the hand-over protocol above is unchanged. RETA moves requested between
//! two pumps (one control period's decisions) form one update, as one write
//! of the table does; each flow-rule operation is an update of its own.
//! Controllers see the table as requested ([`Steering::planned_owners`]);
//! queues see it as landed ([`Steering::owners`], the snapshots). With
//! the default `ideal` profile every change lands at once, inside the call.

use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use flowplane_wire::flow::{extract_five_tuple, FiveTuple, FiveTupleV4};
use flowplane_wire::rss::{Toeplitz, MICROSOFT_KEY, SYMMETRIC_KEY};

use crate::{NicProfile, ScaleError};

/// What the RSS hash covers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HashOn {
    /// The 5-tuple (addresses only for non-TCP/UDP), as NICs do.
    #[default]
    FiveTuple,
    /// The source address only: every packet of one source on one queue.
    SrcIp,
    /// The destination address only.
    DstIp,
}

/// A flow-director rule: packets matching it go to `queue`, whatever the RETA says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FdirRule {
    /// IP protocol to match (None: any).
    pub proto: Option<u8>,
    /// Destination IPv4 prefix (address, length) to match (None: any).
    pub dst: Option<(Ipv4Addr, u8)>,
    /// Inclusive destination port range.
    pub dst_ports: (u16, u16),
    /// Queue the matches go to.
    pub queue: u16,
}

impl FdirRule {
    fn matches(&self, t: &FiveTupleV4) -> bool {
        if self.proto.is_some_and(|p| p != t.proto()) {
            return false;
        }
        if let Some((net, len)) = self.dst {
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - u32::from(len.min(32))) };
            if u32::from(t.dst()) & mask != u32::from(net) & mask {
                return false;
            }
        }
        let p = t.dst_port();
        p >= self.dst_ports.0 && p <= self.dst_ports.1
    }
}

/// The NIC's receive classifier (fixed for a run).
#[derive(Clone, Debug)]
pub struct Classifier {
    toeplitz: Toeplitz,
    mask: u32,
    reta_size: usize,
    on: HashOn,
    icmp_inner: bool,
    rules: Vec<FdirRule>,
}

/// ICMPv4 error types that quote the offending packet.
fn is_icmp_error(t: u8) -> bool {
    matches!(t, 3 | 4 | 5 | 11 | 12)
}

/// The 5-tuple of the packet an ICMPv4 error quotes (plain or single-VLAN Ethernet).
fn icmp_quoted(frame: &[u8]) -> Option<FiveTupleV4> {
    let mut off = 12;
    let mut et = u16::from_be_bytes([*frame.get(off)?, *frame.get(off + 1)?]);
    if et == 0x8100 {
        off += 4;
        et = u16::from_be_bytes([*frame.get(off)?, *frame.get(off + 1)?]);
    }
    if et != 0x0800 {
        return None;
    }
    let ip = off + 2;
    let ihl = usize::from(frame.get(ip)? & 0x0f) * 4;
    if *frame.get(ip + 9)? != 1 || !is_icmp_error(*frame.get(ip + ihl)?) {
        return None;
    }
    let inner = ip + ihl + 8;
    let ihl2 = usize::from(frame.get(inner)? & 0x0f) * 4;
    // A quoted header shorter than 20 bytes quotes no flow (and its addresses would lie past `b`).
    if ihl2 < 20 {
        return None;
    }
    let b = frame.get(inner..inner + ihl2 + 4)?;
    let a4 = |o: usize| Ipv4Addr::new(b[o], b[o + 1], b[o + 2], b[o + 3]);
    let proto = b[9];
    let (sp, dp) = if matches!(proto, 6 | 17) {
        (u16::from_be_bytes([b[ihl2], b[ihl2 + 1]]), u16::from_be_bytes([b[ihl2 + 2], b[ihl2 + 3]]))
    } else {
        (0, 0)
    };
    Some(FiveTupleV4::new(a4(12), a4(16), sp, dp, proto))
}

impl Classifier {
    /// A classifier over a `reta_size`-entry RETA (a power of two);
    /// `symmetric` selects the symmetric Toeplitz key; `icmp_inner` hashes an
    /// ICMP error by the flow it quotes (so it meets that flow's state).
    pub fn new(
        reta_size: usize,
        symmetric: bool,
        on: HashOn,
        icmp_inner: bool,
        rules: Vec<FdirRule>,
    ) -> Result<Self, ScaleError> {
        if reta_size == 0 || !reta_size.is_power_of_two() || reta_size + rules.len() > u16::MAX as usize {
            return Err(ScaleError::Queues { got: reta_size, max: u16::MAX as usize });
        }
        let key = if symmetric { &SYMMETRIC_KEY } else { &MICROSOFT_KEY };
        Ok(Classifier { toeplitz: Toeplitz::new(key), mask: (reta_size - 1) as u32, reta_size, on, icmp_inner, rules })
    }

    /// The same classifier hashing with `key` (a run's secret key, [`flowplane_wire::rss::keyed_key`]):
    /// which flows share a RETA entry is then unknown to anyone without the run's secret.
    pub fn with_key(mut self, key: &[u8; 40]) -> Self {
        self.toeplitz = Toeplitz::new(key);
        self
    }

    /// What the hash covers.
    pub fn hash_on(&self) -> HashOn {
        self.on
    }

    /// Whether ICMPv4 errors are classified by the flow they quote.
    pub fn icmp_inner(&self) -> bool {
        self.icmp_inner
    }

    /// The Toeplitz key (symmetric or Microsoft's), for a kernel or NIC programmed to hash as this does.
    pub fn toeplitz_key(&self) -> &[u8; 40] {
        self.toeplitz.key()
    }

    /// RETA entries.
    pub fn reta_size(&self) -> usize {
        self.reta_size
    }

    /// Steering keys: RETA entries then one per rule.
    pub fn keys(&self) -> usize {
        self.reta_size + self.rules.len()
    }

    /// The flow-director rules.
    pub fn rules(&self) -> &[FdirRule] {
        &self.rules
    }

    /// The hash of a flow key as this classifier computes it for its packets.
    pub fn hash_tuple(&self, t: &FiveTuple) -> u32 {
        match (self.on, t) {
            (HashOn::FiveTuple, t) => self.toeplitz.hash_five_tuple(t),
            (HashOn::SrcIp, FiveTuple::V4(k)) => self.toeplitz.hash_v4_addrs(k.src(), Ipv4Addr::UNSPECIFIED),
            (HashOn::DstIp, FiveTuple::V4(k)) => self.toeplitz.hash_v4_addrs(Ipv4Addr::UNSPECIFIED, k.dst()),
            (HashOn::SrcIp, FiveTuple::V6(k)) => self.toeplitz.hash_v6_addrs(k.src(), std::net::Ipv6Addr::UNSPECIFIED),
            (HashOn::DstIp, FiveTuple::V6(k)) => self.toeplitz.hash_v6_addrs(std::net::Ipv6Addr::UNSPECIFIED, k.dst()),
        }
    }

    /// The RETA entry of a flow key (for state hand-over: which entries a key belongs to).
    pub fn entry_of(&self, t: &FiveTuple) -> u16 {
        (self.hash_tuple(t) & self.mask) as u16
    }

    /// Steering key and flow hash of `frame`; `None` when it cannot be
    /// classified (not IP, malformed): such frames take key 0, hash 0, as a
    /// NIC's default queue.
    pub fn classify(&self, frame: &[u8]) -> Option<(u16, u32)> {
        let mut t = extract_five_tuple(frame).ok()?;
        if self.icmp_inner && t.proto() == 1 {
            if let Some(q) = icmp_quoted(frame) {
                t = FiveTuple::V4(q);
            }
        }
        if let FiveTuple::V4(k) = &t {
            if let Some(r) = self.rules.iter().position(|r| r.matches(k)) {
                let h = self.toeplitz.hash_five_tuple(&t);
                return Some(((self.reta_size + r) as u16, h));
            }
        }
        let h = self.hash_tuple(&t);
        Some(((h & self.mask) as u16, h))
    }
}

/// Largest stream span a queue receives (scans) in one burst at full speed.
pub const MAX_SCAN: u64 = 8192;

/// How far (stream positions) a queue may walk ahead of the slowest queue
/// still receiving. At full speed queues would otherwise drift apart without
/// bound (a NIC's queues all see the same wire), and a move's old owner
/// could lag its switch point by millions of packets.
pub const MAX_DRIFT: u64 = 1 << 16;

/// A change of owner of one steering key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Move {
    /// Identifier (> 0).
    pub id: u64,
    /// Steering key (RETA entry).
    pub key: u16,
    /// Old owner.
    pub from: u16,
    /// New owner.
    pub to: u16,
    /// Stream position from which the new owner receives the key's packets
    /// ([`PENDING`] while the NIC has not applied the update yet).
    pub at: u64,
}

/// [`Move::at`] of a move whose update has not landed yet.
pub const PENDING: u64 = u64::MAX;

/// A key's flow state on its way from the old owner to the new.
#[derive(Debug)]
pub struct Handover {
    /// The move.
    pub mv: Move,
    /// The state, in the runtime's own encoding (opaque here).
    pub state: Vec<u8>,
}

/// Why a move was not started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoveError {
    /// The key is not a RETA entry (rules are fixed), or the queue is out of range.
    BadArgs,
    /// The key is already moving.
    Busy,
    /// The key is already owned by that queue.
    Same,
}

/// A queue's published progress, on its own cache lines.
#[repr(align(128))]
#[derive(Default)]
struct Padded {
    scan: AtomicU64,
    /// The last real position published (kept when `scan` says finished):
    /// a move's switch point must lie past a finished queue's end too.
    last: AtomicU64,
    rx: AtomicU64,
    busy: AtomicU64,
    /// Stream position at the last publication of the per-key counts.
    loads_pos: AtomicU64,
    /// End of the stream span the queue may be receiving with the table it
    /// holds (published before it receives there; see [`Steering::publish_claim`]).
    claim: AtomicU64,
}

#[derive(Default)]
struct Control {
    next_id: u64,
    /// Moves whose new owner has not yet walked past their switch point.
    active: Vec<Move>,
    inbox: Vec<Vec<Handover>>,
    /// Per flow slot: the exact-match rule bound to it (Dyssect's offloaded flows), as landed.
    flow_rules: Vec<Option<FlowRule>>,
    /// Per key: its owner after every requested change (landed or queued).
    planned: Vec<u16>,
    /// Per flow slot: its rule after every requested change (landed or queued).
    planned_rules: Vec<Option<FlowRule>>,
    /// Changes the NIC has not applied yet, oldest first (one at a time).
    queue: VecDeque<Update>,
    /// When the NIC finished its last update: the next starts no earlier.
    nic_free: Option<Instant>,
    stats: UpdateStats,
}

/// What one update changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum UpdateKind {
    /// A write of the RETA (any number of entries).
    Reta,
    /// One flow-rule operation (install a rule, or re-target a rule's queue).
    Rule,
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Move(Move),
    /// Flow slot index whose planned rule becomes the NIC's.
    Rule(usize),
}

/// A change waiting in the NIC's update queue.
#[derive(Debug)]
struct Update {
    kind: UpdateKind,
    ops: Vec<Op>,
    /// When its first change was requested.
    requested: Instant,
    /// When the control loop handed it to the NIC (a RETA update takes more moves until then).
    submitted: Option<Instant>,
    /// When the NIC started it (after the update before it).
    start: Option<Instant>,
}

/// The NIC's update figures so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UpdateStats {
    /// Updates applied (a RETA write, a flow-rule operation; each change at once under `ideal`).
    pub updates: u64,
    /// Changes they carried (RETA entries moved, rules installed, slots moved).
    pub changes: u64,
    /// Sum over the applied updates of the time from request to landing (as the control loop saw it land).
    pub waited_total: Duration,
    /// The longest of those.
    pub waited_max: Duration,
    /// Updates still queued.
    pub pending_updates: usize,
    /// Changes still queued (requested, never applied).
    pub pending_changes: usize,
}

/// The live steering table shared by all queues of a port.
pub struct Steering {
    queues: usize,
    reta_size: usize,
    owner: Box<[AtomicU16]>,
    /// Per key: the id of the last move whose state the new owner imported.
    ready: Box<[AtomicU64]>,
    gen: AtomicU64,
    scan: Box<[Padded]>,
    mail: Box<[AtomicBool]>,
    /// Per queue, per key: packets received (published by the queue now and then).
    loads: Box<[Box<[AtomicU64]>]>,
    ctl: Mutex<Control>,
    moves_done: AtomicU64,
    /// First flow-slot key (`keys() - first_slot` slots follow the RETA and the fixed rules).
    first_slot: usize,
    /// Per queue: the heaviest flows its worker sampled (published now and then, off the packet path).
    heavy: Box<[Mutex<Vec<HeavyFlow>>]>,
    /// Update latencies.
    profile: NicProfile,
}

impl Steering {
    /// A table over `queues` queues for `classifier`'s keys: RETA entry `i`
    /// to `reta[i]` (round robin when empty), rule `r` to its queue.
    pub fn new(queues: usize, classifier: &Classifier, reta: &[u16]) -> Result<Self, ScaleError> {
        Self::with_flow_slots(queues, classifier, reta, 0)
    }

    /// As [`Steering::new`], with `slots` more keys for run-time exact-match
    /// flow rules ([`Steering::install_flow_rule`]), flow-director style.
    pub fn with_flow_slots(
        queues: usize,
        classifier: &Classifier,
        reta: &[u16],
        slots: usize,
    ) -> Result<Self, ScaleError> {
        let max = u16::MAX as usize - 1;
        if queues == 0 || queues > max {
            return Err(ScaleError::Queues { got: queues, max });
        }
        let n = classifier.reta_size();
        let mut owner: Vec<u16> =
            if reta.is_empty() { (0..n).map(|i| (i % queues) as u16).collect() } else { reta.to_vec() };
        if owner.len() != n || owner.iter().any(|&q| q as usize >= queues) {
            return Err(ScaleError::Queues { got: queues, max });
        }
        for r in classifier.rules() {
            if r.queue as usize >= queues {
                return Err(ScaleError::Queues { got: r.queue as usize + 1, max: queues });
            }
            owner.push(r.queue);
        }
        let first_slot = owner.len();
        if first_slot + slots > u16::MAX as usize - 2 {
            return Err(ScaleError::Queues { got: first_slot + slots, max: u16::MAX as usize - 2 });
        }
        owner.extend(std::iter::repeat_n(0u16, slots));
        let keys = owner.len();
        let planned = owner.clone();
        Ok(Steering {
            queues,
            reta_size: n,
            owner: owner.into_iter().map(AtomicU16::new).collect(),
            ready: (0..keys).map(|_| AtomicU64::new(0)).collect(),
            gen: AtomicU64::new(1),
            scan: (0..queues).map(|_| Padded::default()).collect(),
            mail: (0..queues).map(|_| AtomicBool::new(false)).collect(),
            loads: (0..queues).map(|_| (0..keys).map(|_| AtomicU64::new(0)).collect()).collect(),
            ctl: Mutex::new(Control {
                next_id: 1,
                active: Vec::new(),
                inbox: (0..queues).map(|_| Vec::new()).collect(),
                flow_rules: vec![None; slots],
                planned,
                planned_rules: vec![None; slots],
                queue: VecDeque::new(),
                nic_free: None,
                stats: UpdateStats::default(),
            }),
            moves_done: AtomicU64::new(0),
            first_slot,
            heavy: (0..queues).map(|_| Mutex::new(Vec::new())).collect(),
            profile: NicProfile::ideal(),
        })
    }

    /// The same table on a NIC with `profile`'s update latencies (default `ideal`).
    pub fn with_nic_profile(mut self, profile: NicProfile) -> Self {
        self.profile = profile;
        self
    }

    /// The NIC's update latencies.
    pub fn nic_profile(&self) -> &NicProfile {
        &self.profile
    }

    fn latency(&self, kind: UpdateKind) -> Duration {
        match kind {
            UpdateKind::Reta => self.profile.reta_update,
            UpdateKind::Rule => self.profile.rule_insert,
        }
    }

    /// Queues change `op` (or applies it at once: no latency and nothing queued before it).
    fn request(&self, ctl: &mut Control, kind: UpdateKind, op: Op, now: Instant) {
        if ctl.queue.is_empty() && self.latency(kind).is_zero() {
            self.land(ctl, op);
            ctl.stats.updates += 1;
            ctl.stats.changes += 1;
            return;
        }
        // RETA moves not yet handed to the NIC ride in the same table write.
        if let Some(tail) = ctl.queue.back_mut() {
            if kind == UpdateKind::Reta && tail.kind == UpdateKind::Reta && tail.submitted.is_none() {
                tail.ops.push(op);
                return;
            }
        }
        ctl.queue.push_back(Update { kind, ops: vec![op], requested: now, submitted: None, start: None });
    }

    /// Applies one change to the table the queues steer by.
    fn land(&self, ctl: &mut Control, op: Op) {
        match op {
            Op::Move(mv) => {
                // Announce first, then read the positions: a queue receives only
                // within a span it claimed before re-reading the generation, so one
                // still on the old generation has its claim visible here.
                self.gen.fetch_add(1, Ordering::SeqCst);
                // A queue that has finished claimed up to the end of the stream: the
                // switch is then past every packet (a finished old owner never hands
                // over, and a finished new owner never receives again). Its last
                // real position counts too (a source that finished without a claim).
                let at = self
                    .scan
                    .iter()
                    .map(|s| {
                        let (c, p) = (s.claim.load(Ordering::SeqCst), s.scan.load(Ordering::SeqCst));
                        if p == u64::MAX {
                            c.max(s.last.load(Ordering::SeqCst))
                        } else {
                            c.max(p)
                        }
                    })
                    .max()
                    .unwrap_or(0);
                self.owner[mv.key as usize].store(mv.to, Ordering::SeqCst);
                ctl.active.push(Move { at, ..mv });
            }
            Op::Rule(i) => {
                let key = self.first_slot + i;
                if let Some(rule) = ctl.planned_rules[i] {
                    // The slot starts on the entry's owner: no packet changes queue until the slot moves.
                    self.owner[key].store(self.owner[rule.entry as usize].load(Ordering::SeqCst), Ordering::SeqCst);
                    ctl.flow_rules[i] = Some(rule);
                    self.gen.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
    }

    /// True if a queued change concerns `key` (a move of it, or its rule being installed).
    fn queued(&self, ctl: &Control, key: u16) -> bool {
        ctl.queue.iter().flat_map(|u| &u.ops).any(|op| match op {
            Op::Move(m) => m.key == key,
            Op::Rule(i) => self.first_slot + i == key as usize,
        })
    }

    /// True if a move of `key` is queued (a slot whose rule is still queued may be moved: it lands after).
    fn queued_move(ctl: &Control, key: u16) -> bool {
        ctl.queue.iter().flat_map(|u| &u.ops).any(|op| matches!(op, Op::Move(m) if m.key == key))
    }

    /// The NIC's side of the clock: hands the changes requested since the
    /// last call to the NIC (the RETA moves as one write) and applies every
    /// update whose time has come, one after the other (each starts when the
    /// one before it finished, or when it was handed over if later). The
    /// control loop calls it after each period's decisions and whenever
    /// [`Steering::next_landing`] is due.
    pub fn pump(&self, now: Instant) {
        let mut ctl = self.ctl();
        for u in ctl.queue.iter_mut() {
            u.submitted.get_or_insert(now);
        }
        loop {
            let free = ctl.nic_free;
            let Some(h) = ctl.queue.front_mut() else { break };
            let ready = h.submitted.unwrap_or(h.requested);
            let start = *h.start.get_or_insert(free.map_or(ready, |f| f.max(ready)));
            let done = start + self.latency(h.kind);
            if done > now {
                break;
            }
            let Some(u) = ctl.queue.pop_front() else { break };
            ctl.nic_free = Some(done);
            for &op in &u.ops {
                self.land(&mut ctl, op);
            }
            let waited = now.saturating_duration_since(u.requested);
            let st = &mut ctl.stats;
            st.updates += 1;
            st.changes += u.ops.len() as u64;
            st.waited_total += waited;
            st.waited_max = st.waited_max.max(waited);
        }
    }

    /// When the NIC finishes the update it is applying (None: nothing in flight).
    pub fn next_landing(&self) -> Option<Instant> {
        let ctl = self.ctl();
        let h = ctl.queue.front()?;
        Some(h.start? + self.latency(h.kind))
    }

    /// The NIC's update figures so far.
    pub fn update_stats(&self) -> UpdateStats {
        let ctl = self.ctl();
        UpdateStats {
            pending_updates: ctl.queue.len(),
            pending_changes: ctl.queue.iter().map(|u| u.ops.len()).sum(),
            ..ctl.stats
        }
    }

    /// Owner of every key once every requested change has landed (what a
    /// controller asked for; [`Steering::owners`] is what the NIC steers by).
    pub fn planned_owners(&self) -> Vec<u16> {
        self.ctl().planned.clone()
    }

    fn ctl(&self) -> std::sync::MutexGuard<'_, Control> {
        // A panicking holder cannot leave Control half-updated in a way that matters more than stopping.
        self.ctl.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues.
    pub fn queues(&self) -> usize {
        self.queues
    }

    /// RETA entries.
    pub fn reta_size(&self) -> usize {
        self.reta_size
    }

    /// Steering keys (RETA entries and rules).
    pub fn keys(&self) -> usize {
        self.owner.len()
    }

    /// Changes whenever the table does (read once per burst).
    #[inline]
    pub fn generation(&self) -> u64 {
        self.gen.load(Ordering::SeqCst)
    }

    /// Current owner of every key as the NIC steers now (after the moves
    /// whose update has landed; see [`Steering::planned_owners`]).
    pub fn owners(&self) -> Vec<u16> {
        self.owner.iter().map(|o| o.load(Ordering::SeqCst)).collect()
    }

    /// Copies the table into `owner` and the active moves involving queue
    /// `q` into `moves`; returns the generation copied.
    pub fn snapshot(&self, q: u16, owner: &mut [u16], moves: &mut Vec<Move>) -> u64 {
        let ctl = self.ctl();
        let g = self.gen.load(Ordering::SeqCst);
        for (o, a) in owner.iter_mut().zip(self.owner.iter()) {
            *o = a.load(Ordering::SeqCst);
        }
        moves.clear();
        moves.extend(ctl.active.iter().filter(|m| m.from == q || m.to == q).copied());
        g
    }

    /// Queue `q` has examined everything before stream position `pos` and
    /// delivered `rx` packets in all.
    #[inline]
    pub fn publish_progress(&self, q: usize, pos: u64, rx: u64) {
        if let Some(s) = self.scan.get(q) {
            s.rx.store(rx, Ordering::Relaxed);
            if pos != u64::MAX {
                s.last.store(pos, Ordering::SeqCst);
            }
            // Release, not a fence per burst: moves order against the claims (each at or past the scan).
            s.scan.store(pos, Ordering::Release);
        }
    }

    /// Queue `q` is about to receive stream positions before `end` with the
    /// table of the generation it holds. Publish, then re-read
    /// [`Steering::generation`]: a move started meanwhile is then either seen
    /// by the queue or switches at or past `end` (a change takes effect
    /// within the burst each queue is in).
    #[inline]
    pub fn publish_claim(&self, q: usize, end: u64) {
        if let Some(s) = self.scan.get(q) {
            s.claim.store(end, Ordering::SeqCst);
        }
    }

    /// Stream position each queue has walked to (as last published; `u64::MAX`: finished).
    pub fn queue_scan(&self) -> Vec<u64> {
        self.scan.iter().map(|s| s.scan.load(Ordering::SeqCst)).collect()
    }

    /// The least stream position of the queues still receiving, other than `q`
    /// (`u64::MAX` if none): how far ahead `q` may walk is bounded by it.
    pub fn slowest_other(&self, q: usize) -> u64 {
        self.scan
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != q)
            .map(|(_, s)| s.scan.load(Ordering::Acquire))
            .min()
            .unwrap_or(u64::MAX)
    }

    /// The worker of queue `q` has been busy `cycles` so far (its own work, for rebalancing by load).
    #[inline]
    pub fn publish_busy(&self, q: usize, cycles: u64) {
        if let Some(s) = self.scan.get(q) {
            s.busy.store(cycles, Ordering::Relaxed);
        }
    }

    /// Busy cycles each queue's worker has published.
    pub fn queue_busy(&self) -> Vec<u64> {
        self.scan.iter().map(|s| s.busy.load(Ordering::Relaxed)).collect()
    }

    /// Packets each queue has delivered so far (as last published).
    pub fn queue_rx(&self) -> Vec<u64> {
        self.scan.iter().map(|s| s.rx.load(Ordering::Relaxed)).collect()
    }

    /// Publishes queue `q`'s cumulative per-key packet counts, as of stream position `pos`.
    pub fn publish_loads(&self, q: usize, counts: &[u64], pos: u64) {
        if let Some(l) = self.loads.get(q) {
            for (a, &c) in l.iter().zip(counts) {
                a.store(c, Ordering::Relaxed);
            }
        }
        if let Some(s) = self.scan.get(q) {
            s.loads_pos.store(pos, Ordering::Release);
        }
    }

    /// Per queue: (stream position of its last count publication, its per-key counts).
    pub fn queue_key_loads(&self) -> Vec<(u64, Vec<u64>)> {
        self.scan
            .iter()
            .zip(self.loads.iter())
            .map(|(s, l)| (s.loads_pos.load(Ordering::Acquire), l.iter().map(|a| a.load(Ordering::Relaxed)).collect()))
            .collect()
    }

    /// Per-key packets received so far, summed over queues.
    pub fn key_loads(&self) -> Vec<u64> {
        let mut out = vec![0u64; self.keys()];
        for l in self.loads.iter() {
            for (o, a) in out.iter_mut().zip(l.iter()) {
                *o += a.load(Ordering::Relaxed);
            }
        }
        out
    }

    /// Starts moving RETA entry (or flow slot) `key` to queue `to`. The
    /// switch point is the furthest any queue has received or claimed when
    /// the change lands (the end of the burst it is in), so no queue has
    /// taken a packet of the key with the old view at or beyond it, and the
    /// change takes effect within that burst. Under a profile with latency
    /// the change is queued: the returned move's `at` is then [`PENDING`].
    pub fn start_move(&self, key: u16, to: u16) -> Result<Move, MoveError> {
        self.start_move_at(key, to, Instant::now())
    }

    /// [`Steering::start_move`] requested at `now` (the control loop's clock).
    pub fn start_move_at(&self, key: u16, to: u16, now: Instant) -> Result<Move, MoveError> {
        let k = key as usize;
        if (k >= self.reta_size && k < self.first_slot) || k >= self.owner.len() || to as usize >= self.queues {
            return Err(MoveError::BadArgs);
        }
        let mut ctl = self.ctl();
        if k >= self.first_slot && ctl.planned_rules.get(k - self.first_slot).is_none_or(|r| r.is_none()) {
            // A free flow slot steers nothing: nothing to move.
            return Err(MoveError::BadArgs);
        }
        if ctl.active.iter().any(|m| m.key == key) || Self::queued_move(&ctl, key) {
            return Err(MoveError::Busy);
        }
        let from = ctl.planned[k];
        if from == to {
            return Err(MoveError::Same);
        }
        let mv = Move { id: ctl.next_id, key, from, to, at: PENDING };
        ctl.next_id += 1;
        ctl.planned[k] = to;
        let kind = if k < self.reta_size { UpdateKind::Reta } else { UpdateKind::Rule };
        self.request(&mut ctl, kind, Op::Move(mv), now);
        // Landed at once: the switch point is chosen.
        Ok(ctl.active.iter().find(|m| m.id == mv.id).copied().unwrap_or(mv))
    }

    /// The old owner hands the key's state over (it has processed every packet of the key before `at`).
    pub fn hand_over(&self, mv: Move, state: Vec<u8>) {
        let mut ctl = self.ctl();
        if let Some(b) = ctl.inbox.get_mut(mv.to as usize) {
            b.push(Handover { mv, state });
        }
        if let Some(m) = self.mail.get(mv.to as usize) {
            m.store(true, Ordering::SeqCst);
        }
    }

    /// True if state is waiting for queue `q` (one atomic load: call per batch).
    #[inline]
    pub fn has_mail(&self, q: usize) -> bool {
        self.mail.get(q).is_some_and(|m| m.load(Ordering::Relaxed))
    }

    /// Takes the hand-overs waiting for queue `q`.
    pub fn take_mail(&self, q: usize, out: &mut Vec<Handover>) {
        let mut ctl = self.ctl();
        if let Some(m) = self.mail.get(q) {
            m.store(false, Ordering::SeqCst);
        }
        if let Some(b) = ctl.inbox.get_mut(q) {
            out.append(b);
        }
    }

    /// The new owner imported the state of `mv`: its packets from `at` may flow.
    ///
    /// The move stays active until the new owner has walked past its switch
    /// point ([`Steering::retired`]): a new owner that imports before it has
    /// re-read the table must still see the move, or it would take the key's
    /// packets before `at`, which the old owner already processed.
    pub fn imported(&self, mv: Move) {
        if let Some(r) = self.ready.get(mv.key as usize) {
            r.store(mv.id, Ordering::SeqCst);
        }
        self.moves_done.fetch_add(1, Ordering::Relaxed);
    }

    /// True once the state of move `id` of `key` was imported.
    #[inline]
    pub fn is_ready(&self, key: u16, id: u64) -> bool {
        self.ready.get(key as usize).is_some_and(|r| r.load(Ordering::SeqCst) >= id)
    }

    /// The new owner of move `id` has walked past its switch point: the move
    /// leaves the table's active list (the key can move again).
    pub fn retired(&self, id: u64) {
        self.ctl().active.retain(|m| m.id != id);
    }

    /// Moves not yet complete, and changes the NIC has not applied yet.
    pub fn active_moves(&self) -> usize {
        let ctl = self.ctl();
        ctl.active.len() + ctl.queue.iter().map(|u| u.ops.len()).sum::<usize>()
    }

    /// The moves not yet complete (a dispatcher that steers for every queue needs them all).
    pub fn moves(&self) -> Vec<Move> {
        self.ctl().active.clone()
    }

    /// Moves completed (state imported).
    pub fn moves_done(&self) -> u64 {
        self.moves_done.load(Ordering::Relaxed)
    }
}

/// A run-time exact-match rule (Dyssect's offloaded flow): packets of
/// `tuple` (either direction; flags ignored) in RETA entry `entry` take the
/// rule's slot key instead of the entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowRule {
    /// The RETA entry the flow hashes to.
    pub entry: u16,
    /// Its RSS hash (the NIC's cheap pre-filter before the exact compare).
    pub hash: u32,
    /// The flow (flags 0).
    pub tuple: FiveTupleV4,
}

impl FlowRule {
    /// True if `t` is this rule's flow, in either direction.
    #[inline]
    pub fn matches(&self, t: &FiveTupleV4) -> bool {
        let t = t.with_flags(0);
        t == self.tuple || t.reversed() == self.tuple
    }

    /// True if `frame` carries this rule's flow.
    pub fn matches_frame(&self, frame: &[u8]) -> bool {
        matches!(extract_five_tuple(frame), Ok(FiveTuple::V4(t)) if self.matches(&t))
    }
}

/// A heavy flow a worker sampled (Dyssect's per-flow load measurement).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HeavyFlow {
    /// The flow.
    pub tuple: FiveTupleV4,
    /// Its RSS hash.
    pub hash: u32,
    /// Estimated packets (sampled count times the sampling stride), cumulative.
    pub packets: u64,
    /// Belongs to the priority class (never offloaded).
    pub priority: bool,
}

/// Why a flow rule was not installed or removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuleError {
    /// No such slot, or the slot is (not) in use.
    BadSlot,
    /// The entry or the slot is moving, or (removal) the slot's owner differs from the entry's.
    Busy,
}

impl Steering {
    /// Flow slots (run-time rules).
    pub fn flow_slots(&self) -> usize {
        self.owner.len() - self.first_slot
    }

    /// The steering key of flow slot `i`.
    pub fn slot_key(&self, i: usize) -> u16 {
        (self.first_slot + i) as u16
    }

    /// Binds `rule` to a free slot, owned by the entry's current owner (so
    /// no packet changes queue until the slot itself is moved). Refused while
    /// the entry moves. Returns the slot's key (under a profile with latency
    /// the rule steers once its update lands; the slot may be moved meanwhile,
    /// that move queued behind it).
    pub fn install_flow_rule(&self, rule: FlowRule) -> Result<u16, RuleError> {
        self.install_flow_rule_at(rule, Instant::now())
    }

    /// [`Steering::install_flow_rule`] requested at `now` (the control loop's clock).
    pub fn install_flow_rule_at(&self, rule: FlowRule, now: Instant) -> Result<u16, RuleError> {
        if rule.entry as usize >= self.reta_size {
            return Err(RuleError::BadSlot);
        }
        let mut ctl = self.ctl();
        if ctl.active.iter().any(|m| m.key == rule.entry) || Self::queued_move(&ctl, rule.entry) {
            return Err(RuleError::Busy);
        }
        if ctl.planned_rules.iter().flatten().any(|r| r.tuple == rule.tuple || r.tuple.reversed() == rule.tuple) {
            return Err(RuleError::BadSlot);
        }
        let Some(i) = ctl.planned_rules.iter().position(|r| r.is_none()) else { return Err(RuleError::BadSlot) };
        let key = self.first_slot + i;
        ctl.planned[key] = ctl.planned[rule.entry as usize];
        ctl.planned_rules[i] = Some(FlowRule { tuple: rule.tuple.with_flags(0), ..rule });
        self.request(&mut ctl, UpdateKind::Rule, Op::Rule(i), now);
        Ok(key as u16)
    }

    /// Unbinds the rule of slot key `key`: only when neither it nor its
    /// entry is moving and both have the same owner (no packet changes queue).
    pub fn remove_flow_rule(&self, key: u16) -> Result<(), RuleError> {
        let k = key as usize;
        if k < self.first_slot || k >= self.owner.len() {
            return Err(RuleError::BadSlot);
        }
        let mut ctl = self.ctl();
        let Some(rule) = ctl.planned_rules[k - self.first_slot] else { return Err(RuleError::BadSlot) };
        // Nothing queued for the slot or its entry: the landed table is the planned one there.
        if ctl.active.iter().any(|m| m.key == key || m.key == rule.entry)
            || self.queued(&ctl, key)
            || self.queued(&ctl, rule.entry)
            || self.owner[k].load(Ordering::SeqCst) != self.owner[rule.entry as usize].load(Ordering::SeqCst)
        {
            return Err(RuleError::Busy);
        }
        // Removal is not modelled as an update: no packet changes queue (same owner), so it costs nothing here.
        ctl.flow_rules[k - self.first_slot] = None;
        ctl.planned_rules[k - self.first_slot] = None;
        self.gen.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    /// The rules in use (landed: steering packets now), as (slot key, rule).
    pub fn flow_rules(&self) -> Vec<(u16, FlowRule)> {
        let ctl = self.ctl();
        ctl.flow_rules.iter().enumerate().filter_map(|(i, r)| r.map(|r| ((self.first_slot + i) as u16, r))).collect()
    }

    /// As [`Steering::snapshot`], and the flow rules of the same generation.
    pub fn snapshot_rules(
        &self,
        q: u16,
        owner: &mut [u16],
        moves: &mut Vec<Move>,
        rules: &mut Vec<(u16, FlowRule)>,
    ) -> u64 {
        let ctl = self.ctl();
        let g = self.gen.load(Ordering::SeqCst);
        for (o, a) in owner.iter_mut().zip(self.owner.iter()) {
            *o = a.load(Ordering::SeqCst);
        }
        moves.clear();
        moves.extend(ctl.active.iter().filter(|m| m.from == q || m.to == q).copied());
        rules.clear();
        rules.extend(
            ctl.flow_rules.iter().enumerate().filter_map(|(i, r)| r.map(|r| ((self.first_slot + i) as u16, r))),
        );
        g
    }

    /// Whether any move is in progress (or queued in the NIC) for `key`.
    pub fn is_moving(&self, key: u16) -> bool {
        let ctl = self.ctl();
        ctl.active.iter().any(|m| m.key == key) || self.queued(&ctl, key)
    }

    /// The steering key a flow's packets take: its rule's slot, or its RETA entry.
    pub fn key_of(&self, classifier: &Classifier, rules: &[(u16, FlowRule)], t: &FiveTuple) -> u16 {
        if let FiveTuple::V4(k) = t {
            if let Some((key, _)) = rules.iter().find(|(_, r)| r.matches(k)) {
                return *key;
            }
        }
        classifier.entry_of(t)
    }

    /// Worker of queue `q` publishes its heaviest sampled flows (never blocks: skipped when busy).
    pub fn publish_heavy(&self, q: usize, flows: &[HeavyFlow]) {
        if let Some(Ok(mut h)) = self.heavy.get(q).map(|m| m.try_lock()) {
            h.clear();
            h.extend_from_slice(flows);
        }
    }

    /// The heavy flows every queue last published.
    pub fn heavy_flows(&self) -> Vec<Vec<HeavyFlow>> {
        self.heavy.iter().map(|m| m.lock().map(|h| h.clone()).unwrap_or_default()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn udp(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
        let mut f = vec![0u8; 42];
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        f[14] = 0x45;
        f[16..18].copy_from_slice(&28u16.to_be_bytes());
        f[22] = 64;
        f[23] = 17;
        f[26..30].copy_from_slice(&src);
        f[30..34].copy_from_slice(&dst);
        f[34..36].copy_from_slice(&sport.to_be_bytes());
        f[36..38].copy_from_slice(&dport.to_be_bytes());
        f
    }

    /// Issue 33: with the constant Microsoft key anyone can compute flows that share one RETA entry (so one
    /// core); under a run's keyed key (two secrets) the same flows spread. (A symmetric key has period 16
    /// bits, so its hash is a function of the XOR of the tuple's 16-bit words whatever the key: flows built
    /// with one XOR share an entry under every symmetric key. Only the plain key is protected.)
    #[test]
    fn flows_aimed_at_one_entry_spread_under_a_keyed_key() {
        let plain = Classifier::new(512, false, HashOn::FiveTuple, false, Vec::new()).unwrap();
        for (c, symmetric) in [(plain, false)] {
            let aimed: Vec<Vec<u8>> = (0..1u32 << 20)
                .map(|p| {
                    let sport = (p as u16).wrapping_mul(7).wrapping_add(1024);
                    udp([10, (p >> 16) as u8, (p >> 8) as u8, p as u8], [198, 51, 100, 7], sport, 53)
                })
                .filter(|f| c.classify(f).unwrap().0 == 0)
                .take(64)
                .collect();
            assert_eq!(aimed.len(), 64);
            for secret in [1u64, 0xdead_beef] {
                let keyed = c.clone().with_key(&flowplane_wire::rss::keyed_key(secret, symmetric, 9));
                let entries: std::collections::BTreeSet<u16> =
                    aimed.iter().map(|f| keyed.classify(f).unwrap().0).collect();
                assert!(entries.len() >= 32, "secret {secret}: {} entries", entries.len());
            }
        }
    }

    #[test]
    fn rules_win_over_the_reta_and_icmp_errors_follow_their_flow() {
        let rule = FdirRule {
            proto: Some(17),
            dst: Some((Ipv4Addr::new(203, 0, 113, 1), 32)),
            dst_ports: (2000, 2999),
            queue: 1,
        };
        let c = Classifier::new(512, true, HashOn::FiveTuple, true, vec![rule]).unwrap();
        assert_eq!(c.classify(&udp([1, 1, 1, 1], [203, 0, 113, 1], 80, 2500)).unwrap().0, 512);
        assert!(c.classify(&udp([1, 1, 1, 1], [203, 0, 113, 1], 80, 3500)).unwrap().0 < 512);
        assert!(c.classify(&udp([1, 1, 1, 1], [203, 0, 113, 2], 80, 2500)).unwrap().0 < 512);
        // An ICMP port unreachable quoting 10.0.0.1:5000 -> 10.0.0.2:53 lands with that flow's replies.
        let flow = udp([10, 0, 0, 2], [10, 0, 0, 1], 53, 5000);
        let mut icmp = vec![0u8; 14 + 20 + 8 + 28];
        icmp[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        icmp[14] = 0x45;
        icmp[16..18].copy_from_slice(&56u16.to_be_bytes());
        icmp[22] = 64;
        icmp[23] = 1;
        icmp[26..30].copy_from_slice(&[10, 0, 0, 9]);
        icmp[30..34].copy_from_slice(&[10, 0, 0, 1]);
        icmp[34] = 3;
        icmp[42..70].copy_from_slice(&udp([10, 0, 0, 1], [10, 0, 0, 2], 5000, 53)[14..42]);
        assert_eq!(c.classify(&icmp).unwrap().0, c.classify(&flow).unwrap().0);
        assert_eq!(c.classify(&[0u8; 10]), None);
    }

    #[test]
    fn an_icmp_error_quoting_a_header_shorter_than_20_bytes_is_classified_by_its_own_addresses() {
        // Regression: a quoted IHL below 5 made `icmp_quoted` index past its slice (a dispatcher panic).
        let c = Classifier::new(512, true, HashOn::FiveTuple, true, Vec::new()).unwrap();
        for ihl in 0u8..5 {
            let mut icmp = vec![0u8; 14 + 20 + 8 + 28];
            icmp[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
            icmp[14] = 0x45;
            icmp[16..18].copy_from_slice(&56u16.to_be_bytes());
            icmp[23] = 1;
            icmp[26..30].copy_from_slice(&[10, 0, 0, 9]);
            icmp[30..34].copy_from_slice(&[10, 0, 0, 1]);
            icmp[34] = 3;
            icmp[42] = 0x40 | ihl;
            let own = FiveTuple::V4(FiveTupleV4::new(Ipv4Addr::new(10, 0, 0, 9), Ipv4Addr::new(10, 0, 0, 1), 0, 0, 1));
            assert_eq!(c.classify(&icmp).unwrap().0, c.entry_of(&own), "quoted IHL {ihl}");
        }
    }

    #[test]
    fn a_move_switches_at_the_end_of_the_bursts_in_progress() {
        let c = Classifier::new(8, false, HashOn::FiveTuple, false, Vec::new()).unwrap();
        let s = Steering::new(2, &c, &[]).unwrap();
        s.publish_progress(0, 4900, 10);
        s.publish_progress(1, 5000, 10);
        // Queue 0 is receiving up to 5064 (a burst), queue 1 claimed nothing past its position.
        s.publish_claim(0, 5064);
        assert_eq!(s.start_move(2, 1).unwrap().at, 5064);
        s.publish_claim(1, 5100);
        assert_eq!(s.start_move(1, 0).unwrap().at, 5100);
    }

    #[test]
    fn moves_switch_past_every_receive_point() {
        let c = Classifier::new(8, false, HashOn::FiveTuple, false, Vec::new()).unwrap();
        let s = Steering::new(2, &c, &[]).unwrap();
        s.publish_progress(0, 100, 50);
        s.publish_progress(1, 5000, 2500);
        assert_eq!(s.queue_rx(), vec![50, 2500]);
        let g = s.generation();
        let mv = s.start_move(0, 1).unwrap();
        assert!(s.generation() > g);
        assert_eq!((mv.from, mv.to, mv.at), (0, 1, 5000));
        assert_eq!(s.start_move(0, 0), Err(MoveError::Busy));
        assert_eq!(s.start_move(1, 1), Err(MoveError::Same));
        assert_eq!(s.start_move(9, 0), Err(MoveError::BadArgs));
        let (mut own, mut mv0) = (vec![0u16; 8], Vec::new());
        s.snapshot(0, &mut own, &mut mv0);
        assert_eq!((own[0], mv0.len()), (1, 1));
        assert!(!s.is_ready(0, mv.id) && !s.has_mail(1));
        s.hand_over(mv, vec![1, 2, 3]);
        assert!(s.has_mail(1));
        let mut mail = Vec::new();
        s.take_mail(1, &mut mail);
        assert_eq!(mail[0].state, vec![1, 2, 3]);
        s.imported(mv);
        assert!(s.is_ready(0, mv.id));
        // Active until the new owner walked past `at`: a late re-read still sees the move.
        assert_eq!((s.active_moves(), s.moves_done()), (1, 1));
        assert_eq!(s.start_move(0, 0), Err(MoveError::Busy));
        s.snapshot(1, &mut own, &mut mv0);
        assert_eq!(mv0.len(), 1);
        s.retired(mv.id);
        assert_eq!(s.active_moves(), 0);
    }

    #[test]
    fn a_move_never_switches_before_a_finished_queues_end() {
        // Queue 1 finished at 40,000 (its old owner could never hand over, or
        // as new owner it would never take the key's packets); queue 0 is at 100.
        let c = Classifier::new(8, false, HashOn::FiveTuple, false, Vec::new()).unwrap();
        let s = Steering::new(2, &c, &[]).unwrap();
        s.publish_progress(0, 100, 50);
        s.publish_progress(1, 40_000, 20_000);
        s.publish_progress(1, u64::MAX, 20_000);
        assert_eq!(s.slowest_other(0), u64::MAX, "a finished queue holds nobody back");
        for (key, to) in [(1, 0), (2, 1)] {
            // At the finished queue's end: it examined everything before 40,000 and takes nothing after.
            let mv = s.start_move(key, to).unwrap();
            assert_eq!(mv.at, 40_000);
        }
    }

    fn profiled(reta: Duration, rule: Duration) -> Steering {
        let c = Classifier::new(8, false, HashOn::FiveTuple, false, Vec::new()).unwrap();
        let p = NicProfile { name: "test".into(), reta_update: reta, rule_insert: rule };
        Steering::with_flow_slots(2, &c, &[], 4).unwrap().with_nic_profile(p)
    }

    #[test]
    fn a_move_lands_after_its_latency_and_the_old_owner_steers_until_then() {
        let ms = Duration::from_millis(1);
        let s = profiled(ms, Duration::ZERO);
        let t0 = Instant::now();
        s.publish_progress(0, 100, 50);
        s.publish_progress(1, 200, 50);
        let g = s.generation();
        let mv = s.start_move_at(0, 1, t0).unwrap();
        assert_eq!((mv.from, mv.to, mv.at), (0, 1, PENDING));
        // Requested, not applied: the queues' table and generation are as before.
        assert_eq!((s.owners()[0], s.planned_owners()[0], s.generation()), (0, 1, g));
        assert!(s.is_moving(0) && s.active_moves() == 1);
        assert_eq!(s.start_move_at(0, 0, t0), Err(MoveError::Busy));
        let (mut own, mut mv0) = (vec![0u16; s.keys()], Vec::new());
        s.snapshot(1, &mut own, &mut mv0);
        assert!(own[0] == 0 && mv0.is_empty(), "the new owner sees no move before it lands");
        s.pump(t0);
        assert_eq!(s.next_landing(), Some(t0 + ms));
        // The queues walk on meanwhile: the switch point is chosen when the update lands.
        s.publish_progress(0, 5000, 2500);
        s.pump(t0 + ms - Duration::from_micros(1));
        assert_eq!((s.owners()[0], s.generation()), (0, g));
        s.pump(t0 + ms);
        assert_eq!(s.owners()[0], 1);
        assert!(s.generation() > g);
        s.snapshot(1, &mut own, &mut mv0);
        assert_eq!((mv0.len(), mv0[0].id, mv0[0].at), (1, mv.id, 5000));
        let st = s.update_stats();
        assert_eq!((st.updates, st.changes, st.waited_max, st.pending_changes), (1, 1, ms, 0));
        assert_eq!(s.next_landing(), None);
    }

    #[test]
    fn updates_apply_one_at_a_time_and_a_periods_reta_moves_ride_together() {
        let (ms, us) = (Duration::from_millis(1), Duration::from_micros(1));
        let s = profiled(ms, Duration::from_micros(300));
        let t0 = Instant::now();
        // Period 1: two RETA moves, one table write.
        s.start_move_at(0, 1, t0).unwrap();
        s.start_move_at(2, 1, t0).unwrap();
        s.pump(t0);
        // Period 2, 100 us later: another write, queued behind the first.
        let t1 = t0 + 100 * us;
        s.start_move_at(1, 0, t1).unwrap();
        // And a flow rule on entry 3, then its slot moved: each its own update, behind.
        let rule = FlowRule {
            entry: 3,
            hash: 3,
            tuple: FiveTupleV4::new(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2), 1, 2, 17),
        };
        let slot = s.install_flow_rule_at(rule, t1).unwrap();
        assert_eq!(s.install_flow_rule_at(rule, t1), Err(RuleError::BadSlot), "one rule per flow, queued or not");
        assert_eq!(s.start_move_at(slot, 0, t1).unwrap().at, PENDING);
        assert_eq!(s.remove_flow_rule(slot), Err(RuleError::Busy));
        s.pump(t1);
        assert_eq!(s.update_stats().pending_updates, 4);
        assert_eq!(s.active_moves(), 5);
        s.pump(t0 + ms);
        assert_eq!((s.owners()[0], s.owners()[2], s.owners()[1]), (1, 1, 1), "the first write only");
        assert_eq!(s.next_landing(), Some(t0 + 2 * ms), "the second starts when the first ends");
        s.pump(t0 + 2 * ms - us);
        assert_eq!(s.owners()[1], 1);
        s.pump(t0 + 2 * ms);
        assert_eq!(s.owners()[1], 0);
        assert!(s.flow_rules().is_empty(), "the rule waits behind the RETA writes");
        s.pump(t0 + 2 * ms + 300 * us);
        assert_eq!(s.flow_rules().len(), 1);
        assert_eq!(s.owners()[slot as usize], s.owners()[3], "a new rule starts on its entry's owner");
        s.pump(t0 + 2 * ms + 600 * us);
        assert_eq!(s.owners()[slot as usize], 0);
        let st = s.update_stats();
        assert_eq!((st.updates, st.changes, st.pending_updates), (4, 5, 0));
        assert_eq!(st.waited_max, 2 * ms + 500 * us, "the slot move waited behind three updates");
    }

    #[test]
    fn the_ideal_nic_applies_every_change_at_once() {
        let s = profiled(Duration::ZERO, Duration::ZERO);
        s.publish_progress(0, 70, 10);
        let mv = s.start_move(5, 0).unwrap();
        assert_eq!((mv.at, s.owners()[5]), (70, 0));
        let rule = FlowRule {
            entry: 5,
            hash: 5,
            tuple: FiveTupleV4::new(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2), 1, 2, 17),
        };
        assert_eq!(s.install_flow_rule(rule), Err(RuleError::Busy), "the entry is still moving");
        s.imported(mv);
        s.retired(mv.id);
        let slot = s.install_flow_rule(rule).unwrap();
        assert_eq!(s.flow_rules().len(), 1);
        assert_eq!(s.start_move(slot, 1).unwrap().at, 70);
        assert_eq!(s.next_landing(), None);
        let st = s.update_stats();
        assert_eq!((st.updates, st.changes, st.waited_total, st.pending_updates), (3, 3, Duration::ZERO, 0));
    }
}
