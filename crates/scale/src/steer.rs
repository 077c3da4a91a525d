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

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::Mutex;

use flowplane_wire::flow::{extract_five_tuple, FiveTuple, FiveTupleV4};
use flowplane_wire::rss::{Toeplitz, MICROSOFT_KEY, SYMMETRIC_KEY};

use crate::ScaleError;

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
    /// Stream position from which the new owner receives the key's packets.
    pub at: u64,
}

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
    /// Per flow slot: the exact-match rule bound to it (Dyssect's offloaded flows).
    flow_rules: Vec<Option<FlowRule>>,
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
            }),
            moves_done: AtomicU64::new(0),
            first_slot,
            heavy: (0..queues).map(|_| Mutex::new(Vec::new())).collect(),
        })
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

    /// Current owner of every key (after the moves started so far).
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

    /// Starts moving RETA entry `key` to queue `to`. The switch point is the
    /// furthest any queue has received or claimed (the end of the burst it
    /// is in), so no queue has taken a packet of the key with the old view
    /// at or beyond it, and the change takes effect within that burst.
    pub fn start_move(&self, key: u16, to: u16) -> Result<Move, MoveError> {
        let k = key as usize;
        if (k >= self.reta_size && k < self.first_slot) || k >= self.owner.len() || to as usize >= self.queues {
            return Err(MoveError::BadArgs);
        }
        let mut ctl = self.ctl();
        if k >= self.first_slot && ctl.flow_rules.get(k - self.first_slot).is_none_or(|r| r.is_none()) {
            // A free flow slot steers nothing: nothing to move.
            return Err(MoveError::BadArgs);
        }
        if ctl.active.iter().any(|m| m.key == key) {
            return Err(MoveError::Busy);
        }
        let from = self.owner[key as usize].load(Ordering::SeqCst);
        if from == to {
            return Err(MoveError::Same);
        }
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
        self.owner[key as usize].store(to, Ordering::SeqCst);
        let mv = Move { id: ctl.next_id, key, from, to, at };
        ctl.next_id += 1;
        ctl.active.push(mv);
        Ok(mv)
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

    /// Moves not yet complete.
    pub fn active_moves(&self) -> usize {
        self.ctl().active.len()
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
    /// the entry moves. Returns the slot's key.
    pub fn install_flow_rule(&self, rule: FlowRule) -> Result<u16, RuleError> {
        if rule.entry as usize >= self.reta_size {
            return Err(RuleError::BadSlot);
        }
        let mut ctl = self.ctl();
        if ctl.active.iter().any(|m| m.key == rule.entry) {
            return Err(RuleError::Busy);
        }
        if ctl.flow_rules.iter().flatten().any(|r| r.tuple == rule.tuple || r.tuple.reversed() == rule.tuple) {
            return Err(RuleError::BadSlot);
        }
        let Some(i) = ctl.flow_rules.iter().position(|r| r.is_none()) else { return Err(RuleError::BadSlot) };
        let key = self.first_slot + i;
        self.owner[key].store(self.owner[rule.entry as usize].load(Ordering::SeqCst), Ordering::SeqCst);
        ctl.flow_rules[i] = Some(FlowRule { tuple: rule.tuple.with_flags(0), ..rule });
        self.gen.fetch_add(1, Ordering::SeqCst);
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
        let Some(rule) = ctl.flow_rules[k - self.first_slot] else { return Err(RuleError::BadSlot) };
        if ctl.active.iter().any(|m| m.key == key || m.key == rule.entry)
            || self.owner[k].load(Ordering::SeqCst) != self.owner[rule.entry as usize].load(Ordering::SeqCst)
        {
            return Err(RuleError::Busy);
        }
        ctl.flow_rules[k - self.first_slot] = None;
        self.gen.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    /// The rules in use, as (slot key, rule).
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

    /// Whether any move is in progress for `key`.
    pub fn is_moving(&self, key: u16) -> bool {
        self.ctl().active.iter().any(|m| m.key == key)
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
}
